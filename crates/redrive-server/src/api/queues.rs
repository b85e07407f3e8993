//! `GET /v1/queues` and `GET /v1/queues/{queue}`: counts per state, oldest ready age, policy.

use super::{queue_name, ApiError, AppState, ErrorBody};
use axum::extract::{Path, State};
use axum::Json;
use redrive_core::{OnDead, Ordering, QueueSettings, State as MsgState, Timestamp};
use redrive_storage::QueueStats;
use serde::Serialize;
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// One queue.
#[derive(Debug, Serialize, ToSchema)]
pub struct QueueView {
    /// Name.
    pub queue: String,
    /// Messages per state.
    pub counts: BTreeMap<String, u64>,
    /// Now minus the due time of the oldest ready message, seconds.
    pub oldest_ready_age_seconds: Option<f64>,
    /// The effective retry policy.
    #[schema(value_type = Object)]
    pub policy: redrive_core::RetryPolicy,
    /// The policy in words.
    pub policy_summary: String,
    /// `none` or `key`.
    #[schema(value_type = String)]
    pub ordering: Ordering,
    /// `skip` or `block`.
    #[schema(value_type = String)]
    pub on_dead: OnDead,
    /// Default lease, if configured.
    pub lease: Option<String>,
    /// `pull` (consumers lease) or `push` (redrive calls `endpoint`).
    pub delivery: &'static str,
    /// For a push queue: the endpoint it pushes to (`scheme://host:port`, see
    /// `GET /v1/endpoints`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

/// Every queue.
#[derive(Debug, Serialize, ToSchema)]
pub struct QueueList {
    /// Queues with messages, and configured queues.
    pub queues: Vec<QueueView>,
}

fn view(s: &AppState, name: &str, stats: Option<&QueueStats>, now: Timestamp) -> QueueView {
    let settings: &QueueSettings = s.engine.catalog().get(name);
    let counts = MsgState::ALL
        .iter()
        .map(|st| (st.as_str().to_owned(), stats.map_or(0, |x| x.count(*st))))
        .collect();
    QueueView {
        queue: name.to_owned(),
        counts,
        oldest_ready_age_seconds: stats
            .and_then(|x| x.oldest_ready_due)
            .map(|d| now.millis_since(d).max(0) as f64 / 1000.0),
        policy: settings.retry.clone(),
        policy_summary: settings.retry.summary(),
        ordering: settings.ordering,
        on_dead: settings.on_dead,
        lease: s
            .config
            .queue_lease_ms(name)
            .map(redrive_core::format_duration_ms),
        delivery: if s.engine.push().is_push(name) {
            "push"
        } else {
            "pull"
        },
        endpoint: s.engine.push().endpoint_of(name),
    }
}

/// Every queue that has messages or a config section.
#[utoipa::path(get, path = "/v1/queues", tag = "queues", responses((status = 200, body = QueueList)))]
pub async fn list(State(s): State<AppState>) -> Result<Json<QueueList>, ApiError> {
    let stats = s.engine.store().queue_stats().await?;
    let now = s.engine.clock().now();
    let mut names: Vec<String> = stats.iter().map(|x| x.queue.clone()).collect();
    for n in s.engine.catalog().configured() {
        if !names.iter().any(|x| x == n) {
            names.push(n.to_owned());
        }
    }
    names.sort();
    let queues = names
        .iter()
        .map(|n| view(&s, n, stats.iter().find(|x| &x.queue == n), now))
        .collect();
    Ok(Json(QueueList { queues }))
}

/// One queue (a queue without messages answers zero counts: queues exist on first use).
#[utoipa::path(get, path = "/v1/queues/{queue}", tag = "queues",
    params(("queue" = String, Path, description = "Queue name")),
    responses((status = 200, body = QueueView), (status = 400, description = "Bad queue name", body = ErrorBody)))]
pub async fn get(
    State(s): State<AppState>,
    Path(queue): Path<String>,
) -> Result<Json<QueueView>, ApiError> {
    queue_name(&queue)?;
    let stats = s.engine.store().queue_stats().await?;
    let now = s.engine.clock().now();
    Ok(Json(view(
        &s,
        &queue,
        stats.iter().find(|x| x.queue == queue),
        now,
    )))
}
