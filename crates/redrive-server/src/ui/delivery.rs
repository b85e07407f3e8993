//! `GET /ui/endpoints` and `GET /ui/bridges`: where messages go — push endpoints with
//! their breaker, pace and budget, bridges with their connection and counters. The data
//! is `GET /v1/endpoints`' and `GET /v1/bridges`'.

use super::html::{self, esc, url};
use super::Ui;
use crate::api::endpoints::{self, EndpointView};
use crate::api::AppState;
use crate::engine::bridge::BridgeView;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use std::fmt::Write as _;

/// Every push endpoint.
pub async fn endpoints(State(s): State<AppState>, Extension(ui): Extension<Ui>) -> Response {
    let eps = endpoints::views(&s);
    let mut b = String::from("<h1>Push endpoints</h1>");
    if eps.is_empty() {
        b.push_str("<p class=\"muted\">No push queue is configured (<code>delivery = \"push\"</code> in a <code>[queues.NAME]</code> section).</p>");
    } else {
        b.push_str(&endpoint_table(&eps));
    }
    html::page(StatusCode::OK, Some(&ui), "/ui/endpoints", "Endpoints", &b)
}

/// Every bridge.
pub async fn bridges(State(s): State<AppState>, Extension(ui): Extension<Ui>) -> Response {
    let views = s.engine.bridges().views();
    let mut b = String::from("<h1>Bridges</h1>");
    if views.is_empty() {
        b.push_str("<p class=\"muted\">No bridge is configured (<code>[bridges.rabbitmq.NAME]</code> or <code>[bridges.redis_streams.NAME]</code>).</p>");
    } else {
        b.push_str(&bridge_table(&views));
    }
    html::page(StatusCode::OK, Some(&ui), "/ui/bridges", "Bridges", &b)
}

fn queue_links(queues: &[String]) -> String {
    queues
        .iter()
        .map(|q| format!("<a href=\"/ui/queues/{}\">{}</a>", url(q), esc(q)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A table of endpoints.
pub fn endpoint_table(eps: &[EndpointView]) -> String {
    let mut b = String::from(
        "<table><thead><tr><th>Endpoint</th><th>Queues</th><th>Breaker</th><th class=\"num\">In flight</th>\
         <th class=\"num\">Calls/s</th><th class=\"num\">Window failures</th><th class=\"num\">Parked</th>\
         <th class=\"num\">Opened</th><th class=\"num\">Retry budget</th><th>Limits (cluster / this node)</th></tr></thead><tbody>",
    );
    for e in eps {
        let _ = write!(
            b,
            "<tr><td class=\"mono\">{}</td><td>{}</td><td>{} <span class=\"muted\">for {}</span></td>\
             <td class=\"num\">{} / {}</td><td class=\"num\">{:.1}{}</td><td class=\"num\">{} / {}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            esc(&e.endpoint),
            queue_links(&e.queues),
            html::badge(e.state),
            html::age(e.state_for_seconds),
            e.in_flight,
            e.share.as_ref().map_or(0, |s| s.concurrency),
            e.calls_per_second,
            e.pace_per_second
                .map(|p| format!(" <span class=\"muted\">(pace {p:.1})</span>"))
                .unwrap_or_default(),
            e.window_failures,
            e.window_calls,
            e.parked,
            e.opened_total,
            if e.budget.ratio > 0.0 {
                format!("{} available", e.budget.available)
            } else {
                "none".to_owned()
            },
            limits(e)
        );
    }
    b.push_str("</tbody></table>");
    b
}

/// The configured limits and this node's share: "16 in flight, 200/s; this node (2 of 3):
/// 5 in flight, 66.7/s".
fn limits(e: &EndpointView) -> String {
    let rate = |r: Option<f64>| r.map(|r| format!(", {r:.1}/s")).unwrap_or_default();
    let mine = match &e.share {
        Some(s) => format!(
            "this node ({} of {}): {} in flight{}",
            s.rank + 1,
            s.nodes,
            s.concurrency,
            rate(s.rate_limit_per_second)
        ),
        None => "this node: not known yet (no heartbeat)".to_owned(),
    };
    format!(
        "{} in flight{} <span class=\"muted\">{}</span>",
        e.concurrency,
        rate(e.rate_limit_per_second),
        esc(&mine)
    )
}

/// A table of bridges.
pub fn bridge_table(views: &[BridgeView]) -> String {
    let mut b = String::from(
        "<table><thead><tr><th>Bridge</th><th>Kind</th><th>Queue</th><th>Source</th><th>State</th>\
         <th class=\"num\">Intake</th><th class=\"num\">Republished</th><th class=\"num\">Returned</th>\
         <th class=\"num\">Dead</th><th class=\"num\">Connects</th></tr></thead><tbody>",
    );
    for v in views {
        let _ = write!(
            b,
            "<tr><td class=\"mono\">{}</td><td>{}</td><td>{}</td><td class=\"mono\">{}</td><td>{}{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td></tr>",
            esc(&v.name),
            esc(v.kind),
            queue_links(std::slice::from_ref(&v.queue)),
            esc(&v.source),
            html::badge(&v.state),
            v.last_error
                .as_deref()
                .map(|e| format!("<div class=\"err\">{}</div>", esc(e)))
                .unwrap_or_default(),
            v.intake,
            v.republished,
            v.returned,
            v.dead,
            v.connects
        );
    }
    b.push_str("</tbody></table>");
    b
}
