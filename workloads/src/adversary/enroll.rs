//! The adversary's identity directory: what it may hold, made by the runner (the operator) from a run's identity.
//!
//! The run is prepared for one device more than the workload has; that last device is the adversary's own valid
//! identity (an extra device the server allows, never an honest one). Its directory holds:
//!
//! | family | files |
//! |---|---|
//! | Pure | `node.pub` (the server's public key), `senders` (the allow-list: names and public keys), `own.key` (its device key, mode 0600) |
//! | TLS (QUIC, MQTT) | `ca.pem` (the CA certificate), `devices.der` (its own certificate and key only) |
//! | every one | `adversary.json` ([`Own`]: its device number, name and sender id) |
//!
//! Nothing else of the run's identity is copied: no honest device's key, no server key, no CA key.

use super::{family, AdversaryError, Family};
use serde::{Deserialize, Serialize};
use std::path::Path;
use transport_core::{device_name, keys, sender_id};
use transport_pure::files as pure_files;

/// The file naming the adversary's own identity.
pub const OWN_FILE: &str = "adversary.json";
/// Pure: the adversary's device key (hex, mode 0600).
pub const OWN_KEY: &str = "own.key";

/// The adversary's own valid identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Own {
    /// The transport it was enrolled for.
    pub transport: String,
    /// Its device number in the run's identity (the last one).
    pub device: u32,
    /// Its device name (`dev-N`).
    pub name: String,
    /// The sender id its orders are stored under.
    pub sender: u64,
}

impl Own {
    /// Read `adversary.json` from `dir`.
    pub fn load(dir: &Path) -> Result<Own, AdversaryError> {
        let path = dir.join(OWN_FILE);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| AdversaryError::Identity(format!("{}: {e}", path.display())))?;
        serde_json::from_str(&text)
            .map_err(|e| AdversaryError::Identity(format!("{}: {e}", path.display())))
    }
}

fn identity_err(e: impl std::fmt::Display) -> AdversaryError {
    AdversaryError::Identity(e.to_string())
}

/// Enrol the last device of the run's identity `from` (prepared by `spec`'s transport) as the adversary's own and
/// write its directory `to`.
pub fn enroll(spec: &str, from: &Path, to: &Path) -> Result<Own, AdversaryError> {
    std::fs::create_dir_all(to)?;
    let device = match family(spec)? {
        Family::Pure(_) => {
            let path = from.join(pure_files::DEVICE_KEYS);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| identity_err(format!("{}: {e}", path.display())))?;
            let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            let Some(last) = lines.last() else {
                return Err(identity_err(format!("{}: no device", path.display())));
            };
            keys::write_secret(&to.join(OWN_KEY), last.trim().as_bytes()).map_err(identity_err)?;
            for public in [pure_files::NODE_PUB, pure_files::SENDERS] {
                let bytes = std::fs::read(from.join(public))?;
                keys::write_public(&to.join(public), &bytes).map_err(identity_err)?;
            }
            lines.len() as u32 - 1
        }
        Family::Quic | Family::Mqtt => {
            let all = transport_tls::DeviceCredentials::load(from)?;
            let device = all
                .len()
                .checked_sub(1)
                .ok_or_else(|| identity_err(format!("{}: no device", from.display())))?;
            transport_tls::extract_device(from, device, to)?;
            device
        }
    };
    let name = device_name(device);
    let own = Own {
        transport: spec.to_string(),
        device,
        sender: sender_id(&name),
        name,
    };
    let text = serde_json::to_string_pretty(&own).map_err(identity_err)?;
    keys::write_public(&to.join(OWN_FILE), text.as_bytes()).map_err(identity_err)?;
    Ok(own)
}

#[cfg(test)]
mod tests {
    use super::*;
    use transport_core::Transport;

    #[test]
    fn the_adversary_gets_its_own_key_and_public_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let (run, adv) = (dir.path().join("run"), dir.path().join("adv"));
        let pure = transport_pure::variant("pure").unwrap();
        pure.prepare(&run, 4).unwrap();
        let own = enroll("pure", &run, &adv).unwrap();
        assert_eq!((own.device, own.name.as_str(), own.sender), (3, "dev-3", 3));
        assert_eq!(Own::load(&adv).unwrap(), own);
        let mut files: Vec<String> = std::fs::read_dir(&adv)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(files, [OWN_FILE, "node.pub", OWN_KEY, "senders"]);
        let all = std::fs::read_to_string(run.join(pure_files::DEVICE_KEYS)).unwrap();
        let mine = std::fs::read_to_string(adv.join(OWN_KEY)).unwrap();
        assert_eq!(all.lines().last().unwrap(), mine.trim());
        for honest in all.lines().take(3) {
            assert_ne!(honest, mine.trim());
        }

        let (run, adv) = (dir.path().join("tls"), dir.path().join("tls-adv"));
        transport_tls::write_pki(&run, 3).unwrap();
        let own = enroll("quinn", &run, &adv).unwrap();
        assert_eq!(own.name, "dev-2");
        assert_eq!(
            transport_tls::DeviceCredentials::load(&adv).unwrap().len(),
            1
        );
        assert!(!adv.join(transport_tls::SERVER_KEY_FILE).exists());
    }
}
