//! What the connection transports (quinn, s2n-quic, MQTT) share, written once.
//!
//! - [`fleet`]: the client side of every connection transport: one [`Fleet`](transport_core::Fleet) generic over a
//!   small [`Connector`](fleet::Connector), with the re-send and reconnect policy their users would configure.
//! - [`quic`]: what the QUIC transports share: the protocol (one order per stream), its settings, the server's
//!   loops over connections and streams.
//! - [`relay`]: publish/subscribe for the QUIC servers: the frames, the relay's bounded queues (sans-IO), its
//!   server sessions and the device's side.
//! - `testing` (feature `testing`): the in-process harness of the transports' end-to-end tests and the
//!   conformance checks every transport's tests run.

pub mod fleet;
pub mod quic;
pub mod relay;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
