//! The in-process harness of the transports' end-to-end tests (feature `testing`), and the checks they share.
//!
//! A [`Harness`] is a transport with a fresh identity (its [`Transport::prepare`]) and store directory. Its
//! [`Server`] runs the transport's server with a real store on a thread and current-thread runtime of its own (as
//! `runner serve --server-threads 1` would), and is "killed" by dropping that runtime without running it again, so
//! nothing it had not sent already goes out: no CONNECTION_CLOSE, no answers. The checks ([`every_order_stored_once`],
//! [`restart_loses_nothing`], [`restart_resumes`], [`foreign_devices_are_refused`], [`spoofed_and_oversized_orders_are_refused`]) assert
//! only hard invariants, never timings; what differs between transports (the asymmetric operations each counts)
//! they return for the caller to check.

use crate::fleet::{Answer, ConnFleet, Connector, MakeConnector, Policy};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use transport_core::{
    CounterSnapshot, Counters, Fleet, FleetConfig, LinkEvent, Order, OrderId, Publish, QoS,
    ServeConfig, Transport,
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
                    state_syncs: Arc::default(),
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
        transport_core::events::EventReceiver,
        Arc<Counters>,
    ) {
        self.fleet_of(server, 0, devices).await
    }

    /// A fleet of devices `first..first + devices` of the transport (a slice of the prepared devices), talking to
    /// `server`: the fleet, its events, its counters.
    pub async fn fleet_of(
        &self,
        server: SocketAddr,
        first: u32,
        devices: u32,
    ) -> (
        Box<dyn Fleet>,
        transport_core::events::EventReceiver,
        Arc<Counters>,
    ) {
        let (events, rx) = transport_core::events::channel();
        let counters = Arc::new(Counters::default());
        let config = FleetConfig {
            server,
            identity: self.identity.clone(),
            first,
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
    rx: &mut transport_core::events::EventReceiver,
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
    rx: &mut transport_core::events::EventReceiver,
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
    rx: &mut transport_core::events::EventReceiver,
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

/// One device opens `links` links one after another, each a new handshake with one order answered and then closed on
/// request ([`Fleet::disconnect`]), as handshake-rate does: every close succeeds (the server took its part, e.g. an
/// MQTT broker closed the connection after DISCONNECT), no link is lost or reopened on its own, and each link is one
/// handshake on both sides. Returns the server's counts.
pub async fn links_closed_on_request_are_new_handshakes_each(
    h: &Harness,
    links: u64,
) -> CounterSnapshot {
    let server = h.server(any_port());
    let (fleet, mut rx, client) = h.fleet(server.addr, 1).await;
    let mut made = Vec::new();
    let mut seen = HashMap::new();
    for seq in 0..links {
        fleet.connect(0).await.unwrap();
        let o = order(0, seq);
        made.push(o.id);
        fleet.send(0, o);
        wait_stored(&mut rx, &made, &mut seen).await;
        fleet.disconnect(0).await.unwrap();
    }
    // Closed links stay closed: nothing reconnects on its own.
    tokio::time::sleep(Duration::from_millis(300)).await;
    while let Ok(event) = rx.try_recv() {
        assert!(
            !matches!(event, LinkEvent::Lost { .. } | LinkEvent::Connected { .. }),
            "{event:?}"
        );
    }
    let c = client.snapshot();
    assert_eq!(
        (c.handshakes, c.reconnects, c.resent_reconnect),
        (links, 0, 0),
        "{c:?}"
    );
    fleet.close().await;
    let counts = server.kill().await;
    if h.transport.capabilities().stored_answers.is_yes() {
        assert_eq!(counts.handshakes, links, "{counts:?}");
        let audit = store::audit(&h.store_dir, &made, &made).unwrap();
        assert!(audit.is_clean() && audit.applied == links, "{audit:?}");
    }
    counts
}

/// A fleet of devices `first..first + devices` (a slice of the prepared devices, as one load-generator process
/// runs) keeps their numbers: each device connects and stores an order with its own identity (a server refuses an
/// order whose sender is not the link's identity), the answers come back to the same device numbers, and a device
/// outside the slice is refused.
pub async fn a_slice_keeps_device_numbers(h: &Harness, first: u32, devices: u32) {
    let server = h.server(any_port());
    let (fleet, mut rx, _) = h.fleet_of(server.addr, first, devices).await;
    for outside in [first.wrapping_sub(1), first + devices] {
        assert!(fleet.connect(outside).await.is_err(), "device {outside}");
    }
    let mut made = Vec::new();
    for device in first..first + devices {
        fleet.connect(device).await.unwrap();
        let o = order(device, 0);
        made.push(o.id);
        fleet.send(device, o);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut stored = HashSet::new();
    while stored.len() < made.len() {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(LinkEvent::Stored { device, id, .. })) => {
                assert_eq!(id.sender, u64::from(device), "answer to another device");
                assert!(stored.insert(id), "{id} reported twice");
            }
            Ok(Some(_)) => {}
            _ => panic!("{} of {} orders stored", stored.len(), made.len()),
        }
    }
    fleet.close().await;
    server.kill().await;
    let audit = store::audit(&h.store_dir, &made, &made).unwrap();
    assert!(audit.is_clean(), "{audit:?}");
    assert_eq!(audit.applied, made.len() as u64);
}

/// `devices` devices store an order each; the server is killed with a second round in flight (some committed and
/// never answered, some never arrived) and restarted on its port; after a third round every order is reported
/// stored exactly once and applied once, and every device of a transport with handshakes reconnected (one without
/// handshakes makes none). Returns the restarted server's counts.
pub async fn restart_loses_nothing(h: &Harness, devices: u32) -> CounterSnapshot {
    restart(h, devices).await.after
}

/// The counts of a [`restart`] run.
struct Restarted {
    /// The first server's.
    before: CounterSnapshot,
    /// The restarted server's.
    after: CounterSnapshot,
    /// The fleet's.
    client: CounterSnapshot,
}

/// [`restart_loses_nothing`] for a transport that resumes sessions: every device reconnects to the restarted server
/// with the ticket the first one gave it, so every handshake the restarted server makes resumes (counted in
/// `resumed` on both sides) and none signs or verifies anything: each costs only the two (EC)DHE operations of
/// `psk_dhe_ke` per side. The first server's handshakes were all full ones. Returns the restarted server's counts.
pub async fn restart_resumes(h: &Harness, devices: u32) -> CounterSnapshot {
    let Restarted {
        before,
        after,
        client,
    } = restart(h, devices).await;
    let n = u64::from(devices);
    assert_eq!((before.resumed, before.sign), (0, n), "{before:?}");
    assert_eq!(after.resumed, after.handshakes, "{after:?}");
    assert_eq!(
        (after.sign, after.verify, after.x25519 + after.ecdh),
        (0, 0, 2 * after.handshakes),
        "{after:?}"
    );
    // The fleet's first handshake of each device was full; every later one resumed.
    assert_eq!(client.resumed, client.handshakes - n, "{client:?}");
    assert_eq!(client.sign, n, "{client:?}");
    after
}

/// The run of [`restart_loses_nothing`], checked as it says.
async fn restart(h: &Harness, devices: u32) -> Restarted {
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
        return Restarted {
            before,
            after,
            client: c,
        };
    }
    // Every device had to make a new connection to the new server, and sent its unanswered orders again.
    let n = u64::from(devices);
    assert!(c.reconnects >= n, "{c:?}");
    assert_eq!(c.handshakes, n + c.reconnects, "{c:?}");
    assert!(after.handshakes >= n, "{after:?}");
    assert_eq!(before.handshakes, n, "{before:?}");
    Restarted {
        before,
        after,
        client: c,
    }
}

/// Two devices whose certificates come from another CA: the server refuses them (`refused_unknown`, no
/// handshake counted) and nothing of theirs is ever stored.
pub async fn foreign_devices_are_refused<C: Connector>(
    h: &Harness,
    connector: impl MakeConnector<C>,
) {
    let server = h.server(any_port());
    let foreign = Arc::new(DeviceCredentials::foreign(&h.identity, 2).unwrap());
    let (events, mut rx) = transport_core::events::channel();
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

/// A server of `h` on a port of its own, and a connector to it for `devices` of `h`'s devices (its counters its own):
/// for checks that drive a connection by hand rather than through a fleet.
pub fn server_and_connector<C: Connector>(
    h: &Harness,
    connector: impl MakeConnector<C>,
    devices: u32,
) -> (Server, C) {
    let server = h.server(any_port());
    let connector = connector(
        server.addr,
        h.credentials(),
        devices,
        Arc::new(Counters::default()),
    )
    .unwrap();
    (server, connector)
}

/// Device 0, authenticated as itself, sends an order in device 1's name and one too large for a store record:
/// both are refused on a connection that stays good for a proper order, which is stored.
pub async fn spoofed_and_oversized_orders_are_refused<C: Connector>(
    h: &Harness,
    connector: impl MakeConnector<C>,
) {
    let (server, connector) = server_and_connector(h, connector, 2);
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

/// Finish a stream's sending side opened by hand. The server answers (or refuses) an order once its frame is whole,
/// without waiting for the stream's end, and a receiving side it drops before the end arrived is stopped
/// (STOP_SENDING, code 0 from both libraries; a refused one with its own code): so a finish that races the server's
/// answer may be told the stream was stopped. That is the only error allowed here; whether the order was stored is
/// what the answer says.
async fn finish_by_hand(send: &mut (impl tokio::io::AsyncWrite + Unpin)) {
    use tokio::io::AsyncWriteExt;
    if let Err(e) = send.shutdown().await {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset,
            "finishing a stream failed other than by the server's stop: {e}"
        );
    }
}

/// Streams opened by hand (with `open`) on device 0's connection: one order frame written in two pieces with a
/// pause between (stored: the server reads until the frame is whole), one whose body is junk (refused as malformed,
/// its stream reset: no answer), one announcing more than the frame maximum (refused as oversized, reset), one
/// finished with nothing on it (nothing counted); then an order through the connector on the same connection, which
/// is stored.
pub async fn streams_are_answered_whole_or_reset<C: Connector>(
    h: &Harness,
    connector: impl MakeConnector<C>,
    open: impl Fn(&C::Conn) -> crate::relay::client::OpenStream,
) {
    use crate::quic::read_answer;
    use bytes::BytesMut;
    use tokio::io::AsyncWriteExt;

    let (server, connector) = server_and_connector(h, connector, 1);
    let conn = connector.connect(0).await.unwrap();
    let stream = async |bytes: &[&[u8]]| {
        let (mut recv, mut send) = open(&conn)().await.unwrap();
        for (i, piece) in bytes.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            send.write_all(piece).await.unwrap();
            send.flush().await.unwrap();
        }
        finish_by_hand(&mut send).await;
        let answer = tokio::time::timeout(Duration::from_secs(10), read_answer(&mut recv))
            .await
            .expect("neither an answer nor a reset");
        answer.ok()
    };

    let split = order(0, 1);
    let mut frame = BytesMut::new();
    transport_core::framing::encode_order(&split, &mut frame);
    let (head, tail) = frame.split_at(frame.len() / 2);
    assert_eq!(stream(&[head, tail]).await, Some(Answer::Stored(split.id)));

    let mut junk = vec![0x80u8; 40];
    junk.splice(0..0, (junk.len() as u32).to_be_bytes());
    assert_eq!(stream(&[&junk]).await, None);
    let mut oversized = u32::MAX.to_be_bytes().to_vec();
    oversized.extend_from_slice(&[0; 64]);
    assert_eq!(stream(&[&oversized]).await, None);
    assert_eq!(stream(&[]).await, None);

    let fine = order(0, 2);
    assert_eq!(
        connector.send_order(&conn, &fine).await.unwrap(),
        Answer::Stored(fine.id)
    );
    connector.close(conn);
    let s = server.kill().await;
    assert_eq!(
        (s.received, s.refused_malformed, s.refused_oversized),
        (2, 1, 1),
        "{s:?}"
    );
    let audit = store::audit(&h.store_dir, &[split.id, fine.id], &[split.id, fine.id]).unwrap();
    assert!(audit.is_clean() && audit.applied == 2, "{audit:?}");
}

/// The server lets a device have [`crate::quic::SERVER_STREAMS`] streams open at once, twice its window, so a device
/// whose window is answered can open the next one's streams before the server has seen its answers acknowledged.
/// Here, on device 0's connection: that many streams opened by hand, each with the first half of an order frame (the
/// server keeps each open, waiting for the rest); every one must open (a server allowing only the window leaves the
/// next open waiting for credit that never comes); then the rest of every frame: each order is stored, once.
pub async fn a_device_may_open_twice_its_window<C: Connector>(
    h: &Harness,
    connector: impl MakeConnector<C>,
    open: impl Fn(&C::Conn) -> crate::relay::client::OpenStream,
) {
    use crate::quic::{read_answer, SERVER_STREAMS, STREAMS_PER_CONNECTION};
    use bytes::BytesMut;
    use tokio::io::AsyncWriteExt;

    assert!(SERVER_STREAMS as usize >= 2 * STREAMS_PER_CONNECTION);
    let (server, connector) = server_and_connector(h, connector, 1);
    let conn = connector.connect(0).await.unwrap();
    let orders: Vec<Order> = (0..u64::from(SERVER_STREAMS))
        .map(|seq| order(0, seq))
        .collect();
    let mut halves = Vec::new();
    for (i, o) in orders.iter().enumerate() {
        let mut frame = BytesMut::new();
        transport_core::framing::encode_order(o, &mut frame);
        let (recv, mut send) = tokio::time::timeout(Duration::from_secs(10), open(&conn)())
            .await
            .unwrap_or_else(|_| panic!("stream {i} did not open: the server gave no credit for it"))
            .unwrap();
        let rest = frame.split_off(frame.len() / 2);
        send.write_all(&frame).await.unwrap();
        send.flush().await.unwrap();
        halves.push((send, rest, recv));
    }
    for (send, rest, _) in &mut halves {
        send.write_all(rest).await.unwrap();
        finish_by_hand(send).await;
    }
    for ((_, _, mut recv), o) in halves.into_iter().zip(&orders) {
        let answer = tokio::time::timeout(Duration::from_secs(10), read_answer(&mut recv))
            .await
            .expect("no answer");
        assert_eq!(answer.unwrap(), Answer::Stored(o.id));
    }
    connector.close(conn);
    let s = server.kill().await;
    assert_eq!(s.received, u64::from(SERVER_STREAMS), "{s:?}");
    let ids: Vec<_> = orders.iter().map(|o| o.id).collect();
    let audit = store::audit(&h.store_dir, &ids, &ids).unwrap();
    assert!(
        audit.is_clean() && audit.applied == ids.len() as u64,
        "{audit:?}"
    );
}

/// A published message of the checks: 64 bytes on `channel`.
pub fn message(channel: u32, id: u64, qos: QoS) -> Publish {
    Publish {
        channel,
        id,
        qos,
        size: 64,
    }
}

/// Wait until `done` holds of the events collected so far; every event is kept. (`done` sees them all each time:
/// for the few hundred events of a check, not for floods.)
pub async fn collect_until(
    rx: &mut transport_core::events::EventReceiver,
    events: &mut Vec<LinkEvent>,
    mut done: impl FnMut(&[LinkEvent]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done(events) {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(e)) => events.push(e),
            _ => panic!("still waiting after {} events", events.len()),
        }
    }
}

/// How many times each (device, message) was delivered, and each message accepted.
pub fn tally(events: &[LinkEvent]) -> (HashMap<(u32, u64), u32>, HashMap<u64, u32>) {
    let (mut delivered, mut accepted) = (HashMap::new(), HashMap::new());
    for e in events {
        match *e {
            LinkEvent::Delivered { device, id, .. } => {
                *delivered.entry((device, id)).or_default() += 1
            }
            LinkEvent::Accepted { id, .. } => *accepted.entry(id).or_default() += 1,
            _ => {}
        }
    }
    (delivered, accepted)
}

/// Publish/subscribe through the transport's server: device 0 publishes 100 messages on channel 7, half QoS 1 and
/// half QoS 0; devices 1 and 2 subscribe at QoS 1, device 3 at QoS 0, device 4 to another channel. Every message is
/// accepted once and delivered once to each of the three subscribers, nothing to the fourth, nothing dropped (the
/// queues are far larger than 100). Returns the server's counts.
pub async fn every_message_delivered_once_to_each_subscriber(h: &Harness) -> CounterSnapshot {
    let server = h.server(any_port());
    let (fleet, mut rx, _) = h.fleet(server.addr, 5).await;
    fleet.subscribe(1, 7, QoS::AtLeastOnce).await.unwrap();
    fleet.subscribe(2, 7, QoS::AtLeastOnce).await.unwrap();
    fleet.subscribe(3, 7, QoS::AtMostOnce).await.unwrap();
    fleet.subscribe(4, 8, QoS::AtLeastOnce).await.unwrap();
    for id in 0..100 {
        let qos = if id % 2 == 0 {
            QoS::AtLeastOnce
        } else {
            QoS::AtMostOnce
        };
        fleet.publish(0, message(7, id, qos));
        if id % 10 == 9 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let mut events = Vec::new();
    collect_until(&mut rx, &mut events, |e| {
        let (delivered, accepted) = tally(e);
        delivered.len() == 300 && accepted.len() == 100
    })
    .await;
    assert_eq!(fleet.publishing(), 0);
    fleet.close().await;
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    let (delivered, accepted) = tally(&events);
    assert!(accepted.values().all(|&n| n == 1), "accepted twice");
    assert!(delivered.values().all(|&n| n == 1), "delivered twice");
    assert!(delivered
        .keys()
        .all(|(d, id)| (1..=3).contains(d) && *id < 100));
    let counts = server.kill().await;
    assert_eq!(counts.dropped, 0, "{counts:?}");
    counts
}

/// Device 1 subscribes to channel 7 at QoS 1 on a stream of a connection of its own (opened with `open`), reads the
/// ten messages device 0 publishes and never acknowledges them; then that connection closes. When device 1's link
/// in the fleet subscribes, the server sends those ten again (they were in flight), and the fleet reports each once,
/// and the ten published after.
pub async fn unacknowledged_qos1_goes_again_on_the_next_connection<C: Connector>(
    h: &Harness,
    connector: impl MakeConnector<C>,
    open: impl Fn(&C::Conn) -> crate::relay::client::OpenStream,
) {
    use crate::relay::wire::{self, Frame};
    use bytes::BytesMut;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let (server, raw) = server_and_connector(h, connector, 2);
    let conn = raw.connect(1).await.unwrap();
    let (mut recv, mut send) = open(&conn)().await.unwrap();
    let mut buf = BytesMut::new();
    wire::encode(
        &Frame::Subscribe {
            channel: 7,
            qos: QoS::AtLeastOnce,
        },
        &mut buf,
    );
    send.write_all(&buf).await.unwrap();
    buf.clear();
    let mut next = async |buf: &mut BytesMut| loop {
        if let Some(frame) = wire::decode(buf).unwrap() {
            return frame;
        }
        assert!(recv.read_buf(buf).await.unwrap() > 0, "stream ended");
    };
    assert!(matches!(
        next(&mut buf).await,
        Frame::Subscribed {
            channel: 7,
            granted: Some(QoS::AtLeastOnce)
        }
    ));

    let (fleet, mut rx, _) = h.fleet(server.addr, 2).await;
    for id in 0..10 {
        fleet.publish(0, message(7, id, QoS::AtLeastOnce));
    }
    let mut events = Vec::new();
    collect_until(&mut rx, &mut events, |e| tally(e).1.len() == 10).await;
    for _ in 0..10 {
        assert!(matches!(next(&mut buf).await, Frame::Deliver1 { .. }));
    }
    raw.close(conn);
    drop((recv, send));

    fleet.subscribe(1, 7, QoS::AtLeastOnce).await.unwrap();
    for id in 10..20 {
        fleet.publish(0, message(7, id, QoS::AtLeastOnce));
    }
    collect_until(&mut rx, &mut events, |e| tally(e).0.len() == 20).await;
    fleet.close().await;
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    let (delivered, _) = tally(&events);
    let want: HashMap<(u32, u64), u32> = (0..20).map(|id| ((1, id), 1)).collect();
    assert_eq!(delivered, want);
    server.kill().await;
}
