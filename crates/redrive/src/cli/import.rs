//! `redrive import`: a way in for teams that keep their retries in a MySQL table (the seeds'
//! `msg_retry`, issue 18). It reads the table and publishes its rows through the server's
//! HTTP API like any other client command:
//!
//! - a `pending` row becomes a message due at its `next_retry_at` (now when that is past),
//!   carrying its `fail_times` as the attempts already made (`failed.attempts`), so the
//!   queue's policy counts them: a row already out of attempts by the policy is dead at once;
//!   a row with `fail_times` 0 is a plain delayed publish;
//! - a `dead` row becomes a dead letter (a `permanent` failure reported at publish);
//! - a `done` row is skipped (counted);
//! - anything else (a topic that is no queue name, a payload that is not JSON, another
//!   status …) fails that row, listed, and the import goes on.
//!
//! The payload is published as is. Each message has the idempotency key
//! `import:<table>:<id>`: a second run within the server's `idempotency_window` publishes
//! nothing new and says how many rows were already imported (a replay is 200 and the batch
//! answer's `replayed`). After the window a run would import the rows again.
//!
//! What it never does: write to the source table (its session is `READ ONLY`), read it in
//! one giant SELECT (pages of [`PAGE_ROWS`] by the id column, `WHERE id > ? ORDER BY id`), or
//! splice a flag into SQL unchecked (identifiers are letters, digits and `_`, quoted with
//! backticks; values are bound parameters).
//!
//! Time: a DATETIME has no zone. The session's `time_zone` is set to `--timezone-offset`
//! (default `+00:00`) and every DATETIME is read as local time at that offset; a TIMESTAMP
//! column comes out of MySQL in that same offset, so it stays right whatever the flag says.
//! An integer column (the seed's own DDL has `next_retry_at INT UNSIGNED`, PHP's `time()`)
//! is Unix seconds, or milliseconds when it is too large to be seconds.

use super::client::cli_error;
use super::output::{emit, print_json, Align, Table};
use super::usage;
use crate::ImportArgs;
use anyhow::Context;
use mysql_async::prelude::Queryable;
use mysql_async::Value as SqlValue;
use redrive_client::{Client, FailedReport, Publish, Published};
use redrive_core::{
    validate_queue_name, Decision, ErrorClass, Failure, FailureContext, Message, RetryPolicy,
    State, Timestamp,
};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::io::IsTerminal;
use std::time::Duration;

/// Rows read per SELECT.
pub const PAGE_ROWS: u32 = 1_000;
/// Longest identifier MySQL takes (table and column names).
const MAX_IDENTIFIER_CHARS: usize = 64;
/// Largest `fail_times` the API takes as `failed.attempts`.
const MAX_ATTEMPTS_REPORTED: i64 = 1_000_000;
/// Longest idempotency key the API takes.
const MAX_KEY_CHARS: usize = 512;
/// Row errors kept for the summary (the counts stay exact past it).
const MAX_ERRORS_KEPT: usize = 1_000;
/// Row errors printed in the text summary (`--json` has all that were kept).
const MAX_ERRORS_PRINTED: usize = 20;
/// Without a terminal, a progress line every this many rows.
const PROGRESS_EVERY_ROWS: u64 = 10_000;
/// How long connecting to MySQL may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// An integer `next_retry_at` at or above this is milliseconds, not seconds (as seconds it
/// would be past the year 5000).
const MILLIS_FROM: i64 = 100_000_000_000;

/// A UTC offset of the table's DATETIME values, `±HH:MM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcOffset {
    /// Minutes east of UTC.
    pub minutes: i32,
}

impl fmt::Display for UtcOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.minutes < 0 { '-' } else { '+' };
        let m = self.minutes.unsigned_abs();
        write!(f, "{sign}{:02}:{:02}", m / 60, m % 60)
    }
}

/// `--timezone-offset`: `+08:00`, `-05:30`, `+0800`, `Z` or `UTC`; from -12:00 to +14:00
/// (the offsets in use), minutes below 60.
pub fn parse_offset(s: &str) -> Result<UtcOffset, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("z") || s.eq_ignore_ascii_case("utc") {
        return Ok(UtcOffset { minutes: 0 });
    }
    let bad =
        || format!("{s:?} is not a UTC offset: give ±HH:MM, e.g. +08:00 for Asia/Shanghai, or Z");
    let (sign, rest) = match s.as_bytes().first() {
        Some(b'+') => (1, &s[1..]),
        Some(b'-') => (-1, &s[1..]),
        _ => return Err(bad()),
    };
    let (h, m) = match rest.split_once(':') {
        Some(hm) => hm,
        None if rest.len() == 4 => rest.split_at(2),
        None => return Err(bad()),
    };
    let digits = |t: &str| t.len() == 2 && t.bytes().all(|b| b.is_ascii_digit());
    if !digits(h) || !digits(m) {
        return Err(bad());
    }
    let (h, m): (i32, i32) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    let minutes = sign * (h * 60 + m);
    if m >= 60 || !(-12 * 60..=14 * 60).contains(&minutes) {
        return Err(format!("{s:?} is out of range: from -12:00 to +14:00"));
    }
    Ok(UtcOffset { minutes })
}

/// A table or column name from flag `flag`, checked (1 to 64 letters, digits and `_`) and
/// quoted with backticks for SQL.
pub fn identifier(flag: &str, name: &str) -> anyhow::Result<String> {
    let ok = !name.is_empty()
        && name.chars().count() <= MAX_IDENTIFIER_CHARS
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(format!("`{name}`"))
    } else {
        Err(usage(format!(
            "{flag}: {name:?} is not a plain identifier (1 to {MAX_IDENTIFIER_CHARS} letters, digits or _)"
        )))
    }
}

/// The source table's columns, by the flags that name them (in the SELECT's order).
#[derive(Debug, Clone)]
struct Columns {
    /// (flag, name) of id, topic, payload, fail_times, next_retry_at, status.
    named: [(&'static str, String); 6],
}

impl Columns {
    fn of(args: &ImportArgs) -> anyhow::Result<Self> {
        let named = [
            ("--id-column", args.id_column.clone()),
            ("--topic-column", args.topic_column.clone()),
            ("--payload-column", args.payload_column.clone()),
            ("--fail-times-column", args.fail_times_column.clone()),
            ("--next-retry-column", args.next_retry_column.clone()),
            ("--status-column", args.status_column.clone()),
        ];
        for (flag, name) in &named {
            identifier(flag, name)?;
        }
        Ok(Self { named })
    }

    fn quoted(&self, i: usize) -> String {
        format!("`{}`", self.named[i].1)
    }

    fn id(&self) -> String {
        self.quoted(0)
    }
}

/// How rows map to messages: the flags that are no column names.
#[derive(Debug, Clone)]
pub struct Mapping {
    /// The table's name, for the idempotency keys and messages.
    pub table: String,
    /// Every row to this queue, else the row's topic.
    pub queue: Option<String>,
    /// The status values.
    pub pending: String,
    /// See `pending`.
    pub dead: String,
    /// See `pending`.
    pub done: String,
}

/// One row as read, decoded but not yet judged.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceRow {
    /// The id, as text (an integer's decimal digits).
    pub id: String,
    /// The topic (`None`: NULL or not UTF-8).
    pub topic: Option<String>,
    /// The payload's bytes (`None`: NULL).
    pub payload: Option<Vec<u8>>,
    /// `fail_times`: `Err` says why it is no count.
    pub fail_times: Result<i64, String>,
    /// `next_retry_at` in UTC: `Err` says why it is no time.
    pub next_retry_at: Result<Timestamp, String>,
    /// The status as text (`None`: NULL).
    pub status: Option<String>,
}

/// What a source row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Still to retry: a scheduled message.
    Pending,
    /// Given up: a dead letter.
    Dead,
}

/// What the import does with a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Publish `message` to `queue`.
    Publish {
        /// The target queue.
        queue: String,
        /// Pending or dead.
        kind: Kind,
        /// Attempts already made (`fail_times`).
        attempts: u32,
        /// The next try's time (pending rows).
        due: Option<Timestamp>,
        /// The request.
        message: Box<Publish>,
    },
    /// A done row: skipped.
    Done,
    /// A row that cannot be imported, and why.
    Invalid(String),
}

/// The idempotency key of a row: `import:<table>:<id>`.
pub fn idempotency_key(table: &str, id: &str) -> String {
    format!("import:{table}:{id}")
}

/// Decide what to publish for `row` (pure: this is the whole mapping of issue 18).
pub fn plan(row: &SourceRow, m: &Mapping) -> Plan {
    let Some(status) = row.status.as_deref() else {
        return Plan::Invalid(format!(
            "status is NULL (none of {:?}, {:?}, {:?})",
            m.pending, m.dead, m.done
        ));
    };
    let kind = if status == m.pending {
        Kind::Pending
    } else if status == m.dead {
        Kind::Dead
    } else if status == m.done {
        return Plan::Done;
    } else {
        return Plan::Invalid(format!(
            "status {status:?} is none of {:?}, {:?}, {:?} (--pending-value, --dead-value, --done-value)",
            m.pending, m.dead, m.done
        ));
    };
    let queue = match (&m.queue, row.topic.as_deref()) {
        (Some(q), _) => q.clone(),
        (None, None) => return Plan::Invalid("topic is NULL (or not UTF-8): no queue".into()),
        (None, Some(t)) => match validate_queue_name(t) {
            Ok(()) => t.to_owned(),
            Err(_) => {
                return Plan::Invalid(format!(
                    "topic {t:?} is not a queue name ([A-Za-z0-9._:-]{{1,128}}); give --queue to \
                     import every row into one queue"
                ))
            }
        },
    };
    let payload = match &row.payload {
        None => serde_json::Value::Null,
        Some(bytes) => match serde_json::from_slice(bytes) {
            Ok(v) => v,
            Err(e) => return Plan::Invalid(format!("payload is not JSON ({e})")),
        },
    };
    let fail_times = match &row.fail_times {
        Ok(n @ 0..=MAX_ATTEMPTS_REPORTED) => *n as u32,
        Ok(n) => {
            return Plan::Invalid(format!(
                "fail_times {n} is not in 0..={MAX_ATTEMPTS_REPORTED}"
            ))
        }
        Err(why) => return Plan::Invalid(format!("fail_times: {why}")),
    };
    let key = idempotency_key(&m.table, &row.id);
    if key.chars().count() > MAX_KEY_CHARS {
        return Plan::Invalid(format!(
            "the idempotency key {key:?} is over {MAX_KEY_CHARS} characters (a shorter id column?)"
        ));
    }
    let mut message = Publish::new(payload);
    message.idempotency_key = Some(key);
    let (attempts, due) = match kind {
        Kind::Pending => {
            let due = match &row.next_retry_at {
                Ok(t) => *t,
                Err(why) => return Plan::Invalid(format!("next_retry_at: {why}")),
            };
            message.deliver_at = Some(due.to_rfc3339());
            if fail_times >= 1 {
                let mut f = FailedReport::new(
                    ErrorClass::Transient,
                    format!(
                        "imported from {} row {} (fail_times {fail_times})",
                        m.table, row.id
                    ),
                );
                f.attempts = Some(fail_times);
                message.failed = Some(f);
            }
            (fail_times, Some(due))
        }
        Kind::Dead => {
            let mut f = FailedReport::new(
                ErrorClass::Permanent,
                format!(
                    "imported from {} row {}: dead after {fail_times} tries",
                    m.table, row.id
                ),
            );
            f.attempts = Some(fail_times.max(1));
            message.failed = Some(f);
            (fail_times, None)
        }
    };
    Plan::Publish {
        queue,
        kind,
        attempts,
        due,
        message: Box::new(message),
    }
}

/// What a published row became, or would become (a dry run asks the queue's policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A pending row, due later.
    Scheduled,
    /// A pending row, due now.
    Ready,
    /// A pending row the queue's policy ended at once (out of attempts, or due past
    /// `max_age`): a dead letter.
    PendingDead,
    /// A dead row: a dead letter.
    Dead,
    /// Published by an earlier run (an idempotent replay).
    AlreadyImported,
}

/// What the queue's `policy` makes of a planned row at `now`: the rule the server applies
/// ([`RetryPolicy::decide_at`]), for a dry run.
pub fn predict(
    kind: Kind,
    attempts: u32,
    due: Option<Timestamp>,
    policy: &RetryPolicy,
    now: Timestamp,
) -> Outcome {
    let due = due.unwrap_or(now);
    match kind {
        Kind::Dead => Outcome::Dead,
        Kind::Pending if attempts >= 1 => {
            let ctx = FailureContext {
                counted_attempts: attempts,
                window_start: now,
                now,
                prev_delay_ms: None,
                uncharged_rate_limited: 0,
            };
            let failure = Failure::new(ErrorClass::Transient, "imported");
            match policy.decide_at(&ctx, &failure, due) {
                Decision::Dead { .. } => Outcome::PendingDead,
                Decision::Retry { due_at, .. } if due_at > now => Outcome::Scheduled,
                Decision::Retry { .. } => Outcome::Ready,
            }
        }
        Kind::Pending if due > now => Outcome::Scheduled,
        Kind::Pending => Outcome::Ready,
    }
}

/// What the server made of a published row.
fn outcome_of(kind: Kind, p: &Published<Message>) -> Outcome {
    if p.replayed {
        return Outcome::AlreadyImported;
    }
    match (kind, p.message.state) {
        (Kind::Dead, _) => Outcome::Dead,
        (Kind::Pending, State::Dead) => Outcome::PendingDead,
        (Kind::Pending, State::Scheduled) => Outcome::Scheduled,
        (Kind::Pending, _) => Outcome::Ready,
    }
}

/// Per queue: what its rows became (or would become).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QueueCounts {
    /// Pending rows now scheduled (due later).
    pub scheduled: u64,
    /// Pending rows due now (ready).
    pub ready: u64,
    /// Pending rows the queue's policy ended at once: dead letters.
    pub pending_dead: u64,
    /// Dead rows: dead letters.
    pub dead: u64,
    /// Rows an earlier run imported (nothing published again).
    pub already_imported: u64,
    /// Rows the server refused (listed in `errors`).
    pub failed: u64,
}

/// A row that was not imported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RowError {
    /// Its id.
    pub id: String,
    /// Its queue, when it had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Why.
    pub error: String,
}

/// The import's result (also a dry run's: what would happen).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Whether nothing was published.
    pub dry_run: bool,
    /// The table read.
    pub table: String,
    /// Rows read.
    pub rows: u64,
    /// Done rows, skipped.
    pub done_skipped: u64,
    /// Rows that cannot be imported (listed in `errors`).
    pub invalid: u64,
    /// Rows the server refused (listed in `errors`).
    pub failed: u64,
    /// Messages published now (a dry run: that would be; without what earlier runs did).
    pub published: u64,
    /// Rows an earlier run imported.
    pub already_imported: u64,
    /// Per queue.
    pub queues: BTreeMap<String, QueueCounts>,
    /// The rows not imported, in id order (at most [`MAX_ERRORS_KEPT`]).
    pub errors: Vec<RowError>,
    /// Rows not imported beyond `errors`.
    pub errors_not_listed: u64,
}

impl Summary {
    fn count(&mut self, queue: &str, outcome: Outcome) {
        let q = self.queues.entry(queue.to_owned()).or_default();
        match outcome {
            Outcome::Scheduled => q.scheduled += 1,
            Outcome::Ready => q.ready += 1,
            Outcome::PendingDead => q.pending_dead += 1,
            Outcome::Dead => q.dead += 1,
            Outcome::AlreadyImported => {
                q.already_imported += 1;
                self.already_imported += 1;
                return;
            }
        }
        self.published += 1;
    }

    fn error(&mut self, id: &str, queue: Option<&str>, error: String) {
        if self.errors.len() < MAX_ERRORS_KEPT {
            self.errors.push(RowError {
                id: id.to_owned(),
                queue: queue.map(str::to_owned),
                error,
            });
        } else {
            self.errors_not_listed += 1;
        }
    }

    fn invalid(&mut self, id: &str, why: String) {
        self.invalid += 1;
        self.error(id, None, why);
    }

    fn refused(&mut self, id: &str, queue: &str, why: String) {
        self.failed += 1;
        self.queues.entry(queue.to_owned()).or_default().failed += 1;
        self.error(id, Some(queue), why);
    }

    /// Rows not imported.
    pub fn not_imported(&self) -> u64 {
        self.invalid + self.failed
    }

    /// The summary for people.
    pub fn render(&self, source: &str) -> String {
        let mut out = String::new();
        if self.dry_run {
            out.push_str(&format!(
                "dry run: nothing published. {} rows of `{}` in {source}; what would happen:\n",
                self.rows, self.table
            ));
        } else {
            out.push_str(&format!(
                "imported `{}` from {source}: {} rows read, {} messages published, {} already imported\n",
                self.table, self.rows, self.published, self.already_imported
            ));
        }
        let mut columns = vec![
            ("queue", Align::Left),
            ("pending→scheduled", Align::Right),
            ("pending→ready", Align::Right),
            ("pending→dead", Align::Right),
            ("dead", Align::Right),
        ];
        if !self.dry_run {
            columns.push(("already imported", Align::Right));
            columns.push(("failed", Align::Right));
        }
        let mut t = Table::new(&columns);
        for (name, q) in &self.queues {
            let mut row = vec![
                name.clone(),
                q.scheduled.to_string(),
                q.ready.to_string(),
                q.pending_dead.to_string(),
                q.dead.to_string(),
            ];
            if !self.dry_run {
                row.push(q.already_imported.to_string());
                row.push(q.failed.to_string());
            }
            t.push(row);
        }
        if !self.queues.is_empty() {
            out.push_str(&t.render());
        }
        out.push_str(&format!("done rows skipped: {}\n", self.done_skipped));
        out.push_str(&format!("invalid rows: {}\n", self.invalid));
        if !self.dry_run {
            out.push_str(&format!("refused by the server: {}\n", self.failed));
        }
        for e in self.errors.iter().take(MAX_ERRORS_PRINTED) {
            match &e.queue {
                Some(q) => out.push_str(&format!("  row {} ({q}): {}\n", e.id, e.error)),
                None => out.push_str(&format!("  row {}: {}\n", e.id, e.error)),
            }
        }
        let more =
            (self.errors.len().saturating_sub(MAX_ERRORS_PRINTED)) as u64 + self.errors_not_listed;
        if more > 0 {
            out.push_str(&format!(
                "  … and {more} more (--json lists up to {MAX_ERRORS_KEPT})\n"
            ));
        }
        let pending_dead: u64 = self.queues.values().map(|q| q.pending_dead).sum();
        if pending_dead > 0 {
            out.push_str(&format!(
                "pending but out of attempts by the queue's policy: {pending_dead}, {} dead letters (fail_times ≥ its max_attempts, or next_retry_at past its max_age)\n",
                if self.dry_run { "they would be" } else { "now" }
            ));
        }
        if self.dry_run {
            out.push_str(
                "(a dry run cannot tell which rows an earlier run already imported: those would be counted as already imported, not published again)\n",
            );
        }
        out
    }
}

/// The progress of the import on stderr: a bar redrawn with `\r` on a terminal, else a
/// line every [`PROGRESS_EVERY_ROWS`] rows and one at the end.
struct Progress {
    label: String,
    total: u64,
    done: u64,
    tty: bool,
    last_line: u64,
}

impl Progress {
    fn new(label: String, total: u64) -> Self {
        Self {
            label,
            total,
            done: 0,
            tty: std::io::stderr().is_terminal(),
            last_line: 0,
        }
    }

    fn advance(&mut self, rows: u64) {
        self.done += rows;
        if self.tty {
            eprint!("\r{}", progress_line(&self.label, self.done, self.total));
        } else if self.done - self.last_line >= PROGRESS_EVERY_ROWS {
            self.last_line = self.done;
            eprintln!("{}", progress_line(&self.label, self.done, self.total));
        }
    }

    fn finish(&mut self) {
        if self.tty {
            eprintln!();
        } else if self.last_line != self.done || self.done == 0 {
            eprintln!("{}", progress_line(&self.label, self.done, self.total));
        }
    }
}

/// `label [#########-----------]  45% 4500/10000 rows`.
pub fn progress_line(label: &str, done: u64, total: u64) -> String {
    const WIDTH: u64 = 30;
    let total = total.max(done);
    let (filled, pct) = match total {
        0 => (WIDTH, 100),
        t => (done * WIDTH / t, done * 100 / t),
    };
    format!(
        "{label} [{}{}] {pct:>3}% {done}/{total} rows",
        "#".repeat(filled as usize),
        "-".repeat((WIDTH - filled) as usize)
    )
}

/// The MySQL URL without its password, for messages.
fn display_url(opts: &mysql_async::Opts) -> String {
    format!(
        "mysql://{}{}:{}/{}",
        opts.user().map(|u| format!("{u}@")).unwrap_or_default(),
        opts.ip_or_hostname(),
        opts.tcp_port(),
        opts.db_name().unwrap_or_default()
    )
}

/// The source table, read in pages.
struct Source {
    conn: mysql_async::Conn,
    /// The first page's SELECT (no cursor yet).
    first: String,
    /// The next pages' (`WHERE id > ?`).
    next: String,
    /// The last id read.
    cursor: Option<SqlValue>,
    offset: UtcOffset,
}

impl Source {
    async fn open(args: &ImportArgs, columns: &Columns) -> anyhow::Result<(Self, String, u64)> {
        let opts = mysql_async::Opts::from_url(args.from.trim()).map_err(|e| {
            usage(format!(
                "--from: not a MySQL URL ({e}): give mysql://user[:password]@host[:port]/database"
            ))
        })?;
        let Some(db) = opts.db_name().map(str::to_owned) else {
            return Err(usage(
                "--from: the URL names no database: mysql://user@host:port/DATABASE",
            ));
        };
        let shown = display_url(&opts);
        let table = identifier("--table", &args.table)?;
        let mut conn =
            match tokio::time::timeout(CONNECT_TIMEOUT, mysql_async::Conn::new(opts)).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => anyhow::bail!("cannot connect to {shown} (--from): {e}"),
                Err(_) => anyhow::bail!(
                    "cannot connect to {shown} (--from): no answer within {} s",
                    CONNECT_TIMEOUT.as_secs()
                ),
            };
        // Read only, whatever the account may do; DATETIMEs at the given offset.
        conn.query_drop("SET SESSION TRANSACTION READ ONLY")
            .await
            .with_context(|| format!("cannot make the session on {shown} read-only"))?;
        conn.query_drop(format!("SET time_zone = '{}'", args.timezone_offset))
            .await
            .map_err(|e| {
                usage(format!(
                    "--timezone-offset: {} refused by {shown}: {e}",
                    args.timezone_offset
                ))
            })?;
        check_columns(&mut conn, &db, &args.table, columns).await?;
        let list = (0..6)
            .map(|i| columns.quoted(i))
            .collect::<Vec<_>>()
            .join(", ");
        let id = columns.id();
        let first = format!("SELECT {list} FROM {table} ORDER BY {id} LIMIT {PAGE_ROWS}");
        let next =
            format!("SELECT {list} FROM {table} WHERE {id} > ? ORDER BY {id} LIMIT {PAGE_ROWS}");
        let total: Option<u64> = conn
            .query_first(format!("SELECT COUNT(*) FROM {table}"))
            .await
            .with_context(|| format!("cannot count the rows of {table}"))?;
        Ok((
            Self {
                conn,
                first,
                next,
                cursor: None,
                offset: args.timezone_offset,
            },
            shown,
            total.unwrap_or(0),
        ))
    }

    /// The next page of rows, decoded; empty at the end.
    async fn page(&mut self) -> anyhow::Result<Vec<SourceRow>> {
        let rows: Vec<mysql_async::Row> = match self.cursor.take() {
            None => self.conn.exec(self.first.as_str(), ()).await,
            Some(after) => self.conn.exec(self.next.as_str(), vec![after]).await,
        }
        .context("cannot read the table")?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let values = row.unwrap();
            let [id, topic, payload, fail_times, next_retry_at, status]: [SqlValue; 6] = values
                .try_into()
                .map_err(|_| anyhow::anyhow!("internal: a row without its 6 columns"))?;
            out.push(decode(
                &id,
                topic,
                payload,
                &fail_times,
                &next_retry_at,
                status,
                self.offset,
            ));
            self.cursor = Some(id);
        }
        Ok(out)
    }

    async fn close(self) {
        let _ = self.conn.disconnect().await;
    }
}

/// Check that the table exists with every named column and that the id column is a unique
/// key of its own: a usage error naming the flag, before anything is read.
async fn check_columns(
    conn: &mut mysql_async::Conn,
    db: &str,
    table: &str,
    columns: &Columns,
) -> anyhow::Result<()> {
    let have: Vec<String> = conn
        .exec(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
            (db, table),
        )
        .await
        .context("cannot read the table's columns from information_schema")?;
    if have.is_empty() {
        return Err(usage(format!(
            "--table: no table `{table}` in database `{db}`"
        )));
    }
    for (flag, name) in &columns.named {
        if !have.iter().any(|c| c.eq_ignore_ascii_case(name)) {
            return Err(usage(format!(
                "{flag}: no column `{name}` in `{table}` (its columns: {})",
                have.join(", ")
            )));
        }
    }
    // (index name, column, non-unique) of every index of the table.
    let index: Vec<(String, String, i64)> = conn
        .exec(
            "SELECT INDEX_NAME, COLUMN_NAME, NON_UNIQUE FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            (db, table),
        )
        .await
        .context("cannot read the table's indexes from information_schema")?;
    let id = &columns.named[0].1;
    let unique_alone = index.iter().any(|(name, col, non_unique)| {
        *non_unique == 0
            && col.eq_ignore_ascii_case(id)
            && index.iter().filter(|(n, _, _)| n == name).count() == 1
    });
    if !unique_alone {
        return Err(usage(format!(
            "--id-column: `{id}` is not a unique key of `{table}` on its own (the import reads the \
             table in its order and keys each message by it)"
        )));
    }
    Ok(())
}

/// A value as text: a string column's UTF-8, an integer's digits.
fn text_of(v: SqlValue) -> Option<String> {
    match v {
        SqlValue::Bytes(b) => String::from_utf8(b).ok(),
        SqlValue::Int(i) => Some(i.to_string()),
        SqlValue::UInt(u) => Some(u.to_string()),
        _ => None,
    }
}

/// Decode one row's values (pure).
pub fn decode(
    id: &SqlValue,
    topic: SqlValue,
    payload: SqlValue,
    fail_times: &SqlValue,
    next_retry_at: &SqlValue,
    status: SqlValue,
    offset: UtcOffset,
) -> SourceRow {
    SourceRow {
        id: text_of(id.clone()).unwrap_or_else(|| format!("{id:?}")),
        topic: text_of(topic),
        payload: match payload {
            SqlValue::NULL => None,
            SqlValue::Bytes(b) => Some(b),
            other => Some(text_of(other).unwrap_or_default().into_bytes()),
        },
        fail_times: match fail_times {
            SqlValue::NULL => Ok(0),
            SqlValue::Int(i) => Ok(*i),
            SqlValue::UInt(u) => Ok(i64::try_from(*u).unwrap_or(i64::MAX)),
            SqlValue::Bytes(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .ok_or_else(|| format!("{:?} is not an integer", String::from_utf8_lossy(b))),
            other => Err(format!("{other:?} is not an integer")),
        },
        next_retry_at: time_of(next_retry_at, offset),
        status: text_of(status),
    }
}

/// A DATETIME / TIMESTAMP (local time at `offset`), or Unix seconds (milliseconds from
/// [`MILLIS_FROM`]), as a UTC timestamp.
pub fn time_of(v: &SqlValue, offset: UtcOffset) -> Result<Timestamp, String> {
    let unix = |n: i64| {
        if n < 0 {
            Err(format!("{n} is before 1970"))
        } else if n >= MILLIS_FROM {
            Ok(Timestamp::from_millis(n))
        } else {
            Ok(Timestamp::from_millis(n * 1000))
        }
    };
    match v {
        SqlValue::NULL => Err("NULL (a pending row needs its next try's time)".into()),
        SqlValue::Int(n) => unix(*n),
        SqlValue::UInt(n) => unix(i64::try_from(*n).unwrap_or(i64::MAX)),
        SqlValue::Date(y, mo, d, h, mi, s, us) => {
            if *y == 0 || *mo == 0 || *d == 0 {
                return Err("a zero date".into());
            }
            local_time(
                &format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{us:06}"),
                offset,
            )
        }
        SqlValue::Bytes(b) => {
            let s = String::from_utf8_lossy(b);
            let s = s.trim();
            if !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()) {
                return s
                    .parse()
                    .map_err(|_| format!("{s:?} is too large"))
                    .and_then(unix);
            }
            if s.starts_with("0000-00-00") {
                return Err("a zero date".into());
            }
            local_time(&s.replacen(' ', "T", 1), offset)
                .map_err(|_| format!("{s:?} is neither a DATETIME nor Unix seconds"))
        }
        other => Err(format!("{other:?} is neither a DATETIME nor Unix seconds")),
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.f]` at `offset`, in UTC.
fn local_time(t: &str, offset: UtcOffset) -> Result<Timestamp, String> {
    let text = format!("{t}{offset}");
    Timestamp::parse(&text).map_err(|_| format!("{text:?} is not a time"))
}

/// One row waiting to be published.
struct Item {
    id: String,
    kind: Kind,
    message: Publish,
}

/// Publish `items` to `queue` in one batch and count what became of each. A batch the
/// server refuses for one item's sake (400, 409, 413: nothing of it was stored) is published
/// again item by item, so that only the bad rows fail; any other failure (unreachable,
/// 401/403, 5xx) ends the import — a run started again resumes by the idempotency keys.
async fn flush(
    api: &Client,
    queue: &str,
    items: Vec<Item>,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    if items.is_empty() {
        return Ok(());
    }
    let messages: Vec<Publish> = items.iter().map(|i| i.message.clone()).collect();
    match api.publish_batch_each(queue, &messages).await {
        Ok(out) => {
            for (item, p) in items.iter().zip(&out) {
                summary.count(queue, outcome_of(item.kind, p));
            }
            Ok(())
        }
        Err(redrive_client::Error::Api { code, message, .. }) if code == "batch_too_large" => {
            Err(usage(format!(
                "--batch {}: the server refused the batch ({message}); give a smaller --batch",
                items.len()
            )))
        }
        Err(e) if is_row_error(&e) => {
            for item in items {
                match api.publish(queue, &item.message).await {
                    Ok(p) => summary.count(queue, outcome_of(item.kind, &p)),
                    Err(e) if is_row_error(&e) => summary.refused(&item.id, queue, e.to_string()),
                    Err(e) => return Err(cli_error(e)),
                }
            }
            Ok(())
        }
        Err(e) => Err(cli_error(e)),
    }
}

/// Whether the server refused a publish for what it carried (that row's fault).
fn is_row_error(e: &redrive_client::Error) -> bool {
    matches!(
        e,
        redrive_client::Error::Api {
            status: 400 | 409 | 413,
            ..
        }
    )
}

/// The policies of `queues`, as the server applies them (a queue never used answers its
/// default), for a dry run.
async fn policies(
    api: &Client,
    queues: impl Iterator<Item = &String>,
) -> anyhow::Result<BTreeMap<String, RetryPolicy>> {
    let mut out = BTreeMap::new();
    for q in queues {
        let view = api.queue(q).await.map_err(cli_error)?;
        out.insert(q.clone(), view.policy);
    }
    Ok(out)
}

/// Run `redrive import`.
pub async fn run(api: &Client, args: &ImportArgs) -> anyhow::Result<()> {
    let columns = Columns::of(args)?;
    identifier("--table", &args.table)?;
    if let Some(q) = &args.queue {
        validate_queue_name(q).map_err(|_| {
            usage(format!(
                "--queue: {q:?} is not a queue name ([A-Za-z0-9._:-]{{1,128}})"
            ))
        })?;
    }
    let values = [
        ("--pending-value", &args.pending_value),
        ("--dead-value", &args.dead_value),
        ("--done-value", &args.done_value),
    ];
    for (i, (flag, v)) in values.iter().enumerate() {
        if v.is_empty() {
            return Err(usage(format!("{flag}: empty")));
        }
        if let Some((other, _)) = values[..i].iter().find(|(_, w)| w == v) {
            return Err(usage(format!("{flag}: {v:?} is also {other}")));
        }
    }
    let mapping = Mapping {
        table: args.table.clone(),
        queue: args.queue.clone(),
        pending: args.pending_value.clone(),
        dead: args.dead_value.clone(),
        done: args.done_value.clone(),
    };
    // The server first: a dry run asks it for the policies, a run publishes; an unreachable
    // one is said before the table is read.
    api.healthz().await.map_err(cli_error)?;
    let (mut source, shown, total) = Source::open(args, &columns).await?;
    let mut summary = Summary {
        dry_run: args.dry_run,
        table: args.table.clone(),
        ..Summary::default()
    };
    let verb = if args.dry_run { "reading" } else { "importing" };
    let mut progress = Progress::new(format!("{verb} {}", args.table), total);
    let result = if args.dry_run {
        dry_run(api, &mut source, &mapping, &mut summary, &mut progress).await
    } else {
        import(
            api,
            &mut source,
            &mapping,
            args.batch as usize,
            &mut summary,
            &mut progress,
        )
        .await
    };
    progress.finish();
    source.close().await;
    result?;
    if args.json {
        print_json(&summary);
    } else {
        emit(&summary.render(&shown))?;
    }
    match summary.not_imported() {
        0 => Ok(()),
        n => anyhow::bail!(
            "{n} row{} {} imported ({} invalid, {} refused by the server; listed {})",
            if n == 1 { "" } else { "s" },
            match (args.dry_run, n) {
                (true, _) => "would not be",
                (false, 1) => "was not",
                (false, _) => "were not",
            },
            summary.invalid,
            summary.failed,
            if args.json { "in errors" } else { "above" }
        ),
    }
}

async fn import(
    api: &Client,
    source: &mut Source,
    mapping: &Mapping,
    batch: usize,
    summary: &mut Summary,
    progress: &mut Progress,
) -> anyhow::Result<()> {
    loop {
        let rows = source.page().await?;
        if rows.is_empty() {
            return Ok(());
        }
        let n = rows.len() as u64;
        let mut buffers: BTreeMap<String, Vec<Item>> = BTreeMap::new();
        for row in rows {
            summary.rows += 1;
            match plan(&row, mapping) {
                Plan::Done => summary.done_skipped += 1,
                Plan::Invalid(why) => summary.invalid(&row.id, why),
                Plan::Publish {
                    queue,
                    kind,
                    message,
                    ..
                } => {
                    let buffer = buffers.entry(queue.clone()).or_default();
                    buffer.push(Item {
                        id: row.id,
                        kind,
                        message: *message,
                    });
                    if buffer.len() >= batch {
                        let full = std::mem::take(buffer);
                        flush(api, &queue, full, summary).await?;
                    }
                }
            }
        }
        // Every page ends published: at most a page of rows is ever held.
        for (queue, items) in buffers {
            flush(api, &queue, items, summary).await?;
        }
        progress.advance(n);
    }
}

async fn dry_run(
    api: &Client,
    source: &mut Source,
    mapping: &Mapping,
    summary: &mut Summary,
    progress: &mut Progress,
) -> anyhow::Result<()> {
    // (queue, kind, attempts, due) of every row to publish: small, the payloads are not kept.
    let mut planned: Vec<(String, Kind, u32, Option<Timestamp>)> = Vec::new();
    loop {
        let rows = source.page().await?;
        if rows.is_empty() {
            break;
        }
        progress.advance(rows.len() as u64);
        for row in rows {
            summary.rows += 1;
            match plan(&row, mapping) {
                Plan::Done => summary.done_skipped += 1,
                Plan::Invalid(why) => summary.invalid(&row.id, why),
                Plan::Publish {
                    queue,
                    kind,
                    attempts,
                    due,
                    ..
                } => planned.push((queue, kind, attempts, due)),
            }
        }
    }
    let queues: std::collections::BTreeSet<String> =
        planned.iter().map(|(q, ..)| q.clone()).collect();
    let policies = policies(api, queues.iter()).await?;
    let now = Timestamp::now();
    for (queue, kind, attempts, due) in &planned {
        let policy = &policies[queue];
        summary.count(queue, predict(*kind, *attempts, *due, policy, now));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mapping() -> Mapping {
        Mapping {
            table: "msg_retry".into(),
            queue: None,
            pending: "pending".into(),
            dead: "dead".into(),
            done: "done".into(),
        }
    }

    fn row(id: u64, topic: &str, fail_times: i64, status: &str) -> SourceRow {
        SourceRow {
            id: id.to_string(),
            topic: Some(topic.into()),
            payload: Some(br#"{"order": 42, "items": [1, "x"]}"#.to_vec()),
            fail_times: Ok(fail_times),
            next_retry_at: Ok(Timestamp::parse("2026-01-31T12:00:00Z").unwrap()),
            status: Some(status.into()),
        }
    }

    fn body(p: &Plan) -> serde_json::Value {
        match p {
            Plan::Publish { message, .. } => serde_json::to_value(message.as_ref()).unwrap(),
            other => panic!("not a publish: {other:?}"),
        }
    }

    #[test]
    fn a_pending_row_is_due_at_next_retry_at_with_its_fail_times() {
        let p = plan(&row(7, "order.paid", 3, "pending"), &mapping());
        let Plan::Publish {
            queue,
            kind,
            attempts,
            ..
        } = &p
        else {
            panic!("{p:?}")
        };
        assert_eq!(
            (queue.as_str(), *kind, *attempts),
            ("order.paid", Kind::Pending, 3)
        );
        assert_eq!(
            body(&p),
            json!({
                "payload": {"order": 42, "items": [1, "x"]},
                "idempotency_key": "import:msg_retry:7",
                "deliver_at": "2026-01-31T12:00:00.000Z",
                "failed": {"class": "transient", "attempts": 3,
                           "message": "imported from msg_retry row 7 (fail_times 3)"}
            })
        );
        // Never failed: a plain delayed publish.
        let p = plan(&row(8, "order.paid", 0, "pending"), &mapping());
        assert_eq!(
            body(&p),
            json!({
                "payload": {"order": 42, "items": [1, "x"]},
                "idempotency_key": "import:msg_retry:8",
                "deliver_at": "2026-01-31T12:00:00.000Z"
            })
        );
    }

    #[test]
    fn a_dead_row_is_a_permanent_failure_and_a_done_row_is_skipped() {
        let p = plan(&row(9, "sms", 6, "dead"), &mapping());
        assert_eq!(
            body(&p),
            json!({
                "payload": {"order": 42, "items": [1, "x"]},
                "idempotency_key": "import:msg_retry:9",
                "failed": {"class": "permanent", "attempts": 6,
                           "message": "imported from msg_retry row 9: dead after 6 tries"}
            })
        );
        // Dead without a try counted is still one attempt (the API's minimum).
        assert_eq!(
            body(&plan(&row(10, "sms", 0, "dead"), &mapping()))["failed"]["attempts"],
            1
        );
        assert_eq!(plan(&row(11, "sms", 2, "done"), &mapping()), Plan::Done);
    }

    #[test]
    fn rows_that_cannot_be_imported_say_why() {
        let m = mapping();
        let why = |r: SourceRow| match plan(&r, &m) {
            Plan::Invalid(w) => w,
            other => panic!("{other:?}"),
        };
        assert!(
            why(row(1, "bad topic", 1, "pending")).contains("\"bad topic\" is not a queue name")
        );
        assert!(why(row(1, "", 1, "pending")).contains("not a queue name"));
        assert!(why(row(1, "t", 1, "retrying")).contains("status \"retrying\""));
        assert!(why(row(1, "t", -1, "pending")).contains("fail_times -1"));
        assert!(why(row(1, "t", 1_000_001, "pending")).contains("fail_times 1000001"));
        let mut r = row(1, "t", 1, "pending");
        r.payload = Some(b"not json".to_vec());
        assert!(why(r).contains("payload is not JSON"));
        let mut r = row(1, "t", 1, "pending");
        r.next_retry_at = Err("a zero date".into());
        assert_eq!(why(r), "next_retry_at: a zero date");
        let mut r = row(1, "t", 1, "pending");
        r.status = None;
        assert!(why(r).contains("status is NULL"));
        // A dead row needs no time; --queue makes any topic fine.
        let mut r = row(1, "bad topic", 1, "dead");
        r.next_retry_at = Err("NULL".into());
        let one_queue = Mapping {
            queue: Some("legacy".into()),
            ..mapping()
        };
        assert!(
            matches!(plan(&r, &one_queue), Plan::Publish { ref queue, .. } if queue == "legacy")
        );
        // A NULL payload is JSON null.
        let mut r = row(1, "t", 0, "pending");
        r.payload = None;
        assert_eq!(body(&plan(&r, &m))["payload"], json!(null));
    }

    #[test]
    fn identifiers_are_plain_and_quoted() {
        assert_eq!(identifier("--table", "msg_retry").unwrap(), "`msg_retry`");
        assert_eq!(identifier("--id-column", "ID_2").unwrap(), "`ID_2`");
        for bad in [
            "",
            "a b",
            "a`b",
            "x;DROP TABLE t",
            "t.c",
            "名字",
            &"a".repeat(65),
        ] {
            let e = identifier("--topic-column", bad).unwrap_err();
            assert!(e.to_string().starts_with("--topic-column: "), "{bad}: {e}");
            assert_eq!(
                e.downcast_ref::<super::super::CliError>()
                    .map(|c| c.exit_code()),
                Some(2)
            );
        }
    }

    #[test]
    fn offsets_parse_and_print() {
        for (text, minutes, shown) in [
            ("+08:00", 480, "+08:00"),
            ("-05:30", -330, "-05:30"),
            ("+0545", 345, "+05:45"),
            ("Z", 0, "+00:00"),
            ("utc", 0, "+00:00"),
            ("+14:00", 840, "+14:00"),
            ("-12:00", -720, "-12:00"),
        ] {
            let o = parse_offset(text).unwrap();
            assert_eq!(o.minutes, minutes, "{text}");
            assert_eq!(o.to_string(), shown);
        }
        for bad in [
            "8",
            "08:00",
            "+8:00",
            "+08:60",
            "+15:00",
            "-13:00",
            "+08:00:00",
            "CST",
            "",
        ] {
            assert!(parse_offset(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn times_are_read_at_the_offset() {
        let shanghai = parse_offset("+08:00").unwrap();
        let utc = parse_offset("Z").unwrap();
        let dt = SqlValue::Date(2026, 1, 31, 20, 0, 0, 500_000);
        assert_eq!(
            time_of(&dt, shanghai).unwrap(),
            Timestamp::parse("2026-01-31T12:00:00.500Z").unwrap()
        );
        assert_eq!(
            time_of(&dt, utc).unwrap(),
            Timestamp::parse("2026-01-31T20:00:00.500Z").unwrap()
        );
        let text = SqlValue::Bytes(b"2026-01-31 20:00:00".to_vec());
        assert_eq!(
            time_of(&text, shanghai).unwrap(),
            Timestamp::parse("2026-01-31T12:00:00Z").unwrap()
        );
        // Unix seconds (the seed's INT column), or milliseconds; the offset does not apply.
        let at = Timestamp::parse("2026-01-31T12:00:00Z").unwrap();
        let secs = at.as_millis() / 1000;
        assert_eq!(time_of(&SqlValue::UInt(secs as u64), shanghai).unwrap(), at);
        assert_eq!(
            time_of(&SqlValue::Int(at.as_millis()), shanghai).unwrap(),
            at
        );
        assert_eq!(
            time_of(&SqlValue::Bytes(secs.to_string().into_bytes()), utc).unwrap(),
            at
        );
        for bad in [
            SqlValue::NULL,
            SqlValue::Date(0, 0, 0, 0, 0, 0, 0),
            SqlValue::Bytes(b"0000-00-00 00:00:00".to_vec()),
            SqlValue::Bytes(b"tomorrow".to_vec()),
            SqlValue::Int(-1),
            SqlValue::Double(1.5),
        ] {
            assert!(time_of(&bad, utc).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_row_decodes_from_its_values() {
        let r = decode(
            &SqlValue::UInt(17),
            SqlValue::Bytes(b"order.paid".to_vec()),
            SqlValue::Bytes(br#"{"a":1}"#.to_vec()),
            &SqlValue::Int(2),
            &SqlValue::Date(2026, 1, 31, 12, 0, 0, 0),
            SqlValue::Bytes(b"pending".to_vec()),
            parse_offset("Z").unwrap(),
        );
        assert_eq!(
            r,
            SourceRow {
                id: "17".into(),
                topic: Some("order.paid".into()),
                payload: Some(br#"{"a":1}"#.to_vec()),
                fail_times: Ok(2),
                next_retry_at: Ok(Timestamp::parse("2026-01-31T12:00:00Z").unwrap()),
                status: Some("pending".into()),
            }
        );
        // An integer status (0 / 1 / 2 tables) is its digits; a NULL count is 0.
        let r = decode(
            &SqlValue::Bytes(b"a-17".to_vec()),
            SqlValue::NULL,
            SqlValue::NULL,
            &SqlValue::NULL,
            &SqlValue::NULL,
            SqlValue::Int(2),
            parse_offset("Z").unwrap(),
        );
        assert_eq!(r.id, "a-17");
        assert_eq!(r.status.as_deref(), Some("2"));
        assert_eq!(r.fail_times, Ok(0));
        assert_eq!(r.topic, None);
        assert!(r.next_retry_at.is_err());
    }

    #[test]
    fn a_dry_run_predicts_what_the_policy_makes_of_each_row() {
        let now = Timestamp::parse("2026-01-31T12:00:00Z").unwrap();
        let policy = RetryPolicy {
            max_attempts: 5,
            max_age_ms: 7 * 86_400_000,
            ..RetryPolicy::default()
        };
        let later = Some(now.plus_ms(60_000));
        let past = Some(Timestamp::from_millis(now.as_millis() - 60_000));
        let p = |kind, attempts, due| predict(kind, attempts, due, &policy, now);
        assert_eq!(p(Kind::Pending, 2, later), Outcome::Scheduled);
        assert_eq!(p(Kind::Pending, 2, past), Outcome::Ready);
        assert_eq!(p(Kind::Pending, 0, later), Outcome::Scheduled);
        assert_eq!(p(Kind::Pending, 0, past), Outcome::Ready);
        assert_eq!(
            p(Kind::Pending, 4, later),
            Outcome::Scheduled,
            "one try left"
        );
        assert_eq!(
            p(Kind::Pending, 5, later),
            Outcome::PendingDead,
            "out of attempts"
        );
        assert_eq!(p(Kind::Pending, 9, past), Outcome::PendingDead);
        assert_eq!(
            p(Kind::Pending, 1, Some(now.plus_ms(8 * 86_400_000))),
            Outcome::PendingDead,
            "past max_age"
        );
        // Never failed: a delayed publish, which no policy ends.
        assert_eq!(
            p(Kind::Pending, 0, Some(now.plus_ms(8 * 86_400_000))),
            Outcome::Scheduled
        );
        assert_eq!(p(Kind::Dead, 0, None), Outcome::Dead);
    }

    #[test]
    fn the_summary_counts_per_queue_and_lists_errors() {
        let mut s = Summary {
            table: "msg_retry".into(),
            rows: 6,
            done_skipped: 1,
            ..Summary::default()
        };
        s.count("orders", Outcome::Scheduled);
        s.count("orders", Outcome::PendingDead);
        s.count("sms", Outcome::Dead);
        s.count("sms", Outcome::AlreadyImported);
        s.invalid("5", "topic \"bad topic\" is not a queue name".into());
        assert_eq!(s.published, 3);
        assert_eq!(s.already_imported, 1);
        assert_eq!(s.not_imported(), 1);
        let text = s.render("mysql://root@127.0.0.1:3306/db");
        assert_eq!(
            text,
            "imported `msg_retry` from mysql://root@127.0.0.1:3306/db: 6 rows read, 3 messages published, 1 already imported\n\
             queue   pending→scheduled  pending→ready  pending→dead  dead  already imported  failed\n\
             orders                  1              0             1     0                 0       0\n\
             sms                     0              0             0     1                 1       0\n\
             done rows skipped: 1\n\
             invalid rows: 1\n\
             refused by the server: 0\n\
             \x20 row 5: topic \"bad topic\" is not a queue name\n\
             pending but out of attempts by the queue's policy: 1, now dead letters (fail_times ≥ its max_attempts, or next_retry_at past its max_age)\n"
        );
    }

    #[test]
    fn progress_is_a_bar_with_counts() {
        assert_eq!(
            progress_line("importing msg_retry", 450, 1000),
            "importing msg_retry [#############-----------------]  45% 450/1000 rows"
        );
        assert_eq!(
            progress_line("t", 0, 0),
            "t [##############################] 100% 0/0 rows"
        );
        // Rows added while the import runs: never past 100 %.
        assert!(progress_line("t", 12, 10).contains("100% 12/12"));
    }
}
