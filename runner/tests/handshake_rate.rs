//! handshake-rate through the runner binary, for Pure (brand-new senders) and one TLS transport, at sizes a test can
//! afford: no errors, every answered order stored exactly once (the store's audit), a rate, whole histograms, the
//! server's operations per link as the counting provider counts them, and `runner check` passing on the file.

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

#[test]
fn new_links_each_stored_once_with_no_errors_for_pure_and_mqtt() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.jsonl");
    let o = runner(&[
        "--transport",
        "pure,mqtt",
        "--workload",
        "handshake-rate",
        "--rounds",
        "1",
        "--param",
        "workers=3",
        "--param",
        "duration_s=1",
        "--param",
        "new_senders_per_s=400",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "runner failed:\n{stderr}");
    let results = workloads::result::read(&out).unwrap();
    assert_eq!(results.len(), 2);
    for r in &results {
        let t = &r.transport;
        assert!(r.skipped.is_none(), "{t}: {:?}", r.skipped);
        assert_eq!(metric(r, "errors"), 0.0, "{t}");
        let links = metric(r, "links");
        assert!(links >= 3.0, "{t}: {links} links");
        assert!(metric(r, "conn_per_s") > 0.0, "{t}");
        // Every answered order is in the log exactly once, and nothing else is.
        assert_eq!(metric(r, "applied"), links, "{t}");
        for key in ["lost", "duplicates", "acked_not_applied", "unknown"] {
            assert_eq!(metric(r, key), 0.0, "{t}: {key}");
        }
        let stored = workloads::hist::decode(&r.histograms["connect_to_stored"]).unwrap();
        assert_eq!(stored.len() as f64, links, "{t}");
        assert!(metric(r, "server_cpu_us_per_conn") > 0.0, "{t}");
        assert!(metric(r, "generator_cpu_us_per_conn") > 0.0, "{t}");
        assert!(r.metric("generator_bound").is_some(), "{t}");
    }
    let pure = results.iter().find(|r| r.transport == "pure").unwrap();
    // A brand-new sender costs the receiver one X25519 and nothing else.
    assert_eq!(metric(pure, "server_asym_ops_per_conn"), 1.0);
    assert_eq!(metric(pure, "server_x25519"), metric(pure, "links"));
    assert!(!pure.histograms.contains_key("connect_to_ready"));
    assert!(metric(pure, "new_senders_prepared") >= 400.0);

    let mqtt = results.iter().find(|r| r.transport == "mqtt").unwrap();
    let links = metric(mqtt, "links");
    let ready = workloads::hist::decode(&mqtt.histograms["connect_to_ready"]).unwrap();
    assert_eq!(ready.len() as f64, links);
    // A full TLS 1.3 handshake with a client certificate: 2 X25519, 1 signature, 2 verifications on the server,
    // every link (no resumption).
    assert_eq!(metric(mqtt, "server_asym_ops_per_conn"), 5.0);
    assert_eq!(metric(mqtt, "server_handshakes"), links);
    assert_eq!(metric(mqtt, "client_handshakes"), links);
    assert_eq!(metric(mqtt, "client_reconnects"), 0.0);
    let arithmetic = metric(mqtt, "server_asym_cost_us_per_conn");
    let expected = 2.0 * metric(mqtt, "asym_cost_x25519_us")
        + metric(mqtt, "asym_cost_sign_us")
        + 2.0 * metric(mqtt, "asym_cost_verify_us");
    assert!(
        (arithmetic - expected).abs() < 1e-6 * expected,
        "{arithmetic} vs {expected}"
    );

    let check = runner(&["check", "--allow-generator-bound", out.to_str().unwrap()]);
    assert!(
        check.status.success(),
        "runner check failed:\n{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    // The report has the sweep's row per worker count, the transports side by side.
    let report = runner(&["report", out.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(
        text.contains("pure conn/s") && text.contains("mqtt conn/s"),
        "{text}"
    );
}
