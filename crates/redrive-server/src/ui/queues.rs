//! `GET /ui/queues/{queue}`: one queue's counts, its charts, its retry policy as the
//! `policy explain` table, its settings, and its push endpoint or bridge when it has one.

use super::html::{self, esc, url};
use super::{api_error, charts, delivery, Ui};
use crate::api::{endpoints, queues, AppState};
use crate::metrics::series::minute_of;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use redrive_core::{format_duration_ms, State as MsgState, Timestamp};
use std::fmt::Write as _;

/// One queue.
pub async fn page(
    State(s): State<AppState>,
    Extension(ui): Extension<Ui>,
    Path(queue): Path<String>,
) -> Response {
    let q = match queues::get(State(s.clone()), Path(queue.clone())).await {
        Ok(q) => q.0,
        Err(e) => return api_error(&ui, e),
    };
    let mut b = String::new();
    let _ = write!(
        b,
        "<h1>Queue <span class=\"mono\">{}</span></h1><div class=\"cards\">",
        esc(&q.queue)
    );
    for st in MsgState::ALL {
        let n = q.counts.get(st.as_str()).copied().unwrap_or(0);
        let _ = write!(
            b,
            "<a class=\"card\" href=\"/ui/messages?queue={}&amp;state={}\"><div class=\"n\">{n}</div>{}</a>",
            url(&q.queue),
            st.as_str(),
            html::badge(st.as_str())
        );
    }
    let _ = write!(
        b,
        "<div class=\"card\"><div class=\"n\">{}</div>oldest ready</div></div>",
        q.oldest_ready_age_seconds
            .map_or_else(|| "—".to_owned(), html::age)
    );
    let now_minute = minute_of(Timestamp::now().as_millis());
    b.push_str("<h2>Activity</h2><div class=\"grid\">");
    b.push_str(&charts::lines(
        "Last hour, per minute",
        &s.metrics.series().window(Some(&q.queue), now_minute, 60),
        10,
    ));
    b.push_str("</div>");

    b.push_str("<h2>Retry policy</h2>");
    let _ = write!(b, "<p>{}</p>", esc(&q.policy_summary));
    b.push_str(
        "<table class=\"explain\"><thead><tr><th class=\"num\">Attempt</th><th class=\"num\">Wait before it</th>\
         <th class=\"num\">Since the first attempt</th><th>Note</th></tr></thead><tbody>",
    );
    for r in q.policy.explain() {
        let range = |a: u64, z: u64| {
            if a == z {
                format_duration_ms(a)
            } else {
                format!("{} – {}", format_duration_ms(a), format_duration_ms(z))
            }
        };
        let _ = write!(
            b,
            "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            r.attempt,
            range(r.delay_min_ms, r.delay_max_ms),
            range(r.cumulative_min_ms, r.cumulative_max_ms),
            if r.may_exceed_max_age {
                "may fall past max_age (then dead instead)"
            } else {
                ""
            }
        );
    }
    b.push_str("</tbody></table>");

    b.push_str("<h2>Settings</h2><table class=\"settings\"><tbody>");
    let row = |b: &mut String, k: &str, v: &str| {
        let _ = write!(
            b,
            "<tr><th>{}</th><td class=\"mono\">{}</td></tr>",
            esc(k),
            esc(v)
        );
    };
    row(&mut b, "delivery", q.delivery);
    row(
        &mut b,
        "ordering",
        &format!("{:?}", q.ordering).to_lowercase(),
    );
    row(
        &mut b,
        "on_dead",
        &format!("{:?}", q.on_dead).to_lowercase(),
    );
    row(&mut b, "lease", q.lease.as_deref().unwrap_or("default"));
    if let Some(e) = &q.endpoint {
        row(&mut b, "endpoint", e);
    }
    b.push_str("</tbody></table>");

    let eps: Vec<_> = endpoints::views(&s)
        .into_iter()
        .filter(|e| e.queues.iter().any(|n| n == &q.queue))
        .collect();
    if !eps.is_empty() {
        b.push_str("<h2>Push endpoint</h2>");
        b.push_str(&delivery::endpoint_table(&eps));
    }
    let bridges: Vec<_> = s
        .engine
        .bridges()
        .views()
        .into_iter()
        .filter(|v| v.queue == q.queue)
        .collect();
    if !bridges.is_empty() {
        b.push_str("<h2>Bridge</h2>");
        b.push_str(&delivery::bridge_table(&bridges));
    }
    html::page(StatusCode::OK, Some(&ui), "/ui", &q.queue, &b)
}
