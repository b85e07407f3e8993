//! The RabbitMQ bridge (SPEC §11): redrive behind a RabbitMQ work queue whose
//! consumers reject (`requeue = false`) what they cannot process.
//!
//! The consumers' queue dead-letters into an exchange (`x-dead-letter-exchange`); the
//! bridge's *intake queue* is bound to it. For every message that arrives there the bridge:
//!
//! 1. **stores it first, acks it second**: a new failure becomes a redrive message of the
//!    bridge's queue (`NewMessage::failed`: the rejection is attempt 1, scheduled by the
//!    queue's retry policy), body and AMQP properties kept readable and exact:
//!    - the body is the payload: a JSON value when `content_type` is JSON
//!      (`application/json`, `…+json`) and the body parses, with its exact text kept in
//!      `amqp-body-text` when redrive's JSON of the value would differ (whitespace, key
//!      order, `1.0`, `\u00e9` …); else the body as a string, or base64 when it is not
//!      UTF-8 (`amqp-body`: `json`, `utf8` or `base64`);
//!    - the properties are plain JSON (`amqp-properties`, and `amqp-headers` with
//!      `amqp-header-types` for the types JSON does not tell: see `engine/bridge/amqp_json.rs`);
//!    - its size obeys the publish limits ([`super::IntakeLimits`]);
//! 2. a copy the bridge republished earlier carries `x-redrive-id` and
//!    `x-redrive-attempt`: it is matched to its redrive message ([`Store::returned`]: one
//!    more failed attempt in the same history, applied once).
//!
//! **Two different messages are never taken for one.** A delivery RabbitMQ marks
//! `redelivered = false` has never been delivered before, so the bridge cannot have stored
//! it: it is a new message, whatever its body or `message_id`. Every message the bridge
//! stores gets an *intake marker* in the same write: its idempotency key
//! `amqp:NAME:<broker identity>:<unique>`, where the broker identity hashes what RabbitMQ
//! delivers again unchanged (body, properties with `x-death`, exchange, routing key). Once
//! the batch is acked to RabbitMQ the markers are forgotten
//! ([`Store::forget_idempotency_keys`]). Only a `redelivered = true` delivery (a crash or
//! a lost connection between storing and acking) looks for a marker of its identity
//! ([`Store::idempotency_keys`]); one marker matches one redelivery, which is then acked
//! without being stored again. When in doubt it stores: a redelivery whose marker is gone
//! (its ack was sent, but RabbitMQ did not get it) is stored a second time, never lost.
//!
//! When a message is due, the bridge leases it (it is the queue's only consumer) and
//! republishes it to its original exchange and routing key (from `x-death`) with
//! publisher confirms, body and properties rebuilt exactly (an operator's edited payload is
//! sent as its new JSON), adding `x-retry-count`, `x-redrive-id`, `x-redrive-attempt`,
//! `x-first-failure-time` and `x-last-error`. Only a broker ack makes the attempt
//! delivered (`republished` in its history; the message is `done` until it comes back); a
//! nack, an unroutable return or a lost channel hands the lease back uncharged
//! ([`Store::release`]) and the publish is tried again. A message the policy kills is dead
//! in redrive (searchable, redrivable) and, with `dead_exchange`, published there too. The
//! republish is a [`Deliverer`] of the consume driver ([`crate::engine::consume`]): a store
//! fault while leasing or settling is backed off there and never reconnects the broker; the
//! message whose ack was lost is republished again after its lease.
//!
//! The error of a rejection is `dead-lettered by RabbitMQ (<reason>)`: a reject carries no
//! reason, and the `x-last-error` redrive itself put on a copy is not appended again, so
//! the text (and the failure group's fingerprint) is the same at every attempt.
//!
//! Connection loss: the bridge reconnects (see the module above), declares again, and
//! resumes; unacked intake deliveries are redelivered by RabbitMQ and recognised by their
//! markers.
//!
//! [`Store::returned`]: redrive_storage::Store::returned
//! [`Store::release`]: redrive_storage::Store::release
//! [`Store::idempotency_keys`]: redrive_storage::Store::idempotency_keys
//! [`Store::forget_idempotency_keys`]: redrive_storage::Store::forget_idempotency_keys

use super::amqp_json::{properties_from_json, properties_to_json};
use super::{base64_decode, base64_encode, err, identity, Bridge, IntakeLimits, ReturnApplied};
use crate::engine::consume::{
    self, CutShort, Deliverer, DelivererFault, LeaseAsk, Settlement, Settler,
};
use crate::engine::{Engine, Event};
use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::publisher_confirm::{Confirmation, PublisherConfirm};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use redrive_core::{ErrorClass, Failure, Message, MessageId, NewMessage};
use redrive_storage::{Ack, LeaseRef, Leased, Release, Returned, StoreError};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The most earlier attempts an arriving `x-retry-count` may claim.
const MAX_ATTEMPTS_BEFORE: u32 = 10_000;
/// Messages leased, published, then confirmed together.
const REPUBLISH_BATCH: u32 = 64;
/// A lease of a republish lasts this long (the publish and its confirm).
const REPUBLISH_LEASE_MS: u64 = 60_000;
/// How long a republish waits for the broker's confirm before it is tried again.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);
/// After a nacked or unroutable republish, the message is due again this much later.
const REPUBLISH_RETRY_MS: u64 = 1_000;

/// Stored headers of a bridged message.
const H_EXCHANGE: &str = "amqp-exchange";
const H_ROUTING_KEY: &str = "amqp-routing-key";
/// Every property but the headers, plain JSON.
const H_PROPERTIES: &str = "amqp-properties";
/// The AMQP header table, plain JSON.
const H_HEADERS: &str = "amqp-headers";
/// The AMQP types of the header values that plain JSON does not tell.
const H_HEADER_TYPES: &str = "amqp-header-types";
/// How the payload holds the body: `json`, `utf8` (a string) or `base64`.
const H_BODY: &str = "amqp-body";
/// A JSON body's exact text, when the payload's JSON would write it differently.
const H_BODY_TEXT: &str = "amqp-body-text";

/// Headers RabbitMQ adds when it dead-letters a message: not the application's, not
/// republished.
const DEATH_HEADERS: [&str; 7] = [
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
];

/// One RabbitMQ bridge's settings, checked (built by `Config::bridge_settings`).
#[derive(Debug, Clone)]
pub struct RabbitSettings {
    /// The bridge's name (`[bridges.rabbitmq.NAME]`).
    pub name: String,
    /// `amqp://user:pass@host:port/vhost`.
    pub url: String,
    /// The queue the bridge consumes: bound to the consumers' dead-letter exchange.
    pub intake_queue: String,
    /// The redrive queue that holds the messages (its retry policy applies).
    pub queue: String,
    /// Exhausted messages are also published here, when set.
    pub dead_exchange: Option<String>,
    /// Declare the intake queue (durable), the dead-letter exchange when it does not exist
    /// (fanout, durable), and the binding between them.
    pub declare: bool,
    /// The consumers' dead-letter exchange (with `declare`).
    pub dead_letter_exchange: Option<String>,
    /// The binding key of the intake queue (with `declare`).
    pub binding_key: String,
    /// Unacked intake deliveries at most.
    pub prefetch: u16,
    /// The size limits a stored message obeys (those of a publish).
    pub limits: IntakeLimits,
}

impl RabbitSettings {
    /// The beginning of the intake markers of deliveries with broker identity `identity`.
    fn marker_prefix(&self, identity: &str) -> String {
        format!("amqp:{}:{identity}:", self.name)
    }
}

/// One connection's life: declare, consume the intake queue, republish what is due.
/// `Ok` only when stopped.
pub(super) async fn session(
    engine: &Arc<Engine>,
    bridge: &Arc<Bridge>,
    s: &RabbitSettings,
    stop: &mut watch::Receiver<bool>,
    connected: &mut bool,
) -> Result<(), String> {
    let conn = Connection::connect(&s.url, ConnectionProperties::default())
        .await
        .map_err(err)?;
    let result = serve(engine, bridge, s, &conn, stop, connected).await;
    let _ = conn.close(200, "redrive bridge stopping").await;
    result
}

async fn serve(
    engine: &Arc<Engine>,
    bridge: &Arc<Bridge>,
    s: &RabbitSettings,
    conn: &Connection,
    stop: &mut watch::Receiver<bool>,
    connected: &mut bool,
) -> Result<(), String> {
    let intake = conn.create_channel().await.map_err(err)?;
    let publish = conn.create_channel().await.map_err(err)?;
    publish
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(err)?;
    if s.declare {
        declare(s, conn, &intake).await?;
    }
    intake
        .basic_qos(s.prefetch, BasicQosOptions::default())
        .await
        .map_err(err)?;
    let consumer = intake
        .basic_consume(
            &s.intake_queue,
            &format!("redrive-bridge-{}", s.name),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(err)?;
    *connected = true;
    bridge.counters.connects.fetch_add(1, Ordering::Relaxed);
    bridge.set_state("connected", None);
    tracing::info!(bridge = %s.name, intake_queue = %s.intake_queue, queue = %s.queue, "bridge connected");
    // What has arrived is stored together: one store write (one fsync) for a batch.
    let mut batches = consumer.ready_chunks(usize::from(s.prefetch).max(1));
    let republisher = Republisher {
        engine,
        bridge,
        publish: &publish,
    };
    let consumer_name = format!("bridge {}", s.name);
    let republish = consume::run(engine, &s.queue, &consumer_name, republisher, stop.clone());
    tokio::pin!(republish);
    loop {
        // A batch, once taken, is handled to its end (stored, acked, its markers
        // forgotten): stopping or a failed republish ends the session only between batches,
        // so no marker outlives its ack.
        let batch = tokio::select! {
            b = batches.next() => b,
            r = &mut republish => return r.map_err(|f| f.error),
            _ = stop.changed() => return Ok(()),
        };
        let Some(batch) = batch else { break };
        let deliveries: Vec<Delivery> = batch.into_iter().collect::<Result<_, _>>().map_err(err)?;
        // Markers left from an earlier batch go first: a redelivery must not match them.
        let taken = match bridge.forget_markers(engine, Vec::new()).await {
            Ok(()) => take_in(engine, bridge, s, &publish, &deliveries).await,
            Err(e) => Err(IntakeError::Store(e)),
        };
        match taken {
            Ok(markers) => {
                if bridge.take_fault_before_ack() {
                    return Err("test fault: connection dropped between storing and acking".into());
                }
                let mut acked = Ok(());
                for d in &deliveries {
                    if let Err(e) = d.acker.ack(BasicAckOptions::default()).await {
                        acked = Err(err(e));
                        break;
                    }
                }
                // Forgotten even when an ack failed: RabbitMQ may have taken the acks before
                // it, and a marker left for an acked delivery could later match a different
                // message's redelivery (a loss); a forgotten one at worst stores a redelivery
                // twice. When in doubt, store.
                if let Err(e) = bridge.forget_markers(engine, markers).await {
                    tracing::warn!(bridge = %s.name, error = %e, "could not forget intake markers; trying again before the next batch");
                }
                acked?;
            }
            Err(e) => {
                // Not stored: give them back to RabbitMQ, which delivers them again
                // (what was stored is then recognised: returns apply once, new messages
                // have their marker). A store fault keeps the connection, as in the Redis
                // bridge, and is counted like the consume driver's.
                if let IntakeError::Store(_) = e {
                    engine.observe(Event::ConsumeStoreFault {
                        queue: &s.queue,
                        operation: "intake",
                    });
                }
                tracing::error!(bridge = %s.name, error = %e, "could not store intake messages; requeued");
                for d in &deliveries {
                    d.acker
                        .nack(BasicNackOptions {
                            requeue: true,
                            ..BasicNackOptions::default()
                        })
                        .await
                        .map_err(err)?;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    Err("the intake consumer ended".to_owned())
}

/// Declare the intake queue, the dead-letter exchange when it is missing, and the binding.
async fn declare(s: &RabbitSettings, conn: &Connection, intake: &Channel) -> Result<(), String> {
    intake
        .queue_declare(
            &s.intake_queue,
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(err)?;
    let Some(dlx) = &s.dead_letter_exchange else {
        return Ok(());
    };
    // The dead-letter exchange: used as it is when it exists (whatever its type), declared
    // (fanout, durable) when it does not. A passive declare of a missing exchange closes
    // its channel, hence a throwaway one.
    let probe = conn.create_channel().await.map_err(err)?;
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..ExchangeDeclareOptions::default()
    };
    let exists = probe
        .exchange_declare(dlx, ExchangeKind::Fanout, passive, FieldTable::default())
        .await
        .is_ok();
    if exists {
        let _ = probe.close(200, "probed").await;
    } else {
        intake
            .exchange_declare(
                dlx,
                ExchangeKind::Fanout,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(err)?;
    }
    intake
        .queue_bind(
            &s.intake_queue,
            dlx,
            &s.binding_key,
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(err)
}

/// A header of `table` as text, whatever string or number type it came as.
fn header_text(table: &FieldTable, key: &str) -> Option<String> {
    match table.inner().get(key)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        AMQPValue::LongLongInt(n) => Some(n.to_string()),
        AMQPValue::LongInt(n) => Some(n.to_string()),
        AMQPValue::LongUInt(n) => Some(n.to_string()),
        AMQPValue::ShortInt(n) => Some(n.to_string()),
        AMQPValue::ShortUInt(n) => Some(n.to_string()),
        AMQPValue::ShortShortInt(n) => Some(n.to_string()),
        AMQPValue::ShortShortUInt(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The first (most recent) `x-death` entry: where the message was going and why it died
/// there.
struct Death {
    exchange: String,
    routing_key: String,
    reason: String,
}

fn death(props: &BasicProperties) -> Option<Death> {
    let headers = props.headers().as_ref()?;
    let entries = headers.inner().get("x-death")?.as_array()?;
    let first = entries.as_slice().first()?.as_field_table()?;
    let routing_key = first
        .inner()
        .get("routing-keys")
        .and_then(AMQPValue::as_array)
        .and_then(|a| a.as_slice().first().cloned())
        .and_then(|v| match v {
            AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
            AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
            _ => None,
        })
        .unwrap_or_default();
    Some(Death {
        exchange: header_text(first, "exchange").unwrap_or_default(),
        routing_key,
        reason: header_text(first, "reason").unwrap_or_else(|| "rejected".to_owned()),
    })
}

/// The failure an intake delivery reports: `dead-lettered by RabbitMQ (<reason>)`, and an
/// `x-last-error` some other system set before the message first reached redrive. A copy
/// redrive republished carries the `x-last-error` redrive itself set: not appended again,
/// so the text is the same at every attempt (issue 15).
fn rejection(death: Option<&Death>, headers: &FieldTable) -> Failure {
    let reason = death.map_or("rejected", |d| d.reason.as_str());
    let mut message = format!("dead-lettered by RabbitMQ ({reason})");
    if !headers.contains_key("x-redrive-id") {
        if let Some(e) = header_text(headers, "x-last-error") {
            message = format!("{message}: {e}");
        }
    }
    Failure {
        class: ErrorClass::Transient,
        message: Some(message),
        retry_after_ms: None,
        code: Some(format!("amqp_{reason}")),
    }
}

/// Store intake deliveries (or match each copy to the message it is a copy of, or a
/// redelivery to its intake marker). New failures are stored in one publish. Answers the
/// intake markers to forget once the deliveries are acked.
async fn take_in(
    engine: &Arc<Engine>,
    bridge: &Arc<Bridge>,
    s: &RabbitSettings,
    publish: &Channel,
    deliveries: &[Delivery],
) -> Result<Vec<String>, IntakeError> {
    let mut news = Vec::new();
    // For each new message, the delivery it came from when it was refused (over a limit).
    let mut refused = Vec::new();
    let mut markers: Vec<String> = Vec::new();
    for d in deliveries {
        let intake = intake_of(s, d).map_err(IntakeError::Delivery)?;
        if let Some(returned) = intake.returned {
            match bridge.apply_return(engine, returned).await? {
                ReturnApplied::Done(dead) => {
                    if let Some(m) = dead {
                        bury(bridge, s, publish, &m).await;
                    }
                    continue;
                }
                ReturnApplied::Unknown => {}
            }
        }
        let prefix = s.marker_prefix(&intake.identity);
        if d.redelivered {
            if let Some(marker) = bridge.find_marker(engine, &prefix, &markers).await? {
                // Stored before a crash or a lost connection kept it from being acked.
                bridge.counters.duplicates.fetch_add(1, Ordering::Relaxed);
                markers.push(marker);
                continue;
            }
        }
        let marker = format!("{prefix}{}", MessageId::new());
        let mut message = intake.message;
        message.idempotency_key = Some(marker.clone());
        markers.push(marker);
        refused.push(intake.refused.then_some(d));
        news.push(message);
    }
    let stored = bridge.store(engine, news).await?;
    for (dead, original) in stored.iter().zip(refused) {
        match (dead, original) {
            (Some(m), Some(d)) => bury_refused(bridge, s, publish, m, d).await,
            (Some(m), None) => bury(bridge, s, publish, m).await,
            (None, _) => {}
        }
    }
    Ok(markers)
}

/// Why a batch of intake deliveries was not stored.
#[derive(Debug)]
enum IntakeError {
    /// The store failed (a store fault, not the broker's: the connection is kept).
    Store(StoreError),
    /// A delivery could not be read.
    Delivery(String),
}

impl From<StoreError> for IntakeError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

impl std::fmt::Display for IntakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Store(e) => write!(f, "store: {e}"),
            Self::Delivery(e) => write!(f, "delivery: {e}"),
        }
    }
}

/// An intake delivery, understood.
struct Intake {
    /// A copy this bridge republished: its return (with `message` to store instead when its
    /// redrive message is gone).
    returned: Option<Returned>,
    /// The message to store when it is new.
    message: NewMessage,
    /// It was over a size limit: `message` is its dead letter, without what was over.
    refused: bool,
    /// What RabbitMQ delivers again unchanged, hashed (see [`identity`]).
    identity: String,
}

/// Whether a `content_type` says JSON: `application/json`, or any `…/…+json`, with or
/// without parameters.
fn is_json(content_type: Option<&str>) -> bool {
    let Some(ct) = content_type else {
        return false;
    };
    let mime = ct
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    mime == "application/json" || (mime.contains('/') && mime.ends_with("+json"))
}

/// How a body is kept as a payload.
#[derive(Debug, PartialEq)]
enum Body {
    /// A JSON body as its value, with its exact text when the value's JSON would write it
    /// differently.
    Json(serde_json::Value, Option<String>),
    /// UTF-8 text, as a string.
    Text(String),
    /// Anything else, as base64.
    Binary(String),
}

/// The form `data` is kept in, given its `content_type`.
fn body_of(content_type: Option<&str>, data: &[u8]) -> Body {
    let Ok(text) = std::str::from_utf8(data) else {
        return Body::Binary(base64_encode(data));
    };
    if is_json(content_type) {
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(text) {
            let compact = value.to_string();
            // The store keeps the payload as this text and reads it back: only a value that
            // comes back equal can be recognised as untouched at the republish.
            let stable =
                serde_json::from_str::<serde_json::Value>(&compact).is_ok_and(|back| back == value);
            if stable {
                let exact = (compact != text).then(|| text.to_owned());
                return Body::Json(value, exact);
            }
        }
    }
    Body::Text(text.to_owned())
}

/// What an intake delivery is: a copy the bridge republished (`Returned`, with the message
/// to store instead if its redrive message is gone), or a new failure (the message).
fn intake_of(s: &RabbitSettings, d: &Delivery) -> Result<Intake, String> {
    let headers = d.properties.headers().clone().unwrap_or_default();
    let dead = death(&d.properties);
    let failure = rejection(dead.as_ref(), &headers);
    let returned = match (
        header_text(&headers, "x-redrive-id").and_then(|i| i.parse::<MessageId>().ok()),
        header_text(&headers, "x-redrive-attempt").and_then(|a| a.parse::<u32>().ok()),
    ) {
        (Some(id), Some(attempt)) => Some(Returned {
            id,
            attempt,
            failure: failure.clone(),
        }),
        _ => None,
    };
    let (exchange, routing_key) = match &dead {
        Some(dd) => (dd.exchange.clone(), dd.routing_key.clone()),
        None => (
            d.exchange.as_str().to_owned(),
            d.routing_key.as_str().to_owned(),
        ),
    };
    let mut kept = headers.inner().clone();
    for k in DEATH_HEADERS {
        kept.remove(k);
    }
    // An empty table (RabbitMQ's headers were all there was) is stored as none.
    let props = d.properties.clone().with_headers(FieldTable::from(kept));
    let stored = properties_to_json(&props);
    let mut stored_headers = BTreeMap::from([
        (H_EXCHANGE.to_owned(), exchange),
        (H_ROUTING_KEY.to_owned(), routing_key),
        (H_PROPERTIES.to_owned(), stored.properties),
    ]);
    if let Some(h) = stored.headers {
        stored_headers.insert(H_HEADERS.to_owned(), h);
    }
    if let Some(t) = stored.types {
        stored_headers.insert(H_HEADER_TYPES.to_owned(), t);
    }
    let content_type = d.properties.content_type().as_ref().map(|c| c.as_str());
    let (payload, form) = match body_of(content_type, &d.data) {
        Body::Json(value, None) => (value, "json"),
        Body::Json(value, Some(text)) => {
            // The exact text is kept beside the value when it fits the headers' limit; a
            // body too large for that is kept as a string (exact, but shown as text).
            let mut with = stored_headers.clone();
            with.insert(H_BODY.to_owned(), "json".to_owned());
            with.insert(H_BODY_TEXT.to_owned(), text.clone());
            if s.limits.headers_fit(&with) {
                stored_headers = with;
                (value, "json")
            } else {
                (serde_json::Value::String(text), "utf8")
            }
        }
        Body::Text(text) => (serde_json::Value::String(text), "utf8"),
        Body::Binary(b64) => (serde_json::Value::String(b64), "base64"),
    };
    stored_headers.insert(H_BODY.to_owned(), form.to_owned());
    let mut message = NewMessage::new(s.queue.clone(), payload);
    message.headers = stored_headers;
    message.failed = Some(failure);
    // A message another retry mechanism already counted (seed 001's ladder sets
    // x-retry-count) keeps its count: this failure is attempt x-retry-count + 1.
    message.attempts_before = header_text(&headers, "x-retry-count")
        .and_then(|c| c.parse::<u32>().ok())
        .unwrap_or(0)
        .min(MAX_ATTEMPTS_BEFORE);
    let refused = s
        .limits
        .refuse_oversize(&mut message, &[H_HEADERS, H_HEADER_TYPES, H_BODY_TEXT]);
    // The broker identity: everything RabbitMQ delivers again unchanged.
    let wire = serde_json::to_vec(&d.properties).map_err(err)?;
    let identity = identity(&[
        d.exchange.as_str().as_bytes(),
        d.routing_key.as_str().as_bytes(),
        &wire,
        &d.data,
    ]);
    Ok(Intake {
        returned,
        message,
        refused,
        identity,
    })
}

/// The body, the destination and the properties a stored message was taken in with (its
/// payload as an operator may have edited it).
fn rebuild(m: &Message) -> Result<(String, String, BasicProperties, Vec<u8>), String> {
    super::republishable(m)?;
    let header = |k: &str| {
        m.headers
            .get(k)
            .cloned()
            .ok_or_else(|| format!("header {k} is missing: not a message this bridge took in"))
    };
    let props = properties_from_json(
        &header(H_PROPERTIES)?,
        m.headers.get(H_HEADERS).map(String::as_str),
        m.headers.get(H_HEADER_TYPES).map(String::as_str),
    )?;
    let body = match (header(H_BODY)?.as_str(), &m.payload) {
        ("base64", serde_json::Value::String(text)) => {
            base64_decode(text).ok_or("the payload is not base64")?
        }
        ("base64", _) => {
            return Err("the payload is not the base64 string this bridge stored".into())
        }
        ("json", payload) => json_body(m, payload),
        (_, serde_json::Value::String(text)) => text.as_bytes().to_vec(),
        // A text body an operator replaced with JSON: sent as that JSON.
        (_, payload) => payload.to_string().into_bytes(),
    };
    Ok((header(H_EXCHANGE)?, header(H_ROUTING_KEY)?, props, body))
}

/// A JSON body's bytes: exactly the text it came with while the payload is that text's
/// value (untouched), else the payload's JSON (an operator edited it).
fn json_body(m: &Message, payload: &serde_json::Value) -> Vec<u8> {
    if let Some(text) = m.headers.get(H_BODY_TEXT) {
        if serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| &v == payload) {
            return text.as_bytes().to_vec();
        }
    }
    payload.to_string().into_bytes()
}

/// The republish, as a [`Deliverer`] of the consume driver: leases due messages and
/// republishes them with confirms. Its fault is the channel's: a store fault is the
/// driver's to survive, never a reason to reconnect.
struct Republisher<'a> {
    engine: &'a Arc<Engine>,
    bridge: &'a Arc<Bridge>,
    publish: &'a Channel,
}

impl Deliverer for Republisher<'_> {
    async fn admit(&mut self) -> LeaseAsk {
        LeaseAsk {
            max: REPUBLISH_BATCH,
            lease_ms: REPUBLISH_LEASE_MS,
        }
    }

    /// Publish the batch, then await its confirms together: a broker ack makes the message
    /// `republished`; a nack, an unroutable return or no confirm in time hands it back
    /// (due again in [`REPUBLISH_RETRY_MS`]). A lost channel hands back what it did not
    /// confirm, and ends the session.
    async fn deliver(
        &mut self,
        leased: Vec<Leased>,
        _settler: &Settler,
    ) -> Result<Vec<Settlement>, CutShort> {
        let engine = self.engine;
        let retry_at = || engine.clock().now().plus_ms(REPUBLISH_RETRY_MS);
        let mut settle = Vec::with_capacity(leased.len());
        let mut sent = Vec::with_capacity(leased.len());
        let mut fault = None;
        let mut back = Vec::new();
        for l in leased {
            let lease = LeaseRef {
                id: l.message.id,
                token: l.token.clone(),
            };
            if fault.is_some() {
                back.push(lease);
                continue;
            }
            let (exchange, routing_key, props, body) = match rebuild(&l.message) {
                Ok(r) => r,
                Err(why) => {
                    // It cannot be sent as it came: a permanent failure, findable.
                    settle.push(Settlement::reject(lease, why));
                    continue;
                }
            };
            let props = copy_properties(&l, props);
            // Published now, confirmed below: the batch's confirms are awaited together.
            match send(self.publish, &exchange, &routing_key, &body, props).await {
                Ok(confirm) => sent.push((lease, confirm)),
                Err(e) => {
                    fault = Some(e);
                    back.push(lease);
                }
            }
        }
        let counters = &self.bridge.counters;
        for (lease, confirm) in sent {
            match confirmed(confirm).await {
                // The consumer may already have rejected the copy (the return wins): this
                // ack is then refused, as it should be.
                Ok(true) => {
                    counters.republished.fetch_add(1, Ordering::Relaxed);
                    settle.push(Settlement::Ack(Ack::republished(lease)));
                }
                Ok(false) => {
                    counters.republish_refused.fetch_add(1, Ordering::Relaxed);
                    settle.push(Settlement::Release(Release::by_redrive(lease, retry_at())));
                }
                Err(e) => {
                    fault.get_or_insert(e);
                    back.push(lease);
                }
            }
        }
        settle.extend(
            back.into_iter()
                .map(|lease| Settlement::Release(Release::by_redrive(lease, retry_at()))),
        );
        match fault {
            None => Ok(settle),
            Some(e) => Err(CutShort {
                fault: DelivererFault::new(e),
                settle,
            }),
        }
    }
}

/// The properties of a republished copy: the stored ones with `x-redrive-id`,
/// `x-redrive-attempt`, `x-retry-count`, `x-first-failure-time` and `x-last-error`.
fn copy_properties(l: &Leased, props: BasicProperties) -> BasicProperties {
    let mut headers = props.headers().clone().unwrap_or_default();
    let id = l.message.id.to_string();
    headers.insert(
        ShortString::from("x-redrive-id"),
        AMQPValue::LongString(LongString::from(id.into_bytes())),
    );
    headers.insert(
        ShortString::from("x-redrive-attempt"),
        AMQPValue::LongLongInt(i64::from(l.attempt)),
    );
    headers.insert(
        ShortString::from("x-retry-count"),
        AMQPValue::LongLongInt(i64::from(l.attempt.saturating_sub(1))),
    );
    headers.insert(
        ShortString::from("x-first-failure-time"),
        AMQPValue::LongString(LongString::from(
            l.message.created_at.to_rfc3339().into_bytes(),
        )),
    );
    if let Some(e) = l
        .message
        .last_error
        .as_ref()
        .and_then(|e| e.message.clone())
    {
        headers.insert(
            ShortString::from("x-last-error"),
            AMQPValue::LongString(LongString::from(e.into_bytes())),
        );
    }
    props.with_headers(headers)
}

/// Publish (mandatory, on a confirm channel); the confirm is awaited with [`confirmed`].
async fn send(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    props: BasicProperties,
) -> Result<PublisherConfirm, String> {
    channel
        .basic_publish(
            exchange,
            routing_key,
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            body,
            props,
        )
        .await
        .map_err(err)
}

/// `Ok(true)` when the broker acked and routed the publish, `Ok(false)` when it nacked it,
/// returned it unroutable or did not answer in time; `Err` when the channel is gone.
async fn confirmed(confirm: PublisherConfirm) -> Result<bool, String> {
    match tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await {
        Ok(Ok(Confirmation::Ack(None))) => Ok(true),
        Ok(Ok(_)) => Ok(false),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Ok(false),
    }
}

/// An exhausted message: count it, and publish it to `dead_exchange` when set.
async fn bury(bridge: &Arc<Bridge>, s: &RabbitSettings, publish: &Channel, m: &Message) {
    bridge.counters.dead.fetch_add(1, Ordering::Relaxed);
    if s.dead_exchange.is_none() {
        return;
    }
    let Ok((_, routing_key, props, body)) = rebuild(m) else {
        return;
    };
    to_dead_exchange(s, publish, m, &routing_key, props, &body).await;
}

/// A delivery over a size limit, stored dead without what was over (`m`): count it, and
/// publish the delivery as it came to `dead_exchange` when set.
async fn bury_refused(
    bridge: &Arc<Bridge>,
    s: &RabbitSettings,
    publish: &Channel,
    m: &Message,
    d: &Delivery,
) {
    bridge.counters.dead.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(bridge = %s.name, message = %m.id,
        error = m.last_error.as_ref().and_then(|e| e.message.as_deref()).unwrap_or(""),
        "an intake message is over the size limits: stored dead without what is over");
    let routing_key = m
        .headers
        .get(H_ROUTING_KEY)
        .cloned()
        .unwrap_or_else(|| d.routing_key.as_str().to_owned());
    to_dead_exchange(s, publish, m, &routing_key, d.properties.clone(), &d.data).await;
}

/// Publish a dead message to `dead_exchange` (when set), with `x-redrive-id` and
/// `x-redrive-dead-reason` (and `x-redrive-refused` for one over a size limit).
async fn to_dead_exchange(
    s: &RabbitSettings,
    publish: &Channel,
    m: &Message,
    routing_key: &str,
    props: BasicProperties,
    body: &[u8],
) {
    let Some(dead_exchange) = &s.dead_exchange else {
        return;
    };
    let mut headers = props.headers().clone().unwrap_or_default();
    headers.insert(
        ShortString::from("x-redrive-id"),
        AMQPValue::LongString(LongString::from(m.id.to_string().into_bytes())),
    );
    if let Some(reason) = m.dead_reason {
        headers.insert(
            ShortString::from("x-redrive-dead-reason"),
            AMQPValue::LongString(LongString::from(reason.as_str().as_bytes().to_vec())),
        );
    }
    if let Some(code) = m.headers.get(super::H_REFUSED) {
        headers.insert(
            ShortString::from("x-redrive-refused"),
            AMQPValue::LongString(LongString::from(code.clone().into_bytes())),
        );
    }
    let sent = send(
        publish,
        dead_exchange,
        routing_key,
        body,
        props.with_headers(headers),
    )
    .await;
    let outcome = match sent {
        Ok(confirm) => confirmed(confirm).await,
        Err(e) => Err(e),
    };
    match outcome {
        Ok(true) => {}
        Ok(false) | Err(_) => tracing::warn!(
            bridge = %s.name, message = %m.id, dead_exchange = %dead_exchange,
            "could not publish a dead message to the dead exchange; it stays dead in redrive"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_content_types() {
        for ct in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/vnd.order+json",
            "application/problem+json;v=2",
        ] {
            assert!(is_json(Some(ct)), "{ct}");
        }
        for ct in ["text/plain", "application/jsonl", "json", "+json", ""] {
            assert!(!is_json(Some(ct)), "{ct}");
        }
        assert!(!is_json(None));
    }

    #[test]
    fn a_json_body_is_a_value_with_its_exact_text_when_that_differs() {
        let ct = Some("application/json");
        let compact = br#"{"a":1,"b":[true,null]}"#;
        assert_eq!(
            body_of(ct, compact),
            Body::Json(json!({"a": 1, "b": [true, null]}), None)
        );
        let formatted = "{ \"user\": 7,\n  \"price\": 1.0, \"name\": \"\\u00e9t\\u00e9\" }";
        match body_of(ct, formatted.as_bytes()) {
            Body::Json(v, Some(exact)) => {
                assert_eq!(v, json!({"user": 7, "price": 1.0, "name": "été"}));
                assert_eq!(exact, formatted);
            }
            other => panic!("{other:?}"),
        }
        // Not JSON although it says so; not UTF-8; not said to be JSON.
        assert_eq!(body_of(ct, b"{oops"), Body::Text("{oops".into()));
        assert_eq!(body_of(ct, b"\xff"), Body::Binary("/w==".into()));
        assert_eq!(body_of(Some("text/plain"), b"{}"), Body::Text("{}".into()));
    }

    fn stored(payload: serde_json::Value, headers: &[(&str, &str)]) -> Message {
        let headers = headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        super::super::stored_for_test(payload, headers)
    }

    #[test]
    fn an_untouched_json_body_goes_back_byte_exact_an_edited_one_as_its_json() {
        let text = "{ \"b\": 1.0,  \"a\": \"\\u00e9\" }";
        let value: serde_json::Value = serde_json::from_str(text).unwrap();
        // As the store keeps it: its JSON text, read back.
        let payload: serde_json::Value = serde_json::from_str(&value.to_string()).unwrap();
        let base = [
            (H_EXCHANGE, "x"),
            (H_ROUTING_KEY, "k"),
            (H_PROPERTIES, r#"{"content_type":"application/json"}"#),
            (H_BODY, "json"),
            (H_BODY_TEXT, text),
        ];
        let (_, _, props, body) = rebuild(&stored(payload, &base)).unwrap();
        assert_eq!(body, text.as_bytes());
        assert_eq!(
            props.content_type().as_ref().unwrap().as_str(),
            "application/json"
        );
        let (_, _, _, body) = rebuild(&stored(json!({"a": "é", "b": 2}), &base)).unwrap();
        assert_eq!(body, r#"{"a":"é","b":2}"#.as_bytes());
        // A text body an operator turned into JSON is sent as that JSON.
        let text_form = [
            (H_EXCHANGE, "x"),
            (H_ROUTING_KEY, "k"),
            (H_PROPERTIES, "{}"),
            (H_BODY, "utf8"),
        ];
        let (_, _, _, body) = rebuild(&stored(json!({"fixed": true}), &text_form)).unwrap();
        assert_eq!(body, br#"{"fixed":true}"#);
        // A message stored without what was over a limit is never republished.
        let refused = [
            (H_EXCHANGE, "x"),
            (H_ROUTING_KEY, "k"),
            (H_PROPERTIES, "{}"),
            (H_BODY, "utf8"),
            (super::super::H_REFUSED, "headers_too_large"),
        ];
        let e = rebuild(&stored(json!("body"), &refused)).unwrap_err();
        assert!(e.contains("headers_too_large"), "{e}");
    }

    #[test]
    fn a_copy_does_not_repeat_the_error_redrive_put_on_it() {
        let mut h = FieldTable::default();
        h.insert(
            ShortString::from("x-last-error"),
            AMQPValue::LongString(LongString::from(
                b"dead-lettered by RabbitMQ (rejected)".to_vec(),
            )),
        );
        // A first arrival: another system's x-last-error is kept.
        assert_eq!(
            rejection(None, &h).message.as_deref(),
            Some("dead-lettered by RabbitMQ (rejected): dead-lettered by RabbitMQ (rejected)")
        );
        h.insert(
            ShortString::from("x-redrive-id"),
            AMQPValue::LongString(LongString::from(MessageId::new().to_string().into_bytes())),
        );
        let f = rejection(None, &h);
        assert_eq!(
            f.message.as_deref(),
            Some("dead-lettered by RabbitMQ (rejected)")
        );
        assert_eq!(f.code.as_deref(), Some("amqp_rejected"));
    }
}
