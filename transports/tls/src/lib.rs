//! The PKI and the rustls configuration every TLS transport shares (quinn, s2n-quic with rustls, MQTT over TLS 1.3).
//!
//! - [`write_pki`] makes a CA (ECDSA P-256), a server certificate for [`SERVER_NAME`] and 127.0.0.1, and one client
//!   certificate per device whose common name is [`device_name`]; all signed by the CA.
//! - [`server_config`] and [`ClientTls::config`] build TLS 1.3 configurations with client certificates required on
//!   both ends, no session resumption (every connection is a full handshake), and a crypto provider that counts the
//!   asymmetric operations it actually performs into a [`Counters`].
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
//! counts stay comparable across builds whatever rustls features other crates switch on.
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

use ::aws_lc_rs::{digest, hkdf};
use rustls::client::danger::ServerCertVerifier;
use rustls::client::{Resumption, WebPkiServerVerifier};
use rustls::crypto::{
    aws_lc_rs, ActiveKeyExchange, CryptoProvider, SharedSecret, SupportedKxGroup,
    WebPkiSupportedAlgorithms,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{
    AlgorithmIdentifier, CertificateDer, InvalidSignature, PrivateKeyDer, PrivatePkcs8KeyDer,
    SignatureVerificationAlgorithm,
};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::sign::{CertifiedKey, Signer, SigningKey, SingleCertAndKey};
use rustls::{
    ClientConfig, NamedGroup, RootCertStore, ServerConfig, SignatureAlgorithm, SignatureScheme,
};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};
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

/// A certificate authority held in memory, able to issue certificates.
struct Authority {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

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
        let cert = params.self_signed(&key).map_err(identity_error)?;
        Ok(Self { cert, key })
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
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .map_err(identity_error)?;
        Ok((cert, key))
    }

    /// The device bundle (layout in the module docs) for devices `0..devices`.
    fn device_bundle(&self, devices: u32) -> Result<Vec<u8>, TransportError> {
        let mut out = Vec::with_capacity(16 + devices as usize * 700);
        out.extend_from_slice(DEVICES_MAGIC);
        out.extend_from_slice(&devices.to_be_bytes());
        for n in 0..devices {
            let (cert, key) = self.issue(&device_name(n), false)?;
            let key = key.serialize_der();
            for part in [cert.der().as_ref(), key.as_slice()] {
                let len = u32::try_from(part.len()).map_err(identity_error)?;
                out.extend_from_slice(&len.to_be_bytes());
                out.extend_from_slice(part);
            }
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        Ok(out)
    }
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
    write_file(&dir.join(CA_FILE), ca.cert.pem().as_bytes(), false)?;
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
// The counting provider
// ---------------------------------------------------------------------------------------------------------------

/// A key exchange group that counts its scalar multiplications.
#[derive(Debug)]
struct CountingGroup {
    inner: &'static dyn SupportedKxGroup,
    counters: Arc<Counters>,
}

impl CountingGroup {
    fn count(&self) {
        count_kx(&self.counters, self.inner.name());
    }
}

fn count_kx(counters: &Counters, group: NamedGroup) {
    if group == NamedGroup::X25519 {
        Counters::inc(&counters.x25519);
    } else {
        Counters::inc(&counters.ecdh);
    }
}

impl SupportedKxGroup for CountingGroup {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, rustls::Error> {
        let inner = self.inner.start()?;
        self.count(); // ephemeral key generation
        Ok(Box::new(CountingExchange {
            inner,
            counters: self.counters.clone(),
        }))
    }

    fn ffdhe_group(&self) -> Option<rustls::ffdhe_groups::FfdheGroup<'static>> {
        None
    }

    fn name(&self) -> NamedGroup {
        self.inner.name()
    }

    fn fips(&self) -> bool {
        self.inner.fips()
    }

    fn usable_for_version(&self, version: rustls::ProtocolVersion) -> bool {
        self.inner.usable_for_version(version)
    }
}

struct CountingExchange {
    inner: Box<dyn ActiveKeyExchange>,
    counters: Arc<Counters>,
}

impl ActiveKeyExchange for CountingExchange {
    fn complete(self: Box<Self>, peer_pub_key: &[u8]) -> Result<SharedSecret, rustls::Error> {
        count_kx(&self.counters, self.inner.group()); // agreement, counted even if the peer's key is refused
        self.inner.complete(peer_pub_key)
    }

    fn pub_key(&self) -> &[u8] {
        self.inner.pub_key()
    }

    fn ffdhe_group(&self) -> Option<rustls::ffdhe_groups::FfdheGroup<'static>> {
        None
    }

    fn group(&self) -> NamedGroup {
        self.inner.group()
    }
}

/// A signature verification algorithm that counts its verifications.
#[derive(Debug)]
struct CountingVerify {
    inner: &'static dyn SignatureVerificationAlgorithm,
    counters: Arc<Counters>,
}

impl SignatureVerificationAlgorithm for CountingVerify {
    fn verify_signature(
        &self,
        public_key: &[u8],
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), InvalidSignature> {
        Counters::inc(&self.counters.verify);
        self.inner.verify_signature(public_key, message, signature)
    }

    fn public_key_alg_id(&self) -> AlgorithmIdentifier {
        self.inner.public_key_alg_id()
    }

    fn signature_alg_id(&self) -> AlgorithmIdentifier {
        self.inner.signature_alg_id()
    }

    fn fips(&self) -> bool {
        self.inner.fips()
    }
}

/// Our own private key, counting the signatures it makes.
#[derive(Debug)]
struct CountingKey {
    inner: Arc<dyn SigningKey>,
    counters: Arc<Counters>,
}

impl SigningKey for CountingKey {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        let inner = self.inner.choose_scheme(offered)?;
        Some(Box::new(CountingSigner {
            inner,
            counters: self.counters.clone(),
        }))
    }

    fn public_key(&self) -> Option<rustls::pki_types::SubjectPublicKeyInfoDer<'_>> {
        self.inner.public_key()
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        self.inner.algorithm()
    }
}

#[derive(Debug)]
struct CountingSigner {
    inner: Box<dyn Signer>,
    counters: Arc<Counters>,
}

impl Signer for CountingSigner {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        Counters::inc(&self.counters.sign);
        self.inner.sign(message)
    }

    fn scheme(&self) -> SignatureScheme {
        self.inner.scheme()
    }
}

/// Providers built so far, one per [`Counters`].
///
/// rustls wants its key exchange groups and verification algorithms as `&'static`, so the counting wrappers of one
/// `Counters` are leaked once (a few hundred bytes) and reused by every config built for it.
static PROVIDERS: Mutex<Vec<(Arc<Counters>, Arc<CryptoProvider>)>> = Mutex::new(Vec::new());

/// aws-lc-rs's provider with X25519, P-256 and P-384 key exchange, counting every asymmetric operation into
/// `counters` (see the module docs).
pub fn counting_provider(counters: &Arc<Counters>) -> Arc<CryptoProvider> {
    let mut providers = PROVIDERS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = providers.iter().find(|(c, _)| Arc::ptr_eq(c, counters)) {
        return p.clone();
    }
    let base = aws_lc_rs::default_provider();
    let groups = [
        aws_lc_rs::kx_group::X25519,
        aws_lc_rs::kx_group::SECP256R1,
        aws_lc_rs::kx_group::SECP384R1,
    ];
    let kx_groups = groups
        .into_iter()
        .map(|inner| {
            let g: &'static dyn SupportedKxGroup = Box::leak(Box::new(CountingGroup {
                inner,
                counters: counters.clone(),
            }));
            g
        })
        .collect();
    let wrap = |algs: &'static [&'static dyn SignatureVerificationAlgorithm]| {
        let wrapped: Vec<&'static dyn SignatureVerificationAlgorithm> = algs
            .iter()
            .map(|&inner| {
                let a: &'static dyn SignatureVerificationAlgorithm =
                    Box::leak(Box::new(CountingVerify {
                        inner,
                        counters: counters.clone(),
                    }));
                a
            })
            .collect();
        &*Box::leak(wrapped.into_boxed_slice())
    };
    let algs = base.signature_verification_algorithms;
    let mapping: Vec<_> = algs
        .mapping
        .iter()
        .map(|&(scheme, list)| (scheme, wrap(list)))
        .collect();
    let provider = Arc::new(CryptoProvider {
        kx_groups,
        signature_verification_algorithms: WebPkiSupportedAlgorithms {
            all: wrap(algs.all),
            mapping: Box::leak(mapping.into_boxed_slice()),
        },
        ..base
    });
    providers.push((counters.clone(), provider.clone()));
    provider
}

fn counting_key(
    provider: &CryptoProvider,
    key: PrivateKeyDer<'static>,
    counters: &Arc<Counters>,
) -> Result<Arc<dyn SigningKey>, TransportError> {
    let inner = provider
        .key_provider
        .load_private_key(key)
        .map_err(identity_error)?;
    Ok(Arc::new(CountingKey {
        inner,
        counters: counters.clone(),
    }))
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
    let provider = counting_provider(&counters);
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
    // Every connection a full handshake: no session cache, no tickets (and so no 0-RTT).
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
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
        let provider = counting_provider(&counters);
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
        })
    }

    /// How many devices there are credentials for.
    pub fn devices(&self) -> u32 {
        self.credentials.len()
    }

    /// Device `device`'s configuration: TLS 1.3 only, its own certificate, the server verified against the CA (for
    /// the name [`SERVER_NAME`]), no resumption.
    pub fn config(&self, device: u32) -> Result<Arc<ClientConfig>, TransportError> {
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
        config.resumption = Resumption::disabled();
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

/// The common name of the first (end-entity) certificate of a verified peer chain: on the server, the device's name.
/// `None` if there is no certificate or it has no readable common name.
pub fn peer_device(certs: &[CertificateDer<'_>]) -> Option<String> {
    common_name(certs.first()?.as_ref())
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
    fn common_names_are_read_back() {
        let ca = Authority::new("x").unwrap();
        for name in ["dev-0", "dev-9999", "sensor with spaces"] {
            let (cert, _) = ca.issue(name, false).unwrap();
            assert_eq!(peer_device(&[cert.der().clone()]).as_deref(), Some(name));
        }
        let (cert, _) = ca.issue(SERVER_NAME, true).unwrap();
        assert_eq!(
            peer_device(&[cert.der().clone()]).as_deref(),
            Some(SERVER_NAME)
        );
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
