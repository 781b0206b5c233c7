//! The [`Workload`] trait: what a workload is, so that adding one is one file and one line in [`crate::ALL`].
//!
//! A workload states, as data, its name, what it needs from a transport, the metrics it records (with units), the
//! columns of its table and the metric a same-run ratio is taken of ([`Info`]); it gives the parameter cases of
//! each profile as its own serde type; and it runs one case against one transport in a [`Run`], which owns the
//! directories, the server process, the fleet and the clean-up (see [`crate::harness`]).
//!
//! [`AnyWorkload`] is the same thing with the parameters as JSON, so the runner can hold every workload in one list.

use crate::harness::{Profile, Run, WorkloadError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use transport_core::{BoxFuture, Need};

/// One metric a workload records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    /// Its key in results.
    pub key: &'static str,
    /// Its unit (`orders/s`, `ms`, `count`, ...).
    pub unit: &'static str,
    /// What it means, in one line.
    pub about: &'static str,
}

/// How a table column summarises the rounds of one transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Median (min-max) of rounds, as integers with thousands separators.
    Count,
    /// Median (min-max) of rounds, two decimals.
    Decimal,
    /// Every round's value, as integers, in round order (the seeds' "three rounds" column).
    Rounds,
    /// The sum over rounds (hard invariants: lost, duplicates).
    Sum,
}

/// One column of a workload's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// The header.
    pub header: &'static str,
    /// The metric it shows.
    pub metric: &'static str,
    /// How the rounds are summarised.
    pub format: Format,
    /// Which way is better; `None` for a setting or a figure that is neither (`workers`, `orders made`).
    /// `runner compare` judges a change by it and `runner export` files the metric under it.
    pub better: Option<Better>,
}

impl Column {
    /// A column whose metric is neither better larger nor smaller.
    pub const fn new(header: &'static str, metric: &'static str, format: Format) -> Column {
        Column {
            header,
            metric,
            format,
            better: None,
        }
    }

    /// The same column, a larger value better (a rate).
    pub const fn higher(self) -> Column {
        Column {
            better: Some(Better::Higher),
            ..self
        }
    }

    /// The same column, a smaller value better (a latency, a cost, a loss).
    pub const fn lower(self) -> Column {
        Column {
            better: Some(Better::Lower),
            ..self
        }
    }
}

/// Whether a larger value of a metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Larger is better (a rate).
    Higher,
    /// Smaller is better (a latency, a cost).
    Lower,
}

/// A table with one row per value of a swept parameter and, per transport, a few columns side by side (seed 095's
/// M4 layout: one row per RTT, a p50 and a round-trip column per transport).
#[derive(Debug, Clone, Copy)]
pub struct Sweep {
    /// The swept parameter.
    pub key: &'static str,
    /// Its header.
    pub header: &'static str,
    /// Columns shown once per row, whatever the transport (medians over every transport and round).
    pub shared: &'static [Column],
    /// Columns shown per transport (their headers prefixed with the transport).
    pub per_transport: &'static [Column],
}

/// What a workload is, as data.
#[derive(Debug, Clone, Copy)]
pub struct Info {
    /// The name on the command line and in results.
    pub name: &'static str,
    /// One line on what happens.
    pub about: &'static str,
    /// What it needs from a transport; a transport that cannot meet them gets "n/a" and its reason.
    pub needs: &'static [Need],
    /// Every metric it records.
    pub metrics: &'static [Metric],
    /// The columns of its table.
    pub columns: &'static [Column],
    /// The metric same-run ratios are taken of, and which way is better.
    pub primary: (&'static str, Better),
    /// The parameters that tell its cases apart (a table per distinct value, e.g. `rtt_ms`).
    pub case_keys: &'static [&'static str],
    /// Instead of a table per case, one table with a row per value of a swept parameter.
    pub sweep: Option<Sweep>,
}

impl Info {
    /// Which way `metric` is better: the primary metric's direction, else that of a column (or sweep column) that
    /// shows it; `None` when no column says.
    pub fn better(&self, metric: &str) -> Option<Better> {
        if self.primary.0 == metric {
            return Some(self.primary.1);
        }
        let sweep = self
            .sweep
            .iter()
            .flat_map(|s| s.shared.iter().chain(s.per_transport));
        self.columns
            .iter()
            .chain(sweep)
            .filter(|c| c.metric == metric)
            .find_map(|c| c.better)
    }

    /// The metrics with a direction, in column order, each once (the primary first).
    pub fn judged(&self) -> Vec<(&'static str, Better)> {
        let mut out = vec![self.primary];
        let sweep = self
            .sweep
            .iter()
            .flat_map(|s| s.shared.iter().chain(s.per_transport));
        for c in self.columns.iter().chain(sweep) {
            if let Some(b) = c.better {
                if !out.iter().any(|(m, _)| *m == c.metric) {
                    out.push((c.metric, b));
                }
            }
        }
        out
    }
}

/// A workload with typed parameters.
pub trait Workload: Send + Sync + 'static {
    /// The parameters of one case.
    type Params: Serialize + DeserializeOwned + Clone + PartialEq + Send + Sync + std::fmt::Debug;

    /// What it is.
    fn info(&self) -> &'static Info;

    /// The cases a profile runs: one for most workloads, one per setting for a sweep (RTTs, worker counts).
    fn cases(&self, profile: Profile) -> Vec<Self::Params>;

    /// Check a case before anything runs (a bad override is reported before the first run).
    fn check(&self, params: &Self::Params) -> Result<(), String> {
        let _ = params;
        Ok(())
    }

    /// Run one case against the run's transport, recording metrics into the run.
    fn run<'a>(
        &'a self,
        run: &'a mut Run<'_>,
        params: &'a Self::Params,
    ) -> BoxFuture<'a, Result<(), WorkloadError>>;
}

/// A workload with its parameters as JSON: what the runner holds in its one list.
pub trait AnyWorkload: Send + Sync {
    /// What it is.
    fn info(&self) -> &'static Info;

    /// The cases of a profile with `overrides` (`KEY=VALUE`, or `KEY=V1,V2,...` to sweep a key) applied, checked,
    /// without duplicates. An override naming a key this workload does not have is ignored here (the runner
    /// reports a key that fits no chosen workload).
    fn cases(
        &self,
        profile: Profile,
        overrides: &[String],
    ) -> Result<Vec<serde_json::Value>, String>;

    /// The keys of its parameters.
    fn param_keys(&self) -> Vec<String>;

    /// Run one case.
    fn run_json<'a>(
        &'a self,
        run: &'a mut Run<'_>,
        params: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<(), WorkloadError>>;
}

impl<W: Workload> AnyWorkload for W {
    fn info(&self) -> &'static Info {
        Workload::info(self)
    }

    fn cases(
        &self,
        profile: Profile,
        overrides: &[String],
    ) -> Result<Vec<serde_json::Value>, String> {
        let mut out: Vec<W::Params> = Vec::new();
        for base in Workload::cases(self, profile) {
            for case in crate::params::apply(&base, overrides)? {
                self.check(&case)
                    .map_err(|e| format!("{}: {e}", self.info().name))?;
                if !out.contains(&case) {
                    out.push(case);
                }
            }
        }
        out.iter()
            .map(|p| serde_json::to_value(p).map_err(|e| e.to_string()))
            .collect()
    }

    fn param_keys(&self) -> Vec<String> {
        Workload::cases(self, Profile::Quick)
            .first()
            .and_then(|p| serde_json::to_value(p).ok())
            .and_then(|v| v.as_object().map(|o| o.keys().cloned().collect()))
            .unwrap_or_default()
    }

    fn run_json<'a>(
        &'a self,
        run: &'a mut Run<'_>,
        params: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<(), WorkloadError>> {
        Box::pin(async move {
            let p: W::Params = serde_json::from_value(params.clone())
                .map_err(|e| WorkloadError::Params(e.to_string()))?;
            self.run(run, &p).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directions_agree_within_each_workload() {
        for w in crate::ALL {
            let info = w.info();
            assert_eq!(
                info.better(info.primary.0),
                Some(info.primary.1),
                "{}",
                info.name
            );
            let sweep = info
                .sweep
                .iter()
                .flat_map(|s| s.shared.iter().chain(s.per_transport));
            for c in info.columns.iter().chain(sweep) {
                if let Some(b) = c.better {
                    assert_eq!(info.better(c.metric), Some(b), "{} {}", info.name, c.metric);
                }
            }
            let judged = info.judged();
            assert_eq!(judged[0], info.primary, "{}", info.name);
            let mut metrics: Vec<&str> = judged.iter().map(|(m, _)| *m).collect();
            metrics.sort_unstable();
            metrics.dedup();
            assert_eq!(
                metrics.len(),
                judged.len(),
                "{}: each metric once",
                info.name
            );
        }
    }

    #[test]
    fn a_setting_has_no_direction() {
        let info = crate::by_name("handshake-rate").unwrap().info();
        assert_eq!(info.better("workers"), None);
        assert_eq!(info.better("conn_per_s"), Some(Better::Higher));
        assert_eq!(info.better("stored_p50_ms"), Some(Better::Lower));
        assert_eq!(info.better("no_such_metric"), None);
    }
}
