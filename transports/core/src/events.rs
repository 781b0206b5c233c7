//! The channel a fleet's links report their [`LinkEvent`]s on, one at a time or in batches.
//!
//! A device that takes an answer datagram for many orders at once reports them as one batch: one hand-over to the
//! workload instead of one per order (at millions of orders a second, a channel operation per order was a tenth of
//! the load generator's time). The receiving side hands the events out one at a time, in order, as a plain
//! channel would.
//!
//! The receiver runs after the senders have had their turns, so a batch it takes has usually left the caches: it
//! takes the next batch off the channel one batch early and asks for its first lines from memory while the current
//! batch is handed out, and within a batch asks for each event a few before it is handed out (see
//! [`crate::prefetch`]). The order of events is unchanged.

use crate::transport::LinkEvent;
use std::collections::VecDeque;
use tokio::sync::mpsc;
pub use tokio::sync::mpsc::error::TryRecvError;

/// What travels on the channel: one event, or a batch of them.
enum Item {
    One(LinkEvent),
    Many(Vec<LinkEvent>),
}

/// The sending side (cheap to clone; every link of a fleet holds one).
#[derive(Debug, Clone)]
pub struct EventSender {
    tx: mpsc::UnboundedSender<Item>,
}

impl std::fmt::Debug for Item {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Item::One(e) => f.debug_tuple("One").field(e).finish(),
            Item::Many(v) => f.debug_tuple("Many").field(&v.len()).finish(),
        }
    }
}

/// The receiver is gone: the event was not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the receiver of link events is gone")]
pub struct Closed;

impl EventSender {
    /// Report one event.
    pub fn send(&self, event: LinkEvent) -> Result<(), Closed> {
        self.tx.send(Item::One(event)).map_err(|_| Closed)
    }

    /// Report several events at once, in order (nothing is sent for an empty batch).
    pub fn send_all(&self, events: Vec<LinkEvent>) -> Result<(), Closed> {
        match events.len() {
            0 => Ok(()),
            _ => self.tx.send(Item::Many(events)).map_err(|_| Closed),
        }
    }

    /// Whether the receiver is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// The receiving side: events one at a time, in the order they were sent.
#[derive(Debug)]
pub struct EventReceiver {
    rx: mpsc::UnboundedReceiver<Item>,
    /// The rest of the last batch.
    batch: VecDeque<LinkEvent>,
    /// The item after the last batch, already taken off the channel (its memory asked for).
    next: Option<Item>,
}

/// How much of the next batch is asked for ahead: about ten events.
const AHEAD_LINES: usize = 8;

/// How far ahead of the one handed out the rest of a batch is asked for (a batch of a hundred events is a few
/// kilobytes, more than the processor's own stream detection reads ahead in time).
const EVENTS_AHEAD: usize = 10;

/// A new channel of link events.
pub fn channel() -> (EventSender, EventReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        EventSender { tx },
        EventReceiver {
            rx,
            batch: VecDeque::new(),
            next: None,
        },
    )
}

impl EventReceiver {
    /// The next event, waiting for one; `None` once every sender is gone and nothing is left.
    pub async fn recv(&mut self) -> Option<LinkEvent> {
        if let Some(e) = self.pop_batch() {
            return Some(e);
        }
        let item = self.next_item().await?;
        Some(self.unpack(item))
    }

    /// The next event if one is waiting.
    pub fn try_recv(&mut self) -> Result<LinkEvent, TryRecvError> {
        if let Some(e) = self.pop_batch() {
            return Ok(e);
        }
        let item = match self.next.take() {
            Some(item) => item,
            None => self.rx.try_recv()?,
        };
        Ok(self.unpack(item))
    }

    /// The next event of the current batch; the one `EVENTS_AHEAD` after it is asked for.
    fn pop_batch(&mut self) -> Option<LinkEvent> {
        let e = self.batch.pop_front()?;
        if let Some(ahead) = self.batch.get(EVENTS_AHEAD) {
            crate::prefetch::prefetch(ahead);
        }
        Some(e)
    }

    /// The item taken early, or the next off the channel, waiting for one; `None` once every sender is gone.
    async fn next_item(&mut self) -> Option<Item> {
        match self.next.take() {
            Some(item) => Some(item),
            None => self.rx.recv().await,
        }
    }

    /// Wait for at least one event, then move up to `limit` of those waiting to the end of `buf`; returns how many
    /// (0 only once every sender is gone and nothing is left, or for a `limit` of 0).
    pub async fn recv_many(&mut self, buf: &mut Vec<LinkEvent>, limit: usize) -> usize {
        if limit == 0 {
            return 0;
        }
        if self.batch.is_empty() {
            let Some(item) = self.next_item().await else {
                return 0;
            };
            let first = self.unpack(item);
            self.batch.push_front(first);
        }
        let mut moved = 0;
        while moved < limit {
            match self.try_recv() {
                Ok(e) => {
                    buf.push(e);
                    moved += 1;
                }
                Err(_) => break,
            }
        }
        moved
    }

    /// The first event of `item` (the rest of a batch is kept); the item after it is taken off the channel now if it
    /// is there, and its first lines asked for.
    fn unpack(&mut self, item: Item) -> LinkEvent {
        if let Ok(after) = self.rx.try_recv() {
            if let Item::Many(v) = &after {
                crate::prefetch::prefetch_slice(v, AHEAD_LINES);
            }
            self.next = Some(after);
        }
        match item {
            Item::One(e) => e,
            Item::Many(v) => {
                self.batch = VecDeque::from(v);
                self.batch
                    .pop_front()
                    .expect("an empty batch is never sent")
            }
        }
    }

    /// Stop taking events: later sends fail; what was sent can still be received.
    pub fn close(&mut self) {
        self.rx.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OrderId;
    use std::time::Instant;

    fn stored(seq: u64) -> LinkEvent {
        LinkEvent::Stored {
            device: 0,
            id: OrderId {
                sender: 0,
                run: 1,
                seq,
            },
            at: Instant::now(),
        }
    }

    fn seq(e: LinkEvent) -> u64 {
        match e {
            LinkEvent::Stored { id, .. } => id.seq,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn events_come_out_one_at_a_time_in_the_order_sent() {
        let (tx, mut rx) = channel();
        tx.send(stored(0)).unwrap();
        tx.send_all((1..4).map(stored).collect()).unwrap();
        tx.send_all(Vec::new()).unwrap();
        tx.send(stored(4)).unwrap();
        tx.send_all((5..7).map(stored).collect()).unwrap();
        assert_eq!(seq(rx.try_recv().unwrap()), 0);
        assert_eq!(seq(rx.recv().await.unwrap()), 1);
        let mut rest = Vec::new();
        while let Ok(e) = rx.try_recv() {
            rest.push(seq(e));
        }
        assert_eq!(rest, [2, 3, 4, 5, 6]);
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
        drop(tx);
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Disconnected)));
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn recv_many_takes_what_is_waiting_up_to_its_limit() {
        let (tx, mut rx) = channel();
        tx.send_all((0..5).map(stored).collect()).unwrap();
        tx.send(stored(5)).unwrap();
        let mut buf = Vec::new();
        assert_eq!(rx.recv_many(&mut buf, 4).await, 4);
        assert_eq!(rx.recv_many(&mut buf, 10).await, 2);
        assert_eq!(
            buf.into_iter().map(seq).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4, 5]
        );
        drop(tx);
        assert_eq!(rx.recv_many(&mut Vec::new(), 10).await, 0);
    }

    /// The batch taken early is handed out next, by every way of receiving, even once the channel is empty or closed.
    #[tokio::test]
    async fn the_batch_taken_early_comes_next_whichever_way_events_are_taken() {
        async fn soon<F: std::future::Future>(f: F) -> F::Output {
            tokio::time::timeout(std::time::Duration::from_secs(5), f)
                .await
                .expect("an event that is there is handed out without waiting")
        }
        let (tx, mut rx) = channel();
        tx.send_all((0..2).map(stored).collect()).unwrap();
        tx.send_all((2..4).map(stored).collect()).unwrap();
        tx.send_all((4..6).map(stored).collect()).unwrap();
        assert_eq!(seq(rx.try_recv().unwrap()), 0);
        assert_eq!(seq(rx.try_recv().unwrap()), 1);
        // The channel itself is empty now: the last batch is the one taken early.
        assert_eq!(seq(soon(rx.recv()).await.unwrap()), 2);
        assert_eq!(seq(rx.try_recv().unwrap()), 3);
        let mut buf = Vec::new();
        assert_eq!(soon(rx.recv_many(&mut buf, 10)).await, 2);
        assert_eq!(buf.into_iter().map(seq).collect::<Vec<_>>(), [4, 5]);
        tx.send(stored(6)).unwrap();
        tx.send_all((7..9).map(stored).collect()).unwrap();
        drop(tx);
        assert_eq!(seq(rx.try_recv().unwrap()), 6);
        let rest: Vec<u64> = std::iter::from_fn(|| rx.try_recv().ok()).map(seq).collect();
        assert_eq!(rest, [7, 8]);
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Disconnected)));
        assert!(soon(rx.recv()).await.is_none());
    }

    #[tokio::test]
    async fn a_closed_receiver_refuses_later_sends_and_keeps_what_was_sent() {
        let (tx, mut rx) = channel();
        tx.send_all((0..3).map(stored).collect()).unwrap();
        rx.close();
        assert!(tx.is_closed());
        assert!(matches!(tx.send(stored(3)), Err(Closed)));
        let got: Vec<u64> = std::iter::from_fn(|| rx.try_recv().ok()).map(seq).collect();
        assert_eq!(got, [0, 1, 2]);
    }
}
