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
    /// Finished (became `done` or `dead`) at or after. A message that is not finished
    /// (`finished_at` unset: not yet done or dead, or redriven since) never matches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_since: Option<Timestamp>,
    /// Finished before (see `finished_since`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_until: Option<Timestamp>,
    /// Exactly this failure fingerprint ([`redrive_core::fingerprint::of_message`]: the last
    /// error's class and normalised message, else the dead reason). Computed from each
    /// candidate row when read, never stored, so like `text` it reads every row the other
    /// filters leave; a backend that cannot compute it in its queries filters the rows it
    /// read, keeping pages and cursors as for any other filter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

/// One page of results, newest first.
#[derive(Debug, Clone)]
pub struct Page {
    /// The messages (without history).
    pub messages: Vec<Message>,
    /// Pass back as `cursor` for the next page; `None` at the end.
    pub next_cursor: Option<String>,
}

/// Text helpers every backend's search uses the same way.
pub mod filter_text {
    /// The least string greater than every string that begins with `prefix` (code point
    /// order, which is also UTF-8 byte order): `prefix` with its last character that has a
    /// successor replaced by it, and what follows dropped. `None` when no character has one
    /// (an empty prefix): no upper bound.
    pub fn prefix_end(prefix: &str) -> Option<String> {
        let mut chars: Vec<char> = prefix.chars().collect();
        while let Some(last) = chars.pop() {
            let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
            if let Some(next) = next {
                chars.push(next);
                return Some(chars.into_iter().collect());
            }
        }
        None
    }

    /// A `LIKE` pattern matching `text` anywhere, with `%`, `_` and `\` escaped by `\`
    /// (PostgreSQL's default escape; SQLite's with `ESCAPE '\'`).
    pub fn like_pattern(text: &str) -> String {
        let mut p = String::with_capacity(text.len() + 2);
        p.push('%');
        for c in text.chars() {
            if matches!(c, '%' | '_' | '\\') {
                p.push('\\');
            }
            p.push(c);
        }
        p.push('%');
        p
    }
}
