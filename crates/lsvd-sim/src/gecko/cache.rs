//! The tail cache of the chained-log model (`--tail-cache SIZE`): an LRU of 4 KiB
//! logical blocks that admits every client write, so a client read of recently
//! written data is served without touching a drive.
//!
//! Gecko puts a RAM+SSD cache in front of its tail drive so that reads of freshly
//! written data do not pull the tail drive's head away from its sequential writes;
//! its RAID baseline gets an LRU cache of the same kind. The model gives both
//! layouts this one cache: writes are admitted (the cache holds the newest data of a
//! block, so it stays valid wherever GC moves the block), a read hit makes the block
//! most recently used, a read miss is not admitted, and when the cache is full the
//! least recently used block leaves. A hit costs no time (the model has no latency
//! for RAM or the cache SSD).
//!
//! The list is intrusive over the dense logical block numbers (two `u32` links per
//! block, allocated only when the cache is on), so every operation is O(1).

use super::layout::{BLOCK_BYTES, LayoutKind, Log, NONE};
use super::report::CacheStats;

/// "No block" in the links.
const NIL: u32 = u32::MAX;

/// An LRU set of logical blocks with room for `capacity_blocks`.
#[derive(Debug, Clone)]
pub struct TailCache {
    capacity_blocks: u64,
    len: u64,
    /// Per logical block: the next older / newer cached block, or `NIL`.
    older: Vec<u32>,
    newer: Vec<u32>,
    present: Vec<bool>,
    /// Least and most recently used.
    lru: u32,
    mru: u32,
}

impl TailCache {
    /// A cache of `capacity_blocks` over logical blocks `0..logical_blocks`
    /// (capacity 0: off, nothing allocated). Blocks at or past `u32::MAX - 1` are never
    /// cached (the model caps the address space at 2^30 blocks).
    pub fn new(capacity_blocks: u64, logical_blocks: u64) -> TailCache {
        let n = if capacity_blocks == 0 {
            0
        } else {
            logical_blocks.min(u64::from(NIL)) as usize
        };
        TailCache {
            capacity_blocks,
            len: 0,
            older: vec![NIL; n],
            newer: vec![NIL; n],
            present: vec![false; n],
            lru: NIL,
            mru: NIL,
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Is `lba` cached? (Does not change the order.)
    pub fn contains(&self, lba: u64) -> bool {
        self.index(lba)
            .is_some_and(|i| self.present.get(i).copied().unwrap_or(false))
    }

    fn index(&self, lba: u64) -> Option<usize> {
        let i = usize::try_from(lba).ok()?;
        (i < self.present.len()).then_some(i)
    }

    /// A client wrote `lba`: it becomes the most recently used block, evicting the
    /// least recently used one if the cache is over capacity.
    pub fn admit(&mut self, lba: u64) {
        let Some(i) = self.index(lba) else {
            return;
        };
        if self.present.get(i).copied().unwrap_or(false) {
            self.unlink(i);
        } else {
            self.len += 1;
            if let Some(p) = self.present.get_mut(i) {
                *p = true;
            }
        }
        self.push_mru(i);
        while self.len > self.capacity_blocks && self.lru != NIL {
            let victim = self.lru as usize;
            self.unlink(victim);
            if let Some(p) = self.present.get_mut(victim) {
                *p = false;
            }
            self.len -= 1;
        }
    }

    /// A client reads `lba`: true (a hit, and the block becomes most recently used)
    /// if it is cached.
    pub fn read(&mut self, lba: u64) -> bool {
        if !self.contains(lba) {
            return false;
        }
        if let Some(i) = self.index(lba) {
            self.unlink(i);
            self.push_mru(i);
        }
        true
    }

    /// The cached blocks from least to most recently used.
    pub fn lru_order(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut at = self.lru;
        while at != NIL && (out.len() as u64) < self.len {
            out.push(u64::from(at));
            at = self.newer.get(at as usize).copied().unwrap_or(NIL);
        }
        out
    }

    /// Takes block `i` (cached) out of the list.
    fn unlink(&mut self, i: usize) {
        let older = self.older.get(i).copied().unwrap_or(NIL);
        let newer = self.newer.get(i).copied().unwrap_or(NIL);
        match self.newer.get_mut(older as usize) {
            Some(n) => *n = newer,
            None => self.lru = newer,
        }
        match self.older.get_mut(newer as usize) {
            Some(o) => *o = older,
            None => self.mru = older,
        }
        if let Some(o) = self.older.get_mut(i) {
            *o = NIL;
        }
        if let Some(n) = self.newer.get_mut(i) {
            *n = NIL;
        }
    }

    /// Puts block `i` (not in the list) at the most recently used end.
    fn push_mru(&mut self, i: usize) {
        let id = i as u32;
        let old_mru = self.mru;
        if let Some(o) = self.older.get_mut(i) {
            *o = old_mru;
        }
        match self.newer.get_mut(old_mru as usize) {
            Some(n) => *n = id,
            None => self.lru = id,
        }
        self.mru = id;
    }
}

/// Client reads counted in 4 KiB blocks: all, and those of blocks on the chain's
/// tail drive when read; each with how many the tail cache served.
#[derive(Debug, Clone, Copy, Default)]
struct ReadCounts {
    blocks: u64,
    hits: u64,
    tail_blocks: u64,
    tail_hits: u64,
}

/// The clients' read path: the tail cache in front of the log, and its counts.
#[derive(Debug, Clone)]
pub struct CachedReads {
    pub cache: TailCache,
    counts: ReadCounts,
}

impl CachedReads {
    pub fn new(capacity_blocks: u64, logical_blocks: u64) -> CachedReads {
        CachedReads {
            cache: TailCache::new(capacity_blocks, logical_blocks),
            counts: ReadCounts::default(),
        }
    }

    /// A client reads `lbas`: the cache serves what it holds; returns the log-address
    /// runs the drives must read for the rest (each block where the map points).
    pub fn read(&mut self, log: &Log, lbas: &[u64]) -> Vec<(u64, u64)> {
        let bps = log.geo.blocks_per_segment();
        let chain = log.geo.kind == LayoutKind::Chain;
        let mut runs = Vec::new();
        for &lba in lbas {
            let Some(b) = log.map.get(lba as usize).copied() else {
                continue;
            };
            if b == NONE {
                continue;
            }
            let on_tail = chain && log.geo.pool_of(b / bps) == log.tail as usize;
            let hit = self.cache.read(lba);
            let c = &mut self.counts;
            c.blocks += 1;
            c.hits += u64::from(hit);
            c.tail_blocks += u64::from(on_tail);
            c.tail_hits += u64::from(on_tail && hit);
            if !hit {
                runs.push((b * BLOCK_BYTES, BLOCK_BYTES));
            }
        }
        runs
    }

    /// A client wrote `lbas`: each becomes the most recently used block.
    pub fn admit(&mut self, lbas: &[u64]) {
        for &lba in lbas {
            self.cache.admit(lba);
        }
    }

    /// The counts, if the cache is on.
    pub fn stats(&self) -> Option<CacheStats> {
        let c = &self.counts;
        let rate = |hits: u64, of: u64| (of > 0).then(|| hits as f64 / of as f64);
        (self.cache.capacity_blocks > 0).then(|| CacheStats {
            size_bytes: self.cache.capacity_blocks * BLOCK_BYTES,
            read_blocks: c.blocks,
            hit_blocks: c.hits,
            tail_read_blocks: c.tail_blocks,
            tail_hit_blocks: c.tail_hits,
            hit_rate: rate(c.hits, c.blocks),
            tail_hit_rate: rate(c.tail_hits, c.tail_blocks),
        })
    }
}
