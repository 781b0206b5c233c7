//! Devices as they are: each device of a Pure fleet sends from a socket of its own (its own source address), and
//! the receiver never packs answers for devices on different addresses into one datagram. The `+shared-sockets`
//! variants, a named comparison, put many devices behind one address. Real UDP sockets on 127.0.0.1 for the fleet;
//! the receiver's batching is checked on its sans-IO core.

use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;
use transport_core::{Counters, FleetConfig, Order, OrderId, Transport};
use transport_pure::client::MAX_SHARED_SOCKETS;
use transport_pure::wire::{self, Frame, KeyId, Kind};

mod common;
use common::Keys;

/// The source addresses each device's records came from, for a fleet of `devices` devices of `spec` that sends
/// one order per device to a bare UDP socket standing in for the receiver (which never answers).
async fn sources(spec: &str, devices: u32) -> HashMap<KeyId, HashSet<SocketAddr>> {
    let pure = transport_pure::variant(spec).unwrap();
    let dir = tempfile::tempdir().unwrap();
    pure.prepare(dir.path(), devices).unwrap();
    let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let (events, _events_rx) = transport_core::events::channel();
    let fleet = pure
        .fleet(FleetConfig {
            server: server.local_addr().unwrap(),
            identity: dir.path().to_path_buf(),
            first: 0,
            devices,
            events,
            counters: Arc::new(Counters::default()),
        })
        .await
        .unwrap();
    for d in 0..devices {
        let id = OrderId {
            sender: transport_core::sender_id(&transport_core::device_name(d)),
            run: 1,
            seq: 0,
        };
        fleet.send(
            d,
            Order {
                id,
                made_us: 1,
                payload: vec![7; 16],
            },
        );
    }
    let mut seen: HashMap<KeyId, HashSet<SocketAddr>> = HashMap::new();
    let mut buf = vec![0u8; 2048];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seen.len() < devices as usize {
        let Ok(Ok((n, from))) = tokio::time::timeout_at(deadline, server.recv_from(&mut buf)).await
        else {
            panic!(
                "{spec}: records of {} of {devices} devices arrived",
                seen.len()
            );
        };
        for frame in wire::frames(&buf[..n]) {
            seen.entry(frame.unwrap().key_id())
                .or_default()
                .insert(from);
        }
    }
    fleet.close().await;
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_device_sends_from_its_own_address_unless_sockets_are_shared() {
    const DEVICES: u32 = 40;
    for spec in ["pure", "pure:plain"] {
        let seen = sources(spec, DEVICES).await;
        let addrs: HashSet<SocketAddr> = seen.values().flatten().copied().collect();
        assert!(seen.values().all(|a| a.len() == 1), "{spec}: {seen:?}");
        assert_eq!(
            addrs.len(),
            DEVICES as usize,
            "{spec}: one address per device"
        );
    }
    let seen = sources("pure:plain+shared-sockets", DEVICES).await;
    let addrs: HashSet<SocketAddr> = seen.values().flatten().copied().collect();
    assert_eq!(
        addrs.len(),
        MAX_SHARED_SOCKETS,
        "shared: {MAX_SHARED_SOCKETS} sockets"
    );
}

/// Each of `senders` devices sends `orders` orders from `addr_of(device)`; the receiver stores them all and answers.
/// Returns every datagram the receiver sent: its destination and the key ids of its frames.
fn answers(
    kind: Kind,
    senders: usize,
    orders: u64,
    addr_of: impl Fn(usize) -> SocketAddr,
) -> (Keys, Vec<(SocketAddr, Vec<KeyId>)>) {
    let mut rng = StdRng::seed_from_u64(11);
    let keys = Keys::new(senders, &mut rng);
    let counters = Arc::new(Counters::default());
    let mut receiver = keys.receiver(kind, 1, 64, &counters);
    let now = Instant::now();
    let mut buf = Vec::new();
    for i in 0..senders {
        let mut s = keys.sender(kind, i, i as u64 + 1, &counters);
        for seq in 0..orders {
            let id = OrderId {
                sender: i as u64,
                run: i as u64 + 1,
                seq,
            };
            s.push(
                now,
                Order {
                    id,
                    made_us: 1,
                    payload: vec![1; 16],
                },
            );
        }
        while s.poll_transmit(now, &mut buf) {
            receiver.handle(now, addr_of(i), &buf);
        }
    }
    // One group commits every order; the answers of all devices are queued together, as the server does.
    let (opened, replies) = receiver.take_deliveries();
    assert_eq!(opened.len() as u64, senders as u64 * orders);
    for r in replies {
        receiver.answer(r);
    }
    let mut sent = Vec::new();
    while let Some(to) = receiver.poll_transmit(now, &mut buf) {
        // The key id of every answer: an answer bundle's for each order it answers.
        let ids = wire::frames(&buf)
            .flat_map(|f| match f.unwrap() {
                Frame::AnswerBundle(b) => vec![b.key_id; b.len()],
                f => vec![f.key_id()],
            })
            .collect();
        sent.push((to, ids));
    }
    (keys, sent)
}

#[test]
fn answers_for_devices_on_different_addresses_never_share_a_datagram() {
    let addr = |i: usize| -> SocketAddr { format!("10.0.2.{}:4000", i + 1).parse().unwrap() };
    for kind in [Kind::Link, Kind::Plain] {
        let (keys, sent) = answers(kind, 8, 5, addr);
        assert_eq!(sent.len(), 8, "{kind:?}: one datagram per device");
        for (to, ids) in &sent {
            let i = (0..8).find(|&i| addr(i) == *to).expect("sent to a device");
            let own = wire::key_id(keys.devices[i].public());
            assert_eq!(ids.len(), 5, "{kind:?}");
            assert!(
                ids.iter().all(|id| *id == own),
                "{kind:?}: only {to}'s own answers"
            );
        }
    }
    // Devices behind one address (shared sockets) get their answers packed together.
    let one: SocketAddr = "10.0.2.1:4000".parse().unwrap();
    let (_, sent) = answers(Kind::Plain, 8, 5, |_| one);
    assert!(sent.len() < 8 && sent.iter().all(|(to, _)| *to == one));
    assert!(sent[0].1.iter().collect::<HashSet<_>>().len() > 1);
}
