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
        let Topology {
            intake,
            queue,
            dlx,
            dead_x,
            ..
        } = self;
        let s = TestServer::start(&format!(
            r#"
[bridges.rabbitmq.orders]
url = "{URL}"
intake_queue = "{intake}"
queue = "{queue}"
dead_letter_exchange = "{dlx}"
dead_exchange = "{dead_x}"
[queues."{queue}".retry]
max_attempts = 4
backoff = "fixed"
initial_delay = "100ms"
jitter = "none"
"#
        ))
        .await;
        for _ in 0..500 {
            let (_, b) = s.get("/v1/bridges").await;
            if b["bridges"][0]["state"] == "connected" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        s
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
    let php = std::process::Command::new("php")
        .args(["-r", "require_once 'PhpAmqpLib/autoload.php'; echo 'ok';"])
        .output();
    if !php.as_ref().is_ok_and(|o| o.stdout == b"ok") {
        assert!(
            std::env::var("CI").is_err(),
            "php with php-amqplib is needed under CI: {php:?}"
        );
        eprintln!("skipped: php-cli and php-amqplib are not installed");
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

/// The first dead message of `queue`, once there is one.
async fn first_dead(s: &TestServer, queue: &str) -> serde_json::Value {
    loop {
        let (_, page) = s
            .get(&format!("/v1/messages?queue={queue}&state=dead"))
            .await;
        if page["messages"].as_array().is_some_and(|m| !m.is_empty()) {
            return page["messages"][0].clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

fn php_has(check: &str) -> bool {
    let php = std::process::Command::new("php")
        .args(["-r", check])
        .output();
    if php.as_ref().is_ok_and(|o| o.stdout == b"ok") {
        return true;
    }
    assert!(
        std::env::var("CI").is_err(),
        "php is needed under CI: {php:?}"
    );
    eprintln!("skipped: php ({check}) is not available");
    false
}

async fn redis_server(stream: &str, queue: &str) -> TestServer {
    TestServer::start(&format!(
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
    ))
    .await
}

/// The Redis Streams bridge with the seeds' other tool: an unchanged php-redis consumer that
/// leaves the first 2 reads of each order unacked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_php_redis_consumer_gets_retries_and_dead_letters() {
    if !php_has("echo class_exists('Redis') ? 'ok' : 'no';") {
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
