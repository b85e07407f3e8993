//! Publishing: the happy path end to end, and a publish that reports a first failed attempt.

use super::helpers::*;
use super::*;

pub async fn publish_lease_ack<S: Store>(s: Arc<S>) {
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
    assert_eq!(
        done.history[0].leased_at,
        Some(at(5)),
        "the ack's entry records when its attempt was leased"
    );
    assert!(
        lease(&*s, Q, 10, 30_000, at(20)).await.is_empty(),
        "an acked message is leased again"
    );
    assert_eq!(count(&*s, Q, State::Done).await, 1);
}

pub async fn publish_with_failure_is_first_attempt<S: Store>(s: Arc<S>) {
    let p = s
        .publish(
            vec![NewMessage {
                failed: Some(failure(ErrorClass::Transient, "seen elsewhere")),
                ..msg(Q, json!("t"))
            }],
            Some(at(0)),
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
            Some(at(0)),
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
