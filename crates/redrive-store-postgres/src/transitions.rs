//! The message state machine's transitions, each run inside one transaction.
//!
//! Every transition of one message locks its row (`SELECT … FOR UPDATE`), reads its
//! [`Lifecycle`], lets `redrive_storage::rules` check and change it, and writes it back in
//! one `UPDATE` ([`write_life`]), appending history entries as rows of `history`. Nothing
//! here decides a state change itself: a refusal is the rules' error, answered before
//! anything is written (so a refused item of a batch leaves the transaction usable for
//! the others). Per-key ordering is kept true after each of them by `key_order::settle`.
//!
//! Batch work is set-based where the rules allow it: a claim is one statement
//! ([`LEASE_SQL`]), a promotion one statement per queue, a purge one statement.

use crate::error::E;
use crate::key_order;
use crate::row::{self, columns, delay_ms, history_column, int, ms, where_id, where_ids, Row};
use crate::sql::{execute, query, query_one, query_opt, resolve_now};
use crate::sql_publish;
use crate::{Ctx, Inner};
use deadpool_postgres::Transaction;
use redrive_core::{
    AttemptResponse, Failure, HistoryEntry, HistoryEvent, Message, MessageId, NewMessage, State,
    Timestamp, Waited,
};
use redrive_storage::rules::{self, AttemptEnd, FailedAttempt, KeyMode, LeaseEnd, Lifecycle};
use redrive_storage::{
    settle, Ack, AckEvent, Acked, FailureOutcome, LeaseRef, LeaseRequest, Leased, Nack, Published,
    PurgeOutcome, Release, Released, Returned, Settled, StoreError, TickOutcome,
};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering as AtomicOrdering;

/// At most this many expired leases are failed in one tick.
const TICK_EXPIRE_LIMIT: i64 = 1_000;
/// At most this many scheduled messages become ready in one tick (shared among queues).
const TICK_PROMOTE_LIMIT: usize = 10_000;
/// At most this many done messages are deleted by one purge.
const PURGE_LIMIT: i64 = 10_000;

/// The claim: one statement. The inner `SELECT` picks at most `$2` leasable rows of the
/// queue in lease order from `ix_ready` and locks them, skipping rows another transaction
/// holds (`FOR UPDATE SKIP LOCKED`); the window over exactly those rows keeps the first
/// one and those that fit `$6` bytes of stored JSON (all when `$6` is NULL). `ARRAY(…)`
/// makes that an init-plan run once, so the `UPDATE` can change no row the pick did not
/// lock and never more than `$2` (the pg-boss / Oban pitfall of a CTE re-evaluated per
/// row). `SET` sees the row as it was, so the token's attempt number is the new one. A
/// leased head of a key waits (`key_blocked` true), so nothing else of its key is leasable.
pub const LEASE_SQL: &str = concat!(
    "WITH clock AS (SELECT coalesce($4::bigint, \
       (extract(epoch from clock_timestamp()) * 1000)::bigint) AS t) \
     UPDATE messages SET state = 2, attempts = attempts + 1, \
     lease_token = (attempts + 1)::text || '-' || $3, leased_at = clock.t, \
     lease_expires_at = clock.t + $5::bigint, lease_end = NULL, updated_at = clock.t, \
     key_blocked = CASE WHEN key_blocked IS NULL THEN NULL ELSE true END \
     FROM clock \
     WHERE seq = ANY(ARRAY( \
       SELECT f.seq FROM ( \
         SELECT c.seq, row_number() OVER w AS rn, sum(c.size) OVER w AS used FROM ( \
           SELECT seq, priority, due_at, octet_length(payload) + coalesce(octet_length(headers), 0) \
             + coalesce(octet_length(last_error), 0) + coalesce(octet_length(msg_key), 0) AS size \
           FROM messages WHERE queue = $1 AND state = 1 AND key_blocked IS NOT TRUE \
           ORDER BY priority DESC, due_at, seq LIMIT $2 FOR UPDATE SKIP LOCKED \
         ) c WINDOW w AS (ORDER BY c.priority DESC, c.due_at, c.seq) \
       ) f WHERE f.rn = 1 OR $6::bigint IS NULL OR f.used <= $6 \
     )) RETURNING ",
    columns!()
);

/// A lease's or a tick's commit: not waited for (see [`lease`]).
const ASYNC_COMMIT: &str = "SET LOCAL synchronous_commit = off";
/// A lease's transaction, begun and set in one message. (The claim's generic plan,
/// made once per connection, was tried: its `BIND` took a tenth of the time, its execution
/// twice as long, 2.4 s against 1.9 s in all at 8 × 10.)
const ASYNC_BEGIN: &str = "BEGIN; SET LOCAL synchronous_commit = off";

const ROW_FOR_UPDATE: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM messages",
    where_id!(),
    " FOR UPDATE"
);
const FULL_MESSAGE: &str = concat!(
    "SELECT ",
    columns!(),
    ", ",
    history_column!(),
    " FROM messages WHERE seq = $1"
);

/// Every lifecycle column, and the last error when `$16`/`$17` are given.
const WRITE_LIFE: &str = "UPDATE messages SET state = $2, due_at = $3, attempts = $4, budget_base = $5, \
     uncounted = $6, released = $7, prev_delay_ms = $8, updated_at = $9, window_start = $10, \
     leased_at = $11, lease_expires_at = $12, lease_end = $13, finished_at = $14, dead_reason = $15, \
     error_class = coalesce($16, error_class), last_error = coalesce($17, last_error) WHERE seq = $1";

/// The message `id`, its row locked for this transaction.
async fn locked_row(tx: &Transaction<'_>, id: &MessageId) -> Result<Row, E> {
    match query_opt(tx, ROW_FOR_UPDATE, &[&id.to_string()]).await? {
        Some(r) => row::from_pg(&r),
        None => Err(E::Logic(StoreError::NotFound(id.to_string()))),
    }
}

/// The message at `seq` with its history.
pub async fn full_message(tx: &Transaction<'_>, seq: i64) -> Result<Message, E> {
    let r = query_one(tx, FULL_MESSAGE, &[&seq]).await?;
    row::message_from_pg(&r)
}

/// Write `life` (and a new last error, when given) to the row `seq`.
async fn write_life(
    tx: &Transaction<'_>,
    seq: i64,
    life: &Lifecycle,
    error: Option<(&str, &str)>,
) -> Result<(), E> {
    let state = i16::from(life.state.code());
    let (due, attempts, base, uncounted, released) = (
        ms(life.due_at),
        int(life.attempts),
        int(life.budget_base),
        int(life.uncounted),
        int(life.released),
    );
    let prev = delay_ms(life.prev_delay_ms);
    let updated = life.updated_at.as_millis();
    let (window, leased_at, expires, finished) = (
        ms(life.window_start),
        ms(life.leased_at),
        ms(life.lease_expires_at),
        ms(life.finished_at),
    );
    let lease_end = life.lease_end.map(LeaseEnd::as_str);
    let dead = life.dead_reason.map(|r| r.as_str());
    let (class, last_error) = match error {
        Some((c, e)) => (Some(c), Some(e)),
        None => (None, None),
    };
    execute(
        tx,
        WRITE_LIFE,
        &[
            &seq,
            &state,
            &due,
            &attempts,
            &base,
            &uncounted,
            &released,
            &prev,
            &updated,
            &window,
            &leased_at,
            &expires,
            &lease_end,
            &finished,
            &dead,
            &class,
            &last_error,
        ],
    )
    .await?;
    Ok(())
}

/// Append `entry` to the history of the message at `seq` (its row is locked).
pub async fn append_history(tx: &Transaction<'_>, seq: i64, entry: &HistoryEntry) -> Result<(), E> {
    let json = serde_json::to_string(entry)?;
    execute(
        tx,
        "INSERT INTO history (message_seq, n, entry) \
         SELECT $1, coalesce(max(n), 0) + 1, $2::text::jsonb FROM history WHERE message_seq = $1",
        &[&seq, &json],
    )
    .await?;
    Ok(())
}

/// [`write_life`] and [`append_history`] of one transition, pipelined: both statements
/// are sent before either answer is awaited (one round trip instead of two).
async fn write_life_and_history(
    tx: &Transaction<'_>,
    seq: i64,
    life: &Lifecycle,
    error: Option<(&str, &str)>,
    entry: &HistoryEntry,
) -> Result<(), E> {
    let (w, h) = tokio::join!(
        write_life(tx, seq, life, error),
        append_history(tx, seq, entry)
    );
    w.and(h)
}

/// Note a push message's waits before its attempt `attempt` ([`redrive_core::note_wait`]
/// updates the episode's entry in place, or appends one): the entries it changed are
/// rewritten, the ones it added appended.
async fn note_waits(
    tx: &Transaction<'_>,
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
        "SELECT n, entry::text FROM history WHERE message_seq = $1 ORDER BY n",
        &[&seq],
    )
    .await?;
    let mut old: Vec<(i32, HistoryEntry)> = Vec::with_capacity(rows.len());
    for r in &rows {
        let text: String = r.try_get(1)?;
        old.push((r.try_get(0)?, serde_json::from_str(&text)?));
    }
    let mut history: Vec<HistoryEntry> = old.iter().map(|(_, h)| h.clone()).collect();
    for wait in waits {
        redrive_core::note_wait(&mut history, attempt, *wait, now);
    }
    let mut next = old.last().map_or(0, |(n, _)| *n) + 1;
    for (i, entry) in history.iter().enumerate() {
        match old.get(i) {
            Some((n, before)) if before != entry => {
                let json = serde_json::to_string(entry)?;
                execute(
                    tx,
                    "UPDATE history SET entry = $3::text::jsonb WHERE message_seq = $1 AND n = $2",
                    &[&seq, n, &json],
                )
                .await?;
            }
            Some(_) => {}
            None => {
                let json = serde_json::to_string(entry)?;
                execute(
                    tx,
                    "INSERT INTO history (message_seq, n, entry) VALUES ($1, $2, $3::text::jsonb)",
                    &[&seq, &next, &json],
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
async fn leased_row(tx: &Transaction<'_>, lease: &LeaseRef, now: Timestamp) -> Result<Row, E> {
    let row = locked_row(tx, &lease.id).await?;
    check_lease(&row, &lease.token, now)?;
    Ok(row)
}

// ---- publish ----

/// Publish `items`, all or nothing (see [`redrive_storage::Store::publish`]).
pub async fn publish(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    items: &[NewMessage],
    now: Option<Timestamp>,
) -> Result<Vec<Published>, E> {
    let now = resolve_now(tx, now).await?;
    publish_many(st, tx, cx, items, now).await
}

// ---- lease ----

/// Lease up to `req.max` ready messages of `req.queue` ([`LEASE_SQL`]) on `client`, in one
/// round trip: `BEGIN`, the setting, the claim and `COMMIT` are pipelined, and the claim
/// reads the database's clock itself when `now` is `None` (no round trip for it). The claim
/// must be prepared before: given as text, it is prepared in a round trip of its own and
/// its execution goes out after the `COMMIT`, outside the transaction (test
/// `a_claim_runs_in_its_asynchronous_transaction`). Not retried on a lost connection: the
/// claim may have committed, and a second one would charge an attempt nobody was handed.
pub async fn lease(
    st: &Inner,
    client: &deadpool_postgres::Client,
    cx: &mut Ctx,
    req: &LeaseRequest,
    now: Option<Timestamp>,
) -> Result<Vec<Leased>, E> {
    // Nobody is promised a lease's durability (SPEC §4 names publish, ack, nack and operator
    // actions): a lease lost in a crash leaves its message ready, delivered again with the
    // same attempt number, like the SQLite store's unsynced leases.
    let max = i64::from(req.max.max(1));
    let budget: Option<i64> = match req.max_bytes {
        Some(b) if req.max > 1 => Some(b.min(i64::MAX as u64) as i64),
        _ => None,
    };
    let lease_ms = req.lease_ms.min(i64::MAX as u64) as i64;
    let nonce = st.nonce();
    let t = now.map(Timestamp::as_millis);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
        [&req.queue, &max, &nonce, &t, &lease_ms, &budget];
    let claim = client.prepare_cached(LEASE_SQL).await?;
    // Each call sends its messages when first polled, in this order.
    let (begin, rows, commit) = tokio::join!(
        client.batch_execute(ASYNC_BEGIN),
        client.query(&claim, &params),
        client.batch_execute("COMMIT")
    );
    begin?;
    let rows = rows?;
    commit?;
    let mut rows: Vec<Row> = rows.iter().map(row::from_pg).collect::<Result<_, _>>()?;
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let (Some(at), Some(expires)) = (first.life.leased_at, first.life.lease_expires_at) else {
        return Err(E::Db(StoreError::Backend(
            "a leased row without its lease times".to_owned(),
        )));
    };
    // RETURNING has no order: restore the lease order.
    rows.sort_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then(a.life.due_at.cmp(&b.life.due_at))
            .then(a.seq.cmp(&b.seq))
    });
    let policy = &st.catalog.get(&req.queue).retry;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let lateness_ms = at.as_millis() - row.life.due_at.unwrap_or(at).as_millis();
        out.push(Leased {
            message: row.to_message(None, None)?,
            attempt: row.life.attempts,
            max_attempts: row.life.max_attempts(policy),
            token: row.lease_token.clone().unwrap_or_default(),
            expires_at: expires,
            lateness_ms,
        });
    }
    cx.changes += out.len() as u64;
    cx.wake_at(expires.as_millis());
    Ok(out)
}

// ---- ack, nack, release, returned, extend ----

/// Ack one lease (see [`redrive_storage::Store::ack`]).
pub async fn ack(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    ack: &Ack,
    now: Timestamp,
) -> Result<Acked, E> {
    let lease = &ack.lease;
    let mut row = locked_row(tx, &lease.id).await?;
    if row.life.state == State::Done && row.lease_token.as_deref() == Some(lease.token.as_str()) {
        // A retried ack of the lease that made it done.
        return Ok(Acked {
            message: row.to_message(None, None)?,
            repeated: true,
        });
    }
    check_lease(&row, &lease.token, now)?;
    note_waits(tx, row.seq, row.life.attempts, &ack.waited, now).await?;
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
    write_life_and_history(tx, row.seq, &row.life, None, &entry).await?;
    key_order::settle(st, tx, &row.queue, row.key.as_deref(), row.seq).await?;
    cx.changes += 1;
    Ok(Acked {
        message: row.to_message(None, None)?,
        repeated: false,
    })
}

/// Nack one lease: the policy decides.
pub async fn nack(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    nack: &Nack,
    now: Timestamp,
) -> Result<FailureOutcome, E> {
    let row = leased_row(tx, &nack.lease, now).await?;
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
async fn fail_attempt(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    mut row: Row,
    failure: &Failure,
    response: Option<&AttemptResponse>,
    end: AttemptEnd,
    now: Timestamp,
) -> Result<FailureOutcome, E> {
    let policy = &st.catalog.get(&row.queue).retry;
    let failed = st.with_rng(|rng| rules::fail(&mut row.life, policy, failure, end, now, rng));
    write_failed(st, tx, cx, row, failed, response).await
}

/// Write a failed attempt the rules applied to `row`.
async fn write_failed(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    mut row: Row,
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
    write_life_and_history(
        tx,
        row.seq,
        &row.life,
        Some((class.as_str(), &last_error)),
        &entry,
    )
    .await?;
    row.last_error = Some(last_error);
    key_order::settle(st, tx, &row.queue, row.key.as_deref(), row.seq).await?;
    cx.changes += 1;
    cx.moved(&row.queue, &row.life);
    let message = row.to_message(None, None)?;
    Ok(FailureOutcome {
        dead_reason: message.dead_reason,
        message,
        class,
        retry_delay_ms,
    })
}

/// Hand a lease back unattempted ([`rules::release`]).
pub async fn release(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    release: &Release,
    now: Timestamp,
) -> Result<Released, E> {
    let mut row = leased_row(tx, &release.lease, now).await?;
    // The attempt it waits to make is the one this lease counted (taken back below).
    note_waits(tx, row.seq, row.life.attempts, &release.waited, now).await?;
    let policy = &st.catalog.get(&row.queue).retry;
    match st.with_rng(|rng| rules::release(&mut row.life, policy, release, now, rng)) {
        Some(failed) => Ok(Released::Charged(
            write_failed(st, tx, cx, row, failed, None).await?,
        )),
        None => {
            write_life(tx, row.seq, &row.life, None).await?;
            key_order::settle(st, tx, &row.queue, row.key.as_deref(), row.seq).await?;
            cx.changes += 1;
            cx.moved(&row.queue, &row.life);
            Ok(Released::Uncharged(row.to_message(None, None)?))
        }
    }
}

/// A delivered attempt came back failed: apply it once (`None`: already applied).
pub async fn returned(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    ret: &Returned,
    now: Timestamp,
) -> Result<Option<FailureOutcome>, E> {
    let mut row = locked_row(tx, &ret.id).await?;
    if !rules::returned_applies(&row.life, ret.attempt) {
        return Ok(None);
    }
    let end = match row.life.state {
        State::Leased => {
            // The copy came back before the bridge settled its lease: that the copy exists
            // proves the broker took it, so the history says so before the failure.
            append_history(
                tx,
                row.seq,
                &HistoryEntry {
                    attempt: row.life.attempts,
                    at: now,
                    leased_at: row.life.leased_at,
                    event: HistoryEvent::Republished,
                    response: None,
                },
            )
            .await?;
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
pub async fn extend(
    tx: &Transaction<'_>,
    lease: &LeaseRef,
    by_ms: u64,
    now: Option<Timestamp>,
) -> Result<Timestamp, E> {
    let now = resolve_now(tx, now).await?;
    let mut row = leased_row(tx, lease, now).await?;
    let new = rules::extend(&mut row.life, by_ms, now);
    write_life(tx, row.seq, &row.life, None).await?;
    Ok(new)
}

// ---- operator actions ----

/// Redrive `id` ([`rules::redrive`]); with `payload`, replace its payload (an operator's
/// edit); `task` names the bulk task doing it.
pub async fn redrive(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    id: &MessageId,
    payload: Option<&serde_json::Value>,
    task: Option<&str>,
    now: Timestamp,
) -> Result<Message, E> {
    let mut row = locked_row(tx, id).await?;
    let entry = rules::redrive(&mut row.life, payload.is_some(), task, now)?;
    write_life(tx, row.seq, &row.life, None).await?;
    if let Some(p) = payload {
        execute(
            tx,
            "UPDATE messages SET payload = $2 WHERE seq = $1",
            &[&row.seq, &serde_json::to_string(p)?],
        )
        .await?;
    }
    append_history(tx, row.seq, &entry).await?;
    key_order::settle(st, tx, &row.queue, row.key.as_deref(), row.seq).await?;
    cx.changes += 1;
    cx.made_ready(&row.queue, 1);
    full_message(tx, row.seq).await
}

/// Kill `id` ([`rules::kill`]).
pub async fn kill(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    id: &MessageId,
    reason: Option<String>,
    now: Timestamp,
) -> Result<Message, E> {
    let mut row = locked_row(tx, id).await?;
    let entry = rules::kill(&mut row.life, reason, now)?;
    write_life_and_history(tx, row.seq, &row.life, None, &entry).await?;
    key_order::settle(st, tx, &row.queue, row.key.as_deref(), row.seq).await?;
    cx.changes += 1;
    full_message(tx, row.seq).await
}

/// Delete `id` and its idempotency record; the message as it was.
pub async fn delete(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    id: &MessageId,
) -> Result<Message, E> {
    let row = locked_row(tx, id).await?;
    let message = full_message(tx, row.seq).await?;
    // The row, its `message_ids` row and its history (no foreign key deletes it, schema v4)
    // in one statement, as the purge does.
    execute(
        tx,
        "WITH its_ids AS (DELETE FROM message_ids WHERE mi_seq = $1), \
         its_history AS (DELETE FROM history WHERE message_seq = $1) \
         DELETE FROM messages WHERE seq = $1",
        &[&row.seq],
    )
    .await?;
    if let Some(ikey) = &row.idempotency_key {
        execute(
            tx,
            "DELETE FROM idempotency WHERE queue = $1 AND ikey = $2 AND message_id = $3",
            &[&row.queue, ikey, &row.id],
        )
        .await?;
    }
    key_order::settle(st, tx, &row.queue, row.key.as_deref(), row.seq).await?;
    cx.changes += 1;
    Ok(message)
}

/// Forget idempotency keys of `queue`; how many records there were.
pub async fn forget_idempotency_keys(
    tx: &Transaction<'_>,
    queue: &str,
    keys: &[String],
) -> Result<u64, E> {
    execute(
        tx,
        "DELETE FROM idempotency WHERE queue = $1 AND ikey = ANY($2)",
        &[&queue, &keys],
    )
    .await
}

// ---- the scheduler and the janitor ----

/// The queues that have scheduled messages, each with its earliest due time: a skip scan
/// of `ix_scheduled` (one index seek per queue, whatever each queue's backlog).
pub async fn scheduled_queues<C: deadpool_postgres::GenericClient>(
    tx: &C,
) -> Result<Vec<(String, i64)>, E> {
    let rows = query(
        tx,
        "WITH RECURSIVE qs(queue) AS ( \
           (SELECT queue FROM messages WHERE state = 0 ORDER BY queue LIMIT 1) \
           UNION ALL \
           SELECT (SELECT m.queue FROM messages m WHERE m.state = 0 AND m.queue > qs.queue \
                   ORDER BY m.queue LIMIT 1) FROM qs WHERE qs.queue IS NOT NULL) \
         SELECT qs.queue, (SELECT m.due_at FROM messages m WHERE m.state = 0 AND m.queue = qs.queue \
                           ORDER BY m.due_at LIMIT 1) \
         FROM qs WHERE qs.queue IS NOT NULL",
        &[],
    )
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let due: Option<i64> = r.try_get(1)?;
        if let Some(due) = due {
            out.push((r.try_get(0)?, due));
        }
    }
    Ok(out)
}

/// The next wake-up: the earliest due time of `scheduled` (as [`scheduled_queues`] reads
/// it) or `lease_expiry` (as [`next_lease_expiry`] reads it), whichever comes first.
pub fn earliest_wake(scheduled: &[(String, i64)], lease_expiry: Option<i64>) -> Option<i64> {
    let due = scheduled.iter().map(|(_, d)| *d).min();
    [due, lease_expiry].into_iter().flatten().min()
}

/// The earliest lease expiry, ms (one seek on `ix_leased`).
pub async fn next_lease_expiry<C: deadpool_postgres::GenericClient>(
    c: &C,
) -> Result<Option<i64>, E> {
    let r = query_one(
        c,
        "SELECT min(lease_expires_at) FROM messages WHERE state = 2",
        &[],
    )
    .await?;
    Ok(r.try_get(0)?)
}

/// Promote the scheduled messages due at `t`, at most `limit`, shared fairly among the
/// queues that have some (as the SQLite store's `promotion.rs`): every due queue gets an
/// equal share, what one leaves goes to the others; with more due queues than the limit,
/// one each and the start rotates from tick to tick. Each queue's share is one statement
/// that locks what it promotes with `SKIP LOCKED`, so two ticks at once promote disjoint
/// messages. `scheduled` is [`scheduled_queues`] as read in this transaction. Returns the
/// messages made ready per queue.
async fn promote(
    st: &Inner,
    tx: &Transaction<'_>,
    scheduled: Vec<(String, i64)>,
    t: i64,
    limit: usize,
) -> Result<Vec<(String, usize)>, E> {
    let mut due: Vec<(i64, String)> = scheduled
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
            let n = execute(
                tx,
                "UPDATE messages SET state = 1, updated_at = $1 WHERE seq = ANY(ARRAY( \
                   SELECT seq FROM messages WHERE queue = $2 AND state = 0 AND due_at <= $1 \
                   ORDER BY due_at LIMIT $3 FOR UPDATE SKIP LOCKED))",
                &[&t, &queue, &(share as i64)],
            )
            .await? as usize;
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
pub async fn tick(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    now: Option<Timestamp>,
) -> Result<TickOutcome, E> {
    // Like a lease: a promotion or an expiry is nobody's acknowledged write, and is redone
    // by the next tick if a crash loses it. A tick's lateness is the time its round trips
    // take (the scheduler runs one after another while messages fall due), so statements
    // that do not depend on each other go out together (tokio-postgres pipelines the
    // queries of one connection): the setting, the clock and the due queues in one round
    // trip; after the promotion, the expired leases, the next wake's two reads and the
    // promotion's notice in one.
    let (set, now, scheduled) = tokio::join!(
        tx.batch_execute(ASYNC_COMMIT),
        resolve_now(tx, now),
        scheduled_queues(tx)
    );
    set?;
    let now = now?;
    let t = now.as_millis();
    let promoted = promote(st, tx, scheduled?, t, TICK_PROMOTE_LIMIT).await?;
    let mut ready_queues: Vec<String> = Vec::new();
    for (q, n) in promoted {
        cx.changes += n as u64;
        cx.made_ready(&q, u32::try_from(n).unwrap_or(u32::MAX));
        ready_queues.push(q);
    }
    let sql = concat!(
        "SELECT ",
        columns!(),
        " FROM messages WHERE state = 2 AND lease_expires_at <= $1 \
         ORDER BY lease_expires_at LIMIT $2 FOR UPDATE SKIP LOCKED"
    );
    let expire_args: &[&(dyn tokio_postgres::types::ToSql + Sync)] = &[&t, &TICK_EXPIRE_LIMIT];
    // The other nodes' notice of what the promotion made ready goes out with them (the
    // commit sends it); what the expiries make ready is noticed at the commit as usual.
    let promoted_ready = std::mem::take(&mut cx.ready);
    let (rows, mut scheduled, mut lease_expiry, noticed) = tokio::join!(
        query(tx, sql, expire_args),
        scheduled_queues(tx),
        next_lease_expiry(tx),
        crate::notify::send(tx, st.channel.as_deref(), st.epoch, &promoted_ready)
    );
    noticed?;
    let rows = rows?;
    let mut more = rows.len() as i64 >= TICK_EXPIRE_LIMIT;
    let mut expired = Vec::with_capacity(rows.len());
    let lease_expired = Failure::lease_expired();
    for r in &rows {
        let row = row::from_pg(r)?;
        let end = AttemptEnd::lease(LeaseEnd::Expired);
        let outcome = fail_attempt(st, tx, cx, row, &lease_expired, None, end, now).await?;
        if outcome.message.state == State::Ready && !ready_queues.contains(&outcome.message.queue) {
            ready_queues.push(outcome.message.queue.clone());
        }
        expired.push(outcome);
    }
    if !expired.is_empty() {
        // The expiries scheduled retries and ended leases: read the next wake again.
        (scheduled, lease_expiry) = tokio::join!(scheduled_queues(tx), next_lease_expiry(tx));
    }
    let scheduled = scheduled?;
    more |= scheduled.iter().any(|(_, d)| *d <= t);
    let next = if more {
        Some(t)
    } else {
        earliest_wake(&scheduled, lease_expiry?)
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

/// Delete done messages finished before `now - done_retention_ms` (at most
/// [`PURGE_LIMIT`]; their history goes with them) and expired idempotency records; a
/// purged message's live key keeps a tombstone.
pub async fn purge(
    tx: &Transaction<'_>,
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
        "WITH gone AS (DELETE FROM messages WHERE seq = ANY(ARRAY( \
           SELECT seq FROM messages WHERE state = 3 AND finished_at < $1 \
           ORDER BY finished_at LIMIT $2 FOR UPDATE SKIP LOCKED)) \
         RETURNING seq, queue, idempotency_key, id, created_at, updated_at, finished_at, attempts, \
         priority, msg_key, headers), \
         their_history AS (DELETE FROM history WHERE message_seq IN (SELECT seq FROM gone)), \
         their_ids AS (DELETE FROM message_ids WHERE mi_seq IN (SELECT seq FROM gone)) \
         SELECT queue, idempotency_key, id, created_at, updated_at, finished_at, attempts, \
         priority, msg_key, headers FROM gone",
        &[&cutoff, &PURGE_LIMIT],
    )
    .await?;
    let more = rows.len() as i64 >= PURGE_LIMIT;
    let mut per_queue: Vec<(String, u64)> = Vec::new();
    for r in &rows {
        let queue: String = r.try_get(0)?;
        let ikey: Option<String> = r.try_get(1)?;
        if let Some(ikey) = ikey {
            // The key outlives the message (SPEC §4): its record keeps what a replay answers.
            let headers: Option<String> = r.try_get(9)?;
            let priority: i16 = r.try_get(7)?;
            let attempts: i32 = r.try_get(6)?;
            let tombstone = redrive_storage::stored::Tombstone {
                created_at: r.try_get(3)?,
                updated_at: r.try_get(4)?,
                finished_at: r.try_get(5)?,
                attempts: attempts.max(0) as u32,
                priority: priority.clamp(0, 255) as u8,
                key: r.try_get(8)?,
                headers: match headers {
                    Some(h) => serde_json::from_str(&h)?,
                    None => BTreeMap::new(),
                },
            };
            let id: String = r.try_get(2)?;
            execute(
                tx,
                "UPDATE idempotency SET tombstone = $4::text::jsonb \
                 WHERE queue = $1 AND ikey = $2 AND message_id = $3",
                &[&queue, &ikey, &id, &serde_json::to_string(&tombstone)?],
            )
            .await?;
        }
        match per_queue.iter_mut().find(|(q, _)| *q == queue) {
            Some((_, c)) => *c += 1,
            None => per_queue.push((queue, 1)),
        }
    }
    cx.changes += rows.len() as u64;
    let idempotency_deleted = execute(
        tx,
        "DELETE FROM idempotency WHERE expires_at <= $1",
        &[&now.as_millis()],
    )
    .await?;
    // Keys with nothing left in their order; one a transition holds is left for next time.
    execute(
        tx,
        "DELETE FROM key_heads WHERE (queue, msg_key) IN (SELECT queue, msg_key FROM key_heads \
         WHERE head_seq IS NULL LIMIT 10000 FOR UPDATE SKIP LOCKED)",
        &[],
    )
    .await?;
    Ok(PurgeOutcome {
        done_deleted: per_queue,
        idempotency_deleted,
        more,
    })
}

// ---- set-based ack and nack ----

/// Every lifecycle column of many rows, in one statement (as [`WRITE_LIFE`] for one).
const WRITE_LIVES: &str = "UPDATE messages m SET state = v.state, due_at = v.due_at, \
     attempts = v.attempts, budget_base = v.budget_base, uncounted = v.uncounted, \
     released = v.released, prev_delay_ms = v.prev_delay_ms, updated_at = v.updated_at, \
     window_start = v.window_start, leased_at = v.leased_at, lease_expires_at = v.lease_expires_at, \
     lease_end = v.lease_end, finished_at = v.finished_at, dead_reason = v.dead_reason, \
     error_class = coalesce(v.error_class, m.error_class), last_error = coalesce(v.last_error, m.last_error) \
     FROM unnest($1::bigint[], $2::smallint[], $3::bigint[], $4::int[], $5::int[], $6::int[], \
       $7::int[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], \
       $13::text[], $14::bigint[], $15::text[], $16::text[], $17::text[]) \
       AS v(seq, state, due_at, attempts, budget_base, uncounted, released, prev_delay_ms, \
            updated_at, window_start, leased_at, lease_expires_at, lease_end, finished_at, \
            dead_reason, error_class, last_error) \
     WHERE m.seq = v.seq";

/// A row to write: its seq, lifecycle, and new (error class, last error JSON) if any.
type LifeWrite<'a> = (i64, &'a Lifecycle, Option<(&'a str, &'a str)>);

/// Write the lifecycles of `rows` (distinct seqs) in one statement.
async fn write_lives(tx: &Transaction<'_>, rows: &[LifeWrite<'_>]) -> Result<(), E> {
    if rows.is_empty() {
        return Ok(());
    }
    let seq: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let state: Vec<i16> = rows.iter().map(|r| i16::from(r.1.state.code())).collect();
    let due: Vec<Option<i64>> = rows.iter().map(|r| ms(r.1.due_at)).collect();
    let attempts: Vec<i32> = rows.iter().map(|r| int(r.1.attempts)).collect();
    let base: Vec<i32> = rows.iter().map(|r| int(r.1.budget_base)).collect();
    let uncounted: Vec<i32> = rows.iter().map(|r| int(r.1.uncounted)).collect();
    let released: Vec<i32> = rows.iter().map(|r| int(r.1.released)).collect();
    let prev: Vec<Option<i64>> = rows.iter().map(|r| delay_ms(r.1.prev_delay_ms)).collect();
    let updated: Vec<i64> = rows.iter().map(|r| r.1.updated_at.as_millis()).collect();
    let window: Vec<Option<i64>> = rows.iter().map(|r| ms(r.1.window_start)).collect();
    let leased_at: Vec<Option<i64>> = rows.iter().map(|r| ms(r.1.leased_at)).collect();
    let expires: Vec<Option<i64>> = rows.iter().map(|r| ms(r.1.lease_expires_at)).collect();
    let lease_end: Vec<Option<&str>> = rows
        .iter()
        .map(|r| r.1.lease_end.map(LeaseEnd::as_str))
        .collect();
    let finished: Vec<Option<i64>> = rows.iter().map(|r| ms(r.1.finished_at)).collect();
    let dead: Vec<Option<&str>> = rows
        .iter()
        .map(|r| r.1.dead_reason.map(|d| d.as_str()))
        .collect();
    let class: Vec<Option<&str>> = rows.iter().map(|r| r.2.map(|e| e.0)).collect();
    let last_error: Vec<Option<&str>> = rows.iter().map(|r| r.2.map(|e| e.1)).collect();
    execute(
        tx,
        WRITE_LIVES,
        &[
            &seq,
            &state,
            &due,
            &attempts,
            &base,
            &uncounted,
            &released,
            &prev,
            &updated,
            &window,
            &leased_at,
            &expires,
            &lease_end,
            &finished,
            &dead,
            &class,
            &last_error,
        ],
    )
    .await?;
    Ok(())
}

/// Append history entries `(seq, entry)` in one statement, in order (several for one seq
/// get consecutive numbers). Every message's row is locked by the caller.
async fn append_histories(tx: &Transaction<'_>, entries: &[(i64, &HistoryEntry)]) -> Result<(), E> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut seq = Vec::with_capacity(entries.len());
    let mut json = Vec::with_capacity(entries.len());
    let mut k: Vec<i32> = Vec::with_capacity(entries.len());
    for (i, (s, e)) in entries.iter().enumerate() {
        seq.push(*s);
        json.push(serde_json::to_string(e)?);
        k.push(1 + entries[..i].iter().filter(|(o, _)| o == s).count() as i32);
    }
    execute(
        tx,
        "INSERT INTO history (message_seq, n, entry) \
         SELECT v.seq, coalesce((SELECT max(h.n) FROM history h WHERE h.message_seq = v.seq), 0) + v.k, \
                v.entry::jsonb \
         FROM unnest($1::bigint[], $2::text[], $3::int[]) AS v(seq, entry, k)",
        &[&seq, &json, &k],
    )
    .await?;
    Ok(())
}

/// Lock the rows of `ids` (in `seq` order, so that two such calls lock in one order) and
/// read them; by id.
async fn locked_rows(
    tx: &Transaction<'_>,
    ids: &[String],
) -> Result<std::collections::HashMap<String, Row>, E> {
    let sql = concat!(
        "SELECT ",
        columns!(),
        " FROM messages",
        where_ids!(),
        " ORDER BY seq FOR UPDATE"
    );
    let rows = query(tx, sql, &[&ids]).await?;
    let mut out = std::collections::HashMap::with_capacity(rows.len());
    for r in &rows {
        let row = row::from_pg(r)?;
        out.insert(row.id.clone(), row);
    }
    Ok(out)
}

/// Ack `items`: set-based where it can ([`ack_set`]), one by one ([`ack`]) the items with
/// wait notes; answers in item order.
pub async fn ack_many(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    items: &[Ack],
    now: Timestamp,
) -> Result<Vec<Result<Acked, StoreError>>, E> {
    redrive_storage::settle_many!(
        E,
        items,
        |a| !a.waited.is_empty(),
        |refs| ack_set(st, tx, &mut *cx, &refs, now),
        |a| ack(st, tx, &mut *cx, a, now)
    )
}

/// Ack `items` set-based: one statement locks their rows, each item is checked and
/// changed as [`ack`] does ([`settle::acks`]), one statement writes the rows and one their
/// history entries.
async fn ack_set(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    items: &[&Ack],
    now: Timestamp,
) -> Result<Vec<Result<Acked, StoreError>>, E> {
    let ids: Vec<String> = items.iter().map(|a| a.lease.id.to_string()).collect();
    let mut rows = locked_rows(tx, &ids).await?;
    let s = settle::acks(&mut rows, items, now);
    write_settled(st, tx, cx, &rows, &s.written, &s.errors, &s.entries).await?;
    Ok(s.answers)
}

/// Nack `items` as [`ack_many`] acks them: set-based where it can ([`nack_set`]), one by
/// one ([`nack`]) the items with wait notes; answers in item order.
pub async fn nack_many(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    items: &[Nack],
    now: Timestamp,
) -> Result<Vec<Result<FailureOutcome, StoreError>>, E> {
    redrive_storage::settle_many!(
        E,
        items,
        |n| !n.waited.is_empty(),
        |refs| nack_set(st, tx, &mut *cx, &refs, now),
        |n| nack(st, tx, &mut *cx, n, now)
    )
}

/// Nack `items` set-based, as [`ack_set`]: each item is checked and failed through
/// [`rules::fail`] as [`nack`] does ([`settle::nacks`]).
async fn nack_set(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    items: &[&Nack],
    now: Timestamp,
) -> Result<Vec<Result<FailureOutcome, StoreError>>, E> {
    let ids: Vec<String> = items.iter().map(|n| n.lease.id.to_string()).collect();
    let mut rows = locked_rows(tx, &ids).await?;
    let s = st.with_rng(|rng| settle::nacks(&mut rows, items, &st.catalog, rng, now))?;
    write_settled(st, tx, cx, &rows, &s.written, &s.errors, &s.entries).await?;
    Ok(s.answers)
}

/// Write what [`ack_many`] or [`nack_many`] changed: the rows `written` (with `errors`, one
/// per row, for a nack), their history entries, then per-key ordering and wake-ups.
async fn write_settled(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    rows: &std::collections::HashMap<String, Row>,
    written: &[String],
    errors: &[(String, String)],
    entries: &[(i64, HistoryEntry)],
) -> Result<(), E> {
    let changed: Vec<&Row> = written.iter().filter_map(|id| rows.get(id)).collect();
    let lives: Vec<LifeWrite<'_>> = changed
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let error = errors.get(i).map(|(c, e)| (c.as_str(), e.as_str()));
            (r.seq, &r.life, error)
        })
        .collect();
    let refs: Vec<(i64, &HistoryEntry)> = entries.iter().map(|(s, e)| (*s, e)).collect();
    let (w, h) = tokio::join!(write_lives(tx, &lives), append_histories(tx, &refs));
    w.and(h)?;
    for r in changed {
        key_order::settle(st, tx, &r.queue, r.key.as_deref(), r.seq).await?;
        cx.changes += 1;
        cx.moved(&r.queue, &r.life);
    }
    Ok(())
}

// ---- set-based publish ----

/// A live idempotency record: message id, fingerprint, tombstone, expiry.
type Record = (String, String, Option<String>, i64);

/// What one item of a set-based publish turned out to be.
enum Slot {
    /// A replay of the message a live idempotency record names (its id).
    Replay(String),
    /// A replay of an earlier new item of the same call (its index).
    ReplayOfNew(usize),
    /// A new message: its index among the rows inserted.
    New(usize),
}

/// A new message of a set-based publish, before it is inserted.
struct NewRow {
    row: Row,
    history: Vec<HistoryEntry>,
    error_class: Option<&'static str>,
    key_blocked: Option<bool>,
    fingerprint: String,
    failure: Option<(redrive_core::ErrorClass, Option<u64>)>,
}

/// Publish several items set-based, with the answers [`publish`] gives item by item: one
/// statement reads the live idempotency records of the call's keys, each item is decided
/// in order (a key used twice in the call replays, or conflicts with, its first use), one
/// statement inserts the new messages (in item order, so publish order is kept), one their
/// history, one their idempotency records; then per-key ordering.
async fn publish_many(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    items: &[NewMessage],
    now: Timestamp,
) -> Result<Vec<Published>, E> {
    let t = now.as_millis();
    let mut payloads = Vec::with_capacity(items.len());
    for item in items {
        payloads.push((serde_json::to_string(&item.payload)?, String::new()));
    }
    // The fingerprints of the keyed items, computed by the database (`sql_publish`).
    let keyed_at: Vec<usize> = (0..items.len())
        .filter(|&i| items[i].idempotency_key.is_some())
        .collect();
    if !keyed_at.is_empty() {
        let texts: Vec<&str> = keyed_at.iter().map(|&i| payloads[i].0.as_str()).collect();
        let rows = query(
            tx,
            &format!(
                "SELECT {} FROM unnest($1::text[]) WITH ORDINALITY AS u(p, n) ORDER BY n",
                sql_publish::fingerprint("p")
            ),
            &[&texts],
        )
        .await?;
        for (&i, r) in keyed_at.iter().zip(&rows) {
            payloads[i].1 = r.try_get(0)?;
        }
    }
    // The live records of the call's keys.
    let (kq, kk): (Vec<&str>, Vec<&str>) = items
        .iter()
        .filter_map(|i| i.idempotency_key.as_deref().map(|k| (i.queue.as_str(), k)))
        .unzip();
    let mut records: std::collections::HashMap<(String, String), Record> =
        std::collections::HashMap::new();
    if !kq.is_empty() {
        let rows = query(
            tx,
            "SELECT i.queue, i.ikey, i.message_id, i.fingerprint, i.tombstone::text, i.expires_at \
             FROM idempotency i JOIN unnest($1::text[], $2::text[]) AS v(queue, ikey) \
             ON i.queue = v.queue AND i.ikey = v.ikey WHERE i.expires_at > $3",
            &[&kq, &kk, &t],
        )
        .await?;
        for r in &rows {
            records.insert(
                (r.try_get(0)?, r.try_get(1)?),
                (r.try_get(2)?, r.try_get(3)?, r.try_get(4)?, r.try_get(5)?),
            );
        }
    }
    // Decide each item in order.
    let mut slots = Vec::with_capacity(items.len());
    let mut first_use: std::collections::HashMap<(&str, &str), usize> =
        std::collections::HashMap::new();
    let mut new_rows: Vec<NewRow> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let fp = &payloads[index].1;
        if let Some(ikey) = item.idempotency_key.as_deref() {
            let conflict = || {
                E::Logic(StoreError::IdempotencyConflict {
                    index,
                    key: ikey.to_owned(),
                })
            };
            if let Some((mid, rfp, _, _)) = records.get(&(item.queue.clone(), ikey.to_owned())) {
                if rfp != fp {
                    return Err(conflict());
                }
                slots.push(Slot::Replay(mid.clone()));
                continue;
            }
            if let Some(&j) = first_use.get(&(item.queue.as_str(), ikey)) {
                if payloads[j].1 != *fp {
                    return Err(conflict());
                }
                slots.push(Slot::ReplayOfNew(j));
                continue;
            }
            first_use.insert((item.queue.as_str(), ikey), index);
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
        slots.push(Slot::New(new_rows.len()));
        new_rows.push(NewRow {
            row: Row {
                seq: 0,
                id: MessageId::new().to_string(),
                queue: item.queue.clone(),
                priority: item.priority,
                key: item.key.clone(),
                idempotency_key: item.idempotency_key.clone(),
                payload: payloads[index].0.clone(),
                headers: if item.headers.is_empty() {
                    None
                } else {
                    Some(serde_json::to_string(&item.headers)?)
                },
                lease_token: None,
                last_error,
                target_url: item.target_url.clone(),
                life,
            },
            history,
            error_class: item.failed.as_ref().map(|f| f.class.as_str()),
            key_blocked,
            fingerprint: fp.clone(),
            failure,
        });
    }
    insert_rows(tx, &mut new_rows).await?;
    let entries: Vec<(i64, &HistoryEntry)> = new_rows
        .iter()
        .flat_map(|n| n.history.iter().map(move |h| (n.row.seq, h)))
        .collect();
    append_histories(tx, &entries).await?;
    // Idempotency records of the new keyed messages: an expired record of a key is
    // replaced; a live one can only be a concurrent publish (see `publish`): run again.
    let keyed: Vec<&NewRow> = new_rows
        .iter()
        .filter(|n| n.row.idempotency_key.is_some())
        .collect();
    if !keyed.is_empty() {
        let q: Vec<&str> = keyed.iter().map(|n| n.row.queue.as_str()).collect();
        let k: Vec<&str> = keyed
            .iter()
            .filter_map(|n| n.row.idempotency_key.as_deref())
            .collect();
        let m: Vec<&str> = keyed.iter().map(|n| n.row.id.as_str()).collect();
        let f: Vec<&str> = keyed.iter().map(|n| n.fingerprint.as_str()).collect();
        let expires = now.plus_ms(st.idempotency_window_ms).as_millis();
        let n = execute(
            tx,
            "INSERT INTO idempotency (queue, ikey, message_id, fingerprint, expires_at) \
             SELECT v.queue, v.ikey, v.message_id, v.fingerprint, $5 \
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) \
               AS v(queue, ikey, message_id, fingerprint) \
             ON CONFLICT (queue, ikey) DO UPDATE SET message_id = EXCLUDED.message_id, \
             fingerprint = EXCLUDED.fingerprint, expires_at = EXCLUDED.expires_at, tombstone = NULL \
             WHERE idempotency.expires_at <= $6",
            &[&q, &k, &m, &f, &expires, &t],
        )
        .await?;
        if n != keyed.len() as u64 {
            return Err(E::Retry(
                "an idempotency key of the call was taken by a concurrent publish".to_owned(),
            ));
        }
    }
    for n in &new_rows {
        key_order::settle(st, tx, &n.row.queue, n.row.key.as_deref(), n.row.seq).await?;
        cx.changes += 1;
        cx.moved(&n.row.queue, &n.row.life);
    }
    // Replays of messages published before.
    let replayed: Vec<String> = slots
        .iter()
        .filter_map(|s| match s {
            Slot::Replay(id) => Some(id.clone()),
            _ => None,
        })
        .collect();
    let mut existing: std::collections::HashMap<String, Message> = std::collections::HashMap::new();
    if !replayed.is_empty() {
        let sql = concat!("SELECT ", columns!(), " FROM messages", where_ids!());
        for r in &query(tx, sql, &[&replayed]).await? {
            let row = row::from_pg(r)?;
            existing.insert(row.id.clone(), row.to_message(None, None)?);
        }
    }
    // The answers, in item order.
    let mut published: Vec<Option<Message>> = Vec::with_capacity(new_rows.len());
    for (n, item) in new_rows.iter().zip(
        slots
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, Slot::New(_)))
            .map(|(i, _)| &items[i]),
    ) {
        let mut m = n.row.to_message(None, Some(item.payload.clone()))?;
        m.history = n.history.clone();
        published.push(Some(m));
    }
    let mut out = Vec::with_capacity(items.len());
    for (index, slot) in slots.iter().enumerate() {
        let item = &items[index];
        out.push(match slot {
            Slot::New(j) => {
                let message = published[*j].clone().ok_or_else(|| {
                    E::Db(StoreError::Backend(
                        "a published row went missing".to_owned(),
                    ))
                })?;
                let failure = new_rows[*j].failure.map(|(class, delay)| FailureOutcome {
                    message: message.clone(),
                    class,
                    retry_delay_ms: delay,
                    dead_reason: message.dead_reason,
                });
                Published {
                    message,
                    replayed: false,
                    failure,
                }
            }
            Slot::ReplayOfNew(first) => {
                let Slot::New(j) = slots[*first] else {
                    return Err(E::Db(StoreError::Backend(
                        "a replay of a call's own item that was no new message".to_owned(),
                    )));
                };
                // As a replay reads it back: the stored message, without its history.
                let message = new_rows[j].row.to_message(None, None)?;
                Published {
                    message,
                    replayed: true,
                    failure: None,
                }
            }
            Slot::Replay(id) => {
                let message = match existing.get(id) {
                    Some(m) => m.clone(),
                    None => {
                        let ikey = item.idempotency_key.clone().unwrap_or_default();
                        let (_, _, tombstone, expires_at) = records
                            .get(&(item.queue.clone(), ikey))
                            .cloned()
                            .ok_or_else(|| {
                                E::Db(StoreError::Backend(
                                    "a replayed record went missing".to_owned(),
                                ))
                            })?;
                        redrive_storage::stored::purged_message(
                            row::parse_id(id)?,
                            item,
                            tombstone.as_deref(),
                            expires_at,
                            st.idempotency_window_ms,
                        )?
                    }
                };
                Published {
                    message,
                    replayed: true,
                    failure: None,
                }
            }
        });
    }
    Ok(out)
}

/// Insert `rows` in one statement, in their order (so their `seq`s follow it); sets each
/// row's `seq`.
async fn insert_rows(tx: &Transaction<'_>, rows: &mut [NewRow]) -> Result<(), E> {
    if rows.is_empty() {
        return Ok(());
    }
    let id: Vec<&str> = rows.iter().map(|n| n.row.id.as_str()).collect();
    let queue: Vec<&str> = rows.iter().map(|n| n.row.queue.as_str()).collect();
    let state: Vec<i16> = rows
        .iter()
        .map(|n| i16::from(n.row.life.state.code()))
        .collect();
    let priority: Vec<i16> = rows.iter().map(|n| i16::from(n.row.priority)).collect();
    let due: Vec<Option<i64>> = rows.iter().map(|n| ms(n.row.life.due_at)).collect();
    let key: Vec<Option<&str>> = rows.iter().map(|n| n.row.key.as_deref()).collect();
    let ikey: Vec<Option<&str>> = rows
        .iter()
        .map(|n| n.row.idempotency_key.as_deref())
        .collect();
    let payload: Vec<&str> = rows.iter().map(|n| n.row.payload.as_str()).collect();
    let headers: Vec<Option<&str>> = rows.iter().map(|n| n.row.headers.as_deref()).collect();
    let attempts: Vec<i32> = rows.iter().map(|n| int(n.row.life.attempts)).collect();
    let uncounted: Vec<i32> = rows.iter().map(|n| int(n.row.life.uncounted)).collect();
    let prev: Vec<Option<i64>> = rows
        .iter()
        .map(|n| delay_ms(n.row.life.prev_delay_ms))
        .collect();
    let created: Vec<i64> = rows
        .iter()
        .map(|n| n.row.life.created_at.as_millis())
        .collect();
    let finished: Vec<Option<i64>> = rows.iter().map(|n| ms(n.row.life.finished_at)).collect();
    let dead: Vec<Option<&str>> = rows
        .iter()
        .map(|n| n.row.life.dead_reason.map(|d| d.as_str()))
        .collect();
    let class: Vec<Option<&str>> = rows.iter().map(|n| n.error_class).collect();
    let last_error: Vec<Option<&str>> = rows.iter().map(|n| n.row.last_error.as_deref()).collect();
    let blocked: Vec<Option<bool>> = rows.iter().map(|n| n.key_blocked).collect();
    let target: Vec<Option<&str>> = rows.iter().map(|n| n.row.target_url.as_deref()).collect();
    let got = query(
        tx,
        "WITH m AS (INSERT INTO messages (id, queue, state, priority, due_at, msg_key, idempotency_key, \
         payload, headers, attempts, uncounted, prev_delay_ms, created_at, updated_at, \
         finished_at, dead_reason, error_class, last_error, key_blocked, target_url) \
         SELECT v.id, v.queue, v.state, v.priority, v.due_at, v.msg_key, v.ikey, v.payload, \
                v.headers, v.attempts, v.uncounted, v.prev, v.created, v.created, v.finished, \
                v.dead, v.class, v.last_error, v.blocked, v.target \
         FROM unnest($1::text[], $2::text[], $3::smallint[], $4::smallint[], $5::bigint[], \
                     $6::text[], $7::text[], $8::text[], $9::text[], $10::int[], $11::int[], \
                     $12::bigint[], $13::bigint[], $14::bigint[], $15::text[], $16::text[], \
                     $17::text[], $18::boolean[], $19::text[]) WITH ORDINALITY \
           AS v(id, queue, state, priority, due_at, msg_key, ikey, payload, headers, attempts, \
                uncounted, prev, created, finished, dead, class, last_error, blocked, target, ord) \
         ORDER BY v.ord RETURNING id, seq, queue), \
         ids AS (INSERT INTO message_ids (mi_seq, mi_id, mi_queue) SELECT seq, id, queue FROM m) \
         SELECT id, seq FROM m",
        &[
            &id,
            &queue,
            &state,
            &priority,
            &due,
            &key,
            &ikey,
            &payload,
            &headers,
            &attempts,
            &uncounted,
            &prev,
            &created,
            &finished,
            &dead,
            &class,
            &last_error,
            &blocked,
            &target,
        ],
    )
    .await?;
    let mut seqs: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
    for r in &got {
        seqs.insert(r.try_get(0)?, r.try_get(1)?);
    }
    for n in rows.iter_mut() {
        n.row.seq = *seqs.get(&n.row.id).ok_or_else(|| {
            E::Db(StoreError::Backend(format!(
                "inserted message {} has no seq",
                n.row.id
            )))
        })?;
    }
    Ok(())
}
