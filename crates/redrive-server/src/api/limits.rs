//! Size limits on what the API stores and answers (issue 5, defect 9), so that no request
//! can make the server build an answer of unbounded size in memory.
//!
//! - **Stored text**: `headers` of a message (their JSON text) over `max_header_bytes` is a
//!   413 `headers_too_large` naming the field. An error message (nack, batch nack,
//!   `failed` at publish) or a kill reason over `max_error_message_bytes` is **truncated**,
//!   not refused: it usually carries a third party's text, and refusing the nack would
//!   leave the message leased until its lease expires. The stored text ends with
//!   [`TRUNCATION_MARKER`] and the original length, so the history says so.
//! - **Answers**: a lease answer and a search page stay under `max_response_bytes`. Each
//!   stored message is bounded ([`message_bound_bytes`]: payload, headers, keys, error
//!   text, fixed fields), so the API asks the store for at most
//!   `remaining budget ÷ bound` messages at a time and asks again while the budget allows
//!   (and the caller's `max` / `limit` is not reached). A lease therefore returns fewer than
//!   `max` messages rather than exceed the budget, and never leases a message it does not
//!   return; a search page ends early with a `next_cursor`. At least one message always fits:
//!   the configuration refuses a `max_response_bytes` below the bound. An export holds at
//!   most one budget's worth of rows at a time. A batch ack / nack answers every item, but
//!   once the answer reaches the budget the remaining items carry no `message` and say
//!   `"message_omitted": true` (their status still says what happened).
//!
//! Messages stored before these limits existed may exceed the bound; the answer is then
//! larger by that excess (never by more messages).

use super::ApiError;
use crate::Config;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use std::collections::BTreeMap;

pub use crate::config::{message_bound_bytes, MAX_KEY_CHARS, MESSAGE_FIXED_BYTES};

/// Appended to a truncated error message or kill reason, followed by the original length.
pub const TRUNCATION_MARKER: &str = "… [truncated by redrive from ";

/// How many messages may still be fetched with `remaining` bytes of budget.
pub fn fitting(remaining: usize, bound: usize) -> usize {
    remaining / bound.max(1)
}

/// Refuse headers whose JSON text exceeds `max_header_bytes` (413 naming `field`).
pub fn check_headers(
    field: &str,
    headers: &BTreeMap<String, String>,
    cfg: &Config,
) -> Result<(), ApiError> {
    let size = serde_json::to_vec(headers)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    let limit = cfg.max_header_bytes;
    if size > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "headers_too_large",
            format!("{field}: {size} bytes of JSON, the limit is {limit} (max_header_bytes)"),
        ));
    }
    Ok(())
}

/// Cut `text` to at most `max_bytes` bytes (on a character boundary), ending with
/// [`TRUNCATION_MARKER`] and the original length when it was cut.
pub fn truncate_text(text: String, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text;
    }
    let marker = format!("{TRUNCATION_MARKER}{} bytes]", text.len());
    // A limit too small for the marker (the configuration refuses it) just cuts.
    let (keep, marker) = if marker.len() <= max_bytes {
        (max_bytes - marker.len(), marker)
    } else {
        (max_bytes, String::new())
    };
    let mut cut = keep;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut out = String::with_capacity(cut + marker.len());
    out.push_str(&text[..cut]);
    out.push_str(&marker);
    out
}

/// [`truncate_text`] for an optional text.
pub fn truncate_opt(text: Option<String>, max_bytes: usize) -> Option<String> {
    text.map(|t| truncate_text(t, max_bytes))
}

/// A JSON array built from items serialized one by one, stopping before the budget.
#[derive(Debug)]
pub struct JsonArray {
    buf: Vec<u8>,
    /// Bytes of the prefix and `[`, not counted by [`JsonArray::bytes`].
    start: usize,
    count: usize,
}

impl JsonArray {
    /// An array that will follow `prefix` (e.g. `{"messages":`).
    pub fn new(prefix: &str) -> Self {
        let mut buf = Vec::with_capacity(4096);
        buf.extend_from_slice(prefix.as_bytes());
        buf.push(b'[');
        Self {
            start: buf.len(),
            buf,
            count: 0,
        }
    }

    /// Append one item.
    pub fn push<T: serde::Serialize>(&mut self, item: &T) -> Result<(), ApiError> {
        self.write_item(item)?;
        self.count += 1;
        Ok(())
    }

    /// Append one item if its JSON fits in `budget` bytes of items in all; `false` (and
    /// nothing written) if it does not.
    pub fn push_within<T: serde::Serialize>(
        &mut self,
        item: &T,
        budget: usize,
    ) -> Result<bool, ApiError> {
        // Written in place, and taken back if it does not fit.
        let before = self.buf.len();
        let used = self.bytes();
        let item_bytes = self.write_item(item)?;
        if used + item_bytes + 1 > budget {
            self.buf.truncate(before);
            return Ok(false);
        }
        self.count += 1;
        Ok(true)
    }

    /// Write `item` after a comma if it is not the first: its JSON's length.
    fn write_item<T: serde::Serialize>(&mut self, item: &T) -> Result<usize, ApiError> {
        if self.count > 0 {
            self.buf.push(b',');
        }
        let start = self.buf.len();
        serde_json::to_writer(&mut self.buf, item).map_err(|e| {
            tracing::error!(error = %e, "cannot serialize an answer");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error (logged on the server)",
            )
        })?;
        Ok(self.buf.len() - start)
    }

    /// Bytes of the items written so far (the few bytes around them are part of the
    /// config's `MESSAGE_OVERHEAD_BYTES`, in `config/limits.rs`).
    pub fn bytes(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Items written so far.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Close the array, append `suffix` (e.g. `}`), and answer it as JSON.
    pub fn finish(mut self, suffix: &str) -> axum::response::Response {
        self.buf.push(b']');
        self.buf.extend_from_slice(suffix.as_bytes());
        (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            self.buf,
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_past_the_budget_is_taken_back_whole() {
        // Each item `"ab"` is 4 bytes, counted with one byte for its comma.
        let mut a = JsonArray::new("{\"items\":");
        assert!(a.push_within(&"ab", 5).unwrap(), "4 + 1 fits in 5");
        assert!(
            !a.push_within(&"ab", 8).unwrap(),
            "4 + 4 + 1 does not fit in 8"
        );
        assert!(
            a.push_within(&"ab", 9).unwrap(),
            "4, a comma and 4 fit in 9"
        );
        assert!(!a.push_within(&"abc", 0).unwrap());
        assert_eq!(
            (a.bytes(), a.count()),
            (9, 2),
            "nothing of the refused items is left"
        );
        assert_eq!(a.buf, br#"{"items":["ab","ab""#.to_vec());
    }

    #[test]
    fn truncation_says_so_and_keeps_the_limit() {
        assert_eq!(truncate_text("short".into(), 100), "short");
        let long = "é".repeat(500); // 1000 bytes
        let t = truncate_text(long, 200);
        assert!(t.len() <= 200, "{}", t.len());
        assert!(t.contains(TRUNCATION_MARKER), "{t}");
        assert!(t.ends_with("1000 bytes]"), "{t}");
        assert!(t.starts_with("éé"), "{t}");
        // A limit smaller than the marker: cut, without the marker.
        let t = truncate_text("x".repeat(50), 10);
        assert_eq!(t, "x".repeat(10));
    }

    #[test]
    fn the_default_bound_fits_the_default_budget() {
        let c = Config::default();
        assert!(fitting(c.max_response_bytes, message_bound_bytes(&c)) >= 50);
    }
}
