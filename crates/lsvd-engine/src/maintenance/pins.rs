//! What a volume's snapshots keep in the store: every delete (objects GC emptied, old
//! checkpoints, garbage found at open) asks [`Pins`] first.
//!
//! Why a module of its own: the shared engine state holds the pins, and the snapshot
//! operations (`crate::lifecycle::snapshot`) build and change them; keeping the type below both
//! keeps the state from importing the operations.

use std::collections::BTreeSet;

use lsvd_core::format::snapshot::SnapshotRecord;

/// What one snapshot keeps in the store.
pub(crate) struct Pin {
    pub record: SnapshotRecord,
    /// The objects its base checkpoint lists.
    listed: BTreeSet<u64>,
}

impl Pin {
    pub(crate) fn new(record: SnapshotRecord, listed: BTreeSet<u64>) -> Self {
        Pin { record, listed }
    }

    pub(crate) fn holds(&self, seq: u64) -> bool {
        let from = self.record.base_checkpoint.unwrap_or(0);
        (from <= seq && seq < self.record.through_seq) || self.listed.contains(&seq)
    }
}

/// Every snapshot of a volume, as far as deletes are concerned.
#[derive(Default)]
pub(crate) struct Pins(pub(crate) Vec<Pin>);

impl Pins {
    /// Does some snapshot still need object (or checkpoint) `seq`?
    pub(crate) fn holds(&self, seq: u64) -> bool {
        self.0.iter().any(|p| p.holds(seq))
    }
}
