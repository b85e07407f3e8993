//! Per-queue behaviour the store needs to apply transitions: retry policy and ordering.

use crate::RetryPolicy;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

/// Delivery order within a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ordering {
    /// Priority, then due time; any number of messages of a key may be leased at once.
    #[default]
    None,
    /// Per-key order: at most one message of a key is leased at a time, and a later
    /// message of a key waits while an earlier one is leased or waiting to retry.
    Key,
}

/// What a dead message does to its key under `ordering = "key"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDead {
    /// The dead message releases its key: the next message of the key is delivered.
    #[default]
    Skip,
    /// The key stays blocked until an operator redrives, kills… or deletes the dead message.
    Block,
}

/// Everything the store needs to know about a queue to move its messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueSettings {
    /// When and how often to retry.
    pub retry: RetryPolicy,
    /// Per-key ordering or not.
    pub ordering: Ordering,
    /// Key behaviour of dead messages under `ordering = "key"`.
    pub on_dead: OnDead,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            ordering: Ordering::None,
            on_dead: OnDead::Skip,
        }
    }
}

/// The settings of every queue: the configured ones by name, and the default for the rest.
#[derive(Debug, Clone, Default)]
pub struct QueueCatalog {
    default: Arc<QueueSettings>,
    queues: HashMap<String, Arc<QueueSettings>>,
}

impl QueueCatalog {
    /// A catalog where every queue uses `default` except those in `queues`.
    pub fn new(default: QueueSettings, queues: HashMap<String, QueueSettings>) -> Self {
        Self {
            default: Arc::new(default),
            queues: queues.into_iter().map(|(k, v)| (k, Arc::new(v))).collect(),
        }
    }

    /// The settings of `queue`.
    pub fn get(&self, queue: &str) -> &QueueSettings {
        self.queues.get(queue).unwrap_or(&self.default)
    }

    /// The names of the queues configured explicitly.
    pub fn configured(&self) -> impl Iterator<Item = &str> {
        self.queues.keys().map(String::as_str)
    }
}
