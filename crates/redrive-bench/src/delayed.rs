//! `delayed`: how late does a delayed message arrive?
//!
//! Each message gets a due time computed here, at send time: most are short
//! (uniform in `[0, spread)`), a `--long-fraction` are long (uniform in
//! `[2 × spread, 3 × spread)`) and interleaved with the short ones, so a
//! scheduler that let a long message hold up later short ones (head-of-line
//! blocking, the TTL-queue ladder problem) would show in the short figures.
//! Due times start `--lead` after the run starts, so every message is
//! published before the first is due (the figure is the scheduler's accuracy
//! at a delivery rate of messages / spread, not the publish path's saturation).
//! The message is sent with `deliver_at` (RFC 3339, ms) and carries its due
//! time in its payload. Consumers long-poll (`wait` 5 s, max 100) and ack;
//! lateness = receive time − due time, for first deliveries only.

use super::consumer::{self, Item, Urls};
use super::publish::{publish_all, ItemFn, PublishPlan};
use super::report::Report;
use super::stats::Samples;
use super::{now_us, BenchArgs, Ctx};
use redrive_core::{format_duration_ms, SplitMix64, Timestamp};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// Most messages one lease asks for.
const LEASE_MAX: u32 = 100;
/// Long-poll wait of a lease.
const LEASE_WAIT: &str = "5s";

/// The delay of message `n`: `(delay_ms, long)`. Deterministic in `(seed, n)`.
pub fn delay_of(seed: u64, n: u64, spread_ms: u64, long_fraction: f64) -> (u64, bool) {
    let mut rng = SplitMix64::new(seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let long =
        (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= long_fraction && long_fraction > 0.0;
    let spread = spread_ms.max(1);
    if long {
        (rng.between(2 * spread, 3 * spread - 1), true)
    } else {
        (rng.between(0, spread - 1), false)
    }
}

/// The due time of a message `delay_ms` after the run's `base` (its start + `--lead`), or
/// after now when there is no lead (the message is published while deliveries run).
pub(super) fn due_of(base: Timestamp, lead_ms: u64, delay_ms: u64) -> Timestamp {
    if lead_ms == 0 {
        Timestamp::now().plus_ms(delay_ms)
    } else {
        base.plus_ms(delay_ms)
    }
}

/// `(publishers, consumers)` of `--connections`: `--publishers` (default a quarter) publish,
/// the rest consume.
pub(super) fn split_of(args: &BenchArgs) -> (usize, usize) {
    let connections = args.connections as usize;
    let publishers = args
        .publishers
        .map_or((connections / 4).max(1), |p| p as usize)
        .min(connections);
    (publishers, connections.saturating_sub(publishers).max(1))
}

/// When a run started at `start` gives up: `--timeout` after the last due time can come.
pub(super) fn deadline_of(args: &BenchArgs, start: Instant) -> Instant {
    start
        + Duration::from_millis(
            args.timeout
                .ms()
                .saturating_add(3 * args.spread.ms())
                .saturating_add(args.lead.ms()),
        )
}

/// What one consumer task saw (of the server's deliveries, or of the RabbitMQ peer's:
/// `delayed_ttl.rs`).
#[derive(Debug, Default)]
pub(super) struct Seen {
    short: Samples,
    long: Samples,
    /// Of every first delivery: due → the server's lease (ms resolution), and the server's
    /// lease → received here (the lease's wait for the writer and its answer's way back).
    to_lease: Samples,
    to_receipt: Samples,
    received: u64,
    early: u64,
    pub(super) redelivered: u64,
    pub(super) stale: u64,
}

impl Seen {
    /// A first delivery, `lateness_us` after its due time, of a short or a long delay.
    pub(super) fn first(&mut self, lateness_us: i64, long: bool) {
        if lateness_us < 0 {
            self.early += 1;
        }
        if long {
            self.long.push_us(lateness_us);
        } else {
            self.short.push_us(lateness_us);
        }
        self.received += 1;
    }

    /// Where a first delivery's lateness went: `due_ms` → the server's lease `leased_ms` →
    /// received at `received_us`.
    pub(super) fn split(&mut self, due_ms: i64, leased_ms: i64, received_us: i64) {
        self.to_lease.push_us((leased_ms - due_ms) * 1_000);
        self.to_receipt.push_us(received_us - leased_ms * 1_000);
    }

    /// Add what another consumer saw.
    pub(super) fn merge(&mut self, s: Seen) {
        self.short.merge(s.short);
        self.long.merge(s.long);
        self.to_lease.merge(s.to_lease);
        self.to_receipt.merge(s.to_receipt);
        self.received += s.received;
        self.early += s.early;
        self.redelivered += s.redelivered;
        self.stale += s.stale;
    }

    /// Report what every consumer saw, `elapsed` from the first publish to the last
    /// delivery; the run is incomplete unless `target` first deliveries arrived.
    pub(super) fn report(
        mut self,
        report: &mut Report,
        target: u64,
        published: u64,
        elapsed: Duration,
    ) {
        report.count("received", "received (first deliveries)", self.received);
        report.secs(
            "elapsed_s",
            "elapsed (first publish → last delivery)",
            elapsed.as_secs_f64(),
        );
        report.count("early", "delivered before due", self.early);
        report.count("redelivered", "redeliveries", self.redelivered);
        report.count("stale", "stale messages of other runs acked", self.stale);
        let mut all = self.short.clone();
        all.merge(self.long.clone());
        report.summary("lateness", "lateness (all)", all.summary());
        report.summary(
            "lateness_short",
            "lateness (short delays)",
            self.short.summary(),
        );
        report.summary(
            "lateness_long",
            "lateness (long delays)",
            self.long.summary(),
        );
        report.summary(
            "due_to_lease",
            "due → the server's lease (ms resolution)",
            self.to_lease.summary(),
        );
        report.summary(
            "lease_to_receipt",
            "the server's lease → received (ms resolution)",
            self.to_receipt.summary(),
        );
        if self.received < target {
            report.incomplete = Some(format!(
                "stopped at the deadline: received {} of {target} ({published} published)",
                self.received
            ));
        }
    }
}

/// Run `delayed` for `target` messages.
pub async fn run(
    ctx: Arc<Ctx>,
    args: &BenchArgs,
    target: u64,
    report: &mut Report,
) -> anyhow::Result<()> {
    let spread_ms = args.spread.ms();
    let long_fraction = args.long_fraction;
    let seed = now_us() as u64;
    let (publishers, consumers) = split_of(args);
    let start = Instant::now();
    let deadline = deadline_of(args, start);
    let lead_ms = args.lead.ms();
    let base = Timestamp::now().plus_ms(lead_ms);
    let item: ItemFn = Arc::new(move |ctx: &Ctx, n: u64| {
        let (delay, long) = delay_of(seed, n, spread_ms, long_fraction);
        let due = due_of(base, lead_ms, delay);
        format!(
            r#"{{"payload":{},"deliver_at":"{}"}}"#,
            ctx.payload(n, &format!(r#","due":{},"long":{long}"#, due.as_millis())),
            due.to_rfc3339()
        )
    });
    let plan = PublishPlan {
        url: ctx.url(&["v1", "queues", &ctx.queue, "messages"]),
        nodes: Vec::new(),
        batch: args.batch as u64,
        limit: Some(target),
        claimed: Arc::new(AtomicU64::new(0)),
        deadline,
        item,
        finishes: false,
    };
    let urls = Urls::new(&ctx, LEASE_MAX, LEASE_WAIT);
    let mut set = JoinSet::new();
    for _ in 0..consumers {
        set.spawn(consume(ctx.clone(), urls.clone(), target, deadline));
    }
    let publishing = async {
        let out = publish_all(&ctx, publishers, &plan).await;
        (out, start.elapsed())
    };
    let consuming = async {
        let mut all = Seen::default();
        while let Some(r) = set.join_next().await {
            all.merge(r.map_err(|e| anyhow::anyhow!("a consumer task failed: {e}"))?);
        }
        anyhow::Ok(all)
    };
    let ((published, publish_time), seen) = tokio::join!(publishing, consuming);
    let published = published?;
    let seen = seen?;
    let end = ctx.progress.end();
    report.text(
        "delays",
        "delays",
        format!(
            "short 0 – {spread}, long {} – {} ({:.0} % long)",
            format_duration_ms(2 * spread_ms),
            format_duration_ms(3 * spread_ms),
            long_fraction * 100.0,
            spread = format_duration_ms(spread_ms)
        ),
    );
    report.publishing(target, published.messages, publish_time);
    seen.report(
        report,
        target,
        published.messages,
        end.duration_since(start),
    );
    Ok(())
}

/// One consumer: long-poll, record lateness, ack.
async fn consume(ctx: Arc<Ctx>, urls: Urls, target: u64, deadline: Instant) -> Seen {
    let mut seen = Seen::default();
    while !ctx.progress.is_done() && Instant::now() < deadline {
        let Some(batch) = consumer::lease(&ctx, &urls).await else {
            continue;
        };
        let received_us = now_us();
        let mut firsts = 0;
        for m in &batch {
            if !m.is_from(&ctx.run_id) {
                seen.stale += 1;
                continue;
            }
            if m.attempt > 1 {
                seen.redelivered += 1;
                continue;
            }
            let Some(due_ms) = m.payload_i64("due") else {
                continue;
            };
            let long = m
                .payload
                .get("long")
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false);
            seen.first(received_us - due_ms * 1_000, long);
            if let Some(leased_ms) = m.leased_at_ms() {
                seen.split(due_ms, leased_ms, received_us);
            }
            firsts += 1;
        }
        let items: Vec<Item<'_>> = batch
            .iter()
            .map(|m| Item {
                id: &m.id,
                lease: &m.lease,
                error: None,
            })
            .collect();
        consumer::settle(&ctx, &urls, &items, false).await;
        ctx.progress.finish(firsts, target);
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_splits_at_the_servers_lease() {
        let mut seen = Seen::default();
        // Due at 1,000 ms, leased at 1,003 ms, received at 1,005.5 ms.
        seen.split(1_000, 1_003, 1_005_500);
        let mut other = Seen::default();
        other.split(2_000, 2_000, 2_001_000);
        seen.merge(other);
        let to_lease = seen.to_lease.summary().expect("two samples");
        let to_receipt = seen.to_receipt.summary().expect("two samples");
        assert_eq!((to_lease.count, to_lease.max_ms), (2, 3.0));
        assert_eq!((to_receipt.min_ms, to_receipt.max_ms), (1.0, 2.5));
    }

    #[test]
    fn delays_stay_in_their_ranges() {
        let (mut long, mut short) = (0, 0);
        for n in 0..10_000 {
            let (d, is_long) = delay_of(42, n, 10_000, 0.1);
            if is_long {
                long += 1;
                assert!((20_000..30_000).contains(&d), "{d}");
            } else {
                short += 1;
                assert!(d < 10_000, "{d}");
            }
        }
        assert!((800..1_200).contains(&long), "{long} long of 10000");
        assert_eq!(long + short, 10_000);
        assert_eq!(delay_of(42, 7, 10_000, 0.1), delay_of(42, 7, 10_000, 0.1));
        assert!((0..1000).all(|n| !delay_of(1, n, 10_000, 0.0).1));
        assert!((0..1000).all(|n| delay_of(1, n, 10_000, 1.0).1));
    }
}
