//! The newest write-log records, kept in memory for the upload.
//!
//! Why: a client batch is built from the records that hold its data. Reading them
//! back from the write log costs a read of every byte and a CRC32C and a data hash
//! over it (a seventh of the instructions of a 4 KiB write, callgrind), for bytes the
//! process had in memory a moment before. The log writer therefore leaves each record
//! it wrote here, as the very buffer it wrote (shared, never copied), and the uploader
//! takes the records it finds. A record that was dropped to stay within the bound, or
//! that recovery replayed, is read back and verified as before.
//!
//! Bounded by `EngineConfig::upload_memory_bytes`: the oldest records are dropped
//! first (the uploader needs the oldest first, but those are the ones a slow store has
//! kept waiting longest; the newer ones will be needed while the store catches up).
//! A record also leaves once the log frees it (its data is in the store).

use std::collections::VecDeque;

use bytes::Bytes;

/// Records by sequence number, in log order.
#[derive(Default)]
pub(crate) struct RecentRecords {
    records: VecDeque<(u64, Bytes)>,
    bytes: u64,
    max_bytes: u64,
}

impl RecentRecords {
    pub(crate) fn new(max_bytes: u64) -> Self {
        RecentRecords {
            records: VecDeque::new(),
            bytes: 0,
            max_bytes,
        }
    }

    /// Keep record `seq` (newer than every record kept), dropping the oldest while the
    /// total is over the bound. A record larger than the bound is not kept.
    pub(crate) fn push(&mut self, seq: u64, record: Bytes) {
        let n = record.len() as u64;
        if n > self.max_bytes {
            return;
        }
        debug_assert!(self.records.back().is_none_or(|(s, _)| *s < seq));
        self.records.push_back((seq, record));
        self.bytes += n;
        while self.bytes > self.max_bytes {
            let Some((_, old)) = self.records.pop_front() else {
                break;
            };
            self.bytes -= old.len() as u64;
        }
    }

    /// Record `seq`, if it is still kept.
    pub(crate) fn get(&self, seq: u64) -> Option<Bytes> {
        let i = self.records.binary_search_by_key(&seq, |(s, _)| *s).ok()?;
        Some(self.records[i].1.clone())
    }

    /// Drop every record through `seq` (the log freed them).
    pub(crate) fn release_through(&mut self, seq: u64) {
        while let Some((s, r)) = self.records.front()
            && *s <= seq
        {
            self.bytes -= r.len() as u64;
            self.records.pop_front();
        }
    }

    /// Bytes kept now.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(n: usize, fill: u8) -> Bytes {
        Bytes::from(vec![fill; n])
    }

    #[test]
    fn keeps_the_newest_within_the_bound_and_releases_in_order() {
        let mut r = RecentRecords::new(10);
        r.push(1, rec(4, 1));
        r.push(2, rec(4, 2));
        assert_eq!(r.bytes(), 8);
        // Over the bound: the oldest goes.
        r.push(3, rec(4, 3));
        assert_eq!(r.bytes(), 8);
        assert!(r.get(1).is_none());
        assert_eq!(r.get(2).as_deref(), Some(&[2u8; 4][..]));
        assert_eq!(r.get(3).as_deref(), Some(&[3u8; 4][..]));
        // Larger than the whole bound: not kept, nothing else dropped.
        r.push(4, rec(11, 4));
        assert!(r.get(4).is_none());
        assert_eq!(r.bytes(), 8);
        r.release_through(2);
        assert!(r.get(2).is_none());
        assert_eq!(r.bytes(), 4);
        r.release_through(9);
        assert_eq!(r.bytes(), 0);
        assert!(r.get(3).is_none());
    }

    #[test]
    fn a_zero_bound_keeps_nothing() {
        let mut r = RecentRecords::new(0);
        r.push(1, rec(1, 1));
        assert!(r.get(1).is_none());
        assert_eq!(r.bytes(), 0);
    }
}
