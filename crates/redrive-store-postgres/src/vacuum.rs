//! Vacuum of the hot tables when PostgreSQL's own autovacuum lags behind.
//!
//! Every transition of a message is a new version of its `messages` row, and the old
//! version's index entries stay where they were until a vacuum removes them. For the ready
//! set that is the worst place: a claim takes the head of `ix_ready`, so the entries of
//! every message claimed since the last vacuum pile up at the head, and every claim walks
//! all of them before it finds a row it can take. Autovacuum visits a database once per
//! `autovacuum_naptime` (one minute by default), and not at all where it is off. Measured
//! on 2026-12-04 (docs/PERFORMANCE.md, "Dead index entries at the ready set's head"), with
//! autovacuum off, 1,000,000 messages at 16 consumers × 100: a claim read 6,000 index pages
//! by the end and the run averaged 5,845 retry cycles/s; with this module, 9,249.
//!
//! So each store checks every [`CHECK_EVERY`] how many dead rows its hot tables hold
//! (`pg_stat_user_tables`, which autovacuum reads too) and runs `VACUUM (SKIP_LOCKED)` on
//! those past [`due`]. Several nodes on one schema check alike; `SKIP_LOCKED` leaves a
//! table another node (or autovacuum) is vacuuming to that one. Where autovacuum keeps up,
//! the count stays under the bound and this does nothing. A vacuum that removes almost
//! nothing is held back by an older snapshot (a long transaction elsewhere, an abandoned
//! replication slot: docs/OPERATIONS.md), or was skipped because the role does not own the
//! table: the checks then back off to one a minute, with a warning once, until a vacuum
//! removes rows again.

use crate::error::E;
use crate::Inner;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the dead rows are counted.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);
/// The longest wait between checks, after vacuums that removed (almost) nothing.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// The tables whose rows are rewritten on the hot path: every transition (`messages`) and
/// every transition of an ordered key (`key_heads`).
pub const TABLES: &[&str] = &["messages", "key_heads"];
/// Fewer dead rows than this are never worth a vacuum.
pub const MIN_DEAD: i64 = 10_000;

/// Is a table with `dead` dead and `live` live rows due for a vacuum: at least
/// [`MIN_DEAD`], and at least a tenth of its live rows (a vacuum reads every index whole,
/// so a large table waits for proportionally more).
pub fn due(dead: i64, live: i64) -> bool {
    dead >= MIN_DEAD.max(live / 10)
}

/// Did a vacuum that found `before` dead rows leave `after` of them: held back when it
/// removed less than a tenth (the count also takes in rows that died while it ran).
pub fn held_back(before: i64, after: i64) -> bool {
    after.saturating_mul(10) >= before.saturating_mul(9)
}

/// What one check did.
#[derive(Debug, PartialEq, Eq)]
enum Pass {
    /// No table was due.
    Nothing,
    /// The due tables were vacuumed and their dead rows went down.
    Cleaned,
    /// The due tables were vacuumed and kept (almost) all their dead rows: `dead` left.
    HeldBack { dead: i64 },
}

/// Dead and live rows of each of [`TABLES`] in `schema`, by name.
async fn counts(c: &deadpool_postgres::Client, schema: &str) -> Result<Vec<(String, i64, i64)>, E> {
    let rows = crate::sql::query(
        c,
        "SELECT relname::text, n_dead_tup, n_live_tup FROM pg_stat_user_tables \
         WHERE schemaname = $1 AND relname = ANY($2)",
        &[&schema, &TABLES],
    )
    .await?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
        .collect()
}

/// One check: count, vacuum the due tables in one statement, count again.
async fn pass(inner: &Inner, schema: &str) -> Result<Pass, E> {
    let client = inner.pool.get().await?;
    let due_now: Vec<(String, i64, i64)> = counts(&client, schema)
        .await?
        .into_iter()
        .filter(|(_, d, l)| due(*d, *l))
        .collect();
    if due_now.is_empty() {
        return Ok(Pass::Nothing);
    }
    // The dead rows of the tables that were due, in `rows`.
    let dead_of = |rows: &[(String, i64, i64)]| -> i64 {
        rows.iter()
            .filter(|(t, _, _)| due_now.iter().any(|(n, _, _)| n == t))
            .map(|(_, d, _)| d)
            .sum()
    };
    let names: Vec<String> = due_now
        .iter()
        .map(|(t, _, _)| format!("{schema}.{t}"))
        .collect();
    let started = Instant::now();
    client
        .batch_execute(&format!("VACUUM (SKIP_LOCKED) {}", names.join(", ")))
        .await?;
    let took = started.elapsed();
    let dead_before = dead_of(&due_now);
    let dead_after = dead_of(&counts(&client, schema).await?);
    tracing::debug!(
        tables = %names.join(", "),
        dead_before,
        dead_after,
        took_ms = took.as_millis() as u64,
        "vacuumed the hot tables"
    );
    Ok(if held_back(dead_before, dead_after) {
        Pass::HeldBack { dead: dead_after }
    } else {
        Pass::Cleaned
    })
}

/// Check and vacuum for as long as the store is open (stopped by its `close`).
pub async fn keep_clean(inner: Arc<Inner>, schema: String) {
    let mut wait = CHECK_EVERY;
    let mut warned = false;
    loop {
        tokio::time::sleep(wait).await;
        match pass(&inner, &schema).await {
            Ok(Pass::Nothing) => wait = CHECK_EVERY,
            Ok(Pass::Cleaned) => {
                if warned {
                    tracing::info!(%schema, "vacuum removes dead rows of the hot tables again");
                }
                wait = CHECK_EVERY;
                warned = false;
            }
            Ok(Pass::HeldBack { dead }) => {
                wait = (wait * 2).min(MAX_WAIT);
                if wait == MAX_WAIT && !warned {
                    tracing::warn!(
                        %schema,
                        dead,
                        "VACUUM of redrive's hot tables removes no dead rows: an older \
                         transaction or replication slot holds them (pg_stat_activity.backend_xmin, \
                         pg_replication_slots), or this role may not vacuum them (it must own \
                         them); claims get slower until then (docs/OPERATIONS.md)"
                    );
                    warned = true;
                }
            }
            // The database is away or refused: the probe reports unavailability; look again.
            Err(e) => {
                tracing::debug!(error = %e.into_store(), "vacuum check failed");
                wait = CHECK_EVERY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_needs_the_floor_and_a_tenth_of_the_live_rows() {
        assert!(!due(MIN_DEAD - 1, 0));
        assert!(due(MIN_DEAD, 0));
        assert!(due(MIN_DEAD, 100_000));
        assert!(!due(MIN_DEAD, 100_010));
        assert!(due(200_000, 2_000_000));
        assert!(!due(199_999, 2_000_000));
    }

    #[test]
    fn held_back_when_under_a_tenth_was_removed() {
        assert!(held_back(10_000, 10_000));
        assert!(held_back(10_000, 9_000));
        assert!(!held_back(10_000, 8_999));
        assert!(!held_back(10_000, 0));
        assert!(
            held_back(10_000, 12_000),
            "more died while it ran than it removed"
        );
    }
}
