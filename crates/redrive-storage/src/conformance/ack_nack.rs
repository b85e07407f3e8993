//! Ack and nack: retried acks, per-item batch answers, and what the retry policy makes of each failure class (transient, permanent, rate limited, `max_attempts`, `max_age`).

use super::helpers::*;
use super::*;

pub async fn ack_retried_with_same_token_succeeds<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 1_000, at(0)).await;
    let first = ack(&*s, m.id, &l.token, at(10)).await.expect("ack");
    assert!(!first.repeated, "the first ack is not a repeat");
    let again = ack(&*s, m.id, &l.token, at(20))
        .await
        .expect("a retried ack with the same token");
    assert_eq!(again.message.state, State::Done);
    // Issue 5, defect 13: a repeat says so, so that it is not counted twice.
    assert!(again.repeated, "a retried ack is not marked as a repeat");
    let late = ack(&*s, m.id, &l.token, at(50_000))
        .await
        .expect("a retried ack after the lease time");
    assert_eq!(late.message.state, State::Done);
    assert!(late.repeated);
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

pub async fn batch_ack_nack_answer_per_item<S: Store>(s: Arc<S>) {
    let items: Vec<NewMessage> = (0..3).map(|i| msg(Q, json!(i))).collect();
    s.publish(items, Some(at(0))).await.expect("publish");
    let ls = lease(&*s, Q, 3, 30_000, at(0)).await;
    assert_eq!(ls.len(), 3);
    let (a, b, c) = (&ls[0], &ls[1], &ls[2]);
    let r = s
        .ack(
            vec![
                lref(a.message.id, &a.token).into(),
                lref(b.message.id, "bogus").into(),
                lref(c.message.id, &c.token).into(),
            ],
            Some(at(1)),
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
                    response: None,
                    waited: Vec::new(),
                    lease: lref(b.message.id, &b.token),
                    failure: failure(ErrorClass::Transient, "x"),
                },
                Nack {
                    response: None,
                    waited: Vec::new(),
                    lease: lref(a.message.id, &a.token),
                    failure: failure(ErrorClass::Transient, "x"),
                },
                Nack {
                    response: None,
                    waited: Vec::new(),
                    lease: lref(MessageId::new(), "t"),
                    failure: failure(ErrorClass::Transient, "x"),
                },
            ],
            Some(at(2)),
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

pub async fn nack_transient_schedules_retry<S: Store>(s: Arc<S>) {
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

pub async fn nack_until_dead_max_attempts<S: Store>(s: Arc<S>) {
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

pub async fn nack_permanent_is_dead_now<S: Store>(s: Arc<S>) {
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

pub async fn rate_limited_honours_retry_after_and_is_not_counted<S: Store>(s: Arc<S>) {
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

pub async fn max_age_ends_retries<S: Store>(s: Arc<S>) {
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

/// Defect 5 of issue 5: `rate_limited` with `retry_after: "0s"` on a fixed 1 s policy
/// was a hot loop (680 deliveries in 2 s, each rewriting the history, until `max_age`).
/// Each retry waits at least the policy's delay (1 s), and after [`MAX_RATE_LIMITED`]
/// uncharged ones the rate-limited attempts count against `max_attempts`.
pub async fn rate_limited_retry_after_zero_waits_policy_delay_then_counts<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let zero = || Failure {
        retry_after_ms: Some(0),
        ..failure(ErrorClass::RateLimited, "429")
    };
    let mut now = 0i64;
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        tick(&*s, at(now)).await;
        let l = lease_one(&*s, Q, m.id, 30_000, at(now)).await;
        assert_eq!(l.attempt, attempt);
        let out = nack(&*s, m.id, &l.token, zero(), at(now))
            .await
            .expect("nack");
        // Uncharged: MAX_RATE_LIMITED of them; then charged: MAX_ATTEMPTS of them.
        if attempt == MAX_RATE_LIMITED + MAX_ATTEMPTS {
            assert_eq!(
                out.dead_reason,
                Some(DeadReason::MaxAttempts),
                "attempt {attempt}: charged rate limits end at max_attempts"
            );
            break;
        }
        assert_eq!(
            out.message.state,
            State::Scheduled,
            "attempt {attempt}: {out:?}"
        );
        assert_eq!(
            out.retry_delay_ms,
            Some(RETRY_DELAY_MS),
            "attempt {attempt}: retry_after 0s must wait the policy's delay"
        );
        assert_eq!(out.message.due_at, Some(at(now + RETRY_DELAY_MS as i64)));
        assert!(
            lease(&*s, Q, 1, 30_000, at(now + RETRY_DELAY_MS as i64 - 1))
                .await
                .is_empty()
                && tick(&*s, at(now + RETRY_DELAY_MS as i64 - 1))
                    .await
                    .ready_queues
                    .is_empty(),
            "attempt {attempt}: deliverable before the policy's delay"
        );
        assert!(attempt < MAX_RATE_LIMITED + MAX_ATTEMPTS, "never dead");
        now += RETRY_DELAY_MS as i64;
    }
    let dead = get(&*s, m.id).await;
    assert_eq!(dead.attempts, MAX_RATE_LIMITED + MAX_ATTEMPTS);
    // A redrive gives a fresh budget of uncharged rate limits too.
    s.redrive(m.id, Some(at(now + 1))).await.expect("redrive");
    for n in 1..=MAX_RATE_LIMITED {
        let t = now + 1 + (n as i64 - 1) * RETRY_DELAY_MS as i64;
        tick(&*s, at(t)).await;
        let l = lease_one(&*s, Q, m.id, 30_000, at(t)).await;
        let out = nack(&*s, m.id, &l.token, zero(), at(t))
            .await
            .expect("nack");
        assert_eq!(
            out.message.state,
            State::Scheduled,
            "after redrive, rate limit {n}"
        );
    }
}

fn response(status: Option<u16>, body: &str) -> redrive_core::AttemptResponse {
    redrive_core::AttemptResponse {
        status,
        latency_ms: 12,
        body: Some(body.to_owned()),
        ..Default::default()
    }
}

/// Push delivery records what the endpoint answered in each attempt's history entry.
pub async fn responses_are_kept_in_history<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 30_000, at(0)).await;
    let failed = s
        .nack(
            vec![Nack {
                lease: lref(m.id, &l.token),
                failure: failure(ErrorClass::Transient, "503 Service Unavailable"),
                response: Some(response(Some(503), "busy")),
                waited: Vec::new(),
            }],
            Some(at(5)),
        )
        .await
        .expect("nack")
        .remove(0)
        .expect("nack item");
    assert_eq!(failed.message.state, State::Scheduled);
    tick(&*s, at(5 + RETRY_DELAY_MS as i64)).await;
    let l = lease_one(&*s, Q, m.id, 30_000, at(5 + RETRY_DELAY_MS as i64)).await;
    s.ack(
        vec![Ack {
            lease: lref(m.id, &l.token),
            response: Some(response(Some(200), "ok")),
            event: crate::AckEvent::Acked,
            waited: Vec::new(),
        }],
        Some(at(2_000)),
    )
    .await
    .expect("ack")
    .remove(0)
    .expect("ack item");
    let got = get(&*s, m.id).await;
    let seen: Vec<_> = got.history.iter().map(|h| h.response.clone()).collect();
    assert_eq!(
        seen,
        vec![
            Some(response(Some(503), "busy")),
            Some(response(Some(200), "ok"))
        ],
        "{:?}",
        got.history
    );
    assert!(matches!(got.history[1].event, HistoryEvent::Acked));
    // A consumer's ack records no response.
    let m2 = publish(&*s, msg(Q, json!("y")), at(3_000)).await;
    let l2 = lease_one(&*s, Q, m2.id, 30_000, at(3_000)).await;
    ack(&*s, m2.id, &l2.token, at(3_001)).await.expect("ack");
    assert_eq!(get(&*s, m2.id).await.history[0].response, None);
}

/// A 410 from a push endpoint: dead at once, `endpoint_gone`, whatever attempts are left.
pub async fn endpoint_gone_is_dead_now<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 30_000, at(0)).await;
    let out = nack(
        &*s,
        m.id,
        &l.token,
        Failure::endpoint_gone("410 Gone"),
        at(1),
    )
    .await
    .expect("nack");
    assert_eq!(out.message.state, State::Dead);
    assert_eq!(out.dead_reason, Some(DeadReason::EndpointGone));
    assert_eq!(
        get(&*s, m.id).await.dead_reason,
        Some(DeadReason::EndpointGone)
    );
}

/// A released lease (push delivery parking a message) is not an attempt: the message is
/// ready again in its place, its attempt count as before, nothing in its history.
pub async fn release_takes_the_attempt_back<S: Store>(s: Arc<S>) {
    let a = publish(&*s, msg(Q, json!("a")), at(0)).await;
    let b = publish(&*s, msg(Q, json!("b")), at(1)).await;
    let l = lease_one(&*s, Q, a.id, 30_000, at(2)).await;
    assert_eq!(l.attempt, 1);
    let back = release_one(&*s, a.id, &l.token, at(3), at(3))
        .await
        .expect("release item");
    assert_eq!(back.state, State::Ready);
    assert_eq!(back.attempts, 0, "the released attempt was charged");
    assert_eq!(count(&*s, Q, State::Leased).await, 0);
    assert_eq!(count(&*s, Q, State::Ready).await, 2);
    // Oldest first still: the released message keeps its due time, ahead of b.
    let again = lease(&*s, Q, 2, 30_000, at(4)).await;
    assert_eq!(ids(&again), vec![a.id, b.id]);
    assert_eq!(
        again[0].attempt, 1,
        "the redelivery is still the first attempt"
    );
    assert_ne!(again[0].token, l.token);
    expect_err(
        ack(&*s, a.id, &l.token, at(5)).await,
        "ack with the released lease's token",
        is_mismatch,
    );
    ack(&*s, a.id, &again[0].token, at(5)).await.expect("ack");
    let got = get(&*s, a.id).await;
    assert_eq!(got.history.len(), 1, "{:?}", got.history);
    assert_eq!(got.history[0].attempt, 1);
}

/// A release with a later `until` schedules the message, and the tick makes it ready.
pub async fn release_until_later_schedules<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 30_000, at(0)).await;
    let back = release_one(&*s, m.id, &l.token, at(5_000), at(10))
        .await
        .expect("release item");
    assert_eq!(back.state, State::Scheduled);
    assert_eq!(back.due_at, Some(at(5_000)));
    assert!(lease(&*s, Q, 1, 30_000, at(4_999)).await.is_empty());
    tick(&*s, at(5_000)).await;
    let again = lease(&*s, Q, 1, 30_000, at(5_000)).await;
    assert_eq!(ids(&again), vec![m.id]);
    assert_eq!(again[0].attempt, 1);
}

/// Only the live lease can be released.
pub async fn release_of_a_stale_lease_is_refused<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 1_000, at(0)).await;
    let r = release_one(&*s, m.id, "bogus", at(1), at(1)).await;
    expect_err(r, "release with a wrong token", is_mismatch);
    let r = release_one(&*s, m.id, &l.token, at(1), at(2_000)).await;
    expect_err(r, "release of an expired lease", is_expired);
    assert_eq!(get(&*s, m.id).await.attempts, 1);
}

/// Issue 15 §3: push delivery parks a message (release) or attempts it late with a note of
/// what it waited for. The history gets one `waited` entry per reason between two attempts,
/// however often it is parked, before the attempt's own entry; nothing is charged.
pub async fn wait_notes_are_one_entry_per_episode_before_the_attempt<S: Store>(s: Arc<S>) {
    use redrive_core::{HistoryEvent, Waited, WaitedFor};
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let budget = |since| Waited {
        waited_for: WaitedFor::Budget,
        since: at(since),
        parked: true,
    };
    // Parked 50 times by the budget.
    let mut t = 10;
    for _ in 0..50 {
        let l = lease_one(&*s, Q, m.id, 30_000, at(t)).await;
        assert_eq!(l.attempt, 1, "a park charged the attempt");
        let back = s
            .release(
                vec![Release {
                    lease: lref(m.id, &l.token),
                    until: at(t),
                    by: crate::ReleaseBy::Redrive,
                    waited: vec![budget(t)],
                }],
                Some(at(t)),
            )
            .await
            .expect("release request")
            .remove(0)
            .expect("release");
        assert_eq!(back.message().attempts, 0);
        t += 10;
    }
    // Then it waits in the store for the breaker, and the attempt fails.
    let l = lease_one(&*s, Q, m.id, 30_000, at(t)).await;
    let breaker = Waited {
        waited_for: WaitedFor::Breaker,
        since: at(t - 5),
        parked: false,
    };
    s.nack(
        vec![Nack {
            lease: lref(m.id, &l.token),
            failure: failure(ErrorClass::Transient, "503"),
            response: None,
            waited: vec![breaker, budget(t)],
        }],
        Some(at(t + 1)),
    )
    .await
    .expect("nack request")
    .remove(0)
    .expect("nack");
    let got = get(&*s, m.id).await;
    assert_eq!(got.attempts, 1, "{:?}", got.history);
    let h = &got.history;
    assert_eq!(h.len(), 3, "{h:?}");
    assert_eq!(
        h[0].event,
        HistoryEvent::Waited {
            waited_for: WaitedFor::Budget,
            since: at(10),
            parks: 51
        }
    );
    assert_eq!((h[0].attempt, h[0].at), (1, at(t + 1)));
    assert_eq!(
        h[1].event,
        HistoryEvent::Waited {
            waited_for: WaitedFor::Breaker,
            since: at(t - 5),
            parks: 0
        }
    );
    assert!(matches!(h[2].event, HistoryEvent::Failed { .. }));
    assert_eq!(h[2].attempt, 1);
    // The next attempt's wait is a new episode; a retried ack notes nothing twice.
    tick(&*s, at(10_000)).await;
    let l = lease_one(&*s, Q, m.id, 30_000, at(10_000)).await;
    let note = Waited {
        waited_for: WaitedFor::Pace,
        since: at(9_000),
        parked: false,
    };
    for _ in 0..2 {
        s.ack(
            vec![Ack {
                lease: lref(m.id, &l.token),
                response: None,
                event: crate::AckEvent::Acked,
                waited: vec![note],
            }],
            Some(at(10_001)),
        )
        .await
        .expect("ack request")
        .remove(0)
        .expect("ack");
    }
    let got = get(&*s, m.id).await;
    let h = &got.history;
    assert_eq!(h.len(), 5, "{h:?}");
    assert_eq!(h[3].attempt, 2);
    assert!(matches!(
        h[3].event,
        HistoryEvent::Waited {
            waited_for: WaitedFor::Pace,
            ..
        }
    ));
    assert!(matches!(h[4].event, HistoryEvent::Acked));
    assert_eq!(got.attempts, 2);
}

/// Release one lease (`token` of `id`) until `until`, as redrive itself does (push
/// parking: never charged); the item's own answer.
async fn release_one<S: Store>(
    s: &S,
    id: MessageId,
    token: &str,
    until: Timestamp,
    now: Timestamp,
) -> Result<Message, StoreError> {
    release_by(s, id, token, until, ReleaseBy::Redrive, now)
        .await
        .map(Released::into_message)
}

/// Release one lease as `by`; the item's own answer.
async fn release_by<S: Store>(
    s: &S,
    id: MessageId,
    token: &str,
    until: Timestamp,
    by: ReleaseBy,
    now: Timestamp,
) -> Result<Released, StoreError> {
    s.release(
        vec![Release {
            lease: lref(id, token),
            until,
            by,
            waited: Vec::new(),
        }],
        Some(now),
    )
    .await
    .expect("release request")
    .remove(0)
}

fn settled(how: Settled) -> impl Fn(&StoreError) -> bool {
    move |e| matches!(e, StoreError::LeaseSettled(h) if *h == how)
}

fn expect_settled<T: std::fmt::Debug>(r: Result<T, StoreError>, what: &str, how: Settled) {
    match r {
        Err(e) if settled(how)(&e) => {
            assert!(
                e.to_string().contains(how.as_str()),
                "{what}: the error does not say {}: {e}",
                how.as_str()
            );
        }
        other => panic!(
            "{what}: expected lease_settled ({}), got {other:?}",
            how.as_str()
        ),
    }
}

/// Issue 15, defect 10: a call with the token of a lease that was settled answers how it
/// was settled (acked, nacked, released), never `lease_expired`, and changes nothing.
pub async fn late_calls_after_a_settled_lease_say_how<S: Store>(s: Arc<S>) {
    let transient = || failure(ErrorClass::Transient, "x");
    // Acked: a nack, an extend and a release with its token are refused as acked (a repeated
    // ack succeeds again: `ack_retried_with_same_token_succeeds`).
    let a = publish(&*s, msg(Q, json!("a")), at(0)).await;
    let la = lease_one(&*s, Q, a.id, 30_000, at(0)).await;
    ack(&*s, a.id, &la.token, at(1)).await.expect("ack");
    expect_settled(
        nack(&*s, a.id, &la.token, transient(), at(2)).await,
        "nack after ack",
        Settled::Acked,
    );
    expect_settled(
        s.extend(lref(a.id, &la.token), 10_000, Some(at(2))).await,
        "extend after ack",
        Settled::Acked,
    );
    expect_settled(
        release_by(&*s, a.id, &la.token, at(2), ReleaseBy::Consumer, at(2)).await,
        "release after ack",
        Settled::Acked,
    );
    assert_eq!(
        get(&*s, a.id).await.history.len(),
        1,
        "a late call wrote history"
    );

    // Nacked: an ack (the case of the issue), a nack again, an extend, a release.
    let b = publish(&*s, msg(Q, json!("b")), at(10)).await;
    let lb = lease_one(&*s, Q, b.id, 30_000, at(10)).await;
    nack(&*s, b.id, &lb.token, transient(), at(11))
        .await
        .expect("nack");
    expect_settled(
        ack(&*s, b.id, &lb.token, at(12)).await,
        "ack after nack",
        Settled::Nacked,
    );
    expect_settled(
        nack(&*s, b.id, &lb.token, transient(), at(12)).await,
        "nack after nack",
        Settled::Nacked,
    );
    expect_settled(
        s.extend(lref(b.id, &lb.token), 10_000, Some(at(12))).await,
        "extend after nack",
        Settled::Nacked,
    );
    let got = get(&*s, b.id).await;
    assert_eq!(
        (got.state, got.attempts, got.history.len()),
        (State::Scheduled, 1, 1)
    );

    // Released: by a consumer and by redrive alike.
    for (n, by) in [(0, ReleaseBy::Consumer), (1, ReleaseBy::Redrive)] {
        let c = publish(&*s, msg(Q, json!(["c", n])), at(20)).await;
        let lc = lease_one(&*s, Q, c.id, 30_000, at(20)).await;
        release_by(&*s, c.id, &lc.token, at(21), by, at(21))
            .await
            .expect("release");
        expect_settled(
            nack(&*s, c.id, &lc.token, transient(), at(22)).await,
            "nack after release",
            Settled::Released,
        );
        expect_settled(
            ack(&*s, c.id, &lc.token, at(22)).await,
            "ack after release",
            Settled::Released,
        );
        expect_settled(
            release_by(&*s, c.id, &lc.token, at(22), by, at(22)).await,
            "release after release",
            Settled::Released,
        );
        let got = get(&*s, c.id).await;
        assert_eq!((got.state, got.attempts), (State::Ready, 0), "{by:?}");
        assert!(got.history.is_empty(), "{by:?}: {:?}", got.history);
        // Once leased again, the old token is another lease's: a mismatch.
        let again = lease_one(&*s, Q, c.id, 30_000, at(23)).await;
        expect_err(
            ack(&*s, c.id, &lc.token, at(24)).await,
            "the released token after a new lease",
            is_mismatch,
        );
        ack(&*s, c.id, &again.token, at(24))
            .await
            .expect("ack of the new lease");
    }
}

/// `lease_expired` is kept for leases that expired: past their expiry before the reaper
/// ran, and after it failed the attempt.
pub async fn ack_after_real_expiry_is_lease_expired<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 1_000, at(0)).await;
    expect_err(
        ack(&*s, m.id, &l.token, at(1_500)).await,
        "ack past expiry, not reaped",
        is_expired,
    );
    let t = tick(&*s, at(1_500)).await;
    assert_eq!(t.expired.len(), 1);
    expect_err(
        ack(&*s, m.id, &l.token, at(1_600)).await,
        "ack after the reaper",
        is_expired,
    );
    expect_err(
        nack(
            &*s,
            m.id,
            &l.token,
            failure(ErrorClass::Transient, "x"),
            at(1_600),
        )
        .await,
        "nack after the reaper",
        is_expired,
    );
    expect_err(
        release_by(
            &*s,
            m.id,
            &l.token,
            at(1_600),
            ReleaseBy::Consumer,
            at(1_600),
        )
        .await,
        "release after the reaper",
        is_expired,
    );
    expect_err(
        s.extend(lref(m.id, &l.token), 1_000, Some(at(1_600))).await,
        "extend after the reaper",
        is_expired,
    );
}

/// A batch answers each item with its own reason: settled (and how), expired, mismatch.
pub async fn batch_items_say_how_a_lease_was_settled<S: Store>(s: Arc<S>) {
    let items: Vec<NewMessage> = (0..4).map(|i| msg(Q, json!(i))).collect();
    s.publish(items, Some(at(0))).await.expect("publish");
    let ls = lease(&*s, Q, 4, 30_000, at(0)).await;
    let (a, b, c, d) = (&ls[0], &ls[1], &ls[2], &ls[3]);
    ack(&*s, a.message.id, &a.token, at(1))
        .await
        .expect("ack a");
    nack(
        &*s,
        b.message.id,
        &b.token,
        failure(ErrorClass::Transient, "x"),
        at(1),
    )
    .await
    .expect("nack b");
    release_by(
        &*s,
        c.message.id,
        &c.token,
        at(1),
        ReleaseBy::Consumer,
        at(1),
    )
    .await
    .expect("release c");
    let r = s
        .ack(
            vec![
                lref(b.message.id, &b.token).into(),
                lref(c.message.id, &c.token).into(),
                lref(d.message.id, &d.token).into(),
                lref(a.message.id, "bogus").into(),
            ],
            Some(at(2)),
        )
        .await
        .expect("batch ack");
    assert!(
        matches!(r[0], Err(StoreError::LeaseSettled(Settled::Nacked))),
        "{:?}",
        r[0]
    );
    assert!(
        matches!(r[1], Err(StoreError::LeaseSettled(Settled::Released))),
        "{:?}",
        r[1]
    );
    assert!(r[2].is_ok(), "{:?}", r[2]);
    assert!(matches!(r[3], Err(StoreError::LeaseMismatch)), "{:?}", r[3]);
    let r = s
        .nack(
            vec![
                Nack {
                    response: None,
                    waited: Vec::new(),
                    lease: lref(a.message.id, &a.token),
                    failure: failure(ErrorClass::Transient, "x"),
                },
                Nack {
                    response: None,
                    waited: Vec::new(),
                    lease: lref(d.message.id, &d.token),
                    failure: failure(ErrorClass::Transient, "x"),
                },
            ],
            Some(at(3)),
        )
        .await
        .expect("batch nack");
    assert!(
        matches!(r[0], Err(StoreError::LeaseSettled(Settled::Acked))),
        "{:?}",
        r[0]
    );
    assert!(
        matches!(r[1], Err(StoreError::LeaseSettled(Settled::Acked))),
        "{:?}",
        r[1]
    );
}

/// A consumer's release is uncharged `max_rate_limited` times (since the publish or the
/// last redrive); past that each one counts as a failed attempt coded `released`, waits
/// the policy's delay and ends dead of `max_attempts`: a consumer releasing everything it
/// leases cannot keep a message in a hot loop.
pub async fn consumer_release_is_uncharged_up_to_max_rate_limited_then_counts<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let mut now = 0;
    for n in 1..=MAX_RATE_LIMITED {
        let l = lease_one(&*s, Q, m.id, 30_000, at(now)).await;
        assert_eq!(
            l.attempt, 1,
            "release {n}: an uncharged release took an attempt"
        );
        match release_by(&*s, m.id, &l.token, at(now), ReleaseBy::Consumer, at(now))
            .await
            .expect("release")
        {
            Released::Uncharged(back) => {
                assert_eq!(
                    (back.state, back.attempts),
                    (State::Ready, 0),
                    "release {n}"
                );
            }
            other => panic!("release {n} of {MAX_RATE_LIMITED} was charged: {other:?}"),
        }
        now += 1;
    }
    assert!(get(&*s, m.id).await.history.is_empty());
    // Past the bound: each release is a failed attempt.
    for attempt in 1..=MAX_ATTEMPTS {
        tick(&*s, at(now)).await;
        let l = lease_one(&*s, Q, m.id, 30_000, at(now)).await;
        assert_eq!(l.attempt, attempt);
        let out = match release_by(&*s, m.id, &l.token, at(now), ReleaseBy::Consumer, at(now))
            .await
            .expect("release")
        {
            Released::Charged(out) => out,
            other => panic!("release past the bound, attempt {attempt}, was uncharged: {other:?}"),
        };
        let got = get(&*s, m.id).await;
        assert_eq!(got.attempts, attempt);
        let last = got
            .history
            .last()
            .expect("a charged release is in the history");
        match &last.event {
            HistoryEvent::Failed { error, .. } => {
                assert_eq!(error.code.as_deref(), Some("released"));
                assert_eq!(error.class, ErrorClass::Transient);
            }
            e => panic!("{e:?}"),
        }
        if attempt < MAX_ATTEMPTS {
            assert_eq!(out.message.state, State::Scheduled);
            assert_eq!(
                out.retry_delay_ms,
                Some(RETRY_DELAY_MS),
                "the policy's delay"
            );
            assert_eq!(out.message.due_at, Some(at(now + RETRY_DELAY_MS as i64)));
        } else {
            assert_eq!(out.message.state, State::Dead);
            assert_eq!(out.dead_reason, Some(DeadReason::MaxAttempts));
        }
        expect_settled(
            ack(&*s, m.id, &l.token, at(now)).await,
            "ack after a charged release",
            Settled::Released,
        );
        now += RETRY_DELAY_MS as i64;
    }
    assert_eq!(failures(&get(&*s, m.id).await).len(), MAX_ATTEMPTS as usize);
}

/// A charged release's own `delay` holds when it is longer than the policy's.
pub async fn charged_release_waits_its_delay_when_longer<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    for n in 0..MAX_RATE_LIMITED as i64 {
        let l = lease_one(&*s, Q, m.id, 30_000, at(n)).await;
        release_by(&*s, m.id, &l.token, at(n), ReleaseBy::Consumer, at(n))
            .await
            .expect("release");
    }
    let now = MAX_RATE_LIMITED as i64;
    let l = lease_one(&*s, Q, m.id, 30_000, at(now)).await;
    let until = at(now + 10_000);
    let out = match release_by(&*s, m.id, &l.token, until, ReleaseBy::Consumer, at(now))
        .await
        .expect("release")
    {
        Released::Charged(out) => out,
        other => panic!("{other:?}"),
    };
    assert_eq!(out.message.state, State::Scheduled);
    assert_eq!(
        out.message.due_at,
        Some(until),
        "the release's delay, longer than 1 s"
    );
    assert_eq!(out.retry_delay_ms, Some(10_000));
    tick(&*s, at(now + 9_999)).await;
    assert!(lease(&*s, Q, 1, 30_000, at(now + 9_999)).await.is_empty());
}

/// Releases by redrive itself (push parking) are never bounded, and a redrive gives a
/// consumer a fresh bound of uncharged releases.
pub async fn redrive_renews_the_release_bound<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let mut now = 0;
    for _ in 0..(MAX_RATE_LIMITED * 3) {
        let l = lease_one(&*s, Q, m.id, 30_000, at(now)).await;
        release_one(&*s, m.id, &l.token, at(now), at(now))
            .await
            .expect("redrive's own release");
        now += 1;
    }
    assert_eq!(
        get(&*s, m.id).await.attempts,
        0,
        "a parked message was charged"
    );
    for _ in 0..MAX_RATE_LIMITED {
        let l = lease_one(&*s, Q, m.id, 30_000, at(now)).await;
        release_by(&*s, m.id, &l.token, at(now), ReleaseBy::Consumer, at(now))
            .await
            .expect("release");
        now += 1;
    }
    // The next one counts; kill it and redrive it: the bound is fresh again.
    let l = lease_one(&*s, Q, m.id, 30_000, at(now)).await;
    assert!(matches!(
        release_by(&*s, m.id, &l.token, at(now), ReleaseBy::Consumer, at(now)).await,
        Ok(Released::Charged(_))
    ));
    s.kill(m.id, None, Some(at(now))).await.expect("kill");
    s.redrive(m.id, Some(at(now))).await.expect("redrive");
    let l = lease_one(&*s, Q, m.id, 30_000, at(now)).await;
    assert!(
        matches!(
            release_by(&*s, m.id, &l.token, at(now), ReleaseBy::Consumer, at(now)).await,
            Ok(Released::Uncharged(_))
        ),
        "a redrive did not renew the bound of uncharged releases"
    );
}

async fn return_one<S: Store>(
    s: &S,
    id: MessageId,
    attempt: u32,
    now: Timestamp,
) -> Result<Option<FailureOutcome>, StoreError> {
    s.returned(
        vec![Returned {
            id,
            attempt,
            failure: failure(ErrorClass::Transient, "rejected by the consumer"),
        }],
        Some(now),
    )
    .await
    .expect("returned request")
    .remove(0)
}

/// A bridge's delivery that the broker's consumer rejected after redrive counted it done:
/// the attempt fails, the policy schedules the next one, and a repeat changes nothing.
pub async fn returned_fails_the_delivered_attempt_once<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 30_000, at(0)).await;
    ack(&*s, m.id, &l.token, at(10)).await.expect("ack");
    assert_eq!(count(&*s, Q, State::Done).await, 1);
    let out = return_one(&*s, m.id, 1, at(20))
        .await
        .expect("returned")
        .expect("applied");
    assert_eq!(out.message.state, State::Scheduled);
    assert_eq!(out.message.due_at, Some(at(20 + RETRY_DELAY_MS as i64)));
    assert_eq!(out.message.attempts, 1);
    assert_eq!(
        out.message.finished_at, None,
        "a returned message is not finished"
    );
    assert_eq!(count(&*s, Q, State::Done).await, 0);
    assert_eq!(count(&*s, Q, State::Scheduled).await, 1);
    // The same return again (a crash between storing it and acking it to the broker), or
    // one for another attempt: nothing changes.
    assert!(return_one(&*s, m.id, 1, at(30))
        .await
        .expect("repeat")
        .is_none());
    assert!(return_one(&*s, m.id, 7, at(30))
        .await
        .expect("other")
        .is_none());
    let got = get(&*s, m.id).await;
    assert_eq!(got.history.len(), 2, "{:?}", got.history);
    assert!(matches!(got.history[1].event, HistoryEvent::Failed { .. }));
    tick(&*s, at(20 + RETRY_DELAY_MS as i64)).await;
    let again = lease_one(&*s, Q, m.id, 30_000, at(20 + RETRY_DELAY_MS as i64)).await;
    assert_eq!(again.attempt, 2);
    expect_err(
        return_one(&*s, MessageId::new(), 1, at(40)).await,
        "a return of an unknown message",
        is_not_found,
    );
}

/// A bridge's ack of a republish makes the message `done` like any ack, and its history
/// says `republished` (the broker took the copy; no consumer has processed it yet). A
/// return of that attempt still fails it, and a retried republished ack still succeeds.
pub async fn republished_ack_is_recorded_as_republished<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 30_000, at(0)).await;
    let ack_republished = |at_ms| {
        let s = s.clone();
        let token = l.token.clone();
        async move {
            s.ack(vec![Ack::republished(lref(m.id, &token))], Some(at(at_ms)))
                .await
                .expect("ack")
                .remove(0)
        }
    };
    let done = ack_republished(10).await.expect("republished ack");
    assert_eq!(done.message.state, State::Done);
    assert!(!done.repeated);
    assert!(ack_republished(11).await.expect("retried").repeated);
    let got = get(&*s, m.id).await;
    assert_eq!(got.history.len(), 1, "{:?}", got.history);
    assert_eq!(got.history[0].event, HistoryEvent::Republished);
    assert_eq!(got.history[0].attempt, 1);
    let out = return_one(&*s, m.id, 1, at(20))
        .await
        .expect("returned")
        .expect("applied");
    assert_eq!(out.message.state, State::Scheduled);
}

/// The consumer can reject before the bridge acks its republish: the return applies to the
/// leased message, and the late ack is refused (it does not make the message done).
pub async fn returned_before_the_ack_wins_over_it<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 30_000, at(0)).await;
    let out = return_one(&*s, m.id, 1, at(5))
        .await
        .expect("returned")
        .expect("applied");
    assert_eq!(out.message.state, State::Scheduled);
    let late = ack(&*s, m.id, &l.token, at(6)).await;
    assert!(
        late.is_err(),
        "a late ack made a returned message done: {late:?}"
    );
    let got = get(&*s, m.id).await;
    assert_eq!(got.state, State::Scheduled);
    // The copy's return proves the broker took it: the history reads republished, then
    // failed, for attempt 1, as when the ack comes first (issue 15: under load the return
    // won the race and the history lost the republish).
    let events: Vec<(u32, &str)> = got
        .history
        .iter()
        .map(|h| {
            let name = match &h.event {
                redrive_core::HistoryEvent::Republished => "republished",
                redrive_core::HistoryEvent::Failed { .. } => "failed",
                _ => "other",
            };
            (h.attempt, name)
        })
        .collect();
    assert_eq!(
        events,
        [(1, "republished"), (1, "failed")],
        "{:?}",
        got.history
    );
}

/// Returns count against `max_attempts` like any failed attempt.
pub async fn returned_until_dead<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let mut now = 0;
    for attempt in 1..=MAX_ATTEMPTS {
        tick(&*s, at(now)).await;
        let l = lease_one(&*s, Q, m.id, 30_000, at(now)).await;
        assert_eq!(l.attempt, attempt);
        ack(&*s, m.id, &l.token, at(now + 1)).await.expect("ack");
        let out = return_one(&*s, m.id, attempt, at(now + 2))
            .await
            .expect("returned")
            .expect("applied");
        now += 2 + RETRY_DELAY_MS as i64;
        if attempt == MAX_ATTEMPTS {
            assert_eq!(out.message.state, State::Dead);
            assert_eq!(out.dead_reason, Some(DeadReason::MaxAttempts));
        }
    }
    assert_eq!(count(&*s, Q, State::Dead).await, 1);
}

/// A message another retry mechanism already counted arrives with its count: its failure is
/// attempt `attempts_before + 1`, and the policy counts them all.
pub async fn failed_publish_counts_attempts_made_elsewhere<S: Store>(s: Arc<S>) {
    let mut m = msg(Q, json!("x"));
    m.failed = Some(failure(ErrorClass::Transient, "rejected"));
    m.attempts_before = 1;
    let p = publish(&*s, m, at(0)).await;
    assert_eq!(p.attempts, 2);
    assert_eq!(
        p.state,
        State::Scheduled,
        "2 of {MAX_ATTEMPTS} attempts: one is left"
    );
    let got = get(&*s, p.id).await;
    assert_eq!(got.history[0].attempt, 2);
    let mut m = msg(Q, json!("y"));
    m.failed = Some(failure(ErrorClass::Transient, "rejected"));
    m.attempts_before = MAX_ATTEMPTS - 1;
    let p = publish(&*s, m, at(0)).await;
    assert_eq!(p.state, State::Dead);
    assert_eq!(p.dead_reason, Some(DeadReason::MaxAttempts));
}

/// A failure reported at publish with `deliver_at` (an import of a retry table's
/// `next_retry_at`): the caller timed the next try, so a retry is due exactly then (now
/// when that is past), with the attempts made elsewhere counted; the policy still ends the
/// message when the budget is spent, the failure is permanent or the time falls past
/// `max_age`.
pub async fn failed_publish_with_deliver_at_is_due_then<S: Store>(s: Arc<S>) {
    let timed = |queue: &str, class: ErrorClass, before: u32, due: i64| NewMessage {
        failed: Some(failure(class, "imported")),
        attempts_before: before,
        deliver_at: Some(at(due)),
        ..msg(queue, json!({ "due": due, "before": before }))
    };
    // Attempt 2 of 3 failed elsewhere; the next try is at +5 s, not after the policy's 1 s.
    let mut out = s
        .publish(vec![timed(Q, ErrorClass::Transient, 1, 5_000)], Some(at(0)))
        .await
        .expect("publish");
    let p = out.remove(0);
    let m = &p.message;
    assert_eq!(m.state, State::Scheduled);
    assert_eq!(m.due_at, Some(at(5_000)), "due at deliver_at");
    assert_eq!(m.attempts, 2, "attempts made elsewhere are counted");
    let outcome = p.failure.expect("the policy's decision is reported");
    assert_eq!(outcome.retry_delay_ms, Some(5_000));
    assert_eq!(outcome.dead_reason, None);
    let got = get(&*s, m.id).await;
    assert_eq!(failures(&got), vec![(2, None)]);
    match &got.history[0].event {
        HistoryEvent::Failed {
            retry_at, delay_ms, ..
        } => {
            assert_eq!(*retry_at, Some(at(5_000)), "the history says when");
            assert_eq!(*delay_ms, Some(5_000));
        }
        other => panic!("the reported failure's entry is {other:?}"),
    }
    // Not before deliver_at, then it is the last try of the budget.
    tick(&*s, at(4_999)).await;
    assert!(lease(&*s, Q, 10, 30_000, at(4_999)).await.is_empty());
    tick(&*s, at(5_000)).await;
    let l = lease_one(&*s, Q, m.id, 30_000, at(5_000)).await;
    assert_eq!(l.attempt, 3);
    assert_eq!(l.max_attempts, MAX_ATTEMPTS, "the last try");
    ack(&*s, m.id, &l.token, at(5_001)).await.expect("ack");

    // A deliver_at in the past is due now.
    let past = publish(&*s, timed(OTHER, ErrorClass::Transient, 0, -60_000), at(0)).await;
    assert_eq!(past.state, State::Ready);
    assert_eq!(past.due_at, Some(at(0)));
    assert_eq!(past.attempts, 1);

    // The policy still ends it: budget spent, permanent, past max_age.
    let spent = publish(
        &*s,
        timed(Q, ErrorClass::Transient, MAX_ATTEMPTS - 1, 5_000),
        at(0),
    )
    .await;
    assert_eq!(spent.state, State::Dead);
    assert_eq!(spent.dead_reason, Some(DeadReason::MaxAttempts));
    assert_eq!(spent.attempts, MAX_ATTEMPTS);
    let permanent = publish(&*s, timed(Q, ErrorClass::Permanent, 4, 5_000), at(0)).await;
    assert_eq!(permanent.state, State::Dead);
    assert_eq!(permanent.dead_reason, Some(DeadReason::PermanentError));
    assert_eq!(permanent.attempts, 5);
    // SHORT_AGE's window is 1.5 s from the publish: +1.4 s is in it, +2 s is not.
    let inside = publish(
        &*s,
        timed(SHORT_AGE, ErrorClass::Transient, 3, 1_400),
        at(0),
    )
    .await;
    assert_eq!(inside.state, State::Scheduled);
    assert_eq!(inside.due_at, Some(at(1_400)));
    let outside = publish(
        &*s,
        timed(SHORT_AGE, ErrorClass::Transient, 3, 2_000),
        at(0),
    )
    .await;
    assert_eq!(outside.state, State::Dead);
    assert_eq!(outside.dead_reason, Some(DeadReason::MaxAge));
    assert_eq!(count(&*s, Q, State::Dead).await, 2);
    assert_eq!(count(&*s, SHORT_AGE, State::Scheduled).await, 1);
}
