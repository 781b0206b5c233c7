//! The receiver's publish/subscribe relay, sans-IO: subscriptions, the messages held for each subscriber, and the
//! deliveries sealed on each subscriber's wire.
//!
//! The [`Receiver`](crate::receiver::Receiver) opens subscribes and publishes and hands them here; the relay keeps,
//! per subscribed device, its wire (sender run, source address, how its deliveries are sealed), its channels, and two
//! bounded queues:
//!
//! - **QoS 0**: at most [`RelayConfig::waiting0`] messages waiting to be sent; a message that finds the queue full, or
//!   is not sent within [`RelayConfig::deadline0`] of its publish, is dropped for that subscriber and counted
//!   (`dropped`). Sent once, never re-sent, never answered.
//! - **QoS 1**: at most [`RelayConfig::held`] messages held (waiting and in flight together). A QoS 1 publish is
//!   taken only if every subscriber getting it at QoS 1 has room; otherwise it is not taken and not answered, and the
//!   publisher sends it again on its timer: back-pressure reaches the publisher, nothing is dropped. Deliveries in
//!   flight are re-sent on the same adaptive timer and window a device uses ([`crate::flow`]) until the device
//!   answers.
//!
//! Subscriptions are soft state: lost when the receiver restarts, and dropped (with what is held for them, counted in
//! `dropped`) when not refreshed within [`RelayConfig::expire`]. A subscriber's delivery numbers count on for the
//! whole receiver run, whatever wire it moves to: under one key a number is never sealed twice.

use crate::crypto::{put_record, AnswerKey, DeliverKeys, NodeKey, Sealer, WireKeys};
use crate::flow::{Flight, Flow, FlowConfig, REPLAY_WINDOW};
use crate::wire::{self, Answer, Head, KeyId, Kind, Op, MAX_DATAGRAM};
use rand::rngs::StdRng;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transport_core::{Counters, QoS};

/// The relay's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayConfig {
    /// The re-send timer and window of each subscriber's QoS 1 deliveries (the devices' own).
    pub flow: FlowConfig,
    /// QoS 1 messages held per subscriber, waiting and in flight.
    pub held: usize,
    /// QoS 0 messages waiting per subscriber.
    pub waiting0: usize,
    /// A QoS 0 message not sent within this long of its publish is dropped.
    pub deadline0: Duration,
    /// Channels one device may subscribe to.
    pub channels: usize,
    /// A subscription not refreshed for this long is dropped (three of the devices' refreshes).
    pub expire: Duration,
}

impl Default for RelayConfig {
    fn default() -> RelayConfig {
        RelayConfig {
            flow: FlowConfig::default(),
            held: 1024,
            waiting0: 256,
            deadline0: Duration::from_secs(1),
            channels: 64,
            expire: Duration::from_secs(15),
        }
    }
}

/// How a subscriber's deliveries are sealed.
pub enum Sealing {
    /// Not at all (`pure:plain`).
    Plain,
    /// With the delivery keys of its wire for this receiver run (`pure`, `pure:no-memo`, `pure:hpke-session`).
    Wire(DeliverKeys),
    /// With a setup of its own for each delivery, from the receiver's static key to this device key
    /// (`pure:hpke-per-request`).
    PerDelivery([u8; 32]),
}

/// A device subscribed to more channels than [`RelayConfig::channels`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyChannels;

/// A delivery answer whose tag does not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forged;

#[derive(Clone)]
struct Message {
    /// When it was published.
    at: Instant,
    channel: u32,
    id: u64,
    /// Shared by every subscriber it goes to.
    payload: Arc<[u8]>,
}

struct Delivery {
    message: Message,
    frame: Option<Vec<u8>>,
    /// The answer key of the delivery's own setup (per-delivery sealing).
    answer: Option<AnswerKey>,
}

/// The wire a subscriber's deliveries go on.
struct Wire {
    key_id: KeyId,
    run: u64,
    addr: SocketAddr,
    sealing: Sealing,
}

struct Subscriber {
    wire: Wire,
    channels: Vec<(u32, QoS)>,
    refreshed: Instant,
    /// The next delivery number: QoS 0, QoS 1. Never reset within the receiver run.
    next: [u64; 2],
    waiting1: VecDeque<Message>,
    waiting0: VecDeque<Message>,
    flight: Flight<u64, Delivery>,
    flow: Flow,
    /// The earliest timer queued for it.
    timer: Option<Instant>,
    /// In the relay's queue of subscribers with something to send.
    ready: bool,
}

impl Subscriber {
    fn qos(&self, channel: u32) -> Option<QoS> {
        self.channels
            .iter()
            .find(|(c, _)| *c == channel)
            .map(|(_, q)| *q)
    }

    fn held(&self) -> usize {
        self.waiting1.len() + self.flight.len()
    }

    /// Whether a waiting QoS 1 message may go in flight: the window has room, and its number stays within the
    /// device's replay window of the oldest delivery unanswered.
    fn may_fill(&self) -> bool {
        !self.waiting1.is_empty()
            && self.flow.room(self.flight.len())
            && self
                .flight
                .first_in(..)
                .is_none_or(|oldest| self.next[1] < oldest + REPLAY_WINDOW)
    }

    /// Whether it has something it may send now.
    fn sendable(&self) -> bool {
        self.flight.has_ready() || !self.waiting0.is_empty() || self.may_fill()
    }
}

/// The relay of one receiver run.
pub struct Relay {
    config: RelayConfig,
    kind: Kind,
    key: NodeKey,
    run: u64,
    rng: StdRng,
    counters: Arc<Counters>,
    /// By allowed-sender index: at most one per allowed device.
    subscribers: HashMap<usize, Subscriber>,
    channels: HashMap<u32, Vec<usize>>,
    ready: VecDeque<usize>,
    timers: BinaryHeap<Reverse<(Instant, usize)>>,
}

/// The lesser of two QoS levels (a delivery goes at the lesser of the publish's and the subscription's).
fn min_qos(a: QoS, b: QoS) -> QoS {
    if a == QoS::AtLeastOnce && b == QoS::AtLeastOnce {
        QoS::AtLeastOnce
    } else {
        QoS::AtMostOnce
    }
}

impl Relay {
    /// The relay of receiver run `run`, sealing as `kind` with the receiver's key.
    pub fn new(
        config: RelayConfig,
        kind: Kind,
        key: NodeKey,
        run: u64,
        rng: StdRng,
        counters: Arc<Counters>,
    ) -> Relay {
        Relay {
            config,
            kind,
            key,
            run,
            rng,
            counters,
            subscribers: HashMap::new(),
            channels: HashMap::new(),
            ready: VecDeque::new(),
            timers: BinaryHeap::new(),
        }
    }

    /// Devices with a subscription (for tests and memory accounting).
    pub fn subscribers(&self) -> usize {
        self.subscribers
            .values()
            .filter(|s| !s.channels.is_empty())
            .count()
    }

    /// Whether allowed device `index` is subscribed to `channel`.
    pub fn holds(&self, index: usize, channel: u32) -> bool {
        self.subscribers
            .get(&index)
            .is_some_and(|s| s.qos(channel).is_some())
    }

    /// Whether a subscribe of allowed device `index` to `channel` is refused now: the device holds as many channels as
    /// the relay keeps, and not this one.
    pub fn refuses(&self, index: usize, channel: u32) -> bool {
        self.subscribers
            .get(&index)
            .is_some_and(|s| s.qos(channel).is_none() && s.channels.len() >= self.config.channels)
    }

    /// Messages held for subscribers (QoS 1 waiting and in flight, QoS 0 waiting).
    pub fn held(&self) -> usize {
        self.subscribers
            .values()
            .map(|s| s.held() + s.waiting0.len())
            .sum()
    }

    /// Subscribe allowed device `index` (key id `key_id`) to `channel`, its deliveries going to `addr` on its wire
    /// of sender run `run`, sealed as `sealing` says (asked only for a wire not known yet). The caller passes only
    /// subscribes it has not seen before, so a replayed one changes nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn subscribe(
        &mut self,
        now: Instant,
        index: usize,
        key_id: KeyId,
        run: u64,
        sealing: impl FnOnce() -> Sealing,
        addr: SocketAddr,
        channel: u32,
        qos: QoS,
    ) -> Result<(), TooManyChannels> {
        if self.refuses(index, channel) {
            return Err(TooManyChannels);
        }
        let flow = self.config.flow;
        let s = self.subscribers.entry(index).or_insert_with(|| Subscriber {
            wire: Wire {
                key_id,
                run,
                addr,
                sealing: Sealing::Plain,
            },
            channels: Vec::new(),
            refreshed: now,
            next: [0; 2],
            waiting1: VecDeque::new(),
            waiting0: VecDeque::new(),
            flight: Flight::default(),
            flow: Flow::new(flow),
            timer: None,
            ready: false,
        });
        if s.wire.run != run || s.channels.is_empty() {
            // A new wire: the device restarted (or a subscribe of an earlier run came late). Deliveries go on the
            // new one; those in flight on the old one wait again, to be sealed for the new one with new numbers.
            s.wire = Wire {
                key_id,
                run,
                addr,
                sealing: sealing(),
            };
            for d in s.flight.drain_where(|_, _| true).into_iter().rev() {
                s.waiting1.push_front(d.message);
            }
            s.flow = Flow::new(flow);
        }
        s.wire.addr = addr;
        s.refreshed = now;
        match s.channels.iter_mut().find(|(c, _)| *c == channel) {
            Some(c) => c.1 = qos,
            None => {
                s.channels.push((channel, qos));
                self.channels.entry(channel).or_default().push(index);
            }
        }
        if s.sendable() && !s.ready {
            s.ready = true;
            self.ready.push_back(index);
        }
        Ok(())
    }

    /// Relay a message published on `channel`. Returns whether it was taken: a QoS 1 message is not taken when a
    /// subscriber getting it at QoS 1 has no room (the publisher will send it again).
    pub fn publish(
        &mut self,
        now: Instant,
        channel: u32,
        qos: QoS,
        id: u64,
        payload: &[u8],
    ) -> bool {
        let Some(list) = self.channels.get(&channel) else {
            return true;
        };
        let expire = self.config.expire;
        let lapsed = |i: &usize| self.subscribers[i].refreshed + expire <= now;
        if list.iter().any(lapsed) {
            let stale: Vec<usize> = list.iter().copied().filter(lapsed).collect();
            for i in stale {
                self.expire(i);
            }
        }
        let Some(list) = self.channels.get(&channel) else {
            return true;
        };
        let full = |i: &usize| {
            let s = &self.subscribers[i];
            s.qos(channel) == Some(QoS::AtLeastOnce) && s.held() >= self.config.held
        };
        if qos == QoS::AtLeastOnce && list.iter().any(full) {
            return false;
        }
        let message = Message {
            at: now,
            channel,
            id,
            payload: Arc::from(payload),
        };
        for i in list {
            let s = self
                .subscribers
                .get_mut(i)
                .expect("listed subscribers exist");
            let Some(sub_qos) = s.qos(channel) else {
                continue;
            };
            if sub_qos == QoS::AtMostOnce || qos == QoS::AtMostOnce {
                let late = drop_late(&mut s.waiting0, now, self.config.deadline0);
                Counters::add(&self.counters.dropped, late);
            }
            match min_qos(qos, sub_qos) {
                QoS::AtLeastOnce => s.waiting1.push_back(message.clone()),
                QoS::AtMostOnce if s.waiting0.len() < self.config.waiting0 => {
                    s.waiting0.push_back(message.clone())
                }
                QoS::AtMostOnce => {
                    Counters::inc(&self.counters.dropped);
                    continue;
                }
            }
            if s.sendable() && !s.ready {
                s.ready = true;
                self.ready.push_back(*i);
            }
        }
        true
    }

    /// Drop subscriber `index`'s subscriptions and what is held for it (counted as dropped); its numbers stay.
    fn expire(&mut self, index: usize) {
        let Some(s) = self.subscribers.get_mut(&index) else {
            return;
        };
        for (channel, _) in s.channels.drain(..) {
            if let Some(list) = self.channels.get_mut(&channel) {
                list.retain(|i| *i != index);
                if list.is_empty() {
                    self.channels.remove(&channel);
                }
            }
        }
        let lost = s.waiting1.len() + s.waiting0.len() + s.flight.len();
        Counters::add(&self.counters.dropped, lost as u64);
        s.waiting1.clear();
        s.waiting0.clear();
        s.flight = Flight::default();
    }

    /// A device answered a QoS 1 delivery. An answer for another wire or run, or for a delivery not in flight (a
    /// repeat), is ignored; one whose tag does not verify is [`Forged`].
    pub fn answered(&mut self, now: Instant, index: usize, a: &Answer<'_>) -> Result<(), Forged> {
        let Some(s) = self.subscribers.get_mut(&index) else {
            return Ok(());
        };
        if a.run != s.wire.run || a.receiver_run != self.run {
            return Ok(());
        }
        let Some(d) = s.flight.get(&a.seq) else {
            return Ok(());
        };
        let key = match &s.wire.sealing {
            Sealing::Plain => None,
            Sealing::Wire(k) => Some(&k.answer),
            Sealing::PerDelivery(_) => d.answer.as_ref(),
        };
        if self.kind.sealed()
            && !key.is_some_and(|k| k.verify(Op::Deliver1, a.seq, a.header, a.tag))
        {
            return Err(Forged);
        }
        let (_, rtt) = s.flight.remove(now, &a.seq).expect("looked up above");
        s.flow.answered(rtt);
        if s.sendable() && !s.ready {
            s.ready = true;
            self.ready.push_back(index);
        }
        self.reschedule(index);
        Ok(())
    }

    fn reschedule(&mut self, index: usize) {
        let Some(s) = self.subscribers.get_mut(&index) else {
            return;
        };
        if let Some(t) = s.flight.poll_timeout() {
            if s.timer.is_none_or(|x| t < x) {
                s.timer = Some(t);
                self.timers.push(Reverse((t, index)));
            }
        }
    }

    /// When [`Relay::handle_timeout`] should run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((t, _))| *t)
    }

    /// Queue the deliveries whose answer is overdue; drop subscribers that were not refreshed in time.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&Reverse((t, i))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let expire = self.config.expire;
            let Some(s) = self.subscribers.get_mut(&i) else {
                continue;
            };
            if s.timer != Some(t) {
                continue;
            }
            s.timer = None;
            if s.refreshed + expire <= now {
                self.expire(i);
                continue;
            }
            let expired = s.flight.handle_timeout(now, s.flow.config().max_rto);
            if expired > 0 {
                Counters::add(&self.counters.resent_timeout, expired as u64);
                s.flow.expired();
                if !s.ready {
                    s.ready = true;
                    self.ready.push_back(i);
                }
            }
            self.reschedule(i);
        }
    }

    /// Whether a subscriber has something to send.
    pub fn has_output(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Fill `buf` with the next datagram of deliveries and return its destination. Subscribers take turns, one
    /// datagram each.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        buf.clear();
        while let Some(&i) = self.ready.front() {
            self.ready.pop_front();
            let s = self
                .subscribers
                .get_mut(&i)
                .expect("ready subscribers exist");
            // QoS 1 messages go in flight as the window allows, numbered within the device's replay window.
            while s.flow.room(s.flight.len()) && !s.waiting1.is_empty() {
                let n = s.next[1];
                if s.flight
                    .first_in(..)
                    .is_some_and(|oldest| n >= oldest + REPLAY_WINDOW)
                {
                    break;
                }
                s.next[1] += 1;
                let message = s.waiting1.pop_front().expect("not empty");
                let d = Delivery {
                    message,
                    frame: None,
                    answer: None,
                };
                s.flight.insert(now, n, d, s.flow.rto());
            }
            let mut sealer = DeliverySealer {
                kind: self.kind,
                run: self.run,
                key: &self.key,
                rng: &mut self.rng,
                counters: &self.counters,
                wire: &s.wire,
            };
            while let Some(n) = s.flight.next_ready() {
                let d = s.flight.get_mut(&n).expect("ready keys are in flight");
                if d.frame.is_none() {
                    let mut frame = Vec::new();
                    d.answer = sealer.seal(Op::Deliver1, n, &d.message, &mut frame);
                    d.frame = Some(frame);
                }
                let frame = d.frame.as_ref().expect("sealed above");
                if !buf.is_empty() && buf.len() + frame.len() > MAX_DATAGRAM {
                    break;
                }
                buf.extend_from_slice(frame);
                s.flight.sent(now, n);
            }
            let late = drop_late(&mut s.waiting0, now, self.config.deadline0);
            Counters::add(&self.counters.dropped, late);
            while let Some(m) = s.waiting0.front() {
                let len = wire::record_len(self.kind, Op::Deliver0, m.payload.len());
                if !buf.is_empty() && buf.len() + len > MAX_DATAGRAM {
                    break;
                }
                let m = s.waiting0.pop_front().expect("not empty");
                sealer.seal(Op::Deliver0, s.next[0], &m, buf);
                s.next[0] += 1;
            }
            let addr = s.wire.addr;
            if s.sendable() {
                self.ready.push_back(i);
            } else {
                s.ready = false;
            }
            self.reschedule(i);
            if !buf.is_empty() {
                return Some(addr);
            }
        }
        None
    }
}

/// Drop the QoS 0 messages that waited longer than `deadline` (the oldest are first); returns how many.
fn drop_late(waiting: &mut VecDeque<Message>, now: Instant, deadline: Duration) -> u64 {
    let mut late = 0;
    while waiting.front().is_some_and(|m| m.at + deadline <= now) {
        waiting.pop_front();
        late += 1;
    }
    late
}

/// What sealing a delivery on one subscriber's wire needs.
struct DeliverySealer<'a> {
    kind: Kind,
    run: u64,
    key: &'a NodeKey,
    rng: &'a mut StdRng,
    counters: &'a Counters,
    wire: &'a Wire,
}

impl DeliverySealer<'_> {
    /// Append delivery `number` of `op` carrying `m`; returns the answer key of its own setup (per-delivery).
    fn seal(&mut self, op: Op, number: u64, m: &Message, out: &mut Vec<u8>) -> Option<AnswerKey> {
        let mut fields = [0u8; 12];
        fields[..4].copy_from_slice(&m.channel.to_be_bytes());
        fields[4..].copy_from_slice(&m.id.to_be_bytes());
        let mut variant = [0u8; 8 + wire::ENC_LEN];
        variant[..8].copy_from_slice(&self.run.to_be_bytes());
        let own: Option<DeliverKeys> = match &self.wire.sealing {
            Sealing::PerDelivery(device) => {
                // A setup of its own: three X25519 (the ephemeral key, and two agreements in auth mode).
                Counters::add(&self.counters.x25519, 3);
                Counters::inc(&self.counters.key_derivations);
                let (enc, keys) = WireKeys::hpke_delivery_sender(self.rng, self.key, device);
                variant[8..].copy_from_slice(&enc);
                Some(keys.deliver_keys(self.run))
            }
            _ => None,
        };
        let sealer: Option<&dyn Sealer> = match (&self.wire.sealing, &own) {
            (Sealing::Wire(k), _) => Some(k),
            (_, Some(k)) => Some(k),
            _ => None,
        };
        let head = Head {
            kind: self.kind,
            op,
            key_id: &self.wire.key_id,
            run: self.wire.run,
            number,
            variant: &variant[..self.kind.variant_len(op)],
        };
        put_record(out, &head, sealer, &fields, &m.payload);
        own.map(|k| k.answer)
    }
}
