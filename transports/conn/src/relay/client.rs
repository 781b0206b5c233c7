//! The relay's device side over any connection that opens bidirectional streams: what a QUIC [`Connector`]'s
//! `subscribe`, `publish` and `deliveries` do, with the one library call (opening a stream) passed in.
//!
//! Per connection: one publish stream, opened at the first publish, with a writer task (frames of many messages
//! gathered into one write) and a reader task (the server's `Accepted` answers); one stream per subscription, with
//! a task that reads its deliveries, hands them to the fleet and acknowledges the QoS 1 ones (after handing them
//! over). Every task ends with the connection, or when the [`RelayClient`] is dropped.
//!
//! [`Connector`]: crate::fleet::Connector

use super::wire::{self, Frame};
use crate::fleet::{self, Deliveries, Delivery, SubAck};
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, OnceCell};
use tokio::task::AbortHandle;
use transport_core::{BoxFuture, Publish, QoS, TransportError};

/// The receiving half of a stream.
pub type RecvHalf = Box<dyn AsyncRead + Send + Unpin>;
/// The sending half of a stream.
pub type SendHalf = Box<dyn AsyncWrite + Send + Unpin>;
/// Opens a new bidirectional stream on the device's connection.
pub type OpenStream =
    Arc<dyn Fn() -> BoxFuture<'static, Result<(RecvHalf, SendHalf), TransportError>> + Send + Sync>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn closed() -> TransportError {
    TransportError::Protocol("relay stream closed".into())
}

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>>;

/// A frame to write, and who waits for it to be written (QoS 0).
struct Outgoing {
    frame: Bytes,
    written: Option<oneshot::Sender<()>>,
}

struct Publisher {
    out: mpsc::UnboundedSender<Outgoing>,
    /// QoS 1 messages waiting for their `Accepted`, by id.
    waiters: Waiters,
}

struct Inner {
    open: OpenStream,
    deliveries: mpsc::UnboundedSender<Delivery>,
    publisher: OnceCell<Publisher>,
    tasks: Mutex<Vec<AbortHandle>>,
    dropped: AtomicBool,
}

impl Inner {
    /// Keep `task` to abort it with the connection; at once if the connection is gone already.
    fn adopt(&self, task: AbortHandle) {
        let mut tasks = lock(&self.tasks);
        if self.dropped.load(Ordering::Relaxed) {
            task.abort();
        } else {
            tasks.push(task);
        }
    }

    async fn open_publisher(&self) -> Result<Publisher, TransportError> {
        let (recv, send) = (self.open)().await?;
        let waiters = Waiters::default();
        let (out, rx) = mpsc::unbounded_channel();
        self.adopt(tokio::spawn(write_frames(send, rx)).abort_handle());
        self.adopt(tokio::spawn(read_accepted(recv, waiters.clone())).abort_handle());
        Ok(Publisher { out, waiters })
    }
}

/// The relay on one device's connection.
pub struct RelayClient {
    inner: Arc<Inner>,
    deliveries: Option<Deliveries>,
}

impl std::fmt::Debug for RelayClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayClient").finish_non_exhaustive()
    }
}

impl Drop for RelayClient {
    fn drop(&mut self) {
        self.inner.dropped.store(true, Ordering::Relaxed);
        for task in lock(&self.inner.tasks).drain(..) {
            task.abort();
        }
    }
}

impl RelayClient {
    /// The relay on a connection whose streams `open` opens. Must be called inside a tokio runtime.
    pub fn new(open: OpenStream) -> RelayClient {
        let (tx, rx) = mpsc::unbounded_channel();
        RelayClient {
            inner: Arc::new(Inner {
                open,
                deliveries: tx,
                publisher: OnceCell::new(),
                tasks: Mutex::new(Vec::new()),
                dropped: AtomicBool::new(false),
            }),
            deliveries: Some(rx),
        }
    }

    /// What the connection's subscriptions receive (taken once).
    pub fn deliveries(&mut self) -> Option<Deliveries> {
        self.deliveries.take()
    }

    /// Publish `message` on the connection's publish stream (opened at the first publish); resolves when the
    /// server has accepted it (QoS 1) or it is written (QoS 0).
    pub fn publish(&self, message: &Publish) -> BoxFuture<'static, Result<(), TransportError>> {
        let inner = self.inner.clone();
        let m = *message;
        Box::pin(async move {
            let publisher = inner
                .publisher
                .get_or_try_init(|| inner.open_publisher())
                .await?;
            let mut payload = BytesMut::new();
            fleet::payload(&m, &mut payload);
            let mut frame = BytesMut::new();
            wire::encode_publish(m.qos, m.channel, m.id, &payload, &mut frame);
            let (tx, rx) = oneshot::channel();
            let written = match m.qos {
                QoS::AtLeastOnce => {
                    lock(&publisher.waiters).insert(m.id, tx);
                    None
                }
                QoS::AtMostOnce => Some(tx),
            };
            publisher
                .out
                .send(Outgoing {
                    frame: frame.freeze(),
                    written,
                })
                .map_err(|_| closed())?;
            rx.await.map_err(|_| closed())
        })
    }

    /// Subscribe to `channel` at `qos` on a stream of its own; resolves with the server's answer. Once granted, the
    /// stream's deliveries go to [`deliveries`](Self::deliveries) until the connection ends.
    pub fn subscribe(
        &self,
        channel: u32,
        qos: QoS,
    ) -> BoxFuture<'static, Result<SubAck, TransportError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let (mut recv, mut send) = (inner.open)().await?;
            let mut buf = BytesMut::new();
            wire::encode(&Frame::Subscribe { channel, qos }, &mut buf);
            send.write_all(&buf)
                .await
                .map_err(|e| TransportError::protocol("subscribe", e))?;
            buf.clear();
            let granted = loop {
                match wire::decode(&mut buf)? {
                    Some(Frame::Subscribed {
                        channel: c,
                        granted,
                    }) if c == channel => break granted,
                    Some(other) => {
                        return Err(TransportError::Protocol(format!(
                            "{other:?} before the answer to a subscription"
                        )))
                    }
                    None => {
                        if recv.read_buf(&mut buf).await? == 0 {
                            return Err(closed());
                        }
                    }
                }
            };
            if granted.is_none() {
                return Ok(SubAck::Refused);
            }
            let task = tokio::spawn(receive(recv, send, buf, inner.deliveries.clone()));
            inner.adopt(task.abort_handle());
            Ok(SubAck::Granted)
        })
    }
}

/// Write queued frames, all that are queued in one write; then tell the QoS 0 publishers theirs are written.
async fn write_frames(mut send: SendHalf, mut rx: mpsc::UnboundedReceiver<Outgoing>) {
    let mut buf = BytesMut::new();
    let mut written = Vec::new();
    while let Some(first) = rx.recv().await {
        buf.clear();
        let mut next = Some(first);
        while let Some(o) = next {
            buf.extend_from_slice(&o.frame);
            written.extend(o.written);
            next = rx.try_recv().ok();
        }
        if send.write_all(&buf).await.is_err() {
            return; // the waiters' senders drop with this task: their publishes fail
        }
        for w in written.drain(..) {
            let _ = w.send(());
        }
    }
}

/// Resolve each `Accepted`; at the end (the stream or connection gone) every waiting publish fails.
async fn read_accepted(mut recv: RecvHalf, waiters: Waiters) {
    let mut buf = BytesMut::new();
    'read: loop {
        loop {
            match wire::decode(&mut buf) {
                Ok(Some(Frame::Accepted { id })) => {
                    if let Some(w) = lock(&waiters).remove(&id) {
                        let _ = w.send(());
                    }
                }
                Ok(None) => break,
                Ok(Some(_)) | Err(_) => break 'read,
            }
        }
        match recv.read_buf(&mut buf).await {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
    lock(&waiters).clear();
}

/// A subscription's deliveries: each handed to the fleet as it is read, then the QoS 1 ones acknowledged, the
/// acknowledgements of one read in one write.
async fn receive(
    mut recv: RecvHalf,
    mut send: SendHalf,
    mut buf: BytesMut,
    deliveries: mpsc::UnboundedSender<Delivery>,
) {
    let mut acks = BytesMut::new();
    let mut at = std::time::Instant::now();
    loop {
        loop {
            let (qos, seq, payload) = match wire::decode(&mut buf) {
                Ok(Some(Frame::Deliver0 { payload })) => (QoS::AtMostOnce, None, payload),
                Ok(Some(Frame::Deliver1 { seq, payload })) => {
                    (QoS::AtLeastOnce, Some(seq), payload)
                }
                Ok(None) => break,
                Ok(Some(_)) | Err(_) => return,
            };
            let Some(id) = fleet::message_id(&payload) else {
                return;
            };
            if deliveries.send(Delivery { id, qos, at }).is_err() {
                return;
            }
            if let Some(seq) = seq {
                wire::encode_ack(seq, &mut acks);
            }
        }
        if !acks.is_empty() {
            if send.write_all(&acks).await.is_err() {
                return;
            }
            acks.clear();
        }
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(16 * 1024);
        }
        match recv.read_buf(&mut buf).await {
            Ok(n) if n > 0 => at = std::time::Instant::now(),
            _ => return,
        }
    }
}
