//! The client side of every connection-oriented transport (quinn, s2n-quic, MQTT): one [`Fleet`] written once,
//! generic over a small [`Connector`] that knows how to open one device's connection and send one order on it.
//!
//! # Policy (as the seed's quinn client, and as users of such a transport would configure it)
//!
//! - Each device has one connection with its own identity, opened when the device first has something to do
//!   ([`Fleet::connect`] or its first order) and opened again whenever it drops.
//! - Orders go out as soon as they are handed over, each on its own request ([`Connector::send_order`]); several may
//!   be in flight on one connection.
//! - An order with no answer within [`Policy::answer_timeout`] (1 s), or whose connection drops, is sent again on a
//!   **new** connection: the old one is closed, a new handshake made, every unanswered order sent again. On a new
//!   connection that has not answered anything yet, the first answer may take up to [`Policy::connect_timeout`]:
//!   until then the handshake is not known to be complete on the server's side.
//! - A failed connection attempt, or a connection that drops before it has answered anything, is retried after a
//!   back-off growing from 100 ms to 1 s, so a dead or refusing server is not hammered. A connection that has
//!   answered and then drops (a restarted server resetting it) is replaced at once.
//! - [`LinkEvent::Stored`] is reported exactly once per order: a late answer from an old connection counts if it
//!   comes first; any answer for an order already reported is ignored.
//!
//! # Counted here (on the client's [`Counters`])
//!
//! `handshakes` (each connection the connector completed), `reconnects` (each connection a device opened after its
//! first), `resent` (each order sent again on a new connection). The TLS operations themselves are counted by the
//! crypto provider ([`transport_tls`]).
//!
//! # Cost per device
//!
//! One tokio task, a command queue (a mutex-guarded `Vec` and a `Notify`), the connection, and the orders in
//! flight; nothing else is allocated while a device is idle.

use futures::stream::{FuturesUnordered, StreamExt};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use transport_core::Counters;
use transport_core::TransportError;
use transport_core::{BoxFuture, Fleet, FleetConfig, LinkEvent};
use transport_core::{Order, OrderId};
use transport_tls::DeviceCredentials;

/// The server's answer to one order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The order is stored.
    Stored(OrderId),
    /// The order is refused and will never be stored; it is not sent again.
    Refused(OrderId),
}

/// What a connection-oriented transport provides to [`ConnFleet`].
///
/// A QUIC transport opens one bidirectional stream per order in [`send_order`](Connector::send_order): streams cost
/// no round trip to open, an order and its answer are one request and one response, and orders never wait behind
/// each other (no head-of-line blocking between streams). A transport over one byte stream (TLS over TCP) pipelines:
/// its connection holds a writer and a table of waiting answers keyed by order id, `send_order` queues the frame
/// and returns a future that resolves when the reader task finds the matching answer.
pub trait Connector: Send + Sync + 'static {
    /// One device's live connection.
    type Conn: Send + 'static;

    /// Open device `device`'s connection with its own identity; resolves when the handshake is complete.
    fn connect(&self, device: u32) -> BoxFuture<'_, Result<Self::Conn, TransportError>>;

    /// Send `order` on `conn`. The order is encoded before this returns (the future does not borrow it); the future
    /// resolves with the server's answer to this order, or an error if the connection or its stream failed.
    fn send_order(
        &self,
        conn: &Self::Conn,
        order: &Order,
    ) -> BoxFuture<'static, Result<Answer, TransportError>>;

    /// A future that resolves when `conn` is closed, by either side or by a timeout or reset.
    fn closed(&self, conn: &Self::Conn) -> BoxFuture<'static, ()>;

    /// Close `conn` (the device gave up on it or the fleet is closing).
    fn close(&self, conn: Self::Conn) {
        drop(conn);
    }

    /// Close `conn` politely, as the protocol says a client leaves (MQTT's DISCONNECT, a QUIC close with no
    /// error); resolves when it is closed. The default is [`close`](Connector::close).
    fn disconnect(&self, conn: Self::Conn) -> BoxFuture<'static, ()> {
        self.close(conn);
        Box::pin(async {})
    }

    /// Called once when the fleet closes, after every device has stopped (e.g. to let an endpoint drain).
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Makes a transport's [`Connector`] from the server's address, the devices' credentials, their number and the
/// counters to count into (a transport's constructor, such as `QuinnConnector::new`).
pub trait MakeConnector<C>:
    FnOnce(SocketAddr, Arc<DeviceCredentials>, u32, Arc<Counters>) -> Result<C, TransportError>
{
}

impl<C, F> MakeConnector<C> for F where
    F: FnOnce(SocketAddr, Arc<DeviceCredentials>, u32, Arc<Counters>) -> Result<C, TransportError>
{
}

/// The re-send and reconnect policy.
#[derive(Debug, Clone)]
pub struct Policy {
    /// An order unanswered this long is sent again on a new connection.
    pub answer_timeout: Duration,
    /// A connection attempt (handshake included) taking longer than this fails; a new connection's first answer
    /// may take this long too.
    pub connect_timeout: Duration,
    /// The first wait after a failed connection attempt.
    pub backoff_min: Duration,
    /// The longest wait between attempts; the wait doubles up to it.
    pub backoff_max: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            answer_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(10),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(1),
        }
    }
}

/// What the fleet hands to a device's task.
enum Command {
    Order(Order),
    Connect(oneshot::Sender<Result<(), TransportError>>),
    Disconnect(oneshot::Sender<Result<(), TransportError>>),
}

/// One device's mailbox.
#[derive(Default)]
struct Mailbox {
    commands: Mutex<Vec<Command>>,
    notify: Notify,
}

struct Shared {
    mailboxes: Box<[Mailbox]>,
    pending: AtomicUsize,
    events: mpsc::UnboundedSender<LinkEvent>,
    counters: Arc<Counters>,
    policy: Policy,
}

/// The [`Fleet`] of a connection-oriented transport: one task per device driving a [`Connector`].
pub struct ConnFleet<C: Connector> {
    connector: Arc<C>,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    tasks: tokio::sync::Mutex<JoinSet<()>>,
}

impl<C: Connector> ConnFleet<C> {
    /// Start the tasks of devices `0..devices` (must be called inside a tokio runtime). Nothing connects until a
    /// device is asked to.
    pub fn start(
        connector: C,
        devices: u32,
        events: mpsc::UnboundedSender<LinkEvent>,
        counters: Arc<Counters>,
        policy: Policy,
    ) -> Self {
        let connector = Arc::new(connector);
        let shared = Arc::new(Shared {
            mailboxes: (0..devices).map(|_| Mailbox::default()).collect(),
            pending: AtomicUsize::new(0),
            events,
            counters,
            policy,
        });
        let (shutdown, _) = watch::channel(false);
        let mut tasks = JoinSet::new();
        for device in 0..devices {
            let device_task = Device::new(device, connector.clone(), shared.clone());
            tasks.spawn(device_task.run(shutdown.subscribe()));
        }
        Self {
            connector,
            shared,
            shutdown,
            tasks: tokio::sync::Mutex::new(tasks),
        }
    }

    /// The fleet a transport's [`Transport::fleet`](transport_core::Transport::fleet) returns for `config`: the devices'
    /// credentials loaded from its identity directory (enough for its devices), a connector for them, the default
    /// policy. Must be called inside a tokio runtime.
    pub fn from_config(
        config: FleetConfig,
        connector: impl MakeConnector<C>,
    ) -> Result<Box<dyn Fleet>, TransportError> {
        let credentials = DeviceCredentials::load_for(&config.identity, config.devices)?;
        let connector = connector(
            config.server,
            Arc::new(credentials),
            config.devices,
            config.counters.clone(),
        )?;
        Ok(Box::new(Self::start(
            connector,
            config.devices,
            config.events,
            config.counters,
            Policy::default(),
        )))
    }

    fn post(&self, device: u32, command: Command) -> Result<(), Command> {
        let Some(mailbox) = self.shared.mailboxes.get(device as usize) else {
            return Err(command);
        };
        mailbox
            .commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(command);
        mailbox.notify.notify_one();
        Ok(())
    }
}

impl<C: Connector> Fleet for ConnFleet<C> {
    fn connect(&self, device: u32) -> BoxFuture<'_, Result<(), TransportError>> {
        let (tx, rx) = oneshot::channel();
        let posted = self.post(device, Command::Connect(tx));
        Box::pin(async move {
            if posted.is_err() {
                return Err(TransportError::Config(format!(
                    "no device {device} in this fleet"
                )));
            }
            rx.await
                .unwrap_or_else(|_| Err(TransportError::Protocol("the fleet is closed".into())))
        })
    }

    fn disconnect(&self, device: u32) -> BoxFuture<'_, Result<(), TransportError>> {
        let (tx, rx) = oneshot::channel();
        let posted = self.post(device, Command::Disconnect(tx));
        Box::pin(async move {
            if posted.is_err() {
                return Err(TransportError::Config(format!(
                    "no device {device} in this fleet"
                )));
            }
            rx.await
                .unwrap_or_else(|_| Err(TransportError::Protocol("the fleet is closed".into())))
        })
    }

    fn send(&self, device: u32, order: Order) {
        // Counted before it is posted, so the device can never report it stored before it is pending.
        self.shared.pending.fetch_add(1, Ordering::Relaxed);
        if self.post(device, Command::Order(order)).is_err() {
            self.shared.pending.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn pending(&self) -> usize {
        self.shared.pending.load(Ordering::Relaxed)
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let _ = self.shutdown.send(true);
            let mut tasks = self.tasks.lock().await;
            while tasks.join_next().await.is_some() {}
            self.connector.shutdown().await;
        })
    }
}

/// An order handed to a device and not yet answered.
struct Outstanding {
    order: Order,
    /// The connection generation it was last sent on (0: never sent).
    sent_on: u64,
    /// When it was last sent (None: waiting for a connection).
    sent_at: Option<Instant>,
}

type InFlight = BoxFuture<'static, (OrderId, u64, Result<Answer, TransportError>)>;

/// The state of one device's task.
struct Device<C: Connector> {
    device: u32,
    connector: Arc<C>,
    shared: Arc<Shared>,
    conn: Option<C::Conn>,
    closed: Option<BoxFuture<'static, ()>>,
    /// Generation of the current (or last) connection; 0 before the first.
    generation: u64,
    outstanding: Vec<Outstanding>,
    in_flight: FuturesUnordered<InFlight>,
    waiters: Vec<oneshot::Sender<Result<(), TransportError>>>,
    /// The wait before the next attempt if this one fails.
    backoff: Duration,
    retry_at: Option<Instant>,
    /// Whether the current connection has answered anything: one that drops before it has is a failed attempt
    /// (e.g. the server refused the certificate after the client's side of the handshake finished).
    proven: bool,
    /// Whether the device wants a link: set when it is asked to connect or given an order, cleared when it is asked
    /// to disconnect. A device that wants a link opens it again whenever it drops.
    keep: bool,
    /// Whether the last link ended without being asked to (the next one is a reconnect).
    lost: bool,
    /// A link being closed on request, and who asked.
    leaving: Option<C::Conn>,
    goodbyes: Vec<oneshot::Sender<Result<(), TransportError>>>,
}

impl<C: Connector> Device<C> {
    fn new(device: u32, connector: Arc<C>, shared: Arc<Shared>) -> Self {
        let backoff = shared.policy.backoff_min;
        Self {
            device,
            connector,
            shared,
            conn: None,
            closed: None,
            generation: 0,
            outstanding: Vec::new(),
            in_flight: FuturesUnordered::new(),
            waiters: Vec::new(),
            backoff,
            retry_at: None,
            proven: false,
            keep: false,
            lost: false,
            leaving: None,
            goodbyes: Vec::new(),
        }
    }

    async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let shared = self.shared.clone();
        let mailbox = &shared.mailboxes[self.device as usize];
        loop {
            if *shutdown.borrow() {
                break;
            }
            self.take_commands(mailbox);
            if !self.goodbyes.is_empty() {
                // Closing on request: the old link says goodbye before anything else happens on this device.
                let goodbye = match self.leaving.take() {
                    Some(conn) => self.connector.disconnect(conn),
                    None => Box::pin(async {}),
                };
                tokio::select! {
                    biased;
                    _ = shutdown.changed() => break,
                    () = goodbye => {}
                }
                for reply in self.goodbyes.drain(..) {
                    let _ = reply.send(Ok(()));
                }
                continue;
            }
            // A device that has work, or wants its link, keeps a connection.
            let wants = !self.outstanding.is_empty() || !self.waiters.is_empty() || self.keep;
            let may_try = self.retry_at.is_none_or(|t| Instant::now() >= t);
            if self.conn.is_none() && wants && may_try {
                let attempt = tokio::time::timeout(
                    shared.policy.connect_timeout,
                    self.connector.connect(self.device),
                );
                tokio::select! {
                    biased;
                    _ = shutdown.changed() => break,
                    result = attempt => self.connected(result),
                }
                continue; // take the commands that arrived meanwhile
            }
            self.send_unsent();
            let wake = if self.conn.is_some() {
                self.next_deadline()
            } else {
                self.retry_at
            };
            tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                Some((id, generation, result)) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    self.answered(id, generation, result);
                }
                _ = mailbox.notify.notified() => {}
                _ = wait_for(&mut self.closed) => self.drop_connection(),
                _ = sleep_until(wake) => {
                    let now = Instant::now();
                    if self.conn.is_some() && self.next_deadline().is_some_and(|d| d <= now) {
                        // No answer in time: give up on this connection; every unanswered order goes again on
                        // a new one.
                        self.drop_connection();
                    }
                }
            }
        }
        for conn in [self.conn.take(), self.leaving.take()]
            .into_iter()
            .flatten()
        {
            self.connector.close(conn);
        }
        for waiter in self.waiters.drain(..).chain(self.goodbyes.drain(..)) {
            let _ = waiter.send(Err(TransportError::Protocol("the fleet is closed".into())));
        }
    }

    fn take_commands(&mut self, mailbox: &Mailbox) {
        let commands =
            std::mem::take(&mut *mailbox.commands.lock().unwrap_or_else(|e| e.into_inner()));
        for command in commands {
            match command {
                Command::Order(order) => {
                    self.keep = true;
                    self.outstanding.push(Outstanding {
                        order,
                        sent_on: 0,
                        sent_at: None,
                    })
                }
                Command::Connect(reply) if self.conn.is_some() => {
                    let _ = reply.send(Ok(()));
                }
                Command::Connect(reply) => {
                    self.keep = true;
                    self.waiters.push(reply)
                }
                Command::Disconnect(reply) => {
                    self.forget();
                    self.goodbyes.push(reply);
                }
            }
        }
    }

    /// Asked to disconnect: give up the link and everything not yet answered, as a device that leaves does. The
    /// commands after this one apply to a new link.
    fn forget(&mut self) {
        let abandoned = self.outstanding.len();
        self.outstanding.clear();
        self.in_flight = FuturesUnordered::new();
        self.shared.pending.fetch_sub(abandoned, Ordering::Relaxed);
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(Err(TransportError::Protocol(
                "disconnected on request".into(),
            )));
        }
        self.closed = None;
        if let Some(conn) = self.conn.take() {
            if let Some(earlier) = self.leaving.replace(conn) {
                self.connector.close(earlier);
            }
        }
        self.keep = false;
        self.lost = false;
        self.proven = false;
        self.retry_at = None;
        self.backoff = self.shared.policy.backoff_min;
    }

    fn connected(
        &mut self,
        result: Result<Result<C::Conn, TransportError>, tokio::time::error::Elapsed>,
    ) {
        let result = match result {
            Ok(r) => r,
            Err(_) => Err(TransportError::Protocol(
                "connection attempt timed out".into(),
            )),
        };
        match result {
            Ok(conn) => {
                let counters = &self.shared.counters;
                Counters::inc(&counters.handshakes);
                if self.lost {
                    Counters::inc(&counters.reconnects);
                }
                self.lost = false;
                self.generation += 1;
                let _ = self.shared.events.send(LinkEvent::Connected {
                    device: self.device,
                    at: std::time::Instant::now(),
                });
                self.closed = Some(self.connector.closed(&conn));
                self.conn = Some(conn);
                self.retry_at = None;
                self.proven = false;
                for waiter in self.waiters.drain(..) {
                    let _ = waiter.send(Ok(()));
                }
            }
            Err(e) => {
                self.back_off();
                let message = e.to_string();
                let mut first = Some(e);
                for waiter in self.waiters.drain(..) {
                    let e = first
                        .take()
                        .unwrap_or_else(|| TransportError::Protocol(message.clone()));
                    let _ = waiter.send(Err(e));
                }
            }
        }
    }

    /// Send every order not yet sent on the current connection.
    fn send_unsent(&mut self) {
        let Some(conn) = &self.conn else { return };
        let now = Instant::now();
        for o in self
            .outstanding
            .iter_mut()
            .filter(|o| o.sent_on != self.generation)
        {
            if o.sent_on != 0 {
                Counters::inc(&self.shared.counters.resent_reconnect);
            }
            o.sent_on = self.generation;
            o.sent_at = Some(now);
            let (id, generation) = (o.order.id, self.generation);
            let answer = self.connector.send_order(conn, &o.order);
            self.in_flight
                .push(Box::pin(async move { (id, generation, answer.await) }));
        }
    }

    fn answered(&mut self, id: OrderId, generation: u64, result: Result<Answer, TransportError>) {
        let (answer_id, stored) = match result {
            Ok(Answer::Stored(answer_id)) => (answer_id, true),
            Ok(Answer::Refused(answer_id)) => (answer_id, false),
            Err(_) => {
                // The request failed: if on the current connection, that connection is broken.
                if generation == self.generation && self.conn.is_some() {
                    self.drop_connection();
                }
                return;
            }
        };
        if answer_id != id {
            // An answer to another order than the one sent: the connection cannot be trusted.
            if generation == self.generation && self.conn.is_some() {
                self.drop_connection();
            }
            return;
        }
        if generation == self.generation && self.conn.is_some() {
            self.proven = true;
            self.backoff = self.shared.policy.backoff_min;
        }
        let Some(at) = self.outstanding.iter().position(|o| o.order.id == id) else {
            return; // already reported
        };
        self.outstanding.swap_remove(at);
        self.shared.pending.fetch_sub(1, Ordering::Relaxed);
        if stored {
            let _ = self.shared.events.send(LinkEvent::Stored {
                device: self.device,
                id,
                at: std::time::Instant::now(),
            });
        }
    }

    /// When the oldest unanswered order on the current connection is due its answer. Until the connection has
    /// answered once, the connect timeout applies instead of the answer timeout: the client's side of a TLS 1.3
    /// handshake finishes before the server's does, and the server may still be working through a crowd of
    /// handshakes; abandoning such a connection after 1 s would only add another handshake to the crowd.
    fn next_deadline(&self) -> Option<Instant> {
        let policy = &self.shared.policy;
        let wait = if self.proven {
            policy.answer_timeout
        } else {
            policy.connect_timeout
        };
        self.outstanding
            .iter()
            .filter_map(|o| o.sent_at)
            .min()
            .map(|t| t + wait)
    }

    /// Wait before the next attempt, longer after each failure.
    fn back_off(&mut self) {
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(self.shared.policy.backoff_max);
    }

    /// Give up on the current connection. The next turn of the loop opens a new one: at once if this one had
    /// worked, after the back-off if it never answered anything.
    fn drop_connection(&mut self) {
        self.closed = None;
        if let Some(conn) = self.conn.take() {
            self.connector.close(conn);
            self.lost = true;
            let _ = self.shared.events.send(LinkEvent::Lost {
                device: self.device,
                at: std::time::Instant::now(),
            });
            if !self.proven {
                self.back_off();
            }
        }
        for o in &mut self.outstanding {
            o.sent_at = None;
        }
    }
}

async fn wait_for(closed: &mut Option<BoxFuture<'static, ()>>) {
    match closed {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::AtomicBool;

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
        attempts: AtomicUsize,
        stored: Mutex<HashMap<OrderId, usize>>,
    }

    struct FakeConn {
        server_gen: usize,
        fake: Arc<Fake>,
    }

    struct FakeConnector(Arc<Fake>);

    impl Connector for FakeConnector {
        type Conn = FakeConn;

        fn connect(&self, _device: u32) -> BoxFuture<'_, Result<FakeConn, TransportError>> {
            Box::pin(async move {
                self.0.attempts.fetch_add(1, Ordering::Relaxed);
                if self.0.down.load(Ordering::Relaxed) {
                    return Err(TransportError::Protocol("refused".into()));
                }
                let server_gen = if self.0.refuse_after_connect.load(Ordering::Relaxed) {
                    usize::MAX
                } else {
                    self.0.server_gen.load(Ordering::Relaxed)
                };
                Ok(FakeConn {
                    server_gen,
                    fake: self.0.clone(),
                })
            })
        }

        fn send_order(
            &self,
            conn: &FakeConn,
            order: &Order,
        ) -> BoxFuture<'static, Result<Answer, TransportError>> {
            let (fake, gen, id) = (conn.fake.clone(), conn.server_gen, order.id);
            Box::pin(async move {
                tokio::task::yield_now().await;
                if fake.stall.load(Ordering::Relaxed)
                    || gen != fake.server_gen.load(Ordering::Relaxed)
                {
                    return std::future::pending().await;
                }
                *fake.stored.lock().unwrap().entry(id).or_default() += 1;
                if id.sender == 666 {
                    return Ok(Answer::Refused(id));
                }
                Ok(Answer::Stored(id))
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

    async fn stored_events(rx: &mut mpsc::UnboundedReceiver<LinkEvent>, n: usize) -> Vec<OrderId> {
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
    ) -> (ConnFleet<FakeConnector>, mpsc::UnboundedReceiver<LinkEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let fleet = ConnFleet::start(
            FakeConnector(fake.clone()),
            devices,
            tx,
            Arc::new(Counters::default()),
            Policy::default(),
        );
        (fleet, rx)
    }

    #[tokio::test(start_paused = true)]
    async fn orders_are_stored_once_and_connections_reused() {
        let fake = Arc::new(Fake::default());
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

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_order_goes_again_on_a_new_connection() {
        let fake = Arc::new(Fake::default());
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

    #[tokio::test(start_paused = true)]
    async fn a_restarted_server_gets_every_order_again_and_each_is_reported_once() {
        let fake = Arc::new(Fake::default());
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

    #[tokio::test(start_paused = true)]
    async fn a_link_closed_on_request_stays_closed_until_asked_again() {
        let fake = Arc::new(Fake::default());
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

    #[tokio::test(start_paused = true)]
    async fn refused_orders_are_not_pending_and_not_reported() {
        let fake = Arc::new(Fake::default());
        let (fleet, mut rx) = fleet(&fake, 1);
        fleet.send(0, order(666, 0));
        fleet.send(0, order(0, 1));
        assert_eq!(stored_events(&mut rx, 1).await, vec![order(0, 1).id]);
        tokio::time::sleep(Duration::from_millis(10)).await;
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
}
