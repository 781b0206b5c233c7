//! Socket settings shared by the UDP transports.

use std::io;
use std::os::fd::AsRawFd;

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
}
