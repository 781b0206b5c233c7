//! The receiver's protocol core, sans-IO: datagrams in, orders to store and answers out.
//!
//! The driver feeds every datagram to [`Receiver::handle`], takes the opened orders with
//! [`Receiver::take_deliveries`], commits them to the store, hands each [`Reply`] back with [`Receiver::answer`]
//! once the commit returned (so "stored" is never said before the order is durable), and sends what
//! [`Receiver::poll_transmit`] yields. The receiver keeps no timers; the only state it keeps is a cache of keys,
//! which it can always derive again.

use crate::crypto::{link_secret, AnswerKey, NodeKey, OpenError, WireKeys};
use crate::senders::AllowList;
use crate::wire::{self, Frame, Kind, Record, ENC_LEN, MAX_DATAGRAM, TAG_LEN};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use transport_core::{Counters, Order, OrderId};

/// Where link secrets come from: computed (one X25519 each) or remembered across restarts (the memo).
pub trait LinkSecrets: Send {
    /// The link secret of allowed sender `index` (public key `sender`), computing it if needed.
    /// Returns the secret and whether an X25519 was done for it.
    fn get(&mut self, index: usize, sender: &[u8; 32], node: &NodeKey) -> ([u8; 32], bool);
}

/// Link secrets kept in memory only: each sender costs one X25519 per receiver start.
#[derive(Default)]
pub struct InMemorySecrets {
    secrets: HashMap<usize, [u8; 32]>,
}

impl LinkSecrets for InMemorySecrets {
    fn get(&mut self, index: usize, sender: &[u8; 32], node: &NodeKey) -> ([u8; 32], bool) {
        if let Some(s) = self.secrets.get(&index) {
            return (*s, false);
        }
        let s = link_secret(node, sender, sender, node.public());
        self.secrets.insert(index, s);
        (s, true)
    }
}

/// What a receiver is configured with.
pub struct ReceiverConfig {
    /// The kind of records this receiver takes (its variant); other kinds are refused.
    pub kind: Kind,
    /// The receiver's static key.
    pub key: NodeKey,
    /// The senders it takes records from.
    pub senders: AllowList,
    /// This start's run: a new random number at every start.
    pub run: u64,
    /// How many HPKE sessions to keep opened (oldest replaced first).
    pub session_capacity: usize,
    /// Where link secrets come from (`Link` kind).
    pub secrets: Box<dyn LinkSecrets>,
}

/// The answer to one record, to be sent once its order is stored.
#[derive(Debug, Clone, Copy)]
pub struct Reply {
    to: SocketAddr,
    len: u8,
    frame: [u8; wire::ANSWER_HEADER_LEN + TAG_LEN],
}

impl Reply {
    /// The order id this reply answers (for logs and tests).
    pub fn to(&self) -> SocketAddr {
        self.to
    }
}

struct Session {
    keys: WireKeys,
    answer: AnswerKey,
}

struct LinkWire {
    keys: WireKeys,
    answer: AnswerKey,
}

/// The receiver's state.
pub struct Receiver {
    kind: Kind,
    key: NodeKey,
    senders: AllowList,
    run: u64,
    counters: Arc<Counters>,
    session_capacity: usize,
    sessions: HashMap<[u8; ENC_LEN], Session>,
    session_order: VecDeque<[u8; ENC_LEN]>,
    secrets: Box<dyn LinkSecrets>,
    links: HashMap<(usize, u64, u64), LinkWire>,
    orders: Vec<Order>,
    replies: Vec<Reply>,
    outgoing: HashMap<SocketAddr, Vec<u8>>,
    outgoing_order: VecDeque<SocketAddr>,
}

impl Receiver {
    /// A receiver for one start (run).
    pub fn new(config: ReceiverConfig, counters: Arc<Counters>) -> Receiver {
        Receiver {
            kind: config.kind,
            key: config.key,
            senders: config.senders,
            run: config.run,
            counters,
            session_capacity: config.session_capacity.max(1),
            sessions: HashMap::new(),
            session_order: VecDeque::new(),
            secrets: config.secrets,
            links: HashMap::new(),
            orders: Vec::new(),
            replies: Vec::new(),
            outgoing: HashMap::new(),
            outgoing_order: VecDeque::new(),
        }
    }

    /// This start's run.
    pub fn run(&self) -> u64 {
        self.run
    }

    /// Take in one datagram. Records that open become deliveries; everything else is refused and counted.
    pub fn handle(&mut self, from: SocketAddr, datagram: &[u8]) {
        for frame in wire::frames(datagram) {
            match frame {
                Ok(Frame::Record(r)) => {
                    Counters::inc(&self.counters.received);
                    self.record(from, &r);
                }
                Ok(Frame::Answer(_)) | Err(_) => {
                    Counters::inc(&self.counters.refused_malformed);
                    // A malformed frame leaves the rest of the datagram unaligned: `frames` stops there.
                }
            }
        }
    }

    fn record(&mut self, from: SocketAddr, r: &Record<'_>) {
        if r.kind != self.kind {
            Counters::inc(&self.counters.refused_malformed);
            return;
        }
        let Some((index, sender)) = self.senders.find(&r.key_id) else {
            Counters::inc(&self.counters.refused_unknown);
            return;
        };
        let (sender_id, sender_public) = (sender.sender_id, sender.public);
        let opened = match r.kind {
            Kind::Plain => {
                let (made, payload) = r.body.split_at(wire::MADE_LEN);
                Ok((
                    u64::from_be_bytes(made.try_into().expect("8 bytes")),
                    payload.to_vec(),
                    None,
                ))
            }
            Kind::HpkeSession => self.open_session(r, &sender_public),
            Kind::HpkePerRequest => self.open_per_request(r, &sender_public),
            Kind::Link => self.open_link(index, r, &sender_public),
        };
        let (made_us, payload, answer_key) = match opened {
            Ok(x) => x,
            Err(_) => {
                Counters::inc(&self.counters.refused_forged);
                return;
            }
        };
        let mut frame = [0u8; wire::ANSWER_HEADER_LEN + TAG_LEN];
        let mut buf = Vec::with_capacity(frame.len());
        let header = wire::put_answer_header(&mut buf, r.kind, &r.key_id, r.run, r.seq, self.run);
        if let Some(key) = &answer_key {
            let tag = key.tag(r.seq, &buf[header]);
            buf.extend_from_slice(&tag);
        }
        frame[..buf.len()].copy_from_slice(&buf);
        self.orders.push(Order {
            id: OrderId {
                sender: sender_id,
                run: r.run,
                seq: r.seq,
            },
            made_us,
            payload,
        });
        self.replies.push(Reply {
            to: from,
            len: buf.len() as u8,
            frame,
        });
    }

    fn open_session(
        &mut self,
        r: &Record<'_>,
        sender: &[u8; 32],
    ) -> Result<(u64, Vec<u8>, Option<AnswerKey>), OpenError> {
        let enc = *r.enc().expect("HPKE kinds carry enc");
        if !self.sessions.contains_key(&enc) {
            // Auth-mode decapsulation: two X25519 (with the ephemeral key, and with the sender's static key).
            Counters::add(&self.counters.x25519, 2);
            Counters::inc(&self.counters.key_derivations);
            let keys = WireKeys::hpke_receiver(&self.key, sender, &enc)?;
            let (made, payload) = keys.open_record(r.seq, r.header, r.body)?;
            let answer = keys.answer_key(self.run);
            if self.sessions.len() >= self.session_capacity {
                if let Some(old) = self.session_order.pop_front() {
                    self.sessions.remove(&old);
                }
            }
            self.sessions.insert(
                enc,
                Session {
                    keys,
                    answer: answer.clone(),
                },
            );
            self.session_order.push_back(enc);
            return Ok((made, payload, Some(answer)));
        }
        let s = &self.sessions[&enc];
        // The session was opened for the sender named when it was first seen; the key id in the header is part of
        // the associated data, so a record naming another sender under this enc does not open.
        let (made, payload) = s.keys.open_record(r.seq, r.header, r.body)?;
        Ok((made, payload, Some(s.answer.clone())))
    }

    fn open_per_request(
        &mut self,
        r: &Record<'_>,
        sender: &[u8; 32],
    ) -> Result<(u64, Vec<u8>, Option<AnswerKey>), OpenError> {
        Counters::add(&self.counters.x25519, 2);
        Counters::inc(&self.counters.key_derivations);
        let keys =
            WireKeys::hpke_receiver(&self.key, sender, r.enc().expect("HPKE kinds carry enc"))?;
        let (made, payload) = keys.open_record(r.seq, r.header, r.body)?;
        Ok((made, payload, Some(keys.answer_key(self.run))))
    }

    fn open_link(
        &mut self,
        index: usize,
        r: &Record<'_>,
        sender: &[u8; 32],
    ) -> Result<(u64, Vec<u8>, Option<AnswerKey>), OpenError> {
        let receiver_run = r
            .receiver_run()
            .expect("link records carry the receiver run");
        let wire_id = (index, r.run, receiver_run);
        if !self.links.contains_key(&wire_id) {
            let (secret, agreed) = self.secrets.get(index, sender, &self.key);
            if agreed {
                Counters::inc(&self.counters.x25519);
            }
            // An unknown (sender run, receiver run): the record key and the answer key, two HKDFs.
            Counters::inc(&self.counters.key_derivations);
            let keys = WireKeys::link(&secret, r.run, receiver_run);
            let opened = keys.open_record(r.seq, r.header, r.body)?;
            let answer = keys.answer_key(self.run);
            self.links.insert(
                wire_id,
                LinkWire {
                    keys,
                    answer: answer.clone(),
                },
            );
            return Ok((opened.0, opened.1, Some(answer)));
        }
        let w = &self.links[&wire_id];
        let (made, payload) = w.keys.open_record(r.seq, r.header, r.body)?;
        Ok((made, payload, Some(w.answer.clone())))
    }

    /// The orders opened since the last call, and their replies (same order, same length).
    pub fn take_deliveries(&mut self) -> (Vec<Order>, Vec<Reply>) {
        (
            std::mem::take(&mut self.orders),
            std::mem::take(&mut self.replies),
        )
    }

    /// Queue the answer "stored" for a delivery whose order the store has committed (or had already applied).
    pub fn answer(&mut self, reply: &Reply) {
        let buf = self.outgoing.entry(reply.to).or_insert_with(|| {
            self.outgoing_order.push_back(reply.to);
            Vec::new()
        });
        buf.extend_from_slice(&reply.frame[..reply.len as usize]);
    }

    /// The next datagram to send: fills `buf` and returns its destination.
    pub fn poll_transmit(&mut self, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        buf.clear();
        let to = *self.outgoing_order.front()?;
        let pending = self
            .outgoing
            .get_mut(&to)
            .expect("queued destinations have bytes");
        let frame_len = self.kind.answer_len();
        let take = pending.len().min(MAX_DATAGRAM / frame_len * frame_len);
        buf.extend_from_slice(&pending[..take]);
        pending.drain(..take);
        if pending.is_empty() {
            self.outgoing.remove(&to);
            self.outgoing_order.pop_front();
        }
        Some(to)
    }
}
