//! Sessions, the three QoS flows, re-delivery and ordering: sections 4.1 to 4.6.

use super::harness::*;
use std::time::Duration;
use transport_mqtt::codec::{Packet, PacketId, QoS};

normative!(
    mqtt_4_1_0_1_session_state_is_kept_for_the_whole_session,
    mqtt_4_1_0_2_a_session_lasts_as_long_as_its_connection,
    mqtt_4_3_1_1_qos_0_is_sent_with_qos_0_and_dup_0,
    mqtt_4_3_2_1_qos_1_sender_new_identifier_then_unacknowledged_until_puback,
    mqtt_4_3_2_2_qos_1_receiver_pubacks_and_then_takes_the_identifier_as_new,
    mqtt_4_3_3_1_qos_2_sender_publish_pubrel_pubcomp,
    mqtt_4_3_3_2_qos_2_receiver_pubrec_no_duplicate_pubcomp,
    mqtt_4_4_0_1_reconnecting_resends_publish_and_pubrel_with_their_identifiers,
    mqtt_4_5_0_1_a_message_joins_every_matching_session,
    mqtt_4_6_0_1_resends_keep_the_original_order,
    mqtt_4_6_0_2_pubacks_follow_the_publish_order,
    mqtt_4_6_0_3_pubrecs_follow_the_publish_order,
    mqtt_4_6_0_4_pubrels_follow_the_pubrec_order,
    mqtt_4_6_0_5_topics_are_ordered_by_default,
    mqtt_4_6_0_6_one_clients_messages_arrive_in_order_per_topic_and_qos,
);

/// A persistent subscriber to `filter` at `qos`, then away.
async fn away(t: &Target, id: &str, filter: &str, qos: QoS) {
    let (mut s, _) = t.connect(id, false).await;
    s.sub(filter, qos).await;
    s.send(Packet::Disconnect).await;
    s.closed().await;
}

async fn mqtt_4_1_0_1_session_state_is_kept_for_the_whole_session(kind: Kind) {
    let t = Target::start(kind).await;
    away(&t, "s4101", "t4101", QoS::ExactlyOnce).await;
    let mut p = t.client("p4101").await;
    p.put("t4101", QoS::ExactlyOnce, b"1", false).await;
    // Taken over twice, the session still has its subscription and its message.
    let (first, present) = t.connect("s4101", false).await;
    assert!(present);
    let (mut second, present) = t.connect("s4101", false).await;
    assert!(present);
    drop(first);
    let got = second.publication().await;
    assert_eq!(&got.payload[..], b"1");
    second.ack(&got).await;
    p.put("t4101", QoS::ExactlyOnce, b"2", false).await;
    assert_eq!(&second.publication().await.payload[..], b"2");
}

async fn mqtt_4_1_0_2_a_session_lasts_as_long_as_its_connection(kind: Kind) {
    let t = Target::start(kind).await;
    let mut s = t.client("s4102").await;
    s.sub("t4102", QoS::AtLeastOnce).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut p = t.client("p4102").await;
    p.put("t4102", QoS::AtLeastOnce, b"later", false).await;
    assert_eq!(&s.publication().await.payload[..], b"later");
}

async fn mqtt_4_3_1_1_qos_0_is_sent_with_qos_0_and_dup_0(kind: Kind) {
    let t = Target::start(kind).await;
    let mut s = t.client("s4311").await;
    s.sub("t4311", QoS::AtMostOnce).await;
    let mut p = t.client("p4311").await;
    p.put("t4311", QoS::ExactlyOnce, b"x", false).await;
    let got = s.publication().await;
    assert_eq!(
        (got.qos, got.dup, got.packet_id),
        (QoS::AtMostOnce, false, None)
    );
}

async fn mqtt_4_3_2_1_qos_1_sender_new_identifier_then_unacknowledged_until_puback(kind: Kind) {
    let t = Target::start(kind).await;
    away(&t, "s4321", "t4321", QoS::AtLeastOnce).await;
    let (mut s, _) = t.connect("s4321", false).await;
    let mut p = t.client("p4321").await;
    p.put("t4321", QoS::AtLeastOnce, b"acked", false).await;
    p.put("t4321", QoS::AtLeastOnce, b"not acked", false).await;
    let a = s.publication().await;
    let b = s.publication().await;
    assert!(a.qos == QoS::AtLeastOnce && !a.dup && !b.dup && a.packet_id != b.packet_id);
    s.send(Packet::PubAck(a.packet_id.unwrap())).await;
    s.ping().await;
    drop(s);
    // Only the unacknowledged one comes again.
    let (mut s, _) = t.connect("s4321", false).await;
    let again = s.publication().await;
    assert_eq!(
        (&again.payload[..], again.packet_id, again.dup),
        (&b"not acked"[..], b.packet_id, true)
    );
    s.send(Packet::PubAck(again.packet_id.unwrap())).await;
    s.sub("m4321", QoS::AtLeastOnce).await;
    nothing_before_marker(&mut s, &mut p, "m4321").await;
}

async fn mqtt_4_3_2_2_qos_1_receiver_pubacks_and_then_takes_the_identifier_as_new(kind: Kind) {
    let t = Target::start(kind).await;
    let mut s = t.client("s4322").await;
    s.sub("t4322", QoS::AtLeastOnce).await;
    let mut p = t.client("p4322").await;
    for payload in [&b"first"[..], b"second"] {
        let mut m = publish("t4322", QoS::AtLeastOnce, 9, payload);
        m.dup = payload == b"second";
        p.send(Packet::Publish(m)).await;
        p.expect(Packet::PubAck(pid(9))).await;
    }
    // The same identifier after its PUBACK, even with DUP, is a new publication: delivered again.
    assert_eq!(&s.publication().await.payload[..], b"first");
    assert_eq!(&s.publication().await.payload[..], b"second");
}

async fn mqtt_4_3_3_1_qos_2_sender_publish_pubrel_pubcomp(kind: Kind) {
    let t = Target::start(kind).await;
    away(&t, "s4331", "t4331", QoS::ExactlyOnce).await;
    let (mut s, _) = t.connect("s4331", false).await;
    let mut p = t.client("p4331").await;
    p.put("t4331", QoS::ExactlyOnce, b"x", false).await;
    let m = s.publication().await;
    let id = m.packet_id.unwrap();
    assert!(m.qos == QoS::ExactlyOnce && !m.dup);
    // Unacknowledged until PUBREC: a reconnect gets the PUBLISH again.
    drop(s);
    let (mut s, _) = t.connect("s4331", false).await;
    let again = s.publication().await;
    assert_eq!((again.packet_id, again.dup), (Some(id), true));
    s.send(Packet::PubRec(id)).await;
    s.expect(Packet::PubRel(id)).await;
    // After the PUBREL, the PUBREL is what is unacknowledged: a reconnect gets it, never the PUBLISH.
    drop(s);
    let (mut s, _) = t.connect("s4331", false).await;
    s.expect(Packet::PubRel(id)).await;
    s.send(Packet::PubComp(id)).await;
    s.sub("m4331", QoS::AtLeastOnce).await;
    nothing_before_marker(&mut s, &mut p, "m4331").await;
}

async fn mqtt_4_3_3_2_qos_2_receiver_pubrec_no_duplicate_pubcomp(kind: Kind) {
    let t = Target::start(kind).await;
    let mut s = t.client("s4332").await;
    s.sub("t4332", QoS::ExactlyOnce).await;
    let mut p = t.client("p4332").await;
    let m = |dup| {
        let mut m = publish("t4332", QoS::ExactlyOnce, 7, b"once");
        m.dup = dup;
        Packet::Publish(m)
    };
    p.send(m(false)).await;
    p.expect(Packet::PubRec(pid(7))).await;
    // Sent again before its PUBREL: acknowledged again, not delivered again.
    p.send(m(true)).await;
    p.expect(Packet::PubRec(pid(7))).await;
    p.send(Packet::PubRel(pid(7))).await;
    p.expect(Packet::PubComp(pid(7))).await;
    let got = s.publication().await;
    s.ack(&got).await;
    // After PUBCOMP the identifier names a new publication.
    p.send(m(false)).await;
    p.expect(Packet::PubRec(pid(7))).await;
    p.send(Packet::PubRel(pid(7))).await;
    p.expect(Packet::PubComp(pid(7))).await;
    let second = s.publication().await;
    s.ack(&second).await;
    s.sub("m4332", QoS::AtLeastOnce).await;
    nothing_before_marker(&mut s, &mut p, "m4332").await;
}

async fn mqtt_4_4_0_1_reconnecting_resends_publish_and_pubrel_with_their_identifiers(kind: Kind) {
    let t = Target::start(kind).await;
    away(&t, "s4401", "t4401", QoS::ExactlyOnce).await;
    let (mut s, _) = t.connect("s4401", false).await;
    let mut p = t.client("p4401").await;
    p.put("t4401", QoS::ExactlyOnce, b"released", false).await;
    p.put("t4401", QoS::AtLeastOnce, b"published", false).await;
    let released = s.publication().await.packet_id.unwrap();
    let published = s.publication().await.packet_id.unwrap();
    s.send(Packet::PubRec(released)).await;
    s.expect(Packet::PubRel(released)).await;
    drop(s);
    let (mut s, present) = t.connect("s4401", false).await;
    assert!(present);
    s.expect(Packet::PubRel(released)).await;
    let again = s.publication().await;
    assert_eq!(
        (again.packet_id, again.dup, &again.payload[..]),
        (Some(published), true, &b"published"[..])
    );
}

async fn mqtt_4_5_0_1_a_message_joins_every_matching_session(kind: Kind) {
    let t = Target::start(kind).await;
    away(&t, "away4501", "t4501/#", QoS::AtLeastOnce).await;
    let mut here = t.client("here4501").await;
    here.sub("+/x", QoS::AtLeastOnce).await;
    let mut p = t.client("p4501").await;
    p.put("t4501/x", QoS::AtLeastOnce, b"both", false).await;
    assert_eq!(&here.publication().await.payload[..], b"both");
    let (mut away, _) = t.connect("away4501", false).await;
    assert_eq!(&away.publication().await.payload[..], b"both");
}

async fn mqtt_4_6_0_1_resends_keep_the_original_order(kind: Kind) {
    let t = Target::start(kind).await;
    away(&t, "s4601", "t4601", QoS::ExactlyOnce).await;
    let mut p = t.client("p4601").await;
    for i in 0..6u8 {
        let q = if i % 2 == 0 {
            QoS::AtLeastOnce
        } else {
            QoS::ExactlyOnce
        };
        p.put("t4601", q, &[i], false).await;
    }
    let (mut s, _) = t.connect("s4601", false).await;
    let mut first = Vec::new();
    for _ in 0..6 {
        first.push(s.publication().await);
    }
    drop(s);
    let (mut s, _) = t.connect("s4601", false).await;
    for before in first {
        let again = s.publication().await;
        assert_eq!(
            (again.packet_id, &again.payload),
            (before.packet_id, &before.payload)
        );
    }
}

async fn mqtt_4_6_0_2_pubacks_follow_the_publish_order(kind: Kind) {
    let t = Target::start(kind).await;
    let mut c = t.client("c4602").await;
    let ids = [40u16, 3, 900, 7, 12];
    let mut bytes = Vec::new();
    for id in ids {
        Packet::Publish(publish("t4602", QoS::AtLeastOnce, id, b"x"))
            .encode(&mut bytes)
            .unwrap();
    }
    c.send_raw(&bytes).await;
    for id in ids {
        c.expect(Packet::PubAck(pid(id))).await;
    }
}

async fn mqtt_4_6_0_3_pubrecs_follow_the_publish_order(kind: Kind) {
    let t = Target::start(kind).await;
    let mut c = t.client("c4603").await;
    let ids = [40u16, 3, 900, 7, 12];
    let mut bytes = Vec::new();
    for id in ids {
        Packet::Publish(publish("t4603", QoS::ExactlyOnce, id, b"x"))
            .encode(&mut bytes)
            .unwrap();
    }
    c.send_raw(&bytes).await;
    for id in ids {
        c.expect(Packet::PubRec(pid(id))).await;
    }
}

async fn mqtt_4_6_0_4_pubrels_follow_the_pubrec_order(kind: Kind) {
    let t = Target::start(kind).await;
    let mut s = t.client("s4604").await;
    s.sub("t4604", QoS::ExactlyOnce).await;
    let mut p = t.client("p4604").await;
    for i in 0..3u8 {
        p.put("t4604", QoS::ExactlyOnce, &[i], false).await;
    }
    let ids: Vec<PacketId> = [
        s.publication().await,
        s.publication().await,
        s.publication().await,
    ]
    .iter()
    .map(|m| m.packet_id.unwrap())
    .collect();
    let order = [ids[2], ids[0], ids[1]];
    let mut bytes = Vec::new();
    for id in order {
        Packet::PubRec(id).encode(&mut bytes).unwrap();
    }
    s.send_raw(&bytes).await;
    for id in order {
        s.expect(Packet::PubRel(id)).await;
    }
}

async fn mqtt_4_6_0_5_topics_are_ordered_by_default(kind: Kind) {
    let t = Target::start(kind).await;
    let mut s = t.client("s4605").await;
    s.sub("t4605", QoS::AtLeastOnce).await;
    let mut p = t.client("p4605").await;
    let mut bytes = Vec::new();
    for i in 0..100u16 {
        Packet::Publish(publish("t4605", QoS::AtLeastOnce, i + 1, &i.to_be_bytes()))
            .encode(&mut bytes)
            .unwrap();
    }
    p.send_raw(&bytes).await;
    for (i, m) in s.take(100).await.iter().enumerate() {
        assert_eq!(&m.payload[..], (i as u16).to_be_bytes());
    }
}

async fn mqtt_4_6_0_6_one_clients_messages_arrive_in_order_per_topic_and_qos(kind: Kind) {
    let t = Target::start(kind).await;
    let mut s = t.client("s4606").await;
    s.sub("t4606/#", QoS::ExactlyOnce).await;
    let mut p = t.client("p4606").await;
    let mut bytes = Vec::new();
    for i in 0..60u16 {
        let qos = QoS::from_bits((i % 3) as u8).unwrap();
        let topic = format!("t4606/{}", i % 2);
        Packet::Publish(publish(&topic, qos, i + 1, &i.to_be_bytes()))
            .encode(&mut bytes)
            .unwrap();
        if qos == QoS::ExactlyOnce {
            Packet::PubRel(pid(i + 1)).encode(&mut bytes).unwrap();
        }
    }
    p.send_raw(&bytes).await;
    let mut last: std::collections::HashMap<(String, QoS), u16> = Default::default();
    for m in s.take(60).await {
        let n = u16::from_be_bytes([m.payload[0], m.payload[1]]);
        if let Some(prev) = last.insert((m.topic.clone(), m.qos), n) {
            assert!(n > prev, "{} at QoS {:?}: {n} after {prev}", m.topic, m.qos);
        }
    }
    assert_eq!(last.len(), 6);
}
