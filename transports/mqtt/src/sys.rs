//! Reading a broker's `$SYS` figures as a plain client: one TLS connection with a device's certificate, one
//! subscription at QoS 0, the latest value of a numeric topic (mosquitto publishes `$SYS/broker/heap/current` as
//! decimal bytes every `sys_interval`, and retains it, so a new subscriber gets the current value at once).

use crate::client::{connect_packet, connect_tls, MqttStream};
use crate::codec::{Packet, PacketId, QoS, Subscribe, SubscribeReturnCode};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use transport_core::{device_name, Counters, TransportError};
use transport_tls::{ClientTls, DeviceCredentials};

/// The watcher's keepalive: it sends PINGREQ more often than this, so an idle broker keeps it.
const KEEP_ALIVE: u16 = 30;
/// How long to wait for SUBACK.
const SUBACK_TIMEOUT: Duration = Duration::from_secs(10);

fn protocol(what: &str) -> TransportError {
    TransportError::Protocol(what.to_string())
}

/// Subscribe to `topic` on the broker at `server` as device `device` of `identity` and follow its value, a
/// decimal number. The receiver holds the latest value (`None` until the first); the client sends DISCONNECT and
/// leaves when the receiver is dropped. A value that is not a number, or a lost connection, ends the watch (the
/// sender is dropped), so a stale figure is never read as a current one.
pub async fn watch_number(
    server: SocketAddr,
    identity: &Path,
    device: u32,
    topic: &str,
) -> Result<watch::Receiver<Option<u64>>, TransportError> {
    let credentials = Arc::new(DeviceCredentials::load_for(identity, device + 1)?);
    let tls = ClientTls::new(credentials, Arc::new(Counters::default()), &[])?;
    let stream = connect_tls(server, tls.config(device)?).await?;
    let mut mqtt = MqttStream::new(stream);
    mqtt.connect(connect_packet(&device_name(device), true, KEEP_ALIVE))
        .await?;
    let id = PacketId::new(1).expect("nonzero");
    mqtt.send(&Packet::Subscribe(Subscribe {
        packet_id: id,
        filters: vec![(topic.to_string(), QoS::AtMostOnce)],
    }))
    .await?;
    let (tx, rx) = watch::channel(None);
    let granted = tokio::time::timeout(SUBACK_TIMEOUT, async {
        loop {
            match mqtt.recv().await? {
                Packet::SubAck(ack) if ack.packet_id == id => {
                    return Ok::<_, TransportError>(
                        ack.return_codes.first() != Some(&SubscribeReturnCode::Failure),
                    );
                }
                // The retained value may come before SUBACK.
                Packet::Publish(p) if p.topic == topic => {
                    let _ = tx.send(Some(number(&p.payload)?));
                }
                _ => {}
            }
        }
    })
    .await
    .map_err(|_| protocol("no SUBACK in time"))??;
    if !granted {
        return Err(TransportError::Protocol(format!(
            "the broker refused the subscription to {topic}"
        )));
    }
    let topic = topic.to_string();
    tokio::spawn(async move {
        let mut ping = tokio::time::interval(Duration::from_secs(u64::from(KEEP_ALIVE) / 2));
        ping.tick().await;
        loop {
            tokio::select! {
                _ = tx.closed() => {
                    let _ = mqtt.send(&Packet::Disconnect).await;
                    return;
                }
                _ = ping.tick() => {
                    if mqtt.send(&Packet::PingReq).await.is_err() {
                        return;
                    }
                }
                packet = mqtt.recv() => match packet {
                    Ok(Packet::Publish(p)) if p.topic == topic => match number(&p.payload) {
                        Ok(v) => {
                            let _ = tx.send(Some(v));
                        }
                        Err(e) => {
                            eprintln!("{topic}: {e}");
                            return;
                        }
                    },
                    Ok(_) => {}
                    Err(_) => return,
                },
            }
        }
    });
    Ok(rx)
}

fn number(payload: &[u8]) -> Result<u64, TransportError> {
    std::str::from_utf8(payload)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| {
            TransportError::Protocol(format!(
                "not a number: {:?}",
                String::from_utf8_lossy(&payload[..payload.len().min(40)])
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_decimal_numbers() {
        assert_eq!(number(b"33256").unwrap(), 33256);
        assert_eq!(number(b" 7\n").unwrap(), 7);
        for bad in [&b""[..], b"12 bytes", b"-1", b"\xff"] {
            assert!(number(bad).is_err(), "{bad:?}");
        }
    }
}
