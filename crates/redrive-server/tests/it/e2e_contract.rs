//! `/openapi.json` is the contract (issue 5, "The API document is the contract"): it states
//! the rules the server checks (patterns, enums, ranges, optional bodies, every status),
//! and the server checks exactly those. schemathesis runs against a live server in CI
//! (`.ci/run`); these tests pin the rules it found loose or strict.

use crate::harness::{assert_error_names, unknown_id, TestServer};
use regex::Regex;
use serde_json::{json, Value};

async fn doc(s: &TestServer) -> Value {
    let (st, d) = s.get("/openapi.json").await;
    assert_eq!(st, 200);
    d
}

fn op<'a>(d: &'a Value, path: &str, method: &str) -> &'a Value {
    &d["paths"][path][method]
}

#[tokio::test]
async fn openapi_states_what_the_server_checks() {
    let s = TestServer::fast("").await;
    let d = doc(&s).await;
    let schemas = &d["components"]["schemas"];
    // payload is any JSON value (SPEC §5), in and out.
    for schema in ["PublishItem", "LeasedMessage"] {
        let p = &schemas[schema]["properties"]["payload"];
        assert!(p.is_object() && p.get("type").is_none(), "{schema}: {p}");
    }
    assert!(
        schemas["PublishBatch"].is_object(),
        "PublishBatch is resolvable"
    );
    // Enums for error classes and states.
    assert_eq!(
        schemas["NackError"]["properties"]["class"]["enum"],
        json!(["transient", "rate_limited", "permanent"])
    );
    // A failure reported at publish carries the attempts made elsewhere (issue 18).
    let attempts = &schemas["FailedReport"]["properties"]["attempts"];
    assert_eq!(attempts["type"], json!(["integer", "null"]), "{attempts}");
    assert_eq!(attempts["minimum"], 1, "{attempts}");
    assert_eq!(attempts["maximum"], 1_000_000, "{attempts}");
    assert!(attempts["description"].is_string(), "{attempts}");
    let search = op(&d, "/v1/messages", "get");
    let state = search["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "state")
        .unwrap();
    assert_eq!(
        state["schema"]["enum"],
        json!(["scheduled", "ready", "leased", "done", "dead"])
    );
    // Durations: the pattern is the accepted range (default max_wait = 30s).
    let wait = Regex::new(
        schemas["LeaseBody"]["properties"]["wait"]["pattern"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    for ok in ["0", "0s", "1s", "30s", "30000ms"] {
        assert!(wait.is_match(ok), "{ok}");
    }
    for bad in ["31s", "1m", "30001ms", "1m 30s", "05s", ""] {
        assert!(!wait.is_match(bad), "{bad}");
    }
    // The lease body is optional; /metrics is OpenMetrics.
    assert_eq!(
        op(&d, "/v1/queues/{queue}/leases", "post")["requestBody"]["required"],
        false
    );
    assert!(op(&d, "/metrics", "get")["responses"]["200"]["content"]
        .get("application/openmetrics-text")
        .is_some());
    let (_, ctype, _) = s.send_text(reqwest::Method::GET, "/metrics", None).await;
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    // Every status a route can answer.
    for (path, item) in d["paths"].as_object().unwrap() {
        for (method, o) in item.as_object().unwrap() {
            let r = &o["responses"];
            assert!(r.get("403").is_some(), "{method} {path}: browser guard");
            if path.starts_with("/v1/") {
                for st in ["401", "500", "503"] {
                    assert!(r.get(st).is_some(), "{method} {path}: {st}");
                }
            }
            let has_input = o.get("requestBody").is_some()
                || o["parameters"].as_array().is_some_and(|p| !p.is_empty());
            if has_input {
                assert!(r.get("400").is_some(), "{method} {path}: 400");
            }
            if method == "post" {
                assert!(r.get("415").is_some(), "{method} {path}: 415");
            }
            if o.get("requestBody").is_some() {
                assert!(r.get("413").is_some(), "{method} {path}: 413");
            }
        }
    }
    s.stop().await;
}

#[tokio::test]
async fn durations_are_zero_or_one_whole_number_and_one_unit() {
    let s = TestServer::fast("").await;
    for bad in ["1m 30s", "05s", "1.5s", "1 s", "1sec", "s"] {
        let got = s.post("/v1/queues/d/leases", json!({"wait": bad})).await;
        assert_error_names(&got, 400, "invalid_duration", "wait");
        let got = s
            .post("/v1/queues/d/messages", json!({"payload": 1, "delay": bad}))
            .await;
        assert_error_names(&got, 400, "invalid_duration", "delay");
    }
    let got = s.post("/v1/queues/d/leases", json!({"wait": "31s"})).await;
    assert_error_names(&got, 400, "invalid_duration", "max_wait");
    let got = s.post("/v1/queues/d/leases", json!({"lease": "0s"})).await;
    assert_error_names(&got, 400, "invalid_duration", "lease");
    assert!(s
        .lease("d", json!({"wait": "0", "lease": "90s"}))
        .await
        .is_empty());
    s.publish("d", json!({"payload": 1, "delay": "250ms"}))
        .await;
    s.stop().await;
}

#[tokio::test]
async fn integral_floats_count_as_integers() {
    let s = TestServer::fast("").await;
    let m = s.publish("f", json!({"payload": 1, "priority": 3.0})).await;
    assert_eq!(m["priority"], 3, "{m}");
    s.publish_payload("f", json!(2)).await;
    assert_eq!(s.lease("f", json!({"max": 2.0})).await.len(), 2);
    let got = s.post("/v1/queues/f/leases", json!({"max": 2.5})).await;
    assert_error_names(&got, 400, "invalid_body", "max");
    s.stop().await;
}

#[tokio::test]
async fn ids_are_hyphenated_uuids_and_timestamps_rfc3339() {
    let s = TestServer::fast("").await;
    let simple = unknown_id().replace('-', "");
    for id in [
        simple,
        format!("{{{}}}", unknown_id()),
        format!("urn:uuid:{}", unknown_id()),
    ] {
        let got = s.get(&format!("/v1/messages/{id}")).await;
        assert_error_names(&got, 400, "invalid_id", "not a message id");
    }
    for bad in [
        "2026-01-31 12:00:00Z",
        "2026-01-31T12:00:00",
        "2026-02-30T00:00:00Z",
    ] {
        let got = s
            .get(&format!("/v1/messages?since={}", bad.replace(' ', "%20")))
            .await;
        assert_error_names(&got, 400, "invalid_timestamp", "since");
    }
    let got = s.get("/v1/messages/export?limit=5").await;
    assert_error_names(&got, 400, "invalid_query", "limit");
    s.stop().await;
}
