//! Socket settings and system calls shared by the transports: UDP buffers, UDP segmentation offload on send and
//! receive ([`send_segments`], [`recv_segments`]), and TCP Fast Open ([`fast_open`]).

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

/// A UDP socket bound to `addr`, with `buffer` bytes of kernel buffer asked for each way ([`set_buffers`]).
pub fn bind_udp(addr: SocketAddr, buffer: usize) -> io::Result<UdpSocket> {
    let socket = UdpSocket::bind(addr)?;
    set_buffers(&socket, buffer)?;
    Ok(socket)
}

/// Any port on the unspecified address of `peer`'s family: where a client's socket binds to reach `peer`.
pub fn any_port_for(peer: SocketAddr) -> SocketAddr {
    match peer {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    }
}

/// Ask for `bytes` of kernel buffer in each direction. As root the kernel's `rmem_max`/`wmem_max` caps are
/// bypassed (`SO_RCVBUFFORCE`); otherwise the request is capped silently. Returns the receive buffer obtained.
///
/// A receiver that is stopped (SIGSTOP) or busy relies on this buffer to keep the datagrams that arrive meanwhile.
pub fn set_buffers(socket: &impl AsRawFd, bytes: usize) -> io::Result<usize> {
    let fd = socket.as_raw_fd();
    let value = bytes.min(i32::MAX as usize) as libc::c_int;
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if setsockopt(fd, force, value).is_err() {
            setsockopt(fd, plain, value)?;
        }
    }
    let mut got: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `got` and `len` are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&mut got as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(got as usize)
}

fn setsockopt(fd: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    setsockopt_at(fd, libc::SOL_SOCKET, name, value)
}

fn setsockopt_at(
    fd: libc::c_int,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` lives for the call and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The most datagrams [`send_segments`] hands the kernel in one call: under Linux's `UDP_MAX_SEGMENTS` (64) and,
/// at Pure's largest datagram (1,200 bytes), under the 64 KiB a UDP send may carry.
pub const MAX_SEGMENTS: usize = 32;

/// Send `data` on a connected UDP socket as datagrams of `segment` bytes each (the last may be shorter) in one
/// system call, by UDP segmentation offload (Linux's `UDP_SEGMENT`, "GSO"): the receiver gets the same datagrams as
/// from one `send` each, and the sender pays for one system call and one pass down the stack. At most
/// [`MAX_SEGMENTS`] datagrams. Where the kernel or the route cannot segment, the error is
/// [`is_segmentation_unsupported`]: send the datagrams one at a time instead.
pub fn send_segments(socket: &impl AsRawFd, data: &[u8], segment: usize) -> io::Result<usize> {
    let segment = u16::try_from(segment)
        .ok()
        .filter(|&s| s > 0 && data.len().div_ceil(usize::from(s)) <= MAX_SEGMENTS)
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: CMSG_SPACE only computes a size.
    const SPACE: usize = unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) } as usize;
    // u64 words: the control buffer is aligned for `cmsghdr`.
    let mut control = [0u64; SPACE.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: an all-zero msghdr is valid (no name, no buffers); the fields set below point at live locals.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = SPACE as _;
    // SAFETY: `msg` has a control buffer of SPACE bytes, room for one cmsghdr with a u16 of data, written below
    // within it; sendmsg reads `msg`, `iov` and `data`, which outlive the call.
    let sent = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_UDP;
        (*cmsg).cmsg_type = libc::UDP_SEGMENT;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), segment);
        libc::sendmsg(socket.as_raw_fd(), &msg, 0)
    };
    if sent < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(sent as usize)
    }
}

/// Whether an error of [`send_segments`] says that segmentation is not possible on this socket (an old kernel, a
/// device without checksum offload), rather than that the datagrams could not be sent.
pub fn is_segmentation_unsupported(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EIO | libc::ENOPROTOOPT | libc::EOPNOTSUPP | libc::EINVAL)
    )
}

/// Let the kernel hand `socket` runs of same-sized datagrams from one source as one buffer (Linux's `UDP_GRO`),
/// read with [`recv_segments`]. An error where the kernel cannot.
pub fn enable_receive_offload(socket: &impl AsRawFd) -> io::Result<()> {
    setsockopt_at(socket.as_raw_fd(), libc::SOL_UDP, libc::UDP_GRO, 1)
}

/// What [`recv_segments`] read: `len` bytes from `from`, datagrams of `segment` bytes each but the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub len: usize,
    pub from: SocketAddr,
    /// The size of each datagram in the buffer but the last; `len` when it holds one datagram.
    pub segment: usize,
}

impl Received {
    /// The datagrams of `buf[..len]`.
    pub fn datagrams<'a>(&self, buf: &'a [u8]) -> std::slice::Chunks<'a, u8> {
        buf[..self.len].chunks(self.segment.max(1))
    }
}

/// Receive into `buf` on a socket with [`enable_receive_offload`] (or without it: then one datagram): one
/// datagram, or a run of datagrams of one size from one source that the kernel coalesced. A datagram longer than
/// `buf` arrives cut to its length, as with `recv_from`.
pub fn recv_segments(socket: &impl AsRawFd, buf: &mut [u8]) -> io::Result<Received> {
    // SAFETY: CMSG_SPACE only computes a size.
    const SPACE: usize =
        unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    let mut control = [0u64; SPACE.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: all-zero is a valid sockaddr_storage and msghdr; the pointers set below are to live locals.
    let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = SPACE as _;
    // SAFETY: every buffer `msg` points at is live and as long as it says.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let len = n as usize;
    let mut segment = len;
    // SAFETY: the kernel filled `msg_controllen` bytes of the control buffer with well-formed cmsghdrs; the walk
    // stays within them, and a UDP_GRO message carries one int.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_UDP && (*cmsg).cmsg_type == libc::UDP_GRO {
                let size = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                if size > 0 {
                    segment = size as usize;
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    let from = socket_addr(&name).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "a datagram from an address of an unknown family",
        )
    })?;
    Ok(Received { len, from, segment })
}

fn socket_addr(name: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match libc::c_int::from(name.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which it is large and aligned enough for.
            let sin =
                unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::from((
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 =
                unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// TCP Fast Open (RFC 7413): a client's first bytes in its SYN, so a request costs no round trip for the TCP
/// handshake.
///
/// A first contact has no cookie from an earlier connection, so both ends here waive it
/// (`TCP_FASTOPEN_NO_COOKIE`), as a server that accepts data in any SYN does: the data of a SYN is then processed
/// before the client has proven its address, which RFC 7413 section 5 weighs against SYN floods. Linux lets a
/// client send data in a SYN when `net.ipv4.tcp_fastopen` has bit 1 (the default) and a server accept it when it
/// has bit 2 (`sysctl -w net.ipv4.tcp_fastopen=3`); the setting is per network namespace.
pub mod fast_open {
    use std::io;
    use std::net::{SocketAddr, TcpStream};
    use std::os::fd::{AsRawFd, FromRawFd};

    /// `TCPI_OPT_SYN_DATA` of `linux/tcp.h`: the SYN's data was acknowledged (client) or accepted (server).
    const TCPI_OPT_SYN_DATA: u8 = 32;
    /// The sysctl's bits: clients may send data in a SYN; servers may accept it.
    const CLIENT: u32 = 1;
    const SERVER: u32 = 2;
    const SYSCTL: &str = "/proc/sys/net/ipv4/tcp_fastopen";

    /// What this network namespace's kernel allows, from `net.ipv4.tcp_fastopen`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct KernelSupport {
        /// The sysctl's value.
        pub sysctl: u32,
    }

    impl KernelSupport {
        /// Read `net.ipv4.tcp_fastopen`; an error where the file is missing (not Linux, or no TFO in the kernel).
        pub fn read() -> io::Result<Self> {
            let text = std::fs::read_to_string(SYSCTL)?;
            let sysctl = text.trim().parse().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{SYSCTL}: not a number: {text:?}"),
                )
            })?;
            Ok(KernelSupport { sysctl })
        }

        /// What the kernel allows where clients may send data in a SYN; otherwise `None`, with the reason on
        /// stderr (the start of a test that needs a client).
        pub fn for_clients() -> Option<Self> {
            match Self::read() {
                Ok(kernel) if kernel.client() => Some(kernel),
                Ok(kernel) => {
                    eprintln!(
                        "net.ipv4.tcp_fastopen = {}: no client may send data in a SYN",
                        kernel.sysctl
                    );
                    None
                }
                Err(e) => {
                    eprintln!("no TCP Fast Open here: {e}");
                    None
                }
            }
        }

        /// Clients may send data in a SYN.
        pub fn client(&self) -> bool {
            self.sysctl & CLIENT != 0
        }

        /// Servers may accept data in a SYN.
        pub fn server(&self) -> bool {
            self.sysctl & SERVER != 0
        }

        /// Both ends on this machine: what a run through the suite's emulator needs. `Err` says what to change.
        pub fn require_both(&self) -> Result<(), String> {
            if self.client() && self.server() {
                Ok(())
            } else {
                Err(format!(
                    "TCP Fast Open needs net.ipv4.tcp_fastopen with bits 1 (client) and 2 (server); it is {} here \
                     (as root: sysctl -w net.ipv4.tcp_fastopen=3)",
                    self.sysctl
                ))
            }
        }
    }

    /// Before `connect` on a TCP socket: the connect returns at once and the first write goes in the SYN, with
    /// no cookie. `EOPNOTSUPP` where the kernel lets no client send data in a SYN.
    pub fn client(socket: &impl AsRawFd) -> io::Result<()> {
        let fd = socket.as_raw_fd();
        super::setsockopt_at(fd, libc::IPPROTO_TCP, libc::TCP_FASTOPEN_CONNECT, 1)?;
        super::setsockopt_at(fd, libc::IPPROTO_TCP, libc::TCP_FASTOPEN_NO_COOKIE, 1)
    }

    /// A blocking TCP connection to `addr` whose first write goes in the SYN ([`client`]); for tools and tests
    /// (an async client sets [`client`] on its own socket before connecting).
    pub fn connect_std(addr: SocketAddr) -> io::Result<TcpStream> {
        let (family, len) = match addr {
            SocketAddr::V4(_) => (libc::AF_INET, std::mem::size_of::<libc::sockaddr_in>()),
            SocketAddr::V6(_) => (libc::AF_INET6, std::mem::size_of::<libc::sockaddr_in6>()),
        };
        // SAFETY: a plain socket call; the descriptor is owned by the stream made from it at once.
        let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new socket no one else owns.
        let stream = unsafe { TcpStream::from_raw_fd(fd) };
        client(&stream)?;
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from(*a.ip()).to_be(),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: `sockaddr_storage` is larger than and aligned for `sockaddr_in`.
                unsafe {
                    std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin)
                };
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: `sockaddr_storage` is larger than and aligned for `sockaddr_in6`.
                unsafe {
                    std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6)
                };
            }
        }
        // SAFETY: `storage` holds a valid address of `len` bytes.
        let rc = unsafe {
            libc::connect(
                stream.as_raw_fd(),
                (&storage as *const libc::sockaddr_storage).cast(),
                len as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stream)
    }

    /// On a listening socket: accept data in a SYN without a cookie, with up to `queue` such connections not yet
    /// accepted. Takes effect only where the kernel's server bit is set ([`KernelSupport::server`]).
    pub fn server(listener: &impl AsRawFd, queue: i32) -> io::Result<()> {
        let fd = listener.as_raw_fd();
        super::setsockopt_at(fd, libc::IPPROTO_TCP, libc::TCP_FASTOPEN, queue)?;
        super::setsockopt_at(fd, libc::IPPROTO_TCP, libc::TCP_FASTOPEN_NO_COOKIE, 1)
    }

    /// Whether the connection's SYN carried data the peer took: on a client, after the handshake, the server
    /// acknowledged it; on a server, the accepted connection's SYN brought data.
    pub fn syn_data(socket: &impl AsRawFd) -> io::Result<bool> {
        // SAFETY: `tcp_info` is plain data; zeroes are a valid value.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: `info` and `len` are valid for writes of the sizes given.
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(info.tcpi_options & TCPI_OPT_SYN_DATA != 0)
    }
}

#[cfg(test)]
mod tests {
    /// A receiving socket (reads time out after 5 s) and a sending one connected to it, on loopback.
    fn loopback_pair() -> (std::net::UdpSocket, std::net::UdpSocket) {
        let receiver = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        receiver
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sender.connect(receiver.local_addr().unwrap()).unwrap();
        (receiver, sender)
    }

    #[test]
    fn buffers_grow() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let got = super::set_buffers(&s, 1 << 20).unwrap();
        assert!(got >= 200_000, "{got}");
    }

    /// Real sockets on loopback: a segmented send arrives as the datagrams it was cut into, the last one shorter,
    /// each with its own bytes; where the kernel cannot segment, the error says so.
    #[test]
    fn a_segmented_send_arrives_as_separate_datagrams() {
        let (receiver, sender) = loopback_pair();
        let sizes = [300, 300, 300, 120];
        let data: Vec<u8> = sizes
            .iter()
            .enumerate()
            .flat_map(|(i, &n)| std::iter::repeat_n(i as u8 + 1, n))
            .collect();
        match super::send_segments(&sender, &data, 300) {
            Ok(sent) => assert_eq!(sent, data.len()),
            Err(e) if super::is_segmentation_unsupported(&e) => {
                eprintln!("no UDP segmentation here: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        }
        let mut buf = [0u8; 2048];
        for (i, &n) in sizes.iter().enumerate() {
            let got = receiver.recv(&mut buf).unwrap();
            assert_eq!(got, n, "datagram {i}");
            assert!(buf[..got].iter().all(|&b| b == i as u8 + 1), "datagram {i}");
        }
        // Too many segments for one call, or none: refused before the kernel sees it.
        let many = vec![0u8; (super::MAX_SEGMENTS + 1) * 10];
        assert!(super::send_segments(&sender, &many, 10).is_err());
        assert!(super::send_segments(&sender, &data, 0).is_err());
    }

    /// With receive offload on, a segmented send may arrive in one read: cut at the segment size it reports, it
    /// gives back the datagrams sent, with the sender's address. A lone datagram is one datagram either way.
    #[test]
    fn coalesced_datagrams_are_cut_back_into_the_datagrams_sent() {
        let (receiver, sender) = loopback_pair();
        super::enable_receive_offload(&receiver).unwrap();
        let sent: Vec<Vec<u8>> = (1..=4u8)
            .map(|i| vec![i; 200])
            .chain([vec![7; 50]])
            .collect();
        let data = sent.concat();
        if let Err(e) = super::send_segments(&sender, &data, 200) {
            assert!(super::is_segmentation_unsupported(&e), "{e}");
            for d in &sent {
                sender.send(d).unwrap();
            }
        }
        sender.send(b"alone").unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let mut got = Vec::new();
        while got.len() < sent.len() + 1 {
            let r = super::recv_segments(&receiver, &mut buf).unwrap();
            assert_eq!(r.from, sender.local_addr().unwrap());
            got.extend(r.datagrams(&buf).map(<[u8]>::to_vec));
        }
        assert_eq!(got[..sent.len()], sent[..]);
        assert_eq!(got[sent.len()], b"alone");
    }

    /// Real sockets on loopback: where the kernel allows both ends, a client's first write rides in the SYN and
    /// both ends see it; where it does not, the test says so and checks that nothing claims otherwise.
    #[test]
    fn a_first_write_rides_in_the_syn_where_the_kernel_allows_it() {
        use std::io::{Read, Write};

        use super::fast_open;

        let Ok(kernel) = fast_open::KernelSupport::read() else {
            eprintln!("no net.ipv4.tcp_fastopen here: nothing to test");
            return;
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        fast_open::server(&listener, 16).unwrap();
        let connected = fast_open::connect_std(listener.local_addr().unwrap());
        if !kernel.client() {
            assert!(connected.is_err(), "the kernel refuses a client");
            return;
        }
        let mut client = connected.unwrap();
        client.write_all(b"hello").unwrap();
        let (mut accepted, _) = listener.accept().unwrap();
        let mut got = [0u8; 5];
        accepted.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
        accepted.write_all(b"!").unwrap();
        client.read_exact(&mut got[..1]).unwrap();
        let (sent, taken) = (
            fast_open::syn_data(&client).unwrap(),
            fast_open::syn_data(&accepted).unwrap(),
        );
        assert_eq!(sent, kernel.server(), "client: SYN data acknowledged");
        assert_eq!(taken, kernel.server(), "server: SYN data accepted");
        if !kernel.server() {
            eprintln!(
                "net.ipv4.tcp_fastopen = {}: servers here take no data in a SYN",
                kernel.sysctl
            );
        }
        // A plain connection has no SYN data on either side.
        let mut plain = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        plain.write_all(b"x").unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert!(!fast_open::syn_data(&accepted).unwrap());
    }

    #[test]
    fn client_sockets_take_the_servers_family() {
        let server: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
        let socket = super::bind_udp(super::any_port_for(server), 1 << 16).unwrap();
        let local = socket.local_addr().unwrap();
        assert!(local.is_ipv4() && local.ip().is_unspecified() && local.port() != 0);
        assert!(super::any_port_for("[::1]:9".parse().unwrap()).is_ipv6());
    }
}
