//! The broker's state, sans-IO: sessions, subscriptions, retained messages, per-session queues and statistics.
//!
//! Connections are named by [`ConnId`]; a connection is attached to a session by [`Broker::connect`] and detached by
//! [`Broker::disconnect`] (or by a later CONNECT with the same client identifier, which takes the session over and
//! lists the old connection in [`Broker::drain_kicked`]). Routing a message puts it into the queue of each matching
//! session; the driver learns which connections have something to send from [`Broker::drain_wakes`] and pulls the
//! encoded PUBLISH and PUBREL packets with [`Broker::poll_transmit`]. QoS 0, 1 and 2 are supported end to end
//! (the private `session` module has the flows).
//!
//! Bounds (see [`SessionLimits`]): a session's queue holds at most `max_queued_qos0` QoS 0 and `max_queued_qos1`
//! QoS 1 and 2 messages, and `max_queued_bytes` of topics and payloads, not yet written; beyond that a new message
//! for it is dropped and counted (the connection is kept). At most `max_inflight` QoS 1 and 2 messages per session
//! await their acknowledgements; the rest wait in the queue. A persistent session whose client is away keeps its QoS
//! 1 and 2 messages (queued and in flight, sent again when the client returns) and does not queue QoS 0 ones, as
//! section 3.1.2.4 allows. At most `max_sessions` sessions exist at once; a CONNECT that would create one more is
//! refused with return code 3 (server unavailable). Retained messages are bounded by count (`max_retained`) and by
//! bytes of topic and payload (`max_retained_bytes`); a retained PUBLISH that would pass either is routed but not
//! retained.
//!
//! Sessions are named by [`ClientKey`]: a verified identity (the TLS certificate's name) and a client identifier
//! given over the plaintext listener are different names even when the text is the same, so a plaintext client can
//! never resume, take over or read a TLS device's session.
//!
//! # Persistence
//!
//! With [`Broker::enable_journal`], every change to a persistent session (CleanSession 0) appends a
//! [`journal::Record`](super::journal::Record); the driver takes them with [`Broker::take_journal`] and makes them
//! durable before it sends whatever acknowledges them. [`Broker::snapshot`] writes records recreating every
//! persistent session, and [`Broker::restore`] replays snapshot and journal at start.

mod restore;
mod session;

pub use restore::{RestoreError, Restored};

use super::journal::{Journal, Record};
use crate::codec::{ConnectReturnCode, LastWill, PacketId, QoS, SubAck, SubscribeReturnCode};
use crate::topic::{self, RetainedTree, SubscriptionTree};
use bytes::{Bytes, BytesMut};
use session::{Enqueued, Message, Queued, Session};
use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;
use transport_core::Counters;

/// A network connection, numbered by the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

type SessionKey = u32;

/// The name a session is kept under: the client identifier and whether it is a verified identity (a TLS client
/// certificate's name) or was given by a client of the plaintext listener. The two never meet.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientKey {
    /// The identity comes from a verified certificate.
    pub verified: bool,
    /// The client identifier.
    pub id: Arc<str>,
}

impl ClientKey {
    /// A TLS client's verified identity.
    pub fn verified(id: &str) -> Self {
        ClientKey {
            verified: true,
            id: id.into(),
        }
    }

    /// A client identifier given over the plaintext listener.
    pub fn plaintext(id: &str) -> Self {
        ClientKey {
            verified: false,
            id: id.into(),
        }
    }
}

/// The bounds of one session, and of the broker's retained messages and sessions.
#[derive(Debug, Clone)]
pub struct SessionLimits {
    /// QoS 0 messages queued for a connected client and not yet written; more are dropped.
    pub max_queued_qos0: usize,
    /// QoS 1 and 2 messages queued and not yet sent (connected or not); more are dropped.
    pub max_queued_qos1: usize,
    /// Bytes of topics and payloads queued for one session and not yet sent; more are dropped.
    pub max_queued_bytes: usize,
    /// QoS 1 and 2 messages sent and awaiting their acknowledgements.
    pub max_inflight: usize,
    /// Subscriptions one session may hold; a SUBSCRIBE beyond gets return code 0x80 for the extra filters.
    pub max_subscriptions: usize,
    /// Retained messages the broker keeps; a retained PUBLISH to a new topic beyond is routed but not retained.
    pub max_retained: usize,
    /// Bytes of topics and payloads of the retained messages; a retained PUBLISH that would pass it is routed but
    /// not retained.
    pub max_retained_bytes: usize,
    /// Sessions held at once, connected or not; a CONNECT that needs a new one beyond is refused (return code 3).
    pub max_sessions: usize,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            max_queued_qos0: 1000,
            max_queued_qos1: 1000,
            max_queued_bytes: 16 << 20,
            max_inflight: 32,
            max_subscriptions: 1000,
            max_retained: 100_000,
            max_retained_bytes: 64 << 20,
            max_sessions: 100_000,
        }
    }
}

/// The broker's statistics, as `$SYS/broker/...` publishes them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Connections attached to a session.
    pub clients_connected: u64,
    /// Sessions held, connected or not.
    pub sessions: u64,
    /// PUBLISH packets received from clients.
    pub messages_received: u64,
    /// PUBLISH packets written to clients.
    pub messages_sent: u64,
    /// Messages dropped because a session's queue was full.
    pub messages_dropped: u64,
    /// Retained messages held.
    pub retained: u64,
    /// Bytes of topic and payload of the retained messages.
    pub retained_bytes: u64,
    /// Subscriptions held.
    pub subscriptions: u64,
}

/// The broker's state. Nothing here does I/O or reads a clock.
#[derive(Debug)]
pub struct Broker {
    limits: SessionLimits,
    counters: Arc<Counters>,
    sessions: Vec<Option<Session>>,
    free: Vec<SessionKey>,
    by_client: HashMap<ClientKey, SessionKey>,
    by_conn: HashMap<ConnId, SessionKey>,
    tree: SubscriptionTree<SessionKey>,
    retained: RetainedTree<Message>,
    retained_bytes: usize,
    stats: Stats,
    wakes: Vec<(ConnId, SessionKey)>,
    kicked: Vec<ConnId>,
    scratch: Vec<(SessionKey, QoS)>,
    started: Instant,
    journal: Journal,
    next_sid: u64,
    next_mid: u64,
}

impl Broker {
    /// An empty broker; `now` is the start its uptime counts from. Drops are also counted in `counters.dropped`.
    pub fn new(limits: SessionLimits, counters: Arc<Counters>, now: Instant) -> Self {
        Broker {
            limits,
            counters,
            sessions: Vec::new(),
            free: Vec::new(),
            by_client: HashMap::new(),
            by_conn: HashMap::new(),
            tree: SubscriptionTree::new(),
            retained: RetainedTree::new(),
            retained_bytes: 0,
            stats: Stats::default(),
            wakes: Vec::new(),
            kicked: Vec::new(),
            scratch: Vec::new(),
            started: now,
            journal: Journal::new(false),
            next_sid: 1,
            next_mid: 1,
        }
    }

    /// Record every change to a persistent session from now on, for [`Broker::take_journal`].
    pub fn enable_journal(&mut self) {
        self.journal = Journal::new(true);
    }

    /// The journal records appended since the last call, if any.
    pub fn take_journal(&mut self) -> Option<Vec<u8>> {
        self.journal.take()
    }

    /// The limits in force.
    pub fn limits(&self) -> &SessionLimits {
        &self.limits
    }

    /// Current statistics.
    pub fn stats(&self) -> Stats {
        Stats {
            sessions: self.by_client.len() as u64,
            retained: self.retained.len() as u64,
            retained_bytes: self.retained_bytes as u64,
            subscriptions: self.tree.len() as u64,
            ..self.stats
        }
    }

    fn session(&mut self, key: SessionKey) -> &mut Session {
        // Keys come from `by_client`/`by_conn`, which only hold live slots.
        self.sessions[key as usize]
            .as_mut()
            .expect("session key refers to a live session")
    }

    /// The session and the journal, borrowed together.
    fn session_and_journal(
        &mut self,
        conn: ConnId,
    ) -> Option<(SessionKey, &mut Session, &mut Journal)> {
        let key = *self.by_conn.get(&conn)?;
        let s = self.sessions[key as usize].as_mut()?;
        Some((key, s, &mut self.journal))
    }

    /// Whether `conn` is attached to a session (it sent an accepted CONNECT and was not taken over).
    pub fn is_attached(&self, conn: ConnId) -> bool {
        self.by_conn.contains_key(&conn)
    }

    fn insert_session(&mut self, session: Session) -> SessionKey {
        let id = session.client_id.clone();
        let key = match self.free.pop() {
            Some(k) => {
                self.sessions[k as usize] = Some(session);
                k
            }
            None => {
                self.sessions.push(Some(session));
                (self.sessions.len() - 1) as SessionKey
            }
        };
        self.by_client.insert(id, key);
        key
    }

    /// Attach `conn` to the session of `client_id`, creating, resuming or (with `clean`) replacing it; a connection
    /// already attached to that session is detached as if it had dropped (its will is published) and listed in
    /// [`Broker::drain_kicked`] [MQTT-3.1.4-2]. Returns whether a stored session was resumed (CONNACK's session
    /// present flag), or the return code refusing the CONNECT when it would create a session beyond
    /// `max_sessions`. The client identifier has been checked by the caller.
    pub fn connect(
        &mut self,
        conn: ConnId,
        client_id: &ClientKey,
        clean: bool,
        will: Option<LastWill>,
    ) -> Result<bool, ConnectReturnCode> {
        let existing = self.by_client.get(client_id).copied();
        if existing.is_none() && self.by_client.len() >= self.limits.max_sessions {
            return Err(ConnectReturnCode::ServerUnavailable);
        }
        if let Some(old) = existing.and_then(|k| self.sessions[k as usize].as_ref()?.conn) {
            self.kicked.push(old);
            self.disconnect(old, false);
        }
        // The takeover may have ended a clean session.
        let existing = self.by_client.get(client_id).copied();
        let key = match existing {
            Some(key) if !clean => key,
            _ => {
                if let Some(key) = existing {
                    self.remove_session(key);
                }
                let sid = self.next_sid;
                self.next_sid += 1;
                if !clean {
                    self.journal.push(Record::Session {
                        sid,
                        verified: client_id.verified,
                        client_id: &client_id.id,
                    });
                }
                self.insert_session(Session::new(client_id.clone(), clean, sid))
            }
        };
        let present = existing.is_some() && !clean;
        let s = self.session(key);
        s.attach(conn);
        s.will = will;
        let wake = s.has_output();
        self.by_conn.insert(conn, key);
        self.stats.clients_connected += 1;
        if wake {
            self.wake(key);
        }
        Ok(present)
    }

    /// Detach `conn`: a clean session ends; a persistent one keeps its subscriptions and QoS 1 and 2 messages.
    /// Unless the client sent DISCONNECT (`graceful`), its will is published [MQTT-3.1.2-8]; with DISCONNECT it is
    /// discarded [MQTT-3.1.2-10]. Unknown or already detached connections are ignored.
    pub fn disconnect(&mut self, conn: ConnId, graceful: bool) {
        let Some(key) = self.by_conn.remove(&conn) else {
            return;
        };
        self.stats.clients_connected -= 1;
        let s = self.session(key);
        let will = s.will.take();
        if s.clean {
            self.remove_session(key);
        } else {
            s.detach();
        }
        if let (false, Some(w)) = (graceful, will) {
            self.publish(&w.topic, w.message, w.qos, w.retain);
        }
    }

    fn remove_session(&mut self, key: SessionKey) {
        if let Some(s) = self.sessions[key as usize].take() {
            for (filter, _) in &s.subscriptions {
                self.tree.remove(filter, key);
            }
            self.by_client.remove(&s.client_id);
            if let Some(c) = s.conn {
                self.by_conn.remove(&c);
            }
            if !s.clean {
                self.journal.push(Record::End { sid: s.sid });
            }
            self.free.push(key);
        }
    }

    /// Count one PUBLISH received from a client (routed, stored as an order, or ignored).
    pub fn note_received(&mut self) {
        self.stats.messages_received += 1;
    }

    /// Route a message to every matching subscription, each session once at the highest QoS it subscribed with
    /// [MQTT-3.3.5-1], the delivery's QoS the lower of that and the message's [MQTT-3.8.4-6]. With `retain`, it
    /// replaces the topic's retained message, or an empty payload removes it [MQTT-3.3.1-5, MQTT-3.3.1-10,
    /// MQTT-3.3.1-11]; deliveries to current subscribers carry RETAIN 0 [MQTT-3.3.1-9].
    pub fn publish(&mut self, topic: &str, payload: Bytes, qos: QoS, retain: bool) {
        let msg = Message {
            topic: topic.into(),
            payload,
            qos,
        };
        if retain {
            self.retain(&msg);
        }
        let mid = self.next_mid;
        self.next_mid += 1;
        let mut body_written = false;
        let mut matches = std::mem::take(&mut self.scratch);
        self.tree.matching(topic, &mut matches);
        for &(key, sub_qos) in &matches {
            let item = Queued {
                msg: msg.clone(),
                qos: msg.qos.min(sub_qos),
                retain: false,
                mid,
            };
            self.deliver(key, item, &mut body_written);
        }
        self.scratch = matches;
    }

    /// Keep `msg` as its topic's retained message, or (empty payload) remove the one kept; a message that would pass
    /// the count or byte bound is not kept (the old one stays) and is counted in `refused_limit`.
    fn retain(&mut self, msg: &Message) {
        let old = self.retained.get(&msg.topic).map(Message::size);
        if msg.payload.is_empty() {
            if self.retained.remove(&msg.topic).is_some() {
                self.retained_bytes -= old.unwrap_or(0);
            }
            return;
        }
        let bytes = self.retained_bytes - old.unwrap_or(0) + msg.size();
        let count = self.retained.len() + usize::from(old.is_none());
        if bytes <= self.limits.max_retained_bytes && count <= self.limits.max_retained {
            self.retained.insert(&msg.topic, msg.clone());
            self.retained_bytes = bytes;
        } else {
            Counters::inc(&self.counters.refused_limit);
        }
    }

    /// Queue `item` for the session; false if it was dropped because the session's queue is full.
    fn deliver(&mut self, key: SessionKey, item: Queued, body_written: &mut bool) -> bool {
        let limits = &self.limits;
        let Some(s) = self.sessions[key as usize].as_mut() else {
            return false;
        };
        match s.enqueue(item, limits, &mut self.journal, body_written) {
            Enqueued::Queued => self.wake(key),
            Enqueued::Dropped => {
                self.stats.messages_dropped += 1;
                Counters::inc(&self.counters.dropped);
                return false;
            }
            Enqueued::NotQueued => {}
        }
        true
    }

    fn wake(&mut self, key: SessionKey) {
        let s = self.session(key);
        if let (Some(conn), false) = (s.conn, s.wake_pending) {
            s.wake_pending = true;
            self.wakes.push((conn, key));
        }
    }

    /// Connections that have output since the last call; the driver wakes their writers.
    pub fn drain_wakes(&mut self, out: &mut Vec<ConnId>) {
        for (conn, key) in self.wakes.drain(..) {
            if let Some(s) = self.sessions[key as usize].as_mut() {
                s.wake_pending = false;
            }
            out.push(conn);
        }
    }

    /// Connections detached by a takeover since the last call; the driver closes them.
    pub fn drain_kicked(&mut self, out: &mut Vec<ConnId>) {
        out.append(&mut self.kicked);
    }

    /// Add or replace `conn`'s subscriptions, granting the QoS asked for. A filter of more than
    /// [`topic::MAX_LEVELS`] levels, or one past the session's subscription bound, gets 0x80. Then the retained
    /// messages matching each distinct filter granted are queued once, with RETAIN 1 [MQTT-3.3.1-6, MQTT-3.3.1-8],
    /// found through the retained tree; a filter's search stops when the session's queue is full. `None` if `conn`
    /// is not attached.
    pub fn subscribe(
        &mut self,
        conn: ConnId,
        packet_id: PacketId,
        filters: &[(String, QoS)],
    ) -> Option<SubAck> {
        let key = *self.by_conn.get(&conn)?;
        let mut return_codes = Vec::with_capacity(filters.len());
        // Filters granted, each once, with the QoS its last occurrence got.
        let mut granted_filters: Vec<(&str, QoS)> = Vec::new();
        for (filter, granted) in filters {
            let max = self.limits.max_subscriptions;
            let s = self.sessions[key as usize].as_mut()?;
            if !topic::within_level_cap(filter) {
                Counters::inc(&self.counters.refused_limit);
                return_codes.push(SubscribeReturnCode::Failure);
                continue;
            }
            match s.subscriptions.iter().position(|(f, _)| **f == **filter) {
                Some(i) => s.subscriptions[i].1 = *granted,
                None if s.subscriptions.len() >= max => {
                    Counters::inc(&self.counters.refused_limit);
                    return_codes.push(SubscribeReturnCode::Failure);
                    continue;
                }
                None => s.subscriptions.push((filter.as_str().into(), *granted)),
            }
            if !s.clean {
                self.journal.push(Record::Sub {
                    sid: s.sid,
                    qos: *granted,
                    filter,
                });
            }
            self.tree.insert(filter, key, *granted);
            return_codes.push(SubscribeReturnCode::Granted(*granted));
            match granted_filters.iter_mut().find(|(f, _)| *f == filter) {
                Some(entry) => entry.1 = *granted,
                None => granted_filters.push((filter, *granted)),
            }
        }
        for (filter, granted) in granted_filters {
            self.deliver_retained(key, filter, granted);
        }
        Some(SubAck {
            packet_id,
            return_codes,
        })
    }

    /// Queue the retained messages matching `filter` for the session, until its queue is full.
    fn deliver_retained(&mut self, key: SessionKey, filter: &str, granted: QoS) {
        let mut found = Vec::new();
        let limits = &self.limits;
        let Some(s) = self.sessions[key as usize].as_ref() else {
            return;
        };
        // Room left, so the search stops where further messages would only be dropped.
        let mut room_qos0 = limits.max_queued_qos0.saturating_sub(s.queued_qos0);
        let mut room_qos12 = limits.max_queued_qos1.saturating_sub(s.queued_qos12);
        let mut room_bytes = limits.max_queued_bytes.saturating_sub(s.queued_bytes);
        self.retained.for_each_match(filter, |m| {
            let qos = m.qos.min(granted);
            let room = if qos == QoS::AtMostOnce {
                &mut room_qos0
            } else {
                &mut room_qos12
            };
            if *room == 0 || room_bytes < m.size() {
                return ControlFlow::Break(());
            }
            *room -= 1;
            room_bytes -= m.size();
            found.push((m.clone(), qos));
            ControlFlow::Continue(())
        });
        for (msg, qos) in found {
            let mid = self.next_mid;
            self.next_mid += 1;
            let item = Queued {
                msg,
                qos,
                retain: true,
                mid,
            };
            self.deliver(key, item, &mut false);
        }
    }

    /// Remove `conn`'s subscriptions to `filters`, compared byte for byte (absent ones are ignored)
    /// [MQTT-3.10.4-1]; false if `conn` is not attached.
    pub fn unsubscribe(&mut self, conn: ConnId, filters: &[String]) -> bool {
        let Some(&key) = self.by_conn.get(&conn) else {
            return false;
        };
        for filter in filters {
            let s = self.session(key);
            if let Some(i) = s.subscriptions.iter().position(|(f, _)| **f == **filter) {
                s.subscriptions.swap_remove(i);
                if !s.clean {
                    let sid = s.sid;
                    self.journal.push(Record::Unsub { sid, filter });
                }
                self.tree.remove(filter, key);
            }
        }
        true
    }

    /// Run an acknowledgement from `conn`'s client against its session, waking the writer when it frees a place in
    /// the window or asks for a PUBREL.
    fn ack(&mut self, conn: ConnId, f: impl FnOnce(&mut Session, &mut Journal) -> bool) {
        let Some((key, s, j)) = self.session_and_journal(conn) else {
            return;
        };
        if f(s, j) && s.has_output() {
            self.wake(key);
        }
    }

    /// A PUBACK from `conn`'s client: the QoS 1 message leaves the in-flight window. Unknown identifiers are
    /// ignored.
    pub fn puback(&mut self, conn: ConnId, packet_id: PacketId) {
        self.ack(conn, |s, j| s.puback(packet_id, j));
    }

    /// A PUBREC from `conn`'s client: the QoS 2 message was received; a PUBREL is sent (again, for a repeat).
    pub fn pubrec(&mut self, conn: ConnId, packet_id: PacketId) {
        self.ack(conn, |s, j| s.pubrec(packet_id, j));
    }

    /// A PUBCOMP from `conn`'s client: the QoS 2 message leaves the in-flight window.
    pub fn pubcomp(&mut self, conn: ConnId, packet_id: PacketId) {
        self.ack(conn, |s, j| s.pubcomp(packet_id, j));
    }

    /// A QoS 2 PUBLISH `packet_id` from `conn`'s client: `Some(true)` if it is new and must be delivered,
    /// `Some(false)` for a copy of one received and not yet released [MQTT-4.3.3-2]; `None` if not attached.
    pub fn received_qos2(&mut self, conn: ConnId, packet_id: PacketId) -> Option<bool> {
        let (_, s, j) = self.session_and_journal(conn)?;
        Some(s.received(packet_id, j))
    }

    /// A PUBREL from `conn`'s client: its identifier is free for a new message again.
    pub fn released_qos2(&mut self, conn: ConnId, packet_id: PacketId) {
        if let Some((_, s, j)) = self.session_and_journal(conn) {
            s.released(packet_id, j);
        }
    }

    /// Encode `conn`'s pending packets into `out` until it holds at least `max_bytes` or nothing more may be sent:
    /// what is in flight and not yet sent on this connection first (PUBLISH with DUP [MQTT-4.4.0-1], or PUBREL),
    /// the PUBRELs due, then the queue in order, a QoS 1 or 2 message only while the in-flight window has room.
    /// Returns how many PUBLISH packets were added.
    pub fn poll_transmit(&mut self, conn: ConnId, out: &mut BytesMut, max_bytes: usize) -> usize {
        let max_inflight = self.limits.max_inflight;
        let Some((_, s, j)) = self.session_and_journal(conn) else {
            return 0;
        };
        let sent = s.poll(out, max_bytes, max_inflight, j);
        self.stats.messages_sent += sent as u64;
        sent
    }

    /// The records that recreate every persistent session, ending with [`Record::SnapshotEnd`].
    pub fn snapshot(&self) -> Vec<u8> {
        let mut j = Journal::new(true);
        let mut bodies = HashSet::new();
        let mut persistent: Vec<&Session> = self
            .sessions
            .iter()
            .flatten()
            .filter(|s| !s.clean)
            .collect();
        persistent.sort_by_key(|s| s.sid);
        for s in persistent {
            s.snapshot(&mut j, &mut bodies);
        }
        let records = j.records();
        j.push(Record::SnapshotEnd { records });
        j.take().unwrap_or_default()
    }

    /// Publish the statistics as retained QoS 0 messages under `$SYS/broker/`, as mosquitto names them.
    /// `memory_used` is what the driver measured (bytes).
    pub fn publish_sys(&mut self, now: Instant, memory_used: u64) {
        let st = self.stats();
        let uptime = now.saturating_duration_since(self.started).as_secs();
        let values = [
            (
                "$SYS/broker/clients/connected",
                st.clients_connected.to_string(),
            ),
            ("$SYS/broker/clients/total", st.sessions.to_string()),
            (
                "$SYS/broker/messages/received",
                st.messages_received.to_string(),
            ),
            ("$SYS/broker/messages/sent", st.messages_sent.to_string()),
            (
                "$SYS/broker/messages/dropped",
                st.messages_dropped.to_string(),
            ),
            ("$SYS/broker/memory/used", memory_used.to_string()),
            (
                "$SYS/broker/retained messages/count",
                st.retained.to_string(),
            ),
            (
                "$SYS/broker/subscriptions/count",
                st.subscriptions.to_string(),
            ),
            ("$SYS/broker/uptime", format!("{uptime} seconds")),
        ];
        for (topic, value) in values {
            self.publish(topic, Bytes::from(value), QoS::AtMostOnce, true);
        }
    }
}

#[cfg(test)]
mod tests;
