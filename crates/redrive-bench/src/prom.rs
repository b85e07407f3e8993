//! The server's commit counters, read from `GET /metrics` before and after a run.
//!
//! Group commit is what makes durable acknowledgement cheap (SPEC §7), so every
//! bench reports how many changes shared one commit (one fsync) and how many
//! commits per second the store made.

use serde::Serialize;
use std::time::Instant;

/// Commits (fsyncs with `durability = "fsync"`).
pub const COMMITS: &str = "redrive_commits_total";
/// Transitions committed.
pub const CHANGES: &str = "redrive_commit_changes_total";

/// The counters at one instant.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    /// When it was read.
    pub at: Instant,
    /// `redrive_commits_total`, if exposed.
    pub commits: Option<f64>,
    /// `redrive_commit_changes_total`, if exposed.
    pub changes: Option<f64>,
}

/// What happened between two snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CommitFigures {
    /// Commits during the run.
    pub commits: f64,
    /// Changes during the run.
    pub changes: f64,
    /// Changes per commit (group-commit batch size), `None` without commits.
    pub changes_per_commit: Option<f64>,
    /// Commits (fsyncs) per second of wall time between the snapshots.
    pub commits_per_second: f64,
}

impl Snapshot {
    /// Parse a Prometheus text exposition read at `at`.
    pub fn parse(text: &str, at: Instant) -> Self {
        Self {
            at,
            commits: sum_metric(text, COMMITS),
            changes: sum_metric(text, CHANGES),
        }
    }

    /// The figures from `self` (before) to `after`; `None` when a counter is missing.
    pub fn until(&self, after: &Snapshot) -> Option<CommitFigures> {
        let commits = after.commits? - self.commits?;
        let changes = after.changes? - self.changes?;
        let secs = after.at.duration_since(self.at).as_secs_f64();
        Some(CommitFigures {
            commits,
            changes,
            changes_per_commit: (commits > 0.0).then(|| changes / commits),
            commits_per_second: if secs > 0.0 { commits / secs } else { 0.0 },
        })
    }
}

/// The sum of every sample of `name` (all label sets), or `None` if it has none.
pub fn sum_metric(text: &str, name: &str) -> Option<f64> {
    let mut total = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let value_part = if let Some(labels) = rest.strip_prefix('{') {
            match labels.split_once('}') {
                Some((_, v)) => v,
                None => continue,
            }
        } else if rest.starts_with(' ') || rest.starts_with('\t') {
            rest
        } else {
            continue; // another metric sharing the prefix
        };
        // "value [timestamp]"
        if let Some(v) = value_part
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            *total.get_or_insert(0.0) += v;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const TEXT: &str = "\
# HELP redrive_commits Commits
# TYPE redrive_commits counter
redrive_commits_total 100
redrive_commits_total_other 5
# TYPE redrive_commit_changes counter
redrive_commit_changes_total 2500
redrive_messages_published_total{queue=\"a\"} 3
redrive_messages_published_total{queue=\"b\"} 4.5 1700000000000
";

    #[test]
    fn sums_samples_of_one_name() {
        assert_eq!(sum_metric(TEXT, COMMITS), Some(100.0));
        assert_eq!(sum_metric(TEXT, CHANGES), Some(2500.0));
        assert_eq!(
            sum_metric(TEXT, "redrive_messages_published_total"),
            Some(7.5)
        );
        assert_eq!(sum_metric(TEXT, "redrive_nothing_total"), None);
    }

    #[test]
    fn figures_between_snapshots() {
        let t0 = Instant::now();
        let before = Snapshot {
            at: t0,
            commits: Some(100.0),
            changes: Some(2_500.0),
        };
        let after = Snapshot {
            at: t0 + Duration::from_secs(2),
            commits: Some(1_100.0),
            changes: Some(52_500.0),
        };
        let f = before.until(&after).unwrap();
        assert_eq!(f.commits, 1_000.0);
        assert_eq!(f.changes_per_commit, Some(50.0));
        assert_eq!(f.commits_per_second, 500.0);
        let missing = Snapshot {
            at: t0,
            commits: None,
            changes: Some(1.0),
        };
        assert!(missing.until(&after).is_none());
        let idle = before
            .until(&Snapshot {
                at: t0 + Duration::from_secs(1),
                ..before
            })
            .unwrap();
        assert_eq!(idle.changes_per_commit, None);
    }
}
