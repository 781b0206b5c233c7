//! The relay's frames, on the same length-prefixed framing as orders ([`transport_core::framing`]): a 4-byte
//! big-endian length, then the body, whose first byte is the type. Relay types start at 0x10, so the first frame
//! of a stream says what the stream is (an order stream starts with an order frame, type 1).
//!
//! | type | frame | direction | body after the type byte |
//! |---:|---|---|---|
//! | 0x10 | [`Frame::Subscribe`] | device → server | `channel u32, qos u8` |
//! | 0x11 | [`Frame::Subscribed`] | server → device | `channel u32, granted u8` (0 or 1; 0x80: refused) |
//! | 0x12 | [`Frame::Publish`] | device → server | `qos u8, channel u32, id u64`, payload |
//! | 0x13 | [`Frame::Accepted`] | server → device | `id u64`: the QoS 1 message is relayed |
//! | 0x14 | [`Frame::Deliver0`] | server → device | payload (QoS 0, never answered) |
//! | 0x15 | [`Frame::Deliver1`] | server → device | `seq u64`, payload (QoS 1, answered with `Ack`) |
//! | 0x16 | [`Frame::Ack`] | device → server | `seq u64` |
//!
//! A payload is at most [`MAX_MESSAGE`] bytes and at least the 8 bytes of a message id; QoS is 0 or 1. Anything
//! else, and bytes left over after a frame's fields, make the frame malformed.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use transport_core::framing::{self, FrameError, LEN_PREFIX};
use transport_core::{Order, QoS};

/// The largest payload a relayed message may carry: what bounds the relay's queues in bytes.
pub const MAX_MESSAGE: usize = transport_core::MAX_PAYLOAD;

const SUBSCRIBE: u8 = 0x10;
const SUBSCRIBED: u8 = 0x11;
const PUBLISH: u8 = 0x12;
const ACCEPTED: u8 = 0x13;
const DELIVER0: u8 = 0x14;
const DELIVER1: u8 = 0x15;
const ACK: u8 = 0x16;
/// The first relay type; lower ones are the order frames of [`framing`].
const FIRST_RELAY_TYPE: u8 = SUBSCRIBE;
const REFUSED: u8 = 0x80;

/// One relay frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Subscribe to `channel` at `qos`: the first frame of a subscription stream.
    Subscribe {
        /// The channel.
        channel: u32,
        /// The QoS asked for.
        qos: QoS,
    },
    /// The answer to a subscription: the QoS granted, or `None` if it is refused.
    Subscribed {
        /// The channel.
        channel: u32,
        /// The QoS granted.
        granted: Option<QoS>,
    },
    /// A message to relay to the channel's subscribers.
    Publish {
        /// How hard to try.
        qos: QoS,
        /// The channel.
        channel: u32,
        /// The message's id, echoed in [`Frame::Accepted`].
        id: u64,
        /// What the subscribers receive.
        payload: Bytes,
    },
    /// The QoS 1 message `id` is relayed (queued for every subscriber).
    Accepted {
        /// The message's id.
        id: u64,
    },
    /// A QoS 0 delivery.
    Deliver0 {
        /// The message.
        payload: Bytes,
    },
    /// A QoS 1 delivery, numbered within its subscription.
    Deliver1 {
        /// Its number, acknowledged with [`Frame::Ack`].
        seq: u64,
        /// The message.
        payload: Bytes,
    },
    /// The subscriber has the QoS 1 delivery `seq`.
    Ack {
        /// The delivery's number.
        seq: u64,
    },
}

/// What the first frame of a stream opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum First {
    /// An order stream: this order, then the answer.
    Order(Order),
    /// A relay stream, opened by this frame (`Subscribe` or `Publish`).
    Relay(Frame),
}

fn qos(byte: u8) -> Result<QoS, FrameError> {
    match byte {
        0 => Ok(QoS::AtMostOnce),
        1 => Ok(QoS::AtLeastOnce),
        other => Err(FrameError::UnknownType(other)),
    }
}

fn need(body: &[u8], n: usize) -> Result<(), FrameError> {
    if body.len() < n {
        Err(FrameError::Truncated)
    } else {
        Ok(())
    }
}

fn message(body: Bytes) -> Result<Bytes, FrameError> {
    if body.len() > MAX_MESSAGE {
        return Err(FrameError::Oversized {
            len: body.len(),
            max: MAX_MESSAGE,
        });
    }
    need(&body, crate::fleet::ID_BYTES)?;
    Ok(body)
}

fn done(rest: &[u8]) -> Result<(), FrameError> {
    if rest.is_empty() {
        Ok(())
    } else {
        Err(FrameError::TrailingBytes(rest.len()))
    }
}

/// Parse a relay frame's body (type byte first, no length prefix). `body` is the frame's own buffer, so payloads
/// are slices of it, not copies.
fn parse(mut body: Bytes) -> Result<Frame, FrameError> {
    need(&body, 1)?;
    let kind = body.get_u8();
    let frame = match kind {
        SUBSCRIBE | SUBSCRIBED => {
            need(&body, 5)?;
            let channel = body.get_u32();
            let q = body.get_u8();
            if kind == SUBSCRIBE {
                Frame::Subscribe {
                    channel,
                    qos: qos(q)?,
                }
            } else {
                let granted = if q == REFUSED { None } else { Some(qos(q)?) };
                Frame::Subscribed { channel, granted }
            }
        }
        PUBLISH => {
            need(&body, 13)?;
            let q = qos(body.get_u8())?;
            let channel = body.get_u32();
            let id = body.get_u64();
            return Ok(Frame::Publish {
                qos: q,
                channel,
                id,
                payload: message(body)?,
            });
        }
        ACCEPTED | ACK => {
            need(&body, 8)?;
            let n = body.get_u64();
            if kind == ACCEPTED {
                Frame::Accepted { id: n }
            } else {
                Frame::Ack { seq: n }
            }
        }
        DELIVER0 => {
            return Ok(Frame::Deliver0 {
                payload: message(body)?,
            })
        }
        DELIVER1 => {
            need(&body, 8)?;
            let seq = body.get_u64();
            return Ok(Frame::Deliver1 {
                seq,
                payload: message(body)?,
            });
        }
        other => return Err(FrameError::UnknownType(other)),
    };
    done(&body)?;
    Ok(frame)
}

/// Take one relay frame from the front of `buf`: `Ok(None)` if it is not complete yet (nothing consumed), an error
/// if it is malformed or oversized, or is an order frame.
pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
    let Some(len) = framing::check(buf)? else {
        return Ok(None);
    };
    let mut frame = buf.split_to(len);
    frame.advance(LEN_PREFIX);
    parse(frame.freeze()).map(Some)
}

/// Take the first frame of a stream from `buf`, an order frame or a relay frame.
pub fn decode_first(buf: &mut BytesMut) -> Result<Option<First>, FrameError> {
    let Some(len) = framing::check(buf)? else {
        return Ok(None);
    };
    match buf.get(LEN_PREFIX) {
        Some(&kind) if kind < FIRST_RELAY_TYPE => {
            let first = match framing::parse_body(&buf[LEN_PREFIX..len])? {
                framing::Frame::Order(order) => First::Order(order),
                // An answer frame cannot open a stream.
                _ => return Err(FrameError::UnknownType(kind)),
            };
            buf.advance(len);
            Ok(Some(first))
        }
        _ => Ok(decode(buf)?.map(First::Relay)),
    }
}

fn header(out: &mut BytesMut, body: usize, kind: u8) {
    out.reserve(LEN_PREFIX + body);
    out.put_u32(body as u32);
    out.put_u8(kind);
}

/// Append a whole frame (length prefix included) to `out`. A payload over [`MAX_MESSAGE`] is encoded but refused by
/// every decoder.
pub fn encode(frame: &Frame, out: &mut BytesMut) {
    match frame {
        Frame::Subscribe { channel, qos } => {
            header(out, 6, SUBSCRIBE);
            out.put_u32(*channel);
            out.put_u8(qos.level());
        }
        Frame::Subscribed { channel, granted } => {
            header(out, 6, SUBSCRIBED);
            out.put_u32(*channel);
            out.put_u8(granted.map_or(REFUSED, QoS::level));
        }
        Frame::Publish {
            qos,
            channel,
            id,
            payload,
        } => encode_publish(*qos, *channel, *id, payload, out),
        Frame::Accepted { id } => encode_number(ACCEPTED, *id, out),
        Frame::Ack { seq } => encode_number(ACK, *seq, out),
        Frame::Deliver0 { payload } => encode_deliver(None, payload, out),
        Frame::Deliver1 { seq, payload } => encode_deliver(Some(*seq), payload, out),
    }
}

/// Append a [`Frame::Publish`] (the hot path: no intermediate frame, the payload written in place).
pub fn encode_publish(qos: QoS, channel: u32, id: u64, payload: &[u8], out: &mut BytesMut) {
    header(out, 14 + payload.len(), PUBLISH);
    out.put_u8(qos.level());
    out.put_u32(channel);
    out.put_u64(id);
    out.put_slice(payload);
}

/// Append a delivery: QoS 1 with its number, QoS 0 without.
pub fn encode_deliver(seq: Option<u64>, payload: &[u8], out: &mut BytesMut) {
    match seq {
        Some(seq) => {
            header(out, 9 + payload.len(), DELIVER1);
            out.put_u64(seq);
        }
        None => header(out, 1 + payload.len(), DELIVER0),
    }
    out.put_slice(payload);
}

/// Append an [`Frame::Accepted`] or [`Frame::Ack`].
fn encode_number(kind: u8, n: u64, out: &mut BytesMut) {
    header(out, 9, kind);
    out.put_u64(n);
}

/// Append an [`Frame::Accepted`].
pub fn encode_accepted(id: u64, out: &mut BytesMut) {
    encode_number(ACCEPTED, id, out);
}

/// Append an [`Frame::Ack`].
pub fn encode_ack(seq: u64, out: &mut BytesMut) {
    encode_number(ACK, seq, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(id: u64, len: usize) -> Bytes {
        let mut b = BytesMut::new();
        b.put_u64(id);
        b.put_bytes(7, len - 8);
        b.freeze()
    }

    fn frames() -> Vec<Frame> {
        vec![
            Frame::Subscribe {
                channel: u32::MAX,
                qos: QoS::AtLeastOnce,
            },
            Frame::Subscribed {
                channel: 3,
                granted: Some(QoS::AtMostOnce),
            },
            Frame::Subscribed {
                channel: 3,
                granted: None,
            },
            Frame::Publish {
                qos: QoS::AtLeastOnce,
                channel: 9,
                id: 42,
                payload: payload(42, 64),
            },
            Frame::Accepted { id: u64::MAX },
            Frame::Deliver0 {
                payload: payload(1, 8),
            },
            Frame::Deliver1 {
                seq: 5,
                payload: payload(2, MAX_MESSAGE),
            },
            Frame::Ack { seq: 0 },
        ]
    }

    #[test]
    fn frames_round_trip_byte_by_byte() {
        let mut wire = BytesMut::new();
        for f in frames() {
            encode(&f, &mut wire);
        }
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for &b in wire.iter() {
            buf.put_u8(b);
            while let Some(f) = decode(&mut buf).unwrap() {
                out.push(f);
            }
        }
        assert_eq!(out, frames());
        assert!(buf.is_empty());
    }

    #[test]
    fn the_first_frame_says_what_a_stream_is() {
        let order = crate::testing::order(3, 1);
        let mut buf = BytesMut::new();
        framing::encode_order(&order, &mut buf);
        assert_eq!(decode_first(&mut buf).unwrap(), Some(First::Order(order)));
        encode(&frames()[0], &mut buf);
        assert_eq!(
            decode_first(&mut buf).unwrap(),
            Some(First::Relay(frames()[0].clone()))
        );
        // An answer cannot open a stream.
        framing::encode_stored(&crate::testing::order(3, 1).id, &mut buf);
        assert!(decode_first(&mut buf).is_err());
    }

    #[test]
    fn malformed_frames_are_refused() {
        let raw = |body: &[u8]| {
            let mut b = BytesMut::new();
            b.put_u32(body.len() as u32);
            b.put_slice(body);
            b
        };
        let bad: Vec<BytesMut> = vec![
            raw(&[]),                            // no type
            raw(&[0x7f]),                        // unknown type
            raw(&[SUBSCRIBE, 0, 0, 0, 1, 2]),    // QoS 2
            raw(&[SUBSCRIBE, 0, 0, 0, 1, 0, 0]), // trailing byte
            raw(&[ACK, 0, 0]),                   // truncated
            raw(&[DELIVER0, 1, 2, 3]),           // a payload without a whole id
            raw(&[PUBLISH, 1, 0, 0, 0, 1]),      // no id
        ];
        for mut b in bad {
            assert!(decode(&mut b).is_err(), "{b:?}");
        }
        let mut huge = BytesMut::new();
        encode_deliver(None, &vec![0; MAX_MESSAGE + 1], &mut huge);
        assert!(matches!(
            decode(&mut huge),
            Err(FrameError::Oversized { .. })
        ));
        // Incomplete is not malformed.
        let mut part = BytesMut::new();
        encode(&frames()[3], &mut part);
        part.truncate(part.len() - 1);
        assert_eq!(decode(&mut part).unwrap(), None);
    }
}
