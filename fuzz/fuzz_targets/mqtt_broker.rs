//! The broker's session and connection state machines (`broker::Connection` over `broker::Broker`, sans-IO) fed
//! whole packet sequences on up to four connections, driven as the tokio server drives them: bytes into a buffer,
//! `read_packet`, `Connection::handle`, closes for errors, takeovers and timeouts, `poll_transmit` for deliveries.
//!
//! Operations: open a connection (with a certificate name or plaintext), send a generated valid packet or raw
//! bytes, acknowledge a delivery, read deliveries, let time pass, close, publish `$SYS`. The broker runs with small
//! limits so that inputs reach them.
//!
//! Checks, against a model of the sessions kept beside the broker:
//! - every control packet the broker sends encodes and decodes to itself; CONNACK comes first and once; nothing but
//!   a refusing CONNACK precedes a close; SUBACK, UNSUBACK, PUBACK and PINGRESP answer their packet with its
//!   identifier, one return code per filter, never granting more than requested;
//! - CONNACK's session-present flag is right [MQTT-3.2.2-1, -2]; a certificate's connection only ever gets its own
//!   name; the connection a CONNECT takes over is the one closed [MQTT-3.1.4-2]. A client is named by its identifier
//!   and whether it has a certificate: the plaintext listener's identifiers are a namespace of their own (docs/mqtt.md),
//!   so a plaintext client never takes over, resumes or reads a certificate's session of the same identifier;
//! - an order is committed only from its own device (a certificate's connection), with its identifier;
//! - deliveries are whole valid PUBLISH packets on topics that a filter of the session matches (by a reference
//!   matcher written apart from the broker's); a new packet identifier is never one still unacknowledged, a DUP
//!   re-delivery always is, as a PUBLISH at its QoS not yet answered with PUBREC, and a PUBREL only follows the
//!   client's PUBREC [MQTT-2.3.1-2, MQTT-4.3.3, MQTT-4.4.0-1]; in-flight messages stay within the limit;
//! - the broker's counts of connected clients, sessions and subscriptions equal the model's.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transport_core::framing::decode_order_body;
use transport_core::{sender_id, Counters};
use transport_fuzz::bytes_upto;
use transport_fuzz::mqtt::{packet, reference_matches, CLIENT_IDS};
use transport_mqtt::broker::{Action, Broker, Close, ConnId, Connection, SessionLimits};
use transport_mqtt::codec::{read_packet, ConnectReturnCode, Packet, QoS, SubscribeReturnCode};

const SLOTS: usize = 4;
const MAX_OPS: usize = 64;
const MAX_PACKET: usize = 1 << 16;

fn limits() -> SessionLimits {
    SessionLimits {
        max_queued_qos0: 3,
        max_queued_qos1: 3,
        max_queued_bytes: 1 << 20,
        max_inflight: 2,
        max_subscriptions: 4,
        max_retained: 4,
        max_retained_bytes: 1 << 20,
        max_sessions: 8,
    }
}

#[derive(Debug)]
enum Op {
    Open {
        slot: usize,
        identity: Option<usize>,
    },
    Send {
        slot: usize,
        packet: Packet,
    },
    Raw {
        slot: usize,
        bytes: Vec<u8>,
    },
    /// The client acknowledges its `nth` unacknowledged delivery, as its QoS asks: PUBACK, or PUBREC then PUBCOMP.
    Ack {
        slot: usize,
        nth: usize,
    },
    Deliver {
        slot: usize,
        max_bytes: usize,
    },
    Advance {
        secs: u16,
    },
    Eof {
        slot: usize,
    },
    Sys,
}

fn op(u: &mut Unstructured<'_>) -> arbitrary::Result<Op> {
    let slot = u.choose_index(SLOTS)?;
    Ok(match u.int_in_range(0..=15)? {
        0 | 1 => Op::Open {
            slot,
            identity: if u.ratio(2, 3)? {
                Some(u.int_in_range(1..=3)?)
            } else {
                None
            },
        },
        2..=7 => Op::Send {
            slot,
            packet: packet(u, true)?,
        },
        8 => Op::Raw {
            slot,
            bytes: bytes_upto(u, 64)?,
        },
        9 | 10 => Op::Ack {
            slot,
            nth: usize::arbitrary(u)?,
        },
        11 | 12 => Op::Deliver {
            slot,
            max_bytes: u.int_in_range(1..=4096)?,
        },
        13 => Op::Advance {
            secs: u.int_in_range(0..=200)?,
        },
        14 => Op::Eof { slot },
        _ => Op::Sys,
    })
}

struct Slot {
    conn: Connection,
    identity: Option<String>,
    buf: BytesMut,
    connack_sent: bool,
    /// The client of the session it is attached to.
    client: Option<Client>,
}

/// What names a session: the client identifier, and whether a certificate verified it (the plaintext listener's
/// identifiers are a namespace of their own).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Client {
    verified: bool,
    id: String,
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let namespace = if self.verified { "" } else { "plaintext " };
        write!(f, "{namespace}{}", self.id)
    }
}

#[derive(Default)]
struct Session {
    clean: bool,
    slot: Option<usize>,
    subs: HashMap<String, QoS>,
    /// Every filter granted in this session, with the highest QoS granted: queued messages may still arrive after
    /// an unsubscribe or a downgrade.
    ever: HashMap<String, QoS>,
    /// Deliveries in flight, by packet identifier.
    unacked: HashMap<u16, Outbound>,
}

/// A QoS 1 or 2 delivery in flight: until PUBACK (QoS 1), or PUBREC then PUBCOMP (QoS 2) [MQTT-4.3.2, MQTT-4.3.3].
#[derive(Debug, Clone, Copy)]
struct Outbound {
    qos: QoS,
    /// QoS 2: the client sent PUBREC; the broker owes it PUBREL, never the PUBLISH again.
    released: bool,
}

struct World {
    now: Instant,
    broker: Broker,
    counters: Arc<Counters>,
    slots: Vec<Option<Slot>>,
    next_conn: u64,
    sessions: HashMap<Client, Session>,
}

impl World {
    fn new() -> World {
        let counters = Arc::new(Counters::default());
        let now = Instant::now();
        World {
            now,
            broker: Broker::new(limits(), counters.clone(), now),
            counters,
            slots: (0..SLOTS).map(|_| None).collect(),
            next_conn: 0,
            sessions: HashMap::new(),
        }
    }

    fn run(&mut self, op: Op) {
        match op {
            Op::Open { slot, identity } => {
                self.close(slot, Close::Eof);
                let identity = identity.map(|i| CLIENT_IDS[i].to_string());
                let conn = Connection::new(
                    ConnId(self.next_conn),
                    identity.clone(),
                    self.now,
                    Duration::from_secs(10),
                    Duration::from_secs(900),
                    self.counters.clone(),
                );
                self.next_conn += 1;
                self.slots[slot] = Some(Slot {
                    conn,
                    identity,
                    buf: BytesMut::new(),
                    connack_sent: false,
                    client: None,
                });
            }
            Op::Send { slot, packet } => {
                let mut bytes = Vec::new();
                packet.encode(&mut bytes).expect("generated packets encode");
                self.receive(slot, &bytes);
            }
            Op::Raw { slot, bytes } => self.receive(slot, &bytes),
            Op::Ack { slot, nth } => {
                let Some(client) = self.slots[slot].as_ref().and_then(|s| s.client.clone()) else {
                    return;
                };
                let unacked = &self.sessions[&client].unacked;
                let mut ids: Vec<u16> = unacked.keys().copied().collect();
                if ids.is_empty() {
                    return;
                }
                ids.sort_unstable();
                let id = ids[nth % ids.len()];
                let pid = id.try_into().expect("not zero");
                let ack = match unacked[&id] {
                    Outbound {
                        qos: QoS::ExactlyOnce,
                        released: false,
                    } => Packet::PubRec(pid),
                    Outbound {
                        qos: QoS::ExactlyOnce,
                        released: true,
                    } => Packet::PubComp(pid),
                    _ => Packet::PubAck(pid),
                };
                let mut bytes = Vec::new();
                ack.encode(&mut bytes).expect("encodes");
                self.receive(slot, &bytes);
            }
            Op::Deliver { slot, max_bytes } => self.deliver(slot, max_bytes),
            Op::Advance { secs } => {
                self.now += Duration::from_secs(u64::from(secs));
                for slot in 0..SLOTS {
                    let close = self.slots[slot]
                        .as_ref()
                        .and_then(|s| s.conn.handle_timeout(self.now));
                    if let Some(close) = close {
                        self.close(slot, close);
                    }
                }
            }
            Op::Eof { slot } => self.close(slot, Close::Eof),
            Op::Sys => self.broker.publish_sys(self.now, 0),
        }
        self.check_counts();
    }

    /// Bytes from the client of `slot`, read as the server's read loop reads them.
    fn receive(&mut self, slot: usize, bytes: &[u8]) {
        let Some(s) = self.slots[slot].as_mut() else {
            return;
        };
        s.buf.extend_from_slice(bytes);
        loop {
            let s = self.slots[slot].as_mut().expect("open");
            match read_packet(&mut s.buf, MAX_PACKET) {
                Ok(None) => return,
                Ok(Some(p)) => {
                    let mut out = Vec::new();
                    let result = s
                        .conn
                        .handle(&mut self.broker, p.clone(), self.now, &mut out);
                    self.check_actions(slot, &p, &out, &result);
                    self.after_packet(slot, &p, &out, &result);
                    if let Err(close) = result {
                        self.close(slot, close);
                        return;
                    }
                }
                Err(e) => {
                    let mut out = Vec::new();
                    let close = s.conn.handle_decode_error(e, &mut out);
                    for a in &out {
                        assert!(
                            matches!(a, Action::Send(Packet::ConnAck(c)) if c.code != ConnectReturnCode::Accepted && !s.connack_sent),
                            "a decode error produced {a:?}"
                        );
                    }
                    self.close(slot, close);
                    return;
                }
            }
        }
    }

    fn check_actions(
        &mut self,
        slot: usize,
        p: &Packet,
        out: &[Action],
        result: &Result<(), Close>,
    ) {
        let s = self.slots[slot].as_mut().expect("open");
        for a in out {
            if let Action::Send(sent) = a {
                let mut bytes = Vec::new();
                sent.encode(&mut bytes).unwrap_or_else(|e| {
                    panic!("the broker sent {sent:?}, which does not encode: {e}")
                });
                assert_eq!(
                    Packet::decode(Bytes::from(bytes)).as_ref(),
                    Ok(sent),
                    "a control packet does not round-trip"
                );
            }
        }
        if !s.connack_sent {
            match (out, result) {
                ([], Err(_)) => {}
                ([Action::Send(Packet::ConnAck(c))], Ok(())) => {
                    assert_eq!(c.code, ConnectReturnCode::Accepted);
                    s.connack_sent = true;
                }
                ([Action::Send(Packet::ConnAck(c))], Err(_)) => {
                    assert_ne!(c.code, ConnectReturnCode::Accepted, "accepted, then closed")
                }
                _ => panic!("before CONNACK: {p:?} gave {out:?} and {result:?}"),
            }
            return;
        }
        let client = s.client.clone().expect("connected");
        let sends: Vec<&Packet> = out
            .iter()
            .filter_map(|a| {
                if let Action::Send(p) = a {
                    Some(p)
                } else {
                    None
                }
            })
            .collect();
        assert!(
            !sends.iter().any(|p| matches!(p, Packet::ConnAck(_))),
            "a second CONNACK"
        );
        if result.is_err() {
            return;
        }
        match p {
            Packet::Publish(publish) => {
                for a in out {
                    match a {
                        Action::Commit { order, ack } => {
                            assert!(client.verified, "an order committed from {client}");
                            assert_eq!(
                                publish.topic,
                                format!("orders/{}", client.id),
                                "an order committed from {client}"
                            );
                            assert_eq!(
                                order.id.sender,
                                sender_id(&client.id),
                                "an order of another sender committed"
                            );
                            assert_eq!(
                                decode_order_body(&publish.payload).ok().as_ref(),
                                Some(order)
                            );
                            let expected = match (publish.qos, publish.packet_id) {
                                (QoS::ExactlyOnce, Some(id)) => Some(Packet::PubRec(id)),
                                (_, id) => id.map(Packet::PubAck),
                            };
                            assert_eq!(*ack, expected, "an order is answered by its QoS's answer");
                        }
                        Action::Send(Packet::PubAck(id)) => {
                            assert_eq!(publish.qos, QoS::AtLeastOnce);
                            assert_eq!(Some(*id), publish.packet_id);
                        }
                        Action::Send(Packet::PubRec(id)) => {
                            assert_eq!(publish.qos, QoS::ExactlyOnce);
                            assert_eq!(Some(*id), publish.packet_id);
                        }
                        other => panic!("PUBLISH answered with {other:?}"),
                    }
                }
                if publish.qos == QoS::AtLeastOnce {
                    assert_eq!(out.len(), 1, "a QoS 1 PUBLISH is answered once: {out:?}");
                }
            }
            Packet::Subscribe(sub) => match sends.as_slice() {
                [Packet::SubAck(ack)] => {
                    assert_eq!(ack.packet_id, sub.packet_id);
                    assert_eq!(
                        ack.return_codes.len(),
                        sub.filters.len(),
                        "one return code per filter"
                    );
                    for (code, (_, requested)) in ack.return_codes.iter().zip(&sub.filters) {
                        if let SubscribeReturnCode::Granted(q) = code {
                            assert!(q <= requested, "granted {q:?} for {requested:?}");
                        }
                    }
                }
                other => panic!("SUBSCRIBE answered with {other:?}"),
            },
            Packet::Unsubscribe(u) => assert_eq!(sends, [&Packet::UnsubAck(u.packet_id)]),
            Packet::PingReq => assert_eq!(sends, [&Packet::PingResp]),
            // The broker's answers to these (PUBREL after PUBREC) go out with the deliveries.
            Packet::PubAck(_) | Packet::PubRec(_) | Packet::PubComp(_) => assert!(out.is_empty()),
            _ => {}
        }
    }

    /// Follow the packet in the model.
    fn after_packet(
        &mut self,
        slot: usize,
        p: &Packet,
        out: &[Action],
        result: &Result<(), Close>,
    ) {
        match (p, out) {
            (Packet::Connect(c), [Action::Send(Packet::ConnAck(ack))]) if result.is_ok() => {
                let s = self.slots[slot].as_ref().expect("open");
                let client = Client {
                    verified: s.identity.is_some(),
                    id: s.conn.client_id().expect("connected").to_string(),
                };
                if let Some(identity) = &s.identity {
                    assert_eq!(
                        &client.id, identity,
                        "a certificate's connection got another client's session"
                    );
                }
                let mut kicked = Vec::new();
                self.broker.drain_kicked(&mut kicked);
                let old = self.sessions.get(&client).and_then(|m| m.slot);
                let expected: Vec<ConnId> = old.map(|o| self.slot_conn(o)).into_iter().collect();
                assert_eq!(
                    kicked, expected,
                    "the takeover closed the wrong connections"
                );
                if let Some(old) = old {
                    let mut conn = self.slots[old].take().expect("attached slot is open").conn;
                    conn.closed(&mut self.broker, &Close::TakenOver);
                    self.detach(old, &client);
                }
                let resumed = !c.clean_session && self.sessions.contains_key(&client);
                assert_eq!(
                    ack.session_present, resumed,
                    "session present flag [MQTT-3.2.2-1, -2]"
                );
                if !resumed {
                    self.sessions.insert(
                        client.clone(),
                        Session {
                            clean: c.clean_session,
                            ..Session::default()
                        },
                    );
                }
                let m = self.sessions.get_mut(&client).expect("inserted");
                m.slot = Some(slot);
                m.clean = c.clean_session;
                self.slots[slot].as_mut().expect("open").client = Some(client);
            }
            (Packet::Subscribe(sub), [Action::Send(Packet::SubAck(ack))]) => {
                let m = self.attached(slot);
                for ((filter, _), code) in sub.filters.iter().zip(&ack.return_codes) {
                    if let SubscribeReturnCode::Granted(q) = code {
                        m.subs.insert(filter.clone(), *q);
                        let e = m.ever.entry(filter.clone()).or_insert(*q);
                        *e = (*e).max(*q);
                    }
                }
            }
            (Packet::Unsubscribe(u), _) if result.is_ok() => {
                let m = self.attached(slot);
                for f in &u.filters {
                    m.subs.remove(f);
                }
            }
            // Each acknowledges only a delivery at its QoS and stage; any other is ignored.
            (Packet::PubAck(id), _) if result.is_ok() => {
                let unacked = &mut self.attached(slot).unacked;
                if unacked
                    .get(&id.get())
                    .is_some_and(|o| o.qos == QoS::AtLeastOnce)
                {
                    unacked.remove(&id.get());
                }
            }
            (Packet::PubRec(id), _) if result.is_ok() => {
                if let Some(o) = self.attached(slot).unacked.get_mut(&id.get()) {
                    o.released |= o.qos == QoS::ExactlyOnce;
                }
            }
            (Packet::PubComp(id), _) if result.is_ok() => {
                let unacked = &mut self.attached(slot).unacked;
                if unacked.get(&id.get()).is_some_and(|o| o.released) {
                    unacked.remove(&id.get());
                }
            }
            _ => {}
        }
    }

    fn slot_conn(&self, slot: usize) -> ConnId {
        self.slots[slot].as_ref().expect("open").conn.id()
    }

    fn attached(&mut self, slot: usize) -> &mut Session {
        let client = self.slots[slot]
            .as_ref()
            .and_then(|s| s.client.clone())
            .expect("attached");
        self.sessions.get_mut(&client).expect("attached session")
    }

    /// The model's side of a detach: a clean session ends.
    fn detach(&mut self, slot: usize, client: &Client) {
        let m = self.sessions.get_mut(client).expect("attached session");
        assert_eq!(m.slot, Some(slot));
        m.slot = None;
        if m.clean {
            self.sessions.remove(client);
        }
    }

    fn close(&mut self, slot: usize, reason: Close) {
        let Some(mut s) = self.slots[slot].take() else {
            return;
        };
        s.conn.closed(&mut self.broker, &reason);
        if let Some(client) = s.client {
            self.detach(slot, &client);
        }
        let mut kicked = Vec::new();
        self.broker.drain_kicked(&mut kicked);
        assert!(kicked.is_empty(), "a close kicked {kicked:?}");
    }

    fn deliver(&mut self, slot: usize, max_bytes: usize) {
        let Some(s) = self.slots[slot].as_ref() else {
            return;
        };
        let id = s.conn.id();
        let mut out = BytesMut::new();
        let n = self.broker.poll_transmit(id, &mut out, max_bytes);
        let Some(client) = s.client.clone() else {
            assert_eq!(n, 0, "deliveries to a connection without a session");
            return;
        };
        let max_inflight = self.broker.limits().max_inflight;
        let m = self.sessions.get_mut(&client).expect("attached session");
        let mut read = 0;
        while !out.is_empty() {
            let p = read_packet(&mut out, usize::MAX)
                .unwrap_or_else(|e| panic!("the broker wrote a malformed delivery: {e}"))
                .expect("deliveries are whole packets");
            let p = match p {
                Packet::Publish(p) => p,
                Packet::PubRel(id) => {
                    assert!(
                        m.unacked.get(&id.get()).is_some_and(|o| o.released),
                        "PUBREL {id} for a delivery the client has not received [MQTT-4.3.3]"
                    );
                    continue;
                }
                p => panic!("a delivery that is not a PUBLISH or PUBREL: {p:?}"),
            };
            read += 1;
            let granted = m
                .ever
                .iter()
                .filter(|(f, _)| reference_matches(f, &p.topic))
                .map(|(_, q)| *q)
                .max();
            let Some(granted) = granted else {
                panic!(
                    "{client} got a message on {:?}, which none of its filters {:?} matches",
                    p.topic,
                    m.ever.keys()
                )
            };
            assert!(
                p.qos <= granted,
                "delivered at {:?}, above the {granted:?} granted",
                p.qos
            );
            if let Some(pid) = p.packet_id {
                if p.dup {
                    let o = m.unacked.get(&pid.get());
                    assert!(
                        o.is_some_and(|o| !o.released && o.qos == p.qos),
                        "DUP re-delivery of {pid} at {:?}, which was not in flight as a PUBLISH at that QoS: {o:?}",
                        p.qos
                    );
                } else {
                    let new = Outbound {
                        qos: p.qos,
                        released: false,
                    };
                    assert!(
                        m.unacked.insert(pid.get(), new).is_none(),
                        "packet identifier {pid} reused while unacknowledged"
                    );
                }
            } else {
                assert!(!p.dup);
            }
        }
        assert_eq!(
            read, n,
            "poll_transmit's count disagrees with the packets written"
        );
        assert!(
            m.unacked.len() <= max_inflight,
            "{} in flight, limit {max_inflight}",
            m.unacked.len()
        );
    }

    fn check_counts(&self) {
        let stats = self.broker.stats();
        let attached = self.sessions.values().filter(|m| m.slot.is_some()).count();
        assert_eq!(
            stats.clients_connected, attached as u64,
            "connected clients"
        );
        assert_eq!(stats.sessions, self.sessions.len() as u64, "sessions");
        let subs: usize = self.sessions.values().map(|m| m.subs.len()).sum();
        assert_eq!(stats.subscriptions, subs as u64, "subscriptions");
        for s in self.slots.iter().flatten() {
            assert_eq!(self.broker.is_attached(s.conn.id()), s.client.is_some());
        }
    }
}

fuzz_target!(init: transport_fuzz::seeds::write_if_asked("mqtt_broker"), |data: &[u8]| {
    let mut u = Unstructured::new(data);
    let mut world = World::new();
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
    for slot in 0..SLOTS {
        world.close(slot, Close::Eof);
    }
    world.check_counts();
});
