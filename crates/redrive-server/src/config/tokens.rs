//! `api_tokens` and `[[tokens]]`: who may call the API, and with which scopes.
//!
//! The scope vocabulary ([`Scope`]) is data of the configuration, like the tokens that
//! carry it; `api::auth` builds its `Tokens` from these and checks each request against
//! them.

use super::{Config, ConfigError};
use serde::{Deserialize, Serialize};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Publish messages.
    Publish,
    /// Lease, ack, nack, release, extend.
    Consume,
    /// Every `GET`: messages, queues, endpoints, bridges, groups, tasks, audit.
    Read,
    /// Operator actions (redrive, kill, delete, tasks); includes the other scopes.
    Admin,
}

impl Scope {
    /// Every scope, in the order they are documented.
    pub const ALL: [Scope; 4] = [Scope::Publish, Scope::Consume, Scope::Read, Scope::Admin];

    /// The name used in config and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Publish => "publish",
            Scope::Consume => "consume",
            Scope::Read => "read",
            Scope::Admin => "admin",
        }
    }
}

/// One `[[tokens]]` entry: a named secret with scopes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Who this is, in the audit log (`ops-alice`, `billing-service`).
    pub name: String,
    /// The bearer secret, at least 16 characters.
    pub secret: String,
    /// `publish`, `consume`, `read`, `admin` (admin includes the others).
    pub scopes: Vec<Scope>,
}

impl Config {
    /// Whether any token (`tokens` or `api_tokens`) is configured.
    pub fn has_tokens(&self) -> bool {
        !self.tokens.is_empty() || !self.api_tokens.is_empty()
    }

    /// `api_tokens` and `[[tokens]]`: lengths, names, secrets unique across both, scopes.
    pub(super) fn check_tokens(&self) -> Result<(), ConfigError> {
        if self.api_tokens.iter().any(|t| t.trim().len() < 16) {
            return Err(ConfigError::Value {
                key: "api_tokens".into(),
                reason: "every token must have at least 16 characters".into(),
            });
        }
        let mut names = std::collections::HashSet::new();
        let mut secrets: std::collections::HashSet<&str> =
            self.api_tokens.iter().map(|s| s.trim()).collect();
        for (i, t) in self.tokens.iter().enumerate() {
            let bad = |field: &str, reason: &str| {
                Err(ConfigError::Value {
                    key: format!("tokens[{i}].{field}"),
                    reason: reason.into(),
                })
            };
            let name = t.name.trim();
            if name.is_empty()
                || name.len() > 64
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
            {
                return bad(
                    "name",
                    "1 to 64 characters of letters, digits, '-', '_', '.', '@'",
                );
            }
            if !names.insert(name) {
                return bad("name", &format!("{name:?} is used by another token"));
            }
            if t.secret.trim().len() < 16 {
                return bad("secret", "must have at least 16 characters");
            }
            if !secrets.insert(t.secret.trim()) {
                return bad("secret", "is the same as another token's");
            }
            if t.scopes.is_empty() {
                return bad(
                    "scopes",
                    "give at least one of \"publish\", \"consume\", \"read\", \"admin\"",
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::load;

    #[test]
    fn tokens_are_checked_and_named() {
        let ok = load(
            "api_tokens = [\"legacy-token-000001\"]\n[[tokens]]\nname = \"ops\"\nsecret = \"ops-secret-0000001\"\nscopes = [\"read\", \"admin\"]",
            &[],
        )
        .unwrap();
        assert!(ok.has_tokens());
        assert_eq!(ok.tokens[0].name, "ops");
        assert_eq!(ok.tokens[0].scopes, [Scope::Read, Scope::Admin]);
        // What these tokens authenticate as: `api::auth`'s `tokens_of_a_config_authenticate`.
        let token = |name: &str, secret: &str, scopes: &str| {
            format!("[[tokens]]\nname = \"{name}\"\nsecret = \"{secret}\"\nscopes = {scopes}\n")
        };
        let cases = [
            (token("ops", "short", "[\"read\"]"), "tokens[0].secret"),
            (
                token("", "long-enough-secret-1", "[\"read\"]"),
                "tokens[0].name",
            ),
            (
                token("a b", "long-enough-secret-1", "[\"read\"]"),
                "tokens[0].name",
            ),
            (
                token("ops", "long-enough-secret-1", "[]"),
                "tokens[0].scopes",
            ),
            (token("ops", "long-enough-secret-1", "[\"root\"]"), "root"),
            (
                token("ops", "long-enough-secret-1", "[\"read\"]")
                    + &token("ops", "long-enough-secret-2", "[\"read\"]"),
                "tokens[1].name",
            ),
            (
                token("a", "long-enough-secret-1", "[\"read\"]")
                    + &token("b", "long-enough-secret-1", "[\"read\"]"),
                "tokens[1].secret",
            ),
        ];
        for (text, key) in cases {
            let e = load(&text, &[]).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }
}
