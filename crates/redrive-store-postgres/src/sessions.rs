//! The console's sessions (table `sessions`, schema v6) and the shared secrets (rows
//! `secret.<name>` of `meta`), at the database's clock: every node of a cluster finds the
//! sessions any node opened (see `redrive_storage::sessions` for the contract).
//!
//! A lookup is a read; only a session due for a touch costs a write (one `UPDATE`). A
//! create holds a transaction-scoped advisory lock on its token, so that two sign-ins of
//! one token on two nodes at once count each other's session against the bound.

use crate::error::E;
use crate::sql::{execute, query_one, query_opt};
use deadpool_postgres::{GenericClient, Transaction};
use redrive_core::Timestamp;
use redrive_storage::sessions::expired_at_or_before;
use redrive_storage::{NewSession, SessionRecord};

/// Schema v6: the sessions, and the node of each audit entry (NULL in the older ones).
pub const V6: &str = r#"
CREATE TABLE sessions (
  id         text COLLATE "C" PRIMARY KEY,
  token      text COLLATE "C" NOT NULL,
  csrf       text NOT NULL,
  created_at bigint NOT NULL,
  last_seen  bigint NOT NULL
);
CREATE INDEX ix_sessions_token ON sessions (token, last_seen);
CREATE INDEX ix_sessions_seen ON sessions (last_seen);
ALTER TABLE audit ADD COLUMN node text;
"#;

fn record(r: &tokio_postgres::Row) -> Result<SessionRecord, E> {
    Ok(SessionRecord {
        id: r.try_get(0)?,
        token: r.try_get(1)?,
        csrf: r.try_get(2)?,
        created_at: Timestamp::from_millis(r.try_get(3)?),
        last_seen: Timestamp::from_millis(r.try_get(4)?),
    })
}

/// Session `id` as stored, expired or not.
pub async fn get<C: GenericClient>(c: &C, id: &str) -> Result<Option<SessionRecord>, E> {
    query_opt(
        c,
        "SELECT id, token, csrf, created_at, last_seen FROM sessions WHERE id = $1",
        &[&id],
    )
    .await?
    .as_ref()
    .map(record)
    .transpose()
}

/// The advisory lock key of `token`'s sessions in `schema`.
fn token_lock(schema: &str, token: &str) -> i64 {
    redrive_core::fnv1a(format!("redrive-session:{schema}:{token}").as_bytes()) as i64
}

/// Delete the expired sessions, store `s`, bound its token's sessions.
pub async fn create(
    tx: &Transaction<'_>,
    schema: &str,
    s: &NewSession,
    now: Timestamp,
) -> Result<SessionRecord, E> {
    execute(
        tx,
        "SELECT pg_advisory_xact_lock($1)",
        &[&token_lock(schema, &s.token)],
    )
    .await?;
    execute(
        tx,
        "DELETE FROM sessions WHERE last_seen <= $1",
        &[&expired_at_or_before(now, s.idle_ms)],
    )
    .await?;
    let r = query_one(
        tx,
        "INSERT INTO sessions (id, token, csrf, created_at, last_seen) VALUES ($1, $2, $3, $4, $4) \
         ON CONFLICT (id) DO UPDATE SET token = excluded.token, csrf = excluded.csrf, \
         created_at = excluded.created_at, last_seen = excluded.last_seen \
         RETURNING id, token, csrf, created_at, last_seen",
        &[&s.id, &s.token, &s.csrf, &now.as_millis()],
    )
    .await?;
    // This one stays, and the token's most recently used others up to the bound.
    let others = i64::from(s.max_per_token.max(1)) - 1;
    execute(
        tx,
        "DELETE FROM sessions WHERE id IN (SELECT id FROM sessions \
         WHERE token = $1 AND id <> $2 \
         ORDER BY last_seen DESC, created_at DESC, id DESC OFFSET $3)",
        &[&s.token, &s.id, &others],
    )
    .await?;
    record(&r)
}

/// Move session `id`'s `last_seen` to `now` (never back); whether it is still stored.
pub async fn touch<C: GenericClient>(c: &C, id: &str, now: Timestamp) -> Result<bool, E> {
    let n = execute(
        c,
        "UPDATE sessions SET last_seen = greatest(last_seen, $2) WHERE id = $1",
        &[&id, &now.as_millis()],
    )
    .await?;
    Ok(n > 0)
}

/// Delete session `id`; whether it was stored.
pub async fn delete<C: GenericClient>(c: &C, id: &str) -> Result<bool, E> {
    Ok(execute(c, "DELETE FROM sessions WHERE id = $1", &[&id]).await? > 0)
}

/// The secret `name`, stored as `candidate` if it was not yet. Two nodes asking at once:
/// the second insert waits for the first's commit and does nothing, and the `SELECT`
/// after it (a statement of its own under `READ COMMITTED`) reads the first's secret.
pub async fn shared_secret(tx: &Transaction<'_>, name: &str, candidate: &str) -> Result<String, E> {
    let key = format!("secret.{name}");
    execute(
        tx,
        "INSERT INTO meta (k, v) VALUES ($1, $2) ON CONFLICT (k) DO NOTHING",
        &[&key, &candidate],
    )
    .await?;
    let r = query_one(tx, "SELECT v FROM meta WHERE k = $1", &[&key]).await?;
    Ok(r.try_get(0)?)
}
