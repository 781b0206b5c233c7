//! The transport trait: the one seam between a transport and everything else.
//!
//! A transport has two sides. The **server** side runs in its own process (`runner serve`), commits every order it
//! receives to the shared [`OrderStore`](crate::commit::OrderStore) and answers "stored" only after the commit. The
//! **client** side is a [`Fleet`]: the links of many devices, which may share sockets or endpoints but each keep
//! their own identity, created once per run from the files [`Transport::prepare`] wrote.
//!
//! A transport declares what it can do in its [`Capabilities`]; a workload names what it [`Need`]s, and a pair that
//! does not fit is reported with the transport's own reason instead of numbers.
//!
//! Everything that crosses the trait is ids, sizes and times; payloads are moved, never copied per event.

use crate::commit::SharedStore;
use crate::counters::{AsymCosts, Counters};
use crate::order::{Order, OrderId};
use crate::TransportError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{oneshot, watch};

/// A boxed future, as the trait's async methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Whether a transport can do something, and if not, why (the reason is printed where the numbers would be).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// It can.
    Yes,
    /// It cannot, for this reason.
    No(&'static str),
}

impl Support {
    /// Whether it can.
    pub fn is_yes(self) -> bool {
        self == Support::Yes
    }
}

/// What a workload may need from a transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Need {
    /// "Stored" answers that follow the store's commit, so the audit can check every acknowledged order.
    StoredAnswers,
    /// Links opened with a handshake (TLS, QUIC).
    Handshakes,
    /// Closing one device's link for good on request ([`Fleet::disconnect`]).
    Disconnect,
    /// Publish/subscribe with a relay on the server ([`Fleet::subscribe`], [`Fleet::publish`]).
    PubSub,
}

impl Need {
    /// How the need reads in a sentence ("needs …").
    pub fn describe(self) -> &'static str {
        match self {
            Need::StoredAnswers => "durable \"stored\" answers",
            Need::Handshakes => "handshakes",
            Need::Disconnect => "closing a link on request",
            Need::PubSub => "publish/subscribe",
        }
    }
}

/// Where a server's memory is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemorySource {
    /// The resident set size of the serving process (`/proc/PID/status`).
    Rss,
    /// RSS, and the broker's own heap figure published on this `$SYS` topic (the brokers).
    RssAndSysTopic(&'static str),
}

/// What a transport can do. Each field is [`Support::Yes`] or the reason it is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// The server answers "stored" only after the store's commit.
    pub stored_answers: Support,
    /// Links are opened with a handshake.
    pub handshakes: Support,
    /// A device's link can be closed for good on request.
    pub disconnect: Support,
    /// The server relays published messages to subscribers.
    pub pubsub: Support,
    /// Where the server's memory is read from.
    pub memory: MemorySource,
}

impl Capabilities {
    /// Whether this transport can do `need`.
    pub fn can(&self, need: Need) -> Support {
        match need {
            Need::StoredAnswers => self.stored_answers,
            Need::Handshakes => self.handshakes,
            Need::Disconnect => self.disconnect,
            Need::PubSub => self.pubsub,
        }
    }

    /// The first of `needs` this transport cannot meet, with its reason; `None` if it meets them all.
    pub fn missing(&self, needs: &[Need]) -> Option<(Need, &'static str)> {
        needs.iter().find_map(|&n| match self.can(n) {
            Support::Yes => None,
            Support::No(why) => Some((n, why)),
        })
    }
}

/// What the server side needs to run.
pub struct ServeConfig {
    /// Where to listen. Port 0 picks a free port; a restart passes the port the first start got.
    pub listen: SocketAddr,
    /// The directory [`Transport::prepare`] wrote: the server's key, certificates, the allowed senders.
    pub identity: PathBuf,
    /// Where every received order is committed; "stored" is answered after the commit.
    pub store: SharedStore,
    /// A directory for the server's own durable state, which lives and dies with the store (the store's directory:
    /// MQTT's persistent sessions are kept there).
    pub state_dir: PathBuf,
    /// Where the server counts handshakes, asymmetric operations and refusals.
    pub counters: Arc<Counters>,
    /// Where the server records the time of every sync of its own state in `state_dir` (nothing for a server that
    /// keeps none).
    pub state_syncs: Arc<crate::commit::StateSyncs>,
    /// Send once when listening: the bound address and the public key or certificate fingerprint.
    pub ready: oneshot::Sender<Ready>,
}

/// What a server reports when it is listening.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ready {
    /// The bound address.
    pub addr: SocketAddr,
    /// The server's public key (hex) or certificate fingerprint.
    pub public_key: String,
    /// The process that does the serving, when it is not the one that reports ready (an external broker started as
    /// a child): its CPU and memory are what the runner samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving_pid: Option<u32>,
}

impl Ready {
    /// A server listening on `addr` that serves in its own process.
    pub fn new(addr: SocketAddr, public_key: String) -> Ready {
        Ready {
            addr,
            public_key,
            serving_pid: None,
        }
    }
}

/// What the client side needs to create the links of a fleet of devices.
pub struct FleetConfig {
    /// The server (or the link emulator in front of it).
    pub server: SocketAddr,
    /// The directory [`Transport::prepare`] wrote: device credentials and what identifies the server.
    pub identity: PathBuf,
    /// The first device of this fleet: a fleet may run a slice of a run's devices (a load generator split over
    /// several processes), numbered `first..first + devices` everywhere (credentials, names, [`Fleet`] calls,
    /// [`LinkEvent`]s). 0 for a fleet of every device.
    pub first: u32,
    /// How many devices; they are numbered `first..first + devices` and named
    /// [`device_name`](crate::order::device_name).
    pub devices: u32,
    /// Where the links report stored orders, deliveries and connection changes.
    pub events: crate::events::EventSender,
    /// Where the client side counts handshakes, asymmetric operations, re-sends and reconnects.
    pub counters: Arc<Counters>,
}

/// How hard a transport tries to deliver a published message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum QoS {
    /// At most once: sent, never acknowledged or re-sent (MQTT QoS 0, a QUIC datagram or unanswered stream).
    #[serde(rename = "0")]
    AtMostOnce,
    /// At least once: acknowledged, re-sent until it is (MQTT QoS 1).
    #[serde(rename = "1")]
    AtLeastOnce,
}

impl QoS {
    /// 0 or 1, as MQTT numbers it.
    pub fn level(self) -> u8 {
        match self {
            QoS::AtMostOnce => 0,
            QoS::AtLeastOnce => 1,
        }
    }
}

impl fmt::Display for QoS {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QoS {}", self.level())
    }
}

/// A message to publish: ids, sizes and times; the fleet makes the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Publish {
    /// The channel (an MQTT topic `bench/<channel>`; a relay's subscription key).
    pub channel: u32,
    /// The message's id, unique within a run; it travels in the payload and comes back in [`LinkEvent::Delivered`].
    pub id: u64,
    /// How hard to try.
    pub qos: QoS,
    /// Bytes of payload (at least 8: the id travels in it).
    pub size: u32,
}

/// What the links of a fleet report.
#[derive(Debug, Clone, PartialEq)]
pub enum LinkEvent {
    /// The server answered that the order is stored (reported once per order).
    Stored {
        /// The device whose order it was.
        device: u32,
        /// The order.
        id: OrderId,
        /// When the answer arrived.
        at: Instant,
    },
    /// A device's link was (re)established: a handshake completed. Transports without handshakes never send it.
    Connected {
        /// The device.
        device: u32,
        /// When.
        at: Instant,
    },
    /// A published message left the publisher: acknowledged by the server (QoS 1), or handed to the socket (QoS 0).
    Accepted {
        /// The publishing device.
        device: u32,
        /// The message's id.
        id: u64,
        /// When.
        at: Instant,
    },
    /// A subscriber received a published message (reported once per subscriber and message).
    Delivered {
        /// The subscribing device.
        device: u32,
        /// The message's id.
        id: u64,
        /// When it arrived.
        at: Instant,
    },
    /// A device's link was lost without being asked to close (reported by the transports that keep links).
    Lost {
        /// The device.
        device: u32,
        /// When.
        at: Instant,
    },
}

/// One variant a transport crate provides, as `runner list` shows it and `--transport` names it.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The spec on the command line, e.g. `pure:plain`.
    pub name: &'static str,
    /// One line on what it is.
    pub about: &'static str,
    /// The transport in this configuration.
    pub make: fn() -> Box<dyn Transport>,
}

/// One transport in one configuration (a variant such as `pure:plain`).
pub trait Transport: Send + Sync + 'static {
    /// The spec as the user gives it, e.g. `pure:plain`.
    fn spec(&self) -> &str;

    /// What this transport can do.
    fn capabilities(&self) -> Capabilities;

    /// Write the server's identity and the credentials of `devices` devices into `dir` (runner side, before the
    /// server starts). A restarted server reads the same files and is the same peer.
    fn prepare(&self, dir: &std::path::Path, devices: u32) -> Result<(), TransportError>;

    /// Run the server side until the process is killed or the future is dropped.
    fn serve(&self, config: ServeConfig) -> BoxFuture<'static, Result<(), TransportError>>;

    /// Create the client side: one link per device, nothing connected yet.
    fn fleet(
        &self,
        config: FleetConfig,
    ) -> BoxFuture<'static, Result<Box<dyn Fleet>, TransportError>>;

    /// Measure here, in about a quarter of a second, what one asymmetric operation of each kind the server counts
    /// costs, with the code the server calls for it; `None` where the server's operations are not this code's (an
    /// external broker) or it does none.
    fn asym_costs(&self) -> Option<AsymCosts> {
        None
    }

    /// Follow the memory figure the server publishes of itself, where it publishes one
    /// ([`MemorySource::RssAndSysTopic`]): a plain client with the credentials of device `device` of `identity`
    /// (prepared, and used by no link) reads it from the server at `server`. The receiver holds its latest value in
    /// bytes (`None` until the first arrives); the client leaves when the receiver is dropped, and the sender is
    /// dropped if the figure can no longer be read.
    fn watch_memory(
        &self,
        server: SocketAddr,
        identity: PathBuf,
        device: u32,
    ) -> BoxFuture<'static, Result<watch::Receiver<Option<u64>>, TransportError>> {
        let _ = (server, identity, device);
        Box::pin(async {
            Err(TransportError::Unsupported(
                "the server publishes no memory figure of its own",
            ))
        })
    }
}

/// The client side of a transport: the links of many devices.
pub trait Fleet: Send + Sync {
    /// Open device `device`'s link (a handshake where the transport has one; no I/O where it has none).
    fn connect(&self, device: u32) -> BoxFuture<'_, Result<(), TransportError>>;

    /// Hand an order to a device's link. The link sends it, re-sends it and reconnects as the transport's users
    /// would configure it, and reports [`LinkEvent::Stored`] once when the server answers.
    fn send(&self, device: u32, order: Order);

    /// Hand a device's backlog over at once: the same as [`send`](Fleet::send) for each order, in order. A fleet
    /// whose devices take commands one at a time takes the backlog as one, so a large backlog costs the devices
    /// one hand-over rather than one per order.
    fn send_all(&self, device: u32, orders: Vec<Order>) {
        for order in orders {
            self.send(device, order);
        }
    }

    /// Orders handed over and not yet answered, across all devices.
    fn pending(&self) -> usize;

    /// Close device `device`'s link for good, politely (the transport's own goodbye), dropping what it has not
    /// sent; resolves when the link is closed. A later [`connect`](Fleet::connect) or order opens a new link.
    fn disconnect(&self, device: u32) -> BoxFuture<'_, Result<(), TransportError>> {
        let _ = device;
        Box::pin(async { Err(TransportError::Unsupported("closing a link on request")) })
    }

    /// Subscribe device `device` to `channel` at `qos`; resolves when the server has confirmed it.
    fn subscribe(
        &self,
        device: u32,
        channel: u32,
        qos: QoS,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        let _ = (device, channel, qos);
        Box::pin(async { Err(TransportError::Unsupported("publish/subscribe")) })
    }

    /// Publish a message from device `device`; the link reports [`LinkEvent::Accepted`] when it has left, and each
    /// subscriber [`LinkEvent::Delivered`] when it arrives.
    fn publish(&self, device: u32, message: Publish) {
        let _ = (device, message);
    }

    /// Published messages handed over and not yet [`LinkEvent::Accepted`], across all devices.
    fn publishing(&self) -> usize {
        0
    }

    /// Close every link and stop the fleet's tasks.
    fn close(&self) -> BoxFuture<'_, ()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_missing_need_is_named_with_its_reason() {
        let caps = Capabilities {
            stored_answers: Support::Yes,
            handshakes: Support::No("no handshake"),
            disconnect: Support::Yes,
            pubsub: Support::No("no relay"),
            memory: MemorySource::Rss,
        };
        assert_eq!(caps.missing(&[Need::StoredAnswers, Need::Disconnect]), None);
        assert_eq!(
            caps.missing(&[Need::StoredAnswers, Need::PubSub, Need::Handshakes]),
            Some((Need::PubSub, "no relay"))
        );
        assert!(caps.can(Need::StoredAnswers).is_yes());
    }
}
