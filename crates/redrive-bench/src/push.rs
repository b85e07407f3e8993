//! `redrive-bench --workload push`: push delivery to a healthy endpoint.
//!
//! The bench hosts an endpoint without a capacity limit (every request answered 200 at
//! once) on `--push-endpoint`, and publishes `--messages` (default 50,000) in batches of
//! `--batch` into queue `bench-push`, which the server must push to that address (the
//! config of `scripts/bench_server.sh` does). Reported: publish rate, deliveries per
//! second (first message published → last one delivered), and the latency from publish
//! (send of the publish request) to the endpoint's 2xx, p50 / p90 / p99 / max.

use super::publish::{plain_item, publish_all, PublishPlan};
use super::report::Report;
use super::storm::{expect_pushed, serve, Mock};
use super::{BenchArgs, Ctx};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The queue the server pushes to `--push-endpoint`.
pub const QUEUE: &str = "bench-push";

/// Run the workload into `report`.
pub async fn run(
    ctx: Arc<Ctx>,
    args: &BenchArgs,
    messages: u64,
    report: &mut Report,
) -> anyhow::Result<()> {
    expect_pushed(&ctx, QUEUE, args.push_endpoint, "scripts/bench_server.sh").await?;
    let start = Instant::now();
    let mock = Arc::new(Mock::new(start, f64::INFINITY));
    let (_up, up_rx) = watch::channel(false);
    tokio::spawn(serve(args.push_endpoint, mock.clone(), up_rx));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let plan = PublishPlan {
        url: ctx.url(&["v1", "queues", QUEUE, "messages"]),
        nodes: Vec::new(),
        batch: u64::from(args.batch),
        limit: Some(messages),
        claimed: Arc::new(AtomicU64::new(0)),
        deadline: start + Duration::from_millis(args.timeout.ms()),
        item: plain_item(),
        finishes: false,
    };
    let publishers = args.publishers.unwrap_or(4) as usize;
    let published = publish_all(&ctx, publishers, &plan).await?;
    let publish_s = start.elapsed().as_secs_f64();
    let deadline = start + Duration::from_millis(args.timeout.ms());
    while (mock.delivered() as u64) < published.messages && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let delivered = mock.delivered() as u64;
    let last_s = mock.last_delivery_ms().map_or(0.0, |ms| ms as f64 / 1000.0);
    report.publishing(
        messages,
        published.messages,
        Duration::from_secs_f64(publish_s),
    );
    report.count("delivered", "messages delivered (first 2xx)", delivered);
    report.rate(
        "delivered_per_s",
        "deliveries/s (start → last first 2xx)",
        delivered as f64 / last_s.max(1e-9),
    );
    report.summary(
        "publish_to_2xx",
        "publish → endpoint 2xx",
        mock.take_latency().summary(),
    );
    report.count(
        "requests",
        "requests the endpoint got (retries and repeats included)",
        mock.requests.load(std::sync::atomic::Ordering::Relaxed),
    );
    if delivered < published.messages {
        report.incomplete = Some(format!(
            "{delivered} of {} published messages delivered before --timeout",
            published.messages
        ));
    }
    Ok(())
}
