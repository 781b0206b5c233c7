//! The shared half of the fuzz targets in `fuzz_targets/`: fixed keys and actors for Pure and the operations of its
//! receiver target, generators of valid MQTT packets, a reference reader of the store's log, and the seed corpora.
//!
//! Each target is a libFuzzer `fuzz_target!` built on stable Rust by `scripts/fuzz` (see `docs/fuzzing.md`). The
//! targets check invariants, not only the absence of panics; a broken invariant panics with a message that says
//! which one, and libFuzzer keeps the input.

pub mod mqtt;
pub mod pure;
pub mod pure_ops;
pub mod seeds;
pub mod store;

use arbitrary::{Result, Unstructured};

/// At most `max` bytes from the input (fewer if it runs out).
pub fn bytes_upto(u: &mut Unstructured<'_>, max: usize) -> Result<Vec<u8>> {
    let n = u.int_in_range(0..=max)?;
    Ok(u.bytes(n.min(u.len()))?.to_vec())
}

/// Whether the targets print each operation they run (`FUZZ_SHOW_OPS=1`), to read what a crashing input does.
pub fn show_ops() -> bool {
    static SHOW: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SHOW.get_or_init(|| std::env::var_os("FUZZ_SHOW_OPS").is_some())
}
