//! **moderate-rate**: seed 002's latency at a moderate rate, the flood's open-loop case by name: 8
//! publisher/subscriber pairs, each publisher 100 messages/s of 64 B, at QoS 0 and at QoS 1; publish-to-delivered
//! p50 and p99 from each message's intended time. The same cases are part of `flood`'s profiles; this runs only them.

use crate::flood::{self, FloodParams};
use crate::harness::{Profile, Run, WorkloadError};
use crate::workload::{Better, Column, Format, Info, Workload};
use transport_core::{BoxFuture, Need};

/// The moderate-rate workload.
#[derive(Debug, Clone, Copy)]
pub struct ModerateRate;

const INFO: Info = Info {
    name: "moderate-rate",
    about: "8 publisher/subscriber pairs at 100 messages/s each, 64 B: latency at a moderate rate",
    needs: &[Need::PubSub],
    metrics: crate::pubsub::METRICS,
    columns: &[
        Column::new("pairs", "pairs", Format::Count),
        Column::new("QoS", "qos", Format::Count),
        Column::new("msg/s per publisher", "rate_per_s", Format::Count),
        Column::new("delivered/s", "delivered_per_s", Format::Count).higher(),
        Column::new("p50, ms", "p50_ms", Format::Decimal).lower(),
        Column::new("p99, ms", "p99_ms", Format::Decimal).lower(),
        Column::new("max, ms", "max_ms", Format::Decimal).lower(),
        Column::new("publish lag p99, ms", "publish_lag_p99_ms", Format::Decimal),
        Column::new("dropped", "dropped", Format::Sum).lower(),
        Column::new("lost in sockets", "lost_in_sockets", Format::Sum).lower(),
        Column::new("undelivered", "undelivered", Format::Sum).lower(),
        Column::new("connections lost", "connections_lost", Format::Sum).lower(),
    ],
    primary: ("p99_ms", Better::Lower),
    case_keys: &["qos"],
    sweep: None,
};

impl Workload for ModerateRate {
    type Params = FloodParams;

    fn info(&self) -> &'static Info {
        &INFO
    }

    fn cases(&self, profile: Profile) -> Vec<FloodParams> {
        flood::moderate_cases(profile)
    }

    fn check(&self, p: &FloodParams) -> Result<(), String> {
        if p.rate_per_s <= 0.0 {
            return Err("rate_per_s must be above 0: this is the open-loop case".into());
        }
        flood::check(p)
    }

    fn run<'a>(
        &'a self,
        run: &'a mut Run<'_>,
        p: &'a FloodParams,
    ) -> BoxFuture<'a, Result<(), WorkloadError>> {
        Box::pin(flood::run_pairs(run, p))
    }
}
