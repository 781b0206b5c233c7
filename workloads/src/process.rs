//! Child processes the runner starts, controls and never leaves behind: servers (`runner serve`) and load-generator
//! workers (`runner worker`, see [`crate::worker`]).
//!
//! # The contract with a child (`runner serve` and `runner worker` keep it)
//!
//! - The first line the child writes on stdout is `{"ready": ...}` (a server's is a [`ReadyLine`]), or
//!   `{"error": "..."}` if it could not start.
//! - After that, each command line written to its stdin (a server's: `stats`) is answered by one JSON object on one
//!   line of stdout.
//! - End of file on stdin means the child should exit; a server may write its statistics one last time first, and
//!   [`ServerProcess::shutdown`] keeps them ([`ServerProcess::last_stats`]).
//! - Its stderr is the runner's stderr.
//!
//! A [`ControlledProcess`] is generic over what its ready line carries; a [`ServerProcess`] is one whose ready line
//! is a [`ReadyLine`].
//!
//! # Never leaving one behind
//!
//! Three mechanisms cover the ways the runner can end:
//!
//! - Dropping a [`ControlledProcess`] (an error path, a panic unwinding) sends SIGKILL; tokio reaps the child in the
//!   background, so the runtime never blocks.
//! - [`install_cleanup`] makes SIGINT, SIGTERM and SIGHUP, and any panic, SIGKILL every live child first.
//! - Each child asks the kernel (`PR_SET_PDEATHSIG`) to be sent SIGKILL when the runner dies, even by SIGKILL, when
//!   no code of ours runs at all.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::{timeout, timeout_at, Instant};

/// What a server reports when it is listening.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyLine {
    /// The transport spec it serves, e.g. `pure:plain`.
    pub transport: String,
    /// The bound address.
    pub addr: SocketAddr,
    /// Its public key (hex) or certificate fingerprint.
    pub public_key: String,
    /// Its process id.
    pub pid: u32,
    /// The process that does the serving when it is not this one (an external broker it started): the one whose
    /// CPU and memory are sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving_pid: Option<u32>,
}

/// A child's first line: `{"ready": {...}}` (a server's carries a [`ReadyLine`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReadyMessage<R = ReadyLine> {
    /// What the child reports.
    pub ready: R,
}

/// A child's first line when it could not start: `{"error": "..."}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorMessage {
    /// Why, in one line.
    pub error: String,
}

/// How long [`ControlledProcess::stats`] waits for an answer. A saturated server on two shared cores (a flood at its
/// limit) took more than 5 s to answer its control line; a server that does not answer in 20 s is failing.
pub const STATS_TIMEOUT: Duration = Duration::from_secs(20);
/// How long [`ControlledProcess::shutdown`] waits for the child to exit on its own.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// How much of a bad line an error quotes.
const QUOTE_LIMIT: usize = 200;

/// Errors starting and controlling a child process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The program could not be started.
    #[error("cannot start `{program}`: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The operating system's error.
        source: io::Error,
    },
    /// The child exited before it wrote its ready line.
    #[error("process exited with {status} before it was ready")]
    ExitedBeforeReady {
        /// How it ended, e.g. `status 2` or `signal 9`.
        status: String,
    },
    /// The child reported that it could not start (`{"error": "..."}`), and was reaped or killed.
    #[error("process could not start: {message}")]
    StartFailed {
        /// What it reported.
        message: String,
    },
    /// The child wrote no ready line in time, and was killed.
    #[error("process (pid {pid}) was not ready within {after:?}; killed it")]
    ReadyTimeout {
        /// The pid.
        pid: u32,
        /// The timeout.
        after: Duration,
    },
    /// The child's first line is not a ready line; it was killed.
    #[error("process's first line is not a ready line ({reason}): {line}")]
    BadReady {
        /// The line (shortened).
        line: String,
        /// Why it does not parse.
        reason: String,
    },
    /// The child did not answer a command (`stats`, ...) in time.
    #[error("process (pid {pid}) did not answer within {after:?}")]
    StatsTimeout {
        /// The pid.
        pid: u32,
        /// The timeout.
        after: Duration,
    },
    /// The answer to a command is not a JSON object.
    #[error("process's answer is not a JSON object ({reason}): {line}")]
    BadStats {
        /// The line (shortened).
        line: String,
        /// Why it does not parse.
        reason: String,
    },
    /// The child closed its stdout: it exited or is exiting.
    #[error("process (pid {pid}) closed its output")]
    Closed {
        /// The pid.
        pid: u32,
    },
    /// The child was killed, shut down or has exited, and was reaped.
    #[error("process (pid {pid}) is no longer running")]
    NotRunning {
        /// The pid.
        pid: u32,
    },
    /// A command to send is not one line.
    #[error("a command must be one line: {0:?}")]
    BadCommand(String),
    /// Talking to the child, signalling it or waiting for it failed.
    #[error("{what} process (pid {pid}): {source}")]
    Io {
        /// The pid.
        pid: u32,
        /// What was being done.
        what: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// The signal handlers that kill children at exit could not be installed.
    #[error("cannot install the cleanup of child processes: {0}")]
    Cleanup(io::Error),
}

/// Live children (started and not yet reaped), for the signal handler and the panic hook: each pid with, where the
/// kernel has them (Linux 5.3 and later), a pidfd. A pidfd names that one process, so a signal sent through it can
/// never reach another process that was given the same pid after ours was reaped; without one, the pid is signalled
/// and the registry relies on every pid leaving it before its child is reaped.
static LIVE: Mutex<BTreeMap<u32, Option<OwnedFd>>> = Mutex::new(BTreeMap::new());

fn live() -> MutexGuard<'static, BTreeMap<u32, Option<OwnedFd>>> {
    // Nothing panics while holding the lock; a poisoned set is still the right set.
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// A pidfd for `pid` (our unreaped child, so it is still ours), or `None` where the kernel has no pidfd_open.
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new file descriptor or -1; nothing else is touched.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative result is a new descriptor that nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn register(pid: u32) {
    let fd = pidfd_open(pid);
    live().insert(pid, fd);
}

fn unregister(pid: u32) {
    live().remove(&pid);
}

/// The pids of the child processes (servers, workers) started and not yet killed, shut down or dropped.
pub fn live_pids() -> Vec<u32> {
    live().keys().copied().collect()
}

fn kill_all(live: &BTreeMap<u32, Option<OwnedFd>>) {
    for (&pid, fd) in live {
        match fd {
            // SAFETY: pidfd_send_signal with a valid pidfd, no siginfo and no flags has no memory effects; it fails
            // harmlessly (ESRCH) if the process is already gone.
            Some(fd) => unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            },
            // SAFETY: kill has no memory effects. The pid is our unreaped child (see `LIVE`).
            None => unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            },
        }
    }
}

/// SIGKILL every live child process (servers and workers).
pub fn kill_all_servers() {
    kill_all(&live());
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        (None, None) => status.to_string(),
    }
}

fn quote(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end();
    match text.char_indices().nth(QUOTE_LIMIT) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    }
}

/// A running server: a child whose ready line is a [`ReadyLine`].
pub type ServerProcess = ControlledProcess<ReadyLine>;

/// A running child process that keeps the contract of the module doc; its ready line carries an `R`.
#[derive(Debug)]
pub struct ControlledProcess<R = ReadyLine> {
    child: Child,
    pid: u32,
    ready: R,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// A line being read; kept across a timeout so that no byte is lost.
    line: Vec<u8>,
    /// Commands sent and not yet answered, ours included while one is in flight.
    unanswered: u32,
    /// Set once the child has been reaped: its pid may belong to another process from then on.
    status: Option<ExitStatus>,
    /// The latest statistics the server wrote (an answer to `stats`, or its last word at shutdown).
    last_stats: Option<serde_json::Value>,
}

impl<R: DeserializeOwned> ControlledProcess<R> {
    /// Start a child and wait up to `ready_timeout` for its ready line.
    ///
    /// Stdin and stdout are piped, stderr is inherited. The child is killed if the runner dies (see the module
    /// doc). Call this from a task on a runtime whose threads live as long as the child should: the kernel sends
    /// the death signal when the *thread* that started the child exits, so not from `spawn_blocking`.
    pub async fn start(mut cmd: Command, ready_timeout: Duration) -> Result<Self, ProcessError> {
        let program = cmd.as_std().get_program().to_string_lossy().into_owned();
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe calls are
        // allowed: prctl and getppid are plain system calls, and the errors are built without allocating.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) == -1
                {
                    return Err(io::Error::last_os_error());
                }
                // The runner died before the prctl took effect: the signal will never come, so do not start.
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| ProcessError::Spawn {
            program: program.clone(),
            source,
        })?;
        let spawn_err = |what| ProcessError::Spawn {
            program: program.clone(),
            source: io::Error::other(what),
        };
        let pid = child.id().ok_or_else(|| spawn_err("no pid"))?;
        register(pid);
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = kill_and_reap(&mut child, pid).await;
            return Err(spawn_err("no pipes"));
        };
        let mut stdout = BufReader::new(stdout);
        let mut line = Vec::new();
        let read = timeout(ready_timeout, stdout.read_until(b'\n', &mut line)).await;
        let ready = match read {
            Err(_) => {
                let _ = kill_and_reap(&mut child, pid).await;
                return Err(ProcessError::ReadyTimeout {
                    pid,
                    after: ready_timeout,
                });
            }
            Ok(Err(source)) => {
                let _ = kill_and_reap(&mut child, pid).await;
                return Err(ProcessError::Io {
                    pid,
                    what: "reading the ready line of",
                    source,
                });
            }
            Ok(Ok(0)) => {
                // Stdout closed: normally the child exited. Give it a moment to be reaped, then make sure.
                let status = match timeout(Duration::from_secs(1), child.wait()).await {
                    Ok(Ok(status)) => {
                        unregister(pid);
                        Ok(status)
                    }
                    _ => kill_and_reap(&mut child, pid).await,
                };
                return Err(match status {
                    Ok(status) => ProcessError::ExitedBeforeReady {
                        status: describe(status),
                    },
                    Err(source) => ProcessError::Io {
                        pid,
                        what: "waiting for",
                        source,
                    },
                });
            }
            Ok(Ok(_)) => match serde_json::from_slice::<ReadyMessage<R>>(&line) {
                Ok(message) => message.ready,
                Err(e) => {
                    let _ = kill_and_reap(&mut child, pid).await;
                    return Err(match serde_json::from_slice::<ErrorMessage>(&line) {
                        Ok(failed) => ProcessError::StartFailed {
                            message: failed.error,
                        },
                        Err(_) => ProcessError::BadReady {
                            line: quote(&line),
                            reason: e.to_string(),
                        },
                    });
                }
            },
        };
        line.clear();
        Ok(ControlledProcess {
            child,
            pid,
            ready,
            stdin: Some(stdin),
            stdout,
            line,
            unanswered: 0,
            status: None,
            last_stats: None,
        })
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// What the child reported when it was ready.
    pub fn ready(&self) -> &R {
        &self.ready
    }

    fn signal(&self, sig: libc::c_int, what: &'static str) -> Result<(), ProcessError> {
        if self.status.is_some() {
            return Err(ProcessError::NotRunning { pid: self.pid });
        }
        // SAFETY: kill has no memory effects; the child is not reaped, so the pid is still ours.
        if unsafe { libc::kill(self.pid as libc::pid_t, sig) } == 0 {
            Ok(())
        } else {
            Err(ProcessError::Io {
                pid: self.pid,
                what,
                source: io::Error::last_os_error(),
            })
        }
    }

    /// Stop the child (SIGSTOP): it keeps its sockets but runs no code until [`ControlledProcess::cont`].
    pub fn stop(&self) -> Result<(), ProcessError> {
        self.signal(libc::SIGSTOP, "stopping")
    }

    /// Let a stopped child continue (SIGCONT).
    pub fn cont(&self) -> Result<(), ProcessError> {
        self.signal(libc::SIGCONT, "continuing")
    }

    /// Kill the child (SIGKILL, which also ends a stopped process) and reap it.
    pub async fn kill(&mut self) -> Result<ExitStatus, ProcessError> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let status = kill_and_reap(&mut self.child, self.pid)
            .await
            .map_err(|source| ProcessError::Io {
                pid: self.pid,
                what: "killing",
                source,
            })?;
        self.status = Some(status);
        Ok(status)
    }

    /// Whether the child has exited (reaping it if so), without waiting.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, ProcessError> {
        if self.status.is_some() {
            return Ok(self.status);
        }
        let status = self.child.try_wait().map_err(|source| ProcessError::Io {
            pid: self.pid,
            what: "waiting for",
            source,
        })?;
        if status.is_some() {
            unregister(self.pid);
            self.status = status;
        }
        Ok(status)
    }

    /// Ask the child for its statistics (`stats`), waiting up to [`STATS_TIMEOUT`].
    pub async fn stats(&mut self) -> Result<serde_json::Value, ProcessError> {
        self.stats_within(STATS_TIMEOUT).await
    }

    /// Ask the child for its statistics (`stats`), waiting up to `limit`.
    pub async fn stats_within(
        &mut self,
        limit: Duration,
    ) -> Result<serde_json::Value, ProcessError> {
        self.request_within("stats", limit).await
    }

    /// Send `command` (one line) and wait up to `limit` for its answer, one JSON object.
    ///
    /// An answer that comes after its request timed out is recognised and skipped by the next request, so
    /// answers never get out of step with requests.
    pub async fn request_within(
        &mut self,
        command: &str,
        limit: Duration,
    ) -> Result<serde_json::Value, ProcessError> {
        if command.contains(['\n', '\r']) {
            return Err(ProcessError::BadCommand(command.to_string()));
        }
        let pid = self.pid;
        if self.status.is_some() {
            return Err(ProcessError::NotRunning { pid });
        }
        let deadline = Instant::now() + limit;
        let timed_out = ProcessError::StatsTimeout { pid, after: limit };
        let stdin = self
            .stdin
            .as_mut()
            .ok_or(ProcessError::NotRunning { pid })?;
        let io_err = |source| ProcessError::Io {
            pid,
            what: "sending a command to",
            source,
        };
        let line = format!("{command}\n");
        match timeout_at(deadline, stdin.write_all(line.as_bytes())).await {
            Err(_) => return Err(timed_out),
            Ok(Err(e)) if e.kind() == io::ErrorKind::BrokenPipe => {
                return Err(ProcessError::Closed { pid })
            }
            Ok(Err(e)) => return Err(io_err(e)),
            Ok(Ok(())) => {}
        }
        self.unanswered += 1;
        loop {
            // `read_until` keeps what it has read in `self.line` if the timeout cancels it.
            match timeout_at(deadline, self.stdout.read_until(b'\n', &mut self.line)).await {
                Err(_) => return Err(timed_out),
                Ok(Err(e)) => return Err(io_err(e)),
                Ok(Ok(0)) => return Err(ProcessError::Closed { pid }),
                Ok(Ok(_)) if !self.line.ends_with(b"\n") => continue,
                Ok(Ok(_)) => {}
            }
            let line = std::mem::take(&mut self.line);
            self.unanswered -= 1;
            if self.unanswered > 0 {
                continue; // the late answer to an earlier request
            }
            return match serde_json::from_slice::<serde_json::Value>(&line) {
                Ok(value) if value.is_object() => {
                    self.last_stats = Some(value.clone());
                    Ok(value)
                }
                Ok(_) => Err(ProcessError::BadStats {
                    line: quote(&line),
                    reason: "not an object".into(),
                }),
                Err(e) => Err(ProcessError::BadStats {
                    line: quote(&line),
                    reason: e.to_string(),
                }),
            };
        }
    }

    /// Close the child's stdin (asking it to exit), wait up to [`SHUTDOWN_GRACE`], then kill it.
    pub async fn shutdown(&mut self) -> Result<ExitStatus, ProcessError> {
        self.shutdown_within(SHUTDOWN_GRACE).await
    }

    /// Close the child's stdin, wait up to `grace` (keeping the statistics a server writes as it exits), then kill
    /// it.
    pub async fn shutdown_within(&mut self, grace: Duration) -> Result<ExitStatus, ProcessError> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        drop(self.stdin.take());
        let deadline = Instant::now() + grace;
        // Its last lines: late answers to earlier requests, then its last word. Only whole lines count.
        while let Ok(Ok(n)) =
            timeout_at(deadline, self.stdout.read_until(b'\n', &mut self.line)).await
        {
            if n == 0 {
                break;
            }
            if !self.line.ends_with(b"\n") {
                continue;
            }
            let line = std::mem::take(&mut self.line);
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&line) {
                if value.is_object() {
                    self.last_stats = Some(value);
                }
            }
        }
        match timeout_at(deadline, self.child.wait()).await {
            Ok(Ok(status)) => {
                unregister(self.pid);
                self.status = Some(status);
                Ok(status)
            }
            Ok(Err(source)) => Err(ProcessError::Io {
                pid: self.pid,
                what: "waiting for",
                source,
            }),
            Err(_) => self.kill().await,
        }
    }

    /// The latest statistics the server wrote: its answer to the last `stats`, or what it wrote as it shut down.
    pub fn last_stats(&self) -> Option<&serde_json::Value> {
        self.last_stats.as_ref()
    }
}

impl ControlledProcess<ReadyLine> {
    /// The process that does the serving: the server itself, or the external broker it started. Its CPU and
    /// memory are what a workload samples.
    pub fn serving_pid(&self) -> u32 {
        self.ready.serving_pid.unwrap_or(self.pid)
    }
}

impl<R> Drop for ControlledProcess<R> {
    fn drop(&mut self) {
        if self.status.is_none() {
            // SAFETY: kill has no memory effects; the child is not reaped, so the pid is still ours.
            unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGKILL) };
            unregister(self.pid);
            // `kill_on_drop` then hands the child to tokio, which reaps it in the background.
        }
    }
}

/// SIGKILL a child, take it out of the registry, and reap it.
///
/// The pid leaves the registry between the signal and the reaping, so the registry never holds a reaped pid that
/// the kernel could give to another process.
async fn kill_and_reap(child: &mut Child, pid: u32) -> io::Result<ExitStatus> {
    // An error here means it has already been reaped; `wait` then returns its status.
    let _ = child.start_kill();
    unregister(pid);
    child.wait().await
}

static INSTALLED: Mutex<bool> = Mutex::new(false);

/// Make SIGINT, SIGTERM, SIGHUP and panics kill every live child process; on a signal the process then exits with
/// status 130. Call once at the start of the binary; later calls do nothing. A failure is reported on stderr (see
/// [`try_install_cleanup`]).
pub fn install_cleanup() {
    if let Err(e) = try_install_cleanup() {
        eprintln!("warning: {e}");
    }
}

/// [`install_cleanup`], returning the error if the signal handlers cannot be installed.
///
/// The signals are received with `tokio::signal` on a dedicated thread running its own small runtime. A real
/// signal handler is installed (tokio's, which only writes to a pipe, so it is async-signal-safe), so the signal
/// is caught whichever thread it is delivered to, and the killing happens on an ordinary thread that may take
/// locks. A `sigwait` thread would need the signals blocked in every thread, including runtime threads started
/// before this call, which a library cannot promise; a dedicated thread also works whether or not the caller is
/// inside a runtime, and adds no dependency.
pub fn try_install_cleanup() -> Result<(), ProcessError> {
    let mut installed = INSTALLED.lock().unwrap_or_else(|p| p.into_inner());
    if *installed {
        return Ok(());
    }
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ProcessError::Cleanup)?;
    let (mut int, mut term, mut hup) = {
        let _guard = rt.enter();
        (
            signal(SignalKind::interrupt()).map_err(ProcessError::Cleanup)?,
            signal(SignalKind::terminate()).map_err(ProcessError::Cleanup)?,
            signal(SignalKind::hangup()).map_err(ProcessError::Cleanup)?,
        )
    };
    std::thread::Builder::new()
        .name("cleanup".into())
        .spawn(move || {
            rt.block_on(async {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                    _ = hup.recv() => {}
                }
            });
            kill_all_servers();
            std::process::exit(130);
        })
        .map_err(ProcessError::Cleanup)?;

    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        kill_on_panic();
        previous(info);
    }));
    *installed = true;
    Ok(())
}

/// Kill every live child from the panic hook, without ever blocking on the registry's lock.
fn kill_on_panic() {
    for _ in 0..100 {
        match LIVE.try_lock() {
            Ok(live) => return kill_all(&live),
            Err(TryLockError::Poisoned(p)) => return kill_all(&p.into_inner()),
            Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn the_registry_signals_through_a_pidfd() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        register(pid);
        let has_pidfd = live().get(&pid).is_some_and(|fd| fd.is_some());
        // Signal through the registry, as the cleanup does, before anything reaps the child.
        let one: BTreeMap<u32, Option<OwnedFd>> = live()
            .remove(&pid)
            .into_iter()
            .map(|fd| (pid, fd))
            .collect();
        kill_all(&one);
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        // Every kernel this suite runs on has pidfd_open (Linux 5.3+); if this fails, signals go by pid.
        assert!(has_pidfd, "no pidfd for a live child");
        // A reaped child's pidfd refers to nothing: signalling it again is a harmless no-op.
        kill_all(&one);
    }
}
