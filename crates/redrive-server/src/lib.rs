//! The redrive server: engine, HTTP API, metrics and configuration.
//!
//! [`serve`] opens the embedded store, starts the [`engine::Engine`] (scheduler,
//! lease reaper, purge) and serves the HTTP API of SPEC §5 until SIGTERM or
//! SIGINT, then shuts down gracefully: stop accepting, let in-flight requests
//! finish within `shutdown_grace`, let the store commit what it queued, exit.
//!
//! Guarantees enforced here: a handler answers 2xx only after the store's
//! transition future resolved (so after the commit's fsync); bad input is
//! refused before anything reaches the store.

pub mod api;
pub mod config;
pub mod engine;
pub mod http;
pub mod metrics;
pub mod storage;
#[doc(hidden)]
pub mod testing;
pub mod ui;

pub use config::{Config, ConfigError, Overrides};

use std::future::Future;
use std::sync::Arc;

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration is unusable (message names the key).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Listening on a public address without a token, not explicitly allowed.
    #[error(
        "refusing to listen on {0} without any token (tokens or api_tokens): anyone who can reach it could read and delete messages. \
         Set [[tokens]] or api_tokens (REDRIVE_API_TOKENS), listen on 127.0.0.1, or set \
         dangerous_allow_unauthenticated_public_listen = true"
    )]
    PublicWithoutToken(std::net::SocketAddr),
    /// The store could not be opened.
    #[error("cannot open the store at {at}: {source}")]
    Store {
        /// Where: the data directory, or the PostgreSQL location (without a password).
        at: String,
        /// Why.
        source: redrive_storage::StoreError,
    },
    /// The listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Push delivery could not start (its HTTP client).
    #[error("push delivery: {0}")]
    Push(String),
    /// The HTTP server failed.
    #[error("http server failed: {0}")]
    Http(std::io::Error),
}

/// Open the store and build the engine for `config` (no listening yet).
pub async fn open(
    config: &Config,
) -> Result<(Arc<engine::Engine>, Arc<metrics::Metrics>), ServerError> {
    open_with_clock(config, Arc::new(engine::SystemClock::default())).await
}

/// [`open`], with the engine reading the time from `clock` (tests pass a
/// [`engine::ManualClock`]).
pub async fn open_with_clock(
    config: &Config,
    clock: Arc<dyn engine::Clock>,
) -> Result<(Arc<engine::Engine>, Arc<metrics::Metrics>), ServerError> {
    open_engine(config, clock, |store| store)
        .await
        .map(|(engine, metrics, _)| (engine, metrics))
}

/// [`open_with_clock`], also naming the store's backend (for the start-up line).
async fn open_engine(
    config: &Config,
    clock: Arc<dyn engine::Clock>,
    wrap: impl FnOnce(Arc<dyn redrive_storage::Store>) -> Arc<dyn redrive_storage::Store>,
) -> Result<(Arc<engine::Engine>, Arc<metrics::Metrics>, Opened), ServerError> {
    if config.is_unauthenticated_public_listen() {
        return Err(ServerError::PublicWithoutToken(config.listen));
    }
    let metrics = Arc::new(metrics::Metrics::new());
    let storage::OpenedStore {
        store,
        backend,
        location,
    } = storage::open_store(config, &metrics).await?;
    let store = wrap(store);
    let engine = Arc::new(
        engine::Engine::new(
            store,
            config.engine_config(),
            engine::Observers::none().with(metrics.clone()),
            clock,
        )
        .map_err(|e| ServerError::Push(e.to_string()))?,
    );
    Ok((engine, metrics, Opened { backend, location }))
}

/// Run the server until SIGTERM or SIGINT, then shut down gracefully.
pub async fn serve(config: Config) -> Result<(), ServerError> {
    serve_until(config, shutdown_signal()).await
}

/// Run the server until `shutdown` resolves, then shut down gracefully.
pub async fn serve_until(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    Server::bind(config).await?.run(shutdown).await
}

/// A server whose store is open and whose listener is bound, not yet serving.
#[derive(Debug)]
pub struct Server {
    config: Config,
    engine: Arc<engine::Engine>,
    metrics: Arc<metrics::Metrics>,
    listener: tokio::net::TcpListener,
    addr: std::net::SocketAddr,
    opened: Opened,
}

/// What the start-up line says of the store.
#[derive(Debug)]
struct Opened {
    backend: &'static str,
    location: String,
}

impl Server {
    /// Open the store and bind the listener (port 0 picks a free port).
    pub async fn bind(config: Config) -> Result<Server, ServerError> {
        Self::bind_with_clock(config, Arc::new(engine::SystemClock::default())).await
    }

    /// [`Server::bind`], with the engine reading the time from `clock`.
    pub async fn bind_with_clock(
        config: Config,
        clock: Arc<dyn engine::Clock>,
    ) -> Result<Server, ServerError> {
        Self::bind_wrapping_store(config, clock, |store| store).await
    }

    /// [`Server::bind_with_clock`], the engine built over `wrap`'s wrapper of the opened
    /// store: for tests that make the store fail ([`testing::FaultyStore`]).
    #[doc(hidden)]
    pub async fn bind_wrapping_store(
        config: Config,
        clock: Arc<dyn engine::Clock>,
        wrap: impl FnOnce(Arc<dyn redrive_storage::Store>) -> Arc<dyn redrive_storage::Store>,
    ) -> Result<Server, ServerError> {
        let mut config = config;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| ServerError::Bind {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(ServerError::Http)?;
        // The address bound (an ephemeral port resolved): the node's default name and the
        // address it announces to its cluster are made from it.
        config.listen = addr;
        let (engine, metrics, opened) = open_engine(&config, clock, wrap).await?;
        Ok(Server {
            config,
            engine,
            metrics,
            listener,
            addr,
            opened,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// The engine (its store, its signals), for tests and embedders.
    pub fn engine(&self) -> &Arc<engine::Engine> {
        &self.engine
    }

    /// Serve until `shutdown` resolves; then stop accepting, let in-flight requests finish
    /// (at most `shutdown_grace`), stop the background tasks and close the store.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let Server {
            config,
            engine,
            metrics,
            listener,
            addr,
            opened,
        } = self;
        // The start-up line (SPEC §6): where it listens, which store and where, the console,
        // and the queues the configuration names (`[queues.default]` is the settings of every
        // other queue, each created on first use).
        let queues: Vec<&str> = config
            .queues
            .keys()
            .map(String::as_str)
            .filter(|q| *q != "default")
            .collect();
        tracing::info!(
            %addr,
            store = %opened.backend,
            at = %opened.location,
            durability = ?config.durability,
            console = %console_url(addr),
            queues = ?queues,
            "redrive listening"
        );
        let background = engine.clone().start();
        let app = http::router(engine.clone(), metrics, Arc::new(config.clone()));
        let grace = std::time::Duration::from_millis(config.shutdown_grace.ms());
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stop_engine = engine.clone();
        let server = axum::serve(listener, app).with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutdown requested: no new connections, finishing in-flight requests");
            // Wake long-polling consumers so they answer (empty) now instead of at their deadline.
            stop_engine.begin_shutdown();
            let _ = stop_tx.send(true);
        });
        let mut stop_rx2 = stop_rx.clone();
        let result = tokio::select! {
            r = server => r.map_err(ServerError::Http),
            _ = async move {
                let _ = stop_rx2.wait_for(|s| *s).await;
                tokio::time::sleep(grace).await;
            } => {
                tracing::warn!(grace_ms = grace.as_millis() as u64, "in-flight requests did not finish within shutdown_grace; closing");
                Ok(())
            }
        };
        drop(stop_rx);
        background.stop().await;
        engine.store().close().await;
        tracing::info!("store flushed and closed; bye");
        result
    }
}

/// The console's URL for a server bound to `addr`: a wildcard address (`0.0.0.0`, `::`) is
/// shown as the loopback address of its family, which reaches it from the same machine.
pub fn console_url(addr: std::net::SocketAddr) -> String {
    format!("{}/ui", base_url(addr))
}

/// The base URL of a server bound to `addr` (`http://host:port`), a wildcard address shown
/// as the loopback address of its family ([`console_url`] is this plus `/ui`).
pub fn base_url(addr: std::net::SocketAddr) -> String {
    let mut shown = addr;
    if addr.ip().is_unspecified() {
        shown.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    format!("http://{shown}")
}

/// Resolves on SIGTERM or SIGINT.
///
/// The handlers are installed when this is called (inside a Tokio runtime), not when the
/// future is first polled: [`serve`] calls it before opening the store, so a SIGTERM that
/// arrives while the server starts, or right after its start-up line, is a graceful stop
/// instead of the signal's default action (the process killed on the spot).
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            let wait = |s: std::io::Result<tokio::signal::unix::Signal>| async move {
                match s {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = wait(term) => {},
                _ = wait(int) => {},
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::console_url;

    #[test]
    fn console_url_shows_a_wildcard_address_as_loopback() {
        assert_eq!(
            console_url("127.0.0.1:7070".parse().unwrap()),
            "http://127.0.0.1:7070/ui"
        );
        assert_eq!(
            console_url("0.0.0.0:8080".parse().unwrap()),
            "http://127.0.0.1:8080/ui"
        );
        assert_eq!(
            console_url("[::]:7070".parse().unwrap()),
            "http://[::1]:7070/ui"
        );
        assert_eq!(
            console_url("10.1.2.3:7070".parse().unwrap()),
            "http://10.1.2.3:7070/ui"
        );
    }
}
