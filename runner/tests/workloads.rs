//! The workloads through the runner binary, against every transport, at sizes a test can afford. Hard invariants
//! are asserted (nothing lost, nothing applied twice, the design's promises); times only as ratios measured in the
//! same run, with generous bounds.

use std::path::Path;
use workloads::result::RunResult;

fn run(dir: &Path, args: &[&str]) -> Vec<RunResult> {
    let out = dir.join("r.jsonl");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_runner"))
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
    workloads::result::read(&out).unwrap()
}

fn metric(r: &RunResult, key: &str) -> f64 {
    r.metric(key)
        .unwrap_or_else(|| panic!("{} has no {key}", r.transport))
}

#[test]
fn restart_quinn_and_mqtt_clients_reconnect_and_nothing_is_lost_or_applied_twice() {
    let dir = tempfile::tempdir().unwrap();
    let devices = 60.0;
    let results = run(
        dir.path(),
        &[
            "--transport",
            "quinn,mqtt",
            "--workload",
            "restart",
            "--rounds",
            "1",
            "--param",
            "devices=60",
        ],
    );
    assert_eq!(results.len(), 2);
    for r in &results {
        assert_eq!(metric(r, "lost"), 0.0, "{}", r.transport);
        assert_eq!(metric(r, "duplicates"), 0.0, "{}", r.transport);
        assert_eq!(metric(r, "acked_not_applied"), 0.0, "{}", r.transport);
        assert_eq!(
            metric(r, "orders_made"),
            metric(r, "orders_applied"),
            "{}",
            r.transport
        );
        // Every device that sends after the restart makes a new connection: a handshake each.
        let handshakes = metric(r, "handshakes_after");
        assert!(
            handshakes >= 0.98 * devices,
            "{}: {handshakes} handshakes after the restart",
            r.transport
        );
        assert!(metric(r, "reconnects") >= 0.98 * devices, "{}", r.transport);
        assert!(
            metric(r, "asym_ops_after") >= handshakes,
            "{}: a handshake costs asymmetric operations",
            r.transport
        );
    }
}

#[test]
fn drain_runs_for_the_connection_transports_too() {
    let dir = tempfile::tempdir().unwrap();
    let results = run(
        dir.path(),
        &[
            "--transport",
            "quinn,mqtt",
            "--workload",
            "drain",
            "--rounds",
            "1",
            "--param",
            "orders=400",
        ],
    );
    for r in &results {
        assert_eq!(metric(r, "lost"), 0.0, "{}", r.transport);
        assert_eq!(metric(r, "duplicates"), 0.0, "{}", r.transport);
        assert_eq!(metric(r, "applied"), 408.0, "{}", r.transport);
    }
}

#[test]
fn first_contact_costs_pure_one_round_trip_and_quic_two() {
    let dir = tempfile::tempdir().unwrap();
    let results = run(
        dir.path(),
        &[
            "--transport",
            "pure,quinn,mqtt",
            "--workload",
            "first-contact",
            "--rtt",
            "40",
            "--rounds",
            "1",
        ]
        .into_iter()
        .chain(["--param", "peers=8"])
        .collect::<Vec<_>>(),
    );
    let trips = |t: &str| {
        metric(
            results.iter().find(|r| r.transport == t).unwrap(),
            "round_trips",
        )
    };
    let (pure, quinn, mqtt) = (trips("pure"), trips("quinn"), trips("mqtt"));
    // Round trips are a ratio to the emulator's own setting; the bounds leave room for a busy machine.
    assert!((0.9..1.6).contains(&pure), "pure: {pure} round trips");
    assert!((1.8..2.8).contains(&quinn), "quinn: {quinn} round trips");
    assert!(mqtt >= 2.8, "mqtt over TLS: {mqtt} round trips");
    for r in &results {
        let measured = metric(r, "measured_rtt_ms");
        assert!(
            (measured - 40.0).abs() < 2.0,
            "{}: the emulator added {measured} ms",
            r.transport
        );
        assert_eq!(metric(r, "lost"), 0.0);
    }
}
