//! `lsvd probe --store URL`: measure the object store and decide the engine's store
//! settings.
//!
//! Why: stores differ by orders of magnitude (a local directory answers a GET in
//! microseconds, S3 in tens of milliseconds whatever the size up to a few hundred KiB;
//! one PUT stream may or may not fill the link). Three engine settings depend on that:
//! how much a read miss fetches (`read_fetch_bytes`), how large an object is
//! (`batch_size_bytes`) and how many uploads run at once (`uploads_in_flight`). This
//! module measures and decides; `serve` reads the saved profile (see
//! [`super::settings`]).
//!
//! Everything is written under a scratch prefix (`.lsvd-probe-<time>-<pid>-`; flat
//! keys, so a directory store is left with no empty directory) and
//! deleted afterwards, also when a measurement fails; a killed probe leaves it behind
//! (the report of a later run does not see it: delete it with the store's tools).
//!
//! # What is measured
//!
//! 1. **GET latency against range size**: one source object is written, then ranged
//!    GETs of 4 KiB, 16 KiB, 64 KiB, 256 KiB, 1 MiB and 4 MiB at random aligned
//!    offsets, one at a time, for `seconds_per_test` each (at least 5): median, p99.
//! 2. **PUT bandwidth against object size**: PUTs of 1, 2, 4, 8, 16 and 32 MiB, one at
//!    a time, for `seconds_per_test` each (at least 2).
//! 3. **PUT bandwidth against concurrency**: 1, 2, 4, 8 and 16 PUT streams of the
//!    decided batch size, for `seconds_per_test` each (every stream at least one PUT).
//!
//! PUT bodies are pseudo-random (a compressing store does not flatter itself); each
//! stream overwrites its own key, so the store never holds more than
//! `streams x object size` of probe data.
//!
//! # Decision rules
//!
//! * **Read fetch size**: the largest GET range whose median latency is at most 1.5x
//!   that of a small GET (up to there, neighbours come almost free with a miss). The
//!   small GET's latency is the fastest median of the ranges up to 64 KiB, not the
//!   4 KiB one alone: on a busy machine one noisy size would otherwise move every
//!   ratio,
//!   rounded down to whole 64 KiB read-cache chunks and clamped to 64 KiB..1 MiB
//!   (larger fetches fill the read cache with data random reads never ask for).
//! * **Batch size**: the smallest object size whose one-stream PUT bandwidth is at
//!   least 90% of the best one-stream bandwidth, clamped to 4..32 MiB (smaller
//!   objects only add objects, checkpoint entries and requests).
//! * **Uploads in flight**: the smallest number of PUT streams that no larger number
//!   beats by more than 10% in bandwidth, clamped to 1..16.

#![expect(
    clippy::disallowed_methods,
    reason = "the probe measures a real store in real time"
)]

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use lsvd_trace::synthetic::prng::Rng;
use serde::{Deserialize, Serialize};

use super::measure::Latency;
use lsvd_core::error::{Error, Result};
use lsvd_store::{DynStore, PutMode};

/// Range sizes of the GET test.
pub const GET_SIZES_BYTES: [u64; 6] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
/// Object sizes of the PUT test.
pub const PUT_SIZES_BYTES: [u64; 6] = [1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20];
/// Stream counts of the concurrency test.
pub const PUT_STREAMS: [u32; 5] = [1, 2, 4, 8, 16];
/// A fetch may cost this much more than a small GET.
pub const FETCH_LATENCY_RATIO: f64 = 1.5;
pub const MIN_FETCH_BYTES: u64 = 64 << 10;
/// GETs up to this size are "small": their fastest median is the baseline.
pub const SMALL_GET_BYTES: u64 = 64 << 10;
pub const MAX_FETCH_BYTES: u64 = 1 << 20;
pub const FETCH_UNIT_BYTES: u64 = 64 << 10;
/// One-stream PUT bandwidth counted as saturated.
pub const PUT_SATURATION: f64 = 0.90;
pub const MIN_BATCH_BYTES: u64 = 4 << 20;
pub const MAX_BATCH_BYTES: u64 = 32 << 20;
/// More streams count if they beat fewer by more than this.
pub const STREAM_GAIN: f64 = 0.10;
pub const MAX_UPLOADS: u32 = 16;
/// Latency tests take at least this many samples; rate tests this many PUTs.
pub const MIN_GET_SAMPLES: usize = 5;
pub const MIN_PUTS: usize = 2;
/// Upper bound on operations (and samples kept) in one test.
pub const MAX_OPS_PER_TEST: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GetPoint {
    pub range_bytes: u64,
    pub latency: Latency,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PutPoint {
    pub object_bytes: u64,
    pub streams: u32,
    pub puts: u64,
    pub bytes_per_sec: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreMeasurements {
    pub gets: Vec<GetPoint>,
    /// One stream, each object size.
    pub put_sizes: Vec<PutPoint>,
    /// The decided batch size, each stream count.
    pub put_streams: Vec<PutPoint>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreDecisions {
    pub read_fetch_bytes: u64,
    pub batch_size_bytes: u64,
    pub uploads_in_flight: u32,
    pub notes: Vec<String>,
}

/// Read fetch size from the GET test (see the module documentation).
pub fn read_fetch_size(gets: &[GetPoint]) -> u64 {
    let mut sorted = gets.to_vec();
    sorted.sort_by_key(|g| g.range_bytes);
    let Some(smallest) = sorted.first().map(|g| g.range_bytes) else {
        return MIN_FETCH_BYTES;
    };
    let base = sorted
        .iter()
        .filter(|g| g.range_bytes <= SMALL_GET_BYTES.max(smallest))
        .map(|g| g.latency.median_us)
        .fold(f64::INFINITY, f64::min);
    let best = sorted
        .iter()
        .filter(|g| g.latency.median_us <= base * FETCH_LATENCY_RATIO)
        .map(|g| g.range_bytes)
        .max()
        .unwrap_or(MIN_FETCH_BYTES);
    let whole = best / FETCH_UNIT_BYTES * FETCH_UNIT_BYTES;
    whole.clamp(MIN_FETCH_BYTES, MAX_FETCH_BYTES)
}

/// Batch size from the one-stream PUT test (see the module documentation).
pub fn batch_size(put_sizes: &[PutPoint]) -> u64 {
    let peak = put_sizes
        .iter()
        .map(|p| p.bytes_per_sec)
        .fold(0.0f64, f64::max);
    let mut sorted = put_sizes.to_vec();
    sorted.sort_by_key(|p| p.object_bytes);
    sorted
        .iter()
        .find(|p| peak > 0.0 && p.bytes_per_sec >= peak * PUT_SATURATION)
        .map_or(lsvd_engine::EngineConfig::default().batch_size_bytes, |p| {
            p.object_bytes
        })
        .clamp(MIN_BATCH_BYTES, MAX_BATCH_BYTES)
}

/// Uploads in flight from the concurrency test (see the module documentation).
pub fn uploads_in_flight(put_streams: &[PutPoint]) -> u32 {
    let mut sorted = put_streams.to_vec();
    sorted.sort_by_key(|p| p.streams);
    for (i, p) in sorted.iter().enumerate() {
        let best_more = sorted[i + 1..]
            .iter()
            .map(|q| q.bytes_per_sec)
            .fold(0.0f64, f64::max);
        if best_more <= p.bytes_per_sec * (1.0 + STREAM_GAIN) {
            return p.streams.clamp(1, MAX_UPLOADS);
        }
    }
    1
}

pub fn decide(m: &StoreMeasurements, quick: bool) -> StoreDecisions {
    let mut notes = Vec::new();
    if quick {
        notes.push("--quick: few samples; run without it before relying on the numbers".into());
    }
    let largest_put = m
        .put_sizes
        .iter()
        .map(|p| p.object_bytes)
        .max()
        .unwrap_or(0);
    if largest_put < MAX_BATCH_BYTES {
        notes.push(format!(
            "objects measured only up to {}",
            lsvd_core::size::format_size(largest_put)
        ));
    }
    StoreDecisions {
        read_fetch_bytes: read_fetch_size(&m.gets),
        batch_size_bytes: batch_size(&m.put_sizes),
        uploads_in_flight: uploads_in_flight(&m.put_streams),
        notes,
    }
}

/// How long and how large the store probe is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoreBudget {
    pub seconds_per_test: f64,
    /// Largest object (and GET range) used.
    pub max_object_bytes: u64,
    /// Most PUT streams.
    pub max_streams: u32,
}

/// The scratch prefix: everything the probe writes is under it.
pub fn scratch_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(".lsvd-probe-{nanos:x}-{}-", std::process::id())
}

/// Run every measurement under `prefix`, then delete everything under it (also when a
/// measurement failed; a failed delete is reported after a failed measurement).
pub async fn measure_store(
    store: &DynStore,
    prefix: &str,
    budget: StoreBudget,
) -> Result<StoreMeasurements> {
    let measured = measure_inner(store, prefix, budget).await;
    let cleaned = cleanup(store, prefix).await;
    let m = measured?;
    cleaned?;
    Ok(m)
}

async fn cleanup(store: &DynStore, prefix: &str) -> Result<()> {
    let keys = store
        .list(prefix)
        .await
        .map_err(|e| e.context(format!("probe: cannot list the scratch prefix {prefix}")))?;
    for k in keys {
        store
            .delete(&k.key)
            .await
            .map_err(|e| e.context(format!("probe: cannot delete {}", k.key)))?;
    }
    Ok(())
}

fn time_budget(budget: &StoreBudget) -> Duration {
    Duration::from_secs_f64(budget.seconds_per_test)
}

async fn measure_inner(
    store: &DynStore,
    prefix: &str,
    budget: StoreBudget,
) -> Result<StoreMeasurements> {
    let max = budget.max_object_bytes.max(GET_SIZES_BYTES[0]);
    let largest_put = PUT_SIZES_BYTES
        .iter()
        .copied()
        .filter(|&s| s <= max)
        .max()
        .unwrap_or(max);
    let body_len = largest_put.max(GET_SIZES_BYTES[GET_SIZES_BYTES.len() - 1].min(max));
    let body = random_body(usize::try_from(body_len).unwrap_or(usize::MAX));

    // 1. GETs from one source object of the largest range size (times 4, so offsets vary).
    let get_sizes: Vec<u64> = GET_SIZES_BYTES
        .iter()
        .copied()
        .filter(|&s| s <= max)
        .collect();
    let source_len = get_sizes.last().copied().unwrap_or(max) * 4;
    let source_key = format!("{prefix}get-source");
    let source = random_body(usize::try_from(source_len).unwrap_or(usize::MAX));
    store
        .put(&source_key, source, PutMode::Overwrite)
        .await
        .map_err(|e| e.context("probe: cannot write the GET source object"))?;
    let mut gets = Vec::new();
    let mut rng = Rng::new(0x5701e);
    // Untimed: the first GETs open connections and warm caches, which would make the
    // 4 KiB baseline (and so every ratio to it) look worse than it is.
    for _ in 0..MIN_GET_SAMPLES {
        store
            .get_range(&source_key, 0..GET_SIZES_BYTES[0])
            .await
            .map_err(|e| e.context("probe: warm-up GET failed"))?;
    }
    for &size in &get_sizes {
        let slots = (source_len / size).max(1);
        let mut samples = Vec::new();
        let start = Instant::now();
        while (start.elapsed() < time_budget(&budget) || samples.len() < MIN_GET_SAMPLES)
            && samples.len() < MAX_OPS_PER_TEST
        {
            let off = rng.below(slots) * size;
            let range: Range<u64> = off..off + size;
            let t = Instant::now();
            let got = store
                .get_range(&source_key, range)
                .await
                .map_err(|e| e.context(format!("probe: GET of {size} bytes failed")))?;
            samples.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
            if got.len() as u64 != size {
                return Err(Error::new(
                    lsvd_core::error::ErrorKind::Permanent,
                    format!("probe: a GET of {size} bytes returned {}", got.len()),
                ));
            }
        }
        if let Some(latency) = Latency::of(&mut samples) {
            gets.push(GetPoint {
                range_bytes: size,
                latency,
            });
        }
    }
    store.delete(&source_key).await?;

    // 2. One stream, each object size.
    let mut put_sizes = Vec::new();
    for &size in PUT_SIZES_BYTES.iter().filter(|&&s| s <= max) {
        put_sizes.push(put_streams(store, prefix, &body, size, 1, &budget).await?);
    }
    if put_sizes.is_empty() {
        put_sizes.push(put_streams(store, prefix, &body, max, 1, &budget).await?);
    }
    // 3. The decided batch size (or the largest measured below it), each stream count.
    let batch = batch_size(&put_sizes);
    let size = put_sizes
        .iter()
        .map(|p| p.object_bytes)
        .filter(|&s| s <= batch)
        .max()
        .unwrap_or(largest_put.min(max));
    let mut streams = Vec::new();
    for &n in PUT_STREAMS
        .iter()
        .filter(|&&n| n <= budget.max_streams.max(1))
    {
        streams.push(put_streams(store, prefix, &body, size, n, &budget).await?);
    }
    Ok(StoreMeasurements {
        gets,
        put_sizes,
        put_streams: streams,
    })
}

fn random_body(len: usize) -> Bytes {
    let mut rng = Rng::new(0xb0d1);
    let mut v = vec![0u8; len];
    for chunk in v.chunks_mut(8) {
        let x = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&x[..chunk.len()]);
    }
    Bytes::from(v)
}

/// `streams` tasks each PUT `size`-byte objects to their own key until the time is up
/// (each at least one PUT, one stream at least [`MIN_PUTS`]).
async fn put_streams(
    store: &DynStore,
    prefix: &str,
    body: &Bytes,
    size: u64,
    streams: u32,
    budget: &StoreBudget,
) -> Result<PutPoint> {
    let len = usize::try_from(size).unwrap_or(usize::MAX).min(body.len());
    let data = body.slice(..len);
    let min_puts = if streams == 1 { MIN_PUTS } else { 1 };
    let per_stream = MAX_OPS_PER_TEST / streams.max(1) as usize;
    let limit = time_budget(budget);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..streams {
        let store = Arc::clone(store);
        let key = format!("{prefix}put-{i}");
        let data = data.clone();
        tasks.spawn(async move {
            let mut done = 0usize;
            while (start.elapsed() < limit || done < min_puts) && done < per_stream {
                store.put(&key, data.clone(), PutMode::Overwrite).await?;
                done += 1;
            }
            Ok::<usize, Error>(done)
        });
    }
    let mut puts = 0u64;
    let mut first_error = None;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(n)) => puts += n as u64,
            Ok(Err(e)) => {
                first_error.get_or_insert(e.context(format!("probe: PUT of {size} bytes failed")));
            }
            Err(e) => {
                first_error.get_or_insert(Error::new(
                    lsvd_core::error::ErrorKind::Permanent,
                    format!("probe: PUT task failed: {e}"),
                ));
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64().max(1e-9);
    if let Some(e) = first_error {
        return Err(e);
    }
    Ok(PutPoint {
        object_bytes: len as u64,
        streams,
        puts,
        bytes_per_sec: (puts * len as u64) as f64 / elapsed,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn get(size_kib: u64, median_us: f64) -> GetPoint {
        GetPoint {
            range_bytes: size_kib << 10,
            latency: Latency {
                samples: 10,
                median_us,
                p99_us: median_us * 2.0,
            },
        }
    }

    fn put(size_mib: u64, streams: u32, mb_per_sec: f64) -> PutPoint {
        PutPoint {
            object_bytes: size_mib << 20,
            streams,
            puts: 10,
            bytes_per_sec: mb_per_sec * 1e6,
        }
    }

    /// An S3-like store: 20 ms per request plus 100 MB/s per stream, up to 8 streams.
    pub(crate) fn s3_like() -> StoreMeasurements {
        // Whole numbers: they survive the JSON round trip of the profile tests exactly.
        let lat = |kib: f64| (20_000.0 + kib * 1024.0 / 100.0).round();
        StoreMeasurements {
            gets: [4u64, 16, 64, 256, 1024, 4096]
                .iter()
                .map(|&k| get(k, lat(k as f64)))
                .collect(),
            put_sizes: [1u64, 2, 4, 8, 16, 32]
                .iter()
                .map(|&m| {
                    let secs = 0.02 + (m as f64) * 1.048_576 / 100.0;
                    put(m, 1, ((m as f64) * 1.048_576 / secs).round())
                })
                .collect(),
            put_streams: [1u32, 2, 4, 8, 16]
                .iter()
                .map(|&n| put(16, n, 90.0 * f64::from(n.min(8))))
                .collect(),
        }
    }

    pub(crate) fn sample_store_profile(url: &str) -> super::super::store_profile::StoreProfile {
        let m = s3_like();
        super::super::store_profile::StoreProfile {
            lsvd_version: "0.1.0".into(),
            created_unix_secs: 1_700_000_000,
            store_url: url.into(),
            quick: false,
            decisions: decide(&m, false),
            measurements: m,
        }
    }

    #[test]
    fn s3_like_store() {
        let d = decide(&s3_like(), false);
        // 20 ms + size/100 MB/s: 256 KiB costs 22.6 ms (1.13x), 1 MiB 30.5 ms (1.52x).
        assert_eq!(d.read_fetch_bytes, 256 << 10);
        // One stream reaches 90% of its best (32 MiB: 94 MB/s) at 16 MiB (88.9 MB/s).
        assert_eq!(d.batch_size_bytes, 16 << 20);
        assert_eq!(d.uploads_in_flight, 8);
        assert!(d.notes.is_empty(), "{:?}", d.notes);
    }

    #[test]
    fn local_store_and_clamps() {
        // Flat latency (a local directory): fetch as much as allowed, 1 MiB.
        let gets: Vec<GetPoint> = [4u64, 16, 64, 256, 1024, 4096]
            .iter()
            .map(|&k| get(k, 50.0))
            .collect();
        assert_eq!(read_fetch_size(&gets), 1 << 20);
        // Steep latency: even 16 KiB costs 2x: the floor, one chunk.
        let steep: Vec<GetPoint> = [4u64, 16, 64].iter().map(|&k| get(k, k as f64)).collect();
        assert_eq!(read_fetch_size(&steep), 64 << 10);
        assert_eq!(read_fetch_size(&[]), 64 << 10);
        // A noisy 4 KiB GET (3x its neighbours) does not make 4 MiB look cheap: the
        // baseline is the fastest small GET.
        let noisy: Vec<GetPoint> = [(4u64, 3000.0), (16, 1000.0), (64, 1100.0), (256, 1400.0)]
            .iter()
            .chain(&[(1024, 2000.0), (4096, 4000.0)])
            .map(|&(k, us)| get(k, us))
            .collect();
        assert_eq!(read_fetch_size(&noisy), 256 << 10);
        // Flat PUT bandwidth: the smallest size, clamped up to 4 MiB.
        let flat: Vec<PutPoint> = [1u64, 2, 4].iter().map(|&m| put(m, 1, 500.0)).collect();
        assert_eq!(batch_size(&flat), 4 << 20);
        assert_eq!(batch_size(&[]), 8 << 20);
        // No gain from streams: one upload; a noisy dip does not end the search.
        let one: Vec<PutPoint> = [1u32, 2, 4].iter().map(|&n| put(8, n, 500.0)).collect();
        assert_eq!(uploads_in_flight(&one), 1);
        let noisy = vec![put(8, 1, 100.0), put(8, 2, 105.0), put(8, 4, 300.0)];
        assert_eq!(uploads_in_flight(&noisy), 4);
        assert_eq!(uploads_in_flight(&[]), 1);
    }

    #[tokio::test]
    async fn measures_a_store_and_leaves_nothing_behind() {
        let store: DynStore = Arc::new(lsvd_store::mem::MemStore::new());
        store
            .put("vol/meta", Bytes::from_static(b"x"), PutMode::Overwrite)
            .await
            .expect("put");
        let budget = StoreBudget {
            seconds_per_test: 0.001,
            max_object_bytes: 1 << 20,
            max_streams: 2,
        };
        let prefix = scratch_prefix();
        let m = measure_store(&store, &prefix, budget)
            .await
            .expect("measure");
        assert_eq!(m.gets.len(), 5, "4 KiB..1 MiB");
        assert!(
            m.gets
                .iter()
                .all(|g| g.latency.samples >= MIN_GET_SAMPLES as u64)
        );
        assert_eq!(m.put_sizes.len(), 1);
        assert!(m.put_sizes[0].puts >= MIN_PUTS as u64);
        assert_eq!(m.put_streams.len(), 2);
        let left = lsvd_store::testutil::list_keys(&*store, "").await;
        assert_eq!(left, vec!["vol/meta".to_string()]);
    }
}
