//! Stateless-reset tokens derived from the server's key file.
//!
//! s2n-quic's default token generator is disabled: a packet for a connection the endpoint does not know is dropped,
//! so after a restart every device would wait for its old connection to time out (the 1 s answer timeout of the
//! fleet at best, the 30 s idle timeout for an idle device). With [`ResetTokens`] the token for a connection id is
//! HMAC-SHA256 over the id, keyed by HKDF-SHA256 over the server's private key ([`tls::server_secret`]): every
//! start of the server with the same key file issues the same token for the same id, so the new process answers a
//! packet of the old one's connections with a stateless reset the client recognises, and the client closes that
//! connection at once.
//!
//! s2n-quic's connection ids are 16 random bytes with no key in them, so the new process parses the old ids
//! without any shared state; nothing else needs deriving.

use aws_lc_rs::hmac;
use s2n_quic_core::stateless_reset::token::{Token, LEN as TOKEN_LEN};
use std::path::Path;
use transport_core::TransportError;
use transport_tls as tls;

/// The HKDF salt: a label for this use, so the key is never the same as any other derived from the same file.
const SALT: &[u8] = b"lb-bench s2n-quic endpoint";
/// The HKDF info of the token key.
const LABEL: &[u8] = b"stateless reset";

/// The stateless-reset token generator of a server (see the module docs).
#[derive(Debug)]
pub struct ResetTokens {
    key: hmac::Key,
}

impl ResetTokens {
    /// Derive the token key from the server key file in `identity`.
    pub fn derive(identity: &Path) -> Result<Self, TransportError> {
        Ok(Self::from_key(&tls::server_secret(identity, SALT, LABEL)?))
    }

    /// Derive the token key from any secret bytes (the server key's DER).
    pub fn from_secret(secret: &[u8]) -> Result<Self, TransportError> {
        Ok(Self::from_key(&tls::derive_secret(secret, SALT, LABEL)?))
    }

    fn from_key(key: &[u8; 32]) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
        }
    }

    /// The token for a local connection id.
    pub fn token(&self, local_connection_id: &[u8]) -> [u8; TOKEN_LEN] {
        let tag = hmac::sign(&self.key, local_connection_id);
        let mut token = [0u8; TOKEN_LEN];
        token.copy_from_slice(&tag.as_ref()[..TOKEN_LEN]);
        token
    }
}

impl s2n_quic::provider::stateless_reset_token::Generator for ResetTokens {
    fn generate(&mut self, local_connection_id: &[u8]) -> Token {
        Token::from(self.token(local_connection_id))
    }
}

impl s2n_quic::provider::stateless_reset_token::Provider for ResetTokens {
    type Generator = Self;
    type Error = std::convert::Infallible;

    fn start(self) -> Result<Self, Self::Error> {
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_depend_on_the_key_and_the_id_only() {
        let a = ResetTokens::from_secret(b"server key one").unwrap();
        let again = ResetTokens::from_secret(b"server key one").unwrap();
        let b = ResetTokens::from_secret(b"server key two").unwrap();
        let id = [7u8; 16];
        assert_eq!(a.token(&id), again.token(&id));
        assert_ne!(a.token(&id), b.token(&id));
        assert_ne!(a.token(&id), a.token(&[8u8; 16]));
    }

    #[test]
    fn a_missing_key_file_is_an_identity_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            ResetTokens::derive(dir.path()),
            Err(TransportError::Identity(_))
        ));
    }
}
