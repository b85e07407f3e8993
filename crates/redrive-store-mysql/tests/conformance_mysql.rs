//! The storage conformance suite on the MySQL / MariaDB store: one test per case, each on a
//! fresh database of the local server (`REDRIVE_TEST_MYSQL_URL`), dropped after the case.

mod common;

use redrive_storage::conformance::Setup;

/// A fresh store on a database of its own; the guard drops the database.
async fn open(setup: Setup) -> (redrive_store_mysql::MysqlStore, common::DbGuard) {
    common::open("conf", setup).await
}

redrive_storage::conformance_tests!(open);

/// Two stores on one fresh database (two nodes of a cluster); the guard drops it.
async fn open_pair(
    setup: Setup,
) -> (
    redrive_store_mysql::MysqlStore,
    redrive_store_mysql::MysqlStore,
    common::DbGuard,
) {
    let (a, guard) = common::open("conf", setup.clone()).await;
    let b = redrive_store_mysql::MysqlStore::open(common::options(&guard.0, &setup))
        .await
        .expect("open the second store on the database");
    (a, b, guard)
}

redrive_storage::conformance_shared_tests!(open_pair);
