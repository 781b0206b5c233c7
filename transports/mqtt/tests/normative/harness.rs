//! The brokers under test and a raw MQTT client for them.
//!
//! [`Target::start`] starts a fresh broker for one test: the in-tree broker (in this process, its session state in a
//! temporary store directory) or a real mosquitto (a child process, killed when the target is dropped), each with a
//! plaintext listener for raw packets and a TLS listener with the suite's PKI. [`Client`] sends packets, or raw
//! bytes for malformed ones, and reads what comes back with a deadline, so a test never hangs.

use crate::common::{quick_config, TestBroker};
use bytes::Bytes;
use std::net::SocketAddr;
use std::num::NonZeroU16;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use transport_core::Counters;
use transport_mqtt::client::{connect_tls, ClientError, MqttStream};
use transport_mqtt::codec::{
    ConnAck, Connect, LastWill, Packet, PacketId, Publish, QoS, Subscribe, SubscribeReturnCode,
    Unsubscribe,
};
use transport_mqtt::mosquitto::{Mosquitto, Options};
use transport_tls::{ClientTls, DeviceCredentials};

/// How long a test waits for a packet or a close it expects.
pub const WAIT: Duration = Duration::from_secs(3);

/// Which broker a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The in-tree broker.
    InTree,
    /// Debian's mosquitto 2.x.
    Mosquitto,
}

/// A broker started for one test.
pub struct Target {
    pub plain: SocketAddr,
    pub tls: SocketAddr,
    identity: PathBuf,
    /// The broker (and its directory), stopped when the target is dropped.
    _running: Box<dyn std::any::Any + Send>,
}

/// The largest packet either broker accepts here; larger ones are a transient error [MQTT-4.8.0-2].
pub const MAX_PACKET: usize = 1 << 20;

impl Target {
    pub async fn start(kind: Kind) -> Target {
        match kind {
            Kind::InTree => {
                let mut config = quick_config();
                config.max_packet_size = MAX_PACKET;
                config.connect_timeout = Duration::from_secs(5);
                let b = TestBroker::start(2, config, true).await;
                Target {
                    plain: b.plain.unwrap(),
                    tls: b.addr,
                    identity: b.identity(),
                    _running: Box::new(b),
                }
            }
            Kind::Mosquitto => {
                let dir = tempfile::tempdir().unwrap();
                let identity = dir.path().join("id");
                transport_tls::write_pki(&identity, 2).unwrap();
                let options = Options {
                    plaintext_port: Some(0),
                    extra: vec![format!("max_packet_size {MAX_PACKET}")],
                };
                let m = Mosquitto::start_with(&identity, 0, &dir.path().join("m"), &options)
                    .await
                    .unwrap();
                Target {
                    plain: m.plain_addr().unwrap(),
                    tls: m.addr(),
                    identity,
                    _running: Box::new((m, dir)),
                }
            }
        }
    }

    /// A plaintext TCP connection, nothing sent yet.
    pub async fn raw(&self) -> Client {
        let tcp = TcpStream::connect(self.plain).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        Client::new(Box::new(tcp))
    }

    /// A plaintext client connected as `id`; asserts the CONNACK accepts and returns the session present flag.
    pub async fn connect(&self, id: &str, clean: bool) -> (Client, bool) {
        let mut c = self.raw().await;
        let ack = c.connect(connect(id, clean)).await;
        (c, ack.session_present)
    }

    /// A plaintext client with a clean session.
    pub async fn client(&self, id: &str) -> Client {
        self.connect(id, true).await.0
    }

    /// A TLS connection with device `device`'s certificate, nothing sent yet.
    pub async fn tls_raw(&self, device: u32) -> Client {
        let credentials = Arc::new(DeviceCredentials::load(&self.identity).unwrap());
        let tls = ClientTls::new(credentials, Arc::new(Counters::default()), &[]).unwrap();
        let stream = connect_tls(self.tls, tls.config(device).unwrap())
            .await
            .unwrap();
        Client::new(Box::new(stream))
    }
}

/// A CONNECT with keepalive 0, no will, no credentials.
pub fn connect(id: &str, clean: bool) -> Connect {
    Connect {
        clean_session: clean,
        keep_alive: 0,
        client_id: id.into(),
        will: None,
        username: None,
        password: None,
    }
}

/// A will.
pub fn will(topic: &str, message: &'static [u8], qos: QoS, retain: bool) -> LastWill {
    LastWill {
        topic: topic.into(),
        message: Bytes::from_static(message),
        qos,
        retain,
    }
}

pub fn pid(n: u16) -> PacketId {
    NonZeroU16::new(n).unwrap()
}

/// A PUBLISH; the identifier is ignored for QoS 0.
pub fn publish(topic: &str, qos: QoS, id: u16, payload: &[u8]) -> Publish {
    Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.into(),
        packet_id: (qos != QoS::AtMostOnce).then(|| pid(id)),
        payload: Bytes::copy_from_slice(payload),
    }
}

pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One connection to the broker under test.
pub struct Client {
    s: MqttStream<Box<dyn Io>>,
    next_id: u16,
}

impl Client {
    fn new(io: Box<dyn Io>) -> Client {
        Client {
            s: MqttStream::new(io),
            next_id: 0,
        }
    }

    /// A packet identifier not used before on this client.
    pub fn id(&mut self) -> u16 {
        self.next_id += 1;
        self.next_id
    }

    pub async fn send(&mut self, packet: impl Into<Packet>) {
        self.s.send(&packet.into()).await.unwrap();
    }

    /// Bytes as they are; a write error (the broker already closed) is ignored, the close is what tests look at.
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        let _ = self.s.send_raw(bytes).await;
    }

    /// The next packet within `limit`, `None` if nothing came; a close or a malformed packet fails the test.
    pub async fn try_recv(&mut self, limit: Duration) -> Option<Packet> {
        match tokio::time::timeout(limit, self.s.recv()).await {
            Err(_) => None,
            Ok(Ok(p)) => Some(p),
            Ok(Err(e)) => panic!("expected a packet, got {e}"),
        }
    }

    /// The next packet.
    pub async fn recv(&mut self) -> Packet {
        self.try_recv(WAIT).await.expect("no packet in time")
    }

    /// The next packet, which must be `want`.
    pub async fn expect(&mut self, want: impl Into<Packet>) {
        assert_eq!(self.recv().await, want.into());
    }

    /// The next packet, which must be a PUBLISH.
    pub async fn publication(&mut self) -> Publish {
        match self.recv().await {
            Packet::Publish(p) => p,
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }

    /// Wait for the broker to close the connection; returns the packets it sent before.
    pub async fn closed(&mut self) -> Vec<Packet> {
        self.closed_within(WAIT).await
    }

    /// [`Client::closed`], waiting up to `limit`.
    pub async fn closed_within(&mut self, limit: Duration) -> Vec<Packet> {
        let mut before = Vec::new();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match tokio::time::timeout_at(deadline, self.s.recv()).await {
                Err(_) => panic!("the connection is still open; received {before:?}"),
                Ok(Ok(p)) => before.push(p),
                Ok(Err(ClientError::Closed | ClientError::Io(_))) => return before,
                Ok(Err(e)) => panic!("{e} before the close"),
            }
        }
    }

    /// Wait for the close, asserting nothing (no CONNACK in particular) came before it.
    pub async fn closed_silently(&mut self) {
        let before = self.closed().await;
        assert!(before.is_empty(), "sent before the close: {before:?}");
    }

    /// CONNECT, asserting an accepting CONNACK.
    pub async fn connect(&mut self, c: Connect) -> ConnAck {
        self.send(Packet::Connect(c)).await;
        match self.recv().await {
            Packet::ConnAck(a) if a.code == transport_mqtt::codec::ConnectReturnCode::Accepted => a,
            other => panic!("expected an accepting CONNACK, got {other:?}"),
        }
    }

    /// SUBSCRIBE and its SUBACK's return codes (retained messages may follow).
    pub async fn subscribe(&mut self, filters: &[(&str, QoS)]) -> Vec<SubscribeReturnCode> {
        let id = self.id();
        let sub = Subscribe {
            packet_id: pid(id),
            filters: filters.iter().map(|(f, q)| (f.to_string(), *q)).collect(),
        };
        self.send(Packet::Subscribe(sub)).await;
        match self.recv().await {
            Packet::SubAck(a) => {
                assert_eq!(a.packet_id, pid(id));
                a.return_codes
            }
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }

    /// SUBSCRIBE one filter, asserting it is granted as asked.
    pub async fn sub(&mut self, filter: &str, qos: QoS) {
        assert_eq!(
            self.subscribe(&[(filter, qos)]).await,
            [SubscribeReturnCode::Granted(qos)]
        );
    }

    /// UNSUBSCRIBE, asserting the UNSUBACK.
    pub async fn unsubscribe(&mut self, filters: &[&str]) {
        let id = self.id();
        let u = Unsubscribe {
            packet_id: pid(id),
            filters: filters.iter().map(|f| f.to_string()).collect(),
        };
        self.send(Packet::Unsubscribe(u)).await;
        self.expect(Packet::UnsubAck(pid(id))).await;
    }

    /// Publish and complete the flow of its QoS (PUBACK, or PUBREC PUBREL PUBCOMP).
    pub async fn put(&mut self, topic: &str, qos: QoS, payload: &[u8], retain: bool) {
        let id = self.id();
        let mut p = publish(topic, qos, id, payload);
        p.retain = retain;
        self.send(Packet::Publish(p)).await;
        match qos {
            QoS::AtMostOnce => self.ping().await,
            QoS::AtLeastOnce => self.expect(Packet::PubAck(pid(id))).await,
            QoS::ExactlyOnce => {
                self.expect(Packet::PubRec(pid(id))).await;
                self.send(Packet::PubRel(pid(id))).await;
                self.expect(Packet::PubComp(pid(id))).await;
            }
        }
    }

    /// PINGREQ, then the PINGRESP: everything the broker did for packets sent before is done.
    pub async fn ping(&mut self) {
        self.send(Packet::PingReq).await;
        self.expect(Packet::PingResp).await;
    }

    /// Acknowledge a delivery as its QoS asks, through to PUBCOMP.
    pub async fn ack(&mut self, p: &Publish) {
        match (p.qos, p.packet_id) {
            (QoS::AtLeastOnce, Some(id)) => self.send(Packet::PubAck(id)).await,
            (QoS::ExactlyOnce, Some(id)) => {
                self.send(Packet::PubRec(id)).await;
                self.expect(Packet::PubRel(id)).await;
                self.send(Packet::PubComp(id)).await;
            }
            _ => {}
        }
    }
}

impl Client {
    /// Receive `n` PUBLISH packets, acknowledging each as its QoS asks and completing every QoS 2 flow (PUBRELs may
    /// come between later PUBLISH packets).
    pub async fn take(&mut self, n: usize) -> Vec<Publish> {
        let mut got = Vec::new();
        let mut open = 0usize;
        while got.len() < n || open > 0 {
            match self.recv().await {
                Packet::Publish(p) => {
                    match (p.qos, p.packet_id) {
                        (QoS::AtLeastOnce, Some(id)) => self.send(Packet::PubAck(id)).await,
                        (QoS::ExactlyOnce, Some(id)) => {
                            self.send(Packet::PubRec(id)).await;
                            open += 1;
                        }
                        _ => {}
                    }
                    got.push(p);
                }
                Packet::PubRel(id) => {
                    self.send(Packet::PubComp(id)).await;
                    open -= 1;
                }
                other => panic!("expected PUBLISH or PUBREL, got {other:?}"),
            }
        }
        got
    }
}

/// A subscriber's proof that nothing else is coming: `publisher` sends a message to `marker`, to which `subscriber`
/// is subscribed, and it must be the next thing `subscriber` gets (messages from one client arrive in order).
pub async fn nothing_before_marker(subscriber: &mut Client, publisher: &mut Client, marker: &str) {
    publisher
        .put(marker, QoS::AtLeastOnce, b"marker", false)
        .await;
    let p = subscriber.publication().await;
    assert_eq!(p.topic, marker, "got {p:?} before the marker");
}

/// A whole packet: first byte, remaining length, body.
pub fn frame(first: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    let mut n = body.len();
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        out.push(b);
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(body);
    out
}

/// A length-prefixed string or binary field, any bytes.
pub fn field(bytes: &[u8]) -> Vec<u8> {
    let mut out = (bytes.len() as u16).to_be_bytes().to_vec();
    out.extend_from_slice(bytes);
    out
}

/// A CONNECT for protocol `name` and `level` with these flags, keepalive 0 and this payload, as raw bytes.
pub fn raw_connect(name: &[u8], level: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut body = field(name);
    body.extend_from_slice(&[level, flags, 0, 0]);
    body.extend_from_slice(payload);
    frame(0x10, &body)
}

/// A 3.1.1 CONNECT with these flags and payload fields.
pub fn raw_connect_fields(flags: u8, fields: &[&[u8]]) -> Vec<u8> {
    let payload: Vec<u8> = fields.iter().flat_map(|f| field(f)).collect();
    raw_connect(b"MQTT", 4, flags, &payload)
}

/// A PUBLISH with any topic bytes, as raw bytes.
pub fn raw_publish(flags: u8, topic: &[u8], id: Option<u16>, payload: &[u8]) -> Vec<u8> {
    let mut body = field(topic);
    if let Some(id) = id {
        body.extend_from_slice(&id.to_be_bytes());
    }
    body.extend_from_slice(payload);
    frame(0x30 | flags, &body)
}

/// A SUBSCRIBE (`first` 0x82 when well-formed) with any filter bytes and requested-QoS bytes.
pub fn raw_subscribe(first: u8, id: u16, filters: &[(&[u8], u8)]) -> Vec<u8> {
    let mut body = id.to_be_bytes().to_vec();
    for (f, q) in filters {
        body.extend(field(f));
        body.push(*q);
    }
    frame(first, &body)
}

/// An UNSUBSCRIBE (`first` 0xA2 when well-formed) with any filter bytes.
pub fn raw_unsubscribe(first: u8, id: u16, filters: &[&[u8]]) -> Vec<u8> {
    let mut body = id.to_be_bytes().to_vec();
    for f in filters {
        body.extend(field(f));
    }
    frame(first, &body)
}
