//! P-256 key generation, ECDH, ECDSA sign and verify: OpenSSL, aws-lc-rs, ring (assembly) against RustCrypto.
//!
//! One group per operation, one function per library. Keys, peers' points and signatures are made before the
//! measurement; what is measured is what a TLS 1.3 peer does with bytes off the wire (see `nistp256`).

mod common;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkGroup, Criterion};
use microbench::nistp256::{self, P256ParsedVerify, P256};
use std::hint::black_box;

type Group<'a> = BenchmarkGroup<'a, WallTime>;

/// Runs `$bench::<Library>(&mut group)` for each library with P-256.
macro_rules! each_library {
    ($group:expr, $bench:ident) => {
        $bench::<nistp256::Openssl>(&mut $group);
        $bench::<nistp256::AwsLc>(&mut $group);
        $bench::<nistp256::Ring>(&mut $group);
        $bench::<nistp256::RustCrypto>(&mut $group);
    };
}

fn message() -> Vec<u8> {
    nistp256::certificate_verify_message(nistp256::SERVER_CONTEXT, &[0x5e; 32])
}

/// A private key from the library's RNG and its public point, encoded.
fn keygen<B: P256>(g: &mut Group) {
    g.bench_function(B::ID, |b| b.iter(B::ecdh_keygen));
}

/// Parse and check the peer's point, multiply: a fresh private key per iteration, made outside the measurement
/// (ring's ECDH keys are single-use).
fn ecdh<B: P256>(g: &mut Group) {
    let (_, peer) = nistp256::RustCrypto::ecdh_keygen();
    g.bench_function(B::ID, |b| {
        b.iter_batched(
            || B::ecdh_keygen().0,
            |secret| B::ecdh(secret, black_box(&peer)).unwrap(),
            BatchSize::SmallInput,
        )
    });
}

/// SHA-256 of the 130-byte CertificateVerify message and an ECDSA signature, DER-encoded.
fn sign<B: P256>(g: &mut Group) {
    let (key, _) = B::signing_key();
    let msg = message();
    g.bench_function(B::ID, |b| b.iter(|| B::sign(&key, black_box(&msg))));
}

/// Parse the signer's point (a key never seen before) and verify.
fn verify<B: P256>(g: &mut Group) {
    let (key, public) = B::signing_key();
    let msg = message();
    let sig = B::sign(&key, &msg);
    g.bench_function(B::ID, |b| {
        b.iter(|| {
            assert!(B::verify(
                black_box(&public),
                black_box(&msg),
                black_box(&sig)
            ))
        })
    });
}

/// Verify with a key parsed once (a registered CA's key).
fn verify_parsed<B: P256ParsedVerify>(g: &mut Group) {
    let (key, public) = B::signing_key();
    let msg = message();
    let sig = B::sign(&key, &msg);
    let parsed = B::parse_verifying_key(&public).unwrap();
    g.bench_function(B::ID, |b| {
        b.iter(|| assert!(B::verify_parsed(&parsed, black_box(&msg), black_box(&sig))))
    });
}

fn p256(c: &mut Criterion) {
    let mut g = c.benchmark_group("p256/keygen");
    each_library!(g, keygen);
    g.finish();

    let mut g = c.benchmark_group("p256/ecdh");
    each_library!(g, ecdh);
    g.finish();

    let mut g = c.benchmark_group("p256/ecdsa-sign");
    each_library!(g, sign);
    g.finish();

    let mut g = c.benchmark_group("p256/ecdsa-verify");
    each_library!(g, verify);
    g.finish();

    // ring has no parsed-key verification
    let mut g = c.benchmark_group("p256/ecdsa-verify-parsed");
    verify_parsed::<nistp256::Openssl>(&mut g);
    verify_parsed::<nistp256::AwsLc>(&mut g);
    verify_parsed::<nistp256::RustCrypto>(&mut g);
    g.finish();
}

/// OpenSSL measured the way `openssl speed` measures (`speed-loop`: a context set up once, then only the
/// operation; ECDSA on a 20-byte digest) beside the `openssl` column of `p256/*` (`evp`), and ECDH with the
/// peer check `set_peer` does by default (`evp-full-check`). Explains gaps between the two tools.
fn openssl_paths(c: &mut Criterion) {
    use nistp256::Openssl;
    use openssl::derive::Deriver;
    use openssl::pkey_ctx::PkeyCtx;

    let (_, peer_bytes) = nistp256::RustCrypto::ecdh_keygen();
    let peer = Openssl::parse_verifying_key(&peer_bytes).unwrap();
    let mut g = c.benchmark_group("openssl-paths/ecdh");
    g.bench_function("speed-loop", |b| {
        let secret = Openssl::ecdh_keygen().0;
        let mut deriver = Deriver::new(&secret).unwrap();
        deriver.set_peer(&peer).unwrap();
        b.iter(|| {
            let mut shared = [0u8; 32];
            deriver.derive(&mut shared).unwrap();
            shared
        })
    });
    g.bench_function("evp", |b| {
        b.iter_batched(
            || Openssl::ecdh_keygen().0,
            |secret| Openssl::ecdh(secret, black_box(&peer_bytes)).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("evp-full-check", |b| {
        b.iter_batched(
            || Openssl::ecdh_keygen().0,
            |secret| {
                let peer = Openssl::parse_verifying_key(black_box(&peer_bytes)).unwrap();
                let mut deriver = Deriver::new(&secret).unwrap();
                deriver.set_peer(&peer).unwrap();
                let mut shared = [0u8; 32];
                deriver.derive(&mut shared).unwrap();
                shared
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();

    let (key, public) = Openssl::signing_key();
    let digest = [0x5e; 20];
    let mut g = c.benchmark_group("openssl-paths/ecdsa-sign");
    g.bench_function("speed-loop", |b| {
        let mut ctx = PkeyCtx::new(&key).unwrap();
        ctx.sign_init().unwrap();
        let mut sig = [0u8; 80];
        b.iter(|| ctx.sign(black_box(&digest), Some(&mut sig)).unwrap())
    });
    let msg = message();
    g.bench_function("evp", |b| b.iter(|| Openssl::sign(&key, black_box(&msg))));
    g.finish();

    let parsed = Openssl::parse_verifying_key(&public).unwrap();
    let mut g = c.benchmark_group("openssl-paths/ecdsa-verify");
    g.bench_function("speed-loop", |b| {
        let mut ctx = PkeyCtx::new(&key).unwrap();
        ctx.sign_init().unwrap();
        let mut sig = vec![0u8; 80];
        let len = ctx.sign(&digest, Some(&mut sig)).unwrap();
        sig.truncate(len);
        let mut ctx = PkeyCtx::new(&parsed).unwrap();
        ctx.verify_init().unwrap();
        b.iter(|| assert!(ctx.verify(black_box(&digest), &sig).unwrap()))
    });
    let sig = Openssl::sign(&key, &msg);
    g.bench_function("evp", |b| {
        b.iter(|| {
            assert!(Openssl::verify_parsed(
                &parsed,
                black_box(&msg),
                black_box(&sig)
            ))
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = p256, openssl_paths
}
criterion_main!(benches);
