//! Bulk tasks in the console: `GET /ui/tasks/new` (what a filter selects now, a dry run,
//! and the form that starts the task), `POST /ui/tasks` (start it), `GET /ui/tasks` and
//! `GET /ui/tasks/{id}` (progress: total, acted on, refused, each said in words; the page refreshes itself while
//! the task runs), `POST /ui/tasks/{id}/{pause|resume|cancel}`. Creating and changing a
//! task is `api::tasks::create` / `transition`, audited as the session's token.

use super::html::{self, esc, url};
use super::{api_error, Ui};
use crate::api::tasks::{self as api_tasks, Created, TaskFilter, TaskRequest, TaskView};
use crate::api::{ApiError, AppState};
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;
use std::fmt::Write as _;

/// Seconds between refreshes of a running task's page.
const REFRESH_SECONDS: u32 = 1;

/// The fields of a task, in a query (confirm page) or a form (create).
#[derive(Debug, Default, Deserialize)]
pub struct TaskForm {
    /// Checked by the session gate.
    #[allow(dead_code)]
    csrf: Option<String>,
    action: Option<String>,
    queue: Option<String>,
    state: Option<String>,
    key: Option<String>,
    error_class: Option<String>,
    q: Option<String>,
    since: Option<String>,
    until: Option<String>,
    finished_since: Option<String>,
    finished_until: Option<String>,
    fingerprint: Option<String>,
    rate: Option<String>,
    reason: Option<String>,
}

fn some(v: &Option<String>) -> Option<String> {
    v.as_ref()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

impl TaskForm {
    fn request(&self, dry_run: bool) -> TaskRequest {
        TaskRequest {
            action: some(&self.action).unwrap_or_default(),
            filter: TaskFilter {
                queue: some(&self.queue),
                state: some(&self.state),
                key: some(&self.key),
                error_class: some(&self.error_class),
                q: some(&self.q),
                since: some(&self.since),
                until: some(&self.until),
                finished_since: some(&self.finished_since),
                finished_until: some(&self.finished_until),
                fingerprint: some(&self.fingerprint),
            },
            rate: some(&self.rate),
            dry_run,
            reason: some(&self.reason).filter(|_| self.action.as_deref() == Some("kill")),
            stop_failure_ratio: None,
            stop_min_outcomes: None,
        }
    }

    /// Hidden inputs carrying the filter and the action.
    fn hidden(&self) -> String {
        let mut b = String::new();
        for (k, v) in [
            ("action", &self.action),
            ("queue", &self.queue),
            ("state", &self.state),
            ("key", &self.key),
            ("error_class", &self.error_class),
            ("q", &self.q),
            ("since", &self.since),
            ("until", &self.until),
            ("finished_since", &self.finished_since),
            ("finished_until", &self.finished_until),
            ("fingerprint", &self.fingerprint),
        ] {
            if let Some(v) = some(v) {
                let _ = write!(
                    b,
                    "<input type=\"hidden\" name=\"{k}\" value=\"{}\">",
                    esc(&v)
                );
            }
        }
        b
    }
}

fn not_admin(ui: &Ui) -> Response {
    html::error_page(
        StatusCode::FORBIDDEN,
        Some(ui),
        "Not allowed",
        "Bulk actions need a token with the admin scope.",
    )
}

fn filter_list(filter: &serde_json::Value) -> String {
    let Some(obj) = filter.as_object() else {
        return String::new();
    };
    let mut b = String::from("<dl class=\"kv\">");
    for (k, v) in obj {
        let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
        let _ = write!(b, "<dt>{}</dt><dd class=\"mono\">{}</dd>", esc(k), esc(&v));
    }
    b.push_str("</dl>");
    b
}

/// `GET /ui/tasks/new?action=…&<filters>`: the dry-run count and the confirm form.
pub async fn confirm(
    State(s): State<AppState>,
    Extension(ui): Extension<Ui>,
    q: Result<Query<TaskForm>, QueryRejection>,
) -> Response {
    if !ui.can_act() {
        return not_admin(&ui);
    }
    let f = q.map(|Query(f)| f).unwrap_or_default();
    let dry = match api_tasks::create(&s, &ui.caller, f.request(true)).await {
        Ok(Created::DryRun(d)) => d,
        Ok(Created::Task(_)) => {
            return api_error(
                &ui,
                ApiError::bad_request("internal", "a dry run made a task"),
            )
        }
        Err(e) => return api_error(&ui, e),
    };
    let action = dry.action.as_str();
    let mut b = format!("<h1>{} — confirm</h1>", esc(&capital(action)));
    let _ = write!(
        b,
        "<div class=\"card\"><p>This selects <b class=\"total\">{}</b> message{} now:</p>{}</div>",
        dry.total,
        if dry.total == 1 { "" } else { "s" },
        filter_list(&dry.filter)
    );
    if dry.total == 0 {
        b.push_str("<p class=\"muted\">Nothing to do.</p>");
    } else {
        let reason = if action == "kill" {
            "<label>Reason<input name=\"reason\" placeholder=\"kept in each message's history\"></label>"
        } else {
            ""
        };
        let danger = if action == "redrive" {
            ""
        } else {
            " class=\"danger\""
        };
        let _ = write!(
            b,
            "<h2>Start the task</h2><form class=\"search\" method=\"post\" action=\"/ui/tasks\">{}{}\
             <label>Rate<input name=\"rate\" value=\"100/s\" placeholder=\"as fast as possible\"></label>{reason}\
             <button{danger} id=\"start-task\">{} {} messages</button>\
             <a class=\"button secondary\" href=\"/ui/groups\">Cancel</a></form>\
             <p class=\"muted\">The task runs in the server, survives restarts, and can be paused or cancelled. \
             Messages published after it starts are not selected.{}</p>",
            html::csrf_field(&ui),
            f.hidden(),
            esc(&capital(action)),
            dry.total,
            if action == "redrive" {
                " A redrive stops by itself when more than half of the messages it redrove fail again."
            } else {
                ""
            }
        );
    }
    html::page(StatusCode::OK, Some(&ui), "/ui/tasks", "Confirm", &b)
}

fn capital(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}

/// `POST /ui/tasks`: start the task, then its page.
pub async fn create(
    State(s): State<AppState>,
    Extension(ui): Extension<Ui>,
    body: Bytes,
) -> Response {
    let f: TaskForm = serde_urlencoded::from_bytes(&body).unwrap_or_default();
    match api_tasks::create(&s, &ui.caller, f.request(false)).await {
        Ok(Created::Task(t)) => super::session::see_other(&format!("/ui/tasks/{}", url(&t.id))),
        Ok(Created::DryRun(_)) => super::session::see_other("/ui/tasks"),
        Err(e) => api_error(&ui, e),
    }
}

/// `GET /ui/tasks`.
pub async fn list(State(s): State<AppState>, Extension(ui): Extension<Ui>) -> Response {
    let tasks = match s.engine.store().tasks(None, 200).await {
        Ok(t) => t,
        Err(e) => return api_error(&ui, e.into()),
    };
    let views: Vec<TaskView> = tasks.iter().map(TaskView::of).collect();
    let mut b = String::from("<h1>Tasks</h1>");
    if views.is_empty() {
        b.push_str("<p class=\"muted\">No bulk task yet. Start one from <a href=\"/ui/groups\">a failure group</a> or a <a href=\"/ui/messages\">search</a>.</p>");
        return html::page(StatusCode::OK, Some(&ui), "/ui/tasks", "Tasks", &b);
    }
    let running = views.iter().any(|t| t.state == "running");
    b.push_str(
        "<table class=\"tasks\"><thead><tr><th>Task</th><th>Action</th><th>State</th><th>Progress</th>\
         <th class=\"num\" title=\"acted on: redriven, killed or deleted; refused: no longer in a state the action \
         applies to, or gone\">Acted on / refused / total</th><th>By</th><th>Created</th></tr></thead><tbody>",
    );
    for t in &views {
        let _ = write!(
            b,
            "<tr><td class=\"mono\"><a href=\"/ui/tasks/{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td>\
             <td class=\"num\">{} / {} / {}</td><td class=\"mono\">{}</td><td>{}</td></tr>",
            url(&t.id),
            esc(&t.id),
            esc(&t.action),
            html::badge(&t.state),
            html::progress(t.total, t.done, t.failed),
            t.done,
            t.failed,
            t.total,
            esc(&t.created_by),
            html::time(t.created_at)
        );
    }
    b.push_str("</tbody></table>");
    let html = html::frame(
        Some(&ui),
        "/ui/tasks",
        "Tasks",
        &b,
        running.then_some(REFRESH_SECONDS + 1),
    );
    html::respond(StatusCode::OK, html)
}

/// `GET /ui/tasks/{id}`: progress, refreshing itself while the task runs.
pub async fn detail(
    State(s): State<AppState>,
    Extension(ui): Extension<Ui>,
    Path(id): Path<String>,
) -> Response {
    let t = match crate::api::tasks::load(&s, &id).await {
        Ok(t) => TaskView::of(&t),
        Err(e) => return api_error(&ui, e),
    };
    let mut b = format!(
        "<h1>Task <span class=\"mono\">{}</span> <span id=\"task-state\">{}</span></h1>",
        esc(&t.id),
        html::badge(&t.state)
    );
    let finished = t.done + t.failed;
    let pct = if t.total == 0 {
        100.0
    } else {
        (finished as f64 / t.total as f64 * 100.0).min(100.0)
    };
    let _ = write!(
        b,
        "<div class=\"card\">{}<p><b id=\"task-progress\">{} of {}</b> ({pct:.0} %): {}</p>{}\
         <dl class=\"kv\"><dt>action</dt><dd>{}</dd><dt>rate</dt><dd>{}</dd>\
         <dt>created by</dt><dd class=\"mono\">{}</dd><dt>created</dt><dd>{}</dd><dt>updated</dt><dd>{}</dd>{}</dl></div>",
        html::progress(t.total, t.done, t.failed),
        finished,
        t.total,
        counts_sentence(&t),
        counts_legend(&t),
        esc(&t.action),
        esc(t.rate.as_deref().unwrap_or("as fast as possible")),
        esc(&t.created_by),
        html::time(t.created_at),
        html::time(t.updated_at),
        t.stop_reason
            .as_deref()
            .map(|r| {
                let label = match t.state.as_str() {
                    "stopped" => "why it stopped",
                    "cancelled" => "why it was cancelled",
                    _ => "last refusal",
                };
                format!("<dt>{label}</dt><dd id=\"task-reason\">{}</dd>", esc(r))
            })
            .unwrap_or_default()
    );
    b.push_str("<h2>Selection</h2>");
    b.push_str(&filter_list(&t.filter));
    if ui.can_act() {
        let csrf = html::csrf_field(&ui);
        let mut forms = String::new();
        let mut button = |verb: &str, class: &str| {
            let _ = write!(
                forms,
                "<form class=\"inline\" method=\"post\" action=\"/ui/tasks/{}/{verb}\">{csrf}<button{class} id=\"task-{verb}\">{}</button></form> ",
                url(&t.id),
                capital(verb)
            );
        };
        match t.state.as_str() {
            "running" => {
                button("pause", " class=\"secondary\"");
                button("cancel", " class=\"danger\"");
            }
            "paused" => {
                button("resume", "");
                button("cancel", " class=\"danger\"");
            }
            _ => {}
        }
        if !forms.is_empty() {
            let _ = write!(b, "<h2>Control</h2><div>{forms}</div>");
        }
    }
    let html = html::frame(
        Some(&ui),
        "/ui/tasks",
        &format!("Task {}", t.id),
        &b,
        (t.state == "running").then_some(REFRESH_SECONDS),
    );
    html::respond(StatusCode::OK, html)
}

/// What a task's action did to a message, in the past tense (`redriven`).
fn acted(action: &str) -> &'static str {
    redrive_storage::TaskAction::past_tense_of(action)
}

/// The counts in words: `22 redriven, 0 refused.` (issue 15: a stopped redrive read
/// "22 done, 0 failed" beside "20 failed again").
fn counts_sentence(t: &TaskView) -> String {
    format!(
        "<span class=\"done\" id=\"task-done\">{} {}</span>, <span class=\"failed\" id=\"task-refused\">{} refused</span>.",
        t.done,
        acted(&t.action),
        t.failed
    )
}

/// What each count means, under them.
fn counts_legend(t: &TaskView) -> String {
    let mut b = format!(
        "<p class=\"muted\" id=\"task-legend\"><b>{}</b>: the task {} them. <b>refused</b>: the store refused the {} \
         when the task reached them (no longer in a state it applies to, changed by someone else meanwhile, or gone).",
        acted(&t.action),
        match t.action.as_str() {
            "redrive" => "redrove",
            _ => acted(&t.action),
        },
        esc(&t.action)
    );
    if let Some(ratio) = t.stop_failure_ratio {
        let _ = write!(
            b,
            " A redriven message that fails again still counts as redriven: the stop rule watches those, and stops \
             the task when more than {:.0} % of the last {} whose outcome is known failed again.",
            ratio * 100.0,
            crate::engine::tasks::OUTCOME_WINDOW
        );
    }
    b.push_str("</p>");
    b
}

/// `POST /ui/tasks/{id}/{pause|resume|cancel}`.
pub async fn transition(
    State(s): State<AppState>,
    Extension(ui): Extension<Ui>,
    Path((id, verb)): Path<(String, String)>,
) -> Response {
    let verb: &'static str = match verb.as_str() {
        "pause" => "pause",
        "resume" => "resume",
        "cancel" => "cancel",
        _ => {
            return api_error(
                &ui,
                ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such task action"),
            )
        }
    };
    match api_tasks::transition(&s, &ui.caller, &id, verb).await {
        Ok(_) => super::session::see_other(&format!("/ui/tasks/{}", url(&id))),
        Err(e) => api_error(&ui, e),
    }
}
