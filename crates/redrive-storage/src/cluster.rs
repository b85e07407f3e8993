//! Cluster membership and leadership (SPEC §13).
//!
//! Every node of a cluster (a `redrive serve` process) calls [`Store::heartbeat`] on a
//! timer. The store records the node as seen at its own clock (the database's: one clock
//! for the cluster), and, when the node stands for it, makes it the leader if there is
//! none, the leader's lease expired, or it already leads (a renewal). Leadership is one row
//! with an expiry at the store's clock and an **epoch**: it grows by one each time
//! leadership passes to another process, never on a renewal, so two processes that
//! believed they led at different times hold different epochs.
//!
//! Work that must happen once in a cluster (sending an alert, running a bulk task,
//! purging) runs on the leader only, and a leader stops it on its own when its lease may
//! have run out: [`Beat::leads_until`] is measured from before the heartbeat was sent, on
//! the node's monotonic clock, so a node paused past its lease (SIGSTOP, a long GC-like
//! stall) knows it no longer leads before it acts again, whatever its wall clock says.
//!
//! A process is named twice: `node`, the stable name an operator reads (`host:port`
//! unless configured), and `incarnation`, unique per process start. Leadership belongs to
//! the incarnation, so a node restarted under the same name does not inherit the
//! leadership its previous process held (that process may still be alive, paused); it
//! takes it over like any other, with a new epoch.
//!
//! The cluster also shares push endpoints' breakers: a node whose breaker opens from Closed
//! records a trip ([`EndpointTrip`], the rule [`next_trip`]: the latest period per endpoint),
//! and every node polls the trips open now and holds its own breaker open until they end.
//!
//! A shared store's schema is upgraded by the first node of a newer version to open it. A
//! node of the older version still running then refuses every call ([`Supersession`],
//! [`crate::StoreError::Superseded`]) as soon as its store sees the newer schema version,
//! rather than go on writing rows the way the old schema wanted them.
//!
//! [`next_leader`] is the rule, written once: the embedded store applies it to its
//! in-memory record, the PostgreSQL store states the same rule in one `UPDATE` of its
//! `leader` row.
//!
//! [`Store::heartbeat`]: crate::Store::heartbeat

use redrive_core::Timestamp;
use std::time::{Duration, Instant};

/// A node's heartbeat ([`Store::heartbeat`](crate::Store::heartbeat)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// The node's name (stable across restarts; `host:port` by default).
    pub node: String,
    /// This process's identity, unique per start.
    pub incarnation: String,
    /// Where the node's API listens, as other nodes and operators reach it.
    pub address: String,
    /// The node's version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// Whether it stands for leadership (take it when free, renew it when held).
    pub lead: bool,
    /// How long leadership taken or renewed by this beat lasts, ms (≥ 1).
    pub lead_ms: u64,
}

/// Who leads, until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    /// The leader's node name.
    pub node: String,
    /// The leading process.
    pub incarnation: String,
    /// Grows by one each time leadership passes to another process (≥ 1 once anyone led).
    pub epoch: u64,
    /// When the leadership lapses unless renewed (the store's clock).
    pub expires_at: Timestamp,
}

/// What a heartbeat answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beat {
    /// The store's clock when the beat was recorded.
    pub at: Timestamp,
    /// The leader after this beat (`None`: nobody leads now).
    pub leader: Option<Leadership>,
}

impl Beat {
    /// Whether `incarnation` leads after this beat.
    pub fn leads(&self, incarnation: &str) -> bool {
        self.leader
            .as_ref()
            .is_some_and(|l| l.incarnation == incarnation)
    }

    /// Until when (the node's monotonic clock) `incarnation` may act as leader, given that
    /// it sent this beat at `sent` asking for `lead_ms`: `None` when it does not lead. The
    /// lease started at the store no earlier than `sent`, so this is never later than the
    /// store's own expiry; a margin of a tenth (at least 100 ms, at most a second) covers
    /// a node that is slow to notice.
    pub fn leads_until(&self, incarnation: &str, sent: Instant, lead_ms: u64) -> Option<Instant> {
        if !self.leads(incarnation) {
            return None;
        }
        let margin = (lead_ms / 10).clamp(100, 1_000).min(lead_ms / 2);
        Some(sent + Duration::from_millis(lead_ms.saturating_sub(margin)))
    }
}

/// A node as the store last saw it ([`Store::cluster`](crate::Store::cluster)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    /// Its name.
    pub node: String,
    /// Its process.
    pub incarnation: String,
    /// Its API address.
    pub address: String,
    /// Its version.
    pub version: String,
    /// Its first heartbeat (the store's clock).
    pub started_at: Timestamp,
    /// Its last heartbeat (the store's clock).
    pub last_seen: Timestamp,
}

/// The cluster as the store knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// The store's clock now.
    pub at: Timestamp,
    /// Every node that beat and did not leave, oldest first (a killed node stays until
    /// [`FORGET_NODE_MS`] after its last beat; liveness is the reader's judgement from
    /// `last_seen`).
    pub nodes: Vec<NodeRecord>,
    /// The leader, when its leadership has not lapsed.
    pub leader: Option<Leadership>,
}

/// A push endpoint's breaker opened from Closed on some node (SPEC §13: an endpoint's breaker
/// is shared, so an outage seen by one node parks messages on every node). Recorded with
/// [`Store::endpoint_trip`](crate::Store::endpoint_trip); the other nodes read it with
/// [`Store::endpoint_trips`](crate::Store::endpoint_trips) and hold their own breaker open
/// until `open_until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointTrip {
    /// The endpoint, `scheme://host:port`.
    pub endpoint: String,
    /// The process whose breaker opened.
    pub incarnation: String,
    /// When it opened (the store's clock).
    pub tripped_at: Timestamp,
    /// When its open period ends (the store's clock).
    pub open_until: Timestamp,
}

/// The endpoints whose breaker is open somewhere in the cluster now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointTrips {
    /// The store's clock now.
    pub at: Timestamp,
    /// One per endpoint whose latest trip's period has not ended (`open_until > at`), by
    /// endpoint.
    pub open: Vec<EndpointTrip>,
}

/// The trip of `endpoint` after one of `open_ms` by `incarnation` at `now`, given the one
/// recorded `current`: the new one, unless the recorded one ends later (then it stays).
pub fn next_trip(
    current: Option<&EndpointTrip>,
    endpoint: &str,
    incarnation: &str,
    open_ms: u64,
    now: Timestamp,
) -> Option<EndpointTrip> {
    let open_ms = i64::try_from(open_ms.max(1)).unwrap_or(i64::MAX / 2);
    let open_until = Timestamp::from_millis(now.as_millis().saturating_add(open_ms));
    match current {
        Some(c) if c.open_until >= open_until => None,
        _ => Some(EndpointTrip {
            endpoint: endpoint.to_owned(),
            incarnation: incarnation.to_owned(),
            tripped_at: now,
            open_until,
        }),
    }
}

/// A node not seen for this long is forgotten (its row deleted by the next heartbeat of
/// any node): one day.
pub const FORGET_NODE_MS: i64 = 24 * 3_600_000;

/// The leadership rule: the leader after `beat` arrives at `now`, given the current record
/// `current` (`None`: nobody ever led) and the highest epoch so far `epoch`. Returns the
/// new record when the beat takes or renews leadership, `None` when it leaves it as is.
///
/// - A beat that does not stand changes nothing.
/// - The holder renews: same epoch, expiry `now + lead_ms`.
/// - Anyone else takes it when nobody holds it or the holder's lease expired
///   (`expires_at <= now`): epoch + 1.
pub fn next_leader(
    current: Option<&Leadership>,
    epoch: u64,
    beat: &Heartbeat,
    now: Timestamp,
) -> Option<Leadership> {
    if !beat.lead {
        return None;
    }
    let expires_at = Timestamp::from_millis(now.as_millis() + beat.lead_ms.max(1) as i64);
    let take = |epoch| Leadership {
        node: beat.node.clone(),
        incarnation: beat.incarnation.clone(),
        epoch,
        expires_at,
    };
    match current {
        Some(l) if l.incarnation == beat.incarnation => Some(take(l.epoch)),
        Some(l) if l.expires_at > now => None,
        _ => Some(take(epoch + 1)),
    }
}

/// A leader's claim to act as leader, checked by the store inside the transaction of the
/// work it guards ([`crate::TaskStep::fence`]): the work is done only while the store's
/// leadership is still held by `incarnation` with `epoch`, unexpired at the store's clock.
/// A node paused past its lease, or cut off while another took over, is refused
/// ([`crate::StoreError::Fenced`]) even if it still believes it leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The leader's incarnation ([`Heartbeat::incarnation`]).
    pub incarnation: String,
    /// The epoch of its leadership ([`Leadership::epoch`]).
    pub epoch: u64,
}

impl Fence {
    /// Whether `current` (the store's leadership record) is this fence's leadership, live
    /// at `now`.
    pub fn holds(&self, current: Option<&Leadership>, now: Timestamp) -> bool {
        current.is_some_and(|l| {
            l.incarnation == self.incarnation && l.epoch == self.epoch && l.expires_at > now
        })
    }
}

/// The leadership `current` at `now`: `None` once it lapsed.
pub fn live_leader(current: Option<&Leadership>, now: Timestamp) -> Option<Leadership> {
    current.filter(|l| l.expires_at > now).cloned()
}

/// The membership record of a store that no other process shares (the embedded store):
/// [`next_leader`] applied in memory. Its one process leads from its first beat; a restart
/// starts it again at epoch 1, which is enough while one process is the whole cluster.
#[derive(Debug, Default)]
pub struct LocalCluster {
    state: std::sync::Mutex<LocalState>,
}

#[derive(Debug, Default)]
struct LocalState {
    nodes: Vec<NodeRecord>,
    leader: Option<Leadership>,
    epoch: u64,
    /// The latest trip per endpoint.
    trips: std::collections::BTreeMap<String, EndpointTrip>,
}

impl LocalCluster {
    fn state(&self) -> std::sync::MutexGuard<'_, LocalState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// [`Store::heartbeat`](crate::Store::heartbeat) at `now`.
    pub fn heartbeat(&self, beat: &Heartbeat, now: Timestamp) -> Beat {
        let mut st = self.state();
        let forget = now.as_millis() - FORGET_NODE_MS;
        st.nodes.retain(|n| n.last_seen.as_millis() >= forget);
        match st
            .nodes
            .iter_mut()
            .find(|n| n.incarnation == beat.incarnation)
        {
            Some(n) => {
                n.last_seen = now;
                n.address.clone_from(&beat.address);
            }
            None => st.nodes.push(NodeRecord {
                node: beat.node.clone(),
                incarnation: beat.incarnation.clone(),
                address: beat.address.clone(),
                version: beat.version.clone(),
                started_at: now,
                last_seen: now,
            }),
        }
        if let Some(next) = next_leader(st.leader.as_ref(), st.epoch, beat, now) {
            st.epoch = st.epoch.max(next.epoch);
            st.leader = Some(next);
        }
        Beat {
            at: now,
            leader: live_leader(st.leader.as_ref(), now),
        }
    }

    /// [`Store::leave`](crate::Store::leave) at `now`.
    pub fn leave(&self, incarnation: &str, now: Timestamp) {
        let mut st = self.state();
        st.nodes.retain(|n| n.incarnation != incarnation);
        if let Some(l) = st.leader.as_mut().filter(|l| l.incarnation == incarnation) {
            l.expires_at = now;
        }
    }

    /// Whether `fence` holds at `now` ([`Fence::holds`] on this record).
    pub fn holds(&self, fence: &Fence, now: Timestamp) -> bool {
        fence.holds(self.state().leader.as_ref(), now)
    }

    /// [`Store::endpoint_trip`](crate::Store::endpoint_trip) at `now` ([`next_trip`]).
    pub fn endpoint_trip(&self, endpoint: &str, incarnation: &str, open_ms: u64, now: Timestamp) {
        let mut st = self.state();
        if let Some(t) = next_trip(st.trips.get(endpoint), endpoint, incarnation, open_ms, now) {
            st.trips.insert(endpoint.to_owned(), t);
        }
        // What ended is forgotten (the map stays as small as the endpoints open now).
        st.trips.retain(|_, t| t.open_until > now);
    }

    /// [`Store::endpoint_trips`](crate::Store::endpoint_trips) at `now`.
    pub fn endpoint_trips(&self, now: Timestamp) -> EndpointTrips {
        let st = self.state();
        EndpointTrips {
            at: now,
            open: st
                .trips
                .values()
                .filter(|t| t.open_until > now)
                .cloned()
                .collect(),
        }
    }

    /// [`Store::cluster`](crate::Store::cluster) at `now`.
    pub fn view(&self, now: Timestamp) -> ClusterView {
        let st = self.state();
        ClusterView {
            at: now,
            nodes: st.nodes.clone(),
            leader: live_leader(st.leader.as_ref(), now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn beat(i: usize, lead: bool, lead_ms: u64) -> Heartbeat {
        Heartbeat {
            node: format!("n{i}"),
            incarnation: format!("i{i}"),
            address: String::new(),
            version: String::new(),
            lead,
            lead_ms,
        }
    }

    #[derive(Debug, Clone)]
    enum Step {
        Beat {
            who: usize,
            lead: bool,
            lead_ms: u64,
        },
        Leave {
            who: usize,
        },
        Wait {
            ms: i64,
        },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..4usize, any::<bool>(), 1..5_000u64).prop_map(|(who, lead, lead_ms)| Step::Beat {
                who,
                lead,
                lead_ms
            }),
            (0..4usize).prop_map(|who| Step::Leave { who }),
            (0..3_000i64).prop_map(|ms| Step::Wait { ms }),
        ]
    }

    proptest! {
        /// Whatever the beats, leaves and waits: at most one leader at any instant (the
        /// record is one value); the epoch never goes down and grows exactly when the
        /// holder changes; a holder that renews before its expiry keeps its epoch; and a
        /// live holder is never displaced.
        #[test]
        fn one_leader_and_a_growing_epoch(steps in proptest::collection::vec(step(), 1..200)) {
            let mut now = Timestamp::from_millis(1_000_000);
            let mut current: Option<Leadership> = None;
            let mut epoch = 0u64;
            for s in steps {
                match s {
                    Step::Wait { ms } => now = Timestamp::from_millis(now.as_millis() + ms),
                    Step::Leave { who } => {
                        // What a store does on `leave`: a holder's leadership lapses now.
                        if let Some(l) = current.as_mut().filter(|l| l.incarnation == format!("i{who}")) {
                            l.expires_at = now;
                        }
                    }
                    Step::Beat { who, lead, lead_ms } => {
                        let b = beat(who, lead, lead_ms);
                        let before = live_leader(current.as_ref(), now);
                        if let Some(next) = next_leader(current.as_ref(), epoch, &b, now) {
                            prop_assert!(lead);
                            match &before {
                                Some(l) if l.incarnation == b.incarnation => prop_assert_eq!(next.epoch, l.epoch),
                                Some(_) => prop_assert!(false, "a live leader was displaced"),
                                None if current.as_ref().is_some_and(|c| c.incarnation == b.incarnation) =>
                                    prop_assert_eq!(next.epoch, epoch),
                                None => prop_assert_eq!(next.epoch, epoch + 1),
                            }
                            prop_assert!(next.expires_at > now);
                            epoch = epoch.max(next.epoch);
                            current = Some(next);
                        } else if lead {
                            // Refused only while another holds a live lease.
                            prop_assert!(before.is_some_and(|l| l.incarnation != b.incarnation));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn leads_until_is_before_the_store_expiry_and_none_for_others() {
        let now = Timestamp::from_millis(10_000);
        let b = beat(1, true, 10_000);
        let l = next_leader(None, 0, &b, now).unwrap();
        assert_eq!(l.epoch, 1);
        let answer = Beat {
            at: now,
            leader: Some(l),
        };
        let sent = Instant::now();
        let until = answer.leads_until("i1", sent, 10_000).unwrap();
        assert_eq!(until - sent, Duration::from_millis(9_000));
        assert_eq!(answer.leads_until("i2", sent, 10_000), None);
        // A short lease keeps at least half of itself.
        assert_eq!(
            answer.leads_until("i1", sent, 150).unwrap() - sent,
            Duration::from_millis(75)
        );
    }
}

/// Whether a newer redrive has migrated a shared store's schema past what this build knows:
/// set once, by the store's own probe of the schema's version, and never cleared (this
/// process cannot become that version). The PostgreSQL and MySQL stores refuse every call
/// with [`crate::StoreError::Superseded`] once it is set, and their health says
/// [`crate::Health::Superseded`].
#[derive(Debug, Default)]
pub struct Supersession(std::sync::Mutex<Option<String>>);

impl Supersession {
    /// Record `why`; true the first time only (for the store to log it once).
    pub fn set(&self, why: String) -> bool {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let first = s.is_none();
        if first {
            *s = Some(why);
        }
        first
    }

    /// Why every call is refused, once set.
    pub fn why(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `Err(Superseded)` once set.
    pub fn check(&self) -> Result<(), crate::StoreError> {
        match self.why() {
            Some(why) => Err(crate::StoreError::Superseded(why)),
            None => Ok(()),
        }
    }
}
