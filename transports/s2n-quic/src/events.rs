//! The event subscriber of both endpoints: what s2n-quic tells about each connection's TLS handshake.
//!
//! s2n-quic hands the TLS session to its event subscriber when a handshake completes (`TlsExporterReady`), with
//! the peer's *verified* certificate chain, whichever provider is in use. The subscriber keeps, per connection, a
//! [`ConnState`] that the server reads through `Connection::query_event_context`:
//!
//! - **the device's name**: the common name of the client's end-entity certificate (server side only);
//! - **refusals**: a connection the server closes during its handshake with a certificate alert (unknown CA, bad or
//!   missing certificate) counts one [`Counters::refused_unknown`], as the quinn transport counts them; a handshake
//!   given up because the peer went silent counts one [`Counters::timed_out`]; a datagram the endpoint drops counts
//!   one [`Counters::refused_unroutable`] (no connection has its connection id) or [`Counters::refused_malformed`]
//!   (it does not decode, or names an unsupported version);
//! - **derived asymmetric operations** (s2n-tls only, see below).
//!
//! # Derived asymmetric operations (s2n-tls)
//!
//! s2n-tls performs its key exchange, signatures and verifications inside the C library, with no hook where they
//! could be counted (its private-key callback would move our own signatures into Rust, but only as pre-hashed
//! digests aws-lc-rs does not sign; the peer's verifications stay in libcrypto). So for the `s2n-quic` variant they
//! are **derived**, once per completed handshake on each side, from what the handshake negotiated:
//!
//! - key exchange: 2 operations (ephemeral key generation, agreement) on the negotiated group, reported by the
//!   `KeyExchangeGroup` event: [`Counters::x25519`] for X25519 (and X25519 hybrids), [`Counters::ecdh`] for the NIST
//!   curves. s2n-tls's default policy prefers P-256, so between two s2n-tls endpoints this is `ecdh`;
//! - signatures: 1 [`Counters::sign`] (this side's `CertificateVerify`; both sides authenticate, resumption is off);
//! - verifications: 1 [`Counters::verify`] per certificate of the peer's verified chain other than the trust anchor
//!   (whose own signature is never checked), plus 1 for the peer's `CertificateVerify`.
//!
//! With the run's PKI (certificates issued directly by the CA) that is, per side and handshake, 2 `ecdh`, 1 `sign`
//! and 2 `verify`: the same operations the rustls provider counts where they happen. What derivation cannot see:
//! handshakes that fail (a refused certificate costs the server its key exchange and signature, counted by rustls,
//! not here), a HelloRetryRequest (never happens between these endpoints), or a second key share. Which variant
//! derives is [`Provider::derives_asym_ops`](crate::Provider::derives_asym_ops), documented in `docs/s2n-quic.md`.

use rustls::pki_types::CertificateDer;
use s2n_quic::provider::event::{events, ConnectionInfo, ConnectionMeta, Subscriber};
use std::sync::Arc;
use transport_core::Counters;
use transport_tls as tls;

/// Which endpoint a subscriber serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The server: it reads the device's name and counts refusals.
    Server,
    /// The client endpoint of a fleet.
    Client,
}

/// The kind of a key exchange group, as the counters tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KxKind {
    /// X25519, or a hybrid whose classical part is X25519.
    X25519,
    /// A NIST curve (P-256, P-384, P-521), alone or in a hybrid.
    Ecdh,
    /// Anything else (never negotiated by these endpoints): not counted.
    Other,
}

impl KxKind {
    /// Classify a group by the name s2n-quic reports (IANA names, e.g. `x25519`, `secp256r1`,
    /// `X25519MLKEM768`, `SecP256r1MLKEM768`).
    pub fn of(name: &str) -> KxKind {
        let name = name.to_ascii_lowercase();
        if name.contains("x25519") {
            KxKind::X25519
        } else if name.contains("secp") || name.starts_with("p-") || name.starts_with("p256") {
            KxKind::Ecdh
        } else {
            KxKind::Other
        }
    }
}

/// What the subscriber keeps per connection.
#[derive(Debug, Default)]
pub struct ConnState {
    /// The common name of the client's verified end-entity certificate (server side, once the handshake is done).
    pub device: Option<String>,
    /// The negotiated key exchange group.
    pub kx: Option<KxKind>,
    /// Whether the TLS handshake completed.
    pub handshake_done: bool,
}

/// The event subscriber of one endpoint (see the module docs).
#[derive(Debug)]
pub struct Events {
    side: Side,
    counters: Arc<Counters>,
    /// The trust anchor's DER, when asymmetric operations are derived (s2n-tls).
    derive: Option<Vec<u8>>,
}

impl Events {
    /// A subscriber counting into `counters`. With `trust_anchor` (the CA certificate's DER) it derives the
    /// asymmetric operations of each completed handshake; without, it leaves them to the crypto provider.
    pub fn new(side: Side, counters: Arc<Counters>, trust_anchor: Option<Vec<u8>>) -> Self {
        Self {
            side,
            counters,
            derive: trust_anchor,
        }
    }
}

/// Count the asymmetric operations of one completed full handshake on one side (see the module docs).
pub fn count_derived(
    counters: &Counters,
    kx: Option<KxKind>,
    peer_chain: &[Vec<u8>],
    trust_anchor: &[u8],
) {
    let kx_ops = match kx {
        Some(KxKind::X25519) => {
            Counters::add(&counters.x25519, 2);
            2
        }
        Some(KxKind::Ecdh) => {
            Counters::add(&counters.ecdh, 2);
            2
        }
        Some(KxKind::Other) | None => 0,
    };
    Counters::inc(&counters.sign);
    let chain = peer_chain
        .iter()
        .filter(|cert| cert.as_slice() != trust_anchor)
        .count() as u64;
    Counters::add(&counters.verify, chain + 1);
    Counters::add(&counters.asym_derived, kx_ops + 1 + chain + 1);
}

/// Whether a connection error is this endpoint refusing the peer's certificate: a CRYPTO_ERROR (0x100 + TLS alert)
/// it sent with bad_certificate (42) to certificate_unknown (46), unknown_ca (48), access_denied (49) or
/// certificate_required (116).
pub fn refused_certificate(error: &s2n_quic::connection::Error) -> bool {
    let s2n_quic::connection::Error::Transport {
        code, initiator, ..
    } = error
    else {
        return false;
    };
    initiator.is_local()
        && matches!(
            code.as_u64().checked_sub(0x100),
            Some(42..=46 | 48 | 49 | 116)
        )
}

/// Whether a handshake ended because the peer went silent: the handshake's time ran out
/// ([`quic::HANDSHAKE_TIMEOUT`](transport_conn::quic::HANDSHAKE_TIMEOUT), s2n-quic's default) or the idle timer did.
pub fn gave_up(error: &s2n_quic::connection::Error) -> bool {
    matches!(
        error,
        s2n_quic::connection::Error::MaxHandshakeDurationExceeded { .. }
            | s2n_quic::connection::Error::IdleTimerExpired { .. }
    )
}

impl Subscriber for Events {
    type ConnectionContext = ConnState;

    fn create_connection_context(
        &mut self,
        _meta: &ConnectionMeta,
        _info: &ConnectionInfo,
    ) -> ConnState {
        ConnState::default()
    }

    fn on_key_exchange_group(
        &mut self,
        context: &mut ConnState,
        _meta: &ConnectionMeta,
        event: &events::KeyExchangeGroup,
    ) {
        context.kx = Some(KxKind::of(event.chosen_group_name));
    }

    fn on_tls_exporter_ready(
        &mut self,
        context: &mut ConnState,
        _meta: &ConnectionMeta,
        event: &events::TlsExporterReady,
    ) {
        context.handshake_done = true;
        if self.side == Side::Client && self.derive.is_none() {
            return; // nothing to read: the provider counts, the fleet counts the handshake
        }
        // The verified chain, end-entity first. (A hidden method of s2n-quic's session view, the one way to reach
        // the peer's certificate with either provider.)
        let chain = event.session.peer_cert_chain_der().unwrap_or_default();
        if self.side == Side::Server {
            context.device = chain
                .first()
                .and_then(|cert| tls::peer_device(&[CertificateDer::from(cert.as_slice())]));
        }
        if let Some(anchor) = &self.derive {
            count_derived(&self.counters, context.kx, &chain, anchor);
        }
    }

    fn on_connection_closed(
        &mut self,
        context: &mut ConnState,
        _meta: &ConnectionMeta,
        event: &events::ConnectionClosed,
    ) {
        if self.side != Side::Server || context.handshake_done {
            return;
        }
        if refused_certificate(&event.error) {
            Counters::inc(&self.counters.refused_unknown);
        } else if gave_up(&event.error) {
            Counters::inc(&self.counters.timed_out);
        }
    }

    fn on_endpoint_datagram_dropped(
        &mut self,
        _meta: &events::EndpointMeta,
        event: &events::EndpointDatagramDropped,
    ) {
        if self.side != Side::Server {
            return;
        }
        use events::DatagramDropReason as Why;
        Counters::inc(match event.reason {
            Why::UnknownDestinationConnectionId { .. } => &self.counters.refused_unroutable,
            _ => &self.counters.refused_malformed,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_classified_by_name() {
        for (name, kind) in [
            ("x25519", KxKind::X25519),
            ("X25519MLKEM768", KxKind::X25519),
            ("secp256r1", KxKind::Ecdh),
            ("SecP256r1MLKEM768", KxKind::Ecdh),
            ("secp384r1", KxKind::Ecdh),
            ("ffdhe2048", KxKind::Other),
            ("", KxKind::Other),
        ] {
            assert_eq!(KxKind::of(name), kind, "{name}");
        }
    }

    #[test]
    fn a_full_handshake_derives_the_same_operations_rustls_counts() {
        let c = Counters::default();
        let anchor = b"ca".to_vec();
        // s2n-tls reports the validated chain with its trust anchor at the end.
        count_derived(
            &c,
            Some(KxKind::Ecdh),
            &[b"leaf".to_vec(), anchor.clone()],
            &anchor,
        );
        let s = c.snapshot();
        assert_eq!((s.x25519, s.ecdh, s.sign, s.verify), (0, 2, 1, 2));
        count_derived(&c, Some(KxKind::X25519), &[b"leaf".to_vec()], &anchor);
        let s = c.snapshot();
        assert_eq!((s.x25519, s.ecdh, s.sign, s.verify), (2, 2, 2, 4));
    }
}
