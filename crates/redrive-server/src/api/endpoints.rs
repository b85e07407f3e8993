//! `GET /v1/endpoints`: the state of every push endpoint (SPEC §10): breaker state, calls in
//! flight, pace, rates, parked messages, retry budget, and this node's share of the
//! cluster-wide limits (SPEC §13).

use super::{ApiError, AppState};
use axum::extract::State;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

/// The retry budget of an endpoint over its window.
#[derive(Debug, Serialize, ToSchema)]
pub struct BudgetView {
    /// Retries allowed per first attempt (0: no budget).
    pub ratio: f64,
    /// First attempts in the window.
    pub first_attempts: u64,
    /// Retries in the window.
    pub retries: u64,
    /// Retries it would admit now.
    pub available: u64,
}

/// This node's share of an endpoint's cluster-wide limits (SPEC §13).
#[derive(Debug, Serialize, ToSchema)]
pub struct ShareView {
    /// Live nodes sharing the limits (1 on the embedded store).
    pub nodes: u32,
    /// This node's place among them, sorted by incarnation (0-based).
    pub rank: u32,
    /// Calls in flight at most on this node: `floor(concurrency / nodes)`, plus one when
    /// `rank < concurrency mod nodes` (0: this node leaves the endpoint to the others).
    pub concurrency: u32,
    /// Calls per second at most on this node: `rate_limit_per_second / nodes`.
    pub rate_limit_per_second: Option<f64>,
}

/// One endpoint.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointView {
    /// `scheme://host:port`.
    pub endpoint: String,
    /// Queues that push to it.
    pub queues: Vec<String>,
    /// Breaker state: `closed`, `open` (due messages parked, not called), `half_open` (one
    /// probe call), `recovering` (paced release).
    pub state: &'static str,
    /// Seconds since the state began.
    pub state_for_seconds: f64,
    /// Calls in flight.
    pub in_flight: u32,
    /// Most calls in flight, configured: for the whole cluster.
    pub concurrency: u32,
    /// Configured rate limit, calls/s: for the whole cluster.
    pub rate_limit_per_second: Option<f64>,
    /// This node's share of `concurrency` and `rate_limit_per_second`; absent until the
    /// node's first heartbeat told it the live nodes (it calls nothing meanwhile).
    pub share: Option<ShareView>,
    /// Release pace after recovery, calls/s (absent: not paced).
    pub pace_per_second: Option<f64>,
    /// Calls per second recently.
    pub calls_per_second: f64,
    /// Calls in the breaker's window.
    pub window_calls: u32,
    /// Failed calls in the breaker's window.
    pub window_failures: u32,
    /// Messages parked now (handed back unattempted and uncharged, due again later). Due
    /// messages the worker did not lease while the breaker was open are not counted here:
    /// they are the queue's `ready` count.
    pub parked: u64,
    /// Times the breaker opened since start.
    pub opened_total: u64,
    /// The retry budget.
    pub budget: BudgetView,
}

/// Every push endpoint.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointList {
    /// One per distinct endpoint of the push queues.
    pub endpoints: Vec<EndpointView>,
}

/// The state of every push endpoint.
#[utoipa::path(get, path = "/v1/endpoints", tag = "queues", responses((status = 200, body = EndpointList)))]
pub async fn list(State(s): State<AppState>) -> Result<Json<EndpointList>, ApiError> {
    Ok(Json(EndpointList {
        endpoints: views(&s),
    }))
}

/// The state of every push endpoint: the data of `GET /v1/endpoints` and of the console.
pub(crate) fn views(s: &AppState) -> Vec<EndpointView> {
    s.engine
        .push()
        .views()
        .into_iter()
        .map(|v| {
            let p = v.snapshot;
            EndpointView {
                endpoint: v.endpoint,
                queues: v.queues,
                state: p.state.as_str(),
                state_for_seconds: v.state_for_ms as f64 / 1000.0,
                in_flight: p.in_flight,
                concurrency: v.concurrency,
                rate_limit_per_second: v.rate_limit_per_s,
                share: v.rank.map(|r| ShareView {
                    nodes: r.nodes,
                    rank: r.rank,
                    concurrency: p.concurrency,
                    rate_limit_per_second: p.rate_limit_per_s,
                }),
                pace_per_second: p.pace_per_s,
                calls_per_second: p.calls_per_s,
                window_calls: p.window_calls,
                window_failures: p.window_failures,
                parked: v.parked,
                opened_total: p.opened_total,
                budget: BudgetView {
                    ratio: p.budget_ratio,
                    first_attempts: p.budget_first_attempts,
                    retries: p.budget_retries,
                    available: p.budget_available,
                },
            }
        })
        .collect()
}
