//! One session: its queue, its in-flight window (QoS 1 and 2 to the client), the QoS 2 identifiers it received from
//! the client, and the journal records a persistent session writes as each of them changes.
//!
//! Outbound, a QoS 1 message waits in flight for its PUBACK; a QoS 2 message for its PUBREC, then (PUBREL sent) for
//! its PUBCOMP [MQTT-4.3.3-1]. When the client reconnects, every in-flight message is sent again in the order first
//! sent, a PUBLISH with DUP or the PUBREL, with its original identifier [MQTT-4.4.0-1, MQTT-4.6.0-1]. PUBRELs are
//! sent in the order their PUBRECs came [MQTT-4.6.0-4]. Inbound, a QoS 2 identifier is kept from the PUBLISH until
//! the PUBREL, so a copy sent again in between is acknowledged but not delivered twice [MQTT-4.3.3-2].

use super::{ClientKey, ConnId, SessionLimits};
use crate::broker::journal::{Journal, Record};
use crate::codec::{encode_publish, LastWill, Packet, PacketId, QoS};
use bytes::{Bytes, BytesMut};
use std::collections::{BTreeSet, HashSet, VecDeque};
use std::sync::Arc;

/// An application message as the broker routes it: cheap to clone for many subscribers.
#[derive(Debug, Clone)]
pub(super) struct Message {
    pub topic: Arc<str>,
    pub payload: Bytes,
    pub qos: QoS,
}

impl Message {
    /// What it costs to keep: topic and payload.
    pub fn size(&self) -> usize {
        self.topic.len() + self.payload.len()
    }
}

/// One message waiting in a session.
#[derive(Debug, Clone)]
pub(super) struct Queued {
    pub msg: Message,
    /// The QoS it is delivered with: the lower of the message's and the subscription's.
    pub qos: QoS,
    pub retain: bool,
    /// The message's number in the journal.
    pub mid: u64,
}

/// Where an in-flight message is in its flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// PUBLISH sent; awaiting PUBACK (QoS 1) or PUBREC (QoS 2).
    Published,
    /// PUBREC received, PUBREL sent; awaiting PUBCOMP.
    Released,
}

#[derive(Debug)]
struct InFlight {
    id: PacketId,
    item: Queued,
    stage: Stage,
}

pub(super) enum Enqueued {
    Queued,
    Dropped,
    NotQueued,
}

#[derive(Debug)]
pub(super) struct Session {
    pub client_id: ClientKey,
    pub clean: bool,
    /// The session's number in the journal.
    pub sid: u64,
    pub conn: Option<ConnId>,
    pub will: Option<LastWill>,
    pub subscriptions: Vec<(Box<str>, QoS)>,
    pub wake_pending: bool,
    queue: VecDeque<Queued>,
    pub queued_qos0: usize,
    /// QoS 1 and 2 messages in the queue.
    pub queued_qos12: usize,
    pub queued_bytes: usize,
    /// Messages sent (or to be sent again) awaiting their acknowledgement, in the order they were first sent.
    inflight: VecDeque<InFlight>,
    /// How many of `inflight` were written on the current connection; the rest are sent again first.
    inflight_sent: usize,
    /// PUBRELs to write on this connection, in the order their PUBRECs came.
    pubrel: VecDeque<PacketId>,
    /// QoS 2 identifiers received from the client and not yet released.
    inbound: BTreeSet<PacketId>,
    last_packet_id: u16,
}

impl Session {
    pub fn new(client_id: ClientKey, clean: bool, sid: u64) -> Self {
        Session {
            client_id,
            clean,
            sid,
            conn: None,
            will: None,
            subscriptions: Vec::new(),
            wake_pending: false,
            queue: VecDeque::new(),
            queued_qos0: 0,
            queued_qos12: 0,
            queued_bytes: 0,
            inflight: VecDeque::new(),
            inflight_sent: 0,
            pubrel: VecDeque::new(),
            inbound: BTreeSet::new(),
            last_packet_id: 0,
        }
    }

    /// A persistent session writes journal records; a clean one never outlives its connection.
    fn journal<'a>(&self, j: &'a mut Journal) -> Option<&'a mut Journal> {
        (!self.clean).then_some(j)
    }

    /// Queue `item`; `body_written` says whether its message's body is already in the journal (set once written).
    pub fn enqueue(
        &mut self,
        item: Queued,
        limits: &SessionLimits,
        j: &mut Journal,
        body_written: &mut bool,
    ) -> Enqueued {
        let size = item.msg.size();
        if item.qos == QoS::AtMostOnce && self.conn.is_none() {
            return Enqueued::NotQueued;
        }
        let (count, max) = match item.qos {
            QoS::AtMostOnce => (&mut self.queued_qos0, limits.max_queued_qos0),
            _ => (&mut self.queued_qos12, limits.max_queued_qos1),
        };
        if *count >= max || self.queued_bytes + size > limits.max_queued_bytes {
            return Enqueued::Dropped;
        }
        *count += 1;
        self.queued_bytes += size;
        if let (Some(j), true) = (self.journal(j), item.qos != QoS::AtMostOnce) {
            if !*body_written {
                j.push(Record::Message {
                    mid: item.mid,
                    topic: &item.msg.topic,
                    payload: &item.msg.payload,
                });
                *body_written = true;
            }
            j.push(Record::Enqueue {
                sid: self.sid,
                mid: item.mid,
                qos: item.qos,
                retain: item.retain,
            });
        }
        self.queue.push_back(item);
        Enqueued::Queued
    }

    /// The client went away: a persistent session keeps its QoS 1 and 2 messages, to send again when it returns.
    pub fn detach(&mut self) {
        self.conn = None;
        self.wake_pending = false;
        self.queue.retain(|q| q.qos != QoS::AtMostOnce);
        self.queued_qos0 = 0;
        self.queued_bytes = self.queue.iter().map(|q| q.msg.size()).sum();
        self.inflight_sent = 0;
        self.pubrel.clear();
    }

    /// A new connection: everything in flight is sent again first.
    pub fn attach(&mut self, conn: ConnId) {
        self.conn = Some(conn);
        self.inflight_sent = 0;
        self.pubrel.clear();
        self.wake_pending = false;
    }

    pub fn has_output(&self) -> bool {
        !self.queue.is_empty()
            || self.inflight_sent < self.inflight.len()
            || !self.pubrel.is_empty()
    }

    /// The next packet identifier not in flight [MQTT-2.3.1-4]; the in-flight window is far smaller than 65,535.
    fn next_packet_id(&mut self) -> PacketId {
        loop {
            self.last_packet_id = self.last_packet_id.wrapping_add(1);
            if let Some(id) = PacketId::new(self.last_packet_id) {
                if !self.inflight.iter().any(|f| f.id == id) {
                    return id;
                }
            }
        }
    }

    /// Encode what may be sent into `out` until it holds `max_bytes`: in-flight messages not yet sent on this
    /// connection (PUBLISH with DUP [MQTT-3.3.1-1], or PUBREL), the PUBRELs PUBRECs asked for, then the queue in
    /// order, a QoS 1 or 2 message only while fewer than `max_inflight` are in flight. Returns the PUBLISH packets
    /// written.
    pub fn poll(
        &mut self,
        out: &mut BytesMut,
        max_bytes: usize,
        max_inflight: usize,
        j: &mut Journal,
    ) -> usize {
        let mut published = 0;
        while out.len() < max_bytes && self.inflight_sent < self.inflight.len() {
            let f = &self.inflight[self.inflight_sent];
            match f.stage {
                Stage::Published => {
                    let q = &f.item;
                    let _ = encode_publish(
                        out,
                        true,
                        q.qos,
                        q.retain,
                        &q.msg.topic,
                        Some(f.id),
                        &q.msg.payload,
                    );
                    published += 1;
                }
                Stage::Released => {
                    let _ = Packet::PubRel(f.id).encode(out);
                }
            }
            self.inflight_sent += 1;
        }
        while out.len() < max_bytes {
            let Some(id) = self.pubrel.pop_front() else {
                break;
            };
            // Skip one completed meanwhile.
            if self
                .inflight
                .iter()
                .any(|f| f.id == id && f.stage == Stage::Released)
            {
                let _ = Packet::PubRel(id).encode(out);
            }
        }
        while out.len() < max_bytes {
            let Some(front) = self.queue.front() else {
                break;
            };
            if front.qos != QoS::AtMostOnce && self.inflight.len() >= max_inflight {
                break;
            }
            let Some(q) = self.queue.pop_front() else {
                break;
            };
            self.queued_bytes -= q.msg.size();
            let packet_id = match q.qos {
                QoS::AtMostOnce => {
                    self.queued_qos0 -= 1;
                    None
                }
                _ => {
                    self.queued_qos12 -= 1;
                    let id = self.next_packet_id();
                    if let Some(j) = self.journal(j) {
                        j.push(Record::Send { sid: self.sid, id });
                    }
                    Some(id)
                }
            };
            // Topic and payload came from a decoded packet, so they fit; a failure would only skip the message.
            if encode_publish(
                out,
                false,
                q.qos,
                q.retain,
                &q.msg.topic,
                packet_id,
                &q.msg.payload,
            )
            .is_ok()
            {
                published += 1;
            }
            if let Some(id) = packet_id {
                self.inflight.push_back(InFlight {
                    id,
                    item: q,
                    stage: Stage::Published,
                });
                self.inflight_sent += 1;
            }
        }
        published
    }

    fn position(&self, id: PacketId, stage: Stage) -> Option<usize> {
        self.inflight
            .iter()
            .position(|f| f.id == id && f.stage == stage)
    }

    fn finish(&mut self, i: usize, j: &mut Journal) {
        if let Some(f) = self.inflight.remove(i) {
            if i < self.inflight_sent {
                self.inflight_sent -= 1;
            }
            if let Some(j) = self.journal(j) {
                j.push(Record::Done {
                    sid: self.sid,
                    id: f.id,
                });
            }
        }
    }

    /// PUBACK: a QoS 1 message is delivered. Whether anything changed.
    pub fn puback(&mut self, id: PacketId, j: &mut Journal) -> bool {
        match self.position(id, Stage::Published) {
            Some(i) if self.inflight[i].item.qos == QoS::AtLeastOnce => {
                self.finish(i, j);
                true
            }
            _ => false,
        }
    }

    /// PUBREC: a QoS 2 message is received; its PUBREL is due (again, if this PUBREC is a repeat). Whether there is
    /// something to send.
    pub fn pubrec(&mut self, id: PacketId, j: &mut Journal) -> bool {
        let Some(i) = self.inflight.iter().position(|f| f.id == id) else {
            return false;
        };
        let f = &mut self.inflight[i];
        if f.item.qos != QoS::ExactlyOnce {
            return false;
        }
        if f.stage == Stage::Published {
            f.stage = Stage::Released;
            if let Some(j) = (!self.clean).then_some(j) {
                j.push(Record::Released { sid: self.sid, id });
            }
        }
        // One not yet sent again on this connection goes out as a PUBREL in its turn.
        if i < self.inflight_sent {
            self.pubrel.push_back(id);
        }
        true
    }

    /// PUBCOMP: a QoS 2 message is complete. Whether anything changed.
    pub fn pubcomp(&mut self, id: PacketId, j: &mut Journal) -> bool {
        match self.position(id, Stage::Released) {
            Some(i) => {
                self.finish(i, j);
                true
            }
            None => false,
        }
    }

    /// A QoS 2 PUBLISH `id` from the client: whether it is new (to be delivered) rather than a copy of one not yet
    /// released.
    pub fn received(&mut self, id: PacketId, j: &mut Journal) -> bool {
        let new = self.inbound.insert(id);
        if let (true, Some(j)) = (new, self.journal(j)) {
            j.push(Record::Received { sid: self.sid, id });
        }
        new
    }

    /// PUBREL `id` from the client: the identifier may be used for a new message again.
    pub fn released(&mut self, id: PacketId, j: &mut Journal) {
        if let (true, Some(j)) = (self.inbound.remove(&id), self.journal(j)) {
            j.push(Record::Forgotten { sid: self.sid, id });
        }
    }

    /// The records that recreate this persistent session (not its connection, not its QoS 0 messages), each
    /// message body once across sessions (`bodies` holds those written).
    pub fn snapshot(&self, j: &mut Journal, bodies: &mut HashSet<u64>) {
        let sid = self.sid;
        j.push(Record::Session {
            sid,
            verified: self.client_id.verified,
            client_id: &self.client_id.id,
        });
        for (filter, qos) in &self.subscriptions {
            j.push(Record::Sub {
                sid,
                qos: *qos,
                filter,
            });
        }
        let mut queued = |q: &Queued, j: &mut Journal| {
            if bodies.insert(q.mid) {
                j.push(Record::Message {
                    mid: q.mid,
                    topic: &q.msg.topic,
                    payload: &q.msg.payload,
                });
            }
            j.push(Record::Enqueue {
                sid,
                mid: q.mid,
                qos: q.qos,
                retain: q.retain,
            });
        };
        for f in &self.inflight {
            queued(&f.item, j);
            j.push(Record::Send { sid, id: f.id });
            if f.stage == Stage::Released {
                j.push(Record::Released { sid, id: f.id });
            }
        }
        for q in self.queue.iter().filter(|q| q.qos != QoS::AtMostOnce) {
            queued(q, j);
        }
        for &id in &self.inbound {
            j.push(Record::Received { sid, id });
        }
    }

    // Replaying records: each returns false when the record does not fit the session as it stands.

    pub fn replay_enqueue(&mut self, item: Queued) {
        self.queued_qos12 += 1;
        self.queued_bytes += item.msg.size();
        self.queue.push_back(item);
    }

    pub fn replay_send(&mut self, id: PacketId) -> bool {
        let Some(q) = self.queue.pop_front() else {
            return false;
        };
        self.queued_qos12 -= 1;
        self.queued_bytes -= q.msg.size();
        self.last_packet_id = self.last_packet_id.max(id.get());
        self.inflight.push_back(InFlight {
            id,
            item: q,
            stage: Stage::Published,
        });
        true
    }

    pub fn replay_done(&mut self, id: PacketId) -> bool {
        match self.inflight.iter().position(|f| f.id == id) {
            Some(i) => {
                self.inflight.remove(i);
                true
            }
            None => false,
        }
    }

    pub fn replay_released(&mut self, id: PacketId) -> bool {
        match self.inflight.iter_mut().find(|f| f.id == id) {
            Some(f) => {
                f.stage = Stage::Released;
                true
            }
            None => false,
        }
    }

    pub fn replay_inbound(&mut self, id: PacketId, received: bool) {
        if received {
            self.inbound.insert(id);
        } else {
            self.inbound.remove(&id);
        }
    }
}
