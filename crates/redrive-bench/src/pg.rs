//! `--pg URL`: `cycle` and `retry-cycle` against the peer users compare redrive
//! with, a home-made PostgreSQL job table consumed with `FOR UPDATE SKIP LOCKED`
//! (the River / pgmq / Oban pattern), driven with the same shapes as [`super::cycle`]
//! and reported with the same keys.
//!
//! - One connection per task (tokio-postgres, no TLS), all opened before the clock
//!   starts, each with `SET synchronous_commit = on`: a commit is durable when it
//!   returns, as a redrive answer is. The run reports `fsync` and
//!   `synchronous_commit` as the server sees them.
//! - Publishers claim `--batch` message numbers at a time and insert them with one
//!   statement (`INSERT … SELECT FROM unnest($texts)`), one transaction each.
//! - Consumers claim up to `--batch` available jobs with one `UPDATE … WHERE id IN
//!   (SELECT … FOR UPDATE SKIP LOCKED LIMIT n) RETURNING`, then settle the claim with
//!   at most two statements sent together on the connection (pipelined): fail the
//!   first deliveries (`state = 0, run_at = now()`: retry at once) and delete the
//!   rest. Each statement is its own transaction (autocommit), so one claim costs up
//!   to three commits, as one redrive lease costs a lease, a nack and an ack request.
//! - An empty claim sleeps [`EMPTY_CLAIM_SLEEP`]: PostgreSQL has no long poll
//!   (LISTEN/NOTIFY would be the next step), where redrive's consumers wait in the
//!   lease request.
//! - The table is TRUNCATEd at the start of each run (fresh heap and index, no bloat
//!   of earlier runs); the bloat the run itself makes is part of what it measures.
//!
//! After the run the cluster's WAL syncs (`pg_stat_wal.wal_sync`) and the database's
//! committed transactions (`pg_stat_database.xact_commit`) are read again: the
//! peer's counterpart of redrive's commits (fsyncs) per second. They are
//! cluster-/database-wide counters, so other load on the server shows in them.

use super::cycle::{join_tasks, report_cycle, split, ConsumerOutcome, CycleFigures};
use super::publish::PublisherOutcome;
use super::report::Report;
use super::{claim, progress_ticker, BenchArgs, Ctx, Workload, ERROR_PAUSE};
use serde::Deserialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio_postgres::{Client, Config, NoTls, Statement};

/// The job table unless `--pg-table` says otherwise.
pub const DEFAULT_TABLE: &str = "redrive_bench_jobs";
/// How long a consumer whose claim came back empty waits before claiming again.
pub const EMPTY_CLAIM_SLEEP: Duration = Duration::from_millis(5);
/// What a failed job records as its error.
const LAST_ERROR: &str = "bench: transient";

/// `--pg`: a libpq-style URL (`postgres://user@host:port/db`) or key=value string.
pub fn parse_url(s: &str) -> Result<String, String> {
    let config: Config = s
        .parse()
        .map_err(|e| format!("not a PostgreSQL connection string: {e}"))?;
    if config.get_hosts().is_empty() {
        return Err(
            "no host in the connection string (e.g. postgres://root@127.0.0.1:5432/test)".into(),
        );
    }
    Ok(s.to_owned())
}

/// `--pg-table`: a plain lower-case SQL identifier (it is put into the statements as is).
pub fn parse_table(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "expected a lower-case identifier ([a-z_][a-z0-9_]*, at most 63 bytes), got {s:?}"
        ))
    }
}

/// The SQL of the peer, for one table.
#[derive(Debug, Clone, PartialEq)]
pub struct Sql {
    /// Table and index, if absent.
    pub schema: String,
    /// Empty the table.
    pub truncate: String,
    /// `$1` queue, `$2` payloads (`text[]` of JSON).
    pub insert: String,
    /// `$1` queue, `$2` limit; answers `id, attempts, payload::text`.
    pub claim: String,
    /// `$1` ids, `$2` error text.
    pub fail: String,
    /// `$1` ids.
    pub complete: String,
    /// `$1` queue: rows left.
    pub left: String,
}

impl Sql {
    /// The statements for `table`.
    pub fn new(table: &str) -> Self {
        Self {
            schema: format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                 id bigserial PRIMARY KEY, \
                 queue text NOT NULL, \
                 state smallint NOT NULL DEFAULT 0, \
                 attempts int NOT NULL DEFAULT 0, \
                 run_at timestamptz NOT NULL DEFAULT now(), \
                 locked_until timestamptz, \
                 payload jsonb NOT NULL, \
                 last_error text); \
                 COMMENT ON COLUMN {table}.state IS '0 available, 1 running'; \
                 CREATE INDEX IF NOT EXISTS {table}_available \
                 ON {table} (queue, run_at, id) WHERE state = 0"
            ),
            truncate: format!("TRUNCATE {table} RESTART IDENTITY"),
            insert: format!(
                "INSERT INTO {table} (queue, payload) SELECT $1, p::jsonb FROM unnest($2::text[]) AS p"
            ),
            claim: format!(
                "UPDATE {table} SET state = 1, attempts = attempts + 1, \
                 locked_until = now() + interval '5 min' \
                 WHERE id IN (SELECT id FROM {table} \
                 WHERE queue = $1 AND state = 0 AND run_at <= now() \
                 ORDER BY run_at, id FOR UPDATE SKIP LOCKED LIMIT $2) \
                 RETURNING id, attempts, payload::text"
            ),
            fail: format!(
                "UPDATE {table} SET state = 0, run_at = now(), locked_until = NULL, last_error = $2 \
                 WHERE id = ANY($1)"
            ),
            complete: format!("DELETE FROM {table} WHERE id = ANY($1)"),
            left: format!("SELECT count(*) FROM {table} WHERE queue = $1"),
        }
    }
}

/// The fields of a job's payload the bench reads.
#[derive(Debug, Deserialize)]
struct Tag {
    #[serde(default)]
    run: Option<String>,
    #[serde(default)]
    t: Option<i64>,
}

/// The server's settings that decide what a commit costs.
#[derive(Debug, Default)]
struct Settings {
    version: String,
    fsync: String,
    synchronous_commit: String,
    wal_sync_method: String,
    commit_delay: String,
}

/// Cumulative counters.
#[derive(Debug, Clone, Copy)]
struct PgStats {
    xact_commit: i64,
    wal_sync: i64,
    wal_records: i64,
}

/// The prepared statements of one task's connection.
#[derive(Debug, Clone)]
struct Prepared {
    insert: Statement,
    claim: Statement,
    fail: Statement,
    complete: Statement,
}

/// Open one connection for `application_name`, durable commits on.
async fn connect(config: &Config, ctx: &Arc<Ctx>) -> anyhow::Result<Client> {
    let (client, connection) = config.connect(NoTls).await?;
    let tally = ctx.clone();
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tally.errors.record("pg connection", e.to_string());
        }
    });
    client.batch_execute("SET synchronous_commit = on").await?;
    Ok(client)
}

async fn prepare(client: &Client, sql: &Sql) -> Result<Prepared, tokio_postgres::Error> {
    Ok(Prepared {
        insert: client.prepare(&sql.insert).await?,
        claim: client.prepare(&sql.claim).await?,
        fail: client.prepare(&sql.fail).await?,
        complete: client.prepare(&sql.complete).await?,
    })
}

async fn show(client: &Client, setting: &str) -> String {
    match client.query_one(&format!("SHOW {setting}"), &[]).await {
        Ok(row) => row.try_get::<_, String>(0).unwrap_or_default(),
        Err(_) => "?".to_owned(),
    }
}

async fn settings(client: &Client) -> Settings {
    Settings {
        version: show(client, "server_version").await,
        fsync: show(client, "fsync").await,
        synchronous_commit: show(client, "synchronous_commit").await,
        wal_sync_method: show(client, "wal_sync_method").await,
        commit_delay: show(client, "commit_delay").await,
    }
}

/// The counters now (`None` where `pg_stat_wal` is missing, before PostgreSQL 14).
async fn stats(client: &Client) -> Option<PgStats> {
    let _ = client
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await;
    let row = client
        .query_one(
            "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), \
             wal_sync, wal_records FROM pg_stat_wal",
            &[],
        )
        .await
        .ok()?;
    Some(PgStats {
        xact_commit: row.try_get(0).ok()?,
        wal_sync: row.try_get(1).ok()?,
        wal_records: row.try_get(2).ok()?,
    })
}

/// Wait (at most 5 s) until the run's other backends are gone, so that they have
/// flushed their statistics (a backend reports its WAL syncs at exit at the latest).
async fn wait_for_backends(client: &Client, application_name: &str) {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = $1 AND pid <> pg_backend_pid()",
                &[&application_name],
            )
            .await
            .and_then(|r| r.try_get(0))
            .unwrap_or(0);
        if n == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The backend leaves pg_stat_activity just before its last statistics flush.
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// Run cycle / retry-cycle against the PostgreSQL at `url`, print the report.
pub async fn run(ctx: Arc<Ctx>, args: &BenchArgs, url: &str) -> anyhow::Result<()> {
    let retry = args.workload == Workload::RetryCycle;
    let target = args
        .messages
        .or(args.workload.default_messages())
        .unwrap_or(1);
    let table = args.pg_table.as_str();
    let sql = Sql::new(table);
    let application_name = format!("redrive-bench-{}", ctx.run_id);
    let mut config: Config = url
        .parse()
        .map_err(|e| redrive_client::cli::usage(format!("--pg: {e}")))?;
    config.application_name(&application_name);
    let unreachable = |e: anyhow::Error| anyhow::anyhow!("cannot use PostgreSQL at {url}: {e:#}");

    // Setup on a connection of its own: schema, empty table, settings, counters.
    let admin = connect(&config, &ctx).await.map_err(unreachable)?;
    admin
        .batch_execute(&sql.schema)
        .await
        .map_err(|e| unreachable(e.into()))?;
    admin
        .batch_execute(&sql.truncate)
        .await
        .map_err(|e| unreachable(e.into()))?;
    let set = settings(&admin).await;

    let connections = args.connections as usize;
    let (publishers, consumers) = split(connections, args.publishers.map(|p| p as usize));
    if !args.json {
        eprintln!(
            "bench {} against PostgreSQL {} ({url}, table {table}): queue {}, {publishers} publishing + \
             {consumers} consuming connections, batch {}, {target} messages; fsync = {}, \
             synchronous_commit = {}",
            args.workload.name(),
            set.version,
            ctx.queue,
            args.batch,
            set.fsync,
            set.synchronous_commit
        );
        if set.fsync != "on" || set.synchronous_commit != "on" {
            eprintln!("warning: commits are not durable on this server: not comparable with redrive's fsync");
        }
    }

    // Every task's connection, opened (and its statements prepared) before the clock starts.
    let mut opening = JoinSet::new();
    for _ in 0..publishers + consumers {
        let (config, ctx, sql) = (config.clone(), ctx.clone(), sql.clone());
        opening.spawn(async move {
            let client = connect(&config, &ctx).await?;
            let prepared = prepare(&client, &sql).await?;
            anyhow::Ok((client, prepared))
        });
    }
    let mut clients = Vec::with_capacity(publishers + consumers);
    while let Some(r) = opening.join_next().await {
        clients.push(
            r.map_err(|e| anyhow::anyhow!("a connecting task failed: {e}"))?
                .map_err(unreachable)?,
        );
    }

    let before = stats(&admin).await;
    let ticker = (!args.json).then(|| tokio::spawn(progress_ticker(ctx.clone())));
    let started = Instant::now();
    let deadline = started + Duration::from_millis(args.timeout.ms());
    let claimed = Arc::new(AtomicU64::new(0));
    let mut consuming = JoinSet::new();
    let mut publishing = JoinSet::new();
    for (i, (client, prepared)) in clients.into_iter().enumerate() {
        if i < consumers {
            consuming.spawn(consume(
                ctx.clone(),
                client,
                prepared,
                args.batch,
                retry,
                target,
                deadline,
            ));
        } else {
            publishing.spawn(publish(
                ctx.clone(),
                client,
                prepared,
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
    // The task connections closed with their tasks: let their statistics land.
    wait_for_backends(&admin, &application_name).await;
    let after = stats(&admin).await;
    let left: i64 = admin
        .query_one(&sql.left, &[&ctx.queue])
        .await
        .and_then(|r| r.try_get(0))
        .unwrap_or(-1);

    let mut report = Report::new();
    report.text("workload", "workload", args.workload.name());
    report.text("target", "target", "postgresql");
    report.text(
        "pg_server",
        "PostgreSQL",
        format!(
            "{} (fsync = {}, synchronous_commit = {}, wal_sync_method = {}, commit_delay = {})",
            set.version, set.fsync, set.synchronous_commit, set.wal_sync_method, set.commit_delay
        ),
    );
    report.text("pg_fsync", "fsync", set.fsync.clone());
    report.text(
        "pg_synchronous_commit",
        "synchronous_commit",
        set.synchronous_commit.clone(),
    );
    report.text("queue", "queue", ctx.queue.clone());
    report.text("pg_table", "table", table);
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
        "one UPDATE (fail) and one DELETE (complete) per claim, pipelined",
    );
    report.text(
        "consumer_wait",
        "on an empty claim",
        format!(
            "sleep {} ms, then claim again (redrive's consumers long-poll instead)",
            EMPTY_CLAIM_SLEEP.as_millis()
        ),
    );
    report.count("rows_left", "rows left in the queue", left.max(0) as u64);
    match (before, after) {
        (Some(b), Some(a)) => {
            // Per second of the run (the counters also cover the drain, where nothing commits).
            let secs = elapsed.max(1e-9);
            let xacts = (a.xact_commit - b.xact_commit).max(0) as u64;
            let syncs = (a.wal_sync - b.wal_sync).max(0) as u64;
            let records = (a.wal_records - b.wal_records).max(0) as u64;
            report.count(
                "pg_xact_commits",
                "transactions committed (database)",
                xacts,
            );
            report.count("pg_wal_syncs", "WAL syncs (cluster)", syncs);
            report.count("pg_wal_records", "WAL records (cluster)", records);
            report.rate(
                "pg_wal_syncs_per_s",
                "WAL syncs (fsyncs) per second",
                syncs as f64 / secs,
            );
            report.text(
                "pg_commits_per_wal_sync",
                "commits per WAL sync",
                if syncs > 0 {
                    format!("{:.1}", xacts as f64 / syncs as f64)
                } else {
                    "n/a (no syncs)".to_owned()
                },
            );
        }
        _ => report.text(
            "pg_wal_syncs",
            "WAL syncs",
            "n/a (pg_stat_wal not readable)",
        ),
    }
    report.secs(
        "wall_s",
        "wall time (incl. drain)",
        started.elapsed().as_secs_f64(),
    );
    report.errors(&ctx.errors);
    super::print_report(report, args.json)
}

/// Record a PostgreSQL error (by SQLSTATE) and pause, so a broken server is not spun on.
async fn failed(ctx: &Ctx, what: &str, e: tokio_postgres::Error) {
    let kind = match e.code() {
        Some(code) => format!("pg {what} {}", code.code()),
        None => format!("pg {what}"),
    };
    ctx.errors.record(kind, e.to_string());
    tokio::time::sleep(ERROR_PAUSE).await;
}

/// One publisher: insert this run's messages `batch` at a time until `target` are claimed.
async fn publish(
    ctx: Arc<Ctx>,
    client: Client,
    prepared: Prepared,
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
        loop {
            let payloads: Vec<String> = range.clone().map(|seq| ctx.payload(seq, "")).collect();
            let t0 = Instant::now();
            match client
                .execute(&prepared.insert, &[&ctx.queue, &payloads])
                .await
            {
                Ok(_) => {
                    out.latency.push_since(t0);
                    out.requests += 1;
                    out.messages += n;
                    ctx.progress.published.fetch_add(n, Ordering::Relaxed);
                    break;
                }
                Err(e) => failed(&ctx, "insert", e).await,
            }
            if Instant::now() >= deadline || ctx.progress.is_done() {
                break 'claims;
            }
        }
    }
    out
}

/// One consumer: claim, fail the first deliveries (retry-cycle), complete the rest,
/// until this run's `target` is reached or `deadline`.
async fn consume(
    ctx: Arc<Ctx>,
    client: Client,
    prepared: Prepared,
    batch: u32,
    retry: bool,
    target: u64,
    deadline: Instant,
) -> ConsumerOutcome {
    let mut out = ConsumerOutcome::default();
    let limit = i64::from(batch);
    while !ctx.progress.is_done() && Instant::now() < deadline {
        let rows = match client.query(&prepared.claim, &[&ctx.queue, &limit]).await {
            Ok(rows) => rows,
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
        let mut sent_at: Vec<Option<i64>> = Vec::with_capacity(rows.len()); // this run's: publish µs
        for row in &rows {
            let (id, attempts, payload): (i64, i32, String) =
                match (row.try_get(0), row.try_get(1), row.try_get(2)) {
                    (Ok(id), Ok(a), Ok(p)) => (id, a, p),
                    _ => {
                        ctx.errors.record("pg claim row", "unexpected column types");
                        continue;
                    }
                };
            let tag: Option<Tag> = serde_json::from_str(&payload).ok();
            let own = tag
                .as_ref()
                .and_then(|t| t.run.as_deref())
                .is_some_and(|r| r == ctx.run_id);
            if out.fails(own, i64::from(attempts), retry) {
                fails.push(id);
                continue;
            }
            completes.push(id);
            sent_at.push(own.then(|| tag.and_then(|t| t.t).unwrap_or(0)));
        }
        let fail = async {
            if fails.is_empty() {
                return Ok(0);
            }
            client.execute(&prepared.fail, &[&fails, &LAST_ERROR]).await
        };
        let complete = async {
            if completes.is_empty() {
                return Ok(0);
            }
            client.execute(&prepared.complete, &[&completes]).await
        };
        let (failed_rows, completed_rows) = tokio::join!(fail, complete);
        match failed_rows {
            Ok(n) => out.nacked += n,
            Err(e) => failed(&ctx, "fail", e).await,
        }
        match completed_rows {
            Ok(n) if n == completes.len() as u64 => {
                out.completed(&ctx, sent_at.iter().flatten(), target)
            }
            Ok(n) => ctx.errors.record(
                "pg complete: rows missing",
                format!("deleted {n} of {} claimed rows", completes.len()),
            ),
            Err(e) => failed(&ctx, "complete", e).await,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        assert!(parse_url("postgres://root@127.0.0.1:5432/test").is_ok());
        assert!(parse_url("postgresql://u:p@localhost/db?connect_timeout=5").is_ok());
        assert!(parse_url("host=127.0.0.1 user=root dbname=test").is_ok());
        assert!(parse_url("http://127.0.0.1:7077").is_err());
        assert!(parse_url("postgres:///test").is_err(), "no host");
    }

    #[test]
    fn table_names_are_plain_identifiers() {
        assert_eq!(
            parse_table("redrive_bench_jobs").unwrap(),
            "redrive_bench_jobs"
        );
        assert!(parse_table("_t1").is_ok());
        for bad in [
            "",
            "1t",
            "Jobs",
            "jobs; DROP TABLE x",
            "a-b",
            &"x".repeat(64),
        ] {
            assert!(parse_table(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn statements_name_the_table() {
        let sql = Sql::new("t");
        assert!(sql.claim.starts_with("UPDATE t SET state = 1"));
        assert!(sql.claim.contains("FOR UPDATE SKIP LOCKED LIMIT $2"));
        assert!(sql.claim.contains("ORDER BY run_at, id"));
        assert!(sql
            .schema
            .contains("ON t (queue, run_at, id) WHERE state = 0"));
        assert_eq!(sql.complete, "DELETE FROM t WHERE id = ANY($1)");
        assert!(sql.fail.contains("SET state = 0, run_at = now()"));
    }

    #[test]
    fn payload_tags_are_read() {
        let t: Tag = serde_json::from_str(r#"{"run":"1-2","n":3,"t":44,"pad":"x"}"#).unwrap();
        assert_eq!(t.run.as_deref(), Some("1-2"));
        assert_eq!(t.t, Some(44));
        let t: Tag = serde_json::from_str(r#"{"other":1}"#).unwrap();
        assert!(t.run.is_none());
    }
}
