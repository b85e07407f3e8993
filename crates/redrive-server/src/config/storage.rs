//! The storage section: which store, and what it is opened with. `storage_url` (absent: the
//! embedded store; `postgres://…`: PostgreSQL), `storage_schema`, `storage_pool_size` and
//! `storage_notify` (PostgreSQL), `data_dir`, `durability` and `max_wal_bytes` (the embedded store) and
//! `idempotency_window` are top-level keys of [`Config`]; with the queue catalog
//! (`Config::catalog`) they make the store's options in `crate::storage::open_store`. What the
//! store's own crate decides for them (the `max_wal_bytes` default and floor, the
//! durability modes) is taken from it here.
//!
//! This is the only file of the configuration that names a store crate.

use super::{Config, ConfigError};
use redrive_store_sqlite::{Durability, DEFAULT_MAX_WAL_BYTES, MIN_MAX_WAL_BYTES};
use serde::{Deserialize, Serialize};

/// `durability` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DurabilityName {
    /// fsync every commit (default).
    #[default]
    Fsync,
    /// No fsync: a 2xx may be lost in an OS crash or power loss.
    UnsafeBuffered,
}

impl From<DurabilityName> for Durability {
    fn from(d: DurabilityName) -> Self {
        match d {
            DurabilityName::Fsync => Durability::Fsync,
            DurabilityName::UnsafeBuffered => Durability::UnsafeBuffered,
        }
    }
}

/// `max_wal_bytes` when the config leaves it out: the store's own default.
pub(super) fn default_max_wal_bytes() -> u64 {
    DEFAULT_MAX_WAL_BYTES
}

/// Which store a configuration names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageKind {
    /// The embedded store in `data_dir`.
    Embedded,
    /// PostgreSQL at this URL.
    Postgres(String),
}

impl Config {
    /// The store `storage_url` names (checked by `check_storage`).
    pub fn storage_kind(&self) -> StorageKind {
        match &self.storage_url {
            Some(url) if !url.trim().is_empty() => StorageKind::Postgres(url.trim().to_owned()),
            _ => StorageKind::Embedded,
        }
    }

    /// The storage keys, checked (the error names the key).
    pub(super) fn check_storage(&self) -> Result<(), ConfigError> {
        if let Some(url) = self.storage_url.as_deref().map(str::trim) {
            let scheme = url.split_once("://").map(|(s, _)| s);
            match scheme {
                _ if url.is_empty() => {}
                Some("postgres" | "postgresql") => {}
                Some("mysql" | "mariadb") => {
                    return Err(ConfigError::Value {
                        key: "storage_url".into(),
                        reason: "MySQL and MariaDB are not supported yet: use postgres://… or leave storage_url out for the embedded store".into(),
                    })
                }
                _ => {
                    return Err(ConfigError::Value {
                        key: "storage_url".into(),
                        reason: "must be a postgres://… URL (leave it out for the embedded store in data_dir)".into(),
                    })
                }
            }
        }
        if !redrive_store_postgres::valid_schema_name(&self.storage_schema) {
            return Err(ConfigError::Value {
                key: "storage_schema".into(),
                reason: "must be lower-case ASCII letters, digits and _ (at most 63, not starting with a digit)".into(),
            });
        }
        if self.storage_pool_size == 0 || self.storage_pool_size > 1_000 {
            return Err(ConfigError::Value {
                key: "storage_pool_size".into(),
                reason: "must be between 1 and 1000".into(),
            });
        }
        if self.max_wal_bytes < MIN_MAX_WAL_BYTES {
            return Err(ConfigError::Value {
                key: "max_wal_bytes".into(),
                reason: "must be at least 1048576 (1 MiB)".into(),
            });
        }
        Ok(())
    }
}
