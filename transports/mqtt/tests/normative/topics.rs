//! Topic names and filters, errors, conformance: sections 4.7, 4.8 and 7.

use super::harness::*;
use transport_mqtt::codec::{ConnAck, ConnectReturnCode, Packet, QoS};

normative!(
    mqtt_4_7_1_1_wildcards_are_not_allowed_in_topic_names,
    mqtt_4_7_1_2_hash_must_be_last_and_alone_in_its_level,
    mqtt_4_7_1_3_plus_must_fill_its_level,
    mqtt_4_7_2_1_wildcards_first_do_not_match_dollar_topics,
    mqtt_4_7_3_1_names_and_filters_have_at_least_one_character,
    mqtt_4_7_3_2_names_and_filters_have_no_null_character,
    mqtt_4_7_3_3_names_and_filters_up_to_65535_bytes,
    mqtt_4_7_3_4_matching_does_not_normalize,
    mqtt_4_8_0_1_a_protocol_violation_closes_the_connection,
    mqtt_4_8_0_2_a_transient_error_closes_the_connection,
    mqtt_7_0_0_2_no_extension_is_required,
    mqtt_7_1_1_1_served_over_ordered_lossless_byte_streams,
);

async fn mqtt_4_7_1_1_wildcards_are_not_allowed_in_topic_names(kind: Kind) {
    let t = Target::start(kind).await;
    for topic in [&b"sport/+/player"[..], b"sport/#"] {
        let mut c = t.client("c4711").await;
        c.send_raw(&raw_publish(0, topic, None, b"x")).await;
        c.closed_silently().await;
    }
}

async fn mqtt_4_7_1_2_hash_must_be_last_and_alone_in_its_level(kind: Kind) {
    let t = Target::start(kind).await;
    for filter in [&b"sport/tennis#"[..], b"sport/#/ranking", b"##"] {
        let mut c = t.client("c4712").await;
        c.send_raw(&raw_subscribe(0x82, 1, &[(filter, 0)])).await;
        c.closed_silently().await;
    }
    let mut c = t.client("c4712").await;
    c.sub("#", QoS::AtMostOnce).await;
    c.sub("sport/#", QoS::AtMostOnce).await;
}

async fn mqtt_4_7_1_3_plus_must_fill_its_level(kind: Kind) {
    let t = Target::start(kind).await;
    for filter in [&b"sport+"[..], b"sport/+tennis", b"a++/b"] {
        let mut c = t.client("c4713").await;
        c.send_raw(&raw_subscribe(0x82, 1, &[(filter, 0)])).await;
        c.closed_silently().await;
    }
    // At the first and last levels, and alone.
    let mut s = t.client("s4713").await;
    s.sub("+/x4713/+", QoS::AtLeastOnce).await;
    s.sub("+", QoS::AtLeastOnce).await;
    let mut p = t.client("p4713").await;
    p.put("a/x4713/b", QoS::AtLeastOnce, b"1", false).await;
    p.put("solo4713", QoS::AtLeastOnce, b"2", false).await;
    assert_eq!(s.publication().await.topic, "a/x4713/b");
    assert_eq!(s.publication().await.topic, "solo4713");
}

async fn mqtt_4_7_2_1_wildcards_first_do_not_match_dollar_topics(kind: Kind) {
    let t = Target::start(kind).await;
    // Both brokers publish retained statistics under $SYS/broker/.
    let mut sys = t.client("sys4721").await;
    sys.sub("$SYS/broker/uptime", QoS::AtMostOnce).await;
    assert!(sys.publication().await.topic.starts_with("$SYS/"));
    let mut s = t.client("s4721").await;
    s.sub("#", QoS::AtLeastOnce).await;
    s.sub("+/broker/#", QoS::AtLeastOnce).await;
    s.sub("+/broker/uptime", QoS::AtLeastOnce).await;
    let mut p = t.client("p4721").await;
    nothing_before_marker(&mut s, &mut p, "m4721").await;
}

async fn mqtt_4_7_3_1_names_and_filters_have_at_least_one_character(kind: Kind) {
    let t = Target::start(kind).await;
    let cases = [
        raw_publish(0, b"", None, b"x"),
        raw_subscribe(0x82, 1, &[(b"", 0)]),
        raw_unsubscribe(0xA2, 1, &[b""]),
    ];
    for bytes in cases {
        let mut c = t.client("c4731").await;
        c.send_raw(&bytes).await;
        c.closed_silently().await;
    }
}

async fn mqtt_4_7_3_2_names_and_filters_have_no_null_character(kind: Kind) {
    let t = Target::start(kind).await;
    let cases = [
        raw_publish(0, b"t\x00", None, b"x"),
        raw_subscribe(0x82, 1, &[(b"t/\x00/#", 0)]),
        raw_unsubscribe(0xA2, 1, &[b"\x00"]),
    ];
    for bytes in cases {
        let mut c = t.client("c4732").await;
        c.send_raw(&bytes).await;
        c.closed_silently().await;
    }
}

async fn mqtt_4_7_3_3_names_and_filters_up_to_65535_bytes(kind: Kind) {
    // A length field cannot say more than 65,535, so a longer string cannot be sent; the longest one works.
    let t = Target::start(kind).await;
    let longest = "n".repeat(65_535);
    let mut s = t.client("s4733").await;
    s.sub(&longest, QoS::AtLeastOnce).await;
    let mut p = t.client("p4733").await;
    p.put(&longest, QoS::AtLeastOnce, b"x", false).await;
    assert_eq!(s.publication().await.topic.len(), 65_535);
}

async fn mqtt_4_7_3_4_matching_does_not_normalize(kind: Kind) {
    let t = Target::start(kind).await;
    let mut s = t.client("s4734").await;
    s.sub("ACCOUNTS", QoS::AtLeastOnce).await;
    s.sub("caf\u{e9}", QoS::AtLeastOnce).await;
    s.sub("m4734", QoS::AtLeastOnce).await;
    let mut p = t.client("p4734").await;
    // Another case, and the same letter decomposed (e + combining acute accent), are other topics.
    p.put("Accounts", QoS::AtLeastOnce, b"x", false).await;
    p.put("cafe\u{301}", QoS::AtLeastOnce, b"x", false).await;
    p.put("accounts ", QoS::AtLeastOnce, b"x", false).await;
    nothing_before_marker(&mut s, &mut p, "m4734").await;
    p.put("caf\u{e9}", QoS::AtLeastOnce, b"same", false).await;
    assert_eq!(&s.publication().await.payload[..], b"same");
}

async fn mqtt_4_8_0_1_a_protocol_violation_closes_the_connection(kind: Kind) {
    let t = Target::start(kind).await;
    let mut connack = Vec::new();
    Packet::ConnAck(ConnAck {
        session_present: false,
        code: ConnectReturnCode::Accepted,
    })
    .encode(&mut connack)
    .unwrap();
    // Packets only a server sends, and a packet type that does not exist.
    let cases = [
        (connack, true),
        (frame(0xF0, &[]), true),
        (frame(0xD0, &[]), false),
        (frame(0x90, &[0, 1, 0]), false),
        (frame(0xB0, &[0, 1]), false),
    ];
    for (bytes, refused_by_mosquitto) in cases {
        let mut c = t.client("c4801").await;
        c.send_raw(&bytes).await;
        if kind == Kind::InTree || refused_by_mosquitto {
            c.closed_silently().await;
        } else {
            // mosquitto deviates: it takes PINGRESP, SUBACK and UNSUBACK from a client (packets it handles when
            // it is a bridge's client) without closing the connection.
            c.ping().await;
        }
    }
}

async fn mqtt_4_8_0_2_a_transient_error_closes_the_connection(kind: Kind) {
    let t = Target::start(kind).await;
    let mut w = t.client("w4802").await;
    // A packet larger than the broker will buffer.
    let mut c = t.client("c4802").await;
    c.send_raw(&raw_publish(0, b"big", None, &vec![0u8; MAX_PACKET + 1]))
        .await;
    c.closed_silently().await;
    // Only that connection: the others are served.
    w.ping().await;
}

async fn mqtt_7_0_0_2_no_extension_is_required(kind: Kind) {
    // A client using nothing but this specification (no user name, no password, no properties) is served.
    let t = Target::start(kind).await;
    let mut s = t.client("s7002").await;
    s.sub("t7002", QoS::ExactlyOnce).await;
    let mut p = t.client("p7002").await;
    p.put("t7002", QoS::ExactlyOnce, b"x", false).await;
    assert_eq!(s.take(1).await.len(), 1);
}

async fn mqtt_7_1_1_1_served_over_ordered_lossless_byte_streams(kind: Kind) {
    // TCP, and TLS over TCP with a client certificate.
    let t = Target::start(kind).await;
    let mut plain = t.client("s7111").await;
    plain.sub("t7111", QoS::AtLeastOnce).await;
    let mut tls = t.tls_raw(1).await;
    tls.connect(connect("dev-1", true)).await;
    tls.put("t7111", QoS::AtLeastOnce, b"over TLS", false).await;
    assert_eq!(&plain.publication().await.payload[..], b"over TLS");
}
