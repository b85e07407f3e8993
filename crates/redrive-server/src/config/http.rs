//! Where and to whom the server listens: `listen` (and the refusal of a non-loopback address
//! without any token, unless `dangerous_allow_unauthenticated_public_listen`), and the
//! browser guard's allow-lists `allowed_hosts` and `allowed_origins`. These are top-level
//! keys of [`Config`].

use super::{Config, ConfigError};

impl Config {
    /// Whether the listen address is loopback.
    pub fn listens_on_loopback(&self) -> bool {
        self.listen.ip().is_loopback()
    }

    /// Whether the server must refuse to listen: a non-loopback `listen` without any token
    /// (`tokens` or `api_tokens`), and `dangerous_allow_unauthenticated_public_listen` not set.
    pub fn is_unauthenticated_public_listen(&self) -> bool {
        !self.listens_on_loopback()
            && !self.has_tokens()
            && !self.dangerous_allow_unauthenticated_public_listen
    }

    /// `allowed_hosts` and `allowed_origins`, checked (the error names the key).
    pub(super) fn check_browser_guard(&self) -> Result<(), ConfigError> {
        let val = |key: &str, reason: &str| {
            Err(ConfigError::Value {
                key: key.into(),
                reason: reason.into(),
            })
        };
        if self
            .allowed_hosts
            .iter()
            .any(|h| h.trim().is_empty() || h.contains([':', '/', '[']))
        {
            return val(
                "allowed_hosts",
                "each entry is a host name without scheme or port, e.g. \"redrive.internal\"",
            );
        }
        if self.allowed_origins.iter().any(|o| {
            let o = o.trim().trim_end_matches('/');
            !(o.starts_with("http://") || o.starts_with("https://")) || o.matches('/').count() != 2
        }) {
            return val(
                "allowed_origins",
                "each entry is scheme://host[:port], e.g. \"https://console.example.com\"",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::load;

    #[test]
    fn browser_allow_lists_are_checked_and_read_from_the_environment() {
        let c = load(
            "",
            &[
                ("REDRIVE_ALLOWED_HOSTS", "a.internal, b.internal"),
                ("REDRIVE_ALLOWED_ORIGINS", "https://console.example.com"),
            ],
        )
        .unwrap();
        assert_eq!(c.allowed_hosts, ["a.internal", "b.internal"]);
        assert_eq!(c.allowed_origins, ["https://console.example.com"]);
        for (text, key) in [
            ("allowed_hosts = [\"a.internal:80\"]", "allowed_hosts"),
            ("allowed_hosts = [\"\"]", "allowed_hosts"),
            (
                "allowed_origins = [\"console.example.com\"]",
                "allowed_origins",
            ),
            ("allowed_origins = [\"https://x/y\"]", "allowed_origins"),
        ] {
            let e = load(text, &[]).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }

    #[test]
    fn a_public_listen_needs_a_token_or_the_dangerous_switch() {
        let refused = |text: &str| load(text, &[]).unwrap().is_unauthenticated_public_listen();
        let public = "listen = \"0.0.0.0:7070\"\n";
        assert!(!refused(""));
        assert!(refused(public));
        assert!(!refused(&format!(
            "{public}api_tokens = [\"legacy-token-000001\"]"
        )));
        assert!(!refused(&format!(
            "{public}dangerous_allow_unauthenticated_public_listen = true"
        )));
    }
}
