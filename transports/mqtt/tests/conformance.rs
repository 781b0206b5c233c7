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
