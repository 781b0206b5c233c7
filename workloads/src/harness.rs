//! What every workload needs around a transport: directories for a run, the server process, the fleet of
//! devices, the events they report, and the provenance of the numbers.

use crate::result::{Provenance, RunResult, SCHEMA};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use transport_core::process::{ProcessError, ServerProcess};
use transport_core::{
    CounterSnapshot, Counters, Fleet, FleetConfig, LinkEvent, SyncPolicy, Transport,
};

/// Errors a workload returns.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The transport failed.
    #[error("{0}")]
    Transport(#[from] transport_core::TransportError),
    /// The server process could not be started or controlled.
    #[error("server process: {0}")]
    Process(#[from] ProcessError),
    /// The store's log could not be audited.
    #[error("store audit: {0}")]
    Store(#[from] transport_core::StoreError),
    /// A file or socket operation failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The run did not finish in time.
    #[error("{0}")]
    Timeout(String),
}

/// The size of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// CI-sized: seconds per run.
    Quick,
    /// The seed's parameters.
    Seed,
}

impl Profile {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Quick => "quick",
            Profile::Seed => "seed",
        }
    }
}

impl std::str::FromStr for Profile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "quick" => Ok(Profile::Quick),
            "seed" => Ok(Profile::Seed),
            _ => Err(format!("unknown profile `{s}` (choose from: quick, seed)")),
        }
    }
}

/// Settings shared by every run of one `runner` invocation.
#[derive(Clone)]
pub struct Harness {
    /// The `runner` binary, which serves a transport with `runner serve`.
    pub runner: PathBuf,
    /// Where each run gets its identity and store directories.
    pub work_dir: PathBuf,
    /// Threads of the server's runtime, the same for every transport.
    pub server_threads: usize,
    /// The store's sync policy.
    pub sync: SyncPolicy,
    /// The size of the runs.
    pub profile: Profile,
    /// Recorded in every result.
    pub provenance: Provenance,
    /// Progress lines (the runner prints them on stderr).
    pub progress: Arc<dyn Fn(&str) + Send + Sync>,
}

/// The directories of one run.
#[derive(Debug, Clone)]
pub struct RunDirs {
    /// Keys, certificates and allow-lists the transport prepared.
    pub identity: PathBuf,
    /// The server's store.
    pub store: PathBuf,
}

impl Harness {
    /// Say what is happening.
    pub fn say(&self, line: &str) {
        (self.progress)(line)
    }

    /// Fresh directories for one run, named after it.
    pub fn dirs(&self, workload: &str, spec: &str, round: u32) -> Result<RunDirs, WorkloadError> {
        let base = self.work_dir.join(format!(
            "{workload}-{}-r{round}",
            spec.replace([':', '@', '/'], "_")
        ));
        if base.exists() {
            std::fs::remove_dir_all(&base)?;
        }
        let dirs = RunDirs {
            identity: base.join("identity"),
            store: base.join("store"),
        };
        std::fs::create_dir_all(&dirs.identity)?;
        Ok(dirs)
    }

    /// The command that serves `spec` (a restart passes the port the first start got).
    pub fn server_command(
        &self,
        spec: &str,
        listen: SocketAddr,
        dirs: &RunDirs,
    ) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.runner);
        cmd.arg("serve")
            .arg("--transport")
            .arg(spec)
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--identity")
            .arg(&dirs.identity)
            .arg("--store")
            .arg(&dirs.store)
            .arg("--sync")
            .arg(self.sync.to_string())
            .arg("--server-threads")
            .arg(self.server_threads.to_string());
        cmd
    }

    /// Start a server and wait until it is ready.
    pub async fn start_server(
        &self,
        spec: &str,
        listen: SocketAddr,
        dirs: &RunDirs,
    ) -> Result<ServerProcess, WorkloadError> {
        Ok(ServerProcess::start(
            self.server_command(spec, listen, dirs),
            Duration::from_secs(30),
        )
        .await?)
    }

    /// Create the devices' links, reporting into a new channel.
    pub async fn fleet(
        &self,
        transport: &dyn Transport,
        server: SocketAddr,
        dirs: &RunDirs,
        devices: u32,
    ) -> Result<FleetHandle, WorkloadError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let fleet = transport
            .fleet(FleetConfig {
                server,
                identity: dirs.identity.clone(),
                devices,
                events: tx,
                counters: counters.clone(),
            })
            .await?;
        Ok(FleetHandle {
            fleet: Arc::from(fleet),
            events: rx,
            counters,
        })
    }

    /// A result with the contract's fixed fields filled in.
    pub fn result(
        &self,
        workload: &str,
        spec: &str,
        round: u32,
        params: &impl Serialize,
    ) -> RunResult {
        RunResult {
            schema: SCHEMA,
            workload: workload.to_string(),
            transport: spec.to_string(),
            round,
            params: serde_json::to_value(params).expect("params serialize"),
            metrics: BTreeMap::new(),
            histograms: BTreeMap::new(),
            provenance: self.provenance.clone(),
            skipped: None,
        }
    }
}

/// A fleet with its event channel and client-side counters.
pub struct FleetHandle {
    /// The devices' links.
    pub fleet: Arc<dyn Fleet>,
    /// What the links report.
    pub events: mpsc::UnboundedReceiver<LinkEvent>,
    /// The client side's counters.
    pub counters: Arc<Counters>,
}

/// The server's counters as its control line reports them (zero if the server could not answer).
pub async fn server_counters(server: &mut ServerProcess) -> CounterSnapshot {
    server_stats(server).await.0
}

/// The server's counters and its own CPU seconds (getrusage: every thread, microsecond resolution), as its control
/// line reports them; zeros if the server could not answer.
pub async fn server_stats(server: &mut ServerProcess) -> (CounterSnapshot, f64) {
    match server.stats().await {
        Ok(v) => (
            v.get("counters")
                .and_then(|c| serde_json::from_value(c.clone()).ok())
                .unwrap_or_default(),
            v.get("cpu_s").and_then(|c| c.as_f64()).unwrap_or(0.0),
        ),
        Err(_) => (CounterSnapshot::default(), 0.0),
    }
}

/// Put every counter into a result's metrics under a prefix (`server_`, `client_`).
pub fn put_counters(result: &mut RunResult, prefix: &str, c: &CounterSnapshot) {
    for (name, value) in c.entries() {
        result
            .metrics
            .insert(format!("{prefix}{name}"), value.into());
    }
    result
        .metrics
        .insert(format!("{prefix}asym_ops"), c.asym_ops().into());
}

/// Remove a run's directories unless the user asked to keep them.
pub fn clean(dirs: &RunDirs, keep: bool) {
    if !keep {
        if let Some(base) = dirs.identity.parent() {
            let _ = std::fs::remove_dir_all(base);
        }
    }
}

/// A pattern payload for an order.
pub fn payload(id: &transport_core::OrderId, len: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(len);
    transport_core::order::fill_payload(id, len, &mut buf);
    buf
}

/// Microseconds since the Unix epoch.
pub fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A random nonzero run number for a device.
pub fn new_run() -> u64 {
    loop {
        let r: u64 = rand::random();
        if r != 0 {
            return r;
        }
    }
}

/// The loopback address with port 0 (any free port).
pub fn any_loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid")
}

/// Apply `KEY=VALUE` overrides to a workload's parameters. A value is read as JSON when it parses (numbers, true),
/// else as a string. An unknown key or a value of the wrong type is an error naming the valid keys.
pub fn override_params<P>(params: &P, overrides: &[String]) -> Result<P, String>
where
    P: Serialize + serde::de::DeserializeOwned,
{
    let mut value = serde_json::to_value(params).map_err(|e| e.to_string())?;
    let obj = value
        .as_object_mut()
        .ok_or("parameters are not an object")?;
    for o in overrides {
        let (k, v) = o
            .split_once('=')
            .ok_or_else(|| format!("`{o}`: expected KEY=VALUE"))?;
        if !obj.contains_key(k) {
            let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
            return Err(format!(
                "unknown parameter `{k}` (choose from: {})",
                keys.join(", ")
            ));
        }
        let parsed =
            serde_json::from_str(v).unwrap_or_else(|_| serde_json::Value::String(v.to_string()));
        obj.insert(k.to_string(), parsed);
    }
    serde_json::from_value(value).map_err(|e| format!("bad parameter value: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_apply_and_unknown_keys_are_named() {
        let p = crate::drain::DrainParams::for_profile(Profile::Quick);
        let q = override_params(&p, &["orders=500".into(), "clients=2".into()]).unwrap();
        assert_eq!(
            (q.orders, q.clients, q.payload_bytes),
            (500, 2, p.payload_bytes)
        );
        let e = override_params(&p, &["nope=1".into()]).unwrap_err();
        assert!(e.contains("nope") && e.contains("orders"), "{e}");
        assert!(override_params(&p, &["orders=many".into()]).is_err());
    }
}
