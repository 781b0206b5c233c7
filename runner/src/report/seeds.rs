//! The seeds' reference rows: the figures of the experiments this suite reproduces (`shared/seeds/DIGEST.md`),
//! kept as data in `baseline-data/seeds.json` and shown beside measured rows, labelled, never compared with them by
//! code. They were measured on other hardware with other code: a reader compares shapes and ratios.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use workloads::result::RunResult;
use workloads::workload::Format;

/// The data file, built into the runner so that a report needs nothing beside the results.
const SEEDS_JSON: &str = include_str!("../../../baseline-data/seeds.json");

/// A seed's figure: one number, the rounds in order, or a median with its range.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Figure {
    /// One number.
    One(f64),
    /// Each round's value.
    Rounds(Vec<f64>),
    /// What the seed gave: a median and its range.
    Range {
        /// The median.
        median: f64,
        /// The smallest round.
        min: f64,
        /// The largest round.
        max: f64,
    },
}

/// One reference row.
#[derive(Debug, Clone, Deserialize)]
pub struct Row {
    /// What was measured (`Pure, memo`).
    pub label: String,
    /// Rounds, where the seed says.
    #[serde(default)]
    pub rounds: Option<u32>,
    /// Figures by metric key.
    pub metrics: BTreeMap<String, Figure>,
}

/// The rows of one seed for one workload case.
#[derive(Debug, Clone, Deserialize)]
pub struct Entry {
    /// The seed's number (`095`).
    pub seed: String,
    /// Where and how it was measured.
    pub source: String,
    /// The workload.
    pub workload: String,
    /// The parameters a case must have for these rows to apply.
    pub case: serde_json::Map<String, serde_json::Value>,
    /// The rows.
    pub rows: Vec<Row>,
}

#[derive(Debug, Deserialize)]
struct File {
    seeds: Vec<Entry>,
}

/// Every entry of the data file.
pub fn all() -> &'static [Entry] {
    static SEEDS: OnceLock<Vec<Entry>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        serde_json::from_str::<File>(SEEDS_JSON)
            .expect("baseline-data/seeds.json parses (a unit test holds it to that)")
            .seeds
    })
}

/// The entries for the case of a result: only results of the seed profile (the seeds' own parameters) get them, and
/// each of an entry's case keys must equal the result's parameter (numbers compared as numbers, so `0` matches
/// `0.0`).
pub fn matching(r: &RunResult) -> Vec<&'static Entry> {
    if r.provenance.profile != "seed" {
        return Vec::new();
    }
    let params = &r.params;
    all()
        .iter()
        .filter(|e| e.workload == r.workload)
        .filter(|e| {
            e.case.iter().all(|(k, want)| match (params.get(k), want) {
                (Some(have), want) if have.is_number() && want.is_number() => {
                    have.as_f64() == want.as_f64()
                }
                (Some(have), want) => have == want,
                (None, _) => false,
            })
        })
        .collect()
}

impl Figure {
    /// The figure as the values a table cell summarises (for a range: min, median and max, so that the median and
    /// the range come out as the seed gave them).
    pub fn values(&self) -> Vec<f64> {
        match self {
            Figure::One(v) => vec![*v],
            Figure::Rounds(v) => v.clone(),
            Figure::Range { median, min, max } => vec![*min, *median, *max],
        }
    }

    /// The figure in a table cell of this format; a range the seed gave without its rounds never poses as rounds.
    pub fn cell(&self, format: Format) -> String {
        match (self, format) {
            (Figure::Range { .. }, Format::Rounds) => super::cell(&self.values(), Format::Count),
            _ => super::cell(&self.values(), format),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_file_names_what_workloads_record() {
        assert!(!all().is_empty());
        for e in all() {
            assert!(!e.rows.is_empty(), "{} {}", e.seed, e.workload);
            // Entries for workloads this build does not have (yet) are kept; for those it has, every figure is a
            // metric the workload records and every case key one of its parameters.
            let Some(w) = workloads::by_name(&e.workload) else {
                continue;
            };
            let info = w.info();
            let keys = w.param_keys();
            for k in e.case.keys() {
                assert!(keys.contains(k), "{}: case key {k}", e.workload);
            }
            for row in &e.rows {
                for m in row.metrics.keys() {
                    let known = info.metrics.iter().any(|x| x.key == m.as_str())
                        || info.columns.iter().any(|c| c.metric == m.as_str());
                    assert!(known, "{} {}: {m} is not a metric", e.workload, row.label);
                }
            }
        }
    }

    #[test]
    fn cases_match_by_their_keys() {
        let result = |workload: &str, params: serde_json::Value, profile: &str| {
            serde_json::from_value::<RunResult>(serde_json::json!({
                "schema": 1, "workload": workload, "transport": "pure", "round": 0, "params": params,
                "metrics": {}, "histograms": {}, "provenance": {"profile": profile}
            }))
            .unwrap()
        };
        let fc = |rtt: f64| {
            matching(&result(
                "first-contact",
                serde_json::json!({"rtt_ms": rtt}),
                "seed",
            ))
        };
        assert_eq!(fc(50.0).len(), 1);
        assert_eq!(
            fc(50.0)[0].rows[0].metrics["round_trips"],
            Figure::One(1.02)
        );
        assert!(fc(20.0).is_empty());
        let drain =
            |profile| matching(&result("drain", serde_json::json!({"orders": 7}), profile)).len();
        assert_eq!(
            (drain("seed"), drain("quick")),
            (1, 0),
            "seed rows beside seed-profile runs only"
        );
        assert!(matching(&result("nope", serde_json::json!({}), "seed")).is_empty());
        let r = Figure::Range {
            median: 848.0,
            min: 408.0,
            max: 855.0,
        };
        assert_eq!(crate::report::median(&r.values()), Some(848.0));
    }
}
