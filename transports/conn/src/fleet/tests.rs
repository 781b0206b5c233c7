use super::*;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use tokio::sync::mpsc;

/// A connector to an in-memory server that can be made to stall, fail connections, or break connections.
#[derive(Default)]
struct Fake {
    /// Generation of the "server": connections from an older one are dead.
    server_gen: AtomicUsize,
    /// Refuse connection attempts.
    down: AtomicBool,
    /// Swallow orders (never answer) while set.
    stall: AtomicBool,
    /// Complete connections that are closed at once (a certificate refused after the client's handshake).
    refuse_after_connect: AtomicBool,
    /// A polite close the server does not take part in (a broker that never closes after DISCONNECT).
    ignore_goodbye: AtomicBool,
    attempts: AtomicUsize,
    /// The device of each connection attempt, in order.
    connected: Mutex<Vec<u32>>,
    stored: Mutex<HashMap<OrderId, usize>>,
    /// The relay: who subscribed to what, and each device's live connection.
    relay: Mutex<FakeRelay>,
    /// Acknowledge no QoS 1 publish, and write no QoS 0 one, while set (they are still relayed).
    stall_publishes: AtomicBool,
    /// Deliver every QoS 1 message twice (as a server does whose acknowledgement was lost).
    twice: AtomicBool,
    /// Answer no subscription, and relay nothing, while set.
    stall_subscribes: AtomicBool,
    /// The transport has no publish/subscribe.
    no_pubsub: AtomicBool,
    /// The connection's window (0: none) and how long the server takes to answer an order, in milliseconds.
    window: AtomicUsize,
    answer_ms: AtomicUsize,
    /// Orders sent and not yet answered, now and at most.
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    /// Connections are pipelined ([`Connector::answers`]) rather than a request per order.
    pipelined: bool,
    /// Pipelined: queueing the next order fails (its connection is closed).
    queue_fails: AtomicBool,
}

#[derive(Default)]
struct FakeRelay {
    subscribers: HashMap<u32, Vec<(u32, QoS)>>,
    conns: HashMap<u32, (usize, mpsc::UnboundedSender<Delivery>)>,
    /// Every SUBSCRIBE the server got, as (device, channel).
    subscribes: Vec<(u32, u32)>,
    /// Every publish the server got, as (id, again).
    publishes: Vec<(u64, bool)>,
}

struct FakeConn {
    device: u32,
    server_gen: usize,
    fake: Arc<Fake>,
    deliveries: Option<Deliveries>,
    /// Pipelined: where the answers go, and the stream the device takes.
    answering: mpsc::UnboundedSender<Vec<Answer>>,
    answers: Option<Answers>,
}

struct FakeConnector(Arc<Fake>);

impl FakeConnector {
    /// The server's answer to `order` sent on `conn`, once it gives one.
    fn answer(
        &self,
        conn: &FakeConn,
        order: &Order,
    ) -> impl std::future::Future<Output = Result<Answer, TransportError>> + Send + 'static {
        let (fake, gen, id) = (conn.fake.clone(), conn.server_gen, order.id);
        let window = self.window();
        async move {
            tokio::task::yield_now().await;
            // As a QUIC stream limit: a request beyond the window waits until one is answered.
            loop {
                let n = fake.in_flight.load(Ordering::Relaxed);
                if n < window {
                    fake.in_flight.store(n + 1, Ordering::Relaxed);
                    fake.most_in_flight.fetch_max(n + 1, Ordering::Relaxed);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let answer_ms = fake.answer_ms.load(Ordering::Relaxed) as u64;
            if answer_ms > 0 {
                tokio::time::sleep(Duration::from_millis(answer_ms)).await;
            }
            fake.in_flight.fetch_sub(1, Ordering::Relaxed);
            if fake.stall.load(Ordering::Relaxed) || gen != fake.server_gen.load(Ordering::Relaxed)
            {
                return std::future::pending().await;
            }
            *fake.stored.lock().unwrap().entry(id).or_default() += 1;
            if id.sender == 666 {
                return Ok(Answer::Refused(id));
            }
            Ok(Answer::Stored(id))
        }
    }
}

impl Connector for FakeConnector {
    type Conn = FakeConn;

    fn connect(&self, device: u32) -> BoxFuture<'_, Result<FakeConn, TransportError>> {
        Box::pin(async move {
            self.0.attempts.fetch_add(1, Ordering::Relaxed);
            self.0.connected.lock().unwrap().push(device);
            if self.0.down.load(Ordering::Relaxed) {
                return Err(TransportError::Protocol("refused".into()));
            }
            let server_gen = if self.0.refuse_after_connect.load(Ordering::Relaxed) {
                usize::MAX
            } else {
                self.0.server_gen.load(Ordering::Relaxed)
            };
            let (tx, rx) = mpsc::unbounded_channel();
            self.0
                .relay
                .lock()
                .unwrap()
                .conns
                .insert(device, (server_gen, tx));
            let (answering, answers) = mpsc::unbounded_channel();
            Ok(FakeConn {
                device,
                server_gen,
                fake: self.0.clone(),
                deliveries: Some(rx),
                answering,
                answers: Some(answers),
            })
        })
    }

    fn send_order(
        &self,
        conn: &FakeConn,
        order: &Order,
    ) -> BoxFuture<'static, Result<Answer, TransportError>> {
        assert!(
            !self.0.pipelined,
            "a request per order on a pipelined connection"
        );
        Box::pin(self.answer(conn, order))
    }

    fn answers(&self, conn: &mut FakeConn) -> Option<Answers> {
        match self.0.pipelined {
            true => conn.answers.take(),
            false => None,
        }
    }

    fn queue_orders(
        &self,
        conn: &FakeConn,
        orders: &mut dyn Iterator<Item = (&Order, bool)>,
    ) -> Result<(), TransportError> {
        assert!(
            self.0.pipelined,
            "a pipelined order on a connection that is not"
        );
        for (order, _) in orders {
            if self.0.queue_fails.swap(false, Ordering::Relaxed) {
                return Err(TransportError::Protocol("connection closed".into()));
            }
            let (answer, answering) = (self.answer(conn, order), conn.answering.clone());
            tokio::spawn(async move {
                if let Ok(answer) = answer.await {
                    let _ = answering.send(vec![answer]);
                }
            });
        }
        Ok(())
    }

    fn window(&self) -> usize {
        match self.0.window.load(Ordering::Relaxed) {
            0 => usize::MAX,
            n => n,
        }
    }

    fn disconnect(&self, conn: FakeConn) -> BoxFuture<'static, Result<(), TransportError>> {
        let ignored = conn.fake.ignore_goodbye.load(Ordering::Relaxed);
        Box::pin(async move {
            if ignored {
                return Err(TransportError::Protocol("the server did not close".into()));
            }
            Ok(())
        })
    }

    fn closed(&self, conn: &FakeConn) -> BoxFuture<'static, ()> {
        let (fake, gen) = (conn.fake.clone(), conn.server_gen);
        Box::pin(async move {
            while fake.server_gen.load(Ordering::Relaxed) == gen {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    }

    fn subscribe(
        &self,
        conn: &FakeConn,
        channel: u32,
        qos: QoS,
    ) -> BoxFuture<'static, Result<SubAck, TransportError>> {
        let (fake, gen, device) = (conn.fake.clone(), conn.server_gen, conn.device);
        Box::pin(async move {
            tokio::task::yield_now().await;
            if fake.no_pubsub.load(Ordering::Relaxed) {
                return Err(TransportError::Unsupported("publish/subscribe"));
            }
            if fake.stall_subscribes.load(Ordering::Relaxed) || !fake.live(gen) {
                return std::future::pending().await;
            }
            let mut relay = fake.relay.lock().unwrap();
            relay.subscribes.push((device, channel));
            if channel == 666 {
                return Ok(SubAck::Refused);
            }
            let subs = relay.subscribers.entry(channel).or_default();
            subs.retain(|(d, _)| *d != device);
            subs.push((device, qos));
            Ok(SubAck::Granted)
        })
    }

    fn publish(
        &self,
        conn: &FakeConn,
        message: &Publish,
        again: bool,
    ) -> BoxFuture<'static, Result<(), TransportError>> {
        let (fake, gen, m) = (conn.fake.clone(), conn.server_gen, *message);
        Box::pin(async move {
            tokio::task::yield_now().await;
            if fake.no_pubsub.load(Ordering::Relaxed) {
                return Err(TransportError::Unsupported("publish/subscribe"));
            }
            if !fake.live(gen) {
                return std::future::pending().await;
            }
            let stalled = fake.stall_publishes.load(Ordering::Relaxed);
            if stalled && m.qos == QoS::AtMostOnce {
                return std::future::pending().await; // never written
            }
            fake.relay(&m, again);
            if stalled {
                return std::future::pending().await; // relayed, never acknowledged
            }
            Ok(())
        })
    }

    fn deliveries(&self, conn: &mut FakeConn) -> Option<Deliveries> {
        conn.deliveries.take()
    }
}

impl Fake {
    /// A server whose connections are pipelined or not.
    fn new(pipelined: bool) -> Arc<Fake> {
        Arc::new(Fake {
            pipelined,
            ..Fake::default()
        })
    }

    fn live(&self, gen: usize) -> bool {
        gen == self.server_gen.load(Ordering::Relaxed)
    }

    /// Hand `m` to every subscriber of its channel with a live connection.
    fn relay(&self, m: &Publish, again: bool) {
        let mut relay = self.relay.lock().unwrap();
        relay.publishes.push((m.id, again));
        let subs = relay
            .subscribers
            .get(&m.channel)
            .cloned()
            .unwrap_or_default();
        for (device, sub_qos) in subs {
            let Some((gen, tx)) = relay.conns.get(&device) else {
                continue;
            };
            if !self.live(*gen) || self.stall_subscribes.load(Ordering::Relaxed) {
                continue;
            }
            let qos = m.qos.min_level(sub_qos);
            let d = Delivery {
                id: m.id,
                qos,
                at: std::time::Instant::now(),
            };
            let _ = tx.send(d);
            if qos == QoS::AtLeastOnce && self.twice.load(Ordering::Relaxed) {
                let _ = tx.send(d);
            }
        }
    }
}

trait MinLevel {
    fn min_level(self, other: QoS) -> QoS;
}

impl MinLevel for QoS {
    fn min_level(self, other: QoS) -> QoS {
        if self.level() <= other.level() {
            self
        } else {
            other
        }
    }
}

/// Tests of orders, each run twice: `per_request` (a request per order, [`Connector::send_order`]) and `pipelined`
/// ([`Connector::answers`]); the body sees which as `pipelined`.
macro_rules! both_ways {
    ($(async fn $name:ident($pipelined:ident) $body:block)*) => {$(
        mod $name {
            use super::*;

            #[tokio::test(start_paused = true)]
            async fn per_request() {
                run(false).await
            }

            #[tokio::test(start_paused = true)]
            async fn pipelined() {
                run(true).await
            }

            async fn run($pipelined: bool) $body
        }
    )*};
}

fn order(sender: u64, seq: u64) -> Order {
    Order {
        id: OrderId {
            sender,
            run: 1,
            seq,
        },
        made_us: 0,
        payload: vec![1, 2, 3],
    }
}

async fn stored_events(rx: &mut transport_core::events::EventReceiver, n: usize) -> Vec<OrderId> {
    let mut ids = Vec::new();
    while ids.len() < n {
        match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
            Ok(Some(LinkEvent::Stored { id, .. })) => ids.push(id),
            Ok(Some(_)) => {}
            _ => panic!("missing events: got {} of {n}", ids.len()),
        }
    }
    ids
}

fn fleet(
    fake: &Arc<Fake>,
    devices: u32,
) -> (
    ConnFleet<FakeConnector>,
    transport_core::events::EventReceiver,
) {
    let (tx, rx) = transport_core::events::channel();
    let fleet = ConnFleet::start(
        FakeConnector(fake.clone()),
        devices,
        tx,
        Arc::new(Counters::default()),
        Policy::default(),
    );
    (fleet, rx)
}

both_ways! {
    async fn orders_are_stored_once_and_connections_reused(pipelined) {
        let fake = Fake::new(pipelined);
        let (fleet, mut rx) = fleet(&fake, 3);
        fleet.connect(1).await.unwrap();
        for seq in 0..5 {
            for dev in 0..3 {
                fleet.send(dev, order(u64::from(dev), seq));
            }
        }
        let ids = stored_events(&mut rx, 15).await;
        assert_eq!(ids.len(), 15);
        assert_eq!(fleet.pending(), 0);
        let c = fleet.shared.counters.snapshot();
        assert_eq!((c.handshakes, c.reconnects, c.resent_reconnect), (3, 0, 0));
        assert_eq!(fake.attempts.load(Ordering::Relaxed), 3);
        fleet.send(99, order(99, 0)); // no such device: ignored
        assert_eq!(fleet.pending(), 0);
        assert!(fleet.connect(99).await.is_err());
        fleet.close().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_device_without_a_window_has_at_most_its_capacity_of_requests_in_flight() {
    // A connector with no window: the device's slots of requests are the limit, and the rest wait in the device.
    let fake = Fake::new(false);
    fake.answer_ms.store(10, Ordering::Relaxed);
    let (fleet, mut rx) = fleet(&fake, 1);
    let n = 3 * requests::CAPACITY as u64;
    for seq in 0..n {
        fleet.send(0, order(0, seq));
    }
    let ids = stored_events(&mut rx, n as usize).await;
    assert_eq!(ids.len() as u64, n);
    assert_eq!(
        fake.most_in_flight.load(Ordering::Relaxed),
        requests::CAPACITY
    );
    assert!(fake.stored.lock().unwrap().values().all(|&n| n == 1));
    let c = fleet.shared.counters.snapshot();
    assert_eq!((c.handshakes, c.resent_reconnect), (1, 0), "{c:?}");
    fleet.close().await;
}

#[tokio::test(start_paused = true)]
async fn a_slice_of_devices_keeps_their_numbers() {
    let fake = Arc::new(Fake::default());
    let (tx, mut rx) = transport_core::events::channel();
    let fleet = ConnFleet::start_at(
        FakeConnector(fake.clone()),
        10,
        3,
        tx,
        Arc::new(Counters::default()),
        Policy::default(),
    );
    for d in 10..13 {
        fleet.connect(d).await.unwrap();
    }
    assert_eq!(*fake.connected.lock().unwrap(), vec![10, 11, 12]);
    for outside in [0, 9, 13] {
        assert!(fleet.connect(outside).await.is_err(), "device {outside}");
    }
    fleet.send(12, order(12, 0));
    fleet.send(3, order(3, 0)); // not in the slice: ignored
    loop {
        match rx.recv().await.unwrap() {
            LinkEvent::Stored { device, id, .. } => {
                assert_eq!((device, id), (12, order(12, 0).id));
                break;
            }
            LinkEvent::Connected { device, .. } => assert!((10..13).contains(&device)),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(fleet.pending(), 0);
    fleet.close().await;
}

both_ways! {
    async fn an_unanswered_order_goes_again_on_a_new_connection(pipelined) {
        let fake = Fake::new(pipelined);
        let (fleet, mut rx) = fleet(&fake, 1);
        fleet.send(0, order(0, 0));
        stored_events(&mut rx, 1).await;
        // The connection has answered before; now it stalls: after 1 s the order goes again on a new one.
        fake.stall.store(true, Ordering::Relaxed);
        fleet.send(0, order(0, 1));
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert_eq!(fleet.shared.counters.snapshot().reconnects, 0);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let c = fleet.shared.counters.snapshot();
        assert_eq!((c.reconnects, c.resent_reconnect), (1, 1), "{c:?}");
        assert_eq!(fleet.pending(), 1);
        fake.stall.store(false, Ordering::Relaxed);
        // The new connection has not answered yet, so it gets the connect timeout (10 s) rather than 1 s; the
        // order, sent on it while stalled, goes again on a third connection after that.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(fleet.shared.counters.snapshot().reconnects, 1);
        assert_eq!(stored_events(&mut rx, 1).await, vec![order(0, 1).id]);
        let c = fleet.shared.counters.snapshot();
        assert_eq!(
            (c.handshakes, c.reconnects, c.resent_reconnect),
            (3, 2, 2),
            "{c:?}"
        );
        assert_eq!(fleet.pending(), 0);
        fleet.close().await;
    }
}

both_ways! {
    async fn a_backlog_deeper_than_the_window_waits_in_the_device_without_timing_out(pipelined) {
        // 400 orders, 4 at a time, 20 ms each: 2 s to answer them all, twice the answer timeout. Each order's timeout
        // counts from when it is sent, so nothing is sent again and the connection is kept.
        let fake = Fake::new(pipelined);
        fake.window.store(4, Ordering::Relaxed);
        fake.answer_ms.store(20, Ordering::Relaxed);
        let (fleet, mut rx) = fleet(&fake, 1);
        for seq in 0..400 {
            fleet.send(0, order(0, seq));
        }
        let ids = stored_events(&mut rx, 400).await;
        let in_order: Vec<u64> = ids.iter().map(|id| id.seq).collect();
        assert!(
            in_order.windows(2).all(|w| w[0] < w[1] + 4),
            "sent in the order made"
        );
        assert_eq!(fake.most_in_flight.load(Ordering::Relaxed), 4);
        let c = fleet.shared.counters.snapshot();
        assert_eq!(
            (c.handshakes, c.reconnects, c.resent_reconnect),
            (1, 0, 0),
            "{c:?}"
        );
        assert!(fake.stored.lock().unwrap().values().all(|&n| n == 1));
        fleet.close().await;
    }
}

both_ways! {
    async fn a_restarted_server_gets_every_order_again_and_each_is_reported_once(pipelined) {
        let fake = Fake::new(pipelined);
        let (fleet, mut rx) = fleet(&fake, 4);
        for dev in 0..4 {
            fleet.send(dev, order(u64::from(dev), 0));
        }
        stored_events(&mut rx, 4).await;
        // The server dies: connections break, nothing is answered, attempts fail for a while.
        fake.down.store(true, Ordering::Relaxed);
        fake.server_gen.fetch_add(1, Ordering::Relaxed);
        for dev in 0..4 {
            fleet.send(dev, order(u64::from(dev), 1));
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let attempts = fake.attempts.load(Ordering::Relaxed);
        // Back-off: 3 s of failures cost each device about 100+200+400+800+1000 ms worth of attempts, not hundreds.
        assert!(attempts < 4 * 10, "{attempts} attempts");
        fake.down.store(false, Ordering::Relaxed);
        let ids = stored_events(&mut rx, 4).await;
        assert!(ids.iter().all(|id| id.seq == 1));
        assert_eq!(fleet.pending(), 0);
        let c = fleet.shared.counters.snapshot();
        assert_eq!(c.reconnects, 4);
        // No Stored event twice, even though the fake may have stored some orders twice.
        tokio::time::sleep(Duration::from_secs(5)).await;
        while let Ok(event) = rx.try_recv() {
            assert!(
                matches!(event, LinkEvent::Connected { .. } | LinkEvent::Lost { .. }),
                "{event:?}"
            );
        }
        fleet.close().await;
    }
}

both_ways! {
    async fn a_link_closed_on_request_stays_closed_until_asked_again(pipelined) {
        let fake = Fake::new(pipelined);
        let (fleet, mut rx) = fleet(&fake, 1);
        fleet.connect(0).await.unwrap();
        fleet.send(0, order(0, 0));
        stored_events(&mut rx, 1).await;
        // An order handed over and then abandoned by the disconnect is no longer pending.
        fake.stall.store(true, Ordering::Relaxed);
        fleet.send(0, order(0, 1));
        fleet.disconnect(0).await.unwrap();
        assert_eq!(fleet.pending(), 0);
        fake.stall.store(false, Ordering::Relaxed);
        // Nothing reconnects on its own: a closed link is not a lost one.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(fake.attempts.load(Ordering::Relaxed), 1);
        // Asked again, the device opens a new link with a new handshake, which is not a reconnect.
        fleet.connect(0).await.unwrap();
        fleet.send(0, order(0, 2));
        assert_eq!(stored_events(&mut rx, 1).await, vec![order(0, 2).id]);
        let c = fleet.shared.counters.snapshot();
        assert_eq!(
            (c.handshakes, c.reconnects, c.resent_reconnect),
            (2, 0, 0),
            "{c:?}"
        );
        assert!(fleet.disconnect(7).await.is_err());
        fleet.close().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_goodbye_the_server_ignores_is_an_error_and_the_link_is_closed_all_the_same() {
    let fake = Arc::new(Fake::default());
    fake.ignore_goodbye.store(true, Ordering::Relaxed);
    let (fleet, _rx) = fleet(&fake, 1);
    fleet.connect(0).await.unwrap();
    let (a, b) = tokio::join!(fleet.disconnect(0), fleet.disconnect(0));
    assert!(a.is_err() && b.is_err(), "{a:?} {b:?}");
    // Closed all the same: a new link is a new handshake.
    fake.ignore_goodbye.store(false, Ordering::Relaxed);
    fleet.connect(0).await.unwrap();
    assert_eq!(fake.attempts.load(Ordering::Relaxed), 2);
    fleet.disconnect(0).await.unwrap();
    fleet.close().await;
}

both_ways! {
    async fn refused_orders_are_not_pending_and_not_reported(pipelined) {
        let fake = Fake::new(pipelined);
        let (fleet, mut rx) = fleet(&fake, 1);
        fleet.send(0, order(666, 0));
        fleet.send(0, order(0, 1));
        assert_eq!(stored_events(&mut rx, 1).await, vec![order(0, 1).id]);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(fleet.pending(), 0);
        fleet.close().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_pipelined_order_that_cannot_be_queued_goes_again_on_a_new_connection() {
    let fake = Fake::new(true);
    let (fleet, mut rx) = fleet(&fake, 1);
    fleet.send(0, order(0, 0));
    stored_events(&mut rx, 1).await;
    fake.queue_fails.store(true, Ordering::Relaxed);
    for seq in 1..4 {
        fleet.send(0, order(0, seq));
    }
    let mut stored: Vec<u64> = stored_events(&mut rx, 3)
        .await
        .iter()
        .map(|id| id.seq)
        .collect();
    stored.sort_unstable();
    assert_eq!(stored, [1, 2, 3]);
    let c = fleet.shared.counters.snapshot();
    assert_eq!((c.handshakes, c.reconnects), (2, 1), "{c:?}");
    assert!(fake.stored.lock().unwrap().values().all(|&n| n == 1));
    assert_eq!(fleet.pending(), 0);
    fleet.close().await;
}

#[tokio::test(start_paused = true)]
async fn connections_closed_before_any_answer_are_retried_with_back_off() {
    let fake = Arc::new(Fake::default());
    fake.refuse_after_connect.store(true, Ordering::Relaxed);
    let (fleet, _rx) = fleet(&fake, 1);
    fleet.send(0, order(0, 0));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let attempts = fake.attempts.load(Ordering::Relaxed);
    assert!((2..10).contains(&attempts), "{attempts} attempts");
    assert_eq!(fleet.pending(), 1);
    fleet.close().await;
}

#[tokio::test(start_paused = true)]
async fn close_stops_devices_even_while_connecting() {
    let fake = Arc::new(Fake::default());
    fake.down.store(true, Ordering::Relaxed);
    let (fleet, _rx) = fleet(&fake, 2);
    fleet.send(0, order(0, 0));
    assert!(fleet.connect(1).await.is_err());
    tokio::time::timeout(Duration::from_secs(5), fleet.close())
        .await
        .unwrap();
}

// Publish/subscribe.

fn message(id: u64, qos: QoS) -> Publish {
    Publish {
        channel: 7,
        id,
        qos,
        size: 64,
    }
}

/// Every event until `done` holds, or a panic after 30 s (virtual) of waiting.
async fn events_until(
    rx: &mut transport_core::events::EventReceiver,
    mut done: impl FnMut(&[LinkEvent]) -> bool,
) -> Vec<LinkEvent> {
    let mut events = Vec::new();
    while !done(&events) {
        match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
            Ok(Some(e)) => events.push(e),
            _ => panic!("stopped waiting after {events:?}"),
        }
    }
    events
}

/// Events after a quiet while.
async fn remaining(rx: &mut transport_core::events::EventReceiver) -> Vec<LinkEvent> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

fn accepted(events: &[LinkEvent]) -> Vec<u64> {
    let mut ids: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            LinkEvent::Accepted { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    ids.sort_unstable();
    ids
}

fn delivered(events: &[LinkEvent]) -> Vec<(u32, u64)> {
    let mut pairs: Vec<(u32, u64)> = events
        .iter()
        .filter_map(|e| match e {
            LinkEvent::Delivered { device, id, .. } => Some((*device, *id)),
            _ => None,
        })
        .collect();
    pairs.sort_unstable();
    pairs
}

#[tokio::test(start_paused = true)]
async fn each_subscriber_gets_each_message_once_and_each_message_is_accepted_once() {
    let fake = Arc::new(Fake::default());
    fake.twice.store(true, Ordering::Relaxed);
    let (fleet, mut rx) = fleet(&fake, 3);
    fleet.subscribe(1, 7, QoS::AtLeastOnce).await.unwrap();
    fleet.subscribe(2, 7, QoS::AtMostOnce).await.unwrap();
    for id in 0..4 {
        let qos = if id % 2 == 0 {
            QoS::AtLeastOnce
        } else {
            QoS::AtMostOnce
        };
        fleet.publish(0, message(id, qos));
    }
    let mut events = events_until(&mut rx, |e| {
        accepted(e).len() == 4 && delivered(e).len() == 8
    })
    .await;
    events.extend(remaining(&mut rx).await);
    assert_eq!(accepted(&events), vec![0, 1, 2, 3]);
    // The server sent every QoS 1 delivery to device 1 twice; each is reported once.
    let want: Vec<(u32, u64)> = (1..=2)
        .flat_map(|d| (0..4).map(move |id| (d, id)))
        .collect();
    assert_eq!(delivered(&events), want);
    assert_eq!(fleet.publishing(), 0);
    // The publisher's link was opened by its first message, the subscribers' by their subscriptions.
    assert_eq!(fleet.shared.counters.snapshot().handshakes, 3);
    fleet.publish(9, message(9, QoS::AtMostOnce)); // no such device: ignored
    assert_eq!(fleet.publishing(), 0);
    assert!(fleet.subscribe(9, 7, QoS::AtMostOnce).await.is_err());
    fleet.close().await;
}

#[tokio::test(start_paused = true)]
async fn a_qos1_message_unacknowledged_when_its_connection_drops_goes_again_and_qos0_never() {
    let fake = Arc::new(Fake::default());
    let (fleet, mut rx) = fleet(&fake, 2);
    fleet.subscribe(1, 7, QoS::AtLeastOnce).await.unwrap();
    fleet.connect(0).await.unwrap();
    // The server relays the QoS 1 message but its acknowledgement never comes; the QoS 0 one is never written.
    fake.stall_publishes.store(true, Ordering::Relaxed);
    fleet.publish(0, message(1, QoS::AtLeastOnce));
    fleet.publish(0, message(2, QoS::AtMostOnce));
    let events = events_until(&mut rx, |e| delivered(e) == vec![(1, 1)]).await;
    assert!(accepted(&events).is_empty());
    assert_eq!(fleet.publishing(), 2);
    // No answer timeout applies to publishes: the connection lives on.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(fleet.shared.counters.snapshot().reconnects, 0);
    // The connections drop (a restarted server); the QoS 1 message goes again, marked, on the new connection.
    fake.stall_publishes.store(false, Ordering::Relaxed);
    fake.server_gen.fetch_add(1, Ordering::Relaxed);
    let events = events_until(&mut rx, |e| accepted(e) == vec![1]).await;
    let mut events = [events, remaining(&mut rx).await].concat();
    assert_eq!(
        accepted(&events),
        vec![1],
        "the QoS 0 message is never sent again"
    );
    // Delivered again by the server after the reconnect: reported once.
    events.retain(|e| matches!(e, LinkEvent::Delivered { .. }));
    assert!(delivered(&events).is_empty(), "{events:?}");
    assert_eq!(fleet.publishing(), 0);
    let publishes = fake.relay.lock().unwrap().publishes.clone();
    assert_eq!(publishes, vec![(1, false), (1, true)]);
    let c = fleet.shared.counters.snapshot();
    assert_eq!((c.reconnects, c.resent_reconnect), (2, 1), "{c:?}");
    fleet.close().await;
}

#[tokio::test(start_paused = true)]
async fn a_device_subscribes_again_on_every_new_connection() {
    let fake = Arc::new(Fake::default());
    let (fleet, mut rx) = fleet(&fake, 2);
    fleet.subscribe(1, 7, QoS::AtMostOnce).await.unwrap();
    fleet.subscribe(1, 8, QoS::AtLeastOnce).await.unwrap();
    fake.server_gen.fetch_add(1, Ordering::Relaxed);
    // The new server forgot the subscriptions; the device gives them again and deliveries resume.
    fake.relay.lock().unwrap().subscribers.clear();
    events_until(&mut rx, |e| {
        e.iter()
            .any(|e| matches!(e, LinkEvent::Connected { device: 1, .. }))
            && e.iter()
                .filter(|e| matches!(e, LinkEvent::Connected { .. }))
                .count()
                >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut subscribes = fake.relay.lock().unwrap().subscribes.clone();
    subscribes.sort_unstable();
    assert_eq!(subscribes, vec![(1, 7), (1, 7), (1, 8), (1, 8)]);
    fleet.publish(0, message(5, QoS::AtMostOnce));
    let events = events_until(&mut rx, |e| delivered(e) == vec![(1, 5)]).await;
    assert!(delivered(&events).len() == 1);
    fleet.close().await;
}

#[tokio::test(start_paused = true)]
async fn a_refused_or_unsupported_subscription_fails_and_is_not_asked_again() {
    let fake = Arc::new(Fake::default());
    let (fleet, _rx) = fleet(&fake, 2);
    let refused = fleet.subscribe(0, 666, QoS::AtLeastOnce).await;
    assert!(
        matches!(refused, Err(TransportError::Protocol(_))),
        "{refused:?}"
    );
    fake.server_gen.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(fake.relay.lock().unwrap().subscribes, vec![(0, 666)]);

    // A transport without publish/subscribe: the subscription fails, the message is dropped unreported, and the
    // connection is kept (it works for orders).
    fake.no_pubsub.store(true, Ordering::Relaxed);
    let reconnects = fleet.shared.counters.snapshot().reconnects;
    let e = fleet.subscribe(1, 7, QoS::AtMostOnce).await;
    assert!(matches!(e, Err(TransportError::Unsupported(_))), "{e:?}");
    fleet.publish(1, message(1, QoS::AtLeastOnce));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(fleet.publishing(), 0);
    assert_eq!(fleet.shared.counters.snapshot().reconnects, reconnects);
    fleet.close().await;
}

#[tokio::test(start_paused = true)]
async fn what_a_connection_received_before_it_dropped_is_still_reported() {
    let fake = Arc::new(Fake::default());
    let (fleet, mut rx) = fleet(&fake, 2);
    fleet.subscribe(1, 7, QoS::AtMostOnce).await.unwrap();
    fleet.connect(0).await.unwrap();
    // Deliveries queued on the subscriber's connection in the same instant as its drop.
    let relay_and_break = {
        let fake = fake.clone();
        move || {
            for id in 0..3 {
                fake.relay(&message(id, QoS::AtMostOnce), false);
            }
            fake.server_gen.fetch_add(1, Ordering::Relaxed);
        }
    };
    relay_and_break();
    let events = events_until(&mut rx, |e| delivered(e).len() == 3).await;
    assert_eq!(delivered(&events), vec![(1, 0), (1, 1), (1, 2)]);
    fleet.close().await;
}

#[tokio::test(start_paused = true)]
async fn a_disconnect_forgets_subscriptions_and_messages_not_yet_accepted() {
    let fake = Arc::new(Fake::default());
    let (fleet, mut rx) = fleet(&fake, 2);
    fake.stall_subscribes.store(true, Ordering::Relaxed);
    let waiting = fleet.subscribe(1, 7, QoS::AtLeastOnce);
    fake.stall_publishes.store(true, Ordering::Relaxed);
    fleet.publish(1, message(1, QoS::AtLeastOnce));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(fleet.publishing(), 1);
    fleet.disconnect(1).await.unwrap();
    assert!(waiting.await.is_err());
    assert_eq!(fleet.publishing(), 0);
    // Asked again, the device has nothing left to subscribe or publish.
    fake.stall_subscribes.store(false, Ordering::Relaxed);
    fake.stall_publishes.store(false, Ordering::Relaxed);
    fleet.connect(1).await.unwrap();
    let events = remaining(&mut rx).await;
    assert!(accepted(&events).is_empty(), "{events:?}");
    assert_eq!(fake.relay.lock().unwrap().subscribes, vec![]);
    fleet.close().await;
}
