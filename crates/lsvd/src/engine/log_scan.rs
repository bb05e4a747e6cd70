//! The log side of recovery: follow the write log's record chain from the cache
//! superblock's tail, verifying every record (or taking records from the write-log
//! index, which lists records that were durable when it was written).

use lsvd_core::format::cache_super::CacheSuper;
use lsvd_core::format::log_index::LogIndex;
use lsvd_core::format::record::{
    LOG_ALIGN_BYTES, RECORD_ALIGN_BYTES, RecordHeader, decode_record_header, verify_record,
};

use crate::cache_dev::CacheDevice;
use crate::error::{Error, ErrorKind, Result};

/// A record found in the write log, verified.
pub(crate) struct FoundRecord {
    pub offset: u64,
    pub header: RecordHeader,
}

/// Follow the record chain from `(offset, seq)`: each record must have the next
/// sequence number, this volume's id and a valid checksum. The first failure ends it.
pub(crate) fn scan_log(cache: &dyn CacheDevice, sb: &CacheSuper) -> Vec<FoundRecord> {
    scan_log_with_index(cache, sb, None)
}

/// [`scan_log`], taking the records from `index` (durable when it was written, so
/// their data need not be read) as far as it goes from the superblock's tail, then
/// following the chain on disk from there.
pub(crate) fn scan_log_with_index(
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
    let try_at = |offset: u64, expect: u64, prev_crc: Option<u32>| -> Option<FoundRecord> {
        // Most headers fit the first 4 KiB; a record near the end of the log may be
        // shorter than that (records are packed to 512 bytes).
        let probe = LOG_ALIGN_BYTES.min(sb.log_end.saturating_sub(offset));
        if probe < RECORD_ALIGN_BYTES {
            return None;
        }
        let mut first = vec![0u8; probe as usize];
        cache.read_at(&mut first, offset).ok()?;
        let header = decode_record_header(&first).ok();
        let header = match header {
            Some(h) => h,
            None => {
                // Headers with many extents span several blocks (at most this, in
                // any version).
                let need = (64 + 16 * lsvd_core::format::record::MAX_RECORD_EXTENTS as u64)
                    .div_ceil(LOG_ALIGN_BYTES)
                    * LOG_ALIGN_BYTES;
                let n = u32::from_le_bytes([first[12], first[13], first[14], first[15]]) as u64;
                if &first[..8] != lsvd_core::format::record::RECORD_MAGIC
                    || n > need
                    || offset + n > sb.log_end
                {
                    return None;
                }
                let mut more = vec![0u8; n as usize];
                cache.read_at(&mut more, offset).ok()?;
                decode_record_header(&more).ok()?
            }
        };
        if header.seq != expect
            || header.volume != sb.volume
            || offset + header.total_bytes() > sb.log_end
            || prev_crc.is_some_and(|c| c != header.prev_crc)
        {
            return None;
        }
        let mut whole = vec![0u8; (header.header_bytes as u64 + header.data_bytes()) as usize];
        cache.read_at(&mut whole, offset).ok()?;
        verify_record(&header, &whole).ok()?;
        Some(FoundRecord { offset, header })
    };
    loop {
        let found = try_at(offset, expect, prev_crc).or_else(|| {
            if offset != sb.log_start {
                try_at(sb.log_start, expect, prev_crc)
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

/// The newest valid cache superblock of this volume's write log; None for a new
/// (all-zero) file. A superblock of another volume (`Conflict`), or an unreadable one
/// (`Corrupt`), is an error telling the operator to move the file away (the store
/// alone can rebuild the volume).
pub(crate) fn read_cache_super(
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
