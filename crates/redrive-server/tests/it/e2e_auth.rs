//! Bearer tokens on `/v1/*`; health, readiness and metrics stay open.

use crate::harness::{assert_error, tokens_toml, TestServer, FAST};
use serde_json::json;

const TOKEN: &str = "0123456789abcdef0123";
const AUTH: &str = r#"api_tokens = ["0123456789abcdef0123", "another-token-of-16+"]"#;

#[tokio::test]
async fn v1_needs_a_bearer_token() {
    let mut s = TestServer::start(&format!("{AUTH}\n{FAST}")).await;
    let probes = [
        (reqwest::Method::POST, "/v1/queues/a/messages"),
        (reqwest::Method::POST, "/v1/queues/a/leases"),
        (reqwest::Method::GET, "/v1/messages"),
        (reqwest::Method::GET, "/v1/messages/export"),
        (reqwest::Method::GET, "/v1/queues"),
        (reqwest::Method::GET, "/v1/queues/a"),
        (reqwest::Method::POST, "/v1/messages/ack"),
        (
            reqwest::Method::DELETE,
            "/v1/messages/0190b5c2-7d1e-7c3a-9f00-1a2b3c4d5e6f",
        ),
    ];
    for (m, path) in &probes {
        // No token, a wrong token, a token with the wrong scheme.
        for auth in [None, Some("Bearer wrong-token-0000000"), Some(TOKEN)] {
            let mut b = s.client.request(m.clone(), s.url(path));
            if let Some(a) = auth {
                b = b.header(reqwest::header::AUTHORIZATION, a);
            }
            let r = b.json(&json!({"payload": 1})).send().await.unwrap();
            let status = r.status().as_u16();
            let www = r
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .map(|v| v.to_str().unwrap().to_owned());
            let body = r.json().await.unwrap_or(serde_json::Value::Null);
            assert_error(&(status, body.clone()), 401, "unauthorized");
            assert_eq!(www.as_deref(), Some("Bearer"), "{m} {path}: {body}");
        }
    }
    // Nothing was written by the refused publishes.
    s.token = Some(TOKEN.to_owned());
    let (st, q) = s.get("/v1/queues").await;
    assert_eq!(st, 200, "{q}");
    assert_eq!(q["queues"], json!([]), "{q}");

    // With the token, everything works.
    let m = s.publish("a", json!({"payload": 1})).await;
    assert_eq!(m["state"], "ready", "{m}");
    assert_eq!(s.lease("a", json!({})).await.len(), 1);
    let (st, v) = s.get("/v1/messages").await;
    assert_eq!(st, 200, "{v}");
    // The second configured token works too.
    s.token = Some("another-token-of-16+".to_owned());
    let (st, v) = s.get("/v1/queues/a").await;
    assert_eq!(st, 200, "{v}");
    s.stop().await;
}

#[tokio::test]
async fn health_readiness_and_metrics_are_open() {
    let s = TestServer::start(&format!("{AUTH}\n{FAST}")).await;
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        let (st, text) = s.get_text(path).await;
        assert_eq!(st, 200, "{path}: {text}");
    }
    s.stop().await;
}

/// One token per scope, named after it, and one with two.
const SCOPED: &[(&str, &str, &[&str])] = &[
    ("p", "publish-secret-0001", &["publish"]),
    ("c", "consume-secret-0001", &["consume"]),
    ("r", "read-secret-000001", &["read"]),
    ("a", "admin-secret-00001", &["admin"]),
    ("pc", "publish-consume-01", &["publish", "consume"]),
];

/// A server with the [`SCOPED`] tokens.
async fn scoped_server() -> TestServer {
    TestServer::start(&format!("{FAST}\n{}", tokens_toml(SCOPED))).await
}

/// The scope each route needs, written out here independently of the server's table:
/// the test fails when a route is added without a decision.
fn needed(method: &str, path: &str) -> &'static str {
    match (method, path) {
        ("post", "/v1/queues/{queue}/messages") => "publish",
        ("post", "/v1/queues/{queue}/leases")
        | ("post", "/v1/messages/{id}/ack")
        | ("post", "/v1/messages/{id}/nack")
        | ("post", "/v1/messages/{id}/release")
        | ("post", "/v1/messages/{id}/extend")
        | ("post", "/v1/messages/ack")
        | ("post", "/v1/messages/nack") => "consume",
        ("get", p) if p.starts_with("/v1/") => "read",
        ("post", "/v1/messages/{id}/redrive")
        | ("post", "/v1/messages/{id}/kill")
        | ("delete", "/v1/messages/{id}")
        | ("post", "/v1/tasks")
        | ("post", "/v1/tasks/{id}/pause")
        | ("post", "/v1/tasks/{id}/resume")
        | ("post", "/v1/tasks/{id}/cancel") => "admin",
        ("get", "/healthz" | "/readyz" | "/metrics") => "open",
        other => panic!("route {other:?} has no scope in this test: decide one"),
    }
}

#[tokio::test]
async fn every_route_needs_its_scope() {
    let s = scoped_server().await;
    let doc: serde_json::Value = s
        .client
        .get(s.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut checked = 0;
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            let need = needed(method, path);
            // Ids that exist nowhere: an allowed call answers 4xx for its own reasons,
            // never 401/403, and changes nothing.
            let url = path
                .replace("{queue}", "matrix")
                .replace("{id}", "0190b5c2-7d1e-7c3a-9f00-1a2b3c4d5e6f");
            for (name, secret, scopes) in SCOPED {
                let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
                let mut b = s.client.request(m, s.url(&url)).bearer_auth(secret);
                if method != "get" {
                    b = b.json(&json!({}));
                }
                let r = b.send().await.unwrap();
                let status = r.status().as_u16();
                let body: serde_json::Value = r.json().await.unwrap_or_default();
                // `admin` includes every scope.
                let allowed = need == "open" || scopes.contains(&need) || scopes.contains(&"admin");
                if allowed {
                    assert!(
                        status != 401 && status != 403,
                        "{method} {path} with {name} ({scopes:?}) needs {need}: refused {status} {body}"
                    );
                } else {
                    assert_error(&(status, body.clone()), 403, "forbidden");
                    let msg = body["error"]["message"].as_str().unwrap();
                    assert!(msg.contains(need) && msg.contains(name), "{msg}");
                }
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 5 * 25,
        "only {checked} route × token pairs checked"
    );
    // Nothing the refused (or 4xx) calls sent was written.
    let (st, q) = s
        .client
        .get(s.url("/v1/queues"))
        .bearer_auth("read-secret-000001")
        .send()
        .await
        .map(|r| (r.status().as_u16(), r))
        .unwrap();
    assert_eq!(st, 200);
    let q: serde_json::Value = q.json().await.unwrap();
    let published: u64 = q["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            x["counts"]
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_u64().unwrap())
                .sum::<u64>()
        })
        .sum();
    // The only writes allowed through were the publishes with `{}` bodies: refused 400
    // (no payload), so nothing at all.
    assert_eq!(published, 0, "{q}");
    s.stop().await;
}

#[tokio::test]
async fn actions_are_audited_with_the_token_name() {
    let mut s = scoped_server().await;
    s.token = Some("publish-secret-0001".into());
    let id = s.publish_payload("q", json!(1)).await;
    s.token = Some("admin-secret-00001".into());
    let (st, b) = s.post(&format!("/v1/messages/{id}/kill"), json!({})).await;
    assert_eq!(st, 200, "{b}");
    s.token = Some("read-secret-000001".into());
    let (st, log) = s.get("/v1/audit").await;
    assert_eq!(st, 200, "{log}");
    assert_eq!(log["entries"][0]["actor"], "a", "{log}");
    assert_eq!(log["entries"][0]["action"], "message.kill");
    // A read token cannot act, and its refusal writes no audit entry.
    let (st, _) = s
        .post(&format!("/v1/messages/{id}/redrive"), json!({}))
        .await;
    assert_eq!(st, 403);
    let (_, log) = s.get("/v1/audit").await;
    assert_eq!(log["entries"].as_array().unwrap().len(), 1, "{log}");
    s.stop().await;
}
