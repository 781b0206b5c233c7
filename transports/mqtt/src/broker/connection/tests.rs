//! The per-connection protocol with a virtual clock: times are offsets from a fixed start.

use super::*;
use crate::broker::state::SessionLimits;
use crate::codec::{read_packet, Connect, LastWill, PacketId, Subscribe};
use bytes::{Bytes, BytesMut};
use transport_core::framing::encode_order_body;
use transport_core::OrderId;

struct Pair {
    broker: Broker,
    counters: Arc<Counters>,
    t0: Instant,
}

impl Pair {
    fn new() -> Self {
        let counters = Arc::new(Counters::default());
        let t0 = Instant::now();
        Pair {
            broker: Broker::new(SessionLimits::default(), counters.clone(), t0),
            counters,
            t0,
        }
    }

    fn at(&self, secs: f64) -> Instant {
        self.t0 + Duration::from_secs_f64(secs)
    }

    fn conn(&self, n: u64, identity: Option<&str>) -> Connection {
        Connection::new(
            ConnId(n),
            identity.map(String::from),
            self.t0,
            Duration::from_secs(10),
            Duration::from_secs(600),
            self.counters.clone(),
        )
    }

    fn handle(
        &mut self,
        c: &mut Connection,
        p: Packet,
        at: f64,
    ) -> (Vec<Action>, Result<(), Close>) {
        let mut out = Vec::new();
        let now = self.at(at);
        let r = c.handle(&mut self.broker, p, now, &mut out);
        (out, r)
    }

    fn ok(&mut self, c: &mut Connection, p: Packet, at: f64) -> Vec<Action> {
        let (out, r) = self.handle(c, p, at);
        assert_eq!(r, Ok(()));
        out
    }
}

fn connect_packet_of(client_id: &str) -> Connect {
    Connect {
        clean_session: true,
        keep_alive: 0,
        client_id: client_id.into(),
        will: None,
        username: None,
        password: None,
    }
}

fn connect(client_id: &str, clean: bool, keep_alive: u16) -> Packet {
    Packet::Connect(Connect {
        clean_session: clean,
        keep_alive,
        client_id: client_id.into(),
        will: None,
        username: None,
        password: None,
    })
}

fn connack(code: ConnectReturnCode, present: bool) -> Action {
    Action::Send(Packet::ConnAck(ConnAck {
        session_present: present,
        code,
    }))
}

fn id(n: u16) -> PacketId {
    PacketId::new(n).unwrap()
}

fn order_publish(topic: &str, sender: u64, packet_id: u16) -> (Packet, Order) {
    let order = Order {
        id: OrderId {
            sender,
            run: 7,
            seq: 1,
        },
        made_us: 5,
        payload: vec![1, 2, 3],
    };
    let mut body = BytesMut::new();
    encode_order_body(&order, &mut body);
    let p = Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: topic.into(),
        packet_id: Some(id(packet_id)),
        payload: body.freeze(),
    });
    (p, order)
}

#[test]
fn the_client_id_must_be_the_certificate_name() {
    let mut t = Pair::new();
    let mut c = t.conn(1, Some("dev-1"));
    let (out, r) = t.handle(&mut c, connect("dev-2", true, 0), 0.0);
    assert_eq!(out, [connack(ConnectReturnCode::IdentifierRejected, false)]);
    assert_eq!(
        r,
        Err(Close::Refused(ConnectReturnCode::IdentifierRejected))
    );
    c.closed(&mut t.broker, &r.unwrap_err());
    assert_eq!(t.counters.snapshot().refused_unknown, 1);

    let mut c = t.conn(2, Some("dev-1"));
    let (out, r) = t.handle(&mut c, connect("", true, 0), 0.0);
    assert_eq!(
        (out, r),
        (vec![connack(ConnectReturnCode::Accepted, false)], Ok(()))
    );
    assert_eq!(
        c.client_id(),
        Some("dev-1"),
        "an empty id takes the certificate's name"
    );

    // An empty id cannot have a persistent session [MQTT-3.1.3-8].
    let mut c = t.conn(3, Some("dev-3"));
    let (out, _) = t.handle(&mut c, connect("", false, 0), 0.0);
    assert_eq!(out, [connack(ConnectReturnCode::IdentifierRejected, false)]);

    // Without a certificate (plaintext listener) the id is taken as given.
    let mut c = t.conn(4, None);
    let (out, _) = t.handle(&mut c, connect("anyone", false, 0), 0.0);
    assert_eq!(out, [connack(ConnectReturnCode::Accepted, false)]);
}

#[test]
fn connect_must_come_first_and_only_once() {
    let mut t = Pair::new();
    let mut c = t.conn(1, Some("dev-1"));
    assert_eq!(
        t.handle(&mut c, Packet::PingReq, 0.0).1,
        Err(Close::NotConnect)
    );

    let mut watcher = t.conn(2, Some("w"));
    t.ok(&mut watcher, connect("w", true, 0), 0.0);
    t.ok(
        &mut watcher,
        Packet::Subscribe(Subscribe {
            packet_id: id(1),
            filters: vec![("lw".into(), QoS::AtMostOnce)],
        }),
        0.0,
    );

    let mut c = t.conn(3, Some("dev-1"));
    let with_will = Packet::Connect(Connect {
        clean_session: true,
        keep_alive: 0,
        client_id: "dev-1".into(),
        will: Some(LastWill {
            topic: "lw".into(),
            message: Bytes::from_static(b"x"),
            qos: QoS::AtMostOnce,
            retain: false,
        }),
        username: None,
        password: None,
    });
    assert_eq!(t.handle(&mut c, with_will, 0.0).1, Ok(()));
    let r = t.handle(&mut c, connect("dev-1", true, 0), 1.0).1;
    assert_eq!(r, Err(Close::SecondConnect));
    c.closed(&mut t.broker, &r.unwrap_err());
    assert_eq!(t.counters.snapshot().refused_malformed, 1);
    assert!(!t.broker.is_attached(ConnId(3)));
    let mut buf = BytesMut::new();
    assert_eq!(
        t.broker.poll_transmit(ConnId(2), &mut buf, usize::MAX),
        1,
        "the will went out"
    );
}

#[test]
fn another_protocol_level_gets_return_code_1() {
    let mut t = Pair::new();
    let mut c = t.conn(1, None);
    let mut out = Vec::new();
    let close = c.handle_decode_error(DecodeError::UnsupportedProtocolLevel(5), &mut out);
    assert_eq!(
        out,
        [connack(
            ConnectReturnCode::UnacceptableProtocolVersion,
            false
        )]
    );
    assert_eq!(
        close,
        Close::Refused(ConnectReturnCode::UnacceptableProtocolVersion)
    );
    let mut c = t.conn(2, None);
    t.ok(&mut c, connect("x", true, 0), 0.0);
    let mut out = Vec::new();
    assert!(matches!(
        c.handle_decode_error(DecodeError::UnsupportedProtocolLevel(5), &mut out),
        Close::Malformed(_)
    ));
    assert!(out.is_empty(), "after CONNECT it is just malformed");
    // Too large is refused from its header alone, and counted as oversized.
    let too_large = DecodeError::TooLarge {
        size: 2 << 20,
        max: 1 << 20,
    };
    let close = c.handle_decode_error(too_large, &mut out);
    c.closed(&mut t.broker, &close);
    assert_eq!(t.counters.snapshot().refused_oversized, 1);
}

#[test]
fn connect_timeout_and_keepalive_at_one_and_a_half_periods() {
    let mut t = Pair::new();
    let c = t.conn(1, Some("dev-1"));
    assert_eq!(c.deadline(), t.at(10.0));
    assert_eq!(c.handle_timeout(t.at(9.9)), None);
    assert_eq!(c.handle_timeout(t.at(10.0)), Some(Close::ConnectTimeout));
    // A client that never sent CONNECT is half-open: counted as timed out, not as malformed.
    let mut c = c;
    c.closed(&mut t.broker, &Close::ConnectTimeout);
    let n = t.counters.snapshot();
    assert_eq!((n.timed_out, n.refused()), (1, 0));

    let mut c = t.conn(2, Some("dev-1"));
    t.ok(&mut c, connect("dev-1", true, 10), 1.0);
    assert_eq!(c.deadline(), t.at(16.0));
    assert_eq!(c.handle_timeout(t.at(15.9)), None);
    let (out, _) = t.handle(&mut c, Packet::PingReq, 12.0);
    assert_eq!(out, [Action::Send(Packet::PingResp)]);
    assert_eq!(c.handle_timeout(t.at(26.9)), None);
    assert_eq!(c.handle_timeout(t.at(27.0)), Some(Close::KeepaliveExpired));

    let mut c = t.conn(3, Some("dev-3"));
    t.ok(&mut c, connect("dev-3", true, 0), 1.0);
    assert_eq!(
        c.deadline(),
        t.at(601.0),
        "keepalive 0: the broker's max_idle applies"
    );
    assert_eq!(c.handle_timeout(t.at(601.0)), Some(Close::KeepaliveExpired));

    // A keepalive whose 1.5 periods exceed max_idle is held to max_idle.
    let mut c = t.conn(4, Some("dev-4"));
    t.ok(&mut c, connect("dev-4", true, 65_535), 1.0);
    assert_eq!(c.deadline(), t.at(601.0));
}

#[test]
fn orders_are_committed_only_from_their_own_device() {
    let mut t = Pair::new();
    let mut c = t.conn(1, Some("dev-4"));
    t.ok(&mut c, connect("dev-4", false, 0), 0.0);
    let (p, order) = order_publish("orders/dev-4", 4, 9);
    let (out, r) = t.handle(&mut c, p, 0.1);
    assert_eq!(r, Ok(()));
    assert_eq!(
        out,
        [Action::Commit {
            order,
            ack: Some(Packet::PubAck(id(9)))
        }],
        "no PUBACK before the commit"
    );

    for (topic, sender, why) in [
        ("orders/dev-5", 5, OrderRefusal::WrongDevice),
        ("orders/dev-4", 5, OrderRefusal::WrongSender),
    ] {
        let (p, _) = order_publish(topic, sender, 1);
        assert_eq!(t.handle(&mut c, p, 0.2).1, Err(Close::OrderRefused(why)));
    }
    let bad = Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: "orders/dev-4".into(),
        packet_id: Some(id(2)),
        payload: Bytes::from_static(b"not an order"),
    });
    let r = t.handle(&mut c, bad, 0.3).1;
    assert_eq!(r, Err(Close::OrderRefused(OrderRefusal::Malformed)));
    c.closed(&mut t.broker, &r.unwrap_err());
    assert_eq!(t.counters.snapshot().refused_malformed, 1);
    assert_eq!(t.broker.stats().messages_received, 4);
}

/// Everything the broker would write to `conn` now, decoded.
fn written(t: &mut Pair, conn: u64) -> Vec<Packet> {
    let mut buf = BytesMut::new();
    t.broker.poll_transmit(ConnId(conn), &mut buf, usize::MAX);
    let mut out = Vec::new();
    while let Some(p) = read_packet(&mut buf, usize::MAX).unwrap() {
        out.push(p);
    }
    out
}

#[test]
fn a_qos2_publish_is_delivered_once_until_its_pubrel() {
    let mut t = Pair::new();
    let mut sub = t.conn(1, Some("s"));
    t.ok(&mut sub, connect("s", true, 0), 0.0);
    let subscribe = Packet::Subscribe(Subscribe {
        packet_id: id(1),
        filters: vec![("t".into(), QoS::ExactlyOnce)],
    });
    t.ok(&mut sub, subscribe, 0.0);
    let mut c = t.conn(2, Some("d"));
    t.ok(&mut c, connect("d", false, 0), 0.0);
    let q2 = |dup| {
        Packet::Publish(Publish {
            dup,
            qos: QoS::ExactlyOnce,
            retain: false,
            topic: "t".into(),
            packet_id: Some(id(5)),
            payload: Bytes::from_static(b"once"),
        })
    };
    assert_eq!(
        t.ok(&mut c, q2(false), 0.0),
        [Action::Send(Packet::PubRec(id(5)))]
    );
    // Sent again before the PUBREL (with or without DUP): acknowledged, not delivered again [MQTT-4.3.3-2].
    assert_eq!(
        t.ok(&mut c, q2(true), 0.1),
        [Action::Send(Packet::PubRec(id(5)))]
    );
    assert_eq!(
        t.ok(&mut c, q2(false), 0.1),
        [Action::Send(Packet::PubRec(id(5)))]
    );
    let got = written(&mut t, 1);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        t.ok(&mut c, Packet::PubRel(id(5)), 0.2),
        [Action::Send(Packet::PubComp(id(5)))]
    );
    // A PUBREL for an identifier not held is answered all the same.
    assert_eq!(
        t.ok(&mut c, Packet::PubRel(id(6)), 0.2),
        [Action::Send(Packet::PubComp(id(6)))]
    );
    // After PUBCOMP the identifier names a new message.
    t.ok(&mut c, q2(false), 0.3);
    assert_eq!(written(&mut t, 1).len(), 1);
}

#[test]
fn a_qos2_order_is_committed_before_pubrec_and_again_when_resent() {
    let mut t = Pair::new();
    let mut c = t.conn(1, Some("dev-4"));
    t.ok(&mut c, connect("dev-4", false, 0), 0.0);
    let (p, order) = order_publish("orders/dev-4", 4, 9);
    let Packet::Publish(mut p) = p else {
        unreachable!()
    };
    p.qos = QoS::ExactlyOnce;
    let commit = Action::Commit {
        order,
        ack: Some(Packet::PubRec(id(9))),
    };
    assert_eq!(
        t.ok(&mut c, Packet::Publish(p.clone()), 0.0),
        std::slice::from_ref(&commit)
    );
    p.dup = true;
    assert_eq!(t.ok(&mut c, Packet::Publish(p), 0.1), [commit]);
    assert_eq!(
        t.ok(&mut c, Packet::PubRel(id(9)), 0.2),
        [Action::Send(Packet::PubComp(id(9)))]
    );
}

#[test]
fn packets_only_a_server_sends_close_the_connection() {
    let mut t = Pair::new();
    let mut c = t.conn(1, Some("d"));
    t.ok(&mut c, connect("d", true, 0), 0.0);
    for p in [
        Packet::PingResp,
        Packet::UnsubAck(id(1)),
        Packet::ConnAck(ConnAck {
            session_present: false,
            code: ConnectReturnCode::Accepted,
        }),
    ] {
        let ty = p.packet_type();
        assert_eq!(t.handle(&mut c, p, 0.0).1, Err(Close::Unexpected(ty)));
    }
    assert_eq!(
        t.handle(&mut c, Packet::Disconnect, 0.0).1,
        Err(Close::Disconnect)
    );
    assert!(Close::Disconnect.graceful());
}

#[test]
fn publishes_are_acknowledged_and_dollar_topics_not_routed() {
    let mut t = Pair::new();
    let mut c = t.conn(1, Some("d"));
    t.ok(&mut c, connect("d", true, 0), 0.0);
    t.ok(
        &mut c,
        Packet::Subscribe(Subscribe {
            packet_id: id(1),
            filters: vec![("$SYS/#".into(), QoS::AtMostOnce)],
        }),
        0.0,
    );
    let p = |topic: &str, qos: QoS| {
        Packet::Publish(Publish {
            dup: false,
            qos,
            retain: false,
            topic: topic.into(),
            packet_id: (qos == QoS::AtLeastOnce).then(|| id(3)),
            payload: Bytes::from_static(b"x"),
        })
    };
    assert_eq!(
        t.handle(&mut c, p("$SYS/fake", QoS::AtLeastOnce), 0.0).0,
        [Action::Send(Packet::PubAck(id(3)))]
    );
    assert_eq!(t.handle(&mut c, p("a", QoS::AtMostOnce), 0.0).0, []);
    let mut buf = BytesMut::new();
    assert_eq!(
        t.broker.poll_transmit(ConnId(1), &mut buf, usize::MAX),
        0,
        "a client cannot publish into $SYS"
    );
}

#[test]
fn wills_obey_the_rules_a_publish_obeys() {
    let mut t = Pair::new();
    let deep = vec!["w"; topic::MAX_LEVELS + 1].join("/");
    for (n, topic) in [
        (1, "$SYS/broker/uptime"),
        (2, "orders/dev-1"),
        (3, deep.as_str()),
    ] {
        let mut c = t.conn(n, Some("dev-1"));
        let p = Packet::Connect(Connect {
            will: Some(LastWill {
                topic: topic.into(),
                message: Bytes::from_static(b"x"),
                qos: QoS::AtLeastOnce,
                retain: true,
            }),
            ..connect_packet_of("dev-1")
        });
        let (out, r) = t.handle(&mut c, p, 0.0);
        assert_eq!(
            out,
            [connack(ConnectReturnCode::NotAuthorized, false)],
            "{topic}"
        );
        assert_eq!(r, Err(Close::Refused(ConnectReturnCode::NotAuthorized)));
    }
    assert_eq!(t.broker.stats().sessions, 0);
}

#[test]
fn a_plaintext_client_cannot_place_orders_even_under_a_device_name() {
    let mut t = Pair::new();
    let mut c = t.conn(1, None);
    t.ok(&mut c, connect("dev-4", true, 0), 0.0);
    let (p, _) = order_publish("orders/dev-4", 4, 9);
    assert_eq!(
        t.handle(&mut c, p, 0.1).1,
        Err(Close::OrderRefused(OrderRefusal::Unverified))
    );
}

#[test]
fn deep_topics_and_huge_filter_lists_close_the_connection() {
    let mut t = Pair::new();
    let mut c = t.conn(1, Some("d"));
    t.ok(&mut c, connect("d", true, 0), 0.0);
    let deep = Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtMostOnce,
        retain: false,
        topic: vec!["x"; topic::MAX_LEVELS + 1].join("/"),
        packet_id: None,
        payload: Bytes::new(),
    });
    let r = t.handle(&mut c, deep, 0.0).1;
    assert_eq!(r, Err(Close::TopicTooDeep));
    c.closed(&mut t.broker, &r.unwrap_err());
    assert_eq!(t.counters.snapshot().refused_limit, 1);
    let many = vec![("a".to_string(), QoS::AtMostOnce); MAX_FILTERS_PER_PACKET + 1];
    let mut c = t.conn(2, Some("e"));
    t.ok(&mut c, connect("e", true, 0), 0.0);
    let at_cap = Packet::Subscribe(Subscribe {
        packet_id: id(1),
        filters: many[1..].to_vec(),
    });
    assert!(matches!(
        t.ok(&mut c, at_cap, 0.0)[..],
        [Action::Send(Packet::SubAck(_))]
    ));
    let over = Packet::Subscribe(Subscribe {
        packet_id: id(2),
        filters: many,
    });
    let r = t.handle(&mut c, over, 0.0).1;
    assert_eq!(r, Err(Close::TooManyFilters(MAX_FILTERS_PER_PACKET + 1)));
    c.closed(&mut t.broker, &r.unwrap_err());
    assert_eq!(t.counters.snapshot().refused_limit, 2);
}

#[test]
fn a_filter_past_the_level_cap_is_counted() {
    let mut t = Pair::new();
    let mut c = t.conn(1, Some("d"));
    t.ok(&mut c, connect("d", true, 0), 0.0);
    let deep = Packet::Subscribe(Subscribe {
        packet_id: id(1),
        filters: vec![
            (
                format!("{}#", "/".repeat(topic::MAX_LEVELS + 1)),
                QoS::AtMostOnce,
            ),
            ("fine/+".to_string(), QoS::AtMostOnce),
        ],
    });
    t.ok(&mut c, deep, 0.0);
    assert_eq!(
        t.counters.snapshot().refused_limit,
        1,
        "the deep filter only"
    );
}
