//! Which claim of a volume wrote each part of its object history.
//!
//! Why: a process that claims a volume (opens it to write) gets a new *epoch*, and
//! every object it writes carries that epoch in its name and header. Two processes
//! that both believe they own a volume (a paused holder that comes back after a
//! takeover, an upload that lands after its writer died) can then never write the
//! same name: their objects differ by epoch. What remains is to know, for each
//! sequence number, which epoch's object is the history and which are leftovers.
//! That is this table.
//!
//! A claim recovers the history up to some object `after` (the end of the
//! consecutive run), then numbers its own objects from `first`, past every number
//! any object in the store has (so numbers only grow, even over objects stranded
//! past a gap). It records the segment `(first, epoch, after)`. For a sequence number
//! `s`, the owning segment is the last one with `first <= s`; but if the next segment
//! says the history before it ended at `after < s`, then `s` is in the hole between
//! the two: no object numbered `s` is history.
//!
//! ```text
//!  segments: (first 1, epoch 1, after 0) (first 9, epoch 2, after 6)
//!  seq:      1 2 3 4 5 6 | 7 8 | 9 10 11 ...
//!  owner:    epoch 1     | hole| epoch 2
//! ```
//!
//! A table may be *pruned*: segments wholly before `from_seq` are dropped, and
//! numbers below `from_seq` are then unknown (the checkpoint that covers them lists
//! its objects with their epochs). Volumes written before epochs have no segments:
//! every object is epoch 0.

/// One claim's part of the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// The first sequence number the claim used.
    pub first_seq: u64,
    /// The claim's epoch.
    pub epoch: u64,
    /// The last sequence number of the history before this segment (the claim
    /// recovered through it); `first_seq - 1` when the history does not jump.
    pub after_seq: u64,
}

/// Who owns a sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The object of this epoch is the history's object at that number.
    Epoch(u64),
    /// No object at that number is history: the history jumps over it, to this
    /// sequence number.
    Hole { resumes_at: u64 },
    /// Below what the table covers (pruned).
    Unknown,
}

/// The history's segments (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// Numbers below this are not described.
    pub from_seq: u64,
    /// Sorted by `first_seq` (strictly increasing), with strictly increasing epochs.
    pub segments: Vec<Segment>,
}

/// Why a table does not describe a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryError(pub String);

impl std::fmt::Display for HistoryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HistoryError {}

/// Most segments a table may hold (a superblock or snapshot record that says more is
/// corrupt): a claim that writes nothing leaves no segment behind, so this is how many
/// claims wrote objects since the oldest checkpoint kept.
pub const MAX_SEGMENTS: usize = 4096;

impl History {
    /// A volume written before epochs: every object is epoch 0.
    pub fn legacy() -> History {
        History::default()
    }

    /// Check the table's own rules (for a decoder).
    pub fn validate(&self) -> Result<(), HistoryError> {
        if self.segments.len() > MAX_SEGMENTS {
            return Err(HistoryError(format!(
                "{} segments, more than {MAX_SEGMENTS}",
                self.segments.len()
            )));
        }
        for (i, s) in self.segments.iter().enumerate() {
            if s.after_seq >= s.first_seq || s.epoch == 0 {
                return Err(HistoryError(format!(
                    "segment {i} starts at {} after {} with epoch {}",
                    s.first_seq, s.after_seq, s.epoch
                )));
            }
            if let Some(prev) = i.checked_sub(1).map(|p| self.segments[p])
                && (s.first_seq <= prev.first_seq
                    || s.epoch <= prev.epoch
                    || s.after_seq < prev.first_seq)
            {
                return Err(HistoryError(format!(
                    "segment {i} (first {}, epoch {}, after {}) does not follow segment {} (first {}, epoch {})",
                    s.first_seq,
                    s.epoch,
                    s.after_seq,
                    i - 1,
                    prev.first_seq,
                    prev.epoch
                )));
            }
        }
        Ok(())
    }

    /// The newest claim's epoch (0 before epochs).
    pub fn newest_epoch(&self) -> u64 {
        self.segments.last().map_or(0, |s| s.epoch)
    }

    /// Who owns sequence number `seq`.
    pub fn owner(&self, seq: u64) -> Owner {
        if seq < self.from_seq {
            return Owner::Unknown;
        }
        let i = self.segments.partition_point(|s| s.first_seq <= seq);
        if let Some(next) = self.segments.get(i)
            && seq > next.after_seq
        {
            return Owner::Hole {
                resumes_at: next.first_seq,
            };
        }
        match i.checked_sub(1) {
            Some(owning) => Owner::Epoch(self.segments[owning].epoch),
            // Before the first claim that recorded a segment: written before epochs.
            None => Owner::Epoch(0),
        }
    }

    /// The epoch of the history's object `seq`, if the table says.
    pub fn epoch_of(&self, seq: u64) -> Option<u64> {
        match self.owner(seq) {
            Owner::Epoch(e) => Some(e),
            _ => None,
        }
    }

    /// Does some later claim vouch that the history reached `seq` (it recovered
    /// through it before numbering on)? Then an object missing at `seq` is lost
    /// data, not the end of the history.
    pub fn vouched(&self, seq: u64) -> bool {
        self.segments.iter().any(|s| s.after_seq >= seq)
    }

    /// Record a claim: epoch `epoch` (above every epoch here) recovered the history
    /// through `after_seq` and numbers its objects from `first_seq` on. Segments
    /// that started after `after_seq` own nothing of the history (their claims wrote
    /// nothing that survived) and are dropped.
    pub fn claim(&mut self, epoch: u64, after_seq: u64, first_seq: u64) {
        debug_assert!(epoch > self.newest_epoch() && first_seq > after_seq);
        self.segments.retain(|s| s.first_seq <= after_seq);
        self.segments.push(Segment {
            first_seq,
            epoch,
            after_seq,
        });
    }

    /// Forget what lies wholly below `from_seq` (numbers below it become unknown):
    /// keeps the segment that owns `from_seq` and those after it.
    pub fn prune(&mut self, from_seq: u64) {
        if from_seq <= self.from_seq {
            return;
        }
        let owning = self.segments.partition_point(|s| s.first_seq <= from_seq);
        self.segments.drain(..owning.saturating_sub(1));
        self.from_seq = from_seq;
    }

    /// The part of this table that describes `[from_seq, ..)`.
    pub fn pruned(&self, from_seq: u64) -> History {
        let mut h = self.clone();
        h.prune(from_seq);
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(first_seq: u64, epoch: u64, after_seq: u64) -> Segment {
        Segment {
            first_seq,
            epoch,
            after_seq,
        }
    }

    #[test]
    fn owners_holes_and_jumps() {
        let h = History {
            from_seq: 0,
            segments: vec![seg(1, 1, 0), seg(9, 2, 6)],
        };
        h.validate().expect("valid");
        assert_eq!(h.owner(1), Owner::Epoch(1));
        assert_eq!(h.owner(6), Owner::Epoch(1));
        assert_eq!(h.owner(7), Owner::Hole { resumes_at: 9 });
        assert_eq!(h.owner(8), Owner::Hole { resumes_at: 9 });
        assert_eq!(h.owner(9), Owner::Epoch(2));
        assert_eq!(h.owner(u64::MAX), Owner::Epoch(2));
        assert!(h.vouched(6) && !h.vouched(7));
        assert_eq!(History::legacy().owner(5), Owner::Epoch(0));
        // A legacy volume's first claim: epoch 0 up to its start.
        let mut l = History::legacy();
        l.claim(1, 40, 43);
        assert_eq!(l.owner(40), Owner::Epoch(0));
        assert_eq!(l.owner(41), Owner::Hole { resumes_at: 43 });
        assert_eq!(l.owner(43), Owner::Epoch(1));
    }

    #[test]
    fn a_claim_drops_segments_that_wrote_nothing_of_the_history() {
        let mut h = History {
            from_seq: 0,
            segments: vec![seg(1, 1, 0), seg(9, 2, 6)],
        };
        // Epoch 3 recovered only through 6: epoch 2 wrote nothing that survived.
        h.claim(3, 6, 12);
        assert_eq!(h.segments, vec![seg(1, 1, 0), seg(12, 3, 6)]);
        assert_eq!(h.owner(10), Owner::Hole { resumes_at: 12 });
        // Epoch 4 recovered through 20 (epoch 3's objects): both stay.
        h.claim(4, 20, 21);
        assert_eq!(h.owner(20), Owner::Epoch(3));
        assert_eq!(h.owner(21), Owner::Epoch(4));
        h.validate().expect("valid");
    }

    #[test]
    fn pruning_keeps_the_owner_of_from_seq() {
        let h = History {
            from_seq: 0,
            segments: vec![seg(1, 1, 0), seg(9, 2, 6), seg(20, 3, 19)],
        };
        let p = h.pruned(10);
        assert_eq!(p.segments, vec![seg(9, 2, 6), seg(20, 3, 19)]);
        assert_eq!(p.owner(9), Owner::Unknown);
        assert_eq!(p.owner(10), Owner::Epoch(2));
        assert_eq!(p.owner(25), Owner::Epoch(3));
        assert_eq!(h.pruned(0), h);
    }

    #[test]
    fn invalid_tables_are_refused() {
        for bad in [
            vec![seg(5, 1, 5)],
            vec![seg(5, 0, 4)],
            vec![seg(5, 2, 4), seg(5, 3, 4)],
            vec![seg(5, 2, 4), seg(9, 2, 8)],
            vec![seg(5, 2, 4), seg(9, 3, 4)],
        ] {
            let h = History {
                from_seq: 0,
                segments: bad.clone(),
            };
            assert!(h.validate().is_err(), "{bad:?}");
        }
    }
}
