//! Seed 002's handshake estimate, measured as one sum per backend: the asymmetric work of a mutual-TLS 1.3
//! server for one full handshake (two ECDSA P-256 verifications, one signature, X25519 key generation and
//! agreement; see `microbench::handshake`).

mod common;

use criterion::{criterion_group, criterion_main, Criterion};
use microbench::handshake::{self, Backend, ClientFlight, Server};
use std::hint::black_box;

fn backend<B: Backend>(
    c: &mut criterion::BenchmarkGroup<criterion::measurement::WallTime>,
    client: &ClientFlight,
) {
    let server = Server::<B>::new(client).unwrap();
    c.bench_function(B::ID, |b| {
        b.iter(|| server.handshake(black_box(client)).unwrap())
    });
}

fn estimate(c: &mut Criterion) {
    let client = ClientFlight::new();
    let mut g = c.benchmark_group("handshake/estimate");
    backend::<handshake::Openssl>(&mut g, &client);
    backend::<handshake::AwsLc>(&mut g, &client);
    backend::<handshake::Ring>(&mut g, &client);
    backend::<handshake::RustCrypto>(&mut g, &client);
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = estimate
}
criterion_main!(benches);
