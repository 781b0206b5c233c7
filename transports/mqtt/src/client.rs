//! The client side: [`MqttStream`], one MQTT connection over any byte stream (for tools and tests), and
//! [`OrderConnector`], the [`Connector`] that lets `transport_conn::fleet` drive a fleet of MQTT devices.
//!
//! # A device
//!
//! Each device opens one TCP connection with TLS 1.3 and its own certificate, then CONNECT with its name as client
//! identifier and a persistent session (CleanSession 0), keepalive 30 s (PINGREQ after 30 s without sending). An
//! order is a QoS 1 PUBLISH to `orders/<device>` whose payload is the order body of `transport_core::framing`;
//! the PUBACK for its packet identifier is the answer "stored". Several orders may be in flight; each keeps the
//! packet identifier it was first sent with, and an order sent again (on a new connection, after a drop or an
//! unanswered second) goes with DUP set and its original identifier [MQTT-3.3.1-1, MQTT-4.4.0-1].

use crate::codec::{
    encode_publish, read_packet, ConnAck, Connect, ConnectReturnCode, DecodeError, EncodeError,
    Packet, PacketId, QoS,
};
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::AbortHandle;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use transport_conn::fleet::{Answer, Connector};
use transport_core::framing::encode_order_body;
use transport_core::{device_name, BoxFuture, Order, OrderId, TransportError};
use transport_tls::{ClientTls, SERVER_NAME};

/// Why a client operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket or TLS failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The server sent something malformed.
    #[error("decode: {0}")]
    Decode(#[from] DecodeError),
    /// A packet could not be encoded.
    #[error("encode: {0}")]
    Encode(#[from] EncodeError),
    /// The server closed the connection.
    #[error("connection closed by the server")]
    Closed,
    /// CONNECT was refused.
    #[error("CONNECT refused: {0:?}")]
    Refused(ConnectReturnCode),
    /// The server answered with a packet the protocol does not allow here.
    #[error("unexpected packet: {0}")]
    Unexpected(String),
}

impl From<ClientError> for TransportError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Io(e) => TransportError::Io(e),
            other => TransportError::Protocol(other.to_string()),
        }
    }
}

/// The largest packet a client accepts from a server.
pub const CLIENT_MAX_PACKET: usize = 1 << 20;

/// One MQTT connection over a byte stream, used one packet at a time.
#[derive(Debug)]
pub struct MqttStream<S> {
    io: S,
    buf: BytesMut,
}

impl<S: AsyncRead + AsyncWrite + Unpin> MqttStream<S> {
    /// Wrap a connected stream.
    pub fn new(io: S) -> Self {
        MqttStream {
            io,
            buf: BytesMut::with_capacity(4096),
        }
    }

    /// Write one packet.
    pub async fn send(&mut self, packet: &Packet) -> Result<(), ClientError> {
        let mut out = BytesMut::new();
        packet.encode(&mut out)?;
        self.send_raw(&out).await
    }

    /// Write bytes as they are (tests use it to send malformed input).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.io.write_all(bytes).await?;
        self.io.flush().await?;
        Ok(())
    }

    /// Read the next packet; [`ClientError::Closed`] at end of stream.
    pub async fn recv(&mut self) -> Result<Packet, ClientError> {
        loop {
            if let Some(p) = read_packet(&mut self.buf, CLIENT_MAX_PACKET)? {
                return Ok(p);
            }
            if self.io.read_buf(&mut self.buf).await? == 0 {
                return Err(ClientError::Closed);
            }
        }
    }

    /// Send CONNECT and wait for an accepting CONNACK.
    pub async fn connect(&mut self, connect: Connect) -> Result<ConnAck, ClientError> {
        self.send(&Packet::Connect(connect)).await?;
        match self.recv().await? {
            Packet::ConnAck(ack) if ack.code == ConnectReturnCode::Accepted => Ok(ack),
            Packet::ConnAck(ack) => Err(ClientError::Refused(ack.code)),
            other => Err(ClientError::Unexpected(format!(
                "{:?} before CONNACK",
                other.packet_type()
            ))),
        }
    }

    /// The stream and the bytes read past the last packet.
    pub fn into_parts(self) -> (S, BytesMut) {
        (self.io, self.buf)
    }
}

/// A CONNECT with the given identifier, session kind and keepalive, no will, no credentials.
pub fn connect_packet(client_id: &str, clean_session: bool, keep_alive: u16) -> Connect {
    Connect {
        clean_session,
        keep_alive,
        client_id: client_id.into(),
        will: None,
        username: None,
        password: None,
    }
}

/// Open TCP and TLS to `server` with `config`, checking the server's certificate for [`SERVER_NAME`].
pub async fn connect_tls(
    server: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> Result<TlsStream<TcpStream>, ClientError> {
    let tcp = TcpStream::connect(server).await?;
    tcp.set_nodelay(true)?;
    let name = rustls::pki_types::ServerName::try_from(SERVER_NAME)
        .map_err(|e| ClientError::Unexpected(e.to_string()))?;
    Ok(TlsConnector::from(config).connect(name, tcp).await?)
}

/// Per device, the packet identifiers of the orders sent and not yet answered.
#[derive(Default)]
struct DeviceIds {
    last: u16,
    by_order: HashMap<OrderId, PacketId>,
    in_use: std::collections::HashSet<u16>,
}

impl DeviceIds {
    /// The order's identifier and whether it was sent before (DUP); `None` if all 65,535 are taken.
    fn for_order(&mut self, id: OrderId) -> Option<(PacketId, bool)> {
        if let Some(&p) = self.by_order.get(&id) {
            return Some((p, true));
        }
        if self.in_use.len() >= usize::from(u16::MAX) {
            return None;
        }
        loop {
            self.last = self.last.wrapping_add(1);
            if let Some(p) = PacketId::new(self.last) {
                if self.in_use.insert(p.get()) {
                    self.by_order.insert(id, p);
                    return Some((p, false));
                }
            }
        }
    }

    fn answered(&mut self, id: &OrderId) {
        if let Some(p) = self.by_order.remove(id) {
            self.in_use.remove(&p.get());
        }
    }
}

/// The client side of the `mqtt` transports for `connfleet`: one TLS connection and MQTT session per device.
pub struct OrderConnector {
    server: SocketAddr,
    tls: ClientTls,
    keep_alive: u16,
    ids: Arc<[Mutex<DeviceIds>]>,
}

impl OrderConnector {
    /// Devices of `tls` connecting to `server`.
    pub fn new(server: SocketAddr, tls: ClientTls) -> Self {
        let ids = (0..tls.devices())
            .map(|_| Mutex::new(DeviceIds::default()))
            .collect();
        OrderConnector {
            server,
            tls,
            keep_alive: 30,
            ids,
        }
    }
}

type Waiters = Arc<Mutex<HashMap<PacketId, oneshot::Sender<()>>>>;

/// One device's live MQTT connection: a reader task resolving PUBACKs, a writer task, both stopped on drop.
pub struct OrderConn {
    device: u32,
    topic: String,
    out: mpsc::UnboundedSender<Bytes>,
    waiters: Waiters,
    closed: watch::Receiver<bool>,
    tasks: [AbortHandle; 2],
}

impl Drop for OrderConn {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Connector for OrderConnector {
    type Conn = OrderConn;

    fn connect(&self, device: u32) -> BoxFuture<'_, Result<OrderConn, TransportError>> {
        Box::pin(async move {
            let config = self.tls.config(device)?;
            let tls = connect_tls(self.server, config).await?;
            let mut stream = MqttStream::new(tls);
            stream
                .connect(connect_packet(&device_name(device), false, self.keep_alive))
                .await?;
            let (io, leftover) = stream.into_parts();
            let (rd, wr) = tokio::io::split(io);
            let waiters: Waiters = Arc::default();
            let (closed_tx, closed) = watch::channel(false);
            let (out, out_rx) = mpsc::unbounded_channel();
            let keep_alive = Duration::from_secs(u64::from(self.keep_alive));
            let reader = tokio::spawn(read_acks(
                rd,
                leftover,
                waiters.clone(),
                closed_tx,
                out.clone(),
            ));
            let writer = tokio::spawn(write_packets(wr, out_rx, keep_alive));
            Ok(OrderConn {
                device,
                topic: format!(
                    "{}{}",
                    crate::broker::connection::ORDERS_PREFIX,
                    device_name(device)
                ),
                out,
                waiters,
                closed,
                tasks: [reader.abort_handle(), writer.abort_handle()],
            })
        })
    }

    fn send_order(
        &self,
        conn: &OrderConn,
        order: &Order,
    ) -> BoxFuture<'static, Result<Answer, TransportError>> {
        let id = order.id;
        let ids = self.ids.clone();
        let device = conn.device as usize;
        let prepared = (|| {
            if *conn.closed.borrow() {
                return Err(TransportError::Protocol("connection closed".into()));
            }
            let slot = ids
                .get(device)
                .ok_or_else(|| TransportError::Config(format!("no device {device}")))?;
            let (packet_id, dup) = lock(slot).for_order(id).ok_or_else(|| {
                TransportError::Protocol("65535 orders in flight on one device".into())
            })?;
            let mut body = BytesMut::with_capacity(order.payload.len() + 40);
            encode_order_body(order, &mut body);
            let mut frame = BytesMut::with_capacity(body.len() + conn.topic.len() + 8);
            encode_publish(
                &mut frame,
                dup,
                QoS::AtLeastOnce,
                false,
                &conn.topic,
                Some(packet_id),
                &body,
            )
            .map_err(|e| TransportError::Protocol(e.to_string()))?;
            let (tx, rx) = oneshot::channel();
            lock(&conn.waiters).insert(packet_id, tx);
            conn.out
                .send(frame.freeze())
                .map_err(|_| TransportError::Protocol("connection closed".into()))?;
            Ok(rx)
        })();
        Box::pin(async move {
            prepared?
                .await
                .map_err(|_| TransportError::Protocol("connection closed before PUBACK".into()))?;
            if let Some(slot) = ids.get(device) {
                lock(slot).answered(&id);
            }
            Ok(Answer::Stored(id))
        })
    }

    fn closed(&self, conn: &OrderConn) -> BoxFuture<'static, ()> {
        let mut closed = conn.closed.clone();
        Box::pin(async move {
            let _ = closed.wait_for(|c| *c).await;
        })
    }
}

/// Resolve the waiter of each PUBACK; answer a PUBLISH the server might send; mark the connection closed at the
/// end (dropping every waiter, so the orders on it fail and are sent again on a new connection).
async fn read_acks<R: AsyncRead + Unpin>(
    mut rd: ReadHalf<R>,
    mut buf: BytesMut,
    waiters: Waiters,
    closed: watch::Sender<bool>,
    out: mpsc::UnboundedSender<Bytes>,
) {
    'read: loop {
        loop {
            match read_packet(&mut buf, CLIENT_MAX_PACKET) {
                Ok(Some(Packet::PubAck(id))) => {
                    if let Some(w) = lock(&waiters).remove(&id) {
                        let _ = w.send(());
                    }
                }
                Ok(Some(Packet::Publish(p))) => {
                    if let Some(id) = p.packet_id {
                        let mut ack = BytesMut::new();
                        let _ = Packet::PubAck(id).encode(&mut ack);
                        let _ = out.send(ack.freeze());
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => break 'read,
            }
        }
        match rd.read_buf(&mut buf).await {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
    lock(&waiters).clear();
    let _ = closed.send(true);
}

/// Write queued packets, several per write; PINGREQ after `keep_alive` without sending.
async fn write_packets<W: AsyncWrite + Unpin>(
    mut wr: WriteHalf<W>,
    mut rx: mpsc::UnboundedReceiver<Bytes>,
    keep_alive: Duration,
) {
    let mut buf = BytesMut::new();
    loop {
        buf.clear();
        match tokio::time::timeout(keep_alive, rx.recv()).await {
            Ok(Some(first)) => {
                buf.extend_from_slice(&first);
                while let Ok(more) = rx.try_recv() {
                    buf.extend_from_slice(&more);
                }
            }
            Ok(None) => break,
            Err(_) => {
                let _ = Packet::PingReq.encode(&mut buf);
            }
        }
        if wr.write_all(&buf).await.is_err() || wr.flush().await.is_err() {
            break;
        }
    }
    let _ = wr.shutdown().await;
}
