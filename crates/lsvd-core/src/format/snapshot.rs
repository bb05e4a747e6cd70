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
//!      8    2 version (2; version 1, 136 bytes without the history, is still read)
//!     10    2 flags (0; others refused)
//!     12    4 crc32c over the whole record (this field zero)
//!     16   16 volume id
//!     32    8 base checkpoint's sequence number (NONE = u64::MAX)
//!     40    8 through_seq: the snapshot holds the objects below it
//!     48    8 newest write-log record sequence number the snapshot holds
//!     56    8 created at, milliseconds since the Unix epoch
//!     64    2 name length in bytes (1..=64)
//!     66    2 history segment count n (version 2; reserved 0 in version 1)
//!     68    4 reserved (0)
//!     72   64 name (ASCII, zero-padded)
//!  version 2:
//!    136    8 history from_seq
//!    144 24*n history segments: first_seq u64, epoch u64, after_seq u64
//! ```
//!
//! The history (`crate::history`) says which epoch wrote each object from the base
//! checkpoint to `through_seq`, so the snapshot names exactly the objects it holds
//! even where objects of other epochs share their numbers. Version 1 records were
//! written before epochs: every object they hold is epoch 0.

use super::{FormatError, VolumeId, Writer, invalid, open_two_version_record, padded_text};
use crate::history::{History, MAX_SEGMENTS, Segment};

pub const SNAPSHOT_MAGIC: &[u8; 8] = b"LSVDSNP\0";
pub const SNAPSHOT_VERSION: u16 = 2;
/// Size of a version 1 record; a version 2 record adds 8 + 24 per segment.
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
    /// Which epoch wrote each object it holds (from the base checkpoint on).
    pub history: History,
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
    let segments = &s.history.segments[..s.history.segments.len().min(MAX_SEGMENTS)];
    let mut w = Writer::with_capacity(SNAPSHOT_BYTES + 8 + 24 * segments.len());
    w.head(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, 0);
    w.bytes(&s.volume.0);
    w.u64s(&[
        s.base_checkpoint.unwrap_or(NO_CHECKPOINT),
        s.through_seq,
        s.last_record_seq,
        s.created_unix_ms,
    ]);
    w.u16(name.len() as u16);
    w.u16(segments.len() as u16);
    w.zeros(4);
    w.bytes(name);
    w.zeros(MAX_SNAPSHOT_NAME_BYTES - name.len());
    w.u64(s.history.from_seq);
    for seg in segments {
        w.u64s(&[seg.first_seq, seg.epoch, seg.after_seq]);
    }
    Ok(w.seal(CRC_AT))
}

pub fn decode_snapshot(buf: &[u8]) -> Result<SnapshotRecord, FormatError> {
    const WHAT: &str = "snapshot record";
    let lengths = (SNAPSHOT_BYTES, SNAPSHOT_BYTES + 8);
    let (mut r, version, _flags) =
        open_two_version_record(buf, WHAT, SNAPSHOT_MAGIC, SNAPSHOT_VERSION, lengths, 0)?;
    let volume = VolumeId(r.array()?);
    let [base, through_seq, last_record_seq, created_unix_ms] = r.u64s()?;
    let name_len = r.u16()? as usize;
    let segment_count = r.u16()? as usize;
    let reserved: [u8; 4] = r.array()?;
    let name_field: [u8; MAX_SNAPSHOT_NAME_BYTES] = r.array()?;
    if reserved != [0; 4] || (version == 1 && segment_count != 0) {
        return Err(invalid(WHAT, "reserved bytes are not zero"));
    }
    let mut history = History::legacy();
    if version == SNAPSHOT_VERSION {
        let expected = SNAPSHOT_BYTES + 8 + 24 * segment_count;
        if segment_count > MAX_SEGMENTS || buf.len() != expected {
            return Err(invalid(
                WHAT,
                format!("{} bytes, its counts say {expected}", buf.len()),
            ));
        }
        history.from_seq = r.u64()?;
        for _ in 0..segment_count {
            history.segments.push(Segment {
                first_seq: r.u64()?,
                epoch: r.u64()?,
                after_seq: r.u64()?,
            });
        }
        history
            .validate()
            .map_err(|e| invalid(WHAT, format!("history: {e}")))?;
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
        history,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_support::{assert_corruption_refused, refit_crc, stored_crc};

    fn sample() -> SnapshotRecord {
        SnapshotRecord {
            volume: VolumeId([7; 16]),
            name: "before-upgrade".into(),
            base_checkpoint: Some(0x40),
            through_seq: 0x45,
            last_record_seq: 1234,
            created_unix_ms: 1_800_000_000_000,
            history: History {
                from_seq: 0x40,
                segments: vec![Segment {
                    first_seq: 0x3c,
                    epoch: 6,
                    after_seq: 0x3a,
                }],
            },
        }
    }

    /// The record as builds before epochs wrote it.
    fn version_1(s: &SnapshotRecord) -> Vec<u8> {
        let mut buf = encode_snapshot(s).expect("encodes")[..SNAPSHOT_BYTES].to_vec();
        buf[8] = 1;
        buf[66..68].fill(0);
        refit_crc(&mut buf, CRC_AT);
        buf
    }

    #[test]
    fn version_1_still_reads_with_every_object_epoch_0() {
        let v1 = version_1(&sample());
        let back = decode_snapshot(&v1).expect("decodes");
        assert_eq!(
            back,
            SnapshotRecord {
                history: History::legacy(),
                ..sample()
            }
        );
        assert_eq!(back.history.epoch_of(0x41), Some(0));
    }

    #[test]
    fn round_trip_golden_and_corruption() {
        let buf = encode_snapshot(&sample()).expect("encodes");
        assert_eq!(buf.len(), SNAPSHOT_BYTES + 8 + 24);
        assert_eq!(&buf[..8], SNAPSHOT_MAGIC);
        assert_eq!(&buf[8..12], &[2, 0, 0, 0]);
        assert_eq!(&buf[66..68], &[1, 0]);
        assert_eq!(&buf[136..144], &0x40u64.to_le_bytes());
        assert_eq!(&buf[152..160], &6u64.to_le_bytes());
        assert_eq!(&buf[32..40], &0x40u64.to_le_bytes());
        assert_eq!(&buf[40..48], &0x45u64.to_le_bytes());
        assert_eq!(&buf[64..66], &14u16.to_le_bytes());
        assert_eq!(&buf[72..86], b"before-upgrade");
        assert_eq!(stored_crc(&buf, CRC_AT), GOLDEN_CRC);
        assert_eq!(decode_snapshot(&buf).expect("decodes"), sample());
        assert_corruption_refused(&buf, 0x10, decode_snapshot);
    }
    const GOLDEN_CRC: u32 = 0x7a0c_3abb;

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
