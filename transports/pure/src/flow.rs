//! What either end of a link needs to send frames reliably, sans-IO: the adaptive re-send timer and congestion window
//! ([`Flow`]), the frames in flight with their deadlines ([`Flight`]), and the window that tells a number seen
//! before from a new one ([`ReplayWindow`]).
//!
//! A device uses them for the records it sends (orders, subscribes, publishes); the receiver uses the same ones for
//! the QoS 1 deliveries it sends each subscriber, so both directions re-send on the same timer.
//!
//! The timer follows RFC 6298: smoothed round trip plus four deviations, samples only from frames answered at the
//! first try (Karn's rule), never below the initial timeout, doubled on every expiry up to the maximum. The window
//! behaves as TCP's congestion window: halved when a timer expires (never below [`MIN_WINDOW`]), grown by one per
//! answer, never above the configured window.

use std::collections::VecDeque;
use std::ops::RangeBounds;
use std::time::{Duration, Instant};
use transport_core::ordered::Ordered;

/// The congestion window never shrinks below this many frames.
pub const MIN_WINDOW: f64 = 2.0;

/// How far numbers in flight may spread: a sender never numbers a frame [`REPLAY_WINDOW`] or more past the oldest
/// one still unanswered, so that every frame it may still re-send lies inside the peer's [`ReplayWindow`].
pub const REPLAY_WINDOW: u64 = 1024;

/// How one end paces what it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowConfig {
    /// Frames in flight at most.
    pub window: usize,
    /// The first re-send waits this long.
    pub initial_rto: Duration,
    /// Re-sends wait at most this long.
    pub max_rto: Duration,
}

impl Default for FlowConfig {
    /// The suite's defaults: a window of up to 256 frames, re-sends after 200 ms growing to 1 s.
    fn default() -> FlowConfig {
        FlowConfig {
            window: 256,
            initial_rto: Duration::from_millis(200),
            max_rto: Duration::from_secs(1),
        }
    }
}

/// The re-send timer and congestion window of one path.
#[derive(Debug, Clone)]
pub struct Flow {
    config: FlowConfig,
    /// Smoothed round trip and its deviation, once measured.
    srtt: Option<(Duration, Duration)>,
    /// The re-send timeout for new frames: from the RTT, doubled by every expiry until a new sample.
    rto: Duration,
    /// Frames allowed in flight now.
    cwnd: f64,
    /// The same as a whole number of frames (at least one), kept beside it: the window is asked for every frame that
    /// goes in flight and changes only when one is answered or a timer expires.
    allowed: usize,
}

impl Flow {
    /// A path with no sample yet: the initial timeout and the full window.
    pub fn new(config: FlowConfig) -> Flow {
        let mut flow = Flow {
            config,
            srtt: None,
            rto: config.initial_rto,
            cwnd: 0.0,
            allowed: 0,
        };
        flow.set_window(config.window as f64);
        flow
    }

    fn set_window(&mut self, cwnd: f64) {
        self.cwnd = cwnd;
        self.allowed = (cwnd as usize).max(1);
    }

    /// The configuration.
    pub fn config(&self) -> &FlowConfig {
        &self.config
    }

    /// The re-send timeout for a frame sent now.
    pub fn rto(&self) -> Duration {
        self.rto
    }

    /// Whether one more frame may go in flight when `in_flight` are.
    pub fn room(&self, in_flight: usize) -> bool {
        in_flight < self.allowed
    }

    /// How many more frames may go in flight when `in_flight` are.
    pub fn room_for(&self, in_flight: usize) -> usize {
        self.allowed.saturating_sub(in_flight)
    }

    /// A frame was answered; `rtt` is its round trip if it was sent only once.
    pub fn answered(&mut self, rtt: Option<Duration>) {
        if let Some(rtt) = rtt {
            let (srtt, var) = match self.srtt {
                None => (rtt, rtt / 2),
                Some((srtt, var)) => {
                    let diff = srtt.abs_diff(rtt);
                    ((srtt * 7 + rtt) / 8, (var * 3 + diff) / 4)
                }
            };
            self.srtt = Some((srtt, var));
            self.rto = (srtt + var * 4).clamp(self.config.initial_rto, self.config.max_rto);
        }
        self.set_window((self.cwnd + 1.0).min(self.config.window as f64));
    }

    /// `count` frames were answered together (one answer datagram); `rtt` is the round trip of one of them sent only
    /// once, if any. One sample per answer, as TCP takes one per acknowledgement: ten samples of one datagram's
    /// round trip would move the average ten steps on what is one measurement. The window grows by `count`.
    pub fn answered_many(&mut self, count: usize, rtt: Option<Duration>) {
        if count == 0 {
            return;
        }
        self.answered(rtt);
        self.set_window((self.cwnd + (count - 1) as f64).min(self.config.window as f64));
    }

    /// Timers expired: back the timer off (RFC 6298, 5.5) until a frame answered at the first try measures the
    /// round trip again, so frames sent meanwhile do not time out against a queue they cannot beat; halve the window.
    pub fn expired(&mut self) {
        self.rto = (self.rto * 2).min(self.config.max_rto);
        self.set_window((self.cwnd / 2.0).max(MIN_WINDOW));
    }
}

/// One frame in flight.
///
/// Its times are counted from the flight's epoch in whole nanoseconds (its timeout in microseconds) rather than
/// kept as `Instant`s and a `Duration` (48 bytes): with a device's order, the entry fits two cache lines, aligned
/// so it never straddles a third (it took three or four). An answer reads it a round trip after it was written,
/// when it has left the caches: those reads were about a fifth of a device's time in a drain.
#[derive(Debug)]
#[repr(align(64))]
pub struct Entry<K, T> {
    /// Its key (a slot's entry is checked against the key that named it).
    key: K,
    /// What the caller keeps with it (the item and its sealed frame).
    pub item: T,
    /// When it was first sent ([`NOT_SENT`]: not yet).
    first_sent: u64,
    /// When its answer is due (once sent).
    deadline: u64,
    /// Its re-send timeout, doubled by every expiry.
    rto_us: u32,
    resent: bool,
    /// Waiting in the ready queue to be sent (again).
    queued: bool,
}

/// [`Entry::first_sent`] of a frame not sent yet.
const NOT_SENT: u64 = u64::MAX;

/// A re-send timeout in whole microseconds (at most about 71 minutes).
fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// Frames in flight, by key (ordered: the oldest first), and the queue of those to send (again).
///
/// The entries live in a slab and the index holds only their keys and slots, in order ([`Ordered`]): frames go in
/// flight in the order they are numbered and are mostly answered oldest first.
#[derive(Debug)]
pub struct Flight<K, T> {
    index: Ordered<K>,
    slots: Vec<Option<Entry<K, T>>>,
    /// Slots free for reuse.
    free: Vec<u32>,
    /// Frames to send (again), with their slots: sending looks nothing up in the map.
    ready: VecDeque<(K, u32)>,
    /// At or before the earliest deadline of a frame sent and unanswered: lowered as frames are sent, left as it is
    /// when one is answered, set exactly by [`Flight::handle_timeout`]. Scanning every frame in flight for the
    /// earliest deadline each time a device asks was a visit of its whole window per datagram it took.
    next_deadline: Option<u64>,
    /// What the entries' times count from: the time of the first frame put in flight.
    epoch: Option<Instant>,
    /// The last time converted, and what it came to: the frames of one datagram are all sent at one `now`.
    last: Option<(Instant, u64)>,
}

/// When a frame was sent, as [`Flight::remove_with`] gives it: ordered as the times are; its round trip to a later
/// time is [`Flight::round_trip`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Sent(u64);

/// Where a frame in flight is kept: valid until it is removed ([`Flight::next_ready_slot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(u32);

impl<K: Ord + Copy, T> Default for Flight<K, T> {
    fn default() -> Self {
        Flight {
            index: Ordered::default(),
            slots: Vec::new(),
            free: Vec::new(),
            ready: VecDeque::new(),
            next_deadline: None,
            epoch: None,
            last: None,
        }
    }
}

impl<K: Ord + Copy, T> Flight<K, T> {
    /// `t` in nanoseconds since the epoch (a time before it counts as the epoch).
    fn since_epoch(&mut self, t: Instant) -> u64 {
        match self.last {
            Some((last, ns)) if last == t => ns,
            _ => {
                let epoch = self
                    .epoch
                    .expect("set by the first insert, before any time is kept");
                let ns = u64::try_from(t.saturating_duration_since(epoch).as_nanos())
                    .unwrap_or(NOT_SENT - 1);
                self.last = Some((t, ns));
                ns
            }
        }
    }

    /// The round trip of a frame [`Flight::remove_with`] said was sent at `sent`, answered at `now`.
    pub fn round_trip(&mut self, now: Instant, sent: Sent) -> Duration {
        Duration::from_nanos(self.since_epoch(now).saturating_sub(sent.0))
    }

    /// The time `ns` nanoseconds after the epoch.
    fn at(&self, ns: u64) -> Instant {
        self.epoch
            .expect("set by the first insert, before any time is kept")
            + Duration::from_nanos(ns)
    }

    fn entry(&self, key: &K) -> Option<&Entry<K, T>> {
        let slot = self.index.get(key)?;
        self.slots[slot as usize].as_ref()
    }

    fn entry_mut(&mut self, key: &K) -> Option<&mut Entry<K, T>> {
        let slot = self.index.get(key)?;
        self.slots[slot as usize].as_mut()
    }

    fn entries(&self) -> impl Iterator<Item = (&K, &Entry<K, T>)> {
        self.index
            .iter()
            .filter_map(|(k, slot)| self.slots[*slot as usize].as_ref().map(|e| (k, e)))
    }

    fn take(&mut self, key: &K) -> Option<Entry<K, T>> {
        let slot = self.index.remove(key)?;
        let entry = self.slots[slot as usize].take();
        self.release(slot);
        entry
    }

    /// Slot `slot` is empty now: reuse it, or (nothing in flight) let the slab go.
    fn release(&mut self, slot: u32) {
        if self.index.is_empty() {
            // Nothing in flight: an idle link keeps no room for the burst it had.
            if self.slots.capacity() > 64 {
                self.slots = Vec::new();
                self.free = Vec::new();
            } else {
                self.slots.clear();
                self.free.clear();
            }
        } else {
            self.free.push(slot);
        }
    }

    /// Put a frame in flight, ready to be sent, with the re-send timeout `rto`. A frame already in flight under
    /// `key` is replaced.
    pub fn insert(&mut self, now: Instant, key: K, item: T, rto: Duration) {
        self.epoch.get_or_insert(now);
        let entry = Entry {
            key,
            item,
            first_sent: NOT_SENT,
            // Set when the frame is sent: a queued frame has no deadline.
            deadline: 0,
            rto_us: micros(rto),
            resent: false,
            queued: true,
        };
        let slot = if let Some(slot) = self.index.get(&key) {
            self.slots[slot as usize] = Some(entry);
            slot
        } else {
            let slot = match self.free.pop() {
                Some(slot) => {
                    self.slots[slot as usize] = Some(entry);
                    slot
                }
                None => {
                    self.slots.push(Some(entry));
                    (self.slots.len() - 1) as u32
                }
            };
            self.index.insert(key, slot);
            slot
        };
        self.ready.push_back((key, slot));
    }

    /// Frames in flight.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Ask the processor for the entries of the `n` oldest frames in flight: an answer names mostly the oldest, and
    /// their entries, written a round trip ago, have left the caches; asked for ahead, their misses overlap instead
    /// of stalling one after another as each is taken (see [`transport_core::prefetch`]). Changes nothing.
    pub fn prefetch_oldest(&self, n: usize) {
        for at in 0..n {
            self.prefetch_at(at);
        }
    }

    /// Ask the processor for the entry of the frame at `at` in order (0: the oldest in flight). Changes nothing.
    pub fn prefetch_at(&self, at: usize) {
        if let Some(entry) = self
            .index
            .get_at(at)
            .and_then(|&(_, slot)| self.slots.get(slot as usize))
        {
            transport_core::prefetch::prefetch_all(entry);
        }
    }

    /// The item of a frame in flight.
    pub fn get(&self, key: &K) -> Option<&T> {
        self.entry(key).map(|e| &e.item)
    }

    /// The item of a frame in flight, to change.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut T> {
        self.entry_mut(key).map(|e| &mut e.item)
    }

    /// The oldest key in `range`.
    pub fn first_in(&self, range: impl RangeBounds<K>) -> Option<K> {
        self.index.first_in(range)
    }

    /// The items in flight, oldest first.
    pub fn items(&self) -> impl Iterator<Item = (&K, &T)> {
        self.entries().map(|(k, e)| (k, &e.item))
    }

    /// Whether something is waiting to be sent.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// When [`Flight::handle_timeout`] should run next: at or before the earliest deadline of the frames sent and not
    /// answered (early when the frame that had it was answered since; that call then finds nothing due and sets the
    /// time exactly). `None`: no frame waits for its answer.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.index.is_empty() {
            return None;
        }
        self.next_deadline.map(|ns| self.at(ns))
    }

    /// Queue the frames whose answer is overdue, doubling their own timeouts up to `max_rto`. Returns how many.
    pub fn handle_timeout(&mut self, now: Instant, max_rto: Duration) -> usize {
        if self.epoch.is_none() {
            // Never held a frame: nothing to expire.
            return 0;
        }
        let mut expired = 0;
        let mut next: Option<u64> = None;
        let now_ns = self.since_epoch(now);
        let max_us = micros(max_rto);
        for &(key, slot) in self.index.iter() {
            let Some(e) = self.slots[slot as usize].as_mut() else {
                continue;
            };
            if e.queued {
                continue;
            }
            if e.deadline <= now_ns {
                e.queued = true;
                e.resent = true;
                e.rto_us = e.rto_us.saturating_mul(2).min(max_us);
                e.deadline = now_ns + u64::from(e.rto_us) * 1000;
                self.ready.push_back((key, slot));
                expired += 1;
            } else {
                next = Some(next.map_or(e.deadline, |n| n.min(e.deadline)));
            }
        }
        self.next_deadline = next;
        expired
    }

    /// The next frame to send, if any (it stays first until [`Flight::sent`]).
    pub fn next_ready(&mut self) -> Option<K> {
        self.next_ready_slot().map(|(key, _)| key)
    }

    /// The next frame to send and where it is kept, if any (it stays first until [`Flight::sent_slot`]).
    pub fn next_ready_slot(&mut self) -> Option<(K, Slot)> {
        while let Some(&(key, slot)) = self.ready.front() {
            let live = self.slots.get(slot as usize).and_then(Option::as_ref);
            if live.is_some_and(|e| e.key == key && e.queued) {
                return Some((key, Slot(slot)));
            }
            self.ready.pop_front();
        }
        None
    }

    /// The item kept at `slot`, as [`Flight::next_ready_slot`] gave it.
    pub fn item_at(&self, slot: Slot) -> &T {
        &self.slots[slot.0 as usize]
            .as_ref()
            .expect("a slot given out is in use until its frame is removed")
            .item
    }

    /// The item kept at `slot`, to change.
    pub fn item_at_mut(&mut self, slot: Slot) -> &mut T {
        &mut self.slots[slot.0 as usize]
            .as_mut()
            .expect("a slot given out is in use until its frame is removed")
            .item
    }

    /// The frame [`Flight::next_ready`] returned has left: its timer runs from `now`.
    pub fn sent(&mut self, now: Instant, key: K) {
        if let Some(slot) = self.index.get(&key) {
            self.sent_slot(now, key, Slot(slot));
        } else if self.ready.front().is_some_and(|(k, _)| *k == key) {
            self.ready.pop_front();
        }
    }

    /// The frame [`Flight::next_ready_slot`] returned has left: its timer runs from `now`.
    pub fn sent_slot(&mut self, now: Instant, key: K, slot: Slot) {
        if self.ready.front() == Some(&(key, slot.0)) {
            self.ready.pop_front();
        }
        let now_ns = self.since_epoch(now);
        if let Some(e) = self.slots[slot.0 as usize].as_mut() {
            if e.key == key {
                if e.first_sent == NOT_SENT {
                    e.first_sent = now_ns;
                }
                e.queued = false;
                e.deadline = now_ns + u64::from(e.rto_us) * 1000;
                let d = e.deadline;
                self.next_deadline = Some(self.next_deadline.map_or(d, |n| n.min(d)));
            }
        }
    }

    /// The frame was answered: hand its item to `f` in place (no copy of the entry), and drop it if `f` takes it
    /// (returns `Some`); one lookup for both. Returns what `f` returned and, if the frame was sent only once, when
    /// (its round trip ends now: [`Flight::round_trip`]); `None` if no frame is in flight under `key` or `f` left it.
    pub fn remove_with<R>(
        &mut self,
        key: &K,
        f: impl FnOnce(&mut T) -> Option<R>,
    ) -> Option<(R, Option<Sent>)> {
        let (at, slot) = self.index.position(key)?;
        let e = self.slots[slot as usize].as_mut()?;
        let r = f(&mut e.item)?;
        let sent_once = (!e.resent && e.first_sent != NOT_SENT).then_some(Sent(e.first_sent));
        self.index.remove_at(at);
        self.slots[slot as usize] = None;
        self.release(slot);
        Some((r, sent_once))
    }

    /// The frame was answered: take it out. Returns its item and, if it was sent only once, its round trip.
    pub fn remove(&mut self, now: Instant, key: &K) -> Option<(T, Option<Duration>)> {
        let e = self.take(key)?;
        let rtt = (!e.resent && e.first_sent != NOT_SENT)
            .then(|| self.round_trip(now, Sent(e.first_sent)));
        Some((e.item, rtt))
    }

    /// Take out every frame whose key `drop` selects (they will not be answered); returns their items.
    pub fn drain_where(&mut self, mut drop: impl FnMut(&K, &T) -> bool) -> Vec<T> {
        let keys: Vec<K> = self
            .entries()
            .filter(|(k, e)| drop(k, &e.item))
            .map(|(k, _)| *k)
            .collect();
        keys.iter()
            .filter_map(|k| self.take(k).map(|e| e.item))
            .collect()
    }
}

/// What a [`ReplayWindow`] says about a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Not seen before.
    New,
    /// Seen before.
    Again,
    /// Older than the window: it cannot be told apart, and an honest peer never sends one (see [`REPLAY_WINDOW`]).
    TooOld,
}

/// The numbers seen of one count, as IPsec's anti-replay window (RFC 4303 section 3.4.3): the highest number seen
/// and a bitmap of the [`REPLAY_WINDOW`] numbers below it. Fixed size whatever it is sent.
#[derive(Debug, Clone, Default)]
pub struct ReplayWindow {
    /// One past the highest number seen (0: none yet).
    next: u64,
    bits: [u64; (REPLAY_WINDOW / 64) as usize],
}

impl ReplayWindow {
    fn bit(n: u64) -> (usize, u64) {
        let slot = n % REPLAY_WINDOW;
        ((slot / 64) as usize, 1 << (slot % 64))
    }

    /// Whether `n` was seen.
    pub fn check(&self, n: u64) -> Seen {
        if n >= self.next {
            return Seen::New;
        }
        if n < self.next.saturating_sub(REPLAY_WINDOW) {
            return Seen::TooOld;
        }
        let (word, mask) = ReplayWindow::bit(n);
        if self.bits[word] & mask != 0 {
            Seen::Again
        } else {
            Seen::New
        }
    }

    /// Remember `n` (the caller checked it is [`Seen::New`]).
    pub fn mark(&mut self, n: u64) {
        if n >= self.next {
            // The slots of the numbers the window moves past are reused: clear them first.
            if n - self.next >= REPLAY_WINDOW {
                self.bits = Default::default();
            } else {
                for m in self.next..n {
                    let (word, mask) = ReplayWindow::bit(m);
                    self.bits[word] &= !mask;
                }
            }
            self.next = n + 1;
        }
        let (word, mask) = ReplayWindow::bit(n);
        self.bits[word] |= mask;
    }

    /// Check `n` and remember it if new; returns what it was.
    pub fn take(&mut self, n: u64) -> Seen {
        let seen = self.check(n);
        if seen == Seen::New {
            self.mark(n);
        }
        seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_tells_new_numbers_from_repeats_in_any_order() {
        let mut w = ReplayWindow::default();
        assert_eq!(w.take(5), Seen::New);
        assert_eq!(w.take(5), Seen::Again);
        assert_eq!(w.take(0), Seen::New, "older but inside the window");
        assert_eq!(w.take(3), Seen::New);
        assert_eq!(w.take(3), Seen::Again);
        assert_eq!(w.take(4000), Seen::New);
        assert_eq!(w.check(5), Seen::TooOld);
        assert_eq!(w.check(4000 - REPLAY_WINDOW), Seen::TooOld);
        assert_eq!(w.check(4000 - REPLAY_WINDOW + 1), Seen::New);
        // A slot reused by a later number does not carry the old one's mark.
        let mut w = ReplayWindow::default();
        w.take(1);
        w.take(REPLAY_WINDOW);
        assert_eq!(w.check(REPLAY_WINDOW + 1), Seen::New);
        assert_eq!(w.take(1 + REPLAY_WINDOW), Seen::New);
        // Every number of a long run, each twice, shuffled within the window: each new exactly once.
        let mut w = ReplayWindow::default();
        let mut news = 0;
        for base in (0..10_000u64).step_by(100) {
            for i in (0..100).rev() {
                for _ in 0..2 {
                    if w.take(base + i) == Seen::New {
                        news += 1;
                    }
                }
            }
        }
        assert_eq!(news, 10_000);
    }

    #[test]
    fn flight_resends_on_timeout_and_samples_only_first_tries() {
        let t0 = Instant::now();
        let mut f: Flight<u64, &str> = Flight::default();
        let rto = Duration::from_millis(200);
        f.insert(t0, 1, "a", rto);
        f.insert(t0, 2, "b", rto);
        assert_eq!(f.next_ready(), Some(1));
        f.sent(t0, 1);
        assert_eq!(f.next_ready(), Some(2));
        f.sent(t0, 2);
        assert_eq!(f.next_ready(), None);
        assert_eq!(f.poll_timeout(), Some(t0 + rto));
        let t1 = t0 + Duration::from_millis(50);
        assert_eq!(
            f.remove(t1, &2),
            Some(("b", Some(Duration::from_millis(50))))
        );
        let t2 = t0 + rto;
        assert_eq!(f.handle_timeout(t2, Duration::from_secs(1)), 1);
        assert_eq!(f.next_ready(), Some(1));
        f.sent(t2, 1);
        assert_eq!(
            f.poll_timeout(),
            Some(t2 + rto * 2),
            "its own timer doubled"
        );
        assert_eq!(f.remove(t2, &1), Some(("a", None)), "re-sent: no sample");
        assert!(f.is_empty());
    }

    /// The timer asked for is never after the earliest deadline of a frame waiting for its answer, and once a call
    /// at that time found nothing due it is exactly the earliest: against a scan of every frame, through sends,
    /// answers in any order, expiries and re-sends.
    #[test]
    fn the_timer_is_never_late_and_exact_after_each_expiry() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let t0 = Instant::now();
        let max = Duration::from_secs(1);
        let mut f: Flight<u64, ()> = Flight::default();
        let mut now = t0;
        let mut next = 0u64;
        let exact = |f: &Flight<u64, ()>| {
            f.slots
                .iter()
                .flatten()
                .filter(|e| !e.queued)
                .map(|e| f.at(e.deadline))
                .min()
        };
        for _ in 0..20_000 {
            now += Duration::from_millis(rng.random_range(0..20));
            match rng.random_range(0..10) {
                0..=3 => {
                    f.insert(
                        now,
                        next,
                        (),
                        Duration::from_millis(rng.random_range(50..300)),
                    );
                    next += 1;
                }
                4 | 5 => {
                    while let Some((key, slot)) = f.next_ready_slot() {
                        f.sent_slot(now, key, slot);
                    }
                }
                6 | 7 => {
                    if let Some(key) = f.first_in(..) {
                        let pick = if rng.random_bool(0.7) {
                            key
                        } else {
                            rng.random_range(key..next.max(key + 1))
                        };
                        f.remove(now, &pick);
                    }
                }
                _ => {
                    let due = f.poll_timeout();
                    if due.is_some_and(|t| t <= now) {
                        f.handle_timeout(now, max);
                        assert_eq!(f.poll_timeout(), exact(&f), "exact after an expiry");
                    }
                }
            }
            match (f.poll_timeout(), exact(&f)) {
                (Some(asked), Some(earliest)) => assert!(asked <= earliest),
                (None, Some(earliest)) => panic!("no timer, a deadline at {earliest:?}"),
                _ => {}
            }
        }
    }

    #[test]
    fn flight_keeps_key_order_while_slots_are_reused() {
        let t0 = Instant::now();
        let rto = Duration::from_millis(200);
        let mut f: Flight<u64, u64> = Flight::default();
        let mut model = std::collections::BTreeMap::new();
        // Answered oldest first, new ones after, some out of order, one key replaced: the same as an ordered map.
        for n in 0..1000u64 {
            f.insert(t0, n, n * 10, rto);
            model.insert(n, n * 10);
            if n % 3 == 0 && n >= 20 {
                let oldest = *model.keys().next().unwrap();
                assert_eq!(f.remove(t0, &oldest).map(|(v, _)| v), model.remove(&oldest));
            }
            if n % 7 == 0 && n >= 10 {
                let key = n - 5;
                assert_eq!(f.remove(t0, &key).map(|(v, _)| v), model.remove(&key));
            }
            if n % 11 == 0 {
                f.insert(t0, n, n, rto);
                model.insert(n, n);
            }
            assert_eq!(f.len(), model.len());
        }
        let items: Vec<(u64, u64)> = f.items().map(|(k, v)| (*k, *v)).collect();
        let expected: Vec<(u64, u64)> = model.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(items, expected);
        assert_eq!(
            f.first_in(500..),
            model.range(500..).next().map(|(k, _)| *k)
        );
        assert!(
            f.slots.len() <= model.len() + f.free.len(),
            "freed slots are used again"
        );
        assert_eq!(f.get(&999), model.get(&999));
        let odd = f.drain_where(|k, _| k % 2 == 1);
        assert_eq!(odd.len(), model.keys().filter(|k| *k % 2 == 1).count());
        model.retain(|k, _| k % 2 == 0);
        for k in model.keys().copied().collect::<Vec<_>>() {
            assert_eq!(f.remove(t0, &k).map(|(v, _)| v), model.remove(&k));
        }
        assert!(f.is_empty());
        assert!(f.slots.is_empty(), "an empty flight holds no slots");
    }

    /// The frames of one answer datagram are one round-trip sample (as one answer to one frame would be), and the
    /// window grows by how many they are.
    #[test]
    fn frames_answered_together_are_one_sample_and_grow_the_window_by_their_count() {
        let config = FlowConfig {
            window: 256,
            initial_rto: Duration::from_millis(200),
            max_rto: Duration::from_secs(10),
        };
        let (mut many, mut one, mut each) =
            (Flow::new(config), Flow::new(config), Flow::new(config));
        for f in [&mut many, &mut one, &mut each] {
            f.answered(Some(Duration::from_secs(1)));
            for _ in 0..3 {
                f.expired();
            }
            f.answered(Some(Duration::from_secs(1)));
        }
        // 256 halved three times, then one answer: 33 frames.
        assert!(many.room(32) && !many.room(33));
        many.answered_many(10, Some(Duration::from_millis(100)));
        one.answered(Some(Duration::from_millis(100)));
        for _ in 0..10 {
            each.answered(Some(Duration::from_millis(100)));
        }
        assert_eq!(many.rto(), one.rto(), "one sample for the datagram");
        assert!(
            many.rto() > each.rto(),
            "ten samples move the average further"
        );
        assert!(many.room(42) && !many.room(43), "the window grew by ten");
        many.answered_many(0, Some(Duration::from_millis(1)));
        assert_eq!(many.rto(), one.rto(), "nothing answered: no sample");
        assert!(!many.room(43));
    }

    /// A frame the caller does not take stays in flight, looked up once either way.
    #[test]
    fn a_frame_left_by_remove_with_stays_in_flight() {
        let t0 = Instant::now();
        let mut f: Flight<u64, u64> = Flight::default();
        for k in 0..4 {
            f.insert(t0, k, k * 10, Duration::from_millis(200));
        }
        while let Some(k) = f.next_ready() {
            f.sent(t0, k);
        }
        assert_eq!(f.remove_with(&2, |_| None::<()>), None);
        assert_eq!(f.get(&2), Some(&20));
        let (v, sent) = f.remove_with(&2, |v| Some(*v)).expect("in flight");
        assert_eq!(v, 20);
        let sent = sent.expect("sent once");
        let t1 = t0 + Duration::from_millis(70);
        assert_eq!(
            f.round_trip(t1, sent),
            Duration::from_millis(70),
            "sent at t0"
        );
        assert_eq!(f.get(&2), None);
        assert_eq!(f.remove_with(&2, |v| Some(*v)), None, "answered once");
        assert_eq!(f.remove_with(&9, |v| Some(*v)), None, "never sent");
        assert_eq!(f.len(), 3);
        // Re-sent: no round trip to measure (Karn's rule).
        let t1 = t0 + Duration::from_millis(300);
        assert_eq!(f.handle_timeout(t1, Duration::from_secs(1)), 3);
        while let Some(k) = f.next_ready() {
            f.sent(t1, k);
        }
        assert_eq!(f.remove_with(&0, |v| Some(*v)), Some((0, None)));
    }

    #[test]
    fn the_window_halves_on_expiry_and_grows_per_answer() {
        let mut flow = Flow::new(FlowConfig::default());
        assert!(flow.room(255) && !flow.room(256));
        flow.expired();
        assert!(!flow.room(128));
        assert_eq!(flow.rto(), Duration::from_millis(400));
        flow.answered(Some(Duration::from_millis(10)));
        assert!(flow.room(128));
        assert_eq!(
            flow.rto(),
            Duration::from_millis(200),
            "never below the initial timeout"
        );
        for _ in 0..20 {
            flow.expired();
        }
        assert!(flow.room(1) && !flow.room(2));
        assert_eq!(flow.rto(), Duration::from_secs(1));
    }
}
