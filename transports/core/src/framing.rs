//! Orders and answers over any byte stream (a QUIC stream, TLS over TCP), written once for every stream transport.
//!
//! A frame is a 4-byte big-endian length, then that many bytes of body; the body starts with a type byte:
//!
//! | type | frame | body after the type byte |
//! |---:|---|---|
//! | 1 | [`Frame::Order`] | the order body (below) |
//! | 2 | [`Frame::Stored`] | `sender u64, run u64, seq u64`: the order is stored |
//! | 3 | [`Frame::Refused`] | `sender u64, run u64, seq u64`: the order will never be stored (sender not allowed) |
//!
//! The order body, `sender u64, run u64, seq u64, made_us u64, payload_len u32, payload`, is public on its own
//! ([`encode_order_body`], [`decode_order_body`]) so that MQTT can carry it as a PUBLISH payload. All integers are
//! big-endian. A body longer than [`MAX_FRAME`] is refused before it is buffered; bytes left over inside a frame
//! after its fields are an error, not ignored.
//!
//! [`decode`] follows the check-then-parse pattern: an incomplete frame is `Ok(None)` (read more), a malformed one
//! an error; the caller keeps one `BytesMut` per stream.

use crate::order::{Order, OrderId};
use crate::TransportError;
use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest body a frame may announce (1 MiB); a longer one is refused before it is read.
pub const MAX_FRAME: usize = 1 << 20;
/// Bytes of the length prefix.
pub const LEN_PREFIX: usize = 4;
/// Bytes of an order body before its payload.
pub const ORDER_HEADER: usize = 8 * 4 + 4;
/// The largest payload an order frame can carry.
pub const MAX_FRAME_PAYLOAD: usize = MAX_FRAME - 1 - ORDER_HEADER;

const TYPE_ORDER: u8 = 1;
const TYPE_STORED: u8 = 2;
const TYPE_REFUSED: u8 = 3;
/// The length of an order's id on the wire (sender, run, seq).
pub const ID_LEN: usize = 24;

/// One frame on a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A device's order (device to server).
    Order(Order),
    /// The order with this id is stored (server to device).
    Stored(OrderId),
    /// The order with this id is refused and will never be stored (server to device).
    Refused(OrderId),
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The length prefix announces a body larger than [`MAX_FRAME`] (or a payload larger than [`MAX_FRAME_PAYLOAD`]).
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    Oversized {
        /// The announced length.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// The frame's body is empty: no type byte.
    #[error("empty frame")]
    Empty,
    /// The type byte is not one this version knows.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// The body ends before its fields do.
    #[error("frame body truncated")]
    Truncated,
    /// Bytes are left inside the frame after its fields.
    #[error("{0} trailing bytes inside a frame")]
    TrailingBytes(usize),
    /// The stream ended in the middle of a frame.
    #[error("stream ended inside a frame")]
    UnexpectedEof,
    /// Reading or writing the stream failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl From<FrameError> for TransportError {
    fn from(e: FrameError) -> Self {
        match e {
            FrameError::Io(e) => TransportError::Io(e),
            other => TransportError::Protocol(other.to_string()),
        }
    }
}

fn put_id(id: &OrderId, out: &mut impl BufMut) {
    out.put_u64(id.sender);
    out.put_u64(id.run);
    out.put_u64(id.seq);
}

fn get_id(body: &mut &[u8]) -> Result<OrderId, FrameError> {
    if body.len() < ID_LEN {
        return Err(FrameError::Truncated);
    }
    Ok(OrderId {
        sender: body.get_u64(),
        run: body.get_u64(),
        seq: body.get_u64(),
    })
}

/// The length of an order's body as [`encode_order_body`] writes it.
pub fn order_body_len(order: &Order) -> usize {
    ID_LEN + 8 + 4 + order.payload.len()
}

/// Append an order's body (no length prefix, no type byte) to `out`.
///
/// The payload must not exceed [`MAX_FRAME_PAYLOAD`]; a longer one is still encoded here but refused by every decoder.
pub fn encode_order_body(order: &Order, out: &mut impl BufMut) {
    put_id(&order.id, out);
    out.put_u64(order.made_us);
    out.put_u32(order.payload.len().min(u32::MAX as usize) as u32);
    out.put_slice(&order.payload);
}

/// Read an order body that makes up all of `body`; bytes after the payload are an error.
pub fn decode_order_body(mut body: &[u8]) -> Result<Order, FrameError> {
    let id = get_id(&mut body)?;
    if body.len() < 12 {
        return Err(FrameError::Truncated);
    }
    let made_us = body.get_u64();
    let len = body.get_u32() as usize;
    if len > MAX_FRAME_PAYLOAD {
        return Err(FrameError::Oversized {
            len,
            max: MAX_FRAME_PAYLOAD,
        });
    }
    match body.len().cmp(&len) {
        std::cmp::Ordering::Less => Err(FrameError::Truncated),
        std::cmp::Ordering::Greater => Err(FrameError::TrailingBytes(body.len() - len)),
        std::cmp::Ordering::Equal => Ok(Order {
            id,
            made_us,
            payload: body.to_vec(),
        }),
    }
}

/// Append one whole frame (length prefix included) to `out`.
pub fn encode(frame: &Frame, out: &mut BytesMut) {
    match frame {
        Frame::Order(order) => encode_order(order, out),
        Frame::Stored(id) => encode_answer(TYPE_STORED, id, out),
        Frame::Refused(id) => encode_answer(TYPE_REFUSED, id, out),
    }
}

/// Append an order frame to `out` (the hot path: no intermediate [`Frame`]).
pub fn encode_order(order: &Order, out: &mut BytesMut) {
    let body = 1 + ORDER_HEADER + order.payload.len();
    out.reserve(LEN_PREFIX + body);
    out.put_u32(body.min(u32::MAX as usize) as u32);
    out.put_u8(TYPE_ORDER);
    encode_order_body(order, out);
}

/// Append a [`Frame::Stored`] frame to `out`.
pub fn encode_stored(id: &OrderId, out: &mut BytesMut) {
    encode_answer(TYPE_STORED, id, out);
}

fn encode_answer(kind: u8, id: &OrderId, out: &mut BytesMut) {
    out.reserve(LEN_PREFIX + 1 + ID_LEN);
    out.put_u32((1 + ID_LEN) as u32);
    out.put_u8(kind);
    put_id(id, out);
}

/// The length the frame at the start of `buf` announces, length prefix included, once its prefix is there
/// (whether or not the rest has arrived, and unchecked against [`MAX_FRAME`]).
pub fn announced_len(buf: &[u8]) -> Option<usize> {
    buf.first_chunk::<LEN_PREFIX>()
        .map(|prefix| LEN_PREFIX + u32::from_be_bytes(*prefix) as usize)
}

/// The length of the whole frame at the start of `buf`, if it is all there: `Ok(None)` means read more. Refuses an
/// oversized length before any of the body arrives.
pub fn check(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(whole) = announced_len(buf) else {
        return Ok(None);
    };
    let len = whole - LEN_PREFIX;
    if len > MAX_FRAME {
        return Err(FrameError::Oversized {
            len,
            max: MAX_FRAME,
        });
    }
    Ok((buf.len() >= whole).then_some(whole))
}

/// Parse one frame's body (without its length prefix); every byte must belong to the frame.
pub fn parse_body(body: &[u8]) -> Result<Frame, FrameError> {
    let (&kind, mut rest) = body.split_first().ok_or(FrameError::Empty)?;
    let frame = match kind {
        TYPE_ORDER => return decode_order_body(rest).map(Frame::Order),
        TYPE_STORED => Frame::Stored(get_id(&mut rest)?),
        TYPE_REFUSED => Frame::Refused(get_id(&mut rest)?),
        other => return Err(FrameError::UnknownType(other)),
    };
    if !rest.is_empty() {
        return Err(FrameError::TrailingBytes(rest.len()));
    }
    Ok(frame)
}

/// Take one frame from the front of `buf`: `Ok(None)` if it is not complete yet (nothing is consumed), an error if
/// it is malformed or oversized (the stream should then be dropped).
pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
    let Some(len) = check(buf)? else {
        return Ok(None);
    };
    let frame = parse_body(&buf[LEN_PREFIX..len])?;
    buf.advance(len);
    Ok(Some(frame))
}

/// Make room in a stream's read buffer before the next read, for the frame at its front: what it still lacks
/// (the length prefix, then the rest of the frame), but never more than it holds already (at least 256
/// bytes). A buffer sized for the frames it usually holds (an order, an answer) is never grown, so a short frame
/// costs one small allocation; a long one grows by doubling as its bytes arrive, so a peer that announces a long
/// frame and sends nothing more holds no more than twice what it sent.
pub fn make_room(buf: &mut BytesMut) {
    let frame = announced_len(buf).unwrap_or(LEN_PREFIX);
    let wanted = frame.saturating_sub(buf.len()).clamp(1, buf.len().max(256));
    if buf.capacity() - buf.len() < wanted {
        buf.reserve(wanted);
    }
}

/// Read the next frame from `reader`, buffering in `buf` (keep one per stream: it may hold the start of the next
/// frame). `Ok(None)` when the stream ends cleanly between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut BytesMut,
) -> Result<Option<Frame>, FrameError> {
    loop {
        if let Some(frame) = decode(buf)? {
            return Ok(Some(frame));
        }
        make_room(buf);
        if reader.read_buf(buf).await? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(FrameError::UnexpectedEof)
            };
        }
    }
}

/// Write one frame to `writer` (one `write_all`; flushing is the caller's).
pub async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    frame: &Frame,
) -> Result<(), FrameError> {
    let mut buf = BytesMut::new();
    encode(frame, &mut buf);
    writer.write_all(&buf).await?;
    Ok(())
}

/// A reader that hands out a byte slice at most `step` bytes per read, then ends: a stream whose data arrives in
/// pieces, for checks of the code that reads frames (every piece size from one byte up should give the same frames).
#[derive(Debug)]
pub struct Pieces<'a> {
    bytes: &'a [u8],
    step: usize,
}

impl<'a> Pieces<'a> {
    /// `bytes`, at most `step` (at least 1) per read.
    pub fn new(bytes: &'a [u8], step: usize) -> Self {
        Pieces {
            bytes,
            step: step.max(1),
        }
    }
}

impl AsyncRead for Pieces<'_> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        out: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let n = self.step.min(self.bytes.len()).min(out.remaining());
        out.put_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(seq: u64, len: usize) -> Order {
        let id = OrderId {
            sender: 7,
            run: 0xdead_beef,
            seq,
        };
        let mut payload = Vec::new();
        crate::order::fill_payload(&id, len, &mut payload);
        Order {
            id,
            made_us: 1_700_000_000_000_000 + seq,
            payload,
        }
    }

    fn frames() -> Vec<Frame> {
        vec![
            Frame::Order(order(0, 0)),
            Frame::Order(order(1, 64)),
            Frame::Order(order(2, 1024)),
            Frame::Stored(order(3, 0).id),
            Frame::Refused(OrderId {
                sender: u64::MAX,
                run: 0,
                seq: u64::MAX,
            }),
        ]
    }

    #[test]
    fn frames_round_trip_byte_by_byte() {
        let mut wire = BytesMut::new();
        for f in frames() {
            encode(&f, &mut wire);
        }
        // Fed one byte at a time, every frame comes out once, in order, and nothing before it is complete.
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
    fn order_body_alone() {
        let o = order(9, 100);
        let mut body = Vec::new();
        encode_order_body(&o, &mut body);
        assert_eq!(body.len(), ORDER_HEADER + 100);
        assert_eq!(decode_order_body(&body).unwrap(), o);
        body.push(0);
        assert!(matches!(
            decode_order_body(&body),
            Err(FrameError::TrailingBytes(1))
        ));
        body.truncate(body.len() - 2);
        assert!(matches!(
            decode_order_body(&body),
            Err(FrameError::Truncated)
        ));
    }

    #[test]
    fn malformed_frames_are_errors() {
        // Trailing byte inside a Stored frame.
        let mut buf = BytesMut::new();
        encode_stored(&order(0, 0).id, &mut buf);
        buf[3] += 1;
        buf.put_u8(0);
        assert!(matches!(
            decode(&mut buf),
            Err(FrameError::TrailingBytes(1))
        ));
        // Unknown type, empty body, short id.
        for (body, want) in [
            (&[9u8][..], "unknown"),
            (&[], "empty"),
            (&[2, 0, 0], "truncated"),
        ] {
            let mut buf = BytesMut::new();
            buf.put_u32(body.len() as u32);
            buf.put_slice(body);
            let err = decode(&mut buf).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
        // An oversized length is refused from the prefix alone.
        let mut buf = BytesMut::from(&((MAX_FRAME + 1) as u32).to_be_bytes()[..]);
        assert!(matches!(
            decode(&mut buf),
            Err(FrameError::Oversized { .. })
        ));
        // A payload length that disagrees with the frame length.
        let mut buf = BytesMut::new();
        encode_order(&order(0, 10), &mut buf);
        buf[LEN_PREFIX + 1 + 32 + 3] = 11;
        assert!(matches!(decode(&mut buf), Err(FrameError::Truncated)));
    }

    /// Frames read from a stream that delivers a few bytes at a time: an answer fits the small buffer a device
    /// reads it into (never grown), an order the server's, and a frame of the largest size grows the buffer until
    /// it is whole; a stream that ends inside a frame is an error, one that ends between frames is not.
    #[tokio::test]
    async fn frames_are_read_from_a_stream_in_pieces() {
        let id = order(3, 0).id;
        let big = order(4, MAX_FRAME_PAYLOAD);
        let mut bytes = BytesMut::new();
        encode_stored(&id, &mut bytes);
        let answer_len = bytes.len();
        encode_order(&order(5, 64), &mut bytes);
        let order_len = bytes.len() - answer_len;
        encode_order(&big, &mut bytes);
        let mut stream = pieces(&bytes, 7);

        let mut small = BytesMut::with_capacity(64);
        assert_eq!(
            read_frame(&mut stream, &mut small).await.unwrap(),
            Some(Frame::Stored(id))
        );
        // Capacity counts from the front, which moved past the answer: not grown.
        assert_eq!(small.capacity() + answer_len, 64, "an answer fits 64 bytes");
        let mut buf = BytesMut::with_capacity(256);
        buf.extend_from_slice(&small);
        assert_eq!(
            read_frame(&mut stream, &mut buf).await.unwrap(),
            Some(Frame::Order(order(5, 64)))
        );
        assert_eq!(
            buf.capacity() + order_len,
            256,
            "an order of 64 bytes fits 256"
        );
        assert_eq!(
            read_frame(&mut stream, &mut buf).await.unwrap(),
            Some(Frame::Order(big))
        );
        assert_eq!(read_frame(&mut stream, &mut buf).await.unwrap(), None);

        // A frame announced at the largest length, of which only the prefix and a few bytes arrive: the buffer
        // holds about twice what was sent, not the announced length.
        let mut announced = BytesMut::new();
        announced.put_u32(MAX_FRAME as u32);
        announced.extend_from_slice(&[TYPE_ORDER; 300]);
        let mut stream = pieces(&announced, 50);
        let mut buf = BytesMut::with_capacity(256);
        assert!(matches!(
            read_frame(&mut stream, &mut buf).await,
            Err(FrameError::UnexpectedEof)
        ));
        assert!(buf.capacity() <= 1024, "{} bytes held", buf.capacity());

        let mut cut = BytesMut::new();
        encode_stored(&id, &mut cut);
        let mut stream = pieces(&cut[..cut.len() - 1], 3);
        assert!(matches!(
            read_frame(&mut stream, &mut BytesMut::new()).await,
            Err(FrameError::UnexpectedEof)
        ));
    }

    fn pieces(bytes: &[u8], step: usize) -> Pieces<'_> {
        Pieces::new(bytes, step)
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut wire = BytesMut::new();
        encode(&Frame::Order(order(5, 40)), &mut wire);
        for round in 0..20_000 {
            let mut buf = if round % 2 == 0 {
                // Pure noise, with small lengths often enough to reach the parser.
                let len = (next() % 80) as usize;
                let mut b: BytesMut = (0..len).map(|_| next() as u8).collect();
                if len >= 4 && round % 4 == 0 {
                    b[..4].copy_from_slice(&((len - 4) as u32).to_be_bytes());
                }
                b
            } else {
                // A valid frame with a few bytes flipped.
                let mut b = wire.clone();
                for _ in 0..(next() % 4 + 1) {
                    let i = (next() as usize) % b.len();
                    b[i] ^= next() as u8;
                }
                b
            };
            while let Ok(Some(_)) = decode(&mut buf) {}
            let _ = decode_order_body(&buf);
        }
    }

    #[tokio::test]
    async fn over_an_async_stream() {
        let (mut a, mut b) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            for f in frames() {
                write_frame(&mut a, &f).await.unwrap();
            }
            // Half a frame, then the end of the stream.
            a.write_all(&[0, 0, 0, 25, 2]).await.unwrap();
        });
        let mut buf = BytesMut::new();
        for f in frames() {
            assert_eq!(read_frame(&mut b, &mut buf).await.unwrap(), Some(f));
        }
        writer.await.unwrap();
        assert!(matches!(
            read_frame(&mut b, &mut buf).await,
            Err(FrameError::UnexpectedEof)
        ));

        let (a, mut b) = tokio::io::duplex(64);
        drop(a);
        assert!(read_frame(&mut b, &mut BytesMut::new())
            .await
            .unwrap()
            .is_none());
    }
}
