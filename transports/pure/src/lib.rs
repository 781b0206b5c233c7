//! Pure sealed links: a connectionless transport over UDP with no handshake.
//!
//! Every node has a static X25519 key. A device's first datagram is already a sealed record; the receiver stores
//! the order durably, applies it once, and answers "stored". Nothing a restart can lose is needed to go on. The
//! receiver also relays published messages to subscribed devices, sealed on each device's own link.
//!
//! - [`wire`]: the datagram format (records, deliveries and answers), parsed without keys.
//! - [`crypto`]: node keys, the key schedule of every variant, seal and open.
//! - [`senders`]: the allow-list of senders a receiver takes records from.
//! - [`memo`]: link secrets remembered across restarts in a mapped file beside the node key.
//! - [`receiver`] and [`sender`]: the sans-IO protocol cores, driven with an explicit `now`; [`relay`] is the
//!   receiver's publish/subscribe part, [`flow`] the re-send timer and windows both ends share, [`cache`] bounds
//!   what the receiver keeps.
//! - [`server`] and [`client`]: thin UDP drivers around the cores (tokio).
//!
//! The variants (`pure`, `pure:no-memo`, `pure:hpke-session`, `pure:hpke-per-request`, `pure:plain`) share the
//! framing, the drivers and the store; they differ only in how a record is sealed. Each device has its own UDP
//! socket; every variant's `+shared-sockets` form lets its devices share 16 ([`client::Sockets`]). `docs/pure.md` is the
//! specification.

pub mod cache;
pub mod client;
pub mod crypto;
pub mod flow;
pub mod memo;
pub mod receiver;
pub mod relay;
pub mod sender;
pub mod senders;
pub mod server;
pub mod wire;

pub use crate::client::Sockets;
use crate::crypto::NodeKey;
use crate::receiver::{InMemorySecrets, Receiver, ReceiverConfig};
use crate::sender::SenderConfig;
use crate::senders::{AllowList, AllowedSender};
use crate::wire::Kind;
use rand::rngs::StdRng;
use rand::Rng;
use std::path::Path;
use transport_core::{
    device_name, keys, sender_id, AsymCosts, BoxFuture, Capabilities, Fleet, FleetConfig,
    MemorySource, Ready, ServeConfig, Spec, Support, Transport, TransportError,
};

/// The variants this crate provides. Each seals in its own way; each has a `+shared-sockets` form whose devices
/// share at most [`client::MAX_SHARED_SOCKETS`] sockets (a comparison: by default every device has its own).
pub const SPECS: &[Spec] = &[
    Spec {
        name: "pure",
        about: "link secret from the two static X25519 keys, per-run keys, no handshake",
        make: || Box::new(Pure::new(Kind::Link, true)),
    },
    Spec {
        name: "pure:no-memo",
        about: "as `pure`, link secrets not remembered: one X25519 per returning sender after a restart",
        make: || Box::new(Pure::new(Kind::Link, false)),
    },
    Spec {
        name: "pure:hpke-session",
        about: "one HPKE auth-mode session per wire, records sealed by number",
        make: || Box::new(Pure::new(Kind::HpkeSession, false)),
    },
    Spec {
        name: "pure:hpke-per-request",
        about: "a fresh HPKE auth-mode setup for every record (the baseline)",
        make: || Box::new(Pure::new(Kind::HpkePerRequest, false)),
    },
    Spec {
        name: "pure:plain",
        about: "the same framing and store, no sealing (the ceiling)",
        make: || Box::new(Pure::new(Kind::Plain, false)),
    },
    Spec {
        name: "pure+shared-sockets",
        about: "as `pure`, the devices sharing 16 sockets: answers for many devices packed in one datagram",
        make: || Box::new(Pure::new(Kind::Link, true).with_sockets(Sockets::Shared)),
    },
    Spec {
        name: "pure:no-memo+shared-sockets",
        about: "as `pure:no-memo`, the devices sharing 16 sockets",
        make: || Box::new(Pure::new(Kind::Link, false).with_sockets(Sockets::Shared)),
    },
    Spec {
        name: "pure:hpke-session+shared-sockets",
        about: "as `pure:hpke-session`, the devices sharing 16 sockets",
        make: || Box::new(Pure::new(Kind::HpkeSession, false).with_sockets(Sockets::Shared)),
    },
    Spec {
        name: "pure:hpke-per-request+shared-sockets",
        about: "as `pure:hpke-per-request`, the devices sharing 16 sockets",
        make: || Box::new(Pure::new(Kind::HpkePerRequest, false).with_sockets(Sockets::Shared)),
    },
    Spec {
        name: "pure:plain+shared-sockets",
        about: "as `pure:plain`, the devices sharing 16 sockets",
        make: || Box::new(Pure::new(Kind::Plain, false).with_sockets(Sockets::Shared)),
    },
    Spec {
        name: "pure+records",
        about: "as `pure`, every order a record of its own with its own seal and answer (no bundles)",
        make: || Box::new(Pure::new(Kind::Link, true).with_records()),
    },
    Spec {
        name: "pure:hpke-session+records",
        about: "as `pure:hpke-session`, every order a record of its own (no bundles)",
        make: || Box::new(Pure::new(Kind::HpkeSession, false).with_records()),
    },
    Spec {
        name: "pure:plain+records",
        about: "as `pure:plain`, every order a record of its own (no bundles)",
        make: || Box::new(Pure::new(Kind::Plain, false).with_records()),
    },
];

/// Every variant: its spec, how it seals, whether it remembers link secrets, how its devices get sockets, whether
/// they send orders in bundles.
const VARIANTS: [(&str, Kind, bool, Sockets, bool); 13] = [
    ("pure", Kind::Link, true, Sockets::PerDevice, true),
    ("pure:no-memo", Kind::Link, false, Sockets::PerDevice, true),
    (
        "pure:hpke-session",
        Kind::HpkeSession,
        false,
        Sockets::PerDevice,
        true,
    ),
    (
        "pure:hpke-per-request",
        Kind::HpkePerRequest,
        false,
        Sockets::PerDevice,
        false,
    ),
    ("pure:plain", Kind::Plain, false, Sockets::PerDevice, true),
    (
        "pure+shared-sockets",
        Kind::Link,
        true,
        Sockets::Shared,
        true,
    ),
    (
        "pure:no-memo+shared-sockets",
        Kind::Link,
        false,
        Sockets::Shared,
        true,
    ),
    (
        "pure:hpke-session+shared-sockets",
        Kind::HpkeSession,
        false,
        Sockets::Shared,
        true,
    ),
    (
        "pure:hpke-per-request+shared-sockets",
        Kind::HpkePerRequest,
        false,
        Sockets::Shared,
        false,
    ),
    (
        "pure:plain+shared-sockets",
        Kind::Plain,
        false,
        Sockets::Shared,
        true,
    ),
    ("pure+records", Kind::Link, true, Sockets::PerDevice, false),
    (
        "pure:hpke-session+records",
        Kind::HpkeSession,
        false,
        Sockets::PerDevice,
        false,
    ),
    (
        "pure:plain+records",
        Kind::Plain,
        false,
        Sockets::PerDevice,
        false,
    ),
];

/// File names in the identity directory.
pub mod files {
    /// The receiver's secret key (64 hex digits, mode 0600).
    pub const NODE_KEY: &str = "node.key";
    /// The receiver's public key (64 hex digits).
    pub const NODE_PUB: &str = "node.pub";
    /// The allowed senders, `NAME=KEY` lines.
    pub const SENDERS: &str = "senders";
    /// The devices' secret keys, one hex line per device in device order (mode 0600).
    pub const DEVICE_KEYS: &str = "devices.keys";
}

/// Pure in one configuration.
#[derive(Debug, Clone)]
pub struct Pure {
    spec: &'static str,
    kind: Kind,
    memo: bool,
    sockets: Sockets,
    /// Whether devices send orders in bundles ([`SenderConfig::bundles`]).
    bundles: bool,
    /// Allowed senders given to the server (`NAME=KEY`, or `@FILE` for a file of such lines); empty: the list in
    /// the identity directory.
    senders: Vec<String>,
}

/// The variant for a spec such as `pure:plain`, or `None` if the spec is not a Pure variant.
pub fn variant(spec: &str) -> Option<Pure> {
    VARIANTS
        .iter()
        .find(|v| v.0 == spec)
        .map(|&(_, kind, memo, sockets, bundles)| {
            let pure = Pure::new(kind, memo).with_sockets(sockets);
            if bundles {
                pure
            } else {
                pure.with_records()
            }
        })
}

fn identity_err(e: impl std::fmt::Display) -> TransportError {
    TransportError::Identity(e.to_string())
}

impl Pure {
    /// The variant sealing with `kind`, remembering link secrets in the memo if `memo` (only `Kind::Link` can), each
    /// device on its own socket.
    pub fn new(kind: Kind, memo: bool) -> Pure {
        Pure {
            spec: "",
            kind,
            memo: memo && kind == Kind::Link,
            sockets: Sockets::PerDevice,
            bundles: kind.bundles(),
            senders: Vec::new(),
        }
        .with_sockets(Sockets::PerDevice)
    }

    /// The same variant with its devices' sockets as `sockets` says.
    pub fn with_sockets(mut self, sockets: Sockets) -> Pure {
        self.sockets = sockets;
        self.name()
    }

    /// The same variant with every order a record of its own, sealed and answered alone (no bundles).
    pub fn with_records(mut self) -> Pure {
        self.bundles = false;
        self.name()
    }

    fn name(mut self) -> Pure {
        let key = (self.kind, self.memo, self.sockets, self.bundles);
        self.spec = VARIANTS
            .iter()
            .find(|v| (v.1, v.2, v.3, v.4) == key)
            .expect("every combination is a variant")
            .0;
        self
    }

    /// The server takes records only from these senders (`NAME=KEY`, or `@FILE` for a file of such lines) instead
    /// of the identity directory's list (seed 003's `--sender NAME=KEY`).
    pub fn with_senders(mut self, senders: Vec<String>) -> Pure {
        self.senders = senders;
        self
    }

    /// How this variant seals its records.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Whether this variant remembers link secrets across restarts.
    pub fn memo(&self) -> bool {
        self.memo
    }

    /// How this variant's devices get their sockets.
    pub fn sockets(&self) -> Sockets {
        self.sockets
    }

    /// Whether this variant's devices send orders in bundles.
    pub fn bundles(&self) -> bool {
        self.bundles
    }

    /// The keys of devices `first..first + devices`.
    fn load_device_keys(
        dir: &Path,
        first: u32,
        devices: u32,
    ) -> Result<Vec<NodeKey>, TransportError> {
        let path = dir.join(files::DEVICE_KEYS);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| identity_err(format!("{}: {e}", path.display())))?;
        let keys = text
            .lines()
            .enumerate()
            .skip(first as usize)
            .take(devices as usize)
            .map(|(i, line)| {
                keys::parse_key32(line.trim())
                    .map(NodeKey::from_secret)
                    .map_err(|e| identity_err(format!("{} line {}: {e}", path.display(), i + 1)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.len() < devices as usize {
            return Err(identity_err(format!(
                "{} has keys for {} devices, devices {first}..{} asked for",
                path.display(),
                text.lines().count(),
                u64::from(first) + u64::from(devices)
            )));
        }
        Ok(keys)
    }
}

impl Transport for Pure {
    fn spec(&self) -> &str {
        self.spec
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            stored_answers: Support::Yes,
            handshakes: Support::No("Pure has no handshake: a sender's first record is already sealed"),
            disconnect: Support::No(
                "a Pure link is connectionless: there is nothing to close, a device simply stops sending",
            ),
            pubsub: Support::Yes,
            memory: MemorySource::Rss,
        }
    }

    fn prepare(&self, dir: &Path, devices: u32) -> Result<(), TransportError> {
        std::fs::create_dir_all(dir)?;
        let mut rng: StdRng = rand::make_rng();
        let node = NodeKey::generate(&mut rng);
        node.save(&dir.join(files::NODE_KEY))
            .map_err(identity_err)?;
        keys::write_public(
            &dir.join(files::NODE_PUB),
            hex::encode(node.public()).as_bytes(),
        )
        .map_err(identity_err)?;
        let mut secrets = String::with_capacity(devices as usize * 65);
        let mut allowed = Vec::with_capacity(devices as usize);
        for n in 0..devices {
            let mut secret = [0u8; 32];
            rng.fill_bytes(&mut secret);
            let key = NodeKey::from_secret(secret);
            secrets.push_str(&hex::encode(secret));
            secrets.push('\n');
            let name = device_name(n);
            allowed.push(AllowedSender {
                sender_id: sender_id(&name),
                name,
                public: *key.public(),
            });
        }
        keys::write_secret(&dir.join(files::DEVICE_KEYS), secrets.as_bytes())
            .map_err(identity_err)?;
        let list = AllowList::new(allowed).map_err(identity_err)?;
        keys::write_public(&dir.join(files::SENDERS), list.to_text().as_bytes())
            .map_err(identity_err)?;
        Ok(())
    }

    fn serve(&self, config: ServeConfig) -> BoxFuture<'static, Result<(), TransportError>> {
        let (kind, memo, given) = (self.kind, self.memo, self.senders.clone());
        Box::pin(async move {
            let node =
                NodeKey::load(&config.identity.join(files::NODE_KEY)).map_err(identity_err)?;
            let senders = if given.is_empty() {
                AllowList::load(&config.identity.join(files::SENDERS))
            } else {
                AllowList::from_args(&given)
            }
            .map_err(identity_err)?;
            let socket = tokio::net::UdpSocket::bind(config.listen).await?;
            transport_core::net::set_buffers(&socket, 16 << 20)?;
            let mut run = 0;
            while run == 0 {
                run = rand::rng().next_u64();
            }
            let public_key = hex::encode(node.public());
            let secrets: Box<dyn receiver::LinkSecrets> = if memo && kind == Kind::Link {
                let path = memo::path_for(&config.identity.join(files::NODE_KEY));
                Box::new(
                    memo::Memo::open(&path, &node, senders.len())
                        .map_err(|e| identity_err(format!("{}: {e}", path.display())))?,
                )
            } else {
                Box::new(InMemorySecrets::default())
            };
            let receiver = Receiver::new(
                ReceiverConfig {
                    kind,
                    key: node,
                    senders,
                    run,
                    session_capacity: 65_536,
                    secrets,
                    relay: relay::RelayConfig::default(),
                    rng: rand::make_rng(),
                },
                config.counters.clone(),
            );
            let _ = config
                .ready
                .send(Ready::new(socket.local_addr()?, public_key));
            server::run(socket, receiver, config.store).await
        })
    }

    /// The receiver's X25519 (a new sender's link secret, or an HPKE setup's; x25519-dalek either way): one
    /// agreement with a peer's static key, as [`NodeKey::agree`] does it.
    fn asym_costs(&self) -> Option<AsymCosts> {
        let mut rng: StdRng = rand::make_rng();
        let (ours, theirs) = (NodeKey::generate(&mut rng), NodeKey::generate(&mut rng));
        let peer = *theirs.public();
        ours.agree(&peer).ok()?;
        let x25519 = AsymCosts::time(|| {
            let _ = std::hint::black_box(ours.agree(std::hint::black_box(&peer)));
        })?;
        Some(AsymCosts {
            x25519_us: Some(x25519),
            ..AsymCosts::default()
        })
    }

    fn fleet(
        &self,
        config: FleetConfig,
    ) -> BoxFuture<'static, Result<Box<dyn Fleet>, TransportError>> {
        let (kind, sockets, bundles) = (self.kind, self.sockets, self.bundles);
        Box::pin(async move {
            let receiver =
                keys::read_key32(&config.identity.join(files::NODE_PUB)).map_err(identity_err)?;
            let device_keys =
                Pure::load_device_keys(&config.identity, config.first, config.devices)?;
            let fleet = client::PureFleet::start(
                config.server,
                receiver,
                config.first,
                device_keys,
                SenderConfig {
                    bundles,
                    ..SenderConfig::new(kind)
                },
                sockets,
                config.events,
                config.counters,
            )
            .await?;
            Ok(Box::new(fleet) as Box<dyn Fleet>)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_is_a_variant_and_devices_have_their_own_sockets_unless_named() {
        assert_eq!(SPECS.len(), VARIANTS.len());
        for s in SPECS {
            let made = (s.make)();
            let found = variant(s.name).expect("every spec is found by name");
            assert_eq!((made.spec(), found.spec()), (s.name, s.name));
            let shared = s.name.ends_with("+shared-sockets");
            assert_eq!(found.sockets() == Sockets::Shared, shared, "{}", s.name);
            let records = s.name.ends_with("+records");
            assert_eq!(
                found.bundles(),
                !records && found.kind().bundles(),
                "{}",
                s.name
            );
            let base = variant(
                s.name
                    .trim_end_matches("+shared-sockets")
                    .trim_end_matches("+records"),
            )
            .unwrap();
            assert_eq!((found.kind(), found.memo()), (base.kind(), base.memo()));
        }
        assert_eq!(Sockets::PerDevice.count(10_000), 10_000);
        assert_eq!(Sockets::Shared.count(10_000), client::MAX_SHARED_SOCKETS);
        assert_eq!(Sockets::Shared.count(3), 3);
        assert!(variant("pure+shared").is_none());
    }
}
