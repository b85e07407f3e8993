//! Background services: the scheduler (promotion of due messages and the lease
//! reaper, one loop, on every node of a cluster) and the purger (on the leader only), and
//! the start of every service of the node under the [`super::supervisor`].
//!
//! The scheduler does not poll. The store publishes a *wake hint* — the
//! earliest scheduled due time or lease expiry it knows of — and the scheduler
//! sleeps exactly until then (or until a write makes the hint earlier), calls
//! [`redrive_storage::Store::tick`], wakes the consumers of every queue that
//! got ready messages, and sleeps again until the tick's answer. Memory holds
//! one timestamp, whatever the number of scheduled messages.

use super::supervisor::{supervise, Placement, Service};
use super::Engine;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Ticks are at least this far apart: when messages fall due every few microseconds,
/// one tick per millisecond promotes them in batches instead of one commit each.
/// It bounds the scheduler's own lateness contribution to about 1 ms.
const MIN_TICK_INTERVAL: Duration = Duration::from_millis(1);

/// After a failed tick (e.g. a poisoned store) wait this long before trying again.
const TICK_RETRY_DELAY: Duration = Duration::from_secs(1);

/// Handles of the background tasks.
#[derive(Debug)]
pub struct Background {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// The heartbeat, stopped after the others: the node leaves its cluster once its
    /// leader-only services have stopped.
    heartbeat: (watch::Sender<bool>, JoinHandle<()>),
}

impl Background {
    /// Stop the tasks and wait for them; then stop the heartbeat (the node leaves).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        let (stop, task) = self.heartbeat;
        let _ = stop.send(true);
        let _ = task.await;
    }
}

/// Every background service of this node but the heartbeat: the scheduler, the purger,
/// the bulk tasks' runner, push delivery, the bridges and the alert notifier (the table in
/// [`super::supervisor`] says where each acts).
pub fn services(engine: &Engine) -> Vec<Service> {
    let mut services = vec![
        Service::new("scheduler", Placement::EveryNode, scheduler_loop),
        Service::new(
            "ready-elsewhere",
            Placement::EveryNode,
            ready_elsewhere_loop,
        ),
        Service::new("tasks", Placement::Leader, super::tasks::run),
        Service::new("purge", Placement::Leader, purge_loop),
    ];
    services.extend(super::push::services(engine));
    services.extend(super::bridge::services(engine));
    services.extend(super::alerts::services(engine));
    services
}

/// Start the heartbeat and every service of [`services`], each under the supervisor.
pub fn start(engine: Arc<Engine>) -> Background {
    let (stop, stop_rx) = watch::channel(false);
    let (beat_stop, beat_stop_rx) = watch::channel(false);
    let beat = Service::new("heartbeat", Placement::EveryNode, super::cluster::run);
    let heartbeat = (beat_stop, supervise(engine.clone(), beat, beat_stop_rx));
    let tasks = services(&engine)
        .into_iter()
        .map(|s| supervise(engine.clone(), s, stop_rx.clone()))
        .collect();
    Background {
        stop,
        tasks,
        heartbeat,
    }
}

async fn scheduler_loop(engine: Arc<Engine>, mut stop: watch::Receiver<bool>) {
    let mut hint = engine.store().notifier().due();
    let mut last_tick = std::time::Instant::now() - MIN_TICK_INTERVAL;
    let clock = engine.clock().clone();
    loop {
        if *stop.borrow() {
            return;
        }
        let next = *hint.borrow_and_update();
        let now = clock.now();
        match next {
            Some(at) if at <= now => {
                let since = last_tick.elapsed();
                if since < MIN_TICK_INTERVAL {
                    tokio::select! {
                        _ = tokio::time::sleep(MIN_TICK_INTERVAL - since) => {}
                        _ = stop.changed() => return,
                    }
                }
                last_tick = std::time::Instant::now();
                if let Err(e) = engine.tick().await {
                    tracing::error!(error = %e, "scheduler tick failed");
                    tokio::select! {
                        _ = tokio::time::sleep(TICK_RETRY_DELAY) => {}
                        _ = stop.changed() => return,
                    }
                }
                // The tick set the hint to its exact next wake; loop to read it.
                // If the hint did not change (it can only be an earlier value written
                // concurrently), the next iteration handles it.
            }
            Some(at) => {
                tokio::select! {
                    _ = clock.sleep_until(at) => {}
                    r = hint.changed() => if r.is_err() { return },
                    _ = stop.changed() => return,
                }
            }
            None => {
                tokio::select! {
                    r = hint.changed() => if r.is_err() { return },
                    _ = stop.changed() => return,
                }
            }
        }
    }
}

/// Wake the long polls of a queue in which another process sharing the store made
/// messages ready ([`redrive_storage::Notifier::ready`]; the embedded store never sends).
async fn ready_elsewhere_loop(engine: Arc<Engine>, mut stop: watch::Receiver<bool>) {
    let mut ready = engine.store().notifier().ready();
    loop {
        tokio::select! {
            r = ready.recv() => match r {
                Ok(n) => engine.wake_queue(&n.queue, n.count as usize),
                // Missed notices: wake everyone once, each re-checks its queue.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => engine.wake_all(),
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
            _ = stop.changed() => return,
        }
    }
}

async fn purge_loop(engine: Arc<Engine>, mut stop: watch::Receiver<bool>) {
    let every = Duration::from_millis(engine.config().purge_interval_ms.max(1_000));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        // Once per cluster: the leader purges.
        while engine.membership().leads() {
            match engine.purge().await {
                Ok(more) if more => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::error!(error = %e, "purge failed");
                    break;
                }
            }
        }
    }
}
