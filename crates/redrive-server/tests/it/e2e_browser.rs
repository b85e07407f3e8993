//! A web page must not be able to drive a local redrive (issue 5, defect 4): non-JSON
//! bodies (browsers send them cross-site without a preflight), cross-site requests
//! (`Origin`, `Sec-Fetch-Site`) and DNS rebinding (a foreign `Host`) are refused with a
//! JSON error, and nothing changes. curl-like clients (no `Origin`, no `Sec-Fetch-*`,
//! a loopback `Host`) keep working.

use crate::harness::{assert_error, id_of, lease_of, Answer, TestServer, FAST};
use reqwest::header::{CONTENT_TYPE, HOST, ORIGIN};
use reqwest::Method;
use serde_json::{json, Value};

/// A server with a ready, a leased and a dead message in queue `b`; the leased message.
async fn fixture(top: &str) -> (TestServer, Value) {
    let s = TestServer::start(&format!("{top}\n{FAST}")).await;
    s.publish_payload("b", json!("dead")).await;
    let d = s.lease_one("b", "0s").await;
    let (st, _) = s
        .nack(&id_of(&d), &lease_of(&d), json!({"class": "permanent"}))
        .await;
    assert_eq!(st, 200);
    s.publish_payload("b", json!("leased")).await;
    let l = s.lease_one("b", "0s").await;
    s.publish_payload("b", json!("ready")).await;
    (s, l)
}

/// The id of the dead message of [`fixture`].
async fn dead_id(s: &TestServer) -> String {
    let (st, v) = s.get("/v1/messages?state=dead").await;
    assert_eq!(st, 200, "{v}");
    id_of(&v["messages"][0])
}

/// Every writing route of the API, with a body that would succeed if sent as JSON.
async fn writes(s: &TestServer, l: &Value) -> Vec<(Method, String, String)> {
    let id = id_of(l);
    let tok = lease_of(l);
    let dead = dead_id(s).await;
    vec![
        (
            Method::POST,
            "/v1/queues/b/messages".into(),
            r#"{"payload": {"to": "attacker"}}"#.into(),
        ),
        (
            Method::POST,
            "/v1/queues/b/leases".into(),
            r#"{"max": 5}"#.into(),
        ),
        (
            Method::POST,
            format!("/v1/messages/{id}/ack"),
            format!(r#"{{"lease": "{tok}"}}"#),
        ),
        (
            Method::POST,
            format!("/v1/messages/{id}/nack"),
            format!(r#"{{"lease": "{tok}", "error": {{"class": "permanent"}}}}"#),
        ),
        (
            Method::POST,
            "/v1/messages/ack".into(),
            format!(r#"{{"acks": [{{"id": "{id}", "lease": "{tok}"}}]}}"#),
        ),
        (
            Method::POST,
            format!("/v1/messages/{dead}/redrive"),
            "{}".into(),
        ),
        (
            Method::POST,
            format!("/v1/messages/{id}/kill"),
            r#"{"reason": "csrf"}"#.into(),
        ),
        (Method::DELETE, format!("/v1/messages/{dead}"), "{}".into()),
    ]
}

async fn answer(r: reqwest::RequestBuilder) -> Answer {
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test]
async fn non_json_bodies_are_415_and_change_nothing() {
    let (s, l) = fixture("").await;
    let before = s.snapshot().await;
    for (m, path, body) in writes(&s, &l).await {
        for ctype in [
            Some("text/plain"),
            Some("text/plain;charset=UTF-8"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=xyz"),
            Some("text/json"),
            None,
        ] {
            let mut b = s.req(m.clone(), &path).body(body.clone());
            if let Some(c) = ctype {
                b = b.header(CONTENT_TYPE, c);
            }
            let got = answer(b).await;
            assert_error(&got, 415, "unsupported_media_type");
            assert!(
                got.1["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("application/json"),
                "{m} {path} {ctype:?}: {}",
                got.1
            );
        }
    }
    assert_eq!(
        s.snapshot().await,
        before,
        "a non-JSON body changed something"
    );
    s.stop().await;
}

#[tokio::test]
async fn json_with_parameters_or_suffix_is_accepted() {
    let s = TestServer::fast("").await;
    for (i, ctype) in [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/vnd.redrive+json",
    ]
    .iter()
    .enumerate()
    {
        let got = answer(
            s.req(Method::POST, "/v1/queues/ok/messages")
                .header(CONTENT_TYPE, *ctype)
                .body(format!(r#"{{"payload": {i}}}"#)),
        )
        .await;
        assert_eq!(got.0, 201, "{ctype}: {}", got.1);
    }
    s.stop().await;
}

#[tokio::test]
async fn bodyless_post_without_content_type_is_accepted() {
    let (s, _) = fixture("").await;
    let dead = dead_id(&s).await;
    // What `curl -X POST …/redrive` sends: no body, no Content-Type.
    let got = answer(s.req(Method::POST, &format!("/v1/messages/{dead}/redrive"))).await;
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(got.1["state"], "ready", "{}", got.1);
    let got = answer(s.req(Method::POST, "/v1/queues/b/leases")).await;
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(got.1["messages"].as_array().unwrap().len(), 1, "{}", got.1);
    s.stop().await;
}

#[tokio::test]
async fn cross_site_fetch_metadata_is_403_cross_origin_and_changes_nothing() {
    let (s, l) = fixture("").await;
    let before = s.snapshot().await;
    for site in ["cross-site", "same-site"] {
        for (m, path, body) in writes(&s, &l).await {
            let got = answer(
                s.req(m.clone(), &path)
                    .header("sec-fetch-site", site)
                    .header(CONTENT_TYPE, "application/json")
                    .body(body),
            )
            .await;
            assert_error(&got, 403, "cross_origin");
        }
        // Reads too: a cross-site page must not read or export the messages.
        for path in [
            "/v1/messages",
            "/v1/messages/export",
            "/v1/queues",
            "/metrics",
        ] {
            let got = answer(s.req(Method::GET, path).header("sec-fetch-site", site)).await;
            assert_error(&got, 403, "cross_origin");
        }
    }
    assert_eq!(
        s.snapshot().await,
        before,
        "a cross-site request changed something"
    );
    // Same-origin and user-typed (none) requests are fine.
    for site in ["same-origin", "none"] {
        let got = answer(
            s.req(Method::GET, "/v1/queues")
                .header("sec-fetch-site", site),
        )
        .await;
        assert_eq!(got.0, 200, "{site}: {}", got.1);
    }
    s.stop().await;
}

#[tokio::test]
async fn foreign_origin_is_403_cross_origin_and_changes_nothing() {
    let (s, l) = fixture("").await;
    let before = s.snapshot().await;
    let port = s.addr.port();
    for origin in [
        "https://evil.example".to_owned(),
        "null".to_owned(),
        format!("http://localhost:{}", port + 1),
        format!("http://evil.example:{port}"),
    ] {
        for (m, path, body) in writes(&s, &l).await {
            let got = answer(
                s.req(m.clone(), &path)
                    .header(ORIGIN, &origin)
                    .header(CONTENT_TYPE, "application/json")
                    .body(body),
            )
            .await;
            assert_error(&got, 403, "cross_origin");
        }
        let got = answer(s.req(Method::GET, "/v1/messages").header(ORIGIN, &origin)).await;
        assert_error(&got, 403, "cross_origin");
    }
    assert_eq!(
        s.snapshot().await,
        before,
        "a foreign Origin changed something"
    );
    // The server's own origin (a page it would serve) is accepted.
    let own = format!("http://{}", s.addr);
    let got = answer(
        s.req(Method::POST, "/v1/queues/b/messages")
            .header(ORIGIN, own)
            .json(&json!({"payload": 1})),
    )
    .await;
    assert_eq!(got.0, 201, "{}", got.1);
    s.stop().await;
}

#[tokio::test]
async fn dns_rebinding_host_is_403_host_not_allowed_and_changes_nothing() {
    let (s, l) = fixture("").await;
    let before = s.snapshot().await;
    let port = s.addr.port();
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("localhost.evil.example:{port}"),
        format!("10.0.0.1:{port}"),
    ] {
        for (m, path, body) in writes(&s, &l).await {
            // The rebinding page is "same-origin" with itself: Origin matches Host.
            let got = answer(
                s.req(m.clone(), &path)
                    .header(HOST, &host)
                    .header(ORIGIN, format!("http://{host}"))
                    .header("sec-fetch-site", "same-origin")
                    .header(CONTENT_TYPE, "application/json")
                    .body(body),
            )
            .await;
            assert_error(&got, 403, "host_not_allowed");
        }
        for path in [
            "/v1/messages",
            "/v1/messages/export",
            "/v1/queues",
            "/metrics",
            "/openapi.json",
        ] {
            let got = answer(s.req(Method::GET, path).header(HOST, &host)).await;
            assert_error(&got, 403, "host_not_allowed");
        }
    }
    assert_eq!(
        s.snapshot().await,
        before,
        "a foreign Host changed something"
    );
    // Every loopback spelling works.
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("127.1.2.3:{port}"),
        format!("[::1]:{port}"),
        "localhost".to_owned(),
    ] {
        let got = answer(s.req(Method::GET, "/v1/queues").header(HOST, &host)).await;
        assert_eq!(got.0, 200, "{host}: {}", got.1);
    }
    s.stop().await;
}

#[tokio::test]
async fn allow_lists_admit_a_reverse_proxy() {
    let top = r#"allowed_hosts = ["redrive.internal"]
allowed_origins = ["https://console.example.com"]"#;
    let (s, _) = fixture(top).await;
    // A proxy that keeps the public Host and the browser's Origin.
    let got = answer(
        s.req(Method::POST, "/v1/queues/b/messages")
            .header(HOST, "redrive.internal")
            .header(ORIGIN, "https://console.example.com")
            .header("sec-fetch-site", "same-site")
            .json(&json!({"payload": 1})),
    )
    .await;
    assert_eq!(got.0, 201, "{}", got.1);
    // Other hosts and origins are still refused.
    let got = answer(
        s.req(Method::GET, "/v1/queues")
            .header(HOST, "other.internal"),
    )
    .await;
    assert_error(&got, 403, "host_not_allowed");
    let got = answer(
        s.req(Method::GET, "/v1/queues")
            .header(ORIGIN, "https://evil.example"),
    )
    .await;
    assert_error(&got, 403, "cross_origin");
    s.stop().await;
}

/// A link to the console in a chat (an alert) opens it: a cross-site top-level navigation
/// to a `/ui` page passes the guard. Anything else cross-site stays refused: a navigation to
/// the API, a script's fetch of a console page, a cross-site form post to the console.
#[tokio::test]
async fn a_cross_site_link_opens_the_console_and_nothing_else_gets_through() {
    let s = TestServer::fast("").await;
    let send = |method: Method, path: &str, mode: &str| {
        s.client
            .request(method, s.url(path))
            .header("sec-fetch-site", "cross-site")
            .header("sec-fetch-mode", mode)
    };
    for path in ["/ui", "/ui/messages?queue=orders&state=dead"] {
        let r = send(Method::GET, path, "navigate").send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
    let r = send(Method::GET, "/v1/messages", "navigate")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403, "a navigation to the API");
    let r = send(Method::GET, "/ui", "cors").send().await.unwrap();
    assert_eq!(
        r.status().as_u16(),
        403,
        "a script's fetch of a console page"
    );
    let r = send(Method::POST, "/ui/logout", "navigate")
        .header(ORIGIN, "https://chat.example.com")
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body("csrf=x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403, "a cross-site form post");
    s.stop().await;
}
