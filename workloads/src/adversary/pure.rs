//! The adversary against a Pure receiver, over UDP.
//!
//! It holds the receiver's public key, the allow-list (public keys: every device's key id), its own enrolled device
//! key, and a stranger key it makes at start. Its records are built with the variant's own construction (the same
//! wire format and key schedule as a device's), so every one is well formed until it is cut or renamed. Each tick
//! sends one of, in turn:
//!
//! - [`OWN_ORDER`](kind::OWN_ORDER): a valid record of its own identity, captured as sent (answered and stored under
//!   its own sender id);
//! - [`TRUNCATED`](kind::TRUNCATED): a captured record cut at every length in turn, 0 (the empty datagram) to one
//!   byte short;
//! - [`REPLAYED`](kind::REPLAYED): a captured record again, for the whole run (the server's restart included);
//! - [`FORGED_SENDER`](kind::FORGED_SENDER): a record naming an allowed device's key id (each in turn), sealed with
//!   its own keys under a sender run of its own ([`Report::forged_runs`](super::Report));
//! - [`CROSS_SESSION`](kind::CROSS_SESSION) (`pure:hpke-session`): a record naming another device under its own HPKE
//!   session, whose own records opened;
//! - [`UNKNOWN_SENDER`](kind::UNKNOWN_SENDER): a well-sealed record from the stranger key;
//! - [`OVERSIZED_DATAGRAM`](kind::OVERSIZED_DATAGRAM): 1,201 to 4,000 random bytes;
//! - [`SPOOFED_SOURCE`](kind::SPOOFED_SOURCE) (with a raw socket, i.e. as root or with CAP_NET_RAW): a captured
//!   record from source port 0, junk and captured records from random loopback sources;
//!
//! and, in a task of its own, [`RANDOM_DATAGRAM`](kind::RANDOM_DATAGRAM)s of 1 to 1,200 random bytes. Answers that
//! come back for its own records are counted ([`Tally::answered`](super::Tally::answered)) and give it the receiver
//! run it seals `pure` records for.

use super::{kind, noise, nonzero, AdversaryError, Ctx, Pace};
use rand::rngs::StdRng;
use rand::{Rng, RngExt};
use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::net::UdpSocket;
use tokio::task::JoinSet;
use transport_core::{keys, net, order::fill_payload, OrderId};
use transport_pure::crypto::{link_secret, put_record, NodeKey, Sealer as RecordSealer, WireKeys};
use transport_pure::senders::AllowList;
use transport_pure::wire::{self, Frame, Head, KeyId, Kind, Op, ENC_LEN, MAX_DATAGRAM};

/// Bytes of payload in its records.
const PAYLOAD: usize = 64;
/// Captured records kept for truncation and replay.
const CAPTURED: usize = 256;

/// Start the attacks on a Pure receiver sealing with `kind`.
pub async fn start(
    ctx: &Ctx,
    kind: Kind,
    tasks: &mut JoinSet<Result<(), AdversaryError>>,
) -> Result<(), AdversaryError> {
    let dir = &ctx.config.identity;
    let identity_err = |e: &dyn std::fmt::Display| AdversaryError::Identity(e.to_string());
    let receiver = keys::read_key32(&dir.join(transport_pure::files::NODE_PUB))
        .map_err(|e| identity_err(&e))?;
    let own = keys::read_key32(&dir.join(super::enroll::OWN_KEY)).map_err(|e| identity_err(&e))?;
    let own = NodeKey::from_secret(own);
    let allowed =
        AllowList::load(&dir.join(transport_pure::files::SENDERS)).map_err(|e| identity_err(&e))?;
    let victims: Vec<KeyId> = allowed
        .senders()
        .iter()
        .map(|s| wire::key_id(&s.public))
        .filter(|id| *id != own.key_id())
        .collect();
    if victims.is_empty() {
        return Err(identity_err(&"the allow-list names no device but its own"));
    }
    let target = ctx.config.target;
    let socket = Arc::new(UdpSocket::bind(net::any_port_for(target)).await?);
    let receiver_run = Arc::new(AtomicU64::new(0));
    let mut rng = rand::make_rng::<StdRng>();
    let stranger = NodeKey::generate(&mut rng);
    let forge_run = nonzero();
    ctx.tally.forged_run(forge_run);
    let own_run = nonzero();
    if kind == Kind::HpkeSession {
        // Its own run also names other devices (cross-session records).
        ctx.tally.forged_run(own_run);
    }
    let spoof = match RawUdp::open() {
        Ok(raw) if target.is_ipv4() => Some(raw),
        Ok(_) => {
            ctx.tally
                .note("spoofed sources: IPv4 only, the target is IPv6".into());
            None
        }
        Err(e) => {
            ctx.tally.note(format!(
                "spoofed sources: no raw socket ({e}); it needs root or CAP_NET_RAW"
            ));
            None
        }
    };
    let own_key_id = own.key_id();
    let cycle: Vec<&'static str> = CYCLE
        .iter()
        .copied()
        .filter(|k| *k != kind::CROSS_SESSION || kind == Kind::HpkeSession)
        .filter(|k| *k != kind::SPOOFED_SOURCE || spoof.is_some())
        .collect();
    let attack = Attack {
        cycle,
        ctx: ctx.clone(),
        socket: socket.clone(),
        receiver_run: receiver_run.clone(),
        own_key_id,
        own_sender: ctx.own.sender,
        own: Sealer::new(kind, own.clone(), receiver, own_run),
        own_seq: 0,
        forger: Sealer::new(kind, own, receiver, forge_run),
        forge_seq: 0,
        stranger: Sealer::new(kind, stranger, receiver, nonzero()),
        stranger_seq: 0,
        victims,
        victim: 0,
        captured: VecDeque::new(),
        cut: (0, 0),
        replay: 0,
        spoof,
        rng,
    };
    // A tenth of the rate is random datagrams; the rest goes through the cycle of crafted ones.
    let rate = ctx.config.rate;
    tasks.spawn(noise::datagrams(
        ctx.clone(),
        rate / 10.0,
        1..=MAX_DATAGRAM,
        kind::RANDOM_DATAGRAM,
    ));
    tasks.spawn(attack.run(rate * 0.9));
    tasks.spawn(answers(
        ctx.clone(),
        socket,
        receiver_run,
        (own_key_id, own_run),
    ));
    Ok(())
}

/// Seals records of one key for one sender run with the variant's construction: what a device does, except that the
/// key id in the header can name anyone.
struct Sealer {
    kind: Kind,
    key: NodeKey,
    receiver: [u8; 32],
    run: u64,
    rng: StdRng,
    session: Option<([u8; ENC_LEN], WireKeys)>,
    link: Option<(u64, WireKeys)>,
}

impl Sealer {
    fn new(kind: Kind, key: NodeKey, receiver: [u8; 32], run: u64) -> Sealer {
        Sealer {
            kind,
            key,
            receiver,
            run,
            rng: rand::make_rng::<StdRng>(),
            session: None,
            link: None,
        }
    }

    /// Record `seq` naming `key_id`, for receiver run `receiver_run` (`pure`), with a pattern payload.
    fn record(&mut self, key_id: &KeyId, seq: u64, receiver_run: u64, sender: u64) -> Vec<u8> {
        let kind = self.kind;
        let (variant, keys): (Vec<u8>, Option<WireKeys>) = match kind {
            Kind::Plain => (Vec::new(), None),
            Kind::HpkeSession => {
                let (enc, keys) = self.session.get_or_insert_with(|| {
                    WireKeys::hpke_sender(&mut self.rng, &self.key, &self.receiver)
                });
                (enc.to_vec(), Some(keys.clone()))
            }
            Kind::HpkePerRequest => {
                let (enc, keys) = WireKeys::hpke_sender(&mut self.rng, &self.key, &self.receiver);
                (enc.to_vec(), Some(keys))
            }
            Kind::Link => {
                let keys = match &self.link {
                    Some((rr, keys)) if *rr == receiver_run => keys.clone(),
                    _ => {
                        let secret = link_secret(
                            &self.key,
                            &self.receiver,
                            self.key.public(),
                            &self.receiver,
                        )
                        .expect("the receiver's key is no point of small order");
                        let keys = WireKeys::link(&secret, self.run, receiver_run);
                        self.link = Some((receiver_run, keys.clone()));
                        keys
                    }
                };
                (receiver_run.to_be_bytes().to_vec(), Some(keys))
            }
        };
        let id = OrderId {
            sender,
            run: self.run,
            seq,
        };
        let mut payload = Vec::with_capacity(PAYLOAD);
        fill_payload(&id, PAYLOAD, &mut payload);
        let made_us = crate::harness::unix_us();
        let head = Head {
            kind,
            op: Op::Order,
            key_id,
            run: self.run,
            number: seq,
            variant: &variant,
        };
        let mut frame = Vec::with_capacity(wire::record_len(kind, Op::Order, PAYLOAD));
        let sealer = keys.as_ref().map(|k| k as &dyn RecordSealer);
        put_record(&mut frame, &head, sealer, &made_us.to_be_bytes(), &payload);
        frame
    }
}

/// The cycle of crafted datagrams.
struct Attack {
    cycle: Vec<&'static str>,
    ctx: Ctx,
    socket: Arc<UdpSocket>,
    receiver_run: Arc<AtomicU64>,
    own_key_id: KeyId,
    own_sender: u64,
    own: Sealer,
    own_seq: u64,
    forger: Sealer,
    forge_seq: u64,
    stranger: Sealer,
    stranger_seq: u64,
    victims: Vec<KeyId>,
    victim: usize,
    captured: VecDeque<Vec<u8>>,
    /// The next cut: (captured record, length).
    cut: (usize, usize),
    replay: usize,
    spoof: Option<RawUdp>,
    rng: StdRng,
}

/// The cycle: truncations weigh most (a record has as many as it has bytes).
const CYCLE: &[&str] = &[
    kind::OWN_ORDER,
    kind::TRUNCATED,
    kind::TRUNCATED,
    kind::TRUNCATED,
    kind::REPLAYED,
    kind::FORGED_SENDER,
    kind::CROSS_SESSION,
    kind::UNKNOWN_SENDER,
    kind::OVERSIZED_DATAGRAM,
    kind::SPOOFED_SOURCE,
];

impl Attack {
    async fn run(mut self, per_second: f64) -> Result<(), AdversaryError> {
        let mut pace = Pace::per_second(per_second);
        let mut step = 0usize;
        loop {
            pace.tick().await;
            let what = self.cycle[step % self.cycle.len()];
            step += 1;
            let sent = match self.craft(what) {
                Some(Out::Plain(bytes)) => self
                    .socket
                    .send_to(&bytes, self.ctx.config.target)
                    .await
                    .is_ok(),
                Some(Out::Spoofed(from, bytes)) => self.spoof_send(from, &bytes),
                None => false,
            };
            if sent {
                self.ctx.tally.one(what);
            }
        }
    }

    fn next_victim(&mut self) -> KeyId {
        self.victim = (self.victim + 1) % self.victims.len();
        self.victims[self.victim]
    }

    fn capture(&mut self, record: &[u8]) {
        if self.captured.len() == CAPTURED {
            self.captured.pop_front();
            self.cut.0 = self.cut.0.saturating_sub(1);
        }
        self.captured.push_back(record.to_vec());
    }

    /// A captured record, in turn.
    fn replayed(&mut self) -> Option<Vec<u8>> {
        if self.captured.is_empty() {
            return None;
        }
        self.replay = (self.replay + 1) % self.captured.len();
        Some(self.captured[self.replay].clone())
    }

    fn craft(&mut self, what: &'static str) -> Option<Out> {
        let rr = self.receiver_run.load(Ordering::Relaxed);
        Some(Out::Plain(match what {
            kind::OWN_ORDER => {
                let id = self.own_key_id;
                let r = self.own.record(&id, self.own_seq, rr, self.own_sender);
                self.own_seq += 1;
                self.capture(&r);
                r
            }
            kind::TRUNCATED => {
                let (i, len) = self.cut;
                let record = self.captured.get(i)?;
                let cut = record[..len].to_vec();
                self.cut = if len + 1 < record.len() {
                    (i, len + 1)
                } else {
                    ((i + 1) % self.captured.len(), 0)
                };
                cut
            }
            kind::REPLAYED => self.replayed()?,
            kind::FORGED_SENDER => {
                let victim = self.next_victim();
                self.forge_seq += 1;
                self.forger.record(&victim, self.forge_seq, rr, 0)
            }
            kind::CROSS_SESSION => {
                // Only once its own session has opened (its first own record).
                if self.own_seq == 0 {
                    return None;
                }
                let victim = self.next_victim();
                // A number its own records have not used, so that nothing of its own is overwritten.
                let seq = u64::MAX / 2 + self.own_seq;
                self.own.record(&victim, seq, rr, 0)
            }
            kind::UNKNOWN_SENDER => {
                self.stranger_seq += 1;
                let id = self.stranger.key.key_id();
                self.stranger.record(&id, self.stranger_seq, rr, 0)
            }
            kind::OVERSIZED_DATAGRAM => {
                let mut bytes = vec![0u8; self.rng.random_range(MAX_DATAGRAM + 1..=4000)];
                self.rng.fill_bytes(&mut bytes);
                bytes
            }
            kind::SPOOFED_SOURCE => return self.spoofed(),
            _ => return None,
        }))
    }

    /// In turn: a captured record from source port 0 (the server's answer cannot be sent), junk from a random
    /// loopback source, a captured record from a random loopback source (its answer goes nowhere).
    fn spoofed(&mut self) -> Option<Out> {
        self.spoof.as_ref()?;
        let ip = Ipv4Addr::new(127, self.rng.random(), self.rng.random(), self.rng.random());
        let port = self.rng.random_range(1024..=65535);
        Some(match self.rng.random_range(0..3) {
            0 => Out::Spoofed(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), self.replayed()?),
            1 => {
                let mut junk = vec![0u8; self.rng.random_range(1..=MAX_DATAGRAM)];
                self.rng.fill_bytes(&mut junk);
                Out::Spoofed(SocketAddrV4::new(ip, port), junk)
            }
            _ => Out::Spoofed(SocketAddrV4::new(ip, port), self.replayed()?),
        })
    }

    fn spoof_send(&self, from: SocketAddrV4, bytes: &[u8]) -> bool {
        let (Some(raw), SocketAddr::V4(to)) = (&self.spoof, self.ctx.config.target) else {
            return false;
        };
        raw.send(from, to, bytes).is_ok()
    }
}

enum Out {
    Plain(Vec<u8>),
    Spoofed(SocketAddrV4, Vec<u8>),
}

/// Count the answers to its own orders and learn the receiver run from them. Answers to anything else are not
/// counted: to a replay (counted by its replays' own kind), to a forged record that opened (only under
/// `pure:plain`, which authenticates nothing; the audit shows those).
async fn answers(
    ctx: Ctx,
    socket: Arc<UdpSocket>,
    receiver_run: Arc<AtomicU64>,
    own: (KeyId, u64),
) -> Result<(), AdversaryError> {
    let mut buf = vec![0u8; 65536];
    let mut seen = std::collections::HashSet::new();
    loop {
        let Ok((n, _)) = socket.recv_from(&mut buf).await else {
            continue; // an ICMP report of an earlier send
        };
        for frame in wire::frames(&buf[..n]) {
            let Ok(Frame::Answer(a)) = frame else { break };
            receiver_run.store(a.receiver_run, Ordering::Relaxed);
            if (a.key_id, a.run) == own && seen.insert(a.seq) {
                ctx.tally.answered();
            }
        }
    }
}

/// A raw IPv4 socket that sends UDP datagrams from any source address (the kernel fills in the IP header's checksum
/// and length; a UDP checksum of 0 means none).
struct RawUdp(OwnedFd);

impl RawUdp {
    fn open() -> std::io::Result<RawUdp> {
        // SAFETY: socket() takes plain integers and returns a new descriptor or -1.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a new descriptor nothing else owns.
        Ok(RawUdp(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn send(&self, from: SocketAddrV4, to: SocketAddrV4, payload: &[u8]) -> std::io::Result<()> {
        let udp_len = 8 + payload.len();
        let total = u16::try_from(20 + udp_len)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        let mut packet = Vec::with_capacity(total as usize);
        packet.extend_from_slice(&[0x45, 0]);
        packet.extend_from_slice(&total.to_be_bytes());
        packet.extend_from_slice(&[0, 0, 0, 0, 64, libc::IPPROTO_UDP as u8, 0, 0]);
        packet.extend_from_slice(&from.ip().octets());
        packet.extend_from_slice(&to.ip().octets());
        packet.extend_from_slice(&from.port().to_be_bytes());
        packet.extend_from_slice(&to.port().to_be_bytes());
        packet.extend_from_slice(&(udp_len as u16).to_be_bytes());
        packet.extend_from_slice(&[0, 0]);
        packet.extend_from_slice(payload);
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(to.ip().octets()),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: the buffer and the address are valid for the lengths given, and the descriptor is ours.
        let n = unsafe {
            libc::sendto(
                self.0.as_raw_fd(),
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&sa as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if n < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}
