//! The `s2n-quic` transport: QUIC with s2n-quic 1.91, in two variants that differ only in the TLS provider.
//!
//! | spec | TLS provider | asymmetric operations |
//! |---|---|---|
//! | `s2n-quic` | s2n-tls on aws-lc (s2n-quic's default) | derived per completed handshake ([`events`]) |
//! | `s2n-quic:rustls` | rustls on aws-lc-rs, configured by [`transport_tls`] | counted where they happen |
//!
//! Both behave as the quinn transport does: each device one connection with its own certificate from the run's CA
//! (TLS 1.3, client certificate required, no resumption), one bidirectional stream per order, "stored" answered on
//! that stream after the store's commit, the device's identity taken from its verified certificate and checked
//! against each order's sender. Re-sending and reconnecting are the shared connection fleet's
//! ([`transport_conn::fleet`]); the protocol on the streams (ALPN, frames, the server's answer to an order) and
//! the settings shared with the quinn transport are [`transport_conn::quic`]'s.
//!
//! - [`server`]: one s2n-quic server endpoint that stores orders and answers.
//! - [`client`]: an [`S2nConnector`] for the connection fleet: one s2n-quic client endpoint (one UDP socket) for
//!   every device of a fleet.
//! - [`tls`]: each variant's server TLS, and the client TLS that gives each device's connection its own
//!   certificate although all share one endpoint.
//! - [`events`]: the event subscriber of both sides: the device's name from its verified certificate, refused
//!   certificates, and the derived asymmetric operations of s2n-tls.
//! - [`reset`]: stateless-reset tokens derived from the server's key file, so a restarted server resets the
//!   connections of the process before it.
//!
//! Settings and what is counted where: `docs/s2n-quic.md`.

pub mod client;
pub mod events;
pub mod reset;
pub mod server;
pub mod tls;

pub use client::S2nConnector;

use transport_conn::fleet::ConnFleet;
use transport_conn::quic;
use transport_core::{
    AsymCosts, BoxFuture, Capabilities, Fleet, FleetConfig, ServeConfig, Spec, Transport,
    TransportError,
};

/// The TLS provider of a variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    /// s2n-tls (on aws-lc), s2n-quic's default provider.
    S2nTls,
    /// rustls (on aws-lc-rs) with the suite's counting crypto provider.
    Rustls,
}

impl Provider {
    /// Both providers, in the order of [`SPECS`].
    pub const ALL: [Provider; 2] = [Provider::S2nTls, Provider::Rustls];

    /// The variant's spec.
    pub fn spec(self) -> &'static str {
        match self {
            Provider::S2nTls => "s2n-quic",
            Provider::Rustls => "s2n-quic:rustls",
        }
    }

    /// The provider of a spec, if the spec is one of this crate's.
    pub fn from_spec(spec: &str) -> Option<Self> {
        Provider::ALL.into_iter().find(|p| p.spec() == spec)
    }

    /// Whether the asymmetric operations are derived per handshake (s2n-tls exposes no hook to count them) rather
    /// than counted where they happen.
    pub fn derives_asym_ops(self) -> bool {
        self == Provider::S2nTls
    }
}

/// The variants this crate provides.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "s2n-quic",
        about: "QUIC (s2n-quic 1.91, s2n-tls on aws-lc, its default provider): one connection per device with its \
                own certificate, TLS 1.3 full handshake, one bidirectional stream per order; asymmetric operations \
                derived per handshake",
        make: || Box::new(S2nQuic::new(Provider::S2nTls)),
    },
    Spec {
        name: "s2n-quic:rustls",
        about: "QUIC (s2n-quic 1.91, rustls on aws-lc-rs): as `s2n-quic`, with the rustls provider; asymmetric \
                operations counted where they happen",
        make: || Box::new(S2nQuic::new(Provider::Rustls)),
    },
];

/// The s2n-quic transport with one TLS provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct S2nQuic {
    /// The TLS provider.
    pub provider: Provider,
}

impl S2nQuic {
    /// The transport with `provider`.
    pub fn new(provider: Provider) -> S2nQuic {
        S2nQuic { provider }
    }
}

impl Transport for S2nQuic {
    fn spec(&self) -> &str {
        self.provider.spec()
    }

    fn capabilities(&self) -> Capabilities {
        quic::capabilities()
    }

    fn prepare(&self, dir: &std::path::Path, devices: u32) -> Result<(), TransportError> {
        transport_tls::write_pki(dir, devices)
    }

    fn serve(&self, config: ServeConfig) -> BoxFuture<'static, Result<(), TransportError>> {
        Box::pin(server::serve(self.provider, config))
    }

    /// The rustls provider's operations are [`transport_tls::asym_costs`]'s code exactly. s2n-tls calls aws-lc (C)
    /// itself, with no hook; its costs are measured with the same aws-lc through aws-lc-rs, the nearest this
    /// process can call.
    fn asym_costs(&self) -> Option<AsymCosts> {
        transport_tls::asym_costs(transport_tls::TlsCrypto::Default)
    }

    fn fleet(
        &self,
        config: FleetConfig,
    ) -> BoxFuture<'static, Result<Box<dyn Fleet>, TransportError>> {
        let provider = self.provider;
        Box::pin(async move {
            // The s2n-tls provider reads the CA from the identity directory itself.
            let identity = config.identity.clone();
            ConnFleet::from_config(config, |server, credentials, devices, counters| {
                S2nConnector::new(provider, server, &identity, credentials, devices, counters)
            })
        })
    }
}

/// A builder or start error of s2n-quic, as the transport reports it.
fn start_error(what: &str, e: impl std::fmt::Display) -> TransportError {
    TransportError::Config(format!("s2n-quic {what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration() {
        assert_eq!(SPECS.len(), Provider::ALL.len());
        for (spec, provider) in SPECS.iter().zip(Provider::ALL) {
            assert_eq!((spec.make)().spec(), spec.name);
            assert_eq!(Provider::from_spec(spec.name), Some(provider));
        }
        for spec in ["s2n-quic:", "s2n-quic:x", "s2n", "quinn", ""] {
            assert!(Provider::from_spec(spec).is_none(), "{spec}");
        }
        assert!(Provider::S2nTls.derives_asym_ops() && !Provider::Rustls.derives_asym_ops());
    }
}
