//! `runner check` and `runner compare`: what CI can hold a change to.
//!
//! Checks never compare absolute times (machines here are shared and noisy). They are:
//!
//! - **hard invariants** of every run: nothing lost, nothing applied twice, every acknowledged order in the log, no
//!   run that timed out; and the design's promises: `pure` does no asymmetric operation after a restart (the memo);
//! - **ratios measured in the same run**: for each workload, each transport's primary metric over the first
//!   transport's in the same round (e.g. `pure:hpke-session` drain rate / `pure:plain` drain rate), median over
//!   rounds, compared with the same ratio in a baseline file: a ratio worse than the baseline's by more than the
//!   tolerance fails.
//!
//! `compare` prints the medians of the primary metrics of two files side by side, with the change.

use std::collections::BTreeMap;
use tabled::builder::Builder;
use tabled::settings::Style;
use workloads::result::RunResult;
use workloads::workload::Better;

/// A workload's primary metric and whether higher is better.
fn primary(workload: &str) -> Option<(&'static str, bool)> {
    workloads::by_name(workload).map(|w| {
        let (metric, better) = w.info().primary;
        (metric, better == Better::Higher)
    })
}

/// The case a result belongs to (its workload's case keys and their values), empty for a single-case workload.
fn case(r: &RunResult) -> String {
    let keys = workloads::by_name(&r.workload)
        .map(|w| w.info().case_keys)
        .unwrap_or(&[]);
    keys.iter()
        .filter_map(|k| r.params.get(*k).map(|v| format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One check and its outcome.
#[derive(Debug, Clone)]
pub struct Check {
    /// What was checked.
    pub what: String,
    /// The value found.
    pub found: String,
    /// What was expected.
    pub expected: String,
    /// Whether it holds.
    pub ok: bool,
}

/// The hard invariants of every run.
pub fn invariants(results: &[RunResult]) -> Vec<Check> {
    let mut out = Vec::new();
    for r in results.iter().filter(|r| r.skipped.is_none()) {
        let name = format!("{} {} round {}", r.workload, r.transport, r.round);
        for key in ["lost", "duplicates", "acked_not_applied", "timed_out"] {
            if let Some(v) = r.metric(key) {
                out.push(Check {
                    what: format!("{name}: {key}"),
                    found: fmt(v),
                    expected: "0".into(),
                    ok: v == 0.0,
                });
            }
        }
        if r.workload == "restart" && r.transport == "pure" {
            let v = r.metric("asym_ops_after").unwrap_or(f64::NAN);
            out.push(Check {
                what: format!("{name}: asymmetric operations after the restart (memo)"),
                found: fmt(v),
                expected: "0".into(),
                ok: v == 0.0,
            });
        }
    }
    out
}

/// Per (workload, transport): the median over rounds of the transport's primary metric divided by the first
/// transport's in the same round and workload setting.
pub fn ratios(results: &[RunResult]) -> BTreeMap<(String, String), f64> {
    // Group by (workload, setting, round): the runs that were measured side by side.
    let mut groups: BTreeMap<(String, String, u32), Vec<&RunResult>> = BTreeMap::new();
    for r in results.iter().filter(|r| r.skipped.is_none()) {
        groups
            .entry((r.workload.clone(), case(r), r.round))
            .or_default()
            .push(r);
    }
    let mut per: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    for ((workload, setting, _), runs) in groups {
        let Some((metric, _)) = primary(&workload) else {
            continue;
        };
        // The reference is the first transport as given on the command line (results keep that order per round
        // only after rotation, so pick by the order of first appearance in the whole file).
        let order: Vec<&str> = {
            let mut seen = Vec::new();
            for r in results.iter().filter(|r| r.workload == workload) {
                if !seen.contains(&r.transport.as_str()) {
                    seen.push(r.transport.as_str());
                }
            }
            seen
        };
        let Some(reference) = order.first() else {
            continue;
        };
        let Some(base) = runs
            .iter()
            .find(|r| r.transport == *reference)
            .and_then(|r| r.metric(metric))
        else {
            continue;
        };
        if base == 0.0 {
            continue;
        }
        for r in &runs {
            if let Some(v) = r.metric(metric) {
                let key = if setting.is_empty() {
                    workload.clone()
                } else {
                    format!("{workload} @{setting}")
                };
                per.entry((key, format!("{} / {reference}", r.transport)))
                    .or_default()
                    .push(v / base);
            }
        }
    }
    per.into_iter()
        .filter_map(|(k, v)| crate::report::median(&v).map(|m| (k, m)))
        .collect()
}

/// Compare the ratios of `current` with those of `baseline`.
pub fn against_baseline(
    current: &[RunResult],
    baseline: &[RunResult],
    tolerance: f64,
) -> Vec<Check> {
    let now = ratios(current);
    let base = ratios(baseline);
    let mut out = Vec::new();
    for ((workload, pair), value) in &now {
        let Some(expected) = base.get(&(workload.clone(), pair.clone())) else {
            continue;
        };
        let name = workload.split(' ').next().unwrap_or(workload);
        let higher_better = primary(name).is_some_and(|(_, h)| h);
        let ok = if higher_better {
            *value >= expected * (1.0 - tolerance)
        } else {
            *value <= expected * (1.0 + tolerance)
        };
        out.push(Check {
            what: format!("{workload}: {pair}"),
            found: format!("{value:.3}"),
            expected: format!(
                "{} {:.3} (baseline {expected:.3})",
                if higher_better { ">=" } else { "<=" },
                if higher_better {
                    expected * (1.0 - tolerance)
                } else {
                    expected * (1.0 + tolerance)
                }
            ),
            ok,
        });
    }
    out
}

/// Render checks as a Markdown table.
pub fn render(checks: &[Check]) -> String {
    let mut b = Builder::default();
    b.push_record(["check", "found", "expected", ""]);
    for c in checks {
        b.push_record([
            c.what.clone(),
            c.found.clone(),
            c.expected.clone(),
            if c.ok { "ok" } else { "FAIL" }.into(),
        ]);
    }
    let mut t = b.build();
    t.with(Style::markdown());
    t.to_string()
}

/// The medians of the primary metrics of two files, side by side.
pub fn compare(a: &[RunResult], b: &[RunResult]) -> String {
    let medians = |rs: &[RunResult]| -> BTreeMap<(String, String), f64> {
        let mut per: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
        for r in rs.iter().filter(|r| r.skipped.is_none()) {
            if let Some((metric, _)) = primary(&r.workload) {
                if let Some(v) = r.metric(metric) {
                    let setting = match case(r) {
                        c if c.is_empty() => c,
                        c => format!(" @{c}"),
                    };
                    per.entry((
                        format!("{}{setting}: {metric}", r.workload),
                        r.transport.clone(),
                    ))
                    .or_default()
                    .push(v);
                }
            }
        }
        per.into_iter()
            .filter_map(|(k, v)| crate::report::median(&v).map(|m| (k, m)))
            .collect()
    };
    let (ma, mb) = (medians(a), medians(b));
    let mut t = Builder::default();
    t.push_record(["metric", "transport", "A (median)", "B (median)", "change"]);
    for ((metric, transport), va) in &ma {
        let Some(vb) = mb.get(&(metric.clone(), transport.clone())) else {
            continue;
        };
        let change = if *va != 0.0 {
            format!("{:+.1}%", (vb - va) / va * 100.0)
        } else {
            "-".into()
        };
        t.push_record([
            metric.clone(),
            transport.clone(),
            fmt(*va),
            fmt(*vb),
            change,
        ]);
    }
    let mut t = t.build();
    t.with(Style::markdown());
    t.to_string()
}

fn fmt(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use workloads::result::{Provenance, SCHEMA};

    fn run(transport: &str, round: u32, rate: f64, lost: f64) -> RunResult {
        RunResult {
            schema: SCHEMA,
            workload: "drain".into(),
            transport: transport.into(),
            round,
            params: serde_json::json!({}),
            metrics: [
                ("orders_per_second".to_string(), rate.into()),
                ("lost".to_string(), lost.into()),
            ]
            .into_iter()
            .collect(),
            histograms: Default::default(),
            provenance: Provenance::default(),
            skipped: None,
        }
    }

    #[test]
    fn invariants_catch_a_lost_order() {
        let checks = invariants(&[run("a", 0, 10.0, 0.0), run("b", 0, 10.0, 3.0)]);
        assert_eq!(checks.iter().filter(|c| !c.ok).count(), 1);
    }

    #[test]
    fn ratios_are_per_round_against_the_first_transport() {
        let rs = [
            run("plain", 0, 100.0, 0.0),
            run("sealed", 0, 90.0, 0.0),
            run("sealed", 1, 50.0, 0.0),
            run("plain", 1, 50.0, 0.0),
        ];
        let r = ratios(&rs);
        assert_eq!(
            r[&("drain".to_string(), "sealed / plain".to_string())],
            0.95
        );
        let base = [run("plain", 0, 10.0, 0.0), run("sealed", 0, 10.0, 0.0)];
        let checks = against_baseline(&rs, &base, 0.02);
        let c = checks.iter().find(|c| c.what.contains("sealed")).unwrap();
        assert!(!c.ok, "0.95 is worse than 1.0 by more than 2%");
        assert!(against_baseline(&rs, &base, 0.10).iter().all(|c| c.ok));
    }
}
