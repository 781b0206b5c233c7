//! X25519 key generation and agreement in each library, behind one trait.
//!
//! Key generation includes computing the public key (what a TLS key share or a sealed-link sender puts on the
//! wire); agreement takes the peer's 32 raw bytes and refuses an all-zero result (a low-order peer point), as
//! OpenSSL and AWS-LC do on their own.

use crate::Rejected;

/// One library's X25519.
pub trait X25519 {
    /// The benchmark function id and table column.
    const ID: &'static str;
    /// A private key, good for one agreement (ring's keys are single-use).
    type Secret;

    fn keygen() -> (Self::Secret, [u8; 32]);
    fn agree(secret: Self::Secret, peer: &[u8; 32]) -> Result<[u8; 32], Rejected>;
}

/// x25519-dalek (portable Rust; the X25519 the hpke crate and the seeds' Rust code use).
#[derive(Debug)]
pub struct Dalek;

impl X25519 for Dalek {
    const ID: &'static str = "x25519-dalek";
    type Secret = x25519_dalek::EphemeralSecret;

    fn keygen() -> (Self::Secret, [u8; 32]) {
        let secret = x25519_dalek::EphemeralSecret::random();
        let public = x25519_dalek::PublicKey::from(&secret).to_bytes();
        (secret, public)
    }

    fn agree(secret: Self::Secret, peer: &[u8; 32]) -> Result<[u8; 32], Rejected> {
        let shared = secret.diffie_hellman(&x25519_dalek::PublicKey::from(*peer));
        if shared.was_contributory() {
            Ok(shared.to_bytes())
        } else {
            Err(Rejected)
        }
    }
}

/// OpenSSL through the `openssl` crate (EVP_PKEY X25519).
#[derive(Debug)]
pub struct Openssl;

impl X25519 for Openssl {
    const ID: &'static str = "openssl";
    type Secret = openssl::pkey::PKey<openssl::pkey::Private>;

    fn keygen() -> (Self::Secret, [u8; 32]) {
        let key = openssl::pkey::PKey::generate_x25519().expect("X25519 keygen");
        let public = key.raw_public_key().expect("raw public key");
        (key, public.as_slice().try_into().expect("32 bytes"))
    }

    fn agree(secret: Self::Secret, peer: &[u8; 32]) -> Result<[u8; 32], Rejected> {
        let peer = openssl::pkey::PKey::public_key_from_raw_bytes(peer, openssl::pkey::Id::X25519)
            .map_err(|_| Rejected)?;
        let mut deriver = openssl::derive::Deriver::new(&secret).map_err(|_| Rejected)?;
        deriver.set_peer(&peer).map_err(|_| Rejected)?;
        let mut shared = [0u8; 32];
        match deriver.derive(&mut shared) {
            Ok(32) => Ok(shared),
            _ => Err(Rejected),
        }
    }
}

/// aws-lc-rs.
#[derive(Debug)]
pub struct AwsLc;

impl X25519 for AwsLc {
    const ID: &'static str = "aws-lc-rs";
    type Secret = aws_lc_rs::agreement::PrivateKey;

    fn keygen() -> (Self::Secret, [u8; 32]) {
        let key = aws_lc_rs::agreement::PrivateKey::generate(&aws_lc_rs::agreement::X25519)
            .expect("keygen");
        let public = key.compute_public_key().expect("public key");
        (key, public.as_ref().try_into().expect("32 bytes"))
    }

    fn agree(secret: Self::Secret, peer: &[u8; 32]) -> Result<[u8; 32], Rejected> {
        use aws_lc_rs::agreement::{agree, UnparsedPublicKey, X25519};
        agree(
            &secret,
            UnparsedPublicKey::new(&X25519, peer),
            Rejected,
            |shared| shared.try_into().map_err(|_| Rejected),
        )
    }
}

/// ring (used by the handshake estimate of the ring backend).
#[derive(Debug)]
pub struct Ring;

impl X25519 for Ring {
    const ID: &'static str = "ring";
    type Secret = ring::agreement::EphemeralPrivateKey;

    fn keygen() -> (Self::Secret, [u8; 32]) {
        let rng = ring::rand::SystemRandom::new();
        let key = ring::agreement::EphemeralPrivateKey::generate(&ring::agreement::X25519, &rng)
            .expect("keygen");
        let public = key.compute_public_key().expect("public key");
        (key, public.as_ref().try_into().expect("32 bytes"))
    }

    fn agree(secret: Self::Secret, peer: &[u8; 32]) -> Result<[u8; 32], Rejected> {
        use ring::agreement::{agree_ephemeral, UnparsedPublicKey, X25519};
        agree_ephemeral(secret, &UnparsedPublicKey::new(&X25519, peer), |shared| {
            shared.try_into()
        })
        .map_err(|_| Rejected)?
        .map_err(|_| Rejected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refuses_a_low_order_point<X: X25519>() {
        // the identity's u-coordinate: every scalar multiple of it is zero
        assert_eq!(
            X::agree(X::keygen().0, &[0; 32]),
            Err(Rejected),
            "{}",
            X::ID
        );
    }

    #[test]
    fn a_low_order_peer_point_is_refused() {
        refuses_a_low_order_point::<Dalek>();
        refuses_a_low_order_point::<Openssl>();
        refuses_a_low_order_point::<AwsLc>();
        refuses_a_low_order_point::<Ring>();
    }
}
