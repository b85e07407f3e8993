//! `/v1/tasks`: bulk actions as durable tasks (SPEC §12), and `GET /v1/audit`.
//!
//! `POST /v1/tasks` selects messages with the filters of `GET /v1/messages` (plus a
//! failure group's `fingerprint`), and either counts them (`dry_run`) or creates a task
//! that the engine's runner (`engine/tasks.rs`) works through at `rate`. The console
//! (`ui/`) creates tasks through [`create`] too, so both are audited the same way.

use super::auth::Caller;
use super::messages::{filter_of, SearchQuery};
use super::{ApiError, ApiJson, AppState, ErrorBody};
use crate::engine::tasks::{self, TaskPlan, DEFAULT_STOP_FAILURE_RATIO, DEFAULT_STOP_MIN_OUTCOMES};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use redrive_core::{MessageId, Timestamp};
use redrive_storage::{
    AuditRecord, NewAudit, StoreError, TaskAction, TaskRecord, TaskState, TaskTransition,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// A task's rate: a whole number from 1 to 99,999 per second, minute or hour.
pub const RATE_PATTERN: &str = "^[1-9][0-9]{0,4}/[smh]$";

/// Messages per second of a rate written as [`RATE_PATTERN`] says; `None` otherwise.
fn parse_rate(text: &str) -> Option<f64> {
    let (n, unit) = text.split_once('/')?;
    let digits_ok = !n.is_empty()
        && n.len() <= 5
        && !n.starts_with('0')
        && n.bytes().all(|b| b.is_ascii_digit());
    let per = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3_600.0,
        _ => return None,
    };
    digits_ok
        .then(|| n.parse::<f64>().ok())
        .flatten()
        .map(|n| n / per)
}

/// Which messages a task selects: the filters of `GET /v1/messages`, ANDed.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskFilter {
    /// Queue name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// scheduled | ready | leased | done | dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Ordering key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// transient | rate_limited | permanent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_class: Option<String>,
    /// Text in the payload or the last error message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q: Option<String>,
    /// Created at or after: RFC 3339, or a duration ago (`12h`, counted from the task's
    /// creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Created before: RFC 3339, or a duration ago.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// Finished (done or dead) at or after: RFC 3339, or a duration ago.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_since: Option<String>,
    /// Finished before: RFC 3339, or a duration ago.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_until: Option<String>,
    /// A failure group's fingerprint (`GET /v1/failure-groups`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

/// The body of `POST /v1/tasks`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskRequest {
    /// redrive | kill | delete.
    pub action: String,
    /// Which messages; at least one filter.
    pub filter: TaskFilter,
    /// At most this many messages acted on per second, minute or hour: `"100/s"`, `"600/m"`.
    /// Default: as fast as the store goes.
    pub rate: Option<String>,
    /// Only count what the filter selects; create nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// A kill's reason, written in each message's history.
    pub reason: Option<String>,
    /// A redrive stops by itself when more than this share (0–1) of the messages it redrove
    /// failed again. Default 0.5; 1 never stops.
    pub stop_failure_ratio: Option<f64>,
    /// … once at least this many outcomes are known. Default 20.
    #[serde(default, deserialize_with = "super::contract::opt_integral")]
    #[schema(value_type = Option<u32>)]
    pub stop_min_outcomes: Option<i64>,
}

/// A task, as answered.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskView {
    /// Its id.
    pub id: String,
    /// redrive | kill | delete.
    pub action: String,
    /// running | paused | done | cancelled | stopped.
    pub state: String,
    /// The filter as given.
    #[schema(value_type = Object)]
    pub filter: serde_json::Value,
    /// The rate as given.
    pub rate: Option<String>,
    /// Messages selected when it was created.
    pub total: u64,
    /// Messages the action was applied to: redriven, killed or deleted. For a redrive, how
    /// those messages fared afterwards is not counted here (see `stop_reason`).
    pub done: u64,
    /// Messages the store refused the action for when the task reached them: no longer in a
    /// state it applies to (redriven, killed or acked by someone else meanwhile) or gone.
    /// Not the redriven messages that failed again: the stop rule counts those, and a
    /// stopped task says how many in `stop_reason`.
    pub failed: u64,
    /// Who created it.
    pub created_by: String,
    /// When.
    #[schema(value_type = String)]
    pub created_at: Timestamp,
    /// Last change.
    #[schema(value_type = String)]
    pub updated_at: Timestamp,
    /// Why it stopped (with the stop rule's figures: how many of the redriven messages
    /// whose outcome is known failed again) or was cancelled, or the last refusal.
    pub stop_reason: Option<String>,
    /// The stop rule of a redrive.
    pub stop_failure_ratio: Option<f64>,
}

impl TaskView {
    /// The view of a stored task.
    pub fn of(t: &TaskRecord) -> TaskView {
        let plan = TaskPlan::of(t).ok();
        TaskView {
            id: t.id.clone(),
            action: t.action.as_str().to_owned(),
            state: t.state.as_str().to_owned(),
            filter: plan
                .as_ref()
                .map_or(serde_json::Value::Null, |p| p.filter.clone()),
            rate: plan.as_ref().and_then(|p| p.rate.clone()),
            total: t.total,
            done: t.done,
            failed: t.failed,
            created_by: t.created_by.clone(),
            created_at: t.created_at,
            updated_at: t.updated_at,
            stop_reason: t.stop_reason.clone(),
            stop_failure_ratio: plan
                .filter(|_| t.action == TaskAction::Redrive)
                .map(|p| p.stop_failure_ratio),
        }
    }
}

/// What a dry run found.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DryRun {
    /// Always true.
    pub dry_run: bool,
    /// The action that would run.
    pub action: String,
    /// The filter as given.
    #[schema(value_type = Object)]
    pub filter: serde_json::Value,
    /// Messages it selects now.
    pub total: u64,
}

/// What `POST /v1/tasks` made.
#[derive(Debug, Clone)]
pub enum Created {
    /// A dry run: the count.
    DryRun(DryRun),
    /// A task.
    Task(TaskView),
}

/// The plan of a request, checked: every error names its field.
fn plan_of(req: &TaskRequest, now: Timestamp) -> Result<(TaskAction, TaskPlan), ApiError> {
    let action = TaskAction::parse(&req.action).ok_or_else(|| {
        ApiError::bad_request(
            "invalid_action",
            format!(
                "action: {:?} is not one of redrive, kill, delete",
                req.action
            ),
        )
    })?;
    let f = &req.filter;
    if *f == TaskFilter::default() {
        return Err(ApiError::bad_request(
            "empty_filter",
            "filter: give at least one of queue, state, key, error_class, q, since, until, \
             finished_since, finished_until, fingerprint (a task over every message is refused)",
        ));
    }
    let field = |e: ApiError| ApiError::new(e.status, e.code, format!("filter.{}", e.message));
    let mf = filter_of(
        &SearchQuery {
            queue: f.queue.clone(),
            state: f.state.clone(),
            key: f.key.clone(),
            error_class: f.error_class.clone(),
            q: f.q.clone(),
            since: f.since.clone(),
            until: f.until.clone(),
            finished_since: f.finished_since.clone(),
            finished_until: f.finished_until.clone(),
            fingerprint: f.fingerprint.clone(),
            ..SearchQuery::default()
        },
        now,
    )
    .map_err(field)?;
    for (field, value) in [("fingerprint", &f.fingerprint), ("q", &f.q)] {
        if value.as_deref().is_some_and(str::is_empty) {
            return Err(ApiError::bad_request(
                "invalid_body",
                format!("filter.{field}: must not be empty"),
            ));
        }
    }
    let rate_per_second = match &req.rate {
        Some(r) => Some(parse_rate(r).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_rate",
                format!("rate: {r:?} is not N/s, N/m or N/h with N a whole number from 1 to 99999"),
            )
        })?),
        None => None,
    };
    let ratio = req.stop_failure_ratio.unwrap_or(DEFAULT_STOP_FAILURE_RATIO);
    if !(0.0..=1.0).contains(&ratio) {
        return Err(ApiError::bad_request(
            "invalid_body",
            format!("stop_failure_ratio: {ratio} is not between 0 and 1"),
        ));
    }
    let min = match req.stop_min_outcomes {
        None => DEFAULT_STOP_MIN_OUTCOMES,
        Some(n) => u32::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_body",
                format!("stop_min_outcomes: {n} is not between 1 and {}", u32::MAX),
            )
        })?,
    };
    if req.reason.is_some() && action != TaskAction::Kill {
        return Err(ApiError::bad_request(
            "invalid_body",
            "reason: only for a kill",
        ));
    }
    // Messages published after the task was created are not selected.
    let bound = Timestamp::from_millis(now.as_millis() + 1);
    let mut selection = mf;
    selection.until = Some(selection.until.map_or(bound, |u| u.min(bound)));
    Ok((
        action,
        TaskPlan {
            filter: serde_json::to_value(f).unwrap_or(serde_json::Value::Null),
            selection,
            rate: req.rate.clone(),
            rate_per_second,
            kill_reason: req.reason.clone(),
            stop_failure_ratio: ratio,
            stop_min_outcomes: min,
        },
    ))
}

/// Count, or create a task for, what `req` selects; audited as `caller`.
pub async fn create(s: &AppState, caller: &Caller, req: TaskRequest) -> Result<Created, ApiError> {
    let now = s.engine.clock().now();
    let (action, plan) = plan_of(&req, now)?;
    let total = tasks::count(&s.engine, &plan).await?;
    if req.dry_run {
        return Ok(Created::DryRun(DryRun {
            dry_run: true,
            action: action.as_str().to_owned(),
            filter: plan.filter,
            total,
        }));
    }
    let record = TaskRecord {
        id: MessageId::new().to_string(),
        action,
        spec: serde_json::to_value(&plan).map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })?,
        state: TaskState::Running,
        total,
        done: 0,
        failed: 0,
        cursor: None,
        created_by: caller.name.clone(),
        created_at: now,
        updated_at: now,
        stop_reason: None,
    };
    let audit = NewAudit {
        actor: caller.name.clone(),
        action: "task.create".to_owned(),
        target: Some(record.id.clone()),
        filter: Some(plan.filter.clone()),
        count: total,
        detail: Some(format!(
            "{} {total} messages{}",
            action.as_str(),
            plan.rate
                .as_deref()
                .map(|r| format!(" at {r}"))
                .unwrap_or_default()
        )),
        node: Some(s.engine.node().to_owned()),
    };
    s.engine.store().task_create(record.clone(), audit).await?;
    s.engine.tasks().wake();
    tracing::info!(task = %record.id, action = action.as_str(), total, by = %caller.name, "task created");
    Ok(Created::Task(TaskView::of(&record)))
}

/// Pause, resume or cancel task `id`, audited as `caller`.
pub async fn transition(
    s: &AppState,
    caller: &Caller,
    id: &str,
    verb: &'static str,
) -> Result<TaskView, ApiError> {
    let (from, to): (&'static [TaskState], TaskState) = match verb {
        "pause" => (&[TaskState::Running], TaskState::Paused),
        "resume" => (&[TaskState::Paused], TaskState::Running),
        _ => (
            &[TaskState::Running, TaskState::Paused],
            TaskState::Cancelled,
        ),
    };
    let existing = load(s, id).await?;
    let audit = NewAudit {
        actor: caller.name.clone(),
        action: format!("task.{verb}"),
        target: Some(id.to_owned()),
        filter: TaskPlan::of(&existing).ok().map(|p| p.filter),
        count: existing.done,
        detail: None,
        node: Some(s.engine.node().to_owned()),
    };
    let reason = (to == TaskState::Cancelled).then(|| format!("cancelled by {}", caller.name));
    let t = s
        .engine
        .store()
        .task_transition(
            TaskTransition {
                id: id.to_owned(),
                from,
                to,
                action: verb,
                reason,
                audit: Some(audit),
            },
            s.engine.clock().for_store(),
        )
        .await?;
    if to == TaskState::Running {
        s.engine.tasks().wake();
    }
    Ok(TaskView::of(&t))
}

/// Create a bulk task, or count what it would select (`dry_run`).
#[utoipa::path(post, path = "/v1/tasks", tag = "tasks", request_body = TaskRequest,
    responses((status = 201, description = "The task, running", body = TaskView),
        (status = 200, description = "A dry run: what the filter selects now", body = DryRun),
        (status = 400, description = "Bad action, filter or rate, naming it", body = ErrorBody),
        (status = 403, description = "The token lacks the admin scope", body = ErrorBody)))]
pub async fn create_task(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(req): ApiJson<TaskRequest>,
) -> Result<Response, ApiError> {
    Ok(match create(&s, &caller, req).await? {
        Created::DryRun(d) => (StatusCode::OK, Json(d)).into_response(),
        Created::Task(t) => (StatusCode::CREATED, Json(t)).into_response(),
    })
}

/// Every task.
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskList {
    /// Newest first (the 1,000 newest).
    pub tasks: Vec<TaskView>,
}

/// Tasks, newest first.
#[utoipa::path(get, path = "/v1/tasks", tag = "tasks", responses((status = 200, body = TaskList)))]
pub async fn list(State(s): State<AppState>) -> Result<Json<TaskList>, ApiError> {
    let tasks = s.engine.store().tasks(None, 1_000).await?;
    Ok(Json(TaskList {
        tasks: tasks.iter().map(TaskView::of).collect(),
    }))
}

/// One task.
#[utoipa::path(get, path = "/v1/tasks/{id}", tag = "tasks",
    params(("id" = String, Path, description = "Task id")),
    responses((status = 200, body = TaskView), (status = 404, description = "No such task", body = ErrorBody)))]
pub async fn get(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<TaskView>, ApiError> {
    Ok(Json(TaskView::of(&load(&s, &id).await?)))
}

/// Task `id`; 404 when none.
pub(crate) async fn load(s: &AppState, id: &str) -> Result<TaskRecord, ApiError> {
    Ok(s.engine
        .store()
        .task(id.to_owned())
        .await?
        .ok_or_else(|| StoreError::TaskNotFound(id.to_owned()))?)
}

/// Pause a running task; it resumes where it stopped.
#[utoipa::path(post, path = "/v1/tasks/{id}/pause", tag = "tasks",
    params(("id" = String, Path, description = "Task id")),
    responses((status = 200, body = TaskView), (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "Not running", body = ErrorBody)))]
pub async fn pause(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<TaskView>, ApiError> {
    transition(&s, &caller, &id, "pause").await.map(Json)
}

/// Resume a paused task.
#[utoipa::path(post, path = "/v1/tasks/{id}/resume", tag = "tasks",
    params(("id" = String, Path, description = "Task id")),
    responses((status = 200, body = TaskView), (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "Not paused", body = ErrorBody)))]
pub async fn resume(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<TaskView>, ApiError> {
    transition(&s, &caller, &id, "resume").await.map(Json)
}

/// Cancel a running or paused task (what it did stays done).
#[utoipa::path(post, path = "/v1/tasks/{id}/cancel", tag = "tasks",
    params(("id" = String, Path, description = "Task id")),
    responses((status = 200, body = TaskView), (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "Already finished", body = ErrorBody)))]
pub async fn cancel(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<TaskView>, ApiError> {
    transition(&s, &caller, &id, "cancel").await.map(Json)
}

/// Paging of the audit log.
#[derive(Debug, Default, Deserialize, IntoParams, ToSchema)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Entries per page (default 100, at most 1000).
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// One operator action.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditView {
    /// Its place in the log.
    pub seq: u64,
    /// When.
    #[schema(value_type = String)]
    pub at: Timestamp,
    /// Who (a token's name; `anonymous` without tokens).
    pub actor: String,
    /// What (`message.redrive`, `task.create` …).
    pub action: String,
    /// On what (a message or task id).
    pub target: Option<String>,
    /// The selection of a task.
    #[schema(value_type = Option<Object>)]
    pub filter: Option<serde_json::Value>,
    /// How many messages.
    pub count: u64,
    /// More (a kill reason, a stop reason).
    pub detail: Option<String>,
    /// The node that did it (its `[cluster] node` name: the one that answered the request,
    /// or ran the task's step); null in entries recorded before redrive kept it.
    pub node: Option<String>,
}

impl From<AuditRecord> for AuditView {
    fn from(a: AuditRecord) -> Self {
        AuditView {
            seq: a.seq,
            at: a.at,
            actor: a.entry.actor,
            action: a.entry.action,
            target: a.entry.target,
            filter: a.entry.filter,
            count: a.entry.count,
            detail: a.entry.detail,
            node: a.entry.node,
        }
    }
}

/// A page of the audit log.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditPage {
    /// Newest first.
    pub entries: Vec<AuditView>,
    /// Pass as `cursor` for older entries; null at the end.
    pub next_cursor: Option<String>,
}

/// The audit log: every operator action, newest first.
#[utoipa::path(get, path = "/v1/audit", tag = "tasks", params(AuditQuery),
    responses((status = 200, body = AuditPage), (status = 400, description = "Bad limit or cursor", body = ErrorBody)))]
pub async fn audit(
    State(s): State<AppState>,
    q: Result<Query<AuditQuery>, QueryRejection>,
) -> Result<Json<AuditPage>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let limit = q.limit.unwrap_or(100);
    if limit == 0 || limit > 1_000 {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("limit: {limit} is not in 1..=1000"),
        ));
    }
    let before = match &q.cursor {
        Some(c) => Some(
            c.parse::<u64>()
                .ok()
                .filter(|n| *n > 0 && !c.starts_with('0') && c.len() <= 18)
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "invalid_cursor",
                        format!("cursor: {c:?} is not a cursor from next_cursor"),
                    )
                })?,
        ),
        None => None,
    };
    let page = s.engine.store().audit_list(before, limit + 1).await?;
    let more = page.len() > limit as usize;
    let entries: Vec<AuditView> = page
        .into_iter()
        .take(limit as usize)
        .map(AuditView::from)
        .collect();
    let next_cursor = if more {
        entries.last().map(|e| e.seq.to_string())
    } else {
        None
    };
    Ok(Json(AuditPage {
        entries,
        next_cursor,
    }))
}
