//! The snapshot record: a small object in the store, one per snapshot, that names a
//! point in the volume's object sequence.
//!
//! A snapshot is the volume as the store held it when every object below
//! `through_seq` was applied: checkpoint `base_checkpoint` (or the empty volume when
//! there is none) followed by every object from the checkpoint up to, not including,
//! `through_seq`. Garbage collection keeps those objects (the checkpoint, what it
//! lists, and everything after it below `through_seq`) for as long as the record
//! exists. It lives at `<volume>/snap/<name>`, written with put-if-absent (a name is
//! taken once) and never changed; deleting it releases the objects.
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDSNP\0"
//!      8    2 version (1)
//!     10    2 flags (0; others refused)
//!     12    4 crc32c over bytes 0..136 (this field zero)
//!     16   16 volume id
//!     32    8 base checkpoint's sequence number (NONE = u64::MAX)
//!     40    8 through_seq: the snapshot holds the objects below it
//!     48    8 newest write-log record sequence number the snapshot holds
//!     56    8 created at, milliseconds since the Unix epoch
//!     64    2 name length in bytes (1..=64)
//!     66    6 reserved (0)
//!     72   64 name (ASCII, zero-padded)
//! ```

use super::{FormatError, VolumeId, Writer, invalid, open_fixed_record, padded_text};

pub const SNAPSHOT_MAGIC: &[u8; 8] = b"LSVDSNP\0";
pub const SNAPSHOT_VERSION: u16 = 1;
pub const SNAPSHOT_BYTES: usize = 136;
/// Longest snapshot name, in bytes.
pub const MAX_SNAPSHOT_NAME_BYTES: usize = 64;
const NO_CHECKPOINT: u64 = u64::MAX;
const CRC_AT: usize = 12;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRecord {
    pub volume: VolumeId,
    pub name: String,
    /// The checkpoint the snapshot's state starts from (None: from the first object).
    pub base_checkpoint: Option<u64>,
    /// The snapshot holds the objects with smaller sequence numbers.
    pub through_seq: u64,
    pub last_record_seq: u64,
    pub created_unix_ms: u64,
}

/// Encode `s`. A name longer than [`MAX_SNAPSHOT_NAME_BYTES`] or empty is the
/// caller's bug: names are validated before a record is made.
pub fn encode_snapshot(s: &SnapshotRecord) -> Result<Vec<u8>, FormatError> {
    let name = s.name.as_bytes();
    if name.is_empty() || name.len() > MAX_SNAPSHOT_NAME_BYTES {
        return Err(invalid(
            "snapshot record",
            format!("a name of {} bytes", name.len()),
        ));
    }
    let mut w = Writer::with_capacity(SNAPSHOT_BYTES);
    w.bytes(SNAPSHOT_MAGIC);
    w.u16(SNAPSHOT_VERSION);
    w.u16(0);
    w.u32(0);
    w.bytes(&s.volume.0);
    w.u64(s.base_checkpoint.unwrap_or(NO_CHECKPOINT));
    w.u64(s.through_seq);
    w.u64(s.last_record_seq);
    w.u64(s.created_unix_ms);
    w.u16(name.len() as u16);
    w.zeros(6);
    w.bytes(name);
    w.zeros(MAX_SNAPSHOT_NAME_BYTES - name.len());
    let crc = crc32c::crc32c(&w.buf);
    w.put_u32_at(CRC_AT, crc);
    Ok(w.buf)
}

pub fn decode_snapshot(buf: &[u8]) -> Result<SnapshotRecord, FormatError> {
    const WHAT: &str = "snapshot record";
    let (mut r, _flags) = open_fixed_record(
        buf,
        WHAT,
        SNAPSHOT_BYTES,
        SNAPSHOT_MAGIC,
        SNAPSHOT_VERSION,
        0,
    )?;
    let volume = VolumeId(r.array()?);
    let base = r.u64()?;
    let through_seq = r.u64()?;
    let last_record_seq = r.u64()?;
    let created_unix_ms = r.u64()?;
    let name_len = r.u16()? as usize;
    let reserved: [u8; 6] = r.array()?;
    let name_field: [u8; MAX_SNAPSHOT_NAME_BYTES] = r.array()?;
    if reserved != [0; 6] {
        return Err(invalid(WHAT, "reserved bytes are not zero"));
    }
    let name = padded_text(WHAT, "name", name_len, &name_field)?;
    let base_checkpoint = (base != NO_CHECKPOINT).then_some(base);
    if base_checkpoint.is_some_and(|b| b >= through_seq) {
        return Err(invalid(
            WHAT,
            format!("base checkpoint {base:#x} is not below through_seq {through_seq:#x}"),
        ));
    }
    Ok(SnapshotRecord {
        volume,
        name,
        base_checkpoint,
        through_seq,
        last_record_seq,
        created_unix_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SnapshotRecord {
        SnapshotRecord {
            volume: VolumeId([7; 16]),
            name: "before-upgrade".into(),
            base_checkpoint: Some(0x40),
            through_seq: 0x45,
            last_record_seq: 1234,
            created_unix_ms: 1_800_000_000_000,
        }
    }

    #[test]
    fn round_trip_golden_and_corruption() {
        let buf = encode_snapshot(&sample()).expect("encodes");
        assert_eq!(buf.len(), SNAPSHOT_BYTES);
        assert_eq!(&buf[..8], SNAPSHOT_MAGIC);
        assert_eq!(&buf[8..12], &[1, 0, 0, 0]);
        assert_eq!(&buf[32..40], &0x40u64.to_le_bytes());
        assert_eq!(&buf[40..48], &0x45u64.to_le_bytes());
        assert_eq!(&buf[64..66], &14u16.to_le_bytes());
        assert_eq!(&buf[72..86], b"before-upgrade");
        assert_eq!(
            u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]),
            GOLDEN_CRC
        );
        assert_eq!(decode_snapshot(&buf).expect("decodes"), sample());
        for pos in 0..buf.len() {
            let mut bad = buf.clone();
            bad[pos] ^= 0x10;
            assert!(decode_snapshot(&bad).is_err(), "flip at {pos}");
        }
        assert!(decode_snapshot(&buf[..SNAPSHOT_BYTES - 1]).is_err());
    }
    const GOLDEN_CRC: u32 = 0x9290_5ebc;

    #[test]
    fn no_checkpoint_and_bad_names() {
        let s = SnapshotRecord {
            base_checkpoint: None,
            through_seq: 0,
            ..sample()
        };
        let buf = encode_snapshot(&s).expect("encodes");
        assert_eq!(&buf[32..40], &u64::MAX.to_le_bytes());
        assert_eq!(decode_snapshot(&buf).expect("decodes"), s);
        let long = SnapshotRecord {
            name: "x".repeat(65),
            ..sample()
        };
        assert!(encode_snapshot(&long).is_err());
        let empty = SnapshotRecord {
            name: String::new(),
            ..sample()
        };
        assert!(encode_snapshot(&empty).is_err());
    }

    #[test]
    fn a_base_at_or_past_the_end_is_refused() {
        let s = SnapshotRecord {
            base_checkpoint: Some(0x45),
            ..sample()
        };
        let buf = encode_snapshot(&s).expect("encodes");
        let e = decode_snapshot(&buf).expect_err("base == through");
        assert!(e.to_string().contains("not below"), "{e}");
    }
}
