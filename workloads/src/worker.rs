//! Load-generator workers: the client side of a run split over child processes (`runner worker`), so that no process
//! holds more open files than the machine allows (here 20,000 per process, a hard limit) and links are as many as a
//! workload asks for.
//!
//! # The split
//!
//! A worker runs devices `first..first + count` of a run's identity directory ([`FleetConfig::first`]). Every
//! transport's device is counted as one open file, whatever its fleet shares today (a QUIC fleet shares one endpoint
//! socket, a Pure fleet a few sockets; an MQTT link is one TCP socket; devices are meant to be what they claim to be,
//! one socket each), so a worker of `count` devices stays under [`FILES_PER_PROCESS`] with [`RESERVED_FILES`] to
//! spare for its runtime and pipes, and each worker reports the files it actually holds ([`WorkerStats::files`]).
//! [`split`] cuts the devices into as few slices as that allows, as even as possible.
//!
//! # The worker's side ([`serve`])
//!
//! Controlled like a server ([`crate::process`]): its first line is `{"ready": WorkerReady}` (or `{"error": ...}`
//! if its fleet cannot be made); each line on stdin is one [`Command`] as JSON, answered by one JSON line; end of
//! input closes the fleet and exits. The runner side ([`Workers`]) starts each worker as a
//! [`ControlledProcess`], so a worker is killed with the runner however it ends (SIGKILL included).
//!
//! - `connect`: open the worker's links, `concurrency` at a time, in the background (answered at once); a link of a
//!   transport with handshakes is open when its handshake is complete ([`Fleet::connect`]); a link of a transport
//!   without (Pure) when the server has answered the device's first order, so the server knows the device. A link
//!   that fails is counted by kind of error, with one full message per kind, and closed so that it does not retry
//!   in the background.
//! - `stats`: progress and costs ([`WorkerStats`]): links open and failed, errors, links lost, CPU, memory, files.
//! - `hold`: the links are left idle from now on; links lost from here are counted apart (`lost_holding`).
//! - `close`: close every link and stop the fleet.

use crate::process::{ControlledProcess, ProcessError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::Path;
use std::time::{Duration, Instant};
use transport_core::{CounterSnapshot, OrderId, TransportError};

mod serve;
pub use serve::{serve, WorkerConfig};

/// Open files one process may hold in this suite's design (the machine's hard limit is 20,000).
pub const FILES_PER_PROCESS: u32 = 18_000;
/// Files a worker keeps for itself: its runtime, pipes, the identity files it reads.
pub const RESERVED_FILES: u32 = 1_000;
/// The most links one worker runs: one file each, within [`FILES_PER_PROCESS`] less [`RESERVED_FILES`].
pub const MAX_LINKS_PER_WORKER: u32 = FILES_PER_PROCESS - RESERVED_FILES;
/// How long a worker may take to make its fleet and say it is ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a command may take to be answered (`close` waits for the fleet's links to close).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Devices `0..links` cut into the fewest slices of at most `max_per_worker` devices, as even as possible (sizes
/// differ by at most one), in order. No links, no slices.
pub fn split(links: u32, max_per_worker: u32) -> Vec<Range<u32>> {
    let max = max_per_worker.max(1);
    let workers = links.div_ceil(max);
    let mut out = Vec::with_capacity(workers as usize);
    let mut first = 0;
    for w in 0..workers {
        let count = links / workers + u32::from(w < links % workers);
        out.push(first..first + count);
        first += count;
    }
    out
}

/// Errors of workers, on either side.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A worker process could not be started or controlled.
    #[error("worker {worker} (devices {devices:?}): {source}")]
    Process {
        /// Its index.
        worker: usize,
        /// Its devices.
        devices: Range<u32>,
        /// What failed.
        source: ProcessError,
    },
    /// A worker answered a command with an error.
    #[error("worker {worker} (devices {devices:?}): {message}")]
    Reported {
        /// Its index.
        worker: usize,
        /// Its devices.
        devices: Range<u32>,
        /// What it said.
        message: String,
    },
    /// A worker's answer is not what the command answers.
    #[error("worker {worker} (devices {devices:?}) answered {answer}: {reason}")]
    BadAnswer {
        /// Its index.
        worker: usize,
        /// Its devices.
        devices: Range<u32>,
        /// The answer (shortened).
        answer: String,
        /// Why it does not parse.
        reason: String,
    },
    /// The worker's fleet could not be made or used.
    #[error("{0}")]
    Transport(#[from] TransportError),
    /// A worker needs more open files than its process may hold.
    #[error("{links} links need about {needed} open files, and this process may hold {limit}")]
    TooManyFiles {
        /// The worker's links.
        links: u32,
        /// Files they need with the reserve.
        needed: u64,
        /// The process's limit.
        limit: u64,
    },
    /// Reading commands or writing answers failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// What a worker reports when it is ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerReady {
    /// The transport spec its fleet runs.
    pub transport: String,
    /// Its first device.
    pub first: u32,
    /// Its devices.
    pub count: u32,
    /// Its process id.
    pub pid: u32,
    /// The open files it may hold (its soft limit).
    pub files_limit: u64,
}

/// Open a link by having the server store one order of the device's: for a transport without connections, so that
/// the server knows the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirstOrder {
    /// The devices' run number (every order is `(device, run, 0)`).
    pub run: u64,
    /// Bytes of payload.
    pub payload_bytes: u32,
}

/// A command to a worker, one JSON line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Command {
    /// Open the first `links` of the worker's devices, `concurrency` at a time, in the background; answered at once
    /// with `{"started": links}`. A device not open after `timeout_s` counts as failed.
    Connect {
        /// How many links.
        links: u32,
        /// Links being opened at once.
        concurrency: u32,
        /// Open each link with a stored order instead of a connection.
        first_order: Option<FirstOrder>,
        /// Give up on a link after this long.
        timeout_s: u64,
    },
    /// Report [`WorkerStats`].
    Stats,
    /// Leave the links idle; count links lost from now on apart. Answered with [`WorkerStats`].
    Hold,
    /// Close every link and stop the fleet. Answered with [`WorkerStats`].
    Close,
}

/// Errors of one kind: how many, and the first one's full message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorCount {
    /// How many.
    pub count: u64,
    /// The first one's message.
    pub example: String,
}

/// A worker's progress and costs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerStats {
    /// Its first device.
    pub first: u32,
    /// Links asked for so far.
    pub requested: u32,
    /// Links open.
    pub opened: u32,
    /// Links that failed to open.
    pub failed: u32,
    /// Errors by kind: links that failed to open, and links lost.
    pub errors: BTreeMap<String, ErrorCount>,
    /// The devices asked for whose link is not open (failed, or still opening).
    pub not_open_devices: Vec<u32>,
    /// When `connect` started, microseconds since the Unix epoch (0: not yet).
    pub started_us: u64,
    /// When the last link opened, microseconds since the Unix epoch (0: none yet).
    pub last_open_us: u64,
    /// Links lost without being asked to close (the fleet opens them again).
    pub lost: u64,
    /// Of those, the ones lost since `hold`.
    pub lost_holding: u64,
    /// CPU seconds this worker has used (getrusage: every thread).
    pub cpu_s: f64,
    /// Its resident memory.
    pub rss_bytes: u64,
    /// Files it holds open now.
    pub files: u64,
    /// The fleet's counters.
    pub counters: CounterSnapshot,
}

impl WorkerStats {
    /// Whether every link asked for is open or has failed.
    pub fn settled(&self) -> bool {
        self.opened + self.failed >= self.requested
    }
}

/// A kind of error, short and stable enough to count by: the error's class and, for protocol errors, what failed.
pub fn error_kind(e: &TransportError) -> String {
    match e {
        TransportError::Io(io) => format!("i/o: {io}"),
        TransportError::Store(_) => "store".into(),
        TransportError::Identity(_) => "identity".into(),
        TransportError::Config(_) => "configuration".into(),
        TransportError::Protocol(m) => {
            format!("protocol: {}", m.split(':').next().unwrap_or(m).trim())
        }
        TransportError::Unsupported(what) => format!("not supported: {what}"),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The runner's side
// ---------------------------------------------------------------------------------------------------------------

/// One worker process and its devices.
#[derive(Debug)]
struct Worker {
    devices: Range<u32>,
    process: ControlledProcess<WorkerReady>,
}

/// The worker processes of a run: started, counted and stopped like the server, never outliving the runner.
#[derive(Debug)]
pub struct Workers {
    workers: Vec<Worker>,
}

/// Every worker's stats summed up.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// Links asked for.
    pub requested: u64,
    /// Links open.
    pub opened: u64,
    /// Links that failed to open.
    pub failed: u64,
    /// Errors by kind, over every worker.
    pub errors: BTreeMap<String, ErrorCount>,
    /// The devices asked for whose link is not open.
    pub not_open_devices: Vec<u32>,
    /// When the first worker started connecting (µs since the Unix epoch).
    pub started_us: u64,
    /// When the last link opened, over every worker (µs since the Unix epoch).
    pub last_open_us: u64,
    /// Links lost.
    pub lost: u64,
    /// Links lost while held.
    pub lost_holding: u64,
    /// CPU seconds of every worker.
    pub cpu_s: f64,
    /// Resident memory of every worker.
    pub rss_bytes: u64,
    /// The most files one worker holds.
    pub files_max: u64,
    /// Every worker's counters, summed.
    pub counters: CounterSnapshot,
}

impl Totals {
    /// Sum up every worker's stats.
    pub fn of(stats: &[WorkerStats]) -> Totals {
        let mut t = Totals::default();
        for s in stats {
            t.requested += u64::from(s.requested);
            t.opened += u64::from(s.opened);
            t.failed += u64::from(s.failed);
            for (kind, e) in &s.errors {
                t.errors
                    .entry(kind.clone())
                    .or_insert(ErrorCount {
                        count: 0,
                        example: e.example.clone(),
                    })
                    .count += e.count;
            }
            t.not_open_devices.extend(&s.not_open_devices);
            if s.started_us > 0 {
                t.started_us = if t.started_us == 0 {
                    s.started_us
                } else {
                    t.started_us.min(s.started_us)
                };
            }
            t.last_open_us = t.last_open_us.max(s.last_open_us);
            t.lost += s.lost;
            t.lost_holding += s.lost_holding;
            t.cpu_s += s.cpu_s;
            t.rss_bytes += s.rss_bytes;
            t.files_max = t.files_max.max(s.files);
            t.counters = t.counters.plus(&s.counters);
        }
        t
    }

    /// Every error, of every kind.
    pub fn errors(&self) -> u64 {
        self.errors.values().map(|e| e.count).sum()
    }
}

impl Workers {
    /// Start one worker per slice of devices (`runner worker`, the `runner` binary being `runner`), each running
    /// its devices of `spec` from `identity` against `server`, and wait until every one is ready.
    pub async fn start(
        runner: &Path,
        spec: &str,
        identity: &Path,
        server: SocketAddr,
        slices: &[Range<u32>],
    ) -> Result<Workers, WorkerError> {
        let mut workers = Vec::with_capacity(slices.len());
        for (i, devices) in slices.iter().enumerate() {
            let mut cmd = tokio::process::Command::new(runner);
            cmd.arg("worker")
                .arg("--transport")
                .arg(spec)
                .arg("--identity")
                .arg(identity)
                .arg("--server")
                .arg(server.to_string())
                .arg("--first")
                .arg(devices.start.to_string())
                .arg("--count")
                .arg(devices.len().to_string());
            let process = ControlledProcess::<WorkerReady>::start(cmd, READY_TIMEOUT)
                .await
                .map_err(|source| WorkerError::Process {
                    worker: i,
                    devices: devices.clone(),
                    source,
                })?;
            workers.push(Worker {
                devices: devices.clone(),
                process,
            });
        }
        Ok(Workers { workers })
    }

    /// How many workers there are.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// The workers' process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.workers.iter().map(|w| w.process.pid()).collect()
    }

    /// What each worker reported when it was ready.
    pub fn ready(&self) -> Vec<&WorkerReady> {
        self.workers.iter().map(|w| w.process.ready()).collect()
    }

    /// Send `command(worker's devices)` to every worker and collect the answers; an `{"error": ...}` answer is an
    /// error naming the worker.
    async fn each(
        &mut self,
        command: impl Fn(&Range<u32>) -> Command,
    ) -> Result<Vec<serde_json::Value>, WorkerError> {
        let mut answers = Vec::with_capacity(self.workers.len());
        for (i, w) in self.workers.iter_mut().enumerate() {
            let line =
                serde_json::to_string(&command(&w.devices)).map_err(std::io::Error::other)?;
            let answer = w
                .process
                .request_within(&line, ANSWER_TIMEOUT)
                .await
                .map_err(|source| WorkerError::Process {
                    worker: i,
                    devices: w.devices.clone(),
                    source,
                })?;
            if let Some(message) = answer.get("error") {
                return Err(WorkerError::Reported {
                    worker: i,
                    devices: w.devices.clone(),
                    message: message.as_str().unwrap_or_default().to_string(),
                });
            }
            answers.push(answer);
        }
        Ok(answers)
    }

    async fn each_stats(&mut self, command: Command) -> Result<Vec<WorkerStats>, WorkerError> {
        let answers = self.each(|_| command.clone()).await?;
        answers
            .into_iter()
            .zip(&self.workers)
            .enumerate()
            .map(|(i, (a, w))| {
                serde_json::from_value(a.clone()).map_err(|e| WorkerError::BadAnswer {
                    worker: i,
                    devices: w.devices.clone(),
                    answer: a.to_string().chars().take(200).collect(),
                    reason: e.to_string(),
                })
            })
            .collect()
    }

    /// Have every worker open all its links, `concurrency` at a time over all workers together (each worker gets
    /// its share), opening each with a stored order if `first_order` is given; returns when every worker has
    /// started (see [`Workers::wait_settled`]).
    pub async fn connect(
        &mut self,
        concurrency: u32,
        first_order: Option<FirstOrder>,
        timeout: Duration,
    ) -> Result<(), WorkerError> {
        let share = concurrency
            .div_ceil(self.workers.len().max(1) as u32)
            .max(1);
        self.each(|devices| Command::Connect {
            links: devices.len() as u32,
            concurrency: share,
            first_order,
            timeout_s: timeout.as_secs().max(1),
        })
        .await?;
        Ok(())
    }

    /// Every worker's stats.
    pub async fn stats(&mut self) -> Result<Vec<WorkerStats>, WorkerError> {
        self.each_stats(Command::Stats).await
    }

    /// Ask every worker for its stats every `every` until every link asked for is open or failed, or `deadline`
    /// passes; `progress` sees the totals after each round. The last stats, and whether every worker settled.
    pub async fn wait_settled(
        &mut self,
        deadline: Instant,
        every: Duration,
        mut progress: impl FnMut(&Totals),
    ) -> Result<(Vec<WorkerStats>, bool), WorkerError> {
        loop {
            let stats = self.stats().await?;
            progress(&Totals::of(&stats));
            let settled = stats.iter().all(WorkerStats::settled);
            if settled || Instant::now() >= deadline {
                return Ok((stats, settled));
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Have every worker hold its links idle; their stats at that moment.
    pub async fn hold(&mut self) -> Result<Vec<WorkerStats>, WorkerError> {
        self.each_stats(Command::Hold).await
    }

    /// Have every worker close its links; their last stats.
    pub async fn close(&mut self) -> Result<Vec<WorkerStats>, WorkerError> {
        self.each_stats(Command::Close).await
    }

    /// Stop every worker (end of input, then SIGKILL after a grace period).
    pub async fn shutdown(mut self) {
        for w in &mut self.workers {
            let _ = w.process.shutdown().await;
        }
    }
}

/// The ids of the first orders of devices `0..links` of a run ([`FirstOrder`]): what the store's audit expects.
pub fn first_order_ids(links: u32, run: u64) -> Vec<OrderId> {
    (0..links)
        .map(|d| OrderId {
            sender: transport_core::device_sender_id(d),
            run,
            seq: 0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_is_as_even_as_possible_and_covers_every_device_once() {
        assert_eq!(split(0, 10), Vec::<Range<u32>>::new());
        assert_eq!(split(5, 10), vec![0..5]);
        assert_eq!(split(10, 10), vec![0..10]);
        assert_eq!(split(11, 10), vec![0..6, 6..11]);
        assert_eq!(split(7, 3), vec![0..3, 3..5, 5..7]);
        assert_eq!(
            split(3, 0),
            vec![0..1, 1..2, 2..3],
            "at least one per worker"
        );
        for (links, max) in [
            (20_000, MAX_LINKS_PER_WORKER),
            (1, 1),
            (99_999, 7),
            (34_001, 17_000),
        ] {
            let slices = split(links, max);
            assert_eq!(slices.len() as u32, links.div_ceil(max), "{links}/{max}");
            let mut next = 0;
            for s in &slices {
                assert_eq!(s.start, next, "contiguous");
                assert!(s.len() as u32 <= max && !s.is_empty());
                next = s.end;
            }
            assert_eq!(next, links);
            let sizes: Vec<usize> = slices.iter().map(|s| s.len()).collect();
            let (min, most) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(most - min <= 1, "{sizes:?}");
        }
    }

    #[test]
    fn the_seed_sizes_fit_the_open_file_budget() {
        // 20,000 links: two workers of 10,000, each far under the 18,000 files a process may hold here.
        assert_eq!(
            split(20_000, MAX_LINKS_PER_WORKER),
            vec![0..10_000, 10_000..20_000]
        );
        assert_eq!(split(10_000, MAX_LINKS_PER_WORKER).len(), 1);
    }

    #[test]
    fn errors_are_counted_by_kind_and_summed_over_workers() {
        let kinds = [
            error_kind(&TransportError::Protocol("handshake: peer refused".into())),
            error_kind(&TransportError::Protocol("handshake: timed out".into())),
            error_kind(&TransportError::Io(std::io::Error::from_raw_os_error(
                libc::EMFILE,
            ))),
        ];
        assert_eq!(kinds[0], "protocol: handshake");
        assert_eq!(kinds[0], kinds[1]);
        assert!(kinds[2].contains("Too many open files"), "{}", kinds[2]);

        let errors: BTreeMap<String, ErrorCount> = [(
            kinds[0].clone(),
            ErrorCount {
                count: 2,
                example: "handshake: peer refused".into(),
            },
        )]
        .into_iter()
        .collect();

        let worker = |first, failed: u32, files| WorkerStats {
            first,
            requested: 10,
            opened: 10 - failed,
            failed,
            errors: errors.clone(),
            not_open_devices: (first..first + failed).collect(),
            started_us: 5 + u64::from(first),
            last_open_us: 50 + u64::from(first),
            lost: 0,
            lost_holding: 0,
            cpu_s: 0.5,
            rss_bytes: 1000,
            files,
            counters: CounterSnapshot::default(),
        };
        let t = Totals::of(&[worker(0, 2, 30), worker(10, 0, 40)]);
        assert_eq!((t.requested, t.opened, t.failed), (20, 18, 2));
        assert_eq!((t.started_us, t.last_open_us, t.files_max), (5, 60, 40));
        assert_eq!(t.errors(), 4);
        assert_eq!(t.not_open_devices, vec![0, 1]);
    }
}
