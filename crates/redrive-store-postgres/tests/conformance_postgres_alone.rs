//! The storage conformance suite on the PostgreSQL store with group commit off: every
//! publish, ack and nack in a transaction of its own (the path `conformance_postgres.rs`
//! does not take).

mod common;

use redrive_storage::conformance::Setup;
use redrive_store_postgres::PostgresStore;

async fn open(setup: Setup) -> (PostgresStore, common::SchemaGuard) {
    let guard = common::fresh_schema("redrive_t_alone");
    let mut opts = common::options(&guard.0, &setup);
    opts.group_commit = false;
    let store = PostgresStore::open(opts).await.expect("open");
    (store, guard)
}

redrive_storage::conformance_tests!(open);
