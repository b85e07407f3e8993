//! `[queues.default]` and `[queues.NAME]`: each queue's lease, ordering, dead-letter rule
//! and retry policy (resolved into the store's `QueueCatalog`), and how its messages are
//! delivered (`delivery`; a push queue's `[queues.NAME.push]` is in `push.rs`).

use super::{Config, ConfigError, PushQueueConfig};
use redrive_core::{
    DurationMs, OnDead, Ordering, PolicyError, QueueCatalog, QueueSettings, RetryPolicyConfig,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// One `[queues.NAME]` section (or `[queues.default]`). Unset keys inherit from
/// `[queues.default]`, then from the built-in defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    /// Default lease length when a lease request gives none.
    pub lease: Option<DurationMs>,
    /// `none` or `key`.
    pub ordering: Option<Ordering>,
    /// `skip` or `block` (with `ordering = "key"`).
    pub on_dead: Option<OnDead>,
    /// Retry policy keys.
    #[serde(default)]
    pub retry: RetryPolicyConfig,
    /// `pull` (default: consumers lease over HTTP) or `push` (redrive calls an endpoint).
    pub delivery: Option<Delivery>,
    /// Push delivery settings (`delivery = "push"`), SPEC §10.
    pub push: Option<PushQueueConfig>,
}

/// How a queue's messages reach their consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Consumers lease messages over HTTP (default).
    #[default]
    Pull,
    /// redrive sends each due message to an HTTP endpoint.
    Push,
}

impl Config {
    /// Every queue name but `default`, checked (the error names the section).
    pub(super) fn check_queue_names(&self) -> Result<(), ConfigError> {
        for name in self.queues.keys() {
            if name != "default" {
                redrive_core::validate_queue_name(name).map_err(|e| ConfigError::Value {
                    key: format!("queues.{name}"),
                    reason: e.to_string(),
                })?;
            }
        }
        Ok(())
    }

    /// Every queue's policy resolved once, so a bad one fails at start, and its lease within
    /// `max_lease`.
    pub(super) fn check_queue_policies(&self) -> Result<(), ConfigError> {
        let val = |key: &str, reason: &str| {
            Err(ConfigError::Value {
                key: key.into(),
                reason: reason.into(),
            })
        };
        for name in self.queues.keys().map(String::as_str).chain(["default"]) {
            // Resolving the policy is the check: a bad one fails here, naming its key.
            self.queue_settings_checked(name)?;
            if let Some(lease) = self.queue_lease_ms(name) {
                if lease == 0 || lease > self.max_lease.ms() {
                    return val(
                        &format!("queues.{name}.lease"),
                        "must be above 0s and at most max_lease",
                    );
                }
            }
        }
        Ok(())
    }

    fn queue_settings_checked(&self, queue: &str) -> Result<QueueSettings, ConfigError> {
        let default = self.queues.get("default").cloned().unwrap_or_default();
        let own = self.queues.get(queue).cloned().unwrap_or_default();
        let retry = own.retry.over(&default.retry).resolve().map_err(|e| {
            let section = if self.queues.contains_key(queue) {
                queue
            } else {
                "default"
            };
            ConfigError::Value {
                key: format!("queues.{section}.{}", policy_key(&e)),
                reason: e.to_string(),
            }
        })?;
        Ok(QueueSettings {
            retry,
            ordering: own.ordering.or(default.ordering).unwrap_or_default(),
            on_dead: own.on_dead.or(default.on_dead).unwrap_or_default(),
        })
    }

    /// The effective settings of `queue` (its section over `[queues.default]` over built-ins).
    pub fn queue_settings(&self, queue: &str) -> QueueSettings {
        self.queue_settings_checked(queue).unwrap_or_default()
    }

    /// The queue's configured default lease, if any (its own, else `[queues.default]`).
    pub fn queue_lease_ms(&self, queue: &str) -> Option<u64> {
        self.queues
            .get(queue)
            .and_then(|q| q.lease)
            .or_else(|| self.queues.get("default").and_then(|q| q.lease))
            .map(|d| d.ms())
    }

    /// Every queue's settings, for the store.
    pub fn catalog(&self) -> QueueCatalog {
        let named: HashMap<String, QueueSettings> = self
            .queues
            .keys()
            .filter(|n| *n != "default")
            .map(|n| (n.clone(), self.queue_settings(n)))
            .collect();
        QueueCatalog::new(self.queue_settings("default"), named)
    }
}

fn policy_key(e: &PolicyError) -> String {
    match e {
        PolicyError::UnknownPreset(_) => "retry.preset".into(),
        PolicyError::Invalid { key, .. } => format!("retry.{key}"),
    }
}
