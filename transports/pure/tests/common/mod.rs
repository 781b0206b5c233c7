//! What the Pure tests share: a receiver's key, its allowed devices and a receiver built from them.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::Arc;
use transport_core::Counters;
use transport_pure::crypto::NodeKey;
use transport_pure::receiver::{InMemorySecrets, Receiver, ReceiverConfig};
use transport_pure::sender::{Sender, SenderConfig};
use transport_pure::senders::{AllowList, AllowedSender};
use transport_pure::wire::Kind;

/// A receiver's key and `n` allowed devices (`dev-i`, sender id `i`), from a seed.
pub struct Keys {
    pub node: NodeKey,
    pub devices: Vec<NodeKey>,
    pub allow: AllowList,
}

impl Keys {
    pub fn new(n: usize, rng: &mut StdRng) -> Keys {
        let node = NodeKey::generate(rng);
        let devices: Vec<NodeKey> = (0..n).map(|_| NodeKey::generate(rng)).collect();
        let allow = AllowList::new(
            devices
                .iter()
                .enumerate()
                .map(|(i, k)| AllowedSender {
                    name: format!("dev-{i}"),
                    sender_id: i as u64,
                    public: *k.public(),
                })
                .collect(),
        )
        .unwrap();
        Keys {
            node,
            devices,
            allow,
        }
    }

    /// A receiver of `kind` for run `run`, its link secrets in memory, caches of `capacity` entries.
    pub fn receiver(
        &self,
        kind: Kind,
        run: u64,
        capacity: usize,
        counters: &Arc<Counters>,
    ) -> Receiver {
        Receiver::new(
            ReceiverConfig {
                kind,
                key: self.node.clone(),
                senders: self.allow.clone(),
                run,
                session_capacity: capacity,
                secrets: Box::new(InMemorySecrets::default()),
            },
            counters.clone(),
        )
    }

    /// Device `i`'s sender, with its own seeded RNG.
    pub fn sender(&self, kind: Kind, i: usize, seed: u64, counters: &Arc<Counters>) -> Sender {
        Sender::new(
            SenderConfig::new(kind),
            self.devices[i].clone(),
            *self.node.public(),
            StdRng::seed_from_u64(seed),
            counters.clone(),
        )
        .unwrap()
    }
}
