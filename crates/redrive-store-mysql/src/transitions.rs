//! The message state machine's transitions, each run inside one transaction.
//!
//! Every transition of one message locks its row (`SELECT … FOR UPDATE`), reads its
//! [`Lifecycle`], lets `redrive_storage::rules` check and change it, and writes it back by
//! primary key ([`write_life`]), appending history entries as rows of `history`; the
//! message's `ready` row follows its state ([`sync_ready`]). Nothing here decides a state
//! change itself: a refusal is the rules' error, answered before anything is written (so a
//! refused item of a batch leaves the transaction usable for the others). Per-key ordering
//! is kept true after each of them by `key_order::settle`.
//!
//! Batch work takes its rows with `FOR UPDATE SKIP LOCKED` and writes them by primary key:
//! a claim ([`lease`]), a promotion and the reaper ([`tick`]), the purge ([`purge`]).
//! Acks and nacks of many leases are set-based ([`ack_many`], [`nack_many`]): one
//! statement reads their rows, `redrive_storage::settle` checks and changes each, one
//! `UPDATE … JOIN` writes them, and their history is appended in one insert.

use crate::error::{Conflict, E};
use crate::key_order;
use crate::row::{self, columns, delay_ms, int, ms, Row};
use crate::sql::{
    args, col, execute, key_rows, list, marks, query, query_one, query_opt, resolve_now, Db,
};
use crate::sql_publish;
use crate::{Ctx, Inner};
use mysql_async::{Params, Value};
use redrive_core::{
    AttemptResponse, Failure, HistoryEntry, HistoryEvent, Message, MessageId, NewMessage, State,
    Timestamp, Waited,
};
use redrive_storage::rules::{self, AttemptEnd, FailedAttempt, KeyMode, LeaseEnd, Lifecycle};
use redrive_storage::{
    settle, Ack, AckEvent, Acked, FailureOutcome, LeaseRef, LeaseRequest, Leased, Nack, Published,
    PurgeOutcome, Release, Released, Returned, Settled, StoreError, TickOutcome,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering as AtomicOrdering;

/// At most this many expired leases are failed in one tick.
const TICK_EXPIRE_LIMIT: i64 = 1_000;
/// At most this many scheduled messages become ready in one tick (shared among queues).
const TICK_PROMOTE_LIMIT: usize = 5_000;
/// At most this many done messages are deleted by one purge (by primary key): a bounded
/// batch, so that a purge never holds thousands of row locks (Solid Queue #609).
const PURGE_LIMIT: usize = 1_000;
/// Expired idempotency records deleted by one purge, and key heads with nothing left.
const PURGE_RECORDS_LIMIT: usize = 1_000;
/// Rows named in one `IN (…)` list.
const CHUNK: usize = 500;

/// The bytes of a message's stored JSON that [`LeaseRequest::max_bytes`] counts.
const SIZE_SQL: &str = "OCTET_LENGTH(payload) + COALESCE(OCTET_LENGTH(headers), 0) \
     + COALESCE(OCTET_LENGTH(last_error), 0) + COALESCE(OCTET_LENGTH(msg_key), 0)";

const ROW_FOR_UPDATE: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM messages WHERE id = ? FOR UPDATE"
);

/// Every lifecycle column, and the last error when given.
const WRITE_LIFE: &str =
    "UPDATE messages SET state = ?, due_at = ?, attempts = ?, budget_base = ?, \
     uncounted = ?, released = ?, prev_delay_ms = ?, updated_at = ?, window_start = ?, \
     leased_at = ?, lease_expires_at = ?, lease_end = ?, finished_at = ?, dead_reason = ?, \
     error_class = COALESCE(?, error_class), last_error = COALESCE(?, last_error) WHERE seq = ?";

/// Put the message `seq` into `ready` when it is leasable (state ready, not waiting behind
/// its key), by primary key; its claim order is updated if it was there.
pub async fn ready_insert<C: Db>(st: &Inner, tx: &mut C, seqs: &[i64]) -> Result<(), E> {
    for chunk in seqs.chunks(CHUNK) {
        let sql = format!(
            "INSERT INTO ready (seq, queue, rnk, due_at, size, node) \
             SELECT seq, queue, 255 - priority, COALESCE(due_at, 0), {SIZE_SQL}, ? \
             FROM messages FORCE INDEX (PRIMARY) WHERE seq IN ({}) AND state = 1 AND key_blocked IS NOT TRUE \
             ON DUPLICATE KEY UPDATE rnk = VALUES(rnk), due_at = VALUES(due_at), size = VALUES(size)",
            marks(chunk.len())
        );
        let mut p: Vec<Value> = vec![st.node().into()];
        p.extend(chunk.iter().map(|s| Value::from(*s)));
        execute(tx, &sql, Params::Positional(p)).await?;
    }
    Ok(())
}

/// Take the messages `seqs` out of `ready`, by primary key.
pub async fn ready_delete<C: Db>(tx: &mut C, seqs: &[i64]) -> Result<(), E> {
    for chunk in seqs.chunks(CHUNK) {
        let sql = format!(
            "DELETE r FROM ready r JOIN ({}) v ON r.seq = v.k",
            key_rows(chunk.len())
        );
        execute(tx, &sql, list(chunk)).await?;
    }
    Ok(())
}

/// Keep `ready` true for the message `seq` after it moved from state `before` to `after`.
pub async fn sync_ready<C: Db>(
    st: &Inner,
    tx: &mut C,
    seq: i64,
    before: Option<State>,
    after: State,
) -> Result<(), E> {
    if after == State::Ready {
        ready_insert(st, tx, &[seq]).await
    } else if before == Some(State::Ready) {
        ready_delete(tx, &[seq]).await
    } else {
        Ok(())
    }
}

/// The message `id`, its row locked for this transaction, after its key's lock point
/// (`key_order::lock_keys`: the order every writer locks in).
async fn locked_row<C: Db>(st: &Inner, tx: &mut C, id: &MessageId) -> Result<Row, E> {
    lock_rows(st, tx, &[*id]).await?;
    match query_opt(tx, ROW_FOR_UPDATE, args![id.to_string()]).await? {
        Some(r) => row::from_my(&r),
        None => Err(E::Logic(StoreError::NotFound(id.to_string()))),
    }
}

/// The (queue, key) of the stored messages `ids` that have a key (read, not locked).
pub async fn keys_of<C: Db>(
    tx: &mut C,
    ids: &[MessageId],
) -> Result<Vec<(String, Option<String>)>, E> {
    let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
    let mut out = Vec::new();
    for chunk in ids.chunks(CHUNK) {
        let rows = query(
            tx,
            &format!(
                "SELECT queue, msg_key FROM messages FORCE INDEX (ux_id) \
                 WHERE id IN ({}) AND msg_key IS NOT NULL",
                marks(chunk.len())
            ),
            list(chunk),
        )
        .await?;
        for r in &rows {
            out.push((col(r, 0)?, col(r, 1)?));
        }
    }
    Ok(out)
}

/// Lock what transitions of the messages `ids` will change, in the one order every writer
/// follows: first the lock points of their ordered keys (sorted), then the message rows
/// (by `seq`). A batch (ack, nack, release, return, a task step) calls it for all its items
/// before it acts on any, so that item order never decides lock order. Unknown ids are
/// skipped (each item answers its own `NotFound`).
pub async fn lock_rows<C: Db>(st: &Inner, tx: &mut C, ids: &[MessageId]) -> Result<(), E> {
    if ids.is_empty() {
        return Ok(());
    }
    let keys = keys_of(tx, ids).await?;
    key_order::lock_keys(st, tx, keys).await?;
    let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
    for chunk in ids.chunks(CHUNK) {
        let m = marks(chunk.len());
        query(
            tx,
            &format!(
                "SELECT seq FROM messages FORCE INDEX (ux_id) WHERE id IN ({m}) \
                 ORDER BY seq FOR UPDATE"
            ),
            list(chunk),
        )
        .await?;
    }
    Ok(())
}

/// Write `row.life` (and a new last error, when given) to the row, and keep `ready` true
/// (the row was in state `before`).
async fn write_life<C: Db>(
    st: &Inner,
    tx: &mut C,
    row: &Row,
    before: State,
    error: Option<(&str, &str)>,
) -> Result<(), E> {
    let life = &row.life;
    let (class, last_error) = match error {
        Some((c, e)) => (Some(c.to_owned()), Some(e.to_owned())),
        None => (None, None),
    };
    execute(
        tx,
        WRITE_LIFE,
        args![
            i64::from(life.state.code()),
            ms(life.due_at),
            int(life.attempts),
            int(life.budget_base),
            int(life.uncounted),
            int(life.released),
            delay_ms(life.prev_delay_ms),
            life.updated_at.as_millis(),
            ms(life.window_start),
            ms(life.leased_at),
            ms(life.lease_expires_at),
            life.lease_end.map(LeaseEnd::as_str),
            ms(life.finished_at),
            life.dead_reason.map(|r| r.as_str()),
            class,
            last_error,
            row.seq,
        ],
    )
    .await?;
    sync_ready(st, tx, row.seq, Some(before), life.state).await
}

/// Append `entries` to the history of the message at `seq` (its row is locked).
pub async fn append_history<C: Db>(
    tx: &mut C,
    seq: i64,
    entries: &[&HistoryEntry],
) -> Result<(), E> {
    let entries: Vec<(i64, &HistoryEntry)> = entries.iter().map(|e| (seq, *e)).collect();
    append_histories(tx, &entries).await
}

/// Note a push message's waits before its attempt `attempt` ([`redrive_core::note_wait`]
/// updates the episode's entry in place, or appends one): the entries it changed are
/// rewritten, the ones it added appended.
async fn note_waits<C: Db>(
    tx: &mut C,
    seq: i64,
    attempt: u32,
    waits: &[Waited],
    now: Timestamp,
) -> Result<(), E> {
    if waits.is_empty() {
        return Ok(());
    }
    let rows = query(
        tx,
        "SELECT n, entry FROM history WHERE message_seq = ? ORDER BY n",
        args![seq],
    )
    .await?;
    let mut old: Vec<(i64, HistoryEntry)> = Vec::with_capacity(rows.len());
    for r in &rows {
        let text: String = col(r, 1)?;
        old.push((col(r, 0)?, serde_json::from_str(&text)?));
    }
    let mut history: Vec<HistoryEntry> = old.iter().map(|(_, h)| h.clone()).collect();
    for wait in waits {
        redrive_core::note_wait(&mut history, attempt, *wait, now);
    }
    let mut next = old.last().map_or(0, |(n, _)| *n) + 1;
    for (i, entry) in history.iter().enumerate() {
        match old.get(i) {
            Some((n, before)) if before != entry => {
                execute(
                    tx,
                    "UPDATE history SET entry = ? WHERE message_seq = ? AND n = ?",
                    args![serde_json::to_string(entry)?, seq, *n],
                )
                .await?;
            }
            Some(_) => {}
            None => {
                execute(
                    tx,
                    "INSERT INTO history (message_seq, n, entry) VALUES (?, ?, ?)",
                    args![seq, next, serde_json::to_string(entry)?],
                )
                .await?;
                next += 1;
            }
        }
    }
    Ok(())
}

/// [`rules::check_lease`] on a locked row. Every lease this store ends records how
/// (`lease_end`), so the rules never need the history to tell it.
fn check_lease(row: &Row, token: &str, now: Timestamp) -> Result<(), E> {
    rules::check_lease(&row.life, row.lease_token.as_deref(), token, now, || {
        Ok(Vec::new())
    })?;
    Ok(())
}

/// The lease's row, locked, if `lease` is the message's live lease.
async fn leased_row<C: Db>(
    st: &Inner,
    tx: &mut C,
    lease: &LeaseRef,
    now: Timestamp,
) -> Result<Row, E> {
    let row = locked_row(st, tx, &lease.id).await?;
    check_lease(&row, &lease.token, now)?;
    Ok(row)
}

// ---- publish ----

/// A live idempotency record: message id, fingerprint, tombstone, expiry.
type Record = (String, String, Option<String>, i64);

/// Publish `items`, all or nothing (see [`redrive_storage::Store::publish`]): each item is
/// decided in order (a key used twice in the call replays, or conflicts with, its first
/// use), inserted with its history and idempotency record, then per-key ordering.
pub async fn publish<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    items: &[NewMessage],
    now: Timestamp,
) -> Result<Vec<Published>, E> {
    let t = now.as_millis();
    // The ordered keys' lock points first, in one order (`key_order::lock_keys`).
    key_order::lock_keys(
        st,
        tx,
        items.iter().map(|i| (i.queue.clone(), i.key.clone())),
    )
    .await?;
    let mut out = Vec::with_capacity(items.len());
    // New messages not in a key's order, inserted together ([`insert_rows`]).
    let mut deferred: Vec<Deferred> = Vec::new();
    // Keys first used by this call: (queue, key) → (message, fingerprint).
    let mut first_use: HashMap<(String, String), (Message, String)> = HashMap::new();
    // The keyed items' fingerprints, computed by the database as `redrive_publish` computes
    // its own (`sql_publish.rs`), so that both paths share one idempotency record.
    let mut texts = items
        .iter()
        .map(|i| serde_json::to_string(&i.payload))
        .collect::<Result<Vec<_>, _>>()?;
    let keyed: Vec<&str> = (items.iter().zip(&texts))
        .filter(|(i, _)| i.idempotency_key.is_some())
        .map(|(_, t)| t.as_str())
        .collect();
    let mut fps = sql_publish::fingerprints(st.canon, tx, &keyed)
        .await?
        .into_iter();
    for (index, item) in items.iter().enumerate() {
        let payload = std::mem::take(&mut texts[index]);
        let fp = match item.idempotency_key {
            Some(_) => fps.next().unwrap_or_default(),
            None => String::new(),
        };
        if let Some(ikey) = item.idempotency_key.as_deref() {
            let conflict = || {
                E::Logic(StoreError::IdempotencyConflict {
                    index,
                    key: ikey.to_owned(),
                })
            };
            if let Some((m, f)) = first_use.get(&(item.queue.clone(), ikey.to_owned())) {
                if *f != fp {
                    return Err(conflict());
                }
                out.push(Published {
                    message: m.clone(),
                    replayed: true,
                    failure: None,
                });
                continue;
            }
            let found = query_opt(
                tx,
                "SELECT message_id, fingerprint, tombstone, expires_at FROM idempotency \
                 WHERE queue = ? AND ikey = ? AND expires_at > ?",
                args![item.queue.as_str(), ikey, t],
            )
            .await?;
            if let Some(r) = found {
                let rec: Record = (col(&r, 0)?, col(&r, 1)?, col(&r, 2)?, col(&r, 3)?);
                if !sql_publish::fingerprint_matches(&rec.1, &fp, &payload) {
                    return Err(conflict());
                }
                let existing = query_opt(
                    tx,
                    concat!("SELECT ", columns!(), " FROM messages WHERE id = ?"),
                    args![rec.0.as_str()],
                )
                .await?;
                let message = match existing {
                    Some(r) => row::from_my(&r)?.to_message(None, None)?,
                    None => redrive_storage::stored::purged_message(
                        row::parse_id(&rec.0)?,
                        item,
                        rec.2.as_deref(),
                        rec.3,
                        st.idempotency_window_ms,
                    )?,
                };
                out.push(Published {
                    message,
                    replayed: true,
                    failure: None,
                });
                continue;
            }
        }
        let mut life = Lifecycle::published(item.deliver_at, now);
        let mut history = Vec::new();
        let mut failure = None;
        let mut last_error = None;
        if let Some(f) = &item.failed {
            let policy = &st.catalog.get(&item.queue).retry;
            let (before, at) = (item.attempts_before, item.deliver_at);
            let failed = st
                .with_rng(|rng| rules::publish_failed(&mut life, policy, f, before, at, now, rng));
            last_error = Some(serde_json::to_string(&failed.last_error)?);
            history.push(failed.entry);
            failure = Some((failed.class, failed.retry_delay_ms));
        }
        let mode = KeyMode::of(st.catalog.get(&item.queue));
        let key_blocked = key_order::initial(mode, item.key.as_deref(), life.state);
        let mut row = Row {
            seq: 0,
            id: MessageId::new().to_string(),
            queue: item.queue.clone(),
            priority: item.priority,
            key: item.key.clone(),
            idempotency_key: item.idempotency_key.clone(),
            payload,
            headers: if item.headers.is_empty() {
                None
            } else {
                Some(serde_json::to_string(&item.headers)?)
            },
            lease_token: None,
            last_error,
            target_url: item.target_url.clone(),
            life,
        };
        let class = item.failed.as_ref().map(|f| f.class.as_str());
        let ordered = mode != KeyMode::Unordered && item.key.is_some();
        if ordered {
            // Its key's order is settled against the rows before it: those go in first.
            insert_rows(st, tx, &mut deferred).await?;
            row.seq = insert_row(tx, &row, class, key_blocked).await?;
            let refs: Vec<&HistoryEntry> = history.iter().collect();
            append_history(tx, row.seq, &refs).await?;
        }
        if let Some(ikey) = row.idempotency_key.as_deref() {
            // An expired record of the key is replaced; a live one can only be a concurrent
            // publish's (it was not there when read above): run the call again.
            let expires = now.plus_ms(st.idempotency_window_ms).as_millis();
            let n = execute(
                tx,
                "INSERT INTO idempotency (queue, ikey, message_id, fingerprint, expires_at) \
                 VALUES (?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE \
                 message_id = IF(expires_at <= ?, VALUES(message_id), message_id), \
                 fingerprint = IF(expires_at <= ?, VALUES(fingerprint), fingerprint), \
                 tombstone = IF(expires_at <= ?, NULL, tombstone), \
                 expires_at = IF(expires_at <= ?, VALUES(expires_at), expires_at)",
                args![
                    row.queue.as_str(),
                    ikey,
                    row.id.as_str(),
                    fp.as_str(),
                    expires,
                    t,
                    t,
                    t,
                    t
                ],
            )
            .await?;
            if n == 0 {
                return Err(E::Retry(
                    Conflict::Race,
                    "an idempotency key of the call was taken by a concurrent publish".to_owned(),
                ));
            }
        }
        if ordered {
            sync_ready(st, tx, row.seq, None, row.life.state).await?;
            key_order::settle(st, tx, &row.queue, row.key.as_deref(), row.seq).await?;
        }
        cx.changes += 1;
        cx.wake_if_scheduled(&row.life);
        let mut message = row.to_message(None, Some(item.payload.clone()))?;
        if let Some(ikey) = item.idempotency_key.as_deref() {
            // A replay of it in this call reads it back as stored: without its history.
            first_use.insert(
                (item.queue.clone(), ikey.to_owned()),
                (message.clone(), fp.clone()),
            );
        }
        let failure = failure.map(|(class, delay)| FailureOutcome {
            message: Message {
                history: history.clone(),
                ..message.clone()
            },
            class,
            retry_delay_ms: delay,
            dead_reason: message.dead_reason,
        });
        message.history = if ordered {
            history
        } else {
            let answer = history.clone();
            deferred.push(Deferred {
                row,
                class,
                key_blocked,
                history,
            });
            answer
        };
        out.push(Published {
            failure,
            message,
            replayed: false,
        });
    }
    insert_rows(st, tx, &mut deferred).await?;
    Ok(out)
}

/// A new message of a publish whose row is inserted with others ([`insert_rows`]): one
/// that takes no part in a key's order.
struct Deferred {
    row: Row,
    class: Option<&'static str>,
    key_blocked: Option<bool>,
    history: Vec<HistoryEntry>,
}

/// Rows of one multi-row insert of new messages.
const INSERT_CHUNK: usize = 200;

/// Insert the new messages `rows` (then empty) in their order: one multi-row `INSERT` per
/// [`INSERT_CHUNK`], one statement reading their `seq`s back, one appending their history,
/// one putting the ready ones into `ready`.
async fn insert_rows<C: Db>(st: &Inner, tx: &mut C, rows: &mut Vec<Deferred>) -> Result<(), E> {
    if rows.is_empty() {
        return Ok(());
    }
    for chunk in rows.chunks(INSERT_CHUNK) {
        let values =
            vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; chunk.len()]
                .join(", ");
        let mut p: Vec<Value> = Vec::with_capacity(chunk.len() * 20);
        for d in chunk {
            p.extend(insert_values(&d.row, d.class, d.key_blocked));
        }
        execute(
            tx,
            &format!("{INSERT_MESSAGE} VALUES {values}"),
            Params::Positional(p),
        )
        .await?;
    }
    let ids: Vec<String> = rows.iter().map(|d| d.row.id.clone()).collect();
    let mut seqs: HashMap<String, i64> = HashMap::with_capacity(ids.len());
    for chunk in ids.chunks(CHUNK) {
        let sql = format!(
            "SELECT id, seq FROM messages FORCE INDEX (ux_id) WHERE id IN ({})",
            marks(chunk.len())
        );
        for r in &query(tx, &sql, list(chunk)).await? {
            seqs.insert(col(r, 0)?, col(r, 1)?);
        }
    }
    let mut entries: Vec<(i64, HistoryEntry)> = Vec::new();
    let mut ready: Vec<i64> = Vec::new();
    for d in rows.drain(..) {
        let seq = *seqs.get(&d.row.id).ok_or_else(|| {
            E::Db(StoreError::Backend(format!(
                "the message {} just inserted was not found",
                d.row.id
            )))
        })?;
        if d.row.life.state == State::Ready {
            ready.push(seq);
        }
        entries.extend(d.history.into_iter().map(|e| (seq, e)));
    }
    let entries: Vec<(i64, &HistoryEntry)> = entries.iter().map(|(q, e)| (*q, e)).collect();
    append_histories(tx, &entries).await?;
    ready_insert(st, tx, &ready).await
}

/// The insert of new messages, before its `VALUES`: one row is [`insert_values`].
const INSERT_MESSAGE: &str = "INSERT INTO messages (id, queue, state, priority, due_at, msg_key, \
     idempotency_key, payload, headers, attempts, uncounted, prev_delay_ms, created_at, \
     updated_at, finished_at, dead_reason, error_class, last_error, key_blocked, target_url)";

/// The 20 values of one row of [`INSERT_MESSAGE`].
fn insert_values(row: &Row, error_class: Option<&str>, key_blocked: Option<bool>) -> [Value; 20] {
    let life = &row.life;
    [
        row.id.as_str().into(),
        row.queue.as_str().into(),
        i64::from(life.state.code()).into(),
        i64::from(row.priority).into(),
        ms(life.due_at).into(),
        row.key.as_deref().into(),
        row.idempotency_key.as_deref().into(),
        row.payload.as_str().into(),
        row.headers.as_deref().into(),
        int(life.attempts).into(),
        int(life.uncounted).into(),
        delay_ms(life.prev_delay_ms).into(),
        life.created_at.as_millis().into(),
        life.created_at.as_millis().into(),
        ms(life.finished_at).into(),
        life.dead_reason.map(|d| d.as_str()).into(),
        error_class.into(),
        row.last_error.as_deref().into(),
        key_blocked.into(),
        row.target_url.as_deref().into(),
    ]
}

/// Insert a new message; its `seq`.
async fn insert_row<C: Db>(
    tx: &mut C,
    row: &Row,
    error_class: Option<&str>,
    key_blocked: Option<bool>,
) -> Result<i64, E> {
    let values = insert_values(row, error_class, key_blocked);
    execute(
        tx,
        &format!(
            "{INSERT_MESSAGE} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        ),
        Params::Positional(values.into()),
    )
    .await?;
    tx.inserted_id()
        .map(|s| s as i64)
        .ok_or_else(|| E::Db(StoreError::Backend("an insert answered no seq".to_owned())))
}

// ---- lease ----

/// Lease up to `req.max` ready messages of `req.queue`: pick `ready` rows in claim order
/// `FOR UPDATE SKIP LOCKED`, lock their messages by primary key (`SKIP LOCKED`: one an
/// operator or a settle holds is left for the next claim), then update those and delete
/// their `ready` rows by primary key. Never waits for a lock, never takes more than `max`.
pub async fn lease<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    req: &LeaseRequest,
    now: Option<Timestamp>,
) -> Result<Vec<Leased>, E> {
    let max = i64::from(req.max.max(1));
    let budget: Option<i64> = match req.max_bytes {
        Some(b) if req.max > 1 => Some(b.min(i64::MAX as u64) as i64),
        _ => None,
    };
    // The database's clock comes with the pick (one round trip fewer per claim).
    let picked = query(
        tx,
        "SELECT seq, size, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) FROM ready \
         WHERE queue = ? ORDER BY rnk, due_at, seq LIMIT ? FOR UPDATE SKIP LOCKED",
        args![req.queue.as_str(), max],
    )
    .await?;
    let Some(first) = picked.first() else {
        return Ok(Vec::new());
    };
    let now = match now {
        Some(t) => t,
        None => Timestamp::from_millis(col(first, 2)?),
    };
    let mut order: Vec<(i64, i64)> = Vec::with_capacity(picked.len());
    for r in &picked {
        order.push((col(r, 0)?, col(r, 1)?));
    }
    let seqs: Vec<i64> = order.iter().map(|(s, _)| *s).collect();
    let sql = format!(
        concat!(
            "SELECT ",
            columns!(),
            ", key_blocked FROM messages FORCE INDEX (PRIMARY) WHERE seq IN ({}) \
             FOR UPDATE SKIP LOCKED"
        ),
        marks(seqs.len())
    );
    let mut rows: HashMap<i64, (Row, Option<bool>)> = HashMap::new();
    for r in &query(tx, &sql, list(&seqs)).await? {
        let row = row::from_my(r)?;
        let blocked: Option<bool> = col(r, 26)?;
        rows.insert(row.seq, (row, blocked));
    }
    // A `ready` row whose message is not leasable is stale (it cannot be, but if it were,
    // it would stay for ever): taken out.
    let stale: Vec<i64> = rows
        .values()
        .filter(|(r, b)| r.life.state != State::Ready || *b == Some(true))
        .map(|(r, _)| r.seq)
        .collect();
    let mut taken: Vec<Row> = Vec::new();
    let mut used = 0i64;
    for (seq, size) in &order {
        let Some((row, blocked)) = rows.remove(seq) else {
            continue; // locked by another transaction: skipped
        };
        if row.life.state != State::Ready || blocked == Some(true) {
            continue;
        }
        used += size;
        if let Some(b) = budget {
            if !taken.is_empty() && used > b {
                break;
            }
        }
        taken.push(row);
    }
    ready_delete(tx, &stale).await?;
    if taken.is_empty() {
        return Ok(Vec::new());
    }
    let t = now.as_millis();
    let lease_ms = req.lease_ms.min(i64::MAX as u64 / 4) as i64;
    let expires = t + lease_ms;
    let nonce = st.nonce();
    let ids: Vec<i64> = taken.iter().map(|r| r.seq).collect();
    let sql = format!(
        "UPDATE messages FORCE INDEX (PRIMARY) SET lease_token = CONCAT(attempts + 1, '-', ?), attempts = attempts + 1, \
         state = 2, leased_at = ?, lease_expires_at = ?, lease_end = NULL, updated_at = ?, \
         key_blocked = CASE WHEN key_blocked IS NULL THEN NULL ELSE TRUE END \
         WHERE seq IN ({})",
        marks(ids.len())
    );
    let mut p: Vec<Value> = vec![nonce.as_str().into(), t.into(), expires.into(), t.into()];
    p.extend(ids.iter().map(|s| Value::from(*s)));
    execute(tx, &sql, Params::Positional(p)).await?;
    ready_delete(tx, &ids).await?;
    let policy = &st.catalog.get(&req.queue).retry;
    let at = Timestamp::from_millis(t);
    let expires_at = Timestamp::from_millis(expires);
    let mut out = Vec::with_capacity(taken.len());
    for mut row in taken {
        let life = &mut row.life;
        life.attempts += 1;
        life.state = State::Leased;
        life.leased_at = Some(at);
        life.lease_expires_at = Some(expires_at);
        life.lease_end = None;
        life.updated_at = at;
        row.lease_token = Some(format!("{}-{nonce}", life.attempts));
        let lateness_ms = t - row.life.due_at.unwrap_or(at).as_millis();
        out.push(Leased {
            message: row.to_message(None, None)?,
            attempt: row.life.attempts,
            max_attempts: row.life.max_attempts(policy),
            token: row.lease_token.clone().unwrap_or_default(),
            expires_at,
            lateness_ms,
        });
    }
    cx.changes += out.len() as u64;
    cx.wake_at(expires);
    Ok(out)
}

// ---- ack, nack, release, returned, extend ----

/// Ack one lease (see [`redrive_storage::Store::ack`]).
pub async fn ack<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    ack: &Ack,
    now: Timestamp,
) -> Result<Acked, E> {
    let lease = &ack.lease;
    let mut row = locked_row(st, tx, &lease.id).await?;
    if row.life.state == State::Done && row.lease_token.as_deref() == Some(lease.token.as_str()) {
        // A retried ack of the lease that made it done.
        return Ok(Acked {
            message: row.to_message(None, None)?,
            repeated: true,
        });
    }
    check_lease(&row, &lease.token, now)?;
    note_waits(tx, row.seq, row.life.attempts, &ack.waited, now).await?;
    let before = row.life.state;
    let life = &mut row.life;
    life.state = State::Done;
    life.finished_at = Some(now);
    life.updated_at = now;
    life.lease_end = Some(LeaseEnd::Settled(Settled::Acked));
    let entry = HistoryEntry {
        attempt: row.life.attempts,
        at: now,
        leased_at: row.life.leased_at,
        event: match ack.event {
            AckEvent::Acked => HistoryEvent::Acked,
            AckEvent::Republished => HistoryEvent::Republished,
        },
        response: ack.response.clone(),
    };
    write_life(st, tx, &row, before, None).await?;
    append_history(tx, row.seq, &[&entry]).await?;
    key_order::settle(st, tx, &row.queue, row.key.as_deref(), row.seq).await?;
    cx.changes += 1;
    Ok(Acked {
        message: row.to_message(None, None)?,
        repeated: false,
    })
}

/// Nack one lease: the policy decides.
pub async fn nack<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    nack: &Nack,
    now: Timestamp,
) -> Result<FailureOutcome, E> {
    let row = leased_row(st, tx, &nack.lease, now).await?;
    note_waits(tx, row.seq, row.life.attempts, &nack.waited, now).await?;
    let end = AttemptEnd::lease(LeaseEnd::Settled(Settled::Nacked));
    fail_attempt(
        st,
        tx,
        cx,
        row,
        &nack.failure,
        nack.response.as_ref(),
        end,
        now,
    )
    .await
}

/// A failed attempt of a locked row: the rules decide, this writes.
#[allow(clippy::too_many_arguments)]
async fn fail_attempt<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    mut row: Row,
    failure: &Failure,
    response: Option<&AttemptResponse>,
    end: AttemptEnd,
    now: Timestamp,
) -> Result<FailureOutcome, E> {
    let before = row.life.state;
    let policy = &st.catalog.get(&row.queue).retry;
    let failed = st.with_rng(|rng| rules::fail(&mut row.life, policy, failure, end, now, rng));
    write_failed(st, tx, cx, row, before, failed, response).await
}

/// Write a failed attempt the rules applied to `row` (in state `before` until now).
async fn write_failed<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    mut row: Row,
    before: State,
    failed: FailedAttempt,
    response: Option<&AttemptResponse>,
) -> Result<FailureOutcome, E> {
    let FailedAttempt {
        mut entry,
        last_error,
        class,
        retry_delay_ms,
    } = failed;
    entry.response = response.cloned();
    let last_error = serde_json::to_string(&last_error)?;
    write_life(st, tx, &row, before, Some((class.as_str(), &last_error))).await?;
    append_history(tx, row.seq, &[&entry]).await?;
    row.last_error = Some(last_error);
    key_order::settle(st, tx, &row.queue, row.key.as_deref(), row.seq).await?;
    cx.changes += 1;
    cx.wake_if_scheduled(&row.life);
    let message = row.to_message(None, None)?;
    Ok(FailureOutcome {
        dead_reason: message.dead_reason,
        message,
        class,
        retry_delay_ms,
    })
}

/// Hand a lease back unattempted ([`rules::release`]).
pub async fn release<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    release: &Release,
    now: Timestamp,
) -> Result<Released, E> {
    let mut row = leased_row(st, tx, &release.lease, now).await?;
    // The attempt it waits to make is the one this lease counted (taken back below).
    note_waits(tx, row.seq, row.life.attempts, &release.waited, now).await?;
    let before = row.life.state;
    let policy = &st.catalog.get(&row.queue).retry;
    match st.with_rng(|rng| rules::release(&mut row.life, policy, release, now, rng)) {
        Some(failed) => Ok(Released::Charged(
            write_failed(st, tx, cx, row, before, failed, None).await?,
        )),
        None => {
            write_life(st, tx, &row, before, None).await?;
            key_order::settle(st, tx, &row.queue, row.key.as_deref(), row.seq).await?;
            cx.changes += 1;
            cx.wake_if_scheduled(&row.life);
            Ok(Released::Uncharged(row.to_message(None, None)?))
        }
    }
}

/// A delivered attempt came back failed: apply it once (`None`: already applied).
pub async fn returned<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    ret: &Returned,
    now: Timestamp,
) -> Result<Option<FailureOutcome>, E> {
    let mut row = locked_row(st, tx, &ret.id).await?;
    if !rules::returned_applies(&row.life, ret.attempt) {
        return Ok(None);
    }
    let end = match row.life.state {
        State::Leased => {
            // The copy came back before the bridge settled its lease: that the copy exists
            // proves the broker took it, so the history says so before the failure.
            let entry = HistoryEntry {
                attempt: row.life.attempts,
                at: now,
                leased_at: row.life.leased_at,
                event: HistoryEvent::Republished,
                response: None,
            };
            append_history(tx, row.seq, &[&entry]).await?;
            AttemptEnd::lease(LeaseEnd::Settled(Settled::Nacked))
        }
        _ => AttemptEnd::default(),
    };
    // Back from done: not finished any more (dead sets it again).
    row.life.finished_at = None;
    fail_attempt(st, tx, cx, row, &ret.failure, None, end, now)
        .await
        .map(Some)
}

/// Extend a live lease ([`rules::extend`]); the new expiry.
pub async fn extend<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    lease: &LeaseRef,
    by_ms: u64,
    now: Option<Timestamp>,
) -> Result<Timestamp, E> {
    let now = resolve_now(tx, now).await?;
    let mut row = leased_row(st, tx, lease, now).await?;
    let new = rules::extend(&mut row.life, by_ms, now);
    execute(
        tx,
        "UPDATE messages SET lease_expires_at = ?, updated_at = ? WHERE seq = ?",
        args![
            ms(row.life.lease_expires_at),
            row.life.updated_at.as_millis(),
            row.seq
        ],
    )
    .await?;
    cx.wake_at(new.as_millis());
    Ok(new)
}

// ---- operator actions ----

/// Redrive `id` ([`rules::redrive`]); with `payload`, replace its payload (an operator's
/// edit); `task` names the bulk task doing it.
pub async fn redrive<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    id: &MessageId,
    payload: Option<&serde_json::Value>,
    task: Option<&str>,
    now: Timestamp,
) -> Result<Message, E> {
    let mut row = locked_row(st, tx, id).await?;
    let before = row.life.state;
    let entry = rules::redrive(&mut row.life, payload.is_some(), task, now)?;
    if let Some(p) = payload {
        let text = serde_json::to_string(p)?;
        execute(
            tx,
            "UPDATE messages SET payload = ? WHERE seq = ?",
            args![text.as_str(), row.seq],
        )
        .await?;
        row.payload = text;
    }
    write_life(st, tx, &row, before, None).await?;
    append_history(tx, row.seq, &[&entry]).await?;
    key_order::settle(st, tx, &row.queue, row.key.as_deref(), row.seq).await?;
    cx.changes += 1;
    row::message_with_history(tx, &row).await
}

/// Kill `id` ([`rules::kill`]).
pub async fn kill<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    id: &MessageId,
    reason: Option<String>,
    now: Timestamp,
) -> Result<Message, E> {
    let mut row = locked_row(st, tx, id).await?;
    let before = row.life.state;
    let entry = rules::kill(&mut row.life, reason, now)?;
    write_life(st, tx, &row, before, None).await?;
    append_history(tx, row.seq, &[&entry]).await?;
    key_order::settle(st, tx, &row.queue, row.key.as_deref(), row.seq).await?;
    cx.changes += 1;
    row::message_with_history(tx, &row).await
}

/// Delete `id` and its idempotency record; the message as it was.
pub async fn delete<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    id: &MessageId,
) -> Result<Message, E> {
    let row = locked_row(st, tx, id).await?;
    let message = row::message_with_history(tx, &row).await?;
    execute(tx, "DELETE FROM messages WHERE seq = ?", args![row.seq]).await?;
    execute(
        tx,
        "DELETE FROM history WHERE message_seq = ?",
        args![row.seq],
    )
    .await?;
    if row.life.state == State::Ready {
        ready_delete(tx, &[row.seq]).await?;
    }
    if let Some(ikey) = &row.idempotency_key {
        execute(
            tx,
            "DELETE FROM idempotency WHERE queue = ? AND ikey = ? AND message_id = ?",
            args![row.queue.as_str(), ikey.as_str(), row.id.as_str()],
        )
        .await?;
    }
    key_order::settle(st, tx, &row.queue, row.key.as_deref(), row.seq).await?;
    cx.changes += 1;
    Ok(message)
}

/// Forget idempotency keys of `queue`; how many records there were.
pub async fn forget_idempotency_keys<C: Db>(
    tx: &mut C,
    queue: &str,
    keys: &[String],
) -> Result<u64, E> {
    let mut n = 0;
    for chunk in keys.chunks(CHUNK) {
        let sql = format!(
            "DELETE FROM idempotency WHERE queue = ? AND ikey IN ({})",
            marks(chunk.len())
        );
        let mut p: Vec<Value> = vec![queue.into()];
        p.extend(chunk.iter().map(|k| Value::from(k.as_str())));
        n += execute(tx, &sql, Params::Positional(p)).await?;
    }
    Ok(n)
}

// ---- the scheduler and the janitor ----

/// The queues that have scheduled messages, each with its earliest due time (one group of
/// `ix_scheduled` per queue).
pub async fn scheduled_queues<C: Db>(c: &mut C) -> Result<Vec<(String, i64)>, E> {
    let rows = query(
        c,
        "SELECT sched_queue, MIN(sched_due) FROM messages WHERE sched_queue IS NOT NULL \
         GROUP BY sched_queue",
        Params::Empty,
    )
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let due: Option<i64> = col(r, 1)?;
        if let Some(due) = due {
            out.push((col(r, 0)?, due));
        }
    }
    Ok(out)
}

/// The earliest lease expiry, ms (one seek on `ix_leased`).
pub async fn next_lease_expiry<C: Db>(c: &mut C) -> Result<Option<i64>, E> {
    let r = query_one(c, "SELECT MIN(lease_due) FROM messages", Params::Empty).await?;
    col(&r, 0)
}

/// Promote the scheduled messages due at `t`, at most `limit`, shared fairly among the
/// queues that have some (as the PostgreSQL store's `promote`): every due queue gets an
/// equal share, what one leaves goes to the others; with more due queues than the limit,
/// one each and the start rotates from tick to tick. Each queue's share is taken with
/// `SKIP LOCKED` and written by primary key, so two ticks at once promote disjoint
/// messages. Returns the messages made ready per queue.
async fn promote<C: Db>(
    st: &Inner,
    tx: &mut C,
    t: i64,
    limit: usize,
) -> Result<Vec<(String, usize)>, E> {
    let mut due: Vec<(i64, String)> = scheduled_queues(tx)
        .await?
        .into_iter()
        .filter(|(_, d)| *d <= t)
        .map(|(q, d)| (d, q))
        .collect();
    due.sort();
    let mut queues: Vec<String> = due.into_iter().map(|(_, q)| q).collect();
    if queues.len() > limit {
        let start = st.rotation.load(AtomicOrdering::Relaxed) % queues.len();
        queues.rotate_left(start);
        st.rotation.store(start + limit, AtomicOrdering::Relaxed);
    }
    let mut left = limit;
    let mut per_queue: Vec<(String, usize)> = Vec::new();
    let mut active = queues;
    while left > 0 && !active.is_empty() {
        let mut saturated = Vec::new();
        let count = active.len();
        for (i, queue) in active.into_iter().enumerate() {
            if left == 0 {
                break;
            }
            let share = left.div_ceil(count - i);
            let rows = query(
                tx,
                "SELECT seq FROM messages WHERE sched_queue = ? AND sched_due <= ? \
                 ORDER BY sched_due LIMIT ? FOR UPDATE SKIP LOCKED",
                args![queue.as_str(), t, share as i64],
            )
            .await?;
            let seqs: Vec<i64> = rows.iter().map(|r| col(r, 0)).collect::<Result<_, _>>()?;
            for chunk in seqs.chunks(CHUNK) {
                let sql = format!(
                    "UPDATE messages FORCE INDEX (PRIMARY) SET state = 1, updated_at = ? \
                     WHERE seq IN ({})",
                    marks(chunk.len())
                );
                let mut p: Vec<Value> = vec![t.into()];
                p.extend(chunk.iter().map(|s| Value::from(*s)));
                execute(tx, &sql, Params::Positional(p)).await?;
            }
            ready_insert(st, tx, &seqs).await?;
            let n = seqs.len();
            left -= n.min(left);
            if n > 0 {
                match per_queue.iter_mut().find(|(q, _)| *q == queue) {
                    Some((_, total)) => *total += n,
                    None => per_queue.push((queue.clone(), n)),
                }
            }
            if n == share {
                saturated.push(queue);
            }
        }
        active = saturated;
    }
    Ok(per_queue)
}

/// The scheduler's step (see [`redrive_storage::Store::tick`]).
pub async fn tick<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    now: Option<Timestamp>,
) -> Result<TickOutcome, E> {
    let now = resolve_now(tx, now).await?;
    let t = now.as_millis();
    // Expired leases first: their keys' lock points are taken before their rows (the order
    // every writer follows), and nothing is held yet that a settle could be waiting for.
    let candidates = query(
        tx,
        "SELECT seq, queue, msg_key FROM messages WHERE lease_due <= ? ORDER BY lease_due LIMIT ?",
        args![t, TICK_EXPIRE_LIMIT],
    )
    .await?;
    let mut more = candidates.len() as i64 >= TICK_EXPIRE_LIMIT;
    let mut ready_queues: Vec<String> = Vec::new();
    let mut expired = Vec::with_capacity(candidates.len());
    if !candidates.is_empty() {
        let mut seqs = Vec::with_capacity(candidates.len());
        let mut keys = Vec::new();
        for r in &candidates {
            seqs.push(col::<i64>(r, 0)?);
            keys.push((col::<String>(r, 1)?, col::<Option<String>>(r, 2)?));
        }
        key_order::lock_keys(st, tx, keys).await?;
        let sql = format!(
            concat!(
                "SELECT ",
                columns!(),
                " FROM messages FORCE INDEX (PRIMARY) WHERE seq IN ({}) AND lease_due <= ? \
                 ORDER BY lease_due \
                 FOR UPDATE SKIP LOCKED"
            ),
            marks(seqs.len())
        );
        let mut p: Vec<Value> = seqs.iter().map(|s| Value::from(*s)).collect();
        p.push(t.into());
        let rows = query(tx, &sql, Params::Positional(p)).await?;
        let lease_expired = Failure::lease_expired();
        for r in &rows {
            let row = row::from_my(r)?;
            let end = AttemptEnd::lease(LeaseEnd::Expired);
            let outcome = fail_attempt(st, tx, cx, row, &lease_expired, None, end, now).await?;
            if outcome.message.state == State::Ready
                && !ready_queues.contains(&outcome.message.queue)
            {
                ready_queues.push(outcome.message.queue.clone());
            }
            expired.push(outcome);
        }
    }
    // Then the due scheduled messages: taken `SKIP LOCKED`, waiting for nothing.
    let promoted = promote(st, tx, t, TICK_PROMOTE_LIMIT).await?;
    for (q, n) in promoted {
        cx.changes += n as u64;
        if !ready_queues.contains(&q) {
            ready_queues.push(q);
        }
    }
    let scheduled = scheduled_queues(tx).await?;
    more |= scheduled.iter().any(|(_, d)| *d <= t);
    let next = if more {
        Some(t)
    } else {
        let earliest = scheduled.iter().map(|(_, d)| *d).min();
        match (earliest, next_lease_expiry(tx).await?) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    };
    cx.wake = None;
    cx.exact_wake = Some(next);
    Ok(TickOutcome {
        ready_queues,
        expired,
        next_wake: next.map(Timestamp::from_millis),
        more,
    })
}

/// Delete done messages finished before `now - done_retention_ms` (at most [`PURGE_LIMIT`],
/// by primary key; their history goes with them), expired idempotency records and key
/// heads with nothing left (bounded, by primary key); a purged message's live key keeps a
/// tombstone.
pub async fn purge<C: Db>(
    tx: &mut C,
    cx: &mut Ctx,
    now: Option<Timestamp>,
    done_retention_ms: u64,
) -> Result<PurgeOutcome, E> {
    let now = resolve_now(tx, now).await?;
    let cutoff = now
        .as_millis()
        .saturating_sub(done_retention_ms.min(i64::MAX as u64) as i64);
    let rows = query(
        tx,
        "SELECT seq, queue, idempotency_key, id, created_at, updated_at, finished_at, attempts, \
         priority, msg_key, headers FROM messages WHERE done_at < ? ORDER BY done_at LIMIT ? \
         FOR UPDATE SKIP LOCKED",
        args![cutoff, PURGE_LIMIT as i64],
    )
    .await?;
    let mut more = rows.len() >= PURGE_LIMIT;
    let mut per_queue: Vec<(String, u64)> = Vec::new();
    let mut seqs = Vec::with_capacity(rows.len());
    for r in &rows {
        seqs.push(col::<i64>(r, 0)?);
        let queue: String = col(r, 1)?;
        let ikey: Option<String> = col(r, 2)?;
        if let Some(ikey) = ikey {
            // The key outlives the message (SPEC §4): its record keeps what a replay answers.
            let headers: Option<String> = col(r, 10)?;
            let priority: i64 = col(r, 8)?;
            let attempts: i64 = col(r, 7)?;
            let tombstone = redrive_storage::stored::Tombstone {
                created_at: col(r, 4)?,
                updated_at: col(r, 5)?,
                finished_at: col(r, 6)?,
                attempts: attempts.clamp(0, i64::from(u32::MAX)) as u32,
                priority: priority.clamp(0, 255) as u8,
                key: col(r, 9)?,
                headers: match headers {
                    Some(h) => serde_json::from_str(&h)?,
                    None => BTreeMap::new(),
                },
            };
            let id: String = col(r, 3)?;
            execute(
                tx,
                "UPDATE idempotency SET tombstone = ? WHERE queue = ? AND ikey = ? AND message_id = ?",
                args![
                    serde_json::to_string(&tombstone)?,
                    queue.as_str(),
                    ikey.as_str(),
                    id.as_str()
                ],
            )
            .await?;
        }
        match per_queue.iter_mut().find(|(q, _)| *q == queue) {
            Some((_, c)) => *c += 1,
            None => per_queue.push((queue, 1)),
        }
    }
    for chunk in seqs.chunks(CHUNK) {
        let v = key_rows(chunk.len());
        execute(
            tx,
            &format!("DELETE m FROM messages m JOIN ({v}) v ON m.seq = v.k"),
            list(chunk),
        )
        .await?;
        execute(
            tx,
            &format!("DELETE h FROM history h JOIN ({v}) v ON h.message_seq = v.k"),
            list(chunk),
        )
        .await?;
    }
    cx.changes += seqs.len() as u64;
    // Expired idempotency records: picked by the expiry index, deleted by primary key.
    let expired = query(
        tx,
        "SELECT queue, ikey FROM idempotency WHERE expires_at <= ? ORDER BY expires_at LIMIT ? \
         FOR UPDATE SKIP LOCKED",
        args![now.as_millis(), PURGE_RECORDS_LIMIT as i64],
    )
    .await?;
    more |= expired.len() >= PURGE_RECORDS_LIMIT;
    let keys: Vec<(String, String)> = expired
        .iter()
        .map(|r| Ok((col(r, 0)?, col(r, 1)?)))
        .collect::<Result<_, E>>()?;
    let idempotency_deleted = delete_pairs(tx, "idempotency", "ikey", &keys).await?;
    // Keys with nothing left in their order; one a transition holds is left for next time.
    let heads = query(
        tx,
        "SELECT queue, msg_key FROM key_heads WHERE head_seq IS NULL LIMIT ? FOR UPDATE SKIP LOCKED",
        args![PURGE_RECORDS_LIMIT as i64],
    )
    .await?;
    let heads: Vec<(String, String)> = heads
        .iter()
        .map(|r| Ok((col(r, 0)?, col(r, 1)?)))
        .collect::<Result<_, E>>()?;
    delete_pairs(tx, "key_heads", "msg_key", &heads).await?;
    Ok(PurgeOutcome {
        done_deleted: per_queue,
        idempotency_deleted,
        more,
    })
}

/// Delete rows of `table` by their primary key `(queue, <second>)`; how many.
async fn delete_pairs<C: Db>(
    tx: &mut C,
    table: &str,
    second: &str,
    keys: &[(String, String)],
) -> Result<u64, E> {
    let mut n = 0;
    for chunk in keys.chunks(CHUNK) {
        let pairs = vec!["(?, ?)"; chunk.len()].join(", ");
        let mut p: Vec<Value> = Vec::with_capacity(chunk.len() * 2);
        for (q, k) in chunk {
            p.push(q.as_str().into());
            p.push(k.as_str().into());
        }
        n += execute(
            tx,
            &format!("DELETE FROM {table} WHERE (queue, {second}) IN ({pairs})"),
            Params::Positional(p),
        )
        .await?;
    }
    Ok(n)
}

// ---- set-based ack and nack ----

/// Ack `items`: set-based where it can ([`ack_set`]), one by one ([`ack`]) the items with
/// wait notes; answers in item order. The caller has locked their rows and keys
/// (`group_commit::lock_work`).
pub async fn ack_many<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    items: &[Ack],
    now: Timestamp,
) -> Result<Vec<Result<Acked, StoreError>>, E> {
    redrive_storage::settle_many!(
        E,
        items,
        |a| !a.waited.is_empty(),
        |refs| ack_set(st, &mut *tx, &mut *cx, &refs, now),
        |a| ack(st, &mut *tx, &mut *cx, a, now)
    )
}

/// Nack `items` as [`ack_many`] acks them.
pub async fn nack_many<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    items: &[Nack],
    now: Timestamp,
) -> Result<Vec<Result<FailureOutcome, StoreError>>, E> {
    redrive_storage::settle_many!(
        E,
        items,
        |n| !n.waited.is_empty(),
        |refs| nack_set(st, &mut *tx, &mut *cx, &refs, now),
        |n| nack(st, &mut *tx, &mut *cx, n, now)
    )
}

/// Ack `items` set-based: their rows read (locked) in one statement, each item checked and
/// changed as [`ack`] does ([`settle::acks`]), the rows written in one statement and their
/// history in two.
async fn ack_set<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    items: &[&Ack],
    now: Timestamp,
) -> Result<Vec<Result<Acked, StoreError>>, E> {
    let ids: Vec<String> = items.iter().map(|a| a.lease.id.to_string()).collect();
    let mut rows = locked_rows(tx, &ids).await?;
    let s = settle::acks(&mut rows, items, now);
    write_settled(st, tx, cx, &rows, &s).await?;
    Ok(s.answers)
}

/// Nack `items` set-based, as [`ack_set`]: each item is checked and failed through
/// [`rules::fail`] as [`nack`] does ([`settle::nacks`]).
async fn nack_set<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    items: &[&Nack],
    now: Timestamp,
) -> Result<Vec<Result<FailureOutcome, StoreError>>, E> {
    let ids: Vec<String> = items.iter().map(|n| n.lease.id.to_string()).collect();
    let mut rows = locked_rows(tx, &ids).await?;
    let s = st.with_rng(|rng| settle::nacks(&mut rows, items, &st.catalog, rng, now))?;
    write_settled(st, tx, cx, &rows, &s).await?;
    Ok(s.answers)
}

/// Lock the rows of `ids` (in `seq` order) and read them; by id.
async fn locked_rows<C: Db>(tx: &mut C, ids: &[String]) -> Result<HashMap<String, Row>, E> {
    let mut out = HashMap::with_capacity(ids.len());
    for chunk in ids.chunks(CHUNK) {
        let sql = format!(
            concat!(
                "SELECT ",
                columns!(),
                " FROM messages FORCE INDEX (ux_id) WHERE id IN ({}) ORDER BY seq FOR UPDATE"
            ),
            marks(chunk.len())
        );
        for r in &query(tx, &sql, list(chunk)).await? {
            let row = row::from_my(r)?;
            out.insert(row.id.clone(), row);
        }
    }
    Ok(out)
}

/// Rows of one set-based lifecycle write.
const LIVES_CHUNK: usize = 200;

/// Write what a set-based ack or nack decided (`s`, over `rows`): the rows' lifecycles in one
/// statement per [`LIVES_CHUNK`] rows (an `UPDATE` joined to the new values), the `ready`
/// rows of those now ready (every row written held a live lease, so none was in `ready`),
/// their history entries, then per-key ordering and wake-ups.
async fn write_settled<C: Db, T>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    rows: &HashMap<String, Row>,
    s: &settle::Settlement<T>,
) -> Result<(), E> {
    let changed: Vec<&Row> = s.written.iter().filter_map(|id| rows.get(id)).collect();
    for (c, chunk) in changed.chunks(LIVES_CHUNK).enumerate() {
        let one = "SELECT ? AS seq, ? AS state, ? AS due_at, ? AS attempts, ? AS budget_base, \
                   ? AS uncounted, ? AS released, ? AS prev_delay_ms, ? AS updated_at, \
                   ? AS window_start, ? AS leased_at, ? AS lease_expires_at, ? AS lease_end, \
                   ? AS finished_at, ? AS dead_reason, ? AS error_class, ? AS last_error";
        let values = vec![one; chunk.len()].join(" UNION ALL ");
        let sql = format!(
            "UPDATE messages m JOIN ({values}) v ON m.seq = v.seq SET m.state = v.state, \
             m.due_at = v.due_at, m.attempts = v.attempts, m.budget_base = v.budget_base, \
             m.uncounted = v.uncounted, m.released = v.released, \
             m.prev_delay_ms = v.prev_delay_ms, m.updated_at = v.updated_at, \
             m.window_start = v.window_start, m.leased_at = v.leased_at, \
             m.lease_expires_at = v.lease_expires_at, m.lease_end = v.lease_end, \
             m.finished_at = v.finished_at, m.dead_reason = v.dead_reason, \
             m.error_class = COALESCE(v.error_class, m.error_class), \
             m.last_error = COALESCE(v.last_error, m.last_error)"
        );
        let mut p: Vec<Value> = Vec::with_capacity(chunk.len() * 17);
        for (i, r) in chunk.iter().enumerate() {
            let life = &r.life;
            let (class, last_error) = match s.errors.get(c * LIVES_CHUNK + i) {
                Some((c, e)) => (Some(c.clone()), Some(e.clone())),
                None => (None, None),
            };
            p.extend([
                r.seq.into(),
                i64::from(life.state.code()).into(),
                ms(life.due_at).into(),
                int(life.attempts).into(),
                int(life.budget_base).into(),
                int(life.uncounted).into(),
                int(life.released).into(),
                delay_ms(life.prev_delay_ms).into(),
                life.updated_at.as_millis().into(),
                ms(life.window_start).into(),
                ms(life.leased_at).into(),
                ms(life.lease_expires_at).into(),
                life.lease_end.map(LeaseEnd::as_str).into(),
                ms(life.finished_at).into(),
                life.dead_reason.map(|d| d.as_str()).into(),
                class.into(),
                last_error.into(),
            ]);
        }
        execute(tx, &sql, Params::Positional(p)).await?;
    }
    let now_ready: Vec<i64> = changed
        .iter()
        .filter(|r| r.life.state == State::Ready)
        .map(|r| r.seq)
        .collect();
    ready_insert(st, tx, &now_ready).await?;
    let entries: Vec<(i64, &HistoryEntry)> = s.entries.iter().map(|(q, e)| (*q, e)).collect();
    append_histories(tx, &entries).await?;
    for r in changed {
        key_order::settle(st, tx, &r.queue, r.key.as_deref(), r.seq).await?;
        cx.changes += 1;
        cx.wake_if_scheduled(&r.life);
    }
    Ok(())
}

/// Append history entries `(seq, entry)`, in order (several for one seq get consecutive
/// numbers): one statement reads each message's last number, one inserts them all. Every
/// message's row is locked by the caller.
async fn append_histories<C: Db>(tx: &mut C, entries: &[(i64, &HistoryEntry)]) -> Result<(), E> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut seqs: Vec<i64> = entries.iter().map(|(s, _)| *s).collect();
    seqs.sort_unstable();
    seqs.dedup();
    let mut last: HashMap<i64, i64> = HashMap::with_capacity(seqs.len());
    for chunk in seqs.chunks(CHUNK) {
        let sql = format!(
            "SELECT message_seq, MAX(n) FROM history FORCE INDEX (PRIMARY) \
             WHERE message_seq IN ({}) GROUP BY message_seq",
            marks(chunk.len())
        );
        for r in &query(tx, &sql, list(chunk)).await? {
            last.insert(col(r, 0)?, col(r, 1)?);
        }
    }
    for chunk in entries.chunks(CHUNK) {
        let mut p: Vec<Value> = Vec::with_capacity(chunk.len() * 3);
        for (seq, e) in chunk {
            let n = last.entry(*seq).or_insert(0);
            *n += 1;
            p.extend([(*seq).into(), (*n).into(), serde_json::to_string(e)?.into()]);
        }
        let values = vec!["(?, ?, ?)"; chunk.len()].join(", ");
        execute(
            tx,
            &format!("INSERT INTO history (message_seq, n, entry) VALUES {values}"),
            Params::Positional(p),
        )
        .await?;
    }
    Ok(())
}
