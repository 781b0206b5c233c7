//! The delay the emulator actually added, per direction, in HDR histograms.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use hdrhistogram::Histogram;

use super::sys::Nanos;
use super::{DelayStats, LinkMeasurement};

/// Direction of a packet, also the index of its statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    ToServer = 0,
    ToClient = 1,
}

/// Largest excess over the setting recorded exactly (larger ones are recorded as this): ten minutes, in ns.
const HIGHEST: u64 = 600_000_000_000;

/// What one direction recorded.
///
/// The histogram holds each packet's delay *minus the setting*, so its 3 significant digits apply to the small
/// excess (tens of microseconds, resolved to tens of nanoseconds) rather than to the whole delay (where they would
/// leave buckets of 30 µs at 50 ms). Quantiles are unchanged by the shift: the setting is added back when reading.
/// Nothing is delivered before its due time, so no delay is below the setting; a link model with negative jitter
/// will need a lower base.
#[derive(Clone)]
pub(crate) struct Recorder {
    /// The setting, nanoseconds.
    base: Nanos,
    /// Added delay minus `base`, nanoseconds.
    excess: Histogram<u64>,
    /// Sum of the added delays, for an exact mean.
    sum: u128,
    /// Largest added delay.
    max: Nanos,
    pub(crate) dropped: u64,
    pub(crate) held: u64,
}

impl Recorder {
    fn new(base: Nanos) -> io::Result<Self> {
        let excess = Histogram::new_with_bounds(1, HIGHEST, 3).map_err(io::Error::other)?;
        Ok(Self {
            base,
            excess,
            sum: 0,
            max: 0,
            dropped: 0,
            held: 0,
        })
    }

    /// Records a packet handed to the kernel at `sent` that was received at `received`.
    pub(crate) fn delivered(&mut self, received: Nanos, sent: Nanos) {
        let delay = sent.saturating_sub(received);
        self.excess
            .saturating_record(delay.saturating_sub(self.base));
        self.sum += u128::from(delay);
        self.max = self.max.max(delay);
    }

    /// Adds what another recorder with the same setting recorded.
    fn absorb(&mut self, other: &Recorder) {
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = self.excess.add(&other.excess);
        self.sum += other.sum;
        self.max = self.max.max(other.max);
        self.dropped += other.dropped;
        self.held += other.held;
    }

    fn stats(&self) -> DelayStats {
        let us = |nanos: f64| nanos / 1_000.0;
        let packets = self.excess.len();
        let quantile = |q: f64| {
            if packets == 0 {
                0.0
            } else {
                // A bucket's highest value can pass the exact maximum.
                us((self.base + self.excess.value_at_quantile(q)).min(self.max) as f64)
            }
        };
        DelayStats {
            packets,
            mean_us: if packets == 0 {
                0.0
            } else {
                us(self.sum as f64 / packets as f64)
            },
            p50_us: quantile(0.5),
            p99_us: quantile(0.99),
            max_us: us(self.max as f64),
            setting_us: us(self.base as f64),
            dropped: self.dropped,
            held: self.held,
        }
    }
}

/// Shared between an emulator's thread, which records, and its handle, which reads.
pub(crate) struct Shared {
    directions: Mutex<[Recorder; 2]>,
    flows: AtomicU64,
    flow_errors: AtomicU64,
    fast_open: AtomicU64,
}

impl Shared {
    pub(crate) fn new(setting: Nanos) -> io::Result<Self> {
        Ok(Self {
            directions: Mutex::new([Recorder::new(setting)?, Recorder::new(setting)?]),
            flows: AtomicU64::new(0),
            flow_errors: AtomicU64::new(0),
            fast_open: AtomicU64::new(0),
        })
    }

    /// The recorders, indexed by [`Direction`]. A panic elsewhere while holding the lock leaves them usable.
    pub(crate) fn lock(&self) -> MutexGuard<'_, [Recorder; 2]> {
        self.directions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn flow_opened(&self) {
        self.flows.fetch_add(1, Ordering::Relaxed);
    }

    /// A TCP connection whose SYN brought data (TCP Fast Open).
    pub(crate) fn flow_fast_open(&self) {
        self.fast_open.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn flow_failed(&self) {
        self.flow_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn measurement(&self) -> LinkMeasurement {
        Self::combined(&[self])
    }

    /// One measurement over several emulators with the same setting (UDP and TCP on one port).
    pub(crate) fn combined(parts: &[&Shared]) -> LinkMeasurement {
        let mut total: Option<[Recorder; 2]> = None;
        let (mut flows, mut flow_errors, mut fast_open) = (0, 0, 0);
        for part in parts {
            let directions = part.lock();
            match &mut total {
                None => total = Some(directions.clone()),
                Some(total) => {
                    total[0].absorb(&directions[0]);
                    total[1].absorb(&directions[1]);
                }
            }
            flows += part.flows.load(Ordering::Relaxed);
            flow_errors += part.flow_errors.load(Ordering::Relaxed);
            fast_open += part.fast_open.load(Ordering::Relaxed);
        }
        let stats = |direction: Direction| {
            total
                .as_ref()
                .map(|total| total[direction as usize].stats())
                .unwrap_or_else(DelayStats::empty)
        };
        LinkMeasurement {
            to_server: stats(Direction::ToServer),
            to_client: stats(Direction::ToClient),
            flows,
            flow_errors,
            fast_open,
        }
    }
}

impl DelayStats {
    fn empty() -> Self {
        Self {
            packets: 0,
            mean_us: 0.0,
            p50_us: 0.0,
            p99_us: 0.0,
            max_us: 0.0,
            setting_us: 0.0,
            dropped: 0,
            held: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_in_microseconds() {
        let shared = Shared::new(10_000_000).unwrap();
        {
            let mut directions = shared.lock();
            for delay in [10_000_000, 10_010_000, 10_020_000] {
                directions[Direction::ToClient as usize].delivered(5, 5 + delay);
            }
            directions[Direction::ToClient as usize].dropped = 2;
        }
        let m = shared.measurement();
        assert_eq!(m.to_server.packets, 0);
        assert_eq!(m.to_server.p50_us, 0.0);
        assert_eq!(m.to_client.packets, 3);
        assert!(
            (m.to_client.p50_us - 10_010.0).abs() < 10.0,
            "{}",
            m.to_client.p50_us
        );
        assert!((m.to_client.mean_us - 10_010.0).abs() < 10.0);
        assert!((m.to_client.max_us - 10_020.0).abs() < 10.0);
        assert_eq!(m.to_client.setting_us, 10_000.0);
        assert_eq!(m.to_client.dropped, 2);

        let other = Shared::new(10_000_000).unwrap();
        other.lock()[Direction::ToClient as usize].delivered(0, 10_030_000);
        other.flow_opened();
        let both = Shared::combined(&[&shared, &other]);
        assert_eq!(both.to_client.packets, 4);
        assert_eq!(both.to_client.max_us, 10_030.0);
        assert_eq!(both.to_client.dropped, 2);
        assert_eq!(both.flows, 1);
    }
}
