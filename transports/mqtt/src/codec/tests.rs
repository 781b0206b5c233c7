use super::*;
use bytes::BytesMut;

fn id(n: u16) -> PacketId {
    PacketId::new(n).unwrap()
}

/// One of every packet type, with the optional parts exercised.
pub(crate) fn samples() -> Vec<Packet> {
    vec![
        Packet::Connect(Connect {
            clean_session: true,
            keep_alive: 30,
            client_id: "dev-1".into(),
            will: None,
            username: None,
            password: None,
        }),
        Packet::Connect(Connect {
            clean_session: false,
            keep_alive: 0,
            client_id: String::new(),
            will: Some(LastWill {
                topic: "status/dev-1".into(),
                message: Bytes::from_static(b"gone"),
                qos: QoS::AtLeastOnce,
                retain: true,
            }),
            username: Some("u".into()),
            password: Some(Bytes::from_static(&[0, 1, 2])),
        }),
        Packet::ConnAck(ConnAck {
            session_present: true,
            code: ConnectReturnCode::Accepted,
        }),
        Packet::ConnAck(ConnAck {
            session_present: false,
            code: ConnectReturnCode::NotAuthorized,
        }),
        Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: true,
            topic: "a/b".into(),
            packet_id: None,
            payload: Bytes::from_static(b"hello"),
        }),
        Packet::Publish(Publish {
            dup: true,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: "orders/dev-1".into(),
            packet_id: Some(id(7)),
            payload: Bytes::from(vec![0xAB; 300]),
        }),
        Packet::Publish(Publish {
            dup: false,
            qos: QoS::ExactlyOnce,
            retain: false,
            topic: "x".into(),
            packet_id: Some(id(65535)),
            payload: Bytes::new(),
        }),
        Packet::PubAck(id(1)),
        Packet::PubRec(id(2)),
        Packet::PubRel(id(3)),
        Packet::PubComp(id(4)),
        Packet::Subscribe(Subscribe {
            packet_id: id(5),
            filters: vec![
                ("a/+/c".into(), QoS::AtLeastOnce),
                ("#".into(), QoS::ExactlyOnce),
            ],
        }),
        Packet::SubAck(SubAck {
            packet_id: id(5),
            return_codes: vec![
                SubscribeReturnCode::Granted(QoS::AtLeastOnce),
                SubscribeReturnCode::Failure,
            ],
        }),
        Packet::Unsubscribe(Unsubscribe {
            packet_id: id(6),
            filters: vec!["a/+/c".into(), "x".into()],
        }),
        Packet::UnsubAck(id(6)),
        Packet::PingReq,
        Packet::PingResp,
        Packet::Disconnect,
    ]
}

fn encode(p: &Packet) -> Vec<u8> {
    let mut v = Vec::new();
    p.encode(&mut v).unwrap();
    v
}

fn decode(b: &[u8]) -> Result<Packet, DecodeError> {
    Packet::decode(Bytes::copy_from_slice(b))
}

#[test]
fn every_packet_round_trips() {
    for p in samples() {
        let bytes = encode(&p);
        assert_eq!(decode(&bytes).unwrap(), p);
        let header = check(&bytes, usize::MAX).unwrap().unwrap();
        assert_eq!(header.frame_len(), bytes.len());
    }
}

#[test]
fn known_encodings() {
    assert_eq!(encode(&Packet::PingReq), [0xC0, 0]);
    assert_eq!(encode(&Packet::Disconnect), [0xE0, 0]);
    assert_eq!(encode(&Packet::PubAck(id(0x1234))), [0x40, 2, 0x12, 0x34]);
    assert_eq!(encode(&Packet::PubRel(id(1))), [0x62, 2, 0, 1]);
    // A CONNECT as the specification's figure 3.6 lays out the variable header.
    let c = encode(&samples()[0]);
    assert_eq!(
        &c[..12],
        &[0x10, 17, 0, 4, b'M', b'Q', b'T', b'T', 4, 0b10, 0, 30]
    );
}

#[test]
fn remaining_length_boundaries() {
    for (len, header_len) in [
        (3, 2),
        (127, 2),
        (128, 3),
        (16_383, 3),
        (16_384, 4),
        (2_097_151, 4),
        (2_097_152, 5),
    ] {
        let topic = "t";
        let payload = vec![0u8; len - 3];
        let p = Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: false,
            topic: topic.into(),
            packet_id: None,
            payload: payload.into(),
        });
        let bytes = encode(&p);
        let h = check(&bytes, usize::MAX).unwrap().unwrap();
        assert_eq!((h.remaining_len, h.header_len), (len, header_len), "{len}");
        assert_eq!(decode(&bytes).unwrap(), p);
    }
    // The largest remaining length: 0xFF 0xFF 0xFF 0x7F.
    let h = check(&[0x30, 0xff, 0xff, 0xff, 0x7f], usize::MAX).unwrap();
    assert_eq!(h, None);
    assert_eq!(
        check(&[0x30, 0xff, 0xff, 0xff, 0x7f], 1 << 20),
        Err(DecodeError::TooLarge {
            size: 5 + MAX_REMAINING_LENGTH,
            max: 1 << 20
        })
    );
    // A fifth length byte is malformed.
    assert_eq!(
        check(&[0x30, 0xff, 0xff, 0xff, 0xff, 0x01], usize::MAX),
        Err(DecodeError::MalformedRemainingLength)
    );
}

#[test]
fn incomplete_frames_are_not_errors() {
    for p in samples() {
        let bytes = encode(&p);
        for cut in 0..bytes.len() {
            assert_eq!(
                check(&bytes[..cut], usize::MAX),
                Ok(None),
                "{p:?} cut at {cut}"
            );
            assert!(
                matches!(decode(&bytes[..cut]), Err(DecodeError::Incomplete { .. })),
                "{p:?} cut at {cut}"
            );
        }
    }
    let mut buf = BytesMut::from(&encode(&Packet::PingReq)[..1]);
    assert_eq!(read_packet(&mut buf, 100), Ok(None));
    buf.extend_from_slice(&[0, 0xC0]);
    assert_eq!(read_packet(&mut buf, 100), Ok(Some(Packet::PingReq)));
    assert_eq!(read_packet(&mut buf, 100), Ok(None));
    assert_eq!(buf.len(), 1);
}

#[test]
fn trailing_bytes_are_rejected() {
    let mut bytes = encode(&Packet::PingReq);
    bytes.push(0);
    assert_eq!(decode(&bytes), Err(DecodeError::TrailingBytes(1)));
    // A PUBACK whose remaining length says 3.
    assert_eq!(
        decode(&[0x40, 3, 0, 1, 9]),
        Err(DecodeError::TrailingBytes(1))
    );
    // A DISCONNECT with a body.
    assert_eq!(decode(&[0xE0, 1, 0]), Err(DecodeError::TrailingBytes(1)));
    // A CONNECT with a byte after the last field its flags announce.
    let mut c = encode(&samples()[0]);
    c[1] += 1;
    c.push(b'x');
    assert_eq!(decode(&c), Err(DecodeError::TrailingBytes(1)));
}

#[test]
fn reserved_types_and_flags_are_rejected_from_the_first_byte() {
    assert_eq!(check(&[0x00], 100), Err(DecodeError::ReservedPacketType(0)));
    assert_eq!(
        check(&[0xF0], 100),
        Err(DecodeError::ReservedPacketType(15))
    );
    // SUBSCRIBE, UNSUBSCRIBE and PUBREL need flags 0010 [MQTT-3.8.1-1, MQTT-3.10.1-1, MQTT-3.6.1-1].
    assert_eq!(
        check(&[0x80], 100),
        Err(DecodeError::InvalidFlags {
            packet_type: 8,
            flags: 0
        })
    );
    assert_eq!(
        check(&[0xA0], 100),
        Err(DecodeError::InvalidFlags {
            packet_type: 10,
            flags: 0
        })
    );
    assert_eq!(
        check(&[0x60], 100),
        Err(DecodeError::InvalidFlags {
            packet_type: 6,
            flags: 0
        })
    );
    assert_eq!(
        check(&[0x11], 100),
        Err(DecodeError::InvalidFlags {
            packet_type: 1,
            flags: 1
        })
    );
    assert_eq!(
        check(&[0xC8], 100),
        Err(DecodeError::InvalidFlags {
            packet_type: 12,
            flags: 8
        })
    );
    // PUBLISH with QoS 3 [MQTT-3.3.1-4], and DUP with QoS 0 [MQTT-3.3.1-2].
    assert_eq!(check(&[0x36], 100), Err(DecodeError::InvalidQos(3)));
    assert_eq!(check(&[0x38], 100), Err(DecodeError::DupWithQos0));
}

#[test]
fn connect_violations() {
    let good = encode(&samples()[0]);
    // Reserved flag [MQTT-3.1.2-3].
    let mut c = good.clone();
    c[9] |= 1;
    assert_eq!(decode(&c), Err(DecodeError::InvalidConnectFlags(0b11)));
    // Will QoS without the will flag [MQTT-3.1.2-13].
    let mut c = good.clone();
    c[9] |= 0b1000;
    assert!(matches!(
        decode(&c),
        Err(DecodeError::InvalidConnectFlags(_))
    ));
    // Will retain without the will flag [MQTT-3.1.2-15].
    let mut c = good.clone();
    c[9] |= 0b10_0000;
    assert!(matches!(
        decode(&c),
        Err(DecodeError::InvalidConnectFlags(_))
    ));
    // Password without user name [MQTT-3.1.2-22].
    let mut c = good.clone();
    c[9] |= 0b0100_0000;
    assert!(matches!(
        decode(&c),
        Err(DecodeError::InvalidConnectFlags(_))
    ));
    // Protocol level 3 and 5 [MQTT-3.1.2-2]; a foreign protocol name [MQTT-3.1.2-1].
    let mut c = good.clone();
    c[8] = 5;
    assert_eq!(decode(&c), Err(DecodeError::UnsupportedProtocolLevel(5)));
    let mut c = good.clone();
    c[4] = b'X';
    assert_eq!(decode(&c), Err(DecodeError::InvalidProtocolName));
    // A client id with U+0000 [MQTT-1.5.3-2] and one with invalid UTF-8 [MQTT-1.5.3-1].
    let mut c = good.clone();
    c[14] = 0;
    assert_eq!(
        decode(&c),
        Err(DecodeError::InvalidString("client identifier"))
    );
    let mut c = good;
    c[14] = 0xC0;
    assert_eq!(
        decode(&c),
        Err(DecodeError::InvalidString("client identifier"))
    );
    // MQTT 3.1's CONNECT is answered with return code 1, not dropped.
    let mut v = vec![0x10, 0];
    v.extend_from_slice(&[
        0, 6, b'M', b'Q', b'I', b's', b'd', b'p', 3, 2, 0, 60, 0, 1, b'a',
    ]);
    v[1] = (v.len() - 2) as u8;
    assert_eq!(decode(&v), Err(DecodeError::UnsupportedProtocolLevel(3)));
}

#[test]
fn publish_violations() {
    // Wildcards in a topic name [MQTT-3.3.2-2], an empty name [MQTT-4.7.3-1], packet id 0 [MQTT-2.3.1-1].
    assert_eq!(
        decode(&[0x30, 5, 0, 3, b'a', b'/', b'#']),
        Err(DecodeError::InvalidTopicName)
    );
    assert_eq!(
        decode(&[0x30, 3, 0, 1, b'+']),
        Err(DecodeError::InvalidTopicName)
    );
    assert_eq!(decode(&[0x30, 2, 0, 0]), Err(DecodeError::InvalidTopicName));
    assert_eq!(
        decode(&[0x32, 5, 0, 1, b'a', 0, 0]),
        Err(DecodeError::ZeroPacketId)
    );
    assert_eq!(
        decode(&[0x32, 4, 0, 1, b'a', 0]),
        Err(DecodeError::Truncated("packet identifier"))
    );
    assert_eq!(
        decode(&[0x30, 4, 0, 9, b'a', b'b']),
        Err(DecodeError::Truncated("topic name"))
    );
    assert_eq!(decode(&[0x40, 2, 0, 0]), Err(DecodeError::ZeroPacketId));
}

#[test]
fn subscribe_violations() {
    // No filter [MQTT-3.8.3-3], reserved bits in the QoS byte [MQTT-3.8.3-4], QoS 3, a bad filter.
    assert_eq!(decode(&[0x82, 2, 0, 1]), Err(DecodeError::NoTopicFilters));
    assert_eq!(
        decode(&[0x82, 6, 0, 1, 0, 1, b'a', 0x04]),
        Err(DecodeError::ReservedBits("requested QoS"))
    );
    assert_eq!(
        decode(&[0x82, 6, 0, 1, 0, 1, b'a', 0x03]),
        Err(DecodeError::InvalidQos(3))
    );
    assert_eq!(
        decode(&[0x82, 7, 0, 1, 0, 2, b'a', b'#', 0]),
        Err(DecodeError::InvalidTopicFilter)
    );
    assert_eq!(
        decode(&[0x82, 5, 0, 1, 0, 1, b'a']),
        Err(DecodeError::Truncated("requested QoS"))
    );
    assert_eq!(decode(&[0xA2, 2, 0, 1]), Err(DecodeError::NoTopicFilters));
    assert_eq!(
        decode(&[0x90, 3, 0, 1, 0x03]),
        Err(DecodeError::InvalidReturnCode(3))
    );
    assert_eq!(
        decode(&[0x20, 2, 2, 0]),
        Err(DecodeError::ReservedBits("connack flags"))
    );
    assert_eq!(
        decode(&[0x20, 2, 0, 6]),
        Err(DecodeError::InvalidReturnCode(6))
    );
}

#[test]
fn oversized_frames_are_refused_before_the_body_arrives() {
    // A PUBLISH announcing 1 MiB against a 64 KiB limit: refused from the header alone.
    let header = [0x30, 0x80, 0x80, 0x40];
    assert_eq!(
        check(&header, 64 * 1024),
        Err(DecodeError::TooLarge {
            size: 4 + (1 << 20),
            max: 64 * 1024
        })
    );
    // Exactly at the limit is accepted.
    let p = encode(&samples()[5]);
    assert!(check(&p, p.len()).unwrap().is_some());
    assert!(check(&p, p.len() - 1).is_err());
}

#[test]
fn encode_refuses_what_cannot_be_said() {
    let mut v = Vec::new();
    let bad = Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: "a".into(),
        packet_id: None,
        payload: Bytes::new(),
    };
    assert_eq!(
        Packet::Publish(bad.clone()).encode(&mut v),
        Err(EncodeError::PacketIdMismatch)
    );
    let dup0 = Publish {
        dup: true,
        qos: QoS::AtMostOnce,
        ..bad
    };
    assert_eq!(
        Packet::Publish(dup0).encode(&mut v),
        Err(EncodeError::DupWithQos0)
    );
    let long = Packet::Unsubscribe(Unsubscribe {
        packet_id: id(1),
        filters: vec!["a".repeat(70_000)],
    });
    assert_eq!(
        long.encode(&mut v),
        Err(EncodeError::FieldTooLong("topic filter"))
    );
    let none = Packet::Subscribe(Subscribe {
        packet_id: id(1),
        filters: vec![],
    });
    assert_eq!(none.encode(&mut v), Err(EncodeError::NoTopicFilters));
    assert!(v.is_empty(), "nothing written on error");
}

#[test]
fn a_publish_head_and_its_payload_written_after_are_the_publish() {
    // The lengths that move the remaining length's encoding from 1 to 2 and from 2 to 3 bytes.
    for len in [0usize, 1, 100, 114, 115, 16_370, 16_371, 20_000] {
        let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
        for (qos, packet_id, dup) in [
            (QoS::AtMostOnce, None, false),
            (QoS::AtLeastOnce, Some(id(7)), false),
            (QoS::AtLeastOnce, Some(id(7)), true),
        ] {
            let mut whole = BytesMut::new();
            encode_publish(
                &mut whole,
                dup,
                qos,
                false,
                "orders/dev-1",
                packet_id,
                &payload,
            )
            .unwrap();
            let mut parts = BytesMut::new();
            encode_publish_head(&mut parts, dup, qos, false, "orders/dev-1", packet_id, len)
                .unwrap();
            parts.extend_from_slice(&payload);
            assert_eq!(parts, whole, "payload of {len} bytes, {qos:?}");
            let mut buf = whole.clone();
            match read_packet(&mut buf, usize::MAX) {
                Ok(Some(Packet::Publish(p))) => assert_eq!(&p.payload[..], &payload[..]),
                other => panic!("{other:?}"),
            }
            assert!(buf.is_empty());
        }
    }
    // A QoS 0 head with an identifier is refused before anything is written.
    let mut buf = BytesMut::new();
    assert!(
        encode_publish_head(&mut buf, false, QoS::AtMostOnce, false, "t", Some(id(1)), 3).is_err()
    );
    assert!(buf.is_empty());
}
