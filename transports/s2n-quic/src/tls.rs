//! The TLS of both variants: the server's, and the client's per-device endpoint.
//!
//! Both variants use the run's PKI from [`transport_tls`] (CA, server certificate for `localhost`, one client
//! certificate per device) with the same rules: TLS 1.3 only (QUIC allows nothing else), a client certificate
//! issued by the CA required, the server's certificate checked for [`SERVER_NAME`], no session resumption.
//!
//! - **rustls** (`s2n-quic:rustls`): the server and device configurations are [`transport_tls`]'s own (its
//!   counting crypto provider, no session storage, no tickets, resumption disabled), handed to s2n-quic's rustls
//!   provider as they are.
//! - **s2n-tls** (`s2n-quic`): s2n-quic's builders with s2n-quic's default security policy (`default_tls13`), an
//!   empty trust store plus the run's CA (no system certificates), client authentication required, session tickets
//!   off (s2n-tls issues none unless ticket keys are added; they are switched off explicitly anyway). s2n-tls takes
//!   PEM only, so the device credentials (DER in the bundle) are encoded to PEM once per device. On the server,
//!   s2n-tls would match the client certificate's name against the SNI by default; the server accepts any name
//!   from a certificate the CA issued instead, since the name is the device's identity, checked per order.
//!
//! # One endpoint, a certificate per device
//!
//! A fleet has one s2n-quic client endpoint (one UDP socket, one endpoint task), but s2n-quic gives its TLS
//! provider only the server name when it creates a connection's TLS session. [`DeviceTls`] is the client's TLS
//! endpoint: the connector asks for a connection with the server name [`device_server_name`]`(n)`, and
//! [`DeviceTls`] creates the session from device `n`'s own TLS endpoint *with the real server name*
//! ([`SERVER_NAME`]), so what goes on the wire (SNI `localhost`, device `n`'s certificate) is what a client with
//! one endpoint per device would send. Each device's endpoint is built once, at its first connection, and kept.

use base64::Engine as _;
use s2n_codec::EncoderValue;
use s2n_quic::provider::tls::rustls as quic_rustls;
use s2n_quic::provider::tls::s2n_tls as quic_s2n;
use s2n_quic_core::application::ServerName;
use s2n_quic_core::crypto::tls::{ConnectionInfo, Endpoint};
use std::path::Path;
use std::sync::{Arc, Mutex};
use transport_conn::quic::ALPN;
use transport_core::{Counters, TransportError};
use transport_tls::{self as core_tls, ClientTls, DeviceCredentials, SERVER_NAME};

fn s2n_error(what: &str, e: impl std::fmt::Display) -> TransportError {
    TransportError::Config(format!("s2n-tls {what}: {e}"))
}

/// A certificate or key file s2n-tls could not load.
fn s2n_identity_error(what: &str, e: impl std::fmt::Display) -> TransportError {
    TransportError::Identity(format!("s2n-tls {what}: {e}"))
}

fn read_file(dir: &Path, name: &str) -> Result<Vec<u8>, TransportError> {
    let path = dir.join(name);
    std::fs::read(&path).map_err(|e| TransportError::Identity(format!("{}: {e}", path.display())))
}

/// The CA certificate's DER (the trust anchor) from `ca.pem` in `identity`.
pub fn trust_anchor(identity: &Path) -> Result<Vec<u8>, TransportError> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let path = identity.join(core_tls::CA_FILE);
    CertificateDer::from_pem_file(&path)
        .map(|cert| cert.to_vec())
        .map_err(|e| TransportError::Identity(format!("{}: {e}", path.display())))
}

/// PEM text of one DER object.
fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::with_capacity(b64.len() + b64.len() / 64 + 2 * label.len() + 40);
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    for line in b64.as_bytes().chunks(64) {
        // base64 output is ASCII
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

// ---------------------------------------------------------------------------------------------------------------
// Servers
// ---------------------------------------------------------------------------------------------------------------

/// Accepts whatever name a CA-issued client certificate carries: the name is the device's identity, checked
/// against every order's sender by the server, not a host name to match against the SNI.
struct AnyDeviceName;

impl quic_s2n::callbacks::VerifyHostNameCallback for AnyDeviceName {
    fn verify_host_name(&self, _host_name: &str) -> bool {
        true
    }
}

/// The s2n-tls server endpoint from the files in `identity` (see the module docs).
pub fn s2n_tls_server(identity: &Path) -> Result<quic_s2n::Server, TransportError> {
    let cert = read_file(identity, core_tls::SERVER_CERT_FILE)?;
    let key = read_file(identity, core_tls::SERVER_KEY_FILE)?;
    let ca = read_file(identity, core_tls::CA_FILE)?;
    let mut builder = quic_s2n::Server::builder()
        .with_application_protocols([ALPN])
        .map_err(|e| s2n_error("ALPN", e))?;
    let config = builder.config_mut();
    config
        .load_pem(&cert, &key)
        .map_err(|e| s2n_identity_error("server certificate and key", e))?;
    config
        .wipe_trust_store()
        .and_then(|c| c.trust_pem(&ca))
        .map_err(|e| s2n_identity_error("CA certificate", e))?;
    config
        .set_client_auth_type(quic_s2n::enums::ClientAuthType::Required)
        .and_then(|c| c.set_verify_host_callback(AnyDeviceName))
        .and_then(|c| c.enable_session_tickets(false))
        .map_err(|e| s2n_error("configuration", e))?;
    builder.build().map_err(|e| s2n_error("configuration", e))
}

/// The rustls server endpoint: [`transport_tls::server_config`] as it is, counting into `counters`.
pub fn rustls_server(
    identity: &Path,
    counters: Arc<Counters>,
) -> Result<quic_rustls::Server, TransportError> {
    let config = core_tls::server_config(identity, counters, &[ALPN])?;
    Ok(quic_rustls::Server::from(config))
}

// ---------------------------------------------------------------------------------------------------------------
// The client: one TLS endpoint per device behind one s2n-quic endpoint
// ---------------------------------------------------------------------------------------------------------------

const DEVICE_NAME_PREFIX: &str = "device.";

/// The server name the connector gives s2n-quic for device `device`'s connection: it selects the device's TLS
/// endpoint and never reaches the wire (see the module docs).
pub fn device_server_name(device: u32) -> ServerName {
    ServerName::from(format!("{DEVICE_NAME_PREFIX}{device}"))
}

fn device_of(server_name: &str) -> Option<u32> {
    server_name.strip_prefix(DEVICE_NAME_PREFIX)?.parse().ok()
}

/// Builds one device's TLS endpoint.
type BuildDevice<E> = Box<dyn Fn(u32) -> Result<E, TransportError> + Send + Sync>;

/// Every device's TLS endpoint, built at the device's first connection and kept; shared by the connector (which
/// builds a device's endpoint before connecting, so that a bad credential is an error there) and the s2n-quic
/// client endpoint (which creates sessions from it).
pub struct DeviceTable<E> {
    slots: Box<[Mutex<Option<E>>]>,
    build: BuildDevice<E>,
}

impl<E> DeviceTable<E> {
    fn new(devices: u32, build: BuildDevice<E>) -> Self {
        Self {
            slots: (0..devices).map(|_| Mutex::new(None)).collect(),
            build,
        }
    }

    /// Run `f` on device `device`'s endpoint, building it first if needed.
    fn with<T>(&self, device: u32, f: impl FnOnce(&mut E) -> T) -> Result<T, TransportError> {
        let slot = self
            .slots
            .get(device as usize)
            .ok_or_else(|| TransportError::Config(format!("no device {device} in this fleet")))?;
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some((self.build)(device)?);
        }
        match slot.as_mut() {
            Some(endpoint) => Ok(f(endpoint)),
            None => Err(TransportError::Config(format!(
                "device {device} has no TLS endpoint"
            ))),
        }
    }
}

/// What the connector needs of a [`DeviceTable`], whatever its provider.
pub trait PrepareDevice: Send + Sync {
    /// Build device `device`'s TLS endpoint if it is not built yet.
    fn prepare(&self, device: u32) -> Result<(), TransportError>;
}

impl<E: Send> PrepareDevice for DeviceTable<E> {
    fn prepare(&self, device: u32) -> Result<(), TransportError> {
        self.with(device, |_| ())
    }
}

/// The TLS endpoint of a fleet's s2n-quic client endpoint (see the module docs).
pub struct DeviceTls<E> {
    table: Arc<DeviceTable<E>>,
    /// A TLS endpoint with no client certificate, for a server name that names no device (the connector never
    /// asks for one): its handshakes are refused by the server, nothing panics.
    anonymous: E,
}

impl<E: Endpoint> Endpoint for DeviceTls<E> {
    type Session = E::Session;

    fn new_server_session<Params: EncoderValue>(
        &mut self,
        transport_parameters: &Params,
        connection_info: ConnectionInfo,
    ) -> Self::Session {
        // A client endpoint never accepts connections; s2n-quic never calls this on one.
        self.anonymous
            .new_server_session(transport_parameters, connection_info)
    }

    fn new_client_session<Params: EncoderValue>(
        &mut self,
        transport_parameters: &Params,
        server_name: ServerName,
    ) -> Self::Session {
        let real_name = ServerName::from_static(SERVER_NAME);
        if let Some(device) = device_of(&server_name) {
            let session = self.table.with(device, |endpoint| {
                endpoint.new_client_session(transport_parameters, real_name.clone())
            });
            if let Ok(session) = session {
                return session;
            }
        }
        self.anonymous
            .new_client_session(transport_parameters, real_name)
    }

    fn max_tag_length(&self) -> usize {
        self.anonymous.max_tag_length()
    }
}

impl<E: Endpoint> s2n_quic::provider::tls::Provider for DeviceTls<E> {
    type Server = Self;
    type Client = Self;
    type Error = TransportError;

    fn start_server(self) -> Result<Self::Server, Self::Error> {
        Err(TransportError::Unsupported(
            "a fleet's TLS endpoint cannot serve",
        ))
    }

    fn start_client(self) -> Result<Self::Client, Self::Error> {
        Ok(self)
    }
}

/// The client TLS of a fleet with the rustls provider: each device's configuration is [`ClientTls::config`]'s
/// (counting into `counters`).
pub fn rustls_devices(
    identity: &Path,
    credentials: Arc<DeviceCredentials>,
    devices: u32,
    counters: Arc<Counters>,
) -> Result<(DeviceTls<quic_rustls::Client>, Arc<dyn PrepareDevice>), TransportError> {
    let ca = read_file(identity, core_tls::CA_FILE)?;
    let ca = String::from_utf8(ca)
        .map_err(|_| TransportError::Identity(format!("{}: not PEM", core_tls::CA_FILE)))?;
    let rustls_error = |e: &dyn std::fmt::Display| TransportError::Config(format!("rustls: {e}"));
    let anonymous = quic_rustls::Client::builder()
        .with_certificate(ca.as_str())
        .map_err(|e| rustls_error(&e))?
        .with_application_protocols([ALPN].iter())
        .map_err(|e| rustls_error(&e))?
        .build()
        .map_err(|e| rustls_error(&e))?;
    let client_tls = ClientTls::new(credentials, counters, &[ALPN])?;
    let build: BuildDevice<quic_rustls::Client> =
        Box::new(move |device| Ok(quic_rustls::Client::from(client_tls.config(device)?)));
    let table = Arc::new(DeviceTable::new(devices, build));
    Ok((
        DeviceTls {
            table: table.clone(),
            anonymous,
        },
        table,
    ))
}

/// One s2n-tls client endpoint: the run's CA as the only trust anchor, `localhost` checked in the server's
/// certificate (s2n-tls's default host check against the session's server name), and with `identity` (PEM
/// certificate and key) a client certificate.
fn s2n_tls_client(
    ca: &[u8],
    identity: Option<(&str, &str)>,
) -> Result<quic_s2n::Client, TransportError> {
    let mut builder = quic_s2n::Client::builder()
        .with_application_protocols([ALPN])
        .map_err(|e| s2n_error("ALPN", e))?;
    let config = builder.config_mut();
    config
        .wipe_trust_store()
        .and_then(|c| c.trust_pem(ca))
        .map_err(|e| s2n_identity_error("CA certificate", e))?;
    if let Some((cert, key)) = identity {
        config
            .load_pem(cert.as_bytes(), key.as_bytes())
            .and_then(|c| c.set_client_auth_type(quic_s2n::enums::ClientAuthType::Required))
            .map_err(|e| s2n_identity_error("device certificate and key", e))?;
    }
    config
        .enable_session_tickets(false)
        .map_err(|e| s2n_error("configuration", e))?;
    builder.build().map_err(|e| s2n_error("configuration", e))
}

/// The client TLS of a fleet with the s2n-tls provider (see the module docs).
pub fn s2n_tls_devices(
    identity: &Path,
    credentials: Arc<DeviceCredentials>,
    devices: u32,
) -> Result<(DeviceTls<quic_s2n::Client>, Arc<dyn PrepareDevice>), TransportError> {
    let ca = read_file(identity, core_tls::CA_FILE)?;
    let anonymous = s2n_tls_client(&ca, None)?;
    let build: BuildDevice<quic_s2n::Client> = Box::new(move |device| {
        let (cert, key) = credentials.device(device).ok_or_else(|| {
            TransportError::Identity(format!("no credentials for device {device}"))
        })?;
        let cert = pem("CERTIFICATE", cert.as_ref());
        let key = pem("PRIVATE KEY", key.secret_pkcs8_der());
        s2n_tls_client(&ca, Some((&cert, &key)))
    });
    let table = Arc::new(DeviceTable::new(devices, build));
    Ok((
        DeviceTls {
            table: table.clone(),
            anonymous,
        },
        table,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

    #[test]
    fn device_names_round_trip_and_nothing_else_names_a_device() {
        for n in [0, 1, 9_999, u32::MAX] {
            assert_eq!(device_of(&device_server_name(n)), Some(n));
        }
        for name in [
            "localhost",
            "device.",
            "device.x",
            "device.-1",
            "device.4294967296",
            "",
        ] {
            assert_eq!(device_of(name), None, "{name}");
        }
    }

    #[test]
    fn pem_reads_back_as_the_same_der() {
        let dir = tempfile::tempdir().unwrap();
        core_tls::write_pki(dir.path(), 1).unwrap();
        let creds = DeviceCredentials::load(dir.path()).unwrap();
        let (cert, key) = creds.device(0).unwrap();
        let back = CertificateDer::from_pem_slice(pem("CERTIFICATE", &cert).as_bytes()).unwrap();
        assert_eq!(back, cert);
        let back =
            PrivateKeyDer::from_pem_slice(pem("PRIVATE KEY", key.secret_pkcs8_der()).as_bytes())
                .unwrap();
        assert_eq!(back.secret_der(), key.secret_pkcs8_der());
        let ca = CertificateDer::from_pem_file(dir.path().join(core_tls::CA_FILE)).unwrap();
        assert_eq!(trust_anchor(dir.path()).unwrap(), ca.to_vec());
    }

    #[test]
    fn both_providers_build_their_endpoints_and_refuse_a_device_they_do_not_have() {
        let dir = tempfile::tempdir().unwrap();
        core_tls::write_pki(dir.path(), 2).unwrap();
        let creds = Arc::new(DeviceCredentials::load(dir.path()).unwrap());
        let counters = Arc::new(Counters::default());
        s2n_tls_server(dir.path()).unwrap();
        rustls_server(dir.path(), counters.clone()).unwrap();
        let (_, s2n) = s2n_tls_devices(dir.path(), creds.clone(), 2).unwrap();
        let (_, rustls) = rustls_devices(dir.path(), creds.clone(), 2, counters).unwrap();
        for table in [s2n, rustls] {
            table.prepare(1).unwrap();
            assert!(table.prepare(2).is_err());
        }
        // Missing or damaged files are identity errors, not panics.
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            s2n_tls_server(empty.path()),
            Err(TransportError::Identity(_))
        ));
        let key = dir.path().join(core_tls::SERVER_KEY_FILE);
        std::fs::write(
            &key,
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        assert!(matches!(
            s2n_tls_server(dir.path()),
            Err(TransportError::Identity(_))
        ));
        std::fs::write(dir.path().join(core_tls::CA_FILE), b"not a certificate").unwrap();
        assert!(matches!(
            s2n_tls_devices(dir.path(), creds, 1),
            Err(TransportError::Identity(_))
        ));
    }
}
