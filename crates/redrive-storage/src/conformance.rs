//! The storage conformance suite: the behaviour every [`Store`] backend must show.
//!
//! One suite, every backend (SPEC §7): `tests/conformance_sqlite.rs` runs it on
//! [`crate::SqliteStore`], and a PostgreSQL backend runs the very same cases. A
//! backend hands [`run_all`] a function that opens a *fresh, empty* store from a
//! [`Setup`] (the queue catalog and idempotency window the cases rely on); each
//! case gets its own store, runs in its own task, and the store is closed after
//! it. Every failing case is reported by name, after all cases have run.
//!
//! Time is explicit: every transition takes `now`, so the cases drive a fake
//! clock from [`T0`] and never sleep. The catalog's policies are deterministic
//! (fixed 1 s backoff, no jitter, 3 attempts), so every delay is exact.
//!
//! Set `REDRIVE_CONFORMANCE_CASE=substring` to run only the matching cases.
//!
//! ```no_run
//! use redrive_storage::conformance::{run_all, Setup};
//! use redrive_storage::{SqliteOptions, SqliteStore};
//! use std::sync::atomic::{AtomicU32, Ordering};
//!
//! # async fn example() {
//! let root = tempfile::tempdir().expect("temp dir");
//! let next = AtomicU32::new(0);
//! run_all(|setup: Setup| {
//!     let dir = root.path().join(next.fetch_add(1, Ordering::Relaxed).to_string());
//!     async move {
//!         let mut opts = SqliteOptions::new(dir);
//!         opts.catalog = setup.catalog;
//!         opts.idempotency_window_ms = setup.idempotency_window_ms;
//!         SqliteStore::open(opts).expect("open")
//!     }
//! })
//! .await;
//! # }
//! ```
//!
//! Non-goals: concurrency and crash recovery (backend-specific tests such as
//! `tests/recovery.rs` cover those), and whether a backend delivers a due message
//! before the tick that promotes it (the cases always tick first).

use crate::{
    Acked, FailureOutcome, LeaseRef, LeaseRequest, Leased, MessageFilter, Nack, QueueStats, Store,
    StoreError,
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
    /// The case's name, as reported on failure.
    pub name: &'static str,
    /// Run the case on a fresh store opened from [`Setup::default`].
    pub run: fn(Arc<S>) -> CaseFuture,
}

impl<S> std::fmt::Debug for Case<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        vec![$(Case::<S> { name: stringify!($name), run: |s| Box::pin($name(s)) }),*]
    };
}

/// Every case of the suite.
pub fn cases<S: Store>() -> Vec<Case<S>> {
    cases![
        publish_lease_ack,
        lease_order_is_priority_then_due_then_age,
        lease_respects_max_and_empty_queue,
        delayed_publish_waits_for_tick,
        tick_next_wake_is_earliest_due_or_expiry,
        nack_transient_schedules_retry,
        nack_until_dead_max_attempts,
        nack_permanent_is_dead_now,
        rate_limited_honours_retry_after_and_is_not_counted,
        max_age_ends_retries,
        wrong_token_is_lease_mismatch,
        expired_lease_is_refused,
        tick_expires_lease_as_failed_attempt,
        ack_retried_with_same_token_succeeds,
        extend_moves_expiry,
        batch_ack_nack_answer_per_item,
        idempotent_publish_replays_original,
        idempotency_conflict_writes_nothing,
        idempotency_key_reusable_after_window,
        redrive_dead_gives_fresh_budget,
        redrive_needs_dead_or_scheduled,
        kill_makes_dead_killed,
        killed_lease_token_is_expired,
        delete_removes_message,
        unknown_id_is_not_found,
        key_ordering_holds_later_message,
        key_ordering_on_dead_skip_releases_key,
        key_ordering_on_dead_block_holds_key,
        key_ordering_one_lease_per_key_after_redrive,
        search_filters,
        search_pages_newest_first,
        search_rejects_invalid_cursor,
        purge_deletes_old_done_never_dead,
        queue_stats_counts_per_state,
        publish_with_failure_is_first_attempt,
    ]
}

/// Run every case (or those matching `REDRIVE_CONFORMANCE_CASE`), each on a fresh store
/// from `make`; panic at the end naming every failed case.
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
                let why = match e.try_into_panic() {
                    Ok(p) => p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_else(|| "panicked".to_owned()),
                    Err(e) => e.to_string(),
                };
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

// ---- helpers ----

/// `T0 + ms`.
pub fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(T0 + ms)
}

fn msg(queue: &str, payload: serde_json::Value) -> NewMessage {
    NewMessage::new(queue, payload)
}

fn keyed(queue: &str, key: &str, n: u32) -> NewMessage {
    NewMessage {
        key: Some(key.to_owned()),
        ..msg(queue, json!({ "key": key, "n": n }))
    }
}

fn failure(class: ErrorClass, text: &str) -> Failure {
    Failure::new(class, text)
}

async fn publish<S: Store>(s: &S, m: NewMessage, now: Timestamp) -> Message {
    let mut out = s
        .publish(vec![m], now)
        .await
        .expect("publish of one item failed");
    assert_eq!(
        out.len(),
        1,
        "publish of one item answered {} items",
        out.len()
    );
    let p = out.remove(0);
    assert!(!p.replayed, "a fresh publish came back as a replay");
    p.message
}

async fn lease<S: Store>(
    s: &S,
    queue: &str,
    max: u32,
    lease_ms: u64,
    now: Timestamp,
) -> Vec<Leased> {
    let got = s
        .lease(
            LeaseRequest {
                queue: queue.to_owned(),
                max,
                lease_ms,
            },
            now,
        )
        .await
        .expect("lease failed");
    assert!(
        got.len() <= max as usize,
        "lease max {max} returned {}",
        got.len()
    );
    for l in &got {
        assert_eq!(
            l.message.queue, queue,
            "lease of {queue} returned a message of {}",
            l.message.queue
        );
        assert_eq!(
            l.message.state,
            State::Leased,
            "a leased message is not in state leased"
        );
        assert_eq!(
            l.expires_at,
            now.plus_ms(lease_ms),
            "lease expiry is not now + lease"
        );
        assert_eq!(
            l.attempt, l.message.attempts,
            "Leased.attempt differs from message.attempts"
        );
    }
    got
}

/// Lease exactly one message and check it is `id`.
async fn lease_one<S: Store>(
    s: &S,
    queue: &str,
    id: MessageId,
    lease_ms: u64,
    now: Timestamp,
) -> Leased {
    let mut got = lease(s, queue, 1, lease_ms, now).await;
    assert_eq!(ids(&got), vec![id], "expected to lease {id}");
    got.remove(0)
}

fn lref(id: MessageId, token: &str) -> LeaseRef {
    LeaseRef {
        id,
        token: token.to_owned(),
    }
}

async fn ack<S: Store>(
    s: &S,
    id: MessageId,
    token: &str,
    now: Timestamp,
) -> Result<Acked, StoreError> {
    let mut r = s
        .ack(vec![lref(id, token)], now)
        .await
        .expect("ack request failed as a whole");
    assert_eq!(r.len(), 1, "ack of one item answered {} items", r.len());
    r.remove(0)
}

async fn nack<S: Store>(
    s: &S,
    id: MessageId,
    token: &str,
    f: Failure,
    now: Timestamp,
) -> Result<FailureOutcome, StoreError> {
    let mut r = s
        .nack(
            vec![Nack {
                lease: lref(id, token),
                failure: f,
            }],
            now,
        )
        .await
        .expect("nack request failed as a whole");
    assert_eq!(r.len(), 1, "nack of one item answered {} items", r.len());
    r.remove(0)
}

async fn get<S: Store>(s: &S, id: MessageId) -> Message {
    s.get(id)
        .await
        .expect("get failed")
        .unwrap_or_else(|| panic!("message {id} is missing"))
}

async fn stats<S: Store>(s: &S, queue: &str) -> Option<QueueStats> {
    s.queue_stats()
        .await
        .expect("queue_stats failed")
        .into_iter()
        .find(|q| q.queue == queue)
}

async fn count<S: Store>(s: &S, queue: &str, state: State) -> u64 {
    stats(s, queue).await.map_or(0, |q| q.count(state))
}

async fn tick<S: Store>(s: &S, now: Timestamp) -> crate::TickOutcome {
    s.tick(now).await.expect("tick failed")
}

fn ids(leased: &[Leased]) -> Vec<MessageId> {
    leased.iter().map(|l| l.message.id).collect()
}

fn msg_ids(messages: &[Message]) -> Vec<MessageId> {
    messages.iter().map(|m| m.id).collect()
}

/// The `Failed` entries of a history, as (attempt, dead reason).
fn failures(m: &Message) -> Vec<(u32, Option<DeadReason>)> {
    m.history
        .iter()
        .filter_map(|h| match &h.event {
            HistoryEvent::Failed { dead_reason, .. } => Some((h.attempt, *dead_reason)),
            _ => None,
        })
        .collect()
}

fn expect_err<T: std::fmt::Debug>(
    r: Result<T, StoreError>,
    what: &str,
    ok: fn(&StoreError) -> bool,
) {
    match r {
        Err(e) if ok(&e) => {}
        other => panic!("{what}: unexpected answer {other:?}"),
    }
}

fn is_mismatch(e: &StoreError) -> bool {
    matches!(e, StoreError::LeaseMismatch)
}

fn is_expired(e: &StoreError) -> bool {
    matches!(e, StoreError::LeaseExpired)
}

fn is_not_found(e: &StoreError) -> bool {
    matches!(e, StoreError::NotFound(_))
}

/// Lease `id` (the only ready message of `queue`) and nack it; return the outcome.
async fn lease_and_nack<S: Store>(
    s: &S,
    queue: &str,
    id: MessageId,
    f: Failure,
    now: Timestamp,
) -> FailureOutcome {
    let l = lease_one(s, queue, id, 30_000, now).await;
    nack(s, id, &l.token, f, now)
        .await
        .expect("nack of a live lease failed")
}

// ---- cases: the happy path and lease order ----

async fn publish_lease_ack<S: Store>(s: Arc<S>) {
    let mut m = msg(Q, json!({"order": 42, "items": ["a", "b"]}));
    m.headers.insert("trace".into(), "t-1".into());
    m.key = Some("customer-7".into());
    m.priority = 4;
    let p = publish(&*s, m, at(0)).await;
    assert_eq!(p.state, State::Ready, "a publish without delay is ready");
    assert_eq!(p.due_at, Some(at(0)), "a publish without delay is due now");
    assert_eq!(p.attempts, 0);
    assert_eq!(p.created_at, at(0));
    let got = get(&*s, p.id).await;
    assert_eq!(
        got.payload,
        json!({"order": 42, "items": ["a", "b"]}),
        "payload round trip"
    );
    assert_eq!(
        got.headers.get("trace").map(String::as_str),
        Some("t-1"),
        "headers round trip"
    );
    assert_eq!(got.key.as_deref(), Some("customer-7"), "key round trip");
    assert_eq!(got.priority, 4, "priority round trip");
    assert!(got.history.is_empty(), "a fresh message has no history");

    let l = lease_one(&*s, Q, p.id, 30_000, at(5)).await;
    assert_eq!(l.attempt, 1, "first delivery is attempt 1");
    assert_eq!(l.lateness_ms, 5, "lateness = lease time - due time");
    assert_eq!(l.message.payload, got.payload);
    let leased = get(&*s, p.id).await;
    assert_eq!(leased.state, State::Leased);
    assert_eq!(leased.lease_expires_at, Some(at(30_005)));

    let acked = ack(&*s, p.id, &l.token, at(10))
        .await
        .expect("ack of a live lease failed");
    assert_eq!(
        acked.message.state,
        State::Done,
        "ack answers the done message"
    );
    let done = get(&*s, p.id).await;
    assert_eq!(done.state, State::Done);
    assert_eq!(done.attempts, 1);
    assert_eq!(done.finished_at, Some(at(10)));
    assert_eq!(
        done.history.len(),
        1,
        "one history entry per attempt: {:?}",
        done.history
    );
    assert_eq!(done.history[0].event, HistoryEvent::Acked);
    assert_eq!(done.history[0].attempt, 1);
    assert!(
        lease(&*s, Q, 10, 30_000, at(20)).await.is_empty(),
        "an acked message is leased again"
    );
    assert_eq!(count(&*s, Q, State::Done).await, 1);
}

async fn lease_order_is_priority_then_due_then_age<S: Store>(s: Arc<S>) {
    // m1 is the oldest but due last; m3 has the highest priority; m4 and m5 tie on
    // priority and due time, so publish order decides.
    let m1 = publish(
        &*s,
        NewMessage {
            deliver_at: Some(at(900)),
            ..msg(Q, json!(1))
        },
        at(0),
    )
    .await;
    let m2 = publish(&*s, msg(Q, json!(2)), at(100)).await;
    let m3 = publish(
        &*s,
        NewMessage {
            priority: 7,
            ..msg(Q, json!(3))
        },
        at(200),
    )
    .await;
    let batch = s
        .publish(vec![msg(Q, json!(4)), msg(Q, json!(5))], at(300))
        .await
        .expect("publish batch");
    let (m4, m5) = (batch[0].message.id, batch[1].message.id);
    tick(&*s, at(1_000)).await;
    let first = lease(&*s, Q, 2, 30_000, at(1_000)).await;
    assert_eq!(
        ids(&first),
        vec![m3.id, m2.id],
        "priority first, then earliest due"
    );
    let rest = lease(&*s, Q, 10, 30_000, at(1_000)).await;
    assert_eq!(
        ids(&rest),
        vec![m4, m5, m1.id],
        "earliest due, then oldest (publish order)"
    );
}

async fn lease_respects_max_and_empty_queue<S: Store>(s: Arc<S>) {
    assert!(
        lease(&*s, Q, 5, 30_000, at(0)).await.is_empty(),
        "lease of an empty queue"
    );
    let items: Vec<NewMessage> = (0..5).map(|i| msg(Q, json!(i))).collect();
    let published = s.publish(items, at(0)).await.expect("publish batch");
    assert_eq!(published.len(), 5);
    publish(&*s, msg(OTHER, json!("other")), at(0)).await;
    let a = lease(&*s, Q, 3, 30_000, at(1)).await;
    assert_eq!(a.len(), 3, "lease max 3 of 5 ready");
    let b = lease(&*s, Q, 3, 30_000, at(1)).await;
    assert_eq!(b.len(), 2, "the 2 left");
    assert!(
        lease(&*s, Q, 3, 30_000, at(1)).await.is_empty(),
        "nothing left"
    );
    let all: HashSet<MessageId> = ids(&a).into_iter().chain(ids(&b)).collect();
    assert_eq!(all.len(), 5, "a message was leased twice");
    assert_eq!(count(&*s, Q, State::Leased).await, 5);
    assert_eq!(
        count(&*s, OTHER, State::Ready).await,
        1,
        "a lease of q touched another queue"
    );
}

async fn delayed_publish_waits_for_tick<S: Store>(s: Arc<S>) {
    let m = publish(
        &*s,
        NewMessage {
            deliver_at: Some(at(5_000)),
            ..msg(Q, json!("later"))
        },
        at(0),
    )
    .await;
    assert_eq!(
        m.state,
        State::Scheduled,
        "deliver_at in the future is scheduled"
    );
    assert_eq!(m.due_at, Some(at(5_000)));
    let hint = *s.wake_hint().borrow();
    assert!(
        hint.is_some_and(|h| h <= at(5_000)),
        "wake hint {hint:?} is not at or before the due time"
    );
    assert!(
        lease(&*s, Q, 1, 30_000, at(4_999)).await.is_empty(),
        "leased before it was due"
    );
    let t = tick(&*s, at(4_999)).await;
    assert!(
        t.ready_queues.is_empty(),
        "tick before due reported {:?}",
        t.ready_queues
    );
    assert_eq!(t.next_wake, Some(at(5_000)), "next_wake is the due time");
    assert_eq!(get(&*s, m.id).await.state, State::Scheduled);
    let t = tick(&*s, at(5_000)).await;
    assert_eq!(
        t.ready_queues,
        vec![Q.to_owned()],
        "tick at due time reports the queue ready"
    );
    let ready = get(&*s, m.id).await;
    assert_eq!(ready.state, State::Ready);
    assert_eq!(
        ready.due_at,
        Some(at(5_000)),
        "promotion keeps the due time"
    );
    let l = lease_one(&*s, Q, m.id, 30_000, at(5_010)).await;
    assert_eq!(l.attempt, 1);
    assert_eq!(l.lateness_ms, 10);
    // A deliver_at in the past is simply due now.
    let past = publish(
        &*s,
        NewMessage {
            deliver_at: Some(at(0)),
            ..msg(Q, json!("past"))
        },
        at(6_000),
    )
    .await;
    assert_eq!(past.state, State::Ready, "deliver_at in the past is ready");
}

async fn tick_next_wake_is_earliest_due_or_expiry<S: Store>(s: Arc<S>) {
    assert_eq!(
        tick(&*s, at(0)).await.next_wake,
        None,
        "an empty store has nothing to wake for"
    );
    publish(
        &*s,
        NewMessage {
            deliver_at: Some(at(5_000)),
            ..msg(Q, json!("a"))
        },
        at(0),
    )
    .await;
    publish(
        &*s,
        NewMessage {
            deliver_at: Some(at(3_000)),
            ..msg(OTHER, json!("b"))
        },
        at(0),
    )
    .await;
    let c = publish(&*s, msg(Q, json!("c")), at(0)).await;
    let l = lease_one(&*s, Q, c.id, 2_000, at(0)).await;
    assert_eq!(
        tick(&*s, at(0)).await.next_wake,
        Some(at(2_000)),
        "lease expiry is earliest"
    );
    ack(&*s, c.id, &l.token, at(1)).await.expect("ack");
    assert_eq!(
        tick(&*s, at(1)).await.next_wake,
        Some(at(3_000)),
        "earliest due after the ack"
    );
    let t = tick(&*s, at(3_000)).await;
    assert_eq!(t.ready_queues, vec![OTHER.to_owned()]);
    assert_eq!(t.next_wake, Some(at(5_000)));
    let t = tick(&*s, at(5_000)).await;
    assert_eq!(t.ready_queues, vec![Q.to_owned()]);
    assert_eq!(t.next_wake, None, "nothing scheduled or leased is left");
    assert!(!t.more);
}

// ---- cases: failures and the retry policy ----

async fn nack_transient_schedules_retry<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 30_000, at(0)).await;
    let out = nack(
        &*s,
        m.id,
        &l.token,
        failure(ErrorClass::Transient, "db timeout"),
        at(10),
    )
    .await
    .expect("nack of a live lease");
    assert_eq!(out.class, ErrorClass::Transient);
    assert_eq!(out.retry_delay_ms, Some(RETRY_DELAY_MS), "fixed 1s backoff");
    assert_eq!(out.dead_reason, None);
    assert_eq!(out.message.state, State::Scheduled);
    assert_eq!(out.message.due_at, Some(at(1_010)), "due = now + delay");
    let got = get(&*s, m.id).await;
    assert_eq!(got.state, State::Scheduled);
    assert_eq!(got.attempts, 1);
    assert_eq!(got.due_at, Some(at(1_010)));
    let le = got.last_error.as_ref().expect("last_error after a nack");
    assert_eq!(le.class, ErrorClass::Transient);
    assert_eq!(le.message.as_deref(), Some("db timeout"));
    assert_eq!(le.at, at(10));
    assert_eq!(got.history.len(), 1);
    match &got.history[0].event {
        HistoryEvent::Failed {
            retry_at,
            delay_ms,
            dead_reason,
            error,
            ..
        } => {
            assert_eq!(*retry_at, Some(at(1_010)));
            assert_eq!(*delay_ms, Some(RETRY_DELAY_MS));
            assert_eq!(*dead_reason, None);
            assert_eq!(error.message.as_deref(), Some("db timeout"));
        }
        e => panic!("history entry is {e:?}, expected Failed"),
    }
    assert_eq!(got.history[0].attempt, 1);
    assert_eq!(
        got.history[0].leased_at,
        Some(at(0)),
        "history records when the attempt was leased"
    );
    assert!(
        lease(&*s, Q, 1, 30_000, at(1_009)).await.is_empty(),
        "leased before its retry is due"
    );
    assert!(tick(&*s, at(1_009)).await.ready_queues.is_empty());
    assert_eq!(tick(&*s, at(1_010)).await.ready_queues, vec![Q.to_owned()]);
    let l2 = lease_one(&*s, Q, m.id, 30_000, at(1_010)).await;
    assert_eq!(l2.attempt, 2);
    assert_ne!(l2.token, l.token, "a new lease has a new token");
    assert_eq!(
        l2.message.last_error.as_ref().map(|e| e.class),
        Some(ErrorClass::Transient)
    );
}

async fn nack_until_dead_max_attempts<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let mut now = 0;
    for attempt in 1..=MAX_ATTEMPTS {
        tick(&*s, at(now)).await;
        let l = lease_one(&*s, Q, m.id, 30_000, at(now)).await;
        assert_eq!(l.attempt, attempt);
        let out = nack(
            &*s,
            m.id,
            &l.token,
            failure(ErrorClass::Transient, "boom"),
            at(now + 10),
        )
        .await
        .expect("nack");
        if attempt < MAX_ATTEMPTS {
            assert_eq!(
                out.message.state,
                State::Scheduled,
                "attempt {attempt} of {MAX_ATTEMPTS} retries"
            );
            now += 10 + RETRY_DELAY_MS as i64;
        } else {
            assert_eq!(
                out.message.state,
                State::Dead,
                "the last attempt's failure is dead"
            );
            assert_eq!(out.dead_reason, Some(DeadReason::MaxAttempts));
            assert_eq!(out.retry_delay_ms, None);
        }
    }
    let dead = get(&*s, m.id).await;
    assert_eq!(dead.state, State::Dead);
    assert_eq!(dead.dead_reason, Some(DeadReason::MaxAttempts));
    assert_eq!(dead.attempts, MAX_ATTEMPTS);
    assert!(dead.finished_at.is_some(), "a dead message has finished_at");
    assert_eq!(
        failures(&dead),
        vec![(1, None), (2, None), (3, Some(DeadReason::MaxAttempts))],
        "one history entry per attempt"
    );
    assert_eq!(dead.history.len(), 3);
    assert!(
        lease(&*s, Q, 1, 30_000, at(100_000)).await.is_empty(),
        "a dead message was leased"
    );
    assert_eq!(
        tick(&*s, at(100_000)).await.next_wake,
        None,
        "a dead message needs no wake"
    );
    assert_eq!(count(&*s, Q, State::Dead).await, 1);
}

async fn nack_permanent_is_dead_now<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let out = lease_and_nack(
        &*s,
        Q,
        m.id,
        failure(ErrorClass::Permanent, "400 bad request"),
        at(0),
    )
    .await;
    assert_eq!(out.message.state, State::Dead);
    assert_eq!(out.dead_reason, Some(DeadReason::PermanentError));
    assert_eq!(out.class, ErrorClass::Permanent);
    let dead = get(&*s, m.id).await;
    assert_eq!(dead.dead_reason, Some(DeadReason::PermanentError));
    assert_eq!(dead.attempts, 1);
    assert_eq!(failures(&dead), vec![(1, Some(DeadReason::PermanentError))]);
    assert_eq!(
        dead.last_error.as_ref().map(|e| e.class),
        Some(ErrorClass::Permanent)
    );
}

async fn rate_limited_honours_retry_after_and_is_not_counted<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let mut now = 0i64;
    let limited = |after: Option<u64>| Failure {
        retry_after_ms: after,
        ..failure(ErrorClass::RateLimited, "429")
    };
    // More rate-limited failures than max_attempts: none of them counts.
    for attempt in 1..=MAX_ATTEMPTS + 1 {
        tick(&*s, at(now)).await;
        let l = lease_one(&*s, Q, m.id, 30_000, at(now)).await;
        assert_eq!(l.attempt, attempt);
        let out = nack(&*s, m.id, &l.token, limited(Some(5_000)), at(now))
            .await
            .expect("nack");
        assert_eq!(
            out.message.state,
            State::Scheduled,
            "rate-limited attempt {attempt} must not be dead"
        );
        assert_eq!(out.retry_delay_ms, Some(5_000), "retry_after is honoured");
        assert_eq!(out.message.due_at, Some(at(now + 5_000)));
        assert!(lease(&*s, Q, 1, 30_000, at(now + 4_999)).await.is_empty());
        assert!(
            tick(&*s, at(now + 4_999)).await.ready_queues.is_empty(),
            "ready before retry_after"
        );
        now += 5_000;
    }
    // Now MAX_ATTEMPTS counted (transient) failures are still allowed.
    for n in 1..=MAX_ATTEMPTS {
        tick(&*s, at(now)).await;
        let l = lease_one(&*s, Q, m.id, 30_000, at(now)).await;
        let out = nack(
            &*s,
            m.id,
            &l.token,
            failure(ErrorClass::Transient, "503"),
            at(now),
        )
        .await
        .expect("nack");
        if n < MAX_ATTEMPTS {
            assert_eq!(
                out.message.state,
                State::Scheduled,
                "counted failure {n} of {MAX_ATTEMPTS}"
            );
        } else {
            assert_eq!(
                out.dead_reason,
                Some(DeadReason::MaxAttempts),
                "counted failure {n} is the last"
            );
        }
        now += RETRY_DELAY_MS as i64;
    }
    let dead = get(&*s, m.id).await;
    assert_eq!(dead.attempts, 2 * MAX_ATTEMPTS + 1);
    assert_eq!(
        failures(&dead).len(),
        (2 * MAX_ATTEMPTS + 1) as usize,
        "one history entry per attempt"
    );
    match &dead.history[0].event {
        HistoryEvent::Failed { retry_after_ms, .. } => assert_eq!(*retry_after_ms, Some(5_000)),
        e => panic!("history entry is {e:?}"),
    }

    // retry_after is bounded by the policy; without one, the backoff applies.
    let o = publish(&*s, msg(OTHER, json!("y")), at(0)).await;
    let out = lease_and_nack(
        &*s,
        OTHER,
        o.id,
        limited(Some(2 * MAX_RETRY_AFTER_MS)),
        at(0),
    )
    .await;
    assert_eq!(
        out.retry_delay_ms,
        Some(MAX_RETRY_AFTER_MS),
        "a hostile retry_after is bounded"
    );
    assert_eq!(out.message.due_at, Some(at(MAX_RETRY_AFTER_MS as i64)));
    let p = publish(&*s, msg(OTHER, json!("z")), at(0)).await;
    let out = lease_and_nack(&*s, OTHER, p.id, limited(None), at(0)).await;
    assert_eq!(
        out.retry_delay_ms,
        Some(RETRY_DELAY_MS),
        "no retry_after: the policy's backoff"
    );
}

async fn max_age_ends_retries<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(SHORT_AGE, json!("x")), at(0)).await;
    let out = lease_and_nack(
        &*s,
        SHORT_AGE,
        m.id,
        failure(ErrorClass::Transient, "a"),
        at(0),
    )
    .await;
    assert_eq!(
        out.message.due_at,
        Some(at(1_000)),
        "first retry is inside the 1.5s window"
    );
    tick(&*s, at(1_000)).await;
    let out = lease_and_nack(
        &*s,
        SHORT_AGE,
        m.id,
        failure(ErrorClass::Transient, "b"),
        at(1_000),
    )
    .await;
    assert_eq!(
        out.message.state,
        State::Dead,
        "a retry at 2s is past created_at + 1.5s"
    );
    assert_eq!(out.dead_reason, Some(DeadReason::MaxAge));
    assert_eq!(get(&*s, m.id).await.dead_reason, Some(DeadReason::MaxAge));
}

// ---- cases: lease tokens ----

async fn wrong_token_is_lease_mismatch<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let idle = publish(&*s, msg(OTHER, json!("never leased")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 30_000, at(0)).await;
    expect_err(
        ack(&*s, m.id, "bogus", at(1)).await,
        "ack with a wrong token",
        is_mismatch,
    );
    expect_err(
        nack(
            &*s,
            m.id,
            "bogus",
            failure(ErrorClass::Transient, "x"),
            at(1),
        )
        .await,
        "nack with a wrong token",
        is_mismatch,
    );
    expect_err(
        s.extend(lref(m.id, "bogus"), 10_000, at(1)).await,
        "extend with a wrong token",
        is_mismatch,
    );
    expect_err(
        ack(&*s, idle.id, &l.token, at(1)).await,
        "another message's token",
        is_mismatch,
    );
    expect_err(
        ack(&*s, idle.id, "bogus", at(1)).await,
        "ack of a never-leased message",
        is_mismatch,
    );
    let still = get(&*s, m.id).await;
    assert_eq!(
        still.state,
        State::Leased,
        "a refused ack/nack changed the message"
    );
    assert_eq!(still.attempts, 1);
    assert!(still.history.is_empty(), "a refused ack/nack wrote history");
    assert_eq!(get(&*s, idle.id).await.state, State::Ready);
    ack(&*s, m.id, &l.token, at(2))
        .await
        .expect("the right token still acks");
}

async fn expired_lease_is_refused<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 1_000, at(0)).await;
    // At the expiry instant the lease is over, even before any tick.
    expect_err(
        ack(&*s, m.id, &l.token, at(1_000)).await,
        "ack at lease expiry",
        is_expired,
    );
    expect_err(
        nack(
            &*s,
            m.id,
            &l.token,
            failure(ErrorClass::Transient, "x"),
            at(1_000),
        )
        .await,
        "nack at lease expiry",
        is_expired,
    );
    expect_err(
        s.extend(lref(m.id, &l.token), 10_000, at(1_000)).await,
        "extend at lease expiry",
        is_expired,
    );
    let m1 = get(&*s, m.id).await;
    assert_ne!(m1.state, State::Done, "an expired lease acked the message");
    assert_eq!(m1.attempts, 1);
    let t = tick(&*s, at(1_000)).await;
    assert_eq!(t.expired.len(), 1, "tick fails the expired lease");
    expect_err(
        ack(&*s, m.id, &l.token, at(1_001)).await,
        "ack after the lease was reaped",
        is_expired,
    );
    tick(&*s, at(2_000)).await;
    let l2 = lease_one(&*s, Q, m.id, 1_000, at(2_000)).await;
    expect_err(
        ack(&*s, m.id, &l.token, at(2_001)).await,
        "the previous lease's token",
        is_mismatch,
    );
    ack(&*s, m.id, &l2.token, at(2_001))
        .await
        .expect("the current lease acks");
}

async fn tick_expires_lease_as_failed_attempt<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    lease_one(&*s, Q, m.id, 1_000, at(0)).await;
    let t = tick(&*s, at(999)).await;
    assert!(t.expired.is_empty(), "a lease expired early");
    assert_eq!(
        t.next_wake,
        Some(at(1_000)),
        "next_wake is the lease expiry"
    );
    let t = tick(&*s, at(1_000)).await;
    assert_eq!(t.expired.len(), 1);
    let out = &t.expired[0];
    assert_eq!(out.message.id, m.id);
    assert_eq!(out.class, ErrorClass::Transient);
    assert_eq!(out.retry_delay_ms, Some(RETRY_DELAY_MS));
    assert_eq!(out.message.state, State::Scheduled);
    assert_eq!(out.message.due_at, Some(at(2_000)));
    assert_eq!(t.next_wake, Some(at(2_000)));
    let got = get(&*s, m.id).await;
    assert_eq!(got.state, State::Scheduled);
    assert_eq!(got.attempts, 1, "the expired lease was the attempt");
    let le = got
        .last_error
        .as_ref()
        .expect("last_error after an expired lease");
    assert_eq!(le.code.as_deref(), Some("lease_expired"));
    assert_eq!(le.class, ErrorClass::Transient);
    assert_eq!(failures(&got), vec![(1, None)]);
    assert_eq!(got.history[0].leased_at, Some(at(0)));
    // Expired leases use up the budget like any failure.
    let mut now = 2_000;
    for attempt in 2..=MAX_ATTEMPTS {
        assert_eq!(tick(&*s, at(now)).await.ready_queues, vec![Q.to_owned()]);
        let l = lease_one(&*s, Q, m.id, 1_000, at(now)).await;
        assert_eq!(l.attempt, attempt);
        let t = tick(&*s, at(now + 1_000)).await;
        assert_eq!(t.expired.len(), 1);
        if attempt == MAX_ATTEMPTS {
            assert_eq!(t.expired[0].dead_reason, Some(DeadReason::MaxAttempts));
            assert_eq!(t.next_wake, None);
        }
        now += 2_000;
    }
    let dead = get(&*s, m.id).await;
    assert_eq!(dead.state, State::Dead);
    assert_eq!(dead.history.len(), MAX_ATTEMPTS as usize);
}

async fn ack_retried_with_same_token_succeeds<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 1_000, at(0)).await;
    ack(&*s, m.id, &l.token, at(10)).await.expect("ack");
    let again = ack(&*s, m.id, &l.token, at(20))
        .await
        .expect("a retried ack with the same token");
    assert_eq!(again.message.state, State::Done);
    let late = ack(&*s, m.id, &l.token, at(50_000))
        .await
        .expect("a retried ack after the lease time");
    assert_eq!(late.message.state, State::Done);
    let got = get(&*s, m.id).await;
    assert_eq!(got.history.len(), 1, "a retried ack wrote history again");
    assert_eq!(
        got.finished_at,
        Some(at(10)),
        "a retried ack moved finished_at"
    );
    expect_err(
        ack(&*s, m.id, "bogus", at(30)).await,
        "ack of a done message with a wrong token",
        is_mismatch,
    );
    let n = nack(
        &*s,
        m.id,
        &l.token,
        failure(ErrorClass::Transient, "x"),
        at(30),
    )
    .await;
    assert!(n.is_err(), "a nack of a done message succeeded: {n:?}");
    assert_eq!(get(&*s, m.id).await.state, State::Done, "done changed");
    assert_eq!(count(&*s, Q, State::Done).await, 1);
}

async fn extend_moves_expiry<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 1_000, at(0)).await;
    let e = s
        .extend(lref(m.id, &l.token), 5_000, at(500))
        .await
        .expect("extend");
    assert_eq!(e, at(5_500), "extend sets expiry to now + by");
    assert_eq!(get(&*s, m.id).await.lease_expires_at, Some(at(5_500)));
    let e = s
        .extend(lref(m.id, &l.token), 10, at(600))
        .await
        .expect("extend");
    assert_eq!(e, at(5_500), "extend never shortens a lease");
    let t = tick(&*s, at(1_000)).await;
    assert!(t.expired.is_empty(), "the original expiry still applied");
    assert_eq!(t.next_wake, Some(at(5_500)));
    ack(&*s, m.id, &l.token, at(2_000))
        .await
        .expect("ack inside the extended lease");
    assert_eq!(get(&*s, m.id).await.state, State::Done);
}

async fn batch_ack_nack_answer_per_item<S: Store>(s: Arc<S>) {
    let items: Vec<NewMessage> = (0..3).map(|i| msg(Q, json!(i))).collect();
    s.publish(items, at(0)).await.expect("publish");
    let ls = lease(&*s, Q, 3, 30_000, at(0)).await;
    assert_eq!(ls.len(), 3);
    let (a, b, c) = (&ls[0], &ls[1], &ls[2]);
    let r = s
        .ack(
            vec![
                lref(a.message.id, &a.token),
                lref(b.message.id, "bogus"),
                lref(c.message.id, &c.token),
            ],
            at(1),
        )
        .await
        .expect("batch ack");
    assert_eq!(r.len(), 3, "one result per item");
    assert!(
        r[0].is_ok() && r[2].is_ok(),
        "good items of a batch ack failed: {r:?}"
    );
    assert!(
        matches!(r[1], Err(StoreError::LeaseMismatch)),
        "bad item: {:?}",
        r[1]
    );
    assert_eq!(
        get(&*s, b.message.id).await.state,
        State::Leased,
        "the bad item changed"
    );
    let r = s
        .nack(
            vec![
                Nack {
                    lease: lref(b.message.id, &b.token),
                    failure: failure(ErrorClass::Transient, "x"),
                },
                Nack {
                    lease: lref(a.message.id, &a.token),
                    failure: failure(ErrorClass::Transient, "x"),
                },
                Nack {
                    lease: lref(MessageId::new(), "t"),
                    failure: failure(ErrorClass::Transient, "x"),
                },
            ],
            at(2),
        )
        .await
        .expect("batch nack");
    assert_eq!(r.len(), 3, "one result per item");
    assert_eq!(
        r[0].as_ref().map(|o| o.message.state).ok(),
        Some(State::Scheduled)
    );
    assert!(r[1].is_err(), "nack of an acked message succeeded");
    assert!(
        matches!(r[2], Err(StoreError::NotFound(_))),
        "unknown id: {:?}",
        r[2]
    );
    assert_eq!(get(&*s, a.message.id).await.state, State::Done);
}

// ---- cases: idempotent publish ----

fn with_ikey(queue: &str, ikey: &str, payload: serde_json::Value) -> NewMessage {
    NewMessage {
        idempotency_key: Some(ikey.to_owned()),
        ..msg(queue, payload)
    }
}

async fn idempotent_publish_replays_original<S: Store>(s: Arc<S>) {
    let orig = publish(&*s, with_ikey(Q, "order-1", json!({"a": 1})), at(0)).await;
    assert_eq!(orig.idempotency_key.as_deref(), Some("order-1"));
    let r = s
        .publish(vec![with_ikey(Q, "order-1", json!({"a": 1}))], at(10))
        .await
        .expect("replay");
    assert!(
        r[0].replayed,
        "a replay within the window is not reported as one"
    );
    assert_eq!(r[0].message.id, orig.id, "a replay returns the original");
    assert_eq!(r[0].message.created_at, at(0));
    assert_eq!(
        count(&*s, Q, State::Ready).await,
        1,
        "a replay created a message"
    );
    // The same JSON with its object keys in another order is the same payload.
    let reordered: serde_json::Value =
        serde_json::from_str(r#"{"b": [1, {"y": 2, "x": 1}], "a": 1}"#).expect("json");
    let k2 = publish(
        &*s,
        with_ikey(Q, "order-2", json!({"a": 1, "b": [1, {"x": 1, "y": 2}]})),
        at(11),
    )
    .await;
    let r = s
        .publish(vec![with_ikey(Q, "order-2", reordered)], at(12))
        .await
        .expect("replay");
    assert!(
        r[0].replayed && r[0].message.id == k2.id,
        "key order made a replay a conflict or a new message"
    );
    s.delete(k2.id).await.expect("delete");
    match s
        .publish(vec![with_ikey(Q, "order-1", json!({"a": 2}))], at(20))
        .await
    {
        Err(StoreError::IdempotencyConflict { index, key }) => {
            assert_eq!(index, 0);
            assert_eq!(key, "order-1");
        }
        other => panic!("same key, different payload: {other:?}"),
    }
    // Keys are per queue.
    let o = publish(&*s, with_ikey(OTHER, "order-1", json!({"a": 2})), at(30)).await;
    assert_ne!(o.id, orig.id);
    // A replay after processing returns the original as it is now, and delivers nothing.
    let l = lease_one(&*s, Q, orig.id, 30_000, at(40)).await;
    ack(&*s, orig.id, &l.token, at(41)).await.expect("ack");
    let r = s
        .publish(vec![with_ikey(Q, "order-1", json!({"a": 1}))], at(50))
        .await
        .expect("replay");
    assert!(r[0].replayed);
    assert_eq!(r[0].message.id, orig.id);
    assert_eq!(r[0].message.state, State::Done);
    assert!(
        lease(&*s, Q, 10, 30_000, at(60)).await.is_empty(),
        "a replay redelivered the message"
    );
    let total: u64 = s
        .queue_stats()
        .await
        .expect("stats")
        .iter()
        .map(|q| q.counts.iter().sum::<u64>())
        .sum();
    assert_eq!(total, 2);
}

async fn idempotency_conflict_writes_nothing<S: Store>(s: Arc<S>) {
    let orig = publish(&*s, with_ikey(Q, "k", json!(1)), at(0)).await;
    let batch = vec![
        msg(Q, json!("a")),
        with_ikey(Q, "k2", json!("b")),
        with_ikey(Q, "k", json!(2)),
    ];
    match s.publish(batch, at(10)).await {
        Err(StoreError::IdempotencyConflict { index, key }) => {
            assert_eq!(index, 2, "the conflict names the batch index");
            assert_eq!(key, "k");
        }
        other => panic!("a batch with a conflicting item: {other:?}"),
    }
    let page = s
        .search(MessageFilter::default(), 100, None)
        .await
        .expect("search");
    assert_eq!(
        msg_ids(&page.messages),
        vec![orig.id],
        "a rejected batch wrote messages"
    );
    assert_eq!(
        count(&*s, Q, State::Ready).await,
        1,
        "a rejected batch changed the counts"
    );
    // k2 was not remembered: another payload under it is no conflict.
    publish(&*s, with_ikey(Q, "k2", json!("other payload")), at(20)).await;
    // Two items of one batch with one new key and different payloads conflict too.
    let batch = vec![with_ikey(Q, "k3", json!(1)), with_ikey(Q, "k3", json!(2))];
    match s.publish(batch, at(30)).await {
        Err(StoreError::IdempotencyConflict { index, .. }) => assert_eq!(index, 1),
        other => panic!("a batch conflicting with itself: {other:?}"),
    }
    publish(&*s, with_ikey(Q, "k3", json!(3)), at(40)).await;
    // A batch mixing a replay and a new item answers both, in order.
    let r = s
        .publish(
            vec![with_ikey(Q, "k", json!(1)), msg(Q, json!("new"))],
            at(50),
        )
        .await
        .expect("batch");
    assert_eq!(r.len(), 2);
    assert!(
        r[0].replayed && r[0].message.id == orig.id,
        "item 0 is a replay"
    );
    assert!(!r[1].replayed, "item 1 is new");
    assert_eq!(count(&*s, Q, State::Ready).await, 4);
}

async fn idempotency_key_reusable_after_window<S: Store>(s: Arc<S>) {
    let w = IDEMPOTENCY_WINDOW_MS as i64;
    let orig = publish(&*s, with_ikey(Q, "w", json!(1)), at(0)).await;
    let r = s
        .publish(vec![with_ikey(Q, "w", json!(1))], at(w - 1))
        .await
        .expect("replay");
    assert!(r[0].replayed, "the key is forgotten before the window ends");
    let purged = s.purge(at(w + 1), 24 * 3_600_000).await.expect("purge");
    assert!(
        purged.idempotency_deleted >= 1,
        "purge kept an expired idempotency record"
    );
    let again = publish(&*s, with_ikey(Q, "w", json!(2)), at(w + 1)).await;
    assert_ne!(
        again.id, orig.id,
        "after the window the key creates a new message"
    );
    assert_eq!(
        get(&*s, orig.id).await.state,
        State::Ready,
        "the old message is untouched"
    );
    let r = s
        .publish(vec![with_ikey(Q, "w", json!(2))], at(w + 2))
        .await
        .expect("replay");
    assert!(
        r[0].replayed && r[0].message.id == again.id,
        "the new message owns the key now"
    );
}

// ---- cases: operator actions ----

async fn redrive_dead_gives_fresh_budget<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    lease_and_nack(&*s, Q, m.id, failure(ErrorClass::Permanent, "bad"), at(0)).await;
    let r = s
        .redrive(m.id, at(100))
        .await
        .expect("redrive of a dead message");
    assert_eq!(r.state, State::Ready);
    assert_eq!(r.due_at, Some(at(100)), "redriven messages are due now");
    assert_eq!(
        r.dead_reason, None,
        "a redriven message keeps its dead reason"
    );
    assert_eq!(r.finished_at, None);
    assert_eq!(count(&*s, Q, State::Dead).await, 0);
    assert_eq!(count(&*s, Q, State::Ready).await, 1);
    // A fresh budget: MAX_ATTEMPTS more failures before it is dead again.
    let mut now = 100;
    for n in 1..=MAX_ATTEMPTS {
        tick(&*s, at(now)).await;
        let l = lease_one(&*s, Q, m.id, 30_000, at(now)).await;
        assert_eq!(l.attempt, n + 1, "attempts keep counting across a redrive");
        let out = nack(
            &*s,
            m.id,
            &l.token,
            failure(ErrorClass::Transient, "x"),
            at(now),
        )
        .await
        .expect("nack");
        if n < MAX_ATTEMPTS {
            assert_eq!(
                out.message.state,
                State::Scheduled,
                "failure {n} after redrive is dead"
            );
        } else {
            assert_eq!(out.dead_reason, Some(DeadReason::MaxAttempts));
        }
        now += RETRY_DELAY_MS as i64;
    }
    let dead = get(&*s, m.id).await;
    assert_eq!(
        dead.history.len(),
        2 + MAX_ATTEMPTS as usize,
        "history: {:?}",
        dead.history
    );
    assert!(
        matches!(
            dead.history[0].event,
            HistoryEvent::Failed {
                dead_reason: Some(DeadReason::PermanentError),
                ..
            }
        ),
        "redrive dropped the old history"
    );
    assert_eq!(dead.history[1].event, HistoryEvent::Redriven);
    assert_eq!(dead.history[1].at, at(100));
}

async fn redrive_needs_dead_or_scheduled<S: Store>(s: Arc<S>) {
    let sch = publish(
        &*s,
        NewMessage {
            deliver_at: Some(at(60_000)),
            ..msg(OTHER, json!("s"))
        },
        at(0),
    )
    .await;
    let r = s
        .redrive(sch.id, at(10))
        .await
        .expect("redrive of a scheduled message");
    assert_eq!(r.state, State::Ready);
    assert_eq!(r.due_at, Some(at(10)));
    let done = publish(&*s, msg(Q, json!("done")), at(0)).await;
    let l = lease_one(&*s, Q, done.id, 30_000, at(0)).await;
    ack(&*s, done.id, &l.token, at(1)).await.expect("ack");
    let leased = publish(&*s, msg(Q, json!("leased")), at(2)).await;
    lease_one(&*s, Q, leased.id, 30_000, at(2)).await;
    let ready = publish(&*s, msg(Q, json!("ready")), at(3)).await;
    for (id, st) in [
        (ready.id, State::Ready),
        (leased.id, State::Leased),
        (done.id, State::Done),
    ] {
        match s.redrive(id, at(4)).await {
            Err(StoreError::InvalidState { state, .. }) => assert_eq!(state, st),
            other => panic!("redrive of a {} message: {other:?}", st.as_str()),
        }
        assert_eq!(
            get(&*s, id).await.state,
            st,
            "a refused redrive changed the message"
        );
    }
}

async fn kill_makes_dead_killed<S: Store>(s: Arc<S>) {
    let l_msg = publish(&*s, msg(Q, json!("leased")), at(0)).await;
    lease_one(&*s, Q, l_msg.id, 30_000, at(0)).await;
    let r_msg = publish(&*s, msg(Q, json!("ready")), at(1)).await;
    let s_msg = publish(
        &*s,
        NewMessage {
            deliver_at: Some(at(9_000)),
            ..msg(Q, json!("later"))
        },
        at(2),
    )
    .await;
    for id in [s_msg.id, r_msg.id, l_msg.id] {
        let k = s
            .kill(id, Some("poison".into()), at(10))
            .await
            .expect("kill");
        assert_eq!(k.state, State::Dead);
        assert_eq!(k.dead_reason, Some(DeadReason::Killed));
        let got = get(&*s, id).await;
        assert_eq!(got.dead_reason, Some(DeadReason::Killed));
        assert_eq!(got.finished_at, Some(at(10)));
        assert_eq!(
            got.history.last().map(|h| &h.event),
            Some(&HistoryEvent::Killed {
                reason: Some("poison".into())
            }),
            "kill is in the history"
        );
    }
    assert_eq!(count(&*s, Q, State::Dead).await, 3);
    assert!(
        tick(&*s, at(9_000)).await.ready_queues.is_empty(),
        "a killed scheduled message became ready"
    );
    assert!(
        lease(&*s, Q, 10, 30_000, at(9_000)).await.is_empty(),
        "a killed message was leased"
    );
    match s.kill(s_msg.id, None, at(20)).await {
        Err(StoreError::InvalidState {
            state: State::Dead, ..
        }) => {}
        other => panic!("kill of a dead message: {other:?}"),
    }
    let d = publish(&*s, msg(OTHER, json!("done")), at(0)).await;
    let l = lease_one(&*s, OTHER, d.id, 30_000, at(0)).await;
    ack(&*s, d.id, &l.token, at(1)).await.expect("ack");
    match s.kill(d.id, None, at(20)).await {
        Err(StoreError::InvalidState {
            state: State::Done, ..
        }) => {}
        other => panic!("kill of a done message: {other:?}"),
    }
    assert_eq!(get(&*s, d.id).await.state, State::Done);
    let r = s
        .redrive(r_msg.id, at(30))
        .await
        .expect("redrive of a killed message");
    assert_eq!(r.state, State::Ready);
}

async fn killed_lease_token_is_expired<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 30_000, at(0)).await;
    s.kill(m.id, None, at(1))
        .await
        .expect("kill of a leased message");
    expect_err(
        ack(&*s, m.id, &l.token, at(2)).await,
        "ack of a killed message",
        is_expired,
    );
    expect_err(
        nack(
            &*s,
            m.id,
            &l.token,
            failure(ErrorClass::Transient, "x"),
            at(2),
        )
        .await,
        "nack of a killed message",
        is_expired,
    );
    expect_err(
        s.extend(lref(m.id, &l.token), 1_000, at(2)).await,
        "extend of a killed message",
        is_expired,
    );
    let t = tick(&*s, at(30_000)).await;
    assert!(
        t.expired.is_empty(),
        "the killed message's lease expired later: {:?}",
        t.expired
    );
    let got = get(&*s, m.id).await;
    assert_eq!(got.state, State::Dead);
    assert_eq!(got.dead_reason, Some(DeadReason::Killed));
}

async fn delete_removes_message<S: Store>(s: Arc<S>) {
    let m = publish(&*s, with_ikey(Q, "ik", json!(1)), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 30_000, at(0)).await;
    let d = s.delete(m.id).await.expect("delete");
    assert_eq!(d.id, m.id);
    assert_eq!(
        s.get(m.id).await.expect("get"),
        None,
        "a deleted message is still there"
    );
    expect_err(
        s.delete(m.id).await,
        "delete of a deleted message",
        is_not_found,
    );
    expect_err(
        ack(&*s, m.id, &l.token, at(1)).await,
        "ack of a deleted message",
        is_not_found,
    );
    assert_eq!(
        stats(&*s, Q).await,
        None,
        "a queue without messages is still in the stats"
    );
    assert_eq!(
        tick(&*s, at(30_000)).await.expired.len(),
        0,
        "a deleted lease expired"
    );
    // Its idempotency record went with it.
    let again = publish(&*s, with_ikey(Q, "ik", json!(2)), at(2)).await;
    assert_ne!(again.id, m.id);
    let dead = publish(&*s, msg(Q, json!("dead")), at(3)).await;
    s.kill(dead.id, None, at(3)).await.expect("kill");
    s.delete(dead.id).await.expect("delete of a dead message");
    assert_eq!(count(&*s, Q, State::Dead).await, 0);
    assert_eq!(count(&*s, Q, State::Ready).await, 1);
}

async fn unknown_id_is_not_found<S: Store>(s: Arc<S>) {
    publish(&*s, msg(Q, json!("x")), at(0)).await;
    let id = MessageId::new();
    assert_eq!(s.get(id).await.expect("get"), None);
    expect_err(ack(&*s, id, "t", at(1)).await, "ack", is_not_found);
    expect_err(
        nack(&*s, id, "t", failure(ErrorClass::Transient, "x"), at(1)).await,
        "nack",
        is_not_found,
    );
    expect_err(
        s.extend(lref(id, "t"), 1, at(1)).await,
        "extend",
        is_not_found,
    );
    expect_err(s.redrive(id, at(1)).await, "redrive", is_not_found);
    expect_err(s.kill(id, None, at(1)).await, "kill", is_not_found);
    expect_err(s.delete(id).await, "delete", is_not_found);
}

// ---- cases: per-key ordering ----

async fn key_ordering_holds_later_message<S: Store>(s: Arc<S>) {
    let k1 = publish(&*s, keyed(ORDERED, "k", 1), at(0)).await;
    let k2 = publish(&*s, keyed(ORDERED, "k", 2), at(0)).await;
    let free = publish(&*s, msg(ORDERED, json!("no key")), at(0)).await;
    let other = publish(&*s, keyed(ORDERED, "other", 1), at(0)).await;
    let first = lease(&*s, ORDERED, 10, 30_000, at(0)).await;
    assert_eq!(
        ids(&first),
        vec![k1.id, free.id, other.id],
        "only the head of key k is leasable"
    );
    assert!(
        lease(&*s, ORDERED, 10, 30_000, at(0)).await.is_empty(),
        "k2 leased while k1 is leased"
    );
    let out = nack(
        &*s,
        k1.id,
        &first[0].token,
        failure(ErrorClass::Transient, "x"),
        at(10),
    )
    .await
    .expect("nack");
    assert_eq!(out.message.state, State::Scheduled);
    assert!(
        lease(&*s, ORDERED, 10, 30_000, at(10)).await.is_empty(),
        "k2 leased while k1 waits to retry"
    );
    tick(&*s, at(1_010)).await;
    let again = lease(&*s, ORDERED, 10, 30_000, at(1_010)).await;
    assert_eq!(
        ids(&again),
        vec![k1.id],
        "the retried head comes first, k2 still waits"
    );
    assert!(lease(&*s, ORDERED, 10, 30_000, at(1_010)).await.is_empty());
    ack(&*s, k1.id, &again[0].token, at(1_020))
        .await
        .expect("ack");
    let next = lease(&*s, ORDERED, 10, 30_000, at(1_020)).await;
    assert_eq!(ids(&next), vec![k2.id], "k2 is leasable once k1 is done");
    // New messages wait behind the leased head of their own key only.
    let k3 = publish(&*s, keyed(ORDERED, "k", 3), at(1_030)).await;
    let o2 = publish(&*s, keyed(ORDERED, "other", 2), at(1_030)).await;
    let l = lease(&*s, ORDERED, 10, 30_000, at(1_030)).await;
    assert!(!ids(&l).contains(&k3.id), "k3 leased while k2 is leased");
    assert!(
        !ids(&l).contains(&o2.id),
        "other/2 leased while other/1 is leased"
    );
    ack(&*s, other.id, &first[2].token, at(1_040))
        .await
        .expect("ack");
    assert_eq!(
        ids(&lease(&*s, ORDERED, 10, 30_000, at(1_040)).await),
        vec![o2.id]
    );
}

async fn key_ordering_on_dead_skip_releases_key<S: Store>(s: Arc<S>) {
    let k1 = publish(&*s, keyed(ORDERED, "k", 1), at(0)).await;
    let k2 = publish(&*s, keyed(ORDERED, "k", 2), at(0)).await;
    let out = lease_and_nack(
        &*s,
        ORDERED,
        k1.id,
        failure(ErrorClass::Permanent, "bad"),
        at(0),
    )
    .await;
    assert_eq!(out.message.state, State::Dead);
    let next = lease(&*s, ORDERED, 10, 30_000, at(1)).await;
    assert_eq!(
        ids(&next),
        vec![k2.id],
        "on_dead = skip: a dead message releases its key"
    );
}

async fn key_ordering_on_dead_block_holds_key<S: Store>(s: Arc<S>) {
    let q = ORDERED_BLOCK;
    let k1 = publish(&*s, keyed(q, "k", 1), at(0)).await;
    let k2 = publish(&*s, keyed(q, "k", 2), at(0)).await;
    let x = publish(&*s, keyed(q, "x", 1), at(0)).await;
    let free = publish(&*s, msg(q, json!("no key")), at(0)).await;
    let first = lease(&*s, q, 10, 30_000, at(0)).await;
    assert_eq!(ids(&first), vec![k1.id, x.id, free.id]);
    nack(
        &*s,
        k1.id,
        &first[0].token,
        failure(ErrorClass::Permanent, "bad"),
        at(1),
    )
    .await
    .expect("nack");
    assert!(
        lease(&*s, q, 10, 30_000, at(2)).await.is_empty(),
        "on_dead = block: k2 leased behind dead k1"
    );
    let x2 = publish(&*s, keyed(q, "x", 2), at(2)).await;
    ack(&*s, x.id, &first[1].token, at(3)).await.expect("ack");
    assert_eq!(
        ids(&lease(&*s, q, 10, 30_000, at(3)).await),
        vec![x2.id],
        "another key is not blocked"
    );
    // Redrive releases the block: k1 first, then k2.
    s.redrive(k1.id, at(4)).await.expect("redrive");
    let l1 = lease(&*s, q, 10, 30_000, at(4)).await;
    assert_eq!(
        ids(&l1),
        vec![k1.id],
        "the redriven head first, k2 still waits"
    );
    ack(&*s, k1.id, &l1[0].token, at(5)).await.expect("ack");
    let l2 = lease(&*s, q, 10, 30_000, at(5)).await;
    assert_eq!(ids(&l2), vec![k2.id]);
    ack(&*s, k2.id, &l2[0].token, at(6)).await.expect("ack");
    // Delete releases it too; so does nothing else (a kill blocks like any death).
    let k3 = publish(&*s, keyed(q, "k", 3), at(7)).await;
    let k4 = publish(&*s, keyed(q, "k", 4), at(7)).await;
    lease_one(&*s, q, k3.id, 30_000, at(7)).await;
    s.kill(k3.id, None, at(8)).await.expect("kill");
    assert!(
        lease(&*s, q, 10, 30_000, at(8)).await.is_empty(),
        "k4 leased behind killed k3"
    );
    s.delete(k3.id).await.expect("delete");
    assert_eq!(
        ids(&lease(&*s, q, 10, 30_000, at(9)).await),
        vec![k4.id],
        "delete releases the key"
    );
}

async fn key_ordering_one_lease_per_key_after_redrive<S: Store>(s: Arc<S>) {
    // on_dead = skip: k1 dies, k2 is leased, then an operator redrives k1. At most one
    // message of a key is leased at a time, so k1 waits until k2 is finished.
    let k1 = publish(&*s, keyed(ORDERED, "k", 1), at(0)).await;
    let k2 = publish(&*s, keyed(ORDERED, "k", 2), at(0)).await;
    lease_and_nack(
        &*s,
        ORDERED,
        k1.id,
        failure(ErrorClass::Permanent, "bad"),
        at(0),
    )
    .await;
    let l2 = lease_one(&*s, ORDERED, k2.id, 30_000, at(1)).await;
    s.redrive(k1.id, at(2)).await.expect("redrive");
    let l = lease(&*s, ORDERED, 10, 30_000, at(3)).await;
    assert!(
        l.is_empty(),
        "two messages of key k leased at once: {:?}",
        ids(&l)
    );
    ack(&*s, k2.id, &l2.token, at(4)).await.expect("ack");
    assert_eq!(
        ids(&lease(&*s, ORDERED, 10, 30_000, at(5)).await),
        vec![k1.id]
    );
}

// ---- cases: operator reads ----

async fn search_filters<S: Store>(s: Arc<S>) {
    let a = publish(
        &*s,
        NewMessage {
            key: Some("k1".into()),
            ..msg(Q, json!({"city": "Berlin"}))
        },
        at(0),
    )
    .await;
    let b = publish(
        &*s,
        NewMessage {
            failed: Some(failure(ErrorClass::Transient, "upstream 503 timeout")),
            ..msg(Q, json!({"city": "Paris"}))
        },
        at(1_000),
    )
    .await;
    let c = publish(
        &*s,
        NewMessage {
            failed: Some(failure(ErrorClass::Permanent, "invalid vat number")),
            ..msg(OTHER, json!({"city": "Rome"}))
        },
        at(2_000),
    )
    .await;
    let d = publish(
        &*s,
        NewMessage {
            key: Some("k2".into()),
            ..msg(Q, json!({"note": "50%_off"}))
        },
        at(3_000),
    )
    .await;
    let e = publish(&*s, msg(Q, json!({"note": "500 off"})), at(4_000)).await;
    assert_eq!(b.state, State::Scheduled);
    assert_eq!(c.state, State::Dead);
    let find = |f: MessageFilter| {
        let s = s.clone();
        async move {
            let desc = format!("{f:?}");
            let page = s.search(f, 100, None).await.expect("search");
            assert!(
                page.next_cursor.is_none(),
                "{desc}: a cursor on a short result"
            );
            assert!(
                page.messages.iter().all(|m| m.history.is_empty()),
                "{desc}: listings carry history"
            );
            (desc, msg_ids(&page.messages))
        }
    };
    let cases: Vec<(MessageFilter, Vec<MessageId>)> = vec![
        (MessageFilter::default(), vec![e.id, d.id, c.id, b.id, a.id]),
        (
            MessageFilter {
                queue: Some(Q.into()),
                ..Default::default()
            },
            vec![e.id, d.id, b.id, a.id],
        ),
        (
            MessageFilter {
                queue: Some(OTHER.into()),
                ..Default::default()
            },
            vec![c.id],
        ),
        (
            MessageFilter {
                state: Some(State::Dead),
                ..Default::default()
            },
            vec![c.id],
        ),
        (
            MessageFilter {
                queue: Some(Q.into()),
                state: Some(State::Ready),
                ..Default::default()
            },
            vec![e.id, d.id, a.id],
        ),
        (
            MessageFilter {
                queue: Some(Q.into()),
                state: Some(State::Scheduled),
                ..Default::default()
            },
            vec![b.id],
        ),
        (
            MessageFilter {
                key: Some("k1".into()),
                ..Default::default()
            },
            vec![a.id],
        ),
        (
            MessageFilter {
                error_class: Some(ErrorClass::Transient),
                ..Default::default()
            },
            vec![b.id],
        ),
        (
            MessageFilter {
                error_class: Some(ErrorClass::Permanent),
                ..Default::default()
            },
            vec![c.id],
        ),
        (
            MessageFilter {
                text: Some("Paris".into()),
                ..Default::default()
            },
            vec![b.id],
        ),
        (
            MessageFilter {
                text: Some("503".into()),
                ..Default::default()
            },
            vec![b.id],
        ),
        (
            MessageFilter {
                text: Some("vat number".into()),
                ..Default::default()
            },
            vec![c.id],
        ),
        (
            MessageFilter {
                text: Some("50%_".into()),
                ..Default::default()
            },
            vec![d.id],
        ),
        (
            MessageFilter {
                text: Some("Berlin".into()),
                queue: Some(OTHER.into()),
                ..Default::default()
            },
            vec![],
        ),
        (
            MessageFilter {
                since: Some(at(1_000)),
                ..Default::default()
            },
            vec![e.id, d.id, c.id, b.id],
        ),
        (
            MessageFilter {
                until: Some(at(2_000)),
                ..Default::default()
            },
            vec![b.id, a.id],
        ),
        (
            MessageFilter {
                since: Some(at(1_000)),
                until: Some(at(3_000)),
                ..Default::default()
            },
            vec![c.id, b.id],
        ),
    ];
    for (filter, want) in cases {
        let (desc, got) = find(filter).await;
        assert_eq!(got, want, "search {desc}");
    }
}

async fn search_pages_newest_first<S: Store>(s: Arc<S>) {
    const N: usize = 25;
    let mut published = Vec::new();
    for i in 0..N {
        published.push(
            publish(&*s, msg("page", json!({ "i": i })), at(i as i64))
                .await
                .id,
        );
        publish(&*s, msg("noise", json!({ "i": i })), at(i as i64)).await;
    }
    let want: Vec<MessageId> = published.iter().rev().copied().collect();
    let filter = MessageFilter {
        queue: Some("page".into()),
        ..Default::default()
    };
    let mut got: Vec<MessageId> = Vec::new();
    let mut cursor = None;
    for page_no in 0.. {
        assert!(page_no <= N / 10 + 1, "pagination does not end");
        let page = s.search(filter.clone(), 10, cursor).await.expect("search");
        assert!(page.messages.len() <= 10, "page over the limit");
        if page_no == 0 {
            assert_eq!(page.messages.len(), 10);
            assert!(
                page.next_cursor.is_some(),
                "a full first page of 25 has no cursor"
            );
            // A message published between pages is newer than the cursor: no duplicate, no gap.
            publish(&*s, msg("page", json!("late")), at(100)).await;
        }
        got.extend(msg_ids(&page.messages));
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    let unique: HashSet<MessageId> = got.iter().copied().collect();
    assert_eq!(unique.len(), got.len(), "a message appeared on two pages");
    assert_eq!(got, want, "pages are not the whole result, newest first");
}

/// A cursor is opaque: only a `next_cursor` may come back. Anything else is
/// [`StoreError::InvalidCursor`] (a 400), never a backend error or a silent empty page.
async fn search_rejects_invalid_cursor<S: Store>(s: Arc<S>) {
    for i in 0..3 {
        publish(&*s, msg(Q, json!({ "i": i })), at(i)).await;
    }
    let filter = MessageFilter::default();
    let first = s.search(filter.clone(), 2, None).await.expect("search");
    let good = first.next_cursor.expect("a cursor after a full first page");
    for bad in [
        "garbage",
        "-1",
        "0",
        "",
        " 5",
        "5 ",
        "+5",
        "1e3",
        "99999999999999999999999",
    ] {
        match s.search(filter.clone(), 2, Some(bad.to_owned())).await {
            Err(StoreError::InvalidCursor(c)) => assert_eq!(c, bad, "the error names the cursor"),
            other => panic!("cursor {bad:?}: expected InvalidCursor, got {other:?}"),
        }
    }
    let next = s
        .search(filter, 2, Some(good))
        .await
        .expect("a real cursor still works");
    assert_eq!(next.messages.len(), 1, "the second page");
}

async fn purge_deletes_old_done_never_dead<S: Store>(s: Arc<S>) {
    let a = publish(&*s, msg(Q, json!("a")), at(0)).await;
    let b = publish(&*s, msg(Q, json!("b")), at(0)).await;
    let ls = lease(&*s, Q, 2, 60_000, at(0)).await;
    assert_eq!(ids(&ls), vec![a.id, b.id]);
    ack(&*s, a.id, &ls[0].token, at(10)).await.expect("ack");
    ack(&*s, b.id, &ls[1].token, at(5_000)).await.expect("ack");
    let c = publish(
        &*s,
        NewMessage {
            failed: Some(failure(ErrorClass::Permanent, "x")),
            ..msg(Q, json!("c"))
        },
        at(10),
    )
    .await;
    assert_eq!(c.state, State::Dead);
    let d = publish(&*s, msg(Q, json!("d")), at(20)).await;
    let p = s.purge(at(10_000), 6_000).await.expect("purge");
    assert_eq!(
        p.done_deleted,
        vec![(Q.to_owned(), 1)],
        "only done messages finished before now - retention"
    );
    assert_eq!(
        s.get(a.id).await.expect("get"),
        None,
        "an old done message survived purge"
    );
    assert_eq!(
        get(&*s, b.id).await.state,
        State::Done,
        "a recent done message was purged"
    );
    assert_eq!(
        count(&*s, Q, State::Done).await,
        1,
        "purge did not update the counts"
    );
    let p = s.purge(at(1_000_000_000), 0).await.expect("purge");
    assert_eq!(p.done_deleted, vec![(Q.to_owned(), 1)]);
    assert_eq!(
        get(&*s, c.id).await.state,
        State::Dead,
        "purge deleted a dead message"
    );
    assert_eq!(
        get(&*s, d.id).await.state,
        State::Ready,
        "purge deleted a ready message"
    );
    let p = s.purge(at(2_000_000_000), 0).await.expect("purge");
    assert_eq!(
        p.done_deleted.iter().map(|(_, n)| n).sum::<u64>(),
        0,
        "nothing left to purge"
    );
    assert_eq!(count(&*s, Q, State::Dead).await, 1);
}

async fn queue_stats_counts_per_state<S: Store>(s: Arc<S>) {
    assert!(
        s.queue_stats().await.expect("stats").is_empty(),
        "an empty store has queue stats"
    );
    let dn = publish(&*s, msg(Q, json!("done")), at(0)).await;
    let l1 = publish(&*s, msg(Q, json!("leased")), at(0)).await;
    let ls = lease(&*s, Q, 2, 30_000, at(0)).await;
    assert_eq!(ids(&ls), vec![dn.id, l1.id]);
    ack(&*s, dn.id, &ls[0].token, at(1)).await.expect("ack");
    let x = publish(&*s, msg(Q, json!("dead")), at(10)).await;
    lease_and_nack(&*s, Q, x.id, failure(ErrorClass::Permanent, "x"), at(10)).await;
    publish(
        &*s,
        NewMessage {
            priority: 9,
            ..msg(Q, json!("r2"))
        },
        at(100),
    )
    .await;
    publish(&*s, msg(Q, json!("r1")), at(200)).await;
    publish(
        &*s,
        NewMessage {
            deliver_at: Some(at(5_000)),
            ..msg(Q, json!("s1"))
        },
        at(200),
    )
    .await;
    let o = publish(&*s, msg(OTHER, json!("o")), at(300)).await;
    let q = stats(&*s, Q).await.expect("stats of q");
    for (state, n) in [
        (State::Scheduled, 1),
        (State::Ready, 2),
        (State::Leased, 1),
        (State::Done, 1),
        (State::Dead, 1),
    ] {
        assert_eq!(
            q.count(state),
            n,
            "count of {} in {:?}",
            state.as_str(),
            q.counts
        );
    }
    assert_eq!(
        q.oldest_ready_due,
        Some(at(100)),
        "oldest ready due over all priorities"
    );
    let other = stats(&*s, OTHER).await.expect("stats of other");
    assert_eq!(other.count(State::Ready), 1);
    assert_eq!(other.oldest_ready_due, Some(at(300)));
    s.delete(o.id).await.expect("delete");
    assert_eq!(
        stats(&*s, OTHER).await,
        None,
        "a queue without messages is still listed"
    );
    let all = s.queue_stats().await.expect("stats");
    assert_eq!(all.len(), 1, "stats: {all:?}");
}

async fn publish_with_failure_is_first_attempt<S: Store>(s: Arc<S>) {
    let p = s
        .publish(
            vec![NewMessage {
                failed: Some(failure(ErrorClass::Transient, "seen elsewhere")),
                ..msg(Q, json!("t"))
            }],
            at(0),
        )
        .await
        .expect("publish");
    let m = &p[0].message;
    let f = p[0]
        .failure
        .as_ref()
        .expect("a publish with `failed` reports the policy's decision");
    assert_eq!(f.class, ErrorClass::Transient);
    assert_eq!(f.retry_delay_ms, Some(RETRY_DELAY_MS));
    assert_eq!(f.dead_reason, None);
    assert_eq!(m.state, State::Scheduled);
    assert_eq!(m.attempts, 1, "the reported failure is attempt 1");
    assert_eq!(m.due_at, Some(at(1_000)));
    assert_eq!(
        m.last_error.as_ref().and_then(|e| e.message.as_deref()),
        Some("seen elsewhere")
    );
    let got = get(&*s, m.id).await;
    assert_eq!(
        failures(&got),
        vec![(1, None)],
        "history has the reported failure"
    );
    assert_eq!(count(&*s, Q, State::Scheduled).await, 1);
    // It counts against max_attempts: two more failures and it is dead.
    let mut now = 1_000;
    for attempt in 2..=MAX_ATTEMPTS {
        tick(&*s, at(now)).await;
        let l = lease_one(&*s, Q, m.id, 30_000, at(now)).await;
        assert_eq!(l.attempt, attempt);
        nack(
            &*s,
            m.id,
            &l.token,
            failure(ErrorClass::Transient, "x"),
            at(now),
        )
        .await
        .expect("nack");
        now += RETRY_DELAY_MS as i64;
    }
    assert_eq!(
        get(&*s, m.id).await.dead_reason,
        Some(DeadReason::MaxAttempts)
    );

    let p = s
        .publish(
            vec![
                NewMessage {
                    failed: Some(failure(ErrorClass::Permanent, "bad")),
                    ..msg(OTHER, json!("p"))
                },
                NewMessage {
                    failed: Some(Failure {
                        retry_after_ms: Some(5_000),
                        ..failure(ErrorClass::RateLimited, "429")
                    }),
                    ..msg(OTHER, json!("r"))
                },
            ],
            at(0),
        )
        .await
        .expect("publish");
    assert_eq!(p[0].message.state, State::Dead);
    assert_eq!(p[0].message.dead_reason, Some(DeadReason::PermanentError));
    assert_eq!(
        p[0].failure.as_ref().and_then(|f| f.dead_reason),
        Some(DeadReason::PermanentError)
    );
    assert_eq!(p[0].message.attempts, 1);
    assert_eq!(p[1].message.state, State::Scheduled);
    assert_eq!(
        p[1].message.due_at,
        Some(at(5_000)),
        "retry_after of a reported failure is honoured"
    );
    assert_eq!(count(&*s, OTHER, State::Dead).await, 1);
}
