//! Time for the emulator: receipt times from kernel timestamps, and waiting for a due time precisely.

use std::io;

use super::sys::{self, Nanos, TimerFd};

pub(crate) use sys::monotonic as now;

/// A kernel timestamp older than this is not trusted (the realtime clock was stepped); the read time is used.
const MAX_TIMESTAMP_AGE: Nanos = 1_000_000_000;

/// The monotonic time at which a packet was received: the kernel's `CLOCK_REALTIME` timestamp moved onto the
/// monotonic clock by its age, or now when there is no usable timestamp.
pub(crate) fn received_at(kernel_time: Option<Nanos>) -> Nanos {
    let now = now();
    let Some(stamp) = kernel_time else { return now };
    let age = sys::realtime().saturating_sub(stamp);
    if age > MAX_TIMESTAMP_AGE {
        return now;
    }
    now.saturating_sub(age)
}

/// Busy-waits until the monotonic clock reaches `due`.
pub(crate) fn spin_until(due: Nanos) {
    while now() < due {
        std::hint::spin_loop();
    }
}

/// Bounds of the wake-up lateness estimate.
const LATENESS_MIN: Nanos = 5_000;
const LATENESS_MAX: Nanos = 500_000;
/// Added to the lateness estimate to give the lead.
const LEAD_MARGIN: Nanos = 10_000;
/// Steps of the quantile tracker: up when a wake-up is later than the estimate, down when earlier. With a ratio of
/// 9 the estimate settles where one wake-up in ten is later (the 90th percentile), and one outlier (a preemption of
/// milliseconds) moves it by a single step only.
const STEP_UP: Nanos = 4_500;
const STEP_DOWN: Nanos = 500;

/// Waits for due times with a timerfd armed a lead before the due time; the caller spins for the rest.
pub(crate) struct Waiter {
    timer: TimerFd,
    /// The deadline the timer is armed for.
    armed: Option<Nanos>,
    /// Running estimate of how late the thread wakes after the timer's deadline.
    lateness: Nanos,
}

impl Waiter {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self {
            timer: TimerFd::new()?,
            armed: None,
            lateness: 50_000,
        })
    }

    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self.timer.raw_fd()
    }

    /// How long before a due time the thread should be woken: a wake-up within the lead spins instead of sleeping.
    pub(crate) fn lead(&self) -> Nanos {
        self.lateness + LEAD_MARGIN
    }

    /// Arms the timer to wake the thread a lead before `due`.
    pub(crate) fn arm(&mut self, due: Nanos) -> io::Result<()> {
        let deadline = due.saturating_sub(self.lead());
        if self.armed != Some(deadline) {
            self.timer.set(deadline)?;
            self.armed = Some(deadline);
        }
        Ok(())
    }

    /// Stops the timer (nothing is queued).
    pub(crate) fn disarm(&mut self) -> io::Result<()> {
        if self.armed.take().is_some() {
            self.timer.disarm()?;
        }
        Ok(())
    }

    /// The timer fired and the thread saw it at `woke`; if the thread was blocked waiting for it (`learn`), learn
    /// how late the wake-up was.
    pub(crate) fn fired(&mut self, woke: Nanos, learn: bool) {
        self.timer.clear();
        let Some(deadline) = self.armed.take() else {
            return;
        };
        if !learn || woke < deadline {
            // A stale expiry of an earlier deadline.
            return;
        }
        let late = woke - deadline;
        self.lateness = if late > self.lateness {
            self.lateness + STEP_UP.min(late - self.lateness)
        } else {
            self.lateness - STEP_DOWN.min(self.lateness - late)
        }
        .clamp(LATENESS_MIN, LATENESS_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_estimate_tracks_a_high_quantile_and_shrugs_off_outliers() {
        let mut waiter = Waiter::new().unwrap();
        // Nine wake-ups 20 µs late for one 80 µs late: the estimate settles between the two.
        for i in 0..2_000u64 {
            waiter.armed = Some(1_000_000);
            let late = if i % 10 == 0 { 80_000 } else { 20_000 };
            waiter.fired(1_000_000 + late, true);
        }
        assert!(
            (20_000..=80_000).contains(&waiter.lateness),
            "{}",
            waiter.lateness
        );
        let settled = waiter.lateness;
        waiter.armed = Some(1_000_000);
        waiter.fired(1_000_000 + 10_000_000, true);
        assert!(waiter.lateness <= settled + STEP_UP);
    }

    #[test]
    fn received_at_converts_a_kernel_timestamp() {
        let before = now();
        let stamp = sys::realtime() - 10_000_000;
        let at = received_at(Some(stamp));
        // 10 ms before `before`, plus the few instructions between the two clock reads.
        assert!(
            at + 10_000_000 + 1_000 >= before && at + 5_000_000 <= before,
            "{at} vs {before}"
        );
        // A timestamp from a clock step is not trusted.
        assert!(received_at(Some(stamp - 10_000_000_000)) >= before);
        assert!(received_at(None) >= before);
    }
}
