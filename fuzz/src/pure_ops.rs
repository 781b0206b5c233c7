//! The operations of the `pure_receiver` target, read from the fuzzer's bytes ([`Op::read`]) and written back
//! ([`Op::write`]), so that the seeds can be scenarios (subscribe, publish, deliver, answer) rather than random bytes.
//!
//! Every field is read with one call of `Unstructured`, and [`Op::write`] writes the bytes that call reads back to the
//! same value; the seeds check `read(write(op)) == op` for each scenario.

use crate::pure::{CHANNELS, DEVICES};
use arbitrary::{Result, Unstructured};

/// Longest payload the generators make: a few records still share a datagram.
pub const MAX_PAYLOAD: u8 = 96;
/// Longest raw datagram the adversary sends to the receiver.
pub const MAX_RAW: u8 = 255;
/// Longest raw datagram the adversary sends to a device.
pub const MAX_RAW_ANSWER: u8 = 128;
/// Steps of time the `Time` operation lets pass, in milliseconds: within a re-send, past the QoS 0 deadline, past a
/// refresh, past a subscription's expiry.
pub const STEPS_MS: [u64; 5] = [50, 300, 1_000, 6_000, 16_000];

/// What a forged record carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forged {
    Order,
    Subscribe,
    Publish1,
    Publish0,
}

/// One step of a scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A device makes an order; its datagrams go out (or are lost).
    Make {
        device: usize,
        payload: Vec<u8>,
        lose: bool,
    },
    /// A device subscribes to a channel; its datagrams go out (or are lost).
    Subscribe {
        device: usize,
        channel: u32,
        qos1: bool,
        lose: bool,
    },
    /// A device publishes a message on a channel; its datagrams go out (or are lost).
    Publish {
        device: usize,
        channel: u32,
        qos1: bool,
        payload: Vec<u8>,
        lose: bool,
    },
    /// A device sends what it has now (answers to deliveries, frames its window lets go), no time passing.
    Send { device: usize, lose: bool },
    /// Time passes beyond the re-send timeout: a device re-sends what is unanswered.
    Resend { device: usize, lose: bool },
    /// Time passes for the receiver (`STEPS_MS[step]`): its re-sends of deliveries, its deadlines and expiries.
    Time { step: usize },
    /// A device restarts: a new sender run.
    RestartDevice { device: usize },
    /// The receiver restarts: a new run, no keys and no subscriptions kept.
    RestartReceiver,
    /// The receiver's pending datagrams (answers, deliveries) go out to the devices (or are lost).
    Answers { lose: bool },
    /// Thirty seconds of lossless exchange with every timer running, then the liveness checks.
    Settle,
    /// A record sealed with `sealer`'s key (its own HPKE session, a fresh setup, or its link keys) naming `claimed`.
    Forge {
        what: Forged,
        sealer: usize,
        claimed: usize,
        new_session: bool,
        run: u64,
        seq: u64,
        receiver_run: u64,
        /// Subscribes and publishes: name the receiver's current run in the plaintext (else `receiver_run`).
        current: bool,
        channel: u32,
        qos1: bool,
        payload: Vec<u8>,
    },
    /// A delivery to `victim` sealed with the keys another device (`victim + 1 + other`) can make.
    ForgeDelivery {
        victim: usize,
        other: usize,
        qos1: bool,
        seq: u64,
        channel: u32,
        payload: Vec<u8>,
    },
    /// An answer to delivery `seq` of `victim`, to the receiver, tagged with the keys another device can make.
    ForgeDeliveryAnswer {
        victim: usize,
        other: usize,
        seq: u64,
    },
    /// A datagram seen on its way to the receiver, again, from `from`.
    Replay { index: u16, from: usize },
    /// A datagram seen on its way to the receiver, cut and with bytes changed.
    Mutate {
        index: u16,
        from: usize,
        cut: u16,
        flips: Vec<(u16, u8)>,
    },
    /// Two datagrams seen on their way to the receiver, as one.
    Splice { a: u16, b: u16, from: usize },
    /// Any bytes, to the receiver.
    Raw { from: usize, bytes: Vec<u8> },
    /// A datagram seen on its way to a device (an answer or a delivery), changed, to `device`.
    MutateAnswer {
        index: u16,
        device: usize,
        flips: Vec<(u16, u8)>,
    },
    /// Any bytes, to a device.
    RawAnswer { device: usize, bytes: Vec<u8> },
}

/// How many operations there are (the first byte of each picks one).
const OPS: u8 = 19;
/// Sources of datagrams to the receiver: the devices' addresses and one more.
const SOURCES: u8 = DEVICES as u8 + 1;

fn below(u: &mut Unstructured<'_>, n: u8) -> Result<u8> {
    u.int_in_range(0..=n - 1)
}

fn device(u: &mut Unstructured<'_>) -> Result<usize> {
    Ok(below(u, DEVICES as u8)? as usize)
}

fn source(u: &mut Unstructured<'_>) -> Result<usize> {
    Ok(below(u, SOURCES)? as usize)
}

fn channel(u: &mut Unstructured<'_>) -> Result<u32> {
    Ok(u32::from(below(u, CHANNELS as u8)?))
}

fn flag(u: &mut Unstructured<'_>) -> Result<bool> {
    Ok(below(u, 2)? == 1)
}

/// Lost one time in four.
fn lose(u: &mut Unstructured<'_>) -> Result<bool> {
    Ok(below(u, 4)? == 0)
}

fn wide(u: &mut Unstructured<'_>) -> Result<u16> {
    u.int_in_range(0..=u16::MAX)
}

fn bytes(u: &mut Unstructured<'_>, max: u8) -> Result<Vec<u8>> {
    let n = usize::from(u.int_in_range(0..=max)?);
    Ok(u.bytes(n.min(u.len()))?.to_vec())
}

fn flips(u: &mut Unstructured<'_>) -> Result<Vec<(u16, u8)>> {
    let n = below(u, 5)?;
    (0..n)
        .map(|_| Ok((wide(u)?, u.int_in_range(0..=u8::MAX)?)))
        .collect()
}

impl Op {
    /// Read one operation.
    pub fn read(u: &mut Unstructured<'_>) -> Result<Op> {
        Ok(match below(u, OPS)? {
            0 => Op::Make {
                device: device(u)?,
                payload: bytes(u, MAX_PAYLOAD)?,
                lose: lose(u)?,
            },
            1 => Op::Subscribe {
                device: device(u)?,
                channel: channel(u)?,
                qos1: flag(u)?,
                lose: lose(u)?,
            },
            2 => Op::Publish {
                device: device(u)?,
                channel: channel(u)?,
                qos1: flag(u)?,
                payload: bytes(u, MAX_PAYLOAD)?,
                lose: lose(u)?,
            },
            3 => Op::Send {
                device: device(u)?,
                lose: lose(u)?,
            },
            4 => Op::Resend {
                device: device(u)?,
                lose: lose(u)?,
            },
            5 => Op::Time {
                step: below(u, STEPS_MS.len() as u8)? as usize,
            },
            6 => Op::RestartDevice { device: device(u)? },
            7 => Op::RestartReceiver,
            8 => Op::Answers { lose: lose(u)? },
            9 => Op::Settle,
            10 => Op::Forge {
                what: [
                    Forged::Order,
                    Forged::Subscribe,
                    Forged::Publish1,
                    Forged::Publish0,
                ][below(u, 4)? as usize],
                sealer: device(u)?,
                claimed: device(u)?,
                new_session: flag(u)?,
                run: u64::from(below(u, 4)?),
                seq: u64::from(below(u, 8)?),
                receiver_run: u64::from(below(u, 4)?),
                current: flag(u)?,
                channel: channel(u)?,
                qos1: flag(u)?,
                payload: bytes(u, MAX_PAYLOAD)?,
            },
            11 => Op::ForgeDelivery {
                victim: device(u)?,
                other: below(u, DEVICES as u8 - 1)? as usize,
                qos1: flag(u)?,
                seq: u64::from(below(u, 8)?),
                channel: channel(u)?,
                payload: bytes(u, MAX_PAYLOAD)?,
            },
            12 => Op::ForgeDeliveryAnswer {
                victim: device(u)?,
                other: below(u, DEVICES as u8 - 1)? as usize,
                seq: u64::from(below(u, 8)?),
            },
            13 => Op::Replay {
                index: wide(u)?,
                from: source(u)?,
            },
            14 => Op::Mutate {
                index: wide(u)?,
                from: source(u)?,
                cut: wide(u)?,
                flips: flips(u)?,
            },
            15 => Op::Splice {
                a: wide(u)?,
                b: wide(u)?,
                from: source(u)?,
            },
            16 => Op::Raw {
                from: source(u)?,
                bytes: bytes(u, MAX_RAW)?,
            },
            17 => Op::MutateAnswer {
                index: wide(u)?,
                device: device(u)?,
                flips: flips(u)?,
            },
            _ => Op::RawAnswer {
                device: device(u)?,
                bytes: bytes(u, MAX_RAW_ANSWER)?,
            },
        })
    }

    /// Append the bytes [`Op::read`] reads back as this operation.
    pub fn write(&self, out: &mut Vec<u8>) {
        let mut w = Writer(out);
        match self {
            Op::Make {
                device,
                payload,
                lose,
            } => {
                w.small(0);
                w.small(*device as u8);
                w.bytes(payload);
                w.lose(*lose);
            }
            Op::Subscribe {
                device,
                channel,
                qos1,
                lose,
            } => {
                w.small(1);
                w.small(*device as u8);
                w.small(*channel as u8);
                w.small(u8::from(*qos1));
                w.lose(*lose);
            }
            Op::Publish {
                device,
                channel,
                qos1,
                payload,
                lose,
            } => {
                w.small(2);
                w.small(*device as u8);
                w.small(*channel as u8);
                w.small(u8::from(*qos1));
                w.bytes(payload);
                w.lose(*lose);
            }
            Op::Send { device, lose } => {
                w.small(3);
                w.small(*device as u8);
                w.lose(*lose);
            }
            Op::Resend { device, lose } => {
                w.small(4);
                w.small(*device as u8);
                w.lose(*lose);
            }
            Op::Time { step } => {
                w.small(5);
                w.small(*step as u8);
            }
            Op::RestartDevice { device } => {
                w.small(6);
                w.small(*device as u8);
            }
            Op::RestartReceiver => w.small(7),
            Op::Answers { lose } => {
                w.small(8);
                w.lose(*lose);
            }
            Op::Settle => w.small(9),
            Op::Forge {
                what,
                sealer,
                claimed,
                new_session,
                run,
                seq,
                receiver_run,
                current,
                channel,
                qos1,
                payload,
            } => {
                w.small(10);
                w.small(*what as u8);
                w.small(*sealer as u8);
                w.small(*claimed as u8);
                w.small(u8::from(*new_session));
                w.small(*run as u8);
                w.small(*seq as u8);
                w.small(*receiver_run as u8);
                w.small(u8::from(*current));
                w.small(*channel as u8);
                w.small(u8::from(*qos1));
                w.bytes(payload);
            }
            Op::ForgeDelivery {
                victim,
                other,
                qos1,
                seq,
                channel,
                payload,
            } => {
                w.small(11);
                w.small(*victim as u8);
                w.small(*other as u8);
                w.small(u8::from(*qos1));
                w.small(*seq as u8);
                w.small(*channel as u8);
                w.bytes(payload);
            }
            Op::ForgeDeliveryAnswer { victim, other, seq } => {
                w.small(12);
                w.small(*victim as u8);
                w.small(*other as u8);
                w.small(*seq as u8);
            }
            Op::Replay { index, from } => {
                w.small(13);
                w.wide(*index);
                w.small(*from as u8);
            }
            Op::Mutate {
                index,
                from,
                cut,
                flips,
            } => {
                w.small(14);
                w.wide(*index);
                w.small(*from as u8);
                w.wide(*cut);
                w.flips(flips);
            }
            Op::Splice { a, b, from } => {
                w.small(15);
                w.wide(*a);
                w.wide(*b);
                w.small(*from as u8);
            }
            Op::Raw { from, bytes } => {
                w.small(16);
                w.small(*from as u8);
                w.bytes(bytes);
            }
            Op::MutateAnswer {
                index,
                device,
                flips,
            } => {
                w.small(17);
                w.wide(*index);
                w.small(*device as u8);
                w.flips(flips);
            }
            Op::RawAnswer { device, bytes } => {
                w.small(18);
                w.small(*device as u8);
                w.bytes(bytes);
            }
        }
    }
}

/// Writes what `Unstructured` reads back: a value below 256 from one byte (taken modulo the range), a `u16` from two
/// bytes (high first), a byte string as its length then its bytes.
struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn small(&mut self, v: u8) {
        self.0.push(v);
    }

    fn lose(&mut self, lose: bool) {
        self.0.push(if lose { 0 } else { 1 });
    }

    fn wide(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }

    fn bytes(&mut self, b: &[u8]) {
        self.0.push(b.len() as u8);
        self.0.extend_from_slice(b);
    }

    fn flips(&mut self, flips: &[(u16, u8)]) {
        self.small(flips.len() as u8);
        for &(at, x) in flips {
            self.wide(at);
            self.small(x);
        }
    }
}

/// A kind (its index in [`crate::pure::KINDS`]) and operations, as the target's input.
pub fn input(kind: usize, ops: &[Op]) -> Vec<u8> {
    let mut out = vec![kind as u8];
    for op in ops {
        op.write(&mut out);
    }
    out
}

/// The kind index and operations of an input, as the target reads them (at most `max_ops`).
pub fn read_input(data: &[u8], max_ops: usize) -> Option<(usize, Vec<Op>)> {
    let mut u = Unstructured::new(data);
    let kind = u.choose_index(crate::pure::KINDS.len()).ok()?;
    let mut ops = Vec::new();
    while ops.len() < max_ops && !u.is_empty() {
        let Ok(op) = Op::read(&mut u) else { break };
        ops.push(op);
    }
    Some((kind, ops))
}
