//! Helpers shared by the binary's integration tests: start `redrive serve` on a free
//! loopback port with a config, and wait until it is ready. `load` is the crash tests'
//! publish / lease / ack load and its ledger; `faults` the fault tests of a shared store
//! (`pg_faults.rs`, `mysql_faults.rs`); `pg` and `mysql` the local PostgreSQL and MariaDB.
#![allow(dead_code)]

pub mod faults;
pub mod load;
pub mod mysql;
pub mod pg;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct Node {
    pub child: Child,
    pub base: String,
}

impl Drop for Node {
    /// A test that fails half-way leaves no server running (tests kill their nodes
    /// themselves; a second kill of a reaped child is harmless).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start with the config file in `dir` and the data in `dir/data`.
pub fn start(dir: &Path, port: u16, config_text: &str) -> Node {
    start_in(dir, &dir.join("data"), port, config_text)
}

/// Start with the config file in `config_dir` and the data in `data_dir`.
pub fn start_in(config_dir: &Path, data_dir: &Path, port: u16, config_text: &str) -> Node {
    start_with(config_dir, data_dir, port, config_text, &[])
}

/// [`start_in`] with `extra` arguments after `serve`'s own (e.g. `--storage-url URL`).
pub fn start_with(
    config_dir: &Path,
    data_dir: &Path,
    port: u16,
    config_text: &str,
    extra: &[&str],
) -> Node {
    start_wrapped(&[], config_dir, data_dir, port, config_text, extra, None)
}

/// [`start_with`] run through `wrapper` (a program and its arguments that runs the command
/// after them, e.g. `["faketime", "-f", "+5m"]`); empty: the binary itself. With `log`,
/// the server's log (stdout) and anything on its stderr are appended to that file; without,
/// its log is dropped and its stderr is this process's.
pub fn start_wrapped(
    wrapper: &[&str],
    config_dir: &Path,
    data_dir: &Path,
    port: u16,
    config_text: &str,
    extra: &[&str],
    log: Option<&Path>,
) -> Node {
    let config = config_dir.join("redrive.toml");
    std::fs::write(&config, config_text).unwrap();
    // `REDRIVE_TEST_BIN` runs another build of the binary (e.g. a copy, so that a long run
    // goes on while the tree is rebuilt).
    let bin = std::env::var("REDRIVE_TEST_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_redrive").to_owned());
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(&bin);
            c
        }
        None => Command::new(&bin),
    };
    // The server logs to stdout; a panic's message goes to stderr.
    let (stdout, stderr) = match log {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .expect("open the node's log file");
            let copy = file.try_clone().expect("a second handle on the log file");
            (Stdio::from(file), Stdio::from(copy))
        }
        None => (Stdio::null(), Stdio::inherit()),
    };
    let child = cmd
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(data_dir)
        .arg("--config")
        .arg(&config)
        .args(extra)
        .env("RUST_LOG", "warn")
        // Test knobs are no server settings (the server refuses unknown REDRIVE_* keys).
        .env_remove("REDRIVE_CRASH_CYCLES")
        .env_remove("REDRIVE_POWER_CUT_CYCLES")
        .env_remove("REDRIVE_PG_CRASH_CYCLES")
        .env_remove("REDRIVE_MYSQL_CRASH_CYCLES")
        .env_remove("REDRIVE_CLUSTER_FAULT_STORE")
        .env_remove("REDRIVE_CLUSTER_FAULT_SECS")
        .env_remove("REDRIVE_TEST_BIN")
        .env_remove("REDRIVE_TASK_CRASH_MESSAGES")
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .expect("spawn redrive serve");
    Node {
        child,
        base: format!("http://127.0.0.1:{port}"),
    }
}

/// Whether the node answered `/readyz` with a 2xx within 30 s (through the typed
/// client over `client`).
pub async fn wait_ready(client: &reqwest::Client, node: &mut Node) -> bool {
    let api = redrive_client::Client::with_http(&node.base, client.clone()).expect("a server URL");
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = node.child.try_wait() {
            panic!("redrive exited during start: {status}");
        }
        if api.readyz().await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// `GET /v1/cluster` on `base`: the names of the live nodes, and the leader's (if one
/// leads); `None` when the node does not answer it.
pub async fn cluster_view(
    client: &reqwest::Client,
    base: &str,
) -> Option<(Vec<String>, Option<String>)> {
    let v: serde_json::Value = client
        .get(format!("{base}/v1/cluster"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let live = v["nodes"]
        .as_array()?
        .iter()
        .filter(|n| n["live"] == true)
        .filter_map(|n| n["node"].as_str().map(str::to_owned))
        .collect();
    Some((live, v["leader"]["node"].as_str().map(str::to_owned)))
}

/// A number for a test database's or schema's name that no other call makes, in this
/// process or another one running beside it: the clock's nanoseconds and the process id,
/// and a count of the calls (two tests of one process may read the same nanoseconds: two
/// imports once made the same database).
pub fn unique_number() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    nanos ^ (u64::from(std::process::id()) << 32) ^ (CALLS.fetch_add(1, Ordering::Relaxed) << 56)
}
