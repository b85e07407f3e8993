//! Background WAL checkpoints, off the writer's critical path.
//!
//! SQLite's automatic checkpoint runs inside the committing connection: every
//! ~4 MiB of WAL, one unlucky commit copies the WAL into the database file and
//! fsyncs it, stalling every request waiting on that commit (measured here: the
//! writer spent half its time in I/O wait). The writer therefore runs with
//! `wal_autocheckpoint = 0`, and this thread, on its own connection, runs a
//! `PASSIVE` checkpoint — which never blocks the writer or readers — whenever
//! commits happened since the last one, at most every [`CHECKPOINT_INTERVAL`].
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
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Longest time between two checkpoints while commits keep coming. Short, so that the
/// early rewind (`rewind_early`) runs as soon as the log holds half the writer's bound:
/// at 200 ms the log often reached the bound first (about 115 MB/s of log at 10,000
/// deliveries/s), and the writer's own rewind then copied up to 200 ms of frames while
/// every request waited (lateness p99 18–20 ms on 100,000 due over 10 s; 6–7 ms at 10 ms,
/// with retry-cycle throughput within 2 %: docs/PERFORMANCE.md).
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(10);

/// After this long without a commit, the WAL is checkpointed and truncated to zero bytes, so
/// the disk it took under load is given back when the load stops.
pub const IDLE_TRUNCATE_AFTER: Duration = Duration::from_secs(1);

/// The running checkpointer; stopped (and joined) by [`Checkpointer::stop`].
pub struct Checkpointer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    /// Start checkpointing the database at `path`.
    pub fn start(path: PathBuf, opts: SqliteOptions, shared: Arc<Shared>) -> std::io::Result<Self> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let thread_stop = stop.clone();
        let handle = std::thread::Builder::new()
            .name("redrive-checkpoint".into())
            .spawn(move || run(path, opts, shared, thread_stop))?;
        Ok(Self {
            stop,
            handle: Some(handle),
        })
    }

    /// Stop the thread and wait for it.
    pub fn stop(&mut self) {
        let (lock, cv) = &*self.stop;
        if let Ok(mut s) = lock.lock() {
            *s = true;
        }
        cv.notify_all();
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

fn run(path: PathBuf, opts: SqliteOptions, shared: Arc<Shared>, stop: Arc<(Mutex<bool>, Condvar)>) {
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
    let mut last_commits = 0;
    let mut idle_since: Option<Instant> = None;
    let (lock, cv) = &*stop;
    loop {
        {
            let Ok(guard) = lock.lock() else { return };
            let Ok((guard, _)) = cv.wait_timeout_while(guard, CHECKPOINT_INTERVAL, |s| !*s) else {
                return;
            };
            if *guard {
                return;
            }
        }
        let commits = shared.stats.lock().map(|s| s.commits).unwrap_or(0);
        let mode = if commits != last_commits {
            last_commits = commits;
            idle_since = None;
            "PASSIVE"
        } else {
            // No commit since the last look: once idle long enough, give the disk back.
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < IDLE_TRUNCATE_AFTER || shared.wal_file_bytes() == 0 {
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
