//! The storage contract of redrive. It names no backend.
//!
//! [`Store`] is the one contract every backend implements: it owns the message
//! state machine's *transitions* (publish, lease, ack, nack, extend, redrive,
//! kill, delete, the scheduler's [`Store::tick`], purge) and the reads
//! operators need (get, search, queue stats). A transition is atomic, and once
//! its future resolves `Ok` it is durable under the backend's durability setting (each method says which may answer earlier).
//! Retry decisions are made inside the transition by
//! [`redrive_core::RetryPolicy::decide`], with the queue's settings from the
//! [`redrive_core::QueueCatalog`] the store was opened with, so two racing
//! nacks can never both schedule a retry.
//!
//! The state machine's rules ([`rules`]: is a token the live lease, what a failure
//! leads to, a release's take-back, a redrive's fresh budget, which message of a key may
//! be leased) are pure and written once here; every backend calls them.
//!
//! Backends are crates of their own: `redrive-store-sqlite` (the embedded default) and
//! `redrive-store-postgres`. The `conformance` module (feature `conformance`) is the
//! suite every backend must pass; each backend crate runs it in its own tests.
//!
//! Besides messages it keeps what every node of a cluster must share: bulk tasks and the
//! audit log, membership and leadership ([`cluster`]), and the console's sessions
//! ([`sessions`]).
//!
//! Non-goals: HTTP, long polling and timers (the server's engine decides *when*
//! to call [`Store::tick`]; the store only says when it should next be called).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod batch;
pub mod claims;
pub mod cluster;
mod error;
mod filter;
mod ops;
mod options;
pub mod rules;
pub mod sessions;
pub mod settle;
mod store;
pub mod stored;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use cluster::{
    Beat, ClusterView, EndpointTrip, EndpointTrips, Fence, Heartbeat, Leadership, NodeRecord,
    Supersession,
};
pub use error::StoreError;
pub use filter::{filter_text, MessageFilter, Page};
pub use ops::{
    AuditRecord, NewAudit, TaskAction, TaskRecord, TaskState, TaskStep, TaskStepOutcome,
    TaskTransition,
};
pub use options::{CommitObserver, SqlPublishLimits, StoreOptions, DEFAULT_IDEMPOTENCY_WINDOW_MS};
pub use sessions::{NewSession, SessionLookup, SessionRecord};
pub use store::{
    Ack, AckEvent, Acked, CommitStats, FailureOutcome, Health, LeaseRef, LeaseRequest, Leased,
    MetricKind, Nack, Notifier, Published, PurgeOutcome, QueueStats, ReadyNotice, Release,
    ReleaseBy, Released, Returned, Settled, Store, StoreMetric, TickOutcome,
};
