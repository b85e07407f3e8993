//! Liveness, readiness and Prometheus metrics.

use super::{ApiError, AppState};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use redrive_storage::Health;

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, description = "alive")))]
pub async fn healthz() -> impl IntoResponse {
    Json(serde_json::json!({"status": "ok"}))
}

/// Readiness: the store accepts writes and the server is not shutting down.
#[utoipa::path(get, path = "/readyz", tag = "ops", responses(
    (status = 200, description = "ready"),
    (status = 503, description = "store poisoned, unavailable or superseded by a newer redrive, or shutting down", body = super::ErrorBody)))]
pub async fn readyz(State(s): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    match s.engine.store().health() {
        Health::Ok => {}
        Health::Failed(reason) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_poisoned",
                reason,
            ))
        }
        Health::Superseded(reason) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_superseded",
                reason,
            ))
        }
        Health::Unavailable(reason) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                reason,
            ))
        }
    }
    if s.engine.is_shutting_down() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "server is shutting down",
        ));
    }
    Ok(Json(serde_json::json!({"status": "ready"})))
}

/// Prometheus text exposition (SPEC §8).
#[utoipa::path(get, path = "/metrics", tag = "ops", responses((status = 200, description = "Prometheus text format", content_type = "text/plain")))]
pub async fn metrics(State(s): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let stats = s.engine.store().queue_stats().await?;
    s.metrics.set_endpoints(&s.engine.push().gauges());
    s.metrics.set_bridges(&s.engine.bridges().gauges());
    let membership = s.engine.membership();
    let node = crate::metrics::NodeLabel {
        node: &s.engine.config().cluster.node,
        incarnation: membership.incarnation(),
        leads: membership.leads(),
    };
    let body = s.metrics.render(
        &stats,
        &s.engine.store().metrics(),
        &node,
        s.engine.clock().now().as_millis(),
    );
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    ))
}
