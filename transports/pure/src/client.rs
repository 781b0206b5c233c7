//! The devices' UDP driver: a [`Fleet`] of [`Sender`]s sharing a few sockets.
//!
//! Devices are spread over up to [`MAX_SHARDS`] shards; each shard is one tokio task with one UDP socket and the
//! sans-IO senders of its devices. Answers are routed to a device by the key id they carry. Every device keeps its
//! own key, run, window and timers; sharing a socket only saves file descriptors (10,000 devices fit under a cap of
//! 20,000 open files with room to spare).

use crate::crypto::NodeKey;
use crate::sender::{Sender, SenderConfig, SenderEvent};
use crate::wire::KeyId;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use transport_core::{BoxFuture, Counters, Fleet, LinkEvent, Order, TransportError};

/// Shards (tasks and sockets) at most.
pub const MAX_SHARDS: usize = 16;

enum Command {
    Send(u32, Order),
}

/// The devices of one run.
pub struct PureFleet {
    shards: Vec<mpsc::UnboundedSender<Command>>,
    pending: Arc<AtomicUsize>,
    stop: watch::Sender<bool>,
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl PureFleet {
    /// Create the devices' senders and start their shards.
    pub async fn start(
        server: SocketAddr,
        receiver_public: [u8; 32],
        device_keys: Vec<NodeKey>,
        config: SenderConfig,
        events: mpsc::UnboundedSender<LinkEvent>,
        counters: Arc<Counters>,
    ) -> Result<PureFleet, TransportError> {
        let shards = device_keys.len().clamp(1, MAX_SHARDS);
        let pending = Arc::new(AtomicUsize::new(0));
        let (stop, stop_rx) = watch::channel(false);
        let mut per_shard: Vec<Vec<(u32, Sender)>> = (0..shards).map(|_| Vec::new()).collect();
        for (n, key) in device_keys.into_iter().enumerate() {
            let rng = StdRng::from_os_rng();
            let sender = Sender::new(config.clone(), key, receiver_public, rng, counters.clone())
                .map_err(|e| {
                TransportError::Identity(format!("the receiver's public key: {e}"))
            })?;
            per_shard[n % shards].push((n as u32, sender));
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
        for devices in per_shard {
            let socket = UdpSocket::bind(bind).await?;
            transport_core::net::set_buffers(&socket, 4 << 20)?;
            let (tx, rx) = mpsc::unbounded_channel();
            let shard = Shard::new(socket, server, devices, events.clone(), pending.clone());
            tasks.push(tokio::spawn(shard.run(rx, stop_rx.clone())));
            txs.push(tx);
        }
        Ok(PureFleet {
            shards: txs,
            pending,
            stop,
            tasks: std::sync::Mutex::new(tasks),
        })
    }
}

impl Fleet for PureFleet {
    fn connect(&self, _device: u32) -> BoxFuture<'_, Result<(), TransportError>> {
        // No handshake: the first record is already sealed.
        Box::pin(async { Ok(()) })
    }

    fn send(&self, device: u32, order: Order) {
        self.pending.fetch_add(1, Ordering::Relaxed);
        let shard = device as usize % self.shards.len();
        let _ = self.shards[shard].send(Command::Send(device, order));
    }

    fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
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

impl Drop for PureFleet {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

struct Shard {
    socket: UdpSocket,
    server: SocketAddr,
    devices: Vec<(u32, Sender)>,
    by_key: HashMap<KeyId, usize>,
    by_device: HashMap<u32, usize>,
    timers: BinaryHeap<Reverse<(Instant, usize)>>,
    /// The earliest timer queued for each device, so the heap holds one live entry per device.
    scheduled: Vec<Option<Instant>>,
    dirty: Vec<usize>,
    events: mpsc::UnboundedSender<LinkEvent>,
    pending: Arc<AtomicUsize>,
}

impl Shard {
    fn new(
        socket: UdpSocket,
        server: SocketAddr,
        devices: Vec<(u32, Sender)>,
        events: mpsc::UnboundedSender<LinkEvent>,
        pending: Arc<AtomicUsize>,
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
            server,
            devices,
            by_key,
            by_device,
            timers: BinaryHeap::new(),
            scheduled,
            dirty: Vec::new(),
            events,
            pending,
        }
    }

    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut buf = vec![0u8; 65_536];
        loop {
            let next_timer = self.timers.peek().map(|Reverse((t, _))| *t);
            tokio::select! {
                _ = stop.changed() => return,
                cmd = commands.recv() => {
                    let Some(cmd) = cmd else { return };
                    let now = Instant::now();
                    self.command(now, cmd);
                    while let Ok(cmd) = commands.try_recv() {
                        self.command(now, cmd);
                    }
                }
                r = self.socket.recv_from(&mut buf) => {
                    let now = Instant::now();
                    if let Ok((n, _)) = r {
                        self.datagram(now, &buf[..n]);
                    }
                    while let Ok((n, _)) = self.socket.try_recv_from(&mut buf) {
                        self.datagram(now, &buf[..n]);
                    }
                }
                _ = sleep_until(next_timer) => {
                    let now = Instant::now();
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
        }
    }

    fn command(&mut self, now: Instant, cmd: Command) {
        let Command::Send(device, order) = cmd;
        if let Some(&i) = self.by_device.get(&device) {
            self.devices[i].1.push(now, order);
            self.dirty.push(i);
        }
    }

    fn datagram(&mut self, now: Instant, data: &[u8]) {
        // The receiver packs the answers for one address into as few datagrams as fit, and the devices of a shard
        // share that address: hand each device the run of frames that are its own.
        let mut at = 0;
        while at < data.len() {
            let Ok((crate::wire::Frame::Answer(a), used)) = crate::wire::parse_frame(&data[at..])
            else {
                return;
            };
            let mut end = at + used;
            while end < data.len() {
                match crate::wire::parse_frame(&data[end..]) {
                    Ok((crate::wire::Frame::Answer(b), n)) if b.key_id == a.key_id => end += n,
                    _ => break,
                }
            }
            if let Some(&i) = self.by_key.get(&a.key_id) {
                self.deliver(now, i, &data[at..end]);
            }
            at = end;
        }
    }

    fn deliver(&mut self, now: Instant, i: usize, frames: &[u8]) {
        let (device, sender) = &mut self.devices[i];
        sender.handle(now, frames);
        while let Some(SenderEvent::Stored(id)) = sender.poll_event() {
            self.pending.fetch_sub(1, Ordering::Relaxed);
            let _ = self.events.send(LinkEvent::Stored {
                device: *device,
                id,
                at: now,
            });
        }
        self.dirty.push(i);
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        let mut out = Vec::with_capacity(crate::wire::MAX_DATAGRAM);
        for &i in &dirty {
            let now = Instant::now();
            let sender = &mut self.devices[i].1;
            while sender.poll_transmit(now, &mut out) {
                send(&self.socket, &out, self.server).await?;
            }
            if let Some(t) = self.devices[i].1.poll_timeout() {
                if self.scheduled[i].is_none_or(|s| t < s) {
                    self.scheduled[i] = Some(t);
                    self.timers.push(Reverse((t, i)));
                }
            }
        }
        self.dirty = dirty;
        self.dirty.clear();
        Ok(())
    }
}

/// Send one datagram, waiting for buffer space if the socket is full. A receiver that is gone (ICMP port
/// unreachable, reported on the next send) is not an error: the records are re-sent when it is back.
async fn send(socket: &UdpSocket, data: &[u8], to: SocketAddr) -> std::io::Result<()> {
    match socket.send_to(data, to).await {
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
