//! The ids a store has applied, kept as runs of consecutive seqs per sender run.
//!
//! A device numbers the orders of one run 0, 1, 2, ..., and a server stores them nearly in that order, so the set
//! of applied ids is, for each `(sender, run)`, a few ranges of consecutive seqs. Keeping the ranges instead of
//! every id makes the exactly-once set as large as the number of sender runs (and the gaps between their seqs),
//! not the number of orders: a multi-million-order drain never rehashes a table of millions of ids in the middle
//! of its measurement (a stall of a tenth of a second or more at each doubling), and each check touches a few
//! cache lines instead of a cold slot of a table far larger than the CPU's caches.
//!
//! Any pattern of ids is held exactly: seqs out of order, repeated, or far apart each cost a range of their own
//! until their neighbours arrive, which is no more memory than a hash set's entry.

use std::collections::BTreeMap;
use transport_core::OrderId;

/// A set of [`OrderId`]s.
#[derive(Debug, Default)]
pub struct AppliedIds {
    /// Per `(sender, run)`, its seqs. Randomly seeded foldhash: a peer cannot choose runs that collide.
    runs: foldhash::HashMap<(u64, u64), Seqs>,
    len: u64,
}

impl AppliedIds {
    /// Add `id`; false if it was in the set already.
    pub fn insert(&mut self, id: OrderId) -> bool {
        let inserted = self
            .runs
            .entry((id.sender, id.run))
            .or_default()
            .insert(id.seq);
        self.len += u64::from(inserted);
        inserted
    }

    /// Whether `id` is in the set.
    pub fn contains(&self, id: &OrderId) -> bool {
        self.runs
            .get(&(id.sender, id.run))
            .is_some_and(|s| s.contains(id.seq))
    }

    /// Ids in the set.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Ranges of consecutive seqs held, over every sender run (what the set's memory grows with).
    pub fn ranges(&self) -> usize {
        self.runs.values().map(|s| s.ranges.len()).sum()
    }
}

/// The seqs of one sender run: disjoint ranges, none adjacent to another (`first → last`, both included).
#[derive(Debug, Default)]
struct Seqs {
    ranges: BTreeMap<u64, u64>,
}

impl Seqs {
    fn contains(&self, seq: u64) -> bool {
        self.ranges
            .range(..=seq)
            .next_back()
            .is_some_and(|(_, &last)| seq <= last)
    }

    fn insert(&mut self, seq: u64) -> bool {
        // The range that starts right after `seq`, if any, joins whatever `seq` joins.
        let next_last = seq
            .checked_add(1)
            .and_then(|next| self.ranges.get(&next).copied());
        if let Some((_, last)) = self.ranges.range_mut(..=seq).next_back() {
            if seq <= *last {
                return false;
            }
            if *last + 1 == seq {
                // The common case: the next seq of a run extends its range.
                *last = next_last.unwrap_or(seq);
                if next_last.is_some() {
                    self.ranges.remove(&(seq + 1));
                }
                return true;
            }
        }
        if next_last.is_some() {
            self.ranges.remove(&(seq + 1));
        }
        self.ranges.insert(seq, next_last.unwrap_or(seq));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn id(sender: u64, run: u64, seq: u64) -> OrderId {
        OrderId { sender, run, seq }
    }

    #[test]
    fn consecutive_seqs_are_one_range() {
        let mut set = AppliedIds::default();
        for seq in 0..10_000 {
            assert!(set.insert(id(1, 7, seq)));
        }
        assert_eq!((set.len(), set.ranges()), (10_000, 1));
        assert!(!set.insert(id(1, 7, 5_000)));
        assert!(set.contains(&id(1, 7, 9_999)));
        assert!(!set.contains(&id(1, 7, 10_000)));
        // Another run, another sender: apart.
        assert!(!set.contains(&id(1, 8, 0)));
        assert!(!set.contains(&id(2, 7, 0)));
    }

    #[test]
    fn a_gap_filled_joins_the_ranges_on_both_sides() {
        let mut set = AppliedIds::default();
        for seq in [0, 1, 2, 4, 5, 7] {
            assert!(set.insert(id(1, 1, seq)));
        }
        assert_eq!(set.ranges(), 3);
        assert!(set.insert(id(1, 1, 3)));
        assert_eq!(set.ranges(), 2);
        assert!(set.insert(id(1, 1, 6)));
        assert_eq!(set.ranges(), 1);
        assert!((0..=7).all(|s| set.contains(&id(1, 1, s))));
        assert_eq!(set.len(), 8);
    }

    #[test]
    fn the_ends_of_the_seq_space_are_held() {
        let mut set = AppliedIds::default();
        assert!(set.insert(id(0, 0, u64::MAX)));
        assert!(!set.insert(id(0, 0, u64::MAX)));
        assert!(set.insert(id(0, 0, u64::MAX - 1)));
        assert!(set.insert(id(0, 0, 0)));
        assert_eq!((set.len(), set.ranges()), (3, 2));
        assert!(set.contains(&id(0, 0, u64::MAX)) && set.contains(&id(0, 0, 0)));
        assert!(!set.contains(&id(0, 0, 1)));
    }

    /// Against a hash set of every id, through inserts in every pattern: in order with reordering and repeats (a
    /// drain's), scattered (a hostile peer's), and near the top of the seq space.
    #[test]
    fn agrees_with_a_set_of_every_id() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut set = AppliedIds::default();
        let mut model = HashSet::new();
        let mut cursor = [0u64; 4];
        for step in 0..200_000u32 {
            let r = next();
            let (sender, run) = (r % 3, (r >> 2) % 2);
            let seq = match step % 4 {
                // Mostly in order, a little behind or ahead.
                0 | 1 => {
                    let c = &mut cursor[(sender % 2 * 2 + run) as usize];
                    *c += 1;
                    (*c + (r >> 8) % 16).saturating_sub(8)
                }
                2 => (r >> 8) % 5_000,
                _ => u64::MAX - (r >> 8) % 64,
            };
            let i = id(sender, run, seq);
            assert_eq!(set.insert(i), model.insert(i), "insert {i}");
            let probe = id(sender, run, next() % 6_000);
            assert_eq!(
                set.contains(&probe),
                model.contains(&probe),
                "contains {probe}"
            );
        }
        assert_eq!(set.len(), model.len() as u64);
        for i in &model {
            assert!(set.contains(i));
        }
    }
}
