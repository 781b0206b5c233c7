//! Counters of the things a transport does that cost: asymmetric operations, handshakes, re-sends, refusals.
//!
//! They are counted where they happen (the protocol core, a wrapped key-exchange group, a certificate verifier), not
//! estimated. Both sides keep one [`Counters`]; the runner reads the client's directly and the server's through the
//! server's control line.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($( $(#[doc = $doc:literal])* $name:ident ),* $(,)?) => {
        /// Live counters (relaxed atomics: cheap enough for the hot path).
        #[derive(Debug, Default)]
        pub struct Counters {
            $( $(#[doc = $doc])* pub $name: AtomicU64, )*
        }

        /// A copy of the counters at one moment, as results carry them.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct CounterSnapshot {
            $( $(#[doc = $doc])* pub $name: u64, )*
        }

        impl Counters {
            /// Read every counter.
            pub fn snapshot(&self) -> CounterSnapshot {
                CounterSnapshot { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }
        }

        impl CounterSnapshot {
            /// The change from `earlier` to `self`, counter by counter.
            pub fn since(&self, earlier: &CounterSnapshot) -> CounterSnapshot {
                CounterSnapshot { $( $name: self.$name.saturating_sub(earlier.$name), )* }
            }

            /// The sum of two snapshots, counter by counter (the sides of a load generator split over processes).
            pub fn plus(&self, other: &CounterSnapshot) -> CounterSnapshot {
                CounterSnapshot { $( $name: self.$name.saturating_add(other.$name), )* }
            }

            /// Counter names and values, in declaration order.
            pub fn entries(&self) -> Vec<(&'static str, u64)> {
                vec![ $( (stringify!($name), self.$name), )* ]
            }
        }
    };
}

counters! {
    /// X25519 scalar multiplications (key generation and agreement).
    x25519,
    /// ECDH on NIST curves (P-256 and others).
    ecdh,
    /// Signatures made.
    sign,
    /// Signatures verified.
    verify,
    /// How many of `x25519`, `ecdh`, `sign` and `verify` were derived from a completed handshake's negotiated
    /// parameters rather than counted where they happened (s2n-quic with s2n-tls, which has no hook); 0 elsewhere.
    asym_derived,
    /// Completed handshakes (TLS, QUIC, MQTT CONNECT over TLS).
    handshakes,
    /// Of `handshakes`, those that resumed an earlier session with a TLS 1.3 ticket: no certificate sent, signed
    /// or verified; the (EC)DHE of `psk_dhe_ke` still made on each side.
    resumed,
    /// Keys derived for a run or session not seen before (HKDF, no asymmetric operation).
    key_derivations,
    /// Records or orders received.
    received,
    /// Records sent again on the same link because no answer came in time (Pure's re-send timer).
    resent_timeout,
    /// Orders sent again on a new connection, after the old one dropped or went unanswered (connection transports).
    resent_reconnect,
    /// Links opened again after they dropped.
    reconnects,
    /// Records refused: the sender is not allowed.
    refused_unknown,
    /// Records refused: the seal did not open (forged or tampered).
    refused_forged,
    /// Datagrams or frames refused: malformed.
    refused_malformed,
    /// Datagrams refused whole, unread: larger than the transport's maximum.
    refused_oversized,
    /// Input refused because a bound was reached: topic names or filters past the level cap, a SUBSCRIBE past the
    /// filters per packet or a session's subscriptions (SUBACK 0x80), retained messages past the broker's caps.
    refused_limit,
    /// Datagrams for no connection of a QUIC endpoint (an unknown connection id), dropped unread. Only where the
    /// library reports them (s2n-quic); an old connection's packets after a restart count here too.
    refused_unroutable,
    /// Handshakes and connections the server closed because the peer went silent before completing them
    /// (half-open: a TCP connection with no TLS, TLS with no CONNECT, a QUIC Initial and nothing after).
    timed_out,
    /// Datagrams not sent because sending to their destination failed (a spoofed or unroutable source address);
    /// dropped, the service goes on.
    send_errors,
    /// Messages dropped by back-pressure (QoS 0 to a slow subscriber).
    dropped,
    /// Connections whose first bytes went in the SYN and were taken by the server (TCP Fast Open).
    fast_open,
    /// Connections that sent their first bytes in the SYN and whose server did not take them (the kernel sent them
    /// again after the handshake): TCP Fast Open asked for and not had.
    fast_open_refused,
}

impl Counters {
    /// Add `n` to a counter.
    #[inline]
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Add one to a counter.
    #[inline]
    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl CounterSnapshot {
    /// Asymmetric operations of every kind.
    pub fn asym_ops(&self) -> u64 {
        self.x25519 + self.ecdh + self.sign + self.verify
    }

    /// Refusals of a peer's input, every kind (datagrams dropped for no connection and half-open handshakes that
    /// timed out are not refusals of input: `refused_unroutable`, `timed_out`).
    pub fn refused(&self) -> u64 {
        self.refused_unknown
            + self.refused_forged
            + self.refused_malformed
            + self.refused_oversized
            + self.refused_limit
    }
}

/// What one asymmetric operation of each counted kind costs a transport's server, in microseconds, measured in this
/// process with the code that server calls ([`Transport::asym_costs`](crate::Transport::asym_costs)). A kind the
/// server does not do, or that could not be measured, is `None`: never a zero.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct AsymCosts {
    /// One X25519 scalar multiplication (key generation and agreement averaged).
    pub x25519_us: Option<f64>,
    /// One ECDH operation on a NIST curve (key generation and agreement averaged).
    pub ecdh_us: Option<f64>,
    /// One signature.
    pub sign_us: Option<f64>,
    /// One verification with a key parsed for it (a key not met before).
    pub verify_us: Option<f64>,
}

impl AsymCosts {
    /// The arithmetic `ops` cost in all, in microseconds; `None` if some kind of operation in `ops` has no cost.
    pub fn cost_of(&self, ops: &CounterSnapshot) -> Option<f64> {
        [
            (ops.x25519, self.x25519_us),
            (ops.ecdh, self.ecdh_us),
            (ops.sign, self.sign_us),
            (ops.verify, self.verify_us),
        ]
        .into_iter()
        .try_fold(0.0, |sum, (n, cost)| match (n, cost) {
            (0, _) => Some(sum),
            (n, Some(us)) => Some(sum + n as f64 * us),
            (_, None) => None,
        })
    }

    /// The microseconds of CPU one call of `op` takes on this thread: the fastest of five batches of about 10 ms
    /// each, timed with the thread's own CPU clock, so that other work on a shared machine inflates it least (it
    /// still shares caches and cores). Takes about 50 ms; `None` if the thread's CPU clock cannot be read.
    pub fn time(mut op: impl FnMut()) -> Option<f64> {
        let now = || crate::procfs::thread_cpu_time().ok();
        let batch = {
            let t = now()?;
            let mut n = 0u32;
            while now()?.saturating_sub(t) < std::time::Duration::from_millis(10) || n < 3 {
                op();
                n += 1;
            }
            n
        };
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t = now()?;
            for _ in 0..batch {
                op();
            }
            best = best.min(now()?.saturating_sub(t).as_secs_f64() * 1e6 / f64::from(batch));
        }
        Some(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_add_up_only_when_every_kind_has_one() {
        let costs = AsymCosts {
            x25519_us: Some(20.0),
            sign_us: Some(10.0),
            verify_us: Some(40.0),
            ecdh_us: None,
        };
        let ops = CounterSnapshot {
            x25519: 2,
            sign: 1,
            verify: 2,
            ..CounterSnapshot::default()
        };
        assert_eq!(costs.cost_of(&ops), Some(130.0));
        let with_ecdh = CounterSnapshot { ecdh: 1, ..ops };
        assert_eq!(costs.cost_of(&with_ecdh), None);
        assert_eq!(costs.cost_of(&CounterSnapshot::default()), Some(0.0));
        // CPU time, not wall time: a sleeping op costs (almost) nothing; a busy one its work.
        let sleeping =
            AsymCosts::time(|| std::thread::sleep(std::time::Duration::from_micros(200)));
        assert!(sleeping.unwrap() < 100.0, "{sleeping:?}");
        let spin = |us| {
            let t = crate::procfs::thread_cpu_time().unwrap();
            while crate::procfs::thread_cpu_time().unwrap() - t
                < std::time::Duration::from_micros(us)
            {}
        };
        let busy = AsymCosts::time(|| spin(200)).unwrap();
        assert!((200.0..400.0).contains(&busy), "{busy}");
    }

    #[test]
    fn snapshot_and_difference() {
        let c = Counters::default();
        Counters::add(&c.x25519, 3);
        let a = c.snapshot();
        Counters::inc(&c.x25519);
        Counters::inc(&c.verify);
        let d = c.snapshot().since(&a);
        assert_eq!((d.x25519, d.verify, d.asym_ops()), (1, 1, 2));
        assert!(d.entries().contains(&("verify", 1)));
        let sum = d.plus(&a);
        assert_eq!((sum.x25519, sum.verify), (4, 1));
        assert_eq!(sum.since(&a), d);
    }
}
