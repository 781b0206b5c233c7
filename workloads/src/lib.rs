//! The workloads of the suite, the run harness they share, their results, and the link emulator.
//!
//! A workload is one file: a type implementing [`Workload`] (its name, typed parameters per profile, the metrics
//! and table columns it produces, what it needs from a transport, and `run`), registered by one line in [`ALL`].
//! The [`harness`] owns everything around a run: directories, the server process, the fleet, waiting for answers
//! until a deadline, the audit and the clean-up.
//!
//! - [`workload`]: the [`Workload`] trait and the data a workload declares ([`Info`]).
//! - [`harness`]: an invocation's settings ([`Harness`]) and one [`Run`](harness::Run).
//! - [`params`]: `--param KEY=VALUE` overrides and sweeps.
//! - [`drain`], [`restart`], [`first_contact`], [`handshake_rate`], [`idle_links`], [`fanout`], [`flood`],
//!   [`moderate_rate`]: the workloads; [`pubsub`]: what the publish/subscribe ones share (one run of publishers and
//!   subscribers, its accounting).
//! - [`result`]: the result contract and the JSON Lines files; [`hist`]: HDR histograms kept whole; [`trust`]: when a
//!   result's numbers cannot be trusted.
//! - [`process`]: server processes, never left behind; [`sample`]: CPU and memory over a run; [`pin`]: server and
//!   load generator on separate CPUs; [`durability`]: the store's settings and fsync times in every result;
//!   [`lag`]: send lag and the generator-bound rule; [`sched`]: time spent waiting for a CPU.
//! - [`worker`]: the load generator split over worker processes (`runner worker`), for more links than one process
//!   may hold files for.
//! - [`emulator`]: a userspace link emulator (delay) for UDP and TCP.
//! - [`adversary`]: a hostile peer beside a run (`runner adversary`, `runner run --hostile`).

pub mod adversary;
pub mod drain;
pub mod durability;
pub mod emulator;
pub mod fanout;
pub mod first_contact;
pub mod flood;
pub mod handshake_rate;
pub mod harness;
pub mod hist;
pub mod idle_links;
pub mod lag;
pub mod moderate_rate;
pub mod params;
pub mod pin;
pub mod process;
pub mod publish;
pub mod pubsub;
pub mod restart;
pub mod result;
pub mod sample;
pub mod sched;
pub mod trust;
pub mod worker;
pub mod workload;

pub use harness::{Harness, Profile, WorkloadError};
pub use workload::{AnyWorkload, Info, Workload};

/// Every workload, in the order `runner list` and the tables show them. Adding a workload is one line here.
pub static ALL: &[&dyn AnyWorkload] = &[
    &drain::Drain,
    &restart::Restart,
    &first_contact::FirstContact,
    &handshake_rate::HandshakeRate,
    &idle_links::IdleLinks,
    &fanout::Fanout,
    &flood::Flood,
    &moderate_rate::ModerateRate,
    &publish::Publish,
];

/// The workload named `name`.
pub fn by_name(name: &str) -> Option<&'static dyn AnyWorkload> {
    ALL.iter().copied().find(|w| w.info().name == name)
}
