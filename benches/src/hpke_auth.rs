//! HPKE (RFC 9180) in auth mode with DHKEM(X25519, HKDF-SHA256) and HKDF-SHA256, through the `hpke` crate: the
//! construction of the `pure:hpke-*` variants. A sender proves its static key by the KEM, without a signature.

use hpke::{Deserializable, Kem as _, OpModeR, OpModeS, Serializable};

pub use hpke::aead::{AesGcm128, ChaCha20Poly1305};
pub type Kem = hpke::kem::X25519HkdfSha256;
pub type Kdf = hpke::kdf::HkdfSha256;
pub type PrivateKey = <Kem as hpke::Kem>::PrivateKey;
pub type PublicKey = <Kem as hpke::Kem>::PublicKey;
pub type EncappedKey = <Kem as hpke::Kem>::EncappedKey;
pub type SenderContext<A> = hpke::aead::AeadCtxS<A, Kdf, Kem>;
pub type ReceiverContext<A> = hpke::aead::AeadCtxR<A, Kdf, Kem>;
pub type Tag<A> = hpke::aead::AeadTag<A>;
pub use hpke::HpkeError;

/// The `info` both sides bind into the key schedule.
pub const INFO: &[u8] = b"transport-bench hpke auth";

/// A sender and a receiver, each with a static X25519 key pair, that know each other's public key.
#[derive(Clone)]
pub struct Parties {
    pub sender: (PrivateKey, PublicKey),
    pub receiver: (PrivateKey, PublicKey),
}

impl std::fmt::Debug for Parties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parties").finish_non_exhaustive()
    }
}

impl Parties {
    pub fn generate() -> Self {
        let mut rng = rand::rng();
        Parties {
            sender: Kem::gen_keypair_with_rng(&mut rng),
            receiver: Kem::gen_keypair_with_rng(&mut rng),
        }
    }

    /// The sender's setup: an ephemeral key, two X25519 (ephemeral and static with the receiver's key) and the
    /// key schedule.
    pub fn setup_sender<A: hpke::aead::Aead>(&self) -> (EncappedKey, SenderContext<A>) {
        let mode = OpModeS::Auth((self.sender.0.clone(), self.sender.1.clone()));
        hpke::setup_sender_with_rng::<A, Kdf, Kem>(&mode, &self.receiver.1, INFO, &mut rand::rng())
            .expect("HPKE sender setup")
    }

    /// The receiver's setup: two X25519 with its static key (against the encapsulated key and the sender's
    /// static key) and the key schedule. Fails when `sender` is not the key that sealed.
    pub fn setup_receiver<A: hpke::aead::Aead>(
        &self,
        sender: &PublicKey,
        encapped: &EncappedKey,
    ) -> Result<ReceiverContext<A>, HpkeError> {
        hpke::setup_receiver::<A, Kdf, Kem>(
            &OpModeR::Auth(sender.clone()),
            &self.receiver.0,
            encapped,
            INFO,
        )
    }
}

/// A tag as bytes, for tampering with it in tests.
pub fn tag_bytes<A: hpke::aead::Aead>(tag: &Tag<A>) -> Vec<u8> {
    tag.to_bytes().to_vec()
}

/// A tag from bytes.
pub fn tag_from_bytes<A: hpke::aead::Aead>(bytes: &[u8]) -> Result<Tag<A>, HpkeError> {
    Tag::<A>::from_bytes(bytes)
}
