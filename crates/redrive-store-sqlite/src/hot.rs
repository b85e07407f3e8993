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
//! - **A crash** loses the leases here: their rows are `ready` (or `scheduled` and due)
//!   with the attempt of before, so they are delivered again with the same attempt number, and the old
//!   tokens are refused (`lease_mismatch`: every token carries the writer's random epoch).
//!   A **close** writes every live lease into its row first (`WriterState::flush_hot`),
//!   so a restart keeps them, as before.
//!
//! - **The due window** ([`Promotion`], `promotion.rs`): the tick's promotion of a due
//!   row writes nothing either. The row stays `scheduled` on disk and is held here as
//!   ready: a lease candidate beside the window (claim order decides between them), shown
//!   `ready` to readers ([`overlay_due`]), counted ready. Per queue, every `scheduled` row
//!   up to a place in `ix_scheduled` order (due time, seq) is held here ([`DueWindow`]), so
//!   the tick's scan and the queue's next due time start after it; a row scheduled at or
//!   before that place (a request whose clock is behind the tick's) is promoted here at once
//!   (`transitions.rs::wake_if_scheduled`; past a second behind, the clock was set back:
//!   the queue's promotions are written into their rows and nothing is held any more).
//!   At most [`DUE_MAX`] unleased rows per queue are held; past that the tick writes its
//!   promotions as before. The lease of a promoted row
//!   is a lease held here whose row is `scheduled` ([`MemLease::promoted_at`]): the ack or
//!   the failure writes the row once, from `scheduled`, instead of twice (promotion, then
//!   ack). Any other transition first writes the promotion (`WriterState::materialize`).
//!   A crash or a close loses the promotions and nothing else: the rows are `scheduled`
//!   and due, and the first tick promotes them again.
//!
//! Queues with `ordering = "key"` keep the lease statement: their heads are kept in
//! `key_order`, which a lease changes.

use crate::row::Row;
use crate::row_cache::RowCache;
use crate::sql_error::SqlResultExt;
use redrive_core::{State, Timestamp};
use rusqlite::{params, Connection};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// At most this many candidates per queue are kept; past it the window is cut to half.
pub const WINDOW_MAX: usize = 8_192;
/// At most this many unleased rows per queue are promoted in memory; past it the tick
/// writes its promotions into their rows, as it does on queues ordered by key.
pub const DUE_MAX: usize = 8_192;
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

    /// Where the row stands in its queue's `ix_scheduled` order: (due time, seq).
    fn due_place(&self) -> (i64, i64) {
        (self.due_at, self.seq)
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
    /// When the row was promoted in memory, if it was ([`Promotion`]): it is `scheduled`
    /// on disk then, not `ready`.
    pub promoted_at: Option<i64>,
    /// The row as it is on disk while this lease is held (as the lease found it), when
    /// there was room for it (`row_cache.rs`): the nack and the ack read nothing then.
    pub row: Option<Arc<Row>>,
}

impl MemLease {
    pub fn view(&self) -> LeaseView {
        LeaseView {
            seq: self.seq,
            token: self.token.clone(),
            attempt: self.attempt,
            leased_at: self.leased_at,
            expires_at: self.expires_at,
            from: self.disk_state(),
        }
    }

    /// The row kept with this lease (`row_cache.rs`): as it is on disk, and as the lease
    /// shows it (`leased`, with its token, attempt and expiry: [`overlay`]).
    pub fn kept_shown(&self) -> Option<(&Row, Row)> {
        let kept = self.row.as_deref()?;
        let mut shown = kept.clone();
        overlay(&mut shown, &self.view());
        Some((kept, shown))
    }

    /// The row's state on disk while this lease is held: the state its write checks.
    pub fn disk_state(&self) -> State {
        if self.promoted_at.is_some() {
            State::Scheduled
        } else {
            State::Ready
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
    /// The row's state on disk while the lease is held ([`MemLease::disk_state`]).
    pub from: State,
}

/// What a reader needs of a row promoted in memory to show it `ready`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueView {
    pub seq: i64,
    pub queue: String,
    pub due_at: i64,
    /// When it was promoted (the row's `updated_at` as a promotion on disk writes it).
    pub at: i64,
}

/// What readers see of the writer's memory: the leases and the promotions held there,
/// by message id. Changed after each commit, like the rows.
#[derive(Debug, Default)]
pub struct Shown {
    pub leases: HashMap<String, LeaseView>,
    pub due: HashMap<String, DueView>,
}

pub type Views = Arc<Mutex<Shown>>;

/// Show `row` as its lease made it, when `view` is the lease of the row as it is on disk
/// (`ready`, or `scheduled` if it was promoted in memory; the attempt before the
/// lease's). Returns whether it applied.
pub fn overlay(row: &mut Row, view: &LeaseView) -> bool {
    if row.life.state != view.from || row.life.attempts.checked_add(1) != Some(view.attempt) {
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

/// Show `row` `ready` when `view` is its promotion in memory and the row is as the
/// promotion found it (`scheduled`, due at the same time). Returns whether it applied.
pub fn overlay_due(row: &mut Row, view: &DueView) -> bool {
    if row.seq != view.seq
        || row.life.state != State::Scheduled
        || row.life.due_at.map(Timestamp::as_millis) != Some(view.due_at)
    {
        return false;
    }
    row.life.state = State::Ready;
    row.life.updated_at = Timestamp::from_millis(view.at);
    true
}

/// A due row made ready in memory: its row stays `scheduled` on disk (the tick wrote
/// nothing), and the lease, ack or failure that follows writes it from there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promotion {
    pub queue: String,
    pub key: Key,
    /// When it was promoted, ms.
    pub at: i64,
}

/// The rows of one queue promoted in memory, and how far its scheduled rows are held.
#[derive(Debug, Default)]
struct DueWindow {
    /// The promoted rows not leased, in claim order, with their message ids.
    set: BTreeMap<Key, String>,
    /// Every `scheduled` row of the queue at or before this (due time, seq) is promoted
    /// here (in `set`, or leased here), and every row promoted here is at or before it:
    /// the tick's scan and the queue's next due time start after it.
    upto: Option<(i64, i64)>,
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
    /// A row promoted in memory.
    Promoted { id: String },
    /// A promotion ended without a lease (written into its row, or dropped).
    Unpromoted { id: String, promotion: Promotion },
    /// A queue's scheduled rows held up to another place.
    Upto {
        queue: String,
        before: Option<(i64, i64)>,
    },
}

/// A change of what readers see, published when its batch commits.
#[derive(Debug)]
enum ViewChange {
    Lease(String, Option<LeaseView>),
    Due(String, Option<DueView>),
}

/// The leases in memory and the windows they are taken from: owned by the writer.
#[derive(Debug)]
pub struct Hot {
    leases: HashMap<String, MemLease>,
    seqs: HashSet<i64>,
    by_expiry: BTreeSet<(i64, String)>,
    windows: HashMap<String, Window>,
    /// The rows promoted in memory, per queue, and the unleased ones by message id.
    dues: HashMap<String, DueWindow>,
    promoted: HashMap<String, Promotion>,
    undo: Vec<Undo>,
    job_views: Vec<ViewChange>,
    batch_views: Vec<ViewChange>,
    views: Views,
    /// Per queue, the running job's transitions into `ready` less those it placed in the
    /// window ([`Self::moved_ready`], [`Self::made_ready`]).
    job_unplaced: HashMap<String, i64>,
    /// Rows as the writer last wrote them, and the budget of the rows kept with leases
    /// (`row_cache.rs`).
    pub rows: RowCache,
}

impl Hot {
    pub fn new() -> Self {
        Self {
            leases: HashMap::new(),
            seqs: HashSet::new(),
            by_expiry: BTreeSet::new(),
            windows: HashMap::new(),
            dues: HashMap::new(),
            promoted: HashMap::new(),
            undo: Vec::new(),
            job_views: Vec::new(),
            batch_views: Vec::new(),
            views: Arc::new(Mutex::new(Shown::default())),
            job_unplaced: HashMap::new(),
            rows: RowCache::default(),
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

    /// The first candidate of `queue`: the first of its window (refilled from `ix_ready`
    /// when it is empty and not complete) or of its rows promoted in memory, whichever
    /// comes first in claim order; `true` for a promoted one. `None`: no leasable ready
    /// row is left.
    pub fn first_candidate(
        &mut self,
        conn: &Connection,
        queue: &str,
    ) -> Result<Option<(Key, bool)>, redrive_storage::StoreError> {
        let stored = loop {
            let w = self
                .windows
                .entry(queue.to_owned())
                .or_insert_with(Window::new);
            if let Some(k) = w.set.first() {
                break Some(*k);
            }
            if w.upto == Bound::End {
                break None;
            }
            refill(conn, queue, w, &self.seqs)?;
        };
        let promoted = self
            .dues
            .get(queue)
            .and_then(|d| d.set.first_key_value())
            .map(|(k, _)| *k);
        Ok(match (stored, promoted) {
            (Some(s), Some(p)) if p < s => Some((p, true)),
            (Some(s), _) => Some((s, false)),
            (None, Some(p)) => Some((p, true)),
            (None, None) => None,
        })
    }

    /// Drop a candidate that is not (or no longer) leasable.
    pub fn drop_candidate(&mut self, queue: &str, key: &Key) {
        if let Some(w) = self.windows.get_mut(queue) {
            w.set.remove(key);
        }
    }

    /// Drop a promoted candidate whose row is not as its promotion found it (nothing
    /// writes such a row without ending its promotion first: a defect if seen).
    pub fn drop_promoted(&mut self, queue: &str, key: &Key) {
        let id = self.dues.get(queue).and_then(|d| d.set.get(key)).cloned();
        if let Some(id) = id {
            tracing::warn!(%queue, message = %id, "a row promoted in memory changed under its promotion");
            self.unpromote(&id);
        }
    }

    /// A transition made the row at `key` of `queue` leasable (ready, unordered queue).
    pub fn made_ready(&mut self, queue: &str, key: Key) {
        self.count_unplaced(queue, -1);
        self.place(queue, key);
    }

    /// The row at `key` of `queue` is ready on disk (it was already counted ready): a
    /// candidate if the window covers it.
    pub fn place(&mut self, queue: &str, key: Key) {
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

    // ---- rows promoted in memory ----

    /// Promote the due row `id` at `key` of `queue` in memory (the tick's promotion, or a
    /// row scheduled where the queue's rows are already held): ready from now on, though
    /// `scheduled` on disk. Counted as placed ([`Self::moved_ready`]).
    pub fn promote(&mut self, id: &str, queue: &str, key: Key, at: i64) {
        self.count_unplaced(queue, -1);
        self.dues
            .entry(queue.to_owned())
            .or_default()
            .set
            .insert(key, id.to_owned());
        let promotion = Promotion {
            queue: queue.to_owned(),
            key,
            at,
        };
        self.job_views
            .push(ViewChange::Due(id.to_owned(), Some(due_view(&promotion))));
        self.promoted.insert(id.to_owned(), promotion);
        self.undo.push(Undo::Promoted { id: id.to_owned() });
    }

    /// Every `scheduled` row of `queue` at or before `place` (due time, seq) is held here.
    pub fn hold_upto(&mut self, queue: &str, place: (i64, i64)) {
        if self.held_upto(queue).is_some_and(|u| u >= place) {
            return;
        }
        self.set_upto(queue, Some(place));
    }

    /// Move how far `queue`'s scheduled rows are held (undone with the job).
    fn set_upto(&mut self, queue: &str, upto: Option<(i64, i64)>) {
        let d = self.dues.entry(queue.to_owned()).or_default();
        let before = std::mem::replace(&mut d.upto, upto);
        self.undo.push(Undo::Upto {
            queue: queue.to_owned(),
            before,
        });
    }

    /// How far `queue`'s scheduled rows are held here ([`DueWindow::upto`]).
    pub fn held_upto(&self, queue: &str) -> Option<(i64, i64)> {
        self.dues.get(queue).and_then(|d| d.upto)
    }

    /// Whether the row at `key` of `queue`, `scheduled`, is where the queue's rows are
    /// held here: it is due, and the tick's scan will not see it.
    pub fn behind_hold(&self, queue: &str, key: &Key) -> bool {
        self.held_upto(queue).is_some_and(|u| key.due_place() <= u)
    }

    /// How many more rows of `queue` may be promoted in memory, at most `want`.
    pub fn promotion_room(&self, queue: &str, want: usize) -> usize {
        let held = self.dues.get(queue).map_or(0, |d| d.set.len());
        DUE_MAX.saturating_sub(held).min(want)
    }

    /// The promotion of `id` held here, if it is promoted and not leased.
    pub fn promotion(&self, id: &str) -> Option<&Promotion> {
        self.promoted.get(id)
    }

    /// End the promotion of `id` without a lease (its row is written `ready`, or it is
    /// dropped): it is no longer here.
    pub fn unpromote(&mut self, id: &str) -> Option<Promotion> {
        let promotion = self.take_promotion(id)?;
        self.job_views.push(ViewChange::Due(id.to_owned(), None));
        self.undo.push(Undo::Unpromoted {
            id: id.to_owned(),
            promotion: promotion.clone(),
        });
        Some(promotion)
    }

    /// The messages of `queue` promoted here: the unleased ones, then the leased ones.
    pub fn promoted_ids(&self, queue: &str) -> Vec<String> {
        let mut ids: Vec<String> = self
            .dues
            .get(queue)
            .map(|d| d.set.values().cloned().collect())
            .unwrap_or_default();
        ids.extend(
            self.leases
                .iter()
                .filter(|(_, l)| l.queue == queue && l.promoted_at.is_some())
                .map(|(id, _)| id.clone()),
        );
        ids
    }

    /// Nothing of `queue` is held any more ([`Self::promoted_ids`] were all written into
    /// their rows): its tick scans from the start again.
    pub fn release_hold(&mut self, queue: &str) {
        if self.dues.contains_key(queue) {
            self.set_upto(queue, None);
        }
    }

    /// Where the tick's scan of `queue` starts after ([`Self::held_upto`], or before every
    /// row when nothing is held).
    pub fn scan_after(&self, queue: &str) -> (i64, i64) {
        self.held_upto(queue).unwrap_or((i64::MIN, i64::MIN))
    }

    /// Remove the promotion of `id` (unleased) from here, with no record of it.
    fn take_promotion(&mut self, id: &str) -> Option<Promotion> {
        let promotion = self.promoted.remove(id)?;
        if let Some(d) = self.dues.get_mut(&promotion.queue) {
            d.set.remove(&promotion.key);
        }
        Some(promotion)
    }

    fn restore_promotion(&mut self, id: String, promotion: Promotion) {
        self.dues
            .entry(promotion.queue.clone())
            .or_default()
            .set
            .insert(promotion.key, id.clone());
        self.promoted.insert(id, promotion);
    }

    // ---- leases ----

    /// Lease the candidate `key` of `queue` (its row is message `id`).
    pub fn lease(&mut self, id: &str, key: Key, lease: MemLease) {
        if lease.promoted_at.is_some() {
            // Its promotion goes with it: readers see the lease now (`overlay`).
            self.take_promotion(id);
            self.job_views.push(ViewChange::Due(id.to_owned(), None));
        } else {
            self.drop_candidate(&lease.queue, &key);
        }
        self.undo.push(Undo::Leased {
            id: id.to_owned(),
            key,
        });
        self.insert(id, lease);
    }

    fn insert(&mut self, id: &str, lease: MemLease) {
        self.job_views
            .push(ViewChange::Lease(id.to_owned(), Some(lease.view())));
        self.index_lease(id.to_owned(), lease);
    }

    fn remove(&mut self, id: &str) -> Option<MemLease> {
        let lease = self.unindex_lease(id)?;
        self.job_views.push(ViewChange::Lease(id.to_owned(), None));
        Some(lease)
    }

    /// Keep `lease` in every index of the leases here (no view change, no undo).
    fn index_lease(&mut self, id: String, lease: MemLease) {
        if let Some(row) = &lease.row {
            self.rows.lease_held(row);
        }
        self.seqs.insert(lease.seq);
        self.by_expiry.insert((lease.expires_at, id.clone()));
        self.leases.insert(id, lease);
    }

    /// Take the lease of `id` out of every index here (no view change, no undo).
    fn unindex_lease(&mut self, id: &str) -> Option<MemLease> {
        let lease = self.leases.remove(id)?;
        if let Some(row) = &lease.row {
            self.rows.lease_dropped(row);
        }
        self.seqs.remove(&lease.seq);
        self.by_expiry.remove(&(lease.expires_at, id.to_owned()));
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
        // What the job wrote may not be on disk any more.
        self.rows.clear();
        while let Some(u) = self.undo.pop() {
            match u {
                Undo::Leased { id, key } => {
                    if let Some(lease) = self.unindex_lease(&id) {
                        match lease.promoted_at {
                            Some(at) => self.restore_promotion(
                                id,
                                Promotion {
                                    queue: lease.queue,
                                    key,
                                    at,
                                },
                            ),
                            None => {
                                if let Some(w) = self.windows.get_mut(&lease.queue) {
                                    w.insert(key);
                                }
                            }
                        }
                    }
                }
                Undo::Promoted { id } => {
                    self.take_promotion(&id);
                }
                Undo::Unpromoted { id, promotion } => self.restore_promotion(id, promotion),
                Undo::Upto { queue, before } => {
                    if let Some(d) = self.dues.get_mut(&queue) {
                        d.upto = before;
                    }
                }
                Undo::Ended { id, lease } => self.index_lease(id, lease),
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
            for change in changes {
                match change {
                    ViewChange::Lease(id, Some(v)) => {
                        views.leases.insert(id, v);
                    }
                    ViewChange::Lease(id, None) => {
                        views.leases.remove(&id);
                    }
                    ViewChange::Due(id, Some(v)) => {
                        views.due.insert(id, v);
                    }
                    ViewChange::Due(id, None) => {
                        views.due.remove(&id);
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

/// What readers see of `promotion` (its row's seq and due time are its key's).
pub fn due_view(promotion: &Promotion) -> DueView {
    DueView {
        seq: promotion.key.seq,
        queue: promotion.queue.clone(),
        due_at: promotion.key.due_at,
        at: promotion.at,
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
            promoted_at: None,
            row: None,
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
        assert_eq!(hot.views.lock().unwrap().leases["m1"].expires_at, 100);
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
            from: State::Ready,
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
