//! Benchmark: the cost of leasing on a key-ordered queue while one key has a large
//! backlog blocked behind its leased head (issue 5, defect 6).
//!
//! Per-key ordering must not make a lease's cost grow with the backlog of *another*
//! key: the lease runs on the store's single writer thread, so a slow lease delays
//! every queue's publishes and acks too. This program measures it at the store level,
//! without HTTP: for each hot-key backlog size it opens a fresh [`SqliteStore`] in a
//! temporary directory (`Durability::Fsync`, the default), publishes the hot key's
//! messages, then one message for each of many other keys, leases the hot key's head
//! (and keeps it leased, so the rest of the hot key is blocked), and times lease calls
//! of one message each: every one of them must skip the hot key and lease another key.
//! Each size runs twice: with `Fsync` (what a client sees, commit included) and with
//! `UnsafeBuffered` (no fsync: the writer's own work, less sensitive to disk noise).
//!
//! ```sh
//! cargo run --release -p redrive-storage --example hot_key            # backlogs 0 and 20000
//! cargo run --release -p redrive-storage --example hot_key -- 20000 2000  # backlog, leases
//! ```
//!
//! The figures are in docs/PERFORMANCE.md ("Hot key").

use redrive_core::{NewMessage, OnDead, Ordering, QueueCatalog, QueueSettings, Timestamp};
use redrive_storage::{Durability, LeaseRequest, SqliteOptions, SqliteStore, Store};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

/// The key-ordered queue of the benchmark.
const QUEUE: &str = "orders";
/// Hot-key backlog sizes measured when none is given: none, and the issue's 20,000.
const DEFAULT_BACKLOGS: [usize; 2] = [0, 20_000];
/// Lease calls timed per backlog size when no count is given (each leases one message
/// of its own key, so this many other keys are published).
const DEFAULT_LEASES: usize = 2_000;
/// Messages per publish call while filling the store (one commit each).
const PUBLISH_BATCH: usize = 1_000;
/// Lease length, ms: long enough that nothing expires during a run.
const LEASE_MS: u64 = 3_600_000;

fn message(key: String, n: usize) -> NewMessage {
    NewMessage {
        key: Some(key),
        ..NewMessage::new(QUEUE, json!({ "n": n, "body": "x".repeat(64) }))
    }
}

async fn publish_all(store: &SqliteStore, items: Vec<NewMessage>) {
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        let batch: Vec<NewMessage> = items.by_ref().take(PUBLISH_BATCH).collect();
        store
            .publish(batch, Timestamp::now())
            .await
            .expect("publish");
    }
}

async fn lease_one(store: &SqliteStore) -> Vec<redrive_storage::Leased> {
    store
        .lease(
            LeaseRequest {
                queue: QUEUE.into(),
                max: 1,
                lease_ms: LEASE_MS,
            },
            Timestamp::now(),
        )
        .await
        .expect("lease")
}

fn percentile(sorted_us: &[u128], p: f64) -> u128 {
    let i = ((sorted_us.len() as f64 - 1.0) * p).round() as usize;
    sorted_us[i]
}

/// One run: returns the sorted latencies of the timed leases, µs.
async fn run(backlog: usize, leases: usize, durability: Durability) -> Vec<u128> {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut opts = SqliteOptions::new(dir.path());
    opts.durability = durability;
    let settings = QueueSettings {
        ordering: Ordering::Key,
        on_dead: OnDead::Skip,
        ..QueueSettings::default()
    };
    opts.catalog = Arc::new(QueueCatalog::new(settings, Default::default()));
    let store = SqliteStore::open(opts).expect("open store");

    // The hot key first (its head and backlog are the earliest due), then one message
    // for each other key.
    let hot: Vec<NewMessage> = (0..backlog + 1).map(|n| message("hot".into(), n)).collect();
    publish_all(&store, hot).await;
    let others: Vec<NewMessage> = (0..leases)
        .map(|n| message(format!("key-{n}"), n))
        .collect();
    publish_all(&store, others).await;

    let head = lease_one(&store).await;
    assert_eq!(
        head.first().and_then(|l| l.message.key.as_deref()),
        Some("hot"),
        "the first lease takes the hot key's head"
    );

    let mut times = Vec::with_capacity(leases);
    for _ in 0..leases {
        let start = Instant::now();
        let got = lease_one(&store).await;
        times.push(start.elapsed().as_micros());
        assert_eq!(got.len(), 1, "a lease finds another key's message");
        assert_ne!(
            got[0].message.key.as_deref(),
            Some("hot"),
            "hot key is blocked"
        );
    }
    assert!(
        lease_one(&store).await.is_empty(),
        "only the blocked hot key is left"
    );
    store.close().await;
    times.sort_unstable();
    times
}

#[tokio::main]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("arguments: [backlog] [leases]"))
        .collect();
    let backlogs: Vec<usize> = match args.first() {
        Some(b) => vec![*b],
        None => DEFAULT_BACKLOGS.to_vec(),
    };
    let leases = args.get(1).copied().unwrap_or(DEFAULT_LEASES);
    println!("key-ordered queue, {leases} leases of 1 message of other keys each");
    for durability in [Durability::Fsync, Durability::UnsafeBuffered] {
        for &backlog in &backlogs {
            let t = run(backlog, leases, durability).await;
            println!(
                "{durability:?}: hot key backlog {backlog:>6} blocked ready messages: lease p50 {:>7.3} ms, p99 {:>7.3} ms, max {:>7.3} ms",
            percentile(&t, 0.50) as f64 / 1000.0,
            percentile(&t, 0.99) as f64 / 1000.0,
                percentile(&t, 1.0) as f64 / 1000.0,
            );
        }
    }
}
