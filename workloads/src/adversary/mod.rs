//! The adversary: a hostile peer the runner starts beside a run, as its own process (`runner adversary`), that
//! attacks the server for the whole run with what an outside attacker, or an enrolled device turned malicious, can
//! send.
//!
//! What it holds ([`enroll`]): the server's public material (Pure: the node's public key and the allow-list, which
//! holds public keys only; TLS: the CA certificate), keys and a CA it makes itself, and one identity the server
//! allows: an extra device the operator enrolled, never one of the workload's honest devices (device N of N+1, so
//! its orders are stored under a sender id of its own). It is given no honest device's secret and can sniff nothing:
//! the records it replays are its own, captured as it sent them.
//!
//! What it sends, by family ([`pure`], [`quic`], [`mqtt`]), is listed in `docs/security.md`; every kind is counted
//! in a [`Tally`] and reported on its control line as a server reports its statistics (see [`crate::process`]): a
//! ready line, then one JSON line ([`Report`]) per `stats` request; it exits at the end of its input, so it never
//! outlives the runner.
//!
//! [`hostile`] is the runner's side: enrolment, starting and stopping the adversary beside a run, reading what it
//! sent, and taking its own orders out of the audit.

pub mod enroll;
pub mod hostile;
mod mqtt;
mod noise;
mod pure;
mod quic;
mod tlsconf;

use crate::process::{ReadyLine, ReadyMessage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncBufReadExt;
use tokio::task::JoinSet;
use transport_core::TransportError;

/// The names of what the adversary sends, as they appear in its report and in results (`adversary_<kind>`).
pub mod kind {
    /// Random bytes in a UDP datagram (at most the transport's largest datagram).
    pub const RANDOM_DATAGRAM: &str = "random_datagram";
    /// A TCP connection carrying random bytes, then closed.
    pub const RANDOM_STREAM: &str = "random_stream";
    /// A datagram larger than Pure's 1,200-byte maximum.
    pub const OVERSIZED_DATAGRAM: &str = "oversized_datagram";
    /// One of its own valid records cut short (every length in turn, the empty datagram included).
    pub const TRUNCATED: &str = "truncated";
    /// One of its own records or orders, captured as it was sent, sent again (also after the server restarted).
    pub const REPLAYED: &str = "replayed";
    /// A record naming an allowed device's key id, sealed with its own keys.
    pub const FORGED_SENDER: &str = "forged_sender";
    /// A record sealed under its own HPKE session (whose first record opened) naming another device.
    pub const CROSS_SESSION: &str = "cross_session";
    /// A well-sealed record from a key that is not on the allow-list.
    pub const UNKNOWN_SENDER: &str = "unknown_sender";
    /// A datagram from a spoofed source address (a raw socket): its own record from port 0, junk from anywhere.
    pub const SPOOFED_SOURCE: &str = "spoofed_source";
    /// A valid order of its own identity (stored under its own sender id).
    pub const OWN_ORDER: &str = "own_order";
    /// Over its own authenticated connection: an order naming another device's sender id.
    pub const WRONG_SENDER: &str = "wrong_sender";
    /// Over its own authenticated connection: a stream or packet that is not a well-formed order or MQTT packet.
    pub const MALFORMED: &str = "malformed";
    /// Over its own authenticated connection: a frame or packet announcing more than the server's maximum.
    pub const OVERSIZED: &str = "oversized";
    /// A full handshake with a certificate from a CA of its own.
    pub const FOREIGN_CERTIFICATE: &str = "foreign_certificate";
    /// A handshake without a client certificate.
    pub const NO_CERTIFICATE: &str = "no_certificate";
    /// A handshake begun and left: a TCP connection then silence, or a QUIC Initial then silence.
    pub const HALF_OPEN: &str = "half_open";
    /// MQTT: a CONNECT with another device's client identifier.
    pub const OTHER_CLIENT_ID: &str = "other_client_id";
    /// MQTT: an order PUBLISH to another device's topic.
    pub const OTHER_DEVICE_TOPIC: &str = "other_device_topic";
    /// MQTT: a SUBSCRIBE with a filter deeper than the level cap.
    pub const DEEP_FILTER: &str = "deep_filter";
    /// MQTT: one SUBSCRIBE with 150,000 filters.
    pub const HUGE_SUBSCRIBE: &str = "huge_subscribe";
    /// MQTT: a retained PUBLISH of 16 KiB to a topic of its own (sent in bursts).
    pub const RETAINED: &str = "retained";
}

/// Errors of the adversary.
#[derive(Debug, thiserror::Error)]
pub enum AdversaryError {
    /// No adversary speaks this transport.
    #[error("no adversary for transport `{0}` (Pure variants, quinn, s2n-quic and mqtt have one)")]
    Unsupported(String),
    /// Its identity directory is missing or damaged.
    #[error("adversary identity: {0}")]
    Identity(String),
    /// A transport library failed.
    #[error("{0}")]
    Transport(#[from] TransportError),
    /// A file or socket operation failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// Its control line could not be written or read.
    #[error("control line: {0}")]
    Control(String),
}

/// How the adversary is started (`runner adversary`).
#[derive(Debug, Clone)]
pub struct Config {
    /// The transport spec of the server it attacks.
    pub spec: String,
    /// The server's address.
    pub target: SocketAddr,
    /// Its own identity directory ([`enroll`]).
    pub identity: PathBuf,
    /// Datagrams, records and packets per second, over every cheap kind together.
    pub rate: f64,
    /// Connections (handshakes) per second, over every kind that opens one together.
    pub connect_rate: f64,
}

/// The families of transports, each attacked by its own module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Pure sealed links over UDP, sealing with this kind.
    Pure(transport_pure::wire::Kind),
    /// QUIC with TLS 1.3 and client certificates (quinn, s2n-quic).
    Quic,
    /// MQTT 3.1.1 over TLS 1.3 with client certificates.
    Mqtt,
}

/// The family of a transport spec.
pub fn family(spec: &str) -> Result<Family, AdversaryError> {
    if let Some(pure) = transport_pure::variant(spec) {
        return Ok(Family::Pure(pure.kind()));
    }
    let base = spec.split([':', '@']).next().unwrap_or(spec);
    match base {
        "quinn" | "s2n-quic" => Ok(Family::Quic),
        "mqtt" => Ok(Family::Mqtt),
        _ => Err(AdversaryError::Unsupported(spec.to_string())),
    }
}

/// What the adversary has sent, by kind, and what the runner needs to tell its orders from the honest devices'.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Report {
    /// How many of each kind it sent (see [`kind`]).
    pub sent: BTreeMap<String, u64>,
    /// The sender id its own valid identity stores orders under.
    pub own_sender: u64,
    /// The sender runs it used in records and orders naming other devices: any of them in the store's log was applied
    /// in another device's name.
    pub forged_runs: Vec<u64>,
    /// Answers "stored" it received for its own orders (replays included).
    pub answered: u64,
    /// What it could not do, and why (e.g. spoofing without a raw socket).
    pub notes: Vec<String>,
    /// Its own CPU seconds so far (it shares the machine with the server and the load generator); `None` if they
    /// could not be read.
    pub cpu_s: Option<f64>,
}

impl Report {
    /// Everything it sent.
    pub fn total(&self) -> u64 {
        self.sent.values().sum()
    }
}

/// The adversary's counts, shared by its tasks.
#[derive(Debug, Default)]
pub struct Tally {
    sent: Mutex<BTreeMap<&'static str, u64>>,
    forged_runs: Mutex<Vec<u64>>,
    notes: Mutex<Vec<String>>,
    answered: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Tally {
    /// Count `n` of `kind` sent.
    pub fn add(&self, kind: &'static str, n: u64) {
        *lock(&self.sent).entry(kind).or_default() += n;
    }

    /// Count one of `kind` sent.
    pub fn one(&self, kind: &'static str) {
        self.add(kind, 1);
    }

    /// An answer "stored" for one of its own orders.
    pub fn answered(&self) {
        self.answered.fetch_add(1, Ordering::Relaxed);
    }

    /// A sender run used in another device's name.
    pub fn forged_run(&self, run: u64) {
        let mut runs = lock(&self.forged_runs);
        if !runs.contains(&run) {
            runs.push(run);
        }
    }

    /// Something it could not do (said once).
    pub fn note(&self, what: String) {
        let mut notes = lock(&self.notes);
        if !notes.contains(&what) {
            notes.push(what);
        }
    }

    /// The report of everything so far.
    pub fn report(&self, own_sender: u64) -> Report {
        Report {
            sent: lock(&self.sent)
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            own_sender,
            forged_runs: lock(&self.forged_runs).clone(),
            answered: self.answered.load(Ordering::Relaxed),
            notes: lock(&self.notes).clone(),
            cpu_s: transport_core::procfs::self_cpu_time()
                .ok()
                .map(|d| d.as_secs_f64()),
        }
    }
}

/// Paces one attack: at most `per_second` ticks a second, ticks missed while busy skipped (the adversary never
/// bursts to catch up).
pub struct Pace(tokio::time::Interval);

impl Pace {
    /// A pace of `per_second` (at least one a minute).
    pub fn per_second(per_second: f64) -> Pace {
        let period = Duration::from_secs_f64(1.0 / per_second.max(1.0 / 60.0));
        let mut i = tokio::time::interval(period);
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        Pace(i)
    }

    /// Wait for the next tick.
    pub async fn tick(&mut self) {
        self.0.tick().await;
    }
}

/// A random nonzero 64-bit number (a sender run).
pub fn nonzero() -> u64 {
    loop {
        let r: u64 = rand::random();
        if r != 0 {
            return r;
        }
    }
}

/// What every attack task is given.
#[derive(Clone)]
pub struct Ctx {
    /// How it was started.
    pub config: Arc<Config>,
    /// Its own identity.
    pub own: Arc<enroll::Own>,
    /// Where it counts.
    pub tally: Arc<Tally>,
}

/// The control line that stops every attack, leaving the connections it holds open until it exits; answered with
/// the final [`Report`].
pub const QUIET: &str = "quiet";

/// Run the adversary: start every attack of the target's family, write the ready line, answer `stats` (and
/// [`QUIET`]) with the [`Report`] until the input ends, then stop.
pub async fn serve(config: Config) -> Result<(), AdversaryError> {
    let family = family(&config.spec)?;
    let own = enroll::Own::load(&config.identity)?;
    let ctx = Ctx {
        config: Arc::new(config.clone()),
        own: Arc::new(own),
        tally: Arc::new(Tally::default()),
    };
    let mut tasks = JoinSet::new();
    match family {
        Family::Pure(kind) => pure::start(&ctx, kind, &mut tasks).await?,
        Family::Quic => quic::start(&ctx, &mut tasks).await?,
        Family::Mqtt => mqtt::start(&ctx, &mut tasks).await?,
    }
    let ready = ReadyMessage {
        ready: ReadyLine {
            transport: config.spec.clone(),
            addr: config.target,
            public_key: ctx.own.name.clone(),
            pid: std::process::id(),
            serving_pid: None,
        },
    };
    print_line(
        &serde_json::to_string(&ready).map_err(|e| AdversaryError::Control(e.to_string()))?,
    )?;
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    loop {
        tokio::select! {
            line = lines.next_line() => match line?.as_deref().map(str::trim) {
                None => break,
                Some(command @ ("stats" | QUIET)) => {
                    if command == QUIET {
                        // Connections it holds open (half-open ones) stay open until it exits.
                        tasks.abort_all();
                        while tasks.join_next().await.is_some() {}
                    }
                    let report = ctx.tally.report(ctx.own.sender);
                    let text = serde_json::to_string(&report)
                        .map_err(|e| AdversaryError::Control(e.to_string()))?;
                    print_line(&text)?;
                }
                Some(_) => print_line("{\"error\":\"unknown command\"}")?,
            },
            // An attack that ends early is noted; the others go on.
            Some(ended) = tasks.join_next(), if !tasks.is_empty() => {
                let what = match ended {
                    Ok(Ok(())) => "an attack ended".to_string(),
                    Ok(Err(e)) => format!("an attack stopped: {e}"),
                    Err(e) => format!("an attack task failed: {e}"),
                };
                ctx.tally.note(what);
            }
        }
    }
    tasks.abort_all();
    Ok(())
}

fn print_line(line: &str) -> Result<(), AdversaryError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_of_specs() {
        use transport_pure::wire::Kind;
        assert_eq!(family("pure").unwrap(), Family::Pure(Kind::Link));
        assert_eq!(family("pure:plain").unwrap(), Family::Pure(Kind::Plain));
        assert_eq!(
            family("pure:hpke-session").unwrap(),
            Family::Pure(Kind::HpkeSession)
        );
        assert_eq!(family("s2n-quic:rustls").unwrap(), Family::Quic);
        assert_eq!(family("mqtt@mosquitto").unwrap(), Family::Mqtt);
        assert!(family("carrier-pigeon").is_err());
    }

    #[test]
    fn the_tally_reports_by_kind() {
        let t = Tally::default();
        t.one(kind::TRUNCATED);
        t.add(kind::TRUNCATED, 2);
        t.forged_run(7);
        t.forged_run(7);
        t.note("x".into());
        let r = t.report(9);
        assert_eq!((r.sent[kind::TRUNCATED], r.total()), (3, 3));
        assert_eq!(
            (r.own_sender, r.forged_runs, r.notes.len()),
            (9, vec![7], 1)
        );
    }
}
