//! `[bridges]` (SPEC §11): redrive behind RabbitMQ (`[bridges.rabbitmq.NAME]`) and Redis
//! Streams (`[bridges.redis_streams.NAME]`), checked and translated into the engine's
//! `BridgeSettings`.

use super::{Config, ConfigError, Delivery};
use crate::engine::bridge::{BridgeSettings, RabbitSettings, RedisSettings};
use redrive_core::DurationMs;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `[bridges]`: redrive behind brokers (SPEC §11).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BridgesConfig {
    /// `[bridges.rabbitmq.NAME]`.
    pub rabbitmq: BTreeMap<String, RabbitBridgeConfig>,
    /// `[bridges.redis_streams.NAME]`.
    pub redis_streams: BTreeMap<String, RedisBridgeConfig>,
}

/// One `[bridges.redis_streams.NAME]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisBridgeConfig {
    /// `redis://host:port[/db]`.
    pub url: String,
    /// The stream its consumers read.
    pub stream: String,
    /// Their consumer group (it must exist: `XGROUP CREATE`).
    pub group: String,
    /// A pending entry idle this long has failed.
    #[serde(default = "min_idle")]
    pub min_idle: DurationMs,
    /// The redrive queue that holds the entries; its retry policy applies.
    pub queue: String,
}

fn min_idle() -> DurationMs {
    DurationMs(30_000)
}

/// One `[bridges.rabbitmq.NAME]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RabbitBridgeConfig {
    /// `amqp://user:pass@host:port/vhost` (`%2f` for the default vhost).
    pub url: String,
    /// The RabbitMQ queue the bridge consumes: bound to the consumers' dead-letter exchange.
    pub intake_queue: String,
    /// The redrive queue that holds the messages; its retry policy applies.
    pub queue: String,
    /// Exhausted messages are also published to this exchange (`""`: not published).
    #[serde(default)]
    pub dead_exchange: String,
    /// Declare the intake queue (durable) and bind it to `dead_letter_exchange`.
    #[serde(default = "yes")]
    pub declare: bool,
    /// The exchange the consumers' queue dead-letters into (its `x-dead-letter-exchange`,
    /// or a policy's `dead-letter-exchange`), which `declare` binds the intake queue to
    /// (and declares, fanout and durable, when it does not exist).
    #[serde(default)]
    pub dead_letter_exchange: String,
    /// The intake queue's binding key (with `declare`).
    #[serde(default = "hash")]
    pub binding_key: String,
    /// Intake deliveries in flight (unacked) at most.
    #[serde(default = "prefetch")]
    pub prefetch: u16,
}

fn yes() -> bool {
    true
}

fn hash() -> String {
    "#".to_owned()
}

fn prefetch() -> u16 {
    64
}

impl Config {
    /// The bridges' settings, checked (the error names the key).
    pub fn bridge_settings(&self) -> Result<Vec<BridgeSettings>, ConfigError> {
        let mut out: Vec<BridgeSettings> = Vec::new();
        // What a bridge stores obeys the limits of a publish.
        let limits = crate::engine::bridge::IntakeLimits {
            max_payload_bytes: self.max_payload_bytes,
            max_header_bytes: self.max_header_bytes,
        };
        // A redrive queue has one deliverer: a pull queue's consumers, push, or one bridge.
        let check_queue = |out: &[BridgeSettings], key: String, queue: &str| {
            let val = |reason: String| ConfigError::Value {
                key: key.clone(),
                reason,
            };
            redrive_core::validate_queue_name(queue).map_err(|e| val(e.to_string()))?;
            if self
                .queues
                .get(queue)
                .is_some_and(|q| q.delivery == Some(Delivery::Push))
            {
                return Err(val(
                    "is a push queue; a bridge's queue is delivered by the bridge".into(),
                ));
            }
            if let Some(other) = out.iter().find(|o| o.queue() == queue) {
                return Err(val(format!(
                    "is already the queue of bridge {}",
                    other.name()
                )));
            }
            Ok(())
        };
        for (name, b) in &self.bridges.rabbitmq {
            let key = |k: &str| format!("bridges.rabbitmq.{name}.{k}");
            let val = |k: &str, reason: &str| ConfigError::Value {
                key: key(k),
                reason: reason.to_owned(),
            };
            if !b.url.starts_with("amqp://") {
                return Err(val(
                    "url",
                    "must be an amqp:// URL, e.g. \"amqp://guest:guest@127.0.0.1:5672/%2f\" (amqps:// is not supported yet)",
                ));
            }
            if b.intake_queue.trim().is_empty() {
                return Err(val(
                    "intake_queue",
                    "must name the RabbitMQ queue to consume",
                ));
            }
            check_queue(&out, key("queue"), &b.queue)?;
            if b.declare && b.dead_letter_exchange.is_empty() {
                return Err(val(
                    "dead_letter_exchange",
                    "declare = true needs the exchange the consumers' queue dead-letters into",
                ));
            }
            if b.prefetch == 0 {
                return Err(val("prefetch", "must be at least 1"));
            }
            let opt = |s: &str| (!s.is_empty()).then(|| s.to_owned());
            out.push(BridgeSettings::Rabbit(RabbitSettings {
                name: name.clone(),
                url: b.url.clone(),
                intake_queue: b.intake_queue.clone(),
                queue: b.queue.clone(),
                dead_exchange: opt(&b.dead_exchange),
                declare: b.declare,
                dead_letter_exchange: opt(&b.dead_letter_exchange),
                binding_key: b.binding_key.clone(),
                prefetch: b.prefetch,
                limits,
            }));
        }
        for (name, b) in &self.bridges.redis_streams {
            let key = |k: &str| format!("bridges.redis_streams.{name}.{k}");
            let val = |k: &str, reason: &str| ConfigError::Value {
                key: key(k),
                reason: reason.to_owned(),
            };
            if !b.url.starts_with("redis://") {
                return Err(val(
                    "url",
                    "must be a redis:// URL, e.g. \"redis://127.0.0.1:6379\"",
                ));
            }
            if b.stream.is_empty() {
                return Err(val("stream", "must name the stream"));
            }
            if b.group.is_empty() {
                return Err(val("group", "must name the consumer group"));
            }
            if b.min_idle.ms() == 0 {
                return Err(val("min_idle", "must be above 0s"));
            }
            check_queue(&out, key("queue"), &b.queue)?;
            out.push(BridgeSettings::RedisStreams(RedisSettings {
                name: name.clone(),
                url: b.url.clone(),
                stream: b.stream.clone(),
                group: b.group.clone(),
                min_idle_ms: b.min_idle.ms(),
                queue: b.queue.clone(),
                limits,
            }));
        }
        Ok(out)
    }
}
