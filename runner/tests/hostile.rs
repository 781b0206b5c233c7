//! The adversary beside the restart workload, through the runner binary: real server processes, a real adversary
//! process, real sockets and the real store. For Pure and the broker: every server answers at the end, nothing is
//! applied that no one known made (the adversary's own orders are counted apart), nothing in another device's name,
//! the honest devices lose nothing, the bad input is counted by kind, and `runner check` passes on the results.

use std::path::Path;
use workloads::result::RunResult;

fn runner(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .output()
        .unwrap()
}

fn metric(r: &RunResult, key: &str) -> f64 {
    r.metric(key)
        .unwrap_or_else(|| panic!("{} has no {key}", r.transport))
}

fn hostile(r: &RunResult) -> bool {
    r.params.get("hostile").and_then(|v| v.as_bool()) == Some(true)
}

fn run_restart(dir: &Path, transports: &str) -> (Vec<RunResult>, String) {
    let out = dir.join("hostile.jsonl");
    let o = runner(&[
        "--transport",
        transports,
        "--workload",
        "restart",
        "--profile",
        "quick",
        "--rounds",
        "1",
        "--hostile",
        "--param",
        "devices=10",
        "--param",
        "duration_s=4",
        "--param",
        "kill_at_s=2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        o.status.success(),
        "runner failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    (
        workloads::result::read(&out).unwrap(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

#[test]
fn restart_beside_an_adversary_pure_and_mqtt() {
    let dir = tempfile::tempdir().unwrap();
    let (results, report) = run_restart(dir.path(), "pure,mqtt");
    assert_eq!(results.len(), 4, "a clean and a hostile run each");
    for r in &results {
        let t = r.transport.as_str();
        // The honest devices: nothing lost, nothing applied twice, every order made applied.
        assert_eq!(metric(r, "lost"), 0.0, "{t}");
        assert_eq!(metric(r, "duplicates"), 0.0, "{t}");
        assert_eq!(metric(r, "orders_made"), metric(r, "orders_applied"), "{t}");
        assert_eq!(
            metric(r, "unknown"),
            0.0,
            "{t}: applied, made by no one known"
        );
        if !hostile(r) {
            assert!(r.metric("adversary_sent").is_none(), "{t}: clean");
            continue;
        }
        assert_eq!(
            metric(r, "server_answered_end"),
            1.0,
            "{t}: the server survived"
        );
        assert_eq!(metric(r, "adversary_forged_applied"), 0.0, "{t}");
        // Its own valid identity stored its own orders, counted apart from the audit.
        assert!(metric(r, "adversary_own_applied") > 0.0, "{t}");
        assert!(metric(r, "adversary_sent") > 100.0, "{t}");
        let counted = |c: &str| metric(r, &format!("hostile_server_{c}"));
        let sent = |k: &str| metric(r, &format!("adversary_{k}"));
        // Every kind it sent shows in the server's counter for it.
        let mut pairs = vec![
            ("refused_unknown", "unknown_sender"),
            ("refused_forged", "forged_sender"),
            ("refused_malformed", "truncated"),
            ("refused_oversized", "oversized_datagram"),
            ("already_applied", "replayed"),
        ];
        if t == "mqtt" {
            pairs = vec![
                ("refused_unknown", "foreign_certificate"),
                ("refused_unknown", "other_client_id"),
                ("refused_malformed", "malformed"),
                ("refused_oversized", "oversized"),
                ("refused_limit", "deep_filter"),
                ("refused_limit", "huge_subscribe"),
                ("timed_out", "half_open"),
                ("already_applied", "replayed"),
            ];
        }
        for (counter, kind) in pairs {
            assert!(sent(kind) > 0.0, "{t}: sent no {kind}");
            assert!(counted(counter) > 0.0, "{t}: {kind} sent, {counter} is 0");
        }
        if t == "pure" && r.metrics["adversary_notes"].as_array().unwrap().is_empty() {
            // With a raw socket: its records from source port 0 opened, and their answers could not be sent.
            assert!(counted("send_errors") > 0.0, "{t}");
        }
    }
    assert!(report.contains("pure (hostile)"), "{report}");
    assert!(report.contains("clean and hostile"), "{report}");

    let check = runner(&[
        "check",
        "--allow-generator-bound",
        dir.path().join("hostile.jsonl").to_str().unwrap(),
    ]);
    assert!(
        check.status.success(),
        "runner check:\n{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let table = String::from_utf8_lossy(&check.stdout);
    assert!(table.contains("the server answered at the end"), "{table}");
}
