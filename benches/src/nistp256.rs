//! P-256 key generation, ECDH and ECDSA (SHA-256, DER signatures) in each library, behind one trait.
//!
//! Every implementation takes and returns the wire forms a TLS 1.3 peer sees: public keys as SEC1 uncompressed
//! points (65 bytes), signatures as DER. So "verify with an unknown key" and "ECDH" include parsing and validating
//! the peer's point, as they do in a handshake.

use crate::Rejected;

/// A SEC1 uncompressed point: `0x04 || x || y`.
pub type Sec1Point = [u8; 65];

/// One library's P-256.
pub trait P256 {
    /// The benchmark function id and table column: `openssl`, `aws-lc-rs`, `ring`, `rustcrypto`.
    const ID: &'static str;
    /// An ECDH private key, good for one agreement (ring only has single-use ECDH keys).
    type EcdhSecret;
    /// An ECDSA private key.
    type SigningKey;

    /// Draws a private key from the library's own RNG and computes its public point.
    fn ecdh_keygen() -> (Self::EcdhSecret, Sec1Point);
    /// Parses and validates the peer's point, and returns the x coordinate of the shared point.
    fn ecdh(secret: Self::EcdhSecret, peer: &[u8]) -> Result<[u8; 32], Rejected>;

    /// A signing key and its public point (a fixture, not measured).
    fn signing_key() -> (Self::SigningKey, Sec1Point);
    /// ECDSA with SHA-256 over `msg`, DER-encoded.
    fn sign(key: &Self::SigningKey, msg: &[u8]) -> Vec<u8>;
    /// Parses `public` (a key never seen before) and verifies `sig` over `msg`.
    fn verify(public: &[u8], msg: &[u8], sig: &[u8]) -> bool;
}

/// A library that can keep a parsed public key and verify with it many times (a registered CA's key).
pub trait P256ParsedVerify: P256 {
    /// A parsed, validated public key.
    type VerifyingKey;
    fn parse_verifying_key(public: &[u8]) -> Result<Self::VerifyingKey, Rejected>;
    fn verify_parsed(key: &Self::VerifyingKey, msg: &[u8], sig: &[u8]) -> bool;
}

/// The context string of a server's TLS 1.3 CertificateVerify.
pub const SERVER_CONTEXT: &[u8] = b"TLS 1.3, server CertificateVerify";
/// The context string of a client's TLS 1.3 CertificateVerify.
pub const CLIENT_CONTEXT: &[u8] = b"TLS 1.3, client CertificateVerify";

/// The message signed in a TLS 1.3 CertificateVerify: 64 spaces, the context string, a zero byte and a SHA-256
/// transcript hash (130 bytes). Every library hashes it with SHA-256 inside the signature.
pub fn certificate_verify_message(context: &[u8], transcript_hash: &[u8; 32]) -> Vec<u8> {
    let mut msg = vec![0x20; 64];
    msg.extend_from_slice(context);
    msg.push(0);
    msg.extend_from_slice(transcript_hash);
    msg
}

fn to_point(bytes: &[u8]) -> Sec1Point {
    bytes
        .try_into()
        .expect("an uncompressed P-256 point is 65 bytes")
}

/// OpenSSL through the `openssl` crate (the system libcrypto; nistz256 assembly on x86-64 and ARM64).
///
/// Uses the EVP interfaces an application uses (`Signer`, `Verifier`, `Deriver`), with the curve group built once.
#[derive(Debug)]
pub struct Openssl;

mod ossl {
    use openssl::bn::BigNumContext;
    use openssl::ec::{EcGroup, EcKey, EcPoint, PointConversionForm};
    use openssl::nid::Nid;
    use openssl::pkey::{PKey, Public};
    use std::sync::OnceLock;

    pub fn group() -> &'static EcGroup {
        static GROUP: OnceLock<EcGroup> = OnceLock::new();
        GROUP.get_or_init(|| {
            EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).expect("OpenSSL knows P-256")
        })
    }

    pub fn encode<T: openssl::pkey::HasPublic>(key: &EcKey<T>) -> super::Sec1Point {
        let mut ctx = BigNumContext::new().expect("BN_CTX_new");
        let bytes = key
            .public_key()
            .to_bytes(group(), PointConversionForm::UNCOMPRESSED, &mut ctx)
            .expect("encode point");
        super::to_point(&bytes)
    }

    /// `EC_POINT_oct2point` checks that the point is on the curve.
    pub fn parse(bytes: &[u8]) -> Option<PKey<Public>> {
        let mut ctx = BigNumContext::new().ok()?;
        let point = EcPoint::from_bytes(group(), bytes, &mut ctx).ok()?;
        let key = EcKey::from_public_key(group(), &point).ok()?;
        PKey::from_ec_key(key).ok()
    }
}

impl P256 for Openssl {
    const ID: &'static str = "openssl";
    type EcdhSecret = openssl::pkey::PKey<openssl::pkey::Private>;
    type SigningKey = openssl::pkey::PKey<openssl::pkey::Private>;

    fn ecdh_keygen() -> (Self::EcdhSecret, Sec1Point) {
        let key = openssl::ec::EcKey::generate(ossl::group()).expect("EC_KEY_generate_key");
        let public = ossl::encode(&key);
        (
            openssl::pkey::PKey::from_ec_key(key).expect("EVP_PKEY"),
            public,
        )
    }

    /// The peer's point is checked to be on the curve when parsed, as in the other libraries; the full public
    /// key check `set_peer` would add (a multiplication by the group order, redundant for P-256 whose cofactor
    /// is 1) is left out. The `openssl-paths/ecdh` bench measures what it costs.
    fn ecdh(secret: Self::EcdhSecret, peer: &[u8]) -> Result<[u8; 32], Rejected> {
        let peer = ossl::parse(peer).ok_or(Rejected)?;
        let mut deriver = openssl::derive::Deriver::new(&secret).map_err(|_| Rejected)?;
        deriver.set_peer_ex(&peer, false).map_err(|_| Rejected)?;
        let mut shared = [0u8; 32];
        match deriver.derive(&mut shared) {
            Ok(32) => Ok(shared),
            _ => Err(Rejected),
        }
    }

    fn signing_key() -> (Self::SigningKey, Sec1Point) {
        Self::ecdh_keygen()
    }

    fn sign(key: &Self::SigningKey, msg: &[u8]) -> Vec<u8> {
        let mut signer = openssl::sign::Signer::new(openssl::hash::MessageDigest::sha256(), key)
            .expect("signer");
        signer.sign_oneshot_to_vec(msg).expect("ECDSA sign")
    }

    fn verify(public: &[u8], msg: &[u8], sig: &[u8]) -> bool {
        ossl::parse(public).is_some_and(|key| Self::verify_parsed(&key, msg, sig))
    }
}

impl P256ParsedVerify for Openssl {
    type VerifyingKey = openssl::pkey::PKey<openssl::pkey::Public>;

    fn parse_verifying_key(public: &[u8]) -> Result<Self::VerifyingKey, Rejected> {
        ossl::parse(public).ok_or(Rejected)
    }

    fn verify_parsed(key: &Self::VerifyingKey, msg: &[u8], sig: &[u8]) -> bool {
        openssl::sign::Verifier::new(openssl::hash::MessageDigest::sha256(), key)
            .and_then(|mut v| v.verify_oneshot(sig, msg))
            .unwrap_or(false)
    }
}

/// aws-lc-rs (AWS-LC, a BoringSSL fork; nistz256 assembly).
#[derive(Debug)]
pub struct AwsLc;

impl P256 for AwsLc {
    const ID: &'static str = "aws-lc-rs";
    type EcdhSecret = aws_lc_rs::agreement::PrivateKey;
    type SigningKey = aws_lc_rs::signature::EcdsaKeyPair;

    fn ecdh_keygen() -> (Self::EcdhSecret, Sec1Point) {
        use aws_lc_rs::agreement::{PrivateKey, ECDH_P256};
        let key = PrivateKey::generate(&ECDH_P256).expect("P-256 keygen");
        let public = to_point(key.compute_public_key().expect("public key").as_ref());
        (key, public)
    }

    fn ecdh(secret: Self::EcdhSecret, peer: &[u8]) -> Result<[u8; 32], Rejected> {
        use aws_lc_rs::agreement::{agree, UnparsedPublicKey, ECDH_P256};
        agree(
            &secret,
            UnparsedPublicKey::new(&ECDH_P256, peer),
            Rejected,
            |shared| shared.try_into().map_err(|_| Rejected),
        )
    }

    fn signing_key() -> (Self::SigningKey, Sec1Point) {
        use aws_lc_rs::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
        let key = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_ASN1_SIGNING).expect("P-256 keygen");
        let public = to_point(key.public_key().as_ref());
        (key, public)
    }

    fn sign(key: &Self::SigningKey, msg: &[u8]) -> Vec<u8> {
        let rng = aws_lc_rs::rand::SystemRandom::new();
        key.sign(&rng, msg).expect("ECDSA sign").as_ref().to_vec()
    }

    fn verify(public: &[u8], msg: &[u8], sig: &[u8]) -> bool {
        use aws_lc_rs::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_ASN1};
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, public)
            .verify(msg, sig)
            .is_ok()
    }
}

impl P256ParsedVerify for AwsLc {
    type VerifyingKey = aws_lc_rs::signature::ParsedPublicKey;

    fn parse_verifying_key(public: &[u8]) -> Result<Self::VerifyingKey, Rejected> {
        use aws_lc_rs::signature::{ParsedPublicKey, ECDSA_P256_SHA256_ASN1};
        ParsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, public).map_err(|_| Rejected)
    }

    fn verify_parsed(key: &Self::VerifyingKey, msg: &[u8], sig: &[u8]) -> bool {
        key.verify_sig(msg, sig).is_ok()
    }
}

/// ring (BoringSSL-derived nistz256 assembly). ring has no parsed-key verification: every `verify` parses.
#[derive(Debug)]
pub struct Ring;

fn ring_rng() -> &'static ring::rand::SystemRandom {
    static RNG: std::sync::OnceLock<ring::rand::SystemRandom> = std::sync::OnceLock::new();
    RNG.get_or_init(ring::rand::SystemRandom::new)
}

impl P256 for Ring {
    const ID: &'static str = "ring";
    type EcdhSecret = ring::agreement::EphemeralPrivateKey;
    type SigningKey = ring::signature::EcdsaKeyPair;

    fn ecdh_keygen() -> (Self::EcdhSecret, Sec1Point) {
        use ring::agreement::{EphemeralPrivateKey, ECDH_P256};
        let key = EphemeralPrivateKey::generate(&ECDH_P256, ring_rng()).expect("P-256 keygen");
        let public = to_point(key.compute_public_key().expect("public key").as_ref());
        (key, public)
    }

    fn ecdh(secret: Self::EcdhSecret, peer: &[u8]) -> Result<[u8; 32], Rejected> {
        use ring::agreement::{agree_ephemeral, UnparsedPublicKey, ECDH_P256};
        agree_ephemeral(
            secret,
            &UnparsedPublicKey::new(&ECDH_P256, peer),
            |shared| shared.try_into(),
        )
        .map_err(|_| Rejected)?
        .map_err(|_| Rejected)
    }

    fn signing_key() -> (Self::SigningKey, Sec1Point) {
        use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
        let rng = ring_rng();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, rng)
            .expect("P-256 keygen");
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), rng)
            .expect("PKCS#8");
        let public = to_point(key.public_key().as_ref());
        (key, public)
    }

    fn sign(key: &Self::SigningKey, msg: &[u8]) -> Vec<u8> {
        key.sign(ring_rng(), msg)
            .expect("ECDSA sign")
            .as_ref()
            .to_vec()
    }

    fn verify(public: &[u8], msg: &[u8], sig: &[u8]) -> bool {
        use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_ASN1};
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, public)
            .verify(msg, sig)
            .is_ok()
    }
}

/// RustCrypto `p256` (portable Rust, no assembly). Signatures use RFC 6979 deterministic nonces, the crate's
/// default `Signer`.
#[derive(Debug)]
pub struct RustCrypto;

impl P256 for RustCrypto {
    const ID: &'static str = "rustcrypto";
    type EcdhSecret = p256::ecdh::EphemeralSecret;
    type SigningKey = p256::ecdsa::SigningKey;

    fn ecdh_keygen() -> (Self::EcdhSecret, Sec1Point) {
        use p256::elliptic_curve::{sec1::ToSec1Point, Generate};
        let secret = p256::ecdh::EphemeralSecret::generate();
        let public = to_point(secret.public_key().to_sec1_point(false).as_bytes());
        (secret, public)
    }

    fn ecdh(secret: Self::EcdhSecret, peer: &[u8]) -> Result<[u8; 32], Rejected> {
        let peer = p256::PublicKey::from_sec1_bytes(peer).map_err(|_| Rejected)?;
        Ok(secret
            .diffie_hellman(&peer)
            .raw_secret_bytes()
            .as_slice()
            .try_into()
            .expect("32 bytes"))
    }

    fn signing_key() -> (Self::SigningKey, Sec1Point) {
        use p256::elliptic_curve::Generate;
        let key = p256::ecdsa::SigningKey::generate();
        let public = to_point(key.verifying_key().to_sec1_point(false).as_bytes());
        (key, public)
    }

    fn sign(key: &Self::SigningKey, msg: &[u8]) -> Vec<u8> {
        use p256::ecdsa::signature::Signer;
        let sig: p256::ecdsa::Signature = key.sign(msg);
        sig.to_der().as_bytes().to_vec()
    }

    fn verify(public: &[u8], msg: &[u8], sig: &[u8]) -> bool {
        Self::parse_verifying_key(public).is_ok_and(|key| Self::verify_parsed(&key, msg, sig))
    }
}

impl P256ParsedVerify for RustCrypto {
    type VerifyingKey = p256::ecdsa::VerifyingKey;

    fn parse_verifying_key(public: &[u8]) -> Result<Self::VerifyingKey, Rejected> {
        p256::ecdsa::VerifyingKey::from_sec1_bytes(public).map_err(|_| Rejected)
    }

    fn verify_parsed(key: &Self::VerifyingKey, msg: &[u8], sig: &[u8]) -> bool {
        use p256::ecdsa::signature::Verifier;
        p256::ecdsa::Signature::from_der(sig).is_ok_and(|sig| key.verify(msg, &sig).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<B: P256ParsedVerify>() {
        let (key, public) = B::signing_key();
        let msg = certificate_verify_message(SERVER_CONTEXT, &[7; 32]);
        let sig = B::sign(&key, &msg);
        assert!(B::verify(&public, &msg, &sig), "{}", B::ID);
        let parsed = B::parse_verifying_key(&public).unwrap();
        assert!(B::verify_parsed(&parsed, &msg, &sig), "{}", B::ID);
        assert!(
            !B::verify_parsed(&parsed, b"another message", &sig),
            "{}",
            B::ID
        );
    }

    #[test]
    fn each_library_verifies_its_own_signature() {
        round_trip::<Openssl>();
        round_trip::<AwsLc>();
        round_trip::<RustCrypto>();
        let (key, public) = Ring::signing_key();
        let sig = Ring::sign(&key, b"m");
        assert!(Ring::verify(&public, b"m", &sig));
    }

    #[test]
    fn a_point_off_the_curve_is_rejected() {
        let (_, mut public) = Openssl::ecdh_keygen();
        public[64] ^= 1;
        assert_eq!(
            Openssl::ecdh(Openssl::ecdh_keygen().0, &public),
            Err(Rejected)
        );
        assert_eq!(AwsLc::ecdh(AwsLc::ecdh_keygen().0, &public), Err(Rejected));
        assert_eq!(Ring::ecdh(Ring::ecdh_keygen().0, &public), Err(Rejected));
        assert_eq!(
            RustCrypto::ecdh(RustCrypto::ecdh_keygen().0, &public),
            Err(Rejected)
        );
    }

    #[test]
    fn the_certificate_verify_message_has_the_tls_shape() {
        let msg = certificate_verify_message(CLIENT_CONTEXT, &[0; 32]);
        assert_eq!(msg.len(), 130);
        assert_eq!(msg[97], 0);
    }
}
