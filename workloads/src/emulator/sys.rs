//! The few Linux calls the standard library and mio do not offer: clocks, a timerfd, the timer slack, receive
//! timestamps and `SO_LINGER`. All `unsafe` of the emulator is here.

use std::io;
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Nanoseconds on a clock.
pub(crate) type Nanos = u64;

const NANOS_PER_SEC: u64 = 1_000_000_000;

fn read_clock(clock: libc::clockid_t) -> Nanos {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime cannot fail for these clock ids.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    timespec_to_nanos(&ts)
}

/// `CLOCK_MONOTONIC` in nanoseconds (a vDSO call, about 20 ns).
pub(crate) fn monotonic() -> Nanos {
    read_clock(libc::CLOCK_MONOTONIC)
}

/// `CLOCK_REALTIME` in nanoseconds, the clock of the kernel's receive timestamps.
pub(crate) fn realtime() -> Nanos {
    read_clock(libc::CLOCK_REALTIME)
}

pub(crate) fn timespec_to_nanos(ts: &libc::timespec) -> Nanos {
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(NANOS_PER_SEC).saturating_add(nanos)
}

fn nanos_to_timespec(nanos: Nanos) -> libc::timespec {
    libc::timespec {
        tv_sec: libc::time_t::try_from(nanos / NANOS_PER_SEC).unwrap_or(libc::time_t::MAX),
        // Below 10^9, so it fits every c_long.
        tv_nsec: (nanos % NANOS_PER_SEC) as libc::c_long,
    }
}

/// Asks the kernel not to coalesce this thread's timers with others (the default slack is 50 µs). Best effort.
pub(crate) fn minimize_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes an unsigned long and touches no memory of ours.
    unsafe {
        libc::prctl(
            libc::PR_SET_TIMERSLACK,
            1 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0,
        )
    };
}

/// A non-blocking `timerfd` on `CLOCK_MONOTONIC`, readable when its deadline has passed.
pub(crate) struct TimerFd(OwnedFd);

impl TimerFd {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: plain system call; the result is checked before it is used as a descriptor.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Arms the timer for an absolute monotonic time (0 is moved to 1 ns, since 0 would disarm it).
    pub(crate) fn set(&self, at: Nanos) -> io::Result<()> {
        self.settime(nanos_to_timespec(at.max(1)))
    }

    pub(crate) fn disarm(&self) -> io::Result<()> {
        self.settime(libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        })
    }

    fn settime(&self, value: libc::timespec) -> io::Result<()> {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: value,
        };
        // SAFETY: `spec` is a valid itimerspec; the old value is not asked for.
        let rc = unsafe {
            libc::timerfd_settime(
                self.0.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Consumes the expiration count, so the descriptor is no longer readable. Errors (nothing expired) are fine.
    pub(crate) fn clear(&self) {
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into an 8-byte buffer.
        unsafe { libc::read(self.0.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

fn setsockopt<T>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    let len =
        libc::socklen_t::try_from(mem::size_of::<T>()).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: `value` points to a live T of `len` bytes; the kernel only reads it.
    let rc =
        unsafe { libc::setsockopt(fd.as_raw_fd(), level, name, (value as *const T).cast(), len) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the kernel stamp every received packet with its arrival time (`SO_TIMESTAMPNS`).
pub(crate) fn enable_receive_timestamps(socket: &impl AsFd) -> io::Result<()> {
    setsockopt(
        socket.as_fd(),
        libc::SOL_SOCKET,
        libc::SO_TIMESTAMPNS,
        &(1 as libc::c_int),
    )
}

/// Makes the kernel report, with every datagram read, how many datagrams it has dropped on this socket for want
/// of buffer space (`SO_RXQ_OVFL`), so those drops can be counted too.
pub(crate) fn enable_drop_count(socket: &impl AsFd) -> io::Result<()> {
    setsockopt(
        socket.as_fd(),
        libc::SOL_SOCKET,
        libc::SO_RXQ_OVFL,
        &(1 as libc::c_int),
    )
}

/// Makes `close` send a reset instead of a FIN.
pub(crate) fn set_linger_zero(socket: &impl AsFd) -> io::Result<()> {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    setsockopt(socket.as_fd(), libc::SOL_SOCKET, libc::SO_LINGER, &linger)
}

/// Asks for larger socket buffers, so bursts are not dropped while the thread delivers a batch. The kernel caps
/// the request at `net.core.rmem_max` / `wmem_max`; failure is not an error.
pub(crate) fn grow_buffers(socket: &impl AsFd, bytes: usize) {
    let bytes = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    let _ = setsockopt(socket.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, &bytes);
    let _ = setsockopt(socket.as_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, &bytes);
}

/// One datagram or chunk read by [`recv_timestamped`].
pub(crate) struct Received {
    /// Bytes read into the buffer; 0 is end of stream on TCP.
    pub(crate) len: usize,
    /// The sender, for unconnected datagram sockets.
    pub(crate) from: Option<SocketAddr>,
    /// The kernel's receive timestamp on `CLOCK_REALTIME` (for TCP, that of the last segment read).
    pub(crate) kernel_time: Option<Nanos>,
    /// Datagrams the kernel has dropped on this socket since it was opened (with [`enable_drop_count`]).
    pub(crate) kernel_drops: Option<u32>,
}

/// `recvmsg` with the sender's address and the `SO_TIMESTAMPNS` control message. Never blocks.
pub(crate) fn recv_timestamped(socket: &impl AsFd, buf: &mut [u8]) -> io::Result<Received> {
    // SAFETY: sockaddr_storage and msghdr are plain C structs for which all zeroes is a valid value.
    let mut name: libc::sockaddr_storage = unsafe { mem::zeroed() };
    // u64 elements keep the control buffer aligned for cmsghdr; 64 bytes hold a timestamp message (32) and a
    // drop count (20).
    let mut control = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: as above.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = mem::size_of_val(&control) as _;

    // SAFETY: every pointer in `msg` points to a live buffer of the length given next to it.
    let n = unsafe { libc::recvmsg(socket.as_fd().as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }

    let mut kernel_time = None;
    let mut kernel_drops = None;
    // SAFETY: the kernel filled `msg_controllen` bytes of `control`; the CMSG macros stay within them, and each
    // value is read unaligned from the data of a message whose type says what it holds.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPNS
            {
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::timespec>());
                kernel_time = Some(timespec_to_nanos(&ts));
            } else if (*cmsg).cmsg_level == libc::SOL_SOCKET
                && (*cmsg).cmsg_type == libc::SO_RXQ_OVFL
            {
                kernel_drops = Some(std::ptr::read_unaligned(
                    libc::CMSG_DATA(cmsg).cast::<u32>(),
                ));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }

    Ok(Received {
        len: n as usize,
        from: socket_addr(&name, msg.msg_namelen),
        kernel_time,
        kernel_drops,
    })
}

fn socket_addr(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(storage.ss_family) {
        libc::AF_INET if len >= mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, and it is large and aligned enough for one.
            let sin =
                unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe {
                &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The kernel turns receive timestamping on for the whole system lazily (a deferred static key), so the very
    // first packets after the first socket asks for it may arrive unstamped; the emulator then falls back to the
    // time it read them. The tests therefore send until a stamped packet arrives, within a second.
    fn until_stamped(mut attempt: impl FnMut() -> Received) -> Received {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        loop {
            let got = attempt();
            if got.kernel_time.is_some() || std::time::Instant::now() > deadline {
                return got;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    fn recv_blocking(socket: &impl AsFd, buf: &mut [u8]) -> Received {
        loop {
            match recv_timestamped(socket, buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                other => break other.unwrap(),
            }
        }
    }

    #[test]
    fn udp_receive_carries_address_and_kernel_timestamp() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        enable_receive_timestamps(&rx).unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let before = realtime();
        let mut buf = [0u8; 64];
        let got = until_stamped(|| {
            tx.send_to(b"hello", rx.local_addr().unwrap()).unwrap();
            recv_blocking(&rx, &mut buf)
        });
        assert_eq!(&buf[..got.len], b"hello");
        assert_eq!(got.from, Some(tx.local_addr().unwrap()));
        let stamp = got.kernel_time.expect("kernel timestamp");
        assert!(
            stamp >= before && stamp <= realtime(),
            "{stamp} not in [{before}, now]"
        );
    }

    #[test]
    fn tcp_receive_carries_kernel_timestamp() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        enable_receive_timestamps(&server).unwrap();
        let before = realtime();
        let mut buf = [0u8; 64];
        let got = until_stamped(|| {
            std::io::Write::write_all(&mut client, b"hello").unwrap();
            recv_blocking(&server, &mut buf)
        });
        assert_eq!(&buf[..got.len], b"hello");
        let stamp = got.kernel_time.expect("kernel timestamp on TCP");
        assert!(
            stamp >= before && stamp <= realtime(),
            "{stamp} not in [{before}, now]"
        );
    }

    #[test]
    fn timespec_round_trip() {
        let t = 1_234_567_890_123;
        assert_eq!(timespec_to_nanos(&nanos_to_timespec(t)), t);
    }
}
