//! Pure's receiver core (sans-IO `Receiver` with its publish/subscribe relay, every variant) fed whole datagrams by
//! honest devices and an adversary, with the devices' senders fed the receiver's answers, its deliveries and forged
//! ones, on a virtual clock.
//!
//! The input picks a kind and a list of operations (`transport_fuzz::pure_ops`): devices make orders, subscribe and
//! publish (sealed by the real `Sender`), lose datagrams, re-send, restart; time passes; the receiver restarts; an
//! adversary replays, cuts, flips and splices datagrams seen on the wire (from any source address), sends raw bytes,
//! seals orders (in records and in bundles), subscribes and publishes of its own with an allowed device's keys while naming another device (or
//! with the key of a device the receiver does not know), and forges deliveries and delivery answers with keys other
//! than the victim's. The relay runs with small bounds (`transport_fuzz::pure::relay_config`).
//!
//! Checks, after every operation:
//! - sealed kinds: every order the receiver delivers was made by the device its sender id names, with that run,
//!   number, time and payload: nothing is stored that its device did not make; every message a device reports
//!   delivered was published by an allowed device under its own key, on that channel, and the device subscribed to
//!   that channel; a forged delivery answer never frees a held delivery;
//! - every delivery has its reply; every datagram the receiver sends is at most `MAX_DATAGRAM` bytes of whole answers
//!   (of its kind, to an answered op, naming its current run) and deliveries (of its kind, to an allowed device, from
//!   its current run); the answers to one datagram are never more bytes than the datagram (no amplification);
//! - a device reports "stored" only for an order it made and (sealed kinds) the receiver delivered, "subscribed",
//!   "refused" and "accepted" only for its own subscribes and publishes; (sealed kinds) "refused" only when it asked
//!   for more channels than the relay keeps;
//! - bounded memory: subscribers at most the allowed devices, messages held within the relay's bounds, keys cached
//!   within the capacity;
//! - liveness: an order whose record reaches the receiver intact, and whose answer reaches the device, is reported
//!   stored, whatever the adversary did before. After `Settle` (30 s of lossless exchange with every timer running),
//!   for every allowed device: its orders and QoS 1 publishes are all answered, and so is each of its subscriptions,
//!   kept or refused (a device that asked for more channels than the relay keeps gets its refusals, and goes on
//!   sending: docs/fuzzing.md, finding 4); (sealed kinds) a QoS 1 message published then on a channel reaches every
//!   device that holds a subscription to it at QoS 1 within 10 s.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transport_core::{Counters, Order, OrderId, QoS};
use transport_fuzz::pure::{
    addr, fixture, receiver, relay_config, sender, ALLOWED, DEVICES, KINDS, SESSION_CAPACITY,
};
use transport_fuzz::pure_ops::{read_input, Forged, Op, STEPS_MS};
use transport_pure::crypto::{link_secret, put_record, DeliverKeys, Sealer, WireKeys};
use transport_pure::receiver::{Receiver, Reply};
use transport_pure::sender::{Sender, SenderEvent};
use transport_pure::wire::{self, Frame, Head, Kind, Op as WireOp, ENC_LEN, MAX_DATAGRAM};

/// Operations per input.
const MAX_OPS: usize = 48;
/// `Settle` operations per input that run (each costs hundreds of exchanges, each with its setups under
/// `hpke-per-request`).
const MAX_SETTLES: usize = 1;
/// Seconds of lossless exchange before the liveness checks of `Settle`: past a subscription's expiry (15 s), so that
/// a wire no device answers on any more is dropped, with three refreshes (5 s) of every live subscription.
const SETTLE_SECONDS: usize = 30;
/// Seconds for the probes of `Settle` to arrive: a few re-sends (at most 1 s apart) once nothing stale is left.
const PROBE_SECONDS: usize = 10;

/// What the world knows of one device, reset at its restart.
struct Device {
    sender: Sender,
    run: u64,
    next_seq: u64,
    restarts: u64,
    /// Orders this device made in any run.
    made: HashSet<OrderId>,
    /// Orders of this start not reported stored yet.
    open_orders: HashSet<OrderId>,
    /// Its subscriptions in this start, as its sender keeps them (a refused one is dropped).
    subs: HashMap<u32, QoS>,
    /// The channels it asked for in this start, refused ones included.
    asked: HashSet<u32>,
    /// Messages it published in this start, and its QoS 1 ones not accepted yet.
    published: HashSet<u64>,
    open_publishes: HashSet<u64>,
    /// The sender run of its subscribes and publishes, once seen on the wire.
    pubsub_run: Option<u64>,
    /// What it reported: subscribes answered, messages delivered (this start).
    subscribed: HashSet<u32>,
    delivered: HashSet<(u32, u64)>,
    /// The adversary's HPKE session with this device's key (enc and keys), for the forging operations.
    session: Option<([u8; ENC_LEN], WireKeys)>,
}

struct World {
    kind: Kind,
    now: Instant,
    receiver: Receiver,
    receiver_runs: u64,
    devices: Vec<Device>,
    rng: StdRng,
    /// (sender id, run, seq, made_us, payload) of every record an allowed device sealed itself.
    sealed_by_owner: HashSet<(u64, u64, u64, u64, Vec<u8>)>,
    /// Orders the receiver delivered (the store's applied set).
    delivered: HashSet<OrderId>,
    /// (channel, id) of every message an allowed device published under its own key.
    genuine: HashSet<(u32, u64)>,
    /// Channels each allowed device subscribed to under its own key: ever, and since the receiver's start.
    channels_ever: Vec<HashSet<u32>>,
    channels_this_run: Vec<HashSet<u32>>,
    next_id: u64,
    settles: usize,
    seen_to_receiver: Vec<Vec<u8>>,
    seen_to_devices: Vec<Vec<u8>>,
    /// The receiver's datagrams not yet delivered: destination and bytes.
    pending: Vec<(SocketAddr, Vec<u8>)>,
}

impl World {
    fn new(kind: Kind) -> World {
        let devices = (0..DEVICES).map(|d| new_device(kind, d, 0)).collect();
        World {
            kind,
            now: Instant::now(),
            receiver: receiver(kind, 1, Arc::new(Counters::default())),
            receiver_runs: 1,
            devices,
            rng: StdRng::seed_from_u64(7),
            sealed_by_owner: HashSet::new(),
            delivered: HashSet::new(),
            genuine: HashSet::new(),
            channels_ever: vec![HashSet::new(); DEVICES],
            channels_this_run: vec![HashSet::new(); DEVICES],
            next_id: 1,
            settles: 0,
            seen_to_receiver: Vec::new(),
            seen_to_devices: Vec::new(),
            pending: Vec::new(),
        }
    }

    fn run(&mut self, op: Op) {
        match op {
            Op::Make {
                device,
                payload,
                lose,
            } => {
                let d = &mut self.devices[device];
                let order = Order {
                    id: OrderId {
                        sender: device as u64,
                        run: d.run,
                        seq: d.next_seq,
                    },
                    made_us: 1_000_000 + d.next_seq,
                    payload,
                };
                d.next_seq += 1;
                d.made.insert(order.id);
                if device < ALLOWED {
                    d.open_orders.insert(order.id);
                    self.sealed_by_owner.insert(key(&order));
                }
                d.sender.push(self.now, order.clone());
                self.transmit(device, lose);
                // Sent now (not held back by the window): in a record or a bundle of what just went out.
                if !lose && device < ALLOWED && self.devices[device].sender.sent(&order.id) {
                    self.check_stored_after_exchange(device, order.id);
                }
            }
            Op::Subscribe {
                device,
                channel,
                qos1,
                lose,
            } => {
                let qos = qos_of(qos1);
                self.devices[device].subs.insert(channel, qos);
                self.devices[device].asked.insert(channel);
                if device < ALLOWED {
                    self.channels_ever[device].insert(channel);
                    self.channels_this_run[device].insert(channel);
                }
                self.devices[device]
                    .sender
                    .subscribe(self.now, channel, qos);
                self.transmit(device, lose);
            }
            Op::Publish {
                device,
                channel,
                qos1,
                payload,
                lose,
            } => {
                let id = self.publish(device, channel, qos_of(qos1), payload);
                if id.is_some() {
                    self.transmit(device, lose);
                }
            }
            Op::Send { device, lose } => {
                self.transmit(device, lose);
            }
            Op::Resend { device, lose } => {
                self.now += Duration::from_secs(2);
                self.devices[device].sender.handle_timeout(self.now);
                self.transmit(device, lose);
            }
            Op::Time { step } => {
                self.now += Duration::from_millis(STEPS_MS[step]);
                self.receiver_timers();
            }
            Op::RestartDevice { device } => {
                let restarts = self.devices[device].restarts + 1;
                let made = std::mem::take(&mut self.devices[device].made);
                self.devices[device] = new_device(self.kind, device, restarts);
                self.devices[device].made = made;
            }
            Op::RestartReceiver => {
                self.receiver_runs += 1;
                self.receiver =
                    receiver(self.kind, self.receiver_runs, Arc::new(Counters::default()));
                // What the old run had not sent is lost with it, and so are its subscriptions; each device subscribes
                // again to all of its channels.
                self.pending.clear();
                for (d, channels) in self.channels_this_run.iter_mut().enumerate() {
                    *channels = self.devices[d].subs.keys().copied().collect();
                }
            }
            Op::Answers { lose } => self.answers(lose),
            Op::Settle => {
                if self.settles < MAX_SETTLES {
                    self.settles += 1;
                    self.settle();
                }
            }
            Op::Forge {
                what,
                sealer,
                claimed,
                new_session,
                run,
                seq,
                receiver_run,
                current,
                channel,
                qos1,
                payload,
            } => {
                let rrun_plain = if current {
                    self.receiver.run()
                } else {
                    receiver_run
                };
                let dg = self.forge(
                    what,
                    sealer,
                    claimed,
                    new_session,
                    (run, seq, receiver_run, rrun_plain),
                    channel,
                    qos1,
                    &payload,
                );
                self.receive(addr(sealer), dg);
            }
            Op::ForgeDelivery {
                victim,
                other,
                qos1,
                seq,
                channel,
                payload,
            } => {
                let sealer = (victim + 1 + other) % DEVICES;
                let dg = self.forge_delivery(sealer, victim, qos1, seq, channel, &payload);
                self.seen_to_devices.push(dg.clone());
                self.device_receives(victim, &dg);
            }
            Op::ForgeDeliveryAnswer { victim, other, seq } => {
                let sealer = (victim + 1 + other) % DEVICES;
                let dg = self.forge_delivery_answer(sealer, victim, seq);
                let held = self.receiver.relay().held();
                self.receive(addr(sealer), dg);
                if self.kind.sealed() {
                    assert!(
                        self.receiver.relay().held() >= held,
                        "{:?}: an answer device {sealer} forged for device {victim}'s delivery {seq} freed a held delivery",
                        self.kind
                    );
                }
            }
            Op::Replay { index, from } => {
                if let Some(dg) = pick(&self.seen_to_receiver, index) {
                    self.receive(addr(from), dg);
                }
            }
            Op::Mutate {
                index,
                from,
                cut,
                flips,
            } => {
                if let Some(mut dg) = pick(&self.seen_to_receiver, index) {
                    dg.truncate(usize::from(cut) % (dg.len() + 1));
                    flip(&mut dg, &flips);
                    self.receive(addr(from), dg);
                }
            }
            Op::Splice { a, b, from } => {
                if let (Some(mut x), Some(y)) = (
                    pick(&self.seen_to_receiver, a),
                    pick(&self.seen_to_receiver, b),
                ) {
                    x.extend_from_slice(&y);
                    self.receive(addr(from), x);
                }
            }
            Op::Raw { from, bytes } => self.receive(addr(from), bytes),
            Op::MutateAnswer {
                index,
                device,
                flips,
            } => {
                if let Some(mut dg) = pick(&self.seen_to_devices, index) {
                    flip(&mut dg, &flips);
                    self.device_receives(device, &dg);
                }
            }
            Op::RawAnswer { device, bytes } => {
                self.device_receives(device, &bytes);
            }
        }
        self.check_bounds();
    }

    /// Device `device` publishes a new message; returns its id (none if the sender refuses it).
    fn publish(&mut self, device: usize, channel: u32, qos: QoS, payload: Vec<u8>) -> Option<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let d = &mut self.devices[device];
        d.sender
            .publish(self.now, channel, id, qos, payload.into())
            .ok()?;
        d.published.insert(id);
        if device < ALLOWED {
            self.genuine.insert((channel, id));
            if qos == QoS::AtLeastOnce {
                d.open_publishes.insert(id);
            }
        }
        Some(id)
    }

    /// Send what device `device` has to send; returns the datagrams.
    fn transmit(&mut self, device: usize, lose: bool) -> Vec<Vec<u8>> {
        let mut sent = Vec::new();
        let mut buf = Vec::new();
        let key_id = fixture().devices[device].key_id();
        while self.devices[device]
            .sender
            .poll_transmit(self.now, &mut buf)
        {
            assert!(
                !buf.is_empty() && buf.len() <= MAX_DATAGRAM,
                "a sender built a datagram of {} bytes",
                buf.len()
            );
            for frame in wire::frames(&buf) {
                match frame {
                    Ok(Frame::Record(r)) if !r.op.to_device() => {
                        assert_eq!((r.kind, r.key_id), (self.kind, key_id));
                        if !matches!(r.op, WireOp::Order | WireOp::Bundle) {
                            self.devices[device].pubsub_run = Some(r.run);
                        }
                    }
                    Ok(Frame::Answer(a)) if a.op == WireOp::Deliver1 => {
                        assert_eq!((a.kind, a.key_id), (self.kind, key_id));
                    }
                    other => panic!("device {device} sent {other:?}"),
                }
            }
            sent.push(buf.clone());
        }
        if !lose {
            for dg in &sent {
                self.receive(addr(device), dg.clone());
            }
        }
        sent
    }

    /// The receiver takes a datagram; its orders are committed and answered, and what it sends is checked and kept
    /// for the devices.
    fn receive(&mut self, from: SocketAddr, dg: Vec<u8>) {
        self.receiver.handle(self.now, from, &dg);
        let (orders, replies) = self.receiver.take_deliveries();
        assert_eq!(
            orders.len(),
            replies.iter().map(Reply::orders).sum::<usize>(),
            "a delivery without its reply, or a reply without its delivery"
        );
        for order in &orders {
            if self.kind.sealed() {
                assert!(
                    self.sealed_by_owner.contains(&key(order)),
                    "{:?} receiver applied order {} that its device did not make: {order:?}",
                    self.kind,
                    order.id
                );
            }
            self.delivered.insert(order.id);
        }
        for reply in replies {
            self.receiver.answer(reply);
        }
        let answered = self.receiver_output();
        assert!(
            answered.get(&from).copied().unwrap_or(0) <= dg.len(),
            "{:?}: a datagram of {} bytes from {from} was answered with {} bytes",
            self.kind,
            dg.len(),
            answered[&from]
        );
        self.seen_to_receiver.push(dg);
    }

    /// Let the receiver's timers run (re-sent deliveries, deadlines, expiries).
    fn receiver_timers(&mut self) {
        if self.receiver.poll_timeout().is_some_and(|t| t <= self.now) {
            self.receiver.handle_timeout(self.now);
        }
        self.receiver_output();
    }

    /// Take and check everything the receiver has to send; returns the bytes of answers per destination.
    fn receiver_output(&mut self) -> HashMap<SocketAddr, usize> {
        let mut answered = HashMap::new();
        let mut buf = Vec::new();
        let run = self.receiver.run();
        let allowed: Vec<_> = fixture().devices[..ALLOWED]
            .iter()
            .map(|k| k.key_id())
            .collect();
        while let Some(to) = self.receiver.poll_transmit(self.now, &mut buf) {
            assert!(
                !buf.is_empty() && buf.len() <= MAX_DATAGRAM,
                "receiver datagram of {} bytes",
                buf.len()
            );
            for frame in wire::frames(&buf) {
                match frame {
                    Ok(Frame::Answer(a)) if a.op != WireOp::Deliver1 => {
                        assert_eq!(a.kind, self.kind);
                        assert_eq!(a.receiver_run, run, "an answer names another receiver run");
                        *answered.entry(to).or_insert(0) += a.kind.answer_len();
                    }
                    Ok(Frame::AnswerBundle(b)) => {
                        assert_eq!(b.kind, self.kind);
                        assert!(b.kind.bundles(), "an answer bundle of {:?}", b.kind);
                        assert_eq!(b.receiver_run, run, "an answer bundle names another receiver run");
                        *answered.entry(to).or_insert(0) += wire::answer_bundle_len(b.kind, b.len());
                    }
                    Ok(Frame::Record(r)) if r.op.to_device() => {
                        assert_eq!(r.kind, self.kind);
                        assert_eq!(r.receiver_run(), Some(run), "a delivery from another run");
                        assert!(
                            allowed.contains(&r.key_id),
                            "a delivery to a device not allowed"
                        );
                    }
                    other => panic!("the receiver sent {other:?}"),
                }
            }
            self.pending.push((to, buf.clone()));
        }
        answered
    }

    /// Deliver the receiver's pending datagrams to the devices at their destinations.
    fn answers(&mut self, lose: bool) {
        for (to, dg) in std::mem::take(&mut self.pending) {
            self.seen_to_devices.push(dg.clone());
            if lose {
                continue;
            }
            if let Some(device) = (0..DEVICES).find(|&d| addr(d) == to) {
                self.device_receives(device, &dg);
            }
        }
    }

    /// A device takes a datagram; every event it reports is checked. Returns the orders reported stored.
    fn device_receives(&mut self, device: usize, dg: &[u8]) -> Vec<OrderId> {
        let sealed = self.kind.sealed();
        let may_be_refused = device < ALLOWED && self.may_be_refused(device);
        let d = &mut self.devices[device];
        d.sender.handle(self.now, dg);
        let mut stored = Vec::new();
        while let Some(event) = d.sender.poll_event() {
            match event {
                SenderEvent::Stored(id) => {
                    assert!(
                        d.made.contains(&id),
                        "device {device} reports stored an order it never made: {id}"
                    );
                    // Plain answers carry no tag: anyone can forge one, by design.
                    if sealed {
                        assert!(
                            self.delivered.contains(&id),
                            "device {device} reports stored {id}, which the receiver never delivered"
                        );
                    }
                    d.open_orders.remove(&id);
                    stored.push(id);
                }
                SenderEvent::Subscribed(channel) => {
                    assert!(
                        d.subs.contains_key(&channel),
                        "device {device} reports subscribed to channel {channel}, which it never asked for"
                    );
                    d.subscribed.insert(channel);
                }
                SenderEvent::Refused(channel) => {
                    assert!(
                        d.asked.contains(&channel),
                        "device {device} reports refused a subscription to channel {channel}, which it never asked for"
                    );
                    // Plain answers carry no tag: anyone can forge a refusal, by design.
                    if sealed {
                        assert!(
                            may_be_refused,
                            "{:?}: device {device}'s subscription to channel {channel} was refused, but it never \
                             asked for more channels than the relay keeps",
                            self.kind
                        );
                    }
                }
                SenderEvent::Accepted(id) => {
                    assert!(
                        d.published.contains(&id),
                        "device {device} reports accepted message {id}, which it never published"
                    );
                    d.open_publishes.remove(&id);
                }
                SenderEvent::Delivered { channel, id } => {
                    // Plain deliveries carry no tag: anyone can forge one, by design.
                    if sealed {
                        assert!(
                            self.genuine.contains(&(channel, id)),
                            "{:?}: device {device} reports delivered message {id} on channel {channel}, which no \
                             allowed device published there",
                            self.kind
                        );
                        assert!(
                            self.channels_ever[device].contains(&channel),
                            "{:?}: device {device} reports a delivery on channel {channel}, which it never \
                             subscribed to",
                            self.kind
                        );
                    }
                    d.delivered.insert((channel, id));
                }
            }
        }
        // What the sender still asks for: a refused channel is dropped.
        d.subs = d.sender.subscriptions().iter().copied().collect();
        stored
    }

    /// The order's record reached the receiver intact: its answer must make the device report it stored.
    fn check_stored_after_exchange(&mut self, device: usize, id: OrderId) {
        let mut stored = Vec::new();
        for (to, dg) in std::mem::take(&mut self.pending) {
            self.seen_to_devices.push(dg.clone());
            if let Some(d) = (0..DEVICES).find(|&d| addr(d) == to) {
                stored.extend(self.device_receives(d, &dg));
            }
        }
        assert!(
            stored.contains(&id),
            "{:?}: order {id} of device {device} reached the receiver intact but was not reported stored",
            self.kind
        );
    }

    /// What nothing sent to the receiver can grow beyond.
    fn check_bounds(&self) {
        let relay = self.receiver.relay();
        let bounds = relay_config();
        assert!(
            relay.subscribers() <= ALLOWED,
            "more subscribers than allowed devices"
        );
        assert!(
            relay.held() <= ALLOWED * (bounds.held + bounds.waiting0),
            "the relay holds {} messages",
            relay.held()
        );
        assert!(
            self.receiver.cached_wires() <= 2 * SESSION_CAPACITY.max(2),
            "the receiver keeps {} wires' keys",
            self.receiver.cached_wires()
        );
    }

    /// Move datagrams without loss until nothing moves.
    fn pump(&mut self) {
        for _ in 0..64 {
            let mut moved = !self.pending.is_empty();
            self.answers(false);
            for d in 0..DEVICES {
                moved |= !self.transmit(d, false).is_empty();
            }
            if !moved {
                return;
            }
        }
    }

    /// One second passes for everyone, then a lossless exchange.
    fn second(&mut self) {
        self.now += Duration::from_secs(1);
        self.receiver_timers();
        for d in 0..DEVICES {
            self.devices[d].sender.handle_timeout(self.now);
        }
        self.pump();
    }

    /// Whether allowed device `d` can have subscribes the receiver refuses: it asked for more channels than the relay
    /// keeps per device in this receiver run, the channels of its earlier starts included (plain: anyone can subscribe
    /// it to channels, or forge a refusal, so any device that subscribes).
    fn may_be_refused(&self, d: usize) -> bool {
        if self.kind.sealed() {
            self.channels_this_run[d].len() > relay_config().channels
        } else {
            !self.channels_ever[d].is_empty()
        }
    }

    /// Liveness: with the adversary gone and nothing lost, everything the devices asked for is done.
    fn settle(&mut self) {
        for d in &mut self.devices {
            d.subscribed.clear();
        }
        self.pump();
        for _ in 0..SETTLE_SECONDS {
            self.second();
        }
        // Every allowed device, whatever was refused to it: a refused subscribe is answered, and nothing holds the
        // device's other records back.
        let live: Vec<usize> = (0..ALLOWED).collect();
        for &device in &live {
            let d = &self.devices[device];
            assert!(
                d.open_orders.is_empty(),
                "{:?}: orders {:?} of device {device} were not stored after {SETTLE_SECONDS} s",
                self.kind,
                d.open_orders
            );
            assert!(
                d.open_publishes.is_empty(),
                "{:?}: QoS 1 messages {:?} of device {device} were not accepted after {SETTLE_SECONDS} s",
                self.kind,
                d.open_publishes
            );
            let missing: Vec<_> = d
                .subs
                .keys()
                .filter(|c| !d.subscribed.contains(c))
                .collect();
            // A refused one was answered too, and left the sender's subscriptions.
            assert!(
                missing.is_empty(),
                "{:?}: device {device}'s subscriptions to {missing:?} were not answered in {SETTLE_SECONDS} s",
                self.kind
            );
        }
        // Sealed kinds: a probe on every channel with a device subscribed at QoS 1 reaches each of them.
        let Some(&publisher) = live.first().filter(|_| self.kind.sealed()) else {
            return;
        };
        let mut probes = Vec::new();
        for channel in 0..transport_fuzz::pure::CHANNELS {
            let subscribers: Vec<usize> = live
                .iter()
                .copied()
                .filter(|&d| self.devices[d].subs.get(&channel) == Some(&QoS::AtLeastOnce))
                .collect();
            if subscribers.is_empty() {
                continue;
            }
            let id = self
                .publish(publisher, channel, QoS::AtLeastOnce, b"probe".to_vec())
                .expect("a small payload fits");
            probes.push((channel, id, subscribers));
        }
        if probes.is_empty() {
            return;
        }
        self.pump();
        for _ in 0..PROBE_SECONDS {
            self.second();
        }
        for (channel, id, subscribers) in probes {
            for d in subscribers {
                assert!(
                    self.devices[d].delivered.contains(&(channel, id)),
                    "{:?}: QoS 1 message {id} on channel {channel} did not reach subscriber {d} in {PROBE_SECONDS} s",
                    self.kind
                );
            }
        }
    }

    /// A record sealed with `sealer`'s keys that names `claimed` as its sender. `numbers` are its (sender run,
    /// number, receiver run in the header, receiver run in the plaintext).
    #[allow(clippy::too_many_arguments)]
    fn forge(
        &mut self,
        what: Forged,
        sealer: usize,
        claimed: usize,
        new_session: bool,
        numbers: (u64, u64, u64, u64),
        channel: u32,
        qos1: bool,
        payload: &[u8],
    ) -> Vec<u8> {
        let (run, seq, receiver_run, rrun_plain) = numbers;
        let fx = fixture();
        let kind = self.kind;
        let made_us = 7;
        let (variant, keys) = match kind {
            Kind::Plain => (Vec::new(), None),
            Kind::HpkeSession => {
                let (enc, keys) = self.adversary_session(sealer, new_session);
                (enc.to_vec(), Some(keys))
            }
            Kind::HpkePerRequest => {
                let (enc, keys) =
                    WireKeys::hpke_sender(&mut self.rng, &fx.devices[sealer], fx.node.public());
                (enc.to_vec(), Some(keys))
            }
            Kind::Link => (
                receiver_run.to_be_bytes().to_vec(),
                Some(own_link(sealer, run, receiver_run)),
            ),
        };
        let genuine = sealer == claimed && sealer < ALLOWED;
        let mut fields = Vec::with_capacity(20);
        let op = match what {
            Forged::Order => {
                fields.extend_from_slice(&u64::to_be_bytes(made_us));
                if genuine {
                    // A device sealing under its own name: a genuine order of that device.
                    self.sealed_by_owner.insert((
                        sealer as u64,
                        run,
                        seq,
                        made_us,
                        payload.to_vec(),
                    ));
                }
                WireOp::Order
            }
            Forged::Subscribe => {
                fields.extend_from_slice(&rrun_plain.to_be_bytes());
                fields.extend_from_slice(&channel.to_be_bytes());
                fields.push(u8::from(qos1));
                if genuine {
                    self.channels_ever[sealer].insert(channel);
                    self.channels_this_run[sealer].insert(channel);
                }
                WireOp::Subscribe
            }
            Forged::Publish1 | Forged::Publish0 => {
                let id = self.next_id;
                self.next_id += 1;
                fields.extend_from_slice(&rrun_plain.to_be_bytes());
                fields.extend_from_slice(&channel.to_be_bytes());
                fields.extend_from_slice(&id.to_be_bytes());
                if genuine {
                    self.genuine.insert((channel, id));
                }
                if what == Forged::Publish1 {
                    WireOp::Publish1
                } else {
                    WireOp::Publish0
                }
            }
        };
        // A subscribe carries no payload.
        let payload = if op == WireOp::Subscribe {
            &[][..]
        } else {
            payload
        };
        let mut dg = Vec::new();
        // An order with an odd number goes in a bundle of its own where the kind bundles orders (the bundle numbered
        // as the order), so forged bundles meet the receiver as forged records do.
        let bundle = op == WireOp::Order && kind.bundles() && seq % 2 == 1;
        let mut entries = Vec::new();
        let (op, fields, payload) = if bundle {
            wire::put_entry(&mut entries, seq, made_us, payload);
            (WireOp::Bundle, &[][..], &entries[..])
        } else {
            (op, &fields[..], payload)
        };
        let head = Head {
            kind,
            op,
            key_id: &fx.devices[claimed].key_id(),
            run,
            number: seq,
            variant: &variant,
        };
        put_record(
            &mut dg,
            &head,
            keys.as_ref().map(|k| k as &dyn Sealer),
            fields,
            payload,
        );
        dg
    }

    /// A delivery to `victim` sealed with the delivery keys `sealer`'s key holder can make for the victim's wire.
    fn forge_delivery(
        &mut self,
        sealer: usize,
        victim: usize,
        qos1: bool,
        seq: u64,
        channel: u32,
        payload: &[u8],
    ) -> Vec<u8> {
        let fx = fixture();
        let (run, rrun) = (
            self.devices[victim].pubsub_run.unwrap_or(1),
            self.receiver.run(),
        );
        let mut variant = rrun.to_be_bytes().to_vec();
        let keys = self.adversary_deliver_keys(sealer, victim, run, &mut variant);
        let id = self.next_id;
        self.next_id += 1;
        let mut fields = channel.to_be_bytes().to_vec();
        fields.extend_from_slice(&id.to_be_bytes());
        let mut dg = Vec::new();
        let head = Head {
            kind: self.kind,
            op: if qos1 {
                WireOp::Deliver1
            } else {
                WireOp::Deliver0
            },
            key_id: &fx.devices[victim].key_id(),
            run,
            number: seq,
            variant: &variant,
        };
        put_record(
            &mut dg,
            &head,
            keys.as_ref().map(|k| k as &dyn Sealer),
            &fields,
            payload,
        );
        dg
    }

    /// An answer to `victim`'s QoS 1 delivery `seq`, tagged with the delivery keys `sealer`'s key holder can make.
    fn forge_delivery_answer(&mut self, sealer: usize, victim: usize, seq: u64) -> Vec<u8> {
        let fx = fixture();
        let (run, rrun) = (
            self.devices[victim].pubsub_run.unwrap_or(1),
            self.receiver.run(),
        );
        let keys = self.adversary_deliver_keys(sealer, victim, run, &mut Vec::new());
        let mut dg = Vec::new();
        let header = wire::put_answer_header(
            &mut dg,
            self.kind,
            WireOp::Deliver1,
            &fx.devices[victim].key_id(),
            run,
            seq,
            rrun,
        );
        if let Some(k) = keys {
            let tag = k.answer.tag(WireOp::Deliver1, seq, &dg[header]);
            dg.extend_from_slice(&tag);
        }
        dg
    }

    /// The delivery keys for the victim's wire `run` that the holder of `sealer`'s key can make (none for plain); a
    /// per-request delivery's enc is appended to `variant`.
    fn adversary_deliver_keys(
        &mut self,
        sealer: usize,
        victim: usize,
        run: u64,
        variant: &mut Vec<u8>,
    ) -> Option<DeliverKeys> {
        let fx = fixture();
        let rrun = self.receiver.run();
        match self.kind {
            Kind::Plain => None,
            Kind::HpkeSession => Some(self.adversary_session(sealer, false).1.deliver_keys(rrun)),
            Kind::HpkePerRequest => {
                // A delivery setup of its own, from the sealer's key to the victim's.
                let (enc, keys) = WireKeys::hpke_delivery_sender(
                    &mut self.rng,
                    &fx.devices[sealer],
                    fx.devices[victim].public(),
                );
                variant.extend_from_slice(&enc);
                Some(keys.deliver_keys(rrun))
            }
            Kind::Link => Some(own_link(sealer, run, rrun).deliver_keys(rrun)),
        }
    }

    /// The adversary's HPKE session with device `sealer`'s key (a new one if asked or if there is none).
    fn adversary_session(&mut self, sealer: usize, new: bool) -> ([u8; ENC_LEN], WireKeys) {
        let fx = fixture();
        let d = &mut self.devices[sealer];
        if new || d.session.is_none() {
            d.session = Some(WireKeys::hpke_sender(
                &mut self.rng,
                &fx.devices[sealer],
                fx.node.public(),
            ));
        }
        d.session.clone().expect("set above")
    }
}

/// The link keys device `sealer` has with the receiver for (sender run, receiver run).
fn own_link(sealer: usize, run: u64, receiver_run: u64) -> WireKeys {
    let fx = fixture();
    let own = &fx.devices[sealer];
    let secret = link_secret(own, fx.node.public(), own.public(), fx.node.public())
        .expect("the fixed keys are not of small order");
    WireKeys::link(&secret, run, receiver_run)
}

fn new_device(kind: Kind, device: usize, restarts: u64) -> Device {
    Device {
        sender: sender(kind, device, (device as u64) << 32 | restarts),
        // A new run at each start, as a device's random run would be; never one of the runs `Forge` picks (0..=3).
        run: 0x100 + restarts,
        next_seq: 0,
        restarts,
        made: HashSet::new(),
        open_orders: HashSet::new(),
        subs: HashMap::new(),
        asked: HashSet::new(),
        published: HashSet::new(),
        open_publishes: HashSet::new(),
        pubsub_run: None,
        subscribed: HashSet::new(),
        delivered: HashSet::new(),
        session: None,
    }
}

fn qos_of(qos1: bool) -> QoS {
    if qos1 {
        QoS::AtLeastOnce
    } else {
        QoS::AtMostOnce
    }
}

fn key(o: &Order) -> (u64, u64, u64, u64, Vec<u8>) {
    (
        o.id.sender,
        o.id.run,
        o.id.seq,
        o.made_us,
        o.payload.clone(),
    )
}

fn pick(list: &[Vec<u8>], index: u16) -> Option<Vec<u8>> {
    (!list.is_empty()).then(|| list[usize::from(index) % list.len()].clone())
}

fn flip(dg: &mut [u8], flips: &[(u16, u8)]) {
    if dg.is_empty() {
        return;
    }
    let len = dg.len();
    for &(at, x) in flips {
        dg[usize::from(at) % len] ^= x;
    }
}

fuzz_target!(init: transport_fuzz::seeds::write_if_asked("pure_receiver"), |data: &[u8]| {
    let Some((kind, ops)) = read_input(data, MAX_OPS) else { return };
    let mut world = World::new(KINDS[kind]);
    for op in ops {
        if transport_fuzz::show_ops() {
            eprintln!("{op:?}");
        }
        world.run(op);
    }
});
