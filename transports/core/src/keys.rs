//! Key and credential files.
//!
//! Secrets are written with mode 0600 from the moment the file exists (the mode is given to `open`, not set
//! afterwards), then synced, so a crash never leaves a readable or half-written key. Public values travel as hex.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Errors reading or writing key files.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        source: io::Error,
    },
    /// The file does not hold what it should.
    #[error("{path}: {reason}")]
    Malformed {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> KeyFileError + '_ {
    move |source| KeyFileError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Write `contents` to `path` as a secret: mode 0600, written to a temporary file, synced, then renamed over.
pub fn write_secret(path: &Path, contents: &[u8]) -> Result<(), KeyFileError> {
    let tmp = path.with_extension("tmp");
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    // A file that already existed keeps its old mode through `open`; make sure it is 0600.
    f.set_permissions(fs::Permissions::from_mode(0o600))
        .map_err(io_err(&tmp))?;
    f.write_all(contents).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    fs::rename(&tmp, path).map_err(io_err(path))?;
    Ok(())
}

/// Write a public file (mode 0644), synced.
pub fn write_public(path: &Path, contents: &[u8]) -> Result<(), KeyFileError> {
    let mut f = fs::File::create(path).map_err(io_err(path))?;
    f.write_all(contents).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))?;
    Ok(())
}

/// Read a 32-byte key written as 64 hex digits (surrounding whitespace allowed).
pub fn read_key32(path: &Path) -> Result<[u8; 32], KeyFileError> {
    let text = fs::read_to_string(path).map_err(io_err(path))?;
    parse_key32(text.trim()).map_err(|reason| KeyFileError::Malformed {
        path: path.display().to_string(),
        reason,
    })
}

/// Parse 64 hex digits into 32 bytes.
pub fn parse_key32(hex_text: &str) -> Result<[u8; 32], String> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_text, &mut out)
        .map_err(|e| format!("expected a 32-byte key as 64 hex digits: {e}"))?;
    Ok(out)
}

/// The mode bits of a file (for checks and tests).
pub fn mode(path: &Path) -> io::Result<u32> {
    Ok(fs::metadata(path)?.permissions().mode() & 0o777)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_is_0600_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("node.key");
        write_secret(&p, hex::encode([7u8; 32]).as_bytes()).unwrap();
        assert_eq!(mode(&p).unwrap(), 0o600);
        assert_eq!(read_key32(&p).unwrap(), [7u8; 32]);
    }

    #[test]
    fn malformed_key_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.key");
        write_public(&p, b"not hex").unwrap();
        let e = read_key32(&p).unwrap_err().to_string();
        assert!(e.contains("bad.key") && e.contains("64 hex digits"), "{e}");
    }
}
