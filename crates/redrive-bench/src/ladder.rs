//! `redrive-bench --workload ladder`: the RabbitMQ bridge beside the TTL + dead-letter
//! ladder that seed 001 builds by hand, doing the same work in the same run on the same
//! broker (issue 8).
//!
//! - **The ladder.** A consumer that fails a message publishes a copy to one delay queue
//!   (no consumers, `x-dead-letter-exchange` = the work exchange) with a per-message
//!   `expiration` of the retry delay and `x-retry-count` + 1, and acks the original. RabbitMQ
//!   expires messages only at the head of a queue, so a retry waits behind every longer one
//!   queued before it.
//! - **The bridge.** The consumer rejects (`requeue = false`); the server's bridge stores the
//!   message, and republishes it when its queue's policy says.
//!
//! Two measurements, each on both:
//! 1. *Throughput and lateness*: `--messages` messages fail once and are retried after 1 s;
//!    retries per second (first failure → last retry received) and the retry's lateness
//!    (received − failed − 1 s), p50 / p99 / max.
//! 2. *Head of line*: a message retried after 10 s, then one retried after 100 ms; the
//!    lateness of the 100 ms one.
//!
//! The server must run the bridges `scripts/bench_bridge.sh` configures: `bench-ladder`
//! (1 s fixed), `hol-slow` (10 s) and `hol-fast` (100 ms), on the work queues this workload
//! declares.

use super::stats::Samples;
use super::Ctx;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicRejectOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Work queues of the bridged side (the bridges' dead-letter exchanges are `<queue>.dlx`).
pub const BRIDGED: [(&str, u64); 3] = [
    ("bench-ladder", 1_000),
    ("hol-slow", 10_000),
    ("hol-fast", 100),
];
/// The ladder's work queue and its delay queue.
const LADDER_WORK: &str = "ladder.work";
const LADDER_DELAY: &str = "ladder.delay";

/// Per message: when it failed (first delivery), when its retry arrived.
type Times = Arc<Mutex<HashMap<String, (Instant, Option<Instant>)>>>;

async fn declare(ch: &Channel) -> anyhow::Result<()> {
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let x = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    // Bridged side: work queue `q`, dead-lettering into `q.dlx` (the bridge binds its intake).
    for (q, _) in BRIDGED {
        let dlx = format!("{q}.dlx");
        ch.exchange_declare(&dlx, ExchangeKind::Fanout, x, FieldTable::default())
            .await?;
        let mut args = FieldTable::default();
        args.insert(
            ShortString::from("x-dead-letter-exchange"),
            AMQPValue::LongString(LongString::from(dlx.into_bytes())),
        );
        ch.queue_declare(q, durable, args).await?;
        ch.queue_purge(q, QueuePurgeOptions::default()).await?;
    }
    // The ladder: work exchange + queue, and a delay queue dead-lettering back into it.
    ch.exchange_declare(LADDER_WORK, ExchangeKind::Direct, x, FieldTable::default())
        .await?;
    ch.queue_declare(LADDER_WORK, durable, FieldTable::default())
        .await?;
    ch.queue_bind(
        LADDER_WORK,
        LADDER_WORK,
        "work",
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-dead-letter-exchange"),
        AMQPValue::LongString(LongString::from(LADDER_WORK.as_bytes().to_vec())),
    );
    args.insert(
        ShortString::from("x-dead-letter-routing-key"),
        AMQPValue::LongString(LongString::from(b"work".to_vec())),
    );
    ch.queue_declare(LADDER_DELAY, durable, args).await?;
    for q in [LADDER_WORK, LADDER_DELAY] {
        ch.queue_purge(q, QueuePurgeOptions::default()).await?;
    }
    Ok(())
}

fn id_of(d: &lapin::message::Delivery) -> String {
    d.properties
        .message_id()
        .as_ref()
        .map(|s| s.as_str().to_owned())
        .unwrap_or_default()
}

/// Record a delivery of `id` now: its first (the failure) or its retry. Whether it is the
/// first.
fn seen(times: &Times, id: &str) -> bool {
    let now = Instant::now();
    let mut t = times.lock().unwrap_or_else(|e| e.into_inner());
    match t.get_mut(id) {
        None => {
            t.insert(id.to_owned(), (now, None));
            true
        }
        Some(e) => {
            e.1.get_or_insert(now);
            false
        }
    }
}

/// The bridged side's consumer of `queue`: reject the first delivery, ack the retry.
async fn bridged_consumer(ch: Channel, queue: &'static str, times: Times) -> anyhow::Result<()> {
    let mut c = ch
        .basic_consume(
            queue,
            "bench",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    while let Some(d) = c.next().await {
        let d = d?;
        let first = seen(&times, &id_of(&d));
        if first {
            d.acker
                .reject(BasicRejectOptions { requeue: false })
                .await?;
        } else {
            d.acker.ack(BasicAckOptions::default()).await?;
        }
    }
    Ok(())
}

/// The ladder's consumer: on the first delivery, publish a copy to the delay queue with an
/// `expiration` of its delay (from the body) and ack the original; ack the retry.
async fn ladder_consumer(ch: Channel, times: Times) -> anyhow::Result<()> {
    let publish = ch.clone();
    let mut c = ch
        .basic_consume(
            LADDER_WORK,
            "bench",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    while let Some(d) = c.next().await {
        let d = d?;
        let id = id_of(&d);
        let first = seen(&times, &id);
        if first {
            let delay_ms = String::from_utf8_lossy(&d.data)
                .parse::<u64>()
                .unwrap_or(1_000);
            let mut headers = FieldTable::default();
            headers.insert(
                ShortString::from("x-retry-count"),
                AMQPValue::LongLongInt(1),
            );
            let props = BasicProperties::default()
                .with_message_id(ShortString::from(id))
                .with_expiration(ShortString::from(delay_ms.to_string()))
                .with_headers(headers);
            publish
                .basic_publish(
                    "",
                    LADDER_DELAY,
                    BasicPublishOptions::default(),
                    &d.data,
                    props,
                )
                .await?
                .await?;
        }
        d.acker.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}

/// Publish `ids` with body `delay_ms` to `exchange` / `routing_key`.
async fn publish(
    ch: &Channel,
    exchange: &str,
    routing_key: &str,
    ids: impl Iterator<Item = String>,
    delay_ms: u64,
) -> anyhow::Result<()> {
    for id in ids {
        let props = BasicProperties::default().with_message_id(ShortString::from(id));
        ch.basic_publish(
            exchange,
            routing_key,
            BasicPublishOptions::default(),
            delay_ms.to_string().as_bytes(),
            props,
        )
        .await?;
    }
    Ok(())
}

/// Wait until `n` retries arrived in `times` (or `deadline`); answer the lateness of each
/// against `delay_ms` and the span from the first failure to the last retry.
async fn retries(
    times: &Times,
    n: usize,
    delay_ms: u64,
    deadline: Instant,
) -> (Samples, f64, usize) {
    loop {
        let done = times
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|v| v.1.is_some())
            .count();
        if done >= n || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = times.lock().unwrap_or_else(|e| e.into_inner());
    let mut late = Samples::new();
    let first = t.values().map(|v| v.0).min();
    let last = t.values().filter_map(|v| v.1).max();
    let mut got = 0;
    for (failed, retried) in t.values() {
        if let Some(r) = retried {
            got += 1;
            let due = *failed + Duration::from_millis(delay_ms);
            late.push_us(if *r >= due {
                r.duration_since(due).as_micros() as i64
            } else {
                -(due.duration_since(*r).as_micros() as i64)
            });
        }
    }
    let span = match (first, last) {
        (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    (late, span, got)
}

/// Run the workload and print its report.
pub async fn run(_ctx: Arc<Ctx>, amqp: &str, messages: u64) -> anyhow::Result<()> {
    let conn = Connection::connect(amqp, ConnectionProperties::default()).await?;
    let admin = conn.create_channel().await?;
    declare(&admin).await?;
    let n = messages as usize;
    let mut rows = Vec::new();
    // 1. Throughput and lateness, 1 s retries, both sides at once.
    let bridged: Times = Arc::default();
    let ladder: Times = Arc::default();
    tokio::spawn(bridged_consumer(
        conn.create_channel().await?,
        "bench-ladder",
        bridged.clone(),
    ));
    tokio::spawn(ladder_consumer(
        conn.create_channel().await?,
        ladder.clone(),
    ));
    let pubc = conn.create_channel().await?;
    let ids = |p: &'static str| (0..messages).map(move |i| format!("{p}-{i}"));
    publish(&pubc, "", "bench-ladder", ids("b"), 1_000).await?;
    publish(&pubc, LADDER_WORK, "work", ids("l"), 1_000).await?;
    let deadline = Instant::now() + Duration::from_secs(300);
    for (name, times) in [("redrive bridge", &bridged), ("TTL + DLX ladder", &ladder)] {
        let (mut late, span, got) = retries(times, n, 1_000, deadline).await;
        rows.push(format!(
            "| {name} | {got} / {n} | {:.0}/s | {} |",
            got as f64 / span.max(1e-9),
            late.summary().map_or("-".to_owned(), |s| s.line())
        ));
    }
    // 2. Head of line: a 10 s retry, then a 100 ms one.
    let hol_bridged: Times = Arc::default();
    for (q, _) in &BRIDGED[1..] {
        tokio::spawn(bridged_consumer(
            conn.create_channel().await?,
            q,
            hol_bridged.clone(),
        ));
    }
    for (id, delay_ms, bridged_queue, pause) in [
        ("slow", 10_000, "hol-slow", 50),
        ("fast", 100, "hol-fast", 0),
    ] {
        for (exchange, routing_key) in [("", bridged_queue), (LADDER_WORK, "work")] {
            publish(
                &pubc,
                exchange,
                routing_key,
                std::iter::once(id.to_owned()),
                delay_ms,
            )
            .await?;
        }
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut hol = Vec::new();
    // The ladder's consumer of step 1 still runs on its work queue: "slow" and "fast" are
    // recorded beside the step's ids.
    for (name, times) in [
        ("redrive bridge", &hol_bridged),
        ("TTL + DLX ladder", &ladder),
    ] {
        let fast_retried = || {
            times
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get("fast")
                .is_some_and(|v| v.1.is_some())
        };
        while !fast_retried() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let t = times.lock().unwrap_or_else(|e| e.into_inner());
        let late = t.get("fast").and_then(|(failed, retried)| {
            let due = *failed + Duration::from_millis(100);
            retried.map(|r| r.saturating_duration_since(due).as_millis())
        });
        hol.push(format!(
            "| {name} | {} |",
            late.map_or("not retried within 60 s".to_owned(), |ms| format!(
                "{ms} ms"
            ))
        ));
    }
    println!("ladder: {messages} messages failing once, retried after 1 s, on each side at once");
    println!("| side | retries received | retries/s | lateness (received − failed − 1 s) |");
    println!("|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    println!();
    println!("head of line: a 10 s retry, then a 100 ms one 50 ms later");
    println!("| side | lateness of the 100 ms retry |");
    println!("|---|---|");
    for r in hol {
        println!("{r}");
    }
    let _ = conn.close(200, "bench done").await;
    Ok(())
}
