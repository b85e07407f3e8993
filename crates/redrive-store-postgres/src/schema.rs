//! The schema of the PostgreSQL store, and its migrations.
//!
//! # Shape, and why
//!
//! The research (`shared/design/scale-out.md`) found two layouts: one mutable table for
//! every state (River, Oban, pgmq, pg-boss …) and tables split by state (Solid Queue).
//! What makes a PostgreSQL queue slow is not the table count but what the claim must
//! read and what each transition leaves behind for vacuum. So:
//!
//! - `messages` holds identity, content and lifecycle, one row per message. Its payload,
//!   headers and last error are kept as the JSON *text* they were written as (the store
//!   never looks inside a payload; text keeps its bytes exactly, which `max_bytes`
//!   measures, and costs no `jsonb` parse on the write path but one for the idempotency
//!   fingerprint of a publish that has a key: the MD5 of its `jsonb` rendering, computed
//!   by the database, so that the SQL function `publish(…)` computes the same).
//! - `message_ids` (seq → id, queue; schema v10) is written once per message and holds the
//!   two indexes that every row needs whatever its state: `id`'s uniqueness (the lookups of
//!   ack, nack and the API) and the queue's index (the searches of one queue, newest
//!   first). A transition writes a new version of the `messages` row, which enters *every*
//!   index of `messages` (a state change is never a HOT update: the partial indexes'
//!   predicates change), so on `messages` those two took an entry per transition. Moved, a
//!   retry cycle's own database work is about a quarter less (`scripts/pg_shape_model.sh`).
//! - The history is *appended* as rows of `history` (message seq, n, entry `jsonb`), never
//!   a JSON array rewritten on every attempt: a failed attempt writes one small row, and
//!   the `messages` row does not grow with its history (a wide row would make every
//!   lifecycle update copy it whole: PostgreSQL updates write a new tuple).
//! - The ready set is a *partial index*, not a `ready` table: `ix_ready (queue, priority
//!   DESC, due_at, seq) WHERE state = 1 AND key_blocked IS NOT TRUE` holds exactly the
//!   messages a claim may take, in claim order, so a claim is an index range scan of `n`
//!   entries whatever else the table holds (scheduled, leased, done, dead, or the ready
//!   messages waiting behind their key). A separate `ready` table (Solid Queue's shape)
//!   would give the same narrow scan but make every transition into or out of ready an
//!   insert or a delete in a second table on top of the `messages` update the lifecycle
//!   needs anyway (twice the heap writes, twice the dead tuples), and a claim would have
//!   to join back to `messages` for the payload it hands out. With the partial index, a
//!   transition is one heap update plus the index entries it enters or leaves.
//! - Scheduled messages are ordered by due time apart from it (`ix_scheduled (queue,
//!   due_at) WHERE state = 0`): the tick finds the queues with due messages by a skip scan
//!   of that index and promotes each queue's share by an index range scan, never touching
//!   ready or finished rows. `ix_leased (lease_expires_at) WHERE state = 2` is the reaper's.
//! - Done and dead messages are out of the hot path: no hot index holds them (`ix_done`
//!   for the purge, `ix_dead` for the console are partial on their state), and done ones are
//!   deleted by the purge with their history (one statement; no foreign key since v4). We
//!   do not partition by state (Oban's `tuple moved to another partition` errors).
//! - `idempotency` (queue, key → message id, payload fingerprint, expiry, tombstone
//!   `jsonb`) outlives purged messages for the whole window: the purge writes into it what a
//!   replay answers (the tombstone).
//! - Per-key ordering: `messages.key_blocked` (NULL: takes no part in its key's order;
//!   false: the one message of its key that may be leased; true: waits) keeps the waiting
//!   messages out of `ix_ready`, so a claim never scans a hot key's backlog; `key_heads`
//!   (queue, key → the oldest message taking part) is the key's lock point, which every
//!   transition that may change the key's head locks first, and names the head so that such
//!   a transition can wait for a claim of it in flight (see `key_order.rs`). Whether a key
//!   has a lease is an index seek (`ix_key_leased`), not a column a claim must update: so a
//!   claim writes nothing but the message rows it leases.
//! - `tasks` and `audit`: the operator's bulk tasks and audit log, as in the SQLite store.
//! - `sessions` (schema v6): the console's sessions, so that any node serves any signed-in
//!   operator; the session's key is a digest of its cookie, never the cookie.
//! - `meta` (schema v2): what the rows were written under that the configuration can
//!   change (each queue's ordering mode, for `key_order::reconcile`), and the limits the
//!   SQL function checks (`sql_publish`).
//! - The function `publish(queue, payload, key, idempotency_key, delay, headers,
//!   priority)` (schema v3): transactional enqueue from an application's own transaction
//!   (`sql_publish.rs`).
//!
//! Times are `bigint` milliseconds since the epoch, like the SQLite store: a caller's clock
//! (the conformance suite's fake 2023 clock) is honoured exactly, and the database's clock
//! is `(extract(epoch from clock_timestamp()) * 1000)::bigint` when no time is given.
//! Text that is compared or ranged (`queue`, `msg_key`, `ikey`, `id`) is `COLLATE "C"`:
//! byte order, so an idempotency-key prefix is an index range whatever the database's
//! collation, and comparisons cost no locale.
//!
//! # Vacuum
//!
//! Every transition of a message updates its row, so `messages` (and `idempotency`, whose
//! rows expire in bulk) accumulate dead tuples at the message rate. The default
//! autovacuum trigger (20 % of the table dead) lets a table of 10 M rows gather 2 M dead
//! tuples before a vacuum, bloating `ix_ready`'s pages that every claim reads. The hot
//! tables trigger at 1 % (`autovacuum_vacuum_scale_factor = 0.01`, plus a fixed 1,000) and
//! analyse at 2 %, and vacuum without cost-based sleeping (`autovacuum_vacuum_cost_delay =
//! 0`), so a vacuum keeps up with the queue instead of trailing it; `fillfactor = 85` leaves
//! room on each page for the next version of its rows (HOT updates when no indexed column
//! changes, e.g. an extend).
//!
//! # Migrations
//!
//! `schema_migrations` (version, applied_at) in the schema records the steps applied.
//! [`migrate`] runs each missing step of [`MIGRATIONS`] in its own transaction holding
//! `pg_advisory_xact_lock` keyed on the schema's name, so two processes opening one schema
//! at once apply each step once; it refuses a schema whose version is newer than
//! [`SCHEMA_VERSION`], naming both.

use crate::error::E;
use redrive_storage::StoreError;

/// The newest schema version this build knows.
///
/// - 1: the first schema (see the module docs).
/// - 2: `meta` (key → text): what the rows were written under that the configuration may
///   change, today the ordering mode of each queue (`key_order::reconcile`).
/// - 3: the function `publish(…)`, transactional enqueue from SQL (`sql_publish.rs`).
/// - 4: `history` without its foreign key to `messages`: its per-row check (a trigger and a
///   key-share lock of the message row for every history row appended) was a quarter of a
///   retry cycle's database time; the purge and `delete` remove a message's history in the
///   same statement or transaction instead.
/// - 5: `nodes` and `leader`, the cluster's membership and leadership (`cluster.rs`).
/// - 6: `sessions`, the console's sessions, shared by every node (`sessions.rs`), and
///   `audit.node`, the node that recorded an entry (NULL in the entries from before).
/// - 7: `endpoint_trips`, the push endpoints' shared breakers: the latest trip per endpoint
///   (`cluster.rs`).
/// - 8: the SQL function `publish(…)` again, with step 3's key-order mode comparison fixed
///   (`sql_publish.rs`).
/// - 9: the SQL function `publish(…)` again, refusing payloads the server cannot read back
///   (a number of 1e308 or more, more than 127 nested arrays or objects).
/// - 10: `message_ids` (seq → id, queue), written once per message, holds what `messages`'
///   two full indexes held (`id`'s uniqueness and `ix_queue`): every transition is a new
///   version of the `messages` row and entered every index of it, so those two indexes took
///   an entry per transition. A retry cycle's own database work is a quarter less
///   (`scripts/pg_shape_model.sh`, docs/PERFORMANCE.md). Lookups by id and the searches of
///   one queue go through it.
/// - 11: the SQL function `publish(…)` again, writing the new message's `message_ids` row.
pub const SCHEMA_VERSION: i32 = 11;

/// The steps: `(version, SQL)`, applied in order, each in its own transaction.
pub const MIGRATIONS: &[(i32, &str)] = &[
    (1, V1),
    (2, V2),
    (3, crate::sql_publish::V3),
    (4, V4),
    (5, crate::cluster::V5),
    (6, crate::sessions::V6),
    (7, crate::cluster::V7),
    (8, crate::sql_publish::V8),
    (9, crate::sql_publish::V9),
    (10, V10),
    (11, crate::sql_publish::V11),
];

/// Step 10 (see [`SCHEMA_VERSION`]). The columns are named apart from `messages`' (`mi_`),
/// so a join of the two leaves every column of `messages` unqualified.
const V10: &str = r#"
CREATE TABLE message_ids (
  mi_seq   bigint PRIMARY KEY,
  mi_id    text COLLATE "C" NOT NULL UNIQUE,
  mi_queue text COLLATE "C" NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
        autovacuum_analyze_scale_factor = 0.02);
INSERT INTO message_ids (mi_seq, mi_id, mi_queue) SELECT seq, id, queue FROM messages;
CREATE INDEX ix_message_ids_queue ON message_ids (mi_queue, mi_seq);
DROP INDEX ix_queue;
ALTER TABLE messages DROP CONSTRAINT messages_id_key;
ANALYZE message_ids;
"#;

const V4: &str = "ALTER TABLE history DROP CONSTRAINT IF EXISTS history_message_seq_fkey;";

const V2: &str = "CREATE TABLE meta (k text COLLATE \"C\" PRIMARY KEY, v text NOT NULL);";

const V1: &str = r#"
CREATE TABLE messages (
  seq               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  id                text COLLATE "C" NOT NULL UNIQUE,
  queue             text COLLATE "C" NOT NULL,
  state             smallint NOT NULL,
  priority          smallint NOT NULL,
  due_at            bigint,
  msg_key           text COLLATE "C",
  idempotency_key   text COLLATE "C",
  payload           text NOT NULL,
  headers           text,
  target_url        text,
  attempts          integer NOT NULL DEFAULT 0,
  budget_base       integer NOT NULL DEFAULT 0,
  uncounted         integer NOT NULL DEFAULT 0,
  released          integer NOT NULL DEFAULT 0,
  prev_delay_ms     bigint,
  created_at        bigint NOT NULL,
  updated_at        bigint NOT NULL,
  window_start      bigint,
  lease_token       text,
  leased_at         bigint,
  lease_expires_at  bigint,
  lease_end         text,
  finished_at       bigint,
  dead_reason       text,
  error_class       text,
  last_error        text,
  key_blocked       boolean
) WITH (fillfactor = 85, autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
        autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0);
CREATE INDEX ix_ready ON messages (queue, priority DESC, due_at, seq)
  WHERE state = 1 AND key_blocked IS NOT TRUE;
CREATE INDEX ix_ready_blocked ON messages (queue, due_at) WHERE state = 1 AND key_blocked;
CREATE INDEX ix_scheduled ON messages (queue, due_at) WHERE state = 0;
CREATE INDEX ix_leased ON messages (lease_expires_at) WHERE state = 2;
CREATE INDEX ix_done ON messages (finished_at) WHERE state = 3;
CREATE INDEX ix_dead ON messages (queue, seq) WHERE state = 4;
CREATE INDEX ix_queue ON messages (queue, seq);
CREATE INDEX ix_key ON messages (queue, msg_key, seq) WHERE msg_key IS NOT NULL;
CREATE INDEX ix_key_order ON messages (queue, msg_key, seq) WHERE key_blocked IS NOT NULL;
CREATE INDEX ix_key_leased ON messages (queue, msg_key) WHERE state = 2 AND msg_key IS NOT NULL;

CREATE TABLE history (
  message_seq bigint NOT NULL REFERENCES messages (seq) ON DELETE CASCADE,
  n           integer NOT NULL,
  entry       jsonb NOT NULL,
  PRIMARY KEY (message_seq, n)
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

CREATE TABLE idempotency (
  queue       text COLLATE "C" NOT NULL,
  ikey        text COLLATE "C" NOT NULL,
  message_id  text COLLATE "C" NOT NULL,
  fingerprint text NOT NULL,
  expires_at  bigint NOT NULL,
  tombstone   jsonb,
  PRIMARY KEY (queue, ikey)
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);
CREATE INDEX ix_idempotency_expiry ON idempotency (expires_at);

CREATE TABLE key_heads (
  queue    text COLLATE "C" NOT NULL,
  msg_key  text COLLATE "C" NOT NULL,
  head_seq bigint,
  PRIMARY KEY (queue, msg_key)
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

CREATE TABLE tasks (
  id          text COLLATE "C" PRIMARY KEY,
  action      text NOT NULL,
  spec        text NOT NULL,
  state       text NOT NULL,
  total       bigint NOT NULL,
  done        bigint NOT NULL DEFAULT 0,
  failed      bigint NOT NULL DEFAULT 0,
  cursor      text,
  created_by  text NOT NULL,
  created_at  bigint NOT NULL,
  updated_at  bigint NOT NULL,
  stop_reason text
);
CREATE INDEX ix_tasks_state ON tasks (state, id);

CREATE TABLE audit (
  seq     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at      bigint NOT NULL,
  actor   text NOT NULL,
  action  text NOT NULL,
  target  text,
  filter  text,
  count   bigint NOT NULL,
  detail  text
);
"#;

/// Is `schema` a name this store uses unquoted: lower-case ASCII letters, digits and
/// `_`, not starting with a digit, at most 63 bytes (PostgreSQL's identifier limit).
pub fn valid_schema_name(schema: &str) -> bool {
    !schema.is_empty()
        && schema.len() <= 63
        && !schema.starts_with(|c: char| c.is_ascii_digit())
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The advisory lock key of a schema's migrations (also taken by `key_order::reconcile`).
pub fn lock_key(schema: &str) -> i64 {
    redrive_core::fnv1a(format!("redrive-migrate:{schema}").as_bytes()) as i64
}

/// The version a schema is at (0: none yet): read under the migration lock at open, and by
/// the store's probe every second on a pooled connection (whose `search_path` is the schema).
pub async fn version<C: deadpool_postgres::GenericClient>(client: &C) -> Result<i32, E> {
    let v: Option<i32> = client
        .query_one("SELECT max(version) FROM schema_migrations", &[])
        .await?
        .try_get(0)?;
    Ok(v.unwrap_or(0))
}

/// Why a store refuses every call once a newer redrive migrated its schema to `found`.
pub fn superseded(schema: &str, found: i32) -> String {
    format!(
        "PostgreSQL schema {schema} was upgraded to schema version {found} by a newer redrive \
         while this one ran; this redrive knows versions up to {SCHEMA_VERSION}: stop this node \
         and start the newer version"
    )
}

/// Take the schema's migration lock in `tx` and create the schema and its
/// `schema_migrations` table when missing; the version found.
async fn lock(tx: &deadpool_postgres::Transaction<'_>, schema: &str) -> Result<i32, E> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock_key(schema)])
        .await?;
    tx.batch_execute(&format!(
        "SET LOCAL client_min_messages = warning; CREATE SCHEMA IF NOT EXISTS {schema}; \
         SET LOCAL search_path TO {schema}; \
         CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, \
         applied_at timestamptz NOT NULL DEFAULT now());"
    ))
    .await?;
    let found = version(tx).await?;
    if found > SCHEMA_VERSION {
        return Err(E::Logic(StoreError::Backend(format!(
            "PostgreSQL schema {schema} has schema version {found}, this redrive knows versions up \
             to {SCHEMA_VERSION}: upgrade redrive (a newer one wrote it)"
        ))));
    }
    Ok(found)
}

/// Create the schema or upgrade it, one transaction per step; refuse a newer one.
pub async fn migrate(client: &mut deadpool_postgres::Client, schema: &str) -> Result<(), E> {
    for (step, sql) in MIGRATIONS {
        let tx = client.transaction().await?;
        let found = lock(&tx, schema).await?;
        if found >= *step {
            tx.commit().await?;
            continue;
        }
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO schema_migrations (version) VALUES ($1)",
            &[step],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(schema, version = step, "migrated the PostgreSQL schema");
    }
    // A schema with nothing left to do is still checked (a newer one is refused).
    let tx = client.transaction().await?;
    lock(&tx, schema).await?;
    tx.commit().await?;
    Ok(())
}
