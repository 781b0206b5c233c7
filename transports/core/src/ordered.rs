//! Keys in order, each with a value: a sorted ring, for tables whose keys mostly arrive in order and leave oldest
//! first (frames or orders in flight, numbered as they are sent and mostly answered in that order).
//!
//! A key larger than every other (the next one sent) goes in at the back and the oldest comes out at the front, both
//! without moving the rest; a lookup checks the front, then searches by halves; only a key answered out of order moves
//! its neighbours (at most a window's worth of small pairs). Against a B-tree it does the same in a fraction of the
//! time (the B-tree's search and rebalancing were a sixth of a Pure device's time in a drain), and against a hash
//! table it touches memory that stays in cache: the front the last answer left, the back the last send wrote, where a
//! hash table's slot of an answered key was a cache miss written a round trip earlier.

use std::collections::VecDeque;
use std::ops::{Bound, RangeBounds};

/// Keys in order, each with its value (see the module docs).
#[derive(Debug)]
pub struct Ordered<K, V = u32> {
    keys: VecDeque<(K, V)>,
}

impl<K, V> Default for Ordered<K, V> {
    fn default() -> Self {
        Ordered {
            keys: VecDeque::new(),
        }
    }
}

impl<K: Ord + Copy, V: Copy> Ordered<K, V> {
    fn find(&self, key: &K) -> Result<usize, usize> {
        self.keys.binary_search_by(|(k, _)| k.cmp(key))
    }

    /// The value of `key`.
    pub fn get(&self, key: &K) -> Option<V> {
        self.position(key).map(|(_, value)| value)
    }

    /// Where `key` is in the ring, and its value.
    #[inline]
    pub fn position(&self, key: &K) -> Option<(usize, V)> {
        if self.keys.back().is_none_or(|(last, _)| last < key) {
            return None;
        }
        // Keys mostly leave oldest first: the front is the likeliest, and needs no search.
        match self.keys.front() {
            Some((first, value)) if first == key => Some((0, *value)),
            _ => self.find(key).ok().map(|i| (i, self.keys[i].1)),
        }
    }

    /// Take out the key at `at` (a [`Ordered::position`]).
    pub fn remove_at(&mut self, at: usize) {
        if at == 0 {
            self.keys.pop_front();
        } else {
            self.keys.remove(at);
        }
    }

    /// Add `key` with `value` (or give it `value` if it is there).
    pub fn insert(&mut self, key: K, value: V) {
        if self.keys.back().is_none_or(|(last, _)| *last < key) {
            self.keys.push_back((key, value));
            return;
        }
        match self.find(&key) {
            Ok(i) => self.keys[i].1 = value,
            Err(i) => self.keys.insert(i, (key, value)),
        }
    }

    /// Take `key` out; its value.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let (at, value) = self.position(key)?;
        self.remove_at(at);
        Some(value)
    }

    /// The key at `at` in order (0: the smallest), with its value.
    pub fn get_at(&self, at: usize) -> Option<&(K, V)> {
        self.keys.get(at)
    }

    /// Every key with its value, in order.
    pub fn iter(&self) -> impl Iterator<Item = &(K, V)> {
        self.keys.iter()
    }

    /// The first key in `range`.
    pub fn first_in(&self, range: impl RangeBounds<K>) -> Option<K> {
        let start = match range.start_bound() {
            Bound::Included(s) => self.keys.partition_point(|(k, _)| k < s),
            Bound::Excluded(s) => self.keys.partition_point(|(k, _)| k <= s),
            Bound::Unbounded => 0,
        };
        let &(key, _) = self.keys.get(start)?;
        range.contains(&key).then_some(key)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn clear(&mut self) {
        self.keys.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The ordered index against a B-tree, through inserts at the back and in the middle, removes at the front and
    /// in the middle, lookups of present and absent keys, and ranges.
    #[test]
    fn the_ordered_index_keeps_what_a_btree_keeps() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut random = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut ordered = Ordered::default();
        let mut model = BTreeMap::new();
        let mut next = 0u64;
        for step in 0..20_000u32 {
            match random(10) {
                // Mostly the next number, as a sender numbers its frames.
                0..=3 => {
                    next += 1 + random(2);
                    ordered.insert(next, step);
                    model.insert(next, step);
                }
                // A number below the newest (re-numbered or reordered).
                4 => {
                    let k = random(next + 1);
                    model.insert(k, step);
                    ordered.insert(k, step);
                }
                // The oldest answered, or one out of order.
                5 | 6 => {
                    let k = *model.keys().next().unwrap_or(&0);
                    assert_eq!(ordered.remove(&k), model.remove(&k));
                }
                7 => {
                    let k = random(next + 2);
                    assert_eq!(ordered.remove(&k), model.remove(&k));
                }
                _ => {
                    let k = random(next + 2);
                    assert_eq!(ordered.get(&k), model.get(&k).copied());
                    let (a, b) = (k, k + random(4));
                    assert_eq!(
                        ordered.first_in(a..b),
                        model.range(a..b).next().map(|(k, _)| *k)
                    );
                    assert_eq!(
                        ordered.first_in(a..=b),
                        model.range(a..=b).next().map(|(k, _)| *k)
                    );
                    assert_eq!(
                        ordered.first_in(a..),
                        model.range(a..).next().map(|(k, _)| *k)
                    );
                    assert_eq!(ordered.first_in(..), model.keys().next().copied());
                }
            }
            assert_eq!(ordered.len(), model.len());
            assert_eq!(ordered.is_empty(), model.is_empty());
        }
        let all: Vec<(u64, u32)> = ordered.iter().copied().collect();
        assert_eq!(all, model.into_iter().collect::<Vec<_>>());
    }
}
