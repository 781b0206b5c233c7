//! The worker's side of [`crate::worker`]: a fleet of one slice of a run's devices, driven by commands on its input.

use super::{
    error_kind, Command, ErrorCount, FirstOrder, WorkerError, WorkerReady, WorkerStats,
    RESERVED_FILES,
};
use crate::harness::{order, unix_us};
use futures::stream::{self, StreamExt};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use transport_core::{procfs, Counters, Fleet, FleetConfig, LinkEvent, Transport};

/// Where a worker's fleet goes.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The server.
    pub server: SocketAddr,
    /// The run's identity directory.
    pub identity: PathBuf,
    /// The worker's first device.
    pub first: u32,
    /// Its devices.
    pub count: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Idle,
    Opening,
    Open,
    Failed,
}

/// What the worker's tasks share.
struct State {
    first: u32,
    links: Vec<Link>,
    requested: u32,
    opened: u32,
    failed: u32,
    errors: BTreeMap<String, ErrorCount>,
    started_us: u64,
    last_open_us: u64,
    lost: u64,
    lost_holding: u64,
    holding: bool,
}

impl State {
    fn slot(&mut self, device: u32) -> Option<&mut Link> {
        let i = device.checked_sub(self.first)?;
        self.links.get_mut(i as usize)
    }

    fn open(&mut self, device: u32) {
        if let Some(link) = self.slot(device).filter(|l| **l == Link::Opening) {
            *link = Link::Open;
            self.opened += 1;
            self.last_open_us = unix_us();
        }
    }

    fn fail(&mut self, device: u32, kind: String, message: String) {
        if let Some(link) = self.slot(device).filter(|l| **l == Link::Opening) {
            *link = Link::Failed;
            self.failed += 1;
            self.error(kind, message);
        }
    }

    fn error(&mut self, kind: String, message: String) {
        self.errors
            .entry(kind)
            .or_insert(ErrorCount {
                count: 0,
                example: message,
            })
            .count += 1;
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // No code panics while holding it; a poisoned state is still the right state.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

async fn write_line<O: AsyncWrite + Unpin>(
    out: &mut O,
    value: &impl Serialize,
) -> Result<(), WorkerError> {
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line).await?;
    out.flush().await?;
    Ok(())
}

/// Run a worker: make the fleet of `config`'s devices of `transport`, say so on `output`, and answer the commands
/// read from `input` until it ends. An error making the fleet is written as `{"error": ...}` and returned.
pub async fn serve<I, O>(
    transport: &dyn Transport,
    config: WorkerConfig,
    input: I,
    mut output: O,
) -> Result<(), WorkerError>
where
    I: AsyncBufRead + Unpin,
    O: AsyncWrite + Unpin,
{
    let limit = procfs::files_limit(std::process::id())?;
    let needed = u64::from(config.count) + u64::from(RESERVED_FILES);
    let fleet = if needed > limit {
        Err(WorkerError::TooManyFiles {
            links: config.count,
            needed,
            limit,
        })
    } else {
        make_fleet(transport, &config).await
    };
    let (fleet, events, counters) = match fleet {
        Ok(f) => f,
        Err(e) => {
            write_line(&mut output, &serde_json::json!({ "error": e.to_string() })).await?;
            return Err(e);
        }
    };
    let ready = WorkerReady {
        transport: transport.spec().to_string(),
        first: config.first,
        count: config.count,
        pid: std::process::id(),
        files_limit: limit,
    };
    write_line(&mut output, &serde_json::json!({ "ready": ready })).await?;

    let state = Arc::new(Mutex::new(State {
        first: config.first,
        links: vec![Link::Idle; config.count as usize],
        requested: 0,
        opened: 0,
        failed: 0,
        errors: BTreeMap::new(),
        started_us: 0,
        last_open_us: 0,
        lost: 0,
        lost_holding: 0,
        holding: false,
    }));
    let watcher = tokio::spawn(watch_events(events, state.clone()));
    let mut opening: Option<tokio::task::JoinHandle<()>> = None;
    let stats = |state: &Mutex<State>| stats_of(state, &counters);

    let mut lines = input.lines();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        let command = match serde_json::from_str::<Command>(&line) {
            Ok(c) => c,
            Err(e) => {
                let answer = serde_json::json!({ "error": format!("bad command: {e}") });
                write_line(&mut output, &answer).await?;
                continue;
            }
        };
        match command {
            Command::Connect {
                links,
                concurrency,
                first_order,
                timeout_s,
            } => {
                let answer = if opening.is_some() {
                    serde_json::json!({ "error": "already connecting" })
                } else if links > config.count {
                    serde_json::json!({
                        "error": format!("{links} links asked of a worker of {} devices", config.count)
                    })
                } else {
                    {
                        let mut s = lock(&state);
                        s.requested = links;
                        s.started_us = unix_us();
                        for link in &mut s.links[..links as usize] {
                            *link = Link::Opening;
                        }
                    }
                    let range = config.first..config.first + links;
                    let plan = Opening {
                        fleet: fleet.clone(),
                        state: state.clone(),
                        concurrency: concurrency.max(1) as usize,
                        first_order,
                        deadline: Instant::now() + Duration::from_secs(timeout_s),
                        timeout_s,
                    };
                    opening = Some(tokio::spawn(plan.run(range)));
                    serde_json::json!({ "started": links })
                };
                write_line(&mut output, &answer).await?;
            }
            Command::Stats => write_line(&mut output, &stats(&state)).await?,
            Command::Hold => {
                {
                    let mut s = lock(&state);
                    s.holding = true;
                    s.lost_holding = 0;
                }
                write_line(&mut output, &stats(&state)).await?;
            }
            Command::Close => {
                if let Some(task) = opening.take() {
                    task.abort();
                }
                fleet.close().await;
                write_line(&mut output, &stats(&state)).await?;
            }
        }
    }
    if let Some(task) = opening.take() {
        task.abort();
    }
    fleet.close().await;
    watcher.abort();
    Ok(())
}

type Made = (
    Arc<dyn Fleet>,
    transport_core::events::EventReceiver,
    Arc<Counters>,
);

async fn make_fleet(transport: &dyn Transport, config: &WorkerConfig) -> Result<Made, WorkerError> {
    let (events, rx) = transport_core::events::channel();
    let counters = Arc::new(Counters::default());
    let fleet = transport
        .fleet(FleetConfig {
            server: config.server,
            identity: config.identity.clone(),
            first: config.first,
            devices: config.count,
            events,
            counters: counters.clone(),
        })
        .await?;
    Ok((Arc::from(fleet), rx, counters))
}

fn stats_of(state: &Mutex<State>, counters: &Counters) -> WorkerStats {
    let s = lock(state);
    let not_open_devices = s.links[..s.requested as usize]
        .iter()
        .enumerate()
        .filter(|(_, l)| **l != Link::Open)
        .map(|(i, _)| s.first + i as u32)
        .collect();
    WorkerStats {
        first: s.first,
        requested: s.requested,
        opened: s.opened,
        failed: s.failed,
        errors: s.errors.clone(),
        not_open_devices,
        started_us: s.started_us,
        last_open_us: s.last_open_us,
        lost: s.lost,
        lost_holding: s.lost_holding,
        cpu_s: transport_core::procfs::self_cpu_time()
            .map(|t| t.as_secs_f64())
            .unwrap_or(0.0),
        rss_bytes: transport_core::procfs::rss_bytes(std::process::id()).unwrap_or(0),
        files: procfs::open_files(std::process::id()).unwrap_or(0),
        counters: counters.snapshot(),
    }
}

/// Follow the links' events: a stored first order opens its link; a lost link is counted (and an error while
/// holding: an idle link should stay up on its keep-alive).
async fn watch_events(mut events: transport_core::events::EventReceiver, state: Arc<Mutex<State>>) {
    while let Some(event) = events.recv().await {
        let mut s = lock(&state);
        match event {
            LinkEvent::Stored { device, .. } => s.open(device),
            LinkEvent::Lost { .. } => {
                s.lost += 1;
                if s.holding {
                    s.lost_holding += 1;
                    s.error(
                        "lost while idle".into(),
                        "a link closed without being asked to while it was held idle".into(),
                    );
                }
            }
            _ => {}
        }
    }
}

/// Opening a worker's links in the background.
struct Opening {
    fleet: Arc<dyn Fleet>,
    state: Arc<Mutex<State>>,
    concurrency: usize,
    first_order: Option<FirstOrder>,
    deadline: Instant,
    timeout_s: u64,
}

impl Opening {
    async fn run(self, devices: Range<u32>) {
        let Opening {
            fleet,
            state,
            concurrency,
            first_order,
            deadline,
            timeout_s,
        } = self;
        let opened = stream::iter(devices.clone())
            .map(|device| {
                let fleet = fleet.clone();
                async move { (device, fleet.connect(device).await) }
            })
            .buffer_unordered(concurrency)
            .for_each(|(device, result)| {
                let (fleet, state) = (fleet.clone(), state.clone());
                async move {
                    match result {
                        Ok(()) => match first_order {
                            // Open when the server has stored the device's first order (see watch_events).
                            Some(first) => {
                                let o = order(device, first.run, 0, first.payload_bytes as usize);
                                fleet.send(device, o);
                            }
                            None => lock(&state).open(device),
                        },
                        Err(e) => {
                            lock(&state).fail(device, error_kind(&e), e.to_string());
                            // Stop it retrying in the background: a failed link is not left half open.
                            let _ = fleet.disconnect(device).await;
                        }
                    }
                }
            });
        let in_time = tokio::time::timeout_at(deadline.into(), opened)
            .await
            .is_ok();
        if first_order.is_some() {
            // The answers come as events; wait for them until the deadline.
            while Instant::now() < deadline {
                let settled = {
                    let s = lock(&state);
                    s.opened + s.failed >= s.requested
                };
                if settled {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        } else if in_time {
            return;
        }
        // Whatever is not open by now has failed, and is closed so that it does not go on in the background.
        let late: Vec<u32> = {
            let mut s = lock(&state);
            let late: Vec<u32> = devices
                .filter(|&d| s.slot(d).is_some_and(|l| *l == Link::Opening))
                .collect();
            let what = if first_order.is_some() {
                "no answer to its first order"
            } else {
                "not connected"
            };
            for &device in &late {
                s.fail(
                    device,
                    "timed out".into(),
                    format!("device {device}: {what} within the timeout ({timeout_s} s)"),
                );
            }
            late
        };
        stream::iter(late)
            .for_each_concurrent(concurrency, |device| {
                let fleet = fleet.clone();
                async move {
                    let _ = fleet.disconnect(device).await;
                }
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_opens_or_fails_once_and_each_kind_keeps_its_first_message() {
        let kind = "protocol: handshake".to_string();
        let mut state = State {
            first: 100,
            links: vec![Link::Opening; 3],
            requested: 3,
            opened: 0,
            failed: 0,
            errors: BTreeMap::new(),
            started_us: 1,
            last_open_us: 0,
            lost: 0,
            lost_holding: 0,
            holding: false,
        };
        state.open(100);
        state.fail(101, kind.clone(), "handshake: peer refused".into());
        state.fail(102, kind.clone(), "handshake: timed out".into());
        state.fail(101, kind.clone(), "counted once per link".into());
        state.open(100); // already open
        state.open(99); // not this worker's
        let e = &state.errors[&kind];
        assert_eq!((state.opened, state.failed, e.count), (1, 2, 2));
        assert_eq!(e.example, "handshake: peer refused");
        assert!(state.last_open_us > 0);
    }
}
