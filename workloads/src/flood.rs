//! **flood**: publisher/subscriber pairs (seed 002's flood): `pairs` publishers each publish to a channel of their
//! own, which one subscriber subscribes to at `qos`. With `rate_per_s` 0 each publisher sends as fast as its link
//! accepts, with at most `window` messages handed over and not yet accepted (QoS 1: acknowledged by the server,
//! like an MQTT client's in-flight limit; QoS 0: written), so the load is as much as the server takes and the
//! latency counts from handing a message over. With a rate (the moderate-rate case, [`crate::moderate_rate`]) each
//! publisher publishes open loop at that rate.
//!
//! Metrics: [`crate::pubsub::METRICS`] (`published_per_s`, `delivered_per_s`, dropped, undelivered, publish to
//! delivered p50/p99/max, connections lost, server CPU), and the case (`pairs`, `qos`, `payload_bytes`,
//! `rate_per_s`); histogram `publish_to_delivered`.

use crate::harness::{Profile, Run, WorkloadError};
use crate::pubsub::{self, Load, Pace};
use crate::workload::{Better, Column, Format, Info, Workload};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use transport_core::{BoxFuture, Need};

/// The flood's parameters (and the moderate-rate case's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FloodParams {
    /// Publisher/subscriber pairs, each on a channel of its own.
    pub pairs: u32,
    /// QoS of publishing and subscribing: 0 or 1.
    pub qos: u8,
    /// Bytes of payload per message (at least 8).
    pub payload_bytes: u32,
    /// Messages per second per publisher, open loop; 0: as fast as the link accepts, within `window`.
    pub rate_per_s: f64,
    /// With `rate_per_s` 0: messages per publisher handed over and not yet accepted.
    pub window: u32,
    /// How long the publishers publish.
    pub duration_s: u64,
    /// After that, how long to wait for the last deliveries.
    pub drain_timeout_s: u64,
}

/// A publisher's window: rumqttc's default in-flight limit (100), a Rust MQTT client's users' usual setting; the
/// same bound holds QoS 0 messages not yet written.
pub const WINDOW: u32 = 100;

/// The flood workload.
#[derive(Debug, Clone, Copy)]
pub struct Flood;

const INFO: Info = Info {
    name: "flood",
    about: "publisher/subscriber pairs, publishers as fast as the server accepts (a bounded window each)",
    needs: &[Need::PubSub],
    metrics: pubsub::METRICS,
    columns: &[
        Column::new("pairs", "pairs", Format::Count),
        Column::new("QoS", "qos", Format::Count),
        Column::new("bytes", "payload_bytes", Format::Count),
        Column::new("msg/s per publisher", "rate_per_s", Format::Count),
        Column::new("published/s", "published_per_s", Format::Count).higher(),
        Column::new("delivered/s", "delivered_per_s", Format::Count).higher(),
        Column::new("p50, ms", "p50_ms", Format::Decimal).lower(),
        Column::new("p99, ms", "p99_ms", Format::Decimal).lower(),
        Column::new("dropped", "dropped", Format::Sum).lower(),
        Column::new("lost in sockets", "lost_in_sockets", Format::Sum).lower(),
        Column::new("undelivered", "undelivered", Format::Sum).lower(),
        Column::new("connections lost", "connections_lost", Format::Sum).lower(),
        Column::new("server CPU, % of a core", "server_cpu_pct", Format::Decimal),
        Column::new("client CPU, s", "client_cpu_s", Format::Decimal),
    ],
    primary: ("delivered_per_s", Better::Higher),
    case_keys: &["pairs", "qos", "payload_bytes", "rate_per_s"],
    sweep: None,
};

/// A flood case (as fast as accepted) of `pairs` pairs.
fn flood(pairs: u32, qos: u8, payload_bytes: u32, duration_s: u64) -> FloodParams {
    FloodParams {
        pairs,
        qos,
        payload_bytes,
        rate_per_s: 0.0,
        window: WINDOW,
        duration_s,
        drain_timeout_s: 60,
    }
}

/// Seed 002's moderate-rate cases: 8 pairs × 100 messages/s, 64 B, QoS 0 and 1.
pub fn moderate_cases(profile: Profile) -> Vec<FloodParams> {
    let duration_s = match profile {
        Profile::Seed => 20,
        Profile::Quick => 3,
    };
    [0, 1]
        .into_iter()
        .map(|qos| FloodParams {
            rate_per_s: 100.0,
            drain_timeout_s: 30,
            ..flood(8, qos, 64, duration_s)
        })
        .collect()
}

impl Workload for Flood {
    type Params = FloodParams;

    fn info(&self) -> &'static Info {
        &INFO
    }

    /// Seed 002's flood rows (16 pairs at QoS 0 and 1, 64 B and 1 KiB; 64 pairs at QoS 1, 64 B), 10 s each, and its
    /// moderate-rate cases; or fewer pairs for less time.
    fn cases(&self, profile: Profile) -> Vec<FloodParams> {
        let (pairs, many, duration_s) = match profile {
            Profile::Seed => (16, 64, 10),
            Profile::Quick => (4, 8, 2),
        };
        let mut cases = vec![
            flood(pairs, 0, 64, duration_s),
            flood(pairs, 0, 1024, duration_s),
            flood(pairs, 1, 64, duration_s),
            flood(pairs, 1, 1024, duration_s),
            flood(many, 1, 64, duration_s),
        ];
        cases.extend(moderate_cases(profile));
        cases
    }

    fn check(&self, p: &FloodParams) -> Result<(), String> {
        check(p)
    }

    fn run<'a>(
        &'a self,
        run: &'a mut Run<'_>,
        p: &'a FloodParams,
    ) -> BoxFuture<'a, Result<(), WorkloadError>> {
        Box::pin(run_pairs(run, p))
    }
}

/// Check a flood or moderate-rate case.
pub fn check(p: &FloodParams) -> Result<(), String> {
    pubsub::qos(p.qos)?;
    if p.pairs == 0 || p.duration_s == 0 {
        return Err("pairs and duration_s must be at least 1".into());
    }
    if !(p.rate_per_s >= 0.0 && p.rate_per_s <= 1e6) {
        return Err(format!("rate_per_s {}: must be 0 to 1000000", p.rate_per_s));
    }
    if p.rate_per_s == 0.0 && p.window == 0 {
        return Err("window must be at least 1 when rate_per_s is 0".into());
    }
    if p.payload_bytes < 8 || p.payload_bytes as usize > transport_core::MAX_PAYLOAD {
        return Err(format!(
            "payload_bytes {}: must be 8 to 65535 (the id travels in it)",
            p.payload_bytes
        ));
    }
    Ok(())
}

/// Record a case's parameters as metrics (the flood's, the moderate rate's and the publish workload's).
pub fn record_case(run: &mut Run<'_>, p: &FloodParams) {
    run.metric("pairs", p.pairs);
    run.metric("qos", p.qos);
    run.metric("payload_bytes", p.payload_bytes);
    run.metric("rate_per_s", p.rate_per_s);
}

/// Run a flood or moderate-rate case.
pub async fn run_pairs(run: &mut Run<'_>, p: &FloodParams) -> Result<(), WorkloadError> {
    let channels: Vec<u32> = (0..p.pairs).collect();
    let pace = if p.rate_per_s > 0.0 {
        Pace::Rate {
            per_s: p.rate_per_s,
        }
    } else {
        Pace::Window { window: p.window }
    };
    let load = Load {
        publishers: channels.clone(),
        subscribers: channels,
        qos: pubsub::qos(p.qos).map_err(WorkloadError::Params)?,
        payload_bytes: p.payload_bytes,
        pace,
        duration: Duration::from_secs(p.duration_s),
        drain_timeout: Duration::from_secs(p.drain_timeout_s),
    };
    record_case(run, p);
    pubsub::run(run, &load).await
}
