//! The checks every transport's tests run (`transport_conn::testing`), against each Pure variant over real UDP on
//! 127.0.0.1 with a real store: every order stored and reported exactly once, nothing lost or applied twice across a
//! killed and restarted receiver. Pure has no handshake, so none is counted.

use transport_conn::testing::{self, Harness};

fn harness(spec: &str, devices: u32) -> Harness {
    Harness::new(Box::new(transport_pure::variant(spec).unwrap()), devices)
}

/// Each device on its own socket, and (the named comparisons) devices sharing sockets, and orders as records of
/// their own instead of bundles.
const VARIANTS: [&str; 7] = [
    "pure",
    "pure:no-memo",
    "pure:hpke-session",
    "pure:plain",
    "pure:plain+shared-sockets",
    "pure+records",
    "pure:plain+records",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_variant_stores_every_order_once() {
    const DEVICES: u32 = 20;
    for spec in VARIANTS {
        let (client, server) =
            testing::every_order_stored_once(&harness(spec, DEVICES), DEVICES).await;
        // Sealing costs the devices no asymmetric operation after the first record; the receiver one X25519 per
        // device at most (the link secret, or the HPKE session's setup), none for plain.
        let n = u64::from(DEVICES);
        match spec {
            "pure:plain" | "pure:plain+shared-sockets" | "pure:plain+records" => {
                assert_eq!(server.asym_ops(), 0, "{spec}: {server:?}")
            }
            _ => assert!(server.x25519 <= 2 * n, "{spec}: {server:?}"),
        }
        assert_eq!(
            (client.ecdh, client.sign, client.verify),
            (0, 0, 0),
            "{spec}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_receiver_restarted_on_its_port_loses_nothing_and_applies_nothing_twice() {
    const DEVICES: u32 = 20;
    for spec in VARIANTS {
        testing::restart_loses_nothing(&harness(spec, DEVICES), DEVICES).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_a_slice_of_devices_keeps_their_numbers() {
    for spec in VARIANTS {
        testing::a_slice_keeps_device_numbers(&harness(spec, 12), 5, 7).await;
    }
}

/// Over real UDP: a subscription past the relay's bound of channels per device is refused, and `Fleet::subscribe`
/// says so (as an MQTT client's SUBSCRIBE answered with return code 0x80); the device's subscriptions it holds and
/// its orders go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_over_the_channel_bound_is_refused_by_the_fleet_and_orders_go_on() {
    use std::collections::HashMap;
    use transport_core::QoS;
    use transport_pure::relay::RelayConfig;
    for spec in VARIANTS {
        let h = harness(spec, 1);
        let server = h.server(testing::any_port());
        let (fleet, mut events, _) = h.fleet(server.addr, 1).await;
        let bound = RelayConfig::default().channels as u32;
        for channel in 0..bound {
            fleet.subscribe(0, channel, QoS::AtMostOnce).await.unwrap();
        }
        let refused = fleet
            .subscribe(0, bound, QoS::AtMostOnce)
            .await
            .unwrap_err();
        let message = refused.to_string();
        assert!(
            message.contains("refused") && message.contains(&format!("channel {bound}")),
            "{spec}: {message}"
        );
        // A channel it holds, asked for again, is no new channel: kept.
        fleet.subscribe(0, 0, QoS::AtLeastOnce).await.unwrap();
        let order = testing::order(0, 0);
        fleet.send(0, order.clone());
        testing::wait_stored(&mut events, &[order.id], &mut HashMap::new()).await;
        fleet.close().await;
        server.kill().await;
    }
}

/// A device's task that cannot run past its re-send timer (a busy load generator) finds the answer already in its
/// socket's buffer when it runs again: the answer counts first, and nothing is sent twice. The devices run on this
/// test's one thread, which blocks for longer than the first re-send timeout (200 ms) right after each order has
/// left; the receiver runs on a thread of its own and answers meanwhile.
#[tokio::test(flavor = "current_thread")]
async fn an_answer_waiting_in_the_socket_is_taken_before_an_overdue_timer() {
    const ORDERS: u64 = 8;
    let h = harness("pure:plain", 1);
    let server = h.server(testing::any_port());
    let (fleet, mut events, counters) = h.fleet(server.addr, 1).await;
    let mut seen = std::collections::HashMap::new();
    for seq in 0..ORDERS {
        let order = testing::order(0, seq);
        let id = order.id;
        fleet.send(0, order);
        // Let the device's task take the order and send it, then hold the thread past the timer.
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        testing::wait_stored(&mut events, &[id], &mut seen).await;
    }
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");
    let client = counters.snapshot();
    assert_eq!(client.resent_timeout, 0, "{client:?}");
    fleet.close().await;
    server.kill().await;
}
