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
//! while client batches are waiting for upload: client data goes first while GC keeps
//! up.
//!
//! Back-pressure: when GC falls behind (the store would grow past live/gc-start plus
//! one batch, `lsvd_core::gc::client_object_fits`), closed client batches are held
//! back, unnumbered, until GC has made room ([`release_held`]). Writes keep landing in
//! the write log meanwhile and wait only if it fills. So the store holds at most
//! live/gc-start + one batch + one GC pass, however fast clients write.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::object::{ObjectKind, ObjectSpec, encode_object};
use lsvd_core::gc::{
    Relocation, gc_object_extents, group_relocations, live_extents, select_victims, should_collect,
};

use super::{PendingObject, Shared, State, read};

/// Live extents of one victim closer than this are fetched with one GET.
const RUN_GAP_BYTES: u64 = 256 << 10;

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
            let mut st = shared.lock();
            if st.writer_done || shared.failed.load(Ordering::SeqCst) {
                return;
            }
            if !st.gc_busy.is_empty() || st.upload_queue.len() > MAX_CLIENT_BACKLOG {
                continue;
            }
            if !should_collect(&st.store, &cfg, active) {
                active = false;
                st.gc_stalled = false;
                continue;
            }
            let victims = select_victims(&st.store, &cfg, st.next_object_seq, |_| false);
            if victims.is_empty() {
                active = false;
                if !st.gc_stalled {
                    // Nothing to collect: client objects must not wait for GC.
                    st.gc_stalled = true;
                    shared.upload_wake.notify_one();
                }
                continue;
            }
            st.gc_stalled = false;
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
    // Fetch each victim's live data in runs (extents less than a gap apart share one
    // ranged GET), then lay it out in the relocations' LBA order.
    let mut data_of: Vec<Vec<u8>> = vec![Vec::new(); relocations.len()];
    let mut by_victim: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, r) in relocations.iter().enumerate() {
        by_victim.entry(r.source.object_seq).or_default().push(i);
    }
    for (victim, mut idxs) in by_victim {
        let kind = kinds.get(&victim).copied().unwrap_or(ObjectKind::Data);
        idxs.sort_by_key(|&i| relocations[i].source.offset);
        let mut run_start = 0;
        while run_start < idxs.len() {
            let first = &relocations[idxs[run_start]];
            let from = first.source.offset;
            let mut to = from + first.sectors * SECTOR_BYTES;
            let mut run_end = run_start + 1;
            while run_end < idxs.len() {
                let r = &relocations[idxs[run_end]];
                if r.source.offset > to + RUN_GAP_BYTES {
                    break;
                }
                to = to.max(r.source.offset + r.sectors * SECTOR_BYTES);
                run_end += 1;
            }
            let mut buf = vec![0u8; (to - from) as usize];
            read::read_object_direct(shared, victim, kind, from, &mut buf).await?;
            for &i in &idxs[run_start..run_end] {
                let r = &relocations[i];
                let at = (r.source.offset - from) as usize;
                data_of[i] = buf[at..at + (r.sectors * SECTOR_BYTES) as usize].to_vec();
            }
            run_start = run_end;
        }
    }
    // Group in LBA order; a relocation split across groups is sliced accordingly.
    let groups = group_relocations(relocations, shared.config.batch_size_bytes);
    let mut encoded = Vec::with_capacity(groups.len());
    let mut moved = 0u64;
    let mut next = 0usize; // index into relocations
    let mut consumed = 0usize; // bytes of relocations[next] already placed
    for group in &groups {
        let mut data = Vec::new();
        for r in group {
            let len = (r.sectors * SECTOR_BYTES) as usize;
            while data_of[next].len() == consumed {
                next += 1;
                consumed = 0;
            }
            data.extend_from_slice(&data_of[next][consumed..consumed + len]);
            consumed += len;
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
        let bytes = encode_object(&spec, &data);
        st.pending_bytes.insert(seq, bytes.len() as u64);
        st.upload_queue.push_back(PendingObject::Gc { seq, bytes });
    }
    let checkpoint = super::writer::queue_checkpoint(&mut st);
    st.gc_pass_checkpoint = Some(checkpoint);
    drop(st);
    shared.upload_wake.notify_one();
    Ok(moved)
}

/// Number and queue held client batches, oldest first, while the store has room for
/// them (or nothing may be held: GC off, writes stopped, the volume failed, or GC has
/// nothing to collect).
pub(crate) fn release_held(shared: &Shared, st: &mut State) {
    let cfg = &shared.config;
    while let Some(batch) = st.held.front() {
        let object_bytes = batch.data_bytes
            + lsvd_core::format::object::header_bytes_for(
                ObjectKind::Data,
                batch.extents.len(),
                batch.trims.len(),
                batch.data_bytes,
            );
        let hold = cfg.gc.enabled()
            && !st.writer_done
            && !st.gc_stalled
            && !shared.failed.load(Ordering::SeqCst)
            && !lsvd_core::gc::client_object_fits(
                &st.store,
                &cfg.gc,
                st.pending_bytes.values().sum(),
                object_bytes,
                cfg.batch_size_bytes,
            );
        if hold {
            shared.gc_wake.notify_one();
            return;
        }
        let Some(batch) = st.held.pop_front() else {
            return;
        };
        super::writer::queue_batch(shared, st, batch, object_bytes);
    }
}
