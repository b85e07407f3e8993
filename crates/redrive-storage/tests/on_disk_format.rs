//! The on-disk format of the embedded store, read back by a later redrive: a state code
//! no state has is an error (never read as `dead`), and data directories written by
//! earlier schema versions open and keep working.

use redrive_core::NewMessage;
use redrive_storage::conformance::{self, at, Q};
use redrive_storage::{MessageFilter, SqliteOptions, SqliteStore, Store, StoreError};
use serde_json::json;
use std::path::Path;

fn options(dir: &Path) -> SqliteOptions {
    let mut opts = SqliteOptions::new(dir);
    opts.catalog = std::sync::Arc::new(conformance::catalog());
    opts.seed = Some(5);
    opts
}

/// Write straight to the database file, as a newer redrive or a damaged disk would.
fn raw(dir: &Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(dir.join("redrive.db")).expect("open the raw database");
    c.busy_timeout(std::time::Duration::from_secs(5))
        .expect("busy timeout");
    c
}

fn is_unknown_state(e: &StoreError) -> bool {
    matches!(e, StoreError::Backend(m) if m.contains("state code 9"))
}

#[tokio::test]
async fn unknown_state_code_on_disk_is_an_error_not_dead() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(options(dir.path())).expect("open");
    let id = store
        .publish(vec![NewMessage::new(Q, json!({"n": 1}))], at(0))
        .await
        .expect("publish")[0]
        .message
        .id;
    // A code no state has (9), written underneath the running store.
    raw(dir.path())
        .execute("UPDATE messages SET state = 9", [])
        .expect("raw update");
    match store.get(id).await {
        Err(e) if is_unknown_state(&e) => {}
        other => panic!("get of a row with state code 9: {other:?}"),
    }
    match store.search(MessageFilter::default(), 10, None).await {
        Err(e) if is_unknown_state(&e) => {}
        other => panic!("search over a row with state code 9: {other:?}"),
    }
    store.close().await;
    // Reopening counts messages per state: it refuses, naming the code, rather than
    // counting the row as dead.
    match SqliteStore::open(options(dir.path())) {
        Err(e) if is_unknown_state(&e) => {}
        Err(e) => panic!("reopen failed for another reason: {e}"),
        Ok(_) => panic!("a store with state code 9 on disk opened"),
    }
}
