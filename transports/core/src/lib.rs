//! The shared core of the transport benchmark suite.
//!
//! - [`transport`]: the [`Transport`] trait (server side, client [`Fleet`], capabilities) that every transport
//!   implements, and the events its links report.
//! - [`order`]: what a device sends and a server stores, and how it is identified.
//! - [`store`]: the durable, append-only, checksummed log with group commit that every server writes to, with
//!   exactly-once application and the audit the runner reads after a run.
//! - [`counters`]: asymmetric operations, handshakes, re-sends, refusals, counted where they happen.
//! - [`keys`]: key and credential files (mode 0600) and hex encoding.
//! - [`net`]: socket settings shared by the UDP transports.
//! - [`framing`]: length-prefixed orders and answers over any byte stream (QUIC streams, TLS over TCP).
//! - [`tls`]: the PKI (CA, server and device certificates) and the rustls configuration every TLS transport shares,
//!   counting asymmetric operations where they happen.
//! - [`connfleet`]: the client-side fleet of every connection-oriented transport (re-send and reconnect policy).
//! - [`quic`]: what the QUIC transports share: the protocol (one order per stream), its settings, the server's
//!   loops over connections and streams.
//! - [`process`]: starting, stopping, continuing and killing server processes, never leaving one behind.
//! - [`sample`]: CPU time and memory of a process from `/proc`.
//! - `testing` (feature `testing`): the in-process harness of the transports' end-to-end tests.

pub mod connfleet;
pub mod counters;
pub mod framing;
pub mod keys;
pub mod net;
pub mod order;
pub mod process;
pub mod quic;
pub mod sample;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;
pub mod transport;

pub use counters::{CounterSnapshot, Counters};
pub use order::{device_name, sender_id, Order, OrderId};
pub use store::{StoreError, StoreHandle, SyncPolicy};
pub use transport::{
    BoxFuture, Fleet, FleetConfig, LinkEvent, Ready, ServeConfig, Support, Transport, WorkloadKind,
};

/// Errors a transport returns to the runner.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A socket, file or process operation failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The store refused or failed a commit.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// A key, certificate or allow-list file is missing or malformed.
    #[error("identity: {0}")]
    Identity(String),
    /// A configuration value is invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// The peer broke the protocol.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The transport does not implement this operation.
    #[error("not supported: {0}")]
    Unsupported(&'static str),
}

impl TransportError {
    /// A [`Protocol`](Self::Protocol) error: `what` failed with `e`.
    pub fn protocol(what: &str, e: impl std::fmt::Display) -> Self {
        TransportError::Protocol(format!("{what}: {e}"))
    }
}
