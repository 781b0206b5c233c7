//! TLS 1.3 session tickets whose key survives a server restart: [`TicketKey`], a rustls [`ProducesTickets`].
//!
//! The key (AES-256-GCM) and its name are derived from the server's key file ([`server_secret`]), as the QUIC
//! servers derive their stateless-reset keys, so every start of a server with the same key file opens the tickets of
//! the starts before it: a device that reconnects after a restart resumes its session instead of making a full
//! handshake. Nothing is kept on disk beside the key file.
//!
//! # A ticket
//!
//! `name (8) | nonce (12) | AES-256-GCM(issued | session) | tag (16)`: `issued` is the time the ticket was sealed
//! (seconds since the Unix epoch, u64 big-endian), `session` what rustls asked to seal; the name is also the
//! associated data. Nonces are random (96 bits, aws-lc-rs's [`RandomizedNonceKey`]): one key seals far fewer than
//! the 2^32 tickets after which random nonces would risk a repeat.
//!
//! [`TicketKey::decrypt`] returns `None`, and rustls makes a full handshake instead, for a ticket that is too short,
//! carries another key's name, does not open (forged, tampered, or sealed by another key under the same name), or
//! was issued more than [`TICKET_LIFETIME`] ago. It never panics on any input.
//!
//! # What a resumed handshake costs, and what the key is worth
//!
//! Servers here accept only `psk_dhe_ke` (rustls offers nothing else): a resumed handshake still makes a fresh
//! X25519 on each side (2 operations each), but sends no certificate and signs and verifies nothing. The ticket
//! carries the client's certificate chain, so the server knows the device as after a full handshake. Traffic keys
//! always depend on the fresh (EC)DHE, so whoever learns the ticket key cannot read past traffic; within a ticket's
//! lifetime they could resume as the device that holds it. The key is derived from the server's private key, so only
//! someone who already holds that key can derive it, and the lifetime bounds what an old ticket is worth. Key
//! rolling (rustls's advice for forward secrecy of the tickets themselves) is not done: the key lives as long as the
//! server's key file.

use crate::server_secret;
use aws_lc_rs::aead::{Aad, Nonce, RandomizedNonceKey, AES_256_GCM, NONCE_LEN};
use rustls::server::ProducesTickets;
use std::fmt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};
use transport_core::TransportError;

/// How long a ticket is good for, in seconds (rustls's own ticketer's lifetime).
pub const TICKET_LIFETIME: u32 = 6 * 3600;

/// The HKDF salt of the ticket key and name.
const SALT: &[u8] = b"lb-bench TLS session tickets";
const NAME_LEN: usize = 8;
const ISSUED_LEN: usize = 8;
const TAG_LEN: usize = 16;

/// Seals and opens session tickets under a key derived from the server's key file (see the module docs).
pub struct TicketKey {
    name: [u8; NAME_LEN],
    key: RandomizedNonceKey,
    lifetime: u32,
}

impl fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TicketKey")
            .field("name", &hex::encode(self.name))
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

impl TicketKey {
    /// The ticket key of the server whose key file is in `dir`: the same for every start of that server.
    pub fn derive(dir: &Path) -> Result<Self, TransportError> {
        let key = server_secret(dir, SALT, b"ticket key")?;
        let name = server_secret(dir, SALT, b"ticket key name")?;
        Self::new(&key, &name, TICKET_LIFETIME)
    }

    /// A ticket key of these bytes, named by the first bytes of `name`, its tickets good for `lifetime` seconds.
    pub fn new(key: &[u8; 32], name: &[u8; 32], lifetime: u32) -> Result<Self, TransportError> {
        let key = RandomizedNonceKey::new(&AES_256_GCM, key)
            .map_err(|_| TransportError::Config("ticket key refused by aws-lc-rs".into()))?;
        let mut short = [0; NAME_LEN];
        short.copy_from_slice(&name[..NAME_LEN]);
        Ok(Self {
            name: short,
            key,
            lifetime,
        })
    }

    /// Seal `session` into a ticket issued at `now` (seconds since the Unix epoch).
    pub fn seal_at(&self, session: &[u8], now: u64) -> Option<Vec<u8>> {
        let mut sealed = Vec::with_capacity(ISSUED_LEN + session.len() + TAG_LEN);
        sealed.extend_from_slice(&now.to_be_bytes());
        sealed.extend_from_slice(session);
        let nonce = self
            .key
            .seal_in_place_append_tag(Aad::from(self.name), &mut sealed)
            .ok()?;
        let mut ticket = Vec::with_capacity(NAME_LEN + NONCE_LEN + sealed.len());
        ticket.extend_from_slice(&self.name);
        ticket.extend_from_slice(nonce.as_ref());
        ticket.extend_from_slice(&sealed);
        Some(ticket)
    }

    /// The session sealed in `ticket`, if it is this key's, opens, and is no older than the lifetime at `now`.
    pub fn open_at(&self, ticket: &[u8], now: u64) -> Option<Vec<u8>> {
        let (name, rest) = ticket.split_first_chunk::<NAME_LEN>()?;
        if *name != self.name {
            return None;
        }
        let (nonce, sealed) = rest.split_first_chunk::<NONCE_LEN>()?;
        if sealed.len() < ISSUED_LEN + TAG_LEN {
            return None;
        }
        let mut sealed = sealed.to_vec();
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(*nonce),
                Aad::from(self.name),
                &mut sealed,
            )
            .ok()?;
        let (issued, session) = plain.split_first_chunk::<ISSUED_LEN>()?;
        // A ticket from the future (the clock went back) is still ours: its age counts as 0.
        if now.saturating_sub(u64::from_be_bytes(*issued)) > u64::from(self.lifetime) {
            return None;
        }
        Some(session.to_vec())
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl ProducesTickets for TicketKey {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        self.lifetime
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.seal_at(plain, now_secs())
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.open_at(cipher, now_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_750_000_000;

    fn key(seed: u8) -> TicketKey {
        TicketKey::new(&[seed; 32], &[seed; 32], 3600).unwrap()
    }

    #[test]
    fn a_ticket_opens_to_what_was_sealed_under_the_same_key_only() {
        let k = key(1);
        let session = b"resumption secret and client certificates".to_vec();
        let ticket = k.seal_at(&session, NOW).unwrap();
        assert_eq!(
            ticket.len(),
            NAME_LEN + NONCE_LEN + ISSUED_LEN + session.len() + TAG_LEN
        );
        assert_eq!(k.open_at(&ticket, NOW).as_deref(), Some(&session[..]));
        // The same bytes again give a different ticket (a fresh nonce), which opens to the same session.
        let again = k.seal_at(&session, NOW).unwrap();
        assert_ne!(again, ticket);
        assert_eq!(k.open_at(&again, NOW + 1).as_deref(), Some(&session[..]));
        assert_eq!(
            k.open_at(&k.seal_at(b"", NOW).unwrap(), NOW).as_deref(),
            Some(&b""[..])
        );
        // Another key: refused by its name.
        assert_eq!(key(2).open_at(&ticket, NOW), None);
        // Another key under the same name: refused by the AEAD.
        let impostor = TicketKey::new(&[9; 32], &[1; 32], 3600).unwrap();
        assert_eq!(impostor.name, k.name);
        assert_eq!(impostor.open_at(&ticket, NOW), None);
    }

    #[test]
    fn a_ticket_expires_after_its_lifetime() {
        let k = key(1);
        let ticket = k.seal_at(b"session", NOW).unwrap();
        assert!(k.open_at(&ticket, NOW + 3600).is_some());
        assert_eq!(k.open_at(&ticket, NOW + 3601), None);
        // Issued in what is now the future (the clock went back): still this key's, age 0.
        assert!(k.open_at(&ticket, NOW - 100).is_some());
        assert_eq!(k.lifetime(), 3600);
    }

    #[test]
    fn damaged_and_truncated_tickets_are_refused_without_panicking() {
        let k = key(1);
        let ticket = k.seal_at(b"session", NOW).unwrap();
        for n in 0..ticket.len() {
            assert_eq!(k.open_at(&ticket[..n], NOW), None, "first {n} bytes");
            let mut flipped = ticket.clone();
            flipped[n] ^= 0x40;
            assert_eq!(k.open_at(&flipped, NOW), None, "byte {n} flipped");
        }
        let mut longer = ticket.clone();
        longer.push(0);
        assert_eq!(k.open_at(&longer, NOW), None);
        assert_eq!(k.decrypt(&[0xff; 300]), None);
    }

    #[test]
    fn the_key_comes_from_the_server_key_file() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        crate::write_pki(a.path(), 1).unwrap();
        crate::write_pki(b.path(), 1).unwrap();
        // Two starts of the same server: one opens the other's tickets.
        let first = TicketKey::derive(a.path()).unwrap();
        let second = TicketKey::derive(a.path()).unwrap();
        let ticket = first.encrypt(b"session").unwrap();
        assert_eq!(second.decrypt(&ticket).as_deref(), Some(&b"session"[..]));
        // Another server's key file: another key.
        assert_eq!(TicketKey::derive(b.path()).unwrap().decrypt(&ticket), None);
        assert!(first.enabled() && first.lifetime() == TICKET_LIFETIME);
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            TicketKey::derive(empty.path()),
            Err(TransportError::Identity(_))
        ));
    }
}
