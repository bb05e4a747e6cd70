//! The uploader: turns closed batches into objects in the store.
//!
//! Uploads run concurrently (up to `uploads_in_flight`) and may complete in any order;
//! they are applied to the store map strictly in sequence order. A failed PUT is
//! retried with capped exponential backoff, forever: client writes keep landing in the
//! write log meanwhile and only wait when it is full. After objects are applied, the
//! cache superblock is advanced past their records and only then is that log space
//! reused, so a crash never finds a superblock pointing at overwritten records.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::cache_super::{CacheSuper, encode_cache_super};
use lsvd_core::format::checkpoint::encode_checkpoint;
use lsvd_core::format::object::{
    ObjectExtent, ObjectKind, ObjectSpec, decode_object_header, encode_object,
    finish_object_in_place, object_header_len,
};

use super::keys::object_key;
use super::{PendingObject, Shared, State, writer};
use crate::store::{PutMode, StoreErrorKind};

const TICK: Duration = Duration::from_millis(200);

pub(crate) async fn run(shared: Arc<Shared>, log_tx: tokio::sync::mpsc::Sender<writer::LogOp>) {
    loop {
        shared
            .stats
            .uploader_wakeups
            .fetch_add(1, Ordering::Relaxed);
        let (done, batch_open) = {
            let mut st = shared.lock();
            super::gc::release_held(&shared, &mut st);
            writer::queue_checkpoint_if_due(&shared, &mut st);
            // Nothing new reaches the store before this process owns the volume.
            let claimed = shared.volume_claimed.load(Ordering::SeqCst);
            while claimed && st.uploads_in_flight < shared.config.uploads_in_flight.max(1) {
                let ready = match st.upload_queue.front() {
                    None => false,
                    // A checkpoint describes everything before it: start it only once
                    // all earlier objects are applied.
                    Some(PendingObject::Checkpoint { seq }) => {
                        st.store.next_object_seq() == *seq
                            && st.uploads_in_flight == 0
                            && !st.checkpoint_in_progress
                    }
                    Some(PendingObject::Data { .. } | PendingObject::Gc { .. }) => true,
                };
                if !ready {
                    break;
                }
                let Some(p) = st.upload_queue.pop_front() else {
                    break;
                };
                st.uploads_in_flight += 1;
                let task_shared = shared.clone();
                match p {
                    PendingObject::Data { seq, batch } => {
                        tokio::spawn(async move { upload_data(task_shared, seq, batch).await });
                    }
                    PendingObject::Gc { seq, bytes } => {
                        tokio::spawn(async move {
                            upload_object(task_shared, seq, ObjectKind::Gc, bytes).await
                        });
                    }
                    PendingObject::Checkpoint { seq } => {
                        // Copy the state's head under the lock; the map and the
                        // encoding follow without holding up client I/O.
                        let snapshot = checkpoint_snapshot(&shared, &st, seq, false);
                        let dead = dead_objects(&st);
                        st.checkpoint_in_progress = true;
                        tokio::spawn(async move {
                            if let Some(bytes) =
                                encode_checkpoint_off_runtime(&task_shared, snapshot).await
                            {
                                upload_checkpoint(task_shared.clone(), seq, bytes, dead, false)
                                    .await;
                            }
                            task_shared.lock().checkpoint_in_progress = false;
                            task_shared.upload_wake.notify_one();
                        });
                    }
                }
            }
            (
                st.writer_done
                    && st.upload_queue.is_empty()
                    && st.uploads_in_flight == 0
                    && !st.checkpoint_in_progress
                    && st.completed.is_empty()
                    && st.store.applying_seq().is_none()
                    && st.held.is_empty()
                    && !st.gc_encoding,
                st.batch_opened_at.is_some(),
            )
        };
        // A failed volume uploads nothing more: what is left stays in the write log
        // for the next start (or for the process that took the volume over).
        if done || shared.failed.load(Ordering::SeqCst) {
            return;
        }
        // Let the writer close a batch that has waited long enough.
        if batch_open {
            let _ = log_tx.try_send(writer::LogOp::Tick);
        }
        let _ = tokio::time::timeout(TICK, shared.upload_wake.notified()).await;
    }
}

/// Extents of the store map copied per hold of the state lock when a checkpoint is
/// taken: about 0.15 ms (copying 200,000 extents at once held it for 3-4 ms).
const CHECKPOINT_SLICE_EXTENTS: usize = 8192;

/// Checkpoint `seq` of the current store state (all objects below it applied): its
/// head is copied under the state lock, the map's extents later a slice at a time
/// ([`CheckpointSnapshot::complete_and_encode`]).
struct CheckpointSnapshot {
    checkpoint: lsvd_core::format::checkpoint::Checkpoint,
    volume: lsvd_core::VolumeId,
    seq: u64,
    last_record_seq: u64,
}

fn checkpoint_snapshot(shared: &Shared, st: &State, seq: u64, clean: bool) -> CheckpointSnapshot {
    debug_assert_eq!(st.store.next_object_seq(), seq);
    CheckpointSnapshot {
        checkpoint: st
            .store
            .to_checkpoint_head(clean, st.counters(&shared.stats)),
        volume: shared.meta.volume,
        seq,
        last_record_seq: st.store.last_record_seq(),
    }
}

impl CheckpointSnapshot {
    /// Copy the map's extents, taking the state lock once per slice, then encode (on
    /// the blocking pool: megabytes on a fragmented volume). The map cannot change in
    /// between: objects after this checkpoint are applied only once it has been
    /// uploaded and applied itself; this checks that rather than trusting it.
    fn complete_and_encode(mut self, shared: &Shared) -> Result<Vec<u8>, String> {
        let mut from = Some(0);
        while let Some(lba) = from {
            let st = shared.lock();
            if st.store.next_object_seq() != self.seq || st.store.applying_seq().is_some() {
                return Err(format!(
                    "the store map changed while checkpoint {:016x} was being taken",
                    self.seq
                ));
            }
            from = st.store.checkpoint_extents(
                lba,
                CHECKPOINT_SLICE_EXTENTS,
                &mut self.checkpoint.extents,
            );
        }
        let payload = encode_checkpoint(&self.checkpoint);
        let spec = ObjectSpec {
            kind: ObjectKind::Checkpoint,
            volume: self.volume,
            seq: self.seq,
            last_record_seq: self.last_record_seq,
            extents: &[],
            trims: &[],
        };
        Ok(encode_object(&spec, &payload))
    }
}

async fn upload_data(
    shared: Arc<Shared>,
    seq: u64,
    batch: lsvd_core::batcher::Batch<super::LogPos>,
) {
    // Read the batch's data back from the log (its records stay allocated until this
    // object is applied) straight into the object's data section, then checksum it
    // and write the header in front, off the runtime threads: 8 MiB of copying and
    // checksumming is milliseconds a client request would wait behind.
    let cache = shared.cache.clone();
    let volume = shared.meta.volume;
    let bytes = tokio::task::spawn_blocking(move || -> io::Result<Vec<u8>> {
        let extents: Vec<ObjectExtent> = batch
            .extents
            .iter()
            .flat_map(|p| split_sectors(p.lba, p.sectors))
            .map(|(lba, sectors)| ObjectExtent {
                lba,
                sectors,
                source: None,
            })
            .collect();
        let spec = ObjectSpec {
            kind: ObjectKind::Data,
            volume,
            seq,
            last_record_seq: batch.last_record_seq,
            extents: &extents,
            trims: &batch.trims,
        };
        let data_bytes: u64 = batch.extents.iter().map(|p| p.sectors * SECTOR_BYTES).sum();
        let header_len = object_header_len(&spec, data_bytes);
        let mut object = vec![0u8; header_len + data_bytes as usize];
        let mut at = header_len;
        for p in &batch.extents {
            let n = (p.sectors * SECTOR_BYTES) as usize;
            cache.read_at(&mut object[at..at + n], p.location.offset)?;
            at += n;
        }
        finish_object_in_place(&spec, &mut object, header_len);
        Ok(object)
    })
    .await;
    let bytes = match bytes {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            shared.fail(&format!(
                "reading batch {seq:016x} back from the write log failed: {e}"
            ));
            return;
        }
        Err(e) => {
            shared.fail(&format!("batch encoder task failed: {e}"));
            return;
        }
    };
    upload_object(shared, seq, ObjectKind::Data, bytes).await;
}

/// Extents in objects have 32-bit lengths; split longer runs.
fn split_sectors(lba: u64, sectors: u64) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    let (mut at, mut left) = (lba, sectors);
    while left > 0 {
        let n = left.min(1 << 30);
        out.push((at, n as u32));
        at += n;
        left -= n;
    }
    out
}

/// [`CheckpointSnapshot::complete_and_encode`] on the blocking pool; None (with the
/// volume failed) if that failed.
async fn encode_checkpoint_off_runtime(
    shared: &Arc<Shared>,
    snapshot: CheckpointSnapshot,
) -> Option<Vec<u8>> {
    let seq = snapshot.seq;
    let s = shared.clone();
    let result = tokio::task::spawn_blocking(move || snapshot.complete_and_encode(&s))
        .await
        .unwrap_or_else(|e| Err(format!("the encoding task failed: {e}")));
    match result {
        Ok(bytes) => Some(bytes),
        Err(e) => {
            shared.fail(&format!("encoding checkpoint {seq:016x} failed: {e}"));
            None
        }
    }
}

/// Objects without live data, which the checkpoint being encoded leaves out.
fn dead_objects(st: &State) -> Vec<(u64, ObjectKind)> {
    st.store
        .dead_objects()
        .into_iter()
        .map(|seq| (seq, st.store.objects()[&seq].kind))
        .collect()
}

/// Upload checkpoint `seq`; once it is durable and applied, delete the objects it
/// left out (they hold no live data) and end the GC pass it closes, if any.
async fn upload_checkpoint(
    shared: Arc<Shared>,
    seq: u64,
    bytes: Vec<u8>,
    dead: Vec<(u64, ObjectKind)>,
    clean: bool,
) {
    upload_object(shared.clone(), seq, ObjectKind::Checkpoint, bytes).await;
    if shared.failed.load(Ordering::SeqCst) {
        return;
    }
    // Name the new checkpoint in the next superblock generation before deleting
    // anything: a process that has been superseded must not delete objects the
    // volume's new owner may still need.
    if !write_volume_super(&shared, seq, clean).await {
        return;
    }
    delete_old_checkpoints(&shared).await;
    for (victim, kind) in dead {
        let key = object_key(&shared.meta.name, victim, kind);
        match shared.store.delete(&key).await {
            Ok(()) => {
                shared.lock().store.forget_object(victim);
                if let Some(rc) = &shared.read_cache {
                    rc.forget_object(victim);
                }
                shared
                    .headers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&victim);
                shared.stats.objects_deleted.fetch_add(1, Ordering::Relaxed);
            }
            // Left in the store; the next open removes objects no checkpoint lists.
            Err(e) => crate::log::warn(&format!("could not delete {key}: {e}")),
        }
    }
    let mut st = shared.lock();
    if st.gc_pass_checkpoint.is_some_and(|c| c <= seq) {
        st.gc_pass_checkpoint = None;
        st.gc_busy.clear();
    }
    drop(st);
    shared.gc_wake.notify_one();
    // The store shrank: client objects held back may go now.
    shared.upload_wake.notify_one();
}

/// Write the next volume superblock generation naming checkpoint `seq` (durable and
/// applied). Returns false if the volume must stop: another process took it over.
/// A store that keeps failing only costs the hint; the next checkpoint tries again.
async fn write_volume_super(shared: &Shared, seq: u64, clean: bool) -> bool {
    use super::volume_super::{WriteError, now_unix_ms, write};
    // One generation at a time, in checkpoint order: two checkpoints' writes may
    // otherwise race for the same generation.
    let _serial = shared.volume_super_writes.lock().await;
    let next = {
        let last = *shared
            .volume_super
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if last.newest_checkpoint.is_some_and(|c| c >= seq) {
            return true; // a newer checkpoint is already named
        }
        let st = shared.lock();
        lsvd_core::format::volume_super::VolumeSuper {
            generation: last.generation + 1,
            clean,
            previous_checkpoint: last.newest_checkpoint.filter(|&c| c != seq),
            newest_checkpoint: Some(seq),
            durable_through: st.store.next_object_seq().max(seq + 1),
            last_record_seq: st.store.last_record_seq(),
            written_unix_ms: now_unix_ms(),
            ..last
        }
    };
    match write(&shared.store, &shared.meta.name, &next, 12).await {
        Ok(()) => {
            *shared
                .volume_super
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = next;
            shared
                .stats
                .superblocks_written
                .fetch_add(1, Ordering::Relaxed);
            true
        }
        Err(e @ WriteError::Superseded { .. }) => {
            shared.fail(&e.to_string());
            false
        }
        Err(WriteError::Store(e)) => {
            crate::log::warn(&format!("volume superblock not updated: {e}"));
            true
        }
    }
}

/// PUT with retries, then apply in order.
async fn upload_object(shared: Arc<Shared>, seq: u64, kind: ObjectKind, bytes: Vec<u8>) {
    // Shared with every attempt's PUT: a clone is a reference count, not a copy.
    let bytes = bytes::Bytes::from(bytes);
    let header = match decode_object_header(&bytes) {
        Ok(h) => h,
        Err(e) => {
            shared.fail(&format!("encoded object {seq:016x} does not decode: {e}"));
            return;
        }
    };
    let key = object_key(&shared.meta.name, seq, kind);
    let mut backoff = Duration::from_millis(50);
    let mut attempt = 0u32;
    loop {
        // After a local failure (or a simulated crash) nothing more may change state.
        if shared.failed.load(Ordering::SeqCst) {
            return;
        }
        attempt += 1;
        // Fencing: stop before writing if another process has claimed the volume.
        let current = *shared
            .volume_super
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match super::volume_super::superseded(&shared.store, &shared.meta.name, &current).await {
            Ok(false) => {}
            Ok(true) => {
                shared.fail(&format!(
                    "another lsvd process has taken over the volume (superblock generation {} exists); not uploading {key}",
                    current.generation + 1
                ));
                return;
            }
            Err(e) => {
                crate::log::warn(&format!("cannot check volume ownership before {key}: {e}"));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        }
        shared.stats.store_puts.fetch_add(1, Ordering::Relaxed);
        match shared
            .store
            .put(&key, bytes.clone(), PutMode::IfAbsent)
            .await
        {
            Ok(()) => break,
            // An earlier attempt landed but its answer was lost, or another process
            // writes this volume: only our own bytes count as landed.
            Err(e) if e.kind == StoreErrorKind::AlreadyExists => {
                let header_len = header.header_bytes as u64;
                match shared.store.get_range(&key, 0..header_len).await {
                    Ok(found) if found[..] == bytes[..header_len as usize] => break,
                    Ok(_) => {
                        shared.fail(&format!(
                            "{key} already exists with other contents: another lsvd process is writing this volume"
                        ));
                        return;
                    }
                    Err(e) => {
                        crate::log::warn(&format!(
                            "{key} exists but cannot be read back, retrying: {e}"
                        ));
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
            Err(e) => {
                shared
                    .stats
                    .store_put_retries
                    .fetch_add(1, Ordering::Relaxed);
                if attempt == 1 || attempt.is_multiple_of(20) {
                    crate::log::warn(&format!(
                        "upload of {key} failed (attempt {attempt}), retrying: {e}"
                    ));
                }
                let jitter =
                    Duration::from_millis(u64::from(attempt.wrapping_mul(2654435761) % 50));
                tokio::time::sleep(backoff + jitter).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
    shared
        .stats
        .store_put_bytes
        .fetch_add(bytes.len() as u64, Ordering::Relaxed);
    match kind {
        ObjectKind::Checkpoint => shared
            .stats
            .checkpoints_written
            .fetch_add(1, Ordering::Relaxed),
        _ => shared.stats.objects_written.fetch_add(1, Ordering::Relaxed),
    };
    if shared.failed.load(Ordering::SeqCst) {
        return;
    }
    let before = {
        let mut st = shared.lock();
        st.uploads_in_flight -= 1;
        st.completed.insert(seq, header);
        st.freeable_through
    };
    while apply_next(&shared).await {}
    let through = shared.lock().freeable_through;
    if through > before {
        persist_tail_off_runtime(&shared, through, false).await;
    }
    shared.upload_wake.notify_one();
    shared.gc_wake.notify_one();
}

/// Map entries inserted or displaced per hold of the state lock while applying an
/// object: about 0.2 ms on a volume of 200,000 extents.
const APPLY_STEP_PIECES: usize = 256;

/// Apply the next completed object in sequence order, if it is there and no other task
/// is applying one. The object is applied a step at a time, releasing the state lock
/// in between: applying 2,048 scattered extents at once held the lock every client
/// write takes for 2-8 ms.
async fn apply_next(shared: &Shared) -> bool {
    {
        let mut st = shared.lock();
        if st.store.applying_seq().is_some() {
            return false;
        }
        let next = st.store.next_object_seq();
        let Some(h) = st.completed.remove(&next) else {
            return false;
        };
        // The object's bytes are counted by the store state from here on.
        st.pending_bytes.remove(&h.seq);
        if let Err(e) = st.store.begin_apply(h) {
            drop(st);
            shared.fail(&format!("applying object {next:016x}: {e}"));
            return false;
        }
    }
    loop {
        {
            let mut guard = shared.lock();
            let st = &mut *guard;
            let log_map = &mut st.log_map;
            let done = st
                .store
                .apply_step(APPLY_STEP_PIECES, |lba, sectors, last| {
                    // This range now reads from the object: its write-log copy (if no
                    // newer write replaced it) can go.
                    log_map.release(lba, sectors, last)
                });
            if let Some(h) = done {
                if h.kind == ObjectKind::Gc {
                    let kept = st.store.objects().get(&h.seq).map_or(0, |o| o.live_bytes);
                    shared
                        .stats
                        .gc_superseded_bytes
                        .fetch_add(h.data_bytes.saturating_sub(kept), Ordering::Relaxed);
                }
                st.freeable_through = st.freeable_through.max(h.last_record_seq);
                return true;
            }
        }
        // Let a client write that is waiting for the lock take it.
        tokio::task::yield_now().await;
    }
}

/// Write the cache superblock with the tail after record `through`, then free the
/// space. Called with no state lock held.
/// [`persist_tail`] on the blocking pool: its fdatasync flushes every log page
/// written since the last one and, on a busy disk, takes milliseconds to tens of
/// milliseconds, during which a runtime thread would serve no client I/O.
pub(crate) async fn persist_tail_off_runtime(shared: &Arc<Shared>, through: u64, clean: bool) {
    let s = shared.clone();
    if let Err(e) = tokio::task::spawn_blocking(move || persist_tail(&s, through, clean)).await {
        shared.fail(&format!("cache superblock write failed: {e}"));
    }
}

fn persist_tail(shared: &Shared, through: u64, clean: bool) {
    let _guard = shared.super_lock.lock().unwrap_or_else(|p| p.into_inner());
    let (sb, through) = {
        let mut st = shared.lock();
        let through = through.max(st.freeable_through);
        let (tail_offset, tail_seq) = st.log.tail_after(through);
        st.cache_super_generation += 1;
        let sb = CacheSuper {
            clean,
            volume: shared.meta.volume,
            generation: st.cache_super_generation,
            file_bytes: shared.cache.size_bytes(),
            log_start: shared.log_start,
            log_end: shared.log_end,
            tail_offset,
            tail_seq,
            index_epoch: shared.index_epoch,
        };
        (sb, through)
    };
    let slot = (sb.generation % 2) * lsvd_core::format::cache_super::CACHE_SUPER_BYTES as u64;
    let r = shared
        .cache
        .write_at(&encode_cache_super(&sb), slot)
        .and_then(|_| shared.cache.sync());
    if let Err(e) = r {
        shared.fail(&format!("cache superblock write failed: {e}"));
        return;
    }
    let mut st = shared.lock();
    st.log.free_through(through);
    while st
        .log_headers
        .front()
        .is_some_and(|(_, h)| h.seq <= through)
    {
        st.log_headers.pop_front();
    }
    drop(st);
    shared.space_freed.notify_all();
}

/// Keep the newest two checkpoints; delete older ones (best effort).
async fn delete_old_checkpoints(shared: &Shared) {
    // Never delete a checkpoint the newest volume superblock in the store names: after
    // a crash, recovery insists on finding it.
    let named = *shared
        .volume_super
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let Some(keep_from) = named
        .previous_checkpoint
        .or(named.newest_checkpoint)
        .filter(|_| shared.volume_claimed.load(Ordering::SeqCst))
    else {
        return;
    };
    let old: Vec<u64> = {
        let st = shared.lock();
        st.store
            .checkpoints()
            .iter()
            .copied()
            .filter(|&c| c < keep_from)
            .collect()
    };
    for c in old {
        let key = object_key(&shared.meta.name, c, ObjectKind::Checkpoint);
        match shared.store.delete(&key).await {
            Ok(()) => shared.lock().store.forget_object(c),
            Err(e) => crate::log::warn(&format!("could not delete old checkpoint {key}: {e}")),
        }
    }
}

/// After the uploader has drained: write a clean checkpoint and mark the cache clean.
pub(crate) async fn write_clean_checkpoint(shared: &Arc<Shared>) -> io::Result<()> {
    let (seq, snapshot, dead) = {
        let mut st = shared.lock();
        if !st.completed.is_empty()
            || st.store.applying_seq().is_some()
            || !st.upload_queue.is_empty()
            || st.uploads_in_flight > 0
            || st.checkpoint_in_progress
        {
            return Err(io::Error::other("uploads did not drain"));
        }
        let seq = st.next_object_seq;
        st.next_object_seq += 1;
        st.uploads_in_flight += 1;
        (
            seq,
            checkpoint_snapshot(shared, &st, seq, true),
            dead_objects(&st),
        )
    };
    let Some(bytes) = encode_checkpoint_off_runtime(shared, snapshot).await else {
        return Err(io::Error::other("volume failed during shutdown"));
    };
    upload_checkpoint(shared.clone(), seq, bytes, dead, true).await;
    let through = shared.lock().store.last_record_seq();
    persist_tail_off_runtime(shared, through, true).await;
    if shared.failed.load(Ordering::SeqCst) {
        return Err(io::Error::other("volume failed during shutdown"));
    }
    Ok(())
}
