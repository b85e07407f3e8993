//! The `redrive` binary: command-line plumbing only.
//!
//! - `redrive serve` runs the server ([`redrive_server::serve`]);
//! - `redrive backup` copies a data directory while its server runs;
//! - `redrive policy explain` prints what a retry policy means, offline;
//! - `redrive publish | messages … | queues | tasks … | groups | audit` are thin clients of
//!   the HTTP API (SPEC §5, §12);
//! - `redrive import` reads an existing MySQL retry table (the seeds' `msg_retry`) and
//!   publishes its rows through the same API.
//!
//! The load generator is another binary, `redrive-bench` (crates/redrive-bench), so that
//! the server links none of it.
//!
//! This file holds the clap definitions and the dispatch; the work is in
//! [`cli`] (serve, policy, client commands, tables).
//!
//! Exit codes: 0 success; 1 the server answered an error; 2 bad command-line input or
//! configuration; 3 the server could not be reached.

mod cli;

/// mimalloc instead of glibc's malloc: the writer thread allocates the rows it reads and the
/// HTTP workers free them, and glibc's arena locks made those cross-thread frees about a tenth
/// of the writer's time under load (docs/PERFORMANCE.md, "Where the time goes").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{ArgGroup, Args, Parser, Subcommand};
use redrive_core::{Backoff, DurationMs, Jitter};
use std::path::PathBuf;
use std::process::ExitCode;

/// Command line of `redrive`.
#[derive(Debug, Parser)]
#[command(
    name = "redrive",
    version,
    about = "Durable retry and dead-letter server, and its client",
    propagate_version = true
)]
pub struct Cli {
    /// Base URL of the redrive server, for the client commands (http only).
    #[arg(
        long,
        global = true,
        env = "REDRIVE_SERVER",
        default_value = "http://127.0.0.1:7070",
        value_name = "URL",
        value_parser = cli::client::parse_server_url
    )]
    pub server: reqwest::Url,

    /// API token, sent as `Authorization: Bearer TOKEN`.
    #[arg(
        long,
        global = true,
        env = "REDRIVE_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server (no flags and no config: 127.0.0.1:7070, data in ./redrive-data).
    Serve(ServeArgs),
    /// Copy a data directory into a new one, consistently, while its server runs.
    Backup(BackupArgs),
    /// Retry policies.
    Policy {
        /// What to do with a policy.
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Publish one message to a queue.
    Publish(PublishArgs),
    /// Search, inspect and act on messages.
    Messages {
        /// What to do.
        #[command(subcommand)]
        command: MessagesCommand,
    },
    /// Show queues: counts per state, oldest ready age, policy.
    Queues(QueuesArgs),
    /// Bulk actions as durable tasks: redrive, kill or delete what a filter selects, with
    /// a dry run, a rate, progress, pause / resume / cancel.
    Tasks {
        #[command(subcommand)]
        command: TasksCommand,
    },
    /// Failure groups: dead letters grouped by the fingerprint of their last error, largest
    /// first, each with its fingerprint (for `messages list --fingerprint` and `tasks create
    /// --fingerprint`), queues, an example error and a few ids.
    Groups(GroupsArgs),
    /// The audit log: every operator action, newest first.
    Audit(AuditArgs),
    /// Import an existing MySQL retry table (the seeds' `msg_retry`): its pending rows become
    /// scheduled messages (due at next_retry_at, attempts from fail_times), its dead rows dead
    /// letters; done rows are skipped. Idempotent on the row id; --dry-run counts first.
    Import(Box<ImportArgs>),
}

/// `redrive import`.
///
/// Reads the table in pages of 1,000 rows by its id (never writes to it: the session is
/// read-only) and publishes through the server's API, in batches. Each message has the
/// idempotency key `import:<table>:<id>`, so a second run within the server's
/// `idempotency_window` (default 24h) imports nothing twice; after the window it would.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The database holding the table: `mysql://user[:password]@host[:port]/database`.
    #[arg(
        long,
        env = "REDRIVE_IMPORT_FROM",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub from: String,
    /// The table to read.
    #[arg(long, default_value = "msg_retry", value_name = "NAME")]
    pub table: String,
    /// Publish every row to this queue; by default each row's topic is its queue (a topic
    /// that is no valid queue name fails that row, listed; the others go on).
    #[arg(long, value_name = "QUEUE")]
    pub queue: Option<String>,
    /// The row id column: a unique key, read in its order.
    #[arg(long, default_value = "id", value_name = "COLUMN")]
    pub id_column: String,
    /// The topic column (the queue, unless --queue).
    #[arg(long, default_value = "topic", value_name = "COLUMN")]
    pub topic_column: String,
    /// The payload column (JSON, published as is).
    #[arg(long, default_value = "payload", value_name = "COLUMN")]
    pub payload_column: String,
    /// The column counting the failed attempts so far (the message's attempts).
    #[arg(long, default_value = "fail_times", value_name = "COLUMN")]
    pub fail_times_column: String,
    /// The next try's time: DATETIME / TIMESTAMP, or an integer of Unix seconds.
    #[arg(long, default_value = "next_retry_at", value_name = "COLUMN")]
    pub next_retry_column: String,
    /// The status column.
    #[arg(long, default_value = "status", value_name = "COLUMN")]
    pub status_column: String,
    /// The status of rows still to retry: scheduled messages.
    #[arg(long, default_value = "pending", value_name = "VALUE")]
    pub pending_value: String,
    /// The status of rows given up: dead letters.
    #[arg(long, default_value = "dead", value_name = "VALUE")]
    pub dead_value: String,
    /// The status of rows already handled: skipped (counted).
    #[arg(long, default_value = "done", value_name = "VALUE")]
    pub done_value: String,
    /// The UTC offset of the table's DATETIME values, e.g. +08:00 for Asia/Shanghai (a
    /// DATETIME has no zone; TIMESTAMP columns are read in this offset too, so they stay
    /// right). Default UTC.
    #[arg(long, default_value = "+00:00", value_name = "±HH:MM", allow_hyphen_values = true,
          value_parser = cli::import::parse_offset)]
    pub timezone_offset: cli::import::UtcOffset,
    /// Read and count (pending, dead, done, invalid, per queue, with what the queue's policy
    /// makes of each); publish nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Messages per publish request (at most the server's max_batch, default 1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub batch: u32,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `redrive serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (TOML; see redrive.example.toml).
    #[arg(long, env = "REDRIVE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:7070 (overrides the file and REDRIVE_LISTEN).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Data directory of the embedded store (overrides the file and REDRIVE_DATA_DIR).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The store: postgres://user@host:port/database for PostgreSQL,
    /// mysql://user@host:port/database for MySQL or MariaDB; absent, the embedded store in
    /// the data directory (overrides the file and REDRIVE_STORAGE_URL).
    #[arg(long, value_name = "URL")]
    pub storage_url: Option<String>,
}

/// `redrive backup`.
#[derive(Debug, Args)]
pub struct BackupArgs {
    /// Data directory of the store to copy (a server may be running on it).
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// Where to write the copy: a new directory, or an empty one.
    #[arg(long, value_name = "OUT")]
    pub to: PathBuf,
}

/// `redrive policy …`.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Print a policy's schedule: for each retry, its delay range and the cumulative time.
    ///
    /// The policy comes from a config file (`--config FILE [--queue NAME]`) or from
    /// flags; with neither, the built-in default policy is explained. Delays assume
    /// transient failures (rate-limited ones follow the server's Retry-After).
    Explain(ExplainArgs),
}

/// `redrive policy explain`.
#[derive(Debug, Args)]
#[command(group(
    ArgGroup::new("policy_flags")
        .multiple(true)
        .args(["preset", "backoff", "initial_delay", "multiplier", "max_delay", "jitter", "max_attempts", "max_age", "schedule"])
))]
pub struct ExplainArgs {
    /// Take the policy from this config file.
    #[arg(long, value_name = "FILE", conflicts_with = "policy_flags")]
    pub config: Option<PathBuf>,
    /// The queue whose policy to explain (with --config; default: the `default` section).
    #[arg(long, value_name = "NAME", requires = "config")]
    pub queue: Option<String>,
    /// Start from a named preset.
    #[arg(long, value_parser = ["rocketmq", "sidekiq", "svix"])]
    pub preset: Option<String>,
    /// Backoff shape: fixed, linear, exponential, decorrelated, schedule, sidekiq.
    #[arg(long, value_parser = parse_snake_enum::<Backoff>)]
    pub backoff: Option<Backoff>,
    /// First retry delay, e.g. 1s.
    #[arg(long, value_name = "DURATION")]
    pub initial_delay: Option<DurationMs>,
    /// Growth factor of exponential backoff (≥ 1).
    #[arg(long, value_parser = cli::policy::parse_multiplier)]
    pub multiplier: Option<f64>,
    /// Cap on one delay, e.g. 15m.
    #[arg(long, value_name = "DURATION")]
    pub max_delay: Option<DurationMs>,
    /// Jitter: none, full ([0, d]), equal ([d/2, d]), decorrelated.
    #[arg(long, value_parser = parse_snake_enum::<Jitter>)]
    pub jitter: Option<Jitter>,
    /// Deliveries in all, the first included (≥ 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: Option<u32>,
    /// No retry is scheduled past created_at + max_age, e.g. 7d.
    #[arg(long, value_name = "DURATION")]
    pub max_age: Option<DurationMs>,
    /// Explicit delays, comma-separated, e.g. 1s,5s,30s (implies --backoff schedule).
    #[arg(long, value_name = "LIST", value_delimiter = ',', num_args = 1..)]
    pub schedule: Option<Vec<DurationMs>>,
    /// Print the policy and its rows as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Parse a flag value into one of the core's snake_case enums (`Backoff`, `Jitter`), so the
/// CLI accepts exactly the names the config file does.
fn parse_snake_enum<T: serde::de::DeserializeOwned>(s: &str) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned())).map_err(|e| e.to_string())
}

/// `redrive publish`.
#[derive(Debug, Args)]
pub struct PublishArgs {
    /// Queue name.
    pub queue: String,
    /// The payload as JSON, or `-` to read it from stdin (also the default when stdin is not a terminal).
    #[arg(value_name = "PAYLOAD_JSON")]
    pub payload: Option<String>,
    /// Ordering/partition key.
    #[arg(long)]
    pub key: Option<String>,
    /// Idempotency key: a replay within the window returns the original message.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Priority 0–9, higher first.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=9))]
    pub priority: Option<u8>,
    /// Deliver after this delay, e.g. 30s.
    #[arg(long, value_name = "DURATION", value_parser = cli::client::parse_duration_arg, conflicts_with = "deliver_at")]
    pub delay: Option<String>,
    /// Deliver at this time (RFC 3339, e.g. 2026-01-31T12:00:00Z).
    #[arg(long, value_name = "TIME", value_parser = cli::client::parse_timestamp_arg)]
    pub deliver_at: Option<String>,
    /// A header `name=value` (repeatable).
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = cli::client::parse_header)]
    pub headers: Vec<(String, String)>,
    /// Push delivery: this message's own endpoint URL (the queue needs allow_message_targets).
    #[arg(long, value_name = "URL")]
    pub target_url: Option<String>,
}

/// `redrive messages …`.
#[derive(Debug, Subcommand)]
pub enum MessagesCommand {
    /// Search messages (newest first, one page; --cursor for the next).
    List(ListArgs),
    /// Show one message with its history.
    Show {
        /// Message id.
        id: String,
    },
    /// Make a dead or scheduled message ready now, with a fresh attempt budget.
    Redrive {
        /// Message id.
        id: String,
    },
    /// Move a message to dead (reason `killed`).
    Kill {
        /// Message id.
        id: String,
        /// Why, kept in the history.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Delete a message for good.
    Delete {
        /// Message id.
        id: String,
    },
    /// Export every matching message as CSV or JSON lines, streamed.
    Export(ExportArgs),
}

/// Search filters shared by `messages list` and `messages export`.
#[derive(Debug, Clone, Default, Args)]
pub struct Filters {
    /// Only this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Only this state.
    #[arg(long, value_parser = ["scheduled", "ready", "leased", "done", "dead"])]
    pub state: Option<String>,
    /// Only this key.
    #[arg(long)]
    pub key: Option<String>,
    /// Only messages whose last error has this class.
    #[arg(long, value_parser = ["transient", "rate_limited", "permanent"])]
    pub error_class: Option<String>,
    /// Text in the payload or the error message.
    #[arg(long)]
    pub q: Option<String>,
    /// Created at or after: RFC 3339, or a duration meaning that long ago (e.g. 1h).
    #[arg(long, value_name = "TIME", value_parser = cli::client::parse_time_filter)]
    pub since: Option<String>,
    /// Created before: RFC 3339, or a duration meaning that long ago (e.g. 10m).
    #[arg(long, value_name = "TIME", value_parser = cli::client::parse_time_filter)]
    pub until: Option<String>,
    /// Finished (became done or dead) at or after: RFC 3339, or a duration ago (e.g. 12h).
    #[arg(long, value_name = "TIME", value_parser = cli::client::parse_time_filter)]
    pub finished_since: Option<String>,
    /// Finished before: RFC 3339, or a duration ago.
    #[arg(long, value_name = "TIME", value_parser = cli::client::parse_time_filter)]
    pub finished_until: Option<String>,
    /// Only messages of this failure group (a fingerprint from `redrive groups`), exact.
    #[arg(long)]
    pub fingerprint: Option<String>,
}

/// `redrive messages list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Filters.
    #[command(flatten)]
    pub filters: Filters,
    /// Page size.
    #[arg(long)]
    pub limit: Option<u32>,
    /// Continue from a previous page's next_cursor.
    #[arg(long)]
    pub cursor: Option<String>,
    /// Print the server's JSON answer instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `redrive messages export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Filters.
    #[command(flatten)]
    pub filters: Filters,
    /// Output format.
    #[arg(long, value_parser = ["csv", "jsonl"], default_value = "csv")]
    pub format: String,
    /// Write to this file instead of stdout (written to FILE.part, renamed when complete).
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// `redrive queues`.
#[derive(Debug, Args)]
pub struct QueuesArgs {
    /// One queue; all queues when omitted.
    pub name: Option<String>,
    /// Print the server's JSON answer instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `redrive tasks …`.
#[derive(Debug, Subcommand)]
pub enum TasksCommand {
    /// Create a task (or, with --dry-run, count what it would select).
    Create(Box<TaskCreateArgs>),
    /// List the tasks, newest first.
    List {
        /// Print the server's JSON answer instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one task; with --watch, follow its progress until it finishes.
    Show {
        /// The task's id.
        id: String,
        /// Follow its progress with a progress bar until it finishes.
        #[arg(long)]
        watch: bool,
    },
    /// Pause a running task (it resumes where it stopped).
    Pause {
        /// The task's id.
        id: String,
    },
    /// Resume a paused task.
    Resume {
        /// The task's id.
        id: String,
    },
    /// Cancel a running or paused task (what it did stays done).
    Cancel {
        /// The task's id.
        id: String,
    },
}

/// `redrive tasks create`.
#[derive(Debug, Args)]
pub struct TaskCreateArgs {
    /// What to do to each selected message.
    #[arg(long, value_parser = ["redrive", "kill", "delete"])]
    pub action: String,
    /// Which messages (`--fingerprint`: a failure group from `redrive groups`).
    #[command(flatten)]
    pub filters: Filters,
    /// At most this many messages per second, minute or hour ("100/s", "600/m").
    #[arg(long)]
    pub rate: Option<String>,
    /// Only count what the filter selects; create nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// A kill's reason, written in each message's history.
    #[arg(long)]
    pub reason: Option<String>,
    /// A redrive stops by itself when more than this share (0–1) of the messages it
    /// redrove fail again (server default 0.5).
    #[arg(long)]
    pub stop_failure_ratio: Option<f64>,
    /// Follow the new task's progress until it finishes.
    #[arg(long)]
    pub wait: bool,
}

/// `redrive groups`.
#[derive(Debug, Args)]
pub struct GroupsArgs {
    /// Only this queue's dead letters.
    #[arg(long)]
    pub queue: Option<String>,
    /// Groups to show, largest first (server default 50, at most 1000).
    #[arg(long)]
    pub limit: Option<u32>,
    /// Print the server's JSON answer instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `redrive audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Entries to show.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Older entries: the `next` cursor a previous page printed.
    #[arg(long)]
    pub cursor: Option<String>,
    /// Print the server's JSON answer instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => cli::serve::run(&args),
        Command::Backup(args) => cli::finish(cli::backup::run(&args)),
        Command::Policy {
            command: PolicyCommand::Explain(args),
        } => cli::finish(cli::policy::run(&args)),
        command => {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    return cli::finish(Err(anyhow::anyhow!("cannot start the async runtime: {e}")))
                }
            };
            cli::finish(runtime.block_on(cli::client::run(
                &cli.server,
                cli.token.as_deref(),
                command,
            )))
        }
    }
}
