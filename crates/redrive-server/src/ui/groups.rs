//! `GET /ui/groups`: dead letters grouped by failure fingerprint, largest first (the data
//! of `GET /v1/failure-groups`), each linked to the list of all its messages
//! (`/ui/messages?state=dead&fingerprint=…`) and with a bulk action: redrive, kill or delete
//! the group, after a dry-run count on a confirm page (`/ui/tasks/new`).

use super::html::{self, esc, url};
use super::{api_error, Ui};
use crate::api::groups;
use crate::api::AppState;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;
use std::fmt::Write as _;

/// Groups shown.
const GROUPS: u32 = 100;

/// The page's filter.
#[derive(Debug, Default, Deserialize)]
pub struct GroupsFilter {
    queue: Option<String>,
}

/// The failure groups.
pub async fn page(
    State(s): State<AppState>,
    Extension(ui): Extension<Ui>,
    q: Result<Query<GroupsFilter>, QueryRejection>,
) -> Response {
    let queue = q
        .ok()
        .and_then(|Query(f)| f.queue)
        .filter(|q| !q.is_empty());
    let found = match groups::collect(&s, queue.clone(), GROUPS).await {
        Ok(g) => g,
        Err(e) => return api_error(&ui, e),
    };
    let mut b = String::from("<h1>Failure groups</h1>");
    let _ = write!(
        b,
        "<form class=\"search\" method=\"get\" action=\"/ui/groups\"><label>Queue<input name=\"queue\" value=\"{}\" placeholder=\"every queue\"></label><button>Show</button></form>",
        esc(queue.as_deref().unwrap_or(""))
    );
    let _ = write!(
        b,
        "<p class=\"muted\">Dead letters grouped by their last error (class and message, with ids, numbers and hex \
         normalised away; HTTP statuses and SQLSTATEs kept), largest first: {} dead letters read{}. \
         A fingerprint lists all of its messages.</p>",
        found.scanned,
        if found.truncated {
            " (the newest 100,000: there are more)"
        } else {
            ""
        }
    );
    if found.groups.is_empty() {
        b.push_str("<p class=\"muted\">No dead letters.</p>");
        return html::page(
            StatusCode::OK,
            Some(&ui),
            "/ui/groups",
            "Failure groups",
            &b,
        );
    }
    b.push_str(
        "<table class=\"groups\"><thead><tr><th class=\"num\">Dead</th><th>Fingerprint</th><th>Queues</th><th>Why dead</th>\
         <th>Example</th><th>First – last</th>",
    );
    if ui.can_act() {
        b.push_str("<th>Bulk action</th>");
    }
    b.push_str("</tr></thead><tbody>");
    for g in &found.groups {
        let single = (g.queues.len() == 1).then(|| g.queues[0].as_str());
        let queues = g
            .queues
            .iter()
            .map(|q| {
                format!(
                    "<a href=\"/ui/messages?queue={}&amp;state=dead\">{}</a>",
                    url(q),
                    esc(q)
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let samples = g
            .sample_ids
            .iter()
            .take(3)
            .map(|id| {
                format!(
                    "<a class=\"mono\" href=\"/ui/messages/{}\">{}</a>",
                    url(id),
                    // The tail: ids are UUIDv7, whose first digits are the time (the same
                    // for messages that died together).
                    esc(id.get(id.len().saturating_sub(8)..).unwrap_or(id))
                )
            })
            .collect::<Vec<_>>()
            .join(" ");
        // Every message of the group, not only its samples: the search by fingerprint.
        let all = format!(
            "/ui/messages?state=dead&amp;fingerprint={}",
            url(&g.fingerprint)
        );
        let _ = write!(
            b,
            "<tr><td class=\"num\"><b>{}</b></td><td class=\"mono fingerprint\"><a href=\"{all}\">{}</a></td><td>{queues}</td><td>{}</td>\
             <td class=\"err\">{}<div class=\"muted\">{samples} <a class=\"all\" href=\"{all}\">all {} →</a></div></td><td>{}<br>{}</td>",
            g.count,
            html::short(&g.fingerprint, 160),
            esc(&g.dead_reasons.join(", ")),
            html::short(g.example.as_deref().unwrap_or(""), 200),
            g.count,
            html::time_opt(g.first_at),
            html::time_opt(g.last_at),
        );
        if ui.can_act() {
            let _ = write!(
                b,
                "<td><form method=\"get\" action=\"/ui/tasks/new\" class=\"group-action\">\
                 <input type=\"hidden\" name=\"state\" value=\"dead\">\
                 <input type=\"hidden\" name=\"fingerprint\" value=\"{}\">{}\
                 <select name=\"action\"><option value=\"redrive\">redrive</option><option value=\"kill\">kill</option><option value=\"delete\">delete</option></select> \
                 <button>Review…</button></form></td>",
                esc(&g.fingerprint),
                single
                    .map(|q| format!("<input type=\"hidden\" name=\"queue\" value=\"{}\">", esc(q)))
                    .unwrap_or_default()
            );
        }
        b.push_str("</tr>");
    }
    b.push_str("</tbody></table>");
    html::page(
        StatusCode::OK,
        Some(&ui),
        "/ui/groups",
        "Failure groups",
        &b,
    )
}
