//! The console at `/ui` without a browser: pages answer HTML with what they should show,
//! every attacker-controlled value is escaped, sign-in and sessions, CSRF and Origin
//! checks, a read session sees no action and is refused, an admin session acts (and is
//! audited). The same scenarios in a real Chromium are `tests/browser.rs`.

use crate::harness::{id_of, tokens_toml, TestServer, FAST};
use reqwest::header::{CONTENT_TYPE, LOCATION, SET_COOKIE};
use serde_json::json;

pub const ADMIN: &str = "admin-secret-0123456789";
pub const READER: &str = "reader-secret-0123456789";
pub const PUBLISHER: &str = "publisher-secret-012345";

/// `[[tokens]]`: ops-admin (admin), ops-reader (read), billing (publish only).
pub fn tokens() -> String {
    tokens_toml(&[
        ("ops-admin", ADMIN, &["admin"]),
        ("ops-reader", READER, &["read"]),
        ("billing", PUBLISHER, &["publish"]),
    ])
}

/// A browser-less console client: no redirects followed, the session cookie kept by hand.
struct Console {
    base: String,
    http: reqwest::Client,
    cookie: Option<String>,
}

/// Status, `Location`, body.
type Page = (u16, Option<String>, String);

impl Console {
    fn new(s: &TestServer) -> Console {
        Console {
            base: format!("http://{}", s.addr),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            cookie: None,
        }
    }

    fn origin(&self) -> String {
        self.base.clone()
    }

    async fn page(r: reqwest::RequestBuilder) -> (Page, reqwest::header::HeaderMap) {
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let location = headers
            .get(LOCATION)
            .map(|v| v.to_str().unwrap().to_owned());
        ((status, location, r.text().await.unwrap()), headers)
    }

    async fn get(&self, path: &str) -> Page {
        let mut b = self.http.get(format!("{}{path}", self.base));
        if let Some(c) = &self.cookie {
            b = b.header(reqwest::header::COOKIE, c);
        }
        Self::page(b).await.0
    }

    /// GET, expect 200 HTML, return the body.
    async fn html(&self, path: &str) -> String {
        let mut b = self.http.get(format!("{}{path}", self.base));
        if let Some(c) = &self.cookie {
            b = b.header(reqwest::header::COOKIE, c);
        }
        let ((st, _, body), h) = Self::page(b).await;
        assert_eq!(st, 200, "{path}: {body}");
        let ct = h.get(CONTENT_TYPE).unwrap().to_str().unwrap();
        assert!(ct.starts_with("text/html"), "{path}: {ct}");
        let csp = h
            .get("content-security-policy")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        assert!(csp.contains("default-src 'none'"), "{path}: CSP {csp:?}");
        body
    }

    /// POST a form with `origin` (None: no Origin header).
    async fn post(&self, path: &str, form: &[(&str, &str)], origin: Option<&str>) -> Page {
        let mut b = self
            .http
            .post(format!("{}{path}", self.base))
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(serde_urlencoded::to_string(form).unwrap());
        if let Some(o) = origin {
            b = b.header(reqwest::header::ORIGIN, o);
        }
        if let Some(c) = &self.cookie {
            b = b.header(reqwest::header::COOKIE, c);
        }
        Self::page(b).await.0
    }

    /// Sign in with `token`; returns the `Set-Cookie` value.
    async fn sign_in(&mut self, token: &str) -> String {
        let b = self
            .http
            .post(format!("{}/ui/login", self.base))
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(reqwest::header::ORIGIN, self.origin())
            .body(
                serde_urlencoded::to_string([("token", token), ("next", "/ui/messages")]).unwrap(),
            );
        let ((st, loc, body), h) = Self::page(b).await;
        assert_eq!(st, 303, "{body}");
        assert_eq!(loc.as_deref(), Some("/ui/messages"));
        let set = h.get(SET_COOKIE).unwrap().to_str().unwrap().to_owned();
        self.cookie = Some(set.split(';').next().unwrap().to_owned());
        set
    }
}

/// The CSRF token in a page's forms.
fn csrf(html: &str) -> String {
    let re = regex::Regex::new(r#"name="csrf" value="([0-9a-f]{32})""#).unwrap();
    re.captures(html)
        .unwrap_or_else(|| panic!("no csrf field in {html}"))[1]
        .to_owned()
}

/// Publish a message that is dead at once (a permanent failure reported at publish).
pub async fn dead(s: &TestServer, queue: &str, payload: serde_json::Value, error: &str) -> String {
    id_of(
        &s.publish(
            queue,
            json!({"payload": payload, "failed": {"class": "permanent", "message": error}}),
        )
        .await,
    )
}

#[tokio::test]
async fn pages_answer_html_and_escape_what_clients_wrote() {
    let s = TestServer::fast("").await;
    let evil = "<script>alert('x')</script>";
    let id = dead(
        &s,
        "orders",
        json!({"order": 42, "note": evil}),
        "upstream said <img src=x onerror=alert(1)> for order 42",
    )
    .await;
    dead(
        &s,
        "orders",
        json!({"order": 43}),
        "upstream said <img src=x onerror=alert(1)> for order 43",
    )
    .await;
    s.publish(
        "billing",
        json!({"payload": {"invoice": 1}, "headers": {"x-evil": "\"><script>1</script>"}, "key": "k<1>"}),
    )
    .await;
    let c = Console::new(&s);

    let overview = c.html("/ui").await;
    assert!(overview.contains("<h1>Overview</h1>"));
    assert!(overview.contains("since start-up at"));
    assert!(overview.contains("href=\"/ui/queues/orders\""));
    assert_eq!(
        overview.matches("<polyline").count(),
        8,
        "two charts of four lines"
    );
    assert!(
        overview.contains("dead <b>2</b>"),
        "the charts count the dead letters"
    );

    let queue = c.html("/ui/queues/orders").await;
    assert!(queue.contains("Retry policy") && queue.contains("class=\"explain\""));
    assert!(
        queue.contains("<td class=\"num\">2</td>"),
        "the explain table has attempt 2"
    );

    let search = c
        .html("/ui/messages?queue=orders&state=dead&q=upstream")
        .await;
    assert!(
        search.contains("<b class=\"total\">2 messages</b>"),
        "{search}"
    );
    assert!(search.contains(&format!("href=\"/ui/messages/{id}\"")));
    assert!(search.contains(
        "/ui/messages/export?queue=orders&amp;state=dead&amp;q=upstream&amp;format=jsonl"
    ));
    assert!(
        !search.contains("<img src=x"),
        "an error message is escaped: {search}"
    );
    assert!(search.contains("&lt;img src=x onerror=alert(1)&gt;"));
    // The form sends empty fields: they filter nothing.
    let form = c
        .html("/ui/messages?queue=&state=dead&key=&error_class=&q=upstream&since=&until=")
        .await;
    assert!(form.contains("<b class=\"total\">2 messages</b>"), "{form}");
    let none = c.html("/ui/messages?q=no-such-text").await;
    assert!(none.contains("<b class=\"total\">0 messages</b>"));
    let (st, _, bad) = c.get("/ui/messages?state=zombie").await;
    assert_eq!(st, 400);
    assert!(bad.contains("zombie"), "{bad}");

    let page = c.html(&format!("/ui/messages/{id}")).await;
    assert!(
        !page.contains("<script>alert"),
        "the payload is escaped: {page}"
    );
    assert!(page.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"));
    assert!(
        page.contains("&quot;order&quot;: 42"),
        "pretty-printed payload"
    );
    assert!(page.contains("class=\"timeline\"") && page.contains("permanent"));
    assert!(
        page.contains("action=\"/ui/messages/"),
        "no tokens: anonymous can act"
    );

    let billing = c.html("/ui/messages?queue=billing").await;
    let bid = regex::Regex::new(r#"href="/ui/messages/([0-9a-f-]{36})""#)
        .unwrap()
        .captures(&billing)
        .unwrap()[1]
        .to_owned();
    let bpage = c.html(&format!("/ui/messages/{bid}")).await;
    assert!(!bpage.contains("\"><script>1"), "a header is escaped");
    assert!(bpage.contains("&quot;&gt;&lt;script&gt;1&lt;/script&gt;"));
    assert!(bpage.contains("k&lt;1&gt;"));

    let groups = c.html("/ui/groups").await;
    assert!(
        groups.contains("<td class=\"num\"><b>2</b></td>"),
        "{groups}"
    );
    assert!(groups.contains("action=\"/ui/tasks/new\""));
    for path in ["/ui/tasks", "/ui/audit", "/ui/endpoints", "/ui/bridges"] {
        c.html(path).await;
    }
    let (st, _, css) = c.get("/ui/static/console.css").await;
    assert_eq!(st, 200);
    assert!(css.contains(".badge"));

    let (st, _, export) = c
        .get("/ui/messages/export?queue=orders&state=dead&format=jsonl")
        .await;
    assert_eq!(st, 200);
    assert_eq!(export.lines().count(), 2, "{export}");
    s.stop().await;
}

#[tokio::test]
async fn tokens_need_a_session_and_a_readable_token() {
    let s = TestServer::start(&format!("{FAST}\n{}", tokens())).await;
    let mut c = Console::new(&s);
    let (st, loc, _) = c.get("/ui/messages?q=a").await;
    assert_eq!(st, 303);
    assert_eq!(
        loc.as_deref(),
        Some("/ui/login?next=%2Fui%2Fmessages%3Fq%3Da")
    );
    let (st, _, login) = c.get("/ui/login").await;
    assert_eq!(st, 200);
    assert!(login.contains("type=\"password\""));

    let (st, _, body) = c
        .post(
            "/ui/login",
            &[("token", "wrong-secret-0000000000")],
            Some(&c.origin()),
        )
        .await;
    assert_eq!(st, 401);
    assert!(body.contains("That token is not valid."), "{body}");
    let (st, _, body) = c
        .post("/ui/login", &[("token", PUBLISHER)], Some(&c.origin()))
        .await;
    assert_eq!(st, 403);
    assert!(body.contains("the console needs read"), "{body}");

    let set = c.sign_in(ADMIN).await;
    assert!(set.starts_with("redrive_session="), "{set}");
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(set.contains(attr), "{set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP: no Secure: {set}");
    let page = c.html("/ui").await;
    assert!(page.contains("ops-admin"));
    let (st, _, body) = c.get("/ui/no-such-page").await;
    assert_eq!(st, 404);
    assert!(body.contains("There is no console page here."));
    assert_eq!(c.get("/ui/").await.1.as_deref(), Some("/ui"));
    // A made-up session is no session, nor is a real one's nonce under another token.
    c.cookie = Some("redrive_session=00000000000000000000000000000000".into());
    assert_eq!(c.get("/ui").await.0, 303);
    c.cookie = Some("redrive_session=00000000000000000000000000000000.ops-admin".into());
    assert_eq!(c.get("/ui").await.0, 303);
    let real = set.split(';').next().unwrap().to_owned();
    c.cookie = Some(real.replace(".ops-admin", ".ops-reader"));
    assert_eq!(c.get("/ui").await.0, 303);
    s.stop().await;
}

#[tokio::test]
async fn posts_need_the_csrf_token_and_this_origin() {
    let mut s = TestServer::start(&format!("{FAST}\n{}", tokens())).await;
    s.token = Some(ADMIN.to_owned());
    let id = dead(&s, "orders", json!({"n": 1}), "boom").await;
    let mut c = Console::new(&s);
    c.sign_in(ADMIN).await;
    let page = c.html(&format!("/ui/messages/{id}")).await;
    let token = csrf(&page);
    let path = format!("/ui/messages/{id}/redrive");
    let origin = c.origin();

    let (st, _, body) = c.post(&path, &[], Some(&origin)).await;
    assert_eq!(st, 403, "no CSRF token: {body}");
    let (st, _, _) = c
        .post(
            &path,
            &[("csrf", "0123456789abcdef0123456789abcdef")],
            Some(&origin),
        )
        .await;
    assert_eq!(st, 403, "a wrong CSRF token");
    let (st, _, body) = c
        .post(&path, &[("csrf", &token)], Some("http://evil.example"))
        .await;
    assert_eq!(st, 403, "a cross-site Origin: {body}");
    let (st, _, _) = c.post(&path, &[("csrf", &token)], None).await;
    assert_eq!(st, 403, "no Origin");
    // Another session's token is not this one's.
    let mut other = Console::new(&s);
    other.sign_in(ADMIN).await;
    let (st, _, _) = other.post(&path, &[("csrf", &token)], Some(&origin)).await;
    assert_eq!(st, 403, "a token of another session");
    assert_eq!(s.message(&id).await["state"], "dead", "nothing changed");

    let (st, loc, _) = c.post(&path, &[("csrf", &token)], Some(&origin)).await;
    assert_eq!(st, 303);
    assert_eq!(loc.unwrap(), format!("/ui/messages/{id}?done=redriven"));
    assert_eq!(s.message(&id).await["state"], "ready");
    let audit = c.html("/ui/audit").await;
    assert!(
        audit.contains("message.redrive") && audit.contains("ops-admin"),
        "{audit}"
    );

    // Sign out: the session is gone.
    let (st, loc, _) = c
        .post("/ui/logout", &[("csrf", &token)], Some(&origin))
        .await;
    assert_eq!((st, loc.as_deref()), (303, Some("/ui/login")));
    assert_eq!(c.get("/ui").await.0, 303);
    s.stop().await;
}

#[tokio::test]
async fn a_read_session_sees_no_action_and_is_refused() {
    let mut s = TestServer::start(&format!("{FAST}\n{}", tokens())).await;
    s.token = Some(ADMIN.to_owned());
    let admin = &s;
    let id = dead(admin, "orders", json!({"n": 1}), "boom 1").await;
    let mut c = Console::new(&s);
    c.sign_in(READER).await;
    let page = c.html(&format!("/ui/messages/{id}")).await;
    assert!(page.contains("read only"));
    assert!(
        !page.contains("action=\"/ui/messages/"),
        "no action form: {page}"
    );
    let groups = c.html("/ui/groups").await;
    assert!(!groups.contains("/ui/tasks/new"), "no bulk action");
    let search = c.html("/ui/messages?queue=orders").await;
    assert!(!search.contains("/ui/tasks/new"));
    assert_eq!(
        c.get("/ui/tasks/new?action=redrive&state=dead").await.0,
        403
    );
    let token = csrf(&page); // the sign-out form's
    for action in ["redrive", "kill", "delete"] {
        let (st, _, body) = c
            .post(
                &format!("/ui/messages/{id}/{action}"),
                &[("csrf", &token), ("confirm", "yes")],
                Some(&c.origin()),
            )
            .await;
        assert_eq!(st, 403, "{action}: {body}");
        assert!(body.contains("need admin"), "{body}");
    }
    let (st, _, _) = c
        .post(
            "/ui/tasks",
            &[("csrf", &token), ("action", "delete"), ("state", "dead")],
            Some(&c.origin()),
        )
        .await;
    assert_eq!(st, 403);
    assert_eq!(admin.message(&id).await["state"], "dead", "nothing changed");
    s.stop().await;
}

#[tokio::test]
async fn an_admin_edits_kills_deletes_and_runs_a_group_task() {
    let s = TestServer::fast("").await;
    let id = dead(
        &s,
        "orders",
        json!({"n": 1}),
        "timeout after 30s on host 10.0.0.1",
    )
    .await;
    let c = Console::new(&s);
    let origin = c.origin();
    let page = c.html(&format!("/ui/messages/{id}")).await;
    let token = csrf(&page);

    // Invalid JSON: the page again with the error and the text, nothing changed.
    let (st, _, body) = c
        .post(
            &format!("/ui/messages/{id}/edit"),
            &[("csrf", &token), ("payload", "{\"n\": ")],
            Some(&origin),
        )
        .await;
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("not valid JSON"), "{body}");
    assert!(
        body.contains("{&quot;n&quot;: </textarea>"),
        "the text is kept: {body}"
    );
    assert_eq!(s.message(&id).await["state"], "dead");
    let (st, loc, _) = c
        .post(
            &format!("/ui/messages/{id}/edit"),
            &[("csrf", &token), ("payload", "{\"n\": 2}")],
            Some(&origin),
        )
        .await;
    assert_eq!(
        (st, loc.unwrap()),
        (303, format!("/ui/messages/{id}?done=edited"))
    );
    let m = s.message(&id).await;
    assert_eq!(
        (m["state"].clone(), m["payload"].clone()),
        (json!("ready"), json!({"n": 2}))
    );

    // Kill with a reason, then delete (which needs the box ticked).
    let (st, _, _) = c
        .post(
            &format!("/ui/messages/{id}/kill"),
            &[("csrf", &token), ("reason", "bad data")],
            Some(&origin),
        )
        .await;
    assert_eq!(st, 303);
    assert_eq!(s.message(&id).await["dead_reason"], "killed");
    let (st, _, body) = c
        .post(
            &format!("/ui/messages/{id}/delete"),
            &[("csrf", &token)],
            Some(&origin),
        )
        .await;
    assert_eq!(st, 400);
    assert!(body.contains("I am sure"), "{body}");
    let (st, _, _) = c
        .post(
            &format!("/ui/messages/{id}/delete"),
            &[("csrf", &token), ("confirm", "yes")],
            Some(&origin),
        )
        .await;
    assert_eq!(st, 303);
    assert_eq!(s.get(&format!("/v1/messages/{id}")).await.0, 404);
    let audit = c.html("/ui/audit").await;
    for a in ["message.edit_redrive", "message.kill", "message.delete"] {
        assert!(audit.contains(a), "{a}: {audit}");
    }

    // A failure group: the dry run counts, the task redrives every one of them.
    for i in 0..5 {
        dead(
            &s,
            "orders",
            json!({"i": i}),
            &format!("timeout after 30s on host 10.0.0.{i}"),
        )
        .await;
    }
    dead(&s, "orders", json!({"other": 1}), "card declined").await;
    let groups = c.html("/ui/groups").await;
    let fp = regex::Regex::new(r#"name="fingerprint" value="([^"]*timeout[^"]*)""#)
        .unwrap()
        .captures(&groups)
        .unwrap_or_else(|| panic!("{groups}"))[1]
        .replace("&#39;", "'")
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    let confirm = c
        .html(&format!(
            "/ui/tasks/new?action=redrive&state=dead&queue=orders&fingerprint={}",
            urlencode(&fp)
        ))
        .await;
    assert!(confirm.contains("<b class=\"total\">5</b>"), "{confirm}");
    let (st, loc, body) = c
        .post(
            "/ui/tasks",
            &[
                ("csrf", &token),
                ("action", "redrive"),
                ("state", "dead"),
                ("queue", "orders"),
                ("fingerprint", &fp),
                ("rate", ""),
            ],
            Some(&origin),
        )
        .await;
    assert_eq!(st, 303, "{body}");
    let task_path = loc.unwrap();
    assert!(task_path.starts_with("/ui/tasks/"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let t = c.html(&task_path).await;
        if t.contains("badge st-done") {
            assert!(t.contains("<b id=\"task-progress\">5 of 5</b>"), "{t}");
            // Each count says what it counts (issue 15).
            assert!(
                t.contains("id=\"task-done\">5 redriven</span>, <span class=\"failed\" id=\"task-refused\">0 refused</span>"),
                "{t}"
            );
            assert!(t.contains("the stop rule watches those"), "{t}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "task not done: {t}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        s.counts("orders").await["dead"],
        1,
        "only the other group is left"
    );
    s.stop().await;
}

/// Regression, issue 15 (SPEC §12 "triage by time and by group"): the search filters on when
/// a message finished and takes relative times, every time says UTC, a row shows an escaped
/// and bounded payload snippet, and a failure group links to the list of all its messages.
#[tokio::test]
async fn the_console_triages_by_time_and_by_group() {
    let s = TestServer::fast("").await;
    let long = "x".repeat(500);
    for i in 0..7 {
        dead(
            &s,
            "orders",
            json!({"a_note": "<b>bold</b>", "long": long, "order": i}),
            &format!("HTTP 503 from payments (order {i})"),
        )
        .await;
    }
    dead(
        &s,
        "orders",
        json!({"order": 99}),
        "HTTP 500 from payments (order 99)",
    )
    .await;
    s.publish_payload("orders", json!({"order": "live"})).await;
    let c = Console::new(&s);

    let found = c
        .html("/ui/messages?queue=orders&state=&finished_since=1h&finished_until=&fingerprint=")
        .await;
    assert!(
        found.contains("<b class=\"total\">8 messages</b>"),
        "{found}"
    );
    assert!(
        found.contains("name=\"finished_since\" value=\"1h\""),
        "{found}"
    );
    // The snippet: escaped, cut.
    assert!(!found.contains("<b>bold</b>"), "{found}");
    assert!(found.contains("&lt;b&gt;bold&lt;/b&gt;"), "{found}");
    let snippets: Vec<String> = regex::Regex::new(r#"<td class="mono snippet">([^<]*)</td>"#)
        .unwrap()
        .captures_iter(&found)
        .map(|c| c[1].to_owned())
        .collect();
    assert_eq!(snippets.len(), 8, "a snippet per row: {found}");
    assert_eq!(
        snippets[0], "{&quot;order&quot;:99}",
        "a short payload whole"
    );
    let long = &snippets[1];
    assert!(
        long.starts_with("{&quot;a_note&quot;:&quot;&lt;b&gt;") && long.ends_with('…'),
        "{long}"
    );
    assert!(long.chars().count() < 140, "bounded: {long}");
    // Every time is labelled UTC.
    let times = regex::Regex::new(r"<time [^>]*>([^<]*)</time>").unwrap();
    let shown: Vec<String> = times
        .captures_iter(&found)
        .map(|c| c[1].to_owned())
        .collect();
    assert!(
        !shown.is_empty() && shown.iter().all(|t| t.ends_with(" UTC")),
        "{shown:?}"
    );
    assert!(found.contains("Finished since (UTC)"), "{found}");
    let none = c.html("/ui/messages?finished_until=1h").await;
    assert!(none.contains("<b class=\"total\">0 messages</b>"), "{none}");
    let (st, _, bad) = c.get("/ui/messages?finished_since=soon").await;
    assert_eq!(st, 400);
    assert!(bad.contains("finished_since"), "{bad}");

    // The group links to all of its messages.
    let groups = c.html("/ui/groups").await;
    let link = regex::Regex::new(
        r#"<a class="all" href="(/ui/messages\?state=dead&amp;fingerprint=[^"]*)">all 7 →</a>"#,
    )
    .unwrap()
    .captures(&groups)
    .unwrap_or_else(|| panic!("no link to the group's messages: {groups}"))[1]
        .replace("&amp;", "&");
    assert!(link.contains("HTTP%20503"), "{link}");
    assert!(
        groups.contains("all 1 →"),
        "the 500s are their own group: {groups}"
    );
    let all = c.html(&link).await;
    assert!(all.contains("<b class=\"total\">7 messages</b>"), "{all}");
    assert!(
        all.contains(
            "name=\"fingerprint\" value=\"permanent: HTTP 503 from payments (order &lt;n&gt;)\""
        ),
        "{all}"
    );
    assert!(
        all.contains("/ui/tasks/new?state=dead&amp;fingerprint="),
        "a bulk action over the group: {all}"
    );
    s.stop().await;
}

fn urlencode(s: &str) -> String {
    serde_urlencoded::to_string([("x", s)]).unwrap()[2..].to_owned()
}

#[tokio::test]
async fn the_cookie_is_secure_behind_a_tls_proxy_named_in_allowed_hosts() {
    let s = TestServer::start(&format!(
        "allowed_hosts = [\"redrive.example\"]\n{FAST}\n{}",
        tokens()
    ))
    .await;
    let c = Console::new(&s);
    let sign_in = |proto: &'static str| {
        c.http
            .post(format!("{}/ui/login", c.base))
            .header(reqwest::header::HOST, "redrive.example")
            .header("x-forwarded-proto", proto)
            .header(reqwest::header::ORIGIN, "https://redrive.example")
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(format!("token={ADMIN}"))
            .send()
    };
    for (proto, secure) in [("https", true), ("http", false)] {
        let r = sign_in(proto).await.unwrap();
        assert_eq!(r.status().as_u16(), 303, "{proto}");
        let set = r.headers()[SET_COOKIE].to_str().unwrap().to_owned();
        assert_eq!(set.ends_with("; Secure"), secure, "{proto}: {set}");
    }
    s.stop().await;
}

#[tokio::test]
async fn an_unknown_static_file_is_404_without_naming_internals() {
    for config in [FAST.to_owned(), format!("{FAST}\n{}", tokens())] {
        let s = TestServer::start(&config).await;
        let c = Console::new(&s);
        for path in ["/ui/static/app.js", "/ui/static/", "/ui/static/a/b.png"] {
            let (st, _, body) = c.get(path).await;
            assert_eq!(st, 404, "{path}: {body}");
            assert!(body.contains("<h1>Not found</h1>"), "{path}: {body}");
            assert!(!body.contains("redrive_server"), "{path}: {body}");
            assert!(!body.contains("extension"), "{path}: {body}");
        }
        assert_eq!(c.get("/ui/static/console.css").await.0, 200);
        s.stop().await;
    }
}

#[tokio::test]
async fn a_read_token_signing_in_in_a_loop_never_signs_an_admin_out() {
    let s = TestServer::start(&format!("{FAST}\n{}", tokens())).await;
    let mut admin = Console::new(&s);
    admin.sign_in(ADMIN).await;
    let mut reader = Console::new(&s);
    // Three times the bound of one token's sessions (64): each sign-in is a new session of
    // ops-reader, and only ops-reader's least recently used ones end.
    for _ in 0..200 {
        reader.sign_in(READER).await;
    }
    let page = admin.html("/ui").await;
    assert!(page.contains("ops-admin"), "the admin is still signed in");
    assert_eq!(
        reader.get("/ui").await.0,
        200,
        "the newest reader session works"
    );
    s.stop().await;
}

/// Two nodes on one PostgreSQL schema behind a load balancer (SPEC §13): a sign-in on A is
/// a session on B, a form A rendered is accepted by B (one CSRF token per session, in the
/// store), the action is audited naming B, and signing out on B ends the session on A.
#[tokio::test]
async fn a_session_opened_on_one_node_works_on_another_and_ends_there() {
    let config = format!("{FAST}\n{}", tokens());
    let mut a = TestServer::start_shared(&config).await;
    let mut b = a.start_beside(&config).await;
    a.token = Some(ADMIN.to_owned());
    b.token = Some(ADMIN.to_owned());
    let id = dead(&a, "orders", json!({"n": 1}), "boom").await;
    let mut on_a = Console::new(&a);
    on_a.sign_in(ADMIN).await;
    let mut on_b = Console::new(&b);
    on_b.cookie = on_a.cookie.clone();

    let page_a = on_a.html(&format!("/ui/messages/{id}")).await;
    let page_b = on_b.html(&format!("/ui/messages/{id}")).await;
    assert!(
        page_b.contains("ops-admin"),
        "B knows A's session: {page_b}"
    );
    let token = csrf(&page_a);
    assert_eq!(csrf(&page_b), token, "one session, one CSRF token, on both");
    // A form A rendered, posted to B.
    let (st, loc, body) = on_b
        .post(
            &format!("/ui/messages/{id}/redrive"),
            &[("csrf", &token)],
            Some(&on_b.origin()),
        )
        .await;
    assert_eq!(st, 303, "{body}");
    assert_eq!(loc.unwrap(), format!("/ui/messages/{id}?done=redriven"));
    assert_eq!(a.message(&id).await["state"], "ready");
    // The audit log names B, the node that did it, in the API and on A's console page.
    let node_b = crate::harness::ok(b.get("/v1/cluster").await)["node"]
        .as_str()
        .unwrap()
        .to_owned();
    let node_a = crate::harness::ok(a.get("/v1/cluster").await)["node"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(node_a, node_b);
    let log = crate::harness::ok(a.get("/v1/audit").await);
    let entry = &log["entries"][0];
    assert_eq!(
        (entry["action"].as_str(), entry["node"].as_str()),
        (Some("message.redrive"), Some(node_b.as_str())),
        "{log}"
    );
    let audit = on_a.html("/ui/audit").await;
    assert!(audit.contains(&node_b), "{audit}");

    // Signed out on B: signed out on A too.
    let (st, loc, _) = on_b
        .post("/ui/logout", &[("csrf", &token)], Some(&on_b.origin()))
        .await;
    assert_eq!((st, loc.as_deref()), (303, Some("/ui/login")));
    assert_eq!(on_a.get("/ui").await.0, 303, "the session ended on A");
    assert_eq!(on_b.get("/ui").await.0, 303);
    b.stop().await;
    a.stop().await;
}

/// Without tokens (loopback), the CSRF token of every form is the store's: a form rendered
/// by one node is accepted by another.
#[tokio::test]
async fn without_tokens_a_form_of_one_node_is_accepted_by_another() {
    let a = TestServer::start_shared(FAST).await;
    let b = a.start_beside(FAST).await;
    let id = dead(&a, "orders", json!({"n": 1}), "boom").await;
    let token = csrf(&Console::new(&a).html(&format!("/ui/messages/{id}")).await);
    let on_b = Console::new(&b);
    assert_eq!(csrf(&on_b.html(&format!("/ui/messages/{id}")).await), token);
    let (st, _, body) = on_b
        .post(
            &format!("/ui/messages/{id}/redrive"),
            &[("csrf", &token)],
            Some(&on_b.origin()),
        )
        .await;
    assert_eq!(st, 303, "{body}");
    assert_eq!(a.message(&id).await["state"], "ready");
    b.stop().await;
    a.stop().await;
}

/// A store that fails while the console checks a session is a 503 page, not a sign-out
/// nor a 500: the next request, the store back, is signed in as before.
#[tokio::test]
async fn a_store_failure_while_checking_the_session_is_503_and_signs_nobody_out() {
    let (s, faulty) = TestServer::start_with_faulty_store(
        &format!("{FAST}\n{}", tokens()),
        std::sync::Arc::new(redrive_server::engine::SystemClock::default()),
    )
    .await;
    let mut c = Console::new(&s);
    c.sign_in(ADMIN).await;
    faulty.fail_session_lookups(1);
    let (st, loc, body) = c.get("/ui").await;
    assert_eq!((st, loc), (503, None), "{body}");
    assert!(
        body.contains("<html") && body.contains("still signed in"),
        "an HTML page saying so: {body}"
    );
    let page = c.html("/ui").await;
    assert!(page.contains("ops-admin"), "still signed in: {page}");
    s.stop().await;
}
