//! The storage conformance suite on the PostgreSQL store: one test per case, each on a
//! fresh schema of the local PostgreSQL (`REDRIVE_TEST_PG_URL`), dropped after the case.

mod common;

use redrive_storage::conformance::Setup;

/// A fresh store on a schema of its own; the guard drops the schema.
async fn open(setup: Setup) -> (redrive_store_postgres::PostgresStore, common::SchemaGuard) {
    common::open("redrive_t_conf", setup).await
}

redrive_storage::conformance_tests!(open);

/// Two stores on one fresh schema (two nodes of a cluster); the guard drops the schema.
async fn open_pair(
    setup: Setup,
) -> (
    redrive_store_postgres::PostgresStore,
    redrive_store_postgres::PostgresStore,
    common::SchemaGuard,
) {
    let (a, guard) = common::open("redrive_t_pair", setup.clone()).await;
    let b = redrive_store_postgres::PostgresStore::open(common::options(&guard.0, &setup))
        .await
        .expect("open the second store on the schema");
    (a, b, guard)
}

redrive_storage::conformance_shared_tests!(open_pair);
