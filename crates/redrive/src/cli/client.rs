//! The thin client commands over the HTTP API (SPEC §5). They call the server through
//! [`redrive_client::Client`], the typed client the bench and the tests share, and map its
//! errors to [`CliError`](super::CliError)s with [`cli_error`] (server error → exit 1,
//! unreachable → exit 3; both from `redrive_client::cli`, which `redrive-bench` uses too).

use super::output::{emit, print_json, quiet_broken_pipe, truncate, Align, Table};
use super::usage;
use crate::{Command, ExportArgs, Filters, ListArgs, MessagesCommand, PublishArgs, QueuesArgs};
use anyhow::Context;
use redrive_client::{Client, ExportFormat, Filter, Publish, QueueView, SearchPage};
use redrive_core::{format_duration_ms, parse_duration_ms, ErrorClass, State, Timestamp};
use reqwest::Url;
use serde_json::Value;
use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

pub use redrive_client::cli::{cli_error, parse_server_url};

/// How long a plain (non-streaming) request may take in all.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long connecting may take before the server counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest last-error message shown in the `messages list` table.
const LIST_ERROR_CHARS: usize = 60;

/// The typed client every command uses: the token as a default header, keep-alive
/// with up to `pool` idle connections.
pub fn connect(server: &Url, token: Option<&str>, pool: usize) -> anyhow::Result<Client> {
    let mut builder = Client::builder_for(server.clone())
        .map_err(cli_error)?
        .connect_timeout(CONNECT_TIMEOUT)
        .request_timeout(REQUEST_TIMEOUT)
        .pool_idle_per_host(pool)
        .user_agent(concat!("redrive-cli/", env!("CARGO_PKG_VERSION")));
    if let Some(t) = token {
        builder = builder.token(t);
    }
    builder.build().map_err(cli_error)
}

/// A humantime duration, checked here and sent as written.
pub fn parse_duration_arg(s: &str) -> Result<String, String> {
    parse_duration_ms(s)
        .map(|_| s.trim().to_owned())
        .map_err(|e| e.to_string())
}

/// An RFC 3339 timestamp, checked here and sent as written.
pub fn parse_timestamp_arg(s: &str) -> Result<String, String> {
    Timestamp::parse(s.trim())
        .map(|_| s.trim().to_owned())
        .map_err(|e| e.to_string())
}

/// `--since` / `--until`: RFC 3339 as written, or a duration meaning "that long ago".
pub fn parse_time_filter(s: &str) -> Result<String, String> {
    time_filter_at(s, Timestamp::now())
}

fn time_filter_at(s: &str, now: Timestamp) -> Result<String, String> {
    let s = s.trim();
    if let Ok(t) = Timestamp::parse(s) {
        return Ok(t.to_rfc3339());
    }
    match parse_duration_ms(s) {
        Ok(ms) => {
            Ok(Timestamp::from_millis(now.as_millis().saturating_sub(ms as i64)).to_rfc3339())
        }
        Err(_) => Err(format!(
            "not an RFC 3339 time nor a duration ago (e.g. 2026-01-31T12:00:00Z or 1h): {s:?}"
        )),
    }
}

/// `--header name=value`.
pub fn parse_header(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
        _ => Err(format!("expected NAME=VALUE, got {s:?}")),
    }
}

/// The payload argument as JSON; `-` (or nothing, with stdin not a terminal) reads stdin.
fn read_payload(arg: Option<&str>) -> anyhow::Result<Value> {
    let (text, origin) = match arg {
        Some("-") => (read_stdin()?, "stdin"),
        Some(t) => (t.to_owned(), "PAYLOAD_JSON"),
        None if !std::io::stdin().is_terminal() => (read_stdin()?, "stdin"),
        None => {
            return Err(usage(
                "no payload: give PAYLOAD_JSON, or `-` to read it from stdin",
            ))
        }
    };
    parse_payload(&text, origin)
}

fn read_stdin() -> anyhow::Result<String> {
    let mut s = String::new();
    std::io::stdin()
        .read_to_string(&mut s)
        .context("cannot read the payload from stdin")?;
    Ok(s)
}

/// Parse a payload, naming where it came from when it is not JSON.
fn parse_payload(text: &str, origin: &str) -> anyhow::Result<Value> {
    serde_json::from_str(text).map_err(|e| {
        usage(format!(
            "{origin} is not valid JSON ({e}); a string payload needs quotes, e.g. '\"hello\"'"
        ))
    })
}

/// The message to publish for these arguments.
pub fn publish_request(args: &PublishArgs, payload: Value) -> Publish {
    Publish {
        payload,
        headers: args.headers.iter().cloned().collect(),
        key: args.key.clone(),
        idempotency_key: args.idempotency_key.clone(),
        priority: args.priority,
        delay: args.delay.clone(),
        deliver_at: args.deliver_at.clone(),
        failed: None,
        target_url: args.target_url.clone(),
    }
}

/// The search / export filter of these arguments (clap has already checked the
/// state, the class and the times; a value it let through that does not parse here is
/// still a usage error, not a panic).
pub fn filter_of(f: &Filters) -> anyhow::Result<Filter> {
    let time = |flag: &str, v: &Option<String>| -> anyhow::Result<Option<Timestamp>> {
        v.as_deref()
            .map(|t| Timestamp::parse(t).map_err(|e| usage(format!("{flag}: {e}"))))
            .transpose()
    };
    Ok(Filter {
        queue: f.queue.clone(),
        state: f
            .state
            .as_deref()
            .map(|s| State::parse(s).ok_or_else(|| usage(format!("--state: {s:?}"))))
            .transpose()?,
        key: f.key.clone(),
        error_class: f
            .error_class
            .as_deref()
            .map(|c| ErrorClass::parse(c).ok_or_else(|| usage(format!("--error-class: {c:?}"))))
            .transpose()?,
        q: f.q.clone(),
        since: time("--since", &f.since)?,
        until: time("--until", &f.until)?,
        finished_since: time("--finished-since", &f.finished_since)?,
        finished_until: time("--finished-until", &f.finished_until)?,
        fingerprint: f.fingerprint.clone(),
    })
}

/// Run a client command.
pub async fn run(server: &Url, token: Option<&str>, command: Command) -> anyhow::Result<()> {
    let api = connect(server, token, 1)?;
    match command {
        Command::Publish(args) => publish(&api, &args).await,
        Command::Messages { command } => messages(&api, command).await,
        Command::Queues(args) => queues(&api, &args).await,
        Command::Tasks { command } => super::tasks::run(&api, command).await,
        Command::Audit(args) => super::tasks::audit(&api, &args).await,
        Command::Groups(args) => super::groups::run(&api, &args).await,
        Command::Import(args) => super::import::run(&api, &args).await,
        Command::Serve(_) | Command::Backup(_) | Command::Policy { .. } => {
            anyhow::bail!("internal: not a client command")
        }
    }
}

async fn publish(api: &Client, args: &PublishArgs) -> anyhow::Result<()> {
    let payload = read_payload(args.payload.as_deref())?;
    let message = publish_request(args, payload);
    let published = api
        .publish(&args.queue, &message)
        .await
        .map_err(cli_error)?;
    print_json(&published.message);
    Ok(())
}

async fn messages(api: &Client, command: MessagesCommand) -> anyhow::Result<()> {
    match command {
        MessagesCommand::List(args) => list(api, &args).await,
        MessagesCommand::Export(args) => export(api, &args).await,
        MessagesCommand::Show { id } => {
            let m = api.get(&id).await.map_err(cli_error)?;
            print_json(&m);
            eprintln!("{}", summary(&m));
            Ok(())
        }
        MessagesCommand::Redrive { id } => {
            print_json(&api.redrive(&id).await.map_err(cli_error)?);
            Ok(())
        }
        MessagesCommand::Kill { id, reason } => {
            let killed = api.kill(&id, reason.as_deref()).await.map_err(cli_error)?;
            print_json(&killed);
            eprintln!("{}", summary(&killed));
            Ok(())
        }
        MessagesCommand::Delete { id } => {
            print_json(&api.delete(&id).await.map_err(cli_error)?);
            Ok(())
        }
    }
}

/// A time as the CLI prints it for people: `2026-01-31 12:00:00 UTC` (JSON keeps RFC 3339).
pub fn utc(t: Timestamp) -> String {
    format!("{} UTC", utc_bare(t))
}

/// [`utc`] without its ` UTC`, for a table whose column heading says `(UTC)`.
pub fn utc_bare(t: Timestamp) -> String {
    let full = t.to_rfc3339();
    match full.get(..19) {
        Some(s) => s.replace('T', " "),
        None => full,
    }
}

/// One line on what a message's state means, printed on stderr after its JSON by `messages
/// show` and `messages kill`: a dead message says why, and a killed one the operator's
/// reason from its history (issue 15: it was only in the history's JSON).
pub fn summary(m: &redrive_core::Message) -> String {
    use redrive_core::{DeadReason, HistoryEvent};
    let mut line = format!("{} in {}", m.state.as_str(), m.queue);
    if let Some(r) = m.dead_reason {
        line.push_str(&format!(" ({})", r.as_str()));
        if r == DeadReason::Killed {
            let kill = m.history.iter().rev().find_map(|h| match &h.event {
                HistoryEvent::Killed { reason } => Some((h.at, reason.clone())),
                _ => None,
            });
            if let Some((at, reason)) = kill {
                let reason = reason.map_or_else(
                    || "no reason given".to_owned(),
                    |r| format!("reason: {}", truncate(&r, 200)),
                );
                line.push_str(&format!(", killed at {}, {reason}", utc(at)));
            }
        }
    }
    line.push_str(&format!(
        ", {} attempt{}",
        m.attempts,
        if m.attempts == 1 { "" } else { "s" }
    ));
    if let Some(e) = &m.last_error {
        line.push_str(&format!("; last error {}", e.class.as_str()));
        if let Some(msg) = e.message.as_deref().filter(|s| !s.is_empty()) {
            line.push_str(&format!(": {}", truncate(msg, 200)));
        }
    }
    if let Some(t) = m.finished_at {
        line.push_str(&format!("; finished {}", utc(t)));
    }
    line
}

async fn list(api: &Client, args: &ListArgs) -> anyhow::Result<()> {
    let filter = filter_of(&args.filters)?;
    let page = api
        .search(&filter, args.limit, args.cursor.as_deref())
        .await
        .map_err(cli_error)?;
    if args.json {
        print_json(&page);
        return Ok(());
    }
    emit(&messages_table(&page).render())?;
    if let Some(next) = &page.next_cursor {
        eprintln!("more: add --cursor {next}");
    }
    Ok(())
}

/// The `messages list` table: id, queue, state, attempts, key, when it finished (done or
/// dead, UTC), last error.
pub fn messages_table(page: &SearchPage) -> Table {
    let mut t = Table::new(&[
        ("id", Align::Left),
        ("queue", Align::Left),
        ("state", Align::Left),
        ("attempts", Align::Right),
        ("key", Align::Left),
        ("finished (UTC)", Align::Left),
        ("last error", Align::Left),
    ]);
    for m in &page.messages {
        let last_error = match &m.last_error {
            Some(e) => {
                let class = e.class.as_str();
                match e.message.as_deref() {
                    Some(msg) if !msg.is_empty() => {
                        truncate(&format!("{class}: {msg}"), LIST_ERROR_CHARS)
                    }
                    _ => class.to_owned(),
                }
            }
            None => "-".to_owned(),
        };
        t.push(vec![
            m.id.to_string(),
            m.queue.clone(),
            m.state.as_str().to_owned(),
            m.attempts.to_string(),
            m.key.clone().unwrap_or_else(|| "-".into()),
            m.finished_at.map_or_else(|| "-".to_owned(), utc_bare),
            last_error,
        ]);
    }
    t
}

async fn export(api: &Client, args: &ExportArgs) -> anyhow::Result<()> {
    let filter = filter_of(&args.filters)?;
    let format = ExportFormat::parse(&args.format)
        .ok_or_else(|| usage(format!("--format: {:?} is not csv or jsonl", args.format)))?;
    let mut body = api.export(&filter, format).await.map_err(cli_error)?;
    match &args.output {
        None => {
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            // A reader that went away (`| head`) ends the export quietly.
            match copy_stream(&mut body, &mut out).await {
                Err(e) if is_broken_pipe(&e) => return Ok(()),
                r => r?,
            };
            quiet_broken_pipe(out.flush())?;
        }
        Some(path) => {
            // Write beside the target, rename when complete: an interrupted export never
            // leaves a file that looks whole.
            let mut part = path.clone().into_os_string();
            part.push(".part");
            let part = std::path::PathBuf::from(part);
            let file = std::fs::File::create(&part)
                .with_context(|| format!("cannot create {}", part.display()))?;
            let mut w = std::io::BufWriter::new(file);
            let result = async {
                let n = copy_stream(&mut body, &mut w).await?;
                w.flush()?;
                w.get_ref().sync_all()?;
                anyhow::Ok(n)
            }
            .await;
            match result {
                Ok(n) => {
                    std::fs::rename(&part, path)
                        .with_context(|| format!("cannot rename to {}", path.display()))?;
                    eprintln!("exported {n} bytes to {}", path.display());
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&part);
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Copy a streamed body chunk by chunk; answers the number of bytes.
/// Whether `e` is a write to a closed pipe.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

async fn copy_stream(
    body: &mut redrive_client::Export,
    out: &mut impl Write,
) -> anyhow::Result<u64> {
    let mut n = 0u64;
    loop {
        let chunk = match body.next_chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => return Ok(n),
            Err(redrive_client::Error::Interrupted { url, source }) => {
                return Err(anyhow::Error::new(source)
                    .context(format!("export from {url} was interrupted")))
            }
            Err(e) => return Err(cli_error(e)),
        };
        out.write_all(&chunk).context("cannot write the export")?;
        n += chunk.len() as u64;
    }
}

async fn queues(api: &Client, args: &QueuesArgs) -> anyhow::Result<()> {
    let list = match &args.name {
        Some(name) => {
            let q = api.queue(name).await.map_err(cli_error)?;
            if args.json {
                print_json(&q);
                return Ok(());
            }
            vec![q]
        }
        None => {
            let all = api.queues().await.map_err(cli_error)?;
            if args.json {
                print_json(&all);
                return Ok(());
            }
            all.queues
        }
    };
    emit(&queues_table(&list).render())?;
    Ok(())
}

/// An age in seconds as whole milliseconds, rounded to the second from 1 s on.
fn age_ms(secs: f64) -> u64 {
    let secs = secs.max(0.0);
    if secs >= 1.0 {
        secs.round() as u64 * 1000
    } else {
        (secs * 1000.0).round() as u64
    }
}

/// The `queues` table: counts per state, oldest ready age and the policy in words.
pub fn queues_table(queues: &[QueueView]) -> Table {
    let mut t = Table::new(&[
        ("queue", Align::Left),
        ("scheduled", Align::Right),
        ("ready", Align::Right),
        ("leased", Align::Right),
        ("done", Align::Right),
        ("dead", Align::Right),
        ("oldest ready", Align::Right),
        ("policy", Align::Left),
    ]);
    for q in queues {
        let count = |state: State| q.count(state).map_or("-".into(), |n| n.to_string());
        let oldest = q
            .oldest_ready_age_seconds
            .map_or("-".into(), |s| format_duration_ms(age_ms(s)));
        t.push(vec![
            q.queue.clone(),
            count(State::Scheduled),
            count(State::Ready),
            count(State::Leased),
            count(State::Done),
            count(State::Dead),
            oldest,
            q.policy_summary.clone(),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::CliError;
    use crate::Cli;
    use clap::Parser;
    use serde_json::json;

    /// The JSON body a publish with these arguments sends.
    fn publish_body(args: &PublishArgs, payload: Value) -> Value {
        serde_json::to_value(publish_request(args, payload)).unwrap()
    }

    fn parse(argv: &[&str]) -> Result<Cli, clap::Error> {
        let mut full = vec!["redrive"];
        full.extend_from_slice(argv);
        Cli::try_parse_from(full)
    }

    fn publish_args(argv: &[&str]) -> PublishArgs {
        let mut full = vec!["publish"];
        full.extend_from_slice(argv);
        match parse(&full).unwrap().command {
            Command::Publish(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn publish_body_has_only_what_was_given() {
        let a = publish_args(&["orders", r#"{"id":1}"#]);
        let payload = parse_payload(a.payload.as_deref().unwrap(), "PAYLOAD_JSON").unwrap();
        assert_eq!(publish_body(&a, payload), json!({"payload": {"id": 1}}));
    }

    #[test]
    fn publish_body_carries_every_option() {
        let a = publish_args(&[
            "orders",
            "[1,2]",
            "--key",
            "user-7",
            "--idempotency-key",
            "pay-42",
            "--priority",
            "5",
            "--delay",
            "30s",
            "--header",
            "trace=abc",
            "--header",
            "source=cli=1",
        ]);
        let body = publish_body(&a, json!([1, 2]));
        assert_eq!(
            body,
            json!({
                "payload": [1, 2], "key": "user-7", "idempotency_key": "pay-42", "priority": 5, "delay": "30s",
                "headers": {"trace": "abc", "source": "cli=1"}
            })
        );
        let a = publish_args(&["orders", "1", "--deliver-at", "2026-01-31T12:00:00Z"]);
        assert_eq!(
            publish_body(&a, json!(1))["deliver_at"],
            "2026-01-31T12:00:00Z"
        );
    }

    #[test]
    fn bad_publish_flags_are_refused_by_name() {
        for (argv, flag) in [
            (&["publish", "q", "1", "--priority", "10"][..], "--priority"),
            (&["publish", "q", "1", "--delay", "soon"][..], "--delay"),
            (
                &["publish", "q", "1", "--deliver-at", "tomorrow"][..],
                "--deliver-at",
            ),
            (
                &["publish", "q", "1", "--header", "novalue"][..],
                "--header",
            ),
            (
                &[
                    "publish",
                    "q",
                    "1",
                    "--delay",
                    "1s",
                    "--deliver-at",
                    "2026-01-31T12:00:00Z",
                ][..],
                "--delay",
            ),
            (&["--server", "https://x", "queues"][..], "--server"),
        ] {
            let e = parse(argv).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{argv:?}");
            assert!(e.to_string().contains(flag), "{argv:?}: {e}");
        }
    }

    #[test]
    fn invalid_payload_is_a_usage_error_naming_it() {
        let e = parse_payload("{oops", "PAYLOAD_JSON").unwrap_err();
        assert_eq!(
            e.downcast_ref::<CliError>().map(CliError::exit_code),
            Some(2)
        );
        assert!(
            e.to_string().starts_with("PAYLOAD_JSON is not valid JSON"),
            "{e}"
        );
        assert_eq!(parse_payload("\"hello\"", "stdin").unwrap(), json!("hello"));
    }

    #[test]
    fn list_filters_become_the_query() {
        let cli = parse(&[
            "messages",
            "list",
            "--queue",
            "orders",
            "--state",
            "dead",
            "--error-class",
            "permanent",
            "--limit",
            "5",
        ])
        .unwrap();
        let Command::Messages {
            command: MessagesCommand::List(a),
        } = cli.command
        else {
            panic!()
        };
        let q = filter_of(&a.filters).unwrap().query();
        assert!(q.contains(&("queue", "orders".into())));
        assert!(q.contains(&("state", "dead".into())));
        assert!(q.contains(&("error_class", "permanent".into())));
        assert_eq!(a.limit, Some(5));
        assert!(parse(&["messages", "list", "--state", "zombie"]).is_err());
    }

    #[test]
    fn time_filters_take_rfc3339_or_ago() {
        let now = Timestamp::parse("2026-01-31T12:00:00Z").unwrap();
        assert_eq!(
            time_filter_at("1h", now).unwrap(),
            "2026-01-31T11:00:00.000Z"
        );
        assert_eq!(
            time_filter_at("2026-01-30T00:00:00+08:00", now).unwrap(),
            "2026-01-29T16:00:00.000Z"
        );
        assert!(time_filter_at("yesterday", now).is_err());
    }

    #[test]
    fn messages_table_is_compact() {
        let at = "2026-01-31T12:00:00.000Z";
        let answer: SearchPage = serde_json::from_value(json!({"messages": [
            {"id": "0190b5c2-7d1e-7c3a-9f00-1a2b3c4d5e6f", "queue": "orders", "state": "dead", "attempts": 8, "key": "u1",
             "payload": null, "headers": {}, "priority": 0, "created_at": at, "updated_at": at, "finished_at": at,
             "last_error": {"class": "transient", "message": "HTTP 503 from payments\nretry later", "at": at}},
            {"id": "0190b5c2-7d1e-7c3a-9f00-1a2b3c4d5e70", "queue": "orders", "state": "ready", "attempts": 0,
             "payload": 1, "headers": {}, "priority": 0, "created_at": at, "updated_at": at}
        ], "next_cursor": null}))
        .unwrap();
        let text = messages_table(&answer).render();
        assert_eq!(
            text,
            "id                                    queue   state  attempts  key  finished (UTC)       last error\n\
             0190b5c2-7d1e-7c3a-9f00-1a2b3c4d5e6f  orders  dead          8  u1   2026-01-31 12:00:00  transient: HTTP 503 from payments retry later\n\
             0190b5c2-7d1e-7c3a-9f00-1a2b3c4d5e70  orders  ready         0  -    -                    -\n"
        );
    }

    /// Regression, issue 15: the CLI showed a killed message's reason only inside its
    /// history's JSON.
    #[test]
    fn a_killed_messages_summary_has_its_kill_reason() {
        let at = "2026-01-31T12:00:00.000Z";
        let m: redrive_core::Message = serde_json::from_value(json!({
            "id": "0190b5c2-7d1e-7c3a-9f00-1a2b3c4d5e6f", "queue": "orders", "state": "dead",
            "attempts": 2, "payload": 1, "headers": {}, "priority": 0, "created_at": at,
            "updated_at": at, "finished_at": at, "dead_reason": "killed",
            "last_error": {"class": "transient", "message": "HTTP 503", "at": at},
            "history": [
                {"attempt": 2, "at": at, "event": "failed", "error": {"class": "transient", "message": "HTTP 503", "at": at}},
                {"attempt": 2, "at": "2026-01-31T12:05:00.000Z", "event": "killed", "reason": "duplicate order, refunded by hand"}
            ]
        }))
        .unwrap();
        assert_eq!(
            summary(&m),
            "dead in orders (killed), killed at 2026-01-31 12:05:00 UTC, reason: duplicate order, \
             refunded by hand, 2 attempts; last error transient: HTTP 503; finished 2026-01-31 12:00:00 UTC"
        );
        let mut silent = m.clone();
        silent.history.pop();
        silent.history.push(redrive_core::HistoryEntry {
            attempt: 2,
            at: redrive_core::Timestamp::parse(at).unwrap(),
            leased_at: None,
            event: redrive_core::HistoryEvent::Killed { reason: None },
            response: None,
        });
        assert!(summary(&silent).contains("killed at 2026-01-31 12:00:00 UTC, no reason given"));
        let mut ready = m;
        ready.state = State::Ready;
        ready.dead_reason = None;
        ready.finished_at = None;
        assert_eq!(
            summary(&ready),
            "ready in orders, 2 attempts; last error transient: HTTP 503"
        );
    }

    #[test]
    fn queues_table_shows_counts() {
        let view =
            |queue: &str, counts: &[(&str, u64)], age: Option<f64>, summary: &str| QueueView {
                queue: queue.into(),
                counts: counts.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect(),
                oldest_ready_age_seconds: age,
                policy: redrive_core::RetryPolicy::default(),
                policy_summary: summary.into(),
                ordering: redrive_core::Ordering::default(),
                on_dead: redrive_core::OnDead::default(),
                lease: None,
                delivery: None,
                endpoint: None,
            };
        let q = view(
            "orders",
            &[
                ("scheduled", 1),
                ("ready", 20),
                ("leased", 3),
                ("done", 400),
                ("dead", 2),
            ],
            Some(90.4),
            "exponential",
        );
        let empty = view("idle", &[], None, "");
        let text = queues_table(&[q, empty]).render();
        assert_eq!(
            text,
            "queue   scheduled  ready  leased  done  dead  oldest ready  policy\n\
             orders          1     20       3   400     2        1m 30s  exponential\n\
             idle            -      -       -     -     -             -\n"
        );
    }
}
