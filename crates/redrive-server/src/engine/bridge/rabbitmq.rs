//! The RabbitMQ bridge (SPEC §11): redrive behind a RabbitMQ work queue whose
//! consumers reject (`requeue = false`) what they cannot process.
//!
//! The consumers' queue dead-letters into an exchange (`x-dead-letter-exchange`); the
//! bridge's *intake queue* is bound to it. For every message that arrives there the bridge:
//!
//! 1. **stores it first, acks it second**: a new failure becomes a redrive message of the
//!    bridge's queue (`NewMessage::failed`: the rejection is attempt 1, scheduled by the
//!    queue's retry policy), body and AMQP properties kept (`amqp-*` headers; the body as
//!    the payload string, or base64 when it is not UTF-8), deduplicated by an idempotency
//!    key (message id, or the body's hash, and the `x-death` count), so a crash between
//!    the two stores nothing twice;
//! 2. a copy the bridge republished earlier carries `x-redrive-id` and
//!    `x-redrive-attempt`: it is matched to its redrive message ([`Store::returned`]: one
//!    more failed attempt in the same history, applied once).
//!
//! When a message is due, the bridge leases it (it is the queue's only consumer) and
//! republishes it to its original exchange and routing key (from `x-death`) with
//! publisher confirms, adding `x-retry-count`, `x-redrive-id`, `x-redrive-attempt`,
//! `x-first-failure-time` and `x-last-error`. Only a broker ack makes the attempt
//! delivered (the message is then `done` until it comes back); a nack, an unroutable
//! return or a lost channel hands the lease back uncharged ([`Store::release`]) and the
//! publish is tried again. A message the policy kills is dead in redrive (searchable,
//! redrivable) and, with `dead_exchange`, published there too.
//!
//! Connection loss: the bridge reconnects (see the module above), declares again, and
//! resumes; unacked intake deliveries are redelivered by RabbitMQ and deduplicated.
//!
//! [`Store::returned`]: redrive_storage::Store::returned
//! [`Store::release`]: redrive_storage::Store::release

use super::{base64_decode, base64_encode, err, Bridge, ReturnApplied};
use crate::engine::Engine;
use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::publisher_confirm::{Confirmation, PublisherConfirm};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use redrive_core::{fnv1a, ErrorClass, Failure, Message, MessageId, NewMessage};
use redrive_storage::{Ack, LeaseRef, Release, Returned};
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
const H_PROPERTIES: &str = "amqp-properties";
const H_BODY: &str = "amqp-body";

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
    let intake = conn.create_channel().await.map_err(err)?;
    let publish = conn.create_channel().await.map_err(err)?;
    publish
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(err)?;
    if s.declare {
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
        if let Some(dlx) = &s.dead_letter_exchange {
            // The dead-letter exchange: used as it is when it exists (whatever its type),
            // declared (fanout, durable) when it does not. A passive declare of a missing
            // exchange closes its channel, hence a throwaway one.
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
                .map_err(err)?;
        }
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
    let intake_loop = async {
        // What has arrived is stored together: one store write (one fsync) for a batch.
        let mut batches = consumer.ready_chunks(usize::from(s.prefetch).max(1));
        while let Some(batch) = batches.next().await {
            let deliveries: Vec<Delivery> =
                batch.into_iter().collect::<Result<_, _>>().map_err(err)?;
            match take_in(engine, bridge, s, &publish, &deliveries).await {
                Ok(()) => {
                    for d in &deliveries {
                        d.acker.ack(BasicAckOptions::default()).await.map_err(err)?;
                    }
                }
                Err(e) => {
                    // Not stored: give them back to RabbitMQ, which delivers them again
                    // (what was stored is then recognised: returns apply once, new
                    // messages have their idempotency key).
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
        Err::<(), String>("the intake consumer ended".to_owned())
    };
    let result = tokio::select! {
        r = intake_loop => r,
        r = republish_loop(engine, bridge, s, &publish) => r,
        _ = stop.changed() => Ok(()),
    };
    let _ = conn.close(200, "redrive bridge stopping").await;
    result
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

/// The first (most recent) `x-death` entry: where the message was going, why it died
/// there, and how often.
struct Death {
    exchange: String,
    routing_key: String,
    reason: String,
    count: i64,
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
        count: header_text(first, "count")
            .and_then(|c| c.parse().ok())
            .unwrap_or(1),
    })
}

/// The failure an intake delivery reports.
fn rejection(death: Option<&Death>, props: &BasicProperties) -> Failure {
    let reason = death.map_or("rejected", |d| d.reason.as_str());
    let mut message = format!("dead-lettered by RabbitMQ ({reason})");
    if let Some(e) = props
        .headers()
        .as_ref()
        .and_then(|h| header_text(h, "x-last-error"))
    {
        message = format!("{message}: {e}");
    }
    Failure {
        class: ErrorClass::Transient,
        message: Some(message),
        retry_after_ms: None,
        code: Some(format!("amqp_{reason}")),
    }
}

/// Store intake deliveries (or match each copy to the message it is a copy of). New
/// failures are stored in one publish.
async fn take_in(
    engine: &Arc<Engine>,
    bridge: &Arc<Bridge>,
    s: &RabbitSettings,
    publish: &Channel,
    deliveries: &[Delivery],
) -> Result<(), String> {
    let mut news = Vec::new();
    for d in deliveries {
        let (returned, message) = intake_of(s, d)?;
        if let Some(returned) = returned {
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
        news.push(message);
    }
    for m in bridge.store(engine, news).await? {
        bury(bridge, s, publish, &m).await;
    }
    Ok(())
}

/// What an intake delivery is: a copy the bridge republished (`Returned`, with the message
/// to store instead if its redrive message is gone), or a new failure (the message).
fn intake_of(s: &RabbitSettings, d: &Delivery) -> Result<(Option<Returned>, NewMessage), String> {
    let headers = d.properties.headers().clone().unwrap_or_default();
    let dead = death(&d.properties);
    let failure = rejection(dead.as_ref(), &d.properties);
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
    for k in [
        "x-death",
        "x-first-death-exchange",
        "x-first-death-queue",
        "x-first-death-reason",
        "x-last-death-exchange",
        "x-last-death-queue",
        "x-last-death-reason",
    ] {
        kept.remove(k);
    }
    let props = d.properties.clone().with_headers(FieldTable::from(kept));
    let (payload, body_encoding) = match std::str::from_utf8(&d.data) {
        Ok(text) => (serde_json::Value::String(text.to_owned()), "utf8"),
        Err(_) => (serde_json::Value::String(base64_encode(&d.data)), "base64"),
    };
    let identity = match d.properties.message_id() {
        Some(id) => id.as_str().to_owned(),
        None => format!("{:016x}", fnv1a(&d.data)),
    };
    let mut message = NewMessage::new(s.queue.clone(), payload);
    message.headers = BTreeMap::from([
        (H_EXCHANGE.to_owned(), exchange),
        (H_ROUTING_KEY.to_owned(), routing_key),
        (
            H_PROPERTIES.to_owned(),
            serde_json::to_string(&props).map_err(err)?,
        ),
        (H_BODY.to_owned(), body_encoding.to_owned()),
    ]);
    message.idempotency_key = Some(format!(
        "amqp:{}:{identity}:{}",
        s.name,
        dead.as_ref().map_or(1, |d| d.count)
    ));
    message.failed = Some(failure);
    // A message another retry mechanism already counted (seed 001's ladder sets
    // x-retry-count) keeps its count: this failure is attempt x-retry-count + 1.
    message.attempts_before = header_text(&headers, "x-retry-count")
        .and_then(|c| c.parse::<u32>().ok())
        .unwrap_or(0)
        .min(MAX_ATTEMPTS_BEFORE);
    Ok((returned, message))
}

/// The body, the destination and the properties a stored message was taken in with.
fn rebuild(m: &Message) -> Result<(String, String, BasicProperties, Vec<u8>), String> {
    let header = |k: &str| {
        m.headers
            .get(k)
            .cloned()
            .ok_or_else(|| format!("header {k} is missing: not a message this bridge took in"))
    };
    let props: BasicProperties = serde_json::from_str(&header(H_PROPERTIES)?).map_err(err)?;
    let text = m
        .payload
        .as_str()
        .ok_or("the payload is not the body string this bridge stored")?;
    let body = if header(H_BODY)? == "base64" {
        base64_decode(text).ok_or("the payload is not base64")?
    } else {
        text.as_bytes().to_vec()
    };
    Ok((header(H_EXCHANGE)?, header(H_ROUTING_KEY)?, props, body))
}

/// Lease due messages and republish them with confirms, until the channel fails.
async fn republish_loop(
    engine: &Arc<Engine>,
    bridge: &Arc<Bridge>,
    s: &RabbitSettings,
    publish: &Channel,
) -> Result<(), String> {
    loop {
        let leased = engine
            .lease(
                &s.queue,
                REPUBLISH_BATCH,
                None,
                Some(REPUBLISH_LEASE_MS),
                1_000,
            )
            .await
            .map_err(err)?;
        let mut sent = Vec::with_capacity(leased.len());
        for l in leased {
            let lease = LeaseRef {
                id: l.message.id,
                token: l.token.clone(),
            };
            let (exchange, routing_key, props, body) = match rebuild(&l.message) {
                Ok(r) => r,
                Err(why) => {
                    // It cannot be sent as it came: a permanent failure, findable.
                    engine.reject(lease, why).await.map_err(err)?;
                    continue;
                }
            };
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
            let props = props.with_headers(headers);
            // Published now, confirmed below: the batch's confirms are awaited together.
            let confirm = send(publish, &exchange, &routing_key, &body, props).await?;
            sent.push((lease, confirm));
        }
        let (mut acks, mut releases) = (Vec::new(), Vec::new());
        for (lease, confirm) in sent {
            if confirmed(confirm).await? {
                bridge.counters.republished.fetch_add(1, Ordering::Relaxed);
                acks.push(Ack::from(lease));
            } else {
                bridge
                    .counters
                    .republish_refused
                    .fetch_add(1, Ordering::Relaxed);
                let until = engine.clock().now().plus_ms(REPUBLISH_RETRY_MS);
                releases.push(Release {
                    lease,
                    until,
                    waited: Vec::new(),
                });
            }
        }
        // The consumer may already have rejected a copy (the return wins): its ack is then
        // refused, as it should be.
        if !acks.is_empty() {
            engine.ack(acks).await.map_err(err)?;
        }
        if !releases.is_empty() {
            engine.release(releases).await.map_err(err)?;
        }
    }
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
    let Some(dead_exchange) = &s.dead_exchange else {
        return;
    };
    let Ok((_, routing_key, props, body)) = rebuild(m) else {
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
    let sent = send(
        publish,
        dead_exchange,
        &routing_key,
        &body,
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
