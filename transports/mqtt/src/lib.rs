//! MQTT 3.1.1 over TLS 1.3 for the transport suite: the in-tree broker with the order sink, the client side, and
//! a real mosquitto as the reference peer.
//!
//! - [`codec`]: every MQTT 3.1.1 packet, sans-IO: check a frame, decode it (rejecting what the specification
//!   forbids), encode into a buffer.
//! - [`topic`]: topic names and filters, `+`/`#` matching, the subscription tree.
//! - [`broker`]: the broker's state and per-connection protocol (sans-IO, tested with a virtual clock; QoS 0, 1 and
//!   2), the journal of its persistent sessions and their files, and its tokio driver (TLS 1.3 with client
//!   certificates, bounded connections and queues, `$SYS` statistics, the order sink).
//! - [`client`]: one MQTT connection over a byte stream, and the connector that lets `connfleet` run a fleet of
//!   devices, each with its own TLS connection, certificate and session.
//! - [`transport`](mod@transport): the `mqtt` and `mqtt@mosquitto` transports for the suite's trait.
//! - [`mosquitto`]: starts a real mosquitto with a generated configuration, never leaving it behind.
//! - [`sys`]: reads a broker's numeric `$SYS` figure (mosquitto's heap) as a plain client.
//!
//! docs/mqtt.md says what the broker supports, statement by statement of the specification (`tests/normative.rs`).

pub mod broker;
pub mod client;
pub mod codec;
pub mod mosquitto;
pub mod sys;
pub mod topic;
pub mod transport;

pub use transport::{Mqtt, SPECS};
