//! Tables from results: medians of rounds with min-max, in the layout of the seeds' tables (Markdown via `tabled`).
//!
//! A workload's columns come from its [`Info`]; a workload the runner does not know (results of another version)
//! gets every numeric metric. One table per case (e.g. per worker count), or, for a workload with a
//! [`Sweep`](workloads::workload::Sweep), one table with a row per swept value. A transport the workload does not
//! apply to gets one row saying why ("n/a: ...").

use std::collections::BTreeMap;
use tabled::builder::Builder;
use tabled::settings::Style;
use workloads::result::RunResult;
use workloads::workload::{Column, Format, Info, Sweep};

/// Render every workload's tables, in the order workloads first appear.
pub fn render(results: &[RunResult]) -> String {
    let mut order: Vec<&str> = Vec::new();
    for r in results {
        if !order.contains(&r.workload.as_str()) {
            order.push(&r.workload);
        }
    }
    let mut out = String::new();
    for w in order {
        let rows: Vec<&RunResult> = results.iter().filter(|r| r.workload == w).collect();
        out.push_str(&render_workload(w, &rows));
        out.push('\n');
    }
    out
}

/// The label of a result's case: the values of the workload's case keys (empty when there is one case).
fn case_label(info: Option<&Info>, r: &RunResult) -> String {
    let keys = info.map(|i| i.case_keys).unwrap_or(&[]);
    keys.iter()
        .filter_map(|k| r.params.get(*k).map(|v| format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Results grouped by transport, in the order transports first appear, each group in round order.
fn by_transport<'a>(results: &[&'a RunResult]) -> Vec<(&'a str, Vec<&'a RunResult>)> {
    let mut groups: Vec<(&str, Vec<&RunResult>)> = Vec::new();
    for r in results {
        match groups.iter_mut().find(|(t, _)| *t == r.transport) {
            Some((_, runs)) => runs.push(r),
            None => groups.push((&r.transport, vec![r])),
        }
    }
    for (_, runs) in &mut groups {
        runs.sort_by_key(|r| r.round);
    }
    groups
}

fn render_workload(workload: &str, results: &[&RunResult]) -> String {
    let info = workloads::by_name(workload).map(|w| w.info());
    if let Some(sweep) = info.and_then(|i| i.sweep.as_ref()) {
        return render_sweep(workload, sweep, results);
    }
    let columns: Vec<Column> = match info {
        Some(i) => i.columns.to_vec(),
        None => generic_columns(results),
    };
    // One table per case, in the order cases first appear; the transports it does not apply to join each table.
    let mut cases: BTreeMap<usize, (String, Vec<&RunResult>)> = BTreeMap::new();
    let mut labels: Vec<String> = Vec::new();
    for r in results.iter().filter(|r| r.skipped.is_none()) {
        let label = case_label(info, r);
        let i = labels.iter().position(|l| *l == label).unwrap_or_else(|| {
            labels.push(label.clone());
            labels.len() - 1
        });
        cases.entry(i).or_insert((label, Vec::new())).1.push(r);
    }
    if cases.is_empty() {
        cases.insert(0, (String::new(), Vec::new()));
    }
    let skipped: Vec<&RunResult> = results
        .iter()
        .copied()
        .filter(|r| r.skipped.is_some())
        .collect();
    let mut out = String::new();
    for (_, (label, mut runs)) in cases {
        runs.extend(skipped.iter().copied());
        let title = if label.is_empty() {
            format!("### {workload}")
        } else {
            format!("### {workload} ({label})")
        };
        out.push_str(&format!("{title}\n\n{}\n\n", table(&columns, &runs)));
    }
    out.push_str(&latency_table(results));
    out
}

/// The standard table: a row per transport, the columns summarising its rounds.
fn table(columns: &[Column], results: &[&RunResult]) -> String {
    let mut b = Builder::default();
    let mut header = vec!["transport".to_string(), "rounds".to_string()];
    header.extend(columns.iter().map(|c| c.header.to_string()));
    b.push_record(header);
    for (transport, runs) in by_transport(results) {
        if let Some(reason) = runs.iter().find_map(|r| r.skipped.as_deref()) {
            let mut row = vec![transport.to_string(), "-".into(), format!("n/a: {reason}")];
            row.extend(std::iter::repeat_n(
                String::new(),
                columns.len().saturating_sub(1),
            ));
            b.push_record(row);
            continue;
        }
        let mut row = vec![transport.to_string(), runs.len().to_string()];
        for c in columns {
            let values: Vec<f64> = runs.iter().filter_map(|r| r.metric(c.metric)).collect();
            row.push(cell(&values, c.format));
        }
        b.push_record(row);
    }
    let mut table = b.build();
    table.with(Style::markdown());
    table.to_string()
}

/// The latency distributions of a workload: every histogram of every transport, rounds merged.
fn latency_table(results: &[&RunResult]) -> String {
    let mut merged: Vec<(String, String, hdrhistogram::Histogram<u64>)> = Vec::new();
    for r in results.iter().filter(|r| r.skipped.is_none()) {
        for (name, encoded) in &r.histograms {
            let Ok(h) = workloads::hist::decode(encoded) else {
                continue;
            };
            match merged
                .iter_mut()
                .find(|(t, n, _)| *t == r.transport && n == name)
            {
                Some((_, _, m)) => {
                    let _ = m.add(&h);
                }
                None => merged.push((r.transport.clone(), name.clone(), h)),
            }
        }
    }
    if merged.is_empty() {
        return String::new();
    }
    let mut b = Builder::default();
    b.push_record([
        "transport",
        "latency",
        "count",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms",
    ]);
    for (t, name, h) in &merged {
        let q = |q: f64| format!("{:.2}", workloads::hist::quantile_ms(h, q));
        b.push_record([
            t.clone(),
            name.clone(),
            thousands(h.len() as f64),
            q(0.5),
            q(0.9),
            q(0.99),
            q(0.999),
            format!("{:.2}", h.max() as f64 / 1e3),
        ]);
    }
    let mut table = b.build();
    table.with(Style::markdown());
    format!("\nLatency distributions (all rounds merged):\n\n{table}\n")
}

/// A sweep's table (seed 095's M4 layout): a row per value of the swept parameter, the shared columns, then
/// each transport's columns side by side (medians of rounds).
fn render_sweep(workload: &str, sweep: &Sweep, results: &[&RunResult]) -> String {
    let value = |r: &RunResult| r.params.get(sweep.key).and_then(|v| v.as_f64());
    let groups = by_transport(results);
    let mut values: Vec<f64> = results
        .iter()
        .filter(|r| r.skipped.is_none())
        .filter_map(|r| value(r))
        .collect();
    values.sort_by(f64::total_cmp);
    values.dedup();
    let applies = |runs: &[&RunResult]| runs.iter().all(|r| r.skipped.is_none());
    let mut b = Builder::default();
    let mut header = vec![sweep.header.to_string()];
    header.extend(sweep.shared.iter().map(|c| c.header.to_string()));
    for (t, runs) in &groups {
        if applies(runs) {
            header.extend(
                sweep
                    .per_transport
                    .iter()
                    .map(|c| format!("{t} {}", c.header)),
            );
        }
    }
    b.push_record(header);
    for v in values {
        let at: Vec<&RunResult> = results
            .iter()
            .copied()
            .filter(|r| r.skipped.is_none() && value(r) == Some(v))
            .collect();
        let mut row = vec![thousands(v)];
        for c in sweep.shared {
            let xs: Vec<f64> = at.iter().filter_map(|r| r.metric(c.metric)).collect();
            row.push(cell(&xs, c.format));
        }
        for (t, runs) in &groups {
            if !applies(runs) {
                continue;
            }
            for c in sweep.per_transport {
                let xs: Vec<f64> = at
                    .iter()
                    .filter(|r| r.transport == *t)
                    .filter_map(|r| r.metric(c.metric))
                    .collect();
                row.push(cell(&xs, c.format));
            }
        }
        b.push_record(row);
    }
    let mut table = b.build();
    table.with(Style::markdown());
    let mut out = format!("### {workload}\n\n{table}\n");
    for (t, runs) in &groups {
        if let Some(reason) = runs.iter().find_map(|r| r.skipped.as_deref()) {
            out.push_str(&format!("\n{t}: n/a: {reason}\n"));
        }
    }
    out.push_str(&latency_table(results));
    out
}

fn generic_columns(results: &[&RunResult]) -> Vec<Column> {
    // Unknown workload: every numeric metric, median (min-max). Names are leaked once per report, which is fine for
    // a command that renders and exits.
    let mut names: Vec<String> = Vec::new();
    for r in results {
        for (k, v) in &r.metrics {
            if v.is_number() && !names.contains(k) {
                names.push(k.clone());
            }
        }
    }
    names
        .into_iter()
        .map(|n| {
            let n: &'static str = Box::leak(n.into_boxed_str());
            Column::new(n, n, Format::Decimal)
        })
        .collect()
}

/// The median of values (the mean of the middle two for an even count).
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn cell(values: &[f64], format: Format) -> String {
    let Some(med) = median(values) else {
        return "-".into();
    };
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    match format {
        Format::Count if values.len() > 1 && min != max => {
            format!("{} ({}-{})", thousands(med), thousands(min), thousands(max))
        }
        Format::Count => thousands(med),
        Format::Decimal if values.len() > 1 && min != max => {
            format!("{med:.2} ({min:.2}-{max:.2})")
        }
        Format::Decimal => format!("{med:.2}"),
        Format::Rounds => values
            .iter()
            .map(|v| thousands(*v))
            .collect::<Vec<_>>()
            .join(" · "),
        Format::Sum => thousands(values.iter().sum()),
    }
}

/// An integer with thousands separators: 462162.4 → "462,162".
pub fn thousands(v: f64) -> String {
    let n = v.round() as i64;
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_separators() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(thousands(462_162.4), "462,162");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(-1234.0), "-1,234");
        assert_eq!(cell(&[3.0, 1.0, 2.0], Format::Count), "2 (1-3)");
        assert_eq!(cell(&[1.0, 2.0], Format::Rounds), "1 · 2");
    }
}
