//! `cycle` (publish → lease → ack) and `retry-cycle` (publish → lease → nack →
//! lease the retry → ack).
//!
//! Publishers batch-publish `--messages` while consumers lease batches and settle
//! them with one batch request. The run is over when every message of this run
//! has been acked (for retry-cycle: acked on its retry); its end-to-end rate is
//! acked messages per second from the first publish to that last ack, and the
//! latency is from a message's publish (the `t` of its payload) to its ack.
//!
//! Messages of other runs found in the queue (retry-cycle shares `bench-retry`)
//! are acked and counted as stale, never as this run's.

use super::consumer::{self, Item, Urls, TRANSIENT};
use super::publish::{plain_item, publish_all, PublishPlan, PublisherOutcome};
use super::report::Report;
use super::stats::Samples;
use super::{now_us, BenchArgs, Ctx, Workload};
use redrive_core::{format_duration_ms, RetryPolicy};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// What one consumer task did.
#[derive(Debug, Default)]
pub(super) struct ConsumerOutcome {
    /// Publish → final ack, µs.
    pub latency: Samples,
    /// This run's messages acked (retry-cycle: on a retry).
    pub acked: u64,
    /// First deliveries nacked (retry-cycle).
    pub nacked: u64,
    /// Nacks that made the message dead instead of retrying it.
    pub dead_on_nack: u64,
    /// Deliveries beyond the expected one (cycle: attempt > 1; retry-cycle: > 2).
    pub redelivered: u64,
    /// Other runs' messages acked away.
    pub stale: u64,
    /// Lease requests answered.
    pub leases: u64,
    /// Of which empty.
    pub empty_leases: u64,
    /// Messages leased.
    pub leased: u64,
}

impl ConsumerOutcome {
    /// Whether to fail (nack) one delivery rather than complete it, counting what it says:
    /// on retry-cycle this run's first deliveries fail; a message of another run is stale;
    /// a delivery past the expected attempt (1, or 2 on retry-cycle) is a redelivery.
    pub(super) fn fails(&mut self, own: bool, attempt: i64, retry: bool) -> bool {
        if own && retry && attempt <= 1 {
            return true;
        }
        let expected_attempt = if retry { 2 } else { 1 };
        if !own {
            self.stale += 1;
        } else if attempt > expected_attempt {
            self.redelivered += 1;
        }
        false
    }

    /// Count this run's messages completed now (`sent`: their publish times, µs) and tell
    /// the run's progress.
    pub(super) fn completed<'a>(
        &mut self,
        ctx: &Ctx,
        sent: impl Iterator<Item = &'a i64>,
        target: u64,
    ) {
        let now = now_us();
        let mut own_acked = 0;
        for t in sent {
            own_acked += 1;
            self.latency.push_us(now - t);
        }
        self.acked += own_acked;
        ctx.progress.finish(own_acked, target);
    }

    pub(super) fn merge(&mut self, o: ConsumerOutcome) {
        self.latency.merge(o.latency);
        self.acked += o.acked;
        self.nacked += o.nacked;
        self.dead_on_nack += o.dead_on_nack;
        self.redelivered += o.redelivered;
        self.stale += o.stale;
        self.leases += o.leases;
        self.empty_leases += o.empty_leases;
        self.leased += o.leased;
    }
}

/// Run `cycle` or `retry-cycle` for `target` messages.
pub async fn run(
    ctx: Arc<Ctx>,
    args: &BenchArgs,
    target: u64,
    report: &mut Report,
) -> anyhow::Result<()> {
    let retry = args.workload == Workload::RetryCycle;
    if retry {
        check_zero_delay_policy(&ctx).await?;
    }
    let connections = args.connections as usize;
    let (publishers, consumers) = split(connections, args.publishers.map(|p| p as usize));
    let start = Instant::now();
    let deadline = start + Duration::from_millis(args.timeout.ms());
    let plan = PublishPlan {
        url: ctx.url(&["v1", "queues", &ctx.queue, "messages"]),
        nodes: args.also_server.clone(),
        batch: args.publish_batch.unwrap_or(args.batch) as u64,
        limit: Some(target),
        claimed: Arc::new(AtomicU64::new(0)),
        deadline,
        item: plain_item(),
        finishes: false,
    };
    let urls = Urls::new(&ctx, args.batch, "1s");
    let mut set = JoinSet::new();
    for i in 0..consumers {
        let urls = urls.on_node(&args.also_server, i);
        set.spawn(consume(ctx.clone(), urls, retry, target, deadline));
    }
    let publishing = async {
        let out = publish_all(&ctx, publishers, &plan).await;
        (out, start.elapsed())
    };
    let consuming = async {
        let mut total = ConsumerOutcome::default();
        while let Some(r) = set.join_next().await {
            total.merge(r.map_err(|e| anyhow::anyhow!("a consumer task failed: {e}"))?);
        }
        anyhow::Ok(total)
    };
    let ((published, publish_time), consumed) = tokio::join!(publishing, consuming);
    let mut published = published?;
    let mut consumed = consumed?;
    let end = ctx.progress.end();
    let elapsed = end.duration_since(start).as_secs_f64();

    report_cycle(
        report,
        &CycleFigures {
            retry,
            target,
            publishers,
            consumers,
            publish_time,
            elapsed,
            timeout_ms: args.timeout.ms(),
        },
        &mut published,
        &mut consumed,
    );
    report.text(
        "settle",
        "acks and nacks",
        if urls.single() {
            "one per request (POST /v1/messages/{id}/ack, /nack)"
        } else {
            "one batch request each (POST /v1/messages/ack, /nack)"
        },
    );
    Ok(())
}

/// The shape and timing of a finished cycle run, for [`report_cycle`].
#[derive(Debug)]
pub(super) struct CycleFigures {
    /// retry-cycle (else cycle).
    pub retry: bool,
    /// Messages to move.
    pub target: u64,
    /// Publishing tasks.
    pub publishers: usize,
    /// Consuming tasks.
    pub consumers: usize,
    /// Start → last publish.
    pub publish_time: Duration,
    /// Start → last ack, seconds.
    pub elapsed: f64,
    /// `--timeout`, for the incomplete message.
    pub timeout_ms: u64,
}

/// The figures of a cycle run (redrive's or the PostgreSQL peer's, with the same keys).
pub(super) fn report_cycle(
    report: &mut Report,
    f: &CycleFigures,
    published: &mut PublisherOutcome,
    consumed: &mut ConsumerOutcome,
) {
    report.count("publishers", "publishing connections", f.publishers as u64);
    report.count("consumers", "consuming connections", f.consumers as u64);
    report.publishing(f.target, published.messages, f.publish_time);
    report.summary(
        "publish_request_latency",
        "publish request latency",
        published.latency.summary(),
    );
    if f.retry {
        report.count("nacked", "first deliveries nacked", consumed.nacked);
        report.count(
            "retries_acked",
            "retries came back and acked",
            consumed.acked,
        );
        report.count(
            "dead_on_nack",
            "dead on nack (policy!)",
            consumed.dead_on_nack,
        );
    } else {
        report.count("acked", "acked", consumed.acked);
    }
    report.count("redelivered", "extra redeliveries", consumed.redelivered);
    report.count(
        "stale",
        "stale messages of other runs acked",
        consumed.stale,
    );
    report.secs("elapsed_s", "elapsed (first publish → last ack)", f.elapsed);
    let label = if f.retry {
        "full retry cycles per second"
    } else {
        "end-to-end (acked) rate"
    };
    report.rate("messages_per_s", label, consumed.acked as f64 / f.elapsed);
    let latency_label = if f.retry {
        "publish → ack after retry"
    } else {
        "publish → ack latency"
    };
    report.summary(
        "end_to_end_latency",
        latency_label,
        consumed.latency.summary(),
    );
    report.count("lease_requests", "lease requests", consumed.leases);
    report.count("empty_leases", "empty lease answers", consumed.empty_leases);
    let per_lease =
        consumed.leased as f64 / (consumed.leases - consumed.empty_leases).max(1) as f64;
    report.text(
        "messages_per_lease",
        "messages per non-empty lease",
        format!("{per_lease:.1}"),
    );
    if consumed.acked < f.target {
        let what = if f.retry {
            "retried and acked"
        } else {
            "acked"
        };
        report.incomplete = Some(format!(
            "stopped after --timeout {}: {} of {} messages {what} ({} published, {} nacked)",
            format_duration_ms(f.timeout_ms),
            consumed.acked,
            f.target,
            published.messages,
            consumed.nacked
        ));
    }
}

/// Publishing and consuming tasks out of `connections`: a quarter publish unless
/// told otherwise, and both sides get at least one.
pub(super) fn split(connections: usize, publishers: Option<usize>) -> (usize, usize) {
    let p = publishers
        .unwrap_or(connections / 4)
        .clamp(1, connections.saturating_sub(1).max(1));
    (p, connections.saturating_sub(p).max(1))
}

/// One consumer: lease, settle, until this run's `target` is reached or `deadline`.
async fn consume(
    ctx: Arc<Ctx>,
    urls: Urls,
    retry: bool,
    target: u64,
    deadline: Instant,
) -> ConsumerOutcome {
    let mut out = ConsumerOutcome::default();
    while !ctx.progress.is_done() && Instant::now() < deadline {
        let Some(batch) = consumer::lease(&ctx, &urls).await else {
            continue;
        };
        out.leases += 1;
        if batch.is_empty() {
            out.empty_leases += 1;
            continue;
        }
        out.leased += batch.len() as u64;
        let mut acks = Vec::with_capacity(batch.len());
        let mut ack_sent_at = Vec::with_capacity(batch.len()); // Some(publish µs) for this run's messages
        let mut nacks = Vec::new();
        for m in &batch {
            let own = m.is_from(&ctx.run_id);
            if out.fails(own, i64::from(m.attempt), retry) {
                nacks.push(Item {
                    id: &m.id,
                    lease: &m.lease,
                    error: Some(TRANSIENT),
                });
                continue;
            }
            acks.push(Item {
                id: &m.id,
                lease: &m.lease,
                error: None,
            });
            ack_sent_at.push(if own {
                Some(m.payload_i64("t").unwrap_or(0))
            } else {
                None
            });
        }
        let (nacked, acked) = tokio::join!(
            consumer::settle(&ctx, &urls, &nacks, true),
            consumer::settle(&ctx, &urls, &acks, false)
        );
        if let Some(results) = nacked {
            for r in results.iter().filter(|r| r.status == 200) {
                out.nacked += 1;
                if r.new_state() == Some(redrive_core::State::Dead) {
                    out.dead_on_nack += 1;
                }
            }
        }
        if let Some(results) = acked {
            let sent = results
                .iter()
                .zip(&ack_sent_at)
                .filter(|(r, _)| r.status == 200)
                .filter_map(|(_, sent)| sent.as_ref());
            out.completed(&ctx, sent, target);
        }
    }
    out
}

/// retry-cycle needs its queue to retry at once: check the policy the server
/// reports for it before loading anything.
async fn check_zero_delay_policy(ctx: &Ctx) -> anyhow::Result<()> {
    let policy: Option<RetryPolicy> = match ctx.api.queue(&ctx.queue).await {
        Ok(view) => Some(view.policy),
        // An answer of another shape (another version): warn below and go on.
        Err(redrive_client::Error::Decode { .. }) => None,
        Err(e) => return Err(redrive_client::cli::cli_error(e)),
    };
    match policy {
        Some(p) => match zero_delay_problem(&p) {
            Some(problem) => Err(anyhow::anyhow!(
                "queue {q:?} does not retry at once: {problem}. retry-cycle needs a zero-delay policy; \
                 start the server with a config such as\n\n    [queues.\"{q}\".retry]\n    backoff = \"fixed\"\n    \
                 initial_delay = \"0s\"\n    jitter = \"none\"\n",
                q = ctx.queue
            )),
            None => Ok(()),
        },
        None => {
            eprintln!("warning: cannot read the policy of queue {:?}; assuming it retries at once", ctx.queue);
            Ok(())
        }
    }
}

/// Why `policy` does not suit retry-cycle (first retry immediate), if it does not.
fn zero_delay_problem(policy: &RetryPolicy) -> Option<String> {
    if policy.max_attempts < 2 {
        return Some(format!(
            "max_attempts = {}: a nacked message goes dead",
            policy.max_attempts
        ));
    }
    match policy.explain().first() {
        Some(row) if row.delay_max_ms > 0 => Some(format!(
            "its first retry waits up to {}",
            format_duration_ms(row.delay_max_ms)
        )),
        _ => None,
    }
}

/// Wait for a peer's publisher and consumer tasks (`--pg`, `--mysql`): their outcomes summed,
/// with the publishers' time since `started`.
pub(super) async fn join_tasks(
    mut publishing: tokio::task::JoinSet<super::publish::PublisherOutcome>,
    mut consuming: tokio::task::JoinSet<ConsumerOutcome>,
    started: std::time::Instant,
) -> (
    anyhow::Result<(super::publish::PublisherOutcome, std::time::Duration)>,
    anyhow::Result<ConsumerOutcome>,
) {
    let published = async {
        let mut total = super::publish::PublisherOutcome::default();
        while let Some(r) = publishing.join_next().await {
            let o = r.map_err(|e| anyhow::anyhow!("a publisher task failed: {e}"))?;
            total.latency.merge(o.latency);
            total.requests += o.requests;
            total.messages += o.messages;
        }
        anyhow::Ok((total, started.elapsed()))
    };
    let consumed = async {
        let mut total = ConsumerOutcome::default();
        while let Some(r) = consuming.join_next().await {
            total.merge(r.map_err(|e| anyhow::anyhow!("a consumer task failed: {e}"))?);
        }
        anyhow::Ok(total)
    };
    tokio::join!(published, consumed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redrive_core::{Backoff, DurationMs, Jitter, RetryPolicyConfig};

    #[test]
    fn connections_split_between_sides() {
        assert_eq!(split(64, None), (16, 48));
        assert_eq!(split(64, Some(8)), (8, 56));
        assert_eq!(split(2, None), (1, 1));
        assert_eq!(split(1, None), (1, 1));
        assert_eq!(split(4, Some(10)), (3, 1));
        // scripts/bench_vs_pg.sh: --connections consumers + publishers, --publishers given.
        assert_eq!(split(16 + 4, Some(4)), (4, 16));
        assert_eq!(split(64 + 4, Some(4)), (4, 64));
        assert_eq!(split(8 + 4, Some(4)), (4, 8));
    }

    #[test]
    fn zero_delay_policy_is_recognised() {
        let zero = RetryPolicyConfig {
            backoff: Some(Backoff::Fixed),
            initial_delay: Some(DurationMs(0)),
            jitter: Some(Jitter::None),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(zero_delay_problem(&zero), None);
        let p = zero_delay_problem(&RetryPolicy::default()).unwrap();
        assert!(p.contains("first retry waits up to 1s"), "{p}");
        let once = RetryPolicy {
            max_attempts: 1,
            ..zero
        };
        assert!(zero_delay_problem(&once)
            .unwrap()
            .contains("max_attempts = 1"));
    }
}
