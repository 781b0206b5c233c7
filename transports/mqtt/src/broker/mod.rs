//! The in-tree MQTT 3.1.1 broker.
//!
//! - [`state`]: the broker's state, sans-IO: sessions, subscriptions, retained messages, per-session queues with
//!   their bounds, `$SYS` statistics. Every method takes the connection it acts for and, where time matters, `now`;
//!   deliveries are pulled with [`Broker::poll_transmit`], encoded into the caller's buffer.
//! - [`connection`]: one client connection's protocol, sans-IO: waiting for CONNECT, the identity rule, keepalive,
//!   the QoS 2 flows, the order sink's checks. It turns decoded packets into actions for the driver.
//! - [`journal`]: the records that describe persistent sessions (sans-IO), and [`persist`]: their snapshot and
//!   journal files in the state directory, written with `fsync` and read back at start.
//! - [`server`]: the tokio driver: TLS 1.3 (and, only when asked, plaintext) listeners, a connection bound, one reader
//!   and one writer task per connection, the store commit before PUBACK or PUBREC, the session journal made durable
//!   before what acknowledges it, the periodic `$SYS` publication.
//!
//! docs/mqtt.md lists what is supported against the sections of the specification.

pub mod connection;
pub mod journal;
pub mod persist;
pub mod server;
pub mod state;

pub use connection::{Action, Close, Connection};
pub use server::{serve, Broker as RunningBroker, BrokerConfig, Listener};
pub use state::{Broker, ClientKey, ConnId, SessionLimits, Stats};
