//! Persistent sessions across a broker killed with SIGKILL and started again on the same ports and state directory
//! (the `mqtt-broker` binary as a child process): subscriptions, queued QoS 1 and 2 messages and in-flight packet
//! identifiers survive, each message is delivered exactly once at QoS 2, and a QoS 2 order re-sent after the
//! restart is stored once.

mod common;

use bytes::{Bytes, BytesMut};
use common::process::{any_port, BrokerProcess};
use common::{closed_within, recv_within};
use std::num::NonZeroU16;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use transport_core::framing::encode_order_body;
use transport_core::{Counters, Order, OrderId};
use transport_mqtt::client::{connect_packet, connect_tls, MqttStream};
use transport_mqtt::codec::{Packet, PacketId, Publish, QoS, Subscribe};
use transport_store::audit;
use transport_tls::{ClientTls, DeviceCredentials};

const SECOND: Duration = Duration::from_secs(1);

fn pid(n: u16) -> PacketId {
    NonZeroU16::new(n).unwrap()
}

type Plain = MqttStream<TcpStream>;

/// A plaintext client; returns it with CONNACK's session present flag.
async fn client(b: &BrokerProcess, id: &str, clean: bool) -> (Plain, bool) {
    let mut c = MqttStream::new(TcpStream::connect(b.plain).await.unwrap());
    let ack = c.connect(connect_packet(id, clean, 0)).await.unwrap();
    (c, ack.session_present)
}

fn publish(topic: &str, qos: QoS, id: u16, payload: &[u8], dup: bool) -> Packet {
    Packet::Publish(Publish {
        dup,
        qos,
        retain: false,
        topic: topic.into(),
        packet_id: Some(pid(id)),
        payload: Bytes::copy_from_slice(payload),
    })
}

/// Kill the broker with SIGKILL and start it again on the same ports and directory.
fn restart(b: &mut BrokerProcess) {
    let (tls, plain, dir) = (b.tls, b.plain, b.dir.clone());
    b.kill();
    *b = BrokerProcess::start(&dir, 2, tls, plain, &[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_queued_messages_and_packet_ids_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = BrokerProcess::start(dir.path(), 2, any_port(), any_port(), &[]);

    // A persistent subscriber, then away.
    let (mut sub, present) = client(&b, "sub", false).await;
    assert!(!present);
    let subscribe = Subscribe {
        packet_id: pid(1),
        filters: vec![("p/#".into(), QoS::ExactlyOnce)],
    };
    sub.send(&Packet::Subscribe(subscribe)).await.unwrap();
    assert!(matches!(
        recv_within(&mut sub, SECOND).await.unwrap(),
        Packet::SubAck(_)
    ));
    sub.send(&Packet::Disconnect).await.unwrap();
    drop(sub);

    // Three messages while it is away: QoS 2, QoS 1, QoS 2. Each acknowledgement means stored for the subscriber.
    let (mut publisher, _) = client(&b, "pub", false).await;
    for (i, qos) in [QoS::ExactlyOnce, QoS::AtLeastOnce, QoS::ExactlyOnce]
        .into_iter()
        .enumerate()
    {
        let id = i as u16 + 1;
        publisher
            .send(&publish(
                &format!("p/{i}"),
                qos,
                id,
                format!("m{i}").as_bytes(),
                false,
            ))
            .await
            .unwrap();
        let ack = recv_within(&mut publisher, SECOND).await.unwrap();
        if qos == QoS::ExactlyOnce {
            assert_eq!(ack, Packet::PubRec(pid(id)));
            publisher.send(&Packet::PubRel(pid(id))).await.unwrap();
            assert_eq!(
                recv_within(&mut publisher, SECOND).await.unwrap(),
                Packet::PubComp(pid(id))
            );
        } else {
            assert_eq!(ack, Packet::PubAck(pid(id)));
        }
    }
    // And one QoS 2 PUBLISH whose PUBREL the publisher has not sent yet.
    publisher
        .send(&publish("p/3", QoS::ExactlyOnce, 9, b"m3", false))
        .await
        .unwrap();
    assert_eq!(
        recv_within(&mut publisher, SECOND).await.unwrap(),
        Packet::PubRec(pid(9))
    );

    // The subscriber returns, takes the first message to PUBREC (so its PUBREL is due), then the broker dies.
    let (mut sub, present) = client(&b, "sub", false).await;
    assert!(present);
    let Packet::Publish(first) = recv_within(&mut sub, SECOND).await.unwrap() else {
        panic!()
    };
    assert_eq!(
        (first.qos, &first.payload[..]),
        (QoS::ExactlyOnce, &b"m0"[..])
    );
    let first_id = first.packet_id.unwrap();
    sub.send(&Packet::PubRec(first_id)).await.unwrap();
    // The other messages arrive too (before or after that PUBREL); this client acknowledges none of them.
    let mut unacked = Vec::new();
    let mut pubrel = false;
    loop {
        match recv_within(&mut sub, SECOND / 2).await {
            Ok(Packet::Publish(p)) => unacked.push(p),
            Ok(Packet::PubRel(id)) if id == first_id => pubrel = true,
            Ok(other) => panic!("{other:?}"),
            Err(_) => break,
        }
    }
    assert!(pubrel);
    assert_eq!(unacked.len(), 3, "{unacked:?}");
    restart(&mut b);
    assert!(closed_within(&mut sub, 2 * SECOND).await);

    // After the restart: the session is present; the PUBREL comes again for the first (never its PUBLISH), then
    // the others with DUP and the identifiers they had, in the order first sent [MQTT-4.4.0-1].
    let (mut sub, present) = client(&b, "sub", false).await;
    assert!(present, "the session survived");
    assert_eq!(
        recv_within(&mut sub, SECOND).await.unwrap(),
        Packet::PubRel(first_id)
    );
    for before in &unacked {
        let Packet::Publish(p) = recv_within(&mut sub, SECOND).await.unwrap() else {
            panic!()
        };
        assert!(p.dup);
        assert_eq!(
            (p.packet_id, &p.payload, p.qos),
            (before.packet_id, &before.payload, before.qos)
        );
    }
    // The publisher re-sends its unreleased QoS 2 PUBLISH: acknowledged, not delivered a second time.
    let (mut publisher, present) = client(&b, "pub", false).await;
    assert!(present);
    publisher
        .send(&publish("p/3", QoS::ExactlyOnce, 9, b"m3", true))
        .await
        .unwrap();
    assert_eq!(
        recv_within(&mut publisher, SECOND).await.unwrap(),
        Packet::PubRec(pid(9))
    );
    publisher.send(&Packet::PubRel(pid(9))).await.unwrap();
    assert_eq!(
        recv_within(&mut publisher, SECOND).await.unwrap(),
        Packet::PubComp(pid(9))
    );
    // Complete everything; nothing more comes (m3 was delivered once, before the restart).
    sub.send(&Packet::PubComp(first_id)).await.unwrap();
    for p in &unacked {
        let id = p.packet_id.unwrap();
        if p.qos == QoS::AtLeastOnce {
            sub.send(&Packet::PubAck(id)).await.unwrap();
        } else {
            sub.send(&Packet::PubRec(id)).await.unwrap();
            assert_eq!(
                recv_within(&mut sub, SECOND).await.unwrap(),
                Packet::PubRel(id)
            );
            sub.send(&Packet::PubComp(id)).await.unwrap();
        }
    }
    sub.send(&Packet::PingReq).await.unwrap();
    assert_eq!(
        recv_within(&mut sub, SECOND).await.unwrap(),
        Packet::PingResp
    );
    assert!(
        recv_within(&mut sub, SECOND / 2).await.is_err(),
        "delivered twice"
    );

    // Once completed, a restart brings nothing back.
    restart(&mut b);
    let (mut sub, present) = client(&b, "sub", false).await;
    assert!(present);
    sub.send(&Packet::PingReq).await.unwrap();
    assert_eq!(
        recv_within(&mut sub, SECOND).await.unwrap(),
        Packet::PingResp
    );
    assert!(recv_within(&mut sub, SECOND / 2).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qos2_order_resent_after_a_restart_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = BrokerProcess::start(dir.path(), 2, any_port(), any_port(), &[]);
    let credentials = Arc::new(DeviceCredentials::load(&dir.path().join("id")).unwrap());
    let tls = ClientTls::new(credentials, Arc::new(Counters::default()), &[]).unwrap();
    let order = Order {
        id: OrderId {
            sender: 1,
            run: 5,
            seq: 1,
        },
        made_us: 1,
        payload: vec![1; 8],
    };
    let mut body = BytesMut::new();
    encode_order_body(&order, &mut body);
    let connect = |b: &BrokerProcess| {
        let (addr, config) = (b.tls, tls.config(1).unwrap());
        async move {
            let mut c = MqttStream::new(connect_tls(addr, config).await.unwrap());
            let ack = c.connect(connect_packet("dev-1", false, 0)).await.unwrap();
            (c, ack.session_present)
        }
    };
    let (mut c, _) = connect(&b).await;
    c.send(&publish("orders/dev-1", QoS::ExactlyOnce, 3, &body, false))
        .await
        .unwrap();
    assert_eq!(
        recv_within(&mut c, SECOND).await.unwrap(),
        Packet::PubRec(pid(3))
    );
    restart(&mut b);
    let (mut c, present) = connect(&b).await;
    assert!(present);
    // The client did not get PUBCOMP: it sends the PUBLISH again, then PUBREL.
    c.send(&publish("orders/dev-1", QoS::ExactlyOnce, 3, &body, true))
        .await
        .unwrap();
    assert_eq!(
        recv_within(&mut c, SECOND).await.unwrap(),
        Packet::PubRec(pid(3))
    );
    c.send(&Packet::PubRel(pid(3))).await.unwrap();
    assert_eq!(
        recv_within(&mut c, SECOND).await.unwrap(),
        Packet::PubComp(pid(3))
    );
    b.kill();
    let a = audit(&dir.path().join("store"), &[order.id], &[order.id]).unwrap();
    assert!(a.is_clean() && a.applied == 1, "{a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_session_journal_stops_the_start_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = BrokerProcess::start(dir.path(), 1, any_port(), any_port(), &[]);
    for i in 0..3 {
        let (mut c, _) = client(&b, &format!("s{i}"), false).await;
        let subscribe = Subscribe {
            packet_id: pid(1),
            filters: vec![("x".into(), QoS::AtLeastOnce)],
        };
        c.send(&Packet::Subscribe(subscribe)).await.unwrap();
        assert!(matches!(
            recv_within(&mut c, SECOND).await.unwrap(),
            Packet::SubAck(_)
        ));
    }
    b.kill();
    let journal = dir
        .path()
        .join("store")
        .join(transport_mqtt::broker::persist::JOURNAL_FILE);
    let mut bytes = std::fs::read(&journal).unwrap();
    bytes[20] ^= 0xff;
    std::fs::write(&journal, &bytes).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mqtt-broker"))
        .arg("--identity")
        .arg(dir.path().join("id"))
        .arg("--store")
        .arg(dir.path().join("store"))
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("mqtt-sessions.log is corrupt at offset 16"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
