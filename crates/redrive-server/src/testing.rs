//! Test support: a store whose writes can be made to fail on demand, for the tests of what
//! the engine does when its store fails (the consume driver's policy for store faults).
//! Not for production use; hidden from the docs.

use redrive_core::{Message, MessageId, NewMessage, Timestamp};
use redrive_storage::{
    Ack, Acked, AuditRecord, CommitStats, FailureOutcome, Health, LeaseRef, LeaseRequest, Leased,
    MessageFilter, Nack, NewAudit, NewSession, Notifier, Page, Published, PurgeOutcome, QueueStats,
    Release, Released, Returned, SessionLookup, SessionRecord, Store, StoreError, StoreMetric,
    TaskRecord, TaskState, TaskStep, TaskStepOutcome, TaskTransition, TickOutcome,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A store that passes every call to `inner`, except the `ack`, `lease`, `publish` and
/// `session_get` calls it was told to fail ([`FaultyStore::fail_acks`],
/// [`FaultyStore::fail_leases`], [`FaultyStore::fail_publishes`],
/// [`FaultyStore::fail_session_lookups`]): those answer
/// [`StoreError::Unavailable`] without reaching `inner` (nothing is written), as a store
/// whose database went away would.
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    acks_to_fail: AtomicUsize,
    acks_failed: AtomicUsize,
    leases_to_fail: AtomicUsize,
    leases_failed: AtomicUsize,
    publishes_to_fail: AtomicUsize,
    publishes_failed: AtomicUsize,
    session_lookups_to_fail: AtomicUsize,
}

impl std::fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyStore").finish_non_exhaustive()
    }
}

/// Take one from `n` if it is not 0; answers whether it took one.
fn take_one(n: &AtomicUsize) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

impl FaultyStore {
    /// A store over `inner` that fails nothing yet.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            acks_to_fail: AtomicUsize::new(0),
            acks_failed: AtomicUsize::new(0),
            leases_to_fail: AtomicUsize::new(0),
            leases_failed: AtomicUsize::new(0),
            publishes_to_fail: AtomicUsize::new(0),
            publishes_failed: AtomicUsize::new(0),
            session_lookups_to_fail: AtomicUsize::new(0),
        }
    }

    /// Fail the next `n` `ack` calls (each a whole batch).
    pub fn fail_acks(&self, n: usize) {
        self.acks_to_fail.store(n, Ordering::SeqCst);
    }

    /// `ack` calls failed so far.
    pub fn acks_failed(&self) -> usize {
        self.acks_failed.load(Ordering::SeqCst)
    }

    /// Fail the next `n` `lease` calls.
    pub fn fail_leases(&self, n: usize) {
        self.leases_to_fail.store(n, Ordering::SeqCst);
    }

    /// `lease` calls failed so far.
    pub fn leases_failed(&self) -> usize {
        self.leases_failed.load(Ordering::SeqCst)
    }

    /// Fail the next `n` `publish` calls.
    pub fn fail_publishes(&self, n: usize) {
        self.publishes_to_fail.store(n, Ordering::SeqCst);
    }

    /// `publish` calls failed so far.
    pub fn publishes_failed(&self) -> usize {
        self.publishes_failed.load(Ordering::SeqCst)
    }

    /// Fail the next `n` `session_get` calls (the console's session check).
    pub fn fail_session_lookups(&self, n: usize) {
        self.session_lookups_to_fail.store(n, Ordering::SeqCst);
    }

    fn injected(what: &str) -> StoreError {
        StoreError::Unavailable(format!("injected fault: {what} failed"))
    }
}

#[async_trait::async_trait]
impl Store for FaultyStore {
    async fn lease(
        &self,
        req: LeaseRequest,
        now: Option<Timestamp>,
    ) -> Result<Vec<Leased>, StoreError> {
        if take_one(&self.leases_to_fail) {
            self.leases_failed.fetch_add(1, Ordering::SeqCst);
            return Err(Self::injected("lease"));
        }
        self.inner.lease(req, now).await
    }

    async fn ack(
        &self,
        items: Vec<Ack>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<Acked, StoreError>>, StoreError> {
        if take_one(&self.acks_to_fail) {
            self.acks_failed.fetch_add(1, Ordering::SeqCst);
            return Err(Self::injected("ack"));
        }
        self.inner.ack(items, now).await
    }

    async fn publish(
        &self,
        items: Vec<NewMessage>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Published>, StoreError> {
        if take_one(&self.publishes_to_fail) {
            self.publishes_failed.fetch_add(1, Ordering::SeqCst);
            return Err(Self::injected("publish"));
        }
        self.inner.publish(items, now).await
    }

    async fn nack(
        &self,
        items: Vec<Nack>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<FailureOutcome, StoreError>>, StoreError> {
        self.inner.nack(items, now).await
    }

    async fn release(
        &self,
        items: Vec<Release>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<Released, StoreError>>, StoreError> {
        self.inner.release(items, now).await
    }

    async fn returned(
        &self,
        items: Vec<Returned>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<Option<FailureOutcome>, StoreError>>, StoreError> {
        self.inner.returned(items, now).await
    }

    async fn extend(
        &self,
        lease: LeaseRef,
        by_ms: u64,
        now: Option<Timestamp>,
    ) -> Result<Timestamp, StoreError> {
        self.inner.extend(lease, by_ms, now).await
    }

    async fn redrive_with(
        &self,
        id: MessageId,
        payload: Option<serde_json::Value>,
        now: Option<Timestamp>,
    ) -> Result<Message, StoreError> {
        self.inner.redrive_with(id, payload, now).await
    }

    async fn kill(
        &self,
        id: MessageId,
        reason: Option<String>,
        now: Option<Timestamp>,
    ) -> Result<Message, StoreError> {
        self.inner.kill(id, reason, now).await
    }

    async fn delete(&self, id: MessageId) -> Result<Message, StoreError> {
        self.inner.delete(id).await
    }

    async fn idempotency_keys(
        &self,
        queue: String,
        prefix: String,
        limit: u32,
        now: Option<Timestamp>,
    ) -> Result<Vec<(String, MessageId)>, StoreError> {
        self.inner.idempotency_keys(queue, prefix, limit, now).await
    }

    async fn forget_idempotency_keys(
        &self,
        queue: String,
        keys: Vec<String>,
    ) -> Result<u64, StoreError> {
        self.inner.forget_idempotency_keys(queue, keys).await
    }

    async fn tick(&self, now: Option<Timestamp>) -> Result<TickOutcome, StoreError> {
        self.inner.tick(now).await
    }

    async fn purge(
        &self,
        now: Option<Timestamp>,
        done_retention_ms: u64,
    ) -> Result<PurgeOutcome, StoreError> {
        self.inner.purge(now, done_retention_ms).await
    }

    async fn get(&self, id: MessageId) -> Result<Option<Message>, StoreError> {
        self.inner.get(id).await
    }

    async fn search(
        &self,
        filter: MessageFilter,
        limit: u32,
        cursor: Option<String>,
    ) -> Result<Page, StoreError> {
        self.inner.search(filter, limit, cursor).await
    }

    async fn count(&self, filter: MessageFilter) -> Result<u64, StoreError> {
        self.inner.count(filter).await
    }

    async fn task_create(&self, task: TaskRecord, audit: NewAudit) -> Result<(), StoreError> {
        self.inner.task_create(task, audit).await
    }

    async fn task_transition(
        &self,
        t: TaskTransition,
        now: Option<Timestamp>,
    ) -> Result<TaskRecord, StoreError> {
        self.inner.task_transition(t, now).await
    }

    async fn task_step(
        &self,
        step: TaskStep,
        now: Option<Timestamp>,
    ) -> Result<TaskStepOutcome, StoreError> {
        self.inner.task_step(step, now).await
    }

    async fn task(&self, id: String) -> Result<Option<TaskRecord>, StoreError> {
        self.inner.task(id).await
    }

    async fn tasks(
        &self,
        state: Option<TaskState>,
        limit: u32,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        self.inner.tasks(state, limit).await
    }

    async fn audit(&self, entry: NewAudit, now: Option<Timestamp>) -> Result<u64, StoreError> {
        self.inner.audit(entry, now).await
    }

    async fn audit_list(
        &self,
        before: Option<u64>,
        limit: u32,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        self.inner.audit_list(before, limit).await
    }

    async fn queue_stats(&self) -> Result<Vec<QueueStats>, StoreError> {
        self.inner.queue_stats().await
    }

    async fn session_create(
        &self,
        s: NewSession,
        now: Option<Timestamp>,
    ) -> Result<SessionRecord, StoreError> {
        self.inner.session_create(s, now).await
    }

    async fn session_get(
        &self,
        q: SessionLookup,
        now: Option<Timestamp>,
    ) -> Result<Option<SessionRecord>, StoreError> {
        if take_one(&self.session_lookups_to_fail) {
            return Err(Self::injected("session_get"));
        }
        self.inner.session_get(q, now).await
    }

    async fn session_delete(&self, id: String) -> Result<bool, StoreError> {
        self.inner.session_delete(id).await
    }

    async fn shared_secret(&self, name: String, candidate: String) -> Result<String, StoreError> {
        self.inner.shared_secret(name, candidate).await
    }

    async fn heartbeat(
        &self,
        beat: redrive_storage::Heartbeat,
        now: Option<Timestamp>,
    ) -> Result<redrive_storage::Beat, StoreError> {
        self.inner.heartbeat(beat, now).await
    }

    async fn leave(&self, incarnation: String, now: Option<Timestamp>) -> Result<(), StoreError> {
        self.inner.leave(incarnation, now).await
    }

    async fn cluster(
        &self,
        now: Option<Timestamp>,
    ) -> Result<redrive_storage::ClusterView, StoreError> {
        self.inner.cluster(now).await
    }

    async fn endpoint_trip(
        &self,
        endpoint: String,
        incarnation: String,
        open_ms: u64,
        now: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        self.inner
            .endpoint_trip(endpoint, incarnation, open_ms, now)
            .await
    }

    async fn endpoint_trips(
        &self,
        now: Option<Timestamp>,
    ) -> Result<redrive_storage::EndpointTrips, StoreError> {
        self.inner.endpoint_trips(now).await
    }

    fn notifier(&self) -> Notifier {
        self.inner.notifier()
    }

    fn health(&self) -> Health {
        self.inner.health()
    }

    async fn close(&self) {
        self.inner.close().await
    }

    fn commit_stats(&self) -> CommitStats {
        self.inner.commit_stats()
    }

    fn metrics(&self) -> Vec<StoreMetric> {
        self.inner.metrics()
    }
}
