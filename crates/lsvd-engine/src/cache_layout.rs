//! Where things are in the cache file: two superblocks, the circular log region, and
//! two write-log index slots after it.
//!
//! ```text
//! [superblock A 4 KiB][superblock B 4 KiB][log region ...][index slot 0][index slot 1]
//! ```
//!
//! The superblock records `log_start` and `log_end`; the two slots share what follows
//! `log_end`. Files made before the index existed have `log_end` at the end of the
//! file: no slots, and recovery scans the log as before.

use lsvd_core::format::cache_super::CACHE_SUPER_BYTES;
use lsvd_core::format::record::LOG_ALIGN_BYTES;

/// Smallest index slot.
const MIN_SLOT_BYTES: u64 = 64 << 10;

/// Regions of the cache file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLayout {
    pub log_start: u64,
    pub log_end: u64,
    /// Bytes per index slot (0: this file has no index slots).
    pub slot_bytes: u64,
}

impl CacheLayout {
    /// Layout for a new cache file of `file_bytes`: 1/64 of the log for each slot
    /// (enough for the headers of a log full of small records), at least 64 KiB.
    pub fn for_new_file(file_bytes: u64) -> CacheLayout {
        let log_start = 2 * CACHE_SUPER_BYTES as u64;
        let end = file_bytes / LOG_ALIGN_BYTES * LOG_ALIGN_BYTES;
        let region = end.saturating_sub(log_start);
        let slot_bytes = (region / 64 / LOG_ALIGN_BYTES * LOG_ALIGN_BYTES).max(MIN_SLOT_BYTES);
        CacheLayout {
            log_start,
            log_end: end.saturating_sub(2 * slot_bytes),
            slot_bytes,
        }
    }

    /// Layout of an existing file from its superblock's fields, if they make sense.
    pub fn from_super(file_bytes: u64, log_start: u64, log_end: u64) -> Option<CacheLayout> {
        let aligned = |x: u64| x.is_multiple_of(LOG_ALIGN_BYTES);
        if log_start < 2 * CACHE_SUPER_BYTES as u64
            || log_start >= log_end
            || log_end > file_bytes
            || !aligned(log_start)
            || !aligned(log_end)
        {
            return None;
        }
        let slot_bytes = (file_bytes - log_end) / 2 / LOG_ALIGN_BYTES * LOG_ALIGN_BYTES;
        Some(CacheLayout {
            log_start,
            log_end,
            slot_bytes: if slot_bytes >= MIN_SLOT_BYTES {
                slot_bytes
            } else {
                0
            },
        })
    }

    pub(crate) fn slot_offset(&self, generation: u64) -> u64 {
        self.log_end + (generation % 2) * self.slot_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        let l = CacheLayout::for_new_file(1 << 30);
        assert_eq!(l.log_start, 8192);
        assert_eq!(l.slot_bytes, ((1u64 << 30) - 8192) / 64 / 4096 * 4096);
        assert_eq!(l.log_end + 2 * l.slot_bytes, 1 << 30);
        let small = CacheLayout::for_new_file(16 << 20);
        assert_eq!(small.slot_bytes, 258_048); // (16 MiB - 8 KiB) / 64, 4 KiB aligned
        assert_eq!(CacheLayout::for_new_file(2 << 20).slot_bytes, 64 << 10);
        // A file from before the index: the log runs to the end, no slots.
        let old = CacheLayout::from_super(16 << 20, 8192, 16 << 20).expect("valid");
        assert_eq!(old.slot_bytes, 0);
        assert_eq!(
            CacheLayout::from_super(l.log_end + 2 * l.slot_bytes, l.log_start, l.log_end),
            Some(l)
        );
        assert_eq!(CacheLayout::from_super(1 << 20, 8192, 2 << 20), None);
        assert_eq!(CacheLayout::from_super(1 << 20, 0, 1 << 19), None);
    }
}
