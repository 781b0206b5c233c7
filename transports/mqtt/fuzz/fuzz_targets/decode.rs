//! Feed arbitrary bytes to the MQTT decoder as a stream, the way a connection does: it must never panic, and every
//! packet it accepts must encode back to bytes that decode to the same packet.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use transport_mqtt::codec::{check, read_packet, Packet};

fuzz_target!(|data: &[u8]| {
    let _ = check(data, 1 << 16);
    let _ = Packet::decode(Bytes::copy_from_slice(data));
    let mut buf = BytesMut::from(data);
    while let Ok(Some(packet)) = read_packet(&mut buf, 1 << 16) {
        let mut out = Vec::new();
        packet.encode(&mut out).expect("a decoded packet encodes");
        assert_eq!(Packet::decode(Bytes::from(out)).as_ref(), Ok(&packet));
    }
});
