//! What an idempotency key remembers of its message once the message is purged.
//!
//! SPEC §4: a key outlives its message for the whole `idempotency_window`. A done
//! message may be purged sooner (`done_retention` shorter than the window); its
//! idempotency record stays, and purge writes into it a [`Tombstone`]: the facts a
//! replay answers with (id, queue, created / finished time, attempts, priority, key,
//! headers). The payload is not kept (dropping it is the point of the purge): a replay
//! answers with its own payload, which equals the original's by fingerprint, or it
//! would have been an `idempotency_conflict`.
//!
//! A record whose message is gone and that has no tombstone was purged by a redrive
//! before schema version 2: only the id is known; the replay still answers it (never a
//! second message), with `created_at` derived from the record's expiry.
//!
//! An operator's delete removes the record with the message: the key is forgotten, and
//! the next publish with it creates a new message (a documented decision: delete means
//! "as if it had never been published").

use redrive_core::{Message, MessageId, NewMessage, State, Timestamp};
use redrive_storage::StoreError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A purged message's idempotency key, its id and its facts: (ikey, message id, facts).
pub type PurgedKey = (String, String, Tombstone);

/// The facts of a purged done message, kept in its idempotency record (JSON).
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
/// `tombstone` is the record's JSON; `None` for a record written before schema version 2,
/// whose message's publish time is taken as `expires_at - window_ms`.
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
