//! Bad input: a clear JSON error with the right status, naming the field, and
//! nothing changed (SPEC §4, §5).

use crate::harness::{
    assert_error, assert_error_names, id_of, lease_of, unknown_id, Answer, TestServer,
};
use serde_json::{json, Value};

/// A server with one ready and one leased message in queue `bad`, and the lease.
async fn fixture() -> (TestServer, Value) {
    let s = TestServer::fast("").await;
    s.publish_payload("bad", json!("leased")).await;
    let l = s.lease_one("bad", "0s").await;
    s.publish_payload("bad", json!("ready")).await;
    (s, l)
}

/// Check that nothing changed since `before` (counts of every queue, every message).
async fn unchanged(s: &TestServer, before: &Value, what: &str) {
    assert_eq!(&s.snapshot().await, before, "{what} changed something");
}

fn check(got: Answer, status: u16, code: &str, needle: &str) {
    assert_error_names(&got, status, code, needle);
}

#[tokio::test]
async fn malformed_json_is_400_malformed_json() {
    let (s, l) = fixture().await;
    let id = id_of(&l);
    let before = s.snapshot().await;
    let paths = [
        "/v1/queues/bad/messages".to_owned(),
        "/v1/queues/bad/leases".to_owned(),
        format!("/v1/messages/{id}/ack"),
        format!("/v1/messages/{id}/nack"),
        format!("/v1/messages/{id}/extend"),
        format!("/v1/messages/{id}/kill"),
        "/v1/messages/ack".to_owned(),
        "/v1/messages/nack".to_owned(),
    ];
    for p in &paths {
        for body in [
            "{\"payload\": ",
            "{payload: 1}",
            "{\"a\":1}}",
            "nul",
            "{'a':1}",
        ] {
            let got = s.post_raw(p, body).await;
            assert_error(&got, 400, "malformed_json");
        }
    }
    unchanged(&s, &before, "malformed JSON").await;
    s.stop().await;
}

#[tokio::test]
async fn unknown_fields_are_400_invalid_body_naming_the_field() {
    let (s, l) = fixture().await;
    let id = id_of(&l);
    let tok = lease_of(&l);
    let before = s.snapshot().await;
    let cases: Vec<(String, Value, &str)> = vec![
        (
            "/v1/queues/bad/messages".into(),
            json!({"payload": 1, "dealy": "1s"}),
            "dealy",
        ),
        (
            "/v1/queues/bad/messages".into(),
            json!({"payload": 1, "failed": {"class": "transient", "msg": "x"}}),
            "msg",
        ),
        (
            "/v1/queues/bad/messages".into(),
            json!({"messages": [{"payload": 1}], "extra": true}),
            "extra",
        ),
        ("/v1/queues/bad/leases".into(), json!({"maxx": 2}), "maxx"),
        (
            format!("/v1/messages/{id}/ack"),
            json!({"lease": tok, "force": true}),
            "force",
        ),
        (
            format!("/v1/messages/{id}/nack"),
            json!({"lease": tok, "error": {"clas": "transient"}}),
            "clas",
        ),
        (
            format!("/v1/messages/{id}/extend"),
            json!({"lease": tok, "by": "1s", "until": "x"}),
            "until",
        ),
        (
            format!("/v1/messages/{id}/kill"),
            json!({"why": "x"}),
            "why",
        ),
        (
            "/v1/messages/ack".into(),
            json!({"items": [{"id": id, "lease": tok, "extra": 1}]}),
            "extra",
        ),
    ];
    for (path, body, field) in cases {
        check(s.post(&path, body).await, 400, "invalid_body", field);
    }
    // Missing required fields and wrong types are invalid_body too.
    let cases: Vec<(String, Value, &str)> = vec![
        (format!("/v1/messages/{id}/ack"), json!({}), "lease"),
        (format!("/v1/messages/{id}/nack"), json!({}), "lease"),
        (
            format!("/v1/messages/{id}/extend"),
            json!({"lease": tok}),
            "by",
        ),
        ("/v1/queues/bad/leases".into(), json!({"max": "ten"}), "ten"),
        ("/v1/queues/bad/leases".into(), json!({"max": 1.5}), "1.5"),
        (
            "/v1/queues/bad/messages".into(),
            json!({"payload": 1, "headers": {"n": 1}}),
            "invalid type",
        ),
        (
            "/v1/queues/bad/messages".into(),
            json!({"payload": 1, "priority": "high"}),
            "high",
        ),
        (
            "/v1/queues/bad/messages".into(),
            json!({"messages": "all"}),
            "invalid type",
        ),
        (
            format!("/v1/messages/{id}/nack"),
            json!({"lease": tok, "error": {"message": "no class"}}),
            "class",
        ),
    ];
    for (path, body, needle) in cases {
        check(s.post(&path, body).await, 400, "invalid_body", needle);
    }
    // A JSON value that is not an object.
    for body in ["\"just a string\"", "42", "[1, 2]"] {
        let got = s.post_raw("/v1/queues/bad/messages", body).await;
        assert_error(&got, 400, "invalid_body");
    }
    unchanged(&s, &before, "unknown fields").await;
    s.stop().await;
}

#[tokio::test]
async fn missing_payload_is_400() {
    let (s, _) = fixture().await;
    let before = s.snapshot().await;
    check(
        s.post("/v1/queues/bad/messages", json!({"headers": {"a": "b"}}))
            .await,
        400,
        "invalid_body",
        "payload",
    );
    check(
        s.post_raw("/v1/queues/bad/messages", "").await,
        400,
        "invalid_body",
        "payload",
    );
    check(
        s.post("/v1/queues/bad/messages", json!({})).await,
        400,
        "invalid_body",
        "payload",
    );
    check(
        s.post(
            "/v1/queues/bad/messages",
            json!({"messages": [{"key": "k"}]}),
        )
        .await,
        400,
        "invalid_body",
        "messages[0].payload",
    );
    unchanged(&s, &before, "missing payload").await;
    s.stop().await;
}

#[tokio::test]
async fn bad_durations_are_400_invalid_duration_naming_the_field() {
    let (s, l) = fixture().await;
    let id = id_of(&l);
    let tok = lease_of(&l);
    let before = s.snapshot().await;
    let cases: Vec<(String, Value, &str)> = vec![
        (
            "/v1/queues/bad/messages".into(),
            json!({"payload": 1, "delay": "soon"}),
            "delay",
        ),
        (
            "/v1/queues/bad/messages".into(),
            json!({"payload": 1, "delay": "-5s"}),
            "delay",
        ),
        (
            "/v1/queues/bad/messages".into(),
            json!({"payload": 1, "failed": {"class": "rate_limited", "retry_after": "later"}}),
            "failed.retry_after",
        ),
        (
            "/v1/queues/bad/leases".into(),
            json!({"lease": "forever"}),
            "lease",
        ),
        (
            "/v1/queues/bad/leases".into(),
            json!({"lease": "0s"}),
            "lease",
        ),
        (
            "/v1/queues/bad/leases".into(),
            json!({"lease": "13h"}),
            "lease",
        ),
        ("/v1/queues/bad/leases".into(), json!({"wait": "x"}), "wait"),
        (
            "/v1/queues/bad/leases".into(),
            json!({"wait": "31s"}),
            "wait",
        ),
        (
            format!("/v1/messages/{id}/nack"),
            json!({"lease": tok, "error": {"class": "rate_limited", "retry_after": "10 parsecs"}}),
            "error.retry_after",
        ),
        (
            format!("/v1/messages/{id}/extend"),
            json!({"lease": tok, "by": "a while"}),
            "by",
        ),
        (
            format!("/v1/messages/{id}/extend"),
            json!({"lease": tok, "by": "0s"}),
            "by",
        ),
        (
            format!("/v1/messages/{id}/extend"),
            json!({"lease": tok, "by": "13h"}),
            "by",
        ),
    ];
    for (path, body, field) in cases {
        check(s.post(&path, body).await, 400, "invalid_duration", field);
    }
    unchanged(&s, &before, "bad durations").await;
    s.stop().await;
}

#[tokio::test]
async fn bad_deliver_at_priority_key_and_exclusive_fields() {
    let (s, _) = fixture().await;
    let before = s.snapshot().await;
    let p = "/v1/queues/bad/messages";
    for t in [
        "tomorrow",
        "2026-13-01T00:00:00Z",
        "2026-01-01 00:00:00",
        "2026-01-01",
        "",
    ] {
        check(
            s.post(p, json!({"payload": 1, "deliver_at": t})).await,
            400,
            "invalid_timestamp",
            "deliver_at",
        );
    }
    for pr in [10, -1, 1000] {
        check(
            s.post(p, json!({"payload": 1, "priority": pr})).await,
            400,
            "invalid_priority",
            "priority",
        );
    }
    check(
        s.post(
            p,
            json!({"payload": 1, "delay": "1s", "deliver_at": "2030-01-01T00:00:00Z"}),
        )
        .await,
        400,
        "invalid_body",
        "deliver_at",
    );
    for (field, v) in [("key", "".to_owned()), ("key", "k".repeat(513))] {
        let mut body = json!({"payload": 1});
        body[field] = json!(v);
        check(s.post(p, body).await, 400, "invalid_key", field);
    }
    check(
        s.post(p, json!({"payload": 1, "idempotency_key": ""}))
            .await,
        400,
        "invalid_key",
        "idempotency_key",
    );
    unchanged(&s, &before, "bad publish fields").await;
    s.stop().await;
}

#[tokio::test]
async fn bad_error_class_is_400() {
    let (s, l) = fixture().await;
    let id = id_of(&l);
    let before = s.snapshot().await;
    check(
        s.nack(&id, &lease_of(&l), json!({"class": "fatal"})).await,
        400,
        "invalid_error_class",
        "error.class",
    );
    check(
        s.nack(&id, &lease_of(&l), json!({"class": "Transient"}))
            .await,
        400,
        "invalid_error_class",
        "error.class",
    );
    check(
        s.post(
            "/v1/queues/bad/messages",
            json!({"payload": 1, "failed": {"class": "oops"}}),
        )
        .await,
        400,
        "invalid_error_class",
        "failed.class",
    );
    unchanged(&s, &before, "bad error class").await;
    // The message is still leased with its token.
    let (st, a) = s.ack(&id, &lease_of(&l)).await;
    assert_eq!(st, 200, "{a}");
    s.stop().await;
}

/// `failed.attempts` (issue 18): an integer from 1 to 1,000,000, else a 400 naming it; in
/// a batch, the item too; nothing stored.
#[tokio::test]
async fn bad_failed_attempts_is_400_naming_the_field() {
    let (s, _l) = fixture().await;
    let before = s.snapshot().await;
    for bad in [json!(0), json!(-1), json!(1_000_001), json!(i64::MAX)] {
        check(
            s.post(
                "/v1/queues/bad/messages",
                json!({"payload": 1, "failed": {"class": "transient", "attempts": bad}}),
            )
            .await,
            400,
            "invalid_attempts",
            "failed.attempts",
        );
    }
    for bad in [json!(1.5), json!("3"), json!(true), json!([2])] {
        check(
            s.post(
                "/v1/queues/bad/messages",
                json!({"payload": 1, "failed": {"class": "transient", "attempts": bad}}),
            )
            .await,
            400,
            "invalid_body",
            "failed.attempts",
        );
    }
    check(
        s.post(
            "/v1/queues/bad/messages",
            json!({"messages": [{"payload": 1},
                   {"payload": 2, "failed": {"class": "transient", "attempts": 0}}]}),
        )
        .await,
        400,
        "invalid_attempts",
        "messages[1].failed.attempts",
    );
    unchanged(&s, &before, "bad failed.attempts").await;
    // The bounds themselves are taken (2.0 is an integer, as JSON Schema counts them).
    for good in [json!(1), json!(2.0), json!(1_000_000)] {
        let (st, m) = s
            .post(
                "/v1/queues/bad-ok/messages",
                json!({"payload": 1, "failed": {"class": "permanent", "attempts": good}}),
            )
            .await;
        assert_eq!(st, 201, "{good}: {m}");
        assert_eq!(m["attempts"], good.as_f64().unwrap() as u64, "{m}");
    }
    s.stop().await;
}

#[tokio::test]
async fn lease_max_out_of_range_is_400() {
    let (s, _) = fixture().await;
    let before = s.snapshot().await;
    for max in [0, 21] {
        check(
            s.post("/v1/queues/bad/leases", json!({ "max": max })).await,
            400,
            "invalid_max",
            "max",
        );
    }
    unchanged(&s, &before, "bad max").await;
    s.stop().await;
}

#[tokio::test]
async fn batch_publish_size_limits() {
    let (s, _) = fixture().await;
    let before = s.snapshot().await;
    check(
        s.post("/v1/queues/bad/messages", json!({"messages": []}))
            .await,
        400,
        "batch_too_large",
        "messages",
    );
    let many: Vec<Value> = (0..21).map(|i| json!({ "payload": i })).collect();
    check(
        s.post("/v1/queues/bad/messages", json!({ "messages": many }))
            .await,
        400,
        "batch_too_large",
        "messages",
    );
    unchanged(&s, &before, "batch size").await;
    s.stop().await;
}

#[tokio::test]
async fn payload_over_max_payload_bytes_is_413_json() {
    let (s, _) = fixture().await;
    let before = s.snapshot().await;
    // max_payload_bytes = 1024: the JSON text of the payload counts.
    let big = "x".repeat(1100);
    let got = s
        .post("/v1/queues/bad/messages", json!({ "payload": big }))
        .await;
    check(got, 413, "payload_too_large", "payload");
    unchanged(&s, &before, "big payload").await;
    // Just at the limit is fine: a string of 1022 chars is 1024 bytes of JSON.
    let m = s.publish("bad", json!({"payload": "y".repeat(1022)})).await;
    assert_eq!(m["state"], "ready", "{m}");
    s.stop().await;
}

#[tokio::test]
async fn body_over_max_request_bytes_is_413_json() {
    let (s, l) = fixture().await;
    let before = s.snapshot().await;
    // max_request_bytes = 4096.
    let padding = " ".repeat(5000);
    let body = format!("{{\"payload\": 1{padding}}}");
    for path in [
        "/v1/queues/bad/leases".to_owned(),
        format!("/v1/messages/{}/ack", id_of(&l)),
        "/v1/messages/ack".to_owned(),
    ] {
        let got = s.post_raw(&path, &body).await;
        assert_eq!(got.0, 413, "{path}: {}", got.1);
        assert_error(&got, 413, "body_too_large");
    }
    unchanged(&s, &before, "big bodies").await;
    s.stop().await;
}

#[tokio::test]
async fn publish_body_over_max_request_bytes_is_413_json() {
    let (s, _) = fixture().await;
    let before = s.snapshot().await;
    let padding = " ".repeat(5000);
    let body = format!("{{\"payload\": 1{padding}}}");
    let (st, ctype, text) = s
        .send_text(reqwest::Method::POST, "/v1/queues/bad/messages", Some(body))
        .await;
    assert_eq!(st, 413, "{text}");
    assert!(ctype.starts_with("application/json"), "{ctype}: {text}");
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    assert_error(&(st, v), 413, "body_too_large");
    // A batch that is too big as a whole.
    let msgs: Vec<Value> = (0..10)
        .map(|_| json!({"payload": "z".repeat(500)}))
        .collect();
    let got = s
        .post("/v1/queues/bad/messages", json!({ "messages": msgs }))
        .await;
    assert_error(&got, 413, "body_too_large");
    unchanged(&s, &before, "big publish bodies").await;
    s.stop().await;
}

#[tokio::test]
async fn unknown_route_is_404_json_and_wrong_method_is_405_json() {
    let (s, l) = fixture().await;
    let id = id_of(&l);
    let before = s.snapshot().await;
    for path in [
        "/v2/queues",
        "/v1/nothing",
        "/",
        "/v1/queues/bad/messages/extra",
    ] {
        let (st, ctype, text) = s.send_text(reqwest::Method::GET, path, None).await;
        assert_eq!(st, 404, "{path}: {text}");
        assert!(ctype.starts_with("application/json"), "{path}: {ctype}");
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert_error(&(st, v), 404, "not_found");
    }
    let cases = [
        (reqwest::Method::GET, "/v1/queues/bad/messages".to_owned()),
        (reqwest::Method::GET, "/v1/queues/bad/leases".to_owned()),
        (reqwest::Method::PUT, format!("/v1/messages/{id}")),
        (reqwest::Method::GET, format!("/v1/messages/{id}/ack")),
        (reqwest::Method::DELETE, "/v1/queues".to_owned()),
        (reqwest::Method::POST, "/v1/queues/bad".to_owned()),
        (reqwest::Method::POST, "/healthz".to_owned()),
        (reqwest::Method::DELETE, "/metrics".to_owned()),
    ];
    for (m, path) in cases {
        let (st, ctype, text) = s.send_text(m.clone(), &path, None).await;
        assert_eq!(st, 405, "{m} {path}: {text}");
        assert!(ctype.starts_with("application/json"), "{m} {path}: {ctype}");
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert_error(&(st, v), 405, "method_not_allowed");
    }
    unchanged(&s, &before, "bad routes").await;
    s.stop().await;
}

#[tokio::test]
async fn bad_ids_in_paths_are_400_json() {
    let (s, _) = fixture().await;
    let before = s.snapshot().await;
    for raw in [
        "123",
        "not-a-uuid",
        "0190b5c2-7d1e-7c3a-9f00-1a2b3c4d5e6",
        "%20",
    ] {
        assert_error(
            &s.get(&format!("/v1/messages/{raw}")).await,
            400,
            "invalid_id",
        );
        assert_error(
            &s.post(&format!("/v1/messages/{raw}/kill"), json!({})).await,
            400,
            "invalid_id",
        );
    }
    unchanged(&s, &before, "bad ids").await;
    s.stop().await;
}

#[tokio::test]

async fn non_utf8_path_segments_are_400_json() {
    let (s, _) = fixture().await;
    let before = s.snapshot().await;
    for (m, path) in [
        (reqwest::Method::GET, "/v1/messages/%FF".to_owned()),
        (reqwest::Method::GET, "/v1/queues/%FF".to_owned()),
        (reqwest::Method::POST, "/v1/queues/%FF/leases".to_owned()),
        (
            reqwest::Method::POST,
            format!("/v1/messages/{}%FF/kill", unknown_id()),
        ),
    ] {
        let (st, ctype, text) = s.send_text(m.clone(), &path, Some("{}".into())).await;
        assert_eq!(st, 400, "{m} {path}: {text}");
        assert!(
            ctype.starts_with("application/json"),
            "{m} {path}: {ctype}: {text}"
        );
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert!(v["error"]["code"].is_string(), "{m} {path}: {text}");
    }
    unchanged(&s, &before, "non-UTF-8 paths").await;
    s.stop().await;
}

/// A search cursor is opaque: anything that is not a `next_cursor` is a 400
/// `invalid_cursor` naming it (the store's `InvalidCursor`), never a 500 or a silent
/// empty page (`-1` and `0` used to answer 200 with an empty page).
#[tokio::test]
async fn bad_search_cursor_is_400_invalid_cursor() {
    let (s, _l) = fixture().await;
    let before = s.snapshot().await;
    for c in ["garbage", "-1", "0", "%2B5"] {
        let got = s.get(&format!("/v1/messages?cursor={c}")).await;
        check(got, 400, "invalid_cursor", "cursor");
    }
    // Export answers 400 before it starts streaming (it used to stream 200, then abort, on 0).
    for c in ["garbage", "0", "007"] {
        let got = s.get(&format!("/v1/messages/export?cursor={c}")).await;
        check(got, 400, "invalid_cursor", "cursor");
    }
    unchanged(&s, &before, "a bad cursor").await;
    s.stop().await;
}
