//! Inline SVG charts of the per-minute series (`metrics/series.rs`): one line per kind
//! (published, retried, dead, done), a y axis from 0 to the largest value, time labels
//! under the x axis. Markup only (no script, no style attribute), so the console's
//! Content-Security-Policy holds.

use super::html::esc;
use crate::metrics::series::{Kind, Window};
use std::fmt::Write as _;

/// Line colours, in [`Kind::ALL`] order.
const COLOURS: [&str; 4] = ["#2563eb", "#d97706", "#dc2626", "#16a34a"];
const W: f64 = 640.0;
const H: f64 = 170.0;
/// Left margin (y labels) and bottom margin (x labels).
const ML: f64 = 44.0;
const MB: f64 = 20.0;

/// A chart of `w` titled `title`; `label_every` minutes get an x label (`HH:MM`, UTC).
pub fn lines(title: &str, w: &Window, label_every: u32) -> String {
    let n = w.counts[0].len().max(2);
    let max = w
        .counts
        .iter()
        .flat_map(|c| c.iter().copied())
        .max()
        .unwrap_or(0)
        .max(1);
    let totals: Vec<u64> = w.counts.iter().map(|c| c.iter().sum()).collect();
    let x = |i: usize| ML + (W - ML - 6.0) * i as f64 / (n - 1) as f64;
    let y = |v: u64| 6.0 + (H - MB - 6.0) * (1.0 - v as f64 / max as f64);
    let mut out = String::new();
    let _ = write!(
        out,
        "<figure class=\"chart\"><figcaption>{}</figcaption>\
         <svg viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"{}\">",
        esc(title),
        esc(title)
    );
    // Grid and y labels: 0, half, max.
    for (v, label) in [
        (0, "0".to_owned()),
        (max / 2, (max / 2).to_string()),
        (max, max.to_string()),
    ] {
        let yy = y(v);
        let _ = write!(
            out,
            "<line x1=\"{ML}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#e5e7eb\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"10\" fill=\"#6b7280\">{label}</text>",
            W - 6.0,
            ML - 4.0,
            yy + 3.0
        );
    }
    for (i, m) in (w.first_minute..w.first_minute + w.counts[0].len() as u32).enumerate() {
        if label_every > 0 && m % label_every == 0 {
            let hh = (m / 60) % 24;
            let mm = m % 60;
            let _ = write!(
                out,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\" fill=\"#6b7280\">{hh:02}:{mm:02}</text>",
                x(i),
                H - 5.0
            );
        }
    }
    // The x labels are UTC minutes: say so under the y axis.
    let _ = write!(
        out,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" font-size=\"10\" fill=\"#6b7280\">UTC</text>",
        ML - 4.0,
        H - 5.0
    );
    for (k, kind) in Kind::ALL.iter().enumerate() {
        let mut pts = String::new();
        for (i, v) in w.counts[k].iter().enumerate() {
            let _ = write!(pts, "{:.1},{:.1} ", x(i), y(*v));
        }
        let _ = write!(
            out,
            "<polyline class=\"series-{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>",
            kind.as_str(),
            COLOURS[k],
            pts.trim_end()
        );
    }
    out.push_str("</svg><div class=\"legend\">");
    for (k, kind) in Kind::ALL.iter().enumerate() {
        let _ = write!(
            out,
            "<span><svg width=\"10\" height=\"10\"><rect width=\"10\" height=\"10\" fill=\"{}\"/></svg> {} <b>{}</b></span>",
            COLOURS[k],
            kind.as_str(),
            totals[k]
        );
    }
    out.push_str("</div></figure>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_has_a_line_per_kind_and_totals() {
        let w = Window {
            first_minute: 60,
            counts: [vec![1, 2, 3], vec![0, 1, 0], vec![0, 0, 4], vec![1, 1, 1]],
        };
        let svg = lines("Last hour <per minute>", &w, 1);
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains("Last hour &lt;per minute&gt;"));
        assert!(svg.contains("dead <b>4</b>"));
        assert!(svg.contains(">01:00<"));
        assert!(svg.contains(">UTC</text>"), "the time axis says UTC");
    }
}
