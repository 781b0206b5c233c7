//! What a process costs, read from the kernel: CPU time and state from `/proc/PID/stat` (clock ticks, usually
//! 10 ms), this process's CPU from `getrusage` (microseconds), resident memory from `/proc/PID/statm`, the files it
//! holds open from `/proc/PID/fd` and may hold from `/proc/PID/limits`, the datagrams its UDP sockets dropped from
//! `/proc/PID/net/udp`.
//!
//! Servers read their own figures with it (the control line's CPU, a broker's `$SYS` memory); the runner's
//! sampler reads the servers'.

use std::io;
use std::time::Duration;

/// The fields of `/proc/PID/stat` the suite reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// The state letter: `R` running, `S` sleeping, `T` stopped, `Z` zombie, ...
    pub state: char,
    /// User-mode CPU time in clock ticks.
    pub utime_ticks: u64,
    /// Kernel-mode CPU time in clock ticks.
    pub stime_ticks: u64,
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Parse one `/proc/PID/stat` line.
///
/// The command name (field 2) is in parentheses and may itself hold spaces and parentheses, so the fields are
/// counted from the *last* `)`.
pub fn parse_stat(line: &str) -> io::Result<ProcStat> {
    let close = line
        .rfind(')')
        .ok_or_else(|| invalid("no `)` in /proc stat line"))?;
    // After the name: state (field 3), ppid, pgrp, session, tty_nr, tpgid, flags, minflt, cminflt, majflt,
    // cmajflt, utime (field 14), stime (field 15).
    let fields: Vec<&str> = line[close + 1..]
        .split_ascii_whitespace()
        .take(13)
        .collect();
    if fields.len() < 13 {
        return Err(invalid("too few fields in /proc stat line"));
    }
    let mut state = fields[0].chars();
    let (Some(state), None) = (state.next(), state.next()) else {
        return Err(invalid("bad state in /proc stat line"));
    };
    let ticks = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| invalid("bad cpu time in /proc stat line"))
    };
    Ok(ProcStat {
        state,
        utime_ticks: ticks(fields[11])?,
        stime_ticks: ticks(fields[12])?,
    })
}

/// Read and parse `/proc/PID/stat`.
pub fn proc_stat(pid: u32) -> io::Result<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat"))?)
}

/// The state letter of a process (`T` when stopped); an error if it does not exist.
pub fn process_state(pid: u32) -> io::Result<char> {
    proc_stat(pid).map(|s| s.state)
}

fn sysconf(name: libc::c_int, fallback: u64) -> u64 {
    // SAFETY: sysconf only reads system configuration.
    let v = unsafe { libc::sysconf(name) };
    if v > 0 {
        v as u64
    } else {
        fallback
    }
}

/// Convert clock ticks to a duration.
fn ticks_to_duration(ticks: u64) -> Duration {
    let hz = sysconf(libc::_SC_CLK_TCK, 100);
    Duration::from_nanos((u128::from(ticks) * 1_000_000_000 / u128::from(hz)) as u64)
}

/// CPU time (user + system) a process has used so far.
pub fn cpu_time(pid: u32) -> io::Result<Duration> {
    let s = proc_stat(pid)?;
    Ok(ticks_to_duration(s.utime_ticks + s.stime_ticks))
}

/// CPU time (user + system) this process has used so far, with microsecond resolution.
pub fn self_cpu_time() -> io::Result<Duration> {
    // SAFETY: rusage is plain data, and getrusage writes it whole when it returns 0.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage the call may write.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    Ok(tv(usage.ru_utime) + tv(usage.ru_stime))
}

/// CPU time the calling thread has used so far (`CLOCK_THREAD_CPUTIME_ID`, nanosecond resolution): unlike a wall
/// clock, it does not run while the thread waits for a core that other work holds.
pub fn thread_cpu_time() -> io::Result<Duration> {
    // SAFETY: timespec is plain data, and clock_gettime writes it whole when it returns 0.
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a timespec the call may write.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_nanos(t.tv_nsec.max(0) as u64))
}

/// Resident memory of a process in bytes.
pub fn rss_bytes(pid: u32) -> io::Result<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm"))?;
    let pages: u64 = statm
        .split_ascii_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| invalid("bad /proc statm"))?;
    Ok(pages * sysconf(libc::_SC_PAGESIZE, 4096))
}

/// How many files a process holds open (entries of `/proc/PID/fd`).
pub fn open_files(pid: u32) -> io::Result<u64> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64)
}

/// The inodes of the sockets process `pid` holds open (its `/proc/PID/fd` links `socket:[INODE]`).
fn socket_inodes(pid: u32) -> io::Result<std::collections::HashSet<String>> {
    let mut inodes = std::collections::HashSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let Ok(target) = std::fs::read_link(fd?.path()) else {
            continue; // closed meanwhile
        };
        let target = target.to_string_lossy();
        if let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|t| t.strip_suffix(']'))
        {
            inodes.insert(inode.to_string());
        }
    }
    Ok(inodes)
}

/// Whether process `pid` holds a TCP socket listening on `port` (IPv4 or IPv6): a listening socket of that port in
/// its network namespace (`/proc/PID/net/tcp`, `tcp6`) whose inode is one of its open files.
pub fn listens_on(pid: u32, port: u16) -> io::Result<bool> {
    let inodes = socket_inodes(pid)?;
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        if listening_inodes(&text, port).any(|inode| inodes.contains(inode)) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Datagrams the kernel has dropped so far on the UDP sockets process `pid` holds open, because a socket's receive
/// buffer was full (or its checksum was bad): the `drops` column of `/proc/PID/net/udp` and `udp6` for the
/// process's sockets. The count lives with the socket: a closed socket's drops are gone.
pub fn udp_drops(pid: u32) -> io::Result<u64> {
    let inodes = socket_inodes(pid)?;
    let mut drops = 0;
    for table in ["udp", "udp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        drops += socket_drops(&text)
            .filter(|(inode, _)| inodes.contains(*inode))
            .map(|(_, d)| d)
            .sum::<u64>();
    }
    Ok(drops)
}

/// Each socket's inode and drop count in a `/proc/net/udp` (or `udp6`) table.
fn socket_drops(table: &str) -> impl Iterator<Item = (&str, u64)> {
    table.lines().skip(1).filter_map(|line| {
        let f: Vec<&str> = line.split_ascii_whitespace().collect();
        Some((*f.get(9)?, f.get(12)?.parse().ok()?))
    })
}

/// The inodes of the sockets listening on `port` in a `/proc/net/tcp` (or `tcp6`) table.
fn listening_inodes(table: &str, port: u16) -> impl Iterator<Item = &str> {
    const LISTEN: &str = "0A";
    table.lines().skip(1).filter_map(move |line| {
        let f: Vec<&str> = line.split_ascii_whitespace().collect();
        let local_port = f.get(1)?.rsplit(':').next()?;
        let listening = *f.get(3)? == LISTEN;
        (listening && u16::from_str_radix(local_port, 16).ok()? == port)
            .then(|| f.get(9).copied())?
    })
}

/// What some CPUs of the machine did, summed over them, from `/proc/stat` (clock ticks, usually 10 ms): time charged
/// to processes (user, nice, system), time spent in interrupts (irq, softirq: the kernel's packet processing among it,
/// charged to no process), and time the hypervisor gave the virtual CPUs to something else (steal).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuUsage {
    /// User, nice and system time.
    pub processes: Duration,
    /// Hardware and software interrupt time.
    pub interrupts: Duration,
    /// Time stolen by the hypervisor.
    pub steal: Duration,
}

/// [`CpuUsage`] of the CPUs numbered `cpus` (every CPU of the machine when empty).
pub fn cpu_usage(cpus: &[usize]) -> io::Result<CpuUsage> {
    parse_cpu_usage(&std::fs::read_to_string("/proc/stat")?, cpus)
}

/// [`CpuUsage`] of the CPUs numbered `cpus` in a `/proc/stat` text (its `cpu` line when `cpus` is empty); an error if
/// a CPU asked for has no line or a line is malformed.
pub fn parse_cpu_usage(stat: &str, cpus: &[usize]) -> io::Result<CpuUsage> {
    let wanted = |name: &str| match name.strip_prefix("cpu") {
        Some("") => cpus.is_empty(),
        Some(n) => n.parse().is_ok_and(|n: usize| cpus.contains(&n)),
        None => false,
    };
    let mut ticks = [0u64; 3];
    let mut found = 0;
    for line in stat.lines() {
        let mut fields = line.split_ascii_whitespace();
        if !fields.next().is_some_and(wanted) {
            continue;
        }
        // user nice system idle iowait irq softirq steal (guest time is inside user and nice).
        let v: Vec<u64> = fields
            .take(8)
            .map(|f| f.parse().map_err(|_| invalid("bad /proc/stat cpu line")))
            .collect::<io::Result<_>>()?;
        if v.len() < 8 {
            return Err(invalid("too few fields in /proc/stat cpu line"));
        }
        ticks[0] += v[0] + v[1] + v[2];
        ticks[1] += v[5] + v[6];
        ticks[2] += v[7];
        found += 1;
    }
    if found != cpus.len().max(1) {
        return Err(invalid("a CPU asked for has no /proc/stat line"));
    }
    Ok(CpuUsage {
        processes: ticks_to_duration(ticks[0]),
        interrupts: ticks_to_duration(ticks[1]),
        steal: ticks_to_duration(ticks[2]),
    })
}

/// How many files a process may hold open: its soft limit, from `/proc/PID/limits` (`u64::MAX` if unlimited).
pub fn files_limit(pid: u32) -> io::Result<u64> {
    parse_files_limit(&std::fs::read_to_string(format!("/proc/{pid}/limits"))?)
}

/// The soft limit of the `Max open files` line of a `/proc/PID/limits` text.
pub fn parse_files_limit(limits: &str) -> io::Result<u64> {
    let line = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .ok_or_else(|| invalid("no `Max open files` in /proc limits"))?;
    match line.split_ascii_whitespace().next() {
        Some("unlimited") => Ok(u64::MAX),
        Some(n) => n.parse().map_err(|_| invalid("bad open files limit")),
        None => Err(invalid("bad open files limit")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn cpu_usage_sums_the_cpus_asked_for() {
        let stat = "cpu  100 1 20 900 5 2 3 7 0 0\n\
                    cpu0 60 1 10 400 2 1 2 3 0 0\n\
                    cpu1 40 0 10 500 3 1 1 4 0 0\n\
                    intr 12345\n";
        let tick = ticks_to_duration(1);
        let all = parse_cpu_usage(stat, &[]).unwrap();
        assert_eq!(all.processes, tick * 121);
        assert_eq!((all.interrupts, all.steal), (tick * 5, tick * 7));
        let one = parse_cpu_usage(stat, &[1]).unwrap();
        assert_eq!(
            (one.processes, one.interrupts, one.steal),
            (tick * 50, tick * 2, tick * 4)
        );
        let both = parse_cpu_usage(stat, &[0, 1]).unwrap();
        assert_eq!(both.processes, tick * 121);
        assert!(parse_cpu_usage(stat, &[2]).is_err());
        assert!(parse_cpu_usage("cpu0 1 2 3\n", &[0]).is_err());
        assert!(cpu_usage(&[]).is_ok());
    }

    #[test]
    fn parses_a_name_with_spaces_and_parentheses() {
        let line = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 1520 0 3 0 157 42 0 0 20 0 1 0 \
                    12345 10000000 300 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
        let s = parse_stat(line).unwrap();
        assert_eq!(
            s,
            ProcStat {
                state: 'S',
                utime_ticks: 157,
                stime_ticks: 42
            }
        );
        assert!(parse_stat("12 (x) R 1 2").is_err());
        assert!(parse_stat("no parenthesis").is_err());
        assert!(parse_stat("1 (x) R 1 1 1 0 -1 0 0 0 0 0 abc 0").is_err());
    }

    #[test]
    fn own_stat_and_memory() {
        let me = std::process::id();
        assert!(rss_bytes(me).unwrap() > 0);
        assert!(matches!(process_state(me).unwrap(), 'R' | 'S'));
        cpu_time(me).unwrap();
        // Burn a little CPU so the counter is not zero.
        let t0 = self_cpu_time().unwrap();
        let mut x = 0u64;
        let until = Instant::now() + Duration::from_millis(30);
        while Instant::now() < until {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        assert!(self_cpu_time().unwrap() > t0);
        assert!(cpu_time(u32::MAX).is_err());
    }

    #[test]
    fn open_files_and_their_limit() {
        let me = std::process::id();
        let before = open_files(me).unwrap();
        // Other tests open and close a few files meanwhile (sockets, too); two hundred of ours show whatever they
        // do.
        let held: Vec<_> = (0..200)
            .map(|_| std::fs::File::open("/proc/self/stat").unwrap())
            .collect();
        assert!(open_files(me).unwrap() >= before + 180);
        drop(held);
        assert!(files_limit(me).unwrap() >= before);
        let text = "Limit                     Soft Limit           Hard Limit           Units\n\
                    Max processes             95234                95234                processes\n\
                    Max open files            20000                40000                files\n";
        assert_eq!(parse_files_limit(text).unwrap(), 20_000);
        assert_eq!(
            parse_files_limit(
                "Max open files            unlimited            unlimited            files"
            )
            .unwrap(),
            u64::MAX
        );
        assert!(parse_files_limit("Max processes 1 1").is_err());
    }

    #[test]
    fn listening_sockets_are_found_by_port_and_state() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 222 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 333 1 0000000000000000 100 0 0 10 0
";
        assert_eq!(listening_inodes(table, 8080).collect::<Vec<_>>(), ["111"]);
        assert_eq!(listening_inodes(table, 8081).collect::<Vec<_>>(), ["333"]);
        assert_eq!(listening_inodes(table, 80).count(), 0);
    }

    #[test]
    fn this_process_is_seen_listening_on_its_port_and_not_on_another() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(listens_on(std::process::id(), port).unwrap());
        drop(l);
        assert!(!listens_on(std::process::id(), port).unwrap());
    }

    #[test]
    fn udp_drop_counts_are_read_per_socket() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  10: 0100007F:1F90 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 111 2 0000000000000000 0
  11: 0100007F:1F91 00000000:0000 07 00000000:00034000 00:00000000 00000000     0        0 222 2 0000000000000000 4217
";
        assert_eq!(
            socket_drops(table).collect::<Vec<_>>(),
            [("111", 0), ("222", 4217)]
        );
    }

    #[test]
    fn datagrams_a_full_socket_could_not_take_are_counted_as_its_drops() {
        use std::os::fd::AsRawFd;
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let small: libc::c_int = 4096;
        // SAFETY: a valid socket and a pointer to an int of the size given.
        let set = unsafe {
            libc::setsockopt(
                rx.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&small as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0);
        let before = udp_drops(std::process::id()).unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..200 {
            tx.send_to(&[0u8; 512], rx.local_addr().unwrap()).unwrap();
        }
        // Nothing read: the receive buffer holds a few; the kernel dropped the rest and counted them.
        let dropped = udp_drops(std::process::id()).unwrap() - before;
        assert!(dropped >= 150, "{dropped}");
        drop(rx);
    }
}
