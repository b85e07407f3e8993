//! Regression tests of [`SqliteStore`] for issue 5's per-key ordering and promotion
//! defects, and property tests of the bookkeeping that fixed them.
//!
//! Per-key ordering is now kept in a column (`key_order`, see `sqlite/key_order.rs`)
//! instead of being decided by the lease query, so that a lease never walks a hot
//! key's backlog. SPEC §4 must hold exactly as before: a random-operation property
//! test compares every lease with the old query (kept here as the oracle) and checks
//! the column against its definition after every step, under `on_dead` skip and
//! block and across reopens that change a queue's ordering. The other tests cover
//! the migration from schema version 1, stats of blocked messages and the tick's
//! fairness across queues.

use proptest::prelude::*;
use proptest::sample::Index;
use redrive_core::{
    ErrorClass, Failure, MessageId, NewMessage, OnDead, Ordering, QueueCatalog, QueueSettings,
    State,
};
use redrive_storage::conformance::{at, policy, Q};
use redrive_storage::{LeaseRef, LeaseRequest, Nack, Store, StoreError};
use redrive_store_sqlite::{Durability, SqliteOptions, SqliteStore};
use rusqlite::{params, Connection, OpenFlags};
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// Deliveries per message: small, so that random sequences reach dead messages.
const MAX_ATTEMPTS: u32 = 2;

fn settings(ordering: Ordering, on_dead: OnDead) -> QueueSettings {
    QueueSettings {
        retry: policy(MAX_ATTEMPTS),
        ordering,
        on_dead,
    }
}

/// A store whose every queue uses `settings`.
fn open(dir: &Path, settings: QueueSettings) -> SqliteStore {
    let mut opts = SqliteOptions::new(dir);
    opts.store.catalog = Arc::new(QueueCatalog::new(settings, Default::default()));
    opts.store.seed = Some(5);
    // Commits without fsync: these tests are about which transitions happen, not about
    // crash durability (tests/recovery.rs), and some publish over ten thousand messages.
    opts.durability = Durability::UnsafeBuffered;
    SqliteStore::open(opts).expect("open store")
}

fn keyed(queue: &str, key: &str, n: u32) -> NewMessage {
    NewMessage {
        key: Some(key.to_owned()),
        ..NewMessage::new(queue, json!({ "n": n }))
    }
}

async fn lease(s: &SqliteStore, queue: &str, max: u32, now: i64) -> Vec<redrive_storage::Leased> {
    s.lease(
        LeaseRequest {
            queue: queue.into(),
            max,
            lease_ms: 60_000,
            max_bytes: None,
        },
        Some(at(now)),
    )
    .await
    .expect("lease")
}

fn payload_n(l: &redrive_storage::Leased) -> u64 {
    l.message.payload["n"].as_u64().expect("payload n")
}

/// A read-only connection to the store's database, for white-box checks.
fn peek(dir: &Path) -> Connection {
    Connection::open_with_flags(dir.join("redrive.db"), OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("open read-only")
}

// ---- defect 10: one tick promotes fairly across queues ----

/// Messages in the flooded queue: more than one tick promotes (10,000).
const FLOOD: u32 = 10_001;

/// Issue 5, defect 10: one tick promoted the earliest-due messages of all queues
/// together, so a queue with a flood due at one instant delayed every other queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tick_promotes_a_quiet_queues_message_beside_a_flooded_queue() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = open(dir.path(), settings(Ordering::None, OnDead::Skip));
    let mut n = 0;
    while n < FLOOD {
        let batch: Vec<NewMessage> = (n..(n + 1_000).min(FLOOD))
            .map(|i| NewMessage {
                deliver_at: Some(at(1_000)),
                ..NewMessage::new("flooded", json!({ "n": i }))
            })
            .collect();
        n += batch.len() as u32;
        s.publish(batch, Some(at(0))).await.expect("publish flood");
    }
    // Due after every message of the flood: the old tick promoted 10,000 of those first.
    let quiet = NewMessage {
        deliver_at: Some(at(1_001)),
        ..NewMessage::new("quiet", json!({ "n": 0 }))
    };
    s.publish(vec![quiet], Some(at(0)))
        .await
        .expect("publish quiet");

    let tick = s.tick(Some(at(2_000))).await.expect("tick");
    assert!(
        tick.ready_queues.iter().any(|q| q == "quiet"),
        "{:?}",
        tick.ready_queues
    );
    assert!(tick.more, "the flood is not all promoted by one tick");
    assert_eq!(tick.next_wake, Some(at(2_000)), "more: tick again now");
    let got = lease(&s, "quiet", 10, 2_000).await;
    assert_eq!(
        got.len(),
        1,
        "the quiet queue's message is ready after one tick"
    );
    let stats = s.queue_stats().await.expect("stats");
    let flooded = stats
        .iter()
        .find(|q| q.queue == "flooded")
        .expect("flooded");
    let ready = flooded.counts[State::Ready.code() as usize];
    let scheduled = flooded.counts[State::Scheduled.code() as usize];
    assert_eq!(
        ready + 1,
        10_000,
        "the tick's limit is shared, not exceeded"
    );
    assert_eq!(ready + scheduled, FLOOD as u64);

    // Ticking on promotes the rest, and then says there is nothing more.
    let mut ticks = 0;
    loop {
        ticks += 1;
        let t = s.tick(Some(at(2_000))).await.expect("tick");
        if !t.more {
            assert_eq!(t.next_wake, Some(at(62_000)), "the quiet lease's expiry");
            break;
        }
        assert!(ticks < 10, "ticks end");
    }
    let stats = s.queue_stats().await.expect("stats");
    let flooded = stats
        .iter()
        .find(|q| q.queue == "flooded")
        .expect("flooded");
    assert_eq!(flooded.counts[State::Ready.code() as usize], FLOOD as u64);
    s.close().await;
}

// ---- per-key ordering: stats, configuration changes, migration ----

/// The oldest ready message of a key-ordered queue may be one blocked behind its key's
/// leased head; `oldest_ready_due` must still see it (it is no longer in `ix_ready`).
#[tokio::test]
async fn oldest_ready_age_counts_messages_waiting_behind_their_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = open(dir.path(), settings(Ordering::Key, OnDead::Skip));
    s.publish(vec![keyed(Q, "a", 0)], Some(at(100)))
        .await
        .expect("publish");
    s.publish(vec![keyed(Q, "a", 1)], Some(at(200)))
        .await
        .expect("publish");
    s.publish(vec![keyed(Q, "b", 2)], Some(at(300)))
        .await
        .expect("publish");
    let head = lease(&s, Q, 1, 400).await;
    assert_eq!(payload_n(&head[0]), 0);
    let stats = s.queue_stats().await.expect("stats");
    assert_eq!(stats[0].counts[State::Ready.code() as usize], 2);
    assert_eq!(
        stats[0].oldest_ready_due,
        Some(at(200)),
        "a#1 waits, and is oldest"
    );
    s.close().await;
}

/// Messages written while a queue had no ordering are ordered by key once it has.
#[tokio::test]
async fn reopening_with_key_ordering_turned_on_orders_existing_messages() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = open(dir.path(), settings(Ordering::None, OnDead::Skip));
    let items = vec![
        keyed(Q, "a", 0),
        keyed(Q, "a", 1),
        keyed(Q, "b", 2),
        keyed(Q, "b", 3),
    ];
    s.publish(items, Some(at(0))).await.expect("publish");
    s.close().await;
    drop(s);

    let s = open(dir.path(), settings(Ordering::Key, OnDead::Skip));
    let got: Vec<u64> = lease(&s, Q, 10, 10).await.iter().map(payload_n).collect();
    assert_eq!(got, vec![0, 2], "one head per key");
    s.close().await;
}

/// And the other way: messages waiting behind their key are released when a queue's
/// ordering is turned off; a change of `on_dead` applies to existing dead messages.
#[tokio::test]
async fn reopening_with_another_ordering_rewrites_who_waits() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = open(dir.path(), settings(Ordering::Key, OnDead::Skip));
    let items = vec![keyed(Q, "a", 0), keyed(Q, "a", 1), keyed(Q, "a", 2)];
    s.publish(items, Some(at(0))).await.expect("publish");
    let head = lease(&s, Q, 10, 10).await;
    assert_eq!(head.len(), 1);
    s.kill(head[0].message.id, None, Some(at(20)))
        .await
        .expect("kill");
    s.close().await;
    drop(s);

    // Under `block`, the dead head keeps the key blocked.
    let s = open(dir.path(), settings(Ordering::Key, OnDead::Block));
    assert!(
        lease(&s, Q, 10, 30).await.is_empty(),
        "a dead head blocks its key"
    );
    s.close().await;
    drop(s);

    // Without ordering, both waiting messages are leasable at once.
    let s = open(dir.path(), settings(Ordering::None, OnDead::Block));
    let got: Vec<u64> = lease(&s, Q, 10, 40).await.iter().map(payload_n).collect();
    assert_eq!(got, vec![1, 2]);
    s.close().await;
}

/// The schema of version 1 (before `key_order`), as that version created it.
const SCHEMA_V1: &str = r#"
CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE messages (
  seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, queue TEXT NOT NULL, state INTEGER NOT NULL,
  priority INTEGER NOT NULL, due_at INTEGER, msg_key TEXT, idempotency_key TEXT, payload TEXT NOT NULL,
  headers TEXT, attempts INTEGER NOT NULL DEFAULT 0, budget_base INTEGER NOT NULL DEFAULT 0,
  uncounted INTEGER NOT NULL DEFAULT 0, prev_delay_ms INTEGER, created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL, lease_token TEXT, leased_at INTEGER, lease_expires_at INTEGER,
  finished_at INTEGER, dead_reason TEXT, error_class TEXT, last_error TEXT,
  history TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX ix_ready ON messages(queue, priority DESC, due_at, seq) WHERE state = 1;
CREATE INDEX ix_scheduled ON messages(due_at) WHERE state = 0;
CREATE INDEX ix_leased ON messages(lease_expires_at) WHERE state = 2;
CREATE INDEX ix_done ON messages(finished_at) WHERE state = 3;
CREATE INDEX ix_key ON messages(queue, msg_key, seq) WHERE msg_key IS NOT NULL;
CREATE INDEX ix_key_leased ON messages(queue, msg_key) WHERE state = 2;
CREATE INDEX ix_queue ON messages(queue, seq);
CREATE INDEX ix_dead ON messages(queue, seq) WHERE state = 4;
CREATE TABLE idempotency (
  queue TEXT NOT NULL, ikey TEXT NOT NULL, message_id TEXT NOT NULL, fingerprint TEXT NOT NULL,
  expires_at INTEGER NOT NULL, PRIMARY KEY (queue, ikey)
) WITHOUT ROWID;
CREATE INDEX ix_idempotency_expiry ON idempotency(expires_at);
INSERT INTO meta (k, v) VALUES ('schema_version', '1');
"#;

/// A store written by schema version 1 opens, migrates, and orders its keys: the
/// oldest message of key `a` is leased (so its key waits), `a#1` and `a#2` wait, and a
/// scheduled message of `b` due later is found by the per-queue scheduled index.
#[tokio::test]
async fn store_from_schema_version_1_is_migrated_and_orders_keys() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let conn = Connection::open(dir.path().join("redrive.db")).expect("create v1");
        conn.execute_batch("PRAGMA journal_mode = WAL;")
            .expect("wal");
        conn.execute_batch(SCHEMA_V1).expect("v1 schema");
        // (n, state, key, due_at, lease_expires_at)
        let rows = [
            (0, 2, "a", Some(0i64), Some(at(60_000).as_millis())),
            (1, 1, "a", Some(0), None),
            (2, 1, "a", Some(0), None),
            (3, 0, "b", Some(at(5_000).as_millis()), None),
        ];
        for (n, state, key, due, expires) in rows {
            conn.execute(
                "INSERT INTO messages (id, queue, state, priority, due_at, msg_key, payload, \
                 attempts, created_at, updated_at, lease_token, leased_at, lease_expires_at) \
                 VALUES (?1, ?2, ?3, 0, ?4, ?5, ?6, ?7, ?8, ?8, ?9, ?10, ?11)",
                params![
                    MessageId::new().to_string(),
                    Q,
                    state,
                    due,
                    key,
                    json!({ "n": n }).to_string(),
                    if state == 2 { 1 } else { 0 },
                    at(0).as_millis(),
                    (state == 2).then_some("1-token"),
                    (state == 2).then_some(at(0).as_millis()),
                    expires,
                ],
            )
            .expect("insert v1 row");
        }
    }
    let s = open(dir.path(), settings(Ordering::Key, OnDead::Skip));
    assert!(lease(&s, Q, 10, 10).await.is_empty(), "key a is leased");
    let version: String = peek(dir.path())
        .query_row("SELECT v FROM meta WHERE k = 'schema_version'", [], |r| {
            r.get(0)
        })
        .expect("version");
    assert!(version.parse::<i64>().expect("number") >= 3, "{version}");
    let tick = s.tick(Some(at(5_000))).await.expect("tick");
    assert_eq!(
        tick.ready_queues,
        vec![Q.to_owned()],
        "b#3 is due and promoted"
    );
    let got: Vec<u64> = lease(&s, Q, 10, 5_000)
        .await
        .iter()
        .map(payload_n)
        .collect();
    assert_eq!(got, vec![3], "key a still waits for its leased head");
    s.close().await;
}

// ---- property: per-key ordering exactly as the old lease query decided it ----

/// The old lease pick (before `key_order`), kept as the oracle of SPEC §4's per-key
/// rule: a ready message is leasable when no earlier message of its key is pending
/// (dead too under `block`) and no message of its key is leased.
///
/// A lease of a queue without per-key ordering is held in the store's memory, its row still
/// `ready` (or `scheduled`) in the file: `held.leased` are those (the messages the store
/// shows leased while the file does not), left out of the pick. The tick's promotion on
/// such a queue is held there too, its row still `scheduled` in the file: `held.promoted`
/// are those (the store shows them ready), taken into the pick.
fn oracle_pick(conn: &Connection, settings: &QueueSettings, max: u32, held: &Held) -> Vec<String> {
    let blocking = match settings.on_dead {
        OnDead::Skip => "0, 1, 2",
        OnDead::Block => "0, 1, 2, 4",
    };
    let sql = match settings.ordering {
        Ordering::None => "SELECT id FROM messages WHERE queue = ?1 AND state IN (0, 1) \
                           ORDER BY priority DESC, due_at, seq"
            .to_owned(),
        Ordering::Key => format!(
            "SELECT id FROM messages m WHERE queue = ?1 AND state = 1 AND (msg_key IS NULL OR ( \
             NOT EXISTS (SELECT 1 FROM messages p WHERE p.queue = ?1 AND p.msg_key = m.msg_key \
              AND p.seq < m.seq AND p.state IN ({blocking})) \
             AND NOT EXISTS (SELECT 1 FROM messages l WHERE l.queue = ?1 AND l.msg_key = m.msg_key \
              AND l.state = 2))) \
             ORDER BY priority DESC, due_at, seq"
        ),
    };
    let ids: Vec<String> = conn
        .prepare(&sql)
        .expect("oracle sql")
        .query_map(params![Q], |r| r.get(0))
        .expect("oracle query")
        .collect::<Result<_, _>>()
        .expect("oracle rows");
    ids.into_iter()
        .filter(|id| !held.leased.contains(id) && held.ready.contains(id))
        .take(max as usize)
        .collect()
}

/// What the store holds in memory beside the file: see [`oracle_pick`].
struct Held {
    /// Leased in the store, `ready` or `scheduled` in the file.
    leased: std::collections::HashSet<String>,
    /// Ready in the store: `ready` in the file, or `scheduled` and promoted in memory.
    ready: std::collections::HashSet<String>,
}

/// The messages whose row in the file is `ready` or `scheduled`, as the store shows them
/// (their leases and promotions held in memory: see [`oracle_pick`]).
async fn held_in_memory(s: &SqliteStore, conn: &Connection) -> Held {
    let rows: Vec<(String, u8)> = conn
        .prepare("SELECT id, state FROM messages WHERE queue = ?1 AND state IN (0, 1)")
        .expect("sql")
        .query_map([Q], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    let mut held = Held {
        leased: Default::default(),
        ready: Default::default(),
    };
    for (id, file_state) in rows {
        let m = s
            .get(id.parse().expect("id"))
            .await
            .expect("get")
            .expect("found");
        match m.state {
            redrive_core::State::Leased => {
                held.leased.insert(id);
            }
            redrive_core::State::Ready => {
                held.ready.insert(id);
            }
            _ => assert_eq!(file_state, 0, "{id}: ready in the file, not in the store"),
        }
    }
    held
}

/// `key_order` of every message against its definition: NULL for a message taking no
/// part in its key's order, 0 for the oldest one taking part when nothing of its key is
/// leased, 1 for the others.
fn check_key_order(conn: &Connection, settings: &QueueSettings) -> Result<(), TestCaseError> {
    let rows: Vec<(i64, Option<String>, u8, Option<i64>)> = conn
        .prepare("SELECT seq, msg_key, state, key_order FROM messages ORDER BY seq")
        .expect("sql")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    let takes_part = |state: u8| match (settings.ordering, settings.on_dead) {
        (Ordering::None, _) => false,
        (Ordering::Key, OnDead::Skip) => state <= 2,
        (Ordering::Key, OnDead::Block) => state != 3,
    };
    let mut head: HashMap<&str, i64> = HashMap::new();
    let mut leased: HashMap<&str, bool> = HashMap::new();
    for (seq, key, state, _) in &rows {
        if let Some(k) = key.as_deref() {
            if takes_part(*state) {
                head.entry(k).or_insert(*seq);
            }
            *leased.entry(k).or_default() |= *state == 2;
        }
    }
    for (seq, key, state, value) in &rows {
        let want = match key.as_deref() {
            Some(k) if takes_part(*state) => {
                Some(if head[k] == *seq && !leased[k] { 0 } else { 1 })
            }
            _ => None,
        };
        prop_assert_eq!(
            *value,
            want,
            "key_order of seq {} ({:?}, state {})",
            seq,
            key,
            state
        );
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    Publish {
        key: Option<u8>,
        priority: u8,
        delay_ms: Option<u64>,
        failed: Option<ErrorClass>,
    },
    Lease {
        max: u32,
        lease_ms: u64,
    },
    Ack {
        pick: Index,
    },
    Nack {
        pick: Index,
        permanent: bool,
    },
    Advance {
        ms: u64,
        tick: bool,
    },
    Redrive {
        pick: Index,
    },
    Kill {
        pick: Index,
    },
    Delete {
        pick: Index,
    },
    /// Close and reopen the store with this queue's ordering changed.
    Reopen {
        ordering: Ordering,
        on_dead: OnDead,
    },
}

fn quarters(n: u64) -> impl Strategy<Value = u64> {
    (0..=n).prop_map(|q| q * 250)
}

fn op() -> impl Strategy<Value = Op> {
    let failed = prop_oneof![
        8 => Just(None),
        1 => Just(Some(ErrorClass::Transient)),
        1 => Just(Some(ErrorClass::Permanent))
    ];
    let ordering = prop_oneof![1 => Just(Ordering::None), 3 => Just(Ordering::Key)];
    let on_dead = prop_oneof![Just(OnDead::Skip), Just(OnDead::Block)];
    prop_oneof![
        5 => (prop::option::weighted(0.85, 0u8..3), 0u8..=1, prop::option::weighted(0.2, quarters(8)), failed)
            .prop_map(|(key, priority, delay_ms, failed)| Op::Publish { key, priority, delay_ms, failed }),
        5 => (1u32..=4, 2u64..=8).prop_map(|(max, q)| Op::Lease { max, lease_ms: q * 250 }),
        3 => any::<Index>().prop_map(|pick| Op::Ack { pick }),
        3 => (any::<Index>(), prop::bool::weighted(0.3)).prop_map(|(pick, permanent)| Op::Nack { pick, permanent }),
        3 => (quarters(8), prop::bool::weighted(0.8)).prop_map(|(ms, tick)| Op::Advance { ms, tick }),
        2 => any::<Index>().prop_map(|pick| Op::Redrive { pick }),
        1 => any::<Index>().prop_map(|pick| Op::Kill { pick }),
        1 => any::<Index>().prop_map(|pick| Op::Delete { pick }),
        1 => (ordering, on_dead).prop_map(|(ordering, on_dead)| Op::Reopen { ordering, on_dead }),
    ]
}

/// Refusals a random operation may meet (wrong state, stale token …); anything else
/// is a failure.
fn expected_refusal(r: Result<(), StoreError>) -> Result<(), TestCaseError> {
    match r {
        Ok(())
        | Err(StoreError::NotFound(_))
        | Err(StoreError::LeaseMismatch)
        | Err(StoreError::LeaseExpired)
        | Err(StoreError::LeaseSettled(_))
        | Err(StoreError::InvalidState { .. }) => Ok(()),
        Err(e) => Err(TestCaseError::fail(format!("unexpected error: {e}"))),
    }
}

struct Run {
    dir: tempfile::TempDir,
    store: SqliteStore,
    settings: QueueSettings,
    now: i64,
    next_n: u32,
    ids: Vec<MessageId>,
    /// The latest lease token of each message leased so far.
    tokens: HashMap<MessageId, String>,
}

impl Run {
    fn pick(&self, i: &Index) -> Option<MessageId> {
        (!self.ids.is_empty()).then(|| self.ids[i.index(self.ids.len())])
    }

    fn pick_leased(&self, i: &Index) -> Option<LeaseRef> {
        let mut leased: Vec<(&MessageId, &String)> = self.tokens.iter().collect();
        leased.sort();
        (!leased.is_empty()).then(|| {
            let (id, token) = leased[i.index(leased.len())];
            LeaseRef {
                id: *id,
                token: token.clone(),
            }
        })
    }

    async fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let now = at(self.now);
        let s = &self.store;
        match op {
            Op::Publish {
                key,
                priority,
                delay_ms,
                failed,
            } => {
                let item = NewMessage {
                    key: key.map(|k| format!("k{k}")),
                    priority: *priority,
                    deliver_at: delay_ms.map(|d| now.plus_ms(d)),
                    failed: failed.map(|c| Failure::new(c, "seen elsewhere")),
                    ..NewMessage::new(Q, json!({ "n": self.next_n }))
                };
                self.next_n += 1;
                let out = s
                    .publish(vec![item], Some(now))
                    .await
                    .map_err(|e| TestCaseError::fail(format!("publish: {e}")))?;
                self.ids.push(out[0].message.id);
            }
            Op::Lease { max, lease_ms } => {
                // `peek` reads the file: first let the store commit the leases it answered
                // (a lease is answered before its commit; the store's own reads wait for it).
                s.queue_stats()
                    .await
                    .map_err(|e| TestCaseError::fail(format!("stats: {e}")))?;
                let conn = peek(self.dir.path());
                let held = held_in_memory(s, &conn).await;
                let want = oracle_pick(&conn, &self.settings, *max, &held);
                let got = s
                    .lease(
                        LeaseRequest {
                            queue: Q.into(),
                            max: *max,
                            lease_ms: *lease_ms,
                            max_bytes: None,
                        },
                        Some(now),
                    )
                    .await
                    .map_err(|e| TestCaseError::fail(format!("lease: {e}")))?;
                let got_ids: Vec<String> = got.iter().map(|l| l.message.id.to_string()).collect();
                prop_assert_eq!(got_ids, want, "lease of {} under {:?}", max, self.settings);
                for l in got {
                    self.tokens.insert(l.message.id, l.token);
                }
            }
            Op::Ack { pick } => {
                if let Some(lease) = self.pick_leased(pick) {
                    let r = s.ack(vec![lease.into()], Some(now)).await;
                    let r = r.map_err(|e| TestCaseError::fail(format!("ack: {e}")))?;
                    expected_refusal(r.into_iter().next().expect("one").map(|_| ()))?;
                }
            }
            Op::Nack { pick, permanent } => {
                if let Some(lease) = self.pick_leased(pick) {
                    let class = if *permanent {
                        ErrorClass::Permanent
                    } else {
                        ErrorClass::Transient
                    };
                    let nack = Nack {
                        response: None,
                        waited: Vec::new(),
                        lease,
                        failure: Failure::new(class, "failed"),
                    };
                    let r = s.nack(vec![nack], Some(now)).await;
                    let r = r.map_err(|e| TestCaseError::fail(format!("nack: {e}")))?;
                    expected_refusal(r.into_iter().next().expect("one").map(|_| ()))?;
                }
            }
            Op::Advance { ms, tick } => {
                self.now += *ms as i64;
                if *tick {
                    s.tick(Some(at(self.now)))
                        .await
                        .map_err(|e| TestCaseError::fail(format!("tick: {e}")))?;
                }
            }
            Op::Redrive { pick } => {
                if let Some(id) = self.pick(pick) {
                    expected_refusal(s.redrive(id, Some(now)).await.map(|_| ()))?;
                }
            }
            Op::Kill { pick } => {
                if let Some(id) = self.pick(pick) {
                    expected_refusal(s.kill(id, None, Some(now)).await.map(|_| ()))?;
                }
            }
            Op::Delete { pick } => {
                if let Some(id) = self.pick(pick) {
                    expected_refusal(s.delete(id).await.map(|_| ()))?;
                }
            }
            Op::Reopen { ordering, on_dead } => {
                self.store.close().await;
                self.settings = settings(*ordering, *on_dead);
                self.store = open(self.dir.path(), self.settings.clone());
            }
        }
        self.store
            .queue_stats()
            .await
            .map_err(|e| TestCaseError::fail(format!("stats: {e}")))?;
        check_key_order(&peek(self.dir.path()), &self.settings)
    }
}

async fn run(on_dead: OnDead, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let settings = settings(Ordering::Key, on_dead);
    let store = open(dir.path(), settings.clone());
    let mut run = Run {
        dir,
        store,
        settings,
        now: 0,
        next_n: 0,
        ids: Vec::new(),
        tokens: HashMap::new(),
    };
    let mut result = Ok(());
    for (i, op) in ops.iter().enumerate() {
        if let Err(e) = run.step(op).await {
            result = Err(TestCaseError::fail(format!("step {i} ({op:?}): {e}")));
            break;
        }
    }
    run.store.close().await;
    result
}

proptest! {
    // 64 cases of up to 48 steps take a few seconds with buffered commits.
    #![proptest_config(ProptestConfig {
        cases: 64,
        max_shrink_iters: 500,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Every lease on a key-ordered queue leases exactly what the old lease query
    /// picked (SPEC §4 unchanged), and `key_order` matches its definition after every
    /// step: publish (also of failed and delayed messages), lease, ack, nack to retry or
    /// death, lease expiry and promotion by the tick, redrive, kill, delete, and reopens
    /// that change the queue's ordering.
    #[test]
    fn key_ordered_leases_match_the_per_key_rule_on_random_operations(
        block in any::<bool>(),
        ops in prop::collection::vec(op(), 8..=48),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let on_dead = if block { OnDead::Block } else { OnDead::Skip };
        rt.block_on(run(on_dead, ops))?;
    }
}

/// A lease with a byte bound stops before the messages' stored JSON passes it (at least one),
/// in one call, and leaves the rest ready: an API answer stays under its size limit without
/// leasing a message it cannot answer, and without a second commit.
#[tokio::test]
async fn lease_stops_at_max_bytes_and_leaves_the_rest_ready() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(SqliteOptions::new(dir.path())).unwrap();
    let now = redrive_core::Timestamp::from_millis(1_000_000);
    let items = (0..10)
        .map(|_| NewMessage::new("big", serde_json::Value::String("z".repeat(1_000))))
        .collect();
    store.publish(items, Some(now)).await.unwrap();
    let lease = |max_bytes| LeaseRequest {
        queue: "big".into(),
        max: 10,
        lease_ms: 60_000,
        max_bytes,
    };
    // Each payload is 1,002 bytes of JSON: 3,500 bytes hold three.
    let got = store.lease(lease(Some(3_500)), Some(now)).await.unwrap();
    assert_eq!(got.len(), 3);
    // A bound smaller than one message still leases one.
    let got = store.lease(lease(Some(10)), Some(now)).await.unwrap();
    assert_eq!(got.len(), 1);
    let stats = store.queue_stats().await.unwrap();
    assert_eq!(stats[0].count(redrive_core::State::Ready), 6);
    assert_eq!(stats[0].count(redrive_core::State::Leased), 4);
    let got = store.lease(lease(None), Some(now)).await.unwrap();
    assert_eq!(got.len(), 6, "no bound: all the rest");
    store.close().await;
}
