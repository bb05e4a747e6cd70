//! The write-log overlay: LBAs whose newest version is still only in the write log.
//!
//! Reads consult this overlay first and fall back to the store map. An entry is
//! dropped once an object containing its record (or a newer one) has been applied to
//! the store state; zeroed ranges are entries too, so a TRIM hides older store data
//! until the object carrying it is applied.

use crate::extent_map::{ExtentMap, Location, LookupPiece};
use crate::format::SECTOR_BYTES;
use crate::format::record::{ExtentKind, RecordExtent};
use crate::store_state::ObjLoc;

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

    /// Take back a record the store already holds (at open, so reads of what the
    /// write log keeps stay local), its data at log offset `data_offset` on: zero
    /// extents as they are, data extents only where `store` maps something. Where the
    /// store maps nothing, an object after the record (a shrink) dropped that data,
    /// and the log must not bring it back; anywhere else the store holds this
    /// record's version or one a later record (also taken back, in order) overrides.
    pub fn keep_applied(
        &mut self,
        store: &ExtentMap<ObjLoc>,
        record_seq: u64,
        data_offset: u64,
        extents: &[RecordExtent],
    ) {
        let mut data_at = data_offset;
        for e in extents {
            let sectors = u64::from(e.sectors);
            match e.kind {
                ExtentKind::Zero => self.zero(e.lba, sectors, record_seq),
                ExtentKind::Data => {
                    store.for_each_in(e.lba, sectors, |p| {
                        if p.location.is_some() {
                            let at = data_at + (p.lba - e.lba) * SECTOR_BYTES;
                            self.write(p.lba, p.sectors, record_seq, at);
                        }
                    });
                    data_at += sectors * SECTOR_BYTES;
                }
            }
        }
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

    #[test]
    fn kept_records_come_back_only_where_the_store_maps_data() {
        // The store maps sectors [0, 4) and [6, 16); [4, 6) was dropped after the
        // record (a shrink, say).
        let mut store = ExtentMap::new();
        let loc = |offset| ObjLoc {
            object_seq: 9,
            offset,
        };
        store.insert(0, 4, loc(0), |_| {});
        store.insert(6, 10, loc(4096), |_| {});
        let extents = [
            RecordExtent {
                lba: 2,
                sectors: 6,
                kind: ExtentKind::Data,
            },
            RecordExtent {
                lba: 20,
                sectors: 4,
                kind: ExtentKind::Zero,
            },
            RecordExtent {
                lba: 10,
                sectors: 2,
                kind: ExtentKind::Data,
            },
        ];
        let mut m = LogMap::new();
        m.keep_applied(&store, 7, 1000, &extents);
        let kept: Vec<_> = m.iter().map(|p| (p.lba, p.sectors, p.location)).collect();
        let data = |offset| LogLoc::Data {
            record_seq: 7,
            offset,
        };
        assert_eq!(
            kept,
            vec![
                (2, 2, data(1000)),
                // Sectors 4 and 5 of the record's first extent are left out; its
                // data for sectors 6 and 7 starts 4 sectors in.
                (6, 2, data(1000 + 4 * 512)),
                // The second data extent's data follows the first's 6 sectors.
                (10, 2, data(1000 + 6 * 512)),
                (20, 4, LogLoc::Zero { record_seq: 7 }),
            ]
        );
    }
}
