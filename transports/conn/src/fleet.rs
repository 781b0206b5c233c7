//! The client side of every connection-oriented transport (quinn, s2n-quic, MQTT): one [`Fleet`] written once,
//! generic over a small [`Connector`] that knows how to open one device's connection and send one order on it.
//!
//! # Policy (as the seed's quinn client, and as users of such a transport would configure it)
//!
//! - Each device has one connection with its own identity, opened when the device first has something to do
//!   ([`Fleet::connect`] or its first order) and opened again whenever it drops.
//! - Orders go out as soon as they are handed over, each on its own request ([`Connector::send_order`]), up to the
//!   connection's window ([`Connector::window`], a QUIC server's stream limit) and to at most 1,024 requests in
//!   flight on a device's connections together; the rest wait in the device, in the order they were made, and go
//!   as answers make room.
//! - An order with no answer within [`Policy::answer_timeout`] (1 s) of being sent, or whose connection drops, is
//!   sent again on a **new** connection: the old one is closed, a new handshake made, every unanswered order sent
//!   again. On a new
//!   connection that has not answered anything yet, the first answer may take up to [`Policy::connect_timeout`]:
//!   until then the handshake is not known to be complete on the server's side.
//! - A failed connection attempt, or a connection that drops before it has answered anything, is retried after a
//!   back-off growing from 100 ms to 1 s, so a dead or refusing server is not hammered. A connection that has
//!   answered and then drops (a restarted server resetting it) is replaced at once.
//! - [`LinkEvent::Stored`] is reported exactly once per order: a late answer from an old connection counts if it
//!   comes first; any answer for an order already reported is ignored.
//! - Publish/subscribe ([`pubsub`]): subscriptions are sent again on every new connection; a QoS 1 message not
//!   acknowledged when its connection drops is sent again on the next one, a QoS 0 message never;
//!   [`LinkEvent::Accepted`] is reported once per message and [`LinkEvent::Delivered`] once per subscriber and message.
//!   Publishes and subscriptions wait for their answer as long as their connection lives (the transport's keepalive
//!   decides when it is dead); only orders have an answer timeout.
//!
//! # Counted here (on the client's [`Counters`])
//!
//! `handshakes` (each connection the connector completed), `resumed` (those of them the connector reports resumed a
//! TLS session, [`Connector::resumed`]), `reconnects` (each connection a device opened after its first),
//! `resent_reconnect` (each order or QoS 1 message sent again on a new connection). The TLS operations themselves
//! are counted by the crypto provider ([`transport_tls`]).
//!
//! # Cost per device
//!
//! One tokio task, a command queue (a mutex-guarded `Vec` and a `Notify`), the connection, and the orders in
//! flight; nothing else is allocated while a device is idle. An order sent as a request costs the connector's
//! future and nothing else of the fleet's: it waits in a slot that is used again (`fleet/requests.rs`).

mod ids;
mod orders;
mod pubsub;
mod requests;

pub use pubsub::{message_id, payload, Deliveries, Delivery, SubAck, ID_BYTES};

use futures::stream::StreamExt;
use futures::FutureExt;
use orders::Orders;
use pubsub::{Acceptance, Confirmed, PubSub};
use requests::Requests;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use transport_core::Counters;
use transport_core::TransportError;
use transport_core::{BoxFuture, Fleet, FleetConfig, LinkEvent, Publish, QoS};
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

impl Answer {
    /// The order it answers.
    pub fn id(&self) -> OrderId {
        match self {
            Answer::Stored(id) | Answer::Refused(id) => *id,
        }
    }
}

/// The answers of a pipelined connection ([`Connector::answers`]), in batches as its reader found them (one batch
/// per read from the connection); the stream ends when the connection does.
pub type Answers = mpsc::UnboundedReceiver<Vec<Answer>>;

/// What a connection-oriented transport provides to [`ConnFleet`].
///
/// Orders go one of two ways:
///
/// - **A request per order** ([`send_order`](Connector::send_order)): a QUIC transport opens one bidirectional
///   stream per order: streams cost no round trip to open, an order and its answer are one request and one
///   response, and orders never wait behind each other (no head-of-line blocking between streams).
/// - **Pipelined** ([`answers`](Connector::answers) and [`queue_orders`](Connector::queue_orders)): a transport over
///   one byte stream (TLS over TCP) queues each order's frame for the connection's writer and its reader hands the
///   answers over in batches, one per read: nothing is allocated or awaited per order on the device's side. A
///   connector whose `answers` returns a stream for a connection is pipelined on it; `send_order` is not used then.
pub trait Connector: Send + Sync + 'static {
    /// One device's live connection.
    type Conn: Send + 'static;

    /// Open device `device`'s connection with its own identity; resolves when the handshake is complete.
    fn connect(&self, device: u32) -> BoxFuture<'_, Result<Self::Conn, TransportError>>;

    /// Send `order` on `conn`. The order is encoded before this returns (the future does not borrow it); the future
    /// resolves with the server's answer to this order, or an error if the connection or its stream failed. The
    /// default (for a pipelined connector): not supported.
    fn send_order(
        &self,
        conn: &Self::Conn,
        order: &Order,
    ) -> BoxFuture<'static, Result<Answer, TransportError>> {
        let _ = (conn, order);
        Box::pin(async { Err(TransportError::Unsupported("a request per order")) })
    }

    /// The answers to the orders [`queue_orders`](Connector::queue_orders) sends on `conn`, taken once right after it
    /// connects; `None` (the default): orders go with [`send_order`](Connector::send_order) on this connection.
    fn answers(&self, conn: &mut Self::Conn) -> Option<Answers> {
        let _ = conn;
        None
    }

    /// Queue `orders`, in order, to be sent on a pipelined `conn`; their answers come on the connection's
    /// [`answers`](Connector::answers). With each order, whether it was sent on an earlier connection (MQTT sends
    /// it again with the same packet identifier). An error if the connection is closed or cannot take them: the
    /// connection is then dropped and every order goes again on the next one. The default: not supported.
    fn queue_orders(
        &self,
        conn: &Self::Conn,
        orders: &mut dyn Iterator<Item = (&Order, bool)>,
    ) -> Result<(), TransportError> {
        let _ = (conn, orders);
        Err(TransportError::Unsupported("pipelined orders"))
    }

    /// How many orders one connection carries at once: the fleet sends no more than this on a connection, the rest
    /// wait in the device, and an order's answer timeout starts when it is sent. It should match what the server
    /// allows (a QUIC server's stream limit), so an order is never sent only to wait inside the library. The
    /// default: no limit.
    fn window(&self) -> usize {
        usize::MAX
    }

    /// A future that resolves when `conn` is closed, by either side or by a timeout or reset.
    fn closed(&self, conn: &Self::Conn) -> BoxFuture<'static, ()>;

    /// Whether `conn`'s handshake resumed an earlier session (a TLS 1.3 ticket) rather than being a full one. The
    /// default: never.
    fn resumed(&self, conn: &Self::Conn) -> bool {
        let _ = conn;
        false
    }

    /// Close `conn` (the device gave up on it or the fleet is closing).
    fn close(&self, conn: Self::Conn) {
        drop(conn);
    }

    /// Close `conn` politely, as the protocol says a client leaves (MQTT's DISCONNECT, a QUIC close with no
    /// error); resolves when it is closed, with an error if the server did not take its part (an MQTT broker that
    /// did not close the connection after DISCONNECT): the connection is closed all the same. The default is
    /// [`close`](Connector::close).
    fn disconnect(&self, conn: Self::Conn) -> BoxFuture<'static, Result<(), TransportError>> {
        self.close(conn);
        Box::pin(async { Ok(()) })
    }

    /// Called once when the fleet closes, after every device has stopped (e.g. to let an endpoint drain).
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// Subscribe `conn` to `channel` at `qos`; resolves with the server's answer, or an error if the connection
    /// failed. The default: not supported.
    fn subscribe(
        &self,
        conn: &Self::Conn,
        channel: u32,
        qos: QoS,
    ) -> BoxFuture<'static, Result<SubAck, TransportError>> {
        let _ = (conn, channel, qos);
        Box::pin(async { Err(TransportError::Unsupported("publish/subscribe")) })
    }

    /// Publish `message` on `conn` (its payload is [`payload`]); `again` if it was sent on an earlier connection and
    /// not acknowledged there (MQTT's DUP). Resolves when it is accepted: QoS 1 acknowledged by the server, QoS 0
    /// written to the connection; an error if the connection failed first. The default: not supported.
    fn publish(
        &self,
        conn: &Self::Conn,
        message: &Publish,
        again: bool,
    ) -> BoxFuture<'static, Result<(), TransportError>> {
        let _ = (conn, message, again);
        Box::pin(async { Err(TransportError::Unsupported("publish/subscribe")) })
    }

    /// The messages `conn` will receive as a subscriber, taken once right after it connects (QoS 1 deliveries
    /// already acknowledged to the server by the connection). The default: none.
    fn deliveries(&self, conn: &mut Self::Conn) -> Option<Deliveries> {
        let _ = conn;
        None
    }
}

/// Makes a transport's [`Connector`] from the server's address, the devices' credentials, the end of the fleet's
/// device numbers (every device it is asked to connect is below it) and the counters to count into (a transport's
/// constructor, such as `QuinnConnector::new`).
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
/// Where a device answers a command that waits for it.
type Reply = oneshot::Sender<Result<(), TransportError>>;

enum Command {
    Order(Order),
    Connect(Reply),
    Disconnect(Reply),
    Subscribe {
        channel: u32,
        qos: QoS,
        reply: Reply,
    },
    Publish(Publish),
}

/// One device's mailbox.
#[derive(Default)]
struct Mailbox {
    commands: Mutex<Vec<Command>>,
    notify: Notify,
}

struct Shared {
    /// The first device's number: device `d` has mailbox `d - first`.
    first: u32,
    mailboxes: Box<[Mailbox]>,
    pending: AtomicUsize,
    publishing: AtomicUsize,
    events: transport_core::events::EventSender,
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
        events: transport_core::events::EventSender,
        counters: Arc<Counters>,
        policy: Policy,
    ) -> Self {
        Self::start_at(connector, 0, devices, events, counters, policy)
    }

    /// Start the tasks of devices `first..first + devices`, a slice of a run's devices (must be called inside a
    /// tokio runtime). Devices keep their numbers: the connector, [`Fleet`] calls and events all use them.
    pub fn start_at(
        connector: C,
        first: u32,
        devices: u32,
        events: transport_core::events::EventSender,
        counters: Arc<Counters>,
        policy: Policy,
    ) -> Self {
        let connector = Arc::new(connector);
        let shared = Arc::new(Shared {
            first,
            mailboxes: (0..devices).map(|_| Mailbox::default()).collect(),
            pending: AtomicUsize::new(0),
            publishing: AtomicUsize::new(0),
            events,
            counters,
            policy,
        });
        let (shutdown, _) = watch::channel(false);
        let mut tasks = JoinSet::new();
        for device in first..first.saturating_add(devices) {
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
    /// credentials loaded from its identity directory (enough for its devices, `config.first` included), a
    /// connector for them, the default policy. Must be called inside a tokio runtime.
    pub fn from_config(
        config: FleetConfig,
        connector: impl MakeConnector<C>,
    ) -> Result<Box<dyn Fleet>, TransportError> {
        let end = config
            .first
            .checked_add(config.devices)
            .ok_or_else(|| TransportError::Config("device numbers overflow".into()))?;
        let credentials = DeviceCredentials::load_for(&config.identity, end)?;
        let connector = connector(
            config.server,
            Arc::new(credentials),
            end,
            config.counters.clone(),
        )?;
        Ok(Box::new(Self::start_at(
            connector,
            config.first,
            config.devices,
            config.events,
            config.counters,
            Policy::default(),
        )))
    }

    fn post(&self, device: u32, command: Command) -> Result<(), Command> {
        let Some(mailbox) = self.shared.mailbox(device) else {
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

    /// Post the command `make` builds around a reply channel, and wait for the device's reply.
    fn request(
        &self,
        device: u32,
        make: impl FnOnce(Reply) -> Command,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        let (reply, rx) = oneshot::channel();
        let posted = self.post(device, make(reply));
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
}

impl Shared {
    /// Device `device`'s mailbox, if the fleet has that device.
    fn mailbox(&self, device: u32) -> Option<&Mailbox> {
        let index = device.checked_sub(self.first)?;
        self.mailboxes.get(index as usize)
    }
}

impl<C: Connector> Fleet for ConnFleet<C> {
    fn connect(&self, device: u32) -> BoxFuture<'_, Result<(), TransportError>> {
        self.request(device, Command::Connect)
    }

    fn disconnect(&self, device: u32) -> BoxFuture<'_, Result<(), TransportError>> {
        self.request(device, Command::Disconnect)
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

    fn subscribe(
        &self,
        device: u32,
        channel: u32,
        qos: QoS,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        self.request(device, |reply| Command::Subscribe {
            channel,
            qos,
            reply,
        })
    }

    fn publish(&self, device: u32, message: Publish) {
        // Counted before it is posted, so the device can never report it accepted before it is counted.
        self.shared.publishing.fetch_add(1, Ordering::Relaxed);
        if self.post(device, Command::Publish(message)).is_err() {
            self.shared.publishing.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn publishing(&self) -> usize {
        self.shared.publishing.load(Ordering::Relaxed)
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

/// An order sent and not yet answered: the connector's future for its answer, tagged with the order and the
/// generation of the connection it went on (no second allocation per order around the connector's).
struct InFlight {
    id: OrderId,
    generation: u64,
    answer: BoxFuture<'static, Result<Answer, TransportError>>,
}

impl std::future::Future for InFlight {
    type Output = (OrderId, u64, Result<Answer, TransportError>);

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let (id, generation) = (self.id, self.generation);
        self.answer
            .as_mut()
            .poll(cx)
            .map(|result| (id, generation, result))
    }
}

/// The state of one device's task.
struct Device<C: Connector> {
    device: u32,
    connector: Arc<C>,
    shared: Arc<Shared>,
    conn: Option<C::Conn>,
    closed: Option<BoxFuture<'static, ()>>,
    /// Generation of the current (or last) connection; 0 before the first.
    generation: u64,
    /// Orders not yet answered.
    outstanding: Orders,
    /// The requests of orders sent one request each, on this connection or earlier ones.
    in_flight: Requests<InFlight>,
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
    /// Subscriptions, messages to publish, deliveries.
    pubsub: PubSub,
    /// Deliveries taken from the connection, reported one by one.
    batch: Vec<Delivery>,
    /// The answers of the current connection if it is pipelined ([`Connector::answers`]).
    answers: Option<Answers>,
    /// Events not yet handed to the workload: sent together before the device next waits.
    events: Vec<LinkEvent>,
    /// Orders answered since the events were last handed over: taken off the fleet's count of pending orders
    /// then, in one step (the count is shared by every device, and one step per answer cost as much as the rest
    /// of the answer).
    answered: usize,
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
            outstanding: Orders::default(),
            in_flight: Requests::default(),
            waiters: Vec::new(),
            backoff,
            retry_at: None,
            proven: false,
            keep: false,
            lost: false,
            leaving: None,
            goodbyes: Vec::new(),
            pubsub: PubSub::default(),
            batch: Vec::new(),
            answers: None,
            events: Vec::new(),
            answered: 0,
        }
    }

    async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let shared = self.shared.clone();
        let Some(mailbox) = shared.mailbox(self.device) else {
            return; // not one of this fleet's devices (never: the fleet starts only its own)
        };
        loop {
            self.flush_events();
            if *shutdown.borrow() {
                break;
            }
            self.take_commands(mailbox);
            if !self.goodbyes.is_empty() {
                // Closing on request: the old link says goodbye before anything else happens on this device.
                let goodbye = match self.leaving.take() {
                    Some(conn) => self.connector.disconnect(conn),
                    None => Box::pin(async { Ok(()) }),
                };
                let mut result = tokio::select! {
                    biased;
                    _ = shutdown.changed() => break,
                    r = goodbye => r,
                };
                for reply in self.goodbyes.drain(..) {
                    let this = match &result {
                        Ok(()) => Ok(()),
                        Err(e) => Err(TransportError::Protocol(e.to_string())),
                    };
                    let _ = reply.send(std::mem::replace(&mut result, this));
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
            self.flush_events();
            let wake = if self.conn.is_some() {
                self.next_deadline()
            } else {
                self.retry_at
            };
            tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                batch = next_answers(&mut self.answers), if self.answers.is_some() => match batch {
                    Some(batch) => {
                        self.answer_batch(batch);
                        // Every other batch already in, before the window is filled again (as below).
                        while let Some(Ok(batch)) = self.answers.as_mut().map(|a| a.try_recv()) {
                            self.answer_batch(batch);
                        }
                    }
                    // The connection's reader has stopped: the connection is over.
                    None => self.drop_connection(),
                },
                Some((id, generation, result)) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    // Every answer already in is taken now, with the one time it was taken at, as a pipelined
                    // connection's batch is; before the window is filled again: the orders that take their
                    // places then go out together (one write on a byte stream), not one per answer.
                    let at = std::time::Instant::now();
                    self.answered(id, generation, result, at);
                    while let Some(Some((id, generation, result))) = self.in_flight.next().now_or_never() {
                        self.answered(id, generation, result, at);
                    }
                }
                Some((channel, generation, result)) = self.pubsub.confirming.next(),
                    if !self.pubsub.confirming.is_empty() => self.confirmed(channel, generation, result),
                Some((id, generation, result)) = self.pubsub.accepting.next(),
                    if !self.pubsub.accepting.is_empty() => self.accepted(id, generation, result),
                more = pubsub::next_deliveries(&mut self.pubsub.deliveries, &mut self.batch) => {
                    if !more {
                        self.pubsub.deliveries = None;
                    }
                    self.report_deliveries();
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
        self.flush_events();
        for conn in [self.conn.take(), self.leaving.take()]
            .into_iter()
            .flatten()
        {
            self.connector.close(conn);
        }
        for waiter in self.waiters.drain(..).chain(self.goodbyes.drain(..)) {
            let _ = waiter.send(Err(TransportError::Protocol("the fleet is closed".into())));
        }
        self.pubsub.fail_waiters("the fleet is closed");
    }

    fn take_commands(&mut self, mailbox: &Mailbox) {
        let commands =
            std::mem::take(&mut *mailbox.commands.lock().unwrap_or_else(|e| e.into_inner()));
        for command in commands {
            match command {
                Command::Order(order) => {
                    self.keep = true;
                    if !self.outstanding.push(order) {
                        // Its id is unanswered already: one order, counted once.
                        self.shared.pending.fetch_sub(1, Ordering::Relaxed);
                    }
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
                Command::Subscribe {
                    channel,
                    qos,
                    reply,
                } => {
                    self.keep = true;
                    self.pubsub.subscribe(channel, qos, reply);
                }
                Command::Publish(message) => {
                    self.keep = true;
                    if !self.pubsub.publish(message) {
                        // Its id is outstanding already: one message, counted once.
                        self.shared.publishing.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    /// Asked to disconnect: give up the link and everything not yet answered, as a device that leaves does. The
    /// commands after this one apply to a new link.
    fn forget(&mut self) {
        let abandoned = self.outstanding.clear();
        self.in_flight.clear();
        self.answers = None;
        self.shared.pending.fetch_sub(abandoned, Ordering::Relaxed);
        let unpublished = self.pubsub.forget();
        self.shared
            .publishing
            .fetch_sub(unpublished, Ordering::Relaxed);
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
            Ok(mut conn) => {
                self.pubsub.deliveries = self.connector.deliveries(&mut conn);
                self.answers = self.connector.answers(&mut conn);
                let counters = &self.shared.counters;
                Counters::inc(&counters.handshakes);
                if self.connector.resumed(&conn) {
                    Counters::inc(&counters.resumed);
                }
                if self.lost {
                    Counters::inc(&counters.reconnects);
                }
                self.lost = false;
                self.generation += 1;
                self.events.push(LinkEvent::Connected {
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
        let generation = self.generation;
        let pipelined = self.answers.is_some();
        // Requests of earlier connections still in flight take their room: the window is the current connection's.
        let mut window = self.connector.window();
        if !pipelined {
            window = window.min(self.outstanding.in_flight() + self.in_flight.room());
        }
        let counters = &self.shared.counters;
        let mut sent = self
            .outstanding
            .send_unsent(generation, window, Instant::now())
            .inspect(|&(_, again)| {
                if again {
                    Counters::inc(&counters.resent_reconnect);
                }
            });
        let failed = if pipelined {
            // All in one hand-over. If it fails the connection is closed, and every order goes again on the next.
            self.connector.queue_orders(conn, &mut sent).is_err()
        } else {
            for (order, _) in sent.by_ref() {
                self.in_flight.push(InFlight {
                    id: order.id,
                    generation,
                    answer: self.connector.send_order(conn, order),
                });
            }
            false
        };
        drop(sent);
        if failed {
            self.drop_connection();
            return;
        }
        self.pubsub.send_unsent(
            &*self.connector,
            conn,
            self.generation,
            &self.shared.counters,
        );
    }

    /// Whether `generation` is the live connection's.
    fn is_current(&self, generation: u64) -> bool {
        generation == self.generation && self.conn.is_some()
    }

    /// The connection has answered something: it works.
    fn proven(&mut self) {
        self.proven = true;
        self.backoff = self.shared.policy.backoff_min;
    }

    fn confirmed(&mut self, channel: u32, generation: u64, result: Result<SubAck, TransportError>) {
        match self.pubsub.confirmed(channel, result) {
            Confirmed::Granted if self.is_current(generation) => self.proven(),
            Confirmed::Failed if self.is_current(generation) => self.drop_connection(),
            _ => {}
        }
    }

    fn accepted(&mut self, id: u64, generation: u64, result: Result<(), TransportError>) {
        match self.pubsub.accepted(id, &result) {
            Acceptance::Accepted(qos) => {
                self.shared.publishing.fetch_sub(1, Ordering::Relaxed);
                self.events.push(LinkEvent::Accepted {
                    device: self.device,
                    id,
                    at: std::time::Instant::now(),
                });
                // A QoS 1 acknowledgement proves the connection; a QoS 0 write does not (nothing came back).
                if qos == QoS::AtLeastOnce && self.is_current(generation) {
                    self.proven();
                }
            }
            Acceptance::Abandoned => {
                self.shared.publishing.fetch_sub(1, Ordering::Relaxed);
            }
            Acceptance::Failed if self.is_current(generation) => self.drop_connection(),
            Acceptance::Failed | Acceptance::Ignored => {}
        }
    }

    /// Report the deliveries taken from the connection, each message once.
    fn report_deliveries(&mut self) {
        for delivery in std::mem::take(&mut self.batch) {
            if self.pubsub.is_new(&delivery) {
                self.events.push(LinkEvent::Delivered {
                    device: self.device,
                    id: delivery.id,
                    at: delivery.at,
                });
            }
        }
    }

    /// The result of order `id`'s request, sent on connection `generation`, taken `at`.
    fn answered(
        &mut self,
        id: OrderId,
        generation: u64,
        result: Result<Answer, TransportError>,
        at: std::time::Instant,
    ) {
        match result {
            Ok(answer) if answer.id() == id => self.answer_at(answer, generation, at),
            // The request failed, or answered another order than the one sent (the connection cannot be
            // trusted): if on the current connection, that connection is broken.
            _ => {
                if self.is_current(generation) {
                    self.drop_connection();
                }
            }
        }
    }

    /// Answers the current (pipelined) connection read.
    fn answer_batch(&mut self, batch: Vec<Answer>) {
        let at = std::time::Instant::now();
        for answer in batch {
            self.answer_at(answer, self.generation, at);
        }
    }

    /// The server's answer to an order, from connection `generation`, taken `at`: reported once.
    fn answer_at(&mut self, answer: Answer, generation: u64, at: std::time::Instant) {
        if self.is_current(generation) {
            self.proven();
        }
        let id = answer.id();
        if !self.outstanding.remove(&id) {
            return; // already reported
        }
        self.answered += 1;
        if let Answer::Stored(id) = answer {
            self.events.push(LinkEvent::Stored {
                device: self.device,
                id,
                at,
            });
        }
    }

    /// Hand the events gathered since the last wait to the workload, in order (one hand-over for all), once the
    /// orders they answer are no longer counted pending.
    fn flush_events(&mut self) {
        if self.answered > 0 {
            let answered = std::mem::take(&mut self.answered);
            self.shared.pending.fetch_sub(answered, Ordering::Relaxed);
        }
        match self.events.len() {
            0 => {}
            1 => {
                let _ = self
                    .shared
                    .events
                    .send(self.events.pop().expect("one event"));
            }
            _ => {
                let _ = self
                    .shared
                    .events
                    .send_all(std::mem::take(&mut self.events));
            }
        }
    }

    /// When the oldest unanswered order on the current connection is due its answer. Until the connection has
    /// answered once, the connect timeout applies instead of the answer timeout: the client's side of a TLS 1.3
    /// handshake finishes before the server's does, and the server may still be working through a crowd of
    /// handshakes; abandoning such a connection after 1 s would only add another handshake to the crowd.
    fn next_deadline(&mut self) -> Option<Instant> {
        let policy = &self.shared.policy;
        let wait = if self.proven {
            policy.answer_timeout
        } else {
            policy.connect_timeout
        };
        self.outstanding.oldest_sent().map(|t| t + wait)
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
        // Answers the connection read before it went still count.
        if let Some(mut answers) = self.answers.take() {
            while let Ok(batch) = answers.try_recv() {
                self.answer_batch(batch);
            }
        }
        // What the connection read before it went is still delivered.
        if let Some(mut rx) = self.pubsub.deliveries.take() {
            while let Ok(d) = rx.try_recv() {
                self.batch.push(d);
            }
            self.report_deliveries();
        }
        let discarded = self.pubsub.connection_lost();
        self.shared
            .publishing
            .fetch_sub(discarded, Ordering::Relaxed);
        if let Some(conn) = self.conn.take() {
            self.connector.close(conn);
            self.lost = true;
            self.events.push(LinkEvent::Lost {
                device: self.device,
                at: std::time::Instant::now(),
            });
            if !self.proven {
                self.back_off();
            }
        }
        self.outstanding.connection_dropped();
    }
}

async fn wait_for(closed: &mut Option<BoxFuture<'static, ()>>) {
    match closed {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// The next batch of a pipelined connection's answers; `None` when the connection's reader has stopped.
async fn next_answers(answers: &mut Option<Answers>) -> Option<Vec<Answer>> {
    match answers {
        Some(a) => a.recv().await,
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
mod tests;
