//! `redrive-bench --pg`: a tiny retry-cycle against the machine's PostgreSQL
//! (postgres://root@127.0.0.1:5432/test, or REDRIVE_TEST_PG): every message is failed
//! once, claimed again and completed, exactly once, and the table is left empty.
//!
//! Without a reachable PostgreSQL the test says so and passes, except under CI
//! (CI=true), whose script starts PostgreSQL: there it fails.

use serde_json::Value;
use std::process::Command;
use tokio_postgres::NoTls;

const DEFAULT_URL: &str = "postgres://root@127.0.0.1:5432/test";

fn pg_url() -> String {
    std::env::var("REDRIVE_TEST_PG").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A connection for checks and clean-up, or `None` (test skipped) when there is no server.
async fn connect(url: &str) -> Option<tokio_postgres::Client> {
    match tokio_postgres::connect(url, NoTls).await {
        Ok((client, connection)) => {
            tokio::spawn(connection);
            Some(client)
        }
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("PostgreSQL at {url} is not reachable under CI: {e}")
        }
        Err(e) => {
            eprintln!("skipped: PostgreSQL at {url} is not reachable: {e}");
            None
        }
    }
}

fn bench(url: &str, table: &str, workload: &str, extra: &[&str]) -> (Option<i32>, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_redrive-bench"))
        .args(["--pg", url, "--pg-table", table, "--workload", workload])
        .args([
            "--messages",
            "200",
            "--connections",
            "5",
            "--publishers",
            "2",
        ])
        .args(["--payload-bytes", "100", "--timeout", "60s", "--json"])
        .args(extra)
        .output()
        .expect("run redrive-bench");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "not JSON: status {:?}\nstdout: {}\nstderr: {stderr}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (out.status.code(), json, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_cycle_against_postgres_completes_every_message_after_one_retry() {
    let url = pg_url();
    let Some(client) = connect(&url).await else {
        return;
    };
    // A table of this test's own: the bench TRUNCATEs its table, and a real bench may
    // be using the default one.
    let table = format!("redrive_bench_test_{}", std::process::id());

    for (workload, batch) in [("retry-cycle", "7"), ("retry-cycle", "1"), ("cycle", "10")] {
        let (code, j, stderr) = bench(&url, &table, workload, &["--batch", batch]);
        let ctx = format!("{workload} batch {batch}: {j}\n{stderr}");
        assert_eq!(code, Some(0), "{ctx}");
        assert_eq!(j["complete"], true, "{ctx}");
        assert_eq!(j["target"], "postgresql", "{ctx}");
        assert_eq!(j["workload"], workload, "{ctx}");
        assert_eq!(j["consumers"], 3, "{ctx}");
        assert_eq!(j["publishers"], 2, "{ctx}");
        assert_eq!(j["published"], 200, "{ctx}");
        if workload == "retry-cycle" {
            assert_eq!(j["nacked"], 200, "every message failed once: {ctx}");
            assert_eq!(j["retries_acked"], 200, "and completed on its retry: {ctx}");
            assert_eq!(j["end_to_end_latency"]["count"], 200, "{ctx}");
        } else {
            assert_eq!(j["acked"], 200, "{ctx}");
        }
        assert_eq!(j["redelivered"], 0, "no third delivery: {ctx}");
        assert_eq!(j["stale"], 0, "{ctx}");
        assert_eq!(j["rows_left"], 0, "{ctx}");
        assert_eq!(j["errors"], serde_json::json!({}), "{ctx}");
        assert_eq!(j["pg_synchronous_commit"], "on", "{ctx}");
        assert!(j["messages_per_s"].as_f64().unwrap() > 0.0, "{ctx}");
        let per_lease: f64 = j["messages_per_lease"].as_str().unwrap().parse().unwrap();
        assert!(per_lease <= batch.parse::<f64>().unwrap(), "{ctx}");
    }
    let left: i64 = client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
    client
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}

#[test]
fn pg_flags_are_checked() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_redrive-bench"))
            .args(args)
            .output()
            .expect("run redrive-bench")
    };
    let o = run(&["--pg", DEFAULT_URL, "--workload", "publish"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cycle and retry-cycle only"));
    let o = run(&["--pg", "http://127.0.0.1:7077", "--workload", "cycle"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--pg"));
    let o = run(&["--pg", DEFAULT_URL, "--pg-table", "x;y"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--pg-table"));
}
