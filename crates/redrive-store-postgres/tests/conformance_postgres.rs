//! The storage conformance suite on the PostgreSQL store: one test per case, each on a
//! fresh schema of the local PostgreSQL (`REDRIVE_TEST_PG_URL`), dropped after the case.

mod common;

use redrive_storage::conformance::Setup;

/// A fresh store on a schema of its own; the guard drops the schema.
async fn open(setup: Setup) -> (redrive_store_postgres::PostgresStore, common::SchemaGuard) {
    common::open("redrive_t_conf", setup).await
}

redrive_storage::conformance_tests!(open);
