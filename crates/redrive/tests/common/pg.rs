//! The local PostgreSQL for the tests that put the binary's store on it: `psql`, a fresh
//! schema per test (dropped after), and `pg_ctlcluster` to stop, start and restart the
//! cluster (these tests run as root, see `pg_faults.rs`).

use std::process::Command;
use std::time::{Duration, Instant};

/// The database every test's schema is made in (the cluster `pg_ctlcluster` restarts).
pub const PG_URL: &str = "postgres://root@127.0.0.1:5432/test";

/// `psql` on the test database: its unaligned output, or its error.
pub fn psql(sqls: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new("psql");
    cmd.args(["-h", "127.0.0.1", "-U", "root", "-d", "test"])
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"]);
    for sql in sqls {
        cmd.args(["-c", sql]);
    }
    let out = cmd.output().map_err(|e| format!("psql: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// A test's schema, dropped (with everything in it) when this is.
pub struct Schema(pub String);

impl Schema {
    /// A new name `<prefix>_<random>` (`prefix` a lowercase identifier, one per test
    /// binary); the first call of a run drops the schemas with that prefix an earlier run
    /// left behind (killed before its guards ran).
    pub fn fresh(prefix: &str) -> Schema {
        static STALE: std::sync::Once = std::sync::Once::new();
        STALE.call_once(|| {
            let pattern = format!("{}\\_%", prefix.replace('_', "\\_"));
            let stale = psql(&[&format!(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE '{pattern}'"
            )])
            .unwrap_or_default();
            for s in stale.lines() {
                Schema(s.trim().to_owned()).drop_now();
            }
        });
        let n = super::unique_number();
        Schema(format!("{prefix}_{n:016x}"))
    }

    pub fn drop_now(&self) {
        if let Err(e) = psql(&[
            "SET lock_timeout = '30s'",
            &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.0),
        ]) {
            eprintln!("dropping schema {}: {e}", self.0);
        }
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        self.drop_now();
    }
}

/// The version of the local cluster (`/etc/postgresql/<version>/main`).
pub fn pg_version() -> String {
    let mut versions: Vec<String> = std::fs::read_dir("/etc/postgresql")
        .expect("/etc/postgresql: a Debian PostgreSQL cluster")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    versions.sort();
    versions
        .pop()
        .expect("a PostgreSQL version in /etc/postgresql")
}

/// `pg_ctlcluster <version> main <action>` (waits until done).
pub fn pg_ctl(action: &str) -> bool {
    Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &pg_version(), "main", action])
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether PostgreSQL accepts connections.
pub fn pg_ready() -> bool {
    Command::new("pg_isready")
        .args(["-q", "-h", "127.0.0.1", "-p", "5432"])
        .status()
        .is_ok_and(|s| s.success())
}

/// Start PostgreSQL if it is down and wait until it accepts connections.
pub fn ensure_pg_up() {
    if !pg_ready() {
        pg_ctl("start");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pg_ready() {
        assert!(Instant::now() < deadline, "PostgreSQL did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// PostgreSQL is up again when this is dropped, also when the test failed half-way.
pub struct PgUp;

impl Drop for PgUp {
    fn drop(&mut self) {
        ensure_pg_up();
    }
}
