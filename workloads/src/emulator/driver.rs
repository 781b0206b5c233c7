//! The emulator's thread: one loop that receives, schedules and delivers for one relay (UDP or TCP).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use mio::event::Event;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

use super::clock::{self, Waiter};
use super::queue::Queue;
use super::sys;

/// Token of the waker that stops the thread.
pub(crate) const WAKER: Token = Token(usize::MAX);
/// Token of the timerfd.
pub(crate) const TIMER: Token = Token(usize::MAX - 1);

/// The protocol-specific half of an emulator: its sockets and what to do with their packets.
pub(crate) trait Relay: Send + 'static {
    /// A packet (or event) waiting in the queue for its due time.
    type Item: Send;

    /// One of the relay's sockets is ready: read what it has (within a budget) and queue it.
    fn ready(&mut self, event: &Event, queue: &mut Queue<Self::Item>);

    /// Whether some socket still had data when its read budget ran out.
    fn has_more(&self) -> bool;

    /// Reads some more from the sockets whose budget ran out.
    fn read_more(&mut self, queue: &mut Queue<Self::Item>);

    /// Hands a due item to the kernel.
    fn deliver(&mut self, item: Self::Item, queue: &mut Queue<Self::Item>);
}

/// The running thread; dropping it stops the thread and waits for it, which closes the relay's sockets.
pub(crate) struct Worker {
    stop: Arc<AtomicBool>,
    waker: Waker,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts the thread for a relay whose sockets are registered with `poll`.
    pub(crate) fn spawn<R: Relay>(name: &str, poll: Poll, relay: R) -> io::Result<Self> {
        let waker = Waker::new(poll.registry(), WAKER)?;
        let waiter = Waiter::new()?;
        poll.registry()
            .register(&mut SourceFd(&waiter.raw_fd()), TIMER, Interest::READABLE)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = thread::Builder::new().name(name.to_owned()).spawn({
            let stop = Arc::clone(&stop);
            move || run(poll, waiter, relay, &stop)
        })?;
        Ok(Self {
            stop,
            waker,
            thread: Some(thread),
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if self.waker.wake().is_ok() {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
        // If the wake failed the thread is left to stop at its next wake-up; joining could hang.
    }
}

fn run<R: Relay>(mut poll: Poll, mut waiter: Waiter, mut relay: R, stop: &AtomicBool) {
    sys::minimize_timer_slack();
    let mut events = Events::with_capacity(1024);
    let mut queue = Queue::new();
    // Something is due within the timer's lead: check the sockets without blocking, then spin for it.
    let mut due_soon = false;
    loop {
        let blocking = !due_soon && !relay.has_more();
        if let Err(error) = poll.poll(
            &mut events,
            if blocking { None } else { Some(Duration::ZERO) },
        ) {
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // epoll itself failed: nothing can be relayed any more.
            return;
        }
        let woke = clock::now();
        if stop.load(Ordering::Acquire) {
            return;
        }
        for event in events.iter() {
            match event.token() {
                WAKER => {}
                // Only a wake-up from a blocking wait says how late the kernel wakes this thread.
                TIMER => waiter.fired(woke, blocking),
                _ => relay.ready(event, &mut queue),
            }
        }
        relay.read_more(&mut queue);
        match deliver_due(&mut relay, &mut queue, &mut waiter) {
            Ok(soon) => due_soon = soon,
            // The timer cannot be armed: nothing can be delivered on time any more.
            Err(_) => return,
        }
    }
}

/// Delivers everything that is due. If the next due time is closer than the timer's lead, spins for it and
/// delivers once more; if the one after is close too, returns `true` so the sockets are checked before spinning
/// again (a steady stream of packets must not keep the thread from reading). Otherwise arms the timer for the next
/// due time, or disarms it when nothing is queued.
fn deliver_due<R: Relay>(
    relay: &mut R,
    queue: &mut Queue<R::Item>,
    waiter: &mut Waiter,
) -> io::Result<bool> {
    deliver_until(relay, queue, clock::now());
    if let Some(due) = queue
        .next_due()
        .filter(|&due| due <= clock::now() + waiter.lead())
    {
        clock::spin_until(due);
        deliver_until(relay, queue, clock::now());
    }
    match queue.next_due() {
        None => waiter.disarm().map(|()| false),
        Some(due) if due > clock::now() + waiter.lead() => waiter.arm(due).map(|()| false),
        Some(_) => Ok(true),
    }
}

fn deliver_until<R: Relay>(relay: &mut R, queue: &mut Queue<R::Item>, now: sys::Nanos) {
    while let Some(item) = queue.pop_due(now) {
        relay.deliver(item, queue);
    }
}
