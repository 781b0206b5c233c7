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
//! (the load generator's, over the drain), and the counters of both sides. Histogram `continue_to_stored`: for each order, the time from SIGCONT to its answer.

use crate::harness::{self, any_loopback, put_counters, server_stats, Harness, WorkloadError};
use crate::hist;
use crate::result::RunResult;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use transport_core::{sample, LinkEvent, Order, OrderId, Transport};

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

impl DrainParams {
    /// The seed's parameters (seed 088: 20,000 orders from eight clients) or a CI-sized run.
    pub fn for_profile(profile: harness::Profile) -> DrainParams {
        match profile {
            harness::Profile::Seed => DrainParams {
                orders: 20_000,
                clients: 8,
                payload_bytes: 64,
                pile_up_ms: 500,
                timeout_s: 120,
            },
            harness::Profile::Quick => DrainParams {
                orders: 10_000,
                clients: 8,
                payload_bytes: 64,
                pile_up_ms: 300,
                timeout_s: 60,
            },
        }
    }
}

/// Run one round of the drain against `transport`.
pub async fn run(
    h: &Harness,
    transport: &dyn Transport,
    round: u32,
    params: &DrainParams,
) -> Result<RunResult, WorkloadError> {
    let spec = transport.spec();
    let dirs = h.dirs("drain", spec, round)?;
    transport.prepare(&dirs.identity, params.clients)?;
    let mut server = h.start_server(spec, any_loopback(), &dirs).await?;
    let mut f = h
        .fleet(transport, server.ready().addr, &dirs, params.clients)
        .await?;
    for d in 0..params.clients {
        f.fleet.connect(d).await?;
    }
    let runs: Vec<u64> = (0..params.clients).map(|_| harness::new_run()).collect();
    let mut made: Vec<OrderId> =
        Vec::with_capacity(params.orders as usize + params.clients as usize);
    let mut acked: Vec<OrderId> = Vec::with_capacity(made.capacity());
    let order = |d: u32, seq: u64| {
        let id = OrderId {
            sender: transport_core::sender_id(&transport_core::device_name(d)),
            run: runs[d as usize],
            seq,
        };
        Order {
            id,
            made_us: harness::unix_us(),
            payload: harness::payload(&id, params.payload_bytes as usize),
        }
    };

    // Warm-up: one answered order per device.
    for d in 0..params.clients {
        let o = order(d, 0);
        made.push(o.id);
        f.fleet.send(d, o);
    }
    let warm_deadline = Instant::now() + Duration::from_secs(params.timeout_s);
    while acked.len() < params.clients as usize {
        match tokio::time::timeout_at(warm_deadline.into(), f.events.recv()).await {
            Ok(Some(LinkEvent::Stored { id, .. })) => acked.push(id),
            Ok(Some(_)) => {}
            _ => {
                return Err(WorkloadError::Timeout(
                    "warm-up orders were not answered".into(),
                ))
            }
        }
    }

    // The server's CPU does not move while it is stopped: read it now, and again after the drain.
    let (before, cpu0) = server_stats(&mut server).await;
    let client_before = f.counters.snapshot();
    server.stop()?;
    h.say(&format!(
        "drain {spec} round {round}: server stopped, making {} orders",
        params.orders
    ));

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
    server.cont()?;
    let mut histogram = hist::new();
    let mut last = t0;
    let deadline = t0 + Duration::from_secs(params.timeout_s);
    let mut timed_out = false;
    while acked.len() < made.len() {
        match tokio::time::timeout_at(deadline.into(), f.events.recv()).await {
            Ok(Some(LinkEvent::Stored { id, at, .. })) => {
                acked.push(id);
                hist::record(&mut histogram, at.saturating_duration_since(t0));
                last = last.max(at);
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                timed_out = true;
                break;
            }
        }
    }
    let self1 = sample::self_cpu_time()?;
    let drain_s = last.duration_since(t0).as_secs_f64();
    let (after, cpu1) = server_stats(&mut server).await;
    let client = f.counters.snapshot().since(&client_before);
    f.fleet.close().await;
    let _ = server.shutdown().await;
    let audit = transport_core::store::audit(&dirs.store, &made, &acked)?;

    let drained = (acked.len() - params.clients as usize) as f64;
    let mut r = h.result("drain", spec, round, params);
    let m = &mut r.metrics;
    m.insert("orders".into(), params.orders.into());
    m.insert(
        "orders_per_second".into(),
        if drain_s > 0.0 {
            drained / drain_s
        } else {
            0.0
        }
        .into(),
    );
    m.insert("drain_s".into(), drain_s.into());
    m.insert("applied".into(), audit.applied.into());
    m.insert("lost".into(), audit.lost.into());
    m.insert("duplicates".into(), audit.duplicates.into());
    m.insert("acked_not_applied".into(), audit.acked_not_applied.into());
    m.insert("unknown".into(), audit.unknown.into());
    m.insert("timed_out".into(), u64::from(timed_out).into());
    let server_cpu = (cpu1 - cpu0).max(0.0);
    m.insert("server_cpu_s".into(), server_cpu.into());
    m.insert(
        "server_cpu_us_per_order".into(),
        (server_cpu * 1e6 / drained.max(1.0)).into(),
    );
    m.insert("client_cpu_s".into(), (self1 - self0).as_secs_f64().into());
    put_counters(&mut r, "server_", &after.since(&before));
    put_counters(&mut r, "client_", &client);
    r.histograms
        .insert("continue_to_stored".into(), hist::encode(&histogram));
    harness::clean(&dirs, false);
    Ok(r)
}
