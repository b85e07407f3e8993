//! The one place that names a storage backend: open the store a [`Config`] asks for.
//!
//! Everything else in the server knows the store only as `Arc<dyn Store>`. `storage_url`
//! absent: the embedded SQLite store in `data_dir`; `postgres://…`: PostgreSQL, its tables in
//! schema `storage_schema` (created and migrated at open); `mysql://…`: MySQL or MariaDB, its
//! tables in the database the URL names (created and migrated at open).

use crate::config::StorageKind;
use crate::{metrics::Metrics, Config, ServerError};
use redrive_storage::{SqlPublishLimits, Store, StoreOptions};
use redrive_store_mysql::{MysqlOptions, MysqlStore};
use redrive_store_postgres::{PostgresOptions, PostgresStore};
use redrive_store_sqlite::{SqliteOptions, SqliteStore};
use std::sync::Arc;

/// An open store, and what the start-up line says of it.
pub struct OpenedStore {
    /// The store.
    pub store: Arc<dyn Store>,
    /// The backend (`sqlite`, `postgres`, `mysql`).
    pub backend: &'static str,
    /// Where: the data directory, the PostgreSQL host, database and schema, or the MySQL
    /// host and database (never a password).
    pub location: String,
}

/// The options every backend shares, from `config`; commits feed the histograms of
/// `metrics`.
fn shared(config: &Config, metrics: &Arc<Metrics>) -> StoreOptions {
    let metrics = metrics.clone();
    StoreOptions {
        catalog: Arc::new(config.catalog()),
        idempotency_window_ms: config.idempotency_window.ms(),
        seed: None,
        commit_observer: Some(Arc::new(move |n, secs| metrics.observe_commit(n, secs))),
    }
}

/// What a publish from SQL checks (PostgreSQL's `publish(…)`, MySQL's `redrive_publish(…)`):
/// the HTTP publish's own limits.
fn sql_publish_limits(config: &Config) -> SqlPublishLimits {
    SqlPublishLimits {
        max_payload_bytes: config.max_payload_bytes as u64,
        max_header_bytes: config.max_header_bytes as u64,
        max_schedule_ahead_ms: config.max_schedule_ahead.ms(),
    }
}

/// Open the store `config` names, feeding the commit histograms of `metrics`.
pub async fn open_store(
    config: &Config,
    metrics: &Arc<Metrics>,
) -> Result<OpenedStore, ServerError> {
    match config.storage_kind() {
        StorageKind::Embedded => {
            let mut opts = SqliteOptions::new(&config.data_dir);
            opts.durability = config.durability.into();
            opts.store = shared(config, metrics);
            opts.max_wal_bytes = config.max_wal_bytes;
            let location = config.data_dir.display().to_string();
            let store = SqliteStore::open(opts).map_err(|source| ServerError::Store {
                at: location.clone(),
                source,
            })?;
            Ok(OpenedStore {
                store: Arc::new(store),
                backend: "sqlite",
                location,
            })
        }
        StorageKind::Postgres(url) => {
            let mut opts = PostgresOptions::new(url.clone());
            opts.schema = config.storage_schema.clone();
            opts.pool_size = config.storage_pool_size;
            opts.notify = config.storage_notify;
            opts.store = shared(config, metrics);
            // What the SQL function publish(…) checks: the HTTP publish's own limits.
            opts.sql_publish = sql_publish_limits(config);
            let location = format!("{} schema {}", redact(&url), config.storage_schema);
            let store = PostgresStore::open(opts)
                .await
                .map_err(|source| ServerError::Store {
                    at: location.clone(),
                    source,
                })?;
            if store.synchronous_commit_off() {
                tracing::warn!(
                    "PostgreSQL runs with synchronous_commit = off for redrive's role or database: \
                     a commit is answered before it reaches the disk, so a 2xx can be lost in a \
                     crash of PostgreSQL's machine (SPEC §4 needs it on). Set synchronous_commit = on"
                );
            }
            Ok(OpenedStore {
                store: Arc::new(store),
                backend: "postgres",
                location,
            })
        }
        StorageKind::Mysql(url) => {
            let mut opts = MysqlOptions::new(url.clone());
            opts.pool_size = config.storage_pool_size;
            opts.store = shared(config, metrics);
            // What the procedure redrive_publish(…) checks: the HTTP publish's own limits.
            opts.sql_publish = sql_publish_limits(config);
            let location = redact(&url);
            let store = MysqlStore::open(opts)
                .await
                .map_err(|source| ServerError::Store {
                    at: location.clone(),
                    source,
                })?;
            if let Some(why) = store.durability_weakened() {
                tracing::warn!(
                    "{} is not set up for durable commits: {why}. A 2xx from redrive can then be \
                     lost in a crash of the database's machine (SPEC §4 needs every acknowledged \
                     write on disk). Set innodb_flush_log_at_trx_commit = 1 (and sync_binlog = 1 \
                     where binary logs are on)",
                    if store.server_version().contains("MariaDB") {
                        "MariaDB"
                    } else {
                        "MySQL"
                    }
                );
            }
            Ok(OpenedStore {
                store: Arc::new(store),
                backend: "mysql",
                location,
            })
        }
    }
}

/// A URL without its password (`postgres://user:secret@host/db` → `postgres://user@host/db`).
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(a connection string)".to_owned();
    };
    let (auth, host) = match rest.rsplit_once('@') {
        Some((auth, host)) => (Some(auth), host),
        None => (None, rest),
    };
    let host = host.split_once('?').map_or(host, |(h, _)| h);
    match auth {
        Some(a) => format!("{scheme}://{}@{host}", a.split(':').next().unwrap_or("")),
        None => format!("{scheme}://{host}"),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn a_logged_url_has_no_password() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/prod?sslmode=disable"),
            "postgres://app@db:5432/prod"
        );
        assert_eq!(
            redact("postgres://root@127.0.0.1/test"),
            "postgres://root@127.0.0.1/test"
        );
        assert_eq!(
            redact("mysql://root:pw@127.0.0.1:3306/test"),
            "mysql://root@127.0.0.1:3306/test"
        );
        assert_eq!(redact("host=db password=x"), "(a connection string)");
    }
}
