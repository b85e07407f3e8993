//! Idempotent publish: a replay inside the window answers the original, a different payload is a conflict that writes nothing, and the key is free again after the window.

use super::helpers::*;
use super::*;

pub async fn idempotent_publish_replays_original<S: Store>(s: Arc<S>) {
    let orig = publish(&*s, with_ikey(Q, "order-1", json!({"a": 1})), at(0)).await;
    assert_eq!(orig.idempotency_key.as_deref(), Some("order-1"));
    let r = s
        .publish(vec![with_ikey(Q, "order-1", json!({"a": 1}))], Some(at(10)))
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
        .publish(vec![with_ikey(Q, "order-2", reordered)], Some(at(12)))
        .await
        .expect("replay");
    assert!(
        r[0].replayed && r[0].message.id == k2.id,
        "key order made a replay a conflict or a new message"
    );
    s.delete(k2.id).await.expect("delete");
    match s
        .publish(vec![with_ikey(Q, "order-1", json!({"a": 2}))], Some(at(20)))
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
        .publish(vec![with_ikey(Q, "order-1", json!({"a": 1}))], Some(at(50)))
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

pub async fn idempotency_conflict_writes_nothing<S: Store>(s: Arc<S>) {
    let orig = publish(&*s, with_ikey(Q, "k", json!(1)), at(0)).await;
    let batch = vec![
        msg(Q, json!("a")),
        with_ikey(Q, "k2", json!("b")),
        with_ikey(Q, "k", json!(2)),
    ];
    match s.publish(batch, Some(at(10))).await {
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
    match s.publish(batch, Some(at(30))).await {
        Err(StoreError::IdempotencyConflict { index, .. }) => assert_eq!(index, 1),
        other => panic!("a batch conflicting with itself: {other:?}"),
    }
    publish(&*s, with_ikey(Q, "k3", json!(3)), at(40)).await;
    // A batch mixing a replay and a new item answers both, in order.
    let r = s
        .publish(
            vec![with_ikey(Q, "k", json!(1)), msg(Q, json!("new"))],
            Some(at(50)),
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

pub async fn idempotency_key_reusable_after_window<S: Store>(s: Arc<S>) {
    let w = IDEMPOTENCY_WINDOW_MS as i64;
    let orig = publish(&*s, with_ikey(Q, "w", json!(1)), at(0)).await;
    let r = s
        .publish(vec![with_ikey(Q, "w", json!(1))], Some(at(w - 1)))
        .await
        .expect("replay");
    assert!(r[0].replayed, "the key is forgotten before the window ends");
    let purged = s
        .purge(Some(at(w + 1)), 24 * 3_600_000)
        .await
        .expect("purge");
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
        .publish(vec![with_ikey(Q, "w", json!(2))], Some(at(w + 2)))
        .await
        .expect("replay");
    assert!(
        r[0].replayed && r[0].message.id == again.id,
        "the new message owns the key now"
    );
}

/// Defect 2 of issue 5: with `done_retention` shorter than the idempotency window, a
/// replay after the purge used to publish a second message (the payment processed
/// twice). The key outlives its message for the whole window: the replay answers the
/// original's id, `replayed`, with what is still known of it, and writes nothing.
pub async fn idempotent_replay_after_purge_returns_original<S: Store>(s: Arc<S>) {
    let mut m = with_ikey(Q, "pay-1", json!({"amount": 10}));
    m.headers.insert("trace".into(), "t-9".into());
    m.key = Some("customer-1".into());
    m.priority = 3;
    let orig = publish(&*s, m.clone(), at(0)).await;
    let l = lease_one(&*s, Q, orig.id, 30_000, at(5)).await;
    ack(&*s, orig.id, &l.token, at(10)).await.expect("ack");
    // done_retention 1 s, well inside the 60 s window.
    let purged = s.purge(Some(at(20_000)), 1_000).await.expect("purge");
    assert_eq!(
        purged.done_deleted,
        vec![(Q.to_owned(), 1)],
        "the done message is purged"
    );
    assert_eq!(purged.idempotency_deleted, 0, "the key is kept");
    assert!(s.get(orig.id).await.expect("get").is_none(), "purged");
    for t in [30_000, 50_000] {
        let r = s
            .publish(vec![m.clone()], Some(at(t)))
            .await
            .expect("replay");
        assert!(r[0].replayed, "at {t}: a replay after the purge is not one");
        let got = &r[0].message;
        assert_eq!(got.id, orig.id, "at {t}: a new message, not the original");
        assert_eq!(got.state, State::Done);
        assert_eq!(got.queue, Q);
        assert_eq!(got.created_at, at(0));
        assert_eq!(got.finished_at, Some(at(10)));
        assert_eq!(got.attempts, 1);
        assert_eq!(
            got.payload, orig.payload,
            "the payload (equal by fingerprint)"
        );
        assert_eq!(got.headers, orig.headers);
        assert_eq!(got.key, orig.key);
        assert_eq!(got.priority, 3);
        assert_eq!(got.idempotency_key.as_deref(), Some("pay-1"));
        // A later purge inside the window keeps what the key knows.
        let p = s.purge(Some(at(t + 1)), 1_000).await.expect("purge");
        assert_eq!(
            p.idempotency_deleted, 0,
            "at {t}: the key is forgotten early"
        );
    }
    let stats = s.queue_stats().await.expect("stats");
    assert!(
        stats.is_empty(),
        "a replay after the purge wrote a message: {stats:?}"
    );
    assert!(
        lease(&*s, Q, 10, 30_000, at(55_000)).await.is_empty(),
        "a replay after the purge delivered something"
    );
    // Another payload under the key is still a conflict.
    match s
        .publish(
            vec![with_ikey(Q, "pay-1", json!({"amount": 11}))],
            Some(at(41_000)),
        )
        .await
    {
        Err(StoreError::IdempotencyConflict { key, .. }) => assert_eq!(key, "pay-1"),
        other => panic!("another payload under a purged message's key: {other:?}"),
    }
    // After the window the key is free again.
    let w = IDEMPOTENCY_WINDOW_MS as i64;
    let again = publish(&*s, m, at(w + 1)).await;
    assert_ne!(
        again.id, orig.id,
        "after the window the key creates a new message"
    );
}

/// `idempotency_keys` lists the live keys of one queue that begin with a prefix, in key
/// order, with their messages: not another queue's, not an expired one, not a deleted
/// message's, not a key that only shares a shorter prefix.
pub async fn idempotency_keys_by_prefix_lists_live_keys_only<S: Store>(s: Arc<S>) {
    let w = IDEMPOTENCY_WINDOW_MS as i64;
    let old = publish(&*s, with_ikey(Q, "in:a:0", json!(0)), at(0)).await;
    let b = publish(&*s, with_ikey(Q, "in:a:2", json!(2)), at(w / 2)).await;
    let a = publish(&*s, with_ikey(Q, "in:a:1", json!(1)), at(w / 2)).await;
    publish(&*s, with_ikey(Q, "in:ab:1", json!(3)), at(w / 2)).await;
    publish(&*s, with_ikey(Q, "in:a", json!(4)), at(w / 2)).await;
    publish(&*s, with_ikey(OTHER, "in:a:1", json!(5)), at(w / 2)).await;
    let gone = publish(&*s, with_ikey(Q, "in:a:3", json!(6)), at(w / 2)).await;
    s.delete(gone.id).await.expect("delete");
    let keys = |limit| {
        let s = s.clone();
        async move {
            s.idempotency_keys(Q.to_owned(), "in:a:".to_owned(), limit, Some(at(w + 1)))
                .await
                .expect("idempotency_keys")
        }
    };
    // `in:a:0` expired at `w`; `in:a:3` went with its message.
    assert_eq!(
        keys(10).await,
        vec![("in:a:1".to_owned(), a.id), ("in:a:2".to_owned(), b.id)]
    );
    assert_eq!(keys(1).await, vec![("in:a:1".to_owned(), a.id)], "limit");
    let before_expiry = s
        .idempotency_keys(Q.to_owned(), "in:a:".to_owned(), 10, Some(at(w - 1)))
        .await
        .expect("idempotency_keys");
    assert_eq!(
        before_expiry,
        vec![
            ("in:a:0".to_owned(), old.id),
            ("in:a:1".to_owned(), a.id),
            ("in:a:2".to_owned(), b.id)
        ]
    );
}

/// A forgotten key is free: the next publish with it is a new message, the first message
/// is untouched, and forgetting an unknown key is no error.
pub async fn forgotten_idempotency_key_publishes_a_new_message<S: Store>(s: Arc<S>) {
    let first = publish(&*s, with_ikey(Q, "marker", json!({"a": 1})), at(0)).await;
    let other = publish(&*s, with_ikey(OTHER, "marker", json!({"a": 1})), at(0)).await;
    let n = s
        .forget_idempotency_keys(
            Q.to_owned(),
            vec!["marker".to_owned(), "unknown".to_owned()],
        )
        .await
        .expect("forget");
    assert_eq!(n, 1, "one key was known");
    let again = s
        .publish(vec![with_ikey(Q, "marker", json!({"a": 1}))], Some(at(10)))
        .await
        .expect("publish");
    assert!(!again[0].replayed, "a forgotten key replayed its message");
    assert_ne!(again[0].message.id, first.id);
    let kept = s.get(first.id).await.expect("get").expect("first message");
    assert_eq!(
        kept.state,
        State::Ready,
        "forgetting its key changed the message"
    );
    // Another queue's key of the same name is still remembered.
    let r = s
        .publish(
            vec![with_ikey(OTHER, "marker", json!({"a": 1}))],
            Some(at(20)),
        )
        .await
        .expect("publish");
    assert!(r[0].replayed && r[0].message.id == other.id);
    assert_eq!(
        s.forget_idempotency_keys(Q.to_owned(), Vec::new())
            .await
            .expect("forget nothing"),
        0
    );
}
