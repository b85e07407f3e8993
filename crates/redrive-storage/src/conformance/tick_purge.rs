//! The scheduler and the janitor: a tick promotes due messages, expires leases and names the next wake-up; purge deletes old done messages and never dead ones.

use super::helpers::*;
use super::*;

pub async fn delayed_publish_waits_for_tick<S: Store>(s: Arc<S>) {
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
    let hint = *s.notifier().due().borrow();
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

pub async fn tick_next_wake_is_earliest_due_or_expiry<S: Store>(s: Arc<S>) {
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

pub async fn tick_expires_lease_as_failed_attempt<S: Store>(s: Arc<S>) {
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

pub async fn purge_deletes_old_done_never_dead<S: Store>(s: Arc<S>) {
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
    let p = s.purge(Some(at(10_000)), 6_000).await.expect("purge");
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
    let p = s.purge(Some(at(1_000_000_000)), 0).await.expect("purge");
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
    let p = s.purge(Some(at(2_000_000_000)), 0).await.expect("purge");
    assert_eq!(
        p.done_deleted.iter().map(|(_, n)| n).sum::<u64>(),
        0,
        "nothing left to purge"
    );
    assert_eq!(count(&*s, Q, State::Dead).await, 1);
}
