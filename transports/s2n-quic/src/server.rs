//! The server side: an s2n-quic server endpoint that stores orders and answers "stored".
//!
//! Per connection: the handshake (counted in `handshakes` when s2n-quic hands over the connection), the device's
//! identity from its verified certificate's common name (read by the event subscriber, [`crate::events`]), then
//! one loop accepting bidirectional streams. Per stream: one order frame in; the order's sender must be the
//! certificate's device (else `Refused`, counted in `refused_unknown`); the order is committed to the store; then
//! one `Stored` frame out and the stream finished. An order the store can never hold (payload over 65,535 bytes) is
//! refused (`refused_malformed`) rather than failed, so it is not sent again forever.
//!
//! s2n-quic drives all connections from one endpoint task (its own, on the runtime `serve` runs in); the stream
//! work (reading frames, waiting for the store) runs in one task per connection, so with `--server-threads N` it
//! spreads over the runtime's workers. Dropping the [`serve`] future drops the endpoint handle and aborts the
//! connection tasks.

use crate::events::{ConnState, Events, Side};
use crate::reset::{self, ResetTokens};
use crate::{start_error, tls, Provider};
use bytes::BytesMut;
use futures::stream::{FuturesUnordered, StreamExt};
use s2n_quic::stream::BidirectionalStream;
use std::sync::Arc;
use tokio::task::JoinSet;
use transport_core::framing::{self, Frame, FrameError};
use transport_core::store::{StoreError, StoreHandle};
use transport_core::{sender_id, Counters, Order, Ready, ServeConfig, TransportError};

/// Application error codes the server closes or resets with.
pub mod codes {
    /// The connection has no usable client certificate name.
    pub const NO_IDENTITY: u8 = 1;
    /// A stream did not carry one well-formed order frame.
    pub const MALFORMED: u8 = 2;
    /// The store failed; the order may be sent again.
    pub const STORE_FAILED: u8 = 3;
}

/// Start an s2n-quic server endpoint with the given TLS provider (a macro because each provider makes the builder
/// a different type).
macro_rules! start_server {
    ($tls:expr, $io:expr, $events:expr, $reset:expr) => {
        s2n_quic::Server::builder()
            .with_tls($tls)
            .map_err(|e| start_error("TLS", e))?
            .with_io($io)
            .map_err(|e| start_error("I/O", e))?
            .with_event($events)
            .map_err(|e| start_error("events", e))?
            .with_stateless_reset_token($reset)
            .map_err(|e| start_error("stateless reset", e))?
            .start()
            .map_err(|e| start_error("server", e))?
    };
}

/// Run the server with `provider`'s TLS until the future is dropped (or the endpoint stops).
pub async fn serve(provider: Provider, config: ServeConfig) -> Result<(), TransportError> {
    let ServeConfig {
        listen,
        identity,
        store,
        counters,
        ready,
        ..
    } = config;
    let reset = ResetTokens::derive(&identity)?;
    let public_key = reset::fingerprint(&identity)?;
    let anchor = if provider.derives_asym_ops() {
        Some(tls::trust_anchor(&identity)?)
    } else {
        None
    };
    let events = Events::new(Side::Server, counters.clone(), anchor);
    let socket = std::net::UdpSocket::bind(listen)?;
    transport_core::net::set_buffers(&socket, crate::SERVER_SOCKET_BUFFER)?;
    let io = s2n_quic::provider::io::tokio::Builder::default()
        .with_rx_socket(socket)
        .and_then(|b| b.build())?;
    let mut server = match provider {
        Provider::S2nTls => start_server!(tls::s2n_tls_server(&identity)?, io, events, reset),
        Provider::Rustls => start_server!(
            tls::rustls_server(&identity, counters.clone())?,
            io,
            events,
            reset
        ),
    };
    let _ = ready.send(Ready {
        addr: server.local_addr()?,
        public_key,
    });

    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            conn = server.accept() => match conn {
                Some(conn) => {
                    connections.spawn(connection(conn, store.clone(), counters.clone()));
                }
                None => break,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    Ok(())
}

async fn connection(conn: s2n_quic::Connection, store: StoreHandle, counters: Arc<Counters>) {
    Counters::inc(&counters.handshakes);
    let sender = conn
        .query_event_context(|state: &ConnState| state.device.clone())
        .ok()
        .flatten()
        .map(|name| sender_id(&name));
    let Some(sender) = sender else {
        Counters::inc(&counters.refused_unknown);
        conn.close(codes::NO_IDENTITY.into());
        return;
    };
    let (_handle, mut acceptor) = conn.split();
    let mut streams = FuturesUnordered::new();
    loop {
        tokio::select! {
            stream = acceptor.accept_bidirectional_stream() => match stream {
                Ok(Some(stream)) => streams.push(order_stream(stream, sender, &store, &counters)),
                // closed, reset or timed out: nothing more to answer on it
                Ok(None) | Err(_) => break,
            },
            Some(()) = streams.next(), if !streams.is_empty() => {}
        }
    }
}

/// One order in, one answer out.
async fn order_stream(
    stream: BidirectionalStream,
    sender: u64,
    store: &StoreHandle,
    counters: &Counters,
) {
    let (mut recv, mut send) = stream.split();
    let mut buf = BytesMut::with_capacity(256);
    let order = match framing::read_frame(&mut recv, &mut buf).await {
        Ok(Some(Frame::Order(order))) => order,
        Ok(None) | Err(FrameError::Io(_)) => return, // the stream or connection went away
        Ok(Some(_)) | Err(_) => {
            Counters::inc(&counters.refused_malformed);
            let _ = send.reset(codes::MALFORMED.into());
            let _ = recv.stop_sending(codes::MALFORMED.into());
            return;
        }
    };
    let Some(answer) = answer(order, sender, store, counters).await else {
        let _ = send.reset(codes::STORE_FAILED.into());
        return;
    };
    buf.clear();
    framing::encode(&answer, &mut buf);
    if send.send(buf.split().freeze()).await.is_ok() {
        let _ = send.finish();
    }
}

/// The answer to one order from the device `sender` (its certificate's identity), after the store's commit where
/// there is one; `None` if the store failed (the order may be sent again, so the stream is reset, not answered).
async fn answer(
    order: Order,
    sender: u64,
    store: &StoreHandle,
    counters: &Counters,
) -> Option<Frame> {
    Counters::inc(&counters.received);
    let id = order.id;
    if id.sender != sender {
        Counters::inc(&counters.refused_unknown);
        return Some(Frame::Refused(id));
    }
    match store.commit(vec![order]).await {
        // Applied now or before: either way it is stored.
        Ok(_) => Some(Frame::Stored(id)),
        // Never storable: refused rather than left to be sent again forever.
        Err(StoreError::PayloadTooLarge { .. }) => {
            Counters::inc(&counters.refused_malformed);
            Some(Frame::Refused(id))
        }
        Err(_) => None,
    }
}
