//! The shared-handles area: two stores opened on one database, as two redrive nodes of a
//! cluster would (SPEC §7, §13). Only for backends that several processes share; a backend
//! that cannot be shared (the embedded store: one process per data directory) invokes
//! [`conformance_shared_tests!`](crate::conformance_shared_tests) with `unsupported:` and a
//! reason, which each case logs instead of running.
//!
//! A backend invokes `conformance_shared_tests!(open_pair)` with a function that opens
//! *two* stores on one fresh, empty database from a [`Setup`](super::Setup), plus a guard
//! that removes the database after both are closed.

use super::helpers::{msg, publish};
use super::{at, Q};
use crate::{Ack, LeaseRef, LeaseRequest, Store};
use redrive_core::{MessageId, State};
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// A case run on two handles of one store.
pub type SharedCase<S> = fn(Arc<S>, Arc<S>) -> super::CaseFuture;

fn req(max: u32, lease_ms: u64) -> LeaseRequest {
    LeaseRequest {
        queue: Q.into(),
        max,
        lease_ms,
        max_bytes: None,
    }
}

/// Competing leases on both handles take every message exactly once.
pub fn two_handles_lease_disjoint_sets<S: Store>(a: Arc<S>, b: Arc<S>) -> super::CaseFuture {
    Box::pin(async move {
        const N: usize = 300;
        let items = (0..N).map(|i| msg(Q, json!({ "i": i }))).collect();
        a.publish(items, Some(at(0))).await.expect("publish");
        let take = |s: Arc<S>| {
            tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let got = s.lease(req(7, 60_000), Some(at(1))).await.expect("lease");
                    if got.is_empty() {
                        return mine;
                    }
                    mine.extend(got.into_iter().map(|l| l.message.id));
                }
            })
        };
        let (x1, x2, y1, y2) = (take(a.clone()), take(a), take(b.clone()), take(b));
        let mut seen: HashSet<MessageId> = HashSet::new();
        let mut total = 0;
        for h in [x1, x2, y1, y2] {
            for id in h.await.expect("leaser") {
                total += 1;
                assert!(seen.insert(id), "{id} was leased twice");
            }
        }
        assert_eq!(total, N, "every message leased once");
    })
}

/// Both handles ticking at once promote each due message once and fail each expired
/// lease once.
pub fn concurrent_ticks_act_on_each_message_once<S: Store>(
    a: Arc<S>,
    b: Arc<S>,
) -> super::CaseFuture {
    Box::pin(async move {
        const N: usize = 120;
        let items = (0..N).map(|i| msg(Q, json!({ "i": i }))).collect();
        a.publish(items, Some(at(0))).await.expect("publish");
        let leased = a
            .lease(req(N as u32, 1_000), Some(at(0)))
            .await
            .expect("lease");
        assert_eq!(leased.len(), N);
        // Both tick after the leases expired: each expiry is one failed attempt.
        let (ta, tb) = tokio::join!(a.tick(Some(at(5_000))), b.tick(Some(at(5_000))));
        let (ta, tb) = (ta.expect("tick a"), tb.expect("tick b"));
        let mut expired: Vec<MessageId> = ta.expired.iter().map(|o| o.message.id).collect();
        expired.extend(tb.expired.iter().map(|o| o.message.id));
        let distinct: HashSet<_> = expired.iter().collect();
        assert_eq!(
            expired.len(),
            N,
            "each expired lease failed once, not twice"
        );
        assert_eq!(distinct.len(), N);
        // Their retries are due 1 s later: both promote, each message once.
        let (pa, pb) = tokio::join!(a.tick(Some(at(7_000))), b.tick(Some(at(7_000))));
        pa.expect("promote a");
        pb.expect("promote b");
        let again = b
            .lease(req(N as u32, 60_000), Some(at(7_000)))
            .await
            .expect("lease");
        assert_eq!(again.len(), N, "every message ready once after promotion");
        for l in &again {
            assert_eq!(l.attempt, 2, "one failed attempt, then this one");
            let m = a.get(l.message.id).await.expect("get").expect("exists");
            let failures = m
                .history
                .iter()
                .filter(|h| matches!(h.event, redrive_core::HistoryEvent::Failed { .. }))
                .count();
            assert_eq!(failures, 1, "one expiry in the history of {}", m.id);
        }
    })
}

/// A lease taken on one handle is acked, nacked and extended on the other; a stale token
/// is refused there too.
pub fn a_lease_from_one_handle_settles_on_the_other<S: Store>(
    a: Arc<S>,
    b: Arc<S>,
) -> super::CaseFuture {
    Box::pin(async move {
        let m = publish(&*a, msg(Q, json!(1)), at(0)).await;
        let l = a.lease(req(1, 30_000), Some(at(0))).await.expect("lease");
        let token = l[0].token.clone();
        let lease = LeaseRef {
            id: m.id,
            token: token.clone(),
        };
        let until = b
            .extend(lease.clone(), 60_000, Some(at(10)))
            .await
            .expect("extend on b");
        assert_eq!(until, at(60_010));
        let acked = b
            .ack(vec![Ack::from(lease.clone())], Some(at(20)))
            .await
            .expect("ack on b");
        let acked = acked.into_iter().next().expect("one").expect("acked");
        assert_eq!(acked.message.state, State::Done);
        let seen = a.get(m.id).await.expect("get").expect("exists");
        assert_eq!(seen.state, State::Done, "a sees b's ack");
        // A retried ack on the first handle is the same ack again.
        let again = a
            .ack(vec![Ack::from(lease)], Some(at(30)))
            .await
            .expect("ack on a");
        assert!(again[0].as_ref().expect("acked again").repeated);
    })
}

/// Wait (at most 5 s: a hint, normally milliseconds) until `ready` names [`Q`] with at
/// least one message; `what` says what it should have been told.
async fn told_ready(ready: &mut tokio::sync::broadcast::Receiver<crate::ReadyNotice>, what: &str) {
    let notice = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match ready.recv().await {
                Ok(n) if n.queue == Q => return n,
                Ok(_) => continue,
                Err(e) => panic!("notifier closed: {e}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("b was told within 5 s that {what}"));
    assert!(notice.count >= 1);
}

/// A publish on one handle wakes a waiter on the other through the notifier (a hint:
/// allowed a few seconds, normally milliseconds).
pub fn a_publish_on_one_handle_wakes_the_other<S: Store>(
    a: Arc<S>,
    b: Arc<S>,
) -> super::CaseFuture {
    Box::pin(async move {
        let mut ready = b.notifier().ready();
        publish(&*a, msg(Q, json!("wake")), at(0)).await;
        told_ready(&mut ready, "a made a message ready").await;
    })
}

/// A tick's promotion on one handle wakes a waiter on the other, as a publish does: the
/// consumers of a delayed message may be parked on another node than the one whose
/// scheduler promoted it.
pub fn a_promotion_on_one_handle_wakes_the_other<S: Store>(
    a: Arc<S>,
    b: Arc<S>,
) -> super::CaseFuture {
    Box::pin(async move {
        let m = publish(
            &*a,
            redrive_core::NewMessage {
                deliver_at: Some(at(5_000)),
                ..msg(Q, json!("later"))
            },
            at(0),
        )
        .await;
        assert_eq!(m.state, State::Scheduled);
        let mut ready = b.notifier().ready();
        let t = a.tick(Some(at(5_000))).await.expect("tick on a");
        assert_eq!(t.ready_queues, vec![Q.to_owned()], "a promoted it");
        told_ready(&mut ready, "a's tick made a message ready").await;
    })
}

/// Nodes beating on both handles at once, at the store's own clock (`now: None`), many
/// rounds: every beat of a round answers the same leader, there is one leader at a time
/// (the epoch never changes while it keeps beating), and when it leaves another takes
/// over at its next beat with the next epoch.
pub fn heartbeats_on_both_handles_elect_one_leader<S: Store>(
    a: Arc<S>,
    b: Arc<S>,
) -> super::CaseFuture {
    Box::pin(async move {
        use super::cluster::beat;
        let nodes = ["n1", "n2", "n3", "n4"];
        let mut leader: Option<crate::Leadership> = None;
        for round in 0..10 {
            let beats = nodes.iter().enumerate().map(|(i, n)| {
                let s = if i % 2 == 0 { a.clone() } else { b.clone() };
                let n = (*n).to_owned();
                tokio::spawn(async move { s.heartbeat(beat(&n, true), None).await })
            });
            let mut answers = Vec::new();
            for h in beats.collect::<Vec<_>>() {
                answers.push(h.await.expect("beat task").expect("beat"));
            }
            // Beats of one round may straddle its taking: each saw a leader, and every
            // leader seen is one and the same.
            let seen: HashSet<String> = answers
                .iter()
                .map(|b| {
                    b.leader
                        .as_ref()
                        .expect("someone leads")
                        .incarnation
                        .clone()
                })
                .collect();
            assert_eq!(
                seen.len(),
                1,
                "round {round}: two leaders seen: {answers:?}"
            );
            let now = answers[0].leader.clone().expect("a leader");
            if let Some(before) = &leader {
                assert_eq!(
                    (&before.incarnation, before.epoch),
                    (&now.incarnation, now.epoch),
                    "round {round}: a live leader that kept beating was displaced"
                );
            }
            assert_eq!(now.epoch, 1);
            leader = Some(now);
        }
        let old = leader.expect("a leader");
        a.leave(old.incarnation.clone(), None).await.expect("leave");
        let next = nodes
            .iter()
            .map(|n| format!("{n}-1"))
            .find(|i| *i != old.incarnation)
            .expect("another node");
        let node = next.trim_end_matches("-1").to_owned();
        let got = b.heartbeat(beat(&node, true), None).await.expect("beat");
        let l = got.leader.expect("the next node leads at once");
        assert_eq!((l.incarnation.as_str(), l.epoch), (next.as_str(), 2));
        let view = a.cluster(None).await.expect("cluster");
        assert_eq!(view.nodes.len(), 3, "the leaver is forgotten: {view:?}");
        assert_eq!(view.leader, Some(l));
    })
}

/// A view of the cluster is one moment: while nodes join, lead and leave one after
/// another on one handle, every view taken on the other that names a leader lists that
/// leader among its nodes (a heartbeat records the node and its leadership together, and a
/// leave forgets both together, so only a view read in two moments can split them).
pub fn a_cluster_view_is_one_moment<S: Store>(a: Arc<S>, b: Arc<S>) -> super::CaseFuture {
    Box::pin(async move {
        use super::cluster::beat;
        let churn = tokio::spawn(async move {
            for i in 0..150 {
                let node = format!("c{i}");
                a.heartbeat(beat(&node, true), None).await.expect("beat");
                a.leave(format!("{node}-1"), None).await.expect("leave");
            }
        });
        let (mut views, mut led) = (0u32, 0u32);
        while !churn.is_finished() {
            let view = b.cluster(None).await.expect("cluster");
            views += 1;
            if let Some(l) = &view.leader {
                led += 1;
                assert!(
                    view.nodes.iter().any(|n| n.incarnation == l.incarnation),
                    "view {views}: the leader {} is not among the nodes: {view:?}",
                    l.incarnation
                );
            }
        }
        churn.await.expect("churn task");
        assert!(
            led > 0,
            "no view of {views} saw a leader: the case proved nothing"
        );
    })
}

/// A console session opened on one handle is found on the other, and ended there it is
/// gone on both; both handles asking for the shared secret at once get one and the same.
pub fn a_session_from_one_handle_is_known_and_ended_on_the_other<S: Store>(
    a: Arc<S>,
    b: Arc<S>,
) -> super::CaseFuture {
    Box::pin(async move {
        use super::sessions::{lookup, new_session};
        let made = a
            .session_create(new_session("s1", "ops", 8), None)
            .await
            .expect("create on a");
        let seen = b
            .session_get(lookup("s1"), None)
            .await
            .expect("get on b")
            .expect("b knows a's session");
        assert_eq!(
            (seen.token.as_str(), seen.csrf.as_str(), seen.created_at),
            ("ops", made.csrf.as_str(), made.created_at)
        );
        assert!(b.session_delete("s1".into()).await.expect("delete on b"));
        assert!(
            a.session_get(lookup("s1"), None)
                .await
                .expect("get on a")
                .is_none(),
            "signed out on b is signed out on a"
        );
        let (x, y) = tokio::join!(
            a.shared_secret("csrf".into(), "from-a".into()),
            b.shared_secret("csrf".into(), "from-b".into())
        );
        let (x, y) = (x.expect("secret on a"), y.expect("secret on b"));
        assert_eq!(x, y, "one secret for both handles");
        assert!(x == "from-a" || x == "from-b", "{x}");
    })
}

/// A breaker trip recorded on one handle is listed on the other, at the store's clock
/// (`now: None`), with the rest of its period.
pub fn a_trip_on_one_handle_is_seen_on_the_other<S: Store>(
    a: Arc<S>,
    b: Arc<S>,
) -> super::CaseFuture {
    Box::pin(async move {
        a.endpoint_trip("http://down:80".into(), "a-1".into(), 60_000, None)
            .await
            .expect("trip on a");
        let got = b.endpoint_trips(None).await.expect("trips on b");
        assert_eq!(got.open.len(), 1, "{got:?}");
        let t = &got.open[0];
        assert_eq!(
            (t.endpoint.as_str(), t.incarnation.as_str()),
            ("http://down:80", "a-1")
        );
        let left = t.open_until.as_millis() - got.at.as_millis();
        assert!(
            (50_000..=60_000).contains(&left),
            "the rest of the period, at the store's clock: {left} ms"
        );
    })
}

/// The cases of the area, by name.
pub fn cases<S: Store>() -> Vec<(&'static str, SharedCase<S>)> {
    vec![
        (
            "two_handles_lease_disjoint_sets",
            two_handles_lease_disjoint_sets::<S>,
        ),
        (
            "concurrent_ticks_act_on_each_message_once",
            concurrent_ticks_act_on_each_message_once::<S>,
        ),
        (
            "a_lease_from_one_handle_settles_on_the_other",
            a_lease_from_one_handle_settles_on_the_other::<S>,
        ),
        (
            "a_publish_on_one_handle_wakes_the_other",
            a_publish_on_one_handle_wakes_the_other::<S>,
        ),
        (
            "a_promotion_on_one_handle_wakes_the_other",
            a_promotion_on_one_handle_wakes_the_other::<S>,
        ),
        (
            "heartbeats_on_both_handles_elect_one_leader",
            heartbeats_on_both_handles_elect_one_leader::<S>,
        ),
        (
            "a_cluster_view_is_one_moment",
            a_cluster_view_is_one_moment::<S>,
        ),
        (
            "a_session_from_one_handle_is_known_and_ended_on_the_other",
            a_session_from_one_handle_is_known_and_ended_on_the_other::<S>,
        ),
        (
            "a_trip_on_one_handle_is_seen_on_the_other",
            a_trip_on_one_handle_is_seen_on_the_other::<S>,
        ),
    ]
}

/// Expand to one `#[test]` per shared-handles case, in a module `shared`.
///
/// `conformance_shared_tests!(open_pair)`: `open_pair(Setup) -> (S, S, G)` opens two
/// stores on one fresh database; `G` is dropped after both are closed.
/// `conformance_shared_tests!(unsupported: "reason")`: each case logs the reason and runs
/// nothing (the backend cannot be shared by two processes).
#[macro_export]
macro_rules! conformance_shared_tests {
    (unsupported: $reason:expr) => {
        $crate::conformance_shared_tests!(@each (|_case: &str| {
            eprintln!("shared-handles case {_case}: not run: {}", $reason);
        }));
    };
    ($open_pair:ident) => {
        $crate::conformance_shared_tests!(@each (|case: &str| {
            $crate::conformance::shared::run_named(case, $open_pair);
        }));
    };
    (@each $body:tt) => {
        mod shared {
            #[allow(unused_imports)]
            use super::*;
            $crate::conformance_shared_tests!(@case $body
                two_handles_lease_disjoint_sets,
                concurrent_ticks_act_on_each_message_once,
                a_lease_from_one_handle_settles_on_the_other,
                a_publish_on_one_handle_wakes_the_other,
                a_promotion_on_one_handle_wakes_the_other,
                heartbeats_on_both_handles_elect_one_leader,
                a_cluster_view_is_one_moment,
                a_session_from_one_handle_is_known_and_ended_on_the_other,
                a_trip_on_one_handle_is_seen_on_the_other,
            );
        }
    };
    (@case $body:tt $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let run = $body;
                run(stringify!($name));
            }
        )*
    };
}

/// Run the shared-handles case `name` on two stores from `open_pair`, each case on its own
/// runtime; both stores are closed before the guard is dropped.
pub fn run_named<S, G, F, Fut>(name: &str, open_pair: F)
where
    S: Store,
    F: FnOnce(super::Setup) -> Fut,
    Fut: std::future::Future<Output = (S, S, G)>,
{
    let case = cases::<S>()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, c)| c)
        .unwrap_or_else(|| panic!("no shared-handles case {name}"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let (a, b, guard) = open_pair(super::Setup::default()).await;
        let (a, b) = (Arc::new(a), Arc::new(b));
        let result = tokio::spawn(case(a.clone(), b.clone())).await;
        a.close().await;
        b.close().await;
        drop(guard);
        if let Err(e) = result {
            std::panic::resume_unwind(e.into_panic());
        }
    });
}

/// A store of a shared database, while a newer redrive migrates that database past this
/// build's schema version `known` to `newer` (`upgrade` records `newer` as that migration
/// would): a publish before it is taken; within 10 s the store's health is
/// [`crate::Health::Superseded`], naming both versions, and from then on every call is
/// refused with [`crate::StoreError::Superseded`], writes and reads alike. The store is
/// closed at the end; the caller checks that nothing refused reached the database (one
/// message in it).
pub async fn refuses_every_call_once_a_newer_node_migrated<S: Store>(
    store: S,
    known: i64,
    newer: i64,
    upgrade: impl FnOnce(),
) {
    use crate::{Health, StoreError};
    publish(&store, msg(Q, json!("before")), at(0)).await;
    assert!(matches!(store.health(), Health::Ok), "{:?}", store.health());
    upgrade();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let why = loop {
        if let Health::Superseded(why) = store.health() {
            break why;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still {:?} 10 s after the upgrade",
            store.health()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        why.contains(&format!("version {newer}")) && why.contains(&format!("up to {known}")),
        "names both versions: {why}"
    );
    match store.publish(vec![msg(Q, json!("after"))], None).await {
        Err(StoreError::Superseded(text)) => assert_eq!(text, why),
        other => panic!("a publish after the upgrade: {other:?}"),
    }
    assert!(matches!(
        store.lease(req(10, 30_000), None).await,
        Err(StoreError::Superseded(_))
    ));
    assert!(matches!(
        store.queue_stats().await,
        Err(StoreError::Superseded(_))
    ));
    store.close().await;
}
