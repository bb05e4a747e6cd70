//! The read path: overlay map, then store map, then zeros.
//!
//! The plan is made under the state lock; the I/O happens without it. Data read from
//! the write log is validated afterwards: if its record was freed (and its space
//! possibly reused) while we read, the read is planned again. Data read from objects
//! is fetched in whole 4 KiB chunks and checked against the object's chunk checksums.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::object::{
    HEADER_PROBE_BYTES, ObjectHeader, decode_object_header, peek_header_bytes,
};
use lsvd_core::log_map::LogLoc;

use super::keys::object_key;
use super::read_cache::{READ_CACHE_CHUNK_BYTES, ReadCache};
use super::shared::Shared;
use crate::error::{Error, ErrorKind, Result};

#[derive(Debug, Clone, Copy)]
enum Source {
    Zero,
    Log {
        record_seq: u64,
        offset: u64,
    },
    Object {
        seq: u64,
        kind: lsvd_core::format::object::ObjectKind,
        /// Where the object's data section starts (its header's size).
        data_start: u64,
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
                            let (kind, data_start) =
                                st.pipeline.store().objects().get(&loc.object_seq).map_or(
                                    (lsvd_core::format::object::ObjectKind::Data, 0),
                                    |o| (o.kind, u64::from(o.header_bytes)),
                                );
                            Source::Object {
                                seq: loc.object_seq,
                                kind,
                                data_start,
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

/// How many times a piece of a read may be planned before the read gives up.
const READ_PLAN_ATTEMPTS: u32 = 16;

pub(crate) async fn read(shared: &Arc<Shared>, lba: u64, sectors: u64) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; (sectors * SECTOR_BYTES) as usize];
    // What is still to be read: (lba, sectors). Only the pieces a race invalidated are
    // planned again, so a slow object read cannot make a read start over forever while
    // uploads keep freeing the log records it also reads from.
    let mut todo = vec![(lba, sectors)];
    for _attempt in 0..READ_PLAN_ATTEMPTS {
        let mut again: Vec<(u64, u64)> = Vec::new();
        let mut log_pieces: Vec<(u64, u64, u64, u64)> = Vec::new(); // (lba, sectors, seq, offset)
        for &(l, n) in &todo {
            for p in plan(shared, l, n) {
                let p_lba = l + p.buf_offset as u64 / SECTOR_BYTES;
                let p_sectors = p.bytes as u64 / SECTOR_BYTES;
                let at = ((p_lba - lba) * SECTOR_BYTES) as usize;
                let dst = &mut buf[at..at + p.bytes];
                match p.source {
                    Source::Zero => dst.fill(0),
                    Source::Log { record_seq, offset } => {
                        log_pieces.push((p_lba, p_sectors, record_seq, offset))
                    }
                    Source::Object {
                        seq,
                        kind,
                        data_start,
                        offset,
                    } => {
                        match read_object(shared, seq, kind, data_start, offset, dst).await {
                            Ok(()) => {}
                            // GC moved the data and deleted the object after we
                            // planned the read: plan this piece again (the map points
                            // at the new copy).
                            Err(e) if e.is_not_found() => again.push((p_lba, p_sectors)),
                            Err(e) => return Err(e),
                        }
                    }
                }
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

/// A store error reading `key`, keeping its kind ("not found" tells the read loop that
/// GC moved the data).
fn store_read_error(key: &str, e: Error) -> Error {
    e.context(format!("reading {key}"))
}

/// `key`'s bytes fail their checks.
fn corrupt(key: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::with_source(ErrorKind::Corrupt, key, e)
}

const HEADER_CACHE_ENTRIES: usize = 4096;

/// Keep an object's header for verifying reads of it.
pub(crate) fn remember_header(shared: &Shared, h: Arc<ObjectHeader>) {
    let mut cache = shared.headers.lock().unwrap_or_else(|p| p.into_inner());
    if cache.len() >= HEADER_CACHE_ENTRIES {
        cache.clear();
    }
    cache.insert(h.seq, h);
}

/// Bytes `range` of `key`, through the store's background path for GC's reads.
fn get_range<'a>(
    shared: &'a Shared,
    key: &str,
    range: std::ops::Range<u64>,
    background: bool,
) -> crate::store::BoxFuture<'a, crate::store::StoreResult<Vec<u8>>> {
    if background {
        shared.store.get_range_background(key, range)
    } else {
        shared.store.get_range(key, range)
    }
}

async fn object_header(
    shared: &Shared,
    key: &str,
    seq: u64,
    background: bool,
) -> Result<Arc<ObjectHeader>> {
    if let Some(h) = shared
        .headers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&seq)
    {
        return Ok(h.clone());
    }
    let h = Arc::new(fetch_header(shared, key, background).await?);
    if h.seq != seq || h.volume != shared.meta.volume {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!("object {key} is not the object its name says"),
        ));
    }
    remember_header(shared, h.clone());
    Ok(h)
}

/// Read and decode an object's header with one ranged GET (two if it is large).
pub(crate) async fn fetch_header(
    shared: &Shared,
    key: &str,
    background: bool,
) -> Result<ObjectHeader> {
    let store_err = |e| store_read_error(key, e);
    let bad = |e| corrupt(key, e);
    shared.stats.store_gets.fetch_add(1, Ordering::Relaxed);
    let mut buf = get_range(shared, key, 0..HEADER_PROBE_BYTES, background)
        .await
        .map_err(store_err)?;
    let need = peek_header_bytes(&buf).map_err(bad)?;
    if need > buf.len() as u64 {
        shared.stats.store_gets.fetch_add(1, Ordering::Relaxed);
        let rest = get_range(shared, key, buf.len() as u64..need, background)
            .await
            .map_err(store_err)?;
        buf.extend_from_slice(&rest);
    }
    decode_object_header(&buf).map_err(bad)
}

/// Read `dst.len()` bytes at byte `offset` of object `seq` (whose data section starts
/// at `data_start`), verified: from the read cache when all of it is there (no header
/// needed), otherwise through the store, caching what is fetched.
pub(crate) async fn read_object(
    shared: &Shared,
    seq: u64,
    kind: lsvd_core::format::object::ObjectKind,
    data_start: u64,
    offset: u64,
    dst: &mut [u8],
) -> Result<()> {
    if let Some(rc) = &shared.read_cache
        && data_start > 0
        && offset >= data_start
        && read_cached(rc, seq, offset - data_start, dst)
    {
        let chunks = chunks_spanned(offset - data_start, dst.len() as u64);
        rc.hits.fetch_add(chunks, Ordering::Relaxed);
        return Ok(());
    }
    let key = object_key(&shared.meta.name, seq, kind);
    let header = object_header(shared, &key, seq, false).await?;
    match &shared.read_cache {
        Some(rc) => read_via_cache(shared, rc, &key, &header, offset, dst).await,
        None => {
            let (start, end) = header.verifiable_range(offset, dst.len() as u64);
            let bytes = fetch_verified(shared, &key, &header, start, end).await?;
            let from = (offset - start) as usize;
            dst.copy_from_slice(&bytes[from..from + dst.len()]);
            Ok(())
        }
    }
}

/// Chunks of the read cache that bytes `[rel, rel + len)` of a data section touch.
fn chunks_spanned(rel: u64, len: u64) -> u64 {
    if len == 0 {
        return 0;
    }
    (rel + len - 1) / READ_CACHE_CHUNK_BYTES - rel / READ_CACHE_CHUNK_BYTES + 1
}

/// Fill `dst` with data-section bytes `[rel, rel + dst.len())` of object `seq` from the
/// read cache alone; false (with `dst` partly written) if any part is not cached.
fn read_cached(rc: &ReadCache, seq: u64, rel: u64, dst: &mut [u8]) -> bool {
    let end = rel + dst.len() as u64;
    let mut at = rel;
    while at < end {
        let chunk = at / READ_CACHE_CHUNK_BYTES;
        let chunk_start = chunk * READ_CACHE_CHUNK_BYTES;
        let to = end.min(chunk_start + READ_CACHE_CHUNK_BYTES);
        let Some(bytes) = rc.get(seq, chunk, at - chunk_start, to - chunk_start) else {
            return false;
        };
        dst[(at - rel) as usize..(to - rel) as usize].copy_from_slice(&bytes);
        at = to;
    }
    true
}

/// Bytes `[from, to)` of an object, bypassing the read cache (GC's bulk reads of cold
/// data). Everything but the GET's own await runs off the runtime's threads: the
/// store's background path, then checksum verification and trimming on the blocking
/// pool (a megabyte each time, many times a second while GC runs).
pub(crate) async fn read_object_background(
    shared: &Shared,
    seq: u64,
    kind: lsvd_core::format::object::ObjectKind,
    from: u64,
    to: u64,
) -> Result<Vec<u8>> {
    let key = object_key(&shared.meta.name, seq, kind);
    let header = object_header(shared, &key, seq, true).await?;
    let (start, end) = header.verifiable_range(from, to - from);
    shared.stats.store_gets.fetch_add(1, Ordering::Relaxed);
    let bytes = shared
        .store
        .get_range_background(&key, start..end)
        .await
        .map_err(|e| store_read_error(&key, e))?;
    tokio::task::spawn_blocking(move || {
        check_fetched(&key, &header, start, end, &bytes)?;
        if (start, end) == (from, to) {
            return Ok(bytes);
        }
        Ok(bytes[(from - start) as usize..(to - start) as usize].to_vec())
    })
    .await
    // A panicked (or, at shutdown, cancelled) task: GC gives up this pass and tries
    // again later.
    .map_err(|e| Error::with_source(ErrorKind::Transient, "verifying a GC read failed", e))?
}

/// Reads of one object from the read cache alone (GC: a victim's live data that
/// clients read recently needs no GET).
pub(crate) struct CachedObjectReader {
    seq: u64,
    /// Where the object's data section starts (its header's size, as the store map
    /// knows it).
    data_start: u64,
}

impl CachedObjectReader {
    pub(crate) fn new(seq: u64, data_start: u64) -> Self {
        CachedObjectReader { seq, data_start }
    }

    /// `len` bytes from byte `offset` of the object, or None if some of it is not
    /// cached. Not counted as client cache hits.
    pub(crate) fn read(&self, shared: &Shared, offset: u64, len: u64) -> Option<Vec<u8>> {
        let rc = shared.read_cache.as_ref()?;
        let rel = offset.checked_sub(self.data_start)?;
        let mut dst = vec![0u8; len as usize];
        read_cached(rc, self.seq, rel, &mut dst).then_some(dst)
    }
}

/// GET bytes `[start, end)` of an object (chunk-aligned) and verify them.
async fn fetch_verified(
    shared: &Shared,
    key: &str,
    header: &ObjectHeader,
    start: u64,
    end: u64,
) -> Result<Vec<u8>> {
    shared.stats.store_gets.fetch_add(1, Ordering::Relaxed);
    let bytes = shared
        .store
        .get_range(key, start..end)
        .await
        .map_err(|e| store_read_error(key, e))?;
    check_fetched(key, header, start, end, &bytes)?;
    Ok(bytes)
}

/// Bytes `[start, end)` fetched from object `key`: all there, and matching the
/// header's chunk checksums.
fn check_fetched(
    key: &str,
    header: &ObjectHeader,
    start: u64,
    end: u64,
    bytes: &[u8],
) -> Result<()> {
    if bytes.len() as u64 != end - start {
        return Err(Error::new(ErrorKind::Corrupt, format!("{key}: short read")));
    }
    header
        .verify_data(start, bytes)
        .map_err(|e| corrupt(key, e))
}

async fn read_via_cache(
    shared: &Shared,
    rc: &ReadCache,
    key: &str,
    header: &ObjectHeader,
    offset: u64,
    dst: &mut [u8],
) -> Result<()> {
    let data_start = header.header_bytes as u64;
    let rel_start = offset - data_start;
    let rel_end = rel_start + dst.len() as u64;
    let chunk_range = |c: u64| -> (u64, u64) {
        let s = c * READ_CACHE_CHUNK_BYTES;
        (s, (s + READ_CACHE_CHUNK_BYTES).min(header.data_bytes))
    };
    // Copy the overlap of chunk-relative bytes `[s, e)` (given as `bytes`) into dst.
    let mut copy = |s: u64, bytes: &[u8]| {
        let e = s + bytes.len() as u64;
        let from = rel_start.max(s);
        let to = rel_end.min(e);
        if from < to {
            dst[(from - rel_start) as usize..(to - rel_start) as usize]
                .copy_from_slice(&bytes[(from - s) as usize..(to - s) as usize]);
        }
    };
    let first = rel_start / READ_CACHE_CHUNK_BYTES;
    let last = (rel_end - 1) / READ_CACHE_CHUNK_BYTES;
    let mut c = first;
    while c <= last {
        let (s, e) = chunk_range(c);
        let (from, to) = (rel_start.max(s), rel_end.min(e));
        if let Some(bytes) = rc.get(header.seq, c, from - s, to - s) {
            rc.hits.fetch_add(1, Ordering::Relaxed);
            copy(from, &bytes);
            c += 1;
            continue;
        }
        // Fetch the run of missing chunks with one ranged GET.
        let mut run_end = c;
        while run_end < last && !rc.contains(header.seq, run_end + 1) {
            run_end += 1;
        }
        let (s, _) = chunk_range(c);
        let (_, e) = chunk_range(run_end);
        let bytes = fetch_verified(shared, key, header, data_start + s, data_start + e).await?;
        rc.misses.fetch_add(run_end - c + 1, Ordering::Relaxed);
        copy(s, &bytes);
        for k in c..=run_end {
            let (ks, ke) = chunk_range(k);
            rc.insert(header.seq, k, &bytes[(ks - s) as usize..(ke - s) as usize]);
        }
        c = run_end + 1;
    }
    Ok(())
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
