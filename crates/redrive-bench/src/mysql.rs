//! `--mysql URL`: `cycle` and `retry-cycle` against the MySQL / MariaDB peer a team with a
//! retry table would build by hand: a job table consumed with `SELECT … FOR UPDATE SKIP
//! LOCKED` (the Solid Queue / Laravel pattern, done the way they recommend), driven with the
//! same shapes as [`super::cycle`] and [`super::pg`] and reported with the same keys.
//!
//! - One connection per task (mysql_async, no TLS), all opened before the clock starts, each
//!   at `READ COMMITTED` (no gap locks: what Solid Queue and Laravel's fixes settled on), so
//!   the peer is not handicapped by `REPEATABLE READ`'s deadlocks. The run reports
//!   `innodb_flush_log_at_trx_commit` and `sync_binlog`: a commit is durable when it returns
//!   only with the first at 1, as a redrive answer is.
//! - Publishers claim `--batch` message numbers at a time and insert them with one
//!   multi-row `INSERT`, one transaction each.
//! - Consumers claim up to `--batch` available jobs in one short transaction: `SELECT id …
//!   ORDER BY run_at, id LIMIT n FOR UPDATE SKIP LOCKED`, then `UPDATE … WHERE id IN (…)` by
//!   primary key (MySQL has no `UPDATE … RETURNING`), `COMMIT`; then settle the claim with at
//!   most two autocommitted statements: fail the first deliveries (`state = 0, run_at =
//!   NOW(6)`: retry at once) and delete the rest by primary key. One claim costs up to three
//!   commits, as one redrive lease costs a lease, a nack and an ack request.
//! - A statement InnoDB refuses with a deadlock (1213) or a lock wait timeout (1205) is run
//!   again (the claim's whole transaction) after a short random pause, and counted: the
//!   report's `deadlock_retries` and `deadlock_retries_per_10k` are what the issue asks to
//!   compare with redrive's `redrive_mysql_deadlock_retries_total`.
//! - An empty claim sleeps [`super::pg::EMPTY_CLAIM_SLEEP`] (no long poll on MySQL either).
//! - The table is `TRUNCATE`d at the start of each run.
//!
//! The server's `Innodb_data_fsyncs` (every fsync InnoDB made: its log's and its data
//! files') is read before and after: the peer's counterpart of redrive's commits (fsyncs)
//! per second (a server-wide counter: other load on the server shows in it).

use super::cycle::{join_tasks, report_cycle, split, ConsumerOutcome, CycleFigures};
use super::pg::EMPTY_CLAIM_SLEEP;
use super::publish::PublisherOutcome;
use super::report::Report;
use super::{claim, progress_ticker, BenchArgs, Ctx, Workload, ERROR_PAUSE};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder};
use serde::Deserialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// What a failed job records as its error.
const LAST_ERROR: &str = "bench: transient";
/// "Deadlock found when trying to get lock".
const ER_LOCK_DEADLOCK: u16 = 1213;
/// "Lock wait timeout exceeded".
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;

/// `--mysql`: `mysql://user[:password]@host[:port]/database`.
pub fn parse_url(s: &str) -> Result<String, String> {
    let opts = Opts::from_url(s).map_err(|e| format!("not a MySQL URL: {e}"))?;
    if opts.db_name().is_none() {
        return Err("no database in the URL (e.g. mysql://root@127.0.0.1:3306/test)".into());
    }
    Ok(s.to_owned())
}

/// The SQL of the peer, for one table.
#[derive(Debug, Clone, PartialEq)]
pub struct Sql {
    /// Table and index, if absent.
    pub schema: String,
    /// Empty the table.
    pub truncate: String,
    /// The start of the multi-row insert (`VALUES` and the rows follow).
    pub insert: String,
    /// `?` queue, `?` limit: `id, attempts, payload` of the rows to take.
    pub select: String,
    /// The claim's update, before its id list.
    pub take: String,
    /// The fail update, before its id list (`?` error text).
    pub fail: String,
    /// The delete, before its id list.
    pub complete: String,
    /// `?` queue: rows left.
    pub left: String,
}

impl Sql {
    /// The statements for `table` (a plain identifier: `pg::parse_table`).
    pub fn new(table: &str) -> Self {
        Self {
            // No partial indexes on InnoDB: the available set is the (queue, state, run_at)
            // prefix of one index.
            schema: format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                 id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
                 queue VARCHAR(255) NOT NULL, \
                 state TINYINT NOT NULL DEFAULT 0 COMMENT '0 available, 1 running', \
                 attempts INT NOT NULL DEFAULT 0, \
                 run_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
                 locked_until DATETIME(6) NULL, \
                 payload LONGTEXT NOT NULL, \
                 last_error TEXT NULL, \
                 KEY {table}_available (queue, state, run_at, id)) ENGINE = InnoDB"
            ),
            truncate: format!("TRUNCATE TABLE {table}"),
            insert: format!("INSERT INTO {table} (queue, payload) VALUES "),
            select: format!(
                "SELECT id, attempts, payload FROM {table} \
                 WHERE queue = ? AND state = 0 AND run_at <= NOW(6) \
                 ORDER BY run_at, id LIMIT ? FOR UPDATE SKIP LOCKED"
            ),
            take: format!(
                "UPDATE {table} SET state = 1, attempts = attempts + 1, \
                 locked_until = NOW(6) + INTERVAL 5 MINUTE WHERE id IN "
            ),
            fail: format!(
                "UPDATE {table} SET state = 0, run_at = NOW(6), locked_until = NULL, \
                 last_error = ? WHERE id IN "
            ),
            complete: format!("DELETE FROM {table} WHERE id IN "),
            left: format!("SELECT COUNT(*) FROM {table} WHERE queue = ?"),
        }
    }
}

/// `(1,2,3)`: an id list for `IN` (integers only, so it is safe to inline).
fn id_list(ids: &[i64]) -> String {
    let mut s = String::with_capacity(ids.len() * 8 + 2);
    s.push('(');
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&id.to_string());
    }
    s.push(')');
    s
}

/// The fields of a job's payload the bench reads.
#[derive(Debug, Deserialize)]
struct Tag {
    #[serde(default)]
    run: Option<String>,
    #[serde(default)]
    t: Option<i64>,
}

/// Statement retries after InnoDB conflicts, shared by every task of a run.
#[derive(Debug, Default)]
struct Conflicts {
    deadlocks: AtomicU64,
    lock_waits: AtomicU64,
}

/// Whether `e` is a conflict to run again (counted), or a failure.
fn conflict(e: &mysql_async::Error, c: &Conflicts) -> bool {
    match e {
        mysql_async::Error::Server(s) if s.code == ER_LOCK_DEADLOCK => {
            c.deadlocks.fetch_add(1, Ordering::Relaxed);
            true
        }
        mysql_async::Error::Server(s) if s.code == ER_LOCK_WAIT_TIMEOUT => {
            c.lock_waits.fetch_add(1, Ordering::Relaxed);
            true
        }
        _ => false,
    }
}

/// A short random pause before running a conflicting statement again (1–8 ms).
async fn jitter() {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    tokio::time::sleep(Duration::from_micros(1_000 + u64::from(ns % 7_000))).await;
}

async fn connect(url: &str) -> Result<Conn, mysql_async::Error> {
    let opts = OptsBuilder::from_opts(Opts::from_url(url)?).init(vec![
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        "SET SESSION innodb_lock_wait_timeout = 10",
    ]);
    Conn::new(opts).await
}

/// The server's settings that decide what a commit costs.
async fn settings(c: &mut Conn) -> String {
    let row: Option<(String, i64, i64, i64)> = c
        .query_first(
            "SELECT VERSION(), CAST(@@innodb_flush_log_at_trx_commit AS SIGNED), \
             CAST(@@sync_binlog AS SIGNED), CAST(@@log_bin AS SIGNED)",
        )
        .await
        .ok()
        .flatten();
    match row {
        Some((v, flush, sync, log_bin)) => format!(
            "{v} (innodb_flush_log_at_trx_commit = {flush}, log_bin = {}, sync_binlog = {sync})",
            if log_bin == 1 { "on" } else { "off" }
        ),
        None => "?".to_owned(),
    }
}

/// `Innodb_data_fsyncs` now (server-wide; MySQL and MariaDB both have it).
async fn stats(c: &mut Conn) -> Option<u64> {
    let row: Option<(String, String)> = c
        .query_first("SHOW GLOBAL STATUS LIKE 'Innodb_data_fsyncs'")
        .await
        .ok()?;
    row.and_then(|(_, v)| v.parse().ok())
}

/// Run cycle / retry-cycle against the MySQL at `url`, print the report.
pub async fn run(ctx: Arc<Ctx>, args: &BenchArgs, url: &str) -> anyhow::Result<()> {
    let retry = args.workload == Workload::RetryCycle;
    let target = args
        .messages
        .or(args.workload.default_messages())
        .unwrap_or(1);
    let table = args.pg_table.as_str();
    let sql = Arc::new(Sql::new(table));
    let unreachable = |e: mysql_async::Error| anyhow::anyhow!("cannot use MySQL at {url}: {e}");

    let mut admin = connect(url).await.map_err(unreachable)?;
    admin.query_drop(&sql.schema).await.map_err(unreachable)?;
    admin.query_drop(&sql.truncate).await.map_err(unreachable)?;
    let set = settings(&mut admin).await;
    let connections = args.connections as usize;
    let (publishers, consumers) = split(connections, args.publishers.map(|p| p as usize));
    if !args.json {
        eprintln!(
            "bench {} against MySQL {set} ({url}, table {table}): queue {}, {publishers} publishing + \
             {consumers} consuming connections, batch {}, {target} messages",
            args.workload.name(),
            ctx.queue,
            args.batch,
        );
    }

    let mut opening = JoinSet::new();
    for _ in 0..publishers + consumers {
        let url = url.to_owned();
        opening.spawn(async move { connect(&url).await });
    }
    let mut conns = Vec::with_capacity(publishers + consumers);
    while let Some(r) = opening.join_next().await {
        conns.push(
            r.map_err(|e| anyhow::anyhow!("a connecting task failed: {e}"))?
                .map_err(unreachable)?,
        );
    }

    let before = stats(&mut admin).await;
    let conflicts = Arc::new(Conflicts::default());
    let ticker = (!args.json).then(|| tokio::spawn(progress_ticker(ctx.clone())));
    let started = Instant::now();
    let deadline = started + Duration::from_millis(args.timeout.ms());
    let claimed = Arc::new(AtomicU64::new(0));
    let mut consuming = JoinSet::new();
    let mut publishing = JoinSet::new();
    for (i, conn) in conns.into_iter().enumerate() {
        if i < consumers {
            consuming.spawn(consume(
                ctx.clone(),
                conn,
                sql.clone(),
                conflicts.clone(),
                args.batch,
                retry,
                target,
                deadline,
            ));
        } else {
            publishing.spawn(publish(
                ctx.clone(),
                conn,
                sql.clone(),
                conflicts.clone(),
                args.publish_batch.unwrap_or(args.batch) as u64,
                target,
                claimed.clone(),
                deadline,
            ));
        }
    }
    let (published, consumed) = join_tasks(publishing, consuming, started).await;
    ctx.progress.done.store(true, Ordering::Relaxed);
    if let Some(t) = ticker {
        t.abort();
    }
    let (mut published, publish_time) = published?;
    let mut consumed = consumed?;
    let end = ctx.progress.end();
    let elapsed = end.duration_since(started).as_secs_f64();
    let after = stats(&mut admin).await;
    let left: i64 = admin
        .exec_first(&sql.left, (ctx.queue.as_str(),))
        .await
        .ok()
        .flatten()
        .unwrap_or(-1);

    let mut report = Report::new();
    report.text("workload", "workload", args.workload.name());
    report.text("target", "target", "mysql");
    report.text("mysql_server", "MySQL", set);
    report.text("queue", "queue", ctx.queue.clone());
    report.text("mysql_table", "table", table);
    report.count(
        "connections",
        "connections",
        (publishers + consumers) as u64,
    );
    report_cycle(
        &mut report,
        &CycleFigures {
            retry,
            target,
            publishers,
            consumers,
            publish_time,
            elapsed,
            timeout_ms: args.timeout.ms(),
        },
        &mut published,
        &mut consumed,
    );
    report.text(
        "settle",
        "fail and complete",
        "one UPDATE (fail) and one DELETE (complete) by primary key per claim, autocommit",
    );
    report.text(
        "isolation",
        "isolation",
        "READ COMMITTED on every connection",
    );
    report.count("rows_left", "rows left in the queue", left.max(0) as u64);
    let deadlocks = conflicts.deadlocks.load(Ordering::Relaxed);
    let lock_waits = conflicts.lock_waits.load(Ordering::Relaxed);
    report.count(
        "deadlock_retries",
        "statements run again after a deadlock (1213)",
        deadlocks,
    );
    report.count(
        "lock_wait_retries",
        "statements run again after a lock wait timeout (1205)",
        lock_waits,
    );
    report.ratio(
        "deadlock_retries_per_10k",
        "deadlock retries per 10,000 messages",
        deadlocks as f64 * 10_000.0 / target.max(1) as f64,
    );
    if let (Some(f0), Some(f1)) = (before, after) {
        let fsyncs = f1.saturating_sub(f0);
        report.count("mysql_fsyncs", "InnoDB fsyncs (server)", fsyncs);
        report.rate(
            "mysql_fsyncs_per_s",
            "InnoDB fsyncs per second",
            fsyncs as f64 / elapsed.max(1e-9),
        );
    }
    report.secs(
        "wall_s",
        "wall time (incl. drain)",
        started.elapsed().as_secs_f64(),
    );
    report.errors(&ctx.errors);
    super::print_report(report, args.json)
}

/// Record a MySQL error (by code) and pause, so a broken server is not spun on.
async fn failed(ctx: &Ctx, what: &str, e: mysql_async::Error) {
    let kind = match &e {
        mysql_async::Error::Server(s) => format!("mysql {what} {}", s.code),
        _ => format!("mysql {what}"),
    };
    ctx.errors.record(kind, e.to_string());
    tokio::time::sleep(ERROR_PAUSE).await;
}

/// One publisher: insert this run's messages `batch` at a time until `target` are claimed.
#[allow(clippy::too_many_arguments)]
async fn publish(
    ctx: Arc<Ctx>,
    mut conn: Conn,
    sql: Arc<Sql>,
    conflicts: Arc<Conflicts>,
    batch: u64,
    target: u64,
    claimed: Arc<AtomicU64>,
    deadline: Instant,
) -> PublisherOutcome {
    let mut out = PublisherOutcome::default();
    'claims: loop {
        if Instant::now() >= deadline || ctx.progress.is_done() {
            break;
        }
        let range = claim(&claimed, batch.max(1), Some(target));
        if range.is_empty() {
            break;
        }
        let n = range.end - range.start;
        let mut stmt = sql.insert.clone();
        let mut params: Vec<mysql_async::Value> = Vec::with_capacity(2 * n as usize);
        for (i, seq) in range.clone().enumerate() {
            stmt.push_str(if i == 0 { "(?, ?)" } else { ", (?, ?)" });
            params.push(ctx.queue.as_str().into());
            params.push(ctx.payload(seq, "").into());
        }
        loop {
            let t0 = Instant::now();
            match conn.exec_drop(&stmt, params.clone()).await {
                Ok(()) => {
                    out.latency.push_since(t0);
                    out.requests += 1;
                    out.messages += n;
                    ctx.progress.published.fetch_add(n, Ordering::Relaxed);
                    break;
                }
                Err(e) if conflict(&e, &conflicts) => jitter().await,
                Err(e) => failed(&ctx, "insert", e).await,
            }
            if Instant::now() >= deadline || ctx.progress.is_done() {
                break 'claims;
            }
        }
    }
    out
}

/// Claim up to `limit` jobs in one transaction: select them `FOR UPDATE SKIP LOCKED`, update
/// them by primary key, commit.
async fn take(
    conn: &mut Conn,
    sql: &Sql,
    queue: &str,
    limit: u32,
) -> Result<Vec<(i64, i32, String)>, mysql_async::Error> {
    conn.query_drop("BEGIN").await?;
    let work = async {
        let rows: Vec<(i64, i32, String)> = conn.exec(&sql.select, (queue, limit)).await?;
        if !rows.is_empty() {
            let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
            conn.query_drop(format!("{}{}", sql.take, id_list(&ids)))
                .await?;
        }
        conn.query_drop("COMMIT").await?;
        Ok(rows)
    }
    .await;
    if work.is_err() {
        let _ = conn.query_drop("ROLLBACK").await;
    }
    // The claim counted one attempt more than the row said before it.
    work.map(|rows| rows.into_iter().map(|(i, a, p)| (i, a + 1, p)).collect())
}

/// One consumer: claim, fail the first deliveries (retry-cycle), complete the rest,
/// until this run's `target` is reached or `deadline`.
#[allow(clippy::too_many_arguments)]
async fn consume(
    ctx: Arc<Ctx>,
    mut conn: Conn,
    sql: Arc<Sql>,
    conflicts: Arc<Conflicts>,
    batch: u32,
    retry: bool,
    target: u64,
    deadline: Instant,
) -> ConsumerOutcome {
    let mut out = ConsumerOutcome::default();
    while !ctx.progress.is_done() && Instant::now() < deadline {
        let rows = match take(&mut conn, &sql, &ctx.queue, batch).await {
            Ok(rows) => rows,
            Err(e) if conflict(&e, &conflicts) => {
                jitter().await;
                continue;
            }
            Err(e) => {
                failed(&ctx, "claim", e).await;
                continue;
            }
        };
        out.leases += 1;
        if rows.is_empty() {
            out.empty_leases += 1;
            tokio::time::sleep(EMPTY_CLAIM_SLEEP).await;
            continue;
        }
        out.leased += rows.len() as u64;
        let mut fails: Vec<i64> = Vec::new();
        let mut completes: Vec<i64> = Vec::with_capacity(rows.len());
        let mut sent_at: Vec<Option<i64>> = Vec::with_capacity(rows.len());
        for (id, attempts, payload) in &rows {
            let tag: Option<Tag> = serde_json::from_str(payload).ok();
            let own = tag
                .as_ref()
                .and_then(|t| t.run.as_deref())
                .is_some_and(|r| r == ctx.run_id);
            if out.fails(own, i64::from(*attempts), retry) {
                fails.push(*id);
                continue;
            }
            completes.push(*id);
            sent_at.push(own.then(|| tag.and_then(|t| t.t).unwrap_or(0)));
        }
        if !fails.is_empty() {
            let stmt = format!("{}{}", sql.fail, id_list(&fails));
            loop {
                match conn.exec_drop(&stmt, (LAST_ERROR,)).await {
                    Ok(()) => {
                        out.nacked += conn.affected_rows();
                        break;
                    }
                    Err(e) if conflict(&e, &conflicts) => jitter().await,
                    Err(e) => {
                        failed(&ctx, "fail", e).await;
                        break;
                    }
                }
            }
        }
        if !completes.is_empty() {
            let stmt = format!("{}{}", sql.complete, id_list(&completes));
            loop {
                match conn.query_drop(&stmt).await {
                    Ok(()) => {
                        let n = conn.affected_rows();
                        if n == completes.len() as u64 {
                            out.completed(&ctx, sent_at.iter().flatten(), target);
                        } else {
                            ctx.errors.record(
                                "mysql complete: rows missing",
                                format!("deleted {n} of {} claimed rows", completes.len()),
                            );
                        }
                        break;
                    }
                    Err(e) if conflict(&e, &conflicts) => jitter().await,
                    Err(e) => {
                        failed(&ctx, "complete", e).await;
                        break;
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        assert!(parse_url("mysql://root@127.0.0.1:3306/test").is_ok());
        assert!(parse_url("mysql://u:p@localhost/db").is_ok());
        assert!(
            parse_url("mysql://root@127.0.0.1:3306").is_err(),
            "no database"
        );
        assert!(parse_url("postgres://root@127.0.0.1/test").is_err());
    }

    #[test]
    fn statements_name_the_table_and_claim_by_primary_key() {
        let sql = Sql::new("t");
        assert!(sql.select.ends_with("LIMIT ? FOR UPDATE SKIP LOCKED"));
        assert!(sql.select.contains("ORDER BY run_at, id"));
        assert!(sql.take.starts_with("UPDATE t SET state = 1"));
        assert!(sql.take.ends_with("WHERE id IN "));
        assert_eq!(sql.complete, "DELETE FROM t WHERE id IN ");
        assert!(sql.schema.contains("(queue, state, run_at, id)"));
        assert_eq!(id_list(&[3, 1, 2]), "(3,1,2)");
    }
}
