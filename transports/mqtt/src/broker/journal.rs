//! The records that describe persistent sessions, sans-IO: what the broker state appends as it changes a session
//! with CleanSession 0, and what a snapshot of all of them is made of. [`persist`](super::persist) writes them to
//! disk; [`Broker::restore`](super::Broker::restore) replays them.
//!
//! # Framing
//!
//! Each record is `len u32 LE`, `crc32 u32 LE` (CRC-32 IEEE of the body), then `len` bytes of body: a kind byte and
//! its fields, integers little-endian, strings as `u16` length and bytes, payloads as `u32` length and bytes.
//!
//! # Records
//!
//! A session is numbered (`sid`) when it is created; a message is numbered (`mid`) once, however many sessions
//! queue it, and its body is written once, before the first [`Record::Enqueue`] that names it.
//!
//! | kind | record | meaning |
//! |---|---|---|
//! | 1 | `Session { sid, verified, client_id }` | a persistent session is created |
//! | 2 | `End { sid }` | it ends (a clean CONNECT replaced it) |
//! | 3 | `Sub { sid, qos, filter }` | a subscription is added or its QoS replaced |
//! | 4 | `Unsub { sid, filter }` | a subscription is removed |
//! | 5 | `Message { mid, topic, payload }` | an application message's body |
//! | 6 | `Enqueue { sid, mid, qos, retain }` | a QoS 1 or 2 message joins the back of the session's queue |
//! | 7 | `Send { sid, id }` | the front of the queue is sent with packet identifier `id` and awaits its PUBACK or PUBREC |
//! | 8 | `Done { sid, id }` | PUBACK or PUBCOMP: the in-flight message `id` is finished |
//! | 9 | `Released { sid, id }` | PUBREC: the in-flight message `id` now awaits PUBCOMP (its PUBREL is what is re-sent) |
//! | 10 | `Received { sid, id }` | a QoS 2 PUBLISH `id` from the client was taken (PUBREC sent); a copy is not delivered again |
//! | 11 | `Forgotten { sid, id }` | PUBREL `id` from the client: the identifier is free again |
//! | 12 | `SnapshotEnd { records }` | the last record of a snapshot, with the count before it |
//!
//! QoS 0 messages and clean sessions are never recorded: neither outlives its connection.

use crate::codec::{PacketId, QoS};

/// The largest record body accepted when reading: a maximal payload and topic with room to spare.
pub const MAX_RECORD: usize = 300 << 20;
/// Bytes before a record's body.
pub const FRAME_HEADER: usize = 8;

/// One change to the persistent sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record<'a> {
    /// A persistent session is created.
    Session {
        /// Its number.
        sid: u64,
        /// Whether its name is a verified identity.
        verified: bool,
        /// Its client identifier.
        client_id: &'a str,
    },
    /// A session ends.
    End {
        /// Its number.
        sid: u64,
    },
    /// A subscription is added or replaced.
    Sub {
        /// The session.
        sid: u64,
        /// The QoS granted.
        qos: QoS,
        /// The filter.
        filter: &'a str,
    },
    /// A subscription is removed.
    Unsub {
        /// The session.
        sid: u64,
        /// The filter.
        filter: &'a str,
    },
    /// An application message's body.
    Message {
        /// Its number.
        mid: u64,
        /// Its topic.
        topic: &'a str,
        /// Its payload.
        payload: &'a [u8],
    },
    /// A message joins a session's queue.
    Enqueue {
        /// The session.
        sid: u64,
        /// The message.
        mid: u64,
        /// The QoS it is delivered with (1 or 2).
        qos: QoS,
        /// Delivered as a retained message.
        retain: bool,
    },
    /// The front of the queue is sent with this identifier.
    Send {
        /// The session.
        sid: u64,
        /// The packet identifier.
        id: PacketId,
    },
    /// An in-flight message is finished (PUBACK or PUBCOMP).
    Done {
        /// The session.
        sid: u64,
        /// The packet identifier.
        id: PacketId,
    },
    /// An in-flight QoS 2 message was received by the client (PUBREC); it awaits PUBCOMP.
    Released {
        /// The session.
        sid: u64,
        /// The packet identifier.
        id: PacketId,
    },
    /// A QoS 2 PUBLISH from the client was taken.
    Received {
        /// The session.
        sid: u64,
        /// The packet identifier.
        id: PacketId,
    },
    /// The client released a QoS 2 identifier (PUBREL).
    Forgotten {
        /// The session.
        sid: u64,
        /// The packet identifier.
        id: PacketId,
    },
    /// The end of a snapshot.
    SnapshotEnd {
        /// Records before this one.
        records: u64,
    },
}

/// Why records could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The bytes end inside a record.
    #[error("record incomplete")]
    Incomplete,
    /// The length field is zero or larger than [`MAX_RECORD`].
    #[error("record length {0} out of range")]
    Length(usize),
    /// The checksum does not match the body.
    #[error("checksum mismatch")]
    Checksum,
    /// The body does not decode as a record.
    #[error("malformed record: {0}")]
    Malformed(&'static str),
}

/// Append `record`, framed, to `out`.
pub fn encode(out: &mut Vec<u8>, record: &Record<'_>) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER]);
    let put_str = |out: &mut Vec<u8>, s: &str| {
        // Topics, filters and client identifiers come from decoded packets: at most 65,535 bytes.
        out.extend_from_slice(&(s.len() as u16).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    };
    let sid_id = |out: &mut Vec<u8>, kind: u8, sid: u64, id: PacketId| {
        out.push(kind);
        out.extend_from_slice(&sid.to_le_bytes());
        out.extend_from_slice(&id.get().to_le_bytes());
    };
    match *record {
        Record::Session {
            sid,
            verified,
            client_id,
        } => {
            out.push(1);
            out.extend_from_slice(&sid.to_le_bytes());
            out.push(u8::from(verified));
            put_str(out, client_id);
        }
        Record::End { sid } => {
            out.push(2);
            out.extend_from_slice(&sid.to_le_bytes());
        }
        Record::Sub { sid, qos, filter } => {
            out.push(3);
            out.extend_from_slice(&sid.to_le_bytes());
            out.push(qos as u8);
            put_str(out, filter);
        }
        Record::Unsub { sid, filter } => {
            out.push(4);
            out.extend_from_slice(&sid.to_le_bytes());
            put_str(out, filter);
        }
        Record::Message {
            mid,
            topic,
            payload,
        } => {
            out.push(5);
            out.extend_from_slice(&mid.to_le_bytes());
            put_str(out, topic);
            out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            out.extend_from_slice(payload);
        }
        Record::Enqueue {
            sid,
            mid,
            qos,
            retain,
        } => {
            out.push(6);
            out.extend_from_slice(&sid.to_le_bytes());
            out.extend_from_slice(&mid.to_le_bytes());
            out.push(qos as u8);
            out.push(u8::from(retain));
        }
        Record::Send { sid, id } => sid_id(out, 7, sid, id),
        Record::Done { sid, id } => sid_id(out, 8, sid, id),
        Record::Released { sid, id } => sid_id(out, 9, sid, id),
        Record::Received { sid, id } => sid_id(out, 10, sid, id),
        Record::Forgotten { sid, id } => sid_id(out, 11, sid, id),
        Record::SnapshotEnd { records } => {
            out.push(12);
            out.extend_from_slice(&records.to_le_bytes());
        }
    }
    let body_len = out.len() - start - FRAME_HEADER;
    let crc = crc32fast::hash(&out[start + FRAME_HEADER..]);
    out[start..start + 4].copy_from_slice(&(body_len as u32).to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// The record at the start of `bytes` and the bytes it takes.
pub fn decode(bytes: &[u8]) -> Result<(Record<'_>, usize), RecordError> {
    let header = bytes.get(..FRAME_HEADER).ok_or(RecordError::Incomplete)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len == 0 || len > MAX_RECORD {
        return Err(RecordError::Length(len));
    }
    let body = bytes
        .get(FRAME_HEADER..FRAME_HEADER + len)
        .ok_or(RecordError::Incomplete)?;
    if crc32fast::hash(body) != crc {
        return Err(RecordError::Checksum);
    }
    let mut r = Body(body);
    let record = match r.u8()? {
        1 => Record::Session {
            sid: r.u64()?,
            verified: r.flag()?,
            client_id: r.str()?,
        },
        2 => Record::End { sid: r.u64()? },
        3 => Record::Sub {
            sid: r.u64()?,
            qos: r.qos()?,
            filter: r.str()?,
        },
        4 => Record::Unsub {
            sid: r.u64()?,
            filter: r.str()?,
        },
        5 => Record::Message {
            mid: r.u64()?,
            topic: r.str()?,
            payload: {
                let n = r.u32()? as usize;
                r.take(n)?
            },
        },
        6 => Record::Enqueue {
            sid: r.u64()?,
            mid: r.u64()?,
            qos: r.qos()?,
            retain: r.flag()?,
        },
        kind @ 7..=11 => {
            let sid = r.u64()?;
            let id = PacketId::new(r.u16()?).ok_or(RecordError::Malformed("packet id 0"))?;
            match kind {
                7 => Record::Send { sid, id },
                8 => Record::Done { sid, id },
                9 => Record::Released { sid, id },
                10 => Record::Received { sid, id },
                _ => Record::Forgotten { sid, id },
            }
        }
        12 => Record::SnapshotEnd { records: r.u64()? },
        _ => return Err(RecordError::Malformed("unknown kind")),
    };
    if !r.0.is_empty() {
        return Err(RecordError::Malformed("bytes after the last field"));
    }
    Ok((record, FRAME_HEADER + len))
}

struct Body<'a>(&'a [u8]);

impl<'a> Body<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        if self.0.len() < n {
            return Err(RecordError::Malformed("field past the end"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, RecordError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, RecordError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, RecordError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    fn flag(&mut self) -> Result<bool, RecordError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(RecordError::Malformed("flag not 0 or 1")),
        }
    }

    fn qos(&mut self) -> Result<QoS, RecordError> {
        QoS::from_bits(self.u8()?).map_err(|_| RecordError::Malformed("QoS 3"))
    }

    fn str(&mut self) -> Result<&'a str, RecordError> {
        let n = usize::from(self.u16()?);
        std::str::from_utf8(self.take(n)?).map_err(|_| RecordError::Malformed("string not UTF-8"))
    }
}

/// Records appended by the broker state, waiting for the driver to take them; off unless persistence is on.
#[derive(Debug, Default)]
pub struct Journal {
    enabled: bool,
    buf: Vec<u8>,
    records: u64,
}

impl Journal {
    /// A journal that records (`enabled`) or ignores everything.
    pub fn new(enabled: bool) -> Self {
        Journal {
            enabled,
            buf: Vec::new(),
            records: 0,
        }
    }

    /// Whether records are kept.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Append a record (nothing when disabled).
    pub fn push(&mut self, record: Record<'_>) {
        if self.enabled {
            encode(&mut self.buf, &record);
            self.records += 1;
        }
    }

    /// Records appended since the journal was made.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// The records appended since the last call, if any.
    pub fn take(&mut self) -> Option<Vec<u8>> {
        (!self.buf.is_empty()).then(|| std::mem::take(&mut self.buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u16) -> PacketId {
        PacketId::new(n).unwrap()
    }

    #[test]
    fn every_record_round_trips_and_damage_is_detected() {
        let records = [
            Record::Session {
                sid: 1,
                verified: true,
                client_id: "dev-1",
            },
            Record::End { sid: 2 },
            Record::Sub {
                sid: 3,
                qos: QoS::ExactlyOnce,
                filter: "a/+/#",
            },
            Record::Unsub { sid: 4, filter: "" },
            Record::Message {
                mid: 5,
                topic: "t",
                payload: &[0, 1, 2],
            },
            Record::Enqueue {
                sid: 6,
                mid: 7,
                qos: QoS::AtLeastOnce,
                retain: true,
            },
            Record::Send { sid: 8, id: id(9) },
            Record::Done { sid: 8, id: id(10) },
            Record::Released { sid: 8, id: id(11) },
            Record::Received { sid: 8, id: id(12) },
            Record::Forgotten { sid: 8, id: id(13) },
            Record::SnapshotEnd { records: 11 },
        ];
        let mut buf = Vec::new();
        for r in &records {
            encode(&mut buf, r);
        }
        let mut rest = &buf[..];
        for r in &records {
            let (got, used) = decode(rest).unwrap();
            assert_eq!(&got, r);
            rest = &rest[used..];
        }
        assert!(rest.is_empty());
        let first = decode(&buf).unwrap().1;
        for cut in 0..first {
            assert_eq!(
                decode(&buf[..cut]).unwrap_err(),
                RecordError::Incomplete,
                "cut at {cut}"
            );
        }
        let mut flipped = buf.clone();
        flipped[12] ^= 1;
        assert_eq!(decode(&flipped).unwrap_err(), RecordError::Checksum);
        assert_eq!(
            decode(&[0, 0, 0, 0, 0, 0, 0, 0]).unwrap_err(),
            RecordError::Length(0)
        );
    }
}
