//! The adversary against the MQTT broker: MQTT 3.1.1 over TLS 1.3 with client certificates.
//!
//! A certificate from a CA of its own gets no further than the TLS handshake, so the broker's packet handling is
//! reached only through its own enrolled identity: an authenticated device turned malicious (the run has no
//! plaintext listener). Its tasks:
//!
//! - [`RANDOM_STREAM`](kind::RANDOM_STREAM)s: TCP connections carrying random bytes;
//! - handshake floods: [`FOREIGN_CERTIFICATE`](kind::FOREIGN_CERTIFICATE), [`NO_CERTIFICATE`](kind::NO_CERTIFICATE);
//! - [`HALF_OPEN`](kind::HALF_OPEN): TCP connections opened and left silent for 15 s (past the broker's 10 s
//!   connect timeout);
//! - its own device, one act per tick on one connection (opened again after each act that closes it; two
//!   connections of one identity would take each other over): its own [`OWN_ORDER`](kind::OWN_ORDER)s and
//!   [`REPLAYED`](kind::REPLAYED) ones (the same PUBLISH again, DUP set), a [`DEEP_FILTER`](kind::DEEP_FILTER) of
//!   65,000 levels, a burst of 64 [`RETAINED`](kind::RETAINED) messages of 64 KiB (the broker keeps at most 64 MiB),
//!   an order naming another device ([`WRONG_SENDER`](kind::WRONG_SENDER)) or to another device's topic
//!   ([`OTHER_DEVICE_TOPIC`](kind::OTHER_DEVICE_TOPIC)), a CONNECT with another device's client identifier
//!   ([`OTHER_CLIENT_ID`](kind::OTHER_CLIENT_ID), on a connection of its own), [`MALFORMED`](kind::MALFORMED)
//!   packets, a packet announcing 256 MiB ([`OVERSIZED`](kind::OVERSIZED)) and a SUBSCRIBE of 150,000 filters
//!   ([`HUGE_SUBSCRIBE`](kind::HUGE_SUBSCRIBE)).

use super::tlsconf::Clients;
use super::{kind, noise, nonzero, AdversaryError, Ctx, Pace};
use bytes::{Bytes, BytesMut};
use rand::RngExt;
use std::num::NonZeroU16;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_rustls::client::TlsStream;
use transport_core::device_name;
use transport_core::framing::encode_order_body;
use transport_mqtt::broker::connection::ORDERS_PREFIX;
use transport_mqtt::client::{connect_packet, connect_tls, MqttStream};
use transport_mqtt::codec::{encode_publish, Packet, QoS, Subscribe};

/// How long it waits for an answer it expects.
const ANSWER: Duration = Duration::from_secs(5);
/// Silent connections held at most.
const HALF_OPEN_HELD: usize = 256;

type Conn = MqttStream<TlsStream<TcpStream>>;

/// Start the attacks on the broker.
pub async fn start(
    ctx: &Ctx,
    tasks: &mut JoinSet<Result<(), AdversaryError>>,
) -> Result<(), AdversaryError> {
    let clients = Arc::new(Clients::load(&ctx.config.identity, &[])?);
    let connect = ctx.config.connect_rate;
    tasks.spawn(noise::streams(ctx.clone(), connect / 4.0));
    tasks.spawn(flood(
        ctx.clone(),
        clients.foreign.clone(),
        connect / 6.0,
        kind::FOREIGN_CERTIFICATE,
    ));
    tasks.spawn(flood(
        ctx.clone(),
        clients.anonymous.clone(),
        connect / 6.0,
        kind::NO_CERTIFICATE,
    ));
    tasks.spawn(half_open(ctx.clone(), connect / 6.0));
    tasks.spawn(device(ctx.clone(), clients, ctx.config.rate / 10.0));
    Ok(())
}

/// TLS handshakes with `config` (which the broker refuses), at `per_second`.
async fn flood(
    ctx: Ctx,
    config: Arc<rustls::ClientConfig>,
    per_second: f64,
    what: &'static str,
) -> Result<(), AdversaryError> {
    let mut pace = Pace::per_second(per_second);
    let slots = Arc::new(Semaphore::new(64));
    loop {
        pace.tick().await;
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        ctx.tally.one(what);
        let (target, config) = (ctx.config.target, config.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let _ = tokio::time::timeout(ANSWER, connect_tls(target, config)).await;
        });
    }
}

/// TCP connections opened and left silent for 15 s, at `per_second`.
async fn half_open(ctx: Ctx, per_second: f64) -> Result<(), AdversaryError> {
    let mut pace = Pace::per_second(per_second);
    let slots = Arc::new(Semaphore::new(HALF_OPEN_HELD));
    loop {
        pace.tick().await;
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let Ok(Ok(tcp)) = tokio::time::timeout(ANSWER, TcpStream::connect(ctx.config.target)).await
        else {
            continue;
        };
        ctx.tally.one(kind::HALF_OPEN);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(15)).await;
            drop((tcp, slot));
        });
    }
}

/// What its own device does, in turn.
const ACTS: &[&str] = &[
    kind::OWN_ORDER,
    kind::REPLAYED,
    kind::DEEP_FILTER,
    kind::RETAINED,
    kind::OWN_ORDER,
    kind::WRONG_SENDER,
    kind::OTHER_DEVICE_TOPIC,
    kind::OTHER_CLIENT_ID,
    kind::MALFORMED,
    kind::OVERSIZED,
    kind::HUGE_SUBSCRIBE,
];

/// Retained messages per burst, and the bytes of each.
const RETAINED_BURST: usize = 64;
const RETAINED_BYTES: usize = 64 << 10;

struct Device {
    ctx: Ctx,
    clients: Arc<Clients>,
    conn: Option<Conn>,
    own_run: u64,
    forge_run: u64,
    seq: u64,
    packet_id: u16,
    retained: u64,
    /// Its own PUBLISH packets as sent, for replay.
    sent: Vec<Bytes>,
}

/// Its own enrolled device, one act per tick.
async fn device(ctx: Ctx, clients: Arc<Clients>, per_second: f64) -> Result<(), AdversaryError> {
    let forge_run = nonzero();
    ctx.tally.forged_run(forge_run);
    let mut d = Device {
        ctx,
        clients,
        conn: None,
        own_run: nonzero(),
        forge_run,
        seq: 0,
        packet_id: 0,
        retained: 0,
        sent: Vec::new(),
    };
    let mut pace = Pace::per_second(per_second);
    let mut step = 0usize;
    loop {
        pace.tick().await;
        let what = ACTS[step % ACTS.len()];
        step += 1;
        match tokio::time::timeout(4 * ANSWER, d.act(what)).await {
            Ok(Some(n)) => d.ctx.tally.add(what, n),
            // Not sent (no connection, the server restarting): tried again at its next turn.
            Ok(None) => {}
            Err(_) => d.conn = None,
        }
    }
}

impl Device {
    fn next_id(&mut self) -> NonZeroU16 {
        self.packet_id = self.packet_id.wrapping_add(1).max(1);
        NonZeroU16::new(self.packet_id).expect("at least 1")
    }

    /// A TLS connection with its own certificate and CONNECT as `client_id`; the CONNACK's verdict.
    async fn open(&self, client_id: &str) -> Option<Result<Conn, ()>> {
        let tls = connect_tls(self.ctx.config.target, self.clients.own.clone())
            .await
            .ok()?;
        let mut conn = MqttStream::new(tls);
        let connected =
            tokio::time::timeout(ANSWER, conn.connect(connect_packet(client_id, true, 60)))
                .await
                .ok()?;
        Some(connected.map(|_| conn).map_err(|_| ()))
    }

    /// Its connection, opened if needed.
    async fn conn(&mut self) -> Option<&mut Conn> {
        if self.conn.is_none() {
            self.conn = self.open(&self.ctx.own.name).await?.ok();
        }
        self.conn.as_mut()
    }

    /// Send `bytes` on its connection and wait for a packet for which `want` holds; `None` if the connection failed
    /// (it is dropped and opened again next time).
    async fn exchange(&mut self, bytes: &[u8], want: impl Fn(&Packet) -> bool) -> Option<()> {
        let conn = self.conn().await?;
        let done = async {
            conn.send_raw(bytes).await.ok()?;
            loop {
                let p = conn.recv().await.ok()?;
                if want(&p) {
                    return Some(());
                }
            }
        };
        let r = tokio::time::timeout(ANSWER, done).await.ok().flatten();
        if r.is_none() {
            self.conn = None;
        }
        r
    }

    /// Send `bytes`, which the broker answers by closing the connection; the connection is dropped.
    async fn closing(&mut self, bytes: &[u8]) -> Option<u64> {
        let conn = self.conn().await?;
        let sent = conn.send_raw(bytes).await.is_ok();
        if sent {
            // Wait (briefly) for the broker to close it, so the next act does not race the close.
            let _ =
                tokio::time::timeout(ANSWER, async { while conn.recv().await.is_ok() {} }).await;
        }
        self.conn = None;
        sent.then_some(1)
    }

    /// An order PUBLISH (QoS 1) to `orders/<device>` of an order of `sender_device` in `run`.
    fn order_publish(&mut self, device: u32, sender_device: u32, run: u64) -> Bytes {
        let order = crate::harness::order(sender_device, run, self.seq, 64);
        self.seq += 1;
        let mut body = BytesMut::new();
        encode_order_body(&order, &mut body);
        let topic = format!("{ORDERS_PREFIX}{}", device_name(device));
        let id = self.next_id();
        let mut out = BytesMut::new();
        encode_publish(
            &mut out,
            false,
            QoS::AtLeastOnce,
            false,
            &topic,
            Some(id),
            &body,
        )
        .expect("a valid QoS 1 PUBLISH");
        out.freeze()
    }

    fn victim(&self) -> u32 {
        rand::rng().random_range(0..self.ctx.own.device.max(1))
    }

    /// Do one act; how many of its kind were sent.
    async fn act(&mut self, what: &'static str) -> Option<u64> {
        let own = self.ctx.own.device;
        match what {
            kind::OWN_ORDER => {
                let publish = self.order_publish(own, own, self.own_run);
                let id = packet_id_of(&publish);
                self.exchange(&publish, |p| *p == Packet::PubAck(id))
                    .await?;
                self.ctx.tally.answered();
                if self.sent.len() < 256 {
                    self.sent.push(publish);
                }
                Some(1)
            }
            kind::REPLAYED => {
                let i = rand::rng().random_range(0..self.sent.len().max(1));
                let mut again = BytesMut::from(&self.sent.get(i)?[..]);
                again[0] |= 0x08; // DUP
                let id = packet_id_of(&again);
                self.exchange(&again, |p| *p == Packet::PubAck(id)).await?;
                Some(1)
            }
            kind::DEEP_FILTER => {
                let id = self.next_id();
                let subscribe = Packet::Subscribe(Subscribe {
                    packet_id: id,
                    filters: vec![(format!("{}#", "/".repeat(65_000)), QoS::AtMostOnce)],
                });
                let mut out = BytesMut::new();
                subscribe.encode(&mut out).ok()?;
                self.exchange(
                    &out,
                    |p| matches!(p, Packet::SubAck(a) if a.packet_id == id),
                )
                .await?;
                Some(1)
            }
            kind::RETAINED => {
                let mut out = BytesMut::new();
                let payload = vec![0xa5u8; RETAINED_BYTES];
                for _ in 0..RETAINED_BURST {
                    self.retained += 1;
                    let topic = format!("junk/{}/{}", self.ctx.own.name, self.retained);
                    encode_publish(
                        &mut out,
                        false,
                        QoS::AtMostOnce,
                        true,
                        &topic,
                        None,
                        &payload,
                    )
                    .ok()?;
                }
                // A PINGREQ after the burst: its PINGRESP says the broker has read every PUBLISH before it.
                Packet::PingReq.encode(&mut out).ok()?;
                self.exchange(&out, |p| *p == Packet::PingResp).await?;
                Some(RETAINED_BURST as u64)
            }
            kind::WRONG_SENDER => {
                let publish = self.order_publish(own, self.victim(), self.forge_run);
                self.closing(&publish).await
            }
            kind::OTHER_DEVICE_TOPIC => {
                let victim = self.victim();
                let publish = self.order_publish(victim, victim, self.forge_run);
                self.closing(&publish).await
            }
            kind::OTHER_CLIENT_ID => {
                // Refused with return code 2 before it meets any session: its own connection is not taken over.
                let refused = self.open(&device_name(self.victim())).await?;
                Some(u64::from(refused.is_err()))
            }
            kind::MALFORMED => {
                const SHAPES: [&[u8]; 4] = [
                    &[0xF0, 0x00],                   // a reserved packet type
                    &[0x42, 0x02, 0x00, 0x01],       // PUBACK with forbidden flags
                    &[0x30, 0x03, 0x00, 0x05, 0x61], // a topic length past the packet's end
                    b"GET / HTTP/1.1\r\n\r\n",
                ];
                let shape = SHAPES[rand::rng().random_range(0..SHAPES.len())];
                self.closing(shape).await
            }
            kind::OVERSIZED => self.closing(&[0x30, 0xFF, 0xFF, 0xFF, 0x7F]).await,
            kind::HUGE_SUBSCRIBE => {
                let subscribe = Packet::Subscribe(Subscribe {
                    packet_id: self.next_id(),
                    filters: vec![("a".to_string(), QoS::AtMostOnce); 150_000],
                });
                let mut out = BytesMut::new();
                subscribe.encode(&mut out).ok()?;
                self.closing(&out).await
            }
            _ => None,
        }
    }
}

/// The packet identifier of a QoS 1 PUBLISH this module encoded (after the topic).
fn packet_id_of(publish: &[u8]) -> NonZeroU16 {
    // Fixed header: one byte, then the remaining length (1 to 4 bytes, the last without its top bit).
    let mut at = 1;
    while publish[at] & 0x80 != 0 {
        at += 1;
    }
    at += 1;
    let topic_len = u16::from_be_bytes([publish[at], publish[at + 1]]) as usize;
    at += 2 + topic_len;
    NonZeroU16::new(u16::from_be_bytes([publish[at], publish[at + 1]])).unwrap_or(NonZeroU16::MIN)
}
