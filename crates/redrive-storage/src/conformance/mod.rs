//! The storage conformance suite: the behaviour every [`Store`] backend must show.
//!
//! One suite, every backend (SPEC §7): `redrive-store-sqlite`'s
//! `tests/conformance_sqlite.rs` runs it on the embedded store, and
//! `redrive-store-postgres` runs the very same cases. A
//! backend invokes [`conformance_tests!`](crate::conformance_tests) with a function
//! that opens a *fresh, empty* store from a [`Setup`] (the queue catalog and
//! idempotency window the cases rely on): that expands to one `#[test]` per case, in
//! one module per area, so each case passes or fails (and is filtered) by its name.
//! Each case gets its own store and runtime, and the store is closed after it.
//!
//! The cases live in one file per area: [`publish`], [`idempotency`], [`lease`],
//! [`ack_nack`], [`operator`], [`tick_purge`], [`search`], [`ordering`], [`tasks`],
//! [`cluster`], [`sessions`]; and
//! [`shared`], the shared-handles area (two stores on one database), for the backends
//! several processes share, with its own macro
//! [`conformance_shared_tests!`](crate::conformance_shared_tests).
//!
//! Time is explicit: every transition takes `now` (always `Some` here), so the cases
//! drive a fake clock from [`T0`] and never sleep. The catalog's policies are deterministic
//! (fixed 1 s backoff, no jitter, 3 attempts), so every delay is exact.
//!
//! ```ignore
//! // In a backend crate's tests (here the SQLite one's):
//! use redrive_storage::conformance::Setup;
//! use redrive_store_sqlite::{SqliteOptions, SqliteStore};
//!
//! async fn open(setup: Setup) -> (SqliteStore, tempfile::TempDir) {
//!     let dir = tempfile::tempdir().expect("temp dir");
//!     let mut opts = SqliteOptions::new(dir.path());
//!     opts.catalog = setup.catalog;
//!     opts.idempotency_window_ms = setup.idempotency_window_ms;
//!     (SqliteStore::open(opts).expect("open"), dir)
//! }
//!
//! redrive_storage::conformance_tests!(open);
//! # fn main() {}
//! ```
//!
//! [`run_all`] runs the whole suite inside one test instead (filtered by
//! `REDRIVE_CONFORMANCE_CASE=substring`), for a backend that prefers that.
//!
//! Non-goals: concurrency and crash recovery (backend-specific tests such as
//! `tests/recovery.rs` cover those), and whether a backend delivers a due message
//! before the tick that promotes it (the cases always tick first).

pub mod ack_nack;
pub mod cluster;
mod helpers;
pub mod idempotency;
pub mod lease;
pub mod operator;
pub mod ordering;
pub mod publish;
pub mod search;
pub mod sessions;
pub mod shared;
pub mod tasks;
pub mod tick_purge;

pub use helpers::at;

use crate::{
    Ack, Acked, FailureOutcome, LeaseRef, LeaseRequest, Leased, MessageFilter, Nack, QueueStats,
    Release, ReleaseBy, Released, Returned, Settled, Store, StoreError,
};
use redrive_core::{
    Backoff, DeadReason, ErrorClass, Failure, HistoryEvent, Jitter, Message, MessageId, NewMessage,
    OnDead, Ordering, QueueCatalog, QueueSettings, RetryPolicy, State, Timestamp,
};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// The fake clock's origin (2023-11-14T22:13:20Z); case times are offsets from it.
pub const T0: i64 = 1_700_000_000_000;
/// The idempotency window the suite's stores must be opened with, ms.
pub const IDEMPOTENCY_WINDOW_MS: u64 = 60_000;
/// `max_attempts` of every queue of the suite's catalog except [`SHORT_AGE`].
pub const MAX_ATTEMPTS: u32 = 3;
/// The fixed retry delay of every queue of the suite's catalog, ms.
pub const RETRY_DELAY_MS: u64 = 1_000;
/// Bound on a `rate_limited` failure's `retry_after`, ms.
pub const MAX_RETRY_AFTER_MS: u64 = 3_600_000;
/// Uncharged rate-limited attempts of the suite's policy before they count: small, so
/// that a case reaches the bound in a few steps, and above [`MAX_ATTEMPTS`], so that
/// "more rate limits than attempts, none counted" can be shown.
pub const MAX_RATE_LIMITED: u32 = 5;

/// A queue with the default settings (no ordering).
pub const Q: &str = "q";
/// A second queue with the default settings.
pub const OTHER: &str = "other";
/// `ordering = "key"`, `on_dead = "skip"`.
pub const ORDERED: &str = "ordered";
/// `ordering = "key"`, `on_dead = "block"`.
pub const ORDERED_BLOCK: &str = "ordered-block";
/// `max_age = 1.5s`, 10 attempts: the second retry falls past the window.
pub const SHORT_AGE: &str = "short-age";

/// What a backend must open each case's store with.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Per-queue settings (see [`catalog`]).
    pub catalog: Arc<QueueCatalog>,
    /// How long an idempotency key is remembered ([`IDEMPOTENCY_WINDOW_MS`]).
    pub idempotency_window_ms: u64,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            catalog: Arc::new(catalog()),
            idempotency_window_ms: IDEMPOTENCY_WINDOW_MS,
        }
    }
}

/// The deterministic policy of the suite: fixed 1 s, no jitter, `max_attempts` deliveries.
pub fn policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        backoff: Backoff::Fixed,
        initial_delay_ms: RETRY_DELAY_MS,
        multiplier: 1.0,
        max_delay_ms: 60_000,
        jitter: Jitter::None,
        max_age_ms: 24 * 3_600_000,
        schedule_ms: Vec::new(),
        max_retry_after_ms: MAX_RETRY_AFTER_MS,
        rate_limited_counts: false,
        max_rate_limited: MAX_RATE_LIMITED,
    }
}

/// The catalog every case's store is opened with: [`Q`] and [`OTHER`] use the default,
/// plus [`ORDERED`], [`ORDERED_BLOCK`] and [`SHORT_AGE`].
pub fn catalog() -> QueueCatalog {
    let plain = QueueSettings {
        retry: policy(MAX_ATTEMPTS),
        ordering: Ordering::None,
        on_dead: OnDead::Skip,
    };
    let mut queues = HashMap::new();
    queues.insert(
        ORDERED.to_owned(),
        QueueSettings {
            ordering: Ordering::Key,
            ..plain.clone()
        },
    );
    queues.insert(
        ORDERED_BLOCK.to_owned(),
        QueueSettings {
            ordering: Ordering::Key,
            on_dead: OnDead::Block,
            ..plain.clone()
        },
    );
    queues.insert(
        SHORT_AGE.to_owned(),
        QueueSettings {
            retry: RetryPolicy {
                max_age_ms: 1_500,
                ..policy(10)
            },
            ..plain.clone()
        },
    );
    QueueCatalog::new(plain, queues)
}

/// The future of one case.
pub type CaseFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// One named case: it panics (with a message) when the store misbehaves.
pub struct Case<S> {
    /// The area (module) of the case: `publish`, `lease`, `ack_nack` …
    pub area: &'static str,
    /// The case's name, as reported on failure.
    pub name: &'static str,
    /// Run the case on a fresh store opened from [`Setup::default`].
    pub run: fn(Arc<S>) -> CaseFuture,
}

impl<S> std::fmt::Debug for Case<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("area", &self.area)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// One `#[test]` per case of the suite, for a backend: `conformance_tests!(open)` where
/// `open` names an `async fn(Setup) -> (S, G)` of the invoking module that opens a
/// fresh, empty store `S: Store`
/// from the [`Setup`] and returns it with a guard `G` (e.g. its temporary directory)
/// that is dropped after the store is closed.
///
/// The tests sit in one module per area, named after the case, so
/// `cargo test -p redrive-storage lease_` runs the cases whose name has `lease_`
/// and `cargo test -p redrive-storage ordering::` runs one area.
///
/// This macro is also the one list of the suite's cases: [`cases`] is built from it,
/// so a case cannot be in one and missing from the other.
#[macro_export]
macro_rules! conformance_tests {
    ($open:ident) => {
        $crate::conformance_tests!(@list [tests $open]);
    };
    (@list [$($mode:tt)*]) => {
        $crate::conformance_tests! { @expand [$($mode)*]
            publish: [
                publish_lease_ack,
                publish_with_failure_is_first_attempt,
            ],
            idempotency: [
                idempotent_publish_replays_original,
                idempotency_conflict_writes_nothing,
                idempotency_key_reusable_after_window,
                idempotent_replay_after_purge_returns_original,
                idempotency_keys_by_prefix_lists_live_keys_only,
                forgotten_idempotency_key_publishes_a_new_message,
            ],
            lease: [
                lease_order_is_priority_then_due_then_age,
                lease_respects_max_and_empty_queue,
                wrong_token_is_lease_mismatch,
                expired_lease_is_refused,
                extend_moves_expiry,
                lease_max_attempts_is_the_last_try,
            ],
            ack_nack: [
                ack_retried_with_same_token_succeeds,
                batch_ack_nack_answer_per_item,
                nack_transient_schedules_retry,
                nack_until_dead_max_attempts,
                nack_permanent_is_dead_now,
                rate_limited_honours_retry_after_and_is_not_counted,
                rate_limited_retry_after_zero_waits_policy_delay_then_counts,
                max_age_ends_retries,
                responses_are_kept_in_history,
                endpoint_gone_is_dead_now,
                release_takes_the_attempt_back,
                release_until_later_schedules,
                release_of_a_stale_lease_is_refused,
                late_calls_after_a_settled_lease_say_how,
                ack_after_real_expiry_is_lease_expired,
                batch_items_say_how_a_lease_was_settled,
                consumer_release_is_uncharged_up_to_max_rate_limited_then_counts,
                charged_release_waits_its_delay_when_longer,
                redrive_renews_the_release_bound,
                wait_notes_are_one_entry_per_episode_before_the_attempt,
                returned_fails_the_delivered_attempt_once,
                returned_before_the_ack_wins_over_it,
                returned_until_dead,
                republished_ack_is_recorded_as_republished,
                failed_publish_counts_attempts_made_elsewhere,
                failed_publish_with_deliver_at_is_due_then,
            ],
            operator: [
                redrive_dead_gives_fresh_budget,
                redrive_needs_dead_or_scheduled,
                redrive_restarts_max_age_window,
                kill_makes_dead_killed,
                killed_lease_token_is_lease_settled_killed,
                delete_removes_message,
                unknown_id_is_not_found,
            ],
            tick_purge: [
                delayed_publish_waits_for_tick,
                tick_next_wake_is_earliest_due_or_expiry,
                tick_expires_lease_as_failed_attempt,
                purge_deletes_old_done_never_dead,
            ],
            search: [
                search_filters,
                search_by_finished_time,
                search_by_fingerprint,
                search_by_fingerprint_pages,
                search_pages_newest_first,
                search_rejects_invalid_cursor,
                queue_stats_counts_per_state,
            ],
            tasks: [
                task_step_acts_and_advances_together,
                task_step_of_paused_task_changes_nothing,
                tasks_are_listed_newest_first,
                audit_log_pages_newest_first,
                redrive_with_payload_replaces_it,
                count_matches_search,
                task_step_runs_only_under_its_fence,
            ],
            ordering: [
                key_ordering_holds_later_message,
                key_ordering_on_dead_skip_releases_key,
                key_ordering_on_dead_block_holds_key,
                key_ordering_one_lease_per_key_after_redrive,
            ],
            cluster: [
                first_standing_node_leads,
                lapsed_leadership_passes_with_the_next_epoch,
                leaving_hands_leadership_over_at_once,
                endpoint_trips_keep_the_latest_period_until_it_ends,
            ],
            sessions: [
                session_is_found_touched_and_expires,
                session_delete_ends_it,
                sessions_per_token_are_bounded_least_recently_used_first,
                expired_sessions_are_deleted_by_the_next_create,
                shared_secret_is_created_once,
            ],
        }
    };
    (@expand [tests $open:ident] $($area:ident: [$($case:ident),* $(,)?]),* $(,)?) => {
        $(
            #[allow(missing_docs)]
            mod $area {
                $(
                    #[test]
                    fn $case() {
                        $crate::conformance::run_one(
                            stringify!($case),
                            super::$open,
                            |s| ::std::boxed::Box::pin($crate::conformance::$area::$case(s)),
                        );
                    }
                )*
            }
        )*
    };
    (@expand [list] $($area:ident: [$($case:ident),* $(,)?]),* $(,)?) => {
        vec![$($(
            $crate::conformance::Case {
                area: stringify!($area),
                name: stringify!($case),
                run: |s| ::std::boxed::Box::pin($crate::conformance::$area::$case(s)),
            },
        )*)*]
    };
}

/// Every case of the suite, in the order of [`conformance_tests!`](crate::conformance_tests).
pub fn cases<S: Store>() -> Vec<Case<S>> {
    crate::conformance_tests!(@list [list])
}

/// Run one case on a fresh store from `open`, on a runtime of its own; the named tests
/// of [`conformance_tests!`](crate::conformance_tests) call this. Panics (failing the
/// test) with the case's name and message when the store misbehaves.
pub fn run_one<S, G, F, Fut>(name: &str, open: F, case: fn(Arc<S>) -> CaseFuture)
where
    S: Store,
    F: FnOnce(Setup) -> Fut,
    Fut: Future<Output = (S, G)>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("conformance case {name}: cannot start a runtime: {e}"));
    runtime.block_on(async {
        let (store, guard) = open(Setup::default()).await;
        let store = Arc::new(store);
        let outcome = tokio::spawn(case(store.clone())).await;
        store.close().await;
        drop(guard);
        if let Err(e) = outcome {
            panic!("conformance case {name} failed: {}", panic_message(e));
        }
    });
}

fn panic_message(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "panicked".to_owned()),
        Err(e) => e.to_string(),
    }
}

/// Run every case (or those matching `REDRIVE_CONFORMANCE_CASE`), each on a fresh store
/// from `make`; panic at the end naming every failed case. For a backend that wants the
/// whole suite in one test; [`conformance_tests!`](crate::conformance_tests) gives one
/// test per case instead.
///
/// Call it inside a Tokio runtime: each case runs in a spawned task, so that its panic
/// is caught, attributed to it, and the remaining cases still run.
pub async fn run_all<S, F, Fut>(make: F)
where
    S: Store,
    F: Fn(Setup) -> Fut,
    Fut: Future<Output = S>,
{
    let only = std::env::var("REDRIVE_CONFORMANCE_CASE").ok();
    run_cases(make, |name| {
        only.as_deref().is_none_or(|o| name.contains(o))
    })
    .await;
}

/// Run the cases whose name passes `select`, each on a fresh store from `make`; panic at
/// the end naming every failed case.
pub async fn run_cases<S, F, Fut>(make: F, select: impl Fn(&str) -> bool)
where
    S: Store,
    F: Fn(Setup) -> Fut,
    Fut: Future<Output = S>,
{
    let mut failed: Vec<String> = Vec::new();
    let mut ran = 0usize;
    for case in cases::<S>() {
        if !select(case.name) {
            continue;
        }
        ran += 1;
        let store = Arc::new(make(Setup::default()).await);
        let outcome = tokio::spawn((case.run)(store.clone())).await;
        store.close().await;
        match outcome {
            Ok(()) => eprintln!("conformance case {} ... ok", case.name),
            Err(e) => {
                let why = panic_message(e);
                eprintln!("conformance case {} ... FAILED: {why}", case.name);
                failed.push(format!("{}: {why}", case.name));
            }
        }
    }
    assert!(ran > 0, "no conformance case matched");
    assert!(
        failed.is_empty(),
        "storage conformance: {} of {ran} cases failed:\n  - {}",
        failed.len(),
        failed.join("\n  - ")
    );
}
