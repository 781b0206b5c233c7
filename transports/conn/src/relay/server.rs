//! The relay's server side over any pair of byte streams (a QUIC stream's two halves): a publish stream and a
//! subscription stream, each served until it ends. What each returns is how the transport leaves the stream
//! ([`Served`]).

use super::state::{Attached, Relay, RelayLimits};
use super::wire::{self, Frame};
use crate::quic::Served;
use bytes::BytesMut;
use futures::future::{select, Either};
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use transport_core::{Counters, QoS};

/// Bytes of deliveries a subscription's stream gathers into one write.
const WRITE_BATCH: usize = 64 * 1024;

/// The relay of one server, shared by every connection's streams.
#[derive(Debug)]
pub struct RelayServer {
    state: Mutex<Relay>,
    counters: Arc<Counters>,
}

impl RelayServer {
    /// A relay with `limits`, counting into `counters` (`received` per message, `dropped` per drop).
    pub fn new(limits: RelayLimits, counters: Arc<Counters>) -> RelayServer {
        RelayServer {
            state: Mutex::new(Relay::new(limits, counters.clone())),
            counters,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Relay> {
        // Nothing panics under the lock; a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Read more of `recv` into `buf`; `Err` with how the stream ends if it ended (cleanly between frames: answered;
/// inside a frame: malformed; failed: gone).
async fn fill<R: AsyncRead + Unpin>(recv: &mut R, buf: &mut BytesMut) -> Result<(), Served> {
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(16 * 1024);
    }
    match recv.read_buf(buf).await {
        Ok(0) if buf.is_empty() => Err(Served::Answered),
        Ok(0) => Err(Served::Malformed),
        Ok(_) => Ok(()),
        Err(_) => Err(Served::Gone),
    }
}

fn malformed(counters: &Counters) -> Served {
    Counters::inc(&counters.refused_malformed);
    Served::Malformed
}

/// A publish stream, opened by `first` (a `Publish` frame) with `buf` holding what was read after it: every
/// frame must be a `Publish`; each is relayed, and a QoS 1 one answered `Accepted` once it is queued for every
/// subscriber. The messages of one read are relayed under one lock and their answers written in one write.
pub async fn publishing<R, W>(
    recv: &mut R,
    send: &mut W,
    first: Frame,
    mut buf: BytesMut,
    relay: &RelayServer,
) -> Served
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let counters = &*relay.counters;
    let mut frames = vec![first];
    let mut out = BytesMut::new();
    loop {
        loop {
            match wire::decode(&mut buf) {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(_) => return malformed(counters),
            }
        }
        {
            let mut state = relay.lock();
            for frame in frames.drain(..) {
                let Frame::Publish {
                    qos,
                    channel,
                    id,
                    payload,
                } = frame
                else {
                    return malformed(counters);
                };
                Counters::inc(&counters.received);
                state.publish(channel, qos, &payload);
                if qos == QoS::AtLeastOnce {
                    wire::encode_accepted(id, &mut out);
                }
            }
        }
        if !out.is_empty() {
            if send.write_all(&out).await.is_err() {
                return Served::Gone;
            }
            out.clear();
        }
        if let Err(end) = fill(recv, &mut buf).await {
            return end;
        }
    }
}

/// A subscription stream of `device` to `channel` at `qos`, with `buf` holding what was read after its
/// `Subscribe`: answered `Subscribed`, then deliveries written as the relay has them while the device's `Ack`s
/// are read, until either side ends or a newer stream of the device takes the subscription over.
pub async fn subscription<R, W>(
    recv: &mut R,
    send: &mut W,
    device: u64,
    channel: u32,
    qos: QoS,
    buf: BytesMut,
    relay: &RelayServer,
) -> Served
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let attached = relay.lock().attach(device, channel, qos);
    let mut answer = BytesMut::new();
    let granted = attached.as_ref().map(|a| a.granted);
    wire::encode(&Frame::Subscribed { channel, granted }, &mut answer);
    if send.write_all(&answer).await.is_err() {
        if let Some(a) = attached {
            relay.lock().detach(a.key, a.token);
        }
        return Served::Gone;
    }
    let Some(attached) = attached else {
        return Served::Answered; // refused: the answer says so
    };
    let acks = pin!(read_acks(recv, buf, &attached, relay));
    let deliveries = pin!(write_deliveries(send, &attached, relay));
    let served = match select(acks, deliveries).await {
        Either::Left((served, _)) | Either::Right((served, _)) => served,
    };
    relay.lock().detach(attached.key, attached.token);
    served
}

/// The device's side of a subscription stream: `Ack` frames only.
async fn read_acks<R: AsyncRead + Unpin>(
    recv: &mut R,
    mut buf: BytesMut,
    attached: &Attached,
    relay: &RelayServer,
) -> Served {
    loop {
        let mut seqs = Vec::new();
        loop {
            match wire::decode(&mut buf) {
                Ok(Some(Frame::Ack { seq })) => seqs.push(seq),
                Ok(None) => break,
                Ok(Some(_)) | Err(_) => return malformed(&relay.counters),
            }
        }
        if !seqs.is_empty() {
            let mut state = relay.lock();
            for seq in seqs {
                state.ack(attached.key, seq);
            }
        }
        if let Err(end) = fill(recv, &mut buf).await {
            return end;
        }
    }
}

/// The server's side of a subscription stream: whatever the relay has for it, in batches, as long as the stream
/// is the subscription's. A slow reader blocks this write only; meanwhile the subscription's queue fills and the
/// relay drops (and counts) what does not fit.
async fn write_deliveries<W: AsyncWrite + Unpin>(
    send: &mut W,
    attached: &Attached,
    relay: &RelayServer,
) -> Served {
    let mut out = BytesMut::with_capacity(4096);
    loop {
        out.clear();
        let polled = relay
            .lock()
            .poll(attached.key, attached.token, &mut out, WRITE_BATCH);
        match polled {
            None => return Served::Answered, // taken over by a newer stream
            Some(0) => attached.wake.notified().await,
            Some(_) => {
                if send.write_all(&out).await.is_err() {
                    return Served::Gone;
                }
            }
        }
    }
}
