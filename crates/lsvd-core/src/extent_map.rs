//! A map from LBA ranges (in 512-byte sectors) to locations, stored per extent.
//!
//! Both the write-log overlay and the object map of a volume are extent maps. Memory
//! is proportional to the number of distinct extents, not to the volume size: a
//! sequential 1 GiB write is one entry. Overwrites split and trim existing extents;
//! every displaced piece is reported to a callback so callers can keep live-byte
//! accounting exact.
//!
//! Layout (issue 45: the store map of a large volume holds millions of extents).
//! Extents are kept sorted in chunks of up to `CHUNK` (64) entries, themselves in a
//! `BTreeMap` keyed by each chunk's first LBA. A chunk packs its entries into four
//! `u32` columns when it can (a `Packed` chunk, 16 bytes an extent): the start as an
//! offset from a per-chunk LBA base, the length, and the location's two parts
//! ([`Location::to_parts`], e.g. an object sequence number as an offset from a
//! per-chunk base, and a byte offset in the object). Whatever does not fit (an
//! extent longer than `u32::MAX` sectors, sequence numbers more than `u32::MAX` apart
//! in one chunk, offsets of 4 GiB or more, a location type without parts) turns that
//! chunk into a plain `Vec` of full-width entries, so every `u64` value still
//! round-trips and nothing about the map's behaviour changes. A per-extent
//! `BTreeMap` cost about 50 bytes an extent; chunks cost about 25
//! (`examples/map_memory.rs`), and a lookup walks a tree of about 40 times fewer
//! nodes, then searches one chunk's starts.

use std::collections::BTreeMap;
use std::ops::Bound;

/// A location that can be split: the location of sector `n` of an extent starting at
/// `self` is `self.advance(n)`.
///
/// `to_parts` and `from_parts` let the map store a location compactly: a location
/// with parts `(group, position)` (for example an object sequence number and a byte
/// offset) is stored as two `u32` where they fit. The defaults (no parts) make the
/// map store the location as it is. `from_parts` must invert `to_parts`; the map
/// checks that it does before storing the parts.
pub trait Location: Copy + Eq + std::fmt::Debug {
    fn advance(&self, sectors: u64) -> Self;

    /// The location as (group, position), or `None` to be stored as it is.
    fn to_parts(&self) -> Option<(u64, u64)> {
        None
    }

    /// The location whose parts are `(group, position)`.
    fn from_parts(_group: u64, _position: u64) -> Option<Self> {
        None
    }
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

/// Entries a chunk holds at most. Larger chunks cost less per extent (the tree above
/// them, and fewer half-empty chunks at the ends) but move more on an insert.
const CHUNK: usize = 64;

/// One stored extent, unpacked: (start, sectors, location).
type Entry<L> = (u64, u64, L);

/// A chunk of up to [`CHUNK`] entries in four `u32` columns. Entry `i` starts at
/// `lba_base + start[i]`, is `len[i]` sectors long and has location parts
/// `(group_base + group[i], position[i])`.
#[derive(Clone)]
struct Packed {
    lba_base: u64,
    group_base: u64,
    n: usize,
    start: [u32; CHUNK],
    len: [u32; CHUNK],
    group: [u32; CHUNK],
    position: [u32; CHUNK],
}

impl Packed {
    fn empty(lba_base: u64, group_base: u64) -> Box<Self> {
        Box::new(Packed {
            lba_base,
            group_base,
            n: 0,
            start: [0; CHUNK],
            len: [0; CHUNK],
            group: [0; CHUNK],
            position: [0; CHUNK],
        })
    }

    /// Pack `entries` (at most [`CHUNK`]), with bases their smallest start and group;
    /// `None` if one does not fit.
    fn from_entries<L: Location>(entries: &[Entry<L>]) -> Option<Box<Self>> {
        let lba_base = entries.first().map_or(0, |e| e.0);
        let mut group_base = u64::MAX;
        for e in entries {
            group_base = group_base.min(e.2.to_parts()?.0);
        }
        let mut p = Packed::empty(lba_base, group_base);
        for (i, &(start, len, loc)) in entries.iter().enumerate() {
            p.put(i, p.encode(start, len, loc)?);
        }
        p.n = entries.len();
        Some(p)
    }

    /// The columns of an entry, if it fits.
    #[inline]
    fn encode<L: Location>(&self, start: u64, len: u64, loc: L) -> Option<[u32; 4]> {
        let (group, position) = loc.to_parts()?;
        let cols = [
            u32::try_from(start.checked_sub(self.lba_base)?).ok()?,
            u32::try_from(len).ok()?,
            u32::try_from(group.checked_sub(self.group_base)?).ok()?,
            u32::try_from(position).ok()?,
        ];
        (L::from_parts(group, position) == Some(loc)).then_some(cols)
    }

    #[inline]
    fn put(&mut self, i: usize, cols: [u32; 4]) {
        self.start[i] = cols[0];
        self.len[i] = cols[1];
        self.group[i] = cols[2];
        self.position[i] = cols[3];
    }

    #[inline]
    fn start(&self, i: usize) -> u64 {
        self.lba_base + self.start[i] as u64
    }

    #[inline]
    fn get<L: Location>(&self, i: usize) -> Entry<L> {
        let loc = L::from_parts(
            self.group_base + self.group[i] as u64,
            self.position[i] as u64,
        )
        .expect("only locations that round-trip through their parts are packed");
        (self.start(i), self.len[i] as u64, loc)
    }

    /// Entries starting at or before `lba`.
    #[inline]
    fn count_le(&self, lba: u64) -> usize {
        let Some(rel) = lba.checked_sub(self.lba_base) else {
            return 0;
        };
        let Ok(rel) = u32::try_from(rel) else {
            return self.n;
        };
        self.start[..self.n].partition_point(|&s| s <= rel)
    }

    fn insert(&mut self, i: usize, cols: [u32; 4]) {
        let n = self.n;
        self.start.copy_within(i..n, i + 1);
        self.len.copy_within(i..n, i + 1);
        self.group.copy_within(i..n, i + 1);
        self.position.copy_within(i..n, i + 1);
        self.put(i, cols);
        self.n += 1;
    }

    fn remove(&mut self, i: usize) {
        let n = self.n;
        self.start.copy_within(i + 1..n, i);
        self.len.copy_within(i + 1..n, i);
        self.group.copy_within(i + 1..n, i);
        self.position.copy_within(i + 1..n, i);
        self.n -= 1;
    }
}

/// A sorted run of entries, non-empty in the map.
#[derive(Clone)]
enum Chunk<L> {
    Packed(Box<Packed>),
    /// Entries that do not all pack, full width; capacity [`CHUNK`].
    Plain(Vec<Entry<L>>),
}

impl<L: Location> Chunk<L> {
    /// A chunk of `entries` (at most [`CHUNK`]), packed if they all fit.
    fn from_entries(mut entries: Vec<Entry<L>>) -> Self {
        match Packed::from_entries(&entries) {
            Some(p) => Chunk::Packed(p),
            None => {
                entries.reserve_exact(CHUNK.saturating_sub(entries.len()));
                Chunk::Plain(entries)
            }
        }
    }

    fn entries(&self) -> Vec<Entry<L>> {
        (0..self.len()).map(|i| self.get(i)).collect()
    }

    #[inline]
    fn len(&self) -> usize {
        match self {
            Chunk::Packed(p) => p.n,
            Chunk::Plain(v) => v.len(),
        }
    }

    #[inline]
    fn get(&self, i: usize) -> Entry<L> {
        match self {
            Chunk::Packed(p) => p.get(i),
            Chunk::Plain(v) => v[i],
        }
    }

    #[inline]
    fn start(&self, i: usize) -> u64 {
        match self {
            Chunk::Packed(p) => p.start(i),
            Chunk::Plain(v) => v[i].0,
        }
    }

    /// Entries starting at or before `lba`.
    #[inline]
    fn count_le(&self, lba: u64) -> usize {
        match self {
            Chunk::Packed(p) => p.count_le(lba),
            Chunk::Plain(v) => v.partition_point(|e| e.0 <= lba),
        }
    }

    /// Take the entries out, unpacked (the chunk is left empty).
    fn take_entries(&mut self) -> Vec<Entry<L>> {
        match std::mem::replace(self, Chunk::Plain(Vec::new())) {
            Chunk::Plain(v) => v,
            Chunk::Packed(p) => (0..p.n).map(|i| p.get(i)).collect(),
        }
    }

    /// Replace entry `i` (its start stays in order).
    #[inline]
    fn set(&mut self, i: usize, e: Entry<L>) {
        match self {
            Chunk::Packed(p) => {
                if let Some(cols) = p.encode(e.0, e.1, e.2) {
                    p.put(i, cols);
                    return;
                }
            }
            Chunk::Plain(v) => {
                v[i] = e;
                // What did not pack may have been the entry replaced.
                self.repack();
                return;
            }
        }
        let mut v = self.take_entries();
        v[i] = e;
        *self = Chunk::from_entries(v);
    }

    /// Insert `e` at `i` (in order); the chunk must not be full.
    fn insert(&mut self, i: usize, e: Entry<L>) {
        match self {
            Chunk::Packed(p) => {
                if let Some(cols) = p.encode(e.0, e.1, e.2) {
                    p.insert(i, cols);
                    return;
                }
            }
            Chunk::Plain(v) => {
                // Entries that do not pack still do not with one more.
                v.insert(i, e);
                return;
            }
        }
        let mut v = self.take_entries();
        v.insert(i, e);
        *self = Chunk::from_entries(v);
    }

    fn remove(&mut self, i: usize) {
        match self {
            Chunk::Packed(p) => p.remove(i),
            Chunk::Plain(v) => {
                v.remove(i);
                self.repack();
            }
        }
    }

    /// Pack a plain chunk again if its entries now fit (with new bases).
    fn repack(&mut self) {
        if let Chunk::Plain(v) = self
            && let Some(p) = Packed::from_entries(v)
        {
            *self = Chunk::Packed(p);
        }
    }

    /// Split off the entries from `at` on as a chunk of their own.
    fn split_off(&mut self, at: usize) -> Self {
        let entries = self.entries();
        let (left, right) = entries.split_at(at);
        *self = Chunk::from_entries(left.to_vec());
        Chunk::from_entries(right.to_vec())
    }
}

#[derive(Clone)]
pub struct ExtentMap<L> {
    /// First start lba of the chunk -> chunk. Chunks are non-empty, sorted and their
    /// entries never overlap and never have zero length.
    chunks: BTreeMap<u64, Chunk<L>>,
    extents: usize,
    mapped_sectors: u64,
}

/// As the one-entry-per-extent map printed itself: start -> (sectors, location).
impl<L: Location> std::fmt::Debug for ExtentMap<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        struct List<'a, L>(&'a ExtentMap<L>);
        impl<L: Location> std::fmt::Debug for List<'_, L> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_map()
                    .entries(self.0.entries_from(0).map(|(s, l, loc)| (s, (l, loc))))
                    .finish()
            }
        }
        f.debug_struct("ExtentMap")
            .field("entries", &List(self))
            .field("mapped_sectors", &self.mapped_sectors)
            .finish()
    }
}

impl<L: Location> Default for ExtentMap<L> {
    fn default() -> Self {
        Self::new()
    }
}

/// Entries in order from a position, crossing into the following chunks as needed
/// (the range over them is only made when the first chunk runs out).
struct Entries<'a, L> {
    chunks: &'a BTreeMap<u64, Chunk<L>>,
    current: Option<(u64, &'a Chunk<L>)>,
    i: usize,
    rest: Option<std::collections::btree_map::Range<'a, u64, Chunk<L>>>,
}

impl<L: Location> Iterator for Entries<'_, L> {
    type Item = Entry<L>;

    #[inline]
    fn next(&mut self) -> Option<Entry<L>> {
        loop {
            let (key, chunk) = self.current?;
            if self.i < chunk.len() {
                self.i += 1;
                return Some(chunk.get(self.i - 1));
            }
            let chunks = self.chunks;
            let rest = self
                .rest
                .get_or_insert_with(|| chunks.range((Bound::Excluded(key), Bound::Unbounded)));
            self.current = rest.next().map(|(&k, c)| (k, c));
            self.i = 0;
        }
    }
}

impl<L: Location> ExtentMap<L> {
    pub fn new() -> Self {
        ExtentMap {
            chunks: BTreeMap::new(),
            extents: 0,
            mapped_sectors: 0,
        }
    }

    /// Build from extents in ascending, non-overlapping order (a checkpoint), in
    /// linear time, with full chunks. Fails on the first extent that is empty, out of
    /// order or overlaps.
    pub fn from_sorted(pieces: impl IntoIterator<Item = Piece<L>>) -> Result<Self, Piece<L>> {
        let mut map = ExtentMap::new();
        let mut end = 0u64;
        let mut run: Vec<Entry<L>> = Vec::with_capacity(CHUNK);
        for p in pieces {
            if p.sectors == 0 || p.lba < end {
                return Err(p);
            }
            end = p.lba.checked_add(p.sectors).ok_or(p)?;
            map.mapped_sectors += p.sectors;
            map.extents += 1;
            run.push((p.lba, p.sectors, p.location));
            if run.len() == CHUNK {
                map.chunks
                    .insert(run[0].0, Chunk::from_entries(std::mem::take(&mut run)));
                run.reserve(CHUNK);
            }
        }
        if let Some(&(first, _, _)) = run.first() {
            map.chunks.insert(first, Chunk::from_entries(run));
        }
        Ok(map)
    }

    /// Number of extents held.
    pub fn extent_count(&self) -> usize {
        self.extents
    }

    /// Total sectors mapped.
    pub fn mapped_sectors(&self) -> u64 {
        self.mapped_sectors
    }

    pub fn is_empty(&self) -> bool {
        self.extents == 0
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
        self.put(lba, sectors, location);
        self.mapped_sectors += sectors;
        self.merge_around(lba, sectors, location);
    }

    /// The two commonest inserts, each with one walk of the tree: the range is exactly
    /// one stored extent (an overwrite of the same blocks), or it overlaps nothing;
    /// and the new extent continues neither neighbour. False (nothing done) otherwise,
    /// also when deciding would need a neighbouring chunk (rare: the general path is
    /// right in every case). Random 4 KiB writes are almost all one of these, and the
    /// general path costs several walks and an allocation (a fifth of a write's time
    /// was map updates).
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
        // The chunk holding the last extent starting at or before `end`.
        let Some((_, chunk)) = self.chunks.range_mut(..=end).next_back() else {
            // Nothing starts at or before `end`: nothing overlaps or continues.
            self.put(lba, sectors, location);
            self.mapped_sectors += sectors;
            return true;
        };
        // Backwards from `end`: the extent starting at `end` (if any), then the one
        // at or before `lba` must be next for either case to hold.
        let mut i = chunk.count_le(end) - 1;
        let (mut start, mut len, mut loc) = chunk.get(i);
        if start == end {
            if location.advance(sectors) == loc || i == 0 {
                return false; // it would merge with the next extent, or look further
            }
            i -= 1;
            (start, len, loc) = chunk.get(i);
        }
        let continues = |prev_start: u64, prev_len: u64, prev_loc: L| {
            prev_start + prev_len == lba && prev_loc.advance(prev_len) == location
        };
        if start == lba && len == sectors {
            // Exactly one stored extent: overwrite it in place.
            if i == 0 {
                return false;
            }
            let (p, plen, ploc) = chunk.get(i - 1);
            if continues(p, plen, ploc) {
                return false;
            }
            chunk.set(i, (lba, sectors, location));
            displaced(Piece {
                lba,
                sectors,
                location: loc,
            });
            return true;
        }
        if start + len <= lba && !continues(start, len, loc) && chunk.len() < CHUNK {
            // The last extent starting before `end` ends before `lba`: nothing overlaps.
            chunk.insert(i + 1, (lba, sectors, location));
            self.extents += 1;
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
        let overlapping: Vec<Entry<L>> = self
            .entries_at_or_before(lba)
            .take_while(|e| e.0 < end)
            .filter(|e| e.0 + e.1 > lba)
            .collect();
        for (start, len, loc) in overlapping {
            let piece_start = start.max(lba);
            let piece_end = (start + len).min(end);
            let piece_loc = loc.advance(piece_start - start);
            if !pred(&piece_loc) {
                continue;
            }
            self.mapped_sectors -= len;
            if start < piece_start {
                self.set_len(start, piece_start - start);
                self.mapped_sectors += piece_start - start;
            } else {
                self.take(start);
            }
            if piece_end < start + len {
                let tail = start + len - piece_end;
                self.put(piece_end, tail, loc.advance(piece_end - start));
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
                self.put(p.lba, p.sectors, new.advance(offset));
                count += p.sectors;
            } else {
                self.put(p.lba, p.sectors, p.location);
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
        for (start, len, loc) in self.entries_at_or_before(lba) {
            if start >= end {
                break;
            }
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
        self.entries_from(lba)
            .map(|(lba, sectors, location)| Piece {
                lba,
                sectors,
                location,
            })
    }

    /// The entries from the last one starting at or before `lba` (which may reach
    /// into it) on, or from the first if none starts at or before `lba`.
    fn entries_at_or_before(&self, lba: u64) -> Entries<'_, L> {
        match self.chunks.range(..=lba).next_back() {
            // The chunk's first entry starts at `key` <= `lba`.
            Some((&key, chunk)) => self.entries_in(key, chunk, chunk.count_le(lba) - 1),
            None => self.entries_from_first(),
        }
    }

    /// The entries starting at or after `lba`.
    fn entries_from(&self, lba: u64) -> Entries<'_, L> {
        match self.chunks.range(..=lba).next_back() {
            Some((&key, chunk)) if lba > 0 => self.entries_in(key, chunk, chunk.count_le(lba - 1)),
            _ => self.entries_from_first(),
        }
    }

    fn entries_from_first(&self) -> Entries<'_, L> {
        Entries {
            chunks: &self.chunks,
            current: self.chunks.first_key_value().map(|(&k, c)| (k, c)),
            i: 0,
            rest: None,
        }
    }

    fn entries_in<'a>(&'a self, key: u64, chunk: &'a Chunk<L>, i: usize) -> Entries<'a, L> {
        Entries {
            chunks: &self.chunks,
            current: Some((key, chunk)),
            i,
            rest: None,
        }
    }

    /// The stored extent starting exactly at `start`: (sectors, location).
    fn get(&self, start: u64) -> Option<(u64, L)> {
        let (_, chunk) = self.chunks.range(..=start).next_back()?;
        let i = chunk.count_le(start).checked_sub(1)?;
        let (s, len, loc) = chunk.get(i);
        (s == start).then_some((len, loc))
    }

    /// The last stored extent starting before `lba`.
    fn before(&self, lba: u64) -> Option<Entry<L>> {
        let (_, chunk) = self.chunks.range(..lba).next_back()?;
        Some(chunk.get(chunk.count_le(lba - 1) - 1))
    }

    /// Set the length of the stored extent starting at `start` (which must exist).
    fn set_len(&mut self, start: u64, len: u64) {
        if let Some((_, chunk)) = self.chunks.range_mut(..=start).next_back() {
            let i = chunk.count_le(start) - 1;
            let (s, _, loc) = chunk.get(i);
            debug_assert_eq!(s, start);
            chunk.set(i, (start, len, loc));
        }
    }

    /// Store an extent at `start`, which must not overlap a stored one (the caller
    /// counts its sectors).
    fn put(&mut self, start: u64, len: u64, loc: L) {
        let e = (start, len, loc);
        self.extents += 1;
        let Some((_, chunk)) = self.chunks.range_mut(..=start).next_back() else {
            // Before every stored extent: first in the first chunk, which is re-keyed.
            match self.chunks.pop_first() {
                Some((_, mut chunk)) if chunk.len() < CHUNK => {
                    chunk.insert(0, e);
                    self.chunks.insert(start, chunk);
                }
                Some((key, chunk)) => {
                    self.chunks.insert(key, chunk);
                    self.chunks.insert(start, Chunk::from_entries(vec![e]));
                }
                None => {
                    self.chunks.insert(start, Chunk::from_entries(vec![e]));
                }
            }
            return;
        };
        let i = chunk.count_le(start);
        debug_assert!(chunk.start(i - 1) != start, "put over a stored extent");
        if chunk.len() < CHUNK {
            chunk.insert(i, e);
            return;
        }
        if i == CHUNK {
            // Appending to a full chunk (sequential inserts): a chunk of its own,
            // leaving this one full.
            self.chunks.insert(start, Chunk::from_entries(vec![e]));
            return;
        }
        let mut right = chunk.split_off(CHUNK / 2);
        if i <= CHUNK / 2 {
            chunk.insert(i, e);
        } else {
            right.insert(i - CHUNK / 2, e);
        }
        self.chunks.insert(right.start(0), right);
    }

    /// Remove the stored extent starting at `start` (which must exist); returns it.
    fn take(&mut self, start: u64) -> Option<(u64, L)> {
        let (&key, chunk) = self.chunks.range_mut(..=start).next_back()?;
        let i = chunk.count_le(start).checked_sub(1)?;
        let (s, len, loc) = chunk.get(i);
        if s != start {
            return None;
        }
        chunk.remove(i);
        self.extents -= 1;
        let n = chunk.len();
        if n == 0 {
            self.chunks.remove(&key);
        } else if n < CHUNK / 4 {
            self.merge_chunk(key, i == 0);
        } else if i == 0 {
            self.rekey(key);
        }
        Some((len, loc))
    }

    /// Key the chunk at `key` by its first start again (its first entry went).
    fn rekey(&mut self, key: u64) {
        if let Some(chunk) = self.chunks.remove(&key) {
            self.chunks.insert(chunk.start(0), chunk);
        }
    }

    /// Merge the under-full chunk at `key` into a neighbour if both fit in one;
    /// otherwise re-key it if `rekey`.
    fn merge_chunk(&mut self, key: u64, rekey: bool) {
        let n = self.chunks.get(&key).map_or(0, Chunk::len);
        let fits = |c: &Chunk<L>| c.len() + n <= CHUNK;
        let prev = self.chunks.range(..key).next_back();
        let into = match prev {
            Some((&k, c)) if fits(c) => Some((k, key)),
            _ => match self
                .chunks
                .range((Bound::Excluded(key), Bound::Unbounded))
                .next()
            {
                Some((&k, c)) if fits(c) => Some((key, k)),
                _ => None,
            },
        };
        let Some((left, right)) = into else {
            if rekey {
                self.rekey(key);
            }
            return;
        };
        if let (Some(l), Some(r)) = (self.chunks.remove(&left), self.chunks.remove(&right)) {
            let mut all = l.entries();
            all.extend(r.entries());
            self.chunks.insert(all[0].0, Chunk::from_entries(all));
        }
    }

    /// Merge the entry just inserted at `lba` with its neighbours where they continue
    /// each other. Three lookups at most (the insert of every client write and every
    /// map update takes this path): walking the range as [`merge_range`] does cost
    /// twice that and an allocation, 8% of the instructions of a 4 KiB write.
    fn merge_around(&mut self, lba: u64, sectors: u64, location: L) {
        let mut len = sectors;
        let next = lba + sectors;
        if let Some((next_len, next_loc)) = self.get(next)
            && location.advance(sectors) == next_loc
        {
            self.take(next);
            len += next_len;
            self.set_len(lba, len);
        }
        if let Some((prev, prev_len, prev_loc)) = self.before(lba)
            && prev + prev_len == lba
            && prev_loc.advance(prev_len) == location
        {
            self.take(lba);
            self.set_len(prev, prev_len + len);
        }
    }

    fn merge_range(&mut self, lba: u64, end: u64) {
        let first = if lba == 0 {
            0
        } else {
            self.before(lba).map_or(lba, |e| e.0)
        };
        let last_bound = end.saturating_add(1);
        let starts: Vec<Entry<L>> = self
            .entries_from(first)
            .take_while(|e| e.0 < last_bound)
            .collect();
        let mut prev: Option<(u64, u64, L)> = None;
        for (s, slen, sloc) in starts {
            if let Some((p, plen, ploc)) = prev
                && p + plen == s
                && ploc.advance(plen) == sloc
            {
                self.take(s);
                self.set_len(p, plen + slen);
                prev = Some((p, plen + slen, ploc));
                continue;
            }
            prev = Some((s, slen, sloc));
        }
    }
}

#[cfg(test)]
impl<L: Location> ExtentMap<L> {
    /// Panic unless the chunks are what the map assumes: non-empty, at most
    /// [`CHUNK`] entries, keyed by their first start, entries sorted, not
    /// overlapping and not empty, counts right, and packed where they all fit.
    fn check_invariants(&self) {
        let mut end = 0u64;
        let (mut extents, mut sectors) = (0usize, 0u64);
        for (&key, chunk) in &self.chunks {
            let entries = chunk.entries();
            assert!(!entries.is_empty() && entries.len() <= CHUNK, "chunk size");
            assert_eq!(key, entries[0].0, "chunk key");
            if let Chunk::Plain(v) = chunk {
                assert!(Packed::from_entries(v).is_none(), "plain chunk that packs");
            }
            for (start, len, _) in entries {
                assert!(len > 0 && (start >= end || (extents == 0 && start == 0)));
                end = start + len;
                extents += 1;
                sectors += len;
            }
        }
        assert_eq!(extents, self.extents, "extent count");
        assert_eq!(sectors, self.mapped_sectors, "mapped sectors");
    }
}

#[cfg(test)]
#[path = "extent_map_reference.rs"]
mod reference;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store_state::ObjLoc;
    use reference::RefMap;

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

    /// Locations for the differential test.
    trait TestLoc: Location {
        /// A location continuing a fixed base by `rel` sectors (so neighbouring
        /// inserts merge), or (`None`) a fresh one valid for `len` sectors.
        fn make(next: &mut impl FnMut() -> u64, rel: Option<u64>, len: u64) -> Self;
    }

    impl TestLoc for () {
        fn make(_: &mut impl FnMut() -> u64, _: Option<u64>, _: u64) -> Self {}
    }

    impl TestLoc for Loc {
        fn make(next: &mut impl FnMut() -> u64, rel: Option<u64>, _: u64) -> Self {
            match rel {
                Some(rel) => Loc((1 << 50) + rel),
                None => Loc(next() % (1 << 60)),
            }
        }
    }

    impl TestLoc for ObjLoc {
        fn make(next: &mut impl FnMut() -> u64, rel: Option<u64>, len: u64) -> Self {
            if let Some(rel) = rel {
                // Offsets pass 4 GiB (no longer packable) past 2^23 sectors.
                return ObjLoc {
                    object_seq: 7,
                    offset: 4096,
                }
                .advance(rel);
            }
            let object_seq = match next() % 4 {
                0 | 1 => 1000 + next() % 64,
                2 => u64::MAX - next() % 64,
                _ => next(),
            };
            // The last offset `len` sectors fit after, with room for a replace_if_at
            // expecting a location from up to 4096 sectors before.
            let room = u64::MAX - (len + 4096) * 512;
            let offset = match next() % 4 {
                0 | 1 => (next() % 2048) * 4096,
                2 => (u32::MAX as u64 - (next() % 8) * 512).min(room),
                _ => room - next() % 4096,
            };
            ObjLoc { object_seq, offset }
        }
    }

    /// One seeded random sequence of operations on the chunked map and on the old
    /// one-entry-per-extent map, comparing every result, every piece reported to a
    /// callback and (now and then) the whole maps.
    /// Returns the most chunks the map had and whether one was ever plain (to check
    /// the operations reach splits, merges and the unpacked fallback).
    fn differential<L: TestLoc>(seed: u64, ops: usize) -> (usize, bool) {
        let (mut most_chunks, mut saw_plain) = (0, false);
        let mut next = crate::test_rng::xorshift64(seed);
        let mut m: ExtentMap<L> = ExtentMap::new();
        let mut r: RefMap<L> = RefMap::new();
        // Regions: a dense one (thousands of extents, many chunks), a sparse one for
        // extents longer than u32::MAX sectors, and one just below u64::MAX.
        let high = u64::MAX - (1 << 40);
        for op in 0..ops {
            let (region, lba, len) = match next() % 10 {
                0..=5 => {
                    let lba = next() % 6000;
                    (0, lba, 1 + next() % 24)
                }
                6 => (0, next() % 6000 / 8 * 8, 8),
                7 => {
                    let lba = next() % (1 << 36);
                    (0, lba, 1 + next() % (1 << 34))
                }
                _ => {
                    let lba = high + next() % (1 << 36);
                    let len = if next().is_multiple_of(2) {
                        1 + next() % 64
                    } else {
                        1 + next() % (1 << 34)
                    };
                    (high, lba, len)
                }
            };
            let rel = next().is_multiple_of(3).then_some(lba - region);
            let loc = L::make(&mut next, rel, len);
            match next() % 8 {
                0..=3 => {
                    let (mut a, mut b) = (Vec::new(), Vec::new());
                    m.insert(lba, len, loc, |p| a.push(p));
                    r.insert(lba, len, loc, |p| b.push(p));
                    assert_eq!(a, b, "insert {lba} {len} {loc:?} displaced, op {op}");
                }
                4 => {
                    let (mut a, mut b) = (Vec::new(), Vec::new());
                    m.remove(lba, len, |p| a.push(p));
                    r.remove(lba, len, |p| b.push(p));
                    assert_eq!(a, b, "remove {lba} {len} removed, op {op}");
                }
                5 => {
                    let salt = next() as usize;
                    let (mut a, mut b) = (Vec::new(), Vec::new());
                    let (mut seen_a, mut seen_b) = (Vec::new(), Vec::new());
                    m.remove_where(
                        lba,
                        len,
                        |l| {
                            seen_a.push(*l);
                            !(seen_a.len() + salt).is_multiple_of(3)
                        },
                        |p| a.push(p),
                    );
                    r.remove_where(
                        lba,
                        len,
                        |l| {
                            seen_b.push(*l);
                            !(seen_b.len() + salt).is_multiple_of(3)
                        },
                        |p| b.push(p),
                    );
                    assert_eq!(seen_a, seen_b, "remove_where predicate calls, op {op}");
                    assert_eq!(a, b, "remove_where removed, op {op}");
                }
                _ => {
                    // Expect what is mapped at some sector of the range (or something
                    // made up), as relocations do.
                    let at = lba + next() % len;
                    let expected = match r.lookup(at, 1)[0].location {
                        Some(l) if !next().is_multiple_of(4) => l,
                        _ => L::make(&mut next, None, len),
                    };
                    let from = next() % (at - lba + 1);
                    let span = (len - from).min(1 + next() % 64);
                    let expected = if next().is_multiple_of(2) {
                        expected
                    } else {
                        loc
                    };
                    let new = L::make(&mut next, None, span);
                    let (mut a, mut b) = (Vec::new(), Vec::new());
                    let na = m.replace_if_at(lba + from, span, expected, new, |p| a.push(p));
                    let nb = r.replace_if_at(lba + from, span, expected, new, |p| b.push(p));
                    assert_eq!((na, a), (nb, b), "replace_if_at, op {op}");
                }
            }
            // Lookups and walks from random places.
            let (at, span) = (lba.saturating_sub(next() % 64), 1 + next() % (len + 64));
            let span = span.min(u64::MAX - at);
            assert_eq!(m.lookup(at, span), r.lookup(at, span), "lookup, op {op}");
            let mut pieces = Vec::new();
            m.for_each_in(at, span, |p| pieces.push(p));
            assert_eq!(pieces, r.lookup(at, span), "for_each_in, op {op}");
            let a: Vec<_> = m.iter_from(at).take(80).collect();
            let b: Vec<_> = r.iter_from(at).take(80).collect();
            assert_eq!(a, b, "iter_from {at}, op {op}");
            assert_eq!(m.extent_count(), r.extent_count(), "extent_count, op {op}");
            assert_eq!(m.mapped_sectors(), r.mapped_sectors(), "mapped, op {op}");
            assert_eq!(m.is_empty(), r.is_empty());
            most_chunks = most_chunks.max(m.chunks.len());
            saw_plain |= m.chunks.values().any(|c| matches!(c, Chunk::Plain(_)));
            if op % 97 == 0 {
                m.check_invariants();
                assert!(m.iter().eq(r.iter()), "iter, op {op}");
                assert_eq!(
                    format!("{m:?}"),
                    format!("{r:?}").replacen("RefMap", "ExtentMap", 1)
                );
                // Continue on a clone, or on a map loaded from a checkpoint of it.
                m = if op % 2 == 0 {
                    m.clone()
                } else {
                    let loaded = ExtentMap::from_sorted(m.iter()).expect("sorted");
                    loaded.check_invariants();
                    loaded
                };
            }
        }
        m.check_invariants();
        assert!(m.iter().eq(r.iter()));
        // Remove everything: the map empties (chunks merge and go).
        let (mut a, mut b) = (Vec::new(), Vec::new());
        m.remove(0, u64::MAX, |p| a.push(p));
        r.remove(0, u64::MAX, |p| b.push(p));
        assert_eq!(a, b);
        m.check_invariants();
        assert!(m.is_empty() && m.chunks.is_empty());
        (most_chunks, saw_plain)
    }

    #[test]
    fn matches_the_btree_map_it_replaced_for_store_locations() {
        for seed in 1..=24u64 {
            let (chunks, plain) =
                differential::<ObjLoc>(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 3000);
            assert!(chunks >= 8 && plain, "{chunks} chunks, plain {plain}");
        }
    }

    #[test]
    fn matches_the_btree_map_it_replaced_for_unpacked_locations() {
        for seed in 1..=12u64 {
            differential::<Loc>(seed.wrapping_mul(0x2545_f491_4f6c_dd1d), 3000);
            differential::<()>(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 1, 3000);
        }
    }

    #[test]
    fn extents_that_do_not_pack_round_trip() {
        let mut m = ExtentMap::new();
        let huge = u32::MAX as u64 + 10;
        let far = ObjLoc {
            object_seq: u64::MAX,
            offset: u64::MAX - huge * 512,
        };
        for i in 0..200u64 {
            let loc = ObjLoc {
                object_seq: i,
                offset: i * 4096,
            };
            m.insert(i * 16, 8, loc, |_| {});
        }
        assert!(matches!(
            m.chunks.first_key_value(),
            Some((_, Chunk::Packed(_)))
        ));
        // Longer than u32::MAX sectors, far sequence number and offset: unpacked,
        // exact.
        m.insert(200 * 16 + 8, huge, far, |_| {});
        m.check_invariants();
        let p = m.lookup(200 * 16 + 8 + huge - 1, 1)[0];
        assert_eq!(p.location, Some(far.advance(huge - 1)));
        assert!(m.chunks.values().any(|c| matches!(c, Chunk::Plain(_))));
        let mut removed = Vec::new();
        m.remove(200 * 16 + 8, huge, |p| removed.push(p));
        assert_eq!(
            removed,
            vec![Piece {
                lba: 200 * 16 + 8,
                sectors: huge,
                location: far
            }]
        );
        // Packed again once what did not fit is gone.
        m.check_invariants();
        assert!(m.chunks.values().all(|c| matches!(c, Chunk::Packed(_))));
        assert_eq!(m.extent_count(), 200);
    }

    #[test]
    fn from_sorted_packs_full_chunks() {
        let pieces = (0..10 * CHUNK as u64).map(|i| Piece {
            lba: i * 8,
            sectors: 4,
            location: ObjLoc {
                object_seq: i / 100,
                offset: i * 2048,
            },
        });
        let m = ExtentMap::from_sorted(pieces.clone()).expect("sorted");
        m.check_invariants();
        assert_eq!(m.chunks.len(), 10);
        assert!(m.iter().eq(pieces));
    }
}
