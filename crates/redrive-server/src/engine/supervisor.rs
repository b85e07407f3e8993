//! The supervisor: every background service of a node, where it runs in a cluster, and a
//! restart when one panics.
//!
//! Each service module names its services ([`Service`]: a name, a [`Placement`], and how to
//! run it), and [`super::scheduler::start`] hands them all to [`supervise`]. A service runs
//! until the node stops; one that panics is logged, announced
//! ([`super::Signal::ServiceRestarted`]) and started again after [`RESTART_DELAY`], so a bug
//! in one loop (a purge, a bridge) does not silently end it for the life of the process.
//! What it had leased comes back after its lease, as after a crash.
//!
//! | service | placement | what |
//! |---|---|---|
//! | `heartbeat` | every node | beats, stands for leadership ([`super::cluster`]) |
//! | `scheduler` | every node | promotes due messages, expires leases (the store's tick is safe on several nodes at once) |
//! | `ready-elsewhere` | every node | wakes long polls for messages made ready by another node |
//! | `push:<queue>`, `push-rank`, `push-trips` | every node | push delivery, its share of cluster-wide limits, the shared breaker |
//! | `bridge:<name>` | every node | a bridge's intake and republish |
//! | `alerts` | every node; thresholds on the leader | dead-letter alerts of this node's deaths; backlog and age levels once |
//! | `tasks` | leader | bulk tasks, page by page under the leader's fence |
//! | `purge` | leader | deletes done messages past retention, expired idempotency records |
//!
//! HTTP and the consumers' long polls are not background services: every node serves
//! them.

use super::{Engine, Signal};
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long a service that panicked waits before it is started again.
pub const RESTART_DELAY: Duration = Duration::from_secs(1);

/// Where a service does its work in a cluster of nodes on one store (SPEC §13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On every node at once: safe, or each node does its own share.
    EveryNode,
    /// Runs on every node and acts only while this node leads
    /// ([`super::cluster::Membership::leads`]): once in the cluster.
    Leader,
}

impl Placement {
    /// `every_node` or `leader`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EveryNode => "every_node",
            Self::Leader => "leader",
        }
    }
}

/// How a service is run: a future until `stop` turns true.
type Run = Arc<dyn Fn(Arc<Engine>, watch::Receiver<bool>) -> BoxFuture<'static, ()> + Send + Sync>;

/// One background service.
#[derive(Clone)]
pub struct Service {
    /// Its name in logs and signals (`push:<queue>`, `bridge:<name>`, `purge` …).
    pub name: String,
    /// Where it acts.
    pub placement: Placement,
    run: Run,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("name", &self.name)
            .field("placement", &self.placement)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// A service named `name` that `run` runs until its stop receiver turns true.
    pub fn new<F>(
        name: impl Into<String>,
        placement: Placement,
        run: impl Fn(Arc<Engine>, watch::Receiver<bool>) -> F + Send + Sync + 'static,
    ) -> Self
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        Self {
            name: name.into(),
            placement,
            run: Arc::new(move |e, s| Box::pin(run(e, s))),
        }
    }
}

/// Run `service` on its own task until `stop`; start it again when it panics.
pub fn supervise(
    engine: Arc<Engine>,
    service: Service,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let run = tokio::spawn((service.run)(engine.clone(), stop.clone()));
            match run.await {
                // It returned: the node stops (or the service has nothing to do).
                Ok(()) => return,
                Err(e) if e.is_panic() => {
                    tracing::error!(service = %service.name, placement = service.placement.as_str(),
                        "background service panicked; starting it again in {RESTART_DELAY:?}");
                    engine.signals().send(|| Signal::ServiceRestarted {
                        service: service.name.clone(),
                    });
                }
                // Cancelled: the runtime is shutting down.
                Err(_) => return,
            }
            if *stop.borrow() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(RESTART_DELAY) => {}
                _ = stop.changed() => return,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EngineConfig, ManualClock, Observers};
    use redrive_core::Timestamp;
    use redrive_store_sqlite::{SqliteOptions, SqliteStore};
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn a_service_that_panics_is_started_again_and_stops_with_the_node() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SqliteStore::open(SqliteOptions::new(dir.path())).unwrap());
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000)));
        let engine = Arc::new(
            Engine::new(store, EngineConfig::default(), Observers::none(), clock).unwrap(),
        );
        let mut signals = engine.signals().subscribe();
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        let flaky = Service::new(
            "flaky",
            Placement::EveryNode,
            move |_engine, mut stop: watch::Receiver<bool>| {
                let run = counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    assert!(run > 0, "the first run fails");
                    let _ = stop.wait_for(|s| *s).await;
                }
            },
        );
        let (stop, stop_rx) = watch::channel(false);
        let task = supervise(engine.clone(), flaky, stop_rx);
        let restarted = tokio::time::timeout(
            Duration::from_secs(10),
            signals.wait_for(|s| matches!(s, Signal::ServiceRestarted { .. })),
        )
        .await
        .expect("a restart is announced");
        assert_eq!(
            restarted,
            Some(Signal::ServiceRestarted {
                service: "flaky".into()
            })
        );
        // Started again after the delay, and it runs until the stop.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while runs.load(Ordering::SeqCst) < 2 {
            assert!(tokio::time::Instant::now() < deadline, "not started again");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!task.is_finished());
        stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the supervisor ends with the node")
            .unwrap();
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "no further start after the stop"
        );
        engine.store().close().await;
    }
}
