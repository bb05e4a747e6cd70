//! The write-log overlay: LBAs whose newest version is still only in the write log.
//!
//! Reads consult this overlay first and fall back to the store map. An entry is
//! dropped once an object containing its record (or a newer one) has been applied to
//! the store state; zeroed ranges are entries too, so a TRIM hides older store data
//! until the object carrying it is applied.

use crate::extent_map::{ExtentMap, Location, LookupPiece};
use crate::format::SECTOR_BYTES;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLoc {
    /// Data at byte `offset` of the cache device, written by record `record_seq`.
    Data { record_seq: u64, offset: u64 },
    /// Zeros, since record `record_seq`.
    Zero { record_seq: u64 },
}

impl LogLoc {
    pub fn record_seq(&self) -> u64 {
        match *self {
            LogLoc::Data { record_seq, .. } | LogLoc::Zero { record_seq } => record_seq,
        }
    }
}

impl Location for LogLoc {
    fn advance(&self, sectors: u64) -> Self {
        match *self {
            LogLoc::Data { record_seq, offset } => LogLoc::Data {
                record_seq,
                offset: offset + sectors * SECTOR_BYTES,
            },
            z @ LogLoc::Zero { .. } => z,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct LogMap {
    map: ExtentMap<LogLoc>,
}

impl LogMap {
    pub fn new() -> Self {
        LogMap {
            map: ExtentMap::new(),
        }
    }

    pub fn write(&mut self, lba: u64, sectors: u64, record_seq: u64, offset: u64) {
        self.map
            .insert(lba, sectors, LogLoc::Data { record_seq, offset }, |_| {});
    }

    pub fn zero(&mut self, lba: u64, sectors: u64, record_seq: u64) {
        self.map
            .insert(lba, sectors, LogLoc::Zero { record_seq }, |_| {});
    }

    /// Drop entries in `[lba, lba+sectors)` written by records up to `last_record_seq`:
    /// the store now holds that version or a newer one.
    pub fn release(&mut self, lba: u64, sectors: u64, last_record_seq: u64) {
        self.map
            .remove_where(lba, sectors, |l| l.record_seq() <= last_record_seq, |_| {});
    }

    pub fn lookup(&self, lba: u64, sectors: u64) -> Vec<LookupPiece<LogLoc>> {
        self.map.lookup(lba, sectors)
    }

    pub fn for_each_in(&self, lba: u64, sectors: u64, f: impl FnMut(LookupPiece<LogLoc>)) {
        self.map.for_each_in(lba, sectors, f)
    }

    pub fn extent_count(&self) -> usize {
        self.map.extent_count()
    }

    pub fn iter(&self) -> impl Iterator<Item = crate::extent_map::Piece<LogLoc>> + '_ {
        self.map.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_keeps_newer_records() {
        let mut m = LogMap::new();
        m.write(0, 8, 1, 4096);
        m.write(8, 8, 2, 8192);
        m.zero(4, 2, 3);
        m.release(0, 16, 2);
        let left: Vec<_> = m.iter().map(|p| (p.lba, p.sectors, p.location)).collect();
        assert_eq!(left, vec![(4, 2, LogLoc::Zero { record_seq: 3 })]);
    }
}
