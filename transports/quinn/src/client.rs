//! The client side: one quinn endpoint (one UDP socket) shared by every device of a fleet, one connection per device
//! with that device's own certificate, one bidirectional stream per order. Re-sending and reconnecting are the shared
//! connection fleet's
//! ([`ConnFleet`](transport_conn::fleet::ConnFleet)).

use bytes::BytesMut;
use quinn::crypto::rustls::QuicClientConfig;
use quinn::{Connection, Endpoint, VarInt};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use transport_conn::fleet::{Answer, Connector};
use transport_conn::quic;
use transport_core::{framing, net};
use transport_core::{BoxFuture, Counters, Order, TransportError};
use transport_tls::{ClientTls, DeviceCredentials, SERVER_NAME};

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
            tls: ClientTls::new(credentials, counters, &[quic::ALPN])?,
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
        let crypto = QuicClientConfig::try_from(self.tls.config(device)?)
            .map_err(|e| TransportError::Config(e.to_string()))?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        config.transport_config(self.transport.clone());
        Ok(slot.get_or_init(|| config).clone())
    }
}

impl Connector for QuinnConnector {
    type Conn = Connection;

    fn connect(&self, device: u32) -> BoxFuture<'_, Result<Connection, TransportError>> {
        Box::pin(async move {
            let config = self.client_config(device)?;
            let connecting = self
                .endpoint
                .connect_with(config, self.server, SERVER_NAME)
                .map_err(|e| TransportError::Config(e.to_string()))?;
            connecting
                .await
                .map_err(|e| TransportError::protocol("handshake", e))
        })
    }

    fn send_order(
        &self,
        conn: &Connection,
        order: &Order,
    ) -> BoxFuture<'static, Result<Answer, TransportError>> {
        let conn = conn.clone();
        let mut frame = BytesMut::new();
        framing::encode_order(order, &mut frame);
        Box::pin(async move {
            let (mut send, mut recv) = conn
                .open_bi()
                .await
                .map_err(|e| TransportError::protocol("open stream", e))?;
            send.write_all(&frame)
                .await
                .map_err(|e| TransportError::protocol("write", e))?;
            let _ = send.finish();
            quic::read_answer(&mut recv).await
        })
    }

    fn closed(&self, conn: &Connection) -> BoxFuture<'static, ()> {
        let conn = conn.clone();
        Box::pin(async move {
            conn.closed().await;
        })
    }

    fn close(&self, conn: Connection) {
        conn.close(VarInt::from_u32(0), b"");
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.endpoint.close(VarInt::from_u32(0), b"");
            // Let the close frames go out, but never wait on a dead server for long.
            let _ = tokio::time::timeout(Duration::from_secs(1), self.endpoint.wait_idle()).await;
        })
    }
}
