//! The in-process harness of the transports' end-to-end tests (feature `testing`), and the checks they share.
//!
//! A [`Harness`] is a transport with a fresh identity (its [`Transport::prepare`]) and store directory. Its
//! [`Server`] runs the transport's server with a real store on a thread and current-thread runtime of its own (as
//! `runner serve --server-threads 1` would), and is "killed" by dropping that runtime without running it again, so
//! nothing it had not sent already goes out: no CONNECTION_CLOSE, no answers. The checks ([`every_order_stored_once`],
//! [`restart_loses_nothing`], [`foreign_devices_are_refused`], [`spoofed_and_oversized_orders_are_refused`]) assert
//! only hard invariants, never timings; what differs between transports (the asymmetric operations each counts)
//! they return for the caller to check.

use crate::fleet::{Answer, ConnFleet, Connector, MakeConnector, Policy};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use transport_core::{
    CounterSnapshot, Counters, Fleet, FleetConfig, LinkEvent, Order, OrderId, ServeConfig,
    Transport,
};
use transport_store::{self as store, Store, StoreHandle, SyncPolicy};
use transport_tls::DeviceCredentials;

/// A transport with a fresh identity directory and store directory (removed when dropped).
pub struct Harness {
    transport: Arc<dyn Transport>,
    _dir: tempfile::TempDir,
    /// The identity directory, prepared for the devices asked for.
    pub identity: PathBuf,
    /// The store's directory (the store is created by the first server).
    pub store_dir: PathBuf,
}

impl Harness {
    /// `transport` with an identity for `devices` devices.
    pub fn new(transport: Box<dyn Transport>, devices: u32) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let identity = dir.path().join("identity");
        let store_dir = dir.path().join("store");
        transport.prepare(&identity, devices).unwrap();
        Harness {
            transport: Arc::from(transport),
            _dir: dir,
            identity,
            store_dir,
        }
    }

    /// Start the transport's server on `listen` (port 0: any), retrying while the previous server's port is still
    /// being released.
    pub fn server(&self, listen: SocketAddr) -> Server {
        let (store, _) = retry(|| Store::open(&self.store_dir, SyncPolicy::Batch));
        let store = StoreHandle::spawn(store);
        let counters = Arc::new(Counters::default());
        for _ in 0..100 {
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let (kill, kill_rx) = oneshot::channel::<()>();
            let transport = self.transport.clone();
            let config = (
                self.identity.clone(),
                store.clone(),
                counters.clone(),
                self.store_dir.clone(),
            );
            let thread = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let (identity, store, counters, state_dir) = config;
                let (ready, ready_in) = oneshot::channel();
                let config = ServeConfig {
                    listen,
                    identity,
                    store: Arc::new(store),
                    state_dir,
                    counters,
                    ready,
                };
                let serve = transport.serve(config);
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

    /// A fleet of `devices` devices of the transport, talking to `server`: the fleet, its events, its counters.
    pub async fn fleet(
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
        let fleet = self.transport.fleet(config).await.unwrap();
        (fleet, rx, counters)
    }

    /// Whether the transport opens links with handshakes (what the checks expect it to count).
    pub fn has_handshakes(&self) -> bool {
        self.transport.capabilities().handshakes.is_yes()
    }

    /// The devices' credentials from the identity directory.
    pub fn credentials(&self) -> Arc<DeviceCredentials> {
        Arc::new(DeviceCredentials::load(&self.identity).unwrap())
    }
}

/// A transport's server on its own thread and runtime.
pub struct Server {
    /// Where it listens.
    pub addr: SocketAddr,
    counters: Arc<Counters>,
    store: StoreHandle,
    kill: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Kill the server and release its store; its counts.
    pub async fn kill(mut self) -> CounterSnapshot {
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

/// Any port on 127.0.0.1.
pub fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Device `device`'s order number `seq`, with a 64-byte payload.
pub fn order(device: u32, seq: u64) -> Order {
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
pub async fn wait_stored(
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
            Ok(Some(_)) => {}
            _ => panic!(
                "{} of {} orders never reported stored",
                missing.len(),
                made.len()
            ),
        }
    }
}

/// After the run: no more Stored events may arrive, and every order was reported exactly once.
pub async fn assert_reported_once(
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

/// Hand one order of every device (number `seq`) to `fleet`, recording its id in `made`.
fn send_round(fleet: &dyn Fleet, devices: u32, seq: u64, made: &mut Vec<OrderId>) {
    for device in 0..devices {
        let o = order(device, seq);
        made.push(o.id);
        fleet.send(device, o);
    }
}

/// The end of a run: every order in `made` reported stored, none pending, the fleet closed, each order reported
/// exactly once; then the server killed and the store's audit clean. The server's counts and the audit.
async fn settle(
    h: &Harness,
    fleet: &dyn Fleet,
    rx: &mut mpsc::UnboundedReceiver<LinkEvent>,
    made: &[OrderId],
    seen: &mut HashMap<OrderId, u32>,
    server: Server,
) -> (CounterSnapshot, store::Audit) {
    wait_stored(rx, made, seen).await;
    assert_eq!(fleet.pending(), 0);
    fleet.close().await;
    assert_reported_once(rx, seen).await;
    let counts = server.kill().await;
    let audit = store::audit(&h.store_dir, made, made).unwrap();
    assert!(audit.is_clean(), "{audit:?}");
    (counts, audit)
}

/// `devices` devices send four rounds of orders: every order is reported stored exactly once and applied once,
/// every device made one handshake (counted on both sides; none for a transport without handshakes) and nothing
/// was sent again on a new connection. Returns the fleet's and the server's counts, for the transport's own checks
/// of its asymmetric operations.
pub async fn every_order_stored_once(
    h: &Harness,
    devices: u32,
) -> (CounterSnapshot, CounterSnapshot) {
    let server = h.server(any_port());
    let (fleet, mut rx, client) = h.fleet(server.addr, devices).await;

    let mut made = Vec::new();
    for seq in 0..4 {
        send_round(&*fleet, devices, seq, &mut made);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut seen = HashMap::new();
    let (server_counts, audit) = settle(h, &*fleet, &mut rx, &made, &mut seen, server).await;
    assert_eq!(audit.applied, made.len() as u64);

    let client_counts = client.snapshot();
    let n = if h.has_handshakes() {
        u64::from(devices)
    } else {
        0
    };
    assert_eq!(client_counts.handshakes, n, "{client_counts:?}");
    assert_eq!(server_counts.handshakes, n, "{server_counts:?}");
    assert_eq!(server_counts.received, made.len() as u64);
    assert_eq!(
        (client_counts.resent_reconnect, client_counts.reconnects),
        (0, 0)
    );
    (client_counts, server_counts)
}

/// `devices` devices store an order each; the server is killed with a second round in flight (some committed and
/// never answered, some never arrived) and restarted on its port; after a third round every order is reported
/// stored exactly once and applied once, and every device of a transport with handshakes reconnected (one without
/// handshakes makes none). Returns the restarted server's counts.
pub async fn restart_loses_nothing(h: &Harness, devices: u32) -> CounterSnapshot {
    let first = h.server(any_port());
    let addr = first.addr;
    let (fleet, mut rx, client) = h.fleet(addr, devices).await;
    let mut made = Vec::new();
    let mut seen = HashMap::new();

    // Every device connected and stored something.
    send_round(&*fleet, devices, 0, &mut made);
    wait_stored(&mut rx, &made, &mut seen).await;

    // Orders in flight when the server dies: some are committed and never answered, some never arrive.
    send_round(&*fleet, devices, 1, &mut made);
    tokio::time::sleep(Duration::from_millis(3)).await;
    let before = first.kill().await;
    let second = h.server(addr);
    assert_eq!(second.addr, addr);
    send_round(&*fleet, devices, 2, &mut made);
    let (after, audit) = settle(h, &*fleet, &mut rx, &made, &mut seen, second).await;
    assert_eq!(
        (audit.applied, audit.duplicates, audit.lost),
        (made.len() as u64, 0, 0)
    );

    let c = client.snapshot();
    if !h.has_handshakes() {
        assert_eq!(
            (c.handshakes, c.reconnects, after.handshakes),
            (0, 0, 0),
            "{c:?}"
        );
        return after;
    }
    // Every device had to make a new connection to the new server, and sent its unanswered orders again.
    let n = u64::from(devices);
    assert!(c.reconnects >= n, "{c:?}");
    assert_eq!(c.handshakes, n + c.reconnects, "{c:?}");
    assert!(after.handshakes >= n, "{after:?}");
    assert_eq!(before.handshakes, n, "{before:?}");
    after
}

/// Two devices whose certificates come from another CA: the server refuses them (`refused_unknown`, no
/// handshake counted) and nothing of theirs is ever stored.
pub async fn foreign_devices_are_refused<C: Connector>(
    h: &Harness,
    connector: impl MakeConnector<C>,
) {
    let server = h.server(any_port());
    let foreign = Arc::new(DeviceCredentials::foreign(&h.identity, 2).unwrap());
    let (events, mut rx) = mpsc::unbounded_channel();
    let counters = Arc::new(Counters::default());
    let connector = connector(server.addr, foreign, 2, counters.clone()).unwrap();
    let fleet = ConnFleet::start(connector, 2, events, counters, Policy::default());
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
    let audit = store::audit(&h.store_dir, &[], &[]).unwrap();
    assert_eq!(audit.applied, 0);
}

/// Device 0, authenticated as itself, sends an order in device 1's name and one too large for a store record:
/// both are refused on a connection that stays good for a proper order, which is stored.
pub async fn spoofed_and_oversized_orders_are_refused<C: Connector>(
    h: &Harness,
    connector: impl MakeConnector<C>,
) {
    let server = h.server(any_port());
    let connector = connector(
        server.addr,
        h.credentials(),
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
    huge.payload = vec![7; transport_core::MAX_PAYLOAD + 1];
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
    let audit = store::audit(&h.store_dir, &[fine.id], &[fine.id]).unwrap();
    assert!(audit.is_clean() && audit.applied == 1, "{audit:?}");
}
