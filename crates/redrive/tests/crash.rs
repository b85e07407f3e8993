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

use common::load::{check, kill_9_cycles, Ledger, Load, Survivor};
use common::{free_port, start, wait_ready};
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
    let Survivor {
        mut node,
        load,
        opened,
    } = kill_9_cycles(cycles, &client, QUEUE, &ledger, || {
        start(dir.path(), port, CONFIG)
    })
    .await;
    let snap = load.snapshot().await;
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
    let load = Load {
        client: client.clone(),
        base: node.base.clone(),
        queue: QUEUE.into(),
        ledger: ledger.clone(),
        next,
        delayed: true,
    };
    let stop = Instant::now() + Duration::from_secs(5);
    let mut tasks = Vec::new();
    for i in 0..4 {
        tasks.push(tokio::spawn(load.clone().producer(stop)));
        tasks.push(tokio::spawn(load.clone().consumer(i, stop)));
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
    let snap = load.snapshot().await;
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
