use super::*;
use crate::codec::{read_packet, LastWill, Packet, Publish};

fn broker(limits: SessionLimits) -> Broker {
    Broker::new(limits, Arc::new(Counters::default()), Instant::now())
}

fn key(id: &str) -> ClientKey {
    ClientKey::verified(id)
}

fn id(n: u16) -> PacketId {
    PacketId::new(n).unwrap()
}

/// Everything `conn` may be sent now, decoded.
fn take(b: &mut Broker, conn: ConnId) -> Vec<Publish> {
    let mut buf = BytesMut::new();
    b.poll_transmit(conn, &mut buf, usize::MAX);
    let mut out = Vec::new();
    while let Some(p) = read_packet(&mut buf, usize::MAX).unwrap() {
        match p {
            Packet::Publish(p) => out.push(p),
            other => panic!("unexpected {other:?}"),
        }
    }
    out
}

fn topics(ps: &[Publish]) -> Vec<&str> {
    ps.iter().map(|p| p.topic.as_str()).collect()
}

fn sub(b: &mut Broker, conn: ConnId, filter: &str, qos: QoS) -> SubAck {
    b.subscribe(conn, id(1), &[(filter.to_string(), qos)])
        .unwrap()
}

const A: ConnId = ConnId(1);
const B: ConnId = ConnId(2);
const C: ConnId = ConnId(3);

#[test]
fn wildcards_route_and_qos_is_the_lower_of_the_two() {
    let mut b = broker(SessionLimits::default());
    b.connect(A, &key("a"), true, None).unwrap();
    b.connect(B, &key("b"), true, None).unwrap();
    assert_eq!(
        sub(&mut b, A, "s/+/t", QoS::AtLeastOnce).return_codes,
        [SubscribeReturnCode::Granted(QoS::AtLeastOnce)]
    );
    assert_eq!(
        sub(&mut b, B, "s/#", QoS::ExactlyOnce).return_codes,
        [SubscribeReturnCode::Granted(QoS::ExactlyOnce)]
    );
    b.publish("s/x/t", Bytes::from_static(b"1"), QoS::AtMostOnce, false);
    b.publish("s/x/t", Bytes::from_static(b"2"), QoS::AtLeastOnce, false);
    b.publish("s", Bytes::from_static(b"3"), QoS::AtLeastOnce, false);
    b.publish("other", Bytes::from_static(b"4"), QoS::AtLeastOnce, false);
    let mut wakes = Vec::new();
    b.drain_wakes(&mut wakes);
    wakes.sort();
    assert_eq!(wakes, [A, B]);
    let got = take(&mut b, A);
    assert_eq!(topics(&got), ["s/x/t", "s/x/t"]);
    assert_eq!(
        (got[0].qos, got[1].qos),
        (QoS::AtMostOnce, QoS::AtLeastOnce)
    );
    assert!(!got[1].dup && !got[1].retain && got[1].packet_id.is_some());
    assert_eq!(topics(&take(&mut b, B)), ["s/x/t", "s/x/t", "s"]);
    assert_eq!(b.stats().messages_sent, 5);
}

#[test]
fn retained_messages_reach_later_subscribers_and_an_empty_payload_clears_them() {
    let mut b = broker(SessionLimits::default());
    b.publish("r/1", Bytes::from_static(b"x"), QoS::AtLeastOnce, true);
    b.publish("r/2", Bytes::from_static(b"y"), QoS::AtMostOnce, true);
    b.publish("r/2", Bytes::new(), QoS::AtMostOnce, true);
    assert_eq!(b.stats().retained, 1);
    b.connect(A, &key("a"), true, None).unwrap();
    sub(&mut b, A, "r/#", QoS::AtMostOnce);
    let got = take(&mut b, A);
    assert_eq!(topics(&got), ["r/1"]);
    assert!(got[0].retain, "retained delivery has RETAIN 1");
    assert_eq!(got[0].qos, QoS::AtMostOnce);
    // A live publish with RETAIN reaches current subscribers with RETAIN 0.
    b.publish("r/3", Bytes::from_static(b"z"), QoS::AtMostOnce, true);
    assert!(!take(&mut b, A)[0].retain);
}

#[test]
fn a_persistent_session_keeps_qos1_messages_while_away_and_resends_unacked_with_dup() {
    let mut b = broker(SessionLimits::default());
    assert!(!b.connect(A, &key("p"), false, None).unwrap());
    sub(&mut b, A, "t", QoS::AtLeastOnce);
    b.publish("t", Bytes::from_static(b"0"), QoS::AtLeastOnce, false);
    let first = take(&mut b, A);
    assert_eq!(first.len(), 1);
    b.disconnect(A, false);
    b.publish("t", Bytes::from_static(b"1"), QoS::AtLeastOnce, false);
    b.publish("t", Bytes::from_static(b"2"), QoS::AtMostOnce, false); // not kept for an absent client
    b.publish("t", Bytes::from_static(b"3"), QoS::AtLeastOnce, false);
    assert!(
        b.connect(B, &key("p"), false, None).unwrap(),
        "session present"
    );
    let got = take(&mut b, B);
    let payloads: Vec<&[u8]> = got.iter().map(|p| &p.payload[..]).collect();
    assert_eq!(payloads, [b"0", b"1", b"3"]);
    assert!(
        got[0].dup && got[0].packet_id == first[0].packet_id,
        "unacked message re-sent with DUP, same id"
    );
    assert!(!got[1].dup && !got[2].dup);
    // Acknowledged messages are gone; the next connection gets nothing more.
    for p in &got {
        b.puback(B, p.packet_id.unwrap());
    }
    b.disconnect(B, true);
    b.connect(C, &key("p"), false, None).unwrap();
    assert!(take(&mut b, C).is_empty());
    // A clean session discards it all.
    b.disconnect(C, true);
    b.publish("t", Bytes::from_static(b"4"), QoS::AtLeastOnce, false);
    assert!(
        !b.connect(A, &key("p"), true, None).unwrap(),
        "clean start: no session present"
    );
    sub(&mut b, A, "x", QoS::AtMostOnce);
    assert!(take(&mut b, A).is_empty());
}

#[test]
fn a_clean_session_ends_with_its_connection() {
    let mut b = broker(SessionLimits::default());
    b.connect(A, &key("c"), true, None).unwrap();
    sub(&mut b, A, "t", QoS::AtLeastOnce);
    b.disconnect(A, true);
    assert_eq!(b.stats().sessions, 0);
    assert_eq!(b.stats().subscriptions, 0);
    b.publish("t", Bytes::from_static(b"x"), QoS::AtLeastOnce, false);
    assert!(!b.connect(B, &key("c"), false, None).unwrap());
}

#[test]
fn qos0_beyond_the_queue_bound_is_dropped_and_counted() {
    let limits = SessionLimits {
        max_queued_qos0: 3,
        ..SessionLimits::default()
    };
    let counters = Arc::new(Counters::default());
    let mut b = Broker::new(limits, counters.clone(), Instant::now());
    b.connect(A, &key("slow"), true, None).unwrap();
    sub(&mut b, A, "t", QoS::AtMostOnce);
    for _ in 0..10 {
        b.publish("t", Bytes::from_static(b"x"), QoS::AtMostOnce, false);
    }
    assert_eq!(b.stats().messages_dropped, 7);
    assert_eq!(counters.snapshot().dropped, 7);
    assert_eq!(take(&mut b, A).len(), 3);
    assert!(b.is_attached(A), "the connection is kept");
    b.publish("t", Bytes::from_static(b"x"), QoS::AtMostOnce, false);
    assert_eq!(take(&mut b, A).len(), 1, "room again once written");
}

#[test]
fn qos1_in_flight_is_bounded_and_opens_with_each_puback() {
    let limits = SessionLimits {
        max_inflight: 2,
        max_queued_qos1: 4,
        ..SessionLimits::default()
    };
    let mut b = broker(limits);
    b.connect(A, &key("a"), true, None).unwrap();
    sub(&mut b, A, "t", QoS::AtLeastOnce);
    for i in 0..7u8 {
        b.publish("t", Bytes::from(vec![i]), QoS::AtLeastOnce, false);
    }
    assert_eq!(b.stats().messages_dropped, 3, "queue of 4 not yet sent");
    let first = take(&mut b, A);
    assert_eq!(first.len(), 2);
    assert!(take(&mut b, A).is_empty(), "window full");
    b.puback(A, first[0].packet_id.unwrap());
    let mut wakes = Vec::new();
    b.drain_wakes(&mut wakes);
    assert!(wakes.contains(&A));
    let next = take(&mut b, A);
    assert_eq!(next.len(), 1);
    assert_eq!(&next[0].payload[..], [2]);
    assert_ne!(
        next[0].packet_id, first[1].packet_id,
        "ids in flight are never reused"
    );
}

#[test]
fn a_second_connection_with_the_same_client_id_takes_the_session_over() {
    let mut b = broker(SessionLimits::default());
    b.connect(C, &key("watcher"), true, None).unwrap();
    sub(&mut b, C, "will/#", QoS::AtMostOnce);
    let will = LastWill {
        topic: "will/a".into(),
        message: Bytes::from_static(b"gone"),
        qos: QoS::AtMostOnce,
        retain: false,
    };
    b.connect(A, &key("a"), false, Some(will)).unwrap();
    sub(&mut b, A, "t", QoS::AtLeastOnce);
    assert!(b.connect(B, &key("a"), false, None).unwrap());
    let mut kicked = Vec::new();
    b.drain_kicked(&mut kicked);
    assert_eq!(kicked, [A]);
    assert!(!b.is_attached(A) && b.is_attached(B));
    assert_eq!(
        topics(&take(&mut b, C)),
        ["will/a"],
        "the old connection's will is published"
    );
    // The old connection's late disconnect changes nothing.
    b.disconnect(A, false);
    assert!(b.is_attached(B));
    b.publish("t", Bytes::from_static(b"x"), QoS::AtLeastOnce, false);
    assert_eq!(take(&mut b, B).len(), 1, "subscriptions carried over");
    assert_eq!(b.stats().clients_connected, 2);
}

#[test]
fn the_will_is_published_on_a_drop_and_discarded_on_disconnect() {
    let mut b = broker(SessionLimits::default());
    b.connect(C, &key("watcher"), true, None).unwrap();
    sub(&mut b, C, "w", QoS::AtLeastOnce);
    let will = || {
        Some(LastWill {
            topic: "w".into(),
            message: Bytes::from_static(b"x"),
            qos: QoS::AtLeastOnce,
            retain: true,
        })
    };
    b.connect(A, &key("a"), true, will()).unwrap();
    b.disconnect(A, true);
    assert!(take(&mut b, C).is_empty());
    b.connect(A, &key("a"), true, will()).unwrap();
    b.disconnect(A, false);
    let got = take(&mut b, C);
    assert_eq!(topics(&got), ["w"]);
    assert_eq!(got[0].qos, QoS::AtLeastOnce);
    assert_eq!(b.stats().retained, 1, "a retained will is retained");
}

#[test]
fn sys_topics_are_published_retained_and_hidden_from_hash() {
    let mut b = broker(SessionLimits::default());
    b.connect(A, &key("all"), true, None).unwrap();
    b.connect(B, &key("sys"), true, None).unwrap();
    sub(&mut b, A, "#", QoS::AtMostOnce);
    sub(&mut b, B, "$SYS/broker/clients/+", QoS::AtMostOnce);
    b.publish_sys(Instant::now(), 1234);
    assert!(take(&mut b, A).is_empty(), "# does not match $SYS");
    let got = take(&mut b, B);
    assert_eq!(
        topics(&got),
        ["$SYS/broker/clients/connected", "$SYS/broker/clients/total"]
    );
    assert_eq!(&got[0].payload[..], b"2");
    b.connect(C, &key("late"), true, None).unwrap();
    sub(&mut b, C, "$SYS/broker/memory/used", QoS::AtMostOnce);
    let got = take(&mut b, C);
    assert_eq!(&got[0].payload[..], b"1234");
    assert!(got[0].retain);
}

#[test]
fn the_subscription_bound_refuses_extra_filters() {
    let limits = SessionLimits {
        max_subscriptions: 2,
        ..SessionLimits::default()
    };
    let mut b = broker(limits);
    b.connect(A, &key("a"), true, None).unwrap();
    let filters: Vec<(String, QoS)> = ["a", "b", "a", "c"]
        .iter()
        .map(|f| (f.to_string(), QoS::AtMostOnce))
        .collect();
    let ack = b.subscribe(A, id(9), &filters).unwrap();
    use SubscribeReturnCode::*;
    assert_eq!(
        ack.return_codes,
        [
            Granted(QoS::AtMostOnce),
            Granted(QoS::AtMostOnce),
            Granted(QoS::AtMostOnce),
            Failure
        ]
    );
    assert!(b.subscribe(B, id(9), &filters).is_none(), "not attached");
}

#[test]
fn retained_messages_are_delivered_once_per_distinct_filter() {
    let mut b = broker(SessionLimits::default());
    b.publish("r/1", Bytes::from_static(b"x"), QoS::AtLeastOnce, true);
    b.connect(A, &key("a"), true, None).unwrap();
    let filters: Vec<(String, QoS)> = [
        ("r/#", QoS::AtMostOnce),
        ("r/#", QoS::AtLeastOnce),
        ("r/+", QoS::AtMostOnce),
        ("r/#", QoS::AtMostOnce),
    ]
    .iter()
    .map(|(f, q)| (f.to_string(), *q))
    .collect();
    let ack = b.subscribe(A, id(1), &filters).unwrap();
    assert_eq!(ack.return_codes.len(), 4, "one return code per filter");
    let got = take(&mut b, A);
    // One for `r/#` (at the QoS of its last occurrence), one for `r/+`.
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.iter().all(|p| p.retain && p.qos == QoS::AtMostOnce));
    assert_eq!(b.stats().subscriptions, 2);
}

#[test]
fn a_filter_over_the_level_cap_gets_0x80_and_the_others_are_granted() {
    let mut b = broker(SessionLimits::default());
    b.connect(A, &key("a"), true, None).unwrap();
    let at_cap = vec!["x"; topic::MAX_LEVELS].join("/");
    let over = format!("{at_cap}/#");
    let filters = vec![
        (over, QoS::AtLeastOnce),
        (at_cap.clone(), QoS::AtLeastOnce),
        ("ok".to_string(), QoS::AtMostOnce),
    ];
    let ack = b.subscribe(A, id(2), &filters).unwrap();
    use SubscribeReturnCode::*;
    assert_eq!(
        ack.return_codes,
        [Failure, Granted(QoS::AtLeastOnce), Granted(QoS::AtMostOnce)]
    );
    b.publish(&at_cap, Bytes::from_static(b"deep"), QoS::AtMostOnce, false);
    assert_eq!(take(&mut b, A).len(), 1);
}

#[test]
fn retained_messages_are_bounded_by_bytes_as_well_as_by_count() {
    let limits = SessionLimits {
        max_retained_bytes: 100,
        ..SessionLimits::default()
    };
    let counters = Arc::new(Counters::default());
    let mut b = Broker::new(limits, counters.clone(), Instant::now());
    let big = Bytes::from(vec![1u8; 60]);
    b.publish("r/1", big.clone(), QoS::AtMostOnce, true); // 63 bytes
    b.publish("r/2", big.clone(), QoS::AtMostOnce, true); // would make 126: not retained
    assert_eq!((b.stats().retained, b.stats().retained_bytes), (1, 63));
    assert_eq!(counters.snapshot().refused_limit, 1, "the one not retained");
    // Replacing counts the difference, not the sum.
    b.publish("r/1", Bytes::from(vec![2u8; 97]), QoS::AtMostOnce, true);
    assert_eq!(b.stats().retained_bytes, 100);
    b.publish("r/1", Bytes::new(), QoS::AtMostOnce, true);
    assert_eq!((b.stats().retained, b.stats().retained_bytes), (0, 0));
    b.publish("r/2", big, QoS::AtMostOnce, true);
    assert_eq!(b.stats().retained, 1, "room again");
}

#[test]
fn a_plaintext_client_never_meets_the_session_of_the_tls_identity_of_the_same_name() {
    let mut b = broker(SessionLimits::default());
    b.connect(A, &key("dev-1"), false, None).unwrap();
    sub(&mut b, A, "t", QoS::AtLeastOnce);
    b.disconnect(A, true);
    b.publish(
        "t",
        Bytes::from_static(b"for dev-1"),
        QoS::AtLeastOnce,
        false,
    );
    // The plaintext `dev-1` gets a session of its own: nothing present, nothing queued, no takeover.
    let plain = ClientKey::plaintext("dev-1");
    assert_eq!(b.connect(B, &plain, false, None), Ok(false));
    assert!(take(&mut b, B).is_empty());
    assert_eq!(b.connect(C, &key("dev-1"), false, None), Ok(true));
    let mut kicked = Vec::new();
    b.drain_kicked(&mut kicked);
    assert!(
        kicked.is_empty(),
        "the plaintext connection is not taken over"
    );
    assert_eq!(take(&mut b, C).len(), 1, "the TLS session kept its message");
    assert_eq!(b.stats().sessions, 2);
    // Nor the other way: a second plaintext `dev-1` takes over the first [MQTT-3.1.4-2], never the device connected
    // under that name.
    let d = ConnId(4);
    assert_eq!(b.connect(d, &plain, false, None), Ok(true));
    b.drain_kicked(&mut kicked);
    assert_eq!(kicked, [B]);
    assert!(b.is_attached(C) && b.is_attached(d) && !b.is_attached(B));
    assert_eq!(b.stats().clients_connected, 2);
}

#[test]
fn sessions_are_bounded_and_the_next_connect_gets_server_unavailable() {
    let limits = SessionLimits {
        max_sessions: 2,
        ..SessionLimits::default()
    };
    let mut b = broker(limits);
    b.connect(A, &key("a"), false, None).unwrap();
    b.connect(B, &key("b"), false, None).unwrap();
    assert_eq!(
        b.connect(C, &key("c"), true, None),
        Err(ConnectReturnCode::ServerUnavailable)
    );
    assert!(!b.is_attached(C));
    // An existing session may still be resumed or taken over.
    b.disconnect(A, true);
    assert_eq!(b.connect(C, &key("a"), false, None), Ok(true));
}

#[test]
fn a_session_queue_is_bounded_in_bytes() {
    let limits = SessionLimits {
        max_queued_bytes: 1000,
        ..SessionLimits::default()
    };
    let mut b = broker(limits);
    b.connect(A, &key("p"), false, None).unwrap();
    sub(&mut b, A, "t", QoS::AtLeastOnce);
    b.disconnect(A, true);
    for _ in 0..10 {
        b.publish("t", Bytes::from(vec![0u8; 299]), QoS::AtLeastOnce, false);
    }
    assert_eq!(b.stats().messages_dropped, 7, "three of 300 bytes fit");
    b.connect(B, &key("p"), false, None).unwrap();
    assert_eq!(take(&mut b, B).len(), 3);
}

mod qos2;
