//! Durability on record: what the store of a run was configured to do and what it did, in every result.
//!
//! A server's control line reports its store's statistics, the filesystem the store is on, the time of every
//! `fdatasync` (an HDR histogram in µs, recorded on the store's writer thread) and the reason the store failed if it
//! did. A run may have several server processes (a restart kills one and starts another on the same store): each
//! one's latest statistics are summed into one [`Durability`] and one histogram `store_fsync`. For a server killed
//! with SIGKILL, the latest statistics are those read just before the kill.

use crate::harness::WorkloadError;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use transport_core::CounterSnapshot;
use transport_store::StoreStats;

/// The store of one run: its settings and, summed over the run's server processes, what it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Durability {
    /// The sync policy (`none`, `batch`, `each`).
    pub sync: String,
    /// Threads of the server's runtime.
    pub server_threads: usize,
    /// The filesystem the store is on (`ext4`, `xfs`, `tmpfs`, `overlay`, ...; `statfs` f_type).
    pub store_fs: String,
    /// `fdatasync` calls.
    pub syncs: u64,
    /// Groups committed.
    pub groups: u64,
    /// Orders written.
    pub applied: u64,
    /// Server processes whose statistics are summed (2 after a restart).
    pub server_processes: u32,
    /// Syncs of the server's own state beside the store (the MQTT broker's persistent sessions; histogram
    /// `state_fsync`); 0 for a server that keeps none.
    pub state_syncs: u64,
}

impl Durability {
    /// Whether the store synced on a memory filesystem, where a sync is free and the numbers say nothing about
    /// durability.
    pub fn volatile_sync(&self) -> bool {
        self.sync != "none" && transport_store::fs::is_volatile(&self.store_fs)
    }
}

/// What a server reports on its control line.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ServerStats {
    /// Its counters.
    pub counters: CounterSnapshot,
    /// What its store has done.
    pub store: StoreStats,
    /// Its CPU seconds (getrusage: every thread, microsecond resolution).
    pub cpu_s: f64,
    /// The filesystem its store is on.
    pub store_fs: String,
    /// Every `fdatasync`'s time, HDR histogram in µs (V2, base64).
    pub fsync_us: String,
    /// Why its store failed, if it did.
    #[serde(default)]
    pub store_failed: Option<String>,
    /// Every sync of the server's own state (the MQTT broker's session files), as `fsync_us`; empty from servers
    /// that predate it.
    #[serde(default)]
    pub state_fsync_us: String,
}

impl ServerStats {
    /// Read a control-line answer: an error if the server reports one or its store failed, or if it is not the
    /// statistics.
    pub fn parse(value: &serde_json::Value) -> Result<ServerStats, WorkloadError> {
        if let Some(e) = value.get("error") {
            let e = e.as_str().map_or_else(|| e.to_string(), str::to_string);
            return Err(WorkloadError::Server(e));
        }
        let stats: ServerStats = serde_json::from_value(value.clone())
            .map_err(|e| WorkloadError::Stats(format!("{e} in {}", quote(value))))?;
        if let Some(reason) = &stats.store_failed {
            return Err(WorkloadError::StoreFailed(reason.clone()));
        }
        Ok(stats)
    }

    /// The fsync histogram.
    pub fn fsync_histogram(&self) -> Result<Histogram<u64>, WorkloadError> {
        crate::hist::decode(&self.fsync_us)
            .map_err(|e| WorkloadError::Stats(format!("fsync_us: {e}")))
    }

    /// The histogram of the server's own state's syncs (empty where it reported none).
    pub fn state_fsync_histogram(&self) -> Result<Histogram<u64>, WorkloadError> {
        if self.state_fsync_us.is_empty() {
            return Ok(crate::hist::new());
        }
        crate::hist::decode(&self.state_fsync_us)
            .map_err(|e| WorkloadError::Stats(format!("state_fsync_us: {e}")))
    }
}

/// What [`summarize`] makes of a run's servers.
#[derive(Debug)]
pub struct Summary {
    /// The store's settings and what it did.
    pub durability: Durability,
    /// Every fsync of the store.
    pub fsync: Histogram<u64>,
    /// Every sync of the servers' own state (empty for most servers).
    pub state_fsync: Histogram<u64>,
}

fn quote(value: &serde_json::Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

/// Sum the latest statistics of each server process of a run (`lasts`, in order) into the run's durability and
/// fsync histograms. `None` when no server reported any (a run that never started one).
pub fn summarize(
    sync: &str,
    server_threads: usize,
    lasts: &[ServerStats],
) -> Result<Option<Summary>, WorkloadError> {
    let Some(first) = lasts.first() else {
        return Ok(None);
    };
    let mut d = Durability {
        sync: sync.to_string(),
        server_threads,
        store_fs: first.store_fs.clone(),
        ..Durability::default()
    };
    let mut fsync = crate::hist::new();
    let mut state_fsync = crate::hist::new();
    for s in lasts {
        d.syncs += s.store.syncs;
        d.groups += s.store.groups;
        d.applied += s.store.applied;
        d.server_processes += 1;
        fsync
            .add(s.fsync_histogram()?)
            .map_err(|e| WorkloadError::Stats(format!("fsync_us: {e}")))?;
        state_fsync
            .add(s.state_fsync_histogram()?)
            .map_err(|e| WorkloadError::Stats(format!("state_fsync_us: {e}")))?;
    }
    d.state_syncs = state_fsync.len();
    Ok(Some(Summary {
        durability: d,
        fsync,
        state_fsync,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(syncs: u64, fsync: &[u64]) -> serde_json::Value {
        let mut h = crate::hist::new();
        for &us in fsync {
            h.record(us).unwrap();
        }
        serde_json::json!({
            "counters": CounterSnapshot::default(),
            "store": StoreStats { syncs, groups: syncs, ..StoreStats::default() },
            "cpu_s": 0.5,
            "store_fs": "tmpfs",
            "fsync_us": crate::hist::encode(&h),
            "store_failed": null,
        })
    }

    #[test]
    fn servers_are_summed() {
        let a = ServerStats::parse(&line(2, &[100, 300])).unwrap();
        let mut state = crate::hist::new();
        state.record(700).unwrap();
        let mut with_state = line(1, &[5000]);
        with_state["state_fsync_us"] = crate::hist::encode(&state).into();
        let b = ServerStats::parse(&with_state).unwrap();
        let s = summarize("batch", 1, &[a, b]).unwrap().unwrap();
        let d = &s.durability;
        assert_eq!((d.syncs, d.groups, d.server_processes), (3, 3, 2));
        assert_eq!(s.fsync.len(), 3);
        assert_eq!(
            (d.state_syncs, s.state_fsync.len()),
            (1, 1),
            "one server had state"
        );
        assert_eq!(s.state_fsync.max(), s.state_fsync.highest_equivalent(700));
        assert!(d.volatile_sync(), "batch sync on tmpfs");
        assert!(summarize("batch", 1, &[]).unwrap().is_none());
    }

    #[test]
    fn a_broken_state_histogram_is_an_error_not_a_zero() {
        let mut broken = line(1, &[100]);
        broken["state_fsync_us"] = "not base64".into();
        let s = ServerStats::parse(&broken).unwrap();
        assert!(summarize("batch", 1, &[s]).is_err());
    }

    #[test]
    fn errors_and_failures_are_errors() {
        let e = ServerStats::parse(&serde_json::json!({"error": "getrusage: boom"})).unwrap_err();
        assert!(
            matches!(e, WorkloadError::Server(ref m) if m.contains("boom")),
            "{e}"
        );
        let mut failed = line(0, &[]);
        failed["store_failed"] = "i/o on orders.log: File too large".into();
        let e = ServerStats::parse(&failed).unwrap_err();
        assert!(matches!(e, WorkloadError::StoreFailed(_)), "{e}");
        let e = ServerStats::parse(&serde_json::json!({"broken": 1})).unwrap_err();
        assert!(matches!(e, WorkloadError::Stats(_)), "{e}");
    }
}
