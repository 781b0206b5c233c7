//! What a process costs, read from the kernel: CPU time and state from `/proc/PID/stat` (clock ticks, usually
//! 10 ms), this process's CPU from `getrusage` (microseconds), resident memory from `/proc/PID/statm`.
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

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
}
