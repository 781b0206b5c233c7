//! A device's requests in flight: the futures of the orders it sent one request each ([`Connector::send_order`]),
//! each in a slot of its own that is kept and used again, with a waker made once per slot.
//!
//! A device has up to a window of requests in flight (100 on the QUIC transports) and a hundred devices share the
//! load generator's CPU, so what each request costs besides the library's work is paid a hundred thousand times a
//! second. `FuturesUnordered` allocated a task per request and linked it into two lists with atomic operations on
//! every push, wake and poll (about a sixth of the `quinn` generator's samples in a seed drain). Here a request's
//! future goes into a free slot; the slot's waker sets the slot's bit in a two-level set of ready bits and wakes the
//! device's task; the device polls only the slots whose bits it takes. Nothing is allocated per request after a
//! slot's first use.
//!
//! [`Connector::send_order`]: super::Connector::send_order

use futures::task::AtomicWaker;
use futures::Stream;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// Words of ready bits: the set has a bit per slot, 16 words of 64 (about 170 bytes a device, idle or not).
const WORDS: usize = 16;

/// The most requests one device has in flight at once (the fleet sends no more, [`Requests::room`]).
pub(super) const CAPACITY: usize = WORDS * 64;

/// The ready bits, shared with the slots' wakers (which the libraries hold and may call from any thread).
struct Ready {
    /// The device's task, woken when a slot is.
    task: AtomicWaker,
    /// Bit `w`: word `w` of `words` may have a bit set.
    summary: AtomicU64,
    /// Bit `b` of word `w`: slot `64 w + b` was woken since it was last polled.
    words: [AtomicU64; WORDS],
}

impl Ready {
    fn set(&self, slot: usize) {
        self.words[slot / 64].fetch_or(1 << (slot % 64), Ordering::AcqRel);
        self.summary.fetch_or(1 << (slot / 64), Ordering::AcqRel);
        self.task.wake();
    }
}

/// The waker of one slot: the same for every request the slot holds.
struct SlotWaker {
    ready: Arc<Ready>,
    slot: usize,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.ready.set(self.slot);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.ready.set(self.slot);
    }
}

struct Slot<F> {
    future: Option<F>,
    waker: Waker,
}

/// Futures in flight, polled as they are woken; a [`Stream`] of their outputs in the order they complete, ending
/// (`None`) while it holds none.
pub(super) struct Requests<F> {
    ready: Arc<Ready>,
    slots: Vec<Slot<F>>,
    /// Slots without a future.
    free: Vec<usize>,
    /// Ready bits taken from `ready` and not yet polled, and which of these words have any.
    taken: [u64; WORDS],
    taken_summary: u64,
}

impl<F> Default for Requests<F> {
    fn default() -> Self {
        Self {
            ready: Arc::new(Ready {
                task: AtomicWaker::new(),
                summary: AtomicU64::new(0),
                words: std::array::from_fn(|_| AtomicU64::new(0)),
            }),
            slots: Vec::new(),
            free: Vec::new(),
            taken: [0; WORDS],
            taken_summary: 0,
        }
    }
}

impl<F: Future + Unpin> Requests<F> {
    /// How many are in flight.
    fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many more it takes.
    pub(super) fn room(&self) -> usize {
        CAPACITY - self.len()
    }

    /// Add `future`; it is polled at the next poll of the stream. Panics if there is no [`room`](Self::room).
    pub(super) fn push(&mut self, future: F) {
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot].future = Some(future);
                slot
            }
            None => {
                let slot = self.slots.len();
                assert!(slot < CAPACITY, "more than {CAPACITY} requests in flight");
                let waker = Waker::from(Arc::new(SlotWaker {
                    ready: self.ready.clone(),
                    slot,
                }));
                self.slots.push(Slot {
                    future: Some(future),
                    waker,
                });
                slot
            }
        };
        self.take_bit(slot / 64, 1 << (slot % 64));
    }

    /// Drop every future (their slots and wakers stay for the next ones).
    pub(super) fn clear(&mut self) {
        for slot in &mut self.slots {
            slot.future = None;
        }
        // Lowest slots first, as a new set hands them out.
        self.free = (0..self.slots.len()).rev().collect();
    }

    fn take_bit(&mut self, word: usize, bits: u64) {
        self.taken[word] |= bits;
        self.taken_summary |= 1 << word;
    }

    /// Move the bits woken meanwhile into `taken`; whether there were any.
    fn take_ready(&mut self) -> bool {
        let mut summary = self.ready.summary.swap(0, Ordering::AcqRel);
        let mut any = false;
        while summary != 0 {
            let word = summary.trailing_zeros() as usize;
            summary &= summary - 1;
            let bits = self.ready.words[word].swap(0, Ordering::AcqRel);
            if bits != 0 {
                self.take_bit(word, bits);
                any = true;
            }
        }
        any
    }

    /// The next slot whose bit was taken, its bit cleared.
    fn next_taken(&mut self) -> Option<usize> {
        if self.taken_summary == 0 {
            return None;
        }
        let word = self.taken_summary.trailing_zeros() as usize;
        let bits = self.taken[word];
        let bit = bits.trailing_zeros() as usize;
        self.taken[word] = bits & (bits - 1);
        if self.taken[word] == 0 {
            self.taken_summary &= !(1 << word);
        }
        Some(word * 64 + bit)
    }
}

impl<F: Future + Unpin> Stream for Requests<F> {
    type Item = F::Output;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        let this = self.get_mut();
        if this.is_empty() {
            return Poll::Ready(None);
        }
        this.ready.task.register(cx.waker());
        // A future that wakes itself whenever it is polled (a library yielding) must not keep this call going: after
        // as many polls as there are futures, the task yields and is woken again.
        let mut budget = this.len().max(32);
        loop {
            let Some(slot) = this.next_taken() else {
                if this.take_ready() {
                    continue;
                }
                return Poll::Pending;
            };
            if budget == 0 {
                this.take_bit(slot / 64, 1 << (slot % 64));
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            budget -= 1;
            let Slot { future, waker } = &mut this.slots[slot];
            // No future: a late wake of a slot whose future is done (or dropped).
            let Some(f) = future.as_mut() else { continue };
            if let Poll::Ready(output) = Pin::new(f).poll(&mut Context::from_waker(waker)) {
                *future = None;
                this.free.push(slot);
                return Poll::Ready(Some(output));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::oneshot;
    use futures::executor::block_on;
    use futures::{FutureExt, StreamExt};
    use std::collections::BTreeSet;

    // The channels are futures' own, outside tokio: tokio's would make the test's one long task yield every 128
    // receives (its co-operative budget), which a device's task, yielding at each wait, never runs into.

    /// A request answered when its sender sends.
    fn request(
        id: u32,
    ) -> (
        oneshot::Sender<()>,
        Pin<Box<dyn Future<Output = u32> + Send>>,
    ) {
        let (tx, rx) = oneshot::channel::<()>();
        (
            tx,
            Box::pin(async move {
                let _ = rx.await;
                id
            }),
        )
    }

    #[test]
    fn each_request_is_returned_once_as_it_completes_and_slots_are_used_again() {
        let mut requests = Requests::default();
        let mut senders = std::collections::HashMap::new();
        let mut open = BTreeSet::new();
        let mut next = 0u32;
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut most = 0;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 3 {
                0 if requests.len() < 300 => {
                    let (tx, f) = request(next);
                    senders.insert(next, tx);
                    open.insert(next);
                    requests.push(f);
                    next += 1;
                }
                _ if !open.is_empty() => {
                    // Answer one at random (an old one or a new one), maybe two.
                    let pick = *open.iter().nth((x >> 20) as usize % open.len()).unwrap();
                    senders.remove(&pick).unwrap().send(()).unwrap();
                    let mut done = vec![];
                    while let Some(Some(id)) = requests.next().now_or_never() {
                        done.push(id);
                    }
                    assert_eq!(done, [pick], "only the answered request completes");
                    open.remove(&pick);
                }
                _ => {}
            }
            most = most.max(requests.len());
            assert_eq!(requests.len(), open.len());
        }
        assert!(
            requests.slots.len() <= most,
            "{} slots for at most {most} requests at once",
            requests.slots.len()
        );
        for tx in senders.into_values() {
            tx.send(()).unwrap();
        }
        let mut rest: Vec<u32> = block_on(requests.by_ref().collect());
        rest.sort_unstable();
        assert_eq!(rest, open.into_iter().collect::<Vec<_>>());
        assert!(requests.is_empty());
        assert_eq!(block_on(requests.next()), None, "an empty set ends");
    }

    #[test]
    fn requests_answered_from_other_threads_wake_the_device() {
        let mut requests = Requests::default();
        let mut senders = Vec::new();
        for id in 0..1_000 {
            let (tx, f) = request(id);
            senders.push(tx);
            requests.push(f);
        }
        let answering = std::thread::spawn(move || {
            for tx in senders.into_iter().rev() {
                tx.send(()).unwrap();
            }
        });
        let mut got: Vec<u32> = block_on(requests.by_ref().collect());
        answering.join().unwrap();
        got.sort_unstable();
        assert_eq!(got, (0..1_000).collect::<Vec<_>>());
    }

    /// A future that wakes itself and stays pending, as a library out of its budget does.
    struct Spinning;

    impl Future for Spinning {
        type Output = u32;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u32> {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    #[test]
    fn a_request_that_always_wakes_itself_does_not_hold_the_device() {
        let mut requests: Requests<Pin<Box<dyn Future<Output = u32> + Send>>> = Requests::default();
        requests.push(Box::pin(Spinning));
        let (tx, f) = request(7);
        requests.push(f);
        assert!(requests.next().now_or_never().is_none(), "the call yields");
        tx.send(()).unwrap();
        assert_eq!(block_on(requests.next()), Some(7));
        assert!(requests.next().now_or_never().is_none());
        assert_eq!(requests.len(), 1);
    }

    #[test]
    fn cleared_requests_are_dropped_and_a_late_wake_of_their_slot_is_harmless() {
        let mut requests = Requests::default();
        let (old, f) = request(1);
        requests.push(f);
        assert!(requests.next().now_or_never().is_none());
        requests.clear();
        assert!(requests.is_empty());
        assert!(old.is_canceled(), "the request's future was dropped");
        // The slot is used again; the first request's waker (held by its channel until the drop) may still fire.
        let (tx, f) = request(2);
        requests.push(f);
        requests.slots[0].waker.wake_by_ref();
        assert!(requests.next().now_or_never().is_none());
        tx.send(()).unwrap();
        assert_eq!(block_on(requests.next()), Some(2));
        assert_eq!(requests.slots.len(), 1);
    }

    #[test]
    fn room_is_what_is_left_of_the_capacity() {
        let mut requests = Requests::default();
        assert_eq!(requests.room(), CAPACITY);
        requests.push(futures::future::ready(1));
        assert_eq!(requests.room(), CAPACITY - 1);
    }
}
