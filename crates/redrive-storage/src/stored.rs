//! A message as a backend stores it, in the form every backend agrees on: its content as the
//! JSON text it was published as, its [`Lifecycle`], and what a purged message's idempotency
//! record keeps of it (a [`Tombstone`]). Turning those back into a [`Message`] is written
//! once, here.

use crate::rules::Lifecycle;
use crate::StoreError;
use redrive_core::{HistoryEntry, LastError, Message, MessageId, NewMessage, State, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A `messages` row but its history, as every backend reads it: the message's identity and
/// content (JSON text as published), its lease token, and its [`Lifecycle`] (what the
/// rules of [`crate::rules`] read and change). Each backend reads it from its own row type
/// (`redrive-store-sqlite`'s and `redrive-store-postgres`'s `row::from_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRow {
    /// The row's place in publish order.
    pub seq: i64,
    /// The message id, as text.
    pub id: String,
    /// Its queue.
    pub queue: String,
    /// Its priority.
    pub priority: u8,
    /// Its ordering key.
    pub key: Option<String>,
    /// Its idempotency key.
    pub idempotency_key: Option<String>,
    /// The payload's JSON text, as published.
    pub payload: String,
    /// The headers' JSON text (`None`: no headers).
    pub headers: Option<String>,
    /// The live (or last) lease's token.
    pub lease_token: Option<String>,
    /// The last error's JSON text.
    pub last_error: Option<String>,
    /// Push delivery: the message's own endpoint URL.
    pub target_url: Option<String>,
    /// State, due time, attempt counts, lease times, how the lease ended, …
    pub life: Lifecycle,
}

impl StoredRow {
    /// The row's stored text.
    pub fn text(&self) -> StoredText<'_> {
        StoredText {
            id: &self.id,
            queue: &self.queue,
            priority: self.priority,
            key: self.key.as_deref(),
            idempotency_key: self.idempotency_key.as_deref(),
            payload: &self.payload,
            headers: self.headers.as_deref(),
            last_error: self.last_error.as_deref(),
            target_url: self.target_url.as_deref(),
        }
    }

    /// The message this row stores; `history` is its JSON array when wanted, `payload` the
    /// payload already parsed when the caller has it (a publish: parsing the JSON it just
    /// wrote would be work for nothing).
    pub fn to_message(
        &self,
        history: Option<&str>,
        payload: Option<serde_json::Value>,
    ) -> Result<Message, StoreError> {
        message(self.text(), &self.life, history, payload)
    }
}

/// The stored text of one message (borrowed from a backend's row).
#[derive(Debug, Clone, Copy)]
pub struct StoredText<'a> {
    /// Its id, as text.
    pub id: &'a str,
    /// Its queue.
    pub queue: &'a str,
    /// Its priority.
    pub priority: u8,
    /// Its ordering key.
    pub key: Option<&'a str>,
    /// Its idempotency key.
    pub idempotency_key: Option<&'a str>,
    /// The payload's JSON text, as published.
    pub payload: &'a str,
    /// The headers' JSON text (`None`: no headers).
    pub headers: Option<&'a str>,
    /// The last error's JSON text.
    pub last_error: Option<&'a str>,
    /// Push delivery: its own endpoint URL.
    pub target_url: Option<&'a str>,
}

/// A stored message id, parsed; a bad one is the backend's error.
pub fn parse_id(s: &str) -> Result<MessageId, StoreError> {
    s.parse::<MessageId>()
        .map_err(|e| StoreError::Backend(format!("stored message id {s:?}: {e}")))
}

/// The message a backend stores: `history` is the JSON array of its entries when wanted,
/// `payload` the payload already parsed when the caller has it (a publish: parsing what it
/// just wrote would be work for nothing).
pub fn message(
    text: StoredText<'_>,
    life: &Lifecycle,
    history: Option<&str>,
    payload: Option<serde_json::Value>,
) -> Result<Message, StoreError> {
    let history: Vec<HistoryEntry> = match history {
        Some(h) => serde_json::from_str(h)?,
        None => Vec::new(),
    };
    let last_error: Option<LastError> = match text.last_error {
        Some(s) => Some(serde_json::from_str(s)?),
        None => None,
    };
    Ok(Message {
        id: parse_id(text.id)?,
        queue: text.queue.to_owned(),
        state: life.state,
        payload: match payload {
            Some(p) => p,
            None => serde_json::from_str(text.payload)?,
        },
        headers: match text.headers {
            Some(h) => serde_json::from_str(h)?,
            None => Default::default(),
        },
        key: text.key.map(str::to_owned),
        idempotency_key: text.idempotency_key.map(str::to_owned),
        priority: text.priority,
        attempts: life.attempts,
        due_at: match life.state {
            State::Scheduled | State::Ready => life.due_at,
            _ => None,
        },
        lease_expires_at: match life.state {
            State::Leased => life.lease_expires_at,
            _ => None,
        },
        created_at: life.created_at,
        updated_at: life.updated_at,
        finished_at: life.finished_at,
        dead_reason: life.dead_reason,
        last_error,
        history,
        target_url: text.target_url.map(str::to_owned),
    })
}

/// The facts of a purged done message, kept in its idempotency record (JSON, the same in
/// every backend).
///
/// SPEC §4: a key outlives its message for the whole `idempotency_window`. A done message
/// may be purged sooner (`done_retention` shorter than the window); its record stays, with
/// these facts: what a replay answers with. The payload is not kept (dropping it is the
/// point of the purge): a replay answers with its own payload, which equals the original's
/// by fingerprint, or it would have been an `idempotency_conflict`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tombstone {
    /// Publish time, ms.
    pub created_at: i64,
    /// Last change (the ack), ms.
    pub updated_at: i64,
    /// When it was acked, ms.
    pub finished_at: Option<i64>,
    /// Deliveries it took.
    pub attempts: u32,
    /// Its priority.
    pub priority: u8,
    /// Its ordering key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Its headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// The message a replay of a purged one answers with: `done`, no history, the replay's
/// payload (equal to the original's by fingerprint).
///
/// `tombstone` is the record's JSON; `None` for a record without one (SQLite: written
/// before schema version 2), whose message's publish time is taken as `expires_at -
/// window_ms`.
pub fn purged_message(
    id: MessageId,
    item: &NewMessage,
    tombstone: Option<&str>,
    expires_at: i64,
    window_ms: u64,
) -> Result<Message, StoreError> {
    let t = match tombstone {
        Some(json) => serde_json::from_str::<Tombstone>(json)?,
        None => {
            let created_at = expires_at.saturating_sub(window_ms.min(i64::MAX as u64) as i64);
            Tombstone {
                created_at,
                updated_at: created_at,
                finished_at: None,
                attempts: 0,
                priority: item.priority,
                key: None,
                headers: BTreeMap::new(),
            }
        }
    };
    Ok(Message {
        id,
        queue: item.queue.clone(),
        state: State::Done,
        payload: item.payload.clone(),
        headers: t.headers,
        key: t.key,
        idempotency_key: item.idempotency_key.clone(),
        priority: t.priority,
        attempts: t.attempts,
        due_at: None,
        lease_expires_at: None,
        created_at: Timestamp::from_millis(t.created_at),
        updated_at: Timestamp::from_millis(t.updated_at),
        finished_at: t.finished_at.map(Timestamp::from_millis),
        dead_reason: None,
        last_error: None,
        history: Vec::new(),
        target_url: item.target_url.clone(),
    })
}
