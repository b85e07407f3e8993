//! A `messages` row and its conversion to a [`Message`].

use redrive_core::{DeadReason, State, Timestamp};
use redrive_storage::rules::{LeaseEnd, Lifecycle};
use redrive_storage::StoreError;

/// Every column but `history`, in [`crate::schema::COLUMNS`] order (the row every backend
/// shares; `lease_end` is `None` on rows whose lease ended before the upgrade to v7).
pub type Row = redrive_storage::stored::StoredRow;

/// A `lease_end` column holding a name no [`LeaseEnd`] has.
#[derive(Debug, thiserror::Error)]
#[error("messages.lease_end {0:?} is not a known lease end")]
pub struct UnknownLeaseEnd(pub String);

/// A `state` column holding a code no [`State`] has: a newer redrive wrote it, or the
/// file is damaged. Reading it is an error, never a guess (it used to read as `dead`).
#[derive(Debug, thiserror::Error)]
#[error("state code {0} in the database is not a known state (scheduled 0, ready 1, leased 2, done 3, dead 4)")]
pub struct UnknownState(pub u8);

/// [`UnknownState`] as the store's error.
pub fn unknown_state(code: u8) -> StoreError {
    StoreError::Backend(UnknownState(code).to_string())
}

/// Read a row selected with [`crate::schema::COLUMNS`] (starting at column `0`).
pub fn from_sql(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    let code: u8 = r.get(3)?;
    let state = State::from_code(code).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            3,
            rusqlite::types::Type::Integer,
            Box::new(UnknownState(code)),
        )
    })?;
    let ts = |v: Option<i64>| v.map(Timestamp::from_millis);
    let lease_end: Option<String> = r.get(24)?;
    let lease_end = match lease_end {
        None => None,
        Some(e) => Some(LeaseEnd::parse(&e).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                24,
                rusqlite::types::Type::Text,
                Box::new(UnknownLeaseEnd(e)),
            )
        })?),
    };
    let dead_reason: Option<String> = r.get(20)?;
    let prev_delay_ms: Option<i64> = r.get(13)?;
    Ok(Row {
        seq: r.get(0)?,
        id: r.get(1)?,
        queue: r.get(2)?,
        priority: r.get(4)?,
        key: r.get(6)?,
        idempotency_key: r.get(7)?,
        payload: r.get(8)?,
        headers: r.get(9)?,
        lease_token: r.get(16)?,
        last_error: r.get(21)?,
        target_url: r.get(23)?,
        life: Lifecycle {
            state,
            due_at: ts(r.get(5)?),
            attempts: r.get(10)?,
            budget_base: r.get(11)?,
            uncounted: r.get(12)?,
            released: r.get(25)?,
            prev_delay_ms: prev_delay_ms.map(|d| d.max(0) as u64),
            created_at: Timestamp::from_millis(r.get(14)?),
            updated_at: Timestamp::from_millis(r.get(15)?),
            window_start: ts(r.get(22)?),
            leased_at: ts(r.get(17)?),
            lease_expires_at: ts(r.get(18)?),
            lease_end,
            finished_at: ts(r.get(19)?),
            dead_reason: dead_reason.as_deref().and_then(DeadReason::parse),
        },
    })
}
