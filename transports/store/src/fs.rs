//! What kind of filesystem a store lives on, so that results say whether its `fdatasync` means durability.
//!
//! On a memory filesystem (tmpfs, ramfs) `fdatasync` returns at once and nothing survives a power cut: a store there
//! with a sync policy measures no durability at all, and results flag it ([`is_volatile`]).

use std::io;
use std::path::Path;

/// `statfs` magic numbers (linux/magic.h) and the names results use for them.
const KNOWN: &[(i64, &str)] = &[
    // ext2, ext3 and ext4 share one magic number.
    (0xEF53, "ext4"),
    (0x0102_1994, "tmpfs"),
    (0x8584_58f6, "ramfs"),
    (0x5846_5342, "xfs"),
    (0x9123_683E, "btrfs"),
    (0x794C_7630, "overlay"),
    (0xF2F5_2010, "f2fs"),
    (0x2FC1_2FC1, "zfs"),
    (0x6969, "nfs"),
    (0xFF53_4D42, "cifs"),
    (0x6573_5546, "fuse"),
    (0x0102_1997, "9p"),
    (0x4d44, "vfat"),
    (0x7366_746E, "ntfs"),
];

/// The type of the filesystem holding `path` (`statfs` f_type): a name from the table above, or the magic number
/// in hex (`0x...`) for one it does not know.
pub fn filesystem(path: &Path) -> io::Result<String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: a zeroed statfs is a valid value to be overwritten; the path is a valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(name(st.f_type as i64))
}

fn name(magic: i64) -> String {
    // f_type is signed on some targets: compare the low 32 bits.
    let magic = magic & 0xFFFF_FFFF;
    KNOWN
        .iter()
        .find(|(m, _)| *m == magic)
        .map(|(_, n)| n.to_string())
        .unwrap_or_else(|| format!("{magic:#x}"))
}

/// Whether a filesystem of this name keeps its data in memory only, where a sync is free and proves nothing.
pub fn is_volatile(name: &str) -> bool {
    matches!(name, "tmpfs" | "ramfs")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(name(0xEF53), "ext4");
        assert_eq!(name(0x0102_1994), "tmpfs");
        assert_eq!(name(0x1234), "0x1234");
        assert!(is_volatile("tmpfs") && !is_volatile("ext4"));
    }

    #[test]
    fn memory_filesystems_are_recognised() {
        // /dev/shm is a tmpfs on Linux wherever it exists; /proc never is a disk.
        if Path::new("/dev/shm").is_dir() {
            assert_eq!(filesystem(Path::new("/dev/shm")).unwrap(), "tmpfs");
        }
        assert!(filesystem(Path::new("/no/such/dir")).is_err());
    }
}
