//! One device's unanswered orders, with every operation the device's loop does per order in constant time
//! (amortised): a device may hold hundreds of thousands of orders (a drain's backlog), and a scan of them per answer
//! would make the load generator, not the server, the thing measured.

use super::ids::IdSet;
use std::collections::VecDeque;
use tokio::time::Instant;
use transport_core::ordered::Ordered;
use transport_core::{Order, OrderId};

/// An order sent at least once and not answered.
struct Entry {
    order: Order,
    /// Its place in the order the device was given orders: re-sending on a new connection keeps that order.
    made: u64,
    /// The connection generation it was last sent on.
    sent_on: u64,
    /// When it was last sent (`None`: its connection dropped).
    sent_at: Option<Instant>,
    /// Whether its last send was a second one or later (on a later connection than its first).
    again: bool,
}

/// Unanswered orders: sent on the current connection or waiting to be.
///
/// Most of a deep backlog has never been sent, so those orders wait in a queue in the order made, and the set of
/// every unanswered id (to take each order once) is kept as runs of consecutive seqs ([`IdSet`]). The orders sent
/// (at most the window, and what a dropped connection left) wait in a ring in the order of their latest send, found
/// by id through a sorted ring of send numbers ([`Ordered`]). Answers come back nearly in the order sent, so an
/// answer finds its send number at the front of one and its order near the front of the other, next to the ones
/// answered before it; a hash table of the orders made every answer a miss on a slot written a round trip earlier.
#[derive(Default)]
pub(super) struct Orders {
    /// Every unanswered order's id, sent or not.
    ids: IdSet,
    /// Orders never sent, in the order made; every one was made after every order in `sent`.
    fresh: VecDeque<(u64, Order)>,
    /// Orders sent at least once and not answered, in the order of their latest send: slot `i` holds send number
    /// `first + i`, `None` once its order was answered or sent again.
    sent: VecDeque<Option<Entry>>,
    /// The send number of `sent`'s first slot.
    first: u64,
    /// The send number of each order in `sent`, by id in order: a device's ids mostly grow as it sends, and its
    /// answers mostly come oldest first, so a send adds at the back and an answer takes from the front.
    at: Ordered<OrderId, u64>,
    /// Every slot before this send number is empty or its connection dropped (where [`Orders::oldest_sent`]
    /// looks from).
    awaited: u64,
    made: u64,
    /// The generation [`Orders::again`] is for.
    generation: u64,
    /// Orders sent on an earlier connection, to send again on `generation` before any fresh one, in the order made
    /// (ids no longer in `sent` are skipped).
    again: VecDeque<OrderId>,
    /// How many orders are sent on `generation` and not answered: at most the window given to
    /// [`Orders::send_unsent`].
    in_flight: usize,
}

impl Orders {
    /// A new order, to be sent on the current connection; `false` if an order with its id is unanswered already
    /// (one order, sent and answered once).
    pub(super) fn push(&mut self, order: Order) -> bool {
        if !self.ids.insert(order.id) {
            return false;
        }
        self.made += 1;
        self.fresh.push_back((self.made, order));
        true
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// How many orders are in flight on the current connection (sent on it and not answered).
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Forget every order; how many there were.
    pub(super) fn clear(&mut self) -> usize {
        let n = self.ids.len();
        self.ids.clear();
        self.fresh.clear();
        self.sent.clear();
        self.first = 0;
        self.at.clear();
        self.awaited = 0;
        self.again.clear();
        self.in_flight = 0;
        n
    }

    /// Where send number `n` is in the ring.
    fn index(&self, n: u64) -> usize {
        usize::try_from(n - self.first).expect("a slot of the ring")
    }

    /// Take order `id`'s entry out of the ring (its slot left empty).
    fn take(&mut self, id: &OrderId) -> Option<Entry> {
        let n = self.at.remove(id)?;
        let i = self.index(n);
        let e = self.sent[i].take();
        debug_assert!(e.is_some(), "the index points at a full slot");
        e
    }

    /// Put `entry` at the ring's back: its latest send.
    fn put(&mut self, entry: Entry) {
        let n = self.first + self.sent.len() as u64;
        self.at.insert(entry.order.id, n);
        self.sent.push_back(Some(entry));
    }

    /// Drop the ring's empty slots at the front, and close up its gaps once most of it is empty (an order left
    /// unanswered while many after it are answered would otherwise hold a ring as long as all of them).
    fn trim(&mut self) {
        while matches!(self.sent.front(), Some(None)) {
            self.sent.pop_front();
            self.first += 1;
        }
        if self.sent.len() > 2 * self.at.len() + 64 {
            self.sent.retain(Option::is_some);
            for (i, e) in self.sent.iter().flatten().enumerate() {
                self.at.insert(e.order.id, self.first + i as u64);
            }
            self.awaited = self.first;
        }
    }

    /// Answered: forget it. Whether it was here (an order is answered once).
    pub(super) fn remove(&mut self, id: &OrderId) -> bool {
        if !self.ids.remove(id) {
            return false;
        }
        match self.take(id) {
            Some(e) => {
                if e.sent_on == self.generation && e.sent_at.is_some() {
                    self.in_flight -= 1;
                }
                self.trim();
            }
            // Never sent: a device only hears answers to orders it sent, so this is not on its path.
            None => self.fresh.retain(|(_, o)| o.id != *id),
        }
        true
    }

    /// Send orders not yet sent on connection `generation`, in the order they were made, until `window` of them
    /// are in flight on it, noting when: an order's answer is awaited from the moment it is sent, never while it
    /// waits for room. The orders to send now, in that order, each with whether it had been sent before (on an
    /// earlier connection).
    pub(super) fn send_unsent(
        &mut self,
        generation: u64,
        window: usize,
        now: Instant,
    ) -> impl Iterator<Item = (&Order, bool)> {
        if generation != self.generation {
            // A new connection: everything sent before goes again, in the order it was made, then the fresh ones.
            self.generation = generation;
            self.in_flight = 0;
            let mut all: Vec<(u64, OrderId)> = self
                .sent
                .iter()
                .flatten()
                .filter(|e| e.sent_on != generation)
                .map(|e| (e.made, e.order.id))
                .collect();
            all.sort_unstable();
            self.again = all.into_iter().map(|(_, id)| id).collect();
        }
        let mut sent = 0;
        while self.in_flight < window {
            let mut entry = if let Some(id) = self.again.pop_front() {
                let Some(n) = self.at.get(&id) else {
                    continue; // answered meanwhile
                };
                if self.sent[self.index(n)]
                    .as_ref()
                    .is_some_and(|e| e.sent_on == generation)
                {
                    continue;
                }
                let mut entry = self.take(&id).expect("indexed");
                entry.again = true;
                entry
            } else if let Some((made, order)) = self.fresh.pop_front() {
                Entry {
                    order,
                    made,
                    sent_on: 0,
                    sent_at: None,
                    again: false,
                }
            } else {
                break;
            };
            entry.sent_on = generation;
            entry.sent_at = Some(now);
            self.in_flight += 1;
            self.put(entry);
            sent += 1;
        }
        // The orders sent now are the ring's last (closing up its gaps keeps them there, in order).
        self.trim();
        self.sent.range(self.sent.len() - sent..).map(|e| {
            let e = e.as_ref().expect("sent now");
            (&e.order, e.again)
        })
    }

    /// When the longest-waiting order sent on a live connection was sent.
    pub(super) fn oldest_sent(&mut self) -> Option<Instant> {
        self.awaited = self.awaited.max(self.first);
        let end = self.first + self.sent.len() as u64;
        while self.awaited < end {
            if let Some(at) = self.sent[self.index(self.awaited)]
                .as_ref()
                .and_then(|e| e.sent_at)
            {
                return Some(at);
            }
            self.awaited += 1;
        }
        None
    }

    /// The connection dropped: nothing is waiting for an answer on it any more.
    pub(super) fn connection_dropped(&mut self) {
        for e in self.sent.iter_mut().flatten() {
            e.sent_at = None;
        }
        self.awaited = self.first + self.sent.len() as u64;
        self.in_flight = 0;
    }

    /// The ring's and the index's promises, checked.
    #[cfg(test)]
    fn check(&self) {
        let full = self.sent.iter().flatten().count();
        assert_eq!(full, self.at.len(), "one index entry per full slot");
        for &(id, n) in self.at.iter() {
            let e = self.sent[self.index(n)]
                .as_ref()
                .expect("indexed slot full");
            assert_eq!(e.order.id, id);
        }
        assert!(
            !matches!(self.sent.front(), Some(None)),
            "no empty slot first"
        );
        assert!(self.sent.len() <= 2 * self.at.len() + 64, "gaps closed up");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn order(seq: u64) -> Order {
        Order {
            id: OrderId {
                sender: 1,
                run: 1,
                seq,
            },
            made_us: 0,
            payload: vec![],
        }
    }

    fn sent(o: &mut Orders, generation: u64, now: Instant) -> Vec<(u64, bool)> {
        sent_within(o, generation, usize::MAX, now)
    }

    fn sent_within(
        o: &mut Orders,
        generation: u64,
        window: usize,
        now: Instant,
    ) -> Vec<(u64, bool)> {
        o.send_unsent(generation, window, now)
            .map(|(order, again)| (order.id.seq, again))
            .collect()
    }

    #[test]
    fn orders_go_once_per_connection_in_the_order_made_and_again_on_a_new_one() {
        let t0 = Instant::now();
        let mut o = Orders::default();
        for seq in 0..4 {
            o.push(order(seq));
        }
        assert_eq!(
            sent(&mut o, 1, t0),
            [(0, false), (1, false), (2, false), (3, false)]
        );
        assert!(sent(&mut o, 1, t0).is_empty(), "sent once per connection");
        assert!(o.remove(&order(1).id));
        assert!(!o.remove(&order(1).id), "answered once");
        o.push(order(4));
        assert_eq!(sent(&mut o, 1, t0), [(4, false)]);
        o.connection_dropped();
        assert_eq!(o.oldest_sent(), None);
        assert_eq!(
            sent(&mut o, 2, t0),
            [(0, true), (2, true), (3, true), (4, true)]
        );
        assert_eq!(o.clear(), 4);
        assert!(o.is_empty());
    }

    #[test]
    fn answers_in_any_order_take_each_order_once() {
        let t0 = Instant::now();
        let mut o = Orders::default();
        for seq in 0..1_000 {
            assert!(o.push(order(seq)));
        }
        assert_eq!(sent_within(&mut o, 1, 100, t0).len(), 100);
        // Answered last first, as a connection's streams may answer.
        for seq in (0..100).rev() {
            assert!(o.remove(&order(seq).id));
            assert!(!o.remove(&order(seq).id), "answered once");
            assert!(!o.push(order(seq + 100)), "{} is unanswered", seq + 100);
        }
        assert_eq!(sent_within(&mut o, 1, 100, t0).len(), 100);
        assert_eq!(o.clear(), 900);
    }

    #[test]
    fn every_order_is_unanswered_until_answered_once_whatever_happens() {
        // Orders pushed, sent, answered (in and out of order, twice, never sent) and connections dropped at random,
        // against a set of the unanswered ids.
        let t0 = Instant::now();
        let mut o = Orders::default();
        let mut model = std::collections::BTreeSet::new();
        let mut generation = 1;
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..50_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let seq = (x >> 20) % 400;
            match x % 7 {
                0..=2 => assert_eq!(o.push(order(seq)), model.insert(seq), "push {seq}"),
                3 | 4 => assert_eq!(o.remove(&order(seq).id), model.remove(&seq), "answer {seq}"),
                5 => {
                    let window = 1 + (x >> 40) as usize % 50;
                    for (s, _) in sent_within(&mut o, generation, window, t0) {
                        assert!(model.contains(&s), "{s} sent after its answer");
                    }
                }
                _ if x.is_multiple_of(5) => {
                    o.connection_dropped();
                    generation += 1;
                }
                _ => {}
            }
            assert_eq!(o.is_empty(), model.is_empty());
            o.check();
        }
        // Everything unanswered goes on a new connection, each once.
        generation += 1;
        let mut all: Vec<u64> = sent(&mut o, generation, t0)
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        all.sort_unstable();
        assert_eq!(all, model.iter().copied().collect::<Vec<_>>());
        assert_eq!(o.clear(), model.len());
    }

    #[test]
    fn the_oldest_send_skips_answered_orders() {
        let t0 = Instant::now();
        let mut o = Orders::default();
        o.push(order(0));
        sent(&mut o, 1, t0);
        o.push(order(1));
        sent(&mut o, 1, t0 + Duration::from_millis(10));
        assert_eq!(o.oldest_sent(), Some(t0));
        o.remove(&order(0).id);
        assert_eq!(o.oldest_sent(), Some(t0 + Duration::from_millis(10)));
        o.remove(&order(1).id);
        assert_eq!(o.oldest_sent(), None);
    }

    #[test]
    fn no_more_than_the_window_is_in_flight_and_each_answer_makes_room_for_one() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(500);
        let mut o = Orders::default();
        for seq in 0..5 {
            o.push(order(seq));
        }
        assert_eq!(sent_within(&mut o, 1, 2, t0), [(0, false), (1, false)]);
        assert!(
            sent_within(&mut o, 1, 2, t0).is_empty(),
            "the window is full"
        );
        assert!(o.remove(&order(0).id));
        // The next order's answer is awaited from when it went, not from when it was made.
        assert_eq!(sent_within(&mut o, 1, 2, t1), [(2, false)]);
        o.remove(&order(1).id);
        assert_eq!(o.oldest_sent(), Some(t1));
        // A connection dropped: the window is empty again, and the orders go again in the order made.
        o.connection_dropped();
        assert_eq!(sent_within(&mut o, 2, 2, t1), [(2, true), (3, false)]);
        // A late answer from the old connection to an order not in flight on this one leaves the window as it is.
        o.push(order(5));
        assert!(sent_within(&mut o, 2, 2, t1).is_empty());
        assert!(o.remove(&order(4).id));
        assert!(
            sent_within(&mut o, 2, 2, t1).is_empty(),
            "order 4 was never in flight"
        );
        assert!(o.remove(&order(3).id));
        assert_eq!(sent_within(&mut o, 2, 2, t1), [(5, false)]);
    }

    #[test]
    fn an_order_left_unanswered_holds_neither_its_place_nor_a_long_ring() {
        // One order is never answered while a hundred thousand sent after it are, in and out of order.
        let t0 = Instant::now();
        let mut o = Orders::default();
        o.push(order(0));
        sent(&mut o, 1, t0);
        for seq in 1..=100_000u64 {
            o.push(order(seq));
            sent(&mut o, 1, t0 + Duration::from_micros(seq));
            let answer = if seq % 3 == 0 { seq - 1 } else { seq };
            if answer > 0 && seq % 3 != 2 {
                assert!(o.remove(&order(answer).id), "{answer}");
            }
            if seq % 3 == 0 {
                assert!(o.remove(&order(seq).id), "{seq}");
            }
            o.check();
            assert_eq!(o.oldest_sent(), Some(t0), "order 0 is still awaited");
        }
        assert_eq!(o.in_flight(), 1);
        assert!(o.remove(&order(0).id));
        assert_eq!(o.oldest_sent(), None);
        assert!(o.is_empty());
        o.check();
    }
}
