//! `GET /v1/failure-groups`: dead letters grouped by failure fingerprint (the last error's
//! class and message with ids, numbers and hex normalised away), largest group first
//! (SPEC §12). The dead messages are read page by page, up to [`MAX_SCANNED`].

use super::{queue_name, ApiError, AppState, ErrorBody};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use redrive_core::{State as MsgState, Timestamp};
use redrive_storage::MessageFilter;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use utoipa::{IntoParams, ToSchema};

/// Dead messages read at most for one answer.
pub const MAX_SCANNED: usize = 100_000;
/// Groups answered by default, and at most.
const DEFAULT_GROUPS: u32 = 50;
const MAX_GROUPS: u32 = 1_000;
/// Message ids shown per group.
const SAMPLE_IDS: usize = 5;

/// Filters of the grouping.
#[derive(Debug, Default, Deserialize, IntoParams, ToSchema)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct GroupsQuery {
    /// Only this queue's dead letters.
    pub queue: Option<String>,
    /// Groups answered, largest first (default 50, at most 1000).
    pub limit: Option<u32>,
}

/// One failure group.
#[derive(Debug, Serialize, ToSchema)]
pub struct FailureGroup {
    /// `class: normalised message` (or `killed`, for messages an operator killed).
    pub fingerprint: String,
    /// Dead letters in the group.
    pub count: u64,
    /// The queues they are in.
    pub queues: Vec<String>,
    /// Why they are dead (`max_attempts`, `max_age`, …), each once.
    pub dead_reasons: Vec<String>,
    /// One of their last error messages, as it was.
    pub example: Option<String>,
    /// The oldest and newest time one of them became dead.
    #[schema(value_type = Option<String>)]
    pub first_at: Option<Timestamp>,
    /// See `first_at`.
    #[schema(value_type = Option<String>)]
    pub last_at: Option<Timestamp>,
    /// A few of their ids, newest first.
    pub sample_ids: Vec<String>,
}

/// Failure groups, largest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct FailureGroups {
    /// The groups.
    pub groups: Vec<FailureGroup>,
    /// Dead messages read.
    pub scanned: u64,
    /// True when there were more than could be read for one answer (100,000): the counts
    /// are of the newest ones.
    pub truncated: bool,
}

/// Dead letters grouped by failure fingerprint, largest group first.
#[utoipa::path(get, path = "/v1/failure-groups", tag = "messages", params(GroupsQuery),
    responses((status = 200, body = FailureGroups), (status = 400, description = "Bad filter, naming it", body = ErrorBody)))]
pub async fn list(
    State(s): State<AppState>,
    q: Result<Query<GroupsQuery>, QueryRejection>,
) -> Result<Json<FailureGroups>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let limit = q.limit.unwrap_or(DEFAULT_GROUPS);
    collect(&s, q.queue, limit).await.map(Json)
}

/// The failure groups of `queue`'s dead letters (every queue's when `None`), largest
/// first, at most `limit` of them: the data of `GET /v1/failure-groups` and of the
/// console's groups page.
pub(crate) async fn collect(
    s: &AppState,
    queue: Option<String>,
    limit: u32,
) -> Result<FailureGroups, ApiError> {
    if let Some(queue) = &queue {
        queue_name(queue)?;
    }
    if limit == 0 || limit > MAX_GROUPS {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("limit: {limit} is not in 1..={MAX_GROUPS}"),
        ));
    }
    let filter = MessageFilter {
        queue,
        state: Some(MsgState::Dead),
        ..MessageFilter::default()
    };
    let mut groups: HashMap<String, (FailureGroup, BTreeSet<String>, BTreeSet<String>)> =
        HashMap::new();
    let mut scanned = 0usize;
    let truncated = s
        .engine
        .scan(&filter, MAX_SCANNED, |m| {
            scanned += 1;
            let (fp, message) = redrive_core::fingerprint::of_message(m);
            let g = groups.entry(fp.clone()).or_insert_with(|| {
                (
                    FailureGroup {
                        fingerprint: fp,
                        count: 0,
                        queues: Vec::new(),
                        dead_reasons: Vec::new(),
                        example: message,
                        first_at: None,
                        last_at: None,
                        sample_ids: Vec::new(),
                    },
                    BTreeSet::new(),
                    BTreeSet::new(),
                )
            });
            g.0.count += 1;
            g.1.insert(m.queue.clone());
            if let Some(r) = m.dead_reason {
                g.2.insert(r.as_str().to_owned());
            }
            let at = m.finished_at.unwrap_or(m.updated_at);
            g.0.first_at = Some(g.0.first_at.map_or(at, |f| f.min(at)));
            g.0.last_at = Some(g.0.last_at.map_or(at, |l| l.max(at)));
            if g.0.sample_ids.len() < SAMPLE_IDS {
                g.0.sample_ids.push(m.id.to_string());
            }
        })
        .await?;
    let mut groups: Vec<FailureGroup> = groups
        .into_values()
        .map(|(mut g, queues, reasons)| {
            g.queues = queues.into_iter().collect();
            g.dead_reasons = reasons.into_iter().collect();
            g
        })
        .collect();
    groups.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then(a.fingerprint.cmp(&b.fingerprint))
    });
    groups.truncate(limit as usize);
    Ok(FailureGroups {
        groups,
        scanned: scanned as u64,
        truncated,
    })
}
