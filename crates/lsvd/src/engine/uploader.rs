//! The uploader task: starts the uploads the pipeline hands out.
//!
//! Each wake-up (a notification, or the tick that lets batches time out and
//! checkpoints fall due) takes every upload the pipeline allows now
//! (`Pipeline::next_upload`) and runs each in a task of its own: a client batch is
//! read back from the write log and encoded ([`upload_data`]), a GC object is already
//! encoded, a checkpoint is taken ([`super::checkpoint`]). Uploads may finish in any
//! order; `put::upload_object` hands them back to the pipeline, which applies them in
//! sequence order. The task ends once writes have stopped and the pipeline is drained.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lsvd_core::batcher::Batch;
use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::object::{
    ObjectKind, ObjectSpec, finish_object_in_place, object_header_len,
};
use lsvd_core::pipeline::Upload;

use super::checkpoint;
use super::clock::timeout;
use super::put::upload_object;
use super::shared::{LogPos, Shared};

/// The uploader wakes at least this often: batch timeouts and the checkpoint interval
/// are checked then.
pub(crate) const TICK: Duration = Duration::from_millis(200);

pub(crate) async fn run(shared: Arc<Shared>) {
    loop {
        // A cooperative yield point: even a loop woken over and over stays
        // preemptible (and a runtime shutting down can stop it).
        tokio::task::coop::consume_budget().await;
        shared
            .stats
            .uploader_wakeups
            .fetch_add(1, Ordering::Relaxed);
        let (starts, drained) = {
            let mut st = shared.lock();
            st.pipeline.tick(shared.now_ns());
            // Nothing new reaches the store before this process owns the volume.
            let claimed = shared.volume_claimed.load(Ordering::SeqCst);
            let mut starts = Vec::new();
            while let Some(u) = st.pipeline.next_upload(claimed) {
                // A checkpoint's head is copied now, under the lock, before anything
                // after it can be applied; its map and encoding follow without it.
                let snapshot = match &u {
                    Upload::Checkpoint { seq, clean, .. } => {
                        Some(checkpoint::snapshot(&shared, &st, *seq, *clean))
                    }
                    _ => None,
                };
                starts.push((u, snapshot));
            }
            (starts, st.pipeline.drained())
        };
        for (upload, snapshot) in starts {
            let task_shared = shared.clone();
            match upload {
                Upload::Data { seq, batch } => {
                    tokio::spawn(async move { upload_data(task_shared, seq, batch).await });
                }
                Upload::Gc { seq, object } => {
                    tokio::spawn(async move {
                        upload_object(&task_shared, seq, ObjectKind::Gc, object).await
                    });
                }
                Upload::Checkpoint { seq, dead, .. } => {
                    let snapshot = snapshot.expect("taken above for every checkpoint");
                    tokio::spawn(async move {
                        checkpoint::run(&task_shared, seq, snapshot, dead).await
                    });
                }
            }
        }
        // A failed volume uploads nothing more: what is left stays in the write log
        // for the next start (or for the process that took the volume over).
        if drained || shared.is_failed() {
            return;
        }
        let _ = timeout(shared.clock(), TICK, shared.upload_wake.notified()).await;
    }
}

/// Read a closed batch's data back from the write log (its records stay allocated
/// until this object is applied) straight into the object's data section, checksum it
/// and write the header in front, off the runtime threads (8 MiB of copying and
/// checksumming is milliseconds a client request would wait behind); then upload it.
async fn upload_data(shared: Arc<Shared>, seq: u64, batch: Batch<LogPos>) {
    let cache = shared.cache.clone();
    let volume = shared.meta.volume;
    let bytes = tokio::task::spawn_blocking(move || -> io::Result<Vec<u8>> {
        let extents = batch.object_extents();
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
    upload_object(&shared, seq, ObjectKind::Data, bytes.into()).await;
}
