//! Pure actors for the fuzz targets: one receiver key, three allowed devices and one device the receiver does not
//! know, all with fixed keys so that an input replays exactly; the receiver's relay with small bounds.

use rand::rngs::StdRng;
use rand::SeedableRng;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use transport_core::Counters;
use transport_pure::crypto::NodeKey;
use transport_pure::receiver::{InMemorySecrets, Receiver, ReceiverConfig};
use transport_pure::relay::RelayConfig;
use transport_pure::sender::{Sender, SenderConfig};
use transport_pure::senders::{AllowList, AllowedSender};
use transport_pure::wire::Kind;

/// Every record kind, one per sealed variant and the plain one.
pub const KINDS: [Kind; 4] = [
    Kind::Plain,
    Kind::HpkeSession,
    Kind::HpkePerRequest,
    Kind::Link,
];
/// Devices on the receiver's allow-list (`dev-0` .. `dev-2`, sender ids 0 .. 2).
pub const ALLOWED: usize = 3;
/// All devices: the allowed ones and one unknown to the receiver (the last).
pub const DEVICES: usize = ALLOWED + 1;
/// HPKE sessions the receiver keeps: small, so that inputs reach eviction.
pub const SESSION_CAPACITY: usize = 2;
/// Channels the fuzz targets use (`0..CHANNELS`).
pub const CHANNELS: u32 = 3;

/// The relay's bounds: small, so that inputs reach them (a device may subscribe to fewer channels than it can name).
pub fn relay_config() -> RelayConfig {
    RelayConfig {
        held: 4,
        waiting0: 2,
        channels: 2,
        deadline0: Duration::from_secs(1),
        expire: Duration::from_secs(15),
        ..RelayConfig::default()
    }
}

/// Device `device`'s address (one more, `DEVICES`, is a stranger's).
pub fn addr(device: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, device as u8 + 1], 4000))
}

/// The fixed keys.
pub struct Fixture {
    /// The receiver's key.
    pub node: NodeKey,
    /// Device keys, index = device number; the last is not on the allow-list.
    pub devices: Vec<NodeKey>,
    /// The receiver's allow-list.
    pub allow: AllowList,
}

/// The keys, made once per process.
pub fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let node = NodeKey::from_secret([0x11; 32]);
        let devices: Vec<NodeKey> = (0..DEVICES)
            .map(|i| NodeKey::from_secret([0x20 + i as u8; 32]))
            .collect();
        let allow = AllowList::new(
            devices[..ALLOWED]
                .iter()
                .enumerate()
                .map(|(i, k)| AllowedSender {
                    name: format!("dev-{i}"),
                    sender_id: i as u64,
                    public: *k.public(),
                })
                .collect(),
        )
        .expect("distinct fixed keys");
        Fixture {
            node,
            devices,
            allow,
        }
    })
}

/// A receiver of `kind` for run `run`, with secrets kept in memory.
pub fn receiver(kind: Kind, run: u64, counters: Arc<Counters>) -> Receiver {
    let fx = fixture();
    Receiver::new(
        ReceiverConfig {
            kind,
            key: fx.node.clone(),
            senders: fx.allow.clone(),
            run,
            session_capacity: SESSION_CAPACITY,
            secrets: Box::new(InMemorySecrets::default()),
            relay: relay_config(),
            rng: StdRng::seed_from_u64(run),
        },
        counters,
    )
}

/// Device `device`'s sender of `kind`, its randomness seeded with `seed`.
pub fn sender(kind: Kind, device: usize, seed: u64) -> Sender {
    let fx = fixture();
    Sender::new(
        SenderConfig::new(kind),
        fx.devices[device].clone(),
        *fx.node.public(),
        StdRng::seed_from_u64(seed),
        Arc::new(Counters::default()),
    )
    .expect("the fixed receiver key is a valid public key")
}
