//! One store per data directory: an exclusive lock on `DATA_DIR/redrive.lock`, taken by
//! [`crate::SqliteStore::open`] before it touches the database and held until the store is
//! closed or dropped (SPEC §6).
//!
//! SQLite itself lets two processes write one database (it serialises them), so without
//! this a second `redrive serve` on the same directory would start without a word and the
//! two would share the data behind each other's back: each writer keeps its own counts, wake
//! hints and lease epochs in memory, so each would answer from a store the other changes.
//!
//! The lock is the kernel's, `flock(2)` (`File::try_lock`), on the open file: it dies with
//! the process however the process ends (`kill -9`, OOM, a power cut), so a lock file left
//! behind by a dead server never blocks a restart — only a live holder does. Two stores in
//! one process conflict too (each open is its own open file). The file holds the holder's
//! PID, written after the lock is taken, only so that the refused one can name it; it is
//! never what decides.
//!
//! Limits: the data directory must be on a local filesystem (SQLite's WAL needs one anyway);
//! on a network filesystem the lock is only as good as its lock manager.

use redrive_storage::StoreError;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
#[cfg(test)]
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "redrive.lock";

/// How long a refused open waits for the holder's PID to appear in the file: the holder
/// writes it right after taking the lock, so an empty file is a holder that is starting.
const PID_WAIT: Duration = Duration::from_millis(200);

/// A held lock on a data directory. Dropping it releases the lock.
#[derive(Debug)]
pub struct DirLock {
    /// The locked open file; the lock lives as long as this descriptor.
    _file: File,
}

impl DirLock {
    /// Take the lock of `data_dir` (which must exist), or say who holds it.
    pub fn acquire(data_dir: &Path) -> Result<DirLock, StoreError> {
        let path = data_dir.join(LOCK_FILE);
        let backend = |what: &str, e: std::io::Error| {
            StoreError::Backend(format!(
                "cannot {what} the lock file {}: {e}",
                path.display()
            ))
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| backend("open", e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(StoreError::DataDirLocked {
                    pid: holder_pid(&mut file),
                    lock: path,
                })
            }
            Err(TryLockError::Error(e)) => return Err(backend("lock", e)),
        }
        // Ours now: replace whatever a previous holder left with our PID.
        file.set_len(0).map_err(|e| backend("write", e))?;
        file.seek(SeekFrom::Start(0))
            .and_then(|_| writeln!(file, "{}", std::process::id()))
            .map_err(|e| backend("write", e))?;
        Ok(DirLock { _file: file })
    }
}

/// The PID the holder wrote into the lock file, waiting briefly for a holder that has just
/// taken the lock and not written it yet; `None` if there is none to read.
fn holder_pid(file: &mut File) -> Option<u32> {
    let deadline = Instant::now() + PID_WAIT;
    loop {
        let mut text = String::new();
        let read = file
            .seek(SeekFrom::Start(0))
            .and_then(|_| file.read_to_string(&mut text));
        if read.is_ok() {
            if let Ok(pid) = text.trim().parse() {
                return Some(pid);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock_path(data_dir: &Path) -> PathBuf {
        data_dir.join(LOCK_FILE)
    }

    #[test]
    fn a_second_lock_on_one_directory_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        match DirLock::acquire(dir.path()) {
            Err(StoreError::DataDirLocked { lock, pid }) => {
                assert_eq!(lock, lock_path(dir.path()));
                assert_eq!(pid, Some(std::process::id()));
            }
            other => panic!("second lock: {other:?}"),
        }
        drop(first);
        DirLock::acquire(dir.path()).expect("free again once the first is dropped");
    }

    #[test]
    fn a_lock_file_left_behind_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        // What a killed server leaves: the file with its PID, and no lock.
        std::fs::write(lock_path(dir.path()), "999999999\n").unwrap();
        let _lock = DirLock::acquire(dir.path()).expect("a stale lock file is no lock");
        let text = std::fs::read_to_string(lock_path(dir.path())).unwrap();
        assert_eq!(text, format!("{}\n", std::process::id()));
    }

    #[test]
    fn a_holder_that_wrote_no_pid_is_named_as_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let path = lock_path(dir.path());
        let held = File::create(&path).unwrap();
        held.lock().unwrap();
        match DirLock::acquire(dir.path()) {
            Err(e @ StoreError::DataDirLocked { pid: None, .. }) => {
                assert!(e.to_string().contains(&path.display().to_string()), "{e}");
            }
            other => panic!("second lock: {other:?}"),
        }
    }
}
