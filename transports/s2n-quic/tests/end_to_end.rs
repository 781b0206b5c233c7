//! The s2n-quic transport over real UDP on 127.0.0.1, both variants: an in-process server with a real store, a
//! fleet of devices ([`transport_conn::testing`]: the server is killed by dropping its runtime, so nothing more goes
//! out). Only hard invariants are asserted, never timings (except that a stateless reset closes an old connection
//! well before the 30 s idle timeout could).

use std::sync::Arc;
use std::time::Duration;
use transport_conn::fleet::{Answer, Connector, MakeConnector};
use transport_conn::testing::{self, any_port, order, Harness};
use transport_core::{CounterSnapshot, Counters};
use transport_s2n_quic::{Provider, S2nConnector};

fn harness(provider: Provider, devices: u32) -> Harness {
    Harness::new(
        Box::new(transport_s2n_quic::S2nQuic::new(provider)),
        devices,
    )
}

/// The connector of `provider` for [`transport_conn::testing`]'s checks (the CA is read from `h`'s identity).
fn connector(provider: Provider, h: &Harness) -> impl MakeConnector<S2nConnector> + '_ {
    move |server, credentials, devices, counters| {
        S2nConnector::new(
            provider,
            server,
            &h.identity,
            credentials,
            devices,
            counters,
        )
    }
}

/// The asymmetric operations of `n` full handshakes on one side, as each provider reports them: rustls counts
/// X25519 (its first key share) where it happens; s2n-tls's default policy negotiates P-256, derived per handshake.
/// Either way per handshake: 2 key-exchange operations, 1 signature, 2 verifications (the peer's certificate and
/// its CertificateVerify).
fn expected_asym(provider: Provider, n: u64) -> (u64, u64, u64, u64) {
    match provider {
        Provider::Rustls => (2 * n, 0, n, 2 * n),
        Provider::S2nTls => (0, 2 * n, n, 2 * n),
    }
}

fn asym(c: &CounterSnapshot) -> (u64, u64, u64, u64) {
    (c.x25519, c.ecdh, c.sign, c.verify)
}

async fn every_order_stored_once_and_handshakes_counted(provider: Provider) {
    const DEVICES: u32 = 50;
    let (client_counts, server_counts) =
        testing::every_order_stored_once(&harness(provider, DEVICES), DEVICES).await;
    assert_eq!(server_counts.refused(), 0, "{server_counts:?}");
    let n = u64::from(DEVICES);
    for counts in [client_counts, server_counts] {
        assert_eq!(asym(&counts), expected_asym(provider, n), "{counts:?}");
    }
}

async fn a_killed_server_restarted_on_its_port_loses_nothing_and_applies_nothing_twice(
    provider: Provider,
) {
    const DEVICES: u32 = 50;
    let after = testing::restart_loses_nothing(&harness(provider, DEVICES), DEVICES).await;
    let n = u64::from(DEVICES);
    let (x25519, ecdh, sign, _) = asym(&after);
    assert!(x25519 + ecdh >= 2 * n && sign >= n, "{after:?}");
}

async fn the_restarted_server_resets_old_connections(provider: Provider) {
    let h = harness(provider, 1);
    let first = h.server(any_port());
    let addr = first.addr;
    let connector =
        connector(provider, &h)(addr, h.credentials(), 1, Arc::new(Counters::default())).unwrap();
    let conn = connector.connect(0).await.unwrap();
    let answer = connector.send_order(&conn, &order(0, 0)).await.unwrap();
    assert_eq!(answer, Answer::Stored(order(0, 0).id));
    let closed = connector.closed(&conn);

    first.kill().await;
    let second = h.server(addr);
    // The next packet on the old connection reaches a process that never knew it; the stateless reset derived from
    // the same key file closes it (well before the 30 s idle timeout could; s2n-quic never closes a connection for
    // lack of acknowledgements alone).
    let result = connector.send_order(&conn, &order(0, 1)).await;
    assert!(result.is_err(), "{result:?}");
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("the old connection was not reset");
    second.kill().await;
}

async fn a_device_from_another_ca_is_refused(provider: Provider) {
    let h = harness(provider, 2);
    testing::foreign_devices_are_refused(&h, connector(provider, &h)).await;
}

async fn orders_in_another_devices_name_or_too_large_to_store_are_refused(provider: Provider) {
    let h = harness(provider, 2);
    testing::spoofed_and_oversized_orders_are_refused(&h, connector(provider, &h)).await;
}

async fn the_relay_delivers_every_message_once_to_each_subscriber(provider: Provider) {
    let counts =
        testing::every_message_delivered_once_to_each_subscriber(&harness(provider, 5)).await;
    assert_eq!(counts.received, 100, "{counts:?}");
}

async fn qos1_deliveries_never_acknowledged_go_again_on_the_next_connection(provider: Provider) {
    let h = harness(provider, 2);
    testing::unacknowledged_qos1_goes_again_on_the_next_connection(
        &h,
        connector(provider, &h),
        transport_s2n_quic::client::opener,
    )
    .await;
}

/// The same checks for each variant, as separate tests.
macro_rules! variant_tests {
    ($($module:ident => $provider:expr),* $(,)?) => {$(
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_closed_on_request_are_a_new_handshake_each() {
    for provider in Provider::ALL {
        testing::links_closed_on_request_are_new_handshakes_each(&harness(provider, 1), 3).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fifty_devices_store_every_order_once_and_count_their_handshakes() {
                every_order_stored_once_and_handshakes_counted($provider).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_killed_server_restarted_on_its_port_loses_nothing_and_applies_nothing_twice() {
                super::a_killed_server_restarted_on_its_port_loses_nothing_and_applies_nothing_twice($provider)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_restarted_server_resets_old_connections() {
                super::the_restarted_server_resets_old_connections($provider).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_device_from_another_ca_is_refused() {
                super::a_device_from_another_ca_is_refused($provider).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn orders_in_another_devices_name_or_too_large_to_store_are_refused() {
                super::orders_in_another_devices_name_or_too_large_to_store_are_refused($provider).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_relay_delivers_every_message_once_to_each_subscriber() {
                super::the_relay_delivers_every_message_once_to_each_subscriber($provider).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn qos1_deliveries_never_acknowledged_go_again_on_the_next_connection() {
                super::qos1_deliveries_never_acknowledged_go_again_on_the_next_connection($provider)
                    .await;
            }
        }
    )*};
}

variant_tests! {
    s2n_tls => Provider::S2nTls,
    rustls => Provider::Rustls,
}

/// The server's stream handling is the same for both TLS providers: one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_answered_whole_or_reset() {
    let h = harness(Provider::S2nTls, 1);
    testing::streams_are_answered_whole_or_reset(
        &h,
        connector(Provider::S2nTls, &h),
        transport_s2n_quic::client::opener,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_a_slice_of_devices_keeps_their_numbers() {
    testing::a_slice_keeps_device_numbers(&harness(Provider::S2nTls, 12), 5, 7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_may_open_twice_its_window() {
    let h = harness(Provider::S2nTls, 1);
    testing::a_device_may_open_twice_its_window(
        &h,
        connector(Provider::S2nTls, &h),
        transport_s2n_quic::client::opener,
    )
    .await;
}
