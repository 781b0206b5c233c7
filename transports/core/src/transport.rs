//! The transport trait: the one seam between a transport and everything else.
//!
//! A transport has two sides. The **server** side runs in its own process (`runner serve`), writes every order it
//! receives into the shared [`Store`](crate::store::Store) and answers "stored" only after the store's commit. The
//! **client** side is a [`Fleet`]: the links of many devices, which may share sockets or endpoints but each keep
//! their own identity, created once per run from the files [`Transport::prepare`] wrote.
//!
//! Everything that crosses the trait is ids, sizes and times; payloads are moved, never copied per event.

use crate::counters::Counters;
use crate::order::{Order, OrderId};
use crate::store::StoreHandle;
use crate::TransportError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

/// A boxed future, as the trait's async methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The workloads the suite knows; a transport says which of them apply to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// Orders pile up while the server is stopped; timed until all are stored.
    Drain,
    /// Devices send periodically; the server is killed and started again.
    Restart,
    /// One order to each of many peers never met, over a link with a set RTT.
    FirstContact,
    /// Brand-new connections (or senders) per second.
    HandshakeRate,
    /// One publisher, many subscribers.
    Fanout,
    /// Publisher/subscriber pairs at the highest accepted rate.
    Flood,
    /// Many links opened and left idle.
    IdleLinks,
}

impl WorkloadKind {
    /// Every workload, in the order the tables list them.
    pub const ALL: [WorkloadKind; 7] = [
        WorkloadKind::Drain,
        WorkloadKind::Restart,
        WorkloadKind::FirstContact,
        WorkloadKind::HandshakeRate,
        WorkloadKind::Fanout,
        WorkloadKind::Flood,
        WorkloadKind::IdleLinks,
    ];

    /// The name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Drain => "drain",
            WorkloadKind::Restart => "restart",
            WorkloadKind::FirstContact => "first-contact",
            WorkloadKind::HandshakeRate => "handshake-rate",
            WorkloadKind::Fanout => "fanout",
            WorkloadKind::Flood => "flood",
            WorkloadKind::IdleLinks => "idle-links",
        }
    }
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WorkloadKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        WorkloadKind::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = WorkloadKind::ALL.iter().map(|w| w.name()).collect();
                format!("unknown workload `{s}` (choose from: {})", names.join(", "))
            })
    }
}

/// What the server side needs to run.
pub struct ServeConfig {
    /// Where to listen. Port 0 picks a free port; a restart passes the port the first start got.
    pub listen: SocketAddr,
    /// The directory [`Transport::prepare`] wrote: the server's key, certificates, the allowed senders.
    pub identity: PathBuf,
    /// The store every received order goes into; "stored" is answered after its commit.
    pub store: StoreHandle,
    /// Threads of the server's runtime (the same for every transport).
    pub threads: usize,
    /// Where the server counts handshakes, asymmetric operations and refusals.
    pub counters: Arc<Counters>,
    /// Allowed senders given on the command line (`NAME=KEY`, or `@FILE` for a file of such lines). Empty: the
    /// list in the identity directory. Transports that identify clients by certificate ignore it.
    pub senders: Vec<String>,
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
}

/// What the client side needs to create the links of a fleet of devices.
pub struct FleetConfig {
    /// The server (or the link emulator in front of it).
    pub server: SocketAddr,
    /// The directory [`Transport::prepare`] wrote: device credentials and what identifies the server.
    pub identity: PathBuf,
    /// How many devices; they are numbered `0..devices` and named [`device_name`](crate::order::device_name).
    pub devices: u32,
    /// Where the links report stored orders and connection changes.
    pub events: mpsc::UnboundedSender<LinkEvent>,
    /// Where the client side counts handshakes, asymmetric operations, re-sends and reconnects.
    pub counters: Arc<Counters>,
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
}

/// Whether a workload applies to a transport, and if not, why (shown in the table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// The workload applies.
    Yes,
    /// It does not; the reason is printed where the numbers would be.
    No(&'static str),
}

impl Support {
    /// What a transport that carries orders only answers: [`Support::No`] with `reason` for the publish/subscribe
    /// workloads (fan-out, flood), [`Support::Yes`] for the others.
    pub fn orders_only(workload: WorkloadKind, reason: &'static str) -> Support {
        match workload {
            WorkloadKind::Fanout | WorkloadKind::Flood => Support::No(reason),
            _ => Support::Yes,
        }
    }
}

/// One transport in one configuration (a variant such as `pure:plain`).
pub trait Transport: Send + Sync + 'static {
    /// The spec as the user gives it, e.g. `pure:plain`.
    fn spec(&self) -> &str;

    /// Whether a workload applies.
    fn supports(&self, workload: WorkloadKind) -> Support {
        let _ = workload;
        Support::Yes
    }

    /// Write the server's identity and the credentials of `devices` devices into `dir` (runner side, before the
    /// server starts). A restarted server reads the same files and is the same peer. The default writes the PKI
    /// every TLS transport uses ([`crate::tls::write_pki`]).
    fn prepare(&self, dir: &std::path::Path, devices: u32) -> Result<(), TransportError> {
        crate::tls::write_pki(dir, devices)
    }

    /// Run the server side until the process is killed or the future is dropped.
    fn serve(&self, config: ServeConfig) -> BoxFuture<'static, Result<(), TransportError>>;

    /// Create the client side: one link per device, nothing connected yet.
    fn fleet(
        &self,
        config: FleetConfig,
    ) -> BoxFuture<'static, Result<Box<dyn Fleet>, TransportError>>;
}

/// The client side of a transport: the links of many devices.
pub trait Fleet: Send + Sync {
    /// Open device `device`'s link (a handshake where the transport has one; no I/O where it has none).
    fn connect(&self, device: u32) -> BoxFuture<'_, Result<(), TransportError>>;

    /// Hand an order to a device's link. The link sends it, re-sends it and reconnects as the transport's users
    /// would configure it, and reports [`LinkEvent::Stored`] once when the server answers.
    fn send(&self, device: u32, order: Order);

    /// Orders handed over and not yet answered, across all devices.
    fn pending(&self) -> usize;

    /// Close every link and stop the fleet's tasks.
    fn close(&self) -> BoxFuture<'_, ()>;
}
