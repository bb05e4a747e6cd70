//! The live engine: one open volume.
//!
//! ```text
//!  NBD tasks ──write/trim/flush──▶ [bounded queue] ──▶ log writer thread
//!                                                      │ group commit: one record,
//!                                                      │ one pwrite, one fdatasync
//!                                                      ▼
//!                                      log overlay map + batcher (under `state`)
//!                                                      │ closed batch
//!                                                      ▼
//!                                      uploader task: read batch data back from the
//!                                      log, PUT object (retry forever), apply objects
//!                                      in sequence order to the store map, free log
//!  NBD tasks ──read──▶ overlay map ▶ log │ store map ▶ ranged GET (chunk-verified) │ zeros
//! ```
//! Policy (maps, batching, recovery rules) lives in `lsvd-core`; this module is the
//! I/O around it.

#[cfg(test)]
mod checkpoint_tests;
pub mod config;
mod gc;
pub mod keys;
pub(crate) mod log_index;
#[cfg(test)]
mod log_index_tests;
pub mod log_space;
pub(crate) mod open;
mod read;
mod read_cache;
#[cfg(test)]
mod tests;
mod uploader;
pub(crate) mod volume_super;
#[cfg(test)]
mod volume_super_tests;
mod writer;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use lsvd_core::batcher::{Batch, Batcher};
use lsvd_core::extent_map::Location;
use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::checkpoint::Counters;
use lsvd_core::format::object::ObjectHeader;
use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_core::log_map::LogMap;
use lsvd_core::store_state::StoreState;

use crate::cache_dev::CacheDevice;
use crate::store::DynStore;
pub use config::{EngineConfig, RecoveryMode};
use log_space::LogSpace;
pub use open::{
    OpenReport, VolumeInfo, create_volume, inspect_volume, list_volumes, open_volume,
    open_volume_on, read_meta,
};

/// Where a batched extent's data sits in the write log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogPos {
    pub record_seq: u64,
    pub offset: u64,
}

impl Location for LogPos {
    fn advance(&self, sectors: u64) -> Self {
        LogPos {
            record_seq: self.record_seq,
            offset: self.offset + sectors * SECTOR_BYTES,
        }
    }
}

/// An object waiting to be uploaded, in sequence order.
#[derive(Debug)]
enum PendingObject {
    Data {
        seq: u64,
        batch: Batch<LogPos>,
    },
    /// Relocated data from a GC pass, already encoded.
    Gc {
        seq: u64,
        bytes: Vec<u8>,
    },
    Checkpoint {
        seq: u64,
    },
}

impl PendingObject {
    #[allow(dead_code)]
    fn seq(&self) -> u64 {
        match self {
            PendingObject::Data { seq, .. }
            | PendingObject::Gc { seq, .. }
            | PendingObject::Checkpoint { seq } => *seq,
        }
    }
}

/// Counters, readable without the state lock.
#[derive(Debug, Default)]
pub struct Stats {
    pub client_write_bytes: AtomicU64,
    pub client_read_bytes: AtomicU64,
    pub log_records: AtomicU64,
    pub log_syncs: AtomicU64,
    pub store_put_bytes: AtomicU64,
    pub store_puts: AtomicU64,
    pub store_put_retries: AtomicU64,
    pub store_gets: AtomicU64,
    pub objects_written: AtomicU64,
    pub checkpoints_written: AtomicU64,
    pub superblocks_written: AtomicU64,
    pub log_index_written: AtomicU64,
    pub log_index_skipped: AtomicU64,
    pub gc_passes: AtomicU64,
    pub gc_moved_bytes: AtomicU64,
    /// Bytes GC copied that a client overwrote (or trimmed) before the copy was
    /// applied: the copy was discarded (GC objects apply only where the map still
    /// points at their source).
    pub gc_superseded_bytes: AtomicU64,
    /// Bytes of victims' live data GC took from the read cache instead of a GET.
    pub gc_cache_read_bytes: AtomicU64,
    pub objects_deleted: AtomicU64,
    /// Iterations of the uploader loop (an idle volume must not spin).
    pub uploader_wakeups: AtomicU64,
}

pub(crate) struct State {
    log_map: LogMap,
    store: StoreState,
    log: LogSpace,
    batcher: Batcher<LogPos>,
    batch_opened_at: Option<Instant>,
    next_record_seq: u64,
    /// CRC of the newest record in the log, carried by the next one (hash chain).
    last_record_crc: u32,
    next_object_seq: u64,
    objects_since_checkpoint: u64,
    /// Headers of the records still in the log (from the tail), for the log index.
    log_headers: std::collections::VecDeque<(u64, lsvd_core::format::record::RecordHeader)>,
    /// Every record through this sequence number is synced to the cache device.
    log_synced_through: u64,
    /// Log bytes appended since the last write-log index.
    log_bytes_since_index: u64,
    log_index_generation: u64,
    /// When the newest checkpoint was queued (or the volume opened).
    last_checkpoint_queued_at: Instant,
    upload_queue: VecDeque<PendingObject>,
    uploads_in_flight: usize,
    /// A checkpoint is being taken, uploaded, named in a volume superblock, or is
    /// deleting what it made obsolete. One at a time, so superblocks name checkpoints
    /// in order and each deletes what the one before it left; the drain waits for it.
    checkpoint_in_progress: bool,
    completed: BTreeMap<u64, ObjectHeader>,
    /// The writer thread has stopped taking client I/O.
    writer_done: bool,
    /// Records through this sequence number may be freed once the cache superblock
    /// says so.
    freeable_through: u64,
    cache_super_generation: u64,
    /// Lifetime counters as of the checkpoint the volume was opened from.
    base_counters: Counters,
    /// Objects a GC pass is moving data out of; cleared once the checkpoint after
    /// the pass is durable and they are deleted.
    gc_busy: BTreeSet<u64>,
    /// The checkpoint that ends the current GC pass.
    gc_pass_checkpoint: Option<u64>,
    /// Closed client batches not yet numbered or queued: held back while the store is
    /// over its bound and GC catches up (`gc::release_held`).
    held: VecDeque<Batch<LogPos>>,
    /// Estimated bytes of each data and GC object queued, uploading, or uploaded but
    /// not yet applied, by sequence number.
    pending_bytes: BTreeMap<u64, u64>,
    /// GC wants to collect but finds no victims: holding client objects back would
    /// wait for nothing.
    gc_stalled: bool,
    /// A GC pass has taken sequence numbers for its objects and is encoding them:
    /// client batches wait unnumbered until they are queued.
    gc_encoding: bool,
}

impl State {
    /// Lifetime counters now: those loaded at open plus this session's.
    fn counters(&self, stats: &Stats) -> Counters {
        let b = self.base_counters;
        Counters {
            client_write_bytes: b.client_write_bytes
                + stats.client_write_bytes.load(Ordering::Relaxed),
            store_write_bytes: b.store_write_bytes + stats.store_put_bytes.load(Ordering::Relaxed),
            gc_passes: b.gc_passes + stats.gc_passes.load(Ordering::Relaxed),
            gc_moved_bytes: b.gc_moved_bytes + stats.gc_moved_bytes.load(Ordering::Relaxed),
        }
    }
}

pub(crate) struct Shared {
    pub meta: VolumeMeta,
    pub config: EngineConfig,
    pub store: DynStore,
    pub cache: Arc<dyn CacheDevice>,
    pub stats: Stats,
    state: Mutex<State>,
    /// Signalled when log space is freed.
    space_freed: Condvar,
    /// Wakes the uploader.
    upload_wake: tokio::sync::Notify,
    /// Wakes the garbage collector.
    gc_wake: tokio::sync::Notify,
    /// Serializes cache superblock writes.
    super_lock: Mutex<()>,
    /// The volume superblock generation this process wrote last (store side).
    volume_super: Mutex<lsvd_core::format::volume_super::VolumeSuper>,
    /// Serializes volume superblock writes after checkpoints.
    volume_super_writes: tokio::sync::Mutex<()>,
    /// Set once this process's generation is in the store; uploads wait for it.
    volume_claimed: AtomicBool,
    /// Recently read object chunks on local disk (None: disabled).
    read_cache: Option<read_cache::ReadCache>,
    /// Object headers cached for read verification.
    headers: read::HeaderCache,
    /// Set after an unrecoverable local I/O error; all later writes fail.
    failed: AtomicBool,
    log_start: u64,
    log_end: u64,
    /// Regions of the cache file (log, index slots).
    layout: log_index::CacheLayout,
    /// This open's write-log index epoch (in every cache superblock it writes).
    index_epoch: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is only mutated by code that does not panic mid-update; a poisoned
        // lock means a bug already reported by the panic, so keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fail(&self, why: &str) {
        if !self.failed.swap(true, Ordering::SeqCst) {
            crate::log::error(&format!(
                "volume {} failed: {why}; refusing further writes",
                self.meta.name
            ));
        }
    }
}

/// A point-in-time summary for `lsvd info` and metrics.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VolumeStatus {
    pub name: String,
    pub volume_id: String,
    pub size_bytes: u64,
    pub live_bytes: u64,
    pub store_bytes: u64,
    pub objects: u64,
    pub checkpoints: u64,
    pub next_object_seq: u64,
    pub last_record_seq_in_store: u64,
    pub log_used_bytes: u64,
    pub log_capacity_bytes: u64,
    pub map_extents: u64,
    pub log_map_extents: u64,
    pub uploads_pending: u64,
    /// Closed client batches waiting for GC to bring the store back under its bound
    /// (included in `uploads_pending`).
    pub uploads_held: u64,
    pub client_write_bytes: u64,
    pub store_put_bytes: u64,
    pub write_amplification: f64,
    pub lifetime_client_write_bytes: u64,
    pub lifetime_store_write_bytes: u64,
    pub gc_passes: u64,
    pub gc_moved_bytes: u64,
    /// A GC pass is under way: relocating, or waiting for its closing checkpoint.
    pub gc_pass_in_flight: bool,
    /// This session's GC copies superseded by client writes (see `Stats`).
    pub gc_superseded_bytes: u64,
    /// This session's GC reads served by the read cache (see `Stats`).
    pub gc_cache_read_bytes: u64,
    pub utilization: f64,
    pub read_cache_hits: u64,
    pub read_cache_misses: u64,
    pub read_cache_entries: u64,
}

pub struct Volume {
    shared: Arc<Shared>,
    log_tx: tokio::sync::mpsc::Sender<writer::LogOp>,
    writer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    uploader: Mutex<Option<tokio::task::JoinHandle<()>>>,
    gc: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "volume is shutting down")
}

impl Volume {
    pub fn meta(&self) -> &VolumeMeta {
        &self.shared.meta
    }

    pub fn size_bytes(&self) -> u64 {
        self.shared.meta.size_bytes
    }

    fn check_range(&self, offset: u64, len: u64) -> io::Result<()> {
        let size = self.size_bytes();
        if !offset.is_multiple_of(SECTOR_BYTES) || !len.is_multiple_of(SECTOR_BYTES) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "request not aligned to 512 bytes",
            ));
        }
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "request beyond end of volume",
            ));
        }
        Ok(())
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.shared.failed.load(Ordering::SeqCst) {
            return Err(io::Error::other("volume failed after a local I/O error"));
        }
        Ok(())
    }

    async fn submit(
        &self,
        op: writer::LogOp,
        rx: tokio::sync::oneshot::Receiver<io::Result<()>>,
    ) -> io::Result<()> {
        self.log_tx.send(op).await.map_err(|_| closed())?;
        rx.await.map_err(|_| closed())?
    }

    /// Write `data` at byte `offset`. Returns once the record is in the log (and
    /// durable, with `fua`).
    pub async fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> io::Result<()> {
        self.check_range(offset, data.len() as u64)?;
        self.check_writable()?;
        if data.is_empty() {
            return if fua { self.flush().await } else { Ok(()) };
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(
            writer::LogOp::Write {
                lba: offset / SECTOR_BYTES,
                data,
                fua,
                done: tx,
            },
            rx,
        )
        .await
    }

    /// Make the range read as zeros (TRIM and WRITE_ZEROES).
    pub async fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> io::Result<()> {
        self.check_range(offset, len)?;
        self.check_writable()?;
        if len == 0 {
            return if fua { self.flush().await } else { Ok(()) };
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let op = writer::LogOp::Zero {
            lba: offset / SECTOR_BYTES,
            sectors: len / SECTOR_BYTES,
            fua,
            done: tx,
        };
        self.submit(op, rx).await
    }

    /// Make every write acknowledged before this call durable on the cache device.
    pub async fn flush(&self) -> io::Result<()> {
        self.check_writable()?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(writer::LogOp::Flush { done: tx }, rx).await
    }

    pub async fn read(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        self.check_range(offset, len)?;
        read::read(&self.shared, offset / SECTOR_BYTES, len / SECTOR_BYTES).await
    }

    /// Allocation of `[offset, offset+len)`: runs of (bytes, allocated).
    pub fn allocation(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, bool)>> {
        self.check_range(offset, len)?;
        Ok(read::allocation(
            &self.shared,
            offset / SECTOR_BYTES,
            len / SECTOR_BYTES,
        ))
    }

    /// Test probe: run `f` under the state lock with (live bytes, stored bytes of data
    /// and GC objects as the engine accounts them, bytes of objects on their way, a
    /// description of the GC state).
    #[cfg(test)]
    pub(crate) fn with_accounting<T>(&self, f: impl FnOnce(u64, u64, u64, String) -> T) -> T {
        let st = self.shared.lock();
        let pending: u64 = st.pending_bytes.values().sum();
        let what = format!(
            "pending {:?}, held {}, gc_busy {:?}, gc_stalled {}, gc_encoding {}, gc_pass_checkpoint {:?}",
            st.pending_bytes,
            st.held.len(),
            st.gc_busy,
            st.gc_stalled,
            st.gc_encoding,
            st.gc_pass_checkpoint
        );
        f(
            st.store.live_bytes(),
            st.store.stored_bytes(),
            pending,
            what,
        )
    }

    pub fn status(&self) -> VolumeStatus {
        let st = self.shared.lock();
        let stats = &self.shared.stats;
        let client = stats.client_write_bytes.load(Ordering::Relaxed);
        let put = stats.store_put_bytes.load(Ordering::Relaxed);
        let counters = st.counters(stats);
        VolumeStatus {
            name: self.shared.meta.name.clone(),
            volume_id: self.shared.meta.volume.to_string(),
            size_bytes: self.shared.meta.size_bytes,
            live_bytes: st.store.live_bytes(),
            store_bytes: st.store.stored_bytes(),
            objects: st.store.objects().len() as u64,
            checkpoints: st.store.checkpoints().len() as u64,
            next_object_seq: st.store.next_object_seq(),
            last_record_seq_in_store: st.store.last_record_seq(),
            log_used_bytes: st.log.used_bytes(),
            log_capacity_bytes: st.log.capacity_bytes(),
            map_extents: st.store.map().extent_count() as u64,
            log_map_extents: st.log_map.extent_count() as u64,
            uploads_pending: (st.upload_queue.len()
                + st.uploads_in_flight
                + st.completed.len()
                + usize::from(st.store.applying_seq().is_some())
                + st.held.len()) as u64,
            uploads_held: st.held.len() as u64,
            client_write_bytes: client,
            store_put_bytes: put,
            write_amplification: if client == 0 {
                0.0
            } else {
                put as f64 / client as f64
            },
            lifetime_client_write_bytes: counters.client_write_bytes,
            lifetime_store_write_bytes: counters.store_write_bytes,
            gc_passes: counters.gc_passes,
            gc_moved_bytes: counters.gc_moved_bytes,
            gc_pass_in_flight: !st.gc_busy.is_empty(),
            gc_superseded_bytes: stats.gc_superseded_bytes.load(Ordering::Relaxed),
            gc_cache_read_bytes: stats.gc_cache_read_bytes.load(Ordering::Relaxed),
            utilization: lsvd_core::gc::utilization(&st.store),
            read_cache_hits: self
                .shared
                .read_cache
                .as_ref()
                .map_or(0, |r| r.hits.load(Ordering::Relaxed)),
            read_cache_misses: self
                .shared
                .read_cache
                .as_ref()
                .map_or(0, |r| r.misses.load(Ordering::Relaxed)),
            read_cache_entries: self
                .shared
                .read_cache
                .as_ref()
                .map_or(0, |r| r.entries() as u64),
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Simulate a process crash: stop uploading and refuse all further I/O at once,
    /// without draining anything. For in-process crash tests; the volume must then be
    /// dropped and reopened from its store and cache device.
    pub fn crash(&self) {
        self.shared.fail("simulated crash");
        if let Some(u) = self
            .uploader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            u.abort();
        }
        if let Some(g) = self.gc.lock().unwrap_or_else(|p| p.into_inner()).take() {
            g.abort();
        }
    }

    /// The store map as (lba, sectors, object seq, byte offset), for tests and the
    /// simulator equivalence check.
    pub fn store_map_snapshot(&self) -> Vec<(u64, u64, u64, u64)> {
        let st = self.shared.lock();
        st.store
            .map()
            .iter()
            .map(|p| (p.lba, p.sectors, p.location.object_seq, p.location.offset))
            .collect()
    }

    /// Drain writes, upload everything, write a clean checkpoint and mark the cache
    /// clean. Safe to call more than once.
    pub async fn shutdown(&self) -> io::Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self
            .log_tx
            .send(writer::LogOp::Shutdown { done: tx })
            .await
            .is_ok()
        {
            let _ = rx.await;
        }
        let thread = self
            .writer_thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(t) = thread {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        let gc = self.gc.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(g) = gc {
            self.shared.gc_wake.notify_one();
            let _ = g.await;
        }
        self.shared.upload_wake.notify_one();
        let uploader = self
            .uploader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(u) = uploader {
            let _ = u.await;
        }
        if self.shared.failed.load(Ordering::SeqCst) {
            return Err(io::Error::other("volume failed; not marked clean"));
        }
        uploader::write_clean_checkpoint(&self.shared).await?;
        if let Some(rc) = &self.shared.read_cache
            && let Err(e) = rc.save(self.shared.meta.volume)
        {
            crate::log::warn(&format!("could not save the read-cache index: {e}"));
        }
        Ok(())
    }
}
