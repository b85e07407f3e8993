//! `[cluster]`: this node's name in its cluster, its heartbeat and the leadership lease
//! (SPEC §13). Every node of a cluster shares one `storage_url`; these keys only say how
//! this one shows itself and how fast a dead leader is replaced.

use super::{Config, ConfigError};
use crate::engine::cluster::ClusterSettings;
use redrive_core::DurationMs;
use serde::{Deserialize, Serialize};

/// `[cluster]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// The node's name, as `GET /v1/cluster` and the logs show it (default
    /// `<host name>:<listen port>`).
    pub node: Option<String>,
    /// How often the node records its heartbeat (default 1 s; 100 ms to 1 min).
    pub heartbeat_interval: DurationMs,
    /// How long a leadership lasts without a renewal (default 10 s; at least three
    /// heartbeats): a dead leader is replaced within it.
    pub leader_lease: DurationMs,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            node: None,
            heartbeat_interval: DurationMs(1_000),
            leader_lease: DurationMs(10_000),
        }
    }
}

/// The host's name (Linux: the kernel's), `localhost` when it cannot be read.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

impl Config {
    /// `[cluster]`, checked (the error names the key).
    pub(super) fn check_cluster(&self) -> Result<(), ConfigError> {
        let c = &self.cluster;
        let val = |key: &str, reason: String| {
            Err(ConfigError::Value {
                key: format!("cluster.{key}"),
                reason,
            })
        };
        if let Some(n) = &c.node {
            if n.trim().is_empty() || n.chars().count() > 200 || n.chars().any(char::is_control) {
                return val(
                    "node",
                    "a node name is 1 to 200 printable characters, e.g. \"redrive-1\"".into(),
                );
            }
        }
        let beat = c.heartbeat_interval.ms();
        if !(100..=60_000).contains(&beat) {
            return val(
                "heartbeat_interval",
                format!("must be between 100ms and 1m, got {beat}ms"),
            );
        }
        let lease = c.leader_lease.ms();
        if lease < 3 * beat || lease > 3_600_000 {
            return val(
                "leader_lease",
                format!(
                    "must be at least three heartbeats ({}ms) and at most 1h, got {lease}ms",
                    3 * beat
                ),
            );
        }
        Ok(())
    }

    /// What the engine needs of `[cluster]`.
    pub(super) fn cluster_settings(&self) -> ClusterSettings {
        let port = self.listen.port();
        ClusterSettings {
            node: self
                .cluster
                .node
                .clone()
                .unwrap_or_else(|| format!("{}:{port}", host_name())),
            address: crate::base_url(self.listen),
            heartbeat_ms: self.cluster.heartbeat_interval.ms(),
            leader_lease_ms: self.cluster.leader_lease.ms(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(toml: &str) -> Result<Config, ConfigError> {
        crate::config::tests::load(toml, &[])
    }

    #[test]
    fn defaults_name_the_node_after_host_and_port() {
        let c = with("listen = \"127.0.0.1:7171\"").expect("valid");
        let s = c.cluster_settings();
        assert!(s.node.ends_with(":7171"), "{s:?}");
        assert_eq!(s.address, "http://127.0.0.1:7171");
        assert_eq!((s.heartbeat_ms, s.leader_lease_ms), (1_000, 10_000));
        let c = with("[cluster]\nnode = \"redrive-2\"\nheartbeat_interval = \"500ms\"\nleader_lease = \"5s\"")
            .expect("valid");
        let s = c.cluster_settings();
        assert_eq!(
            (s.node.as_str(), s.heartbeat_ms, s.leader_lease_ms),
            ("redrive-2", 500, 5_000)
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        for (toml, key) in [
            ("[cluster]\nnode = \"\"", "cluster.node"),
            (
                "[cluster]\nheartbeat_interval = \"10ms\"",
                "cluster.heartbeat_interval",
            ),
            (
                "[cluster]\nheartbeat_interval = \"2m\"",
                "cluster.heartbeat_interval",
            ),
            ("[cluster]\nleader_lease = \"2s\"", "cluster.leader_lease"),
            ("[cluster]\nleader = \"me\"", "leader"),
        ] {
            let e = with(toml).expect_err(toml).to_string();
            assert!(e.contains(key), "{toml}: {e}");
        }
    }
}
