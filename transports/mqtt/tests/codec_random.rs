//! The codec under random input, on stable Rust (the `mqtt_codec` target of the repository's `fuzz/` explores
//! further, see docs/fuzzing.md): random bytes, truncated and mutated valid packets, and valid streams cut at random
//! points. Nothing may panic; whatever decodes must encode back to itself; a valid stream must decode to the packets
//! it was made of, whatever the cuts.

use bytes::{Bytes, BytesMut};
use std::num::NonZeroU16;
use transport_mqtt::codec::*;

/// xorshift64*: a fixed seed makes a failure reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn pid(n: u16) -> PacketId {
    NonZeroU16::new(n).unwrap()
}

fn valid_packets() -> Vec<Packet> {
    vec![
        Packet::Connect(Connect {
            clean_session: false,
            keep_alive: 60,
            client_id: "dev-17".into(),
            will: Some(LastWill {
                topic: "w/dev-17".into(),
                message: Bytes::from_static(b"bye"),
                qos: QoS::AtLeastOnce,
                retain: false,
            }),
            username: Some("user".into()),
            password: Some(Bytes::from_static(b"pw")),
        }),
        Packet::ConnAck(ConnAck {
            session_present: false,
            code: ConnectReturnCode::Accepted,
        }),
        Packet::Publish(Publish {
            dup: true,
            qos: QoS::AtLeastOnce,
            retain: true,
            topic: "orders/dev-17".into(),
            packet_id: Some(pid(9)),
            payload: Bytes::from(vec![7u8; 64]),
        }),
        Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: false,
            topic: "a".into(),
            packet_id: None,
            payload: Bytes::new(),
        }),
        Packet::PubAck(pid(1)),
        Packet::PubRel(pid(2)),
        Packet::Subscribe(Subscribe {
            packet_id: pid(3),
            filters: vec![
                ("a/+".into(), QoS::AtLeastOnce),
                ("b/#".into(), QoS::AtMostOnce),
            ],
        }),
        Packet::SubAck(SubAck {
            packet_id: pid(3),
            return_codes: vec![
                SubscribeReturnCode::Granted(QoS::AtMostOnce),
                SubscribeReturnCode::Failure,
            ],
        }),
        Packet::Unsubscribe(Unsubscribe {
            packet_id: pid(4),
            filters: vec!["a/+".into()],
        }),
        Packet::UnsubAck(pid(4)),
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

/// The properties the fuzz target checks, on one input.
fn exercise(data: &[u8]) {
    let _ = check(data, 1 << 16);
    if let Ok(p) = Packet::decode(Bytes::copy_from_slice(data)) {
        assert_eq!(Packet::decode(Bytes::from(encode(&p))), Ok(p));
    }
    let mut buf = BytesMut::from(data);
    while let Ok(Some(p)) = read_packet(&mut buf, 1 << 16) {
        assert_eq!(Packet::decode(Bytes::from(encode(&p))), Ok(p));
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..50_000 {
        let len = rng.below(64);
        let mut data = rng.bytes(len);
        // Half the time, start with a plausible first byte so the bodies get explored too.
        if !data.is_empty() && rng.below(2) == 0 {
            data[0] = [
                0x10, 0x20, 0x30, 0x32, 0x3b, 0x40, 0x62, 0x82, 0x90, 0xA2, 0xB0, 0xC0,
            ][rng.below(12)];
            if data.len() > 1 {
                data[1] = (data.len() - 2) as u8;
            }
        }
        exercise(&data);
    }
}

#[test]
fn truncated_valid_packets_are_incomplete_never_errors() {
    for p in valid_packets() {
        let bytes = encode(&p);
        for cut in 0..bytes.len() {
            assert_eq!(check(&bytes[..cut], 1 << 16), Ok(None));
            assert!(matches!(
                Packet::decode(Bytes::copy_from_slice(&bytes[..cut])),
                Err(DecodeError::Incomplete { .. })
            ));
        }
    }
}

#[test]
fn mutated_valid_packets_never_panic() {
    let mut rng = Rng(42);
    let packets = valid_packets();
    for _ in 0..50_000 {
        let mut bytes = encode(&packets[rng.below(packets.len())]);
        for _ in 0..1 + rng.below(3) {
            match rng.below(4) {
                0 => {
                    let i = rng.below(bytes.len());
                    bytes[i] ^= 1 << rng.below(8);
                }
                1 => {
                    let i = rng.below(bytes.len());
                    bytes[i] = rng.next() as u8;
                }
                2 => {
                    let i = rng.below(bytes.len() + 1);
                    bytes.insert(i, rng.next() as u8);
                }
                _ if bytes.len() > 1 => {
                    bytes.remove(rng.below(bytes.len()));
                }
                _ => {}
            }
        }
        exercise(&bytes);
    }
}

#[test]
fn a_stream_cut_anywhere_decodes_to_its_packets() {
    let mut rng = Rng(7);
    let packets = valid_packets();
    for _ in 0..200 {
        let sent: Vec<Packet> = (0..20)
            .map(|_| packets[rng.below(packets.len())].clone())
            .collect();
        let stream: Vec<u8> = sent.iter().flat_map(encode).collect();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut at = 0;
        while at < stream.len() {
            let n = 1 + rng.below(40).min(stream.len() - at - 1);
            buf.extend_from_slice(&stream[at..at + n]);
            at += n;
            while let Some(p) = read_packet(&mut buf, 1 << 16).unwrap() {
                got.push(p);
            }
        }
        assert_eq!(got, sent);
        assert!(buf.is_empty());
    }
}
