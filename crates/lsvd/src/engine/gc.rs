//! The garbage collector of a live volume.
//!
//! A background task. When the store's utilization falls below the start threshold it
//! runs passes until it rises above the stop threshold (`lsvd_core::gc`). A pass reads
//! the live extents of its victims with verified ranged GETs, writes them in LBA order
//! into GC objects (apart from client data), queues those for upload in sequence
//! order, then queues a checkpoint. The victims hold no live data once the GC objects
//! are applied; the checkpoint leaves them out, and they are deleted once it is
//! durable (see `uploader::upload_checkpoint`).
//!
//! Pacing: one pass at a time, at most `pass_bytes` moved per pass, and no pass starts
//! while client batches are waiting for upload: client data always goes first.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::object::{ObjectKind, ObjectSpec, encode_object};
use lsvd_core::gc::{
    Relocation, gc_object_extents, group_relocations, live_extents, select_victims, should_collect,
};

use super::{PendingObject, Shared, read};

/// Client batches waiting for upload above which GC waits.
const MAX_CLIENT_BACKLOG: usize = 2;

pub(crate) async fn run(shared: Arc<Shared>) {
    let cfg = shared.config.gc;
    if !cfg.enabled() {
        return;
    }
    let mut active = false;
    loop {
        let _ = tokio::time::timeout(Duration::from_secs(1), shared.gc_wake.notified()).await;
        let plan = {
            let st = shared.lock();
            if st.writer_done || shared.failed.load(Ordering::SeqCst) {
                return;
            }
            if !st.gc_busy.is_empty() || st.upload_queue.len() > MAX_CLIENT_BACKLOG {
                continue;
            }
            if !should_collect(&st.store, &cfg, active) {
                active = false;
                continue;
            }
            let victims = select_victims(&st.store, &cfg, st.next_object_seq, |_| false);
            if victims.is_empty() {
                active = false;
                continue;
            }
            let set: BTreeSet<u64> = victims.iter().copied().collect();
            let relocations = live_extents(&st.store, &set);
            let kinds: BTreeMap<u64, ObjectKind> = victims
                .iter()
                .map(|v| (*v, st.store.objects()[v].kind))
                .collect();
            (set, relocations, kinds)
        };
        active = true;
        let (victims, relocations, kinds) = plan;
        shared.lock().gc_busy = victims.clone();
        match run_pass(&shared, &relocations, &kinds).await {
            Ok(moved) => {
                shared.stats.gc_passes.fetch_add(1, Ordering::Relaxed);
                shared
                    .stats
                    .gc_moved_bytes
                    .fetch_add(moved, Ordering::Relaxed);
                crate::log::debug(&format!(
                    "gc: pass over {} objects moved {moved} bytes",
                    victims.len()
                ));
            }
            Err(e) => {
                crate::log::warn(&format!("gc pass failed, will retry: {e}"));
                shared.lock().gc_busy.clear();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Read the relocated data, encode GC objects, queue them and the closing checkpoint.
async fn run_pass(
    shared: &Arc<Shared>,
    relocations: &[Relocation],
    kinds: &BTreeMap<u64, ObjectKind>,
) -> std::io::Result<u64> {
    let groups = group_relocations(relocations, shared.config.batch_size_bytes);
    let mut encoded = Vec::with_capacity(groups.len());
    let mut moved = 0u64;
    for group in &groups {
        let mut data = Vec::new();
        for r in group {
            let kind = kinds
                .get(&r.source.object_seq)
                .copied()
                .unwrap_or(ObjectKind::Data);
            let len = (r.sectors * SECTOR_BYTES) as usize;
            let start = data.len();
            data.resize(start + len, 0);
            read::read_object(
                shared,
                r.source.object_seq,
                kind,
                r.source.offset,
                &mut data[start..],
                false,
            )
            .await?;
        }
        moved += data.len() as u64;
        encoded.push((gc_object_extents(group), data));
    }
    let mut st = shared.lock();
    if st.writer_done {
        return Ok(0);
    }
    let last_record_seq = st.store.last_record_seq();
    for (extents, data) in encoded {
        let seq = st.next_object_seq;
        st.next_object_seq += 1;
        let spec = ObjectSpec {
            kind: ObjectKind::Gc,
            volume: shared.meta.volume,
            seq,
            last_record_seq,
            extents: &extents,
            trims: &[],
        };
        st.upload_queue.push_back(PendingObject::Gc {
            seq,
            bytes: encode_object(&spec, &data),
        });
    }
    let checkpoint = st.next_object_seq;
    st.next_object_seq += 1;
    st.upload_queue
        .push_back(PendingObject::Checkpoint { seq: checkpoint });
    st.objects_since_checkpoint = 0;
    st.gc_pass_checkpoint = Some(checkpoint);
    drop(st);
    shared.upload_wake.notify_one();
    Ok(moved)
}
