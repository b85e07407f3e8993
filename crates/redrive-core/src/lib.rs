//! The pure core of redrive.
//!
//! This crate holds the vocabulary every other crate speaks: [`MessageId`],
//! [`Message`], its [`State`]s, [`ErrorClass`]es, the [`RetryPolicy`] and the one
//! decision that matters after a failed attempt ([`RetryPolicy::decide`]: retry
//! when, or dead why). It does no I/O: time and randomness are passed in
//! ([`Timestamp`], [`SplitMix64`]), so every decision is reproducible from its
//! inputs and unit- and property-tested here.
//!
//! Non-goals: storage, HTTP, configuration files. Those live in
//! `redrive-storage` and `redrive-server`.
//!
//! ```
//! use redrive_core::{RetryPolicy, ErrorClass, Failure, FailureContext, Decision, SplitMix64, Timestamp};
//! let policy = RetryPolicy::preset("svix").unwrap();
//! let mut rng = SplitMix64::new(7);
//! let now = Timestamp::from_millis(1_700_000_000_000);
//! let ctx = FailureContext { counted_attempts: 1, window_start: now, now, prev_delay_ms: None, uncharged_rate_limited: 0 };
//! let failure = Failure::new(ErrorClass::Transient, "HTTP 503");
//! match policy.decide(&ctx, &failure, &mut rng) {
//!     Decision::Retry { delay_ms, .. } => assert_eq!(delay_ms, 5_000),
//!     Decision::Dead { .. } => unreachable!(),
//! }
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod duration;
mod error_class;
pub mod fingerprint;
mod id;
mod message;
mod queue_name;
mod queue_settings;
mod retry_policy;
mod rng;
mod timestamp;

pub use duration::{format_duration_ms, parse_duration_ms, DurationError, DurationMs};
pub use error_class::{ErrorClass, Failure, ENDPOINT_GONE};
pub use fingerprint::fingerprint;
pub use id::{IdError, MessageId};
pub use message::{
    note_wait, AttemptResponse, DeadReason, HistoryEntry, HistoryEvent, LastError, Message,
    NewMessage, State, Waited, WaitedFor,
};
pub use queue_name::{validate_queue_name, QueueNameError, MAX_QUEUE_NAME_BYTES};
pub use queue_settings::{OnDead, Ordering, QueueCatalog, QueueSettings};
pub use retry_policy::{
    Backoff, Decision, ExplainRow, FailureContext, Jitter, PolicyError, RetryPolicy,
    RetryPolicyConfig, DEFAULT_MAX_RATE_LIMITED, DEFAULT_MIN_RETRY_SPAN_MS,
};
pub use rng::{fnv1a, SplitMix64};
pub use timestamp::{Timestamp, TimestampError};
