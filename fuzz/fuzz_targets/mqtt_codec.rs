//! The MQTT 3.1.1 codec (`transport_mqtt::codec`) on arbitrary byte streams and on generated valid packets.
//!
//! The first byte picks the mode.
//!
//! Bytes: the rest is a stream, read as a connection reads it (`read_packet`, maximum packet size from the input).
//! Checks: nothing panics; every packet read decodes alone to itself with `Packet::decode`; it encodes, and its
//! encoding decodes to the same packet (decode → encode → decode); when its Remaining Length was written in the
//! fewest bytes, the encoding is byte for byte the frame it was read from (the decoder accepts exactly one form
//! of each packet); `check` never announces a frame longer than the maximum; and the same stream delivered in
//! chunks cut at input-chosen points yields the same packets and the same error.
//!
//! Packets: the rest generates valid packets of every type. Checks: each encodes, decodes to itself, and a stream
//! of them cut into chunks reads back as the same packets.
#![no_main]

use arbitrary::Unstructured;
use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use transport_fuzz::mqtt::packet;
use transport_mqtt::codec::{check, read_packet, DecodeError, Packet};

/// Packet size limits a connection may be configured with.
const MAX_SIZES: [usize; 4] = [2, 64, 4096, 1 << 20];

/// Read a whole stream: the packets, and the error that ended it (if any).
fn read_all(stream: &[u8], chunks: &[usize], max: usize) -> (Vec<Packet>, Option<DecodeError>) {
    let mut buf = BytesMut::new();
    let mut packets = Vec::new();
    let mut rest = stream;
    let mut cuts = chunks.iter().copied().chain(std::iter::repeat(usize::MAX));
    loop {
        loop {
            match read_packet(&mut buf, max) {
                Ok(Some(p)) => packets.push(p),
                Ok(None) => break,
                Err(e) => return (packets, Some(e)),
            }
        }
        if rest.is_empty() {
            return (packets, None);
        }
        let n = cuts.next().expect("endless").clamp(1, rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
    }
}

fn round_trip(p: &Packet) -> Vec<u8> {
    let mut out = Vec::new();
    p.encode(&mut out)
        .unwrap_or_else(|e| panic!("{p:?} was decoded but does not encode: {e}"));
    let back = Packet::decode(Bytes::from(out.clone()));
    assert_eq!(
        back.as_ref(),
        Ok(p),
        "encode then decode changed the packet"
    );
    out
}

fn bytes_mode(mut u: Unstructured<'_>) {
    let Ok(max) = u.choose(&MAX_SIZES).copied() else {
        return;
    };
    let chunks: Vec<usize> = (0..u.int_in_range(0..=4).unwrap_or(0))
        .map(|_| u.int_in_range(1..=64).unwrap_or(1))
        .collect();
    let stream = u.take_rest();

    // Frame by frame, as a connection reads: each frame read alone must agree with the stream reader.
    let mut at = 0;
    let mut packets = Vec::new();
    let mut error = None;
    while at < stream.len() {
        match check(&stream[at..], max) {
            Ok(None) => break,
            Err(e) => {
                error = Some(e);
                break;
            }
            Ok(Some(h)) => {
                assert!(
                    h.frame_len() <= max,
                    "check announced a frame longer than the maximum"
                );
                assert!(h.frame_len() <= stream.len() - at);
                let frame = &stream[at..at + h.frame_len()];
                at += h.frame_len();
                match Packet::decode(Bytes::copy_from_slice(frame)) {
                    Ok(p) => {
                        let encoded = round_trip(&p);
                        let minimal = h.header_len == 1 + remaining_length_bytes(h.remaining_len);
                        if minimal {
                            assert_eq!(
                                encoded, frame,
                                "the decoder accepted a form the encoder does not write: {p:?}"
                            );
                        }
                        packets.push(p);
                    }
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
        }
    }
    let whole = read_all(stream, &[], max);
    assert_eq!(
        whole,
        (packets.clone(), error.clone()),
        "read_packet disagrees with check and Packet::decode"
    );
    let cut = read_all(stream, &chunks, max);
    assert_eq!(
        cut,
        (packets, error),
        "the same stream in chunks {chunks:?} read differently"
    );
}

fn remaining_length_bytes(len: usize) -> usize {
    match len {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

fn packets_mode(u: &mut Unstructured<'_>) {
    let mut stream = Vec::new();
    let mut made = Vec::new();
    while !u.is_empty() && made.len() < 16 {
        let Ok(p) = packet(u, false) else { break };
        stream.extend_from_slice(&round_trip(&p));
        made.push(p);
    }
    let chunks: Vec<usize> = (0..8).map(|i| 1 + (i * 7) % 13).collect();
    assert_eq!(
        read_all(&stream, &chunks, usize::MAX),
        (made, None),
        "a stream of valid packets read differently"
    );
}

fuzz_target!(init: transport_fuzz::seeds::write_if_asked("mqtt_codec"), |data: &[u8]| {
    let mut u = Unstructured::new(data);
    match u.int_in_range(0..=1u8) {
        Ok(0) => bytes_mode(u),
        _ => packets_mode(&mut u),
    }
});
