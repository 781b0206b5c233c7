//! A reference reader of the store's log, written from the format and recovery rule the store's module
//! documentation states (not from its code), for the `store_recovery` target to compare the store with.
//!
//! A record is `len u32 LE | crc32 u32 LE | body`, the body `sender, run, seq, made_us, stored_us` (u64 LE each),
//! `payload_len u16 LE` and the payload, `len = 42 + payload_len`, the CRC-32 over the body. Reading stops at the
//! first record that is incomplete or damaged; if a complete valid record starts anywhere after that point, the log
//! is corrupt, otherwise what follows is a torn tail.

use std::path::PathBuf;
use std::sync::OnceLock;
use transport_core::OrderId;

/// Bytes of a record before its payload: the header (8) and the body's fixed fields (42).
pub const RECORD_OVERHEAD: usize = 8 + 42;

/// One valid record found by the reference reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefRecord {
    /// The order.
    pub id: OrderId,
    /// Where the record starts.
    pub offset: usize,
}

/// What the reference reader makes of a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// The valid records from the start, in order.
    pub records: Vec<RefRecord>,
    /// Length of the valid prefix.
    pub good_len: usize,
    /// The first offset after the damaged record where a complete valid record starts: the log is corrupt.
    pub next_valid: Option<usize>,
}

fn u64_le(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

/// The record starting at `at`, if a complete valid one does, and its total length.
pub fn record_at(log: &[u8], at: usize) -> Option<(OrderId, usize)> {
    let header = log.get(at..at.checked_add(8)?)?;
    let len = u32::from_le_bytes(header[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().ok()?);
    if !(42..=42 + usize::from(u16::MAX)).contains(&len) {
        return None;
    }
    let body = log.get(at + 8..at + 8 + len)?;
    if crc32fast::hash(body) != crc
        || usize::from(u16::from_le_bytes([body[40], body[41]])) + 42 != len
    {
        return None;
    }
    let id = OrderId {
        sender: u64_le(&body[0..]),
        run: u64_le(&body[8..]),
        seq: u64_le(&body[16..]),
    };
    Some((id, 8 + len))
}

/// Read a log as the store's documentation says it is read.
pub fn read(log: &[u8]) -> Reading {
    let mut records = Vec::new();
    let mut at = 0;
    while let Some((id, len)) = record_at(log, at) {
        records.push(RefRecord { id, offset: at });
        at += len;
    }
    let next_valid = (at < log.len())
        .then(|| (at + 1..log.len()).find(|&i| record_at(log, i).is_some()))
        .flatten();
    Reading {
        records,
        good_len: at,
        next_valid,
    }
}

/// A directory of this process for the target's store (on `FUZZ_STORE_DIR`, else `/dev/shm` when present, else the
/// temporary directory), emptied by the caller before each input.
pub fn scratch_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = std::env::var_os("FUZZ_STORE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let shm = PathBuf::from("/dev/shm");
                if shm.is_dir() {
                    shm
                } else {
                    std::env::temp_dir()
                }
            });
        base.join(format!("transport-fuzz-store-{}", std::process::id()))
    })
}
