//! Background WAL checkpoints, off the writer's critical path.
//!
//! SQLite's automatic checkpoint runs inside the committing connection: every
//! ~4 MiB of WAL, one unlucky commit copies the WAL into the database file and
//! fsyncs it, stalling every request waiting on that commit (measured here: the
//! writer spent half its time in I/O wait). The writer therefore runs with
//! `wal_autocheckpoint = 0`, and this thread, on its own connection, runs a
//! `PASSIVE` checkpoint — which never blocks the writer or readers — whenever
//! commits happened since the last one: right after a commit returns, at most every
//! [`MIN_CHECKPOINT_INTERVAL`], and at least every [`CHECKPOINT_INTERVAL`] (see
//! [`wait_for_pass`] for why right after a commit). An idle store's checkpointer sleeps until
//! a commit comes (or the idle truncation below is due).
//! Under continuous commits a PASSIVE checkpoint never catches up, so SQLite never
//! rewinds the log: the writer does that itself past a bound (`group_commit::bound_log`).
//! After [`IDLE_TRUNCATE_AFTER`] without commits, this thread truncates the WAL to zero
//! bytes, so the disk taken under load is given back when the load stops.
//!
//! A checkpoint that fails with an I/O error poisons the store like a failed
//! commit: the database file may not hold what the WAL says it does.

use crate::group_commit::{wal_checkpoint, Shared};
use crate::SqliteOptions;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest time between two checkpoints while commits keep coming. Short, so that the
/// early rewind (`rewind_early`) runs as soon as the log holds half the writer's bound:
/// at 200 ms the log often reached the bound first (about 115 MB/s of log at 10,000
/// deliveries/s), and the writer's own rewind then copied up to 200 ms of frames while
/// every request waited (lateness p99 18–20 ms on 100,000 due over 10 s; 6–7 ms at 10 ms,
/// with retry-cycle throughput within 2 %: docs/PERFORMANCE.md).
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(10);

/// Shortest time between the starts of two checkpoints: each one copies what was committed
/// since the one before into the database file and fsyncs it, and a smaller copy keeps that
/// fsync short (messages falling due in random order make each copied page a random write).
/// Every 10 ms, the lateness p99 of 100,000 messages due over 10 s was 4.8–6.4 ms; every
/// 3 ms, 3.8–4.1 ms. That costs throughput where a retry cycle's pages are rewritten by
/// many commits and copied again by each pass: 8 % at 16 × 100 on a 3 ms timer, 5 % (and 4 %
/// at 8 × 10) with the pass right after a commit (docs/PERFORMANCE.md).
pub const MIN_CHECKPOINT_INTERVAL: Duration = Duration::from_millis(3);

/// After this long without a commit, the WAL is checkpointed and truncated to zero bytes, so
/// the disk it took under load is given back when the load stops.
pub const IDLE_TRUNCATE_AFTER: Duration = Duration::from_secs(1);

/// The running checkpointer; stopped (and joined) by [`Checkpointer::stop`].
pub struct Checkpointer {
    shared: Arc<Shared>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    /// Start checkpointing the database at `path`.
    pub fn start(path: PathBuf, opts: SqliteOptions, shared: Arc<Shared>) -> std::io::Result<Self> {
        let thread_shared = shared.clone();
        let handle = std::thread::Builder::new()
            .name("redrive-checkpoint".into())
            .spawn(move || run(path, opts, thread_shared))?;
        Ok(Self {
            shared,
            handle: Some(handle),
        })
    }

    /// Stop the thread and wait for it.
    pub fn stop(&mut self) {
        self.shared.checkpointer_stop.store(true, Ordering::SeqCst);
        // Under the lock the thread waits with, so that it cannot miss the flag between its
        // check and its wait.
        drop(self.shared.stats.lock());
        self.shared.committed.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Wait for the next pass: not before `min` after `last_pass` (when the one before began),
/// then until a commit returns or `until`. A busy store's pass waits
/// for a commit that returns after that minimum: starting right after a commit puts the
/// checkpoint's copy and fsync beside the writer's next batch of jobs rather than beside that
/// batch's own fsync, which would wait behind them. An idle one's (`idle_at`: the commits
/// counted at its last pass) takes any commit since. Returns the commits so far, or `None`
/// once told to stop.
fn wait_for_pass(
    shared: &Shared,
    last_pass: Instant,
    min: Duration,
    until: Instant,
    idle_at: Option<u64>,
) -> Option<u64> {
    if let Some(rest) = min.checked_sub(last_pass.elapsed()) {
        std::thread::sleep(rest);
    }
    let mut stats = shared.stats.lock().ok()?;
    let seen = idle_at.unwrap_or(stats.commits);
    loop {
        if shared.checkpointer_stop.load(Ordering::SeqCst) {
            return None;
        }
        let rest = until.saturating_duration_since(Instant::now());
        if rest.is_zero() || stats.commits != seen {
            return Some(stats.commits);
        }
        stats = shared.committed.wait_timeout(stats, rest).ok()?.0;
    }
}

/// How long an idle checkpointer whose log is already truncated sleeps when no commit comes
/// (a commit or a stop wakes it at once).
const IDLE_WAIT: Duration = Duration::from_secs(1);

fn run(path: PathBuf, opts: SqliteOptions, shared: Arc<Shared>) {
    let conn = match crate::open_connection(&path, &opts, true) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "checkpointer cannot open the database; WAL will grow");
            return;
        }
    };
    // The idle truncation and the early rewind must not wait long for the write lock or for
    // readers: 100 ms, then try again later.
    let _ = conn.busy_handler(Some(crate::busy::wait_100ms));
    // The passes right after commits, 3 ms apart, are for the writer's fsyncs. Commits that
    // are not fsync'd (`unsafe-buffered`) have none to keep short: their passes stay 10 ms
    // apart, and with them the syncs that a pass makes of the WAL (a pass every 3 ms would
    // sync each commit's frames within milliseconds, and cost that mode's throughput).
    let min = match opts.durability {
        crate::Durability::Fsync => MIN_CHECKPOINT_INTERVAL,
        crate::Durability::UnsafeBuffered => CHECKPOINT_INTERVAL,
    };
    let mut last_commits = 0;
    let mut last_pass = Instant::now();
    let mut idle_since: Option<Instant> = None;
    loop {
        // Idle with the log already truncated: nothing can grow it but a commit, which ends
        // the idleness, so one look at the file serves the whole turn.
        let truncated = idle_since.is_some() && shared.wal_file_bytes() == 0;
        // Busy: a pass every CHECKPOINT_INTERVAL at the latest. Idle: nothing to copy until a
        // commit comes, only the truncation when it is due (or again, if one was refused).
        let until = match idle_since {
            None => last_pass + CHECKPOINT_INTERVAL,
            Some(_) if truncated => last_pass + IDLE_WAIT,
            Some(since) => (since + IDLE_TRUNCATE_AFTER).max(last_pass + CHECKPOINT_INTERVAL),
        };
        let idle_at = idle_since.map(|_| last_commits);
        let Some(commits) = wait_for_pass(&shared, last_pass, min, until, idle_at) else {
            return;
        };
        last_pass = Instant::now();
        let mode = if commits != last_commits {
            last_commits = commits;
            idle_since = None;
            "PASSIVE"
        } else {
            // No commit since the last look: once idle long enough, give the disk back.
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < IDLE_TRUNCATE_AFTER || truncated {
                continue;
            }
            "TRUNCATE"
        };
        let result = {
            let _turn = shared.checkpoint_lock.lock();
            match wal_checkpoint(&conn, mode) {
                Ok(c)
                    if c.busy == 0
                        && mode == "PASSIVE"
                        && log_bytes(c.log_frames) > shared.wal_restart_bytes / 2 =>
                {
                    rewind_early(&conn, &shared).map(|()| 0)
                }
                r => r.map(|c| c.busy),
            }
        };
        match result {
            Ok(busy) => {
                if mode == "TRUNCATE" && busy == 0 {
                    shared.set_log_bytes(shared.wal_file_bytes(), true);
                    tracing::debug!("idle: WAL truncated");
                }
            }
            Err(e) if crate::group_commit::is_io_error(&e) => {
                let reason = format!("WAL checkpoint failed: {e}");
                tracing::error!(%reason, "store poisoned: refusing all writes");
                crate::group_commit::poison(&shared, &reason);
                return;
            }
            Err(e) => tracing::warn!(error = %e, "WAL checkpoint did not run; will retry"),
        }
    }
}

/// An early rewind holds the writer off while it copies at most about this many frames.
const REWIND_TAIL_FRAMES: i64 = 256;

/// Bytes of log that `frames` WAL frames hold (page and frame header).
fn log_bytes(frames: i64) -> u64 {
    frames.max(0) as u64 * (u64::from(crate::PAGE_SIZE) + 24)
}

/// Rewind the log from here, right after a pass that copied it all back, once it holds half of
/// what makes the writer rewind it ([`crate::group_commit::bound_log`]): a `RESTART` checkpoint
/// then only copies what was committed during the pass, so the writer (which a `RESTART`
/// holds off) waits a few milliseconds instead of the whole copy. Measured on the
/// delayed-delivery benchmark (docs/PERFORMANCE.md): the writer's own rewinds took 24 ms each
/// and set the lateness p99.
fn rewind_early(conn: &rusqlite::Connection, shared: &Shared) -> rusqlite::Result<()> {
    // Passive passes (the writer goes on meanwhile) until what is left to copy is small:
    // each one copies what was committed during the one before.
    for _ in 0..4 {
        let c = wal_checkpoint(conn, "PASSIVE")?;
        if c.busy != 0 || c.log_frames - c.copied_frames <= REWIND_TAIL_FRAMES {
            break;
        }
    }
    let started = Instant::now();
    let busy = wal_checkpoint(conn, "RESTART")?.busy;
    shared.add_rewind_seconds(started.elapsed().as_secs_f64());
    shared.set_log_bytes(shared.wal_file_bytes(), busy == 0);
    Ok(())
}
