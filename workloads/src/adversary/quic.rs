//! The adversary against a QUIC server (quinn, s2n-quic): the orders protocol over QUIC with TLS 1.3 and client
//! certificates ([`transport_conn::quic`]). Whatever library serves, the adversary speaks QUIC with quinn.
//!
//! Its tasks, each at its share of the rates:
//!
//! - [`RANDOM_DATAGRAM`](kind::RANDOM_DATAGRAM)s of 1 to 1,500 random bytes (half the datagram rate);
//! - handshake floods: full handshakes with a certificate from a CA of its own
//!   ([`FOREIGN_CERTIFICATE`](kind::FOREIGN_CERTIFICATE)) and with none ([`NO_CERTIFICATE`](kind::NO_CERTIFICATE));
//! - [`HALF_OPEN`](kind::HALF_OPEN) handshakes: a client Initial (a real ClientHello, from quinn-proto's sans-IO
//!   endpoint) from a socket that never reads the server's answer;
//! - its own enrolled device, over one connection (opened again whenever it drops, as after the server's restart):
//!   in turn its own [`OWN_ORDER`](kind::OWN_ORDER)s, [`REPLAYED`](kind::REPLAYED) ones, orders naming another device
//!   ([`WRONG_SENDER`](kind::WRONG_SENDER)), frames of the right length and a body of random bytes
//!   ([`MALFORMED`](kind::MALFORMED)) and a frame announcing more than the 1 MiB maximum
//!   ([`OVERSIZED`](kind::OVERSIZED)).

use super::tlsconf::Clients;
use super::{kind, noise, nonzero, AdversaryError, Ctx, Pace};
use bytes::BytesMut;
use quinn::crypto::rustls::QuicClientConfig;
use rand::{Rng, RngExt};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use transport_conn::fleet::Answer;
use transport_conn::quic::{read_answer, ALPN};
use transport_core::{framing, net, Order, TransportError};
use transport_tls::SERVER_NAME;

/// Handshakes (or acts of its own device) in flight at most: a server that stalls slows the adversary's floods
/// instead of piling up its tasks.
const IN_FLIGHT: usize = 64;

fn quic_config(tls: &Arc<rustls::ClientConfig>) -> Result<quinn::ClientConfig, AdversaryError> {
    let crypto = QuicClientConfig::try_from(tls.clone())
        .map_err(|e| TransportError::Config(e.to_string()))?;
    Ok(quinn::ClientConfig::new(Arc::new(crypto)))
}

/// Start the attacks on a QUIC server.
pub async fn start(
    ctx: &Ctx,
    tasks: &mut JoinSet<Result<(), AdversaryError>>,
) -> Result<(), AdversaryError> {
    let clients = Clients::load(&ctx.config.identity, &[ALPN])?;
    let target = ctx.config.target;
    let socket = net::bind_udp(net::any_port_for(target), 4 << 20)?;
    let endpoint = quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        None,
        socket,
        Arc::new(quinn::TokioRuntime),
    )?;
    let (rate, connect) = (ctx.config.rate, ctx.config.connect_rate);
    tasks.spawn(noise::datagrams(
        ctx.clone(),
        rate / 2.0,
        1..=1500,
        kind::RANDOM_DATAGRAM,
    ));
    tasks.spawn(flood(
        ctx.clone(),
        endpoint.clone(),
        quic_config(&clients.foreign)?,
        connect / 3.0,
        kind::FOREIGN_CERTIFICATE,
    ));
    tasks.spawn(flood(
        ctx.clone(),
        endpoint.clone(),
        quic_config(&clients.anonymous)?,
        connect / 3.0,
        kind::NO_CERTIFICATE,
    ));
    tasks.spawn(half_open(
        ctx.clone(),
        quic_config(&clients.own)?,
        connect / 3.0,
    ));
    tasks.spawn(device(
        ctx.clone(),
        endpoint,
        quic_config(&clients.own)?,
        rate / 2.0,
    ));
    Ok(())
}

/// Full handshakes with `config` (which the server refuses), at `per_second`.
async fn flood(
    ctx: Ctx,
    endpoint: quinn::Endpoint,
    config: quinn::ClientConfig,
    per_second: f64,
    what: &'static str,
) -> Result<(), AdversaryError> {
    let mut pace = Pace::per_second(per_second);
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    loop {
        pace.tick().await;
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let Ok(connecting) = endpoint.connect_with(config.clone(), ctx.config.target, SERVER_NAME)
        else {
            continue;
        };
        ctx.tally.one(what);
        tokio::spawn(async move {
            let _slot = slot;
            // Refused by the server (or, if it ever were accepted, closed at once).
            if let Ok(Ok(conn)) = tokio::time::timeout(Duration::from_secs(5), connecting).await {
                conn.close(0u32.into(), b"");
            }
        });
    }
}

/// Client Initials that are never followed up, at `per_second`: each from a fresh sans-IO endpoint whose state is
/// dropped as soon as its first datagram is out, through a socket that never reads.
async fn half_open(
    ctx: Ctx,
    config: quinn::ClientConfig,
    per_second: f64,
) -> Result<(), AdversaryError> {
    let target = ctx.config.target;
    let socket = UdpSocket::bind(net::any_port_for(target)).await?;
    let mut pace = Pace::per_second(per_second);
    let mut buf = Vec::with_capacity(1500);
    loop {
        pace.tick().await;
        let mut endpoint = quinn_proto::Endpoint::new(
            Arc::new(quinn_proto::EndpointConfig::default()),
            None,
            false,
            None,
        );
        let now = std::time::Instant::now();
        let Ok((_, mut conn)) = endpoint.connect(now, config.clone(), target, SERVER_NAME) else {
            continue;
        };
        buf.clear();
        if let Some(t) = conn.poll_transmit(now, 1, &mut buf) {
            if socket.send_to(&buf[..t.size], target).await.is_ok() {
                ctx.tally.one(kind::HALF_OPEN);
            }
        }
    }
}

/// What its own device does, in turn.
const ACTS: &[&str] = &[
    kind::OWN_ORDER,
    kind::REPLAYED,
    kind::WRONG_SENDER,
    kind::OWN_ORDER,
    kind::MALFORMED,
    kind::OVERSIZED,
];

/// Its own enrolled device: one connection, opened again when it drops; one act per tick, each on a stream of its own.
async fn device(
    ctx: Ctx,
    endpoint: quinn::Endpoint,
    config: quinn::ClientConfig,
    per_second: f64,
) -> Result<(), AdversaryError> {
    let mut pace = Pace::per_second(per_second);
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let sent: Arc<Mutex<VecDeque<Order>>> = Arc::default();
    let (own_run, forge_run) = (nonzero(), nonzero());
    ctx.tally.forged_run(forge_run);
    let mut seq = 0u64;
    let mut conn: Option<quinn::Connection> = None;
    let mut step = 0usize;
    loop {
        pace.tick().await;
        let live = match &conn {
            Some(c) if c.close_reason().is_none() => c.clone(),
            _ => {
                let connecting =
                    endpoint.connect_with(config.clone(), ctx.config.target, SERVER_NAME);
                let Ok(connecting) = connecting else { continue };
                match tokio::time::timeout(Duration::from_secs(5), connecting).await {
                    Ok(Ok(c)) => {
                        conn = Some(c.clone());
                        c
                    }
                    _ => continue,
                }
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let what = ACTS[step % ACTS.len()];
        step += 1;
        let stream = match what {
            kind::OWN_ORDER => {
                let order = crate::harness::order(ctx.own.device, own_run, seq, 64);
                seq += 1;
                let mut out = BytesMut::new();
                framing::encode_order(&order, &mut out);
                let mut kept = sent.lock().unwrap_or_else(|p| p.into_inner());
                if kept.len() == 256 {
                    kept.pop_front();
                }
                kept.push_back(order);
                out
            }
            kind::REPLAYED => {
                let kept = sent.lock().unwrap_or_else(|p| p.into_inner());
                let Some(order) = kept.get(step % kept.len().max(1)) else {
                    continue;
                };
                let mut out = BytesMut::new();
                framing::encode_order(order, &mut out);
                out
            }
            kind::WRONG_SENDER => {
                let victim = rand::rng().random_range(0..ctx.own.device.max(1));
                let order = crate::harness::order(victim, forge_run, seq, 64);
                let mut out = BytesMut::new();
                framing::encode_order(&order, &mut out);
                out
            }
            kind::MALFORMED => {
                // A frame whose length is right and whose body is junk, so it reaches the frame parser (random
                // bytes from the first would announce gigabytes: that is `oversized`).
                let mut junk = vec![0u8; rand::rng().random_range(1..=512)];
                rand::rng().fill_bytes(&mut junk);
                junk[0] |= 0x80; // no frame type this version knows
                let mut out = BytesMut::from(&(junk.len() as u32).to_be_bytes()[..]);
                out.extend_from_slice(&junk);
                out
            }
            _ => {
                let mut out = BytesMut::from(&(u32::MAX).to_be_bytes()[..]);
                out.extend_from_slice(&[0; 64]);
                out
            }
        };
        ctx.tally.one(what);
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let Ok((mut send, mut recv)) = live.open_bi().await else {
                return;
            };
            if send.write_all(&stream).await.is_err() {
                return;
            }
            let _ = send.finish();
            let answer = tokio::time::timeout(Duration::from_secs(5), read_answer(&mut recv)).await;
            if let (Ok(Ok(Answer::Stored(_))), kind::OWN_ORDER) = (answer, what) {
                ctx.tally.answered();
            }
        });
    }
}
