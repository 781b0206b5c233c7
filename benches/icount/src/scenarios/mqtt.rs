//! MQTT: the codec's cost for the order path's packet, a QoS 1 PUBLISH with a 64-byte payload.
//!
//! Encoding writes into a buffer the step clears first, so the count is the codec's, not an allocator's. Decoding
//! is what the broker does per packet: [`read_packet`] checks the fixed header, splits the frame off the
//! connection's buffer and decodes it (the topic copied into a `String`, the payload a slice of the frame). Putting
//! the bytes into the buffer (the socket read) is not counted; dropping the decoded packet is not counted either.

use crate::meter::Meter;
use anyhow::{ensure, Context};
use bytes::BytesMut;
use transport_mqtt::broker::BrokerConfig;
use transport_mqtt::codec::{self, read_packet, Packet, PacketId, QoS};

const TOPIC: &str = "orders/dev-0";
const PAYLOAD: [u8; super::pure::PAYLOAD] = [0xa5; super::pure::PAYLOAD];

fn packet_id() -> PacketId {
    PacketId::new(1).expect("non-zero")
}

fn put_publish(buf: &mut BytesMut) -> anyhow::Result<()> {
    codec::encode_publish(
        buf,
        false,
        QoS::AtLeastOnce,
        false,
        TOPIC,
        Some(packet_id()),
        &PAYLOAD,
    )
    .context("encode")
}

/// `mqtt/encode-publish`.
pub fn encode_publish(m: &Meter) -> anyhow::Result<()> {
    let mut buf = BytesMut::with_capacity(256);
    m.run(|_, s| {
        buf.clear();
        s.measure(|| put_publish(&mut buf))?;
        // Fixed header (2) + topic (2 + 12) + packet id (2) + payload.
        ensure!(buf.len() == 2 + 2 + TOPIC.len() + 2 + PAYLOAD.len());
        Ok(())
    })
}

/// `mqtt/decode-publish`.
pub fn decode_publish(m: &Meter) -> anyhow::Result<()> {
    let max = BrokerConfig::default().max_packet_size;
    let mut frame = BytesMut::new();
    put_publish(&mut frame)?;
    let mut buf = BytesMut::with_capacity(4096);
    m.run(|_, s| {
        buf.extend_from_slice(&frame);
        let packet = s.measure(|| read_packet(&mut buf, max)).context("decode")?;
        let Some(Packet::Publish(p)) = packet else {
            anyhow::bail!("not a PUBLISH: {packet:?}");
        };
        ensure!(p.topic == TOPIC && p.qos == QoS::AtLeastOnce && p.packet_id == Some(packet_id()));
        ensure!(p.payload[..] == PAYLOAD[..] && buf.is_empty());
        Ok(())
    })
}
