//! The storage section: which store, and what it is opened with. `storage_url` (absent: the
//! embedded store; `postgres://…`: PostgreSQL; `mysql://…`: MySQL or MariaDB),
//! `storage_schema` and `storage_notify` (PostgreSQL), `storage_pool_size` (both), `data_dir`, `durability` and `max_wal_bytes` (the embedded store) and
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
    /// MySQL or MariaDB at this URL (redrive's tables in the database it names).
    Mysql(String),
}

impl Config {
    /// The store `storage_url` names (checked by `check_storage`).
    pub fn storage_kind(&self) -> StorageKind {
        match &self.storage_url {
            Some(url) if !url.trim().is_empty() => {
                let url = url.trim().to_owned();
                if url.starts_with("mysql://") {
                    StorageKind::Mysql(url)
                } else {
                    StorageKind::Postgres(url)
                }
            }
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
                Some("mysql") => {
                    if !mysql_names_database(url) {
                        return Err(ConfigError::Value {
                            key: "storage_url".into(),
                            reason: "a mysql:// URL must name the database redrive keeps its tables in: mysql://user@host:3306/DATABASE (create it first)".into(),
                        });
                    }
                }
                Some("mariadb") => {
                    return Err(ConfigError::Value {
                        key: "storage_url".into(),
                        reason: "MariaDB is reached with a mysql://user@host:3306/database URL".into(),
                    })
                }
                _ => {
                    return Err(ConfigError::Value {
                        key: "storage_url".into(),
                        reason: "must be a postgres://… or mysql://… URL (leave it out for the embedded store in data_dir)".into(),
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

/// Whether a `mysql://` URL has a database path (`mysql://h:3306/db`, not `mysql://h:3306/`).
fn mysql_names_database(url: &str) -> bool {
    let rest = url.split_once("://").map_or("", |(_, r)| r);
    let path = rest.split_once('/').map_or("", |(_, p)| p);
    let db = path.split_once('?').map_or(path, |(d, _)| d);
    !db.is_empty()
}

#[cfg(test)]
mod tests {
    use super::super::tests::load;
    use super::StorageKind;

    #[test]
    fn storage_url_names_the_backend() {
        let c = load("", &[]).unwrap();
        assert_eq!(c.storage_kind(), StorageKind::Embedded);
        let c = load("storage_url = \"postgres://root@127.0.0.1/test\"", &[]).unwrap();
        assert!(matches!(c.storage_kind(), StorageKind::Postgres(_)));
        let c = load(
            "",
            &[("REDRIVE_STORAGE_URL", "mysql://root@127.0.0.1:3306/app")],
        )
        .unwrap();
        assert_eq!(
            c.storage_kind(),
            StorageKind::Mysql("mysql://root@127.0.0.1:3306/app".to_owned())
        );
    }

    #[test]
    fn a_bad_storage_url_is_refused_naming_the_key() {
        for (url, says) in [
            ("mysql://root@127.0.0.1:3306/", "must name the database"),
            ("mysql://root@127.0.0.1:3306", "must name the database"),
            ("mariadb://root@127.0.0.1/app", "mysql://"),
            ("redis://127.0.0.1", "postgres://… or mysql://…"),
        ] {
            let e = load(&format!("storage_url = {url:?}"), &[])
                .unwrap_err()
                .to_string();
            assert!(e.contains("storage_url") && e.contains(says), "{url}: {e}");
        }
    }
}
