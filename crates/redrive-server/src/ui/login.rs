//! `GET/POST /ui/login` and `POST /ui/logout` (see `session.rs` for what a session is): a
//! sign-out on any node ends the session on every node.

use super::html::{self, esc};
use super::session::{self, Ui};
use crate::api::auth::Scope;
use crate::api::AppState;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;

/// The sign-in form's fields (and the page's `next`).
#[derive(Debug, Default, Deserialize)]
pub struct LoginForm {
    token: Option<String>,
    next: Option<String>,
}

/// Where to go after signing in: a console path, never elsewhere (no open redirect).
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if (n == "/ui" || n.starts_with("/ui/") || n.starts_with("/ui?"))
                && !n.contains("//")
                && !n.contains('\\')
                && n.chars().all(|c| !c.is_control()) =>
        {
            n.to_owned()
        }
        _ => "/ui".to_owned(),
    }
}

fn login_page(status: StatusCode, error: Option<&str>, next: &str) -> Response {
    let body = format!(
        "<div class=\"login card\"><h1>Sign in</h1>{}<form method=\"post\" action=\"/ui/login\">\
         <input type=\"hidden\" name=\"next\" value=\"{}\">\
         <label>Token<input type=\"password\" name=\"token\" id=\"token\" autocomplete=\"current-password\" autofocus></label>\
         <button id=\"sign-in\">Sign in</button></form>\
         <p class=\"muted\">Use the secret of a <code>[[tokens]]</code> entry with the <code>read</code> scope (to look) \
         or <code>admin</code> (to act), or one of <code>api_tokens</code>.</p></div>",
        error.map(|e| html::notice("error", e)).unwrap_or_default(),
        esc(next)
    );
    html::page(status, None, "", "Sign in", &body)
}

/// `GET /ui/login`.
pub async fn form(
    State(s): State<AppState>,
    q: Result<Query<LoginForm>, QueryRejection>,
) -> Response {
    let next = safe_next(q.as_ref().ok().and_then(|Query(f)| f.next.as_deref()));
    if s.tokens.is_empty() {
        return session::see_other(&next);
    }
    login_page(StatusCode::OK, None, &next)
}

/// `POST /ui/login`: check the token, open a session, go to `next`.
pub async fn sign_in(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let f: LoginForm = serde_urlencoded::from_bytes(&body).unwrap_or_default();
    let next = safe_next(f.next.as_deref());
    if s.tokens.is_empty() {
        return session::see_other(&next);
    }
    let Some(caller) = f.token.as_deref().and_then(|t| s.tokens.authenticate(t)) else {
        tracing::info!("console sign-in refused: unknown token");
        return login_page(
            StatusCode::UNAUTHORIZED,
            Some("That token is not valid."),
            &next,
        );
    };
    if !caller.can(Scope::Read) {
        return login_page(
            StatusCode::FORBIDDEN,
            Some(&format!(
                "Token {:?} has scopes [{}]: the console needs read (to look) or admin (to act).",
                caller.name,
                caller.scopes.names().join(", ")
            )),
            &next,
        );
    }
    let id = match s.sessions.create(&s.tokens, &caller).await {
        Ok(id) => id,
        Err(e) => {
            tracing::warn!(token = %caller.name, error = %e, "console sign-in failed: the store");
            let e = crate::api::ApiError::from(e);
            return login_page(
                e.status,
                Some(&format!(
                    "Cannot sign in now: {} Try again in a moment.",
                    e.message
                )),
                &next,
            );
        }
    };
    tracing::info!(token = %caller.name, "console sign-in");
    let secure = session::over_tls(&headers, &s.config.allowed_hosts);
    let mut r = session::see_other(&next);
    r.headers_mut()
        .insert(header::SET_COOKIE, session::cookie(&id, secure));
    r
}

/// `POST /ui/logout`.
pub async fn sign_out(
    State(s): State<AppState>,
    Extension(_ui): Extension<Ui>,
    headers: HeaderMap,
) -> Response {
    if let Some(id) = session::session_id(&headers) {
        if let Err(e) = s.sessions.remove(&s.tokens, &id).await {
            // Not signed out: say so, and leave the cookie (its session still stands).
            tracing::warn!(error = %e, "console sign-out failed: the store");
            return session::store_failed(e, "Not signed out");
        }
    }
    let secure = session::over_tls(&headers, &s.config.allowed_hosts);
    let mut r = session::see_other("/ui/login");
    r.headers_mut()
        .insert(header::SET_COOKIE, session::cookie_cleared(secure));
    r
}

#[cfg(test)]
mod tests {
    use super::safe_next;

    #[test]
    fn next_stays_in_the_console() {
        assert_eq!(safe_next(Some("/ui/messages?q=a")), "/ui/messages?q=a");
        for bad in [
            "https://evil.example",
            "//evil.example",
            "/ui//evil",
            "/uix",
            "/v1/messages",
            "/ui\\x",
        ] {
            assert_eq!(safe_next(Some(bad)), "/ui", "{bad}");
        }
        assert_eq!(safe_next(None), "/ui");
    }
}
