//! The consume driver: the one lease → deliver → settle loop of the server's own consumers
//! (push delivery, the RabbitMQ bridge's and the Redis Streams bridge's republish). Each of
//! them is a [`Deliverer`]; the driver owns everything around the delivery:
//!
//! 1. it asks the deliverer how many messages it can take now and for how long
//!    ([`Deliverer::admit`]: push waits there for its endpoint to admit a call);
//! 2. it leases them through [`Engine::lease`] (a long poll of [`LEASE_WAIT_MS`]);
//! 3. it hands the batch to [`Deliverer::deliver`], which answers what to settle: an ack,
//!    a nack or a release per message ([`Settlement`]); a deliverer whose deliveries end later
//!    (push's calls in flight) settles them itself through the same [`Settler`];
//! 4. it settles them in batches through the engine (one `ack`, one `nack`, one `release`
//!    call per batch), so every settlement is counted, woken and watched as any consumer's.
//!
//! **One policy for store faults.** A store error while leasing or settling is never the
//! deliverer's fault: it is logged with the queue, the operation and how many messages it
//! concerned, counted (`redrive_consume_store_faults_total{queue, operation}`), announced
//! ([`Signal::StoreFault`]), and the driver backs off ([`BACKOFF_MIN`] doubling to
//! [`BACKOFF_MAX`]) and continues with the same deliverer (a bridge keeps its broker
//! connection). A message whose settlement was lost stays leased until its lease expires
//! and is then delivered again (SPEC §4: at least once). Only a deliverer's own fault
//! ([`DelivererFault`]: the broker connection or channel is gone) ends the driver, after
//! what it had already decided is settled; a bridge then reconnects.
//!
//! A store's per-message refusal (the lease had ended: expired, settled by a bridge's
//! return, killed by an operator) is no fault: that message is, or will be, delivered again
//! or was finished by someone else. It is logged and reported per item ([`SettleResult::Refused`]).
//!
//! Tests wait on [`Signal::Settled`] and [`Signal::StoreFault`] instead of sleeping.

use super::{Engine, Event, Signal};
use redrive_core::{ErrorClass, Failure};
use redrive_storage::{Ack, LeaseRef, Leased, Nack, Release, StoreError};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::watch;

/// How long one lease request waits for a ready message.
pub const LEASE_WAIT_MS: u64 = 1_000;

/// The first backoff after a store fault; it doubles at each fault in a row.
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);

/// The longest backoff after store faults in a row.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How many messages a deliverer takes now, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseAsk {
    /// Most messages to lease (at least 1).
    pub max: u32,
    /// The lease's length, ms.
    pub lease_ms: u64,
}

/// What a deliverer made of one leased message: how the driver settles it.
#[derive(Debug, Clone)]
pub enum Settlement {
    /// Delivered: ack (a bridge's ack is [`Ack::republished`]).
    Ack(Ack),
    /// Attempted and failed: nack, the policy decides.
    Nack(Nack),
    /// Not attempted: handed back, uncharged.
    Release(Release),
}

impl Settlement {
    /// A message that cannot be delivered as it is stored (push: its `target_url` no longer
    /// parses; a bridge: its broker headers were edited away): a permanent failure, so it
    /// is dead and findable rather than retried for ever.
    pub fn reject(lease: LeaseRef, why: impl Into<String>) -> Self {
        Self::Nack(Nack {
            lease,
            failure: Failure::new(ErrorClass::Permanent, why),
            response: None,
            waited: Vec::new(),
        })
    }

    fn lease(&self) -> &LeaseRef {
        match self {
            Self::Ack(a) => &a.lease,
            Self::Nack(n) => &n.lease,
            Self::Release(r) => &r.lease,
        }
    }
}

/// How one settlement ended.
#[derive(Debug, Clone)]
pub enum SettleResult {
    /// Committed.
    Done,
    /// The store refused this message's settlement: its lease had ended (expired, settled by
    /// a return or an operator). Nothing to do: it is, or will be, delivered again, or was
    /// finished by someone else.
    Refused(StoreError),
    /// The store call failed (a store fault, see the module's policy): the message stays
    /// leased until its lease expires, and is delivered again then.
    Failed,
}

/// A deliverer's own fault: the broker connection or channel it delivers through is gone.
/// It ends the driver (the bridge reconnects); a store fault never is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error}")]
pub struct DelivererFault {
    /// What failed.
    pub error: String,
}

impl DelivererFault {
    /// A fault saying `error`.
    pub fn new(error: impl std::fmt::Display) -> Self {
        Self {
            error: error.to_string(),
        }
    }
}

/// A deliverer's answer for a batch that its fault cut short: what it had decided (and
/// what it hands back), settled before the driver ends.
#[derive(Debug)]
pub struct CutShort {
    /// The fault.
    pub fault: DelivererFault,
    /// Settlements of the batch, the messages it could not deliver released.
    pub settle: Vec<Settlement>,
}

/// What ends a step of the driver: a store fault (backed off, the driver continues) or a
/// deliverer's fault (the driver ends).
#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    /// The store failed (leasing or settling).
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The deliverer failed (its broker).
    #[error("deliverer: {0}")]
    Deliverer(#[from] DelivererFault),
}

/// One consumer inside the server: push delivery, a bridge's republish.
pub trait Deliverer: Send {
    /// Wait until it can take messages; how many and for how long. Cancelled when the
    /// driver stops.
    fn admit(&mut self) -> impl Future<Output = LeaseAsk> + Send;

    /// Deliver a leased batch: what to settle now, as one batch. A delivery that ends later
    /// (a call in flight) is settled through `settler`. `Err` for the deliverer's own fault,
    /// with what to settle before the driver ends.
    fn deliver(
        &mut self,
        leased: Vec<Leased>,
        settler: &Settler,
    ) -> impl Future<Output = Result<Vec<Settlement>, CutShort>> + Send;

    /// After the driver stopped: let what is in flight finish.
    fn finish(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Settles a consumer's messages through the engine, with the driver's policy for store
/// faults. Cheap to clone: push's calls in flight each hold one.
#[derive(Debug, Clone)]
pub struct Settler {
    engine: Arc<Engine>,
    queue: Arc<str>,
    consumer: Arc<str>,
    /// The first store fault since the driver last looked: it backs off then.
    fault: Arc<Mutex<Option<StoreError>>>,
}

impl Settler {
    fn new(engine: Arc<Engine>, queue: &str, consumer: &str) -> Self {
        Self {
            engine,
            queue: queue.into(),
            consumer: consumer.into(),
            fault: Arc::default(),
        }
    }

    /// Settle a batch: its acks in one engine call, its nacks in one, its releases in one.
    /// One answer per settlement, in order. A store fault is handled here by the policy (see
    /// the module): logged, counted, announced, and the driver backs off before it leases
    /// again; it is never an error of the caller's.
    pub async fn settle(&self, batch: Vec<Settlement>) -> Vec<SettleResult> {
        let mut out = vec![SettleResult::Failed; batch.len()];
        if batch.is_empty() {
            return out;
        }
        let ids: Vec<_> = batch.iter().map(|s| s.lease().id).collect();
        let (mut acks, mut nacks, mut releases) = (Vec::new(), Vec::new(), Vec::new());
        for (i, s) in batch.into_iter().enumerate() {
            match s {
                Settlement::Ack(a) => acks.push((i, a)),
                Settlement::Nack(n) => nacks.push((i, n)),
                Settlement::Release(r) => releases.push((i, r)),
            }
        }
        let counts = (acks.len(), nacks.len(), releases.len());
        if !acks.is_empty() {
            let (at, items): (Vec<usize>, Vec<Ack>) = acks.into_iter().unzip();
            let answer = self.engine.ack(items).await;
            self.record(&mut out, &ids, &at, "ack", answer);
        }
        if !nacks.is_empty() {
            let (at, items): (Vec<usize>, Vec<Nack>) = nacks.into_iter().unzip();
            let answer = self.engine.nack(items).await;
            self.record(&mut out, &ids, &at, "nack", answer);
        }
        if !releases.is_empty() {
            let (at, items): (Vec<usize>, Vec<Release>) = releases.into_iter().unzip();
            let answer = self.engine.release(items).await;
            self.record(&mut out, &ids, &at, "release", answer);
        }
        let refused = out
            .iter()
            .filter(|s| matches!(s, SettleResult::Refused(_)))
            .count();
        let failed = out
            .iter()
            .filter(|s| matches!(s, SettleResult::Failed))
            .count();
        self.engine.signals().send(|| Signal::Settled {
            queue: self.queue.to_string(),
            acked: counts.0,
            nacked: counts.1,
            released: counts.2,
            refused,
            failed,
        });
        out
    }

    /// Record the answers of one settle call (`operation`) for the items at `at`.
    fn record<T>(
        &self,
        out: &mut [SettleResult],
        ids: &[redrive_core::MessageId],
        at: &[usize],
        operation: &'static str,
        answer: Result<Vec<Result<T, StoreError>>, StoreError>,
    ) {
        match answer {
            Ok(items) => {
                for (&i, r) in at.iter().zip(items) {
                    out[i] = match r {
                        Ok(_) => SettleResult::Done,
                        Err(e) => {
                            if matches!(e, StoreError::LeaseSettled(_)) {
                                tracing::info!(queue = %self.queue, consumer = %self.consumer,
                                    message = %ids[i], operation, error = %e,
                                    "a settlement came after its lease was settled otherwise");
                            } else {
                                tracing::warn!(queue = %self.queue, consumer = %self.consumer,
                                    message = %ids[i], operation, error = %e,
                                    "a settlement came after its lease ended; the message is (or will be) delivered again");
                            }
                            SettleResult::Refused(e)
                        }
                    };
                }
            }
            Err(e) => {
                tracing::error!(queue = %self.queue, consumer = %self.consumer, operation,
                    count = at.len(), error = %e,
                    "could not settle messages (a store fault): they stay leased until their lease expires, then are delivered again; backing off");
                self.store_fault(operation, at.len(), e);
            }
        }
    }

    /// The policy's bookkeeping of a store fault during `operation` on `count` messages.
    fn store_fault(&self, operation: &'static str, count: usize, e: StoreError) {
        self.engine.observe(Event::ConsumeStoreFault {
            queue: &self.queue,
            operation,
        });
        self.engine.signals().send(|| Signal::StoreFault {
            queue: self.queue.to_string(),
            operation,
            count,
        });
        self.fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(e);
    }

    fn take_fault(&self) -> Option<StoreError> {
        self.fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// Lease `queue`'s messages and hand them to `deliverer` until `stop`, settling what it
/// answers; then let its deliveries in flight finish ([`Deliverer::finish`]). `consumer`
/// names it in logs (`push`, `bridge NAME`). `Ok` when stopped; `Err` only for the
/// deliverer's own fault: store faults are backed off and survived (see the module).
pub async fn run<D: Deliverer>(
    engine: &Arc<Engine>,
    queue: &str,
    consumer: &str,
    mut deliverer: D,
    mut stop: watch::Receiver<bool>,
) -> Result<(), DelivererFault> {
    let settler = Settler::new(engine.clone(), queue, consumer);
    let mut backoff = BACKOFF_MIN;
    let result = loop {
        if *stop.borrow() {
            break Ok(());
        }
        let ask = tokio::select! {
            a = deliverer.admit() => a,
            _ = stop.changed() => break Ok(()),
        };
        let leased = tokio::select! {
            r = engine.lease(queue, ask.max.max(1), None, Some(ask.lease_ms), LEASE_WAIT_MS) => r,
            _ = stop.changed() => break Ok(()),
        };
        let step = match leased {
            Err(e) => {
                tracing::error!(queue = %queue, consumer = %consumer, operation = "lease",
                    error = %e, "could not lease (a store fault); backing off");
                settler.store_fault("lease", 0, e.clone());
                Err(ConsumeError::Store(e))
            }
            Ok(leased) if leased.is_empty() => Ok(()),
            Ok(leased) => match deliverer.deliver(leased, &settler).await {
                Ok(settle) => {
                    settler.settle(settle).await;
                    Ok(())
                }
                Err(cut) => {
                    settler.settle(cut.settle).await;
                    Err(ConsumeError::Deliverer(cut.fault))
                }
            },
        };
        // A store fault met meanwhile (here or by a delivery that ended since) backs off
        // too; a deliverer's fault still ends the driver.
        let fault = settler.take_fault();
        let step = match (step, fault) {
            (Ok(()), Some(e)) => Err(ConsumeError::Store(e)),
            (step, _) => step,
        };
        match step {
            Ok(()) => backoff = BACKOFF_MIN,
            Err(ConsumeError::Deliverer(fault)) => break Err(fault),
            Err(ConsumeError::Store(_)) => {
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => break Ok(()),
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    };
    deliverer.finish().await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EngineConfig, ManualClock, Observers, SignalReceiver};
    use crate::testing::FaultyStore;
    use redrive_core::{
        Backoff, Jitter, MessageId, NewMessage, QueueCatalog, QueueSettings, RetryPolicy, State,
        Timestamp,
    };
    use redrive_store_sqlite::{SqliteOptions, SqliteStore};
    use std::collections::HashMap;
    use tokio::sync::mpsc;

    const T0: i64 = 1_700_000_000_000;
    const LEASE_MS: u64 = 1_000;
    const WAIT: Duration = Duration::from_secs(20);

    /// An engine over a store that fails on demand, with retries 10 ms apart, on a manual
    /// clock (the scheduler is not running: the test ticks).
    fn engine(dir: &std::path::Path) -> (Arc<Engine>, Arc<FaultyStore>, Arc<ManualClock>) {
        let retry = RetryPolicy {
            max_attempts: 5,
            backoff: Backoff::Fixed,
            initial_delay_ms: 10,
            jitter: Jitter::None,
            ..RetryPolicy::default()
        };
        let catalog = QueueCatalog::new(
            QueueSettings {
                retry,
                ..QueueSettings::default()
            },
            HashMap::new(),
        );
        let mut opts = SqliteOptions::new(dir);
        opts.store.catalog = Arc::new(catalog.clone());
        let store = Arc::new(FaultyStore::new(Arc::new(SqliteStore::open(opts).unwrap())));
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
        let config = EngineConfig {
            catalog,
            ..EngineConfig::default()
        };
        let engine = Engine::new(store.clone(), config, Observers::none(), clock.clone()).unwrap();
        (Arc::new(engine), store, clock)
    }

    /// A deliverer that reports every message it is handed (id, attempt) and acks it; told
    /// to, it faults instead, handing the batch back.
    struct Recorder {
        seen: mpsc::UnboundedSender<(MessageId, u32)>,
        fault: bool,
    }

    impl Deliverer for Recorder {
        async fn admit(&mut self) -> LeaseAsk {
            LeaseAsk {
                max: 8,
                lease_ms: LEASE_MS,
            }
        }

        async fn deliver(
            &mut self,
            leased: Vec<Leased>,
            _settler: &Settler,
        ) -> Result<Vec<Settlement>, CutShort> {
            let mut settle = Vec::new();
            for l in leased {
                let _ = self.seen.send((l.message.id, l.attempt));
                let lease = LeaseRef {
                    id: l.message.id,
                    token: l.token,
                };
                settle.push(if self.fault {
                    Settlement::Release(Release::by_redrive(lease, Timestamp::EPOCH))
                } else {
                    Settlement::Ack(Ack::from(lease))
                });
            }
            if self.fault {
                return Err(CutShort {
                    fault: DelivererFault::new("the broker went away"),
                    settle,
                });
            }
            Ok(settle)
        }
    }

    async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
        tokio::time::timeout(WAIT, f)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
    }

    async fn settled(signals: &mut SignalReceiver) -> Signal {
        within(
            "a settled batch",
            signals.wait_for(|s| matches!(s, Signal::Settled { .. })),
        )
        .await
        .expect("engine gone")
    }

    async fn publish(engine: &Engine) -> MessageId {
        let p = engine
            .publish(vec![NewMessage::new("q", serde_json::json!({"n": 1}))])
            .await
            .unwrap();
        p[0].message.id
    }

    async fn state(engine: &Engine, id: MessageId) -> (State, u32) {
        let m = engine.store().get(id).await.unwrap().expect("the message");
        (m.state, m.attempts)
    }

    #[tokio::test]
    async fn a_store_fault_while_acking_is_survived_and_the_message_is_delivered_again_after_its_lease(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (engine, store, clock) = engine(dir.path());
        let mut signals = engine.signals().subscribe();
        let (seen, mut deliveries) = mpsc::unbounded_channel();
        let (stop, stop_rx) = watch::channel(false);
        let recorder = Recorder { seen, fault: false };
        let driver = tokio::spawn({
            let engine = engine.clone();
            async move { run(&engine, "q", "test", recorder, stop_rx).await }
        });
        store.fail_acks(1);
        let id = publish(&engine).await;
        assert_eq!(within("delivery 1", deliveries.recv()).await, Some((id, 1)));
        let fault = within(
            "the store fault",
            signals.wait_for(|s| matches!(s, Signal::StoreFault { .. })),
        )
        .await;
        assert_eq!(
            fault,
            Some(Signal::StoreFault {
                queue: "q".into(),
                operation: "ack",
                count: 1
            })
        );
        match settled(&mut signals).await {
            Signal::Settled {
                acked,
                failed,
                refused,
                ..
            } => assert_eq!((acked, failed, refused), (1, 1, 0)),
            other => panic!("{other:?}"),
        }
        assert_eq!(store.acks_failed(), 1);
        assert!(
            !driver.is_finished(),
            "a store fault does not end the driver"
        );
        assert_eq!(
            state(&engine, id).await,
            (State::Leased, 1),
            "its ack was lost: it stays leased until its lease expires"
        );
        // The lease expires (a failed attempt, retried 10 ms later): delivered again.
        clock.advance(LEASE_MS + 1);
        engine.tick().await.unwrap();
        clock.advance(10);
        engine.tick().await.unwrap();
        assert_eq!(within("delivery 2", deliveries.recv()).await, Some((id, 2)));
        match settled(&mut signals).await {
            Signal::Settled { acked, failed, .. } => assert_eq!((acked, failed), (1, 0)),
            other => panic!("{other:?}"),
        }
        assert_eq!(state(&engine, id).await, (State::Done, 2));
        stop.send(true).unwrap();
        assert_eq!(within("the driver's end", driver).await.unwrap(), Ok(()));
        assert_eq!(store.acks_failed(), 1);
        engine.store().close().await;
    }

    #[tokio::test]
    async fn a_store_fault_while_leasing_is_backed_off_and_the_driver_continues() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, store, _clock) = engine(dir.path());
        let mut signals = engine.signals().subscribe();
        let (seen, mut deliveries) = mpsc::unbounded_channel();
        let (stop, stop_rx) = watch::channel(false);
        store.fail_leases(2);
        let recorder = Recorder { seen, fault: false };
        let driver = tokio::spawn({
            let engine = engine.clone();
            async move { run(&engine, "q", "test", recorder, stop_rx).await }
        });
        for _ in 0..2 {
            let fault = within(
                "a lease fault",
                signals.wait_for(|s| matches!(s, Signal::StoreFault { .. })),
            )
            .await;
            assert!(
                matches!(
                    fault,
                    Some(Signal::StoreFault {
                        operation: "lease",
                        ..
                    })
                ),
                "{fault:?}"
            );
        }
        let id = publish(&engine).await;
        assert_eq!(
            within("the delivery", deliveries.recv()).await,
            Some((id, 1))
        );
        settled(&mut signals).await;
        assert_eq!(state(&engine, id).await, (State::Done, 1));
        assert_eq!(store.leases_failed(), 2);
        stop.send(true).unwrap();
        assert_eq!(within("the driver's end", driver).await.unwrap(), Ok(()));
        engine.store().close().await;
    }

    #[tokio::test]
    async fn a_deliverer_fault_ends_the_driver_after_settling_what_it_handed_back() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, _store, _clock) = engine(dir.path());
        let mut signals = engine.signals().subscribe();
        let (seen, mut deliveries) = mpsc::unbounded_channel();
        let (_stop, stop_rx) = watch::channel(false);
        let id = publish(&engine).await;
        let recorder = Recorder { seen, fault: true };
        let ended = within(
            "the driver's end",
            run(&engine, "q", "test", recorder, stop_rx),
        )
        .await;
        assert_eq!(ended, Err(DelivererFault::new("the broker went away")));
        assert_eq!(deliveries.recv().await, Some((id, 1)));
        match settled(&mut signals).await {
            Signal::Settled { released, .. } => assert_eq!(released, 1),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            state(&engine, id).await,
            (State::Ready, 0),
            "handed back uncharged, not left to its lease"
        );
        engine.store().close().await;
    }
}
