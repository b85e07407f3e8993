//! Running it in production (SPEC §6), with the real binary:
//!
//! - one server per data directory: a second `serve` on the same directory exits 2 naming
//!   the lock file and the PID holding it, and the first keeps serving; a lock file left by
//!   a `kill -9`'d server does not block the restart;
//! - `redrive backup` under load: a server started on the copy has every message whose
//!   publish or ack was acknowledged before the backup began; a destination that is not new
//!   or empty is refused, naming it;
//! - the start-up line names the store, the data directory, the console URL and the queues
//!   of the configuration, and nothing the server prints to a pipe carries a colour escape.

mod common;

use common::load::{check, Ledger, Load};
use common::{free_port, start, start_in, wait_ready, Node};
use redrive_client::{Client, LeaseRequest, Publish};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Nacked messages come straight back and never die (as in the crash test): every message
/// keeps circulating until it is acked.
const CONFIG: &str = r#"
[queues.ops.retry]
backoff = "fixed"
initial_delay = "0s"
jitter = "none"
max_attempts = 1000000
"#;

fn redrive() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_redrive"));
    // Test knobs are no server settings (the server refuses unknown REDRIVE_* keys).
    c.env_remove("REDRIVE_CRASH_CYCLES")
        .env_remove("REDRIVE_POWER_CUT_CYCLES")
        .env_remove("REDRIVE_TOKEN");
    c
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Wait at most `limit` for `child` to exit, then collect what it printed; a child still
/// running then is killed and reported as such.
fn finish_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!("{what} was still running after {limit:?}: {}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn api(node: &Node) -> Client {
    Client::new(&node.base).expect("a server URL")
}

async fn publish_one(node: &Node, n: u32) -> String {
    api(node)
        .publish("ops", &Publish::new(serde_json::json!({ "n": n })))
        .await
        .expect("publish")
        .message
        .id
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_one_data_dir_exits_2_naming_the_lock_and_pid() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut first = start(dir.path(), free_port(), CONFIG);
    assert!(wait_ready(&reqwest::Client::new(), &mut first).await);
    let before = publish_one(&first, 1).await;

    let second_port = free_port();
    let second = redrive()
        .args(["serve", "--listen", &format!("127.0.0.1:{second_port}")])
        .arg("--data-dir")
        .arg(&data)
        .arg("--config")
        .arg(dir.path().join("redrive.toml"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the second server");
    let out = finish_within(second, Duration::from_secs(20), "the second server");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let lock = data.join("redrive.lock");
    assert!(
        stderr.contains(&lock.display().to_string()),
        "names the lock file: {}",
        text(&out)
    );
    assert!(
        stderr.contains(&format!("PID {}", first.child.id())),
        "names the PID holding it: {}",
        text(&out)
    );

    // The first is untouched: it serves, its data is intact, and it keeps writing.
    assert!(
        first.child.try_wait().unwrap().is_none(),
        "the first exited"
    );
    let client = api(&first);
    client.readyz().await.expect("the first is ready");
    assert_eq!(
        client.get(&before).await.expect("get").id.to_string(),
        before
    );
    let after = publish_one(&first, 2).await;
    let leased = client
        .lease(
            "ops",
            &LeaseRequest {
                max: Some(10),
                lease: Some("30s".into()),
                wait: None,
            },
        )
        .await
        .expect("lease");
    let ids: Vec<String> = leased.iter().map(|m| m.id.to_string()).collect();
    assert_eq!(ids, [before.clone(), after.clone()]);
    for m in &leased {
        client.ack(&m.id.to_string(), &m.lease).await.expect("ack");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_left_by_a_killed_server_does_not_block_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let http = reqwest::Client::new();
    let mut node = start(dir.path(), port, CONFIG);
    assert!(wait_ready(&http, &mut node).await);
    let id = publish_one(&node, 1).await;
    let killed = node.child.id();
    node.child.kill().unwrap(); // SIGKILL: no destructor, no unlock
    node.child.wait().unwrap();
    let lock = dir.path().join("data/redrive.lock");
    assert_eq!(
        std::fs::read_to_string(&lock).expect("the lock file stays behind"),
        format!("{killed}\n")
    );

    let mut node = start(dir.path(), port, CONFIG);
    assert!(
        wait_ready(&http, &mut node).await,
        "a stale lock file blocked the restart"
    );
    assert_eq!(api(&node).get(&id).await.expect("get").id.to_string(), id);
    assert_eq!(
        std::fs::read_to_string(&lock).unwrap(),
        format!("{}\n", node.child.id()),
        "the restarted server holds the lock now"
    );
    // And it holds it: another server is refused naming the new PID.
    let out = redrive()
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let out = finish_within(out, Duration::from_secs(20), "the second server");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("PID {}", node.child.id())),
        "{}",
        text(&out)
    );
}

/// Run `redrive backup --data-dir DIR --to OUT`.
fn backup(data: &Path, out: &Path) -> Output {
    redrive()
        .arg("backup")
        .arg("--data-dir")
        .arg(data)
        .arg("--to")
        .arg(out)
        .output()
        .expect("run redrive backup")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backup_under_load_has_everything_acknowledged_before_it_began() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut node = start(dir.path(), free_port(), CONFIG);
    assert!(wait_ready(&http, &mut node).await);
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let load = Load {
        client: http.clone(),
        base: node.base.clone(),
        queue: "ops".into(),
        ledger: ledger.clone(),
        next: Arc::new(Mutex::new(0)),
        delayed: false,
    };
    let stop = Instant::now() + Duration::from_secs(6);
    let mut tasks = Vec::new();
    for i in 0..4 {
        tasks.push(tokio::spawn(load.clone().producer(stop)));
        tasks.push(tokio::spawn(load.clone().consumer(i, stop)));
    }
    tokio::time::sleep(Duration::from_millis(2_500)).await;

    // What the clients were told before the backup began: it must all be in the copy.
    let promised = {
        let l = ledger.lock().unwrap();
        Ledger {
            published: l.published.clone(),
            acked: l.acked.clone(),
            ..Ledger::default()
        }
    };
    let copy = dir.path().join("copy");
    let started = Instant::now();
    let out = tokio::task::spawn_blocking({
        let (data, copy) = (data.clone(), copy.clone());
        move || backup(&data, &copy)
    })
    .await
    .unwrap();
    let backup_ms = started.elapsed().as_millis();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let during = ledger.lock().unwrap().published.len() - promised.published.len();
    for t in tasks {
        t.await.unwrap();
    }
    let after = ledger.lock().unwrap().published.len();
    assert!(
        after > promised.published.len(),
        "the load stopped during the backup"
    );
    assert!(
        ledger.lock().unwrap().refused.is_empty(),
        "the live server refused requests during the backup: {:?}",
        ledger.lock().unwrap().refused
    );
    let live = load.snapshot().await;

    // A server on the copy, beside the live one (the copy is a store of its own).
    let copy_config = dir.path().join("copy-config");
    std::fs::create_dir(&copy_config).unwrap();
    let mut restored = start_in(&copy_config, &copy, free_port(), CONFIG);
    assert!(wait_ready(&http, &mut restored).await);
    let snap = Load {
        base: restored.base.clone(),
        ..load.clone()
    }
    .snapshot()
    .await;
    let (lost, acked_not_done) = check(&promised, &snap);
    println!(
        "backup test: published_before={} acked_before={} published_while_backing_up={during} published_in_all={after} \
         backup_ms={backup_ms} in_copy={} in_live={} lost={lost} acked_not_done={acked_not_done}\n{}",
        promised.published.len(),
        promised.acked.len(),
        snap.len(),
        live.len(),
        String::from_utf8_lossy(&out.stdout).trim()
    );
    assert!(
        promised.published.len() > 100 && !promised.acked.is_empty(),
        "too little load before the backup to prove anything"
    );
    assert_eq!(lost, 0, "acknowledged publishes missing from the copy");
    assert_eq!(acked_not_done, 0, "acked messages not done in the copy");
    assert!(
        snap.len() < live.len(),
        "the copy is a snapshot: the live store went on"
    );
    // The copy is a working store: publish, lease and ack on it.
    let id = publish_one(&restored, 0).await;
    assert_eq!(
        api(&restored).get(&id).await.expect("get").id.to_string(),
        id
    );
}

#[test]
fn backup_refuses_a_destination_that_is_not_new_or_empty() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // No store there yet.
    let out = backup(&data, &dir.path().join("a"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&data.display().to_string()),
        "{}",
        text(&out)
    );
    assert!(!dir.path().join("a").exists(), "created the destination");

    std::fs::create_dir_all(&data).unwrap();
    make_store(&data);
    let full = dir.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("keep.txt"), "mine").unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, "mine").unwrap();
    for out_dir in [&full, &file] {
        let out = backup(&data, out_dir);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(&out_dir.display().to_string()),
            "names the destination: {}",
            text(&out)
        );
    }
    assert_eq!(
        std::fs::read_dir(&full).unwrap().count(),
        1,
        "wrote into it"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
    // An empty directory is fine.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = backup(&data, &empty);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let names: Vec<String> = std::fs::read_dir(&empty)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["redrive.db"], "one self-contained file");
}

/// Make a store in `data` the way an operator would: start a server on it and SIGTERM it.
fn make_store(data: &Path) {
    let port = free_port();
    let mut child = redrive()
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(data)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !data.join("redrive.db").exists()
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
    {
        assert!(Instant::now() < deadline, "the server did not start");
        assert!(child.try_wait().unwrap().is_none(), "the server exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    sigterm(&child);
    let out = finish_within(child, Duration::from_secs(20), "the server after SIGTERM");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

fn sigterm(child: &Child) {
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
}

#[test]
fn startup_line_names_store_console_and_queues_without_colour() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("redrive.toml");
    std::fs::write(
        &config,
        "[queues.default.retry]\nmax_attempts = 4\n\n[queues.beta.retry]\nmax_attempts = 3\n\n\
         [queues.alpha.retry]\nmax_attempts = 5\n",
    )
    .unwrap();
    let port = free_port();
    let mut child = redrive()
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(&data)
        .arg("--config")
        .arg(&config)
        // The config's `log` (info by default) decides; no colour switch from outside.
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redrive serve");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut printed = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let line = loop {
        assert!(Instant::now() < deadline, "no start-up line: {printed}");
        let mut line = String::new();
        if stdout.read_line(&mut line).unwrap() == 0 {
            panic!("redrive exited before its start-up line: {printed}");
        }
        printed.push_str(&line);
        if line.contains("redrive listening") {
            break line;
        }
    };
    sigterm(&child);
    stdout.read_to_string(&mut printed).unwrap();
    let out = finish_within(child, Duration::from_secs(20), "redrive after SIGTERM");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{printed}{stderr}");
    assert!(
        !printed.contains("\x1b[") && !stderr.contains("\x1b["),
        "colour escapes in output to a pipe: {printed:?} {stderr:?}"
    );
    for field in [
        "store=sqlite".to_owned(),
        format!("at={}", data.display()),
        format!("console=http://127.0.0.1:{port}/ui"),
        r#"queues=["alpha", "beta"]"#.to_owned(),
        format!("addr=127.0.0.1:{port}"),
    ] {
        assert!(line.contains(&field), "{field} missing from: {line}");
    }
}
