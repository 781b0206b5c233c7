//! How long a process's threads waited for a CPU while they could run (`/proc/PID/task/*/schedstat`, second field:
//! time spent runnable on a run queue, nanoseconds). CPU time says how much a process ran; this says how much it
//! wanted to run and could not, because another process (or another thread of its own) held the CPU: the measure of
//! a shared machine's interference, which CPU time cannot show.

use std::io;
use std::time::Duration;

/// The run-queue wait summed over the live threads of `pid` (threads that have exited are not counted).
pub fn run_queue_wait(pid: u32) -> io::Result<Duration> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = task?.path().join("schedstat");
        match std::fs::read_to_string(&path) {
            Ok(line) => total += parse(&line)?,
            // A thread that exited since the directory was read.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Duration::from_nanos(total))
}

/// The wait of one `schedstat` line: `run_ns wait_ns timeslices`.
fn parse(line: &str) -> io::Result<u64> {
    line.split_ascii_whitespace()
        .nth(1)
        .and_then(|w| w.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad schedstat `{line}`"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_this_process() {
        assert_eq!(parse("123 456 7\n").unwrap(), 456);
        assert!(parse("123").is_err());
        assert!(run_queue_wait(std::process::id()).is_ok());
        assert!(run_queue_wait(u32::MAX).is_err());
    }
}
