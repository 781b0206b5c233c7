//! Strings, fixed headers, packet identifiers, PUBLISH and PUBREL: sections 1.5.3, 2.2.2, 2.3.1, 3.3 and 3.6.

use super::harness::*;
use transport_mqtt::codec::{Packet, Publish, QoS};

normative!(
    mqtt_1_5_3_1_ill_formed_utf8_closes_the_connection,
    mqtt_1_5_3_2_a_null_character_closes_the_connection,
    mqtt_1_5_3_3_a_byte_order_mark_is_not_stripped,
    mqtt_2_2_2_1_the_server_sets_the_fixed_flags,
    mqtt_2_2_2_2_invalid_flags_close_the_connection,
    mqtt_2_3_1_1_packet_identifier_0_is_refused,
    mqtt_2_3_1_4_the_server_uses_unused_identifiers_and_keeps_them_on_resend,
    mqtt_2_3_1_5_qos_0_carries_no_packet_identifier,
    mqtt_2_3_1_6_acknowledgements_carry_the_publish_identifier,
    mqtt_2_3_1_7_suback_and_unsuback_carry_the_request_identifier,
    mqtt_3_3_1_1_dup_is_set_on_redelivery,
    mqtt_3_3_1_2_dup_is_0_for_qos_0,
    mqtt_3_3_1_3_dup_is_not_propagated,
    mqtt_3_3_1_4_qos_3_closes_the_connection,
    mqtt_3_3_1_5_retain_stores_the_message_and_its_qos,
    mqtt_3_3_1_6_a_new_subscription_gets_the_retained_messages,
    mqtt_3_3_1_7_a_retained_qos_0_message_replaces_the_old_one,
    mqtt_3_3_1_8_retained_deliveries_have_retain_1,
    mqtt_3_3_1_9_live_deliveries_have_retain_0,
    mqtt_3_3_1_10_an_empty_retained_message_is_delivered_and_clears,
    mqtt_3_3_1_11_an_empty_retained_message_is_not_stored,
    mqtt_3_3_1_12_retain_0_neither_stores_nor_replaces,
    mqtt_3_3_2_1_the_topic_name_must_be_present_and_utf8,
    mqtt_3_3_2_2_a_topic_name_with_wildcards_closes,
    mqtt_3_3_2_3_the_delivered_topic_matches_the_filter,
    mqtt_3_3_4_1_publish_is_answered_as_its_qos_says,
    mqtt_3_3_5_1_overlapping_subscriptions_deliver_at_the_highest_qos,
    mqtt_3_3_5_2_an_unauthorized_publish_is_acknowledged_or_closed,
    mqtt_3_6_1_1_pubrel_flags_must_be_0010,
);

async fn mqtt_1_5_3_1_ill_formed_utf8_closes_the_connection(kind: Kind) {
    let t = Target::start(kind).await;
    // An invalid byte, an overlong encoding, an encoded surrogate (U+D800).
    for topic in [&b"a/\xff"[..], b"\xc0\xaf", b"t/\xed\xa0\x80"] {
        let mut c = t.client("c1531").await;
        c.send_raw(&raw_publish(0, topic, None, b"x")).await;
        c.closed_silently().await;
    }
}

async fn mqtt_1_5_3_2_a_null_character_closes_the_connection(kind: Kind) {
    let t = Target::start(kind).await;
    let mut c = t.client("c1532").await;
    c.send_raw(&raw_publish(0, b"a\x00b", None, b"x")).await;
    c.closed_silently().await;
    let mut c = t.client("c1532").await;
    c.send_raw(&raw_subscribe(0x82, 1, &[(b"a/\x00", 0)])).await;
    c.closed_silently().await;
}

async fn mqtt_1_5_3_3_a_byte_order_mark_is_not_stripped(kind: Kind) {
    let t = Target::start(kind).await;
    let mut with_bom = t.client("bom").await;
    with_bom.sub("\u{feff}t1533", QoS::AtLeastOnce).await;
    let mut without = t.client("nobom").await;
    without.sub("t1533", QoS::AtLeastOnce).await;
    let mut p = t.client("p1533").await;
    p.put("\u{feff}t1533", QoS::AtLeastOnce, b"x", false).await;
    assert_eq!(with_bom.publication().await.topic, "\u{feff}t1533");
    nothing_before_marker(&mut without, &mut p, "t1533").await;
}

async fn mqtt_2_2_2_1_the_server_sets_the_fixed_flags(kind: Kind) {
    let t = Target::start(kind).await;
    // Every packet the server sends is read by a decoder that refuses any other flags: CONNACK, SUBACK, PUBLISH,
    // PUBREC, PUBREL (0010), PUBCOMP, PUBACK, UNSUBACK, PINGRESP.
    let mut s = t.client("s2221").await;
    s.sub("t2221", QoS::ExactlyOnce).await;
    let mut p = t.client("p2221").await;
    p.put("t2221", QoS::ExactlyOnce, b"x", false).await;
    p.put("t2221", QoS::AtLeastOnce, b"y", false).await;
    s.take(2).await;
    s.unsubscribe(&["t2221"]).await;
    s.ping().await;
}

async fn mqtt_2_2_2_2_invalid_flags_close_the_connection(kind: Kind) {
    let t = Target::start(kind).await;
    // Reserved flags 0010 broken for PUBREL, SUBSCRIBE and UNSUBSCRIBE, 0000 for PUBACK and PINGREQ.
    let cases = [
        (frame(0x60, &[0, 1]), true),
        (raw_subscribe(0x80, 1, &[(b"a", 0)]), true),
        (raw_unsubscribe(0xA3, 1, &[b"a"]), true),
        (frame(0x41, &[0, 1]), false),
        (frame(0xC8, &[]), false),
    ];
    for (bytes, checked_by_mosquitto) in cases {
        let mut c = t.client("c2222").await;
        c.send_raw(&bytes).await;
        if kind == Kind::InTree || checked_by_mosquitto {
            c.closed_silently().await;
        } else {
            // mosquitto deviates: it checks the flags of PUBREL, SUBSCRIBE and UNSUBSCRIBE only, and serves a
            // PUBACK 0001 or a PINGREQ 1000 as if the flags were 0000.
            c.ping().await;
        }
    }
}

async fn mqtt_2_3_1_1_packet_identifier_0_is_refused(kind: Kind) {
    let t = Target::start(kind).await;
    let cases = [
        raw_publish(0x02, b"t", Some(0), b"x"),
        raw_subscribe(0x82, 0, &[(b"t", 0)]),
        raw_unsubscribe(0xA2, 0, &[b"t"]),
    ];
    for bytes in cases {
        let mut c = t.client("c2311").await;
        c.send_raw(&bytes).await;
        c.closed_silently().await;
    }
}

async fn mqtt_2_3_1_4_the_server_uses_unused_identifiers_and_keeps_them_on_resend(kind: Kind) {
    let t = Target::start(kind).await;
    let (mut s, _) = t.connect("s2314", false).await;
    s.sub("t2314", QoS::AtLeastOnce).await;
    let mut p = t.client("p2314").await;
    for i in 0..5u8 {
        p.put("t2314", QoS::AtLeastOnce, &[i], false).await;
    }
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(s.publication().await.packet_id.unwrap());
    }
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        5,
        "identifiers in flight are distinct: {ids:?}"
    );
    drop(s);
    let (mut s, _) = t.connect("s2314", false).await;
    for id in ids {
        let p = s.publication().await;
        assert_eq!((p.packet_id, p.dup), (Some(id), true));
    }
}

async fn mqtt_2_3_1_5_qos_0_carries_no_packet_identifier(kind: Kind) {
    let t = Target::start(kind).await;
    let mut s = t.client("s2315").await;
    s.sub("t2315", QoS::AtMostOnce).await;
    let mut p = t.client("p2315").await;
    p.put("t2315", QoS::AtLeastOnce, b"exact payload", false)
        .await;
    // Two identifier bytes would show up as the start of the payload.
    let got = s.publication().await;
    assert_eq!(
        (got.qos, got.packet_id, &got.payload[..]),
        (QoS::AtMostOnce, None, &b"exact payload"[..])
    );
}

async fn mqtt_2_3_1_6_acknowledgements_carry_the_publish_identifier(kind: Kind) {
    let t = Target::start(kind).await;
    let mut s = t.client("s2316").await;
    s.sub("t2316", QoS::ExactlyOnce).await;
    let mut c = t.client("c2316").await;
    c.send(Packet::Publish(publish(
        "t2316",
        QoS::AtLeastOnce,
        0x1234,
        b"1",
    )))
    .await;
    c.expect(Packet::PubAck(pid(0x1234))).await;
    c.send(Packet::Publish(publish(
        "t2316",
        QoS::ExactlyOnce,
        0xfedc,
        b"2",
    )))
    .await;
    c.expect(Packet::PubRec(pid(0xfedc))).await;
    c.send(Packet::PubRel(pid(0xfedc))).await;
    c.expect(Packet::PubComp(pid(0xfedc))).await;
    // The server's PUBREL carries its PUBLISH's identifier.
    let one = s.publication().await;
    s.ack(&one).await;
    let two = s.publication().await;
    s.send(Packet::PubRec(two.packet_id.unwrap())).await;
    s.expect(Packet::PubRel(two.packet_id.unwrap())).await;
}

async fn mqtt_2_3_1_7_suback_and_unsuback_carry_the_request_identifier(kind: Kind) {
    let t = Target::start(kind).await;
    let mut c = t.client("c2317").await;
    c.send_raw(&raw_subscribe(0x82, 0xabcd, &[(b"t", 1)])).await;
    match c.recv().await {
        Packet::SubAck(a) => assert_eq!(a.packet_id, pid(0xabcd)),
        other => panic!("{other:?}"),
    }
    c.send_raw(&raw_unsubscribe(0xA2, 0x4321, &[b"t"])).await;
    c.expect(Packet::UnsubAck(pid(0x4321))).await;
}

async fn mqtt_3_3_1_1_dup_is_set_on_redelivery(kind: Kind) {
    let t = Target::start(kind).await;
    let (mut s, _) = t.connect("s3311", false).await;
    s.sub("t3311", QoS::ExactlyOnce).await;
    let mut p = t.client("p3311").await;
    p.put("t3311", QoS::AtLeastOnce, b"1", false).await;
    p.put("t3311", QoS::ExactlyOnce, b"2", false).await;
    assert!(!s.publication().await.dup && !s.publication().await.dup);
    drop(s);
    let (mut s, _) = t.connect("s3311", false).await;
    assert!(s.publication().await.dup && s.publication().await.dup);
}

async fn mqtt_3_3_1_2_dup_is_0_for_qos_0(kind: Kind) {
    let t = Target::start(kind).await;
    let mut s = t.client("s3312").await;
    s.sub("t3312", QoS::AtMostOnce).await;
    let mut p = t.client("p3312").await;
    // A client's QoS 0 PUBLISH with DUP set breaks the rule.
    p.send_raw(&raw_publish(0x08, b"t3312", None, b"dup")).await;
    match kind {
        Kind::InTree => p.closed_silently().await,
        // mosquitto deviates: it accepts the packet and routes it.
        Kind::Mosquitto => p.ping().await,
    }
    let mut p = t.client("p3312b").await;
    p.put("t3312", QoS::AtLeastOnce, b"x", false).await;
    // The server's QoS 0 deliveries have DUP 0.
    loop {
        let got = s.publication().await;
        assert!(!got.dup && got.qos == QoS::AtMostOnce);
        if &got.payload[..] == b"x" {
            break;
        }
    }
}

async fn mqtt_3_3_1_3_dup_is_not_propagated(kind: Kind) {
    let t = Target::start(kind).await;
    let mut s = t.client("s3313").await;
    s.sub("t3313", QoS::AtLeastOnce).await;
    let mut p = t.client("p3313").await;
    let mut dup = publish("t3313", QoS::AtLeastOnce, 5, b"x");
    dup.dup = true;
    p.send(Packet::Publish(dup)).await;
    p.expect(Packet::PubAck(pid(5))).await;
    assert!(!s.publication().await.dup);
}

async fn mqtt_3_3_1_4_qos_3_closes_the_connection(kind: Kind) {
    let t = Target::start(kind).await;
    let mut c = t.client("c3314").await;
    c.send_raw(&raw_publish(0x06, b"t", Some(1), b"x")).await;
    c.closed_silently().await;
}

async fn mqtt_3_3_1_5_retain_stores_the_message_and_its_qos(kind: Kind) {
    let t = Target::start(kind).await;
    let mut p = t.client("p3315").await;
    p.put("r3315", QoS::ExactlyOnce, b"kept", true).await;
    let mut s = t.client("s3315").await;
    s.sub("r3315", QoS::ExactlyOnce).await;
    let got = s.publication().await;
    assert_eq!(
        (got.qos, got.retain, &got.payload[..]),
        (QoS::ExactlyOnce, true, &b"kept"[..])
    );
}

async fn mqtt_3_3_1_6_a_new_subscription_gets_the_retained_messages(kind: Kind) {
    let t = Target::start(kind).await;
    let mut p = t.client("p3316").await;
    for topic in ["r3316/a", "r3316/b", "r3316/b/c", "other"] {
        p.put(topic, QoS::AtLeastOnce, topic.as_bytes(), true).await;
    }
    let mut s = t.client("s3316").await;
    s.sub("r3316/+", QoS::AtLeastOnce).await;
    let mut got = vec![s.publication().await.topic, s.publication().await.topic];
    got.sort();
    assert_eq!(got, ["r3316/a", "r3316/b"]);
    nothing_before_marker(&mut s, &mut p, "r3316/marker").await;
}

async fn mqtt_3_3_1_7_a_retained_qos_0_message_replaces_the_old_one(kind: Kind) {
    let t = Target::start(kind).await;
    let mut p = t.client("p3317").await;
    p.put("r3317", QoS::AtLeastOnce, b"old", true).await;
    p.put("r3317", QoS::AtMostOnce, b"new", true).await;
    let mut s = t.client("s3317").await;
    s.sub("r3317", QoS::AtLeastOnce).await;
    // The server may discard a retained QoS 0 message; neither broker does, and the old one is gone either way.
    let got = s.publication().await;
    assert_eq!((&got.payload[..], got.qos), (&b"new"[..], QoS::AtMostOnce));
}

async fn mqtt_3_3_1_8_retained_deliveries_have_retain_1(kind: Kind) {
    let t = Target::start(kind).await;
    let mut p = t.client("p3318").await;
    p.put("r3318", QoS::AtMostOnce, b"x", true).await;
    let mut s = t.client("s3318").await;
    s.sub("r3318", QoS::AtMostOnce).await;
    assert!(s.publication().await.retain);
}

async fn mqtt_3_3_1_9_live_deliveries_have_retain_0(kind: Kind) {
    let t = Target::start(kind).await;
    let mut s = t.client("s3319").await;
    s.sub("r3319", QoS::AtLeastOnce).await;
    let mut p = t.client("p3319").await;
    p.put("r3319", QoS::AtLeastOnce, b"x", true).await;
    assert!(!s.publication().await.retain);
}

async fn mqtt_3_3_1_10_an_empty_retained_message_is_delivered_and_clears(kind: Kind) {
    let t = Target::start(kind).await;
    let mut p = t.client("p33110").await;
    p.put("r33110", QoS::AtLeastOnce, b"x", true).await;
    let mut s = t.client("s33110").await;
    s.sub("r33110", QoS::AtLeastOnce).await;
    assert!(s.publication().await.retain);
    p.put("r33110", QoS::AtLeastOnce, b"", true).await;
    let got = s.publication().await;
    assert!(
        !got.retain && got.payload.is_empty(),
        "delivered as normal: {got:?}"
    );
    let mut late = t.client("late33110").await;
    late.sub("r33110", QoS::AtLeastOnce).await;
    nothing_before_marker(&mut late, &mut p, "r33110").await;
}

async fn mqtt_3_3_1_11_an_empty_retained_message_is_not_stored(kind: Kind) {
    let t = Target::start(kind).await;
    let mut p = t.client("p33111").await;
    p.put("r33111", QoS::AtLeastOnce, b"", true).await;
    let mut s = t.client("s33111").await;
    s.sub("r33111", QoS::AtLeastOnce).await;
    nothing_before_marker(&mut s, &mut p, "r33111").await;
}

async fn mqtt_3_3_1_12_retain_0_neither_stores_nor_replaces(kind: Kind) {
    let t = Target::start(kind).await;
    let mut p = t.client("p33112").await;
    p.put("r33112", QoS::AtLeastOnce, b"retained", true).await;
    p.put("r33112", QoS::AtLeastOnce, b"not retained", false)
        .await;
    let mut s = t.client("s33112").await;
    s.sub("r33112", QoS::AtLeastOnce).await;
    assert_eq!(&s.publication().await.payload[..], b"retained");
    p.put("n33112", QoS::AtLeastOnce, b"not retained", false)
        .await;
    s.sub("n33112", QoS::AtLeastOnce).await;
    nothing_before_marker(&mut s, &mut p, "n33112").await;
}

async fn mqtt_3_3_2_1_the_topic_name_must_be_present_and_utf8(kind: Kind) {
    let t = Target::start(kind).await;
    // A PUBLISH whose body ends inside the topic's length, and one whose topic is not UTF-8.
    for bytes in [frame(0x30, &[0]), raw_publish(0, b"\xfe", None, b"")] {
        let mut c = t.client("c3321").await;
        c.send_raw(&bytes).await;
        c.closed_silently().await;
    }
}

async fn mqtt_3_3_2_2_a_topic_name_with_wildcards_closes(kind: Kind) {
    let t = Target::start(kind).await;
    for topic in [&b"a/+"[..], b"#", b"a/#", b"+"] {
        let mut c = t.client("c3322").await;
        c.send_raw(&raw_publish(0x02, topic, Some(1), b"x")).await;
        c.closed_silently().await;
    }
}

async fn mqtt_3_3_2_3_the_delivered_topic_matches_the_filter(kind: Kind) {
    let t = Target::start(kind).await;
    let mut s = t.client("s3323").await;
    s.sub("t3323/+/x/#", QoS::AtLeastOnce).await;
    let mut p = t.client("p3323").await;
    p.put("t3323/a/x/b/c", QoS::AtLeastOnce, b"1", false).await;
    assert_eq!(s.publication().await.topic, "t3323/a/x/b/c");
}

async fn mqtt_3_3_4_1_publish_is_answered_as_its_qos_says(kind: Kind) {
    let t = Target::start(kind).await;
    let mut c = t.client("c3341").await;
    c.send(Packet::Publish(publish("t3341", QoS::AtMostOnce, 0, b"0")))
        .await;
    // QoS 0: nothing; the next packet is the PINGRESP.
    c.ping().await;
    c.send(Packet::Publish(publish("t3341", QoS::AtLeastOnce, 1, b"1")))
        .await;
    c.expect(Packet::PubAck(pid(1))).await;
    c.send(Packet::Publish(publish("t3341", QoS::ExactlyOnce, 2, b"2")))
        .await;
    c.expect(Packet::PubRec(pid(2))).await;
}

async fn mqtt_3_3_5_1_overlapping_subscriptions_deliver_at_the_highest_qos(kind: Kind) {
    let t = Target::start(kind).await;
    let mut s = t.client("s3351").await;
    s.sub("o3351/#", QoS::AtMostOnce).await;
    s.sub("o3351/+", QoS::ExactlyOnce).await;
    s.sub("+/x", QoS::AtLeastOnce).await;
    let mut p = t.client("p3351").await;
    p.put("o3351/x", QoS::ExactlyOnce, b"x", false).await;
    p.put("o3351/marker", QoS::AtMostOnce, b"marker", false)
        .await;
    let mut got: Vec<Publish> = Vec::new();
    loop {
        let m = s.publication().await;
        if &m.payload[..] == b"marker" {
            break;
        }
        got.push(m);
    }
    // One delivery, at the highest QoS of the three subscriptions (both brokers send one copy, though the
    // statement would allow one per subscription).
    let qos: Vec<QoS> = got.iter().map(|m| m.qos).collect();
    assert_eq!(qos, [QoS::ExactlyOnce]);
}

async fn mqtt_3_3_5_2_an_unauthorized_publish_is_acknowledged_or_closed(kind: Kind) {
    let t = Target::start(kind).await;
    let mut s = t.client("s3352").await;
    s.sub("$SYS/fake", QoS::AtLeastOnce).await;
    s.sub("m3352", QoS::AtLeastOnce).await;
    // Clients may not publish into the broker's `$SYS` topics: a positive acknowledgement, nothing routed.
    let mut c = t.client("c3352").await;
    c.put("$SYS/fake", QoS::AtLeastOnce, b"forged", false).await;
    nothing_before_marker(&mut s, &mut c, "m3352").await;
    if kind == Kind::InTree {
        // The order sink refuses another device's order by closing the connection.
        let mut tls = t.tls_raw(0).await;
        tls.connect(connect("dev-0", true)).await;
        tls.send(Packet::Publish(publish(
            "orders/dev-1",
            QoS::AtLeastOnce,
            1,
            b"not an order",
        )))
        .await;
        tls.closed_silently().await;
    }
}

async fn mqtt_3_6_1_1_pubrel_flags_must_be_0010(kind: Kind) {
    let t = Target::start(kind).await;
    let mut c = t.client("c3611").await;
    c.send(Packet::Publish(publish("t3611", QoS::ExactlyOnce, 1, b"x")))
        .await;
    c.expect(Packet::PubRec(pid(1))).await;
    c.send_raw(&frame(0x60, &[0, 1])).await;
    c.closed_silently().await;
}
