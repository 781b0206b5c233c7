//! The relay's state, sans-IO: subscriptions, each with its bounded queue and in-flight window, shaped like the MQTT
//! broker's sessions (`transport_mqtt::broker::state`) so that both relay by the same rules.
//!
//! A subscription is keyed by (device, channel) and outlives the stream that made it: its QoS 1 messages, queued
//! and in flight, wait for the device's next subscription stream (after a reconnect) and are sent on it again,
//! in flight first. A stream is *attached* to its subscription by [`Relay::attach`] (a newer stream for the same key
//! takes over: the older one's [`Relay::poll`] returns `None`) and detached by [`Relay::detach`].
//!
//! # Back-pressure (see [`RelayLimits`])
//!
//! A message routed to a subscription is queued unless its queue is full: more than `max_queued_qos0` QoS 0 or
//! `max_queued_qos1` QoS 1 messages, or `max_queued_bytes` of payload, not yet written to its stream. A message that
//! does not fit is dropped and counted (`dropped`); the stream is kept. At most `max_inflight` QoS 1 deliveries
//! await their acknowledgement; the rest wait in the queue. A QoS 0 message for a subscription with no stream is
//! not queued, and the QoS 0 messages queued when its stream ends are discarded, as MQTT brokers do for a client
//! that is away: neither is counted as dropped (nothing was slow; a connection was lost).

use super::wire;
use bytes::{Bytes, BytesMut};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use tokio::sync::Notify;
use transport_core::{Counters, QoS};

/// The bounds of each subscription and device.
#[derive(Debug, Clone)]
pub struct RelayLimits {
    /// QoS 0 messages queued and not yet written; more are dropped.
    pub max_queued_qos0: usize,
    /// QoS 1 messages queued and not yet written (with a stream or not); more are dropped.
    pub max_queued_qos1: usize,
    /// Payload bytes queued (both QoS) and not yet written; more are dropped.
    pub max_queued_bytes: usize,
    /// QoS 1 deliveries written and awaiting their acknowledgement.
    pub max_inflight: usize,
    /// Subscriptions one device may hold; more are refused.
    pub max_subscriptions: usize,
}

impl Default for RelayLimits {
    /// The in-tree MQTT broker's session bounds (1,000 + 1,000 queued, 32 in flight), with a byte bound so that a
    /// device sending the largest messages cannot make one subscription hold more than 4 MiB.
    fn default() -> Self {
        RelayLimits {
            max_queued_qos0: 1000,
            max_queued_qos1: 1000,
            max_queued_bytes: 4 << 20,
            max_inflight: 32,
            max_subscriptions: 64,
        }
    }
}

/// A subscription's key: the device (its certificate's sender number) and the channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SubKey {
    /// The subscribing device.
    pub device: u64,
    /// The channel.
    pub channel: u32,
}

/// A stream attached to its subscription.
#[derive(Debug, Clone)]
pub struct Attached {
    /// The subscription.
    pub key: SubKey,
    /// Which stream this is (a newer one takes over).
    pub token: u64,
    /// The QoS granted (the QoS asked for: both are granted).
    pub granted: QoS,
    /// Notified when the subscription has something to write.
    pub wake: Arc<Notify>,
}

#[derive(Debug)]
struct Queued {
    qos: QoS,
    payload: Bytes,
}

#[derive(Debug)]
struct Subscription {
    qos: QoS,
    stream: Option<u64>,
    queue: VecDeque<Queued>,
    queued_qos0: usize,
    queued_qos1: usize,
    queued_bytes: usize,
    /// QoS 1 deliveries written (or to be written again) awaiting their acknowledgement, oldest first.
    inflight: VecDeque<(u64, Bytes)>,
    /// How many of `inflight` were written on the current stream; the rest are written again first.
    inflight_sent: usize,
    next_seq: u64,
    wake: Arc<Notify>,
}

impl Subscription {
    fn has_output(&self) -> bool {
        self.inflight_sent < self.inflight.len() || !self.queue.is_empty()
    }
}

/// The relay: every subscription, and which subscriptions each channel has.
#[derive(Debug)]
pub struct Relay {
    limits: RelayLimits,
    counters: Arc<Counters>,
    subscriptions: HashMap<SubKey, Subscription>,
    channels: HashMap<u32, Vec<SubKey>>,
    per_device: HashMap<u64, usize>,
    next_token: u64,
}

impl Relay {
    /// An empty relay counting drops into `counters.dropped`.
    pub fn new(limits: RelayLimits, counters: Arc<Counters>) -> Relay {
        Relay {
            limits,
            counters,
            subscriptions: HashMap::new(),
            channels: HashMap::new(),
            per_device: HashMap::new(),
            next_token: 1,
        }
    }

    /// Attach a new stream of `device` to its subscription to `channel` at `qos`, creating the subscription (or
    /// changing its QoS). QoS 1 messages in flight are written again on this stream, first. `None` if the device
    /// already holds the most subscriptions it may.
    pub fn attach(&mut self, device: u64, channel: u32, qos: QoS) -> Option<Attached> {
        let key = SubKey { device, channel };
        let token = self.next_token;
        self.next_token += 1;
        let s = match self.subscriptions.get_mut(&key) {
            Some(s) => s,
            None => {
                let held = self.per_device.entry(device).or_default();
                if *held >= self.limits.max_subscriptions {
                    return None;
                }
                *held += 1;
                self.channels.entry(channel).or_default().push(key);
                self.subscriptions.entry(key).or_insert(Subscription {
                    qos,
                    stream: None,
                    queue: VecDeque::new(),
                    queued_qos0: 0,
                    queued_qos1: 0,
                    queued_bytes: 0,
                    inflight: VecDeque::new(),
                    inflight_sent: 0,
                    next_seq: 1,
                    wake: Arc::new(Notify::new()),
                })
            }
        };
        s.qos = qos;
        s.stream = Some(token);
        s.inflight_sent = 0;
        // Each stream has its own wake-up: the one replaced (if any) is woken once more, polls, learns it is over.
        let old = std::mem::replace(&mut s.wake, Arc::new(Notify::new()));
        old.notify_one();
        Some(Attached {
            key,
            token,
            granted: qos,
            wake: s.wake.clone(),
        })
    }

    /// The stream `token` of subscription `key` ended: unless a newer stream took over, the subscription waits
    /// without one (its QoS 1 messages kept, its QoS 0 ones discarded).
    pub fn detach(&mut self, key: SubKey, token: u64) {
        let Some(s) = self.subscriptions.get_mut(&key) else {
            return;
        };
        if s.stream != Some(token) {
            return;
        }
        s.stream = None;
        s.inflight_sent = 0;
        let mut freed = 0;
        s.queue.retain(|q| {
            let keep = q.qos == QoS::AtLeastOnce;
            if !keep {
                freed += q.payload.len();
            }
            keep
        });
        s.queued_qos0 = 0;
        s.queued_bytes -= freed;
    }

    /// Relay a message published to `channel` at `qos`: queue it for every subscription of the channel, at the
    /// lower of the two QoS, waking each stream with something new to write. Returns how many were dropped.
    pub fn publish(&mut self, channel: u32, qos: QoS, payload: &Bytes) -> usize {
        let Some(keys) = self.channels.get(&channel) else {
            return 0;
        };
        let mut dropped = 0;
        for key in keys {
            let Some(s) = self.subscriptions.get_mut(key) else {
                continue;
            };
            let qos = if qos.level() <= s.qos.level() {
                qos
            } else {
                s.qos
            };
            let fits = s.queued_bytes + payload.len() <= self.limits.max_queued_bytes;
            let counted = match qos {
                QoS::AtMostOnce if s.stream.is_none() => continue,
                QoS::AtMostOnce if fits && s.queued_qos0 < self.limits.max_queued_qos0 => {
                    &mut s.queued_qos0
                }
                QoS::AtLeastOnce if fits && s.queued_qos1 < self.limits.max_queued_qos1 => {
                    &mut s.queued_qos1
                }
                _ => {
                    dropped += 1;
                    continue;
                }
            };
            *counted += 1;
            s.queued_bytes += payload.len();
            s.queue.push_back(Queued {
                qos,
                payload: payload.clone(),
            });
            if s.stream.is_some() {
                s.wake.notify_one();
            }
        }
        Counters::add(&self.counters.dropped, dropped as u64);
        dropped
    }

    /// The subscriber of `key` has delivery `seq`: it leaves the in-flight window (unknown numbers are ignored).
    pub fn ack(&mut self, key: SubKey, seq: u64) {
        let Some(s) = self.subscriptions.get_mut(&key) else {
            return;
        };
        if let Some(i) = s.inflight.iter().position(|(n, _)| *n == seq) {
            s.inflight.remove(i);
            if i < s.inflight_sent {
                s.inflight_sent -= 1;
            }
            if s.has_output() {
                s.wake.notify_one();
            }
        }
    }

    /// Encode what stream `token` of `key` may write now into `out`, until it holds `max_bytes` or nothing more
    /// may be written: QoS 1 deliveries in flight and not yet written on this stream first, then the queue in
    /// order, a QoS 1 message only while the in-flight window has room. Returns how many deliveries were added;
    /// `None` if the stream is no longer the subscription's (the stream should end).
    pub fn poll(
        &mut self,
        key: SubKey,
        token: u64,
        out: &mut BytesMut,
        max_bytes: usize,
    ) -> Option<usize> {
        let max_inflight = self.limits.max_inflight;
        let s = self.subscriptions.get_mut(&key)?;
        if s.stream != Some(token) {
            return None;
        }
        let mut n = 0;
        while out.len() < max_bytes && s.inflight_sent < s.inflight.len() {
            let (seq, payload) = &s.inflight[s.inflight_sent];
            wire::encode_deliver(Some(*seq), payload, out);
            s.inflight_sent += 1;
            n += 1;
        }
        while out.len() < max_bytes {
            let Some(front) = s.queue.front() else { break };
            if front.qos == QoS::AtLeastOnce && s.inflight.len() >= max_inflight {
                break;
            }
            let Some(q) = s.queue.pop_front() else { break };
            s.queued_bytes -= q.payload.len();
            n += 1;
            match q.qos {
                QoS::AtMostOnce => {
                    s.queued_qos0 -= 1;
                    wire::encode_deliver(None, &q.payload, out);
                }
                QoS::AtLeastOnce => {
                    s.queued_qos1 -= 1;
                    let seq = s.next_seq;
                    s.next_seq += 1;
                    wire::encode_deliver(Some(seq), &q.payload, out);
                    s.inflight.push_back((seq, q.payload));
                    s.inflight_sent += 1;
                }
            }
        }
        Some(n)
    }

    /// Subscriptions held.
    pub fn subscriptions(&self) -> usize {
        self.subscriptions.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::wire::{decode, Frame};

    fn msg(id: u64) -> Bytes {
        Bytes::copy_from_slice(&id.to_be_bytes())
    }

    fn relay(limits: RelayLimits) -> (Relay, Arc<Counters>) {
        let counters = Arc::new(Counters::default());
        (Relay::new(limits, counters.clone()), counters)
    }

    /// Everything `a` may write now, as frames.
    fn written(relay: &mut Relay, a: &Attached) -> Option<Vec<Frame>> {
        let mut out = BytesMut::new();
        relay.poll(a.key, a.token, &mut out, usize::MAX)?;
        Some(std::iter::from_fn(|| decode(&mut out).unwrap()).collect())
    }

    fn ids(frames: &[Frame]) -> Vec<(Option<u64>, u64)> {
        frames
            .iter()
            .map(|f| match f {
                Frame::Deliver0 { payload } => (None, crate::fleet::message_id(payload).unwrap()),
                Frame::Deliver1 { seq, payload } => {
                    (Some(*seq), crate::fleet::message_id(payload).unwrap())
                }
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn each_subscription_gets_each_message_at_the_lower_qos() {
        let (mut r, counters) = relay(RelayLimits::default());
        let a = r.attach(1, 7, QoS::AtLeastOnce).unwrap();
        let b = r.attach(2, 7, QoS::AtMostOnce).unwrap();
        let other = r.attach(3, 8, QoS::AtLeastOnce).unwrap();
        r.publish(7, QoS::AtLeastOnce, &msg(10));
        r.publish(7, QoS::AtMostOnce, &msg(11));
        r.publish(9, QoS::AtLeastOnce, &msg(12)); // nobody listens
        assert_eq!(
            ids(&written(&mut r, &a).unwrap()),
            vec![(Some(1), 10), (None, 11)]
        );
        assert_eq!(
            ids(&written(&mut r, &b).unwrap()),
            vec![(None, 10), (None, 11)]
        );
        assert!(written(&mut r, &other).unwrap().is_empty());
        assert_eq!(counters.snapshot().dropped, 0);
    }

    #[test]
    fn full_queues_drop_and_count_and_the_window_holds_the_rest() {
        let limits = RelayLimits {
            max_queued_qos0: 3,
            max_queued_qos1: 2,
            max_inflight: 1,
            ..RelayLimits::default()
        };
        let (mut r, counters) = relay(limits);
        let a = r.attach(1, 7, QoS::AtLeastOnce).unwrap();
        for id in 0..5 {
            r.publish(7, QoS::AtMostOnce, &msg(id));
        }
        for id in 10..14 {
            r.publish(7, QoS::AtLeastOnce, &msg(id));
        }
        // 3 of 5 QoS 0 and 2 of 4 QoS 1 fit.
        assert_eq!(counters.snapshot().dropped, 4);
        // One QoS 1 delivery in flight at a time: the second waits for the first's acknowledgement.
        let first = ids(&written(&mut r, &a).unwrap());
        assert_eq!(first, vec![(None, 0), (None, 1), (None, 2), (Some(1), 10)]);
        assert!(written(&mut r, &a).unwrap().is_empty());
        r.ack(a.key, 99); // unknown: ignored
        r.ack(a.key, 1);
        assert_eq!(ids(&written(&mut r, &a).unwrap()), vec![(Some(2), 11)]);
        // Written messages free their place in the queue.
        r.publish(7, QoS::AtLeastOnce, &msg(20));
        assert_eq!(counters.snapshot().dropped, 4);
    }

    #[test]
    fn a_byte_bound_holds_whatever_the_count() {
        let limits = RelayLimits {
            max_queued_bytes: 100,
            ..RelayLimits::default()
        };
        let (mut r, counters) = relay(limits);
        let _a = r.attach(1, 7, QoS::AtMostOnce).unwrap();
        let big = Bytes::from(vec![0; 60]);
        r.publish(7, QoS::AtMostOnce, &big);
        r.publish(7, QoS::AtMostOnce, &big);
        assert_eq!(counters.snapshot().dropped, 1);
    }

    #[test]
    fn qos1_in_flight_goes_again_on_the_next_stream_and_qos0_is_discarded() {
        let (mut r, counters) = relay(RelayLimits::default());
        let a = r.attach(1, 7, QoS::AtLeastOnce).unwrap();
        r.publish(7, QoS::AtLeastOnce, &msg(1));
        assert_eq!(ids(&written(&mut r, &a).unwrap()), vec![(Some(1), 1)]);
        r.publish(7, QoS::AtMostOnce, &msg(2));
        r.publish(7, QoS::AtLeastOnce, &msg(3));
        // The stream ends before anything more is written or acknowledged.
        r.detach(a.key, a.token);
        // Away: QoS 1 is queued, QoS 0 is not (and neither counts as dropped).
        r.publish(7, QoS::AtMostOnce, &msg(4));
        r.publish(7, QoS::AtLeastOnce, &msg(5));
        assert_eq!(counters.snapshot().dropped, 0);
        let b = r.attach(1, 7, QoS::AtLeastOnce).unwrap();
        assert_eq!(
            ids(&written(&mut r, &b).unwrap()),
            vec![(Some(1), 1), (Some(2), 3), (Some(3), 5)]
        );
        assert_eq!(r.subscriptions(), 1);
    }

    #[test]
    fn a_newer_stream_takes_over_and_the_older_one_ends() {
        let (mut r, _) = relay(RelayLimits::default());
        let old = r.attach(1, 7, QoS::AtMostOnce).unwrap();
        let new = r.attach(1, 7, QoS::AtLeastOnce).unwrap();
        assert!(written(&mut r, &old).is_none());
        // The old stream's end does not detach the new one.
        r.detach(old.key, old.token);
        r.publish(7, QoS::AtMostOnce, &msg(1));
        assert_eq!(ids(&written(&mut r, &new).unwrap()), vec![(None, 1)]);
    }

    #[test]
    fn a_device_holds_a_bounded_number_of_subscriptions() {
        let limits = RelayLimits {
            max_subscriptions: 2,
            ..RelayLimits::default()
        };
        let (mut r, _) = relay(limits);
        assert!(r.attach(1, 1, QoS::AtMostOnce).is_some());
        assert!(r.attach(1, 2, QoS::AtMostOnce).is_some());
        assert!(r.attach(1, 3, QoS::AtMostOnce).is_none());
        // Again to a channel it holds: fine; another device: its own count.
        assert!(r.attach(1, 2, QoS::AtLeastOnce).is_some());
        assert!(r.attach(2, 3, QoS::AtMostOnce).is_some());
    }
}
