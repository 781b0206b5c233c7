//! The wire format of Pure sealed links: frames packed into UDP datagrams.
//!
//! A datagram carries one or more frames back to back. Every frame starts with a version byte and a kind byte, and
//! is self-delimiting, so a receiver can walk a datagram without knowing any key. All integers are big-endian.
//!
//! **Record** (sender → receiver), kinds 1-4:
//!
//! ```text
//! version u8 = 1 | kind u8 | sender key id [8] | sender run u64 | seq u64 | variant header | body len u16 | body
//!   kind 1 plain:              variant header empty, body = the order's payload (no tag)
//!   kind 2 hpke-session:       variant header = enc [32] (the session's encapsulated key), body = ciphertext+tag
//!   kind 3 hpke-per-request:   variant header = enc [32] (this record's own encapsulation), body = ciphertext+tag
//!   kind 4 link:               variant header = receiver run u64 (the run the sender knows, 0 = none yet),
//!                              body = ciphertext+tag
//! ```
//!
//! The plaintext of a sealed body is `made_us u64 | payload`; the AEAD's associated data is the frame header
//! (every byte before the body), so a changed sender, run, number or enc does not open.
//!
//! **Answer "stored"** (receiver → sender), kinds 0x81-0x84 (the record kind with the top bit set):
//!
//! ```text
//! version u8 = 1 | kind u8 | sender key id [8] | sender run u64 | seq u64 | receiver run u64 | tag [16] (not for plain)
//! ```
//!
//! The tag is an AEAD tag over the answer's header with an empty plaintext, under the answer key of the wire and the
//! receiver's run (see `docs/pure.md`).

use std::fmt;

/// The only version this implementation speaks.
pub const VERSION: u8 = 1;
/// Length of a sender key id: the first bytes of the sender's X25519 public key.
pub const KEY_ID_LEN: usize = 8;
/// Length of an HPKE X25519 encapsulated key.
pub const ENC_LEN: usize = 32;
/// Length of an AEAD tag.
pub const TAG_LEN: usize = 16;
/// Bytes before the variant header: version, kind, key id, run, seq.
pub const COMMON_LEN: usize = 2 + KEY_ID_LEN + 8 + 8;
/// Length of an answer frame without its tag.
pub const ANSWER_HEADER_LEN: usize = COMMON_LEN + 8;
/// The largest datagram a sender builds (fits any path MTU of 1280 with IPv6 and UDP headers).
pub const MAX_DATAGRAM: usize = 1200;
/// The plaintext prefix of a sealed body: the time the order was made.
pub const MADE_LEN: usize = 8;

/// A sender key id: the first [`KEY_ID_LEN`] bytes of its public key.
pub type KeyId = [u8; KEY_ID_LEN];

/// The key id of a public key.
pub fn key_id(public: &[u8; 32]) -> KeyId {
    let mut id = [0u8; KEY_ID_LEN];
    id.copy_from_slice(&public[..KEY_ID_LEN]);
    id
}

/// How a record is sealed; one per variant.
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

    /// Length of the variant header.
    pub fn variant_len(self) -> usize {
        match self {
            Kind::Plain => 0,
            Kind::HpkeSession | Kind::HpkePerRequest => ENC_LEN,
            Kind::Link => 8,
        }
    }

    /// Whether records and answers of this kind carry a tag.
    pub fn sealed(self) -> bool {
        self != Kind::Plain
    }

    /// Length of a record's header (the associated data).
    pub fn record_header_len(self) -> usize {
        COMMON_LEN + self.variant_len() + 2
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
    /// The kind byte is not a known kind.
    Kind(u8),
    /// A frame of the wrong direction (an answer sent to a receiver, a record sent to a sender).
    Direction,
    /// A body shorter than its fixed fields: the time it was made, and a tag when sealed.
    ShortBody,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated => f.write_str("truncated frame"),
            WireError::Version(v) => write!(f, "unknown version {v}"),
            WireError::Kind(k) => write!(f, "unknown kind {k:#x}"),
            WireError::Direction => f.write_str("frame of the wrong direction"),
            WireError::ShortBody => f.write_str("record body shorter than its fixed fields"),
        }
    }
}

impl std::error::Error for WireError {}

/// A record frame, borrowed from the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// How it is sealed.
    pub kind: Kind,
    /// Who claims to have sent it.
    pub key_id: KeyId,
    /// The sender's run.
    pub run: u64,
    /// The record's number within the run.
    pub seq: u64,
    /// The variant header: enc for HPKE kinds, the receiver run for `Link`, empty for `Plain`.
    pub variant: &'a [u8],
    /// The header bytes, the associated data of the seal.
    pub header: &'a [u8],
    /// Ciphertext and tag (payload for `Plain`).
    pub body: &'a [u8],
}

impl Record<'_> {
    /// The HPKE encapsulated key (HPKE kinds only).
    pub fn enc(&self) -> Option<&[u8; ENC_LEN]> {
        matches!(self.kind, Kind::HpkeSession | Kind::HpkePerRequest)
            .then(|| self.variant.try_into().ok())
            .flatten()
    }

    /// The receiver run the sender sealed for (`Link` only).
    pub fn receiver_run(&self) -> Option<u64> {
        (self.kind == Kind::Link).then(|| be_u64(self.variant))
    }
}

/// An answer frame, borrowed from the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer<'a> {
    /// The kind of the record answered.
    pub kind: Kind,
    /// The sender the answer is for.
    pub key_id: KeyId,
    /// The sender run of the record.
    pub run: u64,
    /// The record's number.
    pub seq: u64,
    /// The receiver's current run.
    pub receiver_run: u64,
    /// The header bytes, authenticated by the tag.
    pub header: &'a [u8],
    /// The tag (empty for `Plain`).
    pub tag: &'a [u8],
}

/// A frame read from a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A record.
    Record(Record<'a>),
    /// An answer.
    Answer(Answer<'a>),
}

fn be_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

/// Walks the frames of a datagram. Stops at the first malformed frame (the rest of the datagram cannot be trusted
/// to be aligned).
pub struct Frames<'a> {
    rest: &'a [u8],
}

/// Iterate over the frames of a datagram.
pub fn frames(datagram: &[u8]) -> Frames<'_> {
    Frames { rest: datagram }
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<Frame<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let r = parse_frame(self.rest);
        match r {
            Ok((frame, used)) => {
                self.rest = &self.rest[used..];
                Some(Ok(frame))
            }
            Err(e) => {
                self.rest = &[];
                Some(Err(e))
            }
        }
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
    let kind = Kind::from_u8(kind_byte & 0x7f).ok_or(WireError::Kind(kind_byte))?;
    let key_id: KeyId = buf[2..10].try_into().expect("8 bytes");
    let run = be_u64(&buf[10..18]);
    let seq = be_u64(&buf[18..26]);
    if answer {
        let len = kind.answer_len();
        if buf.len() < len {
            return Err(WireError::Truncated);
        }
        let answer = Answer {
            kind,
            key_id,
            run,
            seq,
            receiver_run: be_u64(&buf[COMMON_LEN..ANSWER_HEADER_LEN]),
            header: &buf[..ANSWER_HEADER_LEN],
            tag: &buf[ANSWER_HEADER_LEN..len],
        };
        return Ok((Frame::Answer(answer), len));
    }
    let header_len = kind.record_header_len();
    if buf.len() < header_len {
        return Err(WireError::Truncated);
    }
    let variant = &buf[COMMON_LEN..COMMON_LEN + kind.variant_len()];
    let body_len = u16::from_be_bytes([buf[header_len - 2], buf[header_len - 1]]) as usize;
    let end = header_len + body_len;
    if buf.len() < end {
        return Err(WireError::Truncated);
    }
    // Every body starts with the time the order was made; a sealed one ends with a tag.
    let min_body = if kind.sealed() {
        MADE_LEN + TAG_LEN
    } else {
        MADE_LEN
    };
    if body_len < min_body {
        return Err(WireError::ShortBody);
    }
    let record = Record {
        kind,
        key_id,
        run,
        seq,
        variant,
        header: &buf[..header_len],
        body: &buf[header_len..end],
    };
    Ok((Frame::Record(record), end))
}

/// Append a record header to `out`; the caller appends `body_len` bytes of body after it.
/// Returns the header's range in `out` (the associated data).
pub fn put_record_header(
    out: &mut Vec<u8>,
    kind: Kind,
    key_id: &KeyId,
    run: u64,
    seq: u64,
    variant: &[u8],
    body_len: usize,
) -> std::ops::Range<usize> {
    debug_assert_eq!(variant.len(), kind.variant_len());
    debug_assert!(body_len <= u16::MAX as usize);
    let start = out.len();
    out.push(VERSION);
    out.push(kind as u8);
    out.extend_from_slice(key_id);
    out.extend_from_slice(&run.to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(variant);
    out.extend_from_slice(&(body_len as u16).to_be_bytes());
    start..out.len()
}

/// Append an answer header to `out`; the caller appends the tag (sealed kinds). Returns the header's range.
pub fn put_answer_header(
    out: &mut Vec<u8>,
    kind: Kind,
    key_id: &KeyId,
    run: u64,
    seq: u64,
    receiver_run: u64,
) -> std::ops::Range<usize> {
    let start = out.len();
    out.push(VERSION);
    out.push(kind as u8 | 0x80);
    out.extend_from_slice(key_id);
    out.extend_from_slice(&run.to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&receiver_run.to_be_bytes());
    start..out.len()
}

/// The length of a record of `kind` with a payload of `payload_len` bytes.
pub fn record_len(kind: Kind, payload_len: usize) -> usize {
    let body = if kind.sealed() {
        MADE_LEN + payload_len + TAG_LEN
    } else {
        MADE_LEN + payload_len
    };
    kind.record_header_len() + body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_packing() {
        let mut dg = Vec::new();
        for (i, kind) in [Kind::Plain, Kind::HpkeSession, Kind::Link]
            .into_iter()
            .enumerate()
        {
            let variant = vec![i as u8; kind.variant_len()];
            let body_len = record_len(kind, 5) - kind.record_header_len();
            put_record_header(&mut dg, kind, &[9; 8], 7, i as u64, &variant, body_len);
            dg.extend(std::iter::repeat_n(0xab, body_len));
        }
        put_answer_header(&mut dg, Kind::HpkeSession, &[9; 8], 7, 3, 11);
        dg.extend_from_slice(&[0; TAG_LEN]);
        let got: Vec<_> = frames(&dg).collect::<Result<_, _>>().unwrap();
        assert_eq!(got.len(), 4);
        match got[2] {
            Frame::Record(r) => assert_eq!(
                (r.kind, r.seq, r.receiver_run()),
                (Kind::Link, 2, Some(0x0202020202020202))
            ),
            _ => panic!("expected a record"),
        }
        match got[3] {
            Frame::Answer(a) => assert_eq!((a.seq, a.receiver_run, a.tag.len()), (3, 11, TAG_LEN)),
            _ => panic!("expected an answer"),
        }
    }

    #[test]
    fn malformed_frames_are_errors_not_panics() {
        assert_eq!(parse_frame(&[1, 2]).unwrap_err(), WireError::Truncated);
        let mut dg = Vec::new();
        put_record_header(&mut dg, Kind::HpkeSession, &[0; 8], 1, 1, &[0; 32], 100);
        assert_eq!(parse_frame(&dg).unwrap_err(), WireError::Truncated);
        dg[0] = 9;
        assert_eq!(parse_frame(&dg).unwrap_err(), WireError::Version(9));
        dg[0] = 1;
        dg[1] = 0x17;
        assert_eq!(parse_frame(&dg).unwrap_err(), WireError::Kind(0x17));
    }

    #[test]
    fn bodies_shorter_than_their_fixed_fields_are_refused() {
        // Found by fuzzing (pure_wire): a plain record with a body shorter than the time field was accepted, and the
        // receiver's split at the time field panicked.
        for kind in [
            Kind::Plain,
            Kind::HpkeSession,
            Kind::HpkePerRequest,
            Kind::Link,
        ] {
            let min = record_len(kind, 0) - kind.record_header_len();
            for body_len in 0..=min {
                let mut dg = Vec::new();
                let variant = vec![0; kind.variant_len()];
                put_record_header(&mut dg, kind, &[3; 8], 1, 2, &variant, body_len);
                dg.resize(dg.len() + body_len, 0);
                let got = parse_frame(&dg);
                if body_len < min {
                    assert_eq!(
                        got.unwrap_err(),
                        WireError::ShortBody,
                        "{kind:?} body of {body_len}"
                    );
                } else {
                    assert!(got.is_ok(), "{kind:?} body of {body_len}");
                }
            }
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..2000usize {
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
                b[1] = [1, 2, 3, 4, 0x81, 0x82, 0x84][len % 7];
            }
            for f in frames(&b) {
                let _ = f;
            }
        }
    }
}
