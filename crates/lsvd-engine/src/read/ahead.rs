//! Read-ahead: a sequential reader's next data is fetched into the read cache in the
//! background while it reads, so its reads hit the cache instead of waiting for a GET
//! each. Streams are recognised by the read cache's stream table (`read_cache::streams`,
//! bounded, no I/O); this module turns a window it returns into GETs of the object
//! chunks the window maps to, adjacent chunks of one object in one GET, on a task of
//! its own.
//!
//! Temporal read-ahead (the LSVD paper's "what was written together"): consecutive
//! reads landing in one object, whatever their LBAs, fetch the rest of that object
//! ahead of the reader ([`observe_object`], detection in `read_cache::walk`).
//!
//! Bounded: the bytes of windows being fetched never exceed the read-ahead size, and a
//! window is only asked for when a read advances its stream. Fetched chunks go in as
//! prefetched: they never evict data clients read recently.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use lsvd_core::format::SECTOR_BYTES;

use super::{Source, object, plan};
use crate::config::DEFAULT_READ_AHEAD_BYTES;
use crate::read::cache::READ_CACHE_CHUNK_BYTES;
use crate::shared::{ObjectTag, Shared};

/// The read-ahead size in force: the configured one, or the default for this store.
pub(super) fn read_ahead_bytes(shared: &Shared) -> u64 {
    match shared.config.read_ahead_bytes {
        Some(n) => n,
        None if shared.store.is_local() => 0,
        None => DEFAULT_READ_AHEAD_BYTES,
    }
}

/// Note a client read of `[lba, lba + sectors)`; if it continues a sequential stream,
/// start fetching ahead of it.
pub(super) fn observe(shared: &Arc<Shared>, lba: u64, sectors: u64) {
    let Some(rc) = &shared.read_cache else { return };
    let max_bytes = read_ahead_bytes(shared);
    if max_bytes == 0 {
        return;
    }
    let window = {
        let in_flight = rc.ahead_in_flight_bytes.load(Ordering::Relaxed);
        let room = max_bytes.saturating_sub(in_flight) / SECTOR_BYTES;
        let end = shared.size_bytes.load(Ordering::Acquire) / SECTOR_BYTES;
        rc.streams()
            .observe(lba, sectors, max_bytes / SECTOR_BYTES, room, end)
    };
    let Some((from, len)) = window else { return };
    spawn_counted(shared, len * SECTOR_BYTES, move |shared| async move {
        fetch_window(&shared, from, len).await;
    });
}

/// Run `fetch` on the engine's runtime with `bytes` counted in the read-ahead's
/// in-flight bound until it ends, however it ends.
fn spawn_counted<F, Fut>(shared: &Arc<Shared>, bytes: u64, fetch: F)
where
    F: FnOnce(Arc<Shared>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let Some(rc) = &shared.read_cache else { return };
    rc.ahead_in_flight_bytes.fetch_add(bytes, Ordering::Relaxed);
    let guard = InFlightBytes {
        shared: shared.clone(),
        bytes,
    };
    shared.runtime.spawn(async move {
        fetch(guard.shared.clone()).await;
        drop(guard);
    });
}

/// A client read that `source` served (any source: only object data is noted). If it
/// continues a run of reads in one object (`read_cache::walk`), start fetching the
/// object's chunks ahead of it (those not cached and not being fetched).
pub(super) fn observe_object(shared: &Arc<Shared>, source: &Source, bytes: u64) {
    let &Source::Object {
        seq,
        tag,
        data_start,
        data_end,
        offset,
    } = source
    else {
        return;
    };
    let Some(rc) = &shared.read_cache else { return };
    let max_bytes = read_ahead_bytes(shared);
    if max_bytes == 0 || data_start == 0 || offset < data_start || offset >= data_end {
        return;
    }
    let rel = offset - data_start;
    let read = (
        rel / READ_CACHE_CHUNK_BYTES,
        (rel + bytes.max(1) - 1) / READ_CACHE_CHUNK_BYTES,
    );
    let chunks = (data_end - data_start).div_ceil(READ_CACHE_CHUNK_BYTES);
    let window = {
        let in_flight = rc.ahead_in_flight_bytes.load(Ordering::Relaxed);
        let room = max_bytes.saturating_sub(in_flight) / READ_CACHE_CHUNK_BYTES;
        rc.object_walk().observe(seq, tag.epoch, read, chunks, room)
    };
    let Some((first, last)) = window else { return };
    let bytes = (last - first + 1) * READ_CACHE_CHUNK_BYTES;
    spawn_counted(shared, bytes, move |shared| async move {
        if let Some(rc) = &shared.read_cache
            && !shared.is_failed()
            && let Ok(fetched) = object::prefetch_chunks(&shared, rc, seq, tag, first, last).await
        {
            rc.read_ahead_bytes.fetch_add(fetched, Ordering::Relaxed);
            rc.temporal_ahead_bytes
                .fetch_add(fetched, Ordering::Relaxed);
        }
    });
}

/// Gives the window's bytes back to the in-flight bound however its task ends.
struct InFlightBytes {
    shared: Arc<Shared>,
    bytes: u64,
}

impl Drop for InFlightBytes {
    fn drop(&mut self) {
        if let Some(rc) = &self.shared.read_cache {
            rc.ahead_in_flight_bytes
                .fetch_sub(self.bytes, Ordering::Relaxed);
        }
    }
}

/// A run of chunks of one object to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    seq: u64,
    first: u64,
    last: u64,
    tag: ObjectTag,
}

/// Fetch the object chunks sectors `[lba, lba + sectors)` map to (those not cached
/// and not being fetched). Errors end the window quietly: read-ahead is a guess, and
/// the client's own read will report what is wrong.
async fn fetch_window(shared: &Arc<Shared>, lba: u64, sectors: u64) {
    let Some(rc) = &shared.read_cache else { return };
    let mut runs: Vec<Run> = plan(shared, lba, sectors)
        .into_iter()
        .filter_map(|p| match p.source {
            Source::Object {
                seq,
                tag,
                data_start,
                offset,
                ..
            } if data_start > 0 && offset >= data_start => {
                let rel = offset - data_start;
                Some(Run {
                    seq,
                    first: rel / READ_CACHE_CHUNK_BYTES,
                    last: (rel + p.bytes as u64 - 1) / READ_CACHE_CHUNK_BYTES,
                    tag,
                })
            }
            _ => None,
        })
        .collect();
    for run in merge_runs(&mut runs) {
        if shared.is_failed() {
            return;
        }
        match object::prefetch_chunks(shared, rc, run.seq, run.tag, run.first, run.last).await {
            Ok(bytes) => {
                rc.read_ahead_bytes.fetch_add(bytes, Ordering::Relaxed);
            }
            Err(_) => return,
        }
    }
}

/// Sort `runs` and merge those of one object that overlap or touch.
fn merge_runs(runs: &mut [Run]) -> Vec<Run> {
    runs.sort_unstable_by_key(|r| (r.seq, r.first, r.last));
    let mut out: Vec<Run> = Vec::with_capacity(runs.len());
    for &r in runs.iter() {
        match out.last_mut() {
            Some(prev) if prev.seq == r.seq && r.first <= prev.last.saturating_add(1) => {
                prev.last = prev.last.max(r.last);
            }
            _ => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lsvd_core::format::object::ObjectKind;

    #[test]
    fn runs_of_one_object_merge_when_adjacent() {
        let r = |seq, first, last| Run {
            seq,
            first,
            last,
            tag: ObjectTag {
                kind: ObjectKind::Data,
                epoch: 0,
            },
        };
        let mut runs = vec![r(2, 5, 6), r(1, 3, 3), r(1, 0, 2), r(2, 8, 9), r(1, 4, 4)];
        assert_eq!(
            merge_runs(&mut runs),
            vec![r(1, 0, 4), r(2, 5, 6), r(2, 8, 9)]
        );
    }
}
