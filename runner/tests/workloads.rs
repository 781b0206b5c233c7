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
        // Every order's send lag is on record, and so is whether the generator was the limit.
        let lag = workloads::hist::decode(&r.histograms["send_lag"]).unwrap();
        assert_eq!(
            lag.len() as f64,
            metric(r, "orders_made"),
            "{}",
            r.transport
        );
        assert!(r.metric("generator_bound").is_some());
        assert_eq!(metric(r, "unanswered"), 0.0);
        // One definition of stalls and lateness for every transport: against the offered rate (60 devices, one
        // order a second each: 6 per 100 ms) and one absolute threshold.
        assert_eq!(metric(r, "offered_per_bin"), 6.0);
        assert!(metric(r, "slow_bins") <= 100.0);
        let late = metric(r, "late_orders");
        let pct = 100.0 * late / metric(r, "orders_made");
        assert!(
            (metric(r, "late_pct") - pct).abs() < 1e-9,
            "{}",
            r.transport
        );
        // Back on time later than the kill only if some order after it was late.
        assert!(
            metric(r, "on_time_again_s") == 0.0 || late > 0.0,
            "{}",
            r.transport
        );
        assert!(r.metric("stall_bins").is_none() && r.metric("catch_up_s").is_none());
        assert_eq!(r.durability.as_ref().unwrap().server_processes, 2);
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
            "--param",
            "clients=8",
        ],
    );
    for r in &results {
        assert_eq!(metric(r, "lost"), 0.0, "{}", r.transport);
        assert_eq!(metric(r, "duplicates"), 0.0, "{}", r.transport);
        assert_eq!(metric(r, "applied"), 408.0, "{}", r.transport);
        assert_eq!(metric(r, "orders_acked"), metric(r, "orders_made"));
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
            // The tests of this file run at once, and each runner would pin its generator (and the emulator in
            // it) to the same CPU: this one's timing is the point, so it leaves placement to the kernel.
            "--pin",
            "off",
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
        // The emulator's whole measurement is kept, each direction.
        for dir in ["to_server", "to_client"] {
            let p50 = metric(r, &format!("link_{dir}_p50_ms"));
            let p99 = metric(r, &format!("link_{dir}_p99_ms"));
            let max = metric(r, &format!("link_{dir}_max_ms"));
            assert!(
                (19.0..22.0).contains(&p50) && p50 <= p99 && p99 <= max,
                "{dir}: {p50} {p99} {max}"
            );
            assert!(metric(r, &format!("link_{dir}_packets")) > 0.0);
            assert_eq!(metric(r, &format!("link_{dir}_dropped")), 0.0);
            assert!(r.metric(&format!("link_{dir}_held")).is_some());
        }
        assert_eq!(metric(r, "unanswered"), 0.0);
    }
}
