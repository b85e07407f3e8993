//! Shared by the MySQL tests: a fresh database per test on the local MySQL / MariaDB
//! (`REDRIVE_TEST_MYSQL_URL`, default `mysql://root@127.0.0.1:3306/test`), dropped again
//! when its guard is dropped, also when the test failed.

#![allow(dead_code)]

use mysql_async::prelude::Queryable;
use redrive_storage::conformance::Setup;
use redrive_store_mysql::{MysqlOptions, MysqlStore};
use std::sync::Once;

/// The server the tests use (its database is only where the admin connection lands).
pub fn url() -> String {
    std::env::var("REDRIVE_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// The URL of database `db` on the test server.
pub fn url_of(db: &str) -> String {
    let base = url();
    let (base, query) = match base.split_once('?') {
        Some((b, q)) => (b.to_owned(), format!("?{q}")),
        None => (base, String::new()),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_part = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => &base[..],
    };
    format!("{host_part}/{db}{query}")
}

/// Run `sql` on a connection of its own, on a thread and runtime of its own (so that it
/// may be called from a `Drop` inside a runtime); the rows of its first column.
pub fn run_blocking(sql: String) -> Vec<String> {
    let url = url();
    let text = sql.clone();
    let done = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let opts = mysql_async::Opts::from_url(&url).expect("REDRIVE_TEST_MYSQL_URL");
            let mut c = mysql_async::Conn::new(opts).await?;
            let rows: Vec<mysql_async::Row> = c.query(text).await?;
            let _ = c.disconnect().await;
            Ok::<_, mysql_async::Error>(
                rows.into_iter()
                    .filter_map(|r| r.get_opt::<String, usize>(0).and_then(Result::ok))
                    .collect(),
            )
        })
    })
    .join();
    match done {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => {
            eprintln!("MySQL test helper: {sql}: {e}");
            Vec::new()
        }
        Err(_) => {
            eprintln!("MySQL test helper panicked: {sql}");
            Vec::new()
        }
    }
}

static STALE: Once = Once::new();

/// Drop the databases earlier runs of this test binary left behind (killed before their
/// guards ran), once per process, before its first database is made. Each binary has its
/// own prefix, so two binaries never drop each other's databases.
fn drop_stale(prefix: &str) {
    let prefix = prefix.to_owned();
    STALE.call_once(move || {
        let stale = run_blocking(format!(
            "SELECT schema_name FROM information_schema.schemata \
             WHERE schema_name LIKE '{}\\_%'",
            prefix.replace('_', "\\_")
        ));
        for db in stale {
            run_blocking(format!("DROP DATABASE IF EXISTS `{db}`"));
        }
    });
}

/// A database of a test: dropped when this is.
#[derive(Debug)]
pub struct DbGuard(pub String);

impl Drop for DbGuard {
    fn drop(&mut self) {
        // A test that failed may have left a connection in a transaction on its database
        // (an application's, in `sql_publish.rs`), whose metadata locks the DROP would wait
        // for: end the connections still using it first.
        for id in run_blocking(format!(
            "SELECT CAST(id AS CHAR) FROM information_schema.processlist \
             WHERE db = '{}' AND id <> CONNECTION_ID()",
            self.0
        )) {
            run_blocking(format!("KILL {id}"));
        }
        run_blocking(format!("DROP DATABASE IF EXISTS `{}`", self.0));
    }
}

/// A new, empty database `redrive_t_PREFIX_<random>`.
pub fn fresh_database(prefix: &str) -> DbGuard {
    let prefix = format!("redrive_t_{prefix}");
    drop_stale(&prefix);
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let name = format!("{prefix}_{:016x}", h.finish());
    run_blocking(format!("CREATE DATABASE `{name}`"));
    DbGuard(name)
}

/// Options for a store on database `db` with the suite's setup.
pub fn options(db: &str, setup: &Setup) -> MysqlOptions {
    let mut opts = MysqlOptions::new(url_of(db));
    opts.pool_size = 4;
    opts.store.catalog = setup.catalog.clone();
    opts.store.idempotency_window_ms = setup.idempotency_window_ms;
    opts.store.seed = Some(7);
    opts
}

/// A fresh store on a fresh database (prefix `prefix`).
pub async fn open(prefix: &str, setup: Setup) -> (MysqlStore, DbGuard) {
    let guard = fresh_database(prefix);
    let store = MysqlStore::open(options(&guard.0, &setup))
        .await
        .expect("open the MySQL store");
    (store, guard)
}
