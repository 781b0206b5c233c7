//! Pinning: the server and the load generator on separate CPUs, so that neither takes the other's time unseen.
//!
//! Of the CPUs this process may run on, the server gets the first and the load generator (every thread of the
//! runner: the tokio workers, the link emulator, the sampler) the rest. With fewer than two CPUs, or with
//! `--pin off`, nothing is pinned. What was done is recorded in every result's provenance ([`Pinning`]), and the
//! server child is pinned between fork and exec ([`pin_command`]), so a server restarted mid-run lands on the same
//! CPU, and so does an external broker the server starts (it inherits the mask).

use serde::{Deserialize, Serialize};
use std::io;

/// How the server and the load generator were placed on CPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Pinning {
    /// `separate` (pinned to disjoint CPUs), `off` (asked not to pin), `one-cpu` (fewer than two CPUs available),
    /// or empty in results from before pinning was recorded.
    pub mode: String,
    /// The CPUs the server may run on (empty: not pinned).
    pub server_cpus: Vec<usize>,
    /// The CPUs the load generator may run on (empty: not pinned).
    pub generator_cpus: Vec<usize>,
}

impl Pinning {
    /// Whether server and generator were pinned to separate CPUs.
    pub fn separate(&self) -> bool {
        self.mode == "separate"
    }

    /// The CPUs server and generator were pinned to, together; empty when either was not pinned (every CPU).
    pub fn cpus_in_use(&self) -> Vec<usize> {
        if self.server_cpus.is_empty() || self.generator_cpus.is_empty() {
            return Vec::new();
        }
        let mut cpus: Vec<usize> = self
            .server_cpus
            .iter()
            .chain(&self.generator_cpus)
            .copied()
            .collect();
        cpus.sort_unstable();
        cpus.dedup();
        cpus
    }

    /// How many CPUs the load generator may use: its pinned set, or every CPU of the machine when not pinned.
    pub fn generator_cpu_count(&self) -> usize {
        if self.generator_cpus.is_empty() {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            self.generator_cpus.len()
        }
    }
}

/// Decide the placement from the CPUs this process may run on: pinned when `enabled` and there are at least two,
/// the server on the first of them.
pub fn plan(enabled: bool) -> io::Result<Pinning> {
    if enabled {
        plan_server_on(None)
    } else {
        Ok(Pinning {
            mode: "off".into(),
            ..Pinning::default()
        })
    }
}

/// Pinned where there are at least two CPUs this process may run on: the server on CPU `server` (one of them), or
/// on the first of them (`None`), and the load generator on the others. Two CPUs of one virtual machine need not be
/// equally fast, so a comparison of the server's and the generator's CPU time can be repeated with them swapped.
pub fn plan_server_on(server: Option<usize>) -> io::Result<Pinning> {
    let cpus = allowed_cpus()?;
    if let Some(s) = server.filter(|s| !cpus.contains(s)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {s} is not one this process may run on ({cpus:?})"),
        ));
    }
    if cpus.len() < 2 {
        return Ok(Pinning {
            mode: "one-cpu".into(),
            ..Pinning::default()
        });
    }
    let server = server.unwrap_or(cpus[0]);
    Ok(Pinning {
        mode: "separate".into(),
        server_cpus: vec![server],
        generator_cpus: cpus.into_iter().filter(|&c| c != server).collect(),
    })
}

/// The CPUs the calling thread may run on (`sched_getaffinity`).
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the pointer and size describe `set`.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: the index is below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// A CPU set of `cpus`; an error if it is empty or names a CPU beyond the set's size.
fn cpu_set(cpus: &[usize]) -> io::Result<libc::cpu_set_t> {
    if cpus.is_empty() || cpus.iter().any(|&c| c >= libc::CPU_SETSIZE as usize) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no valid CPU set in {cpus:?}"),
        ));
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: the index was checked against CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    Ok(set)
}

fn set_affinity(tid: libc::pid_t, set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: the pointer and size describe a valid cpu_set_t.
    if unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Pin every thread of this process to `cpus`; threads started later inherit the mask of the thread that starts
/// them, so calling this before the runtime starts covers them too.
pub fn pin_this_process(cpus: &[usize]) -> io::Result<()> {
    let set = cpu_set(cpus)?;
    for task in std::fs::read_dir("/proc/self/task")? {
        let tid: libc::pid_t = match task?.file_name().to_str().and_then(|s| s.parse().ok()) {
            Some(tid) => tid,
            None => continue,
        };
        match set_affinity(tid, &set) {
            Ok(()) => {}
            // A thread that exited since the directory was read.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Make a child started from `cmd` run on `cpus` only, set in the child before it executes the program.
pub fn pin_command(cmd: &mut tokio::process::Command, cpus: &[usize]) -> io::Result<()> {
    let set = cpu_set(cpus)?;
    // SAFETY: the closure runs between fork and exec and only makes one system call on a set built before the fork
    // (no allocation, no lock).
    unsafe {
        cmd.pre_exec(move || set_affinity(0, &set));
    }
    Ok(())
}

/// The CPUs a process (or thread) may run on, from `/proc/PID/status` (`Cpus_allowed_list`).
pub fn cpus_of(pid: u32) -> io::Result<Vec<usize>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .ok_or_else(|| io::Error::other("no Cpus_allowed_list"))?;
    parse_list(list.trim())
}

/// Parse a kernel CPU list such as `0-2,5`.
pub fn parse_list(list: &str) -> io::Result<Vec<usize>> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("bad CPU list `{list}`"));
    let mut out = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (
            a.trim().parse().map_err(|_| bad())?,
            b.trim().parse().map_err(|_| bad())?,
        );
        if b < a {
            return Err(bad());
        }
        out.extend(a..=b);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_list("0-2,5").unwrap(), vec![0, 1, 2, 5]);
        assert_eq!(parse_list("3").unwrap(), vec![3]);
        assert!(parse_list("2-1").is_err());
        assert!(parse_list("x").is_err());
    }

    #[test]
    fn a_plan_splits_the_allowed_cpus() {
        let cpus = allowed_cpus().unwrap();
        assert_eq!(cpus, cpus_of(std::process::id()).unwrap());
        let p = plan(true).unwrap();
        if cpus.len() >= 2 {
            assert!(p.separate());
            assert_eq!(p.server_cpus, vec![cpus[0]]);
            assert_eq!(p.generator_cpus, cpus[1..].to_vec());
        } else {
            assert_eq!(p.mode, "one-cpu");
        }
        assert_eq!(plan(false).unwrap().mode, "off");
        assert!(cpu_set(&[]).is_err());
    }

    #[test]
    fn the_server_goes_on_the_cpu_asked_for() {
        let cpus = allowed_cpus().unwrap();
        let last = *cpus.last().unwrap();
        let p = plan_server_on(Some(last)).unwrap();
        if cpus.len() >= 2 {
            assert_eq!(p.server_cpus, vec![last]);
            assert_eq!(p.generator_cpus, cpus[..cpus.len() - 1].to_vec());
        }
        let absent = cpus.iter().max().unwrap() + 1;
        let e = plan_server_on(Some(absent)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains(&format!("CPU {absent}")), "{e}");
    }

    #[tokio::test]
    async fn a_pinned_child_runs_on_its_cpu() {
        let cpus = allowed_cpus().unwrap();
        let last = *cpus.last().unwrap();
        let mut cmd = tokio::process::Command::new("sleep");
        cmd.arg("5").kill_on_drop(true);
        pin_command(&mut cmd, &[last]).unwrap();
        let child = cmd.spawn().unwrap();
        assert_eq!(cpus_of(child.id().unwrap()).unwrap(), vec![last]);
    }
}
