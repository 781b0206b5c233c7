//! What the Pure tests share: a receiver's key, its allowed devices and a receiver built from them; a lossless
//! exchange between a receiver and devices for the publish/subscribe tests.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::SeedableRng;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transport_core::{Counters, QoS};
use transport_pure::crypto::NodeKey;
use transport_pure::receiver::{InMemorySecrets, Receiver, ReceiverConfig};
use transport_pure::relay::RelayConfig;
use transport_pure::sender::{Sender, SenderConfig, SenderEvent};
use transport_pure::senders::{AllowList, AllowedSender};
use transport_pure::wire::{self, Frame, Kind, Op};

/// A receiver's key and `n` allowed devices (`dev-i`, sender id `i`), from a seed.
pub struct Keys {
    pub node: NodeKey,
    pub devices: Vec<NodeKey>,
    pub allow: AllowList,
}

impl Keys {
    pub fn new(n: usize, rng: &mut StdRng) -> Keys {
        let node = NodeKey::generate(rng);
        let devices: Vec<NodeKey> = (0..n).map(|_| NodeKey::generate(rng)).collect();
        let allow = AllowList::new(
            devices
                .iter()
                .enumerate()
                .map(|(i, k)| AllowedSender {
                    name: format!("dev-{i}"),
                    sender_id: i as u64,
                    public: *k.public(),
                })
                .collect(),
        )
        .unwrap();
        Keys {
            node,
            devices,
            allow,
        }
    }

    /// A receiver of `kind` for run `run`, its link secrets in memory, caches of `capacity` entries.
    pub fn receiver(
        &self,
        kind: Kind,
        run: u64,
        capacity: usize,
        counters: &Arc<Counters>,
    ) -> Receiver {
        Receiver::new(
            ReceiverConfig {
                kind,
                key: self.node.clone(),
                senders: self.allow.clone(),
                run,
                session_capacity: capacity,
                secrets: Box::new(InMemorySecrets::default()),
                relay: RelayConfig::default(),
                rng: StdRng::seed_from_u64(run),
            },
            counters.clone(),
        )
    }

    /// Device `i`'s sender, with its own seeded RNG.
    pub fn sender(&self, kind: Kind, i: usize, seed: u64, counters: &Arc<Counters>) -> Sender {
        self.sender_with(SenderConfig::new(kind), i, seed, counters)
    }

    /// Device `i`'s sender sending every order as a record of its own (no bundles).
    pub fn records_sender(
        &self,
        kind: Kind,
        i: usize,
        seed: u64,
        counters: &Arc<Counters>,
    ) -> Sender {
        let config = SenderConfig {
            bundles: false,
            ..SenderConfig::new(kind)
        };
        self.sender_with(config, i, seed, counters)
    }

    /// Device `i`'s sender configured as `config`.
    pub fn sender_with(
        &self,
        config: SenderConfig,
        i: usize,
        seed: u64,
        counters: &Arc<Counters>,
    ) -> Sender {
        Sender::new(
            config,
            self.devices[i].clone(),
            *self.node.public(),
            StdRng::seed_from_u64(seed),
            counters.clone(),
        )
        .unwrap()
    }
}

/// The channel the publish/subscribe tests use.
pub const CHANNEL: u32 = 7;

/// One datagram that moved in a [`Net`].
pub struct Datagram {
    /// The device that sent it (`None`: the receiver).
    pub from: Option<usize>,
    /// The device it went to (`None`: the receiver).
    pub to: Option<usize>,
    pub bytes: Vec<u8>,
}

/// A receiver and devices on addresses of their own, datagrams moved between them without loss, every one logged.
pub struct Net {
    pub now: Instant,
    pub receiver: Receiver,
    pub devices: Vec<Sender>,
    pub counters: Arc<Counters>,
    pub device_counters: Arc<Counters>,
    pub events: Vec<(usize, SenderEvent)>,
    pub log: Vec<Datagram>,
}

impl Net {
    /// A receiver of `kind` (run 1) and `n` devices of `keys`.
    pub fn new(keys: &Keys, kind: Kind, n: usize) -> Net {
        let counters = Arc::new(Counters::default());
        let device_counters = Arc::new(Counters::default());
        Net {
            now: Instant::now(),
            receiver: keys.receiver(kind, 1, 16, &counters),
            devices: (0..n)
                .map(|i| keys.sender(kind, i, 100 + i as u64, &device_counters))
                .collect(),
            counters,
            device_counters,
            events: Vec::new(),
            log: Vec::new(),
        }
    }

    pub fn addr(i: usize) -> SocketAddr {
        format!("10.0.2.{}:6000", i + 1).parse().unwrap()
    }

    /// Move datagrams until nothing moves.
    pub fn pump(&mut self) {
        let mut buf = Vec::new();
        for _ in 0..100 {
            self.now += Duration::from_millis(1);
            let mut moved = false;
            for i in 0..self.devices.len() {
                while self.devices[i].poll_transmit(self.now, &mut buf) {
                    moved = true;
                    self.receiver.handle(self.now, Net::addr(i), &buf);
                    self.log.push(Datagram {
                        from: Some(i),
                        to: None,
                        bytes: buf.clone(),
                    });
                }
            }
            let (_, replies) = self.receiver.take_deliveries();
            for r in replies {
                self.receiver.answer(r);
            }
            while let Some(to) = self.receiver.poll_transmit(self.now, &mut buf) {
                moved = true;
                let i = (0..self.devices.len()).find(|i| Net::addr(*i) == to);
                if let Some(i) = i {
                    self.devices[i].handle(self.now, &buf);
                }
                self.log.push(Datagram {
                    from: None,
                    to: i,
                    bytes: buf.clone(),
                });
            }
            self.collect_events();
            if !moved {
                return;
            }
        }
        panic!("the exchange does not settle");
    }

    /// Move what the devices report into [`Net::events`].
    pub fn collect_events(&mut self) {
        for i in 0..self.devices.len() {
            while let Some(e) = self.devices[i].poll_event() {
                self.events.push((i, e));
            }
        }
    }

    /// Device `sub` subscribes to [`CHANNEL`] at `qos`; returns the datagram of the subscribe that was taken.
    pub fn subscribe(&mut self, sub: usize, qos: QoS) -> Vec<u8> {
        let from = self.log.len();
        self.devices[sub].subscribe(self.now, CHANNEL, qos);
        self.pump();
        assert!(self
            .events
            .iter()
            .any(|(d, e)| *d == sub && *e == SenderEvent::Subscribed(CHANNEL)));
        // The first subscribe is sealed for no receiver run and answered with the run; the last one is taken.
        self.log[from..]
            .iter()
            .rev()
            .find(|d| d.from == Some(sub) && first_op(&d.bytes) == Some(Op::Subscribe))
            .expect("a subscribe was sent")
            .bytes
            .clone()
    }

    /// Device `publisher` publishes message `id` on [`CHANNEL`] and the datagram is handed over, but nothing moves
    /// back; returns the datagram.
    pub fn publish_only(&mut self, publisher: usize, id: u64, qos: QoS) -> Vec<u8> {
        let payload = transport_pure::client::payload(id, 32);
        self.devices[publisher]
            .publish(self.now, CHANNEL, id, qos, payload)
            .unwrap();
        let mut buf = Vec::new();
        assert!(self.devices[publisher].poll_transmit(self.now, &mut buf));
        buf
    }

    /// What the receiver sends now, by destination device, without handing it over.
    pub fn receiver_output(&mut self) -> Vec<(Option<usize>, Vec<u8>)> {
        let mut out = Vec::new();
        let mut buf = Vec::new();
        while let Some(to) = self.receiver.poll_transmit(self.now, &mut buf) {
            out.push((
                (0..self.devices.len()).find(|i| Net::addr(*i) == to),
                buf.clone(),
            ));
        }
        out
    }

    /// The ids device `i` reported delivered.
    pub fn delivered(&self, i: usize) -> Vec<u64> {
        self.events
            .iter()
            .filter_map(|(d, e)| match e {
                SenderEvent::Delivered { id, .. } if *d == i => Some(*id),
                _ => None,
            })
            .collect()
    }
}

/// The op of a datagram's first frame (a bundle and an answer bundle carry orders).
pub fn first_op(bytes: &[u8]) -> Option<Op> {
    match wire::parse_frame(bytes).ok()?.0 {
        Frame::Record(r) if r.op == Op::Bundle => Some(Op::Order),
        Frame::Record(r) => Some(r.op),
        Frame::Answer(a) => Some(a.op),
        Frame::AnswerBundle(_) => Some(Op::Order),
    }
}
