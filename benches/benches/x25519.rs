//! X25519 key generation and agreement: x25519-dalek against OpenSSL, aws-lc-rs and ring.

mod common;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkGroup, Criterion};
use microbench::x25519::{self, X25519};
use std::hint::black_box;

type Group<'a> = BenchmarkGroup<'a, WallTime>;

macro_rules! each_library {
    ($group:expr, $bench:ident) => {
        $bench::<x25519::Openssl>(&mut $group);
        $bench::<x25519::AwsLc>(&mut $group);
        $bench::<x25519::Ring>(&mut $group);
        $bench::<x25519::Dalek>(&mut $group);
    };
}

/// A private key from the library's RNG and its public key.
fn keygen<X: X25519>(g: &mut Group) {
    g.bench_function(X::ID, |b| b.iter(X::keygen));
}

/// Agreement with the peer's raw public key; a fresh private key per iteration, made outside the measurement.
fn agree<X: X25519>(g: &mut Group) {
    let (_, peer) = x25519::Dalek::keygen();
    g.bench_function(X::ID, |b| {
        b.iter_batched(
            || X::keygen().0,
            |secret| X::agree(secret, black_box(&peer)).unwrap(),
            BatchSize::SmallInput,
        )
    });
}

fn x25519(c: &mut Criterion) {
    let mut g = c.benchmark_group("x25519/keygen");
    each_library!(g, keygen);
    g.finish();

    let mut g = c.benchmark_group("x25519/agree");
    each_library!(g, agree);
    g.finish();
}

/// OpenSSL X25519 measured the way `openssl speed` measures (`speed-loop`: the peer set once, then only the
/// derivation) beside the `openssl` column of `x25519/agree` (`evp`).
fn openssl_paths(c: &mut Criterion) {
    let (_, peer) = x25519::Dalek::keygen();
    let mut g = c.benchmark_group("openssl-paths/x25519");
    g.bench_function("speed-loop", |b| {
        let secret = x25519::Openssl::keygen().0;
        let peer = openssl::pkey::PKey::public_key_from_raw_bytes(&peer, openssl::pkey::Id::X25519)
            .unwrap();
        let mut deriver = openssl::derive::Deriver::new(&secret).unwrap();
        deriver.set_peer(&peer).unwrap();
        b.iter(|| {
            let mut shared = [0u8; 32];
            deriver.derive(&mut shared).unwrap();
            shared
        })
    });
    g.bench_function("evp", |b| {
        b.iter_batched(
            || x25519::Openssl::keygen().0,
            |secret| x25519::Openssl::agree(secret, black_box(&peer)).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = x25519, openssl_paths
}
criterion_main!(benches);
