//! **first-contact**: one order to each of `peers` devices the server has never met, over a link with a set round
//! trip time; the time from handing the order over to "stored".
//!
//! The server sits behind the suite's link emulator (UDP and TCP on the same port, `emulator.rs`), which adds half
//! the RTT in each direction and measures what it actually added. Peers go one at a time, so each measures a first
//! contact on an otherwise idle link: for Pure that is the first sealed record (1 round trip), for QUIC a handshake
//! and then the order on a stream (2), for MQTT a TCP handshake, the TLS 1.3 handshake, CONNECT and then the PUBLISH
//! (4, or 3 where the client sends CONNECT with its TLS Finished and PUBLISH without waiting for CONNACK).
//!
//! Metrics: `rtt_ms` (the setting), `measured_rtt_ms` (what the emulator added, medians of both directions),
//! `p50_ms`, `p99_ms`, `round_trips` (p50 / RTT), `handshakes` (client side); histogram `time_to_stored`.

use crate::emulator::{LinkConfig, LinkEmulator};
use crate::harness::{self, any_loopback, Harness, WorkloadError};
use crate::hist;
use crate::result::RunResult;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use transport_core::{LinkEvent, Order, OrderId, Transport};

/// The first-contact workload's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstContactParams {
    /// Peers, each never met before.
    pub peers: u32,
    /// The round trip time the emulator adds (half each way).
    pub rtt_ms: u64,
    /// Bytes of payload per order.
    pub payload_bytes: u32,
    /// Give up on one peer after this long.
    pub timeout_s: u64,
}

impl FirstContactParams {
    /// Seed 095's M4 (100 peers) or a CI-sized run, at one RTT.
    pub fn for_profile(profile: harness::Profile, rtt_ms: u64) -> FirstContactParams {
        let peers = match profile {
            harness::Profile::Seed => 100,
            harness::Profile::Quick => 20,
        };
        FirstContactParams {
            peers,
            rtt_ms,
            payload_bytes: 64,
            timeout_s: 10,
        }
    }
}

/// The RTTs of seed 095's M4, in milliseconds.
pub const SEED_RTTS_MS: [u64; 3] = [10, 50, 100];

/// Run one round of first contact at `p.rtt_ms`.
pub async fn run(
    h: &Harness,
    transport: &dyn Transport,
    round: u32,
    p: &FirstContactParams,
) -> Result<RunResult, WorkloadError> {
    let spec = transport.spec();
    let dirs = h.dirs(&format!("first-contact-{}ms", p.rtt_ms), spec, round)?;
    transport.prepare(&dirs.identity, p.peers)?;
    let mut server = h.start_server(spec, any_loopback(), &dirs).await?;
    let config = LinkConfig::with_rtt(Duration::from_millis(p.rtt_ms));
    let link = LinkEmulator::start(server.ready().addr, config)?;
    let mut f = h.fleet(transport, link.addr(), &dirs, p.peers).await?;
    let mut times = hist::new();
    let mut made = Vec::new();
    let mut acked = Vec::new();
    for d in 0..p.peers {
        let id = OrderId {
            sender: transport_core::sender_id(&transport_core::device_name(d)),
            run: harness::new_run(),
            seq: 0,
        };
        let order = Order {
            id,
            made_us: harness::unix_us(),
            payload: harness::payload(&id, p.payload_bytes as usize),
        };
        made.push(id);
        let t0 = Instant::now();
        f.fleet.send(d, order);
        let deadline = t0 + Duration::from_secs(p.timeout_s);
        loop {
            match tokio::time::timeout_at(deadline.into(), f.events.recv()).await {
                Ok(Some(LinkEvent::Stored { id: got, at, .. })) if got == id => {
                    hist::record(&mut times, at.saturating_duration_since(t0));
                    acked.push(id);
                    break;
                }
                Ok(Some(_)) => {}
                _ => {
                    return Err(WorkloadError::Timeout(format!(
                        "peer {d}'s first order was not answered within {} s",
                        p.timeout_s
                    )))
                }
            }
        }
    }
    let client = f.counters.snapshot();
    f.fleet.close().await;
    let _ = server.shutdown().await;
    let measured = {
        let m = link.measured();
        (m.to_server.p50_us + m.to_client.p50_us) / 1e3
    };
    let audit = transport_core::store::audit(&dirs.store, &made, &acked)?;

    let p50 = hist::quantile_ms(&times, 0.5);
    let mut r = h.result("first-contact", spec, round, p);
    let m = &mut r.metrics;
    m.insert("rtt_ms".into(), p.rtt_ms.into());
    m.insert("measured_rtt_ms".into(), measured.into());
    m.insert("p50_ms".into(), p50.into());
    m.insert("p99_ms".into(), hist::quantile_ms(&times, 0.99).into());
    m.insert("round_trips".into(), (p50 / p.rtt_ms.max(1) as f64).into());
    m.insert("handshakes".into(), client.handshakes.into());
    m.insert("client_asym_ops".into(), client.asym_ops().into());
    m.insert("lost".into(), audit.lost.into());
    m.insert("duplicates".into(), audit.duplicates.into());
    r.histograms
        .insert("time_to_stored".into(), hist::encode(&times));
    harness::clean(&dirs, false);
    Ok(r)
}
