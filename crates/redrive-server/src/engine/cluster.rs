//! This node in its cluster (SPEC §13): its heartbeat, and whether it leads.
//!
//! Every node beats every `heartbeat_ms` ([`redrive_storage::Store::heartbeat`]) and stands
//! for leadership with a lease of `leader_lease_ms` at the store's clock. Work that must
//! happen once in the cluster runs where [`Membership::leads`] is true: the purger, the
//! bulk tasks' runner and the alert thresholds. Promotion of due messages and lease expiry
//! run on every node (the store's tick is safe on several at once); so do HTTP, long polls,
//! push delivery and the bridges.
//!
//! A node leads only until [`redrive_storage::Beat::leads_until`], measured from before its
//! last successful beat was sent, on its monotonic clock: a node whose beats fail (its
//! database gone) or that was paused past its lease stops acting as leader by itself,
//! before another can have taken over. On the embedded store the one process leads from
//! its first beat.
//!
//! On a clean stop the node leaves ([`redrive_storage::Store::leave`]): another node takes
//! over at its next beat instead of after the lease.
//!
//! After each successful beat the node reads the cluster ([`redrive_storage::Store::cluster`])
//! and learns its [`Rank`]: how many nodes are live (a heartbeat within [`LIVE_BEATS`]
//! intervals; itself always counted) and its place among them sorted by incarnation
//! ([`rank_of`]). Push delivery takes its share of each endpoint's cluster-wide limits from
//! it ([`Membership::subscribe_rank`]; [`redrive_push::share`]). The rank is unknown until
//! then, and push waits for it. A node that finds other live nodes at its first beat
//! announces its rank only at its next beat, one interval later, when the others have
//! beaten once since and so counted it and lowered their own shares: while the cluster
//! grows, the sum of the shares stays within the limit (with every node on the same
//! `heartbeat_interval`). When a node leaves, the others' shares grow at their next beat;
//! when one dies, after [`LIVE_BEATS`] intervals (its share is unused meanwhile).

use super::{Engine, Signal};
use redrive_core::MessageId;
use redrive_push::share::Rank;
use redrive_storage::{ClusterView, Heartbeat};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// This node's name, address and timings ([`super::EngineConfig::cluster`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// The node's name (`cluster.node`; default `<host name>:<port>`).
    pub node: String,
    /// Where its API listens, as others reach it.
    pub address: String,
    /// How often it beats, ms.
    pub heartbeat_ms: u64,
    /// How long a leadership lasts without a renewal, ms.
    pub leader_lease_ms: u64,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            node: "redrive".to_owned(),
            address: String::new(),
            heartbeat_ms: 1_000,
            leader_lease_ms: 10_000,
        }
    }
}

/// A node is live while its last heartbeat is at most this many heartbeat intervals old
/// (of the judging node's configuration): for `GET /v1/cluster` and for the shares of push
/// limits.
pub const LIVE_BEATS: u64 = 3;

/// This node's rank in `view`: the live nodes (last seen at most `live_ms` before
/// `view.at`, and `incarnation` itself whatever the view says) sorted by incarnation.
pub fn rank_of(view: &ClusterView, incarnation: &str, live_ms: i64) -> Rank {
    let mut live: Vec<&str> = view
        .nodes
        .iter()
        .filter(|n| view.at.as_millis() - n.last_seen.as_millis() <= live_ms)
        .map(|n| n.incarnation.as_str())
        .chain([incarnation])
        .collect();
    live.sort_unstable();
    live.dedup();
    let rank = live.iter().position(|i| *i == incarnation).unwrap_or(0);
    Rank::new(
        u32::try_from(live.len()).unwrap_or(u32::MAX),
        u32::try_from(rank).unwrap_or(u32::MAX),
    )
}

/// Whether this node leads, as its last beats said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Leading {
    /// Until when (monotonic) it may act as leader; `None`: it does not lead.
    pub until: Option<Instant>,
    /// The epoch of its leadership (0 when it does not lead).
    pub epoch: u64,
}

/// This process's membership: its incarnation and its leadership.
#[derive(Debug)]
pub struct Membership {
    incarnation: String,
    leading: watch::Sender<Leading>,
    /// This node's rank among the live nodes; `None` until known.
    rank: watch::Sender<Option<Rank>>,
}

impl Default for Membership {
    fn default() -> Self {
        Self {
            incarnation: MessageId::new().to_string(),
            leading: watch::channel(Leading::default()).0,
            rank: watch::channel(None).0,
        }
    }
}

impl Membership {
    /// This process's identity in the cluster (unique per start).
    pub fn incarnation(&self) -> &str {
        &self.incarnation
    }

    /// Whether this node leads now.
    pub fn leads(&self) -> bool {
        self.epoch().is_some()
    }

    /// The epoch of this node's leadership, when it leads now.
    pub fn epoch(&self) -> Option<u64> {
        let l = *self.leading.borrow();
        l.until
            .is_some_and(|u| u > Instant::now())
            .then_some(l.epoch)
    }

    /// Wait until this node leads (at once when it does), or until `stop` is set: true
    /// when it leads.
    pub async fn wait_to_lead(&self, stop: &mut watch::Receiver<bool>) -> bool {
        let mut rx = self.leading.subscribe();
        loop {
            if *stop.borrow() {
                return false;
            }
            let until = rx.borrow_and_update().until;
            match until {
                Some(u) if u > Instant::now() => return true,
                _ => {}
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return false },
                _ = stop.changed() => {}
            }
        }
    }

    /// This node's rank among the live nodes, as its last successful beat found it
    /// (`None` before that).
    pub fn rank(&self) -> Option<Rank> {
        *self.rank.borrow()
    }

    /// The rank, and each change of it.
    pub fn subscribe_rank(&self) -> watch::Receiver<Option<Rank>> {
        self.rank.subscribe()
    }

    /// Record the rank; true when it changed.
    fn set_rank(&self, next: Rank) -> bool {
        self.rank.send_if_modified(|r| {
            let changed = *r != Some(next);
            *r = Some(next);
            changed
        })
    }

    fn set(&self, next: Leading) -> Option<(bool, u64)> {
        let before = *self.leading.borrow();
        self.leading.send_replace(next);
        let (was, is) = (before.until.is_some(), next.until.is_some());
        (was != is || before.epoch != next.epoch).then_some((is, next.epoch))
    }
}

/// Beat until `stop`; then leave.
pub(super) async fn run(engine: Arc<Engine>, mut stop: watch::Receiver<bool>) {
    let settings = engine.config().cluster.clone();
    let every = Duration::from_millis(settings.heartbeat_ms.max(10));
    let membership = engine.membership();
    let beat = Heartbeat {
        node: settings.node.clone(),
        incarnation: membership.incarnation().to_owned(),
        address: settings.address.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        lead: true,
        lead_ms: settings.leader_lease_ms,
    };
    let live_ms = i64::try_from(LIVE_BEATS * settings.heartbeat_ms).unwrap_or(i64::MAX);
    let mut failing = false;
    // When the first successful beat was sent (the rank waits one interval after it when
    // other nodes are live).
    let mut first_beat: Option<Instant> = None;
    loop {
        if *stop.borrow() {
            break;
        }
        let sent = Instant::now();
        let sent_at = redrive_core::Timestamp::now();
        match engine.store().heartbeat(beat.clone(), None).await {
            Ok(b) => {
                engine
                    .clock()
                    .observe_store(b.at, sent_at, redrive_core::Timestamp::now());
                if failing {
                    tracing::info!(node = %settings.node, "heartbeat recorded again");
                    failing = false;
                }
                let until = b.leads_until(&beat.incarnation, sent, beat.lead_ms);
                let epoch = b.leader.as_ref().map_or(0, |l| l.epoch);
                let next = Leading {
                    until,
                    epoch: if until.is_some() { epoch } else { 0 },
                };
                if let Some((leads, epoch)) = membership.set(next) {
                    let leader = b.leader.as_ref().map_or("nobody", |l| l.node.as_str());
                    if leads {
                        tracing::info!(node = %settings.node, epoch, "this node leads the cluster");
                    } else {
                        tracing::info!(node = %settings.node, leader, "this node does not lead");
                    }
                    engine
                        .signals()
                        .send(|| Signal::Leadership { leads, epoch });
                }
                let first = *first_beat.get_or_insert(sent);
                match engine.store().cluster(None).await {
                    Ok(view) => {
                        let rank = rank_of(&view, &beat.incarnation, live_ms);
                        let known = membership.rank().is_some();
                        if (known || rank.nodes == 1 || sent >= first + every)
                            && membership.set_rank(rank)
                        {
                            tracing::info!(node = %settings.node, nodes = rank.nodes, rank = rank.rank,
                                "live nodes changed: push endpoints' limits are shared by this many");
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "could not read the cluster after a heartbeat; the shares of push limits stay as they were");
                    }
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(node = %settings.node, error = %e, "heartbeat failed; this node stops leading when its lease runs out");
                    failing = true;
                }
                // `until` stays as the last good beat set it: past it, leads() is false.
                if !membership.leads() && membership.leading.borrow().until.is_some() {
                    if let Some((leads, epoch)) = membership.set(Leading::default()) {
                        engine
                            .signals()
                            .send(|| Signal::Leadership { leads, epoch });
                    }
                }
            }
        }
        // Wake early when the leadership would run out before the next beat.
        let mut wake = sent + every;
        if let Some(u) = membership.leading.borrow().until {
            wake = wake.min(u.max(Instant::now()));
        }
        tokio::select! {
            _ = tokio::time::sleep_until(wake.into()) => {}
            _ = stop.changed() => {}
        }
    }
    membership.set(Leading::default());
    if let Err(e) = engine
        .store()
        .leave(membership.incarnation().to_owned(), None)
        .await
    {
        tracing::warn!(error = %e, "could not leave the cluster; another node leads once this node's lease runs out");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redrive_core::Timestamp;
    use redrive_storage::NodeRecord;

    fn node(incarnation: &str, last_seen: i64) -> NodeRecord {
        NodeRecord {
            node: format!("n-{incarnation}"),
            incarnation: incarnation.to_owned(),
            address: String::new(),
            version: String::new(),
            started_at: Timestamp::from_millis(0),
            last_seen: Timestamp::from_millis(last_seen),
        }
    }

    #[test]
    fn the_rank_counts_live_nodes_sorted_by_incarnation_and_always_this_one() {
        let view = ClusterView {
            at: Timestamp::from_millis(10_000),
            // Oldest first, as stores list them: not the order of the ranks.
            nodes: vec![
                node("c", 9_900),
                node("a", 9_800),
                node("b", 6_000),
                node("d", 7_000),
            ],
            leader: None,
        };
        // Live within 3 s: a, c, d (b is 4 s old).
        assert_eq!(rank_of(&view, "a", 3_000), Rank::new(3, 0));
        assert_eq!(rank_of(&view, "c", 3_000), Rank::new(3, 1));
        assert_eq!(rank_of(&view, "d", 3_000), Rank::new(3, 2));
        // A node not (or no longer) in the view counts itself.
        assert_eq!(rank_of(&view, "bb", 3_000), Rank::new(4, 1));
        assert_eq!(rank_of(&view, "b", 3_000), Rank::new(4, 1));
        let alone = ClusterView {
            at: Timestamp::from_millis(0),
            nodes: Vec::new(),
            leader: None,
        };
        assert_eq!(rank_of(&alone, "x", 3_000), Rank::ALONE);
    }
}
