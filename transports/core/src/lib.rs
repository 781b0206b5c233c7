//! The core of the transport benchmark suite: what every transport needs, and nothing more.
//!
//! - [`transport`]: the [`Transport`] trait (server side, client [`Fleet`], [`Capabilities`]) that every transport
//!   implements, and the events its links report.
//! - [`events`]: the channel a fleet's links report their events on, one at a time or in batches.
//! - [`order`]: what a device sends and a server stores, and how it is identified.
//! - [`ordered`]: a sorted ring, for tables of keys that mostly arrive in order and leave oldest first.
//! - [`commit`]: the [`OrderStore`](commit::OrderStore) a server commits orders to before it answers "stored"
//!   (implemented by the `transport-store` crate).
//! - [`counters`]: asymmetric operations, handshakes, re-sends, refusals, counted where they happen.
//! - [`keys`]: key and credential files (mode 0600) and hex encoding.
//! - [`net`]: socket settings shared by the UDP transports.
//! - [`procfs`]: what a process costs (CPU, memory), read from the kernel.
//! - [`framing`]: length-prefixed orders and answers over any byte stream (QUIC streams, TLS over TCP).
//!
//! The other shared pieces live in crates of their own, so a transport depends only on what it uses:
//! `transport-store` (the durable store), `transport-tls` (PKI and the counting rustls provider), `transport-conn`
//! (the client fleet of connection transports, QUIC serving, the conformance checks).

pub mod commit;
pub mod counters;
pub mod events;
pub mod framing;
pub mod keys;
pub mod net;
pub mod order;
pub mod ordered;
pub mod prefetch;
pub mod procfs;
pub mod transport;

pub use commit::{CommitError, OrderStore, Outcome, SharedStore, StateSyncs};
pub use counters::{AsymCosts, CounterSnapshot, Counters};
pub use order::{device_name, device_sender_id, sender_id, Order, OrderId, MAX_PAYLOAD};
pub use transport::{
    BoxFuture, Capabilities, Fleet, FleetConfig, LinkEvent, MemorySource, Need, Publish, QoS,
    Ready, ServeConfig, Spec, Support, Transport,
};

/// Errors a transport returns to the runner.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A socket, file or process operation failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The store refused or failed a commit.
    #[error("store: {0}")]
    Store(#[from] CommitError),
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
