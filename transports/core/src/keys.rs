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

/// Write `contents` to `path` whole, with `mode`: into a new temporary file beside it, synced, then renamed over
/// `path`, so a reader never sees half a file and a crash never leaves a secret readable.
///
/// The temporary file gets a random name and is created with `O_EXCL | O_NOFOLLOW` and its final mode, so a
/// symlink or a file planted under that name is never followed or reused. The rename replaces a symlink at `path`
/// itself rather than writing through it.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), KeyFileError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let mut attempt = 0;
    let (tmp, mut f) = loop {
        let tmp = path.with_file_name(format!(".{name}.{:016x}.tmp", random_u64()));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(mode)
            .open(&tmp)
        {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 8 => attempt += 1,
            Err(e) => return Err(io_err(&tmp)(e)),
        }
    };
    let written = (|| {
        // The umask may have narrowed the mode given to `open`; set it exactly.
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.write_all(contents)?;
        f.sync_all()
    })();
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(io_err(path)(e));
    }
    Ok(())
}

/// Write `contents` to `path` as a secret: mode 0600 from the moment the file exists ([`write_atomic`]).
pub fn write_secret(path: &Path, contents: &[u8]) -> Result<(), KeyFileError> {
    write_atomic(path, contents, 0o600)
}

/// Write a public file (mode 0644) whole ([`write_atomic`]).
pub fn write_public(path: &Path, contents: &[u8]) -> Result<(), KeyFileError> {
    write_atomic(path, contents, 0o644)
}

/// 64 bits from the kernel's random source (temporary names only; no secret depends on them).
fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if fs::File::open("/dev/urandom")
        .and_then(|mut f| io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        b = (t ^ u64::from(std::process::id()).rotate_left(32)).to_le_bytes();
    }
    u64::from_le_bytes(b)
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
    fn a_planted_symlink_is_replaced_not_followed_and_no_temporary_file_remains() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        let p = dir.path().join("node.key");
        std::os::unix::fs::symlink(&victim, &p).unwrap();
        write_secret(&p, b"secret").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        assert!(!std::fs::symlink_metadata(&p)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(mode(&p).unwrap(), 0o600);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        // An existing world-readable file is replaced by one with the mode asked for.
        let q = dir.path().join("old.key");
        std::fs::write(&q, b"x").unwrap();
        std::fs::set_permissions(&q, fs::Permissions::from_mode(0o666)).unwrap();
        write_secret(&q, b"y").unwrap();
        assert_eq!(mode(&q).unwrap(), 0o600);
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
