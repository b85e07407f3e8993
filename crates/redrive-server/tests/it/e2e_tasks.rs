//! Bulk tasks (`/v1/tasks`) and the audit log (`/v1/audit`), SPEC §12: dry run, progress
//! to the end, a failure group's fingerprint, pause / resume / cancel, the redrive that
//! stops by itself, bad requests, and every operator action in the audit log.

use crate::harness::{assert_error, assert_error_names, id_of, lease_of, ok, TestServer};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A queue whose messages die at their first failure.
const ONE_SHOT: &str = r#"
[queues.bulk.retry]
max_attempts = 1
"#;

/// Publish `n` messages to `bulk` and fail each once with `error(i)`: `n` dead letters.
async fn dead_letters(s: &TestServer, n: usize, error: impl Fn(usize) -> String) -> Vec<String> {
    let mut ids = Vec::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(20) {
        let items: Vec<Value> = chunk.iter().map(|i| json!({"payload": {"n": i}})).collect();
        let p = s.publish("bulk", json!({ "messages": items })).await;
        ids.extend(p["messages"].as_array().unwrap().iter().map(id_of));
        let leased = s.lease("bulk", json!({"max": chunk.len()})).await;
        assert_eq!(leased.len(), chunk.len());
        for m in &leased {
            let i = m["payload"]["n"].as_u64().unwrap() as usize;
            let (st, b) = s
                .nack(
                    &id_of(m),
                    &lease_of(m),
                    json!({"class": "permanent", "message": error(i)}),
                )
                .await;
            assert_eq!(st, 200, "{b}");
        }
    }
    ids
}

/// Poll task `id` until `until` holds (at most 60 s), return it.
async fn task_until(s: &TestServer, id: &str, until: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let t = ok(s.get(&format!("/v1/tasks/{id}")).await);
        if until(&t) {
            return t;
        }
        assert!(Instant::now() < deadline, "task never got there: {t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn redrives_by(m: &Value, task: &str) -> usize {
    m["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["event"] == "redriven" && h["task"] == task)
        .count()
}

async fn audit_actions(s: &TestServer) -> Vec<Value> {
    ok(s.get("/v1/audit?limit=1000").await)["entries"]
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test]
async fn redrive_task_dry_run_then_runs_to_done_and_is_audited() {
    let s = TestServer::fast(ONE_SHOT).await;
    let ids = dead_letters(&s, 45, |i| format!("order {i} not found")).await;
    let filter = json!({"queue": "bulk", "state": "dead"});
    let dry = ok(s
        .post(
            "/v1/tasks",
            json!({"action": "redrive", "filter": filter, "dry_run": true}),
        )
        .await);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["total"], 45, "{dry}");
    assert_eq!(
        s.counts("bulk").await["dead"],
        45,
        "a dry run changes nothing"
    );
    assert_eq!(ok(s.get("/v1/tasks").await)["tasks"], json!([]));

    let (st, t) = s
        .post(
            "/v1/tasks",
            json!({"action": "redrive", "filter": filter, "rate": "200/s"}),
        )
        .await;
    assert_eq!(st, 201, "{t}");
    assert_eq!(t["total"], 45);
    assert_eq!(t["created_by"], "anonymous");
    let id = t["id"].as_str().unwrap().to_owned();
    let done = task_until(&s, &id, |t| t["state"] == "done").await;
    assert_eq!(
        (done["done"].as_u64(), done["failed"].as_u64()),
        (Some(45), Some(0)),
        "{done}"
    );
    let c = s.counts("bulk").await;
    assert_eq!(
        (c["dead"].as_u64(), c["ready"].as_u64()),
        (Some(0), Some(45)),
        "{c}"
    );
    for m in &ids {
        assert_eq!(redrives_by(&s.message(m).await, &id), 1, "{m}");
    }
    // The task shows up in the list and in the audit log: created with its count and
    // filter, and done.
    assert_eq!(ok(s.get("/v1/tasks").await)["tasks"][0]["id"], id);
    let log = audit_actions(&s).await;
    let created = log.iter().find(|e| e["action"] == "task.create").unwrap();
    assert_eq!(created["count"], 45);
    assert_eq!(created["target"], id);
    assert_eq!(created["filter"], filter);
    assert_eq!(created["actor"], "anonymous");
    let finished = log.iter().find(|e| e["action"] == "task.done").unwrap();
    assert_eq!(finished["count"], 45);
    // Both name this node: it created the task and its runner ran the last step.
    let node = ok(s.get("/v1/cluster").await)["node"].clone();
    assert!(node.is_string(), "{node}");
    assert_eq!(created["node"], node);
    assert_eq!(finished["node"], node);
    // Messages dead after the task was created are not part of it.
    dead_letters(&s, 2, |_| "late".into()).await;
    assert_eq!(ok(s.get(&format!("/v1/tasks/{id}")).await)["done"], 45);
    s.stop().await;
}

#[tokio::test]
async fn task_on_a_failure_group_acts_on_that_group_only() {
    let s = TestServer::fast(ONE_SHOT).await;
    let ids = dead_letters(&s, 12, |i| {
        if i % 3 == 0 {
            format!("bank 0x{i:04x} timed out")
        } else {
            format!("order {i} not found")
        }
    })
    .await;
    let groups = ok(s.get("/v1/failure-groups?queue=bulk").await);
    let fp = groups["groups"][0]["fingerprint"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(fp, "permanent: order <n> not found", "{groups}");
    let filter = json!({"queue": "bulk", "state": "dead", "fingerprint": fp});
    let dry = ok(s
        .post(
            "/v1/tasks",
            json!({"action": "delete", "filter": filter, "dry_run": true}),
        )
        .await);
    assert_eq!(dry["total"], 8, "{dry}");
    let (st, t) = s
        .post("/v1/tasks", json!({"action": "delete", "filter": filter}))
        .await;
    assert_eq!(st, 201, "{t}");
    let done = task_until(&s, t["id"].as_str().unwrap(), |t| t["state"] == "done").await;
    assert_eq!(done["done"], 8, "{done}");
    for (i, id) in ids.iter().enumerate() {
        let (st, _) = s.get(&format!("/v1/messages/{id}")).await;
        assert_eq!(st, if i % 3 == 0 { 200 } else { 404 }, "message {i}");
    }
    s.stop().await;
}

/// Regression, issue 15: a task selects by when its messages died (`finished_since`,
/// `finished_until`) and takes relative times, counted back from its creation; the filter
/// is shown as given.
#[tokio::test]
async fn a_task_selects_by_finished_time_and_relative_times() {
    let s = TestServer::fast(ONE_SHOT).await;
    dead_letters(&s, 6, |i| format!("order {i} not found")).await;
    let dry = |filter: Value| {
        let s = &s;
        async move {
            let d = ok(s
                .post(
                    "/v1/tasks",
                    json!({"action": "redrive", "filter": filter, "dry_run": true}),
                )
                .await);
            d["total"].as_u64().unwrap()
        }
    };
    assert_eq!(
        dry(json!({"state": "dead", "finished_since": "1h"})).await,
        6
    );
    assert_eq!(
        dry(json!({"state": "dead", "finished_until": "1h"})).await,
        0
    );
    assert_eq!(dry(json!({"queue": "bulk", "since": "12h"})).await, 6);
    assert_eq!(dry(json!({"queue": "bulk", "until": "12h"})).await, 0);
    let filter = json!({"queue": "bulk", "finished_since": "10m",
                        "fingerprint": "permanent: order <n> not found"});
    let (st, t) = s
        .post("/v1/tasks", json!({"action": "redrive", "filter": filter}))
        .await;
    assert_eq!(st, 201, "{t}");
    assert_eq!(t["filter"], filter, "shown as given");
    assert_eq!(t["total"], 6, "{t}");
    let done = task_until(&s, t["id"].as_str().unwrap(), |t| t["state"] == "done").await;
    assert_eq!(
        (done["done"].as_u64(), done["failed"].as_u64()),
        (Some(6), Some(0)),
        "{done}"
    );
    assert_eq!(crate::harness::count(&s.counts("bulk").await, "ready"), 6);
    s.stop().await;
}

#[tokio::test]
async fn pause_resume_and_cancel() {
    let s = TestServer::fast(ONE_SHOT).await;
    dead_letters(&s, 100, |_| "x".into()).await;
    let (st, t) = s
        .post(
            "/v1/tasks",
            json!({"action": "kill", "filter": {"queue": "bulk", "state": "dead"}, "rate": "10/s"}),
        )
        .await;
    assert_eq!(st, 201, "{t}");
    let id = t["id"].as_str().unwrap().to_owned();
    let paused = ok(s.post(&format!("/v1/tasks/{id}/pause"), json!({})).await);
    assert_eq!(paused["state"], "paused");
    // Once paused, no step runs: its count stays.
    let frozen = paused["done"].as_u64().unwrap() + paused["failed"].as_u64().unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let later = ok(s.get(&format!("/v1/tasks/{id}")).await);
    assert_eq!(
        later["done"].as_u64().unwrap() + later["failed"].as_u64().unwrap(),
        frozen,
        "{later}"
    );
    assert_error(
        &s.post(&format!("/v1/tasks/{id}/pause"), json!({})).await,
        409,
        "invalid_task_state",
    );
    let resumed = ok(s.post(&format!("/v1/tasks/{id}/resume"), json!({})).await);
    assert_eq!(resumed["state"], "running");
    task_until(&s, &id, |t| {
        t["done"].as_u64() > Some(frozen) || t["failed"].as_u64() > Some(0)
    })
    .await;
    let cancelled = ok(s.post(&format!("/v1/tasks/{id}/cancel"), json!({})).await);
    assert_eq!(cancelled["state"], "cancelled");
    assert_eq!(cancelled["stop_reason"], "cancelled by anonymous");
    assert_error(
        &s.post(&format!("/v1/tasks/{id}/resume"), json!({})).await,
        409,
        "invalid_task_state",
    );
    assert_error(
        &s.post("/v1/tasks/nope/cancel", json!({})).await,
        404,
        "not_found",
    );
    let actions: Vec<String> = audit_actions(&s)
        .await
        .iter()
        .map(|e| e["action"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        actions,
        ["task.cancel", "task.resume", "task.pause", "task.create"],
        "newest first"
    );
    s.stop().await;
}

#[tokio::test]
async fn redrive_task_stops_by_itself_when_its_messages_keep_failing() {
    let s = TestServer::fast(ONE_SHOT).await;
    dead_letters(&s, 300, |_| "still broken".into()).await;
    // A consumer whose downstream is still down: every redriven message fails again.
    let consumer = {
        let client = s.client.clone();
        let base = s.url("");
        tokio::spawn(async move {
            loop {
                let r: Value = client
                    .post(format!("{base}/v1/queues/bulk/leases"))
                    .json(&json!({"max": 20, "wait": "200ms"}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                for m in r["messages"].as_array().unwrap() {
                    client
                        .post(format!("{base}/v1/messages/{}/nack", id_of(m)))
                        .json(&json!({"lease": lease_of(m), "error": {"class": "transient", "message": "still broken"}}))
                        .send()
                        .await
                        .unwrap();
                }
            }
        })
    };
    let (st, t) = s
        .post(
            "/v1/tasks",
            json!({"action": "redrive", "filter": {"queue": "bulk", "state": "dead"},
                   "rate": "100/s", "stop_min_outcomes": 10}),
        )
        .await;
    assert_eq!(st, 201, "{t}");
    let id = t["id"].as_str().unwrap().to_owned();
    let stopped = task_until(&s, &id, |t| t["state"] != "running").await;
    consumer.abort();
    assert_eq!(stopped["state"], "stopped", "{stopped}");
    assert!(
        stopped["stop_reason"]
            .as_str()
            .unwrap()
            .contains("failed again"),
        "{stopped}"
    );
    assert!(stopped["done"].as_u64().unwrap() < 300, "{stopped}");
    // Regression, issue 15: the reason says which count is which ("22 done, 0 failed"
    // beside "20 failed again" read as a contradiction).
    let reason = stopped["stop_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("stopped by its stop rule: ")
            && reason.contains("redriven messages whose outcome is known failed again")
            && reason.contains(&format!(
                "{} of 300 redriven before it stopped, {} refused",
                stopped["done"], stopped["failed"]
            )),
        "{reason}"
    );
    let log = audit_actions(&s).await;
    assert!(log.iter().any(|e| e["action"] == "task.stopped"), "{log:?}");
    s.stop().await;
}

#[tokio::test]
async fn bad_task_requests_name_the_problem_and_create_nothing() {
    let s = TestServer::fast(ONE_SHOT).await;
    let cases = [
        (
            json!({"action": "explode", "filter": {"queue": "bulk"}}),
            "invalid_action",
            "action",
        ),
        (
            json!({"action": "redrive", "filter": {}}),
            "empty_filter",
            "filter",
        ),
        (
            json!({"action": "redrive", "filter": {"state": "zombie"}}),
            "invalid_state",
            "filter.state",
        ),
        (
            json!({"action": "redrive", "filter": {"queue": "bad name"}}),
            "invalid_queue",
            "filter.",
        ),
        (
            json!({"action": "redrive", "filter": {"since": "yesterday"}}),
            "invalid_timestamp",
            "filter.since",
        ),
        (
            json!({"action": "redrive", "filter": {"finished_since": "soon"}}),
            "invalid_timestamp",
            "filter.finished_since",
        ),
        (
            json!({"action": "redrive", "filter": {"until": "1h 30m"}}),
            "invalid_timestamp",
            "filter.until",
        ),
        (
            json!({"action": "redrive", "filter": {"queue": "bulk"}, "rate": "fast"}),
            "invalid_rate",
            "rate",
        ),
        (
            json!({"action": "redrive", "filter": {"queue": "bulk"}, "rate": "0/s"}),
            "invalid_rate",
            "rate",
        ),
        (
            json!({"action": "redrive", "filter": {"queue": "bulk", "colour": "red"}}),
            "invalid_body",
            "colour",
        ),
        (
            json!({"action": "redrive", "filter": {"queue": "bulk"}, "reason": "x"}),
            "invalid_body",
            "reason",
        ),
        (
            json!({"action": "redrive", "filter": {"queue": "bulk"}, "stop_failure_ratio": 2}),
            "invalid_body",
            "stop_failure_ratio",
        ),
        (
            json!({"filter": {"queue": "bulk"}}),
            "invalid_body",
            "action",
        ),
    ];
    for (body, code, needle) in cases {
        let got = s.post("/v1/tasks", body.clone()).await;
        assert_error_names(&got, 400, code, needle);
    }
    assert_eq!(ok(s.get("/v1/tasks").await)["tasks"], json!([]));
    assert_eq!(audit_actions(&s).await, Vec::<Value>::new());
    assert_error(&s.get("/v1/tasks/nope").await, 404, "not_found");
    assert_error(&s.get("/v1/audit?limit=0").await, 400, "invalid_query");
    assert_error(&s.get("/v1/audit?cursor=abc").await, 400, "invalid_cursor");
    s.stop().await;
}

#[tokio::test]
async fn message_actions_are_audited_and_redrive_can_edit_the_payload() {
    let s = TestServer::fast(ONE_SHOT).await;
    let ids = dead_letters(&s, 3, |_| "bad amount".into()).await;
    let edited = ok(s
        .post(
            &format!("/v1/messages/{}/redrive", ids[0]),
            json!({"payload": {"amount": 10}}),
        )
        .await);
    assert_eq!(edited["state"], "ready");
    assert_eq!(edited["payload"], json!({"amount": 10}));
    let last = edited["history"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        (last["event"].as_str(), last["edited"].as_bool()),
        (Some("redriven"), Some(true)),
        "{last}"
    );
    ok(
        s.post(&format!("/v1/messages/{}/redrive", ids[1]), json!({}))
            .await,
    );
    ok(s.delete(&format!("/v1/messages/{}", ids[2])).await);
    let m = s.publish_payload("bulk", json!(1)).await;
    ok(s.post(
        &format!("/v1/messages/{m}/kill"),
        json!({"reason": "duplicate order"}),
    )
    .await);
    // Too large an edit: refused, nothing changed.
    let big = "x".repeat(2_000);
    let (st, b) = s
        .post(
            &format!("/v1/messages/{}/redrive", ids[1]),
            json!({"payload": big}),
        )
        .await;
    assert!(st == 413 || st == 400, "{st} {b}");
    let log = audit_actions(&s).await;
    let got: Vec<(String, String)> = log
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_owned(),
                e["target"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("message.kill".to_owned(), m.clone()),
            ("message.delete".to_owned(), ids[2].clone()),
            ("message.redrive".to_owned(), ids[1].clone()),
            ("message.edit_redrive".to_owned(), ids[0].clone()),
        ]
    );
    assert_eq!(log[0]["detail"], "duplicate order");
    assert_eq!(log[0]["filter"], json!({"queue": "bulk"}));
    // Every entry names the node that answered the request (SPEC §13).
    let node = ok(s.get("/v1/cluster").await)["node"].clone();
    for e in &log {
        assert_eq!(e["node"], node, "{e}");
    }
    // Paging: two at a time, newest first.
    let p1 = ok(s.get("/v1/audit?limit=2").await);
    assert_eq!(p1["entries"].as_array().unwrap().len(), 2);
    let cursor = p1["next_cursor"].as_str().unwrap();
    let p2 = ok(s.get(&format!("/v1/audit?limit=2&cursor={cursor}")).await);
    assert_eq!(p2["entries"][0]["action"], "message.redrive");
    assert_eq!(p2["next_cursor"], Value::Null);
    s.stop().await;
}
