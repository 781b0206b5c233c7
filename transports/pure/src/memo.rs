//! The secret memo: link secrets remembered across receiver restarts, in a file mapped into memory.
//!
//! A link secret is a pure function of the two static keys (one X25519 and one HKDF), so remembering it is a cache,
//! not a session: an entry that is missing, torn or wrong is simply computed again. The file sits beside the node
//! key (`KEY.links`, mode 0600):
//!
//! ```text
//! header (64 bytes): magic "PURELNK1" | node public key [32] | zeros [24]
//! slot i (64 bytes), i = the sender's position in the allow-list:
//!     sender key prefix [28] | check u32 LE | secret [32]
//!     check = FNV-1a 32 over (sender public key [32] ‖ secret [32])
//! ```
//!
//! A slot is written secret first, check next, and the key prefix that makes it valid last; a slot whose prefix does
//! not match the sender, or whose check fails (torn write, corruption), is recomputed and rewritten. The file is
//! mapped, not read: slots of idle senders are never touched and stay out of memory. A changed node key starts a new
//! file, renamed over the old one (every secret depends on the key; a mapped file is never truncated, which would
//! fault whoever still maps it); a reordered allow-list only costs recomputation, since a slot names the sender it
//! holds. A server holds an exclusive `flock` on the memo while it runs: a second server on the same identity is
//! refused at start rather than sharing the mapping. After SIGKILL the kernel still holds the written pages (and
//! drops the lock); a machine crash may lose recent slots, which costs recomputation, never correctness.

use crate::crypto::{link_secret, LowOrderKey, NodeKey};
use crate::receiver::LinkSecrets;
use memmap2::MmapMut;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"PURELNK1";
/// Bytes of the header and of each slot.
pub const SLOT: usize = 64;
const PREFIX: usize = 28;

/// Why a memo could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum MemoError {
    /// Another process holds the memo's lock: a second server on the same identity.
    #[error("in use by another process (it holds the memo's lock)")]
    Locked,
    /// The file could not be opened, locked, replaced, sized or mapped.
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// The memo file of a node key file: `KEY.links`.
pub fn path_for(key_file: &Path) -> PathBuf {
    let mut name = key_file.as_os_str().to_owned();
    name.push(".links");
    PathBuf::from(name)
}

/// 32-bit FNV-1a.
fn fnv1a32(parts: &[&[u8]]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for part in parts {
        for &b in *part {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
    }
    h
}

/// Link secrets remembered in a mapped file.
pub struct Memo {
    path: PathBuf,
    /// Held open for the memo's life: the exclusive lock lives on it.
    file: File,
    map: MmapMut,
    slots: usize,
    /// Slots written since open (for tests and logs).
    pub written: u64,
}

/// Open (creating it if missing, never following a symlink) and lock `path` exclusively without waiting.
fn open_locked(path: &Path, create_new: bool) -> Result<File, MemoError> {
    let mut options = OpenOptions::new();
    options
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    if create_new {
        options.create_new(true);
    } else {
        options.create(true).truncate(false);
    }
    let file = options.open(path)?;
    // SAFETY: flock on a descriptor we own; the lock goes with it.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        return Err(if e.kind() == io::ErrorKind::WouldBlock {
            MemoError::Locked
        } else {
            e.into()
        });
    }
    Ok(file)
}

/// Whether `file` is still the file `path` names (a lock taken on a file the name no longer points to protects
/// nothing: another process replaced it meanwhile).
fn still_named(file: &File, path: &Path) -> io::Result<bool> {
    let (a, b) = (file.metadata()?, std::fs::symlink_metadata(path));
    Ok(matches!(b, Ok(b) if a.dev() == b.dev() && a.ino() == b.ino()))
}

impl Memo {
    /// Open (or create) the memo for `node` with room for `senders` slots, holding an exclusive lock on it until
    /// dropped. A memo made for another node key is replaced by a new file renamed over it, never truncated in
    /// place: a process that still has the old one mapped keeps reading valid pages.
    pub fn open(path: &Path, node: &NodeKey, senders: usize) -> Result<Memo, MemoError> {
        let mut header = [0u8; SLOT];
        header[..8].copy_from_slice(MAGIC);
        header[8..40].copy_from_slice(node.public());
        let file = loop {
            let file = open_locked(path, false)?;
            if still_named(&file, path)? {
                break file;
            }
        };
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        let len = file.metadata()?.len();
        let mut found = [0u8; SLOT];
        let ours =
            len >= SLOT as u64 && file.read_exact_at(&mut found, 0).is_ok() && found == header;
        let file = if ours {
            file
        } else if len == 0 {
            file.write_all_at(&header, 0)?;
            file
        } else {
            // Made for another key (or damaged): every secret in it is wrong. Start a new file beside it and rename
            // it over; the lock on the new one is taken before it has the name.
            let mut name = path.as_os_str().to_owned();
            name.push(format!(".new.{}", std::process::id()));
            let new_path = PathBuf::from(name);
            let _ = std::fs::remove_file(&new_path);
            let new = open_locked(&new_path, true)?;
            new.write_all_at(&header, 0)?;
            std::fs::rename(&new_path, path)?;
            new
        };
        let want = (SLOT * (senders + 1)) as u64;
        if file.metadata()?.len() < want {
            file.set_len(want)?;
        }
        // SAFETY: the file is ours (mode 0600, beside the node key) and locked: no other server maps it, and it is
        // only ever grown, never truncated, while mapped. A process ignoring the lock could only make slots fail
        // their check, which recomputes them.
        let map = unsafe { MmapMut::map_mut(&file)? };
        let slots = map.len() / SLOT - 1;
        Ok(Memo {
            path: path.to_path_buf(),
            file,
            map,
            slots,
            written: 0,
        })
    }

    /// The memo file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn slot(&self, index: usize) -> &[u8] {
        &self.map[SLOT * (index + 1)..SLOT * (index + 2)]
    }

    /// The remembered secret of sender `index` with public key `sender`, if its slot is valid.
    pub fn lookup(&self, index: usize, sender: &[u8; 32]) -> Option<[u8; 32]> {
        if index >= self.slots {
            return None;
        }
        let s = self.slot(index);
        if s[..PREFIX] != sender[..PREFIX] {
            return None;
        }
        let check = u32::from_le_bytes(s[PREFIX..PREFIX + 4].try_into().expect("4 bytes"));
        let secret: [u8; 32] = s[PREFIX + 4..].try_into().expect("32 bytes");
        (fnv1a32(&[sender, &secret]) == check).then_some(secret)
    }

    /// Remember a secret: the secret first, the check next, the key prefix that makes the slot valid last.
    pub fn store(&mut self, index: usize, sender: &[u8; 32], secret: &[u8; 32]) -> io::Result<()> {
        if index >= self.slots {
            self.grow(index + 1)?;
        }
        let at = SLOT * (index + 1);
        let slot = &mut self.map[at..at + SLOT];
        slot[..PREFIX].fill(0);
        slot[PREFIX + 4..].copy_from_slice(secret);
        slot[PREFIX..PREFIX + 4].copy_from_slice(&fnv1a32(&[sender, secret]).to_le_bytes());
        slot[..PREFIX].copy_from_slice(&sender[..PREFIX]);
        self.written += 1;
        Ok(())
    }

    fn grow(&mut self, slots: usize) -> io::Result<()> {
        self.map.flush()?;
        self.file.set_len((SLOT * (slots + 1)) as u64)?;
        // SAFETY: as in `open`.
        self.map = unsafe { MmapMut::map_mut(&self.file)? };
        self.slots = slots;
        Ok(())
    }

    /// Write the mapped pages to the file now (the kernel does it anyway; this is for a clean shutdown).
    pub fn flush(&self) -> io::Result<()> {
        self.map.flush()
    }
}

impl LinkSecrets for Memo {
    fn get(
        &mut self,
        index: usize,
        sender: &[u8; 32],
        node: &NodeKey,
    ) -> Result<([u8; 32], bool), LowOrderKey> {
        if let Some(secret) = self.lookup(index, sender) {
            return Ok((secret, false));
        }
        let secret = link_secret(node, sender, sender, node.public())?;
        // A memo that cannot be written only costs the X25519 again at the next start.
        let _ = self.store(index, sender, &secret);
        Ok((secret, true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    fn keys(n: usize, seed: u64) -> (NodeKey, Vec<NodeKey>) {
        let mut rng = StdRng::seed_from_u64(seed);
        (
            NodeKey::generate(&mut rng),
            (0..n).map(|_| NodeKey::generate(&mut rng)).collect(),
        )
    }

    #[test]
    fn remembers_across_opens_and_is_0600() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_for(&dir.path().join("node.key"));
        let (node, senders) = keys(5, 1);
        let mut memo = Memo::open(&path, &node, 5).unwrap();
        assert_eq!(transport_core::keys::mode(&path).unwrap(), 0o600);
        let computed: Vec<_> = senders
            .iter()
            .enumerate()
            .map(|(i, s)| memo.get(i, s.public(), &node).unwrap())
            .collect();
        assert!(computed.iter().all(|(_, agreed)| *agreed));
        drop(memo);
        let mut memo = Memo::open(&path, &node, 5).unwrap();
        for (i, s) in senders.iter().enumerate() {
            assert_eq!(
                memo.get(i, s.public(), &node).unwrap(),
                (computed[i].0, false),
                "slot {i} remembered"
            );
        }
    }

    #[test]
    fn a_corrupted_slot_is_recomputed_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_for(&dir.path().join("node.key"));
        let (node, senders) = keys(4, 2);
        let mut memo = Memo::open(&path, &node, 4).unwrap();
        for (i, s) in senders.iter().enumerate() {
            memo.get(i, s.public(), &node).unwrap();
        }
        drop(memo);
        // Flip one byte of slot 2's secret by hand.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[SLOT * 3 + PREFIX + 4 + 7] ^= 0x40;
        std::fs::write(&path, bytes).unwrap();
        let mut memo = Memo::open(&path, &node, 4).unwrap();
        let agreed: Vec<bool> = senders
            .iter()
            .enumerate()
            .map(|(i, s)| memo.get(i, s.public(), &node).unwrap().1)
            .collect();
        assert_eq!(agreed, vec![false, false, true, false]);
    }

    #[test]
    fn a_new_node_key_rewrites_the_memo() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_for(&dir.path().join("node.key"));
        let (node, senders) = keys(3, 3);
        let mut memo = Memo::open(&path, &node, 3).unwrap();
        for (i, s) in senders.iter().enumerate() {
            memo.get(i, s.public(), &node).unwrap();
        }
        drop(memo);
        let (other_node, _) = keys(0, 4);
        let mut memo = Memo::open(&path, &other_node, 3).unwrap();
        assert!(
            senders
                .iter()
                .enumerate()
                .all(|(i, s)| memo.lookup(i, s.public()).is_none()),
            "nothing carried over"
        );
        let (secret, agreed) = memo.get(0, senders[0].public(), &other_node).unwrap();
        assert!(agreed);
        assert_eq!(
            secret,
            link_secret(
                &other_node,
                senders[0].public(),
                senders[0].public(),
                other_node.public()
            )
            .unwrap()
        );
    }

    #[test]
    fn a_reordered_allow_list_costs_recomputation_not_correctness() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_for(&dir.path().join("node.key"));
        let (node, senders) = keys(2, 5);
        let mut memo = Memo::open(&path, &node, 2).unwrap();
        let a = memo.get(0, senders[0].public(), &node).unwrap().0;
        let b = memo.get(1, senders[1].public(), &node).unwrap().0;
        // Swapped positions: each slot now names the other sender, so both are recomputed, and right.
        assert_eq!(memo.get(0, senders[1].public(), &node).unwrap(), (b, true));
        assert_eq!(memo.get(1, senders[0].public(), &node).unwrap(), (a, true));
    }

    #[test]
    fn a_second_opener_is_refused_while_the_first_holds_the_memo() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_for(&dir.path().join("node.key"));
        let (node, senders) = keys(1, 7);
        let mut memo = Memo::open(&path, &node, 1).unwrap();
        assert!(matches!(
            Memo::open(&path, &node, 1),
            Err(MemoError::Locked)
        ));
        // Not even with another node key, which would replace the file under the first.
        let (other, _) = keys(0, 8);
        assert!(matches!(
            Memo::open(&path, &other, 1),
            Err(MemoError::Locked)
        ));
        let secret = memo.get(0, senders[0].public(), &node).unwrap().0;
        drop(memo);
        let memo = Memo::open(&path, &node, 1).unwrap();
        assert_eq!(memo.lookup(0, senders[0].public()), Some(secret));
    }

    #[test]
    fn a_new_node_key_never_truncates_a_mapped_memo() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_for(&dir.path().join("node.key"));
        let (node, senders) = keys(2, 9);
        let mut memo = Memo::open(&path, &node, 2).unwrap();
        memo.get(1, senders[1].public(), &node).unwrap();
        drop(memo);
        // Someone still has the old memo mapped (a tool, a server that ignores the lock) when a new key opens it.
        let old = File::open(&path).unwrap();
        // SAFETY: a read-only map of a file this test owns.
        let stray = unsafe { memmap2::Mmap::map(&old).unwrap() };
        let (other, _) = keys(0, 10);
        let memo = Memo::open(&path, &other, 2).unwrap();
        // The old mapping still holds what it held: a truncation in place would have zeroed it under the reader
        // (or, had the file not been grown again, made reading it raise SIGBUS).
        assert_eq!(&stray[8..40], node.public());
        assert!(stray.iter().skip(SLOT * 2).any(|&b| b != 0));
        assert_eq!(memo.lookup(1, senders[1].public()), None);
        assert_eq!(&std::fs::read(&path).unwrap()[8..40], other.public());
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no file left beside it"
        );
    }

    #[test]
    fn a_symlink_in_place_of_the_memo_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_for(&dir.path().join("node.key"));
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"precious").unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let (node, _) = keys(0, 11);
        assert!(Memo::open(&path, &node, 1).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    }

    #[test]
    fn grows_for_a_longer_allow_list() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_for(&dir.path().join("node.key"));
        let (node, senders) = keys(3, 6);
        let mut memo = Memo::open(&path, &node, 1).unwrap();
        memo.get(2, senders[2].public(), &node).unwrap();
        drop(memo);
        let memo = Memo::open(&path, &node, 3).unwrap();
        assert!(memo.lookup(2, senders[2].public()).is_some());
    }
}
