//! HTML building: escaping, the page frame (nav bar, sign-out), status badges, and the
//! small pieces every page uses.
//!
//! Everything a page shows that did not come from this file's own literals goes through
//! [`esc`] (text and attribute values alike: it escapes `& < > " '`) or [`url`] (a query
//! parameter): payloads, headers, error messages, queue names and keys are written by
//! whoever publishes or fails a message, so they are attacker-controlled. Pages are plain
//! strings built with `push_str` / `format!`; no template engine, no script. Every answer
//! carries a Content-Security-Policy that allows no script at all and only this server's
//! stylesheet, so a mistake in escaping still cannot run code.

use super::session::Ui;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use redrive_core::Timestamp;
use std::fmt::Write as _;

/// The policy every console answer carries: no script, no plugin, no framing, styles and
/// images from this server only (charts are inline SVG markup, which needs neither),
/// forms post only here.
pub const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self' data:; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// `s` escaped for HTML text and quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `s` percent-encoded for a query parameter or a path segment (everything but
/// unreserved characters).
pub fn url(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A query string (`?a=1&b=2`) of the pairs whose value is not empty; `""` when none is.
pub fn query(pairs: &[(&str, Option<&str>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| {
            v.filter(|v| !v.is_empty())
                .map(|v| format!("{k}={}", url(v)))
        })
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// The pages of the nav bar: (path, label).
const NAV: [(&str, &str); 7] = [
    ("/ui", "Overview"),
    ("/ui/messages", "Messages"),
    ("/ui/groups", "Failure groups"),
    ("/ui/tasks", "Tasks"),
    ("/ui/audit", "Audit log"),
    ("/ui/endpoints", "Endpoints"),
    ("/ui/bridges", "Bridges"),
];

/// A whole page: head, nav bar (with `active` marked), who is signed in, then `body`.
/// `refresh` adds a `<meta http-equiv=refresh>` of that many seconds.
pub fn frame(
    ui: Option<&Ui>,
    active: &str,
    title: &str,
    body: &str,
    refresh: Option<u32>,
) -> String {
    let mut out = String::with_capacity(body.len() + 2048);
    out.push_str("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">");
    if let Some(r) = refresh {
        let _ = write!(out, "<meta http-equiv=\"refresh\" content=\"{r}\">");
    }
    let _ = write!(
        out,
        "<title>{} · redrive</title><link rel=\"stylesheet\" href=\"/ui/static/console.css\"></head><body>",
        esc(title)
    );
    out.push_str("<header class=\"top\"><a class=\"brand\" href=\"/ui\">redrive</a><nav>");
    if ui.is_some() {
        for (path, label) in NAV {
            let class = if path == active {
                " class=\"active\""
            } else {
                ""
            };
            let _ = write!(out, "<a href=\"{path}\"{class}>{label}</a>");
        }
    }
    out.push_str("</nav><div class=\"who\">");
    if let Some(ui) = ui {
        let _ = write!(
            out,
            "<span class=\"caller\" title=\"scopes: {}\">{}</span>",
            esc(&ui.caller.scopes.names().join(", ")),
            esc(&ui.caller.name)
        );
        if !ui.can_act() {
            out.push_str("<span class=\"badge st-readonly\">read only</span>");
        }
        if ui.signed_in {
            let _ = write!(
                out,
                "<form method=\"post\" action=\"/ui/logout\" class=\"inline\">{}<button class=\"link\">Sign out</button></form>",
                csrf_field(ui)
            );
        }
    }
    out.push_str("</div></header><main>");
    out.push_str(body);
    out.push_str("</main></body></html>\n");
    out
}

/// A page answered with `status`.
pub fn page(
    status: StatusCode,
    ui: Option<&Ui>,
    active: &str,
    title: &str,
    body: &str,
) -> Response {
    respond(status, frame(ui, active, title, body, None))
}

/// An HTML answer with the console's security headers.
pub fn respond(status: StatusCode, html: String) -> Response {
    let mut r = (status, html).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    r
}

/// An error page: `status`, a title and what to do.
pub fn error_page(status: StatusCode, ui: Option<&Ui>, title: &str, message: &str) -> Response {
    let body = format!(
        "<h1>{}</h1><div class=\"notice error\">{}</div><p><a href=\"/ui\">Back to the overview</a></p>",
        esc(title),
        esc(message)
    );
    page(status, ui, "", title, &body)
}

/// The hidden CSRF field every state-changing form carries.
pub fn csrf_field(ui: &Ui) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        esc(&ui.csrf)
    )
}

/// A state as a coloured badge.
pub fn badge(state: &str) -> String {
    let s = esc(state);
    format!("<span class=\"badge st-{s}\">{s}</span>")
}

/// A time, readable (`2026-01-31 12:00:00 UTC`), with the exact RFC 3339 in a tooltip.
pub fn time(t: Timestamp) -> String {
    let full = t.to_rfc3339();
    let short = full
        .get(..19)
        .map(|s| s.replace('T', " "))
        .unwrap_or_else(|| full.clone());
    // Labelled: an operator in another time zone must not read it as local (issue 15).
    format!("<time datetime=\"{full}\" title=\"{full}\">{short} UTC</time>")
}

/// An optional time, or a dash.
pub fn time_opt(t: Option<Timestamp>) -> String {
    t.map_or_else(|| "<span class=\"muted\">—</span>".to_owned(), time)
}

/// A duration in seconds, short (`42s`, `3m 5s`, `2h 10m`, `3d 4h`).
pub fn age(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3_599 => format!("{}m {}s", s / 60, s % 60),
        3_600..=86_399 => format!("{}h {}m", s / 3_600, (s % 3_600) / 60),
        _ => format!("{}d {}h", s / 86_400, (s % 86_400) / 3_600),
    }
}

/// Text cut to `max` characters (with `…`), escaped.
pub fn short(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        esc(s)
    } else {
        let cut: String = s.chars().take(max).collect();
        format!("{}…", esc(&cut))
    }
}

/// A notice box (`kind`: `ok` or `error`).
pub fn notice(kind: &str, text: &str) -> String {
    format!("<div class=\"notice {kind}\">{}</div>", esc(text))
}

/// A horizontal progress bar as inline SVG: done (green) and failed (red) out of total.
pub fn progress(total: u64, done: u64, failed: u64) -> String {
    let total_f = total.max(1) as f64;
    let d = (done as f64 / total_f * 100.0).clamp(0.0, 100.0);
    let f = (failed as f64 / total_f * 100.0).clamp(0.0, 100.0 - d);
    let pct = if total == 0 {
        100.0
    } else {
        ((done + failed) as f64 / total_f * 100.0).min(100.0)
    };
    format!(
        "<svg class=\"progress\" viewBox=\"0 0 100 6\" preserveAspectRatio=\"none\" role=\"img\" \
         aria-label=\"{pct:.0}%\"><rect width=\"100\" height=\"6\" fill=\"#e5e7eb\"/>\
         <rect width=\"{d:.2}\" height=\"6\" fill=\"#16a34a\"/>\
         <rect x=\"{d:.2}\" width=\"{f:.2}\" height=\"6\" fill=\"#dc2626\"/></svg>"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(url("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        assert_eq!(
            query(&[("queue", Some("o&r")), ("state", None), ("q", Some(""))]),
            "?queue=o%26r"
        );
        assert_eq!(query(&[("a", None)]), "");
        assert_eq!(short("abcdef", 3), "abc…");
        assert_eq!(age(3725.0), "1h 2m");
    }

    #[test]
    fn every_time_is_labelled_utc() {
        let t = Timestamp::parse("2026-01-31T20:05:09.250+08:00").unwrap();
        assert_eq!(
            time(t),
            "<time datetime=\"2026-01-31T12:05:09.250Z\" title=\"2026-01-31T12:05:09.250Z\">2026-01-31 12:05:09 UTC</time>"
        );
        assert!(time_opt(Some(t)).ends_with(" UTC</time>"));
    }
}
