//! Instruction counts of the suite's hot paths, as rustls's `ci-bench` counts its handshakes: each scenario runs
//! under callgrind with fixed inputs (and a seeded RNG where the code takes one), and only its measured section is
//! counted. Counts hardly move between runs of the same build, whatever else the machine is doing, so a baseline
//! in `baseline-data/icount/` can hold them to a tolerance of a few tenths of a percent where wall-clock
//! benchmarks on a shared machine need tens.
//!
//! - [`meter`]: the measured section (the one symbol callgrind counts in), warm-up and the deliberate slowdown
//!   used to prove the check catches a regression;
//! - [`scenarios`]: the hot paths: Pure's sender and receiver cores per variant and its record crypto, the MQTT
//!   codec's PUBLISH, the store's append, a rustls handshake per side;
//! - [`callgrind`]: runs a scenario under callgrind in a child process and reads its total;
//! - [`results`]: the JSON Lines records and the comparison with a baseline (a Markdown table, a verdict).
//!
//! The `icount` binary ties them together; `scripts/icount` builds it in release and runs `icount measure`.
//! `docs/performance.md` ("Instruction counts") describes the scenarios, the baseline and the tolerance.

pub mod callgrind;
pub mod meter;
pub mod results;
pub mod scenarios;
