//! The API's limits: the sizes of what a request may store and an answer may hold
//! (`max_payload_bytes`, `max_request_bytes`, `max_response_bytes`, `max_header_bytes`,
//! `max_error_message_bytes`, `max_batch`) and its times (`max_wait`, `max_lease`,
//! `max_schedule_ahead`). The bound on one message in an answer, which `max_response_bytes`
//! must hold, is computed here from these values ([`message_bound_bytes`]); `api::limits`
//! enforces them.

use super::{Config, ConfigError};

/// The largest `max_schedule_ahead`: 100 years (36,525 days), so that now + it stays
/// well before year 9999, the last a due time can be written in RFC 3339.
pub const MAX_SCHEDULE_AHEAD_CEILING_MS: u64 = 36_525 * 24 * 3_600_000;

/// The smallest `max_error_message_bytes`: room for the truncation marker and some text.
pub const MIN_ERROR_MESSAGE_BYTES: usize = 128;

/// Longest ordering key or idempotency key, in characters (what JSON Schema's `maxLength`
/// counts, so the OpenAPI document can state it exactly).
pub const MAX_KEY_CHARS: usize = 512;

/// Worst-case growth of a string when written as JSON: a control character becomes
/// `\u00XX`, 6 bytes for 1.
const JSON_ESCAPE_FACTOR: usize = 6;

/// The fixed part of a message in an answer: field names, id, lease token, queue name
/// (≤ 128 plain bytes), state, numbers, timestamps and error class. Measured at about
/// 600 bytes for a message with every field set; 2 KiB leaves room.
const MESSAGE_OVERHEAD_BYTES: usize = 2048;

/// The most bytes one message (without history) can take in an answer, given the limits
/// it was stored under.
pub fn message_bound_bytes(cfg: &Config) -> usize {
    cfg.max_payload_bytes
        .saturating_add(cfg.max_header_bytes)
        .saturating_add(JSON_ESCAPE_FACTOR.saturating_mul(cfg.max_error_message_bytes))
        .saturating_add(JSON_ESCAPE_FACTOR * 2 * MAX_KEY_CHARS)
        .saturating_add(MESSAGE_OVERHEAD_BYTES)
}

/// The most bytes of one message in an answer besides its stored JSON (payload, headers,
/// last error, key), which the store counts itself (`LeaseRequest::max_bytes`): field
/// names, id, token, queue, timestamps, and the key's worst-case JSON escaping.
pub const MESSAGE_FIXED_BYTES: usize =
    JSON_ESCAPE_FACTOR * 2 * MAX_KEY_CHARS + MESSAGE_OVERHEAD_BYTES;

impl Config {
    /// The limits, checked (the error names the key).
    pub(super) fn check_limits(&self) -> Result<(), ConfigError> {
        let val = |key: &str, reason: &str| {
            Err(ConfigError::Value {
                key: key.into(),
                reason: reason.into(),
            })
        };
        if self.max_batch == 0 {
            return val("max_batch", "must be at least 1");
        }
        if self.max_payload_bytes == 0 || self.max_request_bytes < self.max_payload_bytes {
            return val(
                "max_request_bytes",
                "must be at least max_payload_bytes (and both above 0)",
            );
        }
        if self.max_error_message_bytes < MIN_ERROR_MESSAGE_BYTES {
            return val(
                "max_error_message_bytes",
                &format!("must be at least {MIN_ERROR_MESSAGE_BYTES}"),
            );
        }
        let bound = message_bound_bytes(self);
        if self.max_response_bytes < bound {
            return val(
                "max_response_bytes",
                &format!(
                    "must be at least {bound}: one message of max_payload_bytes with \
                     max_header_bytes of headers and max_error_message_bytes of error text \
                     must fit in an answer"
                ),
            );
        }
        if self.max_schedule_ahead.ms() > MAX_SCHEDULE_AHEAD_CEILING_MS {
            return val(
                "max_schedule_ahead",
                "must be at most 100 years (a due time must stay a 4-digit-year RFC 3339 time)",
            );
        }
        if self.max_lease.ms() == 0 {
            return val("max_lease", "must be greater than 0s");
        }
        Ok(())
    }
}
