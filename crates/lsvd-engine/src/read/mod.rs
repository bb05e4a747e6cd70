//! The read path: overlay map, then store map, then zeros.
//!
//! The plan is made under the state lock; the I/O happens without it. Data read from
//! the write log is validated afterwards: if its record was freed (and its space
//! possibly reused) while we read, the read is planned again. Data read from objects
//! comes from the read cache or is fetched in whole read-cache chunks, checked against
//! the object's chunk checksums ([`object`]); pieces of one request that are adjacent
//! in one object share a GET. Sequential readers get read-ahead ([`ahead`]).

mod ahead;
pub(crate) mod cache;
mod copies;
mod object;
#[cfg(test)]
mod shared_cache_tests;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::log_map::LogLoc;

use crate::shared::{ObjectTag, Shared};
use lsvd_core::error::{Error, ErrorKind, Result};

pub(crate) use object::{
    CachedObjectReader, header_background, read_object_background, remember_header,
};

#[derive(Debug, Clone, Copy)]
enum Source {
    Zero,
    Log {
        record_seq: u64,
        offset: u64,
    },
    Object {
        seq: u64,
        tag: ObjectTag,
        /// Where the object's data section starts (its header's size).
        data_start: u64,
        /// Where it ends (the header and the uncompressed data section).
        data_end: u64,
        offset: u64,
    },
}

struct Piece {
    buf_offset: usize,
    bytes: usize,
    source: Source,
}

fn plan(shared: &Shared, lba: u64, sectors: u64) -> Vec<Piece> {
    let st = shared.lock();
    let mut out = Vec::new();
    st.log_map.for_each_in(lba, sectors, |p| {
        let buf_offset = ((p.lba - lba) * SECTOR_BYTES) as usize;
        match p.location {
            Some(LogLoc::Data { record_seq, offset }) => out.push(Piece {
                buf_offset,
                bytes: (p.sectors * SECTOR_BYTES) as usize,
                source: Source::Log { record_seq, offset },
            }),
            Some(LogLoc::Zero { .. }) => out.push(Piece {
                buf_offset,
                bytes: (p.sectors * SECTOR_BYTES) as usize,
                source: Source::Zero,
            }),
            None => st
                .pipeline
                .store()
                .map()
                .for_each_in(p.lba, p.sectors, |q| {
                    let buf_offset = ((q.lba - lba) * SECTOR_BYTES) as usize;
                    let bytes = (q.sectors * SECTOR_BYTES) as usize;
                    let source = match q.location {
                        None => Source::Zero,
                        Some(loc) => {
                            let (tag, data_start, data_end) =
                                st.pipeline.store().objects().get(&loc.object_seq).map_or(
                                    (
                                        ObjectTag {
                                            kind: lsvd_core::format::object::ObjectKind::Data,
                                            epoch: 0,
                                        },
                                        0,
                                        0,
                                    ),
                                    |o| {
                                        (ObjectTag::of(o), u64::from(o.header_bytes), o.total_bytes)
                                    },
                                );
                            Source::Object {
                                seq: loc.object_seq,
                                tag,
                                data_start,
                                data_end,
                                offset: loc.offset,
                            }
                        }
                    };
                    out.push(Piece {
                        buf_offset,
                        bytes,
                        source,
                    });
                }),
        }
    });
    out
}

/// [`read`] without waiting, for data that is local: zeros, the write log, chunks in
/// the read cache. `None` when some of it is not (it needs a GET or a store read, on
/// the engine's runtime) or a race moved it (a log record freed meanwhile): the caller
/// then runs [`read`], which also handles those. Lets a thread that serves one NBD
/// connection answer a read without handing it to another thread.
pub(crate) fn read_local(shared: &Arc<Shared>, lba: u64, sectors: u64) -> Option<Result<Vec<u8>>> {
    let pieces = plan(shared, lba, sectors);
    // A piece the read cache does not hold sends the read the long way: see that
    // before reading anything, so a miss does no I/O here that `read` repeats.
    for p in &pieces {
        if let Source::Object {
            seq,
            tag,
            data_start,
            offset,
            ..
        } = p.source
        {
            let rc = shared.read_cache.as_ref()?;
            let rel = object::data_rel(offset, data_start)?;
            let obj = shared.cache_object(seq, tag.epoch);
            if !object::all_cached(rc, obj, rel, p.bytes as u64) {
                return None;
            }
        }
    }
    let mut buf = vec![0u8; (sectors * SECTOR_BYTES) as usize];
    // The lowest and highest log record read from: `LogSpace::holds` is a range
    // check (oldest record held ≤ seq ≤ newest), so every record read is held if
    // these two are. A Vec of every record read was an allocation per read.
    let mut log_seqs: Option<(u64, u64)> = None;
    let mut chunk_hits = 0;
    for p in &pieces {
        let dst = &mut buf[p.buf_offset..p.buf_offset + p.bytes];
        match p.source {
            // The buffer starts zeroed.
            Source::Zero => {}
            Source::Log { record_seq, offset } => {
                if let Err(e) = shared.cache.read_at(dst, offset) {
                    return Some(Err(Error::local_io("write-log read failed", e)));
                }
                log_seqs = Some(log_seqs.map_or((record_seq, record_seq), |(lo, hi)| {
                    (lo.min(record_seq), hi.max(record_seq))
                }));
            }
            Source::Object {
                seq,
                tag,
                data_start,
                offset,
                ..
            } => {
                let rc = shared.read_cache.as_ref()?;
                let rel = object::data_rel(offset, data_start)?;
                // Evicted since the check above (rare): the long way after all.
                let obj = shared.cache_object(seq, tag.epoch);
                if object::read_cached(rc, obj, rel, dst) < dst.len() {
                    return None;
                }
                chunk_hits += object::chunks_spanned(rel, dst.len() as u64);
            }
        }
    }
    {
        let st = shared.lock();
        if !log_seqs.is_none_or(|(lo, hi)| st.log.holds(lo) && st.log.holds(hi)) {
            return None;
        }
    }
    ahead::observe(shared, lba, sectors);
    for p in &pieces {
        ahead::observe_object(shared, &p.source, p.bytes as u64);
    }
    if let Some(rc) = &shared.read_cache {
        rc.hits.fetch_add(chunk_hits, Ordering::Relaxed);
    }
    shared
        .stats
        .client_read_bytes
        .fetch_add(buf.len() as u64, Ordering::Relaxed);
    Some(Ok(buf))
}

/// How many times a piece of a read may be planned before the read gives up.
const READ_PLAN_ATTEMPTS: u32 = 16;

pub(crate) async fn read(shared: &Arc<Shared>, lba: u64, sectors: u64) -> Result<Vec<u8>> {
    ahead::observe(shared, lba, sectors);
    let mut buf = vec![0u8; (sectors * SECTOR_BYTES) as usize];
    // What is still to be read: (lba, sectors). Only the pieces a race invalidated are
    // planned again, so a slow object read cannot make a read start over forever while
    // uploads keep freeing the log records it also reads from.
    let mut todo = vec![(lba, sectors)];
    for attempt in 0..READ_PLAN_ATTEMPTS {
        let mut again: Vec<(u64, u64)> = Vec::new();
        let mut log_pieces: Vec<(u64, u64, u64, u64)> = Vec::new(); // (lba, sectors, seq, offset)
        let mut object_pieces: Vec<ObjectPiece> = Vec::new();
        for &(l, n) in &todo {
            for p in plan(shared, l, n) {
                let p_lba = l + p.buf_offset as u64 / SECTOR_BYTES;
                let p_sectors = p.bytes as u64 / SECTOR_BYTES;
                if attempt == 0 {
                    ahead::observe_object(shared, &p.source, p.bytes as u64);
                }
                match p.source {
                    Source::Zero => {
                        let at = ((p_lba - lba) * SECTOR_BYTES) as usize;
                        buf[at..at + p.bytes].fill(0);
                    }
                    Source::Log { record_seq, offset } => {
                        log_pieces.push((p_lba, p_sectors, record_seq, offset))
                    }
                    Source::Object {
                        seq,
                        tag,
                        data_start,
                        offset,
                        ..
                    } => object_pieces.push(ObjectPiece {
                        lba: p_lba,
                        sectors: p_sectors,
                        seq,
                        tag,
                        data_start,
                        offset,
                        want_last: 0,
                    }),
                }
            }
        }
        extend_to_adjacent(&mut object_pieces);
        for p in &object_pieces {
            let at = ((p.lba - lba) * SECTOR_BYTES) as usize;
            let dst = &mut buf[at..at + (p.sectors * SECTOR_BYTES) as usize];
            match object::read_object(
                shared,
                p.seq,
                p.tag,
                p.data_start,
                p.offset,
                dst,
                p.want_last,
            )
            .await
            {
                Ok(()) => {}
                // GC moved the data and deleted the object after we planned the read:
                // plan this piece again (the map points at the new copy).
                Err(e) if e.is_not_found() => again.push((p.lba, p.sectors)),
                Err(e) => return Err(e),
            }
        }
        // Log pieces last (local and fast), then check that their records were not
        // freed (their space possibly reused) while we read them.
        for &(p_lba, p_sectors, _, offset) in &log_pieces {
            let at = ((p_lba - lba) * SECTOR_BYTES) as usize;
            shared
                .cache
                .read_at(
                    &mut buf[at..at + (p_sectors * SECTOR_BYTES) as usize],
                    offset,
                )
                .map_err(|e| Error::local_io("write-log read failed", e))?;
        }
        {
            let st = shared.lock();
            again.extend(
                log_pieces
                    .iter()
                    .filter(|&&(_, _, seq, _)| !st.log.holds(seq))
                    .map(|&(l, n, _, _)| (l, n)),
            );
        }
        if again.is_empty() {
            shared
                .stats
                .client_read_bytes
                .fetch_add(buf.len() as u64, Ordering::Relaxed);
            return Ok(buf);
        }
        todo = again;
    }
    // Nothing is wrong, the volume was just busy: trying again may well succeed.
    Err(Error::new(
        ErrorKind::Transient,
        "read kept racing with log reclamation or garbage collection",
    ))
}

/// A piece of a read that comes from an object.
#[derive(Debug, Clone, Copy)]
struct ObjectPiece {
    lba: u64,
    sectors: u64,
    seq: u64,
    tag: ObjectTag,
    data_start: u64,
    offset: u64,
    /// The last data-section chunk of the run of adjacent chunks of this object the
    /// request needs, this piece's among them: a miss fetches through it in one GET.
    want_last: u64,
}

impl ObjectPiece {
    /// The data-section chunks it touches (first, last); None if the map's offset is
    /// not in the data section (the read itself reports that).
    fn chunks(&self) -> Option<(u64, u64)> {
        let rel = self.offset.checked_sub(self.data_start)?;
        object::chunk_span(rel, self.sectors * SECTOR_BYTES)
    }
}

/// Set every piece's `want_last`: pieces of one object whose chunks overlap or touch
/// form one run, fetched by the first miss among them.
fn extend_to_adjacent(pieces: &mut [ObjectPiece]) {
    let mut order: Vec<(u64, u64, u64, usize)> = pieces
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            let (first, last) = p.chunks()?;
            Some((p.seq, first, last, i))
        })
        .collect();
    order.sort_unstable();
    let mut group_start = 0;
    while group_start < order.len() {
        let (seq, _, mut last, _) = order[group_start];
        let mut end = group_start + 1;
        while end < order.len() && order[end].0 == seq && order[end].1 <= last.saturating_add(1) {
            last = last.max(order[end].2);
            end += 1;
        }
        for &(_, _, _, i) in &order[group_start..end] {
            pieces[i].want_last = last;
        }
        group_start = end;
    }
}

/// Runs of (bytes, allocated) covering the range.
pub(crate) fn allocation(shared: &Shared, lba: u64, sectors: u64) -> Vec<(u64, bool)> {
    let st = shared.lock();
    let mut runs: Vec<(u64, bool)> = Vec::new();
    let mut push = |bytes: u64, allocated: bool| match runs.last_mut() {
        Some(last) if last.1 == allocated => last.0 += bytes,
        _ => runs.push((bytes, allocated)),
    };
    st.log_map.for_each_in(lba, sectors, |p| match p.location {
        Some(LogLoc::Data { .. }) => push(p.sectors * SECTOR_BYTES, true),
        Some(LogLoc::Zero { .. }) => push(p.sectors * SECTOR_BYTES, false),
        None => st
            .pipeline
            .store()
            .map()
            .for_each_in(p.lba, p.sectors, |q| {
                push(q.sectors * SECTOR_BYTES, q.location.is_some())
            }),
    });
    runs
}
