//! MQTT 3.1.1 packets, sans-IO: [`check`] a frame, [`Packet::decode`] it, [`Packet::encode`] into a buffer.
//!
//! A frame is checked before it is parsed, as mini-redis does: [`check`] looks only at the fixed header and answers
//! `Ok(None)` while the frame is incomplete (not an error: more bytes will come), an error as soon as the header is
//! impossible (a reserved packet type, flags the specification forbids for that type, a remaining length that does
//! not fit in four bytes or exceeds the configured maximum packet size), and the frame's length once it is whole.
//! [`Packet::decode`] then takes exactly one frame and rejects anything malformed, including bytes left after the
//! last field. [`read_packet`] does both on a connection's buffer.
//!
//! Section numbers in the comments (`[MQTT-x.y.z-n]`) are the normative statements of the OASIS MQTT 3.1.1
//! specification.

mod decode;
mod encode;

pub use decode::{check, read_packet, FrameHeader};
pub use encode::{encode_publish, encode_publish_head};

use bytes::Bytes;
use std::num::NonZeroU16;

/// The protocol name in a 3.1.1 CONNECT.
pub const PROTOCOL_NAME: &str = "MQTT";
/// The protocol level of MQTT 3.1.1.
pub const PROTOCOL_LEVEL: u8 = 4;
/// The largest value the four-byte Remaining Length field can carry (section 2.2.3).
pub const MAX_REMAINING_LENGTH: usize = 268_435_455;
/// The longest fixed header: one byte of type and flags, four of remaining length.
pub const MAX_HEADER_LEN: usize = 5;

/// A packet identifier: never zero [MQTT-2.3.1-1].
pub type PacketId = NonZeroU16;

/// Quality of service of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QoS {
    /// Delivered at most once, never acknowledged.
    AtMostOnce = 0,
    /// Delivered at least once, acknowledged with PUBACK.
    AtLeastOnce = 1,
    /// Delivered exactly once (PUBREC, PUBREL, PUBCOMP).
    ExactlyOnce = 2,
}

impl QoS {
    /// The QoS of a two-bit field; 3 is malformed.
    pub fn from_bits(bits: u8) -> Result<QoS, DecodeError> {
        match bits {
            0 => Ok(QoS::AtMostOnce),
            1 => Ok(QoS::AtLeastOnce),
            2 => Ok(QoS::ExactlyOnce),
            other => Err(DecodeError::InvalidQos(other)),
        }
    }
}

/// The fourteen control packets of MQTT 3.1.1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    /// Client to server: open a session.
    Connect(Connect),
    /// Server to client: the answer to CONNECT.
    ConnAck(ConnAck),
    /// Either way: an application message.
    Publish(Publish),
    /// Acknowledges a QoS 1 PUBLISH.
    PubAck(PacketId),
    /// QoS 2, first answer.
    PubRec(PacketId),
    /// QoS 2, release.
    PubRel(PacketId),
    /// QoS 2, complete.
    PubComp(PacketId),
    /// Client to server: add subscriptions.
    Subscribe(Subscribe),
    /// Server to client: the QoS granted per filter.
    SubAck(SubAck),
    /// Client to server: remove subscriptions.
    Unsubscribe(Unsubscribe),
    /// Acknowledges UNSUBSCRIBE.
    UnsubAck(PacketId),
    /// Client to server: keepalive.
    PingReq,
    /// Server to client: the answer to PINGREQ.
    PingResp,
    /// Client to server: a clean close (the will is discarded).
    Disconnect,
}

/// The packet types as the fixed header numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PacketType {
    /// 1
    Connect = 1,
    /// 2
    ConnAck = 2,
    /// 3
    Publish = 3,
    /// 4
    PubAck = 4,
    /// 5
    PubRec = 5,
    /// 6
    PubRel = 6,
    /// 7
    PubComp = 7,
    /// 8
    Subscribe = 8,
    /// 9
    SubAck = 9,
    /// 10
    Unsubscribe = 10,
    /// 11
    UnsubAck = 11,
    /// 12
    PingReq = 12,
    /// 13
    PingResp = 13,
    /// 14
    Disconnect = 14,
}

impl PacketType {
    /// The type in the high nibble of the first byte; 0 and 15 are reserved.
    pub fn from_nibble(n: u8) -> Result<PacketType, DecodeError> {
        Ok(match n {
            1 => PacketType::Connect,
            2 => PacketType::ConnAck,
            3 => PacketType::Publish,
            4 => PacketType::PubAck,
            5 => PacketType::PubRec,
            6 => PacketType::PubRel,
            7 => PacketType::PubComp,
            8 => PacketType::Subscribe,
            9 => PacketType::SubAck,
            10 => PacketType::Unsubscribe,
            11 => PacketType::UnsubAck,
            12 => PacketType::PingReq,
            13 => PacketType::PingResp,
            14 => PacketType::Disconnect,
            other => return Err(DecodeError::ReservedPacketType(other)),
        })
    }

    /// The flags the specification fixes for this type (section 2.2.2); PUBLISH's are free and checked apart.
    fn fixed_flags(self) -> Option<u8> {
        match self {
            PacketType::Publish => None,
            PacketType::PubRel | PacketType::Subscribe | PacketType::Unsubscribe => Some(0b0010),
            _ => Some(0),
        }
    }
}

/// CONNECT: the first packet a client sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    /// Start a new session (true) or resume the stored one (false).
    pub clean_session: bool,
    /// Seconds; 0 turns the keepalive off.
    pub keep_alive: u16,
    /// The client identifier; may be empty with a clean session.
    pub client_id: String,
    /// Published if the connection closes without DISCONNECT.
    pub will: Option<LastWill>,
    /// User name, if the username flag is set.
    pub username: Option<String>,
    /// Password, if the password flag is set.
    pub password: Option<Bytes>,
}

/// A will message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastWill {
    /// Where it is published.
    pub topic: String,
    /// Its payload.
    pub message: Bytes,
    /// Its QoS.
    pub qos: QoS,
    /// Whether it is retained.
    pub retain: bool,
}

/// CONNACK return codes (section 3.2.2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ConnectReturnCode {
    /// 0: connection accepted.
    Accepted = 0,
    /// 1: the server does not support the protocol level.
    UnacceptableProtocolVersion = 1,
    /// 2: the client identifier is not allowed.
    IdentifierRejected = 2,
    /// 3: the MQTT service is unavailable.
    ServerUnavailable = 3,
    /// 4: malformed user name or password.
    BadUserNameOrPassword = 4,
    /// 5: the client is not authorized to connect.
    NotAuthorized = 5,
}

impl ConnectReturnCode {
    fn from_u8(v: u8) -> Result<Self, DecodeError> {
        Ok(match v {
            0 => Self::Accepted,
            1 => Self::UnacceptableProtocolVersion,
            2 => Self::IdentifierRejected,
            3 => Self::ServerUnavailable,
            4 => Self::BadUserNameOrPassword,
            5 => Self::NotAuthorized,
            other => return Err(DecodeError::InvalidReturnCode(other)),
        })
    }
}

/// CONNACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnAck {
    /// The server had a stored session for this client.
    pub session_present: bool,
    /// Accepted or why not.
    pub code: ConnectReturnCode,
}

/// PUBLISH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    /// A re-delivery of an earlier attempt (QoS 1 and 2 only).
    pub dup: bool,
    /// Its QoS.
    pub qos: QoS,
    /// Retain it for future subscribers (client to server), or it is a retained message (server to client).
    pub retain: bool,
    /// The topic name: no wildcards, not empty.
    pub topic: String,
    /// Present exactly when `qos` is 1 or 2.
    pub packet_id: Option<PacketId>,
    /// The application message.
    pub payload: Bytes,
}

/// SUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    /// Its identifier, echoed in SUBACK.
    pub packet_id: PacketId,
    /// Topic filters with the maximum QoS requested for each; at least one.
    pub filters: Vec<(String, QoS)>,
}

/// One return code of a SUBACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscribeReturnCode {
    /// The subscription is in place with this maximum QoS.
    Granted(QoS),
    /// 0x80: refused.
    Failure,
}

/// SUBACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubAck {
    /// The SUBSCRIBE's identifier.
    pub packet_id: PacketId,
    /// One per filter, in order.
    pub return_codes: Vec<SubscribeReturnCode>,
}

/// UNSUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe {
    /// Its identifier, echoed in UNSUBACK.
    pub packet_id: PacketId,
    /// Topic filters; at least one.
    pub filters: Vec<String>,
}

/// Why a frame was refused. Each is a reason to close the network connection (section 4.8), except
/// [`DecodeError::UnsupportedProtocolLevel`], which a server first answers with CONNACK return code 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The packet type is 0 or 15, both reserved.
    #[error("reserved packet type {0}")]
    ReservedPacketType(u8),
    /// The fixed-header flags are not the ones the specification sets for the type [MQTT-2.2.2-2].
    #[error("invalid flags {flags:#06b} for packet type {packet_type}")]
    InvalidFlags {
        /// The packet type.
        packet_type: u8,
        /// The low nibble of the first byte.
        flags: u8,
    },
    /// The remaining length continues past its fourth byte.
    #[error("malformed remaining length")]
    MalformedRemainingLength,
    /// The whole packet would exceed the configured maximum.
    #[error("packet of {size} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Fixed header plus remaining length.
        size: usize,
        /// The configured maximum.
        max: usize,
    },
    /// [`Packet::decode`] was given fewer bytes than the header announces.
    #[error("frame incomplete: {have} of {need} bytes")]
    Incomplete {
        /// Bytes given.
        have: usize,
        /// Bytes the header announces.
        need: usize,
    },
    /// A field runs past the end of the packet.
    #[error("packet ends inside {0}")]
    Truncated(&'static str),
    /// Bytes are left after the last field.
    #[error("{0} bytes after the last field")]
    TrailingBytes(usize),
    /// A string is not well-formed UTF-8 or contains U+0000 [MQTT-1.5.3-1, MQTT-1.5.3-2].
    #[error("invalid UTF-8 string in {0}")]
    InvalidString(&'static str),
    /// The CONNECT protocol name is not `MQTT` [MQTT-3.1.2-1].
    #[error("protocol name is not MQTT")]
    InvalidProtocolName,
    /// The CONNECT asks for another protocol level than 4 (MQTT 3.1.1); answered with CONNACK 1 [MQTT-3.1.2-2].
    #[error("unsupported protocol level {0}")]
    UnsupportedProtocolLevel(u8),
    /// The CONNECT flags are inconsistent or use the reserved bit [MQTT-3.1.2-3, -11, -13, -15, -22].
    #[error("invalid connect flags {0:#010b}")]
    InvalidConnectFlags(u8),
    /// A QoS field holds 3.
    #[error("invalid QoS {0}")]
    InvalidQos(u8),
    /// A QoS 0 PUBLISH has DUP set [MQTT-3.3.1-2].
    #[error("DUP set on a QoS 0 PUBLISH")]
    DupWithQos0,
    /// A packet identifier is zero [MQTT-2.3.1-1].
    #[error("packet identifier 0")]
    ZeroPacketId,
    /// A topic name is empty or holds a wildcard [MQTT-3.3.2-2, MQTT-4.7.3-1].
    #[error("invalid topic name")]
    InvalidTopicName,
    /// A topic filter misplaces `+` or `#`, or is empty [MQTT-4.7.1-2, MQTT-4.7.1-3, MQTT-4.7.3-1].
    #[error("invalid topic filter")]
    InvalidTopicFilter,
    /// A SUBSCRIBE or UNSUBSCRIBE carries no topic filter [MQTT-3.8.3-3, MQTT-3.10.3-2].
    #[error("no topic filter")]
    NoTopicFilters,
    /// Reserved bits are set (requested QoS byte, CONNACK flags) [MQTT-3.8.3-4].
    #[error("reserved bits set in {0}")]
    ReservedBits(&'static str),
    /// A CONNACK or SUBACK return code is not one the specification defines.
    #[error("invalid return code {0:#04x}")]
    InvalidReturnCode(u8),
}

/// Why a packet could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// A string or binary field is longer than 65,535 bytes.
    #[error("{0} longer than 65535 bytes")]
    FieldTooLong(&'static str),
    /// The packet is longer than the Remaining Length field can say.
    #[error("packet body of {0} bytes exceeds the protocol maximum")]
    TooLarge(usize),
    /// A PUBLISH has a packet identifier with QoS 0, or none with QoS 1 or 2.
    #[error("packet identifier does not match the QoS")]
    PacketIdMismatch,
    /// A QoS 0 PUBLISH with DUP set.
    #[error("DUP set on a QoS 0 PUBLISH")]
    DupWithQos0,
    /// A SUBSCRIBE, UNSUBSCRIBE or SUBACK without entries.
    #[error("no topic filter")]
    NoTopicFilters,
}

impl Packet {
    /// The packet's type.
    pub fn packet_type(&self) -> PacketType {
        match self {
            Packet::Connect(_) => PacketType::Connect,
            Packet::ConnAck(_) => PacketType::ConnAck,
            Packet::Publish(_) => PacketType::Publish,
            Packet::PubAck(_) => PacketType::PubAck,
            Packet::PubRec(_) => PacketType::PubRec,
            Packet::PubRel(_) => PacketType::PubRel,
            Packet::PubComp(_) => PacketType::PubComp,
            Packet::Subscribe(_) => PacketType::Subscribe,
            Packet::SubAck(_) => PacketType::SubAck,
            Packet::Unsubscribe(_) => PacketType::Unsubscribe,
            Packet::UnsubAck(_) => PacketType::UnsubAck,
            Packet::PingReq => PacketType::PingReq,
            Packet::PingResp => PacketType::PingResp,
            Packet::Disconnect => PacketType::Disconnect,
        }
    }
}

#[cfg(test)]
mod tests;
