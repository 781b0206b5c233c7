//! A bounded map for the receiver's derived keys (HPKE sessions, link keys, failed setups).
//!
//! Everything the receiver caches can be derived again, so forgetting is only a cost; what matters is that no input
//! can make a cache grow without bound. Two generations approximate least-recently-used at O(1): entries go into the
//! young generation; when it is full, it becomes the old one and the old one is dropped; an entry found in the old
//! generation moves back to the young one. An entry used at least once per half-capacity insertions is never
//! evicted, and the map never holds more than its capacity.
//!
//! The receiver's maps (these, the allow-list's key ids, the answer queues) hash with randomly seeded foldhash, not
//! std's SipHash: a record costs several lookups, and SipHash was a quarter of the receiver's instructions per
//! order. The seed is unknown outside the process, so a sender cannot choose keys that land together; and what an
//! unauthenticated packet can insert at all (a failed setup, two X25519 each) goes into a bounded map.

use foldhash::{HashMap, HashMapExt};
use std::borrow::Borrow;
use std::hash::Hash;

/// A map of at most `capacity` entries that forgets the least recently used first (approximately).
#[derive(Debug)]
pub struct Bounded<K, V> {
    young: HashMap<K, V>,
    old: HashMap<K, V>,
    generation: usize,
}

impl<K: Hash + Eq + Clone, V> Bounded<K, V> {
    /// A map holding at most `capacity` entries (at least 2).
    pub fn new(capacity: usize) -> Bounded<K, V> {
        Bounded {
            young: HashMap::new(),
            old: HashMap::new(),
            generation: (capacity / 2).max(1),
        }
    }

    /// The value of `key`, marking it used.
    pub fn get<Q>(&mut self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if !self.young.contains_key(key) {
            let (k, v) = self.old.remove_entry(key)?;
            self.insert_young(k, v);
        }
        self.young.get(key)
    }

    /// The value of `key` to change, marking it used.
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if !self.young.contains_key(key) {
            let (k, v) = self.old.remove_entry(key)?;
            self.insert_young(k, v);
        }
        self.young.get_mut(key)
    }

    /// The value of `key`, inserted from `make` if missing, marking it used.
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        if !self.young.contains_key(&key) {
            let value = self.old.remove(&key).unwrap_or_else(make);
            self.insert_young(key.clone(), value);
        }
        self.young.get_mut(&key).expect("inserted above")
    }

    /// Insert or replace the value of `key`.
    pub fn insert(&mut self, key: K, value: V) {
        self.old.remove(&key);
        self.insert_young(key, value);
    }

    /// Forget `key`.
    pub fn remove<Q>(&mut self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.young.remove(key);
        self.old.remove(key);
    }

    fn insert_young(&mut self, key: K, value: V) {
        if self.young.len() >= self.generation && !self.young.contains_key(&key) {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(key, value);
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_holds_more_than_its_capacity_and_keeps_what_is_used() {
        let mut m = Bounded::new(100);
        m.insert(0u32, 0u32);
        for i in 1..10_000u32 {
            m.insert(i, i);
            // Key 0 is used all the time: it stays.
            assert_eq!(m.get(&0), Some(&0), "after {i} insertions");
            assert!(m.len() <= 100, "{}", m.len());
        }
        // Keys not used for a generation are gone; recent ones are there.
        assert_eq!(m.get(&5), None);
        assert_eq!(m.get(&9_999), Some(&9_999));
        m.remove(&9_999);
        assert_eq!(m.get(&9_999), None);
    }

    #[test]
    fn replacing_a_key_keeps_one_entry() {
        let mut m = Bounded::new(4);
        for v in 0..10 {
            m.insert("k", v);
        }
        assert_eq!((m.len(), m.get("k")), (1, Some(&9)));
    }
}
