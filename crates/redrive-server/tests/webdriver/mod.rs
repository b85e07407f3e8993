//! A small W3C WebDriver client over reqwest, enough for the console's browser tests:
//! start chromedriver on a free port, open a headless Chromium session with a fresh
//! profile, navigate, find, click, type, read, run a script, take a screenshot.
//!
//! Why not fantoccini or thirtyfour: either brings hyper-rustls/tungstenite/cookie and
//! dozens of crates more to build on a shared 2-core machine, for the dozen endpoints
//! used here (each one HTTP call with a JSON body, `/session/{id}/…`).

use base64::Engine as _;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// The key of an element reference in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A running chromedriver with one browser session; both end on [`Driver::quit`] (or on
/// drop: chromedriver is killed, and Chromium with it).
pub struct Driver {
    http: reqwest::Client,
    session: String,
    _chromedriver: tokio::process::Child,
    _profile: tempfile::TempDir,
}

/// An element of the current page.
#[derive(Debug, Clone)]
pub struct Element(String);

fn find_program(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

impl Driver {
    /// Start chromedriver and a headless Chromium. When either is missing: under CI
    /// (`CI=true`, whose script installs them) the test fails; elsewhere it says so and is
    /// skipped (`None`), so that `cargo test --workspace` needs only a Rust toolchain.
    pub async fn start() -> Option<Driver> {
        let chromium = ["chromium", "chromium-browser", "google-chrome"]
            .iter()
            .find_map(|n| find_program(n));
        let (Some(chromedriver), Some(chromium)) = (find_program("chromedriver"), chromium) else {
            let why = "chromium or chromedriver not found on PATH: install chromium \
                       chromium-driver (apt-get install chromium chromium-driver)";
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{why}");
            }
            eprintln!("SKIPPED: the console's browser test: {why}");
            return None;
        };
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let child = tokio::process::Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromedriver.display()));
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = match http.get(format!("{base}/status")).send().await {
                Ok(r) => r
                    .json::<Value>()
                    .await
                    .ok()
                    .is_some_and(|v| v["value"]["ready"] == true),
                Err(_) => false,
            };
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not become ready within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let args = [
            "--headless".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-quic".to_owned(),
            "--no-first-run".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--window-size=1360,900".to_owned(),
            "--hide-scrollbars".to_owned(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args}
        }}});
        let r: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = r["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no browser session: {r}"))
            .to_owned();
        Some(Driver {
            http,
            session: format!("{base}/session/{id}"),
            _chromedriver: child,
            _profile: profile,
        })
    }

    async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut b = self
            .http
            .request(method.clone(), format!("{}{path}", self.session));
        if let Some(body) = body {
            b = b.json(&body);
        } else if method == reqwest::Method::POST {
            b = b.json(&json!({}));
        }
        let r: Value = b.send().await.unwrap().json().await.unwrap();
        if let Some(e) = r["value"]["error"].as_str() {
            panic!("webdriver {method} {path}: {e}: {}", r["value"]["message"]);
        }
        r["value"].clone()
    }

    async fn try_cmd(&self, method: reqwest::Method, path: &str, body: Value) -> Option<Value> {
        let r: Value = self
            .http
            .request(method, format!("{}{path}", self.session))
            .json(&body)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        if std::env::var_os("WEBDRIVER_DEBUG").is_some() {
            eprintln!("webdriver {path}: {r}");
        }
        r["value"]["error"].is_null().then(|| r["value"].clone())
    }

    /// Open `url` (waits for the page to load).
    pub async fn goto(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    /// The current URL.
    pub async fn url(&self) -> String {
        self.cmd(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The current page's HTML.
    pub async fn source(&self) -> String {
        self.cmd(reqwest::Method::GET, "/source", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The first element matching `css`, if any.
    pub async fn try_find(&self, css: &str) -> Option<Element> {
        self.try_cmd(
            reqwest::Method::POST,
            "/element",
            json!({"using": "css selector", "value": css}),
        )
        .await
        .and_then(|v| v[ELEMENT].as_str().map(|s| Element(s.to_owned())))
    }

    /// Every element matching `css`.
    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        self.cmd(
            reqwest::Method::POST,
            "/elements",
            Some(json!({"using": "css selector", "value": css})),
        )
        .await
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v[ELEMENT].as_str().map(|s| Element(s.to_owned())))
                .collect()
        })
        .unwrap_or_default()
    }

    /// The first element matching `css`; panics (with the page) when there is none.
    pub async fn find(&self, css: &str) -> Element {
        match self.try_find(css).await {
            Some(e) => e,
            None => panic!(
                "no element {css:?} on {}:\n{}",
                self.url().await,
                self.source().await
            ),
        }
    }

    /// Click `e`.
    pub async fn click(&self, e: &Element) {
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{}/click", e.0),
            None,
        )
        .await;
    }

    /// Clear `e` and type `text` into it.
    pub async fn fill(&self, e: &Element, text: &str) {
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{}/clear", e.0),
            None,
        )
        .await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{}/value", e.0),
            Some(json!({ "text": text })),
        )
        .await;
    }

    /// The visible text of `e`.
    pub async fn text(&self, e: &Element) -> String {
        self.cmd(
            reqwest::Method::GET,
            &format!("/element/{}/text", e.0),
            None,
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
    }

    /// Run `script` (an async function body: call `arguments[arguments.length - 1]` with
    /// the result) in the page.
    pub async fn execute_async(&self, script: &str, args: Value) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/async",
            Some(json!({ "script": script, "args": args })),
        )
        .await
    }

    /// The value of cookie `name` of the current page (HttpOnly ones included).
    pub async fn cookie(&self, name: &str) -> Option<String> {
        self.cmd(reqwest::Method::GET, "/cookie", None)
            .await
            .as_array()?
            .iter()
            .find(|c| c["name"] == name)
            .and_then(|c| c["value"].as_str().map(str::to_owned))
    }

    /// Save a PNG of the viewport to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let b64 = self.cmd(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap_or_default())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }

    /// Run `script` (a function body; `return` gives the result) in the page.
    pub async fn execute(&self, script: &str, args: Value) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )
        .await
    }

    /// Save a PNG of the whole page to `path`: the window is made as tall as the page
    /// for the shot, then put back.
    pub async fn screenshot_page(&self, path: &Path) {
        let size = self
            .execute(
                "return [window.outerWidth, window.outerHeight, window.innerHeight,                  document.documentElement.scrollHeight];",
                json!([]),
            )
            .await;
        let n = |i: usize| size[i].as_f64().unwrap_or(0.0);
        let (w, outer, inner, page) = (n(0), n(1), n(2), n(3));
        let tall = (page + (outer - inner)).clamp(outer, 4_000.0);
        self.cmd(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": w, "height": tall})),
        )
        .await;
        self.screenshot(path).await;
        self.cmd(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": w, "height": outer})),
        )
        .await;
    }

    /// Wait until `check` of the page source holds (polling; fails after `secs` with the page).
    pub async fn wait_for(
        &self,
        what: &str,
        secs: u64,
        check: impl Fn(&str, &str) -> bool,
    ) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let (url, src) = (self.url().await, self.source().await);
            if check(&url, &src) {
                return src;
            }
            assert!(
                Instant::now() < deadline,
                "waited {secs} s for {what}; at {url}:\n{src}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// End the browser session and chromedriver.
    pub async fn quit(self) {
        let _ = self.http.delete(&self.session).send().await;
    }
}
