//! The client side: one s2n-quic client endpoint (one UDP socket) shared by every device of a fleet, one connection
//! per device with that device's own certificate ([`crate::tls::DeviceTls`]), one bidirectional stream per order,
//! publish/subscribe through the relay's streams ([`transport_conn::relay`]). Re-sending and reconnecting are the
//! shared connection fleet's
//! ([`ConnFleet`](transport_conn::fleet::ConnFleet)).

use crate::events::{Events, Side};
use crate::tls::{self, PrepareDevice};
use crate::{start_error, Provider};
use futures::future::{FutureExt, Shared};
use s2n_quic::client::Connect;
use s2n_quic::connection::Handle;
use s2n_quic::provider::limits::Limits;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use transport_conn::fleet::{Answer, Connector, Deliveries, SubAck};
use transport_conn::quic;
use transport_conn::relay::client::{OpenStream, RecvHalf, SendHalf};
use transport_conn::relay::RelayClient;
use transport_core::net;
use transport_core::{BoxFuture, Counters, Order, Publish, QoS, TransportError};
use transport_tls::DeviceCredentials;

/// One device's live connection: a handle to open streams on, a future that resolves when it closes, and its relay
/// streams.
pub struct S2nConn {
    handle: Handle,
    closed: Shared<BoxFuture<'static, ()>>,
    relay: RelayClient,
    frames: quic::OrderFrames,
}

/// Opens bidirectional streams on `conn` for the relay (and for tests that speak the relay protocol by hand).
pub fn opener(conn: &S2nConn) -> OpenStream {
    opener_on(&conn.handle)
}

fn opener_on(handle: &Handle) -> OpenStream {
    let handle = handle.clone();
    Arc::new(move || {
        let mut handle = handle.clone();
        Box::pin(async move {
            let stream = handle
                .open_bidirectional_stream()
                .await
                .map_err(|e| TransportError::protocol("open stream", e))?;
            let (recv, send) = stream.split();
            Ok((Box::new(recv) as RecvHalf, Box::new(send) as SendHalf))
        })
    })
}

/// How many bytes of received datagrams the fleet's endpoint takes in per wake-up: s2n-quic's receive queue
/// between its socket task and its endpoint (4 GRO buffers of 64 KiB; s2n-quic's default is 8 MiB).
///
/// The endpoint handles everything in its queue before it sends anything and before the devices' tasks run. With
/// the default, one wake-up of the fleet's one endpoint took in every device's answers at once and the devices then
/// sent all their next orders at once: the fleet and the server passed the whole window of 128 devices (12,800
/// orders) back and forth in waves, each process idle while the other worked (both about two-thirds busy in the
/// drain). Devices with their own sockets never move in step like that; with a queue this size the fleet takes in,
/// answers and sends in small batches, and both sides stay busy. The datagrams that do not fit wait in the socket's
/// own buffer ([`quic::CLIENT_SOCKET_BUFFER`]). The server keeps s2n-quic's default (docs/s2n-quic.md, "Settings").
pub const FLEET_RECEIVE_QUEUE: usize = 256 << 10;

/// Opens devices' s2n-quic connections for the connection fleet ([`transport_conn::fleet`]).
pub struct S2nConnector {
    client: s2n_quic::Client,
    server: SocketAddr,
    devices: Arc<dyn PrepareDevice>,
}

impl std::fmt::Debug for S2nConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S2nConnector")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// Start an s2n-quic client endpoint with the given TLS provider (a macro because each provider makes the
/// builder a different type).
macro_rules! start_client {
    ($tls:expr, $io:expr, $limits:expr, $events:expr) => {
        s2n_quic::Client::builder()
            .with_tls($tls)
            .map_err(|e| start_error("TLS", e))?
            .with_io($io)
            .map_err(|e| start_error("I/O", e))?
            .with_limits($limits)
            .map_err(|e| start_error("limits", e))?
            .with_event($events)
            .map_err(|e| start_error("events", e))?
            .start()
            .map_err(|e| start_error("client", e))?
    };
}

impl S2nConnector {
    /// A client endpoint on an ephemeral port of the server's address family, for `devices` devices whose
    /// credentials are `credentials` (the CA is read from `identity`), counting into `counters`. Must be called
    /// inside a tokio runtime.
    pub fn new(
        provider: Provider,
        server: SocketAddr,
        identity: &Path,
        credentials: Arc<DeviceCredentials>,
        devices: u32,
        counters: Arc<Counters>,
    ) -> Result<Self, TransportError> {
        let socket = net::bind_udp(net::any_port_for(server), quic::CLIENT_SOCKET_BUFFER)?;
        let io = s2n_quic::provider::io::tokio::Builder::default()
            .with_rx_socket(socket)
            .and_then(|b| b.with_internal_recv_buffer_size(FLEET_RECEIVE_QUEUE))
            .and_then(|b| b.build())?;
        // s2n-quic pings after the smaller of this and 3/4 of the idle timeout without activity. A device opens as
        // many streams at once as the server allows (the fleet keeps its orders to its window): s2n-quic's own limit
        // on the streams it opens would otherwise stop it at 100 while answered streams wait to be closed.
        let limits = Limits::new()
            .with_max_keep_alive_period(quic::KEEP_ALIVE)
            .and_then(|l| {
                l.with_max_open_local_bidirectional_streams(u64::from(quic::SERVER_STREAMS))
            })
            .map_err(|e| start_error("limits", e))?;
        let anchor = if provider.derives_asym_ops() {
            Some(tls::trust_anchor(identity)?)
        } else {
            None
        };
        let events = Events::new(Side::Client, counters.clone(), anchor);
        let (client, devices) = match provider {
            Provider::S2nTls => {
                let (tls, devices) = tls::s2n_tls_devices(identity, credentials, devices)?;
                (start_client!(tls, io, limits, events), devices)
            }
            Provider::Rustls => {
                let (tls, devices) = tls::rustls_devices(identity, credentials, devices, counters)?;
                (start_client!(tls, io, limits, events), devices)
            }
        };
        Ok(Self {
            client,
            server,
            devices,
        })
    }

    /// The address of the shared client socket.
    pub fn local_addr(&self) -> Result<SocketAddr, TransportError> {
        Ok(self.client.local_addr()?)
    }
}

impl Connector for S2nConnector {
    type Conn = S2nConn;

    fn connect(&self, device: u32) -> BoxFuture<'_, Result<S2nConn, TransportError>> {
        Box::pin(async move {
            // Build the device's TLS endpoint here, so a bad credential is this attempt's error.
            self.devices.prepare(device)?;
            let connect =
                Connect::new(self.server).with_server_name(tls::device_server_name(device));
            let mut conn = self
                .client
                .connect(connect)
                .await
                .map_err(|e| TransportError::protocol("handshake", e))?;
            conn.keep_alive(true)
                .map_err(|e| TransportError::protocol("keep-alive", e))?;
            let (handle, mut acceptor) = conn.split();
            // The server never opens streams, so the acceptor only ever answers when the connection is gone.
            let closed: BoxFuture<'static, ()> =
                Box::pin(async move { while let Ok(Some(_)) = acceptor.accept().await {} });
            let relay = RelayClient::new(opener_on(&handle));
            Ok(S2nConn {
                handle,
                closed: closed.shared(),
                relay,
                frames: quic::OrderFrames::default(),
            })
        })
    }

    fn send_order(
        &self,
        conn: &S2nConn,
        order: &Order,
    ) -> BoxFuture<'static, Result<Answer, TransportError>> {
        let mut handle = conn.handle.clone();
        let frame = conn.frames.frame(order);
        Box::pin(async move {
            let stream = handle
                .open_bidirectional_stream()
                .await
                .map_err(|e| TransportError::protocol("open stream", e))?;
            let (mut recv, mut send) = stream.split();
            send.send(frame)
                .await
                .map_err(|e| TransportError::protocol("write", e))?;
            // Finished by its drop: s2n-quic finishes a send stream dropped open in the request that releases it,
            // where `finish` was one request and the drop, still finishing, another.
            drop(send);
            quic::read_answer(&mut recv).await
        })
    }

    fn window(&self) -> usize {
        quic::STREAMS_PER_CONNECTION
    }

    fn closed(&self, conn: &S2nConn) -> BoxFuture<'static, ()> {
        Box::pin(conn.closed.clone())
    }

    fn close(&self, conn: S2nConn) {
        conn.handle.close(0u8.into());
    }

    /// As quinn's: CONNECTION_CLOSE with application code 0 (no error), immediate; the server drains the
    /// connection on receipt (RFC 9000, 10.2).
    fn disconnect(&self, conn: S2nConn) -> BoxFuture<'static, Result<(), TransportError>> {
        conn.handle.close(0u8.into());
        Box::pin(async { Ok(()) })
    }

    fn subscribe(
        &self,
        conn: &S2nConn,
        channel: u32,
        qos: QoS,
    ) -> BoxFuture<'static, Result<SubAck, TransportError>> {
        conn.relay.subscribe(channel, qos)
    }

    fn publish(
        &self,
        conn: &S2nConn,
        message: &Publish,
        _again: bool,
    ) -> BoxFuture<'static, Result<(), TransportError>> {
        conn.relay.publish(message)
    }

    fn deliveries(&self, conn: &mut S2nConn) -> Option<Deliveries> {
        conn.relay.deliveries()
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            // Let the close frames go out, but never wait on a dead server for long.
            let mut client = self.client.clone();
            let _ = tokio::time::timeout(Duration::from_secs(1), client.wait_idle()).await;
        })
    }
}
