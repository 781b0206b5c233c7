//! The store's recovery (`transport_core::store::Store::open`) on logs the fuzzer writes and then damages.
//!
//! Each input commits groups of orders through the real store (a real file), closes it, damages the log (cuts,
//! flipped and overwritten bytes, zeroed ranges, appended garbage, a valid record copied elsewhere), and opens it
//! again.
//!
//! Checks:
//! - the log the store wrote reads back, by a reference reader written from its documented format, as exactly the
//!   orders applied, in order; duplicates in a group are applied once;
//! - opening the damaged log never panics and does what the documentation says: a damaged record followed by a
//!   valid one is `StoreError::Corrupt` naming both offsets, and the file is left as it was; otherwise the torn
//!   tail is cut to the valid prefix, reported in `Recovery`, and every record before it is applied;
//! - no record before the first damaged byte is ever lost;
//! - exactly once after recovery: committing every original order again writes only the ones recovery did not
//!   find, and the reopened log holds each order once (more only where the damage itself copied a record).
#![no_main]

use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use std::collections::{HashMap, HashSet};
use std::fs;
use transport_store::{read_log, Outcome, Store, StoreError, SyncPolicy, LOG_FILE};
use transport_core::{Order, OrderId};
use transport_fuzz::bytes_upto;
use transport_fuzz::store::{read, scratch_dir, RECORD_OVERHEAD};

#[derive(Debug)]
enum Damage {
    Cut(usize),
    Flip(usize, u8),
    Overwrite(usize, Vec<u8>),
    Zero(usize, usize),
    Append(Vec<u8>),
    /// Copy the record at index `.0` to offset `.1` (over what is there).
    CopyRecord(usize, usize),
}

fn damage(u: &mut Unstructured<'_>) -> arbitrary::Result<Damage> {
    let at = u.int_in_range(0..=4096usize)?;
    Ok(match u.int_in_range(0..=5)? {
        0 => Damage::Cut(at),
        1 => Damage::Flip(at, u.int_in_range(1..=255)?),
        2 => Damage::Overwrite(at, bytes_upto(u, 16)?),
        3 => Damage::Zero(at, u.int_in_range(1..=64)?),
        4 => Damage::Append(bytes_upto(u, 80)?),
        _ => Damage::CopyRecord(u.int_in_range(0..=31)?, at),
    })
}

fn apply(log: &mut Vec<u8>, d: &Damage, offsets: &[(usize, usize)]) {
    let len = log.len();
    match d {
        Damage::Cut(at) => log.truncate(at % (len + 1)),
        Damage::Flip(at, x) if len > 0 => log[at % len] ^= x,
        Damage::Overwrite(at, bytes) if len > 0 => {
            let at = at % len;
            let n = bytes.len().min(len - at);
            log[at..at + n].copy_from_slice(&bytes[..n]);
        }
        Damage::Zero(at, n) if len > 0 => {
            let at = at % len;
            let end = (at + n).min(len);
            log[at..end].fill(0);
        }
        Damage::Append(bytes) => log.extend_from_slice(bytes),
        Damage::CopyRecord(i, at) if !offsets.is_empty() && len > 0 => {
            let (start, rlen) = offsets[i % offsets.len()];
            // Earlier damage may have cut the log short of it.
            let Some(record) = log.get(start..start + rlen).map(<[u8]>::to_vec) else {
                return;
            };
            let at = at % (len + 1);
            let end = (at + rlen).min(len);
            log.splice(at..end, record);
        }
        _ => {}
    }
}

fuzz_target!(init: transport_fuzz::seeds::write_if_asked("store_recovery"), |data: &[u8]| {
    let mut u = Unstructured::new(data);
    let dir = scratch_dir();
    let _ = fs::remove_dir_all(dir);
    let path = dir.join(LOG_FILE);

    // Write: groups of orders through the real store.
    let (mut store, recovery) = Store::open(dir, SyncPolicy::None).expect("a new store opens");
    assert_eq!(recovery.records, 0);
    let mut originals: Vec<Order> = Vec::new();
    let mut applied: Vec<(OrderId, usize)> = Vec::new();
    let groups = u.int_in_range(0..=6).unwrap_or(0);
    for _ in 0..groups {
        let n = u.int_in_range(1..=6).unwrap_or(1);
        let group: Vec<Order> = (0..n)
            .map(|_| Order {
                id: OrderId {
                    sender: u.int_in_range(0..=2).unwrap_or(0),
                    run: u.int_in_range(0..=1).unwrap_or(0),
                    seq: u.int_in_range(0..=7).unwrap_or(0),
                },
                made_us: u.int_in_range(0..=u64::MAX).unwrap_or(0),
                payload: bytes_upto(&mut u, 40).unwrap_or_default(),
            })
            .collect();
        let outcomes = store.commit(&group).expect("commit to a healthy store");
        for (o, outcome) in group.iter().zip(outcomes) {
            let seen = applied.iter().any(|(id, _)| *id == o.id);
            assert_eq!(outcome == Outcome::Applied, !seen, "order {} applied {outcome:?}", o.id);
            if outcome == Outcome::Applied {
                applied.push((o.id, RECORD_OVERHEAD + o.payload.len()));
            }
        }
        originals.extend(group);
    }
    drop(store);
    let log = fs::read(&path).expect("log readable");
    let written = read(&log);
    assert_eq!(written.next_valid, None);
    assert_eq!(written.good_len, log.len(), "the store wrote bytes the documented format does not read");
    let ids: Vec<OrderId> = written.records.iter().map(|r| r.id).collect();
    assert_eq!(ids, applied.iter().map(|(id, _)| *id).collect::<Vec<_>>(), "the log is not the orders applied");
    let offsets: Vec<(usize, usize)> = written.records.iter().zip(&applied).map(|(r, (_, len))| (r.offset, *len)).collect();

    // Damage.
    let mut damaged = log.clone();
    let n = u.int_in_range(0..=3).unwrap_or(0);
    for _ in 0..n {
        let Ok(d) = damage(&mut u) else { break };
        apply(&mut damaged, &d, &offsets);
    }
    let first_damage = log.iter().zip(&damaged).position(|(a, b)| a != b).unwrap_or(log.len().min(damaged.len()));
    fs::write(&path, &damaged).expect("write the damaged log");
    let expected = read(&damaged);

    // Recover.
    match Store::open(dir, SyncPolicy::None) {
        Err(StoreError::Corrupt { offset, next_valid, .. }) => {
            assert_eq!(expected.next_valid, Some(next_valid as usize), "corrupt, but the reference reads a torn tail");
            assert_eq!(offset as usize, expected.good_len);
            assert_eq!(fs::read(&path).expect("readable"), damaged, "a corrupt log was changed");
            assert!(matches!(read_log(dir), Err(StoreError::Corrupt { .. })), "read_log disagrees with open");
        }
        Err(e) => panic!("recovery failed with {e}"),
        Ok((store, recovery)) => {
            assert_eq!(expected.next_valid, None, "a corrupt log was opened (valid record at {:?})", expected.next_valid);
            assert_eq!(recovery.records, expected.records.len() as u64);
            assert_eq!(recovery.truncated_bytes, (damaged.len() - expected.good_len) as u64);
            let mut distinct = HashSet::new();
            let dups = expected.records.iter().filter(|r| !distinct.insert(r.id)).count();
            assert_eq!(recovery.duplicates, dups as u64);
            assert_eq!(store.applied(), distinct.len() as u64);
            for (i, (id, _)) in applied.iter().enumerate() {
                let (start, len) = offsets[i];
                if start + len <= first_damage {
                    assert!(store.contains(id), "order {id}, before the damage at byte {first_damage}, was lost");
                }
            }
            for r in &expected.records {
                assert!(store.contains(&r.id));
            }
            drop(store);
            let on_disk = fs::read(&path).expect("readable");
            assert_eq!(on_disk, damaged[..expected.good_len], "recovery did not cut exactly the torn tail");

            // Exactly once after recovery.
            let (mut store, again) = Store::open(dir, SyncPolicy::None).expect("a recovered store opens");
            assert_eq!((again.records, again.truncated_bytes), (expected.records.len() as u64, 0));
            let outcomes = store.commit(&originals).expect("commit after recovery");
            let mut seen = distinct.clone();
            for (o, outcome) in originals.iter().zip(outcomes) {
                assert_eq!(outcome == Outcome::Applied, seen.insert(o.id), "order {} {outcome:?} after recovery", o.id);
            }
            drop(store);
            let mut count: HashMap<OrderId, usize> = HashMap::new();
            for e in read_log(dir).expect("the log reads") {
                *count.entry(e.id).or_default() += 1;
            }
            let mut copied: HashMap<OrderId, usize> = HashMap::new();
            for r in &expected.records {
                *copied.entry(r.id).or_default() += 1;
            }
            for o in &originals {
                let want = copied.get(&o.id).copied().unwrap_or(1).max(1);
                assert_eq!(count.get(&o.id).copied(), Some(want), "order {} is in the log {:?} times", o.id, count.get(&o.id));
            }
        }
    }
});
