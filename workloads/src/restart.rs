//! **restart**: `devices` devices each make an order every `period_ms`; at `kill_at_s` the server is killed with
//! SIGKILL and started again at once on the same port with the same identity and store; the run lasts
//! `duration_s`, then waits until every order is answered.
//!
//! Load is open loop: order `seq` of device `d` has the intended time `start + (seq·devices + d)·period/devices`
//! (devices spread evenly over the period), its `made_us` is that time, and latency counts from it, so a stalled
//! server is not hidden by devices that stopped sending (no coordinated omission). The orders go out from a task
//! of their own, each at its intended time ([`Pacer`]); killing and starting the server and reading its statistics
//! happen elsewhere, never on the send path. Each send's lag behind its time is the histogram `send_lag`, and a run
//! whose generator lagged or was saturated is marked `generator_bound` ([`crate::lag`]).
//!
//! Metrics: `orders_made`, `orders_acked`, `orders_applied`, `lost`, `duplicates` (store audit, read from the log);
//! `up_ms` (kill to ready line). One definition for every transport, against the offered rate and one absolute
//! threshold `late_ms`: `slow_bins` (100 ms bins in the 10 s after the kill, while devices still make orders, that
//! stored less than half the offered rate `offered_per_bin`, from the log's commit times); `late_orders`,
//! `late_pct` (orders answered more than `late_ms` after their intended time, or never); `on_time_again_s` (from
//! the kill to the answer of the last late order: from then on every order is answered within `late_ms`);
//! `server_cpu_s_after`, `client_cpu_s_after` (CPU in the 10 s after the restart); `asym_ops_after`,
//! `handshakes_after`, `resumed_after` (the restarted server's counters over those 10 s: with a `:resume` variant the
//! devices' reconnects resume their TLS sessions, and the asymmetric operations fall); `resent`, `reconnects` (the devices'
//! counters from the kill to the end); `make_to_stored_p50_ms`/`_p99_ms`/`_max_ms` and the histogram
//! `make_to_stored` (an order never answered counts at the deadline); `unanswered`, `timed_out`; `timeline` (orders
//! stored per 100 ms bin, whole run, from the log); `kill_bin` (the timeline bin of the kill); `send_lag_p50_ms`,
//! `_p99_ms`, `_max_ms`, `generator_busy`, `generator_bound`.

use crate::harness::{self, Profile, Run, WorkloadError};
use crate::hist;
use crate::lag::{self, GeneratorLoad, Pacer};
use crate::sample;
use crate::workload::{Better, Column, Format, Info, Metric, Workload};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use transport_core::{BoxFuture, LinkEvent, Need, Order, OrderId};

/// The restart workload's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestartParams {
    /// Devices, each with its own key or identity and its own link.
    pub devices: u32,
    /// Each device makes one order per period.
    pub period_ms: u64,
    /// When the server is killed, from the start of the load.
    pub kill_at_s: f64,
    /// How long devices make orders.
    pub duration_s: f64,
    /// Bytes of payload per order.
    pub payload_bytes: u32,
    /// After the load, how long to wait for the last answers.
    pub drain_timeout_s: u64,
    /// An order answered later than this after its intended time is late, whatever the transport.
    #[serde(default = "default_late_ms")]
    pub late_ms: u64,
}

/// The default of [`RestartParams::late_ms`]: one second.
fn default_late_ms() -> u64 {
    1_000
}

/// The restart workload.
#[derive(Debug, Clone, Copy)]
pub struct Restart;

const INFO: Info = Info {
    name: "restart",
    about: "devices each send an order every period; the server is killed (SIGKILL) and started again at once",
    needs: &[Need::StoredAnswers],
    metrics: &[
        Metric { key: "orders_made", unit: "count", about: "orders the devices made" },
        Metric { key: "orders_acked", unit: "count", about: "orders answered \"stored\"" },
        Metric { key: "up_ms", unit: "ms", about: "kill to the restarted server's ready line" },
        Metric { key: "slow_bins", unit: "count", about: "100 ms bins in the 10 s after the kill that stored less than half the offered rate" },
        Metric { key: "offered_per_bin", unit: "orders per 100 ms", about: "the rate the devices offer" },
        Metric { key: "late_orders", unit: "count", about: "orders answered more than late_ms after their intended time, or never" },
        Metric { key: "late_pct", unit: "%", about: "late orders, of all orders made" },
        Metric { key: "on_time_again_s", unit: "s", about: "kill to the answer of the last late order" },
        Metric { key: "server_cpu_s_after", unit: "s", about: "server CPU in the 10 s after the restart" },
        Metric { key: "client_cpu_s_after", unit: "s", about: "load generator CPU in the same 10 s" },
        Metric { key: "asym_ops_after", unit: "count", about: "the restarted server's asymmetric operations over those 10 s" },
        Metric { key: "handshakes_after", unit: "count", about: "the restarted server's handshakes over those 10 s" },
        Metric { key: "resumed_after", unit: "count", about: "of those handshakes, the ones that resumed a TLS session" },
        Metric { key: "resent_timeout", unit: "count", about: "records sent again on the same link after the re-send timer (from the kill)" },
        Metric { key: "resent_reconnect", unit: "count", about: "orders sent again on a new connection (from the kill)" },
        Metric { key: "reconnects", unit: "count", about: "links opened again after they dropped (from the kill)" },
        Metric { key: "make_to_stored_p99_ms", unit: "ms", about: "99th percentile from an order's intended time to its answer" },
        Metric { key: "make_to_stored_max_ms", unit: "ms", about: "the slowest order, intended time to answer" },
        Metric { key: "timeline", unit: "orders per 100 ms", about: "orders stored per 100 ms bin, from the log" },
        Metric { key: "unanswered", unit: "count", about: "orders never answered (in the histogram at the deadline)" },
        Metric { key: "timed_out", unit: "0/1", about: "1 if some orders were not answered before the timeout" },
        Metric { key: "send_lag_p99_ms", unit: "ms", about: "99th percentile of each send's lag behind its intended time" },
        Metric { key: "generator_busy", unit: "fraction", about: "the generator's CPU over the load / its length and CPUs" },
        Metric { key: "generator_bound", unit: "0/1", about: "1 if the generator lagged or was saturated" },
        Metric { key: "lost", unit: "count", about: "orders made that are not in the store's log (never stored; an acknowledged one is also in acked_not_applied)" },
        Metric { key: "duplicates", unit: "count", about: "orders applied more than once" },
    ],
    columns: &[
        Column::new("up again, ms", "up_ms", Format::Decimal).lower(),
        Column::new("100 ms bins under half the offered rate", "slow_bins", Format::Count).lower(),
        Column::new("late (over late_ms), %", "late_pct", Format::Decimal).lower(),
        Column::new("on time again, s", "on_time_again_s", Format::Decimal).lower(),
        Column::new("server CPU s, 10 s after", "server_cpu_s_after", Format::Decimal).lower(),
        Column::new("asymmetric ops after", "asym_ops_after", Format::Count).lower(),
        Column::new("handshakes after", "handshakes_after", Format::Count).lower(),
        Column::new("resumed", "resumed_after", Format::Count).higher(),
        Column::new("client CPU s, same 10 s", "client_cpu_s_after", Format::Decimal).lower(),
        Column::new("re-sent (timer)", "resent_timeout", Format::Count).lower(),
        Column::new("re-sent (new connection)", "resent_reconnect", Format::Count).lower(),
        Column::new("reconnects", "reconnects", Format::Count).lower(),
        Column::new("to stored p99, ms", "make_to_stored_p99_ms", Format::Decimal).lower(),
        Column::new("to stored max, ms", "make_to_stored_max_ms", Format::Decimal).lower(),
        Column::new("send lag p99, ms", "send_lag_p99_ms", Format::Decimal),
        Column::new("orders", "orders_made", Format::Count),
        Column::new("lost", "lost", Format::Sum).lower(),
        Column::new("applied twice", "duplicates", Format::Sum).lower(),
    ],
    primary: ("make_to_stored_p99_ms", Better::Lower),
    case_keys: &[],
    sweep: None,
};

impl Workload for Restart {
    type Params = RestartParams;

    fn info(&self) -> &'static Info {
        &INFO
    }

    /// Seed 095's M2 (10,000 devices, an order every 5 s each, kill at 21 s) or a CI-sized run.
    fn cases(&self, profile: Profile) -> Vec<RestartParams> {
        vec![match profile {
            Profile::Seed => RestartParams {
                devices: 10_000,
                period_ms: 5_000,
                kill_at_s: 21.0,
                duration_s: 33.0,
                payload_bytes: 64,
                drain_timeout_s: 60,
                late_ms: default_late_ms(),
            },
            Profile::Quick => RestartParams {
                devices: 200,
                period_ms: 1_000,
                kill_at_s: 3.0,
                duration_s: 7.0,
                payload_bytes: 64,
                drain_timeout_s: 30,
                late_ms: default_late_ms(),
            },
        }]
    }

    fn check(&self, p: &RestartParams) -> Result<(), String> {
        if p.devices == 0 || p.period_ms == 0 {
            return Err("devices and period_ms must be at least 1".into());
        }
        if !(p.kill_at_s > 0.0 && p.kill_at_s < p.duration_s) {
            return Err("kill_at_s must be after the start and before duration_s".into());
        }
        if p.late_ms == 0 {
            return Err("late_ms must be at least 1".into());
        }
        Ok(())
    }

    fn run<'a>(
        &'a self,
        run: &'a mut Run<'_>,
        params: &'a RestartParams,
    ) -> BoxFuture<'a, Result<(), WorkloadError>> {
        Box::pin(restart(run, params))
    }
}

/// The width of a timeline bin.
pub const BIN: Duration = Duration::from_millis(100);
/// The window after the restart in which CPU, operations and stalls are counted.
pub const AFTER: Duration = Duration::from_secs(10);

/// Run one round of the restart workload.
async fn restart(run: &mut Run<'_>, p: &RestartParams) -> Result<(), WorkloadError> {
    run.prepare(p.devices)?;
    let addr = run.start_server().await?;
    let mut f = run.fleet(addr, p.devices).await?;
    run.say(&format!("connecting {} devices", p.devices));
    f.connect_all(p.devices).await?;

    let runs: Vec<u64> = (0..p.devices).map(|_| harness::new_run()).collect();
    let sender_ids: Vec<u64> = (0..p.devices)
        .map(transport_core::device_sender_id)
        .collect();
    let period = Duration::from_millis(p.period_ms);
    let total = (p.duration_s * 1000.0 / p.period_ms as f64 * p.devices as f64).round() as u64;
    let kill_at = Duration::from_secs_f64(p.kill_at_s);
    let devices = p.devices;
    let slot = move |i: u64| {
        Duration::from_nanos((i as u128 * period.as_nanos() / devices as u128) as u64)
    };

    let sampler = sample::Sampler::start(run.server()?.serving_pid(), BIN);
    let start = Instant::now();
    let start_us = harness::unix_us();
    // The send path is a task of its own, paced by each order's intended time: killing and starting the server
    // and reading its statistics happen here, off it, and every send's lag behind its time is recorded.
    let mut sending = {
        let fleet = f.fleet.clone();
        let payload_bytes = p.payload_bytes as usize;
        tokio::spawn(async move {
            let mut pacer = Pacer::new(start);
            let mut made: Vec<OrderId> = Vec::with_capacity(total as usize);
            for next in 0..total {
                let at = slot(next);
                pacer.until(at).await;
                let d = (next % devices as u64) as u32;
                let id = OrderId {
                    sender: sender_ids[d as usize],
                    run: runs[d as usize],
                    seq: next / devices as u64,
                };
                let made_us = start_us + at.as_micros() as u64;
                let payload = harness::payload(&id, payload_bytes);
                fleet.send(
                    d,
                    Order {
                        id,
                        made_us,
                        payload,
                    },
                );
                pacer.sent(at);
                made.push(id);
            }
            (made, pacer.into_lag())
        })
    };
    let mut sent: Option<(Vec<OrderId>, lag::SendLag)> = None;
    let mut acked: Vec<OrderId> = Vec::with_capacity(total as usize);
    let mut latency = hist::new();
    let mut killed: Option<Instant> = None;
    let mut up: Option<Instant> = None;
    // (schedule position, answer time) of every answer, for lateness.
    let mut answers: Vec<(u64, Instant)> = Vec::with_capacity(total as usize);
    let mut client_at_kill = f.counters.snapshot();
    let mut after: Option<transport_core::CounterSnapshot> = None;
    let record = |id: OrderId,
                  device: u32,
                  at: Instant,
                  latency: &mut hdrhistogram::Histogram<u64>,
                  answers: &mut Vec<(u64, Instant)>,
                  acked: &mut Vec<OrderId>| {
        let pos = id.seq * devices as u64 + device as u64;
        hist::record(latency, at.saturating_duration_since(start + slot(pos)));
        answers.push((pos, at));
        acked.push(id);
    };
    let far = start + Duration::from_secs(365 * 24 * 3600);

    // Collect answers while the orders go out; kill and restart the server on time; read the restarted server's
    // counters at the end of its window.
    let mut events_open = true;
    while sent.is_none() {
        let after_due = match (up, &after) {
            (Some(t_up), None) => t_up + AFTER,
            _ => far,
        };
        tokio::select! {
            ev = f.events.recv(), if events_open => {
                match ev {
                    Some(LinkEvent::Stored { device, id, at }) => {
                        record(id, device, at, &mut latency, &mut answers, &mut acked)
                    }
                    Some(_) => {}
                    None => events_open = false,
                }
            }
            _ = tokio::time::sleep_until((start + kill_at).into()), if killed.is_none() => {
                client_at_kill = f.counters.snapshot();
                let t_kill = run.restart_server().await?;
                let t_up = Instant::now();
                sampler.set_pid(run.server()?.serving_pid());
                run.say(&format!(
                    "killed, up again in {:.1} ms",
                    (t_up - t_kill).as_secs_f64() * 1e3
                ));
                killed = Some(t_kill);
                up = Some(t_up);
            }
            _ = tokio::time::sleep_until(after_due.into()), if after_due < far => {
                after = Some(run.server_stats().await?.counters);
            }
            done = &mut sending => {
                sent = Some(done.map_err(|e| WorkloadError::Params(format!("the send task failed: {e}")))?);
            }
        }
    }
    let (made, send_lag) = sent.expect("the loop ends when sending does");
    let load_end = Instant::now();

    // The load is over: wait for the last answers.
    let deadline = Instant::now() + Duration::from_secs(p.drain_timeout_s);
    while acked.len() < made.len() {
        if let (Some(t_up), None) = (up, &after) {
            if t_up.elapsed() >= AFTER {
                after = Some(run.server_stats().await?.counters);
            }
        }
        match tokio::time::timeout_at(deadline.into(), f.events.recv()).await {
            Ok(Some(LinkEvent::Stored { device, id, at })) => {
                record(id, device, at, &mut latency, &mut answers, &mut acked)
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    let timed_out = acked.len() < made.len();
    if after.is_none() {
        // A run shorter than the window: the counters at the end, sampled now.
        after = Some(run.server_stats().await?.counters);
    }
    let client_end = f.counters.snapshot();
    let samples = sampler.stop().await;
    f.fleet.close().await;
    run.stop_server().await?;
    // An order never answered counts in the histogram at the deadline (from its intended time), so it is never
    // hidden.
    let answered: std::collections::HashSet<OrderId> = acked.iter().copied().collect();
    let mut unanswered = 0usize;
    // (intended time, answer time) of every order; one never answered at the deadline.
    let mut outcomes: Vec<(Instant, Instant)> = answers
        .iter()
        .map(|&(pos, at)| (start + slot(pos), at))
        .collect();
    for (pos, id) in made.iter().enumerate() {
        if !answered.contains(id) {
            unanswered += 1;
            let intended = start + slot(pos as u64);
            hist::record(&mut latency, deadline.saturating_duration_since(intended));
            outcomes.push((intended, deadline));
        }
    }
    let late = Duration::from_millis(p.late_ms);
    let late_count = late_orders(&outcomes, late);
    let load_ms = load_end.duration_since(start).as_millis() as u64;
    let load = GeneratorLoad {
        cpu_s: sample::cpu_between(&samples, 0, load_ms).1,
        wall_s: load_ms as f64 / 1e3,
        cpus: run.harness.provenance.pinning.generator_cpu_count(),
        server_busy: None,
    };
    lag::record(run, Some(&send_lag), &load);

    let entries = run.log_entries()?;
    let audit = transport_store::Audit::of_entries(&entries, &made, &acked);
    let mut timeline = vec![0u64; ((p.duration_s + p.drain_timeout_s as f64) * 10.0) as usize + 1];
    let mut last_bin = 0;
    for e in &entries {
        let bin = (e.stored_us.saturating_sub(start_us) / BIN.as_micros() as u64) as usize;
        if bin < timeline.len() {
            timeline[bin] += 1;
            last_bin = last_bin.max(bin);
        }
    }
    timeline.truncate(last_bin + 1);

    run.record_audit(&audit);
    run.metric("orders_made", audit.made);
    run.metric("orders_acked", audit.acked);
    run.metric("orders_applied", audit.applied);
    run.metric("unanswered", unanswered);
    run.metric("timed_out", u64::from(timed_out));
    run.metric("late_orders", late_count);
    run.metric(
        "late_pct",
        100.0 * late_count as f64 / outcomes.len().max(1) as f64,
    );
    let offered = offered_per_bin(p);
    run.metric("offered_per_bin", offered);
    if let (Some(t_kill), Some(t_up)) = (killed, up) {
        let kill_ms = t_kill.duration_since(start).as_millis() as u64;
        let up_ms = t_up.duration_since(t_kill).as_secs_f64() * 1e3;
        let kill_bin = (kill_ms / BIN.as_millis() as u64) as usize;
        let load_end_bin = (p.duration_s * 1000.0 / BIN.as_millis() as f64) as usize;
        let up_rel = t_up.duration_since(start).as_millis() as u64;
        let (server_after, client_after) =
            sample::cpu_between(&samples, up_rel, up_rel + AFTER.as_millis() as u64);
        run.metric("up_ms", up_ms);
        run.metric("kill_bin", kill_bin);
        run.metric(
            "slow_bins",
            slow_bins(&timeline, kill_bin, load_end_bin, offered),
        );
        run.metric("on_time_again_s", on_time_again_s(&outcomes, t_kill, late));
        run.metric("server_cpu_s_after", server_after);
        run.metric("client_cpu_s_after", client_after);
    }
    let after = after.expect("read above");
    run.metric("asym_ops_after", after.asym_ops());
    run.metric("handshakes_after", after.handshakes);
    run.metric("resumed_after", after.resumed);
    let client = client_end.since(&client_at_kill);
    run.metric("resent_timeout", client.resent_timeout);
    run.metric("resent_reconnect", client.resent_reconnect);
    run.metric("reconnects", client.reconnects);
    run.metric("make_to_stored_p50_ms", hist::quantile_ms(&latency, 0.5));
    run.metric("make_to_stored_p99_ms", hist::quantile_ms(&latency, 0.99));
    run.metric("make_to_stored_max_ms", latency.max() as f64 / 1e3);
    run.metric("timeline", serde_json::json!(timeline));
    run.counters("server_after_", &after);
    run.counters("client_", &client_end);
    run.histogram("make_to_stored", &latency);
    Ok(())
}

/// Orders the devices offer per timeline bin: `devices` per `period_ms`.
pub fn offered_per_bin(p: &RestartParams) -> f64 {
    f64::from(p.devices) * BIN.as_secs_f64() * 1e3 / p.period_ms as f64
}

/// The bins after the kill's own bin (a partial one), within [`AFTER`] of it and while devices still make orders
/// (before `load_end_bin`), that stored less than half of `offered` orders. A trickle is a stall too: a server that
/// stores a few orders per bin while thousands wait scores the same as one that stores none. A bin past the end of
/// `timeline` stored nothing.
pub fn slow_bins(timeline: &[u64], kill_bin: usize, load_end_bin: usize, offered: f64) -> usize {
    let window = (AFTER.as_millis() / BIN.as_millis()) as usize;
    (kill_bin + 1..(kill_bin + 1 + window).min(load_end_bin))
        .filter(|&b| (timeline.get(b).copied().unwrap_or(0) as f64) < offered / 2.0)
        .count()
}

/// The orders answered more than `late` after their intended time, of `(intended, answered)` pairs (an order never
/// answered is given at the deadline).
pub fn late_orders(outcomes: &[(Instant, Instant)], late: Duration) -> usize {
    outcomes
        .iter()
        .filter(|(intended, at)| at.saturating_duration_since(*intended) > late)
        .count()
}

/// From the kill to the answer of the last late order answered after it (late: more than `late` after its intended
/// time; an order never answered counts at the deadline it is given): from then on, every order is answered within
/// `late`. The same threshold for every transport, so a transport that barely notices the kill scores 0, and a
/// reconnect storm shows as seconds. 0 if no order was late after the kill.
pub fn on_time_again_s(outcomes: &[(Instant, Instant)], kill: Instant, late: Duration) -> f64 {
    outcomes
        .iter()
        .filter(|(intended, at)| *at >= kill && at.saturating_duration_since(*intended) > late)
        .map(|(_, at)| at.saturating_duration_since(kill).as_secs_f64())
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ms` after `t0`.
    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn a_trickle_during_the_stall_counts_as_slow() {
        // 20 orders offered per bin; the kill is in bin 30; the load ends at bin 70.
        let mut timeline = vec![20u64; 80];
        // Nothing stored for 3 bins, then a trickle of 2 and of 9 (under half), then 10 (half: not slow), then a
        // burst of catch-up.
        timeline[31..34].fill(0);
        timeline[34] = 2;
        timeline[35] = 9;
        timeline[36] = 10;
        timeline[37] = 60;
        assert_eq!(slow_bins(&timeline, 30, 70, 20.0), 5);
        // A transport that stored a trickle in every bin instead of nothing scores the same as one that stored
        // nothing: the old count (bins with nothing stored) gave it 0.
        let mut trickle = vec![20u64; 80];
        trickle[31..36].fill(1);
        assert_eq!(slow_bins(&trickle, 30, 70, 20.0), 5);
        // The kill's own bin does not count, nor bins after the load ended or beyond the window; a missing bin
        // (the timeline stops where the log does) stored nothing.
        let mut short = vec![20u64; 40];
        short[30] = 0;
        assert_eq!(slow_bins(&short, 30, 45, 20.0), 45 - 40);
        assert_eq!(slow_bins(&vec![0; 300], 30, 300, 20.0), 100);
    }

    #[test]
    fn late_is_one_absolute_threshold_and_on_time_again_ends_with_the_last_late_answer() {
        let t0 = Instant::now();
        let kill = at(t0, 1000);
        let late = Duration::from_millis(1000);
        // Orders every 10 ms. Before the kill every order takes 5 ms; orders 95..120 wait for the restart and are
        // answered at 2.5 s; order 150 takes 1.2 s (late); every other order 5 ms.
        let mut outcomes: Vec<(Instant, Instant)> = (0..300)
            .map(|p| (at(t0, p * 10), at(t0, p * 10 + 5)))
            .collect();
        for p in 95..120 {
            outcomes[p as usize].1 = at(t0, 2500);
        }
        outcomes[150].1 = at(t0, 1500 + 1200);
        // Late: 95..120 (1.31-1.55 s) and 150 (1.2 s).
        assert_eq!(late_orders(&outcomes, late), 26);
        let c = on_time_again_s(&outcomes, kill, late);
        assert!((c - 1.7).abs() < 1e-9, "{c}");
        // The same answers under a threshold of 2 s: nothing late, 0 (never each transport's own p99).
        let lenient = Duration::from_secs(2);
        assert_eq!(late_orders(&outcomes, lenient), 0);
        assert_eq!(on_time_again_s(&outcomes, kill, lenient), 0.0);
        // An order never answered is given at the deadline: late, and on time again only then.
        let deadline = at(t0, 40_000);
        outcomes[200].1 = deadline;
        assert_eq!(on_time_again_s(&outcomes, kill, late), 39.0);
        // A late order answered before the kill is late, but not part of the restart's recovery.
        let mut early = vec![(at(t0, 0), at(t0, 1500)); 1];
        early.push((at(t0, 900), at(t0, 905)));
        assert_eq!(late_orders(&early, late), 1);
        assert_eq!(on_time_again_s(&early, at(t0, 2000), late), 0.0);
    }

    #[test]
    fn the_offered_rate_is_per_bin() {
        let mut p = Restart.cases(Profile::Seed).remove(0);
        assert_eq!(offered_per_bin(&p), 200.0);
        p.devices = 200;
        p.period_ms = 1000;
        assert_eq!(offered_per_bin(&p), 20.0);
        assert_eq!(p.late_ms, 1000);
        p.late_ms = 0;
        assert!(Restart.check(&p).is_err());
    }
}
