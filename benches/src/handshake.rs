//! The "handshake estimate" of seed 002: the asymmetric work of a mutual-TLS 1.3 server per full handshake.
//!
//! The server verifies the CA's signature on the client certificate (with the issuer's key parsed once at start,
//! where the library can keep a parsed key), verifies the client's CertificateVerify with the key it has just read
//! from that certificate (a key never seen before), signs its own CertificateVerify, and makes an X25519 key share
//! and agrees with the client's. Hashing of the transcript, HKDF and the record layer are left out, as in the seed.

use crate::nistp256::{self, P256ParsedVerify, Sec1Point, P256};
use crate::x25519::{self, X25519};
use crate::Rejected;

/// Stand-in for the to-be-signed part of a client certificate (its length is typical of a P-256 leaf).
const TBS_CERTIFICATE_LEN: usize = 420;

/// What the client sends that the server must check, built once outside the measurement.
#[derive(Debug, Clone)]
pub struct ClientFlight {
    pub issuer_public: Sec1Point,
    pub tbs_certificate: Vec<u8>,
    pub certificate_signature: Vec<u8>,
    pub client_public: Sec1Point,
    pub client_proof: Vec<u8>,
    pub client_proof_signature: Vec<u8>,
    pub client_share: [u8; 32],
}

impl ClientFlight {
    /// A fresh CA, client key and key share; signatures made with RustCrypto (every library verifies them, see
    /// the cross-check tests).
    pub fn new() -> Self {
        use nistp256::RustCrypto;
        let (issuer, issuer_public) = RustCrypto::signing_key();
        let tbs_certificate: Vec<u8> = (0..TBS_CERTIFICATE_LEN).map(|i| i as u8).collect();
        let certificate_signature = RustCrypto::sign(&issuer, &tbs_certificate);
        let (client, client_public) = RustCrypto::signing_key();
        let client_proof =
            nistp256::certificate_verify_message(nistp256::CLIENT_CONTEXT, &[0xc1; 32]);
        let client_proof_signature = RustCrypto::sign(&client, &client_proof);
        let (_, client_share) = x25519::Dalek::keygen();
        ClientFlight {
            issuer_public,
            tbs_certificate,
            certificate_signature,
            client_public,
            client_proof,
            client_proof_signature,
            client_share,
        }
    }
}

impl Default for ClientFlight {
    fn default() -> Self {
        Self::new()
    }
}

/// What the server computes and sends back.
#[derive(Debug)]
pub struct ServerFlight {
    pub server_share: [u8; 32],
    pub shared_secret: [u8; 32],
    pub certificate_verify: Vec<u8>,
}

/// One backend's libraries for the server's work.
pub trait Backend {
    /// The benchmark function id and table column.
    const ID: &'static str;
    type P256: P256;
    type X25519: X25519;
    /// The CA's public key as the server keeps it from its start.
    type Issuer;

    fn register_issuer(public: &[u8]) -> Result<Self::Issuer, Rejected>;
    fn verify_issued(issuer: &Self::Issuer, msg: &[u8], sig: &[u8]) -> bool;
}

/// A server's long-lived state: its signing key and the registered issuer.
pub struct Server<B: Backend> {
    issuer: B::Issuer,
    key: <B::P256 as P256>::SigningKey,
    transcript_hash: [u8; 32],
}

impl<B: Backend> Server<B> {
    pub fn new(client: &ClientFlight) -> Result<Self, Rejected> {
        Ok(Server {
            issuer: B::register_issuer(&client.issuer_public)?,
            key: B::P256::signing_key().0,
            transcript_hash: [0x5e; 32],
        })
    }

    /// The measured work: two verifications, one signature, X25519 key generation and agreement.
    pub fn handshake(&self, client: &ClientFlight) -> Result<ServerFlight, Rejected> {
        if !B::verify_issued(
            &self.issuer,
            &client.tbs_certificate,
            &client.certificate_signature,
        ) {
            return Err(Rejected);
        }
        if !B::P256::verify(
            &client.client_public,
            &client.client_proof,
            &client.client_proof_signature,
        ) {
            return Err(Rejected);
        }
        let (secret, server_share) = B::X25519::keygen();
        let shared_secret = B::X25519::agree(secret, &client.client_share)?;
        let msg =
            nistp256::certificate_verify_message(nistp256::SERVER_CONTEXT, &self.transcript_hash);
        let certificate_verify = B::P256::sign(&self.key, &msg);
        Ok(ServerFlight {
            server_share,
            shared_secret,
            certificate_verify,
        })
    }
}

/// A backend whose P-256 keeps parsed keys: the issuer is parsed once.
macro_rules! parsed_issuer_backend {
    ($name:ident, $id:literal, $p256:ty, $x25519:ty, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug)]
        pub struct $name;

        impl Backend for $name {
            const ID: &'static str = $id;
            type P256 = $p256;
            type X25519 = $x25519;
            type Issuer = <$p256 as P256ParsedVerify>::VerifyingKey;

            fn register_issuer(public: &[u8]) -> Result<Self::Issuer, Rejected> {
                <$p256>::parse_verifying_key(public)
            }

            fn verify_issued(issuer: &Self::Issuer, msg: &[u8], sig: &[u8]) -> bool {
                <$p256>::verify_parsed(issuer, msg, sig)
            }
        }
    };
}

parsed_issuer_backend!(
    Openssl,
    "openssl",
    nistp256::Openssl,
    x25519::Openssl,
    "OpenSSL for everything."
);
parsed_issuer_backend!(
    AwsLc,
    "aws-lc-rs",
    nistp256::AwsLc,
    x25519::AwsLc,
    "aws-lc-rs for everything."
);
parsed_issuer_backend!(
    RustCrypto,
    "rustcrypto",
    nistp256::RustCrypto,
    x25519::Dalek,
    "Portable Rust: RustCrypto `p256` and x25519-dalek (what a RustCrypto rustls provider uses)."
);

/// ring for everything; ring parses the issuer's key at every verification.
#[derive(Debug)]
pub struct Ring;

impl Backend for Ring {
    const ID: &'static str = "ring";
    type P256 = nistp256::Ring;
    type X25519 = x25519::Ring;
    type Issuer = Sec1Point;

    fn register_issuer(public: &[u8]) -> Result<Self::Issuer, Rejected> {
        public.try_into().map_err(|_| Rejected)
    }

    fn verify_issued(issuer: &Self::Issuer, msg: &[u8], sig: &[u8]) -> bool {
        nistp256::Ring::verify(issuer, msg, sig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completes<B: Backend>() {
        let client = ClientFlight::new();
        let server = Server::<B>::new(&client).unwrap();
        let flight = server.handshake(&client).unwrap();
        assert_ne!(flight.shared_secret, [0; 32], "{}", B::ID);
        let mut forged = client.clone();
        forged.client_proof_signature = forged.certificate_signature.clone();
        assert_eq!(server.handshake(&forged).err(), Some(Rejected), "{}", B::ID);
    }

    #[test]
    fn each_backend_completes_a_handshake_and_refuses_a_forged_proof() {
        completes::<Openssl>();
        completes::<AwsLc>();
        completes::<Ring>();
        completes::<RustCrypto>();
    }
}
