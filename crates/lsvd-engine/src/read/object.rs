//! Reads of object data: from the read cache when it is there, otherwise ranged GETs
//! of whole read-cache chunks, verified against the object's chunk checksums and cached.
//!
//! A miss fetches `EngineConfig::read_fetch_bytes` (whole chunks, clipped to the
//! object), or further when the rest of the same request needs adjacent chunks of the
//! same object; chunks already cached end the run. Chunks being fetched by another
//! reader are waited for, not fetched again (the read cache's in-flight table).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use lsvd_core::format::object::{
    HEADER_PROBE_BYTES, ObjectHeader, decode_object_header, peek_header_bytes,
};

use crate::locks::LockRank;
use crate::read::cache::inflight::{self, ClaimResult};
use crate::read::cache::{CacheObject, READ_CACHE_CHUNK_BYTES, ReadCache};
use crate::shared::{ObjectTag, Shared};
use lsvd_core::error::{Error, ErrorKind, Result};

/// A store error reading `key`, keeping its kind ("not found" tells the read loop that
/// GC moved the data).
/// A failed GET of `key`, counted in `store_get_failures_total`.
fn store_read_error(shared: &Shared, key: &str, e: Error) -> Error {
    shared
        .stats
        .store_get_failures
        .fetch_add(1, Ordering::Relaxed);
    e.context(format!("reading {key}"))
}

/// `key`'s bytes fail their checks.
fn corrupt(key: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::with_source(ErrorKind::Corrupt, key, e)
}

const HEADER_CACHE_ENTRIES: usize = 4096;

/// Keep an object's header for verifying reads of it.
pub(crate) fn remember_header(shared: &Shared, h: Arc<ObjectHeader>) {
    let mut cache = shared.lock_ranked(&shared.headers, LockRank::Headers);
    if cache.len() >= HEADER_CACHE_ENTRIES {
        cache.clear();
    }
    cache.insert(h.seq, h);
}

/// Bytes `range` of `key` (through the store's background path for GC's and
/// read-ahead's reads), counted in `store_gets` and `store_get_bytes`.
async fn get_range(
    shared: &Shared,
    key: &str,
    range: std::ops::Range<u64>,
    background: bool,
) -> lsvd_store::StoreResult<Vec<u8>> {
    shared.stats.store_gets.fetch_add(1, Ordering::Relaxed);
    let got = if background {
        shared.store.get_range_background(key, range).await
    } else {
        shared.store.get_range(key, range).await
    };
    if let Ok(bytes) = &got {
        shared
            .stats
            .store_get_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
    }
    got
}

/// The in-flight table's key for an object's header (no data chunk has this index).
const HEADER_CHUNK: u64 = u64::MAX;

fn cached_header(shared: &Shared, seq: u64) -> Option<Arc<ObjectHeader>> {
    shared
        .lock_ranked(&shared.headers, LockRank::Headers)
        .get(&seq)
        .cloned()
}

/// Object `seq`'s header: from the header cache, or fetched (once for concurrent
/// readers: the others wait for the first one's fetch).
async fn object_header(
    shared: &Shared,
    key: &str,
    obj: CacheObject,
    background: bool,
) -> Result<Arc<ObjectHeader>> {
    let seq = obj.seq;
    let mut _claim = None;
    for _ in 0..WAITS_PER_CHUNK {
        if let Some(h) = cached_header(shared, seq).filter(|h| h.epoch == obj.epoch) {
            return Ok(h);
        }
        let Some(rc) = &shared.read_cache else { break };
        match rc
            .inflight
            .claim(obj, HEADER_CHUNK, HEADER_CHUNK, |_| false)
        {
            ClaimResult::Busy(rx) => inflight::wait(rx).await,
            ClaimResult::Claimed(claim) => {
                _claim = Some(claim);
                break;
            }
        }
    }
    let is_named = |h: &ObjectHeader| {
        if h.seq != seq || h.epoch != obj.epoch || h.volume != shared.volume_of(seq) {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("object {key} is not the object its name says"),
            ));
        }
        Ok(())
    };
    let fetched = fetch_header(shared, key, background)
        .await
        .and_then(|h| is_named(&h).map(|()| h));
    let h = match fetched {
        Ok(h) => h,
        // A bad copy: another copy of the object may be good.
        Err(e) => super::copies::header_from_copies(shared, key, is_named, e).await?,
    };
    let h = Arc::new(h);
    remember_header(shared, h.clone());
    Ok(h)
}

/// Read and decode an object's header with one ranged GET (two if it is large).
async fn fetch_header(shared: &Shared, key: &str, background: bool) -> Result<ObjectHeader> {
    let store_err = |e| store_read_error(shared, key, e);
    let bad = |e| corrupt(key, e);
    let mut buf = get_range(shared, key, 0..HEADER_PROBE_BYTES, background)
        .await
        .map_err(store_err)?;
    let need = peek_header_bytes(&buf).map_err(bad)?;
    if need > buf.len() as u64 {
        let rest = get_range(shared, key, buf.len() as u64..need, background)
            .await
            .map_err(store_err)?;
        buf.extend_from_slice(&rest);
    }
    decode_object_header(&buf).map_err(bad)
}

/// Read `dst.len()` bytes at byte `offset` of object `seq` (whose data section starts
/// at `data_start`), verified: from the read cache when all of it is there (no header
/// needed), otherwise through the store, caching what is fetched. A fetch may extend
/// to data-section chunk `want_last` (the rest of the request needs it).
pub(crate) async fn read_object(
    shared: &Shared,
    seq: u64,
    tag: ObjectTag,
    data_start: u64,
    offset: u64,
    dst: &mut [u8],
    want_last: u64,
) -> Result<()> {
    // The cached prefix first (no header needed); the rest through the store.
    let mut done = 0;
    if let Some(rc) = &shared.read_cache
        && let Some(rel) = data_rel(offset, data_start)
    {
        done = read_cached(rc, shared.cache_object(seq, tag.epoch), rel, dst);
        let chunks = chunks_spanned(rel, done as u64);
        rc.hits.fetch_add(chunks, Ordering::Relaxed);
        if done == dst.len() {
            return Ok(());
        }
    }
    let offset = offset + done as u64;
    let dst = &mut dst[done..];
    let key = shared.object_key(seq, tag.epoch, tag.kind);
    let header = object_header(shared, &key, shared.cache_object(seq, tag.epoch), false).await?;
    match &shared.read_cache {
        Some(rc) => read_via_cache(shared, rc, &key, &header, offset, dst, want_last).await,
        None => {
            let (start, end) = header.verifiable_range(offset, dst.len() as u64);
            let bytes = fetch_verified(shared, &key, &header, start, end).await?;
            let from = (offset - start) as usize;
            dst.copy_from_slice(&bytes[from..from + dst.len()]);
            Ok(())
        }
    }
}

/// Where byte `offset` of an object lies in its data section, which starts at
/// `data_start`; None before it, or when the start is not known (0).
pub(super) fn data_rel(offset: u64, data_start: u64) -> Option<u64> {
    offset.checked_sub(data_start).filter(|_| data_start > 0)
}

/// The first and last read-cache chunks that bytes `[rel, rel + len)` of a data
/// section touch; None if `len` is 0.
pub(super) fn chunk_span(rel: u64, len: u64) -> Option<(u64, u64)> {
    (len > 0).then(|| {
        (
            rel / READ_CACHE_CHUNK_BYTES,
            (rel + len - 1) / READ_CACHE_CHUNK_BYTES,
        )
    })
}

/// Chunks of the read cache that bytes `[rel, rel + len)` of a data section touch.
pub(super) fn chunks_spanned(rel: u64, len: u64) -> u64 {
    chunk_span(rel, len).map_or(0, |(first, last)| last - first + 1)
}

/// Does the read cache hold every chunk of data-section bytes `[rel, rel + len)` of
/// object `seq`? (Without reading them: a caller that would rather not start I/O it
/// cannot finish asks first.)
pub(super) fn all_cached(rc: &ReadCache, obj: CacheObject, rel: u64, len: u64) -> bool {
    chunk_span(rel, len).is_none_or(|(first, last)| (first..=last).all(|c| rc.contains(obj, c)))
}

/// Fill `dst` with data-section bytes `[rel, rel + dst.len())` of object `seq` from the
/// read cache, up to the first chunk it does not hold. Returns the bytes filled (from
/// the start of `dst`; all of it on a full hit, ending at a chunk boundary otherwise).
pub(super) fn read_cached(rc: &ReadCache, obj: CacheObject, rel: u64, dst: &mut [u8]) -> usize {
    let end = rel + dst.len() as u64;
    let mut at = rel;
    while at < end {
        let chunk = at / READ_CACHE_CHUNK_BYTES;
        let chunk_start = chunk * READ_CACHE_CHUNK_BYTES;
        let to = end.min(chunk_start + READ_CACHE_CHUNK_BYTES);
        let Some(bytes) = rc.get(obj, chunk, at - chunk_start, to - chunk_start) else {
            break;
        };
        dst[(at - rel) as usize..(to - rel) as usize].copy_from_slice(&bytes);
        at = to;
    }
    (at - rel) as usize
}

/// Object `seq`'s header for GC's plan: from the header cache, or fetched through the
/// store's background path and checked like any header (the pass's verified GETs of
/// the same object then find it cached).
pub(crate) async fn header_background(
    shared: &Shared,
    seq: u64,
    tag: ObjectTag,
) -> Result<Arc<ObjectHeader>> {
    let key = shared.object_key(seq, tag.epoch, tag.kind);
    object_header(shared, &key, shared.cache_object(seq, tag.epoch), true).await
}

/// Bytes `[from, to)` of an object, bypassing the read cache (GC's bulk reads of cold
/// data). Everything but the GET's own await runs off the runtime's threads: the
/// store's background path, then checksum verification and trimming on the blocking
/// pool (a megabyte each time, many times a second while GC runs).
pub(crate) async fn read_object_background(
    shared: &Shared,
    seq: u64,
    tag: ObjectTag,
    from: u64,
    to: u64,
) -> Result<Vec<u8>> {
    let key = shared.object_key(seq, tag.epoch, tag.kind);
    let header = object_header(shared, &key, shared.cache_object(seq, tag.epoch), true).await?;
    let (start, end) = header.verifiable_range(from, to - from);
    let (stored_start, stored_end) = header.stored_range(start, end);
    let bytes = get_range(shared, &key, stored_start..stored_end, true)
        .await
        .map_err(|e| store_read_error(shared, &key, e))?;
    let trim = move |bytes: Vec<u8>| {
        if (start, end) == (from, to) {
            return bytes;
        }
        bytes[(from - start) as usize..(to - start) as usize].to_vec()
    };
    let verified = {
        let (key, header) = (key.clone(), header.clone());
        tokio::task::spawn_blocking(move || {
            let data = super::copies::open_fetched(&key, &header, start, end, bytes)?;
            Ok(trim(data))
        })
        .await
        // A panicked (or, at shutdown, cancelled) task: GC gives up this pass and
        // tries again later.
        .map_err(|e| Error::with_source(ErrorKind::Transient, "verifying a GC read failed", e))?
    };
    match verified {
        Ok(b) => Ok(b),
        // A bad copy: GC reads another, as clients do (rare: verified on the runtime).
        Err(e) => {
            let bytes =
                super::copies::data_from_copies(shared, &key, &header, start, end, e).await?;
            Ok(trim(bytes))
        }
    }
}

/// Reads of one object from the read cache alone (GC: a victim's live data that
/// clients read recently needs no GET).
pub(crate) struct CachedObjectReader {
    obj: CacheObject,
    /// Where the object's data section starts (its header's size, as the store map
    /// knows it).
    data_start: u64,
}

impl CachedObjectReader {
    pub(crate) fn new(obj: CacheObject, data_start: u64) -> Self {
        CachedObjectReader { obj, data_start }
    }

    /// `len` bytes from byte `offset` of the object, or None if some of it is not
    /// cached. Not counted as client cache hits.
    pub(crate) fn read(&self, shared: &Shared, offset: u64, len: u64) -> Option<Vec<u8>> {
        let rc = shared.read_cache.as_ref()?;
        let rel = offset.checked_sub(self.data_start)?;
        let mut dst = vec![0u8; len as usize];
        (read_cached(rc, self.obj, rel, &mut dst) == dst.len()).then_some(dst)
    }
}

/// Data-section bytes `[start, end)` of an object (chunk-aligned object offsets):
/// their stored bytes fetched with one GET, verified and decompressed.
async fn fetch_verified(
    shared: &Shared,
    key: &str,
    header: &ObjectHeader,
    start: u64,
    end: u64,
) -> Result<Vec<u8>> {
    let (stored_start, stored_end) = header.stored_range(start, end);
    let bytes = get_range(shared, key, stored_start..stored_end, false)
        .await
        .map_err(|e| store_read_error(shared, key, e))?;
    match super::copies::open_fetched(key, header, start, end, bytes) {
        Ok(data) => Ok(data),
        // A bad copy: another copy of the object may be good.
        Err(e) => super::copies::data_from_copies(shared, key, header, start, end, e).await,
    }
}

/// Times a reader waits for other readers' fetches of one chunk before it fetches the
/// chunk itself without the in-flight table (their fetches kept failing or their
/// chunks could not be cached).
const WAITS_PER_CHUNK: u32 = 8;

/// Data-section bytes `[s, e)` of chunk `c` of an object with `data_bytes` of data.
fn chunk_range(c: u64, data_bytes: u64) -> (u64, u64) {
    let s = c * READ_CACHE_CHUNK_BYTES;
    (s, (s + READ_CACHE_CHUNK_BYTES).min(data_bytes))
}

/// Whole chunks one miss fetches (`EngineConfig::read_fetch_bytes`, at least one).
pub(super) fn fetch_chunks(shared: &Shared) -> u64 {
    shared
        .config
        .read_fetch_bytes
        .div_ceil(READ_CACHE_CHUNK_BYTES)
        .max(1)
}

async fn read_via_cache(
    shared: &Shared,
    rc: &ReadCache,
    key: &str,
    header: &ObjectHeader,
    offset: u64,
    dst: &mut [u8],
    want_last: u64,
) -> Result<()> {
    let obj = shared.cache_object(header.seq, header.epoch);
    let data_start = header.header_bytes as u64;
    let rel_start = offset - data_start;
    let rel_end = rel_start + dst.len() as u64;
    if dst.is_empty() {
        return Ok(());
    }
    if rel_end > header.data_bytes {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!("{key}: the map points past the object's data"),
        ));
    }
    // Copy the overlap of data-section bytes `[s, s + bytes.len())` into dst.
    let mut copy = |s: u64, bytes: &[u8]| {
        let e = s + bytes.len() as u64;
        let from = rel_start.max(s);
        let to = rel_end.min(e);
        if from < to {
            dst[(from - rel_start) as usize..(to - rel_start) as usize]
                .copy_from_slice(&bytes[(from - s) as usize..(to - s) as usize]);
        }
    };
    let object_last = (header.data_bytes - 1) / READ_CACHE_CHUNK_BYTES;
    let first = rel_start / READ_CACHE_CHUNK_BYTES;
    let last = (rel_end - 1) / READ_CACHE_CHUNK_BYTES;
    // Chunks past these were not asked for: cached as prefetched.
    let asked_last = last.max(want_last).min(object_last);
    let mut c = first;
    let mut waits = 0;
    while c <= last {
        let (s, e) = chunk_range(c, header.data_bytes);
        let (from, to) = (rel_start.max(s), rel_end.min(e));
        if let Some(bytes) = rc.get(obj, c, from - s, to - s) {
            rc.hits.fetch_add(1, Ordering::Relaxed);
            copy(from, &bytes);
            c += 1;
            waits = 0;
            continue;
        }
        let limit = asked_last
            .max(c + fetch_chunks(shared) - 1)
            .min(object_last);
        let claim = if waits < WAITS_PER_CHUNK {
            match rc.inflight.claim(obj, c, limit, |k| rc.contains(obj, k)) {
                ClaimResult::Busy(rx) => {
                    // Another reader is fetching this chunk: take it from the cache
                    // when that fetch ends.
                    waits += 1;
                    inflight::wait(rx).await;
                    continue;
                }
                // Cached by a fetch that ended since we looked: read it from there.
                ClaimResult::Claimed(_) if rc.contains(obj, c) => {
                    waits += 1;
                    continue;
                }
                ClaimResult::Claimed(claim) => Some(claim),
            }
        } else {
            None
        };
        let run_end = claim.as_ref().map_or(c, |cl| cl.last);
        let (s, _) = chunk_range(c, header.data_bytes);
        let (_, e) = chunk_range(run_end, header.data_bytes);
        let bytes = fetch_verified(shared, key, header, data_start + s, data_start + e).await?;
        rc.misses
            .fetch_add(run_end.min(last) - c + 1, Ordering::Relaxed);
        copy(s, &bytes);
        for k in c..=run_end {
            let (ks, ke) = chunk_range(k, header.data_bytes);
            let data = &bytes[(ks - s) as usize..(ke - s) as usize];
            if k <= asked_last {
                rc.insert(obj, k, data);
            } else {
                rc.prefetch(obj, k, data);
            }
        }
        drop(claim);
        c = run_end + 1;
        waits = 0;
    }
    Ok(())
}

/// Fetch chunks `[first, last]` of object `seq` into the read cache ahead of any
/// client (read-ahead): those neither cached nor being fetched, one GET per run.
/// Returns the bytes fetched.
pub(super) async fn prefetch_chunks(
    shared: &Shared,
    rc: &ReadCache,
    seq: u64,
    tag: ObjectTag,
    first: u64,
    last: u64,
) -> Result<u64> {
    let obj = shared.cache_object(seq, tag.epoch);
    // All there already: not even the header is needed.
    if (first..=last).all(|c| rc.contains(obj, c)) {
        return Ok(0);
    }
    let key = shared.object_key(seq, tag.epoch, tag.kind);
    let header = object_header(shared, &key, obj, false).await?;
    if header.data_bytes == 0 {
        return Ok(0);
    }
    let data_start = header.header_bytes as u64;
    let last = last.min((header.data_bytes - 1) / READ_CACHE_CHUNK_BYTES);
    let mut fetched = 0;
    let mut c = first;
    while c <= last {
        if shared.is_failed() {
            break;
        }
        if rc.contains(obj, c) {
            c += 1;
            continue;
        }
        let claim = match rc.inflight.claim(obj, c, last, |k| rc.contains(obj, k)) {
            // A client (or another read-ahead) is fetching it.
            ClaimResult::Busy(_) => {
                c += 1;
                continue;
            }
            ClaimResult::Claimed(claim) => claim,
        };
        let (s, _) = chunk_range(c, header.data_bytes);
        let (_, e) = chunk_range(claim.last, header.data_bytes);
        let bytes = fetch_verified(shared, &key, &header, data_start + s, data_start + e).await?;
        fetched += bytes.len() as u64;
        for k in c..=claim.last {
            let (ks, ke) = chunk_range(k, header.data_bytes);
            rc.prefetch(obj, k, &bytes[(ks - s) as usize..(ke - s) as usize]);
        }
        c = claim.last + 1;
    }
    Ok(fetched)
}
