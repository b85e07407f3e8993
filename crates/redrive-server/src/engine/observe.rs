//! Observers: what the engine tells whoever watches it.
//!
//! The engine announces each thing it did as an [`Event`] to every [`Observer`] it was
//! built with, and imports neither the metrics nor the alert notifier: the server's
//! metrics (`crate::metrics::Metrics`) and the notifier's record of deaths
//! ([`super::alerts::DeadLetters`]) are observers, as a test's recorder can be. An
//! observer is called inline, on the task that did the work, after the store answered:
//! it must be quick and must not block (count, push into a bounded record).
//!
//! Test signals ([`super::Signals`]) are apart: they are for tests to wait on, cost
//! nothing while nobody subscribes, and may be dropped when a subscriber lags; an
//! observer sees every event.

use redrive_core::{Message, Timestamp};
use redrive_storage::{AckEvent, FailureOutcome};
use std::sync::Arc;

/// Something the engine did, after the store committed it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Event<'a> {
    /// `n` new messages were published to `queue` (replays not counted).
    Published {
        /// The queue.
        queue: &'a str,
        /// How many.
        n: u64,
    },
    /// A message of `queue` was leased `lateness_ms` after it was due.
    Leased {
        /// The queue.
        queue: &'a str,
        /// Time since it was due, ms (negative never: clamped by the observer).
        lateness_ms: i64,
    },
    /// A delivery ended done: acked by a consumer, or republished by a bridge (`event`).
    Acked {
        /// The message as acked.
        message: &'a Message,
        /// How it was done.
        event: AckEvent,
    },
    /// A consumer handed a lease back uncharged.
    Released {
        /// The queue.
        queue: &'a str,
    },
    /// An attempt failed (nack, expired lease, charged release, a bridge's return, or a
    /// failure reported at publish): the outcome says whether it retries or died.
    Failed {
        /// What the failure did to the message.
        outcome: &'a FailureOutcome,
        /// `nacked`, `lease_expired`, `released`, `returned`; `None` for a failure reported at
        /// publish (no delivery).
        delivery: Option<&'static str>,
        /// The engine's time when it was seen.
        at: Timestamp,
    },
    /// An operator killed a message of `queue`.
    Killed {
        /// The queue.
        queue: &'a str,
    },
    /// The purger deleted `n` done messages of `queue`.
    Purged {
        /// The queue.
        queue: &'a str,
        /// How many.
        n: u64,
    },
    /// A push attempt to `endpoint` ended with `result` after `latency_ms`.
    PushAttempt {
        /// The endpoint's label (`scheme://host:port`).
        endpoint: &'a str,
        /// `delivered`, `transient`, `rate_limited`, `permanent`, `gone`, `refused`.
        result: &'static str,
        /// How long the call took.
        latency_ms: u64,
    },
    /// A push message was parked (handed back unattempted) because of `reason`.
    PushParked {
        /// The endpoint's label.
        endpoint: &'a str,
        /// Why: `breaker`, `pace`, `budget`, `concurrency`.
        reason: &'static str,
    },
    /// One of the server's own consumers (push, a bridge) met a store error.
    ConsumeStoreFault {
        /// The queue.
        queue: &'a str,
        /// `lease`, `ack`, `nack`, `release`, `intake`.
        operation: &'static str,
    },
    /// The alert notifier published an alert of `kind` into `sink`'s queue.
    AlertSent {
        /// The sink's name.
        sink: &'a str,
        /// The alert's kind.
        kind: &'static str,
    },
}

/// Something that watches the engine (see the module docs).
pub trait Observer: Send + Sync {
    /// The engine did `event`.
    fn observe(&self, event: &Event<'_>);
}

/// The observers an engine was built with, called in order.
#[derive(Clone, Default)]
pub struct Observers(Vec<Arc<dyn Observer>>);

impl std::fmt::Debug for Observers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Observers").field(&self.0.len()).finish()
    }
}

impl Observers {
    /// None: an engine nobody watches.
    pub fn none() -> Self {
        Self::default()
    }

    /// These, and `o` after them.
    #[must_use]
    pub fn with(mut self, o: Arc<dyn Observer>) -> Self {
        self.0.push(o);
        self
    }

    /// Tell every observer.
    pub(crate) fn notify(&self, event: Event<'_>) {
        for o in &self.0 {
            o.observe(&event);
        }
    }
}
