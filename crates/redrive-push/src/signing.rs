//! Standard Webhooks v1 signatures.
//!
//! The signed content is `{webhook-id}.{webhook-timestamp}.{body}`; the signature is
//! `v1,` followed by the base64 of its HMAC-SHA256 under the secret's key. A secret is written
//! `whsec_` + base64 of the key (the prefix may be left out). Several secrets sign at once
//! (space-separated signatures), so a receiver can move to a new secret while the old one is
//! still accepted.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The prefix of a secret's text form.
pub const SECRET_PREFIX: &str = "whsec_";

/// A signing key.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Vec<u8>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.write_str("Secret(…)")
    }
}

/// Why a secret or a signature header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SigningError {
    /// The secret is not `whsec_` + base64 (or bare base64), or its key is empty.
    #[error("a signing secret must be \"whsec_\" followed by base64 of at least 1 byte: {0}")]
    BadSecret(String),
    /// No signature in the header matches.
    #[error("no signature matches")]
    NoMatch,
    /// The timestamp is too far from now.
    #[error("the timestamp {timestamp} is more than {tolerance_s} s from now ({now})")]
    Stale {
        /// The header's timestamp, s.
        timestamp: i64,
        /// Now, s.
        now: i64,
        /// The tolerance, s.
        tolerance_s: i64,
    },
}

impl Secret {
    /// Parse `whsec_…` (or bare base64).
    pub fn parse(text: &str) -> Result<Self, SigningError> {
        let b64 = text.strip_prefix(SECRET_PREFIX).unwrap_or(text);
        let key = STANDARD
            .decode(b64)
            .map_err(|e| SigningError::BadSecret(e.to_string()))?;
        if key.is_empty() {
            return Err(SigningError::BadSecret("the key is empty".into()));
        }
        Ok(Self { key })
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> HmacSha256 {
        // An HMAC takes a key of any length: `new_from_slice` cannot fail for it.
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable_key_length());
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }

    /// The `v1,…` signature of one message under this secret.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let tag = self.mac(id, timestamp, body).finalize().into_bytes();
        format!("v1,{}", STANDARD.encode(tag))
    }
}

#[cold]
fn unreachable_key_length() -> HmacSha256 {
    // HMAC accepts every key length; reaching this is a bug in the hmac crate.
    panic!("HMAC refused a key length")
}

/// The `webhook-signature` header value: one `v1,…` per secret, space-separated.
pub fn signature_header(secrets: &[Secret], id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .map(|s| s.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Check a `webhook-signature` header as a receiver does: at least one `v1,` signature in it
/// must be the signature under `secret`, and `timestamp` must be within `tolerance_s` of `now`.
/// The comparison takes the same time whatever the bytes.
pub fn verify(
    secret: &Secret,
    header: &str,
    id: &str,
    timestamp: i64,
    body: &[u8],
    now: i64,
    tolerance_s: i64,
) -> Result<(), SigningError> {
    if (now - timestamp).abs() > tolerance_s {
        return Err(SigningError::Stale {
            timestamp,
            now,
            tolerance_s,
        });
    }
    for candidate in header.split_whitespace() {
        let Some(b64) = candidate.strip_prefix("v1,") else {
            continue;
        };
        let Ok(tag) = STANDARD.decode(b64) else {
            continue;
        };
        if secret.mac(id, timestamp, body).verify_slice(&tag).is_ok() {
            return Ok(());
        }
    }
    Err(SigningError::NoMatch)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TS: i64 = 1_614_265_330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const EXPECTED: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    /// The test vector of the Standard Webhooks specification (and of Svix's libraries):
    /// reproducing it is what says a receiver's existing library accepts our signatures.
    #[test]
    fn the_standard_webhooks_test_vector() {
        let s = Secret::parse(SECRET).unwrap();
        assert_eq!(s.sign(ID, TS, BODY), EXPECTED);
        assert_eq!(
            signature_header(std::slice::from_ref(&s), ID, TS, BODY),
            EXPECTED
        );
        verify(&s, EXPECTED, ID, TS, BODY, TS, 300).unwrap();
    }

    #[test]
    fn the_prefix_is_optional() {
        let bare = Secret::parse(SECRET.strip_prefix(SECRET_PREFIX).unwrap()).unwrap();
        assert_eq!(bare.sign(ID, TS, BODY), EXPECTED);
    }

    #[test]
    fn rotation_signs_with_every_secret_and_either_verifies() {
        let old = Secret::parse(SECRET).unwrap();
        let new = Secret::parse("whsec_c2Vjb25kLXNlY3JldC1rZXktMzItYnl0ZXMhIQ==").unwrap();
        let header = signature_header(&[new.clone(), old.clone()], ID, TS, BODY);
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[1], EXPECTED);
        verify(&old, &header, ID, TS, BODY, TS, 300).unwrap();
        verify(&new, &header, ID, TS, BODY, TS, 300).unwrap();
    }

    #[test]
    fn tampering_and_staleness_are_refused() {
        let s = Secret::parse(SECRET).unwrap();
        let other_body = br#"{"test": 2432232315}"#;
        assert_eq!(
            verify(&s, EXPECTED, ID, TS, other_body, TS, 300),
            Err(SigningError::NoMatch)
        );
        assert_eq!(
            verify(&s, EXPECTED, "msg_other", TS, BODY, TS, 300),
            Err(SigningError::NoMatch)
        );
        assert_eq!(
            verify(&s, "v2,abc v1,!!notbase64", ID, TS, BODY, TS, 300),
            Err(SigningError::NoMatch)
        );
        assert!(matches!(
            verify(&s, EXPECTED, ID, TS, BODY, TS + 301, 300),
            Err(SigningError::Stale { .. })
        ));
    }

    #[test]
    fn bad_secrets_are_named() {
        for bad in ["whsec_", "whsec_***", "", "whsec_a"] {
            assert!(
                matches!(Secret::parse(bad), Err(SigningError::BadSecret(_))),
                "{bad:?}"
            );
        }
        assert_eq!(format!("{:?}", Secret::parse(SECRET).unwrap()), "Secret(…)");
    }
}
