//! HPKE auth mode (DHKEM(X25519, HKDF-SHA256), HKDF-SHA256) with AES-128-GCM and ChaCha20-Poly1305: sender and
//! receiver setup, seal and open of 64 B and 1 KiB; and the two AEADs alone in RustCrypto, ring and aws-lc-rs.

mod common;

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BatchSize, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use microbench::aead::{self, Aead, Algorithm};
use microbench::hpke_auth::{AesGcm128, ChaCha20Poly1305, Parties};
use std::hint::black_box;

type Group<'a> = BenchmarkGroup<'a, WallTime>;

const SIZES: [usize; 2] = [64, 1024];
/// Associated data of the length of a small record header.
const AAD: &[u8] = b"record header 16";

/// The hpke crate's AEAD type and the id used in benchmark names.
trait HpkeAead: hpke::aead::Aead {
    const ID: &'static str;
}
impl HpkeAead for AesGcm128 {
    const ID: &'static str = "aes128gcm";
}
impl HpkeAead for ChaCha20Poly1305 {
    const ID: &'static str = "chacha20poly1305";
}

/// An ephemeral key, two X25519 and the key schedule.
fn setup_sender<A: HpkeAead>(g: &mut Group, parties: &Parties) {
    g.bench_function(A::ID, |b| b.iter(|| parties.setup_sender::<A>()));
}

/// Two X25519 and the key schedule.
fn setup_receiver<A: HpkeAead>(g: &mut Group, parties: &Parties) {
    let (encapped, _) = parties.setup_sender::<A>();
    g.bench_function(A::ID, |b| {
        b.iter(|| {
            parties
                .setup_receiver::<A>(&parties.sender.1, black_box(&encapped))
                .unwrap()
        })
    });
}

/// Seal the next record of a session, in place.
fn seal<A: HpkeAead>(g: &mut Group, parties: &Parties, size: usize) {
    let (_, mut sender) = parties.setup_sender::<A>();
    let mut record = vec![0x42; size];
    g.throughput(Throughput::Bytes(size as u64));
    g.bench_function(BenchmarkId::new(A::ID, size), |b| {
        b.iter(|| {
            sender
                .seal_inout_detached(black_box(record.as_mut_slice()).into(), AAD)
                .unwrap()
        })
    });
}

/// Open the next record of a session, in place; the sender seals it outside the measurement.
fn open<A: HpkeAead>(g: &mut Group, parties: &Parties, size: usize) {
    let (encapped, mut sender) = parties.setup_sender::<A>();
    let mut receiver = parties
        .setup_receiver::<A>(&parties.sender.1, &encapped)
        .unwrap();
    g.throughput(Throughput::Bytes(size as u64));
    g.bench_function(BenchmarkId::new(A::ID, size), |b| {
        b.iter_batched(
            || {
                let mut record = vec![0x42; size];
                let tag = sender
                    .seal_inout_detached(record.as_mut_slice().into(), AAD)
                    .unwrap();
                (record, tag)
            },
            |(mut record, tag)| {
                receiver
                    .open_inout_detached(record.as_mut_slice().into(), AAD, &tag)
                    .unwrap();
                record // dropped after the measurement
            },
            BatchSize::SmallInput,
        )
    });
}

fn hpke(c: &mut Criterion) {
    let parties = Parties::generate();

    let mut g = c.benchmark_group("hpke/setup-sender");
    setup_sender::<AesGcm128>(&mut g, &parties);
    setup_sender::<ChaCha20Poly1305>(&mut g, &parties);
    g.finish();

    let mut g = c.benchmark_group("hpke/setup-receiver");
    setup_receiver::<AesGcm128>(&mut g, &parties);
    setup_receiver::<ChaCha20Poly1305>(&mut g, &parties);
    g.finish();

    let mut g = c.benchmark_group("hpke/seal");
    for size in SIZES {
        seal::<AesGcm128>(&mut g, &parties, size);
        seal::<ChaCha20Poly1305>(&mut g, &parties, size);
    }
    g.finish();

    let mut g = c.benchmark_group("hpke/open");
    for size in SIZES {
        open::<AesGcm128>(&mut g, &parties, size);
        open::<ChaCha20Poly1305>(&mut g, &parties, size);
    }
    g.finish();
}

const NONCE: aead::Nonce = [7; 12];

/// Seal in place with a detached tag. The nonce repeats across iterations: harmless for timing, never for use.
fn aead_seal<A: Aead>(g: &mut Group, alg: Algorithm, size: usize) {
    let cipher = A::new(alg, &vec![0x11; alg.key_len()]);
    let mut record = vec![0x42; size];
    g.throughput(Throughput::Bytes(size as u64));
    g.bench_function(BenchmarkId::new(A::ID, size), |b| {
        b.iter(|| cipher.seal(&NONCE, AAD, black_box(&mut record)))
    });
}

/// Open in place; each iteration gets a copy of the sealed record made outside the measurement.
fn aead_open<A: Aead>(g: &mut Group, alg: Algorithm, size: usize) {
    let cipher = A::new(alg, &vec![0x11; alg.key_len()]);
    let mut sealed = vec![0x42; size];
    let tag = cipher.seal(&NONCE, AAD, &mut sealed);
    g.throughput(Throughput::Bytes(size as u64));
    g.bench_function(BenchmarkId::new(A::ID, size), |b| {
        b.iter_batched(
            || sealed.clone(),
            |mut record| {
                cipher.open(&NONCE, AAD, &mut record, &tag).unwrap();
                record
            },
            BatchSize::SmallInput,
        )
    });
}

fn aeads(c: &mut Criterion) {
    for alg in Algorithm::ALL {
        let mut g = c.benchmark_group(format!("aead/{}-seal", alg.id()));
        for size in SIZES {
            aead_seal::<aead::RustCrypto>(&mut g, alg, size);
            aead_seal::<aead::Ring>(&mut g, alg, size);
            aead_seal::<aead::AwsLc>(&mut g, alg, size);
        }
        g.finish();

        let mut g = c.benchmark_group(format!("aead/{}-open", alg.id()));
        for size in SIZES {
            aead_open::<aead::RustCrypto>(&mut g, alg, size);
            aead_open::<aead::Ring>(&mut g, alg, size);
            aead_open::<aead::AwsLc>(&mut g, alg, size);
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = hpke, aeads
}
criterion_main!(benches);
