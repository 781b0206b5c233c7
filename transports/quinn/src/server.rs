//! The server side: a quinn endpoint that stores orders and answers "stored".
//!
//! Per connection (a task each): the handshake (counted in `handshakes`, and in `resumed` if it resumed a session
//! under `quinn:resume`; one not done within
//! [`quic::HANDSHAKE_TIMEOUT`] is given up and counted in `timed_out`), the device's identity from its
//! certificate's common name, then one loop accepting bidirectional streams, each served by the shared step
//! ([`quic::serve_stream`]) as its first frame says. An order stream: one order frame in; the order's sender must be
//! the certificate's device (else `Refused`, counted in `refused_unknown`); the order is committed to the store;
//! then one `Stored` frame out and the stream finished. A subscription or publish stream: the relay
//! ([`transport_conn::relay`]) until it ends. Every connection and stream lives inside the [`serve`] future, so
//! dropping it stops them all.

use crate::resume::{self, ObservedServer};
use futures::stream::{self, Stream};
use quinn::crypto::rustls::QuicServerConfig;
use quinn::{Endpoint, EndpointConfig, Incoming, RecvStream, SendStream, VarInt};
use quinn_proto::HashedConnectionIdGenerator;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use transport_conn::quic::{self, codes, Served, Serving};
use transport_core::{net, sender_id, Counters, ServeConfig, TransportError};
use transport_tls::{self as tls, TlsCrypto};

/// The HKDF salt of the keys derived from the server's key file ([`tls::server_secret`]).
const SALT: &[u8] = b"lb-bench quinn endpoint";

/// The stateless-reset key: HMAC-SHA256 keyed by a secret derived from the server's private key, so every start of
/// the server with the same key file resets the connections of the previous start.
#[derive(Debug)]
pub struct ResetKey(aws_lc_rs::hmac::Key);

/// What a server derives from its key file so that a restarted process recognises its predecessor's connections
/// (and resets them at once) instead of ignoring their packets until they time out.
#[derive(Debug)]
pub struct DerivedSecrets {
    /// The stateless-reset key.
    pub reset_key: ResetKey,
    /// The key of quinn's connection id generator, which embeds a keyed check in every connection id it issues
    /// and drops packets whose id fails it. With a random key per process (quinn's default) a new process would
    /// drop the old connections' packets without resetting them.
    pub cid_key: u64,
}

impl DerivedSecrets {
    /// Derive both from the server key file in `identity` (one label each).
    pub fn derive(identity: &Path) -> Result<Self, TransportError> {
        let reset = tls::server_secret(identity, SALT, b"stateless reset")?;
        // Its first 8 bytes, as an 8-byte HKDF expansion would give them.
        let cid = tls::server_secret(identity, SALT, b"connection id")?;
        let mut cid_key = [0; 8];
        cid_key.copy_from_slice(&cid[..8]);
        Ok(Self {
            reset_key: ResetKey(aws_lc_rs::hmac::Key::new(
                aws_lc_rs::hmac::HMAC_SHA256,
                &reset,
            )),
            cid_key: u64::from_be_bytes(cid_key),
        })
    }
}

impl quinn::crypto::HmacKey for ResetKey {
    fn sign(&self, data: &[u8], signature_out: &mut [u8]) {
        let tag = aws_lc_rs::hmac::sign(&self.0, data);
        let n = signature_out.len().min(tag.as_ref().len());
        signature_out[..n].copy_from_slice(&tag.as_ref()[..n]);
    }

    fn signature_len(&self) -> usize {
        aws_lc_rs::hmac::HMAC_SHA256.digest_algorithm().output_len()
    }

    fn verify(&self, data: &[u8], signature: &[u8]) -> Result<(), quinn::crypto::CryptoError> {
        aws_lc_rs::hmac::verify(&self.0, data, signature).map_err(|_| quinn::crypto::CryptoError)
    }
}

/// Run the server until the future is dropped (or the endpoint fails), its TLS with the key exchange and P-256
/// arithmetic `crypto` names, resuming sessions if `resume`.
pub async fn serve(
    config: ServeConfig,
    crypto: TlsCrypto,
    resume: bool,
) -> Result<(), TransportError> {
    quic::serve(config, |config| start(config, crypto, resume), connection).await
}

/// The endpoint on `config.listen`: its address, and the connections it accepts.
fn start(
    config: &ServeConfig,
    crypto: TlsCrypto,
    resume: bool,
) -> Result<(SocketAddr, impl Stream<Item = Incoming>), TransportError> {
    let make = if resume {
        tls::resuming_server_config
    } else {
        tls::server_config_with
    };
    let tls = make(
        &config.identity,
        config.counters.clone(),
        &[quic::ALPN],
        crypto,
    )?;
    let crypto: Arc<dyn quinn::crypto::ServerConfig> = Arc::new(
        QuicServerConfig::try_from(tls).map_err(|e| TransportError::Config(e.to_string()))?,
    );
    // Resuming, each session is observed to count the handshakes that resumed.
    let crypto = if resume {
        Arc::new(ObservedServer(crypto))
    } else {
        crypto
    };
    let mut server_config = quinn::ServerConfig::with_crypto(crypto);
    server_config.transport_config(Arc::new(crate::transport_config(false)));
    let secrets = DerivedSecrets::derive(&config.identity)?;
    let mut endpoint_config = EndpointConfig::new(Arc::new(secrets.reset_key));
    let cid_key = secrets.cid_key;
    endpoint_config.cid_generator(move || Box::new(HashedConnectionIdGenerator::from_key(cid_key)));
    // quinn sends at most one stateless reset per 20 ms by default; after a restart every old connection needs one.
    // Resets are always smaller than the packet that caused them, so they cannot loop.
    endpoint_config.min_reset_interval(Duration::ZERO);
    let socket = net::bind_udp(config.listen, quic::SERVER_SOCKET_BUFFER)?;
    let endpoint = Endpoint::new(
        endpoint_config,
        Some(server_config),
        socket,
        Arc::new(quinn::TokioRuntime),
    )?;
    let addr = endpoint.local_addr()?;
    let incoming = stream::unfold(endpoint, |endpoint| async move {
        let incoming = endpoint.accept().await?;
        Some((incoming, endpoint))
    });
    Ok((addr, incoming))
}

/// Whether a failed handshake was our refusal of the client's certificate (a TLS alert about certificates).
fn refused_certificate(error: &quinn::ConnectionError) -> bool {
    let quinn::ConnectionError::TransportError(e) = error else {
        return false;
    };
    // CRYPTO_ERROR codes are 0x100 + the TLS alert: bad_certificate (42) to certificate_unknown (46),
    // unknown_ca (48), access_denied (49), certificate_required (116).
    let code = u64::from(e.code);
    matches!(code.checked_sub(0x100), Some(42..=46 | 48 | 49 | 116))
}

async fn connection(incoming: Incoming, serving: Arc<Serving>) {
    let counters = &serving.counters;
    let conn = match tokio::time::timeout(quic::HANDSHAKE_TIMEOUT, incoming).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            if refused_certificate(&e) {
                Counters::inc(&counters.refused_unknown);
            } else if e == quinn::ConnectionError::TimedOut {
                Counters::inc(&counters.timed_out);
            }
            return;
        }
        // Half-open: the handshake is dropped (quinn closes the connection) and counted.
        Err(_) => {
            Counters::inc(&counters.timed_out);
            return;
        }
    };
    Counters::inc(&counters.handshakes);
    if resume::resumed(&conn) {
        Counters::inc(&counters.resumed);
    }
    let sender = conn
        .peer_identity()
        .and_then(|identity| {
            identity
                .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
                .ok()
        })
        .and_then(|certs| tls::peer_device(&certs))
        .map(|name| sender_id(&name));
    let Some(sender) = sender else {
        Counters::inc(&counters.refused_unknown);
        conn.close(
            VarInt::from_u32(codes::NO_IDENTITY),
            b"no device name in the certificate",
        );
        return;
    };
    // Until the connection is closed, reset or timed out: nothing more to answer on it then.
    let streams = stream::unfold(conn, |conn| async move {
        let stream = conn.accept_bi().await.ok()?;
        Some((stream, conn))
    });
    quic::serve_each(streams, |(send, recv)| stream(send, recv, sender, &serving)).await;
}

/// One stream served ([`quic::serve_stream`]); then finished or reset as it says. An answered stream is finished by
/// the drop of its sending side (quinn finishes a send stream dropped open: one lock of the connection where `finish`
/// and then the drop took two).
async fn stream(mut send: SendStream, mut recv: RecvStream, sender: u64, serving: &Serving) {
    let code = |code| VarInt::from_u32(code);
    match quic::serve_stream(&mut recv, &mut send, sender, serving).await {
        Served::Answered | Served::Gone => {}
        Served::Malformed => {
            let _ = send.reset(code(codes::MALFORMED));
            let _ = recv.stop(code(codes::MALFORMED));
        }
        Served::StoreFailed => {
            let _ = send.reset(code(codes::STORE_FAILED));
        }
    }
}
