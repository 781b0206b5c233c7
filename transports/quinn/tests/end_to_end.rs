//! The quinn transport over real UDP on 127.0.0.1: an in-process server with a real store, a fleet of devices.
//!
//! The server runs on its own thread and current-thread runtime (as `runner serve --server-threads 1` would); it is
//! "killed" by dropping that runtime without running it again, so nothing it had not sent already goes out: no
//! CONNECTION_CLOSE, no answers. Only hard invariants are asserted, never timings.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use transport_core::connfleet::Connector;
use transport_core::store::{self, Store, StoreHandle, SyncPolicy};
use transport_core::tls::DeviceCredentials;
use transport_core::{
    CounterSnapshot, Counters, Fleet, FleetConfig, LinkEvent, Order, OrderId, ServeConfig,
};

/// A server on its own thread and runtime.
struct Server {
    addr: SocketAddr,
    counters: Arc<Counters>,
    store: StoreHandle,
    kill: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Start on `listen` (port 0: any), retrying while the previous process's port is still being released.
    fn start(identity: &Path, store_dir: &Path, listen: SocketAddr) -> Server {
        let (store, _) = retry(|| Store::open(store_dir, SyncPolicy::Batch));
        let store = StoreHandle::spawn(store);
        let counters = Arc::new(Counters::default());
        for _ in 0..100 {
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let (kill, kill_rx) = oneshot::channel::<()>();
            let config = (identity.to_path_buf(), store.clone(), counters.clone());
            let thread = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let (identity, store, counters) = config;
                let (ready, ready_in) = oneshot::channel();
                let config = ServeConfig {
                    listen,
                    identity,
                    store,
                    threads: 1,
                    counters,
                    senders: Vec::new(),
                    ready,
                };
                let serve = transport_quinn::transport(None).unwrap().serve(config);
                runtime.block_on(async move {
                    tokio::pin!(serve);
                    tokio::select! {
                        ready = ready_in => {
                            let _ = ready_tx.send(ready.ok().map(|r| r.addr));
                        }
                        result = &mut serve => {
                            // Ended before it was ready (the port is still taken): the caller retries.
                            if let Err(e) = result {
                                eprintln!("serve ended: {e}");
                            }
                            let _ = ready_tx.send(None);
                            return;
                        }
                    }
                    tokio::select! {
                        result = &mut serve => panic!("serve ended: {result:?}"),
                        _ = kill_rx => {}
                    }
                });
                // Dropped without running again: like SIGKILL, nothing more is sent.
                runtime.shutdown_background();
            });
            match ready_rx.recv_timeout(Duration::from_secs(10)) {
                Ok(Some(addr)) => {
                    return Server {
                        addr,
                        counters,
                        store,
                        kill: Some(kill),
                        thread: Some(thread),
                    };
                }
                _ => {
                    // Could not bind yet (the old socket is still closing): try again.
                    let _ = thread.join();
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        panic!("the server did not start on {listen}");
    }

    /// Kill the server and release its store.
    async fn kill(mut self) -> CounterSnapshot {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        if let Some(thread) = self.thread.take() {
            tokio::task::spawn_blocking(move || thread.join())
                .await
                .unwrap()
                .unwrap();
        }
        self.store.close().await;
        self.counters.snapshot()
    }
}

fn retry<T, E: std::fmt::Debug>(mut f: impl FnMut() -> Result<T, E>) -> T {
    for _ in 0..100 {
        if let Ok(t) = f() {
            return t;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f().unwrap()
}

struct Setup {
    _dir: tempfile::TempDir,
    identity: PathBuf,
    store_dir: PathBuf,
}

fn setup(devices: u32) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let identity = dir.path().join("identity");
    let store_dir = dir.path().join("store");
    transport_quinn::transport(None)
        .unwrap()
        .prepare(&identity, devices)
        .unwrap();
    Setup {
        _dir: dir,
        identity,
        store_dir,
    }
}

async fn fleet(
    setup: &Setup,
    server: SocketAddr,
    devices: u32,
) -> (
    Box<dyn Fleet>,
    mpsc::UnboundedReceiver<LinkEvent>,
    Arc<Counters>,
) {
    let (events, rx) = mpsc::unbounded_channel();
    let counters = Arc::new(Counters::default());
    let config = FleetConfig {
        server,
        identity: setup.identity.clone(),
        devices,
        events,
        counters: counters.clone(),
    };
    let fleet = transport_quinn::transport(None)
        .unwrap()
        .fleet(config)
        .await
        .unwrap();
    (fleet, rx, counters)
}

fn order(device: u32, seq: u64) -> Order {
    let id = OrderId {
        sender: u64::from(device),
        run: 0x5eed,
        seq,
    };
    let mut payload = Vec::new();
    transport_core::order::fill_payload(&id, 64, &mut payload);
    Order {
        id,
        made_us: 0,
        payload,
    }
}

/// Wait until every order in `made` has been reported stored; count every Stored event per order.
async fn wait_stored(
    rx: &mut mpsc::UnboundedReceiver<LinkEvent>,
    made: &[OrderId],
    seen: &mut HashMap<OrderId, u32>,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut missing: HashSet<OrderId> = made
        .iter()
        .filter(|id| !seen.contains_key(id))
        .copied()
        .collect();
    while !missing.is_empty() {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(LinkEvent::Stored { id, .. })) => {
                *seen.entry(id).or_default() += 1;
                missing.remove(&id);
            }
            Ok(Some(LinkEvent::Connected { .. })) => {}
            _ => panic!(
                "{} of {} orders never reported stored",
                missing.len(),
                made.len()
            ),
        }
    }
}

/// After the run: no more Stored events may arrive, and every order was reported exactly once.
async fn assert_reported_once(
    rx: &mut mpsc::UnboundedReceiver<LinkEvent>,
    seen: &mut HashMap<OrderId, u32>,
) {
    tokio::time::sleep(Duration::from_millis(200)).await;
    while let Ok(event) = rx.try_recv() {
        if let LinkEvent::Stored { id, .. } = event {
            *seen.entry(id).or_default() += 1;
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, &n)| n != 1).collect();
    assert!(twice.is_empty(), "reported more than once: {twice:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_devices_store_every_order_once_and_count_their_handshakes() {
    const DEVICES: u32 = 50;
    let setup = setup(DEVICES);
    let server = Server::start(
        &setup.identity,
        &setup.store_dir,
        "127.0.0.1:0".parse().unwrap(),
    );
    let (fleet, mut rx, client) = fleet(&setup, server.addr, DEVICES).await;

    let mut made = Vec::new();
    for seq in 0..4 {
        for device in 0..DEVICES {
            let o = order(device, seq);
            made.push(o.id);
            fleet.send(device, o);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut seen = HashMap::new();
    wait_stored(&mut rx, &made, &mut seen).await;
    assert_eq!(fleet.pending(), 0);
    fleet.close().await;
    assert_reported_once(&mut rx, &mut seen).await;

    let server_counts = server.kill().await;
    let audit = store::audit(&setup.store_dir, &made, &made).unwrap();
    assert!(audit.is_clean(), "{audit:?}");
    assert_eq!(audit.applied, made.len() as u64);

    let client_counts = client.snapshot();
    let n = u64::from(DEVICES);
    assert_eq!(client_counts.handshakes, n, "{client_counts:?}");
    assert_eq!(server_counts.handshakes, n, "{server_counts:?}");
    assert_eq!(server_counts.received, made.len() as u64);
    // A full TLS 1.3 handshake with CA-issued certificates: per side 2 X25519 (ephemeral key, agreement),
    // 1 signature (CertificateVerify), 2 verifications (the peer's certificate, the peer's CertificateVerify).
    for counts in [client_counts, server_counts] {
        assert_eq!(
            (counts.x25519, counts.ecdh, counts.sign, counts.verify),
            (2 * n, 0, n, 2 * n),
            "{counts:?}"
        );
    }
    assert_eq!((client_counts.resent, client_counts.reconnects), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_restarted_on_its_port_loses_nothing_and_applies_nothing_twice() {
    const DEVICES: u32 = 50;
    let setup = setup(DEVICES);
    let first = Server::start(
        &setup.identity,
        &setup.store_dir,
        "127.0.0.1:0".parse().unwrap(),
    );
    let addr = first.addr;
    let (fleet, mut rx, client) = fleet(&setup, addr, DEVICES).await;
    let mut made = Vec::new();
    let mut seen = HashMap::new();
    let send_round = |seq: u64, made: &mut Vec<OrderId>| {
        for device in 0..DEVICES {
            let o = order(device, seq);
            made.push(o.id);
            fleet.send(device, o);
        }
    };

    // Every device connected and stored something.
    send_round(0, &mut made);
    wait_stored(&mut rx, &made, &mut seen).await;

    // Orders in flight when the server dies: some are committed and never answered, some never arrive.
    send_round(1, &mut made);
    tokio::time::sleep(Duration::from_millis(3)).await;
    let before = first.kill().await;
    let second = Server::start(&setup.identity, &setup.store_dir, addr);
    assert_eq!(second.addr, addr);
    send_round(2, &mut made);
    wait_stored(&mut rx, &made, &mut seen).await;
    assert_eq!(fleet.pending(), 0);
    fleet.close().await;
    assert_reported_once(&mut rx, &mut seen).await;
    let after = second.kill().await;

    let audit = store::audit(&setup.store_dir, &made, &made).unwrap();
    assert!(audit.is_clean(), "{audit:?}");
    assert_eq!(
        (audit.applied, audit.duplicates, audit.lost),
        (made.len() as u64, 0, 0)
    );

    // Every device had to make a new connection to the new server, and sent its unanswered orders again.
    let c = client.snapshot();
    let n = u64::from(DEVICES);
    assert!(c.reconnects >= n, "{c:?}");
    assert_eq!(c.handshakes, n + c.reconnects, "{c:?}");
    assert!(after.handshakes >= n, "{after:?}");
    assert_eq!(before.handshakes, n, "{before:?}");
    assert!(after.x25519 >= 2 * n && after.sign >= n, "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restarted_server_resets_old_connections() {
    let setup = setup(1);
    let first = Server::start(
        &setup.identity,
        &setup.store_dir,
        "127.0.0.1:0".parse().unwrap(),
    );
    let addr = first.addr;
    let credentials = Arc::new(DeviceCredentials::load(&setup.identity).unwrap());
    let counters = Arc::new(Counters::default());
    let connector = transport_quinn::QuinnConnector::new(addr, credentials, 1, counters).unwrap();
    let conn = connector.connect(0).await.unwrap();
    let answer = connector.send_order(&conn, &order(0, 0)).await.unwrap();
    assert_eq!(
        answer,
        transport_core::connfleet::Answer::Stored(order(0, 0).id)
    );

    first.kill().await;
    let second = Server::start(&setup.identity, &setup.store_dir, addr);
    // The next packet on the old connection reaches a process that never knew it; the stateless reset derived from
    // the same key file closes it (well before the 30 s idle timeout could).
    assert!(connector.send_order(&conn, &order(0, 1)).await.is_err());
    let reason = tokio::time::timeout(Duration::from_secs(25), conn.closed())
        .await
        .unwrap();
    assert!(
        matches!(reason, quinn::ConnectionError::Reset),
        "{reason:?}"
    );
    second.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_from_another_ca_is_refused() {
    let setup = setup(2);
    let server = Server::start(
        &setup.identity,
        &setup.store_dir,
        "127.0.0.1:0".parse().unwrap(),
    );
    let foreign = Arc::new(DeviceCredentials::foreign(&setup.identity, 2).unwrap());
    let (events, mut rx) = mpsc::unbounded_channel();
    let counters = Arc::new(Counters::default());
    let fleet =
        transport_quinn::fleet_with_credentials(server.addr, foreign, 2, events, counters.clone())
            .unwrap();
    // The client's side of the handshake may finish before the server has checked its certificate, so the
    // connect itself may succeed; what matters is that the server refuses it and nothing is ever stored.
    let _ = fleet.connect(0).await;
    fleet.send(1, order(1, 0));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fleet.pending(), 1);
    fleet.close().await;
    assert!(
        !std::iter::from_fn(|| rx.try_recv().ok()).any(|e| matches!(e, LinkEvent::Stored { .. }))
    );

    let s = server.kill().await;
    assert_eq!(s.handshakes, 0, "{s:?}");
    assert!(s.refused_unknown >= 1, "{s:?}");
    // Nothing from the foreign devices reached the store.
    let audit = store::audit(&setup.store_dir, &[], &[]).unwrap();
    assert_eq!(audit.applied, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_in_another_devices_name_or_too_large_to_store_are_refused() {
    use transport_core::connfleet::Answer;
    let setup = setup(2);
    let server = Server::start(
        &setup.identity,
        &setup.store_dir,
        "127.0.0.1:0".parse().unwrap(),
    );
    let credentials = Arc::new(DeviceCredentials::load(&setup.identity).unwrap());
    let connector = transport_quinn::QuinnConnector::new(
        server.addr,
        credentials,
        2,
        Arc::new(Counters::default()),
    )
    .unwrap();
    let conn = connector.connect(0).await.unwrap();
    // Device 0 sending in device 1's name.
    let spoofed = order(1, 0);
    assert_eq!(
        connector.send_order(&conn, &spoofed).await.unwrap(),
        Answer::Refused(spoofed.id)
    );
    // A payload larger than a store record can hold.
    let mut huge = order(0, 1);
    huge.payload = vec![7; transport_core::store::MAX_PAYLOAD + 1];
    assert_eq!(
        connector.send_order(&conn, &huge).await.unwrap(),
        Answer::Refused(huge.id)
    );
    // The connection is still good for a proper order.
    let fine = order(0, 2);
    assert_eq!(
        connector.send_order(&conn, &fine).await.unwrap(),
        Answer::Stored(fine.id)
    );

    let s = server.kill().await;
    assert_eq!(
        (s.refused_unknown, s.refused_malformed, s.received),
        (1, 1, 3),
        "{s:?}"
    );
    let audit = store::audit(&setup.store_dir, &[fine.id], &[fine.id]).unwrap();
    assert!(audit.is_clean() && audit.applied == 1, "{audit:?}");
}
