//! The write-log index: a checkpoint of the write log's map, kept at a fixed place in
//! the cache file so recovery need not read every record's data.
//!
//! Two slots follow the log region; each write goes to the slot the generation picks
//! (`generation % 2`), so a torn index write leaves the other slot valid. An index
//! lists, in sequence order, records that were durable on the cache device when it
//! was written: for each, where it starts and its header without padding (the
//! header already says everything the map needs: extents, sizes, CRCs). Recovery
//! takes the records from the superblock's tail on from the index, then follows the
//! chain on disk from the last one, verifying as usual.
//!
//! ```text
//! offset size field
//!      0    8 magic "LSVDLIX\0"
//!      8    2 version (1)
//!     10    2 flags (0)
//!     12    4 crc32c over bytes [0, 64 + entries_bytes) (this field zero)
//!     16   16 volume id
//!     32    8 generation (the higher valid slot wins)
//!     40    8 record count
//!     48    8 entries_bytes
//!     56    8 epoch: the cache superblock's index epoch when this was written
//!     64      entries, one per record, in sequence order:
//!               offset      u64  where the record starts in the cache file
//!               header_len  u32  64 + 16 * extent count
//!               header      the record's header bytes [0, header_len)
//! ```

use super::record::{MAX_RECORD_EXTENTS, RecordHeader, decode_record_header};
use super::{FormatError, Reader, VolumeId, Writer, check_crc, invalid};

pub const LOG_INDEX_MAGIC: &[u8; 8] = b"LSVDLIX\0";
pub const LOG_INDEX_VERSION: u16 = 1;
/// Bytes before the entries.
pub const LOG_INDEX_FIXED_BYTES: usize = 64;
const CRC_AT: usize = 12;
const WHAT: &str = "write-log index";
const MAX_HEADER_LEN: usize = 64 + 16 * MAX_RECORD_EXTENTS as usize;

/// One record as the index knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedRecord {
    pub offset: u64,
    pub header: RecordHeader,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogIndex {
    pub volume: VolumeId,
    pub generation: u64,
    /// Valid only while the cache superblock carries the same epoch.
    pub epoch: u64,
    pub records: Vec<IndexedRecord>,
}

/// Encode an index from `(offset, unpadded header bytes)` pairs.
pub fn encode_log_index<'a>(
    volume: VolumeId,
    generation: u64,
    epoch: u64,
    records: impl Iterator<Item = (u64, &'a [u8])> + Clone,
) -> Vec<u8> {
    let count = records.clone().count();
    let entries_bytes: usize = records.clone().map(|(_, h)| 12 + h.len()).sum();
    let mut w = Writer::with_capacity(LOG_INDEX_FIXED_BYTES + entries_bytes);
    w.head(LOG_INDEX_MAGIC, LOG_INDEX_VERSION, 0);
    w.bytes(&volume.0);
    w.u64s(&[generation, count as u64, entries_bytes as u64, epoch]);
    for (offset, header) in records {
        w.u64(offset);
        w.u32(header.len() as u32);
        w.bytes(header);
    }
    w.seal(CRC_AT)
}

/// How many bytes the whole index occupies, from its first [`LOG_INDEX_FIXED_BYTES`].
pub fn log_index_len(fixed: &[u8]) -> Result<u64, FormatError> {
    let mut r = Reader::new(fixed, WHAT);
    r.head(LOG_INDEX_MAGIC, LOG_INDEX_VERSION)?;
    r.take(32)?; // volume, generation, count
    let entries_bytes = r.u64()?;
    Ok(LOG_INDEX_FIXED_BYTES as u64 + entries_bytes)
}

pub fn decode_log_index(buf: &[u8]) -> Result<LogIndex, FormatError> {
    let mut r = Reader::new(buf, WHAT);
    let (flags, stored) = r.head(LOG_INDEX_MAGIC, LOG_INDEX_VERSION)?;
    let volume = VolumeId(r.array()?);
    let [generation, count, entries_bytes, epoch] = r.u64s()?;
    let end = usize::try_from(entries_bytes)
        .ok()
        .and_then(|e| e.checked_add(LOG_INDEX_FIXED_BYTES))
        .filter(|&e| e <= buf.len())
        .ok_or(FormatError::Truncated {
            what: WHAT,
            need: LOG_INDEX_FIXED_BYTES.saturating_add(entries_bytes as usize),
            have: buf.len(),
        })?;
    check_crc(WHAT, &buf[..end], CRC_AT, stored)?;
    if flags != 0 {
        return Err(invalid(WHAT, format!("unknown flags {flags:#06x}")));
    }
    let mut r = Reader::new(&buf[LOG_INDEX_FIXED_BYTES..end], WHAT);
    let mut records = Vec::new();
    for _ in 0..count {
        let offset = r.u64()?;
        let len = r.u32()? as usize;
        if len > MAX_HEADER_LEN {
            return Err(invalid(WHAT, format!("record header of {len} bytes")));
        }
        let header = decode_record_header(r.take(len)?)?;
        if let Some(prev) = records.last().map(|p: &IndexedRecord| &p.header)
            && (prev.seq.checked_add(1) != Some(header.seq) || header.prev_crc != prev.crc)
        {
            return Err(invalid(WHAT, "records are not one chain"));
        }
        records.push(IndexedRecord { offset, header });
    }
    if r.pos() != end - LOG_INDEX_FIXED_BYTES {
        return Err(invalid(WHAT, "entries do not fill entries_bytes"));
    }
    Ok(LogIndex {
        volume,
        generation,
        epoch,
        records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::record::{
        ExtentKind, RECORD_VERSION, RecordExtent, encode_header_prefix, encode_record,
        encode_record_as,
    };
    use crate::format::test_support::{assert_each_flip_refused, feed_garbage};

    use crate::format::examples::log_index_records as records;

    #[test]
    fn round_trip_and_every_flip_detected() {
        let recs = records();
        let buf = encode_log_index(
            VolumeId([5; 16]),
            3,
            77,
            recs.iter().map(|(o, h)| (*o, h.as_slice())),
        );
        assert_eq!(&buf[..8], LOG_INDEX_MAGIC);
        assert_eq!(log_index_len(&buf[..64]).expect("len"), buf.len() as u64);
        let idx = decode_log_index(&buf).expect("decodes");
        assert_eq!((idx.generation, idx.epoch), (3, 77));
        assert_eq!(idx.records.len(), 2);
        assert_eq!(idx.records[1].offset, 16384);
        assert_eq!(idx.records[1].header.seq, 11);
        assert_eq!(idx.records[1].header.extents.len(), 2);
        assert_each_flip_refused(&buf, 0..buf.len(), 0x01, decode_log_index);
        let mut padded = buf.clone();
        padded.extend_from_slice(&[0xAA; 100]);
        assert!(decode_log_index(&padded).is_ok(), "slot padding is ignored");
        assert!(decode_log_index(&buf[..buf.len() - 1]).is_err());
    }

    /// A log written across an upgrade holds version-2 records, then version-3 ones; the
    /// index keeps each header's version, and the headers it returns re-encode to the
    /// bytes it was given (the engine re-encodes them with `encode_header_prefix`).
    #[test]
    fn headers_keep_their_record_version() {
        let v = VolumeId([5; 16]);
        let e = |lba| RecordExtent {
            lba,
            sectors: 8,
            kind: ExtentKind::Data,
        };
        let crc = |r: &[u8]| u32::from_le_bytes([r[48], r[49], r[50], r[51]]);
        let a = encode_record_as(2, v, 10, 0, &[e(0)], &[1; 4096]);
        let b = encode_record_as(RECORD_VERSION, v, 11, crc(&a), &[e(8)], &[2; 4096]);
        let c = encode_record(v, 12, crc(&b), &[e(16), e(64)], &[3; 8192]);
        let recs = [(8192u64, &a[..80]), (16384, &b[..80]), (24576, &c[..96])];
        let buf = encode_log_index(v, 1, 9, recs.iter().map(|(o, h)| (*o, *h)));
        let idx = decode_log_index(&buf).expect("decodes");
        let versions: Vec<u16> = idx.records.iter().map(|r| r.header.version).collect();
        assert_eq!(versions, [2, RECORD_VERSION, RECORD_VERSION]);
        for (rec, (offset, bytes)) in idx.records.iter().zip(recs) {
            assert_eq!(rec.offset, offset);
            assert_eq!(encode_header_prefix(&rec.header), bytes);
        }
        // Re-encoding the index from the decoded headers gives the same bytes.
        let prefixes: Vec<(u64, Vec<u8>)> = idx
            .records
            .iter()
            .map(|r| (r.offset, encode_header_prefix(&r.header)))
            .collect();
        let again = encode_log_index(v, 1, 9, prefixes.iter().map(|(o, h)| (*o, h.as_slice())));
        assert_eq!(again, buf);
    }

    #[test]
    fn a_broken_chain_is_rejected() {
        let mut recs = records();
        recs.swap(0, 1);
        let buf = encode_log_index(
            VolumeId([5; 16]),
            1,
            77,
            recs.iter().map(|(o, h)| (*o, h.as_slice())),
        );
        assert!(decode_log_index(&buf).is_err());
    }

    /// Found with the format_log_index fuzz target: a record with sequence number u64::MAX
    /// followed by one with 0 made the chain check compute `u64::MAX + 1`, a panic in
    /// checked builds and, wrapped, a "chain" in release ones. It is no chain.
    #[test]
    fn fuzz_regression_sequence_wrap_is_not_a_chain() {
        let v = VolumeId([5; 16]);
        let e = RecordExtent {
            lba: 0,
            sectors: 8,
            kind: ExtentKind::Data,
        };
        let a = encode_record(v, u64::MAX, 0, &[e], &[1; 4096]);
        let crc_a = u32::from_le_bytes([a[48], a[49], a[50], a[51]]);
        let b = encode_record(v, 0, crc_a, &[e], &[2; 4096]);
        let recs = [(8192u64, &a[..80]), (8192 + 4608, &b[..80])];
        let buf = encode_log_index(v, 1, 9, recs.iter().map(|(o, h)| (*o, *h)));
        assert!(matches!(
            decode_log_index(&buf),
            Err(FormatError::Invalid { .. })
        ));
    }

    #[test]
    fn garbage_never_panics() {
        feed_garbage(400, 7, |buf| {
            let _ = decode_log_index(buf);
            let _ = log_index_len(buf);
        });
    }
}
