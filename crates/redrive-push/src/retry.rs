//! The retry engine in-process (SPEC §1, S6): `retry(policy, classify, op)` for a Rust
//! service that calls an API itself, with the policy code the server uses.
//!
//! After a failed attempt the delay comes from [`RetryPolicy::decide`] with a
//! [`FailureContext`] filled as the store fills it (`decide_into` in
//! `redrive-storage/src/sqlite/transitions.rs`):
//! - `counted_attempts`: attempts made, less the rate-limited ones left uncharged, at least 1
//!   (`Row::counted_attempts().max(1)`; there is no redrive in-process, so no budget base);
//! - `window_start`: when the first attempt was made (the `max_age` window);
//! - `prev_delay_ms`: the delay chosen after the previous failure;
//! - `uncharged_rate_limited`: rate-limited attempts left uncharged so far, the failed one
//!   excluded; a `Retry { counted: false }` adds one.
//!
//! Time is a monotonic clock (tokio's [`Instant`], so tests can pause it) counted in
//! milliseconds from the [`Retrier`]'s epoch; the policy sees it as a [`Timestamp`] of that
//! many milliseconds (only differences matter to it).
//!
//! # A shared breaker
//!
//! [`Retrier::breaker`] puts every attempt behind an endpoint's [`Protection`], shared by
//! every call and task that uses the same `Arc` (so a whole service stops calling a dead
//! downstream). While it answers [`crate::protect::Wait`] the call is **parked**: it sleeps
//! until `until_ms` and asks again; the wait is not an attempt and is not charged. The first
//! attempt is acquired as a first attempt, later ones as retries (the retry budget applies
//! to them). Outcomes are recorded with [`Outcome::from_class`] (delivered and `permanent`
//! count as the endpoint being up).
//!
//! Parking is bounded by the policy's `max_age`: when the protection would not admit the
//! call before the window (from the first attempt, or from the `retry` call if none was
//! made) ends, the call stops: [`RetryError::Exhausted`] with `max_age` and the last error,
//! or [`RetryError::NeverAdmitted`] if it never got to make an attempt.
//!
//! All [`Protection`] readings of one shared breaker must come from one clock: build the
//! [`Retrier`] once per downstream and clone it (clones share the epoch), or give other
//! ones the same epoch with [`Retrier::with_epoch`]. If a future of [`Retrier::run`] is
//! dropped while its attempt is in flight (a caller's timeout), the acquisition is
//! cancelled ([`Protection::cancel_as`]): the in-flight slot comes back, no outcome is
//! recorded.

use crate::classify::{Attempt, Rules, Verdict};
use crate::protect::{Outcome, Protection};
use redrive_core::{
    DeadReason, Decision, Failure, FailureContext, RetryPolicy, SplitMix64, Timestamp,
};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::time::{sleep, Duration, Instant};

/// Why [`retry`] gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryError<E> {
    /// The policy said dead after the last attempt (or the breaker kept the call parked
    /// past `max_age`).
    Exhausted {
        /// `max_attempts`, `max_age`, `permanent_error`, or `endpoint_gone` (a 410 through
        /// [`http_failure`]).
        reason: DeadReason,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's error.
        last: E,
    },
    /// The protection never admitted the first attempt within `max_age`.
    NeverAdmitted {
        /// How long the call was parked, ms.
        waited_ms: u64,
    },
}

impl<E> RetryError<E> {
    /// Attempts made.
    pub fn attempts(&self) -> u32 {
        match self {
            Self::Exhausted { attempts, .. } => *attempts,
            Self::NeverAdmitted { .. } => 0,
        }
    }

    /// The last attempt's error, if an attempt was made.
    pub fn last(&self) -> Option<&E> {
        match self {
            Self::Exhausted { last, .. } => Some(last),
            Self::NeverAdmitted { .. } => None,
        }
    }

    /// The last attempt's error, if an attempt was made.
    pub fn into_last(self) -> Option<E> {
        match self {
            Self::Exhausted { last, .. } => Some(last),
            Self::NeverAdmitted { .. } => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for RetryError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exhausted {
                reason,
                attempts,
                last,
            } => write!(
                f,
                "gave up after {attempts} attempt(s) ({}): {last}",
                reason.as_str()
            ),
            Self::NeverAdmitted { waited_ms } => write!(
                f,
                "the downstream's protection admitted no attempt in {waited_ms} ms (max_age)"
            ),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for RetryError<E> {}

/// Calls `op` until it succeeds or the policy says dead, with `classify` telling what an
/// error means; no breaker. `op` gets the attempt number, from 1. See [`Retrier`] for a
/// shared breaker or a fixed seed.
pub async fn retry<T, E, Fut>(
    policy: &RetryPolicy,
    classify: impl FnMut(&E) -> Failure,
    op: impl FnMut(u32) -> Fut,
) -> Result<T, RetryError<E>>
where
    Fut: Future<Output = Result<T, E>>,
{
    Retrier::new(policy.clone()).run(classify, op).await
}

/// Distinct seeds for the runs of one process (jitter must not synchronise callers).
static RUNS: AtomicU64 = AtomicU64::new(0);

/// The retry engine with its options: a policy, optionally a shared breaker and a seed.
/// Cheap to clone; clones share the clock's epoch.
#[derive(Debug, Clone)]
pub struct Retrier {
    policy: RetryPolicy,
    breaker: Option<Arc<Mutex<Protection>>>,
    epoch: Instant,
    seed: Option<u64>,
}

impl Retrier {
    /// A retrier with `policy`, no breaker, a clock starting now, a random seed per run.
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            breaker: None,
            epoch: Instant::now(),
            seed: None,
        }
    }

    /// Put every attempt behind this endpoint protection (shared; see the module docs).
    pub fn breaker(mut self, protection: Arc<Mutex<Protection>>) -> Self {
        self.breaker = Some(protection);
        self
    }

    /// The same jitter for every run (tests, reproductions). By default each run draws
    /// its own seed, so that callers failing together do not retry together.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Count time from `epoch` (to share a breaker with another retrier's clock).
    pub fn with_epoch(mut self, epoch: Instant) -> Self {
        self.epoch = epoch;
        self
    }

    /// The clock's epoch.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Milliseconds since the epoch: the clock given to the [`Protection`].
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    fn run_seed(&self) -> u64 {
        if let Some(seed) = self.seed {
            return seed;
        }
        let n = RUNS.fetch_add(1, Ordering::Relaxed);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        SplitMix64::new(t ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64()
    }

    /// Calls `op` until it succeeds or the policy says dead (see [`retry`]); parks while
    /// the breaker, if any, says wait.
    pub async fn run<T, E, Fut>(
        &self,
        mut classify: impl FnMut(&E) -> Failure,
        mut op: impl FnMut(u32) -> Fut,
    ) -> Result<T, RetryError<E>>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        let policy = &self.policy;
        let mut rng = SplitMix64::new(self.run_seed());
        let called_at = self.now_ms();
        let mut window_start: Option<u64> = None;
        let mut attempts = 0u32;
        let mut uncharged = 0u32;
        let mut prev_delay_ms: Option<u64> = None;
        let mut last: Option<E> = None;
        loop {
            let is_retry = attempts > 0;
            let mut slot = None;
            if let Some(protection) = &self.breaker {
                loop {
                    let now = self.now_ms();
                    let res = lock(protection).try_acquire(now, is_retry);
                    let Err(wait) = res else { break };
                    let deadline = window_start
                        .unwrap_or(called_at)
                        .saturating_add(policy.max_age_ms);
                    if wait.until_ms > deadline {
                        return Err(match last.take() {
                            Some(last) => RetryError::Exhausted {
                                reason: DeadReason::MaxAge,
                                attempts,
                                last,
                            },
                            None => RetryError::NeverAdmitted {
                                waited_ms: now - called_at,
                            },
                        });
                    }
                    sleep(Duration::from_millis(
                        wait.until_ms.saturating_sub(now).max(1),
                    ))
                    .await;
                }
                slot = Some(Slot {
                    retrier: self,
                    protection,
                    is_retry,
                    done: false,
                });
            }
            attempts += 1;
            let started = *window_start.get_or_insert_with(|| self.now_ms());
            let result = op(attempts).await;
            let now = self.now_ms();
            let error = match result {
                Ok(value) => {
                    if let Some(slot) = slot {
                        slot.record(Outcome::Success);
                    }
                    return Ok(value);
                }
                Err(e) => e,
            };
            let failure = classify(&error);
            if let Some(slot) = slot {
                slot.record(Outcome::from_class(Some(failure.class)));
            }
            let ctx = FailureContext {
                counted_attempts: attempts.saturating_sub(uncharged).max(1),
                window_start: Timestamp::from_millis(ms_i64(started)),
                now: Timestamp::from_millis(ms_i64(now)),
                prev_delay_ms,
                uncharged_rate_limited: uncharged,
            };
            match policy.decide(&ctx, &failure, &mut rng) {
                Decision::Retry {
                    delay_ms, counted, ..
                } => {
                    if !counted {
                        uncharged += 1;
                    }
                    prev_delay_ms = Some(delay_ms);
                    last = Some(error);
                    sleep(Duration::from_millis(delay_ms)).await;
                }
                Decision::Dead { reason } => {
                    return Err(RetryError::Exhausted {
                        reason,
                        attempts,
                        last: error,
                    })
                }
            }
        }
    }
}

fn ms_i64(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// The protection's lock; a panic elsewhere while holding it leaves a usable state (every
/// method leaves it consistent before it could panic), so poisoning is ignored.
fn lock(protection: &Mutex<Protection>) -> MutexGuard<'_, Protection> {
    protection.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An acquired attempt: recorded when it ends, cancelled if dropped before.
struct Slot<'a> {
    retrier: &'a Retrier,
    protection: &'a Mutex<Protection>,
    is_retry: bool,
    done: bool,
}

impl Slot<'_> {
    fn record(mut self, outcome: Outcome) {
        self.done = true;
        lock(self.protection).record(self.retrier.now_ms(), outcome);
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if !self.done {
            lock(self.protection).cancel_as(self.retrier.now_ms(), self.is_retry);
        }
    }
}

/// What an HTTP attempt means as a [`Failure`], through the push classification table
/// ([`Rules`], SPEC §10), so a library caller and the server judge answers alike. `None`:
/// delivered. `now_s` (Unix seconds) reads an HTTP-date `Retry-After`.
///
/// A 410 ([`Verdict::Gone`]) is a `permanent` failure with the code `endpoint_gone`.
pub fn http_failure(rules: &Rules, attempt: Attempt<'_>, now_s: i64) -> Option<Failure> {
    let what = match attempt {
        Attempt::Answered { status, .. } => format!("HTTP {status}"),
        Attempt::TimedOut => "timed out".to_owned(),
        Attempt::ConnectFailed => "connection failed".to_owned(),
    };
    match rules.classify(attempt, now_s) {
        Verdict::Delivered => None,
        Verdict::Failed {
            class,
            retry_after_ms,
        } => Some(Failure {
            class,
            message: Some(what),
            retry_after_ms,
            code: None,
        }),
        Verdict::Gone => Some(Failure::endpoint_gone(format!(
            "{what}: the endpoint is gone"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protect::{BreakerConfig, BreakerState, ProtectionConfig};
    use redrive_core::{Backoff, ErrorClass, Jitter};
    use std::cell::RefCell;

    fn policy(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            backoff: Backoff::Exponential,
            initial_delay_ms: 100,
            multiplier: 2.0,
            jitter: Jitter::None,
            ..RetryPolicy::default()
        }
    }

    #[allow(clippy::ptr_arg)] // `classify` takes `&E`, and E is String here
    fn transient(e: &String) -> Failure {
        Failure::new(ErrorClass::Transient, e.clone())
    }

    /// Records when each attempt started (ms since `t0`).
    struct Log {
        t0: Instant,
        at: RefCell<Vec<u64>>,
    }

    impl Log {
        fn new() -> Self {
            Self {
                t0: Instant::now(),
                at: RefCell::new(vec![]),
            }
        }
        fn mark(&self) {
            self.at
                .borrow_mut()
                .push(self.t0.elapsed().as_millis() as u64);
        }
        fn gaps(&self) -> Vec<u64> {
            self.at.borrow().windows(2).map(|w| w[1] - w[0]).collect()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn succeeds_after_failures_with_the_policys_delays() {
        let log = Log::new();
        let got = retry(&policy(8), transient, |n| {
            log.mark();
            async move {
                if n < 4 {
                    Err(format!("fail {n}"))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(got, Ok(4));
        assert_eq!(log.gaps(), [100, 200, 400]);
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_max_attempts_with_the_last_error() {
        let got: Result<(), _> = retry(&policy(3), transient, |n| async move {
            Err(format!("fail {n}"))
        })
        .await;
        assert_eq!(
            got,
            Err(RetryError::Exhausted {
                reason: DeadReason::MaxAttempts,
                attempts: 3,
                last: "fail 3".to_owned()
            })
        );
        let e = got.unwrap_err();
        assert_eq!(e.attempts(), 3);
        assert_eq!(
            e.to_string(),
            "gave up after 3 attempt(s) (max_attempts): fail 3"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_permanent_failure_stops_at_once() {
        let got: Result<(), _> = retry(
            &policy(8),
            |e: &String| Failure::new(ErrorClass::Permanent, e.clone()),
            |_| async { Err("400".to_owned()) },
        )
        .await;
        assert_eq!(
            got,
            Err(RetryError::Exhausted {
                reason: DeadReason::PermanentError,
                attempts: 1,
                last: "400".to_owned()
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn max_age_ends_the_retries() {
        let p = RetryPolicy {
            max_age_ms: 250,
            ..policy(8)
        };
        let got: Result<(), _> =
            retry(&p, transient, |n| async move { Err(format!("fail {n}")) }).await;
        // Delays 100, 200: the second would be due at 300 > 250.
        assert_eq!(got.unwrap_err().attempts(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_waits_its_retry_after_bounded_and_uncharged() {
        let p = RetryPolicy {
            max_retry_after_ms: 60_000,
            ..policy(2)
        };
        let log = Log::new();
        let after = [5_000, 7_200_000, 0];
        let got = retry(
            &p,
            |e: &u64| {
                let mut f = Failure::new(ErrorClass::RateLimited, "429");
                f.retry_after_ms = Some(*e);
                f
            },
            |n| {
                log.mark();
                async move {
                    match after.get(n as usize - 1) {
                        Some(&a) => Err(a),
                        None => Ok(n),
                    }
                }
            },
        )
        .await;
        // Three rate-limited failures, not charged: max_attempts 2 does not stop them.
        assert_eq!(got, Ok(4));
        // 5 s as asked; 2 h cut to max_retry_after; 0 s raised to the policy's floor
        // (the delay for one counted attempt, 100 ms).
        assert_eq!(log.gaps(), [5_000, 60_000, 100]);
    }

    fn protection(open_ms: u64) -> Arc<Mutex<Protection>> {
        Arc::new(Mutex::new(Protection::new(
            ProtectionConfig {
                concurrency: 4,
                rate_limit_per_s: None,
                breaker: Some(BreakerConfig {
                    open_ms,
                    ..BreakerConfig::default()
                }),
                retry_budget: 0.1,
            },
            0,
        )))
    }

    /// Open the shared breaker at the retrier's now.
    fn trip(p: &Mutex<Protection>, r: &Retrier) {
        let mut p = lock(p);
        for _ in 0..20 {
            p.record(r.now_ms(), Outcome::Failure);
        }
        assert_eq!(p.state(), BreakerState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_breaker_parks_without_charging_attempts() {
        let shared = protection(5_000);
        let r = Retrier::new(policy(1)).breaker(shared.clone()).seed(1);
        trip(&shared, &r);
        let log = Log::new();
        // max_attempts 1: parking must not use up the only attempt.
        let got = r
            .run(transient, |n| {
                log.mark();
                async move { Ok::<u32, String>(n) }
            })
            .await;
        assert_eq!(got, Ok(1));
        assert_eq!(*log.at.borrow(), [5_000], "parked until the probe");
        let p = lock(&shared);
        assert_eq!(
            p.state(),
            BreakerState::Recovering,
            "the call was the probe"
        );
        assert_eq!(p.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_parks_the_retry_until_the_next_probe() {
        let shared = protection(5_000);
        let r = Retrier::new(policy(3)).breaker(shared.clone());
        trip(&shared, &r);
        let log = Log::new();
        let got = r
            .run(transient, |n| {
                log.mark();
                async move {
                    if n == 1 {
                        Err("503".to_owned())
                    } else {
                        Ok(n)
                    }
                }
            })
            .await;
        // Probe at 5 s fails: open open_ms (5 s) more (a tenth of the 5 s outage is less);
        // the retry (due 100 ms later) is parked until 10 s and is attempt 2.
        assert_eq!(got, Ok(2));
        assert_eq!(*log.at.borrow(), [5_000, 10_000]);
        assert_eq!(lock(&shared).snapshot(r.now_ms()).opened_total, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn parking_is_bounded_by_max_age() {
        let shared = protection(5_000);
        let p = RetryPolicy {
            max_age_ms: 2_000,
            ..policy(3)
        };
        let r = Retrier::new(p).breaker(shared.clone());
        trip(&shared, &r);
        let got: Result<(), RetryError<String>> = r.run(transient, |_| async { Ok(()) }).await;
        assert_eq!(got, Err(RetryError::NeverAdmitted { waited_ms: 0 }));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_call_gives_its_slot_back() {
        let shared = protection(5_000);
        let r = Retrier::new(policy(3)).breaker(shared.clone());
        let slow = r.run(transient, |_| async {
            sleep(Duration::from_secs(60)).await;
            Ok::<(), String>(())
        });
        assert!(tokio::time::timeout(Duration::from_secs(1), slow)
            .await
            .is_err());
        let snap = lock(&shared).snapshot(r.now_ms());
        assert_eq!((snap.in_flight, snap.window_calls), (0, 0));
        assert_eq!(snap.budget_first_attempts, 0, "cancelled, not counted");
    }

    #[test]
    fn http_answers_as_failures() {
        let rules = Rules::default();
        let answered = |status, retry_after| Attempt::Answered {
            status,
            retry_after,
        };
        assert_eq!(http_failure(&rules, answered(204, None), 0), None);
        let f = http_failure(&rules, answered(503, Some("7")), 0).unwrap();
        assert_eq!(
            (f.class, f.retry_after_ms, f.message.as_deref()),
            (ErrorClass::RateLimited, Some(7_000), Some("HTTP 503"))
        );
        let f = http_failure(&rules, answered(500, None), 0).unwrap();
        assert_eq!((f.class, f.code), (ErrorClass::Transient, None));
        let f = http_failure(&rules, answered(404, None), 0).unwrap();
        assert_eq!(f.class, ErrorClass::Permanent);
        let f = http_failure(&rules, answered(410, None), 0).unwrap();
        assert_eq!(
            (f.class, f.code.as_deref()),
            (ErrorClass::Permanent, Some("endpoint_gone"))
        );
        let f = http_failure(&rules, Attempt::TimedOut, 0).unwrap();
        assert_eq!(
            (f.class, f.message.as_deref()),
            (ErrorClass::Transient, Some("timed out"))
        );
    }
}
