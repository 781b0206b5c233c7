//! The wire format of Pure sealed links: frames packed into UDP datagrams.
//!
//! A datagram carries one or more frames back to back. Every frame starts with a version byte and a kind byte, and
//! is self-delimiting, so a receiver can walk a datagram without knowing any key. All integers are big-endian.
//!
//! The kind byte is `answer (bit 7) | op (bits 4-6) | refused (bit 3) | variant (bits 0-2)`. The variant says how the
//! frame is sealed (1 plain, 2 hpke-session, 3 hpke-per-request, 4 link); the op says what it carries; the refused
//! bit is set only on an answer to a subscribe that the receiver refused (as MQTT's SUBACK return code 0x80):
//!
//! | op | frame | direction | answered |
//! |---|---|---|---|
//! | 0 | order | device → receiver | "stored", after the store's commit |
//! | 1 | subscribe | device → receiver | once the subscription is kept |
//! | 2 | publish, QoS 1 | device → receiver | once the relay has queued it for every subscriber |
//! | 3 | publish, QoS 0 | device → receiver | never |
//! | 4 | delivery, QoS 1 | receiver → device | by the device, once it has it |
//! | 5 | delivery, QoS 0 | receiver → device | never |
//!
//! **Record** (every op):
//!
//! ```text
//! version u8 = 1 | kind u8 | key id [8] | run u64 | number u64 | variant header | body len u16 | body
//! ```
//!
//! The key id and run name the device's wire (its key and its sender run), also in deliveries. The number is the
//! order's seq (op 0) or the frame's number in its op's own count (ops 1-5, from 0 per wire). The variant header
//! is, for device → receiver ops: empty (plain), the 32-byte HPKE enc (hpke kinds), the receiver run u64 the
//! device knows (link); for deliveries: the receiver run u64, and for hpke-per-request the enc of the delivery's
//! own setup. The body is the sealed plaintext and its 16-byte tag (no tag for plain); the plaintext starts with
//! the op's fixed fields:
//!
//! ```text
//!   order      made_us u64 | payload
//!   subscribe  receiver run u64 | channel u32 | qos u8 (0 or 1)
//!   publish    receiver run u64 | channel u32 | message id u64 | payload
//!   delivery   channel u32 | message id u64 | payload
//! ```
//!
//! The AEAD's associated data is the frame header (every byte before the body), so a changed kind, op, sender,
//! run, number or variant header does not open.
//!
//! **Answer** (ops 0, 1, 2 receiver → device; op 4 device → receiver), the kind with the top bit set, and for a
//! refused subscribe [`REFUSED`] too:
//!
//! ```text
//! version u8 = 1 | kind u8 | key id [8] | run u64 | number u64 | receiver run u64 | tag [16] (not for plain)
//! ```
//!
//! The tag is an AEAD tag over the answer's header with an empty plaintext (see `docs/pure.md` for its key), so the
//! refused bit is authenticated like every other header byte.
//!
//! **Bundle** (op 6, device → receiver; every kind but hpke-per-request): a record of orders. Its number is the
//! bundle's own and its plaintext is the orders' entries, each taken as an order record of that seq on the bundle's
//! wire would be. One seal covers them all, as a QUIC packet covers its frames:
//!
//! ```text
//! entry = seq u64 | len u16 | made_us u64 | payload      (len: of made_us and payload)
//! ```
//!
//! **Answer bundle** (receiver → device, kind byte `0x80 | 6 << 4 | variant`): "stored" for several of a device's
//! orders in one frame with one tag, numbered in the receiver's own count:
//!
//! ```text
//! version u8 = 1 | kind u8 | key id [8] | run u64 | number u64 | receiver run u64 | count u16 | seq u64 × count | tag [16]
//! ```
//!
//! Its tag is an AEAD tag with an empty plaintext over every byte before it.

use std::fmt;
use transport_core::QoS;

/// The only version this implementation speaks.
pub const VERSION: u8 = 1;
/// Length of a sender key id: the first bytes of the sender's X25519 public key.
pub const KEY_ID_LEN: usize = 8;
/// Length of an HPKE X25519 encapsulated key.
pub const ENC_LEN: usize = 32;
/// Length of an AEAD tag.
pub const TAG_LEN: usize = 16;
/// Bytes before the variant header: version, kind, key id, run, number.
pub const COMMON_LEN: usize = 2 + KEY_ID_LEN + 8 + 8;
/// Length of an answer frame without its tag.
pub const ANSWER_HEADER_LEN: usize = COMMON_LEN + 8;
/// The largest datagram a sender builds (fits any path MTU of 1280 with IPv6 and UDP headers).
pub const MAX_DATAGRAM: usize = 1200;
/// The plaintext prefix of an order: the time the order was made.
pub const MADE_LEN: usize = 8;
/// Bytes of a bundle entry before its plaintext: seq, length.
pub const ENTRY_HEADER_LEN: usize = 8 + 2;
/// Bytes of an answer bundle before its seqs: the answer header and the count.
pub const ANSWER_BUNDLE_HEADER_LEN: usize = ANSWER_HEADER_LEN + 2;
/// Bytes of one seq of an answer bundle.
pub const ANSWER_ENTRY_LEN: usize = 8;

/// The bit of an answer's kind byte that says the record was refused: only on answers to subscribes (the relay keeps
/// no more channels for that device). The variant is the three bits below it.
pub const REFUSED: u8 = 0x08;

/// A sender key id: the first [`KEY_ID_LEN`] bytes of its public key.
pub type KeyId = [u8; KEY_ID_LEN];

/// The key id of a public key.
pub fn key_id(public: &[u8; 32]) -> KeyId {
    let mut id = [0u8; KEY_ID_LEN];
    id.copy_from_slice(&public[..KEY_ID_LEN]);
    id
}

/// How a frame is sealed; one per variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// No sealing: the ceiling.
    Plain = 1,
    /// One HPKE auth-mode session per wire.
    HpkeSession = 2,
    /// A fresh HPKE auth-mode setup for every record.
    HpkePerRequest = 3,
    /// A link secret from the two static keys, keys per (sender run, receiver run).
    Link = 4,
}

/// What a frame carries (see the module doc's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// An order to store.
    Order = 0,
    /// A subscription to a channel.
    Subscribe = 1,
    /// A message to relay, at least once.
    Publish1 = 2,
    /// A message to relay, at most once.
    Publish0 = 3,
    /// A relayed message, at least once.
    Deliver1 = 4,
    /// A relayed message, at most once.
    Deliver0 = 5,
    /// Orders under one seal (see the module doc).
    Bundle = 6,
}

impl Op {
    fn from_bits(b: u8) -> Option<Op> {
        Some(match b {
            0 => Op::Order,
            1 => Op::Subscribe,
            2 => Op::Publish1,
            3 => Op::Publish0,
            4 => Op::Deliver1,
            5 => Op::Deliver0,
            6 => Op::Bundle,
            _ => return None,
        })
    }

    /// Whether frames of this op are answered (a bundle's orders are, in an answer bundle).
    pub fn answered(self) -> bool {
        matches!(
            self,
            Op::Order | Op::Subscribe | Op::Publish1 | Op::Deliver1
        )
    }

    /// Whether the receiver sends frames of this op to a device (deliveries), rather than a device to the receiver.
    pub fn to_device(self) -> bool {
        matches!(self, Op::Deliver1 | Op::Deliver0)
    }

    /// The publish of `qos`.
    pub fn publish(qos: QoS) -> Op {
        match qos {
            QoS::AtLeastOnce => Op::Publish1,
            QoS::AtMostOnce => Op::Publish0,
        }
    }

    /// The delivery of `qos`.
    pub fn deliver(qos: QoS) -> Op {
        match qos {
            QoS::AtLeastOnce => Op::Deliver1,
            QoS::AtMostOnce => Op::Deliver0,
        }
    }

    /// Bytes of fixed fields at the start of the plaintext.
    pub fn fixed_len(self) -> usize {
        match self {
            Op::Order => MADE_LEN,
            Op::Subscribe => 8 + 4 + 1,
            Op::Publish1 | Op::Publish0 => 8 + 4 + 8,
            Op::Deliver1 | Op::Deliver0 => 4 + 8,
            // At least one order.
            Op::Bundle => ENTRY_HEADER_LEN + MADE_LEN,
        }
    }
}

/// The kind byte of a frame.
pub fn kind_byte(kind: Kind, op: Op, answer: bool) -> u8 {
    (if answer { 0x80 } else { 0 }) | (op as u8) << 4 | kind as u8
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Plain,
            2 => Kind::HpkeSession,
            3 => Kind::HpkePerRequest,
            4 => Kind::Link,
            _ => return None,
        })
    }

    /// Length of the variant header of a record of `op`.
    pub fn variant_len(self, op: Op) -> usize {
        if op.to_device() {
            return 8 + if self == Kind::HpkePerRequest {
                ENC_LEN
            } else {
                0
            };
        }
        match self {
            Kind::Plain => 0,
            Kind::HpkeSession | Kind::HpkePerRequest => ENC_LEN,
            Kind::Link => 8,
        }
    }

    /// Whether frames of this kind carry a tag.
    pub fn sealed(self) -> bool {
        self != Kind::Plain
    }

    /// Whether a device of this kind sends its orders in bundles (and is answered in answer bundles): every kind
    /// but hpke-per-request, whose measure is one setup per record.
    pub fn bundles(self) -> bool {
        self != Kind::HpkePerRequest
    }

    fn tag_len(self) -> usize {
        if self.sealed() {
            TAG_LEN
        } else {
            0
        }
    }

    /// The shortest body a record of `op` can have: its fixed fields, and the tag if sealed.
    pub fn min_body_len(self, op: Op) -> usize {
        op.fixed_len() + if self.sealed() { TAG_LEN } else { 0 }
    }

    /// Length of the header (the associated data) of a record of `op`.
    pub fn record_header_len(self, op: Op) -> usize {
        COMMON_LEN + self.variant_len(op) + 2
    }

    /// Length of an answer frame.
    pub fn answer_len(self) -> usize {
        ANSWER_HEADER_LEN + if self.sealed() { TAG_LEN } else { 0 }
    }
}

/// Why a datagram could not be walked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// The frame ends before its header or body does.
    Truncated,
    /// The version byte is not [`VERSION`].
    Version(u8),
    /// The kind byte names no variant, no op, an answer to an op that is never answered, or a refusal of anything but
    /// a subscribe.
    Kind(u8),
    /// A body shorter than its fixed fields (and the tag if sealed).
    ShortBody,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated => f.write_str("truncated frame"),
            WireError::Version(v) => write!(f, "unknown version {v}"),
            WireError::Kind(k) => write!(f, "unknown kind {k:#x}"),
            WireError::ShortBody => f.write_str("body shorter than its fixed fields"),
        }
    }
}

impl std::error::Error for WireError {}

/// A record frame, borrowed from the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// How it is sealed.
    pub kind: Kind,
    /// What it carries.
    pub op: Op,
    /// The device whose wire it is on.
    pub key_id: KeyId,
    /// The device's sender run.
    pub run: u64,
    /// The record's number (an order's seq; the frame's number in its op's count otherwise).
    pub seq: u64,
    /// The variant header (see the module doc).
    pub variant: &'a [u8],
    /// The header bytes, the associated data of the seal.
    pub header: &'a [u8],
    /// Ciphertext and tag (the plaintext for `Plain`).
    pub body: &'a [u8],
}

impl Record<'_> {
    /// The HPKE encapsulated key: of the wire's session or of this record's own setup (HPKE kinds only).
    pub fn enc(&self) -> Option<&[u8; ENC_LEN]> {
        let at = if self.op.to_device() { 8 } else { 0 };
        matches!(self.kind, Kind::HpkeSession | Kind::HpkePerRequest)
            .then(|| self.variant.get(at..at + ENC_LEN)?.try_into().ok())
            .flatten()
    }

    /// The receiver run in the header: the run a `Link` record was sealed for, or the run a delivery is from.
    pub fn receiver_run(&self) -> Option<u64> {
        (self.kind == Kind::Link || self.op.to_device())
            .then(|| {
                self.variant
                    .get(..8)?
                    .try_into()
                    .ok()
                    .map(u64::from_be_bytes)
            })
            .flatten()
    }
}

/// An answer frame, borrowed from the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer<'a> {
    /// The kind of the record answered.
    pub kind: Kind,
    /// The op of the record answered.
    pub op: Op,
    /// The device whose wire it is on.
    pub key_id: KeyId,
    /// The sender run of the record.
    pub run: u64,
    /// The record's number.
    pub seq: u64,
    /// The receiver's run.
    pub receiver_run: u64,
    /// The receiver refused the record ([`REFUSED`]; subscribes only).
    pub refused: bool,
    /// The header bytes, authenticated by the tag.
    pub header: &'a [u8],
    /// The tag (empty for `Plain`).
    pub tag: &'a [u8],
}

/// An answer bundle, borrowed from the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnswerBundle<'a> {
    /// The kind of the orders answered.
    pub kind: Kind,
    /// The device whose wire it is on.
    pub key_id: KeyId,
    /// The sender run of the orders answered.
    pub run: u64,
    /// The bundle's number, in the receiver's count.
    pub number: u64,
    /// The receiver's run.
    pub receiver_run: u64,
    /// The seqs, [`ANSWER_ENTRY_LEN`] bytes each.
    seqs: &'a [u8],
    /// Every byte before the tag, authenticated by it.
    pub header: &'a [u8],
    /// The tag (empty for `Plain`).
    pub tag: &'a [u8],
}

impl AnswerBundle<'_> {
    /// The seqs of the orders stored, in order.
    pub fn seqs(&self) -> impl Iterator<Item = u64> + '_ {
        self.seqs
            .chunks_exact(ANSWER_ENTRY_LEN)
            .map(|e| be_u64(e, 0))
    }

    /// How many orders it answers.
    pub fn len(&self) -> usize {
        self.seqs.len() / ANSWER_ENTRY_LEN
    }

    /// Whether it answers none (never true of a parsed one).
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }
}

/// A frame read from a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A record (a bundle too: op [`Op::Bundle`]).
    Record(Record<'a>),
    /// An answer.
    Answer(Answer<'a>),
    /// An answer bundle.
    AnswerBundle(AnswerBundle<'a>),
}

impl Frame<'_> {
    /// The key id of the device whose wire the frame is on.
    pub fn key_id(&self) -> KeyId {
        match self {
            Frame::Record(r) => r.key_id,
            Frame::Answer(a) => a.key_id,
            Frame::AnswerBundle(b) => b.key_id,
        }
    }
}

/// One order of a bundle's plaintext, borrowed from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The order's seq.
    pub seq: u64,
    /// Its plaintext: `made_us` and the payload.
    pub plain: &'a [u8],
}

/// Walks the orders of a bundle's plaintext; stops at the first malformed one (a plaintext shorter than `made_us`,
/// or one that runs past the end).
pub fn entries(plain: &[u8]) -> Entries<'_> {
    Walk {
        rest: plain,
        item: std::marker::PhantomData,
    }
}

/// The orders of a bundle ([`entries`]).
pub type Entries<'a> = Walk<'a, Entry<'a>>;

fn parse_entry(buf: &[u8]) -> Result<(Entry<'_>, usize), WireError> {
    if buf.len() < ENTRY_HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let len = u16::from_be_bytes([buf[8], buf[9]]) as usize;
    if len < MADE_LEN {
        return Err(WireError::ShortBody);
    }
    let end = ENTRY_HEADER_LEN + len;
    if buf.len() < end {
        return Err(WireError::Truncated);
    }
    let entry = Entry {
        seq: be_u64(buf, 0),
        plain: &buf[ENTRY_HEADER_LEN..end],
    };
    Ok((entry, end))
}

/// Append the entry of order `seq` made at `made_us` with `payload` to a bundle's plaintext.
pub fn put_entry(out: &mut Vec<u8>, seq: u64, made_us: u64, payload: &[u8]) {
    let len = MADE_LEN + payload.len();
    debug_assert!(len <= u16::MAX as usize);
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.extend_from_slice(&made_us.to_be_bytes());
    out.extend_from_slice(payload);
}

/// The length of the bundle entry of an order with `payload_len` bytes of payload.
pub fn entry_len(payload_len: usize) -> usize {
    ENTRY_HEADER_LEN + MADE_LEN + payload_len
}

/// Append the header of an answer bundle of `count` seqs; the caller appends the seqs (8 bytes each, big-endian) and
/// then the tag (sealed kinds). Returns where the header starts.
#[allow(clippy::too_many_arguments)]
pub fn put_answer_bundle_header(
    out: &mut Vec<u8>,
    kind: Kind,
    key_id: &KeyId,
    run: u64,
    number: u64,
    receiver_run: u64,
    count: usize,
) -> usize {
    debug_assert!((1..=u16::MAX as usize).contains(&count));
    let start = out.len();
    put_answer(
        out,
        kind_byte(kind, Op::Bundle, true),
        key_id,
        run,
        number,
        receiver_run,
    );
    out.extend_from_slice(&(count as u16).to_be_bytes());
    start
}

/// The length of an answer bundle of `count` seqs.
pub fn answer_bundle_len(kind: Kind, count: usize) -> usize {
    ANSWER_BUNDLE_HEADER_LEN + count * ANSWER_ENTRY_LEN + kind.tag_len()
}

/// The big-endian u64 at `at` of a buffer whose length the caller has checked.
fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

/// Walks self-delimiting items laid back to back (the frames of a datagram, the orders of a bundle): each parsed
/// from where the last ended; the walk stops at the first malformed one (what follows cannot be trusted to be
/// aligned).
pub struct Walk<'a, T> {
    rest: &'a [u8],
    item: std::marker::PhantomData<T>,
}

/// An item a [`Walk`] reads: parsed from the start of a buffer, with the bytes it used.
pub trait Walked<'a>: Sized {
    /// Parse one item at the start of `buf`.
    fn parse(buf: &'a [u8]) -> Result<(Self, usize), WireError>;
}

impl<'a> Walked<'a> for Frame<'a> {
    fn parse(buf: &'a [u8]) -> Result<(Self, usize), WireError> {
        parse_frame(buf)
    }
}

impl<'a> Walked<'a> for Entry<'a> {
    fn parse(buf: &'a [u8]) -> Result<(Self, usize), WireError> {
        parse_entry(buf)
    }
}

impl<'a, T: Walked<'a>> Iterator for Walk<'a, T> {
    type Item = Result<T, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        match T::parse(self.rest) {
            Ok((item, used)) => {
                self.rest = &self.rest[used..];
                Some(Ok(item))
            }
            Err(e) => {
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

/// The frames of a datagram ([`frames`]).
pub type Frames<'a> = Walk<'a, Frame<'a>>;

/// Iterate over the frames of a datagram.
pub fn frames(datagram: &[u8]) -> Frames<'_> {
    Walk {
        rest: datagram,
        item: std::marker::PhantomData,
    }
}

/// Parse one frame at the start of `buf`; returns it and the bytes it used.
pub fn parse_frame(buf: &[u8]) -> Result<(Frame<'_>, usize), WireError> {
    if buf.len() < COMMON_LEN {
        return Err(WireError::Truncated);
    }
    if buf[0] != VERSION {
        return Err(WireError::Version(buf[0]));
    }
    let kind_byte = buf[1];
    let answer = kind_byte & 0x80 != 0;
    let refused = kind_byte & REFUSED != 0;
    let kind = Kind::from_u8(kind_byte & 0x07).ok_or(WireError::Kind(kind_byte))?;
    let op = Op::from_bits((kind_byte >> 4) & 0x07).ok_or(WireError::Kind(kind_byte))?;
    if refused && !(answer && op == Op::Subscribe) {
        return Err(WireError::Kind(kind_byte));
    }
    if op == Op::Bundle && !kind.bundles() {
        return Err(WireError::Kind(kind_byte));
    }
    let key_id: KeyId = buf[2..10].try_into().expect("8 bytes");
    let run = be_u64(buf, 10);
    let seq = be_u64(buf, 18);
    if answer && op == Op::Bundle {
        return parse_answer_bundle(buf, kind, key_id, run, seq);
    }
    if answer {
        if !op.answered() {
            return Err(WireError::Kind(kind_byte));
        }
        let len = kind.answer_len();
        if buf.len() < len {
            return Err(WireError::Truncated);
        }
        let answer = Answer {
            kind,
            op,
            key_id,
            run,
            seq,
            receiver_run: be_u64(buf, COMMON_LEN),
            refused,
            header: &buf[..ANSWER_HEADER_LEN],
            tag: &buf[ANSWER_HEADER_LEN..len],
        };
        return Ok((Frame::Answer(answer), len));
    }
    let header_len = kind.record_header_len(op);
    if buf.len() < header_len {
        return Err(WireError::Truncated);
    }
    let variant = &buf[COMMON_LEN..COMMON_LEN + kind.variant_len(op)];
    let body_len = u16::from_be_bytes([buf[header_len - 2], buf[header_len - 1]]) as usize;
    if body_len < kind.min_body_len(op) {
        return Err(WireError::ShortBody);
    }
    let end = header_len + body_len;
    if buf.len() < end {
        return Err(WireError::Truncated);
    }
    let record = Record {
        kind,
        op,
        key_id,
        run,
        seq,
        variant,
        header: &buf[..header_len],
        body: &buf[header_len..end],
    };
    Ok((Frame::Record(record), end))
}

fn parse_answer_bundle(
    buf: &[u8],
    kind: Kind,
    key_id: KeyId,
    run: u64,
    number: u64,
) -> Result<(Frame<'_>, usize), WireError> {
    if buf.len() < ANSWER_BUNDLE_HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let count = u16::from_be_bytes([buf[ANSWER_HEADER_LEN], buf[ANSWER_HEADER_LEN + 1]]) as usize;
    if count == 0 {
        return Err(WireError::ShortBody);
    }
    let entries_end = ANSWER_BUNDLE_HEADER_LEN + count * ANSWER_ENTRY_LEN;
    let len = entries_end + kind.tag_len();
    if buf.len() < len {
        return Err(WireError::Truncated);
    }
    let bundle = AnswerBundle {
        kind,
        key_id,
        run,
        number,
        receiver_run: be_u64(buf, COMMON_LEN),
        seqs: &buf[ANSWER_BUNDLE_HEADER_LEN..entries_end],
        header: &buf[..entries_end],
        tag: &buf[entries_end..len],
    };
    Ok((Frame::AnswerBundle(bundle), len))
}

/// Append a record header to `out`; the caller appends `body_len` bytes of body after it.
/// Returns the header's range in `out` (the associated data).
#[allow(clippy::too_many_arguments)]
pub fn put_record_header(
    out: &mut Vec<u8>,
    kind: Kind,
    op: Op,
    key_id: &KeyId,
    run: u64,
    seq: u64,
    variant: &[u8],
    body_len: usize,
) -> std::ops::Range<usize> {
    debug_assert_eq!(variant.len(), kind.variant_len(op));
    debug_assert!(body_len <= u16::MAX as usize);
    let start = out.len();
    out.push(VERSION);
    out.push(kind_byte(kind, op, false));
    out.extend_from_slice(key_id);
    out.extend_from_slice(&run.to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(variant);
    out.extend_from_slice(&(body_len as u16).to_be_bytes());
    start..out.len()
}

/// The header fields of a record, as [`put_record_header`] writes them.
#[derive(Debug, Clone, Copy)]
pub struct Head<'a> {
    /// How it is sealed.
    pub kind: Kind,
    /// What it carries.
    pub op: Op,
    /// The device whose wire it is on.
    pub key_id: &'a KeyId,
    /// The device's sender run.
    pub run: u64,
    /// The record's number.
    pub number: u64,
    /// The variant header.
    pub variant: &'a [u8],
}

impl Head<'_> {
    /// Append the header for a plaintext of `plain_len` bytes (fixed fields and payload); returns its range.
    pub fn put(&self, out: &mut Vec<u8>, plain_len: usize) -> std::ops::Range<usize> {
        let tag = if self.kind.sealed() { TAG_LEN } else { 0 };
        put_record_header(
            out,
            self.kind,
            self.op,
            self.key_id,
            self.run,
            self.number,
            self.variant,
            plain_len + tag,
        )
    }
}

/// Append an answer header to `out`; the caller appends the tag (sealed kinds). Returns the header's range.
pub fn put_answer_header(
    out: &mut Vec<u8>,
    kind: Kind,
    op: Op,
    key_id: &KeyId,
    run: u64,
    seq: u64,
    receiver_run: u64,
) -> std::ops::Range<usize> {
    debug_assert!(op.answered());
    put_answer(
        out,
        kind_byte(kind, op, true),
        key_id,
        run,
        seq,
        receiver_run,
    )
}

/// Append the header of an answer that refuses subscribe `seq` ([`REFUSED`]); the caller appends the tag (sealed
/// kinds). Returns the header's range.
pub fn put_refusal_header(
    out: &mut Vec<u8>,
    kind: Kind,
    key_id: &KeyId,
    run: u64,
    seq: u64,
    receiver_run: u64,
) -> std::ops::Range<usize> {
    let byte = kind_byte(kind, Op::Subscribe, true) | REFUSED;
    put_answer(out, byte, key_id, run, seq, receiver_run)
}

fn put_answer(
    out: &mut Vec<u8>,
    kind_byte: u8,
    key_id: &KeyId,
    run: u64,
    seq: u64,
    receiver_run: u64,
) -> std::ops::Range<usize> {
    let start = out.len();
    out.push(VERSION);
    out.push(kind_byte);
    out.extend_from_slice(key_id);
    out.extend_from_slice(&run.to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&receiver_run.to_be_bytes());
    start..out.len()
}

/// The length of a record of `kind` and `op` whose payload (after the op's fixed fields) is `payload_len` bytes.
pub fn record_len(kind: Kind, op: Op, payload_len: usize) -> usize {
    kind.record_header_len(op) + kind.min_body_len(op) + payload_len
}

/// The largest payload a record of `kind` and `op` can carry in one datagram.
pub fn max_payload(kind: Kind, op: Op) -> usize {
    MAX_DATAGRAM - record_len(kind, op, 0)
}

/// The length of a bundle whose entries take `entries_len` bytes.
pub fn bundle_len(kind: Kind, entries_len: usize) -> usize {
    kind.record_header_len(Op::Bundle) + entries_len + kind.tag_len()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPS: [Op; 6] = [
        Op::Order,
        Op::Subscribe,
        Op::Publish1,
        Op::Publish0,
        Op::Deliver1,
        Op::Deliver0,
    ];
    const KINDS: [Kind; 4] = [
        Kind::Plain,
        Kind::HpkeSession,
        Kind::HpkePerRequest,
        Kind::Link,
    ];

    #[test]
    fn record_round_trip_and_packing() {
        let mut dg = Vec::new();
        for (i, kind) in [Kind::Plain, Kind::HpkeSession, Kind::Link]
            .into_iter()
            .enumerate()
        {
            let variant = vec![i as u8; kind.variant_len(Op::Order)];
            let body_len = record_len(kind, Op::Order, 5) - kind.record_header_len(Op::Order);
            put_record_header(
                &mut dg,
                kind,
                Op::Order,
                &[9; 8],
                7,
                i as u64,
                &variant,
                body_len,
            );
            dg.extend(std::iter::repeat_n(0xab, body_len));
        }
        put_answer_header(&mut dg, Kind::HpkeSession, Op::Order, &[9; 8], 7, 3, 11);
        dg.extend_from_slice(&[0; TAG_LEN]);
        let got: Vec<_> = frames(&dg).collect::<Result<_, _>>().unwrap();
        assert_eq!(got.len(), 4);
        match got[2] {
            Frame::Record(r) => assert_eq!(
                (r.kind, r.op, r.seq, r.receiver_run()),
                (Kind::Link, Op::Order, 2, Some(0x0202020202020202))
            ),
            _ => panic!("expected a record"),
        }
        match got[3] {
            Frame::Answer(a) => assert_eq!((a.seq, a.receiver_run, a.tag.len()), (3, 11, TAG_LEN)),
            _ => panic!("expected an answer"),
        }
    }

    #[test]
    fn every_op_of_every_kind_round_trips() {
        for kind in KINDS {
            for op in OPS {
                let mut variant = vec![0u8; kind.variant_len(op)];
                for (i, b) in variant.iter_mut().enumerate() {
                    *b = i as u8 + 1;
                }
                let len = record_len(kind, op, 3);
                let mut dg = Vec::new();
                let header = put_record_header(
                    &mut dg,
                    kind,
                    op,
                    &[5; 8],
                    6,
                    7,
                    &variant,
                    len - kind.record_header_len(op),
                );
                assert_eq!(header.len(), kind.record_header_len(op));
                dg.resize(len, 0xcd);
                if op.answered() {
                    put_answer_header(&mut dg, kind, op, &[5; 8], 6, 7, 8);
                    dg.resize(len + kind.answer_len(), 0);
                }
                let got: Vec<_> = frames(&dg).collect::<Result<_, _>>().unwrap();
                let Frame::Record(r) = got[0] else {
                    panic!("{kind:?} {op:?}: a record")
                };
                assert_eq!((r.kind, r.op, r.run, r.seq), (kind, op, 6, 7));
                assert_eq!(r.body.len(), len - header.len());
                let hpke = matches!(kind, Kind::HpkeSession | Kind::HpkePerRequest);
                let enc_here = hpke && !(op.to_device() && kind == Kind::HpkeSession);
                assert_eq!(r.enc().is_some(), enc_here, "{kind:?} {op:?}");
                let rrun_here = kind == Kind::Link || op.to_device();
                assert_eq!(r.receiver_run().is_some(), rrun_here, "{kind:?} {op:?}");
                assert_eq!(got.len(), if op.answered() { 2 } else { 1 });
                if let Some(Frame::Answer(a)) = got.get(1) {
                    assert_eq!((a.op, a.receiver_run), (op, 8));
                }
            }
        }
    }

    #[test]
    fn answers_to_unanswered_ops_and_unknown_ops_are_unknown_kinds() {
        for op in [Op::Publish0, Op::Deliver0] {
            let mut dg = vec![0u8; ANSWER_HEADER_LEN + TAG_LEN];
            dg[0] = VERSION;
            dg[1] = kind_byte(Kind::Link, op, true);
            assert_eq!(parse_frame(&dg).unwrap_err(), WireError::Kind(dg[1]));
        }
        // Op 7, no variant 0 or 5, and the bundles of hpke-per-request.
        for byte in [0x74, 0xf4, 0x05, 0x10, 0x8f, 0x63, 0xe3] {
            let mut dg = vec![0u8; 200];
            dg[0] = VERSION;
            dg[1] = byte;
            assert_eq!(parse_frame(&dg).unwrap_err(), WireError::Kind(byte));
        }
    }

    #[test]
    fn only_an_answer_to_a_subscribe_can_be_a_refusal() {
        for kind in KINDS {
            let mut dg = Vec::new();
            let header = put_refusal_header(&mut dg, kind, &[3; 8], 4, 5, 6);
            assert_eq!(dg[1], 0x98 | kind as u8);
            dg.resize(kind.answer_len(), 0xee);
            let (Frame::Answer(a), used) = parse_frame(&dg).unwrap() else {
                panic!("{kind:?}: an answer")
            };
            assert_eq!(used, kind.answer_len(), "as long as any answer");
            assert_eq!(
                (a.op, a.refused, a.seq, a.receiver_run, a.header),
                (Op::Subscribe, true, 5, 6, &dg[header])
            );
            let mut kept = Vec::new();
            put_answer_header(&mut kept, kind, Op::Subscribe, &[3; 8], 4, 5, 6);
            kept.resize(kind.answer_len(), 0xee);
            let (Frame::Answer(a), _) = parse_frame(&kept).unwrap() else {
                panic!("{kind:?}: an answer")
            };
            assert!(!a.refused);
            // The bit on any other answer, or on a record, names no kind.
            for op in OPS {
                for answer in [false, true] {
                    if answer && op == Op::Subscribe {
                        continue;
                    }
                    let mut dg = vec![0u8; 200];
                    dg[0] = VERSION;
                    dg[1] = kind_byte(kind, op, answer) | REFUSED;
                    assert_eq!(parse_frame(&dg).unwrap_err(), WireError::Kind(dg[1]));
                }
            }
        }
    }

    #[test]
    fn malformed_frames_are_errors_not_panics() {
        assert_eq!(parse_frame(&[1, 2]).unwrap_err(), WireError::Truncated);
        let mut dg = Vec::new();
        put_record_header(
            &mut dg,
            Kind::HpkeSession,
            Op::Order,
            &[0; 8],
            1,
            1,
            &[0; 32],
            100,
        );
        assert_eq!(parse_frame(&dg).unwrap_err(), WireError::Truncated);
        dg[0] = 9;
        assert_eq!(parse_frame(&dg).unwrap_err(), WireError::Version(9));
        dg[0] = 1;
        dg[1] = 0x07;
        assert_eq!(parse_frame(&dg).unwrap_err(), WireError::Kind(0x07));
        // A body one byte shorter than its op's fixed fields (and tag), for every kind and op.
        for kind in KINDS {
            for op in OPS {
                let mut dg = Vec::new();
                let variant = vec![0; kind.variant_len(op)];
                let short = kind.min_body_len(op) - 1;
                put_record_header(&mut dg, kind, op, &[0; 8], 1, 1, &variant, short);
                dg.resize(dg.len() + short, 0);
                assert_eq!(
                    parse_frame(&dg).unwrap_err(),
                    WireError::ShortBody,
                    "{kind:?} {op:?}"
                );
            }
        }
    }

    #[test]
    fn a_bundle_carries_its_orders_and_an_answer_bundle_their_seqs() {
        for kind in [Kind::Plain, Kind::HpkeSession, Kind::Link] {
            let mut plain = Vec::new();
            for seq in 5..8u64 {
                put_entry(&mut plain, seq, 100 + seq, &vec![seq as u8; seq as usize]);
            }
            assert_eq!(
                plain.len(),
                (5..8).map(|n| entry_len(n as usize)).sum::<usize>()
            );
            let mut dg = Vec::new();
            let variant = vec![3u8; kind.variant_len(Op::Bundle)];
            let body = plain.len() + kind.tag_len();
            put_record_header(&mut dg, kind, Op::Bundle, &[9; 8], 7, 42, &variant, body);
            dg.extend_from_slice(&plain);
            dg.resize(dg.len() + kind.tag_len(), 0);
            assert_eq!(dg.len(), bundle_len(kind, plain.len()));
            let start = dg.len();
            put_answer_bundle_header(&mut dg, kind, &[9; 8], 7, 1 << 40, 11, 3);
            for seq in 5..8u64 {
                dg.extend_from_slice(&seq.to_be_bytes());
            }
            dg.resize(dg.len() + kind.tag_len(), 0);
            assert_eq!(dg.len() - start, answer_bundle_len(kind, 3));
            let got: Vec<_> = frames(&dg).collect::<Result<_, _>>().unwrap();
            let Frame::Record(r) = got[0] else {
                panic!("{kind:?}: a bundle")
            };
            assert_eq!((r.op, r.seq, r.run), (Op::Bundle, 42, 7));
            let orders: Vec<_> = entries(&r.body[..plain.len()])
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(orders.len(), 3);
            assert_eq!((orders[2].seq, orders[2].plain.len()), (7, MADE_LEN + 7));
            assert_eq!(&orders[0].plain[..MADE_LEN], &105u64.to_be_bytes());
            let Frame::AnswerBundle(b) = got[1] else {
                panic!("{kind:?}: an answer bundle")
            };
            assert_eq!((b.number, b.receiver_run, b.len()), (1 << 40, 11, 3));
            assert_eq!(b.seqs().collect::<Vec<_>>(), [5, 6, 7]);
            assert_eq!(
                b.header,
                &dg[start..start + answer_bundle_len(Kind::Plain, 3)]
            );
            assert_eq!(b.tag.len(), kind.tag_len());
        }
    }

    #[test]
    fn malformed_bundles_and_answer_bundles_are_errors() {
        // hpke-per-request never bundles: its bundle and answer bundle are unknown kinds.
        for answer in [false, true] {
            let mut dg = vec![0u8; 200];
            dg[0] = VERSION;
            dg[1] = kind_byte(Kind::HpkePerRequest, Op::Bundle, answer);
            assert_eq!(parse_frame(&dg).unwrap_err(), WireError::Kind(dg[1]));
        }
        // An answer bundle of no seq, and one whose count runs past the datagram.
        let mut dg = Vec::new();
        put_answer_bundle_header(&mut dg, Kind::Link, &[1; 8], 2, 3, 4, 1);
        dg[ANSWER_HEADER_LEN..ANSWER_BUNDLE_HEADER_LEN].copy_from_slice(&0u16.to_be_bytes());
        dg.resize(dg.len() + 8 + TAG_LEN, 0);
        assert_eq!(parse_frame(&dg).unwrap_err(), WireError::ShortBody);
        dg[ANSWER_HEADER_LEN..ANSWER_BUNDLE_HEADER_LEN].copy_from_slice(&2u16.to_be_bytes());
        assert_eq!(parse_frame(&dg).unwrap_err(), WireError::Truncated);
        // A bundle whose body cannot hold one order and its tag.
        let mut dg = Vec::new();
        let short = Kind::Link.min_body_len(Op::Bundle) - 1;
        put_record_header(
            &mut dg,
            Kind::Link,
            Op::Bundle,
            &[1; 8],
            2,
            3,
            &[0; 8],
            short,
        );
        dg.resize(dg.len() + short, 0);
        assert_eq!(parse_frame(&dg).unwrap_err(), WireError::ShortBody);
        // Orders cut anywhere, or claiming less than made_us: the walk ends at an error, after the whole ones.
        let mut plain = Vec::new();
        put_entry(&mut plain, 1, 2, &[3; 4]);
        put_entry(&mut plain, 2, 3, &[4; 4]);
        let one = entry_len(4);
        for cut in 1..plain.len() {
            let walked: Vec<_> = entries(&plain[..cut]).collect();
            let whole = cut / one;
            assert_eq!(
                walked.len(),
                whole + usize::from(cut % one != 0),
                "cut at {cut}"
            );
            assert!(walked[..whole].iter().all(Result::is_ok));
            if cut % one != 0 {
                assert!(walked[whole].is_err(), "cut at {cut}");
            }
        }
        let mut claims_less = plain.clone();
        claims_less[8..10].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(
            entries(&claims_less).next(),
            Some(Err(WireError::ShortBody))
        );
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let kinds: Vec<u8> = KINDS
            .iter()
            .flat_map(|&k| {
                OPS.iter().chain(&[Op::Bundle]).flat_map(move |&o| {
                    [
                        kind_byte(k, o, false),
                        kind_byte(k, o, true),
                        kind_byte(k, o, true) | REFUSED,
                    ]
                })
            })
            .collect();
        for len in 0..4000usize {
            let buf: Vec<u8> = (0..len % 300)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let mut b = buf.clone();
            if b.len() > 2 {
                b[0] = VERSION;
                b[1] = kinds[len % kinds.len()];
            }
            for f in frames(&b) {
                if let Ok(Frame::Record(r)) = f {
                    if r.op == Op::Bundle {
                        entries(r.body).for_each(drop);
                    }
                }
            }
            entries(&buf).for_each(drop);
        }
    }
}
