//! Bad input against the broker over TLS: each misbehaving client is disconnected, a well-behaved pair of clients
//! connected throughout keeps working, and the broker keeps running. Then the order sink: every order stored once,
//! each PUBACK only after its commit, a re-sent order marked DUP, and nothing lost or doubled across a restart.

mod common;

use bytes::{Bytes, BytesMut};
use common::{closed_within, quick_config, recv_within, TestBroker, Tls};
use std::collections::HashSet;
use std::num::NonZeroU16;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use transport_conn::fleet::{ConnFleet, Policy};
use transport_core::framing::encode_order_body;
use transport_core::{Counters, Fleet, LinkEvent, Order, OrderId};
use transport_mqtt::client::{connect_packet, OrderConnector};
use transport_mqtt::codec::{Packet, PacketId, Publish, QoS, Subscribe};
use transport_store::{audit, read_log};
use transport_tls::ClientTls;

const SECOND: Duration = Duration::from_secs(1);

fn pid(n: u16) -> PacketId {
    NonZeroU16::new(n).unwrap()
}

fn publish(topic: &str, qos: QoS, id: u16, payload: Bytes) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.into(),
        packet_id: (qos != QoS::AtMostOnce).then(|| pid(id)),
        payload,
    })
}

/// A well-behaved publisher (device 0) and subscriber (device 1, `w/#` at QoS 1), connected for the whole test.
struct Witness {
    publisher: Tls,
    subscriber: Tls,
    round: u16,
}

impl Witness {
    async fn new(b: &TestBroker) -> Witness {
        let publisher = b.connected(0, true, 0).await;
        let mut subscriber = b.connected(1, true, 0).await;
        let sub = Subscribe {
            packet_id: pid(1),
            filters: vec![("w/#".into(), QoS::AtLeastOnce)],
        };
        subscriber.send(&Packet::Subscribe(sub)).await.unwrap();
        assert!(matches!(
            recv_within(&mut subscriber, SECOND).await.unwrap(),
            Packet::SubAck(_)
        ));
        Witness {
            publisher,
            subscriber,
            round: 0,
        }
    }

    /// One QoS 1 message from the publisher to the subscriber, acknowledged at both ends.
    async fn still_works(&mut self) {
        self.round += 1;
        let topic = format!("w/{}", self.round);
        self.publisher
            .send(&publish(
                &topic,
                QoS::AtLeastOnce,
                self.round,
                Bytes::from_static(b"ok"),
            ))
            .await
            .unwrap();
        assert_eq!(
            recv_within(&mut self.publisher, SECOND).await.unwrap(),
            Packet::PubAck(pid(self.round))
        );
        match recv_within(&mut self.subscriber, SECOND).await.unwrap() {
            Packet::Publish(p) => {
                assert_eq!(p.topic, topic);
                self.subscriber
                    .send(&Packet::PubAck(p.packet_id.unwrap()))
                    .await
                    .unwrap();
            }
            other => panic!("expected the witness message, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_disconnects_only_its_sender() {
    let b = TestBroker::start(4, quick_config(), false).await;
    let mut w = Witness::new(&b).await;

    // Before CONNECT: a reserved packet type.
    let mut bad = b.tls(2).await;
    bad.send_raw(&[0xF0; 32]).await.unwrap();
    assert!(closed_within(&mut bad, 2 * SECOND).await);
    w.still_works().await;

    // After CONNECT: text where packets belong ('G' is a PUBACK with forbidden flags).
    let mut bad = b.connected(3, true, 0).await;
    bad.send_raw(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    assert!(closed_within(&mut bad, 2 * SECOND).await);
    w.still_works().await;

    // Not even TLS: bytes straight onto the TLS port.
    let mut tcp = tokio::net::TcpStream::connect(b.addr).await.unwrap();
    tcp.write_all(&[0x10, 0x0c, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 0, 0, 0])
        .await
        .unwrap();
    let mut sink = Vec::new();
    let read = tokio::time::timeout(2 * SECOND, tcp.read_to_end(&mut sink)).await;
    assert!(
        read.is_ok(),
        "the server closes a connection that does not speak TLS"
    );
    w.still_works().await;

    assert!(
        b.counters.snapshot().refused_malformed >= 3,
        "{:?}",
        b.counters.snapshot()
    );
    assert_eq!(b.broker.stats().clients_connected, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_packet_then_silence_is_cut_by_the_timeouts() {
    let b = TestBroker::start(4, quick_config(), false).await;
    let mut w = Witness::new(&b).await;

    // Before CONNECT: the connect timeout (1 s here) applies.
    let started = Instant::now();
    let mut bad = b.tls(2).await;
    bad.send_raw(&[0x10, 0x20, 0x00]).await.unwrap();
    assert!(closed_within(&mut bad, 3 * SECOND).await);
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    w.still_works().await;

    // After CONNECT with keepalive 1 s: cut after 1.5 s without a whole packet.
    let mut bad = b.connected(3, true, 1).await;
    let started = Instant::now();
    bad.send_raw(&[0x30, 0x10, 0x00]).await.unwrap();
    assert!(closed_within(&mut bad, 4 * SECOND).await);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(1400), "{waited:?}");
    w.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_remaining_length_is_refused_from_its_header() {
    let b = TestBroker::start(4, quick_config(), false).await;
    let mut w = Witness::new(&b).await;
    // The largest remaining length MQTT can say (256 MiB), and one just over this broker's 64 KiB: no body follows,
    // and neither connection may wait for one.
    for header in [
        &[0x30, 0xff, 0xff, 0xff, 0x7f][..],
        &[0x30, 0x80, 0x80, 0x04],
    ] {
        let mut bad = b.connected(2, true, 0).await;
        bad.send_raw(header).await.unwrap();
        // Keepalive is off and no connect timeout applies any more: only the header can close it.
        assert!(closed_within(&mut bad, 2 * SECOND).await);
        w.still_works().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_connect_disconnects_the_client() {
    let b = TestBroker::start(4, quick_config(), false).await;
    let mut w = Witness::new(&b).await;
    let mut bad = b.connected(2, true, 0).await;
    bad.send(&Packet::Connect(connect_packet("dev-2", true, 0)))
        .await
        .unwrap();
    assert!(closed_within(&mut bad, 2 * SECOND).await);
    w.still_works().await;
    // The same device can come back at once.
    let mut again = b.connected(2, true, 0).await;
    again.send(&Packet::PingReq).await.unwrap();
    assert_eq!(
        recv_within(&mut again, SECOND).await.unwrap(),
        Packet::PingResp
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_subscriber_loses_qos0_messages_but_keeps_its_connection() {
    let mut config = quick_config();
    config.limits.max_queued_qos0 = 16;
    let b = TestBroker::start(4, config, false).await;
    let mut w = Witness::new(&b).await;
    let mut slow = b.connected(2, true, 0).await;
    let sub = Subscribe {
        packet_id: pid(1),
        filters: vec![("flood".into(), QoS::AtMostOnce)],
    };
    slow.send(&Packet::Subscribe(sub)).await.unwrap();
    assert!(matches!(
        recv_within(&mut slow, SECOND).await.unwrap(),
        Packet::SubAck(_)
    ));

    // 32 MiB of QoS 0 to a subscriber that reads nothing: far more than the socket buffers hold.
    let mut flood = b.connected(3, true, 0).await;
    let payload = Bytes::from(vec![0x55; 1024]);
    let mut batch = BytesMut::new();
    for _ in 0..256 {
        publish("flood", QoS::AtMostOnce, 0, payload.clone())
            .encode(&mut batch)
            .unwrap();
    }
    for _ in 0..128 {
        flood.send_raw(&batch).await.unwrap();
    }
    flood.send(&Packet::PingReq).await.unwrap();
    assert_eq!(
        recv_within(&mut flood, 10 * SECOND).await.unwrap(),
        Packet::PingResp
    );
    let dropped = b.counters.snapshot().dropped;
    assert!(dropped > 0, "nothing dropped");
    assert_eq!(b.broker.stats().messages_dropped, dropped);
    w.still_works().await;

    // The slow subscriber is still connected: it reads what was kept, then its PINGRESP.
    slow.send(&Packet::PingReq).await.unwrap();
    let mut delivered = 0u64;
    let mut pong = false;
    // Read until the PINGRESP has come and the queue has run dry.
    while let Ok(packet) = recv_within(&mut slow, if pong { SECOND / 2 } else { 10 * SECOND }).await
    {
        match packet {
            Packet::Publish(_) => delivered += 1,
            Packet::PingResp => pong = true,
            other => panic!("{other:?}"),
        }
    }
    assert!(pong);
    assert_eq!(
        delivered + dropped,
        128 * 256,
        "every message delivered or counted as dropped"
    );
}

fn order(sender: u64, seq: u64) -> Order {
    Order {
        id: OrderId {
            sender,
            run: 0xabc,
            seq,
        },
        made_us: 1,
        payload: vec![seq as u8; 16],
    }
}

fn order_publish(o: &Order, device: u32, id: u16) -> Packet {
    let mut body = BytesMut::new();
    encode_order_body(o, &mut body);
    publish(
        &format!("orders/dev-{device}"),
        QoS::AtLeastOnce,
        id,
        body.freeze(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_is_acknowledged_only_once_stored_and_only_from_its_device() {
    let b = TestBroker::start(4, quick_config(), false).await;
    let mut c = b.connected(2, false, 0).await;
    for seq in 0..20 {
        let o = order(2, seq);
        c.send(&order_publish(&o, 2, seq as u16 + 1)).await.unwrap();
        assert_eq!(
            recv_within(&mut c, SECOND).await.unwrap(),
            Packet::PubAck(pid(seq as u16 + 1))
        );
        let log = read_log(&b.store_dir()).unwrap();
        assert!(
            log.iter().any(|e| e.id == o.id),
            "PUBACK before the order was in the log"
        );
    }
    // The same order again (a re-send): acknowledged, applied once.
    c.send(&order_publish(&order(2, 0), 2, 99)).await.unwrap();
    assert_eq!(
        recv_within(&mut c, SECOND).await.unwrap(),
        Packet::PubAck(pid(99))
    );
    // Device 2 cannot place device 3's order, in either way of trying: nothing is stored, the connection is closed.
    for (topic_device, sender) in [(3, 3), (2, 3)] {
        let mut c = b.connected(2, true, 0).await;
        c.send(&order_publish(&order(sender, 500), topic_device, 1))
            .await
            .unwrap();
        assert!(closed_within(&mut c, 2 * SECOND).await);
    }
    let made: Vec<OrderId> = (0..20).map(|s| order(2, s).id).collect();
    let a = audit(&b.store_dir(), &made, &made).unwrap();
    assert!(a.is_clean(), "{a:?}");
    assert_eq!((a.applied, a.unknown), (20, 0));
    assert_eq!(b.counters.snapshot().refused_unknown, 2);
}

/// Run a fleet of `devices` against `server`, each sending `per_device` orders; returns the ids stored.
async fn run_fleet(
    b: &TestBroker,
    server: std::net::SocketAddr,
    devices: u32,
    per_device: u64,
) -> (Vec<OrderId>, HashSet<OrderId>, Arc<Counters>) {
    let counters = Arc::new(Counters::default());
    let tls = ClientTls::new(b.credentials.clone(), counters.clone(), &[]).unwrap();
    let (events, mut rx) = transport_core::events::channel();
    let fleet = ConnFleet::start(
        OrderConnector::new(server, tls),
        devices,
        events,
        counters.clone(),
        Policy::default(),
    );
    let mut made = Vec::new();
    for seq in 0..per_device {
        for d in 0..devices {
            let o = order(u64::from(d), seq);
            made.push(o.id);
            fleet.send(d, o);
        }
    }
    let mut stored = HashSet::new();
    while stored.len() < made.len() {
        match tokio::time::timeout(20 * SECOND, rx.recv()).await {
            Ok(Some(LinkEvent::Stored { id, .. })) => {
                assert!(stored.insert(id), "{id} reported twice")
            }
            Ok(Some(_)) => {}
            _ => panic!("{} of {} stored", stored.len(), made.len()),
        }
    }
    fleet.close().await;
    (made, stored, counters)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_from_many_devices_are_all_stored_once() {
    let b = TestBroker::start(24, quick_config(), false).await;
    let (made, stored, counters) = run_fleet(&b, b.addr, 24, 25).await;
    let acked: Vec<OrderId> = stored.into_iter().collect();
    let a = audit(&b.store_dir(), &made, &acked).unwrap();
    assert!(a.is_clean(), "{a:?}");
    assert_eq!(a.applied, 24 * 25);
    assert_eq!(counters.snapshot().handshakes, 24);
    assert_eq!(
        b.counters.snapshot().handshakes,
        24,
        "handshakes counted on the server"
    );
}

/// A server that takes the first PUBLISH of each order, drops the connection without answering, and acknowledges
/// the second: what a client sees when its broker dies between receiving and storing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_order_carries_dup_and_its_first_packet_id() {
    let dir = tempfile::tempdir().unwrap();
    transport_tls::write_pki(dir.path(), 1).unwrap();
    let counters = Arc::new(Counters::default());
    let server_tls = transport_tls::server_config(dir.path(), counters.clone(), &[]).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(server_tls);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen_by_server = seen.clone();
    let server = tokio::spawn(async move {
        for attempt in 0..2 {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut s =
                transport_mqtt::client::MqttStream::new(acceptor.accept(tcp).await.unwrap());
            assert!(matches!(s.recv().await.unwrap(), Packet::Connect(_)));
            let ack = transport_mqtt::codec::ConnAck {
                session_present: attempt > 0,
                code: transport_mqtt::codec::ConnectReturnCode::Accepted,
            };
            s.send(&Packet::ConnAck(ack)).await.unwrap();
            let Packet::Publish(p) = s.recv().await.unwrap() else {
                panic!("expected PUBLISH")
            };
            seen_by_server.lock().unwrap().push((p.dup, p.packet_id));
            if attempt == 1 {
                s.send(&Packet::PubAck(p.packet_id.unwrap())).await.unwrap();
                tokio::time::sleep(SECOND).await;
            }
        }
    });
    let credentials = Arc::new(transport_tls::DeviceCredentials::load(dir.path()).unwrap());
    let tls = ClientTls::new(credentials, counters.clone(), &[]).unwrap();
    let (events, mut rx) = transport_core::events::channel();
    let fleet = ConnFleet::start(
        OrderConnector::new(addr, tls),
        1,
        events,
        counters.clone(),
        Policy::default(),
    );
    fleet.send(0, order(0, 0));
    loop {
        if let LinkEvent::Stored { id, .. } = tokio::time::timeout(10 * SECOND, rx.recv())
            .await
            .unwrap()
            .unwrap()
        {
            assert_eq!(id, order(0, 0).id);
            break;
        }
    }
    fleet.close().await;
    server.abort();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(
        !seen[0].0 && seen[1].0,
        "first send without DUP, the re-send with DUP: {seen:?}"
    );
    assert_eq!(
        seen[0].1, seen[1].1,
        "the re-send keeps its packet identifier"
    );
    let c = counters.snapshot();
    assert_eq!((c.reconnects, c.resent_reconnect), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plaintext_listener_takes_the_client_id_as_given() {
    let b = TestBroker::start(1, quick_config(), true).await;
    let tcp = tokio::net::TcpStream::connect(b.plain.unwrap())
        .await
        .unwrap();
    let mut c = transport_mqtt::client::MqttStream::new(tcp);
    c.connect(connect_packet("sensor-7", true, 0))
        .await
        .unwrap();
    let sub = Subscribe {
        packet_id: pid(1),
        filters: vec![("t".into(), QoS::AtLeastOnce)],
    };
    c.send(&Packet::Subscribe(sub)).await.unwrap();
    assert!(matches!(
        recv_within(&mut c, SECOND).await.unwrap(),
        Packet::SubAck(_)
    ));
    c.send(&publish("t", QoS::AtMostOnce, 0, Bytes::from_static(b"x")))
        .await
        .unwrap();
    assert!(matches!(
        recv_within(&mut c, SECOND).await.unwrap(),
        Packet::Publish(_)
    ));
    // Its identity is its client id: it cannot place dev-7's order.
    c.send(&order_publish(&order(7, 0), 7, 2)).await.unwrap();
    assert!(closed_within(&mut c, 2 * SECOND).await);
    assert_eq!(b.counters.snapshot().handshakes, 0);
    // Nor under dev-7's own name: a plaintext client has no verified identity, so no order sink.
    let tcp = tokio::net::TcpStream::connect(b.plain.unwrap())
        .await
        .unwrap();
    let mut c = transport_mqtt::client::MqttStream::new(tcp);
    c.connect(connect_packet("dev-7", true, 0)).await.unwrap();
    c.send(&order_publish(&order(7, 0), 7, 2)).await.unwrap();
    assert!(closed_within(&mut c, 2 * SECOND).await);
    assert!(read_log(&b.store_dir()).unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_0_does_not_let_a_client_idle_for_ever() {
    let mut config = quick_config();
    config.max_idle = SECOND;
    let b = TestBroker::start(4, config, false).await;
    let started = Instant::now();
    let mut idle = b.connected(2, true, 0).await;
    assert!(closed_within(&mut idle, 4 * SECOND).await);
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert_eq!(b.broker.stats().clients_connected, 0);
    // Clients that keep talking are served.
    let mut w = Witness::new(&b).await;
    w.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_closed_after_the_write_timeout() {
    let mut config = quick_config();
    config.write_timeout = SECOND;
    config.limits.max_queued_qos0 = 100_000;
    config.limits.max_queued_bytes = 1 << 30;
    let b = TestBroker::start(4, config, false).await;
    let mut deaf = b.connected(2, true, 0).await;
    let sub = Subscribe {
        packet_id: pid(1),
        filters: vec![("flood".into(), QoS::AtMostOnce)],
    };
    deaf.send(&Packet::Subscribe(sub)).await.unwrap();
    assert!(matches!(
        recv_within(&mut deaf, SECOND).await.unwrap(),
        Packet::SubAck(_)
    ));
    // 48 MiB for a client that reads nothing: more than the socket buffers hold, so its writer stalls.
    let mut flood = b.connected(3, true, 0).await;
    let payload = Bytes::from(vec![0x55; 16 * 1024]);
    let mut batch = BytesMut::new();
    for _ in 0..64 {
        publish("flood", QoS::AtMostOnce, 0, payload.clone())
            .encode(&mut batch)
            .unwrap();
    }
    for _ in 0..48 {
        flood.send_raw(&batch).await.unwrap();
    }
    let mut detached = false;
    for _ in 0..100 {
        if b.broker.stats().clients_connected == 1 {
            detached = true;
            break;
        }
        tokio::time::sleep(SECOND / 10).await;
    }
    assert!(detached, "the deaf client's session is still attached");
    flood.send(&Packet::PingReq).await.unwrap();
    assert_eq!(
        recv_within(&mut flood, SECOND).await.unwrap(),
        Packet::PingResp
    );
}
