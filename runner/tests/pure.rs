//! End-to-end tests of Pure through real server processes (`runner serve`), real UDP sockets and the real store.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transport_core::{device_name, sender_id, LinkEvent, Order, OrderId, Transport};
use transport_store::SyncPolicy;
use workloads::harness::{self, Harness, Profile, Run};

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

/// A run of `t` by hand, named `name`, with an identity for `devices` devices.
fn begin<'a>(h: &'a Harness, t: &'a dyn Transport, name: &str, devices: u32) -> Run<'a> {
    let result = h.result(name, t.spec(), 0, serde_json::json!({}));
    let run = h.begin(t, 0, result).unwrap();
    run.prepare(devices).unwrap();
    run
}

fn order(device: u32, run: u64, seq: u64) -> Order {
    let id = OrderId {
        sender: sender_id(&device_name(device)),
        run,
        seq,
    };
    Order {
        id,
        made_us: seq,
        payload: harness::payload(&id, 64),
    }
}

async fn wait_stored(
    events: &mut transport_core::events::EventReceiver,
    acked: &mut Vec<OrderId>,
    want: usize,
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    while acked.len() < want {
        match tokio::time::timeout_at(deadline.into(), events.recv()).await {
            Ok(Some(LinkEvent::Stored { id, .. })) => acked.push(id),
            Ok(Some(_)) => {}
            _ => panic!("only {} of {want} orders answered", acked.len()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_drain_loses_no_acknowledged_order_and_applies_none_twice() {
    for spec in ["pure", "pure:hpke-session", "pure:plain"] {
        let dir = tempfile::tempdir().unwrap();
        let h = harness(dir.path());
        let t = Box::new(transport_pure::variant(spec).unwrap());
        let mut run = begin(&h, t.as_ref(), "kill", 4);
        let addr = run.start_server().await.unwrap();
        let mut f = run.fleet(addr, 4).await.unwrap();
        let mut made = Vec::new();
        for seq in 0..3000u64 {
            let o = order((seq % 4) as u32, 7, seq);
            made.push(o.id);
            f.fleet.send((seq % 4) as u32, o);
        }
        let mut acked = Vec::new();
        wait_stored(&mut f.events, &mut acked, 500, Duration::from_secs(30)).await;
        run.server().unwrap().kill().await.unwrap();
        let acked_before_kill = acked.clone();
        // The log holds every order answered before the kill.
        let audit = transport_store::audit(&run.dirs.store, &acked_before_kill, &acked_before_kill)
            .unwrap();
        assert_eq!(
            audit.acked_not_applied, 0,
            "{spec}: an answered order is durable"
        );
        run.start_server().await.unwrap();
        wait_stored(
            &mut f.events,
            &mut acked,
            made.len(),
            Duration::from_secs(60),
        )
        .await;
        f.fleet.close().await;
        run.server().unwrap().shutdown().await.unwrap();
        let audit = transport_store::audit(&run.dirs.store, &made, &acked).unwrap();
        run.finish().await;
        assert!(audit.is_clean(), "{spec}: {audit:?}");
        assert_eq!(audit.applied, 3000, "{spec}");
        let distinct: std::collections::HashSet<_> = acked.iter().collect();
        assert_eq!(
            distinct.len(),
            acked.len(),
            "{spec}: each order answered once to the workload"
        );
    }
}

/// Send raw datagrams to the server from a socket of our own.
async fn send_raw(to: SocketAddr, datagrams: &[Vec<u8>]) {
    let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for d in datagrams {
        s.send_to(d, to).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_forged_records_are_refused_and_counted_while_the_run_goes_on() {
    use rand::SeedableRng;
    use transport_pure::crypto::NodeKey;
    use transport_pure::sender::{Sender, SenderConfig};
    use transport_pure::wire::{self, Kind};

    let spec = "pure";
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path());
    let t = Box::new(transport_pure::variant(spec).unwrap());
    let mut run = begin(&h, t.as_ref(), "refuse", 2);
    let addr = run.start_server().await.unwrap();
    let mut f = run.fleet(addr, 2).await.unwrap();
    let dirs = run.dirs.clone();

    // Records from a node that is not allowed, and the same records claiming device 0's key id.
    let node_public = transport_core::keys::read_key32(&dirs.identity.join("node.pub")).unwrap();
    let senders = transport_pure::senders::AllowList::load(&dirs.identity.join("senders")).unwrap();
    let victim = wire::key_id(&senders.senders()[0].public);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let impostor = NodeKey::generate(&mut rng);
    let own = impostor.key_id();
    let counters = Arc::new(transport_core::Counters::default());
    let mut s = Sender::new(
        SenderConfig::new(Kind::Link),
        impostor,
        node_public,
        rng,
        counters,
    )
    .unwrap();
    for seq in 0..5 {
        s.push(Instant::now(), order(0, 99, seq));
    }
    let mut unknown = Vec::new();
    assert!(s.poll_transmit(Instant::now(), &mut unknown));
    let mut forged = unknown.clone();
    // The five orders go in one bundle (one frame): each frame is refused once.
    let (mut at, mut frames) = (0, 0u64);
    while at < forged.len() {
        let (_, used) = wire::parse_frame(&forged[at..]).unwrap();
        assert_eq!(&forged[at + 2..at + 10], &own);
        forged[at + 2..at + 10].copy_from_slice(&victim);
        at += used;
        frames += 1;
    }
    let garbage: Vec<Vec<u8>> = (0..50u8).map(|i| vec![i; 1 + i as usize * 7]).collect();

    let mut made = Vec::new();
    let mut acked = Vec::new();
    for seq in 0..400u64 {
        let o = order((seq % 2) as u32, 5, seq);
        made.push(o.id);
        f.fleet.send((seq % 2) as u32, o);
        if seq == 200 {
            send_raw(addr, &garbage).await;
            send_raw(addr, &[unknown.clone(), forged.clone()]).await;
        }
    }
    wait_stored(&mut f.events, &mut acked, 400, Duration::from_secs(30)).await;
    let stats = run.server().unwrap().stats().await.unwrap();
    let c: transport_core::CounterSnapshot =
        serde_json::from_value(stats["counters"].clone()).unwrap();
    assert!(c.refused_malformed >= 49, "{c:?}");
    assert_eq!(c.refused_unknown, frames, "{c:?}");
    assert_eq!(c.refused_forged, frames, "{c:?}");
    f.fleet.close().await;
    run.server().unwrap().shutdown().await.unwrap();
    let audit = transport_store::audit(&dirs.store, &made, &acked).unwrap();
    run.finish().await;
    assert!(
        audit.is_clean(),
        "nothing from the impostor was applied: {audit:?}"
    );
    assert_eq!(audit.applied, 400);
}

#[test]
fn the_runner_prints_the_drain_table_and_writes_results() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.jsonl");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_runner"))
        .args([
            "--transport",
            "pure:plain,pure:hpke-session,pure:hpke-per-request,pure",
            "--workload",
            "drain",
        ])
        .args(["--rounds", "2", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        stdout.contains("### drain") && stdout.contains("pure:hpke-per-request"),
        "{stdout}"
    );
    let results = workloads::result::read(&out).unwrap();
    assert_eq!(results.len(), 8);
    for r in &results {
        for key in ["orders", "applied", "lost", "duplicates", "server_cpu_s"] {
            assert!(
                r.metrics.contains_key(key),
                "{key} in {:?}",
                r.metrics.keys()
            );
        }
        assert_eq!(r.metric("lost"), Some(0.0));
        assert_eq!(r.metric("duplicates"), Some(0.0));
        // The quick profile: 20,000 orders from 16 devices (2,000 from 2 for the per-request variant), and one
        // warm-up per device.
        let (backlog, devices) = if r.transport == "pure:hpke-per-request" {
            (2_000.0, 2.0)
        } else {
            (20_000.0, 16.0)
        };
        assert_eq!(r.metric("orders"), Some(backlog));
        assert_eq!(r.metric("clients"), Some(devices));
        assert_eq!(r.metric("applied"), Some(backlog + devices));
        // Every order of the backlog once: at its answer, or at the deadline if it had none.
        assert_eq!(
            workloads::hist::decode(&r.histograms["continue_to_stored"])
                .unwrap()
                .len() as f64,
            backlog
        );
        // A steady part needs a few group commits: the per-request variant, a hundred times slower (and slower
        // still in a debug build), may take its small backlog in one or two.
        if r.transport != "pure:hpke-per-request" {
            assert!(r.metric("steady_groups").unwrap() >= 2.0, "{}", r.transport);
            assert!(r.metric("orders_per_second").unwrap() > 0.0);
        }
        assert!(!r.provenance.rustc.is_empty() && r.provenance.cores > 0);
        assert!(["mimalloc", "system"].contains(&r.provenance.allocator.as_str()));
    }
    // Rounds rotate the order of the transports.
    assert_ne!(results[0].transport, results[4].transport);
}

#[test]
fn the_restart_workload_reports_the_memo_and_no_memo_shape() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.jsonl");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_runner"))
        .args([
            "--transport",
            "pure,pure:no-memo",
            "--workload",
            "restart",
            "--rounds",
            "1",
        ])
        .args([
            "--param",
            "devices=50",
            "--param",
            "kill_at_s=1.5",
            "--param",
            "duration_s=3",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let results = workloads::result::read(&out).unwrap();
    for r in &results {
        assert_eq!(r.metric("lost"), Some(0.0), "{}", r.transport);
        assert_eq!(r.metric("duplicates"), Some(0.0), "{}", r.transport);
        assert_eq!(r.metric("orders_made"), r.metric("orders_applied"));
        let asym = r.metric("asym_ops_after").unwrap();
        match r.transport.as_str() {
            "pure" => assert_eq!(asym, 0.0, "the memo spares every X25519 after a restart"),
            _ => assert_eq!(asym, 50.0, "one X25519 per returning device"),
        }
        assert!(r.metrics["timeline"]
            .as_array()
            .is_some_and(|t| !t.is_empty()));
    }
}

#[test]
fn interrupting_the_runner_leaves_no_server_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_runner"))
        .args([
            "--transport",
            "pure",
            "--workload",
            "restart",
            "--rounds",
            "1",
            "--param",
            "devices=20",
        ])
        .args([
            "--param",
            "duration_s=30",
            "--param",
            "kill_at_s=20",
            "--out",
        ])
        .arg(dir.path().join("r.jsonl"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Wait for the server child to appear.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut servers = Vec::new();
    while servers.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        servers = children_of(pid);
    }
    assert!(!servers.is_empty(), "the runner started a server");
    // SAFETY: plain kill(2) on a child we spawned.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    std::thread::sleep(Duration::from_millis(300));
    for s in servers {
        let alive =
            std::fs::read_to_string(format!("/proc/{s}/stat")).is_ok_and(|st| !st.contains(") Z "));
        assert!(!alive, "server {s} outlived its runner");
    }
}

fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(st) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
            if let Some(rest) = st.rsplit_once(')').map(|(_, r)| r) {
                let ppid: u32 = rest
                    .split_whitespace()
                    .nth(1)
                    .and_then(|x| x.parse().ok())
                    .unwrap_or(0);
                if ppid == pid {
                    out.push(p);
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_sharing_a_socket_each_get_their_answers() {
    // The shared-sockets variant with more devices than its 16 sockets: several devices share each client socket,
    // so the receiver packs answers for different devices into one datagram. Every device must take its own and
    // none may be thrown away. (By default each device has its own socket: `transports/pure/tests/sockets.rs`.)
    let spec = "pure+shared-sockets";
    let devices = 48u32;
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path());
    let t = Box::new(transport_pure::variant(spec).unwrap());
    let mut run = begin(&h, t.as_ref(), "shared", devices);
    let addr = run.start_server().await.unwrap();
    let mut f = run.fleet(addr, devices).await.unwrap();
    let mut acked = Vec::new();
    for seq in 0..5u64 {
        for d in 0..devices {
            f.fleet.send(d, order(d, 3, seq));
        }
        wait_stored(
            &mut f.events,
            &mut acked,
            ((seq + 1) * devices as u64) as usize,
            Duration::from_secs(30),
        )
        .await;
    }
    let c = f.counters.snapshot();
    assert_eq!(
        c.refused_malformed, 0,
        "no answer was dropped as another device's: {c:?}"
    );
    f.fleet.close().await;
    run.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_server_relays_qos0_at_most_once_and_qos1_exactly_once_to_every_subscriber() {
    use std::collections::HashMap;
    use transport_core::{Publish, QoS};
    const SUBSCRIBERS: u32 = 4;
    const MESSAGES: u64 = 300;
    for spec in [
        "pure",
        "pure:hpke-session",
        "pure:hpke-per-request",
        "pure:plain",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let h = harness(dir.path());
        let t = Box::new(transport_pure::variant(spec).unwrap());
        assert!(t.capabilities().pubsub.is_yes());
        let mut run = begin(&h, t.as_ref(), "relay", SUBSCRIBERS + 1);
        let addr = run.start_server().await.unwrap();
        let mut f = run.fleet(addr, SUBSCRIBERS + 1).await.unwrap();
        // Device 0 publishes; devices 1.. subscribe to channel 1 at QoS 1 and channel 2 at QoS 0.
        for d in 1..=SUBSCRIBERS {
            f.fleet.subscribe(d, 1, QoS::AtLeastOnce).await.unwrap();
            f.fleet.subscribe(d, 2, QoS::AtMostOnce).await.unwrap();
        }
        for id in 0..MESSAGES {
            for (channel, qos, id) in [(1, QoS::AtLeastOnce, id), (2, QoS::AtMostOnce, 10_000 + id)]
            {
                let size = 64;
                f.fleet.publish(
                    0,
                    Publish {
                        channel,
                        id,
                        qos,
                        size,
                    },
                );
            }
            if id % 50 == 49 {
                // An open loop in bursts, as a workload at a rate would send.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let mut accepted = HashMap::<u64, u32>::new();
        let mut delivered = HashMap::<(u32, u64), u32>::new();
        let qos1 = |d: &HashMap<(u32, u64), u32>| d.keys().filter(|(_, id)| *id < 10_000).count();
        let want = (SUBSCRIBERS as u64 * MESSAGES) as usize;
        let deadline = Instant::now() + Duration::from_secs(60);
        f.until(deadline, |e| {
            match *e {
                LinkEvent::Accepted { device, id, .. } => {
                    assert_eq!(device, 0);
                    *accepted.entry(id).or_default() += 1;
                }
                LinkEvent::Delivered { device, id, .. } => {
                    *delivered.entry((device, id)).or_default() += 1;
                }
                _ => {}
            }
            accepted.len() == 2 * MESSAGES as usize && qos1(&delivered) == want
        })
        .await;
        // QoS 0 deliveries still on their way.
        f.until(Instant::now() + Duration::from_millis(500), |e| {
            if let LinkEvent::Delivered { device, id, .. } = *e {
                *delivered.entry((device, id)).or_default() += 1;
            }
            false
        })
        .await;
        assert_eq!(
            accepted.len(),
            2 * MESSAGES as usize,
            "{spec}: all accepted"
        );
        assert!(
            accepted.values().all(|n| *n == 1),
            "{spec}: accepted once each"
        );
        assert_eq!(f.fleet.publishing(), 0, "{spec}");
        assert_eq!(
            qos1(&delivered),
            want,
            "{spec}: every QoS 1 message to every subscriber"
        );
        assert!(
            delivered.values().all(|n| *n == 1),
            "{spec}: each delivered once"
        );
        assert!(
            delivered.keys().all(|(d, _)| (1..=SUBSCRIBERS).contains(d)),
            "{spec}"
        );
        let qos0 = delivered.len() - want;
        let stats = run.server_stats().await.unwrap();
        let c = stats.counters;
        // Nothing silently missing: what the server did not deliver at QoS 0 it counted.
        assert_eq!(qos0 as u64 + c.dropped, want as u64, "{spec}: {c:?}");
        assert_eq!(c.refused(), 0, "{spec}: {c:?}");
        assert_eq!(f.counters.snapshot().refused(), 0, "{spec}");
        // Publishes never reach the store.
        f.fleet.close().await;
        run.server().unwrap().shutdown().await.unwrap();
        let audit = transport_store::audit(&run.dirs.store, &[], &[]).unwrap();
        run.finish().await;
        assert_eq!(audit.applied, 0, "{spec}: {audit:?}");
    }
}
