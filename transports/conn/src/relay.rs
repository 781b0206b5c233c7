//! Publish/subscribe for the servers that are not brokers (quinn, s2n-quic): the server keeps each subscribed
//! device's connection and relays every published message to each subscriber, by the same rules as the MQTT broker.
//!
//! # On the wire ([`wire`])
//!
//! Relay frames share the order frames' length-prefixed framing; the first frame of a stream says what it is.
//!
//! - **A subscription** is a bidirectional stream the device opens with `Subscribe {channel, qos}`; the server
//!   answers `Subscribed` and then writes the subscription's deliveries on its half: `Deliver0 {payload}` for QoS
//!   0, which the device never answers, and `Deliver1 {seq, payload}` for QoS 1, which the device acknowledges
//!   with `Ack {seq}` on its half after handing the message over.
//! - **Publishing** is one bidirectional stream per connection, opened at the first publish: `Publish {qos,
//!   channel, id, payload}` frames; the server answers a QoS 1 one with `Accepted {id}` once it is queued for every
//!   subscriber (as an MQTT broker's PUBACK), a QoS 0 one not at all.
//!
//! Why QoS 0 travels on a stream the subscriber does not answer rather than in QUIC datagrams: a datagram can be
//! lost without either side knowing (quinn and s2n-quic drop datagrams when their datagram buffers are full, on
//! sending and on receiving), and a loss the server cannot see cannot be counted; the suite's promise is that every
//! message is delivered or counted as dropped. On a stream, what the server writes arrives or the connection fails;
//! what it cannot write in time (the stream's flow control is full: the subscriber is slow) waits in a bounded
//! queue and beyond it is dropped and counted. One stream per subscription (not per message) keeps the cost per
//! message to a frame, and gives each subscription its own flow control, so one slow subscriber never holds up
//! another.
//!
//! # Semantics ([`state`])
//!
//! A subscription belongs to (device, channel) and outlives its stream, as an MQTT persistent session does: QoS 1
//! deliveries not yet acknowledged are written again on the device's next subscription stream (it subscribes again
//! on every new connection), so each is delivered at least once across a dropped connection, and the device's
//! fleet reports it once. Back-pressure and the bounds: [`RelayLimits`]. QoS 0 messages for a device whose
//! connection is gone are not queued (and not counted as dropped), as for an MQTT client that is away.
//!
//! [`server`] serves the two kinds of stream over any byte-stream halves; [`client`] is the device's side. What
//! stays in each QUIC transport is opening a stream and finishing or resetting one.

pub mod client;
pub mod server;
pub mod state;
pub mod wire;

pub use client::RelayClient;
pub use server::RelayServer;
pub use state::RelayLimits;
