//! What the QUIC transports (quinn, s2n-quic) share: one protocol on the wire, its settings, and the server's loops.
//!
//! The protocol ([`ALPN`] `lb-orders`): a device opens one bidirectional stream per order, writes the order frame
//! ([`transport_core::framing`]) and finishes its side; the server answers on the same stream with one `Stored` or `Refused`
//! frame and finishes ([`serve_stream`]), or resets the stream with one of the [`codes`]; the device reads the answer
//! with [`read_answer`]. The device's identity is its certificate's common name, and each order's sender must be it.
//!
//! The server answers as soon as the order frame is whole; it does not wait for the end of the device's side. A
//! stream whose end has not arrived when the server lets go of it has its receiving side stopped by the library
//! (STOP_SENDING with code 0, in quinn and in s2n-quic): the order is stored and answered all the same, but a device
//! that waits for its own side's end to be acknowledged (s2n-quic's `close`) may be told the stream was stopped.
//! The suite's devices send the frame and its end together, so they never see it.
//!
//! The same connections carry publish/subscribe ([`crate::relay`]): a stream whose first frame is a relay frame is
//! a subscription or the device's publish stream. [`serve_stream`] reads a stream's first frame and serves it as
//! what it is.
//!
//! A server ([`serve`]) serves every connection in a task of its own ([`spawn_each`]) and every stream of a
//! connection in that connection's task ([`serve_each`]). What stays in each transport is its library's API:
//! endpoints, handshakes, how a stream is opened, finished or reset.

use crate::fleet::Answer;
use crate::relay::wire::{self, First};
use crate::relay::{RelayLimits, RelayServer};
use bytes::{Bytes, BytesMut};
use futures::stream::{FuturesUnordered, Stream, StreamExt};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use transport_core::commit::{CommitError, OrderStore, SharedStore};
use transport_core::framing::{self, Frame, FrameError};
use transport_core::{
    Capabilities, Counters, MemorySource, Order, Ready, ServeConfig, Support, TransportError,
};
use transport_tls as tls;

/// The ALPN protocol of orders over QUIC streams.
pub const ALPN: &[u8] = b"lb-orders";

/// The receive and send buffer asked for a server's UDP socket, as the other UDP servers do.
pub const SERVER_SOCKET_BUFFER: usize = 16 << 20;

/// The buffer of a fleet's one client socket. It stands in for the buffers of every device's own socket on real
/// devices, so it is larger: after a restart the server's handshake flights to 10,000 devices arrive at once.
pub const CLIENT_SOCKET_BUFFER: usize = 64 << 20;

/// The client's keep-alive period: longer than the restart workload's order period (5 s), so devices that send
/// regularly never send a PING, and well under the 30 s idle timeout so idle links stay open.
pub const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// The longest a server lets a handshake take before it gives up on the peer (a QUIC Initial and then silence):
/// s2n-quic's own default, and what the quinn server applies itself (quinn would otherwise wait for its 30 s idle
/// timeout). A handshake given up is counted in `timed_out`.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How many orders a device has in flight on one QUIC connection at most, one stream each (the connection fleet's
/// window, [`crate::fleet::Connector::window`]): quinn's and s2n-quic's default stream limit, and the same window as
/// MQTT's.
pub const STREAMS_PER_CONNECTION: usize = 100;

/// How many bidirectional streams a QUIC server lets a device have open at once: twice the device's window. A
/// stream's credit comes back to the device only once the server has closed the stream, and a server closes it when
/// the device has acknowledged its answer, which the device may delay by up to its ACK delay (25 ms). With the limit
/// equal to the window, a device that had every answer of its window in hand could open no new stream until that
/// acknowledgement went out and the server's next MAX_STREAMS came back: one s2n-quic connection ran 3,700 orders/s
/// instead of about 150,000 (docs/performance.md, "Stream credit"). The second window is room for streams answered
/// and not yet closed; a device still sends no more than [`STREAMS_PER_CONNECTION`] orders at once.
pub const SERVER_STREAMS: u32 = 2 * STREAMS_PER_CONNECTION as u32;

/// What both QUIC transports can do.
pub fn capabilities() -> Capabilities {
    Capabilities {
        stored_answers: Support::Yes,
        handshakes: Support::Yes,
        disconnect: Support::Yes,
        pubsub: Support::Yes,
        memory: MemorySource::Rss,
    }
}

/// Application error codes a server closes a connection or resets a stream with.
pub mod codes {
    /// The connection has no usable client certificate name.
    pub const NO_IDENTITY: u32 = 1;
    /// A stream did not carry one well-formed order frame.
    pub const MALFORMED: u32 = 2;
    /// The store failed; the order may be sent again.
    pub const STORE_FAILED: u32 = 3;
}

/// How [`serve_stream`] left a stream, and what the transport does with it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// The answer is written: finish the sending side.
    Answered,
    /// The stream or its connection went away (before the order, or while answering): nothing more to do.
    Gone,
    /// The stream did not carry one well-formed order frame: reset the sending side and stop the receiving side,
    /// both with [`codes::MALFORMED`].
    Malformed,
    /// The store failed, so the order is not answered (it may be sent again): reset the sending side with
    /// [`codes::STORE_FAILED`].
    StoreFailed,
}

/// One order of the device `sender` (its certificate's identity, as [`transport_core::sender_id`]) answered on
/// `send`: [`answer_frame`]'s answer, written.
async fn answer_and_write<W: AsyncWrite + Unpin>(
    order: Order,
    send: &mut W,
    sender: u64,
    store: &dyn OrderStore,
    counters: &Counters,
    buf: BytesMut,
) -> Served {
    let answer = match answer_frame(order, sender, store, counters, buf).await {
        Ok(answer) => answer,
        Err(served) => return served,
    };
    match send.write_all(&answer).await {
        Ok(()) => Served::Answered,
        Err(_) => Served::Gone,
    }
}

/// The answer frame to one order of the device `sender` (its certificate's identity, as
/// [`transport_core::sender_id`]), encoded into `buf` (cleared first): refused if its sender is not `sender`
/// (`refused_unknown`); else committed to `store`, then `Stored`. An order the store can never hold (its payload too
/// large for a record) is refused (`refused_malformed`) rather than failed, so it is not sent again forever. `Err`
/// ([`Served::StoreFailed`]) if the store failed: the order is not answered. For a transport that hands its library
/// the frame as it is (s2n-quic's `send(Bytes)`); [`serve_stream`] writes it through `AsyncWrite`.
pub async fn answer_frame(
    order: Order,
    sender: u64,
    store: &dyn OrderStore,
    counters: &Counters,
    mut buf: BytesMut,
) -> Result<BytesMut, Served> {
    let Some(answer) = answer(order, sender, store, counters).await else {
        return Err(Served::StoreFailed);
    };
    buf.clear();
    framing::encode(&answer, &mut buf);
    Ok(buf)
}

/// What the streams of a QUIC server's connections share: the store, the counters, the relay.
pub struct Serving {
    /// Where orders are committed.
    pub store: SharedStore,
    /// Where the server counts.
    pub counters: Arc<Counters>,
    /// The publish/subscribe relay.
    pub relay: RelayServer,
}

impl Serving {
    /// What a server with `store` and `counters` shares, with the relay's default bounds.
    pub fn new(store: SharedStore, counters: Arc<Counters>) -> Serving {
        Serving {
            store,
            relay: RelayServer::new(RelayLimits::default(), counters.clone()),
            counters,
        }
    }
}

/// Serve one stream the device `sender` opened, as its first frame says ([`read_first`], then [`serve_first`]).
/// Returns how to leave the stream.
pub async fn serve_stream<R, W>(
    recv: &mut R,
    send: &mut W,
    sender: u64,
    serving: &Serving,
) -> Served
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(256);
    match read_first(recv, &mut buf, &serving.counters).await {
        Ok(first) => serve_first(first, recv, send, sender, serving, buf).await,
        Err(served) => served,
    }
}

/// The first frame of a stream a device opened, read from `recv` into `buf` (what follows it stays in `buf`).
/// `Err` with how to leave the stream if there is none: [`Served::Gone`] if the stream or its connection ended
/// before any byte or failed, [`Served::Malformed`] if its first bytes are no frame or it was finished inside one
/// (`refused_malformed`), or a length prefix announced more than the maximum (`refused_oversized`, the body unread).
pub async fn read_first<R: AsyncRead + Unpin>(
    recv: &mut R,
    buf: &mut BytesMut,
    counters: &Counters,
) -> Result<First, Served> {
    loop {
        match wire::decode_first(buf) {
            Ok(Some(first)) => return Ok(first),
            Ok(None) => {}
            // Refused from its length prefix, before any of its body is read.
            Err(FrameError::Oversized { .. }) => {
                Counters::inc(&counters.refused_oversized);
                return Err(Served::Malformed);
            }
            Err(_) => {
                Counters::inc(&counters.refused_malformed);
                return Err(Served::Malformed);
            }
        }
        framing::make_room(buf);
        match recv.read_buf(buf).await {
            // Finished inside a frame.
            Ok(0) if !buf.is_empty() => {
                Counters::inc(&counters.refused_malformed);
                return Err(Served::Malformed);
            }
            Ok(0) | Err(_) => return Err(Served::Gone),
            Ok(_) => {}
        }
    }
}

/// Serve a stream of the device `sender` whose first frame was `first` ([`read_first`], with what followed it in
/// `buf`): an order stream (the order answered, [`answer_frame`], and the answer written), a subscription or the
/// device's publish stream ([`crate::relay`]). Returns how to leave the stream.
pub async fn serve_first<R, W>(
    first: First,
    recv: &mut R,
    send: &mut W,
    sender: u64,
    serving: &Serving,
    buf: BytesMut,
) -> Served
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let counters = &*serving.counters;
    match first {
        First::Order(order) => {
            answer_and_write(order, send, sender, serving.store.as_ref(), counters, buf).await
        }
        First::Relay(wire::Frame::Subscribe { channel, qos }) => {
            crate::relay::server::subscription(
                recv,
                send,
                sender,
                channel,
                qos,
                buf,
                &serving.relay,
            )
            .await
        }
        First::Relay(publish @ wire::Frame::Publish { .. }) => {
            crate::relay::server::publishing(recv, send, publish, buf, &serving.relay).await
        }
        First::Relay(_) => {
            Counters::inc(&counters.refused_malformed);
            Served::Malformed
        }
    }
}

/// The answer to one order from the device `sender`, after the store's commit where there is one; `None` if the
/// store failed.
async fn answer(
    order: Order,
    sender: u64,
    store: &dyn OrderStore,
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
        Err(CommitError::PayloadTooLarge { .. }) => {
            Counters::inc(&counters.refused_malformed);
            Some(Frame::Refused(id))
        }
        Err(_) => None,
    }
}

/// The largest buffer a device's order frames are cut from ([`OrderFrames`]), and the first one.
const FRAMES_CHUNK: usize = 64 << 10;
const FRAMES_FIRST_CHUNK: usize = 1 << 10;

/// A device's order frames, cut one after another from one buffer. A frame is handed to the library as `Bytes` and
/// held there until the server acknowledges it; frames cut from one buffer share its allocation, which is freed when
/// the last of them is. When a buffer is used up the next is allocated twice as large, from 1 KiB (a device that
/// sends one order holds no more) up to 64 KiB (a device in a drain allocates once per about 700 orders). A buffer of
/// its own per frame was an allocation and a free per order, and a second allocation (the shared header) when the
/// library first cloned the frame.
#[derive(Debug, Default)]
pub struct OrderFrames {
    buf: std::cell::RefCell<BytesMut>,
    /// The size of the last buffer allocated.
    chunk: std::cell::Cell<usize>,
}

impl OrderFrames {
    /// `order`'s frame (as [`framing::encode_order`] writes it).
    pub fn frame(&self, order: &Order) -> Bytes {
        let mut buf = self.buf.borrow_mut();
        let len = framing::LEN_PREFIX + 1 + framing::order_body_len(order);
        if buf.capacity() < len {
            // Used up (or an order larger than what is left): a new buffer, never a copy of the old one's frames.
            let chunk = (self.chunk.get() * 2).clamp(FRAMES_FIRST_CHUNK, FRAMES_CHUNK);
            self.chunk.set(chunk);
            *buf = BytesMut::with_capacity(chunk.max(len));
        }
        framing::encode_order(order, &mut buf);
        buf.split().freeze()
    }
}

/// The longest answer frame: an order's id with the length prefix and the type byte.
const ANSWER_FRAME: usize = framing::LEN_PREFIX + 1 + framing::ID_LEN;

/// The buffer [`read_answer`] reads into, on its stack (a device's answer costs no allocation): longer than any
/// answer, so the read that takes the answer also has room to find the stream's end behind it. A library may need
/// that: a quinn receiving stream dropped before its end was read sends the server a STOP_SENDING frame.
const ANSWER_BUFFER: usize = 64;

/// The device's side: the server's answer to the order written on a stream, read from the stream's receiving side
/// (one `Stored` or `Refused` frame; what follows it is not read). An error if the stream ends before a whole frame,
/// or its first frame is malformed or not an answer.
pub async fn read_answer<R: AsyncRead + Unpin>(recv: &mut R) -> Result<Answer, TransportError> {
    let mut buf = [0u8; ANSWER_BUFFER];
    let mut filled = 0;
    let len = loop {
        if let Some(len) = framing::check(&buf[..filled])? {
            break len;
        }
        // A frame longer than any answer: an order, or not this protocol.
        if let Some(announced) = framing::announced_len(&buf[..filled]) {
            if announced > ANSWER_FRAME {
                return Err(TransportError::Protocol(format!(
                    "a frame of {announced} bytes from the server where an answer ({ANSWER_FRAME}) was expected"
                )));
            }
        }
        let read = recv.read(&mut buf[filled..]).await?;
        if read == 0 {
            return Err(TransportError::Protocol(if filled == 0 {
                "stream ended without an answer".into()
            } else {
                format!("stream ended inside an answer, after {filled} bytes")
            }));
        }
        filled += read;
    };
    match framing::parse_body(&buf[framing::LEN_PREFIX..len])? {
        Frame::Stored(id) => Ok(Answer::Stored(id)),
        Frame::Refused(id) => Ok(Answer::Refused(id)),
        Frame::Order(_) => Err(TransportError::Protocol(
            "an order frame from the server".into(),
        )),
    }
}

/// A QUIC server's run: `start` binds the endpoint (on `config.listen`) and returns its address and the connections
/// it accepts; the server is reported ready with that address and its certificate's fingerprint; then every
/// connection is served by `connection` (with what the streams share: store, counters, relay) in a task of its own
/// ([`spawn_each`]) until the endpoint stops accepting.
pub async fn serve<T, S, F>(
    config: ServeConfig,
    start: impl FnOnce(&ServeConfig) -> Result<(SocketAddr, S), TransportError>,
    connection: impl Fn(T, Arc<Serving>) -> F,
) -> Result<(), TransportError>
where
    S: Stream<Item = T>,
    F: Future<Output = ()> + Send + 'static,
{
    let public_key = tls::server_fingerprint(&config.identity)?;
    let (addr, incoming) = start(&config)?;
    let serving = Arc::new(Serving::new(config.store.clone(), config.counters.clone()));
    let _ = config.ready.send(Ready::new(addr, public_key));
    spawn_each(incoming, |conn| connection(conn, serving.clone())).await;
    Ok(())
}

/// Serve everything `incoming` yields (a stream's or a connection's work) concurrently, in the calling task, until
/// `incoming` ends. What is still being served then is dropped with this future.
pub async fn serve_each<T, F>(incoming: impl Stream<Item = T>, mut serve: impl FnMut(T) -> F)
where
    F: Future<Output = ()>,
{
    let mut incoming = pin!(incoming);
    let mut serving = FuturesUnordered::new();
    loop {
        tokio::select! {
            item = incoming.next() => match item {
                Some(item) => serving.push(serve(item)),
                None => return,
            },
            Some(()) = serving.next(), if !serving.is_empty() => {}
        }
    }
}

/// [`serve_each`] with every item served in a task of its own (a connection, so that the runtime's workers share
/// them); the tasks still running when `incoming` ends, or when this future is dropped, are aborted.
pub async fn spawn_each<T, F>(incoming: impl Stream<Item = T>, mut serve: impl FnMut(T) -> F)
where
    F: Future<Output = ()> + Send + 'static,
{
    serve_each(incoming, |item| Task(tokio::spawn(serve(item)))).await;
}

/// A spawned task, aborted when dropped.
struct Task(tokio::task::JoinHandle<()>);

impl Future for Task {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // A task that panicked is over as well; its connection is gone with it.
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::order;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use transport_core::QoS;
    use transport_store::{Store, StoreHandle, SyncPolicy};

    /// One stream's exchange over an in-memory pipe: the server's step ([`serve_stream`]) on one end, the device's
    /// bytes on the other.
    async fn exchange(
        device: &[u8],
        sender: u64,
        serving: &Serving,
    ) -> (Served, Result<Answer, TransportError>) {
        let (mut server, mut client) = tokio::io::duplex(1 << 20);
        client.write_all(device).await.unwrap();
        client.shutdown().await.unwrap();
        let (mut recv, mut send) = tokio::io::split(&mut server);
        let served = serve_stream(&mut recv, &mut send, sender, serving).await;
        drop((recv, send));
        drop(server);
        (served, read_answer(&mut client).await)
    }

    fn frame(order: &Order) -> Vec<u8> {
        let mut buf = BytesMut::new();
        framing::encode_order(order, &mut buf);
        buf.to_vec()
    }

    #[test]
    fn a_device_that_sends_one_order_holds_a_small_buffer() {
        let frames = OrderFrames::default();
        let _ = frames.frame(&order(7, 0));
        assert_eq!(
            frames.buf.borrow().capacity() + frame(&order(7, 0)).len(),
            FRAMES_FIRST_CHUNK
        );
    }

    #[test]
    fn order_frames_cut_from_one_buffer_each_stay_whole() {
        let frames = OrderFrames::default();
        let mut made = Vec::new();
        // Enough frames to use up several buffers, with an order larger than a whole buffer among them.
        for seq in 0..3_000u64 {
            let mut o = order(7, seq);
            if seq == 1_500 {
                o.payload = vec![0xab; 2 * FRAMES_CHUNK];
            }
            made.push((frames.frame(&o), o));
        }
        for (bytes, o) in &made {
            assert_eq!(&bytes[..], &frame(o)[..], "order {}", o.id.seq);
        }
        // Consecutive frames share a buffer; buffers grow to the largest size and no further.
        let (a, b) = (&made[0].0, &made[1].0);
        assert_eq!(a.as_ptr().wrapping_add(a.len()), b.as_ptr());
        assert_eq!(frames.chunk.get(), FRAMES_CHUNK);
        drop(made);
        let o = order(7, 3_000);
        assert_eq!(&frames.frame(&o)[..], &frame(&o)[..]);
    }

    #[tokio::test]
    async fn a_device_reads_one_answer_however_it_arrives_and_nothing_else() {
        let id = order(7, 3).id;
        let mut stored = BytesMut::new();
        framing::encode_stored(&id, &mut stored);
        let mut refused = BytesMut::new();
        framing::encode(&Frame::Refused(id), &mut refused);
        let read = |bytes: Vec<u8>, step| async move {
            read_answer(&mut framing::Pieces::new(&bytes, step)).await
        };
        for step in [1, 5, 64] {
            assert_eq!(
                read(stored.to_vec(), step).await.unwrap(),
                Answer::Stored(id)
            );
            assert_eq!(
                read(refused.to_vec(), step).await.unwrap(),
                Answer::Refused(id)
            );
            // What follows the answer is not read.
            let mut more = stored.to_vec();
            more.extend_from_slice(&refused);
            assert_eq!(read(more, step).await.unwrap(), Answer::Stored(id));
            // Not an answer: an order, a frame too long, a frame of an unknown type, a length over the maximum.
            let err = read(frame(&order(7, 4)), step)
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains("where an answer"), "{err}");
            let mut unknown = stored.to_vec();
            unknown[framing::LEN_PREFIX] = 0xee;
            assert!(read(unknown, step).await.is_err());
            assert!(read(u32::MAX.to_be_bytes().to_vec(), step).await.is_err());
            // Ended before an answer, or inside one.
            let err = read(vec![], step).await.unwrap_err().to_string();
            assert!(err.contains("without an answer"), "{err}");
            let cut = stored[..stored.len() - 1].to_vec();
            let err = read(cut, step).await.unwrap_err().to_string();
            assert!(err.contains("inside an answer"), "{err}");
        }
    }

    #[tokio::test]
    async fn orders_are_stored_or_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path(), SyncPolicy::None).unwrap();
        let store = Arc::new(StoreHandle::spawn(store));
        let counters = Arc::new(Counters::default());
        let serving = Serving::new(store.clone(), counters.clone());

        let fine = order(7, 0);
        let (served, answer) = exchange(&frame(&fine), 7, &serving).await;
        assert_eq!(
            (served, answer.unwrap()),
            (Served::Answered, Answer::Stored(fine.id))
        );
        // Sent again (its answer was lost): stored already, answered again.
        let (_, answer) = exchange(&frame(&fine), 7, &serving).await;
        assert_eq!(answer.unwrap(), Answer::Stored(fine.id));
        // In another device's name.
        let spoofed = order(8, 0);
        let (_, answer) = exchange(&frame(&spoofed), 7, &serving).await;
        assert_eq!(answer.unwrap(), Answer::Refused(spoofed.id));
        // Too large for a record.
        let mut huge = order(7, 1);
        huge.payload = vec![0; transport_core::MAX_PAYLOAD + 1];
        let (_, answer) = exchange(&frame(&huge), 7, &serving).await;
        assert_eq!(answer.unwrap(), Answer::Refused(huge.id));
        // No whole frame, then not an order.
        let (served, answer) = exchange(&[0, 0], 7, &serving).await;
        assert_eq!(served, Served::Malformed);
        assert!(answer.is_err());
        let mut stored = BytesMut::new();
        framing::encode_stored(&fine.id, &mut stored);
        let (served, _) = exchange(&stored, 7, &serving).await;
        assert_eq!(served, Served::Malformed);
        // A length prefix over the maximum: refused unread, as oversized.
        let (served, _) = exchange(&u32::MAX.to_be_bytes(), 7, &serving).await;
        assert_eq!(served, Served::Malformed);
        // Nothing at all: the device went away.
        let (served, _) = exchange(&[], 7, &serving).await;
        assert_eq!(served, Served::Gone);

        let c = counters.snapshot();
        assert_eq!(
            (
                c.received,
                c.refused_unknown,
                c.refused_malformed,
                c.refused_oversized
            ),
            (4, 1, 3, 1)
        );
        store.close().await;
    }

    #[tokio::test]
    async fn each_item_is_served_and_spawned_tasks_end_with_the_loop() {
        // The items end once the last of them is served.
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for n in 0..5 {
            tx.send(n).unwrap();
        }
        let tx = std::sync::Mutex::new(Some(tx));
        let served = AtomicUsize::new(0);
        let incoming = futures::stream::unfold(rx, |mut rx| async move {
            let item = rx.recv().await?;
            Some((item, rx))
        });
        serve_each(incoming, |_| async {
            if served.fetch_add(1, Ordering::Relaxed) == 4 {
                tx.lock().unwrap().take();
            }
        })
        .await;
        assert_eq!(served.load(Ordering::Relaxed), 5);

        // A task that would run forever is aborted when the items end: its state is dropped.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        spawn_each(futures::stream::iter([tx]), |tx| async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        })
        .await;
        assert!(rx.await.is_err());
    }

    #[tokio::test]
    async fn streams_are_served_as_their_first_frame_says() {
        use crate::relay::wire::{self, Frame};
        use tokio::io::AsyncReadExt;
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path(), SyncPolicy::None).unwrap();
        let counters = Arc::new(Counters::default());
        let serving = Arc::new(Serving::new(
            Arc::new(StoreHandle::spawn(store)),
            counters.clone(),
        ));
        let serve = |device: u64| {
            let (server, client) = tokio::io::duplex(1 << 16);
            let serving = serving.clone();
            let task = tokio::spawn(async move {
                let (mut recv, mut send) = tokio::io::split(server);
                serve_stream(&mut recv, &mut send, device, &serving).await
            });
            (client, task)
        };
        let frame = |f: Frame| {
            let mut b = BytesMut::new();
            wire::encode(&f, &mut b);
            b
        };
        async fn next(io: &mut tokio::io::DuplexStream, buf: &mut BytesMut) -> Frame {
            loop {
                if let Some(f) = wire::decode(buf).unwrap() {
                    return f;
                }
                assert!(io.read_buf(buf).await.unwrap() > 0);
            }
        }
        // A subscription of device 2 at QoS 1.
        let (mut sub, sub_task) = serve(2);
        sub.write_all(&frame(Frame::Subscribe {
            channel: 5,
            qos: QoS::AtLeastOnce,
        }))
        .await
        .unwrap();
        let mut sub_buf = BytesMut::new();
        assert_eq!(
            next(&mut sub, &mut sub_buf).await,
            Frame::Subscribed {
                channel: 5,
                granted: Some(QoS::AtLeastOnce)
            }
        );
        // Device 1's publish stream: a QoS 1 message is answered, a QoS 0 one not.
        let (mut publ, pub_task) = serve(1);
        let payload = |id: u64| bytes::Bytes::copy_from_slice(&id.to_be_bytes());
        let mut two = frame(Frame::Publish {
            qos: QoS::AtLeastOnce,
            channel: 5,
            id: 9,
            payload: payload(9),
        });
        two.extend_from_slice(&frame(Frame::Publish {
            qos: QoS::AtMostOnce,
            channel: 5,
            id: 10,
            payload: payload(10),
        }));
        publ.write_all(&two).await.unwrap();
        let mut pub_buf = BytesMut::new();
        assert_eq!(
            next(&mut publ, &mut pub_buf).await,
            Frame::Accepted { id: 9 }
        );
        assert_eq!(
            next(&mut sub, &mut sub_buf).await,
            Frame::Deliver1 {
                seq: 1,
                payload: payload(9)
            }
        );
        assert_eq!(
            next(&mut sub, &mut sub_buf).await,
            Frame::Deliver0 {
                payload: payload(10)
            }
        );
        // The subscriber acknowledges and leaves; the publisher sends a frame a publish stream may not carry.
        sub.write_all(&frame(Frame::Ack { seq: 1 })).await.unwrap();
        sub.shutdown().await.unwrap();
        assert_eq!(sub_task.await.unwrap(), Served::Answered);
        publ.write_all(&frame(Frame::Ack { seq: 1 })).await.unwrap();
        assert_eq!(pub_task.await.unwrap(), Served::Malformed);
        // A stream that opens with a delivery, or with garbage, is malformed; one that ends at once is gone.
        for bytes in [
            frame(Frame::Deliver0 {
                payload: payload(1),
            }),
            BytesMut::from(&[0, 0, 0, 1, 0x7f][..]),
        ] {
            let (mut io, task) = serve(1);
            io.write_all(&bytes).await.unwrap();
            assert_eq!(task.await.unwrap(), Served::Malformed);
        }
        let (io, task) = serve(1);
        drop(io);
        assert_eq!(task.await.unwrap(), Served::Gone);
        let c = counters.snapshot();
        assert_eq!(
            (c.received, c.refused_malformed, c.dropped),
            (2, 3, 0),
            "{c:?}"
        );
    }
}
