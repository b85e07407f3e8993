//! `POST /v1/queues/{queue}/messages`: single, batch, idempotency, delay, priority,
//! headers, failures reported at publish.

use crate::harness::{
    assert_error, assert_error_names, count, counts_of, id_of, lease_of, ms, TestServer,
};
use serde_json::json;
use std::collections::HashSet;

#[tokio::test]
async fn single_publish_answers_201_with_the_message() {
    let s = TestServer::fast("").await;
    let (st, m) = s
        .post(
            "/v1/queues/orders.paid:v1-eu_2/messages",
            json!({
                "payload": {"order": 42, "items": [1, 2]},
                "headers": {"trace": "abc"},
                "key": "customer-7",
                "idempotency_key": "order-42",
                "priority": 5
            }),
        )
        .await;
    assert_eq!(st, 201, "{m}");
    let id = id_of(&m);
    assert_eq!(id.len(), 36, "id should be a hyphenated UUID: {m}");
    assert_eq!(m["queue"], "orders.paid:v1-eu_2", "{m}");
    assert_eq!(m["state"], "ready", "{m}");
    assert_eq!(m["payload"], json!({"order": 42, "items": [1, 2]}), "{m}");
    assert_eq!(m["headers"], json!({"trace": "abc"}), "{m}");
    assert_eq!(m["key"], "customer-7", "{m}");
    assert_eq!(m["idempotency_key"], "order-42", "{m}");
    assert_eq!(m["priority"], 5, "{m}");
    assert_eq!(m["attempts"], 0, "{m}");
    let created = ms(&m, "created_at");
    let due = ms(&m, "due_at");
    assert!(due >= created - 1, "a plain publish is due now: {m}");
    assert!(m.get("dead_reason").is_none(), "{m}");
    assert!(m.get("last_error").is_none(), "{m}");

    // GET shows the same message.
    let g = s.message(&id).await;
    for f in [
        "id",
        "queue",
        "state",
        "payload",
        "headers",
        "key",
        "priority",
        "created_at",
    ] {
        assert_eq!(g[f], m[f], "field {f}: GET {g} vs publish {m}");
    }
    assert_eq!(
        s.counts("orders.paid:v1-eu_2").await,
        counts_of(&[("ready", 1)])
    );

    // Defaults: no headers → {}, priority 0; a null payload is a payload.
    let m = s.publish("orders", json!({"payload": null})).await;
    assert_eq!(m["payload"], json!(null), "{m}");
    assert_eq!(m["priority"], 0, "{m}");
    assert_eq!(m["headers"], json!({}), "{m}");
    assert!(m.get("key").is_none(), "{m}");
    // The longest legal queue name works.
    let long = "q".repeat(128);
    s.publish(&long, json!({"payload": 1})).await;
    s.stop().await;
}

#[tokio::test]
async fn batch_publish_answers_201_with_messages_in_order() {
    let s = TestServer::fast("").await;
    let (st, b) = s
        .post(
            "/v1/queues/batch/messages",
            json!({"messages": [
                {"payload": {"n": 0}},
                {"payload": {"n": 1}, "key": "k", "priority": 9},
                {"payload": {"n": 2}, "delay": "1h"}
            ]}),
        )
        .await;
    assert_eq!(st, 201, "{b}");
    let msgs = b["messages"].as_array().unwrap_or_else(|| panic!("{b}"));
    assert_eq!(msgs.len(), 3, "{b}");
    for (i, m) in msgs.iter().enumerate() {
        assert_eq!(m["payload"]["n"], i, "order kept: {b}");
        assert_eq!(m["queue"], "batch", "{b}");
    }
    assert_eq!(msgs[1]["key"], "k", "{b}");
    assert_eq!(msgs[1]["priority"], 9, "{b}");
    assert_eq!(msgs[2]["state"], "scheduled", "{b}");
    let ids: HashSet<String> = msgs.iter().map(id_of).collect();
    assert_eq!(ids.len(), 3, "distinct ids: {b}");
    assert_eq!(
        s.counts("batch").await,
        counts_of(&[("ready", 2), ("scheduled", 1)])
    );
    s.stop().await;
}

#[tokio::test]
async fn idempotent_replay_answers_200_with_the_original() {
    let s = TestServer::fast("").await;
    let body = json!({"payload": {"order": 1}, "idempotency_key": "k-1"});
    let first = s.publish("idem", body.clone()).await;
    let (st, again) = s.post("/v1/queues/idem/messages", body.clone()).await;
    assert_eq!(st, 200, "replay: {again}");
    assert_eq!(again["id"], first["id"], "{again} vs {first}");
    assert_eq!(again["created_at"], first["created_at"], "{again}");
    assert_eq!(s.counts("idem").await, counts_of(&[("ready", 1)]));

    // Still a replay after the message was consumed: nothing new is delivered.
    let l = s.lease_one("idem", "0s").await;
    let (st, a) = s.ack(&id_of(&l), &lease_of(&l)).await;
    assert_eq!(st, 200, "{a}");
    let (st, again) = s.post("/v1/queues/idem/messages", body.clone()).await;
    assert_eq!(st, 200, "replay after ack: {again}");
    assert_eq!(again["id"], first["id"], "{again}");
    assert_eq!(again["state"], "done", "{again}");
    assert_eq!(s.counts("idem").await, counts_of(&[("done", 1)]));
    assert!(s.lease("idem", json!({"max": 10})).await.is_empty());

    // A batch of replays only: 200, the originals.
    let (st, b) = s
        .post("/v1/queues/idem/messages", json!({"messages": [body]}))
        .await;
    assert_eq!(st, 200, "batch replay: {b}");
    assert_eq!(b["messages"][0]["id"], first["id"], "{b}");
    assert_eq!(s.counts("idem").await, counts_of(&[("done", 1)]));

    // The key is per queue: the same key in another queue is a new message.
    let other = s
        .publish(
            "idem-other",
            json!({"payload": {"order": 1}, "idempotency_key": "k-1"}),
        )
        .await;
    assert_ne!(other["id"], first["id"], "{other}");

    // The published counter excludes replays.
    let (_, metrics) = s.get_text("/metrics").await;
    assert!(
        metrics.contains("redrive_messages_published_total{queue=\"idem\"} 1\n"),
        "{metrics}"
    );
    s.stop().await;
}

#[tokio::test]
async fn same_idempotency_key_with_another_payload_is_409() {
    let s = TestServer::fast("").await;
    let first = s
        .publish(
            "idem",
            json!({"payload": {"order": 1}, "idempotency_key": "k-1"}),
        )
        .await;
    let before = s.snapshot().await;
    let got = s
        .post(
            "/v1/queues/idem/messages",
            json!({"payload": {"order": 2}, "idempotency_key": "k-1"}),
        )
        .await;
    assert_error(&got, 409, "idempotency_conflict");
    assert_eq!(s.snapshot().await, before, "nothing changed");

    // In a batch, the conflict rejects the whole batch, the new items included.
    let got = s
        .post(
            "/v1/queues/idem/messages",
            json!({"messages": [
                {"payload": {"fresh": true}},
                {"payload": {"order": 2}, "idempotency_key": "k-1"}
            ]}),
        )
        .await;
    assert_error(&got, 409, "idempotency_conflict");
    assert_eq!(s.snapshot().await, before, "batch is all or nothing");
    assert_eq!(s.message(&id_of(&first)).await["payload"]["order"], 1);
    s.stop().await;
}

#[tokio::test]
async fn batch_with_one_bad_item_writes_nothing_and_names_the_item() {
    let s = TestServer::fast("").await;
    s.publish_payload("b", json!("existing")).await;
    let before = s.snapshot().await;
    let cases = [
        (
            json!({"messages": [{"payload": 1}, {"payload": 2}, {"payload": 3, "priority": 12}]}),
            400,
            "invalid_priority",
            "messages[2].priority",
        ),
        (
            json!({"messages": [{"payload": 1}, {"payload": 2, "delay": "soon"}]}),
            400,
            "invalid_duration",
            "messages[1].delay",
        ),
        (
            json!({"messages": [{"payload": 1}, {"payload": 2, "deliver_at": "tomorrow"}]}),
            400,
            "invalid_timestamp",
            "messages[1].deliver_at",
        ),
        (
            json!({"messages": [{"payload": 1}, {"headers": {}}]}),
            400,
            "invalid_body",
            "messages[1].payload",
        ),
        (
            json!({"messages": [{"payload": 1, "dealy": "1s"}, {"payload": 2}]}),
            400,
            "invalid_body",
            "messages[0]",
        ),
        (
            json!({"messages": [{"payload": 1}, {"payload": 2, "failed": {"class": "fatal"}}]}),
            400,
            "invalid_error_class",
            "messages[1].failed.class",
        ),
        (
            json!({"messages": [{"payload": 1}, {"payload": 2, "key": ""}]}),
            400,
            "invalid_key",
            "messages[1].key",
        ),
        (
            json!({"messages": [{"payload": 1}, {"payload": "x".repeat(2000)}]}),
            413,
            "payload_too_large",
            "messages[1].payload",
        ),
    ];
    for (body, status, code, needle) in cases {
        let got = s.post("/v1/queues/b/messages", body.clone()).await;
        assert_error_names(&got, status, code, needle);
        assert_eq!(s.snapshot().await, before, "nothing written by {body}");
    }
    // The unknown field is named too.
    let got = s
        .post(
            "/v1/queues/b/messages",
            json!({"messages": [{"payload": 1, "dealy": "1s"}]}),
        )
        .await;
    assert_error_names(&got, 400, "invalid_body", "dealy");
    s.stop().await;
}

#[tokio::test]
async fn delay_and_deliver_at_schedule_then_deliver_when_due() {
    let s = TestServer::fast("").await;
    // delay
    let m = s
        .publish("later", json!({"payload": "d", "delay": "1s"}))
        .await;
    assert_eq!(m["state"], "scheduled", "{m}");
    let due = ms(&m, "due_at");
    assert!(due > ms(&m, "created_at"), "{m}");
    assert_eq!(s.counts("later").await, counts_of(&[("scheduled", 1)]));
    assert!(
        s.lease("later", json!({"max": 10})).await.is_empty(),
        "not deliverable before due"
    );
    let l = s.lease_one("later", "5s").await;
    assert_eq!(l["id"], m["id"], "{l}");
    let leased = s.message(&id_of(&l)).await;
    assert!(
        ms(&leased, "updated_at") >= due,
        "never delivered before due_at: {leased} (due {due})"
    );

    // deliver_at, millisecond precision kept
    let at = redrive_core::Timestamp::now().plus_ms(1_000);
    let m = s
        .publish("at", json!({"payload": "a", "deliver_at": at.to_rfc3339()}))
        .await;
    assert_eq!(m["state"], "scheduled", "{m}");
    assert_eq!(m["due_at"], at.to_rfc3339(), "{m}");
    let l = s.lease_one("at", "5s").await;
    assert_eq!(l["id"], m["id"], "{l}");

    // deliver_at with an offset is accepted and shown in UTC (within max_schedule_ahead)
    let hour = 3_600_000;
    let utc = redrive_core::Timestamp::from_millis(
        (redrive_core::Timestamp::now().as_millis() / hour + 100 * 24) * hour,
    );
    let plus8 = redrive_core::Timestamp::from_millis(utc.as_millis() + 8 * hour)
        .to_rfc3339()
        .replace(".000Z", "+08:00");
    let m = s
        .publish("at", json!({"payload": "z", "deliver_at": plus8}))
        .await;
    assert_eq!(m["due_at"], utc.to_rfc3339(), "{m}");

    // deliver_at in the past: ready now
    let m = s
        .publish(
            "past",
            json!({"payload": "p", "deliver_at": "2020-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(m["state"], "ready", "{m}");
    assert_eq!(s.lease("past", json!({})).await.len(), 1);
    s.stop().await;
}

#[tokio::test]
async fn higher_priority_is_leased_first() {
    let s = TestServer::fast("").await;
    for (name, p) in [("p0", 0), ("p9a", 9), ("p5", 5), ("p9b", 9), ("p0b", 0)] {
        s.publish("prio", json!({"payload": name, "priority": p}))
            .await;
    }
    let got = s.lease("prio", json!({"max": 10})).await;
    let order: Vec<&str> = got.iter().map(|m| m["payload"].as_str().unwrap()).collect();
    assert_eq!(order, ["p9a", "p9b", "p5", "p0", "p0b"], "{got:?}");
    for m in &got {
        assert!(m["priority"].is_u64(), "{m}");
    }
    s.stop().await;
}

#[tokio::test]
async fn headers_round_trip() {
    let s = TestServer::fast("").await;
    let headers =
        json!({"content-type": "application/json", "x-trace": "t-1", "ünï": "✓ 中文", "empty": ""});
    let m = s
        .publish("h", json!({"payload": {"a": 1}, "headers": headers}))
        .await;
    assert_eq!(m["headers"], headers, "{m}");
    let l = s.lease_one("h", "0s").await;
    assert_eq!(l["headers"], headers, "{l}");
    assert_eq!(s.message(&id_of(&m)).await["headers"], headers);
    s.stop().await;
}

#[tokio::test]
async fn failure_reported_at_publish_is_attempt_one() {
    let s = TestServer::fast("").await;
    let m = s
        .publish(
            "seen",
            json!({"payload": {"o": 1}, "failed": {"class": "transient", "message": "db timeout"}}),
        )
        .await;
    assert_eq!(m["attempts"], 1, "{m}");
    assert_eq!(m["state"], "scheduled", "{m}");
    assert_eq!(
        ms(&m, "due_at") - ms(&m, "created_at"),
        50,
        "fixed 50ms policy: {m}"
    );
    assert_eq!(m["last_error"]["class"], "transient", "{m}");
    assert_eq!(m["last_error"]["message"], "db timeout", "{m}");
    let g = s.message(&id_of(&m)).await;
    let h = g["history"].as_array().unwrap_or_else(|| panic!("{g}"));
    assert_eq!(h.len(), 1, "{g}");
    assert_eq!(h[0]["attempt"], 1, "{g}");
    assert_eq!(h[0]["event"], "failed", "{g}");
    assert_eq!(h[0]["error"]["message"], "db timeout", "{g}");
    assert_eq!(h[0]["delay_ms"], 50, "{g}");

    // The retry is delivered as attempt 2.
    let l = s.lease_one("seen", "5s").await;
    assert_eq!(l["id"], m["id"], "{l}");
    assert_eq!(l["attempt"], 2, "{l}");
    assert_eq!(l["last_error"]["message"], "db timeout", "{l}");

    // rate_limited with retry_after at publish
    let m = s
        .publish(
            "seen-rl",
            json!({"payload": 1, "failed": {"class": "rate_limited", "retry_after": "1h"}}),
        )
        .await;
    assert_eq!(m["state"], "scheduled", "{m}");
    assert_eq!(ms(&m, "due_at") - ms(&m, "created_at"), 3_600_000, "{m}");
    s.stop().await;
}

/// Issue 18 (`redrive import`): `failed.attempts` carries the attempts made elsewhere, and a
/// `deliver_at` beside `failed` is when the retry is due (the policy's 50 ms does not
/// apply); the policy still ends a message whose budget is spent.
#[tokio::test]
async fn failure_at_publish_with_attempts_and_deliver_at_is_due_then() {
    let s = TestServer::fast("").await;
    let due = redrive_core::Timestamp::now().plus_ms(3_600_000);
    let m = s
        .publish(
            "imported",
            json!({"payload": {"o": 1}, "deliver_at": due.to_rfc3339(),
                   "failed": {"class": "transient", "message": "row 7", "attempts": 2}}),
        )
        .await;
    assert_eq!(m["state"], "scheduled", "{m}");
    assert_eq!(m["attempts"], 2, "{m}");
    assert_eq!(ms(&m, "due_at"), due.as_millis(), "due at deliver_at: {m}");
    let g = s.message(&id_of(&m)).await;
    let h = &g["history"][0];
    assert_eq!(h["attempt"], 2, "{g}");
    assert_eq!(h["event"], "failed", "{g}");
    assert_eq!(ms(h, "retry_at"), due.as_millis(), "{g}");

    // A deliver_at in the past (or a zero delay) is due now: leased as attempt 3 of 3.
    for when in [
        json!({"deliver_at": "2020-01-01T00:00:00Z"}),
        json!({"delay": "0s"}),
    ] {
        let mut body = json!({"payload": 2, "failed": {"class": "transient", "attempts": 2}});
        body.as_object_mut()
            .unwrap()
            .extend(when.as_object().unwrap().clone());
        let m = s.publish("imported-now", body).await;
        assert_eq!(m["state"], "ready", "{when}: {m}");
        let l = s.lease_one("imported-now", "0s").await;
        assert_eq!(l["id"], m["id"], "{l}");
        assert_eq!(l["attempt"], 3, "{l}");
        assert_eq!(l["max_attempts"], 3, "the last try: {l}");
        s.ack(&id_of(&l), &lease_of(&l)).await;
    }

    // Out of attempts by the queue's policy (3): dead at once, whatever deliver_at says.
    let m = s
        .publish(
            "imported",
            json!({"payload": 3, "deliver_at": due.to_rfc3339(),
                   "failed": {"class": "transient", "attempts": 3}}),
        )
        .await;
    assert_eq!(m["state"], "dead", "{m}");
    assert_eq!(m["dead_reason"], "max_attempts", "{m}");
    assert_eq!(m["attempts"], 3, "{m}");
    // Without deliver_at the policy's delay applies, as before.
    let m = s
        .publish(
            "imported",
            json!({"payload": 4, "failed": {"class": "transient", "attempts": 1}}),
        )
        .await;
    assert_eq!(ms(&m, "due_at") - ms(&m, "created_at"), 50, "{m}");
    assert_eq!(m["attempts"], 1, "{m}");
    s.stop().await;
}

/// A batch answer says, item by item, which were idempotent replays (`redrive import`
/// counts what an earlier run already imported).
#[tokio::test]
async fn batch_answer_says_which_items_were_replays() {
    let s = TestServer::fast("").await;
    s.publish("replays", json!({"payload": 1, "idempotency_key": "a"}))
        .await;
    let (st, b) = s
        .post(
            "/v1/queues/replays/messages",
            json!({"messages": [
                {"payload": 1, "idempotency_key": "a"},
                {"payload": 2, "idempotency_key": "b"}
            ]}),
        )
        .await;
    assert_eq!(st, 201, "{b}");
    assert_eq!(b["replayed"], json!([true, false]), "{b}");
    let (st, b) = s
        .post(
            "/v1/queues/replays/messages",
            json!({"messages": [{"payload": 2, "idempotency_key": "b"}]}),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["replayed"], json!([true]), "{b}");
    assert_eq!(s.counts("replays").await, counts_of(&[("ready", 2)]));
    s.stop().await;
}

#[tokio::test]
async fn permanent_failure_at_publish_is_dead() {
    let s = TestServer::fast("").await;
    let m = s
        .publish(
            "perm",
            json!({"payload": 1, "failed": {"class": "permanent", "message": "schema"}}),
        )
        .await;
    assert_eq!(m["state"], "dead", "{m}");
    assert_eq!(m["dead_reason"], "permanent_error", "{m}");
    assert_eq!(m["attempts"], 1, "{m}");
    let c = s.counts("perm").await;
    assert_eq!(count(&c, "dead"), 1, "{c}");
    assert!(s.lease("perm", json!({"max": 10})).await.is_empty());
    let (st, found) = s.get("/v1/messages?queue=perm&state=dead").await;
    assert_eq!(st, 200, "{found}");
    assert_eq!(found["messages"][0]["id"], m["id"], "{found}");
    let (_, metrics) = s.get_text("/metrics").await;
    assert!(
        metrics
            .contains("redrive_dead_letters_total{queue=\"perm\",reason=\"permanent_error\"} 1\n"),
        "{metrics}"
    );
    s.stop().await;
}

/// Defect 2 of issue 5: with `done_retention` (1 s) shorter than `idempotency_window`
/// (24 h), publish → lease → ack → purge → the same publish used to answer 201 with a
/// new id (the payment processed twice). It answers 200 with the original id and state
/// `done`, and nothing new is delivered. The engine's clock is moved past the retention
/// and the purge driven directly (no waiting).
#[tokio::test]
async fn idempotent_replay_after_purge_returns_original() {
    let clock = std::sync::Arc::new(redrive_server::engine::ManualClock::new(
        redrive_core::Timestamp::now(),
    ));
    let s = TestServer::start_with_clock("done_retention = \"1s\"\n", clock.clone()).await;
    let publish = json!({"payload": {"pay": 10}, "idempotency_key": "pay-1"});
    let (st, first) = s.post("/v1/queues/pay/messages", publish.clone()).await;
    assert_eq!(st, 201, "{first}");
    let id = id_of(&first);
    let l = s.lease("pay", json!({"max": 1})).await.remove(0);
    assert_eq!(id_of(&l), id);
    let (st, acked) = s.ack(&id, &lease_of(&l)).await;
    assert_eq!(st, 200, "{acked}");
    // done_retention is 1 s: two seconds later a purge deletes the done message.
    clock.advance(2_000);
    s.engine.purge().await.unwrap();
    assert_eq!(
        s.get(&format!("/v1/messages/{id}")).await.0,
        404,
        "the done message was not purged"
    );
    let (st, replay) = s.post("/v1/queues/pay/messages", publish).await;
    assert_eq!(st, 200, "a replay after the purge is not a 200: {replay}");
    assert_eq!(
        id_of(&replay),
        id,
        "a replay after the purge made a new message"
    );
    assert_eq!(replay["state"], "done", "{replay}");
    assert_eq!(replay["payload"], json!({"pay": 10}), "{replay}");
    assert_eq!(replay["created_at"], first["created_at"], "{replay}");
    assert_eq!(
        s.lease("pay", json!({"max": 10, "wait": "0s"})).await,
        Vec::<serde_json::Value>::new(),
        "a replay delivered something"
    );
    s.stop().await;
}

/// Issue 15 / SPEC §5: PHP's `json_encode` turns an empty `array()` into `[]`, so a PHP
/// publisher sends `"headers": []` for "no headers": taken as none (alone and in a batch).
/// Any other array is still a 400 naming `headers`, and changes nothing.
#[tokio::test]
async fn headers_as_an_empty_array_are_no_headers() {
    let s = TestServer::fast("").await;
    let m = s
        .publish("php", json!({"payload": {"a": 1}, "headers": []}))
        .await;
    assert_eq!(m["headers"], json!({}), "{m}");
    let b = s
        .publish(
            "php",
            json!({"messages": [{"payload": 1, "headers": []}, {"payload": 2, "headers": {"h": "v"}}]}),
        )
        .await;
    assert_eq!(b["messages"][0]["headers"], json!({}), "{b}");
    assert_eq!(b["messages"][1]["headers"], json!({"h": "v"}), "{b}");
    let l = s.lease_one("php", "1s").await;
    assert_eq!(l["headers"], json!({}), "{l}");
    let before = s.snapshot().await;
    for bad in [json!(["a"]), json!([{}]), json!([[]]), json!("h"), json!(1)] {
        let got = s
            .post(
                "/v1/queues/php/messages",
                json!({"payload": 1, "headers": bad}),
            )
            .await;
        assert_error_names(&got, 400, "invalid_body", "headers");
    }
    let got = s
        .post(
            "/v1/queues/php/messages",
            json!({"messages": [{"payload": 1, "headers": []}, {"payload": 2, "headers": ["x"]}]}),
        )
        .await;
    assert_error_names(&got, 400, "invalid_body", "messages[1]");
    assert_eq!(
        s.snapshot().await,
        before,
        "a refused publish changed something"
    );
    s.stop().await;
}
