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
//!
//! # What a connection costs per order
//!
//! Orders are pipelined ([`Connector::answers`]): the device encodes each PUBLISH straight into the connection's
//! outgoing buffer, which the writer task takes whole (one write, one TLS record batch, for all that were queued
//! meanwhile), and the reader looks up every PUBACK of one read under one lock of the device's packet identifiers
//! and hands their orders to the device as one batch. Nothing is allocated, spawned or awaited per order: no future,
//! no channel message, no waiter. Subscriptions and published messages, which are few, each wait for their answer.
//!
//! # Pipelining (`mqtt:early`)
//!
//! By default a device waits for CONNACK before it sends anything else. Pipelining, it queues CONNECT the moment
//! its TLS handshake completes (rustls's client completes once its Finished is written, so CONNECT follows the
//! Finished in the same round trip) and the connection is ready for orders at once: MQTT 3.1.1 section 3.1.4 lets a
//! client send further packets right after CONNECT without waiting for CONNACK. The CONNACK is then the first packet
//! the reader expects; a refusal, or any other packet first, closes the connection, and the orders sent on it go
//! again on the next one (a broker processes nothing after a refused CONNECT [MQTT-3.1.4-5]).
//!
//! # Publish/subscribe
//!
//! A channel is the topic `bench/<channel>`. A subscription is a SUBSCRIBE with that one filter; SUBACK answers it
//! (return code 0x80: refused). A published message is a PUBLISH to the topic with the fleet's payload (the
//! message's id first); at QoS 1 its PUBACK is its acceptance and it keeps its packet identifier until then, so one
//! sent again on a new connection goes with DUP set and its original identifier, as orders do; at QoS 0 it is
//! accepted once written to the connection. A PUBLISH from the server to a `bench/` topic is handed to the fleet as
//! a delivery, then acknowledged with PUBACK if it is QoS 1 [MQTT-4.3.2-2].

use crate::codec::{
    encode_publish, encode_publish_head, read_packet, ConnAck, Connect, ConnectReturnCode,
    DecodeError, EncodeError, Packet, PacketId, QoS, Subscribe, SubscribeReturnCode,
};
use bytes::BytesMut;
// The per-order maps hash with foldhash, not std's SipHash: a device looks each order up several times, and the
// keys are the generator's own (no one else chooses them).
use foldhash::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::AbortHandle;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use transport_conn::fleet::{self, Answer, Answers, Connector, Deliveries, Delivery, SubAck};
use transport_core::counters::Counters;
use transport_core::framing::{encode_order_body, order_body_len};
use transport_core::net::fast_open;
use transport_core::ordered::Ordered;
use transport_core::{device_name, BoxFuture, Order, OrderId, Publish, TransportError};
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
    connect_tls_with(server, config, None).await
}

/// As [`connect_tls`]; with `fast_open`, the ClientHello goes in the SYN (TCP Fast Open without a cookie, see
/// [`transport_core::net::fast_open`]) and the connection counts in the counters' `fast_open` if the server took
/// it, in `fast_open_refused` if not (the kernel then sent it again after the handshake).
pub async fn connect_tls_with(
    server: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    fast_open: Option<&Counters>,
) -> Result<TlsStream<TcpStream>, ClientError> {
    let tcp = match fast_open {
        None => TcpStream::connect(server).await?,
        Some(_) => {
            let socket = if server.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            fast_open::client(&socket).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("TCP Fast Open refused by this kernel ({e}); net.ipv4.tcp_fastopen needs bit 1"),
                )
            })?;
            socket.connect(server).await?
        }
    };
    tcp.set_nodelay(true)?;
    let name = rustls::pki_types::ServerName::try_from(SERVER_NAME)
        .map_err(|e| ClientError::Unexpected(e.to_string()))?;
    let tls = TlsConnector::from(config).connect(name, tcp).await?;
    if let Some(counters) = fast_open {
        let counter = if fast_open::syn_data(tls.get_ref().0)? {
            &counters.fast_open
        } else {
            &counters.fast_open_refused
        };
        Counters::inc(counter);
    }
    Ok(tls)
}

/// What a packet identifier is in use for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Use {
    /// An order (QoS 1 PUBLISH to `orders/<device>`).
    Order(OrderId),
    /// A published message (QoS 1 PUBLISH to `bench/<channel>`), by its id.
    Message(u64),
    /// A SUBSCRIBE, by a number of the connector's.
    Subscribe(u64),
}

/// Per device, the packet identifiers in use: orders and QoS 1 messages sent and not yet acknowledged (they keep
/// theirs when sent again), subscriptions not yet answered.
///
/// An order is found by its identifier only; when it is sent again on a new connection, its identifier comes from
/// `held`, made once per connection, so sending an order never searches by order and keeps no second entry.
#[derive(Default)]
struct DeviceIds {
    last: u16,
    /// Every identifier in use, with what for.
    in_use: Ordered<u16, Use>,
    /// The identifiers of published messages and subscriptions in use, by what for.
    by_use: HashMap<Use, PacketId>,
    /// The identifiers orders held when the live connection was made: what each is sent again with.
    held: HashMap<OrderId, PacketId>,
    /// The device's live connection (a number of the connector's): only its reader takes orders' identifiers
    /// back. A PUBACK read late on an older connection cannot then release an identifier that the order's
    /// resend on the new connection still waits on.
    owner: u64,
}

impl DeviceIds {
    /// Connection `conn` is now the device's live one: the orders holding identifiers are sent again on it with
    /// them.
    fn connected(&mut self, conn: u64) {
        self.owner = conn;
        self.held = self
            .in_use
            .iter()
            .filter_map(|&(p, what)| match what {
                Use::Order(order) => Some((order, PacketId::new(p)?)),
                _ => None,
            })
            .collect();
    }

    /// The identifier for order `order` and whether it was given before (DUP); `again`: the order was sent on an
    /// earlier connection (then it keeps the identifier it had, if it had one). `None` if all 65,535 are taken.
    fn for_order(&mut self, order: OrderId, again: bool) -> Option<(PacketId, bool)> {
        if again {
            if let Some(p) = self.held.remove(&order) {
                if self.in_use.get(&p.get()) == Some(Use::Order(order)) {
                    return Some((p, true));
                }
            }
        }
        Some((self.next(Use::Order(order))?, false))
    }

    /// The identifier for a published message or a subscription and whether it was given before (DUP); `None` if
    /// all 65,535 are taken.
    fn for_use(&mut self, what: Use) -> Option<(PacketId, bool)> {
        if let Some(&p) = self.by_use.get(&what) {
            return Some((p, true));
        }
        let p = self.next(what)?;
        self.by_use.insert(what, p);
        Some((p, false))
    }

    /// The next identifier not in use, now in use for `what`.
    fn next(&mut self, what: Use) -> Option<PacketId> {
        if self.in_use.len() >= usize::from(u16::MAX) {
            return None;
        }
        loop {
            self.last = self.last.wrapping_add(1);
            if let Some(p) = PacketId::new(self.last) {
                if self.in_use.get(&p.get()).is_none() {
                    self.in_use.insert(p.get(), what);
                    return Some(p);
                }
            }
        }
    }

    fn release(&mut self, what: &Use) {
        if let Some(p) = self.by_use.remove(what) {
            self.in_use.remove(&p.get());
        }
    }

    /// Acknowledged on connection `conn`: if `id` is an order's and `conn` is the device's live connection, release
    /// the identifier and say which order it was.
    fn take_order(&mut self, conn: u64, id: PacketId) -> Option<OrderId> {
        if conn != self.owner {
            return None;
        }
        let (at, Use::Order(order)) = self.in_use.position(&id.get())? else {
            return None;
        };
        self.in_use.remove_at(at);
        Some(order)
    }
}

/// The topic prefix of published messages: channel `n` is `bench/<n>`.
pub const BENCH_PREFIX: &str = "bench/";

/// The topic of a channel.
pub fn channel_topic(channel: u32) -> String {
    format!("{BENCH_PREFIX}{channel}")
}

fn mqtt_qos(qos: transport_core::QoS) -> QoS {
    match qos {
        transport_core::QoS::AtMostOnce => QoS::AtMostOnce,
        transport_core::QoS::AtLeastOnce => QoS::AtLeastOnce,
    }
}

/// The client side of the `mqtt` transports for `connfleet`: one TLS connection and MQTT session per device.
pub struct OrderConnector {
    server: SocketAddr,
    tls: ClientTls,
    keep_alive: u16,
    /// Send packets right after CONNECT, without waiting for CONNACK (see the module docs).
    early: bool,
    /// Open each connection with TCP Fast Open, counting in these counters whether the server took it.
    fast_open: Option<Arc<Counters>>,
    ids: Arc<[Mutex<DeviceIds>]>,
    subscribes: AtomicU64,
    /// Numbers the connections ([`DeviceIds::owner`]).
    connections: AtomicU64,
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
            early: false,
            fast_open: None,
            ids,
            subscribes: AtomicU64::new(0),
            connections: AtomicU64::new(0),
        }
    }

    /// The same connector, pipelining after CONNECT if `early` (see the module docs).
    pub fn pipelining(mut self, early: bool) -> Self {
        self.early = early;
        self
    }

    /// The same connector, opening connections with TCP Fast Open and counting in `counters` whether the server
    /// took the SYN's data ([`connect_tls_with`]).
    pub fn fast_open(mut self, counters: Arc<Counters>) -> Self {
        self.fast_open = Some(counters);
        self
    }

    /// The packet identifiers of device `device`.
    fn device_ids(&self, device: u32) -> Result<&Mutex<DeviceIds>, TransportError> {
        self.ids
            .get(device as usize)
            .ok_or_else(|| TransportError::Config(format!("no device {device}")))
    }

    /// Reserve a packet identifier of `conn`'s device for `what`, and check the connection is open.
    fn packet_id(&self, conn: &OrderConn, what: Use) -> Result<(PacketId, bool), TransportError> {
        if *conn.closed.borrow() {
            return Err(TransportError::Protocol("connection closed".into()));
        }
        lock(self.device_ids(conn.device)?)
            .for_use(what)
            .ok_or_else(identifiers_exhausted)
    }

    /// Wait for the answer to the packet with identifier `id`, queued as `frame`; the identifier is released
    /// for `what` once answered.
    fn request(
        &self,
        conn: &OrderConn,
        what: Use,
        id: PacketId,
        frame: BytesMut,
    ) -> impl std::future::Future<Output = Result<Reply, TransportError>> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        lock(&conn.waiters).insert(id, tx);
        let sent = conn.outbox.push(&frame, None);
        let ids = self.ids.clone();
        let device = conn.device as usize;
        async move {
            sent?;
            let reply = rx.await.map_err(|_| {
                TransportError::Protocol("connection closed before the answer".into())
            })?;
            if let Some(slot) = ids.get(device) {
                lock(slot).release(&what);
            }
            Ok(reply)
        }
    }
}

fn identifiers_exhausted() -> TransportError {
    TransportError::Protocol("65535 packet identifiers in use on one device".into())
}

fn encode_error(e: EncodeError) -> TransportError {
    TransportError::Protocol(e.to_string())
}

/// The server's answer to a packet with an identifier.
#[derive(Debug)]
enum Reply {
    PubAck,
    SubAck(Vec<SubscribeReturnCode>),
}

type Waiters = Arc<Mutex<HashMap<PacketId, oneshot::Sender<Reply>>>>;

/// A connection's outgoing bytes: packets are encoded into it where they are made, and the writer task takes all
/// that is there at once.
#[derive(Default)]
struct Outbox {
    queued: Mutex<Queued>,
    /// Told when bytes arrive in an empty outbox, or when it closes.
    ready: Notify,
}

#[derive(Default)]
struct Queued {
    bytes: BytesMut,
    /// Who waits for their bytes to be written (a QoS 0 publish).
    written: Vec<oneshot::Sender<()>>,
    /// The connection is over: nothing more is taken.
    closed: bool,
}

impl Outbox {
    /// Queue what `encode` writes, then tell `written` (if any) once it is on the wire. Nothing is queued if it
    /// fails, or if the connection is closed.
    fn queue(
        &self,
        encode: impl FnOnce(&mut BytesMut) -> Result<(), TransportError>,
        written: Option<oneshot::Sender<()>>,
    ) -> Result<(), TransportError> {
        let mut queued = lock(&self.queued);
        if queued.closed {
            return Err(TransportError::Protocol("connection closed".into()));
        }
        let was_empty = queued.bytes.is_empty();
        let len = queued.bytes.len();
        if let Err(e) = encode(&mut queued.bytes) {
            queued.bytes.truncate(len);
            return Err(e);
        }
        queued.written.extend(written);
        drop(queued);
        if was_empty {
            self.ready.notify_one();
        }
        Ok(())
    }

    /// Queue bytes already encoded.
    fn push(
        &self,
        bytes: &[u8],
        written: Option<oneshot::Sender<()>>,
    ) -> Result<(), TransportError> {
        self.queue(
            |out| {
                out.extend_from_slice(bytes);
                Ok(())
            },
            written,
        )
    }

    /// Take nothing more (the connection is over).
    fn close(&self) {
        let mut queued = lock(&self.queued);
        queued.closed = true;
        queued.written.clear();
        drop(queued);
        self.ready.notify_one();
    }
}

/// One device's live MQTT connection: a reader task resolving PUBACKs and SUBACKs and handing answers and
/// deliveries over, a writer task, both stopped on drop.
pub struct OrderConn {
    device: u32,
    /// Whether its TLS handshake resumed a session.
    resumed: bool,
    topic: String,
    outbox: Arc<Outbox>,
    waiters: Waiters,
    closed: watch::Receiver<bool>,
    answers: Option<Answers>,
    deliveries: Option<Deliveries>,
    tasks: [AbortHandle; 2],
}

impl Drop for OrderConn {
    fn drop(&mut self) {
        self.outbox.close();
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How many orders a device has in flight on one connection at most: as many as a QUIC device has streams
/// ([`transport_conn::quic::STREAMS_PER_CONNECTION`]), so every connection transport runs with the same window
/// (rumqttc's default in-flight limit is the same 100). The answers on one byte stream come in order: with a window
/// of thousands, the last order's answer waits behind all the others and a drain's device would time out and
/// reconnect (seen: 0.9 million orders sent again in a 2-million-order drain with 15,625 orders per device); and a
/// window of 1,000 on 128 devices made the load generator three times as costly per order (its requests' state no
/// longer fits in the caches).
pub const ORDER_WINDOW: usize = transport_conn::quic::STREAMS_PER_CONNECTION;

impl Connector for OrderConnector {
    type Conn = OrderConn;

    fn window(&self) -> usize {
        ORDER_WINDOW
    }

    fn connect(&self, device: u32) -> BoxFuture<'_, Result<OrderConn, TransportError>> {
        Box::pin(async move {
            let config = self.tls.config(device)?;
            let tls = connect_tls_with(self.server, config, self.fast_open.as_deref()).await?;
            let resumed = tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
            let connect = connect_packet(&device_name(device), false, self.keep_alive);
            let mut stream = MqttStream::new(tls);
            let mut first = BytesMut::new();
            if self.early {
                // Queued for the writer, which sends it with whatever the fleet queues right after (the orders).
                Packet::Connect(connect)
                    .encode(&mut first)
                    .map_err(ClientError::from)?;
            } else {
                stream.connect(connect).await?;
            }
            let (io, leftover) = stream.into_parts();
            let (rd, wr) = tokio::io::split(io);
            let waiters: Waiters = Arc::default();
            let (closed_tx, closed) = watch::channel(false);
            let outbox = Arc::new(Outbox::default());
            let (delivered, deliveries) = mpsc::unbounded_channel();
            let (answering, answers) = mpsc::unbounded_channel();
            let keep_alive = Duration::from_secs(u64::from(self.keep_alive));
            outbox.push(&first, None)?;
            // This connection is now the device's: only its reader releases the device's orders' identifiers.
            let number = self.connections.fetch_add(1, Ordering::Relaxed) + 1;
            let ids = self.device_ids(device)?;
            lock(ids).connected(number);
            let reader = tokio::spawn(read_acks(
                rd,
                leftover,
                Acks {
                    waiters: waiters.clone(),
                    closed: closed_tx,
                    outbox: outbox.clone(),
                    ids: self.ids.clone(),
                    device: device as usize,
                    conn: number,
                    answers: answering,
                    deliveries: delivered,
                    connack_due: self.early,
                },
            ));
            let writer = tokio::spawn(write_packets(wr, outbox.clone(), keep_alive));
            Ok(OrderConn {
                device,
                resumed,
                topic: format!(
                    "{}{}",
                    crate::broker::connection::ORDERS_PREFIX,
                    device_name(device)
                ),
                outbox,
                waiters,
                closed,
                answers: Some(answers),
                deliveries: Some(deliveries),
                tasks: [reader.abort_handle(), writer.abort_handle()],
            })
        })
    }

    fn answers(&self, conn: &mut OrderConn) -> Option<Answers> {
        conn.answers.take()
    }

    fn queue_orders(
        &self,
        conn: &OrderConn,
        orders: &mut dyn Iterator<Item = (&Order, bool)>,
    ) -> Result<(), TransportError> {
        let ids = self.device_ids(conn.device)?;
        // Each order's PUBLISH head, then its body, written in place in the connection's outgoing bytes; the
        // identifiers are taken once the outbox is known to be open (it closes before `closed` is set, so its own
        // check is the one [`OrderConnector::packet_id`] makes for other packets), with one lock of each for all.
        conn.outbox.queue(
            |out| {
                let mut ids = lock(ids);
                for (order, again) in orders {
                    let (packet_id, dup) = ids
                        .for_order(order.id, again)
                        .ok_or_else(identifiers_exhausted)?;
                    encode_publish_head(
                        out,
                        dup,
                        QoS::AtLeastOnce,
                        false,
                        &conn.topic,
                        Some(packet_id),
                        order_body_len(order),
                    )
                    .map_err(encode_error)?;
                    encode_order_body(order, out);
                }
                Ok(())
            },
            None,
        )
    }

    fn subscribe(
        &self,
        conn: &OrderConn,
        channel: u32,
        qos: transport_core::QoS,
    ) -> BoxFuture<'static, Result<SubAck, TransportError>> {
        let what = Use::Subscribe(self.subscribes.fetch_add(1, Ordering::Relaxed));
        let prepared = (|| -> Result<_, TransportError> {
            let (packet_id, _) = self.packet_id(conn, what)?;
            let mut frame = BytesMut::new();
            Packet::Subscribe(Subscribe {
                packet_id,
                filters: vec![(channel_topic(channel), mqtt_qos(qos))],
            })
            .encode(&mut frame)
            .map_err(|e| TransportError::Protocol(e.to_string()))?;
            Ok(self.request(conn, what, packet_id, frame))
        })();
        Box::pin(async move {
            match prepared?.await? {
                Reply::SubAck(codes) => match codes.first() {
                    Some(SubscribeReturnCode::Granted(_)) => Ok(SubAck::Granted),
                    _ => Ok(SubAck::Refused),
                },
                other => Err(TransportError::Protocol(format!(
                    "{other:?} for a SUBSCRIBE"
                ))),
            }
        })
    }

    fn publish(
        &self,
        conn: &OrderConn,
        message: &Publish,
        again: bool,
    ) -> BoxFuture<'static, Result<(), TransportError>> {
        let what = Use::Message(message.id);
        let qos = mqtt_qos(message.qos);
        let prepared = (|| -> Result<_, TransportError> {
            let (packet_id, dup) = match qos {
                QoS::AtMostOnce => (None, false),
                _ => {
                    let (id, known) = self.packet_id(conn, what)?;
                    (Some(id), known || again)
                }
            };
            let mut payload = BytesMut::new();
            fleet::payload(message, &mut payload);
            let topic = channel_topic(message.channel);
            let mut frame = BytesMut::with_capacity(payload.len() + topic.len() + 8);
            encode_publish(&mut frame, dup, qos, false, &topic, packet_id, &payload)
                .map_err(|e| TransportError::Protocol(e.to_string()))?;
            Ok(match packet_id {
                Some(id) => Ok(self.request(conn, what, id, frame)),
                None => {
                    let (tx, rx) = oneshot::channel();
                    conn.outbox.push(&frame, Some(tx))?;
                    Err(rx)
                }
            })
        })();
        Box::pin(async move {
            match prepared? {
                Ok(acknowledged) => match acknowledged.await? {
                    Reply::PubAck => Ok(()),
                    other => Err(TransportError::Protocol(format!("{other:?} for a PUBLISH"))),
                },
                Err(written) => written.await.map_err(|_| {
                    TransportError::Protocol("connection closed before the write".into())
                }),
            }
        })
    }

    fn deliveries(&self, conn: &mut OrderConn) -> Option<Deliveries> {
        conn.deliveries.take()
    }

    fn resumed(&self, conn: &OrderConn) -> bool {
        conn.resumed
    }

    fn closed(&self, conn: &OrderConn) -> BoxFuture<'static, ()> {
        let mut closed = conn.closed.clone();
        Box::pin(async move {
            let _ = closed.wait_for(|c| *c).await;
        })
    }

    /// DISCONNECT, then nothing more is sent [MQTT-3.14.4-2]; the device waits for the broker to close the network
    /// connection (a server SHOULD on receipt of DISCONNECT, MQTT 3.1.1 section 3.14.4), so the server closes
    /// first, and then closes its own side [MQTT-3.14.4-1]. A broker that has not closed within
    /// [`SERVER_CLOSE_WAIT`] is an error, and the connection is closed from this side all the same.
    fn disconnect(&self, conn: OrderConn) -> BoxFuture<'static, Result<(), TransportError>> {
        let queued = conn
            .outbox
            .queue(
                |out| Packet::Disconnect.encode(out).map_err(encode_error),
                None,
            )
            .ok();
        Box::pin(async move {
            if queued.is_none() {
                return Err(TransportError::Protocol(
                    "the connection was closed before DISCONNECT".into(),
                ));
            }
            let mut closed = conn.closed.clone();
            let waited = tokio::time::timeout(SERVER_CLOSE_WAIT, closed.wait_for(|c| *c)).await;
            drop(conn);
            match waited {
                Ok(Ok(_)) => Ok(()),
                _ => Err(TransportError::Protocol(format!(
                    "the broker did not close the connection within {} ms of DISCONNECT",
                    SERVER_CLOSE_WAIT.as_millis()
                ))),
            }
        })
    }
}

/// How long a device waits, after DISCONNECT, for the broker to close the connection.
pub const SERVER_CLOSE_WAIT: Duration = Duration::from_secs(5);

/// What the reader of a connection answers to.
struct Acks {
    waiters: Waiters,
    closed: watch::Sender<bool>,
    outbox: Arc<Outbox>,
    /// Every device's packet identifiers, this connection's device, and this connection's number.
    ids: Arc<[Mutex<DeviceIds>]>,
    device: usize,
    conn: u64,
    answers: mpsc::UnboundedSender<Vec<Answer>>,
    deliveries: mpsc::UnboundedSender<Delivery>,
    /// CONNECT was sent without waiting: its CONNACK must be the first packet.
    connack_due: bool,
}

/// Hand the orders of each read's PUBACKs to the device as one batch, and resolve the waiter of every other PUBACK
/// and SUBACK; hand each PUBLISH to a `bench/` topic to the fleet, then acknowledge it if it is QoS 1; mark the
/// connection closed at the end (dropping every waiter and the answers, so the device knows and sends again on a new
/// connection what was not answered). Pipelining after CONNECT, the first packet must be an accepting CONNACK.
async fn read_acks<R: AsyncRead + Unpin>(mut rd: ReadHalf<R>, mut buf: BytesMut, acks_to: Acks) {
    let Acks {
        waiters,
        closed,
        outbox,
        ids,
        device,
        conn,
        answers,
        deliveries,
        mut connack_due,
    } = acks_to;
    let mut at = std::time::Instant::now();
    // The PUBACKs and other answers of one read, resolved under one lock of the identifiers and the waiters.
    let mut pubacks: Vec<PacketId> = Vec::new();
    let mut replies: Vec<(PacketId, Reply)> = Vec::new();
    'read: loop {
        let mut acks = BytesMut::new();
        loop {
            if connack_due {
                match read_packet(&mut buf, CLIENT_MAX_PACKET) {
                    Ok(Some(Packet::ConnAck(ack))) if ack.code == ConnectReturnCode::Accepted => {
                        connack_due = false;
                        continue;
                    }
                    Ok(None) => break,
                    // Refused, or anything before CONNACK [MQTT-3.2.0-1]: the connection is over.
                    _ => break 'read,
                }
            }
            let (id, reply) = match read_packet(&mut buf, CLIENT_MAX_PACKET) {
                Ok(Some(Packet::PubAck(id))) => {
                    pubacks.push(id);
                    continue;
                }
                Ok(Some(Packet::SubAck(ack))) => (ack.packet_id, Reply::SubAck(ack.return_codes)),
                Ok(Some(Packet::Publish(p))) => {
                    let message = p
                        .topic
                        .starts_with(BENCH_PREFIX)
                        .then(|| fleet::message_id(&p.payload))
                        .flatten();
                    if let Some(id) = message {
                        let qos = match p.qos {
                            QoS::AtMostOnce => transport_core::QoS::AtMostOnce,
                            _ => transport_core::QoS::AtLeastOnce,
                        };
                        let _ = deliveries.send(Delivery { id, qos, at });
                    }
                    if let Some(id) = p.packet_id {
                        let _ = Packet::PubAck(id).encode(&mut acks);
                    }
                    continue;
                }
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(_) => break 'read,
            };
            replies.push((id, reply));
        }
        answer_orders(&ids[device], conn, &mut pubacks, &mut replies, &answers);
        resolve(&waiters, &mut replies);
        if !acks.is_empty() {
            let _ = outbox.push(&acks, None);
        }
        match rd.read_buf(&mut buf).await {
            Ok(n) if n > 0 => at = std::time::Instant::now(),
            _ => break,
        }
    }
    // Answers read before the connection broke still count.
    answer_orders(&ids[device], conn, &mut pubacks, &mut replies, &answers);
    resolve(&waiters, &mut replies);
    lock(&waiters).clear();
    outbox.close();
    let _ = closed.send(true);
}

/// Hand the orders acknowledged by `pubacks` to the device as one batch (one lock of its identifiers, one message
/// for all); a PUBACK that is not an order's (a published message's) goes to `replies`.
fn answer_orders(
    ids: &Mutex<DeviceIds>,
    conn: u64,
    pubacks: &mut Vec<PacketId>,
    replies: &mut Vec<(PacketId, Reply)>,
    answers: &mpsc::UnboundedSender<Vec<Answer>>,
) {
    if pubacks.is_empty() {
        return;
    }
    let mut stored = Vec::with_capacity(pubacks.len());
    let mut ids = lock(ids);
    for id in pubacks.drain(..) {
        match ids.take_order(conn, id) {
            Some(order) => stored.push(Answer::Stored(order)),
            None => replies.push((id, Reply::PubAck)),
        }
    }
    drop(ids);
    if !stored.is_empty() {
        let _ = answers.send(stored);
    }
}

/// Hand each answer to the request waiting for it.
fn resolve(waiters: &Waiters, replies: &mut Vec<(PacketId, Reply)>) {
    if replies.is_empty() {
        return;
    }
    let mut waiting = lock(waiters);
    for (id, reply) in replies.drain(..) {
        if let Some(w) = waiting.remove(&id) {
            let _ = w.send(reply);
        }
    }
}

/// Write what is queued, all of it in one write (the outbox's buffer and this one trade places: nothing is copied
/// or allocated per write), then tell the QoS 0 publishers theirs are written; PINGREQ after `keep_alive` without
/// sending. Stops when the outbox closes or a write fails (closing the outbox).
async fn write_packets<W: AsyncWrite + Unpin>(
    mut wr: WriteHalf<W>,
    outbox: Arc<Outbox>,
    keep_alive: Duration,
) {
    let mut buf = BytesMut::new();
    let mut written = Vec::new();
    loop {
        buf.clear();
        {
            let mut queued = lock(&outbox.queued);
            if queued.closed {
                break;
            }
            std::mem::swap(&mut queued.bytes, &mut buf);
            std::mem::swap(&mut queued.written, &mut written);
        }
        if buf.is_empty() && written.is_empty() {
            if tokio::time::timeout(keep_alive, outbox.ready.notified())
                .await
                .is_ok()
            {
                continue;
            }
            let _ = Packet::PingReq.encode(&mut buf);
        }
        if wr.write_all(&buf).await.is_err() || wr.flush().await.is_err() {
            break;
        }
        for w in written.drain(..) {
            let _ = w.send(());
        }
    }
    outbox.close();
    let _ = wr.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order_id(seq: u64) -> OrderId {
        OrderId {
            sender: 1,
            run: 1,
            seq,
        }
    }

    #[test]
    fn only_the_live_connection_takes_an_orders_identifier_back() {
        let mut ids = DeviceIds::default();
        ids.connected(1);
        let (p, dup) = ids.for_order(order_id(1), false).unwrap();
        assert!(!dup);
        let (message, _) = ids.for_use(Use::Message(7)).unwrap();
        // On the next connection, the order is sent again with its identifier (DUP).
        ids.connected(2);
        assert_eq!(ids.for_order(order_id(1), true), Some((p, true)));
        // A PUBACK read late on an earlier connection releases nothing.
        assert_eq!(ids.take_order(1, p), None);
        assert_eq!(ids.take_order(2, message), None, "not an order's");
        assert_eq!(ids.take_order(2, p), Some(order_id(1)));
        assert_eq!(ids.take_order(2, p), None, "taken once");
        // Released: the order would get a new identifier, the message keeps its own.
        assert_eq!(ids.for_use(Use::Message(7)), Some((message, true)));
        let (q, dup) = ids.for_order(order_id(1), true).unwrap();
        assert!(!dup && q != message && q != p);
    }

    #[test]
    fn an_order_sent_again_keeps_its_identifier_only_while_it_holds_it() {
        let mut ids = DeviceIds::default();
        ids.connected(1);
        let held: Vec<PacketId> = (0..5)
            .map(|seq| ids.for_order(order_id(seq), false).unwrap().0)
            .collect();
        // Order 0 is acknowledged on connection 1, order 1 after the next connection was made (not released).
        assert_eq!(ids.take_order(1, held[0]), Some(order_id(0)));
        ids.connected(2);
        assert_eq!(ids.take_order(1, held[1]), None);
        // Orders 1-4 go again with theirs, a new order gets a new one.
        for seq in 1..5 {
            assert_eq!(
                ids.for_order(order_id(seq), true),
                Some((held[seq as usize], true))
            );
        }
        let (fresh, dup) = ids.for_order(order_id(9), false).unwrap();
        assert!(!dup && !held.contains(&fresh));
        // Orders taken back before being sent again: a broker acknowledging an identifier this connection has not
        // sent releases it, and the order then gets a new identifier rather than one given to something else.
        ids.connected(3);
        assert_eq!(ids.take_order(3, held[2]), Some(order_id(2)));
        let (m, _) = ids.for_use(Use::Message(1)).unwrap();
        let (again, dup) = ids.for_order(order_id(2), true).unwrap();
        assert!(!dup && again != m && again != held[2]);
        // An order that never got an identifier (all taken) gets one when sent again.
        assert_eq!(
            ids.for_order(order_id(77), true).map(|(_, dup)| dup),
            Some(false)
        );
    }
}
