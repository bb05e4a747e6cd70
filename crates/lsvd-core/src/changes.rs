//! What changed in a volume since one of its snapshots: the classification behind
//! `lsvd export-diff` and the `qemu:dirty-bitmap:SNAP` NBD meta context.
//!
//! Why a map comparison and no bitmap: objects are numbered in the order they were
//! written and a snapshot records the number it stopped at (and the last write-log
//! record it holds), so where each block's data now lives already says when it was
//! written. A block whose data is in an object numbered below the snapshot's end (or
//! in a write-log record the snapshot holds) has been there since before the snapshot:
//! nothing overwrote it since, so the snapshot reads the same bytes. Any other written
//! block is new. Data the garbage collector moved lives in a newer (gc) object, but
//! the gc object's header names where each extent came from; the engine looks that up
//! and reports the block by its source (see [`Written`]). A block that reads as zeros
//! now changed only if the snapshot had data there: that needs the snapshot's map,
//! which is the [`Baseline`].
//!
//! Nothing here does I/O: the engine walks its maps and gc headers and hands the
//! pieces in; the answer costs time in proportion to the map extents in the range,
//! never to bytes.

use crate::extent_map::ExtentMap;

/// How a range compares with the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Reads the same bytes as at the baseline.
    Same,
    /// Written since the baseline.
    Data,
    /// Reads as zeros now, and held data at the baseline (a trim or write-zeroes).
    Zero,
}

/// The snapshot a volume is compared against: which writes it holds and which blocks
/// it had data in. The empty volume (a diff from nothing) holds no writes.
#[derive(Debug, Clone, Default)]
pub struct Baseline {
    /// Objects numbered below this are in the snapshot.
    pub through_seq: u64,
    /// Write-log records up to this one are in the snapshot (0: none).
    pub last_record_seq: u64,
    /// The blocks that held data at the snapshot (in 512-byte sectors).
    pub mapped: ExtentMap<()>,
}

/// What a piece of the volume holds now, as its maps say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Now {
    /// Data, and whether it predates the baseline.
    Written(Written),
    /// Reads as zeros (never written, trimmed, or written as zeros).
    Zeros,
}

/// When data now in the map was written, relative to the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Before it: the baseline reads these bytes too.
    Before,
    /// After it (or not known to be before: always safe to report as changed).
    After,
}

impl Baseline {
    /// The empty volume: everything written is new.
    pub fn empty() -> Self {
        Baseline::default()
    }

    /// Whether it holds nothing (a diff from the empty volume).
    pub fn is_empty(&self) -> bool {
        self.through_seq == 0 && self.last_record_seq == 0 && self.mapped.is_empty()
    }

    /// When data in object `object_seq` was written: before the baseline if the
    /// object is in it.
    pub fn object(&self, object_seq: u64) -> Written {
        if object_seq < self.through_seq {
            Written::Before
        } else {
            Written::After
        }
    }

    /// When a write-log record was written, relative to the baseline.
    pub fn record(&self, record_seq: u64) -> Written {
        if record_seq <= self.last_record_seq && self.last_record_seq > 0 {
            Written::Before
        } else {
            Written::After
        }
    }

    /// Classify consecutive pieces `(lba, sectors, now)` (in ascending order, without
    /// gaps) as runs of `(sectors, change)`, neighbours with the same change merged.
    pub fn classify(
        &self,
        pieces: impl IntoIterator<Item = (u64, u64, Now)>,
    ) -> Vec<(u64, Change)> {
        let mut runs: Vec<(u64, Change)> = Vec::new();
        let mut push = |sectors: u64, change: Change| {
            if sectors == 0 {
                return;
            }
            match runs.last_mut() {
                Some(last) if last.1 == change => last.0 += sectors,
                _ => runs.push((sectors, change)),
            }
        };
        for (lba, sectors, now) in pieces {
            match now {
                Now::Written(Written::Before) => push(sectors, Change::Same),
                Now::Written(Written::After) => push(sectors, Change::Data),
                Now::Zeros => self.mapped.for_each_in(lba, sectors, |p| {
                    let change = if p.location.is_some() {
                        Change::Zero
                    } else {
                        Change::Same
                    };
                    push(p.sectors, change);
                }),
            }
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn baseline(mapped: &[(u64, u64)]) -> Baseline {
        let mut map = ExtentMap::new();
        for &(lba, sectors) in mapped {
            map.insert(lba, sectors, (), |_| {});
        }
        Baseline {
            through_seq: 10,
            last_record_seq: 100,
            mapped: map,
        }
    }

    #[test]
    fn objects_and_records_are_placed_against_the_snapshot_end() {
        let b = baseline(&[]);
        assert_eq!(b.object(9), Written::Before);
        assert_eq!(b.object(10), Written::After);
        assert_eq!(b.record(100), Written::Before);
        assert_eq!(b.record(101), Written::After);
        let empty = Baseline::empty();
        assert!(empty.is_empty());
        assert_eq!(empty.object(0), Written::After);
        // Record 0 does not exist; even so the empty volume holds no record.
        assert_eq!(empty.record(0), Written::After);
        assert!(!b.is_empty());
    }

    #[test]
    fn zeros_changed_only_where_the_snapshot_had_data() {
        // The snapshot had data in sectors 8..24.
        let b = baseline(&[(8, 16)]);
        let runs = b.classify([
            (0, 4, Now::Written(Written::Before)),
            (4, 4, Now::Written(Written::After)),
            // Zeros over 8..32: 8..24 was data at the snapshot, 24..32 was not.
            (8, 24, Now::Zeros),
            (32, 8, Now::Written(Written::After)),
        ]);
        assert_eq!(
            runs,
            vec![
                (4, Change::Same),
                (4, Change::Data),
                (16, Change::Zero),
                (8, Change::Same),
                (8, Change::Data),
            ]
        );
    }

    #[test]
    fn neighbours_with_the_same_answer_merge() {
        let b = baseline(&[]);
        let runs = b.classify([
            (0, 4, Now::Written(Written::After)),
            (4, 4, Now::Written(Written::After)),
            (8, 4, Now::Zeros),
            (12, 4, Now::Written(Written::Before)),
            (16, 0, Now::Written(Written::After)),
        ]);
        assert_eq!(runs, vec![(8, Change::Data), (8, Change::Same)]);
    }
}
