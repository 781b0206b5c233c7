//! The quinn transport over real UDP on 127.0.0.1: an in-process server with a real store, a fleet of devices
//! ([`transport_conn::testing`]: the server is killed by dropping its runtime, so nothing more goes out). Only hard
//! invariants are asserted, never timings.

use std::sync::Arc;
use std::time::Duration;
use transport_conn::fleet::{Answer, Connector};
use transport_conn::testing::{self, any_port, order, Harness};
use transport_core::Counters;
use transport_quinn::QuinnConnector;

/// Streams opened by hand on a device's connection (the checks that speak the protocol themselves).
fn opener(c: &transport_quinn::client::QuinnConn) -> transport_conn::relay::client::OpenStream {
    transport_quinn::client::opener(&c.conn)
}

fn harness(devices: u32) -> Harness {
    Harness::new(Box::new(transport_quinn::Quinn::default()), devices)
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
async fn links_closed_on_request_are_a_new_full_handshake_each_with_either_p256_arithmetic() {
    let quinn = testing::links_closed_on_request_are_new_handshakes_each(&harness(1), 3).await;
    assert_eq!(
        (quinn.x25519, quinn.sign, quinn.verify),
        (6, 3, 6),
        "{quinn:?}"
    );
    for spec in ["quinn:p256", "quinn:p256-rustcrypto"] {
        let make = transport_quinn::SPECS
            .iter()
            .find(|s| s.name == spec)
            .unwrap()
            .make;
        let h = Harness::new(make(), 1);
        let c = testing::links_closed_on_request_are_new_handshakes_each(&h, 3).await;
        assert_eq!(
            (c.x25519, c.ecdh, c.sign, c.verify),
            (0, 6, 3, 6),
            "{spec}: {c:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_a_slice_of_devices_keeps_their_numbers() {
    testing::a_slice_keeps_device_numbers(&harness(12), 5, 7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_restarted_on_its_port_loses_nothing_and_applies_nothing_twice() {
    const DEVICES: u32 = 50;
    let after = testing::restart_loses_nothing(&harness(DEVICES), DEVICES).await;
    let n = u64::from(DEVICES);
    assert!(after.x25519 >= 2 * n && after.sign >= n, "{after:?}");
}

fn spec(name: &str) -> Box<dyn transport_core::Transport> {
    (transport_quinn::SPECS
        .iter()
        .find(|s| s.name == name)
        .unwrap()
        .make)()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_resumption_devices_reconnecting_to_the_restarted_server_resume() {
    const DEVICES: u32 = 20;
    let h = Harness::new(spec("quinn:resume"), DEVICES);
    let after = testing::restart_resumes(&h, DEVICES).await;
    assert!(after.resumed >= u64::from(DEVICES), "{after:?}");
    // Without resumption the same run makes full handshakes only.
    let full = testing::restart_loses_nothing(&harness(DEVICES), DEVICES).await;
    assert_eq!(full.resumed, 0, "{full:?}");
    assert!(full.sign >= u64::from(DEVICES), "{full:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_resumption_every_order_is_stored_once_after_one_full_handshake_each() {
    const DEVICES: u32 = 10;
    let h = Harness::new(spec("quinn:resume"), DEVICES);
    let (client, server) = testing::every_order_stored_once(&h, DEVICES).await;
    for counts in [client, server] {
        assert_eq!(counts.resumed, 0, "{counts:?}");
    }
    // A device that closes its link and opens another resumes, on a server that never restarted.
    let h = Harness::new(spec("quinn:resume"), 1);
    let s = testing::links_closed_on_request_are_new_handshakes_each(&h, 3).await;
    assert_eq!(
        (s.resumed, s.sign, s.verify, s.x25519),
        (2, 1, 2, 6),
        "{s:?}"
    );
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
    let reason = tokio::time::timeout(Duration::from_secs(25), conn.conn.closed())
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_delivers_every_message_once_to_each_subscriber() {
    let counts = testing::every_message_delivered_once_to_each_subscriber(&harness(5)).await;
    assert_eq!(counts.received, 100, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos1_deliveries_never_acknowledged_go_again_on_the_next_connection() {
    testing::unacknowledged_qos1_goes_again_on_the_next_connection(
        &harness(2),
        QuinnConnector::new,
        opener,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_answered_whole_or_reset() {
    testing::streams_are_answered_whole_or_reset(&harness(1), QuinnConnector::new, opener).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_left_half_open_is_given_up_and_counted() {
    let h = harness(1);
    let server = h.server(any_port());
    // A real client Initial (quinn-proto's sans-IO endpoint), from a socket that never reads the server's answer.
    let tls = transport_tls::client_config(
        h.credentials(),
        0,
        Arc::new(Counters::default()),
        &[transport_conn::quic::ALPN],
    )
    .unwrap();
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut endpoint = quinn_proto::Endpoint::new(
        Arc::new(quinn_proto::EndpointConfig::default()),
        None,
        false,
        None,
    );
    let now = std::time::Instant::now();
    let config = quinn_proto::ClientConfig::new(Arc::new(crypto));
    let (_, mut conn) = endpoint
        .connect(now, config, server.addr, transport_tls::SERVER_NAME)
        .unwrap();
    let mut buf = Vec::new();
    let initial = conn.poll_transmit(now, 1, &mut buf).unwrap();
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.send_to(&buf[..initial.size], server.addr).unwrap();
    // quinn alone would wait for its 30 s idle timeout; the server gives up after HANDSHAKE_TIMEOUT.
    tokio::time::sleep(transport_conn::quic::HANDSHAKE_TIMEOUT + Duration::from_secs(1)).await;
    let s = server.kill().await;
    assert_eq!((s.timed_out, s.handshakes), (1, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_may_open_twice_its_window() {
    testing::a_device_may_open_twice_its_window(&harness(1), QuinnConnector::new, opener).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_reads_each_answer_to_its_streams_end() {
    // A quinn receiving stream dropped before its end was read sends the server STOP_SENDING: an order answered
    // costs its stream and nothing more on the wire.
    let h = harness(1);
    let (server, connector) = testing::server_and_connector(&h, QuinnConnector::new, 1);
    let conn = connector.connect(0).await.unwrap();
    for seq in 0..50 {
        let o = order(0, seq);
        let answer = connector.send_order(&conn, &o).await.unwrap();
        assert_eq!(answer, Answer::Stored(o.id));
    }
    // (A stream's FIN may go in a STREAM frame of its own, after the order's bytes: at least 50 of those.)
    let sent = conn.conn.stats().frame_tx;
    assert!(sent.stream >= 50, "{sent:?}");
    assert_eq!((sent.stop_sending, sent.reset_stream), (0, 0), "{sent:?}");
    connector.close(conn);
    let s = server.kill().await;
    assert_eq!(s.received, 50, "{s:?}");
}
