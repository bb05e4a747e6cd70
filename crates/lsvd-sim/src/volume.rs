//! One simulated volume: the engine's upload pipeline (`lsvd_core::pipeline`) driven
//! by requests instead of I/O, on the trace's clock.
//!
//! The model, step by step:
//!
//! 1. Every write or trim is one write-log record with the next record sequence
//!    number, as when the engine receives requests one at a time, handed to
//!    [`Pipeline::record`] at the request's time. The batch location is (record,
//!    sector in record), like the engine's log position, so pieces of different
//!    records never merge inside a batch, exactly as in the engine. The pipeline
//!    closes batches by size and by timeout (checked when the next request arrives:
//!    that request starts a new batch; the engine also checks on a 200 ms tick, so a
//!    batch there may close up to 200 ms sooner on an idle volume), numbers objects,
//!    holds client batches while GC is behind, and queues checkpoints: all as in the
//!    engine, because it is the engine's code.
//! 2. Whenever the pipeline queued something, the simulator uploads at once what it
//!    hands out, in order: a data object's header is built from its batch's extents
//!    ([`Batch::object_extents`]) and trims, a checkpoint's size is that of
//!    `encode_checkpoint(state.to_checkpoint(..))` (the layout is measured once from
//!    the real encoder; the map is not encoded). Each is applied at once; a checkpoint
//!    then deletes the objects it leaves out and keeps the newest two checkpoints, as
//!    the engine does once it is durable.
//! 3. Then GC, while the pipeline allows a pass ([`Pipeline::gc_plan`], with the
//!    engine's hysteresis): the victims' live extents from their headers
//!    ([`gc_plan`]), [`gc::group_relocations`] at the
//!    batch size, one GC object per group from [`gc::gc_object_header`], numbered and
//!    queued by the pipeline with the checkpoint that closes the pass, and uploaded as
//!    above. The engine runs GC in the background, paced, so its passes interleave
//!    with client objects at timing-dependent points; the simulator runs each pass at
//!    once, right after the objects that called for it.
//!    Under `--gc-policy hylog` every client write also feeds a write-frequency tracker
//!    ([`HeatTracker`]); each pass cuts the data into heat classes from it and the
//!    utilization ([`hylog::choose`]) and groups relocations by class
//!    ([`gc::group_relocations_by_class`]), so data of different classes goes into
//!    separate GC objects. The choice also sets the next pass's victim order, and
//!    the pipeline splits client batches by the same classes until the next pass.
//! 4. [`VolumeSim::finish`] is the engine's shutdown: the open batch is closed (with
//!    its checkpoint and GC, if due), writes stop, and a clean checkpoint is written.
//!
//! Reads change nothing; they are counted. Requests are rounded outward to whole
//! 512-byte sectors. With a fixed volume size, a request that does not fit entirely is
//! counted as out of range and skipped.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::OnceLock;

use lsvd_core::batcher::Batch;
use lsvd_core::extent_map::Location;
use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::checkpoint::{
    Checkpoint, CheckpointExtent, CheckpointObject, encode_checkpoint,
};
use lsvd_core::format::object::{
    ObjectExtent, ObjectHeader, ObjectKind, header_bytes_for, header_without_data,
};
use lsvd_core::gc::{self, GcConfig};
use lsvd_core::gc_plan;
use lsvd_core::heat::HeatTracker;
use lsvd_core::hylog::{self, HotChoice, RegionClasses};
use lsvd_core::live_rates::LiveWriteRates;
use lsvd_core::pipeline::{BatchItem, Pipeline, PipelineConfig, Upload};
use lsvd_core::store_state::StoreState;
use lsvd_trace::{Op, Request};
use serde::Serialize;

/// Estimated bytes of memory per extent of the store map: extents are packed 16
/// bytes each into chunks of 64, which random writes leave about 2/3 full; measured
/// by `cargo run --release -p lsvd-core --example map_memory`, 25.1 bytes per extent
/// at 10k, 100k and 1M extents (a map loaded from a checkpoint, with full chunks,
/// takes less).
pub const MAP_BYTES_PER_EXTENT: u64 = 25;

/// Where a batched extent came from: a record and a sector inside its data, the
/// simulator's stand-in for the engine's write-log position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordPos {
    pub record_seq: u64,
    pub sector: u64,
}

impl Location for RecordPos {
    fn advance(&self, sectors: u64) -> Self {
        RecordPos {
            record_seq: self.record_seq,
            sector: self.sector + sectors,
        }
    }
}

/// Settings of one simulated volume.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimConfig {
    /// Client bytes per batch (the engine's `batch_size_bytes`).
    pub batch_size_bytes: u64,
    /// Close a non-empty batch this long after it opened, in trace time. `None`: never.
    pub batch_timeout_ns: Option<u64>,
    /// A checkpoint after this many data objects (the engine's
    /// `checkpoint_every_objects`).
    pub checkpoint_every_objects: u64,
    /// Also a checkpoint when data objects were written and this much trace time has
    /// passed since the last one (the engine's `checkpoint_interval_ms`). `None`:
    /// only by count.
    pub checkpoint_interval_ns: Option<u64>,
    pub gc: GcConfig,
    /// Fixed volume size; requests beyond it are skipped. `None`: the largest request
    /// end rounded up to 1 GiB, and nothing is out of range.
    pub volume_size_bytes: Option<u64>,
    /// Keep a time series of at most this many points (0: none).
    pub series_points: usize,
}

impl Default for SimConfig {
    /// The engine's defaults (8 MiB batches, 2 s timeout, a checkpoint every 64
    /// objects) and the core's GC defaults.
    fn default() -> Self {
        SimConfig {
            batch_size_bytes: 8 << 20,
            batch_timeout_ns: Some(2_000_000_000),
            checkpoint_every_objects: 64,
            checkpoint_interval_ns: None,
            gc: GcConfig::default(),
            volume_size_bytes: None,
            series_points: 0,
        }
    }
}

/// Running totals. All byte counts are exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub requests: u64,
    pub write_requests: u64,
    pub read_requests: u64,
    pub trim_requests: u64,
    /// Requests skipped because they do not fit in the fixed volume size.
    pub out_of_range_requests: u64,
    /// Requests whose offset or length is not a multiple of 512 (rounded outward).
    pub misaligned_requests: u64,
    /// Client bytes written, after rounding to sectors.
    pub client_write_bytes: u64,
    pub read_bytes: u64,
    pub trim_bytes: u64,
    /// Client bytes removed by coalescing inside batches (overwritten or trimmed
    /// before the batch closed).
    pub coalesced_bytes: u64,
    pub data_objects: u64,
    pub data_object_bytes: u64,
    pub gc_objects: u64,
    pub gc_object_bytes: u64,
    pub checkpoint_objects: u64,
    pub checkpoint_bytes: u64,
    pub gc_passes: u64,
    /// Live data bytes copied by GC.
    pub gc_bytes_moved: u64,
    /// Of those, bytes put into GC objects of any class but the coldest ("hot"; hylog)
    /// and of the coldest class (everything, for other policies).
    pub gc_hot_bytes_moved: u64,
    pub gc_cold_bytes_moved: u64,
    /// GC passes that separated hot from cold data (hylog).
    pub gc_separating_passes: u64,
    /// hylog: GC passes that cut the data into 1, 2, ... [`hylog::MAX_CLASSES`] heat
    /// classes (the first entry counts passes that did not separate).
    pub gc_class_passes: [u64; hylog::MAX_CLASSES],
    pub gc_victims: u64,
    /// Objects deleted because they held no live data (GC victims and objects whose
    /// data was all overwritten or trimmed), at the checkpoint that left them out.
    pub deleted_objects: u64,
    /// Batches closed by the timeout rather than by size or shutdown.
    pub timeout_batches: u64,
    pub peak_store_bytes: u64,
    /// Largest request end seen (bytes), for the default volume size.
    pub max_end_bytes: u64,
}

impl Counters {
    /// Bytes written to the store: data, GC and checkpoint objects, headers included.
    pub fn store_write_bytes(&self) -> u64 {
        self.data_object_bytes + self.gc_object_bytes + self.checkpoint_bytes
    }
}

/// One point of the time series, taken after each data object (and its GC).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SeriesPoint {
    pub client_write_bytes: u64,
    pub store_write_bytes: u64,
    /// Objects in the store now (retained checkpoints included).
    pub store_bytes: u64,
    pub live_bytes: u64,
    /// Live over stored bytes of data and GC objects the volume still needs (what GC
    /// looks at; objects awaiting deletion are in `store_bytes` only).
    pub utilization: f64,
    /// Cumulative write amplification so far.
    pub write_amplification: f64,
    /// The hot fraction the latest GC pass chose: the share of the written regions
    /// not in the coldest heat class (hylog; 0 otherwise).
    pub gc_hot_fraction: f64,
}

/// A bounded time series: when full, every other point is dropped and the sampling
/// stride doubles.
#[derive(Debug, Clone, Default)]
pub struct Series {
    max_points: usize,
    stride: u64,
    seen: u64,
    pub points: Vec<SeriesPoint>,
}

impl Series {
    fn new(max_points: usize) -> Self {
        Series {
            max_points,
            stride: 1,
            seen: 0,
            points: Vec::new(),
        }
    }

    fn offer(&mut self, p: impl FnOnce() -> SeriesPoint) {
        if self.max_points == 0 {
            return;
        }
        self.seen += 1;
        if !(self.seen - 1).is_multiple_of(self.stride) {
            return;
        }
        self.points.push(p());
        if self.points.len() >= self.max_points.max(2) {
            let kept: Vec<SeriesPoint> = self.points.iter().step_by(2).copied().collect();
            self.points = kept;
            self.stride *= 2;
        }
    }

    /// Add the final state unconditionally (replacing a point for the same bytes).
    fn push_final(&mut self, p: SeriesPoint) {
        if self.max_points == 0 {
            return;
        }
        if self
            .points
            .last()
            .is_some_and(|l| l.client_write_bytes == p.client_write_bytes)
        {
            self.points.pop();
        }
        self.points.push(p);
    }
}

/// The end-of-run summary of one volume (LSVD Table 5 and more).
#[derive(Debug, Clone, Serialize)]
pub struct VolumeReport {
    pub volume_size_bytes: u64,
    #[serde(flatten)]
    pub counters: Counters,
    pub store_write_bytes: u64,
    /// Store bytes written / client bytes written.
    pub write_amplification: f64,
    /// Coalesced bytes / client bytes written.
    pub merge_ratio: f64,
    pub map_extents: u64,
    pub map_memory_bytes: u64,
    pub live_bytes: u64,
    /// Data, GC and retained checkpoint objects in the store at the end.
    pub final_store_bytes: u64,
    pub final_objects: u64,
    /// Live over stored bytes of data and GC objects the volume still needs.
    pub final_utilization: f64,
    /// hylog: the hot fraction (share of the written regions not in the coldest heat
    /// class) chosen by the last GC pass, and its mean over passes
    /// (0 for other policies or with no GC pass).
    pub gc_hot_fraction_last: f64,
    pub gc_hot_fraction_mean: f64,
}

/// The simulator state of one volume under one configuration.
#[derive(Debug)]
pub struct VolumeSim {
    cfg: SimConfig,
    /// The engine's pipeline; GC objects wait for "upload" as their headers.
    pipeline: Pipeline<RecordPos, ObjectHeader>,
    next_record_seq: u64,
    /// Checkpoints still in the store: seq -> total bytes.
    retained_checkpoints: BTreeMap<u64, u64>,
    /// Objects the newest checkpoint left out, still in the store until the next one
    /// (like the engine: the fallback to the previous checkpoint needs them):
    /// seq -> (kind, total bytes).
    awaiting_delete: BTreeMap<u64, (ObjectKind, u64)>,
    counters: Counters,
    series: Series,
    finished: bool,
    /// Without a fixed volume size: the largest request end rounded up to 1 GiB, known
    /// once the run is finished.
    reported_volume_size_bytes: Option<u64>,
    /// Write frequencies, kept only when the GC policy uses them (hylog).
    heat: Option<HeatTracker>,
    /// The latest GC pass's hot-fraction choice, and the sum over passes.
    hot_choice: Option<HotChoice>,
    hot_fraction_sum: f64,
    /// Each stored data and GC object's extents with their byte offsets, as its header
    /// lists them: GC plans a pass from its victims' (`lsvd_core::gc_plan`), as the
    /// engine does. Objects deleted since are dropped before each pass.
    extents_of: HashMap<u64, Vec<(ObjectExtent, u64)>>,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// The pipeline settings that make the engine behave as `cfg` describes.
fn pipeline_config(cfg: &SimConfig) -> PipelineConfig {
    PipelineConfig {
        batch_size_bytes: cfg.batch_size_bytes,
        batch_timeout_ns: cfg.batch_timeout_ns,
        checkpoint_every_objects: cfg.checkpoint_every_objects,
        checkpoint_interval_ns: cfg.checkpoint_interval_ns,
        // Uploads finish at once, so any limit gives the same order.
        uploads_in_flight: 1,
        gc: cfg.gc,
        gc_max_backlog: lsvd_core::pipeline::GC_MAX_BACKLOG_OBJECTS,
        gc_headroom_bytes: 0,
    }
}

/// Sizes of the checkpoint payload layout: (fixed bytes, bytes per object, bytes per
/// extent), measured once from the real encoder so the simulator follows the format.
fn checkpoint_layout() -> (u64, u64, u64) {
    static LAYOUT: OnceLock<(u64, u64, u64)> = OnceLock::new();
    *LAYOUT.get_or_init(|| {
        let empty = Checkpoint {
            clean: true,
            counters: Default::default(),
            volume_size_bytes: 0,
            next_object_seq: 0,
            last_record_seq: 0,
            objects: Vec::new(),
            extents: Vec::new(),
            heat: None,
        };
        let fixed = encode_checkpoint(&empty).len() as u64;
        let one_object = Checkpoint {
            objects: vec![CheckpointObject {
                seq: 1,
                kind: 1,
                header_bytes: 0,
                total_bytes: 0,
                live_bytes: 0,
                epoch: 0,
            }],
            ..empty.clone()
        };
        let one_extent = Checkpoint {
            extents: vec![CheckpointExtent {
                lba: 0,
                sectors: 1,
                object_seq: 1,
                object_offset: 0,
            }],
            ..empty.clone()
        };
        (
            fixed,
            encode_checkpoint(&one_object).len() as u64 - fixed,
            encode_checkpoint(&one_extent).len() as u64 - fixed,
        )
    })
}

/// Header and payload bytes of the checkpoint object the engine would write for
/// `state` now: it lists the objects with live data and every map extent, and carries
/// `heat_bytes` of write frequencies (hylog; 0 for other policies).
pub fn checkpoint_object_size(state: &StoreState, heat_bytes: u64) -> (u64, u64) {
    let (fixed, per_object, per_extent) = checkpoint_layout();
    let live_objects = state
        .objects()
        .values()
        .filter(|o| o.live_bytes > 0)
        .count() as u64;
    let payload = fixed
        + per_object * live_objects
        + per_extent * state.map().extent_count() as u64
        + heat_bytes;
    (
        header_bytes_for(ObjectKind::Checkpoint, 0, 0, payload),
        payload,
    )
}

impl VolumeSim {
    pub fn new(cfg: SimConfig) -> Self {
        let size = cfg
            .volume_size_bytes
            .unwrap_or(u64::MAX / SECTOR_BYTES * SECTOR_BYTES);
        VolumeSim {
            pipeline: Pipeline::new(pipeline_config(&cfg), StoreState::new(size), 0),
            cfg,
            next_record_seq: 1,
            retained_checkpoints: BTreeMap::new(),
            awaiting_delete: BTreeMap::new(),
            counters: Counters::default(),
            series: Series::new(cfg.series_points),
            finished: false,
            reported_volume_size_bytes: None,
            heat: cfg
                .gc
                .policy
                .tracks_heat()
                .then(|| HeatTracker::new(cfg.volume_size_bytes)),
            hot_choice: None,
            hot_fraction_sum: 0.0,
            extents_of: HashMap::new(),
        }
    }

    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }
    pub fn state(&self) -> &StoreState {
        self.pipeline.store()
    }
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    /// The write-frequency tracker (hylog only).
    pub fn heat(&self) -> Option<&HeatTracker> {
        self.heat.as_ref()
    }
    /// The latest GC pass's hot-fraction choice (hylog only).
    pub fn hot_choice(&self) -> Option<&HotChoice> {
        self.hot_choice.as_ref()
    }
    pub fn series(&self) -> &[SeriesPoint] {
        &self.series.points
    }
    /// Checkpoints still in the store: (seq, bytes).
    pub fn retained_checkpoints(&self) -> Vec<(u64, u64)> {
        self.retained_checkpoints
            .iter()
            .map(|(&s, &b)| (s, b))
            .collect()
    }

    /// Objects the newest checkpoint left out, still in the store: (seq, kind, bytes).
    pub fn awaiting_delete(&self) -> Vec<(u64, ObjectKind, u64)> {
        self.awaiting_delete
            .iter()
            .map(|(&s, &(k, b))| (s, k, b))
            .collect()
    }

    /// Bytes of data and GC objects in the store (those awaiting deletion included).
    fn object_bytes(&self) -> u64 {
        self.state().stored_bytes() + self.awaiting_delete.values().map(|&(_, b)| b).sum::<u64>()
    }

    /// Bytes the store holds now: data, GC and retained checkpoint objects.
    pub fn store_bytes(&self) -> u64 {
        self.object_bytes() + self.retained_checkpoints.values().sum::<u64>()
    }

    /// Live over stored bytes of data and GC objects the volume still needs (objects
    /// awaiting deletion left out): what GC looks at, like the engine's
    /// `lsvd_utilization`.
    fn gc_utilization(&self) -> f64 {
        let stored = self.state().stored_bytes();
        if stored == 0 {
            1.0
        } else {
            ratio(self.live_bytes(), stored)
        }
    }

    pub fn live_bytes(&self) -> u64 {
        self.state().live_bytes()
    }

    /// Replay one request (its `volume` is ignored).
    pub fn request(&mut self, r: &Request) {
        self.counters.requests += 1;
        self.pipeline.tick(r.time_ns);
        self.drive();
        let start = r.offset_bytes / SECTOR_BYTES;
        let Some(end_bytes) = r.offset_bytes.checked_add(r.length_bytes) else {
            self.counters.out_of_range_requests += 1;
            return;
        };
        let end = end_bytes.div_ceil(SECTOR_BYTES);
        if !r.offset_bytes.is_multiple_of(SECTOR_BYTES)
            || !r.length_bytes.is_multiple_of(SECTOR_BYTES)
        {
            self.counters.misaligned_requests += 1;
        }
        if let Some(size) = self.cfg.volume_size_bytes
            && end * SECTOR_BYTES > size
        {
            self.counters.out_of_range_requests += 1;
            return;
        }
        let sectors = end - start;
        if sectors == 0 {
            return;
        }
        self.counters.max_end_bytes = self.counters.max_end_bytes.max(end * SECTOR_BYTES);
        match r.op {
            Op::Read => {
                self.counters.read_requests += 1;
                self.counters.read_bytes += sectors * SECTOR_BYTES;
            }
            Op::Write => self.write(r.time_ns, start, sectors),
            Op::Trim => self.trim(r.time_ns, start, sectors),
        }
    }

    fn next_record(&mut self) -> u64 {
        let seq = self.next_record_seq;
        self.next_record_seq += 1;
        seq
    }

    /// One write record of `sectors` at `lba`.
    pub fn write(&mut self, now_ns: u64, lba: u64, sectors: u64) {
        self.counters.write_requests += 1;
        self.counters.client_write_bytes += sectors * SECTOR_BYTES;
        if let Some(heat) = &mut self.heat {
            heat.record_write(lba, sectors);
        }
        let seq = self.next_record();
        let at = RecordPos {
            record_seq: seq,
            sector: 0,
        };
        self.pipeline
            .record(now_ns, seq, &[BatchItem::Data { lba, sectors, at }]);
        self.drive();
    }

    /// One record zeroing `sectors` at `lba` (TRIM or WRITE_ZEROES).
    pub fn trim(&mut self, now_ns: u64, lba: u64, sectors: u64) {
        self.counters.trim_requests += 1;
        self.counters.trim_bytes += sectors * SECTOR_BYTES;
        let seq = self.next_record();
        self.pipeline
            .record(now_ns, seq, &[BatchItem::Zero { lba, sectors }]);
        self.drive();
    }

    /// Close the open batch now (then checkpoint and GC, if due).
    pub fn close_batch(&mut self) {
        self.pipeline.close_batch();
        self.drive();
    }

    fn apply_all(&mut self) {
        if let Err(e) = self.pipeline.apply_all_ready() {
            // Sequence numbers come from the pipeline itself and request ranges are
            // checked against the volume size, so this is a simulator bug.
            panic!("simulator applied an invalid object: {e}");
        }
    }

    fn note_peak(&mut self) {
        let now = self.store_bytes();
        if now > self.counters.peak_store_bytes {
            self.counters.peak_store_bytes = now;
        }
    }

    /// Do what the pipeline asked for: upload (and apply) everything it hands out,
    /// then run GC passes while it allows them. Returns at once when nothing changed.
    fn drive(&mut self) {
        self.counters.timeout_batches = self.pipeline.batches_closed_by_timeout();
        let wakes = self.pipeline.take_wakes();
        if !wakes.uploader && !wakes.gc {
            return;
        }
        let mut data_objects = self.upload_all();
        // Each pass frees at least one object and, with no client writes in between,
        // creates no new garbage; this bound only guards against a bug.
        let mut guard = self.state().objects().len() + 2;
        while guard > 0 {
            guard -= 1;
            // hylog while it separates: victims by their live data's write rate.
            let rates = match &self.heat {
                Some(heat) if self.pipeline.gc_wants_write_rates() => {
                    let mut r = LiveWriteRates::default();
                    r.add_all(self.state(), heat);
                    Some(r)
                }
                _ => None,
            };
            let Some(pass) = self.pipeline.gc_plan_with_rates(rates.as_ref()) else {
                break;
            };
            let relocations = self.live_extents_of(&pass.victims);
            let choice = self
                .heat
                .as_ref()
                .map(|heat| hylog::choose(&heat.distribution(), gc::utilization(self.state())));
            let groups = gc::group_relocations_by_class(
                &relocations,
                self.cfg.batch_size_bytes,
                self.heat.as_ref().zip(choice.as_ref()),
            );
            let Some(first) = self.pipeline.gc_reserve(groups.len()) else {
                break;
            };
            if let Some(c) = choice {
                self.pipeline.set_gc_separating(c.separates());
                self.hot_fraction_sum += c.hot_fraction;
                self.counters.gc_separating_passes += u64::from(c.separates());
                if let Some(n) = self
                    .counters
                    .gc_class_passes
                    .get_mut(c.class_models().len() - 1)
                {
                    *n += 1;
                }
                self.hot_choice = Some(c);
                // Fresh client writes are split by the same classes until the next pass.
                if let Some(heat) = &self.heat {
                    self.pipeline
                        .set_batch_classes(RegionClasses::new(&c, heat));
                }
            }
            for (class, g) in &groups {
                let bytes = g.iter().map(|r| r.sectors).sum::<u64>() * SECTOR_BYTES;
                if class.is_hot() {
                    self.counters.gc_hot_bytes_moved += bytes;
                } else {
                    self.counters.gc_cold_bytes_moved += bytes;
                }
            }
            let last_record = self.state().last_record_seq();
            let objects = groups
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    let h = gc::gc_object_header(first + i as u64, last_record, &g.1);
                    (h.total_bytes(), h)
                })
                .collect();
            self.pipeline.gc_queue(objects);
            self.counters.gc_victims += pass.victims.len() as u64;
            self.counters.gc_passes += 1;
            data_objects += self.upload_all();
        }
        // Client batches GC let go of.
        data_objects += self.upload_all();
        self.pipeline.take_wakes();
        for _ in 0..data_objects.min(1) {
            let point = self.point();
            self.series.offer(|| point);
        }
    }

    /// Upload and apply everything the pipeline hands out, in order. Returns the
    /// number of data objects.
    /// The live extents of a pass's victims, planned from their headers' extents.
    fn live_extents_of(&mut self, victims: &BTreeSet<u64>) -> Vec<gc::Relocation> {
        let objects = self.pipeline.store().objects();
        if self.extents_of.len() > objects.len() + 64 {
            self.extents_of.retain(|seq, _| objects.contains_key(seq));
        }
        let mut relocations = Vec::new();
        for v in victims {
            let extents = self
                .extents_of
                .get(v)
                .expect("every data and GC object the simulator stored has its extents kept");
            gc_plan::live_extents_of_object(
                self.pipeline.store(),
                *v,
                extents.iter().copied(),
                &mut relocations,
            );
        }
        gc_plan::in_lba_order(&mut relocations);
        gc_plan::plug_holes(
            self.pipeline.store(),
            &mut relocations,
            self.cfg.gc.defrag_hole_bytes,
            self.cfg.gc.pass_bytes,
        );
        relocations
    }

    fn upload_all(&mut self) -> usize {
        let mut data_objects = 0;
        while let Some(u) = self.pipeline.next_upload(true) {
            match u {
                Upload::Data { seq, batch } => {
                    data_objects += 1;
                    let h = data_header(seq, &batch);
                    self.extents_of.insert(seq, h.extent_offsets().collect());
                    self.counters.coalesced_bytes += batch.client_bytes - batch.data_bytes;
                    self.counters.data_objects += 1;
                    self.counters.data_object_bytes += h.total_bytes();
                    self.pipeline.upload_done(seq, h);
                    self.apply_all();
                    self.note_peak();
                }
                Upload::Gc { seq, object } => {
                    self.extents_of
                        .insert(seq, object.extent_offsets().collect());
                    self.counters.gc_objects += 1;
                    self.counters.gc_object_bytes += object.total_bytes();
                    self.counters.gc_bytes_moved += object.data_bytes;
                    self.pipeline.upload_done(seq, object);
                    self.apply_all();
                    self.note_peak();
                }
                Upload::Checkpoint { seq, dead, .. } => {
                    self.write_checkpoint(seq, dead);
                }
            }
        }
        data_objects
    }

    fn point(&self) -> SeriesPoint {
        let c = &self.counters;
        SeriesPoint {
            client_write_bytes: c.client_write_bytes,
            store_write_bytes: c.store_write_bytes(),
            store_bytes: self.store_bytes(),
            live_bytes: self.live_bytes(),
            utilization: self.gc_utilization(),
            write_amplification: ratio(c.store_write_bytes(), c.client_write_bytes),
            gc_hot_fraction: self.hot_choice.map_or(0.0, |h| h.hot_fraction),
        }
    }

    /// Write checkpoint `seq` describing the state now, delete the objects the previous
    /// one left out, keep those it leaves out (`dead`) until the next, and keep the
    /// newest two checkpoints.
    fn write_checkpoint(&mut self, seq: u64, dead: Vec<(u64, ObjectKind)>) {
        let heat_bytes = self.heat.as_ref().map_or(0, HeatTracker::checkpoint_bytes);
        let (header_bytes, payload) = checkpoint_object_size(self.state(), heat_bytes);
        let total = header_bytes + payload;
        let h = {
            let mut h = header_without_data(
                ObjectKind::Checkpoint,
                seq,
                self.state().last_record_seq(),
                Vec::new(),
                Vec::new(),
            );
            (h.header_bytes, h.data_bytes) = (header_bytes as u32, payload);
            h
        };
        self.pipeline.upload_done(seq, h);
        self.apply_all();
        self.counters.checkpoint_objects += 1;
        self.counters.checkpoint_bytes += total;
        self.retained_checkpoints.insert(seq, total);
        self.note_peak();
        self.counters.deleted_objects += self.awaiting_delete.len() as u64;
        self.awaiting_delete.clear();
        for (d, kind) in dead {
            let bytes = self.state().objects().get(&d).map_or(0, |o| o.total_bytes);
            self.awaiting_delete.insert(d, (kind, bytes));
            self.pipeline.forget_object(d);
        }
        // Like the engine: delete every older checkpoint but the newest one.
        let older: Vec<u64> = self
            .retained_checkpoints
            .range(..seq)
            .map(|(&s, _)| s)
            .collect();
        for &old in older.iter().rev().skip(1) {
            self.retained_checkpoints.remove(&old);
            self.pipeline.forget_object(old);
        }
        self.pipeline.checkpoint_finished(seq);
    }

    /// Shut down like the engine: close the open batch (and run what that calls for),
    /// stop writes, then write a clean checkpoint. Idempotent.
    pub fn finish(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.close_batch();
        self.pipeline.stop_writes();
        self.drive();
        match self.pipeline.begin_clean_checkpoint() {
            Ok(Upload::Checkpoint { seq, dead, .. }) => self.write_checkpoint(seq, dead),
            Ok(other) => panic!("the pipeline handed out {other:?} for a clean checkpoint"),
            Err(e) => panic!("simulator did not drain: {e}"),
        }
        let end = self.point();
        self.series.push_final(end);
        if self.cfg.volume_size_bytes.is_none() {
            self.reported_volume_size_bytes =
                Some(self.counters.max_end_bytes.div_ceil(1 << 30).max(1) << 30);
        }
    }

    /// The summary (call [`finish`](Self::finish) first for the engine's end state).
    pub fn report(&self) -> VolumeReport {
        let c = self.counters;
        let extents = self.state().map().extent_count() as u64;
        VolumeReport {
            volume_size_bytes: self
                .reported_volume_size_bytes
                .unwrap_or(self.state().volume_size_bytes),
            counters: c,
            store_write_bytes: c.store_write_bytes(),
            write_amplification: ratio(c.store_write_bytes(), c.client_write_bytes),
            merge_ratio: ratio(c.coalesced_bytes, c.client_write_bytes),
            map_extents: extents,
            map_memory_bytes: extents * MAP_BYTES_PER_EXTENT,
            live_bytes: self.live_bytes(),
            final_store_bytes: self.store_bytes(),
            final_objects: (self.state().objects().len() + self.retained_checkpoints.len()) as u64,
            final_utilization: self.gc_utilization(),
            gc_hot_fraction_last: self.hot_choice.map_or(0.0, |h| h.hot_fraction),
            gc_hot_fraction_mean: if self.heat.is_some() && c.gc_passes > 0 {
                self.hot_fraction_sum / c.gc_passes as f64
            } else {
                0.0
            },
        }
    }
}

/// The header of data object `seq` made from `batch` (no data: sizes and map only).
fn data_header(seq: u64, batch: &Batch<RecordPos>) -> ObjectHeader {
    let mut h = header_without_data(
        ObjectKind::Data,
        seq,
        batch.last_record_seq,
        batch.object_extents(),
        batch.trims.clone(),
    );
    h.volume_size_bytes = batch.volume_size_bytes;
    h.parts_after = batch.parts_after;
    h
}
