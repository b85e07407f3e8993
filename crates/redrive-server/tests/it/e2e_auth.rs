//! Bearer tokens on `/v1/*`; health, readiness and metrics stay open.

use crate::harness::{assert_error, TestServer, FAST};
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
