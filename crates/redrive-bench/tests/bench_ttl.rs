//! `redrive-bench --workload delayed --ttl-queue`: the RabbitMQ TTL-queue peer of the
//! delayed-delivery benchmark, a tiny run against the machine's RabbitMQ
//! (amqp://guest:guest@127.0.0.1:5672/%2f, or REDRIVE_TEST_AMQP): every message arrives
//! once, none before its due time, short and long delays both measured.
//!
//! Without a reachable RabbitMQ the test says so and passes, except under CI (CI=true),
//! whose script starts RabbitMQ: there it fails.

use serde_json::Value;
use std::process::Command;

const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

#[test]
fn the_ttl_queue_peer_delivers_every_message_once_and_never_early() {
    let url = std::env::var("REDRIVE_TEST_AMQP").unwrap_or_else(|_| DEFAULT_URL.to_owned());
    if std::net::TcpStream::connect("127.0.0.1:5672").is_err() && url == DEFAULT_URL {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "RabbitMQ at {url} is not reachable under CI"
        );
        eprintln!("skipped: RabbitMQ at {url} is not reachable");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_redrive-bench"))
        .args(["--workload", "delayed", "--ttl-queue", "--amqp", &url])
        .args(["--messages", "300", "--spread", "1s", "--lead", "1s"])
        .args([
            "--long-fraction",
            "0.2",
            "--connections",
            "4",
            "--publishers",
            "1",
        ])
        .args(["--timeout", "60s", "--json"])
        .output()
        .expect("run redrive-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let j: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "not JSON: status {:?}\nstdout: {}\nstderr: {stderr}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let ctx = format!("{j}\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "{ctx}");
    assert_eq!(j["complete"], true, "{ctx}");
    assert_eq!(j["published"], 300, "{ctx}");
    assert_eq!(j["received"], 300, "{ctx}");
    assert_eq!(j["early"], 0, "{ctx}");
    assert_eq!(j["redelivered"], 0, "{ctx}");
    for key in ["lateness_short", "lateness_long"] {
        assert!(
            j[key]["count"].as_u64().is_some_and(|n| n > 0),
            "{key}: {ctx}"
        );
    }
    let short = j["lateness_short"]["count"].as_u64().unwrap_or(0);
    let long = j["lateness_long"]["count"].as_u64().unwrap_or(0);
    assert_eq!(short + long, 300, "{ctx}");
}
