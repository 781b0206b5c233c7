//! The counting provider: a rustls [`CryptoProvider`] that counts every asymmetric operation it performs (see the
//! crate docs for what is counted where), over the base provider a [`TlsCrypto`] names.

use crate::{identity_error, rustcrypto};
use rustls::crypto::{
    aws_lc_rs, ActiveKeyExchange, CryptoProvider, SharedSecret, SupportedKxGroup,
    WebPkiSupportedAlgorithms,
};
use rustls::pki_types::{
    alg_id, AlgorithmIdentifier, InvalidSignature, PrivateKeyDer, SignatureVerificationAlgorithm,
};
use rustls::sign::{Signer, SigningKey};
use rustls::{NamedGroup, SignatureAlgorithm, SignatureScheme};
use std::sync::{Arc, Mutex};
use transport_core::{AsymCosts, Counters, TransportError};

/// Which key exchange groups a TLS configuration offers, and whose arithmetic does P-256. Certificates are ECDSA
/// P-256 in every case ([`write_pki`](crate::write_pki)); everything not named here (ciphers, hashes, HKDF, the
/// random source, other curves) is aws-lc-rs's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TlsCrypto {
    /// X25519 first, then P-256 and P-384, all aws-lc-rs (assembly where it has it).
    #[default]
    Default,
    /// P-256 key exchange only; P-256 (key exchange, ECDSA signing and verification) by aws-lc-rs's assembly.
    P256,
    /// P-256 key exchange only; every P-256 operation (key exchange, ECDSA signing and verification) by RustCrypto's
    /// portable `p256` crate ([`rustcrypto`](crate::rustcrypto)); the rest as [`TlsCrypto::P256`].
    P256RustCrypto,
}

impl TlsCrypto {
    /// The provider before counting.
    fn base_provider(self) -> CryptoProvider {
        let base = aws_lc_rs::default_provider();
        match self {
            TlsCrypto::Default => CryptoProvider {
                kx_groups: vec![
                    aws_lc_rs::kx_group::X25519,
                    aws_lc_rs::kx_group::SECP256R1,
                    aws_lc_rs::kx_group::SECP384R1,
                ],
                ..base
            },
            TlsCrypto::P256 => CryptoProvider {
                kx_groups: vec![aws_lc_rs::kx_group::SECP256R1],
                ..base
            },
            TlsCrypto::P256RustCrypto => rustcrypto::provider(base),
        }
    }
}

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

/// A provider built for one ([`Counters`], [`TlsCrypto`]).
type Built = (Arc<Counters>, TlsCrypto, Arc<CryptoProvider>);

/// Providers built so far, one per ([`Counters`], [`TlsCrypto`]).
///
/// rustls wants its key exchange groups and verification algorithms as `&'static`, so the counting wrappers of one
/// `Counters` are leaked once (a few hundred bytes) and reused by every config built for it.
static PROVIDERS: Mutex<Vec<Built>> = Mutex::new(Vec::new());

/// aws-lc-rs's provider with X25519, P-256 and P-384 key exchange, counting every asymmetric operation into
/// `counters` (see the crate docs): [`counting_provider_for`] with [`TlsCrypto::Default`].
pub fn counting_provider(counters: &Arc<Counters>) -> Arc<CryptoProvider> {
    counting_provider_for(counters, TlsCrypto::Default)
}

/// The provider `crypto` names (its key exchange groups, and whose arithmetic does P-256), counting every
/// asymmetric operation into `counters`. Built once per pair and shared.
pub fn counting_provider_for(counters: &Arc<Counters>, crypto: TlsCrypto) -> Arc<CryptoProvider> {
    let mut providers = PROVIDERS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, _, p)) = providers
        .iter()
        .find(|(c, k, _)| Arc::ptr_eq(c, counters) && *k == crypto)
    {
        return p.clone();
    }
    let base = crypto.base_provider();
    let kx_groups = base
        .kx_groups
        .iter()
        .map(|&inner| {
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
    providers.push((counters.clone(), crypto, provider.clone()));
    provider
}

pub(crate) fn counting_key(
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

/// What one asymmetric operation of each kind a TLS server with `crypto` counts costs, measured here with that
/// provider's own objects (the code a handshake calls): key generation and agreement (averaged: the counter counts
/// each) of its X25519 group and of its P-256 group, whichever it has (`ecdh_us` is P-256's; P-384 is offered by the
/// default provider but never chosen by this suite's peers), ECDSA P-256 signing of a CertificateVerify-sized
/// message with a P-256 key loaded through its key provider, and ECDSA P-256 SHA-256 verification with a key parsed
/// for it; each timed on this thread's CPU clock ([`AsymCosts::time`]). About a quarter of a second. `None` if the provider cannot do one of them.
pub fn asym_costs(crypto: TlsCrypto) -> Option<AsymCosts> {
    use std::hint::black_box;
    let provider = crypto.base_provider();
    let kx = |name: NamedGroup| -> Option<f64> {
        let group = provider.kx_groups.iter().find(|g| g.name() == name)?;
        let peer = group.start().ok()?.pub_key().to_vec();
        group.start().ok()?.complete(&peer).ok()?;
        let both = AsymCosts::time(|| {
            if let Ok(k) = group.start() {
                let _ = black_box(k.complete(black_box(&peer)));
            }
        })?;
        Some(both / 2.0)
    };
    let x25519_us = kx(NamedGroup::X25519);
    let ecdh_us = kx(NamedGroup::secp256r1);

    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).ok()?;
    let der = PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let signing = provider.key_provider.load_private_key(der).ok()?;
    let signer = signing.choose_scheme(&[SignatureScheme::ECDSA_NISTP256_SHA256])?;
    // A TLS 1.3 CertificateVerify input: 64 spaces, the context string, a zero byte, a SHA-256 transcript hash.
    let message = [0x20u8; 130];
    let signature = signer.sign(&message).ok()?;
    let sign = AsymCosts::time(|| {
        let _ = black_box(signer.sign(black_box(&message)));
    })?;

    let verifier = provider
        .signature_verification_algorithms
        .all
        .iter()
        .find(|a| {
            a.public_key_alg_id() == alg_id::ECDSA_P256
                && a.signature_alg_id() == alg_id::ECDSA_SHA256
        })?;
    let public = key.public_key_raw();
    verifier
        .verify_signature(public, &message, &signature)
        .ok()?;
    let verify = AsymCosts::time(|| {
        let _ = black_box(verifier.verify_signature(public, black_box(&message), &signature));
    })?;

    Some(AsymCosts {
        x25519_us,
        ecdh_us,
        sign_us: Some(sign),
        verify_us: Some(verify),
    })
}
