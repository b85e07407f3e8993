//! Fault tests of the real binary with its store on MariaDB (the local server,
//! `mysql://root@127.0.0.1:3306`, no password; each test on a fresh database
//! `redrive_fault_<random>`, created and dropped with the `mysql` client).
//!
//! **This test binary stops and starts the local MariaDB (`mysqladmin shutdown`, then
//! `start-stop-daemon --start --exec /usr/sbin/mariadbd` as `.ci/run` starts it, so it runs
//! as root) and kills connections.** Each test holds the file lock
//! `/tmp/mariadb-faults.lock` (`flock(2)`, `common/mysql.rs::lock`) for its whole run, so
//! none of them disturbs another, in this process or in another that takes it (the cluster
//! harness on MariaDB does, `cluster_faults.rs`); nothing else may use that MariaDB while
//! it runs (`cargo test` runs test binaries one after another; run by hand beside other
//! MariaDB tests, serialise with them on the same lock, e.g. `flock
//! /tmp/mariadb-faults.lock cargo test -p redrive-store-mysql`). A test that stopped
//! MariaDB starts it again when it ends, failed or not (`MysqlUp`: if MariaDB then crashes
//! at start, as 10.11.19 can after a restart, see docs/DURABILITY.md, it drops this binary's
//! databases with purge off and starts it again).
//!
//! - `kill_9_on_mysql_loses_nothing`: `crash.rs`'s kill -9 test on MariaDB: under publish /
//!   lease / ack / nack load, `kill -9` the server at random moments and restart it on the
//!   same database. Acknowledged publishes lost, acked messages not done and acked messages
//!   delivered again must all be 0. `REDRIVE_MYSQL_CRASH_CYCLES` sets the number of cycles
//!   (default 20).
//! - `mysql_restart_mid_load`: MariaDB stopped under load, kept down a few seconds, started
//!   again. While it is down every request answers 503 `store_unavailable` and so, within
//!   the health probe's interval, does `/readyz`; once it is back the same process serves
//!   again by itself, and nothing answered 2xx is lost.
//! - `mysql_connections_killed_mid_load`: the server's connections (those on its database
//!   in `information_schema.processlist`) ended with `KILL <id>` three times under load; the
//!   server recovers by itself and nothing answered 2xx is lost.
//! - `a_node_ahead_expires_a_killed_nodes_leases`: two nodes on one database, the second
//!   five minutes ahead (libfaketime, as in `cluster_faults.rs`); the first, holding leases,
//!   is killed with `kill -9`; the second must deliver those messages again within their
//!   lease + 1 s (its poller keeps its scheduler's wake-up at most a second ahead on the
//!   database's clock; on its own clock it was five minutes away, and the leases stayed).
//!
//! The first three tests' bodies are `pg_faults.rs`'s (`common/faults.rs`). The figures go
//! to stdout (`-- --nocapture`): `mysql crash test:`, `mysql restart test:`, `mysql kill
//! test:`, `mysql skew test:`.

mod common;

use common::faults::{
    connections_killed_mid_load, kill_9_test, node_ahead_expires_leases, ready, restart_mid_load,
    Database, QUEUES, SKEW_CLUSTER,
};
use common::mysql::{self as my, ensure_mysql_up, MysqlUp};
use common::{free_port, start_with, start_wrapped, Node};
use std::path::Path;

/// Every test database of this binary is `redrive_fault_<random>`.
const DATABASE_PREFIX: &str = "redrive_fault";

/// `redrive serve` with its store in database `db`.
fn start_mysql(dir: &Path, port: u16, db: &my::Database) -> Node {
    start_with(
        dir,
        &dir.join("data"),
        port,
        QUEUES,
        &["--storage-url", &db.url()],
    )
}

/// The local MariaDB, stopped with `mysqladmin shutdown` and started as `.ci/run` does.
const MARIADB: Database = Database {
    name: "MariaDB",
    start_command: "start-stop-daemon --start mariadbd",
    stop: my::mysql_stop,
    start: my::mysql_start,
    accepts: my::mysql_ready,
};

/// The fault tests' lock ([`my::lock`]), waited for off the runtime's threads.
async fn lock() -> std::fs::File {
    tokio::task::spawn_blocking(my::lock).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_on_mysql_loses_nothing() {
    let _lock = lock().await;
    ensure_mysql_up();
    let cycles: u32 = std::env::var("REDRIVE_MYSQL_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let db = my::Database::fresh(DATABASE_PREFIX);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    kill_9_test("mysql crash test", cycles, || {
        start_mysql(dir.path(), port, &db)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_restart_mid_load() {
    let _lock = lock().await;
    ensure_mysql_up();
    let db = my::Database::fresh(DATABASE_PREFIX);
    let dir = tempfile::tempdir().unwrap();
    let _up = MysqlUp {
        prefix: DATABASE_PREFIX,
    };
    let node = ready(start_mysql(dir.path(), free_port(), &db)).await;
    restart_mid_load("mysql restart test", &MARIADB, node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_connections_killed_mid_load() {
    let _lock = lock().await;
    ensure_mysql_up();
    let db = my::Database::fresh(DATABASE_PREFIX);
    let dir = tempfile::tempdir().unwrap();
    let node = ready(start_mysql(dir.path(), free_port(), &db)).await;
    connections_killed_mid_load(
        "mysql kill test",
        "killed",
        node,
        || db.kill_connections(),
        || db.connection_ids().len() as u64,
    )
    .await;
}

/// A leased message of a killed node comes back through a node whose clock is five minutes
/// ahead within its lease + 1 s (`faults::node_ahead_expires_leases`). Figures: `mysql skew
/// test:`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_ahead_expires_a_killed_nodes_leases() {
    let _lock = lock().await;
    ensure_mysql_up();
    let db = my::Database::fresh(DATABASE_PREFIX);
    let config = format!("{SKEW_CLUSTER}{QUEUES}");
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let url = db.url();
    node_ahead_expires_leases("mysql skew test", |i, wrapper| {
        let dir = dirs[i].path();
        start_wrapped(
            wrapper,
            dir,
            &dir.join("data"),
            free_port(),
            &config,
            &["--storage-url", &url],
            None,
        )
    })
    .await;
}
