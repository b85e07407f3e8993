//! Group commit: concurrent publish and ack calls share commits; a call refused inside a
//! batch fails alone; two stores racing on one idempotency key create one message.

mod common;

use redrive_core::{MessageId, NewMessage, State};
use redrive_storage::conformance::{at, Setup, Q};
use redrive_storage::{Ack, LeaseRef, LeaseRequest, Store, StoreError};
use redrive_store_mysql::MysqlStore;
use serde_json::json;
use std::sync::Arc;

const PREFIX: &str = "group";

async fn store(group_commit: bool) -> (Arc<MysqlStore>, common::DbGuard) {
    let guard = common::fresh_database(PREFIX);
    let mut opts = common::options(&guard.0, &Setup::default());
    opts.pool_size = 8;
    opts.group_commit = group_commit;
    let s = MysqlStore::open(opts).await.expect("open");
    (Arc::new(s), guard)
}

/// 16 callers publish 20 single messages each, then ack them one by one, concurrently: the
/// commits per message each phase took.
async fn commits_per_message(group_commit: bool) -> (f64, f64) {
    const TASKS: usize = 16;
    const PER_TASK: usize = 20;
    let (s, _guard) = store(group_commit).await;
    let before = s.commit_stats().commits;
    let mut handles = Vec::new();
    for t in 0..TASKS {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..PER_TASK {
                s.publish(
                    vec![NewMessage::new(Q, json!({ "t": t, "i": i }))],
                    Some(at(0)),
                )
                .await
                .expect("publish");
            }
        }));
    }
    for h in handles {
        h.await.expect("publisher");
    }
    let n = (TASKS * PER_TASK) as f64;
    let published = s.commit_stats().commits - before;
    let leased = s
        .lease(
            LeaseRequest {
                queue: Q.into(),
                max: (TASKS * PER_TASK) as u32,
                lease_ms: 60_000,
                max_bytes: None,
            },
            Some(at(1)),
        )
        .await
        .expect("lease");
    assert_eq!(leased.len(), TASKS * PER_TASK);
    let before = s.commit_stats().commits;
    let chunks: Vec<Vec<LeaseRef>> = leased
        .chunks(PER_TASK)
        .map(|c| {
            c.iter()
                .map(|l| LeaseRef {
                    id: l.message.id,
                    token: l.token.clone(),
                })
                .collect()
        })
        .collect();
    let mut handles = Vec::new();
    for chunk in chunks {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            for l in chunk {
                let r = s.ack(vec![Ack::from(l)], Some(at(2))).await.expect("ack");
                assert!(r[0].is_ok(), "{r:?}");
            }
        }));
    }
    for h in handles {
        h.await.expect("acker");
    }
    let acked = s.commit_stats().commits - before;
    let stats = s.queue_stats().await.expect("stats");
    assert_eq!(stats[0].count(State::Done), TASKS as u64 * PER_TASK as u64);
    s.close().await;
    (published as f64 / n, acked as f64 / n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_share_commits() {
    let (p_alone, a_alone) = commits_per_message(false).await;
    assert_eq!((p_alone, a_alone), (1.0, 1.0), "alone: one commit per call");
    let (p, a) = commits_per_message(true).await;
    eprintln!("commits per message with group commit: publish {p:.2}, ack {a:.2}");
    assert!(
        p < 0.9 && a < 0.9,
        "publish {p:.2}, ack {a:.2} commits per message"
    );
}

/// In a batch with others, a publish refused as a whole (an idempotency conflict) fails
/// alone: the other calls of its batch commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_call_in_a_batch_fails_alone() {
    let (s, _guard) = store(true).await;
    let mut first = NewMessage::new(Q, json!("original"));
    first.idempotency_key = Some("k".into());
    s.publish(vec![first], Some(at(0))).await.expect("first");
    for _ in 0..5 {
        let mut handles = Vec::new();
        for i in 0..12 {
            let s = s.clone();
            handles.push(tokio::spawn(async move {
                let mut m = NewMessage::new(Q, json!({ "i": i }));
                if i % 4 == 0 {
                    m.idempotency_key = Some("k".into()); // another payload: a conflict
                }
                (i, s.publish(vec![m], Some(at(1))).await)
            }));
        }
        for h in handles {
            let (i, r) = h.await.expect("publisher");
            if i % 4 == 0 {
                assert!(
                    matches!(r, Err(StoreError::IdempotencyConflict { .. })),
                    "{i}: {r:?}"
                );
            } else {
                assert!(!r.expect("publish")[0].replayed);
            }
        }
    }
    let stats = s.queue_stats().await.expect("stats");
    assert_eq!(stats[0].count(State::Ready), 1 + 5 * 9, "{stats:?}");
    s.close().await;
}

/// Two stores (two nodes) publish one idempotency key at once, many times: one message per
/// key, and every answer names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_racing_on_a_key_make_one_message() {
    let guard = common::fresh_database(PREFIX);
    let opts = common::options(&guard.0, &Setup::default());
    let a = Arc::new(MysqlStore::open(opts.clone()).await.expect("open a"));
    let b = Arc::new(MysqlStore::open(opts).await.expect("open b"));
    for k in 0..20 {
        let publish = |s: Arc<MysqlStore>| async move {
            let mut m = NewMessage::new(Q, json!({ "k": k }));
            m.idempotency_key = Some(format!("key-{k}"));
            s.publish(vec![m], Some(at(0))).await.expect("publish")[0]
                .message
                .id
        };
        let (x, y): (MessageId, MessageId) = tokio::join!(publish(a.clone()), publish(b.clone()));
        assert_eq!(x, y, "key-{k}: one message");
    }
    let stats = a.queue_stats().await.expect("stats");
    assert_eq!(stats[0].count(State::Ready), 20);
    a.close().await;
    b.close().await;
}
