//! Writing checkpoints: take one, upload it, name it in the volume superblock, then
//! delete what it made obsolete.
//!
//! The pipeline decides when a checkpoint is due and hands it out only once every
//! object before it is applied (`Upload::Checkpoint`), one at a time. Its head
//! (objects, counters) is copied under the state lock at that moment ([`snapshot`]);
//! the store map's extents, 200,000 on a fragmented 1 GiB volume, are copied a slice
//! per lock hold on the blocking pool, then encoded. The map cannot change meanwhile:
//! objects after the checkpoint are applied only once the checkpoint itself is (this
//! is checked at every slice). Once durable and applied, the checkpoint is named in
//! the next volume superblock generation *before* anything is deleted: a process that
//! has been superseded must not delete objects the volume's new owner may still need.
//!
//! Objects a checkpoint leaves out (no live data) leave the pipeline's accounting at
//! once but stay in the store until the *next* checkpoint is named. Recovery falls
//! back to the previous checkpoint when the newest is corrupt or missing, and the
//! replay from there needs exactly those objects to reach the newest state. After a
//! crash or a clean stop, the next open deletes them (below its checkpoint, not
//! listed in it).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use lsvd_core::format::checkpoint::{Checkpoint, encode_checkpoint};
use lsvd_core::format::object::{ObjectKind, ObjectSpec, encode_compressed_object};
use lsvd_core::pipeline::Upload;

use crate::keys::object_key;
use crate::locks::LockRank;
use crate::maintenance::replica_hold::Holds;
use crate::shared::{DeferredDelete, Shared, State};
use crate::write::log_tail::persist_tail_off_runtime;
use crate::write::put::upload_object;
use lsvd_core::error::{Error, ErrorKind, Result};

/// Extents of the store map copied per hold of the state lock when a checkpoint is
/// taken: about 0.15 ms (copying 200,000 extents at once held it for 3-4 ms).
const CHECKPOINT_SLICE_EXTENTS: usize = 8192;

/// Checkpoint `seq` of the current store state (all objects below it applied): its
/// head is copied under the state lock, the map's extents later a slice at a time
/// ([`CheckpointSnapshot::complete_and_encode`]).
pub(crate) struct CheckpointSnapshot {
    checkpoint: Checkpoint,
    volume: lsvd_core::VolumeId,
    seq: u64,
    epoch: u64,
    last_record_seq: u64,
    compression: lsvd_core::compression::Compression,
}

/// The head of checkpoint `seq`, from the state as it is now (under the lock).
pub(crate) fn snapshot(shared: &Shared, st: &State, seq: u64, clean: bool) -> CheckpointSnapshot {
    let store = st.pipeline.store();
    debug_assert_eq!(store.next_object_seq(), seq);
    let mut checkpoint = store.to_checkpoint_head(clean, st.counters(&shared.stats));
    // The write frequencies as they are now (up to 4 MiB copied under the lock, once
    // per checkpoint). They may count a few client writes newer than the checkpoint;
    // recovery replays those from the log and counts them again: heat is a decayed
    // estimate, and a few batches' double count is noise beside its half-life.
    checkpoint.heat = st.heat.as_ref().map(|h| h.to_checkpoint());
    CheckpointSnapshot {
        checkpoint,
        volume: shared.meta.volume,
        seq,
        epoch: shared.epoch(),
        last_record_seq: store.last_record_seq(),
        compression: shared.config.compression(),
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
            let store = st.pipeline.store();
            if store.next_object_seq() != self.seq || store.applying_seq().is_some() {
                return Err(format!(
                    "the store map changed while checkpoint {:016x} was being taken",
                    self.seq
                ));
            }
            from = store.checkpoint_extents(
                lba,
                CHECKPOINT_SLICE_EXTENTS,
                &mut self.checkpoint.extents,
            );
        }
        let payload = encode_checkpoint(&self.checkpoint);
        let spec = ObjectSpec::checkpoint(self.volume, self.seq, self.last_record_seq, self.epoch);
        Ok(encode_compressed_object(&spec, &payload, self.compression))
    }
}

/// [`CheckpointSnapshot::complete_and_encode`] on the blocking pool; None (with the
/// volume failed) if that failed.
async fn encode_off_runtime(shared: &Arc<Shared>, snapshot: CheckpointSnapshot) -> Option<Vec<u8>> {
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

/// Take, upload and name checkpoint `seq`, then forget the objects it left out
/// (`dead`: they hold no live data), delete the ones the previous checkpoint left out
/// and older checkpoints; tell the pipeline it is finished either way.
pub(crate) async fn run(
    shared: &Arc<Shared>,
    seq: u64,
    snapshot: CheckpointSnapshot,
    dead: Vec<(u64, ObjectKind)>,
) {
    let clean = snapshot.checkpoint.clean;
    shared.panic_point("checkpoint");
    if let Some(bytes) = encode_off_runtime(shared, snapshot).await {
        upload_object(shared, seq, ObjectKind::Checkpoint, bytes.into()).await;
        // Deletes only once the checkpoint is named: a superblock that still names
        // the one before (the write failed) may need what this one left out.
        if !shared.is_failed() && name_in_volume_super(shared, seq, clean).await == Named::Yes {
            // What replication passes under way need (read once per checkpoint, after
            // naming it: `replica_hold`); None: unreadable, delete nothing this time.
            let holds = crate::maintenance::replica_hold::load(shared).await;
            // A snapshot being taken chooses its checkpoint under this lock.
            let _deletions = shared.deletions.lock().await;
            let holds = holds.map(|h| crate::maintenance::replica_hold::bounded(shared, h, seq));
            if let Some(holds) = &holds {
                delete_old_checkpoints(shared, holds).await;
            }
            forget_dead(shared, seq, &dead);
            if let Some(holds) = &holds {
                delete_deferred(shared, seq, holds).await;
            }
        }
    }
    shared.lock().pipeline.checkpoint_finished(seq);
}

/// Objects without live data leave the pipeline's accounting, the read cache and the
/// header cache (nothing reads them again) and wait in [`Shared::deferred_deletes`]
/// for the next checkpoint. Forgotten and listed under one hold of the state lock, so
/// Most dead objects waiting for their delete (about 32 bytes each).
pub(crate) const MAX_DEFERRED_DELETES: usize = 1 << 16;

/// that accounted plus deferred bytes always cover what the store holds.
fn forget_dead(shared: &Shared, checkpoint: u64, dead: &[(u64, ObjectKind)]) {
    {
        let mut st = shared.lock();
        let mut deferred = shared.lock_ranked(&shared.deferred_deletes, LockRank::DeferredDeletes);
        for &(victim, kind) in dead {
            let (total_bytes, epoch) = st
                .pipeline
                .store()
                .objects()
                .get(&victim)
                .map_or((0, 0), |o| (o.total_bytes, o.epoch));
            st.pipeline.forget_object(victim);
            deferred.push(DeferredDelete {
                seq: victim,
                epoch,
                kind,
                total_bytes,
                left_out_by: checkpoint,
            });
        }
        // Deletes that keep failing must not grow this without bound: past the cap the
        // oldest are forgotten, and found again as orphans at the next open.
        if deferred.len() > MAX_DEFERRED_DELETES {
            let excess = deferred.len() - MAX_DEFERRED_DELETES;
            deferred.drain(..excess);
            lsvd_store::log::warn(&format!(
                "{excess} dead objects could not be deleted and are left in the store \
                 (deletes keep failing); the next open removes them"
            ));
        }
    }
    if let Some(rc) = &shared.read_cache {
        // Their numbers are never used again: nothing to make durable.
        let victims: Vec<u64> = dead.iter().map(|&(victim, _)| victim).collect();
        let _ = rc.forget_objects(&victims, false);
    }
    let mut headers = shared.lock_ranked(&shared.headers, LockRank::Headers);
    for &(victim, _) in dead {
        headers.remove(&victim);
    }
}

/// Delete the objects an earlier checkpoint than `checkpoint` (now named) left out:
/// neither kept checkpoint needs them. One whose delete fails stays listed and is
/// tried after the next checkpoint (one left behind by a crash is found and removed at
/// the next open, below the checkpoint and not listed in it); so does one a
/// replication pass under way still needs (`holds`).
async fn delete_deferred(shared: &Shared, checkpoint: u64, holds: &Holds) {
    let due: Vec<DeferredDelete> = shared
        .lock_ranked(&shared.deferred_deletes, LockRank::DeferredDeletes)
        .iter()
        .filter(|d| d.left_out_by < checkpoint)
        .copied()
        .collect();
    for d in due {
        if !shared.owns(d.seq)
            || shared
                .lock_ranked(&shared.pins, LockRank::Pins)
                .holds(d.seq)
        {
            // A snapshot keeps it (deleting the snapshot deletes it), or it is an
            // ancestor's, shared by this clone.
            shared
                .lock_ranked(&shared.deferred_deletes, LockRank::DeferredDeletes)
                .retain(|x| x.seq != d.seq);
            continue;
        }
        if holds.keeps_object(d.seq, d.left_out_by) {
            // A replication pass copies it: tried again after the next checkpoint.
            shared
                .stats
                .replica_held_deletes
                .fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let key = object_key(&shared.meta.name, d.seq, d.epoch, d.kind);
        match shared.store.delete(&key).await {
            Ok(()) => {
                shared
                    .lock_ranked(&shared.deferred_deletes, LockRank::DeferredDeletes)
                    .retain(|x| x.seq != d.seq);
                shared.stats.objects_deleted.fetch_add(1, Ordering::Relaxed);
            }
            // The store refuses or is away: the rest waits for the next checkpoint too
            // (each delete would fail the same way, each after its retries).
            Err(e) => {
                shared
                    .stats
                    .object_deletes_failed
                    .fetch_add(1, Ordering::Relaxed);
                lsvd_store::log::warn(&format!(
                    "could not delete {key} (and {} more due), trying after the next \
                     checkpoint: {e}",
                    shared
                        .lock_ranked(&shared.deferred_deletes, LockRank::DeferredDeletes)
                        .len()
                        .saturating_sub(1)
                ));
                return;
            }
        }
    }
}

/// What naming a checkpoint in a volume superblock came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Named {
    /// The generation naming it landed (or a newer checkpoint is named already).
    Yes,
    /// The store kept failing: the checkpoint is not named; the next one tries again.
    No,
    /// The volume must stop: another process took it over, or it failed.
    Stop,
}

/// Write the next volume superblock generation naming checkpoint `seq` (durable and
/// applied); the history it carries is pruned to what recovery from the previous
/// checkpoint needs. A generation that lands renews the lease too.
async fn name_in_volume_super(shared: &Shared, seq: u64, clean: bool) -> Named {
    use crate::fencing::volume_super::{WriteError, write};
    // One generation at a time, in checkpoint order: two checkpoints' writes (and the
    // lease's renewals) may otherwise race for the same generation.
    let _serial = shared.volume_super_writes.lock().await;
    // A failed volume names nothing more: after an in-process crash (a test's
    // `Volume::crash`) another open may be recovering the volume, and would take a
    // superblock written now for a second writer.
    if shared.is_failed() {
        return Named::Stop;
    }
    if clean {
        // The last generation: no renewal may follow it.
        shared.lease.stopping.store(true, Ordering::SeqCst);
    }
    let next = {
        let last = shared
            .lock_ranked(&shared.volume_super, LockRank::VolumeSuper)
            .clone();
        if last.newest_checkpoint.is_some_and(|c| c >= seq) && !clean {
            return Named::Yes; // a newer checkpoint is already named
        }
        let st = shared.lock();
        let store = st.pipeline.store();
        let previous_checkpoint = last.newest_checkpoint.filter(|&c| c != seq);
        let mut history = last.history.clone();
        history.prune(previous_checkpoint.unwrap_or(seq));
        lsvd_core::format::volume_super::VolumeSuper {
            generation: last.generation + 1,
            clean,
            deleting: false,
            previous_checkpoint,
            newest_checkpoint: Some(seq),
            // Not into a split batch whose last part is not applied yet: recovery
            // would stop before its first part.
            durable_through: store.whole_next_object_seq().max(seq + 1),
            last_record_seq: store.last_record_seq(),
            written_unix_ms: shared.clock().unix_ms(),
            history,
            ..last
        }
    };
    let sent_ns = shared.now_ns();
    let sent_unix_ms = shared.clock().unix_ms();
    // Retries against a failing store take up to half a minute; a volume that fails
    // meanwhile abandons the write (and releases the lock `Volume::crash` waits on).
    let result = {
        let written = write(&shared.store, &shared.meta.name, &next, 12, shared.clock());
        tokio::pin!(written);
        loop {
            tokio::select! {
                r = &mut written => break r,
                () = shared.clock().sleep(std::time::Duration::from_millis(10)) => {
                    if shared.is_failed() {
                        return Named::Stop;
                    }
                }
            }
        }
    };
    // Landed, but only in a gap a newer holder's deleted generation left: fenced.
    let result = match result {
        Ok(()) => {
            match crate::fencing::volume_super::newer_than(
                &shared.store,
                &shared.meta,
                next.generation,
            )
            .await
            {
                Ok(None) => Ok(()),
                Ok(Some(holder)) => Err(WriteError::Superseded {
                    generation: next.generation,
                    holder,
                }),
                Err(e) => Err(WriteError::Store(e)),
            }
        }
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => {
            shared.lease.extend(sent_ns, sent_unix_ms);
            *shared.lock_ranked(&shared.volume_super, LockRank::VolumeSuper) = next;
            shared
                .stats
                .superblocks_written
                .fetch_add(1, Ordering::Relaxed);
            Named::Yes
        }
        Err(WriteError::Superseded { holder, .. }) => {
            shared.fence_superseded(holder);
            Named::Stop
        }
        Err(WriteError::Store(e)) => {
            lsvd_store::log::warn(&format!("volume superblock not updated: {e}"));
            Named::No
        }
    }
}

/// Keep the newest two checkpoints, and one a replication pass under way copies from
/// (`holds`; tried again after the next checkpoint); delete older ones (best effort).
async fn delete_old_checkpoints(shared: &Shared, holds: &Holds) {
    // Never delete a checkpoint the newest volume superblock in the store names: after
    // a crash, recovery insists on finding it.
    let named = shared
        .lock_ranked(&shared.volume_super, LockRank::VolumeSuper)
        .clone();
    let Some(keep_from) = named
        .previous_checkpoint
        .or(named.newest_checkpoint)
        .filter(|_| shared.volume_claimed.load(Ordering::SeqCst))
    else {
        return;
    };
    let old: Vec<(u64, u64)> = {
        let st = shared.lock();
        st.pipeline
            .store()
            .checkpoints()
            .iter()
            .map(|(&c, &e)| (c, e))
            .filter(|&(c, _)| c < keep_from)
            .collect()
    };
    for (c, epoch) in old {
        if !shared.owns(c) {
            shared.lock().pipeline.forget_object(c);
            continue;
        }
        if shared.lock_ranked(&shared.pins, LockRank::Pins).holds(c) {
            // A snapshot's base: kept until the snapshot is deleted.
            shared.lock().pipeline.forget_object(c);
            continue;
        }
        if holds.keeps_checkpoint(c, epoch) {
            shared
                .stats
                .replica_held_deletes
                .fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let key = object_key(&shared.meta.name, c, epoch, ObjectKind::Checkpoint);
        match shared.store.delete(&key).await {
            Ok(()) => shared.lock().pipeline.forget_object(c),
            Err(e) => lsvd_store::log::warn(&format!("could not delete old checkpoint {key}: {e}")),
        }
    }
}

/// After the uploader has drained: write a clean checkpoint and mark the cache clean.
/// Every failure is `VolumeFailed`: the volume cannot be closed cleanly (what is not
/// uploaded stays in the write log for the next start).
pub(crate) async fn write_clean(shared: &Arc<Shared>) -> Result<()> {
    let (seq, snapshot, dead) = {
        let mut st = shared.lock();
        let upload = st
            .pipeline
            .begin_clean_checkpoint()
            .map_err(|e| Error::new(ErrorKind::VolumeFailed, e.to_string()))?;
        let Upload::Checkpoint { seq, clean, dead } = upload else {
            return Err(Error::new(
                ErrorKind::VolumeFailed,
                "the pipeline handed out no checkpoint",
            ));
        };
        (seq, snapshot(shared, &st, seq, clean), dead)
    };
    run(shared, seq, snapshot, dead).await;
    // Everything is in the store now; the log keeps what it kept (the next open
    // serves reads of it again) and frees only what it had decided to free.
    let through = shared.lock().log_freeing_through;
    persist_tail_off_runtime(shared, through, true).await;
    if shared.is_failed() {
        return Err(Error::new(
            ErrorKind::VolumeFailed,
            "volume failed during shutdown",
        ));
    }
    Ok(())
}
