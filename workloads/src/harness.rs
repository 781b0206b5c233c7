//! What every workload shares, written once: the settings of an invocation ([`Harness`]), and one [`Run`] of a
//! workload against a transport, which owns the run's directories, the server process, the result being filled in
//! and the clean-up; a [`FleetHandle`] waits for the links' events until a deadline.
//!
//! Errors are errors: a server that cannot answer its control line, or reports an error or a failed store, fails the
//! run ([`Run::server_stats`]), it never reads as zeros; a failed run is a result too, with its error
//! ([`RunResult::error`]). Every result carries its store's durability ([`crate::durability`]); the server runs on
//! the CPUs the provenance's pinning gives it ([`crate::pin`]).

use crate::adversary::hostile::Hostile;
pub use crate::durability::ServerStats;
use crate::process::{ProcessError, ServerProcess};
use crate::result::{Provenance, RunResult, SCHEMA};
use crate::workload::Info;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transport_core::{
    Capabilities, CounterSnapshot, Counters, Fleet, FleetConfig, LinkEvent, Need, OrderId,
    Transport,
};
use transport_store::SyncPolicy;

/// Errors a workload returns.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The transport failed.
    #[error("{0}")]
    Transport(#[from] transport_core::TransportError),
    /// The server process could not be started or controlled.
    #[error("server process: {0}")]
    Process(#[from] ProcessError),
    /// The server's control line answered something that is not its statistics.
    #[error("server statistics: {0}")]
    Stats(String),
    /// A load-generator worker process failed or reported an error.
    #[error("load generator: {0}")]
    Worker(#[from] crate::worker::WorkerError),
    /// The server reported an error on its control line (or as it stopped).
    #[error("server: {0}")]
    Server(String),
    /// The server's store failed a write or a sync: it answers nothing as stored any more.
    #[error("the server's store failed: {0}")]
    StoreFailed(String),
    /// The store's log could not be audited.
    #[error("store audit: {0}")]
    Store(#[from] transport_store::StoreError),
    /// A file or socket operation failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The parameters do not fit the workload.
    #[error("parameters: {0}")]
    Params(String),
    /// The run did not finish in time.
    #[error("{0}")]
    Timeout(String),
}

/// The size of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Keep each run's directories (keys, store) instead of removing them.
    pub keep: bool,
    /// Progress lines (the runner prints them on stderr).
    pub progress: Arc<dyn Fn(&str) + Send + Sync>,
    /// Run an adversary beside every run ([`crate::adversary::hostile`]); results carry `"hostile": true` in their
    /// parameters.
    pub hostile: bool,
}

impl Harness {
    /// Say what is happening.
    pub fn say(&self, line: &str) {
        (self.progress)(line)
    }

    /// A result with the contract's fixed fields filled in and no metrics.
    pub fn result(
        &self,
        workload: &str,
        spec: &str,
        round: u32,
        params: serde_json::Value,
    ) -> RunResult {
        RunResult {
            schema: SCHEMA,
            workload: workload.to_string(),
            transport: spec.to_string(),
            round,
            params,
            metrics: BTreeMap::new(),
            histograms: BTreeMap::new(),
            provenance: self.provenance.clone(),
            skipped: None,
            durability: None,
            error: None,
        }
    }

    /// Run one case of `workload` against `transport`: the result, the reason it does not apply
    /// ([`RunResult::skipped`]), or the error that ended it ([`RunResult::error`], beside whatever it recorded
    /// before). The run's server is stopped and its directories removed however it ends.
    pub async fn run(
        &self,
        workload: &dyn crate::AnyWorkload,
        transport: &dyn Transport,
        round: u32,
        params: &serde_json::Value,
    ) -> RunResult {
        let info = workload.info();
        let mut result = self.result(info.name, transport.spec(), round, params.clone());
        if self.hostile {
            result.params["hostile"] = true.into();
        }
        if let Some(reason) = not_applicable(info, &transport.capabilities()) {
            result.skipped = Some(reason);
            return result;
        }
        if self.hostile && !Hostile::supported(transport.spec()) {
            result.skipped = Some(format!("no adversary speaks {}", transport.spec()));
            return result;
        }
        let mut run = match self.begin(transport, round, result.clone()) {
            Ok(run) => run,
            Err(e) => {
                result.error = Some(e.to_string());
                return result;
            }
        };
        let outcome = workload.run_json(&mut run, params).await;
        let mut result = run.finish().await;
        if let Err(e) = outcome {
            // The workload's own error comes first: a server error found at the end is often its consequence.
            result.error = Some(match result.error.take() {
                Some(later) => format!("{e}; then: {later}"),
                None => e.to_string(),
            });
        }
        result
    }
}

/// Why `info` does not apply to a transport with `caps`, or `None` if it does.
pub fn not_applicable(info: &Info, caps: &Capabilities) -> Option<String> {
    caps.missing(info.needs)
        .map(|(need, why)| format!("needs {}: {why}", need.describe()))
}

/// The directories of one run.
#[derive(Debug, Clone)]
pub struct RunDirs {
    /// Keys, certificates and allow-lists the transport prepared.
    pub identity: PathBuf,
    /// The server's store.
    pub store: PathBuf,
    /// Their parent, removed at the end of the run.
    pub base: PathBuf,
}

/// One run of one workload case against one transport.
pub struct Run<'a> {
    /// The invocation's settings.
    pub harness: &'a Harness,
    /// The transport under test.
    pub transport: &'a dyn Transport,
    /// The round, from 0.
    pub round: u32,
    /// Its directories.
    pub dirs: RunDirs,
    /// The result being filled in.
    pub result: RunResult,
    server: Option<ServerProcess>,
    /// Where the server listens (a restart reuses the port the first start got).
    listen: SocketAddr,
    /// The latest statistics of each server process that has ended, for the result's durability.
    ended: Vec<Option<serde_json::Value>>,
    /// The adversary beside the run, from the server's first start (hostile runs only).
    hostile: Option<Hostile>,
}

impl Harness {
    /// Begin a run that fills in `result` (for tools and tests that drive a transport by hand; workloads get theirs
    /// from [`Harness::run`]): fresh directories, no server yet. End it with [`Run::finish`].
    pub fn begin<'a>(
        &'a self,
        transport: &'a dyn Transport,
        round: u32,
        result: RunResult,
    ) -> Result<Run<'a>, WorkloadError> {
        let base = self.work_dir.join(format!(
            "{}-{}-r{round}-{}",
            result.workload,
            transport.spec().replace([':', '@', '/'], "_"),
            std::process::id()
        ));
        if base.exists() {
            std::fs::remove_dir_all(&base)?;
        }
        let dirs = RunDirs {
            identity: base.join("identity"),
            store: base.join("store"),
            base,
        };
        std::fs::create_dir_all(&dirs.identity)?;
        Ok(Run {
            harness: self,
            transport,
            round,
            dirs,
            result,
            server: None,
            listen: any_loopback(),
            ended: Vec::new(),
            hostile: None,
        })
    }
}

impl<'a> Run<'a> {
    /// The transport's spec.
    pub fn spec(&self) -> &str {
        self.transport.spec()
    }

    /// What the transport can do.
    pub fn capabilities(&self) -> Capabilities {
        self.transport.capabilities()
    }

    /// A progress line, prefixed with the run's name.
    pub fn say(&self, what: &str) {
        self.harness.say(&format!(
            "{} {} round {}: {what}",
            self.result.workload,
            self.spec(),
            self.round
        ));
    }

    /// Write the server's identity and the credentials of `devices` devices (and, in a hostile run, of one more: the
    /// adversary's own).
    pub fn prepare(&self, devices: u32) -> Result<(), WorkloadError> {
        let extra = u32::from(self.harness.hostile);
        Ok(self
            .transport
            .prepare(&self.dirs.identity, devices + extra)?)
    }

    /// Start the server (`runner serve`) and wait until it is ready; its address.
    pub async fn start_server(&mut self) -> Result<SocketAddr, WorkloadError> {
        if let Some(mut old) = self.server.take() {
            let _ = old.kill().await;
            self.ended.push(old.last_stats().cloned());
        }
        let server = ServerProcess::start(self.server_command()?, Duration::from_secs(30)).await?;
        self.listen = server.ready().addr;
        self.server = Some(server);
        if self.harness.hostile {
            if self.hostile.is_none() {
                let dir = self.dirs.base.join("adversary");
                self.hostile = Some(Hostile::enroll(self.spec(), &self.dirs.identity, &dir)?);
            }
            let (runner, listen) = (self.harness.runner.clone(), self.listen);
            if let Some(h) = self.hostile.as_mut() {
                h.start(&runner, listen).await?;
            }
        }
        Ok(self.listen)
    }

    /// Kill the server with SIGKILL and start it again at once on the same port with the same identity and store;
    /// the instant of the kill.
    ///
    /// Its statistics are read just before the kill, for the result's durability (a killed server says nothing
    /// after), and, in a hostile run, for the adversary's tally (the server's counters are summed over its starts).
    pub async fn restart_server(&mut self) -> Result<Instant, WorkloadError> {
        let stats = self.server_stats().await?;
        if let Some(h) = self.hostile.as_mut() {
            h.server_ending(&stats);
        }
        let killed = Instant::now();
        self.server()?.kill().await?;
        self.start_server().await?;
        Ok(killed)
    }

    /// The running server.
    pub fn server(&mut self) -> Result<&mut ServerProcess, WorkloadError> {
        self.server
            .as_mut()
            .ok_or_else(|| WorkloadError::Stats("no server is running".into()))
    }

    /// The server's statistics from its control line; an error if it cannot answer, answers something else,
    /// reports an error, or its store failed.
    pub async fn server_stats(&mut self) -> Result<ServerStats, WorkloadError> {
        let value = self.server()?.stats().await?;
        ServerStats::parse(&value)
    }

    /// Stop the server at the end of a run (asking it to exit). In a hostile run the adversary goes quiet first, the
    /// server is given time to give up on the half-open connections it holds, and must then answer its control line
    /// (`server_answered_end`).
    pub async fn stop_server(&mut self) -> Result<(), WorkloadError> {
        if let Some(settle) = self.hostile.as_ref().map(Hostile::settle) {
            if let Some(h) = self.hostile.as_mut() {
                h.quiet().await?;
            }
            tokio::time::sleep(settle).await;
            let stats = self.server_stats().await;
            if let Some(h) = self.hostile.as_mut() {
                h.answered_end(stats.is_ok());
                if let Ok(stats) = &stats {
                    h.server_ending(stats);
                }
                h.stop().await?;
            }
        }
        self.server()?.shutdown().await?;
        Ok(())
    }

    /// The command that starts the server, pinned to the server's CPUs when the invocation pins.
    fn server_command(&self) -> Result<tokio::process::Command, WorkloadError> {
        let h = self.harness;
        let mut cmd = tokio::process::Command::new(&h.runner);
        cmd.arg("serve")
            .arg("--transport")
            .arg(self.transport.spec())
            .arg("--listen")
            .arg(self.listen.to_string())
            .arg("--identity")
            .arg(&self.dirs.identity)
            .arg("--store")
            .arg(&self.dirs.store)
            .arg("--sync")
            .arg(h.sync.to_string())
            .arg("--server-threads")
            .arg(h.server_threads.to_string());
        let pinning = &h.provenance.pinning;
        if pinning.separate() {
            crate::pin::pin_command(&mut cmd, &pinning.server_cpus)?;
        }
        Ok(cmd)
    }

    /// Create the links of `devices` devices to `server`, reporting into a new channel.
    pub async fn fleet(
        &self,
        server: SocketAddr,
        devices: u32,
    ) -> Result<FleetHandle, WorkloadError> {
        let (tx, rx) = transport_core::events::channel();
        let counters = Arc::new(Counters::default());
        let fleet = self
            .transport
            .fleet(FleetConfig {
                server,
                identity: self.dirs.identity.clone(),
                first: 0,
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

    /// Record a metric.
    pub fn metric(&mut self, key: &str, value: impl Into<serde_json::Value>) {
        self.result.metrics.insert(key.to_string(), value.into());
    }

    /// A metric recorded so far, as a number.
    pub fn metric_f64(&self, key: &str) -> Option<f64> {
        self.result.metrics.get(key).and_then(|v| v.as_f64())
    }

    /// Record a whole histogram.
    pub fn histogram(&mut self, key: &str, h: &hdrhistogram::Histogram<u64>) {
        self.result
            .histograms
            .insert(key.to_string(), crate::hist::encode(h));
    }

    /// Record every counter under a prefix (`server_`, `client_`), and their asymmetric operations in all.
    pub fn counters(&mut self, prefix: &str, c: &CounterSnapshot) {
        for (name, value) in c.entries() {
            self.metric(&format!("{prefix}{name}"), value);
        }
        self.metric(&format!("{prefix}asym_ops"), c.asym_ops());
    }

    /// Audit the store's log against the orders made and acknowledged and record `applied`, `lost`,
    /// `duplicates`, `acked_not_applied` and `unknown`. A transport without stored answers has no log to audit:
    /// nothing is recorded and `None` returned.
    pub fn audit(
        &mut self,
        made: &[OrderId],
        acked: &[OrderId],
    ) -> Result<Option<transport_store::Audit>, WorkloadError> {
        if !self.capabilities().can(Need::StoredAnswers).is_yes() {
            return Ok(None);
        }
        let entries = self.log_entries()?;
        let audit = transport_store::Audit::of_entries(&entries, made, acked);
        self.record_audit(&audit);
        Ok(Some(audit))
    }

    /// The store's log, without the adversary's orders in a hostile run (counted apart: see
    /// [`Hostile::split`]).
    pub fn log_entries(&mut self) -> Result<Vec<transport_store::LogEntry>, WorkloadError> {
        let entries = transport_store::read_log(&self.dirs.store)?;
        Ok(match self.hostile.as_mut() {
            Some(h) => h.split(entries),
            None => entries,
        })
    }

    /// Record an audit's figures.
    pub fn record_audit(&mut self, audit: &transport_store::Audit) {
        self.metric("applied", audit.applied);
        self.metric("lost", audit.lost);
        self.metric("duplicates", audit.duplicates);
        self.metric("acked_not_applied", audit.acked_not_applied);
        self.metric("unknown", audit.unknown);
    }

    /// Stop the server, record the store's durability from what every server process last reported (an error it
    /// reported becomes the result's error), remove the directories (unless kept); the result.
    pub async fn finish(mut self) -> RunResult {
        if let Some(mut h) = self.hostile.take() {
            // A workload that shut its server down itself, not through `stop_server`, leaves no answer at the end.
            let _ = h.stop().await;
            h.record(&mut self.result);
        }
        if let Some(mut server) = self.server.take() {
            let _ = server.shutdown().await;
            self.ended.push(server.last_stats().cloned());
        }
        if let Err(e) = self.record_durability() {
            self.result.error = Some(e.to_string());
        }
        if !self.harness.keep {
            let _ = std::fs::remove_dir_all(&self.dirs.base);
        }
        self.result
    }

    fn record_durability(&mut self) -> Result<(), WorkloadError> {
        // A server that never answered (killed before it was asked) has nothing to add.
        let lasts = self
            .ended
            .iter()
            .flatten()
            .map(ServerStats::parse)
            .collect::<Result<Vec<_>, _>>()?;
        let h = self.harness;
        if let Some(s) = crate::durability::summarize(h.sync.name(), h.server_threads, &lasts)? {
            self.result.durability = Some(s.durability);
            self.histogram("store_fsync", &s.fsync);
            if !s.state_fsync.is_empty() {
                self.histogram("state_fsync", &s.state_fsync);
            }
        }
        Ok(())
    }
}

/// How a wait for events ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// The condition was met.
    Done,
    /// The deadline passed first.
    TimedOut,
    /// The fleet's channel closed.
    Closed,
}

/// A fleet with its event channel and client-side counters.
pub struct FleetHandle {
    /// The devices' links.
    pub fleet: Arc<dyn Fleet>,
    /// What the links report.
    pub events: transport_core::events::EventReceiver,
    /// The client side's counters.
    pub counters: Arc<Counters>,
}

impl FleetHandle {
    /// Hand every event to `on` until it returns `true` (done) or `deadline` passes.
    ///
    /// The events already queued are taken without a timer; only an empty queue waits, with one timer for the
    /// whole wait (a timer per event cost the load generator more than the event itself).
    pub async fn until(
        &mut self,
        deadline: Instant,
        mut on: impl FnMut(&LinkEvent) -> bool,
    ) -> Waited {
        use tokio::sync::mpsc::error::TryRecvError;
        let timer = tokio::time::sleep_until(deadline.into());
        tokio::pin!(timer);
        loop {
            loop {
                match self.events.try_recv() {
                    Ok(event) => {
                        if on(&event) {
                            return Waited::Done;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return Waited::Closed,
                }
            }
            if Instant::now() >= deadline {
                return Waited::TimedOut;
            }
            tokio::select! {
                event = self.events.recv() => match event {
                    Some(event) => {
                        if on(&event) {
                            return Waited::Done;
                        }
                    }
                    None => return Waited::Closed,
                },
                _ = &mut timer => return Waited::TimedOut,
            }
        }
    }

    /// Wait until `acked` holds `total` answered orders (each [`LinkEvent::Stored`] is pushed to it, and handed to
    /// `on` with its device and time) or `deadline` passes.
    pub async fn collect_stored(
        &mut self,
        acked: &mut Vec<OrderId>,
        total: usize,
        deadline: Instant,
        mut on: impl FnMut(u32, OrderId, Instant),
    ) -> Waited {
        if acked.len() >= total {
            return Waited::Done;
        }
        self.until(deadline, |event| {
            if let LinkEvent::Stored { device, id, at } = *event {
                acked.push(id);
                on(device, id, at);
            }
            acked.len() >= total
        })
        .await
    }

    /// Open every device's link, many at a time (a handshake each where the transport has one).
    pub async fn connect_all(&self, devices: u32) -> Result<(), WorkloadError> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        let fleet = &self.fleet;
        stream::iter(0..devices)
            .map(|d| fleet.connect(d))
            .buffer_unordered(256)
            .try_collect::<Vec<_>>()
            .await?;
        Ok(())
    }
}

/// A pattern payload for an order.
pub fn payload(id: &OrderId, len: usize) -> Vec<u8> {
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

/// The order `seq` of device `device` in a run of `run`, made now, with a pattern payload of `len` bytes.
///
/// Never inlined: a profile then shows the making of orders under this name, apart from the workload's loop
/// (`scripts/generator-instructions.py` leaves it out of the drain's part).
#[inline(never)]
pub fn order(device: u32, run: u64, seq: u64, len: usize) -> transport_core::Order {
    let id = OrderId {
        sender: transport_core::device_sender_id(device),
        run,
        seq,
    };
    transport_core::Order {
        id,
        made_us: unix_us(),
        payload: payload(&id, len),
    }
}
