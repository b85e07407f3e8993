//! Bridges (SPEC §11, issue 8): redrive behind a broker whose consumers already exist and
//! are not changed. A bridge takes in what the consumers fail, stores it *before* acking it
//! to the broker (deduplicated, so a crash between the two stores nothing twice), schedules
//! it by its redrive queue's retry policy, puts it back on the broker when it is due, and
//! matches a copy that fails again to the same redrive message ([`Store::returned`]: one
//! more attempt in its history). What the policy gives up on is dead in redrive and, when
//! configured, published to a dead destination on the broker.
//!
//! - [`rabbitmq`]: behind a work queue's dead-letter exchange.
//! - [`redis_streams`]: behind a stream's consumer group (pending entries idle too long).
//!
//! Every bridge is one task with its own connection: when its broker fails it reconnects
//! with backoff (1 s doubling to 30 s) and resumes. A store fault is not the broker's: the
//! republish's consume driver ([`super::consume`]) backs off and continues, and the intake
//! leaves what it could not store to the broker (requeued, or still pending). The bridge is
//! its redrive queue's only consumer (a lease on it is 409 `bridge_queue`).
//! `GET /v1/bridges` and the `redrive_bridge_*` metrics show its state and counters.
//!
//! What a bridge takes in obeys the size limits of a publish ([`IntakeLimits`]): a message
//! over one is not stored as it is, nor dropped. It is stored dead (`permanent_error`, the
//! error naming the limit, code `payload_too_large` or `headers_too_large`) without what is
//! over the limit, the original goes to the bridge's dead destination (RabbitMQ's
//! `dead_exchange` when set, `<stream>:dead`), and only then is it acked to the broker. It
//! is marked ([`H_REFUSED`]) so that a redrive of it is refused rather than republished
//! without its headers or body.
//!
//! [`Store::returned`]: redrive_storage::Store::returned

mod amqp_json;
pub mod rabbitmq;
pub mod redis_streams;

pub use rabbitmq::RabbitSettings;
pub use redis_streams::RedisSettings;

use super::supervisor::{Placement, Service};
use super::Engine;
use redrive_core::{ErrorClass, Failure, Message, NewMessage, State};
use redrive_storage::{Returned, StoreError};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Header of a message stored without what was over a size limit: the limit's code
/// (`payload_too_large`, `headers_too_large`). A bridge never republishes such a message.
pub const H_REFUSED: &str = "redrive-refused";

/// Whether a stored message can be republished as it came: not one stored without what
/// was over the size limits ([`H_REFUSED`]); its redrive is refused instead.
pub(super) fn republishable(m: &Message) -> Result<(), String> {
    match m.headers.get(H_REFUSED) {
        Some(code) => Err(format!(
            "it was stored without what was over the size limits ({code}): it cannot be \
             republished as it came"
        )),
        None => Ok(()),
    }
}

/// The size limits of a publish (`max_payload_bytes`, `max_header_bytes`, measured as the
/// publish measures them: the JSON text of the payload and of the headers), which a
/// bridged message obeys too (SPEC §11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntakeLimits {
    /// `max_payload_bytes`.
    pub max_payload_bytes: usize,
    /// `max_header_bytes`.
    pub max_header_bytes: usize,
}

impl IntakeLimits {
    /// Bytes of `payload` as the publish limit counts them.
    pub(super) fn payload_bytes(payload: &serde_json::Value) -> usize {
        serde_json::to_vec(payload).map_or(usize::MAX, |v| v.len())
    }

    /// Bytes of `headers` as the publish limit counts them.
    pub(super) fn header_bytes(headers: &BTreeMap<String, String>) -> usize {
        serde_json::to_vec(headers).map_or(usize::MAX, |v| v.len())
    }

    /// Whether `headers` fit `max_header_bytes`.
    pub(super) fn headers_fit(&self, headers: &BTreeMap<String, String>) -> bool {
        Self::header_bytes(headers) <= self.max_header_bytes
    }

    /// Make `m` obey the limits: when its payload or headers are over one, it becomes a
    /// dead letter without them (`payload` `null`; the `droppable` headers removed, then
    /// every header if that is not enough), whose permanent failure names the limit, marked
    /// with [`H_REFUSED`]. Answers whether it was refused.
    pub(super) fn refuse_oversize(&self, m: &mut NewMessage, droppable: &[&str]) -> bool {
        let payload = Self::payload_bytes(&m.payload);
        let headers = Self::header_bytes(&m.headers);
        let payload_over = payload > self.max_payload_bytes;
        let headers_over = headers > self.max_header_bytes;
        if !payload_over && !headers_over {
            return false;
        }
        let mut parts = Vec::new();
        if payload_over {
            parts.push(format!(
                "the body is {payload} bytes as a payload, the limit is {} (max_payload_bytes)",
                self.max_payload_bytes
            ));
            m.payload = serde_json::Value::Null;
        }
        if headers_over {
            parts.push(format!(
                "the headers are {headers} bytes of JSON, the limit is {} (max_header_bytes)",
                self.max_header_bytes
            ));
            for h in droppable {
                m.headers.remove(*h);
            }
        }
        let code = if payload_over {
            "payload_too_large"
        } else {
            "headers_too_large"
        };
        m.headers.insert(H_REFUSED.to_owned(), code.to_owned());
        if !self.headers_fit(&m.headers) {
            m.headers = BTreeMap::from([(H_REFUSED.to_owned(), code.to_owned())]);
        }
        let what = match (payload_over, headers_over) {
            (true, true) => "its body and headers",
            (true, false) => "its body",
            _ => "its headers",
        };
        m.failed = Some(Failure {
            class: ErrorClass::Permanent,
            message: Some(format!(
                "over the size limits of a publish: {}; stored without {what}, and never republished",
                parts.join("; ")
            )),
            retry_after_ms: None,
            code: Some(code.to_owned()),
        });
        true
    }
}

/// One bridge's settings, checked (built by `Config::bridge_settings`).
#[derive(Debug, Clone)]
pub enum BridgeSettings {
    /// `[bridges.rabbitmq.NAME]`.
    Rabbit(RabbitSettings),
    /// `[bridges.redis_streams.NAME]`.
    RedisStreams(RedisSettings),
}

impl BridgeSettings {
    /// Its name.
    pub fn name(&self) -> &str {
        match self {
            Self::Rabbit(s) => &s.name,
            Self::RedisStreams(s) => &s.name,
        }
    }

    /// Its redrive queue.
    pub fn queue(&self) -> &str {
        match self {
            Self::Rabbit(s) => &s.queue,
            Self::RedisStreams(s) => &s.queue,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Self::Rabbit(_) => "rabbitmq",
            Self::RedisStreams(_) => "redis_streams",
        }
    }

    fn source(&self) -> String {
        match self {
            Self::Rabbit(s) => s.intake_queue.clone(),
            Self::RedisStreams(s) => format!("{}/{}", s.stream, s.group),
        }
    }
}

/// Counters of a bridge, for `GET /v1/bridges`.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) intake: AtomicU64,
    pub(super) duplicates: AtomicU64,
    pub(super) returned: AtomicU64,
    pub(super) republished: AtomicU64,
    pub(super) republish_refused: AtomicU64,
    pub(super) dead: AtomicU64,
    pub(super) connects: AtomicU64,
}

/// One bridge: settings, state, counters.
#[derive(Debug)]
pub struct Bridge {
    settings: BridgeSettings,
    state: Mutex<(String, Option<String>)>,
    pub(super) counters: Counters,
    /// Intake markers of acked deliveries that could not be forgotten yet (the store
    /// refused): forgotten before the next batch is taken in, in this session or the next.
    unforgotten: Mutex<Vec<String>>,
    /// A test's fault: the next intake batch is stored and then its connection is dropped
    /// instead of acking it (as if redrive had crashed between the two). Set by
    /// [`Bridges::drop_connection_before_next_ack`], cleared when taken.
    fault_before_ack: AtomicBool,
}

/// What `GET /v1/bridges` shows of a bridge.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct BridgeView {
    /// Its name.
    pub name: String,
    /// `rabbitmq` or `redis_streams`.
    pub kind: &'static str,
    /// The redrive queue.
    pub queue: String,
    /// Where its failures come from: the RabbitMQ intake queue, or `stream/group`.
    pub source: String,
    /// `connecting`, `connected` or `reconnecting`.
    pub state: String,
    /// Why it is reconnecting, if it is.
    pub last_error: Option<String>,
    /// New failures stored.
    pub intake: u64,
    /// Failures already stored (delivered again by the broker after a crash): acked only.
    pub duplicates: u64,
    /// Republished copies that came back failed.
    pub returned: u64,
    /// Republishes the broker took (confirmed, or added to the stream).
    pub republished: u64,
    /// Republishes the broker nacked or could not route (tried again).
    pub republish_refused: u64,
    /// Exhausted messages (dead in redrive).
    pub dead: u64,
    /// Connections made.
    pub connects: u64,
}

/// What applying a bridge's return did.
pub(super) enum ReturnApplied {
    /// Applied now or before (a repeat); `Some` when the message is now dead.
    Done(Option<Box<Message>>),
    /// Its redrive message is gone (purged, deleted): store the copy as a new failure.
    Unknown,
}

impl Bridge {
    /// Apply a copy's return ([`Store::returned`]), counting it (`returned`, or
    /// `duplicates` for a repeat).
    ///
    /// [`Store::returned`]: redrive_storage::Store::returned
    pub(super) async fn apply_return(
        &self,
        engine: &Engine,
        returned: Returned,
    ) -> Result<ReturnApplied, StoreError> {
        match engine.returned(vec![returned]).await?.pop() {
            Some(Ok(Some(outcome))) => {
                self.counters.returned.fetch_add(1, Ordering::Relaxed);
                let dead =
                    (outcome.message.state == State::Dead).then(|| Box::new(outcome.message));
                Ok(ReturnApplied::Done(dead))
            }
            Some(Ok(None)) => {
                self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
                Ok(ReturnApplied::Done(None))
            }
            Some(Err(StoreError::NotFound(_))) => Ok(ReturnApplied::Unknown),
            Some(Err(e)) => Err(e),
            None => Err(StoreError::Backend(
                "no answer for a returned message".to_owned(),
            )),
        }
    }

    /// Store new failures in one publish, counting them (`intake`, or `duplicates` for
    /// an idempotent replay); answers, item by item, the messages the policy made dead at
    /// once.
    pub(super) async fn store(
        &self,
        engine: &Engine,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<Option<Message>>, StoreError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let mut dead = Vec::new();
        for p in engine.publish(messages).await? {
            if p.replayed {
                self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
                dead.push(None);
                continue;
            }
            self.counters.intake.fetch_add(1, Ordering::Relaxed);
            dead.push((p.message.state == State::Dead).then_some(p.message));
        }
        Ok(dead)
    }

    /// An intake marker of `prefix` (a message stored, and perhaps not acked to its broker,
    /// with that broker identity) that `taken` does not hold yet, if there is one.
    pub(super) async fn find_marker(
        &self,
        engine: &Engine,
        prefix: &str,
        taken: &[String],
    ) -> Result<Option<String>, StoreError> {
        let held = taken.iter().filter(|k| k.starts_with(prefix)).count();
        let limit = u32::try_from(held + 1).unwrap_or(u32::MAX);
        let keys = engine
            .store()
            .idempotency_keys(
                self.settings.queue().to_owned(),
                prefix.to_owned(),
                limit,
                engine.clock().for_store(),
            )
            .await?;
        Ok(keys
            .into_iter()
            .map(|(k, _)| k)
            .find(|k| !taken.contains(k)))
    }

    /// Forget intake markers whose deliveries were acked to the broker, with any left from
    /// an earlier failure; when the store refuses, they are kept for the next call (and the
    /// error answered).
    pub(super) async fn forget_markers(
        &self,
        engine: &Engine,
        markers: Vec<String>,
    ) -> Result<(), StoreError> {
        let mut all = std::mem::take(
            &mut *self
                .unforgotten
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        all.extend(markers);
        if all.is_empty() {
            return Ok(());
        }
        let forgotten = engine
            .store()
            .forget_idempotency_keys(self.settings.queue().to_owned(), all.clone())
            .await;
        if let Err(e) = forgotten {
            self.unforgotten
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend(all);
            return Err(e);
        }
        Ok(())
    }

    /// Whether a test asked for the next batch's connection to be dropped before its ack
    /// (see [`Bridges::drop_connection_before_next_ack`]); taking it clears it.
    pub(super) fn take_fault_before_ack(&self) -> bool {
        self.fault_before_ack.swap(false, Ordering::SeqCst)
    }

    pub(super) fn set_state(&self, state: &str, error: Option<String>) {
        *self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = (state.to_owned(), error);
    }

    /// The bridge as the API shows it.
    pub fn view(&self) -> BridgeView {
        let (state, last_error) = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let c = &self.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BridgeView {
            name: self.settings.name().to_owned(),
            kind: self.settings.kind(),
            queue: self.settings.queue().to_owned(),
            source: self.settings.source(),
            state,
            last_error,
            intake: n(&c.intake),
            duplicates: n(&c.duplicates),
            returned: n(&c.returned),
            republished: n(&c.republished),
            republish_refused: n(&c.republish_refused),
            dead: n(&c.dead),
            connects: n(&c.connects),
        }
    }
}

/// Every bridge.
#[derive(Debug, Default)]
pub struct Bridges {
    list: Vec<Arc<Bridge>>,
}

impl Bridges {
    /// The bridges of the configuration.
    pub fn new(settings: &[BridgeSettings]) -> Self {
        Self {
            list: settings
                .iter()
                .map(|s| {
                    Arc::new(Bridge {
                        settings: s.clone(),
                        state: Mutex::new(("connecting".to_owned(), None)),
                        counters: Counters::default(),
                        unforgotten: Mutex::new(Vec::new()),
                        fault_before_ack: AtomicBool::new(false),
                    })
                })
                .collect(),
        }
    }

    /// Whether a bridge delivers `queue` (it is then the queue's only consumer).
    pub fn serves(&self, queue: &str) -> Option<&str> {
        self.list
            .iter()
            .find(|b| b.settings.queue() == queue)
            .map(|b| b.settings.name())
    }

    /// For tests of a crash between storing and acking: the bridge `name` stores its next
    /// intake batch, then drops its broker connection instead of acking it, so that the
    /// broker delivers the batch again (`redelivered`), as after a crash. `false` when there
    /// is no such bridge.
    #[doc(hidden)]
    pub fn drop_connection_before_next_ack(&self, name: &str) -> bool {
        match self.list.iter().find(|b| b.settings.name() == name) {
            Some(b) => {
                b.fault_before_ack.store(true, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    /// Every bridge as the API shows it.
    pub fn views(&self) -> Vec<BridgeView> {
        self.list.iter().map(|b| b.view()).collect()
    }

    /// Every bridge's state and counters, for the metrics.
    pub fn gauges(&self) -> Vec<BridgeGauges> {
        self.views()
            .into_iter()
            .map(|v| {
                let events = vec![
                    ("intake", v.intake),
                    ("duplicates", v.duplicates),
                    ("returned", v.returned),
                    ("republished", v.republished),
                    ("republish_refused", v.republish_refused),
                    ("dead", v.dead),
                    ("connects", v.connects),
                ];
                BridgeGauges {
                    connected: v.state == "connected",
                    bridge: v.name,
                    events,
                }
            })
            .collect()
    }
}

/// One bridge's state for the gauges, read at scrape time.
#[derive(Debug, Clone)]
pub struct BridgeGauges {
    /// The bridge's name (from the configuration: a bounded label).
    pub bridge: String,
    /// Connected to its broker now.
    pub connected: bool,
    /// Events since start, by kind.
    pub events: Vec<(&'static str, u64)>,
}

/// One service per bridge.
pub(super) fn services(engine: &Engine) -> Vec<Service> {
    engine
        .bridges()
        .list
        .iter()
        .map(|b| {
            let b = b.clone();
            Service::new(
                format!("bridge:{}", b.settings.name()),
                Placement::EveryNode,
                move |e, stop| run(e, b.clone(), stop),
            )
        })
        .collect()
}

/// Connect, serve, reconnect with backoff, until `stop`.
async fn run(engine: Arc<Engine>, bridge: Arc<Bridge>, mut stop: watch::Receiver<bool>) {
    let mut backoff = BACKOFF_MIN;
    loop {
        if *stop.borrow() {
            return;
        }
        let mut connected = false;
        let session = match &bridge.settings {
            BridgeSettings::Rabbit(s) => {
                rabbitmq::session(&engine, &bridge, s, &mut stop, &mut connected).await
            }
            BridgeSettings::RedisStreams(s) => {
                redis_streams::session(&engine, &bridge, s, &mut stop, &mut connected).await
            }
        };
        match session {
            Ok(()) => return,
            Err(e) => {
                if connected {
                    backoff = BACKOFF_MIN;
                }
                tracing::warn!(bridge = %bridge.settings.name(), error = %e, retry_in_ms = backoff.as_millis() as u64, "bridge lost its broker; reconnecting");
                bridge.set_state("reconnecting", Some(e));
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => return,
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

pub(super) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A broker identity: the first 128 bits of the SHA-256 of `parts` (each prefixed with its
/// length, so that no two lists of parts hash alike), in hex.
pub(super) fn identity(parts: &[&[u8]]) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    h.finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(super) fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub(super) fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

/// A message as a bridge stored it, leased for a republish (the bridges' unit tests).
#[cfg(test)]
fn stored_for_test(payload: serde_json::Value, headers: BTreeMap<String, String>) -> Message {
    Message {
        id: redrive_core::MessageId::new(),
        queue: "q".into(),
        state: State::Leased,
        payload,
        headers,
        key: None,
        idempotency_key: None,
        priority: 0,
        attempts: 1,
        due_at: None,
        lease_expires_at: None,
        created_at: redrive_core::Timestamp::from_millis(0),
        updated_at: redrive_core::Timestamp::from_millis(0),
        finished_at: None,
        dead_reason: None,
        last_error: None,
        history: Vec::new(),
        target_url: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LIMITS: IntakeLimits = IntakeLimits {
        max_payload_bytes: 100,
        max_header_bytes: 120,
    };

    fn message(payload: serde_json::Value, big: usize) -> NewMessage {
        let mut m = NewMessage::new("q", payload);
        m.headers = BTreeMap::from([
            ("where".to_owned(), "x".to_owned()),
            ("big".to_owned(), "h".repeat(big)),
        ]);
        m.failed = Some(Failure::new(ErrorClass::Transient, "rejected"));
        m
    }

    #[test]
    fn within_the_limits_nothing_changes() {
        let mut m = message(json!("small"), 10);
        let before = m.clone();
        assert!(!LIMITS.refuse_oversize(&mut m, &["big"]));
        assert_eq!(m, before);
    }

    #[test]
    fn headers_over_the_limit_are_dropped_and_the_message_is_a_permanent_failure() {
        let mut m = message(json!("small"), 200);
        assert!(LIMITS.refuse_oversize(&mut m, &["big"]));
        assert_eq!(m.payload, json!("small"), "the payload fitted: kept");
        assert_eq!(m.headers.get("where").map(String::as_str), Some("x"));
        assert!(!m.headers.contains_key("big"));
        assert_eq!(
            m.headers.get(H_REFUSED).map(String::as_str),
            Some("headers_too_large")
        );
        let f = m.failed.expect("failed");
        assert_eq!(f.class, ErrorClass::Permanent);
        assert_eq!(f.code.as_deref(), Some("headers_too_large"));
        let text = f.message.expect("message");
        assert!(
            text.contains("max_header_bytes") && text.contains("the limit is 120"),
            "{text}"
        );
    }

    #[test]
    fn a_payload_over_the_limit_is_dropped() {
        let mut m = message(json!("p".repeat(200)), 0);
        assert!(LIMITS.refuse_oversize(&mut m, &[]));
        assert_eq!(m.payload, serde_json::Value::Null);
        assert_eq!(
            m.headers.get(H_REFUSED).map(String::as_str),
            Some("payload_too_large")
        );
        let text = m.failed.and_then(|f| f.message).expect("message");
        assert!(text.contains("max_payload_bytes"), "{text}");
    }

    #[test]
    fn identities_differ_when_any_part_does() {
        let a = identity(&[b"x", b"yz"]);
        assert_eq!(a.len(), 32);
        assert_eq!(a, identity(&[b"x", b"yz"]));
        assert_ne!(a, identity(&[b"xy", b"z"]));
        assert_ne!(a, identity(&[b"x", b"yz", b""]));
    }
}
