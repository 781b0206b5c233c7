//! The receiver's UDP driver: one socket, the sans-IO [`Receiver`], and the store.
//!
//! Each turn reads every datagram that is waiting (up to a bound), commits all the orders they carried as one
//! group, then sends the answers. While a group commits, new datagrams wait in the socket's buffer and form the
//! next group: group commit falls out of the loop without a timer.

use crate::receiver::Receiver;
use std::io;
use tokio::net::UdpSocket;
use transport_core::commit::SharedStore;
use transport_core::TransportError;

/// Datagrams read per turn at most, so answers keep flowing under a flood.
const MAX_DATAGRAMS_PER_TURN: usize = 256;

/// Run the receiver until an I/O or store error.
pub async fn run(
    socket: UdpSocket,
    mut receiver: Receiver,
    store: SharedStore,
) -> Result<(), TransportError> {
    let mut buf = vec![0u8; 65_536];
    let mut out = Vec::with_capacity(crate::wire::MAX_DATAGRAM);
    loop {
        socket.readable().await?;
        for _ in 0..MAX_DATAGRAMS_PER_TURN {
            match socket.try_recv_from(&mut buf) {
                Ok((n, from)) => receiver.handle(from, &buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // ICMP errors from a sender that went away surface as ECONNREFUSED on some kernels: not ours.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
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
        while let Some(to) = receiver.poll_transmit(&mut out) {
            send(&socket, &out, to).await?;
        }
    }
}

/// Send one datagram, waiting for buffer space if the socket is full. A peer that is gone is not an error.
pub(crate) async fn send(
    socket: &UdpSocket,
    data: &[u8],
    to: std::net::SocketAddr,
) -> io::Result<()> {
    match socket.send_to(data, to).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(()),
        Err(e) => Err(e),
    }
}
