//! A device's unanswered order ids, kept as runs of consecutive seqs per sender run.
//!
//! A device numbers its orders 0, 1, 2, ... and the server answers them nearly in that order, so the ids a device
//! holds unanswered are, per `(sender, run)`, a few runs of consecutive seqs: one run from the oldest unanswered to
//! the newest made, cut where answers came out of order. Held as runs, taking an order in and taking its answer out
//! touch a few entries that stay in the CPU's caches, where a hash set of a drain's hundreds of thousands of ids
//! per device made every answer a miss on a cold slot of a table far larger than the caches (a quarter of the MQTT
//! generator's samples in a seed drain).
//!
//! Any pattern of ids is held exactly: an id out of order costs a run of its own until its neighbours come.

use foldhash::HashMap;
use std::collections::BTreeMap;
use transport_core::OrderId;

/// A set of [`OrderId`]s.
#[derive(Debug, Default)]
pub(super) struct IdSet {
    runs: HashMap<(u64, u64), Runs>,
    len: usize,
}

impl IdSet {
    /// Add `id`; false if it is in the set already.
    pub(super) fn insert(&mut self, id: OrderId) -> bool {
        let added = self
            .runs
            .entry((id.sender, id.run))
            .or_default()
            .add(id.seq);
        self.len += usize::from(added);
        added
    }

    /// Take `id` out; false if it was not in the set.
    pub(super) fn remove(&mut self, id: &OrderId) -> bool {
        let key = (id.sender, id.run);
        let Some(runs) = self.runs.get_mut(&key) else {
            return false;
        };
        if !runs.take(id.seq) {
            return false;
        }
        if runs.starts.is_empty() {
            self.runs.remove(&key);
        }
        self.len -= 1;
        true
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn clear(&mut self) {
        self.runs.clear();
        self.len = 0;
    }
}

/// The seqs of one sender run: runs that neither overlap nor touch, each its first seq mapped to its last.
#[derive(Debug, Default)]
struct Runs {
    starts: BTreeMap<u64, u64>,
}

impl Runs {
    /// The run holding `seq`, or the nearest run below it, as (first, last).
    fn at_or_below(&self, seq: u64) -> Option<(u64, u64)> {
        self.starts
            .range(..=seq)
            .next_back()
            .map(|(&first, &last)| (first, last))
    }

    fn add(&mut self, seq: u64) -> bool {
        let below = self.at_or_below(seq);
        if below.is_some_and(|(_, last)| seq <= last) {
            return false;
        }
        // A run starting right above `seq` is joined onto it.
        let above = seq
            .checked_add(1)
            .and_then(|next| self.starts.remove(&next));
        let last = above.unwrap_or(seq);
        match below {
            // The common case: the next seq of a run made in order extends it at its top.
            Some((first, below_last)) if below_last + 1 == seq => {
                self.starts.insert(first, last);
            }
            _ => {
                self.starts.insert(seq, last);
            }
        }
        true
    }

    fn take(&mut self, seq: u64) -> bool {
        let Some((first, last)) = self.at_or_below(seq) else {
            return false;
        };
        if seq > last {
            return false;
        }
        // The common case: the oldest seq of the oldest run, answered first, moves its start up.
        if seq == first {
            self.starts.remove(&first);
        } else {
            self.starts.insert(first, seq - 1);
        }
        if seq < last {
            self.starts.insert(seq + 1, last);
        }
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
    fn a_backlog_made_in_order_and_answered_in_order_is_one_run() {
        let mut set = IdSet::default();
        for seq in 0..10_000 {
            assert!(set.insert(id(1, 1, seq)));
        }
        assert!(!set.insert(id(1, 1, 77)));
        assert_eq!((set.len(), set.runs[&(1, 1)].starts.len()), (10_000, 1));
        for seq in 0..9_999 {
            assert!(set.remove(&id(1, 1, seq)));
            assert_eq!(set.runs[&(1, 1)].starts.len(), 1);
        }
        assert!(!set.remove(&id(1, 1, 0)), "taken once");
        assert!(!set.remove(&id(1, 2, 9_999)), "another run");
        assert!(!set.remove(&id(2, 1, 9_999)), "another sender");
        assert!(set.remove(&id(1, 1, 9_999)));
        assert!(set.is_empty() && set.runs.is_empty());
    }

    #[test]
    fn the_ends_of_the_seq_space_are_held() {
        let mut set = IdSet::default();
        for seq in [u64::MAX, 0, u64::MAX - 1, 1] {
            assert!(set.insert(id(0, 0, seq)));
        }
        assert!(!set.insert(id(0, 0, u64::MAX)));
        assert_eq!(set.runs[&(0, 0)].starts.len(), 2);
        for seq in [u64::MAX, 0, u64::MAX - 1, 1] {
            assert!(set.remove(&id(0, 0, seq)), "{seq}");
        }
        assert!(set.is_empty());
    }

    #[test]
    fn any_pattern_of_ids_is_held_as_a_hash_set_holds_it() {
        // Seqs in order, out of order, repeated and far apart, over three sender runs, against a hash set.
        let mut set = IdSet::default();
        let mut model = HashSet::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let sender = x % 3;
            let seq = match x % 5 {
                0 => step / 2,
                1 => x >> 40,
                2 => 1_000 + (x >> 56),
                _ => (step / 2).saturating_sub(x % 200),
            };
            let i = id(sender, 1, seq);
            if x.is_multiple_of(2) {
                assert_eq!(set.insert(i), model.insert(i), "insert {i:?}");
            } else {
                assert_eq!(set.remove(&i), model.remove(&i), "remove {i:?}");
            }
            assert_eq!(set.len(), model.len());
        }
        for i in model.iter() {
            assert!(set.remove(i), "{i:?}");
        }
        assert!(set.is_empty() && set.runs.is_empty());
    }
}
