//! The read cache's index: which slot holds which chunk, the CLOCK hand, the queue of
//! admitted chunks, and which volume each slot is charged to (fairness). Pure
//! bookkeeping under the cache's mutex: no I/O, so every rule about who may evict what
//! is here and unit-testable.

use std::collections::{HashMap, VecDeque};

use lsvd_core::VolumeId;

use super::CacheObject;
use super::slot_table::{BLOCKS_PER_SLOT, Entry};

/// Which volume's reads a slot is charged to (fairness): an index into
/// [`Index::readers`]. [`NOBODY`] holds what a warm restart found until its owner opens,
/// and what a closed volume left.
pub(super) type ReaderIx = u16;
pub(super) const NOBODY: ReaderIx = 0;

/// A volume using the cache, for fairness.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Reader {
    pub(super) active: bool,
    /// Slots charged to it.
    pub(super) held: u32,
}

pub(super) type Key = (CacheObject, u64); // (object, chunk index)

#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub(super) key: Key,
    pub(super) len: u32,
    pub(super) hashes: [u64; BLOCKS_PER_SLOT],
    pub(super) referenced: bool,
    /// Written by upload admission or prefetch and not read since.
    pub(super) admitted: bool,
    /// Prefetched and not read since (counted as a prefetch hit when first read).
    pub(super) prefetched: bool,
    /// The volume whose read, upload or prefetch put it here.
    pub(super) reader: ReaderIx,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum SlotState {
    Free,
    /// Being written by one insert: nobody else may pick it.
    Writing,
    Used(Slot),
}

#[derive(Debug, Default)]
pub(super) struct Index {
    pub(super) map: HashMap<Key, u32>,
    pub(super) slots: Vec<SlotState>,
    /// Every `Free` slot, once each: a slot leaves `Free` only by being taken from here.
    pub(super) free: Vec<u32>,
    pub(super) hand: usize,
    /// Admitted slots, oldest first: (slot, key), pruned lazily (a slot that was read,
    /// evicted or reused since no longer matches) and compacted when stale entries
    /// outnumber the slots, so it stays bounded.
    pub(super) admitted: VecDeque<(u32, Key)>,
    pub(super) admitted_count: usize,
    /// Volumes using the cache, by [`ReaderIx`]; entry 0 is [`NOBODY`].
    pub(super) readers: Vec<Reader>,
    pub(super) active_readers: usize,
}

/// How far admission looks past the CLOCK hand for a chunk nobody read recently.
const ADMIT_SCAN_SLOTS: usize = 64;

impl Index {
    /// An index of `slot_count` free slots.
    pub(super) fn with_slots(slot_count: usize) -> Index {
        Index {
            slots: vec![SlotState::Free; slot_count],
            free: (0..slot_count as u32).rev().collect(),
            readers: vec![Reader::default()],
            ..Index::default()
        }
    }

    /// A reader for `volume`, charged with the slots of its own objects nobody holds
    /// (what a warm restart found, or it left when it last closed).
    pub(super) fn register(&mut self, volume: VolumeId) -> ReaderIx {
        let ix = match self.readers.iter().skip(1).position(|r| !r.active) {
            Some(i) => i + 1,
            None if self.readers.len() <= usize::from(ReaderIx::MAX) => {
                self.readers.push(Reader::default());
                self.readers.len() - 1
            }
            None => return NOBODY,
        };
        self.readers[ix] = Reader {
            active: true,
            held: 0,
        };
        self.active_readers += 1;
        self.recharge(NOBODY, ix as ReaderIx, Some(volume));
        ix as ReaderIx
    }

    /// `ix` closed: what it holds is nobody's (evictable by anyone).
    pub(super) fn unregister(&mut self, ix: ReaderIx) {
        if ix == NOBODY || !self.readers[usize::from(ix)].active {
            return;
        }
        self.recharge(ix, NOBODY, None);
        self.readers[usize::from(ix)].active = false;
        self.active_readers -= 1;
    }

    /// Charge `from`'s slots (only those of `volume`'s objects, if given) to `to`.
    fn recharge(&mut self, from: ReaderIx, to: ReaderIx, volume: Option<VolumeId>) {
        let mut moved = 0;
        for slot in &mut self.slots {
            if let SlotState::Used(s) = slot
                && s.reader == from
                && volume.is_none_or(|v| s.key.0.volume == v)
            {
                s.reader = to;
                moved += 1;
            }
        }
        self.readers[usize::from(from)].held -= moved;
        self.readers[usize::from(to)].held += moved;
    }

    /// May `inserter` not evict `slot`? Slots of another open volume that holds no more
    /// than its share of the cache (slots / open volumes) are kept from it, so one
    /// volume's scan cannot empty the cache of the others.
    fn guarded(&self, slot: &Slot, inserter: ReaderIx) -> bool {
        if slot.reader == NOBODY || slot.reader == inserter {
            return false;
        }
        let r = &self.readers[usize::from(slot.reader)];
        r.active && u64::from(r.held) * self.active_readers as u64 <= self.slots.len() as u64
    }

    /// Drop slot `s`'s chunk from the index; the slot is the caller's to fill (it is
    /// neither free nor used until the caller says).
    fn take(&mut self, s: usize) {
        if let SlotState::Used(old) = self.slots[s] {
            self.map.remove(&old.key);
            self.readers[usize::from(old.reader)].held -= 1;
            if old.admitted {
                self.admitted_count -= 1;
            }
        }
        self.slots[s] = SlotState::Writing;
    }

    /// Drop slot `s`'s chunk from the index and free the slot.
    pub(super) fn evict(&mut self, s: usize) {
        if let SlotState::Used(_) = self.slots[s] {
            self.take(s);
            self.release(s);
        }
    }

    /// Slot `s`, taken and not filled, is free again.
    pub(super) fn release(&mut self, s: usize) {
        self.slots[s] = SlotState::Free;
        self.free.push(s as u32);
    }

    /// A free slot, if any.
    fn pop_free(&mut self) -> Option<usize> {
        let s = self.free.pop()? as usize;
        debug_assert!(matches!(self.slots[s], SlotState::Free));
        self.slots[s] = SlotState::Writing;
        Some(s)
    }

    /// A slot for a chunk a client of `inserter` read: a free one, or CLOCK's victim
    /// among the slots it may evict (all of them, if it may evict none).
    pub(super) fn victim_for_read(&mut self, inserter: ReaderIx) -> Option<usize> {
        if let Some(s) = self.pop_free() {
            return Some(s);
        }
        self.clock(Some(inserter)).or_else(|| self.clock(None))
    }

    /// CLOCK over the slots `inserter` may evict (any, without one).
    fn clock(&mut self, inserter: Option<ReaderIx>) -> Option<usize> {
        let n = self.slots.len();
        for _ in 0..2 * n {
            let h = self.hand;
            self.hand = (h + 1) % n;
            let guarded = matches!(self.slots[h],
                SlotState::Used(s) if inserter.is_some_and(|i| self.guarded(&s, i)));
            match &mut self.slots[h] {
                SlotState::Used(_) if guarded => {}
                SlotState::Used(s) if s.referenced => s.referenced = false,
                SlotState::Used(_) => {
                    self.take(h);
                    return Some(h);
                }
                SlotState::Free | SlotState::Writing => {}
            }
        }
        None
    }

    /// A slot for an uploaded or prefetched chunk: a free slot; else, past the
    /// admission cap, the oldest admitted chunk; else one holding nothing read
    /// recently, found without clearing anyone's reference bit (admission must not age
    /// read data).
    pub(super) fn victim_for_admission(&mut self, inserter: ReaderIx) -> Option<usize> {
        if let Some(s) = self.pop_free() {
            return Some(s);
        }
        let n = self.slots.len();
        if self.admitted_count >= n / 2 {
            return self.oldest_admitted();
        }
        for i in 0..ADMIT_SCAN_SLOTS.min(n) {
            let h = (self.hand + i) % n;
            // Read data nobody touched since the hand last passed; admitted chunks go
            // oldest first (below), not by position.
            if matches!(self.slots[h],
                SlotState::Used(s) if !s.referenced && !s.admitted && !self.guarded(&s, inserter))
            {
                self.take(h);
                self.hand = (h + 1) % n;
                return Some(h);
            }
        }
        self.oldest_admitted()
    }

    fn oldest_admitted(&mut self) -> Option<usize> {
        while let Some((slot, key)) = self.admitted.pop_front() {
            if let SlotState::Used(s) = self.slots[slot as usize]
                && s.admitted
                && s.key == key
            {
                self.take(slot as usize);
                return Some(slot as usize);
            }
        }
        None
    }

    /// Drop the stale entries of the admitted queue once they outnumber the slots.
    fn compact_admitted(&mut self) {
        if self.admitted.len() <= self.slots.len() + self.admitted_count {
            return;
        }
        let slots = &self.slots;
        self.admitted.retain(|&(slot, key)| {
            matches!(slots[slot as usize], SlotState::Used(s) if s.admitted && s.key == key)
        });
    }

    pub(super) fn place(&mut self, slot: usize, entry: &Entry, mode: PutMode, reader: ReaderIx) {
        let key = (entry.object, entry.chunk);
        let admitted = mode != PutMode::Read;
        self.slots[slot] = SlotState::Used(Slot {
            key,
            len: entry.len,
            hashes: entry.hashes,
            referenced: false,
            admitted,
            prefetched: mode == PutMode::Prefetch,
            reader,
        });
        self.readers[usize::from(reader)].held += 1;
        self.map.insert(key, slot as u32);
        if admitted {
            self.admitted.push_back((slot as u32, key));
            self.admitted_count += 1;
            self.compact_admitted();
        }
    }
}

/// Why a chunk is put in the cache, which decides what it may evict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PutMode {
    /// A client asked for it: CLOCK.
    Read,
    /// Uploaded data: admission rules.
    Admit,
    /// Fetched ahead of any client: admission rules, and counted when first read.
    Prefetch,
}
