//! Publishing workloads — `publish` (one message per request), `publish-batch`
//! and `scheduled` (batches due far ahead) — and the [`publisher`] task that
//! the consuming workloads reuse to feed their queue.

use super::report::Report;
use super::stats::Samples;
use super::{claim, BenchArgs, Ctx, Workload};
use redrive_core::{format_duration_ms, Timestamp};
use reqwest::Url;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// Builds the JSON item (`{"payload": …, …}`) of message number `n`, at send time.
pub type ItemFn = Arc<dyn Fn(&Ctx, u64) -> String + Send + Sync>;

/// A plain item: the bench payload, deliverable now.
pub fn plain_item() -> ItemFn {
    Arc::new(|ctx: &Ctx, n: u64| format!(r#"{{"payload":{}}}"#, ctx.payload(n, "")))
}

/// How a [`publisher`] task sends.
#[derive(Clone)]
pub struct PublishPlan {
    /// `POST /v1/queues/{queue}/messages`.
    pub url: Url,
    /// Other nodes of the server's cluster: task i publishes to [`super::on_node`]`(url,
    /// nodes, i)` (empty: all to `url`).
    pub nodes: Vec<Url>,
    /// Messages per request; 0 means one message per request in the single form (no `messages` array).
    pub batch: u64,
    /// Stop after this many messages in all tasks (claimed from `claimed`).
    pub limit: Option<u64>,
    /// Slots handed out so far (shared by the tasks).
    pub claimed: Arc<AtomicU64>,
    /// Stop starting requests at this instant.
    pub deadline: Instant,
    /// Builds each item.
    pub item: ItemFn,
    /// Count published messages as finished too (publish-only workloads).
    pub finishes: bool,
}

/// What one publisher task did.
#[derive(Debug, Default)]
pub struct PublisherOutcome {
    /// Request latency of successful requests.
    pub latency: Samples,
    /// Successful requests.
    pub requests: u64,
    /// Messages published (2xx).
    pub messages: u64,
}

/// One publishing task: claim a slice of messages, send it, repeat until the
/// limit, the deadline, or the end of the run. A failed request is counted and
/// sent again (after a pause), so a count-driven run still publishes everything.
pub async fn publisher(ctx: Arc<Ctx>, plan: PublishPlan) -> PublisherOutcome {
    let mut out = PublisherOutcome::default();
    let per_request = plan.batch.max(1);
    'claims: loop {
        if Instant::now() >= plan.deadline || ctx.progress.is_done() {
            break;
        }
        let range = claim(&plan.claimed, per_request, plan.limit);
        if range.is_empty() {
            break;
        }
        let n = range.end - range.start;
        loop {
            let body = if plan.batch == 0 {
                (plan.item)(&ctx, range.start)
            } else {
                let mut body = String::with_capacity(16 + n as usize * 128);
                body.push_str(r#"{"messages":["#);
                for (i, seq) in range.clone().enumerate() {
                    if i > 0 {
                        body.push(',');
                    }
                    body.push_str(&(plan.item)(&ctx, seq));
                }
                body.push_str("]}");
                body
            };
            let t0 = Instant::now();
            if ctx.post(&plan.url, body).await.is_some() {
                out.latency.push_since(t0);
                out.requests += 1;
                out.messages += n;
                ctx.progress.published.fetch_add(n, Ordering::Relaxed);
                if plan.finishes {
                    ctx.progress.finished.fetch_add(n, Ordering::Relaxed);
                }
                break;
            }
            if Instant::now() >= plan.deadline || ctx.progress.is_done() {
                break 'claims;
            }
        }
    }
    out
}

/// Start `tasks` publishers and gather their outcomes.
pub async fn publish_all(
    ctx: &Arc<Ctx>,
    tasks: usize,
    plan: &PublishPlan,
) -> anyhow::Result<PublisherOutcome> {
    let mut set = JoinSet::new();
    for i in 0..tasks {
        let mut p = plan.clone();
        p.url = super::on_node(&plan.url, &plan.nodes, i);
        set.spawn(publisher(ctx.clone(), p));
    }
    let mut total = PublisherOutcome::default();
    while let Some(r) = set.join_next().await {
        let o = r.map_err(|e| anyhow::anyhow!("a publisher task failed: {e}"))?;
        total.latency.merge(o.latency);
        total.requests += o.requests;
        total.messages += o.messages;
    }
    Ok(total)
}

/// Run `publish`, `publish-batch` or `scheduled`.
pub async fn run(
    ctx: Arc<Ctx>,
    args: &BenchArgs,
    messages: Option<u64>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let scheduled = args.workload == Workload::Scheduled;
    let deadline = if scheduled {
        start + Duration::from_millis(args.timeout.ms())
    } else {
        start + Duration::from_millis(args.duration.ms())
    };
    let due_from = Timestamp::now().plus_ms(args.ahead.ms());
    // Scheduled messages are spread over one hour after `ahead`, one due time per second.
    const SPREAD_SECS: u64 = 3_600;
    let item: ItemFn = if scheduled {
        Arc::new(move |ctx: &Ctx, n: u64| {
            let due = due_from.plus_ms((n % SPREAD_SECS) * 1_000);
            format!(
                r#"{{"payload":{},"deliver_at":"{}"}}"#,
                ctx.payload(n, ""),
                due.to_rfc3339()
            )
        })
    } else {
        super::publish::plain_item()
    };
    let plan = PublishPlan {
        url: ctx.url(&["v1", "queues", &ctx.queue, "messages"]),
        nodes: Vec::new(),
        batch: if args.workload == Workload::Publish {
            0
        } else {
            args.batch as u64
        },
        limit: messages,
        claimed: Arc::new(AtomicU64::new(0)),
        deadline,
        item,
        finishes: true,
    };
    let mut out = publish_all(&ctx, args.connections as usize, &plan).await?;
    let elapsed = start.elapsed().as_secs_f64();

    report.count("messages", "messages published", out.messages);
    report.count("requests", "requests", out.requests);
    report.secs("elapsed_s", "elapsed", elapsed);
    report.rate(
        "messages_per_s",
        "publish rate",
        out.messages as f64 / elapsed,
    );
    if args.workload != Workload::Publish {
        report.rate(
            "requests_per_s",
            "request rate",
            out.requests as f64 / elapsed,
        );
    }
    report.summary("request_latency", "request latency", out.latency.summary());
    if scheduled {
        report.count("scheduled", "scheduled", out.messages);
        report.text(
            "due_window",
            "due",
            format!(
                "{} – {} (in {} – {})",
                due_from.to_rfc3339(),
                due_from.plus_ms((SPREAD_SECS - 1) * 1_000).to_rfc3339(),
                format_duration_ms(args.ahead.ms()),
                format_duration_ms(args.ahead.ms() + (SPREAD_SECS - 1) * 1_000)
            ),
        );
        report.text(
            "note",
            "note",
            "they stay scheduled until due: measure RSS, disk and restart time now",
        );
        if let Some(limit) = messages {
            if out.messages < limit {
                report.incomplete = Some(format!(
                    "stopped after --timeout {}: scheduled {} of {limit}",
                    format_duration_ms(args.timeout.ms()),
                    out.messages
                ));
            }
        }
    }
    Ok(())
}
