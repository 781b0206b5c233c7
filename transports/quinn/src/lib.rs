//! The `quinn` transport: QUIC with quinn 0.11 (rustls on aws-lc-rs).
//!
//! - [`server`]: one quinn endpoint on the configured address; every device authenticates with its own client
//!   certificate, sends each order on a bidirectional stream, and gets "stored" on the same stream once the store
//!   has committed it. The stateless-reset key is derived from the server's key file, so a server restarted on the
//!   same port resets the old process's connections at once.
//! - [`client`]: a [`QuinnConnector`] for the shared connection fleet ([`transport_core::connfleet`]): one client
//!   endpoint (one UDP socket) for all devices, one connection per device with that device's certificate.
//!
//! The PKI and TLS configuration are [`transport_core::tls`]'s, the frames [`transport_core::framing`]'s; what is
//! quinn's own is the endpoint and transport settings, listed in `docs/quinn.md`.

pub mod client;
pub mod server;

pub use client::{fleet_with_credentials, QuinnConnector};

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use transport_core::{
    BoxFuture, Fleet, FleetConfig, ServeConfig, Support, Transport, TransportError, WorkloadKind,
};

/// The ALPN protocol of orders over QUIC streams.
pub const ALPN: &[u8] = b"lb-orders";

/// The variants this crate provides: (spec, one-line description).
pub const VARIANTS: &[(&str, &str)] = &[(
    "quinn",
    "QUIC (quinn 0.11, rustls/aws-lc-rs): one connection per device with its own certificate, TLS 1.3 full \
     handshake, one bidirectional stream per order",
)];

/// The receive and send buffer asked for the server's UDP socket, as the other UDP servers do.
pub const SERVER_SOCKET_BUFFER: usize = 16 << 20;

/// The buffer of the client endpoint's one socket. It stands in for the buffers of every device's own socket on
/// real devices, so it is larger: after a restart, 10,000 servers' handshake flights (about three datagrams each)
/// arrive at once.
pub const CLIENT_SOCKET_BUFFER: usize = 64 << 20;

/// Interval of the client's keep-alive: longer than the restart workload's order period (5 s), so devices that
/// send regularly never send one, and well under the idle timeout so idle links stay open.
pub const KEEP_ALIVE: Duration = Duration::from_secs(10);

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
        match workload {
            WorkloadKind::Fanout | WorkloadKind::Flood => {
                Support::No("publish/subscribe is not part of the quinn transport")
            }
            _ => Support::Yes,
        }
    }

    fn prepare(&self, dir: &Path, devices: u32) -> Result<(), TransportError> {
        transport_core::tls::write_pki(dir, devices)
    }

    fn serve(&self, config: ServeConfig) -> BoxFuture<'static, Result<(), TransportError>> {
        Box::pin(server::serve(config))
    }

    fn fleet(
        &self,
        config: FleetConfig,
    ) -> BoxFuture<'static, Result<Box<dyn Fleet>, TransportError>> {
        Box::pin(async move {
            let credentials = Arc::new(transport_core::tls::DeviceCredentials::load(
                &config.identity,
            )?);
            if credentials.len() < config.devices {
                return Err(TransportError::Identity(format!(
                    "{} has credentials for {} devices, {} asked for",
                    config.identity.display(),
                    credentials.len(),
                    config.devices
                )));
            }
            let fleet = fleet_with_credentials(
                config.server,
                credentials,
                config.devices,
                config.events,
                config.counters,
            )?;
            Ok(Box::new(fleet) as Box<dyn Fleet>)
        })
    }
}

/// The transport settings both sides share; quinn's defaults except where noted (see `docs/quinn.md`).
fn transport_config(client: bool) -> quinn::TransportConfig {
    let mut config = quinn::TransportConfig::default();
    if client {
        config.keep_alive_interval(Some(KEEP_ALIVE));
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
