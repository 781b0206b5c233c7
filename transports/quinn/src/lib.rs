//! The `quinn` transport: QUIC with quinn 0.11 (rustls on aws-lc-rs).
//!
//! - [`server`]: one quinn endpoint on the configured address; every device authenticates with its own client
//!   certificate, sends each order on a bidirectional stream, and gets "stored" on the same stream once the store
//!   has committed it. The stateless-reset key is derived from the server's key file, so a server restarted on the
//!   same port resets the old process's connections at once.
//! - [`client`]: a [`QuinnConnector`] for the shared connection fleet ([`transport_conn::fleet`]): one client
//!   endpoint (one UDP socket) for all devices, one connection per device with that device's certificate.
//!
//! `quinn:p256` and `quinn:p256-rustcrypto` are the same with P-256 as the only TLS key exchange, its arithmetic by
//! aws-lc-rs's assembly or by RustCrypto's `p256` ([`TlsCrypto`]). `quinn:resume` resumes TLS 1.3 sessions: the
//! server's ticket key is derived from its key file, so a device reconnecting after a restart resumes
//! ([`transport_tls::tickets`]); [`resume`] tells which connections did.
//!
//! The PKI and TLS configuration are [`transport_tls`]'s; the protocol on the streams (ALPN, frames, the
//! server's answer to an order) and the settings it shares with the s2n-quic transport are [`transport_conn::quic`]'s.
//! What is quinn's own is the endpoint and transport settings, listed in `docs/quinn.md`.

pub mod client;
pub mod resume;
pub mod server;

pub use client::QuinnConnector;

use transport_conn::fleet::ConnFleet;
use transport_conn::quic;
use transport_core::{
    AsymCosts, BoxFuture, Capabilities, Fleet, FleetConfig, ServeConfig, Spec, Transport,
    TransportError,
};
use transport_tls::TlsCrypto;

/// The variants this crate provides.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "quinn",
        about: "QUIC (quinn 0.11, rustls/aws-lc-rs): one connection per device with its own certificate, TLS 1.3 \
                full handshake, one bidirectional stream per order",
        make: || Box::new(Quinn::default()),
    },
    Spec {
        name: "quinn:p256",
        about: "as `quinn`, with P-256 as the only TLS key exchange (ECDSA P-256 certificates as always), all \
                P-256 by aws-lc-rs's assembly",
        make: || Box::new(Quinn::with_crypto("quinn:p256", TlsCrypto::P256)),
    },
    Spec {
        name: "quinn:p256-rustcrypto",
        about: "as `quinn:p256`, every P-256 operation (key exchange, ECDSA signing and verification) by \
                RustCrypto's portable p256 0.14 on both sides",
        make: || Box::new(Quinn::with_crypto("quinn:p256-rustcrypto", TlsCrypto::P256RustCrypto)),
    },
    Spec {
        name: "quinn:resume",
        about: "as `quinn`, with TLS 1.3 session resumption: tickets under a key derived from the server's key file \
                (so they outlive a restart), one session cache per device; a resumed handshake still makes an \
                X25519 on each side but no signature or verification",
        make: || Box::new(Quinn::default().resuming("quinn:resume")),
    },
];

/// The quinn transport in one TLS configuration.
#[derive(Debug, Clone, Copy)]
pub struct Quinn {
    spec: &'static str,
    crypto: TlsCrypto,
    resume: bool,
}

impl Default for Quinn {
    /// `quinn`: X25519 first, aws-lc-rs.
    fn default() -> Self {
        Self::with_crypto("quinn", TlsCrypto::Default)
    }
}

impl Quinn {
    /// The transport under `spec`, its TLS (both sides) with the key exchange and P-256 arithmetic `crypto` names.
    pub fn with_crypto(spec: &'static str, crypto: TlsCrypto) -> Self {
        Quinn {
            spec,
            crypto,
            resume: false,
        }
    }

    /// The same transport under `spec`, resuming TLS 1.3 sessions on both sides.
    pub fn resuming(self, spec: &'static str) -> Self {
        Quinn {
            spec,
            resume: true,
            ..self
        }
    }
}

impl Transport for Quinn {
    fn spec(&self) -> &str {
        self.spec
    }

    fn capabilities(&self) -> Capabilities {
        quic::capabilities()
    }

    fn prepare(&self, dir: &std::path::Path, devices: u32) -> Result<(), TransportError> {
        transport_tls::write_pki(dir, devices)
    }

    fn serve(&self, config: ServeConfig) -> BoxFuture<'static, Result<(), TransportError>> {
        Box::pin(server::serve(config, self.crypto, self.resume))
    }

    fn asym_costs(&self) -> Option<AsymCosts> {
        transport_tls::asym_costs(self.crypto)
    }

    fn fleet(
        &self,
        config: FleetConfig,
    ) -> BoxFuture<'static, Result<Box<dyn Fleet>, TransportError>> {
        let (crypto, resume) = (self.crypto, self.resume);
        Box::pin(async move {
            ConnFleet::from_config(config, move |server, credentials, devices, counters| {
                QuinnConnector::with_tls(server, credentials, devices, counters, crypto, resume)
            })
        })
    }
}

/// The transport settings both sides share; quinn's defaults except where noted (see `docs/quinn.md`).
fn transport_config(client: bool) -> quinn::TransportConfig {
    let mut config = quinn::TransportConfig::default();
    if client {
        config.keep_alive_interval(Some(transport_conn::quic::KEEP_ALIVE));
    } else {
        config.max_concurrent_bidi_streams(transport_conn::quic::SERVER_STREAMS.into());
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration() {
        for spec in SPECS {
            assert_eq!((spec.make)().spec(), spec.name);
        }
        assert!(Quinn::default().capabilities().handshakes.is_yes());
    }
}
