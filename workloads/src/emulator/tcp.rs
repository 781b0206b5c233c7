//! The TCP relay: accepts a client's connection, connects to the server after the emulated handshake, and relays
//! the bytes of each direction as timed chunks.
//!
//! A connection has two sides (the client's socket and the upstream socket) and two directions. Each direction
//! ([`Half`]) reads chunks from its source side, queues each with its due time (never before the previous chunk,
//! so bytes stay in order), and writes them to its destination side when due. A chunk the destination cannot take
//! yet (handshake not done, or its send buffer full) waits in the direction's backlog, flushed when the destination
//! becomes writable. At most [`WINDOW`] bytes per direction are read and not yet written; beyond that the emulator
//! stops reading, so the sender feels the receiver's flow control as it would end to end.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr};
use std::sync::Arc;

use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Poll, Registry, Token};

use super::clock;
use super::driver::{Relay, Worker};
use super::link::{Fate, LinkModel};
use super::queue::Queue;
use super::stats::{Direction, Shared};
use super::sys::{self, Nanos};
use super::{LinkConfig, LinkMeasurement};
use transport_core::net::fast_open;

/// Token of the listening socket; side `s` of connection `id` has token `id << 1 | s` (ids start at 1).
const LISTENER: Token = Token(0);
/// Bytes asked for per read.
const CHUNK: usize = 64 * 1024;
/// Reads (or accepts) from one socket before the others get their turn.
const READ_BUDGET: usize = 16;
/// Bytes per direction read but not yet written, above which reading pauses.
const WINDOW: usize = 4 << 20;

/// The client's side of a connection, index into [`Conn::sides`]; also the source of [`Direction::ToServer`].
const CLIENT: usize = 0;
/// The server's side; the source of [`Direction::ToClient`].
const SERVER: usize = 1;

/// A TCP link emulator: connections to [`addr`](Self::addr) are relayed to `upstream`, every chunk of bytes one-way
/// delay later, in order, with half-close and reset passed on.
///
/// The emulator terminates the client's TCP connection itself, so the client's `connect` returns at once; to keep
/// the handshake's round trip in the timeline, the emulator connects to the server only after the 1.5 round trips
/// a handshake over the emulated link would take (SYN, SYN-ACK, ACK), and holds the client's first bytes until
/// then. A client that sends at once therefore sees its first answer after 2 round trips plus the server's time,
/// as over a real link. Where the kernel lets servers take data in a SYN (TCP Fast Open, `net.ipv4.tcp_fastopen`
/// bit 2), the listener takes it without a cookie; a connection whose SYN brought data reaches the server half a
/// round trip in, with its data. Each connection holds two file descriptors.
pub struct TcpEmulator {
    addr: SocketAddr,
    pub(super) shared: Arc<Shared>,
    _worker: Worker,
}

impl TcpEmulator {
    /// Starts an emulator listening on an ephemeral port of 127.0.0.1, relaying to `upstream`.
    pub fn start(upstream: SocketAddr, config: LinkConfig) -> io::Result<Self> {
        Self::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), upstream, config)
    }

    /// Starts an emulator listening on `listen` (port 0 for an ephemeral one), relaying to `upstream`.
    pub fn start_on(
        listen: SocketAddr,
        upstream: SocketAddr,
        config: LinkConfig,
    ) -> io::Result<Self> {
        config.validate()?;
        let poll = Poll::new()?;
        let mut listener = TcpListener::bind(listen)?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        // Data in a SYN is taken where the kernel allows servers to (TCP Fast Open, no cookie asked): a client
        // that sends it is then modelled with it (see `accept`); other clients are not affected.
        let _ = fast_open::server(&listener, 1024);
        let addr = listener.local_addr()?;
        let link = LinkModel::new(&config);
        let shared = Arc::new(Shared::new(link.one_way_delay())?);
        let relay = TcpRelay {
            registry: poll.registry().try_clone()?,
            listener,
            upstream,
            conns: HashMap::new(),
            next_id: 1,
            links: [link.clone(), link],
            shared: Arc::clone(&shared),
            buf: vec![0; CHUNK].into_boxed_slice(),
            more: VecDeque::new(),
        };
        let worker = Worker::spawn("tcp-emulator", poll, relay)?;
        Ok(Self {
            addr,
            shared,
            _worker: worker,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The delay added so far in each direction, against the setting.
    pub fn measured(&self) -> LinkMeasurement {
        self.shared.measurement()
    }
}

impl std::fmt::Debug for TcpEmulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpEmulator")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Something that happens to a connection at a due time.
pub(crate) enum Item {
    /// The emulated handshake has reached the server: connect to it.
    Connect { conn: u64 },
    /// Bytes read from the source side of `direction`.
    Chunk {
        conn: u64,
        direction: Direction,
        received: Nanos,
        data: Vec<u8>,
    },
    /// The source side of `direction` sent FIN: shut the destination side down for writing.
    Fin { conn: u64, direction: Direction },
    /// A peer reset the connection or went away: reset the other peer.
    Reset { conn: u64, side: usize },
}

/// One direction of a connection.
#[derive(Default)]
struct Half {
    /// Due time of the last chunk or FIN queued, so nothing is scheduled before it.
    last_due: Nanos,
    /// Bytes read from the source, not yet written to the destination.
    in_flight: usize,
    /// Chunks that are due but the destination could not take yet, in order.
    backlog: VecDeque<Pending>,
    /// The source has ended (FIN or error): nothing more to read.
    ended: bool,
    /// Reading is paused: `in_flight` reached [`WINDOW`].
    paused: bool,
    /// The FIN is due but waits behind the backlog.
    fin_due: bool,
    /// The destination has been shut down for writing.
    fin_sent: bool,
}

struct Pending {
    data: Vec<u8>,
    written: usize,
}

struct Conn {
    /// The client's socket and, once the emulated handshake is done, the upstream socket.
    sides: [Option<TcpStream>; 2],
    /// Whether each side can be written to (the upstream connect has completed).
    connected: [bool; 2],
    /// Indexed by [`Direction`].
    halves: [Half; 2],
    /// A reset is queued: read nothing more.
    resetting: bool,
}

struct TcpRelay {
    registry: Registry,
    listener: TcpListener,
    upstream: SocketAddr,
    conns: HashMap<u64, Conn>,
    next_id: u64,
    /// The link model of each direction, indexed by [`Direction`].
    links: [LinkModel; 2],
    shared: Arc<Shared>,
    buf: Box<[u8]>,
    /// Sockets (or the listener) whose read budget ran out while they still had data.
    more: VecDeque<Token>,
}

fn token(conn: u64, side: usize) -> Token {
    Token((conn as usize) << 1 | side)
}

/// The direction whose source is `side`.
fn from_side(side: usize) -> Direction {
    if side == CLIENT {
        Direction::ToServer
    } else {
        Direction::ToClient
    }
}

/// The side a direction writes to.
fn destination(direction: Direction) -> usize {
    match direction {
        Direction::ToServer => SERVER,
        Direction::ToClient => CLIENT,
    }
}

/// Writes as much of `data` as the socket takes now.
fn write_some(stream: &TcpStream, data: &[u8]) -> io::Result<usize> {
    let mut written = 0;
    let mut stream = stream;
    while written < data.len() {
        match stream.write(&data[written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(written)
}

impl TcpRelay {
    /// The due time of a packet in `direction` received at `received`, never before the previous one.
    fn due(&mut self, conn: u64, direction: Direction, received: Nanos, bytes: usize) -> Nanos {
        let Fate::Deliver { at } = self.links[direction as usize].schedule(received, bytes);
        match self.conns.get_mut(&conn) {
            Some(c) => {
                let half = &mut c.halves[direction as usize];
                half.last_due = half.last_due.max(at);
                half.last_due
            }
            None => at,
        }
    }

    fn accept(&mut self, queue: &mut Queue<Item>) {
        for _ in 0..READ_BUDGET {
            let mut stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                // Out of descriptors, or the connection was reset in the backlog: the next connection retries.
                Err(_) => {
                    self.shared.flow_failed();
                    return;
                }
            };
            let accepted = clock::now();
            let id = self.next_id;
            self.next_id += 1;
            let _ = stream.set_nodelay(true);
            if sys::enable_receive_timestamps(&stream).is_err()
                || self
                    .registry
                    .register(
                        &mut stream,
                        token(id, CLIENT),
                        Interest::READABLE | Interest::WRITABLE,
                    )
                    .is_err()
            {
                self.shared.flow_failed();
                continue;
            }
            self.shared.flow_opened();
            let syn_data = fast_open::syn_data(&stream).unwrap_or(false);
            if syn_data {
                self.shared.flow_fast_open();
            }
            self.conns.insert(
                id,
                Conn {
                    sides: [Some(stream), None],
                    connected: [true, false],
                    halves: Default::default(),
                    resetting: false,
                },
            );
            // SYN to the server, SYN-ACK back, ACK to the server: then the server's accept returns. A SYN with
            // data (TCP Fast Open) hands its data to the server as it arrives, half a round trip in.
            let Fate::Deliver { at: syn } =
                self.links[Direction::ToServer as usize].schedule(accepted, 0);
            let Fate::Deliver { at: syn_ack } =
                self.links[Direction::ToClient as usize].schedule(syn, 0);
            let Fate::Deliver { at: ack } =
                self.links[Direction::ToServer as usize].schedule(syn_ack, 0);
            queue.push(if syn_data { syn } else { ack }, Item::Connect { conn: id });
        }
        self.more.push_back(LISTENER);
    }

    fn connect(&mut self, id: u64) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.resetting {
            return;
        }
        let connected = TcpStream::connect(self.upstream).and_then(|mut stream| {
            self.registry.register(
                &mut stream,
                token(id, SERVER),
                Interest::READABLE | Interest::WRITABLE,
            )?;
            Ok(stream)
        });
        match connected {
            Ok(stream) => conn.sides[SERVER] = Some(stream),
            Err(_) => self.refused(id),
        }
    }

    /// The upstream socket reported an event before its connect completed: see whether it has.
    fn check_connected(&mut self, id: u64, queue: &mut Queue<Item>) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let Some(stream) = conn.sides[SERVER].as_ref() else {
            return;
        };
        match stream.take_error() {
            Ok(None) => {}
            Ok(Some(_)) | Err(_) => return self.refused(id),
        }
        match stream.peer_addr() {
            Ok(_) => {
                let _ = stream.set_nodelay(true);
                if sys::enable_receive_timestamps(stream).is_err() {
                    return self.refused(id);
                }
                conn.connected[SERVER] = true;
                self.more.push_back(token(id, SERVER));
                self.flush(id, Direction::ToServer, queue);
            }
            Err(error) if error.kind() == io::ErrorKind::NotConnected => {}
            Err(_) => self.refused(id),
        }
    }

    /// The server could not be reached: reset the client, as the server's RST would.
    fn refused(&mut self, id: u64) {
        self.shared.flow_failed();
        self.close(id, Some(CLIENT));
    }

    /// Removes a connection, closing both sockets; `reset` sends a reset to that side instead of a FIN.
    fn close(&mut self, id: u64, reset: Option<usize>) {
        let Some(mut conn) = self.conns.remove(&id) else {
            return;
        };
        for (side, stream) in conn.sides.iter_mut().enumerate() {
            if let Some(stream) = stream {
                if reset == Some(side) {
                    let _ = sys::set_linger_zero(stream);
                }
                let _ = self.registry.deregister(stream);
            }
        }
    }

    /// Reads chunks from `side` of a connection and queues them.
    fn read(&mut self, id: u64, side: usize, queue: &mut Queue<Item>) {
        let direction = from_side(side);
        for _ in 0..READ_BUDGET {
            let Some(conn) = self.conns.get_mut(&id) else {
                return;
            };
            let half = &conn.halves[direction as usize];
            if conn.resetting || !conn.connected[side] || half.ended || half.paused {
                return;
            }
            let Some(stream) = conn.sides[side].as_ref() else {
                return;
            };
            match sys::recv_timestamped(stream, &mut self.buf) {
                Ok(received) if received.len == 0 => {
                    conn.halves[direction as usize].ended = true;
                    let at = clock::received_at(received.kernel_time);
                    let due = self.due(id, direction, at, 0);
                    queue.push(
                        due,
                        Item::Fin {
                            conn: id,
                            direction,
                        },
                    );
                    return;
                }
                Ok(received) => {
                    let half = &mut conn.halves[direction as usize];
                    half.in_flight += received.len;
                    half.paused = half.in_flight >= WINDOW;
                    let data = self.buf[..received.len].to_vec();
                    let at = clock::received_at(received.kernel_time);
                    let due = self.due(id, direction, at, data.len());
                    queue.push(
                        due,
                        Item::Chunk {
                            conn: id,
                            direction,
                            received: at,
                            data,
                        },
                    );
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    // Reset by the peer: pass the reset on after what was already read.
                    let other = destination(direction);
                    self.reset_later(id, direction, other, queue);
                    return;
                }
            }
        }
        self.more.push_back(token(id, side));
    }

    /// Queues a reset of `side`, travelling in `direction`, after everything queued in that direction.
    fn reset_later(&mut self, id: u64, direction: Direction, side: usize, queue: &mut Queue<Item>) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.resetting {
            return;
        }
        conn.resetting = true;
        let due = self.due(id, direction, clock::now(), 0);
        queue.push(due, Item::Reset { conn: id, side });
    }

    fn chunk(
        &mut self,
        id: u64,
        direction: Direction,
        received: Nanos,
        data: Vec<u8>,
        queue: &mut Queue<Item>,
    ) {
        let Some(conn) = self.conns.get_mut(&id) else {
            self.shared.lock()[direction as usize].dropped += 1;
            return;
        };
        let to = destination(direction);
        let half = &mut conn.halves[direction as usize];
        let stream = conn.sides[to]
            .as_ref()
            .filter(|_| conn.connected[to] && half.backlog.is_empty());
        let Some(stream) = stream else {
            half.backlog.push_back(Pending { data, written: 0 });
            return;
        };
        match write_some(stream, &data) {
            Ok(written) if written == data.len() => {
                let sent = clock::now();
                self.shared.lock()[direction as usize].delivered(received, sent);
                self.written(id, direction, written);
            }
            Ok(written) => {
                half.backlog.push_back(Pending { data, written });
                self.written(id, direction, written);
            }
            Err(_) => self.write_failed(id, direction, queue),
        }
    }

    /// The destination of `direction` refused a write (its peer is gone): the source's peer gets a reset one
    /// one-way delay later, as the RST would travel back.
    fn write_failed(&mut self, id: u64, direction: Direction, queue: &mut Queue<Item>) {
        self.shared.lock()[direction as usize].dropped += 1;
        let back = match direction {
            Direction::ToServer => Direction::ToClient,
            Direction::ToClient => Direction::ToServer,
        };
        self.reset_later(id, back, destination(back), queue);
    }

    /// Bytes of `direction` handed to the kernel: resume reading the source if it was paused.
    fn written(&mut self, id: u64, direction: Direction, bytes: usize) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let half = &mut conn.halves[direction as usize];
        half.in_flight = half.in_flight.saturating_sub(bytes);
        if half.paused && half.in_flight < WINDOW / 2 {
            half.paused = false;
            let source = destination(direction) ^ 1;
            self.more.push_back(token(id, source));
        }
    }

    /// Writes the backlog of `direction` as far as the destination takes it, then a FIN that waited behind it.
    fn flush(&mut self, id: u64, direction: Direction, queue: &mut Queue<Item>) {
        let to = destination(direction);
        let mut total = 0;
        let mut failed = false;
        if let Some(conn) = self.conns.get_mut(&id) {
            let half = &mut conn.halves[direction as usize];
            let Some(stream) = conn.sides[to].as_ref().filter(|_| conn.connected[to]) else {
                return;
            };
            while let Some(pending) = half.backlog.front_mut() {
                match write_some(stream, &pending.data[pending.written..]) {
                    Ok(written) => {
                        pending.written += written;
                        total += written;
                        if pending.written < pending.data.len() {
                            break;
                        }
                        half.backlog.pop_front();
                        self.shared.lock()[direction as usize].held += 1;
                    }
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            if half.backlog.is_empty() && half.fin_due {
                half.fin_due = false;
                half.fin_sent = true;
                let _ = stream.shutdown(Shutdown::Write);
            }
        }
        self.written(id, direction, total);
        if failed {
            return self.write_failed(id, direction, queue);
        }
        self.close_if_done(id);
    }

    fn fin(&mut self, id: u64, direction: Direction) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let to = destination(direction);
        let half = &mut conn.halves[direction as usize];
        match conn.sides[to]
            .as_ref()
            .filter(|_| conn.connected[to] && half.backlog.is_empty())
        {
            Some(stream) => {
                half.fin_sent = true;
                let _ = stream.shutdown(Shutdown::Write);
                self.close_if_done(id);
            }
            None => half.fin_due = true,
        }
    }

    /// Closes a connection whose both directions have ended and been passed on.
    fn close_if_done(&mut self, id: u64) {
        if let Some(conn) = self.conns.get(&id) {
            if conn.halves.iter().all(|half| half.fin_sent) {
                self.close(id, None);
            }
        }
    }
}

impl Relay for TcpRelay {
    type Item = Item;

    fn ready(&mut self, event: &Event, queue: &mut Queue<Item>) {
        if event.token() == LISTENER {
            return self.accept(queue);
        }
        let id = (event.token().0 >> 1) as u64;
        let side = event.token().0 & 1;
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        if side == SERVER && !conn.connected[SERVER] {
            return self.check_connected(id, queue);
        }
        if event.is_writable() || event.is_write_closed() || event.is_error() {
            self.flush(id, from_side(side ^ 1), queue);
        }
        if event.is_readable() || event.is_read_closed() || event.is_error() {
            self.read(id, side, queue);
        }
    }

    fn has_more(&self) -> bool {
        !self.more.is_empty()
    }

    fn read_more(&mut self, queue: &mut Queue<Item>) {
        for _ in 0..self.more.len() {
            match self.more.pop_front() {
                Some(LISTENER) => self.accept(queue),
                Some(Token(t)) => self.read((t >> 1) as u64, t & 1, queue),
                None => break,
            }
        }
    }

    fn deliver(&mut self, item: Item, queue: &mut Queue<Item>) {
        match item {
            Item::Connect { conn } => self.connect(conn),
            Item::Chunk {
                conn,
                direction,
                received,
                data,
            } => self.chunk(conn, direction, received, data, queue),
            Item::Fin { conn, direction } => self.fin(conn, direction),
            Item::Reset { conn, side } => self.close(conn, Some(side)),
        }
    }
}
