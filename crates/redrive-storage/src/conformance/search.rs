//! Operator reads: search filters, pages and cursors, and per-queue counts.

use super::helpers::*;
use super::*;
use redrive_core::fingerprint;

pub async fn search_filters<S: Store>(s: Arc<S>) {
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

/// `finished_since` / `finished_until` select by when a message became done or dead
/// (`finished_at`): since inclusive, until exclusive; a message that is not finished (ready,
/// scheduled, or redriven since it died) never matches.
pub async fn search_by_finished_time<S: Store>(s: Arc<S>) {
    let a = publish(&*s, msg("fa", json!("acked at 500")), at(0)).await;
    let c = publish(&*s, msg("fc", json!("dead at 2000")), at(0)).await;
    let d = publish(&*s, msg("fd", json!("ready")), at(0)).await;
    let e = publish(&*s, msg("fe", json!("dead at 3000, redriven")), at(0)).await;
    let f = publish(&*s, msg("ff", json!("killed at 4000")), at(0)).await;
    let l = lease_one(&*s, "fa", a.id, 30_000, at(100)).await;
    ack(&*s, a.id, &l.token, at(500)).await.expect("ack");
    let b = publish(
        &*s,
        NewMessage {
            failed: Some(failure(ErrorClass::Permanent, "dead on arrival")),
            ..msg("fb", json!("dead at 1000"))
        },
        at(1_000),
    )
    .await;
    assert_eq!(b.state, State::Dead);
    lease_and_nack(
        &*s,
        "fc",
        c.id,
        failure(ErrorClass::Permanent, "x"),
        at(2_000),
    )
    .await;
    lease_and_nack(
        &*s,
        "fe",
        e.id,
        failure(ErrorClass::Permanent, "x"),
        at(3_000),
    )
    .await;
    s.redrive(e.id, Some(at(3_500))).await.expect("redrive");
    s.kill(f.id, Some("by hand".into()), Some(at(4_000)))
        .await
        .expect("kill");
    for (m, want) in [
        (a.id, Some(at(500))),
        (b.id, Some(at(1_000))),
        (c.id, Some(at(2_000))),
        (d.id, None),
        (e.id, None),
        (f.id, Some(at(4_000))),
    ] {
        assert_eq!(get(&*s, m).await.finished_at, want, "finished_at of {m}");
    }
    let cases: Vec<(MessageFilter, Vec<MessageId>)> = vec![
        (
            MessageFilter {
                finished_since: Some(at(0)),
                ..Default::default()
            },
            vec![b.id, f.id, c.id, a.id],
        ),
        (
            MessageFilter {
                finished_since: Some(at(1_000)),
                ..Default::default()
            },
            vec![b.id, f.id, c.id],
        ),
        (
            MessageFilter {
                finished_until: Some(at(2_000)),
                ..Default::default()
            },
            vec![b.id, a.id],
        ),
        (
            MessageFilter {
                finished_since: Some(at(1_000)),
                finished_until: Some(at(4_000)),
                ..Default::default()
            },
            vec![b.id, c.id],
        ),
        (
            MessageFilter {
                state: Some(State::Dead),
                finished_since: Some(at(1_500)),
                ..Default::default()
            },
            vec![f.id, c.id],
        ),
        (
            // Created before 500 and finished at or after 1,000: b was created at 1,000.
            MessageFilter {
                until: Some(at(500)),
                finished_since: Some(at(1_000)),
                ..Default::default()
            },
            vec![f.id, c.id],
        ),
        (
            MessageFilter {
                finished_since: Some(at(4_001)),
                ..Default::default()
            },
            vec![],
        ),
    ];
    for (filter, want) in cases {
        let desc = format!("{filter:?}");
        let page = s.search(filter.clone(), 100, None).await.expect("search");
        assert_eq!(msg_ids(&page.messages), want, "search {desc}");
        assert_eq!(
            s.count(filter).await.expect("count"),
            want.len() as u64,
            "count {desc}"
        );
    }
}

/// `fingerprint` selects exactly the messages whose [`fingerprint::of_message`] it is
/// (the failure groups' own function): dead or not, with a last error or only a dead reason.
/// Statuses and SQLSTATEs split groups; ids do not.
pub async fn search_by_fingerprint<S: Store>(s: Arc<S>) {
    let dead = |text: &'static str| NewMessage {
        failed: Some(failure(ErrorClass::Permanent, text)),
        ..msg(Q, json!({ "text": text }))
    };
    let o1 = publish(&*s, dead("order 1 not found"), at(0)).await;
    let o2 = publish(&*s, dead("order 22 not found"), at(1)).await;
    let h503 = publish(&*s, dead("HTTP 503 from payments (req 0x9f)"), at(2)).await;
    let h503b = publish(&*s, dead("HTTP 503 from payments (req 0x11)"), at(3)).await;
    let h500 = publish(&*s, dead("HTTP 500 from payments (req 0x9f)"), at(4)).await;
    let deadlock = publish(
        &*s,
        dead("SQLSTATE[40001]: Serialization failure: 1213 Deadlock"),
        at(5),
    )
    .await;
    let constraint = publish(
        &*s,
        dead("SQLSTATE[23000]: Serialization failure: 1213 Deadlock"),
        at(6),
    )
    .await;
    let retrying = publish(
        &*s,
        NewMessage {
            failed: Some(failure(ErrorClass::Transient, "order 3 not found")),
            ..msg(OTHER, json!("transient"))
        },
        at(7),
    )
    .await;
    assert_eq!(retrying.state, State::Scheduled);
    let killed = publish(&*s, msg(OTHER, json!("killed")), at(8)).await;
    s.kill(killed.id, None, Some(at(9))).await.expect("kill");
    let fresh = publish(&*s, msg(OTHER, json!("never failed")), at(10)).await;

    let all = s
        .search(MessageFilter::default(), 100, None)
        .await
        .expect("search all");
    assert_eq!(all.messages.len(), 10);
    // The store's filter and the core's function agree on every message.
    for m in &all.messages {
        let (fp, _) = fingerprint::of_message(m);
        let want: Vec<MessageId> = all
            .messages
            .iter()
            .filter(|o| fingerprint::of_message(o).0 == fp)
            .map(|o| o.id)
            .collect();
        let f = MessageFilter {
            fingerprint: Some(fp.clone()),
            ..Default::default()
        };
        let page = s.search(f.clone(), 100, None).await.expect("search");
        assert_eq!(msg_ids(&page.messages), want, "fingerprint {fp:?}");
        assert_eq!(
            s.count(f).await.expect("count"),
            want.len() as u64,
            "count {fp:?}"
        );
    }
    let find = |fp: &str, state: Option<State>| {
        let s = s.clone();
        let f = MessageFilter {
            fingerprint: Some(fp.to_owned()),
            state,
            ..Default::default()
        };
        async move { msg_ids(&s.search(f, 100, None).await.expect("search").messages) }
    };
    assert_eq!(
        find("permanent: order <n> not found", None).await,
        vec![o2.id, o1.id]
    );
    assert_eq!(
        find("permanent: HTTP 503 from payments (req <hex>)", None).await,
        vec![h503b.id, h503.id]
    );
    assert_eq!(
        find("permanent: HTTP 500 from payments (req <hex>)", None).await,
        vec![h500.id]
    );
    assert_eq!(
        find(
            "permanent: SQLSTATE[40001]: Serialization failure: <n> Deadlock",
            None
        )
        .await,
        vec![deadlock.id]
    );
    assert_eq!(
        find(
            "permanent: SQLSTATE[23000]: Serialization failure: <n> Deadlock",
            None
        )
        .await,
        vec![constraint.id]
    );
    assert_eq!(
        find("transient: order <n> not found", None).await,
        vec![retrying.id],
        "a scheduled message has the fingerprint of its last error"
    );
    assert_eq!(
        find("transient: order <n> not found", Some(State::Dead)).await,
        vec![]
    );
    assert_eq!(find("killed", None).await, vec![killed.id]);
    assert_eq!(find("unknown", None).await, vec![fresh.id]);
    assert_eq!(
        find("permanent: order", None).await,
        vec![],
        "exact, not a prefix"
    );
    assert_eq!(find("", None).await, vec![]);
}

/// A fingerprint that matches few rows pages like any filter: full pages (not pages of the
/// rows read), a cursor after the last match, no duplicate, no gap, newest first.
pub async fn search_by_fingerprint_pages<S: Store>(s: Arc<S>) {
    let mut want = Vec::new();
    for i in 0..25i64 {
        for k in 0..2 {
            publish(
                &*s,
                NewMessage {
                    failed: Some(failure(ErrorClass::Permanent, &format!("noise {k} of {i}"))),
                    ..msg(Q, json!({ "noise": i }))
                },
                at(i * 10 + k),
            )
            .await;
        }
        want.push(
            publish(
                &*s,
                NewMessage {
                    failed: Some(failure(
                        ErrorClass::Permanent,
                        &format!("order {i} not found"),
                    )),
                    ..msg(Q, json!({ "order": i }))
                },
                at(i * 10 + 5),
            )
            .await
            .id,
        );
    }
    want.reverse();
    let filter = MessageFilter {
        fingerprint: Some("permanent: order <n> not found".into()),
        state: Some(State::Dead),
        ..Default::default()
    };
    assert_eq!(s.count(filter.clone()).await.expect("count"), 25);
    let mut got = Vec::new();
    let mut sizes = Vec::new();
    let mut cursor = None;
    loop {
        let page = s.search(filter.clone(), 10, cursor).await.expect("search");
        sizes.push(page.messages.len());
        got.extend(msg_ids(&page.messages));
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
        assert!(sizes.len() < 10, "pagination does not end: {sizes:?}");
    }
    assert_eq!(sizes, vec![10, 10, 5], "pages of matches");
    assert_eq!(got, want, "every match once, newest first");
}

pub async fn search_pages_newest_first<S: Store>(s: Arc<S>) {
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
pub async fn search_rejects_invalid_cursor<S: Store>(s: Arc<S>) {
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

pub async fn queue_stats_counts_per_state<S: Store>(s: Arc<S>) {
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
