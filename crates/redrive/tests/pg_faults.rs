//! Fault tests of the real binary with its store on PostgreSQL (the local cluster,
//! `postgres://root@127.0.0.1:5432/test`, trust auth; each test on a fresh schema
//! `redrive_fault_<random>`, dropped at its end).
//!
//! **This test binary stops, starts and restarts the local PostgreSQL cluster
//! (`pg_ctlcluster`, so it runs as root) and terminates backends.** Its tests take one
//! lock ([`PG`]) for their whole run, so none of them disturbs another; nothing else may use
//! that PostgreSQL while it runs (`cargo test` runs test binaries one after another; run by
//! hand beside other PostgreSQL tests, serialise with them, e.g. `flock /tmp/pg.lock cargo
//! test -p redrive --test pg_faults -- --nocapture`). A test that stopped PostgreSQL starts
//! it again when it ends, failed or not ([`PgUp`]).
//!
//! - `kill_9_on_postgres_loses_nothing`: `crash.rs`'s kill -9 test on PostgreSQL: under
//!   publish / lease / ack / nack load, `kill -9` the server at random moments and restart
//!   it on the same schema. Acknowledged publishes lost, acked messages not done and acked
//!   messages delivered again must all be 0. `REDRIVE_PG_CRASH_CYCLES` sets the number of
//!   cycles (default 20).
//! - `postgres_restart_mid_load`: PostgreSQL stopped under load, kept down a few seconds,
//!   started again. While it is down every request answers 503 `store_unavailable` and so,
//!   within the health probe's interval, does `/readyz`; once it is back the same process
//!   serves again by itself, and nothing answered 2xx is lost.
//! - `postgres_connections_terminated_mid_load`: the server's connections (found by the
//!   `application_name` its URL sets) terminated with `pg_terminate_backend` three times
//!   under load; the server recovers by itself and nothing answered 2xx is lost.
//! - `a_killed_leader_is_replaced_and_its_leases_come_back`: two nodes on one schema; the
//!   leader, holding leases, is killed with `kill -9`. The other leads within the
//!   leadership lease + 1 s and delivers the leased messages again within their lease + 1 s.
//!
//! The figures go to stdout (`-- --nocapture`): `pg crash test:`, `pg restart test:`, `pg
//! terminate test:`, `pg failover test:`.

mod common;

use common::load::{check, kill_9_cycles, Ledger, Load, Survivor};
use common::pg::{ensure_pg_up, pg_ctl, pg_ready, psql, PgUp, Schema, PG_URL};
use common::{free_port, start_with, wait_ready, Node};
use redrive_core::SplitMix64;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Every test schema of this binary is `redrive_fault_<random>`.
const SCHEMA_PREFIX: &str = "redrive_fault";
const QUEUE: &str = "crash";
/// `crash.rs`'s queue: nacked messages come straight back and never die, so every message
/// keeps circulating until acked.
const QUEUES: &str = r#"
[queues.crash.retry]
backoff = "fixed"
initial_delay = "0s"
jitter = "none"
max_attempts = 1000000
"#;

/// Taken by every test of this binary for its whole run: one test's restart or
/// terminations never hit another's server.
static PG: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `redrive serve` on `schema` (its connections named `schema` too, for
/// `pg_terminate_backend`).
fn start_pg(dir: &Path, port: u16, schema: &str) -> Node {
    let url = format!("{PG_URL}?application_name={schema}");
    let config = format!("storage_schema = \"{schema}\"\n{QUEUES}");
    start_with(
        dir,
        &dir.join("data"),
        port,
        &config,
        &["--storage-url", &url],
    )
}

fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn new_load(client: &reqwest::Client, node: &Node, ledger: &Arc<Mutex<Ledger>>) -> Load {
    Load {
        client: client.clone(),
        base: node.base.clone(),
        queue: QUEUE.into(),
        ledger: ledger.clone(),
        next: Arc::new(Mutex::new(0)),
    }
}

/// The load of `crash.rs` (4 producers, 4 consumers), but a worker that stopped at a
/// failed request starts again 50 ms later, until `stop`: the load goes on through a fault.
fn keep_loading(load: &Load, seed: u64, stop: Instant) -> Vec<tokio::task::JoinHandle<()>> {
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

/// The code of an API error body `{"error": {"code": "…", "message": "…"}}`, or `None`
/// if the body is not one.
fn error_code(body: &Value) -> Option<&str> {
    let e = body.get("error")?;
    e.get("message")?.as_str()?;
    e.get("code")?.as_str()
}

/// An answer: status and body (`Null` if not JSON); `None`: no answer at all.
async fn answer(req: reqwest::RequestBuilder) -> Option<(u16, Value)> {
    let resp = req.send().await.ok()?;
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(Value::Null);
    Some((status, body))
}

/// `GET /readyz`.
async fn readyz(client: &reqwest::Client, base: &str) -> Option<(u16, Value)> {
    answer(client.get(format!("{base}/readyz"))).await
}

/// Publish one message as the load does (the next payload number, its idempotency key); a
/// 2xx goes in the ledger.
async fn probe_publish(load: &Load) -> Option<(u16, Value)> {
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
fn unavailable(a: &Option<(u16, Value)>) -> bool {
    matches!(a, Some((503, body)) if error_code(body) == Some("store_unavailable"))
}

/// Whether an answer is a 2xx.
fn ok(a: &Option<(u16, Value)>) -> bool {
    matches!(a, Some((s, _)) if (200..300).contains(s))
}

/// After a fault: poll until `/readyz` answers 200 and a publish answers 2xx (at most
/// `within`); the times from `since` until each did, in ms. Every other answer seen on the
/// way must be 503 `store_unavailable` (counted in `unavailable_seen`).
async fn wait_recovered(
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
/// fault of PostgreSQL is never another error); how many.
fn refusals_all_unavailable(ledger: &Ledger) -> u64 {
    for (status, body) in &ledger.refused {
        assert!(
            *status == 503 && error_code(body) == Some("store_unavailable"),
            "a refusal that is not 503 store_unavailable: {status} {body}"
        );
    }
    ledger.refused.len() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_on_postgres_loses_nothing() {
    let _pg = PG.lock().await;
    ensure_pg_up();
    let cycles: u32 = std::env::var("REDRIVE_PG_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let schema = Schema::fresh(SCHEMA_PREFIX);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let client = http_client();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let Survivor {
        mut node,
        load,
        opened,
    } = kill_9_cycles(cycles, &client, QUEUE, &ledger, || {
        start_pg(dir.path(), port, &schema.0)
    })
    .await;
    let snap = load.snapshot().await;
    node.child.kill().unwrap();
    node.child.wait().unwrap();
    let l = ledger.lock().unwrap();
    let (lost, acked_not_done) = check(&l, &snap);
    println!(
        "pg crash test: cycles={cycles} store_opened={opened}/{} acknowledged_publishes={} acked={} \
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restart_mid_load() {
    let _pg = PG.lock().await;
    ensure_pg_up();
    let schema = Schema::fresh(SCHEMA_PREFIX);
    let dir = tempfile::tempdir().unwrap();
    let client = http_client();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let _up = PgUp;
    let mut node = start_pg(dir.path(), free_port(), &schema.0);
    assert!(wait_ready(&client, &mut node).await, "store did not open");
    let load = new_load(&client, &node, &ledger);
    let stop = Instant::now() + Duration::from_secs(60);
    let tasks = keep_loading(&load, 0x7e57, stop);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = ledger.lock().unwrap().published.len();

    // Down: every request 503 store_unavailable; /readyz too once the probe has seen it.
    assert!(pg_ctl("stop"), "pg_ctlcluster stop");
    let down = Instant::now();
    assert!(!pg_ready(), "PostgreSQL still answers after stop");
    let (mut probe_503, mut readyz_503) = (0u64, 0u64);
    let mut readyz_503_after = None;
    while down.elapsed() < Duration::from_secs(2) || readyz_503_after.is_none() {
        assert!(
            down.elapsed() < Duration::from_secs(15),
            "/readyz did not say store_unavailable within 15 s of PostgreSQL going down"
        );
        let a = probe_publish(&load).await;
        assert!(unavailable(&a), "a publish while PostgreSQL is down: {a:?}");
        probe_503 += 1;
        let a = readyz(&client, &load.base).await;
        if unavailable(&a) {
            readyz_503 += 1;
            readyz_503_after.get_or_insert(down.elapsed().as_millis());
        } else {
            assert!(
                readyz_503_after.is_none() && ok(&a),
                "/readyz while PostgreSQL is down: {a:?} (after a 503 already: {readyz_503_after:?})"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let workers_503_down = ledger.lock().unwrap().refused.len();

    // Up again: the same process serves again by itself (times from when `pg_ctlcluster
    // start` returned, PostgreSQL accepting connections).
    let starting = Instant::now();
    assert!(pg_ctl("start"), "pg_ctlcluster start");
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
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    let snap = load.snapshot().await;
    node.child.kill().unwrap();
    node.child.wait().unwrap();
    let l = ledger.lock().unwrap();
    let workers_503 = refusals_all_unavailable(&l);
    let (lost, acked_not_done) = check(&l, &snap);
    println!(
        "pg restart test: down_ms={down_ms} (pg_ctlcluster start took {start_ms}) workers_503={workers_503} (while down {workers_503_down}) \
         probes_503={probe_503} readyz_503={readyz_503} readyz_503_after_ms={} \
         recovered_readyz_ms={ready_ms} recovered_publish_ms={publish_ms} \
         acknowledged_publishes={} (before the stop {before}, in 2 s after recovery {load_after}) \
         acked={} deliveries={} lost={lost} acked_not_done={acked_not_done} acked_delivered_again={}",
        readyz_503_after.unwrap(),
        l.published.len(),
        l.acked.len(),
        l.deliveries,
        l.acked_redelivered
    );
    assert!(before > 10, "the load did too little before the stop");
    assert!(
        workers_503_down > 0,
        "the load saw no 503 while PostgreSQL was down"
    );
    assert!(load_after > 10, "the load did too little after recovery");
    assert!(!l.acked.is_empty());
    assert_eq!(lost, 0, "acknowledged publishes lost");
    assert_eq!(acked_not_done, 0, "acked messages not done");
    assert_eq!(l.acked_redelivered, 0, "acked messages delivered again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_connections_terminated_mid_load() {
    let _pg = PG.lock().await;
    ensure_pg_up();
    let schema = Schema::fresh(SCHEMA_PREFIX);
    let dir = tempfile::tempdir().unwrap();
    let client = http_client();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let mut node = start_pg(dir.path(), free_port(), &schema.0);
    assert!(wait_ready(&client, &mut node).await, "store did not open");
    let load = new_load(&client, &node, &ledger);
    let stop = Instant::now() + Duration::from_secs(60);
    let tasks = keep_loading(&load, 0x7e4d, stop);
    // Only this server's connections: its URL names them after its schema.
    let terminate = format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = '{}' AND pid <> pg_backend_pid()",
        schema.0
    );
    let mut terminated = Vec::new();
    let mut published_between = Vec::new();
    for _ in 0..3 {
        let at_start = ledger.lock().unwrap().published.len();
        tokio::time::sleep(Duration::from_secs(1)).await;
        published_between.push(ledger.lock().unwrap().published.len() - at_start);
        let n: u64 = psql(&[&terminate])
            .expect("pg_terminate_backend")
            .parse()
            .expect("a count");
        assert!(n > 0, "no connection of the server to terminate");
        terminated.push(n);
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
    let reconnected: u64 = psql(&[&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{}'",
        schema.0
    )])
    .expect("count connections")
    .parse()
    .expect("a count");
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    let snap = load.snapshot().await;
    node.child.kill().unwrap();
    node.child.wait().unwrap();
    let l = ledger.lock().unwrap();
    let workers_503 = refusals_all_unavailable(&l);
    let (lost, acked_not_done) = check(&l, &snap);
    println!(
        "pg terminate test: rounds={} connections_terminated={terminated:?} \
         published_between_rounds={published_between:?} workers_503={workers_503} \
         probes_503={probe_503} recovered_readyz_ms={ready_ms} recovered_publish_ms={publish_ms} \
         connections_after={reconnected} acknowledged_publishes={} (in 2 s after the last round \
         {load_after}) acked={} deliveries={} lost={lost} acked_not_done={acked_not_done} \
         acked_delivered_again={}",
        terminated.len(),
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

/// Two nodes of one cluster (one schema): kill -9 the leader while it holds leases. The
/// other node leads within the leadership lease + 1 s (it beats every 200 ms, the lease is
/// 2 s) and delivers the killed node's leased messages again within their lease + 1 s (its
/// scheduler ticks at least once a second on a shared store, so it expires leases it never
/// heard of; the queue retries at once, as `crash.rs`'s). Figures: `pg failover test:`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_leader_is_replaced_and_its_leases_come_back() {
    const LEADER_LEASE_MS: u64 = 2_000;
    const MESSAGE_LEASE_MS: u64 = 3_000;
    let _pg = PG.lock().await;
    ensure_pg_up();
    let schema = Schema::fresh(SCHEMA_PREFIX);
    let client = http_client();
    let config = format!(
        "storage_schema = \"{}\"\n[cluster]\nheartbeat_interval = \"200ms\"\nleader_lease = \"{LEADER_LEASE_MS}ms\"\n{QUEUES}",
        schema.0
    );
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut nodes: Vec<Node> = dirs
        .iter()
        .map(|d| {
            start_with(
                d.path(),
                &d.path().join("data"),
                free_port(),
                &config,
                &["--storage-url", PG_URL],
            )
        })
        .collect();
    for n in &mut nodes {
        assert!(wait_ready(&client, n).await, "a node did not start");
    }
    let cluster = |base: String| {
        let client = client.clone();
        async move {
            answer(client.get(format!("{base}/v1/cluster")))
                .await
                .filter(|(s, _)| *s == 200)
                .map(|(_, v)| v)
        }
    };
    // Both nodes listed, one leader.
    let deadline = Instant::now() + Duration::from_secs(10);
    let leader_name = loop {
        if let Some(c) = cluster(nodes[0].base.clone()).await {
            let live = c["nodes"]
                .as_array()
                .map_or(0, |n| n.iter().filter(|n| n["live"] == true).count());
            if live == 2 && !c["leader"].is_null() {
                break c["leader"]["node"].as_str().unwrap().to_owned();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no two-node cluster with a leader within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let leader_ix = nodes
        .iter()
        .position(|n| n.base.ends_with(leader_name.rsplit(':').next().unwrap()))
        .expect("the leader is one of the nodes");
    let other = 1 - leader_ix;
    // The leader holds leases of 10 messages.
    let api =
        |base: &str| redrive_client::Client::with_http(base, client.clone()).expect("a server URL");
    let leader_api = api(&nodes[leader_ix].base);
    let items: Vec<redrive_client::Publish> = (0..10)
        .map(|i| redrive_client::Publish::new(json!({ "i": i })))
        .collect();
    leader_api
        .publish_batch(QUEUE, &items)
        .await
        .expect("publish");
    let ids: Vec<String> = leader_api
        .lease(
            QUEUE,
            &redrive_client::LeaseRequest {
                max: Some(10),
                lease: Some(format!("{MESSAGE_LEASE_MS}ms")),
                wait: None,
            },
        )
        .await
        .expect("lease")
        .into_iter()
        .map(|m| m.id.to_string())
        .collect();
    assert_eq!(ids.len(), 10);
    let killed = Instant::now();
    nodes[leader_ix].child.kill().unwrap();
    nodes[leader_ix].child.wait().unwrap();
    // The other node takes over.
    let took_over = loop {
        if let Some(c) = cluster(nodes[other].base.clone()).await {
            if !c["leader"].is_null() && c["leader"]["node"] != leader_name.as_str() {
                break killed.elapsed();
            }
        }
        assert!(
            killed.elapsed() < Duration::from_millis(LEADER_LEASE_MS + 5_000),
            "no new leader 5 s after the lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // And delivers the killed node's leased messages again.
    let mut again = std::collections::HashSet::new();
    let other_api = api(&nodes[other].base);
    let redelivered = loop {
        let ask = redrive_client::LeaseRequest {
            max: Some(10),
            lease: None,
            wait: Some("200ms".into()),
        };
        if let Ok(got) = other_api.lease(QUEUE, &ask).await {
            again.extend(got.into_iter().map(|m| m.id.to_string()));
        }
        if again.len() == ids.len() {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_millis(MESSAGE_LEASE_MS + 5_000),
            "only {} of the killed node's 10 leased messages came back 5 s after their lease",
            again.len()
        );
    };
    assert!(ids.iter().all(|id| again.contains(id)));
    println!(
        "pg failover test: leader kill -9'd; a new leader {:.0} ms later (leadership lease {LEADER_LEASE_MS} ms, \
         heartbeat 200 ms); its 10 leased messages delivered again by the other node {:.0} ms later (message lease {MESSAGE_LEASE_MS} ms)",
        took_over.as_secs_f64() * 1e3,
        redelivered.as_secs_f64() * 1e3
    );
    assert!(
        took_over <= Duration::from_millis(LEADER_LEASE_MS + 1_000),
        "a new leader took {took_over:?}: more than the leadership lease + 1 s"
    );
    assert!(
        redelivered <= Duration::from_millis(MESSAGE_LEASE_MS + 1_000),
        "the leased messages came back after {redelivered:?}: more than their lease + 1 s"
    );
    for n in &mut nodes {
        let _ = n.child.kill();
        let _ = n.child.wait();
    }
    drop(nodes);
    schema.drop_now();
}
