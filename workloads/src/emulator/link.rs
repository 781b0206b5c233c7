//! The link model: what the emulated link does to one packet. This is where jitter, loss and a rate limit go.
//!
//! Each direction of an emulator has its own [`LinkModel`], shared by all the flows in that direction, as the
//! flows of one host share its access link. A model sees every packet in the order the emulator receives them, with
//! its receipt time and size, and decides its [`Fate`]:
//!
//! - jitter: add a random offset to `at` (with a seeded RNG kept in the model, so runs can be repeated);
//! - loss: return a `Fate::Drop` variant (adding it makes the compiler point at every place a fate is handled);
//! - rate limit: keep the time the link is busy until; a packet starts when the link is free and takes
//!   `bytes * 8 / rate` to serialize, then the delay.
//!
//! TCP chunks keep their order whatever the model says: the relay never delivers a chunk before the one read before
//! it (see `tcp.rs`). Loss on TCP would be emulated as the retransmission delay it causes, not by dropping bytes.

use super::sys::Nanos;
use super::LinkConfig;

/// What happens to one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Hand the packet to the kernel at this monotonic time.
    Deliver {
        /// Due time, nanoseconds on the monotonic clock.
        at: Nanos,
    },
}

/// One direction of the emulated link.
#[derive(Debug, Clone)]
pub(crate) struct LinkModel {
    one_way_delay: Nanos,
}

impl LinkModel {
    pub(crate) fn new(config: &LinkConfig) -> Self {
        Self {
            one_way_delay: u64::try_from(config.one_way_delay.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// The per-packet schedule: the fate of a packet of `bytes` bytes received at `received`.
    pub(crate) fn schedule(&mut self, received: Nanos, bytes: usize) -> Fate {
        let _ = bytes; // for the rate limit
        Fate::Deliver {
            at: received.saturating_add(self.one_way_delay),
        }
    }

    /// The configured one-way delay.
    pub(crate) fn one_way_delay(&self) -> Nanos {
        self.one_way_delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn constant_delay() {
        let mut model = LinkModel::new(&LinkConfig::with_delay(Duration::from_micros(1500)));
        assert_eq!(model.schedule(1_000, 100), Fate::Deliver { at: 1_501_000 });
        assert_eq!(
            model.schedule(u64::MAX - 1, 100),
            Fate::Deliver { at: u64::MAX }
        );
    }
}
