//! Who is calling, and what they may do (SPEC §12, "Auth").
//!
//! Tokens come from `[[tokens]]` (`name`, `secret`, `scopes`) and from the older
//! `api_tokens` list, whose entries are admin tokens named `api_tokens[i]`. A request to
//! `/v1/*` carries `Authorization: Bearer <secret>`; the console signs in with the same
//! secret and keeps a session cookie instead (see `ui/session.rs`). Either way the request
//! gets a [`Caller`] in its extensions: handlers read it for the audit log.
//!
//! Every route needs one scope, given by [`required_scope`]: `publish` to publish,
//! `consume` to lease, ack, nack, release and extend, `read` for every `GET`, `admin` for operator
//! actions (redrive, kill, delete, tasks). `admin` includes the other three. With no token
//! configured at all (loopback only, see `lib.rs`), every caller is `anonymous` with every
//! scope, as before.

use super::ApiError;
use axum::extract::{MatchedPath, Request};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

pub use crate::config::Scope;

/// The bit of `scope` in a [`Scopes`] set.
fn bit(scope: Scope) -> u8 {
    1 << (scope as u8)
}

/// A set of scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scopes(u8);

impl Scopes {
    /// Every scope.
    pub fn all() -> Self {
        Scope::ALL.into_iter().collect()
    }

    /// Whether `scope` is allowed: it is in the set, or the set has `admin`.
    pub fn allows(self, scope: Scope) -> bool {
        self.0 & (bit(scope) | bit(Scope::Admin)) != 0
    }

    /// The scopes in the set, as their names.
    pub fn names(self) -> Vec<&'static str> {
        Scope::ALL
            .into_iter()
            .filter(|s| self.0 & bit(*s) != 0)
            .map(Scope::as_str)
            .collect()
    }
}

impl FromIterator<Scope> for Scopes {
    fn from_iter<I: IntoIterator<Item = Scope>>(iter: I) -> Self {
        Scopes(iter.into_iter().fold(0, |acc, s| acc | bit(s)))
    }
}

/// Who made a request: the token's name and its scopes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's `name` (`api_tokens[0]` for the old list; `anonymous` without tokens).
    pub name: String,
    /// What it may do.
    pub scopes: Scopes,
}

impl Caller {
    /// The caller when no token is configured: every scope.
    pub fn anonymous() -> Self {
        Caller {
            name: "anonymous".to_owned(),
            scopes: Scopes::all(),
        }
    }

    /// Whether this caller may do what `scope` allows.
    pub fn can(&self, scope: Scope) -> bool {
        self.scopes.allows(scope)
    }
}

/// The configured tokens, checked in constant time.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    entries: Vec<(String, String, Scopes)>,
}

impl Tokens {
    /// The tokens of `config`: `[[tokens]]`, then `api_tokens` as admin tokens.
    pub fn from_config(config: &crate::Config) -> Self {
        let mut entries: Vec<(String, String, Scopes)> = config
            .tokens
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    t.secret.trim().to_owned(),
                    t.scopes.iter().copied().collect(),
                )
            })
            .collect();
        entries.extend(config.api_tokens.iter().enumerate().map(|(i, secret)| {
            (
                format!("api_tokens[{i}]"),
                secret.trim().to_owned(),
                Scopes::all(),
            )
        }));
        Tokens { entries }
    }

    /// Whether no token is configured (then every caller is [`Caller::anonymous`]).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The caller whose secret is `secret`, if any. Every entry is compared, in constant
    /// time, whatever matches.
    pub fn authenticate(&self, secret: &str) -> Option<Caller> {
        let secret = secret.trim();
        let mut found = None;
        for (name, s, scopes) in &self.entries {
            if constant_time_eq(s.as_bytes(), secret.as_bytes()) && found.is_none() {
                found = Some(Caller {
                    name: name.clone(),
                    scopes: *scopes,
                });
            }
        }
        found
    }

    /// The caller named `name`, if such a token is configured.
    pub fn by_name(&self, name: &str) -> Option<Caller> {
        self.entries
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(name, _, scopes)| Caller {
                name: name.clone(),
                scopes: *scopes,
            })
    }

    /// The key a console session of token `name` with the cookie secret `nonce` is stored
    /// under: the SHA-256 (hex) of both and of the token's secret. A reader of the database
    /// can neither sign in with it (it does not have the nonce) nor test guesses of the
    /// token's secret against it, and once the configuration gives the token another secret
    /// its old sessions are found no more, on every node. `None` for a name not configured.
    pub fn session_digest(&self, name: &str, nonce: &str) -> Option<String> {
        use sha2::Digest as _;
        let (_, secret, _) = self.entries.iter().find(|(n, _, _)| n == name)?;
        let mut h = sha2::Sha256::new();
        for part in [
            b"redrive-console-session".as_slice(),
            name.as_bytes(),
            nonce.as_bytes(),
            secret.as_bytes(),
        ] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part);
        }
        Some(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
    }

    /// The caller of a request from its `Authorization: Bearer` header; `None` when the
    /// header is absent, wrong, or not a bearer token.
    pub fn from_bearer(&self, headers: &axum::http::HeaderMap) -> Option<Caller> {
        headers
            .get(header::AUTHORIZATION)?
            .to_str()
            .ok()?
            .strip_prefix("Bearer ")
            .and_then(|t| self.authenticate(t))
    }
}

/// Equal, compared in constant time (every byte, whatever differs first).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The scope a `/v1` route needs, from its method and its route pattern (as axum's
/// [`MatchedPath`] gives it). A route not listed needs `admin`.
pub fn required_scope(method: &Method, route: &str) -> Scope {
    match (method.as_str(), route) {
        ("POST", "/v1/queues/{queue}/messages") => Scope::Publish,
        ("POST", "/v1/queues/{queue}/leases")
        | ("POST", "/v1/messages/{id}/ack")
        | ("POST", "/v1/messages/{id}/nack")
        | ("POST", "/v1/messages/{id}/release")
        | ("POST", "/v1/messages/{id}/extend")
        | ("POST", "/v1/messages/ack")
        | ("POST", "/v1/messages/nack") => Scope::Consume,
        ("GET", _) | ("HEAD", _) => Scope::Read,
        _ => Scope::Admin,
    }
}

/// The `/v1` middleware: find the caller, check the route's scope, and hand the
/// [`Caller`] to the handler in the request's extensions.
pub async fn authorize(tokens: Arc<Tokens>, mut req: Request, next: Next) -> Response {
    let caller = if tokens.is_empty() {
        Caller::anonymous()
    } else {
        match tokens.from_bearer(req.headers()) {
            Some(c) => c,
            None => return unauthorized(),
        }
    };
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let needed = required_scope(req.method(), &route);
    if !caller.can(needed) {
        return forbidden(&caller, needed);
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// 401 with `WWW-Authenticate: Bearer`.
pub fn unauthorized() -> Response {
    let mut r = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "missing or wrong bearer token",
    )
    .into_response();
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// 403 naming the scope that is missing.
pub fn forbidden(caller: &Caller, needed: Scope) -> Response {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "token {:?} has scopes [{}]; this needs {:?}",
            caller.name,
            caller.scopes.names().join(", "),
            needed.as_str()
        ),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_allows_everything_and_read_only_reads() {
        let admin: Scopes = [Scope::Admin].into_iter().collect();
        let read: Scopes = [Scope::Read].into_iter().collect();
        for s in Scope::ALL {
            assert!(admin.allows(s));
            assert_eq!(read.allows(s), s == Scope::Read);
        }
        assert_eq!(
            [Scope::Publish, Scope::Consume]
                .into_iter()
                .collect::<Scopes>()
                .names(),
            ["publish", "consume"]
        );
    }

    /// A config's `[[tokens]]` and `api_tokens` authenticate by their secret, named, with their
    /// scopes (`api_tokens` as admin).
    #[test]
    fn tokens_of_a_config_authenticate() {
        let config = crate::Config {
            api_tokens: vec!["legacy-token-000001".to_owned()],
            tokens: vec![crate::config::TokenConfig {
                name: "ops".to_owned(),
                secret: "ops-secret-0000001".to_owned(),
                scopes: vec![Scope::Read, Scope::Admin],
            }],
            ..crate::Config::default()
        };
        config.validate().unwrap();
        let tokens = Tokens::from_config(&config);
        let ops = tokens.authenticate("ops-secret-0000001").unwrap();
        assert_eq!(ops.name, "ops");
        assert!(ops.can(Scope::Publish), "admin includes publish");
        let legacy = tokens.authenticate("legacy-token-000001").unwrap();
        assert_eq!(legacy.name, "api_tokens[0]");
        assert!(tokens.authenticate("nope-nope-nope-nope").is_none());
    }

    #[test]
    fn routes_map_to_scopes() {
        let post = Method::POST;
        assert_eq!(
            required_scope(&post, "/v1/queues/{queue}/messages"),
            Scope::Publish
        );
        assert_eq!(
            required_scope(&post, "/v1/queues/{queue}/leases"),
            Scope::Consume
        );
        assert_eq!(
            required_scope(&post, "/v1/messages/{id}/release"),
            Scope::Consume
        );
        assert_eq!(
            required_scope(&Method::GET, "/v1/messages/{id}"),
            Scope::Read
        );
        assert_eq!(
            required_scope(&post, "/v1/messages/{id}/redrive"),
            Scope::Admin
        );
        assert_eq!(
            required_scope(&Method::DELETE, "/v1/messages/{id}"),
            Scope::Admin
        );
        assert_eq!(required_scope(&post, "/v1/unknown"), Scope::Admin);
    }
}
