//! `GET /ui/audit`: the audit log, newest first, a page at a time (`GET /v1/audit`'s data).

use super::html::{self, esc, url};
use super::{api_error, Ui};
use crate::api::AppState;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;
use std::fmt::Write as _;

/// Entries per page.
const PAGE: u32 = 100;

/// The page's cursor.
#[derive(Debug, Default, Deserialize)]
pub struct AuditCursor {
    cursor: Option<u64>,
}

/// The audit log.
pub async fn page(
    State(s): State<AppState>,
    Extension(ui): Extension<Ui>,
    q: Result<Query<AuditCursor>, QueryRejection>,
) -> Response {
    let before = q.ok().and_then(|Query(c)| c.cursor);
    let entries = match s.engine.store().audit_list(before, PAGE + 1).await {
        Ok(e) => e,
        Err(e) => return api_error(&ui, e.into()),
    };
    let more = entries.len() > PAGE as usize;
    let mut b = String::from(
        "<h1>Audit log</h1><p class=\"muted\">Every operator action, through the API or this console, newest first, with the node that did it.</p>",
    );
    if entries.is_empty() {
        b.push_str("<p class=\"muted\">No operator action yet.</p>");
        return html::page(StatusCode::OK, Some(&ui), "/ui/audit", "Audit log", &b);
    }
    b.push_str(
        "<table class=\"audit\"><thead><tr><th>When</th><th>Who</th><th>Action</th><th>Target</th><th>Filter</th>\
         <th class=\"num\">Count</th><th>Detail</th><th>Node</th></tr></thead><tbody>",
    );
    let mut last = None;
    for a in entries.into_iter().take(PAGE as usize) {
        last = Some(a.seq);
        let e = a.entry;
        let target = e.target.as_deref().map_or_else(String::new, |t| {
            let path = if e.action.starts_with("task.") {
                "tasks"
            } else {
                "messages"
            };
            format!(
                "<a class=\"mono\" href=\"/ui/{path}/{}\">{}</a>",
                url(t),
                esc(t)
            )
        });
        let filter = e
            .filter
            .as_ref()
            .map(|f| esc(&f.to_string()))
            .unwrap_or_default();
        let _ = write!(
            b,
            "<tr><td>{}</td><td class=\"mono\">{}</td><td><span class=\"badge\">{}</span></td><td>{target}</td>\
             <td class=\"mono\">{filter}</td><td class=\"num\">{}</td><td>{}</td><td class=\"mono\">{}</td></tr>",
            html::time(a.at),
            esc(&e.actor),
            esc(&e.action),
            e.count,
            esc(e.detail.as_deref().unwrap_or("")),
            // Entries from before the node was recorded have none: shown as a dash.
            e.node.as_deref().map_or_else(|| "<span class=\"muted\">—</span>".to_owned(), esc),
        );
    }
    b.push_str("</tbody></table>");
    if let (true, Some(seq)) = (more, last) {
        let _ = write!(
            b,
            "<div class=\"pager\"><a class=\"button secondary\" href=\"/ui/audit?cursor={seq}\">Older →</a></div>"
        );
    }
    html::page(StatusCode::OK, Some(&ui), "/ui/audit", "Audit log", &b)
}
