//! The typed client (`redrive-client`) against a real server: its types mirror the
//! server's answers exactly (decoded and encoded again, an answer is the server's JSON:
//! the CLI prints answers that way), its errors carry the server's code, it sends the
//! bearer token, and an export streams every message.

mod common;

use common::{free_port, start, wait_ready};
use redrive_client::{
    BatchItem, BatchResponse, Client, Deleted, Error, ExportFormat, Extended, Filter, LeaseRequest,
    LeaseResponse, NackError, Publish, PublishedBatch, QueueList, QueueView, SearchPage,
};
use redrive_core::{ErrorClass, Message, State};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

const CONFIG: &str = r#"
[queues.typed.retry]
max_attempts = 2
"#;

/// Send `body` raw, and check the answer decodes into `T` and encodes back to the same JSON.
async fn mirror<T: DeserializeOwned + Serialize>(
    api: &Client,
    segments: &[&str],
    body: Value,
) -> T {
    let raw = api
        .post_raw(&api.url(segments, &[]), body.to_string())
        .await
        .unwrap_or_else(|e| panic!("{segments:?}: {e:#}"));
    same_json::<T>(&raw, segments)
}

/// Decode `raw` into `T` and check it encodes back to the same JSON.
fn same_json<T: DeserializeOwned + Serialize>(raw: &[u8], what: &[&str]) -> T {
    let sent: Value = serde_json::from_slice(raw).unwrap();
    let typed: T = serde_json::from_slice(raw)
        .unwrap_or_else(|e| panic!("{what:?}: {e}: {}", String::from_utf8_lossy(raw)));
    assert_eq!(
        serde_json::to_value(&typed).unwrap(),
        sent,
        "{what:?}: the typed answer differs from the server's"
    );
    typed
}

/// GET raw, compare with what the typed call answered.
async fn same_as_get<T: Serialize>(http: &reqwest::Client, base: &str, path: &str, typed: &T) {
    let raw: Value = http
        .get(format!("{base}{path}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(serde_json::to_value(typed).unwrap(), raw, "{path}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_answers_encode_back_to_the_servers_json() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let mut node = start(dir.path(), free_port(), CONFIG);
    assert!(wait_ready(&http, &mut node).await);
    let api = Client::new(&node.base).unwrap();
    let b = node.base.clone();

    // Publish: one (201), a replay (200), a batch.
    let mut one = Publish::new(json!({"order": 1, "items": [1.5, "x", null]}));
    one.key = Some("k1".into());
    one.idempotency_key = Some("once".into());
    one.headers.insert("trace".into(), "t-1".into());
    let first = api.publish("typed", &one).await.unwrap();
    assert!(!first.replayed);
    let again = api.publish("typed", &one).await.unwrap();
    assert!(again.replayed, "a replay is a 200");
    assert_eq!(again.message.id, first.message.id);
    let raw_publish: Message = mirror(
        &api,
        &["v1", "queues", "typed", "messages"],
        json!({"payload": [1, 2]}),
    )
    .await;
    let batch: PublishedBatch = mirror(
        &api,
        &["v1", "queues", "typed", "messages"],
        json!({"messages": [{"payload": "a", "priority": 3}, {"payload": {"b": true}, "delay": "1h"}]}),
    )
    .await;
    assert_eq!(batch.messages.len(), 2);
    assert_eq!(batch.messages[1].state, State::Scheduled);

    // Lease, extend, nack (a retry), lease again (with last_error), batch ack.
    let leased: LeaseResponse = mirror(
        &api,
        &["v1", "queues", "typed", "leases"],
        json!({"max": 10, "lease": "1m"}),
    )
    .await;
    assert_eq!(leased.messages.len(), 3, "the three ready ones");
    let m = &leased.messages[0];
    let id = m.id.to_string();
    let _: Extended = mirror(
        &api,
        &["v1", "messages", &id, "extend"],
        json!({"lease": m.lease, "by": "2m"}),
    )
    .await;
    let nacked: Message = mirror(
        &api,
        &["v1", "messages", &id, "nack"],
        json!({"lease": m.lease, "error": {"class": "rate_limited", "message": "slow", "retry_after": "0s"}}),
    )
    .await;
    assert!(nacked.last_error.is_some());
    let items: Vec<Value> = leased.messages[1..]
        .iter()
        .map(|m| json!({"id": m.id.to_string(), "lease": m.lease}))
        .chain([json!({"id": "not-an-id", "lease": "x"})])
        .collect();
    let acked: BatchResponse =
        mirror(&api, &["v1", "messages", "ack"], json!({"items": items})).await;
    assert_eq!(acked.items[2].status, 400);
    assert!(acked.items[2].error.is_some());

    // Reads: the typed answers are the server's JSON.
    let got = api.get(&id).await.unwrap();
    assert!(!got.history.is_empty());
    same_as_get(&http, &b, &format!("/v1/messages/{id}"), &got).await;
    let page = api
        .search(
            &Filter {
                queue: Some("typed".into()),
                ..Filter::default()
            },
            Some(2),
            None,
        )
        .await
        .unwrap();
    assert_eq!(page.messages.len(), 2);
    let cursor = page.next_cursor.clone().expect("a second page");
    same_as_get(&http, &b, "/v1/messages?queue=typed&limit=2", &page).await;
    let rest: SearchPage = api
        .search(
            &Filter {
                queue: Some("typed".into()),
                ..Filter::default()
            },
            Some(100),
            Some(&cursor),
        )
        .await
        .unwrap();
    assert_eq!(page.messages.len() + rest.messages.len(), 4);
    let q: QueueView = api.queue("typed").await.unwrap();
    assert_eq!(q.count(State::Done), Some(2));
    same_as_get(&http, &b, "/v1/queues/typed", &q).await;
    let all: QueueList = api.queues().await.unwrap();
    same_as_get(&http, &b, "/v1/queues", &all).await;

    // Operator actions.
    let sid = batch.messages[1].id.to_string();
    let killed: Message = mirror(
        &api,
        &["v1", "messages", &sid, "kill"],
        json!({"reason": "typed"}),
    )
    .await;
    assert_eq!(killed.state, State::Dead);
    let redriven = api.redrive(&sid).await.unwrap();
    assert_eq!(redriven.state, State::Ready);
    let pid = raw_publish.id.to_string();
    let raw = http
        .delete(format!("{b}/v1/messages/{pid}"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let deleted: Deleted = same_json(&raw, &["delete"]);
    assert!(deleted.deleted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_the_servers_status_and_code() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let mut node = start(dir.path(), free_port(), CONFIG);
    assert!(wait_ready(&http, &mut node).await);
    let api = Client::new(&node.base).unwrap();

    let missing = "0190b5c2-7d1e-7c3a-9f00-1a2b3c4d5e6f";
    match api.get(missing).await {
        Err(Error::Api { status, code, .. }) => {
            assert_eq!((status, code.as_str()), (404, "not_found"))
        }
        other => panic!("{other:?}"),
    }
    let bad_max = LeaseRequest {
        max: Some(0),
        ..LeaseRequest::default()
    };
    let e = api.lease("typed", &bad_max).await.unwrap_err();
    assert_eq!(
        (e.status(), e.code()),
        (Some(400), Some("invalid_max")),
        "{e}"
    );
    assert!(e.to_string().starts_with("invalid_max: max:"), "{e}");

    // A lease token that is not this delivery's: 409 alone, and the item of a batch.
    let m = api
        .publish("typed", &Publish::new(json!(1)))
        .await
        .unwrap()
        .message;
    let id = m.id.to_string();
    let leased = api.lease("typed", &LeaseRequest::default()).await.unwrap();
    assert_eq!(leased.len(), 1);
    let e = api.ack(&id, "not-the-lease").await.unwrap_err();
    assert_eq!(
        (e.status(), e.code()),
        (Some(409), Some("lease_mismatch")),
        "{e}"
    );
    let items = api
        .nack_batch(&[BatchItem {
            error: Some(NackError::new(ErrorClass::Permanent, "no")),
            ..BatchItem::new(id.clone(), "not-the-lease")
        }])
        .await
        .unwrap();
    assert!(!items[0].is_ok());
    assert_eq!(items[0].error.as_ref().unwrap().code, "lease_mismatch");
    let dead = api
        .nack(
            &id,
            &leased[0].lease,
            Some(&NackError::new(ErrorClass::Permanent, "no")),
        )
        .await
        .unwrap();
    assert_eq!(dead.state, State::Dead);
    // Its token again: the lease was settled (nacked), and the error says how.
    match api.ack(&id, &leased[0].lease).await {
        Err(Error::Api {
            status: 409,
            code,
            settled,
            ..
        }) => assert_eq!(
            (code.as_str(), settled.as_deref()),
            ("lease_settled", Some("nacked"))
        ),
        other => panic!("{other:?}"),
    }
    let items = api
        .ack_batch(&[BatchItem::new(id.clone(), leased[0].lease.clone())])
        .await
        .unwrap();
    let e = items[0].error.as_ref().unwrap();
    assert_eq!(
        (e.code.as_str(), e.settled.as_deref()),
        ("lease_settled", Some("nacked"))
    );

    // A release hands the lease back: ready, the attempt not charged; its token is then
    // settled as released.
    let m = api
        .publish("typed", &Publish::new(json!(2)))
        .await
        .unwrap()
        .message;
    let l = api
        .lease("typed", &LeaseRequest::default())
        .await
        .unwrap()
        .remove(0);
    assert_eq!((l.attempt, l.max_attempts), (1, 2));
    let back = api
        .release(&m.id.to_string(), &l.lease, None)
        .await
        .unwrap();
    assert_eq!((back.state, back.attempts), (State::Ready, 0));
    let e = api
        .release(&m.id.to_string(), &l.lease, Some("1s"))
        .await
        .unwrap_err();
    assert_eq!(
        (e.status(), e.code()),
        (Some(409), Some("lease_settled")),
        "{e}"
    );

    api.readyz().await.unwrap();
    api.healthz().await.unwrap();
    let metrics = api.metrics_text().await.unwrap();
    assert!(metrics.contains("redrive_"), "{metrics}");

    node.child.kill().unwrap();
    node.child.wait().unwrap();
    // A fresh client: `api` may still hold a pooled keep-alive connection to the dead server,
    // and a request sent on it fails as an incomplete answer (not as "unreachable") before the
    // pool notices the connection closed.
    let e = Client::new(&node.base).unwrap().queues().await.unwrap_err();
    assert!(e.is_unreachable(), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_token_is_sent_on_every_call() {
    let dir = tempfile::tempdir().unwrap();
    let token = "typed-client-token-0123456789";
    let config = format!("api_tokens = [\"{token}\"]\n{CONFIG}");
    let http = reqwest::Client::new();
    let mut node = start(dir.path(), free_port(), &config);
    assert!(wait_ready(&http, &mut node).await);

    let anonymous = Client::new(&node.base).unwrap();
    let e = anonymous.queues().await.unwrap_err();
    assert_eq!(e.status(), Some(401), "{e}");
    let api = Client::builder(&node.base)
        .unwrap()
        .token(token)
        .build()
        .unwrap();
    api.publish("typed", &Publish::new(json!("with a token")))
        .await
        .unwrap();
    assert_eq!(
        api.queue("typed").await.unwrap().count(State::Ready),
        Some(1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_streams_every_message() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let mut node = start(dir.path(), free_port(), CONFIG);
    assert!(wait_ready(&http, &mut node).await);
    let api = Client::new(&node.base).unwrap();
    // More than one server-side chunk of rows (500).
    let messages: Vec<Publish> = (0..100).map(|n| Publish::new(json!({"n": n}))).collect();
    let mut ids = std::collections::HashSet::new();
    for _ in 0..7 {
        for m in api.publish_batch("typed", &messages).await.unwrap().message {
            ids.insert(m.id);
        }
    }
    let filter = Filter {
        queue: Some("typed".into()),
        ..Filter::default()
    };
    let mut export = api.export(&filter, ExportFormat::Jsonl).await.unwrap();
    let mut seen = std::collections::HashSet::new();
    while let Some(m) = export.next_message().await.unwrap() {
        assert!(ids.contains(&m.id), "{}", m.id);
        seen.insert(m.id);
    }
    assert_eq!(seen.len(), 700);

    let mut csv = api.export(&filter, ExportFormat::Csv).await.unwrap();
    let mut text = Vec::new();
    while let Some(chunk) = csv.next_chunk().await.unwrap() {
        text.extend_from_slice(&chunk);
    }
    let text = String::from_utf8(text).unwrap();
    assert!(text.starts_with("id,queue,state"), "{text}");
    assert_eq!(text.lines().count(), 701);
}
