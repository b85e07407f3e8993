//! Transactional enqueue: the SQL function `<schema>.publish(…)` called in an application's
//! own transaction, on its own connection (not the store's): the message exists if and only
//! if the transaction commits, the store's notifier hears of it at commit (a ready message
//! as a ready notice, a delayed one as an earlier wake-up), idempotency keys are one record
//! for the function and the store's own publish, per-key order holds across both, and bad
//! arguments are refused by name with nothing written.

mod common;

use redrive_core::{MessageId, NewMessage, State};
use redrive_storage::conformance::{Setup, ORDERED, Q};
use redrive_storage::{Ack, LeaseRef, LeaseRequest, Store};
use redrive_store_postgres::PostgresStore;
use serde_json::json;
use std::time::Duration;
use tokio_postgres::Client;

const PREFIX: &str = "redrive_t_sqlpub";

/// A store on a fresh schema, and an application's connection to the same database.
async fn setup() -> (PostgresStore, Client, common::SchemaGuard) {
    let (store, guard) = common::open(PREFIX, Setup::default()).await;
    let client = common::connect().await;
    (store, client, guard)
}

fn req(queue: &str) -> LeaseRequest {
    LeaseRequest {
        queue: queue.to_owned(),
        max: 10,
        lease_ms: 60_000,
        max_bytes: None,
    }
}

/// `SELECT <schema>.publish(<args>)` in the transaction of `client`.
async fn publish_sql(
    tx: &tokio_postgres::Transaction<'_>,
    schema: &str,
    args: &str,
) -> Result<String, tokio_postgres::Error> {
    let row = tx
        .query_one(&format!("SELECT {schema}.publish({args})"), &[])
        .await?;
    Ok(row.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_publish_is_delivered_and_its_notice_arrives_at_commit() {
    let (store, mut app, guard) = setup().await;
    let mut ready = store.notifier().ready();
    let tx = app.transaction().await.unwrap();
    tx.batch_execute("CREATE TEMP TABLE orders (id int)")
        .await
        .unwrap();
    tx.execute("INSERT INTO orders VALUES (42)", &[])
        .await
        .unwrap();
    let id = publish_sql(
        &tx,
        &guard.0,
        &format!(
            "'{Q}', '{{\"order\": 42}}', key => 'c-7', headers => '{{\"trace\": \"t1\"}}', \
             priority => 3"
        ),
    )
    .await
    .unwrap();
    let id: MessageId = id.parse().expect("the function answers a message id");
    // Not yet committed: not leasable, not told.
    assert!(store.lease(req(Q), None).await.unwrap().is_empty());
    assert!(
        tokio::time::timeout(Duration::from_millis(300), ready.recv())
            .await
            .is_err(),
        "a notice before the commit"
    );
    tx.commit().await.unwrap();
    let notice = tokio::time::timeout(Duration::from_secs(5), ready.recv())
        .await
        .expect("a ready notice at commit")
        .unwrap();
    assert_eq!((notice.queue.as_str(), notice.count), (Q, 1));
    let leased = store.lease(req(Q), None).await.unwrap();
    assert_eq!(leased.len(), 1);
    let m = &leased[0].message;
    assert_eq!(m.id, id);
    assert_eq!(m.payload, json!({"order": 42}));
    assert_eq!(m.key.as_deref(), Some("c-7"));
    assert_eq!(m.priority, 3);
    assert_eq!(m.headers.get("trace").map(String::as_str), Some("t1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_publish_leaves_nothing_and_tells_nobody() {
    let (store, mut app, guard) = setup().await;
    let mut ready = store.notifier().ready();
    let tx = app.transaction().await.unwrap();
    let id = publish_sql(
        &tx,
        &guard.0,
        &format!("'{Q}', '1', idempotency_key => 'k'"),
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    assert!(store.get(id.parse().unwrap()).await.unwrap().is_none());
    assert!(store.lease(req(Q), None).await.unwrap().is_empty());
    assert!(
        tokio::time::timeout(Duration::from_millis(500), ready.recv())
            .await
            .is_err(),
        "a rolled-back publish sent a notice"
    );
    // The key was not taken either: a publish of it with another payload is new.
    let p = store
        .publish(
            vec![NewMessage {
                idempotency_key: Some("k".into()),
                ..NewMessage::new(Q, json!(2))
            }],
            None,
        )
        .await
        .unwrap();
    assert!(!p[0].replayed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_are_one_record_for_both_paths() {
    let (store, mut app, guard) = setup().await;
    // HTTP path first, then SQL with the same JSON written differently: the first id.
    let first = store
        .publish(
            vec![NewMessage {
                idempotency_key: Some("pay-1".into()),
                ..NewMessage::new(Q, json!({"b": [1, 2], "a": "x"}))
            }],
            None,
        )
        .await
        .unwrap();
    let tx = app.transaction().await.unwrap();
    let again = publish_sql(
        &tx,
        &guard.0,
        &format!("'{Q}', '{{\"a\":\"x\",  \"b\":[1,2]}}', idempotency_key => 'pay-1'"),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(again, first[0].message.id.to_string());
    // Another payload under the key: refused, naming the key (23505), nothing written.
    let tx = app.transaction().await.unwrap();
    let err = publish_sql(
        &tx,
        &guard.0,
        &format!("'{Q}', '3', idempotency_key => 'pay-1'"),
    )
    .await
    .unwrap_err();
    let db = err.as_db_error().expect("a database error");
    assert_eq!(db.code().code(), "23505");
    assert!(db.message().contains("pay-1"), "{}", db.message());
    drop(tx);
    // SQL path first, then the store's own publish: replayed, the function's id.
    let tx = app.transaction().await.unwrap();
    let sql_id = publish_sql(
        &tx,
        &guard.0,
        &format!("'{Q}', '[1, 2]', idempotency_key => 'pay-2'"),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let replay = store
        .publish(
            vec![NewMessage {
                idempotency_key: Some("pay-2".into()),
                ..NewMessage::new(Q, json!([1, 2]))
            }],
            None,
        )
        .await
        .unwrap();
    assert!(replay[0].replayed);
    assert_eq!(replay[0].message.id.to_string(), sql_id);
    // And in a batch (the set-based path computes the same fingerprint).
    let batch = store
        .publish(
            vec![
                NewMessage::new(Q, json!("other")),
                NewMessage {
                    idempotency_key: Some("pay-2".into()),
                    ..NewMessage::new(Q, json!([1, 2]))
                },
            ],
            None,
        )
        .await
        .unwrap();
    assert!(batch[1].replayed);
    assert_eq!(batch[1].message.id.to_string(), sql_id);
    let conflict = store
        .publish(
            vec![
                NewMessage::new(Q, json!("other")),
                NewMessage {
                    idempotency_key: Some("pay-2".into()),
                    ..NewMessage::new(Q, json!([2, 1]))
                },
            ],
            None,
        )
        .await;
    assert!(conflict.is_err(), "{conflict:?}");
    // Two messages in all, besides the two "other" ones.
    let stats = store.queue_stats().await.unwrap();
    let total: u64 = stats
        .iter()
        .filter(|s| s.queue == Q)
        .map(|s| s.count(State::Ready))
        .sum();
    assert_eq!(total, 3, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_publish_moves_the_schedulers_wake_up_and_falls_due() {
    let (store, mut app, guard) = setup().await;
    let mut due = store.notifier().due();
    due.borrow_and_update();
    let before = redrive_core::Timestamp::now().as_millis();
    let tx = app.transaction().await.unwrap();
    publish_sql(
        &tx,
        &guard.0,
        &format!("'{Q}', '\"later\"', delay => interval '500 milliseconds'"),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    // The store's health probe also keeps the hint at most 1 s ahead (leases of other
    // nodes send no notice): only the publish's own notice brings it under 800 ms.
    let at = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            due.changed().await.unwrap();
            if let Some(at) = *due.borrow() {
                if at.as_millis() - before <= 800 {
                    return at;
                }
            }
        }
    })
    .await
    .expect("the wake-up moved to the message's due time at commit");
    assert!(
        at.as_millis() - before >= 495,
        "wake-up {at:?} is before the message is due ({before} + 500 ms)"
    );
    assert!(store.lease(req(Q), None).await.unwrap().is_empty(), "early");
    let stats = store.queue_stats().await.unwrap();
    assert_eq!(
        stats.iter().map(|s| s.count(State::Scheduled)).sum::<u64>(),
        1
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    store.tick(None).await.unwrap();
    let leased = store.lease(req(Q), None).await.unwrap();
    assert_eq!(leased.len(), 1);
    assert_eq!(leased[0].message.payload, json!("later"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_holds_across_both_paths() {
    let (store, mut app, guard) = setup().await;
    // HTTP path, then two from SQL, then HTTP again: one key, one at a time, in order.
    store
        .publish(
            vec![NewMessage {
                key: Some("k".into()),
                ..NewMessage::new(ORDERED, json!(1))
            }],
            None,
        )
        .await
        .unwrap();
    let tx = app.transaction().await.unwrap();
    for n in [2, 3] {
        publish_sql(&tx, &guard.0, &format!("'{ORDERED}', '{n}', key => 'k'"))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    store
        .publish(
            vec![NewMessage {
                key: Some("k".into()),
                ..NewMessage::new(ORDERED, json!(4))
            }],
            None,
        )
        .await
        .unwrap();
    // A key with nothing before it: the function makes its message the head.
    let tx = app.transaction().await.unwrap();
    publish_sql(
        &tx,
        &guard.0,
        &format!("'{ORDERED}', '\"solo\"', key => 'other'"),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let mut seen = Vec::new();
    loop {
        let leased = store.lease(req(ORDERED), None).await.unwrap();
        if leased.is_empty() {
            break;
        }
        let of_k = leased
            .iter()
            .filter(|l| l.message.key.as_deref() == Some("k"))
            .count();
        assert!(of_k <= 1, "{of_k} messages of one key leased at once");
        for l in &leased {
            seen.push(l.message.payload.clone());
        }
        let acks = leased
            .iter()
            .map(|l| {
                Ack::from(LeaseRef {
                    id: l.message.id,
                    token: l.token.clone(),
                })
            })
            .collect();
        for r in store.ack(acks, None).await.unwrap() {
            r.unwrap();
        }
    }
    let keyed: Vec<_> = seen.iter().filter(|p| **p != json!("solo")).collect();
    assert_eq!(keyed, [&json!(1), &json!(2), &json!(3), &json!(4)]);
    assert_eq!(seen.len(), 5);
    assert_eq!(
        seen[0..2].iter().filter(|p| **p == json!("solo")).count(),
        1,
        "{seen:?}"
    );
    for s in store.queue_stats().await.unwrap() {
        if s.queue == ORDERED {
            assert_eq!(s.count(State::Done), 5, "{s:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_are_refused_by_name_and_write_nothing() {
    let (store, mut app, guard) = setup().await;
    let big = "x".repeat((1 << 20) + 1);
    let cases: Vec<(String, &str, &str)> = vec![
        ("'no spaces', '1'".to_owned(), "22023", "queue"),
        ("NULL, '1'".to_owned(), "22023", "queue"),
        (format!("'{Q}', NULL"), "22023", "payload"),
        (format!("'{Q}', '1', priority => 12"), "22023", "priority"),
        (format!("'{Q}', '1', key => ''"), "22023", "key"),
        (
            format!("'{Q}', '1', idempotency_key => ''"),
            "22023",
            "idempotency_key",
        ),
        (
            format!("'{Q}', '1', delay => interval '-1 second'"),
            "22023",
            "delay",
        ),
        (
            format!("'{Q}', '1', delay => interval '400 days'"),
            "22023",
            "max_schedule_ahead",
        ),
        (format!("'{Q}', '1', headers => '[1]'"), "22023", "headers"),
        (
            format!("'{Q}', '1', headers => '{{\"a\": 1}}'"),
            "22023",
            "headers",
        ),
        (format!("'{Q}', '\"{big}\"'"), "54000", "max_payload_bytes"),
        // jsonb takes these; the server's JSON reader does not (schema step 9).
        (format!("'{Q}', '[1e400]'"), "22023", "1e308"),
        (format!("'{Q}', '{{\"a\": -1e308}}'"), "22023", "1e308"),
        (
            format!("'{Q}', '{}{}'", "[".repeat(128), "]".repeat(128)),
            "22023",
            "127",
        ),
    ];
    for (args, code, names) in cases {
        let tx = app.transaction().await.unwrap();
        let err = publish_sql(&tx, &guard.0, &args).await.unwrap_err();
        let db = err.as_db_error().unwrap_or_else(|| panic!("{args}: {err}"));
        assert_eq!(db.code().code(), code, "{args}: {}", db.message());
        assert!(db.message().contains(names), "{args}: {}", db.message());
        drop(tx);
    }
    let stats = store.queue_stats().await.unwrap();
    assert!(stats.iter().all(|s| s.counts == [0; 5]), "{stats:?}");
}

/// What is just inside what the server reads back (127 nested arrays, a number near the
/// largest 64-bit float) is taken, and leased as it was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deepest_and_largest_readable_payloads_are_taken_and_leased() {
    let (store, mut app, guard) = setup().await;
    let deep = format!("{}1{}", "[".repeat(127), "]".repeat(127));
    let tx = app.transaction().await.unwrap();
    publish_sql(&tx, &guard.0, &format!("'{Q}', '{deep}'"))
        .await
        .unwrap();
    publish_sql(
        &tx,
        &guard.0,
        &format!("'{Q}', '[9.9e307, -9.9e307, 1e-400]'"),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let leased = store.lease(req(Q), None).await.unwrap();
    assert_eq!(leased.len(), 2);
    let payloads: Vec<serde_json::Value> =
        leased.iter().map(|l| l.message.payload.clone()).collect();
    let deep: serde_json::Value = serde_json::from_str(&deep).unwrap();
    assert!(payloads.contains(&deep), "{payloads:?}");
    // 1e-400 is read as 0, as the HTTP path reads it.
    assert!(
        payloads.contains(&json!([9.9e307, -9.9e307, 0.0])),
        "{payloads:?}"
    );
}

/// Keys on a queue without per-key ordering do not wait behind each other from SQL either,
/// while another queue of the schema keeps per-key order (schema step 8: step 3 read the
/// mode as `Unordered` and made every keyed SQL publish wait behind its key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_on_an_unordered_queue_do_not_wait_from_sql() {
    let (store, mut app, guard) = setup().await;
    let tx = app.transaction().await.unwrap();
    for n in [1, 2] {
        publish_sql(&tx, &guard.0, &format!("'{Q}', '{n}', key => 'same'"))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let got = store.lease(req(Q), None).await.unwrap();
    assert_eq!(
        got.len(),
        2,
        "both messages of key `same` leasable at once: {got:?}"
    );
}
