//! The `mqtt` transports for the suite's [`Transport`] trait.
//!
//! - `mqtt`: the in-tree broker over TLS 1.3 with client certificates, its order sink committing to the suite's
//!   store before each PUBACK, its persistent sessions kept in the store's directory; the client side is the
//!   connection fleet driving [`OrderConnector`].
//! - `mqtt:p256`, `mqtt:p256-rustcrypto`: the same with P-256 as the only TLS key exchange, P-256 done by aws-lc-rs's
//!   assembly or by RustCrypto's `p256` ([`TlsCrypto`]), for the end-to-end half of seed 002's P-256 comparison.
//! - `mqtt:resume`: TLS 1.3 session resumption, the broker's ticket key derived from its key file so that tickets
//!   outlive a restart ([`transport_tls::tickets`]), one session cache per device.
//! - `mqtt:early`: the client writes CONNECT as soon as its TLS handshake completes (its Finished just sent) and its
//!   first PUBLISH right after, without waiting for CONNACK (MQTT 3.1.1 section 3.1.4): first contact in 3 round trips.
//! - `mqtt@mosquitto`: a real mosquitto started by [`Mosquitto`] with the same PKI; the same client side. It has no
//!   order sink (its PUBACK means received, not stored), so the order workloads do not apply to it. Its count of
//!   dropped messages is read from its `$SYS` tree ([`mosquitto::follow_dropped`]) into the server's `dropped`
//!   counter, where the in-tree broker counts its own.
//!
//! Both relay published messages (topics `bench/<channel>`) as MQTT brokers do, by their own queue bounds
//! (docs/workloads.md, "Relay semantics").

use crate::broker::{BrokerConfig, Listener, RunningBroker};
use crate::client::OrderConnector;
use crate::mosquitto::{self, Mosquitto};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use transport_conn::fleet::ConnFleet;
use transport_core::{
    AsymCosts, BoxFuture, Capabilities, Fleet, FleetConfig, MemorySource, Ready, ServeConfig, Spec,
    Support, Transport, TransportError,
};
use transport_tls::{self as tls, ClientTls, TlsCrypto};

/// The variants this crate provides.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "mqtt",
        about: "MQTT 3.1.1 to the in-tree broker over TLS 1.3 with client certificates; an order is a QoS 1 PUBLISH \
                to orders/<device>, PUBACK sent after the store's commit",
        make: || Box::new(Mqtt::in_tree()),
    },
    Spec {
        name: "mqtt:p256",
        about: "as `mqtt`, with P-256 as the only TLS key exchange (ECDSA P-256 certificates as always), all P-256 \
                by aws-lc-rs's assembly",
        make: || Box::new(Mqtt::in_tree().with_crypto("mqtt:p256", TlsCrypto::P256)),
    },
    Spec {
        name: "mqtt:p256-rustcrypto",
        about: "as `mqtt:p256`, every P-256 operation (key exchange, ECDSA signing and verification) by RustCrypto's \
                portable p256 0.14 on both sides",
        make: || {
            Box::new(Mqtt::in_tree().with_crypto("mqtt:p256-rustcrypto", TlsCrypto::P256RustCrypto))
        },
    },
    Spec {
        name: "mqtt:resume",
        about: "as `mqtt`, with TLS 1.3 session resumption: tickets under a key derived from the broker's key file \
                (so they outlive a restart), one session cache per device; a resumed handshake still makes an \
                X25519 on each side but no signature or verification",
        make: || Box::new(Mqtt::in_tree().resuming("mqtt:resume")),
    },
    Spec {
        name: "mqtt:early",
        about: "as `mqtt`, the client sends CONNECT right after its TLS Finished and the first PUBLISH without \
                waiting for CONNACK (MQTT 3.1.1 section 3.1.4): a first order in 3 round trips instead of 4",
        make: || Box::new(Mqtt::in_tree().pipelining("mqtt:early")),
    },
    Spec {
        name: "mqtt:fast-open",
        about: "as `mqtt:early`, with TCP Fast Open: the ClientHello rides in the SYN, no cookie asked on either \
                side, so a first order takes 2 round trips where the kernel lets servers take data in a SYN \
                (net.ipv4.tcp_fastopen with bit 2); a connection whose SYN data was not taken counts in \
                `fast_open_refused` and its run is not to be trusted",
        make: || Box::new(Mqtt::in_tree().fast_opening("mqtt:fast-open")),
    },
    Spec {
        name: "mqtt@mosquitto",
        about: "the same clients against a real mosquitto 2.x (TLS 1.3, client certificates required); it stores \
                nothing, so the workloads that need stored answers do not apply",
        make: || Box::new(Mqtt::mosquitto()),
    },
];

/// Whether this kernel lets clients send data in a SYN: a clear error before any connection if not. Whether the
/// server takes it is seen per connection (`fast_open_refused`).
fn client_fast_open() -> Result<(), TransportError> {
    let kernel = transport_core::net::fast_open::KernelSupport::read()
        .map_err(|e| TransportError::Config(format!("TCP Fast Open: {e}")))?;
    if kernel.client() {
        Ok(())
    } else {
        Err(TransportError::Config(format!(
            "TCP Fast Open: this kernel lets no client send data in a SYN (net.ipv4.tcp_fastopen = {}; \
             as root: sysctl -w net.ipv4.tcp_fastopen=3)",
            kernel.sysctl
        )))
    }
}

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
    crypto: TlsCrypto,
    /// TLS 1.3 session resumption on both sides.
    resume: bool,
    /// The client sends packets after CONNECT without waiting for CONNACK.
    early: bool,
    /// The client opens its connections with TCP Fast Open.
    fast_open: bool,
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
            crypto: TlsCrypto::Default,
            resume: false,
            early: false,
            fast_open: false,
        }
    }

    /// The in-tree broker with these settings.
    pub fn with_config(config: BrokerConfig) -> Self {
        Mqtt {
            spec: "mqtt",
            server: Server::InTree,
            config,
            crypto: TlsCrypto::Default,
            resume: false,
            early: false,
            fast_open: false,
        }
    }

    /// The same broker and clients under another spec, their TLS with the key exchange and P-256 arithmetic
    /// `crypto` names (both sides; the in-tree broker only).
    pub fn with_crypto(mut self, spec: &'static str, crypto: TlsCrypto) -> Self {
        self.spec = spec;
        self.crypto = crypto;
        self
    }

    /// The same under another spec, resuming TLS 1.3 sessions on both sides (the in-tree broker only).
    pub fn resuming(mut self, spec: &'static str) -> Self {
        self.spec = spec;
        self.resume = true;
        self
    }

    /// The same under another spec, its clients sending packets right after CONNECT without waiting for CONNACK.
    pub fn pipelining(mut self, spec: &'static str) -> Self {
        self.spec = spec;
        self.early = true;
        self
    }

    /// As [`Mqtt::pipelining`], its clients also opening their connections with TCP Fast Open.
    pub fn fast_opening(mut self, spec: &'static str) -> Self {
        self.spec = spec;
        self.early = true;
        self.fast_open = true;
        self
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
            disconnect: Support::Yes,
            pubsub: Support::Yes,
            memory,
        }
    }

    fn prepare(&self, dir: &std::path::Path, devices: u32) -> Result<(), TransportError> {
        tls::write_pki(dir, devices)
    }

    fn serve(&self, config: ServeConfig) -> BoxFuture<'static, Result<(), TransportError>> {
        let server = self.server;
        let broker_config = self.config.clone();
        let (crypto, resume, fast_open) = (self.crypto, self.resume, self.fast_open);
        Box::pin(async move {
            let public_key = tls::server_fingerprint(&config.identity)?;
            match server {
                Server::InTree => {
                    let make = if resume {
                        tls::resuming_server_config
                    } else {
                        tls::server_config_with
                    };
                    let tls = make(&config.identity, config.counters.clone(), &[], crypto)?;
                    let tcp = crate::broker::server::bind(config.listen, fast_open).await?;
                    let addr = tcp.local_addr()?;
                    // Persistent sessions live beside the orders: both are the server's durable state.
                    let broker_config = BrokerConfig {
                        state_dir: Some(config.state_dir.clone()),
                        state_syncs: config.state_syncs.clone(),
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
                    // Port 0: mosquitto's start picks a free port (again, if another process takes it first).
                    let port = config.listen.port();
                    let work = config.identity.join("mosquitto");
                    let m = Mosquitto::start(&config.identity, port, &work)
                        .await
                        .map_err(|e| TransportError::Config(e.to_string()))?;
                    // Its drops are its own count, mirrored into the server's counters.
                    let counters = config.counters.clone();
                    let socket = m.sys_socket().to_path_buf();
                    let mut sys = tokio::spawn(async move {
                        mosquitto::follow_dropped(&socket, &counters.dropped).await
                    });
                    let _ = config.ready.send(Ready {
                        addr: m.addr(),
                        public_key,
                        serving_pid: Some(m.pid()),
                    });
                    loop {
                        tokio::select! {
                            ended = &mut sys => {
                                // Without it the drops would read as zero: an error, never a zero.
                                let why = match ended {
                                    Ok(Err(e)) => e.to_string(),
                                    _ => "stopped".into(),
                                };
                                return Err(TransportError::Protocol(format!(
                                    "mosquitto's $SYS reader: {why}\n{}",
                                    m.log_tail()
                                )));
                            }
                            () = tokio::time::sleep(Duration::from_millis(200)) => {
                                if !m.is_running() {
                                    return Err(TransportError::Protocol(format!(
                                        "mosquitto exited:\n{}",
                                        m.log_tail()
                                    )));
                                }
                            }
                        }
                    }
                }
            }
        })
    }

    /// The in-tree broker's TLS operations, with its provider ([`tls::asym_costs`]); mosquitto's are OpenSSL's own,
    /// not this code's, and it counts none.
    fn asym_costs(&self) -> Option<AsymCosts> {
        match self.server {
            Server::InTree => tls::asym_costs(self.crypto),
            Server::Mosquitto => None,
        }
    }

    fn fleet(
        &self,
        config: FleetConfig,
    ) -> BoxFuture<'static, Result<Box<dyn Fleet>, TransportError>> {
        let (crypto, resume, early, fast_open) =
            (self.crypto, self.resume, self.early, self.fast_open);
        Box::pin(async move {
            if fast_open {
                client_fast_open()?;
            }
            ConnFleet::from_config(config, |server, credentials, _, counters| {
                let tls = ClientTls::with_crypto(credentials, counters.clone(), &[], crypto)?;
                let tls = if resume { tls.resuming() } else { tls };
                let connector = OrderConnector::new(server, tls).pipelining(early);
                Ok(if fast_open {
                    connector.fast_open(counters)
                } else {
                    connector
                })
            })
        })
    }

    fn watch_memory(
        &self,
        server: SocketAddr,
        identity: PathBuf,
        device: u32,
    ) -> BoxFuture<'static, Result<watch::Receiver<Option<u64>>, TransportError>> {
        let memory = self.capabilities().memory;
        Box::pin(async move {
            match memory {
                MemorySource::RssAndSysTopic(topic) => {
                    crate::sys::watch_number(server, &identity, device, topic).await
                }
                // The in-tree broker's `$SYS/broker/memory/used` is its RSS, which the runner reads itself.
                MemorySource::Rss => Err(TransportError::Unsupported(
                    "the in-tree broker publishes no heap figure, only its RSS",
                )),
            }
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
