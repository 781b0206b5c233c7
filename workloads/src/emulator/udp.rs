//! The UDP relay: one listening socket for the clients, one upstream socket per client address.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use mio::event::Event;
use mio::net::UdpSocket;
use mio::{Interest, Poll, Registry, Token};

use super::clock;
use super::driver::{Relay, Worker};
use super::link::{Fate, LinkModel};
use super::queue::Queue;
use super::stats::{Direction, Shared};
use super::sys::{self, Nanos};
use super::{LinkConfig, LinkMeasurement};

/// Token of the listening socket; flow `i` has token `i + 1`.
const LISTENER: Token = Token(0);
/// Datagrams read from one socket before the others get their turn.
const READ_BUDGET: usize = 64;
/// Socket buffers asked for on the listening socket, which carries every client's traffic.
const LISTENER_BUFFER: usize = 4 << 20;
/// Socket buffers asked for on each upstream socket.
const FLOW_BUFFER: usize = 1 << 20;
/// Larger than any UDP payload.
const MAX_DATAGRAM: usize = 65_536;

/// A UDP link emulator: datagrams sent to [`addr`](Self::addr) reach `upstream` one-way delay later, from a
/// source address of their own per client, and the answers come back the same way.
///
/// Each client address holds one file descriptor for as long as the emulator lives (flows are never expired, so
/// the server never sees a client change address); the process's descriptor limit bounds the number of clients.
pub struct UdpEmulator {
    addr: SocketAddr,
    pub(super) shared: Arc<Shared>,
    _worker: Worker,
}

impl UdpEmulator {
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
        let mut listener = UdpSocket::bind(listen)?;
        sys::enable_receive_timestamps(&listener)?;
        sys::enable_drop_count(&listener)?;
        sys::grow_buffers(&listener, LISTENER_BUFFER);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let addr = listener.local_addr()?;
        let link = LinkModel::new(&config);
        let shared = Arc::new(Shared::new(link.one_way_delay())?);
        let relay = UdpRelay {
            registry: poll.registry().try_clone()?,
            listener,
            listener_drops: 0,
            upstream,
            flows: Vec::new(),
            by_client: HashMap::new(),
            links: [link.clone(), link],
            shared: Arc::clone(&shared),
            buf: vec![0; MAX_DATAGRAM].into_boxed_slice(),
            more: VecDeque::new(),
        };
        let worker = Worker::spawn("udp-emulator", poll, relay)?;
        Ok(Self {
            addr,
            shared,
            _worker: worker,
        })
    }

    /// The address clients send to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The delay added so far in each direction, against the setting.
    pub fn measured(&self) -> LinkMeasurement {
        self.shared.measurement()
    }
}

impl std::fmt::Debug for UdpEmulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpEmulator")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// One client address and the socket that stands for it towards the server.
struct Flow {
    client: SocketAddr,
    upstream: UdpSocket,
    /// The kernel's drop count of `upstream` when last read.
    drops: u32,
}

/// A datagram waiting for its due time.
pub(crate) struct Datagram {
    flow: u32,
    direction: Direction,
    received: Nanos,
    data: Box<[u8]>,
}

struct UdpRelay {
    registry: Registry,
    listener: UdpSocket,
    /// The kernel's drop count of `listener` when last read.
    listener_drops: u32,
    upstream: SocketAddr,
    flows: Vec<Flow>,
    by_client: HashMap<SocketAddr, u32>,
    /// The link model of each direction, indexed by [`Direction`].
    links: [LinkModel; 2],
    shared: Arc<Shared>,
    buf: Box<[u8]>,
    /// Sockets whose read budget ran out while they still had datagrams.
    more: VecDeque<Token>,
}

impl UdpRelay {
    fn read(&mut self, token: Token, queue: &mut Queue<Datagram>) {
        for _ in 0..READ_BUDGET {
            let socket = match token {
                LISTENER => &self.listener,
                Token(i) => match self.flows.get(i - 1) {
                    Some(flow) => &flow.upstream,
                    None => return,
                },
            };
            let received = match sys::recv_timestamped(socket, &mut self.buf) {
                Ok(received) => received,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                // Interrupted, or an ICMP error reported on a connected upstream socket (the server is down, as
                // in the restart workload): the error is consumed, the socket stays in use.
                Err(_) => continue,
            };
            if let Some(drops) = received.kernel_drops {
                self.count_kernel_drops(token, drops);
            }
            let at = clock::received_at(received.kernel_time);
            let data: Box<[u8]> = self.buf[..received.len].into();
            let (flow, direction) = match token {
                LISTENER => {
                    let Some(client) = received.from else {
                        continue;
                    };
                    match self.flow_for(client) {
                        Some(flow) => (flow, Direction::ToServer),
                        None => {
                            self.shared.lock()[Direction::ToServer as usize].dropped += 1;
                            continue;
                        }
                    }
                }
                Token(i) => ((i - 1) as u32, Direction::ToClient),
            };
            match self.links[direction as usize].schedule(at, data.len()) {
                Fate::Deliver { at: due } => queue.push(
                    due,
                    Datagram {
                        flow,
                        direction,
                        received: at,
                        data,
                    },
                ),
            }
        }
        self.more.push_back(token);
    }

    /// Adds datagrams the kernel dropped on a socket since the last read (its receive buffer was full) to the
    /// direction they were travelling in.
    fn count_kernel_drops(&mut self, token: Token, total: u32) {
        let (seen, direction) = match token {
            LISTENER => (&mut self.listener_drops, Direction::ToServer),
            Token(i) => match self.flows.get_mut(i - 1) {
                Some(flow) => (&mut flow.drops, Direction::ToClient),
                None => return,
            },
        };
        let new = total.wrapping_sub(*seen);
        if new > 0 {
            *seen = total;
            self.shared.lock()[direction as usize].dropped += u64::from(new);
        }
    }

    /// The flow of a client address, opened at its first datagram; `None` if no socket could be opened for it.
    fn flow_for(&mut self, client: SocketAddr) -> Option<u32> {
        if let Some(&flow) = self.by_client.get(&client) {
            return Some(flow);
        }
        match self.open_flow(client) {
            Ok(flow) => {
                self.shared.flow_opened();
                Some(flow)
            }
            Err(_) => {
                self.shared.flow_failed();
                None
            }
        }
    }

    fn open_flow(&mut self, client: SocketAddr) -> io::Result<u32> {
        let index = u32::try_from(self.flows.len()).map_err(|_| io::ErrorKind::OutOfMemory)?;
        let local = match self.upstream {
            SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
        };
        let mut upstream = UdpSocket::bind(local)?;
        upstream.connect(self.upstream)?;
        sys::enable_receive_timestamps(&upstream)?;
        sys::enable_drop_count(&upstream)?;
        // A limit, not an allocation: memory is used only while datagrams wait.
        sys::grow_buffers(&upstream, FLOW_BUFFER);
        self.registry
            .register(&mut upstream, Token(index as usize + 1), Interest::READABLE)?;
        self.flows.push(Flow {
            client,
            upstream,
            drops: 0,
        });
        self.by_client.insert(client, index);
        Ok(index)
    }
}

impl Relay for UdpRelay {
    type Item = Datagram;

    fn ready(&mut self, event: &Event, queue: &mut Queue<Datagram>) {
        self.read(event.token(), queue);
    }

    fn has_more(&self) -> bool {
        !self.more.is_empty()
    }

    fn read_more(&mut self, queue: &mut Queue<Datagram>) {
        for _ in 0..self.more.len() {
            if let Some(token) = self.more.pop_front() {
                self.read(token, queue);
            }
        }
    }

    fn deliver(&mut self, datagram: Datagram, _queue: &mut Queue<Datagram>) {
        let Some(flow) = self.flows.get(datagram.flow as usize) else {
            return;
        };
        let result = match datagram.direction {
            Direction::ToServer => flow.upstream.send(&datagram.data),
            Direction::ToClient => self.listener.send_to(&datagram.data, flow.client),
        };
        let sent = clock::now();
        let mut directions = self.shared.lock();
        let recorder = &mut directions[datagram.direction as usize];
        match result {
            Ok(_) => recorder.delivered(datagram.received, sent),
            // A full socket buffer drops the datagram, as a full queue on a real link would.
            Err(_) => recorder.dropped += 1,
        }
    }
}
