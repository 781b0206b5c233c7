//! Random bytes at the server's port: datagrams for a UDP server, byte streams for a TCP one. What any host on the
//! path can send without knowing anything about the protocol.

use super::{kind, AdversaryError, Ctx, Pace};
use rand::{Rng, RngExt};
use std::ops::RangeInclusive;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};
use transport_core::net;

/// Random datagrams of lengths in `len`, counted as `what`, at `per_second`.
pub async fn datagrams(
    ctx: Ctx,
    per_second: f64,
    len: RangeInclusive<usize>,
    what: &'static str,
) -> Result<(), AdversaryError> {
    let target = ctx.config.target;
    let socket = UdpSocket::bind(net::any_port_for(target)).await?;
    let mut pace = Pace::per_second(per_second);
    let mut buf = Vec::new();
    loop {
        pace.tick().await;
        let n = rand::rng().random_range(len.clone());
        buf.resize(n, 0);
        rand::rng().fill_bytes(&mut buf);
        // A send that fails (the server's port closed during a restart) is retried with the next datagram.
        if socket.send_to(&buf, target).await.is_ok() {
            ctx.tally.one(what);
        }
    }
}

/// TCP connections to the server each carrying 1 to 4,096 random bytes, then closed, at `per_second`. One in four
/// starts like a TLS handshake record, so that it reaches the TLS parser's deeper checks.
pub async fn streams(ctx: Ctx, per_second: f64) -> Result<(), AdversaryError> {
    let target = ctx.config.target;
    let mut pace = Pace::per_second(per_second);
    loop {
        pace.tick().await;
        let mut bytes = vec![0u8; rand::rng().random_range(1..=4096)];
        rand::rng().fill_bytes(&mut bytes);
        if rand::rng().random_ratio(1, 4) && bytes.len() > 5 {
            bytes[..3].copy_from_slice(&[0x16, 0x03, 0x01]);
        }
        let ctx = ctx.clone();
        // Each stream in a task of its own, so a server that reads slowly does not slow the pace.
        tokio::spawn(async move {
            let Ok(Ok(mut tcp)) =
                tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(target)).await
            else {
                return;
            };
            if tcp.write_all(&bytes).await.is_ok() {
                ctx.tally.one(kind::RANDOM_STREAM);
            }
            let _ = tcp.shutdown().await;
        });
    }
}
