//! **first-contact**: one order to each of `peers` devices the server has never met, over a link with a set round
//! trip time; the time from handing the order over to "stored".
//!
//! The server sits behind the suite's link emulator (UDP and TCP on the same port, `emulator.rs`), which adds half
//! the RTT in each direction and measures what it actually added. Peers go one at a time, so each measures a first
//! contact on an otherwise idle link: for Pure that is the first sealed record (1 round trip), for QUIC a handshake
//! and then the order on a stream (2), for MQTT a TCP handshake, the TLS 1.3 handshake, CONNECT and then the PUBLISH
//! (4, or 3 where the client sends CONNECT with its TLS Finished and PUBLISH without waiting for CONNACK, or 2 when
//! its ClientHello also rides in the SYN with TCP Fast Open).
//!
//! A peer whose order is not answered within `timeout_s` is `unanswered`: it counts in the histogram at the timeout,
//! the run is marked `timed_out`, and the next peer goes on.
//!
//! Metrics: `rtt_ms` (the setting), `measured_rtt_ms` (what the emulator added, medians of both directions),
//! `p50_ms`, `p99_ms`, `round_trips` (p50 / RTT), `handshakes` (client side), `orders_made`, `orders_acked`,
//! `unanswered`, `timed_out`; the emulator's whole measurement of each direction (`link_to_server_*` and
//! `link_to_client_*`: `packets`, `mean_ms`, `p50_ms`, `p99_ms`, `max_ms`, `dropped`, `held`) and its flows
//! (`link_flows`, `link_flow_errors`, `link_fast_open`); the client's TCP Fast Open (`fast_open`,
//! `fast_open_refused`); histogram `time_to_stored`.

use crate::emulator::{LinkConfig, LinkEmulator};
use crate::harness::{self, Profile, Run, Waited, WorkloadError};
use crate::hist;
use crate::workload::{Better, Column, Format, Info, Metric, Sweep, Workload};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use transport_core::{BoxFuture, LinkEvent, Need};

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

/// The RTTs of seed 095's M4, in milliseconds.
pub const SEED_RTTS_MS: [u64; 3] = [10, 50, 100];

/// The first-contact workload.
#[derive(Debug, Clone, Copy)]
pub struct FirstContact;

const INFO: Info = Info {
    name: "first-contact",
    about:
        "one order to each of many peers never met, over the link emulator at a set round trip time",
    needs: &[Need::StoredAnswers],
    metrics: &[
        Metric {
            key: "rtt_ms",
            unit: "ms",
            about: "the round trip time the emulator adds (the setting)",
        },
        Metric {
            key: "measured_rtt_ms",
            unit: "ms",
            about: "what the emulator added, the medians of both directions",
        },
        Metric {
            key: "p50_ms",
            unit: "ms",
            about: "median time from handing an order over to \"stored\"",
        },
        Metric {
            key: "p99_ms",
            unit: "ms",
            about: "99th percentile of the same",
        },
        Metric {
            key: "round_trips",
            unit: "RTTs",
            about: "p50 / RTT",
        },
        Metric {
            key: "handshakes",
            unit: "count",
            about: "handshakes the client side made",
        },
        Metric {
            key: "client_asym_ops",
            unit: "count",
            about: "asymmetric operations of the client side",
        },
        Metric {
            key: "link_to_server_p99_ms",
            unit: "ms",
            about: "the emulator's added delay toward the server, 99th percentile (also _p50, _max, _mean, _packets, _dropped, _held; and link_to_client_*)",
        },
        Metric {
            key: "fast_open",
            unit: "count",
            about: "client connections whose first bytes went in the SYN and were taken (TCP Fast Open; `mqtt:fast-open`)",
        },
        Metric {
            key: "fast_open_refused",
            unit: "count",
            about: "client connections that sent data in the SYN and had it refused (the run is not to be trusted)",
        },
        Metric {
            key: "link_fast_open",
            unit: "count",
            about: "TCP connections the emulator accepted with data in the SYN (it then modelled a half-round-trip handshake)",
        },
        Metric {
            key: "unanswered",
            unit: "count",
            about: "peers whose order was not answered within the timeout (in the histogram at the timeout)",
        },
        Metric {
            key: "lost",
            unit: "count",
            about: "orders made that are not in the store's log (never stored; an acknowledged one is also in acked_not_applied)",
        },
        Metric {
            key: "duplicates",
            unit: "count",
            about: "orders applied more than once",
        },
    ],
    columns: &[
        Column::new("RTT, ms", "rtt_ms", Format::Count),
        Column::new("measured RTT, ms", "measured_rtt_ms", Format::Decimal),
        Column::new("p50, ms", "p50_ms", Format::Decimal).lower(),
        Column::new("round trips", "round_trips", Format::Decimal).lower(),
        Column::new("p99, ms", "p99_ms", Format::Decimal).lower(),
        Column::new("handshakes", "handshakes", Format::Count).lower(),
        Column::new("lost", "lost", Format::Sum).lower(),
        Column::new("applied twice", "duplicates", Format::Sum).lower(),
    ],
    primary: ("round_trips", Better::Lower),
    case_keys: &["rtt_ms"],
    sweep: Some(Sweep {
        key: "rtt_ms",
        header: "RTT, ms",
        shared: &[Column::new(
            "emulated RTT measured, ms",
            "measured_rtt_ms",
            Format::Decimal,
        )],
        per_transport: &[
            Column::new("p50, ms", "p50_ms", Format::Decimal).lower(),
            Column::new("round trips", "round_trips", Format::Decimal).lower(),
        ],
    }),
};

impl Workload for FirstContact {
    type Params = FirstContactParams;

    fn info(&self) -> &'static Info {
        &INFO
    }

    /// Seed 095's M4 (100 peers at 10, 50 and 100 ms) or a CI-sized run at the same RTTs.
    fn cases(&self, profile: Profile) -> Vec<FirstContactParams> {
        let peers = match profile {
            Profile::Seed => 100,
            Profile::Quick => 20,
        };
        SEED_RTTS_MS
            .iter()
            .map(|&rtt_ms| FirstContactParams {
                peers,
                rtt_ms,
                payload_bytes: 64,
                timeout_s: 10,
            })
            .collect()
    }

    fn check(&self, p: &FirstContactParams) -> Result<(), String> {
        if p.rtt_ms == 0 || p.rtt_ms > 60_000 {
            return Err(format!(
                "rtt_ms {}: a round trip time must be between 1 and 60000 ms",
                p.rtt_ms
            ));
        }
        if p.peers == 0 {
            return Err("peers must be at least 1".into());
        }
        Ok(())
    }

    fn run<'a>(
        &'a self,
        run: &'a mut Run<'_>,
        params: &'a FirstContactParams,
    ) -> BoxFuture<'a, Result<(), WorkloadError>> {
        Box::pin(first_contact(run, params))
    }
}

async fn first_contact(run: &mut Run<'_>, p: &FirstContactParams) -> Result<(), WorkloadError> {
    run.prepare(p.peers)?;
    let addr = run.start_server().await?;
    let config = LinkConfig::with_rtt(Duration::from_millis(p.rtt_ms));
    let link = LinkEmulator::start(addr, config)?;
    let mut f = run.fleet(link.addr(), p.peers).await?;
    let mut times = hist::new();
    let mut made = Vec::new();
    let mut acked = Vec::new();
    let limit = Duration::from_secs(p.timeout_s);
    let mut unanswered = 0u64;
    for d in 0..p.peers {
        let order = harness::order(d, harness::new_run(), 0, p.payload_bytes as usize);
        let id = order.id;
        made.push(id);
        let t0 = Instant::now();
        f.fleet.send(d, order);
        let waited = f
            .until(t0 + limit, |event| match *event {
                LinkEvent::Stored { id: got, at, .. } if got == id => {
                    hist::record(&mut times, at.saturating_duration_since(t0));
                    acked.push(id);
                    true
                }
                _ => false,
            })
            .await;
        match waited {
            Waited::Done => {}
            Waited::TimedOut => {
                // Never hidden: it counts at the timeout, and the run is marked.
                run.say(&format!(
                    "peer {d}'s first order was not answered within {limit:?}"
                ));
                hist::record(&mut times, limit);
                unanswered += 1;
            }
            Waited::Closed => {
                return Err(WorkloadError::Timeout(format!(
                    "the fleet stopped reporting before peer {d}'s order was answered"
                )))
            }
        }
    }
    let client = f.counters.snapshot();
    f.fleet.close().await;
    run.stop_server().await?;
    let link = link.measured();
    let measured = (link.to_server.p50_us + link.to_client.p50_us) / 1e3;
    run.audit(&made, &acked)?;

    let p50 = hist::quantile_ms(&times, 0.5);
    run.metric("rtt_ms", p.rtt_ms);
    run.metric("measured_rtt_ms", measured);
    run.metric("p50_ms", p50);
    run.metric("p99_ms", hist::quantile_ms(&times, 0.99));
    run.metric("round_trips", p50 / p.rtt_ms.max(1) as f64);
    run.metric("handshakes", client.handshakes);
    run.metric("client_asym_ops", client.asym_ops());
    run.metric("orders_made", made.len());
    run.metric("orders_acked", acked.len());
    run.metric("unanswered", unanswered);
    run.metric("timed_out", u64::from(unanswered > 0));
    for (direction, d) in [
        ("to_server", &link.to_server),
        ("to_client", &link.to_client),
    ] {
        let key = |what: &str| format!("link_{direction}_{what}");
        run.metric(&key("packets"), d.packets);
        run.metric(&key("mean_ms"), d.mean_us / 1e3);
        run.metric(&key("p50_ms"), d.p50_us / 1e3);
        run.metric(&key("p99_ms"), d.p99_us / 1e3);
        run.metric(&key("max_ms"), d.max_us / 1e3);
        run.metric(&key("dropped"), d.dropped);
        run.metric(&key("held"), d.held);
    }
    run.metric("link_flows", link.flows);
    run.metric("link_flow_errors", link.flow_errors);
    run.metric("link_fast_open", link.fast_open);
    run.metric("fast_open", client.fast_open);
    run.metric("fast_open_refused", client.fast_open_refused);
    run.histogram("time_to_stored", &times);
    Ok(())
}
