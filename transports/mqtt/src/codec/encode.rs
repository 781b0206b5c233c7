//! Encoding packets into a buffer.

use super::{
    EncodeError, Packet, PacketId, PacketType, QoS, SubscribeReturnCode, MAX_REMAINING_LENGTH,
};
use super::{PROTOCOL_LEVEL, PROTOCOL_NAME};
use bytes::BufMut;

/// Bytes a length-prefixed string or binary field takes, or an error if it is too long for its prefix.
fn field_len(len: usize, field: &'static str) -> Result<usize, EncodeError> {
    if len > usize::from(u16::MAX) {
        return Err(EncodeError::FieldTooLong(field));
    }
    Ok(2 + len)
}

fn put_field<B: BufMut>(buf: &mut B, data: &[u8]) {
    // Callers have checked the length with `field_len`.
    buf.put_u16(data.len() as u16);
    buf.put_slice(data);
}

fn put_header<B: BufMut>(buf: &mut B, first: u8, remaining: usize) -> Result<(), EncodeError> {
    if remaining > MAX_REMAINING_LENGTH {
        return Err(EncodeError::TooLarge(remaining));
    }
    buf.put_u8(first);
    let mut x = remaining;
    loop {
        let mut b = (x % 128) as u8;
        x /= 128;
        if x > 0 {
            b |= 0x80;
        }
        buf.put_u8(b);
        if x == 0 {
            return Ok(());
        }
    }
}

/// Encode a PUBLISH from borrowed parts, without building a [`Publish`](super::Publish): what a broker does for each
/// delivery of one message to many subscribers.
pub fn encode_publish<B: BufMut>(
    buf: &mut B,
    dup: bool,
    qos: QoS,
    retain: bool,
    topic: &str,
    packet_id: Option<PacketId>,
    payload: &[u8],
) -> Result<(), EncodeError> {
    encode_publish_head(buf, dup, qos, retain, topic, packet_id, payload.len())?;
    buf.put_slice(payload);
    Ok(())
}

/// Encode a PUBLISH up to its payload, for a payload of `payload_len` bytes that the caller writes right after:
/// a client that builds its payload in place (an order's body) needs no second buffer. Nothing is written if an
/// error is returned.
pub fn encode_publish_head<B: BufMut>(
    buf: &mut B,
    dup: bool,
    qos: QoS,
    retain: bool,
    topic: &str,
    packet_id: Option<PacketId>,
    payload_len: usize,
) -> Result<(), EncodeError> {
    if (qos == QoS::AtMostOnce) != packet_id.is_none() {
        return Err(EncodeError::PacketIdMismatch);
    }
    if dup && qos == QoS::AtMostOnce {
        return Err(EncodeError::DupWithQos0);
    }
    let remaining = field_len(topic.len(), "topic name")?
        + if packet_id.is_some() { 2 } else { 0 }
        + payload_len;
    let first =
        (PacketType::Publish as u8) << 4 | u8::from(dup) << 3 | (qos as u8) << 1 | u8::from(retain);
    put_header(buf, first, remaining)?;
    put_field(buf, topic.as_bytes());
    if let Some(id) = packet_id {
        buf.put_u16(id.get());
    }
    Ok(())
}

impl Packet {
    /// Append the packet's encoding to `buf`. Nothing is written if an error is returned.
    pub fn encode<B: BufMut>(&self, buf: &mut B) -> Result<(), EncodeError> {
        let ty = self.packet_type();
        let fixed = (ty as u8) << 4 | ty.fixed_flags().unwrap_or(0);
        match self {
            Packet::Connect(c) => {
                let mut remaining = field_len(PROTOCOL_NAME.len(), "protocol name")? + 1 + 1 + 2;
                remaining += field_len(c.client_id.len(), "client identifier")?;
                let mut flags = u8::from(c.clean_session) << 1;
                if let Some(w) = &c.will {
                    remaining += field_len(w.topic.len(), "will topic")?;
                    remaining += field_len(w.message.len(), "will message")?;
                    flags |= 0b100 | (w.qos as u8) << 3 | u8::from(w.retain) << 5;
                }
                if let Some(u) = &c.username {
                    remaining += field_len(u.len(), "user name")?;
                    flags |= 0b1000_0000;
                }
                if let Some(p) = &c.password {
                    remaining += field_len(p.len(), "password")?;
                    flags |= 0b0100_0000;
                }
                put_header(buf, fixed, remaining)?;
                put_field(buf, PROTOCOL_NAME.as_bytes());
                buf.put_u8(PROTOCOL_LEVEL);
                buf.put_u8(flags);
                buf.put_u16(c.keep_alive);
                put_field(buf, c.client_id.as_bytes());
                if let Some(w) = &c.will {
                    put_field(buf, w.topic.as_bytes());
                    put_field(buf, &w.message);
                }
                if let Some(u) = &c.username {
                    put_field(buf, u.as_bytes());
                }
                if let Some(p) = &c.password {
                    put_field(buf, p);
                }
            }
            Packet::ConnAck(a) => {
                put_header(buf, fixed, 2)?;
                buf.put_u8(u8::from(a.session_present));
                buf.put_u8(a.code as u8);
            }
            Packet::Publish(p) => {
                encode_publish(
                    buf,
                    p.dup,
                    p.qos,
                    p.retain,
                    &p.topic,
                    p.packet_id,
                    &p.payload,
                )?;
            }
            Packet::PubAck(id)
            | Packet::PubRec(id)
            | Packet::PubRel(id)
            | Packet::PubComp(id)
            | Packet::UnsubAck(id) => {
                put_header(buf, fixed, 2)?;
                buf.put_u16(id.get());
            }
            Packet::Subscribe(s) => {
                if s.filters.is_empty() {
                    return Err(EncodeError::NoTopicFilters);
                }
                let mut remaining = 2;
                for (f, _) in &s.filters {
                    remaining += field_len(f.len(), "topic filter")? + 1;
                }
                put_header(buf, fixed, remaining)?;
                buf.put_u16(s.packet_id.get());
                for (f, qos) in &s.filters {
                    put_field(buf, f.as_bytes());
                    buf.put_u8(*qos as u8);
                }
            }
            Packet::SubAck(s) => {
                if s.return_codes.is_empty() {
                    return Err(EncodeError::NoTopicFilters);
                }
                put_header(buf, fixed, 2 + s.return_codes.len())?;
                buf.put_u16(s.packet_id.get());
                for code in &s.return_codes {
                    buf.put_u8(match code {
                        SubscribeReturnCode::Granted(q) => *q as u8,
                        SubscribeReturnCode::Failure => 0x80,
                    });
                }
            }
            Packet::Unsubscribe(u) => {
                if u.filters.is_empty() {
                    return Err(EncodeError::NoTopicFilters);
                }
                let mut remaining = 2;
                for f in &u.filters {
                    remaining += field_len(f.len(), "topic filter")?;
                }
                put_header(buf, fixed, remaining)?;
                buf.put_u16(u.packet_id.get());
                for f in &u.filters {
                    put_field(buf, f.as_bytes());
                }
            }
            Packet::PingReq | Packet::PingResp | Packet::Disconnect => {
                put_header(buf, fixed, 0)?;
            }
        }
        Ok(())
    }
}
