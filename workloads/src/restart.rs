//! **restart**: `devices` devices each make an order every `period_ms`; at `kill_at_s` the server is killed with
//! SIGKILL and started again at once on the same port with the same identity and store; the run lasts
//! `duration_s`, then waits until every order is answered.
//!
//! Load is open loop: order `seq` of device `d` has the intended time `start + (seq·devices + d)·period/devices`
//! (devices spread evenly over the period), its `made_us` is that time, and latency counts from it, so a stalled
//! server is not hidden by devices that stopped sending (no coordinated omission).
//!
//! Metrics: `orders_made`, `orders_acked`, `orders_applied`, `lost`, `duplicates` (store audit, read from the log);
//! `up_ms` (kill to ready line); `stall_bins` (100 ms bins in the 10 s after the kill, while devices still make
//! orders, with nothing stored, from the log's commit times); `catch_up_s` (kill until the last late order is answered; late: slower than twice the pre-kill p99 plus 100 ms);
//! `server_cpu_s_after`, `client_cpu_s_after` (CPU in the 10 s after the restart); `asym_ops_after`,
//! `handshakes_after` (the restarted server's counters over those 10 s); `resent`, `reconnects` (the devices'
//! counters from the kill to the end); `make_to_stored_p50_ms`/`_p99_ms`/`_max_ms` and the histogram
//! `make_to_stored`; `timeline` (orders stored per 100 ms bin, whole run, from the log); `kill_bin` (the timeline bin
//! of the kill).

use crate::harness::{self, Profile, Run, WorkloadError};
use crate::hist;
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
        Metric { key: "stall_bins", unit: "count", about: "100 ms bins with nothing stored in the 10 s after the kill" },
        Metric { key: "catch_up_s", unit: "s", about: "kill to the answer of the last late order" },
        Metric { key: "server_cpu_s_after", unit: "s", about: "server CPU in the 10 s after the restart" },
        Metric { key: "client_cpu_s_after", unit: "s", about: "load generator CPU in the same 10 s" },
        Metric { key: "asym_ops_after", unit: "count", about: "the restarted server's asymmetric operations over those 10 s" },
        Metric { key: "handshakes_after", unit: "count", about: "the restarted server's handshakes over those 10 s" },
        Metric { key: "resent_timeout", unit: "count", about: "records sent again on the same link after the re-send timer (from the kill)" },
        Metric { key: "resent_reconnect", unit: "count", about: "orders sent again on a new connection (from the kill)" },
        Metric { key: "reconnects", unit: "count", about: "links opened again after they dropped (from the kill)" },
        Metric { key: "make_to_stored_p99_ms", unit: "ms", about: "99th percentile from an order's intended time to its answer" },
        Metric { key: "make_to_stored_max_ms", unit: "ms", about: "the slowest order, intended time to answer" },
        Metric { key: "timeline", unit: "orders per 100 ms", about: "orders stored per 100 ms bin, from the log" },
        Metric { key: "lost", unit: "count", about: "acknowledged orders missing from the store's log" },
        Metric { key: "duplicates", unit: "count", about: "orders applied more than once" },
    ],
    columns: &[
        Column::new("up again, ms", "up_ms", Format::Decimal),
        Column::new("100 ms bins with nothing stored", "stall_bins", Format::Count),
        Column::new("catch-up, s", "catch_up_s", Format::Decimal),
        Column::new("server CPU s, 10 s after", "server_cpu_s_after", Format::Decimal),
        Column::new("asymmetric ops after", "asym_ops_after", Format::Count),
        Column::new("handshakes after", "handshakes_after", Format::Count),
        Column::new("client CPU s, same 10 s", "client_cpu_s_after", Format::Decimal),
        Column::new("re-sent (timer)", "resent_timeout", Format::Count),
        Column::new("re-sent (new connection)", "resent_reconnect", Format::Count),
        Column::new("reconnects", "reconnects", Format::Count),
        Column::new("to stored p99, ms", "make_to_stored_p99_ms", Format::Decimal),
        Column::new("to stored max, ms", "make_to_stored_max_ms", Format::Decimal),
        Column::new("orders", "orders_made", Format::Count),
        Column::new("lost", "lost", Format::Sum),
        Column::new("applied twice", "duplicates", Format::Sum),
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
            },
            Profile::Quick => RestartParams {
                devices: 200,
                period_ms: 1_000,
                kill_at_s: 3.0,
                duration_s: 7.0,
                payload_bytes: 64,
                drain_timeout_s: 30,
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
        .map(|d| transport_core::sender_id(&transport_core::device_name(d)))
        .collect();
    let period = Duration::from_millis(p.period_ms);
    let total = (p.duration_s * 1000.0 / p.period_ms as f64 * p.devices as f64).round() as u64;
    let kill_at = Duration::from_secs_f64(p.kill_at_s);
    let slot =
        |i: u64| Duration::from_nanos((i as u128 * period.as_nanos() / p.devices as u128) as u64);

    let sampler = sample::Sampler::start(run.server()?.serving_pid(), BIN);
    let start = Instant::now();
    let start_us = harness::unix_us();
    let mut made: Vec<OrderId> = Vec::with_capacity(total as usize);
    let mut acked: Vec<OrderId> = Vec::with_capacity(total as usize);
    let mut latency = hist::new();
    let mut next = 0u64;
    let mut killed: Option<(Instant, u64)> = None; // (kill time, orders made before the server was up again)
    let mut up: Option<Instant> = None;
    // (schedule position, answer time) of every answer, for the catch-up.
    let mut answers: Vec<(u64, Instant)> = Vec::with_capacity(total as usize);
    let mut client_at_kill = f.counters.snapshot();
    let mut after: Option<transport_core::CounterSnapshot> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);

    let record =
        |id: OrderId, device: u32, at: Instant, latency: &mut hdrhistogram::Histogram<u64>| {
            let position = id.seq * p.devices as u64 + device as u64;
            hist::record(
                latency,
                at.saturating_duration_since(start + slot(position)),
            );
            (position, at)
        };

    // Make orders on schedule, kill and restart the server, and collect answers.
    while next < total {
        tokio::select! {
            _ = tick.tick() => {}
            ev = f.events.recv() => {
                if let Some(LinkEvent::Stored { device, id, at }) = ev {
                    answers.push(record(id, device, at, &mut latency));
                    acked.push(id);
                }
                continue;
            }
        }
        let elapsed = start.elapsed();
        while next < total && slot(next) <= elapsed {
            let d = (next % p.devices as u64) as u32;
            let seq = next / p.devices as u64;
            let id = OrderId {
                sender: sender_ids[d as usize],
                run: runs[d as usize],
                seq,
            };
            let made_us = start_us + slot(next).as_micros() as u64;
            f.fleet.send(
                d,
                Order {
                    id,
                    made_us,
                    payload: harness::payload(&id, p.payload_bytes as usize),
                },
            );
            made.push(id);
            next += 1;
        }
        if killed.is_none() && elapsed >= kill_at {
            client_at_kill = f.counters.snapshot();
            let t_kill = Instant::now();
            run.restart_server().await?;
            let t_up = Instant::now();
            sampler.set_pid(run.server()?.serving_pid());
            run.say(&format!(
                "killed, up again in {:.1} ms",
                (t_up - t_kill).as_secs_f64() * 1e3
            ));
            // Orders made before the server was up again: the schedule positions before the current one.
            killed = Some((t_kill, next));
            up = Some(t_up);
        }
        if let (Some(t_up), None) = (up, &after) {
            if t_up.elapsed() >= AFTER {
                after = Some(run.server_stats().await?.counters);
            }
        }
    }

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
                answers.push(record(id, device, at, &mut latency));
                acked.push(id);
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
    run.server()?.shutdown().await?;
    // An order never answered counts in the histogram at the deadline, so it is never hidden.
    let unanswered = made.len() - acked.len();
    for _ in 0..unanswered {
        hist::record(&mut latency, deadline.saturating_duration_since(start));
    }

    let entries = transport_store::read_log(&run.dirs.store)?;
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
    if let (Some((t_kill, _)), Some(t_up)) = (killed, up) {
        let kill_ms = t_kill.duration_since(start).as_millis() as u64;
        let up_ms = t_up.duration_since(t_kill).as_secs_f64() * 1e3;
        let kill_bin = (kill_ms / BIN.as_millis() as u64) as usize;
        // Bins after the kill's own bin, within the 10 s window and while devices were still making orders.
        let window = (AFTER.as_millis() / BIN.as_millis()) as usize;
        let load_end = (p.duration_s * 1000.0 / BIN.as_millis() as f64) as usize;
        let stall = (kill_bin + 1..(kill_bin + 1 + window).min(load_end))
            .filter(|&b| timeline.get(b).is_none_or(|&n| n == 0))
            .count();
        let catch_up = catch_up_s(&answers, |pos| start + slot(pos), t_kill);
        let up_rel = t_up.duration_since(start).as_millis() as u64;
        let (server_after, client_after) =
            sample::cpu_between(&samples, up_rel, up_rel + AFTER.as_millis() as u64);
        run.metric("up_ms", up_ms);
        run.metric("kill_bin", kill_bin);
        run.metric("stall_bins", stall);
        run.metric("catch_up_s", catch_up);
        run.metric("server_cpu_s_after", server_after);
        run.metric("client_cpu_s_after", client_after);
    }
    let after = after.expect("read above");
    run.metric("asym_ops_after", after.asym_ops());
    run.metric("handshakes_after", after.handshakes);
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

/// How long after the kill orders were late: the time from the kill to the answer of the last late order, where
/// late means slower (from intended time to answer) than twice the 99th percentile of the orders made before the
/// kill, plus 100 ms. Orders a restart delays by one re-send timeout count as late, so even a transport that barely
/// notices the kill shows its re-send timer here; a reconnect storm shows as seconds.
pub fn catch_up_s(
    answers: &[(u64, Instant)],
    intended: impl Fn(u64) -> Instant,
    kill: Instant,
) -> f64 {
    let mut before: Vec<Duration> = answers
        .iter()
        .filter(|(pos, _)| intended(*pos) < kill)
        .filter(|(_, at)| *at < kill)
        .map(|(pos, at)| at.saturating_duration_since(intended(*pos)))
        .collect();
    before.sort_unstable();
    let p99 = before
        .get(before.len() * 99 / 100)
        .copied()
        .unwrap_or_default();
    let late = p99 * 2 + Duration::from_millis(100);
    answers
        .iter()
        .filter(|(pos, at)| *at >= kill && at.saturating_duration_since(intended(*pos)) > late)
        .map(|(_, at)| at.saturating_duration_since(kill).as_secs_f64())
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catch_up_ends_with_the_last_late_answer() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let intended = |pos: u64| at(pos * 10);
        let kill = at(1000);
        // Before the kill every order takes 5 ms; after it, orders 100..103 take 300 ms (a re-send), later ones 5 ms.
        let mut answers: Vec<(u64, Instant)> = (0..100).map(|p| (p, at(p * 10 + 5))).collect();
        answers.extend((100..103).map(|p| (p, at(p * 10 + 300))));
        answers.extend((103..200).map(|p| (p, at(p * 10 + 5))));
        let c = catch_up_s(&answers, intended, kill);
        assert!((c - 0.32).abs() < 1e-9, "{c}");
        // Nothing late: zero.
        let calm: Vec<_> = (0..200).map(|p| (p, at(p * 10 + 5))).collect();
        assert_eq!(catch_up_s(&calm, intended, kill), 0.0);
    }
}
