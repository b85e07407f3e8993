//! The on-disk format of the embedded store, read back by a later redrive: a state code
//! no state has is an error (never read as `dead`), and data directories written by
//! earlier schema versions open and keep working.

use redrive_core::{ErrorClass, Failure, MessageId, NewMessage, State};
use redrive_storage::conformance::{self, at, Q, SHORT_AGE, T0};
use redrive_storage::{
    LeaseRef, LeaseRequest, Leased, MessageFilter, Nack, Release, ReleaseBy, Settled, Store,
    StoreError,
};
use redrive_store_sqlite::{SqliteOptions, SqliteStore};
use serde_json::json;
use std::path::Path;

fn options(dir: &Path) -> SqliteOptions {
    let mut opts = SqliteOptions::new(dir);
    opts.store.catalog = std::sync::Arc::new(conformance::catalog());
    opts.store.seed = Some(5);
    opts
}

/// Write straight to the database file, as a newer redrive or a damaged disk would.
fn raw(dir: &Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(dir.join("redrive.db")).expect("open the raw database");
    c.busy_timeout(std::time::Duration::from_secs(5))
        .expect("busy timeout");
    c
}

fn is_unknown_state(e: &StoreError) -> bool {
    matches!(e, StoreError::Backend(m) if m.contains("state code 9"))
}

#[tokio::test]
async fn unknown_state_code_on_disk_is_an_error_not_dead() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(options(dir.path())).expect("open");
    let id = store
        .publish(vec![NewMessage::new(Q, json!({"n": 1}))], Some(at(0)))
        .await
        .expect("publish")[0]
        .message
        .id;
    // A code no state has (9), written underneath the running store.
    raw(dir.path())
        .execute("UPDATE messages SET state = 9", [])
        .expect("raw update");
    match store.get(id).await {
        Err(e) if is_unknown_state(&e) => {}
        other => panic!("get of a row with state code 9: {other:?}"),
    }
    match store.search(MessageFilter::default(), 10, None).await {
        Err(e) if is_unknown_state(&e) => {}
        other => panic!("search over a row with state code 9: {other:?}"),
    }
    store.close().await;
    // Reopening counts messages per state: it refuses, naming the code, rather than
    // counting the row as dead.
    match SqliteStore::open(options(dir.path())) {
        Err(e) if is_unknown_state(&e) => {}
        Err(e) => panic!("reopen failed for another reason: {e}"),
        Ok(_) => panic!("a store with state code 9 on disk opened"),
    }
}

/// The schema of version 1 (the first release), verbatim: a data directory written by
/// it must open with this redrive and keep working.
const SCHEMA_V1: &str = r#"
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS messages (
  seq               INTEGER PRIMARY KEY,
  id                TEXT NOT NULL UNIQUE,
  queue             TEXT NOT NULL,
  state             INTEGER NOT NULL,
  priority          INTEGER NOT NULL,
  due_at            INTEGER,
  msg_key           TEXT,
  idempotency_key   TEXT,
  payload           TEXT NOT NULL,
  headers           TEXT,
  attempts          INTEGER NOT NULL DEFAULT 0,
  budget_base       INTEGER NOT NULL DEFAULT 0,
  uncounted         INTEGER NOT NULL DEFAULT 0,
  prev_delay_ms     INTEGER,
  created_at        INTEGER NOT NULL,
  updated_at        INTEGER NOT NULL,
  lease_token       TEXT,
  leased_at         INTEGER,
  lease_expires_at  INTEGER,
  finished_at       INTEGER,
  dead_reason       TEXT,
  error_class       TEXT,
  last_error        TEXT,
  history           TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS ix_ready ON messages(queue, priority DESC, due_at, seq) WHERE state = 1;
CREATE INDEX IF NOT EXISTS ix_scheduled ON messages(due_at) WHERE state = 0;
CREATE INDEX IF NOT EXISTS ix_leased ON messages(lease_expires_at) WHERE state = 2;
CREATE INDEX IF NOT EXISTS ix_done ON messages(finished_at) WHERE state = 3;
CREATE INDEX IF NOT EXISTS ix_key ON messages(queue, msg_key, seq) WHERE msg_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS ix_key_leased ON messages(queue, msg_key) WHERE state = 2;
CREATE INDEX IF NOT EXISTS ix_queue ON messages(queue, seq);
CREATE INDEX IF NOT EXISTS ix_dead ON messages(queue, seq) WHERE state = 4;
CREATE TABLE IF NOT EXISTS idempotency (
  queue       TEXT NOT NULL,
  ikey        TEXT NOT NULL,
  message_id  TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  expires_at  INTEGER NOT NULL,
  PRIMARY KEY (queue, ikey)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ix_idempotency_expiry ON idempotency(expires_at);
"#;

/// FNV-1a of a payload's JSON text: the fingerprint version 1 stored with a key.
fn fingerprint(payload: &serde_json::Value) -> String {
    let text = serde_json::to_string(payload).expect("json");
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// A version 1 database: a ready message with an idempotency key, a dead letter of
/// [`SHORT_AGE`] far past its `max_age`, and the record of a key whose (done) message
/// was already purged. Returns (ready id, dead id, purged id).
fn write_v1(dir: &Path) -> (MessageId, MessageId, MessageId) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let c = rusqlite::Connection::open(dir.join("redrive.db")).expect("create v1 db");
    c.execute_batch("PRAGMA page_size = 1024; PRAGMA journal_mode = WAL;")
        .expect("pragmas");
    c.execute_batch(SCHEMA_V1).expect("v1 schema");
    c.execute("INSERT INTO meta (k, v) VALUES ('schema_version', '1')", [])
        .expect("meta");
    let (ready, dead, purged) = (MessageId::new(), MessageId::new(), MessageId::new());
    let insert =
        "INSERT INTO messages (id, queue, state, priority, due_at, idempotency_key, payload, \
                  attempts, created_at, updated_at, finished_at, dead_reason, history) \
                  VALUES (?1, ?2, ?3, 0, ?4, ?5, ?6, ?7, ?8, ?8, ?9, ?10, '[]')";
    c.execute(
        insert,
        rusqlite::params![
            ready.to_string(),
            Q,
            1,
            T0,
            "a",
            r#"{"n":1}"#,
            0,
            T0,
            None::<i64>,
            None::<String>
        ],
    )
    .expect("ready row");
    c.execute(
        insert,
        rusqlite::params![
            dead.to_string(),
            SHORT_AGE,
            4,
            None::<i64>,
            None::<String>,
            r#"{"n":3}"#,
            10,
            T0,
            Some(T0 + 1_000),
            Some("max_attempts")
        ],
    )
    .expect("dead row");
    let record = "INSERT INTO idempotency (queue, ikey, message_id, fingerprint, expires_at) \
                  VALUES (?1, ?2, ?3, ?4, ?5)";
    let window = 24 * 3_600_000i64;
    c.execute(
        record,
        rusqlite::params![
            Q,
            "a",
            ready.to_string(),
            fingerprint(&json!({"n": 1})),
            T0 + window
        ],
    )
    .expect("record a");
    c.execute(
        record,
        rusqlite::params![
            Q,
            "gone",
            purged.to_string(),
            fingerprint(&json!({"n": 2})),
            T0 + window
        ],
    )
    .expect("record gone");
    (ready, dead, purged)
}

fn keyed(key: &str, payload: serde_json::Value) -> NewMessage {
    NewMessage {
        idempotency_key: Some(key.into()),
        ..NewMessage::new(Q, payload)
    }
}

#[tokio::test]
async fn schema_v1_data_dir_is_upgraded_and_keeps_working() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (ready, dead, purged) = write_v1(dir.path());
    let store = SqliteStore::open(options(dir.path())).expect("a v1 data directory opens");
    assert_eq!(
        store
            .get(ready)
            .await
            .expect("get")
            .expect("ready row")
            .state,
        State::Ready
    );
    assert_eq!(
        store.get(dead).await.expect("get").expect("dead row").state,
        State::Dead
    );
    // Its idempotency records still answer replays.
    let r = store
        .publish(vec![keyed("a", json!({"n": 1}))], Some(at(10)))
        .await
        .expect("replay");
    assert!(r[0].replayed && r[0].message.id == ready, "{r:?}");
    // A key whose message was purged before the upgrade answers the original id too.
    let r = store
        .publish(vec![keyed("gone", json!({"n": 2}))], Some(at(20)))
        .await
        .expect("replay");
    assert!(
        r[0].replayed,
        "a purged message's key published anew: {r:?}"
    );
    assert_eq!(r[0].message.id, purged);
    assert_eq!(r[0].message.state, State::Done);
    assert_eq!(r[0].message.created_at, at(0));
    // A dead letter far past max_age is redriven with a fresh window (its row has no
    // window start yet): a transient failure schedules a retry.
    store
        .redrive(dead, Some(at(3_600_000)))
        .await
        .expect("redrive");
    let l = store
        .lease(
            LeaseRequest {
                queue: SHORT_AGE.into(),
                max: 1,
                lease_ms: 30_000,
                max_bytes: None,
            },
            Some(at(3_600_001)),
        )
        .await
        .expect("lease");
    assert_eq!(l.len(), 1);
    let out = store
        .nack(
            vec![Nack {
                response: None,
                waited: Vec::new(),
                lease: LeaseRef {
                    id: dead,
                    token: l[0].token.clone(),
                },
                failure: Failure::new(ErrorClass::Transient, "still down"),
            }],
            Some(at(3_600_002)),
        )
        .await
        .expect("nack");
    let out = out[0].as_ref().expect("nack item");
    assert_eq!(out.message.state, State::Scheduled, "{out:?}");
    // The ready message is delivered and acked as usual; purge keeps its key.
    let l = store
        .lease(
            LeaseRequest {
                queue: Q.into(),
                max: 1,
                lease_ms: 30_000,
                max_bytes: None,
            },
            Some(at(30)),
        )
        .await
        .expect("lease");
    assert_eq!(l[0].message.id, ready);
    let acked = store
        .ack(
            vec![LeaseRef {
                id: ready,
                token: l[0].token.clone(),
            }
            .into()],
            Some(at(31)),
        )
        .await
        .expect("ack");
    assert!(acked[0].is_ok());
    store.purge(Some(at(60_000)), 1_000).await.expect("purge");
    let r = store
        .publish(vec![keyed("a", json!({"n": 1}))], Some(at(60_001)))
        .await
        .expect("replay");
    assert!(r[0].replayed && r[0].message.id == ready && r[0].message.finished_at == Some(at(31)));
    store.close().await;
    let version: String = raw(dir.path())
        .query_row("SELECT v FROM meta WHERE k = 'schema_version'", [], |r| {
            r.get(0)
        })
        .expect("version");
    assert_eq!(
        version,
        "8", // the current schema version (schema.rs SCHEMA_VERSION)
        "the data directory is marked upgraded"
    );
    // Version 6's tables (bulk tasks, the audit log) and version 8's (the console's
    // sessions) exist, empty.
    for table in ["tasks", "audit", "sessions"] {
        let n: i64 = raw(dir.path())
            .query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
            .unwrap_or_else(|e| panic!("table {table} after the upgrade: {e}"));
        assert_eq!(n, 0, "{table}");
    }
    // And it opens again as a current one.
    SqliteStore::open(options(dir.path()))
        .expect("reopen")
        .close()
        .await;
}

#[tokio::test]
async fn newer_schema_version_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    SqliteStore::open(options(dir.path()))
        .expect("open")
        .close()
        .await;
    raw(dir.path())
        .execute("UPDATE meta SET v = '99' WHERE k = 'schema_version'", [])
        .expect("raw update");
    match SqliteStore::open(options(dir.path())) {
        Err(StoreError::Backend(m)) => assert!(m.contains("schema version 99"), "{m}"),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("a store of a newer schema opened"),
    }
}

/// Schema 7 records how a lease ended (`lease_end`). A data directory of version 6 has
/// leases that ended before the upgrade: a late call with one of their tokens still says
/// how it ended (told from the row and its history), not `lease_expired` for all.
#[tokio::test]
async fn schema_v6_leases_settled_before_the_upgrade_say_how() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(options(dir.path())).expect("open");
    let items = (0..5)
        .map(|n| NewMessage::new(Q, json!({ "n": n })))
        .collect();
    store.publish(items, Some(at(0))).await.expect("publish");
    let mut l: Vec<Leased> = store
        .lease(
            LeaseRequest {
                queue: Q.into(),
                max: 5,
                lease_ms: 1_000,
                max_bytes: None,
            },
            Some(at(0)),
        )
        .await
        .expect("lease");
    l.sort_by_key(|l| l.message.created_at);
    assert_eq!(l.len(), 5);
    let lref = |l: &Leased| LeaseRef {
        id: l.message.id,
        token: l.token.clone(),
    };
    // acked, nacked, released, expired, killed.
    assert!(store
        .ack(vec![lref(&l[0]).into()], Some(at(1)))
        .await
        .expect("ack")[0]
        .is_ok());
    let nack = Nack {
        response: None,
        lease: lref(&l[1]),
        failure: Failure::new(ErrorClass::Transient, "x"),
        waited: Vec::new(),
    };
    assert!(store.nack(vec![nack], Some(at(1))).await.expect("nack")[0].is_ok());
    let release = Release {
        lease: lref(&l[2]),
        until: at(1),
        by: ReleaseBy::Consumer,
        waited: Vec::new(),
    };
    assert!(store
        .release(vec![release], Some(at(1)))
        .await
        .expect("release")[0]
        .is_ok());
    store
        .kill(l[4].message.id, None, Some(at(1)))
        .await
        .expect("kill");
    assert_eq!(
        store
            .tick(Some(at(1_000)))
            .await
            .expect("tick")
            .expired
            .len(),
        1
    );
    store.close().await;
    drop(store);
    // Back to version 6: the same tables without the two columns version 7 added, and
    // without what version 8 added.
    raw(dir.path())
        .execute_batch(
            "ALTER TABLE messages DROP COLUMN lease_end; \
             ALTER TABLE messages DROP COLUMN released; \
             ALTER TABLE audit DROP COLUMN node; DROP TABLE sessions; \
             UPDATE meta SET v = '6' WHERE k = 'schema_version';",
        )
        .expect("make a version 6 database");
    let store = SqliteStore::open(options(dir.path())).expect("a v6 data directory opens");
    let late = |l: &Leased| {
        let (store, lease) = (&store, lref(l));
        async move {
            store
                .ack(vec![lease.into()], Some(at(2_000)))
                .await
                .expect("ack request")
                .remove(0)
                .map(drop)
        }
    };
    // The acked one: a nack with its token (a repeated ack succeeds, as before).
    let nack = Nack {
        response: None,
        lease: lref(&l[0]),
        failure: Failure::new(ErrorClass::Transient, "x"),
        waited: Vec::new(),
    };
    let r = store.nack(vec![nack], Some(at(2_000))).await.expect("nack")[0]
        .as_ref()
        .map(drop)
        .map_err(Clone::clone);
    assert!(
        matches!(r, Err(StoreError::LeaseSettled(Settled::Acked))),
        "{r:?}"
    );
    let want = [
        (1, "nacked"),
        (2, "released"),
        (3, "expired"),
        (4, "killed"),
    ];
    for (i, how) in want {
        let r = late(&l[i]).await;
        let said = match &r {
            Err(StoreError::LeaseSettled(h)) => h.as_str(),
            Err(StoreError::LeaseExpired) => "expired",
            other => panic!("message {i}: {other:?}"),
        };
        assert_eq!(said, how, "message {i}");
    }
    store.close().await;
    let version: String = raw(dir.path())
        .query_row("SELECT v FROM meta WHERE k = 'schema_version'", [], |r| {
            r.get(0)
        })
        .expect("version");
    assert_eq!(version, "8");
}

/// A version 7 data directory (no sessions, audit entries without a node) opens: its
/// audit entries read back with no node, new ones keep theirs, and sessions work.
#[tokio::test]
async fn schema_v7_audit_entries_have_no_node_and_sessions_begin() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(options(dir.path())).expect("open");
    store.close().await;
    drop(store);
    raw(dir.path())
        .execute_batch(
            "ALTER TABLE audit DROP COLUMN node; DROP TABLE sessions; \
             INSERT INTO audit (at, actor, action, target, filter, count, detail) \
             VALUES (1, 'ops', 'message.kill', 'm1', NULL, 1, NULL); \
             UPDATE meta SET v = '7' WHERE k = 'schema_version';",
        )
        .expect("make a version 7 database");
    let store = SqliteStore::open(options(dir.path())).expect("a v7 data directory opens");
    store
        .audit(
            redrive_storage::NewAudit {
                actor: "ops".into(),
                action: "message.redrive".into(),
                target: Some("m2".into()),
                filter: None,
                count: 1,
                detail: None,
                node: Some("node-a".into()),
            },
            Some(at(2)),
        )
        .await
        .expect("audit");
    let log = store.audit_list(None, 10).await.expect("audit list");
    let nodes: Vec<_> = log
        .iter()
        .map(|a| (a.entry.target.as_deref(), a.entry.node.as_deref()))
        .collect();
    assert_eq!(nodes, [(Some("m2"), Some("node-a")), (Some("m1"), None)]);
    let made = store
        .session_create(
            conformance::sessions::new_session("s1", "ops", 4),
            Some(at(3)),
        )
        .await
        .expect("session");
    let found = store
        .session_get(conformance::sessions::lookup("s1"), Some(at(4)))
        .await
        .expect("get");
    assert_eq!(found, Some(made));
    store.close().await;
    let version: String = raw(dir.path())
        .query_row("SELECT v FROM meta WHERE k = 'schema_version'", [], |r| {
            r.get(0)
        })
        .expect("version");
    assert_eq!(version, "8");
}
