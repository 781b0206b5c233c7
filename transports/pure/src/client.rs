//! The devices' UDP driver: a [`Fleet`] of [`Sender`]s, by default each on a UDP socket of its own.
//!
//! Devices are spread over shards; each shard is one tokio task with one UDP socket and the sans-IO senders of its
//! devices. By default ([`Sockets::PerDevice`]) a shard is one device, so every device has its own source address,
//! as devices on their own addresses do, and the receiver (which packs answers per destination address) answers
//! each in datagrams of its own. 10,000 devices fit under this machine's 20,000 open files; a larger fleet is split
//! over worker processes (`FleetConfig::first`). [`Sockets::Shared`] keeps at most [`MAX_SHARED_SOCKETS`] shards,
//! whose devices share an address: the receiver then packs answers for many devices into one datagram, which saves
//! system calls on both sides and which devices on their own addresses never allow; it is a named comparison
//! (`+shared-sockets` variants), never the default. Answers and deliveries are routed to a device by the key id they
//! carry, so the routing holds either way. Every device keeps its own key, runs, window and timers.
//!
//! Publish/subscribe: [`Fleet::subscribe`] resolves when the receiver answers the subscribe, with an error when it
//! refuses it (the device has as many channels as the relay keeps, as MQTT's SUBACK 0x80); [`Fleet::publish`]
//! makes a payload of the asked size that starts with the message id, and reports [`LinkEvent::Accepted`] when the
//! receiver answers it (QoS 1) or when it is handed to the socket (QoS 0); each subscribed device reports
//! [`LinkEvent::Delivered`] once per message.

use crate::crypto::NodeKey;
use crate::sender::{Sender, SenderConfig, SenderEvent};
use crate::wire::{self, KeyId};
use foldhash::{HashMap, HashMapExt};
use rand::rngs::StdRng;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot, watch};
use transport_core::net;
use transport_core::{BoxFuture, Counters, Fleet, LinkEvent, Order, Publish, QoS, TransportError};

/// Sockets (and tasks) a fleet of [`Sockets::Shared`] uses at most.
pub const MAX_SHARED_SOCKETS: usize = 16;

/// The most devices a [`Sockets::PerDevice`] fleet gives a socket each: one process may hold 20,000 open files here.
/// A larger fleet in one process (handshake-rate's never-met senders, each used for one order) shares
/// [`MAX_SHARED_SOCKETS`] sockets instead; idle-links splits its links over worker processes so that every device
/// keeps its own socket.
pub const MAX_PER_DEVICE_SOCKETS: usize = 16_000;

/// Commands (orders handed over, subscriptions, publishes) a shard's task takes per turn at most: a window's worth.
const COMMANDS_PER_TURN: usize = 256;

/// How a fleet's devices get their UDP sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sockets {
    /// One socket, so one source address, per device: devices as they are (the default).
    PerDevice,
    /// At most [`MAX_SHARED_SOCKETS`] sockets for the whole fleet: answers for the devices behind one address
    /// arrive packed in one datagram. A comparison, never the default.
    Shared,
}

impl Sockets {
    /// The sockets (shards) a fleet of `devices` devices uses.
    pub fn count(self, devices: usize) -> usize {
        match self {
            Sockets::PerDevice if devices <= MAX_PER_DEVICE_SOCKETS => devices.max(1),
            Sockets::PerDevice | Sockets::Shared => devices.clamp(1, MAX_SHARED_SOCKETS),
        }
    }
}

enum Command {
    Send(u32, Order),
    /// A device's backlog, taken in one turn.
    SendAll(u32, Vec<Order>),
    Subscribe(u32, u32, QoS, oneshot::Sender<Answered>),
    Publish(u32, Publish),
}

/// How the receiver answered a subscribe.
type Answered = Result<(), TransportError>;

/// The payload of message `id`: `size` bytes (at least 8) that start with the id.
pub fn payload(id: u64, size: u32) -> Arc<[u8]> {
    let mut p: Vec<u8> = (0..size.max(8) as usize)
        .map(|i| (id >> ((i % 8) * 8)) as u8 ^ i as u8)
        .collect();
    p[..8].copy_from_slice(&id.to_be_bytes());
    p.into()
}

/// The counts the fleet and its shards share.
#[derive(Default)]
struct Outstanding {
    /// Orders handed over and not yet stored.
    orders: AtomicUsize,
    /// Messages handed over and not yet accepted.
    publishes: AtomicUsize,
}

/// The devices of one run.
pub struct PureFleet {
    shards: Vec<mpsc::UnboundedSender<Command>>,
    /// The first device number of this fleet's slice: its devices are `first..first + devices`.
    first: u32,
    devices: u32,
    outstanding: Arc<Outstanding>,
    stop: watch::Sender<bool>,
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl PureFleet {
    /// Create the senders of devices `first..first + device_keys.len()` (`device_keys` in that order) and start
    /// their shards, with sockets as `sockets` says.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        server: SocketAddr,
        receiver_public: [u8; 32],
        first: u32,
        device_keys: Vec<NodeKey>,
        config: SenderConfig,
        sockets: Sockets,
        events: transport_core::events::EventSender,
        counters: Arc<Counters>,
    ) -> Result<PureFleet, TransportError> {
        let devices = device_keys.len() as u32;
        let shards = sockets.count(device_keys.len());
        let outstanding = Arc::new(Outstanding::default());
        let (stop, stop_rx) = watch::channel(false);
        let mut per_shard: Vec<Vec<(u32, Sender)>> = (0..shards).map(|_| Vec::new()).collect();
        for (n, key) in device_keys.into_iter().enumerate() {
            let rng: StdRng = rand::make_rng();
            let sender = Sender::new(config.clone(), key, receiver_public, rng, counters.clone())
                .map_err(|e| {
                TransportError::Identity(format!("the receiver's public key: {e}"))
            })?;
            let device = first
                .checked_add(n as u32)
                .ok_or_else(|| TransportError::Config("device numbers overflow".into()))?;
            per_shard[n % shards].push((device, sender));
        }
        let bind: SocketAddr = if server.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        }
        .parse()
        .expect("valid");
        let mut txs = Vec::with_capacity(shards);
        let mut tasks = Vec::with_capacity(shards);
        for members in per_shard {
            let socket = UdpSocket::bind(bind).await.map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "socket {} of {shards} for {devices} devices ({sockets:?}): {e}; a larger fleet is split \
                         over worker processes",
                        txs.len() + 1
                    ),
                )
            })?;
            transport_core::net::set_buffers(&socket, 4 << 20)?;
            // Connected to the receiver, as a device talks to one service: the kernel keeps the route instead of
            // looking it up for every datagram, and takes datagrams from the receiver's address only.
            socket.connect(server).await?;
            let (tx, rx) = mpsc::unbounded_channel();
            let shard = Shard::new(
                socket,
                members,
                events.clone(),
                outstanding.clone(),
                counters.clone(),
            );
            tasks.push(tokio::spawn(shard.run(rx, stop_rx.clone())));
            txs.push(tx);
        }
        Ok(PureFleet {
            shards: txs,
            first,
            devices,
            outstanding,
            stop,
            tasks: std::sync::Mutex::new(tasks),
        })
    }
}

impl Fleet for PureFleet {
    fn connect(&self, device: u32) -> BoxFuture<'_, Result<(), TransportError>> {
        // No handshake: the first record is already sealed. Only a device of this fleet can be used.
        let known = self.check_device(device);
        Box::pin(async { known })
    }

    fn send(&self, device: u32, order: Order) {
        self.outstanding.orders.fetch_add(1, Ordering::Relaxed);
        if self.command(device, Command::Send(device, order)).is_err() {
            self.outstanding.orders.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn send_all(&self, device: u32, orders: Vec<Order>) {
        let n = orders.len();
        self.outstanding.orders.fetch_add(n, Ordering::Relaxed);
        if self
            .command(device, Command::SendAll(device, orders))
            .is_err()
        {
            self.outstanding.orders.fetch_sub(n, Ordering::Relaxed);
        }
    }

    fn pending(&self) -> usize {
        self.outstanding.orders.load(Ordering::Relaxed)
    }

    fn subscribe(
        &self,
        device: u32,
        channel: u32,
        qos: QoS,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        let (tx, rx) = oneshot::channel();
        let sent = self.command(device, Command::Subscribe(device, channel, qos, tx));
        Box::pin(async move {
            sent?;
            rx.await.map_err(|_| {
                TransportError::Io(std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "the fleet closed before the subscription was answered",
                ))
            })?
        })
    }

    fn publish(&self, device: u32, message: Publish) {
        self.outstanding.publishes.fetch_add(1, Ordering::Relaxed);
        if self
            .command(device, Command::Publish(device, message))
            .is_err()
        {
            self.outstanding.publishes.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn publishing(&self) -> usize {
        self.outstanding.publishes.load(Ordering::Relaxed)
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let _ = self.stop.send(true);
            let tasks = std::mem::take(&mut *self.tasks.lock().expect("not poisoned"));
            for t in tasks {
                let _ = t.await;
            }
        })
    }
}

impl PureFleet {
    /// Hand a command to the shard of `device`.
    fn command(&self, device: u32, cmd: Command) -> Result<(), TransportError> {
        self.check_device(device)?;
        let shard = (device - self.first) as usize % self.shards.len();
        self.shards[shard].send(cmd).map_err(|_| {
            TransportError::Io(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the fleet is closed",
            ))
        })
    }

    /// Whether `device` is one of this fleet's devices.
    fn check_device(&self, device: u32) -> Result<(), TransportError> {
        if device
            .checked_sub(self.first)
            .is_none_or(|n| n >= self.devices)
        {
            return Err(TransportError::Config(format!(
                "no device {device}: the fleet has devices {}..{}",
                self.first,
                u64::from(self.first) + u64::from(self.devices)
            )));
        }
        Ok(())
    }
}

impl Drop for PureFleet {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

struct Shard {
    /// Connected to the receiver.
    socket: UdpSocket,
    devices: Vec<(u32, Sender)>,
    by_key: HashMap<KeyId, usize>,
    by_device: HashMap<u32, usize>,
    timers: BinaryHeap<Reverse<(Instant, usize)>>,
    /// The earliest timer queued for each device, so the heap holds one live entry per device.
    scheduled: Vec<Option<Instant>>,
    dirty: Vec<usize>,
    events: transport_core::events::EventSender,
    outstanding: Arc<Outstanding>,
    counters: Arc<Counters>,
    /// Subscriptions not answered yet, by (device index, channel).
    waiters: HashMap<(usize, u32), Vec<oneshot::Sender<Answered>>>,
    /// The datagram being filled, kept between flushes.
    out: Vec<u8>,
    /// The datagrams ready to go, kept between flushes.
    batch: Batch,
}

impl Shard {
    fn new(
        socket: UdpSocket,
        devices: Vec<(u32, Sender)>,
        events: transport_core::events::EventSender,
        outstanding: Arc<Outstanding>,
        counters: Arc<Counters>,
    ) -> Shard {
        let by_key = devices
            .iter()
            .enumerate()
            .map(|(i, (_, s))| (s.key_id(), i))
            .collect();
        let by_device = devices
            .iter()
            .enumerate()
            .map(|(i, (n, _))| (*n, i))
            .collect();
        let scheduled = vec![None; devices.len()];
        Shard {
            socket,
            devices,
            by_key,
            by_device,
            timers: BinaryHeap::new(),
            scheduled,
            dirty: Vec::new(),
            events,
            outstanding,
            counters,
            waiters: HashMap::new(),
            out: Vec::with_capacity(wire::MAX_DATAGRAM),
            batch: Batch::default(),
        }
    }

    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut stop: watch::Receiver<bool>,
    ) {
        // One byte over the largest datagram a receiver sends: a longer one arrives cut and is dropped unread.
        let mut buf = vec![0u8; wire::MAX_DATAGRAM + 1];
        loop {
            let next_timer = self.timers.peek().map(|Reverse((t, _))| *t);
            let mut more = false;
            tokio::select! {
                _ = stop.changed() => return,
                cmd = commands.recv() => {
                    let Some(cmd) = cmd else { return };
                    let now = Instant::now();
                    self.command(now, cmd);
                    for _ in 1..COMMANDS_PER_TURN {
                        let Ok(cmd) = commands.try_recv() else { break };
                        self.command(now, cmd);
                    }
                    more = !commands.is_empty();
                }
                r = self.socket.recv(&mut buf) => {
                    let now = Instant::now();
                    if let Ok(n) = r {
                        self.datagram(now, &buf[..n]);
                    }
                    self.read_waiting(now, &mut buf);
                }
                _ = sleep_until(next_timer) => {
                    // Answers that arrived while this task waited for its turn count before any timer: a frame
                    // whose answer is already in the socket's buffer is never re-sent.
                    let now = Instant::now();
                    self.read_waiting(now, &mut buf);
                    while let Some(&Reverse((t, i))) = self.timers.peek() {
                        if t > now {
                            break;
                        }
                        self.timers.pop();
                        if self.scheduled[i] == Some(t) {
                            self.scheduled[i] = None;
                            self.devices[i].1.handle_timeout(now);
                            self.dirty.push(i);
                        }
                    }
                }
            }
            if self.flush().await.is_err() {
                return;
            }
            if more {
                // The rest of a backlog waits for this task's next turn: every shard sends what its windows allow
                // before any takes a whole backlog in, so a device's first datagrams never wait behind the other
                // devices' bookkeeping.
                tokio::task::yield_now().await;
            }
        }
    }

    fn command(&mut self, now: Instant, cmd: Command) {
        let device = match &cmd {
            Command::Send(d, _)
            | Command::SendAll(d, _)
            | Command::Subscribe(d, ..)
            | Command::Publish(d, _) => *d,
        };
        let Some(&i) = self.by_device.get(&device) else {
            return;
        };
        let sender = &mut self.devices[i].1;
        match cmd {
            Command::Send(_, order) => sender.push(now, order),
            Command::SendAll(_, orders) => sender.push_all(now, orders),
            Command::Subscribe(_, channel, qos, answered) => {
                self.waiters.entry((i, channel)).or_default().push(answered);
                sender.subscribe(now, channel, qos);
            }
            Command::Publish(_, m) => {
                let published = sender.publish(now, m.channel, m.id, m.qos, payload(m.id, m.size));
                if published.is_err() {
                    // Larger than a datagram: never sent, never accepted (the workload checks sizes first).
                    Counters::inc(&self.counters.refused_oversized);
                    self.outstanding.publishes.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        self.dirty.push(i);
    }

    /// Take every datagram waiting in the socket's buffer.
    fn read_waiting(&mut self, now: Instant, buf: &mut [u8]) {
        while let Ok(n) = self.socket.try_recv(buf) {
            self.datagram(now, &buf[..n]);
        }
    }

    fn datagram(&mut self, now: Instant, data: &[u8]) {
        // The receiver packs the frames for one address into as few datagrams as fit; with shared sockets the
        // devices of a shard share that address: hand each device the run of frames that are its own.
        let mut at = 0;
        while at < data.len() {
            let Ok((first, used)) = wire::parse_frame(&data[at..]) else {
                return;
            };
            let mut end = at + used;
            while end < data.len() {
                match wire::parse_frame(&data[end..]) {
                    Ok((f, n)) if f.key_id() == first.key_id() => end += n,
                    _ => break,
                }
            }
            if let Some(&i) = self.by_key.get(&first.key_id()) {
                self.devices[i].1.handle(now, &data[at..end]);
                self.report(now, i);
                self.dirty.push(i);
            }
            at = end;
        }
    }

    /// Report what device `i` has to say.
    fn report(&mut self, now: Instant, i: usize) {
        let (device, sender) = &mut self.devices[i];
        // What one datagram answered goes to the workload as one batch.
        let mut batch = Vec::with_capacity(sender.pending_events());
        let mut stored = 0;
        while let Some(event) = sender.poll_event() {
            let event = match event {
                SenderEvent::Stored(id) => {
                    stored += 1;
                    LinkEvent::Stored {
                        device: *device,
                        id,
                        at: now,
                    }
                }
                SenderEvent::Subscribed(channel) => {
                    for w in self.waiters.remove(&(i, channel)).unwrap_or_default() {
                        let _ = w.send(Ok(()));
                    }
                    continue;
                }
                SenderEvent::Refused(channel) => {
                    for w in self.waiters.remove(&(i, channel)).unwrap_or_default() {
                        let _ = w.send(Err(TransportError::Protocol(format!(
                            "the receiver refused device {device}'s subscription to channel {channel}: \
                             it keeps no more channels for that device"
                        ))));
                    }
                    continue;
                }
                SenderEvent::Accepted(id) => {
                    self.outstanding.publishes.fetch_sub(1, Ordering::Relaxed);
                    LinkEvent::Accepted {
                        device: *device,
                        id,
                        at: now,
                    }
                }
                SenderEvent::Delivered { id, .. } => LinkEvent::Delivered {
                    device: *device,
                    id,
                    at: now,
                },
            };
            batch.push(event);
        }
        if stored > 0 {
            self.outstanding.orders.fetch_sub(stored, Ordering::Relaxed);
        }
        let _ = self.events.send_all(batch);
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        let mut out = std::mem::take(&mut self.out);
        let mut batch = std::mem::take(&mut self.batch);
        for &i in &dirty {
            let now = Instant::now();
            let sender = &mut self.devices[i].1;
            // A device's datagrams go to the kernel together, as many as one segmented send takes: all of one
            // size but the last, which may be shorter.
            while sender.poll_transmit(now, &mut out) {
                if batch.count > 0
                    && (out.len() > batch.segment || batch.count == net::MAX_SEGMENTS)
                {
                    batch.send(&self.socket).await?;
                }
                batch.push(&out);
                if out.len() < batch.segment {
                    batch.send(&self.socket).await?;
                }
            }
            batch.send(&self.socket).await?;
            // QoS 0 publishes are accepted as they are handed to the socket.
            self.report(now, i);
            if let Some(t) = self.devices[i].1.poll_timeout() {
                if self.scheduled[i].is_none_or(|s| t < s) {
                    self.scheduled[i] = Some(t);
                    self.timers.push(Reverse((t, i)));
                }
            }
        }
        self.dirty = dirty;
        self.dirty.clear();
        self.out = out;
        self.batch = batch;
        Ok(())
    }
}

/// Datagrams of one device waiting to be sent in one system call ([`net::send_segments`]).
#[derive(Default)]
struct Batch {
    data: Vec<u8>,
    /// The size of each datagram but the last.
    segment: usize,
    count: usize,
    /// Segmentation offload failed on this socket once: send one datagram per call from then on.
    unsupported: bool,
}

impl Batch {
    fn push(&mut self, datagram: &[u8]) {
        if self.count == 0 {
            self.segment = datagram.len();
        }
        self.data.extend_from_slice(datagram);
        self.count += 1;
    }

    /// Send what is batched, in one call where the kernel segments UDP, else one datagram at a time.
    async fn send(&mut self, socket: &UdpSocket) -> std::io::Result<()> {
        let result = match self.count {
            0 => Ok(()),
            1 => send(socket, &self.data).await,
            _ if !self.unsupported => {
                let sent = socket
                    .async_io(tokio::io::Interest::WRITABLE, || {
                        net::send_segments(socket, &self.data, self.segment)
                    })
                    .await;
                match sent {
                    Ok(_) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(()),
                    Err(e) if net::is_segmentation_unsupported(&e) => {
                        self.unsupported = true;
                        self.send_each(socket).await
                    }
                    Err(e) => Err(e),
                }
            }
            _ => self.send_each(socket).await,
        };
        self.data.clear();
        self.count = 0;
        result
    }

    async fn send_each(&self, socket: &UdpSocket) -> std::io::Result<()> {
        for datagram in self.data.chunks(self.segment) {
            send(socket, datagram).await?;
        }
        Ok(())
    }
}

/// Send one datagram, waiting for buffer space if the socket is full. A receiver that is gone (ICMP port
/// unreachable, reported on the next send) is not an error: the records are re-sent when it is back.
async fn send(socket: &UdpSocket, data: &[u8]) -> std::io::Result<()> {
    match socket.send(data).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(()),
        Err(e) => Err(e),
    }
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ways a batch leaves, segmented in one call and one datagram per call (where the kernel cannot
    /// segment): the receiver gets the same datagrams, in order.
    #[tokio::test]
    async fn a_batch_arrives_as_its_datagrams_either_way() {
        for unsupported in [false, true] {
            let receiver = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            socket
                .connect(receiver.local_addr().unwrap())
                .await
                .unwrap();
            let mut batch = Batch {
                unsupported,
                ..Batch::default()
            };
            let datagrams: Vec<Vec<u8>> = (1..=5u8)
                .map(|i| vec![i; 100])
                .chain([vec![9; 7]])
                .collect();
            for d in &datagrams {
                batch.push(d);
            }
            batch.send(&socket).await.unwrap();
            assert_eq!((batch.count, batch.data.len()), (0, 0));
            let mut buf = [0u8; 256];
            for d in &datagrams {
                let n = receiver.recv(&mut buf).await.unwrap();
                assert_eq!(&buf[..n], &d[..], "unsupported: {unsupported}");
            }
        }
    }
}
