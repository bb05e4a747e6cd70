//! CloudPhysics binary vscsi traces (as read by libCacheSim/PyMimircache),
//! fixed-size little-endian records with no file header:
//!
//! * v1, 32 bytes: `sn u32, len u32, nSG u32, cmd u16, ver u16, lbn u64,
//!   ts u64`
//! * v2, 40 bytes: `cmd u16, ver u16, sn u32, len u32, nSG u32, lbn u64,
//!   ts u64, rt u64`
//!
//! The version is `ver >> 8` and is checked on the first two records (as
//! libCacheSim does) and then on every record.
//!
//! * ts: microseconds → ×1000 ns.
//! * len: bytes.
//! * lbn: 512 B sectors → ×512 bytes.
//! * cmd: SCSI opcode; commands other than READ/WRITE are skipped.
//! * Single volume, named `vol0`.
//!
//! Bad: a record whose version differs from the file's, a truncated final
//! record, overflow. Line numbers in errors are 1-based record numbers.

use super::{Line, Record, disksim::SECTOR, scsi};
use crate::numbers::{Why, scaled};
use crate::volumes::VolumeKey;

/// A vscsi record layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    V1,
    V2,
}

/// The largest record size (v2).
pub(crate) const MAX_RECORD: usize = 40;

/// Nanoseconds per vscsi timestamp tick (µs).
const NS_PER_US: u64 = 1000;

impl Version {
    pub(crate) fn record_size(self) -> usize {
        match self {
            Version::V1 => 32,
            Version::V2 => 40,
        }
    }

    fn number(self) -> u8 {
        match self {
            Version::V1 => 1,
            Version::V2 => 2,
        }
    }

    /// Byte offset of the `ver` field.
    fn ver_offset(self) -> usize {
        match self {
            Version::V1 => 14,
            Version::V2 => 2,
        }
    }

    /// The version number stored in `rec`.
    fn stored(self, rec: &[u8]) -> u8 {
        // `ver` is a little-endian u16 whose high byte is the version.
        rec[self.ver_offset() + 1]
    }
}

/// The record version of a vscsi file from its first bytes, or `None` if
/// it is not vscsi. Like libCacheSim, v2 needs two matching records; v1
/// accepts a file of a single record.
pub(crate) fn detect_version(prefix: &[u8]) -> Option<Version> {
    [Version::V2, Version::V1].into_iter().find(|&v| {
        let size = v.record_size();
        let records = (prefix.len() / size).min(2);
        let needed = if v == Version::V2 { 2 } else { 1 };
        records >= needed
            && prefix
                .chunks_exact(size)
                .take(records)
                .all(|rec| v.stored(rec) == v.number())
    })
}

fn u16_at(rec: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([rec[at], rec[at + 1]])
}

fn u32_at(rec: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&rec[at..at + 4]);
    u32::from_le_bytes(b)
}

fn u64_at(rec: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&rec[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Decodes one record of `version.record_size()` bytes.
pub(crate) fn decode(version: Version, rec: &[u8]) -> Result<Line<'static>, Why> {
    let stored = version.stored(rec);
    if stored != version.number() {
        return Err(format!(
            "record version {stored}, expected {}",
            version.number()
        ));
    }
    let (cmd, len) = match version {
        Version::V1 => (u16_at(rec, 12), u32_at(rec, 4)),
        Version::V2 => (u16_at(rec, 0), u32_at(rec, 8)),
    };
    let lbn = u64_at(rec, 16);
    let ts = u64_at(rec, 24);
    let Some(op) = scsi::classify(u64::from(cmd)) else {
        return Ok(Line::Skipped);
    };
    Ok(Line::Record(Record {
        time_ns: scaled(ts, NS_PER_US, "ts (us)")?,
        volume: VolumeKey::Single,
        op,
        offset: scaled(lbn, SECTOR, "lbn")?,
        length: u64::from(len),
    }))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::Op;

    /// Encodes a v1 record (for tests).
    pub(crate) fn v1_record(len: u32, cmd: u16, lbn: u64, ts_us: u64) -> [u8; 32] {
        let mut r = [0u8; 32];
        r[4..8].copy_from_slice(&len.to_le_bytes());
        r[8..12].copy_from_slice(&1u32.to_le_bytes());
        r[12..14].copy_from_slice(&cmd.to_le_bytes());
        r[14..16].copy_from_slice(&0x0100u16.to_le_bytes());
        r[16..24].copy_from_slice(&lbn.to_le_bytes());
        r[24..32].copy_from_slice(&ts_us.to_le_bytes());
        r
    }

    fn v2_record(len: u32, cmd: u16, lbn: u64, ts_us: u64) -> [u8; 40] {
        let mut r = [0u8; 40];
        r[0..2].copy_from_slice(&cmd.to_le_bytes());
        r[2..4].copy_from_slice(&0x0200u16.to_le_bytes());
        r[8..12].copy_from_slice(&len.to_le_bytes());
        r[16..24].copy_from_slice(&lbn.to_le_bytes());
        r[24..32].copy_from_slice(&ts_us.to_le_bytes());
        r
    }

    #[test]
    fn versions_and_records() {
        let a = v1_record(512, 0x2a, 10, 7);
        let b = v1_record(4096, 0x28, 11, 8);
        let file: Vec<u8> = a.iter().chain(b.iter()).copied().collect();
        assert_eq!(detect_version(&file), Some(Version::V1));
        assert_eq!(detect_version(&a), Some(Version::V1));
        assert_eq!(
            detect_version(b"version,time,op,size,lbn\n1,2,3,4,5\n"),
            None
        );
        assert_eq!(
            decode(Version::V1, &b),
            Ok(Line::Record(Record {
                time_ns: 8000,
                volume: VolumeKey::Single,
                op: Op::Read,
                offset: 11 * 512,
                length: 4096,
            }))
        );
        assert_eq!(
            decode(Version::V1, &v1_record(0, 0x35, 0, 9)),
            Ok(Line::Skipped)
        );

        let c = v2_record(1024, 0x2a, 3, 5);
        let file2: Vec<u8> = c.iter().chain(c.iter()).copied().collect();
        assert_eq!(detect_version(&file2), Some(Version::V2));
        assert_eq!(
            decode(Version::V2, &c).map(|l| match l {
                Line::Record(r) => (r.op, r.offset, r.length, r.time_ns),
                _ => (Op::Trim, 0, 0, 0),
            }),
            Ok((Op::Write, 1536, 1024, 5000))
        );
        let mut bad = a;
        bad[15] = 7;
        assert!(decode(Version::V1, &bad).is_err());
    }
}
