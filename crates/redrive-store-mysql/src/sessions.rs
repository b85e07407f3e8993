//! The console's sessions (table `sessions`) and the shared secrets (rows `secret.<name>` of
//! `meta`), at the database's clock: every node of a cluster finds the sessions any node
//! opened (see `redrive_storage::sessions` for the contract).
//!
//! A create first locks a row of `meta` named after its token, so that two sign-ins of one
//! token on two nodes at once count each other's session against the bound.

use crate::error::E;
use crate::sql::{args, col, execute, query, query_one, query_opt, Db};
use redrive_core::Timestamp;
use redrive_storage::sessions::expired_at_or_before;
use redrive_storage::{NewSession, SessionRecord};

fn record(r: &mysql_async::Row) -> Result<SessionRecord, E> {
    Ok(SessionRecord {
        id: col(r, 0)?,
        token: col(r, 1)?,
        csrf: col(r, 2)?,
        created_at: Timestamp::from_millis(col(r, 3)?),
        last_seen: Timestamp::from_millis(col(r, 4)?),
    })
}

/// Session `id` as stored, expired or not.
pub async fn get<C: Db>(c: &mut C, id: &str) -> Result<Option<SessionRecord>, E> {
    query_opt(
        c,
        "SELECT id, token, csrf, created_at, last_seen FROM sessions WHERE id = ?",
        args![id],
    )
    .await?
    .as_ref()
    .map(record)
    .transpose()
}

/// Delete the expired sessions, store `s`, bound its token's sessions.
pub async fn create<C: Db>(tx: &mut C, s: &NewSession, now: Timestamp) -> Result<SessionRecord, E> {
    let t = now.as_millis();
    // The token's lock point: a row of `meta` per token, held until the commit (MySQL's
    // `GET_LOCK` is the session's, not the transaction's).
    let lock = format!(
        "session-lock.{:016x}",
        redrive_core::fnv1a(s.token.as_bytes())
    );
    execute(
        tx,
        "INSERT INTO meta (k, v) VALUES (?, '') ON DUPLICATE KEY UPDATE v = v",
        args![lock.as_str()],
    )
    .await?;
    query(
        tx,
        "SELECT k FROM meta WHERE k = ? FOR UPDATE",
        args![lock.as_str()],
    )
    .await?;
    // Expired sessions: found by the index, deleted by primary key.
    let expired = query(
        tx,
        "SELECT id FROM sessions WHERE last_seen <= ? LIMIT 1000",
        args![expired_at_or_before(now, s.idle_ms)],
    )
    .await?;
    for r in &expired {
        let id: String = col(r, 0)?;
        execute(tx, "DELETE FROM sessions WHERE id = ?", args![id]).await?;
    }
    execute(
        tx,
        "INSERT INTO sessions (id, token, csrf, created_at, last_seen) VALUES (?, ?, ?, ?, ?) \
         ON DUPLICATE KEY UPDATE token = VALUES(token), csrf = VALUES(csrf), \
         created_at = VALUES(created_at), last_seen = VALUES(last_seen)",
        args![s.id.as_str(), s.token.as_str(), s.csrf.as_str(), t, t],
    )
    .await?;
    // This one stays, and the token's most recently used others up to the bound.
    let others = usize::try_from(s.max_per_token.max(1) - 1).unwrap_or(usize::MAX);
    let rows = query(
        tx,
        "SELECT id FROM sessions WHERE token = ? AND id <> ? \
         ORDER BY last_seen DESC, created_at DESC, id DESC",
        args![s.token.as_str(), s.id.as_str()],
    )
    .await?;
    for r in rows.iter().skip(others) {
        let id: String = col(r, 0)?;
        execute(tx, "DELETE FROM sessions WHERE id = ?", args![id]).await?;
    }
    let r = query_one(
        tx,
        "SELECT id, token, csrf, created_at, last_seen FROM sessions WHERE id = ?",
        args![s.id.as_str()],
    )
    .await?;
    record(&r)
}

/// Move session `id`'s `last_seen` to `now` (never back); whether it is still stored.
pub async fn touch<C: Db>(c: &mut C, id: &str, now: Timestamp) -> Result<bool, E> {
    let found = query_opt(
        c,
        "SELECT id FROM sessions WHERE id = ? FOR UPDATE",
        args![id],
    )
    .await?;
    if found.is_none() {
        return Ok(false);
    }
    execute(
        c,
        "UPDATE sessions SET last_seen = GREATEST(last_seen, ?) WHERE id = ?",
        args![now.as_millis(), id],
    )
    .await?;
    Ok(true)
}

/// Delete session `id`; whether it was stored.
pub async fn delete<C: Db>(c: &mut C, id: &str) -> Result<bool, E> {
    Ok(execute(c, "DELETE FROM sessions WHERE id = ?", args![id]).await? > 0)
}

/// The secret `name`, stored as `candidate` if it was not yet. Two nodes asking at once:
/// the second insert waits for the first's commit and does nothing, and the `SELECT` after
/// it (a statement of its own under `READ COMMITTED`) reads the first's secret.
pub async fn shared_secret<C: Db>(tx: &mut C, name: &str, candidate: &str) -> Result<String, E> {
    let key = format!("secret.{name}");
    execute(
        tx,
        "INSERT INTO meta (k, v) VALUES (?, ?) ON DUPLICATE KEY UPDATE v = v",
        args![key.as_str(), candidate],
    )
    .await?;
    let r = query_one(tx, "SELECT v FROM meta WHERE k = ?", args![key.as_str()]).await?;
    col(&r, 0)
}
