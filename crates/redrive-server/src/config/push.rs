//! Push delivery (SPEC §10): `[push]` (server-wide: the SSRF guard's `allow_cidrs`) and each
//! push queue's `[queues.NAME.push]` with its `[[queues.NAME.push.rules]]`, checked and
//! translated into the engine's `PushConfig`.

use super::{Config, ConfigError, Delivery};
use crate::engine::push::{PushConfig, PushSettings};
use redrive_core::DurationMs;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A push queue's `connect_timeout` when the config leaves it out, unless its `timeout` is
/// shorter (then `timeout`).
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 5_000;

/// `[queues.NAME.push]`: where and how redrive pushes a queue's messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PushQueueConfig {
    /// The endpoint's URL (`http` or `https`).
    pub url: String,
    /// Let a message carry its own `target_url` (publish field), used instead of `url`.
    pub allow_message_targets: bool,
    /// `POST` (default), `PUT` or `PATCH`.
    pub method: String,
    /// Longest time for one attempt: connect, send, answer.
    pub timeout: DurationMs,
    /// Longest wait for the connection; unset, the smaller of 5 s and `timeout`
    /// ([`DEFAULT_CONNECT_TIMEOUT_MS`]), so that setting only `timeout` is a valid config.
    pub connect_timeout: Option<DurationMs>,
    /// Most bytes of an answer read (the first 1 KiB is kept in the history).
    pub max_response_bytes: usize,
    /// Calls in flight at most, per endpoint.
    pub concurrency: u32,
    /// Call starts per second at most, per endpoint: `"200/s"` or `"600/m"`.
    pub rate_limit: Option<String>,
    /// Standard Webhooks secret(s), `whsec_…`: one, or a list while rotating (every one
    /// signs; the receiver accepts any).
    pub signing_secret: Option<SecretList>,
    /// Per-endpoint circuit breaker and paced release after recovery.
    pub breaker: bool,
    /// Retries at most this share of recent first attempts per endpoint (plus a small
    /// floor); `0` turns the budget off.
    pub retry_budget: f64,
    /// Class of an attempt that got no answer in time.
    pub on_timeout: redrive_core::ErrorClass,
    /// Class of an attempt that got no connection.
    pub on_connect_error: redrive_core::ErrorClass,
    /// Rules in front of the SPEC §10 defaults, first match wins.
    pub rules: Vec<PushRuleConfig>,
}

impl Default for PushQueueConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            allow_message_targets: false,
            method: "POST".to_owned(),
            timeout: DurationMs(10_000),
            connect_timeout: None,
            max_response_bytes: 64 << 10,
            concurrency: 16,
            rate_limit: None,
            signing_secret: None,
            breaker: true,
            retry_budget: 0.1,
            on_timeout: redrive_core::ErrorClass::Transient,
            on_connect_error: redrive_core::ErrorClass::Transient,
            rules: Vec::new(),
        }
    }
}

/// One secret or several (rotation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SecretList {
    /// One secret.
    One(String),
    /// Several, all signing.
    Many(Vec<String>),
}

impl SecretList {
    fn all(&self) -> Vec<&str> {
        match self {
            Self::One(s) => vec![s.as_str()],
            Self::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// One `[[queues.NAME.push.rules]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushRuleConfig {
    /// A status (`"409"`), a class (`"4xx"`) or a range (`"500-599"`).
    pub status: String,
    /// Match only answers with a usable `Retry-After`.
    #[serde(default)]
    pub retry_after: bool,
    /// `done`, `transient`, `rate_limited`, `permanent` or `gone` (dead, `endpoint_gone`).
    pub outcome: String,
}

/// `[push]`: server-wide push delivery settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PushServerConfig {
    /// Destinations allowed although loopback, private, link-local … (CIDRs such as
    /// `"10.1.0.0/16"` or `"127.0.0.1/32"`): intranet endpoints, tests.
    pub allow_cidrs: Vec<String>,
}

impl Config {
    /// The push queues' settings and the SSRF guard, checked (the error names the key).
    pub fn push_settings(&self) -> Result<PushConfig, ConfigError> {
        let val = |key: String, reason: String| ConfigError::Value { key, reason };
        let mut allow = Vec::new();
        for (i, c) in self.push.allow_cidrs.iter().enumerate() {
            allow.push(
                c.parse::<redrive_push::ssrf::Cidr>()
                    .map_err(|e| val(format!("push.allow_cidrs[{i}]"), e.to_string()))?,
            );
        }
        let mut queues = BTreeMap::new();
        for (name, q) in &self.queues {
            let key = |k: &str| format!("queues.{name}.{k}");
            let push = q.delivery == Some(Delivery::Push);
            if name == "default" && (q.delivery.is_some() || q.push.is_some()) {
                return Err(val(
                    key(if q.push.is_some() { "push" } else { "delivery" }),
                    "push delivery is set per queue, not in [queues.default]".into(),
                ));
            }
            match (&q.push, push) {
                (None, false) => continue,
                (Some(_), false) => {
                    return Err(val(
                        key("push"),
                        "a push section needs delivery = \"push\" in the queue's section".into(),
                    ))
                }
                (None, true) => {
                    return Err(val(
                        key("push.url"),
                        "delivery = \"push\" needs a [queues.NAME.push] section with a url".into(),
                    ))
                }
                (Some(p), true) => {
                    queues.insert(name.clone(), push_queue_settings(p, &key)?);
                }
            }
        }
        Ok(PushConfig {
            queues,
            guard: std::sync::Arc::new(redrive_push::ssrf::Guard::new(allow)),
        })
    }
}

/// One push queue's settings, checked; `key` makes the dotted key of a field.
fn push_queue_settings(
    p: &PushQueueConfig,
    key: &dyn Fn(&str) -> String,
) -> Result<PushSettings, ConfigError> {
    let val = |k: &str, reason: &str| ConfigError::Value {
        key: key(k),
        reason: reason.to_owned(),
    };
    let url = redrive_push::Url::parse(p.url.trim())
        .map_err(|e| val("push.url", &format!("{:?} is not a URL: {e}", p.url)))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(val(
            "push.url",
            "must be an http:// or https:// URL with a host",
        ));
    }
    let method = match p.method.as_str() {
        "POST" | "PUT" | "PATCH" => redrive_push::Method::from_bytes(p.method.as_bytes())
            .map_err(|e| val("push.method", &e.to_string()))?,
        _ => return Err(val("push.method", "must be \"POST\", \"PUT\" or \"PATCH\"")),
    };
    if p.timeout.ms() == 0 || p.timeout.ms() > 600_000 {
        return Err(val("push.timeout", "must be above 0s and at most 10m"));
    }
    // Unset: the smaller of 5 s and `timeout` (SPEC §10). Set: checked against `timeout`.
    let connect_timeout_ms = match p.connect_timeout {
        None => DEFAULT_CONNECT_TIMEOUT_MS.min(p.timeout.ms()),
        Some(c) if c.ms() == 0 || c.ms() > p.timeout.ms() => {
            return Err(val(
                "push.connect_timeout",
                &format!(
                    "must be above 0s and at most push.timeout ({}), not {}",
                    p.timeout, c
                ),
            ))
        }
        Some(c) => c.ms(),
    };
    if !(1..=1024).contains(&p.concurrency) {
        return Err(val("push.concurrency", "must be between 1 and 1024"));
    }
    if p.max_response_bytes < redrive_push::send::EXCERPT_BYTES {
        return Err(val(
            "push.max_response_bytes",
            &format!(
                "must be at least {} (the excerpt kept in the history)",
                redrive_push::send::EXCERPT_BYTES
            ),
        ));
    }
    let rate_limit_per_s = match &p.rate_limit {
        None => None,
        Some(r) => Some(
            parse_rate(r)
                .ok_or_else(|| val("push.rate_limit", "must look like \"200/s\" or \"600/m\""))?,
        ),
    };
    if !(p.retry_budget.is_finite() && (0.0..=10.0).contains(&p.retry_budget)) {
        return Err(val("push.retry_budget", "must be between 0 (off) and 10"));
    }
    let mut secrets = Vec::new();
    for (i, s) in p
        .signing_secret
        .iter()
        .flat_map(SecretList::all)
        .enumerate()
    {
        secrets.push(redrive_push::signing::Secret::parse(s).map_err(|e| {
            val(
                &if matches!(p.signing_secret, Some(SecretList::Many(_))) {
                    format!("push.signing_secret[{i}]")
                } else {
                    "push.signing_secret".to_owned()
                },
                &e.to_string(),
            )
        })?);
    }
    let mut rules = Vec::new();
    for (i, r) in p.rules.iter().enumerate() {
        use redrive_push::classify::Decision;
        let statuses = r
            .status
            .parse()
            .map_err(|e: redrive_push::classify::BadStatuses| {
                val(&format!("push.rules[{i}].status"), &e.to_string())
            })?;
        let decision = match r.outcome.as_str() {
            "done" => Decision::Done,
            "gone" => Decision::Gone,
            other => Decision::Class(redrive_core::ErrorClass::parse(other).ok_or_else(|| {
                val(
                    &format!("push.rules[{i}].outcome"),
                    "must be done, transient, rate_limited, permanent or gone",
                )
            })?),
        };
        rules.push(redrive_push::classify::Rule {
            statuses,
            with_retry_after: r.retry_after,
            decision,
        });
    }
    Ok(PushSettings {
        url,
        allow_message_targets: p.allow_message_targets,
        method,
        timeout_ms: p.timeout.ms(),
        connect_timeout_ms,
        max_response_bytes: p.max_response_bytes,
        concurrency: p.concurrency,
        rate_limit_per_s,
        secrets,
        breaker: p.breaker,
        retry_budget: p.retry_budget,
        rules: redrive_push::classify::Rules::with_overrides(rules)
            .on_timeout(p.on_timeout)
            .on_connect_error(p.on_connect_error),
    })
}

/// `"200/s"`, `"600/m"` or `"3600/h"` as calls per second.
fn parse_rate(text: &str) -> Option<f64> {
    let (n, per) = text.trim().split_once('/')?;
    let n: f64 = n
        .trim()
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n > 0.0)?;
    let seconds = match per.trim() {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3_600.0,
        _ => return None,
    };
    Some(n / seconds)
}

#[cfg(test)]
mod tests {
    use crate::config::tests::load;

    /// Issue 15 §1.6: `timeout = "2s"` alone was refused over `connect_timeout`, a key the
    /// user never wrote (its default was a fixed 5 s).
    #[test]
    fn a_push_queue_with_only_a_short_timeout_loads_and_connects_within_it() {
        let queue =
            "[queues.cb]\ndelivery = \"push\"\n[queues.cb.push]\nurl = \"https://a.example/\"\n";
        let connect_ms = |extra: &str| -> Result<u64, String> {
            let c = load(&format!("{queue}{extra}"), &[]).map_err(|e| e.to_string())?;
            let p = c.push_settings().map_err(|e| e.to_string())?;
            Ok(p.queues["cb"].connect_timeout_ms)
        };
        assert_eq!(connect_ms("timeout = \"2s\""), Ok(2_000));
        assert_eq!(connect_ms("timeout = \"800ms\""), Ok(800));
        assert_eq!(connect_ms(""), Ok(5_000), "timeout 10 s: the 5 s default");
        assert_eq!(connect_ms("timeout = \"30s\""), Ok(5_000));
        assert_eq!(
            connect_ms("timeout = \"2s\"\nconnect_timeout = \"1s\""),
            Ok(1_000)
        );
        // Written explicitly above timeout, it is still refused, naming the key.
        let e = connect_ms("timeout = \"2s\"\nconnect_timeout = \"3s\"").unwrap_err();
        assert!(e.contains("queues.cb.push.connect_timeout"), "{e}");
        assert!(e.contains("2s") && e.contains("3s"), "{e}");
        let e = connect_ms("connect_timeout = \"0s\"").unwrap_err();
        assert!(e.contains("queues.cb.push.connect_timeout"), "{e}");
    }
}
