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
//! Every bridge is one task with its own connection: it reconnects with backoff (1 s
//! doubling to 30 s) and resumes. The bridge is its redrive queue's only consumer (a lease
//! on it is 409 `bridge_queue`). `GET /v1/bridges` and the `redrive_bridge_*` metrics show
//! its state and counters.
//!
//! [`Store::returned`]: redrive_storage::Store::returned

pub mod rabbitmq;
pub mod redis_streams;

pub use rabbitmq::RabbitSettings;
pub use redis_streams::RedisSettings;

use super::Engine;
use redrive_core::{Message, NewMessage, State};
use redrive_storage::{Returned, StoreError};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

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
    ) -> Result<ReturnApplied, String> {
        match engine.returned(vec![returned]).await.map_err(err)?.pop() {
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
            Some(Err(e)) => Err(e.to_string()),
            None => Err("no answer for a returned message".to_owned()),
        }
    }

    /// Store new failures in one publish, counting them (`intake`, or `duplicates` for
    /// an idempotent replay); answers those the policy made dead at once.
    pub(super) async fn store(
        &self,
        engine: &Engine,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<Message>, String> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let mut dead = Vec::new();
        for p in engine.publish(messages).await.map_err(err)? {
            if p.replayed {
                self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            self.counters.intake.fetch_add(1, Ordering::Relaxed);
            if p.message.state == State::Dead {
                dead.push(p.message);
            }
        }
        Ok(dead)
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

    /// Every bridge as the API shows it.
    pub fn views(&self) -> Vec<BridgeView> {
        self.list.iter().map(|b| b.view()).collect()
    }

    /// Every bridge's state and counters, for the metrics.
    pub fn gauges(&self) -> Vec<crate::metrics::BridgeGauges> {
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
                crate::metrics::BridgeGauges {
                    connected: v.state == "connected",
                    bridge: v.name,
                    events,
                }
            })
            .collect()
    }
}

/// Start one task per bridge.
pub(super) fn start(engine: Arc<Engine>, stop: &watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
    engine
        .bridges()
        .list
        .iter()
        .map(|b| tokio::spawn(run(engine.clone(), b.clone(), stop.clone())))
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

pub(super) fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub(super) fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}
