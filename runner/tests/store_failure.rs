//! A store that fails to write answers nothing as stored, and its server says so. The failure is real: the server
//! process runs with a file size limit (RLIMIT_FSIZE) and SIGXFSZ ignored, so the kernel refuses the store's write
//! past the limit with EFBIG, as a full disk refuses it with ENOSPC; no fault is simulated in the store's code.

use std::sync::Arc;
use std::time::{Duration, Instant};
use transport_core::{LinkEvent, OrderId, Transport};
use transport_store::SyncPolicy;
use workloads::durability::ServerStats;
use workloads::harness::{self, Harness, Profile, WorkloadError};
use workloads::process::{ProcessError, ServerProcess};

/// Bytes the server may write to a file: room for a few hundred orders of 64 bytes (114 bytes a record).
const LIMIT: u64 = 32 * 1024;

fn harness(dir: &std::path::Path) -> Harness {
    Harness {
        runner: env!("CARGO_BIN_EXE_runner").into(),
        work_dir: dir.to_path_buf(),
        server_threads: 1,
        sync: SyncPolicy::Batch,
        profile: Profile::Quick,
        provenance: Default::default(),
        keep: false,
        progress: Arc::new(|_| {}),
        hostile: false,
    }
}

/// `runner serve` for `spec` on the run's directories, with the file size limit.
fn limited_server(spec: &str, dirs: &harness::RunDirs) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_runner"));
    cmd.args([
        "serve",
        "--transport",
        spec,
        "--listen",
        "127.0.0.1:0",
        "--sync",
        "batch",
    ])
    .arg("--identity")
    .arg(&dirs.identity)
    .arg("--store")
    .arg(&dirs.store);
    // SAFETY: between fork and exec only two system calls, on values built before the fork.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: LIMIT,
                rlim_max: LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Ignored signals stay ignored across exec: the write fails with EFBIG instead of killing the server.
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    cmd
}

async fn a_full_store_answers_nothing_more(spec: &str) {
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path());
    let t: Box<dyn Transport> = transport_registry(spec);
    let devices = 4;
    let result = h.result("store-failure", spec, 0, serde_json::json!({}));
    let run = h.begin(t.as_ref(), 0, result).unwrap();
    run.prepare(devices).unwrap();
    let mut server = ServerProcess::start(limited_server(spec, &run.dirs), Duration::from_secs(30))
        .await
        .unwrap();
    let mut f = run.fleet(server.ready().addr, devices).await.unwrap();
    f.connect_all(devices).await.unwrap();

    // Far more orders than the limit holds, in waves, so that some groups commit before the store fills.
    let mut made: Vec<OrderId> = Vec::new();
    let mut acked: Vec<OrderId> = Vec::new();
    let runs: Vec<u64> = (0..devices).map(|_| harness::new_run()).collect();
    for wave in 0..10u64 {
        for i in 0..200u64 {
            let d = (i % devices as u64) as u32;
            let o = harness::order(d, runs[d as usize], wave * 200 + i, 64);
            made.push(o.id);
            f.fleet.send(d, o);
        }
        // Collect what is answered until the answers stop for a while.
        let mut quiet_since = Instant::now();
        while quiet_since.elapsed() < Duration::from_millis(300) {
            if let Ok(Some(LinkEvent::Stored { id, .. })) =
                tokio::time::timeout(Duration::from_millis(50), f.events.recv()).await
            {
                acked.push(id);
                quiet_since = Instant::now();
            }
        }
    }

    // The server says its store failed: on its control line while it runs (the QUIC servers go on serving and
    // answer nothing), or in its last line as it exits (Pure's loop ends on a store error).
    let said = match server.stats().await {
        Ok(v) => ServerStats::parse(&v).unwrap_err(),
        Err(ProcessError::Closed { .. } | ProcessError::NotRunning { .. }) => {
            server.shutdown().await.unwrap();
            ServerStats::parse(server.last_stats().expect("a last line")).unwrap_err()
        }
        Err(e) => panic!("{spec}: {e}"),
    };
    assert!(
        matches!(&said, WorkloadError::StoreFailed(r) | WorkloadError::Server(r) if r.contains("File too large")),
        "{spec}: {said}"
    );
    f.fleet.close().await;
    let _ = server.shutdown().await;

    let log = transport_store::read_log(&run.dirs.store).unwrap();
    let audit = transport_store::Audit::of_entries(&log, &made, &acked);
    assert!(
        !acked.is_empty(),
        "{spec}: the first groups fit and were answered"
    );
    assert!(
        (log.len() as u64) < made.len() as u64 / 2,
        "{spec}: the limit holds far fewer than were made ({} of {})",
        log.len(),
        made.len()
    );
    // Nothing was answered that is not in the log: no answer after the failure, none for the failed group.
    assert_eq!(audit.acked_not_applied, 0, "{spec}: {audit:?}");
    assert!(audit.acked <= audit.applied, "{spec}: {audit:?}");
    assert_eq!(audit.duplicates, 0, "{spec}: {audit:?}");
    run.finish().await;
}

fn transport_registry(spec: &str) -> Box<dyn Transport> {
    match spec {
        "quinn" => (transport_quinn::SPECS[0].make)(),
        other => Box::new(transport_pure::variant(other).unwrap()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pure_server_whose_store_fills_answers_nothing_more_and_exits_saying_why() {
    a_full_store_answers_nothing_more("pure:plain").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quic_server_whose_store_fills_answers_nothing_more_and_reports_it() {
    a_full_store_answers_nothing_more("quinn").await;
}
