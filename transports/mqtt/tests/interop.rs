//! Interop with real peers from Debian's `mosquitto` and `mosquitto-clients` (mosquitto 2.x):
//!
//! - `mosquitto_pub` and `mosquitto_sub` against the in-tree broker over TLS 1.3 with client certificates: QoS 0
//!   and 1, retained messages, wildcards, a persistent session, `$SYS`; clients without a certificate, with one from
//!   another CA, or claiming another device's name are refused;
//! - the in-tree client against a real mosquitto started by the launcher (generated configuration: TLS 1.3,
//!   `require_certificate true`, loopback only).
//!
//! Without the binaries these tests fail, saying what to install, unless `LB_SKIP_MOSQUITTO=1` is set, in which
//! case they print loudly that they were skipped.

mod common;

use common::{quick_config, recv_within, TestBroker};
use std::num::NonZeroU16;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;
use tokio::process::Command;
use transport_conn::fleet::{ConnFleet, Policy};
use transport_core::Transport;
use transport_core::{Counters, Fleet, LinkEvent, Order, OrderId};
use transport_mqtt::client::{
    connect_packet, connect_tls, ClientError, MqttStream, OrderConnector,
};
use transport_mqtt::codec::{
    ConnectReturnCode, Packet, Publish, QoS, Subscribe, SubscribeReturnCode,
};
use transport_mqtt::mosquitto::{device_pem, find_binary, Mosquitto};
use transport_tls::{ClientTls, DeviceCredentials};

const SECOND: Duration = Duration::from_secs(1);

/// Whether mosquitto and its clients are there (see `common::mosquitto_available`).
fn mosquitto_available(test: &str) -> bool {
    common::mosquitto_available(test, &["mosquitto", "mosquitto_pub", "mosquitto_sub"])
}

/// TLS arguments for a command-line client as device `device` of `b`.
struct Cli {
    ca: PathBuf,
    port: u16,
    dir: PathBuf,
}

impl Cli {
    fn new(identity: &Path, port: u16, dir: &Path) -> Cli {
        Cli {
            ca: identity.join(transport_tls::CA_FILE),
            port,
            dir: dir.to_path_buf(),
        }
    }

    /// `tool` with the connection arguments and, if given, a certificate and key.
    fn command(&self, tool: &str, cert: Option<&(PathBuf, PathBuf)>) -> Command {
        let mut cmd = Command::new(find_binary(tool).unwrap());
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-V",
            "mqttv311",
            "--tls-version",
            "tlsv1.3",
        ]);
        cmd.arg("--cafile").arg(&self.ca);
        if let Some((c, k)) = cert {
            cmd.arg("--cert").arg(c).arg("--key").arg(k);
        }
        cmd.kill_on_drop(true);
        cmd
    }

    fn device(&self, credentials: &DeviceCredentials, device: u32) -> (PathBuf, PathBuf) {
        device_pem(credentials, device, &self.dir, &format!("dev-{device}")).unwrap()
    }
}

async fn run(mut cmd: Command, limit: Duration) -> Output {
    cmd.stdin(std::process::Stdio::null());
    tokio::time::timeout(limit, cmd.output())
        .await
        .expect("client did not finish in time")
        .unwrap()
}

fn lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Publish as device `device` with extra arguments; asserts success.
async fn publish(cli: &Cli, cert: &(PathBuf, PathBuf), device: u32, args: &[&str]) {
    let mut cmd = cli.command("mosquitto_pub", Some(cert));
    cmd.args(["-i", &format!("dev-{device}")]).args(args);
    let out = run(cmd, 10 * SECOND).await;
    assert!(
        out.status.success(),
        "mosquitto_pub {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Wait until the broker holds at least `n` subscriptions (a subscriber started in the background is ready).
async fn wait_subscriptions(b: &TestBroker, n: u64) {
    for _ in 0..200 {
        if b.broker.stats().subscriptions >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("subscriber never subscribed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_clients_exchange_qos0_and_qos1_through_wildcards() {
    if !mosquitto_available("mosquitto_clients_exchange_qos0_and_qos1_through_wildcards") {
        return;
    }
    let b = TestBroker::start(4, quick_config(), false).await;
    let cli = Cli::new(&b.identity(), b.addr.port(), b.dir.path());
    let (publisher, subscriber) = (cli.device(&b.credentials, 0), cli.device(&b.credentials, 1));
    let mut sub = cli.command("mosquitto_sub", Some(&subscriber));
    sub.args([
        "-i", "dev-1", "-q", "1", "-t", "a/+/c", "-t", "b/#", "-v", "-C", "4", "-W", "10",
    ]);
    sub.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let sub = sub.spawn().unwrap();
    wait_subscriptions(&b, 2).await;
    publish(&cli, &publisher, 0, &["-t", "a/x/c", "-m", "m0", "-q", "0"]).await;
    publish(
        &cli,
        &publisher,
        0,
        &["-t", "a/x/d", "-m", "not for the subscriber", "-q", "1"],
    )
    .await;
    publish(&cli, &publisher, 0, &["-t", "a/y/c", "-m", "m1", "-q", "1"]).await;
    publish(&cli, &publisher, 0, &["-t", "b", "-m", "m2", "-q", "1"]).await;
    publish(&cli, &publisher, 0, &["-t", "b/c/d", "-m", "m3", "-q", "0"]).await;
    let out = tokio::time::timeout(10 * SECOND, sub.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lines(&out), ["a/x/c m0", "a/y/c m1", "b m2", "b/c/d m3"]);
    assert!(b.counters.snapshot().handshakes >= 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_messages_reach_later_mosquitto_subscribers() {
    if !mosquitto_available("retained_messages_reach_later_mosquitto_subscribers") {
        return;
    }
    let b = TestBroker::start(4, quick_config(), false).await;
    let cli = Cli::new(&b.identity(), b.addr.port(), b.dir.path());
    let (publisher, subscriber) = (cli.device(&b.credentials, 0), cli.device(&b.credentials, 1));
    publish(
        &cli,
        &publisher,
        0,
        &["-t", "r/1", "-m", "kept", "-q", "1", "-r"],
    )
    .await;
    publish(
        &cli,
        &publisher,
        0,
        &["-t", "r/2", "-m", "also", "-q", "0", "-r"],
    )
    .await;
    let sub = || {
        let mut sub = cli.command("mosquitto_sub", Some(&subscriber));
        sub.args([
            "-i",
            "dev-1",
            "-t",
            "r/#",
            "-v",
            "--retained-only",
            "-W",
            "3",
        ]);
        sub
    };
    let mut got = lines(&run(sub(), 10 * SECOND).await);
    got.sort();
    assert_eq!(got, ["r/1 kept", "r/2 also"]);
    // A zero-length retained message removes it.
    publish(&cli, &publisher, 0, &["-t", "r/1", "-n", "-r"]).await;
    assert_eq!(lines(&run(sub(), 10 * SECOND).await), ["r/2 also"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_mosquitto_session_gets_what_was_published_while_away() {
    if !mosquitto_available("a_persistent_mosquitto_session_gets_what_was_published_while_away") {
        return;
    }
    let b = TestBroker::start(4, quick_config(), false).await;
    let cli = Cli::new(&b.identity(), b.addr.port(), b.dir.path());
    let (publisher, subscriber) = (cli.device(&b.credentials, 0), cli.device(&b.credentials, 2));
    // Subscribe with a persistent session (-c), then leave.
    let mut first = cli.command("mosquitto_sub", Some(&subscriber));
    first.args(["-c", "-i", "dev-2", "-q", "1", "-t", "p/#", "-E"]);
    assert!(run(first, 10 * SECOND).await.status.success());
    assert_eq!(b.broker.stats().sessions, 1);
    for i in 0..3 {
        publish(
            &cli,
            &publisher,
            0,
            &[
                "-t",
                &format!("p/{i}"),
                "-m",
                &format!("while away {i}"),
                "-q",
                "1",
            ],
        )
        .await;
    }
    publish(
        &cli,
        &publisher,
        0,
        &[
            "-t",
            "p/qos0",
            "-m",
            "not kept for an absent client",
            "-q",
            "0",
        ],
    )
    .await;
    let mut back = cli.command("mosquitto_sub", Some(&subscriber));
    back.args([
        "-c", "-i", "dev-2", "-q", "1", "-t", "p/#", "-v", "-C", "3", "-W", "5",
    ]);
    let out = run(back, 10 * SECOND).await;
    assert_eq!(
        lines(&out),
        ["p/0 while away 0", "p/1 while away 1", "p/2 while away 2"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_sub_reads_the_sys_statistics() {
    if !mosquitto_available("mosquitto_sub_reads_the_sys_statistics") {
        return;
    }
    let b = TestBroker::start(4, quick_config(), false).await;
    let cli = Cli::new(&b.identity(), b.addr.port(), b.dir.path());
    let subscriber = cli.device(&b.credentials, 1);
    let mut sub = cli.command("mosquitto_sub", Some(&subscriber));
    sub.args([
        "-i",
        "dev-1",
        "-t",
        "$SYS/broker/clients/connected",
        "-t",
        "$SYS/broker/memory/used",
        "-v",
    ]);
    sub.args(["-C", "4", "-W", "5"]);
    let got = lines(&run(sub, 10 * SECOND).await);
    assert!(
        got.iter().any(|l| l == "$SYS/broker/clients/connected 1"),
        "{got:?}"
    );
    let memory: u64 = got
        .iter()
        .find_map(|l| l.strip_prefix("$SYS/broker/memory/used "))
        .and_then(|v| v.parse().ok())
        .expect("memory/used");
    assert!(memory > 1 << 20, "{memory}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_a_certificate_from_another_ca_or_with_another_name_are_refused() {
    if !mosquitto_available(
        "clients_without_a_certificate_from_another_ca_or_with_another_name_are_refused",
    ) {
        return;
    }
    let b = TestBroker::start(4, quick_config(), false).await;
    let cli = Cli::new(&b.identity(), b.addr.port(), b.dir.path());
    let pub_args = ["-t", "x", "-m", "y", "-q", "1"];

    let mut none = cli.command("mosquitto_pub", None);
    none.args(["-i", "dev-0"]).args(pub_args);
    assert!(
        !run(none, 10 * SECOND).await.status.success(),
        "no certificate"
    );

    let foreign = DeviceCredentials::foreign(&b.identity(), 1).unwrap();
    let foreign_cert = device_pem(&foreign, 0, &b.dir.path().join("foreign"), "dev-0").unwrap();
    let mut other_ca = cli.command("mosquitto_pub", Some(&foreign_cert));
    other_ca.args(["-i", "dev-0"]).args(pub_args);
    assert!(
        !run(other_ca, 10 * SECOND).await.status.success(),
        "certificate from another CA"
    );
    assert!(
        b.counters.snapshot().refused_unknown >= 2,
        "{:?}",
        b.counters.snapshot()
    );

    // A valid certificate for dev-0 claiming to be dev-3: CONNACK 2, identifier rejected.
    let mut impostor = cli.command("mosquitto_pub", Some(&cli.device(&b.credentials, 0)));
    impostor.args(["-i", "dev-3"]).args(pub_args);
    let out = run(impostor, 10 * SECOND).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("identifier rejected"),
        "{out:?}"
    );
    assert_eq!(b.broker.stats().messages_received, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_tree_client_works_against_a_real_mosquitto() {
    if !mosquitto_available("the_in_tree_client_works_against_a_real_mosquitto") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let identity = dir.path().join("id");
    transport_tls::write_pki(&identity, 3).unwrap();
    let m = Mosquitto::start(&identity, 0, &dir.path().join("mosquitto"))
        .await
        .unwrap();
    let conf = std::fs::read_to_string(m.config()).unwrap();
    for line in [
        "tls_version tlsv1.3",
        "require_certificate true",
        &format!("listener {} 127.0.0.1", m.addr().port()),
    ] {
        assert!(
            conf.lines().any(|l| l == line),
            "{line} missing from\n{conf}"
        );
    }
    let credentials = Arc::new(DeviceCredentials::load(&identity).unwrap());
    let tls = ClientTls::new(credentials.clone(), Arc::new(Counters::default()), &[]).unwrap();

    // Subscribe and publish to itself at QoS 1 with a persistent session.
    let mut c = MqttStream::new(connect_tls(m.addr(), tls.config(0).unwrap()).await.unwrap());
    c.connect(connect_packet("dev-0", false, 30)).await.unwrap();
    let pid = |n| NonZeroU16::new(n).unwrap();
    let sub = Subscribe {
        packet_id: pid(1),
        filters: vec![("t/+".into(), QoS::AtLeastOnce)],
    };
    c.send(&Packet::Subscribe(sub)).await.unwrap();
    match recv_within(&mut c, 5 * SECOND).await.unwrap() {
        Packet::SubAck(a) => assert_eq!(
            a.return_codes,
            [SubscribeReturnCode::Granted(QoS::AtLeastOnce)]
        ),
        other => panic!("{other:?}"),
    }
    let message = Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: "t/x".into(),
        packet_id: Some(pid(2)),
        payload: bytes::Bytes::from_static(b"hello mosquitto"),
    };
    c.send(&Packet::Publish(message)).await.unwrap();
    let (mut acked, mut delivered) = (false, false);
    while !(acked && delivered) {
        match recv_within(&mut c, 5 * SECOND).await.unwrap() {
            Packet::PubAck(id) if id == pid(2) => acked = true,
            Packet::Publish(p) => {
                assert_eq!(
                    (p.topic.as_str(), &p.payload[..]),
                    ("t/x", &b"hello mosquitto"[..])
                );
                c.send(&Packet::PubAck(p.packet_id.unwrap())).await.unwrap();
                delivered = true;
            }
            other => panic!("{other:?}"),
        }
    }
    c.send(&Packet::Disconnect).await.unwrap();

    // The fleet's connector: orders are acknowledged (mosquitto received them; it stores nothing).
    let counters = Arc::new(Counters::default());
    let fleet_tls = ClientTls::new(credentials.clone(), counters.clone(), &[]).unwrap();
    let (events, mut rx) = transport_core::events::channel();
    let fleet = ConnFleet::start(
        OrderConnector::new(m.addr(), fleet_tls),
        3,
        events,
        counters.clone(),
        Policy::default(),
    );
    for d in 0..3 {
        for seq in 0..5 {
            fleet.send(
                d,
                Order {
                    id: OrderId {
                        sender: u64::from(d),
                        run: 1,
                        seq,
                    },
                    made_us: 0,
                    payload: vec![1; 8],
                },
            );
        }
    }
    let mut answered = 0;
    while answered < 15 {
        if let LinkEvent::Stored { .. } = tokio::time::timeout(10 * SECOND, rx.recv())
            .await
            .unwrap()
            .unwrap()
        {
            answered += 1;
        }
    }
    fleet.close().await;
    assert_eq!(counters.snapshot().handshakes, 3);

    // mosquitto refuses a certificate from another CA.
    let foreign = Arc::new(DeviceCredentials::foreign(&identity, 1).unwrap());
    let foreign_tls = ClientTls::new(foreign, Arc::new(Counters::default()), &[]).unwrap();
    let foreign_config = foreign_tls.config(0).unwrap();
    let refused = async {
        let mut s = MqttStream::new(connect_tls(m.addr(), foreign_config).await?);
        s.connect(connect_packet("dev-0", true, 30)).await
    };
    let refused: Result<_, ClientError> = tokio::time::timeout(5 * SECOND, refused)
        .await
        .unwrap_or(Err(ClientError::Closed));
    assert!(refused.is_err(), "a foreign certificate was accepted");
    assert!(!matches!(
        refused,
        Err(ClientError::Refused(ConnectReturnCode::Accepted))
    ));
    assert!(m.is_running());
    let pid = m.pid();
    drop(m);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists() || proc_is_zombie(pid),
        "mosquitto outlived its handle"
    );
}

fn proc_is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.contains(") Z "))
        .unwrap_or(true)
}

/// `mqtt@mosquitto` through the `Transport` trait: `serve` starts mosquitto and reports it ready, the fleet's orders
/// are answered, and dropping the server future stops mosquitto.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mosquitto_variant_serves_through_the_trait() {
    if !mosquitto_available("the_mosquitto_variant_serves_through_the_trait") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let identity = dir.path().join("id");
    let t = transport_mqtt::Mqtt::mosquitto();
    assert_eq!(t.spec(), "mqtt@mosquitto");
    assert!(matches!(
        t.capabilities().stored_answers,
        transport_core::Support::No(_)
    ));
    t.prepare(&identity, 2).unwrap();
    let (store, _) =
        transport_store::Store::open(&dir.path().join("store"), transport_store::SyncPolicy::None)
            .unwrap();
    let (ready, ready_rx) = tokio::sync::oneshot::channel();
    let server = tokio::spawn(t.serve(transport_core::ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        identity: identity.clone(),
        store: Arc::new(transport_store::StoreHandle::spawn(store)),
        state_dir: dir.path().join("store"),
        counters: Arc::new(Counters::default()),
        state_syncs: Arc::default(),
        ready,
    }));
    let addr = tokio::time::timeout(15 * SECOND, ready_rx)
        .await
        .unwrap()
        .unwrap()
        .addr;
    let (events, mut rx) = transport_core::events::channel();
    let fleet = t
        .fleet(transport_core::FleetConfig {
            server: addr,
            identity,
            first: 0,
            devices: 2,
            events,
            counters: Arc::new(Counters::default()),
        })
        .await
        .unwrap();
    fleet.send(
        1,
        Order {
            id: OrderId {
                sender: 1,
                run: 1,
                seq: 0,
            },
            made_us: 0,
            payload: vec![],
        },
    );
    loop {
        if let LinkEvent::Stored { device, .. } = tokio::time::timeout(10 * SECOND, rx.recv())
            .await
            .unwrap()
            .unwrap()
        {
            assert_eq!(device, 1);
            break;
        }
    }
    fleet.close().await;
    server.abort();
    let _ = server.await;
    // The launcher's handle was dropped with the server future: nothing listens any more.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "mosquitto outlived the server future"
    );
}
