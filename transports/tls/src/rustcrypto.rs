//! A rustls crypto provider whose every P-256 operation is RustCrypto's portable `p256` (0.14, precomputed base-point
//! tables) instead of aws-lc-rs's assembly; everything else is aws-lc-rs's, unchanged. It is the end-to-end
//! counterpart of the microbenchmarks' "P-256 in assembly against RustCrypto" (seed 002): the same handshake, with
//! only the P-256 arithmetic swapped.
//!
//! Swapped, and only these:
//!
//! - the key exchange group `secp256r1` (the only group offered): ephemeral key generation and ECDH agreement;
//! - ECDSA P-256 signing with our own key (loaded from PKCS#8; other key types go to aws-lc-rs as before);
//! - ECDSA verification with a P-256 public key, with SHA-256 and SHA-384 (certificates and `CertificateVerify`).
//!
//! Hashing stays aws-lc-rs's: a signature is made over, and verified against, a digest aws-lc-rs computed
//! (`sign_prehash` / `verify_prehash`), so what differs is the curve arithmetic alone. Signatures use RFC 6979
//! deterministic nonces, RustCrypto's default. The counting provider ([`crate::counting_provider_for`]) wraps these
//! exactly as it wraps aws-lc-rs's, so every operation is counted at the same place.

use ::aws_lc_rs::digest;
use p256::ecdsa::signature::hazmat::{PrehashSigner, PrehashVerifier};
use p256::elliptic_curve::sec1::ToSec1Point;
use p256::elliptic_curve::Generate;
use p256::pkcs8::DecodePrivateKey;
use rustls::crypto::{
    ActiveKeyExchange, CryptoProvider, KeyProvider, SharedSecret, SupportedKxGroup,
    WebPkiSupportedAlgorithms,
};
use rustls::pki_types::{
    alg_id, AlgorithmIdentifier, InvalidSignature, PrivateKeyDer, SignatureVerificationAlgorithm,
    SubjectPublicKeyInfoDer,
};
use rustls::sign::{Signer, SigningKey};
use rustls::{Error, NamedGroup, PeerMisbehaved, SignatureAlgorithm, SignatureScheme};
use std::sync::Arc;

/// `base` (aws-lc-rs's provider) with its P-256 key exchange, ECDSA P-256 signing and verification replaced, and
/// `secp256r1` as the only key exchange group.
pub fn provider(base: CryptoProvider) -> CryptoProvider {
    let algs = base.signature_verification_algorithms;
    let all = swap_verifiers(algs.all);
    let mapping: Vec<_> = algs
        .mapping
        .iter()
        .map(|&(scheme, list)| (scheme, swap_verifiers(list)))
        .collect();
    let key_provider: &'static dyn KeyProvider = Box::leak(Box::new(Keys {
        fallback: base.key_provider,
    }));
    CryptoProvider {
        kx_groups: vec![&P256_GROUP],
        signature_verification_algorithms: WebPkiSupportedAlgorithms {
            all,
            mapping: Box::leak(mapping.into_boxed_slice()),
        },
        key_provider,
        ..base
    }
}

/// `list` with every ECDSA-with-a-P-256-key algorithm replaced by RustCrypto's (leaked once per provider built).
fn swap_verifiers(
    list: &'static [&'static dyn SignatureVerificationAlgorithm],
) -> &'static [&'static dyn SignatureVerificationAlgorithm] {
    let swapped: Vec<&'static dyn SignatureVerificationAlgorithm> = list
        .iter()
        .map(|&alg| replacement(alg).unwrap_or(alg))
        .collect();
    Box::leak(swapped.into_boxed_slice())
}

fn replacement(
    alg: &dyn SignatureVerificationAlgorithm,
) -> Option<&'static dyn SignatureVerificationAlgorithm> {
    if alg.public_key_alg_id() != alg_id::ECDSA_P256 {
        return None;
    }
    [&VERIFY_P256_SHA256, &VERIFY_P256_SHA384]
        .into_iter()
        .find(|r| r.signature_alg_id() == alg.signature_alg_id())
        .map(|r| r as &'static dyn SignatureVerificationAlgorithm)
}

// ---------------------------------------------------------------------------------------------------------------
// Key exchange
// ---------------------------------------------------------------------------------------------------------------

/// ECDH on P-256 (`secp256r1`), RustCrypto's.
#[derive(Debug)]
struct P256Group;

static P256_GROUP: P256Group = P256Group;

impl SupportedKxGroup for P256Group {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, Error> {
        let secret = p256::ecdh::EphemeralSecret::try_generate()
            .map_err(|_| Error::FailedToGetRandomBytes)?;
        // TLS 1.3 key shares of the NIST curves are uncompressed points (RFC 8446, 4.2.8.2).
        let public = secret.public_key().to_sec1_point(false).as_bytes().to_vec();
        Ok(Box::new(P256Exchange { secret, public }))
    }

    fn name(&self) -> NamedGroup {
        NamedGroup::secp256r1
    }
}

struct P256Exchange {
    secret: p256::ecdh::EphemeralSecret,
    public: Vec<u8>,
}

impl ActiveKeyExchange for P256Exchange {
    fn complete(self: Box<Self>, peer_pub_key: &[u8]) -> Result<SharedSecret, Error> {
        // Only an uncompressed point (0x04, x, y) is a valid TLS 1.3 key share; `from_sec1_bytes` checks it is on
        // the curve and not the identity.
        if peer_pub_key.len() != 65 || peer_pub_key[0] != 0x04 {
            return Err(PeerMisbehaved::InvalidKeyShare.into());
        }
        let peer = p256::PublicKey::from_sec1_bytes(peer_pub_key)
            .map_err(|_| Error::from(PeerMisbehaved::InvalidKeyShare))?;
        let shared = self.secret.diffie_hellman(&peer);
        Ok(SharedSecret::from(shared.raw_secret_bytes().as_slice()))
    }

    fn pub_key(&self) -> &[u8] {
        &self.public
    }

    fn group(&self) -> NamedGroup {
        NamedGroup::secp256r1
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Signing
// ---------------------------------------------------------------------------------------------------------------

/// Loads ECDSA P-256 keys as RustCrypto signing keys; any other key as the base provider does.
#[derive(Debug)]
struct Keys {
    fallback: &'static dyn KeyProvider,
}

impl KeyProvider for Keys {
    fn load_private_key(
        &self,
        key_der: PrivateKeyDer<'static>,
    ) -> Result<Arc<dyn SigningKey>, Error> {
        if let PrivateKeyDer::Pkcs8(der) = &key_der {
            if let Ok(key) = p256::ecdsa::SigningKey::from_pkcs8_der(der.secret_pkcs8_der()) {
                return Ok(Arc::new(P256Key(Arc::new(key))));
            }
        }
        self.fallback.load_private_key(key_der)
    }

    fn fips(&self) -> bool {
        false
    }
}

/// An ECDSA P-256 private key, RustCrypto's.
#[derive(Debug)]
struct P256Key(Arc<p256::ecdsa::SigningKey>);

impl SigningKey for P256Key {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        offered
            .contains(&SignatureScheme::ECDSA_NISTP256_SHA256)
            .then(|| Box::new(P256Signer(self.0.clone())) as Box<dyn Signer>)
    }

    fn public_key(&self) -> Option<SubjectPublicKeyInfoDer<'_>> {
        let point = self.0.verifying_key().to_sec1_point(false);
        Some(rustls::sign::public_key_to_spki(
            &alg_id::ECDSA_P256,
            point.as_bytes(),
        ))
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        SignatureAlgorithm::ECDSA
    }
}

#[derive(Debug)]
struct P256Signer(Arc<p256::ecdsa::SigningKey>);

impl Signer for P256Signer {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, Error> {
        let hash = digest::digest(&digest::SHA256, message);
        let signature: p256::ecdsa::Signature = self
            .0
            .sign_prehash(hash.as_ref())
            .map_err(|e| Error::General(format!("ECDSA P-256 signing failed: {e}")))?;
        Ok(signature.to_der().as_bytes().to_vec())
    }

    fn scheme(&self) -> SignatureScheme {
        SignatureScheme::ECDSA_NISTP256_SHA256
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Verification
// ---------------------------------------------------------------------------------------------------------------

/// ECDSA verification with a P-256 public key and the given hash, RustCrypto's.
#[derive(Debug)]
struct P256Verify {
    hash: &'static digest::Algorithm,
    signature_alg: AlgorithmIdentifier,
}

static VERIFY_P256_SHA256: P256Verify = P256Verify {
    hash: &digest::SHA256,
    signature_alg: alg_id::ECDSA_SHA256,
};

static VERIFY_P256_SHA384: P256Verify = P256Verify {
    hash: &digest::SHA384,
    signature_alg: alg_id::ECDSA_SHA384,
};

impl SignatureVerificationAlgorithm for P256Verify {
    fn verify_signature(
        &self,
        public_key: &[u8],
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), InvalidSignature> {
        // The public key is the SEC1 point of the subject's key, as webpki hands it over; parsing it (and checking
        // it is on the curve) is part of verifying with a key not met before.
        let key =
            p256::ecdsa::VerifyingKey::from_sec1_bytes(public_key).map_err(|_| InvalidSignature)?;
        let signature =
            p256::ecdsa::Signature::from_der(signature).map_err(|_| InvalidSignature)?;
        let hash = digest::digest(self.hash, message);
        key.verify_prehash(hash.as_ref(), &signature)
            .map_err(|_| InvalidSignature)
    }

    fn public_key_alg_id(&self) -> AlgorithmIdentifier {
        alg_id::ECDSA_P256
    }

    fn signature_alg_id(&self) -> AlgorithmIdentifier {
        self.signature_alg
    }

    fn fips(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::aws_lc_rs;

    /// The same P-256 operation, done by each side, must agree with the other: keys, shared secrets and signatures
    /// cross between aws-lc-rs and RustCrypto.
    #[test]
    fn agrees_with_aws_lc_rs() {
        let ours = provider(aws_lc_rs::default_provider());
        let theirs = aws_lc_rs::kx_group::SECP256R1;
        assert_eq!(ours.kx_groups.len(), 1);
        let (a, b) = (ours.kx_groups[0].start().unwrap(), theirs.start().unwrap());
        let b_pub = b.pub_key().to_vec();
        let a_pub = a.pub_key().to_vec();
        assert_eq!(a_pub.len(), 65);
        let s1 = a.complete(&b_pub).unwrap();
        let s2 = b.complete(&a_pub).unwrap();
        assert_eq!(s1.secret_bytes(), s2.secret_bytes());

        // Bad key shares are refused, not a panic.
        for bad in [
            vec![],
            vec![4; 65],
            b_pub[..33].to_vec(),
            [&[2u8][..], &b_pub[1..33]].concat(),
        ] {
            let a = ours.kx_groups[0].start().unwrap();
            assert!(a.complete(&bad).is_err(), "{bad:?}");
        }

        // A signature made by RustCrypto verifies with aws-lc-rs and the other way round.
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let der = PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let rc_key = ours.key_provider.load_private_key(der.clone_key()).unwrap();
        let aws_key = aws_lc_rs::default_provider()
            .key_provider
            .load_private_key(der)
            .unwrap();
        assert_eq!(rc_key.public_key(), aws_key.public_key());
        let public = key.public_key_raw().to_vec();
        let msg = b"CertificateVerify context";
        let scheme = [SignatureScheme::ECDSA_NISTP256_SHA256];
        let by_rc = rc_key.choose_scheme(&scheme).unwrap().sign(msg).unwrap();
        let by_aws = aws_key.choose_scheme(&scheme).unwrap().sign(msg).unwrap();
        let aws_verify = ::aws_lc_rs::signature::UnparsedPublicKey::new(
            &::aws_lc_rs::signature::ECDSA_P256_SHA256_ASN1,
            &public,
        );
        assert!(aws_verify.verify(msg, &by_rc).is_ok());
        assert!(VERIFY_P256_SHA256
            .verify_signature(&public, msg, &by_aws)
            .is_ok());
        assert!(VERIFY_P256_SHA256
            .verify_signature(&public, b"another message", &by_aws)
            .is_err());
        assert!(VERIFY_P256_SHA384
            .verify_signature(&public, msg, &by_aws)
            .is_err());
        assert!(rc_key.choose_scheme(&[SignatureScheme::ED25519]).is_none());
    }

    #[test]
    fn only_p256_algorithms_are_swapped() {
        let base = aws_lc_rs::default_provider();
        let ours = provider(aws_lc_rs::default_provider());
        let all = ours.signature_verification_algorithms.all;
        assert_eq!(all.len(), base.signature_verification_algorithms.all.len());
        let swapped = all
            .iter()
            .zip(base.signature_verification_algorithms.all)
            .filter(|(a, b)| !std::ptr::addr_eq(**a as *const _, **b as *const _))
            .count();
        assert_eq!(swapped, 2, "ECDSA P-256 with SHA-256 and with SHA-384");
        assert_eq!(ours.cipher_suites.len(), base.cipher_suites.len());
    }
}
