//! Socket settings shared by the UDP transports.

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
    // SAFETY: `value` lives for the call and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
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

#[cfg(test)]
mod tests {
    #[test]
    fn buffers_grow() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let got = super::set_buffers(&s, 1 << 20).unwrap();
        assert!(got >= 200_000, "{got}");
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
