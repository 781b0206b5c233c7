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
    /// Datagrams not sent because sending to their destination failed (a spoofed or unroutable source address);
    /// dropped, the service goes on.
    send_errors,
    /// Messages dropped by back-pressure (QoS 0 to a slow subscriber).
    dropped,
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

    /// Refusals of every kind.
    pub fn refused(&self) -> u64 {
        self.refused_unknown + self.refused_forged + self.refused_malformed + self.refused_oversized
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
