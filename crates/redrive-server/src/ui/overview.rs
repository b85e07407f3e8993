//! `GET /ui`: every queue with its counts per state and oldest ready age, and charts of
//! published / retried / dead / done per minute over the last hour and the last day.

use super::html::{self, esc, url};
use super::{api_error, charts, Ui};
use crate::api::queues::{self, QueueView};
use crate::api::AppState;
use crate::metrics::series::{minute_of, MINUTES};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use redrive_core::{State as MsgState, Timestamp};
use std::fmt::Write as _;

/// The overview.
pub async fn page(State(s): State<AppState>, Extension(ui): Extension<Ui>) -> Response {
    let list = match queues::list(State(s.clone())).await {
        Ok(l) => l.0.queues,
        Err(e) => return api_error(&ui, e),
    };
    let now_minute = minute_of(Timestamp::now().as_millis());
    let series = s.metrics.series();
    let mut b = String::new();
    b.push_str("<h1>Overview</h1>");
    let _ = write!(
        b,
        "<p class=\"muted\">Charts count per minute since start-up at {} (kept in memory for a \
         day; a restart begins them again — Prometheus keeps the long history).</p>",
        html::time(Timestamp::from_millis(s.metrics.started_at_ms()))
    );
    b.push_str("<div class=\"grid\">");
    b.push_str(&charts::lines(
        "Last hour, per minute",
        &series.window(None, now_minute, 60),
        10,
    ));
    b.push_str(&charts::lines(
        "Last day, per minute",
        &series.window(None, now_minute, MINUTES),
        180,
    ));
    b.push_str("</div>");
    b.push_str("<h2>Queues</h2>");
    b.push_str(&queue_table(&list));
    html::page(StatusCode::OK, Some(&ui), "/ui", "Overview", &b)
}

/// The queues table (shared with nothing else, but long).
fn queue_table(list: &[QueueView]) -> String {
    if list.is_empty() {
        return "<p class=\"muted\">No queues yet: a queue exists once a message is published \
                to it or it has a <code>[queues.NAME]</code> section.</p>"
            .to_owned();
    }
    let mut b = String::from("<table class=\"queues\"><thead><tr><th>Queue</th>");
    for st in MsgState::ALL {
        let _ = write!(b, "<th class=\"num\">{}</th>", st.as_str());
    }
    b.push_str(
        "<th class=\"num\">Oldest ready</th><th>Delivery</th><th>Policy</th></tr></thead><tbody>",
    );
    for q in list {
        let name = esc(&q.queue);
        let _ = write!(
            b,
            "<tr><td><a href=\"/ui/queues/{}\">{name}</a></td>",
            url(&q.queue)
        );
        for st in MsgState::ALL {
            let n = q.counts.get(st.as_str()).copied().unwrap_or(0);
            if n == 0 {
                b.push_str("<td class=\"num muted\">0</td>");
            } else {
                let _ = write!(
                    b,
                    "<td class=\"num\"><a href=\"/ui/messages?queue={}&amp;state={}\">{n}</a></td>",
                    url(&q.queue),
                    st.as_str()
                );
            }
        }
        let age = q
            .oldest_ready_age_seconds
            .map_or_else(|| "—".to_owned(), html::age);
        let _ = write!(
            b,
            "<td class=\"num\">{age}</td><td>{}</td><td class=\"muted\">{}</td></tr>",
            esc(q.delivery),
            esc(&q.policy_summary)
        );
    }
    b.push_str("</tbody></table>");
    b
}
