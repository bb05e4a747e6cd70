//! A bad copy on a mirrored chain (`chain:A+A2,B+B2`): a byte flipped in one copy of
//! an object's data or header is read past (the engine verifies the other copy and
//! answers from it), counted, and repaired; both copies bad still fail `Corrupt`, as a
//! flipped byte does on the stores with one copy (local directory, memory); GC over a
//! volume whose first copies are all bad completes. Also the two store operations
//! behind it, on their own.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use lsvd_core::format::object::{CHUNK_BYTES, decode_object_header};

use crate::test_support::{
    create_and_open, gc_config, no_gc, open_v, settle, verify, wait_until, write_run,
};
use crate::{EngineConfig, Volume};
use lsvd_core::error::ErrorKind;
use lsvd_store::chain::copy_check::copy_problems;
use lsvd_store::testutil::{TempDir, mirrored_positions};
use lsvd_store::{DynStore, PutMode, open_store};

pub(super) const BLOCK: u64 = 4096;
/// 2 MiB volume.
const BLOCKS: u64 = 512;
/// Writes of 64 KiB.
const WRITE_BLOCKS: u64 = 16;

pub(super) fn config(gc: lsvd_core::gc::GcConfig) -> EngineConfig {
    EngineConfig {
        // Every read goes to the store.
        read_cache_bytes: 0,
        gc,
        gc_min_rate_bytes: 0,
        ..gc_config()
    }
}

/// A mirrored chain of two positions: `(store URL, [[first copy, mirror]; 2])`.
pub(super) fn mirrored(root: &TempDir) -> (String, Vec<[PathBuf; 2]>) {
    let (pos, drives) = mirrored_positions(root);
    (format!("chain:{drives}"), pos)
}

/// Write `writes` (first block, blocks, version) to a new volume "v", shut it down
/// (all in the store), and open it again from a fresh data directory, so every read
/// goes to the store. Returns the volume, its data directory and the model.
async fn write_then_reopen(
    store: &DynStore,
    writes: &[(u64, u64, u64)],
    reopen: EngineConfig,
) -> (Arc<Volume>, TempDir, Vec<u64>) {
    let data_dir = TempDir::new("copy-fallback-data");
    let (volume, _) =
        create_and_open(store, "v", BLOCKS * BLOCK, data_dir.path(), config(no_gc())).await;
    let mut model = vec![0u64; BLOCKS as usize];
    for &(first, blocks, version) in writes {
        write_run(&volume, &mut model, first..first + blocks, |_| version).await;
    }
    volume.flush().await.expect("flush");
    settle(&volume).await;
    volume.shutdown().await.expect("shutdown");
    drop(volume);
    let data_dir = TempDir::new("copy-fallback-data2");
    let (volume, _) = open_v(store, data_dir.path(), reopen, "reopen volume").await;
    (volume, data_dir, model)
}

/// Four 64 KiB writes: one data object.
fn small_writes() -> Vec<(u64, u64, u64)> {
    (0..4)
        .map(|i| (i * WRITE_BLOCKS, WRITE_BLOCKS, i + 1))
        .collect()
}

/// The data objects (`.d`) in a copy's directory.
fn data_objects(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("v/obj"))
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "d"));
    v.sort();
    v
}

/// The first data object, as (path in the first copy, path in the mirror).
pub(super) fn first_data_object(pos: &[[PathBuf; 2]]) -> (PathBuf, PathBuf) {
    for [first, mirror] in pos {
        if let Some(p) = data_objects(first).into_iter().next() {
            let rel = p.strip_prefix(first).expect("under the copy");
            return (p.clone(), mirror.join(rel));
        }
    }
    panic!("no data object on any drive");
}

fn header_bytes(path: &Path) -> u64 {
    let bytes = std::fs::read(path).expect("read object");
    u64::from(decode_object_header(&bytes).expect("header").header_bytes)
}

pub(super) fn flip_byte(path: &Path, offset: u64) {
    let mut bytes = std::fs::read(path).expect("read object");
    bytes[offset as usize] ^= 0x40;
    std::fs::write(path, bytes).expect("write object");
}

/// Wait until no repair is running and at least `rewritten` copies were rewritten.
async fn repairs_done(volume: &Volume, rewritten: u64) {
    let repairs = &volume.stats().copy_repairs;
    wait_until("the repair to finish", async || {
        let idle = repairs
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        idle && repairs.copies_rewritten.load(Ordering::Relaxed) >= rewritten
    })
    .await;
}

/// Flip a byte of the first data object's first copy at `offset(header_bytes)`, read
/// everything back, and check the fallback and the repair.
async fn one_bad_copy(offset: impl Fn(u64) -> u64) {
    let root = TempDir::new("copy-fallback");
    let (url, pos) = mirrored(&root);
    let store = open_store(&url).expect("open store");
    let (volume, _data, model) = write_then_reopen(&store, &small_writes(), config(no_gc())).await;
    let (bad, mirror) = first_data_object(&pos);
    flip_byte(&bad, offset(header_bytes(&mirror)));
    assert!(!copy_problems(&*store, "v/").await.is_empty());
    verify(&volume, &model).await;
    assert!(volume.stats().copy_fallbacks.load(Ordering::Relaxed) >= 1);
    repairs_done(&volume, 1).await;
    let problems = copy_problems(&*store, "v/").await;
    assert!(problems.is_empty(), "{problems:?}");
    assert!(std::fs::read(&bad).expect("bad") == std::fs::read(&mirror).expect("mirror"));
    volume.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_data_byte_in_one_copy_is_read_from_the_other_and_repaired() {
    one_bad_copy(|header_bytes| header_bytes + 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_header_byte_in_one_copy_is_read_from_the_other_and_repaired() {
    one_bad_copy(|header_bytes| header_bytes / 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_copies_bad_fails_corrupt() {
    let root = TempDir::new("copy-fallback-both");
    let (url, pos) = mirrored(&root);
    let store = open_store(&url).expect("open store");
    let (volume, _data, _) = write_then_reopen(&store, &small_writes(), config(no_gc())).await;
    let (first, mirror) = first_data_object(&pos);
    let at = header_bytes(&first) + 10;
    flip_byte(&first, at);
    flip_byte(&mirror, at);
    assert_first_block_corrupt(&volume, "both copies are bad").await;
}

/// The first block of `volume` (whose copies `why` are bad) fails to read `Corrupt`,
/// with no fallback to another copy; then `volume` shuts down.
async fn assert_first_block_corrupt(volume: &Volume, why: &str) {
    let Err(e) = volume.read(0, BLOCK).await else {
        panic!("{why}: the read succeeded");
    };
    assert_eq!(e.kind, ErrorKind::Corrupt, "{why}: {e}");
    assert_eq!(volume.stats().copy_fallbacks.load(Ordering::Relaxed), 0);
    volume.shutdown().await.expect("shutdown");
}

/// A store with one copy: a flipped byte fails the read `Corrupt`, nothing to fall
/// back to.
async fn one_copy_fails_corrupt(store: DynStore) {
    let (volume, _data, _) = write_then_reopen(&store, &small_writes(), config(no_gc())).await;
    let listing = store.list("v/obj/").await.expect("list");
    let key = &listing
        .iter()
        .find(|e| e.key.ends_with(".d"))
        .expect("a data object")
        .key;
    let mut bytes = store.get(key).await.expect("get");
    let at = decode_object_header(&bytes).expect("header").header_bytes as usize + 10;
    bytes[at] ^= 0x40;
    store
        .put(key, Bytes::from(bytes), PutMode::Overwrite)
        .await
        .expect("put");
    assert_first_block_corrupt(&volume, "the only copy is bad").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_on_a_store_with_one_copy_fails_corrupt() {
    let root = TempDir::new("copy-fallback-fs");
    one_copy_fails_corrupt(open_store(&root.path().display().to_string()).expect("fs")).await;
    one_copy_fails_corrupt(Arc::new(lsvd_store::mem::MemStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_reads_past_bad_first_copies() {
    let root = TempDir::new("copy-fallback-gc");
    let (url, pos) = mirrored(&root);
    let store = open_store(&url).expect("open store");
    // 1 MiB written, then the first half of every 64 KiB overwritten: the first
    // objects are half dead, which GC collects by reading their live halves.
    let mut writes: Vec<(u64, u64, u64)> = (0..BLOCKS / 2 / WRITE_BLOCKS)
        .map(|i| (i * WRITE_BLOCKS, WRITE_BLOCKS, 1))
        .collect();
    writes.extend((0..BLOCKS / 2 / WRITE_BLOCKS).map(|i| (i * WRITE_BLOCKS, WRITE_BLOCKS / 2, 2)));
    let gc = lsvd_core::gc::GcConfig {
        start_utilization: 0.9,
        stop_utilization: 0.95,
        pass_bytes: 1 << 20,
        ..Default::default()
    };
    let before = {
        // Every chunk of every data object's first copy gets a flipped byte before the
        // volume (and its GC) opens again.
        let (volume, data, model) = write_then_reopen(&store, &writes, config(no_gc())).await;
        volume.shutdown().await.expect("shutdown");
        drop((volume, data));
        let mut flipped = 0;
        for [first, _] in &pos {
            for path in data_objects(first) {
                let len = std::fs::metadata(&path).expect("stat").len();
                let mut at = header_bytes(&path);
                while at < len {
                    flip_byte(&path, at);
                    at += CHUNK_BYTES;
                    flipped += 1;
                }
            }
        }
        assert!(flipped > 0);
        model
    };
    let data_dir = TempDir::new("copy-fallback-gc-data");
    let (volume, _) = open_v(&store, data_dir.path(), config(gc), "open volume").await;
    wait_until("a GC pass", async || volume.status().gc_passes > 0).await;
    settle(&volume).await;
    let stats = volume.stats();
    assert!(volume.status().gc_passes > 0, "GC completed a pass");
    assert_eq!(stats.gc_passes_failed.load(Ordering::Relaxed), 0);
    assert!(stats.gc_moved_bytes.load(Ordering::Relaxed) > 0);
    assert!(stats.copy_fallbacks.load(Ordering::Relaxed) > 0);
    verify(&volume, &before).await;
    eprintln!(
        "gc over bad first copies: {} passes, {} bytes moved, {} fallbacks, {} copies rewritten",
        volume.status().gc_passes,
        stats.gc_moved_bytes.load(Ordering::Relaxed),
        stats.copy_fallbacks.load(Ordering::Relaxed),
        stats.copy_repairs.copies_rewritten.load(Ordering::Relaxed)
    );
    volume.shutdown().await.expect("shutdown");
}

/// The store operations alone: every copy's bytes, and a repair that rewrites the
/// bad copy only and never brings back a deleted object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_offers_every_copy_and_rewrites_the_bad_one() {
    let root = TempDir::new("copy-fallback-store");
    let (url, pos) = mirrored(&root);
    let store = open_store(&url).expect("open store");
    let key = "v/obj/0000000000000001.d";
    let good: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    store
        .put(key, Bytes::from(good.clone()), PutMode::IfAbsent)
        .await
        .expect("put");
    let [first, mirror] = pos
        .iter()
        .find(|[f, _]| f.join(key).is_file())
        .expect("a position holds it")
        .clone();
    flip_byte(&first.join(key), 100);
    let copies = store.get_range_copies(key, 90..110).await.expect("copies");
    assert_eq!(copies.len(), 2);
    assert_eq!(copies[0].copy, first.display().to_string());
    assert!(copies[0].bytes != good[90..110]);
    assert!(copies[1].bytes == good[90..110]);
    let rewritten = store
        .repair_copies(key, Bytes::from(good.clone()))
        .await
        .expect("repair");
    assert_eq!(rewritten, vec![first.display().to_string()]);
    assert!(std::fs::read(first.join(key)).expect("first") == good);
    assert!(std::fs::read(mirror.join(key)).expect("mirror") == good);
    // Deleted: a repair leaves it deleted.
    store.delete(key).await.expect("delete");
    let rewritten = store
        .repair_copies(key, Bytes::from(good))
        .await
        .expect("repair");
    assert!(rewritten.is_empty());
    assert!(!first.join(key).exists() && !mirror.join(key).exists());
    // One copy: nothing to offer.
    let single = TempDir::new("copy-fallback-single");
    let store = open_store(&format!(
        "chain:{},{}",
        single.path().join("a").display(),
        single.path().join("b").display()
    ))
    .expect("open");
    store
        .put(key, Bytes::from_static(b"x"), PutMode::IfAbsent)
        .await
        .expect("put");
    assert!(
        store
            .get_range_copies(key, 0..1)
            .await
            .expect("copies")
            .is_empty()
    );
}
