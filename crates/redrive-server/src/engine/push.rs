//! Push delivery (SPEC §10): for every queue with `delivery = "push"`, a worker leases due
//! messages itself and sends each to the queue's endpoint, then acks or nacks it by what the
//! endpoint answered. It is a consumer like any other, inside the server: the lease, the
//! retry policy, the history and every guarantee of SPEC §4 are the store's, unchanged. The
//! worker is a [`Deliverer`] of the consume driver ([`super::consume`]), which leases for it,
//! settles what it answers (each call settles its own message when it ends, through the
//! driver's [`Settler`]) and applies the one policy for store faults.
//!
//! Downstream protection lives per endpoint (`scheme://host:port`), in
//! [`redrive_push::protect::Protection`]: a concurrency limit, an optional rate limit, a
//! circuit breaker, a paced release after recovery and a retry budget. The worker asks it
//! before every call:
//!
//! - Before leasing, the worker waits until the endpoint would admit a call. While the
//!   breaker is open, due messages therefore stay `ready` in the store: not called, not
//!   charged, durable, and delivered oldest first (earliest due) once the endpoint admits
//!   calls again, at the pace it admits them.
//! - After leasing, a message the endpoint cannot take now (a retry refused by the budget,
//!   a breaker that opened meanwhile, a rate-limit wait longer than [`HOLD_MAX_MS`]) is
//!   *parked*: handed back with [`redrive_storage::Release`], its attempt taken back, due
//!   again when the endpoint said to ask again. A park is never a failure: nothing charged,
//!   never dropped.
//! - Waiting shows in the timeline (SPEC §10): a park notes what the message waits for
//!   (`Release::waited`), and a message leased at least [`WAIT_NOTE_MIN_MS`] after it was
//!   due, while its endpoint refused calls (the breaker was open, the pace or the rate
//!   limit held the worker back), gets the same note with its attempt
//!   (`Ack::waited` / `Nack::waited`): a `waited` history entry, one per wait episode and
//!   reason however often it is parked ([`redrive_core::note_wait`]).
//! - A message's headers never replace the request's own (SPEC §10): transport and
//!   hop-by-hop headers, `content-type`, `webhook-*` and `redrive-*` are the server's. Publish
//!   refuses them on a push queue; one stored anyway (before its queue was a push queue) is
//!   sent without them, and its attempt's `response.dropped_headers` names them
//!   ([`redrive_push::send::message_headers`]; the sender never sends a transport header
//!   whatever it is given).
//!
//! **In a cluster** (SPEC §13) an endpoint's `concurrency` and `rate_limit` hold for all the
//! nodes together: each node enforces its share ([`redrive_push::share`]: of `N` live nodes
//! sorted by incarnation, the node at rank `r` takes `floor(c / N)` calls in flight, one more
//! when `r < c mod N`, and `rate / N` calls per second), learnt at each heartbeat
//! ([`super::cluster::Membership::subscribe_rank`]) and applied in place
//! ([`Protection::set_limits`]: calls in flight and the breaker kept). Until its rank is
//! known a node calls nothing; a node whose share is 0 (`c < N`) leases nothing for that
//! endpoint: its workers wait for the share to change.
//!
//! **The breaker is shared** (SPEC §13): when an endpoint's breaker opens from Closed by
//! this node's own calls ([`Protection::take_trip`]) the node records a trip in the store
//! ([`redrive_storage::Store::endpoint_trip`]); every node with push queues reads the trips
//! open now every [`TRIP_POLL_MS`] ([`redrive_storage::Store::endpoint_trips`]) and holds
//! its own breaker for that endpoint open for the rest of the period
//! ([`Protection::force_open`]), so an outage seen by one node parks messages on every node
//! within about that poll. After the period each node probes on its own, as after any open
//! period; a failed probe reopens only that node's breaker (no new trip).
//!
//! An attempt's history entry records the status, the latency and the first 1 KiB of the
//! answer ([`redrive_core::AttemptResponse`]). A lease lasts the attempt's timeout plus
//! [`LEASE_MARGIN_MS`] (5 s): if redrive dies mid-call, the message is delivered again after
//! that (at least once), and it is marked done only by an ack that follows a 2xx
//! (`crates/redrive/tests/push_crash.rs` kills the server with pushes in flight and counts).

use super::consume::{self, CutShort, Deliverer, LeaseAsk, SettleResult, Settlement, Settler};
use super::supervisor::{Placement, Service};
use super::{Engine, Event};
use redrive_core::{AttemptResponse, ErrorClass, Failure, MessageId, Timestamp, Waited, WaitedFor};
use redrive_push::classify::{Rules, Verdict};
use redrive_push::protect::{
    BreakerConfig, BreakerState, Outcome, Protection, ProtectionConfig, Snapshot, Wait, WaitReason,
};
use redrive_push::send::{BuildError, Request, Sender, SenderConfig};
use redrive_push::share::{share, Rank};
use redrive_push::signing::{signature_header, Secret};
use redrive_push::ssrf::Guard;
use redrive_push::{Method, Url};
use redrive_storage::{Ack, LeaseRef, Leased, Nack, Release};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

/// A lease of a push attempt lasts its timeout plus this: room for the wait for a rate or
/// concurrency slot ([`HOLD_MAX_MS`]) and the ack's commit. It is also how long after its
/// attempt's timeout a message whose push was in flight when redrive died waits before it is
/// delivered again.
pub const LEASE_MARGIN_MS: u64 = 5_000;

/// A leased message waits (holding its lease) at most this long for a rate or
/// concurrency slot; a longer wait parks it.
pub const HOLD_MAX_MS: u64 = 1_000;

/// How often a node reads the breaker trips of the cluster (while it has push queues), ms.
pub const TRIP_POLL_MS: u64 = 250;

/// Most messages one lease request takes for an unpaced endpoint.
const MAX_LEASE_BATCH: u32 = 32;

/// Most endpoints made for messages' own `target_url`s; past it, idle ones are forgotten.
const MAX_TARGET_ENDPOINTS: usize = 1_000;

/// Target endpoints with a metrics label of their own; the others are labelled `other`, so
/// the label stays bounded whatever URLs messages carry.
const MAX_TARGET_LABELS: usize = 100;

/// Every breaker state name, for gauges.
const STATES: &[&str] = &["closed", "open", "half_open", "recovering"];

/// A message leased at least this late (lease time − due time) while its endpoint was making
/// the worker wait gets a `waited` note in its history; shorter waits (a pace of 100/s holds
/// each lease ~10 ms) are not worth a line in the timeline.
pub const WAIT_NOTE_MIN_MS: i64 = 1_000;

/// What a message waited for, by [`WaitReason`].
fn waited_for(reason: WaitReason) -> WaitedFor {
    match reason {
        WaitReason::Breaker => WaitedFor::Breaker,
        WaitReason::Rate => WaitedFor::Pace,
        WaitReason::Budget => WaitedFor::Budget,
        WaitReason::Concurrency => WaitedFor::Concurrency,
    }
}

/// When an endpoint last refused a call, per reason (engine clock, ms): a message leased late
/// waited for what refused calls after it was due. Not the concurrency limit: a backlog
/// behind an endpoint that takes all the calls it is allowed is a queue, not a wait for the
/// endpoint, and noting it would add a write to every message of a busy healthy endpoint
/// (a park for it is still noted).
#[derive(Debug, Default)]
struct Refusals {
    /// Indexed like [`Refusals::ORDER`].
    last_ms: [Option<i64>; 3],
}

impl Refusals {
    /// The reasons in the order a wait is named by: the breaker first (it holds everything
    /// back), then the budget, then the pace (or rate limit).
    const ORDER: [WaitReason; 3] = [WaitReason::Breaker, WaitReason::Budget, WaitReason::Rate];

    fn seen(&mut self, reason: WaitReason, at_ms: i64) {
        if let Some(i) = Self::ORDER.iter().position(|r| *r == reason) {
            self.last_ms[i] = Some(self.last_ms[i].map_or(at_ms, |t| t.max(at_ms)));
        }
    }

    /// What held back a message due at `due_ms`: the first reason refused since.
    fn since(&self, due_ms: i64) -> Option<WaitReason> {
        Self::ORDER
            .iter()
            .zip(self.last_ms)
            .find(|(_, t)| t.is_some_and(|t| t >= due_ms))
            .map(|(r, _)| *r)
    }
}

/// One push queue's settings, checked (built by `Config::push_settings`).
#[derive(Debug, Clone)]
pub struct PushSettings {
    /// The endpoint's URL.
    pub url: Url,
    /// Messages may carry their own `target_url`.
    pub allow_message_targets: bool,
    /// `POST`, `PUT` or `PATCH`.
    pub method: Method,
    /// Longest attempt, ms.
    pub timeout_ms: u64,
    /// Longest connect, ms.
    pub connect_timeout_ms: u64,
    /// Most answer bytes read.
    pub max_response_bytes: usize,
    /// Calls in flight at most per endpoint.
    pub concurrency: u32,
    /// Calls per second at most per endpoint.
    pub rate_limit_per_s: Option<f64>,
    /// Signing secrets (none: no `webhook-signature`).
    pub secrets: Vec<Secret>,
    /// Breaker and paced release on.
    pub breaker: bool,
    /// Retry budget ratio (0: off).
    pub retry_budget: f64,
    /// Classification of answers.
    pub rules: Rules,
}

impl PushSettings {
    /// The endpoint this queue pushes to: `scheme://host:port`.
    pub fn endpoint(&self) -> String {
        endpoint_key(&self.url)
    }

    fn lease_ms(&self) -> u64 {
        self.timeout_ms + LEASE_MARGIN_MS
    }

    fn protection(&self) -> ProtectionConfig {
        ProtectionConfig {
            concurrency: self.concurrency,
            rate_limit_per_s: self.rate_limit_per_s,
            breaker: self.breaker.then(BreakerConfig::default),
            retry_budget: self.retry_budget,
        }
    }
}

/// `scheme://host:port` of a URL, the port written out (`https://a.example:443`).
pub fn endpoint_key(url: &Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port_or_known_default() {
        Some(port) => format!("{}://{host}:{port}", url.scheme()),
        None => format!("{}://{host}", url.scheme()),
    }
}

/// Push delivery's configuration: the push queues and the SSRF guard.
#[derive(Debug, Clone, Default)]
pub struct PushConfig {
    /// Settings per push queue.
    pub queues: BTreeMap<String, PushSettings>,
    /// Which destinations may be connected to.
    pub guard: Arc<Guard>,
}

/// One endpoint: its protection, its HTTP client, what it parked.
#[derive(Debug)]
pub struct Endpoint {
    key: String,
    /// The metrics label: the key, or `other` for target endpoints past the label bound.
    label: String,
    queues: Vec<String>,
    protection: Mutex<Protection>,
    /// The cluster-wide limits (of the first queue by name); the protection holds this
    /// node's share of them.
    concurrency: u32,
    rate_limit_per_s: Option<f64>,
    /// The rank the share was taken for (`None`: not known yet, nothing is called).
    rank: Mutex<Option<Rank>>,
    /// The end (store's clock) of the latest trip of another node applied to the breaker.
    trip_applied: Mutex<Option<Timestamp>>,
    changed: Notify,
    sender: Sender,
    parked: Mutex<HashSet<MessageId>>,
    /// When each reason last refused a call (for the `waited` notes).
    refusals: Mutex<Refusals>,
    epoch: Instant,
}

/// What `GET /v1/endpoints` shows of an endpoint.
#[derive(Debug, Clone)]
pub struct EndpointView {
    /// `scheme://host:port`.
    pub endpoint: String,
    /// The queues that push to it.
    pub queues: Vec<String>,
    /// The protection's state now.
    pub snapshot: Snapshot,
    /// Messages parked now.
    pub parked: u64,
    /// How long the breaker has been in its state, ms.
    pub state_for_ms: u64,
    /// The configured concurrency, for the whole cluster (the snapshot's is this node's
    /// share).
    pub concurrency: u32,
    /// The configured rate limit, for the whole cluster (the snapshot's is this node's
    /// share).
    pub rate_limit_per_s: Option<f64>,
    /// The rank this node's share was taken for (`None`: not known yet).
    pub rank: Option<Rank>,
}

impl Endpoint {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn protection(&self) -> MutexGuard<'_, Protection> {
        // A panic while holding the lock leaves plain counters behind: keep using them.
        self.protection
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn parked_set(&self) -> MutexGuard<'_, HashSet<MessageId>> {
        self.parked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The protection refused a call for `reason` at `at` (engine clock).
    fn refused(&self, reason: WaitReason, at: Timestamp) {
        // Only the reasons a note names are kept: a call slot waited for on a busy, healthy
        // endpoint (concurrency) takes no lock.
        if !Refusals::ORDER.contains(&reason) {
            return;
        }
        self.refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .seen(reason, at.as_millis());
    }

    /// The note for a message due at `due` and leased `lateness_ms` after: what this
    /// endpoint refused calls for since it was due, if it was late enough to say so.
    fn wait_of(&self, due: Timestamp, lateness_ms: i64) -> Option<Waited> {
        if lateness_ms < WAIT_NOTE_MIN_MS {
            return None;
        }
        let reason = self
            .refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .since(due.as_millis())?;
        Some(Waited {
            waited_for: waited_for(reason),
            since: due,
            parked: false,
        })
    }

    /// The endpoint as the API shows it.
    pub fn view(&self) -> EndpointView {
        let now = self.now_ms();
        let snapshot = self.protection().snapshot(now);
        EndpointView {
            endpoint: self.key.clone(),
            queues: self.queues.clone(),
            state_for_ms: now.saturating_sub(snapshot.state_since_ms),
            snapshot,
            parked: self.parked_set().len() as u64,
            concurrency: self.concurrency,
            rate_limit_per_s: self.rate_limit_per_s,
            rank: *self.rank.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }

    /// Take this node's share of the endpoint's limits for `rank` (`None`: none at all,
    /// until the rank is known); wake the workers.
    fn take_share(&self, rank: Option<Rank>) {
        let (concurrency, rate) = match rank {
            Some(r) => {
                let s = share(self.concurrency, self.rate_limit_per_s, r);
                (s.concurrency, s.rate_limit_per_s)
            }
            None => (0, self.rate_limit_per_s),
        };
        *self.rank.lock().unwrap_or_else(PoisonError::into_inner) = rank;
        self.with_protection(|p, now| {
            p.set_limits(now, concurrency, rate);
            p.set_nodes(rank.map_or(1, |r| r.nodes));
        });
        self.changed.notify_waiters();
    }

    /// Whether this node may call the endpoint at all now (its share is not 0).
    fn has_share(&self) -> bool {
        self.protection().config().concurrency > 0
    }

    /// Another node's breaker for this endpoint opened (`trip`, read at `at` on the store's
    /// clock): hold this one open for the rest of its period, once per trip.
    fn apply_trip(&self, trip: &redrive_storage::EndpointTrip, at: Timestamp) {
        {
            let mut applied = self
                .trip_applied
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if applied.is_some_and(|a| a >= trip.open_until) {
                return;
            }
            *applied = Some(trip.open_until);
        }
        let left_ms = u64::try_from(trip.open_until.as_millis() - at.as_millis()).unwrap_or(0);
        if left_ms == 0 {
            return;
        }
        let opened = self.with_protection(|p, now| p.force_open(now, left_ms));
        if opened {
            tracing::warn!(endpoint = %self.key, by = %trip.incarnation, open_ms = left_ms,
                "endpoint breaker opened by another node's: due messages wait here too");
        }
        self.changed.notify_waiters();
    }

    fn gauges(&self) -> EndpointGauges {
        let v = self.view();
        EndpointGauges {
            endpoint: v.endpoint,
            state: v.snapshot.state.as_str(),
            states: STATES,
            in_flight: v.snapshot.in_flight,
            pace_per_s: v.snapshot.pace_per_s,
            parked: v.parked,
            opened_total: v.snapshot.opened_total,
        }
    }

    /// Run `f` on the protection; log a breaker state change and wake the workers.
    fn with_protection<T>(&self, f: impl FnOnce(&mut Protection, u64) -> T) -> T {
        let now = self.now_ms();
        let (out, before, after, snapshot) = {
            let mut p = self.protection();
            let before = p.state();
            let out = f(&mut p, now);
            let after = p.state();
            let snapshot = (before != after).then(|| p.snapshot(now));
            (out, before, after, snapshot)
        };
        if let Some(s) = snapshot {
            let level_warn = after == BreakerState::Open;
            if level_warn {
                tracing::warn!(endpoint = %self.key, from = before.as_str(), to = after.as_str(),
                    window_calls = s.window_calls, window_failures = s.window_failures,
                    "endpoint breaker opened: due messages are parked, not called");
            } else {
                tracing::info!(endpoint = %self.key, from = before.as_str(), to = after.as_str(),
                    pace_per_s = ?s.pace_per_s, "endpoint breaker state changed");
            }
        }
        out
    }
}

/// One endpoint's state for the gauges, read at scrape time.
#[derive(Debug, Clone)]
pub struct EndpointGauges {
    /// `scheme://host:port` (endpoints come from the configuration: a bounded label).
    pub endpoint: String,
    /// The breaker's state name.
    pub state: &'static str,
    /// Every state name, so the others read 0.
    pub states: &'static [&'static str],
    /// Calls in flight.
    pub in_flight: u32,
    /// Release pace, calls/s; `None` when unpaced.
    pub pace_per_s: Option<f64>,
    /// Messages parked now (released unattempted, waiting to be due again).
    pub parked: u64,
    /// Times the breaker opened.
    pub opened_total: u64,
}

/// Every push endpoint, and which queue pushes where.
#[derive(Debug)]
pub struct Endpoints {
    by_key: BTreeMap<String, Arc<Endpoint>>,
    by_queue: BTreeMap<String, (Arc<Endpoint>, Arc<PushSettings>)>,
    /// Endpoints of messages' own `target_url`s, made on first use.
    targets: Mutex<BTreeMap<String, Arc<Endpoint>>>,
    /// Target endpoints that got a label of their own so far.
    labelled: Mutex<HashSet<String>>,
    guard: Arc<Guard>,
    epoch: Instant,
    /// This node's rank in its cluster, as last applied (`None`: not known yet).
    rank: Mutex<Option<Rank>>,
}

impl Default for Endpoints {
    fn default() -> Self {
        Self {
            by_key: BTreeMap::new(),
            by_queue: BTreeMap::new(),
            targets: Mutex::default(),
            labelled: Mutex::default(),
            guard: Arc::default(),
            epoch: Instant::now(),
            rank: Mutex::default(),
        }
    }
}

/// An endpoint with `settings`' limits and client.
fn make_endpoint(
    key: String,
    label: String,
    queues: Vec<String>,
    settings: &PushSettings,
    guard: &Arc<Guard>,
    epoch: Instant,
) -> Result<Endpoint, BuildError> {
    let sender = Sender::new(&SenderConfig {
        connect_timeout: Duration::from_millis(settings.connect_timeout_ms),
        timeout: Duration::from_millis(settings.timeout_ms),
        max_response_bytes: settings.max_response_bytes,
        pool_idle: settings.concurrency as usize,
        guard: guard.clone(),
    })?;
    let mut protection = Protection::new(settings.protection(), 0);
    // Nothing is called before this node knows its share ([`Endpoints::set_rank`]).
    protection.set_limits(0, 0, settings.rate_limit_per_s);
    Ok(Endpoint {
        key,
        label,
        queues,
        protection: Mutex::new(protection),
        concurrency: settings.concurrency,
        rate_limit_per_s: settings.rate_limit_per_s,
        rank: Mutex::new(None),
        trip_applied: Mutex::new(None),
        changed: Notify::new(),
        sender,
        parked: Mutex::new(HashSet::new()),
        refusals: Mutex::default(),
        epoch,
    })
}

impl Endpoints {
    /// One endpoint per distinct `scheme://host:port` of the push queues. Queues that share
    /// an endpoint share its protection; its limits come from the first of them by name.
    pub fn new(config: &PushConfig) -> Result<Self, BuildError> {
        let mut queues_of: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (q, s) in &config.queues {
            queues_of.entry(s.endpoint()).or_default().push(q.clone());
        }
        let epoch = Instant::now();
        let mut by_key = BTreeMap::new();
        for (key, queues) in queues_of {
            let first = &config.queues[&queues[0]];
            let endpoint = make_endpoint(
                key.clone(),
                key.clone(),
                queues,
                first,
                &config.guard,
                epoch,
            )?;
            by_key.insert(key, Arc::new(endpoint));
        }
        let by_queue = config
            .queues
            .iter()
            .map(|(q, s)| {
                let ep = by_key[&s.endpoint()].clone();
                (q.clone(), (ep, Arc::new(s.clone())))
            })
            .collect();
        Ok(Self {
            by_key,
            by_queue,
            targets: Mutex::default(),
            labelled: Mutex::default(),
            guard: config.guard.clone(),
            epoch,
            rank: Mutex::default(),
        })
    }

    /// This node's rank in its cluster changed: every endpoint takes its share of its
    /// limits for it (endpoints made later take it when made).
    pub fn set_rank(&self, rank: Rank) {
        *self.rank.lock().unwrap_or_else(PoisonError::into_inner) = Some(rank);
        for e in self.all() {
            e.take_share(Some(rank));
        }
    }

    /// Whether messages of `queue` may carry their own `target_url`.
    pub fn allows_message_targets(&self, queue: &str) -> bool {
        self.by_queue
            .get(queue)
            .is_some_and(|(_, s)| s.allow_message_targets)
    }

    /// The endpoint of a message's own `url` (of `queue`, with its `settings`): a configured
    /// one if the URL is on it, else one made on first use with the queue's limits.
    /// `None` when no more endpoints can be made now.
    fn target(&self, url: &Url, queue: &str, settings: &PushSettings) -> Option<Arc<Endpoint>> {
        let key = endpoint_key(url);
        if let Some(e) = self.by_key.get(&key) {
            return Some(e.clone());
        }
        let mut targets = self.targets.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = targets.get(&key) {
            return Some(e.clone());
        }
        if targets.len() >= MAX_TARGET_ENDPOINTS {
            // Forget endpoints nobody uses now (closed breaker, nothing in flight or parked).
            targets.retain(|_, e| {
                let busy = {
                    let p = e.protection();
                    p.in_flight() > 0 || p.state() != BreakerState::Closed
                };
                Arc::strong_count(e) > 1 || busy || !e.parked_set().is_empty()
            });
            if targets.len() >= MAX_TARGET_ENDPOINTS {
                return None;
            }
        }
        let label = {
            let mut labelled = self.labelled.lock().unwrap_or_else(PoisonError::into_inner);
            if labelled.contains(&key) || labelled.len() < MAX_TARGET_LABELS {
                labelled.insert(key.clone());
                key.clone()
            } else {
                "other".to_owned()
            }
        };
        let endpoint = match make_endpoint(
            key.clone(),
            label,
            vec![queue.to_owned()],
            settings,
            &self.guard,
            self.epoch,
        ) {
            Ok(e) => Arc::new(e),
            Err(e) => {
                tracing::error!(endpoint = %key, error = %e, "cannot make an HTTP client for a message target");
                return None;
            }
        };
        endpoint.take_share(*self.rank.lock().unwrap_or_else(PoisonError::into_inner));
        targets.insert(key, endpoint.clone());
        Some(endpoint)
    }

    /// The endpoint `key` (`scheme://host:port`), configured or a message target made so far.
    fn find(&self, key: &str) -> Option<Arc<Endpoint>> {
        if let Some(e) = self.by_key.get(key) {
            return Some(e.clone());
        }
        let targets = self.targets.lock().unwrap_or_else(PoisonError::into_inner);
        targets.get(key).cloned()
    }

    fn all(&self) -> Vec<Arc<Endpoint>> {
        let targets = self.targets.lock().unwrap_or_else(PoisonError::into_inner);
        self.by_key
            .values()
            .chain(targets.values())
            .cloned()
            .collect()
    }

    /// Whether `queue` is delivered by push.
    pub fn is_push(&self, queue: &str) -> bool {
        self.by_queue.contains_key(queue)
    }

    /// The endpoint `queue` pushes to, if it is a push queue.
    pub fn endpoint_of(&self, queue: &str) -> Option<String> {
        self.by_queue.get(queue).map(|(e, _)| e.key.clone())
    }

    /// Every endpoint as the API shows it (the configured ones, then message targets).
    pub fn views(&self) -> Vec<EndpointView> {
        self.all().iter().map(|e| e.view()).collect()
    }

    /// The gauges of every endpoint with a label of its own.
    pub fn gauges(&self) -> Vec<EndpointGauges> {
        self.all()
            .iter()
            .filter(|e| e.label == e.key)
            .map(|e| e.gauges())
            .collect()
    }
}

/// Start one worker per push queue, and the task that gives the endpoints this node's
/// share of their limits whenever its rank in the cluster changes.
pub(super) fn services(engine: &Engine) -> Vec<Service> {
    let queues: Vec<String> = engine.push().by_queue.keys().cloned().collect();
    if queues.is_empty() {
        return Vec::new();
    }
    let mut services = vec![
        Service::new("push-rank", Placement::EveryNode, follow_rank),
        Service::new("push-trips", Placement::EveryNode, follow_trips),
    ];
    services.extend(queues.into_iter().map(|q| {
        Service::new(format!("push:{q}"), Placement::EveryNode, move |e, stop| {
            queue_worker(e, q.clone(), stop)
        })
    }));
    services
}

/// Apply each rank the heartbeat learns ([`super::cluster::Membership::subscribe_rank`])
/// to the endpoints, until `stop`.
async fn follow_rank(engine: Arc<Engine>, mut stop: watch::Receiver<bool>) {
    let mut rank = engine.membership().subscribe_rank();
    loop {
        if *stop.borrow() {
            return;
        }
        let now = *rank.borrow_and_update();
        if let Some(r) = now {
            engine.push().set_rank(r);
        }
        tokio::select! {
            changed = rank.changed() => if changed.is_err() { return },
            _ = stop.changed() => {}
        }
    }
}

/// Every [`TRIP_POLL_MS`], read the breaker trips open in the cluster and hold this node's
/// breakers open for the rest of other nodes' trips, until `stop`.
async fn follow_trips(engine: Arc<Engine>, mut stop: watch::Receiver<bool>) {
    let mine = engine.membership().incarnation().to_owned();
    let mut failing = false;
    loop {
        if *stop.borrow() {
            return;
        }
        match engine
            .store()
            .endpoint_trips(engine.clock().for_store())
            .await
        {
            Ok(trips) => {
                failing = false;
                for t in trips.open.iter().filter(|t| t.incarnation != mine) {
                    if let Some(ep) = engine.push().find(&t.endpoint) {
                        ep.apply_trip(t, trips.at);
                    }
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot read the cluster's breaker trips; this node's breakers go on by themselves");
                    failing = true;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(TRIP_POLL_MS)) => {}
            _ = stop.changed() => {}
        }
    }
}

/// This node's breaker for `ep` opened from Closed for `open_ms`: record the trip for the
/// other nodes (in the background; a failure is logged, the breaker here is open anyway).
fn report_trip(engine: &Arc<Engine>, ep: &Endpoint, open_ms: u64) {
    let engine = engine.clone();
    let endpoint = ep.key.clone();
    tokio::spawn(async move {
        let incarnation = engine.membership().incarnation().to_owned();
        let now = engine.clock().for_store();
        if let Err(e) = engine
            .store()
            .endpoint_trip(endpoint.clone(), incarnation, open_ms, now)
            .await
        {
            tracing::warn!(endpoint = %endpoint, error = %e,
                "cannot record the breaker's trip: the other nodes' breakers go on by themselves");
        }
    });
}

/// Deliver `queue`'s messages with the consume driver until `stop`; then let the calls in
/// flight finish (each acks or nacks its message).
async fn queue_worker(engine: Arc<Engine>, queue: String, stop: watch::Receiver<bool>) {
    let Some((ep, settings)) = engine.push().by_queue.get(&queue).cloned() else {
        return;
    };
    tracing::info!(queue = %queue, endpoint = %ep.key, "push delivery started");
    let pusher = Pusher {
        engine: engine.clone(),
        queue: queue.clone(),
        ep,
        settings,
        calls: JoinSet::new(),
    };
    if let Err(e) = consume::run(&engine, &queue, "push", pusher, stop).await {
        // Push has no connection of its own to lose: its deliverer never faults.
        tracing::error!(queue = %queue, error = %e, "push delivery ended");
    }
}

/// Push delivery as a [`Deliverer`] of the consume driver: one push queue, its endpoint,
/// its calls in flight.
struct Pusher {
    engine: Arc<Engine>,
    queue: String,
    ep: Arc<Endpoint>,
    settings: Arc<PushSettings>,
    calls: JoinSet<()>,
}

impl Deliverer for Pusher {
    /// Wait until the endpoint would admit a call: while it would not, due messages stay
    /// ready in the store, uncharged. (Not when messages may carry their own targets: each
    /// is then judged by its own endpoint after the lease.) Then: one message at a time
    /// when paced or rate limited, else as many as there are free call slots.
    async fn admit(&mut self) -> LeaseAsk {
        let ep = &self.ep;
        while self.calls.try_join_next().is_some() {}
        if self.settings.allow_message_targets {
            // Each message is judged by its own endpoint after the lease, but every endpoint
            // of this queue has this queue's limits, so the same share: with none, lease
            // nothing (rather than lease and park in a loop).
            loop {
                let changed = ep.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if ep.has_share() {
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(redrive_push::protect::NO_SHARE_POLL_MS)) => {}
                    _ = &mut changed => {}
                }
                while self.calls.try_join_next().is_some() {}
            }
        } else {
            loop {
                let changed = ep.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                let wait = ep.with_protection(|p, now| p.admissible(now).err().map(|w| (w, now)));
                let Some((wait, now)) = wait else { break };
                ep.refused(wait.reason, self.engine.clock().now());
                let sleep = Duration::from_millis(wait.until_ms.saturating_sub(now).max(1));
                tokio::select! {
                    _ = tokio::time::sleep(sleep) => {}
                    _ = &mut changed => {}
                }
                while self.calls.try_join_next().is_some() {}
            }
        }
        let snapshot = ep.protection().snapshot(ep.now_ms());
        let max = if snapshot.pace_per_s.is_some() || snapshot.rate_limit_per_s.is_some() {
            1
        } else {
            snapshot
                .concurrency
                .saturating_sub(snapshot.in_flight)
                .clamp(1, MAX_LEASE_BATCH)
        };
        LeaseAsk {
            max,
            lease_ms: self.settings.lease_ms(),
        }
    }

    /// Start each call (it settles its message when it ends), or park the message; a
    /// message whose `target_url` no longer parses is answered to the driver, rejected.
    async fn deliver(
        &mut self,
        leased: Vec<Leased>,
        settler: &Settler,
    ) -> Result<Vec<Settlement>, CutShort> {
        let (engine, queue, settings) = (&self.engine, &self.queue, &self.settings);
        let mut settle = Vec::new();
        for l in leased {
            let due = due_of(&l, settings.lease_ms());
            let (ep, url) = match (&l.message.target_url, settings.allow_message_targets) {
                (Some(t), true) => {
                    let Ok(url) = Url::parse(t) else {
                        // Checked at publish; a stored one that no longer parses cannot be sent.
                        let lease = LeaseRef {
                            id: l.message.id,
                            token: l.token,
                        };
                        settle.push(Settlement::reject(lease, "target_url is not a URL"));
                        continue;
                    };
                    match engine.push().target(&url, queue, settings) {
                        Some(ep) => (ep, url),
                        None => {
                            let now = self.ep.now_ms();
                            let wait = Wait {
                                until_ms: now + 1_000,
                                reason: WaitReason::Concurrency,
                            };
                            park(engine, settler, &self.ep, l, wait, now, due).await;
                            continue;
                        }
                    }
                }
                _ => (self.ep.clone(), settings.url.clone()),
            };
            ep.parked_set().remove(&l.message.id);
            let is_retry = l.attempt > 1;
            loop {
                match ep
                    .with_protection(|p, now| p.try_acquire(now, is_retry).map_err(|w| (w, now)))
                {
                    Ok(()) => {
                        let waited = ep.wait_of(due, l.lateness_ms).into_iter().collect();
                        let call = deliver(
                            engine.clone(),
                            settler.clone(),
                            ep.clone(),
                            settings.clone(),
                            url,
                            l,
                            waited,
                        );
                        self.calls.spawn(call);
                        break;
                    }
                    Err((w, now))
                        if matches!(w.reason, WaitReason::Concurrency | WaitReason::Rate)
                            && w.until_ms.saturating_sub(now) <= HOLD_MAX_MS =>
                    {
                        ep.refused(w.reason, engine.clock().now());
                        let changed = ep.changed.notified();
                        tokio::pin!(changed);
                        // Registered now: a call ending before the select still wakes us.
                        changed.as_mut().enable();
                        let sleep = Duration::from_millis(w.until_ms.saturating_sub(now).max(1));
                        tokio::select! {
                            _ = tokio::time::sleep(sleep) => {}
                            _ = &mut changed => {}
                        }
                    }
                    Err((w, now)) => {
                        park(engine, settler, &ep, l, w, now, due).await;
                        break;
                    }
                }
            }
        }
        Ok(settle)
    }

    async fn finish(&mut self) {
        let in_flight = self.calls.len();
        if in_flight > 0 {
            tracing::info!(queue = %self.queue, in_flight, "push delivery stopping: waiting for the calls in flight");
        }
        while self.calls.join_next().await.is_some() {}
    }
}

/// When a leased message was due: the store's lease time (its expiry less the lease) less
/// how late the lease was.
fn due_of(l: &Leased, lease_ms: u64) -> Timestamp {
    let lease_ms = i64::try_from(lease_ms).unwrap_or(i64::MAX);
    Timestamp::from_millis(
        l.expires_at
            .as_millis()
            .saturating_sub(lease_ms)
            .saturating_sub(l.lateness_ms.max(0)),
    )
}

/// Hand a leased message back unattempted until the endpoint said to ask again, noting in
/// its history what it waited for in the store since it was `due` (if anything) and what
/// it waits for now (one entry per reason however often it is parked).
async fn park(
    engine: &Engine,
    settler: &Settler,
    ep: &Endpoint,
    l: Leased,
    wait: Wait,
    now_ms: u64,
    due: Timestamp,
) {
    let id = l.message.id;
    let now = engine.clock().now();
    let mut waited: Vec<Waited> = ep.wait_of(due, l.lateness_ms).into_iter().collect();
    ep.refused(wait.reason, now);
    let leased_at = Timestamp::from_millis(due.as_millis() + l.lateness_ms.max(0));
    waited.push(Waited {
        waited_for: waited_for(wait.reason),
        since: leased_at,
        parked: true,
    });
    let until = now.plus_ms(wait.until_ms.saturating_sub(now_ms));
    let release = Release {
        waited,
        ..Release::by_redrive(LeaseRef { id, token: l.token }, until)
    };
    // A release the store refused or lost is logged by the settler; its lease will expire.
    if let Some(SettleResult::Done) = settler
        .settle(vec![Settlement::Release(release)])
        .await
        .pop()
    {
        ep.parked_set().insert(id);
        engine.observe(Event::PushParked {
            endpoint: &ep.label,
            reason: wait.reason.as_str(),
        });
    }
}

/// One attempt to `url`: send, classify, tell the protection, ack or nack.
async fn deliver(
    engine: Arc<Engine>,
    settler: Settler,
    ep: Arc<Endpoint>,
    settings: Arc<PushSettings>,
    url: Url,
    l: Leased,
    waited: Vec<Waited>,
) {
    let now = engine.clock().now();
    let now_s = now.as_millis().div_euclid(1_000);
    let id = l.message.id.to_string();
    let body = match serde_json::to_vec(&l.message.payload) {
        Ok(b) => b,
        Err(e) => {
            // A stored payload is JSON by construction; if this ever fails, say so and
            // leave the lease to expire rather than drop the message.
            tracing::error!(message = %id, error = %e, "cannot serialize a push payload");
            ep.with_protection(|p, now| p.cancel(now));
            return;
        }
    };
    // The message's headers never replace the server's (SPEC §10): publish refuses them on a
    // push queue, and one stored before its queue was a push queue is left out here, named
    // in the attempt's history.
    let (mut headers, dropped_headers) = redrive_push::send::message_headers(&l.message.headers);
    if !dropped_headers.is_empty() {
        tracing::warn!(message = %id, headers = ?dropped_headers,
            "push request sent without message headers the server owns");
    }
    headers.push(("content-type".into(), "application/json".into()));
    headers.push(("webhook-id".into(), id.clone()));
    headers.push(("webhook-timestamp".into(), now_s.to_string()));
    if !settings.secrets.is_empty() {
        headers.push((
            "webhook-signature".into(),
            signature_header(&settings.secrets, &id, now_s, &body),
        ));
    }
    headers.push(("redrive-attempt".into(), l.attempt.to_string()));
    let sent = ep
        .sender
        .send(Request {
            method: settings.method.clone(),
            url,
            headers,
            body,
        })
        .await;
    let description = sent.describe(Duration::from_millis(settings.timeout_ms));
    let response = AttemptResponse {
        status: match sent.outcome {
            redrive_push::send::Outcome::Answered { status, .. } => Some(status),
            _ => None,
        },
        latency_ms: sent.latency_ms,
        body: sent.excerpt.clone(),
        dropped_headers,
    };
    // Refused by the SSRF guard: nothing was sent (no attempt to classify or to count).
    let refused = sent.attempt().is_none();
    let (verdict, code) = match sent.attempt() {
        Some(attempt) => {
            let code = match attempt {
                redrive_push::classify::Attempt::Answered { status, .. } => {
                    format!("http_{status}")
                }
                redrive_push::classify::Attempt::TimedOut => "timeout".to_owned(),
                redrive_push::classify::Attempt::ConnectFailed => "connect_error".to_owned(),
            };
            (settings.rules.classify(attempt, now_s), code)
        }
        // Refused by the SSRF guard: nothing was sent. Permanent: the destination is not
        // allowed, and waiting will not change the configuration.
        None => (
            Verdict::Failed {
                class: ErrorClass::Permanent,
                retry_after_ms: None,
            },
            "ssrf_refused".to_owned(),
        ),
    };
    let failed_class = match verdict {
        Verdict::Failed { class, .. } => Some(class),
        Verdict::Delivered | Verdict::Gone => None,
    };
    let result = match verdict {
        _ if refused => "refused",
        Verdict::Delivered => "delivered",
        Verdict::Gone => "gone",
        Verdict::Failed { class, .. } => class.as_str(),
    };
    if refused {
        ep.with_protection(|p, now| p.cancel(now));
    } else {
        let trip = ep.with_protection(|p, now| {
            p.record(now, Outcome::from_class(failed_class));
            p.take_trip()
        });
        if let Some(open_ms) = trip {
            report_trip(&engine, &ep, open_ms);
        }
    }
    ep.changed.notify_waiters();
    engine.observe(Event::PushAttempt {
        endpoint: &ep.label,
        result,
        latency_ms: sent.latency_ms,
    });
    let lease = LeaseRef {
        id: l.message.id,
        token: l.token,
    };
    let failure = match verdict {
        Verdict::Delivered => None,
        Verdict::Gone => Some(Failure::endpoint_gone(description)),
        Verdict::Failed {
            class,
            retry_after_ms,
        } => Some(Failure {
            class,
            message: Some(description),
            retry_after_ms,
            code: Some(code),
        }),
    };
    let response = Some(response);
    let settlement = match failure {
        None => Settlement::Ack(Ack {
            response,
            waited,
            ..Ack::from(lease)
        }),
        Some(failure) => Settlement::Nack(Nack {
            lease,
            failure,
            response,
            waited,
        }),
    };
    // Settled through the driver's settler: a refusal (the lease ended meanwhile) or a store
    // fault is logged, counted and handled by its policy.
    settler.settle(vec![settlement]).await;
}
