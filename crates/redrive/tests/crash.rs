//! Crash and shutdown tests of the real binary.
//!
//! `kill_9_under_load_loses_nothing`: under concurrent publish / lease / ack / nack
//! load, `kill -9` the server at random moments, restart it on the same data
//! directory, and count. Acknowledged publishes lost must be 0, acked messages
//! delivered again must be 0, and the store must open every time.
//! `REDRIVE_CRASH_CYCLES` sets the number of cycles (default 20; a longer soak:
//! `REDRIVE_CRASH_CYCLES=200 cargo test -p redrive --test crash -- --nocapture`).
//!
//! `sigterm_under_load_exits_zero_and_loses_nothing`: SIGTERM under load, the
//! process exits 0 and every acknowledged publish is there after a restart.

mod common;

use common::{free_port, start, wait_ready};
use redrive_core::SplitMix64;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const QUEUE: &str = "crash";
/// Nacked messages come straight back (no delay) and never die, so every message
/// keeps circulating until acked.
const CONFIG: &str = r#"
[queues.crash.retry]
backoff = "fixed"
initial_delay = "0s"
jitter = "none"
max_attempts = 1000000
"#;

/// What the clients saw acknowledged with a 2xx.
#[derive(Default)]
struct Ledger {
    /// Published and answered 2xx: id → payload n.
    published: HashMap<String, u64>,
    /// Acked and answered 200.
    acked: HashSet<String>,
    /// Deliveries of messages that were already acked (must stay 0).
    acked_redelivered: u64,
    deliveries: u64,
}

async fn producer(
    client: reqwest::Client,
    base: String,
    ledger: Arc<Mutex<Ledger>>,
    next: Arc<Mutex<u64>>,
    stop: Instant,
) {
    while Instant::now() < stop {
        let batch: Vec<u64> = {
            let mut n = next.lock().unwrap();
            let b = (*n..*n + 10).collect();
            *n += 10;
            b
        };
        let body = json!({"messages": batch.iter().map(|n| json!({"payload": {"n": n}, "idempotency_key": format!("k{n}")})).collect::<Vec<_>>()});
        let Ok(r) = client
            .post(format!("{base}/v1/queues/{QUEUE}/messages"))
            .json(&body)
            .send()
            .await
        else {
            return;
        };
        if !r.status().is_success() {
            return;
        }
        let Ok(v) = r.json::<Value>().await else {
            return;
        };
        let mut l = ledger.lock().unwrap();
        for m in v["messages"].as_array().unwrap() {
            l.published.insert(
                m["id"].as_str().unwrap().to_owned(),
                m["payload"]["n"].as_u64().unwrap(),
            );
        }
    }
}

async fn consumer(
    client: reqwest::Client,
    base: String,
    ledger: Arc<Mutex<Ledger>>,
    seed: u64,
    stop: Instant,
) {
    let mut rng = SplitMix64::new(seed);
    while Instant::now() < stop {
        let Ok(r) = client
            .post(format!("{base}/v1/queues/{QUEUE}/leases"))
            .json(&json!({"max": 20, "lease": "2s", "wait": "200ms"}))
            .send()
            .await
        else {
            return;
        };
        let Ok(v) = r.json::<Value>().await else {
            return;
        };
        let Some(msgs) = v["messages"].as_array() else {
            return;
        };
        let mut acks = Vec::new();
        let mut nacks = Vec::new();
        {
            let mut l = ledger.lock().unwrap();
            for m in msgs {
                let id = m["id"].as_str().unwrap().to_owned();
                l.deliveries += 1;
                if l.acked.contains(&id) {
                    l.acked_redelivered += 1;
                }
                let item = json!({"id": id, "lease": m["lease"]});
                if rng.between(0, 9) < 7 {
                    acks.push(item);
                } else {
                    nacks.push(json!({"id": item["id"], "lease": item["lease"], "error": {"class": "transient", "message": "crash test"}}));
                }
            }
        }
        if !nacks.is_empty() {
            let _ = client
                .post(format!("{base}/v1/messages/nack"))
                .json(&json!({"items": nacks}))
                .send()
                .await;
        }
        if !acks.is_empty() {
            let Ok(r) = client
                .post(format!("{base}/v1/messages/ack"))
                .json(&json!({"items": acks}))
                .send()
                .await
            else {
                return;
            };
            if !r.status().is_success() {
                return;
            }
            let Ok(v) = r.json::<Value>().await else {
                return;
            };
            let mut l = ledger.lock().unwrap();
            for item in v["items"].as_array().unwrap() {
                if item["status"] == 200 {
                    l.acked.insert(item["id"].as_str().unwrap().to_owned());
                }
            }
        }
    }
}

/// Every message of the queue: id → state (via the streamed export).
async fn snapshot(client: &reqwest::Client, base: &str) -> HashMap<String, String> {
    let text = client
        .get(format!(
            "{base}/v1/messages/export?queue={QUEUE}&format=jsonl"
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["id"].as_str().unwrap().to_owned(),
                v["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn check(ledger: &Ledger, snap: &HashMap<String, String>) -> (usize, usize) {
    let lost = ledger
        .published
        .keys()
        .filter(|id| !snap.contains_key(*id))
        .count();
    let acked_not_done = ledger
        .acked
        .iter()
        .filter(|id| snap.get(*id).map(String::as_str) != Some("done"))
        .count();
    (lost, acked_not_done)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_under_load_loses_nothing() {
    let cycles: u32 = std::env::var("REDRIVE_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let next = Arc::new(Mutex::new(0u64));
    let mut rng = SplitMix64::new(0x5eed);
    let mut opened = 0;
    for cycle in 0..cycles {
        let mut node = start(dir.path(), port, CONFIG);
        assert!(
            wait_ready(&client, &mut node).await,
            "cycle {cycle}: store did not open"
        );
        opened += 1;
        // Everything acknowledged before this crash must be here, acked ones done.
        let snap = snapshot(&client, &node.base).await;
        let (lost, acked_not_done) = check(&ledger.lock().unwrap(), &snap);
        assert_eq!(lost, 0, "cycle {cycle}: acknowledged publishes lost");
        assert_eq!(acked_not_done, 0, "cycle {cycle}: acked messages not done");
        // Load, then kill -9 at a random moment.
        let run_ms = rng.between(150, 1200);
        let stop = Instant::now() + Duration::from_millis(run_ms + 5_000);
        let mut tasks = Vec::new();
        for i in 0..4 {
            tasks.push(tokio::spawn(producer(
                client.clone(),
                node.base.clone(),
                ledger.clone(),
                next.clone(),
                stop,
            )));
            tasks.push(tokio::spawn(consumer(
                client.clone(),
                node.base.clone(),
                ledger.clone(),
                rng.next_u64() ^ i,
                stop,
            )));
        }
        tokio::time::sleep(Duration::from_millis(run_ms)).await;
        node.child.kill().unwrap(); // SIGKILL
        node.child.wait().unwrap();
        for t in tasks {
            let _ = t.await;
        }
    }
    // Final restart: count once more.
    let mut node = start(dir.path(), port, CONFIG);
    assert!(
        wait_ready(&client, &mut node).await,
        "final: store did not open"
    );
    opened += 1;
    let snap = snapshot(&client, &node.base).await;
    let l = ledger.lock().unwrap();
    let (lost, acked_not_done) = check(&l, &snap);
    println!(
        "crash test: cycles={cycles} store_opened={opened}/{} acknowledged_publishes={} acked={} deliveries={} \
         lost={lost} acked_not_done={acked_not_done} acked_delivered_again={}",
        cycles + 1,
        l.published.len(),
        l.acked.len(),
        l.deliveries,
        l.acked_redelivered
    );
    node.child.kill().unwrap();
    node.child.wait().unwrap();
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
async fn sigterm_under_load_exits_zero_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let next = Arc::new(Mutex::new(0u64));
    let mut node = start(dir.path(), port, CONFIG);
    assert!(wait_ready(&client, &mut node).await);
    let stop = Instant::now() + Duration::from_secs(5);
    let mut tasks = Vec::new();
    for i in 0..4 {
        tasks.push(tokio::spawn(producer(
            client.clone(),
            node.base.clone(),
            ledger.clone(),
            next.clone(),
            stop,
        )));
        tasks.push(tokio::spawn(consumer(
            client.clone(),
            node.base.clone(),
            ledger.clone(),
            i,
            stop,
        )));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let pid = node.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let started = Instant::now();
    let status = loop {
        if let Some(s) = node.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "redrive did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for t in tasks {
        let _ = t.await;
    }
    assert!(status.success(), "exit status after SIGTERM: {status}");
    let mut node = start(dir.path(), port, CONFIG);
    assert!(wait_ready(&client, &mut node).await);
    let snap = snapshot(&client, &node.base).await;
    let l = ledger.lock().unwrap();
    let (lost, acked_not_done) = check(&l, &snap);
    println!(
        "sigterm test: exit={status} acknowledged_publishes={} acked={} lost={lost} acked_not_done={acked_not_done}",
        l.published.len(),
        l.acked.len()
    );
    node.child.kill().unwrap();
    node.child.wait().unwrap();
    assert!(l.published.len() > 10);
    assert_eq!(lost, 0);
    assert_eq!(acked_not_done, 0);
}
