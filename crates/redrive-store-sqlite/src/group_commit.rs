//! The single writer thread and its group commit.
//!
//! Every transition is a job sent to one thread that owns the only write
//! connection. The thread takes the first waiting job, then every job already
//! queued behind it (up to [`MAX_COMMIT_BATCH`] jobs or [`MAX_COMMIT_CHANGES`]
//! transitions), runs them all in one SQLite transaction — each inside its own savepoint, so a job that fails leaves no
//! trace while the others still commit — and commits once. Only after that
//! commit returns (and, under [`crate::Durability::Fsync`], the WAL is fsync'd)
//! does any job's caller get its answer: many concurrent requests share one
//! fsync, and none is acknowledged before it is on disk.
//!
//! A failed `COMMIT` poisons the store: every queued and later job is refused
//! with [`StoreError::Poisoned`]. Retrying an fsync that failed is not safe
//! (the kernel may have dropped the dirty pages), so the store never pretends.

use crate::sql_error::SqlResultExt;
use crate::transitions::WriterState;
use redrive_core::Timestamp;
use redrive_storage::{CommitStats, StoreError};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;
use tokio::sync::{mpsc, oneshot, watch};

/// At most this many jobs share one transaction: large enough that a burst of
/// concurrent requests shares one fsync, small enough that one commit stays
/// in the low milliseconds.
pub const MAX_COMMIT_BATCH: usize = 512;

/// At most about this many message transitions share one transaction (a job is never split):
/// it bounds how long one commit makes everyone wait when every job is a 1,000-item batch.
pub const MAX_COMMIT_CHANGES: usize = 20_000;

/// Answer a job's caller once the commit's fate is known.
pub type Reply = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// A transition to run in the writer: returns whether it succeeded (else its
/// savepoint is rolled back) and how to answer its caller.
pub type Job = Box<dyn FnOnce(&mut WriterState) -> (bool, Reply) + Send>;

/// What the writer's channel carries.
pub enum Command {
    /// Run a transition.
    Job(Job),
    /// Finish the queued jobs, then stop and answer.
    Close(oneshot::Sender<()>),
}

/// The write-ahead log's figures ([`crate::SqliteStore::wal_stats`]; on `/metrics` as
/// `redrive_wal_bytes`, `redrive_wal_rewinds`, `redrive_wal_rewind_seconds`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WalStats {
    /// Bytes of the WAL file on disk now.
    pub bytes: u64,
    /// Times the log was rewound to its start to keep it under its bound.
    pub rewinds: u64,
    /// Total seconds writers waited for those rewinds (the latency cost of the bound).
    pub rewind_seconds: f64,
}

/// State shared between the writer thread and the store handle.
pub struct Shared {
    /// `Some(reason)` once poisoned.
    pub poisoned: Mutex<Option<String>>,
    /// Commit counters.
    pub stats: Mutex<CommitStats>,
    /// Notified (with [`Shared::stats`]) after every commit, and when the checkpointer is
    /// told to stop: the checkpointer starts its passes right after a commit returned.
    pub committed: Condvar,
    /// Set (then [`Shared::committed`] notified) to stop the checkpointer
    /// (`checkpoint::Checkpointer::stop`).
    pub checkpointer_stop: AtomicBool,
    /// The write-ahead log's figures.
    pub wal: Mutex<WalStats>,
    /// Called after every commit with (message transitions in it, seconds in COMMIT).
    pub observer: Option<Arc<dyn Fn(usize, f64) + Send + Sync>>,
    /// The WAL file, whose size the writer checks after every commit.
    pub wal_path: PathBuf,
    /// WAL size past which the writer rewinds the log ([`bound_log`]).
    pub wal_restart_bytes: u64,
    /// Held while a checkpoint runs: SQLite refuses a second concurrent checkpoint with
    /// `SQLITE_BUSY` without waiting, so the writer's rewind and the background
    /// checkpointer take turns here.
    pub checkpoint_lock: Mutex<()>,
    /// The highest batch in which a job answered before its commit (a lease); 0: none.
    pub unsynced: AtomicU64,
    /// The highest batch whose commit has returned (or failed). Reads wait until it reaches
    /// [`Shared::unsynced`], so whoever was answered a lease sees it in a read that follows.
    pub settled: watch::Sender<u64>,
}

impl Shared {
    /// Record the WAL's size on disk now.
    pub fn set_log_bytes(&self, bytes: u64, restarted: bool) {
        if let Ok(mut s) = self.wal.lock() {
            s.bytes = bytes;
            s.rewinds += u64::from(restarted);
        }
    }

    /// Add the time a rewind of the WAL held the writer off.
    pub fn add_rewind_seconds(&self, secs: f64) {
        if let Ok(mut s) = self.wal.lock() {
            s.rewind_seconds += secs;
        }
    }

    /// The WAL's size on disk now (0 when it does not exist).
    pub fn wal_file_bytes(&self) -> u64 {
        std::fs::metadata(&self.wal_path).map_or(0, |m| m.len())
    }
}

/// Run the writer until the channel closes or a `Close` arrives.
pub fn run(
    mut state: WriterState,
    mut rx: mpsc::Receiver<Command>,
    shared: Arc<Shared>,
    wake_tx: watch::Sender<Option<Timestamp>>,
) {
    let mut close: Option<oneshot::Sender<()>> = None;
    let mut pending: VecDeque<Job> = VecDeque::with_capacity(MAX_COMMIT_BATCH);
    while close.is_none() || !pending.is_empty() {
        if pending.is_empty() {
            match rx.blocking_recv() {
                Some(Command::Job(j)) => pending.push_back(j),
                Some(Command::Close(c)) => close = Some(c),
                None => break,
            }
        }
        // What is queued now shares this commit; what arrives while it runs waits for the
        // next one (so a steady stream cannot stretch one commit, and its latency, forever).
        while pending.len() < MAX_COMMIT_BATCH && close.is_none() {
            match rx.try_recv() {
                Ok(Command::Job(j)) => pending.push_back(j),
                Ok(Command::Close(c)) => close = Some(c),
                Err(_) => break,
            }
        }
        if !pending.is_empty() {
            commit_batch(&mut state, &mut pending, &shared, &wake_tx);
        }
    }
    // Refuse whatever is still queued: the store is closed.
    rx.close();
    while let Ok(cmd) = rx.try_recv() {
        match cmd {
            Command::Job(j) => refuse(&mut state, j, StoreError::Closed),
            Command::Close(c) => {
                let _ = c.send(());
            }
        }
    }
    // Closed, or every handle dropped: either way an orderly end, not a crash.
    keep_leases(&mut state, &shared);
    if let Some(c) = close {
        let _ = state.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)");
        let _ = c.send(());
    }
}

/// At a close (or when every handle was dropped): write the leases held in memory into their rows (`hot.rs`), in one
/// transaction, so that they outlive the restart as leases that committed do. Nothing on
/// a poisoned store; if it fails, the leases are lost as in a crash (delivered again).
fn keep_leases(state: &mut WriterState, shared: &Shared) {
    if state.hot.is_empty() || shared.poisoned.lock().map_or(true, |p| p.is_some()) {
        return;
    }
    let mut kept = || -> Result<usize, StoreError> {
        state.conn.execute_batch("BEGIN IMMEDIATE").db()?;
        let n = state.flush_hot()?;
        state.conn.execute_batch("COMMIT").db()?;
        Ok(n)
    };
    match kept() {
        Ok(n) => tracing::debug!(leases = n, "leases held in memory written at close"),
        Err(e) => {
            let _ = state.conn.execute_batch("ROLLBACK");
            tracing::warn!(error = %e, "leases held in memory not kept at close: delivered again");
        }
    }
}

/// Answer a job with `err` without running its transition: the job sees
/// [`WriterState::refusing`] and touches nothing (no statement may run on a store that
/// is closed or poisoned, not even in a transaction that would be rolled back).
fn refuse(state: &mut WriterState, job: Job, err: StoreError) {
    state.refusing = true;
    let (_, reply) = job(state);
    state.refusing = false;
    state.discard_command();
    reply(Err(err));
}

/// Run the pending jobs in one transaction, from the front, until they are all done or the
/// batch holds [`MAX_COMMIT_CHANGES`] message transitions (a job is never split; the rest
/// stay pending for the next commit), then commit once.
fn commit_batch(
    state: &mut WriterState,
    pending: &mut VecDeque<Job>,
    shared: &Shared,
    wake_tx: &watch::Sender<Option<Timestamp>>,
) {
    let poisoned = shared.poisoned.lock().map(|p| p.clone()).unwrap_or(None);
    if let Some(reason) = poisoned {
        for job in pending.drain(..) {
            refuse(state, job, StoreError::Poisoned(reason.clone()));
        }
        return;
    }
    if let Err(e) = state.conn.execute_batch("BEGIN IMMEDIATE") {
        let reason = format!("BEGIN failed: {e}");
        poison(shared, &reason);
        for job in pending.drain(..) {
            refuse(state, job, StoreError::Poisoned(reason.clone()));
        }
        return;
    }
    state.begin_batch(*wake_tx.borrow());
    let mut replies: Vec<Reply> = Vec::with_capacity(pending.len());
    while let Some(job) = pending.pop_front() {
        // Cached statements: `execute_batch` would parse the SQL text again for every job.
        let sp = exec_cached(&state.conn, "SAVEPOINT job");
        let (ok, reply) = job(state);
        if ok && sp.is_ok() {
            let _ = exec_cached(&state.conn, "RELEASE job");
            state.keep_command();
        } else {
            let _ = state.conn.execute_batch("ROLLBACK TO job; RELEASE job");
            state.discard_command();
        }
        replies.push(reply);
        if state.batch_changes() >= MAX_COMMIT_CHANGES {
            break;
        }
    }
    let started = Instant::now();
    let committed = state.conn.execute_batch("COMMIT");
    let secs = started.elapsed().as_secs_f64();
    match committed {
        Ok(()) => {
            let (wake, changes) = state.finish_batch();
            shared.settled.send_replace(state.batch);
            if let Ok(mut s) = shared.stats.lock() {
                s.commits += 1;
                s.changes += changes as u64;
                s.commit_seconds += secs;
            }
            shared.committed.notify_all();
            if let Some(obs) = &shared.observer {
                obs(changes, secs);
            }
            bound_log(state, shared);
            wake_tx.send_if_modified(|w| {
                if *w != wake {
                    *w = wake;
                    true
                } else {
                    false
                }
            });
            for r in replies {
                r(Ok(()));
            }
        }
        Err(e) => {
            let reason = format!("COMMIT failed: {e}");
            tracing::error!(%reason, "store poisoned: refusing all writes");
            poison(shared, &reason);
            let _ = state.conn.execute_batch("ROLLBACK");
            state.abort_batch();
            shared.settled.send_replace(state.batch);
            for r in replies {
                r(Err(StoreError::Poisoned(reason.clone())));
            }
        }
    }
}

/// Keep the WAL bounded under continuous load (SPEC §7: disk is bounded by the data, not by
/// uptime).
///
/// SQLite only rewinds a WAL to its start when a writer begins a transaction after a
/// checkpoint has copied *every* frame back into the database. The background PASSIVE
/// checkpoints (`checkpoint.rs`) never catch up while commits keep coming, so the file would
/// grow for as long as the load lasts (measured: 4 GB in two minutes). So after a commit that
/// leaves the file past [`Shared::wal_restart_bytes`], the writer itself — the only writer, so
/// nothing can append meanwhile — runs a `RESTART` checkpoint: it copies the frames the
/// background checkpointer has not copied yet, fsyncs the database file, and waits (at most
/// 50 ms, [`crate::busy::wait_50ms`]: short, since every queued request waits with the writer) for readers to leave the log. The next commit then writes from the
/// start of the file, and SQLite truncates the file back to `journal_size_limit` (the same
/// size). Readers that hold the log longer make the rewind give up; the next commit tries
/// again.
///
/// A checkpoint that fails with an I/O error poisons the store, like a failed commit.
fn bound_log(state: &mut WriterState, shared: &Shared) {
    let bytes = shared.wal_file_bytes();
    if bytes <= shared.wal_restart_bytes {
        shared.set_log_bytes(bytes, false);
        return;
    }
    let conn = &state.conn;
    let started = Instant::now();
    let _turn = shared.checkpoint_lock.lock();
    let _ = conn.busy_handler(Some(crate::busy::wait_50ms));
    let result = wal_checkpoint(conn, "RESTART").map(|c| c.busy);
    let _ = conn.busy_handler(Some(crate::busy::wait_5s));
    shared.add_rewind_seconds(started.elapsed().as_secs_f64());
    match result {
        Ok(0) => shared.set_log_bytes(shared.wal_file_bytes(), true),
        Ok(_) => {
            // Readers still in the log: it was checkpointed but not rewound. Next commit.
            tracing::debug!(wal_bytes = bytes, "WAL rewind waits for readers");
            shared.set_log_bytes(bytes, false);
        }
        Err(e) if is_io_error(&e) => {
            let reason = format!("WAL checkpoint failed: {e}");
            tracing::error!(%reason, "store poisoned: refusing all writes");
            poison(shared, &reason);
        }
        Err(e) => {
            tracing::warn!(error = %e, wal_bytes = bytes, "WAL rewind did not run; will retry");
            shared.set_log_bytes(bytes, false);
        }
    }
}

/// What `PRAGMA wal_checkpoint` answered.
pub struct Checkpointed {
    /// Non-zero when it could not finish (a writer or readers in the way).
    pub busy: i64,
    /// Frames in the log.
    pub log_frames: i64,
    /// Frames copied back into the database.
    pub copied_frames: i64,
}

/// Run `PRAGMA wal_checkpoint(mode)` (`PASSIVE`, `RESTART`, `TRUNCATE`).
pub fn wal_checkpoint(conn: &rusqlite::Connection, mode: &str) -> rusqlite::Result<Checkpointed> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok(Checkpointed {
            busy: r.get(0)?,
            log_frames: r.get(1)?,
            copied_frames: r.get(2)?,
        })
    })
}

/// Whether `e` says the disk failed (the store must then be poisoned).
pub fn is_io_error(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::SystemIoFailure | rusqlite::ErrorCode::DiskFull)
    )
}

fn exec_cached(conn: &rusqlite::Connection, sql: &str) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute([])
}

pub fn poison(shared: &Shared, reason: &str) {
    if let Ok(mut p) = shared.poisoned.lock() {
        if p.is_none() {
            *p = Some(reason.to_owned());
        }
    }
}
