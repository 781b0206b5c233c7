//! The link emulator: a userspace relay between a load generator and a server that adds a one-way delay in each
//! direction, for UDP datagrams ([`UdpEmulator`]) and TCP byte streams ([`TcpEmulator`]), and measures what it
//! actually added ([`LinkMeasurement`]), so a result can record both the setting and the delay the link really had.
//! It needs no privileges and no kernel netem (see `docs/emulator.md` for using netem where it exists).
//!
//! # How it works
//!
//! Each emulator is one thread of its own, not a task on the caller's runtime: tokio's timer has millisecond
//! granularity and would add up to a millisecond to every packet. The thread owns every socket of the emulator and
//! does three things in one loop:
//!
//! - **Receive.** All sockets are non-blocking and registered with one `epoll` instance (mio). A received datagram
//!   or chunk is stamped with its *receipt time*: the kernel's receive timestamp (`SO_TIMESTAMPNS`, taken when the
//!   packet entered the receiving socket's stack), converted to the monotonic clock, or the time of the read where
//!   the kernel gives none. Because the delay counts from the kernel's timestamp, a late wake-up of this thread does
//!   not lengthen the delay, as long as it is shorter than the delay.
//! - **Schedule.** The link model (`link.rs`) turns the receipt time into a due time (receipt + one-way delay),
//!   and the packet goes into a time-ordered queue (a binary heap on due time, then arrival order). The model's
//!   per-packet `schedule` function is the one place where jitter, loss and a rate limit will be added; a TCP
//!   connection keeps its chunks in order by never scheduling a chunk before the previous one.
//! - **Deliver.** The thread sleeps until the earliest due time on a `timerfd` armed with an absolute
//!   `CLOCK_MONOTONIC` deadline (timer slack set to 1 ns), which is in the same `epoll` set as the sockets, so the
//!   thread wakes for whichever comes first. The kernel wakes a thread tens of microseconds late (about 60 µs at the
//!   median on the test machine), so the timer is armed a *lead* before the due time and the thread spins on the
//!   clock for the rest. The lead follows the observed wake-up lateness (a running estimate of about its 90th
//!   percentile, plus 10 µs), so the spin stays short. At each wake-up every packet that is due is sent, in order,
//!   before the thread sleeps again: at high rates one wake-up delivers a batch. Between two spins the thread
//!   checks its sockets, so a steady stream of packets cannot keep it from reading.
//!
//! The measured delay of a packet is the time from its receipt time to the return of the `send` that handed it to
//! the kernel on the other side; it goes into an HDR histogram per direction ([`DelayStats`]).
//!
//! UDP: every distinct client source address gets its own upstream socket, so the server sees distinct peers, as
//! it would without the emulator. TCP: the emulator accepts the client's connection, connects to the server after
//! the time the three-way handshake would take over the emulated link (1.5 round trips), relays chunks as they are
//! read, and propagates half-close (FIN) and reset.
//!
//! [`LinkEmulator`] puts a UDP and a TCP emulator on the same port. Dropping an emulator stops its thread and
//! closes all its sockets. Linux only (timerfd, `SO_TIMESTAMPNS`).

mod clock;
mod driver;
mod link;
mod queue;
mod stats;
mod sys;
mod tcp;
mod udp;

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use tcp::TcpEmulator;
pub use udp::UdpEmulator;

/// A UDP and a TCP emulator on the same port of 127.0.0.1, for a runner that puts every transport behind one
/// address (a server listening on both protocols, or a client that does not say which it uses).
#[derive(Debug)]
pub struct LinkEmulator {
    udp: UdpEmulator,
    tcp: TcpEmulator,
}

impl LinkEmulator {
    /// Ports tried before giving up when the TCP port of a fresh UDP port is taken.
    const ATTEMPTS: usize = 16;

    /// Starts both emulators on one ephemeral port of 127.0.0.1, relaying to `upstream` (the same address for
    /// UDP and TCP).
    pub fn start(upstream: SocketAddr, config: LinkConfig) -> io::Result<Self> {
        let mut last_error = None;
        for _ in 0..Self::ATTEMPTS {
            let udp = UdpEmulator::start(upstream, config.clone())?;
            match TcpEmulator::start_on(udp.addr(), upstream, config.clone()) {
                Ok(tcp) => return Ok(Self { udp, tcp }),
                Err(error) if error.kind() == io::ErrorKind::AddrInUse => last_error = Some(error),
                Err(error) => return Err(error),
            }
        }
        Err(last_error.unwrap_or_else(|| io::ErrorKind::AddrInUse.into()))
    }

    /// The address clients send to and connect to.
    pub fn addr(&self) -> SocketAddr {
        self.udp.addr()
    }

    /// The delay added so far in each direction, over UDP datagrams and TCP chunks together.
    pub fn measured(&self) -> LinkMeasurement {
        stats::Shared::combined(&[&self.udp.shared, &self.tcp.shared])
    }

    /// The UDP half.
    pub fn udp(&self) -> &UdpEmulator {
        &self.udp
    }

    /// The TCP half.
    pub fn tcp(&self) -> &TcpEmulator {
        &self.tcp
    }
}

/// The properties of the emulated link, the same in both directions.
///
/// Serialized with units in the field names: `{"one_way_delay_us": 25000}`. Unknown fields are refused, so a
/// configuration written for a newer emulator (with jitter, loss or a rate) is not silently run without them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkConfig {
    /// Delay added to every datagram or chunk in each direction; a round trip through the emulator adds twice this.
    #[serde(rename = "one_way_delay_us", with = "duration_us")]
    pub one_way_delay: Duration,
}

impl LinkConfig {
    /// The largest one-way delay accepted.
    pub const MAX_ONE_WAY_DELAY: Duration = Duration::from_secs(60);

    /// A link with this one-way delay in each direction.
    pub fn with_delay(one_way_delay: Duration) -> Self {
        Self { one_way_delay }
    }

    /// A link whose round trip time is `rtt` (half of it each way), as `--rtt` gives it.
    pub fn with_rtt(rtt: Duration) -> Self {
        Self::with_delay(rtt / 2)
    }

    /// Checks the configuration; the emulators call this before they bind anything.
    pub fn validate(&self) -> Result<(), LinkConfigError> {
        if self.one_way_delay > Self::MAX_ONE_WAY_DELAY {
            return Err(LinkConfigError::DelayTooLarge {
                delay: self.one_way_delay,
                max: Self::MAX_ONE_WAY_DELAY,
            });
        }
        Ok(())
    }
}

/// A [`LinkConfig`] the emulator refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkConfigError {
    /// The one-way delay is larger than [`LinkConfig::MAX_ONE_WAY_DELAY`].
    #[error("one-way delay {delay:?} is larger than the maximum {max:?}")]
    DelayTooLarge {
        /// The delay asked for.
        delay: Duration,
        /// The largest delay accepted.
        max: Duration,
    },
}

impl From<LinkConfigError> for io::Error {
    fn from(error: LinkConfigError) -> Self {
        io::Error::new(io::ErrorKind::InvalidInput, error)
    }
}

/// What the emulator measured in one direction: the delay from a packet's receipt to its hand-off to the kernel on
/// the other side, against the setting. For TCP a "packet" is a chunk as one read returned it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DelayStats {
    /// Datagrams or chunks delivered on schedule, the population of the delay statistics below.
    pub packets: u64,
    /// Mean added delay, microseconds.
    pub mean_us: f64,
    /// Median added delay, microseconds.
    pub p50_us: f64,
    /// 99th percentile of the added delay, microseconds.
    pub p99_us: f64,
    /// Largest added delay, microseconds.
    pub max_us: f64,
    /// The configured one-way delay, microseconds.
    pub setting_us: f64,
    /// Datagrams or chunks lost in the emulator: UDP datagrams the kernel dropped on the emulator's receiving
    /// socket (buffer full: the emulator fell behind), refused to send (buffer full), or that came from a new
    /// client for whom no socket could be opened; TCP chunks whose destination was reset.
    pub dropped: u64,
    /// TCP chunks that waited past their due time because the destination could not take them yet (the emulated
    /// handshake was not complete, or the receiver's window was full). They are delivered, in order, as soon as it
    /// can, but are not in the delay statistics: that wait is not the link's. Always 0 for UDP.
    pub held: u64,
}

/// The measured delay in both directions and the flows the emulator has carried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkMeasurement {
    /// Client to server.
    pub to_server: DelayStats,
    /// Server to client.
    pub to_client: DelayStats,
    /// Flows opened: distinct UDP client addresses, or TCP connections accepted.
    pub flows: u64,
    /// Flows that could not be opened or connected (for example no file descriptor left, or the server refused).
    pub flow_errors: u64,
    /// Of the TCP connections, those whose SYN brought data (TCP Fast Open): their handshake took half a round
    /// trip before the server saw the data, not one and a half.
    #[serde(default)]
    pub fast_open: u64,
}

/// Serializes a [`Duration`] as whole microseconds.
mod duration_us {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(u64::try_from(duration.as_micros()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_micros)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_serializes_with_units() {
        let config = LinkConfig::with_delay(Duration::from_millis(25));
        let json = serde_json::to_string(&config).unwrap();
        assert_eq!(json, r#"{"one_way_delay_us":25000}"#);
        assert_eq!(serde_json::from_str::<LinkConfig>(&json).unwrap(), config);
    }

    #[test]
    fn config_refuses_unknown_fields_and_large_delays() {
        assert!(
            serde_json::from_str::<LinkConfig>(r#"{"one_way_delay_us":1,"jitter_us":5}"#).is_err()
        );
        let config = LinkConfig::with_delay(Duration::from_secs(61));
        assert!(matches!(
            config.validate(),
            Err(LinkConfigError::DelayTooLarge { .. })
        ));
        assert_eq!(
            LinkConfig::with_rtt(Duration::from_millis(10)).one_way_delay,
            Duration::from_millis(5)
        );
    }
}
