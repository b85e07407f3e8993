//! The one place that names a storage backend: open the store a [`Config`] asks for.
//!
//! Everything else in the server knows the store only as `Arc<dyn Store>`. Today the
//! embedded SQLite store in `data_dir` is the only backend the server opens.

use crate::{metrics::Metrics, Config, ServerError};
use redrive_storage::Store;
use redrive_store_sqlite::{SqliteOptions, SqliteStore};
use std::sync::Arc;

/// An open store, and the backend's name for the start-up line.
pub struct OpenedStore {
    /// The store.
    pub store: Arc<dyn Store>,
    /// The backend (`sqlite`).
    pub backend: &'static str,
}

/// Open the store `config` names, feeding the commit histograms of `metrics`.
pub fn open_store(config: &Config, metrics: &Arc<Metrics>) -> Result<OpenedStore, ServerError> {
    let observer_metrics = metrics.clone();
    let mut opts = SqliteOptions::new(&config.data_dir);
    opts.durability = config.durability.into();
    opts.store.catalog = Arc::new(config.catalog());
    opts.store.idempotency_window_ms = config.idempotency_window.ms();
    opts.max_wal_bytes = config.max_wal_bytes;
    opts.commit_observer = Some(Arc::new(move |n, secs| {
        observer_metrics.observe_commit(n, secs)
    }));
    let store = SqliteStore::open(opts).map_err(|source| ServerError::Store {
        dir: config.data_dir.clone(),
        source,
    })?;
    Ok(OpenedStore {
        store: Arc::new(store),
        backend: "sqlite",
    })
}
