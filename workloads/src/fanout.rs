//! **fanout**: one publisher, many subscribers (seed 002's fanout): `subscribers` devices subscribe to one channel
//! at `qos`; one device publishes `payload_bytes`-byte messages to it at `rate_per_s` for `duration_s`, open loop
//! (each message has an intended time and latency counts from it). Every message is expected once at every
//! subscriber; what the server cannot deliver in time it drops and counts (the relay's back-pressure,
//! docs/workloads.md).
//!
//! Metrics: [`crate::pubsub::METRICS`] (expected, delivered, `delivered_per_s`, dropped, undelivered, publish to
//! delivered p50/p99/max, connections lost, server CPU and memory), and the case (`subscribers`, `qos`,
//! `rate_per_s`); histograms `publish_to_delivered` and `publish_lag`.

use crate::harness::{Profile, Run, WorkloadError};
use crate::pubsub::{self, Load, Pace};
use crate::workload::{Better, Column, Format, Info, Workload};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use transport_core::{BoxFuture, Need};

/// The fanout's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FanoutParams {
    /// Subscribers of the one channel.
    pub subscribers: u32,
    /// QoS of publishing and subscribing: 0 or 1.
    pub qos: u8,
    /// Messages per second the publisher publishes.
    pub rate_per_s: f64,
    /// Bytes of payload per message (at least 8).
    pub payload_bytes: u32,
    /// How long the publisher publishes.
    pub duration_s: u64,
    /// After that, how long to wait for the last deliveries.
    pub drain_timeout_s: u64,
}

/// The fanout workload.
#[derive(Debug, Clone, Copy)]
pub struct Fanout;

const INFO: Info = Info {
    name: "fanout",
    about: "one publisher, many subscribers of its channel, messages at a set rate (open loop)",
    needs: &[Need::PubSub],
    metrics: pubsub::METRICS,
    columns: &[
        Column::new("subscribers", "subscribers", Format::Count),
        Column::new("QoS", "qos", Format::Count),
        Column::new("msg/s", "rate_per_s", Format::Count),
        Column::new("expected/s", "expected_per_s", Format::Count),
        Column::new("delivered/s", "delivered_per_s", Format::Count).higher(),
        Column::new("p50, ms", "p50_ms", Format::Decimal).lower(),
        Column::new("p99, ms", "p99_ms", Format::Decimal).lower(),
        Column::new("max, ms", "max_ms", Format::Decimal).lower(),
        Column::new("dropped", "dropped", Format::Sum).lower(),
        Column::new("lost in sockets", "lost_in_sockets", Format::Sum).lower(),
        Column::new("undelivered", "undelivered", Format::Sum).lower(),
        Column::new("connections lost", "connections_lost", Format::Sum).lower(),
        Column::new("server CPU, % of a core", "server_cpu_pct", Format::Decimal).lower(),
        Column::new("server RSS, MiB", "server_rss_max_mib", Format::Decimal).lower(),
        Column::new(
            "RSS per link, KiB",
            "server_rss_per_link_kib",
            Format::Decimal,
        )
        .lower(),
    ],
    primary: ("delivered_per_s", Better::Higher),
    case_keys: &["subscribers", "qos", "rate_per_s"],
    sweep: None,
};

impl Workload for Fanout {
    type Params = FanoutParams;

    fn info(&self) -> &'static Info {
        &INFO
    }

    /// Seed 002's three cases (100 subscribers at QoS 0 and 1, 50 msg/s; 1,000 at QoS 0, 10 msg/s), 20 s each; or
    /// the same shapes, smaller and shorter.
    fn cases(&self, profile: Profile) -> Vec<FanoutParams> {
        let (scale, duration_s) = match profile {
            Profile::Seed => (1, 20),
            Profile::Quick => (10, 3),
        };
        [(100, 0, 50.0), (100, 1, 50.0), (1000, 0, 10.0)]
            .into_iter()
            .map(|(subscribers, qos, rate_per_s)| FanoutParams {
                subscribers: subscribers / scale,
                qos,
                rate_per_s,
                payload_bytes: 64,
                duration_s,
                drain_timeout_s: 30,
            })
            .collect()
    }

    fn check(&self, p: &FanoutParams) -> Result<(), String> {
        pubsub::qos(p.qos)?;
        if p.subscribers == 0 || p.duration_s == 0 {
            return Err("subscribers and duration_s must be at least 1".into());
        }
        if !(p.rate_per_s > 0.0 && p.rate_per_s <= 1e6) {
            return Err(format!(
                "rate_per_s {}: must be above 0 and at most 1000000",
                p.rate_per_s
            ));
        }
        if p.payload_bytes < 8 || p.payload_bytes as usize > transport_core::MAX_PAYLOAD {
            return Err(format!(
                "payload_bytes {}: must be 8 to 65535 (the id travels in it)",
                p.payload_bytes
            ));
        }
        Ok(())
    }

    fn run<'a>(
        &'a self,
        run: &'a mut Run<'_>,
        p: &'a FanoutParams,
    ) -> BoxFuture<'a, Result<(), WorkloadError>> {
        Box::pin(async move {
            let load = Load {
                publishers: vec![0],
                subscribers: vec![0; p.subscribers as usize],
                qos: pubsub::qos(p.qos).map_err(WorkloadError::Params)?,
                payload_bytes: p.payload_bytes,
                pace: Pace::Rate {
                    per_s: p.rate_per_s,
                },
                duration: Duration::from_secs(p.duration_s),
                drain_timeout: Duration::from_secs(p.drain_timeout_s),
            };
            run.metric("subscribers", p.subscribers);
            run.metric("qos", p.qos);
            run.metric("rate_per_s", p.rate_per_s);
            pubsub::run(run, &load).await
        })
    }
}
