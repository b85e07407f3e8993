//! Benchmark: the cost of leasing on a key-ordered queue while one key has a large
//! backlog blocked behind its leased head (issue 5, defect 6).
//!
//! Per-key ordering must not make a lease's cost grow with the backlog of *another*
//! key: the lease runs on the store's single writer thread, so a slow lease delays
//! every queue's publishes and acks too. This program measures it at the store level,
//! without HTTP: for each hot-key backlog size it opens a fresh [`SqliteStore`] in a
//! temporary directory, publishes the hot key's messages, then one message for each of
//! many other keys, leases the hot key's head (and keeps it leased, so the rest of the
//! hot key is blocked), and times lease calls of one message each: every one of them
//! must skip the hot key and lease another key. Then it times the acks of those leases
//! (each lets its key's next message, if any, become the head) and single-message
//! publishes onto the hot key (behind its backlog).
//!
//! The same is run on a queue without ordering (`ordering = "none"`, where every
//! message is leasable): the baseline that per-key bookkeeping must not slow down.
//! Each run is made with `Fsync` (the default; what a client waits for, commit
//! included, and sensitive to the disk's fsync latency of the moment) and with
//! `UnsafeBuffered` (no fsync: the writer's own work).
//!
//! ```sh
//! cargo run --release -p redrive-storage --example hot_key              # backlogs 0 and 20000
//! cargo run --release -p redrive-storage --example hot_key -- 20000 2000  # backlog, operations
//! ```
//!
//! The figures are in docs/PERFORMANCE.md ("Hot key").

use redrive_core::{NewMessage, OnDead, Ordering, QueueCatalog, QueueSettings, Timestamp};
use redrive_storage::{LeaseRef, LeaseRequest, Leased, Store};
use redrive_store_sqlite::{Durability, SqliteOptions, SqliteStore};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

/// The queue of the benchmark.
const QUEUE: &str = "orders";
/// Hot-key backlog sizes measured when none is given: none, and the issue's 20,000.
const DEFAULT_BACKLOGS: [usize; 2] = [0, 20_000];
/// Operations of each kind timed per run when no count is given (each lease takes one
/// message of its own key, so this many other keys are published).
const DEFAULT_OPERATIONS: usize = 2_000;
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
            .publish(batch, Some(Timestamp::now()))
            .await
            .expect("publish");
    }
}

async fn lease_one(store: &SqliteStore) -> Vec<Leased> {
    store
        .lease(
            LeaseRequest {
                queue: QUEUE.into(),
                max: 1,
                lease_ms: LEASE_MS,
                max_bytes: None,
            },
            Some(Timestamp::now()),
        )
        .await
        .expect("lease")
}

/// Latencies of one kind of operation, µs, sorted.
struct Latencies(Vec<u128>);

impl std::fmt::Display for Latencies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut t = self.0.clone();
        t.sort_unstable();
        let at = |p: f64| t[((t.len() as f64 - 1.0) * p).round() as usize] as f64 / 1000.0;
        write!(f, "p50 {:>7.3} ms, p99 {:>7.3} ms", at(0.50), at(0.99))
    }
}

/// One run; returns the latencies of the timed leases, acks and publishes.
async fn run(
    ordering: Ordering,
    backlog: usize,
    operations: usize,
    durability: Durability,
) -> [Latencies; 3] {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut opts = SqliteOptions::new(dir.path());
    opts.durability = durability;
    let settings = QueueSettings {
        ordering,
        on_dead: OnDead::Skip,
        ..QueueSettings::default()
    };
    opts.store.catalog = Arc::new(QueueCatalog::new(settings, Default::default()));
    let store = SqliteStore::open(opts).expect("open store");

    // The hot key first (its head and backlog are the earliest due), then one message
    // for each other key.
    let hot: Vec<NewMessage> = (0..backlog + 1).map(|n| message("hot".into(), n)).collect();
    publish_all(&store, hot).await;
    let others: Vec<NewMessage> = (0..operations)
        .map(|n| message(format!("key-{n}"), n))
        .collect();
    publish_all(&store, others).await;

    let head = lease_one(&store).await;
    assert_eq!(
        head.first().and_then(|l| l.message.key.as_deref()),
        Some("hot"),
        "the first lease takes the hot key's head"
    );

    let mut leases = Vec::with_capacity(operations);
    let mut leased = Vec::with_capacity(operations);
    for _ in 0..operations {
        let start = Instant::now();
        let mut got = lease_one(&store).await;
        leases.push(start.elapsed().as_micros());
        assert_eq!(got.len(), 1, "a lease finds a message");
        if ordering == Ordering::Key {
            assert_ne!(got[0].message.key.as_deref(), Some("hot"), "hot key waits");
        }
        leased.push(got.remove(0));
    }
    if ordering == Ordering::Key {
        assert!(
            lease_one(&store).await.is_empty(),
            "only the hot key is left"
        );
    }

    let mut acks = Vec::with_capacity(operations);
    for l in leased {
        let lease = LeaseRef {
            id: l.message.id,
            token: l.token,
        };
        let start = Instant::now();
        let r = store
            .ack(vec![lease.into()], Some(Timestamp::now()))
            .await
            .expect("ack");
        acks.push(start.elapsed().as_micros());
        assert!(r[0].is_ok(), "ack");
    }

    let mut publishes = Vec::with_capacity(operations);
    for n in 0..operations {
        let start = Instant::now();
        store
            .publish(vec![message("hot".into(), n)], Some(Timestamp::now()))
            .await
            .expect("publish");
        publishes.push(start.elapsed().as_micros());
    }
    store.close().await;
    [Latencies(leases), Latencies(acks), Latencies(publishes)]
}

#[tokio::main]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("arguments: [backlog] [operations]"))
        .collect();
    let backlogs: Vec<usize> = match args.first() {
        Some(b) => vec![*b],
        None => DEFAULT_BACKLOGS.to_vec(),
    };
    let operations = args.get(1).copied().unwrap_or(DEFAULT_OPERATIONS);
    println!(
        "{operations} leases (1 message, of another key than the hot one), acks, \
         publishes (1 message, onto the hot key) each"
    );
    for durability in [Durability::Fsync, Durability::UnsafeBuffered] {
        for ordering in [Ordering::Key, Ordering::None] {
            for &backlog in &backlogs {
                let [lease, ack, publish] = run(ordering, backlog, operations, durability).await;
                println!(
                    "{durability:?}, ordering {ordering:?}, hot key backlog {backlog:>6}: \
                     lease {lease}; ack {ack}; publish {publish}"
                );
            }
        }
    }
}
