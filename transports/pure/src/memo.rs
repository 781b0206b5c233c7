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
//! mapped, not read: slots of idle senders are never touched and stay out of memory. A changed node key rewrites the
//! file from scratch (every secret depends on it); a reordered allow-list only costs recomputation, since a slot
//! names the sender it holds. After SIGKILL the kernel still holds the written pages; a machine crash may lose recent
//! slots, which costs recomputation, never correctness.

use crate::crypto::{link_secret, LowOrderKey, NodeKey};
use crate::receiver::LinkSecrets;
use memmap2::MmapMut;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"PURELNK1";
/// Bytes of the header and of each slot.
pub const SLOT: usize = 64;
const PREFIX: usize = 28;

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
    file: File,
    map: MmapMut,
    slots: usize,
    /// Slots written since open (for tests and logs).
    pub written: u64,
}

impl Memo {
    /// Open (or create) the memo for `node` with room for `senders` slots. A memo made for another node key is
    /// rewritten from scratch.
    pub fn open(path: &Path, node: &NodeKey, senders: usize) -> io::Result<Memo> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        let len = file.metadata()?.len() as usize;
        let mut header = [0u8; SLOT];
        header[..8].copy_from_slice(MAGIC);
        header[8..40].copy_from_slice(node.public());
        let fresh = if len >= SLOT {
            // SAFETY: the file is ours (mode 0600, beside the node key); a concurrent writer would only make slots
            // fail their check, which recomputes them.
            let map = unsafe { MmapMut::map_mut(&file)? };
            map[..SLOT] != header
        } else {
            true
        };
        if fresh {
            file.set_len(0)?;
        }
        let want = (SLOT * (senders + 1)) as u64;
        if file.metadata()?.len() < want {
            file.set_len(want)?;
        }
        // SAFETY: as above.
        let mut map = unsafe { MmapMut::map_mut(&file)? };
        if fresh {
            map[..SLOT].copy_from_slice(&header);
        }
        Ok(Memo {
            path: path.to_path_buf(),
            file,
            map,
            slots: senders,
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
