//! The `s2n-quic` transport: QUIC with s2n-quic 1.91, in two variants that differ only in the TLS provider.
//!
//! | spec | TLS provider | asymmetric operations |
//! |---|---|---|
//! | `s2n-quic` | s2n-tls on aws-lc (s2n-quic's default) | derived per completed handshake ([`events`]) |
//! | `s2n-quic:rustls` | rustls on aws-lc-rs, configured by [`transport_core::tls`] | counted where they happen |
//!
//! Both behave as the quinn transport does: each device one connection with its own certificate from the run's CA
//! (TLS 1.3, client certificate required, no resumption), one bidirectional stream per order, "stored" answered on
//! that stream after the store's commit, the device's identity taken from its verified certificate and checked
//! against each order's sender. Re-sending and reconnecting are the shared connection fleet's
//! ([`transport_core::connfleet`]); the protocol on the streams (ALPN, frames, the server's answer to an order) and
//! the settings shared with the quinn transport are [`transport_core::quic`]'s.
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

use transport_core::connfleet::ConnFleet;
use transport_core::{
    BoxFuture, Fleet, FleetConfig, ServeConfig, Support, Transport, TransportError, WorkloadKind,
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
    /// Both providers, in the order of [`VARIANTS`].
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

/// The variants this crate provides: (spec, one-line description).
pub const VARIANTS: &[(&str, &str)] = &[
    (
        "s2n-quic",
        "QUIC (s2n-quic 1.91, s2n-tls on aws-lc, its default provider): one connection per device with its own \
         certificate, TLS 1.3 full handshake, one bidirectional stream per order; asymmetric operations derived \
         per handshake",
    ),
    (
        "s2n-quic:rustls",
        "QUIC (s2n-quic 1.91, rustls on aws-lc-rs): as `s2n-quic`, with the rustls provider; asymmetric \
         operations counted where they happen",
    ),
];

/// The transport for a full spec (`s2n-quic`, `s2n-quic:rustls`); `None` if the spec is not one of this crate's.
pub fn transport(spec: &str) -> Option<Box<dyn Transport>> {
    Provider::from_spec(spec).map(|provider| Box::new(S2nQuic { provider }) as Box<dyn Transport>)
}

/// The s2n-quic transport with one TLS provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct S2nQuic {
    /// The TLS provider.
    pub provider: Provider,
}

impl Transport for S2nQuic {
    fn spec(&self) -> &str {
        self.provider.spec()
    }

    fn supports(&self, workload: WorkloadKind) -> Support {
        Support::orders_only(
            workload,
            "publish/subscribe is not part of the s2n-quic transport",
        )
    }

    fn serve(&self, config: ServeConfig) -> BoxFuture<'static, Result<(), TransportError>> {
        Box::pin(server::serve(self.provider, config))
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
        for (spec, _) in VARIANTS {
            assert_eq!(transport(spec).unwrap().spec(), *spec);
        }
        assert_eq!(VARIANTS.len(), Provider::ALL.len());
        for spec in ["s2n-quic:", "s2n-quic:x", "s2n", "quinn", ""] {
            assert!(transport(spec).is_none(), "{spec}");
        }
        let t = transport("s2n-quic").unwrap();
        assert_eq!(t.supports(WorkloadKind::Restart), Support::Yes);
        assert_eq!(t.supports(WorkloadKind::FirstContact), Support::Yes);
        assert!(matches!(t.supports(WorkloadKind::Fanout), Support::No(_)));
        assert!(Provider::S2nTls.derives_asym_ops() && !Provider::Rustls.derives_asym_ops());
    }
}
