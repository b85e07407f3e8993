//! The engine: every operation of the API, on top of the store.
//!
//! The engine adds what the store does not know about: long polling (waiting
//! for a queue to get ready messages), waking those waiters after the writes
//! that make messages deliverable, the scheduler and purger
//! ([`scheduler`]), and metrics. Each operation calls exactly one store
//! transition, so its atomicity and durability are the store's.

pub mod scheduler;
mod waiters;

use crate::config::{Config, DEFAULT_LEASE_MS};
use crate::metrics::Metrics;
use redrive_core::{Message, MessageId, NewMessage, Ordering, QueueCatalog, State, Timestamp};
use redrive_storage::{
    Acked, FailureOutcome, LeaseRef, LeaseRequest, Leased, Nack, Published, Store, StoreError,
};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;
use waiters::Waiters;

/// Consumers woken per queue when a tick makes messages ready; each one that
/// leases a full batch wakes the next, so a large backlog drains in parallel
/// without waking every idle consumer for a handful of messages.
const TICK_WAKE_CONSUMERS: usize = 4;

/// The engine. Shared by every request handler and background task.
pub struct Engine {
    store: Arc<dyn Store>,
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    catalog: QueueCatalog,
    waiters: Waiters,
    shutting_down: AtomicBool,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine over `store`.
    pub fn new(store: Arc<dyn Store>, config: Arc<Config>, metrics: Arc<Metrics>) -> Self {
        let catalog = config.catalog();
        Self {
            store,
            config,
            metrics,
            catalog,
            waiters: Waiters::default(),
            shutting_down: AtomicBool::new(false),
        }
    }

    /// Start the background services (scheduler, purger).
    pub fn start(self: Arc<Self>) -> scheduler::Background {
        scheduler::start(self)
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
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
        self.catalog.get(queue).ordering == Ordering::Key
    }

    /// The settings of every queue.
    pub fn catalog(&self) -> &QueueCatalog {
        &self.catalog
    }

    /// Publish (all or nothing).
    pub async fn publish(&self, items: Vec<NewMessage>) -> Result<Vec<Published>, StoreError> {
        let out = self.store.publish(items, Timestamp::now()).await?;
        // Per queue (one, for an API request): messages published, and of them ready now.
        let mut per_queue: Vec<(&str, u64, usize)> = Vec::new();
        for p in &out {
            if p.replayed {
                continue;
            }
            if let Some(f) = &p.failure {
                self.metrics.failed(f, None);
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
            self.metrics.published(q, published);
            if ready > 0 {
                self.waiters.wake(q, ready);
            }
        }
        Ok(out)
    }

    /// Lease up to `max` messages, long-polling up to `wait_ms` when none is ready.
    pub async fn lease(
        &self,
        queue: &str,
        max: u32,
        lease_ms: Option<u64>,
        wait_ms: u64,
    ) -> Result<Vec<Leased>, StoreError> {
        let lease_ms = lease_ms
            .or_else(|| self.config.queue_lease_ms(queue))
            .unwrap_or(DEFAULT_LEASE_MS);
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
            };
            let leased = self.store.lease(req, Timestamp::now()).await?;
            if !leased.is_empty() || wait_ms == 0 || self.is_shutting_down() {
                for l in &leased {
                    self.metrics.leased(queue, l.lateness_ms);
                }
                if leased.len() == max as usize {
                    // A full batch: more may be ready. Pass the wake-up on (see `Waiters`).
                    self.waiters.wake(queue, 1);
                }
                return Ok(leased);
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => return Ok(Vec::new()),
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(Vec::new());
            }
        }
    }

    /// Ack leases; one result per item.
    pub async fn ack(
        &self,
        items: Vec<LeaseRef>,
    ) -> Result<Vec<Result<Acked, StoreError>>, StoreError> {
        let out = self.store.ack(items, Timestamp::now()).await?;
        // A repeated ack (a retried request) changed nothing: count and wake only once.
        for a in out.iter().flatten().filter(|a| !a.repeated) {
            self.metrics.acked(&a.message.queue, a.message.attempts);
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
        let out = self.store.nack(items, Timestamp::now()).await?;
        for f in out.iter().flatten() {
            self.after_failure(f, "nacked");
        }
        Ok(out)
    }

    fn after_failure(&self, f: &FailureOutcome, delivery_outcome: &'static str) {
        self.metrics.failed(f, Some(delivery_outcome));
        let m = &f.message;
        let unblocks_key = m.state == State::Dead && m.key.is_some() && self.key_ordered(&m.queue);
        if m.state == State::Ready || unblocks_key {
            self.waiters.wake(&m.queue, 1);
        }
    }

    /// Extend a lease.
    pub async fn extend(&self, lease: LeaseRef, by_ms: u64) -> Result<Timestamp, StoreError> {
        self.store.extend(lease, by_ms, Timestamp::now()).await
    }

    /// Redrive a dead or scheduled message.
    pub async fn redrive(&self, id: MessageId) -> Result<Message, StoreError> {
        let m = self.store.redrive(id, Timestamp::now()).await?;
        self.waiters.wake(&m.queue, 1);
        Ok(m)
    }

    /// Kill a message.
    pub async fn kill(&self, id: MessageId, reason: Option<String>) -> Result<Message, StoreError> {
        let m = self.store.kill(id, reason, Timestamp::now()).await?;
        self.metrics.dead(&m.queue, "killed");
        if m.key.is_some() && self.key_ordered(&m.queue) {
            self.waiters.wake(&m.queue, 1);
        }
        Ok(m)
    }

    /// Delete a message.
    pub async fn delete(&self, id: MessageId) -> Result<Message, StoreError> {
        let m = self.store.delete(id).await?;
        if m.key.is_some() && self.key_ordered(&m.queue) {
            self.waiters.wake(&m.queue, 1);
        }
        Ok(m)
    }

    /// One scheduler step (see [`scheduler`]).
    pub async fn tick(&self, now: Timestamp) -> Result<(), StoreError> {
        let t = self.store.tick(now).await?;
        for f in &t.expired {
            self.after_failure(f, "lease_expired");
        }
        for q in &t.ready_queues {
            self.waiters.wake(q, TICK_WAKE_CONSUMERS);
        }
        Ok(())
    }

    /// One purge step; returns whether more is left to purge.
    pub async fn purge(&self, now: Timestamp) -> Result<bool, StoreError> {
        let p = self
            .store
            .purge(now, self.config.done_retention.ms())
            .await?;
        let mut total = 0;
        for (q, n) in &p.done_deleted {
            self.metrics.purged(q, *n);
            total += n;
        }
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
