//! Tables from results: medians of rounds with min-max, in the layout of the seeds' tables (Markdown via `tabled`).

use std::collections::BTreeMap;
use tabled::builder::Builder;
use tabled::settings::Style;
use workloads::result::RunResult;

/// How one column of a workload's table is computed.
struct Column {
    header: &'static str,
    metric: &'static str,
    format: Format,
}

#[derive(Clone, Copy)]
enum Format {
    /// Median (min-max) of rounds, as integers with thousands separators.
    Count,
    /// Median (min-max) of rounds, two decimals.
    Decimal,
    /// Every round's value, as integers, in round order (the seeds' "three rounds" column).
    Rounds,
    /// The sum over rounds (hard invariants: lost, duplicates).
    Sum,
}

fn columns(workload: &str) -> Vec<Column> {
    use Format::*;
    let c = |header, metric, format| Column {
        header,
        metric,
        format,
    };
    match workload {
        "drain" => vec![
            c("orders/s, median (min-max)", "orders_per_second", Count),
            c("orders/s, each round", "orders_per_second", Rounds),
            c("server CPU µs/order", "server_cpu_us_per_order", Decimal),
            c("server X25519", "server_x25519", Count),
            c("re-sent", "client_resent", Count),
            c("lost", "lost", Sum),
            c("applied twice", "duplicates", Sum),
        ],
        "restart" => vec![
            c("up again, ms", "up_ms", Decimal),
            c("100 ms bins with nothing stored", "stall_bins", Count),
            c("catch-up, s", "catch_up_s", Decimal),
            c("server CPU s, 10 s after", "server_cpu_s_after", Decimal),
            c("asymmetric ops after", "asym_ops_after", Count),
            c("handshakes after", "handshakes_after", Count),
            c("client CPU s, same 10 s", "client_cpu_s_after", Decimal),
            c("re-sent", "resent", Count),
            c("reconnects", "reconnects", Count),
            c("to stored p99, ms", "make_to_stored_p99_ms", Decimal),
            c("to stored max, ms", "make_to_stored_max_ms", Decimal),
            c("orders", "orders_made", Count),
            c("lost", "lost", Sum),
            c("applied twice", "duplicates", Sum),
        ],
        _ => Vec::new(),
    }
}

/// Render every workload's table, in the order workloads first appear.
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

fn render_workload(workload: &str, results: &[&RunResult]) -> String {
    if workload == "first-contact" {
        return render_first_contact(results);
    }
    let mut by_transport: BTreeMap<usize, (&str, Vec<&RunResult>)> = BTreeMap::new();
    let mut seen: Vec<&str> = Vec::new();
    for r in results {
        let i = match seen.iter().position(|t| *t == r.transport) {
            Some(i) => i,
            None => {
                seen.push(&r.transport);
                seen.len() - 1
            }
        };
        by_transport
            .entry(i)
            .or_insert((&r.transport, Vec::new()))
            .1
            .push(r);
    }
    let mut cols = columns(workload);
    if cols.is_empty() {
        cols = generic_columns(results);
    }
    let mut b = Builder::default();
    let mut header = vec!["transport".to_string(), "rounds".to_string()];
    header.extend(cols.iter().map(|c| c.header.to_string()));
    b.push_record(header);
    for (_, (transport, mut runs)) in by_transport {
        runs.sort_by_key(|r| r.round);
        if let Some(reason) = runs.iter().find_map(|r| r.skipped.as_deref()) {
            let mut row = vec![
                transport.to_string(),
                "-".into(),
                format!("does not apply: {reason}"),
            ];
            row.extend(std::iter::repeat_n(
                String::new(),
                cols.len().saturating_sub(1),
            ));
            b.push_record(row);
            continue;
        }
        let mut row = vec![transport.to_string(), runs.len().to_string()];
        for c in &cols {
            let values: Vec<f64> = runs.iter().filter_map(|r| r.metric(c.metric)).collect();
            row.push(cell(&values, c.format));
        }
        b.push_record(row);
    }
    let mut table = b.build();
    table.with(Style::markdown());
    format!("### {workload}\n\n{table}\n{}", latency_table(results))
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

/// Seed 095's M4 layout: one row per RTT, a p50 and a round-trip column per transport (medians of rounds).
fn render_first_contact(results: &[&RunResult]) -> String {
    let mut transports: Vec<&str> = Vec::new();
    let mut rtts: Vec<u64> = Vec::new();
    for r in results {
        if !transports.contains(&r.transport.as_str()) {
            transports.push(&r.transport);
        }
        let rtt = r
            .metric("rtt_ms")
            .or_else(|| r.params["rtt_ms"].as_f64())
            .unwrap_or(0.0) as u64;
        if r.skipped.is_none() && !rtts.contains(&rtt) {
            rtts.push(rtt);
        }
    }
    rtts.sort_unstable();
    let mut b = Builder::default();
    let mut header = vec![
        "RTT, ms".to_string(),
        "emulated RTT measured, ms".to_string(),
    ];
    for t in &transports {
        header.push(format!("{t} p50, ms"));
        header.push(format!("{t} round trips"));
    }
    b.push_record(header);
    for rtt in rtts {
        let at: Vec<&&RunResult> = results
            .iter()
            .filter(|r| r.metric("rtt_ms") == Some(rtt as f64))
            .collect();
        let measured: Vec<f64> = at
            .iter()
            .filter_map(|r| r.metric("measured_rtt_ms"))
            .collect();
        let mut row = vec![rtt.to_string(), cell(&measured, Format::Decimal)];
        for t in &transports {
            let of: Vec<&&&RunResult> = at.iter().filter(|r| r.transport == *t).collect();
            let p50: Vec<f64> = of.iter().filter_map(|r| r.metric("p50_ms")).collect();
            let trips: Vec<f64> = of.iter().filter_map(|r| r.metric("round_trips")).collect();
            row.push(cell(&p50, Format::Decimal));
            row.push(cell(&trips, Format::Decimal));
        }
        b.push_record(row);
    }
    let mut table = b.build();
    table.with(Style::markdown());
    let mut out = format!("### first-contact\n\n{table}\n");
    for r in results {
        if let Some(reason) = &r.skipped {
            out.push_str(&format!("\n{}: does not apply: {reason}\n", r.transport));
            break;
        }
    }
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
            Column {
                header: n,
                metric: n,
                format: Format::Decimal,
            }
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
