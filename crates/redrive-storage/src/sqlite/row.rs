//! A `messages` row and its conversion to a [`Message`].

use crate::StoreError;
use redrive_core::{DeadReason, HistoryEntry, LastError, Message, MessageId, State, Timestamp};

/// Every column but `history`, in [`super::schema::COLUMNS`] order.
#[derive(Debug, Clone)]
pub struct Row {
    pub seq: i64,
    pub id: String,
    pub queue: String,
    pub state: State,
    pub priority: u8,
    pub due_at: Option<i64>,
    pub key: Option<String>,
    pub idempotency_key: Option<String>,
    pub payload: String,
    pub headers: Option<String>,
    pub attempts: u32,
    pub budget_base: u32,
    pub uncounted: u32,
    pub prev_delay_ms: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
    pub lease_token: Option<String>,
    pub leased_at: Option<i64>,
    pub lease_expires_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub dead_reason: Option<String>,
    pub last_error: Option<String>,
    /// Start of the `max_age` window, ms: set by a redrive; `None` means `created_at`.
    pub window_start: Option<i64>,
    /// Push delivery: the message's own endpoint URL.
    pub target_url: Option<String>,
    /// How the lease of `lease_token` ended, once it has (schema v7): `acked`, `nacked`,
    /// `released`, `expired` or `killed`; `None` while it is live, before any lease, and
    /// on rows whose lease ended before the upgrade to v7.
    pub lease_end: Option<String>,
    /// Consumer releases left uncharged since the publish or the last redrive (schema v7),
    /// compared with the policy's `max_rate_limited`.
    pub released: u32,
}

/// A `state` column holding a code no [`State`] has: a newer redrive wrote it, or the
/// file is damaged. Reading it is an error, never a guess (it used to read as `dead`).
#[derive(Debug, thiserror::Error)]
#[error("state code {0} in the database is not a known state (scheduled 0, ready 1, leased 2, done 3, dead 4)")]
pub struct UnknownState(pub u8);

/// [`UnknownState`] as the store's error.
pub fn unknown_state(code: u8) -> StoreError {
    StoreError::Backend(UnknownState(code).to_string())
}

impl Row {
    /// Read a row selected with [`super::schema::COLUMNS`] (starting at column `0`).
    pub fn from_sql(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        let code: u8 = r.get(3)?;
        let state = State::from_code(code).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                3,
                rusqlite::types::Type::Integer,
                Box::new(UnknownState(code)),
            )
        })?;
        Ok(Row {
            seq: r.get(0)?,
            id: r.get(1)?,
            queue: r.get(2)?,
            state,
            priority: r.get(4)?,
            due_at: r.get(5)?,
            key: r.get(6)?,
            idempotency_key: r.get(7)?,
            payload: r.get(8)?,
            headers: r.get(9)?,
            attempts: r.get(10)?,
            budget_base: r.get(11)?,
            uncounted: r.get(12)?,
            prev_delay_ms: r.get(13)?,
            created_at: r.get(14)?,
            updated_at: r.get(15)?,
            lease_token: r.get(16)?,
            leased_at: r.get(17)?,
            lease_expires_at: r.get(18)?,
            finished_at: r.get(19)?,
            dead_reason: r.get(20)?,
            last_error: r.get(21)?,
            window_start: r.get(22)?,
            target_url: r.get(23)?,
            lease_end: r.get(24)?,
            released: r.get(25)?,
        })
    }

    /// Attempts counted against `max_attempts` since the last redrive.
    pub fn counted_attempts(&self) -> u32 {
        self.attempts
            .saturating_sub(self.budget_base)
            .saturating_sub(self.uncounted)
    }

    /// Start of the `max_age` window: the last redrive, or the publish.
    pub fn window_start(&self) -> i64 {
        self.window_start.unwrap_or(self.created_at)
    }

    /// The message this row stores; `history` is the raw JSON array, if wanted.
    pub fn to_message(&self, history: Option<&str>) -> Result<Message, StoreError> {
        self.to_message_with(history, None)
    }

    /// [`Self::to_message`] with the payload already parsed (a publish has it: parsing the
    /// JSON it just wrote would be work for nothing on the writer thread).
    pub fn to_message_with(
        &self,
        history: Option<&str>,
        payload: Option<serde_json::Value>,
    ) -> Result<Message, StoreError> {
        let ts = |v: Option<i64>| v.map(Timestamp::from_millis);
        let history: Vec<HistoryEntry> = match history {
            Some(h) => serde_json::from_str(h)?,
            None => Vec::new(),
        };
        let last_error: Option<LastError> = match &self.last_error {
            Some(s) => Some(serde_json::from_str(s)?),
            None => None,
        };
        Ok(Message {
            id: self
                .id
                .parse::<MessageId>()
                .map_err(|e| StoreError::Backend(e.to_string()))?,
            queue: self.queue.clone(),
            state: self.state,
            payload: match payload {
                Some(p) => p,
                None => serde_json::from_str(&self.payload)?,
            },
            headers: match &self.headers {
                Some(h) => serde_json::from_str(h)?,
                None => Default::default(),
            },
            key: self.key.clone(),
            idempotency_key: self.idempotency_key.clone(),
            priority: self.priority,
            attempts: self.attempts,
            due_at: match self.state {
                State::Scheduled | State::Ready => ts(self.due_at),
                _ => None,
            },
            lease_expires_at: match self.state {
                State::Leased => ts(self.lease_expires_at),
                _ => None,
            },
            created_at: Timestamp::from_millis(self.created_at),
            updated_at: Timestamp::from_millis(self.updated_at),
            finished_at: ts(self.finished_at),
            dead_reason: self.dead_reason.as_deref().and_then(DeadReason::parse),
            last_error,
            history,
            target_url: self.target_url.clone(),
        })
    }
}
