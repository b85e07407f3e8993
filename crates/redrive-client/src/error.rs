//! What can go wrong when talking to a redrive server, split by what the caller should
//! do about it: the server said no ([`Error::Api`], read its code), the server could not
//! be reached ([`Error::Unreachable`], [`Error::Timeout`]: check that it runs), or the
//! exchange broke in between ([`Error::Request`], [`Error::Interrupted`], [`Error::Decode`]).

use reqwest::{StatusCode, Url};
use serde::Deserialize;

/// Longest raw body text kept in an [`Error::Api`] whose body was not the JSON error
/// shape (a proxy's HTML page, say): 200 characters say what happened without flooding
/// a terminal.
pub const MAX_RAW_ERROR_CHARS: usize = 200;

/// A failed call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server answered with a non-2xx status. `code` and `message` are the server's
    /// `{"error": {"code", "message"}}`; when the body is not that shape (a proxy in
    /// between), `code` is `http_<status>` and `message` the start of the body.
    #[error("{code}: {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// The error's stable snake_case code (`not_found`, `lease_expired`, …).
        code: String,
        /// The error's message, for people.
        message: String,
        /// With `lease_settled` only: how the lease was settled (`acked`, `nacked`,
        /// `released`, `killed`).
        settled: Option<String>,
    },
    /// No connection could be made (refused, DNS, unreachable network). Is the server
    /// running at that address?
    #[error("cannot reach the redrive server at {url}: {cause}")]
    Unreachable {
        /// The server's root URL.
        url: String,
        /// The innermost cause (`Connection refused (os error 111)`).
        cause: String,
    },
    /// No answer in time (the connect timeout, or the request timeout).
    #[error("cannot reach the redrive server at {url}: timed out")]
    Timeout {
        /// The server's root URL.
        url: String,
    },
    /// The request failed for another reason before an answer came.
    #[error("request to {url} failed")]
    Request {
        /// The URL requested.
        url: String,
        /// What reqwest reported.
        #[source]
        source: reqwest::Error,
    },
    /// The answer's body broke off after a 2xx status (a streamed export cut short).
    #[error("the answer from {url} was interrupted")]
    Interrupted {
        /// The URL requested.
        url: String,
        /// What reqwest reported.
        #[source]
        source: reqwest::Error,
    },
    /// A 2xx answer whose body is not what API v1 says it is (another server on that port,
    /// or a client and server of different versions).
    #[error("the server's answer to {url} is not what API v1 describes")]
    Decode {
        /// The URL requested.
        url: String,
        /// Where the body differed.
        #[source]
        source: serde_json::Error,
    },
    /// The bearer token cannot be sent in a header (it has a newline or a control character).
    #[error("the bearer token is not a valid header value")]
    InvalidToken,
    /// The server URL cannot carry API paths (`mailto:`, `data:` …) or is not http(s).
    #[error("not a server URL: {0}")]
    InvalidUrl(String),
    /// The HTTP client could not be built (no TLS backend, bad system config).
    #[error("cannot build the HTTP client")]
    Build(#[source] reqwest::Error),
}

impl Error {
    /// The HTTP status of an [`Error::Api`].
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The server's error code of an [`Error::Api`].
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Whether no answer came at all ([`Error::Unreachable`] or [`Error::Timeout`]).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Error::Unreachable { .. } | Error::Timeout { .. })
    }

    /// A non-2xx answer with this body.
    pub fn from_answer(status: StatusCode, body: &[u8]) -> Self {
        #[derive(Deserialize)]
        struct Body {
            error: Detail,
        }
        #[derive(Deserialize)]
        struct Detail {
            code: String,
            #[serde(default)]
            message: Option<String>,
            #[serde(default)]
            settled: Option<String>,
        }
        if let Ok(Body { error }) = serde_json::from_slice::<Body>(body) {
            return Error::Api {
                status: status.as_u16(),
                code: error.code,
                message: error.message.unwrap_or_default(),
                settled: error.settled,
            };
        }
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        let message = if text.is_empty() {
            status.canonical_reason().unwrap_or("error").to_owned()
        } else {
            flatten_and_cut(text, MAX_RAW_ERROR_CHARS)
        };
        Error::Api {
            status: status.as_u16(),
            code: format!("http_{}", status.as_u16()),
            message,
            settled: None,
        }
    }

    /// A reqwest failure to get any answer to a request for `url`.
    pub fn from_transport(url: &Url, e: reqwest::Error) -> Self {
        if e.is_timeout() {
            return Error::Timeout { url: root(url) };
        }
        if e.is_connect() {
            // The innermost cause ("Connection refused") says the most.
            let mut cause: &dyn std::error::Error = &e;
            while let Some(inner) = cause.source() {
                cause = inner;
            }
            return Error::Unreachable {
                url: root(url),
                cause: cause.to_string(),
            };
        }
        Error::Request {
            url: url.to_string(),
            source: e,
        }
    }
}

/// The server's root URL (what a person checks when nothing answers).
fn root(url: &Url) -> String {
    let mut base = url.clone();
    base.set_path("/");
    base.set_query(None);
    base.to_string()
}

/// `s` on one line (control characters become blanks), cut to `max` characters with `…`.
fn flatten_and_cut(s: &str, max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        return flat;
    }
    let mut out: String = flat.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_json_error_is_kept_apart() {
        let e = Error::from_answer(
            StatusCode::NOT_FOUND,
            br#"{"error":{"code":"not_found","message":"no message 01J"}}"#,
        );
        assert_eq!(e.to_string(), "not_found: no message 01J");
        assert_eq!(e.status(), Some(404));
        assert_eq!(e.code(), Some("not_found"));
        assert!(!e.is_unreachable());
    }

    #[test]
    fn a_settled_lease_says_how() {
        let e = Error::from_answer(
            StatusCode::CONFLICT,
            br#"{"error":{"code":"lease_settled","message":"the lease was already settled: it was nacked","settled":"nacked"}}"#,
        );
        let Error::Api { code, settled, .. } = e else {
            panic!("not an Api error")
        };
        assert_eq!(
            (code.as_str(), settled.as_deref()),
            ("lease_settled", Some("nacked"))
        );
    }

    #[test]
    fn a_body_that_is_not_the_error_shape_is_named_by_status() {
        let e = Error::from_answer(StatusCode::BAD_GATEWAY, b"upstream\ndown");
        assert_eq!(e.to_string(), "http_502: upstream down");
        let e = Error::from_answer(StatusCode::SERVICE_UNAVAILABLE, b"");
        assert_eq!(e.to_string(), "http_503: Service Unavailable");
        let long = "x".repeat(500);
        let e = Error::from_answer(StatusCode::BAD_GATEWAY, long.as_bytes());
        let Error::Api { message, .. } = e else {
            panic!("not an Api error")
        };
        assert_eq!(message.chars().count(), MAX_RAW_ERROR_CHARS);
        assert!(message.ends_with('…'));
    }
}
