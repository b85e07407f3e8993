//! Transactional enqueue on MySQL / MariaDB: the procedures `redrive_publish(…)` and
//! `redrive_publish_out(…)` called on an application's own connection (not the store's),
//! at the server's default isolation (`REPEATABLE READ`): the message exists if and only if
//! the caller's transaction commits, a store's poller tells of it within a poll, a lone
//! `CALL` is atomic, idempotency keys are one record for the procedure and the store's own
//! publish (fingerprints by the database on both paths; the FNV-1a records of schema v3
//! still answered over HTTP), per-key order holds across both, a delayed message falls due,
//! every bad argument is refused by name with nothing written, what the procedure takes the
//! store can read, and the PHP PDO example (`examples/pdo_publish_mysql.php`) commits one
//! order with its message and rolls the other back.

mod common;

use mysql_async::prelude::Queryable;
use redrive_core::{MessageId, NewMessage, SplitMix64, State};
use redrive_storage::conformance::{Setup, ORDERED, Q};
use redrive_storage::{Ack, LeaseRef, LeaseRequest, Store, StoreError};
use redrive_store_mysql::{MysqlStore, SqlPublishLimits};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const PREFIX: &str = "sqlpub";

/// A store on a fresh database, and an application's connection to it (the server's
/// session defaults: autocommit, `REPEATABLE READ`).
async fn setup() -> (MysqlStore, mysql_async::Conn, common::DbGuard) {
    let (store, guard) = common::open(PREFIX, Setup::default()).await;
    let app = app(&guard.0).await;
    (store, app, guard)
}

async fn app(db: &str) -> mysql_async::Conn {
    let opts = mysql_async::Opts::from_url(&common::url_of(db)).expect("url");
    mysql_async::Conn::new(opts).await.expect("connect")
}

fn req(queue: &str) -> LeaseRequest {
    LeaseRequest {
        queue: queue.to_owned(),
        max: 10,
        lease_ms: 60_000,
        max_bytes: None,
    }
}

/// `CALL redrive_publish(<args>)` on `c`: the id it answers.
async fn call(c: &mut mysql_async::Conn, args: &str) -> Result<String, mysql_async::Error> {
    let id: Option<String> = c
        .query_first(format!("CALL redrive_publish({args})"))
        .await?;
    Ok(id.expect("redrive_publish answers a row"))
}

/// The server error of a refused call: (SQLSTATE, error code, message).
fn refusal(r: Result<String, mysql_async::Error>, what: &str) -> (String, u16, String) {
    match r {
        Err(mysql_async::Error::Server(e)) => (e.state, e.code, e.message),
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

/// `SELECT COUNT(*) FROM <table> [WHERE …]` on `c`.
async fn count(c: &mut mysql_async::Conn, from: &str) -> i64 {
    c.query_first(format!("SELECT COUNT(*) FROM {from}"))
        .await
        .expect("count")
        .expect("a row")
}

/// SQL text literal of `s` (single quotes doubled, backslashes doubled).
fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

async fn ack_all(store: &MysqlStore, leased: &[redrive_storage::Leased]) {
    let acks = leased
        .iter()
        .map(|l| {
            Ack::from(LeaseRef {
                id: l.message.id,
                token: l.token.clone(),
            })
        })
        .collect();
    for r in store.ack(acks, None).await.expect("ack") {
        r.expect("ack item");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_publish_is_leased_and_the_poller_tells_of_it_within_a_poll() {
    let (store, mut app, _guard) = setup().await;
    let mut ready = store.notifier().ready();
    // The application's own counter far from the store's, so that a clobbered
    // LAST_INSERT_ID() shows.
    app.query_drop(
        "CREATE TABLE orders (n INT AUTO_INCREMENT PRIMARY KEY, total INT) AUTO_INCREMENT = 1000",
    )
    .await
    .unwrap();
    let before = redrive_core::Timestamp::now().as_millis();
    app.query_drop("START TRANSACTION").await.unwrap();
    app.query_drop("INSERT INTO orders (total) VALUES (99)")
        .await
        .unwrap();
    let own: u64 = app
        .query_first("SELECT LAST_INSERT_ID()")
        .await
        .unwrap()
        .unwrap();
    let id = call(
        &mut app,
        &format!("'{Q}', '{{\"order\": 42, \"name\": \"Zoë\"}}', 'c-7', NULL, NULL, 3, '{{\"trace\": \"t1\"}}'"),
    )
    .await
    .unwrap();
    // The caller's LAST_INSERT_ID() is still its own row's.
    let after_call: u64 = app
        .query_first("SELECT LAST_INSERT_ID()")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((own, after_call), (1000, 1000));
    // A UUIDv7 of the database's clock, as the server's own ids.
    let parsed: MessageId = id.parse().expect("the procedure answers a message id");
    let uuid = uuid_bits(&id);
    assert_eq!((uuid >> 76) & 0xf, 7, "version 7: {id}");
    assert_eq!((uuid >> 62) & 0b11, 0b10, "RFC 4122 variant: {id}");
    let ms = (uuid >> 80) as i64;
    assert!(
        (before - 2_000..=redrive_core::Timestamp::now().as_millis() + 2_000).contains(&ms),
        "the id's time {ms} is now ({before})"
    );
    assert_eq!(id, id.to_lowercase());
    // Not committed: not leasable, not told.
    assert!(store.lease(req(Q), None).await.unwrap().is_empty());
    assert!(
        tokio::time::timeout(Duration::from_millis(600), ready.recv())
            .await
            .is_err(),
        "a notice before the commit"
    );
    app.query_drop("COMMIT").await.unwrap();
    let committed = Instant::now();
    // The store's poller (every 250 ms) finds the row another writer made ready.
    let notice = tokio::time::timeout(Duration::from_secs(5), ready.recv())
        .await
        .expect("a ready notice after the commit")
        .unwrap();
    let took = committed.elapsed();
    assert_eq!((notice.queue.as_str(), notice.count), (Q, 1));
    assert!(
        took < Duration::from_millis(900),
        "the poller told of the message {took:?} after the commit (polling every 250 ms)"
    );
    println!("sql publish: the store's poller told of the committed message {took:?} after COMMIT");
    let leased = store.lease(req(Q), None).await.unwrap();
    assert_eq!(leased.len(), 1);
    let m = &leased[0].message;
    assert_eq!(m.id, parsed);
    assert_eq!(m.payload, json!({"order": 42, "name": "Zoë"}));
    assert_eq!(m.key.as_deref(), Some("c-7"));
    assert_eq!(m.priority, 3);
    assert_eq!(m.attempts, 1);
    assert_eq!(m.headers.get("trace").map(String::as_str), Some("t1"));
    assert!(m.history.iter().all(|h| h.attempt == 1), "{:?}", m.history);
    let created = m.created_at.as_millis();
    assert!(
        (before - 2_000..=before + 10_000).contains(&created),
        "{created}"
    );
    // The OUT form answers through a variable.
    app.query_drop(format!(
        "CALL redrive_publish_out('{Q}', '\"out\"', NULL, NULL, NULL, NULL, NULL, @id)"
    ))
    .await
    .unwrap();
    let out: String = app.query_first("SELECT @id").await.unwrap().unwrap();
    let got = store
        .get(out.parse().unwrap())
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(got.payload, json!("out"));
    assert_eq!(got.state, State::Ready);
}

/// The 128 bits of a hyphenated UUID.
fn uuid_bits(id: &str) -> u128 {
    u128::from_str_radix(&id.replace('-', ""), 16).expect("hex")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_publish_leaves_nothing_and_tells_nobody() {
    let (store, mut app, _guard) = setup().await;
    let mut ready = store.notifier().ready();
    app.query_drop("START TRANSACTION").await.unwrap();
    let id = call(
        &mut app,
        &format!("'{ORDERED}', '1', 'k', 'ik', NULL, NULL, '{{\"h\": \"v\"}}'"),
    )
    .await
    .unwrap();
    let delayed = call(
        &mut app,
        &format!("'{Q}', '2', NULL, NULL, 5000, NULL, NULL"),
    )
    .await
    .unwrap();
    app.query_drop("ROLLBACK").await.unwrap();
    for id in [&id, &delayed] {
        assert!(store.get(id.parse().unwrap()).await.unwrap().is_none());
    }
    assert!(store.lease(req(ORDERED), None).await.unwrap().is_empty());
    for table in ["messages", "history", "ready", "idempotency", "key_heads"] {
        assert_eq!(count(&mut app, table).await, 0, "rows left in {table}");
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(800), ready.recv())
            .await
            .is_err(),
        "a rolled-back publish woke a poller"
    );
    // The key was not taken either: a publish of it with another payload is new.
    let p = store
        .publish(
            vec![NewMessage {
                idempotency_key: Some("ik".into()),
                ..NewMessage::new(ORDERED, json!(2))
            }],
            None,
        )
        .await
        .unwrap();
    assert!(!p[0].replayed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_outside_a_transaction_is_atomic_and_autocommit_off_is_the_callers() {
    let (store, mut app, _guard) = setup().await;
    // Autocommit, no transaction: the CALL commits alone, all of it.
    let id = call(
        &mut app,
        &format!("'{ORDERED}', '\"alone\"', 'solo', NULL, NULL, NULL, NULL"),
    )
    .await
    .unwrap();
    let leased = store.lease(req(ORDERED), None).await.unwrap();
    assert_eq!(leased.len(), 1);
    assert_eq!(leased[0].message.id.to_string(), id);
    // A refusal after the key's lock point was written (an idempotency conflict) leaves
    // nothing behind either: the procedure's own transaction is rolled back.
    store
        .publish(
            vec![NewMessage {
                idempotency_key: Some("taken".into()),
                ..NewMessage::new(ORDERED, json!(1))
            }],
            None,
        )
        .await
        .unwrap();
    let heads = count(&mut app, "key_heads").await;
    let (state, _, message) = refusal(
        call(
            &mut app,
            &format!("'{ORDERED}', '2', 'fresh-key', 'taken', NULL, NULL, NULL"),
        )
        .await,
        "conflict",
    );
    assert_eq!(state, "23000", "{message}");
    assert_eq!(
        count(&mut app, "key_heads").await,
        heads,
        "a lock point was left"
    );
    let in_tx: i64 = app
        .query_first("SELECT @@in_transaction")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(in_tx, 0, "the procedure left a transaction open");
    // Autocommit off: the caller's implicit transaction holds the message until it ends.
    app.query_drop("SET autocommit = 0").await.unwrap();
    let gone = call(
        &mut app,
        &format!("'{Q}', '\"not kept\"', NULL, NULL, NULL, NULL, NULL"),
    )
    .await
    .unwrap();
    app.query_drop("ROLLBACK").await.unwrap();
    assert!(store.get(gone.parse().unwrap()).await.unwrap().is_none());
    let kept = call(
        &mut app,
        &format!("'{Q}', '\"kept\"', NULL, NULL, NULL, NULL, NULL"),
    )
    .await
    .unwrap();
    assert!(
        store.get(kept.parse().unwrap()).await.unwrap().is_none(),
        "visible before the caller's commit"
    );
    app.query_drop("COMMIT").await.unwrap();
    assert!(store.get(kept.parse().unwrap()).await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_are_one_record_for_both_paths() {
    let (store, mut app, _guard) = setup().await;
    // The store's path first, then SQL with the same JSON written otherwise (spacing, key
    // order, number spelling): the first id, nothing new.
    let first = store
        .publish(
            vec![NewMessage {
                idempotency_key: Some("pay-1".into()),
                ..NewMessage::new(Q, json!({"b": [1, 2.5], "a": "x", "é": "ü"}))
            }],
            None,
        )
        .await
        .unwrap();
    app.query_drop("START TRANSACTION").await.unwrap();
    let again = call(
        &mut app,
        &format!("'{Q}', '{{\"é\":\"ü\",  \"a\" : \"x\", \"b\":[1.0, 25e-1]}}', NULL, 'pay-1', NULL, NULL, NULL"),
    )
    .await
    .unwrap();
    app.query_drop("COMMIT").await.unwrap();
    assert_eq!(again, first[0].message.id.to_string());
    // Another payload under the key: refused naming the key, the transaction goes on.
    app.query_drop("START TRANSACTION").await.unwrap();
    let (state, code, message) = refusal(
        call(
            &mut app,
            &format!("'{Q}', '3', NULL, 'pay-1', NULL, NULL, NULL"),
        )
        .await,
        "another payload",
    );
    assert_eq!((state.as_str(), code), ("23000", 1644), "{message}");
    assert!(
        message.contains("'pay-1'") && message.contains("another payload"),
        "{message}"
    );
    app.query_drop("ROLLBACK").await.unwrap();
    // Strings are compared as written: "a/b" and "a\/b" are the same string to a JSON
    // reader, two payloads to the fingerprint (the documented limit).
    store
        .publish(
            vec![NewMessage {
                idempotency_key: Some("esc".into()),
                ..NewMessage::new(Q, json!({"url": "a/b"}))
            }],
            None,
        )
        .await
        .unwrap();
    let (state, _, _) = refusal(
        call(
            &mut app,
            &format!(
                "'{Q}', {}, NULL, 'esc', NULL, NULL, NULL",
                lit(r#"{"url": "a\/b"}"#)
            ),
        )
        .await,
        "an escaped slash",
    );
    assert_eq!(state, "23000");
    // SQL first, then the store's own publish: replayed with the procedure's id, alone and
    // in a batch; another payload in a batch is a conflict.
    let sql_id = call(
        &mut app,
        &format!("'{Q}', '[1, {{\"z\": null, \"y\": true}}]', NULL, 'pay-2', NULL, NULL, NULL"),
    )
    .await
    .unwrap();
    let same = json!([1, {"y": true, "z": null}]);
    let replay = store
        .publish(
            vec![NewMessage {
                idempotency_key: Some("pay-2".into()),
                ..NewMessage::new(Q, same.clone())
            }],
            None,
        )
        .await
        .unwrap();
    assert!(replay[0].replayed);
    assert_eq!(replay[0].message.id.to_string(), sql_id);
    let batch = store
        .publish(
            vec![
                NewMessage::new(Q, json!("other")),
                NewMessage {
                    idempotency_key: Some("pay-2".into()),
                    ..NewMessage::new(Q, same.clone())
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
                    ..NewMessage::new(Q, json!([1, {"y": false, "z": null}]))
                },
            ],
            None,
        )
        .await;
    assert!(
        matches!(
            conflict,
            Err(StoreError::IdempotencyConflict { index: 1, .. })
        ),
        "{conflict:?}"
    );
    // A record whose window has passed is replaced: a new message.
    app.query_drop("UPDATE idempotency SET expires_at = 0 WHERE ikey = 'pay-2'")
        .await
        .unwrap();
    let fresh = call(
        &mut app,
        &format!("'{Q}', '\"new\"', NULL, 'pay-2', NULL, NULL, NULL"),
    )
    .await
    .unwrap();
    assert_ne!(fresh, sql_id);
    let record: String = app
        .query_first("SELECT message_id FROM idempotency WHERE ikey = 'pay-2'")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record, fresh);
    // A payload nested past what MariaDB reads (only the store's path can publish it) has a
    // fingerprint too: replayed when the same, a conflict when not.
    let deep = |leaf: i64| (0..40).fold(json!(leaf), |v, _| json!([v]));
    let keyed = |v: Value| NewMessage {
        idempotency_key: Some("deep".into()),
        ..NewMessage::new(Q, v)
    };
    let d1 = store.publish(vec![keyed(deep(1))], None).await.unwrap();
    let d2 = store.publish(vec![keyed(deep(1))], None).await.unwrap();
    assert!(d2[0].replayed && d2[0].message.id == d1[0].message.id);
    let d3 = store.publish(vec![keyed(deep(2))], None).await;
    assert!(
        matches!(d3, Err(StoreError::IdempotencyConflict { .. })),
        "{d3:?}"
    );
    // Messages in all: pay-1, esc, pay-2 (SQL), "other", pay-2 again, deep.
    let stats = store.queue_stats().await.unwrap();
    let total: u64 = stats.iter().map(|s| s.count(State::Ready)).sum();
    assert_eq!(total, 6, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_schema_v3_answer_over_http_and_v4_is_applied_again_on_a_v3_database() {
    let (store, mut app, guard) = setup().await;
    // A record as schema v3 wrote it: the FNV-1a of the payload's text.
    let p = store
        .publish(
            vec![NewMessage {
                idempotency_key: Some("old".into()),
                ..NewMessage::new(Q, json!({"a": 1}))
            }],
            None,
        )
        .await
        .unwrap();
    let fnv = format!("{:016x}", redrive_core::fnv1a(br#"{"a":1}"#));
    app.query_drop(format!(
        "UPDATE idempotency SET fingerprint = '{fnv}' WHERE ikey = 'old'"
    ))
    .await
    .unwrap();
    let replay = store
        .publish(
            vec![NewMessage {
                idempotency_key: Some("old".into()),
                ..NewMessage::new(Q, json!({"a": 1}))
            }],
            None,
        )
        .await
        .unwrap();
    assert!(replay[0].replayed);
    assert_eq!(replay[0].message.id, p[0].message.id);
    let other = store
        .publish(
            vec![NewMessage {
                idempotency_key: Some("old".into()),
                ..NewMessage::new(Q, json!({"a": 2}))
            }],
            None,
        )
        .await;
    assert!(
        matches!(other, Err(StoreError::IdempotencyConflict { .. })),
        "{other:?}"
    );
    // The procedure cannot compute an FNV fingerprint: it says so, naming the key.
    let (state, _, message) = refusal(
        call(
            &mut app,
            &format!("'{Q}', '{{\"a\": 1}}', NULL, 'old', NULL, NULL, NULL"),
        )
        .await,
        "a v3 record",
    );
    assert_eq!(state, "55000", "{message}");
    assert!(
        message.contains("'old'") && message.contains("before schema v4"),
        "{message}"
    );
    store.close().await;
    // Back to what a v3 database has (step 4 not recorded, no procedures, no fingerprint
    // kind): the next open applies step 4, the v3 record still answers.
    for sql in [
        "DELETE FROM schema_migrations WHERE version >= 4",
        "DROP PROCEDURE redrive_publish",
        "DROP PROCEDURE redrive_publish_out",
        "DELETE FROM meta WHERE k IN ('payload_fingerprint', 'sql_publish')",
    ] {
        app.query_drop(sql).await.unwrap();
    }
    assert!(call(
        &mut app,
        &format!("'{Q}', '1', NULL, NULL, NULL, NULL, NULL")
    )
    .await
    .is_err());
    let store = MysqlStore::open(common::options(&guard.0, &Setup::default()))
        .await
        .expect("reopen");
    let kind: String = app
        .query_first("SELECT v FROM meta WHERE k = 'payload_fingerprint'")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kind, "json_normalize", "MariaDB 10.7+ normalises");
    assert_eq!(
        count(&mut app, "schema_migrations WHERE version = 4").await,
        1
    );
    let id = call(
        &mut app,
        &format!("'{Q}', '{{\"b\": 2}}', NULL, 'new', NULL, NULL, NULL"),
    )
    .await
    .unwrap();
    let replay = store
        .publish(
            vec![NewMessage {
                idempotency_key: Some("new".into()),
                ..NewMessage::new(Q, json!({"b": 2}))
            }],
            None,
        )
        .await
        .unwrap();
    assert_eq!(replay[0].message.id.to_string(), id);
    let old = store
        .publish(
            vec![NewMessage {
                idempotency_key: Some("old".into()),
                ..NewMessage::new(Q, json!({"a": 1}))
            }],
            None,
        )
        .await
        .unwrap();
    assert!(old[0].replayed);
    assert_eq!(old[0].message.id, p[0].message.id);
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_publish_is_scheduled_and_falls_due_at_its_time() {
    let (store, mut app, _guard) = setup().await;
    let id = call(
        &mut app,
        &format!("'{Q}', '\"later\"', NULL, NULL, 1500, NULL, NULL"),
    )
    .await
    .unwrap();
    let m = store
        .get(id.parse().unwrap())
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(m.state, State::Scheduled);
    let due = m.due_at.expect("a due time").as_millis();
    assert_eq!(due - m.created_at.as_millis(), 1500);
    assert!(store.lease(req(Q), None).await.unwrap().is_empty(), "early");
    // Nothing told this store of the due time, but its poller keeps the scheduler's
    // wake-up at most a second ahead, so a node ticks in time.
    let mut wake = store.notifier().due();
    let hint = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            if let Some(at) = *wake.borrow_and_update() {
                if at.as_millis() <= redrive_core::Timestamp::now().as_millis() + 1_000 {
                    return at;
                }
            }
            wake.changed().await.unwrap();
        }
    })
    .await
    .expect("a wake-up within a second");
    assert!(hint.as_millis() > 0);
    // A tick before the due time promotes nothing; one after it does.
    store.tick(None).await.unwrap();
    assert!(
        store.lease(req(Q), None).await.unwrap().is_empty(),
        "promoted early"
    );
    let now = redrive_core::Timestamp::now().as_millis();
    tokio::time::sleep(Duration::from_millis((due - now + 100).max(0) as u64)).await;
    let tick = store.tick(None).await.unwrap();
    assert_eq!(tick.ready_queues, [Q]);
    let leased = store.lease(req(Q), None).await.unwrap();
    assert_eq!(leased.len(), 1);
    assert_eq!(leased[0].message.payload, json!("later"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_holds_across_both_paths() {
    let (store, mut app, _guard) = setup().await;
    // The store's path, two from SQL in one transaction, the store's path again: one key,
    // one at a time, in order.
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
    app.query_drop("START TRANSACTION").await.unwrap();
    for n in [2, 3] {
        call(
            &mut app,
            &format!("'{ORDERED}', '{n}', 'k', NULL, NULL, NULL, NULL"),
        )
        .await
        .unwrap();
    }
    app.query_drop("COMMIT").await.unwrap();
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
    // A key with nothing before it: the procedure makes its message the head at once.
    call(
        &mut app,
        &format!("'{ORDERED}', '\"solo\"', 'other', NULL, NULL, NULL, NULL"),
    )
    .await
    .unwrap();
    // And the reverse: the procedure's message first, the store's after it waits.
    call(
        &mut app,
        &format!("'{ORDERED}', '\"r1\"', 'rev', NULL, NULL, NULL, NULL"),
    )
    .await
    .unwrap();
    store
        .publish(
            vec![NewMessage {
                key: Some("rev".into()),
                ..NewMessage::new(ORDERED, json!("r2"))
            }],
            None,
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    loop {
        let leased = store.lease(req(ORDERED), None).await.unwrap();
        if leased.is_empty() {
            break;
        }
        for key in ["k", "rev"] {
            let of_key = leased
                .iter()
                .filter(|l| l.message.key.as_deref() == Some(key))
                .count();
            assert!(of_key <= 1, "{of_key} messages of key {key} leased at once");
        }
        seen.extend(leased.iter().map(|l| l.message.payload.clone()));
        ack_all(&store, &leased).await;
    }
    let of = |keep: &[Value]| -> Vec<Value> {
        seen.iter().filter(|p| keep.contains(p)).cloned().collect()
    };
    assert_eq!(
        of(&[json!(1), json!(2), json!(3), json!(4)]),
        [json!(1), json!(2), json!(3), json!(4)]
    );
    assert_eq!(of(&[json!("r1"), json!("r2")]), [json!("r1"), json!("r2")]);
    assert_eq!(seen.len(), 7, "{seen:?}");
    // The first lease took the head of each key: 1, "solo" and "r1".
    assert!(seen[..3].contains(&json!("solo")), "{seen:?}");
    // On an unordered queue a key orders nothing: two of one key are leased together.
    for n in [1, 2] {
        call(
            &mut app,
            &format!("'{Q}', '{n}', 'same', NULL, NULL, NULL, NULL"),
        )
        .await
        .unwrap();
    }
    assert_eq!(store.lease(req(Q), None).await.unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_are_refused_by_name_and_write_nothing() {
    let guard = common::fresh_database(PREFIX);
    let mut opts = common::options(&guard.0, &Setup::default());
    opts.sql_publish = SqlPublishLimits {
        max_payload_bytes: 64,
        max_header_bytes: 40,
        max_schedule_ahead_ms: 60_000,
    };
    let store = MysqlStore::open(opts.clone()).await.expect("open");
    let mut app = app(&guard.0).await;
    let big = "x".repeat(80);
    let long_key = "k".repeat(513);
    let bs = '\\';
    let cases: Vec<(String, &str, &str)> = vec![
        (
            "'no spaces', '1', NULL, NULL, NULL, NULL, NULL".into(),
            "22023",
            "queue 'no spaces'",
        ),
        (
            "NULL, '1', NULL, NULL, NULL, NULL, NULL".into(),
            "22023",
            "queue NULL",
        ),
        (
            "'', '1', NULL, NULL, NULL, NULL, NULL".into(),
            "22023",
            "queue",
        ),
        (
            format!("'{}', '1', NULL, NULL, NULL, NULL, NULL", "q".repeat(129)),
            "22023",
            "queue",
        ),
        (
            "'caf\u{e9}', '1', NULL, NULL, NULL, NULL, NULL".into(),
            "22023",
            "queue",
        ),
        (
            "CONCAT('q', CHAR(10)), '1', NULL, NULL, NULL, NULL, NULL".into(),
            "22023",
            "queue",
        ),
        (
            format!("'{Q}', NULL, NULL, NULL, NULL, NULL, NULL"),
            "22023",
            "payload: missing",
        ),
        (
            format!("'{Q}', 'nope', NULL, NULL, NULL, NULL, NULL"),
            "22023",
            "payload: not valid JSON",
        ),
        (
            format!("'{Q}', '', NULL, NULL, NULL, NULL, NULL"),
            "22023",
            "payload: not valid JSON",
        ),
        (
            format!("'{Q}', '1', NULL, NULL, NULL, 12, NULL"),
            "22023",
            "priority: 12 is not in 0..=9",
        ),
        (
            format!("'{Q}', '1', NULL, NULL, NULL, -1, NULL"),
            "22023",
            "priority",
        ),
        (
            format!("'{Q}', '1', '', NULL, NULL, NULL, NULL"),
            "22023",
            "key: must have 1 to 512",
        ),
        (
            format!("'{Q}', '1', '{long_key}', NULL, NULL, NULL, NULL"),
            "22023",
            "key: must have",
        ),
        (
            format!("'{Q}', '1', NULL, '', NULL, NULL, NULL"),
            "22023",
            "idempotency_key: must have",
        ),
        (
            format!("'{Q}', '1', NULL, '{long_key}', NULL, NULL, NULL"),
            "22023",
            "idempotency_key",
        ),
        (
            format!("'{Q}', '1', NULL, NULL, -1, NULL, NULL"),
            "22023",
            "delay_ms: -1 is negative",
        ),
        (
            format!("'{Q}', '1', NULL, NULL, 60001, NULL, NULL"),
            "22023",
            "max_schedule_ahead",
        ),
        (
            format!("'{Q}', '1', NULL, NULL, NULL, NULL, '[1]'"),
            "22023",
            "headers",
        ),
        (
            format!("'{Q}', '1', NULL, NULL, NULL, NULL, '\"x\"'"),
            "22023",
            "headers",
        ),
        (
            format!("'{Q}', '1', NULL, NULL, NULL, NULL, '{{\"a\": 1}}'"),
            "22023",
            "headers",
        ),
        (
            format!("'{Q}', '1', NULL, NULL, NULL, NULL, '{{\"a\": \"x\", \"b\": null}}'"),
            "22023",
            "headers",
        ),
        (
            format!("'{Q}', '1', NULL, NULL, NULL, NULL, '{{\"a\": {{\"b\": \"c\"}}}}'"),
            "22023",
            "headers",
        ),
        (
            format!("'{Q}', '1', NULL, NULL, NULL, NULL, 'nope'"),
            "22023",
            "headers",
        ),
        (
            format!(
                "'{Q}', '1', NULL, NULL, NULL, NULL, {}",
                lit(&format!("{{\"a\": \"{bs}q\"}}"))
            ),
            "22023",
            "headers",
        ),
        (
            format!("'{Q}', '\"{big}\"', NULL, NULL, NULL, NULL, NULL"),
            "54000",
            "payload: 82 bytes, the limit is 64 (max_payload_bytes)",
        ),
        (
            format!("'{Q}', '1', NULL, NULL, NULL, NULL, '{{\"trace\": \"{big}\"}}'"),
            "54000",
            "max_header_bytes",
        ),
    ];
    let all = cases;
    for (args, code, names) in &all {
        app.query_drop("START TRANSACTION").await.unwrap();
        let (state, errno, message) = refusal(call(&mut app, args).await, args);
        assert_eq!((state.as_str(), errno), (*code, 1644), "{args}: {message}");
        assert!(
            message.starts_with("redrive_publish: "),
            "{args}: {message}"
        );
        assert!(
            message.contains(names),
            "{args}: {message} does not name {names}"
        );
        // The caller's transaction goes on after the refusal.
        app.query_drop("SELECT 1").await.unwrap();
        app.query_drop("COMMIT").await.unwrap();
    }
    let stats = store.queue_stats().await.unwrap();
    assert!(stats.iter().all(|s| s.counts == [0; 5]), "{stats:?}");
    for table in ["messages", "ready", "idempotency", "key_heads"] {
        assert_eq!(count(&mut app, table).await, 0, "rows left in {table}");
    }
    // Within the limits, the same calls pass; the limits are the last opener's.
    call(
        &mut app,
        &format!(
            "'{Q}', '\"{}\"', NULL, NULL, 60000, NULL, '{{}}'",
            "x".repeat(62)
        ),
    )
    .await
    .expect("62 bytes of payload, a delay of max_schedule_ahead");
    store.close().await;
    opts.sql_publish = SqlPublishLimits::default();
    let store = MysqlStore::open(opts).await.expect("reopen");
    call(
        &mut app,
        &format!("'{Q}', '\"{big}\"', NULL, NULL, NULL, NULL, '{{\"trace\": \"{big}\"}}'"),
    )
    .await
    .expect("under the default limits");
    // A database whose limits went missing is refused from SQL, saying why.
    app.query_drop("DELETE FROM meta WHERE k = 'sql_publish'")
        .await
        .unwrap();
    let (state, _, message) = refusal(
        call(
            &mut app,
            &format!("'{Q}', '1', NULL, NULL, NULL, NULL, NULL"),
        )
        .await,
        "no limits",
    );
    assert_eq!(state, "55000", "{message}");
    store.close().await;
}

/// Random JSON values, as serde_json writes them and as a person might (spacing, key
/// order, number spelling, escapes): every one the procedure takes is stored so that the
/// store reads back the same value, and it takes every one whose numbers are in range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_procedure_takes_the_store_reads_back() {
    let (store, mut app, _guard) = setup().await;
    let mut rng = SplitMix64::new(18);
    let mut texts: Vec<String> = vec![
        "null".into(),
        "true".into(),
        "-0".into(),
        "0.5e-3".into(),
        "1E+2".into(),
        "1e-400".into(),
        "1.7e307".into(),
        "\"\\ud83d\\ude00 \\u00e9 \\/ \\\\ud800 \\\"\"".into(),
        "\"\u{2028}\u{7f}\"".into(),
        " [ 1 , { \"a\" : [ ] } ] ".into(),
        format!("{}1{}", "[".repeat(31), "]".repeat(31)),
    ];
    for _ in 0..150 {
        let v = random_value(&mut rng, 0);
        texts.push(if rng.next_u64().is_multiple_of(2) {
            serde_json::to_string(&v).unwrap()
        } else {
            serde_json::to_string_pretty(&v).unwrap()
        });
    }
    for text in &texts {
        let expected: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let id = call(
            &mut app,
            &format!("'{Q}', {}, NULL, NULL, NULL, NULL, NULL", lit(text)),
        )
        .await
        .unwrap_or_else(|e| panic!("refused {text}: {e}"));
        let m = store
            .get(id.parse().unwrap())
            .await
            .unwrap_or_else(|e| panic!("unreadable {text}: {e}"))
            .expect("stored");
        assert_eq!(m.payload, expected, "{text}");
    }
    // And the other way: MariaDB refuses what serde_json refuses (lone surrogates,
    // control characters, nesting 32 deep: too deep for MariaDB, not for serde).
    for bad in [
        "\"\\ud800\"",
        "[\"\\udc00\"]",
        "[\"a\\ud800\\u0041\"]",
        "\"a\u{1}b\"",
        "[1,]",
        "01",
        &format!("{}1{}", "[".repeat(32), "]".repeat(32)),
    ] {
        let r = call(
            &mut app,
            &format!("'{Q}', {}, NULL, NULL, NULL, NULL, NULL", lit(bad)),
        )
        .await;
        let (state, _, message) = refusal(r, bad);
        assert_eq!(state, "22023", "{bad}: {message}");
    }
    // What JSON_VALID takes but the server's JSON reader (serde_json) refuses: a message
    // the store could not read back is never written (numbers of 1e308 and more are
    // refused whole, though serde_json reads them up to f64's 1.797e308).
    let huge_int = format!("[1{}]", "0".repeat(309));
    for p in [
        "[1.]",
        "[-]",
        "[1.e5]",
        "[0e]",
        "[1E+]",
        "{\"a\":-}",
        "[\"\\x41\"]",
        "[\"\\q\"]",
        "[\"\\U0041\"]",
        "[1e400]",
        "-2e308",
        "{\"n\": 12e1000}",
        &huge_int,
        "[1E+308]",
    ] {
        assert!(
            serde_json::from_str::<Value>(p).is_err() || p == "[1E+308]",
            "{p} is readable: not a case of this list"
        );
        let r = call(
            &mut app,
            &format!("'{Q}', {}, NULL, NULL, NULL, NULL, NULL", lit(p)),
        )
        .await;
        let (state, _, message) = refusal(r, p);
        assert_eq!(state, "22023", "{p}: {message}");
        assert!(
            message.contains("payload: a number or a string escape"),
            "{p}: {message}"
        );
    }
    // The leases read every stored message back too.
    let mut leased = 0;
    loop {
        let l = store.lease(req(Q), None).await.unwrap();
        if l.is_empty() {
            break;
        }
        leased += l.len();
        ack_all(&store, &l).await;
    }
    assert_eq!(leased, texts.len());
}

/// A random JSON value at depth `depth` (at most 6 deep).
fn random_value(rng: &mut SplitMix64, depth: u32) -> Value {
    let pick = rng.next_u64() % if depth >= 6 { 5 } else { 7 };
    match pick {
        0 => Value::Null,
        1 => Value::Bool(rng.next_u64().is_multiple_of(2)),
        2 => json!(rng.next_u64() as i64 >> (rng.next_u64() % 64)),
        3 => {
            let mantissa = (rng.next_u64() % 2_000_000) as f64 / 1000.0 - 1000.0;
            let exp = (rng.next_u64() % 600) as i32 - 300;
            json!(mantissa * 10f64.powi(exp))
        }
        4 => Value::String(random_string(rng)),
        5 => Value::Array(
            (0..rng.next_u64() % 5)
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => Value::Object(
            (0..rng.next_u64() % 5)
                .map(|_| (random_string(rng), random_value(rng, depth + 1)))
                .collect(),
        ),
    }
}

fn random_string(rng: &mut SplitMix64) -> String {
    const PARTS: [&str; 12] = [
        "a", "Z", " ", "\"", "\\", "/", "\n", "\u{1}", "é", "订单", "😀", "\u{7f}",
    ];
    (0..rng.next_u64() % 8)
        .map(|_| PARTS[(rng.next_u64() % PARTS.len() as u64) as usize])
        .collect()
}

/// Whether php-cli with pdo_mysql is here; under CI it must be.
fn php_mysql_ready() -> bool {
    let php = std::process::Command::new("php")
        .args([
            "-r",
            "echo extension_loaded('pdo_mysql') ? 'ok' : 'missing';",
        ])
        .output();
    if php.as_ref().is_ok_and(|o| o.stdout == b"ok") {
        return true;
    }
    assert!(
        std::env::var("CI").is_err(),
        "php-cli with pdo_mysql (Debian: php-cli php-mysql) is needed under CI: {php:?}"
    );
    eprintln!("skipped: php-cli with pdo_mysql (Debian: php-cli php-mysql) is not installed");
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pdo_example_commits_one_order_with_its_message_and_rolls_the_other_back() {
    if !php_mysql_ready() {
        return;
    }
    let (store, mut app, guard) = setup().await;
    let server = mysql_async::Opts::from_url(&common::url()).expect("url");
    let dsn = format!(
        "mysql:host={};port={};dbname={};charset=utf8mb4",
        server.ip_or_hostname(),
        server.tcp_port(),
        server.db_name().unwrap_or("test"),
    );
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/pdo_publish_mysql.php"
    );
    let mut php = std::process::Command::new("php");
    php.arg(script)
        .env("MYSQL_DSN", &dsn)
        .env("MYSQL_USER", server.user().unwrap_or("root"))
        .env("MYSQL_PASSWORD", server.pass().unwrap_or(""))
        // Redrive's database is not the connection's: the example qualifies its CALL.
        .env("REDRIVE_DATABASE", &guard.0)
        .env("APP_DATABASE", &guard.0)
        .env("ORDER", "42");
    let out = tokio::task::spawn_blocking(move || php.output())
        .await
        .unwrap()
        .expect("run php examples/pdo_publish_mysql.php");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = text
        .lines()
        .find_map(|l| l.strip_prefix("committed order 42: message "))
        .unwrap_or_else(|| panic!("no committed line in {text}"))
        .to_owned();
    let gone = text
        .lines()
        .find_map(|l| l.split("it would have been ").nth(1))
        .unwrap_or_else(|| panic!("no rolled-back line in {text}"))
        .trim_end_matches(')')
        .to_owned();
    assert!(
        text.contains("refused: 22023 1644 redrive_publish: priority: 12 is not in 0..=9"),
        "{text}"
    );
    // The committed order's message is the store's to lease; the rolled-back one is not.
    let leased = store.lease(req("order-paid"), None).await.unwrap();
    assert_eq!(leased.len(), 1, "{leased:?}");
    let m = &leased[0].message;
    assert_eq!(m.id.to_string(), id);
    assert_eq!(
        m.payload,
        json!({"order": 42, "total": "99.50", "note": "paid / payé"})
    );
    assert_eq!(m.key.as_deref(), Some("customer-42"));
    assert!(store.get(gone.parse().unwrap()).await.unwrap().is_none());
    let orders: Vec<i64> = app
        .query(format!(
            "SELECT id FROM `{}`.shop_orders ORDER BY id",
            guard.0
        ))
        .await
        .unwrap();
    assert_eq!(orders, [42]);
    // The key the procedure used is the store's too: the same payload replays it, the
    // rolled-back order's key is free.
    let replay = store
        .publish(
            vec![NewMessage {
                idempotency_key: Some("order-42-paid".into()),
                ..NewMessage::new(
                    "order-paid",
                    json!({"note": "paid / payé", "total": "99.50", "order": 42}),
                )
            }],
            None,
        )
        .await
        .unwrap();
    assert!(replay[0].replayed);
    assert_eq!(replay[0].message.id.to_string(), id);
    let fresh = store
        .publish(
            vec![NewMessage {
                idempotency_key: Some("order-43-paid".into()),
                ..NewMessage::new("order-paid", json!({"order": 43}))
            }],
            None,
        )
        .await
        .unwrap();
    assert!(!fresh[0].replayed, "the rolled-back publish kept its key");
}
