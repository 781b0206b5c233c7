//! A [`Sampler`] that records the CPU time and memory of a server process and of this process over a run, read
//! with [`transport_core::procfs`].

use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
pub use transport_core::procfs::{cpu_time, process_state, rss_bytes, self_cpu_time};
use transport_core::procfs::{cpu_usage, CpuUsage};

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
    /// Seconds the server's threads waited for a CPU while they could run, summed like its CPU ([`crate::sched`]).
    #[serde(default)]
    pub server_wait_s: f64,
    /// Seconds this process's threads waited for a CPU while they could run.
    #[serde(default)]
    pub self_wait_s: f64,
    /// CPU seconds charged to every process on the CPUs sampled (this process and the server among them).
    #[serde(default)]
    pub machine_processes_s: f64,
    /// Seconds those CPUs spent in interrupts, charged to no process.
    #[serde(default)]
    pub machine_interrupts_s: f64,
    /// Seconds the hypervisor took those CPUs away.
    #[serde(default)]
    pub machine_steal_s: f64,
}

struct State {
    pid: u32,
    /// CPU of the server processes sampled before the current one.
    earlier: Duration,
    /// The current process's CPU at its latest reading.
    current: Duration,
    self_cpu: Duration,
    /// Run-queue waits, kept as the CPU times are.
    wait_earlier: Duration,
    wait_current: Duration,
    self_wait: Duration,
    /// The CPUs whose `/proc/stat` lines are read (every CPU when empty), and their first reading.
    cpus: Vec<usize>,
    machine_start: Option<CpuUsage>,
    machine: CpuUsage,
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
    /// Start sampling `pid` and this process every `interval` (the first sample at once), and every CPU of the
    /// machine. Needs a tokio runtime.
    pub fn start(pid: u32, interval: Duration) -> Sampler {
        Sampler::start_on(pid, interval, Vec::new())
    }

    /// [`start`](Sampler::start), reading the machine's figures of the CPUs `cpus` only (the ones server and
    /// generator are pinned to; every CPU when empty).
    pub fn start_on(pid: u32, interval: Duration, cpus: Vec<usize>) -> Sampler {
        let state = Arc::new(Mutex::new(State {
            pid,
            earlier: Duration::ZERO,
            current: Duration::ZERO,
            self_cpu: Duration::ZERO,
            wait_earlier: Duration::ZERO,
            wait_current: Duration::ZERO,
            self_wait: Duration::ZERO,
            cpus,
            machine_start: None,
            machine: CpuUsage::default(),
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
        if let Ok(w) = crate::sched::run_queue_wait(s.pid) {
            s.wait_current = s.wait_current.max(w);
        }
        s.wait_earlier += s.wait_current;
        s.wait_current = Duration::ZERO;
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
    let (pid, cpus) = {
        let s = lock(state);
        (s.pid, s.cpus.clone())
    };
    let machine = cpu_usage(&cpus).ok();
    let server_cpu = cpu_time(pid).ok();
    let rss = rss_bytes(pid).unwrap_or(0);
    let self_cpu = self_cpu_time().ok();
    let server_wait = crate::sched::run_queue_wait(pid).ok();
    let self_wait = crate::sched::run_queue_wait(std::process::id()).ok();
    let mut guard = lock(state);
    let s = &mut *guard;
    if s.pid == pid {
        // A dead process keeps its last reading; CPU time never goes backwards.
        if let Some(t) = server_cpu {
            s.current = s.current.max(t);
        }
        if let Some(w) = server_wait {
            s.wait_current = s.wait_current.max(w);
        }
    }
    if let Some(w) = self_wait {
        s.self_wait = s.self_wait.max(w);
    }
    if let Some(t) = self_cpu {
        s.self_cpu = s.self_cpu.max(t);
    }
    if let Some(m) = machine {
        // Counted from the first reading, so a sample says what the CPUs did since the sampler started.
        let start = *s.machine_start.get_or_insert(m);
        s.machine = CpuUsage {
            processes: m.processes.saturating_sub(start.processes),
            interrupts: m.interrupts.saturating_sub(start.interrupts),
            steal: m.steal.saturating_sub(start.steal),
        };
    }
    let sample = Sample {
        t_ms: started.elapsed().as_millis() as u64,
        server_cpu_s: (s.earlier + s.current).as_secs_f64(),
        server_rss_bytes: if s.pid == pid { rss } else { 0 },
        self_cpu_s: s.self_cpu.as_secs_f64(),
        server_wait_s: (s.wait_earlier + s.wait_current).as_secs_f64(),
        self_wait_s: s.self_wait.as_secs_f64(),
        machine_processes_s: s.machine.processes.as_secs_f64(),
        machine_interrupts_s: s.machine.interrupts.as_secs_f64(),
        machine_steal_s: s.machine.steal.as_secs_f64(),
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

/// Seconds the server and this process waited for a CPU between `from_ms` and `to_ms`, as [`cpu_between`].
pub fn wait_between(samples: &[Sample], from_ms: u64, to_ms: u64) -> (f64, f64) {
    let server = |s: &Sample| s.server_wait_s;
    let this = |s: &Sample| s.self_wait_s;
    (
        value_at(samples, to_ms, server) - value_at(samples, from_ms, server),
        value_at(samples, to_ms, this) - value_at(samples, from_ms, this),
    )
}

/// What the sampled CPUs did between `from_ms` and `to_ms`, as [`cpu_between`], in CPU seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MachineUse {
    /// Charged to processes other than the server and this process (never below zero: clock ticks are coarser
    /// than the processes' own CPU times).
    pub others_s: f64,
    /// Interrupts, charged to no process (the kernel's packet processing among them).
    pub interrupts_s: f64,
    /// Taken by the hypervisor.
    pub steal_s: f64,
}

/// [`MachineUse`] between `from_ms` and `to_ms`.
pub fn machine_between(samples: &[Sample], from_ms: u64, to_ms: u64) -> MachineUse {
    let between = |field: fn(&Sample) -> f64| {
        value_at(samples, to_ms, field) - value_at(samples, from_ms, field)
    };
    let (server, this) = cpu_between(samples, from_ms, to_ms);
    MachineUse {
        others_s: (between(|s| s.machine_processes_s) - server - this).max(0.0),
        interrupts_s: between(|s| s.machine_interrupts_s).max(0.0),
        steal_s: between(|s| s.machine_steal_s).max(0.0),
    }
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

    #[tokio::test]
    async fn a_process_neither_server_nor_generator_shows_as_others() {
        let idle = Reaped(
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap(),
        );
        let busy = Busy::start();
        let sampler = Sampler::start(idle.0.id(), Duration::from_millis(20));
        tokio::time::sleep(Duration::from_millis(600)).await;
        let samples = sampler.stop().await;
        drop((busy, idle));
        let last = samples.last().unwrap().t_ms;
        let m = machine_between(&samples, 0, last);
        // The busy loop ran for most of 600 ms on some CPU; the server (asleep) and this test hardly ran.
        assert!(m.others_s > 0.1, "{m:?}");
        assert!(m.steal_s >= 0.0 && m.interrupts_s >= 0.0);
    }

    /// A child killed and reaped when dropped.
    struct Reaped(std::process::Child);

    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn cpu_between_interpolates() {
        let s = |t_ms, server_cpu_s, self_cpu_s| Sample {
            t_ms,
            server_cpu_s,
            server_rss_bytes: 0,
            self_cpu_s,
            server_wait_s: server_cpu_s / 2.0,
            self_wait_s: 0.0,
            machine_processes_s: 0.0,
            machine_interrupts_s: 0.0,
            machine_steal_s: 0.0,
        };
        let samples = [s(0, 0.0, 1.0), s(100, 1.0, 1.5), s(200, 3.0, 2.0)];
        assert_eq!(cpu_between(&samples, 0, 200), (3.0, 1.0));
        assert_eq!(cpu_between(&samples, 50, 150), (1.5, 0.5));
        assert_eq!(cpu_between(&samples, 150, 1000), (1.0, 0.25));
        assert_eq!(cpu_between(&[], 0, 10), (0.0, 0.0));
        assert_eq!(wait_between(&samples, 0, 200), (1.5, 0.0));
    }
}
