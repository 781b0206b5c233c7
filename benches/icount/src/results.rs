//! Results (one JSON object per scenario, JSON Lines) and the comparison of a run with a baseline.

use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// The version of the record layout below.
pub const SCHEMA: &str = "icount/1";

/// One scenario's count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub schema: String,
    pub scenario: String,
    /// Instructions counted divided by `iterations`.
    pub instructions_per_op: f64,
    /// Instructions counted in all (user space, measured sections only).
    pub instructions: u64,
    /// Counted steps (the warm-up is not counted).
    pub iterations: u64,
    #[serde(flatten)]
    pub provenance: Provenance,
}

/// What a count depends on besides the code: the tool, the compiler, the CPU (its features choose code paths).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    pub valgrind: String,
    /// Short commit hash, `-dirty` if tracked files had changes.
    pub commit: String,
    pub rustc: String,
    /// The host's CPU model (for the record; [`Provenance::cpu_features`] decides comparability).
    pub cpu: String,
    /// The CPU features the scenarios saw under valgrind, which choose the libraries' code paths.
    pub cpu_features: String,
}

impl Provenance {
    /// This build on this machine, measured with `valgrind` on a CPU that shows `cpu_features` under it.
    pub fn here(valgrind: String, cpu_features: String) -> Provenance {
        Provenance {
            valgrind,
            commit: commit(),
            rustc: env!("ICOUNT_RUSTC_VERSION").to_string(),
            cpu: cpu_model(),
            cpu_features,
        }
    }
}

fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn commit() -> String {
    let Some(c) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return "unknown".into();
    };
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{c}-dirty")
    } else {
        c
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Read a results file.
pub fn read(path: &Path) -> anyhow::Result<Vec<Record>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let r: Record = serde_json::from_str(l).with_context(|| {
                format!("{} line {}: not an icount record", path.display(), i + 1)
            })?;
            anyhow::ensure!(
                r.schema == SCHEMA,
                "{} line {}: schema {} (this tool reads {SCHEMA})",
                path.display(),
                i + 1,
                r.schema
            );
            Ok(r)
        })
        .collect()
}

/// Write a results file (replacing it).
pub fn write(path: &Path, records: &[Record]) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut text = String::new();
    for r in records {
        text.push_str(&serde_json::to_string(r)?);
        text.push('\n');
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// How one scenario compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within the tolerance.
    Unchanged,
    /// More instructions than the tolerance allows: the check fails.
    Regressed,
    /// Fewer instructions than the tolerance: passes; the baseline should be renewed to hold the gain.
    Improved,
    /// Not in the baseline.
    New,
    /// In the baseline but not measured now: the check fails (nothing holds that path any more).
    Missing,
    /// Measured with a different step count than the baseline: not comparable (amortised costs differ); fails.
    Incomparable,
}

impl Verdict {
    fn fails(self) -> bool {
        matches!(
            self,
            Verdict::Regressed | Verdict::Missing | Verdict::Incomparable
        )
    }

    fn label(self) -> &'static str {
        match self {
            Verdict::Unchanged => "ok",
            Verdict::Regressed => "**REGRESSED**",
            Verdict::Improved => "improved (renew the baseline)",
            Verdict::New => "new",
            Verdict::Missing => "**MISSING**",
            Verdict::Incomparable => "**different step count**",
        }
    }
}

/// One row of the comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub scenario: String,
    pub baseline: Option<f64>,
    pub now: Option<f64>,
    pub verdict: Verdict,
}

impl Row {
    /// The relative change, now against baseline.
    pub fn change(&self) -> Option<f64> {
        match (self.baseline, self.now) {
            (Some(b), Some(n)) if b > 0.0 => Some(n / b - 1.0),
            _ => None,
        }
    }
}

/// A run compared with a baseline, scenario by scenario.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub rows: Vec<Row>,
    /// The largest growth allowed, in percent.
    pub tolerance_pct: f64,
    /// Provenance fields that differ between the two (a different compiler or valgrind explains a change).
    pub differences: Vec<String>,
    /// Set when the baseline was counted on a CPU showing other features: the libraries take other code paths,
    /// so no row can be compared and the check fails.
    pub other_machine: Option<String>,
}

impl Comparison {
    /// Compare `now` with `baseline`: a scenario regresses when it grew by more than `tolerance_pct` percent.
    pub fn new(baseline: &[Record], now: &[Record], tolerance_pct: f64) -> Comparison {
        let base: BTreeMap<&str, &Record> =
            baseline.iter().map(|r| (r.scenario.as_str(), r)).collect();
        let tol = tolerance_pct / 100.0;
        let mut rows: Vec<Row> = now
            .iter()
            .map(|r| {
                let b = base.get(r.scenario.as_str());
                let verdict = match b {
                    None => Verdict::New,
                    Some(b) if b.iterations != r.iterations => Verdict::Incomparable,
                    Some(b) if r.instructions_per_op > b.instructions_per_op * (1.0 + tol) => {
                        Verdict::Regressed
                    }
                    Some(b) if r.instructions_per_op < b.instructions_per_op * (1.0 - tol) => {
                        Verdict::Improved
                    }
                    Some(_) => Verdict::Unchanged,
                };
                Row {
                    scenario: r.scenario.clone(),
                    baseline: b.map(|b| b.instructions_per_op),
                    now: Some(r.instructions_per_op),
                    verdict,
                }
            })
            .collect();
        for b in baseline {
            if !now.iter().any(|r| r.scenario == b.scenario) {
                rows.push(Row {
                    scenario: b.scenario.clone(),
                    baseline: Some(b.instructions_per_op),
                    now: None,
                    verdict: Verdict::Missing,
                });
            }
        }
        let mut differences = Vec::new();
        let mut other_machine = None;
        if let (Some(b), Some(n)) = (baseline.first(), now.first()) {
            let (b, n) = (&b.provenance, &n.provenance);
            if b.cpu_features != n.cpu_features {
                other_machine = Some(format!(
                    "the baseline was counted on a CPU showing [{}] under valgrind, this one shows [{}]: the \
                     libraries take other code paths, so the counts are not comparable; count a baseline on this \
                     machine class (scripts/icount --out FILE)",
                    b.cpu_features, n.cpu_features
                ));
            }
            for (what, x, y) in [
                ("rustc", &b.rustc, &n.rustc),
                ("valgrind", &b.valgrind, &n.valgrind),
                ("cpu", &b.cpu, &n.cpu),
            ] {
                if x != y {
                    differences.push(format!("{what}: baseline `{x}`, now `{y}`"));
                }
            }
        }
        Comparison {
            rows,
            tolerance_pct,
            differences,
            other_machine,
        }
    }

    /// Whether the check fails.
    pub fn failed(&self) -> bool {
        self.other_machine.is_some() || self.rows.iter().any(|r| r.verdict.fails())
    }

    /// The scenarios that fail the check (every one when the baseline is from another machine class).
    pub fn failures(&self) -> Vec<&str> {
        self.rows
            .iter()
            .filter(|r| self.other_machine.is_some() || r.verdict.fails())
            .map(|r| r.scenario.as_str())
            .collect()
    }

    /// A Markdown table: scenario, baseline, now, change, verdict.
    pub fn markdown(&self) -> String {
        let num = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Instructions per operation, tolerance +{}%:\n",
            self.tolerance_pct
        );
        out.push_str("| scenario | baseline | now | change | |\n|---|---:|---:|---:|---|\n");
        for r in &self.rows {
            // Rounded first, so a change too small to show reads +0.00%, not -0.00%.
            let change = r.change().map_or("-".to_string(), |c| {
                format!("{:+.2}%", (c * 10_000.0).round() / 100.0 + 0.0)
            });
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                r.scenario,
                num(r.baseline),
                num(r.now),
                change,
                r.verdict.label()
            );
        }
        if let Some(m) = &self.other_machine {
            let _ = writeln!(out, "\n**Not comparable**: {m}.");
        }
        for d in &self.differences {
            let _ = writeln!(
                out,
                "\nNote: {d}; a change may come from that rather than from the code."
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(scenario: &str, per_op: f64, iterations: u64) -> Record {
        Record {
            schema: SCHEMA.into(),
            scenario: scenario.into(),
            instructions_per_op: per_op,
            instructions: (per_op * iterations as f64) as u64,
            iterations,
            provenance: Provenance {
                valgrind: "valgrind-3.19.0".into(),
                commit: "abc".into(),
                rustc: "rustc 1".into(),
                cpu: "cpu".into(),
                cpu_features: "aes,avx2".into(),
            },
        }
    }

    #[test]
    fn growth_beyond_the_tolerance_fails_and_nothing_else_does() {
        let base = [
            rec("a", 1000.0, 10),
            rec("b", 1000.0, 10),
            rec("c", 1000.0, 10),
        ];
        let now = [
            rec("a", 1009.0, 10),
            rec("b", 1011.0, 10),
            rec("c", 900.0, 10),
            rec("d", 5.0, 10),
        ];
        let c = Comparison::new(&base, &now, 1.0);
        let verdicts: Vec<_> = c
            .rows
            .iter()
            .map(|r| (r.scenario.as_str(), r.verdict))
            .collect();
        assert_eq!(
            verdicts,
            [
                ("a", Verdict::Unchanged),
                ("b", Verdict::Regressed),
                ("c", Verdict::Improved),
                ("d", Verdict::New)
            ]
        );
        assert!(c.failed());
        assert_eq!(c.failures(), ["b"]);
        let table = c.markdown();
        assert!(
            table.contains("| b | 1000.0 | 1011.0 | +1.10% | **REGRESSED** |"),
            "{table}"
        );
        assert!(!Comparison::new(&base, &base, 1.0).failed());
        let tiny = Comparison::new(&base[..1], &[rec("a", 999.99, 10)], 1.0).markdown();
        assert!(
            tiny.contains("| a | 1000.0 | 1000.0 | +0.00% | ok |"),
            "{tiny}"
        );
    }

    #[test]
    fn a_scenario_no_longer_measured_or_measured_differently_fails() {
        let base = [rec("a", 10.0, 10), rec("b", 10.0, 10)];
        let c = Comparison::new(&base, &[rec("a", 10.0, 20)], 1.0);
        assert_eq!(c.rows[0].verdict, Verdict::Incomparable);
        assert_eq!(c.rows[1].verdict, Verdict::Missing);
        assert_eq!(c.failures(), ["a", "b"]);
    }

    #[test]
    fn provenance_differences_are_noted() {
        let mut now = rec("a", 10.0, 10);
        now.provenance.rustc = "rustc 2".into();
        let c = Comparison::new(&[rec("a", 10.0, 10)], &[now], 1.0);
        assert!(!c.failed());
        assert!(c
            .markdown()
            .contains("rustc: baseline `rustc 1`, now `rustc 2`"));
    }

    #[test]
    fn a_baseline_from_a_cpu_with_other_features_is_not_comparable() {
        let mut now = rec("a", 10.0, 10);
        now.provenance.cpu = "another model".into();
        let c = Comparison::new(&[rec("a", 10.0, 10)], std::slice::from_ref(&now), 1.0);
        assert!(!c.failed(), "only the model differs: comparable");
        now.provenance.cpu_features = "aes".into();
        let c = Comparison::new(&[rec("a", 10.0, 10)], &[now], 1.0);
        assert!(c.failed());
        assert_eq!(c.failures(), ["a"]);
        assert!(c.markdown().contains("**Not comparable**"));
    }

    #[test]
    fn records_round_trip_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/r.jsonl");
        let records = vec![rec("a", 1.5, 2), rec("b", 2.0, 4)];
        write(&path, &records).unwrap();
        assert_eq!(read(&path).unwrap(), records);
        let line = std::fs::read_to_string(&path).unwrap();
        assert!(
            line.starts_with(r#"{"schema":"icount/1","scenario":"a","instructions_per_op":1.5"#),
            "{line}"
        );
        std::fs::write(&path, "{\"schema\":\"other\"}\n").unwrap();
        assert!(read(&path).is_err());
    }
}
