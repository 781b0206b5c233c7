//! The receiver's UDP driver: one socket, the sans-IO [`Receiver`], and the store.
//!
//! Each turn reads every datagram that is waiting (up to a bound), commits all the orders they carried as one
//! group, then sends the answers and the relay's deliveries (up to a bound, so that reading goes on under a fanout;
//! what is left waits in the relay's bounded queues for the next turn). While a group commits, new datagrams wait in
//! the socket's buffer and form the next group: group commit falls out of the loop without a timer. The only timer
//! is the relay's next re-send.
//!
//! Nothing a peer sends can end the loop: answers go to a datagram's source address, which anyone can forge (port 0,
//! a broadcast or unroutable address), so a send that fails is counted (`send_errors`) and dropped, and errors a
//! peer's address causes on receive (ICMP reports) are skipped. Only the socket itself failing, or the store, ends it.

use crate::receiver::Receiver;
use crate::wire::MAX_DATAGRAM;
use std::io;
use std::time::Instant;
use tokio::net::UdpSocket;
use transport_core::commit::SharedStore;
use transport_core::{Counters, TransportError};

/// Datagrams read per turn at most, so answers keep flowing under a flood.
const MAX_DATAGRAMS_PER_TURN: usize = 256;

/// Datagrams sent per turn at most, so reading keeps up under a fanout.
const MAX_SENDS_PER_TURN: usize = 1024;

/// Run the receiver until the socket or the store fails.
pub async fn run(
    socket: UdpSocket,
    mut receiver: Receiver,
    store: SharedStore,
) -> Result<(), TransportError> {
    // One byte over the largest datagram: a longer one arrives cut to this length and is refused whole.
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    let mut out = Vec::with_capacity(MAX_DATAGRAM);
    loop {
        // Wake for a datagram, for the relay's next re-send, or at once if the last turn left output waiting.
        let wake = if receiver.has_output() {
            Some(Instant::now())
        } else {
            receiver.poll_timeout()
        };
        tokio::select! {
            r = socket.readable() => r?,
            _ = sleep_until(wake) => {}
        }
        let now = Instant::now();
        receiver.handle_timeout(now);
        for _ in 0..MAX_DATAGRAMS_PER_TURN {
            match socket.try_recv_from(&mut buf) {
                Ok((n, from)) => receiver.handle(now, from, &buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if caused_by_a_peer(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let (orders, replies) = receiver.take_deliveries();
        if !orders.is_empty() {
            // Applied or already applied: either way the order is durable, so the answer is "stored".
            store.commit(orders).await?;
            for reply in &replies {
                receiver.answer(reply);
            }
        }
        for _ in 0..MAX_SENDS_PER_TURN {
            let Some(to) = receiver.poll_transmit(now, &mut out) else {
                break;
            };
            // The destination is whatever source the datagram claimed: its failure is that datagram's alone.
            if socket.send_to(&out, to).await.is_err() {
                Counters::inc(&receiver.counters().send_errors);
            }
        }
    }
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// Errors a receive reports about an earlier send to some peer (ICMP unreachable, on kernels that report them on
/// unconnected sockets), not about this socket.
fn caused_by_a_peer(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::HostUnreachable
            | io::ErrorKind::NetworkUnreachable
    )
}
