//! `redrive backup`: a consistent copy of a data directory, taken while a server runs on it.
//!
//! The copy is SQLite's online backup (`sqlite3_backup_*`, rusqlite's `backup` feature) of
//! `redrive.db`, page by page, in **one step**: the source is read inside one read
//! transaction, so the copy is the database as of one commit — every write committed (and
//! so every 2xx answered) before the backup started is in it, and no half of a later one.
//! WAL mode lets the server keep committing meanwhile; the backup does not take the data
//! directory's lock (`dir_lock`), it only reads.
//!
//! Why the backup API and not `VACUUM INTO`: both copy a snapshot without stopping the
//! writer, but `VACUUM INTO` rebuilds every table and index row by row (CPU the writer
//! shares the cores with, and a longer read transaction), where the backup copies pages.
//! Why one step: an incremental backup (n pages, pause, n more) starts over whenever another
//! connection writes the source, so under steady load it would never finish.
//!
//! The cost while it runs: the server's WAL cannot be rewound past the backup's snapshot, so
//! the log grows until the copy ends, and once it is past half of `max_wal_bytes` each
//! commit waits up to 50 ms for a rewind that cannot happen yet (`group_commit::bound_log`).
//!
//! The copy is written to `OUT/redrive.db.part`, switched to a self-contained file (rollback
//! journal; the server turns WAL back on when it opens it), checked with
//! `PRAGMA quick_check`, fsync'd, and only then renamed to `OUT/redrive.db`: a backup that
//! fails or is interrupted never leaves something that looks like a store.

use crate::busy;
use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Why a backup was not made. Nothing was written to the source; a partial copy is removed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The source directory has no store (`redrive.db`). Check `--data-dir`.
    #[error("{0} has no redrive store (no redrive.db in it)")]
    NoStore(PathBuf),
    /// The destination exists and is not an empty directory. Choose a new one.
    #[error("{0} already exists and is not an empty directory: a backup goes into a new (or empty) directory")]
    Destination(PathBuf),
    /// Reading the source or writing the copy failed.
    #[error("{what}: {detail}")]
    Failed {
        /// What was being done.
        what: String,
        /// Why it failed.
        detail: String,
    },
}

/// What a finished backup copied.
#[derive(Debug, Clone)]
pub struct BackupReport {
    /// The copy: `OUT/redrive.db`.
    pub file: PathBuf,
    /// Its size, bytes.
    pub bytes: u64,
    /// Messages in it (every state).
    pub messages: u64,
    /// Its schema version.
    pub schema_version: i64,
    /// How long the copy took (the source's read transaction).
    pub copy_seconds: f64,
}

/// How long the copy waits for the source while it is busy (a checkpoint resetting the log,
/// a recovery): the same bound as every connection's busy handler.
const BUSY_LIMIT: Duration = Duration::from_secs(5);

fn failed(what: impl Into<String>, e: impl std::fmt::Display) -> BackupError {
    BackupError::Failed {
        what: what.into(),
        detail: e.to_string(),
    }
}

/// Copy the store in `data_dir` into the new (or empty) directory `out`.
pub fn backup(data_dir: &Path, out: &Path) -> Result<BackupReport, BackupError> {
    let source = data_dir.join("redrive.db");
    if !source.is_file() {
        return Err(BackupError::NoStore(data_dir.to_path_buf()));
    }
    prepare_destination(out)?;
    let part = out.join("redrive.db.part");
    let result = copy(&source, &part).and_then(|(messages, schema_version, copy_seconds)| {
        let file = out.join("redrive.db");
        std::fs::rename(&part, &file)
            .map_err(|e| failed(format!("rename {}", part.display()), e))?;
        sync_dir(out)?;
        let bytes = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        Ok(BackupReport {
            file,
            bytes,
            messages,
            schema_version,
            copy_seconds,
        })
    });
    if result.is_err() {
        for leftover in ["redrive.db.part", "redrive.db.part-journal"] {
            let _ = std::fs::remove_file(out.join(leftover));
        }
    }
    result
}

/// `out` must not exist (it is created) or be an empty directory.
fn prepare_destination(out: &Path) -> Result<(), BackupError> {
    match std::fs::read_dir(out) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(BackupError::Destination(out.to_path_buf()));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(out).map_err(|e| failed(format!("create {}", out.display()), e))
        }
        // A file, or a directory we may not read: not a place for the copy.
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory || out.exists() => {
            Err(BackupError::Destination(out.to_path_buf()))
        }
        Err(e) => Err(failed(format!("read {}", out.display()), e)),
    }
}

/// Copy `source` into the new file `part`, make it a self-contained database on disk and
/// check it: (messages, schema version, seconds the source was read).
fn copy(source: &Path, part: &Path) -> Result<(u64, i64, f64), BackupError> {
    let src = Connection::open_with_flags(
        source,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| failed(format!("open {}", source.display()), e))?;
    src.busy_handler(Some(busy::wait_5s))
        .map_err(|e| failed("set up the source", e))?;
    let mut dst = Connection::open_with_flags(
        part,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| failed(format!("create {}", part.display()), e))?;
    dst.execute_batch("PRAGMA synchronous = FULL")
        .map_err(|e| failed("set up the copy", e))?;
    let started = Instant::now();
    {
        let backup = Backup::new(&src, &mut dst).map_err(|e| failed("start the backup", e))?;
        loop {
            // -1: every page in one step, so in one read transaction of the source.
            match backup
                .step(-1)
                .map_err(|e| failed("copy the database", e))?
            {
                StepResult::Done => break,
                // Busy or locked: the source is in a checkpoint's reset or a recovery.
                _ if started.elapsed() < BUSY_LIMIT => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                other => {
                    return Err(BackupError::Failed {
                        what: "copy the database".into(),
                        detail: format!("the source stayed busy for {BUSY_LIMIT:?} ({other:?})"),
                    })
                }
            }
        }
    }
    let copy_seconds = started.elapsed().as_secs_f64();
    drop(src);
    // The copied header says WAL; a rollback journal makes the copy one file, which the
    // server switches back to WAL when it opens it.
    let mode: String = dst
        .query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0))
        .map_err(|e| failed("finish the copy", e))?;
    if !mode.eq_ignore_ascii_case("delete") {
        return Err(BackupError::Failed {
            what: "finish the copy".into(),
            detail: format!("journal mode stayed {mode}"),
        });
    }
    let check: String = dst
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .map_err(|e| failed("check the copy", e))?;
    if check != "ok" {
        return Err(BackupError::Failed {
            what: "check the copy".into(),
            detail: check,
        });
    }
    let messages: i64 = dst
        .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
        .map_err(|e| failed("count the copy's messages", e))?;
    let version: String = dst
        .query_row("SELECT v FROM meta WHERE k = 'schema_version'", [], |r| {
            r.get(0)
        })
        .map_err(|e| failed("read the copy's schema version", e))?;
    let version = version
        .parse()
        .map_err(|e| failed("read the copy's schema version", e))?;
    dst.close()
        .map_err(|(_, e)| failed(format!("close {}", part.display()), e))?;
    std::fs::File::open(part)
        .and_then(|f| f.sync_all())
        .map_err(|e| failed(format!("fsync {}", part.display()), e))?;
    Ok((messages.max(0) as u64, version, copy_seconds))
}

/// fsync a directory, so that a rename in it is on disk.
fn sync_dir(dir: &Path) -> Result<(), BackupError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| failed(format!("fsync {}", dir.display()), e))
}
