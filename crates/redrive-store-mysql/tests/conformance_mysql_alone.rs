//! The storage conformance suite on the MySQL store with group commit off: every publish,
//! ack and nack in a transaction of its own (the path `conformance_mysql.rs` does not take).

mod common;

use redrive_storage::conformance::Setup;
use redrive_store_mysql::MysqlStore;

async fn open(setup: Setup) -> (MysqlStore, common::DbGuard) {
    let guard = common::fresh_database("alone");
    let mut opts = common::options(&guard.0, &setup);
    opts.group_commit = false;
    let store = MysqlStore::open(opts).await.expect("open");
    (store, guard)
}

redrive_storage::conformance_tests!(open);
