//! `runner export`: results in the formats benchmark dashboards read, so that a project can chart its history
//! without this suite.
//!
//! - `github-bigger` / `github-smaller`: the JSON of github-action-benchmark's `customBiggerIsBetter` and
//!   `customSmallerIsBetter` tools, an array of `{name, unit, value, range, extra}`
//!   (<https://github.com/benchmark-action/github-action-benchmark#examples>). Each file holds the metrics whose
//!   column calls larger (smaller) better.
//! - `bencher`: Bencher Metric Format, `{benchmark: {measure: {value, lower_value, upper_value}}}`
//!   (<https://bencher.dev/docs/reference/bencher-metric-format/>), every metric with a direction.
//!
//! A benchmark is one workload case on one transport (`drain / pure:plain`, `first-contact @rtt_ms=50 / quinn`);
//! its value is the median over rounds, its range the rounds' min and max. Only metrics with a direction are
//! exported ([`workloads::workload::Info::judged`]); runs whose numbers cannot be trusted are left out.

use crate::compare::number;
use crate::report::median;
use anyhow::{bail, Result};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use workloads::result::RunResult;
use workloads::workload::Better;

/// The output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// github-action-benchmark, `tool: customBiggerIsBetter`: the metrics where larger is better.
    GithubBigger,
    /// github-action-benchmark, `tool: customSmallerIsBetter`: the metrics where smaller is better.
    GithubSmaller,
    /// Bencher Metric Format (BMF) JSON: every metric with a direction.
    Bencher,
}

/// One exported value: a metric of one case on one transport, summarised over rounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// `workload[ @case] / transport`.
    pub benchmark: String,
    /// The metric's key.
    pub metric: String,
    /// Its unit, from the workload's metric list.
    pub unit: String,
    /// Which way is better.
    pub better: Better,
    /// The median of the rounds.
    pub value: f64,
    /// The smallest round.
    pub low: f64,
    /// The largest round.
    pub high: f64,
    /// How many rounds.
    pub rounds: usize,
    /// The commits the rounds were measured at.
    pub commits: String,
}

/// Every metric with a direction of every case and transport; an error when one benchmark name would stand for
/// runs with different parameters (export one invocation's results at a time).
pub fn points(results: &[RunResult]) -> Result<Vec<Point>> {
    // Group by workload, parameters and transport, in the order they first appear.
    let mut groups: Vec<(crate::compare::Key, Vec<&RunResult>)> = Vec::new();
    for r in results.iter().filter(|r| r.skipped.is_none()) {
        if !crate::check::distrust(r).is_empty() {
            continue;
        }
        let key = (
            r.workload.clone(),
            r.params.to_string(),
            crate::hostile::label(r),
        );
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, runs)) => runs.push(r),
            None => groups.push((key, vec![r])),
        }
    }
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut out = Vec::new();
    for ((workload, params, transport), runs) in groups {
        let Some(info) = workloads::by_name(&workload).map(|w| w.info()) else {
            continue;
        };
        let benchmark = match crate::check::case(runs[0]) {
            c if c.is_empty() => format!("{workload} / {transport}"),
            c => format!("{workload} @{c} / {transport}"),
        };
        if let Some(other) = names.insert(benchmark.clone(), params.clone()) {
            if other != params {
                bail!(
                    "`{benchmark}` was run with different parameters ({other} and {params}): export one run's results at a time"
                );
            }
        }
        let mut commits: Vec<String> = runs.iter().map(|r| r.provenance.commit.clone()).collect();
        commits.sort();
        commits.dedup();
        for (metric, better) in info.judged() {
            let values: Vec<f64> = runs.iter().filter_map(|r| r.metric(metric)).collect();
            let Some(value) = median(&values) else {
                continue;
            };
            let unit = info
                .metrics
                .iter()
                .find(|m| m.key == metric)
                .map_or("", |m| m.unit);
            out.push(Point {
                benchmark: benchmark.clone(),
                metric: metric.to_string(),
                unit: unit.to_string(),
                better,
                value,
                low: values.iter().copied().fold(f64::INFINITY, f64::min),
                high: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                rounds: values.len(),
                commits: commits.join(", "),
            });
        }
    }
    Ok(out)
}

/// The points in a format, as JSON.
pub fn render(points: &[Point], format: ExportFormat) -> Value {
    let github = |want: Better| {
        Value::Array(
            points
                .iter()
                .filter(|p| p.better == want)
                .map(|p| {
                    json!({
                        "name": format!("{} / {}", p.benchmark, p.metric),
                        "unit": p.unit,
                        "value": p.value,
                        "range": format!("± {}", number((p.high - p.low) / 2.0)),
                        "extra": format!(
                            "median of {} round(s), {} to {}; commit {}",
                            p.rounds, number(p.low), number(p.high), p.commits
                        ),
                    })
                })
                .collect(),
        )
    };
    match format {
        ExportFormat::GithubBigger => github(Better::Higher),
        ExportFormat::GithubSmaller => github(Better::Lower),
        ExportFormat::Bencher => {
            let mut out = Map::new();
            for p in points {
                let entry = out
                    .entry(p.benchmark.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(measures) = entry {
                    measures.insert(
                        p.metric.clone(),
                        json!({"value": p.value, "lower_value": p.low, "upper_value": p.high}),
                    );
                }
            }
            Value::Object(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use workloads::result::{Provenance, SCHEMA};

    fn run(transport: &str, round: u32, rate: f64, cpu: f64) -> RunResult {
        RunResult {
            schema: SCHEMA,
            workload: "drain".into(),
            transport: transport.into(),
            round,
            params: json!({"orders": 100}),
            metrics: [
                ("orders_per_second".to_string(), rate.into()),
                ("server_cpu_us_per_order".to_string(), cpu.into()),
                ("orders".to_string(), 100.into()),
                ("lost".to_string(), 0.into()),
            ]
            .into_iter()
            .collect(),
            histograms: Default::default(),
            provenance: Provenance {
                commit: "abc".into(),
                ..Provenance::default()
            },
            skipped: None,
            durability: Some(workloads::durability::Durability {
                sync: "batch".into(),
                store_fs: "ext4".into(),
                ..Default::default()
            }),
            error: None,
        }
    }

    #[test]
    fn metrics_are_filed_by_direction() {
        let rs = [
            run("plain", 0, 100.0, 1.0),
            run("plain", 1, 110.0, 1.5),
            run("plain", 2, 90.0, 1.2),
        ];
        let p = points(&rs).unwrap();
        let bigger = render(&p, ExportFormat::GithubBigger);
        let bigger = bigger.as_array().unwrap();
        assert_eq!(bigger.len(), 1, "{bigger:?}");
        assert_eq!(bigger[0]["name"], "drain / plain / orders_per_second");
        assert_eq!(bigger[0]["unit"], "orders/s");
        assert_eq!(bigger[0]["value"], 100.0);
        assert_eq!(bigger[0]["range"], "± 10");
        let smaller = render(&p, ExportFormat::GithubSmaller);
        let names: Vec<&str> = smaller
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert!(
            names.contains(&"drain / plain / server_cpu_us_per_order"),
            "{names:?}"
        );
        assert!(names.contains(&"drain / plain / lost"), "{names:?}");
        assert!(
            !names.iter().any(|n| n.ends_with("/ orders")),
            "a setting has no direction"
        );
        let bmf = render(&p, ExportFormat::Bencher);
        let m = &bmf["drain / plain"]["orders_per_second"];
        assert_eq!(
            (&m["value"], &m["lower_value"], &m["upper_value"]),
            (&json!(100.0), &json!(90.0), &json!(110.0))
        );
    }

    #[test]
    fn mixed_parameters_and_untrusted_runs() {
        let mut other = run("plain", 0, 5.0, 1.0);
        other.params = json!({"orders": 5});
        let e = points(&[run("plain", 0, 100.0, 1.0), other]).unwrap_err();
        assert!(e.to_string().contains("different parameters"), "{e}");
        let mut lossy = run("plain", 1, 1.0, 1.0);
        lossy.metrics.insert("lost".into(), 3.into());
        let p = points(&[run("plain", 0, 100.0, 1.0), lossy]).unwrap();
        assert!(p.iter().all(|p| p.rounds == 1), "{p:?}");
    }
}
