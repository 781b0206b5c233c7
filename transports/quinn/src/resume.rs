//! Knowing which quinn connections resumed a TLS session.
//!
//! quinn's rustls session does not say whether its handshake resumed (rustls's `handshake_kind` is not reachable
//! through quinn), so `quinn:resume` wraps quinn's TLS configurations on both sides ([`ObservedServer`],
//! [`ObservedClient`]) in a session that passes everything through and reads one thing on the way: the
//! `ServerHello`, the first handshake message the server writes and the client reads. A server that accepts a
//! ticket answers with the `pre_shared_key` extension in it (RFC 8446, 4.2.11); a full handshake has none (nor does a
//! `HelloRetryRequest`, which is skipped). [`resumed`] reads the verdict from a connection's handshake data.
//!
//! What is read is bounded: the bytes of the crypto stream up to the end of the first `ServerHello` (at most
//! [`MAX_SCAN`]); a message that does not parse counts as a full handshake.

use quinn::crypto::{
    ClientConfig, ExportKeyingMaterialError, HeaderKey, KeyPair, Keys, PacketKey, ServerConfig,
    Session, UnsupportedVersion,
};
use quinn_proto::transport_parameters::TransportParameters;
use quinn_proto::{ConnectError, ConnectionId, Side, TransportError};
use std::any::Any;
use std::sync::Arc;

/// The most bytes of a crypto stream read to find the `ServerHello`.
pub const MAX_SCAN: usize = 16 * 1024;

const SERVER_HELLO: u8 = 2;
const PRE_SHARED_KEY: u16 = 41;
/// The `random` of a `HelloRetryRequest` (RFC 8446, 4.1.3).
const HELLO_RETRY: [u8; 32] = [
    0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91,
    0xc2, 0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
];

/// What a `ServerHello` body says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hello {
    /// A `HelloRetryRequest`: the real `ServerHello` comes later.
    Retry,
    /// A `ServerHello`, with or without `pre_shared_key`.
    Server { resumed: bool },
}

/// Parse a `ServerHello` body (after its 4-byte header); `None` if it is malformed.
pub fn parse_server_hello(body: &[u8]) -> Option<Hello> {
    let rest = body.get(2..)?; // legacy_version
    let (random, rest) = rest.split_first_chunk::<32>()?;
    let (&session_len, rest) = rest.split_first()?;
    let rest = rest.get(usize::from(session_len) + 3..)?; // session id, cipher suite, compression
    let (len, rest) = rest.split_first_chunk::<2>()?;
    let mut extensions = rest.get(..usize::from(u16::from_be_bytes(*len)))?;
    let mut psk = false;
    while !extensions.is_empty() {
        let (kind, rest) = extensions.split_first_chunk::<2>()?;
        let (len, rest) = rest.split_first_chunk::<2>()?;
        psk |= u16::from_be_bytes(*kind) == PRE_SHARED_KEY;
        extensions = rest.get(usize::from(u16::from_be_bytes(*len))..)?;
    }
    Some(if *random == HELLO_RETRY {
        Hello::Retry
    } else {
        Hello::Server { resumed: psk }
    })
}

/// Reads a crypto stream, in the pieces it comes in, until its first `ServerHello` says whether the handshake
/// resumed.
#[derive(Debug, Default)]
pub struct HelloScan {
    buf: Vec<u8>,
    verdict: Option<bool>,
}

impl HelloScan {
    /// Whether the handshake resumed, once the `ServerHello` has been read.
    pub fn verdict(&self) -> Option<bool> {
        self.verdict
    }

    /// The next bytes of the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.verdict.is_some() {
            return;
        }
        self.buf.extend_from_slice(bytes);
        while let Some((&[kind, a, b, c], rest)) = self.buf.split_first_chunk::<4>() {
            let len = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
            if kind != SERVER_HELLO || len > MAX_SCAN {
                self.decide(false);
                return;
            }
            let Some(body) = rest.get(..len) else {
                break; // the rest of it comes later
            };
            match parse_server_hello(body) {
                Some(Hello::Retry) => {
                    self.buf.drain(..4 + len);
                }
                Some(Hello::Server { resumed }) => return self.decide(resumed),
                None => return self.decide(false),
            }
        }
        if self.buf.len() > MAX_SCAN {
            self.decide(false);
        }
    }

    fn decide(&mut self, resumed: bool) {
        self.verdict = Some(resumed);
        self.buf = Vec::new();
    }
}

/// A connection's handshake data under the observing session: the verdict, and the wrapped session's own data.
pub struct HandshakeData {
    /// Whether the handshake resumed a session (`None` until the `ServerHello` is read).
    pub resumed: Option<bool>,
    /// The wrapped session's handshake data (quinn's `HandshakeData` for rustls).
    pub inner: Box<dyn Any>,
}

/// Whether `conn`'s handshake resumed a session; false for a connection not made with an observed configuration.
pub fn resumed(conn: &quinn::Connection) -> bool {
    conn.handshake_data()
        .and_then(|data| data.downcast::<HandshakeData>().ok())
        .is_some_and(|data| data.resumed == Some(true))
}

/// A session passing everything to `inner`, scanning the `ServerHello` on the way.
struct Observed {
    inner: Box<dyn Session>,
    side: Side,
    scan: HelloScan,
}

impl Observed {
    fn boxed(inner: Box<dyn Session>, side: Side) -> Box<dyn Session> {
        Box::new(Observed {
            inner,
            side,
            scan: HelloScan::default(),
        })
    }
}

impl Session for Observed {
    fn initial_keys(&self, dst_cid: &ConnectionId, side: Side) -> Keys {
        self.inner.initial_keys(dst_cid, side)
    }

    fn handshake_data(&self) -> Option<Box<dyn Any>> {
        let inner = self.inner.handshake_data()?;
        Some(Box::new(HandshakeData {
            resumed: self.scan.verdict(),
            inner,
        }))
    }

    fn peer_identity(&self) -> Option<Box<dyn Any>> {
        self.inner.peer_identity()
    }

    fn early_crypto(&self) -> Option<(Box<dyn HeaderKey>, Box<dyn PacketKey>)> {
        self.inner.early_crypto()
    }

    fn early_data_accepted(&self) -> Option<bool> {
        self.inner.early_data_accepted()
    }

    fn is_handshaking(&self) -> bool {
        self.inner.is_handshaking()
    }

    fn read_handshake(&mut self, buf: &[u8]) -> Result<bool, TransportError> {
        if self.side == Side::Client {
            self.scan.feed(buf);
        }
        self.inner.read_handshake(buf)
    }

    fn transport_parameters(&self) -> Result<Option<TransportParameters>, TransportError> {
        self.inner.transport_parameters()
    }

    fn write_handshake(&mut self, buf: &mut Vec<u8>) -> Option<Keys> {
        let start = buf.len();
        let keys = self.inner.write_handshake(buf);
        if self.side == Side::Server {
            self.scan.feed(&buf[start..]);
        }
        keys
    }

    fn next_1rtt_keys(&mut self) -> Option<KeyPair<Box<dyn PacketKey>>> {
        self.inner.next_1rtt_keys()
    }

    fn is_valid_retry(&self, orig_dst_cid: &ConnectionId, header: &[u8], payload: &[u8]) -> bool {
        self.inner.is_valid_retry(orig_dst_cid, header, payload)
    }

    fn export_keying_material(
        &self,
        output: &mut [u8],
        label: &[u8],
        context: &[u8],
    ) -> Result<(), ExportKeyingMaterialError> {
        self.inner.export_keying_material(output, label, context)
    }
}

/// A server TLS configuration whose sessions are observed.
pub struct ObservedServer(pub Arc<dyn ServerConfig>);

impl ServerConfig for ObservedServer {
    fn initial_keys(
        &self,
        version: u32,
        dst_cid: &ConnectionId,
    ) -> Result<Keys, UnsupportedVersion> {
        self.0.initial_keys(version, dst_cid)
    }

    fn retry_tag(&self, version: u32, orig_dst_cid: &ConnectionId, packet: &[u8]) -> [u8; 16] {
        self.0.retry_tag(version, orig_dst_cid, packet)
    }

    fn start_session(
        self: Arc<Self>,
        version: u32,
        params: &TransportParameters,
    ) -> Box<dyn Session> {
        Observed::boxed(self.0.clone().start_session(version, params), Side::Server)
    }
}

/// A client TLS configuration whose sessions are observed.
pub struct ObservedClient(pub Arc<dyn ClientConfig>);

impl ClientConfig for ObservedClient {
    fn start_session(
        self: Arc<Self>,
        version: u32,
        server_name: &str,
        params: &TransportParameters,
    ) -> Result<Box<dyn Session>, ConnectError> {
        let inner = self.0.clone().start_session(version, server_name, params)?;
        Ok(Observed::boxed(inner, Side::Client))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `ServerHello` message (header included) with these extensions, `random` as given.
    fn server_hello(random: [u8; 32], extensions: &[(u16, &[u8])]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&random);
        body.extend_from_slice(&[0, 0x13, 0x01, 0]); // empty session id, TLS_AES_128_GCM_SHA256, no compression
        let mut ext = Vec::new();
        for (kind, data) in extensions {
            ext.extend_from_slice(&kind.to_be_bytes());
            ext.extend_from_slice(&(data.len() as u16).to_be_bytes());
            ext.extend_from_slice(data);
        }
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut msg = vec![SERVER_HELLO];
        msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        msg.extend_from_slice(&body);
        msg
    }

    const VERSIONS: (u16, &[u8]) = (43, &[3, 4]);
    const KEY_SHARE: (u16, &[u8]) = (51, &[0, 29, 0, 2, 9, 9]);
    const PSK: (u16, &[u8]) = (41, &[0, 0]);

    #[test]
    fn the_psk_extension_decides_and_a_retry_is_skipped() {
        let full = server_hello([7; 32], &[VERSIONS, KEY_SHARE]);
        let resumed = server_hello([7; 32], &[VERSIONS, KEY_SHARE, PSK]);
        let retry = server_hello(HELLO_RETRY, &[VERSIONS, (51, &[0, 29])]);
        for (stream, want) in [
            (full.clone(), false),
            (resumed.clone(), true),
            ([retry.clone(), resumed.clone()].concat(), true),
            ([retry, full.clone()].concat(), false),
        ] {
            // Whole, and in pieces of every size: the verdict comes once the ServerHello is complete.
            for piece in 1..=stream.len() {
                let mut scan = HelloScan::default();
                for chunk in stream.chunks(piece) {
                    scan.feed(chunk);
                }
                assert_eq!(scan.verdict(), Some(want), "pieces of {piece}");
            }
        }
        let mut scan = HelloScan::default();
        scan.feed(&resumed[..resumed.len() - 1]);
        assert_eq!(scan.verdict(), None);
        // What follows the ServerHello (EncryptedExtensions...) is never read.
        scan.feed(&[resumed[resumed.len() - 1], 8, 0xff, 0xff, 0xff]);
        assert_eq!(scan.verdict(), Some(true));
    }

    #[test]
    fn anything_else_is_a_full_handshake_and_never_a_panic() {
        let resumed = server_hello([7; 32], &[VERSIONS, PSK]);
        for n in 4..resumed.len() {
            // A header whose length is cut short: the body does not parse.
            let mut cut = resumed[..n].to_vec();
            let len = (n - 4) as u32;
            cut[1..4].copy_from_slice(&len.to_be_bytes()[1..]);
            let mut scan = HelloScan::default();
            scan.feed(&cut);
            assert_eq!(scan.verdict(), Some(false), "{n} bytes");
        }
        let mut scan = HelloScan::default();
        scan.feed(&[8, 0, 0, 2, 0, 0]); // EncryptedExtensions first: not a ServerHello
        assert_eq!(scan.verdict(), Some(false));
        let mut scan = HelloScan::default();
        scan.feed(&[SERVER_HELLO, 0xff, 0xff, 0xff]); // longer than anything scanned
        assert_eq!(scan.verdict(), Some(false));
        assert_eq!(parse_server_hello(&[]), None);
    }
}
