//! The server side: an s2n-quic server endpoint that stores orders and answers "stored".
//!
//! Per connection: the handshake (counted in `handshakes` when s2n-quic hands over the connection), the device's
//! identity from its verified certificate's common name (read by the event subscriber, [`crate::events`]), then
//! one loop accepting bidirectional streams, each served as its first frame says (read by the step both QUIC servers
//! share, [`quic::read_first`]). An order stream: one order frame in; the order's sender must be the certificate's device (else
//! `Refused`, counted in `refused_unknown`); the order is committed to the store; then one `Stored` frame out and the
//! stream finished. An order the store can never hold (payload over 65,535 bytes) is refused (`refused_malformed`)
//! rather than failed, so it is not sent again forever. A subscription or publish stream: the relay
//! ([`transport_conn::relay`]) until it ends.
//!
//! s2n-quic drives all connections from one endpoint task (its own, on the runtime `serve` runs in); the stream
//! work (reading frames, waiting for the store) runs in one task per connection, so with `--server-threads N` it
//! spreads over the runtime's workers. Dropping the [`serve`] future drops the endpoint handle and aborts the
//! connection tasks.

use crate::events::{ConnState, Events, Side};
use crate::reset::ResetTokens;
use crate::{start_error, tls, Provider};
use bytes::BytesMut;
use futures::stream;
use s2n_quic::stream::BidirectionalStream;
use std::net::SocketAddr;
use std::sync::Arc;
use transport_conn::quic::{self, codes, Served, Serving};
use transport_conn::relay::wire::First;
use transport_core::{net, sender_id, Counters, ServeConfig, TransportError};

/// Start an s2n-quic server endpoint with the given TLS provider (a macro because each provider makes the builder
/// a different type).
macro_rules! start_server {
    ($tls:expr, $io:expr, $events:expr, $reset:expr) => {
        s2n_quic::Server::builder()
            .with_tls($tls)
            .map_err(|e| start_error("TLS", e))?
            .with_io($io)
            .map_err(|e| start_error("I/O", e))?
            .with_limits(server_limits()?)
            .map_err(|e| start_error("limits", e))?
            .with_event($events)
            .map_err(|e| start_error("events", e))?
            .with_stateless_reset_token($reset)
            .map_err(|e| start_error("stateless reset", e))?
            .start()
            .map_err(|e| start_error("server", e))?
    };
}

/// s2n-quic's defaults but for the streams a device may have open at once ([`quic::SERVER_STREAMS`], as the quinn
/// server).
fn server_limits() -> Result<s2n_quic::provider::limits::Limits, TransportError> {
    s2n_quic::provider::limits::Limits::new()
        .with_max_open_remote_bidirectional_streams(u64::from(quic::SERVER_STREAMS))
        .map_err(|e| start_error("limits", e))
}

/// Run the server with `provider`'s TLS until the future is dropped (or the endpoint stops).
pub async fn serve(provider: Provider, config: ServeConfig) -> Result<(), TransportError> {
    quic::serve(config, |config| start(provider, config), connection).await
}

/// The endpoint on `config.listen` (s2n-quic's [`s2n_quic::Server`] is the stream of the connections it accepts).
fn start(
    provider: Provider,
    config: &ServeConfig,
) -> Result<(SocketAddr, s2n_quic::Server), TransportError> {
    let identity = &config.identity;
    let reset = ResetTokens::derive(identity)?;
    let anchor = if provider.derives_asym_ops() {
        Some(tls::trust_anchor(identity)?)
    } else {
        None
    };
    let events = Events::new(Side::Server, config.counters.clone(), anchor);
    let socket = net::bind_udp(config.listen, quic::SERVER_SOCKET_BUFFER)?;
    let io = s2n_quic::provider::io::tokio::Builder::default()
        .with_rx_socket(socket)
        .and_then(|b| b.build())?;
    let server = match provider {
        Provider::S2nTls => start_server!(tls::s2n_tls_server(identity)?, io, events, reset),
        Provider::Rustls => start_server!(
            tls::rustls_server(identity, config.counters.clone())?,
            io,
            events,
            reset
        ),
    };
    Ok((server.local_addr()?, server))
}

async fn connection(conn: s2n_quic::Connection, serving: Arc<Serving>) {
    let counters = &serving.counters;
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
    let (_handle, acceptor) = conn.split();
    // Until the connection is closed, reset or timed out: nothing more to answer on it then.
    let streams = stream::unfold(acceptor, |mut acceptor| async move {
        let stream = acceptor
            .accept_bidirectional_stream()
            .await
            .ok()
            .flatten()?;
        Some((stream, acceptor))
    });
    quic::serve_each(streams, |stream| serve_stream(stream, sender, &serving)).await;
}

/// Leave a stream as `served` says, `$send` its sending side and `$recv` its receiving side (halves, or both the
/// whole stream). An answered stream is finished by the drop of its sending side (s2n-quic finishes a send stream
/// dropped open, in the same request that releases it).
macro_rules! leave {
    ($served:expr, $send:expr, $recv:expr) => {
        match $served {
            Served::Answered | Served::Gone => {}
            Served::Malformed => {
                let _ = $send.reset(codes::MALFORMED.into());
                let _ = $recv.stop_sending(codes::MALFORMED.into());
            }
            Served::StoreFailed => {
                let _ = $send.reset(codes::STORE_FAILED.into());
            }
        }
    };
}

/// One stream served as its first frame says ([`quic::read_first`]); then finished or reset as that says.
///
/// An order stream stays whole and its answer goes to s2n-quic as the frame it is (`send(Bytes)`); the stream is
/// finished by being dropped. Every call on an s2n-quic stream is a request to its connection (the connection's
/// lock, the stream looked up, its interests updated): this way an order costs three besides the accept (the read,
/// the send, and the drop, which finishes the sending side and releases the stream in one request). Split into
/// halves, written through `AsyncWrite` (which asks for room, then copies the bytes into a new buffer) and finished
/// before the sending half's drop, it cost five. A subscription or publish stream is split and served
/// by the relay ([`quic::serve_first`]).
async fn serve_stream(mut stream: BidirectionalStream, sender: u64, serving: &Serving) {
    let counters = &serving.counters;
    let mut buf = BytesMut::with_capacity(256);
    let served = match quic::read_first(&mut stream, &mut buf, counters).await {
        Ok(First::Order(order)) => {
            match quic::answer_frame(order, sender, serving.store.as_ref(), counters, buf).await {
                Ok(answer) => match stream.send(answer.freeze()).await {
                    Ok(()) => Served::Answered,
                    Err(_) => Served::Gone,
                },
                Err(served) => served,
            }
        }
        Ok(first) => {
            let (mut recv, mut send) = stream.split();
            let served = quic::serve_first(first, &mut recv, &mut send, sender, serving, buf).await;
            leave!(served, send, recv);
            return;
        }
        Err(served) => served,
    };
    leave!(served, stream, stream);
}
