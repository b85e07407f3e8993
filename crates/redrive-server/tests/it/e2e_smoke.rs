//! The README walk-through, end to end: publish → lease → nack → retried → dead →
//! search → redrive → ack.

use crate::harness::TestServer;
use serde_json::json;

const FAST_RETRY: &str = r#"
[queues.orders.retry]
max_attempts = 2
backoff = "fixed"
initial_delay = "50ms"
jitter = "none"
"#;

#[tokio::test]
async fn walkthrough_publish_nack_dead_redrive_ack() {
    let s = TestServer::start(FAST_RETRY).await;
    let (st, m) = s
        .post(
            "/v1/queues/orders/messages",
            json!({"payload": {"order": 42}, "key": "c-1"}),
        )
        .await;
    assert_eq!(st, 201, "{m}");
    assert_eq!(m["state"], "ready");
    let id = m["id"].as_str().unwrap().to_owned();

    let (st, l) = s
        .post(
            "/v1/queues/orders/leases",
            json!({"max": 10, "lease": "30s"}),
        )
        .await;
    assert_eq!(st, 200, "{l}");
    assert_eq!(l["messages"][0]["id"], id.as_str());
    assert_eq!(l["messages"][0]["attempt"], 1);
    let lease = l["messages"][0]["lease"].as_str().unwrap().to_owned();

    let (st, n) = s
        .post(
            &format!("/v1/messages/{id}/nack"),
            json!({"lease": lease, "error": {"class": "transient", "message": "db timeout"}}),
        )
        .await;
    assert_eq!(st, 200, "{n}");
    assert_eq!(n["state"], "scheduled");

    // The retry comes back on its schedule: a long poll gets it.
    let (st, l) = s
        .post("/v1/queues/orders/leases", json!({"wait": "5s"}))
        .await;
    assert_eq!(st, 200);
    assert_eq!(l["messages"][0]["id"], id.as_str(), "{l}");
    assert_eq!(l["messages"][0]["attempt"], 2);
    assert_eq!(l["messages"][0]["last_error"]["message"], "db timeout");
    let lease = l["messages"][0]["lease"].as_str().unwrap().to_owned();

    let (st, n) = s
        .post(
            &format!("/v1/messages/{id}/nack"),
            json!({"lease": lease, "error": {"class": "transient"}}),
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(n["state"], "dead", "{n}");
    assert_eq!(n["dead_reason"], "max_attempts");

    let (st, found) = s.get("/v1/messages?queue=orders&state=dead&q=order").await;
    assert_eq!(st, 200);
    assert_eq!(found["messages"][0]["id"], id.as_str(), "{found}");

    let (st, full) = s.get(&format!("/v1/messages/{id}")).await;
    assert_eq!(st, 200);
    assert_eq!(full["history"].as_array().unwrap().len(), 2, "{full}");

    let (st, r) = s
        .post(&format!("/v1/messages/{id}/redrive"), json!({}))
        .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["state"], "ready");

    let (_, l) = s.post("/v1/queues/orders/leases", json!({})).await;
    let lease = l["messages"][0]["lease"].as_str().unwrap().to_owned();
    let (st, a) = s
        .post(&format!("/v1/messages/{id}/ack"), json!({"lease": lease}))
        .await;
    assert_eq!(st, 200, "{a}");
    assert_eq!(a["state"], "done");

    let (st, metrics) = s.get_text("/metrics").await;
    assert_eq!(st, 200);
    assert!(
        metrics
            .contains("redrive_messages_finished_total{queue=\"orders\",result=\"after_retry\"} 1"),
        "{metrics}"
    );
    s.stop().await;
}
