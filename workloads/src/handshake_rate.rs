//! **handshake-rate**: `workers` concurrent workers, each opening brand-new links one after another for `duration_s`:
//! a full handshake with the worker's own client identity (its device certificate; no resumption: the TLS configs
//! keep no session cache and take no tickets), one order, its answer, then the link closed. Seed 002's handshake
//! table, on every transport.
//!
//! # One link
//!
//! - **MQTT**: TCP, TLS 1.3 with the device's certificate, CONNECT/CONNACK (`connect_to_ready` ends here), one QoS 1
//!   PUBLISH and its PUBACK (`connect_to_stored`), then DISCONNECT. The client sends nothing after it
//!   [MQTT-3.14.4-2] and waits for the broker to close the network connection (a server SHOULD on receipt of
//!   DISCONNECT), so the server closes first; then it closes its own side [MQTT-3.14.4-1]. A broker that does not
//!   close within 5 s is an `errors_close`.
//! - **QUIC** (quinn, s2n-quic): the QUIC handshake with the device's certificate (`connect_to_ready`), one order on a
//!   bidirectional stream and its answer (`connect_to_stored`), then the device closes the connection with
//!   application code 0. QUIC has no orderly two-way shutdown to make the server go first: a CONNECTION_CLOSE is
//!   one frame, with no TIME_WAIT on either side; the server drains the connection on receipt (RFC 9000, 10.2).
//!   Making the server close first would need one more request and round trip that no QUIC application protocol
//!   has for this, so the client closes, as HTTP/3 clients do.
//! - **Pure** has no handshake and nothing to close. Its counterpart: a brand-new sender per link, a static key the
//!   receiver has never met (one X25519 on the receiver, for its link secret), admitted through an allow-list
//!   prepared for the run: `min(new_senders_per_s × duration_s, max_new_senders)` devices, each used for exactly one
//!   order. `connect_to_ready` does not exist for it; a run that uses up its senders before `duration_s` ends there
//!   and says so (`senders_exhausted`).
//!
//! # Metrics
//!
//! Rates and costs are over the measured window: from the moment the workers start until the last one has finished
//! its last link (workers start no link after `duration_s`). `conn_per_s` counts links whose order was answered.
//! Errors by kind: `errors_connect` (handshake failed or took longer than `timeout_s`), `errors_answer` (no answer
//! within `timeout_s`; it enters `connect_to_stored` at its deadline), `errors_close` (the server did not close as
//! the protocol says), `errors_lost` (a link dropped without being asked); `errors` is their sum.
//!
//! The server's CPU is its own getrusage through its control line; for a broker the runner serves from a child
//! process (mosquitto), the child's utime+stime from `/proc` (10 ms ticks). The server's asymmetric operations per
//! link come from its counters (none for mosquitto, which counts nothing); beside them, what that arithmetic alone
//! costs with this build's code (`asym_cost_*_us`, measured in the load generator just before the window with the
//! code the server calls, on the thread's CPU clock: [`transport_core::Transport::asym_costs`]), so CPU per link can be read against its
//! arithmetic (seed 002's "553 µs of CPU against about 350 µs of arithmetic").
//!
//! # When the load generator is the limit
//!
//! `generator_bound` is 1 when either (a) the load generator (this process: fleet, workers, everything) used at least
//! 90% of one core per runtime thread over the window (`generator_cpu_share` ≥ 0.9), or (b) its runtime could not
//! run ready tasks promptly: a probe that asks to wake every 5 ms was late by 10 ms or more at its 99th percentile
//! (`generator_lag_p99_ms`), so workers were waiting for the generator, not for the server. Either way the rate
//! measures the generator as much as the server.

use crate::harness::{self, Profile, Run, WorkloadError};
use crate::hist;
use crate::sample;
use crate::workload::{Better, Column, Format, Info, Metric, Sweep, Workload};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use transport_core::{BoxFuture, CounterSnapshot, Fleet, LinkEvent, Need, OrderId, Support};

/// The handshake-rate workload's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandshakeRateParams {
    /// Concurrent workers, each with its own device (its own client certificate).
    pub workers: u32,
    /// How long workers start new links, in seconds.
    pub duration_s: u64,
    /// Bytes of payload of each link's one order.
    pub payload_bytes: u32,
    /// Give up on a link's handshake, answer or close after this long (each an error of its kind).
    pub timeout_s: u64,
    /// Pure: new senders per second the allow-list is prepared for (times `duration_s`, at most `max_new_senders`).
    pub new_senders_per_s: u32,
    /// Pure: the most new senders prepared.
    pub max_new_senders: u32,
}

impl HandshakeRateParams {
    /// How many never-met senders Pure gets: enough for the run at the given rate, capped, and at least one per
    /// worker.
    pub fn new_senders(&self) -> u32 {
        let wanted = u64::from(self.new_senders_per_s) * self.duration_s;
        (wanted.min(u64::from(self.max_new_senders)) as u32).max(self.workers)
    }
}

/// The worker counts of seed 002's handshake table.
pub const SEED_WORKERS: [u32; 3] = [32, 64, 128];

/// The handshake-rate workload.
#[derive(Debug, Clone, Copy)]
pub struct HandshakeRate;

const INFO: Info = Info {
    name: "handshake-rate",
    about: "workers open brand-new links one after another (full handshake, own identity, no resumption), one \
            order each, then close (the server first where the protocol allows); Pure: brand-new senders",
    needs: &[],
    metrics: &[
        Metric { key: "workers", unit: "count", about: "concurrent workers (the setting)" },
        Metric { key: "links", unit: "count", about: "links whose order was answered in the window" },
        Metric { key: "conn_per_s", unit: "links/s", about: "links / window_s (Pure: brand-new senders per second)" },
        Metric { key: "window_s", unit: "s", about: "from the workers' start until the last finished its last link" },
        Metric { key: "errors", unit: "count", about: "errors_connect + errors_answer + errors_close + errors_lost" },
        Metric { key: "errors_connect", unit: "count", about: "handshakes that failed or took longer than timeout_s" },
        Metric { key: "errors_answer", unit: "count", about: "orders not answered within timeout_s" },
        Metric { key: "errors_close", unit: "count", about: "links the server did not close as the protocol says" },
        Metric { key: "errors_lost", unit: "count", about: "links that dropped without being asked" },
        Metric { key: "ready_p50_ms", unit: "ms", about: "median of connect_to_ready (not for Pure)" },
        Metric { key: "ready_p99_ms", unit: "ms", about: "99th percentile of connect_to_ready" },
        Metric { key: "stored_p50_ms", unit: "ms", about: "median of connect_to_stored" },
        Metric { key: "stored_p99_ms", unit: "ms", about: "99th percentile of connect_to_stored" },
        Metric { key: "server_cpu_us_per_conn", unit: "µs", about: "server CPU over the window / links" },
        Metric { key: "server_asym_ops_per_conn", unit: "ops", about: "the server's counted asymmetric operations / links" },
        Metric { key: "server_asym_cost_us_per_conn", unit: "µs", about: "what those operations cost with this build's code (asym_cost_* × counts / links)" },
        Metric { key: "server_asym_share", unit: "fraction", about: "server_asym_cost_us_per_conn / server_cpu_us_per_conn" },
        Metric { key: "asym_cost_x25519_us", unit: "µs", about: "one X25519 operation, measured with the server's code" },
        Metric { key: "asym_cost_ecdh_us", unit: "µs", about: "one NIST-curve ECDH operation (keygen and agreement averaged)" },
        Metric { key: "asym_cost_sign_us", unit: "µs", about: "one signature" },
        Metric { key: "asym_cost_verify_us", unit: "µs", about: "one verification with a key parsed for it" },
        Metric { key: "generator_cpu_us_per_conn", unit: "µs", about: "the load generator's CPU over the window / links" },
        Metric { key: "generator_cpu_share", unit: "fraction", about: "the generator's CPU / (its runtime threads × window_s)" },
        Metric { key: "generator_threads", unit: "count", about: "the load generator's runtime threads" },
        Metric { key: "generator_lag_p99_ms", unit: "ms", about: "99th percentile of how late a 5 ms wake-up probe ran" },
        Metric { key: "generator_bound", unit: "0/1", about: "1 if generator_cpu_share ≥ 0.9 or generator_lag_p99_ms ≥ 10" },
        Metric { key: "new_senders_prepared", unit: "count", about: "Pure: never-met senders on the allow-list" },
        Metric { key: "server_cpu_s", unit: "s", about: "the server's CPU over the window" },
        Metric { key: "senders_exhausted", unit: "0/1", about: "Pure: 1 if the prepared senders ran out before duration_s" },
        Metric { key: "lost", unit: "count", about: "orders made that are not in the store's log (never stored; an acknowledged one is also in acked_not_applied)" },
        Metric { key: "duplicates", unit: "count", about: "orders applied more than once" },
    ],
    columns: &[
        Column::new("workers", "workers", Format::Count),
        Column::new("conn/s, median (min-max)", "conn_per_s", Format::Count).higher(),
        Column::new("conn/s, each round", "conn_per_s", Format::Rounds).higher(),
        Column::new("ready p50, ms", "ready_p50_ms", Format::Decimal).lower(),
        Column::new("stored p50, ms", "stored_p50_ms", Format::Decimal).lower(),
        Column::new("stored p99, ms", "stored_p99_ms", Format::Decimal).lower(),
        Column::new("server CPU µs/conn", "server_cpu_us_per_conn", Format::Count).lower(),
        Column::new("server asym ops/conn", "server_asym_ops_per_conn", Format::Decimal).lower(),
        Column::new("their arithmetic µs/conn", "server_asym_cost_us_per_conn", Format::Count).lower(),
        Column::new("generator CPU µs/conn", "generator_cpu_us_per_conn", Format::Count).lower(),
        Column::new("generator-bound rounds", "generator_bound", Format::Sum).lower(),
        Column::new("errors", "errors", Format::Sum).lower(),
        Column::new("lost", "lost", Format::Sum).lower(),
        Column::new("applied twice", "duplicates", Format::Sum).lower(),
    ],
    primary: ("conn_per_s", Better::Higher),
    case_keys: &["workers"],
    sweep: Some(Sweep {
        key: "workers",
        header: "workers",
        shared: &[],
        per_transport: &[
            Column::new("conn/s", "conn_per_s", Format::Count).higher(),
            Column::new("p50 ms", "stored_p50_ms", Format::Decimal).lower(),
            Column::new("errors", "errors", Format::Sum).lower(),
        ],
    }),
};

impl Workload for HandshakeRate {
    type Params = HandshakeRateParams;

    fn info(&self) -> &'static Info {
        &INFO
    }

    /// Seed 002: 32, 64 and 128 workers for 10 s each; quick: 8 workers for 3 s.
    fn cases(&self, profile: Profile) -> Vec<HandshakeRateParams> {
        let base = |workers, duration_s| HandshakeRateParams {
            workers,
            duration_s,
            payload_bytes: 64,
            timeout_s: 10,
            new_senders_per_s: 10_000,
            max_new_senders: 100_000,
        };
        match profile {
            Profile::Quick => vec![HandshakeRateParams {
                max_new_senders: 30_000,
                ..base(8, 3)
            }],
            Profile::Seed => SEED_WORKERS.iter().map(|&w| base(w, 10)).collect(),
        }
    }

    fn check(&self, p: &HandshakeRateParams) -> Result<(), String> {
        if p.workers == 0 || p.workers > 10_000 {
            return Err(format!("workers {}: between 1 and 10000", p.workers));
        }
        if p.duration_s == 0 || p.timeout_s == 0 {
            return Err("duration_s and timeout_s must be at least 1".into());
        }
        if p.new_senders_per_s == 0 || p.max_new_senders == 0 {
            return Err("new_senders_per_s and max_new_senders must be at least 1".into());
        }
        Ok(())
    }

    fn run<'a>(
        &'a self,
        run: &'a mut Run<'_>,
        params: &'a HandshakeRateParams,
    ) -> BoxFuture<'a, Result<(), WorkloadError>> {
        Box::pin(handshake_rate(run, params))
    }
}

/// How each worker's links go: with a handshake and a close, or as brand-new senders (no handshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Handshakes,
    NewSenders,
}

/// Which mode a transport runs in, or why it cannot.
fn mode(run: &Run<'_>) -> Result<Mode, String> {
    let caps = run.capabilities();
    match (caps.handshakes, caps.disconnect) {
        (Support::Yes, Support::Yes) => Ok(Mode::Handshakes),
        (Support::Yes, Support::No(why)) => {
            Err(format!("needs {}: {why}", Need::Disconnect.describe()))
        }
        (Support::No(_), _) => Ok(Mode::NewSenders),
    }
}

/// What every worker shares: the fleet, where answers are routed, what it counts.
struct Shared {
    fleet: Arc<dyn Fleet>,
    mode: Mode,
    params: HandshakeRateParams,
    end: Instant,
    /// Waiting for each order's answer: the time it arrived.
    waiting: Mutex<HashMap<OrderId, oneshot::Sender<Instant>>>,
    /// Pure: the next never-used sender, and how many there are.
    next_sender: AtomicU32,
    senders: u32,
    errors: Errors,
}

#[derive(Default)]
struct Errors {
    connect: AtomicU64,
    answer: AtomicU64,
    close: AtomicU64,
    lost: AtomicU64,
}

/// What one worker measured.
struct Tally {
    ready: Histogram<u64>,
    stored: Histogram<u64>,
    links: u64,
    made: Vec<OrderId>,
    exhausted: bool,
}

async fn handshake_rate(run: &mut Run<'_>, p: &HandshakeRateParams) -> Result<(), WorkloadError> {
    let mode = match mode(run) {
        Ok(m) => m,
        Err(reason) => {
            run.result.skipped = Some(reason);
            return Ok(());
        }
    };
    let devices = match mode {
        Mode::Handshakes => p.workers,
        Mode::NewSenders => p.new_senders(),
    };
    run.prepare(devices)?;
    let addr = run.start_server().await?;
    let f = run.fleet(addr, devices).await?;
    let harness::FleetHandle {
        fleet,
        events,
        counters,
    } = f;

    // The arithmetic's cost with the server's own code, measured before the window (not inside it).
    let costs = run.transport.asym_costs();
    if let Some(c) = &costs {
        for (key, cost) in [
            ("asym_cost_x25519_us", c.x25519_us),
            ("asym_cost_ecdh_us", c.ecdh_us),
            ("asym_cost_sign_us", c.sign_us),
            ("asym_cost_verify_us", c.verify_us),
        ] {
            if let Some(us) = cost {
                run.metric(key, us);
            }
        }
    }
    run_with(run, p, mode, devices, fleet, events, counters, costs).await
}

#[allow(clippy::too_many_arguments)]
async fn run_with(
    run: &mut Run<'_>,
    p: &HandshakeRateParams,
    mode: Mode,
    devices: u32,
    fleet: Arc<dyn Fleet>,
    events: transport_core::events::EventReceiver,
    counters: Arc<transport_core::Counters>,
    costs: Option<transport_core::AsymCosts>,
) -> Result<(), WorkloadError> {
    // A broker served from a child process (mosquitto) has its CPU read from /proc and no counters of its own.
    let external = run.server()?.ready().serving_pid.is_some();
    let serving_pid = run.server()?.serving_pid();
    let server_cpu = |stats: &harness::ServerStats| -> Result<Duration, WorkloadError> {
        if external {
            Ok(sample::cpu_time(serving_pid)?)
        } else {
            Ok(Duration::from_secs_f64(stats.cpu_s))
        }
    };
    let before = run.server_stats().await?;
    let server_cpu0 = server_cpu(&before)?;
    let client0 = counters.snapshot();
    let self0 = sample::self_cpu_time()?;
    let threads = tokio::runtime::Handle::current().metrics().num_workers();

    let start = Instant::now();
    let shared = Arc::new(Shared {
        fleet: fleet.clone(),
        mode,
        params: p.clone(),
        end: start + Duration::from_secs(p.duration_s),
        waiting: Mutex::new(HashMap::new()),
        next_sender: AtomicU32::new(0),
        senders: devices,
        errors: Errors::default(),
    });
    let acked: Arc<Mutex<Vec<OrderId>>> = Arc::default();
    let dispatcher = tokio::spawn(dispatch(events, shared.clone(), acked.clone()));
    let (lag_stop, lag_stopped) = oneshot::channel();
    let lag = tokio::spawn(lag_probe(lag_stopped));
    let workers: Vec<_> = (0..p.workers)
        .map(|w| tokio::spawn(worker(w, shared.clone())))
        .collect();
    let mut tally = Tally::new();
    for w in workers {
        let t = w
            .await
            .map_err(|e| WorkloadError::Params(format!("a worker failed: {e}")))?;
        tally.merge(t);
    }
    let window = start.elapsed();
    let self1 = sample::self_cpu_time()?;
    let _ = lag_stop.send(());
    let lag = lag.await.unwrap_or_else(|_| hist::new());
    let after = run.server_stats().await?;
    let server_cpu1 = server_cpu(&after)?;
    let client = counters.snapshot().since(&client0);
    dispatcher.abort();
    fleet.close().await;
    run.server()?.shutdown().await?;
    let acked = std::mem::take(&mut *acked.lock().unwrap_or_else(|e| e.into_inner()));
    run.audit(&tally.made, &acked)?;

    let e = &shared.errors;
    let errors = [&e.connect, &e.answer, &e.close, &e.lost].map(|c| c.load(Ordering::Relaxed));
    let links = tally.links as f64;
    let window_s = window.as_secs_f64();
    let per_link = |x: f64| x / links.max(1.0);
    run.metric("workers", p.workers);
    run.metric("links", tally.links);
    run.metric("window_s", window_s);
    if tally.links > 0 {
        run.metric("conn_per_s", links / window_s);
    }
    run.metric("errors", errors.iter().sum::<u64>());
    for (key, n) in [
        "errors_connect",
        "errors_answer",
        "errors_close",
        "errors_lost",
    ]
    .into_iter()
    .zip(errors)
    {
        run.metric(key, n);
    }
    if mode == Mode::NewSenders {
        run.metric("senders_exhausted", u64::from(tally.exhausted));
        run.metric("new_senders_prepared", devices);
    } else {
        run.metric("ready_p50_ms", hist::quantile_ms(&tally.ready, 0.5));
        run.metric("ready_p99_ms", hist::quantile_ms(&tally.ready, 0.99));
        run.histogram("connect_to_ready", &tally.ready);
    }
    run.metric("stored_p50_ms", hist::quantile_ms(&tally.stored, 0.5));
    run.metric("stored_p99_ms", hist::quantile_ms(&tally.stored, 0.99));
    run.histogram("connect_to_stored", &tally.stored);

    let server_cpu_us = server_cpu1.saturating_sub(server_cpu0).as_secs_f64() * 1e6;
    run.metric("server_cpu_s", server_cpu_us / 1e6);
    run.metric("server_cpu_us_per_conn", per_link(server_cpu_us));
    if !external {
        let ops = after.counters.since(&before.counters);
        record_arithmetic(run, &ops, costs.as_ref(), links, server_cpu_us);
        run.counters("server_", &ops);
    }
    run.counters("client_", &client);

    let generator_cpu = (self1 - self0).as_secs_f64();
    let share = generator_cpu / (threads.max(1) as f64 * window_s);
    let lag_p99 = hist::quantile_ms(&lag, 0.99);
    run.metric("generator_cpu_us_per_conn", per_link(generator_cpu * 1e6));
    run.metric("generator_cpu_share", share);
    run.metric("generator_threads", threads);
    run.metric("generator_lag_p99_ms", lag_p99);
    run.metric(
        "generator_bound",
        u64::from(generator_bound(share, lag_p99)),
    );
    run.histogram("generator_lag", &lag);
    Ok(())
}

/// The server's asymmetric operations per link and, where every kind has a measured cost, what they cost.
fn record_arithmetic(
    run: &mut Run<'_>,
    ops: &CounterSnapshot,
    costs: Option<&transport_core::AsymCosts>,
    links: f64,
    server_cpu_us: f64,
) {
    if links == 0.0 {
        return;
    }
    run.metric("server_asym_ops_per_conn", ops.asym_ops() as f64 / links);
    if let Some(total) = costs.and_then(|c| c.cost_of(ops)) {
        let per = total / links;
        run.metric("server_asym_cost_us_per_conn", per);
        if server_cpu_us > 0.0 {
            run.metric("server_asym_share", per / (server_cpu_us / links));
        }
    }
}

/// Whether the load generator, rather than the server, limited the run (see the module docs).
pub fn generator_bound(cpu_share: f64, lag_p99_ms: f64) -> bool {
    cpu_share >= 0.9 || lag_p99_ms >= 10.0
}

/// Route each answer to the worker waiting for it; count links lost.
async fn dispatch(
    mut events: transport_core::events::EventReceiver,
    shared: Arc<Shared>,
    acked: Arc<Mutex<Vec<OrderId>>>,
) {
    while let Some(event) = events.recv().await {
        match event {
            LinkEvent::Stored { id, at, .. } => {
                acked.lock().unwrap_or_else(|e| e.into_inner()).push(id);
                let waiter = shared
                    .waiting
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
                if let Some(w) = waiter {
                    let _ = w.send(at);
                }
            }
            LinkEvent::Lost { .. } => {
                shared.errors.lost.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

/// How late a task that asks to wake every 5 ms runs, until stopped.
async fn lag_probe(mut stop: oneshot::Receiver<()>) -> Histogram<u64> {
    let mut h = hist::new();
    let period = Duration::from_millis(5);
    let mut next = tokio::time::Instant::now() + period;
    loop {
        tokio::select! {
            _ = &mut stop => return h,
            () = tokio::time::sleep_until(next) => {
                let now = tokio::time::Instant::now();
                hist::record(&mut h, now.saturating_duration_since(next));
                next = now + period;
            }
        }
    }
}

impl Tally {
    fn new() -> Self {
        Tally {
            ready: hist::new(),
            stored: hist::new(),
            links: 0,
            made: Vec::new(),
            exhausted: false,
        }
    }

    fn merge(&mut self, other: Tally) {
        let _ = self.ready.add(&other.ready);
        let _ = self.stored.add(&other.stored);
        self.links += other.links;
        self.made.extend(other.made);
        self.exhausted |= other.exhausted;
    }
}

/// One worker: brand-new links one after another until the window's end.
async fn worker(w: u32, s: Arc<Shared>) -> Tally {
    let mut tally = Tally::new();
    let timeout = Duration::from_secs(s.params.timeout_s);
    let run = harness::new_run();
    let mut seq = 0u64;
    while Instant::now() < s.end {
        let device = match s.mode {
            Mode::Handshakes => w,
            Mode::NewSenders => {
                let d = s.next_sender.fetch_add(1, Ordering::Relaxed);
                if d >= s.senders {
                    tally.exhausted = true;
                    break;
                }
                d
            }
        };
        let t0 = Instant::now();
        if s.mode == Mode::Handshakes {
            match tokio::time::timeout(timeout, s.fleet.connect(device)).await {
                Ok(Ok(())) => hist::record(&mut tally.ready, t0.elapsed()),
                _ => {
                    s.errors.connect.fetch_add(1, Ordering::Relaxed);
                    // Stop the device from trying again on its own; the next link starts afresh.
                    let _ = tokio::time::timeout(timeout, s.fleet.disconnect(device)).await;
                    continue;
                }
            }
        }
        let order = harness::order(device, run, seq, s.params.payload_bytes as usize);
        seq += 1;
        let (tx, rx) = oneshot::channel();
        s.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(order.id, tx);
        tally.made.push(order.id);
        let id = order.id;
        s.fleet.send(device, order);
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(at)) => {
                hist::record(&mut tally.stored, at.saturating_duration_since(t0));
                tally.links += 1;
            }
            _ => {
                s.waiting
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
                s.errors.answer.fetch_add(1, Ordering::Relaxed);
                // Never hidden: an unanswered order counts at its deadline.
                hist::record(&mut tally.stored, timeout);
            }
        }
        if s.mode == Mode::Handshakes {
            match tokio::time::timeout(timeout, s.fleet.disconnect(device)).await {
                Ok(Ok(())) => {}
                _ => {
                    s.errors.close.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    tally
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pure_gets_enough_senders_for_the_run_capped_and_one_per_worker_at_least() {
        let p = HandshakeRate.cases(Profile::Quick).remove(0);
        assert_eq!(p.new_senders(), 30_000);
        let p = HandshakeRateParams {
            new_senders_per_s: 100,
            duration_s: 2,
            ..p
        };
        assert_eq!(p.new_senders(), 200);
        let p = HandshakeRateParams { workers: 500, ..p };
        assert_eq!(p.new_senders(), 500);
    }

    #[test]
    fn the_seed_profile_sweeps_the_seed_worker_counts() {
        let workers: Vec<u32> = HandshakeRate
            .cases(Profile::Seed)
            .iter()
            .map(|p| p.workers)
            .collect();
        assert_eq!(workers, SEED_WORKERS);
        for p in HandshakeRate.cases(Profile::Seed) {
            assert!(HandshakeRate.check(&p).is_ok());
        }
        let bad = HandshakeRateParams {
            workers: 0,
            ..HandshakeRate.cases(Profile::Quick).remove(0)
        };
        assert!(HandshakeRate.check(&bad).is_err());
    }

    #[test]
    fn the_generator_is_the_limit_when_busy_or_late() {
        assert!(!generator_bound(0.5, 1.0));
        assert!(generator_bound(0.95, 1.0));
        assert!(generator_bound(0.2, 12.0));
        assert!(!generator_bound(0.89, 9.9));
    }

    #[test]
    fn every_column_and_sweep_column_is_a_documented_metric() {
        let info = HandshakeRate.info();
        let documented = |k: &str| info.metrics.iter().any(|m| m.key == k);
        for c in info.columns.iter().chain(info.sweep.unwrap().per_transport) {
            assert!(documented(c.metric), "{}", c.metric);
        }
    }
}
