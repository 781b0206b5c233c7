//! The runner's side of the adversary: one [`Hostile`] beside one run.
//!
//! - **Enrolment**: the run's identity is prepared for one device more than the workload has; that last device
//!   becomes the adversary's own ([`super::enroll`]).
//! - **Start**: with the server's first start, `runner adversary` is started as a child process like the servers
//!   ([`crate::process`]: it never outlives the runner). It keeps running across the server's restarts (the same
//!   port), so its replays reach the restarted server.
//! - **The server's counters over the whole run**: each server start's counters are read before it is killed and at
//!   the end, and summed (`hostile_server_*`); the adversary's own count covers the whole run too (`adversary_*`).
//! - **The end**: the adversary is made quiet (it stops sending and holds its half-open connections), the server is
//!   given time to give up on those ([`Hostile::settle`]), then must answer its control line: `server_answered_end`.
//! - **The audit**: the adversary's own orders (its sender id) are taken out of the log before the audit and counted
//!   apart (`adversary_own_applied`); so is anything applied under another device's name in a sender run the
//!   adversary used for forgeries (`adversary_forged_applied`, which only an unauthenticated transport can have).
//!   Whatever else is in the log and was not made by an honest device stays in the audit's `unknown`.

use super::enroll::{self, Own};
use super::{family, Family, Report, QUIET};
use crate::harness::{ServerStats, WorkloadError};
use crate::process::ServerProcess;
use crate::result::RunResult;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use transport_core::CounterSnapshot;
use transport_store::LogEntry;

/// Datagrams, records and packets per second the adversary sends over all its cheap kinds.
pub const RATE: f64 = 500.0;
/// Connections (handshakes) per second it opens over all its kinds that open one.
pub const CONNECT_RATE: f64 = 30.0;
/// How long the servers take at most to give up on a half-open connection (quinn's and s2n-quic's handshake
/// timeout, the broker's connect timeout), and a second more.
pub const HALF_OPEN_SETTLE: Duration = Duration::from_secs(11);
/// How long its last datagrams are given to be read, where nothing is held open.
pub const DATAGRAM_SETTLE: Duration = Duration::from_millis(500);

/// The adversary beside one run.
pub struct Hostile {
    spec: String,
    dir: PathBuf,
    own: Own,
    process: Option<ServerProcess>,
    report: Report,
    /// The server's counters, summed over its starts.
    server: CounterSnapshot,
    /// Orders the server's store found already applied, summed over its starts (replays and re-sends).
    already_applied: u64,
    answered_end: Option<bool>,
    own_applied: u64,
    forged_applied: u64,
}

impl Hostile {
    /// Enrol the last device of the run's identity `identity` as the adversary's, in its own directory `dir`.
    pub fn enroll(spec: &str, identity: &Path, dir: &Path) -> Result<Hostile, WorkloadError> {
        let own = enroll::enroll(spec, identity, dir).map_err(adversary_err)?;
        Ok(Hostile {
            spec: spec.to_string(),
            dir: dir.to_path_buf(),
            own,
            process: None,
            report: Report::default(),
            server: CounterSnapshot::default(),
            already_applied: 0,
            answered_end: None,
            own_applied: 0,
            forged_applied: 0,
        })
    }

    /// Whether there is an adversary for the transport `spec`.
    pub fn supported(spec: &str) -> bool {
        family(spec).is_ok()
    }

    /// Start the adversary against `target` (`runner adversary`), unless it runs already.
    pub async fn start(&mut self, runner: &Path, target: SocketAddr) -> Result<(), WorkloadError> {
        if self.process.is_some() {
            return Ok(());
        }
        let mut cmd = tokio::process::Command::new(runner);
        cmd.arg("adversary")
            .arg("--transport")
            .arg(&self.spec)
            .arg("--target")
            .arg(target.to_string())
            .arg("--identity")
            .arg(&self.dir)
            .arg("--rate")
            .arg(RATE.to_string())
            .arg("--connect-rate")
            .arg(CONNECT_RATE.to_string());
        self.process = Some(ServerProcess::start(cmd, Duration::from_secs(30)).await?);
        Ok(())
    }

    /// The counters of a server start that is about to end (killed, or at the end of the run).
    pub fn server_ending(&mut self, stats: &ServerStats) {
        for (name, value) in stats.counters.entries() {
            add_counter(&mut self.server, name, value);
        }
        self.already_applied += stats.store.already_applied;
    }

    /// Whether the server answered its control line at the end.
    pub fn answered_end(&mut self, answered: bool) {
        self.answered_end = Some(answered);
    }

    /// How long the server is given, after the adversary goes quiet, before it must answer at the end.
    pub fn settle(&self) -> Duration {
        match family(&self.spec) {
            Ok(Family::Pure(_)) => DATAGRAM_SETTLE,
            _ => HALF_OPEN_SETTLE,
        }
    }

    /// Stop sending (the adversary holds its half-open connections) and read its final report.
    pub async fn quiet(&mut self) -> Result<(), WorkloadError> {
        let Some(p) = self.process.as_mut() else {
            return Ok(());
        };
        let value = p.request_within(QUIET, Duration::from_secs(10)).await?;
        self.report = serde_json::from_value(value.clone())
            .map_err(|e| WorkloadError::Stats(format!("adversary report: {e} in {value}")))?;
        Ok(())
    }

    /// End the adversary's process (its report is read first if it has not gone quiet).
    pub async fn stop(&mut self) -> Result<(), WorkloadError> {
        if self.process.is_some() && self.report == Report::default() {
            self.quiet().await?;
        }
        if let Some(mut p) = self.process.take() {
            p.shutdown().await?;
        }
        Ok(())
    }

    /// Take the adversary's orders out of the log's entries, counting them apart: its own (its sender id), and those
    /// applied under another device's name in one of its forging runs. Call after [`Hostile::quiet`].
    pub fn split(&mut self, entries: Vec<LogEntry>) -> Vec<LogEntry> {
        let forged: HashSet<u64> = self.report.forged_runs.iter().copied().collect();
        let (mut own, mut forgeries) = (HashSet::new(), HashSet::new());
        let honest = entries
            .into_iter()
            .filter(|e| {
                if e.id.sender == self.own.sender {
                    own.insert(e.id);
                    false
                } else if forged.contains(&e.id.run) {
                    forgeries.insert(e.id);
                    false
                } else {
                    true
                }
            })
            .collect();
        self.own_applied = own.len() as u64;
        self.forged_applied = forgeries.len() as u64;
        honest
    }

    /// Record what the adversary sent and what the server counted into `result`.
    pub fn record(&self, result: &mut RunResult) {
        let mut put = |key: String, value: serde_json::Value| {
            result.metrics.insert(key, value);
        };
        for (kind, n) in &self.report.sent {
            put(format!("adversary_{kind}"), (*n).into());
        }
        put("adversary_sent".into(), self.report.total().into());
        put("adversary_answered".into(), self.report.answered.into());
        put("adversary_own_applied".into(), self.own_applied.into());
        put(
            "adversary_forged_applied".into(),
            self.forged_applied.into(),
        );
        put("adversary_device".into(), self.own.device.into());
        if let Some(cpu) = self.report.cpu_s {
            put("adversary_cpu_s".into(), cpu.into());
        }
        put(
            "adversary_notes".into(),
            serde_json::json!(self.report.notes),
        );
        for (name, value) in self.server.entries() {
            put(format!("hostile_server_{name}"), value.into());
        }
        put(
            "hostile_server_refused".into(),
            self.server.refused().into(),
        );
        put(
            "hostile_server_already_applied".into(),
            self.already_applied.into(),
        );
        if let Some(answered) = self.answered_end {
            put("server_answered_end".into(), u64::from(answered).into());
        }
    }
}

fn adversary_err(e: super::AdversaryError) -> WorkloadError {
    WorkloadError::Params(format!("adversary: {e}"))
}

/// Add `value` to the counter `name` of `sum` (a snapshot has no setter by name; through its serde form).
fn add_counter(sum: &mut CounterSnapshot, name: &str, value: u64) {
    let mut map = serde_json::to_value(*sum).expect("counters serialize");
    if let Some(v) = map.get_mut(name) {
        *v = (v.as_u64().unwrap_or(0) + value).into();
    }
    *sum = serde_json::from_value(map).expect("counters deserialize");
}

#[cfg(test)]
mod tests {
    use super::*;
    use transport_core::{OrderId, Transport};

    fn entry(sender: u64, run: u64, seq: u64) -> LogEntry {
        LogEntry {
            id: OrderId { sender, run, seq },
            made_us: 0,
            stored_us: 0,
            payload_len: 0,
        }
    }

    #[test]
    fn its_own_and_its_forged_orders_are_counted_apart() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        transport_pure::variant("pure:plain")
            .unwrap()
            .prepare(&run, 3)
            .unwrap();
        let mut h = Hostile::enroll("pure:plain", &run, &dir.path().join("adv")).unwrap();
        assert_eq!(h.own.sender, 2);
        h.report.forged_runs = vec![99];
        let entries = vec![
            entry(0, 5, 0),  // honest
            entry(2, 7, 0),  // its own
            entry(2, 7, 0),  // its own again (a duplicate stays a duplicate of nothing honest)
            entry(1, 99, 3), // applied in device 1's name in a forging run
            entry(1, 42, 0), // neither: stays, and the audit calls it unknown
        ];
        let honest = h.split(entries);
        assert_eq!(honest, [entry(0, 5, 0), entry(1, 42, 0)]);
        assert_eq!((h.own_applied, h.forged_applied), (1, 1));
        let mut r = RunResult {
            schema: crate::result::SCHEMA,
            workload: "restart".into(),
            transport: "pure:plain".into(),
            round: 0,
            params: serde_json::json!({}),
            metrics: Default::default(),
            histograms: Default::default(),
            provenance: Default::default(),
            skipped: None,
            durability: None,
            error: None,
        };
        h.server_ending(&ServerStats {
            counters: CounterSnapshot {
                refused_forged: 2,
                ..Default::default()
            },
            ..ServerStats::default()
        });
        h.server_ending(&ServerStats {
            counters: CounterSnapshot {
                refused_forged: 3,
                ..Default::default()
            },
            ..ServerStats::default()
        });
        h.record(&mut r);
        assert_eq!(r.metric("hostile_server_refused_forged"), Some(5.0));
        assert_eq!(r.metric("adversary_forged_applied"), Some(1.0));
    }
}
