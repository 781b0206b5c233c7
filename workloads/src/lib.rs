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
//! - [`drain`], [`restart`], [`first_contact`]: the workloads.
//! - [`result`]: the result contract and the JSON Lines files; [`hist`]: HDR histograms kept whole.
//! - [`process`]: server processes, never left behind; [`sample`]: CPU and memory over a run.
//! - [`emulator`]: a userspace link emulator (delay) for UDP and TCP.

pub mod drain;
pub mod emulator;
pub mod first_contact;
pub mod harness;
pub mod hist;
pub mod params;
pub mod process;
pub mod restart;
pub mod result;
pub mod sample;
pub mod workload;

pub use harness::{Harness, Profile, WorkloadError};
pub use workload::{AnyWorkload, Info, Workload};

/// Every workload, in the order `runner list` and the tables show them. Adding a workload is one line here.
pub static ALL: &[&dyn AnyWorkload] = &[
    &drain::Drain,
    &restart::Restart,
    &first_contact::FirstContact,
];

/// The workload named `name`.
pub fn by_name(name: &str) -> Option<&'static dyn AnyWorkload> {
    ALL.iter().copied().find(|w| w.info().name == name)
}
