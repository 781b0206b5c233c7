//! The s2n-quic transport over real UDP on 127.0.0.1, both variants: an in-process server with a real store, a
//! fleet of devices.
//!
//! The server runs on its own thread and current-thread runtime (as `runner serve --server-threads 1` would); it is
//! "killed" by dropping that runtime without running it again, so nothing it had not sent already goes out: no
//! CONNECTION_CLOSE, no answers. Only hard invariants are asserted, never timings (except that a stateless reset
//! closes an old connection well before the 30 s idle timeout could).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use transport_core::connfleet::{Answer, Connector};
use transport_core::store::{self, Store, StoreHandle, SyncPolicy};
use transport_core::tls::DeviceCredentials;
use transport_core::{
    CounterSnapshot, Counters, Fleet, FleetConfig, LinkEvent, Order, OrderId, ServeConfig,
};
use transport_s2n_quic::Provider;

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
    fn start(provider: Provider, identity: &Path, store_dir: &Path, listen: SocketAddr) -> Server {
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
                let serve = transport_s2n_quic::transport(provider.spec())
                    .unwrap()
                    .serve(config);
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
    provider: Provider,
    _dir: tempfile::TempDir,
    identity: PathBuf,
    store_dir: PathBuf,
}

impl Setup {
    fn new(provider: Provider, devices: u32) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let identity = dir.path().join("identity");
        let store_dir = dir.path().join("store");
        transport_s2n_quic::transport(provider.spec())
            .unwrap()
            .prepare(&identity, devices)
            .unwrap();
        Setup {
            provider,
            _dir: dir,
            identity,
            store_dir,
        }
    }

    fn server(&self, listen: SocketAddr) -> Server {
        Server::start(self.provider, &self.identity, &self.store_dir, listen)
    }

    async fn fleet(
        &self,
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
            identity: self.identity.clone(),
            devices,
            events,
            counters: counters.clone(),
        };
        let fleet = transport_s2n_quic::transport(self.provider.spec())
            .unwrap()
            .fleet(config)
            .await
            .unwrap();
        (fleet, rx, counters)
    }
}

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
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

/// The asymmetric operations of `n` full handshakes on one side, as each provider reports them: rustls counts
/// X25519 (its first key share) where it happens; s2n-tls's default policy negotiates P-256, derived per handshake.
/// Either way per handshake: 2 key-exchange operations, 1 signature, 2 verifications (the peer's certificate and
/// its CertificateVerify).
fn expected_asym(provider: Provider, n: u64) -> (u64, u64, u64, u64) {
    match provider {
        Provider::Rustls => (2 * n, 0, n, 2 * n),
        Provider::S2nTls => (0, 2 * n, n, 2 * n),
    }
}

fn asym(c: &CounterSnapshot) -> (u64, u64, u64, u64) {
    (c.x25519, c.ecdh, c.sign, c.verify)
}

async fn every_order_stored_once_and_handshakes_counted(provider: Provider) {
    const DEVICES: u32 = 50;
    let setup = Setup::new(provider, DEVICES);
    let server = setup.server(any_port());
    let (fleet, mut rx, client) = setup.fleet(server.addr, DEVICES).await;

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
    assert_eq!(server_counts.refused(), 0, "{server_counts:?}");
    for counts in [client_counts, server_counts] {
        assert_eq!(asym(&counts), expected_asym(provider, n), "{counts:?}");
    }
    assert_eq!((client_counts.resent, client_counts.reconnects), (0, 0));
}

async fn a_killed_server_restarted_on_its_port_loses_nothing_and_applies_nothing_twice(
    provider: Provider,
) {
    const DEVICES: u32 = 50;
    let setup = Setup::new(provider, DEVICES);
    let first = setup.server(any_port());
    let addr = first.addr;
    let (fleet, mut rx, client) = setup.fleet(addr, DEVICES).await;
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
    let second = setup.server(addr);
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
    let (x25519, ecdh, sign, _) = asym(&after);
    assert!(x25519 + ecdh >= 2 * n && sign >= n, "{after:?}");
}

async fn the_restarted_server_resets_old_connections(provider: Provider) {
    let setup = Setup::new(provider, 1);
    let first = setup.server(any_port());
    let addr = first.addr;
    let credentials = Arc::new(DeviceCredentials::load(&setup.identity).unwrap());
    let counters = Arc::new(Counters::default());
    let connector = transport_s2n_quic::S2nConnector::new(
        provider,
        addr,
        &setup.identity,
        credentials,
        1,
        counters,
    )
    .unwrap();
    let conn = connector.connect(0).await.unwrap();
    let answer = connector.send_order(&conn, &order(0, 0)).await.unwrap();
    assert_eq!(answer, Answer::Stored(order(0, 0).id));
    let closed = connector.closed(&conn);

    first.kill().await;
    let second = setup.server(addr);
    // The next packet on the old connection reaches a process that never knew it; the stateless reset derived from
    // the same key file closes it (well before the 30 s idle timeout could; s2n-quic never closes a connection for
    // lack of acknowledgements alone).
    let result = connector.send_order(&conn, &order(0, 1)).await;
    assert!(result.is_err(), "{result:?}");
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("the old connection was not reset");
    second.kill().await;
}

async fn a_device_from_another_ca_is_refused(provider: Provider) {
    let setup = Setup::new(provider, 2);
    let server = setup.server(any_port());
    let foreign = Arc::new(DeviceCredentials::foreign(&setup.identity, 2).unwrap());
    let (events, mut rx) = mpsc::unbounded_channel();
    let counters = Arc::new(Counters::default());
    let fleet = transport_s2n_quic::fleet_with_credentials(
        provider,
        server.addr,
        &setup.identity,
        foreign,
        2,
        events,
        counters.clone(),
    )
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

async fn orders_in_another_devices_name_or_too_large_to_store_are_refused(provider: Provider) {
    let setup = Setup::new(provider, 2);
    let server = setup.server(any_port());
    let credentials = Arc::new(DeviceCredentials::load(&setup.identity).unwrap());
    let connector = transport_s2n_quic::S2nConnector::new(
        provider,
        server.addr,
        &setup.identity,
        credentials,
        2,
        Arc::new(Counters::default()),
    )
    .unwrap();
    let conn = connector.connect(0).await.unwrap();
    // Device 0, authenticated as dev-0, sending in device 1's name.
    let spoofed = order(1, 0);
    assert_eq!(
        connector.send_order(&conn, &spoofed).await.unwrap(),
        Answer::Refused(spoofed.id)
    );
    // A payload larger than a store record can hold.
    let mut huge = order(0, 1);
    huge.payload = vec![7; store::MAX_PAYLOAD + 1];
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

/// The same checks for each variant, as separate tests.
macro_rules! variant_tests {
    ($($module:ident => $provider:expr),* $(,)?) => {$(
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fifty_devices_store_every_order_once_and_count_their_handshakes() {
                every_order_stored_once_and_handshakes_counted($provider).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_killed_server_restarted_on_its_port_loses_nothing_and_applies_nothing_twice() {
                super::a_killed_server_restarted_on_its_port_loses_nothing_and_applies_nothing_twice($provider)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_restarted_server_resets_old_connections() {
                super::the_restarted_server_resets_old_connections($provider).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_device_from_another_ca_is_refused() {
                super::a_device_from_another_ca_is_refused($provider).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn orders_in_another_devices_name_or_too_large_to_store_are_refused() {
                super::orders_in_another_devices_name_or_too_large_to_store_are_refused($provider).await;
            }
        }
    )*};
}

variant_tests! {
    s2n_tls => Provider::S2nTls,
    rustls => Provider::Rustls,
}
