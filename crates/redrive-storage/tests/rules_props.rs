//! Property tests of the state machine's rules (`redrive_storage::rules`), the ones every
//! backend calls: generated messages, policies, failures, releases and clocks.

use proptest::prelude::*;
use redrive_core::{
    DeadReason, ErrorClass, Failure, HistoryEvent, MessageId, RetryPolicy, SplitMix64, State,
    Timestamp,
};
use redrive_storage::rules::{self, AttemptEnd, KeyMode, LeaseEnd, Lifecycle};
use redrive_storage::{LeaseRef, Release, ReleaseBy, Settled, StoreError};

const T0: i64 = 1_800_000_000_000;

fn state() -> impl Strategy<Value = State> {
    prop_oneof![
        Just(State::Scheduled),
        Just(State::Ready),
        Just(State::Leased),
        Just(State::Done),
        Just(State::Dead),
    ]
}

fn class() -> impl Strategy<Value = ErrorClass> {
    prop_oneof![
        Just(ErrorClass::Transient),
        Just(ErrorClass::RateLimited),
        Just(ErrorClass::Permanent),
    ]
}

/// A message in any state its counters allow: budget_base ≤ attempts, uncounted what is
/// left, times around T0.
fn lifecycle() -> impl Strategy<Value = Lifecycle> {
    lifecycle_in(state())
}

/// A leased message (its attempt not yet counted in `uncounted`).
fn leased() -> impl Strategy<Value = Lifecycle> {
    lifecycle_in(Just(State::Leased))
}

fn lifecycle_in(state: impl Strategy<Value = State>) -> impl Strategy<Value = Lifecycle> {
    (
        state,
        0u32..30,
        0u32..30,
        0u32..30,
        0u32..25,
        proptest::option::of(0u64..7_200_000),
        0i64..86_400_000,
        proptest::option::of(0i64..86_400_000),
        -60_000i64..600_000,
    )
        .prop_map(
            |(state, attempts, base, uncounted, released, prev, age, window, expiry)| {
                let attempts = attempts.max(u32::from(state == State::Leased));
                let base = base.min(attempts);
                // The leased attempt has not failed yet: it is not among the uncounted.
                let leased = u32::from(state == State::Leased);
                let uncounted = uncounted.min(attempts - base - leased.min(attempts - base));
                let now = Timestamp::from_millis(T0);
                let created = Timestamp::from_millis(T0 - age);
                Lifecycle {
                    state,
                    due_at: Some(created),
                    attempts,
                    budget_base: base,
                    uncounted,
                    released,
                    prev_delay_ms: prev,
                    created_at: created,
                    updated_at: created,
                    window_start: window.map(|w| Timestamp::from_millis(T0 - w.min(age))),
                    leased_at: (state == State::Leased).then_some(now.plus_ms(0)),
                    lease_expires_at: (state == State::Leased)
                        .then(|| Timestamp::from_millis(T0 + expiry)),
                    lease_end: None,
                    finished_at: state.is_final().then_some(now),
                    dead_reason: None,
                }
            },
        )
}

fn policy() -> impl Strategy<Value = RetryPolicy> {
    (1u32..25, 0u32..5, any::<bool>(), 60_000u64..604_800_000).prop_map(
        |(max_attempts, max_rate_limited, counts, max_age_ms)| RetryPolicy {
            max_attempts,
            max_rate_limited,
            rate_limited_counts: counts,
            max_age_ms,
            ..RetryPolicy::default()
        },
    )
}

fn now() -> Timestamp {
    Timestamp::from_millis(T0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Only the stored token of a leased, unexpired message is live; any other token is a
    /// mismatch, whatever the state; an ended lease names how it ended.
    #[test]
    fn a_token_is_live_only_for_its_unexpired_lease(life in lifecycle(), other in "[0-9]{1,2}-[0-9a-f]{16}") {
        let token = format!("{}-00000000000000aa", life.attempts);
        let none = || -> Result<Vec<_>, StoreError> { Ok(Vec::new()) };
        let live = rules::check_lease(&life, Some(&token), &token, now(), none);
        let expected_live = life.state == State::Leased && life.lease_expires_at.is_some_and(|e| e > now());
        prop_assert_eq!(live.is_ok(), expected_live);
        if other != token {
            let r = rules::check_lease(&life, Some(&token), &other, now(), none);
            prop_assert!(matches!(r, Err(StoreError::LeaseMismatch)));
        }
        for end in [LeaseEnd::Expired, LeaseEnd::Settled(Settled::Acked), LeaseEnd::Settled(Settled::Killed)] {
            let mut ended = life.clone();
            ended.lease_end = Some(end);
            if ended.state != State::Leased {
                let r = rules::check_lease(&ended, Some(&token), &token, now(), none);
                prop_assert_eq!(r.err().map(|e| e.to_string()), Some(end.error().to_string()));
            }
        }
    }

    /// A failed attempt is retried (due no earlier than now and than the not-before) or
    /// dead; its history entry is the attempt's and says what the message became; counts
    /// never go backwards.
    #[test]
    fn a_failure_is_a_retry_at_a_time_not_before_now_or_dead(
        life in leased(), policy in policy(), class in class(), seed in any::<u64>(),
        not_before in proptest::option::of(0u64..86_400_000),
    ) {
        let mut after = life.clone();
        let failure = Failure::new(class, "boom");
        let end = AttemptEnd {
            lease_end: Some(LeaseEnd::Settled(Settled::Nacked)),
            not_before: not_before.map(|d| now().plus_ms(d)),
        };
        let failed = rules::fail(&mut after, &policy, &failure, end, now(), &mut SplitMix64::new(seed));
        prop_assert_eq!(failed.entry.attempt, life.attempts);
        prop_assert_eq!(after.attempts, life.attempts);
        prop_assert!(after.uncounted >= life.uncounted);
        prop_assert_eq!(after.lease_end, Some(LeaseEnd::Settled(Settled::Nacked)));
        let HistoryEvent::Failed { retry_at, dead_reason, .. } = &failed.entry.event else {
            panic!("a failure's entry is `failed`");
        };
        match after.state {
            State::Scheduled | State::Ready => {
                let due = after.due_at.expect("a retry has a due time");
                prop_assert!(due >= now());
                if let Some(nb) = end.not_before {
                    prop_assert!(due >= nb);
                }
                prop_assert_eq!(*retry_at, Some(due));
                prop_assert_eq!(after.state == State::Scheduled, due > now());
                prop_assert!(class != ErrorClass::Permanent);
            }
            State::Dead => {
                prop_assert!(dead_reason.is_some());
                prop_assert_eq!(after.dead_reason, *dead_reason);
                prop_assert_eq!(after.finished_at, Some(now()));
            }
            other => prop_assert!(false, "a failure made it {other:?}"),
        }
        if class == ErrorClass::Transient && after.counted_attempts().max(1) < policy.max_attempts
            // Room in the window for any delay the policy may draw (a retry due past
            // max_age is dead by age: with 1 ms left that is right, not a bug).
            && now().plus_ms(policy.max_delay_ms) < life.window_start().plus_ms(policy.max_age_ms)
            && end.not_before.is_none()
        {
            prop_assert!(after.state != State::Dead, "dead with budget and window left");
        }
    }

    /// A failure reported at publish is attempt `attempts_before + 1`. With `deliver_at`
    /// (the caller timed the next try), a retry is due exactly then, or now when that is
    /// past, and the message is dead only as the policy ends it: a permanent failure, the
    /// budget spent, or that time past `max_age` — never because of a delay the policy would
    /// have drawn. Without it, the policy decides as for any failed attempt.
    #[test]
    fn a_failure_at_publish_is_due_at_the_callers_time_unless_the_policy_ends_it(
        policy in policy(), class in class(), before in 0u32..30, seed in any::<u64>(),
        offset in proptest::option::of(-86_400_000i64..1_209_600_000),
    ) {
        let deliver_at = offset.map(|o| Timestamp::from_millis(T0 + o));
        let mut life = Lifecycle::published(deliver_at, now());
        let failure = Failure::new(class, "seen elsewhere");
        let failed = rules::publish_failed(
            &mut life, &policy, &failure, before, deliver_at, now(), &mut SplitMix64::new(seed),
        );
        prop_assert_eq!(life.attempts, before + 1);
        prop_assert_eq!(failed.entry.attempt, before + 1);
        let HistoryEvent::Failed { retry_at, delay_ms, dead_reason, .. } = &failed.entry.event else {
            panic!("a failure's entry is `failed`");
        };
        let Some(at) = deliver_at else {
            // The policy's own decision: what `fail` makes of the same attempt.
            let mut same = Lifecycle::published(None, now());
            same.attempts = before + 1;
            let by_fail = rules::fail(
                &mut same, &policy, &failure, AttemptEnd::default(), now(), &mut SplitMix64::new(seed),
            );
            prop_assert_eq!(&life, &same);
            prop_assert_eq!(&failed.entry, &by_fail.entry);
            return Ok(());
        };
        let due = at.max(now());
        let counted = class != ErrorClass::RateLimited
            || policy.rate_limited_counts
            || policy.max_rate_limited == 0;
        let expected_dead = if class == ErrorClass::Permanent {
            Some(DeadReason::PermanentError)
        } else if counted && before + 1 >= policy.max_attempts {
            Some(DeadReason::MaxAttempts)
        } else if due > now().plus_ms(policy.max_age_ms) {
            Some(DeadReason::MaxAge)
        } else {
            None
        };
        prop_assert_eq!(*dead_reason, expected_dead);
        prop_assert_eq!(life.dead_reason, expected_dead);
        match expected_dead {
            Some(_) => {
                prop_assert_eq!(life.state, State::Dead);
                prop_assert_eq!(life.finished_at, Some(now()));
                prop_assert_eq!(*retry_at, None);
            }
            None => {
                prop_assert_eq!(life.due_at, Some(due));
                prop_assert_eq!(life.state == State::Scheduled, due > now());
                prop_assert_eq!(life.state == State::Ready, due == now());
                prop_assert_eq!(*retry_at, Some(due));
                prop_assert_eq!(*delay_ms, Some(due.millis_since(now()) as u64));
                prop_assert_eq!(failed.retry_delay_ms, *delay_ms);
                prop_assert_eq!(life.uncounted, u32::from(!counted));
            }
        }
    }

    /// redrive's own releases are never charged and take the attempt back; a consumer's
    /// are uncharged exactly while fewer than `max_rate_limited` were since the last
    /// redrive, and then count as a failed attempt.
    #[test]
    fn a_release_takes_the_attempt_back_within_its_bound(
        life in leased(), policy in policy(), by_consumer in any::<bool>(),
        until in 0u64..60_000, seed in any::<u64>(),
    ) {
        let lease = LeaseRef { id: MessageId::new(), token: "1-00".into() };
        let release = Release {
            lease,
            until: now().plus_ms(until),
            by: if by_consumer { ReleaseBy::Consumer } else { ReleaseBy::Redrive },
            waited: Vec::new(),
        };
        let mut after = life.clone();
        let step = rules::release(&mut after, &policy, &release, now(), &mut SplitMix64::new(seed));
        let charged = by_consumer && life.released >= policy.max_rate_limited;
        prop_assert_eq!(step.is_some(), charged);
        prop_assert_eq!(after.lease_end, Some(LeaseEnd::Settled(Settled::Released)));
        if !charged {
            prop_assert_eq!(after.attempts, life.attempts - 1);
            prop_assert_eq!(after.released, life.released + u32::from(by_consumer));
            prop_assert_eq!(after.state == State::Scheduled, until > 0);
            prop_assert_eq!(after.lease_expires_at, None);
            if until > 0 {
                prop_assert_eq!(after.due_at, Some(release.until));
            } else {
                prop_assert_eq!(after.due_at, life.due_at, "a ready release keeps its place");
            }
        } else {
            prop_assert_eq!(after.attempts, life.attempts);
            prop_assert!(after.state == State::Dead || after.due_at >= Some(release.until));
        }
    }

    /// A redrive gives a fresh budget and window and is refused (changing nothing) outside
    /// dead and scheduled; a kill is refused on a finished message.
    #[test]
    fn redrive_gives_a_fresh_budget_and_only_where_allowed(life in lifecycle(), policy in policy()) {
        let mut after = life.clone();
        match rules::redrive(&mut after, false, None, now()) {
            Ok(entry) => {
                prop_assert!(matches!(life.state, State::Dead | State::Scheduled));
                prop_assert_eq!(after.state, State::Ready);
                prop_assert_eq!(after.counted_attempts(), 0);
                prop_assert_eq!(after.window_start(), now());
                prop_assert_eq!(after.released, 0);
                prop_assert_eq!(after.max_attempts(&policy), life.attempts + policy.max_attempts);
                prop_assert_eq!(entry.attempt, life.attempts);
            }
            Err(StoreError::InvalidState { .. }) => prop_assert_eq!(&after, &life),
            Err(e) => prop_assert!(false, "{e}"),
        }
        let mut killed = life.clone();
        match rules::kill(&mut killed, None, now()) {
            Ok(_) => {
                prop_assert!(!life.state.is_final());
                prop_assert_eq!(killed.state, State::Dead);
                prop_assert_eq!(
                    killed.lease_end,
                    if life.state == State::Leased { Some(LeaseEnd::Settled(Settled::Killed)) } else { life.lease_end }
                );
            }
            Err(_) => prop_assert_eq!(&killed, &life),
        }
    }

    /// Per-key ordering: at most one message of a key is leasable; it is ready, the oldest
    /// taking part in the key's order, and there is none while one is leased.
    #[test]
    fn a_key_has_at_most_one_leasable_head(
        states in proptest::collection::vec(state(), 0..12), block in any::<bool>(),
    ) {
        let mode = if block { KeyMode::Block } else { KeyMode::Skip };
        let messages: Vec<(usize, State)> = states.iter().copied().enumerate().collect();
        let head = rules::key_head(mode, messages.iter().copied());
        let leased = states.contains(&State::Leased);
        let first = messages.iter().find(|(_, s)| mode.takes_part(*s));
        match head {
            Some(i) => {
                prop_assert!(!leased);
                prop_assert_eq!(states[i], State::Ready);
                prop_assert_eq!(first.map(|(i, _)| *i), Some(i));
            }
            None => prop_assert!(leased || first.is_none_or(|(_, s)| *s != State::Ready)),
        }
        prop_assert_eq!(rules::key_head(KeyMode::Unordered, messages), None);
    }
}

/// The lease-end names round-trip, and a token says its attempt.
#[test]
fn lease_ends_and_tokens_parse() {
    for end in [
        LeaseEnd::Expired,
        LeaseEnd::Settled(Settled::Acked),
        LeaseEnd::Settled(Settled::Nacked),
        LeaseEnd::Settled(Settled::Released),
        LeaseEnd::Settled(Settled::Killed),
    ] {
        assert_eq!(LeaseEnd::parse(end.as_str()), Some(end));
    }
    assert_eq!(LeaseEnd::parse("lost"), None);
    assert_eq!(rules::token_attempt("7-00ff00ff00ff00ff"), Some(7));
    assert_eq!(rules::token_attempt("nonsense"), None);
}
