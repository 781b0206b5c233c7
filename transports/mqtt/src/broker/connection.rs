//! One client connection's protocol, sans-IO.
//!
//! A [`Connection`] starts waiting for CONNECT (within the connect timeout), then serves the client's packets against
//! the [`Broker`] state, producing [`Action`]s for the driver: control packets to send, and orders to commit to the
//! store before their PUBACK. Any protocol violation ends it with a [`Close`], which says why; the driver then
//! closes the network connection and calls [`Connection::closed`]. Time is passed in (`now`), so the keepalive and
//! connect timeouts are tested with a virtual clock.
//!
//! # Identity
//!
//! Over TLS the client's identity is its certificate's common name. Its CONNECT must use that name as client
//! identifier, or an empty identifier with a clean session (the name is then used); any other identifier is refused
//! with CONNACK return code 2 (identifier rejected), so one certificate can never take over another device's
//! session. User name and password are ignored. Over the plaintext listener (only when asked for) there is no
//! certificate and the client identifier is taken as given, in a namespace of its own ([`ClientKey`]): a plaintext
//! client named `dev-1` never meets the session of the TLS device `dev-1`, and cannot place orders at all.
//!
//! # Limits a client cannot talk its way past
//!
//! - A topic name of more than [`topic::MAX_LEVELS`] levels closes the connection (section 4.8 allows it for a
//!   packet the server will not process); a filter that deep gets SUBACK 0x80.
//! - A SUBSCRIBE or UNSUBSCRIBE with more than [`MAX_FILTERS_PER_PACKET`] filters closes the connection.
//! - A will is checked at CONNECT against the rules a PUBLISH obeys: a will topic beginning with `$` (the broker's
//!   own), one under `orders/` (a will is never an order: nothing commits it) or one over the level cap is refused
//!   with CONNACK return code 5 (not authorized).
//! - Keepalive 0 does not mean forever: a connection silent for `max_idle` is closed whatever its keepalive, so
//!   1.5 × keepalive applies only while it is shorter.
//!
//! # The order sink
//!
//! A PUBLISH to `orders/<device>` carries an order body (`transport_core::framing`). It is refused (connection
//! closed, as section 3.3.5 allows for an unauthorized PUBLISH) unless `<device>` is the connection's identity and
//! the order's sender is that device's number; otherwise it becomes [`Action::Commit`]: the driver commits it to
//! the store and only then sends the PUBACK (QoS 1) or PUBREC (QoS 2), so either means stored. A QoS 2 order sent
//! again before its PUBREL is committed again (the store applies it once) and answered with PUBREC again: committing
//! costs nothing for an order already stored, and answering without committing could acknowledge an order whose
//! first commit failed. Orders are not relayed to subscribers.
//!
//! # QoS 2
//!
//! A QoS 2 PUBLISH is delivered when it arrives and its identifier kept in the session until the client's PUBREL
//! (section 4.3.3, the second method of figure 4.3): a copy arriving in between is answered with PUBREC and not
//! delivered again. PUBREL is answered with PUBCOMP, whether or not the identifier was known.

use super::state::{Broker, ClientKey, ConnId};
use crate::codec::{
    ConnAck, ConnectReturnCode, DecodeError, LastWill, Packet, PacketType, Publish, QoS,
};
use crate::topic;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transport_core::framing::decode_order_body;
use transport_core::{sender_id, Counters, Order};

/// The topic prefix of the order sink.
pub const ORDERS_PREFIX: &str = "orders/";

/// The most topic filters one SUBSCRIBE or UNSUBSCRIBE may carry; more closes the connection. Each filter costs a
/// walk of the trees under the broker's lock, so one packet must not carry hundreds of thousands.
pub const MAX_FILTERS_PER_PACKET: usize = 128;

/// What the driver must do for the client, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Write this control packet (CONNACK, PUBACK, PUBREC, PUBCOMP, SUBACK, UNSUBACK, PINGRESP).
    Send(Packet),
    /// Commit this order to the store; then send `ack` (PUBACK for QoS 1, PUBREC for QoS 2, nothing for QoS 0).
    /// Acknowledgements are sent in the order the PUBLISH packets arrived [MQTT-4.6.0-2, MQTT-4.6.0-3], so actions
    /// are carried out in order.
    Commit {
        /// The order.
        order: Order,
        /// What answers it once stored.
        ack: Option<Packet>,
    },
}

/// Why an order PUBLISH was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderRefusal {
    /// The topic names another device than the connection's identity.
    WrongDevice,
    /// The payload is not an order body, or its payload is larger than the store keeps.
    Malformed,
    /// The order's sender is not the connection's device.
    WrongSender,
    /// The connection has no verified identity (plaintext listener).
    Unverified,
}

/// Why a connection ends.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Close {
    /// The client sent DISCONNECT (its will is discarded).
    #[error("the client disconnected")]
    Disconnect,
    /// The client closed the network connection.
    #[error("the client closed the connection")]
    Eof,
    /// A packet was malformed or broke a rule of the specification.
    #[error("malformed packet: {0}")]
    Malformed(#[from] DecodeError),
    /// The first packet was not CONNECT [MQTT-3.1.0-1].
    #[error("first packet was not CONNECT")]
    NotConnect,
    /// A second CONNECT on the same connection [MQTT-3.1.0-2].
    #[error("second CONNECT")]
    SecondConnect,
    /// CONNECT was answered with a refusal (CONNACK sent first).
    #[error("CONNECT refused: {0:?}")]
    Refused(ConnectReturnCode),
    /// A packet only a server may send, from the client.
    #[error("unexpected {0:?} from a client")]
    Unexpected(PacketType),
    /// An order PUBLISH was refused.
    #[error("order refused: {0:?}")]
    OrderRefused(OrderRefusal),
    /// A topic name of more than [`topic::MAX_LEVELS`] levels.
    #[error("topic name over the level cap")]
    TopicTooDeep,
    /// A SUBSCRIBE or UNSUBSCRIBE with more than [`MAX_FILTERS_PER_PACKET`] filters.
    #[error("{0} topic filters in one packet")]
    TooManyFilters(usize),
    /// No CONNECT within the connect timeout.
    #[error("no CONNECT in time")]
    ConnectTimeout,
    /// Nothing received for one and a half keepalive periods [MQTT-3.1.2-24], or for the broker's `max_idle`.
    #[error("keepalive expired")]
    KeepaliveExpired,
    /// Another connection connected with the same client identifier [MQTT-3.1.4-2].
    #[error("taken over by a new connection of the same client")]
    TakenOver,
    /// The broker is shutting down or the socket failed.
    #[error("connection lost: {0}")]
    Lost(String),
}

impl Close {
    /// Whether the will is discarded (only after DISCONNECT).
    pub fn graceful(&self) -> bool {
        matches!(self, Close::Disconnect)
    }
}

#[derive(Debug)]
struct Connected {
    client_id: ClientKey,
    /// How long the client may stay silent: 1.5 × keepalive, at most `max_idle`.
    silence: Duration,
}

/// One client connection's protocol state.
#[derive(Debug)]
pub struct Connection {
    id: ConnId,
    identity: Option<Arc<str>>,
    connected: Option<Connected>,
    connect_deadline: Instant,
    max_idle: Duration,
    last_packet: Instant,
    counters: Arc<Counters>,
}

impl Connection {
    /// A new connection, opened at `now`, whose verified identity (certificate common name) is `identity`, if any;
    /// closed if no CONNECT comes within `connect_timeout`, or later if silent for `max_idle` (or 1.5 × keepalive).
    pub fn new(
        id: ConnId,
        identity: Option<String>,
        now: Instant,
        connect_timeout: Duration,
        max_idle: Duration,
        counters: Arc<Counters>,
    ) -> Self {
        Connection {
            id,
            identity: identity.map(Arc::from),
            connected: None,
            connect_deadline: now + connect_timeout,
            max_idle,
            last_packet: now,
            counters,
        }
    }

    /// The connection's number.
    pub fn id(&self) -> ConnId {
        self.id
    }

    /// The client identifier, once connected.
    pub fn client_id(&self) -> Option<&str> {
        self.connected.as_ref().map(|c| &*c.client_id.id)
    }

    /// When the connection must be closed if no packet arrives before: the connect deadline, or one and a half
    /// keepalive periods after the last packet, or `max_idle` after it when that is sooner (keepalive 0 included).
    pub fn deadline(&self) -> Instant {
        match &self.connected {
            None => self.connect_deadline,
            Some(c) => self.last_packet + c.silence,
        }
    }

    /// Whether the deadline has passed at `now`, and so the connection must close.
    pub fn handle_timeout(&self, now: Instant) -> Option<Close> {
        if self.deadline() > now {
            return None;
        }
        Some(if self.connected.is_some() {
            Close::KeepaliveExpired
        } else {
            Close::ConnectTimeout
        })
    }

    /// A frame could not be decoded: close, after answering a CONNECT of another protocol level with return code
    /// 1 [MQTT-3.1.2-2].
    pub fn handle_decode_error(&mut self, err: DecodeError, out: &mut Vec<Action>) -> Close {
        if let (DecodeError::UnsupportedProtocolLevel(_), None) = (&err, &self.connected) {
            out.push(connack(
                false,
                ConnectReturnCode::UnacceptableProtocolVersion,
            ));
            return Close::Refused(ConnectReturnCode::UnacceptableProtocolVersion);
        }
        Close::Malformed(err)
    }

    /// Serve one packet from the client. Actions are appended to `out`; on `Err` the connection must be closed
    /// after the actions already in `out` (a refusing CONNACK) are written.
    pub fn handle(
        &mut self,
        broker: &mut Broker,
        packet: Packet,
        now: Instant,
        out: &mut Vec<Action>,
    ) -> Result<(), Close> {
        self.last_packet = now;
        if self.connected.is_none() {
            let Packet::Connect(c) = packet else {
                return Err(Close::NotConnect);
            };
            let client_id = match (&self.identity, c.client_id.as_str()) {
                (Some(identity), "") if c.clean_session => ClientKey::verified(identity),
                (Some(identity), id) if id == &**identity => ClientKey::verified(identity),
                // Unique: connection numbers are never reused, and the namespace is the plaintext one.
                (None, "") if c.clean_session => {
                    ClientKey::plaintext(&format!("auto-{}", self.id.0))
                }
                (None, id) if !id.is_empty() => ClientKey::plaintext(id),
                // An empty identifier with a persistent session [MQTT-3.1.3-8], or another device's name.
                _ => return refuse(out, ConnectReturnCode::IdentifierRejected),
            };
            if c.will.as_ref().is_some_and(|w| !will_allowed(w)) {
                return refuse(out, ConnectReturnCode::NotAuthorized);
            }
            let present = match broker.connect(self.id, &client_id, c.clean_session, c.will) {
                Ok(present) => present,
                Err(code) => return refuse(out, code),
            };
            let keep_alive = Duration::from_secs(u64::from(c.keep_alive));
            let silence = match c.keep_alive {
                0 => self.max_idle,
                _ => (keep_alive + keep_alive / 2).min(self.max_idle),
            };
            self.connected = Some(Connected { client_id, silence });
            out.push(connack(present, ConnectReturnCode::Accepted));
            return Ok(());
        }
        match packet {
            Packet::Connect(_) => Err(Close::SecondConnect),
            Packet::Publish(p) => self.publish(broker, p, out),
            Packet::PubAck(id) => {
                broker.puback(self.id, id);
                Ok(())
            }
            Packet::PubRec(id) => {
                broker.pubrec(self.id, id);
                Ok(())
            }
            Packet::PubComp(id) => {
                broker.pubcomp(self.id, id);
                Ok(())
            }
            Packet::PubRel(id) => {
                broker.released_qos2(self.id, id);
                out.push(Action::Send(Packet::PubComp(id)));
                Ok(())
            }
            Packet::Subscribe(s) if s.filters.len() > MAX_FILTERS_PER_PACKET => {
                Err(Close::TooManyFilters(s.filters.len()))
            }
            Packet::Unsubscribe(u) if u.filters.len() > MAX_FILTERS_PER_PACKET => {
                Err(Close::TooManyFilters(u.filters.len()))
            }
            Packet::Subscribe(s) => match broker.subscribe(self.id, s.packet_id, &s.filters) {
                Some(ack) => {
                    out.push(Action::Send(Packet::SubAck(ack)));
                    Ok(())
                }
                None => Err(Close::TakenOver),
            },
            Packet::Unsubscribe(u) => {
                if !broker.unsubscribe(self.id, &u.filters) {
                    return Err(Close::TakenOver);
                }
                out.push(Action::Send(Packet::UnsubAck(u.packet_id)));
                Ok(())
            }
            Packet::PingReq => {
                out.push(Action::Send(Packet::PingResp));
                Ok(())
            }
            Packet::Disconnect => Err(Close::Disconnect),
            // Server-to-client packets are violations from a client [MQTT-4.8.0-1].
            other => Err(Close::Unexpected(other.packet_type())),
        }
    }

    fn publish(
        &mut self,
        broker: &mut Broker,
        p: Publish,
        out: &mut Vec<Action>,
    ) -> Result<(), Close> {
        broker.note_received();
        Counters::inc(&self.counters.received);
        if !topic::within_level_cap(&p.topic) {
            return Err(Close::TopicTooDeep);
        }
        if let Some(device) = p.topic.strip_prefix(ORDERS_PREFIX) {
            let Some(identity) = self.connected.as_ref().map(|c| &c.client_id) else {
                return Err(Close::NotConnect);
            };
            if !identity.verified {
                return Err(Close::OrderRefused(OrderRefusal::Unverified));
            }
            if &*identity.id != device {
                return Err(Close::OrderRefused(OrderRefusal::WrongDevice));
            }
            let order = decode_order_body(&p.payload)
                .ok()
                .filter(|o| o.payload.len() <= transport_core::MAX_PAYLOAD)
                .ok_or(Close::OrderRefused(OrderRefusal::Malformed))?;
            if order.id.sender != sender_id(device) {
                return Err(Close::OrderRefused(OrderRefusal::WrongSender));
            }
            let ack = match (p.qos, p.packet_id) {
                (QoS::ExactlyOnce, Some(id)) => {
                    broker.received_qos2(self.id, id).ok_or(Close::TakenOver)?;
                    Some(Packet::PubRec(id))
                }
                (_, id) => id.map(Packet::PubAck),
            };
            out.push(Action::Commit { order, ack });
            return Ok(());
        }
        let (deliver, ack) = match (p.qos, p.packet_id) {
            (QoS::ExactlyOnce, Some(id)) => {
                let new = broker.received_qos2(self.id, id).ok_or(Close::TakenOver)?;
                (new, Some(Packet::PubRec(id)))
            }
            (_, id) => (true, id.map(Packet::PubAck)),
        };
        // Topics beginning with `$` are the broker's own [MQTT-4.7.2-1]: accepted and acknowledged, not routed.
        if deliver && !p.topic.starts_with('$') {
            broker.publish(&p.topic, p.payload, p.qos, p.retain);
        }
        out.extend(ack.map(Action::Send));
        Ok(())
    }

    /// The connection is closed for `reason`: detach from the session (publishing the will unless the client
    /// disconnected cleanly) and count refusals.
    pub fn closed(&mut self, broker: &mut Broker, reason: &Close) {
        let counter = match reason {
            // Refused as soon as its fixed header announced it, before any of its body was read.
            Close::Malformed(DecodeError::TooLarge { .. }) => {
                Some(&self.counters.refused_oversized)
            }
            Close::Malformed(_)
            | Close::NotConnect
            | Close::SecondConnect
            | Close::Unexpected(_) => Some(&self.counters.refused_malformed),
            Close::TopicTooDeep | Close::TooManyFilters(_) => Some(&self.counters.refused_limit),
            Close::OrderRefused(OrderRefusal::Malformed) => Some(&self.counters.refused_malformed),
            Close::OrderRefused(_) | Close::Refused(_) => Some(&self.counters.refused_unknown),
            // A client that connected and never sent CONNECT: half-open.
            Close::ConnectTimeout => Some(&self.counters.timed_out),
            _ => None,
        };
        if let Some(c) = counter {
            Counters::inc(c);
        }
        if reason != &Close::TakenOver {
            broker.disconnect(self.id, reason.graceful());
        }
    }
}

/// Answer CONNECT with a refusal, then close [MQTT-3.2.2-4, MQTT-3.2.2-5].
fn refuse(out: &mut Vec<Action>, code: ConnectReturnCode) -> Result<(), Close> {
    out.push(connack(false, code));
    Err(Close::Refused(code))
}

/// Whether a will may be published as its client could publish it: not to the broker's `$` topics, never as an
/// order, within the level cap.
fn will_allowed(will: &LastWill) -> bool {
    !will.topic.starts_with('$')
        && !will.topic.starts_with(ORDERS_PREFIX)
        && topic::within_level_cap(&will.topic)
}

fn connack(session_present: bool, code: ConnectReturnCode) -> Action {
    Action::Send(Packet::ConnAck(ConnAck {
        session_present,
        code,
    }))
}

#[cfg(test)]
mod tests;
