//! The extent map as it was before chunks (a `BTreeMap` of one entry per extent),
//! kept as the reference model of the differential test in `extent_map.rs`.

#![allow(dead_code)]

use std::collections::BTreeMap;

use super::{Location, LookupPiece, Piece};

#[derive(Debug, Clone)]
pub struct RefMap<L> {
    /// start lba -> (sectors, location). Entries never overlap and never have zero length.
    entries: BTreeMap<u64, (u64, L)>,
    mapped_sectors: u64,
}

impl<L: Location> Default for RefMap<L> {
    fn default() -> Self {
        Self::new()
    }
}

impl<L: Location> RefMap<L> {
    pub fn new() -> Self {
        RefMap {
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
        Ok(RefMap {
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
