//! The log's space: fixed-size segments over N drives, where each segment lives, the
//! block map, segment allocation for the heads and GC victim choice.
//!
//! * `stripe`: one log over RAID-0. Log address `a` is in chunk `c = a / chunk`, on
//!   drive `c mod N` at offset `(c / N) · chunk + a mod chunk`; a segment is a whole
//!   number of stripe rows, so every segment (and every GC read of one) touches all
//!   drives. All free segments are one pool.
//! * `chain`: segment `s` is on drive `s / segments_per_drive`. Each drive is a pool;
//!   the tail drive takes all client writes until only its GC reserve is free, then
//!   the next drive in the chain with more than its reserve free becomes the tail.
//!
//! Blocks are 4 KiB. The map says where each logical block is; the inverse map says
//! which logical block a log block holds (as Gecko keeps it), so GC moves exactly
//! the blocks that are still live when it writes them. Victims are chosen here by
//! live fraction (greedy) or cost-benefit (`(1 - u) · age / (1 + u)`), the two orders
//! of `lsvd_core::gc::select_victims`; that function plans over the engine's
//! `StoreState` of immutable objects, while this log reuses fixed slots on particular
//! drives, so the same two formulas are applied to segments here.

use std::collections::BTreeSet;

/// Bytes per block.
pub const BLOCK_BYTES: u64 = 4096;
/// "No block" in the maps.
pub const NONE: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayoutKind {
    Chain,
    Stripe,
}

/// Where chain GC writes what it moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChainGc {
    /// To the drive the victim is on (Gecko's smarter cleaning).
    CompactInBody,
    /// To the log tail, like client writes.
    MoveToTail,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VictimPolicy {
    Greedy,
    CostBenefit,
    /// Oldest first (by when the segment was closed, then by position): the order
    /// Gecko's cleaner walks the log from its head.
    LogOrder,
}

/// The shape of the log.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Geometry {
    pub kind: LayoutKind,
    pub drives: u32,
    pub drive_bytes: u64,
    pub segment_bytes: u64,
    /// Stripe unit (stripe only).
    pub chunk_bytes: u64,
    /// Free segments per pool only GC may use.
    pub reserve_segments: u64,
}

impl Geometry {
    pub fn blocks_per_segment(&self) -> u64 {
        self.segment_bytes / BLOCK_BYTES
    }
    pub fn segments(&self) -> u64 {
        u64::from(self.drives) * self.segments_per_drive()
    }
    pub fn segments_per_drive(&self) -> u64 {
        self.drive_bytes / self.segment_bytes
    }
    pub fn pools(&self) -> usize {
        match self.kind {
            LayoutKind::Chain => self.drives as usize,
            LayoutKind::Stripe => 1,
        }
    }
    /// The pool (chain: drive) of segment `s`.
    pub fn pool_of(&self, s: u64) -> usize {
        match self.kind {
            LayoutKind::Chain => (s / self.segments_per_drive().max(1)) as usize,
            LayoutKind::Stripe => 0,
        }
    }
    /// Where `bytes` at log address `addr` are: (drive, offset, bytes) pieces, one
    /// per drive-contiguous run, in log order.
    pub fn place(&self, addr: u64, bytes: u64) -> Vec<(u32, u64, u64)> {
        let mut out: Vec<(u32, u64, u64)> = Vec::new();
        match self.kind {
            LayoutKind::Chain => {
                let spd = self.segments_per_drive().max(1);
                let seg = addr / self.segment_bytes;
                let drive = (seg / spd) as u32;
                let off = (seg % spd) * self.segment_bytes + addr % self.segment_bytes;
                out.push((drive, off, bytes));
            }
            LayoutKind::Stripe => {
                let (chunk, n) = (self.chunk_bytes.max(1), u64::from(self.drives.max(1)));
                let (mut a, end) = (addr, addr + bytes);
                while a < end {
                    let c = a / chunk;
                    let len = ((c + 1) * chunk).min(end) - a;
                    let drive = (c % n) as u32;
                    let off = (c / n) * chunk + a % chunk;
                    match out.iter_mut().find(|p| p.0 == drive) {
                        Some(p) if p.1 + p.2 == off => p.2 += len,
                        _ => out.push((drive, off, len)),
                    }
                    a += len;
                }
            }
        }
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegState {
    Free,
    Open,
    Closed,
    /// Chosen by GC, being read or moved.
    Cleaning,
}

#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub state: SegState,
    pub written_blocks: u64,
    pub live_blocks: u64,
    pub closed_ns: u64,
}

/// An append point: the open segment and the next block in it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Head {
    pub segment: Option<u64>,
}

/// The log's state.
#[derive(Debug, Clone)]
pub struct Log {
    pub geo: Geometry,
    pub segs: Vec<Segment>,
    free: Vec<BTreeSet<u64>>,
    last_alloc: Vec<Option<u64>>,
    /// Logical block -> log block.
    pub map: Vec<u64>,
    /// Log block -> logical block.
    pub inverse: Vec<u64>,
    /// Chain: the drive taking client writes.
    pub tail: u32,
    /// Head 0 takes client writes (and GC writes unless compact-in-body); head
    /// `1 + d` takes compact-in-body GC writes of drive `d`.
    pub heads: Vec<Head>,
    /// (when, new tail drive) for every tail move.
    pub tail_moves: Vec<(u64, u32)>,
}

impl Log {
    /// An empty log with `logical_blocks` addressable blocks.
    pub fn new(geo: Geometry, logical_blocks: u64) -> Log {
        let n = geo.segments();
        let seg = Segment {
            state: SegState::Free,
            written_blocks: 0,
            live_blocks: 0,
            closed_ns: 0,
        };
        let mut free = vec![BTreeSet::new(); geo.pools()];
        for s in 0..n {
            if let Some(p) = free.get_mut(geo.pool_of(s)) {
                p.insert(s);
            }
        }
        Log {
            segs: vec![seg; n as usize],
            last_alloc: vec![None; geo.pools()],
            free,
            map: vec![NONE; logical_blocks as usize],
            inverse: vec![NONE; (n * geo.blocks_per_segment()) as usize],
            tail: 0,
            heads: vec![Head::default(); 1 + geo.drives as usize],
            tail_moves: Vec::new(),
            geo,
        }
    }

    pub fn free_segments(&self) -> u64 {
        self.free.iter().map(|p| p.len() as u64).sum()
    }

    pub fn free_fraction(&self) -> f64 {
        self.free_segments() as f64 / self.geo.segments().max(1) as f64
    }

    /// Takes a free segment of `pool`: the next one after the last taken (so a fresh
    /// pool is written front to back), else the lowest.
    fn take(&mut self, pool: usize, now_ns: u64) -> Option<u64> {
        let set = self.free.get_mut(pool)?;
        let after = self.last_alloc.get(pool).copied().flatten();
        let s = after
            .and_then(|a| set.range(a + 1..).next().copied())
            .or_else(|| set.iter().next().copied())?;
        set.remove(&s);
        if let Some(l) = self.last_alloc.get_mut(pool) {
            *l = Some(s);
        }
        let _ = now_ns;
        let seg = self.segs.get_mut(s as usize)?;
        seg.state = SegState::Open;
        seg.written_blocks = 0;
        seg.live_blocks = 0;
        Some(s)
    }

    /// A new segment for head 0. Clients leave each pool's reserve alone; GC may use
    /// it. In a chain the tail moves on when its drive has nothing left to give.
    fn alloc_main(&mut self, gc: bool, now_ns: u64) -> Option<u64> {
        let keep = if gc { 0 } else { self.geo.reserve_segments };
        match self.geo.kind {
            LayoutKind::Stripe => {
                if self.free.first()?.len() as u64 > keep {
                    self.take(0, now_ns)
                } else {
                    None
                }
            }
            LayoutKind::Chain => {
                let n = self.geo.drives;
                for k in 0..n {
                    let d = (self.tail + k) % n;
                    if self.free.get(d as usize)?.len() as u64 > keep {
                        if k > 0 {
                            self.tail = d;
                            self.tail_moves.push((now_ns, d));
                        }
                        return self.take(d as usize, now_ns);
                    }
                }
                None
            }
        }
    }

    fn alloc(&mut self, head: usize, gc: bool, now_ns: u64) -> Option<u64> {
        if head == 0 {
            self.alloc_main(gc, now_ns)
        } else {
            self.take(head - 1, now_ns)
        }
    }

    fn room(&self, head: usize) -> u64 {
        let bps = self.geo.blocks_per_segment();
        self.heads
            .get(head)
            .and_then(|h| h.segment)
            .and_then(|s| self.segs.get(s as usize))
            .map_or(0, |s| bps - s.written_blocks)
    }

    /// Could `blocks` (at most one segment) be appended at `head` now?
    pub fn can_append(&self, head: usize, blocks: u64, gc: bool) -> bool {
        if self.room(head) >= blocks {
            return true;
        }
        let keep = if gc { 0 } else { self.geo.reserve_segments };
        match (head, self.geo.kind) {
            (0, LayoutKind::Stripe) => self.free.first().is_some_and(|p| p.len() as u64 > keep),
            (0, LayoutKind::Chain) => self.free.iter().any(|p| p.len() as u64 > keep),
            (h, _) => self.free.get(h - 1).is_some_and(|p| !p.is_empty()),
        }
    }

    fn close(&mut self, s: u64, now_ns: u64) {
        if let Some(seg) = self.segs.get_mut(s as usize) {
            seg.state = SegState::Closed;
            seg.closed_ns = now_ns;
        }
    }

    /// Appends the logical blocks `lbas` at `head` (check [`Log::can_append`] first)
    /// and updates both maps. Returns the log-address runs written, or `None` (with
    /// nothing changed past what was appended) when space ran out.
    pub fn append(
        &mut self,
        head: usize,
        lbas: &[u64],
        gc: bool,
        now_ns: u64,
    ) -> Option<Vec<(u64, u64)>> {
        let bps = self.geo.blocks_per_segment();
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &lba in lbas {
            if self.room(head) == 0 {
                if let Some(old) = self.heads.get(head)?.segment {
                    self.close(old, now_ns);
                }
                let s = self.alloc(head, gc, now_ns)?;
                self.heads.get_mut(head)?.segment = Some(s);
            }
            let s = self.heads.get(head)?.segment?;
            let seg = self.segs.get_mut(s as usize)?;
            let block = s * bps + seg.written_blocks;
            seg.written_blocks += 1;
            seg.live_blocks += 1;
            if seg.written_blocks == bps {
                self.close(s, now_ns);
                self.heads.get_mut(head)?.segment = None;
                // Keep `segment` None so the next append allocates.
            }
            self.point(lba, block);
            let addr = block * BLOCK_BYTES;
            match runs.last_mut() {
                Some(r) if r.0 + r.1 == addr => r.1 += BLOCK_BYTES,
                _ => runs.push((addr, BLOCK_BYTES)),
            }
        }
        Some(runs)
    }

    /// Points logical block `lba` at log block `block`, killing its old copy.
    fn point(&mut self, lba: u64, block: u64) {
        let bps = self.geo.blocks_per_segment();
        let Some(slot) = self.map.get_mut(lba as usize) else {
            return;
        };
        let old = std::mem::replace(slot, block);
        if old != NONE {
            if let Some(i) = self.inverse.get_mut(old as usize) {
                *i = NONE;
            }
            if let Some(seg) = self.segs.get_mut((old / bps) as usize) {
                seg.live_blocks = seg.live_blocks.saturating_sub(1);
            }
        }
        if let Some(i) = self.inverse.get_mut(block as usize) {
            *i = lba;
        }
    }

    /// The logical blocks still live in segment `s`, in log order.
    pub fn live_in(&self, s: u64) -> Vec<u64> {
        let bps = self.geo.blocks_per_segment();
        let first = (s * bps) as usize;
        self.inverse
            .get(first..first + bps as usize)
            .unwrap_or_default()
            .iter()
            .copied()
            .filter(|&l| l != NONE)
            .collect()
    }

    pub fn set_state(&mut self, s: u64, state: SegState) {
        if let Some(seg) = self.segs.get_mut(s as usize) {
            seg.state = state;
        }
    }

    /// Returns an emptied segment to its pool.
    pub fn release(&mut self, s: u64) {
        let pool = self.geo.pool_of(s);
        if let Some(seg) = self.segs.get_mut(s as usize) {
            seg.state = SegState::Free;
            seg.written_blocks = 0;
            seg.live_blocks = 0;
        }
        if let Some(p) = self.free.get_mut(pool) {
            p.insert(s);
        }
    }

    /// The next victim: a closed segment with dead blocks (chain: not on the tail
    /// drive), by `policy`.
    pub fn victim(&self, policy: VictimPolicy, now_ns: u64) -> Option<u64> {
        let bps = self.geo.blocks_per_segment() as f64;
        let mut best: Option<(f64, u64)> = None;
        for (i, seg) in self.segs.iter().enumerate() {
            let s = i as u64;
            if seg.state != SegState::Closed || seg.live_blocks >= self.geo.blocks_per_segment() {
                continue;
            }
            if self.geo.kind == LayoutKind::Chain && self.geo.pool_of(s) == self.tail as usize {
                continue;
            }
            let u = seg.live_blocks as f64 / bps;
            let key = match policy {
                VictimPolicy::Greedy => u,
                VictimPolicy::CostBenefit => {
                    let age = now_ns.saturating_sub(seg.closed_ns).max(1) as f64;
                    -((1.0 - u) * age / (1.0 + u))
                }
                VictimPolicy::LogOrder => seg.closed_ns as f64,
            };
            if best.is_none_or(|(k, _)| key < k) {
                best = Some((key, s));
            }
        }
        best.map(|(_, s)| s)
    }
}
