//! Moving the write log's tail: the cache superblock names the first record still
//! needed, and only once that is durable is the space before it reused, so a crash
//! never finds a superblock pointing at overwritten records.

use std::sync::Arc;

use lsvd_core::format::cache_super::{CACHE_SUPER_BYTES, CacheSuper, encode_cache_super};

use crate::locks::LockRank;
use crate::shared::Shared;

/// [`persist_tail`] on the blocking pool: its fdatasync flushes every log page
/// written since the last one and, on a busy disk, takes milliseconds to tens of
/// milliseconds, during which a runtime thread would serve no client I/O.
pub(crate) async fn persist_tail_off_runtime(shared: &Arc<Shared>, through: u64, clean: bool) {
    let s = shared.clone();
    if let Err(e) = tokio::task::spawn_blocking(move || persist_tail(&s, through, clean)).await {
        shared.fail(&format!("cache superblock write failed: {e}"));
    }
}

/// Write the cache superblock with the tail after record `through`, then free the
/// space and drop the freed records' extents from the write-log map (reads of them go
/// to the store from then on). Nothing past what the pipeline says is freeable is
/// freed. A clean stop marks the superblock clean and frees no more than the log
/// had freed: the records it keeps are read from it after the next open too. Called
/// with no state lock held.
pub(crate) fn persist_tail(shared: &Shared, through: u64, clean: bool) {
    let _guard = shared.lock_ranked(&shared.super_lock, LockRank::SuperLock);
    let (sb, through) = {
        let mut st = shared.lock();
        let through = through.min(st.pipeline.freeable_through());
        let (tail_offset, tail_seq) = st.log.tail_after(through, st.next_record_seq);
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
            local_key_id: shared.local_key_id,
            claimed_epoch: shared.epoch(),
            claimed_session: if shared
                .volume_claimed
                .load(std::sync::atomic::Ordering::SeqCst)
            {
                shared.index_epoch
            } else {
                0
            },
        };
        (sb, through)
    };
    let slot = (sb.generation % 2) * CACHE_SUPER_BYTES as u64;
    // Only the superblock must be durable before the space is reused; the records
    // after the tail need no more durability than their clients asked for. A clean
    // stop syncs everything, as the next open reads the records it keeps.
    let bytes = encode_cache_super(&sb);
    let r = if clean {
        shared
            .cache
            .write_at(&bytes, slot)
            .and_then(|_| shared.cache.sync())
    } else {
        shared.cache.write_durable_at(&bytes, slot)
    };
    if let Err(e) = r {
        shared.fail(&format!("cache superblock write failed: {e}"));
        return;
    }
    let mut st = shared.lock();
    st.log.free_through(through);
    st.recent_records.release_through(through);
    while st
        .log_headers
        .front()
        .is_some_and(|(_, h)| h.seq <= through)
    {
        let Some((_, header)) = st.log_headers.pop_front() else {
            break;
        };
        // Only entries of freed records go; a newer write's entry stays.
        for e in &header.extents {
            st.log_map.release(e.lba, u64::from(e.sectors), through);
        }
    }
    drop(st);
    // Landed uploads freed log space: writes that found the log stalled may wait
    // for room again (a write that merely fits never clears the stall).
    if shared
        .stats
        .log_stalled
        .swap(false, std::sync::atomic::Ordering::SeqCst)
    {
        lsvd_store::log::info("write log has room again; writes are accepted");
    }
    shared.space_freed.notify_all();
}
