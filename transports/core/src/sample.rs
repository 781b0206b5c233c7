//! CPU time and memory of a process from `/proc`, and a [`Sampler`] that records them over a run.
//!
//! CPU time is `utime + stime` from `/proc/PID/stat` (in clock ticks, usually 10 ms) for other processes, and
//! `getrusage(RUSAGE_SELF)` (microseconds) for this one. Memory is the resident set from `/proc/PID/statm`.

use serde::{Deserialize, Serialize};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

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

/// One sample of the server and of this process.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Milliseconds since the sampler started.
    pub t_ms: u64,
    /// CPU seconds the server has used, summed over every server process sampled (restarts included).
    pub server_cpu_s: f64,
    /// The current server process's resident memory (0 while no server process can be read).
    pub server_rss_bytes: u64,
    /// CPU seconds this process has used.
    pub self_cpu_s: f64,
}

struct State {
    pid: u32,
    /// CPU of the server processes sampled before the current one.
    earlier: Duration,
    /// The current process's CPU at its latest reading.
    current: Duration,
    self_cpu: Duration,
    samples: Vec<Sample>,
}

/// Samples the CPU and memory of a server process (which may be replaced) and of this process at a fixed interval.
#[derive(Debug)]
pub struct Sampler {
    state: Arc<Mutex<State>>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "State(pid {}, {} samples)", self.pid, self.samples.len())
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // Sampling code does not panic while holding the lock; tolerate poison anyway rather than lose the samples.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl Sampler {
    /// Start sampling `pid` and this process every `interval` (the first sample at once). Needs a tokio runtime.
    pub fn start(pid: u32, interval: Duration) -> Sampler {
        let state = Arc::new(Mutex::new(State {
            pid,
            earlier: Duration::ZERO,
            current: Duration::ZERO,
            self_cpu: Duration::ZERO,
            samples: Vec::new(),
        }));
        let (stop, mut stopped) = oneshot::channel();
        let shared = state.clone();
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval.max(Duration::from_millis(1)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => sample(&shared, started),
                    // A stop request, or the sampler dropped.
                    _ = &mut stopped => break,
                }
            }
            sample(&shared, started);
        });
        Sampler {
            state,
            stop: Some(stop),
            task,
        }
    }

    /// Follow a new server process (after a restart). Its CPU is added to what the earlier ones used.
    ///
    /// The old process is read one last time if it can still be (not yet reaped); otherwise its latest sample
    /// stands.
    pub fn set_pid(&self, pid: u32) {
        let mut guard = lock(&self.state);
        let s = &mut *guard;
        if s.pid == pid {
            return;
        }
        if let Ok(t) = cpu_time(s.pid) {
            s.current = s.current.max(t);
        }
        s.earlier += s.current;
        s.current = Duration::ZERO;
        s.pid = pid;
    }

    /// The samples so far.
    pub fn samples(&self) -> Vec<Sample> {
        lock(&self.state).samples.clone()
    }

    /// Take a last sample, stop, and return every sample.
    pub async fn stop(mut self) -> Vec<Sample> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
        std::mem::take(&mut lock(&self.state).samples)
    }
}

/// Take one sample: read `/proc` outside the lock, then record.
fn sample(state: &Mutex<State>, started: Instant) {
    let pid = lock(state).pid;
    let server_cpu = cpu_time(pid).ok();
    let rss = rss_bytes(pid).unwrap_or(0);
    let self_cpu = self_cpu_time().ok();
    let mut guard = lock(state);
    let s = &mut *guard;
    if s.pid == pid {
        // A dead process keeps its last reading; CPU time never goes backwards.
        if let Some(t) = server_cpu {
            s.current = s.current.max(t);
        }
    }
    if let Some(t) = self_cpu {
        s.self_cpu = s.self_cpu.max(t);
    }
    let sample = Sample {
        t_ms: started.elapsed().as_millis() as u64,
        server_cpu_s: (s.earlier + s.current).as_secs_f64(),
        server_rss_bytes: if s.pid == pid { rss } else { 0 },
        self_cpu_s: s.self_cpu.as_secs_f64(),
    };
    s.samples.push(sample);
}

/// CPU seconds used by the server and by this process between `from_ms` and `to_ms` (sampler time), linearly
/// interpolated between samples and clamped to the sampled range.
pub fn cpu_between(samples: &[Sample], from_ms: u64, to_ms: u64) -> (f64, f64) {
    let server = |s: &Sample| s.server_cpu_s;
    let this = |s: &Sample| s.self_cpu_s;
    (
        value_at(samples, to_ms, server) - value_at(samples, from_ms, server),
        value_at(samples, to_ms, this) - value_at(samples, from_ms, this),
    )
}

fn value_at(samples: &[Sample], t_ms: u64, field: impl Fn(&Sample) -> f64) -> f64 {
    let after = samples.partition_point(|s| s.t_ms <= t_ms);
    match (
        after.checked_sub(1).map(|i| &samples[i]),
        samples.get(after),
    ) {
        (None, None) => 0.0,
        (None, Some(first)) => field(first),
        (Some(last), None) => field(last),
        (Some(a), Some(b)) => {
            let span = (b.t_ms - a.t_ms) as f64;
            let frac = if span > 0.0 {
                (t_ms - a.t_ms) as f64 / span
            } else {
                0.0
            };
            field(a) + (field(b) - field(a)) * frac
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    struct Busy(std::process::Child);

    impl Busy {
        fn start() -> Busy {
            Busy(
                std::process::Command::new("/bin/sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
                    .unwrap(),
            )
        }
        fn pid(&self) -> u32 {
            self.0.id()
        }
    }

    impl Drop for Busy {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn cpu_of_a_busy_child_grows() {
        let busy = Busy::start();
        let t0 = cpu_time(busy.pid()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let t1 = cpu_time(busy.pid()).unwrap();
        assert!(t1 > t0, "{t0:?} -> {t1:?}");
        assert!(rss_bytes(busy.pid()).unwrap() > 0);
    }

    #[tokio::test]
    async fn sampler_sums_cpu_across_restarts() {
        let first = Busy::start();
        let sampler = Sampler::start(first.pid(), Duration::from_millis(20));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = sampler.samples();
        let first_cpu = before.last().unwrap().server_cpu_s;
        assert!(first_cpu > 0.0);
        drop(first);
        let second = Busy::start();
        sampler.set_pid(second.pid());
        tokio::time::sleep(Duration::from_millis(200)).await;
        let samples = sampler.stop().await;
        drop(second);
        assert!(samples.len() >= 5, "{}", samples.len());
        assert!(samples.windows(2).all(|w| w[0].t_ms <= w[1].t_ms
            && w[0].server_cpu_s <= w[1].server_cpu_s
            && w[0].self_cpu_s <= w[1].self_cpu_s));
        assert!(samples.last().unwrap().server_cpu_s > first_cpu);
        assert!(samples.last().unwrap().server_rss_bytes > 0);
    }

    #[test]
    fn cpu_between_interpolates() {
        let s = |t_ms, server_cpu_s, self_cpu_s| Sample {
            t_ms,
            server_cpu_s,
            server_rss_bytes: 0,
            self_cpu_s,
        };
        let samples = [s(0, 0.0, 1.0), s(100, 1.0, 1.5), s(200, 3.0, 2.0)];
        assert_eq!(cpu_between(&samples, 0, 200), (3.0, 1.0));
        assert_eq!(cpu_between(&samples, 50, 150), (1.5, 0.5));
        assert_eq!(cpu_between(&samples, 150, 1000), (1.0, 0.25));
        assert_eq!(cpu_between(&[], 0, 10), (0.0, 0.0));
    }
}
