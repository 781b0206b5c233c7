//! The TLS client configurations of the adversary: its own valid identity, a certificate from a CA it made itself,
//! and none at all. Each verifies the server against the run's CA (it wants to reach the server's later checks, not
//! be refused by its own client).

use super::AdversaryError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::ClientConfig;
use std::path::Path;
use std::sync::Arc;
use transport_core::Counters;
use transport_tls::{ClientTls, DeviceCredentials};

/// The adversary's three client configurations.
pub struct Clients {
    /// Its own enrolled device (accepted by the server).
    pub own: Arc<ClientConfig>,
    /// A device of a CA of its own (refused by the server).
    pub foreign: Arc<ClientConfig>,
    /// No client certificate (refused by the server).
    pub anonymous: Arc<ClientConfig>,
}

impl Clients {
    /// The configurations for the identity directory `dir`, offering `alpn`.
    pub fn load(dir: &Path, alpn: &[&[u8]]) -> Result<Clients, AdversaryError> {
        // Its own asymmetric operations are not measured: a counter nobody reads.
        let counters = Arc::new(Counters::default());
        let own = Arc::new(DeviceCredentials::load(dir)?);
        let own = ClientTls::new(own, counters.clone(), alpn)?.config(0)?;
        let foreign = Arc::new(DeviceCredentials::foreign(dir, 1)?);
        let foreign = ClientTls::new(foreign, counters, alpn)?.config(0)?;
        let ca = dir.join(transport_tls::CA_FILE);
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&ca)
            .map_err(|e| AdversaryError::Identity(format!("{}: {e}", ca.display())))?
        {
            let cert =
                cert.map_err(|e| AdversaryError::Identity(format!("{}: {e}", ca.display())))?;
            roots
                .add(cert)
                .map_err(|e| AdversaryError::Identity(format!("{}: {e}", ca.display())))?;
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut anonymous = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| AdversaryError::Identity(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        anonymous.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Clients {
            own,
            foreign,
            anonymous: Arc::new(anonymous),
        })
    }
}
