//! Server processes against real children: `/bin/sh` scripts that follow (or break) the `runner serve` contract,
//! and this test binary re-run as a runner that dies.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};
use workloads::process::{
    install_cleanup, live_pids, ControlledProcess, ProcessError, ServerProcess,
};
use workloads::sample::process_state;

/// A server that reports ready, answers every stdin line with a counter, and exits at end of input.
const SERVER: &str = r#"echo "{\"ready\":{\"transport\":\"sh\",\"addr\":\"127.0.0.1:4433\",\"public_key\":\"ab01\",\"pid\":$$}}"
n=0
while read line; do n=$((n+1)); echo "{\"n\":$n,\"asked\":\"$line\"}"; done"#;

fn sh(script: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.args(["-c", script]);
    cmd
}

async fn start(script: &str) -> ServerProcess {
    ServerProcess::start(sh(script), Duration::from_secs(5))
        .await
        .unwrap()
}

/// Whether `pid` is gone (no /proc entry: exited and reaped).
fn gone(pid: u32) -> bool {
    process_state(pid).is_err()
}

/// Wait up to a second (letting the runtime run, so it can reap) until `check` holds.
async fn eventually(mut check: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    check()
}

#[tokio::test]
async fn ready_line_is_parsed() {
    let mut server = start(SERVER).await;
    let ready = server.ready().clone();
    assert_eq!(ready.transport, "sh");
    assert_eq!(ready.addr, "127.0.0.1:4433".parse().unwrap());
    assert_eq!(ready.public_key, "ab01");
    assert_eq!(ready.pid, server.pid());
    assert!(live_pids().contains(&server.pid()));
    let status = server.shutdown().await.unwrap();
    assert!(status.success(), "{status}");
    assert!(!live_pids().contains(&server.pid()));
}

#[tokio::test]
async fn stats_round_trip() {
    let mut server = start(SERVER).await;
    for n in 1..=3 {
        let stats = server.stats().await.unwrap();
        assert_eq!(stats["n"], n);
        assert_eq!(stats["asked"], "stats");
    }
    server.shutdown().await.unwrap();
    assert!(matches!(
        server.stats().await,
        Err(ProcessError::NotRunning { .. })
    ));
}

#[tokio::test]
async fn a_late_answer_is_skipped() {
    // Answers the first request after 600 ms, the others at once.
    let script = r#"echo "{\"ready\":{\"transport\":\"sh\",\"addr\":\"127.0.0.1:1\",\"public_key\":\"\",\"pid\":$$}}"
read line; sleep 0.6; echo '{"n":1}'
while read line; do echo '{"n":2}'; done"#;
    let mut server = start(script).await;
    let err = server
        .stats_within(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(err, ProcessError::StatsTimeout { .. }), "{err}");
    let stats = server.stats().await.unwrap();
    assert_eq!(
        stats["n"], 2,
        "the answer to this request, not the late one"
    );
}

#[tokio::test]
async fn stop_and_continue() {
    let server = start(SERVER).await;
    let pid = server.pid();
    server.stop().unwrap();
    assert!(eventually(|| process_state(pid).ok() == Some('T')).await);
    server.cont().unwrap();
    assert!(eventually(|| matches!(process_state(pid), Ok('S' | 'R'))).await);
}

#[tokio::test]
async fn kill_reaps() {
    let mut server = start(SERVER).await;
    let pid = server.pid();
    server.stop().unwrap();
    let status = server.kill().await.unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    assert!(gone(pid), "killed server still in /proc");
    assert!(!live_pids().contains(&pid));
    assert!(matches!(
        server.stop(),
        Err(ProcessError::NotRunning { .. })
    ));
    // Killing again reports the same end.
    assert_eq!(server.kill().await.unwrap(), status);
}

#[tokio::test]
async fn dropping_leaves_no_process() {
    let server = start(SERVER).await;
    let pid = server.pid();
    drop(server);
    assert!(!live_pids().contains(&pid));
    assert!(
        eventually(|| gone(pid)).await,
        "dropped server still in /proc"
    );
}

#[tokio::test]
async fn shutdown_kills_a_server_that_ignores_end_of_input() {
    let script = r#"echo "{\"ready\":{\"transport\":\"sh\",\"addr\":\"127.0.0.1:1\",\"public_key\":\"\",\"pid\":$$}}"
exec sleep 30"#;
    let mut server = start(script).await;
    let status = server
        .shutdown_within(Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    assert!(gone(server.pid()));
}

#[tokio::test]
async fn exit_before_ready_is_a_clear_error() {
    let err = ServerProcess::start(sh("exit 2"), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "process exited with status 2 before it was ready"
    );
}

#[tokio::test]
async fn no_ready_line_times_out_and_kills() {
    let started = Instant::now();
    let err = ServerProcess::start(sh("exec sleep 30"), Duration::from_millis(300))
        .await
        .unwrap_err();
    let ProcessError::ReadyTimeout { pid, .. } = err else {
        panic!("expected ReadyTimeout, got {err}");
    };
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(gone(pid), "timed-out server still in /proc");
    assert!(!live_pids().contains(&pid));
}

#[tokio::test]
async fn a_bad_first_line_is_an_error() {
    let err = ServerProcess::start(sh("echo hello; exec sleep 30"), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, ProcessError::BadReady { .. }), "{err}");
    assert!(err.to_string().contains("hello"), "{err}");
}

#[tokio::test]
async fn a_child_that_cannot_start_says_why() {
    let script = r#"echo '{"error":"no credentials for device 7"}'; exit 1"#;
    let err = ServerProcess::start(sh(script), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, ProcessError::StartFailed { .. }), "{err}");
    assert!(err.to_string().contains("device 7"), "{err}");
}

#[tokio::test]
async fn any_ready_type_and_any_command() {
    #[derive(Debug, serde::Deserialize)]
    struct Slice {
        first: u32,
    }
    let script = r#"echo '{"ready":{"first":40}}'
while read line; do echo "{\"asked\":\"$line\"}"; done"#;
    let mut child = ControlledProcess::<Slice>::start(sh(script), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(child.ready().first, 40);
    let answer = child
        .request_within("connect 3", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(answer["asked"], "connect 3");
    let err = child
        .request_within("two\nlines", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, ProcessError::BadCommand(_)), "{err}");
    assert!(live_pids().contains(&child.pid()));
    child.shutdown().await.unwrap();
    assert!(!live_pids().contains(&child.pid()));
}

#[tokio::test]
async fn a_missing_program_is_an_error() {
    let cmd = tokio::process::Command::new("/nonexistent/server");
    let err = ServerProcess::start(cmd, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(err, ProcessError::Spawn { .. }), "{err}");
}

// --- A runner that dies: this test binary, re-run with ROLE set, starts a server and then ends as ROLE says. ---

const ROLE: &str = "TRANSPORT_CORE_PROCESS_TEST_ROLE";

/// The re-run side: does nothing in a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_role() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    install_cleanup();
    let server = start(SERVER).await;
    println!("server-pid={}", server.pid());
    if role == "panic" {
        // Not dropped, and this thread and process stay alive: only the panic hook can kill the server.
        std::mem::forget(server);
        let _ = std::panic::catch_unwind(|| panic!("the runner panics"));
        tokio::time::sleep(Duration::from_secs(30)).await;
    } else {
        // Until the parent test kills or signals this process.
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(server);
    }
}

/// Re-run this binary as a runner in `role`; returns it and its server's pid.
fn spawn_runner(role: &str) -> (std::process::Child, u32) {
    let mut runner = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "runner_role", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = runner.stdout.take().expect("piped");
    // libtest may have written "test runner_role ... " on the same line.
    let pid = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| line.split_once("server-pid=")?.1.trim().parse::<u32>().ok());
    match pid {
        Some(pid) if !gone(pid) => (runner, pid),
        _ => {
            let _ = runner.kill();
            let _ = runner.wait();
            panic!("the runner never reported a live server");
        }
    }
}

async fn assert_gone(pid: u32, how: &str) {
    assert!(
        eventually(|| !matches!(process_state(pid), Ok(s) if s != 'Z')).await,
        "server survived {how}"
    );
}

#[tokio::test]
async fn a_killed_runner_takes_its_server_with_it() {
    let (mut runner, server) = spawn_runner("wait");
    runner.kill().unwrap(); // SIGKILL: no code of the runner runs
    runner.wait().unwrap();
    // The server is re-parented and reaped by init; a zombie moment is fine.
    assert_gone(server, "SIGKILL of its runner").await;
}

#[tokio::test]
async fn a_terminated_runner_kills_its_server_and_exits_130() {
    let (mut runner, server) = spawn_runner("wait");
    // SAFETY: kill has no memory effects; the runner is our unreaped child.
    unsafe { libc::kill(runner.id() as libc::pid_t, libc::SIGTERM) };
    let status = runner.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert_gone(server, "SIGTERM of its runner").await;
}

#[tokio::test]
async fn a_panicking_runner_kills_its_server() {
    let (mut runner, server) = spawn_runner("panic");
    assert_gone(server, "a panic of its runner").await;
    assert!(
        runner.try_wait().unwrap().is_none(),
        "the runner itself is still alive"
    );
    runner.kill().unwrap();
    runner.wait().unwrap();
}
