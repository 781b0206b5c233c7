//! The publish/subscribe half of a device's task: its subscriptions, the messages it publishes, and the messages it
//! receives, across the connections the device opens one after another.
//!
//! - A subscription is sent on every new connection and confirmed once: the device's [`Fleet::subscribe`] resolves at
//!   the first [`SubAck::Granted`] (a server that forgets subscriptions with the connection, such as a QUIC relay
//!   without sessions, gets them again; an MQTT broker that kept the session confirms again at no cost).
//! - A published message is sent once on the current connection. QoS 1: if that connection drops before the server
//!   acknowledged it, it is sent again on the next one (`again`, MQTT's DUP flag) and counted in `resent_reconnect`.
//!   QoS 0: it is never sent again; one sent on a connection that dropped before it was written is discarded (no
//!   [`LinkEvent::Accepted`]). [`LinkEvent::Accepted`] is reported once per message, at its first acceptance.
//! - What the device receives is reported as [`LinkEvent::Delivered`] once per message: a QoS 1 delivery sent again
//!   by the server (its acknowledgement was lost with a connection) is recognised by the message's id and not
//!   reported twice. The ids of QoS 1 deliveries are remembered for the life of the fleet (8 bytes each, plus the
//!   hash set's overhead); QoS 0 deliveries are never sent twice, so they are not remembered.
//!
//! [`Fleet::subscribe`]: transport_core::Fleet::subscribe
//! [`LinkEvent::Accepted`]: transport_core::LinkEvent::Accepted
//! [`LinkEvent::Delivered`]: transport_core::LinkEvent::Delivered

use super::Connector;
use bytes::{BufMut, BytesMut};
use futures::stream::FuturesUnordered;
use std::collections::{HashMap, HashSet, VecDeque};
use tokio::sync::{mpsc, oneshot};
use transport_core::{BoxFuture, Counters, Publish, QoS, TransportError};

/// A message a subscriber's connection received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// The message's id, read from its payload ([`message_id`]).
    pub id: u64,
    /// How the server delivered it: QoS 1 deliveries may come again after a connection drops.
    pub qos: QoS,
    /// When the connection read it.
    pub at: std::time::Instant,
}

/// The messages one connection receives, in the order it read them.
pub type Deliveries = mpsc::UnboundedReceiver<Delivery>;

/// The server's answer to a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubAck {
    /// The subscription holds.
    Granted,
    /// The server refused it; it is not asked again.
    Refused,
}

/// Bytes of a payload that carry the message's id.
pub const ID_BYTES: usize = 8;

/// Append the payload of `message` to `out`: its id (8 bytes, big-endian), then zeros up to its size (at least the 8
/// bytes of the id). Every transport carries this payload unchanged, so the subscriber reads the id back with
/// [`message_id`].
pub fn payload(message: &Publish, out: &mut BytesMut) {
    let size = (message.size as usize).max(ID_BYTES);
    out.reserve(size);
    out.put_u64(message.id);
    out.put_bytes(0, size - ID_BYTES);
}

/// The id a payload carries; `None` if it is shorter than an id.
pub fn message_id(payload: &[u8]) -> Option<u64> {
    payload
        .first_chunk::<ID_BYTES>()
        .map(|b| u64::from_be_bytes(*b))
}

pub(super) type Confirming = BoxFuture<'static, (u32, u64, Result<SubAck, TransportError>)>;
pub(super) type Accepting = BoxFuture<'static, (u64, u64, Result<(), TransportError>)>;

struct Subscription {
    channel: u32,
    qos: QoS,
    /// The connection generation it was last sent on (0: never).
    sent_on: u64,
}

struct Outgoing {
    message: Publish,
    /// Its place in the order messages were handed over (they are sent, and sent again, in that order).
    order: u64,
    /// The connection generation it was last sent on (0: never).
    sent_on: u64,
}

/// What happened to a subscription's answer.
pub(super) enum Confirmed {
    /// Granted: the connection it came on has proven itself.
    Granted,
    /// Refused or unsupported: the waiters have their answer, nothing more to do.
    Final,
    /// The request failed with its connection: drop it if it is the current one.
    Failed,
}

/// One device's subscriptions, messages to publish and deliveries.
#[derive(Default)]
pub(super) struct PubSub {
    subscriptions: Vec<Subscription>,
    waiters: Vec<(u32, oneshot::Sender<Result<(), TransportError>>)>,
    pub(super) confirming: FuturesUnordered<Confirming>,
    /// Messages handed over and not yet accepted, by id.
    outgoing: HashMap<u64, Outgoing>,
    /// Ids of `outgoing` not yet sent on the current connection, in order.
    unsent: VecDeque<u64>,
    /// The generation `unsent` is for.
    unsent_for: u64,
    handed: u64,
    pub(super) accepting: FuturesUnordered<Accepting>,
    pub(super) deliveries: Option<Deliveries>,
    seen: HashSet<u64>,
}

impl PubSub {
    /// Asked to subscribe to `channel` at `qos` (replacing the QoS of an existing subscription).
    pub(super) fn subscribe(
        &mut self,
        channel: u32,
        qos: QoS,
        reply: oneshot::Sender<Result<(), TransportError>>,
    ) {
        match self.subscriptions.iter_mut().find(|s| s.channel == channel) {
            Some(s) => {
                s.qos = qos;
                s.sent_on = 0;
            }
            None => self.subscriptions.push(Subscription {
                channel,
                qos,
                sent_on: 0,
            }),
        }
        self.waiters.push((channel, reply));
    }

    /// Asked to publish `message`; `false` if a message with its id is outstanding already (nothing changes).
    pub(super) fn publish(&mut self, message: Publish) -> bool {
        if self.outgoing.contains_key(&message.id) {
            return false;
        }
        self.handed += 1;
        self.outgoing.insert(
            message.id,
            Outgoing {
                message,
                order: self.handed,
                sent_on: 0,
            },
        );
        self.unsent.push_back(message.id);
        true
    }

    /// Send every subscription and message not yet sent on connection `generation`.
    pub(super) fn send_unsent<C: Connector>(
        &mut self,
        connector: &C,
        conn: &C::Conn,
        generation: u64,
        counters: &Counters,
    ) {
        for s in self
            .subscriptions
            .iter_mut()
            .filter(|s| s.sent_on != generation)
        {
            s.sent_on = generation;
            let channel = s.channel;
            let answer = connector.subscribe(conn, channel, s.qos);
            self.confirming
                .push(Box::pin(async move { (channel, generation, answer.await) }));
        }
        if self.unsent_for != generation {
            // A new connection: everything outstanding goes on it, in the order it was handed over.
            let mut all: Vec<(u64, u64)> = self
                .outgoing
                .values()
                .map(|o| (o.order, o.message.id))
                .collect();
            all.sort_unstable();
            self.unsent = all.into_iter().map(|(_, id)| id).collect();
            self.unsent_for = generation;
        }
        while let Some(id) = self.unsent.pop_front() {
            let Some(o) = self.outgoing.get_mut(&id) else {
                continue; // accepted or discarded meanwhile
            };
            let again = o.sent_on != 0;
            if again {
                Counters::inc(&counters.resent_reconnect);
            }
            o.sent_on = generation;
            let accepted = connector.publish(conn, &o.message, again);
            self.accepting
                .push(Box::pin(async move { (id, generation, accepted.await) }));
        }
    }

    /// The answer to the subscription to `channel`.
    pub(super) fn confirmed(
        &mut self,
        channel: u32,
        result: Result<SubAck, TransportError>,
    ) -> Confirmed {
        let refusal = match result {
            Ok(SubAck::Granted) => {
                self.answer(channel, || Ok(()));
                return Confirmed::Granted;
            }
            Ok(SubAck::Refused) => TransportError::Protocol(format!(
                "the server refused the subscription to channel {channel}"
            )),
            Err(TransportError::Unsupported(what)) => TransportError::Unsupported(what),
            Err(_) => return Confirmed::Failed,
        };
        self.subscriptions.retain(|s| s.channel != channel);
        let message = refusal.to_string();
        let mut first = Some(refusal);
        self.answer(channel, || {
            Err(first
                .take()
                .unwrap_or_else(|| TransportError::Protocol(message.clone())))
        });
        Confirmed::Final
    }

    fn answer(&mut self, channel: u32, mut result: impl FnMut() -> Result<(), TransportError>) {
        let mut i = 0;
        while i < self.waiters.len() {
            if self.waiters[i].0 == channel {
                let (_, reply) = self.waiters.swap_remove(i);
                let _ = reply.send(result());
            } else {
                i += 1;
            }
        }
    }

    /// The server's acceptance of message `id` (or its failure). Returns whether it is accepted now, for the first
    /// time (to be reported), and whether the message is done with (accepted, or never to be accepted: the fleet's
    /// count of messages publishing goes down).
    pub(super) fn accepted(&mut self, id: u64, result: &Result<(), TransportError>) -> Acceptance {
        if !self.outgoing.contains_key(&id) {
            return Acceptance::Ignored; // reported already, or discarded
        }
        match result {
            Ok(()) => match self.outgoing.remove(&id) {
                Some(o) => Acceptance::Accepted(o.message.qos),
                None => Acceptance::Ignored,
            },
            Err(TransportError::Unsupported(_)) => {
                self.outgoing.remove(&id);
                Acceptance::Abandoned
            }
            Err(_) => Acceptance::Failed,
        }
    }

    /// Whether a delivery is new (to be reported): a QoS 1 delivery whose id was reported already is not.
    pub(super) fn is_new(&mut self, delivery: &Delivery) -> bool {
        delivery.qos == QoS::AtMostOnce || self.seen.insert(delivery.id)
    }

    /// The current connection is gone: QoS 0 messages sent on it and not yet accepted are discarded (never sent
    /// again); their number is returned.
    pub(super) fn connection_lost(&mut self) -> usize {
        let before = self.outgoing.len();
        self.outgoing
            .retain(|_, o| o.message.qos != QoS::AtMostOnce || o.sent_on == 0);
        before - self.outgoing.len()
    }

    /// Asked to disconnect: forget every subscription and every message not yet accepted (their number is
    /// returned); the subscriptions still waiting get an error.
    pub(super) fn forget(&mut self) -> usize {
        self.subscriptions.clear();
        self.fail_waiters("disconnected on request");
        self.confirming = FuturesUnordered::new();
        self.accepting = FuturesUnordered::new();
        self.deliveries = None;
        let abandoned = self.outgoing.len();
        self.outgoing.clear();
        self.unsent.clear();
        abandoned
    }

    /// Every subscription still waiting gets an error.
    pub(super) fn fail_waiters(&mut self, why: &str) {
        for (_, reply) in self.waiters.drain(..) {
            let _ = reply.send(Err(TransportError::Protocol(why.into())));
        }
    }
}

/// What an acceptance did to a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Acceptance {
    /// Accepted for the first time (a message of this QoS): report it.
    Accepted(QoS),
    /// The transport cannot publish it: drop it without a report.
    Abandoned,
    /// Its request failed with its connection: drop that connection if it is the current one.
    Failed,
    /// Not outstanding any more.
    Ignored,
}

/// The next deliveries of the current connection into `buf`; `false` when the connection will deliver nothing more.
pub(super) async fn next_deliveries(
    deliveries: &mut Option<Deliveries>,
    buf: &mut Vec<Delivery>,
) -> bool {
    match deliveries {
        Some(rx) => rx.recv_many(buf, 512).await > 0,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_carries_its_id_and_has_its_size() {
        let m = |id, size| Publish {
            channel: 1,
            id,
            qos: QoS::AtMostOnce,
            size,
        };
        let mut out = BytesMut::new();
        payload(&m(0x0102_0304_0506_0708, 64), &mut out);
        assert_eq!(out.len(), 64);
        assert_eq!(message_id(&out), Some(0x0102_0304_0506_0708));
        out.clear();
        // Smaller than an id: the id still travels whole.
        payload(&m(u64::MAX, 3), &mut out);
        assert_eq!((out.len(), message_id(&out)), (8, Some(u64::MAX)));
        assert_eq!(message_id(&[1, 2, 3]), None);
    }
}
