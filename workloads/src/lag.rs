//! The load generator, watched: how late each open-loop send left ([`SendLag`], paced by a [`Pacer`]), how busy the
//! generator was ([`GeneratorLoad`]), and the rule that marks a run **generator-bound** ([`verdict`]), so that a
//! generator's delay is never charged to the transport unseen.
//!
//! A run is generator-bound when
//!
//! - the 99th percentile of its send lag (actual send minus intended send) is over [`LAG_P99_LIMIT`], or
//! - the generator's CPU over the measured window is at least [`BUSY_LIMIT`] of the CPUs it may use (its pinned
//!   CPUs; every CPU of the machine when not pinned), unless the server was at least as busy on its own CPU
//!   (a closed-loop workload such as the drain, where both can be saturated: then the server is the limit).
//!
//! [`record`] writes the histogram `send_lag` (µs), `send_lag_p50_ms`, `send_lag_p99_ms`, `send_lag_max_ms`,
//! `generator_busy` (fraction of its CPUs) and `generator_bound` (0/1) into a run's result.

use crate::harness::Run;
use crate::hist;
use hdrhistogram::Histogram;
use std::time::{Duration, Instant};

/// A send later than this at the 99th percentile marks the run generator-bound.
pub const LAG_P99_LIMIT: Duration = Duration::from_millis(10);
/// A generator busy for at least this fraction of its CPUs marks the run generator-bound.
pub const BUSY_LIMIT: f64 = 0.9;

/// Each send's lag behind its intended time, in an HDR histogram (µs).
#[derive(Debug, Clone)]
pub struct SendLag {
    histogram: Histogram<u64>,
}

impl Default for SendLag {
    fn default() -> Self {
        SendLag {
            histogram: hist::new(),
        }
    }
}

impl SendLag {
    /// No sends yet.
    pub fn new() -> SendLag {
        SendLag::default()
    }

    /// A send that left at `actual`, intended for `intended` (early sends count as no lag).
    pub fn record(&mut self, intended: Instant, actual: Instant) {
        // The histogram's lowest value is 1 µs: a send on time records as 1.
        hist::record(
            &mut self.histogram,
            actual.saturating_duration_since(intended),
        );
    }

    /// Add another recorder's sends (per-task recorders, merged).
    pub fn merge(&mut self, other: &SendLag) {
        // Both have the bounds of `hist::new`, so adding cannot fail.
        let _ = self.histogram.add(&other.histogram);
    }

    /// The histogram.
    pub fn histogram(&self) -> &Histogram<u64> {
        &self.histogram
    }

    /// A quantile of the lag.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.histogram.is_empty() {
            Duration::ZERO
        } else {
            Duration::from_micros(self.histogram.value_at_quantile(q))
        }
    }
}

/// Open-loop pacing: wait for each send's intended time (an offset from `start`), then record how late it left.
#[derive(Debug)]
pub struct Pacer {
    start: Instant,
    lag: SendLag,
}

impl Pacer {
    /// Pace sends whose intended times are offsets from `start`.
    pub fn new(start: Instant) -> Pacer {
        Pacer {
            start,
            lag: SendLag::new(),
        }
    }

    /// Wait until the send intended for `start + offset` is due (at once if it already is).
    pub async fn until(&self, offset: Duration) {
        let due = self.start + offset;
        if Instant::now() < due {
            tokio::time::sleep_until(due.into()).await;
        }
    }

    /// The send intended for `start + offset` has left now.
    pub fn sent(&mut self, offset: Duration) {
        self.lag.record(self.start + offset, Instant::now());
    }

    /// The lag of every send.
    pub fn into_lag(self) -> SendLag {
        self.lag
    }
}

/// The generator's CPU over a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeneratorLoad {
    /// CPU seconds this process used in the window.
    pub cpu_s: f64,
    /// The window's length.
    pub wall_s: f64,
    /// CPUs the generator may use.
    pub cpus: usize,
    /// The server's CPU over the same window / its length, where the workload measures it (the drain).
    pub server_busy: Option<f64>,
}

impl GeneratorLoad {
    /// The fraction of its CPUs the generator was busy (0 for an empty window).
    pub fn busy(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.cpu_s / self.wall_s / self.cpus.max(1) as f64
        } else {
            0.0
        }
    }
}

/// Why a run is generator-bound, or `None` if it is not: the rule of this module.
pub fn verdict(lag: Option<&SendLag>, load: &GeneratorLoad) -> Option<String> {
    let mut why = Vec::new();
    if let Some(p99) = lag.map(|l| l.quantile(0.99)) {
        if p99 > LAG_P99_LIMIT {
            why.push(format!(
                "send lag p99 {:.1} ms > {} ms",
                p99.as_secs_f64() * 1e3,
                LAG_P99_LIMIT.as_millis()
            ));
        }
    }
    let server_saturated = load.server_busy.is_some_and(|b| b >= BUSY_LIMIT);
    if load.busy() >= BUSY_LIMIT && !server_saturated {
        why.push(format!(
            "generator busy {:.0}% of {} CPU(s)",
            load.busy() * 100.0,
            load.cpus
        ));
    }
    (!why.is_empty()).then(|| why.join(", "))
}

/// Record the generator's send lag (for an open-loop workload) and load into a run, and whether it was the limit.
pub fn record(run: &mut Run<'_>, lag: Option<&SendLag>, load: &GeneratorLoad) {
    if let Some(lag) = lag {
        let ms = |q| lag.quantile(q).as_secs_f64() * 1e3;
        run.metric("send_lag_p50_ms", ms(0.5));
        run.metric("send_lag_p99_ms", ms(0.99));
        run.metric("send_lag_max_ms", lag.histogram().max() as f64 / 1e3);
        run.histogram("send_lag", lag.histogram());
    }
    run.metric("generator_busy", load.busy());
    let bound = verdict(lag, load);
    if let Some(why) = &bound {
        run.say(&format!("generator-bound: {why}"));
    }
    run.metric("generator_bound", u64::from(bound.is_some()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule() {
        let idle = GeneratorLoad {
            cpu_s: 0.2,
            wall_s: 1.0,
            cpus: 1,
            server_busy: None,
        };
        let busy = GeneratorLoad {
            cpu_s: 0.95,
            ..idle
        };
        let t0 = Instant::now();
        let mut on_time = SendLag::new();
        for i in 0..1000 {
            on_time.record(t0, t0 + Duration::from_micros(i));
        }
        let mut late = on_time.clone();
        for _ in 0..20 {
            late.record(t0, t0 + Duration::from_millis(50));
        }
        assert_eq!(verdict(Some(&on_time), &idle), None);
        assert!(verdict(Some(&late), &idle).unwrap().contains("send lag"));
        assert!(verdict(None, &busy).unwrap().contains("busy 95%"));
        // A server busy all along was the limit, however busy the generator.
        let both = GeneratorLoad {
            server_busy: Some(0.97),
            ..busy
        };
        assert_eq!(verdict(None, &both), None);
        let waiting = GeneratorLoad {
            server_busy: Some(0.5),
            ..busy
        };
        assert!(verdict(None, &waiting).is_some());
        // Two CPUs half busy are not saturated.
        let half = GeneratorLoad {
            cpu_s: 1.0,
            wall_s: 1.0,
            cpus: 2,
            server_busy: None,
        };
        assert_eq!(verdict(None, &half), None);
    }

    #[tokio::test]
    async fn a_pacer_waits_and_records_lateness() {
        let start = Instant::now();
        let mut p = Pacer::new(start);
        p.until(Duration::from_millis(20)).await;
        assert!(start.elapsed() >= Duration::from_millis(20));
        p.sent(Duration::from_millis(20));
        // A send that was due long ago leaves at once and records its lag.
        p.until(Duration::ZERO).await;
        p.sent(Duration::ZERO);
        let lag = p.into_lag();
        assert_eq!(lag.histogram().len(), 2);
        assert!(lag.quantile(1.0) >= Duration::from_millis(20));
    }
}
