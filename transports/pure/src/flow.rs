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

use std::collections::{BTreeMap, VecDeque};
use std::ops::RangeBounds;
use std::time::{Duration, Instant};

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
}

impl Flow {
    /// A path with no sample yet: the initial timeout and the full window.
    pub fn new(config: FlowConfig) -> Flow {
        Flow {
            config,
            srtt: None,
            rto: config.initial_rto,
            cwnd: config.window as f64,
        }
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
        in_flight < (self.cwnd as usize).max(1)
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
        self.cwnd = (self.cwnd + 1.0).min(self.config.window as f64);
    }

    /// Timers expired: back the timer off (RFC 6298, 5.5) until a frame answered at the first try measures the
    /// round trip again, so frames sent meanwhile do not time out against a queue they cannot beat; halve the window.
    pub fn expired(&mut self) {
        self.rto = (self.rto * 2).min(self.config.max_rto);
        self.cwnd = (self.cwnd / 2.0).max(MIN_WINDOW);
    }
}

/// One frame in flight.
#[derive(Debug)]
pub struct Entry<T> {
    /// What the caller keeps with it (the item and its sealed frame).
    pub item: T,
    first_sent: Option<Instant>,
    resent: bool,
    rto: Duration,
    deadline: Instant,
    /// Waiting in the ready queue to be sent (again).
    queued: bool,
}

/// Frames in flight, by key (ordered: the oldest first), and the queue of those to send (again).
#[derive(Debug)]
pub struct Flight<K, T> {
    entries: BTreeMap<K, Entry<T>>,
    ready: VecDeque<K>,
}

impl<K: Ord + Copy, T> Default for Flight<K, T> {
    fn default() -> Self {
        Flight {
            entries: BTreeMap::new(),
            ready: VecDeque::new(),
        }
    }
}

impl<K: Ord + Copy, T> Flight<K, T> {
    /// Put a frame in flight, ready to be sent, with the re-send timeout `rto`.
    pub fn insert(&mut self, now: Instant, key: K, item: T, rto: Duration) {
        self.entries.insert(
            key,
            Entry {
                item,
                first_sent: None,
                resent: false,
                rto,
                deadline: now + rto,
                queued: true,
            },
        );
        self.ready.push_back(key);
    }

    /// Frames in flight.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The item of a frame in flight.
    pub fn get(&self, key: &K) -> Option<&T> {
        self.entries.get(key).map(|e| &e.item)
    }

    /// The item of a frame in flight, to change.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut T> {
        self.entries.get_mut(key).map(|e| &mut e.item)
    }

    /// The oldest key in `range`.
    pub fn first_in(&self, range: impl RangeBounds<K>) -> Option<K> {
        self.entries.range(range).next().map(|(k, _)| *k)
    }

    /// The items in flight, oldest first.
    pub fn items(&self) -> impl Iterator<Item = (&K, &T)> {
        self.entries.iter().map(|(k, e)| (k, &e.item))
    }

    /// Whether something is waiting to be sent.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// When [`Flight::handle_timeout`] should run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter(|e| !e.queued)
            .map(|e| e.deadline)
            .min()
    }

    /// Queue the frames whose answer is overdue, doubling their own timeouts up to `max_rto`. Returns how many.
    pub fn handle_timeout(&mut self, now: Instant, max_rto: Duration) -> usize {
        let mut expired = 0;
        for (key, e) in self.entries.iter_mut() {
            if !e.queued && e.deadline <= now {
                e.queued = true;
                e.resent = true;
                e.rto = (e.rto * 2).min(max_rto);
                e.deadline = now + e.rto;
                self.ready.push_back(*key);
                expired += 1;
            }
        }
        expired
    }

    /// The next frame to send, if any (it stays first until [`Flight::sent`]).
    pub fn next_ready(&mut self) -> Option<K> {
        while let Some(&key) = self.ready.front() {
            if self.entries.get(&key).is_some_and(|e| e.queued) {
                return Some(key);
            }
            self.ready.pop_front();
        }
        None
    }

    /// The frame [`Flight::next_ready`] returned has left: its timer runs from `now`.
    pub fn sent(&mut self, now: Instant, key: K) {
        if self.ready.front() == Some(&key) {
            self.ready.pop_front();
        }
        if let Some(e) = self.entries.get_mut(&key) {
            e.first_sent.get_or_insert(now);
            e.queued = false;
            e.deadline = now + e.rto;
        }
    }

    /// The frame was answered: take it out. Returns its item and, if it was sent only once, its round trip.
    pub fn remove(&mut self, now: Instant, key: &K) -> Option<(T, Option<Duration>)> {
        let e = self.entries.remove(key)?;
        let rtt = match (e.resent, e.first_sent) {
            (false, Some(sent)) => Some(now.saturating_duration_since(sent)),
            _ => None,
        };
        Some((e.item, rtt))
    }

    /// Take out every frame whose key `drop` selects (they will not be answered); returns their items.
    pub fn drain_where(&mut self, mut drop: impl FnMut(&K, &T) -> bool) -> Vec<T> {
        let keys: Vec<K> = self
            .entries
            .iter()
            .filter(|(k, e)| drop(k, &e.item))
            .map(|(k, _)| *k)
            .collect();
        keys.iter()
            .filter_map(|k| self.entries.remove(k).map(|e| e.item))
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
