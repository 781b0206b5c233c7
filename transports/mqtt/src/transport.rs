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
use transport_conn::fleet::{ConnFleet, Policy};
use transport_core::{
    BoxFuture, Capabilities, Fleet, FleetConfig, MemorySource, Ready, ServeConfig, Spec, Support,
    Transport, TransportError,
};
use transport_tls::{self as tls, ClientTls, DeviceCredentials};

/// The variants this crate provides.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "mqtt",
        about: "MQTT 3.1.1 to the in-tree broker over TLS 1.3 with client certificates; an order is a QoS 1 PUBLISH \
                to orders/<device>, PUBACK sent after the store's commit",
        make: || Box::new(Mqtt::in_tree()),
    },
    Spec {
        name: "mqtt@mosquitto",
        about: "the same clients against a real mosquitto 2.x (TLS 1.3, client certificates required); it stores \
                nothing, so the workloads that need stored answers do not apply",
        make: || Box::new(Mqtt::mosquitto()),
    },
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

impl Mqtt {
    /// `mqtt`: the in-tree broker with its default settings.
    pub fn in_tree() -> Self {
        Self::with_config(BrokerConfig::default())
    }

    /// `mqtt@mosquitto`: a real mosquitto with the same PKI.
    pub fn mosquitto() -> Self {
        Mqtt {
            spec: "mqtt@mosquitto",
            server: Server::Mosquitto,
            config: BrokerConfig::default(),
        }
    }

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

    fn capabilities(&self) -> Capabilities {
        let (stored_answers, memory) = match self.server {
            Server::InTree => (Support::Yes, MemorySource::Rss),
            Server::Mosquitto => (
                Support::No(NO_ORDER_SINK),
                MemorySource::RssAndSysTopic("$SYS/broker/heap/current"),
            ),
        };
        Capabilities {
            stored_answers,
            handshakes: Support::Yes,
            disconnect: Support::No("the MQTT fleet does not close links on request yet"),
            pubsub: Support::No("the MQTT fleet does not publish or subscribe yet"),
            memory,
        }
    }

    fn prepare(&self, dir: &std::path::Path, devices: u32) -> Result<(), TransportError> {
        tls::write_pki(dir, devices)
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
                        state_dir: Some(config.state_dir.clone()),
                        ..broker_config
                    };
                    let broker = RunningBroker::new(broker_config, config.store, config.counters)
                        .map_err(|e| TransportError::Io(std::io::Error::other(e)))?;
                    let run = broker.clone().run(vec![Listener {
                        tcp,
                        tls: Some(TlsAcceptor::from(tls)),
                    }]);
                    let _ = config.ready.send(Ready::new(addr, public_key));
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
                        serving_pid: Some(m.pid()),
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
    fn specs() {
        for spec in SPECS {
            assert_eq!((spec.make)().spec(), spec.name);
        }
    }

    #[test]
    fn mosquitto_says_why_it_has_no_stored_answers() {
        let m = Mqtt::mosquitto().capabilities();
        assert_eq!(m.stored_answers, Support::No(NO_ORDER_SINK));
        assert!(matches!(m.memory, MemorySource::RssAndSysTopic(_)));
        let inner = Mqtt::in_tree().capabilities();
        assert!(inner.stored_answers.is_yes() && inner.handshakes.is_yes());
    }
}
