//! The key schedule of Pure sealed links and the seal/open of records and answers.
//!
//! Every sealed kind ends in the same two keys per wire (sender → receiver path):
//!
//! - a **record key**, an AES-256-GCM key; record number `n` of op `op` is sealed with nonce `op u32 ‖ n`
//!   (big-endian; an order's number is its seq and its op 0) and the record header as associated data;
//! - an **answer secret**, from which the answer key of a receiver run `R` is `HKDF-Expand(secret, "pure/1 answer
//!   key" ‖ R)`; the answer to record `n` of op `op` is a tag over the answer header with nonce `op u32 ‖ n`.
//!
//! Deliveries (receiver → device) use two more keys per (wire, receiver run), from the same answer secret
//! ([`DeliverKeys`]): `"pure/1 deliver key" ‖ R` seals them, `"pure/1 deliver answer" ‖ R` tags the device's
//! answers. `hpke-per-request` deliveries take the answer secret of a setup of their own, from the receiver's static
//! key to the device's (info `"pure/1 delivery"`). Each key is used by one side for one purpose.
//!
//! How the two are obtained depends on the kind:
//!
//! - `HpkeSession` / `HpkePerRequest`: an RFC 9180 HPKE setup in auth mode (DHKEM X25519-HKDF-SHA256, HKDF-SHA256,
//!   export-only AEAD) from the sender's static key to the receiver's static key; both keys are taken from the
//!   context's exporter (`"pure/1 record key"`, `"pure/1 answer secret"`). HPKE contexts number their own seals
//!   and cannot open record `n` directly; exporting a key and using the record number as the nonce can, in any order
//!   and after a receiver restart. A session lives for one sender run; per-request sets up one per record.
//! - `Link`: a link secret `L = HKDF(salt = "pure/1 link", ikm = X25519(sender, receiver), info = pk_s ‖ pk_r)` from
//!   the two static keys; record key `HKDF-Expand(L, "pure/1 record" ‖ sender run ‖ receiver run)`, answer secret
//!   `HKDF-Expand(L, "pure/1 answer" ‖ sender run)`.
//!
//! `docs/pure.md` explains why a nonce never repeats under one key.

use crate::wire::{Head, KeyId, Op, ENC_LEN, TAG_LEN};
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use hkdf::Hkdf;
use hpke::{Deserializable, OpModeR, OpModeS, Serializable};
use rand_core::CryptoRng;
use sha2::Sha256;
use std::path::Path;
use std::sync::Arc;
use transport_core::keys::{self, KeyFileError};
use x25519_dalek::{PublicKey, StaticSecret};

type Kem = hpke::kem::X25519HkdfSha256;
type Kdf = hpke::kdf::HkdfSha256;
type ExportOnly = hpke::aead::ExportOnlyAead;

const HPKE_INFO: &[u8] = b"pure/1 sealed link";
/// The info of setups from the receiver to a device (`hpke-per-request` deliveries): never the same key schedule
/// as a device's setup, whichever keys are involved.
const HPKE_DELIVERY_INFO: &[u8] = b"pure/1 delivery";

/// A node's static X25519 key.
#[derive(Clone)]
pub struct NodeKey {
    secret: StaticSecret,
    public: [u8; 32],
}

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeKey({})", hex::encode(self.public))
    }
}

impl NodeKey {
    /// A new random key.
    pub fn generate<R: CryptoRng>(rng: &mut R) -> NodeKey {
        let mut bytes = [0u8; 32];
        rng.fill_bytes(&mut bytes);
        NodeKey::from_secret(bytes)
    }

    /// The key with these secret bytes.
    pub fn from_secret(bytes: [u8; 32]) -> NodeKey {
        let secret = StaticSecret::from(bytes);
        let public = PublicKey::from(&secret).to_bytes();
        NodeKey { secret, public }
    }

    /// Read a key file (64 hex digits).
    pub fn load(path: &Path) -> Result<NodeKey, KeyFileError> {
        Ok(NodeKey::from_secret(keys::read_key32(path)?))
    }

    /// Write the key file, mode 0600.
    pub fn save(&self, path: &Path) -> Result<(), KeyFileError> {
        keys::write_secret(path, hex::encode(self.secret.to_bytes()).as_bytes())
    }

    /// The public key.
    pub fn public(&self) -> &[u8; 32] {
        &self.public
    }

    /// The key id that names this key in record headers.
    pub fn key_id(&self) -> KeyId {
        crate::wire::key_id(&self.public)
    }

    /// The secret bytes (to build the HPKE private key).
    fn secret_bytes(&self) -> [u8; 32] {
        self.secret.to_bytes()
    }

    /// X25519 with a peer's public key: one scalar multiplication. An all-zero result (the peer's key is a point
    /// of small order) is refused, as RFC 7748 section 6.1 allows and RFC 9180 section 7.1.4 requires.
    pub fn agree(&self, peer: &[u8; 32]) -> Result<[u8; 32], LowOrderKey> {
        let shared = self.secret.diffie_hellman(&PublicKey::from(*peer));
        if shared.was_contributory() {
            Ok(shared.to_bytes())
        } else {
            Err(LowOrderKey)
        }
    }
}

/// A public key that is a point of small order: X25519 with it gives zero whatever the secret, so it proves nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the key is a point of small order (RFC 7748 section 6.1): no X25519 key pair has it")]
pub struct LowOrderKey;

/// The encodings of the points of small order on Curve25519 and its twist with the top bit cleared (X25519 ignores
/// it): 0, 1, the two points of order 8, p - 1, and p and p + 1 (non-canonical 0 and 1). The list libsodium refuses.
const LOW_ORDER: [[u8; 32]; 7] = {
    let order8a = [
        0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae, 0x16, 0x56, 0xe3, 0xfa, 0xf1, 0x9f, 0xc4,
        0x6a, 0xda, 0x09, 0x8d, 0xeb, 0x9c, 0x32, 0xb1, 0xfd, 0x86, 0x62, 0x05, 0x16, 0x5f, 0x49,
        0xb8, 0x00,
    ];
    let order8b = [
        0x5f, 0x9c, 0x95, 0xbc, 0xa3, 0x50, 0x8c, 0x24, 0xb1, 0xd0, 0xb1, 0x55, 0x9c, 0x83, 0xef,
        0x5b, 0x04, 0x44, 0x5c, 0xc4, 0x58, 0x1c, 0x8e, 0x86, 0xd8, 0x22, 0x4e, 0xdd, 0xd0, 0x9f,
        0x11, 0x57,
    ];
    let zero = [0u8; 32];
    let mut one = [0u8; 32];
    one[0] = 1;
    let mut p_minus_1 = [0xff; 32];
    p_minus_1[0] = 0xec;
    p_minus_1[31] = 0x7f;
    let mut p = p_minus_1;
    p[0] = 0xed;
    let mut p_plus_1 = p_minus_1;
    p_plus_1[0] = 0xee;
    [zero, one, order8a, order8b, p_minus_1, p, p_plus_1]
};

/// Refuse a public key of small order, before any X25519 is spent on it (a table lookup).
pub fn check_public(key: &[u8; 32]) -> Result<(), LowOrderKey> {
    let mut k = *key;
    k[31] &= 0x7f;
    if LOW_ORDER.contains(&k) {
        Err(LowOrderKey)
    } else {
        Ok(())
    }
}

/// Why a seal did not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// The HPKE setup failed (malformed or low-order encapsulated key).
    #[error("HPKE setup failed")]
    Setup,
    /// The tag did not verify: forged, tampered, or sealed with another key.
    #[error("the seal does not open")]
    Tag,
    /// The body is shorter than its tag (the parser refuses those; this is the check at use).
    #[error("sealed body too short")]
    Short,
}

/// A key that seals records (a wire's record key, or a wire's delivery key).
pub trait Sealer {
    /// Seal `parts` (concatenated) as record `number` of `op`: appended to `out`, whose bytes in `aad` are the
    /// associated data, then the tag.
    fn seal(
        &self,
        op: Op,
        number: u64,
        aad: std::ops::Range<usize>,
        parts: &[&[u8]],
        out: &mut Vec<u8>,
    );
}

/// Append a whole record to `out`: the header, then `fields ‖ payload` sealed with `key` (as they are, for plain).
pub fn put_record(
    out: &mut Vec<u8>,
    head: &Head<'_>,
    key: Option<&dyn Sealer>,
    fields: &[u8],
    payload: &[u8],
) {
    let header = head.put(out, fields.len() + payload.len());
    match key {
        Some(k) => k.seal(head.op, head.number, header, &[fields, payload], out),
        None => {
            out.extend_from_slice(fields);
            out.extend_from_slice(payload);
        }
    }
}

/// The keys of one wire.
#[derive(Clone)]
pub struct WireKeys {
    record: Arc<LessSafeKey>,
    answer_secret: [u8; 32],
}

/// The nonce of frame `number` of `op`: `op u32 ‖ number u64`. Every op counts its own numbers, so the op keeps two
/// counts that meet apart.
fn nonce(op: Op, number: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[..4].copy_from_slice(&(op as u32).to_be_bytes());
    n[4..].copy_from_slice(&number.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// Seal `parts` (concatenated) in place at the end of `out`, whose bytes in `aad` are the associated data; then
/// append the tag.
fn seal_into(
    key: &LessSafeKey,
    op: Op,
    number: u64,
    aad: std::ops::Range<usize>,
    parts: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let start = out.len();
    for p in parts {
        out.extend_from_slice(p);
    }
    let (head, body) = out.split_at_mut(start);
    let tag = key
        .seal_in_place_separate_tag(nonce(op, number), Aad::from(&head[aad]), body)
        .expect("records are far below the AEAD's length limit");
    out.extend_from_slice(tag.as_ref());
}

/// Open a body (ciphertext and tag) into its plaintext.
fn open_body(
    key: &LessSafeKey,
    op: Op,
    number: u64,
    aad: &[u8],
    body: &[u8],
) -> Result<Vec<u8>, OpenError> {
    let Some((ct, tag)) = body.split_last_chunk::<TAG_LEN>() else {
        return Err(OpenError::Short);
    };
    let mut plain = ct.to_vec();
    key.open_in_place_separate_tag(nonce(op, number), Aad::from(aad), tag, &mut plain)
        .map_err(|_| OpenError::Tag)?;
    Ok(plain)
}

/// An AES-256-GCM key (aws-lc-rs: AES-NI and carry-less multiplication where the CPU has them).
fn aead_key(bytes: &[u8; 32]) -> Arc<LessSafeKey> {
    Arc::new(LessSafeKey::new(
        UnboundKey::new(&AES_256_GCM, bytes).expect("32-byte key"),
    ))
}

fn expand(prk: &[u8; 32], info: &[&[u8]]) -> [u8; 32] {
    let hk = Hkdf::<Sha256>::from_prk(prk).expect("32-byte PRK");
    let mut out = [0u8; 32];
    hk.expand_multi_info(info, &mut out)
        .expect("32 bytes is a valid length");
    out
}

impl WireKeys {
    fn from_parts(record: [u8; 32], answer_secret: [u8; 32]) -> WireKeys {
        WireKeys {
            record: aead_key(&record),
            answer_secret,
        }
    }

    fn from_hpke_exporter(export: impl Fn(&[u8], &mut [u8])) -> WireKeys {
        let mut record = [0u8; 32];
        let mut answer = [0u8; 32];
        export(b"pure/1 record key", &mut record);
        export(b"pure/1 answer secret", &mut answer);
        WireKeys::from_parts(record, answer)
    }

    /// Sender side of an HPKE auth-mode setup: a new encapsulated key and the wire keys. Costs three X25519
    /// (ephemeral key generation, and agreement of the ephemeral and of the static key with the receiver's).
    pub fn hpke_sender<R: CryptoRng>(
        rng: &mut R,
        sender: &NodeKey,
        receiver: &[u8; 32],
    ) -> ([u8; ENC_LEN], WireKeys) {
        WireKeys::hpke_sender_info(rng, sender, receiver, HPKE_INFO)
    }

    /// Receiver side of an HPKE auth-mode setup for a record from `sender` carrying `enc`. Costs two X25519.
    pub fn hpke_receiver(
        receiver: &NodeKey,
        sender: &[u8; 32],
        enc: &[u8; ENC_LEN],
    ) -> Result<WireKeys, OpenError> {
        WireKeys::hpke_receiver_info(receiver, sender, enc, HPKE_INFO)
    }

    /// The receiver's side of the setup of one `hpke-per-request` delivery, from its static key to the device's
    /// (auth mode: the device knows the delivery is the receiver's). Costs three X25519.
    pub fn hpke_delivery_sender<R: CryptoRng>(
        rng: &mut R,
        receiver: &NodeKey,
        device: &[u8; 32],
    ) -> ([u8; ENC_LEN], WireKeys) {
        WireKeys::hpke_sender_info(rng, receiver, device, HPKE_DELIVERY_INFO)
    }

    /// The device's side of the setup of one `hpke-per-request` delivery. Costs two X25519.
    pub fn hpke_delivery_receiver(
        device: &NodeKey,
        receiver: &[u8; 32],
        enc: &[u8; ENC_LEN],
    ) -> Result<WireKeys, OpenError> {
        WireKeys::hpke_receiver_info(device, receiver, enc, HPKE_DELIVERY_INFO)
    }

    fn hpke_sender_info<R: CryptoRng>(
        rng: &mut R,
        sender: &NodeKey,
        receiver: &[u8; 32],
        info: &[u8],
    ) -> ([u8; ENC_LEN], WireKeys) {
        let (enc, ctx) = hpke_sender_context(rng, sender, receiver, info);
        let keys = WireKeys::from_hpke_exporter(|label, out| {
            ctx.export(label, out).expect("32-byte export")
        });
        (enc, keys)
    }

    fn hpke_receiver_info(
        receiver: &NodeKey,
        sender: &[u8; 32],
        enc: &[u8; ENC_LEN],
        info: &[u8],
    ) -> Result<WireKeys, OpenError> {
        let ctx = hpke_receiver_context(receiver, sender, enc, info)?;
        Ok(WireKeys::from_hpke_exporter(|label, out| {
            ctx.export(label, out).expect("32-byte export")
        }))
    }

    /// The keys of a link for one (sender run, receiver run): two HKDF-Expand, no asymmetric operation.
    pub fn link(link_secret: &[u8; 32], sender_run: u64, receiver_run: u64) -> WireKeys {
        let record = expand(
            link_secret,
            &[
                b"pure/1 record",
                &sender_run.to_be_bytes(),
                &receiver_run.to_be_bytes(),
            ],
        );
        let answer = expand(link_secret, &[b"pure/1 answer", &sender_run.to_be_bytes()]);
        WireKeys::from_parts(record, answer)
    }

    /// Open record `number` of `op`; returns its plaintext.
    pub fn open(&self, op: Op, number: u64, aad: &[u8], body: &[u8]) -> Result<Vec<u8>, OpenError> {
        open_body(&self.record, op, number, aad, body)
    }

    /// The answer key for a receiver run: one HKDF-Expand.
    pub fn answer_key(&self, receiver_run: u64) -> AnswerKey {
        self.run_key(b"pure/1 answer key", receiver_run)
    }

    /// The keys of the deliveries on this wire from a receiver run: two HKDF-Expand.
    pub fn deliver_keys(&self, receiver_run: u64) -> DeliverKeys {
        DeliverKeys {
            seal: self.run_key(b"pure/1 deliver key", receiver_run),
            answer: self.run_key(b"pure/1 deliver answer", receiver_run),
        }
    }

    fn run_key(&self, label: &[u8], receiver_run: u64) -> AnswerKey {
        let k = expand(&self.answer_secret, &[label, &receiver_run.to_be_bytes()]);
        AnswerKey {
            run: receiver_run,
            aead: aead_key(&k),
        }
    }
}

/// The sender's HPKE auth-mode setup (RFC 9180 section 5.1.3) with an ephemeral key from `rng`: the encapsulated
/// key and the context whose exporter gives the wire keys.
fn hpke_sender_context<R: CryptoRng>(
    rng: &mut R,
    sender: &NodeKey,
    receiver: &[u8; 32],
    info: &[u8],
) -> ([u8; ENC_LEN], hpke::aead::AeadCtxS<ExportOnly, Kdf, Kem>) {
    let sk =
        <Kem as hpke::Kem>::PrivateKey::from_bytes(&sender.secret_bytes()).expect("32-byte key");
    let pk = <Kem as hpke::Kem>::PublicKey::from_bytes(sender.public()).expect("32-byte key");
    let pk_r = <Kem as hpke::Kem>::PublicKey::from_bytes(receiver).expect("32-byte key");
    let (enc, ctx) = hpke::setup_sender_with_rng::<ExportOnly, Kdf, Kem>(
        &OpModeS::Auth((sk, pk)),
        &pk_r,
        info,
        rng,
    )
    .expect("X25519 encapsulation to a valid key succeeds");
    let mut enc_bytes = [0u8; ENC_LEN];
    enc_bytes.copy_from_slice(&enc.to_bytes());
    (enc_bytes, ctx)
}

/// The receiver's side of [`hpke_sender_context`].
fn hpke_receiver_context(
    receiver: &NodeKey,
    sender: &[u8; 32],
    enc: &[u8; ENC_LEN],
    info: &[u8],
) -> Result<hpke::aead::AeadCtxR<ExportOnly, Kdf, Kem>, OpenError> {
    let sk =
        <Kem as hpke::Kem>::PrivateKey::from_bytes(&receiver.secret_bytes()).expect("32-byte key");
    let pk_s = <Kem as hpke::Kem>::PublicKey::from_bytes(sender).map_err(|_| OpenError::Setup)?;
    let enc = <Kem as hpke::Kem>::EncappedKey::from_bytes(enc).map_err(|_| OpenError::Setup)?;
    hpke::setup_receiver::<ExportOnly, Kdf, Kem>(&OpModeR::Auth(pk_s), &sk, &enc, info)
        .map_err(|_| OpenError::Setup)
}

/// The keys of the deliveries on one wire from one receiver run: one seals them (the receiver), the other tags the
/// device's answers to them.
#[derive(Clone)]
pub struct DeliverKeys {
    seal: AnswerKey,
    /// Tags the device's answers to deliveries.
    pub answer: AnswerKey,
}

impl DeliverKeys {
    /// The receiver run these keys are for.
    pub fn run(&self) -> u64 {
        self.seal.run
    }

    /// Open delivery `number` of `op`; returns its plaintext.
    pub fn open(&self, op: Op, number: u64, aad: &[u8], body: &[u8]) -> Result<Vec<u8>, OpenError> {
        open_body(&self.seal.aead, op, number, aad, body)
    }
}

impl Sealer for WireKeys {
    fn seal(
        &self,
        op: Op,
        number: u64,
        aad: std::ops::Range<usize>,
        parts: &[&[u8]],
        out: &mut Vec<u8>,
    ) {
        seal_into(&self.record, op, number, aad, parts, out);
    }
}

impl Sealer for DeliverKeys {
    fn seal(
        &self,
        op: Op,
        number: u64,
        aad: std::ops::Range<usize>,
        parts: &[&[u8]],
        out: &mut Vec<u8>,
    ) {
        seal_into(&self.seal.aead, op, number, aad, parts, out);
    }
}

/// The key that authenticates answers of one receiver run on one wire.
#[derive(Clone)]
pub struct AnswerKey {
    run: u64,
    aead: Arc<LessSafeKey>,
}

impl std::fmt::Debug for AnswerKey {
    /// The run only: never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerKey")
            .field("run", &self.run)
            .finish_non_exhaustive()
    }
}

impl AnswerKey {
    /// The receiver run this key is for.
    pub fn run(&self) -> u64 {
        self.run
    }

    /// The tag of the answer to record `number` of `op` (empty plaintext, the answer header as associated data).
    pub fn tag(&self, op: Op, number: u64, header: &[u8]) -> [u8; TAG_LEN] {
        let tag = self
            .aead
            .seal_in_place_separate_tag(nonce(op, number), Aad::from(header), &mut [])
            .expect("empty plaintext");
        tag.as_ref().try_into().expect("16-byte tag")
    }

    /// Whether `tag` authenticates the answer to record `number` of `op`.
    pub fn verify(&self, op: Op, number: u64, header: &[u8], tag: &[u8]) -> bool {
        tag.len() == TAG_LEN
            && self
                .aead
                .open_in_place_separate_tag(nonce(op, number), Aad::from(header), tag, &mut [])
                .is_ok()
    }
}

/// The link secret of a (sender, receiver) pair from the two static keys: one X25519 and one HKDF.
/// Either side computes the same value: the sender with the receiver's public key, the receiver with the sender's.
/// A peer key of small order (an all-zero X25519 result) is refused.
pub fn link_secret(
    own: &NodeKey,
    peer: &[u8; 32],
    sender_public: &[u8; 32],
    receiver_public: &[u8; 32],
) -> Result<[u8; 32], LowOrderKey> {
    let shared = own.agree(peer)?;
    let hk = Hkdf::<Sha256>::new(Some(b"pure/1 link"), &shared);
    let mut out = [0u8; 32];
    hk.expand_multi_info(&[sender_public, receiver_public], &mut out)
        .expect("32 bytes is a valid length");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{Sealer as _, *};
    use rand::{rngs::StdRng, SeedableRng};

    const ORDER: Op = Op::Order;

    #[test]
    fn hpke_both_sides_agree_and_bind_the_sender() {
        let mut rng = StdRng::seed_from_u64(1);
        let (s, r, other) = (
            NodeKey::generate(&mut rng),
            NodeKey::generate(&mut rng),
            NodeKey::generate(&mut rng),
        );
        let (enc, ks) = WireKeys::hpke_sender(&mut rng, &s, r.public());
        let kr = WireKeys::hpke_receiver(&r, s.public(), &enc).unwrap();
        let mut sealed = b"hdr".to_vec();
        ks.seal(
            ORDER,
            5,
            0..3,
            &[&42u64.to_be_bytes(), b"order"],
            &mut sealed,
        );
        let out = sealed.split_off(3);
        let mut want = 42u64.to_be_bytes().to_vec();
        want.extend_from_slice(b"order");
        assert_eq!(kr.open(ORDER, 5, b"hdr", &out).unwrap(), want);
        assert_eq!(
            kr.open(ORDER, 6, b"hdr", &out),
            Err(OpenError::Tag),
            "another number"
        );
        assert_eq!(
            kr.open(Op::Publish1, 5, b"hdr", &out),
            Err(OpenError::Tag),
            "another op"
        );
        assert_eq!(
            kr.open(ORDER, 5, b"hdR", &out),
            Err(OpenError::Tag),
            "another header"
        );
        // The receiver believing the record came from another sender derives other keys.
        let wrong = WireKeys::hpke_receiver(&r, other.public(), &enc).unwrap();
        assert_eq!(wrong.open(ORDER, 5, b"hdr", &out), Err(OpenError::Tag));
        let a = ks.answer_key(9);
        assert!(kr
            .answer_key(9)
            .verify(ORDER, 5, b"ans", &a.tag(ORDER, 5, b"ans")));
        assert!(!kr
            .answer_key(10)
            .verify(ORDER, 5, b"ans", &a.tag(ORDER, 5, b"ans")));
        assert!(!kr
            .answer_key(9)
            .verify(Op::Subscribe, 5, b"ans", &a.tag(ORDER, 5, b"ans")));
    }

    #[test]
    fn delivery_keys_are_per_receiver_run_and_apart_from_the_answer_key() {
        let mut rng = StdRng::seed_from_u64(3);
        let (s, r) = (NodeKey::generate(&mut rng), NodeKey::generate(&mut rng));
        let (enc, ks) = WireKeys::hpke_sender(&mut rng, &s, r.public());
        let kr = WireKeys::hpke_receiver(&r, s.public(), &enc).unwrap();
        let (at_receiver, at_device) = (kr.deliver_keys(7), ks.deliver_keys(7));
        let mut sealed = b"h".to_vec();
        at_receiver.seal(Op::Deliver1, 0, 0..1, &[b"msg"], &mut sealed);
        let body = sealed.split_off(1);
        assert_eq!(
            at_device.open(Op::Deliver1, 0, b"h", &body).unwrap(),
            b"msg"
        );
        assert!(ks
            .deliver_keys(8)
            .open(Op::Deliver1, 0, b"h", &body)
            .is_err());
        assert!(at_device.open(Op::Deliver0, 0, b"h", &body).is_err());
        // The device's answer verifies only under the delivery answer key, not the receiver's answer key.
        let tag = at_device.answer.tag(Op::Deliver1, 0, b"a");
        assert!(at_receiver.answer.verify(Op::Deliver1, 0, b"a", &tag));
        assert!(!kr.answer_key(7).verify(Op::Deliver1, 0, b"a", &tag));
        // A delivery setup from the receiver to the device is not a record setup with the roles swapped.
        let (enc, from_receiver) = WireKeys::hpke_delivery_sender(&mut rng, &r, s.public());
        let at_device = WireKeys::hpke_delivery_receiver(&s, r.public(), &enc).unwrap();
        let mut sealed = b"h".to_vec();
        from_receiver
            .deliver_keys(1)
            .seal(Op::Deliver0, 3, 0..1, &[b"x"], &mut sealed);
        let body = sealed.split_off(1);
        assert!(at_device
            .deliver_keys(1)
            .open(Op::Deliver0, 3, b"h", &body)
            .is_ok());
        let swapped = WireKeys::hpke_receiver(&s, r.public(), &enc).unwrap();
        assert!(swapped
            .deliver_keys(1)
            .open(Op::Deliver0, 3, b"h", &body)
            .is_err());
    }

    fn hex32(s: &str) -> [u8; 32] {
        hex::decode(s).unwrap().try_into().unwrap()
    }

    /// RFC 7748 section 6.1: both key pairs and the shared secret, through `NodeKey`.
    #[test]
    fn node_keys_follow_rfc_7748() {
        let alice = NodeKey::from_secret(hex32(
            "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
        ));
        let bob = NodeKey::from_secret(hex32(
            "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb",
        ));
        assert_eq!(
            alice.public(),
            &hex32("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
        );
        assert_eq!(
            bob.public(),
            &hex32("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
        );
        let shared = hex32("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");
        assert_eq!(alice.agree(bob.public()), Ok(shared));
        assert_eq!(bob.agree(alice.public()), Ok(shared));
        assert_eq!(alice.agree(&[0; 32]), Err(LowOrderKey));
    }

    /// An "RNG" that hands out fixed bytes: the ephemeral key's input (ikmE) of a published setup.
    struct Fixed(Vec<u8>);

    impl rand_core::TryRng for Fixed {
        type Error = std::convert::Infallible;
        fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
            unreachable!("HPKE draws the ephemeral key's input as bytes")
        }
        fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
            unreachable!("HPKE draws the ephemeral key's input as bytes")
        }
        fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
            assert!(
                dst.len() <= self.0.len(),
                "more bytes drawn than the vector has"
            );
            dst.copy_from_slice(&self.0[..dst.len()]);
            self.0.drain(..dst.len());
            Ok(())
        }
    }
    impl rand_core::TryCryptoRng for Fixed {}

    /// RFC 9180 appendix A.7.3: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, export-only AEAD, auth mode: the
    /// construction of `pure:hpke-*`, through the functions the wire keys come from. The sender's setup with the
    /// vector's ephemeral input gives its `enc`; both sides export its three values.
    #[test]
    fn hpke_setup_follows_rfc_9180_a_7_3() {
        let info = hex::decode("4f6465206f6e2061204772656369616e2055726e").unwrap();
        let ikm_e = hex::decode("43b078912a54b591a7b09b16ce89a1955a9dd60b29fb611e044260046e8b061b");
        let receiver = NodeKey::from_secret(hex32(
            "ed88cda0e91ca5da64b6ad7fc34a10f096fa92f0b9ceff9d2c55124304ed8b4a",
        ));
        let sender = NodeKey::from_secret(hex32(
            "c85f136e06d72d28314f0e34b10aadc8d297e9d71d45a5662c2b7c3b9f9f9405",
        ));
        assert_eq!(
            receiver.public(),
            &hex32("ffd7ac24694cb17939d95feb7c4c6539bb31621deb9b96d715a64abdd9d14b10")
        );
        assert_eq!(
            sender.public(),
            &hex32("89eb1feae431159a5250c5186f72a15962c8d0debd20a8389d8b6e4996e14306")
        );
        let mut rng = Fixed(ikm_e.unwrap());
        let (enc, at_sender) = hpke_sender_context(&mut rng, &sender, receiver.public(), &info);
        assert_eq!(
            enc,
            hex32("5ac1671a55c5c3875a8afe74664aa8bc68830be9ded0c5f633cd96400e8b5c05")
        );
        assert!(rng.0.is_empty(), "the ephemeral key takes the whole ikmE");
        let at_receiver = hpke_receiver_context(&receiver, sender.public(), &enc, &info).unwrap();
        for (context, value) in [
            (
                "",
                "83c1bac00a45ed4cb6bd8a6007d2ce4ec501f55e485c5642bd01bf6b6d7d6f0a",
            ),
            (
                "00",
                "08a1d1ad2af3ef5bc40232a64f920650eb9b1034fac3892f729f7949621bf06e",
            ),
            (
                "54657374436f6e74657874",
                "ff3b0e37a9954247fea53f251b799e2edd35aac7152c5795751a3da424feca73",
            ),
        ] {
            let context = hex::decode(context).unwrap();
            let (mut s, mut r) = ([0u8; 32], [0u8; 32]);
            at_sender.export(&context, &mut s).unwrap();
            at_receiver.export(&context, &mut r).unwrap();
            assert_eq!(
                (s, r),
                (hex32(value), hex32(value)),
                "context {context:02x?}"
            );
        }
        // Another sender's key in the receiver's setup: other exports (auth mode binds the sender).
        let other = hpke_receiver_context(&receiver, receiver.public(), &enc, &info).unwrap();
        let mut o = [0u8; 32];
        other.export(&[], &mut o).unwrap();
        assert_ne!(
            o,
            hex32("83c1bac00a45ed4cb6bd8a6007d2ce4ec501f55e485c5642bd01bf6b6d7d6f0a")
        );
    }

    /// RFC 5869 appendix A.1 (HKDF-SHA256): the expansion every record, answer and delivery key goes through,
    /// split into two info parts as Pure passes them. The key is the first 32 bytes of the 42-byte OKM.
    #[test]
    fn key_expansion_follows_rfc_5869() {
        let prk = hex32("077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844ad7c2b3e5");
        let info = hex::decode("f0f1f2f3f4f5f6f7f8f9").unwrap();
        assert_eq!(
            expand(&prk, &[&info[..3], &info[3..]]),
            hex32("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf")
        );
    }

    #[test]
    fn link_secret_is_symmetric_and_keys_depend_on_runs() {
        let mut rng = StdRng::seed_from_u64(2);
        let (s, r) = (NodeKey::generate(&mut rng), NodeKey::generate(&mut rng));
        let ls = link_secret(&s, r.public(), s.public(), r.public()).unwrap();
        assert_eq!(
            ls,
            link_secret(&r, s.public(), s.public(), r.public()).unwrap()
        );
        let mut sealed = b"h".to_vec();
        WireKeys::link(&ls, 1, 2).seal(ORDER, 0, 0..1, &[b"x"], &mut sealed);
        let out = sealed.split_off(1);
        assert!(WireKeys::link(&ls, 1, 2).open(ORDER, 0, b"h", &out).is_ok());
        assert!(WireKeys::link(&ls, 1, 3)
            .open(ORDER, 0, b"h", &out)
            .is_err());
        assert!(WireKeys::link(&ls, 2, 2)
            .open(ORDER, 0, b"h", &out)
            .is_err());
    }
}
