//! The client side: one quinn endpoint (one UDP socket) shared by every device of a fleet, one connection per device
//! with that device's own certificate, one bidirectional stream per order, publish/subscribe through the relay's
//! streams ([`transport_conn::relay`]). Re-sending and reconnecting are the shared connection fleet's
//! ([`ConnFleet`](transport_conn::fleet::ConnFleet)).

use crate::resume::ObservedClient;
use quinn::crypto::rustls::QuicClientConfig;
use quinn::{Connection, Endpoint, VarInt};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use transport_conn::fleet::{Answer, Connector, Deliveries, SubAck};
use transport_conn::quic;
use transport_conn::relay::client::{OpenStream, RecvHalf, SendHalf};
use transport_conn::relay::RelayClient;
use transport_core::net;
use transport_core::{BoxFuture, Counters, Order, Publish, QoS, TransportError};
use transport_tls::{ClientTls, DeviceCredentials, TlsCrypto, SERVER_NAME};

/// Opens devices' quinn connections for the connection fleet ([`transport_conn::fleet`]).
pub struct QuinnConnector {
    endpoint: Endpoint,
    server: SocketAddr,
    tls: ClientTls,
    transport: Arc<quinn::TransportConfig>,
    /// Each device's quinn client config, built at its first connection and kept (a device loads its key once).
    configs: Box<[OnceLock<quinn::ClientConfig>]>,
}

impl std::fmt::Debug for QuinnConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuinnConnector")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl QuinnConnector {
    /// A client endpoint on an ephemeral port of the server's address family, for `devices` devices whose
    /// credentials are `credentials`, counting into `counters`. Must be called inside a tokio runtime.
    pub fn new(
        server: SocketAddr,
        credentials: Arc<DeviceCredentials>,
        devices: u32,
        counters: Arc<Counters>,
    ) -> Result<Self, TransportError> {
        Self::with_crypto(server, credentials, devices, counters, TlsCrypto::Default)
    }

    /// [`new`](Self::new), with the devices' TLS using the key exchange and P-256 arithmetic `crypto` names.
    pub fn with_crypto(
        server: SocketAddr,
        credentials: Arc<DeviceCredentials>,
        devices: u32,
        counters: Arc<Counters>,
        crypto: TlsCrypto,
    ) -> Result<Self, TransportError> {
        Self::with_tls(server, credentials, devices, counters, crypto, false)
    }

    /// [`with_crypto`](Self::with_crypto), each device resuming its TLS sessions if `resume` (its own session
    /// cache, in the config it keeps; resumed handshakes observed, [`crate::resume`]).
    pub fn with_tls(
        server: SocketAddr,
        credentials: Arc<DeviceCredentials>,
        devices: u32,
        counters: Arc<Counters>,
        crypto: TlsCrypto,
        resume: bool,
    ) -> Result<Self, TransportError> {
        let tls = ClientTls::with_crypto(credentials, counters, &[quic::ALPN], crypto)?;
        let tls = if resume { tls.resuming() } else { tls };
        let socket = net::bind_udp(net::any_port_for(server), quic::CLIENT_SOCKET_BUFFER)?;
        let endpoint = Endpoint::new(
            quinn::EndpointConfig::default(),
            None,
            socket,
            Arc::new(quinn::TokioRuntime),
        )?;
        Ok(Self {
            endpoint,
            server,
            tls,
            transport: Arc::new(crate::transport_config(true)),
            configs: (0..devices).map(|_| OnceLock::new()).collect(),
        })
    }

    /// The address of the shared client socket.
    pub fn local_addr(&self) -> Result<SocketAddr, TransportError> {
        Ok(self.endpoint.local_addr()?)
    }

    fn client_config(&self, device: u32) -> Result<quinn::ClientConfig, TransportError> {
        let slot = self
            .configs
            .get(device as usize)
            .ok_or_else(|| TransportError::Config(format!("no device {device} in this fleet")))?;
        if let Some(config) = slot.get() {
            return Ok(config.clone());
        }
        let crypto: Arc<dyn quinn::crypto::ClientConfig> = Arc::new(
            QuicClientConfig::try_from(self.tls.config(device)?)
                .map_err(|e| TransportError::Config(e.to_string()))?,
        );
        let crypto = if self.tls.resumes() {
            Arc::new(ObservedClient(crypto))
        } else {
            crypto
        };
        let mut config = quinn::ClientConfig::new(crypto);
        config.transport_config(self.transport.clone());
        Ok(slot.get_or_init(|| config).clone())
    }
}

/// One device's live connection and its relay streams.
#[derive(Debug)]
pub struct QuinnConn {
    /// The connection.
    pub conn: Connection,
    relay: RelayClient,
    frames: quic::OrderFrames,
}

/// Opens bidirectional streams on `conn` for the relay (and for tests that speak the relay protocol by hand).
pub fn opener(conn: &Connection) -> OpenStream {
    let conn = conn.clone();
    Arc::new(move || {
        let conn = conn.clone();
        Box::pin(async move {
            let (send, recv) = conn
                .open_bi()
                .await
                .map_err(|e| TransportError::protocol("open stream", e))?;
            Ok((Box::new(recv) as RecvHalf, Box::new(send) as SendHalf))
        })
    })
}

impl Connector for QuinnConnector {
    type Conn = QuinnConn;

    fn connect(&self, device: u32) -> BoxFuture<'_, Result<QuinnConn, TransportError>> {
        Box::pin(async move {
            let config = self.client_config(device)?;
            let connecting = self
                .endpoint
                .connect_with(config, self.server, SERVER_NAME)
                .map_err(|e| TransportError::Config(e.to_string()))?;
            let conn = connecting
                .await
                .map_err(|e| TransportError::protocol("handshake", e))?;
            let relay = RelayClient::new(opener(&conn));
            Ok(QuinnConn {
                conn,
                relay,
                frames: quic::OrderFrames::default(),
            })
        })
    }

    fn send_order(
        &self,
        conn: &QuinnConn,
        order: &Order,
    ) -> BoxFuture<'static, Result<Answer, TransportError>> {
        let frame = conn.frames.frame(order);
        let conn = conn.conn.clone();
        Box::pin(async move {
            let (mut send, mut recv) = conn
                .open_bi()
                .await
                .map_err(|e| TransportError::protocol("open stream", e))?;
            // Handed over as it is: quinn queues the frame without copying it (`write_all` would).
            send.write_chunk(frame)
                .await
                .map_err(|e| TransportError::protocol("write", e))?;
            // Finished by its drop (quinn finishes a send stream dropped open): one lock of the connection where
            // `finish` and then the drop took two.
            drop(send);
            quic::read_answer(&mut recv).await
        })
    }

    fn resumed(&self, conn: &QuinnConn) -> bool {
        crate::resume::resumed(&conn.conn)
    }

    fn window(&self) -> usize {
        quic::STREAMS_PER_CONNECTION
    }

    fn closed(&self, conn: &QuinnConn) -> BoxFuture<'static, ()> {
        let conn = conn.conn.clone();
        Box::pin(async move {
            conn.closed().await;
        })
    }

    fn close(&self, conn: QuinnConn) {
        conn.conn.close(VarInt::from_u32(0), b"");
    }

    fn subscribe(
        &self,
        conn: &QuinnConn,
        channel: u32,
        qos: QoS,
    ) -> BoxFuture<'static, Result<SubAck, TransportError>> {
        conn.relay.subscribe(channel, qos)
    }

    fn publish(
        &self,
        conn: &QuinnConn,
        message: &Publish,
        _again: bool,
    ) -> BoxFuture<'static, Result<(), TransportError>> {
        conn.relay.publish(message)
    }

    fn deliveries(&self, conn: &mut QuinnConn) -> Option<Deliveries> {
        conn.relay.deliveries()
    }

    /// QUIC has no orderly two-way shutdown to wait for: the device sends CONNECTION_CLOSE with application code 0
    /// (no error) and is done; the server drains the connection on receipt (RFC 9000, 10.2). The close is
    /// immediate, so it cannot fail; `closed()` resolves at once for a connection closed here.
    fn disconnect(&self, conn: QuinnConn) -> BoxFuture<'static, Result<(), TransportError>> {
        conn.conn.close(VarInt::from_u32(0), b"");
        Box::pin(async move {
            conn.conn.closed().await;
            Ok(())
        })
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.endpoint.close(VarInt::from_u32(0), b"");
            // Let the close frames go out, but never wait on a dead server for long.
            let _ = tokio::time::timeout(Duration::from_secs(1), self.endpoint.wait_idle()).await;
        })
    }
}
