//! **drain**: orders pile up on the sender side while the server is stopped (SIGSTOP); then the server continues
//! (SIGCONT) and is timed until every order is stored.
//!
//! Before the stop, every device sends one warm-up order and waits for its answer, so sessions and connections
//! exist and the drain measures carrying and storing orders, not first contact. While the server is stopped,
//! `clients` tasks hand `orders` orders to their devices; each device sends what its window allows (those
//! datagrams wait in the server's socket buffer) and keeps the rest in its outbox. After `pile_up_ms` the server
//! continues; the clock runs from SIGCONT to the last answer.
//!
//! Metrics: `orders`, `orders_per_second`, `drain_s`, `applied`, `lost`, `duplicates`, `acked_not_applied` (from the
//! store audit, which reads the log), `server_cpu_s` (the server's own getrusage, read before the stop and after the
//! last answer, so it includes the stats exchange and not only the drain; microsecond resolution) and `client_cpu_s`
//! (the load generator's, over the drain), and the counters of both sides. Histogram `continue_to_stored`: for each
//! order, the time from SIGCONT to its answer.

use crate::harness::{self, Profile, Run, Waited, WorkloadError};
use crate::hist;
use crate::sample;
use crate::workload::{Better, Column, Format, Info, Metric, Workload};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use transport_core::{BoxFuture, Need, Order, OrderId};

/// The drain's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrainParams {
    /// Orders made while the server is stopped.
    pub orders: u32,
    /// Client tasks, one device each.
    pub clients: u32,
    /// Bytes of payload per order.
    pub payload_bytes: u32,
    /// How long the server stays stopped after the orders are handed over.
    pub pile_up_ms: u64,
    /// Give up waiting for answers after this long.
    pub timeout_s: u64,
}

/// The drain workload.
#[derive(Debug, Clone, Copy)]
pub struct Drain;

const INFO: Info = Info {
    name: "drain",
    about: "orders pile up on the devices while the server is stopped (SIGSTOP); the server continues (SIGCONT) \
            and is timed until all are stored",
    needs: &[Need::StoredAnswers],
    metrics: &[
        Metric { key: "orders", unit: "count", about: "orders made while the server was stopped" },
        Metric { key: "orders_per_second", unit: "orders/s", about: "orders drained over the time from SIGCONT to the last answer" },
        Metric { key: "drain_s", unit: "s", about: "SIGCONT to the last answer" },
        Metric { key: "server_cpu_s", unit: "s", about: "the server's CPU over the drain (its own getrusage)" },
        Metric { key: "server_cpu_us_per_order", unit: "µs", about: "server CPU per drained order" },
        Metric { key: "client_cpu_s", unit: "s", about: "the load generator's CPU over the drain" },
        Metric { key: "timed_out", unit: "0/1", about: "1 if some orders were not answered before the timeout" },
        Metric { key: "unanswered", unit: "count", about: "orders never answered" },
        Metric { key: "lost", unit: "count", about: "acknowledged orders missing from the store's log" },
        Metric { key: "duplicates", unit: "count", about: "orders applied more than once" },
    ],
    columns: &[
        Column::new("orders/s, median (min-max)", "orders_per_second", Format::Count),
        Column::new("orders/s, each round", "orders_per_second", Format::Rounds),
        Column::new("server CPU µs/order", "server_cpu_us_per_order", Format::Decimal),
        Column::new("server X25519", "server_x25519", Format::Count),
        Column::new("re-sent (timer)", "client_resent_timeout", Format::Count),
        Column::new("re-sent (new connection)", "client_resent_reconnect", Format::Count),
        Column::new("unanswered", "unanswered", Format::Sum),
        Column::new("lost", "lost", Format::Sum),
        Column::new("applied twice", "duplicates", Format::Sum),
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

    /// The seed's parameters (seed 088: 20,000 orders from eight clients) or a CI-sized run.
    fn cases(&self, profile: Profile) -> Vec<DrainParams> {
        vec![match profile {
            Profile::Seed => DrainParams {
                orders: 20_000,
                clients: 8,
                payload_bytes: 64,
                pile_up_ms: 500,
                timeout_s: 120,
            },
            Profile::Quick => DrainParams {
                orders: 10_000,
                clients: 8,
                payload_bytes: 64,
                pile_up_ms: 300,
                timeout_s: 60,
            },
        }]
    }

    fn check(&self, p: &DrainParams) -> Result<(), String> {
        if p.clients == 0 || p.orders == 0 {
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
    run.prepare(params.clients)?;
    let addr = run.start_server().await?;
    let mut f = run.fleet(addr, params.clients).await?;
    f.connect_all(params.clients).await?;
    let runs: Vec<u64> = (0..params.clients).map(|_| harness::new_run()).collect();
    let total = params.orders as usize + params.clients as usize;
    let mut made: Vec<OrderId> = Vec::with_capacity(total);
    let mut acked: Vec<OrderId> = Vec::with_capacity(total);
    let order = |d: u32, seq: u64| -> Order {
        harness::order(d, runs[d as usize], seq, params.payload_bytes as usize)
    };

    // Warm-up: one answered order per device.
    for d in 0..params.clients {
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

    // The server's CPU does not move while it is stopped: read it now, and again after the drain.
    let before = run.server_stats().await?;
    let client_before = f.counters.snapshot();
    run.server()?.stop()?;
    run.say(&format!("server stopped, making {} orders", params.orders));

    // The client tasks make their orders while the server is stopped.
    let share =
        |d: u32| params.orders / params.clients + u32::from(d < params.orders % params.clients);
    let mut tasks = Vec::new();
    for d in 0..params.clients {
        let fleet = f.fleet.clone();
        let orders: Vec<Order> = (1..=share(d) as u64).map(|seq| order(d, seq)).collect();
        made.extend(orders.iter().map(|o| o.id));
        tasks.push(tokio::spawn(async move {
            for o in orders {
                fleet.send(d, o);
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    tokio::time::sleep(Duration::from_millis(params.pile_up_ms)).await;

    let self0 = sample::self_cpu_time()?;
    let t0 = Instant::now();
    run.server()?.cont()?;
    let mut histogram = hist::new();
    let mut last = t0;
    let deadline = t0 + Duration::from_secs(params.timeout_s);
    let waited = f
        .collect_stored(&mut acked, made.len(), deadline, |_, _, at| {
            hist::record(&mut histogram, at.saturating_duration_since(t0));
            last = last.max(at);
        })
        .await;
    let timed_out = waited != Waited::Done;
    let unanswered = made.len() - acked.len();
    // An order never answered counts in the histogram at the deadline, so it is never hidden.
    for _ in 0..unanswered {
        hist::record(&mut histogram, deadline.duration_since(t0));
    }
    let self1 = sample::self_cpu_time()?;
    let drain_s = last.duration_since(t0).as_secs_f64();
    let after = run.server_stats().await?;
    let client = f.counters.snapshot().since(&client_before);
    f.fleet.close().await;
    run.server()?.shutdown().await?;
    run.audit(&made, &acked)?;

    let drained = (acked.len() - params.clients as usize) as f64;
    run.metric("orders", params.orders);
    if !timed_out && drain_s > 0.0 {
        run.metric("orders_per_second", drained / drain_s);
    }
    run.metric("drain_s", drain_s);
    run.metric("timed_out", u64::from(timed_out));
    run.metric("unanswered", unanswered);
    let server_cpu = (after.cpu_s - before.cpu_s).max(0.0);
    run.metric("server_cpu_s", server_cpu);
    run.metric(
        "server_cpu_us_per_order",
        server_cpu * 1e6 / drained.max(1.0),
    );
    run.metric("client_cpu_s", (self1 - self0).as_secs_f64());
    run.counters("server_", &after.counters.since(&before.counters));
    run.counters("client_", &client);
    run.histogram("continue_to_stored", &histogram);
    Ok(())
}
