//! Feeds arbitrary datagrams to the frame parser and to a receiver and a sender of every kind.
//! Run with `cargo fuzz run datagram` from transports/pure (nightly toolchain).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use transport_core::Counters;
use transport_pure::crypto::NodeKey;
use transport_pure::receiver::{InMemorySecrets, Receiver, ReceiverConfig};
use transport_pure::relay::RelayConfig;
use transport_pure::sender::{Sender, SenderConfig};
use transport_pure::senders::{AllowList, AllowedSender};
use transport_pure::wire::{self, Kind};

struct Fixture {
    node: NodeKey,
    device: NodeKey,
    allow: AllowList,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let node = NodeKey::from_secret([1; 32]);
        let device = NodeKey::from_secret([2; 32]);
        let allow = AllowList::new(vec![AllowedSender { name: "dev-0".into(), sender_id: 0, public: *device.public() }])
            .unwrap();
        Fixture { node, device, allow }
    })
}

fuzz_target!(|data: &[u8]| {
    for f in wire::frames(data) {
        let _ = f;
    }
    let fx = fixture();
    for kind in [Kind::Plain, Kind::HpkeSession, Kind::HpkePerRequest, Kind::Link] {
        let mut r = Receiver::new(
            ReceiverConfig {
                kind,
                key: fx.node.clone(),
                senders: fx.allow.clone(),
                run: 1,
                session_capacity: 4,
                secrets: Box::new(InMemorySecrets::default()),
                relay: RelayConfig::default(),
                rng: rand::SeedableRng::seed_from_u64(0),
            },
            Arc::new(Counters::default()),
        );
        let now = Instant::now();
        r.handle(now, "127.0.0.1:1".parse().unwrap(), data);
        let _ = r.take_deliveries();
        let mut out = Vec::new();
        while r.poll_transmit(now, &mut out).is_some() {}
        let rng = rand::SeedableRng::seed_from_u64(0);
        let mut s = Sender::new(SenderConfig::new(kind), fx.device.clone(), *fx.node.public(), rng, Arc::new(Counters::default())).unwrap();
        s.handle(Instant::now(), data);
    }
});
