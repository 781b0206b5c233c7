//! The PKI and the rustls configuration every TLS transport shares (quinn, s2n-quic with rustls, MQTT over TLS 1.3).
//!
//! - [`write_pki`] makes a CA (ECDSA P-256), a server certificate for [`SERVER_NAME`] and 127.0.0.1, and one client
//!   certificate per device whose common name is [`device_name`]; all signed by the CA.
//! - [`server_config`] and [`ClientTls::config`] build TLS 1.3 configurations with client certificates required on
//!   both ends, no session resumption (every connection is a full handshake), and a crypto provider that counts the
//!   asymmetric operations it actually performs into a [`Counters`].
//! - [`resuming_server_config`] and [`ClientTls::resuming`] are the same with TLS 1.3 session resumption: tickets
//!   sealed under a key derived from the server's key file ([`tickets`]), so they outlive a restart, and one session
//!   cache per device.
//! - [`peer_device`] reads the common name of a verified peer certificate: the device's identity on the server.
//! - [`server_fingerprint`] is what a server reports as its public key; [`server_secret`] derives keys from the
//!   server's key file that every start of the server shares (stateless resets after a restart).
//!
//! # What is counted, and where
//!
//! The counting provider wraps aws-lc-rs's provider at the three places where asymmetric operations happen:
//!
//! - key exchange groups: `start` (ephemeral key generation, one scalar multiplication) and `complete` (agreement,
//!   one more) each count one [`Counters::x25519`] or, for the NIST curves, one [`Counters::ecdh`];
//! - every signature verification algorithm: each call counts one [`Counters::verify`]. This covers both the
//!   certificate chain (one verification per certificate whose signature is checked; the trust anchor's own signature
//!   is never checked) and the peer's `CertificateVerify`. Only what webpki really verifies is counted: a certificate
//!   from an unknown CA is refused before any signature is checked;
//! - our own signing key: each signature made counts one [`Counters::sign`].
//!
//! A full TLS 1.3 handshake with client certificates issued directly by the CA therefore costs each side 2 X25519,
//! 1 signature and 2 verifications (see the test `one_handshake_counts_exactly`). Completed handshakes are counted
//! by the transport, which sees them.
//!
//! The key exchange groups offered are X25519, then P-256 and P-384; the post-quantum hybrids are left out so the
//! counts stay comparable across builds whatever rustls features other crates switch on. A [`TlsCrypto`] other than
//! the default offers P-256 alone, with aws-lc-rs's assembly or with RustCrypto's portable `p256` doing every P-256
//! operation ([`rustcrypto`]); the counting is the same for each.
//!
//! # Files
//!
//! | file | content |
//! |---|---|
//! | `ca.pem` | the CA certificate (PEM) |
//! | `server.pem` | the server certificate (PEM), issued by the CA |
//! | `server.key` | the server's PKCS#8 private key (PEM), mode 0600 |
//! | `devices.der` | every device's certificate and PKCS#8 key in one file, mode 0600 (layout below) |
//!
//! `devices.der`: the magic `LBDEVS1\n`, the device count (u32, big-endian), then per device in order
//! `cert_len (u32) | cert DER | key_len (u32) | key DER (PKCS#8)`, then a CRC-32 of everything before it (u32).
//! One file loads 10,000 identities in a few milliseconds; keys are parsed only when a device's config is built.

mod counting;
pub mod rustcrypto;
pub mod tickets;

pub use counting::{asym_costs, counting_provider, counting_provider_for, TlsCrypto};
pub use tickets::TicketKey;

use ::aws_lc_rs::{digest, hkdf};
use counting::counting_key;
use rustls::client::danger::ServerCertVerifier;
use rustls::client::{
    ClientSessionMemoryCache, ClientSessionStore, Resumption, WebPkiServerVerifier,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use transport_core::Counters;
use transport_core::TransportError;
use transport_core::{device_name, keys};

/// The name the server certificate is issued for, and the name every client checks (whatever address it dials).
pub const SERVER_NAME: &str = "localhost";
/// The CA certificate.
pub const CA_FILE: &str = "ca.pem";
/// The server certificate.
pub const SERVER_CERT_FILE: &str = "server.pem";
/// The server's private key (mode 0600).
pub const SERVER_KEY_FILE: &str = "server.key";
/// Every device's certificate and key (mode 0600).
pub const DEVICES_FILE: &str = "devices.der";

const DEVICES_MAGIC: &[u8; 8] = b"LBDEVS1\n";

fn identity_error(what: impl fmt::Display) -> TransportError {
    TransportError::Identity(what.to_string())
}

// ---------------------------------------------------------------------------------------------------------------
// Writing the PKI
// ---------------------------------------------------------------------------------------------------------------

/// A certificate authority held in memory, able to issue certificates: its self-signed certificate, and the
/// name, key usages and key that sign.
struct Authority(rcgen::CertifiedIssuer<'static, rcgen::KeyPair>);

impl Authority {
    fn new(name: &str) -> Result<Self, TransportError> {
        let key =
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(identity_error)?;
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        Ok(Self(
            rcgen::CertifiedIssuer::self_signed(params, key).map_err(identity_error)?,
        ))
    }

    /// Issue a certificate for `common_name` (client) or for the server names (server).
    fn issue(
        &self,
        common_name: &str,
        server: bool,
    ) -> Result<(rcgen::Certificate, rcgen::KeyPair), TransportError> {
        let key =
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(identity_error)?;
        let names = if server {
            vec![SERVER_NAME.to_string(), "127.0.0.1".to_string()]
        } else {
            Vec::new()
        };
        let mut params = rcgen::CertificateParams::new(names).map_err(identity_error)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![if server {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        }];
        let cert = params.signed_by(&key, &self.0).map_err(identity_error)?;
        Ok((cert, key))
    }

    /// The device bundle (layout in the module docs) for devices `0..devices`.
    fn device_bundle(&self, devices: u32) -> Result<Vec<u8>, TransportError> {
        let devices = (0..devices)
            .map(|n| {
                let (cert, key) = self.issue(&device_name(n), false)?;
                Ok((cert.der().to_vec(), key.serialize_der()))
            })
            .collect::<Result<Vec<_>, TransportError>>()?;
        encode_bundle(devices.iter().map(|(c, k)| (c.as_slice(), k.as_slice())))
    }
}

/// A device bundle (layout in the module docs) of these (certificate, PKCS#8 key) pairs, in order.
fn encode_bundle<'a>(
    devices: impl ExactSizeIterator<Item = (&'a [u8], &'a [u8])>,
) -> Result<Vec<u8>, TransportError> {
    let count = u32::try_from(devices.len()).map_err(identity_error)?;
    let mut out = Vec::with_capacity(16 + devices.len() * 700);
    out.extend_from_slice(DEVICES_MAGIC);
    out.extend_from_slice(&count.to_be_bytes());
    for (cert, key) in devices {
        for part in [cert, key] {
            let len = u32::try_from(part.len()).map_err(identity_error)?;
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(part);
        }
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    Ok(out)
}

/// Give device `device` of the run in `from` an identity directory `to` of its own: the CA certificate (public) and
/// a bundle holding only that device's certificate and key, as device 0. What a device enrolled by the operator
/// holds, and nothing of the other devices (the adversary's own valid identity is made this way).
pub fn extract_device(from: &Path, device: u32, to: &Path) -> Result<(), TransportError> {
    let all = DeviceCredentials::load(from)?;
    let (cert, key) = all.device(device).ok_or_else(|| {
        identity_error(format!(
            "{} has no device {device} ({} devices)",
            from.display(),
            all.len()
        ))
    })?;
    std::fs::create_dir_all(to)?;
    let ca = std::fs::read(from.join(CA_FILE))?;
    write_file(&to.join(CA_FILE), &ca, false)?;
    let bundle = encode_bundle(std::iter::once((cert.as_ref(), key.secret_pkcs8_der())))?;
    write_file(&to.join(DEVICES_FILE), &bundle, true)
}

/// Write a file whole (mode 0600 for secrets), never through a planted symlink ([`keys::write_atomic`]).
fn write_file(path: &Path, data: &[u8], secret: bool) -> Result<(), TransportError> {
    keys::write_atomic(path, data, if secret { 0o600 } else { 0o644 })
        .map_err(|e| TransportError::Identity(e.to_string()))
}

/// Generate the PKI of a run into `dir`: the CA, the server's certificate and key, and the credentials of devices
/// `0..devices` (see the module docs for the files). Existing files are replaced.
pub fn write_pki(dir: &Path, devices: u32) -> Result<(), TransportError> {
    std::fs::create_dir_all(dir)?;
    let ca = Authority::new("lb-bench CA")?;
    let (server_cert, server_key) = ca.issue(SERVER_NAME, true)?;
    write_file(&dir.join(CA_FILE), ca.0.pem().as_bytes(), false)?;
    write_file(
        &dir.join(SERVER_CERT_FILE),
        server_cert.pem().as_bytes(),
        false,
    )?;
    write_file(
        &dir.join(SERVER_KEY_FILE),
        server_key.serialize_pem().as_bytes(),
        true,
    )?;
    write_file(&dir.join(DEVICES_FILE), &ca.device_bundle(devices)?, true)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------------------------

fn load_roots(dir: &Path) -> Result<Arc<RootCertStore>, TransportError> {
    let path = dir.join(CA_FILE);
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&path)
        .map_err(|e| identity_error(format!("{}: {e}", path.display())))?
    {
        let cert = cert.map_err(|e| identity_error(format!("{}: {e}", path.display())))?;
        roots
            .add(cert)
            .map_err(|e| identity_error(format!("{}: {e}", path.display())))?;
    }
    if roots.is_empty() {
        return Err(identity_error(format!(
            "{}: no certificate",
            path.display()
        )));
    }
    Ok(Arc::new(roots))
}

/// Where one device's certificate and key lie in the bundle.
#[derive(Debug, Clone, Copy)]
struct Entry {
    cert: (u32, u32),
    key: (u32, u32),
}

/// The credentials of every device of a run, loaded once from one file; configs are built from them per device.
pub struct DeviceCredentials {
    roots: Arc<RootCertStore>,
    bundle: Vec<u8>,
    entries: Vec<Entry>,
}

impl fmt::Debug for DeviceCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceCredentials")
            .field("devices", &self.entries.len())
            .finish_non_exhaustive()
    }
}

impl DeviceCredentials {
    /// Load `ca.pem` and `devices.der` from `dir`.
    pub fn load(dir: &Path) -> Result<Self, TransportError> {
        let roots = load_roots(dir)?;
        let path = dir.join(DEVICES_FILE);
        let bundle = std::fs::read(&path)?;
        let entries = parse_bundle(&bundle)
            .map_err(|e| identity_error(format!("{}: {e}", path.display())))?;
        Ok(Self {
            roots,
            bundle,
            entries,
        })
    }

    /// [`load`](Self::load), and require credentials for at least `devices` devices (a fleet's size).
    pub fn load_for(dir: &Path, devices: u32) -> Result<Self, TransportError> {
        let credentials = Self::load(dir)?;
        if credentials.len() < devices {
            return Err(identity_error(format!(
                "{} has credentials for {} devices, {devices} asked for",
                dir.display(),
                credentials.len(),
            )));
        }
        Ok(credentials)
    }

    /// Credentials for `devices` devices whose certificates come from a CA made here and never written anywhere,
    /// which the server does not know; they trust the real CA in `dir`. For tests that a foreign device is refused.
    pub fn foreign(dir: &Path, devices: u32) -> Result<Self, TransportError> {
        let roots = load_roots(dir)?;
        let bundle = Authority::new("foreign CA")?.device_bundle(devices)?;
        let entries = parse_bundle(&bundle).map_err(identity_error)?;
        Ok(Self {
            roots,
            bundle,
            entries,
        })
    }

    /// How many devices the credentials cover.
    pub fn len(&self) -> u32 {
        self.entries.len() as u32
    }

    /// Whether there are no devices.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Device `n`'s certificate and private key.
    pub fn device(&self, n: u32) -> Option<(CertificateDer<'_>, PrivatePkcs8KeyDer<'_>)> {
        let e = self.entries.get(n as usize)?;
        let slice =
            |(at, len): (u32, u32)| self.bundle.get(at as usize..(at as usize + len as usize));
        Some((
            CertificateDer::from(slice(e.cert)?),
            PrivatePkcs8KeyDer::from(slice(e.key)?),
        ))
    }
}

/// Check the bundle's magic, count, lengths and checksum; return where each device's parts lie.
fn parse_bundle(data: &[u8]) -> Result<Vec<Entry>, &'static str> {
    let body_len = data.len().checked_sub(4).ok_or("truncated")?;
    let (body, crc) = data.split_at(body_len);
    if crc32fast::hash(body).to_be_bytes() != crc {
        return Err("checksum mismatch (truncated or corrupted)");
    }
    let rest = body
        .strip_prefix(DEVICES_MAGIC.as_slice())
        .ok_or("not a device bundle")?;
    let (count, mut rest) = rest.split_first_chunk::<4>().ok_or("truncated")?;
    let count = u32::from_be_bytes(*count);
    let mut entries = Vec::with_capacity((count as usize).min(rest.len() / 8));
    let take = |rest: &mut &[u8]| -> Result<(u32, u32), &'static str> {
        let (len, tail) = rest.split_first_chunk::<4>().ok_or("truncated")?;
        let len = u32::from_be_bytes(*len);
        if tail.len() < len as usize {
            return Err("truncated");
        }
        let at = (body.len() - tail.len()) as u32;
        *rest = &tail[len as usize..];
        Ok((at, len))
    };
    for _ in 0..count {
        let cert = take(&mut rest)?;
        let key = take(&mut rest)?;
        entries.push(Entry { cert, key });
    }
    if !rest.is_empty() {
        return Err("trailing bytes");
    }
    Ok(entries)
}

// ---------------------------------------------------------------------------------------------------------------
// What the server's files give a restarted server
// ---------------------------------------------------------------------------------------------------------------

/// The SHA-256 fingerprint (hex) of the server certificate in `dir`: what a TLS server reports as its public key
/// when it is ready.
pub fn server_fingerprint(dir: &Path) -> Result<String, TransportError> {
    let path = dir.join(SERVER_CERT_FILE);
    let cert = CertificateDer::from_pem_file(&path)
        .map_err(|e| identity_error(format!("{}: {e}", path.display())))?;
    Ok(hex::encode(digest::digest(&digest::SHA256, cert.as_ref())))
}

/// A secret derived from the server's private key in `dir` ([`derive_secret`]): the same for every start of a
/// server with the same key file, so that a restarted server recognises its predecessor's connections (the keys of
/// stateless resets and connection ids).
pub fn server_secret(dir: &Path, salt: &[u8], label: &[u8]) -> Result<[u8; 32], TransportError> {
    let path = dir.join(SERVER_KEY_FILE);
    let key = PrivateKeyDer::from_pem_file(&path)
        .map_err(|e| identity_error(format!("{}: {e}", path.display())))?;
    derive_secret(key.secret_der(), salt, label)
}

/// HKDF-SHA256 of `secret`: `salt` names who derives (a transport), `label` what the secret is for, so no two uses
/// share a key. A shorter key is a prefix of this one (HKDF's output is).
pub fn derive_secret(secret: &[u8], salt: &[u8], label: &[u8]) -> Result<[u8; 32], TransportError> {
    let failed = |_| identity_error("key derivation failed");
    let mut out = [0; 32];
    hkdf::Salt::new(hkdf::HKDF_SHA256, salt)
        .extract(secret)
        .expand(&[label], hkdf::HKDF_SHA256)
        .map_err(failed)?
        .fill(&mut out)
        .map_err(failed)?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------------------------------
// Configurations
// ---------------------------------------------------------------------------------------------------------------

/// The server's TLS configuration from the files in `dir`: TLS 1.3 only, a client certificate issued by the CA in
/// `ca.pem` required, no session resumption or tickets, asymmetric operations counted into `counters`.
pub fn server_config(
    dir: &Path,
    counters: Arc<Counters>,
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, TransportError> {
    server_config_with(dir, counters, alpn, TlsCrypto::Default)
}

/// [`server_config`] with the key exchange groups and P-256 arithmetic `crypto` names.
pub fn server_config_with(
    dir: &Path,
    counters: Arc<Counters>,
    alpn: &[&[u8]],
    crypto: TlsCrypto,
) -> Result<Arc<ServerConfig>, TransportError> {
    build_server_config(dir, counters, alpn, crypto, None)
}

/// How many tickets a server sends after each handshake (rustls's default): a device keeps a spare if one
/// resumption attempt is lost.
pub const TICKETS_PER_HANDSHAKE: usize = 2;

/// [`server_config_with`] with TLS 1.3 session resumption: after each handshake the server sends
/// [`TICKETS_PER_HANDSHAKE`] tickets sealed by the [`TicketKey`] derived from its key file, and accepts them in any
/// later start of the server with the same key file (no 0-RTT: early data stays off).
pub fn resuming_server_config(
    dir: &Path,
    counters: Arc<Counters>,
    alpn: &[&[u8]],
    crypto: TlsCrypto,
) -> Result<Arc<ServerConfig>, TransportError> {
    let tickets = Arc::new(TicketKey::derive(dir)?);
    build_server_config(dir, counters, alpn, crypto, Some(tickets))
}

fn build_server_config(
    dir: &Path,
    counters: Arc<Counters>,
    alpn: &[&[u8]],
    crypto: TlsCrypto,
    tickets: Option<Arc<TicketKey>>,
) -> Result<Arc<ServerConfig>, TransportError> {
    let provider = counting_provider_for(&counters, crypto);
    let roots = load_roots(dir)?;
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(identity_error)?;
    let cert_path = dir.join(SERVER_CERT_FILE);
    let certs = CertificateDer::pem_file_iter(&cert_path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| identity_error(format!("{}: {e}", cert_path.display())))?;
    if certs.is_empty() {
        return Err(identity_error(format!(
            "{}: no certificate",
            cert_path.display()
        )));
    }
    let key_path = dir.join(SERVER_KEY_FILE);
    let key = PrivateKeyDer::from_pem_file(&key_path)
        .map_err(|e| identity_error(format!("{}: {e}", key_path.display())))?;
    let certified = CertifiedKey::new(certs, counting_key(&provider, key, &counters)?);
    certified
        .keys_match()
        .map_err(|e| identity_error(format!("{}: {e}", key_path.display())))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TransportError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    // No session cache: a restart would empty it. Without tickets every connection is a full handshake.
    config.session_storage = Arc::new(NoServerSessionStorage {});
    match tickets {
        Some(tickets) => {
            config.ticketer = tickets;
            config.send_tls13_tickets = TICKETS_PER_HANDSHAKE;
        }
        None => config.send_tls13_tickets = 0,
    }
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Builds the client configurations of a fleet's devices: the provider and the server verifier are made once and
/// shared; each device's config carries its own certificate and key.
pub struct ClientTls {
    credentials: Arc<DeviceCredentials>,
    provider: Arc<CryptoProvider>,
    verifier: Arc<dyn ServerCertVerifier>,
    counters: Arc<Counters>,
    alpn: Vec<Vec<u8>>,
    /// With resumption, each device's configuration (its session cache inside), built once and kept: rustls
    /// offers a ticket only from a configuration with the same certificate resolver it was issued to.
    resuming: Option<Box<[OnceLock<Arc<ClientConfig>>]>>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Prepare to build device configs that verify the server against the credentials' CA and count into
    /// `counters`.
    pub fn new(
        credentials: Arc<DeviceCredentials>,
        counters: Arc<Counters>,
        alpn: &[&[u8]],
    ) -> Result<Self, TransportError> {
        Self::with_crypto(credentials, counters, alpn, TlsCrypto::Default)
    }

    /// [`new`](Self::new) with the key exchange groups and P-256 arithmetic `crypto` names.
    pub fn with_crypto(
        credentials: Arc<DeviceCredentials>,
        counters: Arc<Counters>,
        alpn: &[&[u8]],
        crypto: TlsCrypto,
    ) -> Result<Self, TransportError> {
        let provider = counting_provider_for(&counters, crypto);
        let verifier = WebPkiServerVerifier::builder_with_provider(
            credentials.roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(identity_error)?;
        Ok(Self {
            credentials,
            provider,
            verifier,
            counters,
            alpn: alpn.iter().map(|p| p.to_vec()).collect(),
            resuming: None,
        })
    }

    /// The same, with TLS 1.3 session resumption: each device keeps the tickets a server sent it in a session cache
    /// of its own (never shared with another device, whose certificate the ticket does not carry), and offers one
    /// when it connects again, with `psk_dhe_ke` (rustls's only mode): a fresh X25519, no certificate, no signature.
    pub fn resuming(mut self) -> Self {
        self.resuming = Some(
            (0..self.credentials.len())
                .map(|_| OnceLock::new())
                .collect(),
        );
        self
    }

    /// Whether the devices' configurations resume sessions.
    pub fn resumes(&self) -> bool {
        self.resuming.is_some()
    }

    /// How many devices there are credentials for.
    pub fn devices(&self) -> u32 {
        self.credentials.len()
    }

    /// Device `device`'s configuration: TLS 1.3 only, its own certificate, the server verified against the CA (for
    /// the name [`SERVER_NAME`]); no resumption unless [`resuming`](Self::resuming), then the device's own cache.
    pub fn config(&self, device: u32) -> Result<Arc<ClientConfig>, TransportError> {
        let Some(kept) = self.resuming.as_ref() else {
            return self.build(device, Resumption::disabled());
        };
        let slot = kept
            .get(device as usize)
            .ok_or_else(|| identity_error(format!("no credentials for device {device}")))?;
        if let Some(config) = slot.get() {
            return Ok(config.clone());
        }
        // One server name: the cache holds its tickets (rustls keeps a few per name).
        let cache: Arc<dyn ClientSessionStore> = Arc::new(ClientSessionMemoryCache::new(1));
        let config = self.build(device, Resumption::store(cache))?;
        Ok(slot.get_or_init(|| config).clone())
    }

    fn build(
        &self,
        device: u32,
        resumption: Resumption,
    ) -> Result<Arc<ClientConfig>, TransportError> {
        let (cert, key) = self
            .credentials
            .device(device)
            .ok_or_else(|| identity_error(format!("no credentials for device {device}")))?;
        let key = counting_key(
            &self.provider,
            PrivateKeyDer::Pkcs8(key.clone_key()),
            &self.counters,
        )?;
        let certified = CertifiedKey::new(vec![cert.into_owned()], key);
        let mut config = ClientConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TransportError::Config(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(self.verifier.clone())
            .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
        config.resumption = resumption;
        config.alpn_protocols = self.alpn.clone();
        Ok(Arc::new(config))
    }
}

/// Device `device`'s client configuration (see [`ClientTls::config`]); building many, use one [`ClientTls`].
pub fn client_config(
    credentials: Arc<DeviceCredentials>,
    device: u32,
    counters: Arc<Counters>,
    alpn: &[&[u8]],
) -> Result<Arc<ClientConfig>, TransportError> {
    ClientTls::new(credentials, counters, alpn)?.config(device)
}

// ---------------------------------------------------------------------------------------------------------------
// The peer's identity
// ---------------------------------------------------------------------------------------------------------------

/// The device a verified peer chain names: the common name of its first (end-entity) certificate, if it is a
/// device's name as [`device_name`] writes it (`dev-N`). Only those names map one-to-one onto sender numbers
/// (`dev-N` is sender `N`); [`transport_core::sender_id`] hashes any other name, and two hashed names could share one
/// number in the store's exactly-once key, each seeing the other's orders as already applied. `None` for any other
/// name, no certificate, or no readable common name: the servers refuse such a peer as having no identity.
pub fn peer_device(certs: &[CertificateDer<'_>]) -> Option<String> {
    let name = common_name(certs.first()?.as_ref())?;
    let n = name.strip_prefix("dev-")?.parse::<u32>().ok()?;
    (device_name(n) == name).then_some(name)
}

/// One DER element: (tag, contents, rest). Definite lengths only, at most four length bytes.
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        first as usize
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, tail) = rest.split_at(n);
        rest = tail;
        bytes.iter().fold(0usize, |len, &b| len << 8 | b as usize)
    };
    if rest.len() < len {
        return None;
    }
    let (contents, rest) = rest.split_at(len);
    Some((tag, contents, rest))
}

/// The subject's common name of a DER certificate.
fn common_name(cert: &[u8]) -> Option<String> {
    const SEQUENCE: u8 = 0x30;
    const SET: u8 = 0x31;
    const CN_OID: &[u8] = &[0x55, 0x04, 0x03]; // 2.5.4.3
    let (SEQUENCE, cert, _) = der(cert)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = der(cert)? else {
        return None;
    };
    let mut rest = tbs;
    // [0] version (optional), serial number, signature algorithm, issuer, validity, then the subject.
    let (tag, _, tail) = der(rest)?;
    if tag == 0xa0 {
        rest = tail;
    }
    for _ in 0..4 {
        rest = der(rest)?.2;
    }
    let (SEQUENCE, subject, _) = der(rest)? else {
        return None;
    };
    let mut rdns = subject;
    while !rdns.is_empty() {
        let (SET, mut attrs, tail) = der(rdns)? else {
            return None;
        };
        rdns = tail;
        while !attrs.is_empty() {
            let (SEQUENCE, attr, tail) = der(attrs)? else {
                return None;
            };
            attrs = tail;
            let (0x06, oid, value) = der(attr)? else {
                return None;
            };
            if oid == CN_OID {
                // UTF8String, PrintableString or IA5String.
                let (0x0c | 0x13 | 0x16, name, _) = der(value)? else {
                    return None;
                };
                return String::from_utf8(name.to_vec()).ok();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::{ClientConnection, HandshakeKind, ServerConnection};
    use std::io::Write;
    use transport_core::CounterSnapshot;

    /// Run a handshake between two in-memory connections; true if both sides completed it.
    fn handshake(
        client: &mut ClientConnection,
        server: &mut ServerConnection,
    ) -> Result<(), rustls::Error> {
        let mut buf = Vec::new();
        for _ in 0..10 {
            buf.clear();
            client.write_tls(&mut buf).unwrap();
            if !buf.is_empty() {
                server.read_tls(&mut buf.as_slice()).unwrap();
                server.process_new_packets()?;
            }
            buf.clear();
            server.write_tls(&mut buf).unwrap();
            if !buf.is_empty() {
                client.read_tls(&mut buf.as_slice()).unwrap();
                client.process_new_packets()?;
            }
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(());
            }
        }
        Err(rustls::Error::General("handshake did not finish".into()))
    }

    struct Pair {
        client: Arc<ClientConfig>,
        server: Arc<ServerConfig>,
        cc: Arc<Counters>,
        sc: Arc<Counters>,
    }

    impl Pair {
        fn new(dir: &Path, credentials: Arc<DeviceCredentials>, device: u32) -> Self {
            let (cc, sc) = (Arc::new(Counters::default()), Arc::new(Counters::default()));
            let server = server_config(dir, sc.clone(), &[b"test"]).unwrap();
            let client = client_config(credentials, device, cc.clone(), &[b"test"]).unwrap();
            Self {
                client,
                server,
                cc,
                sc,
            }
        }

        fn connections(&self) -> (ClientConnection, ServerConnection) {
            let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap();
            let client = ClientConnection::new(self.client.clone(), name).unwrap();
            (client, ServerConnection::new(self.server.clone()).unwrap())
        }
    }

    #[test]
    fn one_handshake_counts_exactly() {
        let dir = tempfile::tempdir().unwrap();
        write_pki(dir.path(), 3).unwrap();
        let creds = Arc::new(DeviceCredentials::load(dir.path()).unwrap());
        assert_eq!(creds.len(), 3);
        let pair = Pair::new(dir.path(), creds, 2);
        let (mut client, mut server) = pair.connections();
        handshake(&mut client, &mut server).unwrap();
        // Application data after the handshake would carry tickets if any were sent; let it flow.
        client.writer().write_all(b"ping").unwrap();
        handshake(&mut client, &mut server).unwrap();
        // Each side: X25519 key generation + agreement = 2; one CertificateVerify signature = 1; verifications =
        // the peer's certificate signed by the CA (1; the CA itself is the trust anchor, never verified) + the
        // peer's CertificateVerify (1) = 2. The client sends one key share (X25519, first in the list), so no
        // HelloRetryRequest and nothing else.
        let expected = CounterSnapshot {
            x25519: 2,
            sign: 1,
            verify: 2,
            ..CounterSnapshot::default()
        };
        assert_eq!(pair.cc.snapshot(), expected, "client");
        assert_eq!(pair.sc.snapshot(), expected, "server");
        let certs = server.peer_certificates().unwrap();
        assert_eq!(peer_device(certs).as_deref(), Some("dev-2"));
        assert_eq!(client.alpn_protocol(), Some(&b"test"[..]));
        assert_eq!(client.handshake_kind(), Some(HandshakeKind::Full));

        // A second connection with the same configs is again a full handshake with the same cost: no resumption.
        let (mut client, mut server) = pair.connections();
        handshake(&mut client, &mut server).unwrap();
        assert_eq!(client.handshake_kind(), Some(HandshakeKind::Full));
        assert_eq!(pair.sc.snapshot().since(&expected), expected);
    }

    /// A device that resumes a session makes no signature or verification on either side, only the X25519 of
    /// `psk_dhe_ke`, and resumes with a server restarted from the same files (a new config, a new ticket key object);
    /// a device that never connected, or a server without tickets, makes a full handshake.
    #[test]
    fn a_resumed_handshake_signs_and_verifies_nothing_and_outlives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        write_pki(dir.path(), 2).unwrap();
        let creds = Arc::new(DeviceCredentials::load(dir.path()).unwrap());
        let cc = Arc::new(Counters::default());
        let devices = ClientTls::new(creds, cc.clone(), &[b"test"])
            .unwrap()
            .resuming();
        assert!(devices.resumes());
        let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap();
        // One connection of `device` to `server`, the tickets read by the client; its kind, and the server's view.
        let connect = |server: &Arc<ServerConfig>, device: u32| {
            let config = devices.config(device).unwrap();
            let mut client = ClientConnection::new(config, name.clone()).unwrap();
            let mut server = ServerConnection::new(server.clone()).unwrap();
            handshake(&mut client, &mut server).unwrap();
            server.writer().write_all(b"pong").unwrap();
            handshake(&mut client, &mut server).unwrap();
            (client.handshake_kind(), server)
        };
        let full = CounterSnapshot {
            x25519: 2,
            sign: 1,
            verify: 2,
            ..CounterSnapshot::default()
        };
        let resumed = CounterSnapshot {
            x25519: 2,
            ..CounterSnapshot::default()
        };

        let sc = Arc::new(Counters::default());
        let first =
            resuming_server_config(dir.path(), sc.clone(), &[b"test"], TlsCrypto::Default).unwrap();
        let (kind, server) = connect(&first, 1);
        assert_eq!(kind, Some(HandshakeKind::Full));
        assert_eq!(server.handshake_kind(), Some(HandshakeKind::Full));
        assert_eq!((cc.snapshot(), sc.snapshot()), (full, full));

        // The server restarts: a new config from the same files.
        let sc = Arc::new(Counters::default());
        let second =
            resuming_server_config(dir.path(), sc.clone(), &[b"test"], TlsCrypto::Default).unwrap();
        let before = cc.snapshot();
        let (kind, server) = connect(&second, 1);
        assert_eq!(kind, Some(HandshakeKind::Resumed));
        assert_eq!(server.handshake_kind(), Some(HandshakeKind::Resumed));
        assert_eq!(
            (cc.snapshot().since(&before), sc.snapshot()),
            (resumed, resumed)
        );
        // The ticket carried the device's certificate: the server knows whom it serves.
        assert_eq!(
            peer_device(server.peer_certificates().unwrap()).as_deref(),
            Some("dev-1")
        );
        // And the resumed connection brought new tickets: the next one resumes too.
        assert_eq!(connect(&second, 1).0, Some(HandshakeKind::Resumed));

        // Device 0 has no ticket of its own (device 1's are not its): a full handshake.
        assert_eq!(connect(&second, 0).0, Some(HandshakeKind::Full));
        // A server that issues no tickets opens none: the device offers its ticket and gets a full handshake.
        let plain = server_config(dir.path(), Arc::new(Counters::default()), &[b"test"]).unwrap();
        assert_eq!(connect(&plain, 1).0, Some(HandshakeKind::Full));
    }

    /// With P-256 key exchange, a handshake costs each side the same operations whoever does the arithmetic, and a
    /// RustCrypto side and an aws-lc-rs side complete it together in both directions.
    #[test]
    fn p256_providers_count_the_same_and_interoperate() {
        let dir = tempfile::tempdir().unwrap();
        write_pki(dir.path(), 1).unwrap();
        let creds = Arc::new(DeviceCredentials::load(dir.path()).unwrap());
        // ECDH keygen + agreement = 2 (no X25519 at all); one CertificateVerify signature; two verifications.
        let expected = CounterSnapshot {
            ecdh: 2,
            sign: 1,
            verify: 2,
            ..CounterSnapshot::default()
        };
        let (asm, rc) = (TlsCrypto::P256, TlsCrypto::P256RustCrypto);
        for (server_crypto, client_crypto) in [(asm, asm), (rc, rc), (asm, rc), (rc, asm)] {
            let (cc, sc) = (Arc::new(Counters::default()), Arc::new(Counters::default()));
            let server =
                server_config_with(dir.path(), sc.clone(), &[b"test"], server_crypto).unwrap();
            let client =
                ClientTls::with_crypto(creds.clone(), cc.clone(), &[b"test"], client_crypto)
                    .unwrap()
                    .config(0)
                    .unwrap();
            let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap();
            let mut client = ClientConnection::new(client, name).unwrap();
            let mut server = ServerConnection::new(server).unwrap();
            let pair = format!("server {server_crypto:?}, client {client_crypto:?}");
            handshake(&mut client, &mut server).unwrap_or_else(|e| panic!("{pair}: {e}"));
            assert_eq!(cc.snapshot(), expected, "client; {pair}");
            assert_eq!(sc.snapshot(), expected, "server; {pair}");
            let group = client.negotiated_key_exchange_group().map(|g| g.name());
            assert_eq!(group, Some(rustls::NamedGroup::secp256r1), "{pair}");
            assert_eq!(
                peer_device(server.peer_certificates().unwrap()).as_deref(),
                Some("dev-0")
            );
        }
        // The providers really differ where they should: RustCrypto's is not aws-lc-rs's.
        let c = Arc::new(Counters::default());
        let names = |crypto| {
            let p = counting_provider_for(&c, crypto);
            (p.kx_groups.len(), format!("{:?}", p.key_provider))
        };
        assert_eq!(names(asm).0, 1);
        assert_ne!(names(asm).1, names(rc).1);
        assert_eq!(counting_provider(&c).kx_groups.len(), 3);
    }

    #[test]
    fn asymmetric_costs_are_measured_for_what_each_provider_has() {
        let default = asym_costs(TlsCrypto::Default).unwrap();
        assert!(default.x25519_us.is_some() && default.ecdh_us.is_some());
        for crypto in [TlsCrypto::P256, TlsCrypto::P256RustCrypto] {
            let c = asym_costs(crypto).unwrap();
            assert_eq!(c.x25519_us, None, "{crypto:?} offers no X25519");
            for us in [c.ecdh_us, c.sign_us, c.verify_us] {
                assert!(us.is_some_and(|us| us > 0.0), "{crypto:?}: {c:?}");
            }
        }
    }

    #[test]
    fn a_device_from_another_ca_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        write_pki(dir.path(), 1).unwrap();
        let foreign = Arc::new(DeviceCredentials::foreign(dir.path(), 1).unwrap());
        let pair = Pair::new(dir.path(), foreign, 0);
        let (mut client, mut server) = pair.connections();
        let err = handshake(&mut client, &mut server).unwrap_err();
        assert!(
            matches!(err, rustls::Error::InvalidCertificate(_)),
            "{err:?}"
        );
        // The issuer is unknown: no signature of the chain was checked (and the CertificateVerify never was).
        assert_eq!(pair.sc.snapshot().verify, 0);
        assert!(server.peer_certificates().is_none());
    }

    #[test]
    fn an_extracted_device_holds_only_its_own_identity_and_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        write_pki(dir.path(), 3).unwrap();
        let own = dir.path().join("own");
        extract_device(dir.path(), 2, &own).unwrap();
        let creds = Arc::new(DeviceCredentials::load(&own).unwrap());
        assert_eq!(creds.len(), 1, "nothing of the other devices");
        let pair = Pair::new(dir.path(), creds, 0);
        let (mut client, mut server) = pair.connections();
        handshake(&mut client, &mut server).unwrap();
        let certs = server.peer_certificates().unwrap();
        assert_eq!(peer_device(certs).as_deref(), Some("dev-2"));
        assert!(extract_device(dir.path(), 3, &own).is_err(), "no device 3");
    }

    #[test]
    fn common_names_are_read_back() {
        let ca = Authority::new("x").unwrap();
        for name in ["dev-0", "dev-9999", "sensor with spaces", SERVER_NAME] {
            let (cert, _) = ca.issue(name, name == SERVER_NAME).unwrap();
            assert_eq!(common_name(cert.der()).as_deref(), Some(name));
        }
        assert_eq!(peer_device(&[]), None);
        assert_eq!(
            peer_device(&[CertificateDer::from(vec![0x30, 0x82, 0xff])]),
            None
        );
        // Truncations of a real certificate never panic.
        let (cert, _) = ca.issue("dev-1", false).unwrap();
        for n in 0..cert.der().len() {
            let _ = common_name(&cert.der()[..n]);
        }
    }

    #[test]
    fn only_device_names_are_peer_identities() {
        // A name other than `dev-N` would get a hashed sender number that another name could share in the
        // exactly-once key: even from the run's CA, it is no identity.
        let ca = Authority::new("x").unwrap();
        for name in ["dev-0", "dev-7", "dev-4294967295"] {
            let (cert, _) = ca.issue(name, false).unwrap();
            let device = peer_device(&[cert.der().clone()]);
            assert_eq!(device.as_deref(), Some(name));
            assert!(transport_core::sender_id(name) < 1 << 32, "{name}");
        }
        for name in [
            "sensor-7",
            "dev-07",
            "dev-+7",
            "dev-",
            "dev-4294967296",
            "DEV-7",
            " dev-7",
            SERVER_NAME,
        ] {
            let (cert, _) = ca.issue(name, name == SERVER_NAME).unwrap();
            assert_eq!(peer_device(&[cert.der().clone()]), None, "{name:?}");
        }
    }

    #[test]
    fn server_secrets_and_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        for missing in [
            server_fingerprint(dir.path()).err(),
            server_secret(dir.path(), b"salt", b"label").err(),
            DeviceCredentials::load_for(dir.path(), 1).err(),
        ] {
            assert!(
                matches!(missing, Some(TransportError::Identity(_))),
                "{missing:?}"
            );
        }
        write_pki(dir.path(), 2).unwrap();
        let fingerprint = server_fingerprint(dir.path()).unwrap();
        assert_eq!(fingerprint.len(), 64);
        assert_eq!(server_fingerprint(dir.path()).unwrap(), fingerprint);
        let secret = |salt: &[u8], label: &[u8]| server_secret(dir.path(), salt, label).unwrap();
        assert_eq!(secret(b"a", b"x"), secret(b"a", b"x"));
        assert_ne!(secret(b"a", b"x"), secret(b"b", b"x"));
        assert_ne!(secret(b"a", b"x"), secret(b"a", b"y"));
        assert_eq!(DeviceCredentials::load_for(dir.path(), 2).unwrap().len(), 2);
        assert!(matches!(
            DeviceCredentials::load_for(dir.path(), 3),
            Err(TransportError::Identity(_))
        ));
    }

    #[test]
    fn files_and_bundle() {
        let dir = tempfile::tempdir().unwrap();
        write_pki(dir.path(), 5).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for (file, mode) in [
                (SERVER_KEY_FILE, 0o600),
                (DEVICES_FILE, 0o600),
                (CA_FILE, 0o644),
            ] {
                let m = std::fs::metadata(dir.path().join(file))
                    .unwrap()
                    .permissions()
                    .mode();
                assert_eq!(m & 0o777, mode, "{file}");
            }
        }
        let creds = DeviceCredentials::load(dir.path()).unwrap();
        for n in 0..5 {
            let (cert, _) = creds.device(n).unwrap();
            assert_eq!(peer_device(&[cert]), Some(device_name(n)));
        }
        assert!(creds.device(5).is_none());
        // A damaged bundle is an identity error, not a panic.
        let path = dir.path().join(DEVICES_FILE);
        let mut data = std::fs::read(&path).unwrap();
        data[20] ^= 1;
        std::fs::write(&path, &data).unwrap();
        assert!(matches!(
            DeviceCredentials::load(dir.path()),
            Err(TransportError::Identity(_))
        ));
        for n in 0..data.len().min(64) {
            assert!(parse_bundle(&data[..n]).is_err());
        }
    }
}
