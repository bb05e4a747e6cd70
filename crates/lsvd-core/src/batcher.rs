//! Batching of writes into objects, with coalescing inside a batch.
//!
//! Writes arrive in log order. A batch collects them until its client bytes reach the
//! batch size, keeping only the newest data for each LBA: overwrites inside a batch are
//! coalesced (and never across batches, so each object is a whole prefix step). A
//! batch's extents come out in LBA order; its zeroed ranges come out separately and
//! apply before the extents on replay. The same code runs in the live engine (where
//! `S` is a location in the write log) and in the simulator.

use crate::extent_map::{ExtentMap, Location, Piece};
use crate::format::SECTOR_BYTES;
use crate::format::object::ObjectExtent;

/// A closed batch, ready to become an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch<S> {
    /// Newest data per LBA, in LBA order.
    pub extents: Vec<Piece<S>>,
    /// Ranges zeroed by TRIM or WRITE_ZEROES, merged, in LBA order.
    pub trims: Vec<(u64, u64)>,
    pub first_record_seq: u64,
    pub last_record_seq: u64,
    /// Client bytes written into the batch (before coalescing).
    pub client_bytes: u64,
    /// Bytes of data the object will hold (after coalescing).
    pub data_bytes: u64,
    /// The volume's size from this batch's object on, when it resizes the volume
    /// ([`crate::pipeline::Pipeline::resize`]); client batches never do.
    pub volume_size_bytes: Option<u64>,
    /// How many objects after this one hold the rest of the same batch, when it was
    /// split by heat ([`Batch::split_by_class`]); 0 for the last part and for a
    /// batch that was not split.
    pub parts_after: u32,
}

impl<S> Batch<S> {
    /// Split the batch by the class `class_of` gives each extent's first sector
    /// (hylog: the heat class of its region), so that fresh client writes of
    /// different heat go to different objects. The parts come out coldest class
    /// first, each counting the parts after it; the zeroed ranges go with the first
    /// part, less what an extent of the batch covers (see below). A batch whose
    /// extents are all of one class, or that resizes the volume, stays whole.
    pub fn split_by_class(self, class_of: impl Fn(u64) -> u8) -> Vec<Batch<S>> {
        if self.volume_size_bytes.is_some() || self.extents.is_empty() {
            return vec![self];
        }
        // A zeroed range that a later write of the batch covers is redundant (the
        // write is the batch's last word there), and in a part of its own it would
        // be harmful: applied before the part holding the write, it would make the
        // range read as zeros in between (the write log's copy is released as the
        // trim applies). So the parts carry only the zeroed ranges no extent covers.
        let trims = uncovered(&self.trims, &self.extents);
        let mut by_class: std::collections::BTreeMap<u8, Vec<Piece<S>>> = Default::default();
        for p in self.extents {
            by_class.entry(class_of(p.lba)).or_default().push(p);
        }
        let count = by_class.len();
        let mut trims = Some(trims);
        let mut client_left = self.client_bytes;
        let mut parts = Vec::with_capacity(count);
        for (i, extents) in by_class.into_values().enumerate() {
            let data_bytes = extents.iter().map(|p| p.sectors).sum::<u64>() * SECTOR_BYTES;
            // Client bytes (before coalescing) are not known per class: each part
            // takes its data, the last one the rest, so the parts add up.
            let client_bytes = if i + 1 == count {
                client_left
            } else {
                data_bytes.min(client_left)
            };
            client_left -= client_bytes;
            parts.push(Batch {
                extents,
                trims: trims.take().unwrap_or_default(),
                first_record_seq: self.first_record_seq,
                last_record_seq: self.last_record_seq,
                client_bytes,
                data_bytes,
                volume_size_bytes: None,
                parts_after: (count - 1 - i) as u32,
            });
        }
        parts
    }

    /// The extents of the data object made from this batch, in LBA order, with the
    /// data in the same order. Object extents have 32-bit lengths: longer runs are
    /// split at 2^30 sectors.
    pub fn object_extents(&self) -> Vec<ObjectExtent> {
        let mut out = Vec::with_capacity(self.extents.len());
        for p in &self.extents {
            let (mut lba, mut left) = (p.lba, p.sectors);
            while left > 0 {
                let n = left.min(1 << 30);
                out.push(ObjectExtent {
                    lba,
                    sectors: n as u32,
                    source: None,
                });
                lba += n;
                left -= n;
            }
        }
        out
    }
}

/// The parts of the ranges `trims` (sorted, disjoint) that no piece of `extents`
/// (sorted by LBA, disjoint) covers.
fn uncovered<S>(trims: &[(u64, u64)], extents: &[Piece<S>]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut i = 0;
    for &(lba, sectors) in trims {
        let end = lba + sectors;
        let mut at = lba;
        while i < extents.len() && extents[i].lba + extents[i].sectors <= at {
            i += 1;
        }
        let mut j = i;
        while at < end {
            match extents.get(j) {
                Some(e) if e.lba < end => {
                    if e.lba > at {
                        out.push((at, e.lba - at));
                    }
                    at = at.max(e.lba + e.sectors);
                    j += 1;
                }
                _ => {
                    out.push((at, end - at));
                    at = end;
                }
            }
        }
    }
    out
}

#[derive(Debug)]
pub struct Batcher<S: Location> {
    extents: ExtentMap<S>,
    trims: ExtentMap<()>,
    client_bytes: u64,
    first_record_seq: Option<u64>,
    last_record_seq: u64,
    batch_size_bytes: u64,
}

impl<S: Location> Batcher<S> {
    pub fn new(batch_size_bytes: u64) -> Self {
        Batcher {
            extents: ExtentMap::new(),
            trims: ExtentMap::new(),
            client_bytes: 0,
            first_record_seq: None,
            last_record_seq: 0,
            batch_size_bytes: batch_size_bytes.max(SECTOR_BYTES),
        }
    }

    fn note_record(&mut self, record_seq: u64) {
        debug_assert!(
            record_seq >= self.last_record_seq,
            "records arrive in order"
        );
        self.first_record_seq.get_or_insert(record_seq);
        self.last_record_seq = record_seq;
    }

    /// Add data for `[lba, lba+sectors)` from record `record_seq`, found at `source`.
    pub fn add_write(&mut self, record_seq: u64, lba: u64, sectors: u64, source: S) {
        self.note_record(record_seq);
        self.client_bytes += sectors * SECTOR_BYTES;
        self.extents.insert(lba, sectors, source, |_| {});
    }

    /// Record that `[lba, lba+sectors)` reads as zeros from record `record_seq` on.
    pub fn add_zero(&mut self, record_seq: u64, lba: u64, sectors: u64) {
        self.note_record(record_seq);
        self.extents.remove(lba, sectors, |_| {});
        self.trims.insert(lba, sectors, (), |_| {});
    }

    /// Note a record with nothing to batch (keeps the record range contiguous).
    pub fn add_empty_record(&mut self, record_seq: u64) {
        self.note_record(record_seq);
    }

    pub fn is_empty(&self) -> bool {
        self.first_record_seq.is_none()
    }

    /// True once the batch holds at least the batch size of client bytes.
    pub fn is_full(&self) -> bool {
        self.client_bytes >= self.batch_size_bytes
    }

    /// True if adding a record of `record_bytes` client bytes would take a batch that
    /// already holds data past the batch size: close it first. A batch then exceeds
    /// the batch size only when a single record does, which keeps objects (and the
    /// store bound GC keeps, `gc::client_object_fits`) at one batch even when the log
    /// writer groups several client writes into one record.
    pub fn would_overflow(&self, record_bytes: u64) -> bool {
        self.client_bytes > 0 && self.client_bytes + record_bytes > self.batch_size_bytes
    }

    pub fn client_bytes(&self) -> u64 {
        self.client_bytes
    }

    /// The newest record noted so far (0: none since this batcher was made).
    pub fn last_record_seq(&self) -> u64 {
        self.last_record_seq
    }

    /// Close the batch and start a new one. `None` if nothing was added.
    pub fn take(&mut self) -> Option<Batch<S>> {
        let first_record_seq = self.first_record_seq.take()?;
        let extents: Vec<Piece<S>> = self.extents.iter().collect();
        let trims = self.trims.iter().map(|p| (p.lba, p.sectors)).collect();
        let data_bytes = self.extents.mapped_sectors() * SECTOR_BYTES;
        let batch = Batch {
            extents,
            trims,
            first_record_seq,
            last_record_seq: self.last_record_seq,
            client_bytes: self.client_bytes,
            data_bytes,
            volume_size_bytes: None,
            parts_after: 0,
        };
        self.extents = ExtentMap::new();
        self.trims = ExtentMap::new();
        self.client_bytes = 0;
        Some(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct At(u64);
    impl Location for At {
        fn advance(&self, s: u64) -> Self {
            At(self.0 + s * 512)
        }
    }

    #[test]
    fn coalesces_overwrites_and_orders_by_lba() {
        let mut b = Batcher::new(64 * 1024);
        b.add_write(1, 100, 8, At(0));
        b.add_write(2, 0, 8, At(4096));
        b.add_write(3, 100, 8, At(8192));
        assert!(!b.is_full());
        let batch = b.take().expect("non-empty");
        assert_eq!(
            batch
                .extents
                .iter()
                .map(|p| (p.lba, p.location.0))
                .collect::<Vec<_>>(),
            vec![(0, 4096), (100, 8192)]
        );
        assert_eq!(batch.client_bytes, 3 * 4096);
        assert_eq!(batch.data_bytes, 2 * 4096);
        assert_eq!((batch.first_record_seq, batch.last_record_seq), (1, 3));
        assert!(b.take().is_none());
    }

    /// Split by class: one part per class, coldest first, counting down the parts
    /// after each; the trims go with the first part; the client bytes add up; the
    /// record range is the batch's. One class, or a resize, stays whole.
    #[test]
    fn split_by_class_gives_one_part_per_class_with_the_trims_first() {
        let mut b = Batcher::new(1 << 20);
        b.add_write(1, 0, 8, At(0));
        b.add_write(2, 800, 8, At(4096));
        b.add_write(3, 0, 8, At(8192));
        b.add_zero(4, 400, 8);
        b.add_write(5, 1600, 8, At(12288));
        let batch = b.take().expect("non-empty");
        let class = |lba: u64| [2u8, 0, 1][(lba / 800) as usize % 3];
        let parts = batch.clone().split_by_class(class);
        let got: Vec<_> = parts
            .iter()
            .map(|p| {
                let lbas: Vec<u64> = p.extents.iter().map(|e| e.lba).collect();
                (lbas, p.trims.clone(), p.parts_after, p.data_bytes)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (vec![800], vec![(400, 8)], 2, 4096),
                (vec![1600], vec![], 1, 4096),
                (vec![0], vec![], 0, 4096),
            ]
        );
        assert_eq!(parts.iter().map(|p| p.client_bytes).sum::<u64>(), 4 * 4096);
        assert!(
            parts
                .iter()
                .all(|p| (p.first_record_seq, p.last_record_seq) == (1, 5))
        );
        assert_eq!(batch.clone().split_by_class(|_| 3), vec![batch.clone()]);
        // A range zeroed and then written again in the batch keeps only the write:
        // the first part's trim must not cover data a later part maps (it would read
        // as zeros between the two parts' applies).
        let mut b = Batcher::new(1 << 20);
        b.add_write(1, 800, 8, At(0));
        b.add_zero(2, 0, 32);
        b.add_write(3, 8, 8, At(4096));
        b.add_write(4, 24, 16, At(8192));
        let rewritten = b.take().expect("non-empty");
        assert_eq!(rewritten.trims, vec![(0, 32)]);
        let parts = rewritten.split_by_class(|lba| u8::from(lba < 800));
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].trims, vec![(0, 8), (16, 8)]);
        assert!(parts[1].trims.is_empty());
        let mut resize = batch.clone();
        resize.volume_size_bytes = Some(1 << 30);
        assert_eq!(resize.clone().split_by_class(class), vec![resize]);
    }

    #[test]
    fn trims_remove_earlier_data_but_not_later() {
        let mut b = Batcher::new(1 << 20);
        b.add_write(1, 0, 16, At(0));
        b.add_zero(2, 4, 4);
        b.add_write(3, 6, 1, At(100_000));
        let batch = b.take().expect("non-empty");
        assert_eq!(batch.trims, vec![(4, 4)]);
        let got: Vec<_> = batch.extents.iter().map(|p| (p.lba, p.sectors)).collect();
        assert_eq!(got, vec![(0, 4), (6, 1), (8, 8)]);
    }

    #[test]
    fn a_record_that_would_overflow_a_batch_goes_to_the_next_one() {
        let mut b = Batcher::new(16 * 4096);
        assert!(
            !b.would_overflow(64 * 4096),
            "an empty batch takes any record"
        );
        b.add_write(1, 0, 8 * 14, At(0));
        assert!(!b.would_overflow(2 * 4096), "exactly full is fine");
        assert!(b.would_overflow(3 * 4096));
        let mut trims_only = Batcher::<At>::new(4096);
        trims_only.add_zero(1, 0, 8);
        assert!(
            !trims_only.would_overflow(8192),
            "trims carry no client bytes"
        );
    }

    #[test]
    fn object_extents_split_long_runs() {
        let batch = Batch {
            extents: vec![
                Piece {
                    lba: 8,
                    sectors: 8,
                    location: At(0),
                },
                Piece {
                    lba: 100,
                    sectors: (1 << 31) + 5,
                    location: At(4096),
                },
            ],
            trims: Vec::new(),
            first_record_seq: 1,
            last_record_seq: 1,
            client_bytes: 0,
            data_bytes: 0,
            volume_size_bytes: None,
            parts_after: 0,
        };
        let got: Vec<(u64, u32)> = batch
            .object_extents()
            .iter()
            .map(|e| (e.lba, e.sectors))
            .collect();
        assert_eq!(
            got,
            vec![
                (8, 8),
                (100, 1 << 30),
                (100 + (1 << 30), 1 << 30),
                (100 + (2 << 30), 5)
            ]
        );
    }

    #[test]
    fn full_at_batch_size() {
        let mut b = Batcher::new(8192);
        b.add_write(1, 0, 8, At(0));
        assert!(!b.is_full());
        b.add_write(2, 0, 8, At(0));
        assert!(b.is_full());
    }
}
