//! Fixtures shared by the engine's tests, so that each test file does not carry its
//! own copy: a volume created and opened in one call, and the one polling wait the
//! tests use instead of sleeping for a fixed time (the only real sleep of the tests
//! that wait on the engine's background tasks).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::{EngineConfig, OpenReport, Volume, create_volume, open_volume};
use lsvd_store::DynStore;

/// How long [`wait_until`] polls before it fails: a bound for a hang, not a timing
/// assertion (5 s was too short on a loaded CI machine).
const WAIT_LIMIT: Duration = Duration::from_secs(120);

/// How often [`poll_until`] looks at its condition (what most of the loops it
/// replaced slept between looks: a shorter interval only loads the machine).
const POLL_EVERY: Duration = Duration::from_millis(10);

/// How long [`pause`] lets the background tasks act on a step of a manual clock.
const PAUSE: Duration = Duration::from_millis(2);

/// Sleeps `d` of real time: the one real sleep of the engine's tests, under the polls
/// and the tickers that move a manual clock.
async fn sleep_real(d: Duration) {
    tokio::time::sleep(d).await;
}

/// Lets the engine's background tasks run for a moment of real time, for a test
/// that moves a manual clock step by step.
pub(crate) async fn pause() {
    sleep_real(PAUSE).await;
}

/// Polls `done` until it holds or `limit` has passed; says whether it held. For a
/// check that "nothing happens", poll for the change and assert it did not come.
pub(crate) async fn poll_until(limit: Duration, mut done: impl AsyncFnMut() -> bool) -> bool {
    let polls = limit.as_millis().div_ceil(POLL_EVERY.as_millis()).max(1);
    for _ in 0..polls {
        if done().await {
            return true;
        }
        sleep_real(POLL_EVERY).await;
    }
    done().await
}

/// Polls `done` until it holds; panics naming `what` when it still does not after
/// [`WAIT_LIMIT`].
pub(crate) async fn wait_until(what: &str, done: impl AsyncFnMut() -> bool) {
    assert!(
        poll_until(WAIT_LIMIT, done).await,
        "timed out after {WAIT_LIMIT:?} waiting for {what}"
    );
}

/// Waits until `volume` has uploaded everything it was given.
pub(crate) async fn wait_for_uploads(volume: &Volume) {
    wait_until("uploads to finish", async || {
        volume.status().uploads_pending == 0
    })
    .await;
}

/// Waits until `volume` has uploaded everything and its write log is empty.
pub(crate) async fn wait_drained(volume: &Volume) {
    wait_until("uploads to finish and the log to empty", async || {
        let s = volume.status();
        s.uploads_pending == 0 && s.log_used_bytes == 0
    })
    .await;
}

/// Waits until `volume` has uploaded everything and no GC pass is in flight.
pub(crate) async fn settle(volume: &Volume) {
    wait_until("uploads and GC to settle", async || {
        let s = volume.status();
        s.uploads_pending == 0 && !s.gc_pass_in_flight
    })
    .await;
}

/// Creates volume `name` of `size_bytes` in `store` and opens it with its files in
/// `dir`.
pub(crate) async fn create_and_open(
    store: &DynStore,
    name: &str,
    size_bytes: u64,
    dir: &Path,
    config: EngineConfig,
) -> (Arc<Volume>, OpenReport) {
    create_volume(store, name, size_bytes)
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
    open_volume(store.clone(), name, dir, config)
        .await
        .unwrap_or_else(|e| panic!("open {name}: {e}"))
}

/// The block size the data-checking tests write in.
pub(crate) const BLOCK: u64 = 4096;

/// Block `block` at `version`: every 16 bytes name the block and the version, so a
/// block read from the wrong place or time is told apart.
pub(crate) fn block_data(block: u64, version: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK as usize];
    for (i, chunk) in v.chunks_mut(16).enumerate() {
        chunk[..8].copy_from_slice(&block.to_le_bytes());
        chunk[8..16].copy_from_slice(&(version ^ i as u64).to_le_bytes());
    }
    v
}

/// Reads every block of `volume` and checks it holds the version `model` says
/// ([`block_data`]; zeros for version 0).
pub(crate) async fn verify(volume: &Volume, model: &[u64]) {
    for (b, &version) in model.iter().enumerate() {
        let got = volume.read(b as u64 * BLOCK, BLOCK).await.expect("read");
        let want = if version == 0 {
            vec![0u8; BLOCK as usize]
        } else {
            block_data(b as u64, version)
        };
        assert!(got == want, "block {b}: expected version {version}");
    }
}

/// [`verify`] reading 256 blocks (1 MiB) at a time, for large volumes; `what` names
/// the check in a failure.
pub(crate) async fn verify_runs(volume: &Volume, model: &[u64], what: &str) {
    const RUN: usize = 256;
    for (i, versions) in model.chunks(RUN).enumerate() {
        let first = (i * RUN) as u64;
        let got = volume
            .read(first * BLOCK, versions.len() as u64 * BLOCK)
            .await
            .unwrap_or_else(|e| panic!("{what}: read at block {first}: {e}"));
        for (j, (&version, block)) in versions.iter().zip(got.chunks(BLOCK as usize)).enumerate() {
            let b = first + j as u64;
            let want = match version {
                0 => vec![0u8; BLOCK as usize],
                v => block_data(b, v),
            };
            assert!(block == want, "{what}: block {b} is not version {version}");
        }
    }
}

/// Writes blocks `blocks` of `volume` in one write, block `b` at `version_of(b)`
/// ([`block_data`]), and records the versions in `model`.
pub(crate) async fn write_run(
    volume: &Volume,
    model: &mut [u64],
    blocks: std::ops::Range<u64>,
    mut version_of: impl FnMut(u64) -> u64,
) {
    let first = blocks.start;
    let mut data = Vec::with_capacity(((blocks.end - first) * BLOCK) as usize);
    for b in blocks {
        let version = version_of(b);
        model[b as usize] = version;
        data.extend_from_slice(&block_data(b, version));
    }
    volume
        .write(first * BLOCK, data, false)
        .await
        .unwrap_or_else(|e| panic!("write at block {first}: {e}"));
}

/// Writes 4 KiB blocks of `byte` to `volume` (over its first 64 blocks, again and
/// again) until one is refused or `writes` were accepted, flushing every
/// `flush_every` writes and giving the volume a moment to fail after each flush. For
/// a volume that another writer or a delete has fenced off: says whether it refused.
pub(crate) async fn write_until_refused(
    volume: &Volume,
    writes: u64,
    flush_every: u64,
    byte: u8,
) -> bool {
    for b in 0..writes {
        if volume
            .write((b % 64) * 4096, vec![byte; 4096], false)
            .await
            .is_err()
        {
            return true;
        }
        if b % flush_every == flush_every - 1 {
            let _ = volume.flush().await;
            poll_until(Duration::from_millis(30), async || {
                volume.status().failure.is_some()
            })
            .await;
        }
    }
    false
}

/// A configuration for the write-log tests: batches of `batch_size_bytes` closed
/// after `batch_timeout_ms`, a log of `log_size_bytes`, and no read cache (a read the
/// log does not answer goes to the store).
pub(crate) fn log_config(
    batch_size_bytes: u64,
    batch_timeout_ms: u64,
    log_size_bytes: u64,
) -> EngineConfig {
    EngineConfig {
        batch_size_bytes,
        batch_timeout_ms,
        log_size_bytes,
        read_cache_bytes: 0,
        ..EngineConfig::default()
    }
}

/// The write-log tests' 4 KiB block `b` at version `v`: every 16 bytes name the block,
/// the version and where in the block they stand.
pub(crate) fn log_block(b: u64, v: u64) -> Vec<u8> {
    let mut d = vec![0u8; 4096];
    for (i, c) in d.chunks_mut(16).enumerate() {
        c[..8].copy_from_slice(&b.to_le_bytes());
        c[8..].copy_from_slice(&(v * 1000 + i as u64).to_le_bytes());
    }
    d
}

/// A configuration for the tests that fill a small volume and let GC work on it:
/// 256 KiB batches closed after 50 ms, a 16 MiB log, a checkpoint every 8 objects,
/// GC passes of 1 MiB.
pub(crate) fn gc_config() -> EngineConfig {
    EngineConfig {
        batch_size_bytes: 256 << 10,
        batch_timeout_ms: 50,
        log_size_bytes: 16 << 20,
        checkpoint_every_objects: 8,
        gc: lsvd_core::gc::GcConfig {
            pass_bytes: 1 << 20,
            ..Default::default()
        },
        ..EngineConfig::default()
    }
}

/// GC settings under which GC never starts (no object's live share is below 0), for
/// tests that need every object to stay where it was written.
pub(crate) fn no_gc() -> lsvd_core::gc::GcConfig {
    lsvd_core::gc::GcConfig {
        start_utilization: 0.0,
        ..Default::default()
    }
}

/// Opens volume "v" of `store` with its files in `dir`; panics naming `what` (and the
/// error) if it does not open.
pub(crate) async fn open_v(
    store: &DynStore,
    dir: &Path,
    config: EngineConfig,
    what: &str,
) -> (Arc<Volume>, OpenReport) {
    open_volume(store.clone(), "v", dir, config)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// The newest superblock of volume "v" in `store`.
pub(crate) async fn newest_super(store: &DynStore) -> lsvd_core::format::volume_super::VolumeSuper {
    let meta = crate::read_meta(store, "v").await.expect("meta");
    crate::fencing::volume_super::read_newest(store, &meta)
        .await
        .expect("read the superblock")
        .expect("a superblock")
}

/// [`write_run`] with each block at the next version after `version`, which ends at
/// the last one written.
pub(crate) async fn write_next_versions(
    volume: &Volume,
    model: &mut [u64],
    blocks: std::ops::Range<u64>,
    version: &mut u64,
) {
    write_run(volume, model, blocks, |_| {
        *version += 1;
        *version
    })
    .await;
}

/// Volume "v" of `size_bytes` created in `inner` and opened (files in `dir`) through
/// a store over it that fails on command.
pub(crate) async fn open_behind_faults(
    inner: DynStore,
    size_bytes: u64,
    dir: &lsvd_store::testutil::TempDir,
    config: EngineConfig,
) -> (Arc<Volume>, Arc<lsvd_store::faulty::FaultyStore>) {
    create_volume(&inner, "v", size_bytes)
        .await
        .expect("create");
    let faulty = Arc::new(lsvd_store::faulty::FaultyStore::new(
        inner,
        lsvd_store::faulty::FaultPlan::default(),
        1,
    ));
    let (vol, _) = open_volume(faulty.clone(), "v", dir.path(), config)
        .await
        .expect("open");
    (vol, faulty)
}

/// Opens volume "v" of `store` from the store alone (its files in a new directory
/// named by `tag`), checks every block against `model` ([`verify`]) and shuts it down.
pub(crate) async fn verify_from_store_alone(
    store: DynStore,
    tag: &str,
    config: EngineConfig,
    model: &[u64],
) {
    let dir = lsvd_store::testutil::TempDir::new(tag);
    let (volume, _) = open_volume(store, "v", dir.path(), config)
        .await
        .expect("reopen from the store alone");
    verify(&volume, model).await;
    volume.shutdown().await.expect("shutdown");
}
