//! The shipped Prometheus alert rules and Grafana dashboard (`deploy/`) use only metrics
//! the server exports, and the rules pass `promtool check rules` and their unit tests
//! (`promtool test rules`). promtool comes from Debian's `prometheus` package; without it
//! the promtool part is skipped, except under `CI=true`.

use crate::harness::*;
use std::collections::BTreeSet;
use std::path::PathBuf;

fn deploy(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(path)
}

/// The metric families `/metrics` declares (`# TYPE name kind`).
async fn families() -> BTreeSet<String> {
    let s = TestServer::fast("").await;
    let (status, text) = s.get_text("/metrics").await;
    assert_eq!(status, 200);
    s.stop().await;
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn alert_rules_and_dashboard_use_only_exported_metrics() {
    let known = families().await;
    let name = regex::Regex::new(r"redrive_[a-z_]+").unwrap();
    for file in [
        "prometheus/redrive-alerts.yml",
        "grafana/redrive-dashboard.json",
    ] {
        let text = std::fs::read_to_string(deploy(file)).unwrap();
        let mut used = 0;
        for m in name.find_iter(&text) {
            let mut n = m.as_str();
            for suffix in ["_bucket", "_sum", "_count", "_total"] {
                n = n.strip_suffix(suffix).unwrap_or(n);
            }
            if n.starts_with("redrive_wal_") && crate::harness::on_shared_store() {
                continue; // the embedded store's own figures (its WAL)
            }
            assert!(
                known.contains(n),
                "{file} uses {} but /metrics has no family {n} (it has {known:?})",
                m.as_str()
            );
            used += 1;
        }
        assert!(used > 5, "{file}: only {used} metric references");
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(deploy("grafana/redrive-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    assert!(dashboard["panels"]
        .as_array()
        .is_some_and(|p| p.len() >= 10));
}

#[test]
fn alert_rules_pass_promtool() {
    let dir = deploy("prometheus");
    let check = std::process::Command::new("promtool")
        .args(["check", "rules", "redrive-alerts.yml"])
        .current_dir(&dir)
        .output();
    let Ok(check) = check else {
        assert!(
            std::env::var("CI").is_err(),
            "promtool (Debian package prometheus) is needed under CI"
        );
        eprintln!("skipped: promtool is not installed");
        return;
    };
    assert!(check.status.success(), "{check:?}");
    let test = std::process::Command::new("promtool")
        .args(["test", "rules", "redrive-alerts.test.yml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        test.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
}
