//! Hostile input to the publish/subscribe relay and to a subscribed device: replayed, forged and stale subscribes,
//! publishes, deliveries and delivery answers, and the relay's bounds. Each test says which rule of `docs/pure.md`
//! ("What each hostile input does") it holds to.

use rand::rngs::StdRng;
use rand::SeedableRng;
use std::net::SocketAddr;
use std::time::Duration;
use transport_core::{Order, OrderId, QoS};
use transport_pure::relay::RelayConfig;
use transport_pure::sender::SenderEvent;
use transport_pure::wire::{self, Frame, Kind, Op};

mod common;
use common::{first_op, Keys, Net, CHANNEL};

const ALL: [Kind; 4] = [
    Kind::Plain,
    Kind::HpkeSession,
    Kind::HpkePerRequest,
    Kind::Link,
];
const SEALED: [Kind; 3] = [Kind::HpkeSession, Kind::HpkePerRequest, Kind::Link];

fn attacker() -> SocketAddr {
    "10.9.9.9:9999".parse().unwrap()
}

/// Device 0 subscribed at `qos`, device 1 a publisher that knows the receiver's run (one message, id 1000, relayed).
fn subscribed(kind: Kind, qos: QoS) -> (Net, Vec<u8>) {
    let mut rng = StdRng::seed_from_u64(50);
    let keys = Keys::new(2, &mut rng);
    let mut net = Net::new(&keys, kind, 2);
    let subscribe = net.subscribe(0, qos);
    let payload = transport_pure::client::payload(1000, 8);
    net.devices[1]
        .publish(net.now, CHANNEL, 1000, QoS::AtLeastOnce, payload)
        .unwrap();
    net.pump();
    assert_eq!(net.delivered(0), [1000], "{kind:?}");
    (net, subscribe)
}

/// The frames of a datagram, as (op, is an answer).
fn ops(bytes: &[u8]) -> Vec<(Op, bool)> {
    wire::frames(bytes)
        .map(|f| match f.unwrap() {
            Frame::Record(r) => (r.op, false),
            Frame::Answer(a) => (a.op, true),
            Frame::AnswerBundle(_) => (Op::Order, true),
        })
        .collect()
}

#[test]
fn a_replayed_publish_is_answered_again_but_relayed_once() {
    for kind in ALL {
        let (mut net, _) = subscribed(kind, QoS::AtLeastOnce);
        // The QoS 1 publish that was taken, captured and sent again: from its device, and from elsewhere.
        let taken = net
            .log
            .iter()
            .rev()
            .find(|d| d.from == Some(1) && first_op(&d.bytes) == Some(Op::Publish1))
            .unwrap()
            .bytes
            .clone();
        net.receiver.handle(net.now, Net::addr(1), &taken);
        net.receiver.handle(net.now, attacker(), &taken);
        let out = net.receiver_output();
        assert_eq!(out.len(), 2, "{kind:?}: answered to each source");
        assert!(out
            .iter()
            .all(|(_, b)| ops(b) == [(Op::Publish1, true)] && b.len() < taken.len()));
        net.pump();
        assert_eq!(net.delivered(0), [1000], "{kind:?}: relayed once");
        // A QoS 0 publish twice: one delivery.
        let publish0 = net.publish_only(1, 1001, QoS::AtMostOnce);
        net.receiver.handle(net.now, Net::addr(1), &publish0);
        net.receiver.handle(net.now, Net::addr(1), &publish0);
        let out = net.receiver_output();
        let deliveries: Vec<_> = out.iter().flat_map(|(_, b)| ops(b)).collect();
        assert_eq!(deliveries, [(Op::Deliver0, false)], "{kind:?}");
        let c = net.counters.snapshot();
        assert_eq!((c.refused(), c.dropped), (0, 0), "{kind:?}: {c:?}");
    }
}

#[test]
fn a_replayed_subscribe_from_elsewhere_does_not_move_the_deliveries() {
    for kind in ALL {
        let (mut net, subscribe) = subscribed(kind, QoS::AtLeastOnce);
        net.receiver.handle(net.now, attacker(), &subscribe);
        let out = net.receiver_output();
        // Answered, to the replay's source, smaller than the subscribe: no amplification.
        assert_eq!(out.len(), 1, "{kind:?}");
        assert_eq!(out[0].0, None, "to the attacker");
        assert!(out[0].1.len() < subscribe.len());
        let publish = net.publish_only(1, 2000, QoS::AtMostOnce);
        net.receiver.handle(net.now, Net::addr(1), &publish);
        let out = net.receiver_output();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, Some(0), "{kind:?}: still delivered to the device");
    }
}

#[test]
fn a_subscribe_from_before_a_receiver_restart_is_answered_not_taken() {
    for kind in ALL {
        let (mut net, subscribe) = subscribed(kind, QoS::AtLeastOnce);
        let mut rng = StdRng::seed_from_u64(50);
        let keys = Keys::new(2, &mut rng);
        net.receiver = keys.receiver(kind, 2, 16, &net.counters);
        net.receiver.handle(net.now, attacker(), &subscribe);
        let out = net.receiver_output();
        assert_eq!(out.len(), 1, "{kind:?}");
        let Ok((Frame::Answer(a), _)) = wire::parse_frame(&out[0].1) else {
            panic!("an answer")
        };
        assert_eq!(
            (a.op, a.receiver_run),
            (Op::Subscribe, 2),
            "names the new run"
        );
        assert!(out[0].1.len() < subscribe.len());
        assert_eq!(
            net.receiver.relay().subscribers(),
            0,
            "{kind:?}: nothing subscribed at the attacker's address"
        );
    }
}

#[test]
fn forged_subscribes_publishes_and_delivery_answers_are_refused_and_change_nothing() {
    for kind in SEALED {
        let (mut net, subscribe) = subscribed(kind, QoS::AtLeastOnce);
        let mut forged = subscribe.clone();
        *forged.last_mut().unwrap() ^= 1;
        net.receiver.handle(net.now, attacker(), &forged);
        assert!(net.receiver_output().is_empty(), "{kind:?}: not answered");
        assert_eq!(net.counters.snapshot().refused_forged, 1, "{kind:?}");
        // A publish with a changed body relays nothing.
        let publish = net.publish_only(1, 3000, QoS::AtLeastOnce);
        let mut tampered = publish.clone();
        let at = tampered.len() - 20;
        tampered[at] ^= 1;
        net.receiver.handle(net.now, Net::addr(1), &tampered);
        assert!(net.receiver_output().is_empty(), "{kind:?}");
        assert_eq!(net.counters.snapshot().refused_forged, 2, "{kind:?}");
        // The genuine one is relayed; the device's answer with a changed tag is refused, the delivery stays held.
        net.receiver.handle(net.now, Net::addr(1), &publish);
        let out = net.receiver_output();
        let delivery = out.iter().find(|(to, _)| *to == Some(0)).unwrap().1.clone();
        net.devices[0].handle(net.now, &delivery);
        let mut answer = Vec::new();
        assert!(net.devices[0].poll_transmit(net.now, &mut answer));
        assert_eq!(ops(&answer), [(Op::Deliver1, true)]);
        let mut bad = answer.clone();
        *bad.last_mut().unwrap() ^= 1;
        net.receiver.handle(net.now, Net::addr(0), &bad);
        assert_eq!(net.counters.snapshot().refused_forged, 3, "{kind:?}");
        assert_eq!(net.receiver.relay().held(), 1, "{kind:?}: still in flight");
        // The same answer under the publisher's name: not its delivery, ignored.
        let mut other = answer.clone();
        other[2..10].copy_from_slice(&net.devices[1].key_id());
        net.receiver.handle(net.now, Net::addr(1), &other);
        assert_eq!(net.receiver.relay().held(), 1, "{kind:?}");
        net.receiver.handle(net.now, Net::addr(0), &answer);
        assert_eq!(net.receiver.relay().held(), 0, "{kind:?}: answered");
    }
}

#[test]
fn a_tampered_delivery_is_refused_and_a_replayed_one_is_answered_not_reported() {
    for kind in ALL {
        let (mut net, _) = subscribed(kind, QoS::AtLeastOnce);
        let publish = net.publish_only(1, 4000, QoS::AtLeastOnce);
        net.receiver.handle(net.now, Net::addr(1), &publish);
        let out = net.receiver_output();
        let delivery = out.iter().find(|(to, _)| *to == Some(0)).unwrap().1.clone();
        let before = net.device_counters.snapshot();
        if kind.sealed() {
            let mut tampered = delivery.clone();
            let at = tampered.len() - 20;
            tampered[at] ^= 1;
            net.devices[0].handle(net.now, &tampered);
            assert_eq!(net.devices[0].poll_event(), None, "{kind:?}");
            assert_eq!(
                net.device_counters.snapshot().since(&before).refused_forged,
                1
            );
        }
        let mut answers = 0;
        let mut buf = Vec::new();
        for _ in 0..3 {
            net.devices[0].handle(net.now, &delivery);
            while net.devices[0].poll_transmit(net.now, &mut buf) {
                answers += ops(&buf).len();
            }
        }
        assert_eq!(answers, 3, "{kind:?}: answered every time");
        let mut reported = Vec::new();
        while let Some(e) = net.devices[0].poll_event() {
            reported.push(e);
        }
        assert_eq!(
            reported,
            [SenderEvent::Delivered {
                channel: CHANNEL,
                id: 4000
            }],
            "{kind:?}: reported once"
        );
    }
}

#[test]
fn a_delivery_sent_to_the_receiver_is_malformed() {
    for kind in ALL {
        let (mut net, _) = subscribed(kind, QoS::AtMostOnce);
        let publish = net.publish_only(1, 5000, QoS::AtMostOnce);
        net.receiver.handle(net.now, Net::addr(1), &publish);
        let delivery = net.receiver_output().remove(0).1;
        let before = net.counters.snapshot();
        net.receiver.handle(net.now, Net::addr(0), &delivery);
        let c = net.counters.snapshot().since(&before);
        assert_eq!((c.refused_malformed, c.refused()), (1, 1), "{kind:?}");
        assert!(net.receiver_output().is_empty());
    }
}

/// A subscribe over the bound is answered with a refusal (as MQTT's SUBACK 0x80), tagged like every answer; the
/// device takes it as final and stops sending it.
#[test]
fn a_device_subscribing_to_more_channels_than_the_bound_is_refused_and_told_so() {
    for kind in ALL {
        let mut rng = StdRng::seed_from_u64(51);
        let keys = Keys::new(1, &mut rng);
        let mut net = Net::new(&keys, kind, 1);
        let bound = RelayConfig::default().channels as u32;
        for channel in 0..=bound {
            net.devices[0].subscribe(net.now, channel, QoS::AtMostOnce);
        }
        net.pump();
        let subscribed: Vec<_> = net
            .events
            .iter()
            .filter_map(|(_, e)| match e {
                SenderEvent::Subscribed(c) => Some(*c),
                _ => None,
            })
            .collect();
        assert_eq!(subscribed, (0..bound).collect::<Vec<_>>(), "{kind:?}");
        assert!(
            net.events
                .iter()
                .filter(|(_, e)| matches!(e, SenderEvent::Refused(_)))
                .eq([&(0, SenderEvent::Refused(bound))]),
            "{kind:?}: {:?}",
            &net.events[net.events.len().saturating_sub(2)..]
        );
        assert_eq!(net.counters.snapshot().refused_malformed, 1, "{kind:?}");
        assert_eq!(
            net.devices[0].pending(),
            0,
            "{kind:?}: nothing left in flight"
        );
        // The refusal on the wire: the subscribe's answer with the refused bit, as long as any answer.
        let refusal = net
            .log
            .iter()
            .filter(|d| d.to == Some(0))
            .flat_map(|d| {
                wire::frames(&d.bytes)
                    .map(|f| f.unwrap())
                    .collect::<Vec<_>>()
            })
            .filter_map(|f| match f {
                Frame::Answer(a) if a.refused => Some((a.op, a.tag.len())),
                _ => None,
            })
            .collect::<Vec<_>>();
        let tag = if kind.sealed() { wire::TAG_LEN } else { 0 };
        assert_eq!(refusal, [(Op::Subscribe, tag)], "{kind:?}: refused once");
        if kind.sealed() {
            // A kept answer turned into a refusal by someone on the path does not verify: the device keeps its
            // subscription in flight and is not told it was refused.
            let mut net = Net::new(&keys, kind, 1);
            net.devices[0].subscribe(net.now, 0, QoS::AtMostOnce);
            net.pump();
            net.devices[0].subscribe(net.now, 1, QoS::AtMostOnce);
            let mut dg = Vec::new();
            assert!(net.devices[0].poll_transmit(net.now, &mut dg));
            net.receiver.handle(net.now, Net::addr(0), &dg);
            let mut answer = net.receiver_output().remove(0).1;
            answer[1] |= wire::REFUSED;
            let before = net.device_counters.snapshot();
            net.devices[0].handle(net.now, &answer);
            net.collect_events();
            assert_eq!(net.events.last(), Some(&(0, SenderEvent::Subscribed(0))));
            let c = net.device_counters.snapshot().since(&before);
            assert_eq!(c.refused_forged, 1, "{kind:?}");
            assert_eq!(net.devices[0].pending(), 1, "{kind:?}: still in flight");
        }
    }
}

/// A refused subscribe sent again (its refusal lost) or replayed is refused again while the device holds as many
/// channels, and its number, seen, never subscribes the device later, when the relay has room again.
#[test]
fn a_refused_subscribe_sent_again_is_refused_again_and_never_taken_later() {
    for kind in ALL {
        let mut rng = StdRng::seed_from_u64(54);
        let keys = Keys::new(2, &mut rng);
        let mut net = Net::new(&keys, kind, 2);
        let bound = RelayConfig::default().channels as u32;
        for channel in 0..bound {
            net.devices[0].subscribe(net.now, channel, QoS::AtMostOnce);
        }
        net.pump();
        net.devices[0].subscribe(net.now, bound, QoS::AtMostOnce);
        let mut over = Vec::new();
        assert!(net.devices[0].poll_transmit(net.now, &mut over));
        net.receiver.handle(net.now, Net::addr(0), &over);
        let refusal = net.receiver_output();
        net.receiver.handle(net.now, Net::addr(0), &over);
        assert_eq!(net.receiver_output(), refusal, "{kind:?}: the same refusal");
        let Ok((Frame::Answer(a), _)) = wire::parse_frame(&refusal[0].1) else {
            panic!("an answer")
        };
        assert!(a.refused, "{kind:?}");
        // The device's subscription lapses (nothing refreshed it) and goes at the next publish on one of its channels.
        net.now += RelayConfig::default().expire;
        let publish = net.publish_only(1, 1, QoS::AtMostOnce);
        net.receiver.handle(net.now, Net::addr(1), &publish);
        assert_eq!(net.receiver.relay().subscribers(), 0, "{kind:?}");
        net.receiver.handle(net.now, attacker(), &over);
        assert_eq!(net.receiver.relay().subscribers(), 0, "{kind:?}: not taken");
        assert!(!net.receiver.relay().holds(0, bound), "{kind:?}");
    }
}

/// Only the bound refuses: a kept subscribe sent again after the subscription lapsed (its answers lost meanwhile) is
/// answered as kept, changes nothing, and the device's next refresh subscribes it again.
#[test]
fn a_kept_subscribe_sent_again_after_its_subscription_lapsed_is_not_refused() {
    for kind in ALL {
        let (mut net, subscribe) = subscribed(kind, QoS::AtLeastOnce);
        net.now += RelayConfig::default().expire;
        let publish = net.publish_only(1, 2, QoS::AtMostOnce);
        net.receiver.handle(net.now, Net::addr(1), &publish);
        assert_eq!(net.receiver.relay().subscribers(), 0, "{kind:?}: lapsed");
        net.receiver.handle(net.now, Net::addr(0), &subscribe);
        let out = net.receiver_output();
        let Ok((Frame::Answer(a), _)) = wire::parse_frame(&out[0].1) else {
            panic!("an answer")
        };
        assert_eq!((a.op, a.refused), (Op::Subscribe, false), "{kind:?}");
        assert_eq!(
            net.receiver.relay().subscribers(),
            0,
            "{kind:?}: a copy changes nothing"
        );
    }
}

/// A subscribe over the bound opens (its device sealed it) but is refused; the records packed after it in the same
/// datagram are still taken. (Under `hpke-per-request` they were refused as forged without their setup, re-sent
/// with it forever: the device's orders were never stored. Found by the `pure_receiver` fuzz target.)
#[test]
fn records_after_a_subscribe_over_the_bound_in_one_datagram_are_taken() {
    for kind in ALL {
        let mut rng = StdRng::seed_from_u64(52);
        let keys = Keys::new(1, &mut rng);
        let mut net = Net::new(&keys, kind, 1);
        let bound = RelayConfig::default().channels as u32;
        for channel in 0..bound {
            net.devices[0].subscribe(net.now, channel, QoS::AtMostOnce);
        }
        net.pump();
        // One subscribe too many, and an order made at once: they leave in one datagram.
        net.devices[0].subscribe(net.now, bound, QoS::AtMostOnce);
        let order = Order {
            id: OrderId {
                sender: 0,
                run: 9,
                seq: 0,
            },
            made_us: 1,
            payload: vec![1; 16],
        };
        net.devices[0].push(net.now, order.clone());
        let mut dg = Vec::new();
        assert!(net.devices[0].poll_transmit(net.now, &mut dg));
        // The order goes in a bundle where the kind bundles orders.
        let order_op = if kind.bundles() {
            Op::Bundle
        } else {
            Op::Order
        };
        assert_eq!(
            ops(&dg),
            [(Op::Subscribe, false), (order_op, false)],
            "{kind:?}"
        );
        net.receiver.handle(net.now, Net::addr(0), &dg);
        let (orders, _) = net.receiver.take_deliveries();
        assert_eq!(orders, [order], "{kind:?}: the order after it is taken");
        let c = net.counters.snapshot();
        assert_eq!(
            (c.refused_forged, c.refused_malformed),
            (0, 1),
            "{kind:?}: {c:?}"
        );
    }
}

/// A subscribe over the bound used to be never answered, so it stayed in flight with its number while every refresh
/// numbered the device's other subscribes on; once the next number would have been a replay window past it, the
/// subscribe at the head of the outbox could not be numbered and nothing behind it left, orders included
/// (docs/fuzzing.md, finding 4). Now it is refused, and the device stops sending it.
#[test]
fn a_device_subscribed_over_the_bound_still_sends_its_orders() {
    let mut rng = StdRng::seed_from_u64(53);
    let keys = Keys::new(1, &mut rng);
    let mut net = Net::new(&keys, Kind::Link, 1);
    for channel in 0..=RelayConfig::default().channels as u32 {
        net.devices[0].subscribe(net.now, channel, QoS::AtMostOnce);
    }
    let order = Order {
        id: OrderId {
            sender: 0,
            run: 9,
            seq: 0,
        },
        made_us: 1,
        payload: vec![1; 16],
    };
    for second in 0..150 {
        if second == 120 {
            net.devices[0].push(net.now, order.clone());
        }
        net.now += Duration::from_secs(1);
        net.devices[0].handle_timeout(net.now);
        net.pump();
    }
    assert!(net
        .events
        .iter()
        .any(|(_, e)| *e == SenderEvent::Stored(order.id)));
}

#[test]
fn qos0_messages_a_subscriber_cannot_take_in_time_are_dropped_and_counted() {
    let (mut net, _) = subscribed(Kind::Link, QoS::AtMostOnce);
    let bound = RelayConfig::default().waiting0;
    // The receiver reads 1,000 publishes and sends nothing meanwhile (its sends are what cannot keep up).
    for id in 0..1000 {
        let p = net.publish_only(1, id, QoS::AtMostOnce);
        net.receiver.handle(net.now, Net::addr(1), &p);
        assert!(net.receiver.relay().held() <= bound);
    }
    assert_eq!(net.counters.snapshot().dropped, 1000 - bound as u64);
    net.pump();
    assert_eq!(
        net.delivered(0).len(),
        1 + bound,
        "the first relayed, then those held"
    );
    // Ten more, and the receiver does not get to send them within the deadline: dropped, not sent late.
    for id in 1000..1010 {
        let p = net.publish_only(1, id, QoS::AtMostOnce);
        net.receiver.handle(net.now, Net::addr(1), &p);
    }
    assert_eq!(net.receiver.relay().held(), 10);
    net.now += RelayConfig::default().deadline0;
    assert!(net.receiver_output().is_empty());
    assert_eq!(net.receiver.relay().held(), 0);
    assert_eq!(net.counters.snapshot().dropped, 1010 - bound as u64);
}

#[test]
fn a_subscription_not_refreshed_in_time_is_dropped_with_what_is_held_for_it() {
    let (mut net, _) = subscribed(Kind::Link, QoS::AtLeastOnce);
    // The subscriber goes silent: three QoS 1 messages are held for it, unanswered.
    for id in 0..3 {
        let p = net.publish_only(1, id, QoS::AtLeastOnce);
        net.receiver.handle(net.now, Net::addr(1), &p);
    }
    let _ = net.receiver_output();
    assert_eq!(net.receiver.relay().held(), 3);
    net.now += RelayConfig::default().expire + Duration::from_secs(1);
    net.receiver.handle_timeout(net.now);
    assert_eq!(net.receiver.relay().subscribers(), 0);
    assert_eq!(net.receiver.relay().held(), 0);
    assert_eq!(net.counters.snapshot().dropped, 3);
}

#[test]
fn one_delivery_never_answered_holds_numbering_within_the_devices_window_and_nothing_spins() {
    // Every QoS 1 delivery is answered except the first one, which the device never gets: the relay goes on only
    // up to the device's replay window past it, then waits (re-sending it), and sends the rest once it is answered.
    let (mut net, _) = subscribed(Kind::Link, QoS::AtLeastOnce);
    let window = transport_pure::flow::REPLAY_WINDOW as usize;
    let n = window + 200;
    let mut stuck: Option<Vec<u8>> = None;
    for id in 0..n as u64 {
        let p = net.publish_only(1, id, QoS::AtLeastOnce);
        net.receiver.handle(net.now, Net::addr(1), &p);
        for (to, d) in net.receiver_output() {
            if to == Some(1) {
                net.devices[1].handle(net.now, &d);
                continue;
            }
            // Hold back the first delivery's datagram; hand over the rest and their answers.
            if stuck.is_none() {
                stuck = Some(d);
                continue;
            }
            net.devices[0].handle(net.now, &d);
            let mut buf = Vec::new();
            while net.devices[0].poll_transmit(net.now, &mut buf) {
                net.receiver.handle(net.now, Net::addr(0), &buf);
            }
        }
    }
    net.collect_events();
    let reported = net.delivered(0).len() - 1;
    assert!(
        reported < window && reported + 256 >= window,
        "{reported} delivered past the one missing"
    );
    assert!(!net.receiver.has_output(), "blocked, not spinning");
    // The missing one arrives: the rest follow.
    net.devices[0].handle(net.now, &stuck.unwrap());
    net.pump();
    let mut got = net.delivered(0);
    got.sort_unstable();
    let mut want: Vec<u64> = (0..n as u64).collect();
    want.push(1000);
    want.sort_unstable();
    assert_eq!(got, want);
}

#[test]
fn a_record_refused_for_what_it_says_does_not_hide_the_next_but_another_variant_ends_the_datagram()
{
    let (mut net, subscribe) = subscribed(Kind::Plain, QoS::AtMostOnce);
    let mut bad_qos = subscribe.clone();
    *bad_qos.last_mut().unwrap() = 7;
    let publish = net.publish_only(1, 6000, QoS::AtMostOnce);
    let before = net.counters.snapshot();
    net.receiver.handle(
        net.now,
        Net::addr(0),
        &[bad_qos.clone(), publish.clone()].concat(),
    );
    let c = net.counters.snapshot().since(&before);
    assert_eq!(c.refused_malformed, 1, "{c:?}");
    let out = net.receiver_output();
    assert_eq!(out.len(), 1, "the publish after it was relayed");
    assert_eq!(ops(&out[0].1), [(Op::Deliver0, false)]);
    // The same subscribe claiming another variant: the walk ends there, the publish after it is not read.
    let mut other_variant = bad_qos;
    other_variant[1] = wire::kind_byte(Kind::HpkeSession, Op::Subscribe, false);
    let publish = net.publish_only(1, 6001, QoS::AtMostOnce);
    net.receiver
        .handle(net.now, Net::addr(0), &[other_variant, publish].concat());
    assert!(net.receiver_output().is_empty());
}
