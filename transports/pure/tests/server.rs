//! The receiver's UDP server in this process, with real sockets and the real store, under hostile datagrams:
//! answers that cannot be sent (spoofed sources), sessions taken over. The devices are sans-IO senders driven here
//! over their own UDP sockets.

use rand::rngs::StdRng;
use rand::SeedableRng;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;
use transport_core::{Counters, Order, OrderId, TransportError};
use transport_pure::crypto::{put_record, WireKeys};
use transport_pure::sender::{Sender, SenderEvent};
use transport_pure::wire::{self, Kind, Op};
use transport_store::{self as store, Store, StoreHandle, SyncPolicy};

mod common;
use common::Keys;

struct Server {
    addr: SocketAddr,
    counters: Arc<Counters>,
    task: tokio::task::JoinHandle<Result<(), TransportError>>,
}

async fn start(kind: Kind, keys: &Keys, store_dir: &Path) -> Server {
    let (store, _) = Store::open(store_dir, SyncPolicy::None).unwrap();
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let counters = Arc::new(Counters::default());
    let receiver = keys.receiver(kind, 7, 1024, &counters);
    let task = tokio::spawn(transport_pure::server::run(
        socket,
        receiver,
        std::sync::Arc::new(StoreHandle::spawn(store)),
    ));
    Server {
        addr,
        counters,
        task,
    }
}

/// A device over its own UDP socket.
struct Device {
    socket: UdpSocket,
    sender: Sender,
    run: u64,
    seq: u64,
}

impl Device {
    async fn new(keys: &Keys, kind: Kind, i: usize, run: u64) -> Device {
        Device {
            socket: UdpSocket::bind("127.0.0.1:0").await.unwrap(),
            sender: keys.sender(kind, i, run, &Arc::new(Counters::default())),
            run,
            seq: 0,
        }
    }

    /// Seal the next order into a datagram, unsent: its id and the datagram.
    fn seal_next(&mut self, sender_id: u64) -> (OrderId, Vec<u8>) {
        let id = OrderId {
            sender: sender_id,
            run: self.run,
            seq: self.seq,
        };
        self.seq += 1;
        let now = Instant::now();
        self.sender.push(
            now,
            Order {
                id,
                made_us: 1,
                payload: vec![3; 32],
            },
        );
        let mut out = Vec::new();
        assert!(self.sender.poll_transmit(now, &mut out));
        (id, out)
    }

    /// Send the next order and wait (up to 5 s) for the server to say it is stored. Returns the datagram sent.
    async fn store_one(&mut self, sender_id: u64, server: SocketAddr) -> (OrderId, Vec<u8>) {
        let (id, out) = self.seal_next(sender_id);
        self.socket.send_to(&out, server).await.unwrap();
        let mut buf = vec![0u8; 2048];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let Ok(Ok((n, _))) =
                tokio::time::timeout_at(deadline, self.socket.recv_from(&mut buf)).await
            else {
                panic!("order {id} not answered: is the server still up?");
            };
            self.sender.handle(Instant::now(), &buf[..n]);
            if self.sender.poll_event() == Some(SenderEvent::Stored(id)) {
                return (id, out);
            }
        }
    }
}

/// Send `payload` as a UDP datagram from a source address of our choosing, through a raw IPv4 socket (the kernel
/// fills in the IP checksum and length; a UDP checksum of 0 means none).
fn send_spoofed(from: SocketAddrV4, to: SocketAddrV4, payload: &[u8]) -> std::io::Result<()> {
    let udp_len = 8 + payload.len();
    let mut packet = Vec::with_capacity(20 + udp_len);
    packet.extend_from_slice(&[0x45, 0]);
    packet.extend_from_slice(&((20 + udp_len) as u16).to_be_bytes());
    packet.extend_from_slice(&[0, 0, 0, 0, 64, libc::IPPROTO_UDP as u8, 0, 0]);
    packet.extend_from_slice(&from.ip().octets());
    packet.extend_from_slice(&to.ip().octets());
    packet.extend_from_slice(&from.port().to_be_bytes());
    packet.extend_from_slice(&to.port().to_be_bytes());
    packet.extend_from_slice(&(udp_len as u16).to_be_bytes());
    packet.extend_from_slice(&[0, 0]);
    packet.extend_from_slice(payload);
    // SAFETY: plain socket calls on a descriptor we own and close.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(to.ip().octets()),
            },
            sin_zero: [0; 8],
        };
        let n = libc::sendto(
            fd,
            packet.as_ptr().cast(),
            packet.len(),
            0,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if n < 0 {
            return Err(err);
        }
    }
    Ok(())
}

fn can_open_raw_sockets() -> bool {
    // SAFETY: as in `send_spoofed`.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW);
        if fd >= 0 {
            libc::close(fd);
        }
        fd >= 0
    }
}

/// Bring the loopback interface of a new network namespace up (SIOCSIFFLAGS), as `ip link set lo up` does.
fn loopback_up() {
    // SAFETY: an ioctl on a socket we own with a zeroed, correctly sized ifreq.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        assert!(fd >= 0);
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (d, s) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
            *d = *s as libc::c_char;
        }
        assert_eq!(libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr), 0);
        ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        assert_eq!(
            libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr),
            0,
            "{}",
            std::io::Error::last_os_error()
        );
        libc::close(fd);
    }
}

const IN_NAMESPACE: &str = "PURE_TEST_IN_NETNS";

/// Spoofing a source needs a raw socket (CAP_NET_RAW). Without it, this test runs itself again in a new user and
/// network namespace (`unshare --user --map-root-user --net`), where it has one, and checks that run's result.
/// Returns whether the caller should run the test here.
fn here_with_raw_sockets(test: &str) -> bool {
    if std::env::var_os(IN_NAMESPACE).is_some() {
        loopback_up();
        return true;
    }
    if can_open_raw_sockets() {
        return true;
    }
    let status = std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "--"])
        .arg(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(IN_NAMESPACE, "1")
        .status()
        .expect("this test needs CAP_NET_RAW or `unshare` with user namespaces");
    assert!(status.success(), "{test} in a network namespace: {status}");
    false
}

#[tokio::test]
async fn answers_that_cannot_be_sent_are_counted_and_the_server_goes_on() {
    if !here_with_raw_sockets("answers_that_cannot_be_sent_are_counted_and_the_server_goes_on") {
        return;
    }
    for kind in [
        Kind::Plain,
        Kind::HpkeSession,
        Kind::HpkePerRequest,
        Kind::Link,
    ] {
        let keys = Keys::new(1, &mut StdRng::seed_from_u64(31));
        let dir = tempfile::tempdir().unwrap();
        let server = start(kind, &keys, dir.path()).await;
        let SocketAddr::V4(to) = server.addr else {
            unreachable!()
        };
        let mut device = Device::new(&keys, kind, 0, 5).await;
        let (_, record) = device.store_one(0, server.addr).await;
        // The device's record again, from sources the server cannot answer: port 0 (EINVAL) and the broadcast
        // address (EACCES without SO_BROADCAST). The record opens, so an answer is made, and its send fails.
        let spoofed = [
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0),
            SocketAddrV4::new(Ipv4Addr::BROADCAST, 9),
        ];
        for from in spoofed {
            send_spoofed(from, to, &record).unwrap();
        }
        // The server is still up and serving the device.
        for _ in 0..3 {
            device.store_one(0, server.addr).await;
        }
        assert!(!server.task.is_finished(), "{kind:?}");
        let c = server.counters.snapshot();
        assert_eq!(c.send_errors, 2, "{kind:?}: {c:?}");
        assert_eq!(c.received, 6, "{kind:?}");
        server.task.abort();
    }
}

#[tokio::test]
async fn an_allowed_device_cannot_store_orders_as_another_through_its_session() {
    let mut rng = StdRng::seed_from_u64(32);
    let keys = Keys::new(2, &mut rng);
    let dir = tempfile::tempdir().unwrap();
    let server = start(Kind::HpkeSession, &keys, dir.path()).await;
    let mut victim = Device::new(&keys, Kind::HpkeSession, 0, 5).await;
    let (first, _) = victim.store_one(0, server.addr).await;
    let mut made = vec![first];
    // The attacker (allowed device 1) sets up a session of its own, opens it with one honest record, then seals
    // records under it that name the victim, the victim's run and new numbers; one datagram each, in order.
    let (enc, session) = WireKeys::hpke_sender(&mut rng, &keys.devices[1], keys.node.public());
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for (key_id, sender, seq) in [
        (keys.devices[1].key_id(), 1, 1000),
        (keys.devices[0].key_id(), 0, 1001),
        (keys.devices[0].key_id(), 0, 1002),
    ] {
        let mut frame = Vec::new();
        let head = wire::Head {
            kind: Kind::HpkeSession,
            op: Op::Order,
            key_id: &key_id,
            run: 5,
            number: seq,
            variant: &enc,
        };
        put_record(
            &mut frame,
            &head,
            Some(&session),
            &1u64.to_be_bytes(),
            &[9; 8],
        );
        if sender == 1 {
            made.push(OrderId {
                sender,
                run: 5,
                seq,
            });
        }
        socket.send_to(&frame, server.addr).await.unwrap();
    }
    // The victim goes on; once its order is answered, everything sent before it was committed or refused.
    let (next, _) = victim.store_one(0, server.addr).await;
    made.push(next);
    let audit = store::audit(dir.path(), &made, &[]).unwrap();
    assert_eq!(
        audit.unknown, 0,
        "orders the victim never made were applied: {audit:?}"
    );
    assert_eq!(audit.applied, made.len() as u64, "{audit:?}");
    assert_eq!(server.counters.snapshot().refused_forged, 2);
    server.task.abort();
}

/// A run of datagrams sent in one segmented send, which the server may read in one call (receive offload): each
/// datagram in it is judged alone. Garbage between two honest records is refused as malformed and the records
/// around it are stored; a run of datagrams over the maximum is refused datagram by datagram; the server goes on.
#[tokio::test]
async fn each_datagram_of_a_coalesced_run_is_judged_alone() {
    let mut rng = StdRng::seed_from_u64(33);
    let keys = Keys::new(1, &mut rng);
    let dir = tempfile::tempdir().unwrap();
    let server = start(Kind::Plain, &keys, dir.path()).await;
    let mut device = Device::new(&keys, Kind::Plain, 0, 9).await;
    device.socket.connect(server.addr).await.unwrap();
    let mut made = Vec::new();
    let mut run = Vec::new();
    for seq in 0..2 {
        let (id, out) = device.seal_next(0);
        made.push(id);
        if seq == 1 {
            run.extend(std::iter::repeat_n(0xee, out.len()));
        }
        run.extend(out);
    }
    let segment = run.len() / 3;
    let over = vec![0u8; 2 * (wire::MAX_DATAGRAM + 100)];
    for (data, segment) in [(&run, segment), (&over, wire::MAX_DATAGRAM + 100)] {
        if let Err(e) = transport_core::net::send_segments(&device.socket, data, segment) {
            assert!(transport_core::net::is_segmentation_unsupported(&e), "{e}");
            for d in data.chunks(segment) {
                device.socket.send(d).await.unwrap();
            }
        }
    }
    // A second run of the device (its own socket and events): once its order is answered, the run above was
    // committed or refused.
    let mut later = Device::new(&keys, Kind::Plain, 0, 10).await;
    let (next, _) = later.store_one(0, server.addr).await;
    made.push(next);
    let audit = store::audit(dir.path(), &made, &[]).unwrap();
    assert_eq!((audit.applied, audit.unknown), (3, 0), "{audit:?}");
    let counters = server.counters.snapshot();
    assert_eq!(counters.refused_malformed, 1);
    assert_eq!(counters.refused_oversized, 2);
    server.task.abort();
}

/// A store that holds each commit until the test lets it through, and says how large each group was.
struct GatedStore {
    inner: StoreHandle,
    groups: tokio::sync::mpsc::UnboundedSender<usize>,
    gate: Arc<tokio::sync::Semaphore>,
}

impl transport_core::commit::OrderStore for GatedStore {
    fn commit(
        &self,
        orders: Vec<Order>,
    ) -> transport_core::BoxFuture<
        'static,
        Result<Vec<transport_core::commit::Outcome>, transport_core::commit::CommitError>,
    > {
        let (inner, gate) = (self.inner.clone(), self.gate.clone());
        let _ = self.groups.send(orders.len());
        Box::pin(async move {
            gate.acquire().await.unwrap().forget();
            Ok(inner.commit(orders).await?)
        })
    }
}

#[tokio::test]
async fn the_server_reads_the_next_group_while_one_commits_and_answers_only_what_is_durable() {
    let keys = Keys::new(1, &mut StdRng::seed_from_u64(33));
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), SyncPolicy::Batch).unwrap();
    let (groups_tx, mut groups) = tokio::sync::mpsc::unbounded_channel();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let counters = Arc::new(Counters::default());
    let receiver = keys.receiver(Kind::HpkeSession, 7, 1024, &counters);
    let task = tokio::spawn(transport_pure::server::run(
        socket,
        receiver,
        Arc::new(GatedStore {
            inner: StoreHandle::spawn(store),
            groups: groups_tx,
            gate: gate.clone(),
        }),
    ));
    let mut device = Device::new(&keys, Kind::HpkeSession, 0, 5).await;
    let mut send = |seqs: std::ops::Range<u64>| {
        let now = Instant::now();
        for seq in seqs {
            let id = OrderId {
                sender: 0,
                run: 5,
                seq,
            };
            device.sender.push(
                now,
                Order {
                    id,
                    made_us: 1,
                    payload: vec![1; 16],
                },
            );
        }
        let mut datagrams = Vec::new();
        let mut out = Vec::new();
        while device.sender.poll_transmit(now, &mut out) {
            datagrams.push(out.clone());
        }
        datagrams
    };
    let wait = Duration::from_secs(5);
    let first = send(0..10);
    for d in &first {
        device.socket.send_to(d, addr).await.unwrap();
    }
    assert_eq!(
        tokio::time::timeout(wait, groups.recv()).await.unwrap(),
        Some(10)
    );
    // The first group is committing (held at the gate); ten more orders arrive meanwhile.
    for d in &send(10..20) {
        device.socket.send_to(d, addr).await.unwrap();
    }
    let mut buf = vec![0u8; 2048];
    let quiet = tokio::time::timeout(
        Duration::from_millis(300),
        device.socket.recv_from(&mut buf),
    );
    assert!(
        quiet.await.is_err(),
        "an answer came before its group was durable"
    );
    // The server read them while it waited: they are received and opened, and wait for the next group.
    assert_eq!(counters.snapshot().received, 20);
    gate.add_permits(1);
    // The first group is answered; the second, all ten orders read during the first commit, commits as one.
    assert_eq!(
        tokio::time::timeout(wait, groups.recv()).await.unwrap(),
        Some(10)
    );
    let mut stored = Vec::new();
    gate.add_permits(1);
    while stored.len() < 20 {
        let (n, _) = tokio::time::timeout(wait, device.socket.recv_from(&mut buf))
            .await
            .expect("every order answered")
            .unwrap();
        device.sender.handle(Instant::now(), &buf[..n]);
        while let Some(SenderEvent::Stored(id)) = device.sender.poll_event() {
            stored.push(id.seq);
        }
    }
    stored.sort_unstable();
    assert_eq!(stored, (0..20).collect::<Vec<_>>());
    assert_eq!(store::read_log(dir.path()).unwrap().len(), 20);
    task.abort();
}
