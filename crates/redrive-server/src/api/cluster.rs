//! `GET /v1/cluster`: the nodes sharing this store, their last heartbeat, and the leader
//! (SPEC §13).

use super::{ApiError, AppState};
use axum::extract::State;
use axum::Json;
use redrive_core::Timestamp;
use serde::Serialize;
use utoipa::ToSchema;

// A node is shown `live` while its last heartbeat is at most `LIVE_BEATS` heartbeat
// intervals old (of the answering node's configuration).
use crate::engine::cluster::LIVE_BEATS;

/// The cluster as the store knows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct ClusterAnswer {
    /// The node that answered (its name).
    pub node: String,
    /// The store's clock when it answered, RFC 3339 (the clock every node shares).
    #[schema(value_type = String, format = DateTime)]
    pub at: Timestamp,
    /// The leader (it runs the work done once: purge, bulk tasks, alert thresholds), absent
    /// while nobody leads (a leader's lease ran out and no node took over yet).
    pub leader: Option<LeaderView>,
    /// Every node that recorded a heartbeat and did not leave, oldest first (a killed
    /// node stays listed, not live, for a day).
    pub nodes: Vec<NodeView>,
}

/// The leader.
#[derive(Debug, Serialize, ToSchema)]
pub struct LeaderView {
    /// Its name.
    pub node: String,
    /// Its process (unique per start).
    pub incarnation: String,
    /// Grows by one each time leadership passes to another process.
    pub epoch: u64,
    /// When its leadership lapses unless renewed, RFC 3339.
    #[schema(value_type = String, format = DateTime)]
    pub expires_at: Timestamp,
}

/// A node.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodeView {
    /// Its name (`cluster.node`, default `<host name>:<port>`).
    pub node: String,
    /// Its process (unique per start).
    pub incarnation: String,
    /// Its API address, as it announces it.
    pub address: String,
    /// Its version.
    pub version: String,
    /// Its first heartbeat, RFC 3339.
    #[schema(value_type = String, format = DateTime)]
    pub started_at: Timestamp,
    /// Its last heartbeat, RFC 3339.
    #[schema(value_type = String, format = DateTime)]
    pub last_heartbeat: Timestamp,
    /// Whether its last heartbeat is recent (within three heartbeat intervals).
    pub live: bool,
    /// Whether it leads.
    pub leader: bool,
}

/// The live nodes, their last heartbeat and the leader.
#[utoipa::path(get, path = "/v1/cluster", tag = "ops", responses(
    (status = 200, body = ClusterAnswer),
    (status = 503, description = "the store is unavailable", body = super::ErrorBody)))]
pub async fn get(State(s): State<AppState>) -> Result<Json<ClusterAnswer>, ApiError> {
    let view = s.engine.store().cluster(None).await?;
    let settings = &s.engine.config().cluster;
    let live_ms = (LIVE_BEATS * settings.heartbeat_ms) as i64;
    let leader = view.leader.as_ref().map(|l| l.incarnation.clone());
    Ok(Json(ClusterAnswer {
        node: settings.node.clone(),
        at: view.at,
        nodes: view
            .nodes
            .into_iter()
            .map(|n| NodeView {
                live: view.at.as_millis() - n.last_seen.as_millis() <= live_ms,
                leader: leader.as_deref() == Some(n.incarnation.as_str()),
                node: n.node,
                incarnation: n.incarnation,
                address: n.address,
                version: n.version,
                started_at: n.started_at,
                last_heartbeat: n.last_seen,
            })
            .collect(),
        leader: view.leader.map(|l| LeaderView {
            node: l.node,
            incarnation: l.incarnation,
            epoch: l.epoch,
            expires_at: l.expires_at,
        }),
    }))
}
