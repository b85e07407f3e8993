//! `redrive-bench`: redrive's load generator, and the peers it is compared with. It drives
//! a running server over HTTP only (through [`redrive_client`]) and prints figures; it is a
//! binary of its own so that nothing of it (the PostgreSQL peer's tokio-postgres, the
//! ladder's lapin consumers, the mock endpoints) is linked into the `redrive` server.
//!
//! Exit codes (`redrive_client::cli`, as the `redrive` CLI): 0 success; 1 the server
//! answered an error, or the run did not reach its target (`bench incomplete: …`); 2 bad
//! command-line input; 3 the server could not be reached.
//!
//! Shape: N tasks on one multi-thread runtime share one `reqwest::Client` whose
//! keep-alive pool holds N connections, so each task mostly reuses its own
//! connection. Each task records into its own [`stats::Samples`]; the runner
//! merges them at the end. Every workload is bounded (a duration, a message
//! count, and `--timeout` as a last resort) and only talks to `--server`.
//!
//! After every workload the runner reads `GET /metrics` (before and after) and
//! prints the group-commit figures: changes per commit and commits (fsyncs) per
//! second (see [`prom`]).
//!
//! One file per family of workloads: [`publish`] (publish, publish-batch,
//! scheduled), [`cycle`] (cycle, retry-cycle), [`delayed`]. With `--pg URL`,
//! [`pg`] runs cycle / retry-cycle against the peer users compare redrive with:
//! a PostgreSQL table consumed with `FOR UPDATE SKIP LOCKED`, same shapes, same report;
//! with `--mysql URL`, [`mysql`] runs them against the MySQL / MariaDB one.
//!
//! Requests go through [`redrive_client::Client`], the typed client the CLI and the
//! tests use, and failures are its typed errors. On the hot paths (publish, lease,
//! batch ack / nack) the bench sends bodies it serialized itself with
//! [`Client::post_raw`] and decodes only the fields it reads: a full typed decode of
//! every leased message (ids, timestamps, headers) would spend on this side the CPU the
//! server on the same machine needs.

mod consumer;
mod cycle;
mod delayed;
mod delayed_ttl;
mod ladder;
mod mysql;
mod pg;
mod prom;
mod publish;
mod push;
mod report;
mod stats;
mod storm;

/// mimalloc, as in the `redrive` binary: the figures of docs/PERFORMANCE.md were measured
/// while the bench was one of its subcommands, and the load generator shares the machine's
/// cores with the server, so its allocator is part of what it costs them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Args, Parser, ValueEnum};
use redrive_client::cli::{cli_error, finish, parse_server_url, print_json, usage};
use redrive_client::Client;
use redrive_core::{format_duration_ms, DurationMs};
use report::{ErrorTally, Report};
use reqwest::Url;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Longest time one bench request may take (a long poll waits at most 5 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting may take before the server counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after a failed request, so a dead server is not spun on.
const ERROR_PAUSE: Duration = Duration::from_millis(50);
/// How often progress is printed on stderr (human output only).
const PROGRESS_EVERY: Duration = Duration::from_secs(2);
/// Lease length the consumers ask for, ms: far longer than a batch takes to ack. The leased
/// messages' expiry less this is the server's lease time.
const BENCH_LEASE_MS: i64 = 30_000;

/// Command line of `redrive-bench`.
#[derive(Debug, Parser)]
#[command(
    name = "redrive-bench",
    version,
    about = "Drive a running redrive server (or its PostgreSQL peer) with load and print figures",
    after_long_help = BENCH_HELP
)]
pub struct Cli {
    /// Base URL of the redrive server (http only).
    #[arg(
        long,
        env = "REDRIVE_SERVER",
        default_value = "http://127.0.0.1:7070",
        value_name = "URL",
        value_parser = parse_server_url
    )]
    pub server: Url,

    /// API token, sent as `Authorization: Bearer TOKEN`.
    #[arg(
        long,
        env = "REDRIVE_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,

    /// The run.
    #[command(flatten)]
    pub bench: BenchArgs,
}

/// What to run: the workload and its shape.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(long, value_enum, default_value_t = Workload::Publish)]
    pub workload: Workload,
    /// cycle and retry-cycle: another node of the server's cluster (repeat for each). The
    /// publishing and consuming tasks are spread over --server and these, one node per
    /// task in turn; a consumer acks on the node it leased from.
    #[arg(long = "also-server", value_name = "URL", value_parser = parse_server_url)]
    pub also_server: Vec<Url>,
    /// Concurrent connections (one task each); in cycle, retry-cycle and delayed they include
    /// the --publishers.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub connections: u32,
    /// Run length of publish and publish-batch.
    #[arg(long, default_value = "10s", value_name = "DURATION")]
    pub duration: DurationMs,
    /// Messages to move. publish/publish-batch: stop after this many (else after --duration);
    /// cycle: 100000, retry-cycle: 50000, delayed: 20000, scheduled: 1000000 by default.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub messages: Option<u64>,
    /// Messages per batch publish, lease and batch ack/nack.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch: u32,
    /// cycle and retry-cycle: messages per publish request (default: --batch). Lets a
    /// one-message-per-lease shape (`--batch 1`) be fed by batch publishers, so that it
    /// measures the consumers, not single publishes.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub publish_batch: Option<u32>,
    /// Queue to use (default: a new one per run, bench-PID-MILLIS; retry-cycle: bench-retry).
    #[arg(long)]
    pub queue: Option<String>,
    /// Approximate size of each payload, bytes.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub payload_bytes: u32,
    /// Publishing connections in cycle, retry-cycle and delayed (default: a quarter of --connections).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub publishers: Option<u32>,
    /// delayed: short delays are uniform in [0, spread).
    #[arg(long, default_value = "10s", value_name = "DURATION")]
    pub spread: DurationMs,
    /// delayed: every due time is run start + lead + delay, so all messages are published
    /// (in batches) before the first one is due, and lateness measures the scheduler, not a
    /// server saturated by the publishing itself. `0s` publishes while deliveries run.
    #[arg(long, default_value = "5s", value_name = "DURATION")]
    pub lead: DurationMs,
    /// delayed: fraction of long delays, uniform in [2 × spread, 3 × spread).
    #[arg(long, default_value_t = 0.1, value_parser = parse_fraction)]
    pub long_fraction: f64,
    /// scheduled: how far in the future the messages are due.
    #[arg(long, default_value = "1d", value_name = "DURATION")]
    pub ahead: DurationMs,
    /// Last-resort bound on count-driven workloads (delayed adds 3 × spread); the run then reports what it saw.
    #[arg(long, default_value = "5m", value_name = "DURATION")]
    pub timeout: DurationMs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// cycle / retry-cycle against PostgreSQL instead of the server: a `FOR UPDATE SKIP LOCKED`
    /// job table, e.g. postgres://root@127.0.0.1:5432/test (see below).
    #[arg(long, value_name = "URL", value_parser = pg::parse_url)]
    pub pg: Option<String>,
    /// cycle / retry-cycle against MySQL or MariaDB instead of the server: a `SELECT … FOR
    /// UPDATE SKIP LOCKED` job table, e.g. mysql://root@127.0.0.1:3306/test (see below).
    #[arg(long, value_name = "URL", value_parser = mysql::parse_url, conflicts_with = "pg")]
    pub mysql: Option<String>,
    /// delayed against RabbitMQ (--amqp) instead of the server: the same due times through
    /// TTL queues dead-lettering into a work queue (see below).
    #[arg(long, conflicts_with_all = ["pg", "mysql"])]
    pub ttl_queue: bool,
    /// storm: messages per second into each of the two queues.
    #[arg(long, default_value_t = 200.0, value_parser = parse_positive)]
    pub storm_rate: f64,
    /// storm: capacity of each mock endpoint, requests/s (beyond it: 503 at once).
    #[arg(long, default_value_t = 250.0, value_parser = parse_positive)]
    pub storm_capacity: f64,
    /// storm: time before the outage.
    #[arg(long, default_value = "30s", value_name = "DURATION")]
    pub storm_before: DurationMs,
    /// storm: length of the outage.
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    pub storm_outage: DurationMs,
    /// storm: the outage's first part, with connections refused (then 503).
    #[arg(long, default_value = "20s", value_name = "DURATION")]
    pub storm_refused: DurationMs,
    /// storm: how long messages arrive (from the start).
    #[arg(long, default_value = "300s", value_name = "DURATION")]
    pub storm_arrivals: DurationMs,
    /// ladder: the RabbitMQ the server's bridges use; delayed --ttl-queue: the RabbitMQ measured.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub amqp: String,
    /// push: where the bench's endpoint listens (the server pushes queue bench-push there).
    #[arg(long, default_value = "127.0.0.1:18183")]
    pub push_endpoint: std::net::SocketAddr,
    /// storm: where the endpoint of queue storm-on listens.
    #[arg(long, default_value = "127.0.0.1:18181")]
    pub storm_on: std::net::SocketAddr,
    /// storm: where the endpoint of queue storm-off listens.
    #[arg(long, default_value = "127.0.0.1:18182")]
    pub storm_off: std::net::SocketAddr,
    /// --pg / --mysql: the job table (created if absent, emptied at the start of the run).
    #[arg(long, value_name = "NAME", default_value = pg::DEFAULT_TABLE, value_parser = pg::parse_table)]
    pub pg_table: String,
}

const BENCH_HELP: &str = "\
Workloads (each stops by itself; run against a server started separately):

  publish        one message per POST; msg/s and request latency
  publish-batch  POST {\"messages\": [--batch items]}; msg/s
  cycle          publishers batch-publish --messages while consumers lease (max --batch,
                 wait 1s) and batch-ack; acked msg/s and publish→ack latency
  retry-cycle    publish; first delivery is nacked (transient), the retry is acked;
                 full retry cycles/s. Needs a zero-delay policy on its queue
                 (default bench-retry), e.g. start the server with:
                     [queues.\"bench-retry\".retry]
                     backoff = \"fixed\"
                     initial_delay = \"0s\"
                     jitter = \"none\"
                 The bench checks the policy first, and that every retry comes back.
                 cycle, retry-cycle with --batch 1: one message per lease and one
                 POST /v1/messages/{id}/ack or /nack per message (a one-at-a-time
                 worker), not the batch endpoints.
  delayed        publish with deliver_at = start + --lead + delay, delays spread over
                 --spread (plus --long-fraction of
                 long ones, to expose head-of-line blocking); consumers long-poll (wait 5s)
                 and ack; lateness (receive − due) p50/p90/p99/max, short vs long.
                 With --ttl-queue the same due times go through RabbitMQ at --amqp
                 instead: short and long delays in two TTL queues, each published in due
                 order with a per-message expiration (RabbitMQ expires only at a queue's
                 head, so this is its best case), dead-lettered into one work queue.
  scheduled      publish --messages (default 1,000,000) due --ahead (default 1d) in
                 batches; publish rate. RSS, disk and restart time are for a script
                 to measure afterwards.
  push           push delivery to a healthy endpoint the bench hosts (--push-endpoint,
                 every request answered 200): publishes --messages (50,000) in batches
                 into queue bench-push, which the server must push there (the config of
                 scripts/bench_server.sh does); deliveries/s and publish → 2xx latency
  ladder         the RabbitMQ bridge beside seed 001's TTL + dead-letter ladder on the
                 same broker (--amqp): --messages (20,000) fail once and are retried
                 after 1 s on each side (retries/s, lateness), then a 10 s retry ahead
                 of a 100 ms one (head of line). The server needs the bridges of
                 scripts/bench_bridge.sh.
  storm          push delivery through an outage: two mock endpoints in this process
                 (--storm-on, --storm-off) of --storm-capacity requests/s get queues
                 storm-on (protection on) and storm-off (breaker = false,
                 retry_budget = 0), --storm-rate messages/s each for --storm-arrivals;
                 after --storm-before both go down for --storm-outage (connections
                 refused for --storm-refused, then 503), then recover. Reports calls per
                 message, outage calls, peak after recovery, drain time against its
                 bound, dead letters. --timeout bounds the drain. The server needs both
                 queues configured: scripts/bench_storm.sh.

Every workload ends with the server's group-commit figures from /metrics:
changes per commit and commits (fsyncs) per second.

The PostgreSQL peer (--pg URL; cycle and retry-cycle only; --server is not used):
the same publishers / consumers split, --messages, --batch, --payload-bytes and report,
against a River / pgmq / Oban-style job table, one connection per task, no TLS,
`SET synchronous_commit = on` on every connection (the run prints fsync and
synchronous_commit as the server reports them). The table (--pg-table) is created
if absent and TRUNCATEd at the start of every run, so do not point two runs at one
table at once.
  publish   one INSERT … SELECT FROM unnest($texts) per batch of --batch
  claim     UPDATE … SET state = 1, attempts = attempts + 1 WHERE id IN (SELECT id …
            WHERE queue = $1 AND state = 0 AND run_at <= now() ORDER BY run_at, id
            FOR UPDATE SKIP LOCKED LIMIT --batch) RETURNING id, attempts, payload
  fail      UPDATE … SET state = 0, run_at = now() … WHERE id = ANY($ids)  (one per claim)
  complete  DELETE … WHERE id = ANY($ids)  (one per claim; fail and complete are
            pipelined on the task's connection, as redrive's nack and ack requests are
            sent together)
An empty claim sleeps 5 ms before the next (redrive's consumers long-poll instead).
The peer has no lease expiry, rescuer or dead-letter state: a minimal queue.

The MySQL / MariaDB peer (--mysql URL; the same, on the same --pg-table name): every
connection at READ COMMITTED; one multi-row INSERT per publish batch; a claim is one
short transaction, SELECT id … ORDER BY run_at, id LIMIT --batch FOR UPDATE SKIP LOCKED
then UPDATE … WHERE id IN (…) by primary key (no UPDATE … RETURNING on MySQL); fail and
complete are one UPDATE and one DELETE by primary key, autocommitted. A deadlock (1213) or
lock wait timeout (1205) is run again after 1–8 ms and counted (deadlock_retries,
deadlock_retries_per_10k); innodb_flush_log_at_trx_commit and sync_binlog are printed.

Examples:
  redrive serve --data-dir /tmp/rd &
  redrive-bench --workload publish --connections 64 --duration 10s
  redrive-bench --workload cycle --messages 200000 --batch 100 --json
  redrive-bench --pg postgres://root@127.0.0.1:5432/test --workload retry-cycle \\
      --connections 20 --publishers 4 --batch 100 --messages 200000";

/// The workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// One message per request.
    Publish,
    /// --batch messages per request.
    PublishBatch,
    /// Publish, lease, ack.
    Cycle,
    /// Publish, lease, nack, lease again, ack.
    RetryCycle,
    /// Delayed delivery lateness.
    Delayed,
    /// Many messages due far in the future.
    Scheduled,
    /// Push delivery through an endpoint outage, protection on and off side by side.
    Storm,
    /// Push delivery to a healthy endpoint: deliveries/s and publish → 2xx latency.
    Push,
    /// The RabbitMQ bridge beside a TTL + dead-letter ladder (throughput, lateness, head of line).
    Ladder,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Publish => "publish",
            Workload::PublishBatch => "publish-batch",
            Workload::Cycle => "cycle",
            Workload::RetryCycle => "retry-cycle",
            Workload::Delayed => "delayed",
            Workload::Scheduled => "scheduled",
            Workload::Storm => "storm",
            Workload::Push => "push",
            Workload::Ladder => "ladder",
        }
    }

    /// The default message count of count-driven workloads.
    fn default_messages(self) -> Option<u64> {
        match self {
            Workload::Publish | Workload::PublishBatch => None,
            Workload::Cycle => Some(100_000),
            Workload::RetryCycle => Some(50_000),
            Workload::Delayed => Some(20_000),
            Workload::Scheduled => Some(1_000_000),
            Workload::Storm => None,
            Workload::Push => Some(50_000),
            Workload::Ladder => Some(20_000),
        }
    }
}

/// A number above 0.
fn parse_positive(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("expected a number above 0, got {s:?}")),
    }
}

/// `--long-fraction`: a number in [0, 1].
fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("expected a number between 0 and 1, got {s:?}")),
    }
}

/// Everything the tasks of a run share.
#[derive(Debug)]
pub struct Ctx {
    /// The server.
    pub api: Client,
    /// The queue of the run.
    pub queue: String,
    /// Tags this run's payloads (`"run"`), so leftovers of other runs are recognised.
    pub run_id: String,
    /// Payload padding, `--payload-bytes` long.
    pub pad: String,
    /// Errors by kind.
    pub errors: ErrorTally,
    /// Progress counters for the ticker.
    pub progress: Progress,
}

/// Counters the progress ticker prints.
#[derive(Debug, Default)]
pub struct Progress {
    /// Messages published (2xx).
    pub published: AtomicU64,
    /// Messages finished (acked, or for publish workloads, the same as published).
    pub finished: AtomicU64,
    /// Set when the run reached its target or gave up.
    pub done: AtomicBool,
    /// When the target was reached.
    pub reached_at: OnceLock<Instant>,
}

impl Progress {
    /// When the run reached its target, or now if it did not (yet).
    pub fn end(&self) -> Instant {
        self.reached_at.get().copied().unwrap_or_else(Instant::now)
    }

    /// Add `n` finished messages; when they reach `target`, mark the run done.
    pub fn finish(&self, n: u64, target: u64) {
        let total = self.finished.fetch_add(n, Ordering::Relaxed) + n;
        if total >= target {
            let _ = self.reached_at.set(Instant::now());
            self.done.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the run is over.
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Relaxed)
    }
}

impl Ctx {
    /// A URL under the server.
    pub fn url(&self, segments: &[&str]) -> Url {
        self.api.url(segments, &[])
    }
}

/// `url` sent to the node `task` is given: for task `i` of a run over `nodes` (the
/// --also-server list; empty: the server alone), the server for i = 0, `nodes[i - 1]`
/// for the next ones, and so on in turn.
pub fn on_node(url: &Url, nodes: &[Url], task: usize) -> Url {
    let i = task % (nodes.len() + 1);
    if i == 0 {
        return url.clone();
    }
    let node = &nodes[i - 1];
    let mut u = url.clone();
    // Both are http URLs with a host (parse_server_url): these cannot fail.
    let _ = u.set_host(node.host_str());
    let _ = u.set_port(node.port());
    u
}

impl Ctx {
    /// POST a JSON body; the answer's bytes on 2xx, `None` (error counted) otherwise.
    pub async fn post(&self, url: &Url, body: String) -> Option<bytes::Bytes> {
        use redrive_client::Error as E;
        let e = match self.api.post_raw(url, body).await {
            Ok(b) => return Some(b),
            Err(e) => e,
        };
        let kind = match &e {
            E::Api { status, code, .. } => format!("http {status} {code}"),
            E::Unreachable { .. } => "connect".to_owned(),
            E::Timeout { .. } => "timeout".to_owned(),
            E::Interrupted { .. } => "body".to_owned(),
            _ => "transport".to_owned(),
        };
        let pause = !matches!(e, E::Interrupted { .. });
        self.errors
            .record(kind, format!("{:#}", anyhow::Error::new(e)));
        if pause {
            tokio::time::sleep(ERROR_PAUSE).await;
        }
        None
    }

    /// A payload `{"run", "n", "t" (µs since the epoch at send), extra…, "pad"}`.
    pub fn payload(&self, n: u64, extra: &str) -> String {
        format!(
            r#"{{"run":"{}","n":{n},"t":{}{extra},"pad":"{}"}}"#,
            self.run_id,
            now_us(),
            self.pad
        )
    }
}

/// Wall-clock microseconds since the epoch.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Claim up to `want` of the `limit` slots counted by `counter`: answers the
/// message numbers granted (empty once the limit is reached). Without a limit,
/// all are granted.
pub fn claim(counter: &AtomicU64, want: u64, limit: Option<u64>) -> std::ops::Range<u64> {
    let start = counter.fetch_add(want, Ordering::Relaxed);
    match limit {
        None => start..start + want,
        Some(limit) if start >= limit => start..start,
        Some(limit) => start..start + want.min(limit - start),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    finish(run(&cli.server, cli.token.as_deref(), cli.bench))
}

/// Run the bench: preflight, workload, commit figures, report.
pub fn run(server: &Url, token: Option<&str>, args: BenchArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))?;
    runtime.block_on(run_async(server, token, args))
}

async fn run_async(server: &Url, token: Option<&str>, args: BenchArgs) -> anyhow::Result<()> {
    let connections = args.connections as usize;
    let mut api = Client::builder_for(server.clone())
        .map_err(cli_error)?
        .connect_timeout(CONNECT_TIMEOUT)
        .request_timeout(REQUEST_TIMEOUT)
        .pool_idle_per_host(connections)
        .user_agent(concat!("redrive-bench/", env!("CARGO_PKG_VERSION")));
    if let Some(t) = token {
        api = api.token(t);
    }
    let api = api.build().map_err(cli_error)?;
    let run_id = format!("{}-{}", std::process::id(), now_us() / 1000);
    let queue = match (&args.queue, args.workload) {
        (Some(q), _) => q.clone(),
        (None, Workload::RetryCycle) => "bench-retry".to_owned(),
        (None, _) => format!("bench-{run_id}"),
    };
    redrive_core::validate_queue_name(&queue).map_err(|e| usage(format!("--queue: {e}")))?;
    if (args.pg.is_some() || args.mysql.is_some())
        && !matches!(args.workload, Workload::Cycle | Workload::RetryCycle)
    {
        return Err(usage(format!(
            "--{} runs cycle and retry-cycle only, not {}",
            if args.pg.is_some() { "pg" } else { "mysql" },
            args.workload.name()
        )));
    }
    let ctx = Arc::new(Ctx {
        api,
        queue,
        run_id,
        pad: "x".repeat(args.payload_bytes.saturating_sub(48) as usize),
        errors: ErrorTally::default(),
        progress: Progress::default(),
    });

    if let Some(url) = args.pg.clone() {
        return pg::run(ctx, &args, &url).await;
    }
    if let Some(url) = args.mysql.clone() {
        return mysql::run(ctx, &args, &url).await;
    }
    if args.ttl_queue {
        if args.workload != Workload::Delayed {
            return Err(usage(format!(
                "--ttl-queue runs delayed only, not {}",
                args.workload.name()
            )));
        }
        let messages = args
            .messages
            .or(args.workload.default_messages())
            .unwrap_or(1);
        let mut report = Report::new();
        report.text("workload", "workload", args.workload.name());
        report.count("connections", "connections", connections as u64);
        delayed_ttl::run(ctx, &args, messages, &mut report).await?;
        return print_report(report, args.json);
    }

    // Preflight: is the server there at all (exit 3 if not)?
    if let Err(e) = ctx.api.healthz().await {
        // Only an unreachable server is fatal here.
        if e.is_unreachable() {
            return Err(cli_error(e));
        }
    }

    let messages = args.messages.or(args.workload.default_messages());
    if !args.json && !matches!(args.workload, Workload::Storm | Workload::Ladder) {
        let bound = match messages {
            Some(m) if args.workload.default_messages().is_some() => format!("{m} messages"),
            Some(m) => format!("{m} messages or {}", format_duration_ms(args.duration.ms())),
            None => format_duration_ms(args.duration.ms()),
        };
        eprintln!(
            "bench {}: queue {}, {} connections, batch {}, {bound}, server {}",
            args.workload.name(),
            ctx.queue,
            connections,
            args.batch,
            server
        );
    }

    let before = metrics_snapshot(&ctx).await;
    let ticker = (!args.json).then(|| tokio::spawn(progress_ticker(ctx.clone())));
    let mut report = Report::new();
    report.text("workload", "workload", args.workload.name());
    report.text("queue", "queue", ctx.queue.clone());
    report.count("connections", "connections", connections as u64);
    let started = Instant::now();
    let result = match args.workload {
        Workload::Publish | Workload::PublishBatch | Workload::Scheduled => {
            publish::run(ctx.clone(), &args, messages, &mut report).await
        }
        Workload::Cycle | Workload::RetryCycle => {
            cycle::run(ctx.clone(), &args, messages.unwrap_or(1), &mut report).await
        }
        Workload::Delayed => {
            delayed::run(ctx.clone(), &args, messages.unwrap_or(1), &mut report).await
        }
        Workload::Push => push::run(ctx.clone(), &args, messages.unwrap_or(1), &mut report).await,
        Workload::Ladder => {
            ctx.progress.done.store(true, Ordering::Relaxed);
            if let Some(t) = ticker {
                t.abort();
            }
            return ladder::run(ctx, &args.amqp, messages.unwrap_or(1)).await;
        }
        Workload::Storm => {
            ctx.progress.done.store(true, Ordering::Relaxed);
            if let Some(t) = ticker {
                t.abort();
            }
            let shape = storm::Shape {
                rate: args.storm_rate,
                capacity: args.storm_capacity,
                before: Duration::from_millis(args.storm_before.ms()),
                outage: Duration::from_millis(args.storm_outage.ms()),
                refused: Duration::from_millis(args.storm_refused.ms()),
                arrivals: Duration::from_millis(args.storm_arrivals.ms()),
                on: args.storm_on,
                off: args.storm_off,
                drain_timeout: Duration::from_millis(args.timeout.ms()),
                other_nodes: args
                    .also_server
                    .iter()
                    .map(|u| Client::new(u.as_str()))
                    .collect::<Result<_, _>>()
                    .map_err(|e| anyhow::anyhow!("--also-server: {e}"))?,
            };
            return storm::run(ctx, shape, args.json).await;
        }
    };
    ctx.progress.done.store(true, Ordering::Relaxed);
    if let Some(t) = ticker {
        t.abort();
    }
    result?;
    let after = metrics_snapshot(&ctx).await;
    report.secs(
        "wall_s",
        "wall time (incl. drain)",
        started.elapsed().as_secs_f64(),
    );
    report.commits(match (before, after) {
        (Some(b), Some(a)) => b.until(&a),
        _ => None,
    });
    report.errors(&ctx.errors);
    print_report(report, args.json)
}

/// Print the report (text or JSON); an error if the run did not reach its target.
fn print_report(mut report: Report, json: bool) -> anyhow::Result<()> {
    if json {
        print_json(&report.to_json());
    } else {
        print!("{}", report.render());
    }
    match report.incomplete.take() {
        Some(why) => Err(anyhow::anyhow!("bench incomplete: {why}")),
        None => Ok(()),
    }
}

/// Read the commit counters from `/metrics` (`None` if unavailable; the bench goes on).
async fn metrics_snapshot(ctx: &Ctx) -> Option<prom::Snapshot> {
    let text = ctx.api.metrics_text().await.ok()?;
    Some(prom::Snapshot::parse(&text, Instant::now()))
}

/// Print progress on stderr every [`PROGRESS_EVERY`] until the run is done.
async fn progress_ticker(ctx: Arc<Ctx>) {
    let start = Instant::now();
    let mut last = (0u64, start);
    loop {
        tokio::time::sleep(PROGRESS_EVERY).await;
        if ctx.progress.is_done() {
            return;
        }
        let published = ctx.progress.published.load(Ordering::Relaxed);
        let finished = ctx.progress.finished.load(Ordering::Relaxed);
        let now = Instant::now();
        let rate =
            (finished - last.0.min(finished)) as f64 / now.duration_since(last.1).as_secs_f64();
        last = (finished, now);
        eprintln!(
            "  {:>6.1}s  published {published}  finished {finished}  ({:.0}/s)  errors {}",
            start.elapsed().as_secs_f64(),
            rate,
            ctx.errors.total()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench_args(argv: &[&str]) -> Result<BenchArgs, clap::Error> {
        let mut full = vec!["redrive-bench"];
        full.extend_from_slice(argv);
        Ok(Cli::try_parse_from(full)?.bench)
    }

    #[test]
    fn defaults() {
        let a = bench_args(&[]).unwrap();
        assert_eq!(a.workload, Workload::Publish);
        assert_eq!(a.connections, 64);
        assert_eq!(a.duration.ms(), 10_000);
        assert_eq!(a.batch, 100);
        assert_eq!(a.messages, None);
        let a = bench_args(&["--workload", "retry-cycle", "--messages", "10", "--json"]).unwrap();
        assert_eq!(a.workload, Workload::RetryCycle);
        assert_eq!(a.messages, Some(10));
        assert!(a.json);
    }

    #[test]
    fn pg_flags() {
        let a = bench_args(&[]).unwrap();
        assert_eq!(a.pg, None);
        assert_eq!(a.pg_table, "redrive_bench_jobs");
        let a = bench_args(&[
            "--pg",
            "postgres://root@127.0.0.1:5432/test",
            "--pg-table",
            "jobs_2",
            "--workload",
            "retry-cycle",
        ])
        .unwrap();
        assert_eq!(a.pg.as_deref(), Some("postgres://root@127.0.0.1:5432/test"));
        assert_eq!(a.pg_table, "jobs_2");
        for (argv, flag) in [
            (&["--pg", "http://127.0.0.1:7077"][..], "--pg"),
            (&["--pg-table", "Jobs"][..], "--pg-table"),
        ] {
            let e = bench_args(argv).unwrap_err();
            assert!(e.to_string().contains(flag), "{argv:?}: {e}");
        }
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (argv, flag) in [
            (&["--workload", "fast"][..], "--workload"),
            (&["--connections", "0"][..], "--connections"),
            (&["--duration", "long"][..], "--duration"),
            (&["--long-fraction", "2"][..], "--long-fraction"),
        ] {
            let e = bench_args(argv).unwrap_err();
            assert!(e.to_string().contains(flag), "{argv:?}: {e}");
        }
    }

    #[test]
    fn claims_stop_at_the_limit() {
        let c = AtomicU64::new(0);
        assert_eq!(claim(&c, 100, Some(250)), 0..100);
        assert_eq!(claim(&c, 100, Some(250)), 100..200);
        assert_eq!(claim(&c, 100, Some(250)), 200..250);
        assert!(claim(&c, 100, Some(250)).is_empty());
        assert_eq!(claim(&c, 7, None).count(), 7);
    }

    #[test]
    fn progress_marks_done_at_target() {
        let p = Progress::default();
        p.finish(5, 10);
        assert!(!p.is_done());
        p.finish(5, 10);
        assert!(p.is_done());
        assert!(p.reached_at.get().is_some());
    }

    #[test]
    fn tasks_go_to_the_nodes_in_turn() {
        let url: Url = "http://127.0.0.1:7091/v1/queues/q/leases".parse().unwrap();
        let nodes: Vec<Url> = ["http://127.0.0.1:7092", "http://127.0.0.2:7093"]
            .iter()
            .map(|u| u.parse().unwrap())
            .collect();
        let at = |task| on_node(&url, &nodes, task).to_string();
        assert_eq!(at(0), "http://127.0.0.1:7091/v1/queues/q/leases");
        assert_eq!(at(1), "http://127.0.0.1:7092/v1/queues/q/leases");
        assert_eq!(at(2), "http://127.0.0.2:7093/v1/queues/q/leases");
        assert_eq!(at(3), at(0));
        assert_eq!(on_node(&url, &[], 5), url, "no other node: the server");
    }

    #[test]
    fn payload_is_json() {
        let ctx = Ctx {
            api: Client::new("http://127.0.0.1:1").unwrap(),
            queue: "q".into(),
            run_id: "1-2".into(),
            pad: "xx".into(),
            errors: ErrorTally::default(),
            progress: Progress::default(),
        };
        let v: serde_json::Value = serde_json::from_str(&ctx.payload(7, r#","due":5"#)).unwrap();
        assert_eq!(v["run"], "1-2");
        assert_eq!(v["n"], 7);
        assert_eq!(v["due"], 5);
        assert!(v["t"].as_i64().unwrap() > 0);
    }
}
