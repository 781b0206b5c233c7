//! Tables from results: medians of rounds with min-max, in the layout of the seeds' tables (Markdown via `tabled`).
//!
//! A workload's columns come from its [`Info`]; a workload the runner does not know (results of another version)
//! gets every numeric metric. One table per case (e.g. per worker count), preceded, for a workload with a
//! [`Sweep`](workloads::workload::Sweep), by one table with a row per swept value. A transport the workload does not
//! apply to gets one row saying why ("n/a: ...").
//!
//! A row whose numbers cannot be trusted says so in its last column, round by round ([`workloads::trust`]: an
//! error, a timeout, unanswered orders, a generator-bound run, a sync on a memory filesystem). Under each workload's
//! tables a line says where the numbers come from: invocations, commits (and whether the build was dirty), build
//! profile, pinning, and the store (filesystem, sync policy, fsyncs).

use std::collections::BTreeMap;
use tabled::builder::Builder;
use tabled::settings::Style;
use workloads::result::RunResult;
use workloads::workload::{Column, Format, Info, Sweep};

pub mod fill;
pub mod html;
pub mod seeds;

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
    out.push_str(&crate::hostile::tables(results));
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

/// Results grouped by transport (hostile runs apart: [`crate::hostile::label`]), in the order they first appear,
/// each group in round order.
fn by_transport<'a>(results: &[&'a RunResult]) -> Vec<(String, Vec<&'a RunResult>)> {
    let mut groups: Vec<(String, Vec<&RunResult>)> = Vec::new();
    for r in results {
        let label = crate::hostile::label(r);
        match groups.iter_mut().find(|(t, _)| *t == label) {
            Some((_, runs)) => runs.push(r),
            None => groups.push((label, vec![r])),
        }
    }
    for (_, runs) in &mut groups {
        runs.sort_by_key(|r| r.round);
    }
    groups
}

/// One workload's tables (Markdown).
pub fn render_workload(workload: &str, results: &[&RunResult]) -> String {
    let info = workloads::by_name(workload).map(|w| w.info());
    let mut out = String::new();
    // A sweep's table first (a row per swept value, transports side by side), then each case's full table.
    if let Some(sweep) = info.and_then(|i| i.sweep.as_ref()) {
        out.push_str(&render_sweep(workload, sweep, results));
        out.push('\n');
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
    for (_, (label, mut runs)) in cases {
        runs.extend(skipped.iter().copied());
        let title = if label.is_empty() {
            format!("### {workload}")
        } else {
            format!("### {workload} ({label})")
        };
        out.push_str(&format!("{title}\n\n{}\n\n", table(&columns, &runs)));
    }
    out.push_str(&origin(results));
    out.push_str(&latency_table(results));
    out
}

/// Where the numbers of a workload's results come from, in one paragraph.
fn origin(results: &[&RunResult]) -> String {
    let ran: Vec<&RunResult> = results
        .iter()
        .copied()
        .filter(|r| r.skipped.is_none())
        .collect();
    if ran.is_empty() {
        return String::new();
    }
    let distinct = |f: &dyn Fn(&RunResult) -> String| {
        let mut v: Vec<String> = ran.iter().map(|r| f(r)).collect();
        v.sort();
        v.dedup();
        v.join(", ")
    };
    let build = distinct(&|r| {
        let p = &r.provenance;
        let commit = if p.commit.is_empty() {
            "unknown"
        } else {
            &p.commit[..p.commit.len().min(12)]
        };
        let dirty = if p.dirty { " (dirty)" } else { "" };
        let allocator = if p.allocator.is_empty() {
            "system"
        } else {
            &p.allocator
        };
        format!("{commit}{dirty} {}, {allocator} allocator", p.build_profile)
    });
    let invocations = distinct(&|r| r.provenance.invocation.clone());
    let pinning = distinct(&|r| {
        let p = &r.provenance.pinning;
        match p.mode.as_str() {
            "separate" => format!(
                "server on CPU {:?}, generator on {:?}",
                p.server_cpus, p.generator_cpus
            ),
            "" => "not recorded".into(),
            other => format!("not pinned ({other})"),
        }
    });
    let store = distinct(&|r| match &r.durability {
        Some(d) => format!(
            "{} with sync {}, {} server thread(s)",
            d.store_fs, d.sync, d.server_threads
        ),
        None => "not recorded".into(),
    });
    let fsync = merged_sync_times(&ran, "store_fsync", "fdatasync");
    let state_fsync = merged_sync_times(&ran, "state_fsync", "the server's own state synced");
    let priority = distinct(&|r| {
        let p = &r.provenance;
        let mut load = p
            .load_average
            .map_or(String::new(), |l| format!(", load average {l:.1} at start"));
        if p.warmup_rounds > 0 {
            load.push_str(&format!(
                ", after {} uncounted warm-up round(s)",
                p.warmup_rounds
            ));
        }
        if p.priority.is_empty() {
            format!("priority not recorded{load}")
        } else {
            format!("{}{load}", p.priority)
        }
    });
    format!(
        "Measured by invocation(s) {invocations}; build {build}; {pinning}; {priority}; store on {store}{fsync}{state_fsync}.\n"
    )
}

/// The syncs of histogram `name` over every run, as "; `what` p50 .., p99 .. over N syncs" (empty when none).
fn merged_sync_times(ran: &[&RunResult], name: &str, what: &str) -> String {
    let mut all: Option<hdrhistogram::Histogram<u64>> = None;
    for h in ran.iter().filter_map(|r| r.histograms.get(name)) {
        if let Ok(h) = workloads::hist::decode(h) {
            match &mut all {
                Some(a) => {
                    let _ = a.add(&h);
                }
                None => all = Some(h),
            }
        }
    }
    match all.filter(|h| !h.is_empty()) {
        Some(h) => format!(
            "; {what} p50 {:.2} ms, p99 {:.2} ms over {} syncs",
            workloads::hist::quantile_ms(&h, 0.5),
            workloads::hist::quantile_ms(&h, 0.99),
            h.len()
        ),
        None => String::new(),
    }
}

/// The standard table: a row per transport, the columns summarising its rounds.
fn table(columns: &[Column], results: &[&RunResult]) -> String {
    let mut b = Builder::default();
    let mut header = vec!["transport".to_string(), "rounds".to_string()];
    header.extend(columns.iter().map(|c| c.header.to_string()));
    header.push("not to be trusted".into());
    b.push_record(header);
    for (transport, runs) in by_transport(results) {
        if let Some(reason) = runs.iter().find_map(|r| r.skipped.as_deref()) {
            let mut row = vec![transport.to_string(), "-".into(), format!("n/a: {reason}")];
            row.extend(std::iter::repeat_n(String::new(), columns.len()));
            b.push_record(row);
            continue;
        }
        let mut row = vec![transport.clone(), runs.len().to_string()];
        for c in columns {
            let values: Vec<f64> = runs.iter().filter_map(|r| r.metric(c.metric)).collect();
            row.push(cell(&values, c.format));
        }
        row.push(distrust(&runs));
        b.push_record(row);
    }
    let seeds = results
        .iter()
        .find(|r| r.skipped.is_none())
        .map(|r| seeds::matching(r))
        .unwrap_or_default();
    for entry in &seeds {
        for s in &entry.rows {
            let mut row = vec![
                format!("seed {}: {}", entry.seed, s.label),
                s.rounds.map_or("-".into(), |n| n.to_string()),
            ];
            for c in columns {
                row.push(
                    s.metrics
                        .get(c.metric)
                        .map_or(String::new(), |f| f.cell(c.format)),
                );
            }
            b.push_record(row);
        }
    }
    let mut table = b.build();
    table.with(Style::markdown());
    let mut out = table.to_string();
    for entry in &seeds {
        out.push_str(&format!(
            "\n\nSeed {} rows: {}. Other hardware and code: compare shapes and ratios, not values.",
            entry.seed, entry.source
        ));
    }
    out
}

/// The latency distributions of a workload: every histogram of every transport, rounds merged.
fn latency_table(results: &[&RunResult]) -> String {
    let mut merged: Vec<(String, String, hdrhistogram::Histogram<u64>)> = Vec::new();
    for r in results.iter().filter(|r| r.skipped.is_none()) {
        for (name, encoded) in &r.histograms {
            let Ok(h) = workloads::hist::decode(encoded) else {
                continue;
            };
            let label = crate::hostile::label(r);
            match merged.iter_mut().find(|(t, n, _)| *t == label && n == name) {
                Some((_, _, m)) => {
                    let _ = m.add(&h);
                }
                None => merged.push((label, name.clone(), h)),
            }
        }
    }
    // A histogram with no sample says nothing (a store that never synced): leave it out.
    merged.retain(|(_, _, h)| !h.is_empty());
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
                    .filter(|r| crate::hostile::label(r) == *t)
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
        // One line per transport and reason, naming the swept values and rounds it applies to.
        let mut reasons: Vec<(String, Vec<String>)> = Vec::new();
        for r in runs {
            for flag in workloads::trust::flags(r) {
                let at = value(r).map_or(format!("round {}", r.round), |v| {
                    format!("{} {} round {}", sweep.key, thousands(v), r.round)
                });
                match reasons.iter_mut().find(|(f, _)| *f == flag) {
                    Some((_, ats)) => ats.push(at),
                    None => reasons.push((flag, vec![at])),
                }
            }
        }
        for (flag, ats) in reasons {
            out.push_str(&format!(
                "\n{t}: not to be trusted: {flag} ({})\n",
                ats.join(", ")
            ));
        }
    }
    out.push('\n');
    out.push_str(&origin(results));
    out.push_str(&latency_table(results));
    out
}

/// Why the numbers of some of these runs cannot be trusted, round by round; empty when nothing says so.
fn distrust(runs: &[&RunResult]) -> String {
    runs.iter()
        .filter_map(|r| {
            let flags = workloads::trust::flags(r);
            (!flags.is_empty()).then(|| format!("round {}: {}", r.round, flags.join(", ")))
        })
        .collect::<Vec<_>>()
        .join("; ")
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
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
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
