//! The receiver's UDP driver: one socket, the sans-IO [`Receiver`], and the store.
//!
//! The loop reads what is waiting (up to a bound per turn), hands the orders it carried to the store as one group,
//! and answers them once the group is committed. While a group commits (the store's thread writes and syncs it),
//! the loop goes on reading and opening datagrams; what arrives meanwhile becomes the next group, committed as soon
//! as the previous one is. Group commit falls out of the loop without a timer, and the receiver's work overlaps the
//! sync instead of waiting for it. At most [`MAX_WAITING`] orders wait for the next group; beyond that the loop stops
//! reading and datagrams wait in the socket's buffer. Each turn then sends the answers and the relay's deliveries
//! (up to a bound, so that reading goes on under a fanout; what is left waits in the relay's bounded queues for the
//! next turn). The only timer is the relay's next re-send.
//!
//! Nothing a peer sends can end the loop: answers go to a datagram's source address, which anyone can forge (port 0,
//! a broadcast or unroutable address), so a send that fails is counted (`send_errors`) and dropped, and errors a
//! peer's address causes on receive (ICMP reports) are skipped. Only the socket itself failing, or the store, ends it.

use crate::receiver::{Receiver, Reply};
use crate::wire::MAX_DATAGRAM;
use std::io;
use std::time::Instant;
use tokio::io::Interest;
use tokio::net::UdpSocket;
use transport_core::commit::{CommitError, Outcome, SharedStore};
use transport_core::net;
use transport_core::{BoxFuture, Counters, Order, TransportError};

/// Datagrams read per turn at most, so answers keep flowing under a flood.
const MAX_DATAGRAMS_PER_TURN: usize = 256;

/// The most one read brings: the largest UDP payload, which also bounds a run of coalesced datagrams.
const RECEIVE_BUFFER: usize = 1 << 16;

/// Datagrams sent per turn at most, so reading keeps up under a fanout.
const MAX_SENDS_PER_TURN: usize = 1024;

/// Orders read while a group commits, at most, before the loop stops reading.
pub const MAX_WAITING: usize = 65_536;

/// A group being committed and the answers that wait for it.
type Committing = (
    BoxFuture<'static, Result<Vec<Outcome>, CommitError>>,
    Vec<Reply>,
);

/// Run the receiver until the socket or the store fails.
pub async fn run(
    socket: UdpSocket,
    mut receiver: Receiver,
    store: SharedStore,
) -> Result<(), TransportError> {
    // Runs of datagrams a device sent in one segmented send arrive as one read where the kernel allows;
    // elsewhere one datagram per read.
    let _ = net::enable_receive_offload(&socket);
    // Room for the most one read brings: a run of coalesced datagrams, or one datagram of any size (a datagram
    // longer than MAX_DATAGRAM is refused whole by its length).
    let mut buf = vec![0u8; RECEIVE_BUFFER];
    let mut out = Vec::with_capacity(MAX_DATAGRAM);
    let mut committing: Option<Committing> = None;
    let (mut orders, mut replies): (Vec<Order>, Vec<Reply>) = (Vec::new(), Vec::new());
    loop {
        let room = orders.len() < MAX_WAITING;
        // Wake for a datagram, for a committed group, for the relay's next re-send, or at once if the last turn
        // left output waiting.
        let wake = if receiver.has_output() {
            Some(Instant::now())
        } else {
            receiver.poll_timeout()
        };
        tokio::select! {
            r = socket.readable(), if room => {
                r?;
                read(&socket, &mut receiver, &mut buf)?;
                receiver.move_deliveries(&mut orders, &mut replies);
            }
            done = async { (&mut committing.as_mut().expect("guarded").0).await }, if committing.is_some() => {
                // Applied or already applied: either way the order is durable, so the answer is "stored".
                done?;
                let (_, answered) = committing.take().expect("guarded");
                for reply in answered {
                    receiver.answer(reply);
                }
            }
            _ = sleep_until(wake) => {}
        }
        let now = Instant::now();
        receiver.handle_timeout(now);
        if committing.is_none() && !orders.is_empty() {
            let group = store.commit(std::mem::take(&mut orders));
            committing = Some((group, std::mem::take(&mut replies)));
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

/// Hand the receiver every datagram waiting, up to [`MAX_DATAGRAMS_PER_TURN`]. A read may bring a run of
/// datagrams of one size from one source that the kernel coalesced (receive offload): each is handed over alone.
fn read(socket: &UdpSocket, receiver: &mut Receiver, buf: &mut [u8]) -> io::Result<()> {
    let now = Instant::now();
    let mut datagrams = 0;
    while datagrams < MAX_DATAGRAMS_PER_TURN {
        match socket.try_io(Interest::READABLE, || net::recv_segments(socket, buf)) {
            Ok(r) if r.len == 0 => {
                receiver.handle(now, r.from, &[]);
                datagrams += 1;
            }
            Ok(r) => {
                for datagram in r.datagrams(buf) {
                    receiver.handle(now, r.from, datagram);
                    datagrams += 1;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if caused_by_a_peer(&e) => datagrams += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(())
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
