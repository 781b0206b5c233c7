//! The idle-links workload and its load-generator workers through the runner binary: real servers, real worker
//! processes, real sockets. Asserted: no errors, memory figures present and positive, every worker gone with its
//! runner (even a SIGKILLed one), and a worker's errors reported by kind with their messages.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use transport_core::Transport;
use workloads::result::RunResult;
use workloads::sample::process_state;
use workloads::worker::{self, Totals, Workers};

const RUNNER: &str = env!("CARGO_BIN_EXE_runner");

fn run(dir: &Path, args: &[&str]) -> Vec<RunResult> {
    let out = dir.join("r.jsonl");
    let o = Command::new(RUNNER)
        .args(args)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "runner {args:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let check = Command::new(RUNNER)
        .args(["check", "--allow-generator-bound"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "runner check failed:\n{}",
        String::from_utf8_lossy(&check.stdout)
    );
    workloads::result::read(&out).unwrap()
}

fn metric(r: &RunResult, key: &str) -> f64 {
    r.metric(key)
        .unwrap_or_else(|| panic!("{} has no {key}", r.transport))
}

/// Whether mosquitto is installed; if not, say so where the test output shows it.
fn mosquitto_installed() -> bool {
    if transport_mqtt::mosquitto::find_binary("mosquitto").is_some() {
        return true;
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "\n!!!!! mqtt@mosquitto left out: mosquitto is not installed ({}) !!!!!\n",
        transport_mqtt::mosquitto::INSTALL_HINT
    );
    false
}

#[test]
fn idle_links_over_three_workers_opens_every_link_and_measures_memory_and_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let mut transports = "pure,quinn,mqtt".to_string();
    if mosquitto_installed() {
        transports.push_str(",mqtt@mosquitto");
    }
    let links = 150.0;
    // Three workers of 50: devices 50.. and 100.. run in workers whose fleets start at an offset.
    let results = run(
        dir.path(),
        &[
            "--transport",
            &transports,
            "--workload",
            "idle-links",
            "--rounds",
            "1",
            "--param",
            "links=150",
            "--param",
            "idle_s=1",
            "--param",
            "max_links_per_worker=50",
        ],
    );
    assert_eq!(results.len(), transports.split(',').count());
    for r in &results {
        let t = &r.transport;
        assert!(r.skipped.is_none(), "{t}: {:?}", r.skipped);
        assert_eq!(
            metric(r, "errors"),
            0.0,
            "{t}: {:?}",
            r.metrics.get("error_kinds")
        );
        assert_eq!(metric(r, "opened"), links, "{t}");
        assert_eq!(metric(r, "workers"), 3.0, "{t}");
        assert!(metric(r, "open_s") > 0.0, "{t}");
        assert!(metric(r, "idle_s") >= 1.0, "{t}");
        assert!(
            metric(r, "server_rss_after_bytes") > metric(r, "server_rss_before_bytes"),
            "{t}: the server's memory grew with its links"
        );
        assert!(metric(r, "server_rss_kib_per_link") > 0.0, "{t}");
        assert!(metric(r, "server_cpu_ms_per_s") >= 0.0, "{t}");
        let files = metric(r, "worker_files_max");
        assert!(
            files > 0.0 && files < f64::from(worker::FILES_PER_PROCESS),
            "{t}: {files} files"
        );
        let server_files = metric(r, "server_files");
        assert!(server_files <= metric(r, "server_files_limit"), "{t}");
        if t.starts_with("mqtt") {
            assert!(
                server_files >= links,
                "{t}: a TCP server holds a file per connection"
            );
        } else {
            assert!(
                server_files < links,
                "{t}: a UDP server holds one socket for every link"
            );
        }
        match t.as_str() {
            "mqtt@mosquitto" => {
                assert!(
                    metric(r, "broker_heap_after_bytes") > metric(r, "broker_heap_before_bytes")
                );
                assert!(metric(r, "broker_heap_kib_per_link") > 0.0);
            }
            // The in-tree broker publishes only its RSS: no heap figure is made up for it.
            _ => assert!(r.metric("broker_heap_kib_per_link").is_none(), "{t}"),
        }
        if t == "pure" {
            // A Pure link is a device the receiver knows: its first order stored, once, under its own identity.
            assert_eq!(metric(r, "applied"), links);
            assert_eq!(metric(r, "lost") + metric(r, "duplicates"), 0.0);
            assert_eq!(metric(r, "client_handshakes"), 0.0);
        } else {
            assert_eq!(metric(r, "client_handshakes"), links, "{t}");
        }
    }
}

/// Whether `pid` is gone or a zombie waiting for init.
fn gone(pid: u32) -> bool {
    !matches!(process_state(pid), Ok(s) if s != 'Z')
}

#[test]
fn workers_die_with_a_killed_runner() {
    let dir = tempfile::tempdir().unwrap();
    let mut runner = Command::new(RUNNER)
        .args([
            "--transport",
            "quinn",
            "--workload",
            "idle-links",
            "--rounds",
            "1",
            "--param",
            "links=40",
            "--param",
            "idle_s=60",
            "--param",
            "max_links_per_worker=20",
            "--out",
        ])
        .arg(dir.path().join("r.jsonl"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = runner.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines().map_while(Result::ok);
    let pids: Vec<u32> = lines
        .by_ref()
        .find_map(|line| {
            let list = line.split_once("pids [")?.1.split_once(']')?.0.to_string();
            Some(list.split(", ").filter_map(|p| p.parse().ok()).collect())
        })
        .expect("the runner names its workers");
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert!(pids.iter().all(|&p| !gone(p)));
    // Let the links open and the hold begin, then kill the runner with no chance to clean up.
    std::thread::sleep(Duration::from_secs(3));
    runner.kill().unwrap();
    runner.wait().unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until && !pids.iter().all(|&p| gone(p)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let alive: Vec<u32> = pids.iter().copied().filter(|&p| !gone(p)).collect();
    assert!(alive.is_empty(), "workers {alive:?} outlived their runner");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_errors_are_reported_by_kind_with_their_message() {
    let dir = tempfile::tempdir().unwrap();
    let identity = dir.path().join("identity");
    transport_mqtt::Mqtt::in_tree()
        .prepare(&identity, 4)
        .unwrap();
    // Nobody listens here: every connection is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let runner = Path::new(RUNNER);
    let mut workers = Workers::start(runner, "mqtt", &identity, addr, &worker::split(4, 2))
        .await
        .unwrap();
    assert_eq!(workers.len(), 2);
    workers
        .connect(4, None, Duration::from_secs(20))
        .await
        .unwrap();
    let (stats, settled) = workers
        .wait_settled(
            Instant::now() + Duration::from_secs(30),
            Duration::from_millis(50),
            |_| {},
        )
        .await
        .unwrap();
    assert!(settled);
    let t = Totals::of(&stats);
    assert_eq!((t.opened, t.failed, t.errors()), (0, 4, 4), "{t:?}");
    let (kind, e) = t.errors.iter().next().unwrap();
    assert!(kind.starts_with("i/o"), "{kind}");
    assert!(e.example.contains("refused"), "{}", e.example);
    let mut not_open = t.not_open_devices.clone();
    not_open.sort_unstable();
    assert_eq!(not_open, vec![0, 1, 2, 3]);
    workers.shutdown().await;

    // A worker that cannot make its fleet says why instead of being ready.
    let err = Workers::start(
        runner,
        "mqtt",
        &dir.path().join("missing"),
        addr,
        &worker::split(2, 2),
    )
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("worker 0") && text.contains("could not start"),
        "{text}"
    );
    assert!(text.contains("missing"), "{text}");
    assert!(workloads::process::live_pids().is_empty());
}
