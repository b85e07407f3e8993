//! Membership and leadership ([`Store::heartbeat`], [`Store::leave`], [`Store::cluster`]),
//! and push endpoints' breaker trips ([`Store::endpoint_trip`], [`Store::endpoint_trips`]),
//! on one handle: the rule of [`crate::cluster::next_leader`] at the store, with the fake
//! clock. Two handles competing for leadership are in [`super::shared`].

use super::at;
use crate::{Heartbeat, Store};
use std::sync::Arc;

/// A heartbeat of node `n` (incarnation `n-1`), standing for leadership for 10 s.
pub fn beat(n: &str, lead: bool) -> Heartbeat {
    Heartbeat {
        node: n.to_owned(),
        incarnation: format!("{n}-1"),
        address: format!("http://{n}:7070"),
        version: "test".to_owned(),
        lead,
        lead_ms: 10_000,
    }
}

/// The first node that stands leads, with epoch 1, until `now + lead_ms`; a node that
/// does not stand is listed but never leads; `cluster` lists both with their heartbeats.
pub fn first_standing_node_leads<S: Store>(s: Arc<S>) -> super::CaseFuture {
    Box::pin(async move {
        let view = s.cluster(Some(at(0))).await.expect("cluster");
        assert!(view.nodes.is_empty(), "a new store knows no node: {view:?}");
        assert_eq!(view.leader, None);

        let b = s
            .heartbeat(beat("a", false), Some(at(0)))
            .await
            .expect("beat a");
        assert_eq!(b.leader, None, "a node that does not stand does not lead");
        let b = s
            .heartbeat(beat("b", true), Some(at(5)))
            .await
            .expect("beat b");
        assert!(b.leads("b-1") && !b.leads("a-1"));
        let l = b.leader.expect("b leads");
        assert_eq!((l.node.as_str(), l.incarnation.as_str()), ("b", "b-1"));
        assert_eq!(l.epoch, 1);
        assert_eq!(l.expires_at, at(10_005));

        let view = s.cluster(Some(at(6))).await.expect("cluster");
        let names: Vec<&str> = view.nodes.iter().map(|n| n.node.as_str()).collect();
        assert_eq!(names, ["a", "b"], "oldest first");
        assert_eq!(view.nodes[0].started_at, at(0));
        assert_eq!(view.nodes[1].last_seen, at(5));
        assert_eq!(view.nodes[1].address, "http://b:7070");
        assert_eq!(view.leader.map(|l| l.incarnation), Some("b-1".to_owned()));
    })
}

/// The holder renews with the same epoch; a live holder is not displaced; once its lease
/// lapses another node takes it with the next epoch, and the old holder does not get it
/// back while the new one is live.
pub fn lapsed_leadership_passes_with_the_next_epoch<S: Store>(s: Arc<S>) -> super::CaseFuture {
    Box::pin(async move {
        let a = s.heartbeat(beat("a", true), Some(at(0))).await.expect("a");
        assert_eq!(a.leader.as_ref().map(|l| l.epoch), Some(1));
        let b = s
            .heartbeat(beat("b", true), Some(at(1_000)))
            .await
            .expect("b");
        assert!(b.leads("a-1"), "a live holder is not displaced: {b:?}");
        let a = s
            .heartbeat(beat("a", true), Some(at(2_000)))
            .await
            .expect("a renews");
        let l = a.leader.expect("a leads");
        assert_eq!(
            (l.epoch, l.expires_at),
            (1, at(12_000)),
            "a renewal keeps the epoch"
        );
        // a stops beating; at 12 s its lease lapsed.
        let view = s.cluster(Some(at(12_000))).await.expect("cluster");
        assert_eq!(view.leader, None, "nobody leads once the lease lapsed");
        let b = s
            .heartbeat(beat("b", true), Some(at(12_500)))
            .await
            .expect("b takes");
        let l = b.leader.expect("b leads");
        assert_eq!((l.incarnation.as_str(), l.epoch), ("b-1", 2));
        let a = s
            .heartbeat(beat("a", true), Some(at(13_000)))
            .await
            .expect("a is back");
        assert!(a.leads("b-1"), "the old holder waits: {a:?}");
        // The last seen of each node is its own last beat.
        let view = s.cluster(Some(at(13_000))).await.expect("cluster");
        let seen: Vec<_> = view
            .nodes
            .iter()
            .map(|n| (n.node.clone(), n.last_seen))
            .collect();
        assert_eq!(
            seen,
            [("a".to_owned(), at(13_000)), ("b".to_owned(), at(12_500))]
        );
    })
}

/// A node that leaves is forgotten and its leadership ends at once: the next node to beat
/// takes it (epoch + 1) without waiting for the lease; a restarted process of the same
/// node name is another incarnation and does not inherit it.
pub fn leaving_hands_leadership_over_at_once<S: Store>(s: Arc<S>) -> super::CaseFuture {
    Box::pin(async move {
        s.heartbeat(beat("a", true), Some(at(0))).await.expect("a");
        s.heartbeat(beat("b", true), Some(at(1))).await.expect("b");
        s.leave("a-1".to_owned(), Some(at(2)))
            .await
            .expect("a leaves");
        s.leave("nobody".to_owned(), Some(at(2)))
            .await
            .expect("an unknown node is no error");
        let view = s.cluster(Some(at(3))).await.expect("cluster");
        assert_eq!(view.leader, None);
        assert_eq!(view.nodes.len(), 1, "a is forgotten: {view:?}");
        let mut again = beat("a", true);
        again.incarnation = "a-2".to_owned();
        let b = s.heartbeat(again, Some(at(4))).await.expect("a restarted");
        let l = b.leader.expect("someone leads");
        assert_eq!((l.incarnation.as_str(), l.epoch), ("a-2", 2));
        let b = s.heartbeat(beat("b", true), Some(at(5))).await.expect("b");
        assert!(b.leads("a-2"));
    })
}

/// A trip is listed until its open period ends (strictly before `open_until`), by endpoint;
/// a shorter trip recorded meanwhile does not shorten it, a longer one replaces it with its
/// node and time.
pub fn endpoint_trips_keep_the_latest_period_until_it_ends<S: Store>(
    s: Arc<S>,
) -> super::CaseFuture {
    Box::pin(async move {
        let trips = |t: i64| {
            let s = s.clone();
            async move { s.endpoint_trips(Some(at(t))).await.expect("trips") }
        };
        let trip = |e: &str, who: &str, ms: u64, t: i64| {
            let (s, e, who) = (s.clone(), e.to_owned(), who.to_owned());
            async move {
                s.endpoint_trip(e, who, ms, Some(at(t)))
                    .await
                    .expect("trip")
            }
        };
        let got = trips(0).await;
        assert!(got.open.is_empty(), "a new store has no trip: {got:?}");
        assert_eq!(got.at, at(0));
        trip("http://e1:80", "a-1", 5_000, 0).await;
        let got = trips(1).await;
        assert_eq!(
            got.open,
            [crate::EndpointTrip {
                endpoint: "http://e1:80".into(),
                incarnation: "a-1".into(),
                tripped_at: at(0),
                open_until: at(5_000),
            }]
        );
        // Shorter: e1 keeps a-1's period.
        trip("http://e1:80", "b-1", 2_000, 1_000).await;
        trip("http://e2:80", "b-1", 1_000, 1_000).await;
        let got = trips(1_500).await;
        let open: Vec<(&str, &str, i64)> = got
            .open
            .iter()
            .map(|t| {
                (
                    t.endpoint.as_str(),
                    t.incarnation.as_str(),
                    t.open_until.as_millis() - at(0).as_millis(),
                )
            })
            .collect();
        assert_eq!(
            open,
            [
                ("http://e1:80", "a-1", 5_000),
                ("http://e2:80", "b-1", 2_000)
            ]
        );
        // e2's period ends at 2 s: no longer listed then.
        let got = trips(2_000).await;
        assert_eq!(got.open.len(), 1, "{got:?}");
        assert_eq!(got.open[0].endpoint, "http://e1:80");
        // Longer: replaces it, with its node and time.
        trip("http://e1:80", "b-1", 10_000, 4_000).await;
        let got = trips(13_999).await;
        assert_eq!(got.open.len(), 1, "{got:?}");
        let t = &got.open[0];
        assert_eq!(
            (t.incarnation.as_str(), t.tripped_at, t.open_until),
            ("b-1", at(4_000), at(14_000))
        );
        assert!(trips(14_000).await.open.is_empty());
        // A trip after every period ended is listed again.
        trip("http://e2:80", "a-1", 1_000, 20_000).await;
        assert_eq!(trips(20_500).await.open.len(), 1);
    })
}
