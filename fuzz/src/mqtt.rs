//! Generators of valid MQTT 3.1.1 packets for the structure-aware targets, and a reference topic matcher.
//!
//! Topic levels come mostly from a small alphabet, so that the filters and names one input makes often meet; the
//! rest are arbitrary strings (any Unicode but U+0000 and the wildcards).

use crate::bytes_upto;
use arbitrary::{Arbitrary, Result, Unstructured};
use bytes::Bytes;
use transport_core::framing::encode_order_body;
use transport_core::{sender_id, Order, OrderId};
use transport_mqtt::codec::{
    ConnAck, Connect, ConnectReturnCode, LastWill, Packet, PacketId, Publish, QoS, SubAck,
    Subscribe, SubscribeReturnCode, Unsubscribe,
};

/// Levels topic names and filters are mostly made of.
const LEVELS: &[&str] = &["a", "b", "c", "orders", "dev-0", "dev-1", "$SYS", "", "é/"];
/// Client identifiers and certificate names the targets use.
pub const CLIENT_IDS: &[&str] = &["", "dev-0", "dev-1", "dev-2", "probe"];

/// A string of arbitrary characters without U+0000 (which MQTT forbids) and, unless `wild`, without `+` and `#`.
fn free_string(u: &mut Unstructured<'_>, wild: bool) -> Result<String> {
    let s = String::arbitrary(u)?;
    Ok(s.chars()
        .filter(|&c| c != '\0' && (wild || (c != '+' && c != '#')))
        .take(24)
        .collect())
}

fn level(u: &mut Unstructured<'_>) -> Result<String> {
    if u.ratio(1, 8)? {
        free_string(u, false)
    } else {
        Ok(u.choose(LEVELS)?.to_string())
    }
}

/// A valid topic name: not empty, no wildcards.
pub fn topic_name(u: &mut Unstructured<'_>) -> Result<String> {
    let n = u.int_in_range(1..=4)?;
    let levels = (0..n).map(|_| level(u)).collect::<Result<Vec<_>>>()?;
    let name = levels.join("/");
    Ok(if name.is_empty() { "a".into() } else { name })
}

/// A valid topic filter: `+` alone in a level, `#` alone in the last one.
pub fn topic_filter(u: &mut Unstructured<'_>) -> Result<String> {
    let n = u.int_in_range(0..=4)?;
    let mut levels = (0..n)
        .map(|_| {
            if u.ratio(1, 4)? {
                Ok("+".to_string())
            } else {
                level(u)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    if n == 0 || u.ratio(1, 4)? {
        levels.push("#".into());
    }
    let filter = levels.join("/");
    // An empty filter is not a filter [MQTT-4.7.3-1].
    Ok(if filter.is_empty() {
        "a".into()
    } else {
        filter
    })
}

/// A QoS, 0 to 2.
pub fn qos(u: &mut Unstructured<'_>) -> Result<QoS> {
    Ok([QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce][u.choose_index(3)?])
}

/// A packet identifier, mostly small so that identifiers repeat.
pub fn packet_id(u: &mut Unstructured<'_>) -> Result<PacketId> {
    let n = if u.ratio(7, 8)? {
        u.int_in_range(1..=8)?
    } else {
        u.int_in_range(1..=u16::MAX)?
    };
    Ok(PacketId::new(n).expect("not zero"))
}

fn client_id(u: &mut Unstructured<'_>) -> Result<String> {
    if u.ratio(1, 8)? {
        free_string(u, true)
    } else {
        Ok(u.choose(CLIENT_IDS)?.to_string())
    }
}

/// A payload: for `orders/<device>` topics mostly an order body (with the right sender, or another).
fn payload(u: &mut Unstructured<'_>, topic: &str) -> Result<Bytes> {
    if let (Some(device), true) = (topic.strip_prefix("orders/"), u.ratio(3, 4)?) {
        let sender = if u.ratio(7, 8)? {
            sender_id(device)
        } else {
            u64::arbitrary(u)?
        };
        let order = Order {
            id: OrderId {
                sender,
                run: u.int_in_range(0..=3)?,
                seq: u.int_in_range(0..=15)?,
            },
            made_us: u64::arbitrary(u)?,
            payload: bytes_upto(u, 32)?,
        };
        let mut out = Vec::new();
        encode_order_body(&order, &mut out);
        if u.ratio(1, 8)? {
            // A damaged body.
            out.truncate(u.choose_index(out.len() + 1)?);
        }
        return Ok(out.into());
    }
    Ok(bytes_upto(u, 64)?.into())
}

/// A valid PUBLISH.
pub fn publish(u: &mut Unstructured<'_>) -> Result<Publish> {
    let qos = qos(u)?;
    let topic = if u.ratio(1, 4)? {
        format!("orders/{}", u.choose(CLIENT_IDS)?)
    } else {
        topic_name(u)?
    };
    Ok(Publish {
        dup: qos != QoS::AtMostOnce && bool::arbitrary(u)?,
        qos,
        retain: bool::arbitrary(u)?,
        packet_id: if qos == QoS::AtMostOnce {
            None
        } else {
            Some(packet_id(u)?)
        },
        payload: payload(u, &topic)?,
        topic,
    })
}

/// A valid CONNECT.
pub fn connect(u: &mut Unstructured<'_>) -> Result<Connect> {
    let will = if u.ratio(1, 3)? {
        Some(LastWill {
            topic: topic_name(u)?,
            message: bytes_upto(u, 32)?.into(),
            qos: qos(u)?,
            retain: bool::arbitrary(u)?,
        })
    } else {
        None
    };
    let username = if u.ratio(1, 4)? {
        Some(free_string(u, true)?)
    } else {
        None
    };
    let password = match username {
        Some(_) if bool::arbitrary(u)? => Some(bytes_upto(u, 16)?.into()),
        _ => None,
    };
    Ok(Connect {
        clean_session: bool::arbitrary(u)?,
        keep_alive: if u.ratio(1, 2)? {
            0
        } else {
            u.int_in_range(1..=120)?
        },
        client_id: client_id(u)?,
        will,
        username,
        password,
    })
}

fn list<T>(
    u: &mut Unstructured<'_>,
    max: usize,
    mut f: impl FnMut(&mut Unstructured<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    let n = u.int_in_range(1..=max)?;
    (0..n).map(|_| f(u)).collect()
}

/// A valid packet a client sends (`client_only`), or any valid packet.
pub fn packet(u: &mut Unstructured<'_>, client_only: bool) -> Result<Packet> {
    const CLIENT: &[u8] = &[1, 3, 3, 3, 4, 5, 6, 7, 8, 8, 10, 12, 14];
    let t = if client_only {
        *u.choose(CLIENT)?
    } else {
        u.int_in_range(1..=14)?
    };
    Ok(match t {
        1 => Packet::Connect(connect(u)?),
        2 => Packet::ConnAck(ConnAck {
            session_present: bool::arbitrary(u)?,
            code: [
                ConnectReturnCode::Accepted,
                ConnectReturnCode::UnacceptableProtocolVersion,
                ConnectReturnCode::IdentifierRejected,
                ConnectReturnCode::ServerUnavailable,
                ConnectReturnCode::BadUserNameOrPassword,
                ConnectReturnCode::NotAuthorized,
            ][u.choose_index(6)?],
        }),
        3 => Packet::Publish(publish(u)?),
        4 => Packet::PubAck(packet_id(u)?),
        5 => Packet::PubRec(packet_id(u)?),
        6 => Packet::PubRel(packet_id(u)?),
        7 => Packet::PubComp(packet_id(u)?),
        8 => Packet::Subscribe(Subscribe {
            packet_id: packet_id(u)?,
            filters: list(u, 4, |u| Ok((topic_filter(u)?, qos(u)?)))?,
        }),
        9 => Packet::SubAck(SubAck {
            packet_id: packet_id(u)?,
            return_codes: list(u, 4, |u| {
                Ok(if u.ratio(1, 5)? {
                    SubscribeReturnCode::Failure
                } else {
                    SubscribeReturnCode::Granted(qos(u)?)
                })
            })?,
        }),
        10 => Packet::Unsubscribe(Unsubscribe {
            packet_id: packet_id(u)?,
            filters: list(u, 4, topic_filter)?,
        }),
        11 => Packet::UnsubAck(packet_id(u)?),
        12 => Packet::PingReq,
        13 => Packet::PingResp,
        _ => Packet::Disconnect,
    })
}

/// Whether `filter` matches topic `name`, written from section 4.7 of the specification, apart from the broker's
/// subscription tree and `topic::matches`, so that the targets compare the two.
pub fn reference_matches(filter: &str, name: &str) -> bool {
    // [MQTT-4.7.2-1]: a filter starting with a wildcard does not match a name starting with `$`.
    if name.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let f: Vec<&str> = filter.split('/').collect();
    let n: Vec<&str> = name.split('/').collect();
    fn walk(f: &[&str], n: &[&str]) -> bool {
        match (f.first(), n.first()) {
            // `#` matches its parent level and any number of levels below [MQTT-4.7.1-2].
            (Some(&"#"), _) => true,
            (None, None) => true,
            (Some(&"+"), Some(_)) => walk(&f[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => walk(&f[1..], &n[1..]),
            _ => false,
        }
    }
    walk(&f, &n)
}
