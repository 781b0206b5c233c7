//! Replaying journal records into the broker state at start: the snapshot's, then the journal's.
//!
//! A record that does not fit the state as it stands (a session numbered twice, a message sent from an empty queue,
//! an acknowledgement for an identifier not in flight) means the files do not describe one history; the restore
//! stops with [`RestoreError::Inconsistent`] rather than serve a state that never was.

use super::session::{Message, Queued, Session};
use super::{Broker, ClientKey, SessionKey};
use crate::broker::journal::{decode, Record, RecordError};
use crate::codec::QoS;
use bytes::Bytes;
use std::collections::HashMap;

/// Why records could not be replayed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    /// A record is damaged (the caller has already cut a torn tail).
    #[error("record at offset {offset}: {error}")]
    Record {
        /// Where it starts.
        offset: usize,
        /// What is wrong with it.
        error: RecordError,
    },
    /// A record does not fit the state the records before it made.
    #[error("record at offset {offset} does not fit: {reason}")]
    Inconsistent {
        /// Where it starts.
        offset: usize,
        /// What does not fit.
        reason: &'static str,
    },
}

/// What a replay restored.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// Records applied.
    pub records: u64,
}

impl Broker {
    /// Apply `bytes`, whole records as [`Broker::snapshot`] and the journal write them, to a broker that has no
    /// connections. Sessions come back detached, their in-flight messages to be sent again when their clients return.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<Restored, RestoreError> {
        let mut by_sid: HashMap<u64, SessionKey> = self
            .sessions
            .iter()
            .enumerate()
            .filter_map(|(k, s)| Some((s.as_ref()?.sid, k as SessionKey)))
            .collect();
        let mut bodies: HashMap<u64, (std::sync::Arc<str>, Bytes)> = HashMap::new();
        let mut restored = Restored::default();
        let mut offset = 0;
        while offset < bytes.len() {
            let (record, used) =
                decode(&bytes[offset..]).map_err(|error| RestoreError::Record { offset, error })?;
            let inconsistent = |reason| RestoreError::Inconsistent { offset, reason };
            let lookup = |by_sid: &HashMap<u64, SessionKey>, sid: u64| {
                by_sid
                    .get(&sid)
                    .copied()
                    .ok_or(inconsistent("no such session"))
            };
            match record {
                Record::Session {
                    sid,
                    verified,
                    client_id,
                } => {
                    let key = ClientKey {
                        verified,
                        id: client_id.into(),
                    };
                    if by_sid.contains_key(&sid) || self.by_client.contains_key(&key) {
                        return Err(inconsistent("session created twice"));
                    }
                    let k = self.insert_session(Session::new(key, false, sid));
                    by_sid.insert(sid, k);
                    self.next_sid = self.next_sid.max(sid + 1);
                }
                Record::End { sid } => {
                    let k = lookup(&by_sid, sid)?;
                    by_sid.remove(&sid);
                    // Replaying must not journal the end again.
                    let journal = std::mem::take(&mut self.journal);
                    self.remove_session(k);
                    self.journal = journal;
                }
                Record::Sub { sid, qos, filter } => {
                    let k = lookup(&by_sid, sid)?;
                    let s = self.session(k);
                    match s.subscriptions.iter().position(|(f, _)| **f == *filter) {
                        Some(i) => s.subscriptions[i].1 = qos,
                        None => s.subscriptions.push((filter.into(), qos)),
                    }
                    self.tree.insert(filter, k, qos);
                }
                Record::Unsub { sid, filter } => {
                    let k = lookup(&by_sid, sid)?;
                    let s = self.session(k);
                    if let Some(i) = s.subscriptions.iter().position(|(f, _)| **f == *filter) {
                        s.subscriptions.swap_remove(i);
                        self.tree.remove(filter, k);
                    }
                }
                Record::Message {
                    mid,
                    topic,
                    payload,
                } => {
                    bodies.insert(mid, (topic.into(), Bytes::copy_from_slice(payload)));
                    self.next_mid = self.next_mid.max(mid + 1);
                }
                Record::Enqueue {
                    sid,
                    mid,
                    qos,
                    retain,
                } => {
                    let k = lookup(&by_sid, sid)?;
                    let (topic, payload) = bodies
                        .get(&mid)
                        .cloned()
                        .ok_or(inconsistent("message body missing"))?;
                    if qos == QoS::AtMostOnce {
                        return Err(inconsistent("QoS 0 message recorded"));
                    }
                    self.session(k).replay_enqueue(Queued {
                        msg: Message {
                            topic,
                            payload,
                            qos,
                        },
                        qos,
                        retain,
                        mid,
                    });
                }
                Record::Send { sid, id } => {
                    let k = lookup(&by_sid, sid)?;
                    if !self.session(k).replay_send(id) {
                        return Err(inconsistent("sent from an empty queue"));
                    }
                }
                Record::Done { sid, id } => {
                    let k = lookup(&by_sid, sid)?;
                    if !self.session(k).replay_done(id) {
                        return Err(inconsistent("finished a message not in flight"));
                    }
                }
                Record::Released { sid, id } => {
                    let k = lookup(&by_sid, sid)?;
                    if !self.session(k).replay_released(id) {
                        return Err(inconsistent("released a message not in flight"));
                    }
                }
                Record::Received { sid, id } => {
                    let k = lookup(&by_sid, sid)?;
                    self.session(k).replay_inbound(id, true);
                }
                Record::Forgotten { sid, id } => {
                    let k = lookup(&by_sid, sid)?;
                    self.session(k).replay_inbound(id, false);
                }
                Record::SnapshotEnd { .. } => {}
            }
            restored.records += 1;
            offset += used;
        }
        Ok(restored)
    }
}
