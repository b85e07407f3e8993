//! The storage section: what the embedded store is opened with. `data_dir`, `durability`,
//! `idempotency_window` and `max_wal_bytes` are top-level keys of [`Config`]; with the queue
//! catalog (`Config::catalog`) they make the store's options in [`crate::open`]. What the
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

impl Config {
    /// The storage keys, checked (the error names the key).
    pub(super) fn check_storage(&self) -> Result<(), ConfigError> {
        if self.max_wal_bytes < MIN_MAX_WAL_BYTES {
            return Err(ConfigError::Value {
                key: "max_wal_bytes".into(),
                reason: "must be at least 1048576 (1 MiB)".into(),
            });
        }
        Ok(())
    }
}
