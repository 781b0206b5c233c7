//! Hostile clients against the `mqtt-broker` binary, run as a child process so that a crash fails the test instead
//! of ending the test process: a topic filter of 65,000 empty levels (which overflowed the stack of the recursive
//! subscription tree on a clean disconnect or on a publish to a deep topic), and one SUBSCRIBE with 150,000 filters
//! against thousands of retained messages (which held the broker's lock for as long as it took to scan every
//! retained message once per filter). After each attack the broker must still be running and serving others.

mod common;

use bytes::Bytes;
use common::process::{any_port, BrokerProcess};
use common::{closed_within, recv_within};
use std::num::NonZeroU16;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use transport_mqtt::client::{connect_packet, MqttStream};
use transport_mqtt::codec::{Packet, PacketId, Publish, QoS, Subscribe, SubscribeReturnCode};

const SECOND: Duration = Duration::from_secs(1);

fn pid(n: u16) -> PacketId {
    NonZeroU16::new(n).unwrap()
}

type Plain = MqttStream<TcpStream>;

/// A plaintext client connected with `id`.
async fn client(b: &BrokerProcess, id: &str, clean: bool) -> Plain {
    let mut c = MqttStream::new(TcpStream::connect(b.plain).await.unwrap());
    c.connect(connect_packet(id, clean, 0)).await.unwrap();
    c
}

/// The broker process is running and answers a new client's PINGREQ within a second.
async fn still_serving(b: &mut BrokerProcess) {
    assert!(b.is_alive(), "the broker process died");
    let mut c = client(b, "witness-check", true).await;
    c.send(&Packet::PingReq).await.unwrap();
    assert_eq!(recv_within(&mut c, SECOND).await.unwrap(), Packet::PingResp);
}

fn publish(topic: &str, payload: &'static [u8], retain: bool) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain,
        topic: topic.into(),
        packet_id: Some(pid(1)),
        payload: Bytes::from_static(payload),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_of_65000_empty_levels_is_refused_and_its_session_ends_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = BrokerProcess::start(dir.path(), 1, any_port(), any_port(), &[]);
    let deep_filter = format!("{}#", "/".repeat(65_000));

    // A clean session subscribes and disconnects: the session's subscriptions are removed from the tree.
    let mut c = client(&b, "deep-1", true).await;
    let sub = Subscribe {
        packet_id: pid(7),
        filters: vec![(deep_filter, QoS::AtMostOnce)],
    };
    c.send(&Packet::Subscribe(sub)).await.unwrap();
    let Packet::SubAck(ack) = recv_within(&mut c, 10 * SECOND).await.unwrap() else {
        panic!("expected SUBACK");
    };
    c.send(&Packet::Disconnect).await.unwrap();
    drop(c);
    tokio::time::sleep(SECOND / 2).await;
    still_serving(&mut b).await;
    assert_eq!(
        ack.return_codes,
        [SubscribeReturnCode::Failure],
        "a filter deeper than the level cap is refused with 0x80"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_to_a_topic_of_65000_empty_levels_neither_crashes_nor_is_routed() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = BrokerProcess::start(dir.path(), 1, any_port(), any_port(), &[]);
    // A session holds the deep filter (if the broker grants it) while another client publishes to a topic as deep.
    let sub = Subscribe {
        packet_id: pid(7),
        filters: vec![(format!("{}#", "/".repeat(65_000)), QoS::AtMostOnce)],
    };
    let mut c = client(&b, "deep-2", false).await;
    c.send(&Packet::Subscribe(sub)).await.unwrap();
    assert!(matches!(
        recv_within(&mut c, 10 * SECOND).await.unwrap(),
        Packet::SubAck(_)
    ));
    let mut p = client(&b, "deep-publisher", true).await;
    p.send(&publish(&"/".repeat(65_000), b"x", false))
        .await
        .unwrap();
    assert!(
        closed_within(&mut p, 5 * SECOND).await,
        "a PUBLISH to a topic deeper than the cap closes the connection"
    );
    tokio::time::sleep(SECOND / 2).await;
    still_serving(&mut b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_with_150000_filters_is_refused_without_stalling_others() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = BrokerProcess::start(dir.path(), 1, any_port(), any_port(), &[]);
    // Thousands of retained messages that the attacker's filter does not even match.
    let mut r = client(&b, "retainer", true).await;
    for i in 0..4000u16 {
        let packet = Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: true,
            topic: format!("r/{i}"),
            packet_id: None,
            payload: Bytes::from_static(b"kept"),
        });
        r.send(&packet).await.unwrap();
    }
    r.send(&Packet::PingReq).await.unwrap();
    assert_eq!(
        recv_within(&mut r, 10 * SECOND).await.unwrap(),
        Packet::PingResp
    );

    let mut witness = client(&b, "witness", true).await;
    let mut attacker = client(&b, "attacker", true).await;
    let sub = Subscribe {
        packet_id: pid(1),
        filters: vec![("a".to_string(), QoS::AtMostOnce); 150_000],
    };
    attacker.send(&Packet::Subscribe(sub)).await.unwrap();
    // Give the broker the packet, then check that everyone else is still served promptly.
    tokio::time::sleep(SECOND / 5).await;
    let started = Instant::now();
    witness.send(&Packet::PingReq).await.unwrap();
    let answer = recv_within(&mut witness, 2 * SECOND).await;
    assert!(
        matches!(answer, Ok(Packet::PingResp)),
        "the witness waited {:?} ({answer:?}) while one SUBSCRIBE was served",
        started.elapsed()
    );
    assert!(
        closed_within(&mut attacker, 2 * SECOND).await,
        "a SUBSCRIBE over the per-packet filter cap closes its connection"
    );
    still_serving(&mut b).await;
}
