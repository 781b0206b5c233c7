//! QoS 2 to subscribers, and persistent sessions replayed from their journal.

use super::*;

/// Everything `conn` may be sent now, decoded: PUBLISH and PUBREL packets.
fn packets(b: &mut Broker, conn: ConnId) -> Vec<Packet> {
    let mut buf = BytesMut::new();
    b.poll_transmit(conn, &mut buf, usize::MAX);
    let mut out = Vec::new();
    while let Some(p) = read_packet(&mut buf, usize::MAX).unwrap() {
        out.push(p);
    }
    out
}

fn publish_id(p: &Packet) -> PacketId {
    match p {
        Packet::Publish(p) => p.packet_id.unwrap(),
        other => panic!("expected PUBLISH, got {other:?}"),
    }
}

#[test]
fn qos2_to_a_subscriber_goes_publish_pubrec_pubrel_pubcomp() {
    let mut b = broker(SessionLimits {
        max_inflight: 2,
        ..SessionLimits::default()
    });
    b.connect(A, &key("s"), false, None).unwrap();
    sub(&mut b, A, "t", QoS::ExactlyOnce);
    for i in 0..3u8 {
        b.publish("t", Bytes::from(vec![i]), QoS::ExactlyOnce, false);
    }
    let first = packets(&mut b, A);
    assert_eq!(first.len(), 2, "the window holds two");
    let (one, two) = (publish_id(&first[0]), publish_id(&first[1]));
    match &first[0] {
        Packet::Publish(p) => assert!(p.qos == QoS::ExactlyOnce && !p.dup),
        _ => unreachable!(),
    }
    // A PUBACK does not finish a QoS 2 message.
    b.puback(A, one);
    assert!(packets(&mut b, A).is_empty());
    // PUBRECs in the order two, one: PUBRELs in that order [MQTT-4.6.0-4].
    b.pubrec(A, two);
    b.pubrec(A, one);
    assert_eq!(
        packets(&mut b, A),
        [Packet::PubRel(two), Packet::PubRel(one)]
    );
    // A repeated PUBREC gets its PUBREL again.
    b.pubrec(A, two);
    assert_eq!(packets(&mut b, A), [Packet::PubRel(two)]);
    // The window is still full until a PUBCOMP.
    assert!(packets(&mut b, A).is_empty());
    b.pubcomp(A, one);
    let third = packets(&mut b, A);
    assert_eq!(third.len(), 1);
    assert_ne!(
        publish_id(&third[0]),
        two,
        "an identifier in flight is not reused"
    );

    // The client goes away and comes back: PUBREL for the released one, PUBLISH with DUP for the other, in the
    // order first sent, original identifiers [MQTT-4.4.0-1]; never the PUBLISH of one already released.
    b.disconnect(A, false);
    b.connect(B, &key("s"), false, None).unwrap();
    let again = packets(&mut b, B);
    assert_eq!(again.len(), 2, "{again:?}");
    assert_eq!(again[0], Packet::PubRel(two));
    match &again[1] {
        Packet::Publish(p) => assert!(p.dup && p.packet_id == Some(publish_id(&third[0]))),
        other => panic!("{other:?}"),
    }
    b.pubcomp(B, two);
    b.pubrec(B, publish_id(&third[0]));
    b.pubcomp(B, publish_id(&third[0]));
    assert!(packets(&mut b, B).is_empty());
}

#[test]
fn a_qos2_identifier_from_the_client_is_held_until_pubrel_across_reconnects() {
    let mut b = broker(SessionLimits::default());
    b.connect(A, &key("p"), false, None).unwrap();
    assert_eq!(b.received_qos2(A, id(7)), Some(true));
    assert_eq!(b.received_qos2(A, id(7)), Some(false));
    b.disconnect(A, false);
    b.connect(B, &key("p"), false, None).unwrap();
    assert_eq!(
        b.received_qos2(B, id(7)),
        Some(false),
        "part of the session"
    );
    b.released_qos2(B, id(7));
    assert_eq!(b.received_qos2(B, id(7)), Some(true));
    assert_eq!(b.received_qos2(A, id(8)), None, "not attached");
}

/// A small deterministic generator, so a failure can be replayed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// Random operations on a journaling broker; after each, the snapshot plus the journal so far, replayed into a new
/// broker, must give the same persistent state, and a snapshot must replay to itself.
#[test]
fn the_journal_replays_to_the_state_it_recorded() {
    // Every kind of record but the snapshot's end must have been exercised.
    let mut kinds = std::collections::HashSet::new();
    for seed in 0..20 {
        let mut rng = Lcg(seed);
        let mut b = broker(SessionLimits {
            max_inflight: 3,
            max_queued_qos1: 6,
            ..SessionLimits::default()
        });
        b.enable_journal();
        let mut log = Vec::new();
        let names = ["p0", "p1", "p2", "c3"];
        let filters = ["t/#", "t/a", "+/a", "u"];
        let topics = ["t/a", "t/b", "u", "x/a"];
        let mut conns: Vec<Option<ConnId>> = vec![None; names.len()];
        let mut next_conn = 10;
        for _ in 0..300 {
            let who = rng.next(names.len() as u64) as usize;
            let conn = conns[who];
            match (rng.next(9), conn) {
                (0, _) => {
                    next_conn += 1;
                    let c = ConnId(next_conn);
                    // `c3` is a clean session; the others persistent, now and then started afresh.
                    let clean = who == 3 || rng.next(8) == 0;
                    b.connect(c, &key(names[who]), clean, None).unwrap();
                    let mut kicked = Vec::new();
                    b.drain_kicked(&mut kicked);
                    for k in kicked {
                        if let Some(slot) = conns.iter_mut().find(|s| **s == Some(k)) {
                            *slot = None;
                        }
                    }
                    conns[who] = Some(c);
                }
                (1, Some(c)) => {
                    b.disconnect(c, rng.next(2) == 0);
                    conns[who] = None;
                }
                (2, Some(c)) => {
                    let f = filters[rng.next(4) as usize];
                    let q = QoS::from_bits(rng.next(3) as u8).unwrap();
                    b.subscribe(c, id(1), &[(f.to_string(), q)]).unwrap();
                }
                (3, Some(c)) => {
                    b.unsubscribe(c, &[filters[rng.next(4) as usize].to_string()]);
                }
                (4 | 5, _) => {
                    let t = topics[rng.next(4) as usize];
                    let q = QoS::from_bits(rng.next(3) as u8).unwrap();
                    b.publish(
                        t,
                        Bytes::from(vec![rng.next(256) as u8]),
                        q,
                        rng.next(4) == 0,
                    );
                }
                (6, Some(c)) => {
                    for p in packets(&mut b, c) {
                        match p {
                            Packet::Publish(p) if p.qos == QoS::AtLeastOnce && rng.next(3) > 0 => {
                                b.puback(c, p.packet_id.unwrap())
                            }
                            Packet::Publish(p) if p.qos == QoS::ExactlyOnce && rng.next(3) > 0 => {
                                b.pubrec(c, p.packet_id.unwrap())
                            }
                            Packet::PubRel(i) if rng.next(3) > 0 => b.pubcomp(c, i),
                            _ => {}
                        }
                    }
                }
                (7, Some(c)) => {
                    let i = id(1 + rng.next(4) as u16);
                    b.received_qos2(c, i);
                }
                (8, Some(c)) => b.released_qos2(c, id(1 + rng.next(4) as u16)),
                _ => {}
            }
            log.extend(b.take_journal().unwrap_or_default());
            let mut replayed = broker(SessionLimits::default());
            replayed.restore(&log).unwrap();
            let snapshot = b.snapshot();
            assert_eq!(replayed.snapshot(), snapshot, "seed {seed}");
            let mut again = broker(SessionLimits::default());
            again.restore(&snapshot).unwrap();
            assert_eq!(again.snapshot(), snapshot, "seed {seed}");
        }
        let mut rest = &log[..];
        while let Ok((record, used)) = crate::broker::journal::decode(rest) {
            kinds.insert(
                format!("{record:?}")
                    .split([' ', '{'])
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            );
            rest = &rest[used..];
        }
    }
    assert_eq!(kinds.len(), 11, "record kinds exercised");
}

#[test]
fn a_restored_session_sends_its_messages_again_with_their_identifiers() {
    let mut b = broker(SessionLimits::default());
    b.enable_journal();
    b.connect(A, &key("p"), false, None).unwrap();
    sub(&mut b, A, "t", QoS::ExactlyOnce);
    b.publish("t", Bytes::from_static(b"1"), QoS::AtLeastOnce, false);
    b.publish("t", Bytes::from_static(b"2"), QoS::ExactlyOnce, false);
    let sent = packets(&mut b, A);
    b.pubrec(A, publish_id(&sent[1]));
    b.publish("t", Bytes::from_static(b"3"), QoS::ExactlyOnce, false);
    b.publish("t", Bytes::from_static(b"not kept"), QoS::AtMostOnce, false);
    assert_eq!(b.received_qos2(A, id(40)), Some(true));
    let journal = b.take_journal().unwrap();

    let mut restored = broker(SessionLimits::default());
    restored.restore(&journal).unwrap();
    assert_eq!(restored.stats().sessions, 1);
    assert_eq!(restored.stats().subscriptions, 1);
    assert_eq!(restored.connect(B, &key("p"), false, None), Ok(true));
    let again = packets(&mut restored, B);
    assert_eq!(again.len(), 3, "{again:?}");
    match &again[0] {
        Packet::Publish(p) => assert!(p.dup && p.packet_id == Some(publish_id(&sent[0]))),
        other => panic!("{other:?}"),
    }
    assert_eq!(again[1], Packet::PubRel(publish_id(&sent[1])));
    match &again[2] {
        Packet::Publish(p) => assert!(!p.dup && &p.payload[..] == b"3"),
        other => panic!("{other:?}"),
    }
    assert_eq!(restored.received_qos2(B, id(40)), Some(false));
    // A new session number and message number never collide with restored ones.
    restored.connect(C, &key("q"), false, None).unwrap();
    let more = restored.snapshot();
    let mut check = broker(SessionLimits::default());
    check.restore(&more).unwrap();
    assert_eq!(check.stats().sessions, 2);
}

#[test]
fn records_that_do_not_fit_are_refused() {
    use crate::broker::journal::{encode, Record};
    let mut bad = Vec::new();
    encode(&mut bad, &Record::Send { sid: 9, id: id(1) });
    assert!(matches!(
        broker(SessionLimits::default()).restore(&bad),
        Err(RestoreError::Inconsistent { offset: 0, .. })
    ));
    let mut bad = Vec::new();
    let session = Record::Session {
        sid: 1,
        verified: true,
        client_id: "x",
    };
    encode(&mut bad, &session);
    encode(&mut bad, &session);
    assert!(matches!(
        broker(SessionLimits::default()).restore(&bad),
        Err(RestoreError::Inconsistent { .. })
    ));
    let mut bad = Vec::new();
    encode(&mut bad, &session);
    encode(&mut bad, &Record::Send { sid: 1, id: id(1) });
    assert!(broker(SessionLimits::default()).restore(&bad).is_err());
}
