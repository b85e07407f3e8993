//! Property tests of the retry policy's invariants (SPEC §3).
//!
//! Arbitrary valid policies (every backoff and jitter), failure contexts,
//! failures and seeds are thrown at [`RetryPolicy::decide`],
//! [`RetryPolicy::explain`] and [`RetryPolicyConfig::resolve`]:
//!
//! 1. a retry delay never exceeds `max_delay`, except a `rate_limited`
//!    failure's `retry_after`, which is bounded by `max_retry_after` instead;
//! 2. a retry is due exactly `delay` from now and never past `window_start + max_age`;
//! 3. the same inputs and seed give the same decision, and the same schedule;
//! 4. every drawn delay lies in the range `explain()` prints for its attempt;
//! 5. `permanent` is dead at once, counted failures stop at `max_attempts`,
//!    uncounted rate limits never do;
//! 6. a config resolves to its preset (or the defaults) under its explicit keys,
//!    and a bad key is named;
//! 7. a `rate_limited` failure never waits less than the policy's floor for the
//!    attempt (its un-jittered delay), whatever its `retry_after` (issue 5);
//! 8. after `max_rate_limited` uncharged rate-limited attempts, they are charged;
//! 9. the default policy keeps retrying for at least 4 hours of transient failures,
//!    whatever its jitter draws (SPEC §3, "the default outlives an outage").

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use redrive_core::{
    Backoff, DeadReason, Decision, DurationMs, ErrorClass, Failure, FailureContext, Jitter,
    PolicyError, RetryPolicy, RetryPolicyConfig, SplitMix64, Timestamp, DEFAULT_MIN_RETRY_SPAN_MS,
};

const SECOND: u64 = 1_000;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

const PRESETS: [&str; 3] = ["rocketmq", "sidekiq", "svix"];

// ---------------------------------------------------------------- strategies

fn backoff() -> impl Strategy<Value = Backoff> {
    prop_oneof![
        Just(Backoff::Fixed),
        Just(Backoff::Linear),
        Just(Backoff::Exponential),
        Just(Backoff::Decorrelated),
        Just(Backoff::Schedule),
        Just(Backoff::Sidekiq),
    ]
}

fn jitter() -> impl Strategy<Value = Jitter> {
    prop_oneof![
        Just(Jitter::None),
        Just(Jitter::Full),
        Just(Jitter::Equal),
        Just(Jitter::Decorrelated),
    ]
}

fn error_class() -> impl Strategy<Value = ErrorClass> {
    prop_oneof![
        Just(ErrorClass::Transient),
        Just(ErrorClass::RateLimited),
        Just(ErrorClass::Permanent),
    ]
}

/// A duration in ms, biased towards the interesting small values and edges.
fn duration_ms(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 1u64..=SECOND, 0u64..=max, Just(max),]
}

/// Like [`duration_ms`] but never zero.
fn positive_ms(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![1u64..=SECOND, 1u64..=max, Just(max)]
}

prop_compose! {
    /// Any policy that passes validation, with 1..=30 attempts.
    fn policy()(
        max_attempts in 1u32..=30,
        backoff in backoff(),
        initial_delay_ms in duration_ms(HOUR),
        multiplier in 1.0f64..10.0,
        max_delay_ms in positive_ms(2 * DAY),
        jitter in jitter(),
        max_age_ms in positive_ms(60 * DAY),
        schedule_ms in vec(duration_ms(DAY), 1..=20),
        max_retry_after_ms in duration_ms(2 * DAY),
        rate_limited_counts in any::<bool>(),
        max_rate_limited in prop_oneof![0u32..=30, Just(u32::MAX)],
    ) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            backoff,
            initial_delay_ms,
            multiplier,
            max_delay_ms,
            jitter,
            max_age_ms,
            schedule_ms,
            max_retry_after_ms,
            rate_limited_counts,
            max_rate_limited,
        }
    }
}

prop_compose! {
    /// A failed attempt's context: `created_at <= now`, attempts mostly around
    /// the policies' `max_attempts`, sometimes far beyond.
    fn context()(
        counted_attempts in prop_oneof![4 => 1u32..=40, 1 => any::<u32>()],
        created_at in 0i64..=4_000_000_000_000,
        age in duration_ms(90 * DAY),
        prev_delay_ms in option::of(duration_ms(2 * DAY)),
        uncharged_rate_limited in prop_oneof![4 => 0u32..=40, 1 => any::<u32>()],
    ) -> FailureContext {
        let created_at = Timestamp::from_millis(created_at);
        FailureContext {
            counted_attempts,
            window_start: created_at,
            now: created_at.plus_ms(age),
            prev_delay_ms,
            uncharged_rate_limited,
        }
    }
}

/// Any failure of one of `classes`, `retry_after` included (hostile values too).
fn failure_of(classes: impl Strategy<Value = ErrorClass>) -> impl Strategy<Value = Failure> {
    (
        classes,
        option::of(prop_oneof![duration_ms(2 * DAY), any::<u64>()]),
    )
        .prop_map(|(class, retry_after_ms)| Failure {
            retry_after_ms,
            ..Failure::new(class, "boom")
        })
}

/// Any failure.
fn failure() -> impl Strategy<Value = Failure> {
    failure_of(error_class())
}

/// Any failure that is not `permanent`.
fn retryable_failure() -> impl Strategy<Value = Failure> {
    failure_of(prop_oneof![
        Just(ErrorClass::Transient),
        Just(ErrorClass::RateLimited)
    ])
}

fn transient() -> Failure {
    Failure::new(ErrorClass::Transient, "HTTP 503")
}

fn counts(policy: &RetryPolicy, failure: &Failure, ctx: &FailureContext) -> bool {
    failure.class != ErrorClass::RateLimited
        || policy.rate_limited_counts
        || ctx.uncharged_rate_limited >= policy.max_rate_limited
}

/// The delay a rate-limited failure asks for: its `retry_after` within the policy's
/// bound, raised to the policy's floor for the attempt.
fn rate_limited_delay(policy: &RetryPolicy, after: u64, counted_attempts: u32) -> u64 {
    after
        .min(policy.max_retry_after_ms)
        .max(policy.rate_limited_floor_ms(counted_attempts))
}

/// Transient failures one after another from the first attempt, each retry's
/// delay fed back as `prev_delay_ms`, until the policy says dead. One RNG
/// seeded once serves the whole schedule.
fn simulate(policy: &RetryPolicy, created_at: Timestamp, seed: u64) -> Vec<Decision> {
    let mut rng = SplitMix64::new(seed);
    let mut now = created_at;
    let mut prev_delay_ms = None;
    let mut out = Vec::new();
    for n in 1..=policy.max_attempts {
        let ctx = FailureContext {
            counted_attempts: n,
            window_start: created_at,
            now,
            prev_delay_ms,
            uncharged_rate_limited: 0,
        };
        let d = policy.decide(&ctx, &transient(), &mut rng);
        out.push(d);
        match d {
            Decision::Retry {
                delay_ms, due_at, ..
            } => {
                prev_delay_ms = Some(delay_ms);
                now = due_at;
            }
            Decision::Dead { .. } => break,
        }
    }
    out
}

// ---------------------------------------------------------------- the default

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Property 9 (issue 15): a message on the default policy that fails every attempt
    /// is retried for at least [`DEFAULT_MIN_RETRY_SPAN_MS`] (4 h) before it is dead,
    /// whatever the seed, and for no more than the un-jittered schedule (29,295 s): its
    /// 20 attempts all happen, and it dies of `max_attempts`, never of `max_age`.
    #[test]
    fn default_policy_retries_at_least_four_hours_whatever_the_jitter(
        created_at in 0i64..=4_000_000_000_000,
        seed in any::<u64>(),
    ) {
        let policy = RetryPolicy::default();
        let created = Timestamp::from_millis(created_at);
        let schedule = simulate(&policy, created, seed);
        prop_assert_eq!(schedule.len(), policy.max_attempts as usize);
        prop_assert_eq!(
            schedule.last(),
            Some(&Decision::Dead { reason: DeadReason::MaxAttempts })
        );
        let span: u64 = schedule
            .iter()
            .map(|d| match d {
                Decision::Retry { delay_ms, .. } => *delay_ms,
                Decision::Dead { .. } => 0,
            })
            .sum();
        prop_assert!(
            span >= DEFAULT_MIN_RETRY_SPAN_MS,
            "seed {}: dead after {} ms of retries", seed, span
        );
        prop_assert!(span <= 29_295 * SECOND, "seed {}: {} ms", seed, span);
    }
}

/// The smallest draw equal jitter can make, every time (what the property above can only
/// sample): each wait at exactly half its delay still adds up to more than 4 h.
#[test]
fn default_policy_lowest_draws_still_span_four_hours() {
    let policy = RetryPolicy::default();
    assert_eq!(policy.jitter, Jitter::Equal);
    let lowest: u64 = (1..policy.max_attempts)
        .map(|n| (SECOND << (n - 1).min(40)).min(policy.max_delay_ms) / 2)
        .sum();
    assert!(lowest >= DEFAULT_MIN_RETRY_SPAN_MS, "{lowest} ms");
    let explained = policy.explain();
    assert_eq!(explained.last().map(|r| r.cumulative_min_ms), Some(lowest));
}

// ---------------------------------------------------------------- decide

proptest! {
    /// Properties 1 and 2: bounded delays, exact `due_at`, nothing past `max_age`.
    #[test]
    fn retry_delay_is_bounded_and_due_within_max_age(
        policy in policy(),
        ctx in context(),
        failure in failure(),
        seed in any::<u64>(),
    ) {
        prop_assert!(policy.validate().is_ok());
        let decision = policy.decide(&ctx, &failure, &mut SplitMix64::new(seed));
        if let Decision::Retry { delay_ms, due_at, counted } = decision {
            match (failure.class, failure.retry_after_ms) {
                (ErrorClass::RateLimited, Some(after)) => {
                    prop_assert_eq!(delay_ms, rate_limited_delay(&policy, after, ctx.counted_attempts));
                    prop_assert!(delay_ms <= policy.max_retry_after_ms.max(policy.max_delay_ms));
                }
                _ => prop_assert!(
                    delay_ms <= policy.max_delay_ms,
                    "delay {} > max_delay {}", delay_ms, policy.max_delay_ms
                ),
            }
            prop_assert_eq!(due_at, ctx.now.plus_ms(delay_ms));
            prop_assert!(due_at <= ctx.window_start.plus_ms(policy.max_age_ms));
            prop_assert_eq!(counted, counts(&policy, &failure, &ctx));
        }
    }

    /// `max_age` kills only when it must: if even the longest possible delay
    /// would be due in the window, the answer is not `max_age`.
    #[test]
    fn max_age_only_when_the_window_is_too_short(
        policy in policy(),
        ctx in context(),
        failure in failure(),
        seed in any::<u64>(),
    ) {
        let decision = policy.decide(&ctx, &failure, &mut SplitMix64::new(seed));
        let longest = match (failure.class, failure.retry_after_ms) {
            (ErrorClass::RateLimited, Some(after)) => {
                rate_limited_delay(&policy, after, ctx.counted_attempts)
            }
            _ => policy.max_delay_ms,
        };
        if ctx.now.plus_ms(longest) <= ctx.window_start.plus_ms(policy.max_age_ms) {
            prop_assert_ne!(decision, Decision::Dead { reason: DeadReason::MaxAge });
        }
    }

    /// The `max_age` boundary is exact: a retry due at the very end of the
    /// window is scheduled, one a millisecond later is dead of `max_age`.
    #[test]
    fn max_age_boundary_is_exact(
        policy in policy(),
        created_at in 0i64..=4_000_000_000_000,
        slack in -2i64..=2,
        retry_after_ms in option::of(duration_ms(2 * DAY)),
        seed in any::<u64>(),
    ) {
        // A policy whose delay is known in advance: fixed, no jitter, or a
        // rate limit's `retry_after`.
        let policy = RetryPolicy {
            backoff: Backoff::Fixed,
            jitter: Jitter::None,
            max_attempts: policy.max_attempts.max(2),
            ..policy
        };
        let (failure, delay_ms) = match retry_after_ms {
            Some(after) => (
                Failure { retry_after_ms, ..Failure::new(ErrorClass::RateLimited, "429") },
                rate_limited_delay(&policy, after, 1),
            ),
            None => (transient(), policy.initial_delay_ms.min(policy.max_delay_ms)),
        };
        let policy = RetryPolicy { max_age_ms: policy.max_age_ms.max(delay_ms + 2), ..policy };
        let created_at = Timestamp::from_millis(created_at);
        let deadline = created_at.plus_ms(policy.max_age_ms);
        let now = Timestamp::from_millis(deadline.as_millis() - delay_ms as i64 + slack);
        let ctx = FailureContext {
            counted_attempts: 1,
            window_start: created_at,
            now,
            prev_delay_ms: None,
            uncharged_rate_limited: 0,
        };
        let decision = policy.decide(&ctx, &failure, &mut SplitMix64::new(seed));
        if slack <= 0 {
            prop_assert_eq!(
                decision,
                Decision::Retry {
                    delay_ms,
                    due_at: Timestamp::from_millis(deadline.as_millis() + slack),
                    counted: counts(&policy, &failure, &ctx),
                }
            );
        } else {
            prop_assert_eq!(decision, Decision::Dead { reason: DeadReason::MaxAge });
        }
    }

    /// Property 3: same (policy, ctx, failure, seed), same decision.
    #[test]
    fn same_seed_same_decision(
        policy in policy(),
        ctx in context(),
        failure in failure(),
        seed in any::<u64>(),
    ) {
        let a = policy.decide(&ctx, &failure, &mut SplitMix64::new(seed));
        let b = policy.decide(&ctx, &failure, &mut SplitMix64::new(seed));
        prop_assert_eq!(a, b);
    }

    /// Property 3: the whole schedule (attempts 1..max_attempts, each delay fed
    /// back) is reproducible from its seed, and ends dead.
    #[test]
    fn same_seed_same_schedule(
        policy in policy(),
        created_at in 0i64..=4_000_000_000_000,
        seed in any::<u64>(),
    ) {
        let created_at = Timestamp::from_millis(created_at);
        let a = simulate(&policy, created_at, seed);
        let b = simulate(&policy, created_at, seed);
        prop_assert_eq!(&a, &b);
        prop_assert!(!a.is_empty() && a.len() <= policy.max_attempts as usize);
        prop_assert!(matches!(a.last(), Some(Decision::Dead { .. })), "{:?}", a.last());
        for d in &a[..a.len() - 1] {
            prop_assert!(matches!(d, Decision::Retry { counted: true, .. }), "{:?}", d);
        }
    }

    /// Property 5: `permanent` is dead at once, whatever else holds.
    #[test]
    fn permanent_is_always_dead(
        policy in policy(),
        ctx in context(),
        retry_after_ms in option::of(any::<u64>()),
        seed in any::<u64>(),
    ) {
        let failure = Failure { retry_after_ms, ..Failure::new(ErrorClass::Permanent, "400") };
        prop_assert_eq!(
            policy.decide(&ctx, &failure, &mut SplitMix64::new(seed)),
            Decision::Dead { reason: DeadReason::PermanentError }
        );
    }

    /// Property 5: a counted failure at or past `max_attempts` is dead of
    /// `max_attempts`; before it, never; an uncounted rate limit, never.
    #[test]
    fn max_attempts_counts_only_counted_failures(
        policy in policy(),
        ctx in context(),
        failure in retryable_failure(),
        seed in any::<u64>(),
    ) {
        let decision = policy.decide(&ctx, &failure, &mut SplitMix64::new(seed));
        let max_attempts = Decision::Dead { reason: DeadReason::MaxAttempts };
        if counts(&policy, &failure, &ctx) && ctx.counted_attempts >= policy.max_attempts {
            prop_assert_eq!(decision, max_attempts);
        } else {
            prop_assert_ne!(decision, max_attempts);
            prop_assert_ne!(decision, Decision::Dead { reason: DeadReason::PermanentError });
        }
    }

    /// A rate limit the policy does not count never yields `max_attempts`,
    /// however many attempts went before.
    #[test]
    fn uncounted_rate_limits_never_exhaust_attempts(
        policy in policy(),
        ctx in context(),
        retry_after_ms in option::of(duration_ms(2 * DAY)),
        seed in any::<u64>(),
    ) {
        // Below its budget of uncharged rate limits.
        let policy = RetryPolicy {
            rate_limited_counts: false,
            max_rate_limited: policy.max_rate_limited.max(1),
            ..policy
        };
        let ctx = FailureContext {
            uncharged_rate_limited: ctx.uncharged_rate_limited.min(policy.max_rate_limited - 1),
            ..ctx
        };
        let failure = Failure { retry_after_ms, ..Failure::new(ErrorClass::RateLimited, "429") };
        let decision = policy.decide(&ctx, &failure, &mut SplitMix64::new(seed));
        prop_assert_ne!(decision, Decision::Dead { reason: DeadReason::MaxAttempts });
        if let Decision::Retry { counted, .. } = decision {
            prop_assert!(!counted);
        }
    }

    /// Attempt numbers far past anything sensible (a policy allowing billions
    /// of attempts, or uncounted rate limits piling up) neither overflow nor
    /// break the cap.
    #[test]
    fn huge_attempt_numbers_stay_capped(
        policy in policy(),
        max_attempts in any::<u32>().prop_map(|n| n.max(1)),
        counted_attempts in any::<u32>(),
        prev_delay_ms in option::of(any::<u64>()),
        class in prop_oneof![Just(ErrorClass::Transient), Just(ErrorClass::RateLimited)],
        seed in any::<u64>(),
    ) {
        let policy = RetryPolicy { max_attempts, max_age_ms: u64::MAX, ..policy };
        let now = Timestamp::from_millis(1_700_000_000_000);
        let ctx = FailureContext {
            counted_attempts,
            window_start: now,
            now,
            prev_delay_ms,
            uncharged_rate_limited: 0,
        };
        let failure = Failure::new(class, "boom");
        match policy.decide(&ctx, &failure, &mut SplitMix64::new(seed)) {
            Decision::Retry { delay_ms, .. } => prop_assert!(delay_ms <= policy.max_delay_ms),
            Decision::Dead { reason } => prop_assert_eq!(reason, DeadReason::MaxAttempts),
        }
    }
}

// ---------------------------------------------------------------- rate limits

proptest! {
    /// Property 7 (issue 5, the `retry_after: "0s"` hot loop): for every policy, a
    /// rate-limited retry waits at least the policy's floor for the attempt, and that
    /// floor is the policy's own delay before jitter: for the deterministic backoffs
    /// without jitter, exactly what a transient failure would wait.
    #[test]
    fn rate_limited_delay_never_below_the_policy_floor(
        policy in policy(),
        ctx in context(),
        retry_after_ms in option::of(prop_oneof![Just(0u64), duration_ms(2 * DAY), any::<u64>()]),
        seed in any::<u64>(),
    ) {
        let failure = Failure { retry_after_ms, ..Failure::new(ErrorClass::RateLimited, "429") };
        let floor = policy.rate_limited_floor_ms(ctx.counted_attempts);
        prop_assert!(floor <= policy.max_delay_ms);
        if let Decision::Retry { delay_ms, due_at, .. } =
            policy.decide(&ctx, &failure, &mut SplitMix64::new(seed))
        {
            prop_assert!(delay_ms >= floor, "delay {} < floor {}", delay_ms, floor);
            prop_assert!(due_at >= ctx.now.plus_ms(floor));
        }
        if policy.jitter == Jitter::None
            && !matches!(policy.backoff, Backoff::Decorrelated | Backoff::Sidekiq)
        {
            let open = RetryPolicy { max_age_ms: u64::MAX, max_attempts: u32::MAX, ..policy.clone() };
            match open.decide(&ctx, &transient(), &mut SplitMix64::new(seed)) {
                Decision::Retry { delay_ms, .. } => prop_assert_eq!(delay_ms, floor),
                d => prop_assert!(false, "{:?}", d),
            }
        }
    }

    /// Property 8: rate-limited attempts are uncharged while fewer than
    /// `max_rate_limited` went uncharged before, and charged from then on (unless the
    /// policy charges them all anyway).
    #[test]
    fn rate_limited_is_charged_after_max_rate_limited(
        policy in policy(),
        ctx in context(),
        retry_after_ms in option::of(duration_ms(2 * DAY)),
        seed in any::<u64>(),
    ) {
        let failure = Failure { retry_after_ms, ..Failure::new(ErrorClass::RateLimited, "429") };
        let charged = policy.rate_limited_counts
            || ctx.uncharged_rate_limited >= policy.max_rate_limited;
        match policy.decide(&ctx, &failure, &mut SplitMix64::new(seed)) {
            Decision::Retry { counted, .. } => prop_assert_eq!(counted, charged),
            Decision::Dead { reason: DeadReason::MaxAttempts } => {
                prop_assert!(charged && ctx.counted_attempts >= policy.max_attempts);
            }
            Decision::Dead { reason } => prop_assert_eq!(reason, DeadReason::MaxAge),
        }
    }
}

// ---------------------------------------------------------------- explain

proptest! {
    /// Property 4: each delay `decide` draws (transient failures, previous
    /// delay fed back, `max_age` out of the way) lies within the range of its
    /// `explain()` row; and the rows themselves are consistent.
    #[test]
    fn drawn_delays_lie_within_explained_ranges(policy in policy(), seed in any::<u64>()) {
        let policy = RetryPolicy { max_age_ms: 100 * 365 * DAY, ..policy };
        let rows = policy.explain();
        prop_assert_eq!(rows.len(), policy.max_attempts as usize - 1);

        let created_at = Timestamp::from_millis(1_700_000_000_000);
        let mut now = created_at;
        let mut rng = SplitMix64::new(seed);
        let mut prev_delay_ms = None;
        let (mut cum_min, mut cum_max) = (0u64, 0u64);
        for (i, row) in rows.iter().enumerate() {
            let n = i as u32 + 1;
            prop_assert_eq!(row.attempt, n + 1);
            prop_assert!(row.delay_min_ms <= row.delay_max_ms, "{:?}", row);
            prop_assert!(row.delay_max_ms <= policy.max_delay_ms, "{:?}", row);
            cum_min = cum_min.saturating_add(row.delay_min_ms);
            cum_max = cum_max.saturating_add(row.delay_max_ms);
            prop_assert_eq!((row.cumulative_min_ms, row.cumulative_max_ms), (cum_min, cum_max));
            prop_assert!(!row.may_exceed_max_age);

            let ctx = FailureContext {
                counted_attempts: n,
                window_start: created_at,
                now,
                prev_delay_ms,
                uncharged_rate_limited: 0,
            };
            match policy.decide(&ctx, &transient(), &mut rng) {
                Decision::Retry { delay_ms, due_at, .. } => {
                    prop_assert!(
                        (row.delay_min_ms..=row.delay_max_ms).contains(&delay_ms),
                        "attempt {}: drew {} outside {}..={} (prev {:?})",
                        row.attempt, delay_ms, row.delay_min_ms, row.delay_max_ms, prev_delay_ms
                    );
                    if policy.jitter == Jitter::None
                        && !matches!(policy.backoff, Backoff::Decorrelated | Backoff::Sidekiq)
                    {
                        prop_assert_eq!(row.delay_min_ms, row.delay_max_ms);
                    }
                    prev_delay_ms = Some(delay_ms);
                    now = due_at;
                }
                d => prop_assert!(false, "attempt {}: {:?}", row.attempt, d),
            }
        }
        let ctx = FailureContext {
            counted_attempts: policy.max_attempts,
            window_start: created_at,
            now,
            prev_delay_ms,
            uncharged_rate_limited: 0,
        };
        prop_assert_eq!(
            policy.decide(&ctx, &transient(), &mut rng),
            Decision::Dead { reason: DeadReason::MaxAttempts }
        );
    }

    /// `explain()` is a function of the policy alone.
    #[test]
    fn explain_is_deterministic(policy in policy()) {
        prop_assert_eq!(policy.explain(), policy.explain());
    }
}

// ---------------------------------------------------------------- config

fn opt_ms(min: u64, max: u64) -> impl Strategy<Value = Option<DurationMs>> {
    option::of((min..=max).prop_map(DurationMs))
}

prop_compose! {
    /// A config whose every set key is in range (a preset, or none, underneath).
    fn config()(
        preset in option::of(prop::sample::select(&PRESETS[..])),
        max_attempts in option::of(1u32..=50),
        backoff in option::of(backoff()),
        initial_delay in opt_ms(0, HOUR),
        multiplier in option::of(1.0f64..10.0),
        max_delay in opt_ms(1, DAY),
        jitter in option::of(jitter()),
        max_age in opt_ms(1, 30 * DAY),
        schedule in option::of(vec((0..=DAY).prop_map(DurationMs), 1..=20)),
        max_retry_after in opt_ms(0, DAY),
        rate_limited_counts in option::of(any::<bool>()),
        max_rate_limited in option::of(0u32..=100),
    ) -> RetryPolicyConfig {
        RetryPolicyConfig {
            max_attempts,
            backoff,
            initial_delay,
            multiplier,
            max_delay,
            jitter,
            max_age,
            schedule,
            preset: preset.map(str::to_owned),
            max_retry_after,
            rate_limited_counts,
            max_rate_limited,
        }
    }
}

proptest! {
    /// Property 6: every explicit key wins over the preset (or built-in)
    /// default, every absent key keeps it, and the result validates.
    #[test]
    fn explicit_keys_override_preset_defaults(cfg in config()) {
        let base = match &cfg.preset {
            Some(name) => RetryPolicy::preset(name).expect("known preset"),
            None => RetryPolicy::default(),
        };
        let schedule_ms = match &cfg.schedule {
            Some(s) => s.iter().map(|d| d.ms()).collect(),
            None => base.schedule_ms.clone(),
        };
        // A schedule alone means `backoff = "schedule"` unless a preset says otherwise.
        let backoff = match (cfg.backoff, &cfg.schedule, &cfg.preset) {
            (Some(b), _, _) => b,
            (None, Some(_), None) => Backoff::Schedule,
            (None, _, _) => base.backoff,
        };
        let expected = RetryPolicy {
            max_attempts: cfg.max_attempts.unwrap_or(base.max_attempts),
            backoff,
            initial_delay_ms: cfg.initial_delay.map_or(base.initial_delay_ms, |d| d.ms()),
            multiplier: cfg.multiplier.unwrap_or(base.multiplier),
            max_delay_ms: cfg.max_delay.map_or(base.max_delay_ms, |d| d.ms()),
            jitter: cfg.jitter.unwrap_or(base.jitter),
            max_age_ms: cfg.max_age.map_or(base.max_age_ms, |d| d.ms()),
            schedule_ms,
            max_retry_after_ms: cfg.max_retry_after.map_or(base.max_retry_after_ms, |d| d.ms()),
            rate_limited_counts: cfg.rate_limited_counts.unwrap_or(base.rate_limited_counts),
            max_rate_limited: cfg.max_rate_limited.unwrap_or(base.max_rate_limited),
        };
        match cfg.resolve() {
            Ok(p) => {
                prop_assert_eq!(&p, &expected);
                prop_assert!(p.validate().is_ok());
            }
            // The one way an in-range config fails: `schedule` backoff, no list.
            Err(e) => {
                prop_assert_eq!(expected.backoff, Backoff::Schedule);
                prop_assert!(expected.schedule_ms.is_empty());
                prop_assert!(
                    matches!(&e, PolicyError::Invalid { key: "schedule", .. }),
                    "{:?}", e
                );
            }
        }
    }

    /// `over` layers key by key: the upper section's keys where set.
    #[test]
    fn over_takes_upper_keys_first(upper in config(), base in config()) {
        let m = upper.over(&base);
        prop_assert_eq!(m.max_attempts, upper.max_attempts.or(base.max_attempts));
        prop_assert_eq!(m.backoff, upper.backoff.or(base.backoff));
        prop_assert_eq!(m.initial_delay, upper.initial_delay.or(base.initial_delay));
        prop_assert_eq!(m.multiplier, upper.multiplier.or(base.multiplier));
        prop_assert_eq!(m.max_delay, upper.max_delay.or(base.max_delay));
        prop_assert_eq!(m.jitter, upper.jitter.or(base.jitter));
        prop_assert_eq!(m.max_age, upper.max_age.or(base.max_age));
        prop_assert_eq!(m.schedule.as_ref(), upper.schedule.as_ref().or(base.schedule.as_ref()));
        prop_assert_eq!(m.preset.as_ref(), upper.preset.as_ref().or(base.preset.as_ref()));
        prop_assert_eq!(m.max_retry_after, upper.max_retry_after.or(base.max_retry_after));
        prop_assert_eq!(
            m.rate_limited_counts,
            upper.rate_limited_counts.or(base.rate_limited_counts)
        );
        prop_assert_eq!(m.max_rate_limited, upper.max_rate_limited.or(base.max_rate_limited));
        // Layering over nothing, or nothing over, changes nothing.
        prop_assert_eq!(&upper.over(&RetryPolicyConfig::default()), &upper);
        prop_assert_eq!(&RetryPolicyConfig::default().over(&upper), &upper);
    }

    /// A single out-of-range key on top of any preset is rejected, naming the key.
    #[test]
    fn bad_keys_are_named(
        preset in option::of(prop::sample::select(&PRESETS[..])),
        which in 0usize..5,
        bad_multiplier in prop_oneof![
            -1.0e9f64..1.0,
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
        ],
    ) {
        let ok = RetryPolicyConfig { preset: preset.map(str::to_owned), ..Default::default() };
        prop_assert!(ok.resolve().is_ok());
        let (cfg, key) = match which {
            0 => (RetryPolicyConfig { max_attempts: Some(0), ..ok }, "max_attempts"),
            1 => (RetryPolicyConfig { multiplier: Some(bad_multiplier), ..ok }, "multiplier"),
            2 => (
                RetryPolicyConfig {
                    max_delay: Some(DurationMs(0)),
                    backoff: Some(Backoff::Exponential),
                    initial_delay: Some(DurationMs(SECOND)),
                    ..ok
                },
                "max_delay",
            ),
            3 => (
                RetryPolicyConfig {
                    backoff: Some(Backoff::Schedule),
                    schedule: Some(vec![]),
                    ..ok
                },
                "schedule",
            ),
            _ => (RetryPolicyConfig { max_age: Some(DurationMs(0)), ..ok }, "max_age"),
        };
        match cfg.resolve() {
            Err(PolicyError::Invalid { key: k, .. }) => prop_assert_eq!(k, key),
            other => prop_assert!(false, "{}: {:?}", key, other),
        }
    }

    /// An unknown preset name is rejected as such.
    #[test]
    fn unknown_presets_are_rejected(name in "[a-z]{0,12}") {
        prop_assume!(!PRESETS.contains(&name.as_str()));
        let cfg = RetryPolicyConfig { preset: Some(name.clone()), ..Default::default() };
        prop_assert_eq!(cfg.resolve(), Err(PolicyError::UnknownPreset(name)));
    }
}

#[test]
fn each_preset_resolves_and_validates() {
    for name in PRESETS {
        let p = RetryPolicy::preset(name).unwrap_or_else(|| panic!("{name}"));
        assert_eq!(p.validate(), Ok(()), "{name}");
        let cfg = RetryPolicyConfig {
            preset: Some(name.to_owned()),
            ..Default::default()
        };
        assert_eq!(cfg.resolve().as_ref(), Ok(&p), "{name}");
        assert_eq!(p.explain().len(), p.max_attempts as usize - 1, "{name}");
        // The preset's own schedule, run to the end, ends at max_attempts.
        let schedule = simulate(&p, Timestamp::from_millis(1_700_000_000_000), 7);
        assert_eq!(schedule.len(), p.max_attempts as usize, "{name}");
        assert_eq!(
            schedule.last(),
            Some(&Decision::Dead {
                reason: DeadReason::MaxAttempts
            }),
            "{name}"
        );
    }
    assert_eq!(
        RetryPolicyConfig::default().resolve(),
        Ok(RetryPolicy::default())
    );
    assert_eq!(RetryPolicy::default().validate(), Ok(()));
}

/// A regression: Sidekiq's `n⁴` saturates at large attempt numbers, and the
/// `+ 15` after it must not overflow (a panic in debug builds, a wrapped tiny
/// delay in release).
#[test]
fn sidekiq_survives_huge_attempt_numbers() {
    let p = RetryPolicy {
        max_attempts: u32::MAX,
        max_age_ms: u64::MAX,
        ..RetryPolicy::preset("sidekiq").unwrap_or_default()
    };
    let now = Timestamp::from_millis(1_700_000_000_000);
    for n in [65_535, 65_536, 100_000, u32::MAX - 1] {
        let ctx = FailureContext {
            counted_attempts: n,
            window_start: now,
            now,
            prev_delay_ms: None,
            uncharged_rate_limited: 0,
        };
        match p.decide(&ctx, &transient(), &mut SplitMix64::new(1)) {
            Decision::Retry { delay_ms, .. } => assert_eq!(delay_ms, p.max_delay_ms, "{n}"),
            d => panic!("{n}: {d:?}"),
        }
    }
}
