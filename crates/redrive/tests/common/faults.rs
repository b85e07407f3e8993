//! What the fault tests of a shared store have in common, whatever the database
//! (`pg_faults.rs` on PostgreSQL, `mysql_faults.rs` on MariaDB): the crash test's queue and
//! load (a worker that stopped at a failed request starts again), the probes of a server
//! while its database is down or recovering, and the three tests themselves, each run on a
//! node the caller started on its database:
//!
//! - [`kill_9_test`]: `crash.rs`'s `kill -9` cycles ([`super::load::kill_9_cycles`]) on the
//!   shared store; lost, acked not done and acked delivered again must all be 0.
//! - [`restart_mid_load`]: the database stopped under load, kept down a few seconds and
//!   started again ([`Database`]): every request answers 503 `store_unavailable` while it
//!   is down, and so, within the health probe's interval, does `/readyz`; the same process
//!   serves again by itself once it is back; nothing answered 2xx is lost.
//! - [`connections_killed_mid_load`]: the server's connections ended by the database
//!   three times under load; the server recovers by itself, nothing answered 2xx is lost.
//!
//! Each prints its figures on one line that starts with the caller's label (`pg restart
//! test:`, `mysql restart test:` …).

use super::load::{check, kill_9_cycles, Ledger, Load, Survivor};
use super::{wait_ready, Node};
use redrive_client::{Client, LeaseRequest, Publish};
use redrive_core::SplitMix64;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const QUEUE: &str = "crash";
/// `crash.rs`'s queue: nacked messages come straight back and never die, so every message
/// keeps circulating until acked.
pub const QUEUES: &str = r#"
[queues.crash.retry]
backoff = "fixed"
initial_delay = "0s"
jitter = "none"
max_attempts = 1000000
"#;

/// The tests' HTTP client: a request unanswered for 10 s is no answer.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// The load of [`QUEUE`] on `node`, recording in `ledger`.
pub fn new_load(client: &reqwest::Client, node: &Node, ledger: &Arc<Mutex<Ledger>>) -> Load {
    Load {
        client: client.clone(),
        base: node.base.clone(),
        queue: QUEUE.into(),
        ledger: ledger.clone(),
        next: Arc::new(Mutex::new(0)),
        delayed: false,
    }
}

/// The load of `crash.rs` (4 producers, 4 consumers), but a worker that stopped at a
/// failed request starts again 50 ms later, until `stop`: the load goes on through a fault.
pub fn keep_loading(load: &Load, seed: u64, stop: Instant) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for i in 0..4u64 {
        let l = load.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop {
                l.clone().producer(stop).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
        let l = load.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = SplitMix64::new(seed ^ i);
            while Instant::now() < stop {
                l.clone().consumer(rng.next_u64(), stop).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    tasks
}

/// Stop the load's tasks and wait until they are gone.
async fn stop_loading(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// The code of an API error body `{"error": {"code": "…", "message": "…"}}`, or `None`
/// if the body is not one.
pub fn error_code(body: &Value) -> Option<&str> {
    let e = body.get("error")?;
    e.get("message")?.as_str()?;
    e.get("code")?.as_str()
}

/// An answer: status and body (`Null` if not JSON); `None`: no answer at all.
pub async fn answer(req: reqwest::RequestBuilder) -> Option<(u16, Value)> {
    let resp = req.send().await.ok()?;
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(Value::Null);
    Some((status, body))
}

/// `GET /readyz`.
pub async fn readyz(client: &reqwest::Client, base: &str) -> Option<(u16, Value)> {
    answer(client.get(format!("{base}/readyz"))).await
}

/// Publish one message as the load does (the next payload number, its idempotency key); a
/// 2xx goes in the ledger.
pub async fn probe_publish(load: &Load) -> Option<(u16, Value)> {
    let n = {
        let mut next = load.next.lock().unwrap();
        *next += 1;
        *next - 1
    };
    let url = format!("{}/v1/queues/{}/messages", load.base, load.queue);
    let body = json!({"payload": {"n": n}, "idempotency_key": format!("k{n}")});
    let (status, body) = answer(load.client.post(url).json(&body)).await?;
    if (200..300).contains(&status) {
        let id = body["id"].as_str().expect("a published message's id");
        assert_eq!(body["payload"]["n"].as_u64(), Some(n), "the payload sent");
        load.ledger
            .lock()
            .unwrap()
            .published
            .insert(id.to_owned(), n);
    }
    Some((status, body))
}

/// Whether an answer is 503 `store_unavailable`.
pub fn unavailable(a: &Option<(u16, Value)>) -> bool {
    matches!(a, Some((503, body)) if error_code(body) == Some("store_unavailable"))
}

/// Whether an answer is a 2xx.
pub fn ok(a: &Option<(u16, Value)>) -> bool {
    matches!(a, Some((s, _)) if (200..300).contains(s))
}

/// After a fault: poll until `/readyz` answers 200 and a publish answers 2xx (at most
/// `within`); the times from `since` until each did, in ms. Every other answer seen on the
/// way must be 503 `store_unavailable` (counted in `unavailable_seen`).
pub async fn wait_recovered(
    load: &Load,
    since: Instant,
    within: Duration,
    unavailable_seen: &mut u64,
) -> (u128, u128) {
    let (mut ready_ms, mut publish_ms) = (None, None);
    while ready_ms.is_none() || publish_ms.is_none() {
        assert!(
            since.elapsed() < within,
            "the server did not serve again within {within:?} (readyz after {ready_ms:?} ms, \
             publish after {publish_ms:?} ms)"
        );
        if ready_ms.is_none() {
            let a = readyz(&load.client, &load.base).await;
            if ok(&a) {
                ready_ms = Some(since.elapsed().as_millis());
            } else {
                assert!(unavailable(&a), "/readyz while recovering: {a:?}");
                *unavailable_seen += 1;
            }
        }
        if publish_ms.is_none() {
            let a = probe_publish(load).await;
            if ok(&a) {
                publish_ms = Some(since.elapsed().as_millis());
            } else {
                assert!(unavailable(&a), "a publish while recovering: {a:?}");
                *unavailable_seen += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (ready_ms.unwrap(), publish_ms.unwrap())
}

/// Every refusal the load's workers recorded: all must be 503 `store_unavailable` (a
/// fault of the database is never another error); how many.
pub fn refusals_all_unavailable(ledger: &Ledger) -> u64 {
    for (status, body) in &ledger.refused {
        assert!(
            *status == 503 && error_code(body) == Some("store_unavailable"),
            "a refusal that is not 503 store_unavailable: {status} {body}"
        );
    }
    ledger.refused.len() as u64
}

/// `crash.rs`'s kill -9 test on a shared store: `cycles` times start a node (`start`, on
/// the same database each time), load it, `kill -9` it; then count once more. Prints
/// `{label}: cycles=… lost=… acked_not_done=… acked_delivered_again=…`; every count 0.
pub async fn kill_9_test(label: &str, cycles: u32, start: impl FnMut() -> Node) {
    let client = http_client();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let Survivor {
        mut node,
        load,
        opened,
    } = kill_9_cycles(cycles, &client, QUEUE, &ledger, start).await;
    let snap = load.snapshot().await;
    node.child.kill().unwrap();
    node.child.wait().unwrap();
    let l = ledger.lock().unwrap();
    let (lost, acked_not_done) = check(&l, &snap);
    println!(
        "{label}: cycles={cycles} store_opened={opened}/{} acknowledged_publishes={} acked={} \
         deliveries={} lost={lost} acked_not_done={acked_not_done} acked_delivered_again={}",
        cycles + 1,
        l.published.len(),
        l.acked.len(),
        l.deliveries,
        l.acked_redelivered
    );
    assert!(
        l.published.len() > 100,
        "the load generator did too little to prove anything"
    );
    assert!(!l.acked.is_empty());
    assert_eq!(lost, 0, "acknowledged publishes lost");
    assert_eq!(acked_not_done, 0, "acked messages not done");
    assert_eq!(l.acked_redelivered, 0, "acked messages delivered again");
}

/// The database a test stops and starts.
pub struct Database {
    /// Its name in messages: `PostgreSQL`, `MariaDB`.
    pub name: &'static str,
    /// What starts it, for the figures: `pg_ctlcluster start`.
    pub start_command: &'static str,
    /// Stop it; returns once it refuses connections (false: it could not be stopped).
    pub stop: fn() -> bool,
    /// Start it; returns once it accepts connections (false: it could not be started).
    pub start: fn() -> bool,
    /// Whether it accepts connections now.
    pub accepts: fn() -> bool,
}

/// The database stopped under load on `node` (ready, its store on `db`), kept down at
/// least 2 s and until `/readyz` said so, started again: see the module's docs. The
/// caller holds a guard that starts `db` again if this fails half-way. Prints `{label}:
/// down_ms=… lost=…`.
pub async fn restart_mid_load(label: &str, db: &Database, mut node: Node) {
    let client = http_client();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let name = db.name;
    let load = new_load(&client, &node, &ledger);
    let stop = Instant::now() + Duration::from_secs(60);
    let tasks = keep_loading(&load, 0x7e57, stop);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = ledger.lock().unwrap().published.len();

    // Down: every request 503 store_unavailable; /readyz too once the probe has seen it.
    assert!(
        tokio::task::spawn_blocking(db.stop).await.unwrap(),
        "{name} did not stop"
    );
    let down = Instant::now();
    assert!(!(db.accepts)(), "{name} still answers after stop");
    let (mut probe_503, mut readyz_503) = (0u64, 0u64);
    let mut readyz_503_after = None;
    while down.elapsed() < Duration::from_secs(2) || readyz_503_after.is_none() {
        assert!(
            down.elapsed() < Duration::from_secs(15),
            "/readyz did not say store_unavailable within 15 s of {name} going down"
        );
        let a = probe_publish(&load).await;
        assert!(unavailable(&a), "a publish while {name} is down: {a:?}");
        probe_503 += 1;
        let a = readyz(&client, &load.base).await;
        if unavailable(&a) {
            readyz_503 += 1;
            readyz_503_after.get_or_insert(down.elapsed().as_millis());
        } else {
            assert!(
                readyz_503_after.is_none() && ok(&a),
                "/readyz while {name} is down: {a:?} (after a 503 already: {readyz_503_after:?})"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let workers_503_down = ledger.lock().unwrap().refused.len();

    // Up again: the same process serves again by itself (times from when the start
    // returned, the database accepting connections).
    let starting = Instant::now();
    assert!(
        tokio::task::spawn_blocking(db.start).await.unwrap(),
        "{name} did not start"
    );
    let start_ms = starting.elapsed().as_millis();
    let down_ms = down.elapsed().as_millis();
    let up = Instant::now();
    let (ready_ms, publish_ms) =
        wait_recovered(&load, up, Duration::from_secs(30), &mut probe_503).await;
    assert!(
        node.child.try_wait().unwrap().is_none(),
        "the server exited"
    );
    let recovered = ledger.lock().unwrap().published.len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let load_after = ledger.lock().unwrap().published.len() - recovered;
    // Stop the load, then count.
    stop_loading(tasks).await;
    let snap = load.snapshot().await;
    node.child.kill().unwrap();
    node.child.wait().unwrap();
    let l = ledger.lock().unwrap();
    let workers_503 = refusals_all_unavailable(&l);
    let (lost, acked_not_done) = check(&l, &snap);
    println!(
        "{label}: down_ms={down_ms} ({} took {start_ms}) workers_503={workers_503} (while down {workers_503_down}) \
         probes_503={probe_503} readyz_503={readyz_503} readyz_503_after_ms={} \
         recovered_readyz_ms={ready_ms} recovered_publish_ms={publish_ms} \
         acknowledged_publishes={} (before the stop {before}, in 2 s after recovery {load_after}) \
         acked={} deliveries={} lost={lost} acked_not_done={acked_not_done} acked_delivered_again={}",
        db.start_command,
        readyz_503_after.unwrap(),
        l.published.len(),
        l.acked.len(),
        l.deliveries,
        l.acked_redelivered
    );
    assert!(before > 10, "the load did too little before the stop");
    assert!(
        workers_503_down > 0,
        "the load saw no 503 while {name} was down"
    );
    assert!(load_after > 10, "the load did too little after recovery");
    assert!(!l.acked.is_empty());
    assert_eq!(lost, 0, "acknowledged publishes lost");
    assert_eq!(acked_not_done, 0, "acked messages not done");
    assert_eq!(l.acked_redelivered, 0, "acked messages delivered again");
}

/// Three times under load on `node` (ready): a second of load, then `end_connections`
/// ends the server's connections on the database (answers how many; there must be some);
/// then the server must serve again by itself and hold connections again
/// (`count_connections`). Prints `{label}: rounds=3 connections_{verb}=[…] … lost=…`.
pub async fn connections_killed_mid_load(
    label: &str,
    verb: &str,
    node: Node,
    end_connections: impl Fn() -> u64,
    count_connections: impl Fn() -> u64,
) {
    let mut node = node;
    let client = http_client();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let load = new_load(&client, &node, &ledger);
    let stop = Instant::now() + Duration::from_secs(60);
    let tasks = keep_loading(&load, 0x7e4d, stop);
    let mut ended = Vec::new();
    let mut published_between = Vec::new();
    for _ in 0..3 {
        let at_start = ledger.lock().unwrap().published.len();
        tokio::time::sleep(Duration::from_secs(1)).await;
        published_between.push(ledger.lock().unwrap().published.len() - at_start);
        let n = end_connections();
        assert!(n > 0, "no connection of the server to end");
        ended.push(n);
    }
    let last = Instant::now();
    let mut probe_503 = 0;
    let (ready_ms, publish_ms) =
        wait_recovered(&load, last, Duration::from_secs(30), &mut probe_503).await;
    let recovered = ledger.lock().unwrap().published.len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let load_after = ledger.lock().unwrap().published.len() - recovered;
    assert!(
        node.child.try_wait().unwrap().is_none(),
        "the server exited"
    );
    let reconnected = count_connections();
    stop_loading(tasks).await;
    let snap = load.snapshot().await;
    node.child.kill().unwrap();
    node.child.wait().unwrap();
    let l = ledger.lock().unwrap();
    let workers_503 = refusals_all_unavailable(&l);
    let (lost, acked_not_done) = check(&l, &snap);
    println!(
        "{label}: rounds={} connections_{verb}={ended:?} \
         published_between_rounds={published_between:?} workers_503={workers_503} \
         probes_503={probe_503} recovered_readyz_ms={ready_ms} recovered_publish_ms={publish_ms} \
         connections_after={reconnected} acknowledged_publishes={} (in 2 s after the last round \
         {load_after}) acked={} deliveries={} lost={lost} acked_not_done={acked_not_done} \
         acked_delivered_again={}",
        ended.len(),
        l.published.len(),
        l.acked.len(),
        l.deliveries,
        l.acked_redelivered
    );
    assert!(
        reconnected > 0,
        "the server holds no connection after the rounds"
    );
    assert!(
        load_after > 10,
        "the load did too little after the last round"
    );
    assert!(!l.acked.is_empty());
    assert_eq!(lost, 0, "acknowledged publishes lost");
    assert_eq!(acked_not_done, 0, "acked messages not done");
    assert_eq!(l.acked_redelivered, 0, "acked messages delivered again");
}

/// `node` once it answers `/readyz` (its store open); fails the test after 30 s.
pub async fn ready(mut node: Node) -> Node {
    assert!(
        wait_ready(&http_client(), &mut node).await,
        "store did not open"
    );
    node
}

/// The cluster section of [`node_ahead_expires_leases`]'s nodes: beats every 200 ms.
pub const SKEW_CLUSTER: &str = "[cluster]\nheartbeat_interval = \"200ms\"\nleader_lease = \"2s\"\n";

/// Two nodes on one database, the second five minutes ahead (libfaketime, as in
/// `cluster_faults.rs`), started by `start(i, wrapper)` with [`SKEW_CLUSTER`] and [`QUEUES`];
/// the first, holding leases of 5 messages, is killed with `kill -9`; the second must deliver
/// them again within their lease + 1 s. Its store keeps its scheduler's wake-up at most a
/// second ahead *on the database's clock*; on the node's own clock it was five minutes away,
/// and the leases stayed out.
pub async fn node_ahead_expires_leases(label: &str, mut start: impl FnMut(usize, &[&str]) -> Node) {
    const LEASE_MS: u64 = 2_000;
    let client = http_client();
    let mut on_time = start(0, &[]);
    let mut ahead = start(
        1,
        &[
            "env",
            "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
            "FAKETIME=+5m",
        ],
    );
    assert!(
        wait_ready(&client, &mut on_time).await,
        "a node did not start"
    );
    assert!(
        wait_ready(&client, &mut ahead).await,
        "the node ahead did not start"
    );
    // Both nodes beat, and the node ahead has measured its offset to the database.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let api = |node: &Node| Client::with_http(&node.base, client.clone()).expect("a server URL");
    let items: Vec<Publish> = (0..5).map(|i| Publish::new(json!({ "i": i }))).collect();
    api(&on_time)
        .publish_batch(QUEUE, &items)
        .await
        .expect("publish");
    let leased = api(&on_time)
        .lease(
            QUEUE,
            &LeaseRequest {
                max: Some(5),
                lease: Some(format!("{LEASE_MS}ms")),
                wait: None,
            },
        )
        .await
        .expect("lease");
    assert_eq!(leased.len(), 5);
    let killed = Instant::now();
    on_time.child.kill().unwrap();
    on_time.child.wait().unwrap();
    let mut again = std::collections::HashSet::new();
    let back = loop {
        let ask = LeaseRequest {
            max: Some(5),
            lease: Some("60s".into()),
            wait: Some("200ms".into()),
        };
        if let Ok(got) = api(&ahead).lease(QUEUE, &ask).await {
            again.extend(got.into_iter().map(|m| m.id.to_string()));
        }
        if again.len() == leased.len() {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_millis(LEASE_MS + 10_000),
            "only {} of the killed node's 5 leased messages came back through the node 5 min \
             ahead 10 s after their lease",
            again.len()
        );
    };
    assert!(leased.iter().all(|m| again.contains(&m.id.to_string())));
    println!(
        "{label}: the killed node's 5 leased messages delivered again by the node 5 min \
         ahead {:.0} ms after the kill (lease {LEASE_MS} ms)",
        back.as_secs_f64() * 1e3
    );
    assert!(
        back <= Duration::from_millis(LEASE_MS + 1_000),
        "the leased messages came back after {back:?}: more than their lease + 1 s"
    );
}
