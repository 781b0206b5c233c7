//! The durable store every server writes to: an append-only, checksummed log with group commit and exactly-once
//! application keyed by [`OrderId`].
//!
//! # Log format
//!
//! `DIR/orders.log` is a sequence of records, each
//!
//! ```text
//! len          u32 LE   length of the body in bytes (42 + payload_len)
//! crc32        u32 LE   CRC-32 (IEEE, as crc32fast computes it) of the body
//! body:
//!   sender       u64 LE
//!   run          u64 LE
//!   seq          u64 LE
//!   made_us      u64 LE   when the device made the order, µs since the Unix epoch
//!   stored_us    u64 LE   the commit time of the group that stored it, µs since the Unix epoch
//!   payload_len  u16 LE
//!   payload      payload_len bytes
//! ```
//!
//! # Opening and recovery
//!
//! [`Store::open`] takes an exclusive `flock` on the log, so two servers never write one store, then reads the whole
//! log and rebuilds the set of applied ids. A record that is incomplete or fails its checksum *with nothing valid
//! after it* is a torn tail, left by a crash in the middle of a write: the file is cut back to the last good record
//! (nothing in it was acknowledged, since acknowledgement follows the sync). A damaged record *followed by valid
//! records* is corruption, and opening fails with [`StoreError::Corrupt`] rather than dropping acknowledged data.
//!
//! # Committing
//!
//! [`Store::commit`] writes one group: the orders not yet applied are encoded into one buffer, written with one
//! `write`, then synced as the [`SyncPolicy`] says; only then are they reported [`Outcome::Applied`]. [`StoreHandle`]
//! merges the commits of every connection waiting at that moment into one group, so under load many orders share one
//! `fdatasync` (group commit): a store that syncs runs on its own thread, one that never syncs is written by the
//! committing tasks, one group per scheduler turn. After a failed write or sync the store refuses
//! every later commit: it never acknowledges data it could not make durable.
//!
//! # Auditing
//!
//! [`read_log`] and [`audit`] read the log itself (not counters) after a run, so the runner can check that every
//! order made was stored once and every acknowledged order is in the log.

pub mod applied;
pub mod fs;

use applied::AppliedIds;
use foldhash::HashSet;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::oneshot;
pub use transport_core::commit::Outcome;
use transport_core::commit::{CommitError, OrderStore};
use transport_core::{BoxFuture, Order, OrderId, MAX_PAYLOAD};

/// The log's file name inside the store directory.
pub const LOG_FILE: &str = "orders.log";
/// Bytes before the body: `len` and `crc32`.
const HEADER_LEN: usize = 8;
/// Bytes of the body before the payload.
const BODY_FIXED_LEN: usize = 5 * 8 + 2;
const MAX_BODY_LEN: usize = BODY_FIXED_LEN + MAX_PAYLOAD;

/// When the store calls `fdatasync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SyncPolicy {
    /// Never: acknowledged orders survive a process crash (they are in the page cache) but not a machine crash.
    None,
    /// One `fdatasync` per group, after its single write: the default.
    #[default]
    Batch,
    /// One write and one `fdatasync` per order: what a store without group commit pays.
    Each,
}

impl SyncPolicy {
    /// Every policy, in the order the help text lists them.
    pub const ALL: [SyncPolicy; 3] = [SyncPolicy::None, SyncPolicy::Batch, SyncPolicy::Each];

    /// The name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            SyncPolicy::None => "none",
            SyncPolicy::Batch => "batch",
            SyncPolicy::Each => "each",
        }
    }
}

impl fmt::Display for SyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A sync policy name that is not one of `none`, `batch`, `each`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown sync policy `{0}` (choose from: none, batch, each)")]
pub struct UnknownSyncPolicy(pub String);

impl FromStr for SyncPolicy {
    type Err = UnknownSyncPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SyncPolicy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownSyncPolicy(s.to_string()))
    }
}

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Reading, writing, syncing or locking a store file failed.
    #[error("i/o on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// Another store (in this or another process) has the log open.
    #[error("the store {path} is in use by another server (its lock is held)")]
    Locked {
        /// The log file.
        path: PathBuf,
    },
    /// A damaged record is followed by valid ones: the log is corrupt, not merely torn at its end.
    #[error("the store {path} is corrupt: bad record at byte {offset} ({reason}), valid record at byte {next_valid}")]
    Corrupt {
        /// The log file.
        path: PathBuf,
        /// Where the damaged record starts.
        offset: u64,
        /// Where the first valid record after it starts.
        next_valid: u64,
        /// What is wrong with the damaged record.
        reason: &'static str,
    },
    /// An order's payload does not fit in a record.
    #[error(
        "order {id}: payload of {len} bytes is larger than the store's limit of {MAX_PAYLOAD}"
    )]
    PayloadTooLarge {
        /// The order.
        id: OrderId,
        /// Its payload length.
        len: usize,
    },
    /// An earlier write or sync failed, so the store accepts nothing more.
    #[error("the store failed and accepts no more orders: {reason}")]
    Failed {
        /// The first failure.
        reason: String,
    },
    /// The store's writer has stopped.
    #[error("the store's writer has stopped")]
    Closed,
}

impl StoreError {
    fn io(path: &Path, source: io::Error) -> StoreError {
        StoreError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// What [`Store::open`] found in the log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovery {
    /// Valid records in the log.
    pub records: u64,
    /// Bytes of a torn tail cut off the end of the log.
    pub truncated_bytes: u64,
    /// Records whose id appeared earlier in the log (never written by a store; counted, not fatal).
    pub duplicates: u64,
}

/// One record of the log, without its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// The order.
    pub id: OrderId,
    /// When the device made it, µs since the Unix epoch.
    pub made_us: u64,
    /// When its group was committed, µs since the Unix epoch.
    pub stored_us: u64,
    /// Its payload length.
    pub payload_len: u16,
}

/// What a store has done since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StoreStats {
    /// Distinct orders found in the log at open.
    pub recovered: u64,
    /// Orders applied (written) since open.
    pub applied: u64,
    /// Orders refused as already applied since open.
    pub already_applied: u64,
    /// Groups committed (calls of [`Store::commit`] with at least one order).
    pub groups: u64,
    /// `fdatasync` calls.
    pub syncs: u64,
    /// Bytes appended to the log.
    pub bytes: u64,
}

#[derive(Debug)]
struct StatCells {
    recovered: AtomicU64,
    applied: AtomicU64,
    already_applied: AtomicU64,
    groups: AtomicU64,
    syncs: AtomicU64,
    bytes: AtomicU64,
    /// How long each `fdatasync` took, µs (recorded by the writer, read by whoever asks).
    sync_us: Mutex<Histogram<u64>>,
    /// The first write or sync failure; from then on the store accepts nothing.
    failed: Mutex<Option<String>>,
}

impl Default for StatCells {
    fn default() -> Self {
        StatCells {
            recovered: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            already_applied: AtomicU64::new(0),
            groups: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            sync_us: Mutex::new(
                Histogram::new_with_bounds(1, MAX_SYNC_US, 3).expect("valid bounds"),
            ),
            failed: Mutex::new(None),
        }
    }
}

/// The longest `fdatasync` the histogram holds exactly: one hour, in µs (longer ones are recorded as this).
pub const MAX_SYNC_US: u64 = 3_600_000_000;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; a poisoned value is still the right value.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl StatCells {
    fn sync_histogram(&self) -> Histogram<u64> {
        lock(&self.sync_us).clone()
    }

    fn failure(&self) -> Option<String> {
        lock(&self.failed).clone()
    }

    fn snapshot(&self) -> StoreStats {
        StoreStats {
            recovered: self.recovered.load(Ordering::Relaxed),
            applied: self.applied.load(Ordering::Relaxed),
            already_applied: self.already_applied.load(Ordering::Relaxed),
            groups: self.groups.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

/// The durable store: the open, locked log and the set of applied ids.
pub struct Store {
    path: PathBuf,
    file: File,
    policy: SyncPolicy,
    /// Every id in the log, as ranges of seqs per sender run ([`applied`]).
    applied: AppliedIds,
    buf: Vec<u8>,
    failed: Option<String>,
    stats: Arc<StatCells>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .field("policy", &self.policy)
            .field("applied", &self.applied.len())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Open (creating if needed) the store in `dir`: lock the log, rebuild the applied ids, cut off a torn tail.
    pub fn open(dir: &Path, policy: SyncPolicy) -> Result<(Store, Recovery), StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::io(dir, e))?;
        let path = dir.join(LOG_FILE);
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|e| StoreError::io(&path, e))?;
        lock_exclusive(&file, &path)?;
        if !existed {
            // The new file's directory entry must be durable too, or a crash could lose the whole log.
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| StoreError::io(dir, e))?;
        }

        let mut applied = AppliedIds::default();
        let mut recovery = Recovery::default();
        let end = scan(&file, &path, |entry| {
            recovery.records += 1;
            if !applied.insert(entry.id) {
                recovery.duplicates += 1;
            }
        })?;
        if end.file_len > end.good_len {
            file.set_len(end.good_len)
                .and_then(|()| file.sync_all())
                .map_err(|e| StoreError::io(&path, e))?;
            recovery.truncated_bytes = end.file_len - end.good_len;
        }

        let stats = Arc::new(StatCells::default());
        stats.recovered.store(applied.len(), Ordering::Relaxed);
        let store = Store {
            path,
            file,
            policy,
            applied,
            buf: Vec::new(),
            failed: None,
            stats,
        };
        Ok((store, recovery))
    }

    /// Commit one group: apply each order whose id is new, once; report the rest as already applied.
    ///
    /// Nothing is reported [`Outcome::Applied`] before it is written and synced as the policy says. Orders with a
    /// payload larger than [`MAX_PAYLOAD`] fail the whole call before anything is written.
    pub fn commit(&mut self, orders: &[Order]) -> Result<Vec<Outcome>, StoreError> {
        if let Some(reason) = &self.failed {
            return Err(StoreError::Failed {
                reason: reason.clone(),
            });
        }
        check_payloads(orders)?;
        if orders.is_empty() {
            return Ok(Vec::new());
        }
        let result = self.write_group(orders);
        if let Err(e) = &result {
            self.failed = Some(e.to_string());
            *lock(&self.stats.failed) = self.failed.clone();
        }
        result
    }

    fn write_group(&mut self, orders: &[Order]) -> Result<Vec<Outcome>, StoreError> {
        let stored_us = now_us();
        let mut outcomes = Vec::with_capacity(orders.len());
        let (mut fresh, mut syncs, mut bytes) = (0u64, 0u64, 0u64);
        self.buf.clear();
        for order in orders {
            // Inserting before the sync is safe: if the write or sync fails, the store refuses every later commit.
            if !self.applied.insert(order.id) {
                outcomes.push(Outcome::AlreadyApplied);
                continue;
            }
            outcomes.push(Outcome::Applied);
            fresh += 1;
            encode_record(&mut self.buf, order, stored_us);
            if self.policy == SyncPolicy::Each {
                self.write_buf()?;
                self.sync()?;
                bytes += self.buf.len() as u64;
                syncs += 1;
                self.buf.clear();
            }
        }
        if !self.buf.is_empty() {
            self.write_buf()?;
            bytes += self.buf.len() as u64;
            if self.policy == SyncPolicy::Batch {
                self.sync()?;
                syncs += 1;
            }
        }
        let s = &self.stats;
        s.applied.fetch_add(fresh, Ordering::Relaxed);
        s.already_applied
            .fetch_add(orders.len() as u64 - fresh, Ordering::Relaxed);
        s.groups.fetch_add(1, Ordering::Relaxed);
        s.syncs.fetch_add(syncs, Ordering::Relaxed);
        s.bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(outcomes)
    }

    fn write_buf(&mut self) -> Result<(), StoreError> {
        self.file
            .write_all(&self.buf)
            .map_err(|e| StoreError::io(&self.path, e))
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        let started = Instant::now();
        let synced = self.file.sync_data();
        let us = (started.elapsed().as_micros() as u64).clamp(1, MAX_SYNC_US);
        lock(&self.stats.sync_us)
            .record(us)
            .expect("clamped into range");
        synced.map_err(|e| StoreError::io(&self.path, e))
    }

    /// Whether an order is in the store.
    pub fn contains(&self, id: &OrderId) -> bool {
        self.applied.contains(id)
    }

    /// Distinct orders in the store (recovered at open and applied since).
    pub fn applied(&self) -> u64 {
        self.applied.len()
    }

    /// The sync policy.
    pub fn policy(&self) -> SyncPolicy {
        self.policy
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// What the store has done since it was opened.
    pub fn stats(&self) -> StoreStats {
        self.stats.snapshot()
    }

    /// How long each `fdatasync` since open took, µs.
    pub fn sync_histogram(&self) -> Histogram<u64> {
        self.stats.sync_histogram()
    }

    /// Why the store stopped accepting orders, if a write or sync failed.
    pub fn failure(&self) -> Option<String> {
        self.stats.failure()
    }
}

fn lock_exclusive(file: &File, path: &Path) -> Result<(), StoreError> {
    // SAFETY: flock on a file descriptor we own; it has no memory effects.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Err(StoreError::Locked {
            path: path.to_path_buf(),
        })
    } else {
        Err(StoreError::io(path, err))
    }
}

fn check_payloads(orders: &[Order]) -> Result<(), StoreError> {
    match orders.iter().find(|o| o.payload.len() > MAX_PAYLOAD) {
        Some(o) => Err(StoreError::PayloadTooLarge {
            id: o.id,
            len: o.payload.len(),
        }),
        None => Ok(()),
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Append one record to `buf`. The payload must fit (see [`check_payloads`]).
fn encode_record(buf: &mut Vec<u8>, order: &Order, stored_us: u64) {
    let payload_len = order.payload.len() as u16;
    let body_len = BODY_FIXED_LEN + order.payload.len();
    let start = buf.len();
    buf.extend_from_slice(&(body_len as u32).to_le_bytes());
    buf.extend_from_slice(&[0; 4]);
    for v in [
        order.id.sender,
        order.id.run,
        order.id.seq,
        order.made_us,
        stored_us,
    ] {
        buf.extend_from_slice(&v.to_le_bytes());
    }
    buf.extend_from_slice(&payload_len.to_le_bytes());
    buf.extend_from_slice(&order.payload);
    let crc = crc32fast::hash(&buf[start + HEADER_LEN..]);
    buf[start + 4..start + HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Check a record's length field before reading its body.
fn check_len(len: usize) -> Result<(), &'static str> {
    if (BODY_FIXED_LEN..=MAX_BODY_LEN).contains(&len) {
        Ok(())
    } else {
        Err("impossible length")
    }
}

/// Decode a complete body whose header announced `crc`.
fn decode_body(body: &[u8], crc: u32) -> Result<LogEntry, &'static str> {
    check_len(body.len())?;
    if crc32fast::hash(body) != crc {
        return Err("checksum mismatch");
    }
    let payload_len = u16::from_le_bytes([body[40], body[41]]);
    if BODY_FIXED_LEN + usize::from(payload_len) != body.len() {
        return Err("payload length disagrees with record length");
    }
    Ok(LogEntry {
        id: OrderId {
            sender: u64_at(body, 0),
            run: u64_at(body, 8),
            seq: u64_at(body, 16),
        },
        made_us: u64_at(body, 24),
        stored_us: u64_at(body, 32),
        payload_len,
    })
}

/// Decode the record at the start of `bytes`, if a complete valid one is there; returns it and its total length.
fn decode_record(bytes: &[u8]) -> Option<(LogEntry, usize)> {
    let header = bytes.get(..HEADER_LEN)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    check_len(len).ok()?;
    let body = bytes.get(HEADER_LEN..HEADER_LEN + len)?;
    decode_body(body, crc).ok().map(|e| (e, HEADER_LEN + len))
}

/// Where a scan of the log ended.
struct ScanEnd {
    /// Length of the valid prefix.
    good_len: u64,
    /// Length of the file.
    file_len: u64,
}

/// Read the log from the start, calling `visit` for each valid record, up to the end or a torn tail.
///
/// A damaged record followed anywhere by a valid one is [`StoreError::Corrupt`].
fn scan(file: &File, path: &Path, mut visit: impl FnMut(LogEntry)) -> Result<ScanEnd, StoreError> {
    let io_err = |e| StoreError::io(path, e);
    let file_len = file.metadata().map_err(io_err)?.len();
    let mut handle = file;
    handle.seek(SeekFrom::Start(0)).map_err(io_err)?;
    // Only the length seen now: a log still being appended to is read up to here.
    let mut reader = BufReader::with_capacity(1 << 20, handle.take(file_len));
    let mut offset = 0u64;
    let mut header = [0u8; HEADER_LEN];
    let mut body = Vec::new();
    let reason = loop {
        let n = read_full(&mut reader, &mut header).map_err(io_err)?;
        if n == 0 {
            return Ok(ScanEnd {
                good_len: offset,
                file_len,
            });
        }
        if n < HEADER_LEN {
            break "incomplete header";
        }
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        if let Err(why) = check_len(len) {
            break why;
        }
        body.resize(len, 0);
        if read_full(&mut reader, &mut body).map_err(io_err)? < len {
            break "incomplete record";
        }
        match decode_body(&body, crc) {
            Ok(entry) => visit(entry),
            Err(why) => break why,
        }
        offset += (HEADER_LEN + len) as u64;
    };
    drop(reader);
    if let Some(next_valid) = find_valid_after(file, offset, file_len).map_err(io_err)? {
        return Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            offset,
            next_valid,
            reason,
        });
    }
    Ok(ScanEnd {
        good_len: offset,
        file_len,
    })
}

/// The first offset after `bad` (up to `file_len`) where a complete, valid record starts, if any.
///
/// Only runs when a scan met a damaged record, so reading the rest of the log into memory is acceptable.
fn find_valid_after(file: &File, bad: u64, file_len: u64) -> io::Result<Option<u64>> {
    let start = bad + 1;
    if start >= file_len {
        return Ok(None);
    }
    let mut handle = file;
    handle.seek(SeekFrom::Start(start))?;
    let mut rest = Vec::new();
    handle.take(file_len - start).read_to_end(&mut rest)?;
    Ok((0..rest.len())
        .find(|&i| decode_record(&rest[i..]).is_some())
        .map(|i| start + i as u64))
}

/// Fill `buf` as far as the reader allows; returns the bytes read (less than `buf.len()` only at the end).
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Read every valid record of the log in `dir`, stopping at a torn tail; the file is not modified or locked.
pub fn read_log(dir: &Path) -> Result<Vec<LogEntry>, StoreError> {
    let path = dir.join(LOG_FILE);
    let file = File::open(&path).map_err(|e| StoreError::io(&path, e))?;
    let mut entries = Vec::new();
    scan(&file, &path, |e| entries.push(e))?;
    Ok(entries)
}

/// The result of comparing what was made and acknowledged with what the log holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Audit {
    /// Distinct orders the devices made.
    pub made: u64,
    /// Distinct orders the devices saw acknowledged as stored.
    pub acked: u64,
    /// Distinct orders in the log.
    pub applied: u64,
    /// Records in the log.
    pub log_records: u64,
    /// Orders made that are not in the log.
    pub lost: u64,
    /// Orders acknowledged that are not in the log: a broken promise.
    pub acked_not_applied: u64,
    /// Log records whose id appeared earlier in the log: applied twice.
    pub duplicates: u64,
    /// Orders in the log that no device made.
    pub unknown: u64,
}

impl Audit {
    /// Nothing lost, nothing applied twice, every acknowledgement kept, nothing from nowhere.
    pub fn is_clean(&self) -> bool {
        self.lost == 0 && self.duplicates == 0 && self.acked_not_applied == 0 && self.unknown == 0
    }

    /// Audit log entries against the orders made and acknowledged.
    pub fn of_entries(entries: &[LogEntry], made: &[OrderId], acked: &[OrderId]) -> Audit {
        // foldhash: a seed drain audits millions of ids, and the std hasher's SipHash was most of the audit's time.
        let made: HashSet<OrderId> = made.iter().copied().collect();
        let acked: HashSet<OrderId> = acked.iter().copied().collect();
        let mut in_log = HashSet::with_capacity_and_hasher(entries.len(), Default::default());
        let duplicates = entries.iter().filter(|e| !in_log.insert(e.id)).count();
        let missing = |ids: &HashSet<OrderId>| ids.iter().filter(|id| !in_log.contains(id)).count();
        Audit {
            made: made.len() as u64,
            acked: acked.len() as u64,
            applied: in_log.len() as u64,
            log_records: entries.len() as u64,
            lost: missing(&made) as u64,
            acked_not_applied: missing(&acked) as u64,
            duplicates: duplicates as u64,
            unknown: in_log.iter().filter(|id| !made.contains(id)).count() as u64,
        }
    }
}

/// Read the log in `dir` and audit it against the orders made and acknowledged (see [`Audit`]).
pub fn audit(dir: &Path, made: &[OrderId], acked: &[OrderId]) -> Result<Audit, StoreError> {
    Ok(Audit::of_entries(&read_log(dir)?, made, acked))
}

type Reply = oneshot::Sender<Result<Vec<Outcome>, StoreError>>;

enum Request {
    Commit { orders: Vec<Order>, reply: Reply },
    Close { done: oneshot::Sender<()> },
}

/// Where a [`StoreHandle`]'s groups are written.
#[derive(Debug, Clone)]
enum Writer {
    /// On the store's own thread, which waits for each group's sync off the server's threads.
    Thread(mpsc::Sender<Request>),
    /// On the committing task's own thread: with no sync to wait for, a group is one `write` into the page cache.
    Inline(Arc<Inline>),
}

/// A store written by the tasks that commit to it ([`SyncPolicy::None`]): the first commit of a scheduler turn
/// leads, yields once so that the commits of the turn's other ready tasks join its group, then writes the group.
#[derive(Debug)]
struct Inline {
    /// The store (`None` once closed), and the group being written.
    written: Mutex<(Option<Store>, Group)>,
    /// The group the commits join until its leader writes it.
    queue: Mutex<Group>,
}

/// Commits to write as one group: their orders, and each commit's count and reply. The two buffers of [`Inline`]
/// trade places at every group, so neither is allocated again.
#[derive(Debug, Default)]
struct Group {
    orders: Vec<Order>,
    waiting: Vec<(usize, Reply)>,
    /// Whether a leader will write this group (only the queue's is ever set).
    led: bool,
}

impl Inline {
    /// Write everything queued as one group and answer each commit (as closed, once the store is).
    fn flush(&self) {
        let mut written = lock(&self.written);
        let (store, group) = &mut *written;
        {
            let mut queue = lock(&self.queue);
            queue.led = false;
            std::mem::swap(&mut queue.orders, &mut group.orders);
            std::mem::swap(&mut queue.waiting, &mut group.waiting);
        }
        match store {
            Some(store) if !group.waiting.is_empty() => {
                answer_group(store, &group.orders, &mut group.waiting)
            }
            // Closed: the replies are dropped, and each commit answers `Closed`.
            _ => group.waiting.clear(),
        }
        group.orders.clear();
    }
}

/// The leader's duty, done when its commit is dropped as well as when it finishes: a leader cancelled while it
/// yields still writes its group, so the commits that joined it are answered.
struct Lead<'a>(&'a Inline);

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        self.0.flush();
    }
}

/// Commit `orders` as one group and answer each waiting commit with its part of the outcomes, in order; `waiting`
/// is left empty.
fn answer_group(store: &mut Store, orders: &[Order], waiting: &mut Vec<(usize, Reply)>) {
    match store.commit(orders) {
        Ok(outcomes) => {
            let mut rest = outcomes.as_slice();
            for (n, reply) in waiting.drain(..) {
                let (mine, others) = rest.split_at(n);
                rest = others;
                let _ = reply.send(Ok(mine.to_vec()));
            }
        }
        Err(e) => {
            let reason = e.to_string();
            for (_, reply) in waiting.drain(..) {
                let _ = reply.send(Err(StoreError::Failed {
                    reason: reason.clone(),
                }));
            }
        }
    }
}

/// A store shared by every connection of a server; commits waiting at the same moment are written as one group.
///
/// A store that syncs ([`SyncPolicy::Batch`], [`SyncPolicy::Each`]) runs on its own thread, so that a server's
/// threads never wait in `fdatasync`. A store that never syncs ([`SyncPolicy::None`]) is written by the committing
/// tasks themselves, one group per scheduler turn: a hand-over to another thread and back would cost more than the
/// group's one `write`, and on a server pinned to one CPU it would take that CPU from the server at every group.
#[derive(Debug, Clone)]
pub struct StoreHandle {
    writer: Writer,
    stats: Arc<StatCells>,
    policy: SyncPolicy,
    dir: PathBuf,
}

impl StoreHandle {
    /// Start the store: its writer thread (named `store`) if its policy syncs, else written inline.
    ///
    /// If the thread cannot be started, every commit answers [`StoreError::Closed`]; use [`StoreHandle::try_spawn`]
    /// to get the reason instead.
    pub fn spawn(store: Store) -> StoreHandle {
        let stats = store.stats.clone();
        let policy = store.policy;
        let dir = store.dir().to_path_buf();
        Self::try_spawn(store).unwrap_or_else(|_| StoreHandle {
            writer: Writer::Thread(mpsc::channel().0),
            stats,
            policy,
            dir,
        })
    }

    /// Start the store (its writer thread, named `store`, if its policy syncs), or say why it could not start.
    pub fn try_spawn(store: Store) -> Result<StoreHandle, StoreError> {
        let stats = store.stats.clone();
        let policy = store.policy;
        let dir = store.dir().to_path_buf();
        let writer = if policy == SyncPolicy::None {
            Writer::Inline(Arc::new(Inline {
                written: Mutex::new((Some(store), Group::default())),
                queue: Mutex::default(),
            }))
        } else {
            let (tx, rx) = mpsc::channel();
            let path = store.path.clone();
            std::thread::Builder::new()
                .name("store".into())
                .spawn(move || writer(store, rx))
                .map_err(|e| StoreError::io(&path, e))?;
            Writer::Thread(tx)
        };
        Ok(StoreHandle {
            writer,
            stats,
            policy,
            dir,
        })
    }

    /// Commit orders (see [`Store::commit`]); they join whatever other commits are waiting, in one group.
    pub async fn commit(&self, mut orders: Vec<Order>) -> Result<Vec<Outcome>, StoreError> {
        // Checked here so that one bad request cannot fail the group it would have joined.
        check_payloads(&orders)?;
        if orders.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        match &self.writer {
            Writer::Thread(tx) => tx
                .send(Request::Commit { orders, reply })
                .map_err(|_| StoreError::Closed)?,
            Writer::Inline(inline) => {
                let lead = {
                    let mut queue = lock(&inline.queue);
                    queue.waiting.push((orders.len(), reply));
                    queue.orders.append(&mut orders);
                    !std::mem::replace(&mut queue.led, true)
                };
                if lead {
                    let lead = Lead(inline);
                    // The other tasks ready in this turn run (and join the group) before the leader writes it.
                    tokio::task::yield_now().await;
                    drop(lead);
                }
            }
        }
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Finish the commits already queued, close the log (releasing its lock) and stop the writer; later commits,
    /// through any clone, answer [`StoreError::Closed`].
    pub async fn close(&self) {
        match &self.writer {
            Writer::Thread(tx) => {
                let (done, closed) = oneshot::channel();
                if tx.send(Request::Close { done }).is_ok() {
                    let _ = closed.await;
                }
            }
            Writer::Inline(inline) => {
                inline.flush();
                lock(&inline.written).0.take();
            }
        }
    }

    /// What the store has done since it was opened.
    pub fn stats(&self) -> StoreStats {
        self.stats.snapshot()
    }

    /// How long each `fdatasync` since open took, µs (recorded where the store syncs).
    pub fn sync_histogram(&self) -> Histogram<u64> {
        self.stats.sync_histogram()
    }

    /// Why the store stopped accepting orders, if a write or sync failed.
    pub fn failure(&self) -> Option<String> {
        self.stats.failure()
    }

    /// Distinct orders in the store (recovered at open and applied since).
    pub fn applied(&self) -> u64 {
        let s = self.stats.snapshot();
        s.recovered + s.applied
    }

    /// The sync policy.
    pub fn policy(&self) -> SyncPolicy {
        self.policy
    }

    /// The store's directory, where a server may keep other state that lives and dies with the store.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl From<StoreError> for CommitError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::PayloadTooLarge { id, len } => CommitError::PayloadTooLarge { id, len },
            other => CommitError::Failed(other.to_string()),
        }
    }
}

impl OrderStore for StoreHandle {
    fn commit(&self, orders: Vec<Order>) -> BoxFuture<'static, Result<Vec<Outcome>, CommitError>> {
        let handle = self.clone();
        Box::pin(async move { Ok(StoreHandle::commit(&handle, orders).await?) })
    }
}

/// The writer thread: take everything queued, commit it as one group, answer each request with its part.
fn writer(mut store: Store, rx: mpsc::Receiver<Request>) {
    let mut close = None;
    let mut orders = Vec::new();
    let mut waiting: Vec<(usize, Reply)> = Vec::new();
    while close.is_none() {
        let Ok(first) = rx.recv() else { break };
        let mut next = Some(first);
        while let Some(request) = next.take() {
            match request {
                Request::Commit {
                    orders: mut o,
                    reply,
                } => {
                    waiting.push((o.len(), reply));
                    orders.append(&mut o);
                }
                Request::Close { done } => {
                    close = Some(done);
                    break;
                }
            }
            next = rx.try_recv().ok();
        }
        if waiting.is_empty() {
            continue;
        }
        answer_group(&mut store, &orders, &mut waiting);
        orders.clear();
    }
    // Close the file (releasing the lock) before saying so; requests still queued are dropped and answer Closed.
    drop(rx);
    drop(store);
    if let Some(done) = close {
        let _ = done.send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(seq: u64, payload: &[u8]) -> Order {
        Order {
            id: OrderId {
                sender: 7,
                run: 0xdead_beef,
                seq,
            },
            made_us: 1_000 + seq,
            payload: payload.to_vec(),
        }
    }

    #[test]
    fn record_round_trip() {
        let mut buf = Vec::new();
        encode_record(&mut buf, &order(1, b"hello"), 99);
        encode_record(&mut buf, &order(2, b""), 100);
        assert_eq!(buf.len(), 2 * (HEADER_LEN + BODY_FIXED_LEN) + 5);
        assert_eq!(
            u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize,
            BODY_FIXED_LEN + 5
        );
        let (a, n) = decode_record(&buf).unwrap();
        assert_eq!(
            (a.id, a.made_us, a.stored_us, a.payload_len),
            (order(1, b"").id, 1001, 99, 5)
        );
        let (b, m) = decode_record(&buf[n..]).unwrap();
        assert_eq!((b.id.seq, b.payload_len, b.stored_us), (2, 0, 100));
        assert_eq!(n + m, buf.len());
    }

    #[test]
    fn damaged_records_are_refused() {
        let mut buf = Vec::new();
        encode_record(&mut buf, &order(1, b"abc"), 5);
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x40;
            assert!(decode_record(&bad).is_none(), "flip at {i} accepted");
        }
        assert!(decode_record(&buf[..buf.len() - 1]).is_none());
        assert!(decode_record(&[0; 64]).is_none());
    }

    #[test]
    fn sync_policy_names() {
        for p in SyncPolicy::ALL {
            assert_eq!(p.to_string().parse::<SyncPolicy>().unwrap(), p);
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{p}\""));
        }
        let err = "fsync".parse::<SyncPolicy>().unwrap_err().to_string();
        assert!(err.contains("none, batch, each"), "{err}");
        assert_eq!(SyncPolicy::default(), SyncPolicy::Batch);
    }

    #[test]
    fn audit_counts_from_entries() {
        let id = |seq| order(seq, b"").id;
        let entry = |seq| LogEntry {
            id: id(seq),
            made_us: 0,
            stored_us: 0,
            payload_len: 0,
        };
        let entries = [entry(0), entry(1), entry(1), entry(9)];
        let a = Audit::of_entries(&entries, &[id(0), id(1), id(2)], &[id(0), id(2)]);
        let expected = Audit {
            made: 3,
            acked: 2,
            applied: 3,
            log_records: 4,
            lost: 1,
            acked_not_applied: 1,
            duplicates: 1,
            unknown: 1,
        };
        assert_eq!(a, expected);
        assert!(!a.is_clean());
        assert!(Audit::of_entries(&entries[..2], &[id(0), id(1)], &[id(1)]).is_clean());
    }

    #[test]
    fn every_sync_is_timed() {
        let dir = tempfile::tempdir().unwrap();
        for (policy, syncs) in [
            (SyncPolicy::None, 0),
            (SyncPolicy::Batch, 3),
            (SyncPolicy::Each, 6),
        ] {
            let sub = dir.path().join(policy.name());
            let (mut store, _) = Store::open(&sub, policy).unwrap();
            for g in 0..3 {
                store
                    .commit(&[order(2 * g, b"a"), order(2 * g + 1, b"b")])
                    .unwrap();
            }
            assert_eq!(store.stats().syncs, syncs, "{policy}");
            assert_eq!(store.sync_histogram().len(), syncs, "{policy}");
            assert_eq!(store.failure(), None);
        }
    }
}
