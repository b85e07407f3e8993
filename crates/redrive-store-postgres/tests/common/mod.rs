//! Shared by the PostgreSQL tests: a fresh schema per test on the local PostgreSQL
//! (`REDRIVE_TEST_PG_URL`, default `postgres://root@127.0.0.1:5432/test`), dropped again
//! when its guard is dropped, also when the test failed.

#![allow(dead_code)]

use redrive_storage::conformance::Setup;
use redrive_store_postgres::{PostgresOptions, PostgresStore};
use std::sync::Once;

/// The database the tests use.
pub fn url() -> String {
    std::env::var("REDRIVE_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".to_owned())
}

/// Run `sql` on a connection of its own, on a thread and runtime of its own (so that it
/// may be called from a `Drop` inside a runtime).
pub fn run_blocking(sql: String) {
    let url = url();
    let text = sql.clone();
    let done = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect to PostgreSQL");
            let conn = tokio::spawn(conn);
            let r = client.batch_execute(&text).await;
            drop(client);
            let _ = conn.await;
            r
        })
    })
    .join();
    match done {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("PostgreSQL test cleanup: {sql}: {e}"),
        Err(_) => eprintln!("PostgreSQL test cleanup panicked: {sql}"),
    }
}

/// A connection of the test's own to the database (its connection task spawned).
pub async fn connect() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(conn);
    client
}

static STALE: Once = Once::new();

/// Drop the schemas earlier runs of this test binary left behind (killed before their
/// guards ran), once per process, before its first schema is made. Each binary has its
/// own prefix, so two binaries never drop each other's schemas.
fn drop_stale(prefix: &str) {
    let prefix = prefix.to_owned();
    STALE.call_once(move || {
        run_blocking(format!(
            "DO $$ DECLARE s text; BEGIN FOR s IN SELECT nspname FROM pg_namespace \
             WHERE nspname LIKE '{prefix}\\_%' LOOP EXECUTE format('DROP SCHEMA %I CASCADE', s); \
             END LOOP; END $$;"
        ));
    });
}

/// A schema of a test: dropped when this is.
#[derive(Debug)]
pub struct SchemaGuard(pub String);

impl Drop for SchemaGuard {
    fn drop(&mut self) {
        run_blocking(format!("DROP SCHEMA IF EXISTS {} CASCADE", self.0));
    }
}

/// A new schema name `PREFIX_<random>`.
pub fn fresh_schema(prefix: &str) -> SchemaGuard {
    drop_stale(prefix);
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    SchemaGuard(format!("{prefix}_{:016x}", h.finish()))
}

/// Options for a store on `schema` with the suite's setup.
pub fn options(schema: &str, setup: &Setup) -> PostgresOptions {
    let mut opts = PostgresOptions::new(url());
    opts.schema = schema.to_owned();
    opts.pool_size = 4;
    opts.store.catalog = setup.catalog.clone();
    opts.store.idempotency_window_ms = setup.idempotency_window_ms;
    opts.store.seed = Some(7);
    opts
}

/// A fresh store on a fresh schema (prefix `prefix`).
pub async fn open(prefix: &str, setup: Setup) -> (PostgresStore, SchemaGuard) {
    let guard = fresh_schema(prefix);
    let store = PostgresStore::open(options(&guard.0, &setup))
        .await
        .expect("open the PostgreSQL store");
    (store, guard)
}

/// The acks of the leases `got`, each by its message's id and its token.
pub fn acks(got: Vec<redrive_storage::Leased>) -> Vec<redrive_storage::Ack> {
    got.into_iter()
        .map(|l| {
            redrive_storage::LeaseRef {
                id: l.message.id,
                token: l.token,
            }
            .into()
        })
        .collect()
}
