//! Consuming: lease (max, length, long poll, `max_attempts`), ack, nack, release, extend,
//! stale, settled and expired leases, and the batch forms of ack and nack.

use crate::harness::{
    assert_error, assert_error_names, counts_of, id_of, lease_of, ms, ok, unknown_id, TestServer,
};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Queues with special policies, on top of the FAST default (50 ms fixed, 3 attempts).
const QUEUES: &str = r#"
[queues.slow.retry]
backoff = "fixed"
initial_delay = "1h"
jitter = "none"
[queues.rl.retry]
max_attempts = 2
backoff = "fixed"
initial_delay = "50ms"
jitter = "none"
[queues.capped.retry]
max_retry_after = "1s"
[queues.long]
lease = "45s"
"#;

#[tokio::test]
async fn lease_answers_every_field() {
    let s = TestServer::fast(QUEUES).await;
    let m = s
        .publish(
            "work",
            json!({"payload": {"job": 1}, "headers": {"h": "v"}, "key": "k-1", "priority": 3}),
        )
        .await;
    let (st, l) = s
        .post(
            "/v1/queues/work/leases",
            json!({"max": 1, "lease": "30s", "wait": "0s"}),
        )
        .await;
    assert_eq!(st, 200, "{l}");
    let got = l["messages"].as_array().unwrap_or_else(|| panic!("{l}"));
    assert_eq!(got.len(), 1, "{l}");
    let g = &got[0];
    assert_eq!(g["id"], m["id"], "{l}");
    assert!(g["lease"].as_str().is_some_and(|t| !t.is_empty()), "{l}");
    assert_eq!(g["attempt"], 1, "{l}");
    assert_eq!(g["payload"], json!({"job": 1}), "{l}");
    assert_eq!(g["headers"], json!({"h": "v"}), "{l}");
    assert_eq!(g["key"], "k-1", "{l}");
    assert_eq!(g["queue"], "work", "{l}");
    assert_eq!(g["priority"], 3, "{l}");
    assert_eq!(g["created_at"], m["created_at"], "{l}");
    assert!(g.get("last_error").is_none(), "first attempt: {l}");
    // The lease is exactly 30s from the lease time (the message's updated_at).
    let full = s.message(&id_of(g)).await;
    assert_eq!(full["state"], "leased", "{full}");
    assert_eq!(
        full["lease_expires_at"], g["lease_expires_at"],
        "{full} vs {l}"
    );
    assert_eq!(
        ms(g, "lease_expires_at") - ms(&full, "updated_at"),
        30_000,
        "{full} / {l}"
    );
    assert_eq!(s.counts("work").await, counts_of(&[("leased", 1)]));
    s.stop().await;
}

#[tokio::test]
async fn lease_max_and_default_lengths() {
    let s = TestServer::fast(QUEUES).await;
    for i in 0..5 {
        s.publish_payload("many", json!(i)).await;
    }
    assert_eq!(s.lease("many", json!({"max": 3})).await.len(), 3);
    assert_eq!(s.lease("many", json!({"max": 3})).await.len(), 2);
    assert!(s.lease("many", json!({"max": 3})).await.is_empty());
    assert_eq!(s.counts("many").await, counts_of(&[("leased", 5)]));

    // Default max is 1; an empty body is allowed.
    s.publish_payload("one", json!(1)).await;
    s.publish_payload("one", json!(2)).await;
    let (st, l) = s.post_raw("/v1/queues/one/leases", "").await;
    assert_eq!(st, 200, "{l}");
    assert_eq!(l["messages"].as_array().unwrap().len(), 1, "{l}");

    // Default lease 30s; a queue's configured lease wins; the request's wins over both.
    let check = |l: &Value, full: &Value, want: i64| {
        assert_eq!(
            ms(l, "lease_expires_at") - ms(full, "updated_at"),
            want,
            "{l} / {full}"
        );
    };
    let l = s.lease_one("one", "0s").await;
    check(&l, &s.message(&id_of(&l)).await, 30_000);
    s.publish_payload("long", json!(1)).await;
    s.publish_payload("long", json!(2)).await;
    let l = s.lease_one("long", "0s").await;
    check(&l, &s.message(&id_of(&l)).await, 45_000);
    let l = s.lease("long", json!({"lease": "2m"})).await.remove(0);
    check(&l, &s.message(&id_of(&l)).await, 120_000);
    s.stop().await;
}

#[tokio::test]
async fn long_poll_returns_empty_after_wait() {
    let s = TestServer::fast("").await;
    let t = Instant::now();
    let (st, l) = s
        .post("/v1/queues/empty/leases", json!({"wait": "200ms"}))
        .await;
    assert_eq!(st, 200, "{l}");
    assert_eq!(l, json!({"messages": []}), "{l}");
    assert!(
        t.elapsed() >= Duration::from_millis(150),
        "a long poll waits: {:?}",
        t.elapsed()
    );
    s.stop().await;
}

#[tokio::test]
async fn long_poll_is_woken_by_a_publish() {
    let s = std::sync::Arc::new(TestServer::fast("").await);
    let mut signals = s.engine.signals().subscribe();
    let poller = {
        let s = s.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let got = s.lease("wake", json!({"wait": "20s"})).await;
            (got, t.elapsed())
        })
    };
    signals.parked("wake").await;
    let id = s.publish_payload("wake", json!("hello")).await;
    let (got, took) = poller.await.unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["id"], id.as_str(), "{got:?}");
    assert!(
        took < Duration::from_secs(10),
        "woken by the publish, not by the deadline: {took:?}"
    );
    // A publish to another queue does not satisfy this queue's poll.
    let poller = {
        let s = s.clone();
        tokio::spawn(async move { s.lease("wake", json!({"wait": "300ms"})).await })
    };
    signals.parked("wake").await;
    s.publish_payload("elsewhere", json!(1)).await;
    assert!(poller.await.unwrap().is_empty());
    match std::sync::Arc::try_unwrap(s) {
        Ok(s) => s.stop().await,
        Err(_) => panic!("server still shared"),
    }
}

#[tokio::test]
async fn ack_finishes_and_is_never_delivered_again() {
    let s = TestServer::fast("").await;
    let id = s.publish_payload("acks", json!({"a": 1})).await;
    let l = s.lease_one("acks", "0s").await;
    let (st, a) = s.ack(&id, &lease_of(&l)).await;
    assert_eq!(st, 200, "{a}");
    assert_eq!(a["state"], "done", "{a}");
    assert!(a.get("finished_at").is_some(), "{a}");
    // Acking again with the same token is fine (a retried request).
    let (st, a2) = s.ack(&id, &lease_of(&l)).await;
    assert_eq!(st, 200, "double ack: {a2}");
    assert_eq!(a2["state"], "done", "{a2}");
    // Never again.
    assert!(s
        .lease("acks", json!({"max": 10, "wait": "300ms"}))
        .await
        .is_empty());
    assert_eq!(s.counts("acks").await, counts_of(&[("done", 1)]));
    let g = s.message(&id).await;
    let h = g["history"].as_array().unwrap_or_else(|| panic!("{g}"));
    assert_eq!(h.len(), 1, "one history entry, not two: {g}");
    assert_eq!(h[0]["event"], "acked", "{g}");
    assert_eq!(h[0]["attempt"], 1, "{g}");
    // Nack and extend of a done message are refused.
    let got = s
        .nack(&id, &lease_of(&l), json!({"class": "transient"}))
        .await;
    assert_eq!(got.0, 409, "{}", got.1);
    let got = s
        .post(
            &format!("/v1/messages/{id}/extend"),
            json!({"lease": lease_of(&l), "by": "10s"}),
        )
        .await;
    assert_eq!(got.0, 409, "{}", got.1);
    assert_eq!(s.counts("acks").await, counts_of(&[("done", 1)]));
    s.stop().await;
}

#[tokio::test]
async fn nack_transient_schedules_a_retry() {
    let s = TestServer::fast("").await;
    let id = s.publish_payload("n", json!(1)).await;
    let l = s.lease_one("n", "0s").await;
    let (st, n) = s
        .nack(
            &id,
            &lease_of(&l),
            json!({"class": "transient", "message": "503 from upstream"}),
        )
        .await;
    assert_eq!(st, 200, "{n}");
    assert_eq!(n["state"], "scheduled", "{n}");
    assert_eq!(
        ms(&n, "due_at") - ms(&n, "updated_at"),
        50,
        "fixed 50ms: {n}"
    );
    assert_eq!(n["last_error"]["class"], "transient", "{n}");
    assert_eq!(n["last_error"]["message"], "503 from upstream", "{n}");
    assert!(n.get("dead_reason").is_none(), "{n}");
    let l2 = s.lease_one("n", "5s").await;
    assert_eq!(l2["id"], id.as_str(), "{l2}");
    assert_eq!(l2["attempt"], 2, "{l2}");
    assert_ne!(l2["lease"], l["lease"], "a new token: {l2}");
    assert_eq!(l2["last_error"]["message"], "503 from upstream", "{l2}");

    // A nack without an error is a transient failure.
    let (st, n) = s
        .post(
            &format!("/v1/messages/{id}/nack"),
            json!({"lease": lease_of(&l2)}),
        )
        .await;
    assert_eq!(st, 200, "{n}");
    assert_eq!(n["state"], "scheduled", "{n}");
    assert_eq!(n["last_error"]["class"], "transient", "{n}");
    // Third and last attempt (max_attempts = 3): dead.
    let l3 = s.lease_one("n", "5s").await;
    assert_eq!(l3["attempt"], 3, "{l3}");
    let (st, n) = s
        .nack(&id, &lease_of(&l3), json!({"class": "transient"}))
        .await;
    assert_eq!(st, 200, "{n}");
    assert_eq!(n["state"], "dead", "{n}");
    assert_eq!(n["dead_reason"], "max_attempts", "{n}");
    s.stop().await;
}

#[tokio::test]
async fn nack_permanent_is_dead_at_once() {
    let s = TestServer::fast("").await;
    let id = s.publish_payload("p", json!(1)).await;
    let l = s.lease_one("p", "0s").await;
    let (st, n) = s
        .nack(
            &id,
            &lease_of(&l),
            json!({"class": "permanent", "message": "400 bad request"}),
        )
        .await;
    assert_eq!(st, 200, "{n}");
    assert_eq!(n["state"], "dead", "{n}");
    assert_eq!(n["dead_reason"], "permanent_error", "{n}");
    assert!(n.get("due_at").is_none(), "{n}");
    assert_eq!(s.counts("p").await, counts_of(&[("dead", 1)]));
    assert!(s
        .lease("p", json!({"max": 10, "wait": "200ms"}))
        .await
        .is_empty());
    s.stop().await;
}

#[tokio::test]
async fn nack_rate_limited_honours_retry_after_and_is_not_counted() {
    let s = TestServer::fast(QUEUES).await;
    // Queue rl has max_attempts = 2. Two rate-limited failures, then one transient one
    // still leave a retry; only the second counted failure makes it dead.
    let id = s.publish_payload("rl", json!(1)).await;
    let mut l = s.lease_one("rl", "0s").await;
    for attempt in 1..=2 {
        assert_eq!(l["attempt"], attempt, "{l}");
        let (st, n) = s
            .nack(
                &id,
                &lease_of(&l),
                json!({"class": "rate_limited", "retry_after": "300ms", "message": "429"}),
            )
            .await;
        assert_eq!(st, 200, "{n}");
        assert_eq!(n["state"], "scheduled", "not counted, so not dead: {n}");
        assert_eq!(
            ms(&n, "due_at") - ms(&n, "updated_at"),
            300,
            "due at now + retry_after: {n}"
        );
        assert_eq!(n["last_error"]["class"], "rate_limited", "{n}");
        l = s.lease_one("rl", "5s").await;
    }
    assert_eq!(l["attempt"], 3, "{l}");
    let (st, n) = s
        .nack(&id, &lease_of(&l), json!({"class": "transient"}))
        .await;
    assert_eq!(st, 200, "{n}");
    assert_eq!(n["state"], "scheduled", "first counted failure of 2: {n}");
    let l = s.lease_one("rl", "5s").await;
    assert_eq!(l["attempt"], 4, "{l}");
    let (st, n) = s
        .nack(&id, &lease_of(&l), json!({"class": "transient"}))
        .await;
    assert_eq!(st, 200, "{n}");
    assert_eq!(n["state"], "dead", "second counted failure: {n}");
    assert_eq!(n["dead_reason"], "max_attempts", "{n}");
    let g = s.message(&id).await;
    assert_eq!(g["history"][0]["retry_after_ms"], 300, "{g}");

    // A hostile retry_after is bounded by max_retry_after (1s on queue capped).
    let id = s.publish_payload("capped", json!(1)).await;
    let l = s.lease_one("capped", "0s").await;
    let (st, n) = s
        .nack(
            &id,
            &lease_of(&l),
            json!({"class": "rate_limited", "retry_after": "1d"}),
        )
        .await;
    assert_eq!(st, 200, "{n}");
    assert_eq!(ms(&n, "due_at") - ms(&n, "updated_at"), 1_000, "{n}");
    s.stop().await;
}

#[tokio::test]
async fn extend_moves_the_expiry_later_never_earlier() {
    let s = TestServer::fast("").await;
    let id = s.publish_payload("ext", json!(1)).await;
    let l = s.lease("ext", json!({"lease": "5s"})).await.remove(0);
    let before = ms(&l, "lease_expires_at");
    let (st, e) = s
        .post(
            &format!("/v1/messages/{id}/extend"),
            json!({"lease": lease_of(&l), "by": "60s"}),
        )
        .await;
    assert_eq!(st, 200, "{e}");
    assert_eq!(e["id"], id.as_str(), "{e}");
    let after = ms(&e, "lease_expires_at");
    assert!(after > before, "later: {e} vs {l}");
    assert_eq!(
        s.message(&id).await["lease_expires_at"],
        e["lease_expires_at"]
    );
    // A shorter extension does not shorten the lease.
    let (st, e2) = s
        .post(
            &format!("/v1/messages/{id}/extend"),
            json!({"lease": lease_of(&l), "by": "1s"}),
        )
        .await;
    assert_eq!(st, 200, "{e2}");
    assert_eq!(e2["lease_expires_at"], e["lease_expires_at"], "{e2}");
    // The token still acks.
    let (st, a) = s.ack(&id, &lease_of(&l)).await;
    assert_eq!(st, 200, "{a}");
    s.stop().await;
}

#[tokio::test]
async fn wrong_lease_token_is_409_lease_mismatch() {
    let s = TestServer::fast("").await;
    let id = s.publish_payload("tok", json!(1)).await;
    let l = s.lease_one("tok", "0s").await;
    let before = s.snapshot().await;
    for bad in ["nope", "", "1-0000000000000000"] {
        assert_error(&s.ack(&id, bad).await, 409, "lease_mismatch");
        assert_error(
            &s.nack(&id, bad, json!({"class": "permanent"})).await,
            409,
            "lease_mismatch",
        );
        assert_error(
            &s.post(
                &format!("/v1/messages/{id}/extend"),
                json!({"lease": bad, "by": "10s"}),
            )
            .await,
            409,
            "lease_mismatch",
        );
    }
    assert_eq!(s.snapshot().await, before, "nothing changed");
    // The right token still works.
    let (st, a) = s.ack(&id, &lease_of(&l)).await;
    assert_eq!(st, 200, "{a}");
    s.stop().await;
}

#[tokio::test]
async fn expired_lease_is_409_lease_expired() {
    let s = TestServer::fast(QUEUES).await;
    // Queue slow retries after 1h, so the expired message is not leased again
    // and its old token stays the last one handed out.
    let id = s.publish_payload("slow", json!(1)).await;
    let l = s.lease("slow", json!({"lease": "100ms"})).await.remove(0);
    tokio::time::sleep(Duration::from_millis(300)).await; // let the lease run out
    assert_error(&s.ack(&id, &lease_of(&l)).await, 409, "lease_expired");
    assert_error(
        &s.nack(&id, &lease_of(&l), json!({"class": "transient"}))
            .await,
        409,
        "lease_expired",
    );
    assert_error(
        &s.post(
            &format!("/v1/messages/{id}/extend"),
            json!({"lease": lease_of(&l), "by": "10s"}),
        )
        .await,
        409,
        "lease_expired",
    );
    s.stop().await;
}

#[tokio::test]
async fn expired_lease_counts_as_a_failed_attempt() {
    let s = TestServer::fast("").await;
    let id = s.publish_payload("exp", json!(1)).await;
    let l1 = s.lease("exp", json!({"lease": "100ms"})).await.remove(0);
    // The reaper fails attempt 1 (lease_expired) and the retry comes back as attempt 2.
    let l2 = s.lease_one("exp", "5s").await;
    assert_eq!(l2["id"], id.as_str(), "{l2}");
    assert_eq!(l2["attempt"], 2, "{l2}");
    assert_eq!(l2["last_error"]["code"], "lease_expired", "{l2}");
    // The old token is refused; the new one works.
    let got = s.ack(&id, &lease_of(&l1)).await;
    assert_eq!(got.0, 409, "{}", got.1);
    let code = got.1["error"]["code"].as_str().unwrap_or_default();
    assert!(
        code == "lease_mismatch" || code == "lease_expired",
        "{}",
        got.1
    );
    let (st, a) = s.ack(&id, &lease_of(&l2)).await;
    assert_eq!(st, 200, "{a}");
    let g = s.message(&id).await;
    let h = g["history"].as_array().unwrap_or_else(|| panic!("{g}"));
    assert_eq!(h.len(), 2, "{g}");
    assert_eq!(h[0]["event"], "failed", "{g}");
    assert_eq!(h[0]["error"]["code"], "lease_expired", "{g}");
    assert_eq!(h[1]["event"], "acked", "{g}");
    let (_, metrics) = s.get_text("/metrics").await;
    assert!(
        metrics.contains("redrive_deliveries_total{queue=\"exp\",outcome=\"lease_expired\"} 1\n"),
        "{metrics}"
    );
    s.stop().await;
}

#[tokio::test]
async fn unknown_and_malformed_ids() {
    let s = TestServer::fast("").await;
    let unknown = unknown_id();
    let before = s.snapshot().await;
    for action in ["ack", "nack", "extend"] {
        let body = json!({"lease": "x", "by": "1s"});
        let body = if action == "extend" {
            body
        } else {
            json!({"lease": "x"})
        };
        let got = s
            .post(&format!("/v1/messages/{unknown}/{action}"), body.clone())
            .await;
        assert_error(&got, 404, "not_found");
        let got = s
            .post(&format!("/v1/messages/not-an-id/{action}"), body)
            .await;
        assert_error(&got, 400, "invalid_id");
    }
    assert_eq!(s.snapshot().await, before);
    s.stop().await;
}

#[tokio::test]
async fn batch_ack_answers_each_item_in_order() {
    let s = TestServer::fast("").await;
    let a = s.publish_payload("ba", json!("a")).await;
    let b = s.publish_payload("ba", json!("b")).await;
    let leased = s.lease("ba", json!({"max": 2})).await;
    let token = |id: &str| {
        leased
            .iter()
            .find(|m| m["id"] == id)
            .map(lease_of)
            .unwrap_or_else(|| panic!("{id} not leased: {leased:?}"))
    };
    let (st, r) = s
        .post(
            "/v1/messages/ack",
            json!({"items": [
                {"id": a, "lease": token(&a)},
                {"id": b, "lease": "stale"},
                {"id": unknown_id(), "lease": "x"},
                {"id": "garbage", "lease": "x"},
                {"id": b, "lease": token(&b)}
            ]}),
        )
        .await;
    assert_eq!(st, 200, "{r}");
    let items = r["items"].as_array().unwrap_or_else(|| panic!("{r}"));
    assert_eq!(items.len(), 5, "{r}");
    let want = [
        (a.as_str(), 200, None),
        (b.as_str(), 409, Some("lease_mismatch")),
        (
            "0190b5c2-7d1e-7c3a-9f00-1a2b3c4d5e6f",
            404,
            Some("not_found"),
        ),
        ("garbage", 400, Some("invalid_id")),
        (b.as_str(), 200, None),
    ];
    for (i, (id, status, code)) in want.iter().enumerate() {
        assert_eq!(items[i]["id"], *id, "item {i}: {r}");
        assert_eq!(items[i]["status"], *status, "item {i}: {r}");
        match code {
            Some(c) => {
                assert_eq!(items[i]["error"]["code"], *c, "item {i}: {r}");
                assert!(items[i].get("message").is_none(), "item {i}: {r}");
            }
            None => {
                assert_eq!(items[i]["message"]["state"], "done", "item {i}: {r}");
                assert!(items[i].get("error").is_none(), "item {i}: {r}");
            }
        }
    }
    assert_eq!(s.counts("ba").await, counts_of(&[("done", 2)]));
    s.stop().await;
}

#[tokio::test]
async fn batch_nack_answers_each_item_in_order() {
    let s = TestServer::fast("").await;
    let ids: Vec<String> = vec![
        s.publish_payload("bn", json!(0)).await,
        s.publish_payload("bn", json!(1)).await,
        s.publish_payload("bn", json!(2)).await,
    ];
    let leased = s.lease("bn", json!({"max": 3})).await;
    let token = |id: &str| {
        leased
            .iter()
            .find(|m| m["id"] == id)
            .map(lease_of)
            .unwrap_or_else(|| panic!("{id} not leased: {leased:?}"))
    };
    let (st, r) = s
        .post(
            "/v1/messages/nack",
            json!({"items": [
                {"id": ids[0], "lease": token(&ids[0]), "error": {"class": "transient", "message": "t"}},
                {"id": ids[1], "lease": token(&ids[1]), "error": {"class": "permanent"}},
                {"id": ids[2], "lease": token(&ids[2]), "error": {"class": "fatal"}},
                {"id": ids[2], "lease": "stale"},
                {"id": unknown_id(), "lease": "x"},
                {"id": "garbage", "lease": "x"}
            ]}),
        )
        .await;
    assert_eq!(st, 200, "{r}");
    let items = r["items"].as_array().unwrap_or_else(|| panic!("{r}"));
    assert_eq!(items.len(), 6, "{r}");
    assert_eq!(items[0]["status"], 200, "{r}");
    assert_eq!(items[0]["message"]["state"], "scheduled", "{r}");
    assert!(items[0]["message"]["due_at"].is_string(), "{r}");
    assert_eq!(items[1]["status"], 200, "{r}");
    assert_eq!(items[1]["message"]["state"], "dead", "{r}");
    assert_eq!(items[1]["message"]["dead_reason"], "permanent_error", "{r}");
    assert_eq!(items[2]["status"], 400, "{r}");
    assert_eq!(items[2]["error"]["code"], "invalid_error_class", "{r}");
    assert!(
        items[2]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("items[2].error.class")),
        "{r}"
    );
    assert_eq!(items[3]["status"], 409, "{r}");
    assert_eq!(items[3]["error"]["code"], "lease_mismatch", "{r}");
    assert_eq!(items[4]["status"], 404, "{r}");
    assert_eq!(items[5]["status"], 400, "{r}");
    assert_eq!(items[5]["error"]["code"], "invalid_id", "{r}");
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(items[i]["id"], id.as_str(), "{r}");
    }
    // Message 2 (bad class) is still leased: its item changed nothing.
    assert_eq!(s.message(&ids[2]).await["state"], "leased");
    s.stop().await;
}

#[tokio::test]
async fn batch_ack_nack_size_limits() {
    let s = TestServer::fast("").await; // max_batch = 20
    s.publish_payload("bl", json!(1)).await;
    let l = s.lease_one("bl", "0s").await;
    let before = s.snapshot().await;
    let item = json!({"id": id_of(&l), "lease": lease_of(&l)});
    for path in ["/v1/messages/ack", "/v1/messages/nack"] {
        let got = s.post(path, json!({"items": []})).await;
        assert_error_names(&got, 400, "batch_too_large", "items");
        let many: Vec<Value> = (0..21).map(|_| item.clone()).collect();
        let got = s.post(path, json!({ "items": many })).await;
        assert_error_names(&got, 400, "batch_too_large", "items");
        let got = s.post(path, json!({})).await;
        assert_error_names(&got, 400, "invalid_body", "items");
    }
    assert_eq!(s.snapshot().await, before, "nothing changed");
    s.stop().await;
}

/// Defect 13 of issue 5: a retried ack (same token, already done) answers 200 again but
/// used to be counted again in `redrive_deliveries_total` and
/// `redrive_messages_finished_total`. Each counter moves by exactly one, whether the
/// repeat comes alone or in a batch.
#[tokio::test]
async fn retried_ack_is_counted_once_in_metrics() {
    let s = TestServer::fast(QUEUES).await;
    let id = s.publish_payload("twice", json!("x")).await;
    let l = s.lease_one("twice", "0s").await;
    let token = lease_of(&l);
    for _ in 0..2 {
        let (st, a) = s.ack(&id, &token).await;
        assert_eq!(st, 200, "{a}");
    }
    let (st, r) = s
        .post(
            "/v1/messages/ack",
            json!({"items": [{"id": id, "lease": token}]}),
        )
        .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["items"][0]["status"], 200, "{r}");
    let (_, metrics) = s.get_text("/metrics").await;
    for line in [
        "redrive_deliveries_total{queue=\"twice\",outcome=\"acked\"} 1\n",
        "redrive_messages_finished_total{queue=\"twice\",result=\"first_try\"} 1\n",
    ] {
        assert!(metrics.contains(line), "want {line:?} in:\n{metrics}");
    }
    s.stop().await;
}

/// The 409 of a call with a settled lease's token: `lease_settled`, how in `settled` and
/// in words.
fn assert_settled(got: &(u16, Value), how: &str) {
    assert_error(got, 409, "lease_settled");
    assert_eq!(got.1["error"]["settled"], how, "{}", got.1);
    let msg = got.1["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains(how),
        "the message does not say {how}: {}",
        got.1
    );
}

/// Issue 15, defect 10: an ack after a nack said `lease_expired` ("the lease has expired");
/// it had not expired, it was nacked. Each settled lease now says how, alone and in a batch.
#[tokio::test]
async fn late_calls_with_a_settled_lease_answer_lease_settled_saying_how() {
    let s = TestServer::fast(QUEUES).await;
    // slow: a retry waits 1 h, so a nacked message is not leased again meanwhile.
    let nacked = s.publish_payload("slow", json!("nacked")).await;
    let ln = s.lease("slow", json!({})).await.remove(0);
    ok(
        s.nack(&nacked, &lease_of(&ln), json!({"class": "transient"}))
            .await,
    );
    let before = s.snapshot().await;
    assert_settled(&s.ack(&nacked, &lease_of(&ln)).await, "nacked");
    assert_settled(
        &s.nack(&nacked, &lease_of(&ln), json!({"class": "permanent"}))
            .await,
        "nacked",
    );
    assert_settled(
        &s.post(
            &format!("/v1/messages/{nacked}/extend"),
            json!({"lease": lease_of(&ln), "by": "10s"}),
        )
        .await,
        "nacked",
    );
    assert_eq!(
        s.snapshot().await,
        before,
        "a refused late call changed something"
    );

    let acked = s.publish_payload("work", json!("acked")).await;
    let la = s.lease("work", json!({})).await.remove(0);
    ok(s.ack(&acked, &lease_of(&la)).await);
    // A repeated ack with the same token is a retried request: 200 again, no change.
    ok(s.ack(&acked, &lease_of(&la)).await);
    assert_settled(
        &s.nack(&acked, &lease_of(&la), json!({"class": "transient"}))
            .await,
        "acked",
    );
    assert_settled(
        &s.post(
            &format!("/v1/messages/{acked}/extend"),
            json!({"lease": lease_of(&la), "by": "10s"}),
        )
        .await,
        "acked",
    );
    assert_settled(
        &s.post(
            &format!("/v1/messages/{acked}/release"),
            json!({"lease": lease_of(&la)}),
        )
        .await,
        "acked",
    );

    let released = s.publish_payload("slow", json!("released")).await;
    let lr = s
        .lease("slow", json!({}))
        .await
        .into_iter()
        .find(|l| l["id"] == released.as_str())
        .expect("the new message");
    ok(s.post(
        &format!("/v1/messages/{released}/release"),
        json!({"lease": lease_of(&lr), "delay": "1h"}),
    )
    .await);
    assert_settled(&s.ack(&released, &lease_of(&lr)).await, "released");
    assert_settled(
        &s.nack(&released, &lease_of(&lr), json!({"class": "transient"}))
            .await,
        "released",
    );

    // The batch forms answer each item the same way.
    let (st, b) = s
        .post(
            "/v1/messages/ack",
            json!({"items": [
                {"id": nacked, "lease": lease_of(&ln)},
                {"id": released, "lease": lease_of(&lr)},
            ]}),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    for (item, how) in b["items"]
        .as_array()
        .unwrap()
        .iter()
        .zip(["nacked", "released"])
    {
        assert_eq!(item["status"], 409, "{b}");
        assert_eq!(item["error"]["code"], "lease_settled", "{b}");
        assert_eq!(item["error"]["settled"], how, "{b}");
    }
    let (st, b) = s
        .post(
            "/v1/messages/nack",
            json!({"items": [{"id": acked, "lease": lease_of(&la), "error": {"class": "transient"}}]}),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["items"][0]["error"]["code"], "lease_settled", "{b}");
    assert_eq!(b["items"][0]["error"]["settled"], "acked", "{b}");
    // Other errors carry no `settled`.
    let got = s.ack(&acked, "bogus").await;
    assert_error(&got, 409, "lease_mismatch");
    assert!(got.1["error"].get("settled").is_none(), "{}", got.1);
    s.stop().await;
}

/// SPEC §5: a consumer hands a lease back unattempted: ready again in its place, the
/// attempt not charged, no history entry; with `delay`, scheduled until then.
#[tokio::test]
async fn release_hands_a_lease_back_unattempted() {
    let s = TestServer::fast(QUEUES).await;
    let a = s.publish_payload("rel", json!("a")).await;
    let b = s.publish_payload("rel", json!("b")).await;
    let l = s.lease("rel", json!({})).await.remove(0);
    assert_eq!(l["id"], a.as_str());
    let m = ok(s
        .post(
            &format!("/v1/messages/{a}/release"),
            json!({"lease": lease_of(&l)}),
        )
        .await);
    assert_eq!(m["state"], "ready", "{m}");
    assert_eq!(m["attempts"], 0, "the released attempt was charged: {m}");
    let got = s.message(&a).await;
    assert!(
        got.get("history").is_none_or(|h| h == &json!([])),
        "a release wrote history: {got}"
    );
    assert_eq!(s.counts("rel").await, counts_of(&[("ready", 2)]));
    // It keeps its place: leased first again, still attempt 1.
    let again = s.lease("rel", json!({"max": 2})).await;
    assert_eq!(again[0]["id"], a.as_str(), "{again:?}");
    assert_eq!(again[1]["id"], b.as_str(), "{again:?}");
    assert_eq!(again[0]["attempt"], 1, "{again:?}");
    // With a delay: scheduled until then.
    let t0 = ms(&s.message(&b).await, "updated_at");
    let m = ok(s
        .post(
            &format!("/v1/messages/{b}/release"),
            json!({"lease": lease_of(&again[1]), "delay": "1h"}),
        )
        .await);
    assert_eq!(m["state"], "scheduled", "{m}");
    // `t0` is the store's clock; the delay is added to this node's, which follows the
    // store's within half a heartbeat's round trip (at most 100 ms, `engine/clock.rs`): a
    // loaded machine showed a few milliseconds of it.
    let due = ms(&m, "due_at");
    assert!((3_599_900..3_700_000).contains(&(due - t0)), "{m}");
    ok(s.ack(&a, &lease_of(&again[0])).await);
    let (_, metrics) = s.get_text("/metrics").await;
    assert!(
        metrics.contains("redrive_deliveries_total{queue=\"rel\",outcome=\"released\"} 2\n"),
        "{metrics}"
    );
    s.stop().await;
}

/// Bad release bodies are 400 naming the field, and change nothing.
#[tokio::test]
async fn bad_release_is_400_and_changes_nothing() {
    let s = TestServer::fast(QUEUES).await;
    let id = s.publish_payload("rel", json!(1)).await;
    let l = s.lease("rel", json!({})).await.remove(0);
    let before = s.snapshot().await;
    let path = format!("/v1/messages/{id}/release");
    for (body, needle) in [
        (json!({}), "lease"),
        (json!({"lease": lease_of(&l), "delay": "soon"}), "delay"),
        (json!({"lease": lease_of(&l), "delay": "-1s"}), "delay"),
        (json!({"lease": lease_of(&l), "delay": "9999d"}), "delay"),
        (json!({"lease": lease_of(&l), "until": "1s"}), "until"),
    ] {
        let got = s.post(&path, body.clone()).await;
        assert_eq!(got.0, 400, "{body}: {}", got.1);
        let msg = got.1["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{body}: {}", got.1);
    }
    assert_error(
        &s.post(
            &format!("/v1/messages/{}/release", unknown_id()),
            json!({"lease": "x"}),
        )
        .await,
        404,
        "not_found",
    );
    assert_error(
        &s.post(&path, json!({"lease": "bogus"})).await,
        409,
        "lease_mismatch",
    );
    assert_eq!(
        s.snapshot().await,
        before,
        "a refused release changed something"
    );
    s.stop().await;
}

/// A consumer that releases everything it leases is no hot loop: after `max_rate_limited`
/// uncharged releases each one counts as a failed attempt, and the message ends dead.
#[tokio::test]
async fn releases_past_max_rate_limited_count_and_end_dead() {
    let s = TestServer::fast(
        r#"
[queues.releaser.retry]
max_attempts = 2
backoff = "fixed"
initial_delay = "50ms"
jitter = "none"
max_rate_limited = 2
"#,
    )
    .await;
    let id = s.publish_payload("releaser", json!(1)).await;
    let release = |l: Value| {
        let s = &s;
        let id = id.clone();
        async move {
            ok(s.post(
                &format!("/v1/messages/{id}/release"),
                json!({"lease": lease_of(&l)}),
            )
            .await)
        }
    };
    for _ in 0..2 {
        let l = s.lease_one("releaser", "5s").await;
        assert_eq!(l["attempt"], 1);
        let m = release(l).await;
        assert_eq!(
            (m["state"].as_str(), m["attempts"].as_u64()),
            (Some("ready"), Some(0)),
            "{m}"
        );
    }
    let l = s.lease_one("releaser", "5s").await;
    let m = release(l).await;
    assert_eq!(
        m["state"], "scheduled",
        "the third release was not charged: {m}"
    );
    assert_eq!(m["attempts"], 1, "{m}");
    assert_eq!(m["last_error"]["code"], "released", "{m}");
    let l = s.lease_one("releaser", "5s").await;
    assert_eq!(
        (l["attempt"].as_u64(), l["max_attempts"].as_u64()),
        (Some(2), Some(2)),
        "{l}"
    );
    let m = release(l).await;
    assert_eq!(m["state"], "dead", "{m}");
    assert_eq!(m["dead_reason"], "max_attempts", "{m}");
    let got = s.message(&id).await;
    let h = got["history"].as_array().unwrap();
    assert_eq!(h.len(), 2, "{got}");
    assert!(h.iter().all(|e| e["error"]["code"] == "released"), "{got}");
    s.stop().await;
}

/// SPEC §5: a leased message carries `max_attempts` beside `attempt`, so a handler knows
/// its last try: `attempt == max_attempts` exactly when a failure makes it dead, also
/// after a redrive (a fresh budget while the attempt numbers go on).
#[tokio::test]
async fn lease_says_max_attempts_and_attempt_equal_to_it_is_the_last_try() {
    let s = TestServer::fast(QUEUES).await;
    let id = s.publish_payload("tries", json!(1)).await;
    for attempt in 1..=3u64 {
        let l = s.lease_one("tries", "5s").await;
        assert_eq!(l["attempt"], attempt, "{l}");
        assert_eq!(l["max_attempts"], 3, "{l}");
        let (st, m) = s
            .nack(&id, &lease_of(&l), json!({"class": "transient"}))
            .await;
        assert_eq!(st, 200, "{m}");
        assert_eq!(
            m["state"] == "dead",
            l["attempt"] == l["max_attempts"],
            "{l} → {m}"
        );
    }
    ok(s.post(&format!("/v1/messages/{id}/redrive"), json!({}))
        .await);
    let l = s.lease_one("tries", "5s").await;
    assert_eq!(
        (l["attempt"].as_u64(), l["max_attempts"].as_u64()),
        (Some(4), Some(6)),
        "{l}"
    );
    s.stop().await;
}
