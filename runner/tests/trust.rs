//! Numbers that hold, through the runner binary and real server processes: every result carries its durability,
//! provenance and pinning; a broken control line, a store on a memory filesystem with a sync policy, or a failed run
//! is on record, flagged in the table, and fails `runner check`.

use std::path::Path;
use std::process::{Command, Output};
use workloads::result::RunResult;

fn runner(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (Output, Vec<RunResult>) {
    let out = dir.join("r.jsonl");
    let o = runner(&[args, &["--out", out.to_str().unwrap()]].concat(), env);
    let results = workloads::result::read(&out).unwrap_or_default();
    (o, results)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const SMALL_DRAIN: &[&str] = &[
    "--workload",
    "drain",
    "--rounds",
    "1",
    "--param",
    "orders=300",
    "--param",
    "clients=4",
];

#[test]
fn every_result_carries_durability_provenance_and_pinning() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let (o, results) = run(
        dir.path(),
        &[
            &["--transport", "pure:plain,quinn"],
            SMALL_DRAIN,
            &["--work-dir", work.to_str().unwrap()],
        ]
        .concat(),
        &[],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(results.len(), 2);
    let fs = transport_store::fs::filesystem(&work).unwrap();
    let invocation = &results[0].provenance.invocation;
    assert_eq!(invocation.len(), 16);
    for r in &results {
        assert_eq!(r.error, None);
        let d = r.durability.as_ref().expect("durability on record");
        assert_eq!(
            (d.sync.as_str(), d.server_threads, d.server_processes),
            ("batch", 1, 1)
        );
        assert_eq!(d.store_fs, fs, "{}", r.transport);
        assert!(d.syncs > 0 && d.groups > 0 && d.applied == 304, "{d:?}");
        let fsync = workloads::hist::decode(&r.histograms["store_fsync"]).unwrap();
        assert_eq!(fsync.len(), d.syncs, "one fsync time per sync");
        let p = &r.provenance;
        assert_eq!(&p.invocation, invocation, "one id per invocation");
        assert!(
            p.commit == "unknown" || p.commit.len() == 40,
            "{}",
            p.commit
        );
        assert_eq!(p.build_profile, "debug");
        let cpus = workloads::pin::allowed_cpus().unwrap();
        if cpus.len() >= 2 {
            assert_eq!(p.pinning.mode, "separate");
            assert_eq!(p.pinning.server_cpus, vec![cpus[0]]);
        }
        for key in ["orders_made", "orders_acked", "unanswered", "timed_out"] {
            assert!(r.metric(key).is_some(), "{} has no {key}", r.transport);
        }
    }
    // A second invocation has its own id.
    let (_, again) = run(
        dir.path(),
        &[&["--transport", "pure:plain"], SMALL_DRAIN].concat(),
        &[],
    );
    assert_ne!(&again.last().unwrap().provenance.invocation, invocation);
}

#[test]
fn a_broken_control_line_is_a_failed_run_on_record_and_fails_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let (o, results) = run(
        dir.path(),
        &[&["--transport", "pure:plain"], SMALL_DRAIN].concat(),
        &[("RUNNER_TEST_BROKEN_STATS", "1")],
    );
    assert!(
        !o.status.success(),
        "a run whose server answered no statistics succeeded"
    );
    assert!(
        text(&o.stderr).contains("server statistics"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(results.len(), 1, "the failed run is on record");
    let error = results[0].error.as_deref().expect("its error");
    assert!(error.contains("server statistics"), "{error}");
    assert!(
        results[0].metric("orders_per_second").is_none(),
        "no rate from a run that could not read its server"
    );

    let file = dir.path().join("r.jsonl");
    let check = runner(&["check", file.to_str().unwrap()], &[]);
    assert_eq!(check.status.code(), Some(1), "{}", text(&check.stdout));
    assert!(text(&check.stdout).contains("FAIL"));
    let report = runner(&["report", file.to_str().unwrap()], &[]);
    assert!(report.status.success());
    assert!(
        text(&report.stdout).contains("round 0: error: server statistics"),
        "{}",
        text(&report.stdout)
    );
}

#[test]
fn a_synced_store_on_a_memory_filesystem_is_flagged_and_fails_the_check() {
    let shm = Path::new("/dev/shm");
    if transport_store::fs::filesystem(shm).ok().as_deref() != Some("tmpfs") {
        eprintln!("skipped: no tmpfs at /dev/shm");
        return;
    }
    let work = tempfile::tempdir_in(shm).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (o, results) = run(
        dir.path(),
        &[
            &["--transport", "pure:plain", "--sync", "batch"],
            SMALL_DRAIN,
            &["--work-dir", work.path().to_str().unwrap()],
        ]
        .concat(),
        &[],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let d = results[0].durability.as_ref().unwrap();
    assert_eq!(d.store_fs, "tmpfs");
    assert!(d.volatile_sync());
    let file = dir.path().join("r.jsonl");
    let report = runner(&["report", file.to_str().unwrap()], &[]);
    assert!(
        text(&report.stdout).contains("sync batch on tmpfs: not durability"),
        "{}",
        text(&report.stdout)
    );
    let check = runner(&["check", file.to_str().unwrap()], &[]);
    assert_eq!(check.status.code(), Some(1), "{}", text(&check.stdout));

    // Without a sync policy nothing is promised, and nothing is flagged.
    let dir = tempfile::tempdir().unwrap();
    let (o, _) = run(
        dir.path(),
        &[
            &["--transport", "pure:plain", "--sync", "none"],
            SMALL_DRAIN,
            &["--work-dir", work.path().to_str().unwrap()],
        ]
        .concat(),
        &[],
    );
    assert!(o.status.success());
    let file = dir.path().join("r.jsonl");
    let check = runner(&["check", file.to_str().unwrap()], &[]);
    assert!(check.status.success(), "{}", text(&check.stdout));
}

#[tokio::test]
async fn the_server_runs_on_its_own_cpu() {
    let plan = workloads::pin::plan(true).unwrap();
    if !plan.separate() {
        eprintln!("skipped: fewer than two CPUs");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let h = workloads::Harness {
        runner: env!("CARGO_BIN_EXE_runner").into(),
        work_dir: dir.path().to_path_buf(),
        server_threads: 1,
        sync: transport_store::SyncPolicy::None,
        profile: workloads::Profile::Quick,
        provenance: workloads::result::Provenance {
            pinning: plan.clone(),
            ..Default::default()
        },
        keep: false,
        progress: std::sync::Arc::new(|_| {}),
        hostile: false,
    };
    let t = transport_pure::variant("pure:plain").unwrap();
    let mut run = h
        .begin(
            &t,
            0,
            h.result("pin", "pure:plain", 0, serde_json::json!({})),
        )
        .unwrap();
    run.prepare(1).unwrap();
    run.start_server().await.unwrap();
    let pid = run.server().unwrap().pid();
    assert_eq!(workloads::pin::cpus_of(pid).unwrap(), plan.server_cpus);
    // A restarted server lands on the same CPU.
    run.restart_server().await.unwrap();
    let pid = run.server().unwrap().pid();
    assert_eq!(workloads::pin::cpus_of(pid).unwrap(), plan.server_cpus);
    let r = run.finish().await;
    assert_eq!(r.durability.unwrap().server_processes, 2);
}
