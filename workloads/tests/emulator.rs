//! The link emulator over real sockets on 127.0.0.1: accuracy of the added delay (measured by the emulator and
//! seen by a client), many UDP clients kept apart, TCP bytes intact and in order with half-close and reset passed
//! on, and sockets closed on drop. Run with `-- --nocapture` to see the measured numbers.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use workloads::emulator::{DelayStats, LinkConfig, LinkEmulator, TcpEmulator, UdpEmulator};

const LOCALHOST: &str = "127.0.0.1:0";

/// The tests that measure time run one at a time: on a 2-core machine, tests of this file beside each other (each
/// with an emulator thread, an echo server and a client) delay each other's threads by more than the accuracy
/// they check.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TIMED: Mutex<()> = Mutex::new(());
    TIMED.lock().unwrap_or_else(|e| e.into_inner())
}

/// A UDP server that sends every datagram back to its sender and remembers who sent.
struct EchoServer {
    addr: SocketAddr,
    peers: Arc<Mutex<HashSet<SocketAddr>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EchoServer {
    fn start() -> Self {
        Self::start_on(LOCALHOST.parse().unwrap())
    }

    fn start_on(addr: SocketAddr) -> Self {
        Self::serve(UdpSocket::bind(addr).unwrap())
    }

    fn serve(socket: UdpSocket) -> Self {
        socket
            .set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        grow_receive_buffer(&socket);
        let addr = socket.local_addr().unwrap();
        let peers = Arc::new(Mutex::new(HashSet::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = thread::spawn({
            let (peers, stop) = (Arc::clone(&peers), Arc::clone(&stop));
            move || {
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((n, from)) = socket.recv_from(&mut buf) {
                        peers.lock().unwrap().insert(from);
                        let _ = socket.send_to(&buf[..n], from);
                    }
                }
            }
        });
        Self {
            addr,
            peers,
            stop,
            thread: Some(thread),
        }
    }

    fn peers(&self) -> usize {
        self.peers.lock().unwrap().len()
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}

/// Room for bursts while the thread that reads `socket` waits for a core (capped at `net.core.rmem_max`).
fn grow_receive_buffer(socket: &UdpSocket) {
    let bytes: libc::c_int = 4 << 20;
    // SAFETY: the option value is a live c_int of the size given.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(socket),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
}

/// Sends `count` pings to `target`, one every `interval` without waiting for answers (so the test does not take
/// `count` round trips), and returns the round trip of each answer, in microseconds, sorted.
fn ping(target: SocketAddr, count: u64, interval: Duration) -> Vec<f64> {
    let socket = UdpSocket::bind(LOCALHOST).unwrap();
    socket.connect(target).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let base = Instant::now();
    let sender = thread::spawn({
        let socket = socket.try_clone().unwrap();
        move || {
            for seq in 0..count {
                let mut payload = [0u8; 16];
                payload[..8].copy_from_slice(&seq.to_be_bytes());
                payload[8..].copy_from_slice(&(base.elapsed().as_nanos() as u64).to_be_bytes());
                socket.send(&payload).unwrap();
                thread::sleep(interval);
            }
        }
    });
    let mut rtts = Vec::new();
    let mut buf = [0u8; 64];
    while (rtts.len() as u64) < count {
        match socket.recv(&mut buf) {
            Ok(16) => {
                let sent = u64::from_be_bytes(buf[8..16].try_into().unwrap());
                let rtt = base.elapsed().as_nanos() as u64 - sent;
                rtts.push(rtt as f64 / 1000.0);
            }
            Ok(n) => panic!("unexpected {n}-byte answer"),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut =>
            {
                break
            }
            Err(e) => panic!("{e}"),
        }
    }
    sender.join().unwrap();
    rtts.sort_by(f64::total_cmp);
    rtts
}

fn median(sorted: &[f64]) -> f64 {
    sorted[sorted.len() / 2]
}

/// The required accuracy: within 5 % of the setting or 2 ms, whichever is larger (the emulator's thread wakes on a
/// shared machine's timer; docs/emulator.md gives the accuracy measured), never early.
fn assert_accurate(label: &str, stats: &DelayStats, setting: Duration) {
    let setting_us = setting.as_secs_f64() * 1e6;
    let bound_us = (setting_us * 0.05).max(2000.0);
    eprintln!(
        "{label}: setting {:.0} us, measured p50 {:.1} us, mean {:.1} us, p99 {:.1} us, max {:.1} us over {} packets",
        stats.setting_us, stats.p50_us, stats.mean_us, stats.p99_us, stats.max_us, stats.packets
    );
    assert_eq!(stats.setting_us, setting_us);
    assert!(stats.packets > 0, "{label}: nothing measured");
    assert!(
        (stats.p50_us - setting_us).abs() <= bound_us,
        "{label}: median added delay {:.1} us is not within {bound_us:.0} us of {setting_us:.0} us",
        stats.p50_us
    );
    // The emulator never delivers early.
    assert!(stats.p50_us >= setting_us, "{label}: delivered early");
}

fn udp_delay_is_accurate(one_way: Duration) {
    let server = EchoServer::start();
    let count = 300;
    let interval = Duration::from_millis(2);
    let direct = ping(server.addr, count, interval);
    assert_eq!(direct.len() as u64, count, "every direct ping answered");
    let emulator = UdpEmulator::start(server.addr, LinkConfig::with_delay(one_way)).unwrap();
    let relayed = ping(emulator.addr(), count, interval);
    // The client may read the last answer before the emulator has recorded it.
    thread::sleep(Duration::from_millis(20));
    let measured = emulator.measured();
    assert_eq!(
        relayed.len() as u64,
        count,
        "every ping answered through the emulator: {measured:?}"
    );

    assert_accurate("udp to server", &measured.to_server, one_way);
    assert_accurate("udp to client", &measured.to_client, one_way);
    assert_eq!(measured.to_server.packets, count);
    assert_eq!(measured.to_client.packets, count);
    assert_eq!(
        (measured.to_server.dropped, measured.to_client.dropped),
        (0, 0)
    );
    assert_eq!(measured.flows, 1);

    // From the client: the round trip grows by twice the setting. The client's clock readings include this shared
    // machine's scheduling noise, hence medians and a wider bound.
    let added_us = median(&relayed) - median(&direct);
    let expected_us = 2.0 * one_way.as_secs_f64() * 1e6;
    eprintln!(
        "client: rtt p50 {:.1} us direct, {:.1} us through the emulator (p99 {:.1} us): added {added_us:.1} us, \
         expected {expected_us:.0} us",
        median(&direct),
        median(&relayed),
        relayed[relayed.len() * 99 / 100],
    );
    assert!(
        (added_us - expected_us).abs() <= (expected_us * 0.05).max(2000.0),
        "client-side added rtt {added_us:.1} us"
    );
}

#[test]
fn udp_delay_10ms() {
    let _timed = one_at_a_time();
    udp_delay_is_accurate(Duration::from_millis(10));
}

#[test]
fn udp_delay_50ms() {
    let _timed = one_at_a_time();
    udp_delay_is_accurate(Duration::from_millis(50));
}

#[test]
fn udp_zero_delay_relays() {
    let _timed = one_at_a_time();
    let server = EchoServer::start();
    let emulator = UdpEmulator::start(server.addr, LinkConfig::with_delay(Duration::ZERO)).unwrap();
    let rtts = ping(emulator.addr(), 50, Duration::from_micros(200));
    eprintln!(
        "zero delay: rtt p50 {:.1} us through the emulator",
        median(&rtts)
    );
    assert_eq!(rtts.len(), 50, "every ping answered");
    // The client may read the last answer before the emulator has recorded it.
    let deadline = Instant::now() + Duration::from_secs(1);
    while emulator.measured().to_client.packets < 50 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(emulator.measured().to_client.packets, 50);
}

#[test]
fn many_udp_clients_are_kept_apart() {
    let _timed = one_at_a_time();
    const CLIENTS: usize = 1000;
    const PER_CLIENT: usize = 3;
    let server = EchoServer::start();
    let emulator = UdpEmulator::start(
        server.addr,
        LinkConfig::with_delay(Duration::from_millis(5)),
    )
    .unwrap();
    let clients: Vec<UdpSocket> = (0..CLIENTS)
        .map(|_| {
            let socket = UdpSocket::bind(LOCALHOST).unwrap();
            socket.connect(emulator.addr()).unwrap();
            socket.set_nonblocking(true).unwrap();
            socket
        })
        .collect();
    // Ten clients a millisecond, as devices coming up over a fraction of a second.
    for round in 0..PER_CLIENT {
        for (i, client) in clients.iter().enumerate() {
            client.send(format!("{i}/{round}").as_bytes()).unwrap();
            if i % 10 == 9 {
                thread::sleep(Duration::from_millis(1));
            }
        }
    }
    let mut got = vec![0usize; CLIENTS];
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 64];
    while got.iter().any(|&n| n < PER_CLIENT) && Instant::now() < deadline {
        for (i, client) in clients.iter().enumerate() {
            while let Ok(n) = client.recv(&mut buf) {
                let text = std::str::from_utf8(&buf[..n]).unwrap();
                let owner: usize = text.split('/').next().unwrap().parse().unwrap();
                assert_eq!(owner, i, "client {i} received {text}");
                got[i] += 1;
            }
        }
        thread::sleep(Duration::from_millis(1));
    }
    let missing = got.iter().filter(|&&n| n < PER_CLIENT).count();
    assert_eq!(
        missing,
        0,
        "clients missing echoes; the server saw {} peers; {:?}",
        server.peers(),
        emulator.measured()
    );
    assert_eq!(
        server.peers(),
        CLIENTS,
        "the server sees one peer per client"
    );
    let measured = emulator.measured();
    assert_eq!(measured.flows, CLIENTS as u64);
    assert_eq!(measured.flow_errors, 0);
    assert_accurate(
        "many clients, to server",
        &measured.to_server,
        Duration::from_millis(5),
    );
}

#[test]
fn udp_keeps_up_with_twenty_thousand_datagrams_a_second() {
    let _timed = one_at_a_time();
    const RATE: u64 = 20_000;
    const SECONDS: u64 = 1;
    let server = EchoServer::start();
    let one_way = Duration::from_millis(10);
    let emulator = UdpEmulator::start(server.addr, LinkConfig::with_delay(one_way)).unwrap();
    let socket = UdpSocket::bind(LOCALHOST).unwrap();
    socket.connect(emulator.addr()).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    grow_receive_buffer(&socket);
    let sender = thread::spawn({
        let socket = socket.try_clone().unwrap();
        move || {
            // 20 datagrams every millisecond, on an absolute schedule.
            let start = Instant::now();
            for ms in 0..SECONDS * 1000 {
                for _ in 0..RATE / 1000 {
                    socket.send(&[0u8; 64]).unwrap();
                }
                let next = start + Duration::from_millis(ms + 1);
                thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        }
    });
    let mut received = 0u64;
    let mut buf = [0u8; 128];
    while socket.recv(&mut buf).is_ok() {
        received += 1;
    }
    sender.join().unwrap();
    let sent = RATE * SECONDS;
    let measured = emulator.measured();
    eprintln!("{sent} sent, {received} echoed; emulator {measured:?}");
    assert!(
        received * 1000 >= sent * 995,
        "{received} of {sent} echoed; {measured:?}"
    );
    assert_eq!(measured.to_server.dropped + measured.to_client.dropped, 0);
    // Keeping up is the point here (everything relayed, nothing dropped, the median never early and not drifting
    // away); the accuracy bound is the other tests'. On this shared machine the median was once 2.4 ms late in a
    // CI run (a p99 of +23 ms: the host did not run the thread), so the bound is half the setting: an emulator
    // that falls behind for good is seconds late.
    for (label, stats) in [
        ("20k/s to server", &measured.to_server),
        ("20k/s to client", &measured.to_client),
    ] {
        eprintln!(
            "{label}: p50 {:.1} us, p99 {:.1} us",
            stats.p50_us, stats.p99_us
        );
        assert!(
            stats.p50_us >= 10_000.0 && stats.p50_us < 15_000.0,
            "{label}: {stats:?}"
        );
    }
}

#[test]
fn udp_flow_survives_a_server_restart() {
    let server = EchoServer::start();
    let addr = server.addr;
    let emulator =
        UdpEmulator::start(addr, LinkConfig::with_delay(Duration::from_millis(1))).unwrap();
    let client = UdpSocket::bind(LOCALHOST).unwrap();
    client.connect(emulator.addr()).unwrap();
    client
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 16];
    client.send(b"one").unwrap();
    assert_eq!(client.recv(&mut buf).unwrap(), 3);

    // The server goes away: the emulator's upstream socket gets ICMP port unreachable.
    drop(server);
    client.send(b"lost").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while emulator.measured().to_server.packets < 2 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(1));
    }

    let server = EchoServer::start_on(addr);
    client.send(b"two").unwrap();
    assert_eq!(client.recv(&mut buf).unwrap(), 3);
    assert_eq!(&buf[..3], b"two");
    assert_eq!(emulator.measured().flows, 1);
    assert_eq!(server.peers(), 1);
}

/// A TCP server that echoes each connection until EOF, then shuts its side down.
fn tcp_echo_server() -> SocketAddr {
    let listener = TcpListener::bind(LOCALHOST).unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                loop {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if stream.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = stream.shutdown(Shutdown::Write);
            });
        }
    });
    addr
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

#[test]
fn tcp_bytes_arrive_intact_in_order_and_delayed() {
    let _timed = one_at_a_time();
    let one_way = Duration::from_millis(10);
    let emulator = TcpEmulator::start(tcp_echo_server(), LinkConfig::with_delay(one_way)).unwrap();

    // The first answer takes the emulated handshake (1.5 round trips) plus one round trip.
    let start = Instant::now();
    let mut stream = TcpStream::connect(emulator.addr()).unwrap();
    stream.write_all(b"hello").unwrap();
    let mut buf = [0u8; 5];
    stream.read_exact(&mut buf).unwrap();
    let first = start.elapsed();
    assert_eq!(&buf, b"hello");
    eprintln!("tcp: first answer after {first:?} (4 x {one_way:?} expected)");
    // Never early; how late depends on how busy this shared machine is (typically 0.3 ms).
    assert!(first >= 4 * one_way, "{first:?}");
    assert!(
        first < 4 * one_way + Duration::from_millis(500),
        "{first:?}"
    );

    // Then a round trip takes twice the one-way delay.
    let start = Instant::now();
    stream.write_all(b"again").unwrap();
    stream.read_exact(&mut buf).unwrap();
    let rtt = start.elapsed();
    eprintln!("tcp: round trip {rtt:?}");
    assert!(
        rtt >= 2 * one_way && rtt < 2 * one_way + Duration::from_millis(500),
        "{rtt:?}"
    );

    // A few megabytes both ways, written and read at once.
    let data = pattern(3 << 20);
    let writer = thread::spawn({
        let mut stream = stream.try_clone().unwrap();
        let data = data.clone();
        move || {
            stream.write_all(&data).unwrap();
            // Half-close: the server sees EOF, finishes echoing, and closes its side.
            stream.shutdown(Shutdown::Write).unwrap();
        }
    });
    let mut echoed = Vec::new();
    stream.read_to_end(&mut echoed).unwrap();
    writer.join().unwrap();
    assert!(
        echoed.len() == data.len() && echoed == data,
        "echo differs ({} of {} bytes)",
        echoed.len(),
        data.len()
    );

    let measured = emulator.measured();
    eprintln!("tcp: {measured:?}");
    assert_eq!(measured.flows, 1);
    assert!(measured.to_server.p50_us >= measured.to_server.setting_us);
    assert!(measured.to_client.p50_us >= measured.to_client.setting_us);
    assert_eq!(measured.to_server.dropped + measured.to_client.dropped, 0);
}

/// TCP Fast Open through the emulator: a client whose first bytes ride in its SYN has them at the server half a
/// round trip in, so its first answer comes after 1 round trip instead of 2. Where the kernel lets no server take
/// data in a SYN, the connection falls back to the full handshake and the emulator must not count it.
#[test]
fn tcp_fast_open_saves_the_handshake_round_trip_where_the_kernel_allows_it() {
    let _timed = one_at_a_time();
    use transport_core::net::fast_open;

    let Some(kernel) = fast_open::KernelSupport::for_clients() else {
        return;
    };
    // Long enough that a late wake-up on a busy machine cannot pass for the round trip saved or lost.
    let one_way = Duration::from_millis(50);
    let emulator = TcpEmulator::start(tcp_echo_server(), LinkConfig::with_delay(one_way)).unwrap();
    let start = Instant::now();
    let mut stream = fast_open::connect_std(emulator.addr()).unwrap();
    stream.write_all(b"hello").unwrap();
    let mut buf = [0u8; 5];
    stream.read_exact(&mut buf).unwrap();
    let first = start.elapsed();
    assert_eq!(&buf, b"hello");
    let measured = emulator.measured();
    if kernel.server() {
        eprintln!("tcp fast open: first answer after {first:?} (2 x {one_way:?} expected)");
        assert_eq!(measured.fast_open, 1);
        assert!(fast_open::syn_data(&stream).unwrap());
        assert!(first >= 2 * one_way, "{first:?}");
        assert!(
            first < 4 * one_way,
            "{first:?}: the handshake was not saved"
        );
    } else {
        eprintln!(
            "net.ipv4.tcp_fastopen = {}: servers take no data in a SYN",
            kernel.sysctl
        );
        assert_eq!(measured.fast_open, 0);
        assert!(first >= 4 * one_way, "{first:?}");
    }
    assert_eq!(measured.flows, 1);
}

#[test]
fn tcp_slow_reader_pushes_back_and_gets_every_byte() {
    let _timed = one_at_a_time();
    let listener = TcpListener::bind(LOCALHOST).unwrap();
    let upstream = listener.local_addr().unwrap();
    let emulator =
        TcpEmulator::start(upstream, LinkConfig::with_delay(Duration::from_millis(1))).unwrap();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let server = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        // Read nothing until told: the emulator must stop reading from the client.
        wait.recv().unwrap();
        let mut all = Vec::new();
        stream.read_to_end(&mut all).unwrap();
        all
    });

    let mut client = TcpStream::connect(emulator.addr()).unwrap();
    client.set_nonblocking(true).unwrap();
    let block = pattern(251 * 1024);
    let mut written = 0usize;
    let mut last_progress = Instant::now();
    while last_progress.elapsed() < Duration::from_millis(300) {
        assert!(written < 256 << 20, "the emulator buffers without bound");
        match client.write(&block[written % 251..]) {
            Ok(n) => {
                written += n;
                last_progress = Instant::now();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("{e}"),
        }
    }
    eprintln!(
        "tcp: the client could write {} KiB before the slow reader pushed back",
        written >> 10
    );

    go.send(()).unwrap();
    client.set_nonblocking(false).unwrap();
    let more = 1 << 20;
    let end = written + more;
    while written < end {
        let n = client
            .write(&block[written % 251..(written % 251) + (end - written).min(block.len() - 251)])
            .unwrap();
        written += n;
    }
    client.shutdown(Shutdown::Write).unwrap();
    let all = server.join().unwrap();
    assert_eq!(all.len(), written);
    assert!(
        all.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8),
        "bytes out of order"
    );
    assert!(
        emulator.measured().to_server.held > 0,
        "some chunks waited for the reader"
    );
}

#[test]
fn tcp_server_close_and_reset_reach_the_client() {
    let listener = TcpListener::bind(LOCALHOST).unwrap();
    let upstream = listener.local_addr().unwrap();
    let emulator =
        TcpEmulator::start(upstream, LinkConfig::with_delay(Duration::from_millis(2))).unwrap();
    let server = thread::spawn(move || {
        // First connection: say goodbye and close.
        let (mut stream, _) = listener.accept().unwrap();
        stream.write_all(b"bye").unwrap();
        drop(stream);
        // Second: reset.
        let (stream, _) = listener.accept().unwrap();
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        let rc = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&stream),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
        drop(stream);
    });

    let mut client = TcpStream::connect(emulator.addr()).unwrap();
    let mut got = Vec::new();
    client.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"bye");

    let mut client = TcpStream::connect(emulator.addr()).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let error = client.read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::ConnectionReset);
    server.join().unwrap();
}

#[test]
fn tcp_refused_upstream_resets_the_client() {
    // A port nothing listens on.
    let upstream = TcpListener::bind(LOCALHOST).unwrap().local_addr().unwrap();
    let emulator =
        TcpEmulator::start(upstream, LinkConfig::with_delay(Duration::from_millis(1))).unwrap();
    let mut client = TcpStream::connect(emulator.addr()).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let error = client.read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::ConnectionReset);
    assert_eq!(emulator.measured().flow_errors, 1);
}

#[test]
fn udp_and_tcp_on_one_port() {
    // A port free for both protocols: a TCP port the kernel chose, then UDP on
    // it, trying again while another socket holds the UDP side.
    let (listener, socket) = (0..100)
        .find_map(|_| {
            let listener = TcpListener::bind(LOCALHOST).ok()?;
            let socket = UdpSocket::bind(listener.local_addr().ok()?).ok()?;
            Some((listener, socket))
        })
        .expect("no port free for both UDP and TCP in 100 tries");
    let server = EchoServer::serve(socket);
    thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut buf = [0u8; 4];
        stream.read_exact(&mut buf).unwrap();
        stream.write_all(&buf).unwrap();
    });
    let one_way = Duration::from_millis(2);
    let emulator = LinkEmulator::start(server.addr, LinkConfig::with_delay(one_way)).unwrap();
    assert_eq!(emulator.udp().addr(), emulator.tcp().addr());

    assert_eq!(
        ping(emulator.addr(), 10, Duration::from_millis(1)).len(),
        10
    );
    let mut stream = TcpStream::connect(emulator.addr()).unwrap();
    stream.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    stream.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");

    thread::sleep(Duration::from_millis(20));
    let measured = emulator.measured();
    assert_eq!(measured.flows, 2);
    assert_eq!(measured.to_client.packets, 11);
    assert_eq!(measured.to_client.setting_us, 2000.0);
    assert!(measured.to_client.p50_us >= 2000.0);
}

#[test]
fn drop_closes_the_sockets() {
    let server = EchoServer::start();
    let udp = UdpEmulator::start(
        server.addr,
        LinkConfig::with_delay(Duration::from_millis(1)),
    )
    .unwrap();
    let tcp = TcpEmulator::start(
        tcp_echo_server(),
        LinkConfig::with_delay(Duration::from_millis(1)),
    )
    .unwrap();
    let (udp_addr, tcp_addr) = (udp.addr(), tcp.addr());
    let _ = ping(udp_addr, 1, Duration::ZERO);
    drop(udp);
    drop(tcp);
    // The ports are free again: nothing holds the sockets.
    UdpSocket::bind(udp_addr).unwrap();
    assert_eq!(
        TcpStream::connect(tcp_addr).unwrap_err().kind(),
        io::ErrorKind::ConnectionRefused
    );
}

#[test]
fn bad_config_is_an_error() {
    let config = LinkConfig::with_delay(Duration::from_secs(3600));
    let upstream = "127.0.0.1:9".parse().unwrap();
    assert_eq!(
        UdpEmulator::start(upstream, config.clone())
            .err()
            .unwrap()
            .kind(),
        io::ErrorKind::InvalidInput
    );
    assert_eq!(
        TcpEmulator::start(upstream, config).err().unwrap().kind(),
        io::ErrorKind::InvalidInput
    );
}

/// Offers 20, 50 and 100 thousand datagrams a second for a second each and prints what came back, the added
/// delay, and the CPU time of the emulator's thread. Not a pass/fail test: run it on a quiet machine with
/// `cargo test --release -p workloads --test emulator -- --ignored --nocapture udp_capacity`.
#[test]
#[ignore]
fn udp_capacity() {
    let server = EchoServer::start();
    for rate in [20_000u64, 50_000, 100_000] {
        let one_way = Duration::from_millis(10);
        let emulator = UdpEmulator::start(server.addr, LinkConfig::with_delay(one_way)).unwrap();
        let socket = UdpSocket::bind(LOCALHOST).unwrap();
        socket.connect(emulator.addr()).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let cpu_before = emulator_cpu();
        let sender = thread::spawn({
            let socket = socket.try_clone().unwrap();
            move || {
                let start = Instant::now();
                for ms in 0..1000 {
                    for _ in 0..rate / 1000 {
                        let _ = socket.send(&[0u8; 64]);
                    }
                    thread::sleep(
                        (start + Duration::from_millis(ms + 1))
                            .saturating_duration_since(Instant::now()),
                    );
                }
            }
        });
        let mut received = 0u64;
        let mut buf = [0u8; 128];
        while socket.recv(&mut buf).is_ok() {
            received += 1;
        }
        sender.join().unwrap();
        let cpu = emulator_cpu() - cpu_before;
        let m = emulator.measured();
        eprintln!(
            "{rate}/s offered: {received} echoed; to server p50 {:.1} p99 {:.1} max {:.1} us ({} dropped); \
             to client p50 {:.1} p99 {:.1} max {:.1} us ({} dropped); \
             emulator thread {:.2} s of CPU for 1 s of traffic",
            m.to_server.p50_us,
            m.to_server.p99_us,
            m.to_server.max_us,
            m.to_server.dropped,
            m.to_client.p50_us,
            m.to_client.p99_us,
            m.to_client.max_us,
            m.to_client.dropped,
            cpu.as_secs_f64(),
        );
    }
}

/// CPU time (user + system) of this process's threads named `udp-emulator`, from `/proc/self/task`.
fn emulator_cpu() -> Duration {
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let mut ticks = 0u64;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != "udp-emulator" {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the parenthesized name; utime and stime are the 14th and 15th of the whole line.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        ticks += fields
            .get(11)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0);
        ticks += fields
            .get(12)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Duration::from_secs_f64(ticks as f64 / ticks_per_second)
}
