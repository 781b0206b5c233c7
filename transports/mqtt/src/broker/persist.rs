//! Persistent sessions on disk: a snapshot and a journal in the broker's state directory, written with `fsync`,
//! read back at start.
//!
//! # Files
//!
//! - `DIR/mqtt-sessions.snap`: `MQSNAP01`, a generation (`u64` LE), then [`journal`] records that
//!   recreate every persistent session, the last one `SnapshotEnd` with the count before it. Written whole to
//!   `mqtt-sessions.snap.tmp`, synced, renamed over the old one, and the directory synced: a snapshot is either the
//!   old one or the new one, never a mix.
//! - `DIR/mqtt-sessions.log`: `MQJRNL01`, the generation of the snapshot it follows, then the records appended since
//!   that snapshot. It is locked (`flock`) while a broker uses the directory, so two brokers never share one.
//!
//! Both hold client identifiers, subscriptions and queued messages: they are mode 0600, set on the open file
//! whatever the umask or an older file's mode, and never opened through a symlink (`O_NOFOLLOW`). The temporary
//! snapshot is created new (`O_EXCL`) after whatever had its name is removed, so a file or symlink planted there is
//! never written through.
//!
//! # Start
//!
//! [`SessionStore::open`] reads the snapshot, then the journal if its generation is the snapshot's (an older one was
//! already folded into the snapshot by a compaction that stopped before resetting the journal), and replays both
//! into the broker state. Then it compacts: the restored state becomes snapshot `generation + 1` and the journal is
//! reset to follow it.
//!
//! What counts as damage, as in the order store: a journal record that is incomplete or fails its checksum *with
//! nothing valid after it* is a torn tail left by a crash in the middle of a write; it is cut off (nothing in it was
//! acknowledged, since acknowledgements wait for the sync). Anything else, a damaged record followed by valid ones,
//! a snapshot that does not check, or records that do not fit together, is corruption: the broker does not start,
//! and says which file and where ([`PersistError::Corrupt`]). Moving the two files away starts it with no sessions.
//!
//! # Running
//!
//! The broker state appends records as persistent sessions change; the driver hands them to
//! [`SessionStore::append`] in the order they were made, with a sequence number, and waits for
//! [`SessionStore::durable`] before sending any packet that acknowledges them (CONNACK, SUBACK, PUBACK, PUBREC,
//! PUBCOMP) or delivers a message they queued. A writer thread takes everything waiting, writes it with one `write`
//! and one `fdatasync` (group commit), then announces the highest sequence written. When the journal has grown past
//! twice the last snapshot (and 8 MiB), the driver hands over a new snapshot, which the writer installs the same way
//! as at start. After a failed write or sync every later wait fails: the broker never acknowledges what it could not
//! make durable.

use super::journal::{self, Record};
use super::state::{Broker as State, RestoreError};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use tokio::sync::{oneshot, watch};
use transport_core::StateSyncs;

/// The snapshot's file name in the state directory.
pub const SNAPSHOT_FILE: &str = "mqtt-sessions.snap";
/// The journal's file name in the state directory.
pub const JOURNAL_FILE: &str = "mqtt-sessions.log";
const SNAPSHOT_MAGIC: &[u8; 8] = b"MQSNAP01";
const JOURNAL_MAGIC: &[u8; 8] = b"MQJRNL01";
const HEADER: usize = 16;
/// The journal is compacted once it is larger than this and than twice the last snapshot.
const COMPACT_MIN: usize = 8 << 20;
/// The mode of both files: only the broker's user reads them.
const FILE_MODE: u32 = 0o600;

/// Set [`FILE_MODE`] on an open file: the umask may have narrowed the mode asked at creation, and a file made by an
/// older version (or by hand) may be readable by others.
fn private(f: File) -> std::io::Result<File> {
    f.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
    Ok(f)
}

/// Why the session files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// A file could not be read, written or synced.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Another process holds the journal's lock.
    #[error("{0} is locked by another broker")]
    Locked(PathBuf),
    /// A file is damaged beyond a torn tail, or its records do not fit together.
    #[error("{path} is corrupt at offset {offset}: {reason}; move mqtt-sessions.* away to start without sessions")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where the damage starts.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// The writer failed earlier, or was closed.
    #[error("session state not durable: {0}")]
    Failed(Arc<str>),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PersistError + '_ {
    move |source| PersistError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What the start found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    /// Records replayed from the snapshot.
    pub snapshot_records: u64,
    /// Records replayed from the journal.
    pub journal_records: u64,
    /// Bytes of a torn journal tail cut off.
    pub truncated_bytes: u64,
    /// The generation now in use.
    pub generation: u64,
}

#[derive(Debug, Clone, Default)]
struct Durable {
    seq: u64,
    failed: Option<Arc<str>>,
}

enum Request {
    Append(Vec<u8>, u64),
    Compact(Vec<u8>, u64),
    Close(oneshot::Sender<()>),
}

/// The session files of a running broker: the writer thread and what it has made durable.
#[derive(Debug)]
pub struct SessionStore {
    tx: mpsc::Sender<Request>,
    durable: watch::Receiver<Durable>,
    seq: u64,
    since_snapshot: usize,
    snapshot_len: usize,
}

impl SessionStore {
    /// Lock and read the session files in `dir` (creating it if needed), replay them into `state`, compact, turn
    /// the state's journal on and start the writer thread.
    pub fn open(dir: &Path, state: &mut State) -> Result<(SessionStore, Recovery), PersistError> {
        Self::open_recording(dir, state, Arc::default())
    }

    /// As [`SessionStore::open`], recording the time of every sync of the session files in `syncs`.
    pub fn open_recording(
        dir: &Path,
        state: &mut State,
        syncs: Arc<StateSyncs>,
    ) -> Result<(SessionStore, Recovery), PersistError> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let log_path = dir.join(JOURNAL_FILE);
        let mut log = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&log_path)
            .and_then(private)
            .map_err(io_err(&log_path))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(log.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(PersistError::Locked(log_path));
        }
        let mut recovery = Recovery::default();
        let snap_path = dir.join(SNAPSHOT_FILE);
        let generation = match std::fs::read(&snap_path) {
            Ok(bytes) => {
                let (generation, records) = read_snapshot(&snap_path, &bytes)?;
                recovery.snapshot_records = restore(state, &snap_path, HEADER, records)?;
                generation
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(io_err(&snap_path)(e)),
        };
        let bytes = std::fs::read(&log_path).map_err(io_err(&log_path))?;
        if let Some((records, torn)) = read_journal(&log_path, &bytes, generation)? {
            recovery.journal_records = restore(state, &log_path, HEADER, records)?;
            recovery.truncated_bytes = torn;
        }
        // Fold everything into a new snapshot and start a fresh journal after it.
        recovery.generation = generation + 1;
        let snapshot = state.snapshot();
        install(dir, &mut log, &snapshot, recovery.generation, &syncs)?;
        state.enable_journal();
        let (durable_tx, durable) = watch::channel(Durable::default());
        let (tx, rx) = mpsc::channel();
        let writer_dir = dir.to_path_buf();
        std::thread::Builder::new()
            .name("mqtt-sessions".into())
            .spawn(move || writer(writer_dir, log, recovery.generation, rx, durable_tx, syncs))
            .map_err(io_err(dir))?;
        let store = SessionStore {
            tx,
            durable,
            seq: 0,
            since_snapshot: 0,
            snapshot_len: snapshot.len(),
        };
        Ok((store, recovery))
    }

    /// Hand over records the state appended (in the order made); returns the sequence number to wait for.
    /// When the journal has grown enough, `snapshot` is called for a new snapshot, which replaces it.
    pub fn append(&mut self, records: Vec<u8>, snapshot: impl FnOnce() -> Vec<u8>) -> u64 {
        self.seq += 1;
        self.since_snapshot += records.len();
        let _ = self.tx.send(Request::Append(records, self.seq));
        if self.since_snapshot > COMPACT_MIN.max(2 * self.snapshot_len) {
            let snap = snapshot();
            self.seq += 1;
            self.since_snapshot = 0;
            self.snapshot_len = snap.len();
            let _ = self.tx.send(Request::Compact(snap, self.seq));
        }
        self.seq
    }

    /// The sequence number of the last records handed over.
    pub fn appended(&self) -> u64 {
        self.seq
    }

    /// A future that resolves when everything up to `seq` is on disk, or fails if the writer failed.
    pub fn durable(&self, seq: u64) -> impl std::future::Future<Output = Result<(), PersistError>> {
        let mut rx = self.durable.clone();
        async move {
            let d = rx
                .wait_for(|d| d.seq >= seq || d.failed.is_some())
                .await
                .map_err(|_| PersistError::Failed("the session writer stopped".into()))?;
            match &d.failed {
                Some(why) => Err(PersistError::Failed(why.clone())),
                None => Ok(()),
            }
        }
    }

    /// A future that writes what was handed over, then stops the writer and releases the lock.
    pub fn close(&self) -> impl std::future::Future<Output = ()> {
        let (done, closed) = oneshot::channel();
        let sent = self.tx.send(Request::Close(done)).is_ok();
        async move {
            if sent {
                let _ = closed.await;
            }
        }
    }
}

/// The generation and record bytes of a snapshot file, checked whole.
fn read_snapshot<'a>(path: &Path, bytes: &'a [u8]) -> Result<(u64, &'a [u8]), PersistError> {
    let corrupt = |offset: usize, reason: String| PersistError::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        reason,
    };
    if bytes.len() < HEADER || &bytes[..8] != SNAPSHOT_MAGIC {
        return Err(corrupt(0, "not a session snapshot".into()));
    }
    let generation = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or_default());
    let records = &bytes[HEADER..];
    let (mut offset, mut count) = (0, 0u64);
    loop {
        let (record, used) = journal::decode(&records[offset..])
            .map_err(|e| corrupt(HEADER + offset, format!("{e} (a snapshot is never torn)")))?;
        offset += used;
        if let Record::SnapshotEnd { records: n } = record {
            if n != count || offset != records.len() {
                return Err(corrupt(
                    HEADER + offset,
                    "snapshot end does not match".into(),
                ));
            }
            return Ok((generation, records));
        }
        count += 1;
    }
}

/// The record bytes of the journal to replay and the bytes of a torn tail, or `None` for a journal that is empty or
/// older than the snapshot.
fn read_journal<'a>(
    path: &Path,
    bytes: &'a [u8],
    generation: u64,
) -> Result<Option<(&'a [u8], u64)>, PersistError> {
    let corrupt = |offset: usize, reason: String| PersistError::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        reason,
    };
    if bytes.len() < HEADER {
        // Empty, or a header torn while it was being written: nothing after it was ever acknowledged.
        return Ok(None);
    }
    if &bytes[..8] != JOURNAL_MAGIC {
        return Err(corrupt(0, "not a session journal".into()));
    }
    let journal_generation = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or_default());
    if journal_generation < generation {
        return Ok(None);
    }
    if journal_generation > generation {
        return Err(corrupt(8, format!("journal generation {journal_generation} follows no snapshot (the snapshot is {generation})")));
    }
    let records = &bytes[HEADER..];
    let mut offset = 0;
    while offset < records.len() {
        match journal::decode(&records[offset..]) {
            Ok((_, used)) => offset += used,
            Err(e) => {
                if let Some(next) =
                    (offset + 1..records.len()).find(|&i| journal::decode(&records[i..]).is_ok())
                {
                    return Err(corrupt(
                        HEADER + offset,
                        format!(
                            "{e}, with a valid record after it at offset {}",
                            HEADER + next
                        ),
                    ));
                }
                return Ok(Some((&records[..offset], (records.len() - offset) as u64)));
            }
        }
    }
    Ok(Some((records, 0)))
}

fn restore(
    state: &mut State,
    path: &Path,
    base: usize,
    records: &[u8],
) -> Result<u64, PersistError> {
    state.restore(records).map(|r| r.records).map_err(|e| {
        let (offset, reason) = match e {
            RestoreError::Record { offset, error } => (offset, error.to_string()),
            RestoreError::Inconsistent { offset, reason } => (offset, reason.to_string()),
        };
        PersistError::Corrupt {
            path: path.to_path_buf(),
            offset: (base + offset) as u64,
            reason,
        }
    })
}

fn header(magic: &[u8; 8], generation: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(magic);
    h[8..].copy_from_slice(&generation.to_le_bytes());
    h
}

/// Make `snapshot` the snapshot of `generation` and reset the journal to follow it.
fn install(
    dir: &Path,
    log: &mut File,
    snapshot: &[u8],
    generation: u64,
    syncs: &StateSyncs,
) -> Result<(), PersistError> {
    let tmp = dir.join(format!("{SNAPSHOT_FILE}.tmp"));
    let path = dir.join(SNAPSHOT_FILE);
    // Left by a crash, or planted: removed (a symlink itself, never its target), then created anew.
    if let Err(e) = std::fs::remove_file(&tmp) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(io_err(&tmp)(e));
        }
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .and_then(private)
        .map_err(io_err(&tmp))?;
    f.write_all(&header(SNAPSHOT_MAGIC, generation))
        .and_then(|()| f.write_all(snapshot))
        .and_then(|()| syncs.time(|| f.sync_all()))
        .map_err(io_err(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
    File::open(dir)
        .and_then(|d| syncs.time(|| d.sync_all()))
        .map_err(io_err(dir))?;
    // A crash from here until the new header is synced leaves a journal of the old generation: ignored next start.
    let log_path = dir.join(JOURNAL_FILE);
    log.set_len(0)
        .and_then(|()| log.write_all(&header(JOURNAL_MAGIC, generation)))
        .and_then(|()| syncs.time(|| log.sync_data()))
        .map_err(io_err(&log_path))
}

/// The writer thread: everything waiting, one write and one sync, then the highest sequence written is durable.
fn writer(
    dir: PathBuf,
    mut log: File,
    mut generation: u64,
    rx: mpsc::Receiver<Request>,
    durable: watch::Sender<Durable>,
    syncs: Arc<StateSyncs>,
) {
    let log_path = dir.join(JOURNAL_FILE);
    let mut buf = Vec::new();
    let mut failed: Option<Arc<str>> = None;
    let mut close = None;
    while close.is_none() {
        let Ok(first) = rx.recv() else { break };
        let mut next = Some(first);
        let mut seq = None;
        while let Some(request) = next.take() {
            match request {
                Request::Append(bytes, s) => {
                    buf.extend_from_slice(&bytes);
                    seq = Some(s);
                }
                Request::Compact(snapshot, s) => {
                    if failed.is_none() {
                        let written = flush(&mut log, &mut buf, &log_path, &syncs).and_then(|()| {
                            install(&dir, &mut log, &snapshot, generation + 1, &syncs)
                        });
                        match written {
                            Ok(()) => generation += 1,
                            Err(e) => failed = Some(e.to_string().into()),
                        }
                    }
                    buf.clear();
                    seq = Some(s);
                }
                Request::Close(done) => {
                    close = Some(done);
                    break;
                }
            }
            next = rx.try_recv().ok();
        }
        if failed.is_none() && !buf.is_empty() {
            if let Err(e) = flush(&mut log, &mut buf, &log_path, &syncs) {
                failed = Some(e.to_string().into());
            }
        }
        buf.clear();
        durable.send_modify(|d| {
            if let Some(s) = seq {
                d.seq = s;
            }
            d.failed = failed.clone();
        });
    }
    drop(log);
    if let Some(done) = close {
        let _ = done.send(());
    }
}

fn flush(
    log: &mut File,
    buf: &mut Vec<u8>,
    path: &Path,
    syncs: &StateSyncs,
) -> Result<(), PersistError> {
    if buf.is_empty() {
        return Ok(());
    }
    log.write_all(buf)
        .and_then(|()| syncs.time(|| log.sync_data()))
        .map_err(io_err(path))?;
    buf.clear();
    Ok(())
}

#[cfg(test)]
mod tests;
