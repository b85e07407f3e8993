//! `redrive backup --data-dir DIR --to OUT`: a consistent copy of the embedded store, taken
//! while a server runs on DIR (SQLite's online backup: see `redrive_store_sqlite::SqliteStore::backup`).
//! It only reads DIR and does not take its lock, so the server keeps serving; OUT must be new
//! or an empty directory, and `redrive serve --data-dir OUT` starts on the copy.
//!
//! Exit codes: 0 the copy is complete and checked; 2 DIR has no store, or OUT is not new or
//! empty; 1 the copy failed (nothing that looks like a store is left in OUT).

use crate::BackupArgs;
use redrive_store_sqlite::{BackupError, SqliteStore};

/// Run the backup and print what it copied.
pub fn run(args: &BackupArgs) -> anyhow::Result<()> {
    let report = SqliteStore::backup(&args.data_dir, &args.to).map_err(|e| match e {
        BackupError::NoStore(_) | BackupError::Destination(_) => super::usage(e.to_string()),
        BackupError::Failed { .. } => anyhow::anyhow!("backup of {}: {e}", args.data_dir.display()),
    })?;
    println!(
        "backup of {} written to {}: {} messages, schema version {}, {} bytes, read in {:.2} s",
        args.data_dir.display(),
        report.file.display(),
        report.messages,
        report.schema_version,
        report.bytes,
        report.copy_seconds
    );
    println!(
        "start a server on the copy with: redrive serve --data-dir {}",
        args.to.display()
    );
    Ok(())
}
