//! The upload pipeline: the one owner of the object sequence.
//!
//! The design rests on one invariant: **sequence order is history order**. Every object
//! (client data, GC output, checkpoint) gets its number here, in one function
//! ([`Pipeline::allocate_seqs`]), is queued here in that order, and is applied to the
//! store state here in that order, whatever order the uploads finish in. Everything
//! that decides *what* goes to the store and *when* lives in this module: the open
//! batch and its timeout, holding client batches back while GC catches up, the upload
//! queue and how many uploads run at once, apply order, the checkpoint cadence, and
//! which GC pass may run.
//!
//! It does no I/O and reads no clock. Drivers feed it events and carry out what it
//! asks for:
//!
//! ```text
//!  event (driver calls)                    what the pipeline does / hands back
//!  ─────────────────────────────────────   ──────────────────────────────────────────
//!  record(now, seq, items)                 batch it; close the batch when full, or
//!                                          when its timeout passed; queue closed
//!                                          batches (or hold them while GC is behind)
//!  tick(now)                               close a batch open too long, release held
//!                                          batches, queue a checkpoint that is due
//!  next_upload(store_writable)             Upload::{Data, Gc, Checkpoint}: PUT this
//!  upload_done(seq, header)                remember it until its turn to be applied
//!  begin_apply() / apply_step(..)          apply the next object in sequence order
//!  freeable_through()                      the write log may be freed through here
//!  checkpoint_finished(seq)                end the GC pass it closes
//!  gc_plan() / gc_reserve(n) / gc_queue    run a GC pass: victims, numbers, objects
//!  stop_writes() / drained()               shut down: everything goes up
//!  take_wakes()                            which of the driver's tasks to wake
//! ```
//!
//! Two drivers use it: the live engine (crate `lsvd-engine`; its writer, uploader and GC
//! tasks call these under the volume's state lock and do the I/O outside it) and the
//! simulator (`lsvd sim`, which answers every upload at once on a simulated clock).
//! So the simulator's batching, numbering, checkpoint cadence and GC scheduling are
//! the engine's, not a copy of them.
//!
//! Times are nanoseconds on the driver's clock (any epoch, never going back).

/// The default of [`PipelineConfig::gc_max_backlog`] for the engine and the simulator:
/// with no GC headroom (`gc_headroom_bytes` 0), no GC pass starts while more objects
/// than this wait to be handed to the uploader, so client data goes first while GC
/// keeps up; any headroom lifts the rule (the headroom bounds the store instead).
pub const GC_MAX_BACKLOG_OBJECTS: usize = 2;

mod gc;
#[cfg(test)]
mod tests;
mod uploads;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::batcher::{Batch, Batcher};
use crate::extent_map::Location;
use crate::format::SECTOR_BYTES;
use crate::format::object::{ObjectHeader, ObjectKind, header_bytes_for};
use crate::gc::GcConfig;
use crate::hylog::RegionClasses;
use crate::store_state::StoreState;

pub use gc::GcPass;
pub use uploads::Applied;

/// Settings of the pipeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PipelineConfig {
    /// Client bytes per object before its batch is closed.
    pub batch_size_bytes: u64,
    /// A non-empty batch is closed this long after it opened. `None`: only by size.
    pub batch_timeout_ns: Option<u64>,
    /// A checkpoint after this many client objects (at least 1).
    pub checkpoint_every_objects: u64,
    /// Also a checkpoint when client objects were queued since the last one and this
    /// long has passed since it. `None`: only by count.
    pub checkpoint_interval_ns: Option<u64>,
    /// Uploads handed out and not yet done, at most (at least 1).
    pub uploads_in_flight: usize,
    pub gc: GcConfig,
    /// No GC pass starts while more objects than this wait in the upload queue:
    /// client data goes first while GC keeps up.
    pub gc_max_backlog: usize,
    /// How far the store may grow past `live / gc.start_utilization` (plus a batch)
    /// before client objects wait for GC. 0: they wait as soon as GC falls behind.
    /// Above 0, GC also starts while client objects wait for upload, so it runs
    /// beside client writes (Gecko's regime: a chain's body cleaned while its tail
    /// takes writes) for as long as the headroom lasts.
    pub gc_headroom_bytes: u64,
}

/// What the driver should wake: set by events, collected with
/// [`Pipeline::take_wakes`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wakes {
    /// Something was queued, applied or released: look for uploads to start.
    pub uploader: bool,
    /// The store changed, or client batches wait for room: look for GC work.
    pub gc: bool,
}

/// One thing the batcher is told about a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchItem<L> {
    /// `sectors` of data at `lba`, found at `at`.
    Data { lba: u64, sectors: u64, at: L },
    /// `[lba, lba+sectors)` reads as zeros from this record on.
    Zero { lba: u64, sectors: u64 },
}

/// An object to upload, handed out by [`Pipeline::next_upload`] in sequence order.
#[derive(Debug)]
pub enum Upload<L, G> {
    /// A closed client batch: read its data (at the batch's locations) into object
    /// `seq`.
    Data { seq: u64, batch: Batch<L> },
    /// A GC object the driver made earlier ([`Pipeline::gc_queue`]).
    Gc { seq: u64, object: G },
    /// Checkpoint `seq` of the store state as it is now (every object before it is
    /// applied; nothing is applied until this one is). `dead` are the objects it
    /// leaves out: delete them once it is durable, then call
    /// [`Pipeline::checkpoint_finished`].
    Checkpoint {
        seq: u64,
        clean: bool,
        dead: Vec<(u64, ObjectKind)>,
    },
}

impl<L, G> Upload<L, G> {
    pub fn seq(&self) -> u64 {
        match self {
            Upload::Data { seq, .. } | Upload::Gc { seq, .. } | Upload::Checkpoint { seq, .. } => {
                *seq
            }
        }
    }
}

/// An entry of the upload queue.
#[derive(Debug)]
enum Queued<L, G> {
    Data { seq: u64, batch: Batch<L> },
    Gc { seq: u64, object: G },
    Checkpoint { seq: u64 },
}

impl<L, G> Queued<L, G> {
    fn seq(&self) -> u64 {
        match self {
            Queued::Data { seq, .. } | Queued::Gc { seq, .. } | Queued::Checkpoint { seq } => *seq,
        }
    }
}

/// What the GC side of the pipeline knows.
#[derive(Debug, Default)]
struct GcState {
    /// Collecting until utilization rises above the stop threshold (hysteresis).
    active: bool,
    /// Objects the pass in progress moves data out of; cleared when the checkpoint
    /// that closes the pass is finished.
    busy: BTreeSet<u64>,
    /// The checkpoint that closes the pass in progress.
    pass_checkpoint: Option<u64>,
    /// GC should collect but finds no victims: holding client batches back would wait
    /// for nothing.
    stalled: bool,
    /// A pass took sequence numbers and has not queued its objects yet: nothing else
    /// may be numbered meanwhile.
    reserved: Option<std::ops::Range<u64>>,
    /// The hylog policy separates hot from cold data now (set by the driver after
    /// each pass's choice): victims are then taken in cost-benefit order with the
    /// live data's write rate in place of the age (`crate::live_rates`).
    separating: bool,
}

/// The upload pipeline of one volume. `L` is where a batched extent's data is (the
/// engine: a write-log position; the simulator: a record), `G` what the driver keeps
/// of a GC object until it is uploaded (the engine: its encoded bytes; the simulator:
/// its header).
#[derive(Debug)]
pub struct Pipeline<L: Location, G> {
    cfg: PipelineConfig,
    store: StoreState,
    batcher: Batcher<L>,
    batch_opened_ns: Option<u64>,
    /// The newest time the driver reported.
    now_ns: u64,
    /// The next sequence number to hand out ([`Pipeline::allocate_seqs`]).
    next_object_seq: u64,
    client_objects_since_checkpoint: u64,
    last_checkpoint_ns: u64,
    /// Closed client batches, not yet numbered: waiting for GC to make room.
    held: VecDeque<Batch<L>>,
    /// Numbered objects waiting for upload, in sequence order.
    queue: VecDeque<Queued<L, G>>,
    /// The sequence number the next queued object must carry.
    next_queued_seq: u64,
    in_flight: usize,
    /// A checkpoint is being taken, uploaded, or is deleting what it made obsolete
    /// (until [`Pipeline::checkpoint_finished`]). One at a time, so checkpoints are
    /// finished in order.
    checkpoint_in_progress: bool,
    /// Uploaded, waiting for their turn to be applied.
    completed: BTreeMap<u64, ObjectHeader>,
    /// Estimated bytes of each data and GC object queued, uploading, or uploaded but
    /// not yet applied.
    pending_bytes: BTreeMap<u64, u64>,
    pending_total_bytes: u64,
    writes_stopped: bool,
    /// Write-log records through this sequence number are in applied objects.
    freeable_through: u64,
    gc: GcState,
    wakes: Wakes,
    /// Batches closed because their timeout passed (rather than by size or on demand).
    batches_closed_by_timeout: u64,
    /// hylog: the heat classes the latest GC pass chose; client batches are split by
    /// them when numbered ([`Pipeline::set_batch_classes`]).
    batch_classes: Option<RegionClasses>,
    /// Client batches split into several data objects by `batch_classes`.
    batches_split: u64,
}

impl<L: Location, G> Pipeline<L, G> {
    /// A pipeline continuing from `store` (recovered, or new). `now_ns` starts the
    /// checkpoint interval.
    pub fn new(cfg: PipelineConfig, store: StoreState, now_ns: u64) -> Self {
        let next = store.next_object_seq();
        Pipeline {
            batcher: Batcher::new(cfg.batch_size_bytes),
            cfg,
            batch_opened_ns: None,
            now_ns,
            next_object_seq: next,
            client_objects_since_checkpoint: 0,
            last_checkpoint_ns: now_ns,
            held: VecDeque::new(),
            queue: VecDeque::new(),
            next_queued_seq: next,
            in_flight: 0,
            checkpoint_in_progress: false,
            completed: BTreeMap::new(),
            pending_bytes: BTreeMap::new(),
            pending_total_bytes: 0,
            writes_stopped: false,
            freeable_through: store.last_record_seq(),
            store,
            gc: GcState::default(),
            wakes: Wakes::default(),
            batches_closed_by_timeout: 0,
            batch_classes: None,
            batches_split: 0,
        }
    }

    pub fn config(&self) -> &PipelineConfig {
        &self.cfg
    }

    /// The volume as the applied objects define it.
    pub fn store(&self) -> &StoreState {
        &self.store
    }

    /// The next sequence number [`allocate_seqs`](Self::allocate_seqs) hands out.
    pub fn next_object_seq(&self) -> u64 {
        self.next_object_seq
    }

    /// Split client batches by these heat classes from now on (hylog, after each GC
    /// pass's choice); `None`: keep them whole. A batch is split when it is numbered,
    /// into consecutive objects that recovery takes all or none of
    /// ([`crate::batcher::Batch::split_by_class`]).
    pub fn set_batch_classes(&mut self, classes: Option<RegionClasses>) {
        self.batch_classes = classes;
    }

    /// Client batches split into several data objects by heat so far.
    pub fn batches_split(&self) -> u64 {
        self.batches_split
    }

    /// What to wake since the last call.
    pub fn take_wakes(&mut self) -> Wakes {
        std::mem::take(&mut self.wakes)
    }

    /// The only place object sequence numbers come from: `count` consecutive numbers,
    /// the first returned.
    fn allocate_seqs(&mut self, count: u64) -> u64 {
        debug_assert!(
            self.gc.reserved.is_none(),
            "nothing is numbered while a GC pass holds numbers"
        );
        let first = self.next_object_seq;
        self.next_object_seq += count;
        first
    }

    /// Append to the upload queue; objects go in strictly in sequence order.
    fn push_queue(&mut self, q: Queued<L, G>) {
        assert_eq!(
            q.seq(),
            self.next_queued_seq,
            "objects are queued in sequence order"
        );
        self.next_queued_seq += 1;
        self.queue.push_back(q);
        self.wakes.uploader = true;
    }

    fn add_pending(&mut self, seq: u64, bytes: u64) {
        self.pending_bytes.insert(seq, bytes);
        self.pending_total_bytes += bytes;
    }

    // ---- the write side -------------------------------------------------------

    /// A record was appended to the write log with these items, in order. A batch
    /// whose timeout has passed is closed first (this record starts the next one); a
    /// record that would take a non-empty batch past the batch size starts the next
    /// one too, so objects stay within the batch size unless one record is larger.
    pub fn record(&mut self, now_ns: u64, record_seq: u64, items: &[BatchItem<L>]) {
        self.tick(now_ns);
        let data_bytes: u64 = items
            .iter()
            .map(|i| match i {
                BatchItem::Data { sectors, .. } => sectors * SECTOR_BYTES,
                BatchItem::Zero { .. } => 0,
            })
            .sum();
        if self.batcher.would_overflow(data_bytes) {
            self.close_batch();
        }
        self.batch_opened_ns.get_or_insert(self.now_ns);
        if items.is_empty() {
            self.batcher.add_empty_record(record_seq);
        }
        for item in items {
            match *item {
                BatchItem::Data { lba, sectors, at } => {
                    self.batcher.add_write(record_seq, lba, sectors, at)
                }
                BatchItem::Zero { lba, sectors } => self.batcher.add_zero(record_seq, lba, sectors),
            }
        }
        if self.batcher.is_full() {
            self.close_batch();
        }
    }

    /// Client bytes in the open batch.
    pub fn open_batch_bytes(&self) -> u64 {
        self.batcher.client_bytes()
    }

    /// Is a batch open (holding at least one record)?
    pub fn batch_open(&self) -> bool {
        !self.batcher.is_empty()
    }

    /// Close the open batch now, if any (the write log is full, or a snapshot of
    /// everything written is wanted). It is queued, or held while GC is behind.
    pub fn close_batch(&mut self) {
        let Some(batch) = self.batcher.take() else {
            return;
        };
        self.batch_opened_ns = None;
        self.held.push_back(batch);
        self.release_held();
    }

    /// Resize the volume to `new_size_bytes` (a multiple of 4096): close the open
    /// batch, then queue an object of its own, with no data, that sets the new size
    /// from there on and, when the volume shrinks, trims what is cut off, so that the
    /// object alone says what happened. The store state takes the new size when that
    /// object is applied ([`StoreState::begin_apply`]); until then the driver must
    /// keep client I/O within the smaller of the two sizes.
    pub fn resize(&mut self, new_size_bytes: u64) {
        self.close_batch();
        let old_sectors = self.store.volume_size_bytes / SECTOR_BYTES;
        let new_sectors = new_size_bytes / SECTOR_BYTES;
        let trims = if new_sectors < old_sectors {
            vec![(new_sectors, old_sectors - new_sectors)]
        } else {
            Vec::new()
        };
        // No records of its own: it covers what everything before it covered.
        let last_record_seq = self
            .batcher
            .last_record_seq()
            .max(self.store.last_record_seq());
        self.held.push_back(Batch {
            extents: Vec::new(),
            trims,
            first_record_seq: last_record_seq,
            last_record_seq,
            client_bytes: 0,
            data_bytes: 0,
            volume_size_bytes: Some(new_size_bytes),
            parts_after: 0,
        });
        self.release_held();
    }

    /// Time passed: close a batch open longer than the timeout, release held batches
    /// that fit now, and queue a checkpoint that is due. Returns true if a batch was
    /// closed by its timeout.
    pub fn tick(&mut self, now_ns: u64) -> bool {
        self.now_ns = self.now_ns.max(now_ns);
        let timed_out = matches!(
            (self.cfg.batch_timeout_ns, self.batch_opened_ns),
            (Some(timeout), Some(opened)) if self.now_ns.saturating_sub(opened) >= timeout
        );
        if timed_out {
            self.batches_closed_by_timeout += 1;
            self.close_batch();
        }
        self.release_held();
        self.queue_checkpoint_if_due();
        timed_out
    }

    /// Batches closed because their timeout passed.
    pub fn batches_closed_by_timeout(&self) -> u64 {
        self.batches_closed_by_timeout
    }

    /// No more records will come: close the open batch, and let everything held go
    /// (from now on nothing is held back and no GC pass starts).
    pub fn stop_writes(&mut self) {
        self.writes_stopped = true;
        self.close_batch();
        self.release_held();
        self.wakes.uploader = true;
        self.wakes.gc = true;
    }

    pub fn writes_stopped(&self) -> bool {
        self.writes_stopped
    }

    /// Number and queue held client batches, oldest first, while the store has room
    /// for them ([`crate::gc::client_object_fits`]) or nothing may be held: GC off,
    /// writes stopped, or GC has nothing to collect. Nothing is numbered while a GC
    /// pass holds numbers it has not queued yet.
    fn release_held(&mut self) {
        while let Some(batch) = self.held.front() {
            // A batch split by heat takes a few header bytes more than this (one
            // fixed part per extra object): the bound's slack of a batch covers it.
            let object_bytes = data_object_bytes(batch);
            let over_bound = self.cfg.gc.enabled()
                && !self.writes_stopped
                && !self.gc.stalled
                && !crate::gc::client_object_fits(
                    &self.store,
                    &self.cfg.gc,
                    self.pending_total_bytes,
                    object_bytes,
                    self.cfg.batch_size_bytes + self.cfg.gc_headroom_bytes,
                );
            if self.gc.reserved.is_some() || over_bound {
                self.wakes.gc = true;
                return;
            }
            let Some(batch) = self.held.pop_front() else {
                return;
            };
            let parts = match &self.batch_classes {
                Some(classes) => batch.split_by_class(|lba| classes.class_of(lba)),
                None => vec![batch],
            };
            // The parts are numbered together and queued back to back: nothing (no
            // checkpoint, no GC object) comes between them.
            self.batches_split += u64::from(parts.len() > 1);
            let first = self.allocate_seqs(parts.len() as u64);
            for (seq, part) in (first..).zip(parts) {
                self.add_pending(seq, data_object_bytes(&part));
                self.push_queue(Queued::Data { seq, batch: part });
                self.client_objects_since_checkpoint += 1;
            }
            self.queue_checkpoint_if_due();
        }
    }

    /// Queue a checkpoint if enough client objects were queued since the last one, or
    /// if any were and the checkpoint interval has passed (so an idle volume's newest
    /// checkpoint is never far behind its newest object).
    fn queue_checkpoint_if_due(&mut self) {
        if self.gc.reserved.is_some() {
            // The pass queues its own checkpoint right after its objects.
            return;
        }
        let since = self.client_objects_since_checkpoint;
        let by_count = since >= self.cfg.checkpoint_every_objects.max(1);
        let by_time = since > 0
            && self
                .cfg
                .checkpoint_interval_ns
                .is_some_and(|i| self.now_ns.saturating_sub(self.last_checkpoint_ns) >= i);
        if by_count || by_time {
            let seq = self.allocate_seqs(1);
            self.queue_checkpoint(seq);
        }
    }

    /// Queue checkpoint `seq` (already numbered).
    fn queue_checkpoint(&mut self, seq: u64) {
        self.push_queue(Queued::Checkpoint { seq });
        self.client_objects_since_checkpoint = 0;
        self.last_checkpoint_ns = self.now_ns;
    }

    // ---- what drivers show ----------------------------------------------------

    /// Objects on their way: held, queued, uploading, uploaded but not yet applied, or
    /// being applied.
    pub fn uploads_pending(&self) -> u64 {
        (self.held.len()
            + self.queue.len()
            + self.in_flight
            + self.completed.len()
            + usize::from(self.store.applying_seq().is_some())) as u64
    }

    /// Closed client batches held back until GC makes room.
    pub fn uploads_held(&self) -> u64 {
        self.held.len() as u64
    }

    /// Objects in the upload queue (numbered, not yet handed out).
    pub fn uploads_queued(&self) -> usize {
        self.queue.len()
    }

    /// Estimated bytes of data and GC objects on their way to the store.
    pub fn pending_bytes(&self) -> u64 {
        self.pending_total_bytes
    }

    /// How much of the GC headroom the store and what is on its way there use, 0..=1
    /// ([`crate::gc::headroom_used`]; 1 without headroom): the live engine's GC pace.
    pub fn gc_headroom_used(&self) -> f64 {
        crate::gc::headroom_used(
            &self.store,
            &self.cfg.gc,
            self.pending_total_bytes,
            self.cfg.batch_size_bytes,
            self.cfg.gc_headroom_bytes,
        )
    }

    /// A GC pass is under way: relocating, or waiting for its closing checkpoint.
    pub fn gc_pass_in_flight(&self) -> bool {
        !self.gc.busy.is_empty()
    }

    /// A one-line account of the pipeline's state, for test failures and debugging.
    pub fn describe(&self) -> String {
        format!(
            "next seq {}, store next {}, queued {}, in flight {}, completed {:?}, held {}, pending {} bytes, checkpoint in progress {}, gc busy {:?}, gc pass checkpoint {:?}, gc stalled {}, gc reserved {:?}, writes stopped {}",
            self.next_object_seq,
            self.store.next_object_seq(),
            self.queue.len(),
            self.in_flight,
            self.completed.keys().collect::<Vec<_>>(),
            self.held.len(),
            self.pending_total_bytes,
            self.checkpoint_in_progress,
            self.gc.busy,
            self.gc.pass_checkpoint,
            self.gc.stalled,
            self.gc.reserved,
            self.writes_stopped,
        )
    }
}

/// Bytes of the data object made from `batch` (its header as version 1).
fn data_object_bytes<L>(batch: &Batch<L>) -> u64 {
    batch.data_bytes
        + header_bytes_for(
            ObjectKind::Data,
            batch.extents.len(),
            batch.trims.len(),
            batch.data_bytes,
        )
}
