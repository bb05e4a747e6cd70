//! The volume as the object store defines it: which object holds each LBA, and how
//! many live bytes each object still has.
//!
//! Objects are applied strictly in sequence order, exactly as recovery replays them, so
//! the live engine and recovery compute the same map. Relocated extents (GC output)
//! apply only where the map still points at their source, which is what keeps a GC
//! copy from overwriting newer data. Live-byte accounting is exact at every step and is
//! what GC planning reads.

use std::collections::BTreeMap;

use crate::extent_map::{ExtentMap, Location, Piece};
use crate::format::SECTOR_BYTES;
use crate::format::checkpoint::{Checkpoint, CheckpointExtent, CheckpointObject, Counters};
use crate::format::object::{ObjectHeader, ObjectKind};

/// A byte position inside an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjLoc {
    pub object_seq: u64,
    pub offset: u64,
}

impl ObjLoc {
    pub fn advance_sectors(&self, sectors: u64) -> Self {
        self.advance(sectors)
    }
}

impl Location for ObjLoc {
    fn advance(&self, sectors: u64) -> Self {
        ObjLoc {
            object_seq: self.object_seq,
            offset: self.offset + sectors * SECTOR_BYTES,
        }
    }

    /// (object sequence number, byte offset): the store map keeps both as `u32`
    /// where they fit (sequence numbers as offsets from a per-chunk base).
    fn to_parts(&self) -> Option<(u64, u64)> {
        Some((self.object_seq, self.offset))
    }

    fn from_parts(object_seq: u64, offset: u64) -> Option<Self> {
        Some(ObjLoc { object_seq, offset })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectInfo {
    pub kind: ObjectKind,
    /// The claim it was written under: with its sequence number and kind, its name.
    pub epoch: u64,
    pub header_bytes: u32,
    /// The header and the uncompressed data section ([`ObjectHeader::span_bytes`]):
    /// its size in the store unless its chunks are compressed.
    pub total_bytes: u64,
    pub live_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyError {
    OutOfOrder {
        expected: u64,
        got: u64,
    },
    BeyondVolume {
        object_seq: u64,
        lba: u64,
    },
    /// A shrinking object that does not trim everything it cuts off.
    ShrinkWithoutTrim {
        object_seq: u64,
        size_bytes: u64,
    },
}

impl std::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApplyError::OutOfOrder { expected, got } => {
                write!(
                    f,
                    "object {got:016x} applied out of order (expected {expected:016x})"
                )
            }
            ApplyError::BeyondVolume { object_seq, lba } => {
                write!(
                    f,
                    "object {object_seq:016x} maps lba {lba} beyond the end of the volume"
                )
            }
            ApplyError::ShrinkWithoutTrim {
                object_seq,
                size_bytes,
            } => {
                write!(
                    f,
                    "object {object_seq:016x} shrinks the volume to {size_bytes} bytes \
                     without trimming what it cuts off"
                )
            }
        }
    }
}

impl std::error::Error for ApplyError {}

#[derive(Debug, Clone)]
pub struct StoreState {
    pub volume_size_bytes: u64,
    map: ExtentMap<ObjLoc>,
    objects: BTreeMap<u64, ObjectInfo>,
    /// Checkpoints known to be in the store: sequence number -> epoch.
    checkpoints: BTreeMap<u64, u64>,
    /// Sequence number the next applied object must have.
    next_object_seq: u64,
    /// Newest write-log record whose data the applied objects contain.
    last_record_seq: u64,
    /// The first applied part of a split batch whose last part is not applied yet
    /// (see [`StoreState::whole_next_object_seq`]).
    open_batch_from: Option<u64>,
    /// The object being applied step by step, if any.
    applying: Option<Applying>,
    /// Sum of `live_bytes` over `objects`, kept as the map changes: GC checks
    /// utilization after every object, and summing thousands of objects each time
    /// dominated long simulations.
    live_total_bytes: u64,
    /// Sum of `total_bytes` over `objects`.
    stored_total_bytes: u64,
    /// Objects numbered below this belong to another volume: a clone's ancestors own
    /// every object below the clone's start and keep it for their snapshot. GC neither
    /// collects them nor counts them (see [`set_shared_below`](Self::set_shared_below)).
    /// 0 for a volume that is not a clone.
    shared_below_seq: u64,
}

/// Progress through an object being applied.
#[derive(Debug, Clone)]
struct Applying {
    header: ObjectHeader,
    /// Index of the next trim, and the first sector of it not yet applied.
    next_trim: usize,
    next_trim_lba: u64,
    /// Index of the next extent, and the byte offset of its data in the object.
    next_extent: usize,
    next_offset: u64,
    /// The object's extents as sorted, merged `(start, end)` sector ranges, when it
    /// also has trims: a trim slice reports only what no extent of the object covers
    /// (see [`StoreState::apply_step`]).
    extent_cover: Vec<(u64, u64)>,
}

/// Trims are applied at most this many sectors (2 MiB: at most 512 map entries of
/// 4 KiB) per step.
const TRIM_SLICE_SECTORS: u64 = 4096;

impl StoreState {
    /// An empty volume whose first object will be sequence number 1.
    pub fn new(volume_size_bytes: u64) -> Self {
        StoreState {
            volume_size_bytes,
            map: ExtentMap::new(),
            objects: BTreeMap::new(),
            checkpoints: BTreeMap::new(),
            next_object_seq: 1,
            last_record_seq: 0,
            open_batch_from: None,
            applying: None,
            live_total_bytes: 0,
            stored_total_bytes: 0,
            shared_below_seq: 0,
        }
    }

    /// The objects numbered below `seq` are another volume's (a clone's ancestors', up
    /// to where the clone starts): this volume reads them but never collects them, so
    /// GC planning ([`crate::gc`]) leaves them out of its victims and weighs only this
    /// volume's own objects ([`owned_live_bytes`](Self::owned_live_bytes),
    /// [`owned_stored_bytes`](Self::owned_stored_bytes)). Copying their live data into
    /// the clone's own objects would free nothing (the ancestor's snapshot keeps them)
    /// and store that data once per clone. Not persisted: the engine sets it from the
    /// clone's lineage at every open.
    pub fn set_shared_below(&mut self, seq: u64) {
        self.shared_below_seq = seq;
    }

    /// Objects below this are another volume's ([`set_shared_below`](Self::set_shared_below)).
    pub fn shared_below(&self) -> u64 {
        self.shared_below_seq
    }

    /// Is object `seq` another volume's (below [`shared_below`](Self::shared_below))?
    pub fn is_shared(&self, seq: u64) -> bool {
        seq < self.shared_below_seq
    }

    /// Objects this volume owns (all of them unless it is a clone), by sequence number.
    pub fn owned_objects(&self) -> impl Iterator<Item = (&u64, &ObjectInfo)> {
        self.objects.range(self.shared_below_seq..)
    }

    /// Live bytes in the objects this volume owns: what GC can move.
    pub fn owned_live_bytes(&self) -> u64 {
        self.live_bytes() - self.shared_sum(|o| o.live_bytes)
    }

    /// [`stored_bytes`](Self::stored_bytes) of the objects this volume owns: what its
    /// GC can free.
    pub fn owned_stored_bytes(&self) -> u64 {
        self.stored_bytes() - self.shared_sum(|o| o.total_bytes)
    }

    /// `bytes` summed over the objects another volume owns (none but in a clone).
    fn shared_sum(&self, bytes: impl Fn(&ObjectInfo) -> u64) -> u64 {
        let shared = self.objects.range(..self.shared_below_seq);
        shared.map(|(_, o)| bytes(o)).sum()
    }

    pub fn map(&self) -> &ExtentMap<ObjLoc> {
        &self.map
    }
    pub fn objects(&self) -> &BTreeMap<u64, ObjectInfo> {
        &self.objects
    }
    /// Checkpoints known to be in the store, sequence number -> epoch.
    pub fn checkpoints(&self) -> &BTreeMap<u64, u64> {
        &self.checkpoints
    }
    pub fn next_object_seq(&self) -> u64 {
        self.next_object_seq
    }
    pub fn last_record_seq(&self) -> u64 {
        self.last_record_seq
    }

    /// The first object recovery from the store would not apply if nothing more
    /// landed: `next_object_seq`, or the first part of a split batch whose last part
    /// is not applied yet (recovery takes a batch's parts all or none). The most a
    /// volume superblock may vouch for (`durable_through`).
    pub fn whole_next_object_seq(&self) -> u64 {
        self.open_batch_from.unwrap_or(self.next_object_seq)
    }
    fn volume_sectors(&self) -> u64 {
        self.volume_size_bytes / SECTOR_BYTES
    }

    /// Apply the next object in sequence, all at once (recovery, the simulator).
    pub fn apply(&mut self, h: &ObjectHeader) -> Result<(), ApplyError> {
        self.begin_apply(h.clone())?;
        while self.apply_step(usize::MAX, |_, _, _| {}).is_none() {}
        Ok(())
    }

    /// Start applying the next object in sequence; [`apply_step`](Self::apply_step)
    /// does the work a bounded piece at a time, so the live engine can let client I/O
    /// take its lock between pieces (one object of 2,048 scattered extents takes
    /// milliseconds). Until the last step the object is *in progress*: the map is
    /// valid at every step (each extent moves atomically and both old and new
    /// locations stay readable), but `next_object_seq` and `last_record_seq` do not
    /// advance, so no checkpoint can describe a half-applied object, and the object is
    /// neither dead nor a GC victim.
    pub fn begin_apply(&mut self, h: ObjectHeader) -> Result<(), ApplyError> {
        if self.applying.is_some() || h.seq != self.next_object_seq {
            return Err(ApplyError::OutOfOrder {
                expected: self.next_object_seq,
                got: h.seq,
            });
        }
        let old_limit = self.volume_sectors();
        let limit = h
            .volume_size_bytes
            .map_or(old_limit, |size| size / SECTOR_BYTES);
        if limit < old_limit && !covers(&h.trims, limit, old_limit) {
            return Err(ApplyError::ShrinkWithoutTrim {
                object_seq: h.seq,
                size_bytes: limit * SECTOR_BYTES,
            });
        }
        for (e, _) in h.extent_offsets() {
            // A GC extent applies only where the map still holds its source, and the
            // map holds nothing past the end: one planned before a shrink is harmless.
            if e.source.is_none() && e.lba.saturating_add(e.sectors as u64) > limit {
                return Err(ApplyError::BeyondVolume {
                    object_seq: h.seq,
                    lba: e.lba,
                });
            }
        }
        // A shrinking object's trims reach the old end.
        for &(lba, sectors) in &h.trims {
            if lba.saturating_add(sectors) > limit.max(old_limit) {
                return Err(ApplyError::BeyondVolume {
                    object_seq: h.seq,
                    lba,
                });
            }
        }
        if h.kind != ObjectKind::Checkpoint {
            let replaced = self.objects.insert(
                h.seq,
                ObjectInfo {
                    kind: h.kind,
                    epoch: h.epoch,
                    header_bytes: h.header_bytes,
                    total_bytes: h.span_bytes(),
                    live_bytes: 0,
                },
            );
            debug_assert!(replaced.is_none(), "sequence numbers only grow");
            self.stored_total_bytes += h.span_bytes();
        }
        let extent_cover = if h.trims.is_empty() {
            Vec::new()
        } else {
            merged_ranges(h.extents.iter().map(|e| (e.lba, e.lba + e.sectors as u64)))
        };
        // The new size holds from this object on: its trims remove what a shrink cuts
        // off in its first steps, and nothing maps past the new end meanwhile that a
        // read could reach (the driver keeps client I/O inside the smaller size).
        self.volume_size_bytes = limit * SECTOR_BYTES;
        self.applying = Some(Applying {
            next_trim: 0,
            next_trim_lba: h.trims.first().map_or(0, |t| t.0),
            next_extent: 0,
            next_offset: h.header_bytes as u64,
            extent_cover,
            header: h,
        });
        Ok(())
    }

    /// Sequence number of the object being applied, if one is in progress.
    pub fn applying_seq(&self) -> Option<u64> {
        self.applying.as_ref().map(|a| a.header.seq)
    }

    /// Apply more of the object in progress: at least one extent or trim slice, and
    /// stop once about `max_pieces` map entries were inserted or displaced.
    /// `applied(lba, sectors, last_record_seq)` is told each range applied (the live
    /// engine releases its write-log overlay there, for every record up to the
    /// object's last): a range is told only once the store map holds its final
    /// version, so a trim slice leaves out what an extent of the same object covers
    /// (that extent reports it when it is applied; between the two steps, a read of it
    /// must still find the newer write in the log, not the trim). Returns the object's header once
    /// it is fully applied; `None` while there is more to do (or nothing in progress).
    pub fn apply_step(
        &mut self,
        max_pieces: usize,
        mut applied: impl FnMut(u64, u64, u64),
    ) -> Option<ObjectHeader> {
        let mut a = self.applying.take()?;
        let h = &a.header;
        let objects = &mut self.objects;
        // Work done in this step: extents and trim slices applied, map entries displaced.
        let work = std::cell::Cell::new(0usize);
        let lost = std::cell::Cell::new(0u64);
        // Bytes of this object displaced by its own later extents (a header whose
        // extents overlap: never one lsvd writes, but a header is input): counted
        // against what this step gains, since its live bytes are added at the end.
        let lost_to_itself = std::cell::Cell::new(0u64);
        let mut drop_live = |p: Piece<ObjLoc>| {
            work.set(work.get() + 1);
            if p.location.object_seq == h.seq {
                lost_to_itself.set(lost_to_itself.get() + p.sectors * SECTOR_BYTES);
            } else if let Some(o) = objects.get_mut(&p.location.object_seq) {
                o.live_bytes -= p.sectors * SECTOR_BYTES;
                lost.set(lost.get() + p.sectors * SECTOR_BYTES);
            }
        };
        let mut gained = 0u64;
        // Trims first (an object's trims precede its extents), in slices so that one
        // large discard over a fragmented volume is not one long step.
        while a.next_trim < h.trims.len() {
            let (lba, sectors) = h.trims[a.next_trim];
            let end = lba + sectors;
            let n = TRIM_SLICE_SECTORS.min(end - a.next_trim_lba);
            self.map.remove(a.next_trim_lba, n, &mut drop_live);
            for_each_gap(&a.extent_cover, a.next_trim_lba, n, |lba, sectors| {
                applied(lba, sectors, h.last_record_seq)
            });
            a.next_trim_lba += n;
            if a.next_trim_lba >= end {
                a.next_trim += 1;
                a.next_trim_lba = h.trims.get(a.next_trim).map_or(0, |t| t.0);
            }
            work.set(work.get() + 1);
            let more = a.next_trim < h.trims.len() || a.next_extent < h.extents.len();
            if more && work.get() >= max_pieces {
                self.live_total_bytes -= lost.get();
                self.applying = Some(a);
                return None;
            }
        }
        while a.next_extent < h.extents.len() {
            let e = h.extents[a.next_extent];
            let new = ObjLoc {
                object_seq: h.seq,
                offset: a.next_offset,
            };
            let sectors = e.sectors as u64;
            match e.source {
                None => {
                    self.map.insert(e.lba, sectors, new, &mut drop_live);
                    gained += sectors * SECTOR_BYTES;
                }
                Some(src) => {
                    let expected = ObjLoc {
                        object_seq: src.object_seq,
                        offset: src.object_offset,
                    };
                    let moved =
                        self.map
                            .replace_if_at(e.lba, sectors, expected, new, &mut drop_live);
                    gained += moved * SECTOR_BYTES;
                }
            }
            applied(e.lba, sectors, h.last_record_seq);
            a.next_extent += 1;
            a.next_offset += sectors * SECTOR_BYTES;
            work.set(work.get() + 1);
            if work.get() >= max_pieces {
                break;
            }
        }
        self.live_total_bytes -= lost.get();
        // An extent displaces at most what it covers, so this step's own losses are
        // within what it gained.
        let gained = gained.saturating_sub(lost_to_itself.get());
        if let Some(o) = self.objects.get_mut(&h.seq) {
            o.live_bytes += gained;
            self.live_total_bytes += gained;
        }
        if a.next_extent < h.extents.len() {
            self.applying = Some(a);
            return None;
        }
        self.next_object_seq = h.seq + 1;
        // A part of a split batch with parts after it does not carry the batch's
        // records on its own (recovery drops a batch not all of whose parts landed).
        if h.parts_after == 0 {
            self.last_record_seq = self.last_record_seq.max(h.last_record_seq);
            self.open_batch_from = None;
        } else {
            self.open_batch_from.get_or_insert(h.seq);
        }
        if h.kind == ObjectKind::Checkpoint {
            self.checkpoints.insert(h.seq, h.epoch);
        }
        Some(a.header)
    }

    /// Pass over checkpoint `seq` without applying it: recovery fell back past it
    /// (unreadable or missing). A checkpoint changes nothing in the map, so the state
    /// is what applying it would give, except that it is not listed as a checkpoint
    /// (it cannot be a base).
    pub fn skip_checkpoint(&mut self, seq: u64) -> Result<(), ApplyError> {
        if self.applying.is_some() || seq != self.next_object_seq {
            return Err(ApplyError::OutOfOrder {
                expected: self.next_object_seq,
                got: seq,
            });
        }
        self.next_object_seq = seq + 1;
        Ok(())
    }

    /// Number the next object `seq` instead of `next_object_seq()` (which `seq` must
    /// not be below): the numbers in between belong to no object of this history.
    /// Recovery steps over them where the history says a claim started numbering
    /// further on; a claim starts past every number any object in the store has, so
    /// that no number is ever used twice.
    pub fn skip_to(&mut self, seq: u64) -> Result<(), ApplyError> {
        if self.applying.is_some() || seq < self.next_object_seq {
            return Err(ApplyError::OutOfOrder {
                expected: self.next_object_seq,
                got: seq,
            });
        }
        if self.open_batch_from.is_some() && seq != self.next_object_seq {
            // The rest of a split batch cannot be skipped.
            return Err(ApplyError::OutOfOrder {
                expected: self.next_object_seq,
                got: seq,
            });
        }
        self.next_object_seq = seq;
        Ok(())
    }

    /// Record that an older checkpoint object exists (found by listing), so that it is
    /// known and can be deleted once newer checkpoints exist.
    pub fn note_checkpoint(&mut self, seq: u64, epoch: u64) {
        if seq < self.next_object_seq {
            self.checkpoints.insert(seq, epoch);
        }
    }

    /// Forget an object that holds no live data (after GC deleted it).
    pub fn forget_object(&mut self, seq: u64) {
        if self.applying_seq() != Some(seq)
            && self.objects.get(&seq).is_some_and(|o| o.live_bytes == 0)
            && let Some(o) = self.objects.remove(&seq)
        {
            self.stored_total_bytes -= o.total_bytes;
        }
        self.checkpoints.remove(&seq);
    }

    /// Live bytes over all objects.
    pub fn live_bytes(&self) -> u64 {
        debug_assert_eq!(
            self.live_total_bytes,
            self.objects.values().map(|o| o.live_bytes).sum::<u64>()
        );
        self.live_total_bytes
    }

    /// Bytes of data and GC objects in the store (checkpoints not included), counted
    /// uncompressed ([`ObjectInfo::total_bytes`]): what GC weighs live bytes against.
    pub fn stored_bytes(&self) -> u64 {
        debug_assert_eq!(
            self.stored_total_bytes,
            self.objects.values().map(|o| o.total_bytes).sum::<u64>()
        );
        self.stored_total_bytes
    }

    /// Objects holding no live data: garbage, deletable once a checkpoint that omits
    /// them is durable.
    pub fn dead_objects(&self) -> Vec<u64> {
        self.objects
            .iter()
            .filter(|&(&s, o)| o.live_bytes == 0 && self.applying_seq() != Some(s))
            .map(|(&s, _)| s)
            .collect()
    }

    /// The checkpoint describing this state; it will carry sequence number
    /// `next_object_seq()`. Objects without live data are left out (see
    /// [`dead_objects`](Self::dead_objects)): nothing the checkpoint describes needs them.
    pub fn to_checkpoint(&self, clean: bool, counters: Counters) -> Checkpoint {
        let mut c = self.to_checkpoint_head(clean, counters);
        self.checkpoint_extents(0, usize::MAX, &mut c.extents);
        c
    }

    /// [`to_checkpoint`](Self::to_checkpoint) without the map's extents, which
    /// [`checkpoint_extents`](Self::checkpoint_extents) then copies a slice at a time:
    /// the live engine copies 200,000 extents in slices so a client write never waits
    /// milliseconds for its lock. The state must not change in between (the engine
    /// applies nothing while its next checkpoint is being taken).
    pub fn to_checkpoint_head(&self, clean: bool, counters: Counters) -> Checkpoint {
        debug_assert!(
            self.applying.is_none(),
            "checkpoint of a half-applied object"
        );
        Checkpoint {
            clean,
            counters,
            volume_size_bytes: self.volume_size_bytes,
            next_object_seq: self.next_object_seq,
            last_record_seq: self.last_record_seq,
            objects: self
                .objects
                .iter()
                .filter(|(_, o)| o.live_bytes > 0)
                .map(|(&seq, o)| CheckpointObject {
                    seq,
                    kind: match o.kind {
                        ObjectKind::Gc => 2,
                        _ => 1,
                    },
                    header_bytes: o.header_bytes,
                    total_bytes: o.total_bytes,
                    live_bytes: o.live_bytes,
                    epoch: o.epoch,
                })
                .collect(),
            // Sized up front: growing a vector of 200,000 extents by doubling copies
            // it about 18 times.
            extents: Vec::with_capacity(self.map.extent_count()),
            // The write-frequency tracker is not part of the store state: the
            // engine and the simulator add it (`HeatTracker::to_checkpoint`).
            heat: None,
        }
    }

    /// Append to `out` up to `max` extents of the map, the first one starting at or
    /// after `from_lba`. Returns where the next slice starts, or None once the whole
    /// map has been copied.
    pub fn checkpoint_extents(
        &self,
        from_lba: u64,
        max: usize,
        out: &mut Vec<CheckpointExtent>,
    ) -> Option<u64> {
        let mut pieces = self.map.iter_from(from_lba);
        for p in pieces.by_ref().take(max) {
            out.push(CheckpointExtent {
                lba: p.lba,
                sectors: p.sectors,
                object_seq: p.location.object_seq,
                object_offset: p.location.offset,
            });
        }
        pieces.next().map(|p| p.lba)
    }

    /// Rebuild from checkpoint object `checkpoint_seq` (written under `epoch`).
    /// Validates that every extent points at a listed object and that live bytes
    /// agree with the map.
    pub fn from_checkpoint(
        checkpoint_seq: u64,
        epoch: u64,
        c: &Checkpoint,
    ) -> Result<Self, String> {
        if c.next_object_seq != checkpoint_seq {
            return Err(format!(
                "checkpoint {checkpoint_seq:016x} says it is {:016x}",
                c.next_object_seq
            ));
        }
        let mut s = StoreState::new(c.volume_size_bytes);
        s.next_object_seq = checkpoint_seq + 1;
        s.last_record_seq = c.last_record_seq;
        s.checkpoints.insert(checkpoint_seq, epoch);
        for o in &c.objects {
            let kind = if o.kind == 2 {
                ObjectKind::Gc
            } else {
                ObjectKind::Data
            };
            s.objects.insert(
                o.seq,
                ObjectInfo {
                    kind,
                    epoch: o.epoch,
                    header_bytes: o.header_bytes,
                    total_bytes: o.total_bytes,
                    live_bytes: 0,
                },
            );
        }
        let limit = s.volume_sectors();
        for e in &c.extents {
            let Some(o) = s.objects.get_mut(&e.object_seq) else {
                return Err(format!(
                    "checkpoint maps lba {} to unknown object {:016x}",
                    e.lba, e.object_seq
                ));
            };
            if e.lba.saturating_add(e.sectors) > limit {
                return Err(format!("checkpoint maps lba {} beyond the volume", e.lba));
            }
            o.live_bytes += e.sectors * SECTOR_BYTES;
        }
        s.live_total_bytes = s.objects.values().map(|o| o.live_bytes).sum();
        s.stored_total_bytes = s.objects.values().map(|o| o.total_bytes).sum();
        s.map = ExtentMap::from_sorted(c.extents.iter().map(|e| Piece {
            lba: e.lba,
            sectors: e.sectors,
            location: ObjLoc {
                object_seq: e.object_seq,
                offset: e.object_offset,
            },
        }))
        .map_err(|p| {
            format!(
                "checkpoint extents out of order or overlapping at lba {}",
                p.lba
            )
        })?;
        for o in &c.objects {
            let live = s.objects.get(&o.seq).map(|x| x.live_bytes).unwrap_or(0);
            if live != o.live_bytes {
                return Err(format!(
                    "checkpoint live bytes for object {:016x}: recorded {}, map says {live}",
                    o.seq, o.live_bytes
                ));
            }
        }
        Ok(s)
    }
}

/// Do `trims` (`(lba, sectors)`) cover every sector of `[start, end)`?
fn covers(trims: &[(u64, u64)], start: u64, end: u64) -> bool {
    let cover = merged_ranges(trims.iter().map(|&(l, n)| (l, l.saturating_add(n))));
    let mut gap = false;
    for_each_gap(&cover, start, end - start, |_, _| gap = true);
    !gap
}

/// Sorted, merged `(start, end)` ranges from ranges in any order.
fn merged_ranges(ranges: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = ranges.filter(|r| r.0 < r.1).collect();
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (start, end) in v {
        match out.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

/// Call `f(lba, sectors)` for each part of `[lba, lba + sectors)` that no range of
/// `cover` (sorted, merged) overlaps.
fn for_each_gap(cover: &[(u64, u64)], lba: u64, sectors: u64, mut f: impl FnMut(u64, u64)) {
    let end = lba + sectors;
    let mut at = lba;
    // The first range that ends after `lba`.
    let first = cover.partition_point(|r| r.1 <= lba);
    for &(start, stop) in &cover[first..] {
        if start >= end {
            break;
        }
        if start > at {
            f(at, start - at);
        }
        at = at.max(stop);
        if at >= end {
            return;
        }
    }
    if at < end {
        f(at, end - at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::VolumeId;
    use crate::format::object::{
        ExtentSource, ObjectExtent, ObjectSpec, decode_object_header, encode_object,
    };

    /// A decoded object header (data all zeros); `last_record_seq` is `seq * 10`.
    pub(super) fn object(
        kind: ObjectKind,
        seq: u64,
        extents: &[ObjectExtent],
        trims: &[(u64, u64)],
    ) -> ObjectHeader {
        let bytes: u64 = extents.iter().map(|e| e.sectors as u64 * 512).sum();
        let data = vec![0u8; bytes as usize];
        let spec = ObjectSpec {
            kind,
            volume: VolumeId([0; 16]),
            seq,
            last_record_seq: seq * 10,
            extents,
            trims,
            volume_size_bytes: None,
            parts_after: 0,
            epoch: 0,
            first_record_seq: (seq * 10).saturating_sub(9),
        };
        decode_object_header(&encode_object(&spec, &data)).expect("valid")
    }

    pub(super) fn ext(lba: u64, sectors: u32) -> ObjectExtent {
        ObjectExtent {
            lba,
            sectors,
            source: None,
        }
    }

    /// The parts of a split batch: the first ones neither advance `last_record_seq`
    /// nor what a superblock may vouch for (`whole_next_object_seq`); the last one
    /// does both. (A superblock written between two parts once vouched for the first,
    /// which recovery then cut: the crash oracle refused to open the volume.)
    #[test]
    fn a_split_batch_counts_as_applied_only_with_its_last_part() {
        let mut s = StoreState::new(1 << 20);
        s.apply(&object(ObjectKind::Data, 1, &[ext(0, 8)], &[]))
            .expect("apply");
        assert_eq!((s.whole_next_object_seq(), s.last_record_seq()), (2, 10));
        for (seq, parts_after) in [(2, 2), (3, 1)] {
            let mut h = object(ObjectKind::Data, seq, &[ext(seq * 8, 8)], &[]);
            h.parts_after = parts_after;
            s.apply(&h).expect("apply");
            assert_eq!(s.next_object_seq(), seq + 1);
            assert_eq!((s.whole_next_object_seq(), s.last_record_seq()), (2, 10));
        }
        s.apply(&object(ObjectKind::Data, 4, &[ext(32, 8)], &[]))
            .expect("apply");
        assert_eq!((s.whole_next_object_seq(), s.last_record_seq()), (5, 40));
    }

    #[test]
    fn live_bytes_follow_overwrites_and_trims() {
        let mut s = StoreState::new(1 << 20);
        s.apply(&object(ObjectKind::Data, 1, &[ext(0, 16)], &[]))
            .expect("apply");
        s.apply(&object(ObjectKind::Data, 2, &[ext(8, 16)], &[]))
            .expect("apply");
        assert_eq!(s.objects()[&1].live_bytes, 8 * 512);
        assert_eq!(s.objects()[&2].live_bytes, 16 * 512);
        s.apply(&object(ObjectKind::Data, 3, &[], &[(0, 12)]))
            .expect("apply");
        assert_eq!(s.objects()[&1].live_bytes, 0);
        assert_eq!(s.objects()[&2].live_bytes, 12 * 512);
        assert_eq!(s.live_bytes(), s.map().mapped_sectors() * 512);
        assert_eq!(s.last_record_seq(), 30);
        let err = s
            .apply(&object(ObjectKind::Data, 9, &[], &[]))
            .expect_err("gap");
        assert_eq!(
            err,
            ApplyError::OutOfOrder {
                expected: 4,
                got: 9
            }
        );
    }

    #[test]
    fn relocation_applies_only_where_source_still_mapped() {
        let mut s = StoreState::new(1 << 20);
        let h1 = object(ObjectKind::Data, 1, &[ext(0, 16)], &[]);
        let base = h1.header_bytes as u64;
        s.apply(&h1).expect("apply");
        // A client overwrite of sectors 4..8 lands in object 2 after GC read object 1.
        s.apply(&object(ObjectKind::Data, 2, &[ext(4, 4)], &[]))
            .expect("apply");
        let gc = ObjectExtent {
            lba: 0,
            sectors: 16,
            source: Some(ExtentSource {
                object_seq: 1,
                object_offset: base,
            }),
        };
        s.apply(&object(ObjectKind::Gc, 3, &[gc], &[]))
            .expect("apply");
        assert_eq!(s.objects()[&1].live_bytes, 0);
        assert_eq!(s.objects()[&2].live_bytes, 4 * 512);
        assert_eq!(s.objects()[&3].live_bytes, 12 * 512);
        let at4 = s.map().lookup(4, 1)[0].location.expect("mapped");
        assert_eq!(at4.object_seq, 2);
    }

    #[test]
    fn checkpoint_round_trip() {
        let mut s = StoreState::new(1 << 20);
        s.apply(&object(
            ObjectKind::Data,
            1,
            &[ext(0, 16), ext(100, 8)],
            &[],
        ))
        .expect("apply");
        s.apply(&object(ObjectKind::Data, 2, &[ext(8, 16)], &[]))
            .expect("apply");
        let c = s.to_checkpoint(false, Counters::default());
        let r = StoreState::from_checkpoint(3, 0, &c).expect("valid");
        assert_eq!(
            r.map().iter().collect::<Vec<_>>(),
            s.map().iter().collect::<Vec<_>>()
        );
        assert_eq!(r.objects(), s.objects());
        assert_eq!(r.next_object_seq(), 4);
        let mut bad = c.clone();
        bad.objects[0].live_bytes += 512;
        assert!(StoreState::from_checkpoint(3, 0, &bad).is_err());
    }

    #[test]
    fn checkpoint_extents_in_slices_copy_the_whole_map_once() {
        let mut s = StoreState::new(1 << 20);
        // 40 extents, some adjacent (sectors 0..8 and 8..16 from different objects).
        let a: Vec<ObjectExtent> = (0..20).map(|i| ext(i * 32, 8)).collect();
        let b: Vec<ObjectExtent> = (0..20).map(|i| ext(i * 32 + 8, 4)).collect();
        s.apply(&object(ObjectKind::Data, 1, &a, &[]))
            .expect("apply");
        s.apply(&object(ObjectKind::Data, 2, &b, &[]))
            .expect("apply");
        let want: Vec<(u64, u64, u64, u64)> = s
            .map()
            .iter()
            .map(|p| (p.lba, p.sectors, p.location.object_seq, p.location.offset))
            .collect();
        assert_eq!(want.len(), 40);
        for slice in [1, 2, 3, 7, 40, 41, usize::MAX] {
            let mut c = s.to_checkpoint_head(false, Counters::default());
            assert!(c.extents.is_empty());
            let (mut from, mut slices) = (Some(0), 0);
            while let Some(lba) = from {
                from = s.checkpoint_extents(lba, slice, &mut c.extents);
                slices += 1;
            }
            let got: Vec<_> = c
                .extents
                .iter()
                .map(|e| (e.lba, e.sectors, e.object_seq, e.object_offset))
                .collect();
            assert_eq!(got, want, "slices of {slice}");
            assert_eq!(slices, 40usize.div_ceil(slice), "slices of {slice}");
        }
    }
}

#[cfg(test)]
#[path = "store_state_apply_tests.rs"]
mod apply_tests;
