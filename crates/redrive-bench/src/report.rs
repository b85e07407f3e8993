//! What a bench run prints: aligned `label: value` lines, or one JSON object.

use super::prom::CommitFigures;
use super::stats::{fmt_ms, Summary};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// The figures of one run, in the order they were added.
#[derive(Debug, Default)]
pub struct Report {
    lines: Vec<(String, String)>,
    json: Map<String, Value>,
    /// Why the run did not reach its target (it still reports what it measured).
    pub incomplete: Option<String>,
}

impl Report {
    /// An empty report.
    pub fn new() -> Self {
        Self::default()
    }

    /// A text figure.
    pub fn text(&mut self, key: &str, label: &str, value: impl Into<String>) {
        let value = value.into();
        self.json.insert(key.into(), Value::String(value.clone()));
        self.lines.push((label.into(), value));
    }

    /// A count.
    pub fn count(&mut self, key: &str, label: &str, n: u64) {
        self.json.insert(key.into(), Value::from(n));
        self.lines.push((label.into(), group_digits(n)));
    }

    /// The publishing half of a count-driven workload: target, published, publish rate.
    pub fn publishing(&mut self, target: u64, published: u64, elapsed: std::time::Duration) {
        self.count("messages", "messages", target);
        self.count("published", "published", published);
        self.rate(
            "publish_per_s",
            "publish rate",
            published as f64 / elapsed.as_secs_f64(),
        );
    }

    /// A rate per second.
    pub fn rate(&mut self, key: &str, label: &str, per_s: f64) {
        self.json.insert(key.into(), Value::from(round2(per_s)));
        self.lines.push((
            label.into(),
            format!("{}/s", group_digits(per_s.round().max(0.0) as u64)),
        ));
    }

    /// A plain number (two decimals), neither a count nor a rate.
    pub fn ratio(&mut self, key: &str, label: &str, x: f64) {
        self.json.insert(key.into(), Value::from(round2(x)));
        self.lines.push((label.into(), format!("{x:.2}")));
    }

    /// A duration in seconds.
    pub fn secs(&mut self, key: &str, label: &str, secs: f64) {
        self.json.insert(key.into(), Value::from(round2(secs)));
        self.lines.push((label.into(), format!("{secs:.2} s")));
    }

    /// A latency (or lateness) distribution; `None` prints `n/a`.
    pub fn summary(&mut self, key: &str, label: &str, s: Option<Summary>) {
        match s {
            Some(s) => {
                self.json
                    .insert(key.into(), serde_json::to_value(s).unwrap_or(Value::Null));
                self.lines.push((label.into(), s.line()));
            }
            None => {
                self.json.insert(key.into(), Value::Null);
                self.lines.push((label.into(), "n/a (no samples)".into()));
            }
        }
    }

    /// The group-commit figures of the run.
    pub fn commits(&mut self, f: Option<CommitFigures>) {
        match f {
            Some(f) => {
                self.json.insert(
                    "commits".into(),
                    serde_json::to_value(f).unwrap_or(Value::Null),
                );
                let per = f
                    .changes_per_commit
                    .map_or("n/a (no commits)".to_owned(), |c| format!("{c:.1}"));
                self.lines.push(("changes per commit".into(), per));
                self.lines.push((
                    "fsyncs (commits) per second".into(),
                    format!(
                        "{} ({} commits, {} changes)",
                        fmt_ms(f.commits_per_second),
                        f.commits,
                        f.changes
                    ),
                ));
            }
            None => {
                self.json.insert("commits".into(), Value::Null);
                self.lines.push((
                    "changes per commit".into(),
                    "n/a (redrive_commits_total / redrive_commit_changes_total not in /metrics)"
                        .into(),
                ));
            }
        }
    }

    /// The errors seen, by kind.
    pub fn errors(&mut self, tally: &ErrorTally) {
        let kinds = tally.snapshot();
        let total: u64 = kinds.values().map(|(n, _)| n).sum();
        self.json.insert(
            "errors".into(),
            Value::Object(
                kinds
                    .iter()
                    .map(|(k, (n, sample))| {
                        (
                            k.clone(),
                            serde_json::json!({ "count": n, "sample": sample }),
                        )
                    })
                    .collect(),
            ),
        );
        self.lines.push(("errors".into(), group_digits(total)));
        for (kind, (n, sample)) in kinds {
            self.lines.push((
                format!("  {kind}"),
                format!("{} (e.g. {sample})", group_digits(n)),
            ));
        }
    }

    /// The report as aligned lines.
    pub fn render(&self) -> String {
        let width = self
            .lines
            .iter()
            .map(|(l, _)| l.chars().count())
            .max()
            .unwrap_or(0);
        let mut out = String::new();
        for (label, value) in &self.lines {
            let pad = width - label.chars().count();
            out.push_str(&format!("{label}:{} {value}\n", " ".repeat(pad)));
        }
        if let Some(why) = &self.incomplete {
            out.push_str(&format!("INCOMPLETE: {why}\n"));
        }
        out
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> Value {
        let mut m = self.json.clone();
        m.insert("complete".into(), Value::Bool(self.incomplete.is_none()));
        if let Some(why) = &self.incomplete {
            m.insert("incomplete_reason".into(), Value::String(why.clone()));
        }
        Value::Object(m)
    }
}

/// Errors counted by kind (e.g. `http 409 lease_expired`), with one sample message
/// each. Shared by every task; errors are rare, so a mutex is enough.
#[derive(Debug, Default)]
pub struct ErrorTally {
    kinds: Mutex<BTreeMap<String, (u64, String)>>,
}

impl ErrorTally {
    /// Count one error of `kind`.
    pub fn record(&self, kind: impl Into<String>, sample: impl Into<String>) {
        if let Ok(mut m) = self.kinds.lock() {
            let e = m.entry(kind.into()).or_insert_with(|| (0, sample.into()));
            e.0 += 1;
        }
    }

    /// Errors so far.
    pub fn total(&self) -> u64 {
        self.kinds
            .lock()
            .map(|m| m.values().map(|(n, _)| n).sum())
            .unwrap_or(0)
    }

    fn snapshot(&self) -> BTreeMap<String, (u64, String)> {
        self.kinds.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// `1234567` → `1,234,567`.
pub fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let head = match s.len() % 3 {
        0 => 3.min(s.len()),
        r => r,
    };
    let mut out = s[..head].to_owned();
    for chunk in s.as_bytes()[head..].chunks(3) {
        out.push(',');
        out.push_str(std::str::from_utf8(chunk).unwrap_or(""));
    }
    out
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_are_grouped() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1_000), "1,000");
        assert_eq!(group_digits(1_234_567), "1,234,567");
    }

    #[test]
    fn lines_align_and_json_has_every_key() {
        let mut r = Report::new();
        r.text("workload", "workload", "publish");
        r.count("messages", "messages", 12_000);
        r.rate("rate", "rate", 4_000.4);
        r.secs("elapsed_s", "elapsed", 3.0);
        let tally = ErrorTally::default();
        tally.record("http 409 lease_expired", "lease expired");
        tally.record("http 409 lease_expired", "other");
        r.errors(&tally);
        r.incomplete = Some("timed out".into());
        let text = r.render();
        let lines: Vec<&str> = text.lines().collect();
        // Labels pad to the longest, "  http 409 lease_expired" (24 characters).
        assert_eq!(lines[0], format!("workload:{}publish", " ".repeat(17)));
        assert_eq!(lines[1], format!("messages:{}12,000", " ".repeat(17)));
        assert_eq!(lines[2], format!("rate:{}4,000/s", " ".repeat(21)));
        assert_eq!(lines[3], format!("elapsed:{}3.00 s", " ".repeat(18)));
        assert_eq!(lines[5], "  http 409 lease_expired: 2 (e.g. lease expired)");
        assert!(text.ends_with("INCOMPLETE: timed out\n"));
        let j = r.to_json();
        assert_eq!(j["messages"], 12_000);
        assert_eq!(j["rate"], 4_000.4);
        assert_eq!(j["complete"], false);
        assert_eq!(j["errors"]["http 409 lease_expired"]["count"], 2);
    }
}
