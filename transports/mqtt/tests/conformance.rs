//! The checks every transport's tests run (`transport_conn::testing`), against the in-tree broker over real TCP and
//! TLS 1.3 on 127.0.0.1 with a real store: every order stored and reported exactly once, nothing lost or applied
//! twice across a killed and restarted broker, foreign certificates refused.

use std::net::SocketAddr;
use std::sync::Arc;
use transport_conn::testing::{self, Harness};
use transport_core::{Counters, TransportError};
use transport_mqtt::client::OrderConnector;
use transport_tls::{ClientTls, DeviceCredentials};

fn harness(devices: u32) -> Harness {
    Harness::new(Box::new(transport_mqtt::Mqtt::in_tree()), devices)
}

fn connector(
    server: SocketAddr,
    credentials: Arc<DeviceCredentials>,
    _devices: u32,
    counters: Arc<Counters>,
) -> Result<OrderConnector, TransportError> {
    Ok(OrderConnector::new(
        server,
        ClientTls::new(credentials, counters, &[])?,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_stored_once_with_one_handshake_per_device() {
    const DEVICES: u32 = 20;
    let (client, server) = testing::every_order_stored_once(&harness(DEVICES), DEVICES).await;
    // A full TLS 1.3 handshake with CA-issued certificates: per side 2 X25519, 1 signature, 2 verifications.
    let n = u64::from(DEVICES);
    for counts in [client, server] {
        assert_eq!(
            (counts.x25519, counts.ecdh, counts.sign, counts.verify),
            (2 * n, 0, n, 2 * n),
            "{counts:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_broker_restarted_on_its_port_loses_nothing_and_applies_nothing_twice() {
    const DEVICES: u32 = 20;
    testing::restart_loses_nothing(&harness(DEVICES), DEVICES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_of_a_foreign_ca_are_refused() {
    testing::foreign_devices_are_refused(&harness(2), connector).await;
}

// `spoofed_and_oversized_orders_are_refused` does not apply: MQTT 3.1.1 has no negative PUBACK, so the broker
// answers an order in another device's name, or one too large to store, by closing the connection
// (`tests/robustness.rs` checks that, and that nothing of it is stored).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_a_slice_of_devices_keeps_their_numbers() {
    testing::a_slice_keeps_device_numbers(&harness(12), 5, 7).await;
}

fn spec(name: &str) -> Box<dyn transport_core::Transport> {
    (transport_mqtt::SPECS
        .iter()
        .find(|s| s.name == name)
        .unwrap()
        .make)()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_resumption_devices_reconnecting_to_the_restarted_broker_resume() {
    const DEVICES: u32 = 20;
    let h = Harness::new(spec("mqtt:resume"), DEVICES);
    let after = testing::restart_resumes(&h, DEVICES).await;
    assert!(after.resumed >= u64::from(DEVICES), "{after:?}");
    // Without resumption the same run makes full handshakes only.
    let full = testing::restart_loses_nothing(&harness(DEVICES), DEVICES).await;
    assert_eq!(full.resumed, 0, "{full:?}");
    assert!(full.sign >= u64::from(DEVICES), "{full:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_resumption_a_link_opened_again_resumes() {
    let h = Harness::new(spec("mqtt:resume"), 1);
    let s = testing::links_closed_on_request_are_new_handshakes_each(&h, 3).await;
    assert_eq!(
        (s.resumed, s.sign, s.verify, s.x25519),
        (2, 1, 2, 6),
        "{s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelining_after_connect_every_order_is_stored_once_and_survives_a_restart() {
    const DEVICES: u32 = 20;
    let h = Harness::new(spec("mqtt:early"), DEVICES);
    let (client, _) = testing::every_order_stored_once(&h, DEVICES).await;
    assert_eq!(client.resumed, 0, "{client:?}");
    let h = Harness::new(spec("mqtt:early"), DEVICES);
    testing::restart_loses_nothing(&h, DEVICES).await;
}

/// `mqtt:fast-open` over real sockets to the real broker: every order stored once and nothing lost across a restart,
/// and, where this kernel lets servers take data in a SYN, every connection's ClientHello taken from its SYN (the
/// client reads it from `TCP_INFO`); where it does not, every connection says it was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fast_open_every_order_is_stored_once_and_the_syn_data_is_taken_where_the_kernel_allows(
) {
    use transport_core::net::fast_open::KernelSupport;
    const DEVICES: u32 = 10;
    let Some(kernel) = KernelSupport::for_clients() else {
        return;
    };
    let h = Harness::new(spec("mqtt:fast-open"), DEVICES);
    let (client, _) = testing::every_order_stored_once(&h, DEVICES).await;
    assert!(client.handshakes >= u64::from(DEVICES), "{client:?}");
    assert_eq!(
        client.fast_open + client.fast_open_refused,
        client.handshakes,
        "every connection asked for it: {client:?}"
    );
    if kernel.server() {
        assert_eq!(client.fast_open_refused, 0, "{client:?}");
    } else {
        eprintln!(
            "net.ipv4.tcp_fastopen = {}: servers here take no data in a SYN",
            kernel.sysctl
        );
        assert_eq!(client.fast_open, 0, "{client:?}");
    }
    let h = Harness::new(spec("mqtt:fast-open"), DEVICES);
    testing::restart_loses_nothing(&h, DEVICES).await;
}

/// A device that pipelines its order after a CONNECT the broker refuses (its identifier is not its certificate's
/// name: here device 0 of a bundle that holds device 2's certificate) never has it stored: the refusing CONNACK
/// closes the device's connection, the order stays pending for the next one, and nothing reaches the store (the
/// broker processes nothing after a refused CONNECT [MQTT-3.1.4-5]; `normative` checks that on its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_pipelined_after_a_refused_connect_is_never_stored() {
    use transport_conn::fleet::{ConnFleet, Policy};
    use transport_core::{Fleet, LinkEvent};
    let h = harness(3);
    let server = h.server(testing::any_port());
    let other = tempfile::tempdir().unwrap();
    transport_tls::extract_device(&h.identity, 2, other.path()).unwrap();
    let credentials = Arc::new(DeviceCredentials::load(other.path()).unwrap());
    let counters = Arc::new(Counters::default());
    let tls = ClientTls::new(credentials, counters.clone(), &[]).unwrap();
    let connector = OrderConnector::new(server.addr, tls).pipelining(true);
    let (events, mut rx) = transport_core::events::channel();
    let fleet = ConnFleet::start(connector, 1, events, counters.clone(), Policy::default());
    fleet.send(0, testing::order(0, 0));
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    assert_eq!(fleet.pending(), 1);
    fleet.close().await;
    let events: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
    assert!(
        events.iter().any(|e| matches!(e, LinkEvent::Lost { .. })),
        "{events:?}"
    );
    assert!(
        !events.iter().any(|e| matches!(e, LinkEvent::Stored { .. })),
        "{events:?}"
    );
    let s = server.kill().await;
    assert!(s.handshakes >= 1 && s.received == 0, "{s:?}");
    let audit = transport_store::audit(&h.store_dir, &[], &[]).unwrap();
    assert_eq!(audit.applied, 0);
}
