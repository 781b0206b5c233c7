//! `runner report --html OUT`: one self-contained page from any set of results files, to send to a colleague.
//!
//! No network, no external script or style: the charts are inline SVG ([`crate::chart`]), the style and a
//! few lines of script are in the page. Per workload, in the order workloads first appear:
//!
//! - the tables of `runner report` (the same Markdown, rendered: medians of rounds with min-max, the seeds'
//!   reference rows for seed-profile runs, the latency distributions), rows of runs not to be trusted tinted;
//! - the charts;
//! - the invariant checks of `runner check` ([`crate::check::invariants`]), failures first and open, and each run
//!   whose numbers cannot be trusted with the reason;
//! - the provenance of every run: what every run shares once (commit, machine, profile, parameters, ...), then a
//!   row per run with what differs. Every field the results carry is shown, whatever version wrote them.
//!
//! The script at the end checks that every chart has an SVG with something drawn in it and records the outcome on
//! `<body data-charts="ok N">` (or `failed: ...`, also logged as a console error); the browser test reads it.

use crate::chart::{self, Chart, Palette};
use crate::check;
use anyhow::Result;
use std::fmt::Write;
use workloads::result::RunResult;

/// Escape text for HTML.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            _ => out.push(c),
        }
    }
    out
}

/// The whole page. `sources` names the files the results came from.
pub fn render(results: &[RunResult], sources: &[String]) -> Result<String> {
    let palette = Palette::new(results);
    let mut order: Vec<&str> = Vec::new();
    for r in results {
        if !order.contains(&r.workload.as_str()) {
            order.push(&r.workload);
        }
    }
    let mut page = String::new();
    page.push_str(HEAD);
    let _ = write!(
        page,
        "<h1>Transport benchmark results</h1>\n<p class=\"meta\">{} runs from {}; rendered {} by runner {}.</p>\n",
        results.len(),
        escape(&sources.join(", ")),
        crate::provenance::rfc3339_utc(std::time::SystemTime::now()),
        env!("CARGO_PKG_VERSION"),
    );
    page.push_str("<nav><ul>\n");
    for w in &order {
        let _ = writeln!(page, "<li><a href=\"#{0}\">{0}</a></li>", escape(w));
    }
    page.push_str("</ul></nav>\n");
    for w in &order {
        let runs: Vec<&RunResult> = results.iter().filter(|r| r.workload == *w).collect();
        let charts = chart::for_workload(w, &runs, &palette)?;
        page.push_str(&section(w, &runs, &charts));
    }
    page.push_str(TAIL);
    Ok(page)
}

/// One workload's section.
fn section(workload: &str, runs: &[&RunResult], charts: &[Chart]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "<section id=\"{0}\">\n<h2>{0}</h2>", escape(workload));
    if let Some(info) = workloads::by_name(workload).map(|w| w.info()) {
        let _ = writeln!(out, "<p class=\"about\">{}</p>", escape(info.about));
    }
    let distrusted: Vec<(&RunResult, Vec<String>)> = runs
        .iter()
        .filter(|r| r.skipped.is_none())
        .map(|r| (*r, check::distrust(r)))
        .filter(|(_, why)| !why.is_empty())
        .collect();
    let untrusted: Vec<String> = distrusted
        .iter()
        .map(|(r, _)| crate::hostile::label(r))
        .collect();
    out.push_str(&markdown(
        &super::render_workload(workload, runs),
        &untrusted,
    ));
    if !charts.is_empty() {
        out.push_str("<h3>Charts</h3>\n");
        for c in charts {
            let _ = writeln!(
                out,
                "<figure class=\"chart\" id=\"chart-{}\">\n{}\n<figcaption>{}</figcaption>\n</figure>",
                escape(&c.name),
                c.svg.trim(),
                escape(&c.caption)
            );
        }
    }
    out.push_str(&checks(runs, &distrusted));
    out.push_str(&provenance(runs));
    out.push_str("</section>\n");
    out
}

/// The invariant checks, failures first, and the runs not to be trusted.
fn checks(runs: &[&RunResult], distrusted: &[(&RunResult, Vec<String>)]) -> String {
    let owned: Vec<RunResult> = runs.iter().map(|r| (*r).clone()).collect();
    let all = check::invariants_with(&owned, &[]);
    let mut out = String::from("<h3>Checks</h3>\n");
    if all.is_empty() {
        out.push_str("<p>No invariant applies to these results.</p>\n");
    }
    let failed: Vec<_> = all.iter().filter(|c| !c.ok).collect();
    let table = |checks: &[&check::Check]| {
        let mut t = String::from(
            "<table class=\"checks\"><tr><th>check</th><th>found</th><th>expected</th><th></th></tr>\n",
        );
        for c in checks {
            let _ = writeln!(
                t,
                "<tr class=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                if c.ok { "ok" } else { "fail" },
                escape(&c.what),
                escape(&c.found),
                escape(&c.expected),
                if c.ok { "ok" } else { "FAIL" }
            );
        }
        t.push_str("</table>\n");
        t
    };
    if !failed.is_empty() {
        let _ = writeln!(
            out,
            "<p class=\"fail\">{} of {} checks FAIL.</p>",
            failed.len(),
            all.len()
        );
        out.push_str(&table(&failed));
    }
    if !all.is_empty() {
        let passed: Vec<_> = all.iter().filter(|c| c.ok).collect();
        let _ = writeln!(
            out,
            "<details><summary>{} of {} checks hold</summary>\n{}</details>",
            passed.len(),
            all.len(),
            table(&passed)
        );
    }
    if !distrusted.is_empty() {
        out.push_str("<p class=\"fail\">Runs whose numbers are not to be trusted (tinted in the tables, dashed or pale in the charts):</p>\n<ul class=\"untrusted\">\n");
        // One line per transport, case and reason, with its rounds.
        let mut lines: Vec<(String, String, Vec<u32>)> = Vec::new();
        for (r, why) in distrusted {
            let case = check::case(r);
            let label = crate::hostile::label(r);
            let who = if case.is_empty() {
                label
            } else {
                format!("{label} ({case})")
            };
            let why = why.join("; ");
            match lines.iter_mut().find(|(w, y, _)| *w == who && *y == why) {
                Some((_, _, rounds)) => rounds.push(r.round),
                None => lines.push((who, why, vec![r.round])),
            }
        }
        for (who, why, rounds) in lines {
            let rounds: Vec<String> = rounds.iter().map(u32::to_string).collect();
            let _ = writeln!(
                out,
                "<li>{}, round{} {}: {}</li>",
                escape(&who),
                if rounds.len() > 1 { "s" } else { "" },
                rounds.join(", "),
                escape(&why)
            );
        }
        out.push_str("</ul>\n");
    }
    out
}

/// A run's fields other than its identity, metrics and histograms, flattened (`pinning.mode`, `param orders`).
fn fields(r: &RunResult) -> Vec<(String, String)> {
    fn flatten(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
        match v {
            serde_json::Value::Object(o) => {
                for (k, v) in o {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    flatten(&key, v, out);
                }
            }
            serde_json::Value::Null => {}
            serde_json::Value::String(s) => out.push((prefix.to_string(), s.clone())),
            other => out.push((prefix.to_string(), other.to_string())),
        }
    }
    let mut out = Vec::new();
    let Ok(serde_json::Value::Object(mut all)) = serde_json::to_value(r) else {
        return out;
    };
    for k in [
        "schema",
        "workload",
        "transport",
        "round",
        "metrics",
        "histograms",
        "skipped",
    ] {
        all.remove(k);
    }
    if let Some(p) = all.remove("provenance") {
        flatten("", &p, &mut out);
    }
    if let Some(serde_json::Value::Object(params)) = all.remove("params") {
        for (k, v) in params {
            flatten(&format!("param {k}"), &v, &mut out);
        }
    }
    for (k, v) in all {
        flatten(&k, &v, &mut out);
    }
    out
}

/// Where every run's numbers come from: shared fields once, then a row per run with the fields that differ.
fn provenance(runs: &[&RunResult]) -> String {
    let ran: Vec<(&RunResult, Vec<(String, String)>)> = runs
        .iter()
        .filter(|r| r.skipped.is_none())
        .map(|r| (*r, fields(r)))
        .collect();
    if ran.is_empty() {
        return String::new();
    }
    let mut keys: Vec<String> = Vec::new();
    for (_, f) in &ran {
        for (k, _) in f {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    let value = |f: &[(String, String)], k: &str| {
        f.iter()
            .find(|(key, _)| key == k)
            .map_or(String::new(), |(_, v)| v.clone())
    };
    let (shared, varying): (Vec<&String>, Vec<&String>) = keys.iter().partition(|k| {
        let first = value(&ran[0].1, k);
        ran.iter().all(|(_, f)| value(f, k) == first)
    });
    let mut out = String::from("<h3>Provenance</h3>\n<dl class=\"provenance\">\n");
    for k in &shared {
        let _ = writeln!(
            out,
            "<dt>{}</dt><dd>{}</dd>",
            escape(k),
            escape(&value(&ran[0].1, k))
        );
    }
    out.push_str("</dl>\n");
    if varying.is_empty() {
        return out;
    }
    let names: Vec<&str> = varying.iter().map(|k| k.as_str()).collect();
    let _ = writeln!(
        out,
        "<details{}><summary>{} runs; what differs between them: {}</summary>",
        if ran.len() <= 12 { " open" } else { "" },
        ran.len(),
        escape(&names.join(", "))
    );
    out.push_str("<table class=\"provenance\"><tr><th>transport</th><th>round</th>");
    for k in &varying {
        let _ = write!(out, "<th>{}</th>", escape(k));
    }
    out.push_str("</tr>\n");
    for (r, f) in &ran {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td>",
            escape(&crate::hostile::label(r)),
            r.round
        );
        for k in &varying {
            let _ = write!(out, "<td>{}</td>", escape(&value(f, k)));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n</details>\n");
    out
}

/// Whether a cell reads as a number (right-aligned): digits with separators, ranges and round lists.
fn numeric(cell: &str) -> bool {
    !cell.is_empty()
        && cell.chars().any(|c| c.is_ascii_digit())
        && cell
            .chars()
            .all(|c| c.is_ascii_digit() || " ,.-()·".contains(c))
}

/// Render the report's Markdown (headings, pipe tables, paragraphs: all `runner report` writes) as HTML. Rows of a
/// transport in `untrusted` are tinted; the seeds' rows are set apart.
fn markdown(text: &str, untrusted: &[String]) -> String {
    let mut out = String::new();
    let mut table: Vec<Vec<String>> = Vec::new();
    let mut paragraph: Vec<&str> = Vec::new();
    let flush_table = |table: &mut Vec<Vec<String>>, out: &mut String| {
        if table.is_empty() {
            return;
        }
        out.push_str("<table>\n");
        for (i, row) in table.iter().enumerate() {
            let first = row.first().map_or("", String::as_str);
            let class = if i == 0 {
                ""
            } else if first.starts_with("seed ") {
                " class=\"seed\""
            } else if untrusted.iter().any(|u| u == first) {
                " class=\"untrusted\""
            } else {
                ""
            };
            let _ = write!(out, "<tr{class}>");
            for cell in row {
                let _ = match (i, numeric(cell)) {
                    (0, _) => write!(out, "<th>{}</th>", escape(cell)),
                    (_, true) => write!(out, "<td class=\"num\">{}</td>", escape(cell)),
                    (_, false) => write!(out, "<td>{}</td>", escape(cell)),
                };
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</table>\n");
        table.clear();
    };
    let flush_paragraph = |p: &mut Vec<&str>, out: &mut String| {
        if !p.is_empty() {
            let _ = writeln!(out, "<p>{}</p>", escape(&p.join(" ")));
            p.clear();
        }
    };
    for line in text.lines() {
        let line = line.trim_end();
        if let Some(row) = line.strip_prefix('|') {
            flush_paragraph(&mut paragraph, &mut out);
            let cells: Vec<String> = row
                .strip_suffix('|')
                .unwrap_or(row)
                .split('|')
                .map(|c| c.trim().to_string())
                .collect();
            let separator = cells
                .iter()
                .all(|c| !c.is_empty() && c.chars().all(|ch| ch == '-' || ch == ':'));
            if !separator {
                table.push(cells);
            }
            continue;
        }
        flush_table(&mut table, &mut out);
        if let Some(h) = line.strip_prefix("### ") {
            flush_paragraph(&mut paragraph, &mut out);
            let _ = writeln!(out, "<h3>{}</h3>", escape(h));
        } else if line.is_empty() {
            flush_paragraph(&mut paragraph, &mut out);
        } else {
            paragraph.push(line);
        }
    }
    flush_table(&mut table, &mut out);
    flush_paragraph(&mut paragraph, &mut out);
    out
}

const HEAD: &str = r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Transport benchmark results</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 2px solid #4e79a7; margin-top: 2em; } h3 { margin-top: 1.4em; }
.meta, .about { color: #555; }
nav ul { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 1em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.85em; display: block; overflow-x: auto; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; white-space: nowrap; }
th { background: #eef2f7; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.seed td { color: #666; font-style: italic; background: #fafafa; }
tr.untrusted td, tr.fail td { background: #fde4e4; }
p.fail { color: #a00; font-weight: bold; }
ul.untrusted li { color: #a00; }
figure.chart { margin: 1em 0; }
figure.chart svg { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.85em; }
dl.provenance { display: grid; grid-template-columns: max-content auto; gap: 0.1em 1em; font-size: 0.85em; }
dl.provenance dt { font-weight: bold; } dl.provenance dd { margin: 0; }
</style>
</head>
<body>
"#;

const TAIL: &str = r#"<script>
// Every chart must hold an SVG with something drawn in it; the outcome is recorded on the body element for tests.
(function () {
  var figures = document.querySelectorAll("figure.chart");
  var bad = [];
  for (var i = 0; i < figures.length; i++) {
    var f = figures[i];
    var svg = f.querySelector("svg");
    if (!svg) { bad.push(f.id + ": no svg"); continue; }
    var box = svg.getBBox();
    var marks = svg.querySelectorAll("polyline, path, rect, circle, line, text").length;
    if (!(box.width > 0 && box.height > 0) || marks < 5) { bad.push(f.id + ": nothing drawn"); }
  }
  document.body.setAttribute("data-charts", bad.length ? "failed: " + bad.join("; ") : "ok " + figures.length);
  if (bad.length) { console.error("charts not rendered: " + bad.join("; ")); }
})();
</script>
</body>
</html>
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_tables_become_html() {
        let md = "### drain\n\n| transport | rounds | orders/s |\n|---|---|---|\n| pure | 3 | 1,000 (900-1,100) |\n| quinn | 3 | 5 |\n| seed 003: plain | 3 | 462,162 |\n\nSeed rows: a <note>.\n";
        let html = markdown(md, &["quinn".to_string()]);
        assert!(html.contains("<h3>drain</h3>"), "{html}");
        assert!(html.contains("<th>orders/s</th>"), "{html}");
        assert!(
            html.contains("<td class=\"num\">1,000 (900-1,100)</td>"),
            "{html}"
        );
        assert!(
            html.contains("<tr class=\"untrusted\"><td>quinn</td>"),
            "{html}"
        );
        assert!(
            html.contains("<tr class=\"seed\"><td>seed 003: plain</td>"),
            "{html}"
        );
        assert!(html.contains("<p>Seed rows: a &lt;note&gt;.</p>"), "{html}");
        assert!(!html.contains("---"), "separator rows are dropped: {html}");
    }

    #[test]
    fn provenance_shows_what_runs_share_once() {
        let run = |round: u32, commit: &str| {
            serde_json::from_value::<RunResult>(serde_json::json!({
                "schema": 1, "workload": "drain", "transport": "pure", "round": round,
                "params": {"orders": 10}, "metrics": {}, "histograms": {},
                "provenance": {"commit": commit, "cpu": "EPYC", "cores": 2}
            }))
            .unwrap()
        };
        let (a, b) = (run(0, "aaa"), run(1, "bbb"));
        let html = provenance(&[&a, &b]);
        assert!(html.contains("<dt>cpu</dt><dd>EPYC</dd>"), "{html}");
        assert!(html.contains("<dt>param orders</dt><dd>10</dd>"), "{html}");
        assert!(html.contains("<th>commit</th>"), "{html}");
        assert!(html.contains("<td>bbb</td>"), "{html}");
    }
}
