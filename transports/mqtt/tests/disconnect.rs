//! Closing a link on request, as handshake-rate does it, against the in-tree broker (with each TLS crypto choice)
//! and against a real mosquitto: the client sends DISCONNECT and the broker closes the connection first (a close
//! that does not come within 5 s fails `Fleet::disconnect`); each new link is a new full handshake.

use transport_conn::testing::{self, Harness};
use transport_mqtt::mosquitto::{find_binary, INSTALL_HINT};

fn spec(name: &str) -> Harness {
    let make = transport_mqtt::SPECS
        .iter()
        .find(|s| s.name == name)
        .unwrap()
        .make;
    Harness::new(make(), 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_tree_broker_closes_first_after_disconnect_and_each_link_is_a_full_handshake() {
    let c = testing::links_closed_on_request_are_new_handshakes_each(&spec("mqtt"), 3).await;
    assert_eq!((c.x25519, c.ecdh, c.sign, c.verify), (6, 0, 3, 6), "{c:?}");
    for name in ["mqtt:p256", "mqtt:p256-rustcrypto"] {
        let c = testing::links_closed_on_request_are_new_handshakes_each(&spec(name), 3).await;
        assert_eq!(
            (c.x25519, c.ecdh, c.sign, c.verify),
            (0, 6, 3, 6),
            "{name}: {c:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_closes_first_after_disconnect() {
    if find_binary("mosquitto").is_none() {
        assert!(
            std::env::var_os("LB_SKIP_MOSQUITTO").is_some(),
            "mosquitto not found: {INSTALL_HINT} (or set LB_SKIP_MOSQUITTO=1 to skip)"
        );
        eprintln!("SKIPPED: mosquitto not found");
        return;
    }
    testing::links_closed_on_request_are_new_handshakes_each(&spec("mqtt@mosquitto"), 3).await;
}

/// A broker that takes the DISCONNECT and then keeps the connection open: the client must have sent DISCONNECT (not
/// just dropped the connection), must wait for the server to close first, and after 5 s must report that it did not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_does_not_close_after_disconnect_is_an_error_and_disconnect_was_sent() {
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use transport_conn::fleet::Connector;
    use transport_core::Counters;
    use transport_mqtt::client::{MqttStream, OrderConnector};
    use transport_mqtt::codec::{ConnAck, ConnectReturnCode, Packet, PacketType};
    use transport_tls::{ClientTls, DeviceCredentials};

    let dir = tempfile::tempdir().unwrap();
    transport_tls::write_pki(dir.path(), 1).unwrap();
    let counters = Arc::new(Counters::default());
    let server_tls = transport_tls::server_config(dir.path(), counters.clone(), &[]).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let tls = tokio_rustls::TlsAcceptor::from(server_tls)
            .accept(tcp)
            .await
            .unwrap();
        let mut s = MqttStream::new(tls);
        assert!(matches!(s.recv().await.unwrap(), Packet::Connect(_)));
        let ack = ConnAck {
            session_present: false,
            code: ConnectReturnCode::Accepted,
        };
        s.send(&Packet::ConnAck(ack)).await.unwrap();
        let goodbye = s.recv().await;
        // Hold the connection open well past the client's wait; then report what arrived.
        tokio::time::sleep(Duration::from_secs(7)).await;
        goodbye.map(|p| p.packet_type())
    });
    let credentials = Arc::new(DeviceCredentials::load(dir.path()).unwrap());
    let tls = ClientTls::new(credentials, counters, &[]).unwrap();
    let connector = OrderConnector::new(addr, tls);
    let conn = connector.connect(0).await.unwrap();
    let t0 = Instant::now();
    let result = connector.disconnect(conn).await;
    let waited = t0.elapsed();
    assert!(result.is_err(), "{result:?}");
    assert!(
        waited >= transport_mqtt::client::SERVER_CLOSE_WAIT,
        "{waited:?}"
    );
    let got = server
        .await
        .unwrap()
        .expect("a packet, not a dropped connection");
    assert!(matches!(got, PacketType::Disconnect), "{got:?}");
}
