//! The broker's tokio driver: listeners, TLS, one reader and one writer task per connection, `$SYS` publication.
//!
//! Shaped like mini-redis: connections are bounded by a semaphore taken before `accept`; each connection owns a
//! `BytesMut` read buffer from which frames are checked, then parsed; the whole broker runs until its future is
//! dropped, which aborts every task it started (a `JoinSet` per listener and one for the connections).
//!
//! Per connection, the **reader** decodes packets, runs them through the sans-IO [`Connection`] under the broker
//! lock, commits orders to the store (the orders of one read in one commit, group-committed with other
//! connections') and only then queues their PUBACKs. The **writer** writes the reader's control packets and pulls
//! deliveries from the broker when woken; it starts pulling deliveries only after the first control packet
//! (CONNACK) is written, so CONNACK is always first [MQTT-3.2.0-1]. A slow subscriber blocks only its own writer;
//! meanwhile its session queue fills and further QoS 0 messages for it are dropped and counted.
//!
//! With a state directory ([`BrokerConfig::state_dir`]), persistent sessions are kept in
//! [`persist`](super::persist)'s files: the records a step of the state appends are handed to the session writer
//! under the broker lock (so in the order made), and a reader sends no control packet, and a writer no delivery,
//! before the records its step depended on are on disk.

use super::connection::{Action, Close, Connection};
use super::persist::{PersistError, Recovery, SessionStore};
use super::state::{Broker as State, ConnId, SessionLimits, Stats};
use crate::codec::{read_packet, Packet};
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use transport_core::commit::SharedStore;
use transport_core::{Counters, StateSyncs, TransportError};

/// The broker's settings.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Queue and window bounds of each session.
    pub limits: SessionLimits,
    /// The largest packet accepted, fixed header included; a larger remaining length closes the connection as soon
    /// as its header is read.
    pub max_packet_size: usize,
    /// Connections served at once; further clients wait in the listen backlog.
    pub max_connections: usize,
    /// Time from accepting a connection to its CONNECT (the TLS handshake included).
    pub connect_timeout: Duration,
    /// The longest a connected client may stay silent, whatever its keepalive (0 included).
    pub max_idle: Duration,
    /// The longest one write to a client may make no progress (a client that stops reading); then the connection
    /// is closed.
    pub write_timeout: Duration,
    /// How often `$SYS/broker/...` is published.
    pub sys_interval: Duration,
    /// Bytes of deliveries a writer gathers into one write.
    pub write_batch: usize,
    /// Where persistent sessions are kept across restarts (`None`: in memory only). The driver uses the store's
    /// directory: the broker's sessions are server state like the orders beside them, kept and reset with them.
    pub state_dir: Option<PathBuf>,
    /// Where the time of every sync of the session files is recorded.
    pub state_syncs: Arc<StateSyncs>,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            limits: SessionLimits::default(),
            max_packet_size: 1 << 20,
            max_connections: 50_000,
            connect_timeout: Duration::from_secs(10),
            max_idle: Duration::from_secs(900),
            write_timeout: Duration::from_secs(30),
            sys_interval: Duration::from_secs(10),
            write_batch: 64 * 1024,
            state_dir: None,
            state_syncs: Arc::default(),
        }
    }
}

/// A bound socket and whether it speaks TLS.
pub struct Listener {
    /// The bound socket.
    pub tcp: TcpListener,
    /// TLS 1.3 with client certificates (`transport_tls::server_config`); `None` is plaintext, only when asked.
    pub tls: Option<TlsAcceptor>,
}

/// Control packets waiting for a writer, per connection; the reader waits when it is full.
const CONTROL_QUEUE: usize = 64;
/// How long a closing connection's writer may take to flush its last packets.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// How long a connection's read buffer is kept with nothing in it. An idle link then holds no buffer of its own
/// (its next read starts small and grows), so memory per idle link is the TLS state and the session, as it is for a
/// broker that releases its buffers when idle.
const IDLE_BUFFER_RELEASE: Duration = Duration::from_secs(1);
/// Bytes a quiet link's buffer starts with, and what a busy one (a read filled its buffer) reads into.
const QUIET_READ: usize = 512;
const BUSY_READ: usize = 8192;

/// A connection's wake-ups: new deliveries (writer) and a takeover (reader).
#[derive(Default)]
struct Signal {
    deliver: Notify,
    kick: Notify,
}

struct Locked {
    state: State,
    signals: HashMap<ConnId, Arc<Signal>>,
    scratch: Vec<ConnId>,
    sessions: Option<SessionStore>,
}

/// The session journal records a step of the state depends on: its own (`own`), or everything handed over up to it
/// (`all`); `None` without persistence or records.
#[derive(Debug, Clone, Copy, Default)]
struct Barrier {
    own: Option<u64>,
    all: Option<u64>,
}

struct Shared {
    locked: Mutex<Locked>,
    config: BrokerConfig,
    store: SharedStore,
    counters: Arc<Counters>,
    next_conn: AtomicU64,
    recovery: Option<Recovery>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Locked> {
        // A panic under the lock would be a bug; the state is still consistent enough to keep serving others.
        self.locked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run `f` on the state, then wake the writers that have deliveries and the readers taken over.
    fn with_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        self.step(f).0
    }

    /// [`Shared::with_state`], handing the journal records `f` made to the session writer.
    fn step<R>(&self, f: impl FnOnce(&mut State) -> R) -> (R, Barrier) {
        let mut guard = self.lock();
        let locked = &mut *guard;
        let r = f(&mut locked.state);
        let mut barrier = Barrier::default();
        if let Some(sessions) = locked.sessions.as_mut() {
            if let Some(records) = locked.state.take_journal() {
                let state = &locked.state;
                barrier.own = Some(sessions.append(records, || state.snapshot()));
            }
            barrier.all = Some(sessions.appended());
        }
        locked.scratch.clear();
        locked.state.drain_wakes(&mut locked.scratch);
        for conn in &locked.scratch {
            if let Some(s) = locked.signals.get(conn) {
                s.deliver.notify_one();
            }
        }
        locked.scratch.clear();
        locked.state.drain_kicked(&mut locked.scratch);
        for conn in &locked.scratch {
            if let Some(s) = locked.signals.get(conn) {
                s.kick.notify_one();
            }
        }
        (r, barrier)
    }

    /// Wait until the session records up to `seq` are on disk.
    async fn settle(&self, seq: Option<u64>) -> Result<(), Close> {
        let Some(seq) = seq else { return Ok(()) };
        let durable = match &self.lock().sessions {
            Some(sessions) => sessions.durable(seq),
            None => return Ok(()),
        };
        durable.await.map_err(|e| Close::Lost(e.to_string()))
    }
}

/// A broker ready to serve listeners.
#[derive(Clone)]
pub struct Broker {
    shared: Arc<Shared>,
}

impl Broker {
    /// A broker committing orders to `store` and counting into `counters`, its persistent sessions restored from
    /// `config.state_dir` (see [`persist`](super::persist) for what a damaged file does).
    pub fn new(
        config: BrokerConfig,
        store: SharedStore,
        counters: Arc<Counters>,
    ) -> Result<Self, PersistError> {
        let mut state = State::new(
            config.limits.clone(),
            counters.clone(),
            std::time::Instant::now(),
        );
        let (sessions, recovery) = match &config.state_dir {
            Some(dir) => {
                let (sessions, recovery) =
                    SessionStore::open_recording(dir, &mut state, config.state_syncs.clone())?;
                (Some(sessions), Some(recovery))
            }
            None => (None, None),
        };
        Ok(Broker {
            shared: Arc::new(Shared {
                locked: Mutex::new(Locked {
                    state,
                    signals: HashMap::new(),
                    scratch: Vec::new(),
                    sessions,
                }),
                config,
                store,
                counters,
                next_conn: AtomicU64::new(1),
                recovery,
            }),
        })
    }

    /// What the start restored from the state directory, if there is one.
    pub fn recovery(&self) -> Option<Recovery> {
        self.shared.recovery
    }

    /// Stop the session writer once the records handed over so far are durable, releasing the state directory's
    /// lock; the future resolves when it has. The request is made at the call, so dropping the future still
    /// closes. Call it when the broker stops (the future of [`Broker::run`] dropped); records made after it are
    /// never acknowledged.
    pub fn close(&self) -> impl std::future::Future<Output = ()> {
        let close = self
            .shared
            .lock()
            .sessions
            .as_ref()
            .map(SessionStore::close);
        async move {
            if let Some(close) = close {
                close.await;
            }
        }
    }

    /// Current statistics.
    pub fn stats(&self) -> Stats {
        self.shared.lock().state.stats()
    }

    /// Serve `listeners` until the returned future is dropped (which stops every connection) or a listener fails
    /// for good.
    pub async fn run(self, listeners: Vec<Listener>) -> Result<(), TransportError> {
        raise_fd_limit();
        let limit = Arc::new(Semaphore::new(self.shared.config.max_connections));
        let mut tasks = JoinSet::new();
        for listener in listeners {
            tasks.spawn(accept_loop(self.shared.clone(), listener, limit.clone()));
        }
        tasks.spawn(sys_loop(self.shared.clone()));
        match tasks.join_next().await {
            Some(Ok(result)) => result,
            Some(Err(e)) => Err(TransportError::Protocol(format!("broker task failed: {e}"))),
            None => Ok(()),
        }
    }
}

/// Bind `addrs` (TLS on the first, plaintext on `plaintext` if given) and serve until dropped.
/// A listening socket on `addr` for the broker's clients. With `fast_open`, a client's first bytes may come in its
/// SYN without a cookie (TCP Fast Open, where the kernel lets servers take them), as `mqtt:fast-open`'s clients send
/// them: the data of a SYN is then processed before the client has proven its address (RFC 7413 section 5), so it
/// is off unless asked for.
pub async fn bind(addr: SocketAddr, fast_open: bool) -> std::io::Result<TcpListener> {
    let tcp = TcpListener::bind(addr).await?;
    if fast_open {
        // Where the kernel has no TCP Fast Open the listener works as any other; the clients count the refusals.
        let _ = transport_core::net::fast_open::server(&tcp, 1024);
    }
    Ok(tcp)
}

pub async fn serve(
    config: BrokerConfig,
    tls: (SocketAddr, TlsAcceptor),
    plaintext: Option<SocketAddr>,
    store: SharedStore,
    counters: Arc<Counters>,
) -> Result<(), TransportError> {
    let mut listeners = vec![Listener {
        tcp: TcpListener::bind(tls.0).await?,
        tls: Some(tls.1),
    }];
    if let Some(addr) = plaintext {
        listeners.push(Listener {
            tcp: TcpListener::bind(addr).await?,
            tls: None,
        });
    }
    Broker::new(config, store, counters)
        .map_err(|e| TransportError::Io(std::io::Error::other(e)))?
        .run(listeners)
        .await
}

/// Allow as many open files as the hard limit permits: each connection is one.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit to read into and then pass back.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

async fn accept_loop(
    shared: Arc<Shared>,
    listener: Listener,
    limit: Arc<Semaphore>,
) -> Result<(), TransportError> {
    let mut conns = JoinSet::new();
    let mut backoff = Duration::from_millis(10);
    loop {
        let permit = tokio::select! {
            permit = limit.clone().acquire_owned() => permit.map_err(|_| TransportError::Protocol("closed".into()))?,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let tcp = loop {
            tokio::select! {
                accepted = listener.tcp.accept() => match accepted {
                    Ok((tcp, _)) => {
                        backoff = Duration::from_millis(10);
                        break tcp;
                    }
                    // Out of file descriptors or a connection reset before accept: wait and go on.
                    Err(_) => {
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                    }
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        };
        conns.spawn(handle(shared.clone(), tcp, listener.tls.clone(), permit));
    }
}

async fn sys_loop(shared: Arc<Shared>) -> Result<(), TransportError> {
    let mut tick = tokio::time::interval(shared.config.sys_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let memory = transport_core::procfs::rss_bytes(std::process::id()).unwrap_or(0);
        shared.with_state(|s| s.publish_sys(std::time::Instant::now(), memory));
    }
}

/// One accepted connection: the TLS handshake (within the connect timeout), the identity, then the MQTT session.
async fn handle(
    shared: Arc<Shared>,
    tcp: TcpStream,
    tls: Option<TlsAcceptor>,
    _permit: OwnedSemaphorePermit,
) {
    let opened = Instant::now();
    let _ = tcp.set_nodelay(true);
    let Some(acceptor) = tls else {
        return session(shared, tcp, None, opened).await;
    };
    let deadline = opened + shared.config.connect_timeout;
    match tokio::time::timeout_at(deadline, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => {
            Counters::inc(&shared.counters.handshakes);
            if stream.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                Counters::inc(&shared.counters.resumed);
            }
            let identity = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(transport_tls::peer_device);
            if identity.is_none() {
                // A verified certificate whose common name is not a device's name (`dev-N`) has no identity to
                // serve: only those names are sender numbers of their own (`transport_tls::peer_device`).
                Counters::inc(&shared.counters.refused_unknown);
                return;
            }
            session(shared, stream, identity, opened).await;
        }
        Ok(Err(e)) => {
            let unknown = e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                .is_some_and(|e| {
                    matches!(
                        e,
                        rustls::Error::InvalidCertificate(_)
                            | rustls::Error::NoCertificatesPresented
                            | rustls::Error::AlertReceived(_)
                    )
                });
            let counter = if unknown {
                &shared.counters.refused_unknown
            } else {
                &shared.counters.refused_malformed
            };
            Counters::inc(counter);
        }
        // No TLS handshake finished within the connect timeout: a half-open connection.
        Err(_) => Counters::inc(&shared.counters.timed_out),
    }
}

/// The MQTT part of a connection over any byte stream.
async fn session<S>(shared: Arc<Shared>, stream: S, identity: Option<String>, opened: Instant)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let id = ConnId(shared.next_conn.fetch_add(1, Ordering::Relaxed));
    let signal = Arc::new(Signal::default());
    shared.lock().signals.insert(id, signal.clone());
    let (rd, wr) = tokio::io::split(stream);
    let (control, control_rx) = mpsc::channel(CONTROL_QUEUE);
    let writer = tokio::spawn(write_loop(
        shared.clone(),
        id,
        wr,
        control_rx,
        signal.clone(),
    ));
    let writer_abort = writer.abort_handle();
    let mut conn = Connection::new(
        id,
        identity,
        opened.into_std(),
        shared.config.connect_timeout,
        shared.config.max_idle,
        shared.counters.clone(),
    );
    let reason = read_loop(&shared, &mut conn, rd, &control, &signal).await;
    shared.with_state(|s| conn.closed(s, &reason));
    shared.lock().signals.remove(&id);
    drop(control);
    // Let the writer flush what is queued (a refusing CONNACK, the last PUBACKs), but not forever.
    if tokio::time::timeout(CLOSE_GRACE, writer).await.is_err() {
        writer_abort.abort();
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    shared: &Shared,
    conn: &mut Connection,
    mut rd: R,
    control: &mpsc::Sender<Bytes>,
    signal: &Signal,
) -> Close {
    let max = shared.config.max_packet_size;
    // A link starts with a small buffer (a CONNECT and a SUBSCRIBE fit): thousands of quiet subscribers would
    // otherwise each hold kilobytes they never use. A link becomes busy when a read fills its buffer, and then
    // reads into `BUSY_READ` bytes until it goes idle.
    let mut buf = BytesMut::with_capacity(QUIET_READ);
    let mut busy = false;
    // The buffer was released while the link was idle: the next read takes what it needs, not 8 KiB up front.
    let mut idle = false;
    let mut actions = Vec::new();
    loop {
        // Every whole frame in the buffer, then the actions they produced (one store commit for their orders).
        let mut closing = None;
        let mut durable = None;
        loop {
            match read_packet(&mut buf, max) {
                Ok(Some(packet)) => {
                    let now = std::time::Instant::now();
                    let (handled, barrier) =
                        shared.step(|s| conn.handle(s, packet, now, &mut actions));
                    // Acknowledgements wait for every session record made so far, not only this step's: a
                    // repeated QoS 2 PUBLISH, say, makes none but is acknowledged on the strength of earlier ones.
                    durable = barrier.all.or(durable);
                    if let Err(close) = handled {
                        closing = Some(close);
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    closing = Some(conn.handle_decode_error(e, &mut actions));
                    break;
                }
            }
        }
        if !actions.is_empty() {
            if let Err(close) = shared.settle(durable).await {
                return close;
            }
        }
        if let Err(close) = execute(shared, &mut actions, control).await {
            return close;
        }
        if let Some(close) = closing {
            return close;
        }
        if busy && buf.capacity() - buf.len() < 1024 {
            buf.reserve(BUSY_READ);
        }
        let room = buf.capacity() - buf.len();
        let deadline = Instant::from_std(conn.deadline());
        let wake = if idle || !buf.is_empty() {
            deadline
        } else {
            deadline.min(Instant::now() + IDLE_BUFFER_RELEASE)
        };
        tokio::select! {
            read = rd.read_buf(&mut buf) => match read {
                Ok(0) => return Close::Eof,
                Ok(n) => {
                    // Busy from the first read that fills the buffer until the link goes idle.
                    busy |= n >= room;
                    idle = false;
                }
                Err(e) => return Close::Lost(e.to_string()),
            },
            _ = tokio::time::sleep_until(wake) => {
                if let Some(close) = conn.handle_timeout(std::time::Instant::now()) {
                    return close;
                }
                if buf.is_empty() {
                    buf = BytesMut::new();
                    idle = true;
                    busy = false;
                }
            }
            _ = signal.kick.notified() => return Close::TakenOver,
            // The writer gave up on a client that stopped reading.
            _ = control.closed() => return Close::Lost("write stalled".into()),
        }
    }
}

/// Carry out actions in order: orders are gathered and committed together before the next control packet, and
/// their PUBACKs follow the commit.
async fn execute(
    shared: &Shared,
    actions: &mut Vec<Action>,
    control: &mpsc::Sender<Bytes>,
) -> Result<(), Close> {
    if actions.is_empty() {
        return Ok(());
    }
    let mut out = BytesMut::new();
    let mut orders = Vec::new();
    let mut acks = Vec::new();
    for action in actions.drain(..) {
        match action {
            Action::Commit { order, ack } => {
                orders.push(order);
                acks.extend(ack);
            }
            Action::Send(packet) => {
                commit(shared, &mut orders, &mut acks, &mut out).await?;
                encode(&packet, &mut out);
            }
        }
    }
    commit(shared, &mut orders, &mut acks, &mut out).await?;
    if !out.is_empty() {
        control
            .send(out.freeze())
            .await
            .map_err(|_| Close::Lost("writer stopped".into()))?;
    }
    Ok(())
}

async fn commit(
    shared: &Shared,
    orders: &mut Vec<transport_core::Order>,
    acks: &mut Vec<Packet>,
    out: &mut BytesMut,
) -> Result<(), Close> {
    if orders.is_empty() {
        return Ok(());
    }
    // A failed commit sends no PUBACK: the client will send the orders again, to this server or a restarted one.
    shared
        .store
        .commit(std::mem::take(orders))
        .await
        .map_err(|e| Close::Lost(format!("store: {e}")))?;
    for ack in acks.drain(..) {
        encode(&ack, out);
    }
    Ok(())
}

fn encode(packet: &Packet, out: &mut BytesMut) {
    // Control packets the broker builds are always encodable.
    let _ = packet.encode(out);
}

async fn write_loop<W: AsyncWrite + Unpin>(
    shared: Arc<Shared>,
    id: ConnId,
    mut wr: W,
    mut control: mpsc::Receiver<Bytes>,
    signal: Arc<Signal>,
) {
    let batch = shared.config.write_batch;
    let stall = shared.config.write_timeout;
    let mut buf = BytesMut::new();
    let mut carried: Option<Bytes> = None;
    let mut connack_written = false;
    let mut open = true;
    loop {
        buf.clear();
        if let Some(chunk) = carried.take() {
            buf.extend_from_slice(&chunk);
        }
        loop {
            match control.try_recv() {
                Ok(chunk) => buf.extend_from_slice(&chunk),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let has_control = !buf.is_empty();
        if connack_written || has_control {
            let (_, barrier) = shared.step(|s| s.poll_transmit(id, &mut buf, batch));
            // Deliveries go out only once their in-flight records are on disk.
            if shared.settle(barrier.own).await.is_err() {
                return;
            }
        }
        if !buf.is_empty() {
            let write = async { wr.write_all(&buf).await.and(wr.flush().await) };
            // A client that stops reading would otherwise hold this task, and its session, for ever.
            if !matches!(tokio::time::timeout(stall, write).await, Ok(Ok(()))) {
                return;
            }
            connack_written |= has_control;
            continue;
        }
        if !open {
            break;
        }
        // Nothing to write: an idle link holds no write buffer (the next burst allocates what it needs).
        buf = BytesMut::new();
        tokio::select! {
            chunk = control.recv() => match chunk {
                Some(chunk) => carried = Some(chunk),
                None => open = false,
            },
            _ = signal.deliver.notified() => {}
        }
    }
    let _ = tokio::time::timeout(CLOSE_GRACE, wr.shutdown()).await;
}
