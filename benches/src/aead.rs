//! AES-128-GCM and ChaCha20-Poly1305 in each library, in place with a detached 16-byte tag.

use crate::Rejected;

/// The two AEADs HPKE and TLS 1.3 use here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Aes128Gcm,
    ChaCha20Poly1305,
}

impl Algorithm {
    pub const ALL: [Algorithm; 2] = [Algorithm::Aes128Gcm, Algorithm::ChaCha20Poly1305];

    /// The name in benchmark ids: `aes128gcm`, `chacha20poly1305`.
    pub fn id(self) -> &'static str {
        match self {
            Algorithm::Aes128Gcm => "aes128gcm",
            Algorithm::ChaCha20Poly1305 => "chacha20poly1305",
        }
    }

    pub fn key_len(self) -> usize {
        match self {
            Algorithm::Aes128Gcm => 16,
            Algorithm::ChaCha20Poly1305 => 32,
        }
    }
}

pub type Nonce = [u8; 12];
pub type Tag = [u8; 16];

/// One library's AEAD with a key already expanded.
pub trait Aead: Sized {
    /// The benchmark function id and table column.
    const ID: &'static str;

    /// `key` must be `alg.key_len()` bytes.
    fn new(alg: Algorithm, key: &[u8]) -> Self;
    fn seal(&self, nonce: &Nonce, aad: &[u8], buf: &mut [u8]) -> Tag;
    fn open(&self, nonce: &Nonce, aad: &[u8], buf: &mut [u8], tag: &Tag) -> Result<(), Rejected>;
}

/// RustCrypto `aes-gcm` and `chacha20poly1305` (portable Rust, with AES-NI/CLMUL and SIMD picked at run time).
pub enum RustCrypto {
    Aes128Gcm(aes_gcm::Aes128Gcm),
    ChaCha20Poly1305(chacha20poly1305::ChaCha20Poly1305),
}

impl Aead for RustCrypto {
    const ID: &'static str = "rustcrypto";

    fn new(alg: Algorithm, key: &[u8]) -> Self {
        use aes_gcm::KeyInit;
        match alg {
            Algorithm::Aes128Gcm => {
                RustCrypto::Aes128Gcm(aes_gcm::Aes128Gcm::new_from_slice(key).unwrap())
            }
            Algorithm::ChaCha20Poly1305 => RustCrypto::ChaCha20Poly1305(
                chacha20poly1305::ChaCha20Poly1305::new_from_slice(key).unwrap(),
            ),
        }
    }

    fn seal(&self, nonce: &Nonce, aad: &[u8], buf: &mut [u8]) -> Tag {
        use aes_gcm::AeadInOut;
        let tag = match self {
            RustCrypto::Aes128Gcm(c) => c.encrypt_inout_detached(nonce.into(), aad, buf.into()),
            RustCrypto::ChaCha20Poly1305(c) => {
                c.encrypt_inout_detached(nonce.into(), aad, buf.into())
            }
        };
        tag.expect("a record under 64 GiB").into()
    }

    fn open(&self, nonce: &Nonce, aad: &[u8], buf: &mut [u8], tag: &Tag) -> Result<(), Rejected> {
        use aes_gcm::AeadInOut;
        match self {
            RustCrypto::Aes128Gcm(c) => {
                c.decrypt_inout_detached(nonce.into(), aad, buf.into(), tag.into())
            }
            RustCrypto::ChaCha20Poly1305(c) => {
                c.decrypt_inout_detached(nonce.into(), aad, buf.into(), tag.into())
            }
        }
        .map_err(|_| Rejected)
    }
}

/// ring `LessSafeKey` (BoringSSL-derived assembly).
#[derive(Debug)]
pub struct Ring(ring::aead::LessSafeKey);

impl Aead for Ring {
    const ID: &'static str = "ring";

    fn new(alg: Algorithm, key: &[u8]) -> Self {
        let alg = match alg {
            Algorithm::Aes128Gcm => &ring::aead::AES_128_GCM,
            Algorithm::ChaCha20Poly1305 => &ring::aead::CHACHA20_POLY1305,
        };
        Ring(ring::aead::LessSafeKey::new(
            ring::aead::UnboundKey::new(alg, key).unwrap(),
        ))
    }

    fn seal(&self, nonce: &Nonce, aad: &[u8], buf: &mut [u8]) -> Tag {
        let nonce = ring::aead::Nonce::assume_unique_for_key(*nonce);
        let tag = self
            .0
            .seal_in_place_separate_tag(nonce, ring::aead::Aad::from(aad), buf)
            .expect("seal");
        tag.as_ref().try_into().expect("16-byte tag")
    }

    fn open(&self, nonce: &Nonce, aad: &[u8], buf: &mut [u8], tag: &Tag) -> Result<(), Rejected> {
        let nonce = ring::aead::Nonce::assume_unique_for_key(*nonce);
        let tag = ring::aead::Tag::from(*tag);
        self.0
            .open_in_place_separate_tag(nonce, ring::aead::Aad::from(aad), tag, buf, 0..)
            .map(|_| ())
            .map_err(|_| Rejected)
    }
}

/// aws-lc-rs `LessSafeKey`.
#[derive(Debug)]
pub struct AwsLc(aws_lc_rs::aead::LessSafeKey);

impl Aead for AwsLc {
    const ID: &'static str = "aws-lc-rs";

    fn new(alg: Algorithm, key: &[u8]) -> Self {
        let alg = match alg {
            Algorithm::Aes128Gcm => &aws_lc_rs::aead::AES_128_GCM,
            Algorithm::ChaCha20Poly1305 => &aws_lc_rs::aead::CHACHA20_POLY1305,
        };
        AwsLc(aws_lc_rs::aead::LessSafeKey::new(
            aws_lc_rs::aead::UnboundKey::new(alg, key).unwrap(),
        ))
    }

    fn seal(&self, nonce: &Nonce, aad: &[u8], buf: &mut [u8]) -> Tag {
        let nonce = aws_lc_rs::aead::Nonce::assume_unique_for_key(*nonce);
        let tag = self
            .0
            .seal_in_place_separate_tag(nonce, aws_lc_rs::aead::Aad::from(aad), buf)
            .expect("seal");
        tag.as_ref().try_into().expect("16-byte tag")
    }

    fn open(&self, nonce: &Nonce, aad: &[u8], buf: &mut [u8], tag: &Tag) -> Result<(), Rejected> {
        let nonce = aws_lc_rs::aead::Nonce::assume_unique_for_key(*nonce);
        self.0
            .open_in_place_separate_tag(nonce, aws_lc_rs::aead::Aad::from(aad), tag, buf)
            .map(|_| ())
            .map_err(|_| Rejected)
    }
}
