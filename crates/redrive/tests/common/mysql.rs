//! The local MariaDB for the tests that put the binary's store on it: the `mysql` client
//! (127.0.0.1:3306, user root, no password), a fresh database per test (dropped after),
//! the server's connections found and killed by database, and MariaDB stopped and started
//! as `.ci/run` starts it (`start-stop-daemon … --exec /usr/sbin/mariadbd`, so these tests
//! run as root, see `mysql_faults.rs`), under a file lock that serialises the tests which
//! stop it ([`lock`]).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The server every test's database is made on (a test's URL adds `/<database>`).
pub const MYSQL_SERVER: &str = "mysql://root@127.0.0.1:3306";
/// The file lock every test that stops MariaDB or kills connections on it holds for its
/// whole run ([`lock`]); take it by hand too: `flock /tmp/mariadb-faults.lock cargo test …`.
pub const LOCK_FILE: &str = "/tmp/mariadb-faults.lock";
/// The server's program, as `.ci/run` starts it.
const MARIADBD: &str = "/usr/sbin/mariadbd";

/// `mysql` on the server (no database): its output (tab-separated, no column names), or
/// its error. `force`: go on after a statement that failed (its error is on stderr).
fn mysql_cli(sql: &str, force: bool) -> Result<String, String> {
    let mut cmd = Command::new("mysql");
    cmd.args(["-h", "127.0.0.1", "-P", "3306", "-u", "root", "-N", "-B"]);
    if force {
        cmd.arg("--force");
    }
    let out = cmd
        .args(["-e", sql])
        .output()
        .map_err(|e| format!("mysql: {e}"))?;
    if out.status.success() || force {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// `mysql -e sql`: its output, or its error.
pub fn mysql(sql: &str) -> Result<String, String> {
    mysql_cli(sql, false)
}

/// A test's database, dropped (with everything in it) when this is.
pub struct Database(pub String);

impl Database {
    /// A new database `<prefix>_<random>` (`prefix` a lowercase identifier, one per test
    /// binary), created empty; the first call of a run drops the databases with that
    /// prefix an earlier run left behind (killed before its guards ran). Call it with the
    /// [`lock`] held, so that no running test's database is taken for a stale one.
    pub fn fresh(prefix: &str) -> Database {
        static STALE: std::sync::Once = std::sync::Once::new();
        STALE.call_once(|| {
            let pattern = format!("{}\\_%", prefix.replace('_', "\\_"));
            let stale = mysql(&format!(
                "SELECT schema_name FROM information_schema.schemata \
                 WHERE schema_name LIKE '{pattern}'"
            ))
            .unwrap_or_default();
            for d in stale.lines().filter(|l| !l.trim().is_empty()) {
                Database(d.trim().to_owned()).drop_now();
            }
        });
        let n = super::unique_number();
        let db = Database(format!("{prefix}_{n:016x}"));
        mysql(&format!("CREATE DATABASE {}", db.0)).expect("CREATE DATABASE");
        db
    }

    /// The storage URL of this database.
    pub fn url(&self) -> String {
        format!("{MYSQL_SERVER}/{}", self.0)
    }

    pub fn drop_now(&self) {
        if let Err(e) = mysql(&format!(
            "SET SESSION lock_wait_timeout = 30; DROP DATABASE IF EXISTS {}",
            self.0
        )) {
            eprintln!("dropping database {}: {e}", self.0);
        }
    }

    /// The ids of the connections on this database (`information_schema.processlist`,
    /// by database: every connection of a server whose store is here), but the asker's.
    pub fn connection_ids(&self) -> Vec<u64> {
        mysql(&format!(
            "SELECT id FROM information_schema.processlist \
             WHERE user = 'root' AND db = '{}' AND id <> CONNECTION_ID()",
            self.0
        ))
        .expect("information_schema.processlist")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
    }

    /// `KILL <id>` every connection on this database: how many there were (one that ended
    /// meanwhile is no error).
    pub fn kill_connections(&self) -> u64 {
        let ids = self.connection_ids();
        if !ids.is_empty() {
            let kills: Vec<String> = ids.iter().map(|id| format!("KILL {id};")).collect();
            let _ = mysql_cli(&kills.join(" "), true);
        }
        ids.len() as u64
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        self.drop_now();
    }
}

/// Whether MariaDB accepts connections (`mysqladmin ping`).
pub fn mysql_ready() -> bool {
    Command::new("mysqladmin")
        .args([
            "-h",
            "127.0.0.1",
            "-P",
            "3306",
            "-u",
            "root",
            "--connect-timeout=2",
        ])
        .arg("ping")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether a `mariadbd` process runs (`start-stop-daemon --status`, the same match as the
/// start's: a server still shutting down counts, and `--start --oknodo` would not start
/// another).
fn mariadbd_running() -> bool {
    Command::new("start-stop-daemon")
        .args(["--status", "--exec", MARIADBD])
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether anything listens on 127.0.0.1:3306.
fn port_open() -> bool {
    std::net::TcpStream::connect_timeout(
        &"127.0.0.1:3306".parse().unwrap(),
        Duration::from_millis(500),
    )
    .is_ok()
}

/// Stop MariaDB (`mysqladmin shutdown`) and wait until its process has exited and the port
/// is closed (at most 60 s).
pub fn mysql_stop() -> bool {
    let _ = Command::new("mysqladmin")
        .args(["-h", "127.0.0.1", "-P", "3306", "-u", "root", "shutdown"])
        .stdout(Stdio::null())
        .status();
    let deadline = Instant::now() + Duration::from_secs(60);
    while mariadbd_running() || port_open() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// Start MariaDB as `.ci/run` does (with `args` after `--`, for [`MysqlUp`]'s recovery) and
/// wait until `mysqladmin ping` answers (at most 60 s; false also when it crashed at start).
/// It starts with an environment of its own, not this test's: MariaDB would take a
/// `TMPDIR` it cannot write for its temporary files and refuse to start.
fn start_mariadbd(args: &[&str]) -> bool {
    let mut cmd = Command::new("start-stop-daemon");
    cmd.env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .args(["--start", "--oknodo", "--background", "--exec", MARIADBD]);
    if !args.is_empty() {
        cmd.arg("--").args(args);
    }
    if !cmd.status().is_ok_and(|s| s.success()) {
        return false;
    }
    let started = Instant::now();
    while !mysql_ready() {
        // Started, then gone: it crashed while starting (its log says why).
        let gone = started.elapsed() > Duration::from_secs(2) && !mariadbd_running();
        if gone || started.elapsed() > Duration::from_secs(60) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// Start MariaDB as `.ci/run` does and wait until `mysqladmin ping` answers (at most 60 s).
pub fn mysql_start() -> bool {
    start_mariadbd(&[])
}

/// Stop MariaDB and start it again.
pub fn mysql_restart() -> bool {
    mysql_stop() && mysql_start()
}

/// Start MariaDB if it is down (waiting for a shutdown in progress to end first) and wait
/// until it accepts connections; whether it does.
fn bring_mysql_up() -> bool {
    if mysql_ready() {
        return true;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while mariadbd_running() && !mysql_ready() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    mysql_ready() || mysql_start()
}

/// Start MariaDB if it is down and wait until it accepts connections (else fail the test).
pub fn ensure_mysql_up() {
    assert!(
        bring_mysql_up(),
        "MariaDB did not come up (start-stop-daemon --start --exec {MARIADBD}; its log: \
         /var/log/mysql/error.log)"
    );
}

/// MariaDB is up again when this is dropped, also when the test failed half-way (then a
/// start that fails is said on stderr: a second panic would abort the test binary).
///
/// MariaDB 10.11.19 can crash (signal 11 in a purge task) at every start after a restart
/// that left undo records of the store's `messages` table to purge (its indexed VIRTUAL
/// columns; docs/DURABILITY.md, "MariaDB"). Then this starts it with purge off
/// (`--innodb-force-recovery=2`), drops the databases of this test binary (`<prefix>_…`,
/// theirs alone: the tests that use them hold [`lock`]), and starts it normally again; if
/// that still fails, it leaves MariaDB running with purge off rather than down, and says so.
pub struct MysqlUp {
    /// The prefix of this test binary's databases (`Database::fresh`).
    pub prefix: &'static str,
}

impl MysqlUp {
    /// The recovery above; whether MariaDB runs normally again.
    fn recover(&self) -> bool {
        eprintln!(
            "MariaDB does not start (see /var/log/mysql/error.log): starting it with purge off \
             to drop this binary's databases {}_…",
            self.prefix
        );
        let _ = mysql_stop();
        if !start_mariadbd(&["--innodb-force-recovery=2"]) {
            eprintln!("MariaDB does not start even with --innodb-force-recovery=2");
            return false;
        }
        let pattern = format!("{}\\_%", self.prefix.replace('_', "\\_"));
        let dbs = mysql(&format!(
            "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE '{pattern}'"
        ))
        .unwrap_or_default();
        for d in dbs.lines().filter(|l| !l.trim().is_empty()) {
            eprintln!("dropping {d} with purge off");
            Database(d.trim().to_owned()).drop_now();
        }
        if mysql_stop() && mysql_start() {
            eprintln!("MariaDB runs normally again");
            return true;
        }
        eprintln!(
            "MariaDB still crashes at start: left running with --innodb-force-recovery=2 (purge \
             off); restart it normally once the cause is dealt with"
        );
        let _ = start_mariadbd(&["--innodb-force-recovery=2"]);
        false
    }
}

impl Drop for MysqlUp {
    fn drop(&mut self) {
        let up = bring_mysql_up() || self.recover();
        if !up && !std::thread::panicking() {
            panic!(
                "MariaDB did not come up again (start-stop-daemon --start --exec {MARIADBD}; its \
                 log: /var/log/mysql/error.log)"
            );
        }
    }
}

/// Wait for, and hold until the returned file is dropped, the exclusive lock on
/// [`LOCK_FILE`] (`flock(2)`, the lock `flock /tmp/mariadb-faults.lock …` takes): two
/// tests that stop MariaDB or kill its connections never run at once, in this process or
/// another that takes it.
pub fn lock() -> std::fs::File {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK_FILE)
        .expect("open the MariaDB fault tests' lock file");
    file.lock()
        .expect("flock the MariaDB fault tests' lock file");
    file
}
