//! The seed inputs of each target: valid datagrams, packets and byte strings made by the real encoders, so that a
//! campaign starts from inputs that reach deep into each parser. A target started with `FUZZ_WRITE_SEEDS=DIR`
//! writes its seeds into DIR and exits (`scripts/fuzz seeds`); the committed corpora hold them together with what
//! campaigns kept.

use crate::mqtt::packet;
use crate::pure::{addr, receiver, sender, KINDS};
use arbitrary::Unstructured;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Instant;
use transport_core::{Counters, Order, OrderId, QoS};
use transport_pure::receiver::Receiver;
use transport_pure::sender::Sender;

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
        "pure_receiver" => {
            let mut s = pure_scenarios();
            s.extend(random(name.len() as u64, 12));
            s
        }
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

/// Datagrams of every kind and op as real senders and the receiver build them: orders (one to three records), the
/// receiver's answers, subscribes (one refused), publishes at both QoS, deliveries at both QoS and the devices'
/// answers to them.
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
            exchange(&mut r, &mut [(0, &mut s)], now, &mut out);
        }
        // Device 1 subscribes (QoS 1 on channel 1, QoS 0 on channel 2), device 2 publishes on both at both QoS.
        let (mut sub, mut publisher) = (sender(kind, 1, 11), sender(kind, 2, 12));
        sub.subscribe(now, 1, QoS::AtLeastOnce);
        sub.subscribe(now, 2, QoS::AtMostOnce);
        exchange(&mut r, &mut [(1, &mut sub)], now, &mut out);
        // A third channel is over the relay's bound of two: answered with a refusal.
        sub.subscribe(now, 0, QoS::AtMostOnce);
        exchange(&mut r, &mut [(1, &mut sub)], now, &mut out);
        for (id, (channel, qos)) in [
            (1, QoS::AtLeastOnce),
            (1, QoS::AtMostOnce),
            (2, QoS::AtLeastOnce),
        ]
        .into_iter()
        .enumerate()
        {
            let payload: Arc<[u8]> = vec![id as u8; 4 + 20 * id].into();
            publisher
                .publish(now, channel, id as u64, qos, payload)
                .expect("fits a datagram");
            exchange(
                &mut r,
                &mut [(1, &mut sub), (2, &mut publisher)],
                now,
                &mut out,
            );
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Move datagrams between the receiver and `devices` (device number, sender) until nothing moves, recording each.
fn exchange(
    r: &mut Receiver,
    devices: &mut [(usize, &mut Sender)],
    now: Instant,
    out: &mut Vec<Vec<u8>>,
) {
    let mut dg = Vec::new();
    for _ in 0..16 {
        let mut moved = false;
        for (d, s) in devices.iter_mut() {
            while s.poll_transmit(now, &mut dg) {
                r.handle(now, addr(*d), &dg);
                out.push(dg.clone());
                moved = true;
            }
        }
        let (_, replies) = r.take_deliveries();
        for reply in replies {
            r.answer(reply);
        }
        while let Some(to) = r.poll_transmit(now, &mut dg) {
            out.push(dg.clone());
            if let Some((_, s)) = devices.iter_mut().find(|(d, _)| addr(*d) == to) {
                s.handle(now, &dg);
            }
            moved = true;
        }
        if !moved {
            return;
        }
    }
}

/// Scenarios for `pure_receiver`, one set per kind: publish/subscribe with deliveries answered, a receiver restart
/// under subscriptions, an adversary forging relay records between honest exchanges, and a subscribe over the relay's
/// channel bound.
fn pure_scenarios() -> Vec<Vec<u8>> {
    use crate::pure_ops::{Forged, Op};
    let sub = |device, channel, qos1| Op::Subscribe {
        device,
        channel,
        qos1,
        lose: false,
    };
    let publish = |device, channel, qos1, n: usize| Op::Publish {
        device,
        channel,
        qos1,
        payload: vec![0x5a; n],
        lose: false,
    };
    let send = |device| Op::Send {
        device,
        lose: false,
    };
    let answers = Op::Answers { lose: false };
    // The first subscribe knows no receiver run: it is answered with the run and sent again for it.
    let subscribed = |device, channel, qos1| {
        vec![
            sub(device, channel, qos1),
            answers.clone(),
            send(device),
            answers.clone(),
        ]
    };
    let mut relay = subscribed(0, 1, true);
    relay.extend(subscribed(1, 1, false));
    relay.extend([
        publish(2, 1, true, 8),
        answers.clone(),
        send(2),
        answers.clone(),
        send(0),
        publish(2, 1, false, 40),
        answers.clone(),
        send(0),
        Op::Make {
            device: 2,
            payload: vec![1; 12],
            lose: false,
        },
        answers.clone(),
        Op::Settle,
    ]);
    let mut restart = subscribed(0, 2, true);
    restart.extend([
        publish(1, 2, true, 16),
        answers.clone(),
        send(1),
        Op::RestartReceiver,
        Op::Time { step: 3 },
        Op::Resend {
            device: 0,
            lose: false,
        },
        answers.clone(),
        send(0),
        Op::RestartDevice { device: 0 },
        sub(0, 0, true),
        answers.clone(),
        send(0),
        Op::Settle,
    ]);
    let mut forged = subscribed(0, 0, true);
    forged.extend([
        Op::Forge {
            what: Forged::Subscribe,
            sealer: 1,
            claimed: 0,
            new_session: false,
            run: 1,
            seq: 0,
            receiver_run: 1,
            current: true,
            channel: 2,
            qos1: true,
            payload: Vec::new(),
        },
        Op::Forge {
            what: Forged::Publish1,
            sealer: 3,
            claimed: 1,
            new_session: true,
            run: 2,
            seq: 1,
            receiver_run: 1,
            current: true,
            channel: 0,
            qos1: true,
            payload: vec![7; 9],
        },
        Op::ForgeDelivery {
            victim: 0,
            other: 0,
            qos1: true,
            seq: 0,
            channel: 0,
            payload: vec![3; 5],
        },
        publish(1, 0, true, 24),
        answers.clone(),
        send(1),
        answers.clone(),
        Op::ForgeDeliveryAnswer {
            victim: 0,
            other: 1,
            seq: 0,
        },
        Op::Replay { index: 3, from: 4 },
        Op::Mutate {
            index: 5,
            from: 0,
            cut: 600,
            flips: vec![(30, 1)],
        },
        send(0),
        Op::Time { step: 1 },
        Op::Settle,
    ]);
    // Device 1 asks for one channel more than the relay keeps (two): refused, and its order and publish still go.
    let mut bound = subscribed(1, 0, true);
    bound.extend(subscribed(1, 1, false));
    bound.extend([
        sub(1, 2, true),
        answers.clone(),
        Op::Make {
            device: 1,
            payload: vec![2; 8],
            lose: false,
        },
        publish(1, 0, true, 8),
        answers.clone(),
        send(1),
        answers.clone(),
        Op::Settle,
    ]);
    let mut out = Vec::new();
    for kind in 0..KINDS.len() {
        for ops in [&relay, &restart, &forged, &bound] {
            let input = crate::pure_ops::input(kind, ops);
            assert_eq!(
                crate::pure_ops::read_input(&input, usize::MAX),
                Some((kind, ops.to_vec())),
                "a scenario does not read back as written"
            );
            out.push(input);
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
