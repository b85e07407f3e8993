//! The RabbitMQ bridge against the RabbitMQ of this machine (127.0.0.1:5672, guest/guest):
//! a consumer that rejects (`requeue = false`) gets its messages back through redrive,
//! with backoff, until it acks them; an exhausted one ends dead in redrive and on the dead
//! exchange. Each run uses its own names. Skipped when RabbitMQ is down, except under
//! `CI=true` (then it fails).

use crate::harness::*;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicRejectOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// 4 attempts, 100 ms apart.
const RETRY_4_FAST: &str = r#"
max_attempts = 4
backoff = "fixed"
initial_delay = "100ms"
jitter = "none"
"#;

/// Nothing comes back during a test: the first retry is an hour away.
const RETRY_HOLD: &str = r#"
max_attempts = 5
backoff = "fixed"
initial_delay = "1h"
jitter = "none"
"#;

async fn rabbit() -> Option<Connection> {
    match Connection::connect(URL, ConnectionProperties::default()).await {
        Ok(c) => Some(c),
        Err(e) => {
            assert!(
                std::env::var("CI").is_err(),
                "RabbitMQ is not reachable at {URL} under CI: {e}"
            );
            eprintln!("skipped: RabbitMQ is not reachable at {URL}: {e}");
            None
        }
    }
}

/// One delivery the consumer saw.
#[derive(Debug, Clone)]
struct Seen {
    body: String,
    retry_count: Option<i64>,
    content_type: Option<String>,
    tenant: Option<String>,
    acked: bool,
}

fn header_i64(props: &BasicProperties, key: &str) -> Option<i64> {
    match props.headers().as_ref()?.inner().get(key)? {
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        _ => None,
    }
}

fn header_str(props: &BasicProperties, key: &str) -> Option<String> {
    match props.headers().as_ref()?.inner().get(key)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        _ => None,
    }
}

/// The work queue's consumer, unchanged by the bridge: rejects (no requeue) the first
/// `fail_first` deliveries of each message id (all of them for ids starting with
/// `doomed`), acks the next.
async fn consumer(
    channel: Channel,
    queue: String,
    fail_first: usize,
    seen: Arc<Mutex<HashMap<String, Vec<Seen>>>>,
) {
    let mut c = channel
        .basic_consume(
            &queue,
            "php-like",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    while let Some(Ok(d)) = c.next().await {
        let id = d
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str().to_owned())
            .unwrap_or_default();
        let before = seen.lock().unwrap().get(&id).map_or(0, Vec::len);
        let ack = !id.starts_with("doomed") && before >= fail_first;
        seen.lock().unwrap().entry(id).or_default().push(Seen {
            body: String::from_utf8_lossy(&d.data).into_owned(),
            retry_count: header_i64(&d.properties, "x-retry-count"),
            content_type: d
                .properties
                .content_type()
                .as_ref()
                .map(|s| s.as_str().to_owned()),
            tenant: header_str(&d.properties, "tenant"),
            acked: ack,
        });
        if ack {
            d.acker.ack(BasicAckOptions::default()).await.unwrap();
        } else {
            d.acker
                .reject(BasicRejectOptions { requeue: false })
                .await
                .unwrap();
        }
    }
}

/// The names of one run: the consumers' exchange and queue (dead-lettering into `dlx`),
/// the bridge's intake queue, the dead exchange and a queue bound to it, the redrive queue.
struct Topology {
    work_x: String,
    work_q: String,
    dlx: String,
    intake: String,
    dead_x: String,
    dead_q: String,
    queue: String,
}

impl Topology {
    /// Declare what a user already has, plus the one change the bridge asks for: the work
    /// queue's `x-dead-letter-exchange`.
    async fn declare(admin: &Channel) -> Topology {
        let run = format!("{:08x}", rand_u32());
        let t = Topology {
            work_x: format!("rt.work.{run}"),
            work_q: format!("rt.work.{run}"),
            dlx: format!("rt.dlx.{run}"),
            intake: format!("rt.intake.{run}"),
            dead_x: format!("rt.dead.{run}"),
            dead_q: format!("rt.dead.{run}"),
            queue: format!("rtq-{run}"),
        };
        for (x, kind) in [
            (&t.work_x, ExchangeKind::Direct),
            (&t.dlx, ExchangeKind::Fanout),
            (&t.dead_x, ExchangeKind::Fanout),
        ] {
            admin
                .exchange_declare(
                    x,
                    kind,
                    ExchangeDeclareOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        }
        let mut args = FieldTable::default();
        args.insert(
            ShortString::from("x-dead-letter-exchange"),
            AMQPValue::LongString(LongString::from(t.dlx.clone().into_bytes())),
        );
        admin
            .queue_declare(&t.work_q, QueueDeclareOptions::default(), args)
            .await
            .unwrap();
        admin
            .queue_bind(
                &t.work_q,
                &t.work_x,
                "job",
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        admin
            .queue_declare(
                &t.dead_q,
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        admin
            .queue_bind(
                &t.dead_q,
                &t.dead_x,
                "",
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        t
    }

    /// A server with the bridge (4 attempts, 100 ms apart), connected.
    async fn server(&self) -> TestServer {
        self.server_with("", RETRY_4_FAST).await
    }

    /// A server with the bridge, connected: `top` holds top-level config keys, `retry` the
    /// redrive queue's `[retry]` keys.
    async fn server_with(&self, top: &str, retry: &str) -> TestServer {
        let s = TestServer::start(&self.config(top, retry)).await;
        connected(&s).await;
        s
    }

    /// The configuration of a server with the bridge: `top` holds top-level config keys,
    /// `retry` the redrive queue's `[retry]` keys.
    fn config(&self, top: &str, retry: &str) -> String {
        let Topology {
            intake,
            queue,
            dlx,
            dead_x,
            ..
        } = self;
        format!(
            r#"
{top}
[bridges.rabbitmq.orders]
url = "{URL}"
intake_queue = "{intake}"
queue = "{queue}"
dead_letter_exchange = "{dlx}"
dead_exchange = "{dead_x}"
[queues."{queue}".retry]
{retry}
"#
        )
    }

    /// Publish 10 messages `m-0` … `m-9` and one `doomed-1`, with a content type and a
    /// header, as the application does.
    async fn publish(&self, publisher: &Channel) -> Vec<String> {
        let mut ids: Vec<String> = (0..10).map(|i| format!("m-{i}")).collect();
        ids.push("doomed-1".to_owned());
        for id in &ids {
            let mut headers = FieldTable::default();
            headers.insert(
                ShortString::from("tenant"),
                AMQPValue::LongString(LongString::from(b"t1".to_vec())),
            );
            let props = BasicProperties::default()
                .with_message_id(ShortString::from(id.clone()))
                .with_content_type(ShortString::from("text/plain"))
                .with_headers(headers);
            publisher
                .basic_publish(
                    &self.work_x,
                    "job",
                    BasicPublishOptions::default(),
                    format!("body of {id}").as_bytes(),
                    props,
                )
                .await
                .unwrap()
                .await
                .unwrap();
        }
        ids
    }

    /// Check what the consumer saw and what redrive and the dead exchange hold.
    async fn check(&self, s: &TestServer, admin: &Channel, seen: &HashMap<String, Vec<Seen>>) {
        for i in 0..10 {
            let id = format!("m-{i}");
            let d = &seen[&id];
            assert_eq!(d.len(), 3, "{id}: {d:?}");
            assert_eq!(d.iter().filter(|x| x.acked).count(), 1, "{id}");
            let retry_counts: Vec<_> = d.iter().map(|x| x.retry_count).collect();
            assert_eq!(retry_counts, vec![None, Some(1), Some(2)], "{id}");
            for x in d {
                assert_eq!(x.body, format!("body of {id}"), "{id}: the body changed");
                assert_eq!(x.content_type.as_deref(), Some("text/plain"), "{id}");
                assert_eq!(x.tenant.as_deref(), Some("t1"), "{id}: a header was lost");
            }
        }
        // The doomed one: 4 deliveries (max_attempts), then dead, with every attempt in its
        // history, and on the dead exchange.
        assert_eq!(seen["doomed-1"].len(), 4, "{:?}", seen["doomed-1"]);
        let dead = first_dead(s, &self.queue).await;
        assert_eq!(dead["dead_reason"], "max_attempts", "{dead}");
        let full = s.message(dead["id"].as_str().unwrap()).await;
        let failed = failed_attempts(&full);
        assert_eq!(failed, 4, "{full}");
        assert_eq!(full["payload"], json!("body of doomed-1"));
        let got = loop {
            if let Some(m) = admin
                .basic_get(
                    &self.dead_q,
                    lapin::options::BasicGetOptions { no_ack: true },
                )
                .await
                .unwrap()
            {
                break m;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(
            String::from_utf8_lossy(&got.delivery.data),
            "body of doomed-1"
        );
        assert_eq!(
            header_str(&got.delivery.properties, "x-redrive-dead-reason").as_deref(),
            Some("max_attempts")
        );
        // Redrive holds them all: 10 done, 1 dead, nothing leased.
        let (_, q) = s.get(&format!("/v1/queues/{}", self.queue)).await;
        assert_eq!(q["counts"]["done"], 10, "{q}");
        assert_eq!(q["counts"]["dead"], 1, "{q}");
        let (_, b) = s.get("/v1/bridges").await;
        let b = &b["bridges"][0];
        assert_eq!(b["intake"], 11, "{b}");
        assert_eq!(b["returned"], 10 + 3, "{b}");
        assert_eq!(b["dead"], 1, "{b}");
        let metrics = s.get_text("/metrics").await.1;
        assert!(
            metrics.contains("redrive_bridge_events{bridge=\"orders\",event=\"returned\"} 13"),
            "{metrics}"
        );
        assert!(
            metrics.contains("redrive_bridge_connected{bridge=\"orders\"} 1"),
            "{metrics}"
        );
    }

    async fn delete(&self, admin: &Channel) {
        for q in [&self.work_q, &self.dead_q, &self.intake] {
            let _ = admin
                .queue_delete(q, lapin::options::QueueDeleteOptions::default())
                .await;
        }
        for x in [&self.work_x, &self.dlx, &self.dead_x] {
            let _ = admin
                .exchange_delete(x, lapin::options::ExchangeDeleteOptions::default())
                .await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejecting_consumer_gets_its_messages_back_until_it_acks_and_the_exhausted_die() {
    let Some(conn) = rabbit().await else { return };
    let admin = conn.create_channel().await.unwrap();
    let t = Topology::declare(&admin).await;
    let s = t.server().await;
    let seen: Arc<Mutex<HashMap<String, Vec<Seen>>>> = Arc::default();
    let consume = conn.create_channel().await.unwrap();
    tokio::spawn(consumer(consume, t.work_q.clone(), 2, seen.clone()));
    t.publish(&conn.create_channel().await.unwrap()).await;
    // 10 × 3 deliveries, and 4 of the doomed one.
    for tries in 0.. {
        let n: usize = seen.lock().unwrap().values().map(Vec::len).sum();
        if n >= 34 {
            break;
        }
        assert!(
            tries < 1_500,
            "only {n} deliveries: {:?}",
            seen.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let snapshot = seen.lock().unwrap().clone();
    t.check(&s, &admin, &snapshot).await;
    // The bridge is the queue's only consumer.
    let got = s
        .post(&format!("/v1/queues/{}/leases", t.queue), json!({}))
        .await;
    assert_error(&got, 409, "bridge_queue");
    s.stop().await;
    t.delete(&admin).await;
}

/// The same with the seeds' own tool: an unchanged php-amqplib consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_php_consumer_gets_retries_and_dead_letters() {
    if !crate::harness::php_has(
        "require_once 'PhpAmqpLib/autoload.php'; echo 'ok';",
        "php-cli with php-amqplib (Debian: php-cli php-amqplib)",
    ) {
        return;
    }
    let Some(conn) = rabbit().await else { return };
    let admin = conn.create_channel().await.unwrap();
    let t = Topology::declare(&admin).await;
    let s = t.server().await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/php/amqp_consumer.php"
    );
    let consumer = tokio::process::Command::new("php")
        .args([script, &t.work_q, "2", "34"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the PHP consumer");
    t.publish(&conn.create_channel().await.unwrap()).await;
    let out = tokio::time::timeout(Duration::from_secs(60), consumer.wait_with_output())
        .await
        .expect("the PHP consumer did not see its 34 deliveries in 60 s")
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut seen: HashMap<String, Vec<Seen>> = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect(line);
        seen.entry(v["id"].as_str().unwrap().to_owned())
            .or_default()
            .push(Seen {
                body: v["body"].as_str().unwrap().to_owned(),
                retry_count: v["retry_count"].as_i64(),
                content_type: v["content_type"].as_str().map(str::to_owned),
                tenant: v["tenant"].as_str().map(str::to_owned),
                acked: v["acked"].as_bool().unwrap(),
            });
    }
    t.check(&s, &admin, &seen).await;
    s.stop().await;
    t.delete(&admin).await;
}

/// How many failed attempts a message's history holds.
fn failed_attempts(message: &serde_json::Value) -> usize {
    message["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["event"] == "failed")
        .count()
}

/// Wait (at most 10 s) until the server's first bridge is connected.
async fn connected(s: &TestServer) {
    for _ in 0..500 {
        let (_, b) = s.get("/v1/bridges").await;
        if b["bridges"][0]["state"] == "connected" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first dead message of `queue`, once there is one (at most 60 s).
async fn first_dead(s: &TestServer, queue: &str) -> serde_json::Value {
    for _ in 0..3_000 {
        let (_, page) = s
            .get(&format!("/v1/messages?queue={queue}&state=dead"))
            .await;
        if page["messages"].as_array().is_some_and(|m| !m.is_empty()) {
            return page["messages"][0].clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, page) = s.get(&format!("/v1/messages?queue={queue}")).await;
    let states: Vec<_> = page["messages"]
        .as_array()
        .map(|m| m.iter().map(|m| m["state"].clone()).collect())
        .unwrap_or_default();
    panic!("no dead message in {queue} after 60 s; its messages are {states:?}");
}

fn rand_u32() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    t.subsec_nanos() ^ std::process::id()
}

const REDIS: &str = "redis://127.0.0.1:6379";

async fn redis_conn() -> Option<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(REDIS).ok()?;
    match client.get_multiplexed_tokio_connection().await {
        Ok(c) => Some(c),
        Err(e) => {
            assert!(
                std::env::var("CI").is_err(),
                "Redis is not reachable at {REDIS} under CI: {e}"
            );
            eprintln!("skipped: Redis is not reachable: {e}");
            None
        }
    }
}

/// `XGROUP CREATE stream workers $ MKSTREAM`.
async fn create_group(r: &mut redis::aio::MultiplexedConnection, stream: &str) {
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg("workers")
        .arg("$")
        .arg("MKSTREAM")
        .query_async(r)
        .await
        .unwrap();
}

async fn redis_server(stream: &str, queue: &str) -> TestServer {
    TestServer::start(&redis_config(stream, queue)).await
}

/// A server with a Redis Streams bridge of `stream` (group `workers`, idle 200 ms) into
/// `queue` (4 attempts, 100 ms apart).
fn redis_config(stream: &str, queue: &str) -> String {
    format!(
        r#"
[bridges.redis_streams.payments]
url = "{REDIS}"
stream = "{stream}"
group = "workers"
min_idle = "200ms"
queue = "{queue}"
[queues."{queue}".retry]
max_attempts = 4
backoff = "fixed"
initial_delay = "100ms"
jitter = "none"
"#
    )
}

/// Read what is new in `stream` as consumer `w1` of group `workers` (waiting at most
/// 100 ms), ack it in the group, and answer how many entries that was.
async fn read_and_ack(r: &mut redis::aio::MultiplexedConnection, stream: &str) -> usize {
    let entries = read_group(r, stream).await;
    for (id, _) in &entries {
        let _: i64 = redis::cmd("XACK")
            .arg(stream)
            .arg("workers")
            .arg(id)
            .query_async(r)
            .await
            .unwrap();
    }
    entries.len()
}

/// Issue 17, for Redis Streams: a store fault while acking a republished copy keeps the
/// connection (`connects` stays 1); the message stays leased and is added to the stream
/// again once its lease expires (moved on the injected clock), then acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_fault_while_acking_a_redis_copy_keeps_the_connection_and_the_copy_comes_again() {
    let Some(mut r) = redis_conn().await else {
        return;
    };
    let run = format!("{:08x}", rand_u32());
    let (stream, queue) = (format!("rs.fault.{run}"), format!("rsq-fault-{run}"));
    create_group(&mut r, &stream).await;
    let clock = Arc::new(redrive_server::engine::ManualClock::new(
        redrive_core::Timestamp::now(),
    ));
    let (s, store) =
        TestServer::start_with_faulty_store(&redis_config(&stream, &queue), clock.clone()).await;
    connected(&s).await;
    let mut signals = s.engine.signals().subscribe();
    store.fail_acks(1);
    let entry: Vec<(&[u8], &[u8])> = vec![(b"order", b"o-1")];
    xadd(&mut r, &stream, &entry).await;
    // Read and left unacked: the bridge claims it once idle 200 ms.
    assert_eq!(read_group(&mut r, &stream).await.len(), 1);
    // Due 100 ms (on the clock) after it was taken in: added to the stream, its ack fails.
    // Every copy is read and acked in the group.
    let mut seen = 0;
    for _ in 0..400 {
        seen += read_and_ack(&mut r, &stream).await;
        if store.acks_failed() == 1 && seen == 1 {
            break;
        }
        clock.advance(50);
    }
    assert_eq!(store.acks_failed(), 1, "the ack of the copy never ran");
    assert_eq!(seen, 1, "the copy reached the group");
    crate::harness::ack_fault_reported(&mut signals, &queue).await;
    let m = &messages_of(&s, &queue).await[0];
    assert_eq!(m["state"], "leased", "its ack was lost: {m}");
    let (_, b) = s.get("/v1/bridges").await;
    let b = &b["bridges"][0];
    assert_eq!(b["state"], "connected", "{b}");
    assert_eq!(b["connects"], 1, "a store fault reconnected: {b}");
    // The lease (60 s) expires: retried 100 ms later, added to the stream again.
    clock.advance(60_001);
    for _ in 0..400 {
        seen += read_and_ack(&mut r, &stream).await;
        if seen == 2 {
            break;
        }
        clock.advance(50);
    }
    assert_eq!(
        seen, 2,
        "the message was not delivered again after its lease"
    );
    let id = m["id"].as_str().unwrap().to_owned();
    let full = s.done_message(&id).await;
    assert!(
        full["history"].to_string().contains("lease_expired"),
        "the lost ack shows as an expired lease: {full}"
    );
    let (_, b) = s.get("/v1/bridges").await;
    let b = &b["bridges"][0];
    assert_eq!(b["connects"], 1, "{b}");
    assert_eq!(b["republished"], 2, "{b}");
    s.stop().await;
    let _: i64 = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut r)
        .await
        .unwrap();
}

/// The Redis Streams bridge with the seeds' other tool: an unchanged php-redis consumer that
/// leaves the first 2 reads of each order unacked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_php_redis_consumer_gets_retries_and_dead_letters() {
    if !crate::harness::php_has(
        "echo class_exists('Redis') ? 'ok' : 'no';",
        "php-cli with php-redis (Debian: php-cli php-redis)",
    ) {
        return;
    }
    let Some(mut r) = redis_conn().await else {
        return;
    };
    let run = format!("{:08x}", rand_u32());
    let (stream, queue) = (format!("rs.{run}"), format!("rsq-{run}"));
    create_group(&mut r, &stream).await;
    let s = redis_server(&stream, &queue).await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/php/redis_consumer.php"
    );
    let consumer = tokio::process::Command::new("php")
        .args([script, &stream, "workers", "2", "34"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the PHP consumer");
    let mut orders: Vec<String> = (0..10).map(|i| format!("m-{i}")).collect();
    orders.push("doomed-1".to_owned());
    for (i, o) in orders.iter().enumerate() {
        let _: String = redis::cmd("XADD")
            .arg(&stream)
            .arg("*")
            .arg("order")
            .arg(o)
            .arg("amount")
            .arg(i * 100)
            .query_async(&mut r)
            .await
            .unwrap();
    }
    let out = tokio::time::timeout(Duration::from_secs(60), consumer.wait_with_output())
        .await
        .expect("the PHP consumer did not see its 34 reads in 60 s")
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut reads: HashMap<String, Vec<serde_json::Value>> = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect(line);
        reads
            .entry(v["id"].as_str().unwrap().to_owned())
            .or_default()
            .push(v);
    }
    for (i, o) in orders.iter().take(10).enumerate() {
        let rs = &reads[o];
        assert_eq!(rs.len(), 3, "{o}: {rs:?}");
        assert_eq!(rs.iter().filter(|v| v["acked"] == true).count(), 1, "{o}");
        let counts: Vec<_> = rs
            .iter()
            .map(|v| {
                v["fields"]["redrive-retry-count"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect();
        assert_eq!(
            counts,
            vec![None, Some("1".to_owned()), Some("2".to_owned())],
            "{o}"
        );
        for v in rs {
            assert_eq!(
                v["fields"]["amount"],
                (i * 100).to_string(),
                "{o}: a field changed"
            );
        }
    }
    assert_eq!(reads["doomed-1"].len(), 4, "{:?}", reads["doomed-1"]);
    // Dead in redrive with every attempt, and on <stream>:dead.
    let dead = first_dead(&s, &queue).await;
    assert_eq!(dead["dead_reason"], "max_attempts", "{dead}");
    let full = s.message(dead["id"].as_str().unwrap()).await;
    let failed = failed_attempts(&full);
    assert_eq!(failed, 4, "{full}");
    assert_eq!(full["payload"]["order"], "doomed-1", "{full}");
    let dead_len: i64 = loop {
        let n: i64 = redis::cmd("XLEN")
            .arg(format!("{stream}:dead"))
            .query_async(&mut r)
            .await
            .unwrap();
        if n > 0 {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(dead_len, 1);
    let (_, q) = s.get(&format!("/v1/queues/{queue}")).await;
    assert_eq!(q["counts"]["done"], 10, "{q}");
    assert_eq!(q["counts"]["dead"], 1, "{q}");
    let (_, b) = s.get("/v1/bridges").await;
    let b = &b["bridges"][0];
    assert_eq!(b["kind"], "redis_streams", "{b}");
    assert_eq!(b["intake"], 11, "{b}");
    assert_eq!(b["returned"], 10 + 3, "{b}");
    s.stop().await;
    let _: i64 = redis::cmd("DEL")
        .arg(&stream)
        .arg(format!("{stream}:dead"))
        .query_async(&mut r)
        .await
        .unwrap();
}

/// A stream without the group (or one deleted later) is reported and retried, not fatal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_group_is_reported_and_the_bridge_connects_once_it_exists() {
    let Some(mut r) = redis_conn().await else {
        return;
    };
    let run = format!("{:08x}", rand_u32());
    let (stream, queue) = (format!("rs.nogroup.{run}"), format!("rsq-ng-{run}"));
    let s = redis_server(&stream, &queue).await;
    let bridge = loop {
        let (_, b) = s.get("/v1/bridges").await;
        let b = b["bridges"][0].clone();
        if b["state"] == "reconnecting" {
            break b;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        bridge["last_error"].as_str().unwrap().contains("NOGROUP"),
        "{bridge}"
    );
    create_group(&mut r, &stream).await;
    for tries in 0.. {
        let (_, b) = s.get("/v1/bridges").await;
        if b["bridges"][0]["state"] == "connected" {
            break;
        }
        assert!(tries < 1_000, "never connected: {b}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.stop().await;
    let _: i64 = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut r)
        .await
        .unwrap();
}

/// A message another retry mechanism already counted (`x-retry-count`) keeps its count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_arrives_counted_keeps_its_count() {
    let Some(conn) = rabbit().await else { return };
    let admin = conn.create_channel().await.unwrap();
    let t = Topology::declare(&admin).await;
    let s = t.server().await;
    let seen: Arc<Mutex<HashMap<String, Vec<Seen>>>> = Arc::default();
    tokio::spawn(consumer(
        conn.create_channel().await.unwrap(),
        t.work_q.clone(),
        2,
        seen.clone(),
    ));
    // Seed 001's ladder already retried it 3 times; the queue allows 4 attempts in all.
    let mut headers = FieldTable::default();
    headers.insert(
        ShortString::from("x-retry-count"),
        AMQPValue::LongLongInt(3),
    );
    let props = BasicProperties::default()
        .with_message_id(ShortString::from("counted-1"))
        .with_headers(headers);
    conn.create_channel()
        .await
        .unwrap()
        .basic_publish(
            &t.work_x,
            "job",
            BasicPublishOptions::default(),
            b"late",
            props,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let dead = first_dead(&s, &t.queue).await;
    assert_eq!(dead["dead_reason"], "max_attempts", "{dead}");
    let full = s.message(dead["id"].as_str().unwrap()).await;
    assert_eq!(full["attempts"], 4, "{full}");
    assert_eq!(full["history"][0]["attempt"], 4, "{full}");
    assert_eq!(
        seen.lock().unwrap()["counted-1"].len(),
        1,
        "it was delivered again"
    );
    s.stop().await;
    t.delete(&admin).await;
}

/// Issue 17: a store fault while settling a republish is the store's, not the broker's.
/// The ack of a confirmed copy fails (the store answers `Unavailable`): the bridge keeps its
/// connection (no reconnect, `connects` stays 1), the message stays leased, and once its
/// lease expires (moved on the injected clock) it is republished again (at least once)
/// and then acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_fault_while_acking_a_republish_keeps_the_connection_and_the_copy_comes_again() {
    let Some(conn) = rabbit().await else { return };
    let FaultyBridge {
        admin,
        t,
        clock,
        s,
        store,
        seen,
    } = FaultyBridge::start(&conn).await;
    let mut signals = s.engine.signals().subscribe();
    store.fail_acks(1);
    let publisher = conn.create_channel().await.unwrap();
    let props = BasicProperties::default().with_message_id(ShortString::from("m-1"));
    publish_raw(&t, &publisher, b"once", props).await;
    wait_bridge(&s, "the intake", |b| b["intake"] == 1).await;
    let copies = || seen.lock().unwrap().get("m-1").map_or(0, Vec::len);
    // Due 100 ms after the rejection: republished, confirmed, and its ack fails.
    for _ in 0..400 {
        if store.acks_failed() == 1 && copies() == 2 {
            break;
        }
        clock.advance(50);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(store.acks_failed(), 1, "the ack of the republish never ran");
    crate::harness::ack_fault_reported(&mut signals, &t.queue).await;
    assert_eq!(copies(), 2, "the copy reached the consumer");
    let m = &messages_of(&s, &t.queue).await[0];
    assert_eq!(m["state"], "leased", "its ack was lost: {m}");
    let (_, b) = s.get("/v1/bridges").await;
    let b = &b["bridges"][0];
    assert_eq!(b["state"], "connected", "{b}");
    assert_eq!(
        b["connects"], 1,
        "a store fault reconnected the broker: {b}"
    );
    assert_eq!(b["republished"], 1, "{b}");
    // The lease (60 s) expires: a failed attempt, retried 100 ms later: republished again.
    clock.advance(60_001);
    for _ in 0..400 {
        if copies() == 3 {
            break;
        }
        clock.advance(50);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        copies(),
        3,
        "the message was not delivered again after its lease"
    );
    let id = m["id"].as_str().unwrap().to_owned();
    let full = s.done_message(&id).await;
    let events: Vec<&str> = full["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["event"].as_str())
        .collect();
    assert!(
        events.contains(&"republished"),
        "the second copy was acked as republished: {full}"
    );
    assert!(
        full["history"].to_string().contains("lease_expired"),
        "the lost ack shows as an expired lease: {full}"
    );
    let (_, b) = s.get("/v1/bridges").await;
    let b = &b["bridges"][0];
    assert_eq!(b["connects"], 1, "{b}");
    assert_eq!(b["republished"], 2, "{b}");
    store_faults_counted(&s, &t.queue, "ack").await;
    s.stop().await;
    t.delete(&admin).await;
}

/// Issue 17: a store fault while storing an intake delivery is the store's, not the
/// broker's: the delivery is requeued, the connection kept (`connects` stays 1), the fault
/// counted (`operation="intake"`), and the redelivery is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_fault_while_storing_an_intake_delivery_keeps_the_connection_and_stores_it_once() {
    let Some(conn) = rabbit().await else { return };
    let FaultyBridge {
        admin, t, s, store, ..
    } = FaultyBridge::start(&conn).await;
    store.fail_publishes(1);
    let publisher = conn.create_channel().await.unwrap();
    let props = BasicProperties::default().with_message_id(ShortString::from("m-1"));
    publish_raw(&t, &publisher, b"stored once", props).await;
    wait_bridge(&s, "the intake after the fault", |b| b["intake"] == 1).await;
    assert_eq!(store.publishes_failed(), 1, "the store fault was injected");
    let messages = messages_of(&s, &t.queue).await;
    assert_eq!(messages.len(), 1, "stored once: {messages:?}");
    let (_, b) = s.get("/v1/bridges").await;
    let b = &b["bridges"][0];
    assert_eq!(b["state"], "connected", "{b}");
    assert_eq!(
        b["connects"], 1,
        "a store fault reconnected the broker: {b}"
    );
    assert_eq!(b["duplicates"], 0, "{b}");
    store_faults_counted(&s, &t.queue, "intake").await;
    s.stop().await;
    t.delete(&admin).await;
}

/// A bridge on a store that fails on demand, on an injected clock, connected; with a
/// work-queue consumer that rejects each message's first delivery (RabbitMQ dead-letters it
/// to the intake) and acks its copies, recording what it got.
struct FaultyBridge {
    admin: Channel,
    t: Topology,
    clock: Arc<redrive_server::engine::ManualClock>,
    s: TestServer,
    store: Arc<redrive_server::testing::FaultyStore>,
    seen: Arc<Mutex<HashMap<String, Vec<Raw>>>>,
}

impl FaultyBridge {
    async fn start(conn: &Connection) -> Self {
        let admin = conn.create_channel().await.unwrap();
        let t = Topology::declare(&admin).await;
        let clock = Arc::new(redrive_server::engine::ManualClock::new(
            redrive_core::Timestamp::now(),
        ));
        let (s, store) =
            TestServer::start_with_faulty_store(&t.config("", RETRY_4_FAST), clock.clone()).await;
        connected(&s).await;
        let seen: Arc<Mutex<HashMap<String, Vec<Raw>>>> = Arc::default();
        tokio::spawn(recorder(
            conn.create_channel().await.unwrap(),
            t.work_q.clone(),
            Some(1),
            seen.clone(),
        ));
        Self {
            admin,
            t,
            clock,
            s,
            store,
            seen,
        }
    }
}

/// The server counted one store fault of `operation` on `queue`'s consumer.
async fn store_faults_counted(s: &TestServer, queue: &str, operation: &str) {
    let metrics = s.get_text("/metrics").await.1;
    let line = format!(
        "redrive_consume_store_faults_total{{queue=\"{queue}\",operation=\"{operation}\"}} 1"
    );
    assert!(metrics.contains(&line), "{line} not in:\n{metrics}");
}

// ---- issue 15: intake deduplication, size limits, readable and exact messages ----

/// One delivery as the work queue's consumer saw it.
#[derive(Debug, Clone)]
struct Raw {
    body: Vec<u8>,
    props: BasicProperties,
}

/// A work-queue consumer that keeps every delivery and acks a message (by `message_id`)
/// once `ack_after` deliveries of it were rejected (`requeue = false`); `None`: rejects all.
async fn recorder(
    channel: Channel,
    queue: String,
    ack_after: Option<usize>,
    seen: Arc<Mutex<HashMap<String, Vec<Raw>>>>,
) {
    let mut c = channel
        .basic_consume(
            &queue,
            "recorder",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    while let Some(Ok(d)) = c.next().await {
        let id = d
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str().to_owned())
            .unwrap_or_default();
        let before = seen.lock().unwrap().get(&id).map_or(0, Vec::len);
        let ack = !id.starts_with("doomed") && ack_after.is_some_and(|n| before >= n);
        seen.lock().unwrap().entry(id).or_default().push(Raw {
            body: d.data.clone(),
            props: d.properties.clone(),
        });
        if ack {
            d.acker.ack(BasicAckOptions::default()).await.unwrap();
        } else {
            d.acker
                .reject(BasicRejectOptions { requeue: false })
                .await
                .unwrap();
        }
    }
}

/// Publish `body` to the work queue (`message_id` when given, and these properties).
async fn publish_raw(t: &Topology, ch: &Channel, body: &[u8], props: BasicProperties) {
    ch.basic_publish(
        &t.work_x,
        "job",
        BasicPublishOptions::default(),
        body,
        props,
    )
    .await
    .unwrap()
    .await
    .unwrap();
}

/// Wait (at most 30 s) until `done` holds for the bridge as `GET /v1/bridges` shows it.
async fn wait_bridge(s: &TestServer, what: &str, done: impl Fn(&serde_json::Value) -> bool) {
    for _ in 0..1_500 {
        let (_, b) = s.get("/v1/bridges").await;
        if done(&b["bridges"][0]) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, b) = s.get("/v1/bridges").await;
    panic!("the bridge never got to {what}: {b}");
}

/// Every message of `queue` (newest first).
async fn messages_of(s: &TestServer, queue: &str) -> Vec<serde_json::Value> {
    let (_, page) = s
        .get(&format!("/v1/messages?queue={queue}&limit=100"))
        .await;
    page["messages"].as_array().unwrap().clone()
}

/// Issue 15, defect 1: two rejections of equal bodies are two messages, whether RabbitMQ
/// dead-lettered them in the same second (then even their `x-death` is equal) or a second
/// apart. Before, the second was acked to RabbitMQ as a "duplicate" and never stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_bodies_rejected_apart_are_different_messages() {
    let Some(conn) = rabbit().await else { return };
    let admin = conn.create_channel().await.unwrap();
    let t = Topology::declare(&admin).await;
    let s = t.server_with("", RETRY_HOLD).await;
    let seen: Arc<Mutex<HashMap<String, Vec<Raw>>>> = Arc::default();
    tokio::spawn(recorder(
        conn.create_channel().await.unwrap(),
        t.work_q.clone(),
        None,
        seen.clone(),
    ));
    let publisher = conn.create_channel().await.unwrap();
    let body = br#"{"user": 7, "action": "refresh"}"#;
    for _ in 0..3 {
        publish_raw(&t, &publisher, body, BasicProperties::default()).await;
    }
    let taken = |n: u64| {
        move |b: &serde_json::Value| {
            b["intake"].as_u64().unwrap() + b["duplicates"].as_u64().unwrap() >= n
        }
    };
    wait_bridge(&s, "3 deliveries handled", taken(3)).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    publish_raw(&t, &publisher, body, BasicProperties::default()).await;
    wait_bridge(&s, "4 deliveries handled", taken(4)).await;
    let (_, b) = s.get("/v1/bridges").await;
    assert_eq!(b["bridges"][0]["intake"], 4, "{b}");
    assert_eq!(b["bridges"][0]["duplicates"], 0, "{b}");
    let stored = messages_of(&s, &t.queue).await;
    assert_eq!(stored.len(), 4, "{stored:?}");
    for m in &stored {
        assert_eq!(m["state"], "scheduled", "{m}");
    }
    s.stop().await;
    t.delete(&admin).await;
}

/// Issue 15, defect 1: a `message_id` reused by a later, distinct rejection (the same id,
/// the same or another body) is a new message, not a replay of the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_message_id_from_another_rejection_is_a_new_message() {
    let Some(conn) = rabbit().await else { return };
    let admin = conn.create_channel().await.unwrap();
    let t = Topology::declare(&admin).await;
    let s = t.server_with("", RETRY_HOLD).await;
    let seen: Arc<Mutex<HashMap<String, Vec<Raw>>>> = Arc::default();
    tokio::spawn(recorder(
        conn.create_channel().await.unwrap(),
        t.work_q.clone(),
        None,
        seen.clone(),
    ));
    let publisher = conn.create_channel().await.unwrap();
    let props = || BasicProperties::default().with_message_id(ShortString::from("order-42"));
    publish_raw(&t, &publisher, b"charge 42", props()).await;
    wait_bridge(&s, "1 delivery handled", |b| {
        b["intake"] == 1 || b["duplicates"] == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    publish_raw(&t, &publisher, b"charge 42", props()).await;
    publish_raw(&t, &publisher, b"refund 42", props()).await;
    wait_bridge(&s, "3 deliveries handled", |b| {
        b["intake"].as_u64().unwrap() + b["duplicates"].as_u64().unwrap() >= 3
    })
    .await;
    let stored = messages_of(&s, &t.queue).await;
    let mut bodies: Vec<&str> = stored
        .iter()
        .map(|m| m["payload"].as_str().unwrap())
        .collect();
    bodies.sort_unstable();
    assert_eq!(
        bodies,
        vec!["charge 42", "charge 42", "refund 42"],
        "{stored:?}"
    );
    let (_, b) = s.get("/v1/bridges").await;
    assert_eq!(b["bridges"][0]["duplicates"], 0, "{b}");
    s.stop().await;
    t.delete(&admin).await;
}

/// Issue 15, defect 1: the one duplicate that deduplication is for. The bridge stores a
/// batch, then its connection drops before the ack (a test hook at exactly that point, as
/// a crash there would): RabbitMQ delivers the batch again (`redelivered`), each delivery
/// matches one intake marker and is acked without being stored again, equal bodies
/// included. Afterwards no marker is left and the intake queue is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_storing_and_acking_stores_each_message_once() {
    let Some(conn) = rabbit().await else { return };
    let admin = conn.create_channel().await.unwrap();
    let t = Topology::declare(&admin).await;
    let s = t.server_with("", RETRY_HOLD).await;
    assert!(s.engine.bridges().drop_connection_before_next_ack("orders"));
    let seen: Arc<Mutex<HashMap<String, Vec<Raw>>>> = Arc::default();
    tokio::spawn(recorder(
        conn.create_channel().await.unwrap(),
        t.work_q.clone(),
        None,
        seen.clone(),
    ));
    let publisher = conn.create_channel().await.unwrap();
    let same = br#"{"user": 7, "action": "refresh"}"#;
    publish_raw(&t, &publisher, same, BasicProperties::default()).await;
    publish_raw(&t, &publisher, same, BasicProperties::default()).await;
    for i in 0..3 {
        let props = BasicProperties::default().with_message_id(ShortString::from(format!("c-{i}")));
        publish_raw(&t, &publisher, format!("crash {i}").as_bytes(), props).await;
    }
    // The dropped batch comes back redelivered after the reconnect (1 s).
    wait_bridge(&s, "a reconnect and 5 messages", |b| {
        b["connects"].as_u64().unwrap() >= 2
            && b["duplicates"].as_u64().unwrap() >= 1
            && b["intake"] == 5
    })
    .await;
    // Every delivery handled: the redelivered ones as duplicates, the others stored.
    for _ in 0..250 {
        if intake_markers(&s, &t.queue).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        intake_markers(&s, &t.queue).await,
        Vec::new(),
        "intake markers outlived their acks"
    );
    let stored = messages_of(&s, &t.queue).await;
    assert_eq!(
        stored.len(),
        5,
        "a message was stored twice or lost: {stored:?}"
    );
    let (_, b) = s.get("/v1/bridges").await;
    println!(
        "crash between store and ack: stored={} duplicates={} connects={}",
        stored.len(),
        b["bridges"][0]["duplicates"],
        b["bridges"][0]["connects"]
    );
    s.stop().await;
    let left = admin
        .queue_declare(
            &t.intake,
            QueueDeclareOptions {
                passive: true,
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    assert_eq!(left.message_count(), 0, "intake deliveries were not acked");
    t.delete(&admin).await;
}

/// Issue 15, defect 9: a RabbitMQ message over the publish limits (20 KB of headers when
/// `max_header_bytes` is 16 KiB; a body over `max_payload_bytes`) is not stored as it is:
/// it is dead in redrive, its error naming the limit, without what was over; the original
/// is on the dead exchange, and the intake delivery is acked. A redrive of it is refused,
/// not republished without its headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_size_limits_is_dead_naming_the_limit_and_on_the_dead_exchange() {
    let Some(conn) = rabbit().await else { return };
    let admin = conn.create_channel().await.unwrap();
    let t = Topology::declare(&admin).await;
    let s = t.server_with("max_payload_bytes = 4096", RETRY_HOLD).await;
    tokio::spawn(recorder(
        conn.create_channel().await.unwrap(),
        t.work_q.clone(),
        None,
        Arc::default(),
    ));
    let publisher = conn.create_channel().await.unwrap();
    let mut headers = FieldTable::default();
    headers.insert(
        ShortString::from("blob"),
        AMQPValue::LongString(LongString::from("h".repeat(20_000).into_bytes())),
    );
    let big_headers = BasicProperties::default()
        .with_message_id(ShortString::from("big-headers"))
        .with_headers(headers);
    publish_raw(&t, &publisher, b"small body", big_headers).await;
    let big_body = BasicProperties::default().with_message_id(ShortString::from("big-body"));
    publish_raw(&t, &publisher, "b".repeat(10_000).as_bytes(), big_body).await;
    wait_bridge(&s, "2 messages", |b| b["intake"] == 2).await;
    let stored = messages_of(&s, &t.queue).await;
    assert_eq!(stored.len(), 2, "{stored:?}");
    let by_code = |code: &str| {
        stored
            .iter()
            .find(|m| m["last_error"]["code"] == code)
            .unwrap_or_else(|| {
                let codes: Vec<_> = stored.iter().map(|m| &m["last_error"]["code"]).collect();
                panic!("no message with code {code}: {codes:?}")
            })
            .clone()
    };
    let h = by_code("headers_too_large");
    assert_eq!(h["state"], "dead", "{h}");
    assert_eq!(h["dead_reason"], "permanent_error", "{h}");
    let text = h["last_error"]["message"].as_str().unwrap();
    assert!(
        text.contains("max_header_bytes") && text.contains("16384"),
        "{text}"
    );
    assert_eq!(h["payload"], "small body", "what fitted is kept: {h}");
    assert!(h["headers"].get("amqp-headers").is_none(), "{h}");
    assert_eq!(h["headers"]["redrive-refused"], "headers_too_large", "{h}");
    let p = by_code("payload_too_large");
    assert_eq!(p["state"], "dead", "{p}");
    assert_eq!(p["payload"], serde_json::Value::Null, "{p}");
    assert!(
        p["last_error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_payload_bytes"),
        "{p}"
    );
    // The originals, whole, on the dead exchange.
    let mut dead = HashMap::new();
    while dead.len() < 2 {
        if let Some(m) = admin
            .basic_get(&t.dead_q, lapin::options::BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            let id = m
                .delivery
                .properties
                .message_id()
                .clone()
                .unwrap()
                .to_string();
            dead.insert(id, m.delivery);
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let d = &dead["big-headers"];
    assert_eq!(
        header_str(&d.properties, "blob").map(|b| b.len()),
        Some(20_000)
    );
    assert_eq!(
        header_str(&d.properties, "x-redrive-refused").as_deref(),
        Some("headers_too_large")
    );
    assert_eq!(dead["big-body"].data.len(), 10_000);
    // A redrive of it is refused by the bridge, findably, instead of republished mutilated.
    let id = h["id"].as_str().unwrap();
    ok(s.post(&format!("/v1/messages/{id}/redrive"), json!({}))
        .await);
    let mut again = s.message(id).await;
    for _ in 0..1_500 {
        if again["state"] == "dead" && again["attempts"].as_u64().unwrap() > 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        again = s.message(id).await;
    }
    assert!(
        again["last_error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot be republished"),
        "{again}"
    );
    s.stop().await;
    t.delete(&admin).await;
}

/// The application headers of a delivery, without what RabbitMQ and redrive add.
fn app_headers(props: &BasicProperties) -> std::collections::BTreeMap<String, AMQPValue> {
    props
        .headers()
        .as_ref()
        .map(|h| {
            h.inner()
                .iter()
                .filter(|(k, _)| !k.as_str().starts_with("x-"))
                .map(|(k, v)| (k.as_str().to_owned(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Issue 15, §2: what the bridge keeps is readable and exact. A JSON body (formatted, keys
/// unsorted, `1.0`, a `\u` escape) is a JSON payload in the API while every republished
/// copy is byte-identical; AMQP header values are plain JSON while every copy has the
/// original AMQP types; the confirm of a republish is `republished` in the history; the
/// error text does not grow with the attempts, so messages that died after different
/// numbers of attempts are one failure group; an operator's edited payload is republished
/// as its new JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridged_message_is_readable_json_and_republished_exactly() {
    let Some(conn) = rabbit().await else { return };
    let admin = conn.create_channel().await.unwrap();
    let t = Topology::declare(&admin).await;
    let s = t
        .server_with(
            "",
            r#"
max_attempts = 3
backoff = "fixed"
initial_delay = "100ms"
jitter = "none"
"#,
        )
        .await;
    let seen: Arc<Mutex<HashMap<String, Vec<Raw>>>> = Arc::default();
    tokio::spawn(recorder(
        conn.create_channel().await.unwrap(),
        t.work_q.clone(),
        Some(2),
        seen.clone(),
    ));
    let body =
        "{ \"order\": 42,\n  \"price\": 1.0,\n  \"name\": \"\\u00e9t\\u00e9\", \"items\": [1, 2] }";
    let mut geo = FieldTable::default();
    geo.insert(
        ShortString::from("region"),
        AMQPValue::LongString(LongString::from(b"eu".to_vec())),
    );
    geo.insert(ShortString::from("weight"), AMQPValue::Double(2.5));
    let mut headers = FieldTable::default();
    for (k, v) in [
        (
            "tenant",
            AMQPValue::LongString(LongString::from(b"acme".to_vec())),
        ),
        ("attempt", AMQPValue::LongInt(3)),
        ("big", AMQPValue::LongLongInt(1 << 40)),
        ("small", AMQPValue::ShortInt(-2)),
        ("vip", AMQPValue::Boolean(true)),
        ("geo", AMQPValue::FieldTable(geo)),
        (
            "tags",
            AMQPValue::FieldArray(
                vec![
                    AMQPValue::LongLongInt(1),
                    AMQPValue::LongString(LongString::from(b"two".to_vec())),
                ]
                .into(),
            ),
        ),
        ("at", AMQPValue::Timestamp(1_700_000_000)),
        ("raw", AMQPValue::ByteArray(vec![0u8, 255].into())),
    ] {
        headers.insert(ShortString::from(k), v);
    }
    let props = |id: &str| {
        BasicProperties::default()
            .with_message_id(ShortString::from(id))
            .with_content_type(ShortString::from("application/json"))
            .with_delivery_mode(2)
            .with_headers(headers.clone())
    };
    let publisher = conn.create_channel().await.unwrap();
    publish_raw(&t, &publisher, body.as_bytes(), props("exact-1")).await;
    publish_raw(&t, &publisher, br#"{"order": 1}"#, props("doomed-a")).await;
    // Counted once before by another mechanism: it dies after one delivery fewer, so its
    // error would have been repeated once less.
    let mut counted = headers.clone();
    counted.insert(
        ShortString::from("x-retry-count"),
        AMQPValue::LongLongInt(1),
    );
    publish_raw(
        &t,
        &publisher,
        br#"{"order": 2}"#,
        props("doomed-b").with_headers(counted),
    )
    .await;
    let deliveries = |id: &str| seen.lock().unwrap().get(id).map_or(0, Vec::len);
    for tries in 0.. {
        if deliveries("exact-1") >= 3 && deliveries("doomed-a") >= 3 && deliveries("doomed-b") >= 2
        {
            break;
        }
        assert!(tries < 1_500, "{:?}", seen.lock().unwrap().keys());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every copy of the untouched message: the same bytes, the same header types.
    let copies = seen.lock().unwrap()["exact-1"].clone();
    assert_eq!(copies.len(), 3);
    for (i, c) in copies.iter().enumerate() {
        assert_eq!(c.body, body.as_bytes(), "delivery {i}: the body changed");
        assert_eq!(
            app_headers(&c.props),
            app_headers(&props("exact-1")),
            "delivery {i}"
        );
        assert_eq!(
            c.props.content_type().as_ref().map(|c| c.as_str()),
            Some("application/json")
        );
        assert_eq!(c.props.delivery_mode(), &Some(2));
    }
    // What the API shows: a JSON payload, plain header values, republished confirms.
    let stored = messages_of(&s, &t.queue).await;
    let exact = stored
        .iter()
        .find(|m| m["payload"]["order"] == 42)
        .unwrap_or_else(|| panic!("no JSON payload with order 42: {stored:?}"));
    // The last copy can reach the recorder before the bridge has recorded that it was
    // republished (the confirm comes first, then the store's write): wait for that entry.
    let mut tries = 0;
    let full = loop {
        let m = s.message(exact["id"].as_str().unwrap()).await;
        if tries == 500 || m["history"].as_array().map_or(0, Vec::len) >= 4 {
            break m;
        }
        tries += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        full["payload"],
        json!({"order": 42, "price": 1.0, "name": "été", "items": [1, 2]})
    );
    let shown: serde_json::Value =
        serde_json::from_str(full["headers"]["amqp-headers"].as_str().unwrap()).unwrap();
    assert_eq!(
        shown,
        json!({"tenant": "acme", "attempt": 3, "big": 1u64 << 40, "small": -2, "vip": true,
               "geo": {"region": "eu", "weight": 2.5}, "tags": [1, "two"],
               "at": 1_700_000_000, "raw": "AP8="})
    );
    let text = full.to_string();
    assert!(
        !text.contains("LongString") && !text.contains("[97,99"),
        "{text}"
    );
    let events: Vec<&str> = full["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        vec!["failed", "republished", "failed", "republished"],
        "{full}"
    );
    // The console shows the same: the payload as JSON, plain header values, republished.
    let (status, page) = s
        .get_text(&format!("/ui/messages/{}", exact["id"].as_str().unwrap()))
        .await;
    assert_eq!(status, 200);
    for shown in [
        "&quot;order&quot;: 42",
        "&quot;tenant&quot;:&quot;acme&quot;",
        "&quot;attempt&quot;:3",
        "republished",
    ] {
        assert!(page.contains(shown), "the console does not show {shown}");
    }
    assert!(!page.contains("LongString"), "the console shows AMQP types");
    // The error text is the same at every attempt, and the fingerprint with it.
    let a = first_dead_where(&s, &t.queue, |m| m["payload"]["order"] == 1).await;
    let b = first_dead_where(&s, &t.queue, |m| m["payload"]["order"] == 2).await;
    for (m, attempts) in [(&a, 3), (&b, 3)] {
        assert_eq!(m["attempts"], attempts, "{m}");
        assert_eq!(
            m["last_error"]["message"], "dead-lettered by RabbitMQ (rejected)",
            "{m}"
        );
    }
    let (_, groups) = s
        .get(&format!("/v1/failure-groups?queue={}", t.queue))
        .await;
    let groups = groups["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0]["count"], 2, "{groups:?}");
    // Edit and redrive: the new payload goes out as its JSON.
    let id = a["id"].as_str().unwrap();
    ok(s.post(
        &format!("/v1/messages/{id}/redrive"),
        json!({"payload": {"order": 1, "fixed": true}}),
    )
    .await);
    for tries in 0.. {
        if deliveries("doomed-a") >= 4 {
            break;
        }
        assert!(tries < 1_500, "the edited message was not republished");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let last = seen.lock().unwrap()["doomed-a"][3].clone();
    assert_eq!(last.body, br#"{"fixed":true,"order":1}"#);
    s.stop().await;
    t.delete(&admin).await;
}

/// The intake markers the bridge `orders` holds in `queue` (messages stored, not yet acked).
async fn intake_markers(s: &TestServer, queue: &str) -> Vec<(String, redrive_core::MessageId)> {
    s.engine
        .store()
        .idempotency_keys(
            queue.to_owned(),
            "amqp:orders:".to_owned(),
            100,
            Some(s.engine.clock().now()),
        )
        .await
        .unwrap()
}

/// The first dead message of `queue` for which `pick` holds, once there is one.
async fn first_dead_where(
    s: &TestServer,
    queue: &str,
    pick: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    for _ in 0..1_500 {
        let (_, page) = s
            .get(&format!("/v1/messages?queue={queue}&state=dead"))
            .await;
        if let Some(m) = page["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| pick(m))
        {
            return m.clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no such dead message in {queue}");
}

/// A stream entry: its id and its fields as bytes, in order.
type Entry = (String, Vec<(Vec<u8>, Vec<u8>)>);

/// The entries of an `XRANGE` reply (or of one stream of an `XREADGROUP` reply).
fn range_entries(reply: &redis::Value) -> Vec<Entry> {
    use redis::Value as V;
    let bytes = |v: &V| match v {
        V::BulkString(b) => Some(b.clone()),
        V::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    };
    let V::Array(entries) = reply else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries {
        let V::Array(parts) = e else { continue };
        let (Some(id), Some(V::Array(kv))) = (parts.first().and_then(bytes), parts.get(1)) else {
            continue;
        };
        let fields = kv
            .chunks(2)
            .filter_map(|p| Some((bytes(p.first()?)?, bytes(p.get(1)?)?)))
            .collect();
        out.push((String::from_utf8(id).unwrap(), fields));
    }
    out
}

/// The entries of an `XREADGROUP` reply (RESP2 arrays or RESP3 maps).
fn stream_entries(reply: &redis::Value) -> Vec<Entry> {
    use redis::Value as V;
    // RESP2: [[stream, entries], …]; RESP3: {stream: entries}.
    let lists: Vec<&V> = match reply {
        V::Array(a) => a
            .iter()
            .filter_map(|s| match s {
                V::Array(pair) if pair.len() == 2 => Some(&pair[1]),
                _ => None,
            })
            .collect(),
        V::Map(m) => m.iter().map(|(_, v)| v).collect(),
        _ => return Vec::new(),
    };
    lists.into_iter().flat_map(range_entries).collect()
}

/// `XREADGROUP GROUP workers w1 COUNT 10 BLOCK 100 STREAMS stream >`.
async fn read_group(r: &mut redis::aio::MultiplexedConnection, stream: &str) -> Vec<Entry> {
    let reply: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("w1")
        .arg("COUNT")
        .arg(10)
        .arg("BLOCK")
        .arg(100)
        .arg("STREAMS")
        .arg(stream)
        .arg(">")
        .query_async(r)
        .await
        .unwrap();
    stream_entries(&reply)
}

async fn xadd(r: &mut redis::aio::MultiplexedConnection, stream: &str, fields: &[(&[u8], &[u8])]) {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg("*");
    for (k, v) in fields {
        cmd.arg(*k).arg(*v);
    }
    let _: String = cmd.query_async(r).await.unwrap();
}

/// Issue 15, defect 4: the Redis Streams bridge keeps field names and values byte-exact
/// and in the entry's order: a name that is not UTF-8 (`k\xffey` came back as
/// `k\xef\xbf\xbdey`), a binary value, and names that are not in sorted order come back
/// on the copy exactly as the consumer first read them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fields_come_back_byte_exact_and_in_order() {
    let Some(mut r) = redis_conn().await else {
        return;
    };
    let run = format!("{:08x}", rand_u32());
    let (stream, queue) = (format!("rs.exact.{run}"), format!("rsq-exact-{run}"));
    create_group(&mut r, &stream).await;
    let s = redis_server(&stream, &queue).await;
    let binary_name: Vec<(&[u8], &[u8])> = vec![
        (b"zeta", b"1"),
        (b"k\xffey", b"v\xfe\x00"),
        (b"alpha", b"x"),
    ];
    let unsorted: Vec<(&[u8], &[u8])> = vec![(b"zeta", b"z"), (b"alpha", b"\xff"), (b"mid", b"m")];
    xadd(&mut r, &stream, &binary_name).await;
    xadd(&mut r, &stream, &unsorted).await;
    let originals = read_group(&mut r, &stream).await;
    assert_eq!(originals.len(), 2, "{originals:?}");
    // Left unacked: the bridge claims them and adds copies.
    let mut copies = Vec::new();
    for tries in 0.. {
        for (id, fields) in read_group(&mut r, &stream).await {
            let _: i64 = redis::cmd("XACK")
                .arg(&stream)
                .arg("workers")
                .arg(&id)
                .query_async(&mut r)
                .await
                .unwrap();
            copies.push(fields);
        }
        if copies.len() >= 2 {
            break;
        }
        assert!(tries < 300, "no copies: {copies:?}");
    }
    let own = |fields: &Vec<(Vec<u8>, Vec<u8>)>| -> Vec<(Vec<u8>, Vec<u8>)> {
        fields
            .iter()
            .filter(|(k, _)| !k.starts_with(b"redrive-"))
            .cloned()
            .collect()
    };
    let want = |fields: &[(&[u8], &[u8])]| -> Vec<(Vec<u8>, Vec<u8>)> {
        fields
            .iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect()
    };
    let mut got: Vec<_> = copies.iter().map(own).collect();
    got.sort();
    let mut expected = vec![want(&binary_name), want(&unsorted)];
    expected.sort();
    assert_eq!(got, expected, "a copy's fields are not the entry's");
    // What the API shows: an object in the entry's order (header redis-fields), and pairs
    // for the entry whose names are not all UTF-8.
    let stored = messages_of(&s, &queue).await;
    let object = stored
        .iter()
        .find(|m| m["payload"].is_object())
        .unwrap_or_else(|| panic!("{stored:?}"));
    assert_eq!(
        object["payload"],
        json!({"zeta": "z", "alpha": {"base64": "/w=="}, "mid": "m"})
    );
    assert_eq!(
        object["headers"]["redis-fields"],
        r#"["zeta","alpha","mid"]"#
    );
    let pairs = stored
        .iter()
        .find(|m| m["payload"].is_array())
        .unwrap_or_else(|| panic!("{stored:?}"));
    assert_eq!(
        pairs["payload"],
        json!([["zeta", "1"], [{"base64": "a/9leQ=="}, {"base64": "dv4A"}], ["alpha", "x"]])
    );
    s.stop().await;
    let _: i64 = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut r)
        .await
        .unwrap();
}

/// Issue 15, defect 9, for Redis Streams: an entry over `max_payload_bytes` is dead in
/// redrive with the limit named, added whole to `<stream>:dead`, and acked in the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_entry_over_the_size_limits_is_dead_and_on_the_dead_stream() {
    let Some(mut r) = redis_conn().await else {
        return;
    };
    let run = format!("{:08x}", rand_u32());
    let (stream, queue) = (format!("rs.big.{run}"), format!("rsq-big-{run}"));
    create_group(&mut r, &stream).await;
    let s = TestServer::start(&format!(
        r#"
max_payload_bytes = 4096
[bridges.redis_streams.payments]
url = "{REDIS}"
stream = "{stream}"
group = "workers"
min_idle = "200ms"
queue = "{queue}"
[queues."{queue}".retry]
max_attempts = 4
backoff = "fixed"
initial_delay = "100ms"
jitter = "none"
"#
    ))
    .await;
    let blob = "b".repeat(10_000);
    xadd(
        &mut r,
        &stream,
        &[(b"order", b"big-1"), (b"blob", blob.as_bytes())],
    )
    .await;
    assert_eq!(read_group(&mut r, &stream).await.len(), 1);
    let dead = first_dead(&s, &queue).await;
    assert_eq!(dead["dead_reason"], "permanent_error", "{dead}");
    assert_eq!(dead["last_error"]["code"], "payload_too_large", "{dead}");
    assert!(
        dead["last_error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_payload_bytes"),
        "{dead}"
    );
    assert_eq!(dead["payload"], serde_json::Value::Null);
    let mut entries = Vec::new();
    for _ in 0..1_500 {
        let reply: redis::Value = redis::cmd("XRANGE")
            .arg(format!("{stream}:dead"))
            .arg("-")
            .arg("+")
            .query_async(&mut r)
            .await
            .unwrap();
        entries = range_entries(&reply);
        if !entries.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(entries.len(), 1, "nothing on {stream}:dead");
    let fields = &entries[0].1;
    let field = |k: &[u8]| fields.iter().find(|(f, _)| f == k).map(|(_, v)| v.clone());
    assert_eq!(field(b"blob").map(|b| b.len()), Some(10_000));
    assert_eq!(
        field(b"redrive-refused").as_deref(),
        Some(&b"payload_too_large"[..])
    );
    let pending: redis::Value = redis::cmd("XPENDING")
        .arg(&stream)
        .arg("workers")
        .query_async(&mut r)
        .await
        .unwrap();
    match pending {
        redis::Value::Array(p) => assert_eq!(p.first(), Some(&redis::Value::Int(0)), "{p:?}"),
        other => panic!("{other:?}"),
    }
    s.stop().await;
    let _: i64 = redis::cmd("DEL")
        .arg(&stream)
        .arg(format!("{stream}:dead"))
        .query_async(&mut r)
        .await
        .unwrap();
}

/// SPEC §13, bridges on several nodes: two nodes on one PostgreSQL schema run the same
/// RabbitMQ bridge, competing consumers of its intake queue. Node A's connection drops
/// between storing a batch and acking it (the test hook, as a crash there would), so
/// RabbitMQ delivers that batch again, to either node: each delivery meets its intake
/// marker in the shared store and is not stored again. Each message's retry is then
/// republished once, by whichever node leases it, and acked by the work queue's consumer:
/// every message is seen there exactly twice (its first delivery, rejected, and the
/// republished retry), stored once, and done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_running_one_bridge_store_and_republish_each_message_once() {
    let Some(conn) = rabbit().await else { return };
    let admin = conn.create_channel().await.unwrap();
    let t = Topology::declare(&admin).await;
    let config = t.config("", RETRY_4_FAST);
    let a = TestServer::start_shared(&config).await;
    connected(&a).await;
    let b = a.start_beside(&config).await;
    connected(&b).await;
    assert!(a.engine.bridges().drop_connection_before_next_ack("orders"));
    let seen: Arc<Mutex<HashMap<String, Vec<Raw>>>> = Arc::default();
    tokio::spawn(recorder(
        conn.create_channel().await.unwrap(),
        t.work_q.clone(),
        Some(1),
        seen.clone(),
    ));
    let publisher = conn.create_channel().await.unwrap();
    const N: usize = 40;
    for i in 0..N {
        let props = BasicProperties::default().with_message_id(ShortString::from(format!("n-{i}")));
        publish_raw(&t, &publisher, format!("job {i}").as_bytes(), props).await;
    }
    // Every message seen twice by the work queue's consumer, and done in the store.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let twice = seen
            .lock()
            .unwrap()
            .values()
            .filter(|v| v.len() >= 2)
            .count();
        let done = done_of(&a, &t.queue).await;
        if twice == N && done == N {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every message came back once and was done: seen twice {twice}, done {done} of {N}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // room for a second republish
    let seen = seen.lock().unwrap().clone();
    let counts: Vec<usize> = seen.values().map(Vec::len).collect();
    assert_eq!(seen.len(), N, "ids seen: {:?}", seen.keys());
    assert!(
        counts.iter().all(|c| *c == 2),
        "a message was republished twice or not at all: {counts:?}"
    );
    let stored = messages_of(&a, &t.queue).await;
    assert_eq!(stored.len(), N, "a message was stored twice or lost");
    let ba = a.get("/v1/bridges").await.1["bridges"][0].clone();
    let bb = b.get("/v1/bridges").await.1["bridges"][0].clone();
    let sum = |k: &str| ba[k].as_u64().unwrap_or(0) + bb[k].as_u64().unwrap_or(0);
    println!(
        "bridge on two nodes: stored={} intake a={} b={} duplicates={} republished a={} b={}",
        stored.len(),
        ba["intake"],
        bb["intake"],
        sum("duplicates"),
        ba["republished"],
        bb["republished"]
    );
    assert_eq!(sum("republished"), N as u64, "{ba} {bb}");
    assert!(
        sum("duplicates") >= 1,
        "the dropped batch came back: {ba} {bb}"
    );
    assert_eq!(intake_markers(&a, &t.queue).await, Vec::new());
    b.stop().await;
    a.stop().await;
    t.delete(&admin).await;
}

/// SPEC §13, the Redis Streams bridge on several nodes: two nodes on one PostgreSQL schema
/// run the same bridge of one stream and group. A worker reads every entry and acks only
/// redrive's copies: each original goes unacked, is claimed by one of the two bridges once
/// idle, stored once, and its retry added to the stream once, whichever node leases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_running_one_redis_bridge_store_and_copy_each_entry_once() {
    let Some(mut r) = redis_conn().await else {
        return;
    };
    let run = format!("{:08x}", rand_u32());
    let (stream, queue) = (format!("rs2.{run}"), format!("rs2q-{run}"));
    create_group(&mut r, &stream).await;
    let config = redis_config(&stream, &queue);
    let a = TestServer::start_shared(&config).await;
    let b = a.start_beside(&config).await;
    const N: usize = 30;
    for i in 0..N {
        let order = format!("o-{i}");
        xadd(&mut r, &stream, &[(b"order", order.as_bytes())]).await;
    }
    // Originals stay unacked (the bridges claim them); copies are acked.
    let mut seen: HashMap<String, Vec<bool>> = HashMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        for (id, fields) in read_group(&mut r, &stream).await {
            let order = field_of(&fields, b"order").expect("an order field");
            let copy = field_of(&fields, b"redrive-retry-count").is_some();
            seen.entry(order).or_default().push(copy);
            if copy {
                let _: i64 = redis::cmd("XACK")
                    .arg(&stream)
                    .arg("workers")
                    .arg(&id)
                    .query_async(&mut r)
                    .await
                    .unwrap();
            }
        }
        let copied = seen.values().filter(|v| v.contains(&true)).count();
        let done = done_of(&a, &queue).await;
        if copied == N && done == N {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every entry was copied once and done: copied {copied}, done {done} of {N}"
        );
    }
    // Room for a second copy, were one to come.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (id, fields) in read_group(&mut r, &stream).await {
        let order = field_of(&fields, b"order").unwrap_or(id);
        seen.entry(order).or_default().push(true);
    }
    let stored = messages_of(&a, &queue).await;
    let per_order: Vec<usize> = seen
        .values()
        .map(|v| v.iter().filter(|c| **c).count())
        .collect();
    println!(
        "redis bridge on two nodes: entries={N} stored={} copies per entry={:?}",
        stored.len(),
        per_order.iter().max()
    );
    assert_eq!(stored.len(), N, "an entry was stored twice or lost");
    assert!(
        per_order.iter().all(|c| *c == 1),
        "copies per entry: {per_order:?}"
    );
    b.stop().await;
    a.stop().await;
}

/// How many messages of `queue` are `done` (of the first page, as [`messages_of`]).
async fn done_of(s: &TestServer, queue: &str) -> usize {
    let stored = messages_of(s, queue).await;
    stored.iter().filter(|m| m["state"] == "done").count()
}

/// The value of the field `name` of a stream entry's fields, as text.
fn field_of(fields: &[(Vec<u8>, Vec<u8>)], name: &[u8]) -> Option<String> {
    fields
        .iter()
        .find(|(n, _)| n.as_slice() == name)
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
}
