//! The storage contract.

use crate::{
    AuditRecord, Beat, ClusterView, EndpointTrips, Heartbeat, MessageFilter, NewAudit, NewSession,
    Page, SessionLookup, SessionRecord, StoreError, TaskRecord, TaskState, TaskStep,
    TaskStepOutcome, TaskTransition,
};
use redrive_core::{
    AttemptResponse, DeadReason, ErrorClass, Failure, Message, MessageId, NewMessage, State,
    Timestamp, Waited,
};
use tokio::sync::{broadcast, watch};

/// A request for up to `max` ready messages of `queue`.
#[derive(Debug, Clone)]
pub struct LeaseRequest {
    /// The queue.
    pub queue: String,
    /// At most this many messages (≥ 1).
    pub max: u32,
    /// Lease length, ms.
    pub lease_ms: u64,
    /// Stop before the leased messages' stored JSON (payload, headers, last error, key)
    /// would pass this many bytes; at least one message is leased whatever its size. `None`:
    /// no byte bound. Lets an API answer stay under its size limit in one call, without
    /// leasing a message it cannot answer.
    pub max_bytes: Option<u64>,
}

/// A message handed to a consumer.
#[derive(Debug, Clone)]
pub struct Leased {
    /// The message as leased (state `leased`, no history).
    pub message: Message,
    /// The fencing token that ack / nack / extend must present.
    pub token: String,
    /// This delivery's attempt number (1 = first delivery).
    pub attempt: u32,
    /// The attempt number of the message's last try under its queue's policy: when
    /// `attempt == max_attempts`, a failure of this attempt that counts makes the message
    /// dead (`max_attempts`). It is the policy's `max_attempts` while every attempt so far
    /// counted, and more after a redrive (a fresh budget: the attempt numbers go on) or
    /// uncharged rate limits. It assumes the remaining failures count; `max_age` or a
    /// permanent failure can end the message earlier.
    pub max_attempts: u32,
    /// When the lease expires.
    pub expires_at: Timestamp,
    /// How late the delivery is: lease time − due time, ms (for the lateness histogram).
    pub lateness_ms: i64,
}

/// The outcome of one published item.
#[derive(Debug, Clone)]
pub struct Published {
    /// The message (the original one on a replay).
    pub message: Message,
    /// True when an idempotency key matched an earlier publish: nothing was written.
    pub replayed: bool,
    /// For a publish with `failed`: what the policy decided.
    pub failure: Option<FailureOutcome>,
}

/// How a lease that is no longer live was settled before it could expire
/// ([`StoreError::LeaseSettled`](crate::StoreError::LeaseSettled)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Settled {
    /// Acked: the message is done (or was, before a bridge's return).
    Acked,
    /// Nacked (or failed by a bridge's return): the attempt failed, the policy decided.
    Nacked,
    /// Released: handed back unattempted.
    Released,
    /// An operator killed the message while it was leased.
    Killed,
}

impl Settled {
    /// The snake_case name (`acked`, `nacked`, `released`, `killed`), as the API's error
    /// says it.
    pub fn as_str(self) -> &'static str {
        match self {
            Settled::Acked => "acked",
            Settled::Nacked => "nacked",
            Settled::Released => "released",
            Settled::Killed => "killed",
        }
    }

    /// Parse the snake_case name.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Acked, Self::Nacked, Self::Released, Self::Killed]
            .into_iter()
            .find(|h| h.as_str() == s)
    }

    /// How it was settled, in words.
    pub fn explain(self) -> &'static str {
        match self {
            Settled::Acked => "it was acked (the message is done)",
            Settled::Nacked => "it was nacked (the policy decided the message's retry)",
            Settled::Released => "it was released (handed back unattempted)",
            Settled::Killed => "an operator killed the message",
        }
    }
}

/// A reference to a lease: the message and the token it was leased with.
#[derive(Debug, Clone)]
pub struct LeaseRef {
    /// The message.
    pub id: MessageId,
    /// Its lease token.
    pub token: String,
}

/// An acknowledgement: the attempt of `lease` succeeded.
#[derive(Debug, Clone)]
pub struct Ack {
    /// The lease.
    pub lease: LeaseRef,
    /// What the endpoint answered, when redrive made the attempt itself (push delivery);
    /// kept in the attempt's history entry.
    pub response: Option<AttemptResponse>,
    /// What the attempt's history entry says happened.
    pub event: AckEvent,
    /// Push delivery: what the message waited for before this attempt (usually nothing, at
    /// most one per reason); noted in the history before the attempt's entry
    /// ([`redrive_core::note_wait`]).
    pub waited: Vec<Waited>,
}

/// What an [`Ack`] records in the attempt's history entry. Both make the message `done`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AckEvent {
    /// `acked`: a consumer (or a push endpoint) processed it.
    #[default]
    Acked,
    /// `republished`: a bridge handed it back to its broker, which took it
    /// ([`HistoryEvent::Republished`](redrive_core::HistoryEvent::Republished)).
    Republished,
}

impl AckEvent {
    /// The history entry's `event`.
    pub fn as_str(self) -> &'static str {
        match self {
            AckEvent::Acked => "acked",
            AckEvent::Republished => "republished",
        }
    }
}

impl From<LeaseRef> for Ack {
    /// A consumer's ack: no response to record.
    fn from(lease: LeaseRef) -> Self {
        Self {
            lease,
            response: None,
            event: AckEvent::Acked,
            waited: Vec::new(),
        }
    }
}

impl Ack {
    /// A bridge's ack of a republished message: its broker confirmed the copy.
    pub fn republished(lease: LeaseRef) -> Self {
        Self {
            event: AckEvent::Republished,
            ..Self::from(lease)
        }
    }
}

/// A negative acknowledgement.
#[derive(Debug, Clone)]
pub struct Nack {
    /// The lease.
    pub lease: LeaseRef,
    /// What went wrong.
    pub failure: Failure,
    /// What the endpoint answered, when redrive made the attempt itself (push delivery).
    pub response: Option<AttemptResponse>,
    /// Push delivery: what the message waited for before this attempt (see
    /// [`Ack::waited`]).
    pub waited: Vec<Waited>,
}

/// A delivery that a broker consumer failed after redrive had counted it delivered (a
/// bridge republished the message, the broker confirmed it, and the consumer rejected it
/// later; the broker dead-lettered it back). It fails the attempt that delivered it.
#[derive(Debug, Clone)]
pub struct Returned {
    /// The message.
    pub id: MessageId,
    /// The attempt that was delivered (the bridge wrote it on the copy it republished). A
    /// return for any other attempt, or for a message no longer `done` or `leased`, is a
    /// repeat (a crash between storing it and acking it to the broker) and changes nothing.
    pub attempt: u32,
    /// What went wrong.
    pub failure: Failure,
}

/// A leased message handed back without having been attempted: push delivery parks a
/// message its endpoint cannot take now (breaker open, retry budget spent), a bridge one
/// its broker refused, a consumer one it will not process (shutting down). The attempt
/// the lease counted is taken back: nothing is charged, and nothing enters the history but
/// the optional note of what it waited for — within the bound of [`Release::by`].
#[derive(Debug, Clone)]
pub struct Release {
    /// The lease.
    pub lease: LeaseRef,
    /// When the message may be leased again: `ready` at once if not after now, else
    /// `scheduled` until then.
    pub until: Timestamp,
    /// Who hands it back, which bounds how often it may be uncharged.
    pub by: ReleaseBy,
    /// Push delivery parks it because its endpoint makes it wait (and it may have waited in
    /// the store before its lease): noted in the history, one entry per wait episode and
    /// reason however often it is parked ([`redrive_core::note_wait`]).
    pub waited: Vec<Waited>,
}

impl Release {
    /// redrive's own release (push parking, a bridge whose broker refused a republish):
    /// never charged, nothing noted.
    pub fn by_redrive(lease: LeaseRef, until: Timestamp) -> Self {
        Self {
            lease,
            until,
            by: ReleaseBy::Redrive,
            waited: Vec::new(),
        }
    }
}

/// Who releases a lease ([`Release`]), and so whether releases are bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseBy {
    /// redrive itself (push delivery parking, a bridge whose broker refused a republish):
    /// never charged, never bounded. Its own protections (breaker, pace, budget,
    /// reconnect backoff) keep it from looping.
    Redrive,
    /// A consumer (`POST /v1/messages/{id}/release`): uncharged at most the queue's
    /// `max_rate_limited` times since the publish or the last redrive (the bound of
    /// uncharged rate-limited attempts). Past that, a release is a failed attempt like a
    /// transient nack (a history entry coded `released`, the policy's delay when it is
    /// longer than `until`, dead after `max_attempts`), so a consumer that releases
    /// everything it leases cannot keep a message in a hot loop.
    Consumer,
}

/// What a release did.
#[derive(Debug, Clone)]
pub enum Released {
    /// Handed back uncharged: the message (`ready` or `scheduled`) with its attempt count
    /// as before the lease.
    Uncharged(Message),
    /// A consumer's release past its bound of uncharged ones: a failed attempt, decided by
    /// the policy like a nack's.
    Charged(FailureOutcome),
}

impl Released {
    /// The message after the release.
    pub fn message(&self) -> &Message {
        match self {
            Released::Uncharged(m) => m,
            Released::Charged(f) => &f.message,
        }
    }

    /// The message after the release, owned.
    pub fn into_message(self) -> Message {
        match self {
            Released::Uncharged(m) => m,
            Released::Charged(f) => f.message,
        }
    }
}

/// A successful ack.
#[derive(Debug, Clone)]
pub struct Acked {
    /// The message, now `done`.
    pub message: Message,
    /// True when this ack repeated an earlier one (a retried request with the same
    /// token): nothing changed, and it must not be counted again (metrics, wake-ups).
    pub repeated: bool,
}

/// What a failed attempt led to (nack, expired lease, publish with `failed`).
#[derive(Debug, Clone)]
pub struct FailureOutcome {
    /// The message after the transition (`scheduled`, `ready` or `dead`).
    pub message: Message,
    /// The failure's class.
    pub class: ErrorClass,
    /// The chosen delay, when a retry was scheduled.
    pub retry_delay_ms: Option<u64>,
    /// Why it died, when it did.
    pub dead_reason: Option<DeadReason>,
}

/// What one scheduler tick did.
#[derive(Debug, Clone, Default)]
pub struct TickOutcome {
    /// Queues in which scheduled messages became ready.
    pub ready_queues: Vec<String>,
    /// Messages whose lease expired, with what the policy decided for each.
    pub expired: Vec<FailureOutcome>,
    /// When the next tick is due (earliest scheduled due time or lease expiry), if any.
    pub next_wake: Option<Timestamp>,
    /// Whether more work was due than one tick handles; call again at once.
    pub more: bool,
}

/// What a purge removed.
#[derive(Debug, Clone, Default)]
pub struct PurgeOutcome {
    /// Done messages deleted, per queue.
    pub done_deleted: Vec<(String, u64)>,
    /// Expired idempotency records deleted.
    pub idempotency_deleted: u64,
    /// Whether more was due than one purge deletes; call again at once.
    pub more: bool,
}

/// Counts of one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStats {
    /// The queue.
    pub queue: String,
    /// Messages per state, indexed by [`State::code`].
    pub counts: [u64; 5],
    /// Due time of the oldest ready message.
    pub oldest_ready_due: Option<Timestamp>,
}

impl QueueStats {
    /// The count of one state.
    pub fn count(&self, state: State) -> u64 {
        self.counts[state.code() as usize]
    }
}

/// The storage contract (see the crate docs).
///
/// **Time.** Every transition takes `now`: `Some` is the caller's clock reading (tests
/// drive a fake clock with it), `None` is the store's own clock — the database's where the
/// backend has one (PostgreSQL: one clock for every node of a cluster, SPEC §13), the
/// system clock for the embedded store.
///
/// **Durability.** Unless a method says otherwise, once its future resolves `Ok` the
/// change is durable under the backend's durability setting (SQLite: fsync'd; PostgreSQL:
/// committed). Two answer earlier and may be lost in a crash: [`Store::lease`] and
/// [`Store::tick`]. A lost lease leaves its message as it was (`ready`, attempt not
/// counted); a lost tick is repeated by the next one. Either way nothing acknowledged is
/// lost and a later call sees the write in order.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Insert messages, all or nothing. Idempotency keys are checked against the window;
    /// a replay returns the original with `replayed = true`.
    async fn publish(
        &self,
        items: Vec<NewMessage>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Published>, StoreError>;

    /// Lease up to `max` ready messages: highest priority first, then earliest due,
    /// then oldest; under `ordering = "key"` only the head of each key. May answer before
    /// the lease is durable (see the trait's docs): a crash can forget it, never leak it.
    async fn lease(
        &self,
        req: LeaseRequest,
        now: Option<Timestamp>,
    ) -> Result<Vec<Leased>, StoreError>;

    /// Ack leased messages; one result per item. Acking an already-acked message with
    /// its last token succeeds again (a retried request). A token whose lease was settled
    /// otherwise is [`StoreError::LeaseSettled`] (ack, nack, extend and release alike);
    /// [`StoreError::LeaseExpired`] only when it expired.
    async fn ack(
        &self,
        items: Vec<Ack>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<Acked, StoreError>>, StoreError>;

    /// Nack leased messages; the policy decides retry or dead. One result per item.
    async fn nack(
        &self,
        items: Vec<Nack>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<FailureOutcome, StoreError>>, StoreError>;

    /// Hand leased messages back unattempted ([`Release`]); one result per item: the
    /// message as released (`ready` or `scheduled`, its attempt count as before the
    /// lease), or, for a consumer's release past its bound, the failed attempt it counted
    /// as ([`Released`]).
    async fn release(
        &self,
        items: Vec<Release>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<Released, StoreError>>, StoreError>;

    /// Fail delivered attempts that came back ([`Returned`]); one result per item: the
    /// policy's decision (`Some`), or `None` when the return was already applied.
    async fn returned(
        &self,
        items: Vec<Returned>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<Option<FailureOutcome>, StoreError>>, StoreError>;

    /// Extend a lease to `now + by_ms` (never shortening it). Returns the new expiry.
    async fn extend(
        &self,
        lease: LeaseRef,
        by_ms: u64,
        now: Option<Timestamp>,
    ) -> Result<Timestamp, StoreError>;

    /// Make a dead or scheduled message ready now, with a fresh attempt budget and a
    /// fresh `max_age` window counted from now (SPEC §2); its history is kept.
    async fn redrive(&self, id: MessageId, now: Option<Timestamp>) -> Result<Message, StoreError> {
        self.redrive_with(id, None, now).await
    }

    /// [`Store::redrive`], replacing the payload with `payload` when given (an operator
    /// fixed it); the history entry says it was edited.
    async fn redrive_with(
        &self,
        id: MessageId,
        payload: Option<serde_json::Value>,
        now: Option<Timestamp>,
    ) -> Result<Message, StoreError>;

    /// Make a scheduled, ready or leased message dead with reason `killed`.
    async fn kill(
        &self,
        id: MessageId,
        reason: Option<String>,
        now: Option<Timestamp>,
    ) -> Result<Message, StoreError>;

    /// Remove a message (any state) and its idempotency record.
    async fn delete(&self, id: MessageId) -> Result<Message, StoreError>;

    /// The live idempotency keys of `queue` that begin with `prefix` (at most `limit`, in
    /// key order), each with its message's id. Expired keys are not listed. A bridge finds
    /// its intake markers with it (a message stored but not yet acked to its broker).
    async fn idempotency_keys(
        &self,
        queue: String,
        prefix: String,
        limit: u32,
        now: Option<Timestamp>,
    ) -> Result<Vec<(String, MessageId)>, StoreError>;

    /// Forget idempotency keys of `queue`, durably (like an operator's delete does for its
    /// message's key): a later publish with one of them creates a new message. The messages
    /// are untouched. Answers how many keys were live or expired records; an unknown key
    /// is no error.
    async fn forget_idempotency_keys(
        &self,
        queue: String,
        keys: Vec<String>,
    ) -> Result<u64, StoreError>;

    /// The scheduler's step: make due scheduled messages ready, fail expired leases
    /// (`lease_expired`), and say when to call again. May answer before it is durable;
    /// a lost tick is done again by the next. Safe to run from several processes at once on
    /// a shared store: a message is promoted or expired once.
    async fn tick(&self, now: Option<Timestamp>) -> Result<TickOutcome, StoreError>;

    /// Delete done messages finished before `now - done_retention_ms` and expired
    /// idempotency records. Dead messages are never purged here.
    async fn purge(
        &self,
        now: Option<Timestamp>,
        done_retention_ms: u64,
    ) -> Result<PurgeOutcome, StoreError>;

    /// One message with its history.
    async fn get(&self, id: MessageId) -> Result<Option<Message>, StoreError>;

    /// Messages matching `filter`, newest first, `limit` at a time.
    async fn search(
        &self,
        filter: MessageFilter,
        limit: u32,
        cursor: Option<String>,
    ) -> Result<Page, StoreError>;

    /// How many messages match `filter`.
    async fn count(&self, filter: MessageFilter) -> Result<u64, StoreError>;

    /// Store a new task (state `running` or, for an empty selection, `done`) and record
    /// `audit`, in one transaction.
    async fn task_create(&self, task: TaskRecord, audit: NewAudit) -> Result<(), StoreError>;

    /// Move a task to `t.to` if it is in one of `t.from` (else
    /// [`StoreError::InvalidTaskState`] naming `t.action`), setting `stop_reason` when a
    /// reason is given, and record `t.audit`, in one transaction.
    async fn task_transition(
        &self,
        t: TaskTransition,
        now: Option<Timestamp>,
    ) -> Result<TaskRecord, StoreError>;

    /// Act on the step's messages and advance the task, in one transaction; nothing when
    /// the task is not `running`. A message the action is refused for (not in a state it
    /// allows, gone) counts as `failed`. When `next_cursor` is `None` the task becomes
    /// `done` and a `task.done` audit entry is recorded with it.
    async fn task_step(
        &self,
        step: TaskStep,
        now: Option<Timestamp>,
    ) -> Result<TaskStepOutcome, StoreError>;

    /// One task.
    async fn task(&self, id: String) -> Result<Option<TaskRecord>, StoreError>;

    /// The newest `limit` tasks (in `state`, when given), newest first.
    async fn tasks(
        &self,
        state: Option<TaskState>,
        limit: u32,
    ) -> Result<Vec<TaskRecord>, StoreError>;

    /// Record an operator action; returns its `seq`.
    async fn audit(&self, entry: NewAudit, now: Option<Timestamp>) -> Result<u64, StoreError>;

    /// The audit log, newest first: `limit` entries with `seq` below `before` (all when `None`).
    async fn audit_list(
        &self,
        before: Option<u64>,
        limit: u32,
    ) -> Result<Vec<AuditRecord>, StoreError>;

    /// Open a console session ([`crate::sessions`]): delete every session expired under
    /// `s.idle_ms`, store this one (seen now), then delete the least recently used
    /// sessions of its token past `s.max_per_token`, in one transaction. Answers the
    /// session as stored. An `id` already stored is replaced.
    async fn session_create(
        &self,
        s: NewSession,
        now: Option<Timestamp>,
    ) -> Result<SessionRecord, StoreError>;

    /// The session `q.id` unless it is missing or has expired under `q.idle_ms`; its
    /// `last_seen` is moved to now (durably, before the answer) when it was older than
    /// `q.touch_after_ms`, and the answer says so.
    async fn session_get(
        &self,
        q: SessionLookup,
        now: Option<Timestamp>,
    ) -> Result<Option<SessionRecord>, StoreError>;

    /// End session `id`; answers whether it was stored (an unknown id is no error).
    async fn session_delete(&self, id: String) -> Result<bool, StoreError>;

    /// The secret named `name`, the same for every process of this store: the first call
    /// stores `candidate` (random, the caller's) and answers it; every later call, on any
    /// process, answers what was stored. The console's forms without tokens carry one
    /// (their CSRF token), so that a form rendered by one node is accepted by another.
    async fn shared_secret(&self, name: String, candidate: String) -> Result<String, StoreError>;

    /// Counts per state of every queue that has messages.
    async fn queue_stats(&self) -> Result<Vec<QueueStats>, StoreError>;

    /// Record a node's heartbeat at the store's clock, and take or renew leadership for it
    /// when it stands ([`crate::cluster::next_leader`]); answers the leader after the beat.
    /// Nodes not seen for [`crate::cluster::FORGET_NODE_MS`] are forgotten. Durable on
    /// success (a leadership answered is held).
    async fn heartbeat(&self, beat: Heartbeat, now: Option<Timestamp>) -> Result<Beat, StoreError>;

    /// A node stops: forget it, and end its leadership now if it holds it (another node
    /// takes it at its next beat). Unknown incarnations are no error.
    async fn leave(&self, incarnation: String, now: Option<Timestamp>) -> Result<(), StoreError>;

    /// The nodes and the leader, at the store's clock.
    async fn cluster(&self, now: Option<Timestamp>) -> Result<ClusterView, StoreError>;

    /// The breaker of push endpoint `endpoint` opened from Closed on the process
    /// `incarnation`, for `open_ms` from now (the store's clock): record the trip, unless
    /// one recorded ends later ([`crate::cluster::next_trip`]). Durable on success where
    /// the store is shared; the embedded store keeps trips in memory (one process is its
    /// whole cluster).
    async fn endpoint_trip(
        &self,
        endpoint: String,
        incarnation: String,
        open_ms: u64,
        now: Option<Timestamp>,
    ) -> Result<(), StoreError>;

    /// The endpoints whose latest trip's open period has not ended at the store's clock.
    async fn endpoint_trips(&self, now: Option<Timestamp>) -> Result<EndpointTrips, StoreError>;

    /// What to wake for: when [`Store::tick`] should next run, and messages made ready by
    /// another process sharing the store ([`Notifier`]).
    fn notifier(&self) -> Notifier;

    /// Whether the store can take writes now ([`Health`]). Readiness checks ask this.
    fn health(&self) -> Health;

    /// Stop the writer after the writes already queued; later writes fail with `Closed`.
    async fn close(&self);

    /// Group-commit statistics: (commits, changes) since open.
    fn commit_stats(&self) -> CommitStats;

    /// The backend's own figures for `/metrics` (SQLite: its write-ahead log; PostgreSQL:
    /// its pool), each named in full (`redrive_wal_bytes`). Empty when it has none.
    fn metrics(&self) -> Vec<StoreMetric> {
        Vec::new()
    }
}

/// Counters of the writer, for metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CommitStats {
    /// Transactions committed.
    pub commits: u64,
    /// Message transitions committed (a message published, leased, acked … is one each).
    pub changes: u64,
    /// Total seconds spent in commit (fsync included).
    pub commit_seconds: f64,
}

/// One figure a backend reports about itself ([`Store::metrics`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StoreMetric {
    /// The metric's full name (`redrive_…`), stable: dashboards and alerts use it.
    pub name: &'static str,
    /// One line saying what it measures.
    pub help: &'static str,
    /// Gauge (a level now) or counter (a total since open).
    pub kind: MetricKind,
    /// Its value.
    pub value: f64,
}

/// The Prometheus kind of a [`StoreMetric`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// A level now.
    Gauge,
    /// A total since the store was opened.
    Counter,
}

/// Whether a store can take writes ([`Store::health`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// It takes writes.
    Ok,
    /// Not now, but it may recover by itself (a database that went away, its
    /// connections killed): requests fail with [`StoreError::Unavailable`] meanwhile.
    Unavailable(String),
    /// Never again without a restart: a failed write poisoned it, or its writer stopped
    /// (closed, or died).
    Failed(String),
    /// Never again with this build: a newer redrive upgraded the shared store's schema
    /// ([`StoreError::Superseded`]); stop this node and run the newer version.
    Superseded(String),
}

/// Messages a write made ready, told to the processes that share a store
/// ([`Notifier::ready`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyNotice {
    /// The queue.
    pub queue: String,
    /// How many became ready (at least 1); a hint, not a count to rely on.
    pub count: u32,
}

/// What a store tells the process using it to wake for ([`Store::notifier`]).
///
/// `due` is when [`Store::tick`] should next run: the earliest due time or lease expiry the
/// store knows of, changed when a write makes it earlier. `ready` carries messages made
/// ready by *another* process sharing the store (PostgreSQL: LISTEN/NOTIFY, a hint that
/// may be late or lost, so long polls also re-check on a timer); a process's own writes
/// are answered to it, and it wakes its own waiters. A store no other process shares
/// (SQLite) never sends on it.
#[derive(Debug, Clone)]
pub struct Notifier {
    due: watch::Receiver<Option<Timestamp>>,
    ready: broadcast::Sender<ReadyNotice>,
    recheck: Option<std::time::Duration>,
}

impl Notifier {
    /// A notifier over a backend's channels, for a store no other process shares.
    pub fn new(
        due: watch::Receiver<Option<Timestamp>>,
        ready: broadcast::Sender<ReadyNotice>,
    ) -> Self {
        Self {
            due,
            ready,
            recheck: None,
        }
    }

    /// For a store other processes share: notices of messages made ready elsewhere may be
    /// late, lost or off (`storage_notify = false`), so a waiter looks again at least every
    /// `every` ([`Notifier::recheck`]).
    pub fn shared(mut self, every: std::time::Duration) -> Self {
        self.recheck = Some(every);
        self
    }

    /// How often a long poll must look at its queue again whatever it was told (`None`: a
    /// store no other process shares, whose every write the process sees).
    pub fn recheck(&self) -> Option<std::time::Duration> {
        self.recheck
    }

    /// When the next tick is due.
    pub fn due(&self) -> watch::Receiver<Option<Timestamp>> {
        self.due.clone()
    }

    /// Messages made ready elsewhere, from now on.
    pub fn ready(&self) -> broadcast::Receiver<ReadyNotice> {
        self.ready.subscribe()
    }
}
