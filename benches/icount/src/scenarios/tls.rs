//! TLS: one full TLS 1.3 handshake with client certificates, rustls on the suite's counting aws-lc-rs provider.
//!
//! The configurations are the suite's own ([`transport_tls::server_config`], [`ClientTls::config`]): TLS 1.3 only,
//! a client certificate issued by the CA required, no resumption, no tickets. Client and server run in one thread
//! and pass their flights through a `Vec` (no socket). One side is counted per scenario: making its connection,
//! every `read_tls`/`process_new_packets`/`write_tls` of it, and dropping it; the other side runs uncounted.
//!
//! The PKI is fixed: `benches/icount/pki` holds one made by [`transport_tls::write_pki`] and kept (`icount write-pki`
//! makes a new one, which moves the handshake counts). A fresh PKI per run would move them by up to 0.3%: verifying
//! a P-256 signature takes a path that depends on the signature and the key (aws-lc's verification is variable
//! time, as it may be for public data), and the CA's signature on the client certificate is verified in every
//! handshake.
//!
//! What is not fixed: the key shares and the ECDSA nonces come from aws-lc's own random generator, and the client
//! and server randoms from the provider's. Replacing the provider's `SecureRandom` (as rustls's ci-bench does)
//! would fix only the randoms, which are hashed at a fixed cost whatever their value; aws-lc-rs offers no way to
//! seed the generator behind key generation and signing. X25519 and P-256 signing cost the same whatever the
//! secret, but each handshake's CertificateVerify signatures differ, so each side's verification of the other's
//! (and the signature's DER length, 70-72 bytes) varies from one handshake to the next; averaged over the steps
//! this leaves a spread under a tenth of a percent between runs (`docs/performance.md`).

use crate::meter::{Meter, Section};
use anyhow::{ensure, Context};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, HandshakeKind, ServerConfig, ServerConnection};
use std::sync::Arc;
use transport_core::Counters;
use transport_tls::{server_config, ClientTls, DeviceCredentials, SERVER_NAME};

/// The side a scenario counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Server,
    Client,
}

/// A handshake is over in three flights; more means something is wrong.
const MAX_ROUNDS: usize = 6;
const ALPN: &[u8] = b"icount";

/// The kept PKI's files, built into the binary so it runs from anywhere.
const PKI_FILES: [(&str, &[u8]); 4] = [
    (transport_tls::CA_FILE, include_bytes!("../../pki/ca.pem")),
    (
        transport_tls::SERVER_CERT_FILE,
        include_bytes!("../../pki/server.pem"),
    ),
    (
        transport_tls::SERVER_KEY_FILE,
        include_bytes!("../../pki/server.key"),
    ),
    (
        transport_tls::DEVICES_FILE,
        include_bytes!("../../pki/devices.der"),
    ),
];

/// Make a new PKI for the handshake scenarios in `dir` (`benches/icount/pki` to replace the kept one).
pub fn write_pki(dir: &std::path::Path) -> anyhow::Result<()> {
    transport_tls::write_pki(dir, 1)?;
    Ok(())
}

struct Configs {
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    server_counters: Arc<Counters>,
    _pki: tempfile::TempDir,
}

impl Configs {
    fn new() -> anyhow::Result<Configs> {
        let pki = tempfile::tempdir()?;
        for (name, data) in PKI_FILES {
            std::fs::write(pki.path().join(name), data)?;
        }
        let server_counters = Arc::new(Counters::default());
        let server = server_config(pki.path(), server_counters.clone(), &[ALPN])?;
        let credentials = Arc::new(DeviceCredentials::load(pki.path())?);
        let client =
            ClientTls::new(credentials, Arc::new(Counters::default()), &[ALPN])?.config(0)?;
        Ok(Configs {
            server,
            client,
            server_counters,
            _pki: pki,
        })
    }
}

/// One handshake, counting `side`.
fn one_handshake(c: &Configs, s: &mut Section, side: Side) -> anyhow::Result<()> {
    let (count_server, count_client) = (side == Side::Server, side == Side::Client);
    let name = ServerName::try_from(SERVER_NAME)?;
    let mut client = s.measure_if(count_client, || {
        ClientConnection::new(c.client.clone(), name)
    })?;
    let mut server = s.measure_if(count_server, || ServerConnection::new(c.server.clone()))?;
    let mut pipe = Vec::with_capacity(16 * 1024);
    let mut rounds = 0;
    while client.is_handshaking() || server.is_handshaking() {
        rounds += 1;
        ensure!(rounds <= MAX_ROUNDS, "the handshake did not finish");
        pipe.clear();
        s.measure_if(count_client, || client.write_tls(&mut pipe))?;
        s.measure_if(count_server, || -> anyhow::Result<()> {
            let mut rest = pipe.as_slice();
            while !rest.is_empty() {
                server.read_tls(&mut rest)?;
                server.process_new_packets()?;
            }
            Ok(())
        })?;
        pipe.clear();
        s.measure_if(count_server, || server.write_tls(&mut pipe))?;
        s.measure_if(count_client, || -> anyhow::Result<()> {
            let mut rest = pipe.as_slice();
            while !rest.is_empty() {
                client.read_tls(&mut rest)?;
                client.process_new_packets()?;
            }
            Ok(())
        })?;
    }
    ensure!(client.handshake_kind() == Some(HandshakeKind::Full));
    ensure!(server.peer_certificates().is_some_and(|c| !c.is_empty()));
    ensure!(client.alpn_protocol() == Some(ALPN));
    s.measure_if(count_client, || drop(client));
    s.measure_if(count_server, || drop(server));
    Ok(())
}

/// `tls/handshake/rustls/*`.
pub fn handshake(m: &Meter, side: Side) -> anyhow::Result<()> {
    let configs = Configs::new().context("building the PKI and the configurations")?;
    m.run(|_, s| one_handshake(&configs, s, side))?;
    // Each handshake costs the server 2 X25519, 1 signature and 2 verifications (transport_tls's own test).
    let ops = configs.server_counters.snapshot();
    let n = m.steps();
    ensure!(
        (ops.x25519, ops.sign, ops.verify) == (2 * n, n, 2 * n),
        "unexpected asymmetric operations for {n} handshakes: {ops:?}"
    );
    Ok(())
}
