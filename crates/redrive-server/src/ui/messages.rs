//! `GET /ui/messages` (search with every filter of `GET /v1/messages`, the same query
//! parameter names, the count of the whole result, cursor pages), `GET
//! /ui/messages/export` (the API's export, same parameters), `GET /ui/messages/{id}`
//! (payload, headers, the attempt timeline, actions) and the actions' `POST`s: redrive,
//! edit the payload then redrive, kill, delete. Each action is the API's: the same
//! engine call, audited with the same action name and the session's token name.

use super::html::{self, esc, query, url};
use super::{api_error, Ui};
use crate::api::messages::actions::{act, load, Action};
use crate::api::messages::{self as api_messages, filter_of, SearchQuery};
use crate::api::{ApiError, AppState};
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use redrive_core::{HistoryEvent, Message, State as MsgState};
use serde::Deserialize;
use std::fmt::Write as _;

/// Messages per page of the search.
pub const PAGE: u32 = 50;

fn bad_query(e: QueryRejection) -> ApiError {
    ApiError::bad_request("invalid_query", e.body_text())
}

/// What a redirect after an action says on the next page (`?done=…`): fixed texts only.
#[derive(Debug, Default, Deserialize)]
pub struct Done {
    done: Option<String>,
}

fn done_notice(d: &Done) -> String {
    let text = match d.done.as_deref() {
        Some("redriven") => "Redriven: the message is ready now, with a fresh attempt budget.",
        Some("edited") => "Payload replaced and redriven: the message is ready now.",
        Some("killed") => "Killed: the message is dead (reason killed).",
        Some("deleted") => "Deleted.",
        _ => return String::new(),
    };
    html::notice("ok", text)
}

/// The search page.
pub async fn search(
    State(s): State<AppState>,
    Extension(ui): Extension<Ui>,
    q: Result<Query<SearchQuery>, QueryRejection>,
    done: Result<Query<Done>, QueryRejection>,
) -> Response {
    let q = match q {
        Ok(Query(q)) => blanks_unset(q),
        Err(e) => return api_error(&ui, bad_query(e)),
    };
    let mut b = String::from("<h1>Messages</h1>");
    if let Ok(Query(d)) = &done {
        b.push_str(&done_notice(d));
    }
    b.push_str(&search_form(&q));
    let filter = match filter_of(&q, s.engine.clock().now()) {
        Ok(f) => f,
        Err(e) => {
            b.push_str(&html::notice("error", &e.message));
            return html::page(
                StatusCode::BAD_REQUEST,
                Some(&ui),
                "/ui/messages",
                "Messages",
                &b,
            );
        }
    };
    let store = s.engine.store();
    let total = match store.count(filter.clone()).await {
        Ok(n) => n,
        Err(e) => return api_error(&ui, e.into()),
    };
    let page = match store.search(filter, PAGE, q.cursor.clone()).await {
        Ok(p) => p,
        Err(e) => return api_error(&ui, e.into()),
    };
    let filters = [
        ("queue", q.queue.as_deref()),
        ("state", q.state.as_deref()),
        ("key", q.key.as_deref()),
        ("error_class", q.error_class.as_deref()),
        ("q", q.q.as_deref()),
        ("since", q.since.as_deref()),
        ("until", q.until.as_deref()),
        ("finished_since", q.finished_since.as_deref()),
        ("finished_until", q.finished_until.as_deref()),
        ("fingerprint", q.fingerprint.as_deref()),
    ];
    let base = query(&filters);
    let joiner = if base.is_empty() { "?" } else { "&amp;" };
    let base_html = esc(&base);
    let _ = write!(
        b,
        "<div class=\"pager\"><b class=\"total\">{total} message{}</b> match{}\
         <a class=\"button secondary\" href=\"/ui/messages/export{base_html}{joiner}format=jsonl\">Export all (JSON lines)</a>\
         <a class=\"button secondary\" href=\"/ui/messages/export{base_html}{joiner}format=csv\">Export all (CSV)</a>",
        if total == 1 { "" } else { "s" },
        if total == 1 { "es" } else { "" },
    );
    if ui.can_act() && total > 0 && !base.is_empty() {
        for action in ["redrive", "kill", "delete"] {
            let _ = write!(
                b,
                "<a class=\"button secondary\" href=\"/ui/tasks/new{base_html}{joiner}action={action}\">{} all…</a>",
                capitalised(action)
            );
        }
    }
    b.push_str("</div>");
    if page.messages.is_empty() {
        b.push_str("<p class=\"muted\">Nothing matches.</p>");
    } else {
        b.push_str(&result_table(&page.messages));
    }
    if let Some(c) = &page.next_cursor {
        let _ = write!(
            b,
            "<div class=\"pager\"><a class=\"button secondary next\" href=\"/ui/messages{base_html}{joiner}cursor={}\">Next page →</a></div>",
            url(c)
        );
    }
    html::page(StatusCode::OK, Some(&ui), "/ui/messages", "Messages", &b)
}

/// The search form sends every field, empty ones as `name=`: an empty filter is no filter.
fn blanks_unset(mut q: SearchQuery) -> SearchQuery {
    for f in [
        &mut q.queue,
        &mut q.state,
        &mut q.key,
        &mut q.error_class,
        &mut q.q,
        &mut q.since,
        &mut q.until,
        &mut q.finished_since,
        &mut q.finished_until,
        &mut q.fingerprint,
        &mut q.cursor,
        &mut q.format,
    ] {
        if f.as_deref().is_some_and(|v| v.trim().is_empty()) {
            *f = None;
        }
    }
    q
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}

fn search_form(q: &SearchQuery) -> String {
    let text = |name: &str, label: &str, v: &Option<String>, ph: &str| {
        format!(
            "<label>{label}<input name=\"{name}\" value=\"{}\" placeholder=\"{}\"></label>",
            esc(v.as_deref().unwrap_or("")),
            esc(ph)
        )
    };
    let select = |name: &str, label: &str, v: &Option<String>, options: &[&str]| {
        let mut s =
            format!("<label>{label}<select name=\"{name}\"><option value=\"\">any</option>");
        for o in options {
            let sel = if v.as_deref() == Some(o) {
                " selected"
            } else {
                ""
            };
            let _ = write!(s, "<option value=\"{o}\"{sel}>{o}</option>");
        }
        s.push_str("</select></label>");
        s
    };
    let states: Vec<&str> = MsgState::ALL.iter().map(|s| s.as_str()).collect();
    format!(
        "<form class=\"search\" method=\"get\" action=\"/ui/messages\">{}{}{}{}{}{}{}{}{}{}<button>Search</button>\
         <a class=\"button secondary\" href=\"/ui/messages\">Clear</a>\
         <p class=\"muted hint\">Times are UTC: an RFC 3339 time (<code>2026-01-31T08:00:00Z</code>) or how long ago \
         (<code>12h</code>, <code>30m</code>, <code>7d</code>). Created: when published; finished: when it became done or dead.</p></form>",
        text("queue", "Queue", &q.queue, "orders"),
        select("state", "State", &q.state, &states),
        text("key", "Key", &q.key, "customer-42"),
        select(
            "error_class",
            "Error class",
            &q.error_class,
            &["transient", "rate_limited", "permanent"]
        ),
        text("q", "Text (payload or error)", &q.q, "timeout"),
        text(
            "fingerprint",
            "Failure group",
            &q.fingerprint,
            "transient: HTTP 503 from <n>"
        ),
        text("since", "Created since (UTC)", &q.since, "12h"),
        text("until", "Created until (UTC)", &q.until, ""),
        text(
            "finished_since",
            "Finished since (UTC)",
            &q.finished_since,
            "2026-01-31T08:00:00Z"
        ),
        text("finished_until", "Finished until (UTC)", &q.finished_until, ""),
    )
}

/// Characters of a payload shown in a search row.
const SNIPPET_CHARS: usize = 80;

/// The start of `payload`'s compact JSON, at most [`SNIPPET_CHARS`] characters (with `…`
/// when cut), escaped. Serialising stops after a few hundred bytes: a large payload costs
/// no more than a small one.
fn snippet(payload: &serde_json::Value) -> String {
    /// A writer that keeps the first `limit` bytes and then refuses more.
    struct Head {
        bytes: Vec<u8>,
        limit: usize,
    }
    impl std::io::Write for Head {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let room = self.limit - self.bytes.len();
            if room == 0 {
                return Err(std::io::Error::other("enough"));
            }
            let n = buf.len().min(room);
            self.bytes.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    // A character is at most 4 bytes; one more than the snippet says whether it was cut.
    let mut head = Head {
        bytes: Vec::new(),
        limit: (SNIPPET_CHARS + 1) * 4,
    };
    let _ = serde_json::to_writer(&mut head, payload);
    let text = String::from_utf8_lossy(&head.bytes);
    // A cut in the middle of a character shows as U+FFFD at the very end: past the snippet.
    html::short(&text, SNIPPET_CHARS)
}

fn result_table(ms: &[Message]) -> String {
    let mut b = String::from(
        "<table class=\"results\"><thead><tr><th>Id</th><th>Queue</th><th>State</th><th class=\"num\">Attempts</th>\
         <th>Last error</th><th>Payload</th><th>Key</th><th>Created</th><th>Finished</th></tr></thead><tbody>",
    );
    for m in ms {
        let err = m.last_error.as_ref().map_or_else(String::new, |e| {
            format!(
                "<span class=\"badge\">{}</span> {}",
                e.class.as_str(),
                html::short(e.message.as_deref().unwrap_or(""), 140)
            )
        });
        let _ = write!(
            b,
            "<tr><td class=\"mono\"><a href=\"/ui/messages/{id}\">{id}</a></td><td><a href=\"/ui/queues/{}\">{}</a></td>\
             <td>{}{}</td><td class=\"num\">{}</td><td class=\"err\">{err}</td><td class=\"mono snippet\">{}</td>\
             <td class=\"mono\">{}</td><td>{}</td><td>{}</td></tr>",
            url(&m.queue),
            esc(&m.queue),
            html::badge(m.state.as_str()),
            m.dead_reason
                .map(|r| format!(" <span class=\"muted\">{}</span>", r.as_str()))
                .unwrap_or_default(),
            m.attempts,
            snippet(&m.payload),
            esc(m.key.as_deref().unwrap_or("")),
            html::time(m.created_at),
            html::time_opt(m.finished_at),
            id = m.id,
        );
    }
    b.push_str("</tbody></table>");
    b
}

/// The whole result of a search, streamed: `GET /v1/messages/export`'s code and
/// parameters (`format=csv|jsonl`), authorised by the session.
pub async fn export(
    State(s): State<AppState>,
    Extension(ui): Extension<Ui>,
    q: Result<Query<SearchQuery>, QueryRejection>,
) -> Response {
    let q = q.map(|Query(q)| Query(blanks_unset(q)));
    match api_messages::export(State(s), q).await {
        Ok(r) => r,
        Err(e) => api_error(&ui, e),
    }
}

/// One message.
pub async fn detail(
    State(s): State<AppState>,
    Extension(ui): Extension<Ui>,
    Path(id): Path<String>,
    done: Result<Query<Done>, QueryRejection>,
) -> Response {
    match load(&s, &id).await {
        Ok(m) => {
            let notice = done.map(|Query(d)| done_notice(&d)).unwrap_or_default();
            message_page(StatusCode::OK, &ui, &m, &notice, None)
        }
        Err(e) => api_error(&ui, e),
    }
}

/// The message page; `notice` is HTML shown on top, `edit` the text to put back in the
/// payload editor (after a refused edit).
fn message_page(
    status: StatusCode,
    ui: &Ui,
    m: &Message,
    notice: &str,
    edit: Option<&str>,
) -> Response {
    let mut b = String::new();
    let _ = write!(
        b,
        "<h1>Message <span class=\"mono\">{}</span> {}</h1>{notice}",
        m.id,
        html::badge(m.state.as_str())
    );
    b.push_str("<div class=\"card\"><dl class=\"kv\">");
    let mut kv = |k: &str, v: String| {
        let _ = write!(b, "<dt>{k}</dt><dd>{v}</dd>");
    };
    kv(
        "queue",
        format!(
            "<a href=\"/ui/queues/{}\">{}</a>",
            url(&m.queue),
            esc(&m.queue)
        ),
    );
    kv("attempts", m.attempts.to_string());
    if let Some(r) = m.dead_reason {
        kv("dead because", esc(r.as_str()));
    }
    if let Some(e) = &m.last_error {
        kv(
            "last error",
            format!(
                "<span class=\"badge\">{}</span> <span class=\"err\">{}</span>",
                e.class.as_str(),
                esc(e.message.as_deref().unwrap_or(""))
            ),
        );
    }
    kv("key", esc(m.key.as_deref().unwrap_or("—")));
    if let Some(k) = &m.idempotency_key {
        kv("idempotency key", esc(k));
    }
    kv("priority", m.priority.to_string());
    kv("created", html::time(m.created_at));
    kv("updated", html::time(m.updated_at));
    if m.due_at.is_some() {
        kv("due", html::time_opt(m.due_at));
    }
    if m.finished_at.is_some() {
        kv("finished", html::time_opt(m.finished_at));
    }
    if let Some(t) = &m.target_url {
        kv("target", esc(t));
    }
    b.push_str("</dl></div>");

    let pretty = serde_json::to_string_pretty(&m.payload).unwrap_or_default();
    let _ = write!(
        b,
        "<h2>Payload</h2><pre class=\"payload\">{}</pre>",
        esc(&pretty)
    );
    b.push_str("<h2>Headers</h2>");
    if m.headers.is_empty() {
        b.push_str("<p class=\"muted\">None.</p>");
    } else {
        b.push_str("<table class=\"headers\"><tbody>");
        for (k, v) in &m.headers {
            let _ = write!(
                b,
                "<tr><th class=\"mono\">{}</th><td class=\"mono\">{}</td></tr>",
                esc(k),
                esc(v)
            );
        }
        b.push_str("</tbody></table>");
    }
    b.push_str("<h2>Timeline</h2>");
    b.push_str(&timeline(m));
    if ui.can_act() {
        b.push_str(&actions(ui, m, edit));
    }
    html::page(
        status,
        Some(ui),
        "/ui/messages",
        &format!("Message {}", m.id),
        &b,
    )
}

fn timeline(m: &Message) -> String {
    if m.history.is_empty() {
        return "<p class=\"muted\">No attempt yet.</p>".to_owned();
    }
    let mut b = String::from(
        "<table class=\"timeline\"><thead><tr><th class=\"num\">Attempt</th><th>Time</th><th>Outcome</th><th>Class</th>\
         <th>Error / detail</th><th>Next</th><th class=\"num\">Latency</th><th>Response</th></tr></thead><tbody>",
    );
    for h in &m.history {
        let (outcome, class, detail, next) = match &h.event {
            HistoryEvent::Acked => ("acked", String::new(), String::new(), String::new()),
            HistoryEvent::Republished => (
                "republished",
                String::new(),
                "the broker took the copy".to_owned(),
                String::new(),
            ),
            HistoryEvent::Failed {
                error,
                retry_at,
                dead_reason,
                ..
            } => (
                "failed",
                error.class.as_str().to_owned(),
                esc(error
                    .message
                    .as_deref()
                    .or(error.code.as_deref())
                    .unwrap_or("")),
                match (retry_at, dead_reason) {
                    (_, Some(r)) => format!("dead ({})", r.as_str()),
                    (Some(t), None) => format!("retry at {}", html::time(*t)),
                    (None, None) => "retry now".to_owned(),
                },
            ),
            HistoryEvent::Redriven { edited, task } => (
                "redriven",
                String::new(),
                format!(
                    "{}{}",
                    if *edited { "payload edited" } else { "" },
                    task.as_deref()
                        .map(|t| format!(
                            " by task <a href=\"/ui/tasks/{}\">{}</a>",
                            url(t),
                            esc(t)
                        ))
                        .unwrap_or_default()
                ),
                String::new(),
            ),
            HistoryEvent::Killed { reason } => (
                "killed",
                String::new(),
                esc(reason.as_deref().unwrap_or("")),
                String::new(),
            ),
            HistoryEvent::Waited {
                waited_for,
                since,
                parks,
            } => (
                "waited",
                String::new(),
                format!(
                    "waited for the {} since {} ({}){}",
                    match waited_for {
                        redrive_core::WaitedFor::Breaker => "endpoint's breaker",
                        redrive_core::WaitedFor::Pace => "endpoint's pace",
                        redrive_core::WaitedFor::Budget => "endpoint's retry budget",
                        redrive_core::WaitedFor::Concurrency => "endpoint's concurrency limit",
                    },
                    html::time(*since),
                    html::age(h.at.millis_since(*since) as f64 / 1000.0),
                    match parks {
                        0 => String::new(),
                        1 => ", parked once, uncharged".to_owned(),
                        n => format!(", parked {n} times, uncharged"),
                    }
                ),
                String::new(),
            ),
        };
        let latency = match (&h.response, h.leased_at) {
            (Some(r), _) => format!("{} ms", r.latency_ms),
            (None, Some(l)) => format!("{} ms", h.at.millis_since(l).max(0)),
            _ => String::new(),
        };
        let response = h.response.as_ref().map_or_else(String::new, |r| {
            format!(
                "{} {}",
                r.status
                    .map_or_else(|| "no answer".to_owned(), |s| s.to_string()),
                html::short(r.body.as_deref().unwrap_or(""), 120)
            )
        });
        let _ = write!(
            b,
            "<tr><td class=\"num\">{}</td><td>{}</td><td>{}</td><td>{class}</td><td class=\"err\">{detail}</td><td>{next}</td>\
             <td class=\"num\">{latency}</td><td class=\"mono\">{response}</td></tr>",
            h.attempt,
            html::time(h.at),
            html::badge(outcome),
        );
    }
    b.push_str("</tbody></table>");
    b
}

fn actions(ui: &Ui, m: &Message, edit: Option<&str>) -> String {
    let id = m.id;
    let csrf = html::csrf_field(ui);
    let mut b = String::from("<h2>Actions</h2><div class=\"actions\">");
    if matches!(m.state, MsgState::Dead | MsgState::Scheduled) {
        let _ = write!(
            b,
            "<form class=\"card\" method=\"post\" action=\"/ui/messages/{id}/redrive\">{csrf}\
             <b>Redrive</b><span class=\"muted\">Ready now, with a fresh attempt budget; the history is kept.</span>\
             <button id=\"redrive\">Redrive</button></form>"
        );
        let text = edit
            .map(str::to_owned)
            .unwrap_or_else(|| serde_json::to_string_pretty(&m.payload).unwrap_or_default());
        let _ = write!(
            b,
            "<form class=\"card\" method=\"post\" action=\"/ui/messages/{id}/edit\">{csrf}\
             <b>Edit the payload, then redrive</b><textarea name=\"payload\" spellcheck=\"false\">{}</textarea>\
             <button id=\"edit-redrive\">Save and redrive</button></form>",
            esc(&text)
        );
    }
    if !matches!(m.state, MsgState::Dead | MsgState::Done) {
        let _ = write!(
            b,
            "<form class=\"card\" method=\"post\" action=\"/ui/messages/{id}/kill\">{csrf}\
             <b>Kill</b><label>Reason<input name=\"reason\" placeholder=\"why (kept in the history)\"></label>\
             <button class=\"danger\" id=\"kill\">Kill</button></form>"
        );
    }
    let _ = write!(
        b,
        "<form class=\"card\" method=\"post\" action=\"/ui/messages/{id}/delete\">{csrf}\
         <b>Delete</b><label><span><input type=\"checkbox\" name=\"confirm\" value=\"yes\"> I am sure: it is gone for good</span></label>\
         <button class=\"danger\" id=\"delete\">Delete</button></form></div>"
    );
    b
}

/// The form of the message actions (`csrf` is checked by the session gate).
#[derive(Debug, Default, Deserialize)]
pub struct ActionForm {
    /// Checked by the gate.
    #[allow(dead_code)]
    csrf: Option<String>,
    /// A kill's reason.
    reason: Option<String>,
    /// A delete's confirmation (`yes`).
    confirm: Option<String>,
    /// The edited payload, JSON text.
    payload: Option<String>,
}

fn form(body: &Bytes) -> ActionForm {
    serde_urlencoded::from_bytes(body).unwrap_or_default()
}

fn after(id: &str, done: &str) -> Response {
    super::session::see_other(&format!("/ui/messages/{}?done={done}", url(id)))
}

/// `POST /ui/messages/{id}/redrive`.
pub async fn redrive(
    State(s): State<AppState>,
    Extension(ui): Extension<Ui>,
    Path(id): Path<String>,
) -> Response {
    match act(&s, &ui.caller, &id, Action::Redrive(None)).await {
        Ok(_) => after(&id, "redriven"),
        Err(e) => refused(&s, &ui, &id, e).await,
    }
}

/// `POST /ui/messages/{id}/edit`: parse the payload; invalid JSON or too large → the page
/// again with the error and the text, nothing changed.
pub async fn edit(
    State(s): State<AppState>,
    Extension(ui): Extension<Ui>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let f = form(&body);
    let text = f.payload.unwrap_or_default();
    let payload: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            return match load(&s, &id).await {
                Ok(m) => message_page(
                    StatusCode::BAD_REQUEST,
                    &ui,
                    &m,
                    &html::notice(
                        "error",
                        &format!("The payload is not valid JSON ({e}); nothing was changed."),
                    ),
                    Some(&text),
                ),
                Err(e) => api_error(&ui, e),
            }
        }
    };
    match act(&s, &ui.caller, &id, Action::Redrive(Some(payload))).await {
        Ok(_) => after(&id, "edited"),
        Err(e) => refused(&s, &ui, &id, e).await,
    }
}

/// `POST /ui/messages/{id}/kill`.
pub async fn kill(
    State(s): State<AppState>,
    Extension(ui): Extension<Ui>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let f = form(&body);
    let reason = crate::api::limits::truncate_opt(
        f.reason.filter(|r| !r.trim().is_empty()),
        s.config.max_error_message_bytes,
    );
    match act(&s, &ui.caller, &id, Action::Kill(reason)).await {
        Ok(_) => after(&id, "killed"),
        Err(e) => refused(&s, &ui, &id, e).await,
    }
}

/// `POST /ui/messages/{id}/delete` (needs `confirm=yes`).
pub async fn delete(
    State(s): State<AppState>,
    Extension(ui): Extension<Ui>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let f = form(&body);
    if f.confirm.as_deref() != Some("yes") {
        return refused(
            &s,
            &ui,
            &id,
            ApiError::bad_request(
                "not_confirmed",
                "Tick \"I am sure\" to delete; nothing was changed.",
            ),
        )
        .await;
    }
    match act(&s, &ui.caller, &id, Action::Delete).await {
        Ok(m) => super::session::see_other(&format!(
            "/ui/messages?queue={}&done=deleted",
            url(&m.queue)
        )),
        Err(e) => refused(&s, &ui, &id, e).await,
    }
}

/// An action that was refused: the message page again with why (or the error page when
/// the message cannot be shown).
async fn refused(s: &AppState, ui: &Ui, id: &str, e: ApiError) -> Response {
    match load(s, id).await {
        Ok(m) => message_page(e.status, ui, &m, &html::notice("error", &e.message), None),
        Err(_) => api_error(ui, e),
    }
}
