//! The console's sessions in SQLite (schema v8: table `sessions`), and the shared secrets
//! (rows `secret.<name>` of `meta`). See `redrive_storage::sessions` for the contract.
//!
//! A lookup reads on a reader connection and, only when the session is due for a touch,
//! asks the writer to move its `last_seen`: most console requests write nothing.

use crate::sql_error::SqlResultExt;
use crate::transitions::WriterState;
use redrive_core::Timestamp;
use redrive_storage::sessions::expired_at_or_before;
use redrive_storage::{NewSession, SessionRecord, StoreError};
use rusqlite::{params, Connection, OptionalExtension};

/// Session `id` as stored, expired or not.
pub fn session(conn: &Connection, id: &str) -> Result<Option<SessionRecord>, StoreError> {
    conn.prepare_cached("SELECT id, token, csrf, created_at, last_seen FROM sessions WHERE id = ?1")
        .db()?
        .query_row([id], |r| {
            Ok(SessionRecord {
                id: r.get(0)?,
                token: r.get(1)?,
                csrf: r.get(2)?,
                created_at: Timestamp::from_millis(r.get(3)?),
                last_seen: Timestamp::from_millis(r.get(4)?),
            })
        })
        .optional()
        .db()
}

impl WriterState {
    /// Delete the expired sessions, store `s`, bound its token's sessions.
    pub fn session_create(
        &self,
        s: &NewSession,
        now: Timestamp,
    ) -> Result<SessionRecord, StoreError> {
        self.conn
            .prepare_cached("DELETE FROM sessions WHERE last_seen <= ?1")
            .db()?
            .execute([expired_at_or_before(now, s.idle_ms)])
            .db()?;
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO sessions (id, token, csrf, created_at, last_seen) \
                 VALUES (?1, ?2, ?3, ?4, ?4)",
            )
            .db()?
            .execute(params![s.id, s.token, s.csrf, now.as_millis()])
            .db()?;
        // This one stays, and the token's most recently used others up to the bound.
        let others = i64::from(s.max_per_token.max(1)) - 1;
        self.conn
            .prepare_cached(
                "DELETE FROM sessions WHERE id IN (SELECT id FROM sessions \
                 WHERE token = ?1 AND id <> ?2 \
                 ORDER BY last_seen DESC, created_at DESC, id DESC LIMIT -1 OFFSET ?3)",
            )
            .db()?
            .execute(params![s.token, s.id, others])
            .db()?;
        Ok(SessionRecord {
            id: s.id.clone(),
            token: s.token.clone(),
            csrf: s.csrf.clone(),
            created_at: now,
            last_seen: now,
        })
    }

    /// Move session `id`'s `last_seen` to `now` (never back); whether it is still stored.
    pub fn session_touch(&self, id: &str, now: Timestamp) -> Result<bool, StoreError> {
        let n = self
            .conn
            .prepare_cached("UPDATE sessions SET last_seen = max(last_seen, ?2) WHERE id = ?1")
            .db()?
            .execute(params![id, now.as_millis()])
            .db()?;
        Ok(n > 0)
    }

    /// Delete session `id`; whether it was stored.
    pub fn session_delete(&self, id: &str) -> Result<bool, StoreError> {
        let n = self
            .conn
            .prepare_cached("DELETE FROM sessions WHERE id = ?1")
            .db()?
            .execute([id])
            .db()?;
        Ok(n > 0)
    }

    /// The secret `name`, stored as `candidate` if it was not yet.
    pub fn shared_secret(&self, name: &str, candidate: &str) -> Result<String, StoreError> {
        let key = format!("secret.{name}");
        self.conn
            .prepare_cached("INSERT OR IGNORE INTO meta (k, v) VALUES (?1, ?2)")
            .db()?
            .execute(params![key, candidate])
            .db()?;
        self.conn
            .prepare_cached("SELECT v FROM meta WHERE k = ?1")
            .db()?
            .query_row([key], |r| r.get(0))
            .db()
    }
}
