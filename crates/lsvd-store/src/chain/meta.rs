//! The drive record of a chained or striped store: one small file per drive that says
//! which chain the drive belongs to, at which position, and (for a chain) which drive
//! holds the log's tail.
//!
//! It exists so that opening refuses a drive from another chain, a drive given at the
//! wrong position, and a blank drive standing in for a lost one, instead of silently
//! serving a volume with objects missing. It never says where an object is: objects
//! are found by listing the drives, so a record that lags behind (a crash during a
//! tail move) only changes where the next object goes. This module reads the file and
//! replaces it atomically; the byte layout is `lsvd_core::format::chain_drive`. Layout
//! and rules: docs/format/chain.md.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub use lsvd_core::format::chain_drive::{DriveRecord, Layout, MAX_DRIVES};
use lsvd_core::format::chain_drive::{decode_drive_record, encode_drive_record};

use lsvd_core::error::{Error, ErrorKind, Result};

/// File name of the record in each drive's directory (never a valid volume name, so
/// never an object key; the stores hide it from listings).
pub const DRIVE_RECORD_NAME: &str = ".lsvd-chain";

fn record_path(dir: &Path) -> PathBuf {
    dir.join(DRIVE_RECORD_NAME)
}

/// The record of the drive at `dir`: None if it has none, `Corrupt` if it fails its
/// checks, `LocalIo` if it cannot be read.
pub fn read_drive_record(dir: &Path) -> Result<Option<DriveRecord>> {
    let path = record_path(dir);
    match fs::read(&path) {
        Ok(b) => decode_drive_record(&b)
            .map(Some)
            .map_err(|e| Error::with_source(ErrorKind::Corrupt, path.display().to_string(), e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::local_io(format!("read {}", path.display()), e)),
    }
}

/// Replace the record of the drive at `dir` atomically (see [`write_atomically`]).
pub fn write_drive_record(dir: &Path, r: &DriveRecord) -> Result<()> {
    write_atomically(dir, &record_path(dir), &encode_drive_record(r))
}

/// Replace `path` (in directory `dir`) with `bytes` atomically: a temporary file
/// (hidden from listings like the local store's own), fsync, rename over the old one,
/// fsync the directory. A crash leaves the old file or the new one, never a mix.
pub fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    static N: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".tmp.chain.{}.{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let io = |what: &str, p: &Path, e: std::io::Error| {
        Error::local_io(format!("{what} {}", p.display()), e)
    };
    let result = (|| {
        let mut f = fs::File::create(&tmp).map_err(|e| io("create", &tmp, e))?;
        f.write_all(bytes).map_err(|e| io("write", &tmp, e))?;
        f.sync_all().map_err(|e| io("fsync", &tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| io("rename to", path, e))?;
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("fsync directory", dir, e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    /// The format's own example record (drive 1 of a three-drive chain).
    fn sample() -> DriveRecord {
        lsvd_core::format::examples::drive_record()
    }

    #[test]
    fn write_replaces_and_read_verifies() {
        let dir = TempDir::new("chain-meta");
        assert_eq!(read_drive_record(dir.path()).expect("none yet"), None);
        write_drive_record(dir.path(), &sample()).expect("write");
        let newer = DriveRecord {
            generation: 9,
            ..sample()
        };
        write_drive_record(dir.path(), &newer).expect("replace");
        assert_eq!(read_drive_record(dir.path()).expect("read"), Some(newer));
        // No temporary file left behind.
        let names: Vec<String> = fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec![DRIVE_RECORD_NAME.to_string()]);
        let path = dir.path().join(DRIVE_RECORD_NAME);
        let mut b = fs::read(&path).expect("bytes");
        b[33] ^= 0x40;
        fs::write(&path, &b).expect("damage");
        let e = read_drive_record(dir.path()).expect_err("corrupt");
        assert_eq!(e.kind, ErrorKind::Corrupt);
        assert!(e.to_string().contains(DRIVE_RECORD_NAME), "{e}");
    }
}
