//! `mqtt-broker`: the in-tree MQTT 3.1.1 broker on its own, over TLS 1.3 with client certificates.
//!
//!     mqtt-broker --identity DIR --prepare 10 --pem-out DIR/pem --store DIR/store   # new PKI, then serve
//!     mqtt-broker --identity DIR --store DIR/store --listen 127.0.0.1:8883 --plaintext 127.0.0.1:1883
//!
//! The identity directory holds `ca.pem`, `server.pem`, `server.key` and `devices.der` as `transport_tls`
//! writes them. Orders published to `orders/<device>` go into the store at `--store` before their PUBACK; persistent
//! sessions are kept in the same directory (`mqtt-sessions.snap`, `mqtt-sessions.log`).

use anyhow::Context;
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::TlsAcceptor;
use transport_core::Counters;
use transport_mqtt::broker::{BrokerConfig, Listener, RunningBroker};
use transport_store::{Store, StoreHandle, SyncPolicy};
use transport_tls as tls;

/// Run the in-tree MQTT broker.
#[derive(Debug, Parser)]
#[command(name = "mqtt-broker")]
struct Opt {
    /// The identity directory: ca.pem, server.pem, server.key.
    #[arg(long)]
    identity: PathBuf,
    /// First write a new PKI into --identity with certificates for this many devices (dev-0, dev-1, ...).
    #[arg(long)]
    prepare: Option<u32>,
    /// Write every device's certificate and key as PEM files (dev-N.crt, dev-N.key) into this directory, for
    /// command-line clients such as mosquitto_pub.
    #[arg(long)]
    pem_out: Option<PathBuf>,
    /// The TLS listener.
    #[arg(long, default_value = "127.0.0.1:8883")]
    listen: SocketAddr,
    /// Also listen without TLS here; clients there are identified by their client id alone.
    #[arg(long)]
    plaintext: Option<SocketAddr>,
    /// The store directory orders are committed to.
    #[arg(long)]
    store: PathBuf,
    /// When the store syncs: none, batch or each.
    #[arg(long, default_value = "batch")]
    sync: SyncPolicy,
    /// Largest packet accepted, in bytes, fixed header included.
    #[arg(long)]
    max_packet_size: Option<usize>,
    /// Connections served at once.
    #[arg(long)]
    max_connections: Option<usize>,
    /// QoS 1 messages in flight to one client.
    #[arg(long)]
    max_inflight: Option<usize>,
    /// QoS 0 messages queued for one client before further ones are dropped.
    #[arg(long)]
    max_queued_qos0: Option<usize>,
    /// QoS 1 messages queued for one session before further ones are dropped.
    #[arg(long)]
    max_queued_qos1: Option<usize>,
    /// Seconds from accepting a connection to its CONNECT (TLS handshake included).
    #[arg(long)]
    connect_timeout: Option<u64>,
    /// Seconds a connected client may stay silent whatever its keepalive (keepalive 0 included).
    #[arg(long)]
    max_idle: Option<u64>,
    /// Seconds between $SYS publications.
    #[arg(long)]
    sys_interval: Option<u64>,
    /// Worker threads of the runtime.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

impl Opt {
    fn config(&self) -> BrokerConfig {
        let mut c = BrokerConfig::default();
        let l = &mut c.limits;
        l.max_inflight = self.max_inflight.unwrap_or(l.max_inflight);
        l.max_queued_qos0 = self.max_queued_qos0.unwrap_or(l.max_queued_qos0);
        l.max_queued_qos1 = self.max_queued_qos1.unwrap_or(l.max_queued_qos1);
        c.max_packet_size = self.max_packet_size.unwrap_or(c.max_packet_size);
        c.max_connections = self.max_connections.unwrap_or(c.max_connections);
        c.connect_timeout = self
            .connect_timeout
            .map(Duration::from_secs)
            .unwrap_or(c.connect_timeout);
        c.max_idle = self.max_idle.map(Duration::from_secs).unwrap_or(c.max_idle);
        c.sys_interval = self
            .sys_interval
            .map(Duration::from_secs)
            .unwrap_or(c.sys_interval);
        c
    }
}

async fn run(opt: Opt) -> anyhow::Result<()> {
    if let Some(devices) = opt.prepare {
        tls::write_pki(&opt.identity, devices).context("writing the PKI")?;
    }
    if let Some(out) = &opt.pem_out {
        let credentials = tls::DeviceCredentials::load(&opt.identity)
            .context("loading the device credentials")?;
        for n in 0..credentials.len() {
            let name = transport_core::device_name(n);
            transport_mqtt::mosquitto::device_pem(&credentials, n, out, &name)
                .with_context(|| format!("writing {name}'s PEM files"))?;
        }
        eprintln!(
            "mqtt-broker: {} device certificates written to {}",
            credentials.len(),
            out.display()
        );
    }
    let counters = Arc::new(Counters::default());
    let server_tls =
        tls::server_config(&opt.identity, counters.clone(), &[]).context("loading the identity")?;
    let (store, _) = Store::open(&opt.store, opt.sync).context("opening the store")?;
    let store = StoreHandle::spawn(store);
    let mut listeners = vec![Listener {
        tcp: tokio::net::TcpListener::bind(opt.listen)
            .await
            .with_context(|| format!("binding {}", opt.listen))?,
        tls: Some(TlsAcceptor::from(server_tls)),
    }];
    eprintln!("mqtt-broker: TLS 1.3 on {}", listeners[0].tcp.local_addr()?);
    if let Some(addr) = opt.plaintext {
        let tcp = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        eprintln!("mqtt-broker: plaintext on {}", tcp.local_addr()?);
        listeners.push(Listener { tcp, tls: None });
    }
    let mut config = opt.config();
    config.state_dir = Some(opt.store.clone());
    let broker = RunningBroker::new(config, Arc::new(store.clone()), counters)
        .context("restoring the persistent sessions")?;
    if let Some(r) = broker.recovery() {
        eprintln!(
            "mqtt-broker: sessions restored from {} ({} snapshot and {} journal records, {} torn bytes cut)",
            opt.store.display(),
            r.snapshot_records,
            r.journal_records,
            r.truncated_bytes
        );
    }
    tokio::select! {
        result = broker.clone().run(listeners) => result?,
        _ = tokio::signal::ctrl_c() => eprintln!("mqtt-broker: stopping"),
    }
    broker.close().await;
    store.close().await;
    Ok(())
}

fn main() {
    let opt = Opt::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(opt.threads.max(1))
        .enable_all()
        .build();
    let result = runtime
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run(opt)));
    if let Err(e) = result {
        eprintln!("mqtt-broker: {e:#}");
        std::process::exit(1);
    }
}
