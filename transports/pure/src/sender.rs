//! The device side of one link, sans-IO: orders, subscriptions and publishes in; datagrams and events out.
//!
//! A device keeps an outbox of frames not yet sent and a window of frames in flight (orders, subscribes, QoS 1
//! publishes), re-sent on the adaptive timer of [`crate::flow`] until answered. Frames leave as soon as the window has
//! room, so a backlog drains as answers come in, not on a timer. QoS 0 publishes are sealed and sent once, never
//! kept. Deliveries from the receiver are opened, told apart from repeats by their number, reported once, and (QoS 1)
//! answered every time they arrive, as the receiver answers records.
//!
//! Subscriptions are soft state at the receiver: the device sends each again every [`SenderConfig::refresh`], and at
//! once when an answer shows a receiver run it has not seen (the receiver restarted and forgot them). The receiver
//! takes subscribes and QoS 1 publishes only when sealed for its current run and answers the others with that run;
//! the device then sends them again, as new frames, for the run it now knows. A subscribe the receiver refuses (the
//! device has as many channels as the relay keeps) is answered with a refusal: final, as any answer, and the device
//! stops asking for that channel.
//!
//! Every input takes `now`; the driver (or a test with a virtual clock) asks [`Sender::poll_timeout`] when to call
//! [`Sender::handle_timeout`].

use crate::crypto::{
    check_public, link_secret, put_record, AnswerKey, DeliverKeys, LowOrderKey, NodeKey, Sealer,
    WireKeys,
};
use crate::flow::{Flight, Flow, FlowConfig, ReplayWindow, Seen, Sent, Slot, REPLAY_WINDOW};
use crate::wire::{self, Frame, Head, Kind, Op, Record, ENC_LEN, MAX_DATAGRAM};
use rand::rngs::StdRng;
use rand::Rng;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transport_core::{Counters, Order, OrderId, QoS};

/// Receiver runs a device remembers having left: it never goes back to one (an answer from one is a replay or a
/// straggler from before a restart).
const RUNS_REMEMBERED: usize = 8;

/// How a device's link behaves.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// How frames are sealed.
    pub kind: Kind,
    /// The re-send timer and window.
    pub flow: FlowConfig,
    /// How often each subscription is sent again.
    pub refresh: Duration,
    /// Orders go in bundles, one seal for the orders of a datagram and one answer bundle back (where the kind
    /// bundles: [`Kind::bundles`]); false: every order a record of its own.
    pub bundles: bool,
}

impl SenderConfig {
    /// The suite's defaults: [`FlowConfig::default`], subscriptions refreshed every 5 s, orders in bundles where the
    /// kind allows.
    pub fn new(kind: Kind) -> SenderConfig {
        SenderConfig {
            kind,
            flow: FlowConfig::default(),
            refresh: Duration::from_secs(5),
            bundles: kind.bundles(),
        }
    }
}

/// What a sender reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SenderEvent {
    /// The receiver answered that this order is stored (reported once).
    Stored(OrderId),
    /// The receiver answered a subscribe to this channel (at the first subscribe and every refresh).
    Subscribed(u32),
    /// The receiver refused a subscribe to this channel (over its bound of channels per device): the device no longer
    /// asks for it (unless another subscribe to it is still unanswered).
    Refused(u32),
    /// A published message left: answered by the receiver (QoS 1) or handed to the driver (QoS 0). Reported once.
    Accepted(u64),
    /// A message arrived on a subscribed channel (reported once per message; repeats are answered, not reported).
    Delivered {
        /// The channel.
        channel: u32,
        /// The message's id.
        id: u64,
    },
}

/// Why a message cannot be published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// The payload does not fit in one datagram.
    #[error(
        "a payload of {size} bytes does not fit in one datagram (at most {max} for this variant)"
    )]
    TooLarge {
        /// The payload's size.
        size: usize,
        /// The largest that fits.
        max: usize,
    },
}

/// Frames not yet in flight, in the order they were handed over: single frames, and backlogs of orders handed over
/// at once. A backlog stays in the vector it came in and is taken from it as the window opens, so handing over a
/// million orders copies none of them (a copy into the outbox was a move and fresh memory per order).
#[derive(Default)]
struct Outbox {
    queue: VecDeque<Queued>,
    /// Frames in it, the orders of backlogs counted one by one.
    len: usize,
}

enum Queued {
    One(Item),
    Orders(std::vec::IntoIter<Order>),
}

impl Outbox {
    fn len(&self) -> usize {
        self.len
    }

    fn push_back(&mut self, item: Item) {
        self.len += 1;
        self.queue.push_back(Queued::One(item));
    }

    fn push_front(&mut self, item: Item) {
        self.len += 1;
        self.queue.push_front(Queued::One(item));
    }

    fn push_orders(&mut self, orders: Vec<Order>) {
        if !orders.is_empty() {
            self.len += orders.len();
            self.queue.push_back(Queued::Orders(orders.into_iter()));
        }
    }

    fn pop_front(&mut self) -> Option<Item> {
        let item = match self.queue.front_mut()? {
            Queued::One(_) => match self.queue.pop_front() {
                Some(Queued::One(item)) => item,
                _ => unreachable!("looked at above"),
            },
            Queued::Orders(orders) => {
                let order = orders
                    .next()
                    .expect("a backlog in the queue is never empty");
                if orders.len() == 0 {
                    self.queue.pop_front();
                }
                Item::Order(order)
            }
        };
        self.len -= 1;
        Some(item)
    }

    /// Up to `max` orders of a backlog at the front, each handed to `put` in order (none if the front is a single
    /// frame or nothing waits).
    fn take_orders(&mut self, max: usize, mut put: impl FnMut(Order)) {
        let Some(Queued::Orders(orders)) = self.queue.front_mut() else {
            return;
        };
        let taken = max.min(orders.len());
        // The backlog was made before the run and has left the caches: each order is asked for `ORDERS_AHEAD`
        // orders before it is taken, and its payload (read when the frame is sealed, soon after) `PAYLOADS_AHEAD`
        // before, when the order that points at it has come in. A few ahead, not a turn's worth at once: the core
        // keeps only so many misses in flight, and hints beyond that wait for room.
        for order in orders.as_slice().iter().take(ORDERS_AHEAD) {
            transport_core::prefetch::prefetch_all(order);
        }
        for _ in 0..taken {
            let ahead = orders.as_slice();
            if let Some(order) = ahead.get(ORDERS_AHEAD) {
                transport_core::prefetch::prefetch_all(order);
            }
            if let Some(order) = ahead.get(PAYLOADS_AHEAD) {
                transport_core::prefetch::prefetch(order.payload.as_ptr());
            }
            put(orders.next().expect("taken is at most what is left"));
        }
        if orders.len() == 0 {
            self.queue.pop_front();
        }
        self.len -= taken;
    }

    /// The single frames waiting (a backlog holds only orders).
    fn items(&self) -> impl Iterator<Item = &Item> {
        self.queue.iter().filter_map(|q| match q {
            Queued::One(item) => Some(item),
            Queued::Orders(_) => None,
        })
    }
}

/// What a frame in flight carries.
enum Item {
    Order(Order),
    Subscribe {
        channel: u32,
        qos: QoS,
    },
    Publish {
        channel: u32,
        id: u64,
        payload: Arc<[u8]>,
    },
}

impl Item {
    /// The sender run it goes on: an order's own, the publish/subscribe wire's for the others (0 before it has one).
    fn run(&self, pubsub_run: Option<u64>) -> u64 {
        match self {
            Item::Order(o) => o.id.run,
            _ => pubsub_run.unwrap_or(0),
        }
    }

    fn op(&self) -> Op {
        match self {
            Item::Order(_) => Op::Order,
            Item::Subscribe { .. } => Op::Subscribe,
            Item::Publish { .. } => Op::Publish1,
        }
    }
}

/// A frame in flight: its item, the receiver run it was last sent for, and (records of their own) its sealed
/// bytes.
///
/// Small on purpose: a device keeps a window of these, and an answer reads each a round trip after it was written,
/// when it has left the caches; an entry of the table in flight fits two cache lines (see [`crate::flow::Flight`]).
struct Out {
    item: Item,
    /// The receiver run the frame was last sealed for (none: not sent yet).
    sent_for: Option<u64>,
    /// A record of its own keeps its sealed bytes for a re-send; a bundle's entry is sealed again in each bundle.
    /// Boxed: orders in bundles (most frames) move and wait without it.
    sealed: Option<Box<Sealed>>,
}

/// A record of its own, as sealed.
struct Sealed {
    /// Its bytes, sent again as they are.
    frame: Vec<u8>,
    /// Per-request records: the keys of its own setup, which tag its answer.
    own_keys: Option<WireKeys>,
}

impl Out {
    /// A frame not sent yet.
    fn new(item: Item) -> Out {
        Out {
            item,
            sent_for: None,
            sealed: None,
        }
    }
}

/// What an answer did to the frame it names.
enum Taken {
    /// Nothing: no such frame in flight, not sent yet, or of another sender run.
    No,
    /// A subscribe or publish sealed for another receiver run than the answer's (or answered from a run the device
    /// has left): left in flight.
    OtherRun,
    /// Taken out of the frames in flight.
    Yes {
        /// What to report.
        event: SenderEvent,
        /// The channel of a subscribe refused.
        refused_channel: Option<u32>,
        /// When it was sent, if it was sent only once (its round trip ends now).
        sent_once: Option<Sent>,
    },
}

struct Session {
    run: u64,
    /// The receiver run the keys were derived for (`Link` only).
    receiver_run: u64,
    enc: [u8; ENC_LEN],
    keys: WireKeys,
    /// The verified answer key of the receiver run last answered from.
    answer: Option<AnswerKey>,
    /// The delivery keys of the receiver run the device knows.
    deliver: Option<DeliverKeys>,
}

/// One device's link to one receiver.
pub struct Sender {
    config: SenderConfig,
    key: NodeKey,
    key_id: wire::KeyId,
    receiver: [u8; 32],
    rng: StdRng,
    counters: Arc<Counters>,
    link_secret: Option<[u8; 32]>,
    /// The sessions (or link keys) of at most two sender runs: the orders' and the publish/subscribe wire's.
    sessions: Vec<Session>,
    /// The receiver run the device knows (0: none yet), and those it has left.
    receiver_run: u64,
    left_runs: VecDeque<u64>,
    /// The sender run of subscribes, publishes and deliveries: chosen at the first of them.
    pubsub_run: Option<u64>,
    outbox: Outbox,
    flight: Flight<(Op, u64), Out>,
    /// The next number of each op's count (orders are numbered by their seq).
    next: [u64; 6],
    flow: Flow,
    publish0: VecDeque<(u32, u64, Arc<[u8]>)>,
    subscriptions: Vec<(u32, QoS)>,
    refresh_at: Option<Instant>,
    /// Deliveries seen from the receiver run the device knows: QoS 0, QoS 1.
    delivered: [ReplayWindow; 2],
    /// Answers to deliveries, waiting to be sent.
    answers: Vec<u8>,
    events: VecDeque<SenderEvent>,
    /// The sealed records of answered frames, reused for the next records sealed (at most [`SPARE_FRAMES`]): a
    /// record in flight keeps its sealed bytes for a re-send, and taking their buffers from here saves two
    /// allocations per record. Boxes, not their contents: each goes back into a frame in flight as it is.
    #[allow(clippy::vec_box)]
    spare: Vec<Box<Sealed>>,
    /// The number of the next bundle: one count for all of this device's sessions, from a random start, so that no
    /// number is sealed twice under one key (see `docs/pure.md`).
    next_bundle: u64,
    /// The plaintext of the bundle being built, kept between datagrams.
    entries: Vec<u8>,
}

/// How far ahead of the one taken the next orders of a backlog, their payloads, and the entries an answer names are
/// asked for from memory (see [`transport_core::prefetch`]): about as many lines as a core has misses in flight.
const ORDERS_AHEAD: usize = 16;
const PAYLOADS_AHEAD: usize = 8;
const ENTRIES_AHEAD: usize = 8;

/// Answered frames' buffers a sender keeps for reuse: a window's worth of the default flow.
const SPARE_FRAMES: usize = 256;

impl Sender {
    /// A device with key `key` sending to the receiver whose public key is `receiver`; a receiver key of small
    /// order is refused (nothing sealed for it would be secret).
    pub fn new(
        config: SenderConfig,
        key: NodeKey,
        receiver: [u8; 32],
        rng: StdRng,
        counters: Arc<Counters>,
    ) -> Result<Sender, LowOrderKey> {
        check_public(&receiver)?;
        let key_id = key.key_id();
        let flow = Flow::new(config.flow);
        let mut rng = rng;
        let next_bundle = rng.next_u64();
        Ok(Sender {
            config,
            key,
            key_id,
            receiver,
            rng,
            counters,
            link_secret: None,
            sessions: Vec::with_capacity(2),
            receiver_run: 0,
            left_runs: VecDeque::new(),
            pubsub_run: None,
            outbox: Outbox::default(),
            flight: Flight::default(),
            next: [0; 6],
            flow,
            publish0: VecDeque::new(),
            subscriptions: Vec::new(),
            refresh_at: None,
            delivered: Default::default(),
            answers: Vec::new(),
            events: VecDeque::new(),
            spare: Vec::new(),
            next_bundle,
            entries: Vec::new(),
        })
    }

    /// This device's key id (how answers and deliveries are routed to it).
    pub fn key_id(&self) -> wire::KeyId {
        self.key_id
    }

    /// The receiver run the device knows (0 before the first answer).
    pub fn receiver_run(&self) -> u64 {
        self.receiver_run
    }

    /// The channels this device asks for and refreshes, with their QoS: those of every `subscribe`, less those
    /// refused.
    pub fn subscriptions(&self) -> &[(u32, QoS)] {
        &self.subscriptions
    }

    /// Frames handed over and not yet answered (or, QoS 0 publishes, not yet sent).
    pub fn pending(&self) -> usize {
        self.outbox.len() + self.flight.len() + self.publish0.len()
    }

    /// Whether order `id` has gone out (in a record or a bundle) and waits for its answer.
    pub fn sent(&self, id: &OrderId) -> bool {
        self.flight
            .get(&(Op::Order, id.seq))
            .is_some_and(|out| out.sent_for.is_some() && self.run_of(&out.item) == id.run)
    }

    /// Hand over an order. All orders of one device share one sender run (`id.run`); a new run starts a new session.
    pub fn push(&mut self, now: Instant, order: Order) {
        self.outbox.push_back(Item::Order(order));
        self.fill_window(now);
    }

    /// Hand over a backlog of orders at once: the same as [`Sender::push`] for each, in order.
    pub fn push_all(&mut self, now: Instant, orders: impl IntoIterator<Item = Order>) {
        // A vector handed over is kept as it is (collecting its own iterator reuses its allocation).
        self.outbox.push_orders(orders.into_iter().collect());
        self.fill_window(now);
    }

    /// Subscribe to `channel` at `qos` (again, if already subscribed: the new QoS replaces the old one).
    pub fn subscribe(&mut self, now: Instant, channel: u32, qos: QoS) {
        match self.subscriptions.iter_mut().find(|(c, _)| *c == channel) {
            Some(s) => s.1 = qos,
            None => self.subscriptions.push((channel, qos)),
        }
        self.pubsub_run();
        self.outbox.push_back(Item::Subscribe { channel, qos });
        self.refresh_at.get_or_insert(now + self.config.refresh);
        self.fill_window(now);
    }

    /// Publish message `id` on `channel`. QoS 1: re-sent until the receiver answers; QoS 0: sent once.
    pub fn publish(
        &mut self,
        now: Instant,
        channel: u32,
        id: u64,
        qos: QoS,
        payload: Arc<[u8]>,
    ) -> Result<(), PublishError> {
        let max = wire::max_payload(self.config.kind, Op::publish(qos));
        if payload.len() > max {
            return Err(PublishError::TooLarge {
                size: payload.len(),
                max,
            });
        }
        self.pubsub_run();
        match qos {
            QoS::AtMostOnce => self.publish0.push_back((channel, id, payload)),
            QoS::AtLeastOnce => self.outbox.push_back(Item::Publish {
                channel,
                id,
                payload,
            }),
        }
        self.fill_window(now);
        Ok(())
    }

    fn pubsub_run(&mut self) -> u64 {
        match self.pubsub_run {
            Some(run) => run,
            None => {
                let mut run = 0;
                while run == 0 {
                    run = self.rng.next_u64();
                }
                self.pubsub_run = Some(run);
                run
            }
        }
    }

    fn run_of(&self, item: &Item) -> u64 {
        item.run(self.pubsub_run)
    }

    fn fill_window(&mut self, now: Instant) {
        let rto = self.flow.rto();
        loop {
            let room = self.flow.room_for(self.flight.len());
            if room == 0 {
                break;
            }
            let (op, seq) = match self.outbox.queue.front() {
                None => break,
                // A backlog of orders: as many as the window has room for, in one pass (orders carry their numbers,
                // so nothing is checked per order).
                Some(Queued::Orders(_)) => {
                    let flight = &mut self.flight;
                    self.outbox.take_orders(room, |order| {
                        let key = (Op::Order, order.id.seq);
                        flight.insert(now, key, Out::new(Item::Order(order)), rto);
                    });
                    continue;
                }
                Some(Queued::One(Item::Order(o))) => (Op::Order, Some(o.id.seq)),
                Some(Queued::One(item)) => (item.op(), None),
            };
            let number = match seq {
                Some(seq) => seq,
                None => {
                    let n = self.next[op as usize];
                    let oldest = self.flight.first_in((op, 0)..=(op, u64::MAX));
                    if oldest.is_some_and(|(_, oldest)| n >= oldest + REPLAY_WINDOW) {
                        // The receiver's window would not tell this number from one it has already seen.
                        break;
                    }
                    self.next[op as usize] += 1;
                    n
                }
            };
            let item = self.outbox.pop_front().expect("looked at above");
            self.flight.insert(now, (op, number), Out::new(item), rto);
        }
    }

    /// Take in a datagram from the receiver.
    pub fn handle(&mut self, now: Instant, datagram: &[u8]) {
        for frame in wire::frames(datagram) {
            match frame {
                Ok(Frame::Answer(a)) if a.op != Op::Deliver1 => self.answer(now, &a),
                Ok(Frame::AnswerBundle(b)) => self.answer_bundle(now, &b),
                Ok(Frame::Record(r)) if r.op.to_device() => self.delivery(&r),
                _ => {
                    Counters::inc(&self.counters.refused_malformed);
                    break;
                }
            }
        }
        self.fill_window(now);
    }

    fn answer(&mut self, now: Instant, a: &wire::Answer<'_>) {
        if a.kind != self.config.kind || a.key_id != self.key_id {
            Counters::inc(&self.counters.refused_malformed);
            return;
        }
        let key = (a.op, a.seq);
        let Some(out) = self.flight.get(&key) else {
            return;
        };
        if self.run_of(&out.item) != a.run || out.sent_for.is_none() {
            return;
        }
        if self.config.kind.sealed() {
            let verified = match out.sealed.as_ref().and_then(|s| s.own_keys.as_ref()) {
                Some(own) => own
                    .answer_key(a.receiver_run)
                    .verify(a.op, a.seq, a.header, a.tag),
                None => self.verify(a.run, a.receiver_run, a.op, a.seq, a.header, a.tag),
            };
            if !verified {
                Counters::inc(&self.counters.refused_forged);
                return;
            }
        }
        self.answered(now, a.op, a.seq, a.run, a.receiver_run, a.refused);
    }

    /// An answer bundle: one tag for all its orders, each then taken as an answer frame of its own would be, with
    /// one round-trip sample and one look at the receiver run for the whole bundle.
    fn answer_bundle(&mut self, now: Instant, b: &wire::AnswerBundle<'_>) {
        if b.kind != self.config.kind || !b.kind.bundles() || b.key_id != self.key_id {
            Counters::inc(&self.counters.refused_malformed);
            return;
        }
        if self.config.kind.sealed()
            && !self.verify(b.run, b.receiver_run, Op::Bundle, b.number, b.header, b.tag)
        {
            Counters::inc(&self.counters.refused_forged);
            return;
        }
        let left = self.left_runs.contains(&b.receiver_run);
        // The entries the answer names are asked for a few ahead of each take, as many as the core keeps misses
        // in flight: asked for all at once, the hints themselves waited for room.
        self.flight.prefetch_oldest(ENTRIES_AHEAD.min(b.len()));
        // The round trip of the frame sent last of those sent once: the one sample this answer gives.
        let (mut taken, mut last_sent) = (0, None::<Sent>);
        for (k, seq) in b.seqs().enumerate() {
            if k + ENTRIES_AHEAD < b.len() {
                // The oldest still in flight is the next one named, when answers come in order.
                self.flight.prefetch_at(ENTRIES_AHEAD);
            }
            if let Taken::Yes {
                event, sent_once, ..
            } = self.take_answered((Op::Order, seq), b.run, b.receiver_run, left, false)
            {
                taken += 1;
                last_sent = last_sent.max(sent_once);
                self.events.push_back(event);
            }
        }
        if taken > 0 {
            let rtt = last_sent.map(|sent| self.flight.round_trip(now, sent));
            self.flow.answered_many(taken, rtt);
            if !left {
                self.learn_run(b.receiver_run);
            }
        }
    }

    /// Whether `tag` is the answer key's tag of (`op`, `number`) over `header`, with the answer key of receiver run
    /// `receiver_run` on the wire of sender run `run` (derived once per receiver run, then kept).
    fn verify(
        &mut self,
        run: u64,
        receiver_run: u64,
        op: Op,
        number: u64,
        header: &[u8],
        tag: &[u8],
    ) -> bool {
        let Some(s) = self.sessions.iter_mut().find(|s| s.run == run) else {
            return false;
        };
        match &s.answer {
            // The answer key of this receiver run, kept from the last answer: nothing derived.
            Some(k) if k.run() == receiver_run => k.verify(op, number, header, tag),
            _ => {
                let k = s.keys.answer_key(receiver_run);
                let ok = k.verify(op, number, header, tag);
                if ok {
                    s.answer = Some(k);
                }
                ok
            }
        }
    }

    /// A verified answer to the frame (`op`, `number`) of sender run `run`: taken if that frame is in flight and was
    /// sent.
    fn answered(
        &mut self,
        now: Instant,
        op: Op,
        number: u64,
        run: u64,
        receiver_run: u64,
        refused: bool,
    ) {
        let left = self.left_runs.contains(&receiver_run);
        match self.take_answered((op, number), run, receiver_run, left, refused) {
            Taken::No => {}
            Taken::OtherRun => {
                // Not taken: the receiver takes subscribes and publishes sealed for its current run only. A run the
                // device has left says nothing; a new one is learned, and everything sealed for another is sent
                // again.
                if !left {
                    self.learn_run(receiver_run);
                }
            }
            Taken::Yes {
                event,
                refused_channel,
                sent_once,
            } => {
                self.flow
                    .answered(sent_once.map(|sent| self.flight.round_trip(now, sent)));
                if !left {
                    self.learn_run(receiver_run);
                }
                if let Some(channel) = refused_channel {
                    // Not refreshed any more: a refresh would only be refused again.
                    if !self.subscribing(channel) {
                        self.subscriptions.retain(|(c, _)| *c != channel);
                    }
                }
                self.events.push_back(event);
            }
        }
    }

    /// Take the frame `key` of sender run `run` out of the frames in flight, answered from receiver run
    /// `receiver_run` (`left`: one the device has left), if it is there and was sent (subscribes and publishes: for
    /// that receiver run). One lookup; the frame's sealed bytes go to the spare buffers.
    fn take_answered(
        &mut self,
        key: (Op, u64),
        run: u64,
        receiver_run: u64,
        left: bool,
        refused: bool,
    ) -> Taken {
        let pubsub_run = self.pubsub_run;
        let spare = &mut self.spare;
        let mut other_run = false;
        let taken = self.flight.remove_with(&key, |out| {
            let sealed_for = out.sent_for.filter(|_| out.item.run(pubsub_run) == run)?;
            if key.0 != Op::Order && (left || sealed_for != receiver_run) {
                other_run = true;
                return None;
            }
            if let Some(sealed) = out.sealed.take() {
                if spare.len() < SPARE_FRAMES {
                    spare.push(sealed);
                }
            }
            Some(match &out.item {
                Item::Order(o) => (SenderEvent::Stored(o.id), None),
                Item::Subscribe { channel, .. } if refused => {
                    (SenderEvent::Refused(*channel), Some(*channel))
                }
                Item::Subscribe { channel, .. } => (SenderEvent::Subscribed(*channel), None),
                Item::Publish { id, .. } => (SenderEvent::Accepted(*id), None),
            })
        });
        match taken {
            Some(((event, refused_channel), sent_once)) => Taken::Yes {
                event,
                refused_channel,
                sent_once,
            },
            None if other_run => Taken::OtherRun,
            None => Taken::No,
        }
    }

    /// A verified answer named receiver run `run`. If it is new, the receiver restarted: records sealed from now on
    /// name it, the deliveries of the old run are forgotten, and the subscriptions it lost are sent again.
    fn learn_run(&mut self, run: u64) {
        if run == self.receiver_run {
            return;
        }
        if self.receiver_run != 0 {
            if self.left_runs.len() == RUNS_REMEMBERED {
                self.left_runs.pop_front();
            }
            self.left_runs.push_back(self.receiver_run);
        }
        self.receiver_run = run;
        self.delivered = Default::default();
        // Subscribes and publishes sealed for another run are not taken by this one: they go out again as new
        // frames, with new numbers (a number is never sealed twice with different contents under one key).
        let stale = self
            .flight
            .drain_where(|(op, _), out| *op != Op::Order && out.sent_for.is_some_and(|r| r != run));
        for out in stale.into_iter().rev() {
            self.outbox.push_front(out.item);
        }
        for (channel, qos) in self.subscriptions.clone() {
            if !self.subscribing(channel) {
                self.outbox.push_back(Item::Subscribe { channel, qos });
            }
        }
    }

    /// Whether a subscribe to `channel` is waiting or in flight.
    fn subscribing(&self, channel: u32) -> bool {
        let is = |item: &Item| matches!(item, Item::Subscribe { channel: c, .. } if *c == channel);
        self.outbox.items().any(is) || self.flight.items().any(|(_, out)| is(&out.item))
    }

    fn delivery(&mut self, r: &Record<'_>) {
        if r.kind != self.config.kind || r.key_id != self.key_id {
            Counters::inc(&self.counters.refused_malformed);
            return;
        }
        let Some(receiver_run) = r.receiver_run() else {
            return;
        };
        // Only deliveries on the device's publish/subscribe wire, from the receiver run it knows: a QoS 1 delivery
        // from a run not learned yet is re-sent until the device has learned it from an answer.
        if self.pubsub_run != Some(r.run) || receiver_run != self.receiver_run {
            return;
        }
        let keys = match self.config.kind {
            Kind::Plain => None,
            Kind::HpkePerRequest => {
                let Some(enc) = r.enc().filter(|enc| check_public(enc).is_ok()) else {
                    Counters::inc(&self.counters.refused_forged);
                    return;
                };
                // The delivery's own setup: two X25519.
                Counters::add(&self.counters.x25519, 2);
                Counters::inc(&self.counters.key_derivations);
                match WireKeys::hpke_delivery_receiver(&self.key, &self.receiver, enc) {
                    Ok(k) => Some(k.deliver_keys(receiver_run)),
                    Err(_) => {
                        Counters::inc(&self.counters.refused_forged);
                        return;
                    }
                }
            }
            Kind::HpkeSession | Kind::Link => {
                let Some(s) = self.sessions.iter_mut().find(|s| s.run == r.run) else {
                    return;
                };
                if s.deliver.as_ref().map(|d| d.run()) != Some(receiver_run) {
                    Counters::inc(&self.counters.key_derivations);
                    s.deliver = Some(s.keys.deliver_keys(receiver_run));
                }
                s.deliver.clone()
            }
        };
        let plain = match &keys {
            Some(k) => match k.open(r.op, r.seq, r.header, r.body) {
                Ok(p) => p,
                Err(_) => {
                    Counters::inc(&self.counters.refused_forged);
                    return;
                }
            },
            None => r.body.to_vec(),
        };
        let (Some(channel), Some(id)) = (
            plain.first_chunk::<4>().map(|c| u32::from_be_bytes(*c)),
            plain
                .get(4..12)
                .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes"))),
        ) else {
            Counters::inc(&self.counters.refused_malformed);
            return;
        };
        let qos1 = r.op == Op::Deliver1;
        if self.delivered[qos1 as usize].take(r.seq) == Seen::New {
            self.events
                .push_back(SenderEvent::Delivered { channel, id });
        }
        if qos1 {
            // Answered every time it arrives: the first answer may have been lost.
            let header = wire::put_answer_header(
                &mut self.answers,
                self.config.kind,
                Op::Deliver1,
                &self.key_id,
                r.run,
                r.seq,
                receiver_run,
            );
            if let Some(k) = &keys {
                let tag = k.answer.tag(Op::Deliver1, r.seq, &self.answers[header]);
                self.answers.extend_from_slice(&tag);
            }
        }
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<SenderEvent> {
        self.events.pop_front()
    }

    /// How many events [`Sender::poll_event`] has waiting.
    pub fn pending_events(&self) -> usize {
        self.events.len()
    }

    /// When [`Sender::handle_timeout`] should be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [self.flight.poll_timeout(), self.refresh_at]
            .into_iter()
            .flatten()
            .min()
    }

    /// Queue the frames whose answer is overdue and back the timer off; send the subscriptions again when due.
    pub fn handle_timeout(&mut self, now: Instant) {
        let expired = self.flight.handle_timeout(now, self.flow.config().max_rto);
        if expired > 0 {
            Counters::add(&self.counters.resent_timeout, expired as u64);
            self.flow.expired();
        }
        if self.refresh_at.is_some_and(|t| t <= now) {
            self.refresh_at = Some(now + self.config.refresh);
            for (channel, qos) in self.subscriptions.clone() {
                if !self.subscribing(channel) {
                    self.outbox.push_back(Item::Subscribe { channel, qos });
                }
            }
            self.fill_window(now);
        }
    }

    /// Fill `buf` with the next datagram (frames packed up to [`MAX_DATAGRAM`]); false when there is nothing to send.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> bool {
        buf.clear();
        if !self.answers.is_empty() {
            // Answers first: small, and the receiver's window for this device waits on them.
            let frame_len = self.config.kind.answer_len();
            let take = self.answers.len().min(MAX_DATAGRAM / frame_len * frame_len);
            buf.extend(self.answers.drain(..take));
        }
        // Where the kind bundles orders, the orders of one sender run go in one bundle at the end of the datagram,
        // sealed once; every other frame is a record of its own.
        let bundles = self.config.bundles && self.config.kind.bundles();
        let mut entries = std::mem::take(&mut self.entries);
        entries.clear();
        let mut bundle_run = None;
        // The bundle's length in the datagram so far (0 while it has no order).
        let kind = self.config.kind;
        let bundled = move |entries: &Vec<u8>| {
            if entries.is_empty() {
                0
            } else {
                wire::bundle_len(kind, entries.len())
            }
        };
        while let Some((key, slot)) = self.flight.next_ready_slot() {
            if bundles && key.0 == Op::Order {
                let out = self.flight.item_at(slot);
                let Item::Order(o) = &out.item else {
                    unreachable!("op 0 is an order")
                };
                if bundle_run.is_some_and(|r| r != o.id.run) {
                    break;
                }
                let grown = if entries.is_empty() {
                    wire::bundle_len(kind, wire::entry_len(o.payload.len()))
                } else {
                    bundled(&entries) + wire::entry_len(o.payload.len())
                };
                // An order too large for a bundle of its own still goes alone (and the receiver refuses it).
                if buf.len() + grown > MAX_DATAGRAM && !(buf.is_empty() && entries.is_empty()) {
                    break;
                }
                wire::put_entry(&mut entries, o.id.seq, o.made_us, &o.payload);
                bundle_run = Some(o.id.run);
                let receiver_run = self.receiver_run;
                self.flight.item_at_mut(slot).sent_for = Some(receiver_run);
                self.flight.sent_slot(now, key, slot);
                continue;
            }
            let out = self.flight.item_at(slot);
            let fresh = match (&out.sealed, out.sent_for) {
                // Link keys depend on the receiver run: an order re-sent after a restart is sealed for the new one.
                (Some(_), Some(run)) => {
                    self.config.kind == Kind::Link && key.0 == Op::Order && run != self.receiver_run
                }
                _ => true,
            };
            if fresh {
                self.seal(key, slot);
            }
            let out = self.flight.item_at(slot);
            let frame = &out.sealed.as_ref().expect("sealed above").frame;
            let used = buf.len() + bundled(&entries);
            if used > 0 && used + frame.len() > MAX_DATAGRAM {
                break;
            }
            buf.extend_from_slice(frame);
            self.flight.sent_slot(now, key, slot);
        }
        while let Some((_, _, payload)) = self.publish0.front() {
            let len = wire::record_len(self.config.kind, Op::Publish0, payload.len());
            let used = buf.len() + bundled(&entries);
            if used > 0 && used + len > MAX_DATAGRAM {
                break;
            }
            let (channel, id, payload) = self.publish0.pop_front().expect("looked at above");
            let run = self.pubsub_run();
            let number = self.next[Op::Publish0 as usize];
            self.next[Op::Publish0 as usize] += 1;
            let (variant, keys) = self.keys_for(run);
            let head = Head {
                kind: self.config.kind,
                op: Op::Publish0,
                key_id: &self.key_id,
                run,
                number,
                variant: variant.as_slice(),
            };
            let fields = publish_fields(self.receiver_run, channel, id);
            put_record(buf, &head, sealer(&keys), &fields, &payload);
            self.events.push_back(SenderEvent::Accepted(id));
        }
        if let Some(run) = bundle_run {
            let number = self.next_bundle;
            self.next_bundle = number.wrapping_add(1);
            let (variant, keys) = self.keys_for(run);
            let head = Head {
                kind: self.config.kind,
                op: Op::Bundle,
                key_id: &self.key_id,
                run,
                number,
                variant: variant.as_slice(),
            };
            put_record(buf, &head, sealer(&keys), &[], &entries);
        }
        self.entries = entries;
        !buf.is_empty()
    }

    fn seal(&mut self, key: (Op, u64), slot: Slot) {
        let (op, number) = key;
        let run = self.run_of(&self.flight.item_at(slot).item);
        let (variant, keys) = self.keys_for(run);
        let out = self.flight.item_at(slot);
        let mut buf = [0u8; 20];
        let (fields, payload) = item_fields(&out.item, self.receiver_run, &mut buf);
        let head = Head {
            kind: self.config.kind,
            op,
            key_id: &self.key_id,
            run,
            number,
            variant: variant.as_slice(),
        };
        let mut sealed = self.spare.pop().unwrap_or_else(|| {
            Box::new(Sealed {
                frame: Vec::new(),
                own_keys: None,
            })
        });
        sealed.frame.clear();
        sealed
            .frame
            .reserve(wire::record_len(self.config.kind, op, payload.len()));
        put_record(&mut sealed.frame, &head, sealer(&keys), fields, payload);
        // The answer to a per-request record is tagged with a key of its own setup.
        sealed.own_keys = keys.filter(|_| self.config.kind == Kind::HpkePerRequest);
        let rrun = self.receiver_run;
        let out = self.flight.item_at_mut(slot);
        out.sealed = Some(sealed);
        out.sent_for = Some(rrun);
    }

    /// The variant header of a record on sender run `run`, and the keys it is sealed with (none for plain).
    fn keys_for(&mut self, run: u64) -> (Variant, Option<WireKeys>) {
        match self.config.kind {
            Kind::Plain => (Variant::new(&[]), None),
            Kind::HpkePerRequest => {
                Counters::add(&self.counters.x25519, 3);
                let (enc, keys) = WireKeys::hpke_sender(&mut self.rng, &self.key, &self.receiver);
                (Variant::new(&enc), Some(keys))
            }
            Kind::HpkeSession => {
                let i = self.session_for(run);
                let s = &self.sessions[i];
                (Variant::new(&s.enc), Some(s.keys.clone()))
            }
            Kind::Link => {
                let i = self.session_for(run);
                let s = &self.sessions[i];
                (
                    Variant::new(&self.receiver_run.to_be_bytes()),
                    Some(s.keys.clone()),
                )
            }
        }
    }

    /// The session (HPKE) or link keys of sender run `run`, made if needed; returns its index.
    fn session_for(&mut self, run: u64) -> usize {
        let kind = self.config.kind;
        if let Some(i) = self.sessions.iter().position(|s| s.run == run) {
            let s = &mut self.sessions[i];
            if kind == Kind::Link && s.receiver_run != self.receiver_run {
                // A new receiver run: the record key for it, two HKDFs (the answer secret stays).
                Counters::inc(&self.counters.key_derivations);
                s.keys = WireKeys::link(
                    &self.link_secret.expect("set with the session"),
                    run,
                    self.receiver_run,
                );
                s.receiver_run = self.receiver_run;
            }
            return i;
        }
        let (enc, keys) = match kind {
            Kind::HpkeSession => {
                Counters::add(&self.counters.x25519, 3);
                WireKeys::hpke_sender(&mut self.rng, &self.key, &self.receiver)
            }
            _ => {
                let secret = match self.link_secret {
                    Some(s) => s,
                    None => {
                        Counters::inc(&self.counters.x25519);
                        let s = link_secret(
                            &self.key,
                            &self.receiver,
                            self.key.public(),
                            &self.receiver,
                        )
                        .expect("the receiver's key was checked in Sender::new");
                        self.link_secret = Some(s);
                        s
                    }
                };
                Counters::inc(&self.counters.key_derivations);
                (
                    [0; ENC_LEN],
                    WireKeys::link(&secret, run, self.receiver_run),
                )
            }
        };
        if self.sessions.len() == 2 {
            // Keep the publish/subscribe wire's session: its deliveries are opened with it.
            let evict = self
                .sessions
                .iter()
                .position(|s| Some(s.run) != self.pubsub_run)
                .unwrap_or(0);
            self.sessions.remove(evict);
        }
        self.sessions.push(Session {
            run,
            receiver_run: self.receiver_run,
            enc,
            keys,
            answer: None,
            deliver: None,
        });
        self.sessions.len() - 1
    }
}

/// The plaintext of a frame in flight: its op's fixed fields (written into `buf`) and its payload.
fn item_fields<'a>(
    item: &'a Item,
    receiver_run: u64,
    buf: &'a mut [u8; 20],
) -> (&'a [u8], &'a [u8]) {
    match item {
        Item::Order(o) => {
            buf[..8].copy_from_slice(&o.made_us.to_be_bytes());
            (&buf[..8], &o.payload)
        }
        Item::Subscribe { channel, qos } => {
            buf[..8].copy_from_slice(&receiver_run.to_be_bytes());
            buf[8..12].copy_from_slice(&channel.to_be_bytes());
            buf[12] = qos.level();
            (&buf[..13], &[])
        }
        Item::Publish {
            channel,
            id,
            payload,
        } => {
            *buf = publish_fields(receiver_run, *channel, *id);
            (&buf[..], payload)
        }
    }
}

/// A record's variant header, kept on the stack: at most an encapsulated key (HPKE), a receiver run (link), or
/// nothing (plain). Every record sealed needs one, so it is not allocated.
struct Variant {
    bytes: [u8; ENC_LEN],
    len: usize,
}

impl Variant {
    fn new(bytes: &[u8]) -> Variant {
        let mut v = Variant {
            bytes: [0; ENC_LEN],
            len: bytes.len().min(ENC_LEN),
        };
        v.bytes[..v.len].copy_from_slice(&bytes[..v.len]);
        v
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The fixed fields of a publish.
fn publish_fields(receiver_run: u64, channel: u32, id: u64) -> [u8; 20] {
    let mut f = [0u8; 20];
    f[..8].copy_from_slice(&receiver_run.to_be_bytes());
    f[8..12].copy_from_slice(&channel.to_be_bytes());
    f[12..].copy_from_slice(&id.to_be_bytes());
    f
}

/// The sealer of optional keys (none: plain).
fn sealer(keys: &Option<WireKeys>) -> Option<&dyn Sealer> {
    keys.as_ref().map(|k| k as &dyn Sealer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::Entry;

    /// A frame's entry in the table in flight, an order's included, takes exactly two cache lines: an answer reads
    /// it a round trip after it was written, from memory (see `Out`). A field added to `Out` or the entry that
    /// pushes it to a third line shows here rather than as a slower device in a drain.
    #[test]
    fn an_entry_in_flight_takes_two_cache_lines() {
        type InFlight = Option<Entry<(Op, u64), Out>>;
        assert_eq!(std::mem::size_of::<InFlight>(), 128);
        assert_eq!(std::mem::align_of::<InFlight>(), 64);
    }
}
