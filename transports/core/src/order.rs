//! Orders: what a device sends and a server stores.
//!
//! An order is identified by `(sender, run, seq)`: the sender's stable number, the sender's run (a random number
//! chosen each time the device starts, so that a restarted device never reuses an id), and a sequence number that
//! counts from 0 within the run. The store applies each id exactly once.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The largest payload an order may carry: the store keeps its length in 16 bits, so a larger order is refused
/// (answered as refused by every server, never stored).
pub const MAX_PAYLOAD: usize = u16::MAX as usize;

/// The identity of one order, the key of exactly-once application.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OrderId {
    /// The sender's stable number (see [`sender_id`]).
    pub sender: u64,
    /// The sender's run: chosen at random each time the sender starts.
    pub run: u64,
    /// Position within the run, from 0.
    pub seq: u64,
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:016x}/{}", self.sender, self.run, self.seq)
    }
}

/// An order as the store receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    /// The key of exactly-once application.
    pub id: OrderId,
    /// When the device made the order (its intended time), microseconds since the Unix epoch.
    pub made_us: u64,
    /// The order's body; workloads fill it with a pattern of the configured size.
    pub payload: Vec<u8>,
}

/// The name every transport gives device `n`: the allow-list name, the certificate's common name, the MQTT client id.
pub fn device_name(n: u32) -> String {
    format!("dev-{n}")
}

/// The stable sender number for an identity name.
///
/// `dev-N` maps to `N`, so results read naturally; any other name maps to its 64-bit FNV-1a hash with the top bit
/// set, so the two ranges never meet.
pub fn sender_id(name: &str) -> u64 {
    if let Some(n) = name
        .strip_prefix("dev-")
        .and_then(|n| n.parse::<u32>().ok())
    {
        if device_name(n) == name {
            return u64::from(n);
        }
    }
    fnv1a64(name.as_bytes()) | (1 << 63)
}

/// The sender number of device `n`: [`sender_id`] of [`device_name`]`(n)`, without making the name (a workload makes
/// hundreds of thousands of orders per device).
pub fn device_sender_id(n: u32) -> u64 {
    u64::from(n)
}

/// 64-bit FNV-1a: small, stable across versions and platforms.
pub fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Fill `buf` with `len` bytes that depend on the order id, so a payload mixed up between orders is visible.
pub fn fill_payload(id: &OrderId, len: usize, buf: &mut Vec<u8>) {
    buf.clear();
    let seed = id.seq ^ id.run.rotate_left(17) ^ id.sender.rotate_left(41);
    buf.extend((0..len).map(|i| (seed >> ((i % 8) * 8)) as u8 ^ i as u8));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_map_to_their_number() {
        assert_eq!(sender_id(&device_name(42)), 42);
        assert_eq!(sender_id("dev-0"), 0);
        for n in [0, 1, 9, 10, 99_999, u32::MAX - 1, u32::MAX] {
            assert_eq!(device_sender_id(n), sender_id(&device_name(n)), "{n}");
        }
    }

    #[test]
    fn other_names_hash_into_the_upper_range() {
        for name in ["dev-042", "dev-", "sensor-7", "dev-99999999999"] {
            assert!(sender_id(name) >= 1 << 63, "{name}");
        }
        assert_ne!(sender_id("a"), sender_id("b"));
    }
}
