//! Where the write-log index lives in the cache file, and when it is written.
//!
//! Why: without it, recovery reads every byte of the write log to verify each
//! record's checksum before replaying it (1 GiB of log = 1 GiB of reads). The index
//! (`lsvd_core::format::log_index`) lists durable records' headers at a fixed place
//! after the log region, so recovery takes those from the index and reads only the
//! records written after it. Format: `docs/format/log-index.md`.
//!
//! The slots it is written to are laid out by [`crate::cache_layout`].

use std::sync::atomic::Ordering;

use lsvd_core::format::VolumeId;
use lsvd_core::format::log_index::{
    LOG_INDEX_FIXED_BYTES, LogIndex, decode_log_index, encode_log_index, log_index_len,
};
use lsvd_core::format::record::encode_header_prefix;

use crate::cache_dev::CacheDevice;
use crate::cache_layout::CacheLayout;
use crate::locks::LockRank;
use crate::shared::Shared;

/// The newest valid index of `volume` in the file's slots written during the open
/// that `epoch` (from the cache superblock) names, if any. Indexes of earlier opens
/// never count: after a recovery the log may hold different records under the same
/// sequence numbers.
pub fn read_newest(
    cache: &dyn CacheDevice,
    layout: &CacheLayout,
    volume: VolumeId,
    epoch: u64,
) -> Option<LogIndex> {
    if layout.slot_bytes == 0 || epoch == 0 {
        return None;
    }
    let read_slot = |slot: u64| -> Option<LogIndex> {
        let at = layout.slot_offset(slot);
        let mut fixed = vec![0u8; LOG_INDEX_FIXED_BYTES];
        cache.read_at(&mut fixed, at).ok()?;
        let len = log_index_len(&fixed).ok()?;
        if len > layout.slot_bytes {
            return None;
        }
        let mut buf = vec![0u8; len as usize];
        cache.read_at(&mut buf, at).ok()?;
        decode_log_index(&buf)
            .ok()
            .filter(|i| i.volume == volume && i.epoch == epoch)
    };
    match (read_slot(0), read_slot(1)) {
        (Some(a), Some(b)) => Some(if a.generation >= b.generation { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// Write a new index if an eighth of the log was appended since the last one. The
/// log writer calls this right after an `fdatasync`, so every record it lists is
/// durable before the index that lists it is written. Costs one index write and one
/// more `fdatasync` per eighth of the log.
pub(crate) fn maybe_write(shared: &Shared) {
    let layout = shared.layout;
    if layout.slot_bytes == 0 {
        return;
    }
    // Serial with cache superblock writes, which share the device's sync.
    let _guard = shared.lock_ranked(&shared.super_lock, LockRank::SuperLock);
    let (generation, bytes) = {
        let mut st = shared.lock();
        let every = ((layout.log_end - layout.log_start) / 8).max(1);
        if st.log_bytes_since_index < every {
            return;
        }
        let synced = st.log_synced_through;
        let headers: Vec<(u64, Vec<u8>)> = st
            .log_headers
            .iter()
            .take_while(|(_, h)| h.seq <= synced)
            .map(|(offset, h)| (*offset, encode_header_prefix(h)))
            .collect();
        if headers.is_empty() {
            return;
        }
        st.log_index_generation += 1;
        st.log_bytes_since_index = 0;
        let generation = st.log_index_generation;
        let bytes = encode_log_index(
            shared.meta.volume,
            generation,
            shared.index_epoch,
            headers.iter().map(|(o, h)| (*o, h.as_slice())),
        );
        (generation, bytes)
    };
    if bytes.len() as u64 > layout.slot_bytes {
        shared
            .stats
            .log_index_skipped
            .fetch_add(1, Ordering::Relaxed);
        return;
    }
    // The records it lists are durable already (through `log_synced_through`).
    let r = shared
        .cache
        .write_durable_at(&bytes, layout.slot_offset(generation));
    match r {
        Ok(()) => {
            shared
                .stats
                .log_index_written
                .fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => shared.fail(&format!("write-log index write failed: {e}")),
    }
}

/// The index of the file, if its superblock's epoch names one, with what is wrong
/// with it compared to the verified chain (`lsvd check`): every record both know
/// must be the same record at the same place.
pub fn check_against_chain(
    cache: &dyn CacheDevice,
    sb: &lsvd_core::format::cache_super::CacheSuper,
    chain: &[crate::recovery::log_scan::FoundRecord],
) -> (Option<LogIndex>, Vec<String>) {
    let Some(layout) = CacheLayout::from_super(cache.size_bytes(), sb.log_start, sb.log_end) else {
        return (None, vec!["impossible log layout in the superblock".into()]);
    };
    let Some(index) = read_newest(cache, &layout, sb.volume, sb.index_epoch) else {
        return (None, Vec::new());
    };
    let mut problems = Vec::new();
    for r in &index.records {
        if let Some(c) = chain.iter().find(|c| c.header.seq == r.header.seq)
            && (c.offset != r.offset || c.header != r.header)
        {
            problems.push(format!(
                "write-log index generation {} describes record {} differently from the log",
                index.generation, r.header.seq
            ));
        }
    }
    (Some(index), problems)
}
