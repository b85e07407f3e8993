//! The thin client commands over the HTTP API (SPEC §5), and [`ApiClient`], the
//! small wrapper they (and the bench) share: URL building, the bearer token, and
//! the mapping of answers to [`CliError`]s (server error → exit 1, unreachable → exit 3).

use super::output::{print_json, truncate, Align, Table};
use super::{usage, CliError};
use crate::{Command, ExportArgs, Filters, ListArgs, MessagesCommand, PublishArgs, QueuesArgs};
use anyhow::Context;
use futures_util::StreamExt;
use redrive_core::{format_duration_ms, parse_duration_ms, Timestamp};
use reqwest::{header, Method, StatusCode, Url};
use serde_json::{json, Map, Value};
use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

/// How long a plain (non-streaming) request may take in all.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long connecting may take before the server counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest last-error message shown in the `messages list` table.
const LIST_ERROR_CHARS: usize = 60;

/// A client of one redrive server.
#[derive(Debug, Clone)]
pub struct ApiClient {
    base: Url,
    http: reqwest::Client,
}

/// Build the HTTP client every command uses: the token as a default header,
/// keep-alive with up to `pool` idle connections.
pub fn http_client(token: Option<&str>, pool: usize) -> anyhow::Result<reqwest::Client> {
    let mut headers = header::HeaderMap::new();
    if let Some(t) = token {
        let mut v = header::HeaderValue::from_str(&format!("Bearer {}", t.trim()))
            .map_err(|_| usage("--token: not a valid header value"))?;
        v.set_sensitive(true);
        headers.insert(header::AUTHORIZATION, v);
    }
    reqwest::Client::builder()
        .default_headers(headers)
        .connect_timeout(CONNECT_TIMEOUT)
        .pool_max_idle_per_host(pool)
        .tcp_nodelay(true)
        .user_agent(concat!("redrive-cli/", env!("CARGO_PKG_VERSION")))
        .build()
        .context("cannot build the HTTP client")
}

impl ApiClient {
    /// A client of the server at `base` using `http`.
    pub fn new(base: Url, http: reqwest::Client) -> Self {
        Self { base, http }
    }

    /// The underlying HTTP client (shared connection pool).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// `base` + path segments (each percent-encoded) + query pairs (unset ones skipped).
    pub fn url(&self, segments: &[&str], query: &[(&str, Option<String>)]) -> Url {
        build_url(&self.base, segments, query)
    }

    /// Send a request and answer its response if 2xx; a server error becomes
    /// [`CliError::Api`], a connection failure [`CliError::Unreachable`].
    pub async fn send(
        &self,
        method: Method,
        url: Url,
        body: Option<&Value>,
        stream: bool,
    ) -> anyhow::Result<reqwest::Response> {
        let mut req = self.http.request(method, url.clone());
        if !stream {
            req = req.timeout(REQUEST_TIMEOUT);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| transport_error(&url, e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        Err(api_error(status, &text).into())
    }

    /// Send and parse the JSON answer (`null` for an empty body).
    pub async fn json(
        &self,
        method: Method,
        url: Url,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let resp = self.send(method, url.clone(), body, false).await?;
        let bytes = resp.bytes().await.map_err(|e| transport_error(&url, e))?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes)
            .with_context(|| format!("the server's answer to {url} is not JSON"))
    }
}

/// See [`ApiClient::url`].
fn build_url(base: &Url, segments: &[&str], query: &[(&str, Option<String>)]) -> Url {
    let mut url = base.clone();
    if let Ok(mut path) = url.path_segments_mut() {
        path.pop_if_empty().extend(segments);
    }
    let pairs: Vec<(&str, &str)> = query
        .iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (*k, v)))
        .collect();
    if pairs.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url
}

/// A reqwest failure to get any answer.
pub fn transport_error(url: &Url, e: reqwest::Error) -> anyhow::Error {
    if e.is_connect() || e.is_timeout() {
        let mut base = url.clone();
        base.set_path("/");
        base.set_query(None);
        // The innermost cause ("Connection refused") says the most.
        let mut cause: &dyn std::error::Error = &e;
        while let Some(inner) = cause.source() {
            cause = inner;
        }
        let cause = if e.is_timeout() {
            "timed out".to_owned()
        } else {
            cause.to_string()
        };
        CliError::Unreachable {
            url: base.to_string(),
            cause,
        }
        .into()
    } else {
        anyhow::Error::new(e).context(format!("request to {url} failed"))
    }
}

/// A non-2xx answer as a [`CliError::Api`]: the server's `{"error": {code, message}}`,
/// or the status and raw text when the body is not one.
pub fn api_error(status: StatusCode, body: &str) -> CliError {
    let parsed: Option<(String, String)> = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        let e = v.get("error")?;
        Some((
            e.get("code")?.as_str()?.to_owned(),
            e.get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
        ))
    });
    match parsed {
        Some((code, message)) => CliError::Api {
            status: status.as_u16(),
            code,
            message,
        },
        None => {
            let text = body.trim();
            let message = if text.is_empty() {
                status.canonical_reason().unwrap_or("error").to_owned()
            } else {
                truncate(text, 200)
            };
            CliError::Api {
                status: status.as_u16(),
                code: format!("http_{}", status.as_u16()),
                message,
            }
        }
    }
}

/// `--server`: an http URL (this build has no TLS).
pub fn parse_server_url(s: &str) -> Result<Url, String> {
    let url = Url::parse(s).map_err(|e| format!("not a URL ({e}), e.g. http://127.0.0.1:7070"))?;
    match url.scheme() {
        "http" => Ok(url),
        "https" => Err(
            "https is not supported by this build (no TLS); use http:// on loopback or a TLS proxy"
                .into(),
        ),
        other => Err(format!("unsupported scheme {other:?}; use http://")),
    }
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

/// The body of `POST /v1/queues/{queue}/messages` for these arguments.
pub fn publish_body(args: &PublishArgs, payload: Value) -> Value {
    let mut body = Map::new();
    body.insert("payload".into(), payload);
    if !args.headers.is_empty() {
        let headers: Map<String, Value> = args
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        body.insert("headers".into(), Value::Object(headers));
    }
    let optional = [
        ("key", args.key.clone().map(Value::String)),
        (
            "idempotency_key",
            args.idempotency_key.clone().map(Value::String),
        ),
        ("priority", args.priority.map(Value::from)),
        ("delay", args.delay.clone().map(Value::String)),
        ("deliver_at", args.deliver_at.clone().map(Value::String)),
    ];
    for (k, v) in optional {
        if let Some(v) = v {
            body.insert(k.into(), v);
        }
    }
    Value::Object(body)
}

/// The query of `GET /v1/messages` and its export.
pub fn filter_query(f: &Filters) -> Vec<(&'static str, Option<String>)> {
    vec![
        ("queue", f.queue.clone()),
        ("state", f.state.clone()),
        ("key", f.key.clone()),
        ("error_class", f.error_class.clone()),
        ("q", f.q.clone()),
        ("since", f.since.clone()),
        ("until", f.until.clone()),
    ]
}

/// Run a client command.
pub async fn run(server: &Url, token: Option<&str>, command: Command) -> anyhow::Result<()> {
    let api = ApiClient::new(server.clone(), http_client(token, 1)?);
    match command {
        Command::Publish(args) => publish(&api, &args).await,
        Command::Messages { command } => messages(&api, command).await,
        Command::Queues(args) => queues(&api, &args).await,
        Command::Serve(_) | Command::Policy { .. } | Command::Bench(_) => {
            anyhow::bail!("internal: not a client command")
        }
    }
}

async fn publish(api: &ApiClient, args: &PublishArgs) -> anyhow::Result<()> {
    let payload = read_payload(args.payload.as_deref())?;
    let body = publish_body(args, payload);
    let url = api.url(&["v1", "queues", &args.queue, "messages"], &[]);
    print_json(&api.json(Method::POST, url, Some(&body)).await?);
    Ok(())
}

async fn messages(api: &ApiClient, command: MessagesCommand) -> anyhow::Result<()> {
    let (method, url, body) = match command {
        MessagesCommand::List(args) => return list(api, &args).await,
        MessagesCommand::Export(args) => return export(api, &args).await,
        MessagesCommand::Show { id } => (Method::GET, api.url(&["v1", "messages", &id], &[]), None),
        MessagesCommand::Redrive { id } => (
            Method::POST,
            api.url(&["v1", "messages", &id, "redrive"], &[]),
            None,
        ),
        MessagesCommand::Kill { id, reason } => {
            let body = match reason {
                Some(r) => json!({ "reason": r }),
                None => json!({}),
            };
            (
                Method::POST,
                api.url(&["v1", "messages", &id, "kill"], &[]),
                Some(body),
            )
        }
        MessagesCommand::Delete { id } => {
            (Method::DELETE, api.url(&["v1", "messages", &id], &[]), None)
        }
    };
    let answer = api.json(method, url, body.as_ref()).await?;
    if !answer.is_null() {
        print_json(&answer);
    }
    Ok(())
}

async fn list(api: &ApiClient, args: &ListArgs) -> anyhow::Result<()> {
    let mut query = filter_query(&args.filters);
    query.push(("limit", args.limit.map(|l| l.to_string())));
    query.push(("cursor", args.cursor.clone()));
    let answer = api
        .json(Method::GET, api.url(&["v1", "messages"], &query), None)
        .await?;
    if args.json {
        print_json(&answer);
        return Ok(());
    }
    print!("{}", messages_table(&answer).render());
    if let Some(next) = answer.get("next_cursor").and_then(Value::as_str) {
        eprintln!("more: add --cursor {next}");
    }
    Ok(())
}

/// The `messages list` table: id, queue, state, attempts, key, last error.
pub fn messages_table(answer: &Value) -> Table {
    let mut t = Table::new(&[
        ("id", Align::Left),
        ("queue", Align::Left),
        ("state", Align::Left),
        ("attempts", Align::Right),
        ("key", Align::Left),
        ("last error", Align::Left),
    ]);
    let empty = Vec::new();
    let messages = answer
        .get("messages")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    for m in messages {
        let s = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("-").to_owned();
        let attempts = m
            .get("attempts")
            .and_then(Value::as_u64)
            .map_or("-".into(), |n| n.to_string());
        let last_error = match m.get("last_error") {
            Some(e) if e.is_object() => {
                let class = e.get("class").and_then(Value::as_str).unwrap_or("error");
                match e.get("message").and_then(Value::as_str) {
                    Some(msg) if !msg.is_empty() => {
                        truncate(&format!("{class}: {msg}"), LIST_ERROR_CHARS)
                    }
                    _ => class.to_owned(),
                }
            }
            _ => "-".to_owned(),
        };
        t.push(vec![
            s("id"),
            s("queue"),
            s("state"),
            attempts,
            s("key"),
            last_error,
        ]);
    }
    t
}

async fn export(api: &ApiClient, args: &ExportArgs) -> anyhow::Result<()> {
    let mut query = filter_query(&args.filters);
    query.push(("format", Some(args.format.clone())));
    let url = api.url(&["v1", "messages", "export"], &query);
    let resp = api.send(Method::GET, url.clone(), None, true).await?;
    match &args.output {
        None => {
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            copy_stream(resp, &mut out, &url).await?;
            out.flush()?;
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
                let n = copy_stream(resp, &mut w, &url).await?;
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
async fn copy_stream(
    resp: reqwest::Response,
    out: &mut impl Write,
    url: &Url,
) -> anyhow::Result<u64> {
    let mut stream = resp.bytes_stream();
    let mut n = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            anyhow::Error::new(e).context(format!("export from {url} was interrupted"))
        })?;
        out.write_all(&chunk).context("cannot write the export")?;
        n += chunk.len() as u64;
    }
    Ok(n)
}

async fn queues(api: &ApiClient, args: &QueuesArgs) -> anyhow::Result<()> {
    let url = match &args.name {
        Some(name) => api.url(&["v1", "queues", name], &[]),
        None => api.url(&["v1", "queues"], &[]),
    };
    let answer = api.json(Method::GET, url, None).await?;
    if args.json {
        print_json(&answer);
        return Ok(());
    }
    let list = match answer.get("queues").and_then(Value::as_array) {
        Some(list) => list.clone(),
        None => vec![answer],
    };
    print!("{}", queues_table(&list).render());
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
pub fn queues_table(queues: &[Value]) -> Table {
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
        let count = |state: &str| {
            q.get("counts")
                .and_then(|c| c.get(state))
                .and_then(Value::as_u64)
                .map_or("-".into(), |n| n.to_string())
        };
        let oldest = q
            .get("oldest_ready_age_seconds")
            .and_then(Value::as_f64)
            .map_or("-".into(), |s| format_duration_ms(age_ms(s)));
        let policy = q
            .get("policy_summary")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        t.push(vec![
            q.get("queue")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_owned(),
            count("scheduled"),
            count("ready"),
            count("leased"),
            count("done"),
            count("dead"),
            oldest,
            policy,
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cli;
    use clap::Parser;

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
    fn urls_encode_segments_and_skip_unset_query() {
        let base = Url::parse("http://127.0.0.1:7070").unwrap();
        let u = build_url(&base, &["v1", "queues", "a b/c", "messages"], &[]);
        assert_eq!(
            u.as_str(),
            "http://127.0.0.1:7070/v1/queues/a%20b%2Fc/messages"
        );
        let u = build_url(
            &base,
            &["v1", "messages"],
            &[
                ("queue", Some("orders".into())),
                ("state", None),
                ("q", Some("a&b".into())),
            ],
        );
        assert_eq!(
            u.as_str(),
            "http://127.0.0.1:7070/v1/messages?queue=orders&q=a%26b"
        );
        let prefixed = Url::parse("http://h:1/redrive/").unwrap();
        assert_eq!(
            build_url(&prefixed, &["v1", "queues"], &[]).as_str(),
            "http://h:1/redrive/v1/queues"
        );
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
        let q = filter_query(&a.filters);
        assert!(q.contains(&("queue", Some("orders".into()))));
        assert!(q.contains(&("state", Some("dead".into()))));
        assert!(q.contains(&("error_class", Some("permanent".into()))));
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
    fn server_errors_are_parsed() {
        let e = api_error(
            StatusCode::NOT_FOUND,
            r#"{"error":{"code":"not_found","message":"no message 01J"}}"#,
        );
        assert_eq!(e.to_string(), "not_found: no message 01J");
        let e = api_error(StatusCode::BAD_GATEWAY, "upstream down");
        assert_eq!(e.to_string(), "http_502: upstream down");
        let e = api_error(StatusCode::SERVICE_UNAVAILABLE, "");
        assert_eq!(e.to_string(), "http_503: Service Unavailable");
    }

    #[test]
    fn messages_table_is_compact() {
        let answer = json!({"messages": [
            {"id": "01AAA", "queue": "orders", "state": "dead", "attempts": 8, "key": "u1",
             "last_error": {"class": "transient", "message": "HTTP 503 from payments\nretry later", "at": "x"}},
            {"id": "01BBB", "queue": "orders", "state": "ready", "attempts": 0}
        ], "next_cursor": null});
        let text = messages_table(&answer).render();
        assert_eq!(
            text,
            "id     queue   state  attempts  key  last error\n\
             01AAA  orders  dead          8  u1   transient: HTTP 503 from payments retry later\n\
             01BBB  orders  ready         0  -    -\n"
        );
    }

    #[test]
    fn queues_table_shows_counts() {
        let q = json!({"queue": "orders", "counts": {"scheduled": 1, "ready": 20, "leased": 3, "done": 400, "dead": 2},
                       "oldest_ready_age_seconds": 90.4, "policy_summary": "exponential"});
        let empty = json!({"queue": "idle", "counts": {}, "oldest_ready_age_seconds": null});
        let text = queues_table(&[q, empty]).render();
        assert_eq!(
            text,
            "queue   scheduled  ready  leased  done  dead  oldest ready  policy\n\
             orders          1     20       3   400     2        1m 30s  exponential\n\
             idle            -      -       -     -     -             -\n"
        );
    }
}
