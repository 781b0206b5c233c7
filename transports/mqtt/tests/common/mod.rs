//! What the integration tests share: a broker on 127.0.0.1 port 0 with a fresh PKI and store, and TLS clients.
#![allow(dead_code)]

pub mod process;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsAcceptor;
use transport_core::Counters;
use transport_mqtt::broker::{BrokerConfig, Listener, RunningBroker};
use transport_mqtt::client::{connect_packet, connect_tls, ClientError, MqttStream};
use transport_mqtt::codec::Packet;
use transport_store::{Store, StoreHandle, SyncPolicy};
use transport_tls::{self as tls, ClientTls, DeviceCredentials};

pub type Tls = MqttStream<TlsStream<TcpStream>>;

/// A broker serving in this process until dropped.
pub struct TestBroker {
    pub addr: SocketAddr,
    pub plain: Option<SocketAddr>,
    pub dir: tempfile::TempDir,
    pub counters: Arc<Counters>,
    pub broker: RunningBroker,
    pub store: StoreHandle,
    pub credentials: Arc<DeviceCredentials>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestBroker {
    /// A broker with a PKI for `devices` devices, its store synced never (tests check order, not durability).
    pub async fn start(devices: u32, config: BrokerConfig, plaintext: bool) -> TestBroker {
        let dir = tempfile::tempdir().unwrap();
        let identity = dir.path().join("id");
        tls::write_pki(&identity, devices).unwrap();
        let counters = Arc::new(Counters::default());
        let (store, _) = Store::open(&dir.path().join("store"), SyncPolicy::None).unwrap();
        let store = StoreHandle::spawn(store);
        let server_tls = tls::server_config(&identity, counters.clone(), &[]).unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let mut listeners = vec![Listener {
            tcp,
            tls: Some(TlsAcceptor::from(server_tls)),
        }];
        let mut plain = None;
        if plaintext {
            let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
            plain = Some(tcp.local_addr().unwrap());
            listeners.push(Listener { tcp, tls: None });
        }
        let config = BrokerConfig {
            state_dir: config.state_dir.or(Some(dir.path().join("store"))),
            ..config
        };
        let broker = RunningBroker::new(config, Arc::new(store.clone()), counters.clone()).unwrap();
        let run = broker.clone().run(listeners);
        let task = tokio::spawn(async move {
            if let Err(e) = run.await {
                panic!("broker stopped: {e}");
            }
        });
        let credentials = Arc::new(DeviceCredentials::load(&identity).unwrap());
        TestBroker {
            addr,
            plain,
            dir,
            counters,
            broker,
            store,
            credentials,
            task,
        }
    }

    pub fn identity(&self) -> PathBuf {
        self.dir.path().join("id")
    }

    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// A TLS connection as device `device`, before CONNECT.
    pub async fn tls(&self, device: u32) -> Tls {
        let client =
            ClientTls::new(self.credentials.clone(), Arc::new(Counters::default()), &[]).unwrap();
        MqttStream::new(
            connect_tls(self.addr, client.config(device).unwrap())
                .await
                .unwrap(),
        )
    }

    /// Device `device` connected with its own name as client id.
    pub async fn connected(&self, device: u32, clean: bool, keep_alive: u16) -> Tls {
        let mut s = self.tls(device).await;
        s.connect(connect_packet(
            &transport_core::device_name(device),
            clean,
            keep_alive,
        ))
        .await
        .unwrap();
        s
    }
}

/// The settings the tests use: short timeouts so a silent client is dropped quickly.
pub fn quick_config() -> BrokerConfig {
    BrokerConfig {
        connect_timeout: Duration::from_secs(1),
        max_packet_size: 64 * 1024,
        sys_interval: Duration::from_millis(200),
        ..BrokerConfig::default()
    }
}

/// The next packet, or an error, within `limit`.
pub async fn recv_within<S>(s: &mut MqttStream<S>, limit: Duration) -> Result<Packet, ClientError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    tokio::time::timeout(limit, s.recv())
        .await
        .unwrap_or_else(|_| Err(ClientError::Unexpected(format!("nothing within {limit:?}"))))
}

/// Whether the server closes the connection within `limit` (packets before the close are skipped).
pub async fn closed_within<S>(s: &mut MqttStream<S>, limit: Duration) -> bool
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, s.recv()).await {
            Err(_) => return false,
            Ok(Ok(_)) => continue,
            Ok(Err(_)) => return true,
        }
    }
}

/// Whether the mosquitto `binaries` are installed; without them, fail saying what to install, unless
/// `LB_SKIP_MOSQUITTO=1` asks to skip, in which case say loudly that `test` was skipped.
pub fn mosquitto_available(test: &str, binaries: &[&str]) -> bool {
    use transport_mqtt::mosquitto::{find_binary, INSTALL_HINT};
    let missing: Vec<&str> = binaries
        .iter()
        .copied()
        .filter(|b| find_binary(b).is_none())
        .collect();
    if missing.is_empty() {
        return true;
    }
    if std::env::var("LB_SKIP_MOSQUITTO").as_deref() == Ok("1") {
        // Written to the stream itself, not through eprintln!, so the test harness does not hide it.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "\n!!!!! SKIPPED {test}: {} not installed (LB_SKIP_MOSQUITTO=1) !!!!!\n",
            missing.join(", ")
        );
        return false;
    }
    panic!(
        "{} not found: {INSTALL_HINT} (or set LB_SKIP_MOSQUITTO=1 to skip these tests)",
        missing.join(", ")
    );
}
