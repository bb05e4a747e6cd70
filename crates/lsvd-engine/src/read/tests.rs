//! Read-path tests on the in-memory store, counting GETs: a miss fetches the
//! configured fetch size, concurrent misses on one chunk share one GET, pieces of a
//! request adjacent in one object share one GET, and read-ahead runs ahead of a
//! sequential reader, bounded, and stops when the reader does. Data read is always
//! compared with what was written.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use crate::test_support::{create_and_open, open_v, poll_until, wait_until};
use crate::{EngineConfig, Volume, create_volume};
use lsvd_store::DynStore;
use lsvd_store::faulty::{FaultPlan, FaultyStore};
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// Bytes of the volume at `offset`, distinct for every 8-byte word (and `version`).
fn pattern(offset: u64, len: u64, version: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len as usize);
    for w in 0..len / 8 {
        v.extend_from_slice(&((offset + 8 * w) ^ version << 56).to_le_bytes());
    }
    v
}

fn config(fetch: u64, ahead: u64) -> EngineConfig {
    EngineConfig {
        batch_size_bytes: 8 * MIB,
        batch_timeout_ms: 50,
        log_size_bytes: 64 * MIB,
        read_cache_bytes: 64 * MIB,
        read_fetch_bytes: fetch,
        read_ahead_bytes: Some(ahead),
        ..EngineConfig::default()
    }
}

/// Waits until no read-ahead fetch of `v` is in flight; `what` names the wait.
async fn wait_read_ahead_landed(v: &Volume, what: &str) {
    wait_until(what, async || {
        v.shared
            .read_cache
            .as_ref()
            .is_some_and(|r| r.ahead_in_flight_bytes.load(Relaxed) == 0)
    })
    .await;
}

/// A volume of `size` bytes whose data is all in objects (written in `write_bytes`
/// writes of `pattern`, uploaded, the log emptied by a clean restart), opened with
/// `cfg` on `store`.
async fn volume_in_store(
    dir: &TempDir,
    store: &DynStore,
    size: u64,
    write_bytes: u64,
    cfg: EngineConfig,
) -> Arc<Volume> {
    let (volume, _) = create_and_open(store, "v", size, dir.path(), config(64 * KIB, 0)).await;
    for at in (0..size).step_by(write_bytes as usize) {
        volume
            .write(at, pattern(at, write_bytes, 1), false)
            .await
            .expect("write");
    }
    volume.shutdown().await.expect("shutdown");
    // Another cache directory: a cold read cache, nothing in the log.
    let cold = dir.path().join("cold");
    std::fs::create_dir_all(&cold).expect("mkdir");
    let (volume, _) = open_v(store, &cold, cfg, "reopen").await;
    volume
}

fn gets(v: &Volume) -> u64 {
    v.stats().store_gets.load(Relaxed)
}

/// Read `[from, to)` in `req`-byte reads and compare with the pattern.
async fn read_sequentially(v: &Volume, from: u64, to: u64, req: u64) {
    for at in (from..to).step_by(req as usize) {
        let got = v.read(at, req).await.expect("read");
        assert!(got == pattern(at, req, 1), "data at {at}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_miss_fetches_the_fetch_size_and_caches_all_of_it() {
    let size = 16 * MIB;
    for fetch in [64 * KIB, MIB, 300 * KIB] {
        let dir = TempDir::new("read-fetch");
        let store: DynStore = Arc::new(MemStore::new());
        let v = volume_in_store(&dir, &store, size, MIB, config(fetch, 0)).await;
        let objects = v.status().objects;
        let g0 = gets(&v);
        read_sequentially(&v, 0, size, 64 * KIB).await;
        let n = gets(&v) - g0;
        // One GET per fetch of whole chunks; per object, one or two for its header
        // and one for a short fetch at its end.
        let least = (size / (64 * KIB)).div_ceil(fetch.div_ceil(64 * KIB));
        assert!(
            (least..=least + 3 * objects).contains(&n),
            "fetch {fetch}: {n} GETs for {objects} objects, at least {least}"
        );
        let s = v.status();
        if fetch > 64 * KIB {
            assert!(s.read_prefetch_bytes > 0);
            assert_eq!(
                s.read_prefetch_hit_bytes, s.read_prefetch_bytes,
                "every prefetched chunk was read"
            );
        }
        // All of it is cached now.
        let g1 = gets(&v);
        read_sequentially(&v, 0, size, MIB).await;
        assert_eq!(gets(&v), g1);
        v.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_on_one_chunk_share_one_get() {
    let dir = TempDir::new("read-shared-get");
    let mem: DynStore = Arc::new(MemStore::new());
    let faulty = Arc::new(FaultyStore::new(mem, FaultPlan::default(), 1));
    let store: DynStore = faulty.clone();
    let v = volume_in_store(&dir, &store, 4 * MIB, MIB, config(64 * KIB, 0)).await;
    // Slow GETs, so that the readers overlap.
    faulty.set_get_delay_ms(200);
    let g0 = gets(&v);
    let readers: Vec<_> = (0..8u64)
        .map(|i| {
            let v = v.clone();
            // Different blocks of chunk 1 of the first object, and its header.
            let at = 64 * KIB + (i % 4) * 4 * KIB;
            tokio::spawn(async move {
                let got = v.read(at, 4 * KIB).await.expect("read");
                assert!(got == pattern(at, 4 * KIB, 1), "data at {at}");
            })
        })
        .collect();
    for r in readers {
        r.await.expect("reader");
    }
    // The header (one GET, two if it is large) and the chunk (one GET).
    let n = gets(&v) - g0;
    assert!((2..=3).contains(&n), "{n} GETs");
    faulty.set_get_delay_ms(0);
    v.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pieces_of_a_request_adjacent_in_an_object_share_one_get() {
    let dir = TempDir::new("read-adjacent");
    let store: DynStore = Arc::new(MemStore::new());
    create_volume(&store, "v", 4 * MIB).await.expect("create");
    // Object 1 holds [0, 64K) and [128K, 192K) next to each other (one session, its
    // batch closed at shutdown); object 2 holds [64K, 128K) written later.
    let cfg = EngineConfig {
        batch_timeout_ms: 600_000,
        ..config(64 * KIB, 0)
    };
    for ats in [&[0, 128 * KIB][..], &[64 * KIB]] {
        let (v, _) = open_v(&store, dir.path(), cfg.clone(), "open").await;
        for &at in ats {
            v.write(at, pattern(at, 64 * KIB, 1), false)
                .await
                .expect("write");
        }
        v.shutdown().await.expect("shutdown");
    }
    let cold = dir.path().join("cold");
    std::fs::create_dir_all(&cold).expect("mkdir");
    let (v, _) = open_v(&store, &cold, cfg, "reopen").await;
    assert_eq!(v.status().objects, 2);
    let g0 = gets(&v);
    let got = v.read(0, 192 * KIB).await.expect("read");
    assert!(got == pattern(0, 192 * KIB, 1));
    // Two headers and two data GETs (one per object), not three.
    assert_eq!(gets(&v) - g0, 4);
    v.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_ahead_runs_ahead_of_a_sequential_reader_and_stops_with_it() {
    let dir = TempDir::new("read-ahead");
    let store: DynStore = Arc::new(MemStore::new());
    let ahead = 2 * MIB;
    let size = 32 * MIB;
    let v = volume_in_store(&dir, &store, size, MIB, config(64 * KIB, ahead)).await;
    let req = 128 * KIB;
    // Three reads make a stream; the third starts a window ahead of it.
    read_sequentially(&v, 0, 3 * req, req).await;
    let rc = |v: &Volume| v.status();
    wait_until("the first window", async || rc(&v).read_ahead_bytes > 0).await;
    wait_read_ahead_landed(&v, "the window's fetch").await;
    // The next read was fetched ahead: no GET.
    let g = gets(&v);
    read_sequentially(&v, 3 * req, 4 * req, req).await;
    assert_eq!(gets(&v), g, "the read after the window's fetch is a hit");
    // Read half the volume, then stop.
    read_sequentially(&v, 4 * req, size / 2, req).await;
    wait_read_ahead_landed(&v, "read-ahead to drain").await;
    let s = v.status();
    assert!(s.read_prefetch_hit_bytes > 0);
    // Never more than the read-ahead past where the reader stopped (plus a chunk at
    // each end of a window for alignment).
    assert!(
        s.read_ahead_bytes <= size / 2 + ahead + 2 * 64 * KIB,
        "{} bytes fetched ahead",
        s.read_ahead_bytes
    );
    let g = gets(&v);
    poll_until(std::time::Duration::from_millis(50), async || gets(&v) != g).await;
    assert_eq!(gets(&v), g, "nothing fetched once the reader stopped");
    // Random reads after that: data still right, nothing fetched ahead.
    let before = v.status().read_ahead_bytes;
    for i in 0..64u64 {
        // Scattered over the first half, away from where the stream stopped.
        let at = (i * 2_654_435_761 % 4000) * 4 * KIB;
        let got = v.read(at, 4 * KIB).await.expect("read");
        assert!(got == pattern(at, 4 * KIB, 1), "data at {at}");
    }
    assert_eq!(v.status().read_ahead_bytes, before);
    v.shutdown().await.expect("shutdown");
}

/// A read whose first chunks are cached and the rest not: the cached prefix is taken
/// once (counted as hits), only the rest is fetched (one GET, counted as misses), and
/// the data is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_with_a_cached_prefix_fetches_only_the_rest() {
    let dir = TempDir::new("read-partial");
    let store: DynStore = Arc::new(MemStore::new());
    let v = volume_in_store(&dir, &store, 4 * MIB, MIB, config(64 * KIB, 0)).await;
    // Cache the first two 64 KiB chunks of the first object.
    read_sequentially(&v, 0, 128 * KIB, 128 * KIB).await;
    let (hits, misses) = (v.status().read_cache_hits, v.status().read_cache_misses);
    let before = gets(&v);
    let got = v.read(0, 256 * KIB).await.expect("read");
    assert!(got == pattern(0, 256 * KIB, 1), "data");
    let s = v.status();
    assert_eq!(s.read_cache_hits - hits, 2, "the cached prefix");
    assert_eq!(s.read_cache_misses - misses, 2, "the rest");
    assert_eq!(gets(&v) - before, 1, "one GET for the two missing chunks");
    v.shutdown().await.expect("shutdown");
}

/// `Volume::read_local` answers from the write log and the read cache, never from the
/// store: an object chunk not cached yet is `None` (and costs no GET), the same chunk
/// once a read has cached it is the data; zeros and a range past the end come back at
/// once too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_read_takes_the_log_and_the_read_cache_and_leaves_the_rest() {
    let size = 4 * MIB;
    let dir = TempDir::new("read-local");
    let store: DynStore = Arc::new(MemStore::new());
    let v = volume_in_store(&dir, &store, size, MIB, config(64 * KIB, 0)).await;
    let g0 = gets(&v);
    let hits0 = v.status().read_cache_hits;
    assert!(v.read_local(MIB, 4 * KIB).is_none(), "in the store only");
    assert_eq!(gets(&v), g0, "no GET for a local read");
    read_sequentially(&v, MIB, MIB + 64 * KIB, 4 * KIB).await;
    let got = v
        .read_local(MIB + 8 * KIB, 16 * KIB)
        .expect("cached now")
        .expect("read");
    assert!(got == pattern(MIB + 8 * KIB, 16 * KIB, 1), "cached data");
    assert!(v.status().read_cache_hits > hits0, "counted as hits");
    // Half cached, half not: the whole read goes the long way.
    assert!(v.read_local(MIB + 32 * KIB, 64 * KIB).is_none());
    // Written now: in the log.
    v.write(3 * MIB, pattern(3 * MIB, 8 * KIB, 2), false)
        .await
        .expect("write");
    let got = v
        .read_local(3 * MIB, 8 * KIB)
        .expect("in the log")
        .expect("read");
    assert!(got == pattern(3 * MIB, 8 * KIB, 2), "logged data");
    v.write_zeroes(2 * MIB, 4 * KIB, false).await.expect("zero");
    let got = v
        .read_local(2 * MIB, 4 * KIB)
        .expect("zeros")
        .expect("read");
    assert_eq!(got, vec![0; 4 * KIB as usize]);
    assert!(
        v.read_local(size, 4 * KIB).expect("checked").is_err(),
        "past the end"
    );
    v.shutdown().await.expect("shutdown");
}

/// The chunk arithmetic every cached read shares: a range's first and last chunks,
/// how many it touches, and where an offset lies in the data section.
#[test]
fn chunk_spans_cover_exactly_the_chunks_a_range_touches() {
    use super::object::{chunk_span, chunks_spanned, data_rel};
    use crate::read::cache::READ_CACHE_CHUNK_BYTES as C;
    assert_eq!(chunk_span(0, 0), None);
    assert_eq!(chunks_spanned(5, 0), 0);
    assert_eq!(chunk_span(0, C), Some((0, 0)), "one whole chunk");
    assert_eq!(
        chunk_span(C - 1, 2),
        Some((0, 1)),
        "two bytes across a boundary"
    );
    assert_eq!(chunk_span(C, 3 * C), Some((1, 3)));
    assert_eq!(chunks_spanned(C - 1, C + 2), 3);
    assert_eq!(data_rel(4096, 4096), Some(0));
    assert_eq!(data_rel(4095, 4096), None, "in the header");
    assert_eq!(data_rel(100, 0), None, "data start not known");
}

/// Temporal read-ahead: 4 KiB blocks written to scattered LBAs and read back in the
/// order they were written (no LBA stream at all; an object lays its batch out by LBA,
/// so the reads jump around in it) have the rest of their object fetched ahead of the
/// reader once a run of reads lands in it. Without read-ahead every 64 KiB chunk costs
/// the reader a miss; with it, only the first reads in each object do. Data compared
/// on every read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temporal_read_ahead_follows_a_reader_in_write_order_across_scattered_lbas() {
    const BLOCK: u64 = 4 * KIB;
    let size = 64 * MIB;
    let blocks = 1024u64;
    // Block i of the write order goes to a scattered LBA: multiplying by an odd
    // number permutes the volume's blocks.
    let lba_of = |i: u64| (i * 2_654_435_761) % (size / BLOCK) * BLOCK;
    let mut misses_by_ahead = Vec::new();
    for ahead in [0, 4 * MIB] {
        let dir = TempDir::new("read-temporal");
        let mem: DynStore = Arc::new(MemStore::new());
        let faulty = Arc::new(FaultyStore::new(mem, FaultPlan::default(), 1));
        let store: DynStore = faulty.clone();
        let (v, _) = create_and_open(&store, "v", size, dir.path(), config(64 * KIB, 0)).await;
        for i in 0..blocks {
            let at = lba_of(i);
            v.write(at, pattern(at, BLOCK, 1), false)
                .await
                .expect("write");
        }
        v.shutdown().await.expect("shutdown");
        let cold = dir.path().join("cold");
        std::fs::create_dir_all(&cold).expect("mkdir");
        let (v, _) = open_v(&store, &cold, config(64 * KIB, ahead), "reopen").await;
        // GETs that take as long as a remote store's, so that a reader waits for its
        // misses (and a fetch ahead of it is under way before it gets there).
        faulty.set_get_delay_ms(5);
        let misses0 = v.status().read_cache_misses;
        for i in 0..blocks {
            let at = lba_of(i);
            let got = v.read(at, BLOCK).await.expect("read");
            assert!(got == pattern(at, BLOCK, 1), "data at {at}");
        }
        wait_read_ahead_landed(&v, "temporal read-ahead").await;
        let s = v.status();
        if ahead == 0 {
            assert_eq!(s.read_ahead_temporal_bytes, 0);
        } else {
            assert!(s.read_ahead_temporal_bytes > 0, "{s:?}");
            assert_eq!(
                s.read_ahead_bytes, s.read_ahead_temporal_bytes,
                "no LBA stream"
            );
        }
        misses_by_ahead.push(s.read_cache_misses - misses0);
        v.shutdown().await.expect("shutdown");
    }
    let (without, with) = (misses_by_ahead[0], misses_by_ahead[1]);
    println!("chunk misses in write order: {without} without read-ahead, {with} with");
    assert!(
        without >= blocks * BLOCK / (64 * KIB),
        "a miss per chunk: {without}"
    );
    assert!(with * 4 <= without, "{with} misses with read-ahead");
}
