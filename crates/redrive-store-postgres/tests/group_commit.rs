//! Group commit: concurrent publish, ack and nack calls share commits; a call that fails
//! inside a batch fails alone; a publish racing another node on one idempotency key
//! creates one message.

mod common;

use redrive_core::{MessageId, NewMessage, State};
use redrive_storage::conformance::{at, Setup, Q};
use redrive_storage::{LeaseRef, LeaseRequest, Store, StoreError};
use redrive_store_postgres::PostgresStore;
use serde_json::json;
use std::sync::Arc;

const PREFIX: &str = "redrive_t_group";

async fn store(group_commit: bool) -> (Arc<PostgresStore>, common::SchemaGuard) {
    let guard = common::fresh_schema(PREFIX);
    let mut opts = common::options(&guard.0, &Setup::default());
    opts.pool_size = 8;
    opts.group_commit = group_commit;
    let s = PostgresStore::open(opts).await.expect("open");
    (Arc::new(s), guard)
}

/// `tasks` concurrent callers each publish `per_task` single messages one after the other,
/// then lease them all and ack each alone, concurrently: the commits each phase took.
async fn commits_per_message(group_commit: bool, tasks: usize, per_task: usize) -> (f64, f64) {
    let (s, _guard) = store(group_commit).await;
    let before = s.commit_stats().commits;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..per_task {
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
    let n = tasks * per_task;
    let published = s.commit_stats().commits - before;
    let leased = s
        .lease(
            LeaseRequest {
                queue: Q.into(),
                max: n as u32,
                lease_ms: 600_000,
                max_bytes: None,
            },
            Some(at(1)),
        )
        .await
        .expect("lease");
    assert_eq!(leased.len(), n);
    let before = s.commit_stats().commits;
    let leased = Arc::new(leased);
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (s, leased) = (s.clone(), leased.clone());
        handles.push(tokio::spawn(async move {
            for l in leased.iter().skip(t).step_by(tasks) {
                let lease = LeaseRef {
                    id: l.message.id,
                    token: l.token.clone(),
                };
                for r in s.ack(vec![lease.into()], Some(at(2))).await.expect("ack") {
                    r.expect("ack of a live lease");
                }
            }
        }));
    }
    for h in handles {
        h.await.expect("acker");
    }
    let acked = s.commit_stats().commits - before;
    let stats = s.queue_stats().await.expect("stats");
    assert_eq!(stats[0].count(State::Done), n as u64);
    s.close().await;
    (published as f64 / n as f64, acked as f64 / n as f64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_share_commits() {
    let (alone_pub, alone_ack) = commits_per_message(false, 32, 10).await;
    let (group_pub, group_ack) = commits_per_message(true, 32, 10).await;
    eprintln!(
        "commits per message, 32 concurrent callers: publish {alone_pub:.3} alone, {group_pub:.3} \
         grouped; ack {alone_ack:.3} alone, {group_ack:.3} grouped"
    );
    assert!(
        (alone_pub - 1.0).abs() < 1e-9 && (alone_ack - 1.0).abs() < 1e-9,
        "without group commit each call commits once"
    );
    assert!(
        group_pub <= 0.5 && group_ack <= 0.5,
        "group commit shared too few commits: publish {group_pub:.3}, ack {group_ack:.3} per message"
    );
}

/// Publishes with a conflicting idempotency key, batched with good ones, fail alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_call_in_a_batch_fails_alone() {
    let (s, _guard) = store(true).await;
    let mut first = NewMessage::new(Q, json!(1));
    first.idempotency_key = Some("k".into());
    s.publish(vec![first], Some(at(0))).await.expect("publish");
    let mut handles = Vec::new();
    for i in 0..40 {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            let mut m = NewMessage::new(Q, json!({ "i": i }));
            if i % 2 == 1 {
                m.idempotency_key = Some("k".into());
            }
            (
                i,
                s.publish(vec![m, NewMessage::new(Q, json!("second"))], Some(at(1)))
                    .await,
            )
        }));
    }
    for h in handles {
        let (i, r) = h.await.expect("publisher");
        match (i % 2, r) {
            (0, Ok(p)) => assert_eq!(p.len(), 2),
            (1, Err(StoreError::IdempotencyConflict { index: 0, key })) => assert_eq!(key, "k"),
            (_, other) => panic!("publish {i}: {other:?}"),
        }
    }
    let stats = s.queue_stats().await.expect("stats");
    assert_eq!(
        stats[0].count(State::Ready),
        1 + 20 * 2,
        "the conflicting publishes wrote nothing, the others all"
    );
}

/// Two stores (two nodes) publish one idempotency key at once: one message, every answer
/// names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_publishes_of_one_key_on_two_stores_make_one_message() {
    let (a, guard) = store(true).await;
    let mut opts = common::options(&guard.0, &Setup::default());
    opts.group_commit = true;
    let b = Arc::new(PostgresStore::open(opts).await.expect("open b"));
    let mut handles = Vec::new();
    for i in 0..20 {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        handles.push(tokio::spawn(async move {
            let mut m = NewMessage::new(Q, json!({"order": 1}));
            m.idempotency_key = Some("order-1".into());
            s.publish(vec![m], Some(at(0))).await.expect("publish")
        }));
    }
    let mut ids: Vec<MessageId> = Vec::new();
    let mut fresh = 0;
    for h in handles {
        let p = h.await.expect("publisher");
        ids.push(p[0].message.id);
        if !p[0].replayed {
            fresh += 1;
        }
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "one message for one key: {ids:?}");
    assert_eq!(fresh, 1, "exactly one publish was not a replay");
    let stats = a.queue_stats().await.expect("stats");
    assert_eq!(stats[0].count(State::Ready), 1);
}

/// One ack call and one nack call mixing a live lease, a wrong token, an unknown id and
/// the same lease twice (the set-based path): each item answers as it would alone, in
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_items_answer_as_alone_with_duplicates() {
    use redrive_core::{ErrorClass, Failure};
    use redrive_storage::{Nack, Settled};
    let (s, _guard) = store(true).await;
    s.publish(
        (0..3).map(|i| NewMessage::new(Q, json!(i))).collect(),
        Some(at(0)),
    )
    .await
    .expect("publish");
    let l = s
        .lease(
            LeaseRequest {
                queue: Q.into(),
                max: 3,
                lease_ms: 60_000,
                max_bytes: None,
            },
            Some(at(1)),
        )
        .await
        .expect("lease");
    let lref = |i: usize, token: Option<&str>| LeaseRef {
        id: l[i].message.id,
        token: token.unwrap_or(&l[i].token).to_owned(),
    };
    let unknown = LeaseRef {
        id: MessageId::new(),
        token: "1-x".into(),
    };
    let r = s
        .ack(
            vec![
                lref(0, None).into(),
                lref(1, Some("1-bogus")).into(),
                unknown.clone().into(),
                lref(0, None).into(),
            ],
            Some(at(2)),
        )
        .await
        .expect("ack");
    assert!(matches!(&r[0], Ok(a) if !a.repeated && a.message.state == State::Done));
    assert!(matches!(r[1], Err(StoreError::LeaseMismatch)), "{:?}", r[1]);
    assert!(matches!(r[2], Err(StoreError::NotFound(_))), "{:?}", r[2]);
    assert!(matches!(&r[3], Ok(a) if a.repeated), "{:?}", r[3]);
    let nack = |lease: LeaseRef| Nack {
        lease,
        failure: Failure::new(ErrorClass::Transient, "x"),
        response: None,
        waited: Vec::new(),
    };
    let r = s
        .nack(
            vec![
                nack(lref(1, None)),
                nack(lref(1, None)),
                nack(lref(0, None)),
                nack(unknown),
            ],
            Some(at(3)),
        )
        .await
        .expect("nack");
    assert!(
        matches!(&r[0], Ok(f) if f.message.state == State::Scheduled),
        "{:?}",
        r[0]
    );
    assert!(
        matches!(r[1], Err(StoreError::LeaseSettled(Settled::Nacked))),
        "{:?}",
        r[1]
    );
    assert!(
        matches!(r[2], Err(StoreError::LeaseSettled(Settled::Acked))),
        "{:?}",
        r[2]
    );
    assert!(matches!(r[3], Err(StoreError::NotFound(_))), "{:?}", r[3]);
    let m1 = s.get(l[1].message.id).await.expect("get").expect("m1");
    assert_eq!(m1.history.len(), 1, "one failed attempt: {:?}", m1.history);
    let m0 = s.get(l[0].message.id).await.expect("get").expect("m0");
    assert_eq!(m0.history.len(), 1, "one ack: {:?}", m0.history);
    let m2 = s.get(l[2].message.id).await.expect("get").expect("m2");
    assert_eq!(m2.state, State::Leased, "untouched");
}

/// A publish of many items (the set-based path): a key used twice in the call replays its
/// first use, a key of an earlier call replays that message, another payload under a key
/// conflicts naming its index and writes nothing, and the items keep their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_of_many_items_answers_as_item_by_item() {
    let (s, _guard) = store(true).await;
    let keyed = |k: &str, p: serde_json::Value| NewMessage {
        idempotency_key: Some(k.to_owned()),
        ..NewMessage::new(Q, p)
    };
    let earlier = s
        .publish(vec![keyed("old", json!("o"))], Some(at(0)))
        .await
        .expect("publish")
        .remove(0)
        .message;
    let r = s
        .publish(
            vec![
                keyed("k1", json!(1)),
                NewMessage::new(Q, json!(2)),
                keyed("k1", json!(1)),
                keyed("old", json!("o")),
            ],
            Some(at(1)),
        )
        .await
        .expect("publish");
    assert!(!r[0].replayed && !r[1].replayed);
    assert!(
        r[2].replayed && r[2].message.id == r[0].message.id,
        "{:?}",
        r[2]
    );
    assert!(r[3].replayed && r[3].message.id == earlier.id, "{:?}", r[3]);
    match s
        .publish(
            vec![NewMessage::new(Q, json!("x")), keyed("k1", json!("other"))],
            Some(at(2)),
        )
        .await
    {
        Err(StoreError::IdempotencyConflict { index: 1, key }) => assert_eq!(key, "k1"),
        other => panic!("another payload under k1: {other:?}"),
    }
    let big: Vec<NewMessage> = (0..1_000).map(|i| NewMessage::new(Q, json!(i))).collect();
    let started = std::time::Instant::now();
    s.publish(big, Some(at(3))).await.expect("publish 1,000");
    eprintln!("one publish of 1,000 items: {:?}", started.elapsed());
    let leased = s
        .lease(
            LeaseRequest {
                queue: Q.into(),
                max: 2_000,
                lease_ms: 60_000,
                max_bytes: None,
            },
            Some(at(4)),
        )
        .await
        .expect("lease");
    let payloads: Vec<serde_json::Value> =
        leased.iter().map(|l| l.message.payload.clone()).collect();
    let mut expected = vec![json!("o"), json!(1), json!(2)];
    expected.extend((0..1_000).map(|i| json!(i)));
    assert_eq!(
        payloads, expected,
        "publish order kept, nothing of the refused call written"
    );
}

/// Single acks and nacks sent at once (each push call settles alone) are merged into one
/// set-based call per kind inside a batch: every call still answers as it would alone,
/// with its wait notes written, a wrong token refused alone, and fewer commits than calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_settles_merged_in_a_batch_answer_as_alone() {
    use redrive_core::{ErrorClass, Failure, HistoryEvent, Waited, WaitedFor};
    use redrive_storage::{Ack, Nack};
    let (s, _guard) = store(true).await;
    let n = 60;
    s.publish(
        (0..n).map(|i| NewMessage::new(Q, json!(i))).collect(),
        Some(at(0)),
    )
    .await
    .expect("publish");
    let leased = s
        .lease(
            LeaseRequest {
                queue: Q.into(),
                max: n as u32,
                lease_ms: 60_000,
                max_bytes: None,
            },
            Some(at(1)),
        )
        .await
        .expect("lease");
    let commits_before = s.commit_stats().commits;
    let mut handles = Vec::new();
    for (i, l) in leased.into_iter().enumerate() {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            let token = if i % 5 == 4 {
                "1-wrong".to_owned()
            } else {
                l.token.clone()
            };
            let lease = LeaseRef {
                id: l.message.id,
                token,
            };
            let waited = if i % 3 == 0 {
                vec![Waited {
                    waited_for: WaitedFor::Breaker,
                    since: at(1),
                    parked: false,
                }]
            } else {
                Vec::new()
            };
            let r = if i % 2 == 0 {
                s.ack(
                    vec![Ack {
                        waited,
                        ..Ack::from(lease)
                    }],
                    Some(at(2)),
                )
                .await
                .map(|mut v| v.remove(0).map(|a| a.message.state))
            } else {
                s.nack(
                    vec![Nack {
                        lease,
                        failure: Failure::new(ErrorClass::Transient, "x"),
                        response: None,
                        waited,
                    }],
                    Some(at(2)),
                )
                .await
                .map(|mut v| v.remove(0).map(|f| f.message.state))
            };
            (i, l.message.id, r.expect("no store fault"))
        }));
    }
    for h in handles {
        let (i, id, r) = h.await.expect("settler");
        match (i % 5 == 4, i % 2 == 0, r) {
            (true, _, Err(StoreError::LeaseMismatch)) => {}
            (false, true, Ok(State::Done)) | (false, false, Ok(State::Scheduled)) => {}
            (_, _, other) => panic!("settle {i}: {other:?}"),
        }
        let m = s.get(id).await.expect("get").expect("message");
        let notes = m
            .history
            .iter()
            .filter(|h| matches!(h.event, HistoryEvent::Waited { .. }))
            .count();
        let expected = usize::from(i % 3 == 0 && i % 5 != 4);
        assert_eq!(notes, expected, "wait notes of {i}: {:?}", m.history);
    }
    let commits = s.commit_stats().commits - commits_before;
    eprintln!("{n} single settles at once: {commits} commits");
    assert!(commits < n as u64, "{commits} commits for {n} settles");
}
