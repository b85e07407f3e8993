//! The write-ahead log stays bounded under continuous writes and is given back when they
//! stop (issue 5, defect 1: 4 GB of WAL after two minutes of steady load).

use redrive_core::{NewMessage, Timestamp};
use redrive_storage::{LeaseRef, LeaseRequest, Store};
use redrive_store_sqlite::{SqliteOptions, SqliteStore};
use std::time::{Duration, Instant};

const LIMIT: u64 = 2 << 20;

fn wal_file(dir: &std::path::Path) -> u64 {
    std::fs::metadata(dir.join("redrive.db-wal")).map_or(0, |m| m.len())
}

/// Publish, lease and ack 1 KiB messages without pause, 20× the bound of WAL traffic, and
/// check the file after every commit: it never exceeds the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_stays_under_its_bound_under_continuous_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = SqliteOptions::new(dir.path());
    opts.max_wal_bytes = LIMIT;
    let store = SqliteStore::open(opts).unwrap();
    let body = serde_json::Value::String("x".repeat(1024));
    let mut max_seen = 0;
    let mut written = 0u64;
    let mut round = 0;
    while written < 20 * LIMIT {
        round += 1;
        let items = (0..50)
            .map(|_| NewMessage::new("q", body.clone()))
            .collect();
        store.publish(items, Some(Timestamp::now())).await.unwrap();
        max_seen = max_seen.max(wal_file(dir.path()));
        let leased = store
            .lease(
                LeaseRequest {
                    queue: "q".into(),
                    max: 50,
                    lease_ms: 30_000,
                    max_bytes: None,
                },
                Some(Timestamp::now()),
            )
            .await
            .unwrap();
        assert_eq!(leased.len(), 50, "round {round}");
        max_seen = max_seen.max(wal_file(dir.path()));
        let acks = leased
            .into_iter()
            .map(|l| {
                LeaseRef {
                    id: l.message.id,
                    token: l.token,
                }
                .into()
            })
            .collect();
        for r in store.ack(acks, Some(Timestamp::now())).await.unwrap() {
            r.unwrap();
        }
        max_seen = max_seen.max(wal_file(dir.path()));
        // Three commits of ≥ 50 KiB of rows each (plus index pages).
        written += 3 * 50 * 1024;
    }
    let stats = store.wal_stats();
    assert!(
        max_seen <= LIMIT,
        "WAL reached {max_seen} bytes, bound {LIMIT} ({} rewinds)",
        stats.rewinds
    );
    assert!(stats.rewinds >= 5, "rewinds: {}", stats.rewinds);
    assert!(stats.bytes <= LIMIT, "reported {}", stats.bytes);
    store.close().await;
}

/// Once writes stop, the log is truncated to nothing (within a few seconds; the checkpointer
/// does it after one idle second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_is_given_back_when_writes_stop() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(SqliteOptions::new(dir.path())).unwrap();
    let items = (0..200)
        .map(|_| NewMessage::new("q", serde_json::Value::String("y".repeat(1024))))
        .collect();
    store.publish(items, Some(Timestamp::now())).await.unwrap();
    assert!(wal_file(dir.path()) > 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    // The file first, then the figure the checkpointer records right after truncating it.
    while wal_file(dir.path()) > 0 || store.wal_stats().bytes > 0 {
        assert!(
            Instant::now() < deadline,
            "WAL still {} bytes after 30 s idle",
            wal_file(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The data is all there.
    let stats = store.queue_stats().await.unwrap();
    assert_eq!(stats[0].count(redrive_core::State::Ready), 200);
    store.close().await;
}
