//! What every backend is opened with, apart from its own settings (SQLite: the data
//! directory and the WAL bound; PostgreSQL: the URL, the schema, the pool size), and the
//! limits a shared store's transactional enqueue from SQL checks ([`SqlPublishLimits`]).

use redrive_core::QueueCatalog;
use std::sync::Arc;

/// Called after each commit with (message transitions in it, seconds in COMMIT).
pub type CommitObserver = Arc<dyn Fn(usize, f64) + Send + Sync>;

/// The options every backend shares.
#[derive(Clone)]
pub struct StoreOptions {
    /// Per-queue settings the transitions decide with (retry policy, ordering, …).
    pub catalog: Arc<QueueCatalog>,
    /// How long an idempotency key is remembered, ms.
    pub idempotency_window_ms: u64,
    /// Seed of the store's generator (retry jitter, lease nonces); random when `None`.
    /// Lease tokens stay unique across opens whatever the seed.
    pub seed: Option<u64>,
    /// Told of every commit (the server's commit histograms).
    pub commit_observer: Option<CommitObserver>,
}

impl std::fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreOptions")
            .field("catalog", &self.catalog)
            .field("idempotency_window_ms", &self.idempotency_window_ms)
            .field("seed", &self.seed)
            .field("commit_observer", &self.commit_observer.is_some())
            .finish()
    }
}

/// The default idempotency window: 24 h.
pub const DEFAULT_IDEMPOTENCY_WINDOW_MS: u64 = 24 * 3_600_000;

impl Default for StoreOptions {
    /// Default queue settings, a 24 h idempotency window, a random seed.
    fn default() -> Self {
        Self {
            catalog: Arc::new(QueueCatalog::default()),
            idempotency_window_ms: DEFAULT_IDEMPOTENCY_WINDOW_MS,
            seed: None,
            commit_observer: None,
        }
    }
}

/// The limits a shared store's transactional enqueue from SQL checks (PostgreSQL's
/// `<schema>.publish(…)`, MySQL's `redrive_publish(…)`): the server's own
/// (`max_payload_bytes`, `max_header_bytes`, `max_schedule_ahead`), recorded in the
/// database at open so that the database can check what the HTTP publish checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SqlPublishLimits {
    /// Largest payload, bytes of its JSON text.
    pub max_payload_bytes: u64,
    /// Largest headers object, bytes of its JSON text.
    pub max_header_bytes: u64,
    /// Longest `delay`, ms.
    pub max_schedule_ahead_ms: u64,
}

impl Default for SqlPublishLimits {
    /// The server's defaults: 1 MiB payloads, 16 KiB of headers, 365 days ahead.
    fn default() -> Self {
        Self {
            max_payload_bytes: 1 << 20,
            max_header_bytes: 16 << 10,
            max_schedule_ahead_ms: 365 * 86_400_000,
        }
    }
}
