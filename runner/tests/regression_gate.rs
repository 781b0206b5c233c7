//! The regression gate through the runner binary: `runner check --baseline` compares ratios measured side by side
//! in one invocation (each transport against the first listed) with a baseline's. An unchanged build passes; the
//! same build with one transport's server slowed on purpose (`RUNNER_HANDICAP`, busy CPU per order) fails, naming
//! that transport.
//!
//! Every drain here runs both servers with 10 µs of busy CPU per order (a server-bound drain of at most 100,000
//! orders a second): unhandicapped, a drain on two cores is often bound by its load generator, and such a run takes
//! no part in ratios, so the gate would have nothing to compare. The slowed build adds 90 µs more to one of them.

use std::path::Path;
use std::process::Command;

const RUNNER: &str = env!("CARGO_BIN_EXE_runner");

/// Both servers' CPU per order in every drain, in µs.
const BASE: &str = "pure:plain:10,pure:10";

/// A drain of `pure:plain` (the reference) and `pure`, one round, into `out`, with `handicap` (`RUNNER_HANDICAP`).
fn drain(out: &Path, handicap: &str) {
    let mut cmd = Command::new(RUNNER);
    cmd.args([
        "--transport",
        "pure:plain,pure",
        "--workload",
        "drain",
        "--rounds",
        "1",
        "--param",
        "orders=50000",
        "--out",
    ])
    .arg(out)
    .env("RUNNER_HANDICAP", handicap);
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "runner failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn gate(current: &Path, baseline: &Path) -> (bool, String) {
    let o = Command::new(RUNNER)
        .args([
            "check",
            "--allow-generator-bound",
            "--tolerance",
            "0.5",
            "--baseline",
        ])
        .arg(baseline)
        .arg(current)
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into(),
    )
}

#[test]
fn the_gate_passes_an_unchanged_build_and_fails_a_slowed_transport() {
    let dir = tempfile::tempdir().unwrap();
    let (baseline, unchanged, slowed) = (
        dir.path().join("baseline.jsonl"),
        dir.path().join("unchanged.jsonl"),
        dir.path().join("slowed.jsonl"),
    );
    drain(&baseline, BASE);
    drain(&unchanged, BASE);
    // 100 µs of server CPU per order caps the sealed server at 10,000 orders/s, a tenth of the reference's.
    drain(&slowed, "pure:plain:10,pure:100");

    let (ok, table) = gate(&unchanged, &baseline);
    assert!(ok, "an unchanged build failed the gate:\n{table}");
    assert!(table.contains("pure / pure:plain"), "{table}");

    let (ok, table) = gate(&slowed, &baseline);
    assert!(!ok, "a slowed transport passed the gate:\n{table}");
    let failed: Vec<&str> = table.lines().filter(|l| l.ends_with("FAIL |")).collect();
    assert_eq!(failed.len(), 1, "{table}");
    assert!(failed[0].contains("pure / pure:plain"), "{table}");
}

#[test]
fn a_malformed_handicap_is_refused_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(RUNNER)
        .args([
            "--transport",
            "pure:plain",
            "--workload",
            "drain",
            "--rounds",
            "1",
        ])
        .args(["--param", "orders=1000", "--out"])
        .arg(dir.path().join("r.jsonl"))
        .env("RUNNER_HANDICAP", "pure:plain:lots")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("RUNNER_HANDICAP"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
