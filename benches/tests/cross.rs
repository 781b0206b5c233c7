//! Cross-checks: the libraries the benches compare compute the same things, so their times are comparable.
//!
//! A signature made by each library verifies with every other (and a tampered one with none); ECDH and X25519
//! agree across libraries on the same key pairs; the AEADs produce the same bytes; HPKE opens what it sealed and
//! refuses a tampered tag, a tampered record, other associated data and the wrong sender key.

use microbench::aead::{self, Aead, Algorithm};
use microbench::hpke_auth::{self, AesGcm128, ChaCha20Poly1305, Parties};
use microbench::nistp256::{self, P256ParsedVerify, P256};
use microbench::x25519::{self, X25519};
use microbench::Rejected;

/// Signatures per signer and verifier pair: ECDSA nonces are random in three of the libraries, so a
/// disagreement on, say, high-S values would show up within a few signatures.
const SIGNATURES: u8 = 16;

fn messages() -> impl Iterator<Item = Vec<u8>> {
    (0..SIGNATURES)
        .map(|i| nistp256::certificate_verify_message(nistp256::SERVER_CONTEXT, &[i; 32]))
}

/// A public key and (signature, message) pairs made with its private key.
struct Signed {
    public: nistp256::Sec1Point,
    signatures: Vec<(Vec<u8>, Vec<u8>)>,
}

fn signed_by<S: P256>() -> Signed {
    let (key, public) = S::signing_key();
    Signed {
        public,
        signatures: messages().map(|m| (S::sign(&key, &m), m)).collect(),
    }
}

fn verifies<S: P256, V: P256>() {
    let Signed { public, signatures } = signed_by::<S>();
    for (sig, msg) in &signatures {
        assert!(
            V::verify(&public, msg, sig),
            "{} signed, {} refused",
            S::ID,
            V::ID
        );
        let mut tampered = sig.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 0x01;
        assert!(
            !V::verify(&public, msg, &tampered),
            "{} accepted a tampered {} signature",
            V::ID,
            S::ID
        );
        assert!(
            !V::verify(&public, b"another message", sig),
            "{} accepted a signature of another message",
            V::ID
        );
    }
}

fn verifies_parsed<S: P256, V: P256ParsedVerify>() {
    let Signed { public, signatures } = signed_by::<S>();
    let key = V::parse_verifying_key(&public).unwrap();
    for (sig, msg) in &signatures {
        assert!(
            V::verify_parsed(&key, msg, sig),
            "{} signed, {} (parsed key) refused",
            S::ID,
            V::ID
        );
    }
}

fn verified_by_every_library<S: P256>() {
    verifies::<S, nistp256::Openssl>();
    verifies::<S, nistp256::AwsLc>();
    verifies::<S, nistp256::Ring>();
    verifies::<S, nistp256::RustCrypto>();
    verifies_parsed::<S, nistp256::Openssl>();
    verifies_parsed::<S, nistp256::AwsLc>();
    verifies_parsed::<S, nistp256::RustCrypto>();
}

#[test]
fn a_signature_by_each_library_verifies_with_every_other() {
    verified_by_every_library::<nistp256::Openssl>();
    verified_by_every_library::<nistp256::AwsLc>();
    verified_by_every_library::<nistp256::Ring>();
    verified_by_every_library::<nistp256::RustCrypto>();
}

fn ecdh_agrees<A: P256, B: P256>() {
    let (a, a_public) = A::ecdh_keygen();
    let (b, b_public) = B::ecdh_keygen();
    let ab = A::ecdh(a, &b_public).unwrap();
    let ba = B::ecdh(b, &a_public).unwrap();
    assert_eq!(ab, ba, "ECDH {} with {}", A::ID, B::ID);
}

fn ecdh_agrees_with_every_library<A: P256>() {
    ecdh_agrees::<A, nistp256::Openssl>();
    ecdh_agrees::<A, nistp256::AwsLc>();
    ecdh_agrees::<A, nistp256::Ring>();
    ecdh_agrees::<A, nistp256::RustCrypto>();
}

#[test]
fn p256_ecdh_agrees_across_libraries() {
    ecdh_agrees_with_every_library::<nistp256::Openssl>();
    ecdh_agrees_with_every_library::<nistp256::AwsLc>();
    ecdh_agrees_with_every_library::<nistp256::Ring>();
    ecdh_agrees_with_every_library::<nistp256::RustCrypto>();
}

fn x25519_agrees<A: X25519, B: X25519>() {
    let (a, a_public) = A::keygen();
    let (b, b_public) = B::keygen();
    assert_eq!(
        A::agree(a, &b_public).unwrap(),
        B::agree(b, &a_public).unwrap(),
        "X25519 {} with {}",
        A::ID,
        B::ID
    );
}

fn x25519_agrees_with_every_library<A: X25519>() {
    x25519_agrees::<A, x25519::Dalek>();
    x25519_agrees::<A, x25519::Openssl>();
    x25519_agrees::<A, x25519::AwsLc>();
    x25519_agrees::<A, x25519::Ring>();
}

#[test]
fn x25519_agrees_across_libraries() {
    x25519_agrees_with_every_library::<x25519::Dalek>();
    x25519_agrees_with_every_library::<x25519::Openssl>();
    x25519_agrees_with_every_library::<x25519::AwsLc>();
    x25519_agrees_with_every_library::<x25519::Ring>();
}

fn hex32(s: &str) -> [u8; 32] {
    let bytes: Vec<u8> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect();
    bytes.try_into().unwrap()
}

/// RFC 7748 section 6.1, with the libraries that can import a private key.
#[test]
fn x25519_matches_the_rfc_7748_test_vector() {
    let alice = hex32("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
    let alice_public = hex32("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
    let bob_public = hex32("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f");
    let shared = hex32("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");

    let dalek = x25519_dalek::StaticSecret::from(alice);
    assert_eq!(
        x25519_dalek::PublicKey::from(&dalek).to_bytes(),
        alice_public
    );
    assert_eq!(
        dalek
            .diffie_hellman(&x25519_dalek::PublicKey::from(bob_public))
            .to_bytes(),
        shared
    );

    let ossl =
        openssl::pkey::PKey::private_key_from_raw_bytes(&alice, openssl::pkey::Id::X25519).unwrap();
    assert_eq!(ossl.raw_public_key().unwrap(), alice_public);
    assert_eq!(x25519::Openssl::agree(ossl, &bob_public).unwrap(), shared);

    let aws =
        aws_lc_rs::agreement::PrivateKey::from_private_key(&aws_lc_rs::agreement::X25519, &alice)
            .unwrap();
    assert_eq!(aws.compute_public_key().unwrap().as_ref(), alice_public);
    assert_eq!(x25519::AwsLc::agree(aws, &bob_public).unwrap(), shared);
}

fn sealed_by<A: Aead>(alg: Algorithm, len: usize) -> (Vec<u8>, aead::Tag) {
    let key: Vec<u8> = (0..alg.key_len() as u8).collect();
    let mut buf: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
    let tag = A::new(alg, &key).seal(&[9; 12], b"header", &mut buf);
    (buf, tag)
}

fn opens<A: Aead>(alg: Algorithm, sealed: &(Vec<u8>, aead::Tag), len: usize) {
    let key: Vec<u8> = (0..alg.key_len() as u8).collect();
    let cipher = A::new(alg, &key);
    let mut buf = sealed.0.clone();
    cipher
        .open(&[9; 12], b"header", &mut buf, &sealed.1)
        .unwrap();
    assert!(
        buf.iter().enumerate().all(|(i, b)| *b == (i * 7) as u8),
        "{} {:?}",
        A::ID,
        alg
    );
    let mut bad_tag = sealed.1;
    bad_tag[0] ^= 1;
    let mut buf = sealed.0.clone();
    assert_eq!(
        cipher.open(&[9; 12], b"header", &mut buf, &bad_tag),
        Err(Rejected),
        "{} {:?} {len}",
        A::ID,
        alg
    );
}

#[test]
fn the_aeads_agree_byte_for_byte_and_refuse_a_tampered_tag() {
    for alg in Algorithm::ALL {
        for len in [0, 64, 1024] {
            let reference = sealed_by::<aead::RustCrypto>(alg, len);
            assert_eq!(
                sealed_by::<aead::Ring>(alg, len),
                reference,
                "ring {alg:?} {len}"
            );
            assert_eq!(
                sealed_by::<aead::AwsLc>(alg, len),
                reference,
                "aws-lc-rs {alg:?} {len}"
            );
            opens::<aead::RustCrypto>(alg, &reference, len);
            opens::<aead::Ring>(alg, &reference, len);
            opens::<aead::AwsLc>(alg, &reference, len);
        }
    }
}

enum Tamper {
    Tag,
    Record,
    Aad,
}

fn hpke_checks<A: hpke::aead::Aead>() {
    let parties = Parties::generate();
    let (encapped, mut sender) = parties.setup_sender::<A>();
    let mut receiver = parties
        .setup_receiver::<A>(&parties.sender.1, &encapped)
        .unwrap();

    // records in order open
    for len in [0usize, 64, 1024] {
        let plain: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut buf = plain.clone();
        let tag = sender
            .seal_inout_detached(buf.as_mut_slice().into(), b"aad")
            .unwrap();
        assert!(len == 0 || buf != plain);
        receiver
            .open_inout_detached(buf.as_mut_slice().into(), b"aad", &tag)
            .unwrap();
        assert_eq!(buf, plain);
    }

    // a tampered tag, a tampered record, other associated data: refused (each on a fresh session)
    for change in [Tamper::Tag, Tamper::Record, Tamper::Aad] {
        let (encapped, mut sender) = parties.setup_sender::<A>();
        let mut receiver = parties
            .setup_receiver::<A>(&parties.sender.1, &encapped)
            .unwrap();
        let mut record = vec![0x42; 64];
        let tag = sender
            .seal_inout_detached(record.as_mut_slice().into(), b"aad")
            .unwrap();
        let (mut tag, mut aad) = (hpke_auth::tag_bytes(&tag), b"aad".to_vec());
        match change {
            Tamper::Tag => tag[0] ^= 1,
            Tamper::Record => record[0] ^= 1,
            Tamper::Aad => aad.push(0),
        }
        let tag = hpke_auth::tag_from_bytes::<A>(&tag).unwrap();
        assert!(receiver
            .open_inout_detached(record.as_mut_slice().into(), &aad, &tag)
            .is_err());
    }

    // a receiver that expects another sender derives other keys and refuses the record
    let impostor = Parties::generate();
    let (encapped, mut sender) = parties.setup_sender::<A>();
    let mut receiver = parties
        .setup_receiver::<A>(&impostor.sender.1, &encapped)
        .unwrap();
    let mut record = vec![0x42; 64];
    let tag = sender
        .seal_inout_detached(record.as_mut_slice().into(), b"aad")
        .unwrap();
    assert!(receiver
        .open_inout_detached(record.as_mut_slice().into(), b"aad", &tag)
        .is_err());
}

#[test]
fn hpke_opens_what_it_sealed_and_refuses_tampering_and_the_wrong_sender() {
    hpke_checks::<AesGcm128>();
    hpke_checks::<ChaCha20Poly1305>();
}
