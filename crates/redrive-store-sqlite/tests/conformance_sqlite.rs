//! The storage conformance suite on the embedded SQLite backend: one test per case
//! (`cargo test -p redrive-storage lease_`, `… ordering::`), each on a fresh store in a
//! temporary directory of its own.

use redrive_storage::conformance::Setup;
use redrive_store_sqlite::{SqliteOptions, SqliteStore};

/// A fresh store for one case; the directory is removed after the store is closed.
async fn open(setup: Setup) -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut opts = SqliteOptions::new(dir.path());
    opts.store.catalog = setup.catalog;
    opts.store.idempotency_window_ms = setup.idempotency_window_ms;
    opts.store.seed = Some(7);
    (SqliteStore::open(opts).expect("open the store"), dir)
}

redrive_storage::conformance_tests!(open);

// Two stores on one data directory is what the embedded store refuses (its lock): the
// shared-handles area is for the backends a cluster shares.
redrive_storage::conformance_shared_tests!(
    unsupported: "the embedded store is one process per data directory (redrive.lock refuses a second store)"
);

/// The suite's own list and the named tests come from one macro; this checks the
/// runner that takes the whole list at once still passes on a few cases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_cases_runs_the_listed_cases() {
    let root = tempfile::tempdir().expect("temp dir");
    let next = std::sync::atomic::AtomicU32::new(0);
    redrive_storage::conformance::run_cases(
        |setup: Setup| {
            let dir = root.path().join(
                next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    .to_string(),
            );
            async move {
                let mut opts = SqliteOptions::new(dir);
                opts.store.catalog = setup.catalog;
                opts.store.idempotency_window_ms = setup.idempotency_window_ms;
                SqliteStore::open(opts).expect("open the store")
            }
        },
        |name| name.starts_with("publish_"),
    )
    .await;
}
