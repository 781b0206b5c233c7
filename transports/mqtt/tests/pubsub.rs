//! Publish/subscribe through both MQTT servers, the in-tree broker and a real mosquitto, over TLS on 127.0.0.1, with
//! the suite's fleet on one side ([`transport_conn::testing`]) and, where a test needs a client that misbehaves, a
//! hand-driven MQTT connection. Only hard invariants are asserted: each message delivered once to each subscriber,
//! and every message a server did not deliver counted by it as dropped.
//!
//! Without the mosquitto binary the mosquitto tests fail, saying what to install, unless `LB_SKIP_MOSQUITTO=1` is
//! set, in which case they print loudly that they were skipped.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU16;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use transport_conn::testing::{self, any_port, collect_until, message, tally, Harness};
use transport_core::{Counters, LinkEvent, QoS};
use transport_mqtt::client::{channel_topic, connect_packet, connect_tls, MqttStream};
use transport_mqtt::codec::{self, Packet, Subscribe, SubscribeReturnCode};
use transport_mqtt::mosquitto::{find_binary, INSTALL_HINT};
use transport_mqtt::Mqtt;
use transport_tls::ClientTls;

/// The server: the in-tree broker, or mosquitto when it is installed (otherwise `None`, after failing unless
/// skipping was asked for).
fn harness(mosquitto: bool, devices: u32) -> Option<Harness> {
    if !mosquitto {
        return Some(Harness::new(Box::new(Mqtt::in_tree()), devices));
    }
    if find_binary("mosquitto").is_none() {
        assert!(
            std::env::var_os("LB_SKIP_MOSQUITTO").is_some(),
            "mosquitto is missing: {INSTALL_HINT} (or set LB_SKIP_MOSQUITTO=1)"
        );
        eprintln!("SKIPPED: mosquitto is not installed");
        return None;
    }
    Some(Harness::new(Box::new(Mqtt::mosquitto()), devices))
}

type Raw = MqttStream<TlsStream<TcpStream>>;

/// Device `device` connected by hand (persistent session) and subscribed to `bench/7` at `qos`.
async fn raw_subscriber(
    h: &Harness,
    addr: std::net::SocketAddr,
    device: u32,
    qos: codec::QoS,
) -> Raw {
    let tls = ClientTls::new(h.credentials(), Arc::new(Counters::default()), &[]).unwrap();
    let mut c = MqttStream::new(
        connect_tls(addr, tls.config(device).unwrap())
            .await
            .unwrap(),
    );
    c.connect(connect_packet(
        &transport_core::device_name(device),
        false,
        0,
    ))
    .await
    .unwrap();
    let packet_id = NonZeroU16::new(1).unwrap();
    c.send(&Packet::Subscribe(Subscribe {
        packet_id,
        filters: vec![(channel_topic(7), qos)],
    }))
    .await
    .unwrap();
    match c.recv().await.unwrap() {
        Packet::SubAck(a) => assert_eq!(a.return_codes, [SubscribeReturnCode::Granted(qos)]),
        other => panic!("{other:?}"),
    }
    c
}

async fn every_message_delivered_once(mosquitto: bool) {
    let Some(h) = harness(mosquitto, 5) else {
        return;
    };
    let counts = testing::every_message_delivered_once_to_each_subscriber(&h).await;
    if !mosquitto {
        // The server side of `mqtt@mosquitto` is a wrapper: mosquitto counts its own messages.
        assert_eq!(counts.received, 100, "{counts:?}");
    }
}

/// Device 1 subscribes at QoS 1 by hand with a persistent session, reads ten messages and acknowledges none; its
/// connection drops. When its fleet link connects (same client identifier: the session resumes) and subscribes
/// again, the server sends the ten again [MQTT-4.4.0-1]; the fleet reports each once, and the ten published after.
async fn qos1_unacknowledged_goes_again_after_a_dropped_connection(mosquitto: bool) {
    let Some(h) = harness(mosquitto, 2) else {
        return;
    };
    let server = h.server(any_port());
    let mut raw = raw_subscriber(&h, server.addr, 1, codec::QoS::AtLeastOnce).await;
    let (fleet, mut rx, _) = h.fleet(server.addr, 2).await;
    for id in 0..10 {
        fleet.publish(0, message(7, id, QoS::AtLeastOnce));
    }
    let mut events = Vec::new();
    collect_until(&mut rx, &mut events, |e| tally(e).1.len() == 10).await;
    for _ in 0..10 {
        match raw.recv().await.unwrap() {
            Packet::Publish(p) => assert!(!p.dup && p.packet_id.is_some()),
            other => panic!("{other:?}"),
        }
    }
    drop(raw);

    fleet.subscribe(1, 7, QoS::AtLeastOnce).await.unwrap();
    for id in 10..20 {
        fleet.publish(0, message(7, id, QoS::AtLeastOnce));
    }
    collect_until(&mut rx, &mut events, |e| tally(e).0.len() == 20).await;
    fleet.close().await;
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    let want: HashMap<(u32, u64), u32> = (0..20).map(|id| ((1, id), 1)).collect();
    assert_eq!(tally(&events).0, want);
    server.kill().await;
}

/// Device 1 subscribes at QoS 0 by hand and does not read; device 2 subscribes through the fleet. Device 0 publishes
/// 30,000 messages of 1 KiB at QoS 0, far more than socket buffers and the server's queue hold. The server keeps the
/// slow connection, and drops and counts what it cannot deliver: every message reaches each subscriber or is
/// counted, exactly (delivered to 2 + read later by 1 + dropped = 2 × 30,000).
async fn a_subscriber_that_does_not_read_costs_counted_drops(mosquitto: bool) {
    const MESSAGES: u64 = 30_000;
    let Some(h) = harness(mosquitto, 3) else {
        return;
    };
    let server = h.server(any_port());
    let mut raw = raw_subscriber(&h, server.addr, 1, codec::QoS::AtMostOnce).await;
    let (fleet, mut rx, _) = h.fleet(server.addr, 3).await;
    fleet.subscribe(2, 7, QoS::AtMostOnce).await.unwrap();
    for id in 0..MESSAGES {
        let mut m = message(7, id, QoS::AtMostOnce);
        m.size = 1024;
        fleet.publish(0, m);
    }
    // Every message accepted; then device 2 has what it will get once nothing has come for a second.
    let (mut accepted, mut delivered) = (HashSet::new(), HashSet::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let wait = if accepted.len() as u64 == MESSAGES {
            Duration::from_secs(1)
        } else {
            deadline.saturating_duration_since(tokio::time::Instant::now())
        };
        match tokio::time::timeout(wait, rx.recv()).await {
            Ok(Some(LinkEvent::Accepted { id, .. })) => {
                assert!(accepted.insert(id), "accepted twice")
            }
            Ok(Some(LinkEvent::Delivered { device, id, .. })) => {
                assert!(device == 2 && delivered.insert(id), "delivered twice")
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!("the fleet stopped"),
            Err(_) => break,
        }
    }
    assert_eq!(accepted.len() as u64, MESSAGES);
    // Now device 1 reads what the server kept for it; its connection is still there.
    let mut read_late = 0u64;
    while let Ok(Ok(p)) = tokio::time::timeout(Duration::from_secs(2), raw.recv()).await {
        if let Packet::Publish(p) = p {
            assert_eq!(p.payload.len(), 1024);
            read_late += 1;
        }
    }
    assert!(
        read_late > 0,
        "the slow subscriber's connection was dropped"
    );
    let delivered = delivered.len() as u64;
    // mosquitto publishes its count in `$SYS` once a second.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    fleet.close().await;
    let counts = server.kill().await;
    assert!(counts.dropped > 0, "{counts:?}");
    assert_eq!(
        delivered + read_late + counts.dropped,
        2 * MESSAGES,
        "delivered {delivered}, read late {read_late}, dropped {}",
        counts.dropped
    );
}

macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod in_tree {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(false).await;
                }
            )*
        }
        mod mosquitto {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(true).await;
                }
            )*
        }
    };
}

both! {
    every_message_delivered_once,
    qos1_unacknowledged_goes_again_after_a_dropped_connection,
    a_subscriber_that_does_not_read_costs_counted_drops,
}
