//! Leases in memory: on a queue without per-key ordering a lease writes no row.
//!
//! A retry cycle used to rewrite its row five times; two of those were leases, each an
//! `UPDATE` that moved the row from `ix_ready` to `ix_leased` and wrote their pages into
//! the WAL at the next commit, on the one writer thread every queue shares. SPEC §4 asks
//! a lease for no durability (a crash between delivery and ack repeats the delivery), so
//! a lease is now kept here, by the writer, and the row stays as it was before the lease:
//! `ready`, with the attempt count of before. What a lease would have written is applied
//! to the row when it is read ([`overlay`]), so every rule, every answer and every read
//! sees the message `leased`, with its token, attempt and expiry, exactly as before.
//!
//! - **Which rows may be leased** ([`Window`]): per queue, the first leasable ready rows
//!   in claim order (priority, due time, seq), at most [`WINDOW_MAX`], loaded from
//!   `ix_ready` and kept true by every transition that makes a row of the queue ready
//!   ([`Hot::made_ready`]); past its bound the window is refilled from the index, after
//!   its last key, so a refill never walks the rows leased in memory. A candidate is
//!   checked against its row when it is leased (the row is read then anyway, for its
//!   payload), so one that left `ready` meanwhile (killed, deleted) is dropped there.
//!   A transition that makes a row ready without saying where it goes resets its queue's
//!   window (counted per job, [`Hot::keep_job`]): slower, never a message left behind.
//! - **A lease ends** when a transition reads its row: the ack's statement writes the
//!   lease's columns with `done` (`transitions.rs::ack`), a nack's or an expiry's with the
//!   failure (`write_failed`), both only onto the row as the lease left it; every other
//!   transition (release, kill, redrive …) first writes the lease into the row as the lease
//!   statement would have (`WriterState::materialize`), then runs as on any leased row. An
//!   extend changes only the expiry here.
//! - **Rollback**: a job's changes here are undone when its savepoint is rolled back
//!   ([`Hot::rollback_job`]); readers see them only after the batch commits
//!   ([`Hot::batch_committed`]), as they see the rows.
//! - **A crash** loses the leases here: their rows are `ready` with the attempt of
//!   before, so they are delivered again with the same attempt number, and the old
//!   tokens are refused (`lease_mismatch`: every token carries the writer's random epoch).
//!   A **close** writes every live lease into its row first (`WriterState::flush_hot`),
//!   so a restart keeps them, as before.
//!
//! Queues with `ordering = "key"` keep the lease statement: their heads are kept in
//! `key_order`, which a lease changes.

use crate::row::Row;
use crate::sql_error::SqlResultExt;
use redrive_core::{State, Timestamp};
use rusqlite::{params, Connection};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// At most this many candidates per queue are kept; past it the window is cut to half.
pub const WINDOW_MAX: usize = 8_192;
/// Candidates read from `ix_ready` per refill.
const REFILL_ROWS: i64 = 1_024;

/// A ready row's place in claim order: higher priority first, then earlier due time,
/// then publish order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    neg_priority: i64,
    due_at: i64,
    seq: i64,
}

impl Key {
    pub fn of(priority: u8, due_at: Option<Timestamp>, seq: i64) -> Self {
        Self {
            neg_priority: -i64::from(priority),
            due_at: due_at.map_or(i64::MIN, Timestamp::as_millis),
            seq,
        }
    }

    pub fn of_row(row: &Row) -> Self {
        Self::of(row.priority, row.life.due_at, row.seq)
    }

    pub fn seq(&self) -> i64 {
        self.seq
    }
}

/// How far a window's candidates are complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    /// Nothing loaded yet.
    Start,
    /// Every leasable ready row up to this key is a candidate or leased here.
    At(Key),
    /// Every leasable ready row of the queue is a candidate or leased here.
    End,
}

/// The leasable ready rows of one queue, in claim order, as far as [`Bound`] says.
#[derive(Debug)]
struct Window {
    set: BTreeSet<Key>,
    upto: Bound,
}

impl Window {
    fn new() -> Self {
        Self {
            set: BTreeSet::new(),
            upto: Bound::Start,
        }
    }

    fn covers(&self, k: &Key) -> bool {
        match self.upto {
            Bound::Start => false,
            Bound::At(u) => *k <= u,
            Bound::End => true,
        }
    }

    fn insert(&mut self, k: Key) {
        if !self.covers(&k) {
            return; // the next refill reads it from the index
        }
        self.set.insert(k);
        if self.set.len() > WINDOW_MAX {
            while self.set.len() > WINDOW_MAX / 2 {
                self.set.pop_last();
            }
            if let Some(last) = self.set.last() {
                self.upto = Bound::At(*last);
            }
        }
    }
}

/// A lease held in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemLease {
    pub seq: i64,
    pub queue: String,
    pub token: String,
    /// The attempt this lease is (the row's `attempts` plus one).
    pub attempt: u32,
    pub leased_at: i64,
    pub expires_at: i64,
}

impl MemLease {
    pub fn view(&self) -> LeaseView {
        LeaseView {
            seq: self.seq,
            token: self.token.clone(),
            attempt: self.attempt,
            leased_at: self.leased_at,
            expires_at: self.expires_at,
        }
    }
}

/// What a reader needs of a lease held in memory to show its row as leased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    pub seq: i64,
    pub token: String,
    pub attempt: u32,
    pub leased_at: i64,
    pub expires_at: i64,
}

/// The leases held in memory as readers see them (by message id): changed after each
/// commit, like the rows.
pub type Views = Arc<Mutex<HashMap<String, LeaseView>>>;

/// Show `row` as its lease made it, when `view` is the lease of the row as it is on disk
/// (`ready`, the attempt before the lease's). Returns whether it applied.
pub fn overlay(row: &mut Row, view: &LeaseView) -> bool {
    if row.life.state != State::Ready || row.life.attempts.checked_add(1) != Some(view.attempt) {
        return false;
    }
    let leased_at = Timestamp::from_millis(view.leased_at);
    row.life.state = State::Leased;
    row.life.attempts = view.attempt;
    row.life.leased_at = Some(leased_at);
    row.life.lease_expires_at = Some(Timestamp::from_millis(view.expires_at));
    row.life.lease_end = None;
    row.life.updated_at = leased_at;
    row.lease_token = Some(view.token.clone());
    true
}

/// A job's change here, to undo if its savepoint is rolled back.
#[derive(Debug)]
enum Undo {
    /// A lease taken from the window (its queue's) at `key`.
    Leased { id: String, key: Key },
    /// A lease ended (acked, or written into its row).
    Ended { id: String, lease: MemLease },
    /// A lease's expiry moved.
    Extended { id: String, before: i64 },
}

/// The leases in memory and the windows they are taken from: owned by the writer.
#[derive(Debug)]
pub struct Hot {
    leases: HashMap<String, MemLease>,
    seqs: HashSet<i64>,
    by_expiry: BTreeSet<(i64, String)>,
    windows: HashMap<String, Window>,
    undo: Vec<Undo>,
    job_views: Vec<(String, Option<LeaseView>)>,
    batch_views: Vec<(String, Option<LeaseView>)>,
    views: Views,
    /// Per queue, the running job's transitions into `ready` less those it placed in the
    /// window ([`Self::moved_ready`], [`Self::made_ready`]).
    job_unplaced: HashMap<String, i64>,
}

impl Hot {
    pub fn new() -> Self {
        Self {
            leases: HashMap::new(),
            seqs: HashSet::new(),
            by_expiry: BTreeSet::new(),
            windows: HashMap::new(),
            undo: Vec::new(),
            job_views: Vec::new(),
            batch_views: Vec::new(),
            views: Arc::new(Mutex::new(HashMap::new())),
            job_unplaced: HashMap::new(),
        }
    }

    /// The readers' view of the leases here.
    pub fn views(&self) -> Views {
        Arc::clone(&self.views)
    }

    pub fn get(&self, id: &str) -> Option<&MemLease> {
        self.leases.get(id)
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// Every lease here (for a close, which writes them into their rows).
    pub fn ids(&self) -> Vec<String> {
        self.leases.keys().cloned().collect()
    }

    /// The earliest expiry of a lease here.
    pub fn next_expiry(&self) -> Option<i64> {
        self.by_expiry.first().map(|(t, _)| *t)
    }

    /// The leases expired at `t`, earliest first, at most `limit`.
    pub fn expired(&self, t: i64, limit: usize) -> Vec<String> {
        self.by_expiry
            .iter()
            .take_while(|(e, _)| *e <= t)
            .take(limit)
            .map(|(_, id)| id.clone())
            .collect()
    }

    // ---- the window ----

    /// The first candidate of `queue`'s window, refilled from `ix_ready` when it is empty
    /// and not complete. `None`: no leasable ready row is left.
    pub fn first_candidate(
        &mut self,
        conn: &Connection,
        queue: &str,
    ) -> Result<Option<Key>, redrive_storage::StoreError> {
        loop {
            let w = self
                .windows
                .entry(queue.to_owned())
                .or_insert_with(Window::new);
            if let Some(k) = w.set.first() {
                return Ok(Some(*k));
            }
            if w.upto == Bound::End {
                return Ok(None);
            }
            refill(conn, queue, w, &self.seqs)?;
        }
    }

    /// Drop a candidate that is not (or no longer) leasable.
    pub fn drop_candidate(&mut self, queue: &str, key: &Key) {
        if let Some(w) = self.windows.get_mut(queue) {
            w.set.remove(key);
        }
    }

    /// A transition made the row at `key` of `queue` leasable (ready, unordered queue).
    pub fn made_ready(&mut self, queue: &str, key: Key) {
        self.count_unplaced(queue, -1);
        if let Some(w) = self.windows.get_mut(queue) {
            w.insert(key);
        }
    }

    /// A transition moved a row of `queue` into `ready` (counted against [`Self::made_ready`]).
    pub fn moved_ready(&mut self, queue: &str) {
        self.count_unplaced(queue, 1);
    }

    fn count_unplaced(&mut self, queue: &str, by: i64) {
        match self.job_unplaced.get_mut(queue) {
            Some(n) => *n += by,
            None => {
                self.job_unplaced.insert(queue.to_owned(), by);
            }
        }
    }

    /// Forget what the window of `queue` holds: the next lease loads it from the start.
    fn reset(&mut self, queue: &str) {
        self.windows.remove(queue);
    }

    // ---- leases ----

    /// Lease the candidate `key` of `queue` (its row is message `id`).
    pub fn lease(&mut self, id: &str, key: Key, lease: MemLease) {
        self.drop_candidate(&lease.queue, &key);
        self.undo.push(Undo::Leased {
            id: id.to_owned(),
            key,
        });
        self.insert(id, lease);
    }

    fn insert(&mut self, id: &str, lease: MemLease) {
        self.job_views.push((id.to_owned(), Some(lease.view())));
        self.seqs.insert(lease.seq);
        self.by_expiry.insert((lease.expires_at, id.to_owned()));
        self.leases.insert(id.to_owned(), lease);
    }

    fn remove(&mut self, id: &str) -> Option<MemLease> {
        let lease = self.leases.remove(id)?;
        self.seqs.remove(&lease.seq);
        self.by_expiry.remove(&(lease.expires_at, id.to_owned()));
        self.job_views.push((id.to_owned(), None));
        Some(lease)
    }

    /// End the lease of `id` (acked, or written into its row): it is the row's now.
    pub fn end(&mut self, id: &str) -> Option<MemLease> {
        let lease = self.remove(id)?;
        self.undo.push(Undo::Ended {
            id: id.to_owned(),
            lease: lease.clone(),
        });
        Some(lease)
    }

    /// Move the expiry of the lease of `id`.
    pub fn extend(&mut self, id: &str, expires_at: i64) {
        if let Some(mut lease) = self.remove(id) {
            self.undo.push(Undo::Extended {
                id: id.to_owned(),
                before: lease.expires_at,
            });
            lease.expires_at = expires_at;
            self.insert(id, lease);
        }
    }

    // ---- jobs and batches ----

    /// The running job is kept in the batch. A queue whose row a transition made ready
    /// without placing it in the window has its window reset.
    pub fn keep_job(&mut self) {
        self.undo.clear();
        self.batch_views.append(&mut self.job_views);
        let unplaced = std::mem::take(&mut self.job_unplaced);
        for (q, n) in unplaced {
            if n > 0 {
                tracing::debug!(queue = %q, "a row made ready was not placed: window reset");
                self.reset(&q);
            }
        }
    }

    /// The running job was rolled back: undo what it did here.
    pub fn rollback_job(&mut self) {
        // The view changes were not published: dropping them takes them back.
        self.job_views.clear();
        self.job_unplaced.clear();
        while let Some(u) = self.undo.pop() {
            match u {
                Undo::Leased { id, key } => {
                    if let Some(lease) = self.leases.remove(&id) {
                        self.seqs.remove(&lease.seq);
                        self.by_expiry.remove(&(lease.expires_at, id));
                        if let Some(w) = self.windows.get_mut(&lease.queue) {
                            w.insert(key);
                        }
                    }
                }
                Undo::Ended { id, lease } => {
                    self.seqs.insert(lease.seq);
                    self.by_expiry.insert((lease.expires_at, id.clone()));
                    self.leases.insert(id, lease);
                }
                Undo::Extended { id, before } => {
                    if let Some(lease) = self.leases.get_mut(&id) {
                        self.by_expiry.remove(&(lease.expires_at, id.clone()));
                        lease.expires_at = before;
                        self.by_expiry.insert((before, id));
                    }
                }
            }
        }
    }

    /// The batch committed: readers see its leases now.
    pub fn batch_committed(&mut self) {
        if self.batch_views.is_empty() {
            return;
        }
        let changes = std::mem::take(&mut self.batch_views);
        if let Ok(mut views) = self.views.lock() {
            for (id, v) in changes {
                match v {
                    Some(v) => {
                        views.insert(id, v);
                    }
                    None => {
                        views.remove(&id);
                    }
                }
            }
        }
    }

    /// The batch failed: its changes are not published (the store is poisoned).
    pub fn batch_aborted(&mut self) {
        self.batch_views.clear();
    }
}

impl Default for Hot {
    fn default() -> Self {
        Self::new()
    }
}

const FROM_START: &str = "SELECT seq, priority, due_at FROM messages \
     WHERE queue = ?1 AND state = 1 AND key_order IS NOT 1 \
     ORDER BY priority DESC, due_at, seq LIMIT ?2";
const SAME_PRIORITY_AFTER: &str = "SELECT seq, priority, due_at FROM messages \
     WHERE queue = ?1 AND state = 1 AND key_order IS NOT 1 AND priority = ?2 \
     AND (due_at, seq) > (?3, ?4) ORDER BY due_at, seq LIMIT ?5";
const LOWER_PRIORITY: &str = "SELECT seq, priority, due_at FROM messages \
     WHERE queue = ?1 AND state = 1 AND key_order IS NOT 1 AND priority < ?2 \
     ORDER BY priority DESC, due_at, seq LIMIT ?3";

/// Read the next [`REFILL_ROWS`] leasable ready rows of `queue` after the window's bound
/// into it (rows leased here are skipped: a reset or cut window may read them again).
fn refill(
    conn: &Connection,
    queue: &str,
    w: &mut Window,
    leased: &HashSet<i64>,
) -> Result<(), redrive_storage::StoreError> {
    let read = |sql: &str, args: &[&dyn rusqlite::ToSql]| -> Result<Vec<Key>, _> {
        conn.prepare_cached(sql)
            .db()?
            .query_map(args, |r| {
                let seq: i64 = r.get(0)?;
                let priority: u8 = r.get(1)?;
                let due: Option<i64> = r.get(2)?;
                Ok(Key::of(priority, due.map(Timestamp::from_millis), seq))
            })
            .db()?
            .collect::<Result<Vec<_>, _>>()
            .db()
    };
    let keys = match w.upto {
        Bound::End => return Ok(()),
        Bound::Start => read(FROM_START, params![queue, REFILL_ROWS])?,
        Bound::At(k) => {
            let priority = -k.neg_priority;
            let mut keys = read(
                SAME_PRIORITY_AFTER,
                params![queue, priority, k.due_at, k.seq, REFILL_ROWS],
            )?;
            let left = REFILL_ROWS - keys.len() as i64;
            if left > 0 {
                keys.extend(read(LOWER_PRIORITY, params![queue, priority, left])?);
            }
            keys
        }
    };
    w.upto = match keys.last() {
        Some(last) if keys.len() as i64 >= REFILL_ROWS => Bound::At(*last),
        _ => Bound::End,
    };
    for k in keys {
        if !leased.contains(&k.seq) {
            w.set.insert(k);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(p: u8, due: i64, seq: i64) -> Key {
        Key::of(p, Some(Timestamp::from_millis(due)), seq)
    }

    #[test]
    fn claim_order_is_priority_then_due_then_seq() {
        let mut keys = vec![k(0, 5, 1), k(9, 7, 2), k(9, 3, 3), k(0, 5, 0)];
        keys.sort();
        assert_eq!(keys, vec![k(9, 3, 3), k(9, 7, 2), k(0, 5, 0), k(0, 5, 1)]);
    }

    #[test]
    fn a_window_takes_only_what_it_covers_and_stays_bounded() {
        let mut w = Window::new();
        w.insert(k(0, 1, 1));
        assert!(w.set.is_empty(), "nothing loaded: the refill reads it");
        w.upto = Bound::At(k(0, 10, 10));
        w.insert(k(0, 5, 5));
        w.insert(k(0, 11, 11));
        assert_eq!(w.set.iter().copied().collect::<Vec<_>>(), vec![k(0, 5, 5)]);
        w.upto = Bound::End;
        for i in 0..(WINDOW_MAX as i64 + 1) {
            w.insert(k(0, 100 + i, 100 + i));
        }
        assert!(w.set.len() <= WINDOW_MAX);
        let last = *w.set.last().expect("kept");
        assert_eq!(w.upto, Bound::At(last), "what was cut is past the bound");
    }

    #[test]
    fn a_rolled_back_job_leaves_no_lease_and_its_candidate_back() {
        let mut hot = Hot::new();
        hot.windows.insert(
            "q".into(),
            Window {
                set: [k(0, 1, 1)].into_iter().collect(),
                upto: Bound::End,
            },
        );
        let lease = MemLease {
            seq: 1,
            queue: "q".into(),
            token: "1-x".into(),
            attempt: 1,
            leased_at: 1,
            expires_at: 100,
        };
        hot.lease("m1", k(0, 1, 1), lease.clone());
        assert_eq!(hot.get("m1"), Some(&lease));
        hot.rollback_job();
        assert!(hot.get("m1").is_none());
        assert_eq!(hot.next_expiry(), None);
        assert_eq!(hot.windows["q"].set.len(), 1);
        hot.lease("m1", k(0, 1, 1), lease.clone());
        hot.keep_job();
        hot.extend("m1", 200);
        hot.end("m1");
        hot.rollback_job();
        assert_eq!(
            hot.get("m1"),
            Some(&lease),
            "ended and extended: both undone"
        );
        assert_eq!(hot.expired(150, 10), vec!["m1".to_owned()]);
        hot.batch_committed();
        assert_eq!(hot.views.lock().unwrap()["m1"].expires_at, 100);
    }

    #[test]
    fn overlay_applies_only_to_the_row_as_before_its_lease() {
        let mut row = Row {
            seq: 1,
            id: "m".into(),
            queue: "q".into(),
            priority: 0,
            key: None,
            idempotency_key: None,
            payload: "{}".into(),
            headers: None,
            lease_token: None,
            last_error: None,
            target_url: None,
            life: redrive_storage::rules::Lifecycle::published(None, Timestamp::from_millis(1)),
        };
        let view = LeaseView {
            seq: 1,
            token: "2-x".into(),
            attempt: 2,
            leased_at: 5,
            expires_at: 9,
        };
        assert!(
            !overlay(&mut row.clone(), &view),
            "attempt 0 on disk, lease is 2"
        );
        row.life.attempts = 1;
        assert!(overlay(&mut row, &view));
        assert_eq!(row.life.state, State::Leased);
        assert_eq!(row.life.attempts, 2);
        assert_eq!(row.lease_token.as_deref(), Some("2-x"));
        assert_eq!(row.life.lease_expires_at, Some(Timestamp::from_millis(9)));
        assert!(
            !overlay(&mut row, &view),
            "a leased row is not overlaid again"
        );
    }
}
