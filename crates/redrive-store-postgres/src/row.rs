//! A `messages` row: its columns, how it is read from PostgreSQL, and the [`Message`] it
//! stores. The lifecycle columns are read into a [`Lifecycle`], the record the rules of
//! `redrive_storage::rules` check and change.

use crate::error::E;
use redrive_core::{DeadReason, Message, MessageId, State, Timestamp};
use redrive_storage::rules::{LeaseEnd, Lifecycle};

use redrive_storage::StoreError;

/// The column list of every message read, in [`from_pg`] order.
macro_rules! columns {
    () => {
        "seq, id, queue, state, priority, due_at, msg_key, idempotency_key, payload, headers, \
         attempts, budget_base, uncounted, prev_delay_ms, created_at, updated_at, lease_token, \
         leased_at, lease_expires_at, finished_at, dead_reason, last_error, window_start, \
         target_url, lease_end, released"
    };
}
pub(crate) use columns;

/// The `WHERE` of a read of `messages` by the id `$1`: through `message_ids`, which holds
/// the ids' index (schema v10).
macro_rules! where_id {
    () => {
        " WHERE seq = (SELECT mi_seq FROM message_ids WHERE mi_id = $1)"
    };
}
pub(crate) use where_id;

/// The `WHERE` of a read of `messages` by the ids `$1` (a `text[]`), as [`where_id!`].
macro_rules! where_ids {
    () => {
        " WHERE seq = ANY(ARRAY(SELECT mi_seq FROM message_ids WHERE mi_id = ANY($1)))"
    };
}
pub(crate) use where_ids;

/// The history of the message `m.seq` as one JSON array, oldest first: appended to
/// [`columns!`] (as column [`HISTORY_COLUMN`]) by a read that wants the whole message.
macro_rules! history_column {
    () => {
        "(SELECT coalesce(json_agg(h.entry ORDER BY h.n), '[]')::text FROM history h \
          WHERE h.message_seq = messages.seq)"
    };
}
pub(crate) use history_column;

/// The index of [`history_column!`] after [`columns!`].
pub const HISTORY_COLUMN: usize = 26;

/// A message row but its history (the row every backend shares).
pub type Row = redrive_storage::stored::StoredRow;

fn ts(v: Option<i64>) -> Option<Timestamp> {
    v.map(Timestamp::from_millis)
}

fn u32_of(v: i32) -> u32 {
    v.max(0) as u32
}

/// Read a row selected with [`columns!`] first.
pub fn from_pg(r: &tokio_postgres::Row) -> Result<Row, E> {
    let code: i16 = r.try_get(3)?;
    let state = u8::try_from(code)
        .ok()
        .and_then(State::from_code)
        .ok_or_else(|| {
            E::Db(StoreError::Backend(format!(
                "state code {code} in the database is not a known state"
            )))
        })?;
    let lease_end: Option<String> = r.try_get(24)?;
    let lease_end = match lease_end {
        None => None,
        Some(e) => Some(LeaseEnd::parse(&e).ok_or_else(|| {
            E::Db(StoreError::Backend(format!(
                "messages.lease_end {e:?} is not a known lease end"
            )))
        })?),
    };
    let dead_reason: Option<String> = r.try_get(20)?;
    let prev_delay_ms: Option<i64> = r.try_get(13)?;
    let priority: i16 = r.try_get(4)?;
    Ok(Row {
        seq: r.try_get(0)?,
        id: r.try_get(1)?,
        queue: r.try_get(2)?,
        priority: priority.clamp(0, 255) as u8,
        key: r.try_get(6)?,
        idempotency_key: r.try_get(7)?,
        payload: r.try_get(8)?,
        headers: r.try_get(9)?,
        lease_token: r.try_get(16)?,
        last_error: r.try_get(21)?,
        target_url: r.try_get(23)?,
        life: Lifecycle {
            state,
            due_at: ts(r.try_get(5)?),
            attempts: u32_of(r.try_get(10)?),
            budget_base: u32_of(r.try_get(11)?),
            uncounted: u32_of(r.try_get(12)?),
            released: u32_of(r.try_get(25)?),
            prev_delay_ms: prev_delay_ms.map(|d| d.max(0) as u64),
            created_at: Timestamp::from_millis(r.try_get(14)?),
            updated_at: Timestamp::from_millis(r.try_get(15)?),
            window_start: ts(r.try_get(22)?),
            leased_at: ts(r.try_get(17)?),
            lease_expires_at: ts(r.try_get(18)?),
            lease_end,
            finished_at: ts(r.try_get(19)?),
            dead_reason: dead_reason.as_deref().and_then(DeadReason::parse),
        },
    })
}

/// Read a row selected with [`columns!`] and [`history_column!`]: the whole message.
pub fn message_from_pg(r: &tokio_postgres::Row) -> Result<Message, E> {
    let row = from_pg(r)?;
    let history: String = r.try_get(HISTORY_COLUMN)?;
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
pub fn int(n: u32) -> i32 {
    n.min(i32::MAX as u32) as i32
}

/// `prev_delay_ms`'s value.
pub fn delay_ms(d: Option<u64>) -> Option<i64> {
    d.map(|d| d.min(i64::MAX as u64) as i64)
}
