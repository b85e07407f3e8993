//! Search filters and pages for operator queries.

use redrive_core::{ErrorClass, Message, State, Timestamp};

/// Which messages to list. Every set field must match (AND).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MessageFilter {
    /// Exact queue.
    pub queue: Option<String>,
    /// Exact state.
    pub state: Option<State>,
    /// Exact ordering key.
    pub key: Option<String>,
    /// Class of the last error.
    pub error_class: Option<ErrorClass>,
    /// Substring of the payload's JSON text or of the last error's message.
    pub text: Option<String>,
    /// Created at or after.
    pub since: Option<Timestamp>,
    /// Created before.
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
