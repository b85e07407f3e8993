//! The bridges through a broker restart: the local RabbitMQ (`rabbitmqctl stop_app` /
//! `start_app`) and the local Redis (`shutdown nosave`, started again with this machine's
//! command). Each bridge reconnects, and every message the consumer failed before the
//! restart comes back after it and is acked once. Its own test binary, so that no other
//! test uses the brokers while they restart. Skipped when a broker is missing, except under
//! `CI=true`.

#[allow(dead_code)]
#[path = "it/harness.rs"]
mod harness;

use futures_util::StreamExt;
use harness::TestServer;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicRejectOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};
use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

async fn connect() -> Option<Connection> {
    Connection::connect(URL, ConnectionProperties::default())
        .await
        .ok()
}

/// The consumer: rejects the first delivery of each message id, acks the next; counts
/// every delivery. Returns when its connection dies.
async fn consume(queue: String, seen: Arc<Mutex<HashMap<String, (u32, u32)>>>) {
    let Some(conn) = connect().await else { return };
    let Ok(ch) = conn.create_channel().await else {
        return;
    };
    let Ok(mut c) = ch
        .basic_consume(
            &queue,
            "restart-test",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
    else {
        return;
    };
    while let Some(Ok(d)) = c.next().await {
        let id = d
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str().to_owned());
        let first = {
            let mut seen = seen.lock().unwrap();
            let e = seen.entry(id.clone().unwrap_or_default()).or_default();
            e.0 += 1;
            e.0 == 1
        };
        if first {
            let _ = d.acker.reject(BasicRejectOptions { requeue: false }).await;
        } else if d.acker.ack(BasicAckOptions::default()).await.is_ok() {
            if let Some(id) = id {
                seen.lock().unwrap().entry(id).or_default().1 += 1;
            }
        }
    }
}

/// Wait until the consumer acked all `n` messages (`prefix-0` …) and the queue has them
/// `done`; print the figures as `label` and assert none was lost or acked twice.
async fn all_acked_once(
    s: &TestServer,
    queue: &str,
    seen: &Arc<Mutex<HashMap<String, (u32, u32)>>>,
    n: u32,
    prefix: &str,
    label: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let acked: u32 = seen.lock().unwrap().values().map(|v| v.1).sum();
        let (_, q) = s.get(&format!("/v1/queues/{queue}")).await;
        if acked >= n && q["counts"]["done"] == n {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after the restart: acked {acked} of {n}, queue {q}, bridge {}",
            bridge(s).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = seen.lock().unwrap().clone();
    let lost = (0..n)
        .filter(|i| seen.get(&format!("{prefix}-{i}")).is_none_or(|v| v.1 == 0))
        .count();
    let acked_twice = seen.values().filter(|v| v.1 > 1).count();
    let b = bridge(s).await;
    println!(
        "{label}: messages={n} lost={lost} acked_twice={acked_twice} bridge_connects={} returned={} duplicates={}",
        b["connects"], b["returned"], b["duplicates"]
    );
    assert_eq!(lost, 0, "{seen:?}");
    assert_eq!(acked_twice, 0, "{seen:?}");
    assert!(
        b["connects"].as_u64().unwrap() >= 2,
        "the bridge did not reconnect: {b}"
    );
}

/// A suffix that keeps one run's names apart from another's.
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{nanos:08x}")
}

/// The bridge as `GET /v1/bridges` shows it.
async fn bridge(s: &TestServer) -> serde_json::Value {
    s.get("/v1/bridges").await.1["bridges"][0].clone()
}

/// Wait (at most 30 s) until the bridge took in `n` messages.
async fn wait_intake(s: &TestServer, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while bridge(s).await["intake"] != n {
        assert!(
            Instant::now() < deadline,
            "not all taken in: {}",
            bridge(s).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn rabbitmqctl(args: &[&str]) -> bool {
    Command::new("rabbitmqctl")
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_survives_a_broker_restart_and_loses_nothing() {
    let Some(conn) = connect().await else {
        assert!(
            std::env::var("CI").is_err(),
            "RabbitMQ is not reachable at {URL} under CI"
        );
        eprintln!("skipped: RabbitMQ is not reachable");
        return;
    };
    if !rabbitmqctl(&["status"]) {
        assert!(
            std::env::var("CI").is_err(),
            "rabbitmqctl does not work under CI"
        );
        eprintln!("skipped: rabbitmqctl does not work here");
        return;
    }
    let run = run_id();
    let (work, dlx, intake, queue) = (
        format!("rr.work.{run}"),
        format!("rr.dlx.{run}"),
        format!("rr.intake.{run}"),
        format!("rrq-{run}"),
    );
    // Durable, and persistent messages: what a restart must not lose.
    let admin = conn.create_channel().await.unwrap();
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    admin
        .exchange_declare(&work, ExchangeKind::Direct, durable, FieldTable::default())
        .await
        .unwrap();
    admin
        .exchange_declare(&dlx, ExchangeKind::Fanout, durable, FieldTable::default())
        .await
        .unwrap();
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-dead-letter-exchange"),
        AMQPValue::LongString(LongString::from(dlx.clone().into_bytes())),
    );
    let durable_q = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    admin.queue_declare(&work, durable_q, args).await.unwrap();
    admin
        .queue_bind(
            &work,
            &work,
            "job",
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    // Retries 3 s after the first rejection: after the restart.
    let s = TestServer::start(&format!(
        r#"
[bridges.rabbitmq.restart]
url = "{URL}"
intake_queue = "{intake}"
queue = "{queue}"
dead_letter_exchange = "{dlx}"
[queues."{queue}".retry]
max_attempts = 100
backoff = "fixed"
initial_delay = "3s"
jitter = "none"
"#
    ))
    .await;
    for _ in 0..500 {
        if bridge(&s).await["state"] == "connected" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen: Arc<Mutex<HashMap<String, (u32, u32)>>> = Arc::default();
    tokio::spawn(consume(work.clone(), seen.clone()));
    let publisher = conn.create_channel().await.unwrap();
    const N: u32 = 20;
    for i in 0..N {
        let props = BasicProperties::default()
            .with_message_id(ShortString::from(format!("r-{i}")))
            .with_delivery_mode(2);
        publisher
            .basic_publish(
                &work,
                "job",
                BasicPublishOptions::default(),
                b"payload",
                props,
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    // All rejected once and stored in redrive, due in 3 s.
    wait_intake(&s, N).await;
    assert!(rabbitmqctl(&["stop_app"]), "rabbitmqctl stop_app failed");
    assert!(rabbitmqctl(&["start_app"]), "rabbitmqctl start_app failed");
    // The test's consumer reconnects like any client would.
    let consumer_seen = seen.clone();
    let work_q = work.clone();
    tokio::spawn(async move {
        loop {
            consume(work_q.clone(), consumer_seen.clone()).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    all_acked_once(&s, &queue, &seen, N, "r", "broker restart test").await;
    s.stop().await;
    if let Some(conn) = connect().await {
        if let Ok(admin) = conn.create_channel().await {
            for q in [&work, &intake] {
                let _ = admin
                    .queue_delete(q, lapin::options::QueueDeleteOptions::default())
                    .await;
            }
            for x in [&work, &dlx] {
                let _ = admin
                    .exchange_delete(x, lapin::options::ExchangeDeleteOptions::default())
                    .await;
            }
        }
    }
}

/// A Redis connection, or `None` (skip) when Redis is down outside CI.
async fn redis_conn() -> Option<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(REDIS).ok()?;
    client.get_multiplexed_tokio_connection().await.ok()
}

const REDIS: &str = "redis://127.0.0.1:6379";
/// How this machine starts its Redis (it keeps nothing on disk: a restart empties it).
const REDIS_START: &str = "redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save '' --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log";

/// The consumer: leaves the first read of each order unacked, acks the next; reconnects.
async fn redis_consumer(stream: String, seen: Arc<Mutex<HashMap<String, (u32, u32)>>>) {
    loop {
        let Some(mut c) = redis_conn().await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        loop {
            let reply: Result<redis::Value, _> = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg("workers")
                .arg("w1")
                .arg("COUNT")
                .arg(10)
                .arg("BLOCK")
                .arg(100)
                .arg("STREAMS")
                .arg(&stream)
                .arg(">")
                .query_async(&mut c)
                .await;
            let Ok(reply) = reply else { break };
            let entries = redis_entries(&reply);
            for (id, order) in entries {
                let ack = {
                    let mut s = seen.lock().unwrap();
                    let e = s.entry(order.clone()).or_default();
                    e.0 += 1;
                    e.0 > 1
                };
                if ack {
                    let acked: Result<i64, _> = redis::cmd("XACK")
                        .arg(&stream)
                        .arg("workers")
                        .arg(&id)
                        .query_async(&mut c)
                        .await;
                    if acked == Ok(1) {
                        seen.lock().unwrap().entry(order).or_default().1 += 1;
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// (entry id, its "order" field) of an XREADGROUP reply.
fn redis_entries(reply: &redis::Value) -> Vec<(String, String)> {
    use redis::Value as V;
    let text = |v: &V| match v {
        V::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        V::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let mut out = Vec::new();
    let streams: Vec<&V> = match reply {
        V::Array(a) => a.iter().collect(),
        V::Map(m) => m.iter().map(|(_, v)| v).collect(),
        _ => return out,
    };
    for s in streams {
        let entries = match s {
            V::Array(pair) if pair.len() == 2 => &pair[1],
            other => other,
        };
        let V::Array(entries) = entries else { continue };
        for e in entries {
            let V::Array(parts) = e else { continue };
            let (Some(id), Some(V::Array(kv))) = (parts.first().and_then(text), parts.get(1))
            else {
                continue;
            };
            let order = kv
                .chunks(2)
                .find(|p| p.first().and_then(text).as_deref() == Some("order"))
                .and_then(|p| p.get(1).and_then(text));
            if let Some(order) = order {
                out.push((id, order));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_bridge_survives_a_redis_restart_and_loses_nothing_it_stored() {
    let Some(mut r) = redis_conn().await else {
        assert!(
            std::env::var("CI").is_err(),
            "Redis is not reachable under CI"
        );
        eprintln!("skipped: Redis is not reachable");
        return;
    };
    let run = run_id();
    let (stream, queue) = (format!("rr.{run}"), format!("rrs-{run}"));
    let create_group = |stream: String| async move {
        let mut c = loop {
            if let Some(c) = redis_conn().await {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let _: Result<(), _> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&stream)
            .arg("workers")
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut c)
            .await;
    };
    create_group(stream.clone()).await;
    // Claimed after 200 ms idle, retried 3 s later: after the restart.
    let s = TestServer::start(&format!(
        r#"
[bridges.redis_streams.restart]
url = "{REDIS}"
stream = "{stream}"
group = "workers"
min_idle = "200ms"
queue = "{queue}"
[queues."{queue}".retry]
max_attempts = 100
backoff = "fixed"
initial_delay = "3s"
jitter = "none"
"#
    ))
    .await;
    let seen: Arc<Mutex<HashMap<String, (u32, u32)>>> = Arc::default();
    tokio::spawn(redis_consumer(stream.clone(), seen.clone()));
    const N: u32 = 20;
    for i in 0..N {
        let _: String = redis::cmd("XADD")
            .arg(&stream)
            .arg("*")
            .arg("order")
            .arg(format!("o-{i}"))
            .query_async(&mut r)
            .await
            .unwrap();
    }
    wait_intake(&s, N).await;
    // Restart Redis: it keeps nothing on disk, so the stream and its group are gone; the
    // application creates its group again on start, as it did the first time.
    let _ = Command::new("redis-cli")
        .args(["shutdown", "nosave"])
        .output();
    let started = Command::new("sh").args(["-c", REDIS_START]).output();
    assert!(
        started.is_ok_and(|o| o.status.success()),
        "redis-server did not start"
    );
    create_group(stream.clone()).await;
    all_acked_once(&s, &queue, &seen, N, "o", "redis restart test").await;
    s.stop().await;
    if let Some(mut c) = redis_conn().await {
        let _: Result<i64, _> = redis::cmd("DEL").arg(&stream).query_async(&mut c).await;
    }
}
