//! The bodies of API v1 as plain serde types, mirroring the server's
//! (`redrive-server/src/api/*.rs`) field for field, so a client never walks untyped JSON.
//!
//! Answers reuse `redrive-core`'s [`Message`], [`RetryPolicy`], states and classes: they are
//! the very types the server serializes, so an answer decoded here and encoded again is
//! the server's JSON (the CLI prints it that way). Answer types do not deny unknown fields:
//! a newer server may add some. Durations are sent as written (`"30s"`); the server
//! validates them and names the field at fault.

use redrive_core::{ErrorClass, Message, MessageId, OnDead, Ordering, RetryPolicy, State};
use redrive_core::{LastError, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One message to publish (`POST /v1/queues/{queue}/messages`). `delay` and `deliver_at`
/// exclude each other.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Publish {
    /// Any JSON value (`null` included).
    pub payload: serde_json::Value,
    /// String headers.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Ordering / partition key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Idempotency key: a replay within the window answers the original message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// 0–9, higher first (server default 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    /// Deliver after this delay, e.g. `"30s"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<String>,
    /// Deliver at this RFC 3339 time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<String>,
    /// A failure seen elsewhere: recorded as attempt `attempts` (default 1) and scheduled by
    /// the policy, at `deliver_at` / after `delay` when one is given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<FailedReport>,
    /// Push delivery: this message's own endpoint (queues with `allow_message_targets`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_url: Option<String>,
}

impl Publish {
    /// A message with this payload and nothing else.
    pub fn new(payload: serde_json::Value) -> Self {
        Self {
            payload,
            ..Self::default()
        }
    }
}

/// A failure seen elsewhere, reported at publish (`failed`): a nack's error plus the
/// attempts already made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailedReport {
    /// `transient`, `rate_limited` or `permanent`.
    pub class: ErrorClass,
    /// What went wrong.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// For `rate_limited`: earliest retry, e.g. `"10s"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<String>,
    /// Attempts already made elsewhere, this failure included (1 to 1,000,000; server
    /// default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
}

impl FailedReport {
    /// A failure of this class with this message, the first attempt.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        NackError::new(class, message).into()
    }
}

impl From<NackError> for FailedReport {
    fn from(e: NackError) -> Self {
        Self {
            class: e.class,
            message: e.message,
            retry_after: e.retry_after,
            attempts: None,
        }
    }
}

/// The body of a batch publish.
#[derive(Debug, Serialize)]
pub(crate) struct PublishBatchBody<'a> {
    pub messages: &'a [Publish],
}

/// The answer to a publish: the message, and whether it was an idempotent replay
/// (200, the original message) rather than a new one (201).
#[derive(Debug, Clone, PartialEq)]
pub struct Published<T> {
    /// The message (or, for a batch, the messages in order).
    pub message: T,
    /// True when the server answered 200: every message already existed under its
    /// idempotency key.
    pub replayed: bool,
}

/// The answer body of a batch publish.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublishedBatch {
    /// The messages, in the order published.
    pub messages: Vec<Message>,
    /// Per item, in the same order: whether it was an idempotent replay (the original
    /// message) rather than a new one. Empty from a server before it said so.
    #[serde(default)]
    pub replayed: Vec<bool>,
}

/// A lease request (`POST /v1/queues/{queue}/leases`). Every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LeaseRequest {
    /// At most this many messages (server default 1, at most its `max_batch`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    /// Lease length, e.g. `"30s"` (server default: the queue's `lease`, else 30s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// Long-poll up to this long when nothing is ready, e.g. `"5s"` (default 0s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait: Option<String>,
}

/// A leased message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeasedMessage {
    /// Message id.
    pub id: MessageId,
    /// The lease token to present to ack / nack / release / extend.
    pub lease: String,
    /// This delivery's attempt number (1 = first).
    pub attempt: u32,
    /// The attempt number of the last try: `attempt == max_attempts` means a failure of
    /// this attempt that counts makes the message dead (see docs/CONSUMERS.md).
    pub max_attempts: u32,
    /// The payload.
    pub payload: serde_json::Value,
    /// Headers.
    pub headers: BTreeMap<String, String>,
    /// Ordering key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Queue.
    pub queue: String,
    /// Priority.
    pub priority: u8,
    /// Publish time.
    pub created_at: Timestamp,
    /// When the lease expires.
    pub lease_expires_at: Timestamp,
    /// The previous attempt's error, on a retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<LastError>,
}

/// The answer to a lease request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseResponse {
    /// Possibly empty.
    pub messages: Vec<LeasedMessage>,
}

/// The failure a nack reports (and a publish's `failed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NackError {
    /// `transient`, `rate_limited` or `permanent`.
    pub class: ErrorClass,
    /// What went wrong.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// For `rate_limited`: earliest retry, e.g. `"10s"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<String>,
}

impl NackError {
    /// A failure of this class with this message.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: Some(message.into()),
            retry_after: None,
        }
    }
}

/// The body of an ack.
#[derive(Debug, Serialize)]
pub(crate) struct AckBody<'a> {
    pub lease: &'a str,
}

/// The body of a nack.
#[derive(Debug, Serialize)]
pub(crate) struct NackBody<'a> {
    pub lease: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'a NackError>,
}

/// The body of a release.
#[derive(Debug, Serialize)]
pub(crate) struct ReleaseBody<'a> {
    pub lease: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<&'a str>,
}

/// The body of an extension.
#[derive(Debug, Serialize)]
pub(crate) struct ExtendBody<'a> {
    pub lease: &'a str,
    pub by: &'a str,
}

/// The answer to an extension.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extended {
    /// Message id.
    pub id: MessageId,
    /// The new lease expiry.
    pub lease_expires_at: Timestamp,
}

/// One item of a batch ack or nack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchItem {
    /// Message id (sent as given; the server answers a bad one on that item alone).
    pub id: String,
    /// Lease token.
    pub lease: String,
    /// Nack only: the failure (server default transient).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<NackError>,
}

impl BatchItem {
    /// An item acking (or nacking as transient) the message `id` leased under `lease`.
    pub fn new(id: impl Into<String>, lease: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            lease: lease.into(),
            error: None,
        }
    }
}

/// The body of a batch ack or nack.
#[derive(Debug, Serialize)]
pub(crate) struct BatchBody<'a> {
    pub items: &'a [BatchItem],
}

/// The code and message of an error, as the server sends them in `{"error": …}` and on
/// the failed items of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Stable snake_case code.
    pub code: String,
    /// What went wrong, for people.
    pub message: String,
    /// With `lease_settled` only: how the lease was settled (`acked`, `nacked`,
    /// `released`, `killed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled: Option<String>,
}

/// One item's answer in a batch ack or nack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchResult {
    /// Message id as given.
    pub id: String,
    /// The HTTP status this item would have had alone (200 on success).
    pub status: u16,
    /// The message after the transition, on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    /// The error, on failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

impl BatchResult {
    /// Whether this item succeeded.
    pub fn is_ok(&self) -> bool {
        self.status == 200
    }
}

/// The answer to a batch ack or nack: one result per item, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchResponse {
    /// One per item.
    pub items: Vec<BatchResult>,
}

/// The body of a kill.
#[derive(Debug, Serialize)]
pub(crate) struct KillBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'a str>,
}

/// The answer to a delete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deleted {
    /// Always true.
    pub deleted: bool,
    /// The message as it was.
    pub message: Message,
}

/// Filters of a search and an export (`GET /v1/messages`, `/v1/messages/export`);
/// unset ones are not sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this state.
    pub state: Option<State>,
    /// Only this ordering key.
    pub key: Option<String>,
    /// Only messages whose last error has this class.
    pub error_class: Option<ErrorClass>,
    /// Text in the payload or the error message.
    pub q: Option<String>,
    /// Created at or after.
    pub since: Option<Timestamp>,
    /// Created before.
    pub until: Option<Timestamp>,
    /// Finished (became done or dead) at or after.
    pub finished_since: Option<Timestamp>,
    /// Finished before.
    pub finished_until: Option<Timestamp>,
    /// Only this failure group (a fingerprint from [`crate::Client::failure_groups`]).
    pub fingerprint: Option<String>,
}

impl Filter {
    /// The query pairs of the set filters.
    pub fn query(&self) -> Vec<(&'static str, String)> {
        let mut q = Vec::new();
        let mut put = |k: &'static str, v: Option<String>| {
            if let Some(v) = v {
                q.push((k, v));
            }
        };
        put("queue", self.queue.clone());
        put("state", self.state.map(|s| s.as_str().to_owned()));
        put("key", self.key.clone());
        put(
            "error_class",
            self.error_class.map(|c| c.as_str().to_owned()),
        );
        put("q", self.q.clone());
        put("since", self.since.map(|t| t.to_rfc3339()));
        put("until", self.until.map(|t| t.to_rfc3339()));
        put(
            "finished_since",
            self.finished_since.map(|t| t.to_rfc3339()),
        );
        put(
            "finished_until",
            self.finished_until.map(|t| t.to_rfc3339()),
        );
        put("fingerprint", self.fingerprint.clone());
        q
    }
}

/// One failure group (`GET /v1/failure-groups`): dead letters with the same fingerprint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureGroup {
    /// `class: normalised message` (or `killed`): pass it as a filter's `fingerprint`.
    pub fingerprint: String,
    /// Dead letters in the group.
    pub count: u64,
    /// Their queues.
    pub queues: Vec<String>,
    /// Why they are dead, each once.
    pub dead_reasons: Vec<String>,
    /// One of their last error messages, as it was.
    #[serde(default)]
    pub example: Option<String>,
    /// When the first of them became dead.
    #[serde(default)]
    pub first_at: Option<Timestamp>,
    /// When the last of them did.
    #[serde(default)]
    pub last_at: Option<Timestamp>,
    /// A few of their ids, newest first.
    pub sample_ids: Vec<String>,
}

/// `GET /v1/failure-groups`: largest group first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureGroups {
    /// The groups.
    pub groups: Vec<FailureGroup>,
    /// Dead letters read.
    pub scanned: u64,
    /// More dead letters than one answer reads (100,000): the counts are of the newest.
    pub truncated: bool,
}

/// One page of a search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchPage {
    /// The messages (without `history`).
    pub messages: Vec<Message>,
    /// Pass to the next call for the next page; `None` on the last page.
    pub next_cursor: Option<String>,
}

/// The format of an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// Comma-separated, a header line first.
    Csv,
    /// One JSON message per line.
    Jsonl,
}

impl ExportFormat {
    /// The `format` query value.
    pub fn as_str(self) -> &'static str {
        match self {
            ExportFormat::Csv => "csv",
            ExportFormat::Jsonl => "jsonl",
        }
    }

    /// `csv` or `jsonl`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "csv" => Some(ExportFormat::Csv),
            "jsonl" => Some(ExportFormat::Jsonl),
            _ => None,
        }
    }
}

/// One queue (`GET /v1/queues/{queue}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueView {
    /// Name.
    pub queue: String,
    /// Messages per state (`scheduled`, `ready`, `leased`, `done`, `dead`).
    pub counts: BTreeMap<String, u64>,
    /// Now minus the due time of the oldest ready message, seconds.
    pub oldest_ready_age_seconds: Option<f64>,
    /// The effective retry policy.
    pub policy: RetryPolicy,
    /// The policy in words.
    pub policy_summary: String,
    /// `none` or `key`.
    pub ordering: Ordering,
    /// `skip` or `block`.
    pub on_dead: OnDead,
    /// Default lease, if configured.
    pub lease: Option<String>,
    /// `pull` or `push` (absent from servers before push delivery).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<String>,
    /// For a push queue: its endpoint, `scheme://host:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

impl QueueView {
    /// The number of messages in `state`, if the server reported it.
    pub fn count(&self, state: State) -> Option<u64> {
        self.counts.get(state.as_str()).copied()
    }
}

/// Every queue (`GET /v1/queues`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueList {
    /// Queues with messages, and configured queues, by name.
    pub queues: Vec<QueueView>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_publish_sends_only_what_was_set() {
        let p = Publish::new(json!({"id": 1}));
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            json!({"payload": {"id": 1}})
        );
        let p = Publish {
            target_url: None,
            payload: json!(null),
            headers: [("trace".to_owned(), "abc".to_owned())].into(),
            key: Some("k".into()),
            idempotency_key: Some("i".into()),
            priority: Some(5),
            delay: Some("30s".into()),
            deliver_at: None,
            failed: Some(FailedReport::new(ErrorClass::RateLimited, "slow down")),
        };
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            json!({"payload": null, "headers": {"trace": "abc"}, "key": "k", "idempotency_key": "i",
                   "priority": 5, "delay": "30s", "failed": {"class": "rate_limited", "message": "slow down"}})
        );
        let mut imported = FailedReport::new(ErrorClass::Transient, "row 7");
        imported.attempts = Some(4);
        assert_eq!(
            serde_json::to_value(&imported).unwrap(),
            json!({"class": "transient", "message": "row 7", "attempts": 4})
        );
    }

    #[test]
    fn batch_items_carry_their_error_only_when_set() {
        let mut nack = BatchItem::new("01J", "t2");
        nack.error = Some(NackError::new(ErrorClass::Transient, "bench"));
        let items = [BatchItem::new("01H", "t1"), nack];
        assert_eq!(
            serde_json::to_string(&BatchBody { items: &items }).unwrap(),
            r#"{"items":[{"id":"01H","lease":"t1"},{"id":"01J","lease":"t2","error":{"class":"transient","message":"bench"}}]}"#
        );
    }

    #[test]
    fn filters_become_the_query_in_the_servers_spelling() {
        let f = Filter {
            queue: Some("orders".into()),
            state: Some(State::Dead),
            error_class: Some(ErrorClass::RateLimited),
            since: Some(Timestamp::parse("2026-01-31T12:00:00Z").unwrap()),
            finished_since: Some(Timestamp::parse("2026-01-31T13:00:00Z").unwrap()),
            fingerprint: Some("transient: HTTP 503 from <n>".into()),
            ..Filter::default()
        };
        assert_eq!(
            f.query(),
            vec![
                ("queue", "orders".to_owned()),
                ("state", "dead".to_owned()),
                ("error_class", "rate_limited".to_owned()),
                ("since", "2026-01-31T12:00:00.000Z".to_owned()),
                ("finished_since", "2026-01-31T13:00:00.000Z".to_owned()),
                ("fingerprint", "transient: HTTP 503 from <n>".to_owned()),
            ]
        );
    }

    #[test]
    fn a_batch_answer_decodes_both_outcomes() {
        let r: BatchResponse = serde_json::from_str(
            r#"{"items":[{"id":"c","status":409,"error":{"code":"lease_expired","message":"x"}}]}"#,
        )
        .unwrap();
        assert!(!r.items[0].is_ok());
        assert_eq!(r.items[0].error.as_ref().unwrap().code, "lease_expired");
    }
}

/// The body of `POST /v1/tasks`: a bulk action over what `filter` selects.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TaskRequest {
    /// `redrive`, `kill` or `delete`.
    pub action: String,
    /// The selection: the filters of a search as query pairs (`queue`, `state`, …), plus
    /// `fingerprint` for a failure group.
    pub filter: BTreeMap<String, String>,
    /// `"100/s"`, `"600/m"`; none: as fast as the store goes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// Only count.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// A kill's reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A redrive's stop rule (share of redriven messages failing again, 0–1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_failure_ratio: Option<f64>,
}

/// A bulk task (`/v1/tasks/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// Its id.
    pub id: String,
    /// redrive | kill | delete.
    pub action: String,
    /// running | paused | done | cancelled | stopped.
    pub state: String,
    /// The filter as given.
    pub filter: serde_json::Value,
    /// The rate as given.
    #[serde(default)]
    pub rate: Option<String>,
    /// Selected when created.
    pub total: u64,
    /// Acted on: redriven, killed or deleted.
    pub done: u64,
    /// Refused by the store when the task reached them (no longer in a state the action
    /// applies to, or gone); not the redriven messages that failed again (the stop rule's
    /// count, in `stop_reason`).
    pub failed: u64,
    /// Who created it.
    pub created_by: String,
    /// When.
    pub created_at: Timestamp,
    /// Last change.
    pub updated_at: Timestamp,
    /// Why it stopped or was cancelled, or the last refusal.
    #[serde(default)]
    pub stop_reason: Option<String>,
    /// A redrive's stop rule: it stops when more than this share of the last 100 redriven
    /// messages whose outcome is known failed again (absent for a kill or a delete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_failure_ratio: Option<f64>,
}

impl Task {
    /// Whether it can never run again.
    pub fn is_final(&self) -> bool {
        matches!(self.state.as_str(), "done" | "cancelled" | "stopped")
    }
}

/// What a dry run counted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DryRun {
    /// The action that would run.
    pub action: String,
    /// The filter as given.
    pub filter: serde_json::Value,
    /// Messages it selects now.
    pub total: u64,
}

/// The answer of `POST /v1/tasks`.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskCreated {
    /// A dry run's count.
    DryRun(DryRun),
    /// The new task.
    Task(Task),
}

/// `GET /v1/tasks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskList {
    /// Newest first.
    pub tasks: Vec<Task>,
}

/// One entry of the audit log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Its place in the log.
    pub seq: u64,
    /// When.
    pub at: Timestamp,
    /// Who.
    pub actor: String,
    /// What.
    pub action: String,
    /// On what.
    #[serde(default)]
    pub target: Option<String>,
    /// A task's selection.
    #[serde(default)]
    pub filter: Option<serde_json::Value>,
    /// How many messages.
    pub count: u64,
    /// More.
    #[serde(default)]
    pub detail: Option<String>,
    /// The node that did it (`[cluster] node`); `None` in entries from before redrive
    /// recorded it.
    #[serde(default)]
    pub node: Option<String>,
}

/// `GET /v1/audit`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditPage {
    /// Newest first.
    pub entries: Vec<AuditEntry>,
    /// For older entries.
    pub next_cursor: Option<String>,
}
