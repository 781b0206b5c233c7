//! **publish**: the server's raw publish rate. Publishers each publish to a channel of their own that nobody
//! subscribes to, as fast as the server accepts, with at most `window` messages handed over and not yet accepted
//! each (QoS 1: acknowledged, MQTT's PUBACK; QoS 0: written). Nothing is delivered, so the rate is the server's
//! cost of taking a publish and answering it, without the relay's fan-out: `published_per_s` and the server's CPU
//! per message beside it.
//!
//! The flood's parameters ([`FloodParams`]; `pairs` is the number of publishers, `rate_per_s` 0); its accounting
//! ([`crate::pubsub`]) holds with no subscribers: every message is accepted and expected nowhere. The broker's
//! order store plays no part (a message to a channel is not an order), and its session journal none either (clean
//! sessions, no subscriptions), so `--sync` does not change this workload.
//!
//! Metrics: the publish/subscribe metrics ([`crate::pubsub::METRICS`]), and `server_cpu_us_per_message` (the
//! serving process's CPU over the load / messages accepted during it).

use crate::flood::{self, FloodParams, WINDOW};
use crate::harness::{Profile, Run, WorkloadError};
use crate::pubsub::{self, Load, Pace};
use crate::workload::{Better, Column, Format, Info, Metric, Workload};
use std::sync::LazyLock;
use std::time::Duration;
use transport_core::{BoxFuture, Need};

/// The publish workload.
#[derive(Debug, Clone, Copy)]
pub struct Publish;

/// The publish/subscribe metrics and the CPU per message.
static METRICS: LazyLock<Vec<Metric>> = LazyLock::new(|| {
    let mut m = pubsub::METRICS.to_vec();
    m.push(Metric {
        key: "server_cpu_us_per_message",
        unit: "µs",
        about: "the serving process's CPU over the load / messages accepted during it",
    });
    m
});

const COLUMNS: &[Column] = &[
    Column::new("publishers", "pairs", Format::Count),
    Column::new("QoS", "qos", Format::Count),
    Column::new("bytes", "payload_bytes", Format::Count),
    Column::new("published/s", "published_per_s", Format::Count).higher(),
    Column::new(
        "server CPU µs/message",
        "server_cpu_us_per_message",
        Format::Decimal,
    )
    .lower(),
    Column::new("server CPU, % of a core", "server_cpu_pct", Format::Decimal),
    Column::new("client CPU, s", "client_cpu_s", Format::Decimal),
    Column::new("connections lost", "connections_lost", Format::Sum).lower(),
];

static INFO: LazyLock<Info> = LazyLock::new(|| {
    Info {
    name: "publish",
    about: "publishers only, to channels nobody subscribes to, as fast as the server accepts: the raw publish rate",
    needs: &[Need::PubSub],
    metrics: METRICS.as_slice(),
    columns: COLUMNS,
    primary: ("published_per_s", Better::Higher),
    case_keys: &["pairs", "qos", "payload_bytes"],
    sweep: None,
}
});

impl Workload for Publish {
    type Params = FloodParams;

    fn info(&self) -> &'static Info {
        &INFO
    }

    /// 16 publishers at QoS 1 with 64 B and 1 KiB, 10 s each (the flood's QoS 1 rows without their subscribers);
    /// or 4 publishers for 2 s.
    fn cases(&self, profile: Profile) -> Vec<FloodParams> {
        let (publishers, duration_s) = match profile {
            Profile::Seed => (16, 10),
            Profile::Quick => (4, 2),
        };
        [64, 1024]
            .into_iter()
            .map(|payload_bytes| FloodParams {
                pairs: publishers,
                qos: 1,
                payload_bytes,
                rate_per_s: 0.0,
                window: WINDOW,
                duration_s,
                drain_timeout_s: 30,
            })
            .collect()
    }

    fn check(&self, p: &FloodParams) -> Result<(), String> {
        if p.rate_per_s != 0.0 {
            return Err("rate_per_s must be 0: publishers go as fast as the server accepts".into());
        }
        flood::check(p)
    }

    fn run<'a>(
        &'a self,
        run: &'a mut Run<'_>,
        p: &'a FloodParams,
    ) -> BoxFuture<'a, Result<(), WorkloadError>> {
        Box::pin(publish(run, p))
    }
}

async fn publish(run: &mut Run<'_>, p: &FloodParams) -> Result<(), WorkloadError> {
    let load = Load {
        publishers: (0..p.pairs).collect(),
        subscribers: Vec::new(),
        qos: pubsub::qos(p.qos).map_err(WorkloadError::Params)?,
        payload_bytes: p.payload_bytes,
        pace: Pace::Window { window: p.window },
        duration: Duration::from_secs(p.duration_s),
        drain_timeout: Duration::from_secs(p.drain_timeout_s),
    };
    flood::record_case(run, p);
    pubsub::run(run, &load).await?;
    let cpu = run.metric_f64("server_cpu_s");
    let rate = run.metric_f64("published_per_s");
    if let (Some(cpu), Some(rate)) = (cpu, rate) {
        let messages = rate * p.duration_s as f64;
        if messages > 0.0 {
            run.metric("server_cpu_us_per_message", cpu * 1e6 / messages);
        }
    }
    Ok(())
}
