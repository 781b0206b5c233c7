//! The checks every transport's tests run (`transport_conn::testing`), against each Pure variant over real UDP on
//! 127.0.0.1 with a real store: every order stored and reported exactly once, nothing lost or applied twice across a
//! killed and restarted receiver. Pure has no handshake, so none is counted.

use transport_conn::testing::{self, Harness};

fn harness(spec: &str, devices: u32) -> Harness {
    Harness::new(Box::new(transport_pure::variant(spec).unwrap()), devices)
}

const VARIANTS: [&str; 4] = ["pure", "pure:no-memo", "pure:hpke-session", "pure:plain"];

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
            "pure:plain" => assert_eq!(server.asym_ops(), 0, "{spec}: {server:?}"),
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
