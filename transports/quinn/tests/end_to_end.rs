//! The quinn transport over real UDP on 127.0.0.1: an in-process server with a real store, a fleet of devices
//! ([`transport_conn::testing`]: the server is killed by dropping its runtime, so nothing more goes out). Only hard
//! invariants are asserted, never timings.

use std::sync::Arc;
use std::time::Duration;
use transport_conn::fleet::{Answer, Connector};
use transport_conn::testing::{self, any_port, order, Harness};
use transport_core::Counters;
use transport_quinn::QuinnConnector;

fn harness(devices: u32) -> Harness {
    Harness::new(Box::new(transport_quinn::Quinn), devices)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_devices_store_every_order_once_and_count_their_handshakes() {
    const DEVICES: u32 = 50;
    let (client_counts, server_counts) =
        testing::every_order_stored_once(&harness(DEVICES), DEVICES).await;
    // A full TLS 1.3 handshake with CA-issued certificates: per side 2 X25519 (ephemeral key, agreement),
    // 1 signature (CertificateVerify), 2 verifications (the peer's certificate, the peer's CertificateVerify).
    let n = u64::from(DEVICES);
    for counts in [client_counts, server_counts] {
        assert_eq!(
            (counts.x25519, counts.ecdh, counts.sign, counts.verify),
            (2 * n, 0, n, 2 * n),
            "{counts:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_restarted_on_its_port_loses_nothing_and_applies_nothing_twice() {
    const DEVICES: u32 = 50;
    let after = testing::restart_loses_nothing(&harness(DEVICES), DEVICES).await;
    let n = u64::from(DEVICES);
    assert!(after.x25519 >= 2 * n && after.sign >= n, "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restarted_server_resets_old_connections() {
    let h = harness(1);
    let first = h.server(any_port());
    let addr = first.addr;
    let connector =
        QuinnConnector::new(addr, h.credentials(), 1, Arc::new(Counters::default())).unwrap();
    let conn = connector.connect(0).await.unwrap();
    let answer = connector.send_order(&conn, &order(0, 0)).await.unwrap();
    assert_eq!(answer, Answer::Stored(order(0, 0).id));

    first.kill().await;
    let second = h.server(addr);
    // The next packet on the old connection reaches a process that never knew it; the stateless reset derived from
    // the same key file closes it (well before the 30 s idle timeout could).
    assert!(connector.send_order(&conn, &order(0, 1)).await.is_err());
    let reason = tokio::time::timeout(Duration::from_secs(25), conn.closed())
        .await
        .unwrap();
    assert!(
        matches!(reason, quinn::ConnectionError::Reset),
        "{reason:?}"
    );
    second.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_from_another_ca_is_refused() {
    testing::foreign_devices_are_refused(&harness(2), QuinnConnector::new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_in_another_devices_name_or_too_large_to_store_are_refused() {
    testing::spoofed_and_oversized_orders_are_refused(&harness(2), QuinnConnector::new).await;
}
