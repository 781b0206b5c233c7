//! The seed inputs of each target: valid datagrams, packets and byte strings made by the real encoders, so that a
//! campaign starts from inputs that reach deep into each parser. A target started with `FUZZ_WRITE_SEEDS=DIR`
//! writes its seeds into DIR and exits (`scripts/fuzz seeds`); the committed corpora hold them together with what
//! campaigns kept.

use crate::mqtt::packet;
use crate::pure::{receiver, sender, KINDS};
use arbitrary::Unstructured;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use std::sync::Arc;
use std::time::Instant;
use transport_core::{Counters, Order, OrderId};

/// When `FUZZ_WRITE_SEEDS` names a directory: write the seeds of target `name` into it as `seed-NN` and exit.
/// Called from each target's initialisation, so that seeds are made by the same instrumented build.
pub fn write_if_asked(name: &str) {
    let Some(dir) = std::env::var_os("FUZZ_WRITE_SEEDS") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let inputs = seeds(name);
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        inputs
            .iter()
            .enumerate()
            .try_for_each(|(i, input)| std::fs::write(dir.join(format!("seed-{i:02}")), input))
    });
    match written {
        Ok(()) => {
            println!("{name}: {} seeds in {}", inputs.len(), dir.display());
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("{name}: cannot write seeds into {}: {e}", dir.display());
            std::process::exit(1);
        }
    }
}

/// Seed inputs of target `name`.
pub fn seeds(name: &str) -> Vec<Vec<u8>> {
    match name {
        "pure_wire" => pure_datagrams(),
        "mqtt_codec" => mqtt_streams(),
        // Structure-aware targets read operations from any bytes: random strings of a few lengths start them with
        // scenarios of several steps.
        _ => random(name.len() as u64, 12),
    }
}

fn random(seed: u64, n: usize) -> Vec<Vec<u8>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let mut b = vec![0u8; 32 << (i % 6)];
            rng.fill_bytes(&mut b);
            b
        })
        .collect()
}

/// Datagrams of every kind as real senders build them (one to three records), and the receiver's answers.
fn pure_datagrams() -> Vec<Vec<u8>> {
    let now = Instant::now();
    let mut out = Vec::new();
    for kind in KINDS {
        let mut r = receiver(kind, 9, Arc::new(Counters::default()));
        for records in 1..=3u64 {
            let mut s = sender(kind, 0, records);
            for seq in 0..records {
                let order = Order {
                    id: OrderId {
                        sender: 0,
                        run: 5,
                        seq,
                    },
                    made_us: 1_000 + seq,
                    payload: vec![seq as u8; 16 * seq as usize],
                };
                s.push(now, order);
            }
            let mut dg = Vec::new();
            while s.poll_transmit(now, &mut dg) {
                r.handle(now, "10.0.0.1:4000".parse().expect("address"), &dg);
                out.push(dg.clone());
            }
            let (_, replies) = r.take_deliveries();
            for reply in &replies {
                r.answer(reply);
            }
            while r.poll_transmit(now, &mut dg).is_some() {
                out.push(dg.clone());
            }
        }
    }
    out
}

/// Streams of valid MQTT packets, one type after another, prefixed with the byte that picks the bytes mode.
fn mqtt_streams() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (i, raw) in random(0x3117, 24).into_iter().enumerate() {
        let mut u = Unstructured::new(&raw);
        let mut stream = vec![0u8, (i % 4) as u8];
        for _ in 0..1 + i % 3 {
            let Ok(p) = packet(&mut u, false) else { break };
            if p.encode(&mut stream).is_err() {
                break;
            }
        }
        out.push(stream);
    }
    out
}
