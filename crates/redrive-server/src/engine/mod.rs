//! The engine: every operation of the API, on top of the store.
//!
//! The engine adds what the store does not know about: long polling (waiting
//! for a queue to get ready messages), waking those waiters after the writes
//! that make messages deliverable, the scheduler and purger
//! ([`scheduler`]), and events for its observers ([`observe`]: the metrics and the
//! alert notifier watch it; the engine imports neither). Each operation calls exactly one
//! store transition, so its atomicity and durability are the store's.

pub mod alerts;
pub mod bridge;
mod clock;
pub mod cluster;
pub mod consume;
pub mod observe;
pub mod push;
pub mod scheduler;
mod signals;
pub mod supervisor;
pub mod tasks;
mod waiters;

pub use clock::{Clock, ManualClock, SystemClock};
pub use observe::{Event, Observer, Observers};
pub use signals::{Signal, SignalReceiver, Signals};

use redrive_core::{Message, MessageId, NewMessage, Ordering, QueueCatalog, State, Timestamp};
use redrive_storage::{
    Ack, AckEvent, Acked, FailureOutcome, LeaseRef, LeaseRequest, Leased, Nack, NewAudit,
    Published, Release, ReleaseBy, Released, Returned, Store, StoreError, TaskAction,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;
use waiters::Waiters;

/// The built-in default lease when neither the request nor the queue sets one.
pub const DEFAULT_LEASE_MS: u64 = 30_000;

/// What the engine needs to know, and nothing of HTTP: the server builds it from its
/// configuration (`Config::engine_config`), tests build it directly.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Every queue's settings (retry policy, ordering), shared with the store.
    pub catalog: QueueCatalog,
    /// Lease length of a queue when a lease request gives none; else [`Self::default_lease_ms`].
    pub queue_lease_ms: HashMap<String, u64>,
    /// Lease length when neither the request nor the queue sets one.
    pub default_lease_ms: u64,
    /// How long done messages are kept before the purger deletes them, ms.
    pub done_retention_ms: u64,
    /// How often the purger runs, ms (at least 1 s).
    pub purge_interval_ms: u64,
    /// Push delivery: the push queues and the SSRF guard.
    pub push: push::PushConfig,
    /// Bridges (RabbitMQ, Redis Streams).
    pub bridges: Vec<bridge::BridgeSettings>,
    /// The alert notifier (off without sinks).
    pub alerts: alerts::AlertSettings,
    /// This node's name, heartbeat and leadership lease (SPEC §13).
    pub cluster: cluster::ClusterSettings,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            catalog: QueueCatalog::default(),
            queue_lease_ms: HashMap::new(),
            default_lease_ms: DEFAULT_LEASE_MS,
            done_retention_ms: 24 * 3_600_000,
            purge_interval_ms: 60_000,
            push: push::PushConfig::default(),
            bridges: Vec::new(),
            alerts: alerts::AlertSettings::default(),
            cluster: cluster::ClusterSettings::default(),
        }
    }
}

impl EngineConfig {
    /// The lease length of `queue` when a request gives none.
    pub fn lease_ms(&self, queue: &str) -> u64 {
        self.queue_lease_ms
            .get(queue)
            .copied()
            .unwrap_or(self.default_lease_ms)
    }
}

/// Consumers woken per queue when a tick makes messages ready; each one that
/// leases a full batch wakes the next, so a large backlog drains in parallel
/// without waking every idle consumer for a handful of messages.
const TICK_WAKE_CONSUMERS: usize = 4;

/// The engine. Shared by every request handler and background task.
pub struct Engine {
    store: Arc<dyn Store>,
    config: EngineConfig,
    observers: Observers,
    clock: Arc<dyn Clock>,
    waiters: Waiters,
    signals: Signals,
    shutting_down: AtomicBool,
    push: push::Endpoints,
    bridges: bridge::Bridges,
    tasks: tasks::Tasks,
    dead_letters: Arc<alerts::DeadLetters>,
    membership: cluster::Membership,
    /// How often a long poll looks again on its own (the store's `Notifier::recheck`).
    recheck: Option<Duration>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine over `store`, reading the time from `clock`, telling `observers` what it
    /// does (and its own alert notifier's record of deaths, which watches it too). Fails
    /// only when an HTTP client for a push endpoint cannot be built.
    pub fn new(
        store: Arc<dyn Store>,
        config: EngineConfig,
        observers: Observers,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, redrive_push::send::BuildError> {
        let push = push::Endpoints::new(&config.push)?;
        let bridges = bridge::Bridges::new(&config.bridges);
        let dead_letters = Arc::new(alerts::DeadLetters::new(&config.alerts));
        let observers = observers.with(dead_letters.clone());
        let recheck = store.notifier().recheck();
        Ok(Self {
            recheck,
            bridges,
            dead_letters,
            store,
            config,
            observers,
            clock,
            waiters: Waiters::default(),
            signals: Signals::default(),
            shutting_down: AtomicBool::new(false),
            push,
            tasks: tasks::Tasks::default(),
            membership: cluster::Membership::default(),
        })
    }

    /// How often work that another process sharing the store may have made (a message
    /// ready, a task created on another node) is looked for without a notice; `None` on a
    /// store no other process shares.
    pub fn recheck(&self) -> Option<Duration> {
        self.recheck
    }

    /// This node's membership in its cluster: whether it leads (SPEC §13).
    pub fn membership(&self) -> &cluster::Membership {
        &self.membership
    }

    /// The bridges (SPEC §11).
    pub fn bridges(&self) -> &bridge::Bridges {
        &self.bridges
    }

    /// The bulk tasks' runner (SPEC §12).
    pub fn tasks(&self) -> &tasks::Tasks {
        &self.tasks
    }

    /// The record of recent deaths the alert notifier drains.
    pub fn dead_letters(&self) -> &alerts::DeadLetters {
        &self.dead_letters
    }

    /// The push endpoints (SPEC §10).
    pub fn push(&self) -> &push::Endpoints {
        &self.push
    }

    /// Start the background services (scheduler, purger, push delivery, bridges, alerts).
    pub fn start(self: Arc<Self>) -> scheduler::Background {
        scheduler::start(self)
    }

    /// Wake up to `n` long polls waiting on `queue` (messages became ready elsewhere).
    pub fn wake_queue(&self, queue: &str, n: usize) {
        self.waiters.wake(queue, n.max(1));
    }

    /// Wake every long poll; each re-checks its queue.
    pub fn wake_all(&self) {
        self.waiters.wake_all();
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// This node's name (`[cluster] node`), as the audit log records it (SPEC §13: audit
    /// entries name the node).
    pub fn node(&self) -> &str {
        &self.config.cluster.node
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// What the engine announces ([`Signal`]): tests wait on these instead of sleeping.
    pub fn signals(&self) -> &Signals {
        &self.signals
    }

    /// Tell the observers what the engine did (see [`observe`]).
    pub(crate) fn observe(&self, event: Event<'_>) {
        self.observers.notify(event);
    }

    /// Stop long polls: waiting consumers answer now (with what they have).
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, AtomicOrdering::SeqCst);
        self.waiters.wake_all();
    }

    /// Whether shutdown began.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(AtomicOrdering::SeqCst)
    }

    fn key_ordered(&self, queue: &str) -> bool {
        self.config.catalog.get(queue).ordering == Ordering::Key
    }

    /// The settings of every queue.
    pub fn catalog(&self) -> &QueueCatalog {
        &self.config.catalog
    }

    /// Publish (all or nothing).
    pub async fn publish(&self, items: Vec<NewMessage>) -> Result<Vec<Published>, StoreError> {
        let out = self.store.publish(items, self.clock.for_store()).await?;
        // Per queue (one, for an API request): messages published, and of them ready now.
        let mut per_queue: Vec<(&str, u64, usize)> = Vec::new();
        for p in &out {
            if p.replayed {
                continue;
            }
            if let Some(f) = &p.failure {
                self.failure_seen(f, None);
            }
            let ready = usize::from(p.message.state == State::Ready);
            match per_queue.iter_mut().find(|(q, _, _)| *q == p.message.queue) {
                Some((_, n, r)) => {
                    *n += 1;
                    *r += ready;
                }
                None => per_queue.push((&p.message.queue, 1, ready)),
            }
        }
        for (q, published, ready) in per_queue {
            self.observe(Event::Published {
                queue: q,
                n: published,
            });
            if ready > 0 {
                self.waiters.wake(q, ready);
            }
        }
        Ok(out)
    }

    /// Lease up to `max` messages (and at most `max_bytes` of stored message JSON, see
    /// [`LeaseRequest::max_bytes`]), long-polling up to `wait_ms` when none is ready.
    pub async fn lease(
        &self,
        queue: &str,
        max: u32,
        max_bytes: Option<u64>,
        lease_ms: Option<u64>,
        wait_ms: u64,
    ) -> Result<Vec<Leased>, StoreError> {
        let lease_ms = lease_ms.unwrap_or_else(|| self.config.lease_ms(queue));
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
        let notify = self.waiters.of(queue);
        loop {
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let req = LeaseRequest {
                queue: queue.to_owned(),
                max,
                lease_ms,
                max_bytes,
            };
            let leased = self.store.lease(req, self.clock.for_store()).await?;
            if !leased.is_empty() || wait_ms == 0 || self.is_shutting_down() {
                for l in &leased {
                    self.observe(Event::Leased {
                        queue,
                        lateness_ms: l.lateness_ms,
                    });
                }
                if leased.len() == max as usize {
                    // A full batch: more may be ready. Pass the wake-up on (see `Waiters`).
                    self.waiters.wake(queue, 1);
                }
                return Ok(leased);
            }
            self.signals.send(|| Signal::Parked {
                queue: queue.to_owned(),
            });
            // On a shared store a publish elsewhere may come with no notice (late, lost, or
            // notices off): look again at least every `recheck`.
            let recheck = self
                .recheck
                .map_or(deadline, |r| deadline.min(tokio::time::Instant::now() + r));
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(recheck) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(Vec::new());
            }
        }
    }

    /// Ack leases; one result per item.
    pub async fn ack(&self, items: Vec<Ack>) -> Result<Vec<Result<Acked, StoreError>>, StoreError> {
        let events: Vec<AckEvent> = items.iter().map(|a| a.event).collect();
        let out = self.store.ack(items, self.clock.for_store()).await?;
        // A repeated ack (a retried request) changed nothing: count and wake only once.
        let acked = out
            .iter()
            .zip(events)
            .filter_map(|(r, e)| Some((r.as_ref().ok()?, e)));
        for (a, event) in acked.filter(|(a, _)| !a.repeated) {
            self.observe(Event::Acked {
                message: &a.message,
                event,
            });
            if a.message.key.is_some() && self.key_ordered(&a.message.queue) {
                self.waiters.wake(&a.message.queue, 1);
            }
        }
        Ok(out)
    }

    /// Nack leases; one result per item.
    pub async fn nack(
        &self,
        items: Vec<Nack>,
    ) -> Result<Vec<Result<FailureOutcome, StoreError>>, StoreError> {
        let out = self.store.nack(items, self.clock.for_store()).await?;
        for f in out.iter().flatten() {
            self.after_failure(f, "nacked");
        }
        Ok(out)
    }

    /// Announce a failed attempt (the one place that sees every death by failure: nack,
    /// expired lease, return, publish with `failed`; the alert notifier's record watches it).
    fn failure_seen(&self, f: &FailureOutcome, delivery: Option<&'static str>) {
        self.observe(Event::Failed {
            outcome: f,
            delivery,
            at: self.clock.now(),
        });
    }

    fn after_failure(&self, f: &FailureOutcome, delivery_outcome: &'static str) {
        self.failure_seen(f, Some(delivery_outcome));
        let m = &f.message;
        let unblocks_key = m.state == State::Dead && m.key.is_some() && self.key_ordered(&m.queue);
        if m.state == State::Ready || unblocks_key {
            self.waiters.wake(&m.queue, 1);
        }
    }

    /// Hand leases back unattempted (push delivery parking messages, a bridge whose broker
    /// refused a copy, a consumer's `release`); one result per item: the message as
    /// released. A consumer's release past its bound is a failed attempt (see
    /// [`redrive_storage::ReleaseBy`]), counted and watched like a nack's.
    pub async fn release(
        &self,
        items: Vec<Release>,
    ) -> Result<Vec<Result<Message, StoreError>>, StoreError> {
        let by: Vec<ReleaseBy> = items.iter().map(|r| r.by).collect();
        let out = self.store.release(items, self.clock.for_store()).await?;
        Ok(out
            .into_iter()
            .zip(by)
            .map(|(r, by)| {
                r.map(|released| {
                    match &released {
                        Released::Charged(f) => self.after_failure(f, "released"),
                        Released::Uncharged(m) => {
                            if by == ReleaseBy::Consumer {
                                self.observe(Event::Released { queue: &m.queue });
                            }
                            let unblocks_key = m.key.is_some() && self.key_ordered(&m.queue);
                            if m.state == State::Ready || unblocks_key {
                                self.waiters.wake(&m.queue, 1);
                            }
                        }
                    }
                    released.into_message()
                })
            })
            .collect())
    }

    /// Fail delivered attempts that came back (a bridge's consumer rejected them).
    pub async fn returned(
        &self,
        items: Vec<Returned>,
    ) -> Result<Vec<Result<Option<FailureOutcome>, StoreError>>, StoreError> {
        let out = self.store.returned(items, self.clock.for_store()).await?;
        for f in out.iter().flatten().flatten() {
            self.after_failure(f, "returned");
        }
        Ok(out)
    }

    /// Extend a lease.
    pub async fn extend(&self, lease: LeaseRef, by_ms: u64) -> Result<Timestamp, StoreError> {
        self.store
            .extend(lease, by_ms, self.clock.for_store())
            .await
    }

    /// Redrive a dead or scheduled message; with `payload`, replace its payload first.
    pub async fn redrive(
        &self,
        id: MessageId,
        payload: Option<serde_json::Value>,
    ) -> Result<Message, StoreError> {
        let m = self
            .store
            .redrive_with(id, payload, self.clock.for_store())
            .await?;
        self.acted(TaskAction::Redrive, &m.queue, m.key.is_some());
        Ok(m)
    }

    /// Kill a message.
    pub async fn kill(&self, id: MessageId, reason: Option<String>) -> Result<Message, StoreError> {
        let m = self.store.kill(id, reason, self.clock.for_store()).await?;
        self.acted(TaskAction::Kill, &m.queue, m.key.is_some());
        Ok(m)
    }

    /// Delete a message.
    pub async fn delete(&self, id: MessageId) -> Result<Message, StoreError> {
        let m = self.store.delete(id).await?;
        self.acted(TaskAction::Delete, &m.queue, m.key.is_some());
        Ok(m)
    }

    /// After an operator action (alone or in a task) on a message of `queue`: wake its
    /// consumers when it can make a message leasable, count a kill.
    fn acted(&self, action: TaskAction, queue: &str, keyed: bool) {
        match action {
            TaskAction::Redrive => self.waiters.wake(queue, 1),
            TaskAction::Kill | TaskAction::Delete => {
                if action == TaskAction::Kill {
                    self.observe(Event::Killed { queue });
                }
                if keyed && self.key_ordered(queue) {
                    self.waiters.wake(queue, 1);
                }
            }
        }
    }

    /// Hand every message `filter` selects (without history) to `each`, newest first, read a
    /// page of 1,000 at a time, until at least `max` were read: answers whether that bound
    /// stopped it before the end of the selection. For the scans that need each message
    /// (failure groups).
    pub async fn scan(
        &self,
        filter: &redrive_storage::MessageFilter,
        max: usize,
        mut each: impl FnMut(&Message),
    ) -> Result<bool, StoreError> {
        let mut read = 0usize;
        let mut cursor = None;
        loop {
            let page = self.store.search(filter.clone(), 1_000, cursor).await?;
            read += page.messages.len();
            page.messages.iter().for_each(&mut each);
            match page.next_cursor {
                Some(c) if read < max => cursor = Some(c),
                Some(_) => return Ok(true),
                None => return Ok(false),
            }
        }
    }

    /// Record an operator action in the audit log. A failure to record is logged, not
    /// returned: the action itself has already committed.
    pub async fn audit(&self, entry: NewAudit) {
        let action = entry.action.clone();
        if let Err(e) = self.store.audit(entry, self.clock.for_store()).await {
            tracing::error!(error = %e, %action, "cannot record an operator action in the audit log");
        }
    }

    /// One scheduler step (see [`scheduler`]).
    pub async fn tick(&self) -> Result<(), StoreError> {
        let now = if cfg!(feature = "planted-bug-early-expiry") {
            // The planted bug (see Cargo.toml): leases expire a second early.
            Some(Timestamp::now().plus_ms(1_000))
        } else {
            self.clock.for_store()
        };
        let t = self.store.tick(now).await?;
        for f in &t.expired {
            self.after_failure(f, "lease_expired");
        }
        for q in &t.ready_queues {
            self.waiters.wake(q, TICK_WAKE_CONSUMERS);
        }
        self.signals.send(|| Signal::Ticked {
            ready_queues: t.ready_queues.clone(),
            expired: t.expired.len(),
        });
        Ok(())
    }

    /// One purge step; returns whether more is left to purge.
    pub async fn purge(&self) -> Result<bool, StoreError> {
        let p = self
            .store
            .purge(self.clock.for_store(), self.config.done_retention_ms)
            .await?;
        let mut total = 0;
        for (q, n) in &p.done_deleted {
            self.observe(Event::Purged { queue: q, n: *n });
            total += n;
        }
        self.signals.send(|| Signal::Purged {
            done_deleted: total,
        });
        if total > 0 || p.idempotency_deleted > 0 {
            tracing::info!(
                done_deleted = total,
                idempotency_deleted = p.idempotency_deleted,
                "purged"
            );
        }
        Ok(p.more)
    }
}
