//! The `quinn` transport: QUIC with quinn 0.11 (rustls on aws-lc-rs).
//!
//! - [`server`]: one quinn endpoint on the configured address; every device authenticates with its own client
//!   certificate, sends each order on a bidirectional stream, and gets "stored" on the same stream once the store
//!   has committed it. The stateless-reset key is derived from the server's key file, so a server restarted on the
//!   same port resets the old process's connections at once.
//! - [`client`]: a [`QuinnConnector`] for the shared connection fleet ([`transport_conn::fleet`]): one client
//!   endpoint (one UDP socket) for all devices, one connection per device with that device's certificate.
//!
//! The PKI and TLS configuration are [`transport_tls`]'s; the protocol on the streams (ALPN, frames, the
//! server's answer to an order) and the settings it shares with the s2n-quic transport are [`transport_conn::quic`]'s.
//! What is quinn's own is the endpoint and transport settings, listed in `docs/quinn.md`.

pub mod client;
pub mod server;

pub use client::QuinnConnector;

use transport_conn::fleet::ConnFleet;
use transport_conn::quic;
use transport_core::{
    BoxFuture, Capabilities, Fleet, FleetConfig, ServeConfig, Spec, Transport, TransportError,
};

/// The variants this crate provides.
pub const SPECS: &[Spec] = &[Spec {
    name: "quinn",
    about: "QUIC (quinn 0.11, rustls/aws-lc-rs): one connection per device with its own certificate, TLS 1.3 full \
            handshake, one bidirectional stream per order",
    make: || Box::new(Quinn),
}];

/// The quinn transport.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quinn;

impl Transport for Quinn {
    fn spec(&self) -> &str {
        "quinn"
    }

    fn capabilities(&self) -> Capabilities {
        quic::capabilities()
    }

    fn prepare(&self, dir: &std::path::Path, devices: u32) -> Result<(), TransportError> {
        transport_tls::write_pki(dir, devices)
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
        config.keep_alive_interval(Some(transport_conn::quic::KEEP_ALIVE));
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration() {
        assert_eq!(SPECS.len(), 1);
        assert_eq!((SPECS[0].make)().spec(), SPECS[0].name);
        assert!(Quinn.capabilities().handshakes.is_yes());
    }
}
