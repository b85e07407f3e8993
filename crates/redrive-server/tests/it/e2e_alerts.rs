//! Alerts (SPEC §12) end to end: a real server whose alert sinks are push queues to an axum
//! mock on loopback (the mock of `e2e_push`). Deaths and thresholds happen over the API; the
//! alerts arrive as push deliveries.

use crate::e2e_push::{Answer, Got, Mock};
use crate::harness::*;
use redrive_server::engine::{Signal, SignalReceiver};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A server with two sinks on `mock`: `oncall-json` (queue `ops-json`, path `/json`, every
/// queue) and `oncall-feishu` (queue `ops-feishu`, path `/feishu`, only `orders`). Evaluated
/// every 200 ms, dead letters batched over 1 s; `orders` dies at the first failure.
async fn server(mock: &Mock, thresholds: &str) -> TestServer {
    TestServer::start(&format!(
        r#"
[push]
allow_cidrs = ["127.0.0.1/32"]
[alerts]
interval = "200ms"
dead_letter_window = "1s"
[[alerts.sinks]]
name = "oncall-json"
queue = "ops-json"
template = "json"
[[alerts.sinks]]
name = "oncall-feishu"
queue = "ops-feishu"
template = "feishu"
queues = ["orders"]
{thresholds}
[queues.orders.retry]
max_attempts = 1
[queues.ops-json]
delivery = "push"
[queues.ops-json.push]
url = "{json}"
[queues.ops-feishu]
delivery = "push"
[queues.ops-feishu.push]
url = "{feishu}"
"#,
        json = mock.url("/json"),
        feishu = mock.url("/feishu"),
    ))
    .await
}

/// The JSON bodies `mock` got on `path`, in order.
fn bodies(mock: &Mock, path: &str) -> Vec<Value> {
    mock.got()
        .iter()
        .filter(|g: &&Got| g.path == path)
        .map(|g| serde_json::from_slice(&g.body).unwrap())
        .collect()
}

/// Poll `f` (every 20 ms, up to 20 s) until it gives a value.
async fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait for `n` more evaluations of the notifier.
async fn rounds(rx: &mut SignalReceiver, n: usize) {
    for _ in 0..n {
        let got = tokio::time::timeout(
            Duration::from_secs(20),
            rx.wait_for(|s| matches!(s, Signal::AlertsChecked { .. })),
        )
        .await;
        assert!(
            matches!(got, Ok(Some(_))),
            "the notifier stopped evaluating"
        );
    }
}

/// Messages in `queue`, every state.
async fn total(s: &TestServer, queue: &str) -> u64 {
    let c = s.counts(queue).await;
    ["scheduled", "ready", "leased", "done", "dead"]
        .iter()
        .map(|st| count(&c, st))
        .sum()
}

#[tokio::test]
async fn three_deaths_are_one_batched_alert_per_sink_delivered_by_push() {
    let mock = Mock::start(|_, _| Answer::status(200)).await;
    let s = server(&mock, "").await;
    let mut signals = s.engine.signals().subscribe();
    for n in 0..3 {
        s.publish_payload("orders", json!({"n": n})).await;
    }
    let leased = s.lease("orders", json!({"max": 3})).await;
    assert_eq!(leased.len(), 3);
    // One batch nack (one store transition): the three die together, whatever the machine's
    // speed, so they fall in one window. Each error names its message: the fingerprint
    // normalises the id away.
    let items: Vec<Value> = leased
        .iter()
        .map(|m| {
            let id = id_of(m);
            let message = format!("HTTP 503 from payments (req {id})");
            json!({"id": id, "lease": lease_of(m), "error": {"class": "transient", "message": message}})
        })
        .collect();
    let (st, r) = s.post("/v1/messages/nack", json!({ "items": items })).await;
    assert_eq!(st, 200, "{r}");
    let mut ids = Vec::new();
    for item in r["items"].as_array().unwrap() {
        assert_eq!(item["message"]["state"], "dead", "{r}");
        ids.push(item["message"]["id"].clone());
    }
    let alert = until("the JSON alert", || bodies(&mock, "/json").pop()).await;
    let feishu = until("the Feishu alert", || bodies(&mock, "/feishu").pop()).await;
    assert_eq!(alert["kind"], "dead_letters", "{alert}");
    assert_eq!(alert["status"], "firing");
    assert_eq!(alert["queue"], "orders");
    assert_eq!(alert["count"], 3, "one batch holds all three: {alert}");
    assert_eq!(alert["value"], 3);
    assert_eq!(alert["threshold"], 1);
    assert_eq!(alert["window"], "1s");
    assert_eq!(
        alert["top_reasons"],
        json!([{"fingerprint": "transient: HTTP 503 from payments (req <id>)", "count": 3}])
    );
    let mut examples = alert["examples"].as_array().unwrap().clone();
    examples.sort_by_key(|v| v.to_string());
    ids.sort_by_key(|v| v.to_string());
    assert_eq!(examples, ids);
    assert_eq!(alert["link"], "/ui/messages?queue=orders&state=dead");
    let text = alert["text"].as_str().unwrap();
    assert!(
        text.starts_with("[redrive] 3 new dead letters in orders in the last 1s; top reasons: transient: HTTP 503 from payments (req <id>) (3)"),
        "{text}"
    );
    assert_eq!(
        feishu,
        json!({"msg_type": "text", "content": {"text": text.replace('<', "\u{ff1c}").replace('>', "\u{ff1e}")}}),
        "the same alert, in Feishu's shape (angle brackets made inert)"
    );
    // The alert is a message of the sink queue, delivered by push like any other: it has an
    // id (the webhook-id), an idempotency key derived from sink, kind, queue and window.
    let got = mock.got();
    let delivered = got.iter().find(|g| g.path == "/json").unwrap();
    // Done once its ack commits, a moment after the endpoint answered.
    let m = s.done_message(&delivered.headers["webhook-id"]).await;
    assert_eq!(m["queue"], "ops-json");
    let key = m["idempotency_key"].as_str().unwrap();
    assert!(
        key.starts_with("alert:oncall-json:dead_letters:orders:"),
        "{key}"
    );
    // Exactly one: later evaluations add nothing, to either sink.
    rounds(&mut signals, 3).await;
    assert_eq!(
        bodies(&mock, "/json").len(),
        1,
        "{:?}",
        bodies(&mock, "/json")
    );
    assert_eq!(bodies(&mock, "/feishu").len(), 1);
    assert_eq!(total(&s, "ops-json").await, 1);
    assert_eq!(total(&s, "ops-feishu").await, 1);
    let (_, metrics) = s.get_text("/metrics").await;
    for sink in ["oncall-json", "oncall-feishu"] {
        let line = format!("redrive_alerts_sent_total{{sink=\"{sink}\",kind=\"dead_letters\"}} 1");
        assert!(metrics.contains(&line), "{line} not in /metrics");
    }
    s.stop().await;
}

#[tokio::test]
async fn a_backlog_threshold_fires_then_resolves() {
    let mock = Mock::start(|_, _| Answer::status(200)).await;
    let s = server(&mock, "[alerts.thresholds.jobs]\nbacklog = 2\n").await;
    let mut signals = s.engine.signals().subscribe();
    let backlog = |mock: &Mock| -> Vec<Value> {
        bodies(mock, "/json")
            .into_iter()
            .filter(|b| b["kind"] == "backlog")
            .collect()
    };
    for n in 0..3 {
        s.publish_payload("jobs", json!({"n": n})).await;
    }
    let firing = until("the firing alert", || backlog(&mock).pop()).await;
    assert_eq!(firing["status"], "firing", "{firing}");
    assert_eq!(firing["queue"], "jobs");
    assert_eq!(firing["value"], 3);
    assert_eq!(firing["threshold"], 2);
    assert_eq!(firing["link"], "/ui/messages?queue=jobs");
    assert!(
        firing.get("count").is_none() && firing.get("window").is_none(),
        "{firing}"
    );
    // Still above: no repeat before `repeat` (1 h).
    rounds(&mut signals, 3).await;
    assert_eq!(backlog(&mock).len(), 1);
    // Two are consumed: 1 left, the alert resolves.
    for m in s.lease("jobs", json!({"max": 2})).await {
        let (st, b) = s.ack(&id_of(&m), &lease_of(&m)).await;
        assert_eq!(st, 200, "{b}");
    }
    let resolved = until("the resolved alert", || {
        backlog(&mock)
            .into_iter()
            .find(|b| b["status"] == "resolved")
    })
    .await;
    assert_eq!(resolved["value"], 1, "{resolved}");
    assert_eq!(resolved["threshold"], 2);
    assert_eq!(
        resolved["text"],
        "[redrive] resolved: backlog of jobs is 1 (ready + scheduled), at most 2. /ui/messages?queue=jobs"
    );
    rounds(&mut signals, 3).await;
    let statuses: Vec<Value> = backlog(&mock).iter().map(|b| b["status"].clone()).collect();
    assert_eq!(statuses, [json!("firing"), json!("resolved")]);
    assert!(
        bodies(&mock, "/feishu").is_empty(),
        "the Feishu sink only takes alerts about orders"
    );
    s.stop().await;
}
