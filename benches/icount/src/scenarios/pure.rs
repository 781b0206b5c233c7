//! Pure: one record through the sans-IO sender and receiver cores, and the crypto of a record on its own.
//!
//! A device and a receiver with fixed keys exchange records in memory (no socket); the sender's RNG is seeded. The
//! sender scenarios count the sender's work for one order (seal it into a datagram, later verify the answer), the
//! receiver scenarios the receiver's (open the record, build and tag the answer datagram); the other side runs
//! uncounted. The store's commit, which sits between the receiver's opening and its answer in the server, is left
//! out here and counted by `store/append`.

use crate::meter::{Meter, Section};
use anyhow::{ensure, Context};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transport_core::order::fill_payload;
use transport_core::{device_name, sender_id, Counters, Order, OrderId};
use transport_pure::crypto::{NodeKey, Sealer, WireKeys};
use transport_pure::receiver::{InMemorySecrets, Receiver, ReceiverConfig, Reply};
use transport_pure::relay::RelayConfig;
use transport_pure::sender::{Sender, SenderConfig, SenderEvent};
use transport_pure::senders::{AllowList, AllowedSender};
use transport_pure::wire::{self, Kind, Op};

/// Bytes of payload per order, as the workloads send.
pub const PAYLOAD: usize = 64;
const DEVICE_SECRET: [u8; 32] = [0x11; 32];
const RECEIVER_SECRET: [u8; 32] = [0x22; 32];
const RNG_SEED: u64 = 13;
const SENDER_RUN: u64 = 0x5e4d;
const RECEIVER_RUN: u64 = 0x2ece;
const MADE_US: u64 = 1_790_000_000_000_000;

/// Order `seq` of the device's run, with the workloads' payload pattern.
fn order(seq: u64) -> Order {
    let id = OrderId {
        sender: sender_id(&device_name(0)),
        run: SENDER_RUN,
        seq,
    };
    let mut payload = Vec::with_capacity(PAYLOAD);
    fill_payload(&id, PAYLOAD, &mut payload);
    Order {
        id,
        made_us: MADE_US,
        payload,
    }
}

/// `now` moved forward to a whole second of the monotonic clock. The sender adds its timeouts to `now`, and adding
/// to an `Instant` takes a branch when the nanoseconds carry: at a random `now` that would make the count differ by
/// a few instructions from one run to the next. `Instant` shows its fields only in its `Debug` form (on Linux,
/// `tv_nsec`); if that form changes, `now` is used as it is and only that small difference comes back.
fn whole_second(now: Instant) -> Instant {
    let debug = format!("{now:?}");
    let nanos = debug
        .split("tv_nsec: ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse::<u64>().ok());
    match nanos {
        Some(n) if n < 1_000_000_000 => {
            now + Duration::from_nanos((1_000_000_000 - n) % 1_000_000_000)
        }
        _ => now,
    }
}

/// A device's sender and a receiver joined by two in-memory buffers.
struct Link {
    sender: Sender,
    receiver: Receiver,
    device: SocketAddr,
    now: Instant,
    datagram: Vec<u8>,
    answer: Vec<u8>,
    orders: Vec<Order>,
    replies: Vec<Reply>,
}

impl Link {
    fn new(kind: Kind) -> anyhow::Result<Link> {
        let device = NodeKey::from_secret(DEVICE_SECRET);
        let node = NodeKey::from_secret(RECEIVER_SECRET);
        let name = device_name(0);
        let senders = AllowList::new(vec![AllowedSender {
            sender_id: sender_id(&name),
            name,
            public: *device.public(),
        }])?;
        let receiver = Receiver::new(
            ReceiverConfig {
                kind,
                key: node.clone(),
                senders,
                run: RECEIVER_RUN,
                session_capacity: 1024,
                secrets: Box::new(InMemorySecrets::default()),
                relay: RelayConfig::default(),
                rng: StdRng::seed_from_u64(RNG_SEED),
            },
            Arc::new(Counters::default()),
        );
        let sender = Sender::new(
            SenderConfig::new(kind),
            device,
            *node.public(),
            StdRng::seed_from_u64(RNG_SEED),
            Arc::new(Counters::default()),
        )?;
        Ok(Link {
            sender,
            receiver,
            device: SocketAddr::from(([127, 0, 0, 1], 40_000)),
            now: whole_second(Instant::now()),
            datagram: Vec::with_capacity(wire::MAX_DATAGRAM),
            answer: Vec::with_capacity(wire::MAX_DATAGRAM),
            orders: Vec::new(),
            replies: Vec::new(),
        })
    }

    /// Sender: hand over an order and build its datagram.
    fn send(&mut self, order: Order) -> bool {
        self.sender.push(self.now, order);
        self.sender.poll_transmit(self.now, &mut self.datagram)
    }

    /// Receiver: take the datagram, answer what opened (as if the store had committed it), build the answer. The
    /// orders and replies are moved into buffers kept across steps, as the server's loop keeps them.
    fn receive(&mut self) -> Vec<Order> {
        self.receiver.handle(self.now, self.device, &self.datagram);
        self.orders.clear();
        self.replies.clear();
        self.receiver
            .move_deliveries(&mut self.orders, &mut self.replies);
        for reply in self.replies.drain(..) {
            self.receiver.answer(reply);
        }
        self.answer.clear();
        self.receiver.poll_transmit(self.now, &mut self.answer);
        std::mem::take(&mut self.orders)
    }

    /// Sender: take the answer.
    fn settle(&mut self) -> Option<SenderEvent> {
        self.sender.handle(self.now, &self.answer);
        self.sender.poll_event()
    }

    /// One order end to end, counting the sender's or the receiver's part.
    fn exchange(&mut self, seq: u64, s: &mut Section, count_sender: bool) -> anyhow::Result<()> {
        let order = order(seq);
        let (id, payload) = (order.id, order.payload.clone());
        let sent = s.measure_if(count_sender, || self.send(order));
        ensure!(sent, "the sender built no datagram");
        let delivered = s.measure_if(!count_sender, || self.receive());
        ensure!(
            delivered.len() == 1 && delivered[0].id == id && delivered[0].payload == payload,
            "the receiver did not deliver the order: {delivered:?}"
        );
        ensure!(!self.answer.is_empty(), "the receiver built no answer");
        let event = s.measure_if(count_sender, || self.settle());
        ensure!(
            event == Some(SenderEvent::Stored(id)),
            "the sender did not take the answer: {event:?}"
        );
        Ok(())
    }
}

/// Orders per datagram in the `*/10-per-datagram` scenarios: about what a device of the drain packs.
pub const PER_DATAGRAM: u64 = 10;

impl Link {
    /// [`PER_DATAGRAM`] orders end to end in one datagram each way, counting the sender's or the receiver's part.
    fn exchange_many(
        &mut self,
        step: u64,
        s: &mut Section,
        count_sender: bool,
    ) -> anyhow::Result<()> {
        let orders: Vec<Order> = (0..PER_DATAGRAM)
            .map(|i| order(step * PER_DATAGRAM + i))
            .collect();
        let ids: Vec<OrderId> = orders.iter().map(|o| o.id).collect();
        let sent = s.measure_if(count_sender, || {
            self.sender.push_all(self.now, orders);
            self.sender.poll_transmit(self.now, &mut self.datagram)
        });
        ensure!(sent, "the sender built no datagram");
        ensure!(
            !self.sender.poll_transmit(self.now, &mut Vec::new()),
            "the orders did not fit one datagram"
        );
        let delivered = s.measure_if(!count_sender, || self.receive());
        ensure!(
            delivered.iter().map(|o| o.id).collect::<Vec<_>>() == ids,
            "the receiver did not deliver the orders"
        );
        let events = s.measure_if(count_sender, || {
            self.sender.handle(self.now, &self.answer);
            // Taken into a list of the right size, as the fleet takes them (`client.rs`, `Shard::report`).
            let mut events = Vec::with_capacity(self.sender.pending_events());
            events.extend(std::iter::from_fn(|| self.sender.poll_event()));
            events
        });
        ensure!(
            events
                == ids
                    .iter()
                    .map(|id| SenderEvent::Stored(*id))
                    .collect::<Vec<_>>(),
            "the sender did not take the answers: {events:?}"
        );
        Ok(())
    }
}

/// `pure/sender/*/10-per-datagram`: per step, ten orders.
pub fn sender_many(m: &Meter, kind: Kind) -> anyhow::Result<()> {
    let mut link = Link::new(kind)?;
    m.run(|i, s| link.exchange_many(i, s, true))
}

/// `pure/receiver/*/10-per-datagram`: per step, ten orders.
pub fn receiver_many(m: &Meter, kind: Kind) -> anyhow::Result<()> {
    let mut link = Link::new(kind)?;
    m.run(|i, s| link.exchange_many(i, s, false))
}

/// `pure/sender/*`.
pub fn sender(m: &Meter, kind: Kind) -> anyhow::Result<()> {
    let mut link = Link::new(kind)?;
    m.run(|i, s| link.exchange(i, s, true))
}

/// `pure/receiver/*`.
pub fn receiver(m: &Meter, kind: Kind) -> anyhow::Result<()> {
    let mut link = Link::new(kind)?;
    m.run(|i, s| link.exchange(i, s, false))
}

/// A record header as the sender writes it, and the wire keys of a link (any sealed kind's keys are AES-256-GCM).
fn sealed_fixture() -> (Vec<u8>, std::ops::Range<usize>, WireKeys) {
    let kind = Kind::Link;
    let device = NodeKey::from_secret(DEVICE_SECRET);
    let mut header = Vec::new();
    let body_len = wire::record_len(kind, Op::Order, PAYLOAD) - kind.record_header_len(Op::Order);
    let aad = wire::put_record_header(
        &mut header,
        kind,
        Op::Order,
        &device.key_id(),
        SENDER_RUN,
        0,
        &RECEIVER_RUN.to_be_bytes(),
        body_len,
    );
    let keys = WireKeys::link(&[0x33; 32], SENDER_RUN, RECEIVER_RUN);
    (header, aad, keys)
}

/// `pure/crypto/seal-record`.
pub fn seal_record(m: &Meter) -> anyhow::Result<()> {
    let (header, aad, keys) = sealed_fixture();
    let payload = order(0).payload;
    let mut frame = Vec::with_capacity(wire::MAX_DATAGRAM);
    m.run(|seq, s| {
        frame.clear();
        frame.extend_from_slice(&header);
        let made = MADE_US.to_be_bytes();
        s.measure(|| keys.seal(Op::Order, seq, aad.clone(), &[&made, &payload], &mut frame));
        ensure!(frame.len() == wire::record_len(Kind::Link, Op::Order, PAYLOAD));
        Ok(())
    })
}

/// `pure/crypto/open-record`.
pub fn open_record(m: &Meter) -> anyhow::Result<()> {
    let (header, aad, keys) = sealed_fixture();
    let payload = order(0).payload;
    let mut frame = header.clone();
    let made = MADE_US.to_be_bytes();
    keys.seal(Op::Order, 0, aad.clone(), &[&made, &payload], &mut frame);
    let body = &frame[aad.end..];
    let expected: Vec<u8> = made.iter().chain(&payload).copied().collect();
    m.run(|_, s| {
        let opened = s.measure(|| keys.open(Op::Order, 0, &header, body));
        ensure!(opened.context("open")? == expected);
        Ok(())
    })
}

/// `pure/crypto/hpke-setup-sender`.
pub fn hpke_setup_sender(m: &Meter) -> anyhow::Result<()> {
    let device = NodeKey::from_secret(DEVICE_SECRET);
    let node = NodeKey::from_secret(RECEIVER_SECRET);
    let mut rng = StdRng::seed_from_u64(RNG_SEED);
    m.run(|_, s| {
        let (enc, _keys) = s.measure(|| WireKeys::hpke_sender(&mut rng, &device, node.public()));
        ensure!(enc != [0; wire::ENC_LEN]);
        Ok(())
    })
}

/// `pure/crypto/hpke-setup-receiver`.
pub fn hpke_setup_receiver(m: &Meter) -> anyhow::Result<()> {
    let device = NodeKey::from_secret(DEVICE_SECRET);
    let node = NodeKey::from_secret(RECEIVER_SECRET);
    let mut rng = StdRng::seed_from_u64(RNG_SEED);
    let (enc, keys) = WireKeys::hpke_sender(&mut rng, &device, node.public());
    let mut sealed = Vec::new();
    keys.seal(Op::Order, 0, 0..0, &[b"probe"], &mut sealed);
    m.run(|_, s| {
        let opened = s.measure(|| WireKeys::hpke_receiver(&node, device.public(), &enc));
        // The receiver's keys are the sender's: they open what the sender sealed.
        let keys = opened.context("setup")?;
        ensure!(keys.open(Op::Order, 0, &[], &sealed).is_ok());
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_is_moved_to_a_whole_second() {
        let now = Instant::now();
        let aligned = whole_second(now);
        assert!(aligned >= now && aligned - now < Duration::from_secs(1));
        assert!(
            format!("{aligned:?}").contains("tv_nsec: 0 "),
            "{aligned:?}"
        );
    }
}
