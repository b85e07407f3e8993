//! What kind of failure an attempt ended with, and what that means for retrying.

use serde::{Deserialize, Serialize};

/// The class of a failed attempt (SPEC §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// Retry on the policy's schedule.
    Transient,
    /// Retry no earlier than the failure's `retry_after` (bounded by the policy).
    RateLimited,
    /// No retry: the message is dead now (`permanent_error`).
    Permanent,
}

impl ErrorClass {
    /// The snake_case name used in the API, metrics and storage.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::RateLimited => "rate_limited",
            ErrorClass::Permanent => "permanent",
        }
    }

    /// Parse the snake_case name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "transient" => Some(Self::Transient),
            "rate_limited" => Some(Self::RateLimited),
            "permanent" => Some(Self::Permanent),
            _ => None,
        }
    }
}

/// The code of [`Failure::endpoint_gone`]. Codes are set by redrive itself, never by a
/// consumer's nack, so a consumer cannot forge it.
pub const ENDPOINT_GONE: &str = "endpoint_gone";

/// One failed attempt as the consumer (or the lease reaper) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// How to treat it.
    pub class: ErrorClass,
    /// What went wrong, for people. Free text, stored in history.
    pub message: Option<String>,
    /// For [`ErrorClass::RateLimited`]: the earliest sensible retry, in ms.
    pub retry_after_ms: Option<u64>,
    /// A machine code such as `lease_expired`, when redrive itself saw the failure.
    pub code: Option<String>,
}

impl Failure {
    /// A failure of `class` with a message.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: Some(message.into()),
            retry_after_ms: None,
            code: None,
        }
    }

    /// A push endpoint answered 410 Gone: the message dies at once with reason
    /// `endpoint_gone` (class `permanent`, code [`ENDPOINT_GONE`]).
    pub fn endpoint_gone(message: impl Into<String>) -> Self {
        Self {
            class: ErrorClass::Permanent,
            message: Some(message.into()),
            retry_after_ms: None,
            code: Some(ENDPOINT_GONE.to_owned()),
        }
    }

    /// Whether this is [`Failure::endpoint_gone`].
    pub fn is_endpoint_gone(&self) -> bool {
        self.class == ErrorClass::Permanent && self.code.as_deref() == Some(ENDPOINT_GONE)
    }

    /// A consumer's release that counts (it released the message `bound` times uncharged
    /// already: the queue's `max_rate_limited`): a transient failure coded `released`.
    pub fn released_past_bound(bound: u32) -> Self {
        Self {
            class: ErrorClass::Transient,
            message: Some(format!(
                "released by its consumer after {bound} uncharged releases (max_rate_limited): \
                 this release counts as a failed attempt"
            )),
            retry_after_ms: None,
            code: Some("released".to_owned()),
        }
    }

    /// The failure redrive records when a lease runs out before an ack or nack.
    pub fn lease_expired() -> Self {
        Self {
            class: ErrorClass::Transient,
            message: Some("lease expired before ack or nack".to_owned()),
            retry_after_ms: None,
            code: Some("lease_expired".to_owned()),
        }
    }
}
