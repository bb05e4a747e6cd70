//! A map from LBA ranges (in 512-byte sectors) to locations, stored per extent.
//!
//! Both the write-log overlay and the object map of a volume are extent maps. Memory
//! is proportional to the number of distinct extents, not to the volume size: a
//! sequential 1 GiB write is one entry. Overwrites split and trim existing extents;
//! every displaced piece is reported to a callback so callers can keep live-byte
//! accounting exact.

use std::collections::BTreeMap;

/// A location that can be split: the location of sector `n` of an extent starting at
/// `self` is `self.advance(n)`.
pub trait Location: Copy + Eq + std::fmt::Debug {
    fn advance(&self, sectors: u64) -> Self;
}

impl Location for () {
    fn advance(&self, _sectors: u64) -> Self {}
}

/// One mapped piece: `[lba, lba + sectors)` maps to `location`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece<L> {
    pub lba: u64,
    pub sectors: u64,
    pub location: L,
}

/// One piece of a lookup: mapped (`Some`) or a hole (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupPiece<L> {
    pub lba: u64,
    pub sectors: u64,
    pub location: Option<L>,
}

#[derive(Debug, Clone)]
pub struct ExtentMap<L> {
    /// start lba -> (sectors, location). Entries never overlap and never have zero length.
    entries: BTreeMap<u64, (u64, L)>,
    mapped_sectors: u64,
}

impl<L: Location> Default for ExtentMap<L> {
    fn default() -> Self {
        Self::new()
    }
}

impl<L: Location> ExtentMap<L> {
    pub fn new() -> Self {
        ExtentMap {
            entries: BTreeMap::new(),
            mapped_sectors: 0,
        }
    }

    /// Build from extents in ascending, non-overlapping order (a checkpoint), in
    /// linear time. Fails on the first extent that is empty, out of order or overlaps.
    pub fn from_sorted(pieces: impl IntoIterator<Item = Piece<L>>) -> Result<Self, Piece<L>> {
        let mut entries = BTreeMap::new();
        let mut mapped_sectors = 0u64;
        let mut end = 0u64;
        let mut sorted = Vec::new();
        for p in pieces {
            if p.sectors == 0 || p.lba < end {
                return Err(p);
            }
            end = p.lba.checked_add(p.sectors).ok_or(p)?;
            mapped_sectors += p.sectors;
            sorted.push((p.lba, (p.sectors, p.location)));
        }
        entries.extend(sorted);
        Ok(ExtentMap {
            entries,
            mapped_sectors,
        })
    }

    /// Number of extents held.
    pub fn extent_count(&self) -> usize {
        self.entries.len()
    }

    /// Total sectors mapped.
    pub fn mapped_sectors(&self) -> u64 {
        self.mapped_sectors
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Map `[lba, lba+sectors)` to `location`, reporting every displaced piece.
    pub fn insert(
        &mut self,
        lba: u64,
        sectors: u64,
        location: L,
        mut displaced: impl FnMut(Piece<L>),
    ) {
        if sectors == 0 {
            return;
        }
        if self.insert_alone(lba, sectors, location, &mut displaced) {
            return;
        }
        self.remove(lba, sectors, &mut displaced);
        self.entries.insert(lba, (sectors, location));
        self.mapped_sectors += sectors;
        self.merge_around(lba, sectors, location);
    }

    /// The two commonest inserts, each with one walk of the tree: the range is exactly
    /// one stored extent (an overwrite of the same blocks), or it overlaps nothing;
    /// and the new extent continues neither neighbour. False (nothing done) otherwise.
    /// Random 4 KiB writes are almost all one of these, and the general path costs
    /// several walks and an allocation (a fifth of a write's time was map updates).
    fn insert_alone(
        &mut self,
        lba: u64,
        sectors: u64,
        location: L,
        displaced: &mut impl FnMut(Piece<L>),
    ) -> bool {
        let Some(end) = lba.checked_add(sectors) else {
            return false;
        };
        // Backwards from `end`: the extent starting at `end` (if any), then the one
        // at or before `lba` must be next for either case to hold.
        let mut walk = self.entries.range_mut(..=end).rev();
        let mut at_or_before = walk.next();
        if let Some((&start, &mut (_, next_loc))) = at_or_before
            && start == end
        {
            if location.advance(sectors) == next_loc {
                return false; // it would merge with the next extent
            }
            at_or_before = walk.next();
        }
        let Some((&start, value)) = at_or_before else {
            // Nothing at or before `end` but possibly the extent at `end`: free.
            drop(walk);
            self.entries.insert(lba, (sectors, location));
            self.mapped_sectors += sectors;
            return true;
        };
        let (len, loc) = *value;
        let continues = |prev_start: u64, prev_len: u64, prev_loc: L| {
            prev_start + prev_len == lba && prev_loc.advance(prev_len) == location
        };
        if start == lba && len == sectors {
            // Exactly one stored extent: overwrite it in place.
            if let Some((&p, &mut (plen, ploc))) = walk.next()
                && continues(p, plen, ploc)
            {
                return false;
            }
            *value = (sectors, location);
            displaced(Piece {
                lba,
                sectors,
                location: loc,
            });
            return true;
        }
        if start + len <= lba && !continues(start, len, loc) {
            // The last extent starting before `end` ends before `lba`: nothing overlaps.
            drop(walk);
            self.entries.insert(lba, (sectors, location));
            self.mapped_sectors += sectors;
            return true;
        }
        false
    }

    /// Unmap `[lba, lba+sectors)`, reporting every removed piece.
    pub fn remove(&mut self, lba: u64, sectors: u64, mut removed: impl FnMut(Piece<L>)) {
        self.remove_where(lba, sectors, |_| true, &mut removed);
    }

    /// Unmap the pieces of `[lba, lba+sectors)` whose location satisfies `pred`.
    /// `pred` sees the location of the whole stored extent's piece start, already
    /// advanced to the start of the overlapping piece.
    pub fn remove_where(
        &mut self,
        lba: u64,
        sectors: u64,
        mut pred: impl FnMut(&L) -> bool,
        mut removed: impl FnMut(Piece<L>),
    ) {
        if sectors == 0 {
            return;
        }
        let end = lba.saturating_add(sectors);
        let overlapping = self.overlapping_starts(lba, end);
        for start in overlapping {
            let Some(&(len, loc)) = self.entries.get(&start) else {
                continue;
            };
            let piece_start = start.max(lba);
            let piece_end = (start + len).min(end);
            let piece_loc = loc.advance(piece_start - start);
            if !pred(&piece_loc) {
                continue;
            }
            self.entries.remove(&start);
            self.mapped_sectors -= len;
            if start < piece_start {
                self.entries.insert(start, (piece_start - start, loc));
                self.mapped_sectors += piece_start - start;
            }
            if piece_end < start + len {
                let tail = start + len - piece_end;
                self.entries
                    .insert(piece_end, (tail, loc.advance(piece_end - start)));
                self.mapped_sectors += tail;
            }
            removed(Piece {
                lba: piece_start,
                sectors: piece_end - piece_start,
                location: piece_loc,
            });
        }
    }

    /// Replace the pieces of `[lba, lba+sectors)` that still map to
    /// `expected.advance(offset)` with `new.advance(offset)`: the conditional update
    /// used to apply relocations and uploads without clobbering newer writes.
    /// Returns the number of sectors replaced.
    pub fn replace_if_at(
        &mut self,
        lba: u64,
        sectors: u64,
        expected: L,
        new: L,
        mut displaced: impl FnMut(Piece<L>),
    ) -> u64 {
        let mut replaced = Vec::new();
        self.remove_where(lba, sectors, |_| true, |p| replaced.push(p));
        let mut count = 0;
        for p in replaced {
            let offset = p.lba - lba;
            // A stored extent may cover several logical positions; compare sector by
            // sector-run: the piece matches iff its start matches (locations advance
            // linearly within one stored extent).
            if p.location == expected.advance(offset) {
                displaced(p);
                self.entries.insert(p.lba, (p.sectors, new.advance(offset)));
                count += p.sectors;
            } else {
                self.entries.insert(p.lba, (p.sectors, p.location));
            }
            self.mapped_sectors += p.sectors;
        }
        self.merge_range(lba, lba.saturating_add(sectors));
        count
    }

    /// The pieces covering `[lba, lba+sectors)` in order, holes included.
    pub fn lookup(&self, lba: u64, sectors: u64) -> Vec<LookupPiece<L>> {
        let mut out = Vec::new();
        self.for_each_in(lba, sectors, |p| out.push(p));
        out
    }

    /// Like [`lookup`](Self::lookup) without allocating.
    pub fn for_each_in(&self, lba: u64, sectors: u64, mut f: impl FnMut(LookupPiece<L>)) {
        let end = lba.saturating_add(sectors);
        let mut cursor = lba;
        let first = self.first_start_at_or_before(lba);
        for (&start, &(len, loc)) in self.entries.range(first..end) {
            if start + len <= cursor {
                continue;
            }
            if start > cursor {
                f(LookupPiece {
                    lba: cursor,
                    sectors: start - cursor,
                    location: None,
                });
                cursor = start;
            }
            let piece_end = (start + len).min(end);
            f(LookupPiece {
                lba: cursor,
                sectors: piece_end - cursor,
                location: Some(loc.advance(cursor - start)),
            });
            cursor = piece_end;
        }
        if cursor < end {
            f(LookupPiece {
                lba: cursor,
                sectors: end - cursor,
                location: None,
            });
        }
    }

    /// All extents in LBA order.
    pub fn iter(&self) -> impl Iterator<Item = Piece<L>> + '_ {
        self.iter_from(0)
    }

    /// The extents starting at or after `lba`, in LBA order: resuming a walk over the
    /// map from where an earlier [`iter`](Self::iter) stopped.
    pub fn iter_from(&self, lba: u64) -> impl Iterator<Item = Piece<L>> + '_ {
        self.entries
            .range(lba..)
            .map(|(&lba, &(sectors, location))| Piece {
                lba,
                sectors,
                location,
            })
    }

    /// Where a scan for pieces overlapping `lba..` starts: the start of the piece at
    /// or before `lba` (which may reach into it), or `lba` itself.
    fn first_start_at_or_before(&self, lba: u64) -> u64 {
        self.entries
            .range(..=lba)
            .next_back()
            .map(|(&s, _)| s)
            .unwrap_or(lba)
    }

    fn overlapping_starts(&self, lba: u64, end: u64) -> Vec<u64> {
        let first = self.first_start_at_or_before(lba);
        self.entries
            .range(first..end)
            .filter(|&(&s, &(len, _))| s + len > lba)
            .map(|(&s, _)| s)
            .collect()
    }

    /// Merge the entry just inserted at `lba` with its neighbours where they continue
    /// each other. Three lookups at most (the insert of every client write and every
    /// map update takes this path): walking the range as [`merge_range`] does cost
    /// twice that and an allocation, 8% of the instructions of a 4 KiB write.
    fn merge_around(&mut self, lba: u64, sectors: u64, location: L) {
        let mut len = sectors;
        let next = lba + sectors;
        if let Some(&(next_len, next_loc)) = self.entries.get(&next)
            && location.advance(sectors) == next_loc
        {
            self.entries.remove(&next);
            len += next_len;
            if let Some(e) = self.entries.get_mut(&lba) {
                e.0 = len;
            }
        }
        if let Some((&prev, &(prev_len, prev_loc))) = self.entries.range(..lba).next_back()
            && prev + prev_len == lba
            && prev_loc.advance(prev_len) == location
        {
            self.entries.remove(&lba);
            if let Some(e) = self.entries.get_mut(&prev) {
                e.0 = prev_len + len;
            }
        }
    }

    fn merge_range(&mut self, lba: u64, end: u64) {
        let first = self
            .entries
            .range(..lba)
            .next_back()
            .map(|(&s, _)| s)
            .unwrap_or(lba);
        let last_bound = end.saturating_add(1);
        let starts: Vec<u64> = self
            .entries
            .range(first..last_bound)
            .map(|(&s, _)| s)
            .collect();
        let mut prev: Option<u64> = None;
        for s in starts {
            if let Some(p) = prev {
                let (plen, ploc) = self.entries[&p];
                let (slen, sloc) = self.entries[&s];
                if p + plen == s && ploc.advance(plen) == sloc {
                    self.entries.remove(&s);
                    if let Some(e) = self.entries.get_mut(&p) {
                        e.0 = plen + slen;
                    }
                    continue;
                }
            }
            prev = Some(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Loc(u64);
    impl Location for Loc {
        fn advance(&self, sectors: u64) -> Self {
            Loc(self.0 + sectors)
        }
    }

    fn pieces(m: &ExtentMap<Loc>) -> Vec<(u64, u64, u64)> {
        m.iter().map(|p| (p.lba, p.sectors, p.location.0)).collect()
    }

    /// Assert the map's (lba, sectors, location) pieces and its mapped sector count.
    fn assert_map(m: &ExtentMap<Loc>, want: &[(u64, u64, u64)], mapped_sectors: u64) {
        assert_eq!(pieces(m), want);
        assert_eq!(m.mapped_sectors(), mapped_sectors);
    }

    #[test]
    fn insert_splits_and_reports_displaced() {
        let mut m = ExtentMap::new();
        m.insert(0, 100, Loc(1000), |_| panic!("nothing to displace"));
        let mut displaced = Vec::new();
        m.insert(10, 5, Loc(5000), |p| {
            displaced.push((p.lba, p.sectors, p.location.0))
        });
        assert_eq!(displaced, vec![(10, 5, 1010)]);
        assert_map(&m, &[(0, 10, 1000), (10, 5, 5000), (15, 85, 1015)], 100);
    }

    #[test]
    fn from_sorted_accepts_sorted_and_rejects_overlap() {
        let p = |lba, sectors, loc| Piece {
            lba,
            sectors,
            location: Loc(loc),
        };
        let m = ExtentMap::from_sorted([p(0, 8, 100), p(8, 8, 500), p(100, 1, 7)]).expect("valid");
        assert_map(&m, &[(0, 8, 100), (8, 8, 500), (100, 1, 7)], 17);
        assert!(
            ExtentMap::from_sorted([p(0, 8, 1), p(7, 8, 2)]).is_err(),
            "overlap"
        );
        assert!(
            ExtentMap::from_sorted([p(10, 8, 1), p(0, 8, 2)]).is_err(),
            "out of order"
        );
        assert!(
            ExtentMap::from_sorted([p(0, 0, 1)]).is_err(),
            "empty extent"
        );
    }

    #[test]
    fn contiguous_inserts_merge() {
        let mut m = ExtentMap::new();
        for i in 0..10 {
            m.insert(i * 8, 8, Loc(100 + i * 8), |_| {});
        }
        assert_eq!(pieces(&m), vec![(0, 80, 100)]);
        m.insert(80, 8, Loc(9999), |_| {});
        assert_eq!(m.extent_count(), 2);
    }

    #[test]
    fn lookup_reports_holes() {
        let mut m = ExtentMap::new();
        m.insert(10, 10, Loc(0), |_| {});
        m.insert(30, 10, Loc(50), |_| {});
        let l = m.lookup(5, 40);
        let got: Vec<_> = l
            .iter()
            .map(|p| (p.lba, p.sectors, p.location.map(|l| l.0)))
            .collect();
        assert_eq!(
            got,
            vec![
                (5, 5, None),
                (10, 10, Some(0)),
                (20, 10, None),
                (30, 10, Some(50)),
                (40, 5, None)
            ]
        );
        let inner = m.lookup(12, 3);
        assert_eq!(
            inner,
            vec![LookupPiece {
                lba: 12,
                sectors: 3,
                location: Some(Loc(2))
            }]
        );
    }

    #[test]
    fn remove_where_keeps_non_matching() {
        let mut m = ExtentMap::new();
        m.insert(0, 10, Loc(0), |_| {});
        m.insert(10, 10, Loc(500), |_| {});
        let mut removed = 0;
        m.remove_where(0, 20, |l| l.0 >= 500, |p| removed += p.sectors);
        assert_eq!(removed, 10);
        assert_eq!(pieces(&m), vec![(0, 10, 0)]);
    }

    #[test]
    fn replace_if_only_where_still_pointing_at_source() {
        let mut m = ExtentMap::new();
        m.insert(0, 100, Loc(1000), |_| {});
        // A newer write lands in the middle.
        m.insert(40, 10, Loc(7000), |_| {});
        // Relocate the whole original extent.
        let n = m.replace_if_at(0, 100, Loc(1000), Loc(2000), |_| {});
        assert_eq!(n, 90);
        assert_map(&m, &[(0, 40, 2000), (40, 10, 7000), (50, 50, 2050)], 100);
    }

    #[test]
    fn matches_a_per_sector_model_under_random_ops() {
        let mut next = crate::test_rng::xorshift64(0x1234_5678_9abc_def0);
        let mut m = ExtentMap::new();
        let mut model: Vec<Option<u64>> = vec![None; 512];
        let mut counter = 10_000u64;
        for _ in 0..20_000 {
            let lba = next() % 500;
            let len = 1 + next() % 12;
            let len = len.min(512 - lba);
            // Every insert reports exactly the sectors it displaced, where they were.
            let mut insert = |m: &mut ExtentMap<Loc>, lba: u64, len: u64, loc: u64| {
                let mut displaced = vec![None; len as usize];
                m.insert(lba, len, Loc(loc), |p| {
                    for i in 0..p.sectors {
                        let at = (p.lba + i - lba) as usize;
                        assert_eq!(displaced[at], None, "displaced twice");
                        displaced[at] = Some(p.location.0 + i);
                    }
                });
                for i in 0..len {
                    let at = (lba + i) as usize;
                    assert_eq!(displaced[i as usize], model[at], "displaced at {at}");
                    model[at] = Some(loc + i);
                }
            };
            match next() % 5 {
                0 => {
                    counter += 1000;
                    insert(&mut m, lba, len, counter);
                }
                1 => {
                    // Locations that continue their neighbours' (as sequential writes
                    // and applied objects do), so inserts merge on either side.
                    insert(&mut m, lba, len, 1_000_000 + lba);
                }
                4 => {
                    // Aligned 4-sector writes: overwrites of exactly one stored extent,
                    // and writes into holes, the inserts that take one walk.
                    counter += 1000;
                    insert(&mut m, lba / 4 * 4, 4.min(512 - lba / 4 * 4), counter);
                }
                2 => {
                    m.remove(lba, len, |_| {});
                    for i in 0..len {
                        model[(lba + i) as usize] = None;
                    }
                }
                _ => {
                    let from = model[lba as usize];
                    if let Some(from) = from {
                        counter += 1000;
                        m.replace_if_at(lba, len, Loc(from), Loc(counter), |_| {});
                        for i in 0..len {
                            if model[(lba + i) as usize] == Some(from + i) {
                                model[(lba + i) as usize] = Some(counter + i);
                            }
                        }
                    }
                }
            }
            let mut flat = vec![None; 512];
            for p in m.lookup(0, 512) {
                for i in 0..p.sectors {
                    flat[(p.lba + i) as usize] = p.location.map(|l| l.0 + i);
                }
            }
            assert_eq!(flat, model);
            // Canonical: no two stored extents that continue each other.
            let stored = pieces(&m);
            for w in stored.windows(2) {
                let ((a, alen, aloc), (b, _, bloc)) = (w[0], w[1]);
                assert!(
                    !(a + alen == b && aloc + alen == bloc),
                    "unmerged neighbours {:?}",
                    w
                );
            }
            assert_eq!(
                m.mapped_sectors(),
                model.iter().filter(|x| x.is_some()).count() as u64
            );
        }
    }
}
