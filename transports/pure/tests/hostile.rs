//! Hostile input to the sans-IO receiver (and the answers to the device): forged senders, sessions taken over,
//! truncated and stretched records, oversized datagrams, floods of setups, low-order keys. Each test says which
//! rule of `docs/pure.md` ("What each hostile input does") it holds to.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use transport_core::{Counters, Order, OrderId, QoS};
use transport_pure::crypto::{
    check_public, link_secret, put_record, LowOrderKey, NodeKey, WireKeys,
};
use transport_pure::receiver::{Reply, MAX_SETUPS_PER_DATAGRAM};
use transport_pure::sender::{Sender, SenderEvent};
use transport_pure::wire::{self, KeyId, Kind, Op, MADE_LEN, MAX_DATAGRAM, TAG_LEN};

mod common;
use common::{Keys, Net, CHANNEL};

const ALL: [Kind; 4] = [
    Kind::Plain,
    Kind::HpkeSession,
    Kind::HpkePerRequest,
    Kind::Link,
];

fn from() -> SocketAddr {
    "10.0.0.1:5000".parse().unwrap()
}

fn order(sender: u64, run: u64, seq: u64, payload_len: usize) -> Order {
    Order {
        id: OrderId { sender, run, seq },
        made_us: seq,
        payload: vec![seq as u8; payload_len],
    }
}

/// The datagram a device sends for one order.
fn sealed_by(sender: &mut Sender, o: Order) -> Vec<u8> {
    let now = Instant::now();
    sender.push(now, o);
    let mut buf = Vec::new();
    assert!(sender.poll_transmit(now, &mut buf));
    buf
}

/// Seal one record by hand: whatever key id, run and number the sealer chooses, under keys it holds.
fn seal(
    kind: Kind,
    keys: &WireKeys,
    key_id: &KeyId,
    run: u64,
    seq: u64,
    variant: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    let mut out = Vec::new();
    let head = wire::Head {
        kind,
        op: Op::Order,
        key_id,
        run,
        number: seq,
        variant,
    };
    put_record(&mut out, &head, Some(keys), &seq.to_be_bytes(), payload);
    out
}

#[test]
fn an_hpke_session_opens_only_for_the_sender_that_set_it_up() {
    let mut rng = StdRng::seed_from_u64(21);
    let keys = Keys::new(2, &mut rng);
    let counters = Arc::new(Counters::default());
    let mut r = keys.receiver(Kind::HpkeSession, 1, 16, &counters);
    let (victim, attacker) = (&keys.devices[0], &keys.devices[1]);
    // The attacker is an allowed device: it sets up a session of its own and sends one honest record.
    let (enc, session) = WireKeys::hpke_sender(&mut rng, attacker, keys.node.public());
    let honest = seal(
        Kind::HpkeSession,
        &session,
        &attacker.key_id(),
        77,
        0,
        &enc,
        b"mine",
    );
    r.handle(Instant::now(), from(), &honest);
    let (orders, _) = r.take_deliveries();
    assert_eq!(orders.len(), 1);
    assert_eq!(
        orders[0].id.sender, 1,
        "the attacker's own order, as its own"
    );
    // Then it seals, under its own session, records that name the victim, the victim's run and numbers.
    for seq in 0..5 {
        let forged = seal(
            Kind::HpkeSession,
            &session,
            &victim.key_id(),
            5,
            seq,
            &enc,
            b"an order the victim never made",
        );
        r.handle(Instant::now(), from(), &forged);
    }
    let (orders, replies) = r.take_deliveries();
    assert!(
        orders.is_empty() && replies.is_empty(),
        "applied as the victim's orders: {:?}",
        orders.iter().map(|o| o.id).collect::<Vec<_>>()
    );
    let c = counters.snapshot();
    assert_eq!(c.refused_forged, 5);
    assert_eq!(
        c.x25519, 2,
        "one setup (the attacker's); a mismatch costs none"
    );
    // The victim's own session still opens, under its own name.
    let mut device = keys.sender(Kind::HpkeSession, 0, 3, &Arc::new(Counters::default()));
    r.handle(
        Instant::now(),
        from(),
        &sealed_by(&mut device, order(0, 5, 0, 16)),
    );
    let (orders, _) = r.take_deliveries();
    assert_eq!(orders.iter().map(|o| o.id.sender).collect::<Vec<_>>(), [0]);
}

#[test]
fn a_forger_copying_a_devices_enc_cannot_take_its_session_or_shut_it_out() {
    let mut rng = StdRng::seed_from_u64(22);
    let keys = Keys::new(2, &mut rng);
    let counters = Arc::new(Counters::default());
    let mut r = keys.receiver(Kind::HpkeSession, 1, 16, &counters);
    let mut device = keys.sender(Kind::HpkeSession, 0, 4, &Arc::new(Counters::default()));
    let first = sealed_by(&mut device, order(0, 5, 0, 16));
    // Before the device's record arrives, an allowed forger sends the device's enc under its own name (it cannot
    // know the session's keys: the tag is noise), twice.
    let attacker = keys.devices[1].key_id();
    let mut forged = first.clone();
    forged[2..10].copy_from_slice(&attacker);
    r.handle(Instant::now(), from(), &forged);
    r.handle(Instant::now(), from(), &forged);
    assert!(r.take_deliveries().0.is_empty());
    let c = counters.snapshot();
    assert_eq!(c.refused_forged, 2);
    assert_eq!(c.x25519, 2, "the repeated forgery costs no X25519");
    // The device's own record with that enc still opens: what was remembered is the forger's setup, not a
    // verdict on the enc.
    r.handle(Instant::now(), from(), &first);
    assert_eq!(r.take_deliveries().0.len(), 1);
    assert_eq!(counters.snapshot().x25519, 4);
    // And once the session is the device's, the forger's copy is refused without any setup.
    r.handle(Instant::now(), from(), &forged);
    assert!(r.take_deliveries().0.is_empty());
    assert_eq!(counters.snapshot().refused_forged, 3);
    assert_eq!(counters.snapshot().x25519, 4);
}

/// A device's datagram for one order with `payload_len` bytes, and the device (to feed answers to).
fn record_of(kind: Kind, keys: &Keys, payload_len: usize, seq: u64) -> (Sender, Vec<u8>) {
    let mut device = keys.records_sender(kind, 0, 7, &Arc::new(Counters::default()));
    let d = sealed_by(&mut device, order(0, 9, seq, payload_len));
    (device, d)
}

#[test]
fn every_record_and_answer_cut_at_every_length_is_malformed_never_a_panic() {
    for kind in ALL {
        let mut rng = StdRng::seed_from_u64(23);
        let keys = Keys::new(1, &mut rng);
        let counters = Arc::new(Counters::default());
        let mut r = keys.receiver(kind, 1, 16, &counters);
        for payload_len in [0, 1, 7, 8, 9, 64, 300] {
            let (mut device, d) = record_of(kind, &keys, payload_len, 0);
            for len in 0..d.len() {
                let before = counters.snapshot();
                r.handle(Instant::now(), from(), &d[..len]);
                let c = counters.snapshot().since(&before);
                assert_eq!(
                    (c.refused_malformed, c.refused()),
                    (1, 1),
                    "{kind:?}: a {payload_len}-byte order cut at {len} of {}",
                    d.len()
                );
                assert!(r.take_deliveries().0.is_empty());
            }
            // Whole, it opens; and its answer, cut at every length, is malformed at the device.
            r.handle(Instant::now(), from(), &d);
            let (orders, replies) = r.take_deliveries();
            assert_eq!(orders.len(), 1, "{kind:?}");
            assert_eq!(orders[0].payload.len(), payload_len);
            r.answer(replies[0].clone());
            let mut answer = Vec::new();
            r.poll_transmit(Instant::now(), &mut answer).unwrap();
            let device_counters = Arc::new(Counters::default());
            for len in 0..answer.len() {
                let mut cut = keys.sender(kind, 0, 7, &device_counters);
                sealed_by(&mut cut, order(0, 9, 0, payload_len));
                cut.handle(Instant::now(), &answer[..len]);
                assert_eq!(cut.poll_event(), None, "{kind:?}: answer cut at {len}");
            }
            device.handle(Instant::now(), &answer);
            assert!(matches!(device.poll_event(), Some(SenderEvent::Stored(_))));
        }
    }
}

/// `d` cut at every length, sent to the receiver: each a malformed datagram, refused whole, nothing answered.
fn cut_at_every_length_is_malformed(net: &mut Net, from: SocketAddr, d: &[u8], what: &str) {
    for len in 0..d.len() {
        let before = net.counters.snapshot();
        net.receiver.handle(net.now, from, &d[..len]);
        let c = net.counters.snapshot().since(&before);
        assert_eq!(
            (c.refused_malformed, c.refused()),
            (1, 1),
            "{what} cut at {len} of {}",
            d.len()
        );
        assert!(!net.receiver.has_output(), "{what} cut at {len}: answered");
    }
}

/// `d` cut at every length, given to device `i`: nothing reported.
fn cut_reports_nothing(net: &mut Net, i: usize, d: &[u8], what: &str) {
    for len in 0..d.len() {
        net.devices[i].handle(net.now, &d[..len]);
        assert_eq!(net.devices[i].poll_event(), None, "{what} cut at {len}");
    }
}

#[test]
fn every_subscribe_publish_delivery_and_answer_cut_at_every_length_is_malformed_never_a_panic() {
    for kind in ALL {
        let mut rng = StdRng::seed_from_u64(40);
        let keys = Keys::new(2, &mut rng);
        let mut net = Net::new(&keys, kind, 2);
        let what = |w: &str| format!("{kind:?} {w}");
        // A subscribe that the receiver takes whole.
        let subscribe = net.subscribe(0, QoS::AtLeastOnce);
        cut_at_every_length_is_malformed(&mut net, Net::addr(0), &subscribe, &what("subscribe"));
        // Device 1 learns the receiver's run, then publishes at each QoS.
        let payload = transport_pure::client::payload(9, 8);
        net.devices[1]
            .publish(net.now, CHANNEL, 9, QoS::AtLeastOnce, payload)
            .unwrap();
        net.pump();
        for (id, qos) in [(10, QoS::AtLeastOnce), (11, QoS::AtMostOnce)] {
            let publish = net.publish_only(1, id, qos);
            cut_at_every_length_is_malformed(&mut net, Net::addr(1), &publish, &what("publish"));
            net.receiver.handle(net.now, Net::addr(1), &publish);
            let out = net.receiver_output();
            if qos == QoS::AtLeastOnce {
                let answer = &out.iter().find(|(to, _)| *to == Some(1)).unwrap().1;
                cut_reports_nothing(&mut net, 1, answer, &what("publish answer"));
                net.devices[1].handle(net.now, answer);
                assert_eq!(net.devices[1].poll_event(), Some(SenderEvent::Accepted(id)));
            }
            let delivery = out.iter().find(|(to, _)| *to == Some(0)).unwrap().1.clone();
            cut_reports_nothing(&mut net, 0, &delivery, &what("delivery"));
            net.devices[0].handle(net.now, &delivery);
            assert_eq!(
                net.devices[0].poll_event(),
                Some(SenderEvent::Delivered {
                    channel: CHANNEL,
                    id
                }),
                "{kind:?}: whole, it is delivered"
            );
            if qos == QoS::AtLeastOnce {
                let mut answer = Vec::new();
                assert!(net.devices[0].poll_transmit(net.now, &mut answer));
                cut_at_every_length_is_malformed(
                    &mut net,
                    Net::addr(0),
                    &answer,
                    &what("delivery answer"),
                );
                assert_eq!(net.receiver.relay().held(), 1);
                net.receiver.handle(net.now, Net::addr(0), &answer);
                assert_eq!(
                    net.receiver.relay().held(),
                    0,
                    "{kind:?}: whole, it is taken"
                );
            }
        }
        // The answer to a subscribe, cut, at a device subscribing again.
        net.devices[0].subscribe(net.now, CHANNEL + 1, QoS::AtMostOnce);
        let mut sub = Vec::new();
        assert!(net.devices[0].poll_transmit(net.now, &mut sub));
        net.receiver.handle(net.now, Net::addr(0), &sub);
        let answer = net.receiver_output().remove(0).1;
        cut_reports_nothing(&mut net, 0, &answer, &what("subscribe answer"));
        net.devices[0].handle(net.now, &answer);
        assert_eq!(
            net.devices[0].poll_event(),
            Some(SenderEvent::Subscribed(CHANNEL + 1))
        );
        assert_eq!(net.counters.snapshot().refused_forged, 0);
    }
}

#[test]
fn every_length_a_record_can_claim_is_checked_before_use() {
    for kind in ALL {
        let mut rng = StdRng::seed_from_u64(24);
        let keys = Keys::new(1, &mut rng);
        let counters = Arc::new(Counters::default());
        let mut r = keys.receiver(kind, 1, 16, &counters);
        let (_, d) = record_of(kind, &keys, 64, 0);
        let header_len = kind.record_header_len(Op::Order);
        let body_len = d.len() - header_len;
        let min_body = MADE_LEN + if kind.sealed() { TAG_LEN } else { 0 };
        let claims = (0..=min_body + 1)
            .chain([body_len - 1, body_len, body_len + 1])
            .chain([0x7fff, 0xfffe, 0xffff]);
        for claimed in claims {
            // The length field claims `claimed` bytes; the datagram holds that many (as far as it has them), or
            // all it had.
            for end in [header_len + claimed.min(body_len), d.len()] {
                let mut x = d[..end].to_vec();
                x[header_len - 2..header_len].copy_from_slice(&(claimed as u16).to_be_bytes());
                let before = counters.snapshot();
                r.handle(Instant::now(), from(), &x);
                let c = counters.snapshot().since(&before);
                let orders = r.take_deliveries().0;
                let what = format!("{kind:?} claims {claimed}, ends at {end}: {c:?}");
                // Whether the first frame is whole, and whether bytes follow it.
                let whole = claimed >= min_body && header_len + claimed <= end;
                if !whole {
                    assert!(orders.is_empty(), "{what}");
                    assert_eq!((c.refused_malformed, c.refused()), (1, 1), "{what}");
                } else if kind == Kind::Plain {
                    // Plain records are not sealed: a consistent shorter length is a shorter order.
                    assert_eq!(orders.len(), 1, "{what}");
                    assert_eq!(orders[0].payload.len(), claimed - MADE_LEN);
                } else if claimed == body_len {
                    assert_eq!(orders.len(), 1, "{what}");
                } else {
                    assert!(orders.is_empty(), "{what}");
                    assert_eq!(c.refused_forged, 1, "{what}");
                }
                if whole && header_len + claimed < end {
                    assert!(c.refused() >= 1, "the bytes after the frame: {what}");
                }
            }
        }
        // Every header byte set to each extreme: refused or (plain, or the byte already had that value) taken,
        // never a panic, and a sealed record with a changed header never opens.
        for at in 0..header_len {
            for v in [0x00, 0x01, 0x7f, 0x80, 0xfe, 0xff] {
                let mut x = d.clone();
                if x[at] == v {
                    continue;
                }
                x[at] = v;
                r.handle(Instant::now(), from(), &x);
                let orders = r.take_deliveries().0;
                if kind.sealed() {
                    assert!(orders.is_empty(), "{kind:?}: byte {at} set to {v:#x}");
                }
            }
        }
    }
}

#[test]
fn every_length_a_subscribe_or_publish_can_claim_is_checked_before_use() {
    for kind in ALL {
        let mut rng = StdRng::seed_from_u64(41);
        let keys = Keys::new(2, &mut rng);
        let mut net = Net::new(&keys, kind, 2);
        let subscribe = net.subscribe(0, QoS::AtLeastOnce);
        let payload = transport_pure::client::payload(9, 8);
        net.devices[1]
            .publish(net.now, CHANNEL, 9, QoS::AtLeastOnce, payload)
            .unwrap();
        net.pump();
        let publish1 = net.publish_only(1, 20, QoS::AtLeastOnce);
        let publish0 = net.publish_only(1, 21, QoS::AtMostOnce);
        for (d, op, from) in [
            (subscribe, Op::Subscribe, 0),
            (publish1, Op::Publish1, 1),
            (publish0, Op::Publish0, 1),
        ] {
            let header_len = kind.record_header_len(op);
            let body_len = d.len() - header_len;
            let min_body = kind.min_body_len(op);
            let claims = (0..=min_body + 1)
                .chain([body_len - 1, body_len, body_len + 1])
                .chain([0x7fff, 0xfffe, 0xffff]);
            for claimed in claims {
                for end in [header_len + claimed.min(body_len), d.len()] {
                    let mut x = d[..end].to_vec();
                    x[header_len - 2..header_len].copy_from_slice(&(claimed as u16).to_be_bytes());
                    let before = net.counters.snapshot();
                    net.receiver.handle(net.now, Net::addr(from), &x);
                    let _ = net.receiver_output();
                    let c = net.counters.snapshot().since(&before);
                    let what = format!("{kind:?} {op:?} claims {claimed}, ends at {end}: {c:?}");
                    let whole = claimed >= min_body && header_len + claimed <= end;
                    if !whole {
                        assert_eq!((c.refused_malformed, c.refused()), (1, 1), "{what}");
                    } else if kind.sealed() && claimed != body_len {
                        assert_eq!(c.refused_forged, 1, "{what}");
                    } else if claimed == body_len && end == d.len() {
                        assert_eq!(c.refused(), 0, "{what}: the original is taken");
                    }
                }
            }
        }
    }
}

#[test]
fn a_datagram_over_the_maximum_is_refused_whole_unread() {
    for kind in ALL {
        let mut rng = StdRng::seed_from_u64(25);
        let keys = Keys::new(1, &mut rng);
        let counters = Arc::new(Counters::default());
        let mut r = keys.receiver(kind, 1, 16, &counters);
        let (_, d) = record_of(kind, &keys, 64, 0);
        // The same record repeated up to the maximum is taken (a replay, each copy answered)...
        let fit = MAX_DATAGRAM / d.len();
        let full: Vec<u8> = d.repeat(fit);
        r.handle(Instant::now(), from(), &full);
        assert_eq!(r.take_deliveries().0.len(), fit, "{kind:?}");
        // ... one byte more and the datagram is refused before any of it is read.
        let mut over = full.clone();
        over.resize(MAX_DATAGRAM + 1, 0);
        let before = counters.snapshot();
        r.handle(Instant::now(), from(), &over);
        let c = counters.snapshot().since(&before);
        assert!(r.take_deliveries().0.is_empty());
        assert_eq!(
            (c.refused_oversized, c.received, c.x25519, c.refused()),
            (1, 0, 0, 1)
        );
        let huge = d.repeat(65_000 / d.len());
        r.handle(Instant::now(), from(), &huge);
        assert!(r.take_deliveries().0.is_empty());
        assert_eq!(counters.snapshot().since(&before).refused_oversized, 2);
        // An empty datagram is malformed.
        r.handle(Instant::now(), from(), &[]);
        assert_eq!(counters.snapshot().since(&before).refused_malformed, 1);
    }
}

#[test]
fn forged_setups_cost_one_setup_per_datagram_and_none_when_repeated() {
    for kind in [Kind::HpkeSession, Kind::HpkePerRequest] {
        let mut rng = StdRng::seed_from_u64(26);
        let keys = Keys::new(4, &mut rng);
        let counters = Arc::new(Counters::default());
        let mut r = keys.receiver(kind, 1, 16, &counters);
        // A datagram packed with records naming allowed devices, each with a fresh enc and a tag of noise.
        let mut datagram = Vec::new();
        let mut records = 0;
        loop {
            let mut enc = [0u8; 32];
            rng.fill(&mut enc[..]);
            let key_id = keys.devices[records % 4].key_id();
            let body: Vec<u8> = (0..MADE_LEN + 8 + TAG_LEN).map(|_| rng.random()).collect();
            let mut frame = Vec::new();
            wire::put_record_header(&mut frame, kind, Op::Order, &key_id, 3, 0, &enc, body.len());
            frame.extend_from_slice(&body);
            if datagram.len() + frame.len() > MAX_DATAGRAM {
                break;
            }
            datagram.extend_from_slice(&frame);
            records += 1;
        }
        assert!(records >= 10, "{records} records fit");
        r.handle(Instant::now(), from(), &datagram);
        let c = counters.snapshot();
        assert!(r.take_deliveries().0.is_empty());
        assert_eq!(
            c.refused_forged, records as u64,
            "{kind:?}: every record refused"
        );
        assert_eq!(
            c.x25519, 2,
            "{kind:?}: the first failed setup ends the datagram's setups"
        );
        // The same forgery again costs no X25519 at all.
        r.handle(Instant::now(), from(), &datagram);
        let c = counters.snapshot();
        assert_eq!(c.refused_forged, 2 * records as u64);
        assert_eq!(c.x25519, 2, "{kind:?}: a failed enc is remembered");
        // Honest records of a device still open meanwhile.
        let (_, d) = record_of(kind, &keys, 64, 0);
        r.handle(Instant::now(), from(), &d);
        assert_eq!(r.take_deliveries().0.len(), 1);
    }
}

#[test]
fn a_full_datagram_of_honest_setups_stays_within_the_cap_and_a_forgery_after_them_ends_it() {
    let mut rng = StdRng::seed_from_u64(30);
    let keys = Keys::new(2, &mut rng);
    let counters = Arc::new(Counters::default());
    let mut r = keys.receiver(Kind::HpkePerRequest, 1, 16, &counters);
    // A device's datagram as full as it packs it: per-request records with the smallest payload, a setup each.
    let mut device = keys.sender(Kind::HpkePerRequest, 0, 8, &Arc::new(Counters::default()));
    let now = Instant::now();
    for seq in 0..64 {
        device.push(now, order(0, 9, seq, 0));
    }
    let mut datagram = Vec::new();
    assert!(device.poll_transmit(now, &mut datagram));
    assert!(datagram.len() <= MAX_DATAGRAM);
    r.handle(now, from(), &datagram);
    let honest = r.take_deliveries().0.len();
    assert!(
        (2..=MAX_SETUPS_PER_DATAGRAM).contains(&honest),
        "{honest} records in one datagram, the cap is {MAX_SETUPS_PER_DATAGRAM}"
    );
    assert_eq!(counters.snapshot().x25519, 2 * honest as u64);
    // The same honest records followed by forgeries in other devices' names: the first forgery ends the datagram's
    // setups, whatever room is left under the cap.
    let (_, mut mixed) = record_of(Kind::HpkePerRequest, &keys, 0, 0);
    let before = counters.snapshot();
    for _ in 0..3 {
        let mut enc = [0u8; 32];
        rng.fill(&mut enc[..]);
        let body: Vec<u8> = (0..MADE_LEN + TAG_LEN).map(|_| rng.random()).collect();
        let key_id = keys.devices[1].key_id();
        wire::put_record_header(
            &mut mixed,
            Kind::HpkePerRequest,
            Op::Order,
            &key_id,
            3,
            0,
            &enc,
            body.len(),
        );
        mixed.extend_from_slice(&body);
    }
    r.handle(now, from(), &mixed);
    assert_eq!(r.take_deliveries().0.len(), 1, "the honest record opens");
    let c = counters.snapshot().since(&before);
    assert_eq!(
        (c.refused_forged, c.x25519),
        (3, 4),
        "one honest setup, one forged, then none"
    );
}

/// The points of small order on Curve25519 and its twist, as encoded u-coordinates (RFC 7748 section 6.1;
/// the list libsodium refuses): 0, 1, the two points of order 8, p-1, p and p+1, each also with the top bit set
/// (X25519 ignores it).
fn low_order_points() -> Vec<[u8; 32]> {
    let order8a = "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800";
    let order8b = "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157";
    let mut out = Vec::new();
    let mut p = [0xff; 32];
    p[0] = 0xed;
    p[31] = 0x7f;
    for base in [
        [0u8; 32],
        {
            let mut one = [0u8; 32];
            one[0] = 1;
            one
        },
        hex::decode(order8a).unwrap().try_into().unwrap(),
        hex::decode(order8b).unwrap().try_into().unwrap(),
        {
            let mut x = p;
            x[0] = 0xec;
            x
        },
        p,
        {
            let mut x = p;
            x[0] = 0xee;
            x
        },
    ] {
        out.push(base);
        let mut high = base;
        high[31] |= 0x80;
        out.push(high);
    }
    out
}

#[test]
fn keys_of_small_order_are_refused_by_the_table_and_by_the_zero_check() {
    // Each of them makes X25519 give the all-zero value with any secret: `agree` refuses that result, and the
    // table refuses the key before any X25519 is spent on it.
    let mut rng = StdRng::seed_from_u64(27);
    let key = NodeKey::generate(&mut rng);
    for point in low_order_points() {
        assert_eq!(
            key.agree(&point),
            Err(LowOrderKey),
            "{}",
            hex::encode(point)
        );
        assert_eq!(
            check_public(&point),
            Err(LowOrderKey),
            "{}",
            hex::encode(point)
        );
        assert!(link_secret(&key, &point, &point, key.public()).is_err());
    }
    // Real keys pass both.
    for _ in 0..200 {
        let other = NodeKey::generate(&mut rng);
        assert_eq!(check_public(other.public()), Ok(()));
        assert!(key.agree(other.public()).is_ok());
    }
}

#[test]
fn an_enc_of_small_order_is_refused_before_any_x25519() {
    for kind in [Kind::HpkeSession, Kind::HpkePerRequest] {
        let mut rng = StdRng::seed_from_u64(28);
        let keys = Keys::new(1, &mut rng);
        let counters = Arc::new(Counters::default());
        let mut r = keys.receiver(kind, 1, 16, &counters);
        let (_, d) = record_of(kind, &keys, 16, 0);
        let enc_at = wire::COMMON_LEN;
        for point in low_order_points() {
            let mut x = d.clone();
            x[enc_at..enc_at + 32].copy_from_slice(&point);
            r.handle(Instant::now(), from(), &x);
            r.handle(Instant::now(), from(), &x);
        }
        assert!(r.take_deliveries().0.is_empty());
        let c = counters.snapshot();
        assert_eq!(c.refused_forged, 2 * low_order_points().len() as u64);
        assert_eq!(c.x25519, 0, "{kind:?}: refused before any X25519");
    }
}

#[test]
fn the_keys_a_receiver_keeps_are_bounded_and_an_evicted_wire_only_costs_recomputation() {
    for kind in [Kind::Link, Kind::HpkeSession] {
        let mut rng = StdRng::seed_from_u64(29);
        let keys = Keys::new(1, &mut rng);
        let counters = Arc::new(Counters::default());
        let device_counters = Arc::new(Counters::default());
        let mut r = keys.receiver(kind, 1, 16, &counters);
        // One allowed device starting run after run (restarting, or making runs up): a wire each.
        let first = sealed_by(
            &mut keys.sender(kind, 0, 1, &device_counters),
            order(0, 1, 0, 8),
        );
        r.handle(Instant::now(), from(), &first);
        assert_eq!(r.take_deliveries().0.len(), 1);
        for run in 2..300 {
            let mut device = keys.sender(kind, 0, run, &device_counters);
            r.handle(
                Instant::now(),
                from(),
                &sealed_by(&mut device, order(0, run, 0, 8)),
            );
            assert_eq!(r.take_deliveries().0.len(), 1, "{kind:?} run {run}");
            assert!(r.cached_wires() <= 16, "{kind:?}: {}", r.cached_wires());
        }
        // The first run comes back after it was forgotten: it opens again, for one derivation.
        let before = counters.snapshot();
        r.handle(Instant::now(), from(), &first);
        assert_eq!(r.take_deliveries().0.len(), 1);
        let c = counters.snapshot().since(&before);
        assert_eq!(c.key_derivations, 1, "{kind:?}");
        let setup = if kind == Kind::Link { 0 } else { 2 };
        assert_eq!(
            c.x25519, setup,
            "{kind:?}: the link secret is kept per sender"
        );
    }
}

/// Seal a bundle by hand: the given entries under whatever key id, run and number the sealer chooses.
fn seal_bundle(
    keys: &WireKeys,
    key_id: &KeyId,
    run: u64,
    number: u64,
    variant: &[u8],
    entries: &[u8],
) -> Vec<u8> {
    let mut out = Vec::new();
    let head = wire::Head {
        kind: Kind::Link,
        op: Op::Bundle,
        key_id,
        run,
        number,
        variant,
    };
    put_record(&mut out, &head, Some(keys), &[], entries);
    out
}

/// A bundle is one seal (docs/pure.md, "Bundles"): cut anywhere it is malformed, changed anywhere (sealed kinds)
/// it does not open, and either way none of its orders is taken; whole, all are, once each by id however often it
/// comes, and they are answered in answer bundles no larger than the bundle. At the device, an answer bundle cut or
/// changed anywhere reports nothing stored.
#[test]
fn a_bundle_is_taken_whole_or_not_at_all_and_so_is_its_answer() {
    for kind in [Kind::Plain, Kind::HpkeSession, Kind::Link] {
        let mut rng = StdRng::seed_from_u64(31);
        let keys = Keys::new(2, &mut rng);
        let counters = Arc::new(Counters::default());
        let mut r = keys.receiver(kind, 1, 16, &counters);
        let device_counters = Arc::new(Counters::default());
        let mut device = keys.sender(kind, 0, 8, &device_counters);
        let now = Instant::now();
        for seq in 0..5 {
            device.push(now, order(0, 9, seq, 20));
        }
        let mut d = Vec::new();
        assert!(device.poll_transmit(now, &mut d));
        let (frame, used) = wire::parse_frame(&d).unwrap();
        assert!(
            matches!(frame, wire::Frame::Record(b) if b.op == Op::Bundle),
            "{kind:?}"
        );
        assert_eq!(used, d.len(), "{kind:?}: one bundle carries the five");
        for len in 0..d.len() {
            let before = counters.snapshot();
            r.handle(now, from(), &d[..len]);
            let c = counters.snapshot().since(&before);
            assert_eq!(
                (c.refused_malformed, c.refused()),
                (1, 1),
                "{kind:?} cut at {len}"
            );
            assert!(r.take_deliveries().0.is_empty(), "{kind:?} cut at {len}");
        }
        if kind.sealed() {
            for at in 0..d.len() {
                let mut x = d.clone();
                x[at] ^= 0x41;
                let before = counters.snapshot();
                r.handle(now, from(), &x);
                let c = counters.snapshot().since(&before);
                // One refusal, or two where a changed length leaves bytes after the frame.
                assert!(
                    (1..=2).contains(&c.refused()),
                    "{kind:?}: byte {at} changed: {c:?}"
                );
                assert!(
                    r.take_deliveries().0.is_empty(),
                    "{kind:?}: byte {at} changed"
                );
            }
        }
        // Whole, twice: five orders each time (the store applies an id once), each answered.
        for _ in 0..2 {
            r.handle(now, from(), &d);
        }
        let (orders, replies) = r.take_deliveries();
        let seqs: Vec<u64> = orders.iter().map(|o| o.id.seq).collect();
        assert_eq!(seqs, [0, 1, 2, 3, 4, 0, 1, 2, 3, 4], "{kind:?}");
        assert!(orders.iter().all(|o| o.payload == vec![o.id.seq as u8; 20]));
        // One reply per bundle, for its five orders; the first bundle's is answered.
        assert_eq!(
            replies.iter().map(Reply::orders).collect::<Vec<_>>(),
            [5, 5],
            "{kind:?}"
        );
        r.answer(replies[0].clone());
        let mut answer = Vec::new();
        assert_eq!(r.poll_transmit(now, &mut answer), Some(from()));
        assert!(
            r.poll_transmit(now, &mut Vec::new()).is_none(),
            "one datagram"
        );
        assert!(answer.len() < d.len(), "{kind:?}: no amplification");
        let Ok((wire::Frame::AnswerBundle(b), used)) = wire::parse_frame(&answer) else {
            panic!("{kind:?}: an answer bundle")
        };
        assert_eq!(
            (used, b.seqs().collect::<Vec<_>>()),
            (answer.len(), vec![0, 1, 2, 3, 4])
        );
        // At the device: cut, changed, then whole.
        for len in 0..answer.len() {
            device.handle(now, &answer[..len]);
            assert_eq!(device.poll_event(), None, "{kind:?}: answer cut at {len}");
        }
        if kind.sealed() {
            for at in 0..answer.len() {
                let mut x = answer.clone();
                x[at] ^= 0x41;
                device.handle(now, &x);
                assert_eq!(
                    device.poll_event(),
                    None,
                    "{kind:?}: answer byte {at} changed"
                );
            }
        }
        device.handle(now, &answer);
        let stored: Vec<_> = std::iter::from_fn(|| device.poll_event()).collect();
        assert_eq!(stored.len(), 5, "{kind:?}: {stored:?}");
        assert_eq!(device.pending(), 0);
        // The same answer again reports nothing more.
        device.handle(now, &answer);
        assert_eq!(device.poll_event(), None);
    }
}

/// A bundle's orders share one reply; the replies of a wire's bundles answered before a send go out together in one
/// answer bundle, in the order they were stored, and a bundle answered after that send in an answer bundle of its
/// own. Every answer bundle is one the device accepts (sealed kinds: tagged with the wire's answer key).
#[test]
fn a_wires_bundles_are_answered_together_until_a_send() {
    for kind in [Kind::Plain, Kind::HpkeSession, Kind::Link] {
        let mut rng = StdRng::seed_from_u64(33);
        let keys = Keys::new(1, &mut rng);
        let counters = Arc::new(Counters::default());
        let mut r = keys.receiver(kind, 1, 16, &counters);
        let mut device = keys.sender(kind, 0, 64, &Arc::new(Counters::default()));
        let now = Instant::now();
        let bundle = |device: &mut Sender, seqs: std::ops::Range<u64>| {
            for seq in seqs {
                device.push(now, order(0, 9, seq, 20));
            }
            let mut d = Vec::new();
            assert!(device.poll_transmit(now, &mut d), "{kind:?}");
            d
        };
        let (first, second) = (bundle(&mut device, 0..5), bundle(&mut device, 5..8));
        r.handle(now, from(), &first);
        r.handle(now, from(), &second);
        let (orders, replies) = r.take_deliveries();
        assert_eq!(orders.len(), 8, "{kind:?}");
        assert_eq!(
            replies.iter().map(Reply::orders).collect::<Vec<_>>(),
            [5, 3],
            "{kind:?}"
        );
        for reply in replies {
            r.answer(reply);
        }
        let answered = |r: &mut transport_pure::receiver::Receiver, device: &mut Sender| {
            let mut answer = Vec::new();
            assert_eq!(r.poll_transmit(now, &mut answer), Some(from()), "{kind:?}");
            assert!(r.poll_transmit(now, &mut Vec::new()).is_none(), "{kind:?}");
            let Ok((wire::Frame::AnswerBundle(b), used)) = wire::parse_frame(&answer) else {
                panic!("{kind:?}: one answer bundle")
            };
            assert_eq!(used, answer.len(), "{kind:?}");
            let seqs: Vec<u64> = b.seqs().collect();
            device.handle(now, &answer);
            let stored = std::iter::from_fn(|| device.poll_event()).count();
            assert_eq!(
                stored,
                seqs.len(),
                "{kind:?}: the device takes every answer"
            );
            seqs
        };
        assert_eq!(answered(&mut r, &mut device), [0, 1, 2, 3, 4, 5, 6, 7]);
        // After the send, the next bundle of the wire starts a list of its own.
        let third = bundle(&mut device, 8..10);
        r.handle(now, from(), &third);
        let (orders, replies) = r.take_deliveries();
        assert_eq!((orders.len(), replies.len()), (2, 1), "{kind:?}");
        for reply in replies {
            r.answer(reply);
        }
        assert_eq!(answered(&mut r, &mut device), [8, 9]);
        assert_eq!(device.pending(), 0, "{kind:?}");
    }
}

/// A bundle that opened but holds a malformed order (only a holder of the wire's keys can make one): the orders
/// before it are taken, the malformed one is counted, and nothing after it is read.
#[test]
fn a_malformed_order_inside_a_sealed_bundle_ends_the_walk() {
    let mut rng = StdRng::seed_from_u64(32);
    let keys = Keys::new(1, &mut rng);
    let counters = Arc::new(Counters::default());
    let mut r = keys.receiver(Kind::Link, 1, 16, &counters);
    let device = &keys.devices[0];
    let secret = link_secret(
        device,
        keys.node.public(),
        device.public(),
        keys.node.public(),
    )
    .unwrap();
    let wire_keys = WireKeys::link(&secret, 9, 0);
    let mut entries = Vec::new();
    wire::put_entry(&mut entries, 0, 1, b"first");
    wire::put_entry(&mut entries, 1, 2, b"second");
    let bad = entries.len();
    wire::put_entry(&mut entries, 2, 3, b"third");
    // The third claims fewer bytes than its made_us.
    entries[bad + 8..bad + 10].copy_from_slice(&(MADE_LEN as u16 - 1).to_be_bytes());
    wire::put_entry(&mut entries, 3, 4, b"fourth");
    let d = seal_bundle(
        &wire_keys,
        &device.key_id(),
        9,
        77,
        &0u64.to_be_bytes(),
        &entries,
    );
    r.handle(Instant::now(), from(), &d);
    let (orders, replies) = r.take_deliveries();
    assert_eq!(orders.iter().map(|o| o.id.seq).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(orders[1].payload, b"second");
    // One reply answers both orders taken, none the orders after the malformed entry.
    assert_eq!(replies.iter().map(Reply::orders).collect::<Vec<_>>(), [2]);
    let c = counters.snapshot();
    assert_eq!(
        (c.received, c.refused_malformed, c.refused()),
        (2, 1, 1),
        "{c:?}"
    );
    // The same bundle under another number does not open: the number is sealed with it.
    let mut renumbered = d.clone();
    renumbered[18..26].copy_from_slice(&78u64.to_be_bytes());
    r.handle(Instant::now(), from(), &renumbered);
    assert!(r.take_deliveries().0.is_empty());
    assert_eq!(counters.snapshot().refused_forged, 1);
}

/// Answer bundles take one count for every wire of the receiver: no number twice under any answer key.
#[test]
fn answer_bundles_are_numbered_in_one_count_across_wires() {
    let mut rng = StdRng::seed_from_u64(33);
    let keys = Keys::new(3, &mut rng);
    let counters = Arc::new(Counters::default());
    let mut r = keys.receiver(Kind::Link, 1, 16, &counters);
    let addr = |i: usize| -> SocketAddr { format!("10.0.3.{}:4000", i + 1).parse().unwrap() };
    let now = Instant::now();
    let mut numbers = Vec::new();
    for round in 0..3u64 {
        for i in 0..3 {
            let mut device =
                keys.sender(Kind::Link, i, 40 + i as u64, &Arc::new(Counters::default()));
            // More orders than one answer bundle holds: two answer datagrams per device.
            for seq in 0..200 {
                device.push(now, order(i as u64, 100 * round + i as u64, seq, 0));
            }
            let mut buf = Vec::new();
            while device.poll_transmit(now, &mut buf) {
                r.handle(now, addr(i), &buf);
            }
        }
        let (_, replies) = r.take_deliveries();
        for reply in replies {
            r.answer(reply);
        }
        let mut buf = Vec::new();
        while r.poll_transmit(now, &mut buf).is_some() {
            for f in wire::frames(&buf) {
                if let Ok(wire::Frame::AnswerBundle(b)) = f {
                    numbers.push(b.number);
                }
            }
        }
    }
    assert!(numbers.len() >= 9, "{} answer bundles", numbers.len());
    let first = numbers[0];
    let expected: Vec<u64> = (0..numbers.len() as u64)
        .map(|i| first.wrapping_add(i))
        .collect();
    assert_eq!(numbers, expected);
}
