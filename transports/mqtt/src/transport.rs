//! The `mqtt` transports for the suite's [`Transport`] trait.
//!
//! - `mqtt`: the in-tree broker over TLS 1.3 with client certificates, its order sink committing to the suite's
//!   store before each PUBACK, its persistent sessions kept in the store's directory; the client side is `connfleet`
//!   driving [`OrderConnector`].
//! - `mqtt@mosquitto`: a real mosquitto started by [`Mosquitto`] with the same PKI; the same client side. It has no
//!   order sink (its PUBACK means received, not stored), so the order workloads do not apply to it.

use crate::broker::{BrokerConfig, Listener, RunningBroker};
use crate::client::OrderConnector;
use crate::mosquitto::{self, Mosquitto};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use transport_core::connfleet::{ConnFleet, Policy};
use transport_core::tls::{self, ClientTls, DeviceCredentials};
use transport_core::{
    BoxFuture, Fleet, FleetConfig, Ready, ServeConfig, Support, Transport, TransportError,
    WorkloadKind,
};

/// The variants, with a line each on what they are.
pub const VARIANTS: &[(&str, &str)] = &[
    (
        "mqtt",
        "MQTT 3.1.1 to the in-tree broker over TLS 1.3 with client certificates; an order is a QoS 1 PUBLISH to \
         orders/<device>, PUBACK sent after the store's commit",
    ),
    (
        "mqtt@mosquitto",
        "the same clients against a real mosquitto 2.x (TLS 1.3, client certificates required); it stores nothing, \
         so only handshake-rate, fanout, flood and idle-links apply, not drain, restart or first-contact",
    ),
];

const NO_ORDER_SINK: &str = "mosquitto has no order sink: its PUBACK means received, not stored";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    InTree,
    Mosquitto,
}

/// MQTT in one configuration.
#[derive(Debug, Clone)]
pub struct Mqtt {
    spec: &'static str,
    server: Server,
    config: BrokerConfig,
}

/// The transport for a variant: `None` (or empty) is `mqtt`, `mosquitto` is `mqtt@mosquitto`; anything else `None`.
pub fn transport(variant: Option<&str>) -> Option<Box<dyn Transport>> {
    let (spec, server) = match variant.map(|v| v.trim_start_matches(['@', ':'])) {
        None | Some("") => ("mqtt", Server::InTree),
        Some("mosquitto") => ("mqtt@mosquitto", Server::Mosquitto),
        Some(_) => return None,
    };
    Some(Box::new(Mqtt {
        spec,
        server,
        config: BrokerConfig::default(),
    }))
}

/// The transport for a whole spec as the command line gives it (`mqtt`, `mqtt@mosquitto`).
pub fn transport_for_spec(spec: &str) -> Option<Box<dyn Transport>> {
    match spec.strip_prefix("mqtt")? {
        "" => transport(None),
        rest if rest.starts_with('@') => transport(Some(rest)),
        _ => None,
    }
}

impl Mqtt {
    /// The in-tree broker with these settings.
    pub fn with_config(config: BrokerConfig) -> Self {
        Mqtt {
            spec: "mqtt",
            server: Server::InTree,
            config,
        }
    }
}

impl Transport for Mqtt {
    fn spec(&self) -> &str {
        self.spec
    }

    fn supports(&self, workload: WorkloadKind) -> Support {
        match (self.server, workload) {
            (
                Server::Mosquitto,
                WorkloadKind::Drain | WorkloadKind::Restart | WorkloadKind::FirstContact,
            ) => Support::No(NO_ORDER_SINK),
            _ => Support::Yes,
        }
    }

    fn serve(&self, config: ServeConfig) -> BoxFuture<'static, Result<(), TransportError>> {
        let server = self.server;
        let broker_config = self.config.clone();
        Box::pin(async move {
            let public_key = tls::server_fingerprint(&config.identity)?;
            match server {
                Server::InTree => {
                    let tls = tls::server_config(&config.identity, config.counters.clone(), &[])?;
                    let tcp = TcpListener::bind(config.listen).await?;
                    let addr = tcp.local_addr()?;
                    // Persistent sessions live beside the orders: both are the server's durable state.
                    let broker_config = BrokerConfig {
                        state_dir: Some(config.store.dir().to_path_buf()),
                        ..broker_config
                    };
                    let broker = RunningBroker::new(broker_config, config.store, config.counters)
                        .map_err(|e| TransportError::Io(std::io::Error::other(e)))?;
                    let run = broker.clone().run(vec![Listener {
                        tcp,
                        tls: Some(TlsAcceptor::from(tls)),
                    }]);
                    let _ = config.ready.send(Ready { addr, public_key });
                    // However this future ends (dropped included), the session files are closed with it.
                    let _closing = CloseOnDrop(broker);
                    run.await
                }
                Server::Mosquitto => {
                    let port = match config.listen.port() {
                        0 => mosquitto::free_port()?,
                        p => p,
                    };
                    let work = config.identity.join("mosquitto");
                    let m = Mosquitto::start(&config.identity, port, &work)
                        .await
                        .map_err(|e| TransportError::Config(e.to_string()))?;
                    let _ = config.ready.send(Ready {
                        addr: m.addr(),
                        public_key,
                    });
                    while m.is_running() {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(TransportError::Protocol(format!(
                        "mosquitto exited:\n{}",
                        m.log_tail()
                    )))
                }
            }
        })
    }

    fn fleet(
        &self,
        config: FleetConfig,
    ) -> BoxFuture<'static, Result<Box<dyn Fleet>, TransportError>> {
        Box::pin(async move {
            let credentials = Arc::new(DeviceCredentials::load_for(
                &config.identity,
                config.devices,
            )?);
            let tls = ClientTls::new(credentials, config.counters.clone(), &[])?;
            let connector = OrderConnector::new(config.server, tls);
            let fleet = ConnFleet::start(
                connector,
                config.devices,
                config.events,
                config.counters,
                Policy::default(),
            );
            Ok(Box::new(fleet) as Box<dyn Fleet>)
        })
    }
}

/// Closes the broker's session files when dropped.
struct CloseOnDrop(RunningBroker);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        // The close is requested at the call; the writer finishes it on its own thread.
        drop(self.0.close());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_and_variants() {
        assert_eq!(transport(None).unwrap().spec(), "mqtt");
        assert_eq!(
            transport(Some("mosquitto")).unwrap().spec(),
            "mqtt@mosquitto"
        );
        assert!(transport(Some("nope")).is_none());
        for (spec, _) in VARIANTS {
            assert_eq!(transport_for_spec(spec).unwrap().spec(), *spec);
        }
        assert!(transport_for_spec("mqttx").is_none() && transport_for_spec("pure").is_none());
    }

    #[test]
    fn mosquitto_says_why_order_workloads_do_not_apply() {
        let m = transport(Some("mosquitto")).unwrap();
        for w in WorkloadKind::ALL {
            let applies = !matches!(
                w,
                WorkloadKind::Drain | WorkloadKind::Restart | WorkloadKind::FirstContact
            );
            assert_eq!(m.supports(w) == Support::Yes, applies, "{w}");
        }
        let inner = transport(None).unwrap();
        assert!(WorkloadKind::ALL
            .iter()
            .all(|w| inner.supports(*w) == Support::Yes));
    }
}
