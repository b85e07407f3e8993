//! Start a real server for a test, and small helpers to drive it over HTTP.

use redrive_server::{Config, Server};
use serde_json::{json, Value};
use std::net::SocketAddr;
use tokio::sync::oneshot;

/// A test config: small limits and fast, deterministic retries (fixed 50 ms, no
/// jitter), so a retry comes back within a long poll and bad-size cases are cheap.
pub const FAST: &str = r#"
max_payload_bytes = 1024
max_request_bytes = 4096
max_batch = 20
[queues.default.retry]
max_attempts = 3
backoff = "fixed"
initial_delay = "50ms"
jitter = "none"
"#;

/// `[[tokens]]` sections for a test config: (name, secret, scopes) each.
pub fn tokens_toml(tokens: &[(&str, &str, &[&str])]) -> String {
    tokens
        .iter()
        .map(|(name, secret, scopes)| {
            format!("[[tokens]]\nname = {name:?}\nsecret = {secret:?}\nscopes = {scopes:?}\n")
        })
        .collect()
}

/// A running server; shut down (gracefully) on drop of `stop`.
pub struct TestServer {
    pub addr: SocketAddr,
    pub client: reqwest::Client,
    pub _dir: tempfile::TempDir,
    /// Bearer token sent by every helper, if set.
    pub token: Option<String>,
    /// The server's engine: its store and its test signals.
    pub engine: std::sync::Arc<redrive_server::engine::Engine>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    /// The shared store of this server (a PostgreSQL schema or a MySQL database), when it
    /// runs on one.
    pub pg: Option<SharedDb>,
}

/// The suite on a shared store: with `REDRIVE_TEST_STORAGE_URL=postgres://…` every server of
/// the suite keeps its store in a fresh schema of that database, with
/// `REDRIVE_TEST_STORAGE_URL=mysql://…` in a fresh database of that MySQL or MariaDB server;
/// dropped after the test (the same tests as on the embedded store; CI runs all three).
pub struct SharedDb {
    /// The URL the test's variable gave (for PostgreSQL, the database holding the schema).
    pub url: String,
    /// The PostgreSQL schema, or the MySQL database.
    pub schema: String,
    /// Whether dropping this drops the schema (false for a second server on it).
    owned: bool,
}

/// Whether this run of the suite keeps its stores on a shared store (PostgreSQL or MySQL),
/// not the embedded one.
pub fn on_shared_store() -> bool {
    std::env::var_os("REDRIVE_TEST_STORAGE_URL").is_some()
}

/// Whether this run of the suite keeps its stores on MySQL or MariaDB.
pub fn on_mysql() -> bool {
    std::env::var("REDRIVE_TEST_STORAGE_URL").is_ok_and(|u| u.starts_with("mysql://"))
}

/// The `mysql` client's arguments for the server of a `mysql://user[:pw]@host[:port]/db` URL.
fn mysql_args(url: &str) -> Vec<String> {
    let rest = url.trim_start_matches("mysql://");
    let (auth, hostport) = match rest
        .split_once('/')
        .map_or(rest, |(h, _)| h)
        .rsplit_once('@')
    {
        Some((a, h)) => (a, h),
        None => ("root", rest.split_once('/').map_or(rest, |(h, _)| h)),
    };
    let (user, pw) = auth.split_once(':').unwrap_or((auth, ""));
    let (host, port) = hostport.split_once(':').unwrap_or((hostport, "3306"));
    let mut args = vec![
        "-h".to_owned(),
        host.to_owned(),
        "-P".to_owned(),
        port.to_owned(),
        "-u".to_owned(),
        user.to_owned(),
    ];
    if !pw.is_empty() {
        args.push(format!("-p{pw}"));
    }
    args
}

/// `psql -Atc sql` on the PostgreSQL database of `url`: its output, trimmed.
pub fn psql(url: &str, sql: &str) -> String {
    let out = std::process::Command::new("psql")
        .arg(url)
        .args(["-Atc", sql])
        .output()
        .expect("psql");
    assert!(out.status.success(), "psql {sql}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Run `sql` with the `mysql` client on the server of `url`; its output.
fn mysql(url: &str, sql: &str) -> String {
    let out = std::process::Command::new("mysql")
        .args(mysql_args(url))
        .args(["-N", "-B", "-e", sql])
        .output()
        .expect("the mysql client");
    assert!(
        out.status.success(),
        "mysql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl SharedDb {
    fn fresh() -> Option<SharedDb> {
        let url = std::env::var("REDRIVE_TEST_STORAGE_URL").ok()?;
        Some(Self::fresh_at(url))
    }

    fn is_mysql(&self) -> bool {
        self.url.starts_with("mysql://")
    }

    /// The server's `storage_url`: the test's URL, or on MySQL the URL of this database.
    pub fn storage_url(&self) -> String {
        if self.is_mysql() {
            let rest = self.url.trim_start_matches("mysql://");
            let host = rest.split_once('/').map_or(rest, |(h, _)| h);
            format!("mysql://{host}/{}", self.schema)
        } else {
            self.url.clone()
        }
    }

    /// A fresh schema (PostgreSQL) or database (MySQL) on the server at `url`.
    fn fresh_at(url: String) -> SharedDb {
        static STALE: std::sync::Once = std::sync::Once::new();
        let is_mysql = url.starts_with("mysql://");
        STALE.call_once(|| {
            if is_mysql {
                for db in mysql(&url, "SHOW DATABASES LIKE 'redrive\\_it\\_%'").lines() {
                    drop_schema(&url, db.trim());
                }
                return;
            }
            let out = std::process::Command::new("psql")
                .arg(&url)
                .args([
                    "-Atc",
                    "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'redrive\\_it\\_%'",
                ])
                .output();
            if let Ok(out) = out {
                for schema in String::from_utf8_lossy(&out.stdout).lines() {
                    drop_schema(&url, schema.trim());
                }
            }
        });
        let n: u64 = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            ^ u64::from(std::process::id()) << 32;
        let schema = format!("redrive_it_{n:x}");
        if is_mysql {
            mysql(&url, &format!("CREATE DATABASE {schema}"));
        }
        SharedDb {
            url,
            schema,
            owned: true,
        }
    }
}

/// Drop `schema` (or on MySQL the database), waiting at most 30 s for locks.
fn drop_schema(url: &str, schema: &str) {
    if url.starts_with("mysql://") {
        let _ = std::process::Command::new("mysql")
            .args(mysql_args(url))
            .args([
                "-e",
                &format!("SET SESSION lock_wait_timeout = 30; DROP DATABASE IF EXISTS {schema}"),
            ])
            .output();
        return;
    }
    let _ = std::process::Command::new("psql")
        .arg(url)
        .args(["-qc", "SET lock_timeout = '30s'"])
        .args(["-qc", &format!("DROP SCHEMA IF EXISTS {schema} CASCADE")])
        .output();
}

impl Drop for SharedDb {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // On a thread of its own, not waited for: this drop runs on the test's runtime,
        // whose tasks (the server's connections) must keep running to end what they hold,
        // or the DROP would wait for them for ever. Schemas a run leaves behind are dropped
        // at the next run's first start (`SharedDb::fresh`).
        let (url, schema) = (self.url.clone(), self.schema.clone());
        std::thread::spawn(move || drop_schema(&url, &schema));
    }
}

/// Answer of a request: status and JSON body (`Null` if the body is not JSON).
pub type Answer = (u16, Value);

impl TestServer {
    /// Start with the default config plus `toml` (may be empty).
    pub async fn start(toml_text: &str) -> TestServer {
        Self::start_with_clock(
            toml_text,
            std::sync::Arc::new(redrive_server::engine::SystemClock::default()),
        )
        .await
    }

    /// [`TestServer::start`] with the engine reading the time from `clock`.
    pub async fn start_with_clock(
        toml_text: &str,
        clock: std::sync::Arc<dyn redrive_server::engine::Clock>,
    ) -> TestServer {
        Self::start_on(toml_text, clock, SharedDb::fresh(), |store| store).await
    }

    /// [`TestServer::start_with_clock`] over a store that fails on demand
    /// ([`redrive_server::testing::FaultyStore`], answered too).
    pub async fn start_with_faulty_store(
        toml_text: &str,
        clock: std::sync::Arc<dyn redrive_server::engine::Clock>,
    ) -> (
        TestServer,
        std::sync::Arc<redrive_server::testing::FaultyStore>,
    ) {
        let slot = std::sync::Arc::new(std::sync::OnceLock::new());
        let wrap = {
            let slot = slot.clone();
            move |store| {
                let faulty = std::sync::Arc::new(redrive_server::testing::FaultyStore::new(store));
                let _ = slot.set(faulty.clone());
                faulty as std::sync::Arc<dyn redrive_storage::Store>
            }
        };
        let s = Self::start_on(toml_text, clock, SharedDb::fresh(), wrap).await;
        let faulty = slot.get().expect("the store was wrapped").clone();
        (s, faulty)
    }

    /// Start on PostgreSQL whatever the run: `REDRIVE_TEST_STORAGE_URL` when it is a
    /// PostgreSQL URL, else the local `postgres://root@127.0.0.1:5432/test` (for what only
    /// PostgreSQL does).
    pub async fn start_on_postgres(toml_text: &str) -> TestServer {
        let url = std::env::var("REDRIVE_TEST_STORAGE_URL")
            .ok()
            .filter(|u| u.starts_with("postgres"))
            .unwrap_or_else(|| "postgres://root@127.0.0.1:5432/test".to_owned());
        Self::start_on_db(toml_text, SharedDb::fresh_at(url)).await
    }

    /// Start on a store several nodes can share (for a cluster): `REDRIVE_TEST_STORAGE_URL`
    /// (PostgreSQL or MySQL), else the local `postgres://root@127.0.0.1:5432/test`.
    pub async fn start_shared(toml_text: &str) -> TestServer {
        let url = std::env::var("REDRIVE_TEST_STORAGE_URL")
            .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".to_owned());
        Self::start_on_db(toml_text, SharedDb::fresh_at(url)).await
    }

    async fn start_on_db(toml_text: &str, db: SharedDb) -> TestServer {
        Self::start_on(
            toml_text,
            std::sync::Arc::new(redrive_server::engine::SystemClock::default()),
            Some(db),
            |store| store,
        )
        .await
    }

    /// Another server on this one's shared store (a second node of its cluster), with
    /// the default config plus `toml`; the schema is dropped with this server, not that one.
    pub async fn start_beside(&self, toml_text: &str) -> TestServer {
        let pg = self.pg.as_ref().expect("a server on a shared store");
        let db = SharedDb {
            url: pg.url.clone(),
            schema: pg.schema.clone(),
            owned: false,
        };
        Self::start_on_db(toml_text, db).await
    }

    async fn start_on(
        toml_text: &str,
        clock: std::sync::Arc<dyn redrive_server::engine::Clock>,
        pg: Option<SharedDb>,
        wrap: impl FnOnce(
            std::sync::Arc<dyn redrive_storage::Store>,
        ) -> std::sync::Arc<dyn redrive_storage::Store>,
    ) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("redrive.toml");
        std::fs::write(&path, toml_text).unwrap();
        let overrides = redrive_server::Overrides {
            listen: Some("127.0.0.1:0".into()),
            data_dir: Some(dir.path().join("data")),
            storage_url: pg.as_ref().map(SharedDb::storage_url),
        };
        let env: Vec<(String, String)> = pg
            .iter()
            .filter(|p| !p.is_mysql())
            .map(|p| ("REDRIVE_STORAGE_SCHEMA".to_owned(), p.schema.clone()))
            .collect();
        let config = Config::load(Some(&path), env, &overrides).unwrap();
        let server = Server::bind_wrapping_store(config, clock, wrap)
            .await
            .unwrap();
        let addr = server.local_addr();
        let engine = server.engine().clone();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .run(async move {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
        TestServer {
            addr,
            client: reqwest::Client::new(),
            _dir: dir,
            token: None,
            engine,
            stop: Some(tx),
            task: Some(task),
            pg,
        }
    }

    /// Start with [`FAST`] followed by `extra` (queue sections, …; top-level keys must
    /// go before [`FAST`], whose last lines are a table).
    pub async fn fast(extra: &str) -> TestServer {
        Self::start(&format!("{FAST}\n{extra}")).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// A request builder with the bearer token, if any.
    pub fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let b = self.client.request(method, self.url(path));
        match &self.token {
            Some(t) => b.bearer_auth(t),
            None => b,
        }
    }

    async fn answer(r: reqwest::Response) -> Answer {
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Send a request; the body is JSON when given.
    pub async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Answer {
        let mut b = self.req(method, path);
        if let Some(body) = body {
            b = b.json(&body);
        }
        Self::answer(b.send().await.unwrap()).await
    }

    /// Send a request and return status, content type and raw text.
    pub async fn send_text(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<String>,
    ) -> (u16, String, String) {
        let mut b = self.req(method, path);
        if let Some(body) = body {
            b = b
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        let r = b.send().await.unwrap();
        let status = r.status().as_u16();
        let ctype = r
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        (status, ctype, r.text().await.unwrap())
    }

    /// POST JSON, return (status, body).
    pub async fn post(&self, path: &str, body: Value) -> Answer {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    /// POST a raw body (sent as `application/json`, whatever it holds).
    pub async fn post_raw(&self, path: &str, body: &str) -> Answer {
        let r = self
            .req(reqwest::Method::POST, path)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        Self::answer(r).await
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send(reqwest::Method::GET, path, None).await
    }

    pub async fn get_text(&self, path: &str) -> (u16, String) {
        let (st, _, text) = self.send_text(reqwest::Method::GET, path, None).await;
        (st, text)
    }

    pub async fn delete(&self, path: &str) -> Answer {
        self.send(reqwest::Method::DELETE, path, None).await
    }

    // ---- API helpers that assert the success status and return the body ----

    /// Publish (single or batch body) and expect 201.
    pub async fn publish(&self, queue: &str, body: Value) -> Value {
        let (st, m) = self
            .post(&format!("/v1/queues/{queue}/messages"), body)
            .await;
        assert_eq!(st, 201, "publish to {queue}: {m}");
        m
    }

    /// Publish `{"payload": payload}` and return the id.
    pub async fn publish_payload(&self, queue: &str, payload: Value) -> String {
        id_of(&self.publish(queue, json!({ "payload": payload })).await)
    }

    /// Lease with `body`, expect 200, return the leased messages.
    pub async fn lease(&self, queue: &str, body: Value) -> Vec<Value> {
        let (st, l) = self.post(&format!("/v1/queues/{queue}/leases"), body).await;
        assert_eq!(st, 200, "lease from {queue}: {l}");
        l["messages"]
            .as_array()
            .unwrap_or_else(|| panic!("no messages array: {l}"))
            .clone()
    }

    /// Long-poll (up to `wait`) for exactly one message.
    pub async fn lease_one(&self, queue: &str, wait: &str) -> Value {
        let got = self.lease(queue, json!({"max": 1, "wait": wait})).await;
        assert_eq!(got.len(), 1, "expected one message from {queue}: {got:?}");
        got[0].clone()
    }

    /// Ack `id` with `lease`.
    pub async fn ack(&self, id: &str, lease: &str) -> Answer {
        self.post(&format!("/v1/messages/{id}/ack"), json!({ "lease": lease }))
            .await
    }

    /// Nack `id` with `lease` and `error` (`{"class": …}`).
    pub async fn nack(&self, id: &str, lease: &str, error: Value) -> Answer {
        self.post(
            &format!("/v1/messages/{id}/nack"),
            json!({ "lease": lease, "error": error }),
        )
        .await
    }

    /// GET a message, expect 200.
    pub async fn message(&self, id: &str) -> Value {
        let (st, m) = self.get(&format!("/v1/messages/{id}")).await;
        assert_eq!(st, 200, "get {id}: {m}");
        m
    }

    /// The counts per state of `queue` (`{"scheduled": n, "ready": n, …}`).
    pub async fn counts(&self, queue: &str) -> Value {
        let (st, q) = self.get(&format!("/v1/queues/{queue}")).await;
        assert_eq!(st, 200, "queue {queue}: {q}");
        q["counts"].clone()
    }

    /// Counts of every queue, for "nothing changed" checks.
    pub async fn snapshot(&self) -> Value {
        let (st, q) = self.get("/v1/queues").await;
        assert_eq!(st, 200, "queues: {q}");
        let mut out = serde_json::Map::new();
        for x in q["queues"].as_array().unwrap() {
            out.insert(x["queue"].as_str().unwrap().to_owned(), x["counts"].clone());
        }
        let (st, all) = self.get("/v1/messages?limit=1000").await;
        assert_eq!(st, 200, "search: {all}");
        out.insert("__messages".into(), all["messages"].clone());
        Value::Object(out)
    }

    /// [`TestServer::stop`], handing back its shared store's schema (dropped when the caller
    /// drops it): for a node stopped while another still uses the schema.
    pub async fn stop_keeping_schema(mut self) -> Option<SharedDb> {
        let pg = self.pg.take();
        self.stop().await;
        pg
    }

    /// The message `id` once it is `done` (asserted; polled for at most 10 s).
    pub async fn done_message(&self, id: &str) -> Value {
        for _ in 0..500 {
            if self.message(id).await["state"] == "done" {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let full = self.message(id).await;
        assert_eq!(full["state"], "done", "{full}");
        full
    }

    /// Graceful stop, waiting for the store to close.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap();
        }
    }
}

/// Wait (at most 10 s) for the consume driver's report that the ack of one message of
/// `queue` failed in the store (`Signal::StoreFault`), and check it says exactly that.
pub async fn ack_fault_reported(signals: &mut redrive_server::engine::SignalReceiver, queue: &str) {
    use redrive_server::engine::Signal;
    let fault = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        signals.wait_for(|sig| matches!(sig, Signal::StoreFault { .. })),
    )
    .await
    .expect("no StoreFault signal");
    assert_eq!(
        fault,
        Some(Signal::StoreFault {
            queue: queue.into(),
            operation: "ack",
            count: 1
        })
    );
}

/// The `id` of a message body.
pub fn id_of(m: &Value) -> String {
    m["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id: {m}"))
        .to_owned()
}

/// The `lease` token of a leased message.
pub fn lease_of(m: &Value) -> String {
    m["lease"]
        .as_str()
        .unwrap_or_else(|| panic!("no lease: {m}"))
        .to_owned()
}

/// A timestamp field as Unix milliseconds; panics (printing `m`) if it is not RFC 3339 UTC.
pub fn ms(m: &Value, field: &str) -> i64 {
    let s = m[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} missing or not a string: {m}"));
    assert!(s.ends_with('Z'), "{field} is not UTC: {m}");
    redrive_core::Timestamp::parse(s)
        .unwrap_or_else(|_| panic!("{field} is not RFC 3339: {m}"))
        .as_millis()
}

/// A count of a `counts` object.
pub fn count(counts: &Value, state: &str) -> u64 {
    counts[state]
        .as_u64()
        .unwrap_or_else(|| panic!("no count {state}: {counts}"))
}

/// The counts object with exactly these non-zero entries.
pub fn counts_of(pairs: &[(&str, u64)]) -> Value {
    let mut c = json!({"scheduled": 0, "ready": 0, "leased": 0, "done": 0, "dead": 0});
    for (k, v) in pairs {
        c[*k] = json!(v);
    }
    c
}

/// A random, well-formed message id that exists nowhere.
pub fn unknown_id() -> String {
    "0190b5c2-7d1e-7c3a-9f00-1a2b3c4d5e6f".to_owned()
}

/// Assert a 200 answer and return its body.
pub fn ok(got: Answer) -> Value {
    assert_eq!(got.0, 200, "body: {}", got.1);
    got.1
}

/// Assert an error answer: status and code, and a non-empty message.
pub fn assert_error(got: &Answer, status: u16, code: &str) {
    assert_eq!(got.0, status, "body: {}", got.1);
    assert_eq!(got.1["error"]["code"], code, "body: {}", got.1);
    assert!(
        got.1["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "body: {}",
        got.1
    );
}

/// [`assert_error`], and the message names `needle` (a field, an index …).
pub fn assert_error_names(got: &Answer, status: u16, code: &str, needle: &str) {
    assert_error(got, status, code);
    let msg = got.1["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains(needle),
        "error message should name {needle:?}; body: {}",
        got.1
    );
}

/// Whether php-cli answers `ok` to the PHP code `check`; under CI it must (the test fails
/// saying `needs`), elsewhere a test without it is skipped, saying what to install.
pub fn php_has(check: &str, needs: &str) -> bool {
    let php = std::process::Command::new("php")
        .args(["-r", check])
        .output();
    if php.as_ref().is_ok_and(|o| o.stdout == b"ok") {
        return true;
    }
    assert!(
        std::env::var("CI").is_err(),
        "{needs} is needed under CI: {php:?}"
    );
    eprintln!("skipped: {needs} is not installed");
    false
}
