//! Search filters and pages for operator queries.

use redrive_core::{ErrorClass, Message, State, Timestamp};
use serde::{Deserialize, Serialize};

/// Which messages to list. Every set field must match (AND). Serializable, so that a bulk
/// task can keep its selection (fields named as here, unset ones absent).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MessageFilter {
    /// Exact queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Exact state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,
    /// Exact ordering key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Class of the last error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_class: Option<ErrorClass>,
    /// Substring of the payload's JSON text or of the last error's message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Created at or after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    /// Created before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<Timestamp>,
}

/// One page of results, newest first.
#[derive(Debug, Clone)]
pub struct Page {
    /// The messages (without history).
    pub messages: Vec<Message>,
    /// Pass back as `cursor` for the next page; `None` at the end.
    pub next_cursor: Option<String>,
}
