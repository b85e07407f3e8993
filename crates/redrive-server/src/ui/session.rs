//! Console sessions and the checks every console request passes (SPEC §12, "Auth").
//!
//! - **Sign-in.** With tokens configured, `POST /ui/login` takes a token's secret; a
//!   token without `read` (or `admin`) is refused. The session is a random 128-bit id
//!   from the OS (`getrandom`) in the cookie `redrive_session` (`HttpOnly; SameSite=Strict;
//!   Path=/ui`, plus `Secure` when the request came over TLS: redrive has no TLS of its
//!   own, so that means `X-Forwarded-Proto: https` from a proxy whose `Host` is in
//!   `allowed_hosts`). Sessions live in memory, expire after [`IDLE`] without a request,
//!   and a restart signs everyone out. Each token has at most
//!   [`MAX_SESSIONS_PER_TOKEN`]: signing in past that ends the least recently used
//!   session *of the same token*, never another token's, so a token signing in in a loop
//!   signs nobody else out (and the sessions in all are bounded by the tokens configured).
//! - **No tokens** (loopback only, see `lib.rs`): every request is `anonymous` with every
//!   scope, as on the API; no sign-in.
//! - **GET** needs a session (else 303 to `/ui/login`) whose caller can `read` (else 403).
//! - **POST** (every state change) needs, besides the session: an `Origin` header (a
//!   browser always sends one on a form post; the browser guard has already refused one
//!   that is not this server's), and a `csrf` form field equal to the session's token
//!   (with no tokens configured: a per-process random token). Then the caller must have
//!   `admin`, except to sign out. Refusals are 403 pages and change nothing.

use super::html;
use crate::api::auth::{constant_time_eq, Caller, Scope, Tokens};
use crate::api::AppState;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The session cookie's name.
pub const COOKIE: &str = "redrive_session";
/// A session ends after this long without a request.
pub const IDLE: Duration = Duration::from_secs(12 * 3600);
/// Sessions one token keeps at most (each is a few hundred bytes): enough for an
/// operator's browsers and devices, and for a team sharing a token.
pub const MAX_SESSIONS_PER_TOKEN: usize = 64;
/// Largest form body read by the CSRF check (an edited payload is the largest form).
pub const MAX_FORM_BYTES: usize = 4 * 1024 * 1024;

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

#[derive(Debug)]
struct Session {
    caller: Caller,
    csrf: String,
    last_seen: Instant,
}

/// The signed-in sessions (in memory).
#[derive(Debug)]
pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
    /// The CSRF token of every form when no tokens are configured.
    anonymous_csrf: String,
}

impl Default for Sessions {
    fn default() -> Self {
        Self::new()
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

impl Sessions {
    /// No sessions yet.
    pub fn new() -> Self {
        Sessions {
            map: Mutex::new(HashMap::new()),
            anonymous_csrf: random_token(),
        }
    }

    /// A new session for `caller`; its id (the cookie's value). When `caller`'s token
    /// already has [`MAX_SESSIONS_PER_TOKEN`], its least recently used one ends.
    pub fn create(&self, caller: Caller) -> String {
        let id = random_token();
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, s| now.duration_since(s.last_seen) < IDLE);
        let mine = map.iter().filter(|(_, s)| s.caller.name == caller.name);
        let (count, oldest) = mine.fold((0, None::<(&String, Instant)>), |(n, old), (k, s)| {
            let older = old.is_none_or(|(_, at)| s.last_seen < at);
            (n + 1, if older { Some((k, s.last_seen)) } else { old })
        });
        if let Some(k) = oldest
            .filter(|_| count >= MAX_SESSIONS_PER_TOKEN)
            .map(|(k, _)| k.clone())
        {
            map.remove(&k);
        }
        map.insert(
            id.clone(),
            Session {
                caller,
                csrf: random_token(),
                last_seen: now,
            },
        );
        id
    }

    /// The caller and CSRF token of session `id`, if it exists and has not expired (it is
    /// kept alive by this call).
    fn get(&self, id: &str) -> Option<(Caller, String)> {
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let alive = map
            .get(id)
            .is_some_and(|s| now.duration_since(s.last_seen) < IDLE);
        if !alive {
            map.remove(id);
            return None;
        }
        let s = map.get_mut(id)?;
        s.last_seen = now;
        Some((s.caller.clone(), s.csrf.clone()))
    }

    /// End session `id`.
    pub fn remove(&self, id: &str) {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
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
fn who(s: &AppState, tokens: &Tokens, headers: &HeaderMap) -> Option<Ui> {
    if tokens.is_empty() {
        return Some(Ui {
            caller: Caller::anonymous(),
            csrf: s.sessions.anonymous_csrf.clone(),
            signed_in: false,
        });
    }
    let id = session_id(headers)?;
    let (caller, csrf) = s.sessions.get(&id)?;
    Some(Ui {
        caller,
        csrf,
        signed_in: true,
    })
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
    let Some(ui) = who(&s, &s.tokens, req.headers()) else {
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

    fn caller(name: &str) -> Caller {
        Caller {
            name: name.to_owned(),
            ..Caller::anonymous()
        }
    }

    #[test]
    fn a_token_signing_in_in_a_loop_never_signs_another_token_out() {
        let s = Sessions::new();
        let admin = s.create(caller("ops-admin"));
        let first_reader = s.create(caller("ops-reader"));
        for _ in 0..10 * MAX_SESSIONS_PER_TOKEN {
            s.create(caller("ops-reader"));
        }
        assert!(s.get(&admin).is_some(), "the admin's session survives");
        assert!(s.get(&first_reader).is_none(), "the reader's oldest went");
        let map = s.map.lock().unwrap();
        let readers = map
            .values()
            .filter(|x| x.caller.name == "ops-reader")
            .count();
        assert_eq!(readers, MAX_SESSIONS_PER_TOKEN);
        assert_eq!(map.len(), MAX_SESSIONS_PER_TOKEN + 1);
    }

    #[test]
    fn sessions_expire_and_end() {
        let s = Sessions::new();
        let id = s.create(Caller::anonymous());
        assert!(s.get(&id).is_some());
        s.remove(&id);
        assert!(s.get(&id).is_none());
    }
}
