//! Push delivery (SPEC §10) against real HTTP endpoints on loopback: a small axum server
//! per test answers what the test scripts, and records every request it got.

use crate::harness::*;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request the mock endpoint got.
#[derive(Debug, Clone)]
pub struct Got {
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    pub path: String,
}

/// What the mock answers: status, headers, body, and a delay before answering.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    pub delay: Duration,
}

impl Answer {
    pub fn status(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: String::new(),
            delay: Duration::ZERO,
        }
    }
    fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }
    fn body(mut self, body: &str) -> Self {
        self.body = body.to_owned();
        self
    }
    fn delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
}

type Script = Box<dyn Fn(&Got, usize) -> Answer + Send + Sync>;

/// A loopback endpoint: answers by `script(request, how many requests this webhook-id got
/// before)`, records every request.
#[derive(Clone)]
pub struct Mock {
    pub addr: SocketAddr,
    got: Arc<Mutex<Vec<Got>>>,
    script: Arc<Mutex<Script>>,
}

impl Mock {
    pub async fn start(script: impl Fn(&Got, usize) -> Answer + Send + Sync + 'static) -> Mock {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mock = Mock {
            addr,
            got: Arc::default(),
            script: Arc::new(Mutex::new(Box::new(script))),
        };
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(mock.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        mock
    }

    pub fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Requests for one message.
    pub fn for_id(&self, id: &str) -> Vec<Got> {
        self.got()
            .into_iter()
            .filter(|g| g.headers.get("webhook-id").map(String::as_str) == Some(id))
            .collect()
    }
}

async fn handle(
    State(mock): State<Mock>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let got = Got {
        headers: headers
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect(),
        body: body.to_vec(),
        path: uri.path().to_owned(),
    };
    let answer = {
        let mut all = mock.got.lock().unwrap();
        let before = all
            .iter()
            .filter(|g| g.headers.get("webhook-id") == got.headers.get("webhook-id"))
            .count();
        all.push(got.clone());
        (mock.script.lock().unwrap())(&got, before)
    };
    if !answer.delay.is_zero() {
        tokio::time::sleep(answer.delay).await;
    }
    let mut r = (
        StatusCode::from_u16(answer.status).unwrap(),
        answer.body.clone(),
    )
        .into_response();
    for (k, v) in answer.headers {
        r.headers_mut().insert(k, v.parse().unwrap());
    }
    r
}

/// A server with one push queue `hooks` to `url`, loopback allowed, fast fixed retries.
async fn server(url: &str, extra_push: &str, allow_loopback: bool) -> TestServer {
    server_with(url, extra_push, allow_loopback, 3, "50ms").await
}

/// [`server`] with `max_attempts` and a fixed retry `delay` of its own.
async fn server_with(
    url: &str,
    extra_push: &str,
    allow_loopback: bool,
    max_attempts: u32,
    delay: &str,
) -> TestServer {
    TestServer::start(&push_config(
        url,
        extra_push,
        allow_loopback,
        max_attempts,
        delay,
    ))
    .await
}

/// The configuration of [`server_with`].
fn push_config(
    url: &str,
    extra_push: &str,
    allow_loopback: bool,
    max_attempts: u32,
    delay: &str,
) -> String {
    let allow = if allow_loopback {
        "[push]\nallow_cidrs = [\"127.0.0.1/32\"]\n"
    } else {
        ""
    };
    format!(
        r#"{allow}
[queues.hooks]
delivery = "push"
[queues.hooks.push]
url = "{url}"
timeout = "500ms"
connect_timeout = "200ms"
signing_secret = "{SECRET}"
{extra_push}
[queues.hooks.retry]
max_attempts = {max_attempts}
backoff = "fixed"
initial_delay = "{delay}"
jitter = "none"
"#
    )
}

/// An endpoint that answers 500 while the flag is set, 200 after.
async fn switchable() -> (Mock, Arc<std::sync::atomic::AtomicBool>) {
    let down = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let d = down.clone();
    let mock = Mock::start(move |_, _| {
        Answer::status(if d.load(std::sync::atomic::Ordering::SeqCst) {
            500
        } else {
            200
        })
    })
    .await;
    (mock, down)
}

/// Wait (polling, up to 20 s) until the message is in `state`; return it.
async fn until_state(s: &TestServer, id: &str, state: &str) -> Value {
    for _ in 0..2_000 {
        let m = s.message(id).await;
        if m["state"] == state {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{id} never became {state}: {}", s.message(id).await);
}

fn responses(m: &Value) -> Vec<Value> {
    m["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["response"].clone())
        .collect()
}

/// Issue 17: a store fault while acking a delivered push is survived by the push worker
/// (the consume driver's policy): the message stays leased, and once its lease (timeout
/// 500 ms + 5 s) expires it is pushed again (at least once) and done.
#[tokio::test]
async fn a_store_fault_while_acking_a_push_is_survived_and_the_message_is_pushed_again() {
    let mock = Mock::start(|_, _| Answer::status(200)).await;
    let (s, store) = TestServer::start_with_faulty_store(
        &push_config(&mock.url("/hook"), "", true, 3, "50ms"),
        Arc::new(redrive_server::engine::SystemClock::default()),
    )
    .await;
    let mut signals = s.engine.signals().subscribe();
    store.fail_acks(1);
    let id = id_of(&s.publish("hooks", json!({"payload": {"n": 1}})).await);
    crate::harness::ack_fault_reported(&mut signals, "hooks").await;
    assert_eq!(store.acks_failed(), 1);
    assert_eq!(mock.for_id(&id).len(), 1);
    assert_eq!(s.message(&id).await["state"], "leased", "its ack was lost");
    let done = until_state(&s, &id, "done").await;
    assert_eq!(mock.for_id(&id).len(), 2, "pushed again after its lease");
    assert!(
        done["history"].to_string().contains("lease_expired"),
        "the lost ack shows as an expired lease: {done}"
    );
    let metrics = s.get_text("/metrics").await.1;
    let line = "redrive_consume_store_faults_total{queue=\"hooks\",operation=\"ack\"} 1";
    assert!(metrics.contains(line), "{line} not in:\n{metrics}");
    s.stop().await;
}

#[tokio::test]
async fn a_delivered_push_is_signed_carries_headers_and_payload_and_is_done() {
    let mock = Mock::start(|_, _| Answer::status(200).body("thanks")).await;
    let s = server(&mock.url("/hook"), "", true).await;
    let m = s
        .publish(
            "hooks",
            json!({"payload": {"order": 42, "note": "é"}, "headers": {"x-merchant": "m-1"}}),
        )
        .await;
    let id = id_of(&m);
    let done = until_state(&s, &id, "done").await;
    let got = mock.for_id(&id);
    assert_eq!(got.len(), 1, "{got:?}");
    let g = &got[0];
    assert_eq!(g.path, "/hook");
    assert_eq!(g.headers["content-type"], "application/json");
    assert_eq!(g.headers["x-merchant"], "m-1");
    assert_eq!(g.headers["redrive-attempt"], "1");
    let body: Value = serde_json::from_slice(&g.body).unwrap();
    assert_eq!(body, json!({"order": 42, "note": "é"}));
    let ts: i64 = g.headers["webhook-timestamp"].parse().unwrap();
    let secret = redrive_push::signing::Secret::parse(SECRET).unwrap();
    redrive_push::signing::verify(
        &secret,
        &g.headers["webhook-signature"],
        &id,
        ts,
        &g.body,
        ts,
        5,
    )
    .expect("the signature verifies as a Standard Webhooks receiver checks it");
    let r = responses(&done);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0]["status"], 200);
    assert_eq!(r[0]["body"], "thanks");
    assert!(r[0]["latency_ms"].is_u64(), "{r:?}");
    s.stop().await;
}

#[tokio::test]
async fn each_class_of_answer_does_what_the_spec_says() {
    // The payload says what the endpoint answers on the first attempt; the second is 200.
    let mock = Mock::start(|g, before| {
        if before > 0 {
            return Answer::status(200);
        }
        let p: Value = serde_json::from_slice(&g.body).unwrap();
        match p["answer"].as_str().unwrap() {
            "503" => Answer::status(503).body("busy"),
            "503-ra" => Answer::status(503).header("retry-after", "1"),
            "429-date" => {
                let in_one_s = std::time::SystemTime::now() + Duration::from_secs(2);
                Answer::status(429).header("retry-after", &httpdate(in_one_s))
            }
            "404" => Answer::status(404),
            "410" => Answer::status(410).body("gone for good"),
            "302" => Answer::status(302).header("location", "/elsewhere"),
            "slow" => Answer::status(200).delay(Duration::from_millis(1_500)),
            other => panic!("{other}"),
        }
    })
    .await;
    let s = server(&mock.url("/hook"), "", true).await;
    let mut ids = HashMap::new();
    for a in ["503", "503-ra", "429-date", "404", "410", "302", "slow"] {
        let m = s.publish("hooks", json!({"payload": {"answer": a}})).await;
        ids.insert(a, id_of(&m));
    }
    // 503 without Retry-After: transient, retried after the policy's 50 ms, then done.
    let m = until_state(&s, &ids["503"], "done").await;
    let h = m["history"].as_array().unwrap();
    assert_eq!(h[0]["error"]["class"], "transient", "{m}");
    assert_eq!(h[0]["error"]["code"], "http_503");
    assert_eq!(h[0]["response"]["status"], 503);
    assert_eq!(h[0]["response"]["body"], "busy");
    assert_eq!(h[0]["delay_ms"], 50);
    // 503 with Retry-After in seconds: rate_limited, waits that long.
    let m = until_state(&s, &ids["503-ra"], "done").await;
    let h = &m["history"][0];
    assert_eq!(h["error"]["class"], "rate_limited", "{m}");
    assert_eq!(h["retry_after_ms"], 1_000);
    assert!(h["delay_ms"].as_u64().unwrap() >= 1_000, "{h}");
    // 429 with an HTTP date: rate_limited, retry_after from the date (about 2 s, whole seconds).
    let m = until_state(&s, &ids["429-date"], "done").await;
    let h = &m["history"][0];
    assert_eq!(h["error"]["class"], "rate_limited", "{m}");
    let ra = h["retry_after_ms"].as_u64().unwrap();
    assert!((1_000..=3_000).contains(&ra), "{h}");
    // 404: permanent, dead at once.
    let m = until_state(&s, &ids["404"], "dead").await;
    assert_eq!(m["dead_reason"], "permanent_error", "{m}");
    assert_eq!(mock.for_id(&ids["404"]).len(), 1);
    // 410: dead, endpoint_gone.
    let m = until_state(&s, &ids["410"], "dead").await;
    assert_eq!(m["dead_reason"], "endpoint_gone", "{m}");
    assert_eq!(m["history"][0]["response"]["body"], "gone for good");
    // 302: not followed (nothing reached /elsewhere), permanent.
    let m = until_state(&s, &ids["302"], "dead").await;
    assert_eq!(m["history"][0]["response"]["status"], 302, "{m}");
    assert!(
        mock.got().iter().all(|g| g.path == "/hook"),
        "a redirect was followed"
    );
    // Slower than the 500 ms timeout: transient, no status, then done on the next attempt
    // (which the mock also delays: it is retried until max_attempts, so look at the first).
    let m = loop {
        let m = s.message(&ids["slow"]).await;
        if m["history"].as_array().is_some_and(|h| !h.is_empty()) {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let h = &m["history"][0];
    assert_eq!(h["error"]["class"], "transient", "{m}");
    assert_eq!(h["error"]["code"], "timeout");
    assert!(h["response"]["status"].is_null(), "{h}");
    assert!(
        h["error"]["message"].as_str().unwrap().contains("500ms"),
        "{h}"
    );
    s.stop().await;
}

fn httpdate(t: std::time::SystemTime) -> String {
    let secs = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let dt = time::OffsetDateTime::from_unix_timestamp(secs).unwrap();
    dt.format(&time::format_description::well_known::Rfc2822)
        .unwrap()
        .replace("+0000", "GMT")
}

#[tokio::test]
async fn connection_refused_is_transient_and_retried() {
    // A port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let s = server(&format!("http://127.0.0.1:{port}/hook"), "", true).await;
    let id = id_of(&s.publish("hooks", json!({"payload": 1})).await);
    let m = until_state(&s, &id, "dead").await;
    assert_eq!(m["dead_reason"], "max_attempts", "{m}");
    let h = m["history"].as_array().unwrap();
    assert_eq!(h.len(), 3, "{m}");
    for e in h {
        assert_eq!(e["error"]["class"], "transient", "{e}");
        assert_eq!(e["error"]["code"], "connect_error", "{e}");
    }
    s.stop().await;
}

#[tokio::test]
async fn loopback_is_refused_unless_allowed_and_nothing_is_sent() {
    let mock = Mock::start(|_, _| Answer::status(200)).await;
    for url in [
        mock.url("/hook"),
        format!("http://localhost:{}/hook", mock.addr.port()),
    ] {
        let s = server(&url, "", false).await;
        let id = id_of(&s.publish("hooks", json!({"payload": 1})).await);
        let m = until_state(&s, &id, "dead").await;
        assert_eq!(m["dead_reason"], "permanent_error", "{url}: {m}");
        let e = &m["history"][0]["error"];
        assert_eq!(e["code"], "ssrf_refused", "{url}: {m}");
        assert!(
            e["message"].as_str().unwrap().contains("allow_cidrs"),
            "{url}: {m}"
        );
        s.stop().await;
    }
    assert!(mock.got().is_empty(), "a refused push reached the endpoint");
}

#[tokio::test]
async fn a_push_queue_has_no_pull_consumers_and_its_endpoint_is_listed() {
    let mock = Mock::start(|_, _| Answer::status(200)).await;
    let s = server(
        &mock.url("/hook"),
        "concurrency = 4\nrate_limit = \"100/s\"",
        true,
    )
    .await;
    let got = s.post("/v1/queues/hooks/leases", json!({})).await;
    assert_error(&got, 409, "push_queue");
    let (status, list) = s.get("/v1/endpoints").await;
    assert_eq!(status, 200);
    let e = &list["endpoints"][0];
    assert_eq!(
        e["endpoint"],
        format!("http://127.0.0.1:{}", mock.addr.port())
    );
    assert_eq!(e["queues"], json!(["hooks"]));
    assert_eq!(e["state"], "closed");
    assert_eq!(e["concurrency"], 4);
    assert_eq!(e["rate_limit_per_second"], 100.0);
    let (_, q) = s.get("/v1/queues/hooks").await;
    assert_eq!(q["delivery"], "push");
    let (_, q) = s.get("/v1/queues/other").await;
    assert_eq!(q["delivery"], "pull");
    s.stop().await;
}

/// SPEC §13 on one node: the node's share of an endpoint's limits is the whole limit (the
/// embedded store is a cluster of one; on PostgreSQL this test's schema has one node too).
#[tokio::test]
async fn a_single_node_takes_the_whole_limit() {
    let mock = Mock::start(|_, _| Answer::status(200)).await;
    let s = server(
        &mock.url("/hook"),
        "concurrency = 5\nrate_limit = \"40/s\"",
        true,
    )
    .await;
    let mut e = Value::Null;
    for _ in 0..500 {
        let (_, list) = s.get("/v1/endpoints").await;
        e = list["endpoints"][0].clone();
        if !e["share"].is_null() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("single node share: {}", e["share"]);
    assert_eq!(e["concurrency"], 5, "{e}");
    assert_eq!(e["rate_limit_per_second"], 40.0, "{e}");
    assert_eq!(
        e["share"],
        json!({"nodes": 1, "rank": 0, "concurrency": 5, "rate_limit_per_second": 40.0}),
        "{e}"
    );
    // And it is used: a publish is delivered.
    let id = id_of(&s.publish("hooks", json!({"payload": 1})).await);
    until_state(&s, &id, "done").await;
    let (_, page) = s.get_text("/ui/endpoints").await;
    assert!(
        page.contains("this node (1 of 1): 5 in flight, 40.0/s"),
        "{page}"
    );
    // The API document states the share.
    let (_, d) = s.get("/openapi.json").await;
    let schemas = &d["components"]["schemas"];
    assert!(
        schemas["EndpointView"]["properties"]["share"].is_object(),
        "{}",
        schemas["EndpointView"]
    );
    for field in ["nodes", "rank", "concurrency", "rate_limit_per_second"] {
        assert!(
            schemas["ShareView"]["properties"][field].is_object(),
            "ShareView.{field}: {}",
            schemas["ShareView"]
        );
    }
    s.stop().await;
}

/// SPEC §13, the shared breaker on one node: a trip recorded in the store by another process
/// (as another node's breaker opening would) holds this node's breaker open for the rest of
/// its period, calling nothing, though its own calls all succeeded; then it probes and
/// delivers again. Its own trips are not applied back to it.
#[tokio::test]
async fn another_nodes_trip_holds_this_breaker_open_for_its_period() {
    let mock = Mock::start(|_, _| Answer::status(200)).await;
    let s = server(&mock.url("/hook"), "concurrency = 2", true).await;
    let first = id_of(&s.publish("hooks", json!({"payload": 0})).await);
    until_state(&s, &first, "done").await;
    let endpoint = format!("http://127.0.0.1:{}", mock.addr.port());
    let tripped = std::time::Instant::now();
    s.engine
        .store()
        .endpoint_trip(endpoint.clone(), "another-node".into(), 2_000, None)
        .await
        .unwrap();
    let opened = loop {
        let (_, list) = s.get("/v1/endpoints").await;
        let e = list["endpoints"][0].clone();
        if e["state"] == "open" {
            break e;
        }
        assert!(
            tripped.elapsed() < Duration::from_secs(2),
            "not open within 2 s of the trip: {e}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let took = tripped.elapsed();
    eprintln!("shared breaker, one node: open {took:?} after another node's trip was recorded");
    assert!(took < Duration::from_millis(1_000), "{took:?}");
    assert_eq!(opened["opened_total"], 1, "{opened}");
    assert_eq!(opened["window_failures"], 0, "{opened}");
    // Published while open: waits, not called.
    let calls = mock.got().len();
    let id = id_of(&s.publish("hooks", json!({"payload": 1})).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(mock.got().len(), calls, "called while the breaker was open");
    assert_eq!(s.message(&id).await["attempts"], 0);
    // After the 2 s period: a probe, delivered.
    until_state(&s, &id, "done").await;
    assert!(
        tripped.elapsed() >= Duration::from_millis(1_900),
        "delivered {:?} after a 2 s trip",
        tripped.elapsed()
    );
    // A trip of this node's own is not applied to it again.
    s.engine
        .store()
        .endpoint_trip(
            endpoint,
            s.engine.membership().incarnation().to_owned(),
            5_000,
            None,
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (_, list) = s.get("/v1/endpoints").await;
    assert_ne!(list["endpoints"][0]["state"], "open", "{list}");
    s.stop().await;
}

#[tokio::test]
async fn bad_push_config_is_refused_naming_the_key() {
    let cases = [
        ("[queues.q]\ndelivery = \"push\"", "queues.q.push.url"),
        ("[queues.q.push]\nurl = \"http://a.example/\"", "queues.q.push"),
        (
            "[queues.q]\ndelivery = \"push\"\n[queues.q.push]\nurl = \"ftp://a.example/\"",
            "queues.q.push.url",
        ),
        (
            "[queues.q]\ndelivery = \"push\"\n[queues.q.push]\nurl = \"http://a.example/\"\nmethod = \"GET\"",
            "queues.q.push.method",
        ),
        (
            "[queues.q]\ndelivery = \"push\"\n[queues.q.push]\nurl = \"http://a.example/\"\nrate_limit = \"fast\"",
            "queues.q.push.rate_limit",
        ),
        (
            "[queues.q]\ndelivery = \"push\"\n[queues.q.push]\nurl = \"http://a.example/\"\nsigning_secret = \"whsec_!!\"",
            "queues.q.push.signing_secret",
        ),
        (
            "[queues.q]\ndelivery = \"push\"\n[queues.q.push]\nurl = \"http://a.example/\"\n[[queues.q.push.rules]]\nstatus = \"6xx\"\noutcome = \"done\"",
            "queues.q.push.rules[0].status",
        ),
        (
            "[queues.q]\ndelivery = \"push\"\n[queues.q.push]\nurl = \"http://a.example/\"\n[[queues.q.push.rules]]\nstatus = \"409\"\noutcome = \"fine\"",
            "queues.q.push.rules[0].outcome",
        ),
        ("[push]\nallow_cidrs = [\"10.0.0.0/33\"]", "push.allow_cidrs[0]"),
        ("[queues.default]\ndelivery = \"push\"", "queues.default.delivery"),
    ];
    for (text, key) in cases {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, text).unwrap();
        let e = redrive_server::Config::load(Some(&p), Vec::new(), &Default::default())
            .expect_err(text)
            .to_string();
        assert!(e.contains(key), "{text}\n→ {e}\n(expected the key {key})");
    }
}

#[tokio::test]
async fn configured_rules_come_before_the_defaults() {
    // 409 means "already have it" for this endpoint: done. 404 is retried here.
    let mock = Mock::start(|g, _| {
        let p: Value = serde_json::from_slice(&g.body).unwrap();
        Answer::status(p.as_u64().unwrap() as u16)
    })
    .await;
    let s = server(
        &mock.url("/hook"),
        "[[queues.hooks.push.rules]]\nstatus = \"409\"\noutcome = \"done\"\n\
         [[queues.hooks.push.rules]]\nstatus = \"404\"\noutcome = \"transient\"",
        true,
    )
    .await;
    let a = id_of(&s.publish("hooks", json!({"payload": 409})).await);
    let b = id_of(&s.publish("hooks", json!({"payload": 404})).await);
    until_state(&s, &a, "done").await;
    let m = until_state(&s, &b, "dead").await;
    assert_eq!(m["dead_reason"], "max_attempts", "{m}");
    s.stop().await;
}

/// Sum of the attempts charged to `ids` (from their stored state).
async fn attempts_of(s: &TestServer, ids: &[String]) -> u64 {
    let mut n = 0;
    for id in ids {
        n += s.message(id).await["attempts"].as_u64().unwrap();
    }
    n
}

#[tokio::test]
async fn an_outage_opens_the_breaker_parks_uncharged_and_recovery_delivers_everything() {
    let (mock, down) = switchable().await;
    let s = server_with(&mock.url("/hook"), "concurrency = 4", true, 1000, "50ms").await;
    let mut ids = Vec::new();
    for i in 0..60 {
        ids.push(id_of(&s.publish("hooks", json!({"payload": i})).await));
    }
    // The endpoint fails every call: the breaker opens.
    let opened = loop {
        let (_, list) = s.get("/v1/endpoints").await;
        let e = list["endpoints"][0].clone();
        if e["state"] == "open" {
            break e;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(opened["opened_total"].as_u64().unwrap() >= 1, "{opened}");
    let calls_at_open = mock.got().len();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let calls_later = mock.got().len();
    // Open for 5 s: no call in that second (an in-flight call may still land).
    assert!(
        calls_later <= calls_at_open + 4,
        "calls went on while the breaker was open: {calls_at_open} → {calls_later}"
    );
    // Every attempt charged is a call the endpoint got: parking charged nothing.
    assert_eq!(attempts_of(&s, &ids).await, calls_later as u64);
    // Recovery: every message is delivered, none dead, and still one attempt per call.
    down.store(false, std::sync::atomic::Ordering::SeqCst);
    for id in &ids {
        until_state(&s, id, "done").await;
    }
    let calls = mock.got().len() as u64;
    assert_eq!(attempts_of(&s, &ids).await, calls);
    let (_, q) = s.get("/v1/queues/hooks").await;
    assert_eq!(q["counts"]["dead"], 0, "{q}");
    assert_eq!(q["counts"]["done"], 60, "{q}");
    let (_, list) = s.get("/v1/endpoints").await;
    assert_ne!(list["endpoints"][0]["state"], "open", "{list}");
    let metrics = s.get_text("/metrics").await.1;
    assert!(
        metrics.contains("redrive_push_attempts_total{endpoint=\"http://127.0.0.1:"),
        "{metrics}"
    );
    s.stop().await;
}

#[tokio::test]
async fn a_message_may_carry_its_own_target_when_the_queue_allows_it() {
    let default = Mock::start(|_, _| Answer::status(200)).await;
    let own = Mock::start(|_, _| Answer::status(200)).await;
    let s = server(&default.url("/hook"), "allow_message_targets = true", true).await;
    let m = s
        .publish(
            "hooks",
            json!({"payload": 1, "target_url": own.url("/merchant/7/notify")}),
        )
        .await;
    let id = id_of(&m);
    assert_eq!(m["target_url"], own.url("/merchant/7/notify"), "{m}");
    let done = until_state(&s, &id, "done").await;
    assert_eq!(done["target_url"], own.url("/merchant/7/notify"));
    assert_eq!(own.for_id(&id).len(), 1);
    assert_eq!(own.got()[0].path, "/merchant/7/notify");
    assert!(default.got().is_empty(), "the queue's url was called");
    // The target's endpoint is listed beside the configured one.
    let (_, list) = s.get("/v1/endpoints").await;
    let keys: Vec<&str> = list["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["endpoint"].as_str().unwrap())
        .collect();
    assert!(
        keys.contains(&format!("http://127.0.0.1:{}", own.addr.port()).as_str()),
        "{list}"
    );
    // A private address a message names is refused like a configured one: nothing sent.
    let m = s
        .publish(
            "hooks",
            json!({"payload": 2, "target_url": "http://10.1.2.3:8080/x"}),
        )
        .await;
    let dead = until_state(&s, &id_of(&m), "dead").await;
    assert_eq!(
        dead["history"][0]["error"]["code"], "ssrf_refused",
        "{dead}"
    );
    // Bad targets are refused at publish, naming the field.
    let got = s
        .post(
            "/v1/queues/hooks/messages",
            json!({"payload": 3, "target_url": "ftp://x.example/"}),
        )
        .await;
    assert_error_names(&got, 400, "invalid_target_url", "target_url");
    s.stop().await;
}

#[tokio::test]
async fn a_target_is_refused_where_the_queue_does_not_allow_it() {
    let mock = Mock::start(|_, _| Answer::status(200)).await;
    let s = server(&mock.url("/hook"), "", true).await;
    for queue in ["hooks", "pull-queue"] {
        let got = s
            .post(
                &format!("/v1/queues/{queue}/messages"),
                json!({"payload": 1, "target_url": mock.url("/x")}),
            )
            .await;
        assert_error_names(&got, 400, "target_not_allowed", "target_url");
    }
    let got = s
        .post(
            "/v1/queues/hooks/messages",
            json!({"messages": [{"payload": 1}, {"payload": 2, "target_url": mock.url("/x")}]}),
        )
        .await;
    assert_error_names(&got, 400, "target_not_allowed", "messages[1].target_url");
    let (_, q) = s.get("/v1/queues/hooks").await;
    assert_eq!(
        q["counts"]["ready"], 0,
        "a refused batch published something: {q}"
    );
    assert_eq!(q["counts"]["done"], 0, "{q}");
    s.stop().await;
}

#[tokio::test]
async fn retries_over_the_budget_wait_uncharged() {
    let (mock, down) = switchable().await;
    // No breaker: only the budget holds retries back (10 % of first attempts + 10 per 10 s).
    let extra = "breaker = false\nretry_budget = 0.1";
    let s = server_with(&mock.url("/hook"), extra, true, 1000, "20ms").await;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(id_of(&s.publish("hooks", json!({"payload": i})).await));
    }
    let parked = "reason=\"budget\"";
    for tries in 0.. {
        assert!(tries < 1_000, "no retry was ever parked by the budget");
        let metrics = s.get_text("/metrics").await.1;
        if metrics
            .lines()
            .any(|l| l.starts_with("redrive_push_parked_total{") && l.contains(parked))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 20 first attempts allow 12 retries in the 10 s window: the calls stay near 32, not
    // the hundreds a 20 ms retry loop would make in that time.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls = mock.got().len();
    assert!(
        calls <= 20 + 12 + 16,
        "the budget let {calls} calls through"
    );
    down.store(false, std::sync::atomic::Ordering::SeqCst);
    for id in &ids {
        until_state(&s, id, "done").await;
    }
    // Parked retries were never charged: one attempt per call the endpoint got.
    assert_eq!(attempts_of(&s, &ids).await, mock.got().len() as u64);
    s.stop().await;
}

/// Headers the push request owns (SPEC §10), in the cases a message might write them.
const SERVER_OWNED: &[&str] = &[
    "host",
    "Content-Length",
    "transfer-encoding",
    "Connection",
    "keep-alive",
    "te",
    "upgrade",
    "content-type",
    "webhook-signature",
    "Webhook-Id",
    "webhook-timestamp",
    "redrive-attempt",
];

/// Issue 15 §1.2: a publish-scope caller set the push request's Host, Content-Length,
/// Transfer-Encoding or webhook-signature through the message's headers.
#[tokio::test]
async fn publishing_a_server_owned_header_to_a_push_queue_is_refused_naming_it() {
    let mock = Mock::start(|_, _| Answer::status(200)).await;
    let s = server(&mock.url("/hook"), "", true).await;
    for name in SERVER_OWNED {
        let got = s
            .post(
                "/v1/queues/hooks/messages",
                json!({"payload": 1, "headers": {"x-ok": "1", *name: "3"}}),
            )
            .await;
        assert_error_names(&got, 400, "reserved_header", &format!("headers.{name}"));
    }
    // A batch is all or nothing, and names the item.
    let got = s
        .post(
            "/v1/queues/hooks/messages",
            json!({"messages": [
                {"payload": 1, "headers": {"x-merchant": "m-1"}},
                {"payload": 2, "headers": {"Host": "internal-admin.example"}}
            ]}),
        )
        .await;
    assert_error_names(&got, 400, "reserved_header", "messages[1].headers.Host");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        mock.got().is_empty(),
        "a refused publish was stored and pushed"
    );
    let (_, q) = s.get("/v1/queues/hooks").await;
    for st in ["ready", "scheduled", "leased", "done", "dead"] {
        assert_eq!(q["counts"][st], 0, "{q}");
    }
    // Other headers pass, and a pull queue keeps any header (its consumer reads them).
    let m = s
        .publish(
            "hooks",
            json!({"payload": 1, "headers": {"x-host": "a", "authorization": "Bearer t"}}),
        )
        .await;
    until_state(&s, &id_of(&m), "done").await;
    let m = s
        .publish(
            "pull-queue",
            json!({"payload": 1, "headers": {"host": "h", "webhook-id": "w"}}),
        )
        .await;
    assert_eq!(m["headers"]["host"], "h", "{m}");
    s.stop().await;
}

/// Issue 15 §1.2, the last line of defence: a message that reaches the sender with headers
/// the server owns (stored before its queue was a push queue, bridged, published by the
/// engine itself) is pushed without them, and its attempt's history names them.
#[tokio::test]
async fn server_owned_headers_of_a_stored_message_never_reach_the_endpoint() {
    let mock = Mock::start(|_, _| Answer::status(200)).await;
    let s = TestServer::start(&format!(
        r#"[push]
allow_cidrs = ["127.0.0.1/32"]
[queues.signed]
delivery = "push"
[queues.signed.push]
url = "{signed}"
signing_secret = "{SECRET}"
[queues.unsigned]
delivery = "push"
[queues.unsigned.push]
url = "{unsigned}"
"#,
        signed = mock.url("/signed"),
        unsigned = mock.url("/unsigned"),
    ))
    .await;
    let forged: std::collections::BTreeMap<String, String> = [
        ("Host", "internal-admin.example"),
        ("content-length", "3"),
        ("transfer-encoding", "chunked"),
        ("connection", "upgrade"),
        ("content-type", "text/plain"),
        ("webhook-signature", "v1,Zm9yZ2Vk"),
        ("webhook-id", "msg_forged"),
        ("redrive-attempt", "99"),
        ("x-merchant", "m-1"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .collect();
    let mut ids = Vec::new();
    for queue in ["signed", "unsigned"] {
        let mut m =
            redrive_core::NewMessage::new(queue, json!({"order": 42, "note": "long enough"}));
        m.headers = forged.clone();
        let p = s.engine.publish(vec![m]).await.unwrap().pop().unwrap();
        ids.push(p.message.id.to_string());
    }
    for (id, path) in ids.iter().zip(["/signed", "/unsigned"]) {
        let done = until_state(&s, id, "done").await;
        let got = mock.for_id(id);
        assert_eq!(got.len(), 1, "{id}: {got:?}");
        let g = &got[0];
        assert_eq!(g.path, path);
        let h = &g.headers;
        assert_eq!(h["host"], mock.addr.to_string(), "{h:?}");
        assert_eq!(h["content-length"], g.body.len().to_string(), "{h:?}");
        assert!(!h.contains_key("transfer-encoding"), "{h:?}");
        assert_ne!(
            h.get("connection").map(String::as_str),
            Some("upgrade"),
            "{h:?}"
        );
        assert_eq!(h["content-type"], "application/json", "{h:?}");
        assert_eq!(h["webhook-id"], *id, "{h:?}");
        assert_eq!(h["redrive-attempt"], "1", "{h:?}");
        assert_eq!(h["x-merchant"], "m-1", "{h:?}");
        let body: Value = serde_json::from_slice(&g.body).unwrap();
        assert_eq!(
            body,
            json!({"order": 42, "note": "long enough"}),
            "the whole body"
        );
        if path == "/signed" {
            let ts: i64 = h["webhook-timestamp"].parse().unwrap();
            let secret = redrive_push::signing::Secret::parse(SECRET).unwrap();
            redrive_push::signing::verify(&secret, &h["webhook-signature"], id, ts, &g.body, ts, 5)
                .expect("redrive's own signature, which verifies");
        } else {
            assert!(
                !h.contains_key("webhook-signature"),
                "a forged signature reached the endpoint of a queue without a secret: {h:?}"
            );
        }
        let r = &responses(&done)[0];
        let mut dropped: Vec<String> = r["dropped_headers"]
            .as_array()
            .unwrap_or_else(|| panic!("no dropped_headers in {done}"))
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        dropped.sort();
        let mut want: Vec<String> = forged
            .keys()
            .filter(|k| *k != "x-merchant")
            .cloned()
            .collect();
        want.sort();
        assert_eq!(dropped, want, "{done}");
    }
    s.stop().await;
}

/// The `waited` entries of a history, with the index each sits at.
fn waits(m: &Value) -> Vec<(usize, Value)> {
    m["history"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, h)| h["event"] == "waited")
        .map(|(i, h)| (i, h.clone()))
        .collect()
}

/// An RFC 3339 timestamp of an answer, as ms since the epoch.
fn ts_ms(v: &Value) -> i64 {
    let t = time::OffsetDateTime::parse(
        v.as_str().unwrap_or_else(|| panic!("not a timestamp: {v}")),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

/// Between two attempts, at most one `waited` entry per reason.
fn assert_waits_bounded(m: &Value) {
    let mut seen: Vec<String> = Vec::new();
    for h in m["history"].as_array().unwrap() {
        if h["event"] == "waited" {
            let r = h["for"].as_str().unwrap().to_owned();
            assert!(!seen.contains(&r), "two waits for {r} in one episode: {m}");
            seen.push(r);
        } else {
            seen.clear();
        }
    }
}

/// Issue 15 §3: "retry at 08:05:20" was followed by an attempt at 08:05:24 with nothing in
/// between. A message that waited, uncharged, while its endpoint's breaker was open says so.
#[tokio::test]
async fn a_message_that_waited_for_the_breaker_says_so_in_its_history() {
    let (mock, down) = switchable().await;
    let s = server_with(&mock.url("/hook"), "concurrency = 4", true, 1000, "50ms").await;
    let mut failed_first = Vec::new();
    for i in 0..30 {
        failed_first.push(id_of(&s.publish("hooks", json!({"payload": i})).await));
    }
    loop {
        let (_, list) = s.get("/v1/endpoints").await;
        if list["endpoints"][0]["state"] == "open" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Published while the breaker is open: never attempted before the recovery.
    let mut fresh = Vec::new();
    for i in 0..5 {
        fresh.push(id_of(
            &s.publish("hooks", json!({"payload": 100 + i})).await,
        ));
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    down.store(false, std::sync::atomic::Ordering::SeqCst);
    let mut breaker_waits = 0;
    for id in failed_first.iter().chain(&fresh) {
        let m = until_state(&s, id, "done").await;
        assert_waits_bounded(&m);
        let h = m["history"].as_array().unwrap();
        for (i, w) in waits(&m) {
            // Right before the attempt it held back (after any other wait of that attempt),
            // for the same attempt number.
            let next = h[i..].iter().find(|e| e["event"] != "waited").unwrap();
            assert!(next["event"] == "acked" || next["event"] == "failed", "{m}");
            assert_eq!(w["attempt"], next["attempt"], "{m}");
            assert!(
                w["at"].as_str().unwrap() <= next["at"].as_str().unwrap(),
                "{m}"
            );
            // The first wait of an attempt began when the message was due (its retry time,
            // or its publish for a first attempt), or when it was leased soon after and
            // parked.
            if i == 0 || h[i - 1]["event"] != "waited" {
                let due = if i == 0 {
                    &m["created_at"]
                } else {
                    &h[i - 1]["retry_at"]
                };
                let since = ts_ms(&w["since"]) - ts_ms(due);
                assert!((0..1_000).contains(&since), "{since} ms after due: {m}");
            }
            if w["for"] == "breaker" {
                breaker_waits += 1;
            }
        }
    }
    // The breaker stayed open ~5 s: every message due in that time waited for it.
    assert!(breaker_waits >= 30, "only {breaker_waits} breaker waits");
    for id in &fresh {
        let m = s.message(id).await;
        let h = &m["history"][0];
        assert_eq!(h["event"], "waited", "{m}");
        assert_eq!(h["for"], "breaker", "{m}");
        assert_eq!(h["attempt"], 1, "{m}");
    }
    // Waiting charged nothing: one attempt per call the endpoint got.
    let ids: Vec<String> = failed_first.iter().chain(&fresh).cloned().collect();
    assert_eq!(attempts_of(&s, &ids).await, mock.got().len() as u64);
    // The console's timeline says it in words.
    let (status, page) = s.get_text(&format!("/ui/messages/{}", fresh[0])).await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("waited for the endpoint&#39;s breaker since")
            || page.contains("waited for the endpoint's breaker since"),
        "{page}"
    );
    s.stop().await;
}

/// A retry the budget refuses is parked again and again; its history gets one `waited`
/// entry for the budget, counting the parks, not one per park.
#[tokio::test]
async fn a_retry_parked_by_the_budget_gets_one_waited_entry_however_often_it_is_parked() {
    let (mock, down) = switchable().await;
    let extra = "breaker = false\nretry_budget = 0.1";
    let s = server_with(&mock.url("/hook"), extra, true, 1000, "20ms").await;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(id_of(&s.publish("hooks", json!({"payload": i})).await));
    }
    // Let the budget park retries for a few of its 1 s refusals.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    down.store(false, std::sync::atomic::Ordering::SeqCst);
    let mut parked_many = 0;
    for id in &ids {
        let m = until_state(&s, id, "done").await;
        assert_waits_bounded(&m);
        for (_, w) in waits(&m) {
            if w["for"] == "budget" {
                let parks = w["parks"].as_u64().unwrap_or(0);
                assert!(parks >= 1, "a budget wait is a park: {m}");
                if parks >= 2 {
                    parked_many += 1;
                }
            }
        }
    }
    assert!(
        parked_many >= 1,
        "no retry was parked twice by the budget (or each park got its own entry)"
    );
    assert_eq!(attempts_of(&s, &ids).await, mock.got().len() as u64);
    s.stop().await;
}
