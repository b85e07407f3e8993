//! The message state machine's transitions, run inside the writer's transaction.
//!
//! Each public method here is one job of [`crate::group_commit`]: it reads the
//! rows it needs, checks the transition is legal (lease token, state), asks the
//! queue's [`redrive_core::RetryPolicy`] what a failure leads to, and writes.
//! It validates before it writes wherever it can; when it cannot, returning an
//! error rolls its savepoint back, so a failed transition changes nothing.

use crate::hot::{self, Hot, Key, MemLease};
use crate::idempotency::{PurgedKey, Tombstone};
use crate::key_order::{self, Mode};
use crate::promotion::{self, DueQueues};
use crate::row::Row;
use crate::row_cache;
use crate::schema::columns;
use crate::sql_error::SqlResultExt;
use redrive_core::{
    fnv1a, AttemptResponse, Failure, HistoryEntry, HistoryEvent, Message, MessageId, NewMessage,
    QueueCatalog, SplitMix64, State, Timestamp, Waited,
};
use redrive_storage::rules::{self, AttemptEnd, FailedAttempt, LeaseEnd, Lifecycle};
use redrive_storage::{
    Ack, Acked, FailureOutcome, LeaseRef, LeaseRequest, Leased, Nack, Published, PurgeOutcome,
    Release, Released, Returned, Settled, StoreError, TickOutcome,
};
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The ack's one statement (see `WriterState::ack`), followed by `$tail`.
macro_rules! ack_sql {
    ($tail:expr) => {
        concat!(
            "UPDATE messages SET state = 3, finished_at = ?3, updated_at = ?3, lease_end = 'acked', \
             lease_token = ?2, attempts = coalesce(?7, attempts), leased_at = coalesce(?8, leased_at), \
             lease_expires_at = coalesce(?9, lease_expires_at), \
             history = redrive_history_append(history, '{\"attempt\":' || coalesce(?7, attempts) || ',\"at\":\"' || ?4 || \
               '\",\"leased_at\":' || coalesce('\"' || coalesce(?12, strftime('%Y-%m-%dT%H:%M:%fZ', leased_at / 1000.0, 'unixepoch')) || '\"', 'null') || \
               ',\"event\":\"' || ?6 || '\"' || coalesce(',\"response\":' || ?5, '') || '}') \
             WHERE seq = coalesce(?10, (SELECT seq FROM messages WHERE id = ?1)) AND id = ?1 AND CASE WHEN ?7 IS NULL \
               THEN lease_token = ?2 AND state = 2 AND lease_expires_at > ?3 \
               ELSE state = ?11 AND attempts = ?7 - 1 END",
            $tail
        )
    };
}

/// A lease as the writer made it: the row, not yet turned into a [`Message`]. Parsing the
/// stored JSON (payload, headers, last error) happens in the caller's task, off the single
/// writer thread ([`LeasedRow::into_leased`]).
#[derive(Debug)]
pub struct LeasedRow {
    row: Row,
    expires_at: Timestamp,
    lateness_ms: i64,
    max_attempts: u32,
}

impl LeasedRow {
    /// The lease as the store's answer.
    pub fn into_leased(self) -> Result<Leased, StoreError> {
        Ok(Leased {
            message: self.row.to_message(None, None)?,
            attempt: self.row.life.attempts,
            max_attempts: self.max_attempts,
            token: self.row.lease_token.unwrap_or_default(),
            expires_at: self.expires_at,
            lateness_ms: self.lateness_ms,
        })
    }
}

/// An ack as the writer made it (see [`LeasedRow`]).
#[derive(Debug)]
pub struct AckedRow {
    row: Row,
    repeated: bool,
}

impl AckedRow {
    /// The ack as the store's answer.
    pub fn into_acked(self) -> Result<Acked, StoreError> {
        Ok(Acked {
            message: self.row.to_message(None, None)?,
            repeated: self.repeated,
        })
    }
}

/// A failed attempt as the writer made it (see [`LeasedRow`]).
#[derive(Debug)]
pub struct FailedRow {
    row: Row,
    class: redrive_core::ErrorClass,
    retry_delay_ms: Option<u64>,
}

/// A release as the writer made it (see [`LeasedRow`]).
#[derive(Debug)]
pub enum ReleasedRow {
    /// Handed back uncharged.
    Uncharged(Row),
    /// Charged: a failed attempt.
    Charged(FailedRow),
}

impl ReleasedRow {
    /// The release as the store's answer.
    pub fn into_released(self) -> Result<Released, StoreError> {
        Ok(match self {
            ReleasedRow::Uncharged(row) => Released::Uncharged(row.to_message(None, None)?),
            ReleasedRow::Charged(f) => Released::Charged(f.into_outcome()?),
        })
    }
}

impl FailedRow {
    /// The outcome as the store's answer.
    pub fn into_outcome(self) -> Result<FailureOutcome, StoreError> {
        let message = self.row.to_message(None, None)?;
        Ok(FailureOutcome {
            dead_reason: message.dead_reason,
            message,
            class: self.class,
            retry_delay_ms: self.retry_delay_ms,
        })
    }
}

/// Per-queue message counts, indexed by [`State::code`].
pub type Counts = HashMap<String, [i64; 5]>;

/// At most this many expired leases are failed in one tick.
const TICK_EXPIRE_LIMIT: i64 = 1_000;
/// At most this many done messages are deleted by one purge.
const PURGE_LIMIT: i64 = 10_000;

/// Everything the writer thread owns.
pub struct WriterState {
    /// The only write connection.
    pub conn: Connection,
    /// Set while a job is being refused (store closed or poisoned): the job must not run.
    pub refusing: bool,
    /// The running batch's number (1, 2, …): a reader that must see an answered unsynced
    /// job waits until this batch has committed (`group_commit::Shared::settled`).
    pub batch: u64,
    rng: SplitMix64,
    /// Random at every open, whatever the seed: mixed into every lease token, so that a
    /// token handed out before a crash (whose lease may not have committed) never matches
    /// one handed out after it, even when a fixed seed repeats the generator's sequence.
    epoch: u64,
    catalog: Arc<QueueCatalog>,
    idempotency_window_ms: u64,
    /// Counts published to readers after each commit.
    counts: Arc<Mutex<Counts>>,
    /// Count changes of the running job, of the running batch.
    job_delta: Vec<(String, Option<State>, Option<State>)>,
    batch_delta: Vec<(String, Option<State>, Option<State>)>,
    /// Earliest wake-up written by the running job, of the running batch.
    job_wake: Option<i64>,
    job_exact_wake: Option<Option<i64>>,
    batch_wake: Option<i64>,
    /// Which queues have scheduled messages, from when (the tick's fair promotion).
    due: DueQueues,
    /// The leases held in memory, and the ready rows they are taken from (`hot.rs`).
    pub hot: Hot,
    /// Queues where a transition other than the tick promoted a row in memory (a row
    /// scheduled behind the rows held there): the next tick names them ready.
    promoted_elsewhere: Vec<String>,
}

impl WriterState {
    pub fn new(
        conn: Connection,
        seed: u64,
        catalog: Arc<QueueCatalog>,
        idempotency_window_ms: u64,
        counts: Arc<Mutex<Counts>>,
    ) -> Self {
        let scheduled: Vec<String> = counts
            .lock()
            .map(|c| {
                c.iter()
                    .filter(|(_, n)| n[State::Scheduled.code() as usize] > 0)
                    .map(|(q, _)| q.clone())
                    .collect()
            })
            .unwrap_or_default();
        Self {
            conn,
            refusing: false,
            batch: 0,
            rng: SplitMix64::new(seed),
            epoch: crate::random_seed(),
            catalog,
            idempotency_window_ms,
            counts,
            job_delta: Vec::new(),
            batch_delta: Vec::new(),
            job_wake: None,
            job_exact_wake: None,
            batch_wake: None,
            due: DueQueues::new(scheduled),
            hot: Hot::new(),
            promoted_elsewhere: Vec::new(),
        }
    }

    /// The earliest scheduled due time or lease expiry, ms: at open and after a tick.
    pub fn next_wake(&mut self) -> Result<Option<i64>, StoreError> {
        Ok([
            self.due.earliest(&self.conn, &self.hot)?,
            crate::reads::next_lease_expiry(&self.conn)?,
            self.hot.next_expiry(),
        ]
        .into_iter()
        .flatten()
        .min())
    }

    // ---- batch bookkeeping (called by group_commit) ----

    pub fn begin_batch(&mut self, current_wake: Option<Timestamp>) {
        self.batch += 1;
        self.batch_delta.clear();
        self.batch_wake = current_wake.map(Timestamp::as_millis);
    }

    /// Message transitions kept in the running batch so far.
    pub fn batch_changes(&self) -> usize {
        self.batch_delta.len()
    }

    pub fn keep_command(&mut self) {
        self.hot.keep_job();
        self.batch_delta.append(&mut self.job_delta);
        if let Some(exact) = self.job_exact_wake.take() {
            self.batch_wake = exact;
        }
        if let Some(w) = self.job_wake.take() {
            self.batch_wake = Some(self.batch_wake.map_or(w, |b| b.min(w)));
        }
    }

    pub fn discard_command(&mut self) {
        self.hot.rollback_job();
        self.due.rolled_back();
        self.job_delta.clear();
        self.job_wake = None;
        self.job_exact_wake = None;
    }

    /// After a successful commit: publish counts, return the new wake hint.
    /// Returns the wake hint and the number of message transitions committed.
    pub fn finish_batch(&mut self) -> (Option<Timestamp>, usize) {
        self.due.committed();
        self.hot.batch_committed();
        let changes = self.batch_delta.len();
        if let Ok(mut counts) = self.counts.lock() {
            for (queue, from, to) in self.batch_delta.drain(..) {
                let c = counts.entry(queue).or_insert([0; 5]);
                if let Some(f) = from {
                    c[f.code() as usize] -= 1;
                }
                if let Some(t) = to {
                    c[t.code() as usize] += 1;
                }
            }
            counts.retain(|_, c| c.iter().any(|n| *n != 0));
        }
        (self.batch_wake.map(Timestamp::from_millis), changes)
    }

    pub fn abort_batch(&mut self) {
        self.hot.batch_aborted();
        self.batch_delta.clear();
        self.discard_command();
    }

    fn moved(&mut self, queue: &str, from: Option<State>, to: Option<State>) {
        if to == Some(State::Scheduled) {
            self.due.scheduled(queue);
        }
        if to == Some(State::Ready) && from != Some(State::Ready) && self.leases_in_memory(queue) {
            self.hot.moved_ready(queue);
        }
        self.job_delta.push((queue.to_owned(), from, to));
    }

    /// Per-key ordering after a transition of message `seq` (see `key_order`).
    fn settle_key(&self, queue: &str, key: Option<&str>, seq: i64) -> Result<(), StoreError> {
        match key {
            Some(key) => key_order::settle(
                &self.conn,
                Mode::of(self.catalog.get(queue)),
                queue,
                key,
                seq,
            ),
            None => Ok(()),
        }
    }

    /// A scheduled message wakes the scheduler at its due time. One scheduled where its
    /// queue's rows are held in memory (`hot.rs`: the tick's scan starts after them) is due
    /// by the clock of the tick that held them. When its own request's clock agrees within
    /// [`BEHIND_HOLD_SKEW_MS`] (the request was stamped a little before that tick: a short
    /// delay), it is promoted there at once, as the tick would have. Else the clock was set
    /// back, and it must wait for its due time by the clock of now: the queue's promotions
    /// and their leases are written into their rows and nothing is held any more, so the
    /// tick's scan starts from the start.
    fn wake_if_scheduled(&mut self, row: &Row) -> Result<(), StoreError> {
        let life = &row.life;
        if life.state != State::Scheduled {
            return Ok(());
        }
        let Some(d) = life.due_at else {
            return Ok(());
        };
        self.wake_at(d.as_millis());
        let key = Key::of_row(row);
        if !self.leases_in_memory(&row.queue) || !self.hot.behind_hold(&row.queue, &key) {
            return Ok(());
        }
        if d.as_millis() > life.updated_at.as_millis() + BEHIND_HOLD_SKEW_MS {
            for id in self.hot.promoted_ids(&row.queue) {
                self.materialize(&id)?;
            }
            self.hot.release_hold(&row.queue);
            return Ok(());
        }
        self.moved(&row.queue, Some(State::Scheduled), Some(State::Ready));
        if self.hot.promotion_room(&row.queue, 1) > 0 {
            self.hot
                .promote(&row.id, &row.queue, key, life.updated_at.as_millis());
        } else {
            self.write_promotion(row.seq, life.updated_at.as_millis())?;
            self.hot.made_ready(&row.queue, key);
        }
        self.promoted_elsewhere.push(row.queue.clone());
        Ok(())
    }

    fn wake_at(&mut self, at: i64) {
        self.job_wake = Some(self.job_wake.map_or(at, |w| w.min(at)));
    }

    /// Whether leases of `queue` are held in memory (`hot.rs`): it has no per-key ordering.
    fn leases_in_memory(&self, queue: &str) -> bool {
        held_in_memory(&self.catalog, queue)
    }

    /// A transition left `row` ready: its place among the queue's leasable rows.
    fn place_ready(&mut self, row: &Row) {
        if row.life.state == State::Ready && self.leases_in_memory(&row.queue) {
            self.hot.made_ready(&row.queue, Key::of_row(row));
        }
    }

    /// Write the lease of `id` held in memory (if any) into its row, as the lease statement
    /// would have: the row is then a leased row like any other, and the lease is no longer
    /// here.
    ///
    /// A row promoted in memory and not leased is written `ready`, as the tick's promotion
    /// on disk would have, and becomes a candidate of its queue's window.
    fn materialize(&mut self, id: &str) -> Result<(), StoreError> {
        if let Some(p) = self.hot.unpromote(id) {
            if self.write_promotion(p.key.seq(), p.at)? != 1 {
                return Err(lease_lost(id));
            }
            self.hot.place(&p.queue, p.key);
            return Ok(());
        }
        let Some(lease) = self.hot.end(id) else {
            return Ok(());
        };
        let n = self
            .conn
            .prepare_cached(
                "UPDATE messages SET state = 2, attempts = ?2, lease_token = ?3, leased_at = ?4, \
                 lease_expires_at = ?5, lease_end = NULL, updated_at = ?4 \
                 WHERE seq = ?1 AND state = ?6 AND attempts = ?2 - 1",
            )
            .db()?
            .execute(params![
                lease.seq,
                lease.attempt,
                lease.token,
                lease.leased_at,
                lease.expires_at,
                lease.disk_state().code(),
            ])
            .db()?;
        if n != 1 {
            return Err(lease_lost(id));
        }
        Ok(())
    }

    /// Write the promotion of the `scheduled` row at `seq` into it, at `at`, as the tick's
    /// promotion on disk does: how many rows it changed (1, or 0 if the row is not
    /// `scheduled`).
    fn write_promotion(&mut self, seq: i64, at: i64) -> Result<usize, StoreError> {
        self.hot.rows.forget(seq);
        self.conn
            .prepare_cached(
                "UPDATE messages SET state = 1, updated_at = ?2 WHERE seq = ?1 AND state = 0",
            )
            .db()?
            .execute(params![seq, at])
            .db()
    }

    /// Write every lease held in memory into its row (at close, so a restart keeps them).
    pub fn flush_hot(&mut self) -> Result<usize, StoreError> {
        let ids = self.hot.ids();
        for id in &ids {
            self.materialize(id)?;
        }
        Ok(ids.len())
    }

    // ---- row access ----

    /// The row of `id`, with its lease written into it if the lease was held in memory.
    ///
    /// Every transition but the hot path's (publish, lease, nack, ack, a lease's expiry)
    /// reads its row here, so the row is forgotten in the writer's cache of rows
    /// (`row_cache.rs`) before it changes.
    fn row_by_id(&mut self, id: &MessageId) -> Result<Row, StoreError> {
        self.materialize(&id.to_string())?;
        let row = self.stored_row(id)?;
        self.hot.rows.forget(row.seq);
        Ok(row)
    }

    /// A row the writer kept (`row_cache.rs`), or made from one, taken as the row on disk.
    /// In debug builds (every test) it is compared with the row read from disk: a
    /// transition that wrote a row without forgetting it there fails here.
    fn check_kept(&self, kept: &Row) -> Result<(), StoreError> {
        #[cfg(debug_assertions)]
        assert_eq!(
            self.stored_row_at(kept.seq)?.as_ref(),
            Some(kept),
            "a row kept by the writer differs from the row on disk"
        );
        #[cfg(not(debug_assertions))]
        let _ = kept;
        Ok(())
    }

    /// Keep `row`, just written, for the next step of its cycle when that step is near:
    /// a lease held in memory (`row_cache.rs`).
    fn keep_row(&mut self, row: &Row) {
        let near = match row.life.state {
            State::Ready => true,
            State::Scheduled => row.life.due_at.is_some_and(|d| {
                d.as_millis() <= row.life.updated_at.as_millis() + row_cache::HORIZON_MS
            }),
            _ => false,
        };
        if near && self.leases_in_memory(&row.queue) {
            self.hot.rows.put(row.clone());
        } else {
            self.hot.rows.forget(row.seq);
        }
    }

    /// The row of `id` as readers see it: with its lease or promotion held in memory
    /// applied. Either keeps its row's `seq`, so that row is read by it, not through the
    /// id's index.
    fn row_seen(&self, id: &MessageId) -> Result<Row, StoreError> {
        let key = id.to_string();
        let lease = self.hot.get(&key);
        let promotion = self.hot.promotion(&key);
        let Some(seq) = lease.map(|l| l.seq).or(promotion.map(|p| p.key.seq())) else {
            return self.stored_row(id);
        };
        if let Some((kept, shown)) = lease.and_then(MemLease::kept_shown) {
            self.check_kept(kept)?;
            return Ok(shown);
        }
        let mut row = self
            .stored_row_at(seq)?
            .filter(|r| r.id == key)
            .ok_or(StoreError::NotFound(key))?;
        if let Some(lease) = lease {
            hot::overlay(&mut row, &lease.view());
        } else if let Some(p) = promotion {
            hot::overlay_due(&mut row, &hot::due_view(p));
        }
        Ok(row)
    }

    /// The row at `seq` as it is on disk, if any.
    fn stored_row_at(&self, seq: i64) -> Result<Option<Row>, StoreError> {
        self.one_row(
            concat!("SELECT ", columns!(), " FROM messages WHERE seq = ?1"),
            seq,
        )
    }

    /// The row of `id` as it is on disk.
    fn stored_row(&self, id: &MessageId) -> Result<Row, StoreError> {
        let key = id.to_string();
        self.one_row(
            concat!("SELECT ", columns!(), " FROM messages WHERE id = ?1"),
            &key,
        )?
        .ok_or(StoreError::NotFound(key))
    }

    /// The row `sql` (a select of [`columns!`] by one key) finds for `key`, if any.
    fn one_row(&self, sql: &str, key: impl rusqlite::ToSql) -> Result<Option<Row>, StoreError> {
        self.conn
            .prepare_cached(sql)
            .db()?
            .query_row([key], crate::row::from_sql)
            .optional()
            .db()
    }

    /// Note a push message's waits before its attempt `attempt` (one entry per wait episode
    /// and reason: [`redrive_core::note_wait`] updates the episode's entry in place).
    fn note_waits(
        &self,
        seq: i64,
        attempt: u32,
        waits: &[Waited],
        now: Timestamp,
    ) -> Result<(), StoreError> {
        if waits.is_empty() {
            return Ok(());
        }
        let mut history = self.history(seq)?;
        for wait in waits {
            redrive_core::note_wait(&mut history, attempt, *wait, now);
        }
        self.conn
            .prepare_cached("UPDATE messages SET history = ?2 WHERE seq = ?1")
            .db()?
            .execute(params![seq, serde_json::to_string(&history)?])
            .db()?;
        Ok(())
    }

    /// The history of the message at `seq`, parsed.
    fn history(&self, seq: i64) -> Result<Vec<HistoryEntry>, StoreError> {
        let text: String = self
            .conn
            .prepare_cached("SELECT history FROM messages WHERE seq = ?1")
            .db()?
            .query_row([seq], |r| r.get(0))
            .db()?;
        Ok(serde_json::from_str(&text)?)
    }

    fn append_history(&self, seq: i64, entry: &HistoryEntry) -> Result<(), StoreError> {
        let json = serde_json::to_string(entry)?;
        self.conn
            .prepare_cached(
                "UPDATE messages SET history = redrive_history_append(history, ?2) WHERE seq = ?1",
            )
            .db()?
            .execute(params![seq, json])
            .db()?;
        Ok(())
    }

    // ---- transitions ----

    pub fn publish(
        &mut self,
        items: Vec<NewMessage>,
        now: Timestamp,
    ) -> Result<Vec<Published>, StoreError> {
        let mut out = Vec::with_capacity(items.len());
        for (index, mut item) in items.into_iter().enumerate() {
            let payload = serde_json::to_string(&item.payload)?;
            let fingerprint = format!("{:016x}", fnv1a(payload.as_bytes()));
            if let Some(ikey) = &item.idempotency_key {
                let found: Option<(String, String, Option<String>, i64)> = self
                    .conn
                    .prepare_cached(
                        "SELECT message_id, fingerprint, tombstone, expires_at FROM idempotency \
                         WHERE queue = ?1 AND ikey = ?2 AND expires_at > ?3",
                    )
                    .db()?
                    .query_row(params![item.queue, ikey, now.as_millis()], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                    })
                    .optional()
                    .db()?;
                if let Some((mid, fp, tombstone, expires_at)) = found {
                    if fp != fingerprint {
                        return Err(StoreError::IdempotencyConflict {
                            index,
                            key: ikey.clone(),
                        });
                    }
                    let id: MessageId = mid
                        .parse()
                        .map_err(|e: redrive_core::IdError| StoreError::Backend(e.to_string()))?;
                    match self.row_seen(&id) {
                        Ok(row) => {
                            out.push(Published {
                                message: row.to_message(None, None)?,
                                replayed: true,
                                failure: None,
                            });
                            continue;
                        }
                        // Purged (an operator's delete removes the record too): the key
                        // outlives its message, so answer what the record remembers.
                        Err(StoreError::NotFound(_)) => {
                            out.push(Published {
                                message: crate::idempotency::purged_message(
                                    id,
                                    &item,
                                    tombstone.as_deref(),
                                    expires_at,
                                    self.idempotency_window_ms,
                                )?,
                                replayed: true,
                                failure: None,
                            });
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            let id = MessageId::new();
            let mut row = Row {
                seq: 0,
                id: id.to_string(),
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
                last_error: None,
                target_url: item.target_url.clone(),
                life: Lifecycle::published(item.deliver_at, now),
            };
            let mut history = Vec::new();
            let mut failure_outcome = None;
            if let Some(failure) = &item.failed {
                let policy = &self.catalog.get(&row.queue).retry;
                let failed = rules::publish_failed(
                    &mut row.life,
                    policy,
                    failure,
                    item.attempts_before,
                    item.deliver_at,
                    now,
                    &mut self.rng,
                );
                row.last_error = Some(serde_json::to_string(&failed.last_error)?);
                history.push(failed.entry);
                failure_outcome = Some((failed.class, failed.retry_delay_ms));
            }
            let history_json = serde_json::to_string(&history)?;
            row.seq = self.insert(
                &row,
                item.failed.as_ref().map(|f| f.class.as_str()),
                &history_json,
            )?;
            self.settle_key(&row.queue, row.key.as_deref(), row.seq)?;
            if let Some(ikey) = &item.idempotency_key {
                self.conn
                    .prepare_cached(
                        "INSERT OR REPLACE INTO idempotency (queue, ikey, message_id, fingerprint, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                    ).db()?
                    .execute(params![
                        item.queue,
                        ikey,
                        row.id,
                        fingerprint,
                        now.plus_ms(self.idempotency_window_ms).as_millis()
                    ]).db()?;
            }
            if item.failed.is_none() {
                self.keep_row(&row);
            }
            self.moved(&row.queue, None, Some(row.life.state));
            self.place_ready(&row);
            self.wake_if_scheduled(&row)?;
            let message =
                row.to_message(Some(&history_json), Some(std::mem::take(&mut item.payload)))?;
            let failure = match failure_outcome {
                Some((class, delay)) => Some(FailureOutcome {
                    message: message.clone(),
                    class,
                    retry_delay_ms: delay,
                    dead_reason: message.dead_reason,
                }),
                None => None,
            };
            out.push(Published {
                message,
                replayed: false,
                failure,
            });
        }
        Ok(out)
    }

    fn insert(
        &self,
        row: &Row,
        error_class: Option<&str>,
        history: &str,
    ) -> Result<i64, StoreError> {
        let order = key_order::initial(
            Mode::of(self.catalog.get(&row.queue)),
            row.key.as_deref(),
            row.life.state,
        );
        self.conn
            .prepare_cached(
                "INSERT INTO messages (id, queue, state, priority, due_at, msg_key, idempotency_key, payload, headers, \
                 attempts, budget_base, uncounted, prev_delay_ms, created_at, updated_at, finished_at, dead_reason, \
                 error_class, last_error, history, key_order, target_url) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 0, ?11, ?12, ?13, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)",
            ).db()?
            .execute(params![
                row.id,
                row.queue,
                row.life.state.code(),
                row.priority,
                ms(row.life.due_at),
                row.key,
                row.idempotency_key,
                row.payload,
                row.headers,
                row.life.attempts,
                row.life.uncounted,
                delay_ms(row.life.prev_delay_ms),
                row.life.created_at.as_millis(),
                ms(row.life.finished_at),
                row.life.dead_reason.map(|r| r.as_str()),
                error_class,
                row.last_error,
                history,
                order,
                row.target_url,
            ]).db()?;
        Ok(self.conn.last_insert_rowid())
    }

    /// A failed attempt of a leased (or returned) row: the rules decide, this writes.
    fn fail_attempt(
        &mut self,
        mut row: Row,
        failure: &Failure,
        response: Option<&AttemptResponse>,
        end: AttemptEnd,
        now: Timestamp,
    ) -> Result<FailedRow, StoreError> {
        let from = row.life.state;
        let policy = &self.catalog.get(&row.queue).retry;
        let failed = rules::fail(&mut row.life, policy, failure, end, now, &mut self.rng);
        self.write_failed(row, from, failed, response)
    }

    /// Write a failed attempt the rules applied to `row` (it was in state `from`).
    fn write_failed(
        &mut self,
        mut row: Row,
        from: State,
        failed: FailedAttempt,
        response: Option<&AttemptResponse>,
    ) -> Result<FailedRow, StoreError> {
        let FailedAttempt {
            mut entry,
            last_error,
            class,
            retry_delay_ms,
        } = failed;
        entry.response = response.cloned();
        row.last_error = Some(serde_json::to_string(&last_error)?);
        let life = &row.life;
        // A lease held in memory (the row is `ready` on disk, as before it) is written with
        // the failure, in the one statement: its columns, and only onto the row as it left it.
        let held = self.hot.get(&row.id).cloned();
        let n = self.conn
            .prepare_cached(
                "UPDATE messages SET state = ?2, due_at = ?3, prev_delay_ms = ?4, uncounted = ?5, updated_at = ?6, \
                 finished_at = ?7, dead_reason = ?8, error_class = ?9, last_error = ?10, \
                 history = redrive_history_append(history, ?11), lease_end = ?12, \
                 attempts = coalesce(?13, attempts), lease_token = coalesce(?14, lease_token), \
                 leased_at = coalesce(?15, leased_at), lease_expires_at = coalesce(?16, lease_expires_at) \
                 WHERE seq = ?1 AND (?13 IS NULL OR (state = ?17 AND attempts = ?13 - 1))",
            ).db()?
            .execute(params![
                row.seq,
                life.state.code(),
                ms(life.due_at),
                delay_ms(life.prev_delay_ms),
                life.uncounted,
                life.updated_at.as_millis(),
                ms(life.finished_at),
                life.dead_reason.map(|r| r.as_str()),
                class.as_str(),
                row.last_error,
                serde_json::to_string(&entry)?,
                life.lease_end.map(LeaseEnd::as_str),
                held.as_ref().map(|h| h.attempt),
                held.as_ref().map(|h| h.token.as_str()),
                held.as_ref().map(|h| h.leased_at),
                held.as_ref().map(|h| h.expires_at),
                held.as_ref().map(|h| h.disk_state().code()),
            ]).db()?;
        if held.is_some() {
            if n != 1 {
                return Err(lease_lost(&row.id));
            }
            self.hot.end(&row.id);
        }
        self.keep_row(&row);
        self.moved(&row.queue, Some(from), Some(row.life.state));
        self.place_ready(&row);
        self.settle_key(&row.queue, row.key.as_deref(), row.seq)?;
        self.wake_if_scheduled(&row)?;
        Ok(FailedRow {
            row,
            class,
            retry_delay_ms,
        })
    }

    pub fn lease(
        &mut self,
        req: &LeaseRequest,
        now: Timestamp,
    ) -> Result<Vec<LeasedRow>, StoreError> {
        if self.leases_in_memory(&req.queue) {
            return self.lease_hot(req, now);
        }
        let sql = lease_sql(Mode::of(self.catalog.get(&req.queue)));
        let max = match req.max_bytes {
            Some(budget) if req.max > 1 => self.fitting_lease(req, budget)?,
            _ => req.max.max(1),
        };
        let expires = now.plus_ms(req.lease_ms);
        let nonce = format!("{:016x}", self.rng.next_u64() ^ self.epoch);
        let mut rows: Vec<Row> = self
            .conn
            .prepare_cached(sql)
            .db()?
            .query_map(
                params![req.queue, max, nonce, now.as_millis(), expires.as_millis()],
                crate::row::from_sql,
            )
            .db()?
            .collect::<Result<_, _>>()
            .db()?;
        // RETURNING has no order: restore the lease order.
        rows.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then(a.life.due_at.cmp(&b.life.due_at))
                .then(a.seq.cmp(&b.seq))
        });
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            out.push(self.handed_out(row, now, expires));
        }
        if !out.is_empty() {
            self.wake_at(expires.as_millis());
        }
        Ok(out)
    }

    /// A row just leased (`leased` already), as the lease's answer: counted as moved from
    /// `ready`, with its lateness and its attempt budget.
    fn handed_out(&mut self, row: Row, now: Timestamp, expires: Timestamp) -> LeasedRow {
        let lateness_ms = now.as_millis() - row.life.due_at.unwrap_or(now).as_millis();
        self.moved(&row.queue, Some(State::Ready), Some(State::Leased));
        let max_attempts = row.life.max_attempts(&self.catalog.get(&row.queue).retry);
        LeasedRow {
            row,
            expires_at: expires,
            lateness_ms,
            max_attempts,
        }
    }

    /// A lease held in memory (`hot.rs`): the queue's next candidates, each checked against
    /// its row (read for its payload anyway), leased without writing the row.
    fn lease_hot(
        &mut self,
        req: &LeaseRequest,
        now: Timestamp,
    ) -> Result<Vec<LeasedRow>, StoreError> {
        let want = req.max.max(1) as usize;
        let budget = req.max_bytes.filter(|_| req.max > 1);
        let expires = now.plus_ms(req.lease_ms);
        let nonce = format!("{:016x}", self.rng.next_u64() ^ self.epoch);
        let mut out: Vec<LeasedRow> = Vec::with_capacity(want);
        let mut used = 0u64;
        while out.len() < want {
            let Some((key, promoted)) = self.hot.first_candidate(&self.conn, &req.queue)? else {
                break;
            };
            let row = match self.hot.rows.take(key.seq()) {
                Some(kept) => {
                    self.check_kept(&kept)?;
                    Some(kept)
                }
                None => self.stored_row_at(key.seq())?,
            };
            // A promoted candidate's row is `scheduled` on disk, as the tick found it.
            let promoted_at = match (&row, promoted) {
                (Some(r), true) => self
                    .hot
                    .promotion(&r.id)
                    .filter(|p| p.key == key && r.life.state == State::Scheduled)
                    .map(|p| p.at),
                _ => None,
            };
            let Some(mut row) = row.filter(|r| {
                r.queue == req.queue
                    && self.hot.get(&r.id).is_none()
                    && if promoted {
                        promoted_at.is_some()
                    } else {
                        r.life.state == State::Ready
                    }
            }) else {
                if promoted {
                    self.hot.drop_promoted(&req.queue, &key);
                } else {
                    self.hot.drop_candidate(&req.queue, &key);
                }
                continue;
            };
            if !promoted && Key::of_row(&row) != key {
                // Ready at another place than the candidate says: take it from there.
                self.hot.drop_candidate(&req.queue, &key);
                self.hot.made_ready(&req.queue, Key::of_row(&row));
                continue;
            }
            if let Some(budget) = budget {
                let size = (row.payload.len()
                    + row.headers.as_ref().map_or(0, String::len)
                    + row.last_error.as_ref().map_or(0, String::len)
                    + row.key.as_ref().map_or(0, String::len)) as u64;
                used = used.saturating_add(size);
                if used > budget && !out.is_empty() {
                    break;
                }
            }
            let attempt = row.life.attempts.saturating_add(1);
            let kept = self.hot.rows.for_lease(&row);
            let lease = MemLease {
                seq: row.seq,
                queue: row.queue.clone(),
                token: format!("{attempt}-{nonce}"),
                attempt,
                leased_at: now.as_millis(),
                expires_at: expires.as_millis(),
                promoted_at,
                row: kept,
            };
            hot::overlay(&mut row, &lease.view());
            let id = row.id.clone();
            self.hot.lease(&id, key, lease);
            out.push(self.handed_out(row, now, expires));
        }
        if !out.is_empty() {
            self.wake_at(expires.as_millis());
        }
        Ok(out)
    }

    /// How many of the next `req.max` leasable messages fit in `budget` bytes of stored
    /// JSON (at least one): the same index range scan as the lease's pick, reading sizes.
    fn fitting_lease(&self, req: &LeaseRequest, budget: u64) -> Result<u32, StoreError> {
        let sizes: Vec<i64> = self
            .conn
            .prepare_cached(
                "SELECT octet_length(payload) + ifnull(octet_length(headers), 0) \
                 + ifnull(octet_length(last_error), 0) + ifnull(octet_length(msg_key), 0) \
                 FROM messages WHERE queue = ?1 AND state = 1 AND key_order IS NOT 1 \
                 ORDER BY priority DESC, due_at, seq LIMIT ?2",
            )
            .db()?
            .query_map(params![req.queue, req.max], |r| r.get(0))
            .db()?
            .collect::<Result<_, _>>()
            .db()?;
        let mut used = 0u64;
        let mut n = 0u32;
        for size in sizes {
            used = used.saturating_add(size.max(0) as u64);
            if used > budget && n > 0 {
                break;
            }
            n += 1;
        }
        Ok(n.max(1))
    }

    /// The row of a lease held in memory with `lease`'s token, as the lease shows it and
    /// checked live ([`Self::check_lease`]); `None` when no such lease is held here.
    fn held_row(&self, lease: &LeaseRef, now: Timestamp) -> Result<Option<Row>, StoreError> {
        let id = lease.id.to_string();
        if self.hot.get(&id).is_none_or(|m| m.token != lease.token) {
            return Ok(None);
        }
        let row = self.row_seen(&lease.id)?;
        self.check_lease(&row, &lease.token, now)?;
        Ok(Some(row))
    }

    /// The row of a lease, if `lease` is the message's live lease.
    fn leased_row(&mut self, lease: &LeaseRef, now: Timestamp) -> Result<Row, StoreError> {
        let row = self.row_by_id(&lease.id)?;
        self.check_lease(&row, &lease.token, now)?;
        Ok(row)
    }

    /// [`rules::check_lease`]: the history is read only for a row from before schema v7
    /// whose lease ended (it has no `lease_end`), so it costs nothing on the way of a live
    /// lease.
    fn check_lease(&self, row: &Row, token: &str, now: Timestamp) -> Result<(), StoreError> {
        rules::check_lease(&row.life, row.lease_token.as_deref(), token, now, || {
            self.history(row.seq)
        })
    }

    pub fn ack(&mut self, ack: &Ack, now: Timestamp) -> Result<AckedRow, StoreError> {
        let lease = &ack.lease;
        let id = lease.id.to_string();
        // A live lease held in memory: its row is `ready` on disk, as the lease found it.
        let held = self
            .hot
            .get(&id)
            .filter(|m| m.token == lease.token && m.expires_at > now.as_millis())
            .cloned();
        if !ack.waited.is_empty() {
            // Before the attempt's entry; only for the live lease (the fast path's condition
            // below: a retried ack notes nothing, and a refused one is named after it).
            let live: Option<(i64, u32)> = match &held {
                Some(h) => Some((h.seq, h.attempt)),
                None => self
                    .conn
                    .prepare_cached(
                        "SELECT seq, attempts FROM messages \
                         WHERE id = ?1 AND lease_token = ?2 AND state = 2 AND lease_expires_at > ?3",
                    )
                    .db()?
                    .query_row(params![id, lease.token, now.as_millis()], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .optional()
                    .db()?,
            };
            if let Some((seq, attempts)) = live {
                self.note_waits(seq, attempts, &ack.waited, now)?;
            }
        }
        let response = ack
            .response
            .as_ref()
            .map(serde_json::to_string)
            .transpose()?;
        // Fast path, one statement: the live lease is acked and its history entry appended
        // (spliced in as text: `history.rs`). The entry's timestamps are `Timestamp`'s text:
        // rendered here when known (`?4`, and `?12` for a lease held in memory), else by
        // SQLite in the same format (`strftime` was 2 % of the writer's time at 16 × 100).
        // A lease held in memory (`?7`…`?9`: its attempt, start and expiry) is written with
        // it, onto the row only as the lease left it, found by the `seq` the lease keeps
        // (`?10`; else through the id's index).
        let params = params![
            id,
            lease.token,
            now.as_millis(),
            now.to_rfc3339(),
            response,
            ack.event.as_str(),
            held.as_ref().map(|h| h.attempt),
            held.as_ref().map(|h| h.leased_at),
            held.as_ref().map(|h| h.expires_at),
            held.as_ref().map(|h| h.seq),
            held.as_ref().map(|h| h.disk_state().code()),
            held.as_ref()
                .map(|h| Timestamp::from_millis(h.leased_at).to_rfc3339()),
        ];
        // A lease held in memory with its row (`row_cache.rs`): the row it answers is that
        // row as the statement leaves it, so nothing is read back.
        let fast: Option<Row> = match held.as_ref().and_then(MemLease::kept_shown) {
            Some((_, mut row)) => {
                let n = self
                    .conn
                    .prepare_cached(ack_sql!(""))
                    .db()?
                    .execute(params)
                    .db()?;
                if n == 1 {
                    row.life.state = State::Done;
                    row.life.finished_at = Some(now);
                    row.life.updated_at = now;
                    row.life.lease_end = Some(LeaseEnd::Settled(Settled::Acked));
                    self.check_kept(&row)?;
                    Some(row)
                } else {
                    None
                }
            }
            None => self
                .conn
                .prepare_cached(ack_sql!(concat!(" RETURNING ", columns!())))
                .db()?
                .query_row(params, crate::row::from_sql)
                .optional()
                .db()?,
        };
        if let Some(row) = fast {
            if held.is_some() {
                self.hot.end(&id);
            }
            self.moved(&row.queue, Some(State::Leased), Some(State::Done));
            self.settle_key(&row.queue, row.key.as_deref(), row.seq)?;
            return Ok(AckedRow {
                row,
                repeated: false,
            });
        }
        if held.is_some() {
            return Err(lease_lost(&id));
        }
        // Not the live lease: a retried ack of a done message, or an error to name. The fast
        // path's WHERE is exactly `check_lease`, so this never acks anything itself.
        let row = self.row_by_id(&lease.id)?;
        if row.life.state == State::Done && row.lease_token.as_deref() == Some(lease.token.as_str())
        {
            return Ok(AckedRow {
                row,
                repeated: true, // a retried ack
            });
        }
        self.check_lease(&row, &lease.token, now)?;
        Err(StoreError::Backend(format!(
            "ack of {} matched no row although its lease is live",
            lease.id
        )))
    }

    pub fn nack(&mut self, nack: &Nack, now: Timestamp) -> Result<FailedRow, StoreError> {
        // Held in memory: the failure's write carries the lease's columns (`write_failed`).
        let row = match self.held_row(&nack.lease, now)? {
            Some(row) => row,
            None => self.leased_row(&nack.lease, now)?,
        };
        self.note_waits(row.seq, row.life.attempts, &nack.waited, now)?;
        let end = AttemptEnd::lease(LeaseEnd::Settled(Settled::Nacked));
        self.fail_attempt(row, &nack.failure, nack.response.as_ref(), end, now)
    }

    /// A delivered attempt came back failed: apply the failure to its `done` (or still
    /// `leased`) message, once. `None` when it was already applied.
    pub fn returned(
        &mut self,
        ret: &Returned,
        now: Timestamp,
    ) -> Result<Option<FailedRow>, StoreError> {
        let mut row = self.row_by_id(&ret.id)?;
        if !rules::returned_applies(&row.life, ret.attempt) {
            return Ok(None);
        }
        // Back from done: it is not finished any more (dead sets it again). A leased one's
        // lease ends here, failed; a done one's was acked and stays so.
        let end = match row.life.state {
            State::Leased => {
                // The copy came back before the bridge settled its lease (the broker's
                // confirm and the consumer's reject raced the ack): that the copy exists
                // proves the broker took it, so the history says so before the failure, as
                // it would have had the ack come first.
                self.append_history(
                    row.seq,
                    &HistoryEntry {
                        attempt: row.life.attempts,
                        at: now,
                        leased_at: row.life.leased_at,
                        event: HistoryEvent::Republished,
                        response: None,
                    },
                )?;
                AttemptEnd::lease(LeaseEnd::Settled(Settled::Nacked))
            }
            _ => AttemptEnd::default(),
        };
        row.life.finished_at = None;
        self.fail_attempt(row, &ret.failure, None, end, now)
            .map(Some)
    }

    /// Hand a leased message back unattempted: `ready` (due time kept, so it keeps its
    /// place) or `scheduled` until `until`, with the lease's attempt taken back. A
    /// consumer's release past its bound (`max_rate_limited` uncharged ones since the
    /// publish or the last redrive) is a failed attempt instead (see [`ReleaseBy`]).
    pub fn release(
        &mut self,
        release: &Release,
        now: Timestamp,
    ) -> Result<ReleasedRow, StoreError> {
        let mut row = self.leased_row(&release.lease, now)?;
        // The attempt it waits to make is the one this lease counted (taken back below).
        self.note_waits(row.seq, row.life.attempts, &release.waited, now)?;
        let from = row.life.state;
        let policy = &self.catalog.get(&row.queue).retry;
        match rules::release(&mut row.life, policy, release, now, &mut self.rng) {
            Some(failed) => self
                .write_failed(row, from, failed, None)
                .map(ReleasedRow::Charged),
            None => {
                let life = &row.life;
                self.conn
                    .prepare_cached(
                        "UPDATE messages SET state = ?2, due_at = ?3, attempts = ?4, updated_at = ?5, \
                         lease_expires_at = NULL, lease_end = ?6, released = ?7 WHERE seq = ?1",
                    )
                    .db()?
                    .execute(params![
                        row.seq,
                        life.state.code(),
                        ms(life.due_at),
                        life.attempts,
                        life.updated_at.as_millis(),
                        life.lease_end.map(LeaseEnd::as_str),
                        life.released,
                    ])
                    .db()?;
                self.moved(&row.queue, Some(from), Some(row.life.state));
                self.place_ready(&row);
                self.settle_key(&row.queue, row.key.as_deref(), row.seq)?;
                self.wake_if_scheduled(&row)?;
                Ok(ReleasedRow::Uncharged(row))
            }
        }
    }

    pub fn extend(
        &mut self,
        lease: &LeaseRef,
        by_ms: u64,
        now: Timestamp,
    ) -> Result<Timestamp, StoreError> {
        if let Some(mut row) = self.held_row(lease, now)? {
            // Held in memory: only the expiry moves, nothing is written.
            let new = rules::extend(&mut row.life, by_ms, now);
            self.hot.extend(&row.id, new.as_millis());
            return Ok(new);
        }
        let mut row = self.leased_row(lease, now)?;
        let new = rules::extend(&mut row.life, by_ms, now);
        self.conn
            .prepare_cached(
                "UPDATE messages SET lease_expires_at = ?2, updated_at = ?3 WHERE seq = ?1",
            )
            .db()?
            .execute(params![row.seq, new.as_millis(), now.as_millis()])
            .db()?;
        Ok(new)
    }

    /// Redrive `id`; with `payload`, replace its payload first (an operator's edit); `task`
    /// names the bulk task doing it, for the history.
    pub fn redrive(
        &mut self,
        id: &MessageId,
        payload: Option<&serde_json::Value>,
        task: Option<&str>,
        now: Timestamp,
    ) -> Result<Message, StoreError> {
        let mut row = self.row_by_id(id)?;
        let from = row.life.state;
        let entry = rules::redrive(&mut row.life, payload.is_some(), task, now)?;
        let life = &row.life;
        self.conn
            .prepare_cached(
                "UPDATE messages SET state = ?2, due_at = ?3, updated_at = ?4, budget_base = ?5, uncounted = ?6, \
                 released = ?7, prev_delay_ms = ?8, finished_at = ?9, dead_reason = ?10, window_start = ?11 \
                 WHERE seq = ?1",
            ).db()?
            .execute(params![
                row.seq,
                life.state.code(),
                ms(life.due_at),
                life.updated_at.as_millis(),
                life.budget_base,
                life.uncounted,
                life.released,
                delay_ms(life.prev_delay_ms),
                ms(life.finished_at),
                life.dead_reason.map(|r| r.as_str()),
                ms(life.window_start),
            ]).db()?;
        if let Some(payload) = payload {
            self.conn
                .prepare_cached("UPDATE messages SET payload = ?2 WHERE seq = ?1")
                .db()?
                .execute(params![row.seq, serde_json::to_string(payload)?])
                .db()?;
        }
        self.append_history(row.seq, &entry)?;
        self.moved(&row.queue, Some(from), Some(row.life.state));
        self.place_ready(&row);
        self.settle_key(&row.queue, row.key.as_deref(), row.seq)?;
        self.full_message(row.seq)
    }

    pub fn kill(
        &mut self,
        id: &MessageId,
        reason: Option<String>,
        now: Timestamp,
    ) -> Result<Message, StoreError> {
        let mut row = self.row_by_id(id)?;
        let from = row.life.state;
        let entry = rules::kill(&mut row.life, reason, now)?;
        let life = &row.life;
        self.conn
            .prepare_cached(
                "UPDATE messages SET state = ?2, finished_at = ?3, updated_at = ?4, dead_reason = ?5, \
                 lease_end = ?6 WHERE seq = ?1",
            ).db()?
            .execute(params![
                row.seq,
                life.state.code(),
                ms(life.finished_at),
                life.updated_at.as_millis(),
                life.dead_reason.map(|r| r.as_str()),
                life.lease_end.map(LeaseEnd::as_str),
            ]).db()?;
        self.append_history(row.seq, &entry)?;
        self.moved(&row.queue, Some(from), Some(row.life.state));
        self.settle_key(&row.queue, row.key.as_deref(), row.seq)?;
        self.full_message(row.seq)
    }

    pub fn delete(&mut self, id: &MessageId) -> Result<Message, StoreError> {
        let row = self.row_by_id(id)?;
        let message = self.full_message(row.seq)?;
        self.conn
            .prepare_cached("DELETE FROM messages WHERE seq = ?1")
            .db()?
            .execute([row.seq])
            .db()?;
        if let Some(ikey) = &row.idempotency_key {
            self.conn
                .prepare_cached(
                    "DELETE FROM idempotency WHERE queue = ?1 AND ikey = ?2 AND message_id = ?3",
                )
                .db()?
                .execute(params![row.queue, ikey, row.id])
                .db()?;
        }
        self.moved(&row.queue, Some(row.life.state), None);
        self.settle_key(&row.queue, row.key.as_deref(), row.seq)?;
        Ok(message)
    }

    /// Delete the idempotency records of `keys` in `queue` (see
    /// [`redrive_storage::Store::forget_idempotency_keys`]).
    pub fn forget_idempotency_keys(
        &mut self,
        queue: &str,
        keys: &[String],
    ) -> Result<u64, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("DELETE FROM idempotency WHERE queue = ?1 AND ikey = ?2")
            .db()?;
        let mut n = 0u64;
        for k in keys {
            n += stmt.execute(params![queue, k]).db()? as u64;
        }
        Ok(n)
    }

    fn full_message(&self, seq: i64) -> Result<Message, StoreError> {
        let sql = concat!(
            "SELECT ",
            columns!(),
            ", history FROM messages WHERE seq = ?1"
        );
        let (row, history): (Row, String) = self
            .conn
            .prepare_cached(sql)
            .db()?
            .query_row([seq], |r| {
                Ok((
                    crate::row::from_sql(r)?,
                    r.get(crate::schema::HISTORY_COLUMN)?,
                ))
            })
            .db()?;
        row.to_message(Some(&history), None)
    }

    pub fn tick(&mut self, now: Timestamp) -> Result<TickOutcome, StoreError> {
        let t = now.as_millis();
        let catalog = Arc::clone(&self.catalog);
        let in_memory = |q: &str| held_in_memory(&catalog, q);
        let promoted = promotion::promote(
            &self.conn,
            &mut self.due,
            &mut self.hot,
            &in_memory,
            t,
            promotion::TICK_PROMOTE_LIMIT,
        )?;
        let mut more = promoted.more;
        let mut ready_queues: Vec<String> = Vec::new();
        for q in std::mem::take(&mut self.promoted_elsewhere) {
            if !ready_queues.contains(&q) {
                ready_queues.push(q);
            }
        }
        for (q, n) in promoted.per_queue {
            for _ in 0..n {
                self.moved(&q, Some(State::Scheduled), Some(State::Ready));
            }
            if !ready_queues.contains(&q) {
                ready_queues.push(q);
            }
        }
        for (q, keys) in promoted.made_ready {
            if self.leases_in_memory(&q) {
                for key in keys {
                    self.hot.made_ready(&q, key);
                }
            }
        }
        let sql = concat!(
            "SELECT ",
            columns!(),
            " FROM messages WHERE state = 2 AND lease_expires_at <= ?1 ORDER BY lease_expires_at LIMIT ?2"
        );
        let mut expired_rows: Vec<Row> = self
            .conn
            .prepare_cached(sql)
            .db()?
            .query_map(params![t, TICK_EXPIRE_LIMIT], crate::row::from_sql)
            .db()?
            .collect::<Result<_, _>>()
            .db()?;
        more |= expired_rows.len() as i64 >= TICK_EXPIRE_LIMIT;
        // Then the leases held in memory: their rows as the leases show them (the failure
        // writes the lease's columns with it, `write_failed`).
        let left = (TICK_EXPIRE_LIMIT as usize).saturating_sub(expired_rows.len());
        let mut held = self.hot.expired(t, left + 1);
        if held.len() > left {
            more = true;
            held.truncate(left);
        }
        for id in held {
            let id: MessageId = id
                .parse()
                .map_err(|e: redrive_core::IdError| StoreError::Backend(e.to_string()))?;
            expired_rows.push(self.row_seen(&id)?);
        }
        let mut expired = Vec::with_capacity(expired_rows.len());
        let lease_expired = Failure::lease_expired();
        for row in expired_rows {
            let outcome = self
                .fail_attempt(
                    row,
                    &lease_expired,
                    None,
                    AttemptEnd::lease(LeaseEnd::Expired),
                    now,
                )?
                .into_outcome()?;
            if outcome.message.state == State::Ready
                && !ready_queues.contains(&outcome.message.queue)
            {
                ready_queues.push(outcome.message.queue.clone());
            }
            expired.push(outcome);
        }
        let next = if more { Some(t) } else { self.next_wake()? };
        self.job_wake = None;
        self.job_exact_wake = Some(next);
        Ok(TickOutcome {
            ready_queues,
            expired,
            next_wake: next.map(Timestamp::from_millis),
            more,
        })
    }

    pub fn purge(
        &mut self,
        now: Timestamp,
        done_retention_ms: u64,
    ) -> Result<PurgeOutcome, StoreError> {
        let cutoff = now
            .as_millis()
            .saturating_sub(done_retention_ms.min(i64::MAX as u64) as i64);
        let purged: Vec<(String, Option<PurgedKey>)> = self
            .conn
            .prepare_cached(
                "DELETE FROM messages WHERE seq IN \
                 (SELECT seq FROM messages WHERE state = 3 AND finished_at < ?1 LIMIT ?2) \
                 RETURNING queue, idempotency_key, id, created_at, updated_at, finished_at, attempts, \
                 priority, msg_key, headers",
            ).db()?
            .query_map(params![cutoff, PURGE_LIMIT], |r| {
                let ikey: Option<String> = r.get(1)?;
                let facts = match ikey {
                    None => None,
                    Some(ikey) => {
                        let headers: Option<String> = r.get(9)?;
                        Some((ikey, r.get(2)?, Tombstone {
                            created_at: r.get(3)?,
                            updated_at: r.get(4)?,
                            finished_at: r.get(5)?,
                            attempts: r.get(6)?,
                            priority: r.get(7)?,
                            key: r.get(8)?,
                            headers: match headers {
                                Some(h) => serde_json::from_str(&h).map_err(|e| {
                                    rusqlite::Error::FromSqlConversionFailure(9, rusqlite::types::Type::Text, Box::new(e))
                                })?,
                                None => Default::default(),
                            },
                        }))
                    }
                };
                Ok((r.get(0)?, facts))
            }).db()?
            .collect::<Result<_, _>>().db()?;
        let more = purged.len() as i64 >= PURGE_LIMIT;
        // The key outlives the message (SPEC §4): its record keeps what a replay answers.
        for (q, facts) in &purged {
            if let Some((ikey, id, tombstone)) = facts {
                self.conn
                    .prepare_cached(
                        "UPDATE idempotency SET tombstone = ?4 WHERE queue = ?1 AND ikey = ?2 AND message_id = ?3",
                    ).db()?
                    .execute(params![q, ikey, id, serde_json::to_string(tombstone)?]).db()?;
            }
        }
        let mut per_queue: Vec<(String, u64)> = Vec::new();
        for (q, _) in purged {
            self.moved(&q, Some(State::Done), None);
            match per_queue.iter_mut().find(|(n, _)| *n == q) {
                Some((_, c)) => *c += 1,
                None => per_queue.push((q, 1)),
            }
        }
        let idem = self
            .conn
            .prepare_cached("DELETE FROM idempotency WHERE expires_at <= ?1")
            .db()?
            .execute([now.as_millis()])
            .db()?;
        Ok(PurgeOutcome {
            done_deleted: per_queue,
            idempotency_deleted: idem as u64,
            more,
        })
    }
}

/// Whether `queue`'s leases and due rows are held in memory (`hot.rs`): it has no per-key
/// ordering.
fn held_in_memory(catalog: &QueueCatalog, queue: &str) -> bool {
    Mode::of(catalog.get(queue)) == Mode::Unordered
}

/// How far a request's clock may be behind the tick's for a message it schedules behind the
/// rows held in memory to be promoted at once ([`WriterState::wake_if_scheduled`]): a
/// request waits in the writer's queue for milliseconds, not for a second. Past it, the clock
/// was set back, and the message waits for its due time instead.
const BEHIND_HOLD_SKEW_MS: i64 = 1_000;

/// A lease held in memory whose row is not as the lease left it: nothing else writes a
/// ready row of an unordered queue without ending its lease first (a defect if seen).
fn lease_lost(id: &str) -> StoreError {
    StoreError::Backend(format!(
        "the lease of {id} held in memory no longer matches its row"
    ))
}

/// A time column's value.
fn ms(t: Option<Timestamp>) -> Option<i64> {
    t.map(Timestamp::as_millis)
}

/// `prev_delay_ms`'s value.
fn delay_ms(d: Option<u64>) -> Option<i64> {
    d.map(|d| d.min(i64::MAX as u64) as i64)
}

/// The lease statement for a queue ordered by `mode`.
///
/// One statement leases the whole batch: pick the ready rows (subquery), mark them
/// leased, return them. SET expressions see the row as it was, so the token's attempt
/// number is the new one. The token is `attempt-random`, random per lease call: it
/// differs between any two leases of one message, which is all fencing needs.
///
/// Under `ordering = "key"`, a ready message of a key is leasable when no earlier
/// message of its key is pending (scheduled, ready, leased; dead too under `block`)
/// and no message of its key at all is leased: an older message redriven while a
/// later one is out must wait for it (one lease per key, SPEC §4). `key_order.rs`
/// keeps that answer in `key_order` (1: must wait), and `ix_ready` leaves those
/// rows out, so the pick is the same index range scan with or without ordering and
/// never walks a key's backlog. A leased head makes its key wait (`key_order` 1).
pub(crate) fn lease_sql(mode: Mode) -> &'static str {
    macro_rules! lease_sql {
        ($set:literal) => {
            concat!(
                "UPDATE messages SET state = 2, attempts = attempts + 1, \
                 lease_token = (attempts + 1) || '-' || ?3, leased_at = ?4, lease_expires_at = ?5, \
                 lease_end = NULL, updated_at = ?4", $set, " WHERE seq IN (SELECT seq FROM messages WHERE queue = ?1 \
                 AND state = 1 AND key_order IS NOT 1 ORDER BY priority DESC, due_at, seq LIMIT ?2) \
                 RETURNING ", columns!()
            )
        };
    }
    match mode {
        Mode::Unordered => lease_sql!(""),
        Mode::Skip | Mode::Block => {
            lease_sql!(", key_order = CASE WHEN key_order IS NULL THEN NULL ELSE 1 END")
        }
    }
}
