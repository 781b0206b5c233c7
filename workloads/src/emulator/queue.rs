//! The time-ordered queue of packets waiting for their due time.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::sys::Nanos;

/// Packets ordered by due time, then by the order they were pushed (so equal due times keep arrival order).
pub(crate) struct Queue<T> {
    heap: BinaryHeap<Entry<T>>,
    next_seq: u64,
}

struct Entry<T> {
    due: Nanos,
    seq: u64,
    item: T,
}

impl<T> Queue<T> {
    pub(crate) fn new() -> Self {
        Self {
            heap: BinaryHeap::new(),
            next_seq: 0,
        }
    }

    pub(crate) fn push(&mut self, due: Nanos, item: T) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Entry { due, seq, item });
    }

    /// The earliest due time.
    pub(crate) fn next_due(&self) -> Option<Nanos> {
        self.heap.peek().map(|entry| entry.due)
    }

    /// The earliest item if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: Nanos) -> Option<T> {
        if self.next_due()? > now {
            return None;
        }
        self.heap.pop().map(|entry| entry.item)
    }
}

// BinaryHeap is a max-heap: the entry that is due first compares greatest.
impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.due, other.seq).cmp(&(self.due, self.seq))
    }
}

impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<T> Eq for Entry<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_order_then_arrival_order() {
        let mut queue = Queue::new();
        queue.push(30, "c");
        queue.push(10, "a");
        queue.push(10, "b");
        queue.push(20, "x");
        assert_eq!(queue.next_due(), Some(10));
        assert_eq!(queue.pop_due(9), None);
        assert_eq!(queue.pop_due(25), Some("a"));
        assert_eq!(queue.pop_due(25), Some("b"));
        assert_eq!(queue.pop_due(25), Some("x"));
        assert_eq!(queue.pop_due(25), None);
        assert_eq!(queue.next_due(), Some(30));
    }
}
