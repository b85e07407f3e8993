//! Background WAL checkpoints, off the writer's critical path.
//!
//! SQLite's automatic checkpoint runs inside the committing connection: every
//! ~4 MiB of WAL, one unlucky commit copies the WAL into the database file and
//! fsyncs it, stalling every request waiting on that commit (measured here: the
//! writer spent half its time in I/O wait). The writer therefore runs with
//! `wal_autocheckpoint = 0`, and this thread, on its own connection, runs a
//! `PASSIVE` checkpoint — which never blocks the writer or readers — whenever
//! commits happened since the last one, at most every [`CHECKPOINT_INTERVAL`].
//! SQLite restarts the WAL from its beginning once a checkpoint has caught up,
//! so the file stays bounded while the checkpointer keeps up.
//!
//! A checkpoint that fails with an I/O error poisons the store like a failed
//! commit: the database file may not hold what the WAL says it does.

use super::group_commit::Shared;
use super::SqliteOptions;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Longest time between two checkpoints while commits keep coming.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(200);

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
    let conn = match super::open_connection(&path, &opts, true) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "checkpointer cannot open the database; WAL will grow");
            return;
        }
    };
    let mut last_commits = 0;
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
        if commits == last_commits {
            continue;
        }
        last_commits = commits;
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            let io = matches!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::SystemIoFailure | rusqlite::ErrorCode::DiskFull)
            );
            if io {
                let reason = format!("WAL checkpoint failed: {e}");
                tracing::error!(%reason, "store poisoned: refusing all writes");
                if let Ok(mut p) = shared.poisoned.lock() {
                    p.get_or_insert(reason);
                }
                return;
            }
            tracing::warn!(error = %e, "WAL checkpoint did not run; will retry");
        }
    }
}
