//! Configuration: built-in defaults ← TOML file ← `REDRIVE_*` environment ← flags.
//!
//! Every key, its default and its meaning is in `redrive.example.toml` at the
//! repository root. A bad key or value is refused at start with an error that
//! names it (`deny_unknown_fields` everywhere).
//!
//! The configuration is data: it names no HTTP type and imports nothing from `api` (the
//! API builds what it needs from it: `api::auth::Tokens` from the tokens, its answer budget
//! from [`message_bound_bytes`]). It knows the engine only to translate a section into the
//! engine's settings ([`Config::engine_config`]). One file per section, each with its raw
//! structs, its checks and its translation (the top-level keys are fields of [`Config`],
//! checked in the file of their section):
//!
//! - this file: [`Config`], its defaults, [`Config::load`] (file ← environment ← flags),
//!   [`ConfigError`], the order of [`Config::validate`], [`Config::engine_config`];
//! - `storage.rs`: which store and what it is opened with (`storage_url`, `storage_schema`,
//!   `storage_pool_size`, `storage_notify`, `data_dir`, `durability`, `idempotency_window`, `max_wal_bytes`),
//!   the one file that names a store crate;
//! - `http.rs`: `listen`, the refusal of a public listen without a token, `allowed_hosts`,
//!   `allowed_origins`;
//! - `limits.rs`: `max_*_bytes`, `max_batch`, `max_wait`, `max_lease`, `max_schedule_ahead`,
//!   and the message bound `max_response_bytes` must hold;
//! - `tokens.rs`: `api_tokens`, `[[tokens]]` and the scope vocabulary ([`Scope`]);
//! - `queues.rs`: `[queues.NAME]` (policy, ordering, lease, `delivery`) and the catalog;
//! - `push.rs`: `[push]` and `[queues.NAME.push]` with its rules;
//! - `bridges.rs`: `[bridges.rabbitmq.NAME]`, `[bridges.redis_streams.NAME]`;
//! - `alerts.rs`: `[alerts]`, its sinks and thresholds;
//! - `cluster.rs`: `[cluster]`, this node's name, heartbeat and leadership lease.

use crate::engine::{EngineConfig, DEFAULT_LEASE_MS};
use redrive_core::DurationMs;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

mod alerts;
mod bridges;
mod cluster;
mod http;
mod limits;
mod push;
mod queues;
mod storage;
mod tokens;

pub use alerts::{AlertSinkConfig, AlertThresholdsConfig, AlertsConfig};
pub use bridges::{BridgesConfig, RabbitBridgeConfig, RedisBridgeConfig};
pub use cluster::ClusterConfig;
pub use limits::{
    message_bound_bytes, MAX_KEY_CHARS, MAX_SCHEDULE_AHEAD_CEILING_MS, MESSAGE_FIXED_BYTES,
    MIN_ERROR_MESSAGE_BYTES,
};
pub use push::{
    PushQueueConfig, PushRuleConfig, PushServerConfig, SecretList, DEFAULT_CONNECT_TIMEOUT_MS,
};
pub use queues::{Delivery, QueueConfig};
pub use storage::{DurabilityName, StorageKind};
pub use tokens::{Scope, TokenConfig};

/// A configuration that cannot be used. The message names the key, flag or variable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file, an environment variable or a flag has a bad key or value.
    #[error("{origin}: {message}")]
    Invalid {
        /// Where: the file, `environment` or `flags`.
        origin: String,
        /// What, naming the key.
        message: String,
    },
    /// A value is out of range.
    #[error("config key {key}: {reason}")]
    Value {
        /// The key, dotted (`queues.orders.retry.max_attempts`).
        key: String,
        /// What is wrong.
        reason: String,
    },
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Which store: absent, the embedded store in `data_dir`; `postgres://…`, PostgreSQL;
    /// `mysql://…`, MySQL or MariaDB.
    pub storage_url: Option<String>,
    /// PostgreSQL: the schema holding redrive's tables.
    pub storage_schema: String,
    /// PostgreSQL, MySQL: connections in the pool.
    pub storage_pool_size: usize,
    /// PostgreSQL: LISTEN/NOTIFY between the nodes (off behind a pooler in transaction mode).
    pub storage_notify: bool,
    /// Directory of the embedded store.
    pub data_dir: PathBuf,
    /// `fsync` (default) or `unsafe-buffered`.
    pub durability: DurabilityName,
    /// Bearer tokens accepted on `/v1/*` with every scope (admin). Empty (and no `tokens`):
    /// no authentication.
    pub api_tokens: Vec<String>,
    /// Named tokens with scopes (`[[tokens]]`).
    pub tokens: Vec<TokenConfig>,
    /// Allow listening on a non-loopback address without any API token.
    pub dangerous_allow_unauthenticated_public_listen: bool,
    /// Extra `Host` names (no port) accepted besides loopback ones, e.g. a reverse proxy's.
    pub allowed_hosts: Vec<String>,
    /// Browser origins (`scheme://host[:port]`) allowed besides the server's own.
    pub allowed_origins: Vec<String>,
    /// Largest payload of one message, in bytes of its JSON text.
    pub max_payload_bytes: usize,
    /// Largest request body, in bytes.
    pub max_request_bytes: usize,
    /// Largest lease answer or search page, in bytes (fewer messages rather than more bytes).
    pub max_response_bytes: usize,
    /// Largest `headers` of one message, in bytes of their JSON text.
    pub max_header_bytes: usize,
    /// Longest error message (nack, `failed`) or kill reason, in bytes; longer ones are cut.
    pub max_error_message_bytes: usize,
    /// Most messages in one batch publish, batch ack/nack or lease.
    pub max_batch: usize,
    /// Longest `wait` a lease request may long-poll.
    pub max_wait: DurationMs,
    /// Longest lease (and lease extension).
    pub max_lease: DurationMs,
    /// Farthest ahead a publish may schedule a message (`delay`, `deliver_at`). Not the retry
    /// policy's `max_delay`.
    pub max_schedule_ahead: DurationMs,
    /// How long an idempotency key is remembered.
    pub idempotency_window: DurationMs,
    /// How long done messages are kept before they are purged.
    pub done_retention: DurationMs,
    /// How often done messages and expired idempotency keys are purged.
    pub purge_interval: DurationMs,
    /// How long in-flight requests may take to finish after SIGTERM/SIGINT.
    pub shutdown_grace: DurationMs,
    /// Bound on the store's write-ahead log file, bytes (at least 1 MiB).
    pub max_wal_bytes: u64,
    /// Log filter (`tracing` env-filter syntax), e.g. `info` or `redrive=debug`.
    pub log: String,
    /// Per-queue settings; `default` applies to every queue without a section.
    pub queues: BTreeMap<String, QueueConfig>,
    /// Push delivery, server-wide.
    pub push: PushServerConfig,
    /// Bridges to brokers.
    pub bridges: BridgesConfig,
    /// Alerts.
    pub alerts: AlertsConfig,
    /// This node in its cluster.
    pub cluster: ClusterConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            storage_url: None,
            storage_schema: "redrive".to_owned(),
            storage_pool_size: 16,
            storage_notify: true,
            data_dir: PathBuf::from("./redrive-data"),
            durability: DurabilityName::Fsync,
            api_tokens: Vec::new(),
            tokens: Vec::new(),
            dangerous_allow_unauthenticated_public_listen: false,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_payload_bytes: 1 << 20,
            max_request_bytes: 16 << 20,
            max_response_bytes: 64 << 20,
            max_header_bytes: 16 << 10,
            max_error_message_bytes: 4 << 10,
            max_batch: 1_000,
            max_wait: DurationMs(30_000),
            max_lease: DurationMs(12 * 3_600_000),
            max_schedule_ahead: DurationMs(365 * 24 * 3_600_000),
            idempotency_window: DurationMs(24 * 3_600_000),
            done_retention: DurationMs(24 * 3_600_000),
            purge_interval: DurationMs(60_000),
            shutdown_grace: DurationMs(10_000),
            max_wal_bytes: storage::default_max_wal_bytes(),
            log: "info".to_owned(),
            queues: BTreeMap::new(),
            push: PushServerConfig::default(),
            bridges: BridgesConfig::default(),
            alerts: AlertsConfig::default(),
            cluster: ClusterConfig::default(),
        }
    }
}

/// Top-level keys that `REDRIVE_<KEY>` environment variables may set.
const ENV_KEYS: &[&str] = &[
    "listen",
    "storage_url",
    "storage_schema",
    "storage_pool_size",
    "storage_notify",
    "data_dir",
    "durability",
    "api_tokens",
    "dangerous_allow_unauthenticated_public_listen",
    "allowed_hosts",
    "allowed_origins",
    "max_payload_bytes",
    "max_request_bytes",
    "max_response_bytes",
    "max_header_bytes",
    "max_error_message_bytes",
    "max_batch",
    "max_wait",
    "max_lease",
    "max_schedule_ahead",
    "idempotency_window",
    "done_retention",
    "purge_interval",
    "shutdown_grace",
    "max_wal_bytes",
    "log",
];

/// `REDRIVE_*` variables that are not server configuration: `REDRIVE_CONFIG` (the file, read
/// by the binary), `REDRIVE_SERVER` and `REDRIVE_TOKEN` (the CLI's client commands),
/// `REDRIVE_IMPORT_FROM` (`redrive import`'s source), so that a shell which has them set
/// still starts a server.
const CLIENT_ENV_KEYS: &[&str] = &["config", "server", "token", "import_from"];

/// Values given on the command line; they win over file and environment.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--listen`.
    pub listen: Option<String>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--storage-url`.
    pub storage_url: Option<String>,
}

impl Config {
    /// Load: defaults ← `file` ← `env` (pairs of `REDRIVE_*` variables) ← `overrides`,
    /// then validate. `env` is usually `std::env::vars()`.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &Overrides,
    ) -> Result<Config, ConfigError> {
        let mut table = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                text.parse::<toml::Table>()
                    .map_err(|e| ConfigError::Invalid {
                        origin: format!("config file {}", path.display()),
                        message: e.to_string(),
                    })?
            }
            None => toml::Table::new(),
        };
        let file_origin = file.map(|p| format!("config file {}", p.display()));
        let mut env_set = false;
        for (name, value) in env {
            let Some(key) = name.strip_prefix("REDRIVE_") else {
                continue;
            };
            let key = key.to_ascii_lowercase();
            if CLIENT_ENV_KEYS.contains(&key.as_str()) {
                continue; // read by the binary (config file) or its client commands
            }
            if !ENV_KEYS.contains(&key.as_str()) {
                return Err(ConfigError::Invalid {
                    origin: "environment".into(),
                    message: format!(
                        "unknown variable {name} (known: {})",
                        ENV_KEYS
                            .iter()
                            .map(|k| format!("REDRIVE_{}", k.to_uppercase()))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
            }
            table.insert(key.clone(), env_value(&key, &value));
            env_set = true;
        }
        if let Some(l) = &overrides.listen {
            table.insert("listen".into(), toml::Value::String(l.clone()));
        }
        if let Some(u) = &overrides.storage_url {
            table.insert("storage_url".into(), toml::Value::String(u.clone()));
        }
        if let Some(d) = &overrides.data_dir {
            table.insert(
                "data_dir".into(),
                toml::Value::String(d.display().to_string()),
            );
        }
        let origin = match (&file_origin, env_set) {
            (Some(f), true) => format!("{f} (with REDRIVE_* environment and flags)"),
            (Some(f), false) => f.clone(),
            (None, _) => "environment and flags".to_owned(),
        };
        let config: Config =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| ConfigError::Invalid {
                    origin,
                    message: e.to_string().trim().to_owned(),
                })?;
        config.validate()?;
        Ok(config)
    }

    /// Check values and resolve every queue's policy once, so a bad one fails at start.
    /// The sections are checked in this order; the first bad value is the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_limits()?;
        self.check_storage()?;
        self.check_tokens()?;
        self.check_browser_guard()?;
        self.check_queue_names()?;
        self.push_settings()?;
        self.bridge_settings()?;
        self.alert_settings()?;
        self.check_cluster()?;
        self.check_queue_policies()
    }

    /// What the engine needs of this configuration.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            catalog: self.catalog(),
            queue_lease_ms: self
                .queues
                .keys()
                .filter_map(|q| Some((q.clone(), self.queue_lease_ms(q)?)))
                .collect(),
            default_lease_ms: self
                .queues
                .get("default")
                .and_then(|q| q.lease)
                .map_or(DEFAULT_LEASE_MS, |d| d.ms()),
            done_retention_ms: self.done_retention.ms(),
            purge_interval_ms: self.purge_interval.ms(),
            push: self.push_settings().unwrap_or_default(),
            bridges: self.bridge_settings().unwrap_or_default(),
            alerts: self.alert_settings().unwrap_or_default(),
            cluster: self.cluster_settings(),
        }
    }
}

/// An environment value as TOML: numbers, booleans and arrays parse as such, anything
/// else is a string. `REDRIVE_API_TOKENS=a,b` is a list, and so are the allow-lists.
fn env_value(key: &str, raw: &str) -> toml::Value {
    if matches!(key, "api_tokens" | "allowed_hosts" | "allowed_origins") {
        return toml::Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| toml::Value::String(s.into()))
                .collect(),
        );
    }
    if let Ok(t) = format!("v = {raw}").parse::<toml::Table>() {
        if let Some(v) = t.get("v") {
            if !v.is_str() {
                return v.clone();
            }
        }
    }
    toml::Value::String(raw.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use redrive_core::Ordering;

    /// `toml_text` as a config file, with `env` as the environment (for every section's tests).
    pub(super) fn load(toml_text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, toml_text).unwrap();
        Config::load(
            Some(&p),
            env.iter().map(|(a, b)| (a.to_string(), b.to_string())),
            &Overrides::default(),
        )
    }

    #[test]
    fn empty_config_is_the_defaults() {
        let c = Config::load(None, Vec::new(), &Overrides::default()).unwrap();
        assert_eq!(c, Config::default());
        assert!(c.listens_on_loopback());
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = load("listne = \"x\"", &[]).unwrap_err().to_string();
        assert!(e.contains("listne"), "{e}");
        let e = load("[queues.orders.retry]\nmax_attempt = 3", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_attempt"), "{e}");
        let e = load("", &[("REDRIVE_LISTN", "x")]).unwrap_err().to_string();
        assert!(e.contains("REDRIVE_LISTN"), "{e}");
        // The CLI's own variables are no server keys, and no error either.
        let clients = [
            ("REDRIVE_SERVER", "http://127.0.0.1:7070"),
            ("REDRIVE_TOKEN", "t"),
            ("REDRIVE_IMPORT_FROM", "mysql://root@127.0.0.1:3306/shop"),
        ];
        assert!(load("", &clients).is_ok());
    }

    #[test]
    fn bad_values_are_named() {
        let e = load("[queues.orders.retry]\nmultiplier = 0.1", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("queues.orders.retry.multiplier"), "{e}");
        let e = load("max_wait = \"soon\"", &[]).unwrap_err().to_string();
        assert!(e.contains("max_wait") || e.contains("soon"), "{e}");
        let e = load("[queues.\"bad name\"]\nordering = \"key\"", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("queues.bad name"), "{e}");
    }

    #[test]
    fn layers_file_env_flags() {
        let c = load(
            "listen = \"127.0.0.1:1\"\n[queues.default.retry]\nmax_attempts = 3\n[queues.orders]\nordering = \"key\"\n[queues.orders.retry]\npreset = \"svix\"",
            &[("REDRIVE_LISTEN", "127.0.0.1:2"), ("REDRIVE_MAX_BATCH", "7")],
        )
        .unwrap();
        assert_eq!(c.listen.port(), 2);
        assert_eq!(c.max_batch, 7);
        let s = c.queue_settings("orders");
        assert_eq!(s.ordering, Ordering::Key);
        assert_eq!(
            s.retry.max_attempts, 3,
            "default section's max_attempts wins over the preset's"
        );
        assert_eq!(c.queue_settings("other").retry.max_attempts, 3);
    }
}

#[cfg(test)]
mod example_config {
    use super::*;

    /// `redrive.example.toml` loads, and every value in it is the built-in default.
    #[test]
    fn example_config_is_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../redrive.example.toml");
        let c = Config::load(Some(&path), Vec::new(), &Overrides::default()).unwrap();
        let d = Config::default();
        assert_eq!(c.queue_settings("any"), d.queue_settings("any"));
        assert_eq!(
            c.queue_settings("any").retry,
            redrive_core::RetryPolicy::default()
        );
        let mut c_no_queues = c;
        c_no_queues.queues = Default::default();
        assert_eq!(c_no_queues, d);
    }
}
