//! An open volume, as its users see it: write, read, flush, trim, status, shutdown.
//!
//! Requests are checked here (range, alignment, a failed volume) and handed to the
//! tasks that do the work: writes, trims and flushes to the log writer thread
//! ([`crate::write::writer`]) through a bounded queue, reads to [`crate::read`]. Shutdown
//! drains the writer, waits for the GC and the uploader to finish, and writes a clean
//! checkpoint ([`crate::maintenance::checkpoint::write_clean`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::volume_meta::VolumeMeta;

use crate::maintenance::checkpoint;
use crate::read;
use crate::shared::{Shared, Stats};
use crate::write::started::LogWriter;
use crate::write::{log_order, writer};
use lsvd_core::error::{Error, ErrorKind, Result};

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
    /// Write-log bytes of records not in the store yet (uploading or waiting to), or
    /// applied but not yet kept or freed by the log (so 0 means nothing is pending).
    pub log_used_bytes: u64,
    /// Write-log bytes of uploaded records kept to serve reads, freed as the log
    /// needs the space (`EngineConfig::log_free_target_bytes`).
    pub log_retained_bytes: u64,
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
    /// Of `gc_moved_bytes` (lifetime, checkpointed): what hylog moved as hot, as cold.
    pub gc_hot_moved_bytes: u64,
    pub gc_cold_moved_bytes: u64,
    /// hylog: client batches this session wrote as several data objects, one per
    /// heat class.
    pub batches_split: u64,
    /// Bytes of write-log records held in memory for the upload (bounded by
    /// `EngineConfig::upload_memory_bytes`).
    pub upload_memory_bytes: u64,
    /// A GC pass is under way: relocating, or waiting for its closing checkpoint.
    pub gc_pass_in_flight: bool,
    /// This session's GC copies superseded by client writes (see `Stats`).
    pub gc_superseded_bytes: u64,
    /// This session's GC reads served by the read cache (see `Stats`).
    pub gc_cache_read_bytes: u64,
    /// This session's bytes moved by defragmenting GC to plug gaps (see `Stats`).
    pub gc_defrag_bytes: u64,
    /// Live bytes over stored bytes of the objects the volume owns: what GC weighs (a
    /// clone's ancestors' objects, which `live_bytes` and `store_bytes` count, are left
    /// out: `StoreState::set_shared_below`).
    pub utilization: f64,
    /// Why the volume failed (it takes no more writes), if it did.
    pub failure: Option<String>,
    pub read_cache_hits: u64,
    pub read_cache_misses: u64,
    pub read_cache_entries: u64,
    /// Chunks of uploaded objects copied into the read cache.
    pub read_cache_admitted_chunks: u64,
    /// Bytes cached before any client asked for them (the rest of a miss's fetch,
    /// read-ahead), and of those, bytes of chunks a client then read.
    pub read_prefetch_bytes: u64,
    pub read_prefetch_hit_bytes: u64,
    /// Bytes read-ahead fetched for sequential readers: by LBA, and by place in an
    /// object (temporal read-ahead, also counted here).
    pub read_ahead_bytes: u64,
    /// Of those, bytes temporal read-ahead fetched: the next data of objects.
    pub read_ahead_temporal_bytes: u64,
}

/// The lease of an open volume (`engine::lease`), for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseStatus {
    /// The volume keeps a lease (`lsvd serve` always does).
    pub enabled: bool,
    /// It may answer requests now.
    pub held: bool,
    /// Another process took the volume over: every request fails.
    pub fenced: bool,
    /// This open took the volume over from a holder whose lease lapsed.
    pub took_over: bool,
    /// The epoch of this process's claim.
    pub epoch: u64,
    pub renewals: u64,
    pub renewal_failures: u64,
    /// Episodes in which acknowledgements waited for a renewal.
    pub expiries: u64,
}

/// What [`Volume::start_write`] and its kin call with a request's result.
pub type Answer = Box<dyn FnOnce(Result<()>) + Send>;

pub struct Volume {
    pub(crate) shared: Arc<Shared>,
    pub(crate) log_tx: tokio::sync::mpsc::Sender<writer::LogOp>,
    /// Operations the NBD server starts, and the appender (`crate::write::started`).
    pub(crate) log_writer: Arc<LogWriter>,
    pub(crate) writer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub(crate) uploader: Mutex<Option<tokio::task::JoinHandle<()>>>,
    pub(crate) gc: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Renews the lease (`crate::fencing::lease::renew`), when the volume has one.
    pub(crate) lease_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

fn closed() -> Error {
    Error::new(ErrorKind::ShuttingDown, "volume is shutting down")
}

impl Volume {
    pub fn meta(&self) -> &VolumeMeta {
        &self.shared.meta
    }

    /// The snapshot this export serves read-only, if it is one (`<volume>@<name>`).
    pub fn snapshot_name(&self) -> Option<&str> {
        self.shared.snapshot.as_deref()
    }

    /// The NBD export name: the volume's, or `<volume>@<snapshot>`.
    pub fn export_name(&self) -> String {
        match &self.shared.snapshot {
            Some(s) => format!("{}@{s}", self.shared.meta.name),
            None => self.shared.meta.name.clone(),
        }
    }

    pub fn size_bytes(&self) -> u64 {
        self.shared.size_bytes.load(Ordering::Acquire)
    }

    /// A misaligned request or one past the end is `BadInput`.
    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        let size = self.size_bytes();
        if !offset.is_multiple_of(SECTOR_BYTES) || !len.is_multiple_of(SECTOR_BYTES) {
            return Err(Error::bad_input("request not aligned to 512 bytes"));
        }
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::bad_input("request beyond end of volume"));
        }
        Ok(())
    }

    /// A failed volume (fenced, a task panicked, the cache device failed) answers no
    /// request: what it holds may not be the volume's any more.
    fn check_not_failed(&self) -> Result<()> {
        if self.shared.is_failed() {
            return Err(self.shared.failed_error());
        }
        Ok(())
    }

    /// Refuses a change only the volume itself takes (a resize, a snapshot) on a
    /// snapshot export: `ReadOnly`, with `instead`, what to do instead.
    pub(super) fn refuse_on_snapshot(&self, instead: &str) -> Result<()> {
        let Some(snap) = &self.shared.snapshot else {
            return Ok(());
        };
        let volume = &self.shared.meta.name;
        Err(Error::new(
            ErrorKind::ReadOnly,
            format!("'{volume}@{snap}' is a snapshot: {instead}"),
        ))
    }

    pub(super) fn check_writable(&self) -> Result<()> {
        if let Some(snap) = &self.shared.snapshot {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!(
                    "{}@{snap} is a snapshot: it is read-only",
                    self.shared.meta.name
                ),
            ));
        }
        if self.shared.is_failed() {
            return Err(self.shared.failed_error());
        }
        Ok(())
    }

    /// The checks of a write or zeroing of `len` bytes at `offset`, for the async and
    /// the started API alike: `Ok(false)` when there is nothing to append (`len` 0;
    /// the caller flushes instead if the request has FUA).
    fn admit_write(&self, offset: u64, len: u64) -> Result<bool> {
        self.check_range(offset, len)?;
        self.check_writable()?;
        Ok(len > 0)
    }

    /// The checks of a FLUSH: `Ok(false)` on a snapshot, where nothing was written.
    fn admit_flush(&self) -> Result<bool> {
        if self.shared.snapshot.is_some() {
            return Ok(false);
        }
        self.check_writable()?;
        Ok(true)
    }

    pub(super) async fn submit(
        &self,
        op: writer::LogOp,
        rx: tokio::sync::oneshot::Receiver<Result<()>>,
    ) -> Result<()> {
        self.log_tx.send(op).await.map_err(|_| closed())?;
        rx.await.map_err(|_| closed())?
    }

    /// Write `data` at byte `offset`. Returns once the record is in the log (and
    /// durable, with `fua`).
    ///
    /// Errors: `BadInput` (misaligned, past the end, larger than half the write log),
    /// `VolumeFailed`, `ShuttingDown`, `LocalIo` (the write log failed; the volume fails
    /// with it).
    pub async fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> Result<()> {
        if !self.admit_write(offset, data.len() as u64)? {
            return if fua { self.flush().await } else { Ok(()) };
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(
            writer::LogOp::Write {
                lba: offset / SECTOR_BYTES,
                data,
                fua,
                done: log_order::Done::Wait(tx),
            },
            rx,
        )
        .await
    }

    /// Make the range read as zeros (TRIM and WRITE_ZEROES).
    pub async fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        if !self.admit_write(offset, len)? {
            return if fua { self.flush().await } else { Ok(()) };
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let op = writer::LogOp::Zero {
            lba: offset / SECTOR_BYTES,
            sectors: len / SECTOR_BYTES,
            fua,
            done: log_order::Done::Wait(tx),
        };
        self.submit(op, rx).await
    }

    /// Make every write acknowledged before this call durable on the cache device.
    pub async fn flush(&self) -> Result<()> {
        if !self.admit_flush()? {
            return Ok(());
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(
            writer::LogOp::Flush {
                done: log_order::Done::Wait(tx),
            },
            rx,
        )
        .await
    }

    /// [`Volume::write`] without waiting: queued until [`Volume::unplug`], which appends
    /// it; `answer` is called with the result on the thread that finishes it (the
    /// unplugging thread's or the log writer's), or at once if the request is refused.
    /// It must not block. For the NBD server, which answers the client from there
    /// without a task per request.
    pub fn start_write(&self, offset: u64, data: Vec<u8>, fua: bool, answer: Answer) {
        let len = data.len() as u64;
        self.start_admitted(offset, len, fua, answer, |done| writer::LogOp::Write {
            lba: offset / SECTOR_BYTES,
            data,
            fua,
            done,
        });
    }

    /// [`Volume::write_zeroes`] without waiting, as [`Volume::start_write`].
    pub fn start_write_zeroes(&self, offset: u64, len: u64, fua: bool, answer: Answer) {
        self.start_admitted(offset, len, fua, answer, |done| writer::LogOp::Zero {
            lba: offset / SECTOR_BYTES,
            sectors: len / SECTOR_BYTES,
            fua,
            done,
        });
    }

    /// Admit a write of `len` bytes at `offset` and hand the log writer `op`, made
    /// with how to answer; or answer at once when the write is refused or writes
    /// nothing (a FLUSH then, for `fua`).
    fn start_admitted(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
        answer: Answer,
        op: impl FnOnce(log_order::Done) -> writer::LogOp,
    ) {
        match self.admit_write(offset, len) {
            Err(e) => return answer(Err(e)),
            Ok(false) if fua => return self.start_flush(answer),
            Ok(false) => return answer(Ok(())),
            Ok(true) => {}
        }
        self.log_writer.start(op(log_order::Done::Call(answer)));
    }

    /// [`Volume::flush`] without waiting, as [`Volume::start_write`].
    pub fn start_flush(&self, answer: Answer) {
        match self.admit_flush() {
            Err(e) => return answer(Err(e)),
            Ok(false) => return answer(Ok(())),
            Ok(true) => {}
        }
        self.log_writer.start(writer::LogOp::Flush {
            done: log_order::Done::Call(answer),
        });
    }

    /// Append what was started ([`Volume::start_write`] and kin) since the last call:
    /// on this thread if it may, otherwise by the log writer thread (see
    /// `engine::started`). On a worker of a multi-thread runtime a FLUSH's
    /// `fdatasync`, or a wait for log space, happens here, in `block_in_place`. The NBD
    /// server calls it once it has started every request it read, before it waits for
    /// anything.
    pub fn unplug(&self) {
        self.log_writer
            .unplug(&self.shared, crate::write::started::Blocking::InPlace);
    }

    /// [`Volume::unplug`] from a thread that may block outright, since it has nothing
    /// else to run meanwhile (a thread serving one NBD connection): a FLUSH's
    /// `fdatasync` or a wait for log space happens here, without `block_in_place`.
    pub fn unplug_on_own_thread(&self) {
        self.log_writer
            .unplug(&self.shared, crate::write::started::Blocking::Here);
    }

    /// Read `len` bytes at `offset`. Errors: `BadInput`, `LocalIo`, `Corrupt` (an
    /// object fails its checksums), or a store error's kind.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.check_range(offset, len)?;
        self.check_not_failed()?;
        let data = read::read(&self.shared, offset / SECTOR_BYTES, len / SECTOR_BYTES).await?;
        // Only a holder of the lease answers: another process may own the volume.
        self.shared.lease_wait().await?;
        Ok(data)
    }

    /// [`Volume::read`] if it needs no waiting: all of it is zeros, in the write log or
    /// in the read cache. `None` otherwise (call [`Volume::read`]).
    pub fn read_local(&self, offset: u64, len: u64) -> Option<Result<Vec<u8>>> {
        if let Err(e) = self
            .check_range(offset, len)
            .and_then(|()| self.check_not_failed())
        {
            return Some(Err(e));
        }
        let data = read::read_local(&self.shared, offset / SECTOR_BYTES, len / SECTOR_BYTES)?;
        Some(data.and_then(|d| self.shared.lease_wait_blocking().map(|()| d)))
    }

    /// Allocation of `[offset, offset+len)`: runs of (bytes, allocated).
    pub fn allocation(&self, offset: u64, len: u64) -> Result<Vec<(u64, bool)>> {
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
        let p = &st.pipeline;
        f(
            p.store().live_bytes(),
            p.store().stored_bytes(),
            p.pending_bytes(),
            p.describe(),
        )
    }

    /// A one-line account of the upload pipeline (what is held, queued, uploading,
    /// waiting to be applied, and where GC is), for test failures and debugging: a
    /// write that stalls on a full log names what the log waits for.
    pub fn describe_pipeline(&self) -> String {
        let st = self.shared.lock();
        let store = st.pipeline.store();
        format!(
            "{}; store live {} stored {} utilization {:.3}; log used {} of {}, tail {:?}, freeable through {}, next record {}",
            st.pipeline.describe(),
            store.live_bytes(),
            store.stored_bytes(),
            lsvd_core::gc::utilization(store),
            st.log.used_bytes(),
            st.log.capacity_bytes(),
            st.log.tail().map(|t| t.seq),
            st.pipeline.freeable_through(),
            st.next_record_seq,
        )
    }

    pub fn status(&self) -> VolumeStatus {
        let st = self.shared.lock();
        let stats = &self.shared.stats;
        let client = stats.client_write_bytes.load(Ordering::Relaxed);
        let put = stats.store_put_bytes.load(Ordering::Relaxed);
        let counters = st.counters(stats);
        let store = st.pipeline.store();
        // Uploaded records the log decided to keep for reads: waiting for nothing.
        // Records applied but not yet classified, or being freed, still count as used,
        // so `log_used_bytes == 0` means every record is freed or kept.
        let retained_bytes = st
            .log
            .bytes_through(st.log_classified_through)
            .saturating_sub(st.log.bytes_through(st.log_freeing_through));
        let rc_counter =
            |f: fn(&crate::read::cache::ReadCache) -> &std::sync::atomic::AtomicU64| {
                self.shared
                    .read_cache
                    .as_ref()
                    .map_or(0, |r| f(r).load(Ordering::Relaxed))
            };
        VolumeStatus {
            name: self.shared.meta.name.clone(),
            volume_id: self.shared.meta.volume.to_string(),
            size_bytes: self.size_bytes(),
            live_bytes: store.live_bytes(),
            store_bytes: store.stored_bytes(),
            objects: store.objects().len() as u64,
            checkpoints: store.checkpoints().len() as u64,
            next_object_seq: store.next_object_seq(),
            last_record_seq_in_store: store.last_record_seq(),
            log_used_bytes: st.log.used_bytes() - retained_bytes,
            log_retained_bytes: retained_bytes,
            log_capacity_bytes: st.log.capacity_bytes(),
            map_extents: store.map().extent_count() as u64,
            log_map_extents: st.log_map.extent_count() as u64,
            uploads_pending: st.pipeline.uploads_pending(),
            uploads_held: st.pipeline.uploads_held(),
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
            gc_hot_moved_bytes: counters.gc_hot_moved_bytes,
            gc_cold_moved_bytes: counters.gc_cold_moved_bytes,
            batches_split: st.pipeline.batches_split(),
            upload_memory_bytes: st.recent_records.bytes(),
            gc_pass_in_flight: st.pipeline.gc_pass_in_flight(),
            gc_superseded_bytes: stats.gc_superseded_bytes.load(Ordering::Relaxed),
            gc_cache_read_bytes: stats.gc_cache_read_bytes.load(Ordering::Relaxed),
            gc_defrag_bytes: stats.gc_defrag_bytes.load(Ordering::Relaxed),
            utilization: lsvd_core::gc::utilization(store),
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
            failure: self.shared.failure(),
            read_cache_admitted_chunks: self
                .shared
                .read_cache
                .as_ref()
                .map_or(0, |r| r.admitted_chunks.load(Ordering::Relaxed)),
            read_prefetch_bytes: rc_counter(|r| &r.prefetched_bytes),
            read_prefetch_hit_bytes: rc_counter(|r| &r.prefetch_hit_bytes),
            read_ahead_bytes: rc_counter(|r| &r.read_ahead_bytes),
            read_ahead_temporal_bytes: rc_counter(|r| &r.temporal_ahead_bytes),
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// May answers be sent now? At once while the lease holds (or the volume keeps
    /// none); while it is being renewed, after the renewal; an error once another
    /// process took the volume over, or when no renewal came within the stall timeout.
    /// The NBD server asks right before it sends each answer.
    pub async fn answerable(&self) -> Result<()> {
        if self.may_answer_now() {
            return Ok(());
        }
        self.shared.lease_wait().await
    }

    /// [`Volume::answerable`] without waiting: true while the lease holds.
    pub fn may_answer_now(&self) -> bool {
        self.shared.lease.is_valid(self.shared.clock())
    }

    /// The volume's lease as the metrics show it.
    pub fn lease_status(&self) -> LeaseStatus {
        let lease = &self.shared.lease;
        LeaseStatus {
            enabled: lease.enabled(),
            held: lease.held(self.shared.clock()),
            fenced: lease.fenced.load(Ordering::SeqCst),
            took_over: lease.took_over.load(Ordering::SeqCst),
            epoch: self.shared.epoch(),
            renewals: lease.renewals.load(Ordering::Relaxed),
            renewal_failures: lease.renewal_failures.load(Ordering::Relaxed),
            expiries: lease.expiries.load(Ordering::Relaxed),
        }
    }

    /// Simulate a process crash: stop uploading and refuse all further I/O at once,
    /// without draining anything. For in-process crash tests; the volume must then be
    /// dropped and reopened from its store and cache device.
    pub fn crash(&self) {
        self.shared.fail("simulated crash");
        for task in [&self.uploader, &self.gc, &self.lease_task] {
            if let Some(t) = take(task) {
                t.abort();
            }
        }
        // A checkpoint naming itself in a volume superblock may be half way through
        // the write, on another thread; a process that died would write nothing more.
        // Let that write land now: every later one sees the volume failed and stops
        // (`checkpoint::name_in_volume_super`), so the next open does not take it for
        // a second writer. Bounded: on a single-threaded runtime the writer cannot
        // run while this waits. On the real clock, not the volume's: a crash must end
        // even on a manual clock that never moves.
        lsvd_store::clock::wait_real_time(std::time::Duration::from_secs(10), || {
            self.shared.volume_super_writes.try_lock().is_ok()
        });
    }

    /// The store map as (lba, sectors, object seq, byte offset), for tests and the
    /// simulator equivalence check.
    pub fn store_map_snapshot(&self) -> Vec<(u64, u64, u64, u64)> {
        let st = self.shared.lock();
        st.pipeline
            .store()
            .map()
            .iter()
            .map(|p| (p.lba, p.sectors, p.location.object_seq, p.location.offset))
            .collect()
    }

    /// Make every write acknowledged before this call durable in the store, not only
    /// in the write log: FLUSH, close the open batch, and wait until every write-log
    /// record up to this moment is in an uploaded, applied object (behind GC, if the
    /// store bound holds client objects back). Returns the newest such record's
    /// sequence number. `lsvd sync` asks for this (before copying a store, or moving a
    /// volume to another host).
    pub async fn sync_to_store(&self) -> Result<u64> {
        // Every record placed so far: those acknowledged, and those in flight (the
        // FLUSH below retires them too).
        let through = self.shared.lock().next_record_seq.saturating_sub(1);
        self.flush().await?;
        self.shared.lock().pipeline.close_batch();
        loop {
            self.check_writable()?;
            if self.shared.lock().pipeline.freeable_through() >= through {
                return Ok(through);
            }
            self.shared.upload_wake.notify_one();
            self.shared
                .clock()
                .sleep(std::time::Duration::from_millis(10))
                .await;
        }
    }

    /// Drain writes, upload everything, write a clean checkpoint and mark the cache
    /// clean. Safe to call more than once. A volume that failed (or fails now) is not
    /// marked clean: `VolumeFailed`.
    pub async fn shutdown(&self) -> Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self
            .log_tx
            .send(writer::LogOp::Shutdown { done: tx })
            .await
            .is_ok()
        {
            let _ = rx.await;
        }
        if let Some(t) = take(&self.writer_thread) {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        if let Some(g) = take(&self.gc) {
            self.shared.gc_wake.notify_one();
            let _ = g.await;
        }
        self.shared.upload_wake.notify_one();
        if let Some(u) = take(&self.uploader) {
            let _ = u.await;
        }
        if self.shared.is_failed() {
            return Err(Error::new(
                ErrorKind::VolumeFailed,
                "volume failed; not marked clean",
            ));
        }
        if self.shared.snapshot.is_none() {
            checkpoint::write_clean(&self.shared).await?;
        }
        if let Some(rc) = &self.shared.read_cache
            && let Err(e) = rc.sync()
        {
            lsvd_store::log::warn(&format!("could not sync the read cache: {e}"));
        }
        Ok(())
    }
}

/// What `slot` holds (a task or thread to stop), leaving it empty. A poisoned lock
/// still holds it.
fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).take()
}
