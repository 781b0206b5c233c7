//! Microbenchmarks of the cryptography the transports spend their CPU on, and the tool that turns criterion's
//! results into tables.
//!
//! Seed 002 replaced portable RustCrypto P-256 with OpenSSL's nistz256 assembly and measured 3-5.6x on the
//! arithmetic but only 1.55-1.7x on handshakes. The benches (`benches/*.rs`) measure the arithmetic half on the
//! machine at hand:
//!
//! - [`nistp256`]: P-256 key generation, ECDH, ECDSA sign and verify in OpenSSL, aws-lc-rs, ring and RustCrypto;
//! - [`x25519`]: X25519 in x25519-dalek, OpenSSL, aws-lc-rs and ring;
//! - [`hpke_auth`] and [`aead`]: HPKE auth mode as the `pure:hpke-*` variants use it, and the AEADs alone;
//! - [`handshake`]: the asymmetric work of a mutual-TLS 1.3 server per handshake, per backend.
//!
//! Each library sits behind a small trait, so a bench, the handshake estimate and the cross-check tests
//! (`tests/cross.rs`) run the same code. [`estimates`] reads criterion's saved results, [`table`] renders them
//! and [`speed`] parses `openssl speed` for an outside check; the `microtable` binary ties them together.

pub mod aead;
pub mod estimates;
pub mod handshake;
pub mod hpke_auth;
pub mod nistp256;
pub mod speed;
pub mod table;
pub mod x25519;

/// A library refused a peer's public key, a signature or a sealed record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("rejected by the library")]
pub struct Rejected;
