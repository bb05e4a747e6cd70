//! The log side of recovery: follow the write log's record chain from the cache
//! superblock's tail, verifying every record (or taking records from the write-log
//! index, which lists records that were durable when it was written).

use lsvd_core::format::cache_super::CacheSuper;
use lsvd_core::format::log_index::LogIndex;
use lsvd_core::format::record::{
    ExtentKind, LOG_ALIGN_BYTES, RECORD_ALIGN_BYTES, RecordHeader, decode_record_header,
    verify_record,
};

use crate::cache_dev::CacheDevice;
use lsvd_core::error::{Error, ErrorKind, Result};

/// A record found in the write log, verified.
pub struct FoundRecord {
    pub offset: u64,
    pub header: RecordHeader,
}

/// Follow the record chain from `(offset, seq)`: each record must have the next
/// sequence number, this volume's id and a valid checksum. The first failure ends it.
pub fn scan_log(cache: &dyn CacheDevice, sb: &CacheSuper) -> Vec<FoundRecord> {
    scan_log_with_index(cache, sb, None)
}

/// [`scan_log`], taking the records from `index` (durable when it was written, so
/// their data need not be read) as far as it goes from the superblock's tail, then
/// following the chain on disk from there.
pub fn scan_log_with_index(
    cache: &dyn CacheDevice,
    sb: &CacheSuper,
    index: Option<&LogIndex>,
) -> Vec<FoundRecord> {
    let mut out = Vec::new();
    let mut offset = sb.tail_offset;
    let mut expect = sb.tail_seq;
    let mut prev_crc: Option<u32> = None;
    let indexed = index.map_or(&[][..], |i| &i.records[..]);
    if let Some(start) = indexed
        .iter()
        .position(|r| r.header.seq == sb.tail_seq && r.offset == sb.tail_offset)
    {
        for r in &indexed[start..] {
            if r.header.volume != sb.volume
                || r.offset < sb.log_start
                || r.offset + r.header.total_bytes() > sb.log_end
            {
                break;
            }
            prev_crc = Some(r.header.crc);
            offset = r.offset + r.header.total_bytes();
            if offset >= sb.log_end {
                offset = sb.log_start;
            }
            expect = r.header.seq + 1;
            out.push(FoundRecord {
                offset: r.offset,
                header: r.header.clone(),
            });
        }
    }
    loop {
        let found = try_at(cache, sb, offset, expect, prev_crc).or_else(|| {
            if offset != sb.log_start {
                try_at(cache, sb, sb.log_start, expect, prev_crc)
            } else {
                None
            }
        });
        let Some(r) = found else { break };
        prev_crc = Some(r.header.crc);
        offset = r.offset + r.header.total_bytes();
        if offset >= sb.log_end {
            offset = sb.log_start;
        }
        expect += 1;
        out.push(r);
        if out.len() as u64 > sb.log_end / RECORD_ALIGN_BYTES {
            break; // cannot hold more records than sectors; defensive bound
        }
    }
    out
}

/// The record header at `offset`, if one decodes there (headers with many extents
/// span several blocks).
fn header_at(cache: &dyn CacheDevice, sb: &CacheSuper, offset: u64) -> Option<RecordHeader> {
    // Most headers fit the first 4 KiB; a record near the end of the log may be
    // shorter than that (records are packed to 512 bytes).
    let probe = LOG_ALIGN_BYTES.min(sb.log_end.saturating_sub(offset));
    if probe < RECORD_ALIGN_BYTES {
        return None;
    }
    let mut first = vec![0u8; probe as usize];
    cache.read_at(&mut first, offset).ok()?;
    if let Ok(h) = decode_record_header(&first) {
        return Some(h);
    }
    // At most this, in any version.
    let need = (64 + 16 * lsvd_core::format::record::MAX_RECORD_EXTENTS as u64)
        .div_ceil(LOG_ALIGN_BYTES)
        * LOG_ALIGN_BYTES;
    let n = u32::from_le_bytes([first[12], first[13], first[14], first[15]]) as u64;
    if &first[..8] != lsvd_core::format::record::RECORD_MAGIC || n > need || offset + n > sb.log_end
    {
        return None;
    }
    let mut more = vec![0u8; n as usize];
    cache.read_at(&mut more, offset).ok()?;
    decode_record_header(&more).ok()
}

/// The header at `offset` if it is the chain's next record: sequence number
/// `expect`, this volume, inside the log, chained to `prev_crc`. Not verified.
fn next_header_at(
    cache: &dyn CacheDevice,
    sb: &CacheSuper,
    offset: u64,
    expect: u64,
    prev_crc: Option<u32>,
) -> Option<RecordHeader> {
    header_at(cache, sb, offset).filter(|h| {
        h.seq == expect
            && h.volume == sb.volume
            && offset + h.total_bytes() <= sb.log_end
            && prev_crc.is_none_or(|c| c == h.prev_crc)
    })
}

/// The chain's next record at `offset`, verified.
fn try_at(
    cache: &dyn CacheDevice,
    sb: &CacheSuper,
    offset: u64,
    expect: u64,
    prev_crc: Option<u32>,
) -> Option<FoundRecord> {
    let header = next_header_at(cache, sb, offset, expect, prev_crc)?;
    let mut whole = vec![0u8; (header.header_bytes as u64 + header.data_bytes()) as usize];
    cache.read_at(&mut whole, offset).ok()?;
    verify_record(&header, &whole).ok()?;
    Some(FoundRecord { offset, header })
}

/// Where the chain ended: the record that should have come next, if its header is
/// there and names the right place in the chain but the record fails verification.
/// After a crash that is a torn write (the last record, never acknowledged as
/// durable); if a valid record chained to it follows, it is not: the record was
/// whole once and the cache device changed it afterwards (`followed` is then true).
pub struct ChainBreak {
    pub record: CorruptRecord,
    pub followed: bool,
}

/// What ended `chain` (as [`scan_log`] found it), if it is a record that fails
/// verification (see [`ChainBreak`]).
pub fn chain_break(
    cache: &dyn CacheDevice,
    sb: &CacheSuper,
    chain: &[FoundRecord],
) -> Option<ChainBreak> {
    let (offset, expect, prev_crc) = match chain.last() {
        Some(r) => {
            let mut next = r.offset + r.header.total_bytes();
            if next >= sb.log_end {
                next = sb.log_start;
            }
            (next, r.header.seq + 1, Some(r.header.crc))
        }
        None => (sb.tail_offset, sb.tail_seq, None),
    };
    let mut candidates = vec![offset];
    if offset != sb.log_start {
        candidates.push(sb.log_start);
    }
    for pos in candidates {
        let Some(header) = next_header_at(cache, sb, pos, expect, prev_crc) else {
            continue;
        };
        let found = FoundRecord {
            offset: pos,
            header,
        };
        let Some(record) = verify_found(cache, &found) else {
            continue;
        };
        let mut next = pos + found.header.total_bytes();
        if next >= sb.log_end {
            next = sb.log_start;
        }
        let successor = |at: u64| try_at(cache, sb, at, expect + 1, Some(found.header.crc));
        let followed = successor(next).is_some()
            || (next != sb.log_start && successor(sb.log_start).is_some());
        return Some(ChainBreak { record, followed });
    }
    None
}

/// The newest valid cache superblock of this volume's write log; None for a new
/// (all-zero) file. A superblock of another volume (`Conflict`), or an unreadable one
/// (`Corrupt`), is an error telling the operator to move the file away (the store
/// alone can rebuild the volume).
pub fn read_cache_super(
    cache: &dyn CacheDevice,
    meta: &lsvd_core::format::volume_meta::VolumeMeta,
    cache_name: &str,
) -> Result<Option<CacheSuper>> {
    use lsvd_core::format::cache_super::{CACHE_SUPER_BYTES, newest_cache_super};
    let mut a = vec![0u8; CACHE_SUPER_BYTES];
    let mut b = vec![0u8; CACHE_SUPER_BYTES];
    let read_failed = |e| Error::local_io(format!("cannot read write log {cache_name}"), e);
    cache.read_at(&mut a, 0).map_err(read_failed)?;
    cache
        .read_at(&mut b, CACHE_SUPER_BYTES as u64)
        .map_err(read_failed)?;
    match newest_cache_super(&a, &b) {
        Ok(sb) if sb.volume != meta.volume => Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "write log {cache_name} belongs to another volume (id {}, expected {}); move it away to start from the store",
                sb.volume, meta.volume
            ),
        )),
        Ok(sb) => Ok(Some(sb)),
        Err(_) if a.iter().chain(b.iter()).all(|&x| x == 0) => Ok(None),
        Err(e) => Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "write log {cache_name} is not readable ({e}); move it away to start from the store"
            ),
        )),
    }
}

/// A write-log record whose bytes no longer match the checksums it was written with:
/// the cache device changed them after the write was acknowledged (or, at the end of
/// the log after a crash, the record was torn).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptRecord {
    pub seq: u64,
    pub offset: u64,
    /// The record's data extents, `(first sector, sectors)`.
    pub data_extents: Vec<(u64, u64)>,
    pub why: String,
}

impl CorruptRecord {
    fn new(header: &RecordHeader, offset: u64, why: String) -> CorruptRecord {
        CorruptRecord {
            seq: header.seq,
            offset,
            data_extents: header
                .extents
                .iter()
                .filter(|e| e.kind == ExtentKind::Data)
                .map(|e| (e.lba, e.sectors as u64))
                .collect(),
            why,
        }
    }

    /// A batch piece that lies outside its record's data: the in-memory map and the
    /// log disagree (a bug, reported as corruption so nothing is uploaded).
    pub fn outside(header: &RecordHeader, offset: u64, from: u64, len: usize) -> CorruptRecord {
        CorruptRecord::new(
            header,
            offset,
            format!("a batch piece of {len} bytes at offset {from} lies outside its data"),
        )
    }

    /// The data extents as `LBA first..end` ranges (512-byte sectors, end exclusive),
    /// at most 8 of them and a count of the rest.
    pub fn lba_ranges(&self) -> String {
        const SHOWN: usize = 8;
        let mut s = self
            .data_extents
            .iter()
            .take(SHOWN)
            .map(|(lba, n)| format!("{lba}..{}", lba + n))
            .collect::<Vec<_>>()
            .join(", ");
        if self.data_extents.len() > SHOWN {
            s.push_str(&format!(" and {} more", self.data_extents.len() - SHOWN));
        }
        if s.is_empty() {
            s.push_str("none (trims only)");
        }
        s
    }
}

impl std::fmt::Display for CorruptRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "write-log record {} at offset {} fails verification ({}); its data for LBAs {} (512-byte sectors) is corrupt on the cache device",
            self.seq,
            self.offset,
            self.why,
            self.lba_ranges()
        )
    }
}

/// Why [`read_verified`] refused a record.
#[derive(Debug)]
pub enum VerifyError {
    /// The cache device could not be read.
    Io(std::io::Error),
    /// The record's bytes do not match its checksums (or its header changed).
    Corrupt(CorruptRecord),
}

/// Read the record `expected` (the header it was written with) at `offset` into the
/// start of `buf` (header then data, `header_bytes + data_bytes`; `buf` may be left
/// longer) and check it against the checksums it was written with: the header on
/// disk must be the one written, and its CRC32C and data hash must match header and
/// data. On success the record's data starts at `buf[expected.header_bytes]`.
pub fn read_verified(
    cache: &dyn CacheDevice,
    offset: u64,
    expected: &RecordHeader,
    buf: &mut Vec<u8>,
) -> std::result::Result<(), VerifyError> {
    let len = (expected.header_bytes as u64 + expected.data_bytes()) as usize;
    // The read fills the first `len` bytes: only grow `buf` (zeroing the new tail),
    // never shrink it, so a record after a smaller one re-zeroes nothing. Zeroing on
    // every read was 9%, then (shrinking and growing again) 5% of the instructions of
    // a 4 KiB write at QD32: the uploader reads each record back.
    if buf.len() < len {
        buf.resize(len, 0);
    }
    let record = &mut buf[..len];
    cache.read_at(record, offset).map_err(VerifyError::Io)?;
    let corrupt = |why: String| VerifyError::Corrupt(CorruptRecord::new(expected, offset, why));
    match decode_record_header(record) {
        Ok(h) if h == *expected => {}
        Ok(_) => return Err(corrupt("its header is not the one written".into())),
        Err(e) => return Err(corrupt(format!("its header does not decode: {e}"))),
    }
    verify_record(expected, record).map_err(|e| corrupt(e.to_string()))
}

/// [`read_verified`] for records read from the index or the chain, in the form
/// `lsvd check` reports: `None` if the record verifies (or cannot be read: that is
/// reported elsewhere).
pub fn verify_found(cache: &dyn CacheDevice, r: &FoundRecord) -> Option<CorruptRecord> {
    let mut buf = Vec::new();
    match read_verified(cache, r.offset, &r.header, &mut buf) {
        Err(VerifyError::Corrupt(c)) => Some(c),
        _ => None,
    }
}
