//! The workloads of the suite, their parameters and results, and the link emulator.
//!
//! A workload is a function of (transport, parameters, round) to a [`result::RunResult`]: it prepares the
//! transport's identity files, starts the server as its own process (`runner serve`), drives a fleet of devices,
//! samples CPU, audits the store, and fills in the metrics. Parameters are serde types printed into every result.
//!
//! - [`harness`]: directories, the server process, the fleet, provenance: what every workload shares.
//! - [`drain`]: orders pile up while the server is stopped, then drain.
//! - [`restart`]: devices send on a schedule; the server is killed and started again.
//! - [`first_contact`]: one order to each of many peers never met, over the link emulator at a set RTT.
//! - [`result`]: the result contract and the JSON Lines files.
//! - [`hist`]: HDR histograms kept whole in results.
//! - [`emulator`]: a userspace link emulator (delay) for UDP and TCP.

pub mod drain;
pub mod emulator;
pub mod first_contact;
pub mod harness;
pub mod hist;
pub mod restart;
pub mod result;

pub use harness::{Harness, Profile, WorkloadError};
