//! The result contract: one JSON object per run, appended to a JSON Lines file.
//!
//! Later tools and CI read these keys: `schema`, `workload`, `transport` (the spec as given, e.g. `pure:plain`),
//! `round`, `params`, `metrics`, `histograms` (name → HdrHistogram V2 serialized, base64), `provenance` (`commit`,
//! `dirty`, `build_profile`, `rustc`, `cpu`, `cores`, `kernel`, `date`, `profile`, `invocation`, `pinning`). A
//! workload that does not apply to a transport writes a result with `skipped` set to the reason and no metrics.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::Path;

/// The version of this contract; bumped when a key changes meaning.
pub const SCHEMA: u32 = 1;

/// One run of one workload against one transport.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    /// [`SCHEMA`].
    pub schema: u32,
    /// The workload's name.
    pub workload: String,
    /// The transport spec as given.
    pub transport: String,
    /// The round, from 0.
    pub round: u32,
    /// The workload's parameters, as the workload's own serde type wrote them.
    pub params: serde_json::Value,
    /// Every metric by name. Numbers, except where a metric is a series (`timeline`).
    pub metrics: BTreeMap<String, serde_json::Value>,
    /// Whole latency histograms by name, HdrHistogram V2 serialized, base64.
    pub histograms: BTreeMap<String, String>,
    /// Where and how the numbers were measured.
    pub provenance: Provenance,
    /// Set when the workload does not apply to the transport: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// The store's settings and what it did (absent when no server ran, and in results of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<crate::durability::Durability>,
    /// Set when the run failed: the error. Metrics recorded before the failure stay, and say nothing on their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RunResult {
    /// A metric as a number, if present and numeric.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metrics.get(name).and_then(|v| v.as_f64())
    }
}

/// Where and how a result was measured. Missing fields read as empty, so results from other tools still load.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(default)]
pub struct Provenance {
    /// The commit the runner was built from (embedded at build time; `unknown` outside a git checkout).
    pub commit: String,
    /// Whether the sources the runner was built from differed from that commit.
    pub dirty: bool,
    /// The cargo profile the runner was built with (`release`, `debug`).
    pub build_profile: String,
    /// The compiler that built the runner.
    pub rustc: String,
    /// The allocator of the runner's processes, server and load generator (`mimalloc`, `system`); empty in results
    /// from before it was recorded, whose processes used the system's.
    pub allocator: String,
    /// CPU model.
    pub cpu: String,
    /// Cores available to the process.
    pub cores: u32,
    /// Kernel release.
    pub kernel: String,
    /// When the run started, UTC, RFC 3339.
    pub date: String,
    /// The profile (`quick`, `seed`).
    pub profile: String,
    /// A random id shared by every result of one `runner` invocation: ratios are taken within one invocation only.
    pub invocation: String,
    /// Where the server and the load generator ran.
    pub pinning: crate::pin::Pinning,
    /// The runner's scheduling priority (`nice N, autogroup nice M`; the server inherits it): on a shared machine a
    /// raised priority keeps other processes from taking the measured ones' CPUs.
    pub priority: String,
    /// The machine's 1-minute load average when the invocation started.
    pub load_average: Option<f64>,
    /// Uncounted rounds the invocation ran before its counted ones (`runner run --warmup`).
    #[serde(default)]
    pub warmup_rounds: u32,
}

/// Errors reading or writing results files.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        source: std::io::Error,
    },
    /// A line is not a result.
    #[error("{path} line {line}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        source: serde_json::Error,
    },
}

/// Append results to a JSON Lines file (created with its directory if needed), one object per line, synced.
pub fn append(path: &Path, results: &[RunResult]) -> Result<(), ResultsError> {
    let io = |source| ResultsError::Io {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    let mut buf = Vec::new();
    for r in results {
        serde_json::to_writer(&mut buf, r).expect("results serialize");
        buf.push(b'\n');
    }
    f.write_all(&buf).map_err(io)?;
    f.sync_all().map_err(io)
}

/// Read every result of a JSON Lines file. Blank lines are skipped; anything else that is not a result is an error
/// naming its line.
pub fn read(path: &Path) -> Result<Vec<RunResult>, ResultsError> {
    let p = path.display().to_string();
    let f = std::fs::File::open(path).map_err(|source| ResultsError::Io {
        path: p.clone(),
        source,
    })?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|source| ResultsError::Io {
            path: p.clone(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(
            serde_json::from_str(&line).map_err(|source| ResultsError::Parse {
                path: p.clone(),
                line: i + 1,
                source,
            })?,
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/results.jsonl");
        let mut r = RunResult {
            schema: SCHEMA,
            workload: "drain".into(),
            transport: "pure:plain".into(),
            round: 0,
            params: serde_json::json!({"orders": 10}),
            metrics: BTreeMap::from([("orders".to_string(), serde_json::json!(10))]),
            histograms: BTreeMap::new(),
            provenance: Provenance::default(),
            skipped: None,
            durability: None,
            error: None,
        };
        append(&path, std::slice::from_ref(&r)).unwrap();
        r.round = 1;
        append(&path, std::slice::from_ref(&r)).unwrap();
        let back = read(&path).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[1], r);
        assert_eq!(back[0].metric("orders"), Some(10.0));
    }

    #[test]
    fn a_bad_line_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        std::fs::write(&path, "\n{\"schema\":1}\n").unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
    }
}
