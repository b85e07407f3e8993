//! The console in a real headless Chromium, driven over WebDriver (chromedriver): an
//! operator signs in, finds last night's dead letters by their error text, opens one,
//! redrives it and sees its state change; starts a bulk redrive of a failure group and
//! watches it to the end; a `read` session has no buttons and its forged posts are
//! refused; a cross-site form post is refused and changes nothing.
//!
//! Needs `chromium` and `chromium-driver` (Debian): without them the tests say so and are
//! skipped, except under CI (`CI=true`), where they fail (`.ci/run` installs them). With `REDRIVE_SCREENSHOTS=1` the screenshots of the main pages
//! go to `docs/screenshots/` (committed), else to a temporary directory.

#[path = "it/harness.rs"]
#[allow(dead_code)]
mod harness;
mod webdriver;

use harness::{id_of, lease_of, tokens_toml, TestServer, FAST};
use serde_json::json;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use webdriver::Driver;

const ADMIN: &str = "admin-secret-0123456789";
const READER: &str = "reader-secret-0123456789";

fn config() -> String {
    format!(
        "{FAST}\n{}",
        tokens_toml(&[
            ("ops-alice", ADMIN, &["admin"]),
            ("dashboard", READER, &["read"]),
        ])
    )
}

/// Where screenshots go, and the temporary directory that holds them otherwise.
fn screenshots() -> (PathBuf, Option<tempfile::TempDir>) {
    if std::env::var("REDRIVE_SCREENSHOTS").as_deref() == Ok("1") {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        (dir, None)
    } else {
        let t = tempfile::tempdir().unwrap();
        (t.path().to_owned(), Some(t))
    }
}

/// Publish `items` (payload, error class, error message) to `queue` as failed once, then
/// fail every later attempt the same way until all of them are dead (3 attempts each).
async fn fail_until_dead(
    s: &TestServer,
    queue: &str,
    items: Vec<(serde_json::Value, &str, String)>,
) {
    let mut errors = HashMap::new();
    for (payload, class, message) in &items {
        let m = s
            .publish(
                queue,
                json!({"payload": payload, "failed": {"class": class, "message": message}}),
            )
            .await;
        errors.insert(id_of(&m), json!({"class": class, "message": message}));
    }
    let before = harness::count(&s.counts(queue).await, "dead");
    let want = before + items.len() as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while harness::count(&s.counts(queue).await, "dead") < want {
        assert!(Instant::now() < deadline, "{queue}: not all dead");
        for m in s.lease(queue, json!({"max": 20, "wait": "1s"})).await {
            let id = id_of(&m);
            let error = errors
                .get(&id)
                .cloned()
                .unwrap_or(json!({"class": "transient"}));
            s.nack(&id, &lease_of(&m), error).await;
        }
    }
}

/// A night's worth of traffic: dead letters with varied errors in two queues, done and
/// ready messages, scheduled ones.
async fn seed(s: &TestServer) {
    let timeouts = (0..12)
        .map(|i| {
            (
                json!({"order_id": 48_210 + i, "customer": format!("cus_{:04}", 311 * i % 9_973), "amount_cents": 1_999 + 250 * i, "currency": "EUR"}),
                "transient",
                format!("timeout after 30000 ms calling payments-api at 10.0.3.{}:8443", 10 + i),
            )
        })
        .collect();
    fail_until_dead(s, "orders", timeouts).await;
    let unavailable = (0..5)
        .map(|i| {
            (
                json!({"sku": format!("SKU-{}", 7_700 + i), "warehouse": "ams-2", "qty": i + 1}),
                "transient",
                format!(
                    "HTTP 503 Service Unavailable from inventory-svc (request id 9f{i}a3c{i}e1)"
                ),
            )
        })
        .collect();
    fail_until_dead(s, "inventory", unavailable).await;
    for i in 0..3 {
        s.publish(
            "orders",
            json!({"payload": {"order_id": 48_300 + i, "customer": "cus_0042"},
                   "failed": {"class": "permanent", "message": format!("card_declined: insufficient funds (charge ch_{i}Q7x)")}}),
        )
        .await;
    }
    for i in 0..30 {
        s.publish(
            "emails",
            json!({"payload": {"template": "receipt", "to": format!("user{i}@example.com")}}),
        )
        .await;
    }
    for m in s.lease("emails", json!({"max": 20})).await {
        s.ack(&id_of(&m), &lease_of(&m)).await;
    }
    for i in 0..4 {
        s.publish(
            "billing",
            json!({"payload": {"invoice": format!("INV-2026-{:05}", 120 + i)}, "delay": "1h", "key": format!("acct-{i}")}),
        )
        .await;
    }
}

async fn sign_in(d: &Driver, base: &str, token: &str) {
    d.goto(&format!("{base}/ui")).await;
    d.wait_for("the sign-in page", 10, |url, _| url.contains("/ui/login"))
        .await;
    let field = d.find("#token").await;
    d.fill(&field, token).await;
    d.click(&d.find("#sign-in").await).await;
    d.wait_for("the overview after signing in", 10, |url, src| {
        url.ends_with("/ui") && src.contains("<h1>Overview</h1>")
    })
    .await;
}

#[tokio::test]
async fn an_operator_finds_redrives_and_bulk_redrives_a_failure_group() {
    let (shots, _keep) = screenshots();
    let mut s = TestServer::start(&config()).await;
    s.token = Some(ADMIN.to_owned());
    seed(&s).await;
    let base = format!("http://{}", s.addr);
    let Some(d) = Driver::start().await else {
        return;
    };

    sign_in(&d, &base, ADMIN).await;
    d.screenshot_page(&shots.join("overview.png")).await;

    // Search dead letters by error text.
    d.goto(&format!("{base}/ui/messages")).await;
    d.fill(&d.find("input[name=q]").await, "timeout").await;
    d.click(&d.find("select[name=state] option[value=dead]").await)
        .await;
    d.click(&d.find("form.search button").await).await;
    d.wait_for("the search result", 10, |url, src| {
        url.contains("q=timeout") && src.contains("12 messages</b>")
    })
    .await;
    d.screenshot(&shots.join("search.png")).await;

    // Open one, redrive it, see its state change.
    let link = d.find("table.results td.mono a").await;
    let id = d.text(&link).await;
    d.click(&link).await;
    d.wait_for("the message page", 10, |_, src| {
        src.contains("class=\"timeline\"")
    })
    .await;
    d.screenshot_page(&shots.join("message.png")).await;
    assert_eq!(s.message(&id).await["state"], "dead");
    d.click(&d.find("#redrive").await).await;
    d.wait_for("the message, now ready", 10, |url, src| {
        url.contains("done=redriven") && src.contains("badge st-ready")
    })
    .await;
    assert_eq!(s.message(&id).await["state"], "ready");

    // Bulk redrive the largest failure group (the 11 timeouts left), watching progress.
    d.goto(&format!("{base}/ui/groups")).await;
    d.wait_for("the groups", 10, |_, src| src.contains("class=\"groups\""))
        .await;
    d.screenshot(&shots.join("groups.png")).await;
    d.click(&d.find("form.group-action button").await).await;
    let confirm = d
        .wait_for("the dry run", 10, |url, src| {
            url.contains("/ui/tasks/new") && src.contains("class=\"total\"")
        })
        .await;
    assert!(confirm.contains("<b class=\"total\">11</b>"), "{confirm}");
    d.fill(&d.find("input[name=rate]").await, "4/s").await;
    d.click(&d.find("#start-task").await).await;
    d.wait_for("the task page, running", 10, |url, src| {
        url.contains("/ui/tasks/") && !url.contains("/new") && src.contains("task-progress")
    })
    .await;
    let mut shot = false;
    let progress_re = regex::Regex::new(r#"id="task-progress">(\d+) of 11<"#).unwrap();
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        // The page refreshes itself; only read it.
        let src = d.source().await;
        let progress = progress_re
            .captures(&src)
            .map(|c| c[1].parse::<u32>().unwrap());
        if !shot && progress.is_some_and(|p| p > 0 && p < 11) {
            d.screenshot(&shots.join("task.png")).await;
            shot = true;
        }
        if src.contains("id=\"task-state\"><span class=\"badge st-done\">") {
            assert_eq!(progress, Some(11), "{src}");
            break;
        }
        assert!(Instant::now() < deadline, "the task did not finish: {src}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !shot {
        d.screenshot(&shots.join("task.png")).await;
    }
    let orders = s.counts("orders").await;
    assert_eq!(
        harness::count(&orders, "dead"),
        3,
        "only the card declines are left: {orders}"
    );

    d.goto(&format!("{base}/ui/audit")).await;
    let audit = d
        .wait_for("the audit log", 10, |_, src| {
            src.contains("class=\"audit\"")
        })
        .await;
    for needle in ["task.create", "message.redrive", "ops-alice"] {
        assert!(audit.contains(needle), "{needle}: {audit}");
    }
    d.screenshot(&shots.join("audit.png")).await;
    d.quit().await;
    s.stop().await;
}

/// A page on another site that posts a form to the console as soon as it loads.
async fn evil_site(target: String) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let page = format!(
        "<!doctype html><html><body><form method=\"post\" action=\"{target}\">\
         <input name=\"csrf\" value=\"00000000000000000000000000000000\"></form>\
         <script>document.forms[0].submit()</script></body></html>"
    );
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let page = page.clone();
            async move { axum::response::Html(page) }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    (addr, task)
}

#[tokio::test]
async fn a_read_session_and_another_site_cannot_act() {
    let mut s = TestServer::start(&config()).await;
    s.token = Some(ADMIN.to_owned());
    let id = id_of(
        &s.publish(
            "orders",
            json!({"payload": {"order_id": 1}, "failed": {"class": "permanent", "message": "card_declined"}}),
        )
        .await,
    );
    let base = format!("http://{}", s.addr);
    let Some(d) = Driver::start().await else {
        return;
    };

    // A read session: no buttons; a forged POST from its own page is refused.
    sign_in(&d, &base, READER).await;
    d.goto(&format!("{base}/ui/messages/{id}")).await;
    let src = d
        .wait_for("the message page", 10, |_, src| {
            src.contains("class=\"timeline\"")
        })
        .await;
    assert!(src.contains("read only"));
    assert!(d.try_find("#redrive").await.is_none(), "no redrive button");
    assert!(d.find_all("form[action*='/ui/messages/']").await.is_empty());
    // (The console's Content-Security-Policy forbids fetch() from its pages, so the forgery
    // is a form injected into the page, carrying the session's own CSRF token.)
    d.execute_async(
        "const done = arguments[arguments.length - 1];
         const f = document.createElement('form');
         f.method = 'post';
         f.action = arguments[0];
         const i = document.createElement('input');
         i.name = 'csrf';
         i.value = document.querySelector('input[name=csrf]').value;
         f.appendChild(i);
         document.body.appendChild(f);
         f.submit();
         done(true);",
        json!([format!("/ui/messages/{id}/redrive")]),
    )
    .await;
    let answer = d
        .wait_for("the answer to the forged post", 10, |url, _| {
            url.ends_with("/redrive")
        })
        .await;
    assert!(
        answer.contains("operator actions need admin"),
        "a read session's POST with its own CSRF token: {answer}"
    );
    // The same with a plain HTTP client holding the session cookie and a wrong token.
    let cookie = d.cookie("redrive_session").await.expect("session cookie");
    let r = reqwest::Client::new()
        .post(format!("{base}/ui/messages/{id}/redrive"))
        .header("cookie", format!("redrive_session={cookie}"))
        .header("origin", &base)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("csrf=wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert_eq!(s.message(&id).await["state"], "dead", "nothing changed");

    // Sign out, sign in as admin: a page on another site posts a form to the console.
    d.click(&d.find("form[action='/ui/logout'] button").await)
        .await;
    d.wait_for("the sign-in page", 10, |url, _| url.contains("/ui/login"))
        .await;
    sign_in(&d, &base, ADMIN).await;
    let (evil, evil_task) = evil_site(format!("{base}/ui/messages/{id}/redrive")).await;
    d.goto(&format!("http://localhost:{}/", evil.port())).await;
    let refused = d
        .wait_for(
            "the console's answer to the cross-site post",
            10,
            |url, _| url.starts_with(&base),
        )
        .await;
    assert!(refused.contains("cross_origin"), "{refused}");
    assert_eq!(s.message(&id).await["state"], "dead", "nothing changed");
    evil_task.abort();
    d.quit().await;
    s.stop().await;
}
