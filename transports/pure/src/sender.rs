//! The sending side of one device's link, sans-IO: orders in, datagrams and "stored" events out.
//!
//! A device keeps an outbox of orders not yet sent and a window of records in flight. Records leave as soon as
//! the window has room — the backlog goes out as answers come in, not on a timer. A record with no answer is sent
//! again after the re-send timeout, then after twice as long each time, up to 1 s. The timeout starts at 200 ms and
//! follows the measured round trip as TCP's does (RFC 6298: smoothed RTT plus four deviations, samples only from
//! records sent once), never below 200 ms, and backs off with each expiry until the next sample: a receiver that
//! queues records for longer than 200 ms (a slow variant under a drain) does not get every queued record twice. Every input takes `now`; the driver (or a test with a
//! virtual clock) asks [`Sender::poll_timeout`] when to call [`Sender::handle_timeout`].

use crate::crypto::{check_public, link_secret, AnswerKey, LowOrderKey, NodeKey, WireKeys};
use crate::wire::{self, Frame, Kind, ENC_LEN, MAX_DATAGRAM};
use rand::rngs::StdRng;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use transport_core::{Counters, Order, OrderId};

/// The congestion window never shrinks below this many records.
const MIN_WINDOW: f64 = 2.0;

/// How a device's link behaves.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// How records are sealed.
    pub kind: Kind,
    /// Records in flight at most.
    pub window: usize,
    /// The first re-send waits this long.
    pub initial_rto: Duration,
    /// Re-sends wait at most this long.
    pub max_rto: Duration,
}

impl SenderConfig {
    /// The suite's defaults: a window of up to 256 records, re-sends after 200 ms growing to 1 s.
    pub fn new(kind: Kind) -> SenderConfig {
        SenderConfig {
            kind,
            window: 256,
            initial_rto: Duration::from_millis(200),
            max_rto: Duration::from_secs(1),
        }
    }
}

/// What a sender reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SenderEvent {
    /// The receiver answered that this order is stored (reported once).
    Stored(OrderId),
}

struct InFlight {
    order: Order,
    /// When the record was first sent, and whether it was sent again (no RTT sample then: Karn's rule).
    first_sent: Option<Instant>,
    resent: bool,
    /// The sealed frame, and the receiver run it was sealed for (`Link` re-seals when the run changes).
    sealed: Option<(u64, Vec<u8>)>,
    /// Per-request records keep the answer secret of their own setup.
    own_keys: Option<WireKeys>,
    rto: Duration,
    deadline: Instant,
    queued: bool,
}

struct Session {
    run: u64,
    /// The receiver run the keys were derived for (`Link` only).
    receiver_run: u64,
    enc: [u8; ENC_LEN],
    keys: WireKeys,
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
    /// HPKE session (or link keys) of the current sender run.
    session: Option<Session>,
    /// The receiver run the device knows (0: none yet) and the answer key for it.
    receiver_run: u64,
    answer_key: Option<AnswerKey>,
    outbox: VecDeque<Order>,
    in_flight: BTreeMap<u64, InFlight>,
    /// Smoothed round trip and its deviation (RFC 6298), once measured.
    srtt: Option<(Duration, Duration)>,
    /// The device's re-send timeout for new records: from the RTT, doubled by every expiry until a new sample.
    rto: Duration,
    /// Records the device lets be in flight now: halved when a timer expires, grown by one per answer (as TCP's
    /// congestion window), never above the configured window.
    cwnd: f64,
    ready: VecDeque<u64>,
    events: VecDeque<SenderEvent>,
}

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
        let rto = config.initial_rto;
        let window = config.window;
        Ok(Sender {
            config,
            key,
            key_id,
            receiver,
            rng,
            counters,
            link_secret: None,
            session: None,
            receiver_run: 0,
            answer_key: None,
            outbox: VecDeque::new(),
            in_flight: BTreeMap::new(),
            srtt: None,
            rto,
            cwnd: window as f64,
            ready: VecDeque::new(),
            events: VecDeque::new(),
        })
    }

    /// This device's key id (how answers are routed to it).
    pub fn key_id(&self) -> wire::KeyId {
        self.key_id
    }

    /// The receiver run the device knows (0 before the first answer).
    pub fn receiver_run(&self) -> u64 {
        self.receiver_run
    }

    /// Orders handed over and not yet answered.
    pub fn pending(&self) -> usize {
        self.outbox.len() + self.in_flight.len()
    }

    /// Hand over an order. All orders of one device share one sender run (`id.run`); a new run starts a new session.
    pub fn push(&mut self, now: Instant, order: Order) {
        self.outbox.push_back(order);
        self.fill_window(now);
    }

    fn fill_window(&mut self, now: Instant) {
        while self.in_flight.len() < (self.cwnd as usize).max(1) {
            let Some(order) = self.outbox.pop_front() else {
                break;
            };
            let seq = order.id.seq;
            let rto = self.rto();
            self.in_flight.insert(
                seq,
                InFlight {
                    order,
                    first_sent: None,
                    resent: false,
                    sealed: None,
                    own_keys: None,
                    rto,
                    deadline: now + rto,
                    queued: true,
                },
            );
            self.ready.push_back(seq);
        }
    }

    /// Take in a datagram from the receiver.
    pub fn handle(&mut self, now: Instant, datagram: &[u8]) {
        for frame in wire::frames(datagram) {
            let Ok(Frame::Answer(a)) = frame else {
                Counters::inc(&self.counters.refused_malformed);
                break;
            };
            if a.kind != self.config.kind || a.key_id != self.key_id {
                Counters::inc(&self.counters.refused_malformed);
                continue;
            }
            let Some(entry) = self.in_flight.get(&a.seq) else {
                continue;
            };
            if entry.order.id.run != a.run {
                continue;
            }
            if self.config.kind.sealed() {
                let key = match (&entry.own_keys, &self.answer_key) {
                    (Some(own), _) => own.answer_key(a.receiver_run),
                    (None, Some(k)) if k.run() == a.receiver_run => k.clone(),
                    (None, _) => match &self.session {
                        Some(s) if s.run == a.run => s.keys.answer_key(a.receiver_run),
                        _ => continue,
                    },
                };
                if !key.verify(a.seq, a.header, a.tag) {
                    Counters::inc(&self.counters.refused_forged);
                    continue;
                }
                if entry.own_keys.is_none() {
                    self.answer_key = Some(key);
                }
            }
            if a.receiver_run != self.receiver_run {
                // A new receiver run: records sealed from now on name it. Nothing else changes on the device.
                self.receiver_run = a.receiver_run;
            }
            let entry = self.in_flight.remove(&a.seq).expect("looked up above");
            if let (false, Some(sent)) = (entry.resent, entry.first_sent) {
                self.sample_rtt(now.saturating_duration_since(sent));
            }
            self.cwnd = (self.cwnd + 1.0).min(self.config.window as f64);
            self.events.push_back(SenderEvent::Stored(entry.order.id));
        }
        self.fill_window(now);
    }

    fn sample_rtt(&mut self, rtt: Duration) {
        self.srtt = Some(match self.srtt {
            None => (rtt, rtt / 2),
            Some((srtt, var)) => {
                let diff = srtt.abs_diff(rtt);
                ((srtt * 7 + rtt) / 8, (var * 3 + diff) / 4)
            }
        });
        let (srtt, var) = self.srtt.expect("set above");
        self.rto = (srtt + var * 4).clamp(self.config.initial_rto, self.config.max_rto);
    }

    /// The re-send timeout for a record sent now.
    fn rto(&self) -> Duration {
        self.rto
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<SenderEvent> {
        self.events.pop_front()
    }

    /// When [`Sender::handle_timeout`] should be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.in_flight
            .values()
            .filter(|f| !f.queued)
            .map(|f| f.deadline)
            .min()
    }

    /// Queue the records whose answer is overdue, and back their timers off.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut expired = false;
        for (seq, f) in self.in_flight.iter_mut() {
            if !f.queued && f.deadline <= now {
                f.queued = true;
                f.resent = true;
                f.rto = (f.rto * 2).min(self.config.max_rto);
                f.deadline = now + f.rto;
                self.ready.push_back(*seq);
                Counters::inc(&self.counters.resent_timeout);
                expired = true;
            }
        }
        if expired {
            // Back the device's timer off too (RFC 6298, 5.5), until a record answered at the first try measures
            // the round trip again: records sent meanwhile do not time out against a queue they cannot beat.
            self.rto = (self.rto * 2).min(self.config.max_rto);
            self.cwnd = (self.cwnd / 2.0).max(MIN_WINDOW);
        }
    }

    /// Fill `buf` with the next datagram (records packed up to [`MAX_DATAGRAM`]); false when there is nothing to send.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> bool {
        buf.clear();
        while let Some(&seq) = self.ready.front() {
            let Some(f) = self.in_flight.get(&seq) else {
                self.ready.pop_front();
                continue;
            };
            let fresh = match &f.sealed {
                Some((run, _)) => self.config.kind == Kind::Link && *run != self.receiver_run,
                None => true,
            };
            if fresh {
                self.seal(seq);
            }
            let f = self.in_flight.get_mut(&seq).expect("present");
            let frame = &f.sealed.as_ref().expect("sealed above").1;
            if !buf.is_empty() && buf.len() + frame.len() > MAX_DATAGRAM {
                break;
            }
            buf.extend_from_slice(frame);
            f.first_sent.get_or_insert(now);
            f.queued = false;
            f.deadline = now + f.rto;
            self.ready.pop_front();
        }
        !buf.is_empty()
    }

    fn seal(&mut self, seq: u64) {
        let kind = self.config.kind;
        let run = self.in_flight[&seq].order.id.run;
        // The variant header, and the keys the record is sealed with (none for plain).
        let (variant, keys): (Vec<u8>, Option<WireKeys>) = match kind {
            Kind::Plain => (Vec::new(), None),
            Kind::HpkePerRequest => {
                Counters::add(&self.counters.x25519, 3);
                let (enc, keys) = WireKeys::hpke_sender(&mut self.rng, &self.key, &self.receiver);
                (enc.to_vec(), Some(keys))
            }
            Kind::HpkeSession => {
                self.session_for(run);
                let s = self.session.as_ref().expect("set above");
                (s.enc.to_vec(), Some(s.keys.clone()))
            }
            Kind::Link => {
                self.session_for(run);
                let s = self.session.as_ref().expect("set above");
                (
                    self.receiver_run.to_be_bytes().to_vec(),
                    Some(s.keys.clone()),
                )
            }
        };
        let o = &self.in_flight[&seq].order;
        let len = wire::record_len(kind, o.payload.len());
        let mut frame = Vec::with_capacity(len);
        let header = wire::put_record_header(
            &mut frame,
            kind,
            &self.key_id,
            run,
            seq,
            &variant,
            len - kind.record_header_len(),
        );
        match &keys {
            Some(k) => k.seal_record(seq, header, o.made_us, &o.payload, &mut frame),
            None => {
                frame.extend_from_slice(&o.made_us.to_be_bytes());
                frame.extend_from_slice(&o.payload);
            }
        }
        let f = self.in_flight.get_mut(&seq).expect("present");
        f.sealed = Some((self.receiver_run, frame));
        if kind == Kind::HpkePerRequest {
            // The answer to this record is tagged with a key of its own setup.
            f.own_keys = keys;
        }
    }

    /// Make sure the session (HPKE) or link keys for sender run `run` exist.
    fn session_for(&mut self, run: u64) {
        let current = self.session.as_ref().map(|s| (s.run, s.receiver_run));
        match current {
            Some((r, _)) if r == run && self.config.kind != Kind::Link => return,
            Some((r, rr)) if r == run && rr == self.receiver_run => return,
            Some((r, _)) if r == run => {}
            // A new sender run: answers of the old one no longer verify with the cached key.
            _ => self.answer_key = None,
        }
        match self.config.kind {
            Kind::HpkeSession => {
                Counters::add(&self.counters.x25519, 3);
                let (enc, keys) = WireKeys::hpke_sender(&mut self.rng, &self.key, &self.receiver);
                self.session = Some(Session {
                    run,
                    receiver_run: 0,
                    enc,
                    keys,
                });
            }
            Kind::Link => {
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
                let keys = WireKeys::link(&secret, run, self.receiver_run);
                self.session = Some(Session {
                    run,
                    receiver_run: self.receiver_run,
                    enc: [0; ENC_LEN],
                    keys,
                });
            }
            Kind::Plain | Kind::HpkePerRequest => {}
        }
    }
}
