//! The scenarios: one hot path each, with fixed inputs and, where the code takes one, a seeded RNG.
//!
//! Every scenario builds its fixtures, then runs its step through a [`Meter`]; only what a step passes to
//! [`Section::measure`](crate::meter::Section::measure) is counted. Each step also checks its result (the record
//! opened, the packet decoded to what was encoded, the handshake completed), so a scenario that broke cannot count
//! a shortcut. `docs/performance.md` ("Instruction counts") says what each one includes and leaves out.

mod mqtt;
mod pure;
mod store;
mod tls;

pub use tls::write_pki;

use crate::meter::Meter;
use transport_pure::wire::Kind;

/// One measured hot path.
#[derive(Debug)]
pub struct Scenario {
    /// `area/operation[/variant]`: the key in results and baselines.
    pub name: &'static str,
    /// What one operation (one counted step) is.
    pub about: &'static str,
    /// Counted steps by default: enough to spread what varies, few enough to keep a run under valgrind short.
    pub iterations: u64,
    /// Operations one step does (the count per operation is the count per step divided by this).
    pub ops_per_step: u64,
    /// Build the fixtures and run the steps.
    pub run: fn(&Meter) -> anyhow::Result<()>,
}

/// Every scenario, in the order results are written.
pub static ALL: &[Scenario] = &[
    Scenario {
        name: "overhead/empty",
        about: "an empty measured section: the floor every other count includes",
        iterations: 500,
        ops_per_step: 1,
        run: |m| {
            m.run(|_, s| {
                s.measure(|| ());
                Ok(())
            })
        },
    },
    Scenario {
        name: "pure/sender/pure",
        about: "sender core, link keys: seal one 64-byte order into a datagram, then verify its answer",
        iterations: 200,
        ops_per_step: 1,
        run: |m| pure::sender(m, Kind::Link),
    },
    Scenario {
        name: "pure/sender/pure:hpke-session",
        about: "sender core, HPKE session set up: seal one 64-byte order, then verify its answer",
        iterations: 200,
        ops_per_step: 1,
        run: |m| pure::sender(m, Kind::HpkeSession),
    },
    Scenario {
        name: "pure/sender/pure:hpke-per-request",
        about: "sender core: an HPKE auth-mode setup (3 X25519), seal one 64-byte order, verify its answer",
        iterations: 50,
        ops_per_step: 1,
        run: |m| pure::sender(m, Kind::HpkePerRequest),
    },
    Scenario {
        name: "pure/sender/pure:plain",
        about: "sender core, no sealing: frame one 64-byte order, then take its answer",
        iterations: 200,
        ops_per_step: 1,
        run: |m| pure::sender(m, Kind::Plain),
    },
    Scenario {
        name: "pure/receiver/pure",
        about: "receiver core, link keys cached: open one record, build and tag its answer datagram",
        iterations: 200,
        ops_per_step: 1,
        run: |m| pure::receiver(m, Kind::Link),
    },
    Scenario {
        name: "pure/receiver/pure:hpke-session",
        about: "receiver core, session cached: open one record, build and tag its answer datagram",
        iterations: 200,
        ops_per_step: 1,
        run: |m| pure::receiver(m, Kind::HpkeSession),
    },
    Scenario {
        name: "pure/receiver/pure:hpke-per-request",
        about: "receiver core: an HPKE auth-mode setup (2 X25519), open one record, tag its answer",
        iterations: 50,
        ops_per_step: 1,
        run: |m| pure::receiver(m, Kind::HpkePerRequest),
    },
    Scenario {
        name: "pure/receiver/pure:plain",
        about: "receiver core, no sealing: parse one record, build its answer datagram",
        iterations: 200,
        ops_per_step: 1,
        run: |m| pure::receiver(m, Kind::Plain),
    },
    Scenario {
        name: "pure/sender/pure/10-per-datagram",
        about: "sender core, link keys: ten 64-byte orders sealed in one bundle, then their answer bundle; per order",
        iterations: 100,
        ops_per_step: pure::PER_DATAGRAM,
        run: |m| pure::sender_many(m, Kind::Link),
    },
    Scenario {
        name: "pure/sender/pure:hpke-session/10-per-datagram",
        about: "sender core, HPKE session: ten orders in one bundle, then their answer bundle; per order",
        iterations: 100,
        ops_per_step: pure::PER_DATAGRAM,
        run: |m| pure::sender_many(m, Kind::HpkeSession),
    },
    Scenario {
        name: "pure/sender/pure:plain/10-per-datagram",
        about: "sender core, no sealing: ten orders in one bundle, then their answer bundle; per order",
        iterations: 100,
        ops_per_step: pure::PER_DATAGRAM,
        run: |m| pure::sender_many(m, Kind::Plain),
    },
    Scenario {
        name: "pure/receiver/pure/10-per-datagram",
        about: "receiver core, link keys cached: open a bundle of ten orders, build and tag their answer bundle; \
                per order",
        iterations: 100,
        ops_per_step: pure::PER_DATAGRAM,
        run: |m| pure::receiver_many(m, Kind::Link),
    },
    Scenario {
        name: "pure/receiver/pure:hpke-session/10-per-datagram",
        about: "receiver core, session cached: a bundle of ten orders and their answer bundle; per order",
        iterations: 100,
        ops_per_step: pure::PER_DATAGRAM,
        run: |m| pure::receiver_many(m, Kind::HpkeSession),
    },
    Scenario {
        name: "pure/receiver/pure:plain/10-per-datagram",
        about: "receiver core, no sealing: a bundle of ten orders and their answer bundle; per order",
        iterations: 100,
        ops_per_step: pure::PER_DATAGRAM,
        run: |m| pure::receiver_many(m, Kind::Plain),
    },
    Scenario {
        name: "pure/crypto/seal-record",
        about: "AES-256-GCM seal of one record body (8-byte made time + 64-byte payload) with its header as AAD",
        iterations: 500,
        ops_per_step: 1,
        run: pure::seal_record,
    },
    Scenario {
        name: "pure/crypto/open-record",
        about: "AES-256-GCM open of that record body into a new buffer",
        iterations: 500,
        ops_per_step: 1,
        run: pure::open_record,
    },
    Scenario {
        name: "pure/crypto/hpke-setup-sender",
        about: "HPKE auth-mode sender setup and the two key exports (wire keys)",
        iterations: 50,
        ops_per_step: 1,
        run: pure::hpke_setup_sender,
    },
    Scenario {
        name: "pure/crypto/hpke-setup-receiver",
        about: "HPKE auth-mode receiver setup and the two key exports (wire keys)",
        iterations: 50,
        ops_per_step: 1,
        run: pure::hpke_setup_receiver,
    },
    Scenario {
        name: "mqtt/encode-publish",
        about: "encode a QoS 1 PUBLISH (topic orders/dev-0, 64-byte payload) into a reused buffer",
        iterations: 500,
        ops_per_step: 1,
        run: mqtt::encode_publish,
    },
    Scenario {
        name: "mqtt/decode-publish",
        about: "check, split off and decode that PUBLISH from a connection buffer (read_packet)",
        iterations: 500,
        ops_per_step: 1,
        run: mqtt::decode_publish,
    },
    Scenario {
        name: "store/append",
        about: "commit one 64-byte order, sync none: dedup, encode, CRC-32, one write (kernel side not counted)",
        iterations: 500,
        ops_per_step: 1,
        run: store::append,
    },
    Scenario {
        name: "tls/handshake/rustls/server",
        about: "server side of a full TLS 1.3 handshake with client certificates (rustls, counting aws-lc-rs)",
        iterations: 10,
        ops_per_step: 1,
        run: |m| tls::handshake(m, tls::Side::Server),
    },
    Scenario {
        name: "tls/handshake/rustls/client",
        about: "client side of a full TLS 1.3 handshake with client certificates (rustls, counting aws-lc-rs)",
        iterations: 10,
        ops_per_step: 1,
        run: |m| tls::handshake(m, tls::Side::Client),
    },
];

/// The scenario called `name`.
pub fn find(name: &str) -> Option<&'static Scenario> {
    ALL.iter().find(|s| s.name == name)
}
