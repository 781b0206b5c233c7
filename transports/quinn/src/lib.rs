//! The `quinn` transport: QUIC with quinn 0.11 (rustls on aws-lc-rs).
//!
//! - [`server`]: one quinn endpoint on the configured address; every device authenticates with its own client
//!   certificate, sends each order on a bidirectional stream, and gets "stored" on the same stream once the store
//!   has committed it. The stateless-reset key is derived from the server's key file, so a server restarted on the
//!   same port resets the old process's connections at once.
//! - [`client`]: a [`QuinnConnector`] for the shared connection fleet ([`transport_core::connfleet`]): one client
//!   endpoint (one UDP socket) for all devices, one connection per device with that device's certificate.
//!
//! The PKI and TLS configuration are [`transport_core::tls`]'s; the protocol on the streams (ALPN, frames, the
//! server's answer to an order) and the settings it shares with the s2n-quic transport are [`transport_core::quic`]'s.
//! What is quinn's own is the endpoint and transport settings, listed in `docs/quinn.md`.

pub mod client;
pub mod server;

pub use client::QuinnConnector;

use transport_core::connfleet::ConnFleet;
use transport_core::{
    BoxFuture, Fleet, FleetConfig, ServeConfig, Support, Transport, TransportError, WorkloadKind,
};

/// The variants this crate provides: (spec, one-line description).
pub const VARIANTS: &[(&str, &str)] = &[(
    "quinn",
    "QUIC (quinn 0.11, rustls/aws-lc-rs): one connection per device with its own certificate, TLS 1.3 full \
     handshake, one bidirectional stream per order",
)];

/// The transport for `quinn` (`variant` is what follows `quinn:` in the spec; there are no variants yet).
pub fn transport(variant: Option<&str>) -> Option<Box<dyn Transport>> {
    match variant {
        None => Some(Box::new(Quinn)),
        Some(_) => None,
    }
}

/// The quinn transport.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quinn;

impl Transport for Quinn {
    fn spec(&self) -> &str {
        "quinn"
    }

    fn supports(&self, workload: WorkloadKind) -> Support {
        Support::orders_only(
            workload,
            "publish/subscribe is not part of the quinn transport",
        )
    }

    fn serve(&self, config: ServeConfig) -> BoxFuture<'static, Result<(), TransportError>> {
        Box::pin(server::serve(config))
    }

    fn fleet(
        &self,
        config: FleetConfig,
    ) -> BoxFuture<'static, Result<Box<dyn Fleet>, TransportError>> {
        Box::pin(async move { ConnFleet::from_config(config, QuinnConnector::new) })
    }
}

/// The transport settings both sides share; quinn's defaults except where noted (see `docs/quinn.md`).
fn transport_config(client: bool) -> quinn::TransportConfig {
    let mut config = quinn::TransportConfig::default();
    if client {
        config.keep_alive_interval(Some(transport_core::quic::KEEP_ALIVE));
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration() {
        assert_eq!(transport(None).unwrap().spec(), "quinn");
        assert!(transport(Some("x")).is_none());
        assert_eq!(VARIANTS[0].0, "quinn");
        assert!(matches!(
            Quinn.supports(WorkloadKind::Restart),
            Support::Yes
        ));
        assert!(matches!(
            Quinn.supports(WorkloadKind::Fanout),
            Support::No(_)
        ));
    }
}
