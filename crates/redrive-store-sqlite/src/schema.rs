//! The on-disk schema of the embedded store.
//!
//! One `messages` table holds every message in every state; partial indexes
//! make each hot query an index range scan over only the rows it can match:
//! `ix_ready` (lease: queue, priority, due time — leasable ready messages only),
//! `ix_ready_blocked` (the oldest ready message that waits behind its key, for
//! stats), `ix_scheduled` (the scheduler: due time per queue, so that one tick
//! promotes fairly across queues), `ix_leased` (the reaper: earliest lease
//! expiry), `ix_done` (purge), `ix_key_order` (per-key ordering: the messages
//! of a key that take part in its order, oldest first), `ix_key_leased`
//! (per-key ordering: is any message of a key leased), `ix_key` (search by
//! key), `ix_queue` (operator search by queue, newest first) and `ix_dead`
//! (dead letters of a queue, newest first).
//!
//! Per-key ordering is kept in the `key_order` column, maintained by
//! `key_order.rs` on every transition that can change which message heads a
//! key: NULL for a message that takes no part in its key's order (no key, a
//! queue without `ordering = "key"`, done, or dead under `on_dead = "skip"`),
//! 0 for the one message of a key that may be leased now (the oldest message
//! taking part, when no message of the key is leased), 1 for the others. The
//! ready messages blocked behind their key's head are left out of `ix_ready`,
//! so a lease never walks a key's backlog: its cost does not depend on how many
//! messages one hot key has waiting (before, leasing on a key-ordered queue
//! tested each ready row for an earlier pending one of its key: 14 ms with
//! 20,000 messages of one key blocked).
//!
//! Write amplification shapes this list. Every index a transition touches is a
//! page rewritten into the WAL at commit; an index ordered by time (`ix_ready`,
//! `ix_scheduled`, `ix_leased`, `ix_done`) is touched near its end, so the
//! transitions of one commit share its pages, while an index ordered by `seq`
//! and keyed by state would take a random page per transition (messages fall
//! due in any order). So no general index includes `state`: only the partial
//! ones do, and `ix_dead` changes only when a message dies or leaves death.
//! `ix_key_order` is partial on `key_order` (not on `state`), so it is touched
//! only when a message joins or leaves its key's order or its key's head
//! changes, and never for queues without per-key ordering.
//! The page size is 1 KiB for the same reason: a transition rewrites its row's
//! page, and a 1 KiB page costs a quarter of the WAL bytes of a 4 KiB one when
//! rows are touched in random order (measured: 313 KB of WAL per commit with
//! 4 KiB pages on the delayed-delivery benchmark).

use crate::sql_error::SqlResultExt;
use rusqlite::Connection;

/// Bumped when the schema changes; a store refuses to open a newer one, and upgrades
/// an older one with [`MIGRATIONS`].
///
/// - 1: the first release.
/// - 2: `idempotency.tombstone` (what a key remembers of its purged message, so a replay
///   after the purge answers the original) and `messages.window_start` (the start of the
///   `max_age` window, moved by a redrive; `NULL` means `created_at`).
/// - 3: per-key ordering state in `messages.key_order` (NULL everywhere after the step;
///   `key_order::reconcile` then fills it for key-ordered queues, as for any change of a
///   queue's ordering), `ix_ready` without the messages waiting behind their key's head,
///   and `ix_scheduled` per queue (fair promotion). The new indexes are created by
///   [`SCHEMA`]; the step drops the two whose definition changed.
/// - 4: `ix_key_leased` only holds leased messages that have a key (it held every leased
///   message, so each lease and each ack or nack of a message without a key inserted and
///   deleted an entry nobody reads).
/// - 5: `messages.target_url` (push delivery's per-message target).
/// - 6: the `tasks` and `audit` tables (bulk tasks and the audit log of the console); new
///   tables only, created by [`SCHEMA`].
/// - 7: `messages.lease_end` (how the lease of `lease_token` ended: `acked`, `nacked`,
///   `released`, `expired`, `killed`; so a late call with that token answers 409
///   `lease_settled` saying how, and `lease_expired` only when it expired) and
///   `messages.released` (a consumer's uncharged releases, bounded by `max_rate_limited`).
///   Rows from before have `lease_end` NULL: `transitions.rs::legacy_lease_end` tells how
///   their last lease ended from the row and its history, when a token asks.
/// - 8: the `sessions` table (the console's sessions, kept in the store: `sessions.rs`; new,
///   created by [`SCHEMA`]) and `audit.node` (the node that recorded an entry; NULL in the
///   entries from before).
pub const SCHEMA_VERSION: i64 = 8;

/// The steps from each older version to the next: `(from, SQL)`. Each step only adds
/// (columns that may be `NULL`, tables, indexes), so it is cheap on a large database
/// (SQLite's `ADD COLUMN` rewrites nothing) and the rows it finds keep their meaning.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "ALTER TABLE idempotency ADD COLUMN tombstone TEXT; \
         ALTER TABLE messages ADD COLUMN window_start INTEGER;",
    ),
    (
        2,
        "ALTER TABLE messages ADD COLUMN key_order INTEGER; \
         DROP INDEX IF EXISTS ix_ready; \
         DROP INDEX IF EXISTS ix_scheduled;",
    ),
    (3, "DROP INDEX IF EXISTS ix_key_leased;"),
    (4, "ALTER TABLE messages ADD COLUMN target_url TEXT;"),
    (
        6,
        "ALTER TABLE messages ADD COLUMN lease_end TEXT; \
         ALTER TABLE messages ADD COLUMN released INTEGER NOT NULL DEFAULT 0;",
    ),
    // A database from before v6 has no `audit` table yet (SCHEMA creates tables after the
    // steps): the step creates it as v6 had it, then adds the column.
    (
        7,
        "CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, \
         at INTEGER NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL, target TEXT, \
         filter TEXT, count INTEGER NOT NULL, detail TEXT); \
         ALTER TABLE audit ADD COLUMN node TEXT;",
    ),
];

const SCHEMA: &str = r#"
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
  history           TEXT NOT NULL DEFAULT '[]',
  window_start      INTEGER,
  key_order         INTEGER,
  target_url        TEXT,
  lease_end         TEXT,
  released          INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS ix_ready ON messages(queue, priority DESC, due_at, seq) WHERE state = 1 AND key_order IS NOT 1;
CREATE INDEX IF NOT EXISTS ix_ready_blocked ON messages(queue, due_at) WHERE state = 1 AND key_order = 1;
CREATE INDEX IF NOT EXISTS ix_scheduled ON messages(queue, due_at) WHERE state = 0;
CREATE INDEX IF NOT EXISTS ix_leased ON messages(lease_expires_at) WHERE state = 2;
CREATE INDEX IF NOT EXISTS ix_done ON messages(finished_at) WHERE state = 3;
CREATE INDEX IF NOT EXISTS ix_key ON messages(queue, msg_key, seq) WHERE msg_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS ix_key_order ON messages(queue, msg_key, seq) WHERE key_order IS NOT NULL;
CREATE INDEX IF NOT EXISTS ix_key_leased ON messages(queue, msg_key) WHERE state = 2 AND msg_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS ix_queue ON messages(queue, seq);
CREATE INDEX IF NOT EXISTS ix_dead ON messages(queue, seq) WHERE state = 4;
CREATE TABLE IF NOT EXISTS idempotency (
  queue       TEXT NOT NULL,
  ikey        TEXT NOT NULL,
  message_id  TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  expires_at  INTEGER NOT NULL,
  tombstone   TEXT,
  PRIMARY KEY (queue, ikey)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ix_idempotency_expiry ON idempotency(expires_at);
CREATE TABLE IF NOT EXISTS tasks (
  id          TEXT PRIMARY KEY,
  action      TEXT NOT NULL,
  spec        TEXT NOT NULL,
  state       TEXT NOT NULL,
  total       INTEGER NOT NULL,
  done        INTEGER NOT NULL DEFAULT 0,
  failed      INTEGER NOT NULL DEFAULT 0,
  cursor      TEXT,
  created_by  TEXT NOT NULL,
  created_at  INTEGER NOT NULL,
  updated_at  INTEGER NOT NULL,
  stop_reason TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ix_tasks_state ON tasks(state, id);
CREATE TABLE IF NOT EXISTS audit (
  seq     INTEGER PRIMARY KEY AUTOINCREMENT,
  at      INTEGER NOT NULL,
  actor   TEXT NOT NULL,
  action  TEXT NOT NULL,
  target  TEXT,
  filter  TEXT,
  count   INTEGER NOT NULL,
  detail  TEXT,
  node    TEXT
);
CREATE TABLE IF NOT EXISTS sessions (
  id         TEXT PRIMARY KEY,
  token      TEXT NOT NULL,
  csrf       TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  last_seen  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ix_sessions_token ON sessions(token, last_seen);
CREATE INDEX IF NOT EXISTS ix_sessions_seen ON sessions(last_seen);
"#;

/// Create the schema, or upgrade an older one, or refuse a newer one; one transaction.
pub fn migrate(conn: &Connection) -> Result<(), redrive_storage::StoreError> {
    // The version before anything is created: `meta` is missing in a new database.
    let found: Option<String> = conn
        .query_row("SELECT v FROM meta WHERE k = 'schema_version'", [], |r| {
            r.get(0)
        })
        .ok();
    let found = match found {
        None => None,
        Some(v) => Some(v.parse::<i64>().map_err(|_| {
            redrive_storage::StoreError::Backend(format!(
                "data directory has a bad schema version {v:?}"
            ))
        })?),
    };
    if let Some(v) = found {
        if v > SCHEMA_VERSION {
            return Err(redrive_storage::StoreError::Backend(format!(
                "data directory has schema version {v}, this redrive knows {SCHEMA_VERSION}: upgrade redrive"
            )));
        }
    }
    conn.execute_batch("BEGIN IMMEDIATE").db()?;
    let r = (|| {
        if let Some(v) = found {
            for (from, step) in MIGRATIONS {
                if *from >= v {
                    conn.execute_batch(step).db()?;
                    tracing::info!(from, to = from + 1, "upgraded the data directory's schema");
                }
            }
        }
        conn.execute_batch(SCHEMA).db()?;
        conn.execute(
            "INSERT OR REPLACE INTO meta (k, v) VALUES ('schema_version', ?1)",
            [SCHEMA_VERSION.to_string()],
        )
        .db()?;
        Ok(())
    })();
    match r {
        Ok(()) => conn.execute_batch("COMMIT").db(),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// The column list every message read uses, in [`crate::row::Row`] order, as a literal so
/// that queries are `concat!`ed at compile time (no `format!` on the writer's hot path).
macro_rules! columns {
    () => {
        "seq, id, queue, state, priority, due_at, msg_key, idempotency_key, payload, \
         headers, attempts, budget_base, uncounted, prev_delay_ms, created_at, updated_at, lease_token, \
         leased_at, lease_expires_at, finished_at, dead_reason, last_error, window_start, target_url, \
         lease_end, released"
    };
}
pub(crate) use columns;

/// [`columns!`] as a constant, for queries assembled at run time.
pub const COLUMNS: &str = columns!();

/// The index of `history` when a query selects it right after [`columns!`].
pub const HISTORY_COLUMN: usize = 26;
