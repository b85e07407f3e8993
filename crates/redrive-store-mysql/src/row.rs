//! A `messages` row: its columns, how it is read from MySQL, and the [`Message`] it stores.
//! The lifecycle columns are read into a [`Lifecycle`], the record the rules of
//! `redrive_storage::rules` check and change.

use crate::error::E;
use crate::sql::{col, query, Db};
use redrive_core::{DeadReason, Message, MessageId, State, Timestamp};
use redrive_storage::rules::{LeaseEnd, Lifecycle};
use redrive_storage::StoreError;

/// The column list of every message read, in [`from_my`] order.
macro_rules! columns {
    () => {
        "seq, id, queue, state, priority, due_at, msg_key, idempotency_key, payload, headers, \
         attempts, budget_base, uncounted, prev_delay_ms, created_at, updated_at, lease_token, \
         leased_at, lease_expires_at, finished_at, dead_reason, last_error, window_start, \
         target_url, lease_end, released"
    };
}
pub(crate) use columns;

/// A message row but its history (the row every backend shares).
pub type Row = redrive_storage::stored::StoredRow;

fn ts(v: Option<i64>) -> Option<Timestamp> {
    v.map(Timestamp::from_millis)
}

fn u32_of(v: i64) -> u32 {
    v.clamp(0, i64::from(u32::MAX)) as u32
}

/// A state code read from the database.
pub fn state_of(code: i64) -> Result<State, E> {
    u8::try_from(code)
        .ok()
        .and_then(State::from_code)
        .ok_or_else(|| {
            E::Db(StoreError::Backend(format!(
                "state code {code} in the database is not a known state"
            )))
        })
}

/// Read a row selected with [`columns!`] first.
pub fn from_my(r: &mysql_async::Row) -> Result<Row, E> {
    let state = state_of(col(r, 3)?)?;
    let lease_end: Option<String> = col(r, 24)?;
    let lease_end = match lease_end {
        None => None,
        Some(e) => Some(LeaseEnd::parse(&e).ok_or_else(|| {
            E::Db(StoreError::Backend(format!(
                "messages.lease_end {e:?} is not a known lease end"
            )))
        })?),
    };
    let dead_reason: Option<String> = col(r, 20)?;
    let prev_delay_ms: Option<i64> = col(r, 13)?;
    let priority: i64 = col(r, 4)?;
    Ok(Row {
        seq: col(r, 0)?,
        id: col(r, 1)?,
        queue: col(r, 2)?,
        priority: priority.clamp(0, 255) as u8,
        key: col(r, 6)?,
        idempotency_key: col(r, 7)?,
        payload: col(r, 8)?,
        headers: col(r, 9)?,
        lease_token: col(r, 16)?,
        last_error: col(r, 21)?,
        target_url: col(r, 23)?,
        life: Lifecycle {
            state,
            due_at: ts(col(r, 5)?),
            attempts: u32_of(col(r, 10)?),
            budget_base: u32_of(col(r, 11)?),
            uncounted: u32_of(col(r, 12)?),
            released: u32_of(col(r, 25)?),
            prev_delay_ms: prev_delay_ms.map(|d| d.max(0) as u64),
            created_at: Timestamp::from_millis(col(r, 14)?),
            updated_at: Timestamp::from_millis(col(r, 15)?),
            window_start: ts(col(r, 22)?),
            leased_at: ts(col(r, 17)?),
            lease_expires_at: ts(col(r, 18)?),
            lease_end,
            finished_at: ts(col(r, 19)?),
            dead_reason: dead_reason.as_deref().and_then(DeadReason::parse),
        },
    })
}

/// The history of the message at `seq` as one JSON array, oldest first.
pub async fn history_json<C: Db>(c: &mut C, seq: i64) -> Result<String, E> {
    let rows = query(
        c,
        "SELECT entry FROM history WHERE message_seq = ? ORDER BY n",
        crate::sql::args![seq],
    )
    .await?;
    let mut out = String::from("[");
    for (i, r) in rows.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&col::<String>(r, 0)?);
    }
    out.push(']');
    Ok(out)
}

/// The whole message of `row`: its history read alongside.
pub async fn message_with_history<C: Db>(c: &mut C, row: &Row) -> Result<Message, E> {
    let history = history_json(c, row.seq).await?;
    Ok(row.to_message(Some(&history), None)?)
}

/// A stored message id.
pub fn parse_id(s: &str) -> Result<MessageId, E> {
    redrive_storage::stored::parse_id(s).map_err(E::Db)
}

/// A time column's value.
pub fn ms(t: Option<Timestamp>) -> Option<i64> {
    t.map(Timestamp::as_millis)
}

/// A count column's value.
pub fn int(n: u32) -> i64 {
    i64::from(n)
}

/// `prev_delay_ms`'s value.
pub fn delay_ms(d: Option<u64>) -> Option<i64> {
    d.map(|d| d.min(i64::MAX as u64) as i64)
}
