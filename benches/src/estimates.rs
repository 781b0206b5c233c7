//! Reading criterion's saved results: `<criterion dir>/<group>/<function>[/<value>]/<baseline>/estimates.json`
//! (point estimates and confidence intervals, in nanoseconds) and `benchmark.json` beside it (the ids as written
//! in the bench, before criterion made them safe as directory names).

use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// What can go wrong reading saved results.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The criterion directory does not exist.
    #[error("no criterion results at {0} (run `cargo bench -p microbench` first, or pass --criterion-dir)")]
    NoCriterionDir(PathBuf),
    /// No benchmark under the directory has the baseline.
    #[error("no benchmark under {dir} has a saved baseline named {baseline:?}")]
    NoBaseline { dir: PathBuf, baseline: String },
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file is not what criterion writes.
    #[error("cannot parse {path}: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// A confidence interval, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct ConfidenceInterval {
    pub confidence_level: f64,
    pub lower_bound: f64,
    pub upper_bound: f64,
}

impl ConfidenceInterval {
    pub fn overlaps(&self, other: &ConfidenceInterval) -> bool {
        self.lower_bound <= other.upper_bound && other.lower_bound <= self.upper_bound
    }
}

/// One statistic with its bootstrap confidence interval, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct Estimate {
    pub confidence_interval: ConfidenceInterval,
    pub point_estimate: f64,
    pub standard_error: f64,
}

/// The statistics of `estimates.json` the tables use (criterion writes more).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct Estimates {
    pub mean: Estimate,
    pub median: Estimate,
}

/// Which statistic a table shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Statistic {
    #[default]
    Median,
    Mean,
}

impl Statistic {
    pub fn name(self) -> &'static str {
        match self {
            Statistic::Median => "median",
            Statistic::Mean => "mean",
        }
    }
}

impl Estimates {
    pub fn get(&self, statistic: Statistic) -> &Estimate {
        match statistic {
            Statistic::Median => &self.median,
            Statistic::Mean => &self.mean,
        }
    }
}

/// A benchmark's id as the bench wrote it: group `p256/ecdh`, function `openssl`, value `1024`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
pub struct BenchId {
    #[serde(rename = "group_id")]
    pub group: String,
    #[serde(rename = "function_id")]
    pub function: Option<String>,
    #[serde(rename = "value_str")]
    pub value: Option<String>,
}

impl fmt::Display for BenchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.group)?;
        for part in [&self.function, &self.value].into_iter().flatten() {
            write!(f, "/{part}")?;
        }
        Ok(())
    }
}

/// `benchmark.json`: the id and, where the bench set one, the bytes per iteration.
#[derive(Debug, Deserialize)]
struct BenchmarkFile {
    #[serde(flatten)]
    id: BenchId,
    /// `{"Bytes": 64}`, `{"BytesDecimal": 64}` or `{"Elements": 1}`; kept loose so a new kind is not an error.
    #[serde(default)]
    throughput: Option<serde_json::Value>,
}

/// One benchmark's saved result.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    pub id: BenchId,
    /// Bytes processed per iteration, when the bench declared a byte throughput.
    pub bytes: Option<u64>,
    pub estimates: Estimates,
}

pub fn parse_estimates(json: &str) -> Result<Estimates, serde_json::Error> {
    serde_json::from_str(json)
}

/// Every benchmark under `dir` with a saved `baseline` (`new` is the last run), sorted by id.
pub fn load(dir: &Path, baseline: &str) -> Result<Vec<Measurement>, Error> {
    if !dir.is_dir() {
        return Err(Error::NoCriterionDir(dir.to_path_buf()));
    }
    let mut found = Vec::new();
    walk(dir, dir, baseline, &mut found)?;
    if found.is_empty() {
        return Err(Error::NoBaseline {
            dir: dir.to_path_buf(),
            baseline: baseline.to_string(),
        });
    }
    found.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(found)
}

/// Each benchmark's fastest result among several runs, by `statistic`. On a shared machine other work only adds
/// time, so the fastest of a few runs is the closest to the uncontended cost.
pub fn fastest_of(runs: Vec<Vec<Measurement>>, statistic: Statistic) -> Vec<Measurement> {
    let mut fastest: BTreeMap<BenchId, Measurement> = BTreeMap::new();
    for m in runs.into_iter().flatten() {
        let time = m.estimates.get(statistic).point_estimate;
        match fastest.get(&m.id) {
            Some(best) if best.estimates.get(statistic).point_estimate <= time => {}
            _ => {
                fastest.insert(m.id.clone(), m);
            }
        }
    }
    fastest.into_values().collect()
}

fn walk(
    root: &Path,
    dir: &Path,
    baseline: &str,
    found: &mut Vec<Measurement>,
) -> Result<(), Error> {
    let saved = dir.join(baseline);
    if saved.join("estimates.json").is_file() {
        found.push(read_saved(root, dir, &saved)?);
        return Ok(());
    }
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut subdirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        // criterion's HTML reports live in `report` directories; they hold no estimates
        .filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n != "report"))
        .collect();
    subdirs.sort();
    for sub in subdirs {
        walk(root, &sub, baseline, found)?;
    }
    Ok(())
}

fn read_saved(root: &Path, bench_dir: &Path, saved: &Path) -> Result<Measurement, Error> {
    let path = saved.join("estimates.json");
    let text = read(&path)?;
    let estimates = parse_estimates(&text).map_err(|source| Error::Json { path, source })?;
    let benchmark = saved.join("benchmark.json");
    let (id, bytes) = if benchmark.is_file() {
        let text = read(&benchmark)?;
        let file: BenchmarkFile = serde_json::from_str(&text).map_err(|source| Error::Json {
            path: benchmark,
            source,
        })?;
        let bytes = file.throughput.as_ref().and_then(|t| {
            t.get("Bytes")
                .or_else(|| t.get("BytesDecimal"))
                .and_then(serde_json::Value::as_u64)
        });
        (file.id, bytes)
    } else {
        (id_from_path(root, bench_dir), None)
    };
    Ok(Measurement {
        id,
        bytes,
        estimates,
    })
}

/// Without `benchmark.json` the directories are the id (with `/` in a group turned into `_` by criterion).
fn id_from_path(root: &Path, bench_dir: &Path) -> BenchId {
    let rel = bench_dir.strip_prefix(root).unwrap_or(bench_dir);
    let mut parts = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    BenchId {
        group: parts.next().unwrap_or_default(),
        function: parts.next(),
        value: parts.next(),
    }
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trimmed `estimates.json` as criterion 0.5 writes it (nanoseconds).
    const ESTIMATES: &str = r#"{
        "mean":{"confidence_interval":{"confidence_level":0.95,"lower_bound":33010.5,"upper_bound":33420.1},
                "point_estimate":33205.2,"standard_error":104.3},
        "median":{"confidence_interval":{"confidence_level":0.95,"lower_bound":32950.0,"upper_bound":33100.9},
                  "point_estimate":33021.7,"standard_error":40.2},
        "median_abs_dev":{"confidence_interval":{"confidence_level":0.95,"lower_bound":80.1,"upper_bound":190.5},
                          "point_estimate":120.3,"standard_error":28.0},
        "slope":null,
        "std_dev":{"confidence_interval":{"confidence_level":0.95,"lower_bound":300.2,"upper_bound":820.7},
                   "point_estimate":560.1,"standard_error":131.9}
    }"#;

    const BENCHMARK: &str = r#"{"group_id":"hpke/seal","function_id":"aes128gcm","value_str":"1024",
        "throughput":{"Bytes":1024},"full_id":"hpke/seal/aes128gcm/1024",
        "directory_name":"hpke_seal/aes128gcm/1024","title":"hpke/seal/aes128gcm/1024"}"#;

    #[test]
    fn parses_the_point_estimates_and_intervals() {
        let e = parse_estimates(ESTIMATES).unwrap();
        assert_eq!(e.median.point_estimate, 33021.7);
        assert_eq!(
            e.get(Statistic::Mean).confidence_interval.upper_bound,
            33420.1
        );
        assert_eq!(e.median.confidence_interval.confidence_level, 0.95);
    }

    #[test]
    fn intervals_overlap_when_they_share_a_point() {
        let ci = |lower_bound, upper_bound| ConfidenceInterval {
            confidence_level: 0.95,
            lower_bound,
            upper_bound,
        };
        assert!(ci(1.0, 2.0).overlaps(&ci(2.0, 3.0)));
        assert!(ci(1.0, 5.0).overlaps(&ci(2.0, 3.0)));
        assert!(!ci(1.0, 2.0).overlaps(&ci(2.1, 3.0)));
    }

    #[test]
    fn loads_a_baseline_from_a_criterion_tree() {
        let dir = tempfile::tempdir().unwrap();
        let with_json = dir.path().join("hpke_seal/aes128gcm/1024/main");
        std::fs::create_dir_all(&with_json).unwrap();
        std::fs::write(with_json.join("estimates.json"), ESTIMATES).unwrap();
        std::fs::write(with_json.join("benchmark.json"), BENCHMARK).unwrap();
        let bare = dir.path().join("p256_ecdh/openssl/main");
        std::fs::create_dir_all(&bare).unwrap();
        std::fs::write(bare.join("estimates.json"), ESTIMATES).unwrap();
        std::fs::create_dir_all(dir.path().join("p256_ecdh/report")).unwrap();

        let found = load(dir.path(), "main").unwrap();
        let ids: Vec<String> = found.iter().map(|m| m.id.to_string()).collect();
        assert_eq!(ids, ["hpke/seal/aes128gcm/1024", "p256_ecdh/openssl"]);
        assert_eq!(found[0].bytes, Some(1024));

        assert!(matches!(
            load(dir.path(), "other"),
            Err(Error::NoBaseline { .. })
        ));
        assert!(matches!(
            load(&dir.path().join("missing"), "main"),
            Err(Error::NoCriterionDir(_))
        ));
    }

    #[test]
    fn the_fastest_of_several_runs_is_kept_per_benchmark() {
        let at = |group: &str, ns: f64| {
            let mut e = parse_estimates(ESTIMATES).unwrap();
            e.median.point_estimate = ns;
            Measurement {
                id: BenchId {
                    group: group.into(),
                    function: None,
                    value: None,
                },
                bytes: None,
                estimates: e,
            }
        };
        let fastest = fastest_of(
            vec![
                vec![at("a", 5.0), at("b", 1.0)],
                vec![at("a", 3.0), at("c", 2.0)],
            ],
            Statistic::Median,
        );
        let got: Vec<(&str, f64)> = fastest
            .iter()
            .map(|m| (m.id.group.as_str(), m.estimates.median.point_estimate))
            .collect();
        assert_eq!(got, [("a", 3.0), ("b", 1.0), ("c", 2.0)]);
    }

    #[test]
    fn a_broken_file_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let saved = dir.path().join("g/f/new");
        std::fs::create_dir_all(&saved).unwrap();
        std::fs::write(saved.join("estimates.json"), "{\"mean\":").unwrap();
        let err = load(dir.path(), "new").unwrap_err();
        assert!(err.to_string().starts_with("cannot parse"), "{err}");
    }
}
