//! The browser guard: a web page the operator happens to visit must not be able to drive
//! a redrive that listens on their machine (issue 5, defect 4).
//!
//! A browser lets any page send "simple" cross-site requests without asking the server
//! first (a `POST` with `text/plain`, form-urlencoded or multipart body, a `GET`), and a
//! page that rebinds its own DNS name to 127.0.0.1 can even read the answers. Three checks,
//! run on every route before anything else, close those doors; each refusal is a JSON error
//! and nothing reaches the store:
//!
//! 1. **Host** (DNS rebinding). When the server listens on a loopback address, the `Host`
//!    header must name a loopback host — `localhost`, an address in 127.0.0.0/8 or `[::1]`,
//!    any port — or one of `allowed_hosts` (for a reverse proxy). Otherwise 403
//!    `host_not_allowed`. On a non-loopback listen address (which needs `api_tokens`) the
//!    check runs only when `allowed_hosts` is set.
//! 2. **Cross-site** (CSRF). A request whose `Origin` is not the server's own (the same
//!    `host:port` as its `Host`) nor one of `allowed_origins`, or whose `Sec-Fetch-Site` is
//!    anything but `same-origin` or `none` (so `same-site` too: a page on `localhost:3000`
//!    is "same-site" with `localhost:7070`), is refused with 403 `cross_origin`, unless its
//!    `Origin` is in `allowed_origins`. GETs included: a cross-site navigation to an export
//!    is refused as well. One exception: a top-level navigation (`Sec-Fetch-Mode: navigate`,
//!    `GET`) to a console page (`/ui…`), so that a link in an alert opens the console; the
//!    other site cannot read the page, and the session cookie (SameSite=Strict) does not
//!    come with it. Non-browser clients (curl, the CLI, the bench) send neither header.
//! 3. **JSON only** (no "simple" bodies). A request other than `GET`/`HEAD` that carries a
//!    `Content-Type` must say `application/json` (or `application/<something>+json`, any
//!    parameters such as `charset`), and a body without a `Content-Type` is refused too:
//!    415 `unsupported_media_type`. A body-less request without a `Content-Type` is
//!    accepted (`curl -X POST …/redrive`, a lease with no body): a browser cannot send one
//!    cross-site without the `Origin` and `Sec-Fetch-Site` that check 2 refuses.
//!    The console's forms (`/ui/…`) are the one exception: they post
//!    `application/x-www-form-urlencoded`, and each carries a CSRF token bound to the
//!    session and must come with this server's own `Origin` (`ui/session.rs`); checks 1
//!    and 2 still run on them first.

use super::ApiError;
use axum::body::HttpBody as _;
use axum::extract::Request;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::IpAddr;
use std::sync::Arc;

/// What the guard allows, from the configuration (built once, shared by every request).
#[derive(Debug, Clone)]
pub struct BrowserGuard {
    /// Whether the `Host` check runs (listening on loopback, or `allowed_hosts` set).
    check_host: bool,
    /// `allowed_hosts`, lower-cased, without ports.
    allowed_hosts: Vec<String>,
    /// `allowed_origins`, lower-cased, without a trailing `/`.
    allowed_origins: Vec<String>,
}

impl BrowserGuard {
    /// The guard for a server listening on loopback (`loopback`) with these allow-lists.
    pub fn new(loopback: bool, allowed_hosts: &[String], allowed_origins: &[String]) -> Self {
        Self {
            check_host: loopback || !allowed_hosts.is_empty(),
            allowed_hosts: allowed_hosts
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .collect(),
            allowed_origins: allowed_origins
                .iter()
                .map(|o| normalize_origin(o))
                .collect(),
        }
    }

    /// Run the three checks; `Err` is the answer to send instead of running the route.
    pub fn check(&self, req: &Request) -> Result<(), ApiError> {
        let headers = req.headers();
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()));
        if self.check_host {
            if let Some(host) = &host {
                if !self.host_allowed(host) {
                    return Err(ApiError::new(
                        StatusCode::FORBIDDEN,
                        "host_not_allowed",
                        format!(
                            "Host {host:?} is not a loopback name or address, nor in \
                             allowed_hosts (a page rebinding its DNS name to this server?)"
                        ),
                    ));
                }
            }
        }
        let path = req.uri().path();
        let read = req.method() == Method::GET || req.method() == Method::HEAD;
        // A link to a console page followed from another site (an alert in a chat): a
        // top-level navigation, which the other site cannot read, and which arrives without
        // the SameSite=Strict session cookie (so, with tokens, it lands on the sign-in page).
        let navigation = read
            && (path == "/ui" || path.starts_with("/ui/"))
            && headers
                .get("sec-fetch-mode")
                .is_some_and(|m| m.as_bytes() == b"navigate");
        self.check_origin(headers, host.as_deref(), navigation)?;
        let console = path.starts_with("/ui/");
        if req.method() != Method::GET && req.method() != Method::HEAD && !console {
            check_content_type(req)?;
        }
        Ok(())
    }

    fn host_allowed(&self, host: &str) -> bool {
        let Some(name) = host_name(host) else {
            return false;
        };
        is_loopback_name(&name) || self.allowed_hosts.contains(&name)
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        self.allowed_origins.iter().any(|o| o == origin)
    }

    fn check_origin(
        &self,
        headers: &HeaderMap,
        host: Option<&str>,
        navigation: bool,
    ) -> Result<(), ApiError> {
        let origin = headers
            .get(header::ORIGIN)
            .map(|v| normalize_origin(v.to_str().unwrap_or("null")));
        let listed = origin.as_deref().is_some_and(|o| self.origin_allowed(o));
        if let Some(o) = &origin {
            let own = host.is_some_and(|h| {
                o.split_once("://")
                    .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(h))
            });
            if !own && !listed {
                return Err(cross_origin(format!(
                    "Origin {o:?} is not this server nor in allowed_origins"
                )));
            }
        }
        if let Some(site) = headers.get("sec-fetch-site") {
            let site = site.to_str().unwrap_or("");
            if !matches!(site, "same-origin" | "none") && !listed && !navigation {
                return Err(cross_origin(format!(
                    "Sec-Fetch-Site {site:?}: only same-origin requests (or an Origin in \
                     allowed_origins) are accepted from a browser"
                )));
            }
        }
        Ok(())
    }
}

/// The middleware: refuse what [`BrowserGuard::check`] refuses, else run the route.
pub async fn guard(guard: Arc<BrowserGuard>, req: Request, next: Next) -> Response {
    match guard.check(&req) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

fn cross_origin(message: String) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "cross_origin", message)
}

/// 415 unless the request's body, if any, is declared JSON.
fn check_content_type(req: &Request) -> Result<(), ApiError> {
    match req.headers().get(header::CONTENT_TYPE) {
        Some(v) => {
            let raw = v.to_str().unwrap_or("");
            if is_json_media_type(raw) {
                Ok(())
            } else {
                Err(unsupported(format!(
                    "Content-Type {raw:?}: request bodies must be application/json"
                )))
            }
        }
        None => {
            let declared = req
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            let has_body = match declared {
                Some(n) => n > 0,
                None => !req.body().is_end_stream(),
            };
            if has_body {
                Err(unsupported(
                    "a request body needs Content-Type: application/json".to_owned(),
                ))
            } else {
                Ok(())
            }
        }
    }
}

fn unsupported(message: String) -> ApiError {
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        message,
    )
}

/// `application/json` or `application/<anything>+json`, with any parameters.
pub fn is_json_media_type(raw: &str) -> bool {
    let essence = raw.split(';').next().unwrap_or("").trim();
    let Some((kind, sub)) = essence.split_once('/') else {
        return false;
    };
    kind.eq_ignore_ascii_case("application")
        && (sub.eq_ignore_ascii_case("json")
            || (sub.len() > 5 && sub[sub.len() - 5..].eq_ignore_ascii_case("+json")))
}

/// The host part of a `Host` value (`name`, `name:port`, `[v6]`, `[v6]:port`), lower-cased;
/// `None` if it is not of that form.
pub(crate) fn host_name(host: &str) -> Option<String> {
    let host = host.trim();
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        (
            inside,
            after.strip_prefix(':').or(after.is_empty().then_some("")),
        )
    } else {
        match host.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (host, Some("")),
        }
    };
    let port = port?;
    if !port.chars().all(|c| c.is_ascii_digit()) || name.is_empty() {
        return None;
    }
    Some(name.to_ascii_lowercase())
}

/// `localhost`, an address in 127.0.0.0/8, or `::1`.
fn is_loopback_name(name: &str) -> bool {
    name == "localhost" || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn normalize_origin(o: &str) -> String {
    o.trim().trim_end_matches('/').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_media_types() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/merge-patch+json",
            "application/vnd.redrive+json;v=1",
        ] {
            assert!(is_json_media_type(ok), "{ok}");
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "text/json",
            "application/+json",
            "",
        ] {
            assert!(!is_json_media_type(bad), "{bad}");
        }
    }

    #[test]
    fn loopback_hosts() {
        let g = BrowserGuard::new(true, &["redrive.internal".to_owned()], &[]);
        for ok in [
            "localhost",
            "localhost:7070",
            "LOCALHOST:1",
            "127.0.0.1",
            "127.8.9.10:7070",
            "[::1]",
            "[::1]:7070",
            "redrive.internal:443",
        ] {
            assert!(g.host_allowed(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:7070",
            "localhost.evil.example",
            "128.0.0.1:7070",
            "0.0.0.0:7070",
            "[::2]:7070",
            "[::1",
            "localhost:x",
            "",
        ] {
            assert!(!g.host_allowed(bad), "{bad}");
        }
    }
}
