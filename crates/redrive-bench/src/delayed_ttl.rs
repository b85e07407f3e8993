//! `delayed --ttl-queue`: the same due times delivered by RabbitMQ's own delayed delivery, a
//! TTL queue dead-lettering into a work queue, on the broker at `--amqp` (no redrive server).
//!
//! RabbitMQ expires messages only at the head of a queue, so a TTL queue is exact only
//! while its messages are queued in due order. The peer gets its best case: every delay is
//! drawn as `delayed` draws it ([`delay_of`], the same `--spread`, `--lead` and
//! `--long-fraction`), the short and the long delays go to two wait queues, and each queue
//! is published in due order, each message with `expiration` = its due time − now. Both
//! wait queues dead-letter into `delayed-ttl.ready`, whose consumers ack each delivery;
//! lateness = receive time − due time, first deliveries only. Messages are persistent, the
//! queues durable, and publishes confirmed (as the server's answer is).

use super::delayed::{deadline_of, delay_of, due_of, split_of, Seen};
use super::report::Report;
use super::{now_us, BenchArgs, Ctx};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use redrive_core::Timestamp;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// The wait queues (short delays, long delays) and the queue they dead-letter into.
const WAIT: [&str; 2] = ["delayed-ttl.wait-short", "delayed-ttl.wait-long"];
const READY: &str = "delayed-ttl.ready";
/// Unconfirmed publishes in flight per publisher. Small: an expiration counts from the
/// message's arrival at the queue, so every publish queued ahead of it would make it late
/// (1,000 in flight: p50 12-14 ms late at 500 and 1,000 due/s; 16: 2.5 ms; 4: 2.4 ms).
const CONFIRM_WINDOW: usize = 16;
/// Deliveries a consumer holds unacked (the server's lease batch).
const PREFETCH: u16 = 100;

async fn declare(ch: &Channel) -> anyhow::Result<()> {
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    ch.queue_declare(READY, durable, FieldTable::default())
        .await?;
    for q in WAIT {
        let mut args = FieldTable::default();
        args.insert(
            ShortString::from("x-dead-letter-exchange"),
            AMQPValue::LongString(LongString::from(Vec::new())),
        );
        args.insert(
            ShortString::from("x-dead-letter-routing-key"),
            AMQPValue::LongString(LongString::from(READY.as_bytes().to_vec())),
        );
        ch.queue_declare(q, durable, args).await?;
    }
    for q in WAIT.into_iter().chain([READY]) {
        ch.queue_purge(q, QueuePurgeOptions::default()).await?;
    }
    Ok(())
}

/// Publish `due` (ms since the epoch, ascending) to `queue`, each with the expiration that
/// makes it due then; bodies are `<run id> <due ms> <long>`. Answers how many were confirmed.
async fn publish(
    ch: Channel,
    queue: &'static str,
    run_id: String,
    due: Vec<i64>,
    long: bool,
) -> anyhow::Result<u64> {
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut in_flight = std::collections::VecDeque::with_capacity(CONFIRM_WINDOW);
    let mut confirmed = 0;
    for d in due {
        let expiration = (d - now_us() / 1_000).max(0);
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_expiration(ShortString::from(expiration.to_string()));
        let body = format!("{run_id} {d} {long}");
        let confirm = ch
            .basic_publish(
                "",
                queue,
                BasicPublishOptions::default(),
                body.as_bytes(),
                props,
            )
            .await?;
        in_flight.push_back(confirm);
        if in_flight.len() >= CONFIRM_WINDOW {
            if let Some(c) = in_flight.pop_front() {
                c.await?;
                confirmed += 1;
            }
        }
    }
    for c in in_flight {
        c.await?;
        confirmed += 1;
    }
    Ok(confirmed)
}

/// One consumer of the ready queue: record lateness, ack; until `target` were received by
/// all (`received`) or `deadline`.
async fn consume(
    ch: Channel,
    tag: String,
    run_id: String,
    received: Arc<std::sync::atomic::AtomicU64>,
    target: u64,
    deadline: Instant,
) -> anyhow::Result<Seen> {
    use std::sync::atomic::Ordering;
    ch.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
    let mut c = ch
        .basic_consume(
            READY,
            &tag,
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut seen = Seen::default();
    while received.load(Ordering::Relaxed) < target {
        let left = deadline.saturating_duration_since(Instant::now());
        let d = match tokio::time::timeout(left.min(Duration::from_millis(200)), c.next()).await {
            Ok(Some(d)) => d?,
            Ok(None) => break,
            Err(_) if Instant::now() >= deadline => break,
            Err(_) => continue,
        };
        let received_us = now_us();
        let body = String::from_utf8_lossy(&d.data).into_owned();
        d.acker.ack(BasicAckOptions::default()).await?;
        let mut parts = body.split(' ');
        let (Some(run), Some(due), Some(long)) = (parts.next(), parts.next(), parts.next()) else {
            seen.stale += 1;
            continue;
        };
        if run != run_id {
            seen.stale += 1;
            continue;
        }
        if d.redelivered {
            seen.redelivered += 1;
            continue;
        }
        let due_ms: i64 = due.parse().unwrap_or(0);
        seen.first(received_us - due_ms * 1_000, long == "true");
        received.fetch_add(1, Ordering::Relaxed);
    }
    Ok(seen)
}

/// Run `delayed` for `target` messages on RabbitMQ's TTL queues.
pub async fn run(
    ctx: Arc<Ctx>,
    args: &BenchArgs,
    target: u64,
    report: &mut Report,
) -> anyhow::Result<()> {
    let spread_ms = args.spread.ms();
    let lead_ms = args.lead.ms();
    let seed = now_us() as u64;
    // Its publishers are one channel per wait queue, whatever `--publishers` says; the
    // consumers are as many as the server's run would have.
    let (_, consumers) = split_of(args);
    let start = Instant::now();
    let deadline = deadline_of(args, start);
    let base = Timestamp::now().plus_ms(lead_ms);
    let (mut short, mut long) = (Vec::new(), Vec::new());
    for n in 0..target {
        let (delay, is_long) = delay_of(seed, n, spread_ms, args.long_fraction);
        let due = due_of(base, lead_ms, delay).as_millis();
        if is_long {
            long.push(due);
        } else {
            short.push(due);
        }
    }
    short.sort_unstable();
    long.sort_unstable();

    let conn = Connection::connect(&args.amqp, ConnectionProperties::default())
        .await
        .map_err(|e| anyhow::anyhow!("cannot use RabbitMQ at {}: {e}", args.amqp))?;
    declare(&conn.create_channel().await?).await?;
    let received = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut set = JoinSet::new();
    for i in 0..consumers {
        set.spawn(consume(
            conn.create_channel().await?,
            format!("bench-{}-{i}", ctx.run_id),
            ctx.run_id.clone(),
            received.clone(),
            target,
            deadline,
        ));
    }
    let publishing = async {
        let (s, l) = tokio::join!(
            publish(
                conn.create_channel().await?,
                WAIT[0],
                ctx.run_id.clone(),
                short,
                false
            ),
            publish(
                conn.create_channel().await?,
                WAIT[1],
                ctx.run_id.clone(),
                long,
                true
            ),
        );
        anyhow::Ok((s? + l?, start.elapsed()))
    };
    let consuming = async {
        let mut all = Seen::default();
        while let Some(r) = set.join_next().await {
            all.merge(r.map_err(|e| anyhow::anyhow!("a consumer task failed: {e}"))??);
        }
        anyhow::Ok((all, Instant::now()))
    };
    let (published, seen) = tokio::join!(publishing, consuming);
    let (published, publish_time) = published?;
    let (seen, end) = seen?;
    let _ = conn.close(200, "bench done").await;

    report.text(
        "system",
        "system",
        "RabbitMQ TTL queues (short and long delays apart, each in due order)",
    );
    report.publishing(target, published, publish_time);
    seen.report(report, target, published, end.duration_since(start));
    Ok(())
}
