//! SVG charts where a picture reads better than a table: the per-100 ms timeline of stored orders around a restart.
//! Written by hand (a polyline per transport), so the files are small, diff well and need no plotting library.

use std::fmt::Write;
use workloads::result::RunResult;

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 320.0;
const MARGIN: f64 = 50.0;
const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
];

/// The restart timeline of the first round of each transport: orders stored per 100 ms bin, with the kill marked.
/// `None` when there is no restart result.
pub fn restart_timeline(results: &[RunResult]) -> Option<String> {
    let mut series: Vec<(&str, Vec<f64>, usize)> = Vec::new();
    for r in results
        .iter()
        .filter(|r| r.workload == "restart" && r.skipped.is_none())
    {
        if series.iter().any(|(t, ..)| *t == r.transport) {
            continue;
        }
        let timeline: Vec<f64> = r
            .metrics
            .get("timeline")?
            .as_array()?
            .iter()
            .filter_map(|v| v.as_f64())
            .collect();
        let kill = r.metric("kill_bin").unwrap_or(0.0) as usize;
        series.push((&r.transport, timeline, kill));
    }
    if series.is_empty() {
        return None;
    }
    let bins = series
        .iter()
        .map(|(_, t, _)| t.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let top = series
        .iter()
        .flat_map(|(_, t, _)| t.iter().copied())
        .fold(1.0, f64::max)
        * 1.1;
    let x = |bin: f64| MARGIN + bin / bins as f64 * (WIDTH - 2.0 * MARGIN);
    let y = |v: f64| HEIGHT - MARGIN - v / top * (HEIGHT - 2.0 * MARGIN);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{MARGIN}" y="20">orders stored per 100 ms (restart workload, first round); dashed: the kill</text>"#
    );
    // Axes with a few ticks.
    let (x0, y0, x1, y1) = (MARGIN, HEIGHT - MARGIN, WIDTH - MARGIN, MARGIN);
    let _ = writeln!(
        svg,
        r#"<path d="M{x0},{y1} L{x0},{y0} L{x1},{y0}" stroke="black" fill="none"/>"#
    );
    for i in 0..=4 {
        let v = top / 1.1 * i as f64 / 4.0;
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">{:.0}</text>"#,
            x0 - 4.0,
            y(v) + 4.0,
            v
        );
    }
    let seconds = bins / 10;
    let step = (seconds / 10).max(1);
    for s in (0..=seconds).step_by(step) {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{s} s</text>"#,
            x(s as f64 * 10.0),
            y0 + 16.0
        );
    }
    for (i, (name, timeline, kill)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<String> = timeline
            .iter()
            .enumerate()
            .map(|(b, v)| format!("{:.1},{:.1}", x(b as f64), y(*v)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" stroke="{colour}" fill="none" stroke-width="1.2"/>"#,
            points.join(" ")
        );
        let kx = x(*kill as f64);
        let _ = writeln!(
            svg,
            r#"<line x1="{kx}" y1="{y0}" x2="{kx}" y2="{y1}" stroke="{colour}" stroke-dasharray="4,3"/>"#
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" fill="{colour}">{name}</text>"#,
            x1 - 120.0,
            y1 + 16.0 * (i as f64 + 1.0)
        );
    }
    svg.push_str("</svg>\n");
    Some(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_line_per_transport() {
        let line = |t: &str| {
            serde_json::from_value::<RunResult>(serde_json::json!({
                "schema": 1, "workload": "restart", "transport": t, "round": 0, "params": {},
                "metrics": {"timeline": [1, 2, 3, 0, 2], "kill_bin": 3}, "histograms": {}, "provenance": {}
            }))
            .unwrap()
        };
        let svg = restart_timeline(&[line("pure"), line("quinn")]).unwrap();
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains(">quinn</text>"));
        assert!(restart_timeline(&[]).is_none());
    }
}
