//! The storage conformance suite on the embedded SQLite backend.

use redrive_storage::conformance::{self, Setup};
use redrive_storage::{SqliteOptions, SqliteStore};
use std::sync::atomic::{AtomicU32, Ordering};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_passes_the_conformance_suite() {
    // One temporary root; each case's store gets a fresh directory under it.
    let root = tempfile::tempdir().expect("temp dir");
    let next = AtomicU32::new(0);
    conformance::run_all(|setup: Setup| {
        let dir = root
            .path()
            .join(format!("case-{}", next.fetch_add(1, Ordering::Relaxed)));
        async move {
            let mut opts = SqliteOptions::new(dir);
            opts.catalog = setup.catalog;
            opts.idempotency_window_ms = setup.idempotency_window_ms;
            opts.seed = Some(7);
            SqliteStore::open(opts).expect("open the store")
        }
    })
    .await;
}
