//! Operator actions: redrive, kill and delete, and what they need.

use super::helpers::*;
use super::*;

pub async fn redrive_dead_gives_fresh_budget<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    lease_and_nack(&*s, Q, m.id, failure(ErrorClass::Permanent, "bad"), at(0)).await;
    let r = s
        .redrive(m.id, Some(at(100)))
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
    assert_eq!(
        dead.history[1].event,
        HistoryEvent::Redriven {
            edited: false,
            task: None
        }
    );
    assert_eq!(dead.history[1].at, at(100));
}

pub async fn redrive_needs_dead_or_scheduled<S: Store>(s: Arc<S>) {
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
        .redrive(sch.id, Some(at(10)))
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
        match s.redrive(id, Some(at(4))).await {
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

pub async fn kill_makes_dead_killed<S: Store>(s: Arc<S>) {
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
            .kill(id, Some("poison".into()), Some(at(10)))
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
    match s.kill(s_msg.id, None, Some(at(20))).await {
        Err(StoreError::InvalidState {
            state: State::Dead, ..
        }) => {}
        other => panic!("kill of a dead message: {other:?}"),
    }
    let d = publish(&*s, msg(OTHER, json!("done")), at(0)).await;
    let l = lease_one(&*s, OTHER, d.id, 30_000, at(0)).await;
    ack(&*s, d.id, &l.token, at(1)).await.expect("ack");
    match s.kill(d.id, None, Some(at(20))).await {
        Err(StoreError::InvalidState {
            state: State::Done, ..
        }) => {}
        other => panic!("kill of a done message: {other:?}"),
    }
    assert_eq!(get(&*s, d.id).await.state, State::Done);
    let r = s
        .redrive(r_msg.id, Some(at(30)))
        .await
        .expect("redrive of a killed message");
    assert_eq!(r.state, State::Ready);
}

/// A leased message an operator killed: its consumer's late ack, nack or extend is refused
/// as settled by the kill (issue 15: it used to say `lease_expired`, and it had not).
pub async fn killed_lease_token_is_lease_settled_killed<S: Store>(s: Arc<S>) {
    let m = publish(&*s, msg(Q, json!("x")), at(0)).await;
    let l = lease_one(&*s, Q, m.id, 30_000, at(0)).await;
    s.kill(m.id, None, Some(at(1)))
        .await
        .expect("kill of a leased message");
    let killed = |e: &StoreError| matches!(e, StoreError::LeaseSettled(Settled::Killed));
    expect_err(
        ack(&*s, m.id, &l.token, at(2)).await,
        "ack of a killed message",
        killed,
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
        killed,
    );
    expect_err(
        s.extend(lref(m.id, &l.token), 1_000, Some(at(2))).await,
        "extend of a killed message",
        killed,
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

pub async fn delete_removes_message<S: Store>(s: Arc<S>) {
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
    s.kill(dead.id, None, Some(at(3))).await.expect("kill");
    s.delete(dead.id).await.expect("delete of a dead message");
    assert_eq!(count(&*s, Q, State::Dead).await, 0);
    assert_eq!(count(&*s, Q, State::Ready).await, 1);
}

pub async fn unknown_id_is_not_found<S: Store>(s: Arc<S>) {
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
        s.extend(lref(id, "t"), 1, Some(at(1))).await,
        "extend",
        is_not_found,
    );
    expect_err(s.redrive(id, Some(at(1))).await, "redrive", is_not_found);
    expect_err(s.kill(id, None, Some(at(1))).await, "kill", is_not_found);
    expect_err(s.delete(id).await, "delete", is_not_found);
}

/// Defect 3 of issue 5: a dead letter older than `max_age`, redriven, used to die again
/// of `max_age` on its first failure. A redrive starts a fresh window (counted from the
/// redrive) as well as a fresh attempt budget; the history is kept.
pub async fn redrive_restarts_max_age_window<S: Store>(s: Arc<S>) {
    // SHORT_AGE: max_age 1.5 s, fixed 1 s retries, 10 attempts.
    let m = publish(&*s, msg(SHORT_AGE, json!("old")), at(0)).await;
    let f = lease_and_nack(
        &*s,
        SHORT_AGE,
        m.id,
        failure(ErrorClass::Transient, "down"),
        at(0),
    )
    .await;
    assert_eq!(f.message.state, State::Scheduled);
    tick(&*s, at(1_000)).await;
    let f = lease_and_nack(
        &*s,
        SHORT_AGE,
        m.id,
        failure(ErrorClass::Transient, "down"),
        at(1_000),
    )
    .await;
    assert_eq!(
        f.dead_reason,
        Some(DeadReason::MaxAge),
        "the window of the publish ends"
    );
    // A day later the operator redrives it: far past created_at + max_age.
    let day = 24 * 3_600_000;
    let r = s.redrive(m.id, Some(at(day))).await.expect("redrive");
    assert_eq!(r.state, State::Ready);
    assert_eq!(r.created_at, at(0), "a redrive keeps the publish time");
    let f = lease_and_nack(
        &*s,
        SHORT_AGE,
        m.id,
        failure(ErrorClass::Transient, "still down"),
        at(day + 1),
    )
    .await;
    assert_eq!(
        (f.message.state, f.dead_reason),
        (State::Scheduled, None),
        "a redriven dead letter died of the old max_age window"
    );
    assert_eq!(f.message.due_at, Some(at(day + 1_001)));
    // The fresh window is max_age long from the redrive: the next retry would fall past it.
    tick(&*s, at(day + 1_001)).await;
    let f = lease_and_nack(
        &*s,
        SHORT_AGE,
        m.id,
        failure(ErrorClass::Transient, "down"),
        at(day + 1_001),
    )
    .await;
    assert_eq!(
        f.dead_reason,
        Some(DeadReason::MaxAge),
        "the redrive's window ends too"
    );
    let full = get(&*s, m.id).await;
    assert_eq!(
        failures(&full),
        vec![
            (1, None),
            (2, Some(DeadReason::MaxAge)),
            (3, None),
            (4, Some(DeadReason::MaxAge))
        ],
        "the history is kept across the redrive"
    );
    assert!(
        full.history
            .iter()
            .any(|h| matches!(h.event, HistoryEvent::Redriven { .. })),
        "the redrive is in the history"
    );
}
