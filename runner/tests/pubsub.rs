//! The publish/subscribe workloads through the runner binary (real server processes, real sockets) for the
//! in-tree MQTT broker and the quinn relay, at sizes a test can afford: every run accounts for every expected
//! delivery (`expected = delivered + dropped + undelivered`, nothing undelivered, nothing twice), and `runner
//! check` agrees.

use std::path::Path;
use std::process::Command;
use workloads::result::RunResult;

fn runner(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .output()
        .unwrap()
}

fn metric(r: &RunResult, key: &str) -> f64 {
    r.metric(key)
        .unwrap_or_else(|| panic!("{} {} has no {key}", r.workload, r.transport))
}

fn run_and_check(out: &Path, args: &[&str]) -> Vec<RunResult> {
    let o = runner(&[args, &["--out", out.to_str().unwrap()]].concat());
    assert!(
        o.status.success(),
        "runner {args:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let check = runner(&["check", "--allow-generator-bound", out.to_str().unwrap()]);
    assert!(
        check.status.success(),
        "runner check failed:\n{}",
        String::from_utf8_lossy(&check.stdout)
    );
    workloads::result::read(out).unwrap()
}

#[test]
fn fanout_and_flood_account_for_every_delivery_on_mqtt_and_quinn() {
    let dir = tempfile::tempdir().unwrap();
    let results = run_and_check(
        &dir.path().join("r.jsonl"),
        &[
            "--transport",
            "mqtt,quinn",
            "--workload",
            "fanout,flood",
            "--profile",
            "quick",
            "--rounds",
            "1",
            "--param",
            "subscribers=4",
            "--param",
            "pairs=2",
            "--param",
            "duration_s=1",
        ],
    );
    // 3 fanout cases and 6 flood cases (4 as fast as accepted, 2 at a moderate rate), for each transport.
    assert_eq!(results.len(), 2 * (3 + 6));
    for r in &results {
        let name = format!("{} {} {}", r.workload, r.transport, r.params);
        let (expected, delivered, dropped) = (
            metric(r, "expected"),
            metric(r, "delivered"),
            metric(r, "dropped"),
        );
        assert!(expected > 0.0, "{name}");
        assert_eq!(expected, delivered + dropped, "{name}");
        assert_eq!(metric(r, "undelivered"), 0.0, "{name}");
        assert_eq!(metric(r, "duplicates"), 0.0, "{name}");
        assert_eq!(metric(r, "connections_lost"), 0.0, "{name}");
        assert_eq!(metric(r, "published"), metric(r, "accepted"), "{name}");
        assert!(r.histograms.contains_key("publish_to_delivered"), "{name}");
        if r.workload == "fanout" {
            // Every published message is expected at each of the 4 subscribers.
            assert_eq!(expected, 4.0 * metric(r, "published"), "{name}");
        }
        if metric(r, "rate_per_s") > 0.0 {
            // The moderate rate is well within what either server delivers: nothing dropped.
            assert_eq!(dropped, 0.0, "{name}");
        }
    }
}

#[test]
fn moderate_rate_runs_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let results = run_and_check(
        &dir.path().join("r.jsonl"),
        &[
            "--transport",
            "quinn",
            "--workload",
            "moderate-rate",
            "--rounds",
            "1",
            "--param",
            "duration_s=1",
        ],
    );
    assert_eq!(results.len(), 2, "QoS 0 and QoS 1");
    for r in &results {
        assert_eq!(metric(r, "pairs"), 8.0);
        // 8 publishers × 100 messages/s for 1 s.
        assert_eq!(metric(r, "published"), 800.0);
        assert_eq!(metric(r, "delivered"), 800.0);
    }
}

#[test]
fn publish_takes_every_message_and_delivers_none() {
    let dir = tempfile::tempdir().unwrap();
    let results = run_and_check(
        &dir.path().join("r.jsonl"),
        &[
            "--transport",
            "mqtt,pure",
            "--workload",
            "publish",
            "--profile",
            "quick",
            "--rounds",
            "1",
            "--param",
            "pairs=2",
            "--param",
            "duration_s=1",
        ],
    );
    assert_eq!(results.len(), 2 * 2, "64 B and 1 KiB, each transport");
    for r in &results {
        let name = format!("{} {} {}", r.workload, r.transport, r.params);
        assert!(metric(r, "published") > 0.0, "{name}");
        // QoS 1: every message handed over was acknowledged, and nobody subscribed to receive it.
        assert_eq!(metric(r, "published"), metric(r, "accepted"), "{name}");
        assert_eq!(metric(r, "expected"), 0.0, "{name}");
        assert_eq!(metric(r, "delivered"), 0.0, "{name}");
        assert!(metric(r, "published_per_s") > 0.0, "{name}");
        assert!(metric(r, "server_cpu_us_per_message") > 0.0, "{name}");
    }
    // Flood's parameters, so a rate is refused: this workload is as fast as accepted.
    let o = runner(&[
        "--transport",
        "mqtt",
        "--workload",
        "publish",
        "--param",
        "rate_per_s=10",
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("rate_per_s must be 0"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn check_fails_a_run_missing_a_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.jsonl");
    run_and_check(
        &out,
        &[
            "--transport",
            "quinn",
            "--workload",
            "fanout",
            "--rounds",
            "1",
            "--param",
            "subscribers=2",
            "--param",
            "duration_s=1",
            "--param",
            "qos=1",
            "--param",
            "rate_per_s=10",
        ],
    );
    // The same result with one delivery gone and not counted anywhere.
    let mut results = workloads::result::read(&out).unwrap();
    let delivered = metric(&results[0], "delivered");
    results[0]
        .metrics
        .insert("delivered".into(), (delivered - 1.0).into());
    let broken = dir.path().join("broken.jsonl");
    workloads::result::append(&broken, &results).unwrap();
    let check = runner(&["check", broken.to_str().unwrap()]);
    assert!(!check.status.success());
    assert!(String::from_utf8_lossy(&check.stdout).contains("FAIL"));
}
