//! Test signals: events the engine announces so tests wait on them instead of sleeping.
//!
//! In the manner of River's test signals: a consumer that parks in a long poll, a finished
//! scheduler tick, a finished purge. Nothing is sent (and nothing allocated) while nobody
//! subscribes, so production pays one atomic load per event.

use tokio::sync::broadcast;

/// Events buffered per subscriber; a subscriber that falls further behind sees `Lagged`.
const SIGNAL_BUFFER: usize = 1_024;

/// Something the engine did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Signal {
    /// A consumer found nothing to lease and now waits for `queue` to get ready messages.
    Parked {
        /// The queue it waits on.
        queue: String,
    },
    /// A scheduler tick committed.
    Ticked {
        /// Queues in which messages became ready.
        ready_queues: Vec<String>,
        /// Leases that expired in it.
        expired: usize,
    },
    /// A purge step committed.
    Purged {
        /// Done messages deleted.
        done_deleted: u64,
    },
    /// One of the server's own consumers (push, a bridge: see `engine::consume`) settled a
    /// batch of `queue`'s messages.
    Settled {
        /// The queue.
        queue: String,
        /// Acks in the batch.
        acked: usize,
        /// Nacks in the batch.
        nacked: usize,
        /// Releases in the batch.
        released: usize,
        /// Settlements the store refused (the lease had ended).
        refused: usize,
        /// Settlements lost to a store fault (delivered again after their lease).
        failed: usize,
    },
    /// One of the server's own consumers met a store fault: it backs off and continues.
    StoreFault {
        /// The queue.
        queue: String,
        /// `lease`, `ack`, `nack` or `release`.
        operation: &'static str,
        /// Messages the failed call concerned (0 for a lease).
        count: usize,
    },
    /// The alert notifier finished an evaluation.
    AlertsChecked {
        /// Alerts it published into sink queues (not counting replays of earlier ones).
        published: usize,
    },
    /// A background service panicked and is started again ([`super::supervisor`]).
    ServiceRestarted {
        /// The service's name.
        service: String,
    },
    /// This node began or stopped leading its cluster ([`super::cluster`]).
    Leadership {
        /// Whether it leads now.
        leads: bool,
        /// Its leadership's epoch (0 when it does not lead).
        epoch: u64,
    },
}

/// The engine's signal sender.
#[derive(Debug)]
pub struct Signals {
    tx: broadcast::Sender<Signal>,
}

impl Default for Signals {
    fn default() -> Self {
        Self {
            tx: broadcast::channel(SIGNAL_BUFFER).0,
        }
    }
}

impl Signals {
    /// Receive every signal sent from now on.
    pub fn subscribe(&self) -> SignalReceiver {
        SignalReceiver {
            rx: self.tx.subscribe(),
        }
    }

    /// Send the signal `make` builds, if anybody listens.
    pub(crate) fn send(&self, make: impl FnOnce() -> Signal) {
        if self.tx.receiver_count() > 0 {
            let _ = self.tx.send(make());
        }
    }
}

/// A subscription to [`Signals`].
#[derive(Debug)]
pub struct SignalReceiver {
    rx: broadcast::Receiver<Signal>,
}

impl SignalReceiver {
    /// Wait for the next signal that `pred` accepts, and return it. `None` if the engine is
    /// gone.
    pub async fn wait_for(&mut self, mut pred: impl FnMut(&Signal) -> bool) -> Option<Signal> {
        loop {
            match self.rx.recv().await {
                Ok(s) if pred(&s) => return Some(s),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// Wait until a consumer parks on `queue`.
    pub async fn parked(&mut self, queue: &str) {
        self.wait_for(|s| matches!(s, Signal::Parked { queue: q } if q == queue))
            .await;
    }

    /// Wait until a scheduler tick commits.
    pub async fn ticked(&mut self) -> Option<Signal> {
        self.wait_for(|s| matches!(s, Signal::Ticked { .. })).await
    }
}
