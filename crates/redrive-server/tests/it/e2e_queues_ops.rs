//! Queues, metrics, health, readiness and the OpenAPI document.

use crate::harness::{
    assert_error, assert_error_names, counts_of, id_of, lease_of, ok, TestServer,
};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

const CONFIGURED: &str = r#"
[queues.configured]
lease = "1m"
ordering = "key"
on_dead = "block"
[queues.configured.retry]
max_attempts = 5
backoff = "exponential"
initial_delay = "2s"
jitter = "full"
"#;

#[tokio::test]
async fn queue_counts_age_and_policy() {
    let s = TestServer::fast(CONFIGURED).await;
    // ready ×2, leased, scheduled, dead, done
    s.publish_payload("qa", json!("r1")).await;
    s.publish_payload("qa", json!("r2")).await;
    let _leased = s.lease_one("qa", "0s").await; // r1
    s.publish_payload("qa", json!("r3")).await;
    let done = s.lease_one("qa", "0s").await; // r2
    let (st, body) = s.ack(&id_of(&done), &lease_of(&done)).await;
    assert_eq!(st, 200, "{body}");
    s.publish("qa", json!({"payload": "s", "delay": "1h"}))
        .await;
    s.publish(
        "qa",
        json!({"payload": "x", "failed": {"class": "permanent"}}),
    )
    .await;
    s.publish_payload("qa", json!("r4")).await;

    let (st, q) = s.get("/v1/queues/qa").await;
    assert_eq!(st, 200, "{q}");
    assert_eq!(q["queue"], "qa", "{q}");
    assert_eq!(
        q["counts"],
        counts_of(&[
            ("ready", 2),
            ("leased", 1),
            ("scheduled", 1),
            ("dead", 1),
            ("done", 1)
        ]),
        "{q}"
    );
    let age = q["oldest_ready_age_seconds"]
        .as_f64()
        .unwrap_or_else(|| panic!("age of the oldest ready message: {q}"));
    assert!(age >= 0.0, "{q}");
    // The default policy of the test config.
    assert_eq!(q["policy"]["max_attempts"], 3, "{q}");
    assert_eq!(q["policy"]["backoff"], "fixed", "{q}");
    assert_eq!(q["policy"]["initial_delay_ms"], 50, "{q}");
    assert_eq!(q["policy"]["jitter"], "none", "{q}");
    assert!(
        q["policy_summary"].as_str().is_some_and(|t| !t.is_empty()),
        "{q}"
    );
    assert_eq!(q["ordering"], "none", "{q}");
    assert_eq!(q["on_dead"], "skip", "{q}");

    // A configured queue: its own policy, listed even without messages.
    let (st, c) = s.get("/v1/queues/configured").await;
    assert_eq!(st, 200, "{c}");
    assert_eq!(c["counts"], counts_of(&[]), "{c}");
    assert!(c["oldest_ready_age_seconds"].is_null(), "{c}");
    assert_eq!(c["policy"]["max_attempts"], 5, "{c}");
    assert_eq!(c["policy"]["backoff"], "exponential", "{c}");
    assert_eq!(c["policy"]["initial_delay_ms"], 2000, "{c}");
    assert_eq!(c["policy"]["jitter"], "full", "{c}");
    assert_eq!(c["ordering"], "key", "{c}");
    assert_eq!(c["on_dead"], "block", "{c}");
    assert!(c["lease"].is_string(), "{c}");

    // An unknown queue: zero counts (queues exist on first use).
    let (st, u) = s.get("/v1/queues/never-used").await;
    assert_eq!(st, 200, "{u}");
    assert_eq!(u["counts"], counts_of(&[]), "{u}");
    assert!(u["oldest_ready_age_seconds"].is_null(), "{u}");

    // The list: queues with messages and configured queues, each with counts.
    let (st, list) = s.get("/v1/queues").await;
    assert_eq!(st, 200, "{list}");
    let by_name: BTreeMap<String, Value> = list["queues"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .map(|x| (x["queue"].as_str().unwrap().to_owned(), x.clone()))
        .collect();
    assert!(by_name.contains_key("qa"), "{list}");
    assert!(by_name.contains_key("configured"), "{list}");
    assert!(!by_name.contains_key("default"), "{list}");
    assert_eq!(by_name["qa"]["counts"], q["counts"], "{list}");
    assert_eq!(by_name["configured"]["policy"], c["policy"], "{list}");

    // Bad names.
    for bad in ["a%20b", &"x".repeat(200), "%E8%AE%A2%E5%8D%95", "a%2Fb"] {
        let got = s.get(&format!("/v1/queues/{bad}")).await;
        assert_error(&got, 400, "invalid_queue");
    }
    s.stop().await;
}

#[tokio::test]
async fn oldest_ready_age_is_null_without_ready_messages() {
    let s = TestServer::fast("").await;
    s.publish("age", json!({"payload": 1, "delay": "1h"})).await;
    let (_, q) = s.get("/v1/queues/age").await;
    assert!(q["oldest_ready_age_seconds"].is_null(), "{q}");
    s.stop().await;
}

/// Value of the sample line `name{labels}` in a Prometheus exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn metrics_expose_the_spec_names() {
    let s = TestServer::fast("").await;
    // first_try
    let id = s.publish_payload("m", json!(1)).await;
    let l = s.lease_one("m", "0s").await;
    ok(s.ack(&id, &lease_of(&l)).await);
    // a retry, then after_retry
    let id = s.publish_payload("m", json!(2)).await;
    let l = s.lease_one("m", "0s").await;
    ok(s.nack(&id, &lease_of(&l), json!({"class": "transient"}))
        .await);
    let l = s.lease_one("m", "5s").await;
    ok(s.ack(&id, &lease_of(&l)).await);
    // dead
    let id = s.publish_payload("m", json!(3)).await;
    let l = s.lease_one("m", "0s").await;
    ok(s.nack(&id, &lease_of(&l), json!({"class": "permanent"}))
        .await);
    // one ready
    let ready_id = s.publish_payload("m", json!(4)).await;

    let (st, ctype, text) = s.send_text(reqwest::Method::GET, "/metrics", None).await;
    assert_eq!(st, 200, "{text}");
    assert!(
        ctype.starts_with("application/openmetrics-text") || ctype.starts_with("text/plain"),
        "{ctype}"
    );
    for (name, kind) in [
        ("redrive_messages_published", "counter"),
        ("redrive_deliveries", "counter"),
        ("redrive_retries", "counter"),
        ("redrive_retry_delay_seconds", "histogram"),
        ("redrive_dead_letters", "counter"),
        ("redrive_queue_messages", "gauge"),
        ("redrive_oldest_ready_age_seconds", "gauge"),
        ("redrive_delivery_lateness_seconds", "histogram"),
        ("redrive_commit_batch_size", "histogram"),
        ("redrive_commit_seconds", "histogram"),
        ("redrive_messages_finished", "counter"),
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} {kind}\n")),
            "# TYPE {name} {kind}: {text}"
        );
    }
    for (series, value) in [
        ("redrive_messages_published_total{queue=\"m\"}", 4.0),
        (
            "redrive_deliveries_total{queue=\"m\",outcome=\"leased\"}",
            4.0,
        ),
        (
            "redrive_deliveries_total{queue=\"m\",outcome=\"acked\"}",
            2.0,
        ),
        (
            "redrive_deliveries_total{queue=\"m\",outcome=\"nacked\"}",
            2.0,
        ),
        (
            "redrive_retries_total{queue=\"m\",error_class=\"transient\"}",
            1.0,
        ),
        ("redrive_retry_delay_seconds_count{queue=\"m\"}", 1.0),
        (
            "redrive_dead_letters_total{queue=\"m\",reason=\"permanent_error\"}",
            1.0,
        ),
        (
            "redrive_messages_finished_total{queue=\"m\",result=\"first_try\"}",
            1.0,
        ),
        (
            "redrive_messages_finished_total{queue=\"m\",result=\"after_retry\"}",
            1.0,
        ),
        (
            "redrive_messages_finished_total{queue=\"m\",result=\"dead\"}",
            1.0,
        ),
        ("redrive_queue_messages{queue=\"m\",state=\"done\"}", 2.0),
        ("redrive_queue_messages{queue=\"m\",state=\"dead\"}", 1.0),
        ("redrive_queue_messages{queue=\"m\",state=\"ready\"}", 1.0),
        ("redrive_queue_messages{queue=\"m\",state=\"leased\"}", 0.0),
        ("redrive_delivery_lateness_seconds_count", 4.0),
    ] {
        assert_eq!(sample(&text, series), Some(value), "{series}: {text}");
    }
    assert!(
        sample(&text, "redrive_oldest_ready_age_seconds{queue=\"m\"}").is_some_and(|v| v >= 0.0),
        "{text}"
    );
    assert!(
        sample(&text, "redrive_commit_batch_size_count").is_some_and(|v| v >= 1.0),
        "{text}"
    );
    assert!(
        sample(&text, "redrive_commit_seconds_count").is_some_and(|v| v >= 1.0),
        "{text}"
    );
    assert!(
        text.contains("redrive_commit_seconds_bucket{le=\""),
        "{text}"
    );
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
    assert!(
        !text.contains(&ready_id),
        "no message ids in labels: {text}"
    );
    s.stop().await;
}

#[tokio::test]
async fn healthz_and_readyz() {
    let s = TestServer::fast("").await;
    let (st, h) = s.get("/healthz").await;
    assert_eq!(st, 200, "{h}");
    assert_eq!(h["status"], "ok", "{h}");
    let (st, r) = s.get("/readyz").await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["status"], "ready", "{r}");
    s.stop().await;
}

/// Every route of the server: (path template, methods). Keep in sync with `api/mod.rs`.
const ROUTES: &[(&str, &[&str])] = &[
    ("/v1/queues/{queue}/messages", &["post"]),
    ("/v1/messages", &["get"]),
    ("/v1/messages/export", &["get"]),
    ("/v1/messages/{id}", &["delete", "get"]),
    ("/v1/messages/{id}/redrive", &["post"]),
    ("/v1/messages/{id}/kill", &["post"]),
    ("/v1/queues/{queue}/leases", &["post"]),
    ("/v1/messages/{id}/ack", &["post"]),
    ("/v1/messages/{id}/nack", &["post"]),
    ("/v1/messages/{id}/release", &["post"]),
    ("/v1/messages/{id}/extend", &["post"]),
    ("/v1/messages/ack", &["post"]),
    ("/v1/messages/nack", &["post"]),
    ("/v1/queues", &["get"]),
    ("/v1/queues/{queue}", &["get"]),
    ("/v1/endpoints", &["get"]),
    ("/v1/bridges", &["get"]),
    ("/v1/cluster", &["get"]),
    ("/v1/failure-groups", &["get"]),
    ("/v1/tasks", &["get", "post"]),
    ("/v1/tasks/{id}", &["get"]),
    ("/v1/tasks/{id}/pause", &["post"]),
    ("/v1/tasks/{id}/resume", &["post"]),
    ("/v1/tasks/{id}/cancel", &["post"]),
    ("/v1/audit", &["get"]),
    ("/healthz", &["get"]),
    ("/readyz", &["get"]),
    ("/metrics", &["get"]),
];

const HTTP_METHODS: &[&str] = &[
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

#[tokio::test]
async fn openapi_lists_every_route() {
    let s = TestServer::fast("").await;
    let (st, ctype, text) = s
        .send_text(reqwest::Method::GET, "/openapi.json", None)
        .await;
    assert_eq!(st, 200, "{text}");
    assert!(ctype.starts_with("application/json"), "{ctype}");
    let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "{doc}"
    );
    assert!(doc["info"]["title"].is_string(), "{doc}");
    let paths = doc["paths"].as_object().unwrap_or_else(|| panic!("{doc}"));
    let documented: BTreeMap<String, BTreeSet<String>> = paths
        .iter()
        .map(|(p, item)| {
            let methods = item
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| HTTP_METHODS.contains(&k.as_str()))
                .cloned()
                .collect();
            (p.clone(), methods)
        })
        .collect();
    let expected: BTreeMap<String, BTreeSet<String>> = ROUTES
        .iter()
        .map(|(p, m)| ((*p).to_owned(), m.iter().map(|x| (*x).to_owned()).collect()))
        .collect();
    assert_eq!(documented, expected, "{text}");
    // Every operation documents its responses.
    for (p, item) in paths {
        for (m, op) in item.as_object().unwrap() {
            if HTTP_METHODS.contains(&m.as_str()) {
                assert!(op["responses"].is_object(), "{m} {p}: {op}");
            }
        }
    }

    // And every documented route exists on the server (no 405, no route-level 404).
    for (p, methods) in ROUTES {
        let concrete = p
            .replace("{queue}", "probe")
            .replace("{id}", "0190b5c2-7d1e-7c3a-9f00-1a2b3c4d5e6f");
        for m in *methods {
            let method = reqwest::Method::from_bytes(m.to_uppercase().as_bytes()).unwrap();
            let body = (method == reqwest::Method::POST).then(|| json!({}));
            let (st, v) = s.send(method, &concrete, body).await;
            assert_ne!(st, 405, "{m} {concrete}: {v}");
            assert!(
                !(st == 404 && v["error"]["message"] == "no such route"),
                "{m} {concrete}: {v}"
            );
        }
    }
    s.stop().await;
}

#[tokio::test]
async fn bad_queue_names_in_paths() {
    let s = TestServer::fast("").await;
    let before = s.snapshot().await;
    for bad in [
        "a%20b",
        &"q".repeat(129),
        "%E8%AE%A2%E5%8D%95",
        "a%2Fb",
        "a%3Fb",
    ] {
        let got = s
            .post(&format!("/v1/queues/{bad}/messages"), json!({"payload": 1}))
            .await;
        assert_error(&got, 400, "invalid_queue");
        let got = s.post(&format!("/v1/queues/{bad}/leases"), json!({})).await;
        assert_error(&got, 400, "invalid_queue");
    }
    let got = s
        .post(
            &format!("/v1/queues/{}/messages", "x".repeat(200)),
            json!({"payload": 1}),
        )
        .await;
    assert_error_names(&got, 400, "invalid_queue", "128");
    assert_eq!(s.snapshot().await, before, "nothing changed");
    s.stop().await;
}
