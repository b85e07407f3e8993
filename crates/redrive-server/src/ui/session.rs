//! Console sessions and the checks every console request passes (SPEC §12, "Auth").
//!
//! - **Sign-in.** With tokens configured, `POST /ui/login` takes a token's secret; a
//!   token without `read` (or `admin`) is refused. The session is a random 128-bit nonce
//!   from the OS (`getrandom`) and the token's name, in the cookie `redrive_session`
//!   (`<nonce>.<name>`; `HttpOnly; SameSite=Strict; Path=/ui`, plus `Secure` when the
//!   request came over TLS: redrive has no TLS of its own, so that means
//!   `X-Forwarded-Proto: https` from a proxy whose `Host` is in `allowed_hosts`).
//! - **In the store** ([`redrive_storage::sessions`]), so that every node of a cluster
//!   knows every session (SPEC §13: the console works behind a load balancer): signed in on
//!   one node, signed in on all; signed out on one, signed out everywhere; a restart signs
//!   nobody out. The store keeps the token's name, the CSRF token and the times under a
//!   digest of the nonce, the name and the token's secret ([`Tokens::session_digest`]): a
//!   reader of the database cannot sign in with what it reads, and a token given another
//!   secret (or removed) in the configuration ends its sessions. Scopes are the
//!   configuration's at each request. A session expires after [`IDLE`] without a request (the store's clock:
//!   the database's on PostgreSQL); a request moves its last use only when it is older than
//!   [`TOUCH_AFTER`], so most requests write nothing. Each token has at most
//!   [`MAX_SESSIONS_PER_TOKEN`]: signing in past that ends the least recently used session
//!   *of the same token*, never another token's, so a token signing in in a loop signs
//!   nobody else out (and the sessions in all are bounded by the tokens configured).
//!   Expired sessions are deleted at the next sign-in.
//! - **A store that fails** while a session is checked (a database that is down) is a 503
//!   page saying so, the cookie kept: the operator is not signed out, and the next request
//!   once the store is back is served as before.
//! - **No tokens** (loopback only, see `lib.rs`): every request is `anonymous` with every
//!   scope, as on the API; no sign-in.
//! - **GET** needs a session (else 303 to `/ui/login`) whose caller can `read` (else 403).
//! - **POST** (every state change) needs, besides the session: an `Origin` header (a
//!   browser always sends one on a form post; the browser guard has already refused one
//!   that is not this server's), and a `csrf` form field equal to the session's token
//!   (with no tokens configured: a random token created once in the store,
//!   [`Store::shared_secret`] `console.csrf`, the same on every node). Then the caller must
//!   have `admin`, except to sign out. Refusals are 403 pages and change nothing.

use super::html;
use crate::api::auth::{constant_time_eq, Caller, Scope, Tokens};
use crate::api::{ApiError, AppState};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use redrive_storage::{NewSession, SessionLookup, Store, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// The session cookie's name.
pub const COOKIE: &str = "redrive_session";
/// A session ends after this long without a request.
pub const IDLE: Duration = Duration::from_secs(12 * 3600);
/// A request moves its session's last use only when it is older than this (so that not
/// every request is a write); [`IDLE`] is counted from that last use.
pub const TOUCH_AFTER: Duration = Duration::from_secs(60);
/// Sessions one token keeps at most (each is a row of a few hundred bytes): enough for an
/// operator's browsers and devices, and for a team sharing a token.
pub const MAX_SESSIONS_PER_TOKEN: usize = 64;
/// Largest form body read by the CSRF check (an edited payload is the largest form).
pub const MAX_FORM_BYTES: usize = 4 * 1024 * 1024;
/// The name of the shared secret that is the CSRF token without tokens.
const ANONYMOUS_CSRF: &str = "console.csrf";

/// What a console handler knows about its request (in the request's extensions).
#[derive(Debug, Clone)]
pub struct Ui {
    /// Who: the session's token, or `anonymous` without tokens.
    pub caller: Caller,
    /// The CSRF token its forms carry.
    pub csrf: String,
    /// Whether tokens are configured (then there is a session to sign out of).
    pub signed_in: bool,
}

impl Ui {
    /// Whether this caller sees action buttons and may post them (`admin`).
    pub fn can_act(&self) -> bool {
        self.caller.can(Scope::Admin)
    }
}

/// The signed-in sessions, in the store (see the module's doc).
pub struct Sessions {
    store: Arc<dyn Store>,
    /// The CSRF token of every form when no tokens are configured, once read.
    anonymous_csrf: tokio::sync::OnceCell<String>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

/// 128 random bits from the OS, as 32 hex digits.
pub fn random_token() -> String {
    let mut b = [0u8; 16];
    // The OS generator failing is not something a console can work around: without it
    // session ids would be guessable, so refuse to make one.
    #[allow(clippy::expect_used)]
    getrandom::fill(&mut b).expect("the OS random number generator failed");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A cookie's value: its nonce and token name, if it has that shape.
fn parse_cookie(value: &str) -> Option<(&str, &str)> {
    let (nonce, name) = value.split_once('.')?;
    (nonce.len() == 32 && nonce.bytes().all(|b| b.is_ascii_hexdigit()) && !name.is_empty())
        .then_some((nonce, name))
}

impl Sessions {
    /// The sessions kept in `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Sessions {
            store,
            anonymous_csrf: tokio::sync::OnceCell::new(),
        }
    }

    /// A new session for `caller` (a token of `tokens`); the cookie's value. When its
    /// token already has [`MAX_SESSIONS_PER_TOKEN`], its least recently used one ends.
    pub async fn create(&self, tokens: &Tokens, caller: &Caller) -> Result<String, StoreError> {
        let nonce = random_token();
        let id = tokens
            .session_digest(&caller.name, &nonce)
            .ok_or_else(|| StoreError::Backend(format!("no token named {:?}", caller.name)))?;
        self.store
            .session_create(
                NewSession {
                    id,
                    token: caller.name.clone(),
                    csrf: random_token(),
                    max_per_token: MAX_SESSIONS_PER_TOKEN as u32,
                    idle_ms: IDLE.as_millis() as u64,
                },
                None,
            )
            .await?;
        Ok(format!("{nonce}.{}", caller.name))
    }

    /// The caller (with the scopes `tokens` give it now) and CSRF token of the session
    /// whose cookie is `cookie`, if it exists and has not expired (it is kept alive by this
    /// call); `Ok(None)` for a cookie of no live session.
    async fn get(
        &self,
        tokens: &Tokens,
        cookie: &str,
    ) -> Result<Option<(Caller, String)>, StoreError> {
        let Some((nonce, name)) = parse_cookie(cookie) else {
            return Ok(None);
        };
        let (Some(caller), Some(id)) = (tokens.by_name(name), tokens.session_digest(name, nonce))
        else {
            return Ok(None);
        };
        let found = self
            .store
            .session_get(
                SessionLookup {
                    id,
                    idle_ms: IDLE.as_millis() as u64,
                    touch_after_ms: TOUCH_AFTER.as_millis() as u64,
                },
                None,
            )
            .await?;
        Ok(found
            .filter(|s| s.token == caller.name)
            .map(|s| (caller, s.csrf)))
    }

    /// End the session whose cookie is `cookie` (on every node).
    pub async fn remove(&self, tokens: &Tokens, cookie: &str) -> Result<(), StoreError> {
        let Some(id) = parse_cookie(cookie).and_then(|(n, name)| tokens.session_digest(name, n))
        else {
            return Ok(());
        };
        self.store.session_delete(id).await.map(|_| ())
    }

    /// The CSRF token of every form without tokens: the store's, the same on every node.
    async fn anonymous_csrf(&self) -> Result<String, StoreError> {
        self.anonymous_csrf
            .get_or_try_init(|| {
                self.store
                    .shared_secret(ANONYMOUS_CSRF.to_owned(), random_token())
            })
            .await
            .cloned()
    }
}

/// The session id of a request's `Cookie` header.
pub fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_owned())
}

/// Whether the request came over TLS: `X-Forwarded-Proto: https` from a proxy whose
/// `Host` is one of `allowed_hosts` (anyone can send the header; only a configured proxy
/// name makes it believable).
pub fn over_tls(headers: &HeaderMap, allowed_hosts: &[String]) -> bool {
    let https = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"));
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::api::host_name);
    https
        && host.is_some_and(|h| {
            allowed_hosts
                .iter()
                .any(|a| a.trim().eq_ignore_ascii_case(&h))
        })
}

/// The `Set-Cookie` value of a new session.
pub fn cookie(id: &str, secure: bool) -> HeaderValue {
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/ui{secure}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("redrive_session=; Path=/ui"))
}

/// The `Set-Cookie` value that removes the session cookie.
pub fn cookie_cleared(secure: bool) -> HeaderValue {
    if secure {
        HeaderValue::from_static(
            "redrive_session=; HttpOnly; SameSite=Strict; Path=/ui; Max-Age=0; Secure",
        )
    } else {
        HeaderValue::from_static("redrive_session=; HttpOnly; SameSite=Strict; Path=/ui; Max-Age=0")
    }
}

/// A 303 to `to`.
pub fn see_other(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// The caller of a console request, if any: `anonymous` without tokens, else the session's.
async fn who(s: &AppState, tokens: &Tokens, headers: &HeaderMap) -> Result<Option<Ui>, StoreError> {
    if tokens.is_empty() {
        return Ok(Some(Ui {
            caller: Caller::anonymous(),
            csrf: s.sessions.anonymous_csrf().await?,
            signed_in: false,
        }));
    }
    let Some(id) = session_id(headers) else {
        return Ok(None);
    };
    Ok(s.sessions.get(tokens, &id).await?.map(|(caller, csrf)| Ui {
        caller,
        csrf,
        signed_in: true,
    }))
}

/// The page of a store that failed while the console checked a session or signed in or
/// out: the API's status for the error (503 while the store is unavailable), the cookie
/// left as it was.
pub fn store_failed(e: StoreError, what: &str) -> Response {
    let e = ApiError::from(e);
    html::error_page(
        e.status,
        None,
        "Storage unavailable",
        &format!("{what}: {} Try again in a moment.", e.message),
    )
}

/// The `csrf` field of a form body.
fn csrf_of(body: &[u8]) -> Option<String> {
    serde_urlencoded::from_bytes::<Vec<(String, String)>>(body)
        .ok()?
        .into_iter()
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v)
}

/// The console's middleware: find the [`Ui`] of the request and run the checks of this
/// module's doc; the sign-in page and the stylesheet are open.
pub async fn gate(s: AppState, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if path == "/ui/login" || path.starts_with("/ui/static/") {
        return next.run(req).await;
    }
    let ui = match who(&s, &s.tokens, req.headers()).await {
        Ok(ui) => ui,
        Err(e) => {
            tracing::warn!(error = %e, "console: cannot check the session");
            return store_failed(
                e,
                "The console cannot check your session now (you are still signed in); nothing was changed",
            );
        }
    };
    let Some(ui) = ui else {
        if req.method() == Method::GET || req.method() == Method::HEAD {
            let back = req
                .uri()
                .path_and_query()
                .map(|p| p.as_str().to_owned())
                .unwrap_or_default();
            return see_other(&format!(
                "/ui/login{}",
                html::query(&[("next", Some(&back))])
            ));
        }
        return html::error_page(
            StatusCode::FORBIDDEN,
            None,
            "Not signed in",
            "Your session has ended (or never began). Sign in again; nothing was changed.",
        );
    };
    if req.method() == Method::GET || req.method() == Method::HEAD {
        if !ui.caller.can(Scope::Read) {
            return html::error_page(
                StatusCode::FORBIDDEN,
                Some(&ui),
                "Not allowed",
                "This token has no read scope: the console needs read (to look) or admin (to act).",
            );
        }
        let mut req = req;
        req.extensions_mut().insert(ui);
        return next.run(req).await;
    }
    // A state change.
    if !req.headers().contains_key(header::ORIGIN) {
        return html::error_page(
            StatusCode::FORBIDDEN,
            Some(&ui),
            "Refused",
            "A console form must come from a browser page of this server (no Origin header). Nothing was changed.",
        );
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_FORM_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return html::error_page(
                StatusCode::PAYLOAD_TOO_LARGE,
                Some(&ui),
                "Too large",
                "The form is larger than the console accepts. Nothing was changed.",
            )
        }
    };
    if !csrf_of(&bytes).is_some_and(|t| constant_time_eq(t.as_bytes(), ui.csrf.as_bytes())) {
        return html::error_page(
            StatusCode::FORBIDDEN,
            Some(&ui),
            "Refused",
            "The form's CSRF token is missing or does not belong to this session (an old tab, or a page elsewhere posting here). Nothing was changed.",
        );
    }
    if parts.uri.path() != "/ui/logout" && !ui.can_act() {
        return html::error_page(
            StatusCode::FORBIDDEN,
            Some(&ui),
            "Not allowed",
            &format!(
                "Token {:?} has scopes [{}]; operator actions need admin. Nothing was changed.",
                ui.caller.name,
                ui.caller.scopes.names().join(", ")
            ),
        );
    }
    let mut req = Request::from_parts(parts, Body::from(bytes));
    req.extensions_mut().insert(ui);
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_hex() {
        let a = random_token();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, random_token());
    }

    #[test]
    fn cookie_and_tls() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; redrive_session=abc; b=2"),
        );
        assert_eq!(session_id(&h).as_deref(), Some("abc"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        h.insert(
            header::HOST,
            HeaderValue::from_static("redrive.example:443"),
        );
        assert!(over_tls(&h, &["redrive.example".to_owned()]));
        assert!(!over_tls(&h, &[]));
        assert!(cookie("x", true).to_str().unwrap().ends_with("; Secure"));
        assert_eq!(csrf_of(b"a=1&csrf=t%2B1").as_deref(), Some("t+1"));
        assert!(
            constant_time_eq(b"abc", b"abc")
                && !constant_time_eq(b"abc", b"abd")
                && !constant_time_eq(b"abc", b"ab")
        );
    }

    /// A store in a fresh directory, and tokens `names` (each with scope `read`).
    async fn open(names: &[&str]) -> (Sessions, Arc<dyn Store>, Tokens, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::Config {
            data_dir: dir.path().to_owned(),
            tokens: names
                .iter()
                .map(|n| crate::config::TokenConfig {
                    name: (*n).to_owned(),
                    secret: format!("{n}-secret-0123456789"),
                    scopes: vec![Scope::Read],
                })
                .collect(),
            ..crate::Config::default()
        };
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let store = crate::storage::open_store(&config, &metrics)
            .await
            .unwrap()
            .store;
        let tokens = Tokens::from_config(&config);
        (Sessions::new(store.clone()), store, tokens, dir)
    }

    fn caller(tokens: &Tokens, name: &str) -> Caller {
        tokens.by_name(name).unwrap()
    }

    #[tokio::test]
    async fn a_token_signing_in_in_a_loop_never_signs_another_token_out() {
        let (s, store, t, _dir) = open(&["ops-admin", "ops-reader"]).await;
        let admin = s.create(&t, &caller(&t, "ops-admin")).await.unwrap();
        let first_reader = s.create(&t, &caller(&t, "ops-reader")).await.unwrap();
        let mut readers = Vec::new();
        for _ in 0..2 * MAX_SESSIONS_PER_TOKEN {
            readers.push(s.create(&t, &caller(&t, "ops-reader")).await.unwrap());
        }
        assert!(
            s.get(&t, &admin).await.unwrap().is_some(),
            "the admin's session survives"
        );
        assert!(
            s.get(&t, &first_reader).await.unwrap().is_none(),
            "the reader's oldest went"
        );
        let mut alive = 0;
        for r in &readers {
            alive += usize::from(s.get(&t, r).await.unwrap().is_some());
        }
        assert_eq!(alive, MAX_SESSIONS_PER_TOKEN);
        store.close().await;
    }

    #[tokio::test]
    async fn sessions_expire_and_end() {
        let (s, store, t, _dir) = open(&["ops"]).await;
        let id = s.create(&t, &caller(&t, "ops")).await.unwrap();
        let (who, csrf) = s.get(&t, &id).await.unwrap().expect("signed in");
        assert_eq!(who.name, "ops");
        assert_eq!(csrf.len(), 32);
        // Not under the cookie: the store keeps a digest of it, never the nonce.
        let (nonce, _) = parse_cookie(&id).unwrap();
        let lookup = |key: String| SessionLookup {
            id: key,
            idle_ms: IDLE.as_millis() as u64,
            touch_after_ms: TOUCH_AFTER.as_millis() as u64,
        };
        assert!(store
            .session_get(lookup(nonce.to_owned()), None)
            .await
            .unwrap()
            .is_none());
        assert!(store
            .session_get(lookup(t.session_digest("ops", nonce).unwrap()), None)
            .await
            .unwrap()
            .is_some());
        // Expired after IDLE without a request.
        let later = redrive_core::Timestamp::now().as_millis() + IDLE.as_millis() as i64 + 1;
        assert!(store
            .session_get(
                lookup(t.session_digest("ops", nonce).unwrap()),
                Some(redrive_core::Timestamp::from_millis(later))
            )
            .await
            .unwrap()
            .is_none());
        // A forged cookie: another nonce, a name not configured, garbage.
        let other = format!("{}.ops", random_token());
        for bad in [other.as_str(), &id.replace(".ops", ".nobody"), "x", ""] {
            assert!(s.get(&t, bad).await.unwrap().is_none(), "{bad}");
        }
        s.remove(&t, &id).await.unwrap();
        assert!(s.get(&t, &id).await.unwrap().is_none());
        s.remove(&t, "garbage").await.unwrap();
        store.close().await;
    }

    #[tokio::test]
    async fn another_secret_for_the_token_ends_its_sessions() {
        let (s, store, t, _dir) = open(&["ops"]).await;
        let id = s.create(&t, &caller(&t, "ops")).await.unwrap();
        let rotated = Tokens::from_config(&crate::Config {
            tokens: vec![crate::config::TokenConfig {
                name: "ops".to_owned(),
                secret: "a-new-secret-0123456789".to_owned(),
                scopes: vec![Scope::Read],
            }],
            ..crate::Config::default()
        });
        assert!(s.get(&rotated, &id).await.unwrap().is_none());
        assert!(s.get(&t, &id).await.unwrap().is_some());
        store.close().await;
    }

    #[tokio::test]
    async fn the_anonymous_csrf_token_is_the_store_s() {
        let (s, store, _t, _dir) = open(&[]).await;
        let a = s.anonymous_csrf().await.unwrap();
        let again = Sessions::new(store.clone()).anonymous_csrf().await.unwrap();
        assert_eq!(a, again, "another process of the store reads the same");
        assert_eq!(a.len(), 32);
        store.close().await;
    }
}
