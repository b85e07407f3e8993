//! Named size limits (issue 5, defect 9): lease answers and search pages stay under
//! `max_response_bytes` (fewer messages, never a leased message left out of the answer),
//! headers over `max_header_bytes` are refused, error messages and kill reasons over
//! `max_error_message_bytes` are cut, saying so.

use crate::harness::{assert_error_names, count, id_of, lease_of, Answer, TestServer};
use serde_json::{json, Value};

/// Small limits: one message is at most 1024 + 256 + 6 × 128 + 6 × 2 × 512 + 2048 = 10,240
/// bytes in an answer (`message_bound_bytes`), so `max_response_bytes` must be ≥ that.
fn config(max_response_bytes: usize) -> String {
    format!(
        r#"
max_payload_bytes = 1024
max_request_bytes = 65536
max_header_bytes = 256
max_error_message_bytes = 128
max_response_bytes = {max_response_bytes}
max_batch = 100
"#
    )
}

/// The bound above.
const BOUND: usize = 10_240;

/// Publish `n` messages with a payload of about 900 bytes each.
async fn fill(s: &TestServer, queue: &str, n: usize) {
    let messages: Vec<Value> = (0..n)
        .map(|i| json!({"payload": {"i": i, "pad": "x".repeat(900)}}))
        .collect();
    for chunk in messages.chunks(20) {
        s.publish(queue, json!({ "messages": chunk })).await;
    }
}

/// POST and keep the raw length of the answer.
async fn post_len(s: &TestServer, path: &str, body: Value) -> (u16, usize, Value) {
    let r = s
        .req(reqwest::Method::POST, path)
        .json(&body)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    let text = r.text().await.unwrap();
    (st, text.len(), serde_json::from_str(&text).unwrap())
}

async fn get_len(s: &TestServer, path: &str) -> (u16, usize, Value) {
    let (st, text) = s.get_text(path).await;
    (st, text.len(), serde_json::from_str(&text).unwrap())
}

#[tokio::test]
async fn lease_answer_stays_under_max_response_bytes_and_leaves_the_rest_ready() {
    let s = TestServer::start(&config(2 * BOUND)).await;
    fill(&s, "big", 30).await;
    let (st, len, v) = post_len(&s, "/v1/queues/big/leases", json!({"max": 30})).await;
    assert_eq!(st, 200, "{v}");
    let n = v["messages"].as_array().unwrap().len();
    assert!(len <= 2 * BOUND, "answer of {len} bytes");
    assert!((1..30).contains(&n), "{n} messages");
    // Exactly the answered messages are leased; the others are still ready.
    let c = s.counts("big").await;
    assert_eq!(count(&c, "leased"), n as u64, "{c}");
    assert_eq!(count(&c, "ready"), 30 - n as u64, "{c}");
    // Every answered lease is real: ack them all.
    for m in v["messages"].as_array().unwrap() {
        let (st, a) = s.ack(&id_of(m), &lease_of(m)).await;
        assert_eq!(st, 200, "{a}");
    }
    s.stop().await;
}

#[tokio::test]
async fn lease_returns_at_least_one_message_when_the_budget_holds_only_one() {
    let s = TestServer::start(&config(BOUND)).await;
    fill(&s, "one", 5).await;
    let (st, len, v) = post_len(&s, "/v1/queues/one/leases", json!({"max": 5})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["messages"].as_array().unwrap().len(), 1, "{v}");
    assert!(len <= BOUND);
    assert_eq!(count(&s.counts("one").await, "leased"), 1);
    s.stop().await;
}

#[tokio::test]
async fn search_page_stops_at_max_response_bytes_with_a_next_cursor() {
    let s = TestServer::start(&config(2 * BOUND)).await;
    fill(&s, "big", 30).await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/messages?queue=big&limit=30&cursor={}", encode(c)),
            None => "/v1/messages?queue=big&limit=30".to_owned(),
        };
        let (st, len, v) = get_len(&s, &path).await;
        assert_eq!(st, 200, "{v}");
        assert!(len <= 2 * BOUND, "page of {len} bytes");
        let msgs = v["messages"].as_array().unwrap();
        assert!(!msgs.is_empty(), "{v}");
        seen.extend(msgs.iter().map(id_of));
        pages += 1;
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert!(pages > 1, "30 messages of ~1 KB fit in one page of 20 KB?");
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!((seen.len(), unique.len()), (30, 30), "every message once");
    s.stop().await;
}

#[tokio::test]
async fn headers_over_max_header_bytes_are_413_and_nothing_is_published() {
    let s = TestServer::start(&config(2 * BOUND)).await;
    let big = json!({"x-big": "h".repeat(300)});
    let got: Answer = s
        .post(
            "/v1/queues/h/messages",
            json!({"payload": 1, "headers": big}),
        )
        .await;
    assert_error_names(&got, 413, "headers_too_large", "headers");
    assert_error_names(&got, 413, "headers_too_large", "max_header_bytes");
    let got = s
        .post(
            "/v1/queues/h/messages",
            json!({"messages": [{"payload": 1}, {"payload": 2, "headers": big}]}),
        )
        .await;
    assert_error_names(&got, 413, "headers_too_large", "messages[1].headers");
    let (st, q) = s.get("/v1/queues").await;
    assert_eq!(st, 200);
    assert_eq!(q["queues"], json!([]), "nothing published: {q}");
    // Headers within the limit are fine.
    s.publish(
        "h",
        json!({"payload": 1, "headers": {"x-ok": "h".repeat(200)}}),
    )
    .await;
    s.stop().await;
}

/// Percent-encode a query value (the cursor is opaque).
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn assert_truncated(text: &str, original_len: usize) {
    assert!(text.len() <= 128, "{} bytes: {text}", text.len());
    assert!(
        text.contains("[truncated by redrive from")
            && text.ends_with(&format!("{original_len} bytes]")),
        "the cut is not said: {text}"
    );
}

#[tokio::test]
async fn error_messages_and_kill_reasons_over_the_limit_are_truncated_saying_so() {
    let s = TestServer::start(&format!(
        "{}\n[queues.default.retry]\nmax_attempts = 5\nbackoff = \"fixed\"\ninitial_delay = \"1ms\"\njitter = \"none\"",
        config(2 * BOUND)
    ))
    .await;
    let long = "é".repeat(1000); // 2000 bytes
                                 // nack
    let id = s.publish_payload("t", json!(1)).await;
    let m = s.lease_one("t", "0s").await;
    let (st, v) = s
        .nack(
            &id,
            &lease_of(&m),
            json!({"class": "transient", "message": long}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_truncated(v["last_error"]["message"].as_str().unwrap(), 2000);
    // batch nack
    let m = s.lease_one("t", "5s").await;
    let (st, v) = s
        .post(
            "/v1/messages/nack",
            json!({"items": [{"id": id, "lease": lease_of(&m), "error": {"class": "transient", "message": long}}]}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_truncated(
        v["items"][0]["message"]["last_error"]["message"]
            .as_str()
            .unwrap(),
        2000,
    );
    // failed at publish
    let p = s
        .publish(
            "t",
            json!({"payload": 2, "failed": {"class": "transient", "message": long}}),
        )
        .await;
    assert_truncated(p["last_error"]["message"].as_str().unwrap(), 2000);
    // kill reason
    let (st, v) = s
        .post(
            &format!("/v1/messages/{}/kill", id_of(&p)),
            json!({"reason": long}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let full = s.message(&id_of(&p)).await;
    let history = full["history"].as_array().unwrap();
    let kill = history.last().unwrap();
    let text = serde_json::to_string(kill).unwrap();
    assert!(text.contains("[truncated by redrive from"), "{kill}");
    assert!(!text.contains(&long), "{kill}");
    s.stop().await;
}

#[tokio::test]
async fn max_response_bytes_below_one_message_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, config(BOUND - 1)).unwrap();
    let e = redrive_server::Config::load(
        Some(&path),
        Vec::new(),
        &redrive_server::Overrides::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("max_response_bytes") && e.contains(&BOUND.to_string()),
        "{e}"
    );
}

#[tokio::test]
async fn schedule_beyond_max_schedule_ahead_is_400_naming_the_field_and_nothing_is_published() {
    let s = TestServer::start("max_schedule_ahead = \"30d\"").await;
    let cases = [
        (
            json!({"payload": 1, "delay": "31d"}),
            "invalid_duration",
            "delay",
        ),
        (
            json!({"payload": 1, "delay": "100000y"}),
            "invalid_duration",
            "delay",
        ),
        (
            json!({"payload": 1, "deliver_at": "2999-01-01T00:00:00Z"}),
            "invalid_timestamp",
            "deliver_at",
        ),
        (
            json!({"payload": 1, "deliver_at": "9999-12-31T23:59:59Z"}),
            "invalid_timestamp",
            "deliver_at",
        ),
        (
            json!({"payload": 1, "deliver_at": "+10000-01-01T00:00:00Z"}),
            "invalid_timestamp",
            "deliver_at",
        ),
        (
            json!({"messages": [{"payload": 1}, {"payload": 2, "delay": "365d"}]}),
            "invalid_duration",
            "messages[1].delay",
        ),
    ];
    for (body, code, field) in cases {
        let got = s.post("/v1/queues/later/messages", body.clone()).await;
        assert_error_names(&got, 400, code, field);
        if code == "invalid_duration" && !body.to_string().contains("100000y") {
            assert_error_names(&got, 400, code, "max_schedule_ahead");
        }
    }
    let (st, q) = s.get("/v1/queues").await;
    assert_eq!(st, 200);
    assert_eq!(q["queues"], json!([]), "nothing published: {q}");
    // Within the limit: scheduled.
    let m = s
        .publish("later", json!({"payload": 1, "delay": "29d"}))
        .await;
    assert_eq!(m["state"], "scheduled", "{m}");
    let soon = redrive_core::Timestamp::now().plus_ms(10 * 86_400_000);
    let m = s
        .publish(
            "later",
            json!({"payload": 2, "deliver_at": soon.to_rfc3339()}),
        )
        .await;
    assert_eq!(m["state"], "scheduled", "{m}");
    s.stop().await;
}

#[tokio::test]
async fn max_schedule_ahead_past_100_years_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "max_schedule_ahead = \"40000d\"").unwrap();
    let e = redrive_server::Config::load(
        Some(&path),
        Vec::new(),
        &redrive_server::Overrides::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("max_schedule_ahead"), "{e}");
}

#[tokio::test]
async fn batch_ack_answer_stays_under_max_response_bytes_omitting_messages_saying_so() {
    let s = TestServer::start(&config(2 * BOUND)).await;
    fill(&s, "acks", 30).await;
    let mut leased = Vec::new();
    while leased.len() < 30 {
        let got = s.lease("acks", json!({"max": 30})).await;
        assert!(!got.is_empty());
        leased.extend(got);
    }
    let items: Vec<Value> = leased
        .iter()
        .map(|m| json!({"id": id_of(m), "lease": lease_of(m)}))
        .collect();
    let (st, len, v) = post_len(&s, "/v1/messages/ack", json!({ "items": items })).await;
    assert_eq!(st, 200, "{v}");
    // The items without their message are ~100 bytes each beyond the budget at most.
    assert!(len <= 2 * BOUND + 30 * 120, "answer of {len} bytes");
    let answered = v["items"].as_array().unwrap();
    assert_eq!(answered.len(), 30);
    let omitted = answered
        .iter()
        .filter(|i| i["message_omitted"] == true)
        .count();
    assert!(omitted > 0, "30 messages of ~1 KB in 20 KB: {v}");
    for i in answered {
        assert_eq!(i["status"], 200, "{i}");
        assert_eq!(
            i["message_omitted"] == true,
            i.get("message").is_none(),
            "{i}"
        );
    }
    assert_eq!(count(&s.counts("acks").await, "done"), 30);
    s.stop().await;
}
