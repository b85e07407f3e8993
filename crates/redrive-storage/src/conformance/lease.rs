//! Leasing: the order of delivery, `max`, and the fencing token (wrong, expired, extended).

use super::helpers::*;
use super::*;

pub async fn lease_order_is_priority_then_due_then_age<S: Store>(s: Arc<S>) {
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
        .publish(vec![msg(Q, json!(4)), msg(Q, json!(5))], Some(at(300)))
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

pub async fn lease_respects_max_and_empty_queue<S: Store>(s: Arc<S>) {
    assert!(
        lease(&*s, Q, 5, 30_000, at(0)).await.is_empty(),
        "lease of an empty queue"
    );
    let items: Vec<NewMessage> = (0..5).map(|i| msg(Q, json!(i))).collect();
    let published = s.publish(items, Some(at(0))).await.expect("publish batch");
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

pub async fn wrong_token_is_lease_mismatch<S: Store>(s: Arc<S>) {
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
        s.extend(lref(m.id, "bogus"), 10_000, Some(at(1))).await,
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

pub async fn expired_lease_is_refused<S: Store>(s: Arc<S>) {
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
        s.extend(lref(m.id, &l.token), 10_000, Some(at(1_000)))
            .await,
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

pub async fn extend_moves_expiry<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 1_000, at(0)).await;
    let e = s
        .extend(lref(m.id, &l.token), 5_000, Some(at(500)))
        .await
        .expect("extend");
    assert_eq!(e, at(5_500), "extend sets expiry to now + by");
    assert_eq!(get(&*s, m.id).await.lease_expires_at, Some(at(5_500)));
    let e = s
        .extend(lref(m.id, &l.token), 10, Some(at(600)))
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

/// Issue 15: a lease says which attempt is the last try (`attempt == max_attempts`): a
/// counted failure of that attempt makes the message dead, of none before it. After a
/// redrive (a fresh budget, the attempt numbers going on) and after uncharged rate limits
/// it moves on with them.
pub async fn lease_max_attempts_is_the_last_try<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let mut now = 0;
    let lease_at = |now: i64| {
        let s = s.clone();
        async move {
            tick(&*s, at(now)).await;
            lease_one(&*s, Q, m.id, 30_000, at(now)).await
        }
    };
    for attempt in 1..=MAX_ATTEMPTS {
        let l = lease_at(now).await;
        assert_eq!((l.attempt, l.max_attempts), (attempt, MAX_ATTEMPTS));
        let out = nack(
            &*s,
            m.id,
            &l.token,
            failure(ErrorClass::Transient, "x"),
            at(now),
        )
        .await
        .expect("nack");
        assert_eq!(
            out.message.state == State::Dead,
            l.attempt == l.max_attempts,
            "attempt {attempt} of {}: {:?}",
            l.max_attempts,
            out.message.state
        );
        now += RETRY_DELAY_MS as i64;
    }
    // A redrive: attempt 4 is the first of a fresh budget of 3, so 6 is the last try.
    s.redrive(m.id, Some(at(now))).await.expect("redrive");
    let l = lease_at(now).await;
    assert_eq!((l.attempt, l.max_attempts), (4, 6));
    // An uncharged rate limit moves the last try one further.
    let mut limited = failure(ErrorClass::RateLimited, "429");
    limited.retry_after_ms = Some(RETRY_DELAY_MS);
    nack(&*s, m.id, &l.token, limited, at(now))
        .await
        .expect("nack");
    now += RETRY_DELAY_MS as i64;
    let l = lease_at(now).await;
    assert_eq!((l.attempt, l.max_attempts), (5, 7));
    for attempt in 5..=7 {
        if attempt > 5 {
            now += RETRY_DELAY_MS as i64;
        }
        let l = if attempt == 5 {
            l.clone()
        } else {
            lease_at(now).await
        };
        assert_eq!((l.attempt, l.max_attempts), (attempt, 7));
        let out = nack(
            &*s,
            m.id,
            &l.token,
            failure(ErrorClass::Transient, "x"),
            at(now),
        )
        .await
        .expect("nack");
        assert_eq!(
            out.message.state == State::Dead,
            attempt == 7,
            "attempt {attempt}"
        );
    }
}
