//! The schema of the MySQL / MariaDB store, and its migrations.
//!
//! # Shape, and why
//!
//! What hurts a queue on InnoDB is locking, not table count (`shared/design/scale-out.md`,
//! §MySQL): under `REPEATABLE READ` a range claim over a `(status, next_retry_at)` index
//! takes gap locks that producers' inserts queue behind (insert-intention deadlocks), and
//! every status change moves the row inside that index. So:
//!
//! - Every session runs at `READ COMMITTED` (no gap locks on reads or claims).
//! - `ready` is the claim's own narrow table: one row per leasable message (state ready,
//!   not waiting behind its key), `(queue, rnk, due_at, seq)` in claim order (`rnk` is
//!   `255 - priority`, so that one ascending index serves "highest priority first" on
//!   MariaDB 10.6, whose indexes cannot be descending). A claim reads it with `FOR UPDATE
//!   SKIP LOCKED`, then locks the message rows by primary key (`SKIP LOCKED` again), updates
//!   them and deletes the `ready` rows, all by primary key, in one short transaction. A
//!   transition into or out of ready inserts or deletes its `ready` row by primary key
//!   ([`crate::transitions::sync_ready`]). Nothing range-deletes rows of `ready` or
//!   `messages`: the purge deletes done messages by primary key in bounded batches.
//!   `ready.rid` (auto-increment) and `ready.node` let the other nodes poll for messages
//!   made ready elsewhere (`poll.rs`): MySQL has no LISTEN.
//! - `messages` holds identity, content and lifecycle, one row per message. The scheduled,
//!   leased and done sets are *stored generated columns* that are NULL outside their state
//!   (`sched_queue`/`sched_due`, `lease_due`, `done_at`), each indexed: InnoDB has no partial
//!   indexes, and a range scan `sched_due <= t` never visits the NULLs, so the tick, the
//!   reaper and the purge each read only the rows they can take. They were VIRTUAL until
//!   step 5: MariaDB 10.11 once died at every start in the purge of this table (signal 11;
//!   it resembles MDEV-39261, indexed virtual columns), and a STORED column's index is
//!   maintained from the row as written, with nothing for the purge to compute.
//! - The history is appended as rows of `history` (message seq, n, entry JSON text), never a
//!   JSON array rewritten on every attempt.
//! - `idempotency` (queue, key → message id, payload fingerprint, expiry, tombstone)
//!   outlives purged messages for the whole window.
//! - Per-key ordering: `messages.key_blocked` (NULL: takes no part; false: the head; true:
//!   waits) and `key_heads` (queue, key → the head), as in the PostgreSQL store
//!   (`key_order.rs`); only a head that is ready has a `ready` row.
//! - `meta`, `tasks`, `audit`, `sessions`, `nodes`, `leader`, `endpoint_trips`: as in the
//!   PostgreSQL store. `meta` also records what transactional enqueue needs: the server's
//!   limits (`sql_publish`, written at every open) and how payloads are fingerprinted
//!   (`payload_fingerprint`, chosen once, at step 4).
//! - The stored procedures `redrive_publish` and `redrive_publish_out`: transactional
//!   enqueue from an application's own transaction (`sql_publish.rs`).
//!
//! Times are `BIGINT` milliseconds since the epoch (a caller's clock is honoured exactly;
//! the database's is `UNIX_TIMESTAMP(NOW(3)) * 1000` when no time is given). Text that is
//! compared or ranged (`queue`, `msg_key`, `ikey`, `id`) is `VARBINARY`: byte order, so an
//! idempotency-key prefix is an index range whatever the server's collation.
//!
//! # Migrations
//!
//! `schema_migrations` (version, applied_at) records the steps applied. [`migrate`] holds
//! `GET_LOCK` (named after the database) while it runs each missing step of [`STEPS`]
//! (MySQL's DDL commits by itself, so a step's statements are written to be run again:
//! `IF NOT EXISTS`, `INSERT IGNORE`, `DROP PROCEDURE IF EXISTS`), and refuses a database whose
//! version is newer than [`SCHEMA_VERSION`], naming both. Step 4's statements depend on the
//! server (MariaDB or MySQL, and whether it has `JSON_NORMALIZE`: [`steps`]).

use crate::error::E;
use crate::sql::{args, col, execute, query_one, Db};
use crate::sql_publish::{self, Canon};
use mysql_async::prelude::Queryable;
use mysql_async::Params;
use redrive_storage::StoreError;

/// The newest schema version this build knows.
///
/// - 1: `messages`, `history`, `ready`, `idempotency`, `key_heads`.
/// - 2: `meta`, `tasks`, `audit`.
/// - 3: the cluster's `nodes`, `leader` and `endpoint_trips`, and the console's `sessions`.
/// - 4: transactional enqueue: the procedures `redrive_publish` and `redrive_publish_out`,
///   and `meta.payload_fingerprint` (idempotency fingerprints computed by the database on
///   both paths; the FNV-1a fingerprints of records written before stay readable until
///   they expire: `sql_publish::fingerprint_matches`).
/// - 5: the generated columns of `messages` STORED instead of VIRTUAL (one `ALTER TABLE`,
///   which rebuilds the table: the upgrade of a large `messages` takes a while, once).
pub const SCHEMA_VERSION: i64 = 5;

const TABLE: &str = "ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin";

/// The steps' versions, applied in order.
const STEPS: [i64; 5] = [1, 2, 3, 4, 5];
const _: () = assert!(STEPS[STEPS.len() - 1] == SCHEMA_VERSION);

/// The statements of step `step` on this server (`mariadb`), whose earlier steps are applied.
async fn steps(c: &mut mysql_async::Conn, step: i64, mariadb: bool) -> Result<Vec<String>, E> {
    Ok(match step {
        1 => v1(),
        2 => v2(),
        3 => v3(),
        4 => v4(c, mariadb).await?,
        5 => v5(),
        _ => Vec::new(),
    })
}

fn v1() -> Vec<String> {
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS messages (
  seq               BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  id                VARBINARY(64) NOT NULL,
  queue             VARBINARY(128) NOT NULL,
  state             TINYINT NOT NULL,
  priority          SMALLINT NOT NULL,
  due_at            BIGINT NULL,
  msg_key           VARBINARY(2048) NULL,
  idempotency_key   VARBINARY(2048) NULL,
  payload           LONGTEXT NOT NULL,
  headers           LONGTEXT NULL,
  target_url        TEXT NULL,
  attempts          INT NOT NULL DEFAULT 0,
  budget_base       INT NOT NULL DEFAULT 0,
  uncounted         INT NOT NULL DEFAULT 0,
  released          INT NOT NULL DEFAULT 0,
  prev_delay_ms     BIGINT NULL,
  created_at        BIGINT NOT NULL,
  updated_at        BIGINT NOT NULL,
  window_start      BIGINT NULL,
  lease_token       VARBINARY(128) NULL,
  leased_at         BIGINT NULL,
  lease_expires_at  BIGINT NULL,
  lease_end         VARCHAR(16) NULL,
  finished_at       BIGINT NULL,
  dead_reason       VARCHAR(32) NULL,
  error_class       VARCHAR(32) NULL,
  last_error        LONGTEXT NULL,
  key_blocked       BOOLEAN NULL,
  sched_queue       VARBINARY(128) AS (CASE WHEN state = 0 THEN queue END) VIRTUAL,
  sched_due         BIGINT AS (CASE WHEN state = 0 THEN due_at END) VIRTUAL,
  lease_due         BIGINT AS (CASE WHEN state = 2 THEN lease_expires_at END) VIRTUAL,
  done_at           BIGINT AS (CASE WHEN state = 3 THEN finished_at END) VIRTUAL,
  UNIQUE KEY ux_id (id),
  KEY ix_scheduled (sched_queue, sched_due),
  KEY ix_sched_due (sched_due),
  KEY ix_leased (lease_due),
  KEY ix_done (done_at),
  KEY ix_queue (queue, seq),
  KEY ix_key (queue, msg_key, seq)
) {TABLE}"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS history (
  message_seq BIGINT NOT NULL,
  n           INT NOT NULL,
  entry       LONGTEXT NOT NULL,
  PRIMARY KEY (message_seq, n)
) {TABLE}"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS ready (
  seq    BIGINT NOT NULL PRIMARY KEY,
  queue  VARBINARY(128) NOT NULL,
  rnk    SMALLINT NOT NULL,
  due_at BIGINT NOT NULL,
  size   BIGINT NOT NULL,
  rid    BIGINT NOT NULL AUTO_INCREMENT,
  node   BIGINT NOT NULL,
  UNIQUE KEY ux_rid (rid),
  KEY ix_claim (queue, rnk, due_at, seq)
) {TABLE}"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS idempotency (
  queue       VARBINARY(128) NOT NULL,
  ikey        VARBINARY(2048) NOT NULL,
  message_id  VARBINARY(64) NOT NULL,
  fingerprint VARBINARY(64) NOT NULL,
  expires_at  BIGINT NOT NULL,
  tombstone   LONGTEXT NULL,
  PRIMARY KEY (queue, ikey),
  KEY ix_idempotency_expiry (expires_at)
) {TABLE}"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS key_heads (
  queue    VARBINARY(128) NOT NULL,
  msg_key  VARBINARY(2048) NOT NULL,
  head_seq BIGINT NULL,
  PRIMARY KEY (queue, msg_key)
) {TABLE}"
        ),
    ]
}

fn v2() -> Vec<String> {
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS meta (k VARBINARY(255) NOT NULL PRIMARY KEY, v LONGTEXT NOT NULL) {TABLE}"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS tasks (
  id          VARBINARY(255) NOT NULL PRIMARY KEY,
  action      VARCHAR(32) NOT NULL,
  spec        LONGTEXT NOT NULL,
  state       VARCHAR(32) NOT NULL,
  total       BIGINT NOT NULL,
  done        BIGINT NOT NULL DEFAULT 0,
  failed      BIGINT NOT NULL DEFAULT 0,
  cursor_at   LONGTEXT NULL,
  created_by  TEXT NOT NULL,
  created_at  BIGINT NOT NULL,
  updated_at  BIGINT NOT NULL,
  stop_reason LONGTEXT NULL,
  KEY ix_tasks_state (state, id)
) {TABLE}"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS audit (
  seq     BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  at      BIGINT NOT NULL,
  actor   TEXT NOT NULL,
  action  TEXT NOT NULL,
  target  LONGTEXT NULL,
  filter  LONGTEXT NULL,
  count   BIGINT NOT NULL,
  detail  LONGTEXT NULL,
  node    TEXT NULL
) {TABLE}"
        ),
    ]
}

fn v3() -> Vec<String> {
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS nodes (
  incarnation VARBINARY(255) NOT NULL PRIMARY KEY,
  node        TEXT NOT NULL,
  address     TEXT NOT NULL,
  version     TEXT NOT NULL,
  started_at  BIGINT NOT NULL,
  last_seen   BIGINT NOT NULL
) {TABLE}"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS leader (
  one         TINYINT NOT NULL PRIMARY KEY,
  incarnation VARBINARY(255) NULL,
  node        TEXT NULL,
  epoch       BIGINT NOT NULL DEFAULT 0,
  expires_at  BIGINT NOT NULL DEFAULT 0
) {TABLE}"
        ),
        "INSERT IGNORE INTO leader (one) VALUES (1)".to_owned(),
        format!(
            "CREATE TABLE IF NOT EXISTS endpoint_trips (
  endpoint    VARBINARY(2048) NOT NULL PRIMARY KEY,
  incarnation TEXT NOT NULL,
  tripped_at  BIGINT NOT NULL,
  open_until  BIGINT NOT NULL
) {TABLE}"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS sessions (
  id         VARBINARY(255) NOT NULL PRIMARY KEY,
  token      VARBINARY(255) NOT NULL,
  csrf       TEXT NOT NULL,
  created_at BIGINT NOT NULL,
  last_seen  BIGINT NOT NULL,
  KEY ix_sessions_token (token, last_seen),
  KEY ix_sessions_seen (last_seen)
) {TABLE}"
        ),
    ]
}

/// Step 4: transactional enqueue. The fingerprint kind is the one already recorded (a step
/// that ran before, in part) or the best this server has.
async fn v4(c: &mut mysql_async::Conn, mariadb: bool) -> Result<Vec<String>, E> {
    let canon = match sql_publish::canon_of(c).await? {
        Some(k) => k,
        None => Canon::probe(c, mariadb).await?,
    };
    let mut out = vec![format!(
        "INSERT IGNORE INTO meta (k, v) VALUES ('{}', '{}')",
        Canon::META_KEY,
        canon.as_str()
    )];
    out.extend(sql_publish::procedures(canon, mariadb));
    Ok(out)
}

/// Step 5: the generated columns STORED, with their indexes. One statement, so it is
/// atomic and can run again (it drops and adds the same columns).
fn v5() -> Vec<String> {
    vec!["ALTER TABLE messages
  DROP INDEX ix_scheduled, DROP INDEX ix_sched_due, DROP INDEX ix_leased, DROP INDEX ix_done,
  DROP COLUMN sched_queue, DROP COLUMN sched_due, DROP COLUMN lease_due, DROP COLUMN done_at,
  ADD COLUMN sched_queue VARBINARY(128) AS (CASE WHEN state = 0 THEN queue END) STORED,
  ADD COLUMN sched_due   BIGINT AS (CASE WHEN state = 0 THEN due_at END) STORED,
  ADD COLUMN lease_due   BIGINT AS (CASE WHEN state = 2 THEN lease_expires_at END) STORED,
  ADD COLUMN done_at     BIGINT AS (CASE WHEN state = 3 THEN finished_at END) STORED,
  ADD KEY ix_scheduled (sched_queue, sched_due),
  ADD KEY ix_sched_due (sched_due),
  ADD KEY ix_leased (lease_due),
  ADD KEY ix_done (done_at)"
        .to_owned()]
}

/// The name of the database's migration lock (`GET_LOCK`, also taken by
/// `key_order::reconcile`): at most 64 characters whatever the database's name.
pub fn lock_name(database: &str) -> String {
    format!(
        "redrive-migrate-{:016x}",
        redrive_core::fnv1a(database.as_bytes())
    )
}

/// How long an open waits for another open's migration lock, s.
const LOCK_WAIT_S: i64 = 60;

/// Take the database's migration lock on this connection (until [`unlock`]).
pub async fn lock<C: Db>(c: &mut C, database: &str) -> Result<(), E> {
    let r = query_one(
        c,
        "SELECT GET_LOCK(?, ?)",
        args![lock_name(database), LOCK_WAIT_S],
    )
    .await?;
    let got: Option<i64> = col(&r, 0)?;
    if got != Some(1) {
        return Err(E::Db(StoreError::Unavailable(format!(
            "MySQL database {database}: another redrive held the migration lock for {LOCK_WAIT_S} s"
        ))));
    }
    Ok(())
}

/// Release the migration lock.
pub async fn unlock<C: Db>(c: &mut C, database: &str) -> Result<(), E> {
    execute(c, "DO RELEASE_LOCK(?)", args![lock_name(database)]).await?;
    Ok(())
}

/// The version the database is at (0: none yet); creates `schema_migrations` if missing.
async fn version<C: Db>(c: &mut C) -> Result<i64, E> {
    c.query_drop(format!(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INT NOT NULL PRIMARY KEY, \
         applied_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) {TABLE}"
    ))
    .await?;
    let r = query_one(
        c,
        "SELECT MAX(version) FROM schema_migrations",
        Params::Empty,
    )
    .await?;
    let v: Option<i64> = col(&r, 0)?;
    Ok(v.unwrap_or(0))
}

/// Why a store refuses every call once a newer redrive migrated its database to `found`.
pub fn superseded(database: &str, found: i64) -> String {
    format!(
        "MySQL database {database} was upgraded to redrive schema version {found} by a newer \
         redrive while this one ran; this redrive knows versions up to {SCHEMA_VERSION}: stop \
         this node and start the newer version"
    )
}

/// Create redrive's tables or upgrade them, under the migration lock; refuse a newer
/// schema.
pub async fn migrate(c: &mut mysql_async::Conn, database: &str, mariadb: bool) -> Result<(), E> {
    lock(c, database).await?;
    let r = migrate_locked(c, database, mariadb).await;
    let u = unlock(c, database).await;
    r.and(u)
}

async fn migrate_locked(c: &mut mysql_async::Conn, database: &str, mariadb: bool) -> Result<(), E> {
    let found = version(c).await?;
    if found > SCHEMA_VERSION {
        return Err(E::Logic(StoreError::Backend(format!(
            "MySQL database {database} has redrive schema version {found}, this redrive knows \
             versions up to {SCHEMA_VERSION}: upgrade redrive (a newer one wrote it)"
        ))));
    }
    for step in STEPS {
        if found >= step {
            continue;
        }
        for s in &steps(c, step, mariadb).await? {
            c.query_drop(s.as_str()).await?;
        }
        execute(
            c,
            "INSERT IGNORE INTO schema_migrations (version) VALUES (?)",
            args![step],
        )
        .await?;
        tracing::info!(database, version = step, "migrated the MySQL schema");
    }
    Ok(())
}
