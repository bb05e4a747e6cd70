//! Uploads and apply order: objects are handed out in sequence order, may finish in
//! any order, and are applied to the store state strictly in sequence order.

use crate::extent_map::Location;
use crate::format::object::{ObjectHeader, ObjectKind};
use crate::store_state::ApplyError;

use super::{Pipeline, Queued, Upload};

/// An object fully applied to the store state.
#[derive(Debug, Clone)]
pub struct Applied {
    pub header: ObjectHeader,
    /// Of a GC object: bytes it copied that a client overwrote or trimmed before it
    /// was applied (the copy was discarded: relocations apply only where the map still
    /// points at their source). 0 for other objects.
    pub superseded_bytes: u64,
}

/// Why a clean checkpoint cannot be taken yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotDrained(pub String);

impl std::fmt::Display for NotDrained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "uploads did not drain: {}", self.0)
    }
}

impl<L: Location, G> Pipeline<L, G> {
    /// The next object to upload, if one may start now: `store_writable` is false
    /// until the driver owns the volume in the store; at most `uploads_in_flight` run
    /// at once; a checkpoint starts only once every object before it is applied and no
    /// other upload runs (it describes exactly the state before its number).
    pub fn next_upload(&mut self, store_writable: bool) -> Option<Upload<L, G>> {
        if !store_writable || self.in_flight >= self.cfg.uploads_in_flight.max(1) {
            return None;
        }
        let ready = match self.queue.front()? {
            Queued::Checkpoint { seq } => {
                self.store.next_object_seq() == *seq
                    && self.store.applying_seq().is_none()
                    && self.in_flight == 0
                    && !self.checkpoint_in_progress
            }
            Queued::Data { .. } | Queued::Gc { .. } => true,
        };
        if !ready {
            return None;
        }
        let q = self.queue.pop_front()?;
        self.in_flight += 1;
        Some(match q {
            Queued::Data { seq, batch } => Upload::Data { seq, batch },
            Queued::Gc { seq, object } => Upload::Gc { seq, object },
            Queued::Checkpoint { seq } => {
                self.checkpoint_in_progress = true;
                Upload::Checkpoint {
                    seq,
                    clean: false,
                    dead: self.dead_objects(),
                }
            }
        })
    }

    /// Objects without live data: a checkpoint taken now leaves them out.
    fn dead_objects(&self) -> Vec<(u64, ObjectKind)> {
        self.store
            .dead_objects()
            .into_iter()
            .map(|seq| (seq, self.store.objects()[&seq].kind))
            .collect()
    }

    /// Upload `seq` is durable in the store, with this header. It is applied in its
    /// turn ([`begin_apply`](Self::begin_apply)).
    pub fn upload_done(&mut self, seq: u64, header: ObjectHeader) {
        debug_assert_eq!(header.seq, seq);
        debug_assert!(self.in_flight > 0, "an upload finished that never started");
        self.in_flight = self.in_flight.saturating_sub(1);
        self.completed.insert(seq, header);
        self.wakes.uploader = true;
    }

    /// Start applying the next object in sequence order, if it has been uploaded and
    /// no other object is being applied. Returns its sequence number.
    pub fn begin_apply(&mut self) -> Result<Option<u64>, ApplyError> {
        if self.store.applying_seq().is_some() {
            return Ok(None);
        }
        let next = self.store.next_object_seq();
        let Some(h) = self.completed.remove(&next) else {
            return Ok(None);
        };
        // From here on the store state counts the object's bytes.
        if let Some(b) = self.pending_bytes.remove(&next) {
            self.pending_total_bytes -= b;
        }
        self.store.begin_apply(h)?;
        Ok(Some(next))
    }

    /// Apply more of the object in progress (see
    /// [`StoreState::apply_step`](crate::store_state::StoreState::apply_step));
    /// `applied(lba, sectors, last_record_seq)` is told each range. Returns the object
    /// once it is fully applied.
    pub fn apply_step(
        &mut self,
        max_pieces: usize,
        applied: impl FnMut(u64, u64, u64),
    ) -> Option<Applied> {
        let header = self.store.apply_step(max_pieces, applied)?;
        let superseded_bytes = if header.kind == ObjectKind::Gc {
            let kept = self
                .store
                .objects()
                .get(&header.seq)
                .map_or(0, |o| o.live_bytes);
            header.data_bytes.saturating_sub(kept)
        } else {
            0
        };
        // A part of a split batch frees none of the batch's records: until its last
        // part is applied, recovery would drop it and replay them.
        if header.parts_after == 0 {
            self.freeable_through = self.freeable_through.max(header.last_record_seq);
        }
        // Its bytes moved from pending into the store, and its data may have made
        // others dead: held client batches may fit now.
        self.release_held();
        self.wakes.uploader = true;
        self.wakes.gc = true;
        Some(Applied {
            header,
            superseded_bytes,
        })
    }

    /// Apply every uploaded object whose turn has come, all at once (the simulator).
    pub fn apply_all_ready(&mut self) -> Result<Vec<Applied>, ApplyError> {
        let mut out = Vec::new();
        while self.begin_apply()?.is_some() {
            while let Some(a) = self.apply_step(usize::MAX, |_, _, _| {}) {
                out.push(a);
            }
        }
        Ok(out)
    }

    /// Write-log records through this sequence number are in applied objects: once the
    /// driver has made that durable, their log space may be reused.
    pub fn freeable_through(&self) -> u64 {
        self.freeable_through
    }

    /// Object `seq` was deleted from the store (it held no live data).
    pub fn forget_object(&mut self, seq: u64) {
        self.store.forget_object(seq);
        // The store shrank: held client batches may fit now.
        self.release_held();
    }

    /// Checkpoint `seq` is done: durable, named where the driver names checkpoints,
    /// and the objects it left out deleted (or given up on). Ends the GC pass it
    /// closes and lets the next checkpoint start.
    pub fn checkpoint_finished(&mut self, seq: u64) {
        self.checkpoint_in_progress = false;
        if self.gc.pass_checkpoint.is_some_and(|c| c <= seq) {
            self.gc.pass_checkpoint = None;
            self.gc.busy.clear();
        }
        self.release_held();
        self.wakes.uploader = true;
        self.wakes.gc = true;
    }

    /// Writes have stopped and everything is in the store and applied: nothing held,
    /// queued, uploading, waiting to be applied, or being encoded by GC, and no
    /// checkpoint in progress.
    pub fn drained(&self) -> bool {
        self.writes_stopped
            && self.batcher.is_empty()
            && self.held.is_empty()
            && self.queue.is_empty()
            && self.in_flight == 0
            && self.completed.is_empty()
            && self.store.applying_seq().is_none()
            && !self.checkpoint_in_progress
            && self.gc.reserved.is_none()
    }

    /// Number the clean checkpoint of a drained volume and start it (the driver
    /// uploads it like any checkpoint, then calls [`upload_done`](Self::upload_done),
    /// applies it, and [`checkpoint_finished`](Self::checkpoint_finished)).
    pub fn begin_clean_checkpoint(&mut self) -> Result<Upload<L, G>, NotDrained> {
        if !self.drained() {
            return Err(NotDrained(self.describe()));
        }
        let seq = self.allocate_seqs(1);
        self.next_queued_seq += 1;
        self.in_flight += 1;
        self.checkpoint_in_progress = true;
        Ok(Upload::Checkpoint {
            seq,
            clean: true,
            dead: self.dead_objects(),
        })
    }
}
