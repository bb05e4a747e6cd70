//! The drive record of a chained or striped store: one small file per drive that says
//! which chain the drive belongs to, at which position, and (for a chain) which drive
//! holds the log's tail.
//!
//! It exists so that opening refuses a drive from another chain, a drive given at the
//! wrong position, and a blank drive standing in for a lost one, instead of silently
//! serving a volume with objects missing. It never says where an object is: objects
//! are found by listing the drives, so a record that lags behind (a crash during a
//! tail move) only changes where the next object goes. Layout and rules:
//! docs/format/chain.md.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, ErrorKind, Result};

/// File name of the record in each drive's directory (never a valid volume name, so
/// never an object key; the stores hide it from listings).
pub const DRIVE_RECORD_NAME: &str = ".lsvd-chain";

pub const DRIVE_RECORD_MAGIC: &[u8; 8] = b"LSVDCHN\0";
pub const DRIVE_RECORD_VERSION: u16 = 1;
pub const DRIVE_RECORD_BYTES: usize = 64;

/// Most drives in one chain or stripe.
pub const MAX_DRIVES: usize = 64;

/// How the drives are used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One log over the drives in turn: new objects on the tail drive.
    Chain,
    /// Objects spread over every drive by a hash of their key (RAID-0 under the log).
    Stripe,
}

impl Layout {
    fn code(self) -> u8 {
        match self {
            Layout::Chain => 1,
            Layout::Stripe => 2,
        }
    }
    fn from_code(c: u8) -> Option<Layout> {
        match c {
            1 => Some(Layout::Chain),
            2 => Some(Layout::Stripe),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Layout::Chain => "chain",
            Layout::Stripe => "stripe",
        }
    }
}

/// The record of one drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriveRecord {
    /// Random at creation, the same on every drive of the set.
    pub chain_id: [u8; 16],
    /// Raised by one at every tail move; the highest on any drive is current.
    pub generation: u64,
    pub layout: Layout,
    pub drive_count: u16,
    /// This drive's position (0-based) in the set.
    pub drive_index: u16,
    /// The drive new client objects go to (chain; 0 for a stripe).
    pub tail_index: u16,
    /// Directories per position: 1, or 2 for mirrored drives.
    pub copies: u8,
    /// Set on the copy that kept serving while its mirror was away (flag bit 0): the
    /// mirror missed writes and deletes, and is made an exact copy of this one at the
    /// next open that finds it.
    pub mirror_stale: bool,
}

/// Flag bit 0: see [`DriveRecord::mirror_stale`].
const FLAG_MIRROR_STALE: u16 = 1;

/// Encode a record (64 bytes, little-endian, CRC32C over all of it with the CRC field
/// zero).
pub fn encode_drive_record(r: &DriveRecord) -> [u8; DRIVE_RECORD_BYTES] {
    let mut b = [0u8; DRIVE_RECORD_BYTES];
    b[0..8].copy_from_slice(DRIVE_RECORD_MAGIC);
    b[8..10].copy_from_slice(&DRIVE_RECORD_VERSION.to_le_bytes());
    let flags = if r.mirror_stale { FLAG_MIRROR_STALE } else { 0 };
    b[10..12].copy_from_slice(&flags.to_le_bytes());
    // 12..16 CRC, filled in last.
    b[16..32].copy_from_slice(&r.chain_id);
    b[32..40].copy_from_slice(&r.generation.to_le_bytes());
    b[40] = r.layout.code();
    b[41] = r.copies;
    b[42..44].copy_from_slice(&r.drive_count.to_le_bytes());
    b[44..46].copy_from_slice(&r.drive_index.to_le_bytes());
    b[46..48].copy_from_slice(&r.tail_index.to_le_bytes());
    // 48..64: reserved.
    let crc = crc32c::crc32c(&b);
    b[12..16].copy_from_slice(&crc.to_le_bytes());
    b
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Decode and verify a record; any deviation from the layout is `Corrupt`.
pub fn decode_drive_record(b: &[u8]) -> Result<DriveRecord> {
    let bad = |why: &str| Error::new(ErrorKind::Corrupt, format!("chain drive record: {why}"));
    if b.len() != DRIVE_RECORD_BYTES {
        return Err(bad(&format!(
            "{} bytes, expected {DRIVE_RECORD_BYTES}",
            b.len()
        )));
    }
    if &b[0..8] != DRIVE_RECORD_MAGIC {
        return Err(bad("bad magic"));
    }
    let version = u16_at(b, 8);
    if version != DRIVE_RECORD_VERSION {
        return Err(bad(&format!("unknown version {version}")));
    }
    let stored = u32::from_le_bytes([b[12], b[13], b[14], b[15]]);
    let mut zeroed = [0u8; DRIVE_RECORD_BYTES];
    zeroed.copy_from_slice(b);
    zeroed[12..16].fill(0);
    let computed = crc32c::crc32c(&zeroed);
    if stored != computed {
        return Err(bad(&format!(
            "CRC mismatch (stored {stored:08x}, computed {computed:08x})"
        )));
    }
    let flags = u16_at(b, 10);
    if flags & !FLAG_MIRROR_STALE != 0 {
        return Err(bad("unknown flags"));
    }
    if b[48..64].iter().any(|&x| x != 0) {
        return Err(bad("reserved bytes are not zero"));
    }
    let layout = Layout::from_code(b[40]).ok_or_else(|| bad("unknown layout"))?;
    let mut chain_id = [0u8; 16];
    chain_id.copy_from_slice(&b[16..32]);
    let mut generation = [0u8; 8];
    generation.copy_from_slice(&b[32..40]);
    let r = DriveRecord {
        chain_id,
        generation: u64::from_le_bytes(generation),
        layout,
        drive_count: u16_at(b, 42),
        drive_index: u16_at(b, 44),
        tail_index: u16_at(b, 46),
        copies: b[41],
        mirror_stale: flags & FLAG_MIRROR_STALE != 0,
    };
    if !(1..=2).contains(&r.copies) {
        return Err(bad(&format!(
            "{} copies per drive, expected 1 or 2",
            r.copies
        )));
    }
    let count = usize::from(r.drive_count);
    if count == 0 || count > MAX_DRIVES {
        return Err(bad(&format!(
            "drive count {count} outside 1..={MAX_DRIVES}"
        )));
    }
    if r.drive_index >= r.drive_count || r.tail_index >= r.drive_count {
        return Err(bad("drive or tail index past the drive count"));
    }
    Ok(r)
}

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
            .map_err(|e| e.context(path.display())),
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

    fn sample() -> DriveRecord {
        DriveRecord {
            chain_id: [0xc5; 16],
            generation: 0x0102_0304_0506_0708,
            layout: Layout::Chain,
            drive_count: 3,
            drive_index: 1,
            tail_index: 2,
            copies: 2,
            mirror_stale: false,
        }
    }

    const GOLDEN: [u8; DRIVE_RECORD_BYTES] = {
        let mut b = [0u8; DRIVE_RECORD_BYTES];
        let head = *b"LSVDCHN\0\x01\x00\x00\x00";
        let mut i = 0;
        while i < 12 {
            b[i] = head[i];
            i += 1;
        }
        while i < 32 {
            b[i] = if i >= 16 { 0xc5 } else { 0 };
            i += 1;
        }
        let gen_le = [8u8, 7, 6, 5, 4, 3, 2, 1];
        while i < 40 {
            b[i] = gen_le[i - 32];
            i += 1;
        }
        b[40] = 1;
        b[41] = 2;
        b[42] = 3;
        b[44] = 1;
        b[46] = 2;
        b
    };
    const GOLDEN_CRC: u32 = 0x4d10_44c4;

    /// The bytes of a known record, field by field (CRC aside, checked against the
    /// constant), then every single-bit flip refused.
    #[test]
    fn golden_bytes_and_every_bit_flip() {
        let buf = encode_drive_record(&sample());
        assert_eq!(&buf[..12], &GOLDEN[..12]);
        assert_eq!(&buf[16..], &GOLDEN[16..]);
        let crc = u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]);
        assert_eq!(crc, GOLDEN_CRC, "CRC of the golden record: {crc:#010x}");
        assert_eq!(decode_drive_record(&buf).expect("decodes"), sample());
        for bit in 0..DRIVE_RECORD_BYTES * 8 {
            let mut bad = buf;
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_drive_record(&bad).is_err(), "flip of bit {bit}");
        }
        assert!(decode_drive_record(&buf[..DRIVE_RECORD_BYTES - 1]).is_err());
        let flagged = DriveRecord {
            mirror_stale: true,
            ..sample()
        };
        let b = encode_drive_record(&flagged);
        assert_eq!(&b[10..12], &[1, 0], "flag bit 0");
        assert_eq!(decode_drive_record(&b).expect("decodes"), flagged);
        assert!(decode_drive_record(&[]).is_err());
    }

    /// Values the CRC cannot catch (written that way by a bug): refused too.
    #[test]
    fn out_of_range_fields_are_refused() {
        for r in [
            DriveRecord {
                drive_count: 0,
                drive_index: 0,
                tail_index: 0,
                ..sample()
            },
            DriveRecord {
                drive_index: 3,
                ..sample()
            },
            DriveRecord {
                tail_index: 3,
                ..sample()
            },
            DriveRecord {
                drive_count: MAX_DRIVES as u16 + 1,
                ..sample()
            },
            DriveRecord {
                copies: 0,
                ..sample()
            },
            DriveRecord {
                copies: 3,
                ..sample()
            },
        ] {
            let e = decode_drive_record(&encode_drive_record(&r)).expect_err("refused");
            assert_eq!(e.kind, ErrorKind::Corrupt, "{r:?}: {e}");
        }
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
