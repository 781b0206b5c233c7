//! The receiver's protocol core, sans-IO: datagrams in; orders to store, answers and deliveries out.
//!
//! The driver feeds every datagram to [`Receiver::handle`], takes the opened orders with
//! [`Receiver::take_deliveries`], commits them to the store, hands each [`Reply`] back with [`Receiver::answer`]
//! once the commit returned (so "stored" is never said before the order is durable), and sends what
//! [`Receiver::poll_transmit`] yields; it calls [`Receiver::handle_timeout`] when [`Receiver::poll_timeout`] says.
//! Subscribes and publishes go to the [`Relay`] (never to the store) and are answered at once; the relay's only
//! timers are its re-sends of QoS 1 deliveries. Besides the relay's bounded queues, the receiver keeps bounded caches
//! of keys, which it can always derive again, and of the numbers seen per publish/subscribe wire.
//!
//! Anyone can send it datagrams, so what it spends on one is bounded before it looks inside: a datagram over
//! [`MAX_DATAGRAM`] is refused unread, every length is checked before use, HPKE setups per datagram are capped and
//! stop at the first refused record, failed setups are remembered, and a cached HPKE session opens only records of
//! the sender it was set up by. `docs/pure.md` ("What each hostile input does") lists every case.

use crate::cache::Bounded;
use crate::crypto::{
    check_public, link_secret, AnswerKey, LowOrderKey, NodeKey, OpenError, WireKeys,
};
use crate::flow::{ReplayWindow, Seen};
use crate::relay::{Relay, RelayConfig, Sealing};
use crate::senders::AllowList;
use crate::wire::{
    self, Answer, Frame, Kind, Op, Record, ENC_LEN, MADE_LEN, MAX_DATAGRAM, TAG_LEN,
};
use foldhash::{HashMap, HashMapExt};
use rand::rngs::StdRng;
use rand::Rng;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use transport_core::{Counters, Order, OrderId, QoS};

/// HPKE setups (two X25519 each) one datagram may cost at most. A full datagram of per-request records with empty
/// payloads carries 14; the first record of a datagram that is refused also ends its setups.
pub const MAX_SETUPS_PER_DATAGRAM: usize = 16;

/// HPKE setups whose record did not open, remembered so that the same forgery again costs no X25519.
pub const FAILED_SETUPS_REMEMBERED: usize = 4096;

/// Where link secrets come from: computed (one X25519 each) or remembered across restarts (the memo).
pub trait LinkSecrets: Send {
    /// The link secret of allowed sender `index` (public key `sender`), computing it if needed.
    /// Returns the secret and whether an X25519 was done for it; a sender key of small order is refused.
    fn get(
        &mut self,
        index: usize,
        sender: &[u8; 32],
        node: &NodeKey,
    ) -> Result<([u8; 32], bool), LowOrderKey>;
}

/// Link secrets kept in memory only: each sender costs one X25519 per receiver start.
#[derive(Default)]
pub struct InMemorySecrets {
    secrets: HashMap<usize, [u8; 32]>,
}

impl LinkSecrets for InMemorySecrets {
    fn get(
        &mut self,
        index: usize,
        sender: &[u8; 32],
        node: &NodeKey,
    ) -> Result<([u8; 32], bool), LowOrderKey> {
        if let Some(s) = self.secrets.get(&index) {
            return Ok((*s, false));
        }
        let s = link_secret(node, sender, sender, node.public())?;
        self.secrets.insert(index, s);
        Ok((s, true))
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
    /// How many wires' keys to keep: opened HPKE sessions, and link keys per (sender, sender run, receiver run),
    /// each least recently used forgotten first (they are derived again if needed).
    pub session_capacity: usize,
    /// Where link secrets come from (`Link` kind).
    pub secrets: Box<dyn LinkSecrets>,
    /// The relay's bounds.
    pub relay: RelayConfig,
    /// Randomness for the setups of `hpke-per-request` deliveries.
    pub rng: StdRng,
}

/// The answer to one order record, or to the orders taken from one bundle, to be sent once they are stored.
#[derive(Debug, Clone)]
pub struct Reply {
    to: SocketAddr,
    answer: Answering,
}

/// How a [`Reply`] goes out.
#[derive(Debug, Clone)]
enum Answering {
    /// As an answer frame of its own, built and tagged already (the answer to a record).
    Frame {
        len: u8,
        frame: [u8; wire::ANSWER_HEADER_LEN + TAG_LEN],
    },
    /// As seqs of an answer bundle to its wire, tagged when the bundle is built (the answer to the orders taken
    /// from one bundle: one reply, and one use of the wire's answer key, for all of them).
    Bundle {
        wire: WireId,
        key: Option<AnswerKey>,
        /// The orders' seqs, [`wire::ANSWER_ENTRY_LEN`] bytes each, as the answer bundle carries them.
        seqs: Vec<u8>,
    },
}

/// A device's wire, as its frames name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct WireId {
    kind: Kind,
    key_id: wire::KeyId,
    run: u64,
}

/// Where a frame that opened came from: the datagram's source, the allowed sender whose keys it opened under, and
/// its wire.
#[derive(Debug, Clone, Copy)]
struct Origin {
    from: SocketAddr,
    /// The sender's place in the allow-list.
    index: usize,
    /// The number its orders are stored under.
    sender_id: u64,
    /// Its public key.
    public: [u8; 32],
    wire: WireId,
}

/// What waits to be sent to one address.
#[derive(Debug, Default)]
struct Outgoing {
    /// Answer frames, back to back.
    frames: Vec<u8>,
    /// Answers to bundles, one list per wire (a wire whose list is not among the last few, or was sent, starts a
    /// new one: two answer bundles where one would do, never an answer lost), in the order they were first
    /// answered.
    bundles: Vec<Pending>,
    /// Lists before this one are sent.
    sent: usize,
}

/// Room for the seqs of a bundle's answer, taken at once: the orders of a full datagram of 64-byte orders.
const BUNDLE_SEQS: usize = 16 * wire::ANSWER_ENTRY_LEN;

/// Spare [`Outgoing`]s a receiver keeps: as many addresses as one turn answers, about.
const SPARE_OUTGOING: usize = 1024;

/// Spare buffers of seqs a receiver keeps (a bundle's reply takes one, and it becomes the list of its wire's
/// answers or goes back): about the bundles of one turn.
const SPARE_SEQS: usize = 4096;

/// The largest buffer of seqs kept for reuse (a list that grew beyond it is freed), so that the spare buffers hold
/// at most 16 MiB whatever the lists once were.
const SPARE_SEQS_CAPACITY: usize = 4096;

/// Keep `seqs`, emptied, for a next bundle's reply, if there is room and it is not oversized.
fn recycle(spare: &mut Vec<Vec<u8>>, mut seqs: Vec<u8>) {
    if spare.len() < SPARE_SEQS && seqs.capacity() <= SPARE_SEQS_CAPACITY {
        seqs.clear();
        spare.push(seqs);
    }
}

/// How many of the newest lists an answer looks through for its wire's: one address is mostly one device, and the
/// orders of one group come a datagram (so a wire) at a time.
const LISTS_SEARCHED: usize = 8;

/// The answers to one wire's bundles not sent yet.
#[derive(Debug)]
struct Pending {
    wire: WireId,
    key: Option<AnswerKey>,
    /// Seqs, [`wire::ANSWER_ENTRY_LEN`] bytes each.
    entries: Vec<u8>,
    /// Bytes of `entries` sent.
    taken: usize,
}

impl Reply {
    /// Where the answer goes: the source address of the record's datagram.
    pub fn to(&self) -> SocketAddr {
        self.to
    }

    /// How many of the orders delivered it answers: one for an order record, each order taken from a bundle for a
    /// bundle's.
    pub fn orders(&self) -> usize {
        match &self.answer {
            Answering::Frame { .. } => 1,
            Answering::Bundle { seqs, .. } => seqs.len() / wire::ANSWER_ENTRY_LEN,
        }
    }
}

impl Origin {
    /// The id an order numbered `seq` from this origin is stored under.
    fn order_id(&self, seq: u64) -> OrderId {
        OrderId {
            sender: self.sender_id,
            run: self.wire.run,
            seq,
        }
    }
}

/// An HPKE session, bound to the allowed sender whose record first opened under it.
struct Session {
    sender: usize,
    keys: WireKeys,
    answer: AnswerKey,
}

struct LinkWire {
    keys: WireKeys,
    answer: AnswerKey,
}

/// Why a record was refused (each counted under its kind).
enum Refused {
    /// Does not parse as its kind says.
    Malformed,
    /// Names no allowed sender.
    Unknown,
    /// Does not open under the named sender's keys.
    Forged,
    /// Opened, so its sender sealed it, but its fields are invalid or over a bound (a subscribe to more channels than
    /// the relay keeps, answered with a refusal). Counted as malformed.
    Invalid,
}

impl From<OpenError> for Refused {
    fn from(e: OpenError) -> Refused {
        match e {
            OpenError::Short => Refused::Malformed,
            OpenError::Setup | OpenError::Tag => Refused::Forged,
        }
    }
}

/// What opened: the plaintext, the key that tags the answer, and the wire's keys (none for plain).
struct Opened {
    plain: Vec<u8>,
    answer: Option<AnswerKey>,
    wire: Option<WireKeys>,
}

/// A record to take (not a bundle: its orders are taken one by one, [`Receiver::bundle`]).
struct Taken {
    op: Op,
    number: u64,
    plain: Vec<u8>,
}

/// The keys of the wire a frame opened on (none for plain).
struct Keys {
    answer: Option<AnswerKey>,
    wire: Option<WireKeys>,
}

/// What one datagram may still spend on HPKE setups.
struct SetupBudget {
    left: usize,
    /// A record of this datagram did not open or named no allowed sender: no honest device sends one, so no more
    /// setups for it.
    refused: bool,
}

/// The receiver's state.
pub struct Receiver {
    kind: Kind,
    key: NodeKey,
    senders: AllowList,
    run: u64,
    counters: Arc<Counters>,
    sessions: Bounded<[u8; ENC_LEN], Session>,
    /// Setups from (sender, enc) whose record did not open: their keys (`None` if the setup itself failed). Keys,
    /// not a bare verdict, because a forger can copy an honest device's enc: that device's record must still open.
    failed_setups: Bounded<(usize, [u8; ENC_LEN]), Option<WireKeys>>,
    secrets: Box<dyn LinkSecrets>,
    links: Bounded<(usize, u64, u64), LinkWire>,
    /// The subscribe and publish numbers seen per (sender, sender run, op), kept once a record opens.
    seen: Bounded<(usize, u64, Op), ReplayWindow>,
    relay: Relay,
    orders: Vec<Order>,
    replies: Vec<Reply>,
    outgoing: HashMap<SocketAddr, Outgoing>,
    outgoing_order: VecDeque<SocketAddr>,
    /// What was sent to an address, emptied, for the next address: its buffers keep their room.
    spare_outgoing: Vec<Outgoing>,
    /// Buffers of seqs, emptied, for the next bundles' replies.
    spare_seqs: Vec<Vec<u8>>,
    /// The number of the next answer bundle: one count for every wire, from a random start, so that no number is
    /// used twice under one answer key (see `docs/pure.md`).
    next_answer_bundle: u64,
}

impl Receiver {
    /// A receiver for one start (run).
    pub fn new(config: ReceiverConfig, counters: Arc<Counters>) -> Receiver {
        let capacity = config.session_capacity.max(2);
        let mut rng = config.rng;
        let next_answer_bundle = rng.next_u64();
        let relay = Relay::new(
            config.relay,
            config.kind,
            config.key.clone(),
            config.run,
            rng,
            counters.clone(),
        );
        Receiver {
            kind: config.kind,
            key: config.key,
            senders: config.senders,
            run: config.run,
            counters,
            sessions: Bounded::new(capacity),
            failed_setups: Bounded::new(FAILED_SETUPS_REMEMBERED),
            secrets: config.secrets,
            links: Bounded::new(capacity),
            seen: Bounded::new(capacity),
            relay,
            orders: Vec::new(),
            replies: Vec::new(),
            outgoing: HashMap::new(),
            outgoing_order: VecDeque::new(),
            spare_outgoing: Vec::new(),
            spare_seqs: Vec::new(),
            next_answer_bundle,
        }
    }

    /// This start's run.
    pub fn run(&self) -> u64 {
        self.run
    }

    /// The counters this receiver counts into (the driver adds what only it sees, such as failed sends).
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Wires whose keys are kept (HPKE sessions or link keys), for tests and memory accounting.
    pub fn cached_wires(&self) -> usize {
        self.sessions.len() + self.links.len()
    }

    /// The publish/subscribe relay (for tests and memory accounting).
    pub fn relay(&self) -> &Relay {
        &self.relay
    }

    /// Take in one datagram. Orders that open become deliveries to the store, subscribes and publishes go to the
    /// relay, answers to deliveries to the relay; everything else is refused and counted.
    pub fn handle(&mut self, now: Instant, from: SocketAddr, datagram: &[u8]) {
        if datagram.len() > MAX_DATAGRAM {
            // No sender builds one; refused before any of it is read, so its size buys nothing.
            Counters::inc(&self.counters.refused_oversized);
            return;
        }
        if datagram.is_empty() {
            Counters::inc(&self.counters.refused_malformed);
            return;
        }
        let mut budget = SetupBudget {
            left: MAX_SETUPS_PER_DATAGRAM,
            refused: false,
        };
        for frame in wire::frames(datagram) {
            let result = match frame {
                Ok(Frame::Record(r)) if !r.op.to_device() && r.kind == self.kind => {
                    // A bundle counts each of its entries as it takes them.
                    if r.op != Op::Bundle {
                        Counters::inc(&self.counters.received);
                    }
                    self.record(now, from, &r, &mut budget)
                }
                Ok(Frame::Answer(a)) if a.op == Op::Deliver1 && a.kind == self.kind => {
                    self.delivery_answer(now, &a)
                }
                _ => {
                    // Unparsable (the rest of the datagram is unaligned), of the wrong direction or of another
                    // variant: no honest device sends it, nothing after it is read.
                    Counters::inc(&self.counters.refused_malformed);
                    break;
                }
            };
            if let Err(e) = result {
                // A record that opened and was refused (over a bound) is still its sender's: the records packed
                // after it keep their setups.
                budget.refused |= !matches!(e, Refused::Invalid);
                self.count(&e);
            }
        }
    }

    fn count(&self, e: &Refused) {
        Counters::inc(match e {
            Refused::Malformed | Refused::Invalid => &self.counters.refused_malformed,
            Refused::Unknown => &self.counters.refused_unknown,
            Refused::Forged => &self.counters.refused_forged,
        });
    }

    /// A device's answer to a QoS 1 delivery.
    fn delivery_answer(&mut self, now: Instant, a: &Answer<'_>) -> Result<(), Refused> {
        let (index, _) = self.senders.find(&a.key_id).ok_or(Refused::Unknown)?;
        self.relay
            .answered(now, index, a)
            .map_err(|_| Refused::Forged)
    }

    fn record(
        &mut self,
        now: Instant,
        from: SocketAddr,
        r: &Record<'_>,
        budget: &mut SetupBudget,
    ) -> Result<(), Refused> {
        let (index, sender) = self.senders.find(&r.key_id).ok_or(Refused::Unknown)?;
        let (sender_id, sender_public) = (sender.sender_id, sender.public);
        let opened = match r.kind {
            Kind::Plain => Opened {
                plain: r.body.to_vec(),
                answer: None,
                wire: None,
            },
            Kind::HpkeSession => self.open_session(index, &sender_public, r, budget)?,
            Kind::HpkePerRequest => self.open_per_request(index, &sender_public, r, budget)?,
            Kind::Link => self.open_link(index, &sender_public, r)?,
        };
        let origin = Origin {
            from,
            index,
            sender_id,
            public: sender_public,
            wire: WireId {
                kind: r.kind,
                key_id: r.key_id,
                run: r.run,
            },
        };
        if r.op == Op::Bundle {
            self.bundle(&origin, opened);
            return Ok(());
        }
        let frame = Taken {
            op: r.op,
            number: r.seq,
            plain: opened.plain,
        };
        let keys = Keys {
            answer: opened.answer,
            wire: opened.wire,
        };
        self.take(now, &origin, frame, &keys)
    }

    /// A bundle that opened: each of its orders is taken as an order record of its seq on the bundle's wire would be,
    /// and counted as one received. A malformed entry ends the walk (counted); the orders before it stand.
    ///
    /// The orders taken share one [`Reply`]: their seqs, in the order taken, and the wire's answer key once.
    fn bundle(&mut self, origin: &Origin, opened: Opened) {
        let mut seqs = self
            .spare_seqs
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(BUNDLE_SEQS));
        for entry in wire::entries(&opened.plain) {
            let Ok(e) = entry else {
                Counters::inc(&self.counters.refused_malformed);
                break;
            };
            Counters::inc(&self.counters.received);
            // The order's payload gets a buffer of its own, just as large; `made_us` is read in place.
            let (made, payload) = e.plain.split_at(MADE_LEN);
            self.orders.push(Order {
                id: origin.order_id(e.seq),
                made_us: u64::from_be_bytes(made.try_into().expect("8 bytes")),
                payload: payload.to_vec(),
            });
            seqs.extend_from_slice(&e.seq.to_be_bytes());
        }
        if seqs.is_empty() {
            recycle(&mut self.spare_seqs, seqs);
        } else {
            self.replies.push(Reply {
                to: origin.from,
                answer: Answering::Bundle {
                    wire: origin.wire,
                    key: opened.answer,
                    seqs,
                },
            });
        }
    }

    /// A record that opened: an order to the store, a subscribe or publish to the relay.
    fn take(
        &mut self,
        now: Instant,
        origin: &Origin,
        frame: Taken,
        keys: &Keys,
    ) -> Result<(), Refused> {
        if frame.op != Op::Order {
            return self.pubsub(now, origin, frame, keys);
        }
        let mut payload = frame.plain;
        let made = payload
            .first_chunk::<MADE_LEN>()
            .map(|m| u64::from_be_bytes(*m))
            .ok_or(Refused::Invalid)?;
        payload.drain(..MADE_LEN);
        let reply = self.reply(origin, frame.op, frame.number, keys.answer.as_ref(), false);
        self.orders.push(Order {
            id: origin.order_id(frame.number),
            made_us: made,
            payload,
        });
        self.replies.push(reply);
        Ok(())
    }

    /// The answer frame to record `number` of `op` from `origin`, tagged with `key` (none: plain); a refusal if
    /// `refused` (subscribes only). A bundle's orders are answered in an answer bundle instead ([`Receiver::bundle`]).
    fn reply(
        &self,
        origin: &Origin,
        op: Op,
        number: u64,
        key: Option<&AnswerKey>,
        refused: bool,
    ) -> Reply {
        let to = origin.from;
        let mut frame = [0u8; wire::ANSWER_HEADER_LEN + TAG_LEN];
        let mut buf = Vec::with_capacity(frame.len());
        let WireId { kind, key_id, run } = origin.wire;
        let header = if refused {
            wire::put_refusal_header(&mut buf, kind, &key_id, run, number, self.run)
        } else {
            wire::put_answer_header(&mut buf, kind, op, &key_id, run, number, self.run)
        };
        if let Some(key) = key {
            let tag = key.tag(op, number, &buf[header]);
            buf.extend_from_slice(&tag);
        }
        frame[..buf.len()].copy_from_slice(&buf);
        Reply {
            to,
            answer: Answering::Frame {
                len: buf.len() as u8,
                frame,
            },
        }
    }

    /// A subscribe or publish that opened. Subscribes and QoS 1 publishes are taken only when sealed for this
    /// receiver run, and answered at once (a stale one with this run, so the device seals it again for it);
    /// numbers seen before on the wire are answered again and change nothing. A subscribe for this run over the
    /// channel bound is answered with a refusal, so that the device stops sending it; a copy seen before is answered
    /// as the relay would answer it now (refused while the device holds as many other channels).
    fn pubsub(
        &mut self,
        now: Instant,
        origin: &Origin,
        frame: Taken,
        keys: &Keys,
    ) -> Result<(), Refused> {
        let (op, number, run) = (frame.op, frame.number, origin.wire.run);
        let (from, index, sender_public) = (origin.from, origin.index, &origin.public);
        let p = &frame.plain;
        let (Some(receiver_run), Some(channel)) = (
            p.first_chunk::<8>().map(|b| u64::from_be_bytes(*b)),
            p.get(8..12)
                .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes"))),
        ) else {
            return Err(Refused::Invalid);
        };
        let current = receiver_run == self.run;
        let mut over_bound = false;
        let seen = self
            .seen
            .get_or_insert_with((index, run, op), ReplayWindow::default)
            .check(number);
        match op {
            Op::Subscribe => {
                let qos = match p.get(12..) {
                    Some([0]) => QoS::AtMostOnce,
                    Some([1]) => QoS::AtLeastOnce,
                    _ => return Err(Refused::Invalid),
                };
                if current && seen == Seen::New {
                    let (kind, run) = (self.kind, self.run);
                    let counters = &self.counters;
                    let sealing = || match (kind, &keys.wire) {
                        (Kind::HpkePerRequest, _) => Sealing::PerDelivery(*sender_public),
                        (_, Some(wire)) => {
                            Counters::inc(&counters.key_derivations);
                            Sealing::Wire(wire.deliver_keys(run))
                        }
                        (_, None) => Sealing::Plain,
                    };
                    over_bound = self
                        .relay
                        .subscribe(
                            now,
                            index,
                            origin.wire.key_id,
                            origin.wire.run,
                            sealing,
                            from,
                            channel,
                            qos,
                        )
                        .is_err();
                }
            }
            Op::Publish1 | Op::Publish0 => {
                let id = p
                    .get(12..20)
                    .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
                    .ok_or(Refused::Invalid)?;
                let qos = if op == Op::Publish1 {
                    QoS::AtLeastOnce
                } else {
                    QoS::AtMostOnce
                };
                // A QoS 0 publish is taken whatever run it names: it is never answered, so its device may never
                // learn a new one.
                let take = (current || qos == QoS::AtMostOnce) && seen == Seen::New;
                if take && !self.relay.publish(now, channel, qos, id, &p[20..]) {
                    // Not taken (a subscriber's queue is full): not answered, the publisher sends it again.
                    return Ok(());
                }
            }
            Op::Order | Op::Deliver1 | Op::Deliver0 | Op::Bundle => return Err(Refused::Invalid),
        }
        if seen == Seen::New && (current || op == Op::Publish0) {
            if let Some(w) = self.seen.get_mut(&(index, run, op)) {
                w.mark(number);
            }
        }
        if op.answered() {
            let refused = op == Op::Subscribe && current && self.relay.refuses(index, channel);
            let reply = self.reply(origin, op, number, keys.answer.as_ref(), refused);
            self.answer(reply);
        }
        if over_bound {
            // Answered (refused), and counted as a record refused for what it says.
            return Err(Refused::Invalid);
        }
        Ok(())
    }

    /// The keys of an HPKE auth-mode setup from allowed sender `index` with `enc`: remembered from an earlier
    /// record that did not open, or set up now (two X25519) if the datagram may still spend one.
    fn setup(
        &mut self,
        index: usize,
        sender: &[u8; 32],
        enc: &[u8; ENC_LEN],
        budget: &mut SetupBudget,
    ) -> Result<WireKeys, Refused> {
        if let Some(known) = self.failed_setups.get(&(index, *enc)) {
            return known.clone().ok_or(Refused::Forged);
        }
        // A point of small order makes the setup's DH zero (RFC 9180 7.1.4): refused before the X25519.
        if check_public(enc).is_err() || budget.refused || budget.left == 0 {
            return Err(Refused::Forged);
        }
        budget.left -= 1;
        // Auth-mode decapsulation: two X25519 (with the ephemeral key, and with the sender's static key).
        Counters::add(&self.counters.x25519, 2);
        Counters::inc(&self.counters.key_derivations);
        match WireKeys::hpke_receiver(&self.key, sender, enc) {
            Ok(keys) => Ok(keys),
            Err(e) => {
                self.failed_setups.insert((index, *enc), None);
                Err(e.into())
            }
        }
    }

    fn open_session(
        &mut self,
        index: usize,
        sender: &[u8; 32],
        r: &Record<'_>,
        budget: &mut SetupBudget,
    ) -> Result<Opened, Refused> {
        let enc = r.enc().ok_or(Refused::Malformed)?;
        if let Some(s) = self.sessions.get(enc) {
            // Whoever holds a session's keys can seal any header under them: a record naming another sender than
            // the one whose record opened the session is that holder's forgery (or a copy of it).
            if s.sender != index {
                return Err(Refused::Forged);
            }
            let plain = s.keys.open(r.op, r.seq, r.header, r.body)?;
            return Ok(Opened {
                plain,
                answer: Some(s.answer.clone()),
                wire: Some(s.keys.clone()),
            });
        }
        let keys = self.setup(index, sender, enc, budget)?;
        match keys.open(r.op, r.seq, r.header, r.body) {
            Ok(plain) => {
                let answer = keys.answer_key(self.run);
                self.failed_setups.remove(&(index, *enc));
                self.sessions.insert(
                    *enc,
                    Session {
                        sender: index,
                        keys: keys.clone(),
                        answer: answer.clone(),
                    },
                );
                Ok(Opened {
                    plain,
                    answer: Some(answer),
                    wire: Some(keys),
                })
            }
            Err(e) => {
                self.failed_setups.insert((index, *enc), Some(keys));
                Err(e.into())
            }
        }
    }

    fn open_per_request(
        &mut self,
        index: usize,
        sender: &[u8; 32],
        r: &Record<'_>,
        budget: &mut SetupBudget,
    ) -> Result<Opened, Refused> {
        let enc = r.enc().ok_or(Refused::Malformed)?;
        // Setups that opened are not kept: one per record is what this variant measures.
        let keys = self.setup(index, sender, enc, budget)?;
        match keys.open(r.op, r.seq, r.header, r.body) {
            Ok(plain) => Ok(Opened {
                plain,
                answer: Some(keys.answer_key(self.run)),
                wire: Some(keys),
            }),
            Err(e) => {
                self.failed_setups.insert((index, *enc), Some(keys));
                Err(e.into())
            }
        }
    }

    fn open_link(
        &mut self,
        index: usize,
        sender: &[u8; 32],
        r: &Record<'_>,
    ) -> Result<Opened, Refused> {
        let receiver_run = r.receiver_run().ok_or(Refused::Malformed)?;
        let wire_id = (index, r.run, receiver_run);
        if let Some(w) = self.links.get(&wire_id) {
            let plain = w.keys.open(r.op, r.seq, r.header, r.body)?;
            return Ok(Opened {
                plain,
                answer: Some(w.answer.clone()),
                wire: Some(w.keys.clone()),
            });
        }
        let (secret, agreed) = self
            .secrets
            .get(index, sender, &self.key)
            .map_err(|_| Refused::Forged)?;
        if agreed {
            Counters::inc(&self.counters.x25519);
        }
        // An unknown (sender run, receiver run): the record key and the answer key, two HKDFs. Kept only once a
        // record opens under them, so forged runs cost hashes, never memory.
        Counters::inc(&self.counters.key_derivations);
        let keys = WireKeys::link(&secret, r.run, receiver_run);
        let plain = keys.open(r.op, r.seq, r.header, r.body)?;
        let answer = keys.answer_key(self.run);
        self.links.insert(
            wire_id,
            LinkWire {
                keys: keys.clone(),
                answer: answer.clone(),
            },
        );
        Ok(Opened {
            plain,
            answer: Some(answer),
            wire: Some(keys),
        })
    }

    /// Move the orders opened since the last call, and their replies (one per order record, one per bundle for the
    /// orders taken from it; in the order of the orders, [`Reply::orders`] of them each), to the end of
    /// `orders` and `replies`; the receiver keeps its buffers' room for the next datagrams.
    pub fn move_deliveries(&mut self, orders: &mut Vec<Order>, replies: &mut Vec<Reply>) {
        orders.append(&mut self.orders);
        replies.append(&mut self.replies);
    }

    /// The orders opened since the last call, and their replies (as [`Receiver::move_deliveries`] says).
    pub fn take_deliveries(&mut self) -> (Vec<Order>, Vec<Reply>) {
        (
            std::mem::take(&mut self.orders),
            std::mem::take(&mut self.replies),
        )
    }

    /// Queue the answer "stored" for the orders of a reply once the store has committed them (or had already
    /// applied them).
    pub fn answer(&mut self, reply: Reply) {
        let out = self.outgoing.entry(reply.to).or_insert_with(|| {
            self.outgoing_order.push_back(reply.to);
            self.spare_outgoing.pop().unwrap_or_default()
        });
        match reply.answer {
            Answering::Frame { len, frame } => out.frames.extend_from_slice(&frame[..len as usize]),
            Answering::Bundle { wire, key, seqs } => {
                let unsent = &out.bundles[out.sent..];
                let found = unsent
                    .iter()
                    .rev()
                    .take(LISTS_SEARCHED)
                    .position(|p| p.wire == wire)
                    .map(|back| out.bundles.len() - 1 - back);
                match found {
                    Some(i) => {
                        out.bundles[i].entries.extend_from_slice(&seqs);
                        recycle(&mut self.spare_seqs, seqs);
                    }
                    // The reply's seqs become the wire's list, and its key the list's.
                    None => out.bundles.push(Pending {
                        wire,
                        key,
                        entries: seqs,
                        taken: 0,
                    }),
                }
            }
        }
    }

    /// The next datagram to send: fills `buf` and returns its destination. Answers go first (answer frames, then
    /// answer bundles, as many as fit), then deliveries.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        buf.clear();
        let Some(&to) = self.outgoing_order.front() else {
            return self.relay.poll_transmit(now, buf);
        };
        let out = self
            .outgoing
            .get_mut(&to)
            .expect("queued destinations have answers");
        let frame_len = self.kind.answer_len();
        let take = out.frames.len().min(MAX_DATAGRAM / frame_len * frame_len);
        buf.extend_from_slice(&out.frames[..take]);
        out.frames.drain(..take);
        if out.frames.is_empty() {
            while let Some(list) = out.bundles.get_mut(out.sent) {
                let room = MAX_DATAGRAM - buf.len();
                let left = (list.entries.len() - list.taken) / wire::ANSWER_ENTRY_LEN;
                let fit = room.saturating_sub(wire::answer_bundle_len(list.wire.kind, 0))
                    / wire::ANSWER_ENTRY_LEN;
                let count = left.min(fit);
                if count == 0 {
                    break;
                }
                let number = self.next_answer_bundle;
                self.next_answer_bundle = number.wrapping_add(1);
                let WireId { kind, key_id, run } = list.wire;
                let start = wire::put_answer_bundle_header(
                    buf, kind, &key_id, run, number, self.run, count,
                );
                let end = list.taken + count * wire::ANSWER_ENTRY_LEN;
                buf.extend_from_slice(&list.entries[list.taken..end]);
                list.taken = end;
                if let Some(key) = &list.key {
                    let tag = key.tag(Op::Bundle, number, &buf[start..]);
                    buf.extend_from_slice(&tag);
                }
                if list.taken == list.entries.len() {
                    out.sent += 1;
                }
            }
        }
        if out.frames.is_empty() && out.sent == out.bundles.len() {
            let mut done = self.outgoing.remove(&to).expect("looked up above");
            self.outgoing_order.pop_front();
            for list in done.bundles.drain(..) {
                recycle(&mut self.spare_seqs, list.entries);
            }
            if self.spare_outgoing.len() < SPARE_OUTGOING {
                done.sent = 0;
                self.spare_outgoing.push(done);
            }
        }
        Some(to)
    }

    /// Whether something is waiting to be sent.
    pub fn has_output(&self) -> bool {
        !self.outgoing_order.is_empty() || self.relay.has_output()
    }

    /// When [`Receiver::handle_timeout`] should be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.relay.poll_timeout()
    }

    /// Queue the deliveries whose answer is overdue.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.relay.handle_timeout(now);
    }
}
