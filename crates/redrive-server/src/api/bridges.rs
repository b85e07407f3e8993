//! `GET /v1/bridges`: every bridge (SPEC §11) with its state and counters.

use super::{ApiError, AppState};
use crate::engine::bridge::BridgeView;
use axum::extract::State;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

/// Every bridge.
#[derive(Debug, Serialize, ToSchema)]
pub struct BridgeList {
    /// One per `[bridges.rabbitmq.NAME]`.
    pub bridges: Vec<BridgeView>,
}

/// The state and counters of every bridge.
#[utoipa::path(get, path = "/v1/bridges", tag = "queues", responses((status = 200, body = BridgeList)))]
pub async fn list(State(s): State<AppState>) -> Result<Json<BridgeList>, ApiError> {
    Ok(Json(BridgeList {
        bridges: s.engine.bridges().views(),
    }))
}
