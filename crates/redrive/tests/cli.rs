//! The CLI's client commands against a real server: output, and exit codes that scripts
//! can rely on (0 success, 1 an HTTP error from the server, 2 bad usage, 3 unreachable).

mod common;

use common::{free_port, start, wait_ready};
use serde_json::Value;
use std::process::{Command, Output};

const CONFIG: &str = r#"
[queues.cli.retry]
max_attempts = 1
"#;

fn redrive(server: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_redrive"))
        .arg("--server")
        .arg(server)
        .args(args)
        .env_remove("REDRIVE_TOKEN")
        .output()
        .expect("run redrive")
}

/// Run redrive with a stdout whose reader is gone: a socket whose other end is already
/// closed, so the first write fails with a broken pipe, whatever the timing.
fn redrive_into_closed_pipe(server: &str, args: &[&str]) -> Output {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socket pair");
    drop(ours);
    Command::new(env!("CARGO_BIN_EXE_redrive"))
        .arg("--server")
        .arg(server)
        .args(args)
        .env_remove("REDRIVE_TOKEN")
        .stdout(std::process::Stdio::from(std::os::fd::OwnedFd::from(
            theirs,
        )))
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run redrive")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("not JSON: {}", text(o)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_commands_against_a_live_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path(), free_port(), CONFIG);
    assert!(wait_ready(&reqwest::Client::new(), &mut node).await);
    let s = node.base.clone();

    let o = redrive(
        &s,
        &[
            "publish",
            "cli",
            r#"{"order": 7}"#,
            "--key",
            "k1",
            "--header",
            "source=test",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let m = json(&o);
    assert_eq!(m["state"], "ready", "{}", text(&o));
    assert_eq!(m["headers"]["source"], "test");
    let id = m["id"].as_str().unwrap().to_owned();

    let o = redrive(&s, &["messages", "show", &id]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(json(&o)["payload"]["order"], 7);

    let o = redrive(&s, &["messages", "list", "--queue", "cli", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(json(&o)["messages"][0]["id"], id.as_str());

    // A ready message cannot be redriven: the server's 409 is exit 1 with its code on stderr.
    let o = redrive(&s, &["messages", "redrive", &id]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("invalid_state"),
        "{}",
        text(&o)
    );

    let o = redrive(&s, &["messages", "kill", &id, "--reason", "test"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(json(&o)["dead_reason"], "killed");

    let o = redrive(
        &s,
        &[
            "messages", "export", "--queue", "cli", "--state", "dead", "--format", "csv",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let csv = String::from_utf8_lossy(&o.stdout);
    assert!(csv.starts_with("id,queue,state"), "{csv}");
    assert!(csv.contains(&id), "{csv}");

    let o = redrive(&s, &["messages", "redrive", &id]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(json(&o)["state"], "ready");

    let o = redrive(&s, &["queues", "cli", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(json(&o)["counts"]["ready"], 1, "{}", text(&o));

    let o = redrive(&s, &["messages", "delete", &id]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = redrive(&s, &["messages", "show", &id]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not_found"),
        "{}",
        text(&o)
    );

    // Bad usage is exit 2 and names the problem.
    let o = redrive(&s, &["publish", "cli", "{not json"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = redrive(&s, &["policy", "explain", "--initial-delay", "soon"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--initial-delay"),
        "{}",
        text(&o)
    );

    // `redrive messages export | head`: the reader leaving ends the export quietly.
    for args in [
        &["messages", "export", "--format", "csv"][..],
        &["queues"][..],
    ] {
        let o = redrive_into_closed_pipe(&s, args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o));
        assert!(
            !String::from_utf8_lossy(&o.stderr).contains("panicked"),
            "{}",
            text(&o)
        );
    }

    node.child.kill().unwrap();
    node.child.wait().unwrap();

    // Nothing listens any more: exit 3.
    let o = redrive(&s, &["queues"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
}

#[test]
fn policy_explain_prints_the_schedule() {
    let o = redrive(
        "http://127.0.0.1:1",
        &["policy", "explain", "--preset", "svix", "--json"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    let rows = v["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", text(&o)));
    assert!(
        rows.iter().any(|r| r.to_string().contains("300000")),
        "svix's second delay is 5m: {v}"
    );
}

/// The load generator is the `redrive-bench` binary: `redrive` has no `bench` command.
#[test]
fn help_lists_the_commands_and_no_bench() {
    let o = redrive("http://127.0.0.1:1", &["--help"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let help = String::from_utf8_lossy(&o.stdout);
    for command in ["serve", "backup", "policy", "publish", "messages", "tasks"] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(command)),
            "{command}: {help}"
        );
    }
    assert!(
        !help.lines().any(|l| l.trim_start().starts_with("bench")),
        "{help}"
    );
    let o = redrive("http://127.0.0.1:1", &["bench", "--workload", "publish"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn serve_refuses_a_bad_config_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "[queues.orders.retry]\nmax_atempts = 3\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_redrive"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("max_atempts"),
        "{}",
        text(&o)
    );
    let o = Command::new(env!("CARGO_BIN_EXE_redrive"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env_remove("REDRIVE_API_TOKENS")
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "a public address without a token is refused: {}",
        text(&o)
    );
}

/// `redrive … | head`: a reader that goes away is no panic and no error (it used to
/// panic with "failed printing to stdout: Broken pipe").
#[test]
fn a_closed_pipe_ends_the_output_quietly() {
    for args in [
        &["policy", "explain", "--preset", "sidekiq"][..],
        &["policy", "explain", "--preset", "sidekiq", "--json"][..],
    ] {
        let o = redrive_into_closed_pipe("http://127.0.0.1:1", args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_and_audit_commands() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut node = start(dir.path(), port, CONFIG);
    assert!(wait_ready(&reqwest::Client::new(), &mut node).await);
    let s = node.base.clone();
    // Three dead letters in `cli` (max_attempts 1).
    for i in 0..3 {
        let o = redrive(&s, &["publish", "cli", &format!("{{\"n\": {i}}}")]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    let api = redrive_client::Client::new(&s).unwrap();
    let leased = api
        .lease(
            "cli",
            &redrive_client::LeaseRequest {
                max: Some(3),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    for m in &leased {
        api.nack(
            &m.id.to_string(),
            &m.lease,
            Some(&redrive_client::NackError {
                class: redrive_core::ErrorClass::Permanent,
                message: Some("no such order".into()),
                retry_after: None,
            }),
        )
        .await
        .unwrap();
    }
    let o = redrive(
        &s,
        &[
            "tasks",
            "create",
            "--action",
            "redrive",
            "--queue",
            "cli",
            "--state",
            "dead",
            "--dry-run",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(json(&o)["total"], 3, "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("would redrive 3"),
        "{}",
        text(&o)
    );
    // No filter: a usage error naming the flags, nothing created.
    let o = redrive(&s, &["tasks", "create", "--action", "delete"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--queue"),
        "{}",
        text(&o)
    );
    let o = redrive(
        &s,
        &[
            "tasks", "create", "--action", "redrive", "--queue", "cli", "--state", "dead",
            "--rate", "100/s", "--wait",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = json(&o);
    assert_eq!(
        (t["state"].as_str(), t["done"].as_u64()),
        (Some("done"), Some(3)),
        "{}",
        text(&o)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("3/3 100%"), "progress line: {}", text(&o));
    let id = t["id"].as_str().unwrap().to_owned();
    let o = redrive(&s, &["tasks", "list"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.starts_with("id ") && out.contains(&id) && out.contains("done"),
        "{out}"
    );
    let o = redrive(&s, &["tasks", "pause", &id]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "pausing a finished task: {}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("invalid_task_state"),
        "{}",
        text(&o)
    );
    let o = redrive(&s, &["audit"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("task.create") && out.contains("task.done") && out.contains("anonymous"),
        "{out}"
    );
    // Each entry names the node (default `<host name>:<port>`).
    assert!(out.contains(&format!(":{port}")), "{out}");
    node.child.kill().unwrap();
}

/// Regression, issue 15: tasks need a fingerprint and only curl gave one; the CLI showed a
/// killed message's reason only inside its history's JSON; a task's counts did not say what
/// they count. `redrive groups` lists the failure groups, `messages list` takes a group's
/// fingerprint and when messages finished, `messages show` says why a message is dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_fingerprints_and_kill_reasons_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path(), free_port(), CONFIG);
    assert!(wait_ready(&reqwest::Client::new(), &mut node).await);
    let s = node.base.clone();
    let api = redrive_client::Client::new(&s).unwrap();
    for text in [
        "HTTP 503 from payments (req 17)",
        "HTTP 503 from payments (req 18)",
        "HTTP 503 from payments (req 19)",
        "HTTP 500 from payments (req 20)",
    ] {
        let mut p = redrive_client::Publish::new(serde_json::json!({"text": text}));
        p.failed = Some(redrive_client::FailedReport::new(
            redrive_core::ErrorClass::Permanent,
            text,
        ));
        api.publish("cli", &p).await.unwrap();
    }
    let fp = "permanent: HTTP 503 from payments (req <n>)";

    let o = redrive(&s, &["groups", "--queue", "cli"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let first = out.lines().nth(1).unwrap_or_default();
    assert!(
        first.trim_start().starts_with("3  cli") && first.ends_with(fp),
        "the largest group first, its whole fingerprint: {out}"
    );
    assert!(
        out.contains("permanent: HTTP 500 from payments (req <n>)"),
        "{out}"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("2 groups of 4 dead letters read")
            && err.contains(&format!("--fingerprint '{fp}'")),
        "{}",
        text(&o)
    );
    let o = redrive(&s, &["groups", "--json", "--limit", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let g = json(&o);
    assert_eq!(g["groups"][0]["fingerprint"], fp, "{g}");
    assert_eq!(g["groups"][0]["count"], 3, "{g}");
    assert_eq!(g["groups"].as_array().unwrap().len(), 1);
    let o = redrive(&s, &["groups", "--limit", "0"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("limit"),
        "{}",
        text(&o)
    );

    // A group's fingerprint lists all of its messages, and selects a task.
    let o = redrive(
        &s,
        &[
            "messages",
            "list",
            "--state",
            "dead",
            "--fingerprint",
            fp,
            "--finished-since",
            "1h",
            "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(
        json(&o)["messages"].as_array().unwrap().len(),
        3,
        "{}",
        text(&o)
    );
    let o = redrive(
        &s,
        &["messages", "list", "--finished-until", "1h", "--json"],
    );
    assert_eq!(json(&o)["messages"], serde_json::json!([]), "{}", text(&o));
    let o = redrive(&s, &["messages", "list", "--finished-since", "soon"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--finished-since"),
        "{}",
        text(&o)
    );
    let o = redrive(
        &s,
        &[
            "tasks",
            "create",
            "--action",
            "redrive",
            "--state",
            "dead",
            "--fingerprint",
            fp,
            "--wait",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = json(&o);
    assert_eq!(t["done"], 3, "{t}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("3 redriven  0 refused")
            && err.contains(
                "done: 3 of 3 redriven, 0 refused (no longer in a state a redrive applies to, or gone)"
            ),
        "{}",
        text(&o)
    );
    let id = t["id"].as_str().unwrap().to_owned();
    let o = redrive(&s, &["tasks", "show", &id]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("3 of 3 redriven, 0 refused"),
        "{}",
        text(&o)
    );
    let o = redrive(&s, &["tasks", "list"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("acted on") && out.contains("refused") && out.contains("created (UTC)"),
        "{out}"
    );

    // A killed message says why, in words, beside its JSON.
    let o = redrive(&s, &["publish", "cli", "1"]);
    let victim = json(&o)["id"].as_str().unwrap().to_owned();
    let o = redrive(
        &s,
        &[
            "messages",
            "kill",
            &victim,
            "--reason",
            "duplicate order, refunded",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = redrive(&s, &["messages", "show", &victim]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(json(&o)["dead_reason"], "killed");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("dead in cli (killed), killed at ")
            && err.contains(" UTC, reason: duplicate order, refunded"),
        "{}",
        text(&o)
    );
    node.child.kill().unwrap();
}
