//! What the tasks of one open volume share: the state behind one lock, the devices,
//! the counters, and the wake-ups between tasks.
//!
//! ```text
//!   Shared ── state: Mutex<State> ── pipeline (lsvd_core::pipeline): batches, sequence
//!          │                       │   numbers, upload queue, apply order, GC passes,
//!          │                       │   checkpoint cadence, the store state (map)
//!          │                       ├─ log_map: LBA → write-log position (overlay)
//!          │                       └─ the write log: space, record chain, index
//!          ├─ store, cache device, read cache, object header cache
//!          └─ upload_wake / gc_wake / space_freed: wake-ups between tasks
//! ```
//!
//! I/O is never done while holding the state lock. [`Shared::lock`] returns a guard
//! that, when released, wakes the tasks the pipeline asked for: every change to the
//! pipeline's state reaches the uploader and the GC without each caller remembering
//! to notify them.

/// How a failure caused by a poisoned lock begins: the panic that poisoned it is the
/// real cause ([`Shared::fail_by_panic`]).
const POISONED: &str = "a thread panicked while holding the volume's";

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use lsvd_core::extent_map::Location;
use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::checkpoint::Counters;
use lsvd_core::format::object::ObjectKind;
use lsvd_core::format::record::RecordHeader;
use lsvd_core::format::volume_meta::VolumeMeta;
use lsvd_core::format::volume_super::VolumeSuper;
use lsvd_core::log_map::LogMap;
use lsvd_core::pipeline::Pipeline;

use crate::cache_dev::CacheDevice;
use crate::cache_layout::CacheLayout;
use crate::config::EngineConfig;
use crate::locks::{LockRank, Ranked};
use crate::read::cache::ReadCache;
use crate::write::log_space::LogSpace;
use lsvd_store::DynStore;
use lsvd_store::clock::{Clock, now_ns};

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

/// Object headers kept for verifying reads (their chunk checksums), per volume.
pub(crate) type HeaderCache =
    Mutex<std::collections::HashMap<u64, Arc<lsvd_core::format::object::ObjectHeader>>>;

/// The engine's pipeline: batches locate their data in the write log; GC objects wait
/// for upload already encoded.
pub(crate) type EnginePipeline = Pipeline<LogPos, bytes::Bytes>;

/// Objects being copied into the read cache at once, at most (each holds up to a batch
/// of memory until it is written).
pub(crate) const MAX_PENDING_ADMISSIONS: usize = 8;

/// Counters, readable without the state lock.
#[derive(Debug, Default)]
pub struct Stats {
    pub client_write_bytes: AtomicU64,
    pub client_read_bytes: AtomicU64,
    pub log_records: AtomicU64,
    /// Times a runtime thread left started operations to the log writer thread (a
    /// FLUSH or FUA at the head of the queue, a full log, writes in flight:
    /// `crate::write::started`).
    pub log_handoffs: AtomicU64,
    pub log_syncs: AtomicU64,
    /// Bytes of records written to the write log (headers, padding and data).
    pub log_write_bytes: AtomicU64,
    pub store_put_bytes: AtomicU64,
    pub store_puts: AtomicU64,
    pub store_put_retries: AtomicU64,
    pub store_gets: AtomicU64,
    /// Bytes those GETs returned (object data and headers, for reads, read-ahead and
    /// GC; copies fetched from a chain's other drives are not counted).
    pub store_get_bytes: AtomicU64,
    /// GETs that failed after the store client's own retries.
    pub store_get_failures: AtomicU64,
    /// Reads whose first copy failed its checksums and that a store's other copy
    /// answered (a mirrored chain, [`crate::read`]).
    pub copy_fallbacks: AtomicU64,
    /// Rewrites of bad copies from a verified good one, running in the background.
    pub copy_repairs: Arc<CopyRepairs>,
    pub objects_written: AtomicU64,
    pub checkpoints_written: AtomicU64,
    pub superblocks_written: AtomicU64,
    pub log_index_written: AtomicU64,
    pub log_index_skipped: AtomicU64,
    /// Write-log records that failed verification when read back for upload (the
    /// cache device changed them after the write); each fails the volume.
    pub log_records_corrupt: AtomicU64,
    /// Records an upload read back from the write log because they were no longer
    /// (or never) in memory (`crate::write::recent_records`).
    pub log_records_read_back: AtomicU64,
    pub gc_passes: AtomicU64,
    /// GC passes given up (a victim could not be read, say) and tried again later.
    pub gc_passes_failed: AtomicU64,
    pub gc_moved_bytes: AtomicU64,
    /// hylog (this session): bytes GC put into hot and into cold GC objects, and the
    /// hot fraction the latest pass chose, in millionths.
    pub gc_hot_moved_bytes: AtomicU64,
    pub gc_cold_moved_bytes: AtomicU64,
    pub gc_hot_fraction_ppm: AtomicU64,
    /// Bytes GC copied that a client overwrote (or trimmed) before the copy was
    /// applied: the copy was discarded (GC objects apply only where the map still
    /// points at their source).
    pub gc_superseded_bytes: AtomicU64,
    /// Bytes of victims' live data GC took from the read cache instead of a GET.
    pub gc_cache_read_bytes: AtomicU64,
    /// Bytes defragmenting GC planned to move from outside its victims, to plug the
    /// gaps between what it moves (`GcConfig::defrag_hole_bytes`).
    pub gc_defrag_bytes: AtomicU64,
    pub objects_deleted: AtomicU64,
    /// Deletes of dead objects the store refused or failed (each retried later).
    pub object_deletes_failed: AtomicU64,
    /// Deletes put off because a replication pass under way still needs the object or
    /// checkpoint (`crate::maintenance::replica_hold`); each is tried again after the next
    /// checkpoint, so one object may count several times.
    pub replica_held_deletes: AtomicU64,
    /// Iterations of the uploader loop (an idle volume must not spin).
    pub uploader_wakeups: AtomicU64,
    /// Iterations of the GC loop (likewise).
    pub gc_wakeups: AtomicU64,
    /// Uploaded objects not admitted to the read cache because too many admissions
    /// were pending.
    pub admissions_skipped: AtomicU64,
    /// Times a client write found the write log full and had to wait for uploads to
    /// free space (one per episode, not per write).
    pub log_full_waits: AtomicU64,
    /// True while a write waits for space in a full write log.
    pub log_full: std::sync::atomic::AtomicBool,
    /// Writes that waited for space longer than the stall timeout and failed (or
    /// found the log still stalled and failed at once).
    pub log_full_failures: AtomicU64,
    /// True from a write's stall timeout until the log has room again: writes that
    /// find no room fail at once instead of waiting.
    pub log_stalled: AtomicBool,
    /// True while the store refuses uploads because it is full (ENOSPC, a quota)...
    pub store_full: AtomicBool,
    /// ...or refuses the credentials (401/403).
    pub store_denied: AtomicBool,
    /// Episodes of each (a refusal after the store had taken an upload).
    pub store_full_episodes: AtomicU64,
    pub store_denied_episodes: AtomicU64,
}

impl Stats {
    /// The store refused an upload with `kind` (`Full` or `Denied`): set its gauge.
    /// True when this starts an episode (say so once).
    pub(crate) fn note_store_refusal(&self, kind: lsvd_core::error::ErrorKind) -> bool {
        let (flag, episodes) = match kind {
            lsvd_core::error::ErrorKind::Full => (&self.store_full, &self.store_full_episodes),
            _ => (&self.store_denied, &self.store_denied_episodes),
        };
        let new = !flag.swap(true, Ordering::SeqCst);
        if new {
            episodes.fetch_add(1, Ordering::Relaxed);
        }
        new
    }

    /// An upload landed: the store takes objects again.
    pub(crate) fn note_store_healthy(&self) {
        let was_full = self.store_full.swap(false, Ordering::SeqCst);
        let was_denied = self.store_denied.swap(false, Ordering::SeqCst);
        if was_full || was_denied {
            lsvd_store::log::info("the store takes uploads again");
        }
    }
}

/// Repairs of bad copies of objects (shared with the tasks that run them).
#[derive(Debug, Default)]
pub struct CopyRepairs {
    /// Keys of the objects being repaired now (bounded: a read that finds too many
    /// running, or its object's already, leaves its repair to that or a later read).
    pub running: Mutex<std::collections::HashSet<String>>,
    /// Copies rewritten from a verified good copy.
    pub copies_rewritten: AtomicU64,
}

/// The state behind the lock.
pub(crate) struct State {
    /// LBA → write-log position of the newest data the write log holds, applied to
    /// the store or not: entries go when their record is freed (`crate::write::log_tail`).
    pub(crate) log_map: LogMap,
    /// Batching, numbering, uploads, apply order, GC passes; owns the store state.
    pub(crate) pipeline: EnginePipeline,
    /// Space of the circular write log.
    pub(crate) log: LogSpace,
    pub(crate) next_record_seq: u64,
    /// CRC of the newest record in the log, carried by the next one (hash chain).
    pub(crate) last_record_crc: u32,
    /// Headers of the records still in the log (from the tail), for the log index.
    pub(crate) log_headers: VecDeque<(u64, RecordHeader)>,
    /// The newest records as written, for the upload (bounded).
    pub(crate) recent_records: crate::write::recent_records::RecentRecords,
    /// Every record through this sequence number is synced to the cache device.
    pub(crate) log_synced_through: u64,
    /// Applied records through this one were classified by the free-space policy
    /// (`apply::apply_ready`): kept for reads, or freed once the tail is written.
    pub(crate) log_classified_through: u64,
    /// Records through this one are being freed (their tail write is under way).
    pub(crate) log_freeing_through: u64,
    /// Log bytes appended since the last write-log index.
    pub(crate) log_bytes_since_index: u64,
    pub(crate) log_index_generation: u64,
    pub(crate) cache_super_generation: u64,
    /// Lifetime counters as of the checkpoint the volume was opened from.
    pub(crate) base_counters: Counters,
    /// Write frequencies per region, kept when the GC policy uses them (hylog): fed
    /// by every client write, read by each GC pass, saved in every checkpoint and
    /// restored at open.
    pub(crate) heat: Option<lsvd_core::heat::HeatTracker>,
}

impl State {
    /// Lifetime counters now: those loaded at open plus this session's.
    pub(crate) fn counters(&self, stats: &Stats) -> Counters {
        let b = self.base_counters;
        Counters {
            client_write_bytes: b.client_write_bytes
                + stats.client_write_bytes.load(Ordering::Relaxed),
            store_write_bytes: b.store_write_bytes + stats.store_put_bytes.load(Ordering::Relaxed),
            gc_passes: b.gc_passes + stats.gc_passes.load(Ordering::Relaxed),
            gc_moved_bytes: b.gc_moved_bytes + stats.gc_moved_bytes.load(Ordering::Relaxed),
            gc_hot_moved_bytes: b.gc_hot_moved_bytes
                + stats.gc_hot_moved_bytes.load(Ordering::Relaxed),
            gc_cold_moved_bytes: b.gc_cold_moved_bytes
                + stats.gc_cold_moved_bytes.load(Ordering::Relaxed),
        }
    }
}

pub(crate) struct Shared {
    pub meta: VolumeMeta,
    /// The size client I/O is held to, in bytes: the store's (the metadata holds the
    /// size at creation; `lsvd resize` changes it, [`crate::lifecycle::resize`]). While a resize
    /// is in progress it is the smaller of the old and new sizes.
    pub(crate) size_bytes: AtomicU64,
    /// Serializes resizes.
    pub(crate) resizing: tokio::sync::Mutex<()>,
    pub config: EngineConfig,
    pub store: DynStore,
    pub cache: Arc<dyn CacheDevice>,
    pub stats: Stats,
    pub(crate) state: Mutex<State>,
    /// Signalled when log space is freed.
    pub(crate) space_freed: Condvar,
    /// A panic a test injected at a named point (`supervise`).
    #[cfg(test)]
    pub(crate) injected_panic: Mutex<Option<&'static str>>,
    /// Wakes the uploader.
    pub(crate) upload_wake: tokio::sync::Notify,
    /// Wakes the garbage collector.
    pub(crate) gc_wake: tokio::sync::Notify,
    /// Signalled whenever an upload lands: uploads waiting out a retry backoff try
    /// again at once (`crate::write::put`), since the store is taking PUTs.
    pub(crate) put_landed: tokio::sync::Notify,
    /// Serializes cache superblock and write-log index writes (they share a sync).
    pub(crate) super_lock: Mutex<()>,
    /// The volume superblock generation this process wrote last (store side).
    pub(crate) volume_super: Mutex<VolumeSuper>,
    /// Serializes volume superblock writes after checkpoints.
    pub(crate) volume_super_writes: tokio::sync::Mutex<()>,
    /// Objects the newest named checkpoint left out (no live data), deleted from the
    /// store only once the next checkpoint is named: the previous checkpoint, which
    /// recovery falls back to when the newest is corrupt, may still list them.
    pub(crate) deferred_deletes: Mutex<Vec<DeferredDelete>>,
    /// What the volume's snapshots keep in the store: every delete asks it first.
    pub(crate) pins: Mutex<crate::maintenance::pins::Pins>,
    /// What replication passes under way keep in the store, as read after the latest
    /// checkpoint was named (`crate::maintenance::replica_hold`).
    pub(crate) replica_holds: Mutex<crate::maintenance::replica_hold::HoldState>,
    /// Held while objects are deleted after a checkpoint and while a snapshot chooses
    /// its checkpoint and records its pin ([`crate::lifecycle::snapshot`]).
    pub(crate) deletions: tokio::sync::Mutex<()>,
    /// Set when this is a read-only export of snapshot `<volume>@<name>`: nothing is
    /// written, uploaded, collected or deleted.
    pub(crate) snapshot: Option<String>,
    /// The ancestors that own the objects below this clone's start (empty unless the
    /// volume is a clone, [`crate::lifecycle::clone`]).
    pub(crate) lineage: crate::lifecycle::lineage::Lineage,
    /// Set once this process's generation is in the store; uploads wait for it.
    pub(crate) volume_claimed: AtomicBool,
    /// The epoch of this process's claim: every object it writes carries it in its
    /// name and header (`lsvd_core::history`). 0 until claimed (and for a snapshot
    /// export, which writes nothing).
    pub(crate) epoch: AtomicU64,
    /// The volume's lease: whether requests may be answered (`crate::fencing::lease`).
    pub(crate) lease: crate::fencing::lease::Lease,
    /// Recently read object chunks on local disk (None: disabled).
    pub(crate) read_cache: Option<ReadCache>,
    /// Uploaded data goes into the read cache too (`EngineConfig::read_cache_admit`).
    pub(crate) admit_uploads: bool,
    /// Admissions being written (each holds its object's bytes): past
    /// [`MAX_PENDING_ADMISSIONS`] the next one is skipped rather than queued (the read
    /// cache is a cache; uploads must not wait for it).
    pub(crate) admissions_pending: std::sync::atomic::AtomicUsize,
    /// Object headers cached for read verification.
    pub(crate) headers: HeaderCache,
    /// Set after an unrecoverable local I/O error; all later writes fail.
    pub(crate) failed: AtomicBool,
    /// Why the volume failed (the first reason given to [`Shared::fail`]).
    pub(crate) failure: Mutex<Option<String>>,
    pub(crate) log_start: u64,
    pub(crate) log_end: u64,
    /// Regions of the cache file (log, index slots).
    pub(crate) layout: CacheLayout,
    /// This open's write-log index epoch (in every cache superblock it writes).
    pub(crate) index_epoch: u64,
    /// The write log is encrypted with the local key of this id (`--encrypt-local`;
    /// in every cache superblock written).
    pub(crate) local_key_id: Option<[u8; 8]>,
    /// State of the upload retries' jitter (seeded: `EngineConfig::jitter_seed`).
    pub(crate) jitter: Mutex<lsvd_trace::synthetic::prng::Rng>,
    /// The runtime the volume was opened on. Tasks the volume starts on behalf of a
    /// client request (read-ahead, repairs) go here, whichever thread the request
    /// came from: an NBD connection's own runtime ends with the connection.
    pub(crate) runtime: tokio::runtime::Handle,
}

impl Shared {
    /// The store key of object `seq` written under `epoch`: this volume's, or the
    /// ancestor's that owns it.
    pub(crate) fn object_key(
        &self,
        seq: u64,
        epoch: u64,
        kind: lsvd_core::format::object::ObjectKind,
    ) -> String {
        let owner = self
            .lineage
            .owner(seq)
            .map_or(self.meta.name.as_str(), |a| a.name.as_str());
        crate::keys::object_key(owner, seq, epoch, kind)
    }

    /// The epoch this process writes objects under.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// The volume id object `seq`'s header carries.
    pub(crate) fn volume_of(&self, seq: u64) -> lsvd_core::format::VolumeId {
        self.lineage
            .owner(seq)
            .map_or(self.meta.volume, |a| a.volume)
    }

    /// How the read cache names object `seq` of `epoch`: by its owner, so a clone
    /// and its base (and a snapshot export) share cached chunks.
    pub(crate) fn cache_object(&self, seq: u64, epoch: u64) -> crate::read::cache::CacheObject {
        crate::read::cache::CacheObject::new(self.volume_of(seq), seq, epoch)
    }

    /// Does this volume own object `seq` (may it delete it)? A clone shares its
    /// ancestors' objects and never deletes them.
    pub(crate) fn owns(&self, seq: u64) -> bool {
        self.lineage.owner(seq).is_none()
    }

    /// Take the state lock. Released with the guard, which then wakes what the
    /// pipeline asked for.
    pub(crate) fn lock(&self) -> StateGuard<'_> {
        // A poisoned lock: a thread panicked while holding it, and the state may be
        // half-updated. Fail the volume (requests get EIO, nothing more is uploaded or
        // marked clean); the guard is still given so the failure path can run.
        crate::locks::enter(LockRank::State);
        let guard = self.state.lock().unwrap_or_else(|p| {
            self.fail(&format!("{POISONED} state lock"));
            p.into_inner()
        });
        StateGuard {
            shared: self,
            guard: Some(guard),
        }
    }

    /// Take `m`, one of this volume's mutexes, of rank `rank` in the lock order
    /// (`crate::locks`: checked in debug builds). A poisoned one fails the volume.
    pub(crate) fn lock_ranked<'a, T>(&self, m: &'a Mutex<T>, rank: LockRank) -> Ranked<'a, T> {
        crate::locks::enter(rank);
        let guard = m.lock().unwrap_or_else(|p| {
            if rank != LockRank::Failure {
                self.fail(&format!("{POISONED} {} lock", rank.name()));
            }
            p.into_inner()
        });
        Ranked::new(guard, rank)
    }

    pub(crate) fn clock(&self) -> &dyn Clock {
        &*self.config.clock
    }

    /// Now, in the pipeline's nanoseconds.
    pub(crate) fn now_ns(&self) -> u64 {
        now_ns(self.clock())
    }

    pub(crate) fn is_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    pub(crate) fn fail(&self, why: &str) {
        self.fail_because(why, false);
    }

    /// Fail the volume because one of its tasks panicked (`why` names the panic). The
    /// panic is the cause: it replaces a reason recorded only as its consequence (a
    /// task that took the lock the panicking one poisoned may see that first).
    pub(crate) fn fail_by_panic(&self, why: &str) {
        self.fail_because(why, true);
    }

    fn fail_because(&self, why: &str, panic: bool) {
        {
            let mut failure = self.lock_ranked(&self.failure, LockRank::Failure);
            let consequence = failure.as_deref().is_some_and(|f| f.starts_with(POISONED));
            if failure.is_none() || (panic && consequence) {
                *failure = Some(why.to_string());
            }
        }
        if !self.failed.swap(true, Ordering::SeqCst) {
            lsvd_store::log::error(&format!(
                "volume {} failed: {why}; refusing further writes",
                self.meta.name
            ));
        }
    }

    /// Why the volume failed, if it did.
    pub(crate) fn failure(&self) -> Option<String> {
        self.lock_ranked(&self.failure, LockRank::Failure).clone()
    }

    /// The error requests get once the volume has failed (`VolumeFailed`, EIO to
    /// clients), naming why.
    pub(crate) fn failed_error(&self) -> lsvd_core::error::Error {
        let why = self
            .failure()
            .unwrap_or_else(|| "an earlier local I/O error".to_string());
        lsvd_core::error::Error::new(
            lsvd_core::error::ErrorKind::VolumeFailed,
            format!("volume {} failed: {why}", self.meta.name),
        )
    }

    /// A uniform random fraction in [0, 1), from the seeded jitter generator.
    pub(crate) fn jitter_fraction(&self) -> f64 {
        let mut rng = self.lock_ranked(&self.jitter, LockRank::Jitter);
        (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What names an object besides its sequence number: its kind and the epoch it was
/// written under (`Shared::object_key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ObjectTag {
    pub kind: ObjectKind,
    pub epoch: u64,
}

impl ObjectTag {
    pub(crate) fn of(o: &lsvd_core::store_state::ObjectInfo) -> ObjectTag {
        ObjectTag {
            kind: o.kind,
            epoch: o.epoch,
        }
    }
}

/// An object a checkpoint left out, waiting in the store for the next checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeferredDelete {
    pub seq: u64,
    pub epoch: u64,
    pub kind: ObjectKind,
    pub total_bytes: u64,
    /// The checkpoint that left it out: deleted once a later one is named.
    pub left_out_by: u64,
}

/// The state lock, held. Dropping it delivers the pipeline's wake-ups.
pub(crate) struct StateGuard<'a> {
    shared: &'a Shared,
    /// Always `Some` but while waiting on the space condition variable.
    guard: Option<MutexGuard<'a, State>>,
}

impl StateGuard<'_> {
    fn deliver_wakes(&mut self) {
        if let Some(g) = self.guard.as_mut() {
            let wakes = g.pipeline.take_wakes();
            if wakes.uploader {
                self.shared.upload_wake.notify_one();
            }
            if wakes.gc {
                self.shared.gc_wake.notify_one();
            }
        }
    }

    /// Release the lock until log space is freed or `timeout` passes (real time: a
    /// poll, not a timer), then take it again.
    pub(crate) fn wait_for_space(mut self, timeout: Duration) -> Self {
        self.deliver_wakes();
        if let Some(g) = self.guard.take() {
            let g = self
                .shared
                .space_freed
                .wait_timeout(g, timeout)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
            self.guard = Some(g);
        }
        self
    }
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.guard.as_ref().expect("the guard holds the lock")
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.guard.as_mut().expect("the guard holds the lock")
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        self.deliver_wakes();
        // The lock itself is let go right after, when `guard` drops.
        crate::locks::leave(LockRank::State);
    }
}
