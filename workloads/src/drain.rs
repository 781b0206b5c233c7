//! **drain**: a backlog of orders piles up on the devices while the server is stopped (SIGSTOP); then the server
//! continues (SIGCONT) and works through it. The rate is the server's own: taken from the store's commit times over
//! the steady part of the drain, with the server's CPU per order over the same window beside it.
//!
//! Before the stop, every device sends one warm-up order and waits for its answer, so sessions and connections
//! exist and the drain measures carrying and storing orders, not first contact. The backlog's orders are made
//! before the stop (making them is not the server's work); while the server is stopped they are handed to the
//! devices, each device sends what its window allows (those datagrams or frames wait in the server's socket
//! buffers) and keeps the rest in its outbox. After `pile_up_ms` the server continues.
//!
//! **The steady part.** Each order's commit time is its `stored_us` in the store's log (the time its group was
//! committed). Sort the backlog's N orders by it; `from` is the commit time of the order of rank ⌊0.1·N⌋ (0-based)
//! and `to` that of rank ⌈0.9·N⌉−1. The rate is the number of backlog orders committed after `from` and up to `to`,
//! divided by `to − from`: the orders whose work lies wholly between two commit instants, which leaves out the
//! start (sessions and windows filling, the first group) and the tail (the last devices' stragglers).
//!
//! **What is in flight.** The server must never wait for the devices: `clients` devices × each device's window are
//! in flight (Pure: 256 records per device, so 128 devices keep 32,768 in flight; a connection transport: its
//! streams or its unacknowledged publishes). The pile-up is shorter than the devices' first re-send timer (Pure:
//! 200 ms), so the stop itself sends nothing twice. Whether the server did wait is on record: `server_busy` is its
//! CPU over the steady part divided by that time (1.0: busy all along, on the one CPU it is pinned to), and the
//! generator's own load marks the run generator-bound ([`crate::lag`]).
//!
//! Metrics: `orders`, `orders_per_second` (steady rate), `steady_s`, `steady_orders`, `steady_groups`,
//! `server_cpu_us_per_order` and `server_busy` (over the steady part, from `/proc` samples every 10 ms), `drain_s`
//! (SIGCONT to the last answer), `server_cpu_s` (the server's getrusage over the whole drain), `client_cpu_s`,
//! `generator_busy`, `generator_bound`, what else the run's CPUs did over the steady part (`machine_others`: other
//! processes, `machine_interrupts`, `host_steal`: the hypervisor's; in CPUs, from `/proc/stat`), `timed_out`, `unanswered`, the store audit (`applied`, `lost`, `duplicates`,
//! `acked_not_applied`, `unknown`) and the counters of both sides. Histogram `continue_to_stored`: for each order,
//! the time from SIGCONT to its answer (an order never answered counts at the deadline).

use crate::harness::{self, Profile, Run, Waited, WorkloadError};
use crate::hist;
use crate::lag::{self, GeneratorLoad};
use crate::sample;
use crate::workload::{Better, Column, Format, Info, Metric, Workload};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use transport_core::{BoxFuture, Need, Order, OrderId};

/// The drain's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrainParams {
    /// Orders in the backlog, made before the stop and handed to the devices while the server is stopped.
    pub orders: u32,
    /// Smaller backlogs and fewer devices for the transports named here (a variant that drains a hundred times
    /// slower needs less in flight, or every record waits past its re-send timer); the others take `orders` and
    /// `clients`. A name without a variant (`quinn`, `mqtt`) also covers its variants (`quinn:p256`,
    /// `mqtt@mosquitto`, `mqtt:resume`), unless a variant is named itself.
    #[serde(default)]
    pub at_most: BTreeMap<String, Limits>,
    /// Devices, each with its own link; together their windows are what is in flight.
    pub clients: u32,
    /// Bytes of payload per order.
    pub payload_bytes: u32,
    /// How long the server stays stopped after the orders are handed over: shorter than the devices' first re-send
    /// timer, so the stop sends nothing twice.
    pub pile_up_ms: u64,
    /// Give up waiting for answers after this long.
    pub timeout_s: u64,
}

impl DrainParams {
    /// The backlog and the devices for a transport: `orders` and `clients`, or less where `at_most` says so.
    pub fn for_transport(&self, spec: &str) -> (u32, u32) {
        let family = spec.split([':', '@', '+']).next().unwrap_or(spec);
        let limits = self.at_most.get(spec).or_else(|| self.at_most.get(family));
        let cap = |value: u32, most: Option<u32>| most.map_or(value, |m| m.min(value));
        (
            cap(self.orders, limits.and_then(|l| l.orders)),
            cap(self.clients, limits.and_then(|l| l.clients)),
        )
    }
}

/// Upper bounds on a drain's parameters for one transport.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// At most this many orders in the backlog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orders: Option<u32>,
    /// At most this many devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clients: Option<u32>,
}

/// The drain workload.
#[derive(Debug, Clone, Copy)]
pub struct Drain;

/// The fraction of the backlog cut off at each end of the drain to leave its steady part.
pub const STEADY_CUT: f64 = 0.1;
/// How often the server's and the generator's CPU are sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);
/// A steady part shorter than this holds too few samples (and clock ticks) to say how busy either side was: its
/// CPU figures are not recorded, and the generator is not judged by its load.
pub const MIN_STEADY_FOR_CPU: Duration = Duration::from_millis(250);

const INFO: Info = Info {
    name: "drain",
    about: "a backlog piles up on the devices while the server is stopped (SIGSTOP); the server continues \
            (SIGCONT); its rate over the steady part, from the store's commit times",
    needs: &[Need::StoredAnswers],
    metrics: &[
        Metric { key: "orders", unit: "count", about: "orders in the backlog" },
        Metric { key: "clients", unit: "count", about: "devices, each with its own link" },
        Metric { key: "orders_per_second", unit: "orders/s", about: "backlog orders committed per second over the steady part (the middle 80% by commit time)" },
        Metric { key: "steady_s", unit: "s", about: "the steady part's length" },
        Metric { key: "steady_groups", unit: "count", about: "group commits in the steady part" },
        Metric { key: "server_cpu_us_per_order", unit: "µs", about: "server CPU per order over the steady part" },
        Metric { key: "generator_cpu_us_per_order", unit: "µs", about: "load generator CPU per order over the steady part (taking answers; the backlog was made before)" },
        Metric { key: "server_busy", unit: "fraction", about: "server CPU over the steady part / its length (1: never waited)" },
        Metric { key: "server_cpu_wait", unit: "fraction", about: "time the server's threads could run but had no CPU, over the steady part / its length" },
        Metric { key: "machine_others", unit: "CPUs", about: "CPU used by other processes on the run's CPUs over the steady part / its length" },
        Metric { key: "machine_interrupts", unit: "CPUs", about: "interrupt time of the run's CPUs (charged to no process) over the steady part / its length" },
        Metric { key: "host_steal", unit: "CPUs", about: "time the hypervisor took the run's CPUs away over the steady part / its length" },
        Metric { key: "drain_s", unit: "s", about: "SIGCONT to the last answer" },
        Metric { key: "server_cpu_s", unit: "s", about: "the server's CPU over the whole drain (its own getrusage)" },
        Metric { key: "client_cpu_s", unit: "s", about: "the load generator's CPU over the whole drain" },
        Metric { key: "generator_busy", unit: "fraction", about: "the generator's CPU over the steady part / its length and CPUs" },
        Metric { key: "generator_bound", unit: "0/1", about: "1 if the generator was busy enough to be the limit" },
        Metric { key: "timed_out", unit: "0/1", about: "1 if some orders were not answered before the timeout" },
        Metric { key: "unanswered", unit: "count", about: "orders never answered" },
        Metric { key: "lost", unit: "count", about: "orders made that are not in the store's log (never stored; an acknowledged one is also in acked_not_applied)" },
        Metric { key: "duplicates", unit: "count", about: "orders applied more than once" },
    ],
    columns: &[
        Column::new("backlog", "orders", Format::Count),
        Column::new("devices", "clients", Format::Count),
        Column::new("orders/s, median (min-max)", "orders_per_second", Format::Count).higher(),
        Column::new("orders/s, each round", "orders_per_second", Format::Rounds).higher(),
        Column::new("server CPU µs/order", "server_cpu_us_per_order", Format::Decimal).lower(),
        Column::new("generator CPU µs/order", "generator_cpu_us_per_order", Format::Decimal),
        Column::new("server busy", "server_busy", Format::Decimal),
        Column::new("server waited for its CPU", "server_cpu_wait", Format::Decimal),
        Column::new("generator busy", "generator_busy", Format::Decimal),
        Column::new("steady part, s", "steady_s", Format::Decimal),
        Column::new("other processes, CPUs", "machine_others", Format::Decimal).lower(),
        Column::new("host steal, CPUs", "host_steal", Format::Decimal).lower(),
        Column::new("server X25519", "server_x25519", Format::Count).lower(),
        Column::new("re-sent (timer)", "client_resent_timeout", Format::Count).lower(),
        Column::new("re-sent (new connection)", "client_resent_reconnect", Format::Count).lower(),
        Column::new("unanswered", "unanswered", Format::Sum).lower(),
        Column::new("lost", "lost", Format::Sum).lower(),
        Column::new("applied twice", "duplicates", Format::Sum).lower(),
    ],
    primary: ("orders_per_second", Better::Higher),
    case_keys: &[],
    sweep: None,
};

impl Workload for Drain {
    type Params = DrainParams;

    fn info(&self) -> &'static Info {
        &INFO
    }

    /// A backlog the server needs seconds for (eight million orders, about 3 s of a Pure server here; 40,000 for
    /// the per-request variant, which drains a hundred times slower; a million for QUIC and two for MQTT, about 8 s
    /// of theirs), or a CI-sized run. The seed's own drain (seed 088: 20,000 orders from eight clients) is `--param
    /// orders=20000 --param clients=8`.
    fn cases(&self, profile: Profile) -> Vec<DrainParams> {
        // Per-request sealing drains about 5,000 orders/s here: 2 devices keep 512 records in flight, a tenth of a
        // second of its work, under the devices' 200 ms re-send timer.
        let slow = |orders| {
            BTreeMap::from([(
                "pure:hpke-per-request".to_string(),
                Limits {
                    orders: Some(orders),
                    clients: Some(2),
                },
            )])
        };
        let seed_limits = {
            let mut limits = slow(40_000);
            for (family, orders) in [
                ("quinn", 1_000_000),
                ("s2n-quic", 1_000_000),
                ("mqtt", 2_000_000),
            ] {
                limits.insert(
                    family.to_string(),
                    Limits {
                        orders: Some(orders),
                        clients: None,
                    },
                );
            }
            limits
        };
        vec![match profile {
            Profile::Seed => DrainParams {
                orders: 8_000_000,
                at_most: seed_limits,
                clients: 128,
                payload_bytes: 64,
                pile_up_ms: 50,
                timeout_s: 120,
            },
            Profile::Quick => DrainParams {
                orders: 20_000,
                at_most: slow(2_000),
                clients: 16,
                payload_bytes: 64,
                pile_up_ms: 50,
                timeout_s: 60,
            },
        }]
    }

    fn check(&self, p: &DrainParams) -> Result<(), String> {
        let zero = |v: Option<u32>| v == Some(0);
        if p.clients == 0
            || p.orders == 0
            || p.at_most
                .values()
                .any(|l| zero(l.orders) || zero(l.clients))
        {
            return Err("orders and clients must be at least 1".into());
        }
        Ok(())
    }

    fn run<'a>(
        &'a self,
        run: &'a mut Run<'_>,
        params: &'a DrainParams,
    ) -> BoxFuture<'a, Result<(), WorkloadError>> {
        Box::pin(drain(run, params))
    }
}

async fn drain(run: &mut Run<'_>, params: &DrainParams) -> Result<(), WorkloadError> {
    let (backlog, clients) = params.for_transport(run.spec());
    run.prepare(clients)?;
    let addr = run.start_server().await?;
    let mut f = run.fleet(addr, clients).await?;
    f.connect_all(clients).await?;
    let runs: Vec<u64> = (0..clients).map(|_| harness::new_run()).collect();
    let total = backlog as usize + clients as usize;
    let mut made: Vec<OrderId> = Vec::with_capacity(total);
    let mut acked: Vec<OrderId> = Vec::with_capacity(total);
    let order = |d: u32, seq: u64| -> Order {
        harness::order(d, runs[d as usize], seq, params.payload_bytes as usize)
    };

    // Warm-up: one answered order per device (seq 0; the backlog's orders have seq 1 and up).
    for d in 0..clients {
        let o = order(d, 0);
        made.push(o.id);
        f.fleet.send(d, o);
    }
    let warm_deadline = Instant::now() + Duration::from_secs(params.timeout_s);
    if f.collect_stored(&mut acked, made.len(), warm_deadline, |_, _, _| {})
        .await
        != Waited::Done
    {
        return Err(WorkloadError::Timeout(
            "warm-up orders were not answered".into(),
        ));
    }

    // The backlog, made before the stop: making orders is the generator's work, not the server's.
    let share = |d: u32| backlog / clients + u32::from(d < backlog % clients);
    let backlog_orders: Vec<(u32, Vec<Order>)> = (0..clients)
        .map(|d| (d, (1..=share(d) as u64).map(|seq| order(d, seq)).collect()))
        .collect();
    made.extend(
        backlog_orders
            .iter()
            .flat_map(|(_, os)| os.iter().map(|o| o.id)),
    );
    // The answered ids go into `acked` during the drain: its memory is touched now, so that the generator's CPU in
    // the drain is not the kernel zeroing pages for the audit's list (a fifth of a gigabyte at the seed's size).
    if let Some(&any) = made.first() {
        let had = acked.len();
        acked.resize(made.len(), any);
        acked.truncate(had);
    }

    let sampler = sample::Sampler::start_on(
        run.server()?.serving_pid(),
        SAMPLE_EVERY,
        run.harness.provenance.pinning.cpus_in_use(),
    );
    let sampled_from_us = harness::unix_us();
    // The server's CPU does not move while it is stopped: read it now, and again after the drain.
    let before = run.server_stats().await?;
    let client_before = f.counters.snapshot();
    run.server()?.stop()?;
    run.say(&format!("server stopped, handing over {backlog} orders"));
    for (d, orders) in backlog_orders {
        f.fleet.send_all(d, orders);
    }
    tokio::time::sleep(Duration::from_millis(params.pile_up_ms)).await;

    let self0 = sample::self_cpu_time()?;
    let t0 = Instant::now();
    run.server()?.cont()?;
    let mut histogram = hist::new();
    let mut last = t0;
    let deadline = t0 + Duration::from_secs(params.timeout_s);
    // The orders one datagram answered arrive with one time: each time is recorded once, with its count (the same
    // histogram as one record per order, for a tenth of the generator's work).
    let mut same: Option<(Instant, u64)> = None;
    let mut record = |at: Instant, n: u64| {
        hist::record_n(&mut histogram, at.saturating_duration_since(t0), n);
        last = last.max(at);
    };
    let waited = f
        .collect_stored(
            &mut acked,
            made.len(),
            deadline,
            |_, _, at| match &mut same {
                Some((t, n)) if *t == at => *n += 1,
                _ => {
                    if let Some((t, n)) = same.replace((at, 1)) {
                        record(t, n);
                    }
                }
            },
        )
        .await;
    if let Some((t, n)) = same {
        record(t, n);
    }
    let timed_out = waited != Waited::Done;
    let unanswered = made.len() - acked.len();
    // An order never answered counts in the histogram at the deadline, so it is never hidden.
    hist::record_n(
        &mut histogram,
        deadline.duration_since(t0),
        unanswered as u64,
    );
    let self1 = sample::self_cpu_time()?;
    let drain_s = last.duration_since(t0).as_secs_f64();
    let after = run.server_stats().await?;
    let samples = sampler.stop().await;
    let client = f.counters.snapshot().since(&client_before);
    f.fleet.close().await;
    run.stop_server().await?;
    let entries = run.log_entries()?;
    let audit = transport_store::Audit::of_entries(&entries, &made, &acked);
    run.record_audit(&audit);

    run.metric("orders", backlog);
    run.metric("clients", clients);
    run.metric("orders_made", audit.made);
    run.metric("orders_acked", audit.acked);
    run.metric("drain_s", drain_s);
    run.metric("timed_out", u64::from(timed_out));
    run.metric("unanswered", unanswered);
    run.metric("server_cpu_s", (after.cpu_s - before.cpu_s).max(0.0));
    run.metric("client_cpu_s", (self1 - self0).as_secs_f64());
    run.counters("server_", &after.counters.since(&before.counters));
    run.counters("client_", &client);
    run.histogram("continue_to_stored", &histogram);

    let times: Vec<u64> = entries
        .iter()
        .filter(|e| e.id.seq > 0)
        .map(|e| e.stored_us)
        .collect();
    let Some(steady) = Steady::of(times) else {
        run.say("the backlog was committed in too few groups to have a steady part");
        return Ok(());
    };
    let ms = |unix_us: u64| unix_us.saturating_sub(sampled_from_us) / 1000;
    let (from, to) = (ms(steady.from_us), ms(steady.to_us));
    let (server_cpu, client_cpu) = sample::cpu_between(&samples, from, to);
    let (server_wait, client_wait) = sample::wait_between(&samples, from, to);
    let machine = sample::machine_between(&samples, from, to);
    let wall = steady.seconds();
    // A drain that timed out has no rate: its steady part is not the whole story.
    if !timed_out {
        run.metric("orders_per_second", steady.rate());
    }
    run.metric("steady_s", wall);
    run.metric("steady_orders", steady.orders);
    run.metric("steady_groups", steady.groups);
    if wall < MIN_STEADY_FOR_CPU.as_secs_f64() {
        run.say(
            "the steady part is too short to measure how busy the server and the generator were",
        );
        return Ok(());
    }
    run.metric(
        "server_cpu_us_per_order",
        server_cpu * 1e6 / steady.orders.max(1) as f64,
    );
    run.metric(
        "generator_cpu_us_per_order",
        client_cpu * 1e6 / steady.orders.max(1) as f64,
    );
    run.metric("server_busy", server_cpu / wall);
    run.metric("server_cpu_wait", server_wait / wall);
    run.metric("generator_cpu_wait", client_wait / wall);
    run.metric("machine_others", machine.others_s / wall);
    run.metric("machine_interrupts", machine.interrupts_s / wall);
    run.metric("host_steal", machine.steal_s / wall);
    let load = GeneratorLoad {
        cpu_s: client_cpu,
        wall_s: wall,
        cpus: run.harness.provenance.pinning.generator_cpu_count(),
        server_busy: Some(server_cpu / wall),
    };
    lag::record(run, None, &load);
    Ok(())
}

/// The steady part of a drain, from its orders' commit times (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steady {
    /// The commit time it starts at (exclusive), µs since the Unix epoch.
    pub from_us: u64,
    /// The commit time it ends at (inclusive).
    pub to_us: u64,
    /// Orders committed in `(from, to]`.
    pub orders: u64,
    /// Group commits in `(from, to]` (distinct commit times).
    pub groups: u64,
}

impl Steady {
    /// The steady part of orders committed at `times` (µs), or `None` when they took too few groups to have one.
    pub fn of(mut times: Vec<u64>) -> Option<Steady> {
        times.sort_unstable();
        let n = times.len();
        if n == 0 {
            return None;
        }
        let from_us = times[(n as f64 * STEADY_CUT).floor() as usize];
        let to_us = times[((n as f64 * (1.0 - STEADY_CUT)).ceil() as usize).clamp(1, n) - 1];
        if to_us <= from_us {
            return None;
        }
        let inside = times.iter().filter(|&&t| t > from_us && t <= to_us);
        let orders = inside.clone().count() as u64;
        let mut groups = inside.copied().collect::<Vec<_>>();
        groups.dedup();
        Some(Steady {
            from_us,
            to_us,
            orders,
            groups: groups.len() as u64,
        })
    }

    /// Its length in seconds.
    pub fn seconds(&self) -> f64 {
        (self.to_us - self.from_us) as f64 / 1e6
    }

    /// Orders per second.
    pub fn rate(&self) -> f64 {
        self.orders as f64 / self.seconds()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_name_a_transport_or_its_whole_family() {
        let seed = Drain.cases(Profile::Seed).remove(0);
        assert_eq!(seed.for_transport("pure"), (8_000_000, 128));
        assert_eq!(seed.for_transport("pure:hpke-per-request"), (40_000, 2));
        assert_eq!(seed.for_transport("pure:hpke-session"), (8_000_000, 128));
        assert_eq!(seed.for_transport("quinn"), (1_000_000, 128));
        assert_eq!(seed.for_transport("quinn:p256"), (1_000_000, 128));
        assert_eq!(seed.for_transport("s2n-quic:rustls"), (1_000_000, 128));
        assert_eq!(seed.for_transport("mqtt@mosquitto"), (2_000_000, 128));
        let mut p = seed.clone();
        // A variant named itself wins over its family; a smaller backlog asked for stays smaller.
        p.at_most.insert(
            "quinn:p256".into(),
            Limits {
                orders: Some(5),
                clients: Some(1),
            },
        );
        assert_eq!(p.for_transport("quinn:p256"), (5, 1));
        p.orders = 10;
        assert_eq!(p.for_transport("quinn"), (10, 128));
    }

    #[test]
    fn the_steady_part_leaves_out_the_ends() {
        // 10 groups of 100 orders, one every 10 ms, then a straggler group of 5 a second later.
        let mut times: Vec<u64> = (0..10u64)
            .flat_map(|g| std::iter::repeat_n(1_000_000 + g * 10_000, 100))
            .collect();
        times.extend(std::iter::repeat_n(2_000_000, 5));
        let s = Steady::of(times).unwrap();
        // Rank 100 (of 1005) is in the second group, rank 904 in the tenth: groups 3..=10 are inside.
        assert_eq!((s.from_us, s.to_us), (1_010_000, 1_090_000));
        assert_eq!((s.orders, s.groups), (800, 8));
        assert!((s.rate() - 10_000.0).abs() < 1e-6, "{}", s.rate());
        // One group has no steady part.
        assert_eq!(Steady::of(vec![5; 100]), None);
        assert_eq!(Steady::of(vec![]), None);
    }
}
