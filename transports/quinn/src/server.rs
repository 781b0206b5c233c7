//! The server side: a quinn endpoint that stores orders and answers "stored".
//!
//! Per connection: the handshake (counted in `handshakes`), the device's identity from its certificate's common
//! name, then one task-free loop accepting bidirectional streams. Per stream: one order frame in; the order's sender
//! must be the certificate's device (else `Refused`, counted in `refused_unknown`); the order is committed to the
//! store; then one `Stored` frame out and the stream finished. Every connection and stream lives inside the
//! [`serve`] future, so dropping it stops them all.

use bytes::BytesMut;
use futures::stream::{FuturesUnordered, StreamExt};
use quinn::crypto::rustls::QuicServerConfig;
use quinn::{Endpoint, EndpointConfig, Incoming, RecvStream, SendStream};
use quinn_proto::HashedConnectionIdGenerator;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use transport_core::framing::{self, Frame, FrameError};
use transport_core::store::{StoreError, StoreHandle};
use transport_core::{sender_id, tls, Counters, Ready, ServeConfig, TransportError};

/// Application error codes the server closes or resets with.
pub mod codes {
    use quinn::VarInt;
    /// The connection has no usable client certificate name.
    pub const NO_IDENTITY: VarInt = VarInt::from_u32(1);
    /// A stream did not carry one well-formed order frame.
    pub const MALFORMED: VarInt = VarInt::from_u32(2);
    /// The store failed; the order may be sent again.
    pub const STORE_FAILED: VarInt = VarInt::from_u32(3);
}

/// The stateless-reset key: HMAC-SHA256 keyed by HKDF-SHA256 over the server's private key, so every start of the
/// server with the same key file resets the connections of the previous start.
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
    /// Derive both from the server key file in `identity` (HKDF-SHA256, one label each).
    pub fn derive(identity: &Path) -> Result<Self, TransportError> {
        use aws_lc_rs::{hkdf, hmac};
        use rustls::pki_types::{pem::PemObject, PrivateKeyDer};
        let path = identity.join(tls::SERVER_KEY_FILE);
        let key = PrivateKeyDer::from_pem_file(&path)
            .map_err(|e| TransportError::Identity(format!("{}: {e}", path.display())))?;
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"lb-bench quinn endpoint")
            .extract(key.secret_der());
        let failed = |_| TransportError::Identity("key derivation failed".into());
        let reset = prk
            .expand(&[b"stateless reset"], hmac::HMAC_SHA256)
            .map_err(failed)?;
        let mut cid_key = [0u8; 8];
        prk.expand(&[b"connection id"], CidKeyLen)
            .map_err(failed)?
            .fill(&mut cid_key)
            .map_err(failed)?;
        Ok(Self {
            reset_key: ResetKey(hmac::Key::from(reset)),
            cid_key: u64::from_be_bytes(cid_key),
        })
    }
}

struct CidKeyLen;

impl aws_lc_rs::hkdf::KeyType for CidKeyLen {
    fn len(&self) -> usize {
        8
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

/// The SHA-256 fingerprint (hex) of the server certificate, as the ready line reports it.
pub fn fingerprint(identity: &Path) -> Result<String, TransportError> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let path = identity.join(tls::SERVER_CERT_FILE);
    let cert = CertificateDer::from_pem_file(&path)
        .map_err(|e| TransportError::Identity(format!("{}: {e}", path.display())))?;
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, cert.as_ref());
    Ok(digest.as_ref().iter().map(|b| format!("{b:02x}")).collect())
}

/// Run the server until the future is dropped (or the endpoint fails).
pub async fn serve(config: ServeConfig) -> Result<(), TransportError> {
    let ServeConfig {
        listen,
        identity,
        store,
        counters,
        ready,
        ..
    } = config;
    let tls = tls::server_config(&identity, counters.clone(), &[crate::ALPN])?;
    let crypto =
        QuicServerConfig::try_from(tls).map_err(|e| TransportError::Config(e.to_string()))?;
    let mut server_config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    server_config.transport_config(Arc::new(crate::transport_config(false)));
    let secrets = DerivedSecrets::derive(&identity)?;
    let mut endpoint_config = EndpointConfig::new(Arc::new(secrets.reset_key));
    let cid_key = secrets.cid_key;
    endpoint_config.cid_generator(move || Box::new(HashedConnectionIdGenerator::from_key(cid_key)));
    // quinn sends at most one stateless reset per 20 ms by default; after a restart every old connection needs one.
    // Resets are always smaller than the packet that caused them, so they cannot loop.
    endpoint_config.min_reset_interval(Duration::ZERO);
    let socket = std::net::UdpSocket::bind(listen)?;
    transport_core::net::set_buffers(&socket, crate::SERVER_SOCKET_BUFFER)?;
    let endpoint = Endpoint::new(
        endpoint_config,
        Some(server_config),
        socket,
        Arc::new(quinn::TokioRuntime),
    )?;
    let _ = ready.send(Ready {
        addr: endpoint.local_addr()?,
        public_key: fingerprint(&identity)?,
    });

    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            incoming = endpoint.accept() => match incoming {
                Some(incoming) => {
                    connections.spawn(connection(incoming, store.clone(), counters.clone()));
                }
                None => break,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    Ok(())
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

async fn connection(incoming: Incoming, store: StoreHandle, counters: Arc<Counters>) {
    let conn = match incoming.await {
        Ok(conn) => conn,
        Err(e) => {
            if refused_certificate(&e) {
                Counters::inc(&counters.refused_unknown);
            }
            return;
        }
    };
    Counters::inc(&counters.handshakes);
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
        conn.close(codes::NO_IDENTITY, b"no device name in the certificate");
        return;
    };
    let mut streams = FuturesUnordered::new();
    loop {
        tokio::select! {
            stream = conn.accept_bi() => match stream {
                Ok((send, recv)) => streams.push(order_stream(send, recv, sender, &store, &counters)),
                Err(_) => break, // closed, reset or timed out: nothing more to answer on it
            },
            Some(()) = streams.next(), if !streams.is_empty() => {}
        }
    }
}

/// One order in, one answer out.
async fn order_stream(
    mut send: SendStream,
    mut recv: RecvStream,
    sender: u64,
    store: &StoreHandle,
    counters: &Counters,
) {
    let mut buf = BytesMut::with_capacity(256);
    let order = match framing::read_frame(&mut recv, &mut buf).await {
        Ok(Some(Frame::Order(order))) => order,
        Ok(None) | Err(FrameError::Io(_)) => return, // the stream or connection went away
        Ok(Some(_)) | Err(_) => {
            Counters::inc(&counters.refused_malformed);
            let _ = send.reset(codes::MALFORMED);
            let _ = recv.stop(codes::MALFORMED);
            return;
        }
    };
    Counters::inc(&counters.received);
    let id = order.id;
    let answer = if id.sender != sender {
        Counters::inc(&counters.refused_unknown);
        Frame::Refused(id)
    } else {
        match store.commit(vec![order]).await {
            // Applied now or before: either way it is stored.
            Ok(_) => Frame::Stored(id),
            // Never storable: refuse it rather than have it sent again forever.
            Err(StoreError::PayloadTooLarge { .. }) => {
                Counters::inc(&counters.refused_malformed);
                Frame::Refused(id)
            }
            Err(_) => {
                let _ = send.reset(codes::STORE_FAILED);
                return;
            }
        }
    };
    buf.clear();
    framing::encode(&answer, &mut buf);
    if send.write_all(&buf).await.is_ok() {
        let _ = send.finish();
    }
}
