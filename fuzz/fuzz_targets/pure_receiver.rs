//! Pure's receiver core (sans-IO `Receiver`, every variant) fed whole datagrams by honest devices and an adversary,
//! with the devices' senders fed the receiver's answers and forged ones.
//!
//! The input picks a kind and a list of operations: devices make orders (sealed by the real `Sender`), lose
//! datagrams, re-send, restart; the receiver restarts; an adversary replays, cuts, flips and splices datagrams seen
//! on the wire (from any source address), sends raw bytes, and seals records of its own with an allowed device's
//! keys while naming another device (or with the key of a device the receiver does not know).
//!
//! Checks, after every operation:
//! - sealed kinds: every order the receiver delivers was made by the device its sender id names, with that run,
//!   number, time and payload: nothing is applied that its device did not make;
//! - every delivery has its reply, every datagram the receiver sends is at most `MAX_DATAGRAM` bytes of whole
//!   answers of its kind, naming its current run;
//! - a device reports "stored" only for an order it made and (sealed kinds) the receiver delivered;
//! - liveness: an order whose record reaches the receiver intact, and whose answer reaches the device, is reported
//!   stored, whatever the adversary did before.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transport_core::{Counters, Order, OrderId};
use transport_fuzz::bytes_upto;
use transport_fuzz::pure::{fixture, receiver, sender, ALLOWED, DEVICES, KINDS};
use transport_pure::crypto::{link_secret, WireKeys};
use transport_pure::receiver::Receiver;
use transport_pure::sender::{Sender, SenderEvent};
use transport_pure::wire::{self, Frame, Kind, ENC_LEN, MAX_DATAGRAM};

/// Longest payload the generators make: a few records still share a datagram.
const MAX_PAYLOAD: usize = 96;
/// Operations per input.
const MAX_OPS: usize = 48;

#[derive(Debug)]
enum Op {
    /// A device makes an order; its datagrams go out (or are lost).
    Make {
        device: usize,
        payload: Vec<u8>,
        lose: bool,
    },
    /// Time passes beyond the re-send timeout: a device re-sends what is unanswered.
    Resend { device: usize, lose: bool },
    /// A device restarts: a new sender run.
    RestartDevice { device: usize },
    /// The receiver restarts: a new run, no keys kept.
    RestartReceiver,
    /// The receiver's pending answers go out (or are lost).
    Answers { lose: bool },
    /// A record sealed with `sealer`'s key (its own HPKE session, a fresh setup, or its link keys) naming `claimed`.
    Forge {
        sealer: usize,
        claimed: usize,
        new_session: bool,
        run: u64,
        seq: u64,
        receiver_run: u64,
        payload: Vec<u8>,
    },
    /// A datagram seen on its way to the receiver, again, from `from`.
    Replay { index: usize, from: usize },
    /// A datagram seen on its way to the receiver, cut and with bytes changed.
    Mutate {
        index: usize,
        from: usize,
        cut: usize,
        flips: Vec<(usize, u8)>,
    },
    /// Two datagrams seen on their way to the receiver, as one.
    Splice { a: usize, b: usize, from: usize },
    /// Any bytes, to the receiver.
    Raw { from: usize, bytes: Vec<u8> },
    /// An answer seen on its way to a device, changed, to `device`.
    MutateAnswer {
        index: usize,
        device: usize,
        flips: Vec<(usize, u8)>,
    },
    /// Any bytes, to a device.
    RawAnswer { device: usize, bytes: Vec<u8> },
}

fn op(u: &mut Unstructured<'_>) -> arbitrary::Result<Op> {
    let device = |u: &mut Unstructured<'_>| u.choose_index(DEVICES);
    // Sources: the devices' addresses and one more.
    let from = |u: &mut Unstructured<'_>| u.choose_index(DEVICES + 1);
    let flips = |u: &mut Unstructured<'_>| -> arbitrary::Result<Vec<(usize, u8)>> {
        let n = u.int_in_range(0..=4)?;
        (0..n)
            .map(|_| Ok((usize::arbitrary(u)?, u8::arbitrary(u)?)))
            .collect()
    };
    Ok(match u.int_in_range(0..=11)? {
        0 => Op::Make {
            device: device(u)?,
            payload: bytes_upto(u, MAX_PAYLOAD)?,
            lose: u.ratio(1, 4)?,
        },
        1 => Op::Resend {
            device: device(u)?,
            lose: u.ratio(1, 4)?,
        },
        2 => Op::RestartDevice { device: device(u)? },
        3 => Op::RestartReceiver,
        4 => Op::Answers {
            lose: u.ratio(1, 4)?,
        },
        5 => Op::Forge {
            sealer: device(u)?,
            claimed: device(u)?,
            new_session: bool::arbitrary(u)?,
            run: u.int_in_range(0..=3)?,
            seq: u.int_in_range(0..=7)?,
            receiver_run: u.int_in_range(0..=3)?,
            payload: bytes_upto(u, MAX_PAYLOAD)?,
        },
        6 => Op::Replay {
            index: usize::arbitrary(u)?,
            from: from(u)?,
        },
        7 => Op::Mutate {
            index: usize::arbitrary(u)?,
            from: from(u)?,
            cut: usize::arbitrary(u)?,
            flips: flips(u)?,
        },
        8 => Op::Splice {
            a: usize::arbitrary(u)?,
            b: usize::arbitrary(u)?,
            from: from(u)?,
        },
        9 => Op::Raw {
            from: from(u)?,
            bytes: bytes_upto(u, 256)?,
        },
        10 => Op::MutateAnswer {
            index: usize::arbitrary(u)?,
            device: device(u)?,
            flips: flips(u)?,
        },
        _ => Op::RawAnswer {
            device: device(u)?,
            bytes: bytes_upto(u, 128)?,
        },
    })
}

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8 + 1], 4000))
}

struct Device {
    sender: Sender,
    run: u64,
    next_seq: u64,
    restarts: u64,
    /// Orders this device made in any run.
    made: HashSet<OrderId>,
    /// The adversary's HPKE session with this device's key (enc and keys), for `Forge`.
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
    seen_to_receiver: Vec<Vec<u8>>,
    seen_to_devices: Vec<Vec<u8>>,
    pending_answers: Vec<(SocketAddr, Vec<u8>)>,
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
            seen_to_receiver: Vec::new(),
            seen_to_devices: Vec::new(),
            pending_answers: Vec::new(),
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
                    self.sealed_by_owner.insert(key(&order));
                }
                d.sender.push(self.now, order.clone());
                let sent = self.transmit(device, lose);
                if !lose && device < ALLOWED && sent.iter().any(|dg| carries(dg, &order.id)) {
                    self.check_stored_after_exchange(device, order.id);
                }
            }
            Op::Resend { device, lose } => {
                self.now += Duration::from_secs(2);
                self.devices[device].sender.handle_timeout(self.now);
                self.transmit(device, lose);
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
                // Answers of the old run that were not sent are lost with it.
                self.pending_answers.clear();
            }
            Op::Answers { lose } => self.answers(lose),
            Op::Forge {
                sealer,
                claimed,
                new_session,
                run,
                seq,
                receiver_run,
                payload,
            } => {
                let dg = self.forge(
                    sealer,
                    claimed,
                    new_session,
                    run,
                    seq,
                    receiver_run,
                    &payload,
                );
                self.receive(addr(sealer), dg);
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
                    dg.truncate(cut % (dg.len() + 1));
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
    }

    /// Send what device `device` has to send; returns the datagrams.
    fn transmit(&mut self, device: usize, lose: bool) -> Vec<Vec<u8>> {
        let mut sent = Vec::new();
        let mut buf = Vec::new();
        while self.devices[device]
            .sender
            .poll_transmit(self.now, &mut buf)
        {
            assert!(
                buf.len() <= MAX_DATAGRAM,
                "a sender built a datagram of {} bytes",
                buf.len()
            );
            sent.push(buf.clone());
        }
        if !lose {
            for dg in &sent {
                self.receive(addr(device), dg.clone());
            }
        }
        sent
    }

    /// The receiver takes a datagram; its deliveries are committed and answered.
    fn receive(&mut self, from: SocketAddr, dg: Vec<u8>) {
        self.receiver.handle(from, &dg);
        self.seen_to_receiver.push(dg);
        let (orders, replies) = self.receiver.take_deliveries();
        assert_eq!(
            orders.len(),
            replies.len(),
            "a delivery without its reply, or a reply without its delivery"
        );
        for (order, reply) in orders.iter().zip(&replies) {
            if self.kind.sealed() {
                assert!(
                    self.sealed_by_owner.contains(&key(order)),
                    "{:?} receiver applied order {} that its device did not make: {order:?}",
                    self.kind,
                    order.id
                );
            }
            self.delivered.insert(order.id);
            self.receiver.answer(reply);
        }
        let mut buf = Vec::new();
        let answer_len = self.kind.answer_len();
        while let Some(to) = self.receiver.poll_transmit(&mut buf) {
            assert!(
                !buf.is_empty() && buf.len() <= MAX_DATAGRAM,
                "receiver datagram of {} bytes",
                buf.len()
            );
            assert_eq!(
                buf.len() % answer_len,
                0,
                "receiver datagram is not whole answers"
            );
            for frame in wire::frames(&buf) {
                match frame {
                    Ok(Frame::Answer(a)) => {
                        assert_eq!(a.kind, self.kind);
                        assert_eq!(
                            a.receiver_run,
                            self.receiver.run(),
                            "an answer names another receiver run"
                        );
                    }
                    other => panic!("the receiver sent something else than an answer: {other:?}"),
                }
            }
            self.pending_answers.push((to, buf.clone()));
        }
    }

    /// Deliver the receiver's pending answers to the devices at their destinations.
    fn answers(&mut self, lose: bool) {
        for (to, dg) in std::mem::take(&mut self.pending_answers) {
            self.seen_to_devices.push(dg.clone());
            if lose {
                continue;
            }
            if let Some(device) = (0..DEVICES).find(|&d| addr(d) == to) {
                self.device_receives(device, &dg);
            }
        }
    }

    /// A device takes a datagram; every "stored" it reports is checked. Returns the orders reported stored.
    fn device_receives(&mut self, device: usize, dg: &[u8]) -> Vec<OrderId> {
        let d = &mut self.devices[device];
        d.sender.handle(self.now, dg);
        let mut stored = Vec::new();
        while let Some(SenderEvent::Stored(id)) = d.sender.poll_event() {
            assert!(
                d.made.contains(&id),
                "device {device} reports stored an order it never made: {id}"
            );
            // Plain answers carry no tag: anyone can forge one, by design.
            if self.kind.sealed() {
                assert!(
                    self.delivered.contains(&id),
                    "device {device} reports stored {id}, which the receiver never delivered"
                );
            }
            stored.push(id);
        }
        stored
    }

    /// The order's record reached the receiver intact: its answer must make the device report it stored.
    fn check_stored_after_exchange(&mut self, device: usize, id: OrderId) {
        let mut stored = Vec::new();
        for (to, dg) in std::mem::take(&mut self.pending_answers) {
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

    /// A record sealed with `sealer`'s keys that names `claimed` as its sender.
    #[allow(clippy::too_many_arguments)]
    fn forge(
        &mut self,
        sealer: usize,
        claimed: usize,
        new_session: bool,
        run: u64,
        seq: u64,
        receiver_run: u64,
        payload: &[u8],
    ) -> Vec<u8> {
        let fx = fixture();
        let kind = self.kind;
        let made_us = 7;
        let (variant, keys) = match kind {
            Kind::Plain => (Vec::new(), None),
            Kind::HpkeSession => {
                let d = &mut self.devices[sealer];
                if new_session || d.session.is_none() {
                    d.session = Some(WireKeys::hpke_sender(
                        &mut self.rng,
                        &fx.devices[sealer],
                        fx.node.public(),
                    ));
                }
                let (enc, keys) = d.session.clone().expect("set above");
                (enc.to_vec(), Some(keys))
            }
            Kind::HpkePerRequest => {
                let (enc, keys) =
                    WireKeys::hpke_sender(&mut self.rng, &fx.devices[sealer], fx.node.public());
                (enc.to_vec(), Some(keys))
            }
            Kind::Link => {
                let own = &fx.devices[sealer];
                let secret = link_secret(own, fx.node.public(), own.public(), fx.node.public());
                (
                    receiver_run.to_be_bytes().to_vec(),
                    Some(WireKeys::link(&secret, run, receiver_run)),
                )
            }
        };
        let len = wire::record_len(kind, payload.len());
        let mut dg = Vec::with_capacity(len);
        let claimed_id = fx.devices[claimed].key_id();
        let header = wire::put_record_header(
            &mut dg,
            kind,
            &claimed_id,
            run,
            seq,
            &variant,
            len - kind.record_header_len(),
        );
        match keys {
            Some(k) => k.seal_record(seq, header, made_us, payload, &mut dg),
            None => {
                dg.extend_from_slice(&made_us.to_be_bytes());
                dg.extend_from_slice(payload);
            }
        }
        if sealer == claimed && sealer < ALLOWED {
            // A device sealing under its own name: a genuine order of that device.
            self.sealed_by_owner
                .insert((sealer as u64, run, seq, made_us, payload.to_vec()));
        }
        dg
    }
}

fn new_device(kind: Kind, device: usize, restarts: u64) -> Device {
    Device {
        sender: sender(kind, device, (device as u64) << 32 | restarts),
        // A new run at each start, as a device's random run would be; never one of the runs `Forge` picks (0..=3).
        run: 0x100 + restarts,
        next_seq: 0,
        restarts,
        made: HashSet::new(),
        session: None,
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

/// Whether a datagram carries the record of order `id` (its device's key id, run and number).
fn carries(dg: &[u8], id: &OrderId) -> bool {
    let key_id = fixture().devices[id.sender as usize].key_id();
    wire::frames(dg).any(|f| matches!(f, Ok(Frame::Record(r)) if r.key_id == key_id && r.run == id.run && r.seq == id.seq))
}

fn pick(list: &[Vec<u8>], index: usize) -> Option<Vec<u8>> {
    (!list.is_empty()).then(|| list[index % list.len()].clone())
}

fn flip(dg: &mut [u8], flips: &[(usize, u8)]) {
    if dg.is_empty() {
        return;
    }
    let len = dg.len();
    for &(at, x) in flips {
        dg[at % len] ^= x;
    }
}

fuzz_target!(init: transport_fuzz::seeds::write_if_asked("pure_receiver"), |data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(k) = u.choose_index(KINDS.len()) else { return };
    let mut world = World::new(KINDS[k]);
    for _ in 0..MAX_OPS {
        if u.is_empty() {
            break;
        }
        let Ok(op) = op(&mut u) else { break };
        if transport_fuzz::show_ops() {
            eprintln!("{op:?}");
        }
        world.run(op);
    }
});
