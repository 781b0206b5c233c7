//! Checking and decoding frames.

use super::{
    ConnAck, Connect, ConnectReturnCode, DecodeError, LastWill, Packet, PacketId, PacketType,
    Publish, QoS, SubAck, Subscribe, SubscribeReturnCode, Unsubscribe, MAX_HEADER_LEN,
    PROTOCOL_LEVEL, PROTOCOL_NAME,
};
use crate::topic;
use bytes::{Buf, Bytes, BytesMut};

/// The fixed header of a frame whose length is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The packet type.
    pub packet_type: PacketType,
    /// The low nibble of the first byte.
    pub flags: u8,
    /// Bytes of fixed header (2 to 5).
    pub header_len: usize,
    /// The Remaining Length: bytes after the fixed header.
    pub remaining_len: usize,
}

impl FrameHeader {
    /// The whole frame's length.
    pub fn frame_len(&self) -> usize {
        self.header_len + self.remaining_len
    }
}

/// Look at the start of `buf`: `Ok(None)` while the frame is incomplete, its header once it is whole, an error as soon
/// as the bytes present prove the frame invalid or larger than `max_packet_size` (header included).
///
/// The first byte is judged alone, so a stream of garbage is refused after one byte; an oversized frame is refused
/// when its length is known, before its body is awaited.
pub fn check(buf: &[u8], max_packet_size: usize) -> Result<Option<FrameHeader>, DecodeError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    let (packet_type, flags) = first_byte(first)?;
    let mut remaining_len = 0usize;
    let mut i = 1;
    loop {
        if i == MAX_HEADER_LEN {
            return Err(DecodeError::MalformedRemainingLength);
        }
        let Some(&b) = buf.get(i) else {
            return Ok(None);
        };
        remaining_len |= usize::from(b & 0x7f) << (7 * (i - 1));
        i += 1;
        if b & 0x80 == 0 {
            break;
        }
    }
    let header = FrameHeader {
        packet_type,
        flags,
        header_len: i,
        remaining_len,
    };
    let size = header.frame_len();
    if size > max_packet_size {
        return Err(DecodeError::TooLarge {
            size,
            max: max_packet_size,
        });
    }
    if buf.len() < size {
        return Ok(None);
    }
    Ok(Some(header))
}

/// Take one whole packet off the front of `buf`, if there is one: `Ok(None)` means wait for more bytes. On an error
/// the connection must be closed; what is left in `buf` is then meaningless.
pub fn read_packet(
    buf: &mut BytesMut,
    max_packet_size: usize,
) -> Result<Option<Packet>, DecodeError> {
    match check(buf, max_packet_size)? {
        None => Ok(None),
        Some(header) => {
            let frame = buf.split_to(header.frame_len()).freeze();
            decode_body(header, frame.slice(header.header_len..)).map(Some)
        }
    }
}

/// Validate the first byte: the type and the flags the specification fixes for it.
fn first_byte(b: u8) -> Result<(PacketType, u8), DecodeError> {
    let packet_type = PacketType::from_nibble(b >> 4)?;
    let flags = b & 0x0f;
    match packet_type.fixed_flags() {
        Some(fixed) if fixed != flags => Err(DecodeError::InvalidFlags {
            packet_type: packet_type as u8,
            flags,
        }),
        Some(_) => Ok((packet_type, flags)),
        None => {
            // PUBLISH: DUP (bit 3), QoS (bits 2-1), RETAIN (bit 0).
            let qos = QoS::from_bits((flags >> 1) & 0b11)?;
            if qos == QoS::AtMostOnce && flags & 0b1000 != 0 {
                return Err(DecodeError::DupWithQos0);
            }
            Ok((packet_type, flags))
        }
    }
}

impl Packet {
    /// Decode exactly one frame: the header must announce exactly `frame.len()` bytes, no more, no fewer. The
    /// header's own size limit is not applied here ([`check`] applies it before the frame is read).
    pub fn decode(frame: Bytes) -> Result<Packet, DecodeError> {
        let header = match check(&frame, usize::MAX)? {
            Some(h) => h,
            None => {
                // Either the header itself is cut short or the body is.
                let need = check_len_hint(&frame);
                return Err(DecodeError::Incomplete {
                    have: frame.len(),
                    need,
                });
            }
        };
        if frame.len() > header.frame_len() {
            return Err(DecodeError::TrailingBytes(frame.len() - header.frame_len()));
        }
        decode_body(header, frame.slice(header.header_len..))
    }
}

/// The length an incomplete frame announces, as far as it can be read (for the error message only).
fn check_len_hint(frame: &[u8]) -> usize {
    let mut len = 0usize;
    for (i, &b) in frame.iter().enumerate().skip(1).take(4) {
        len |= usize::from(b & 0x7f) << (7 * (i - 1));
        if b & 0x80 == 0 {
            return len + i + 1;
        }
    }
    frame.len() + 1
}

/// A cursor over a packet body that refuses to run past its end.
struct Reader {
    buf: Bytes,
}

impl Reader {
    fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        if self.buf.is_empty() {
            return Err(DecodeError::Truncated(field));
        }
        Ok(self.buf.get_u8())
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        if self.buf.len() < 2 {
            return Err(DecodeError::Truncated(field));
        }
        Ok(self.buf.get_u16())
    }

    fn packet_id(&mut self) -> Result<PacketId, DecodeError> {
        PacketId::new(self.u16("packet identifier")?).ok_or(DecodeError::ZeroPacketId)
    }

    fn binary(&mut self, field: &'static str) -> Result<Bytes, DecodeError> {
        let len = usize::from(self.u16(field)?);
        if self.buf.len() < len {
            return Err(DecodeError::Truncated(field));
        }
        Ok(self.buf.split_to(len))
    }

    /// A UTF-8 encoded string (section 1.5.3): well-formed, without U+0000.
    fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let raw = self.binary(field)?;
        let s = std::str::from_utf8(&raw).map_err(|_| DecodeError::InvalidString(field))?;
        if s.contains('\0') {
            return Err(DecodeError::InvalidString(field));
        }
        Ok(s.to_owned())
    }

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.buf)
    }

    fn finish(self) -> Result<(), DecodeError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }
}

fn decode_body(header: FrameHeader, body: Bytes) -> Result<Packet, DecodeError> {
    let mut r = Reader { buf: body };
    let packet = match header.packet_type {
        PacketType::Connect => Packet::Connect(connect(&mut r)?),
        PacketType::ConnAck => {
            let flags = r.u8("connack flags")?;
            if flags & 0xfe != 0 {
                return Err(DecodeError::ReservedBits("connack flags"));
            }
            let code = ConnectReturnCode::from_u8(r.u8("connack return code")?)?;
            Packet::ConnAck(ConnAck {
                session_present: flags & 1 == 1,
                code,
            })
        }
        PacketType::Publish => {
            let flags = header.flags;
            let qos = QoS::from_bits((flags >> 1) & 0b11)?;
            let topic = r.string("topic name")?;
            if !topic::valid_name(&topic) {
                return Err(DecodeError::InvalidTopicName);
            }
            let packet_id = if qos == QoS::AtMostOnce {
                None
            } else {
                Some(r.packet_id()?)
            };
            Packet::Publish(Publish {
                dup: flags & 0b1000 != 0,
                qos,
                retain: flags & 1 == 1,
                topic,
                packet_id,
                payload: r.rest(),
            })
        }
        PacketType::PubAck => Packet::PubAck(r.packet_id()?),
        PacketType::PubRec => Packet::PubRec(r.packet_id()?),
        PacketType::PubRel => Packet::PubRel(r.packet_id()?),
        PacketType::PubComp => Packet::PubComp(r.packet_id()?),
        PacketType::UnsubAck => Packet::UnsubAck(r.packet_id()?),
        PacketType::Subscribe => {
            let packet_id = r.packet_id()?;
            let mut filters = Vec::new();
            while !r.is_empty() {
                let filter = topic_filter(&mut r)?;
                let requested = r.u8("requested QoS")?;
                if requested & 0xfc != 0 {
                    return Err(DecodeError::ReservedBits("requested QoS"));
                }
                filters.push((filter, QoS::from_bits(requested)?));
            }
            if filters.is_empty() {
                return Err(DecodeError::NoTopicFilters);
            }
            Packet::Subscribe(Subscribe { packet_id, filters })
        }
        PacketType::SubAck => {
            let packet_id = r.packet_id()?;
            let mut return_codes = Vec::new();
            while !r.is_empty() {
                return_codes.push(match r.u8("return code")? {
                    0x80 => SubscribeReturnCode::Failure,
                    code @ 0..=2 => SubscribeReturnCode::Granted(QoS::from_bits(code)?),
                    other => return Err(DecodeError::InvalidReturnCode(other)),
                });
            }
            if return_codes.is_empty() {
                return Err(DecodeError::Truncated("return codes"));
            }
            Packet::SubAck(SubAck {
                packet_id,
                return_codes,
            })
        }
        PacketType::Unsubscribe => {
            let packet_id = r.packet_id()?;
            let mut filters = Vec::new();
            while !r.is_empty() {
                filters.push(topic_filter(&mut r)?);
            }
            if filters.is_empty() {
                return Err(DecodeError::NoTopicFilters);
            }
            Packet::Unsubscribe(Unsubscribe { packet_id, filters })
        }
        PacketType::PingReq => Packet::PingReq,
        PacketType::PingResp => Packet::PingResp,
        PacketType::Disconnect => Packet::Disconnect,
    };
    r.finish()?;
    Ok(packet)
}

/// A topic filter of SUBSCRIBE or UNSUBSCRIBE, checked for valid wildcards.
fn topic_filter(r: &mut Reader) -> Result<String, DecodeError> {
    let filter = r.string("topic filter")?;
    if !topic::valid_filter(&filter) {
        return Err(DecodeError::InvalidTopicFilter);
    }
    Ok(filter)
}

fn connect(r: &mut Reader) -> Result<Connect, DecodeError> {
    let name = r.binary("protocol name")?;
    let level = r.u8("protocol level")?;
    if name.as_ref() != PROTOCOL_NAME.as_bytes() {
        // MQTT 3.1 ("MQIsdp", level 3) is answered with return code 1, as a 3.1.1 server should for an older client.
        if name.as_ref() == b"MQIsdp" {
            return Err(DecodeError::UnsupportedProtocolLevel(level));
        }
        return Err(DecodeError::InvalidProtocolName);
    }
    if level != PROTOCOL_LEVEL {
        return Err(DecodeError::UnsupportedProtocolLevel(level));
    }
    let flags = r.u8("connect flags")?;
    let reserved = flags & 0b0000_0001 != 0;
    let clean_session = flags & 0b0000_0010 != 0;
    let will_flag = flags & 0b0000_0100 != 0;
    let will_qos_bits = (flags >> 3) & 0b11;
    let will_retain = flags & 0b0010_0000 != 0;
    let password_flag = flags & 0b0100_0000 != 0;
    let username_flag = flags & 0b1000_0000 != 0;
    let inconsistent_will = !will_flag && (will_qos_bits != 0 || will_retain);
    if reserved || inconsistent_will || (password_flag && !username_flag) || will_qos_bits == 3 {
        return Err(DecodeError::InvalidConnectFlags(flags));
    }
    let keep_alive = r.u16("keep alive")?;
    let client_id = r.string("client identifier")?;
    let will = if will_flag {
        let topic = r.string("will topic")?;
        if !topic::valid_name(&topic) {
            return Err(DecodeError::InvalidTopicName);
        }
        let message = r.binary("will message")?;
        Some(LastWill {
            topic,
            message,
            qos: QoS::from_bits(will_qos_bits)?,
            retain: will_retain,
        })
    } else {
        None
    };
    let username = if username_flag {
        Some(r.string("user name")?)
    } else {
        None
    };
    let password = if password_flag {
        Some(r.binary("password")?)
    } else {
        None
    };
    Ok(Connect {
        clean_session,
        keep_alive,
        client_id,
        will,
        username,
        password,
    })
}
