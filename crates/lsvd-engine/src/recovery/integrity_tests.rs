//! End-to-end integrity: a write-log record whose bytes change on the cache device
//! after the write was acknowledged is never uploaded. The uploader verifies every
//! record it reads back (and so every record recovery took from the write-log index
//! without reading it); a mismatch fails the volume, naming the record's LBAs.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::EngineConfig;
use crate::test_support::{
    create_and_open, log_block as block, log_config, open_behind_faults, open_v, wait_until,
};
use lsvd_core::error::ErrorKind;
use lsvd_store::DynStore;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

const BLOCKS: u64 = 1024; // 4 MiB volume
/// The block the tests corrupt, and its first sector.
const ROT_BLOCK: u64 = 5;
const ROT_LBA: u64 = ROT_BLOCK * 8;

/// Uploads read every record back from the log (`upload_memory_bytes: 0`), which is
/// what these tests check; [`a_record_rotting_in_the_log_is_uploaded_from_memory_intact`]
/// checks the default.
fn config(batch_timeout_ms: u64) -> EngineConfig {
    EngineConfig {
        upload_memory_bytes: 0,
        ..log_config(8 << 20, batch_timeout_ms, 16 << 20)
    }
}

/// A block no other write produces, so it can be found in the cache file and in
/// objects.
fn marker() -> Vec<u8> {
    b"rot-candidate-block-".repeat(205)[..4096].to_vec()
}

/// The offset of `needle` in the file at `path` (the first one).
fn find_in_file(path: &Path, needle: &[u8]) -> u64 {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .expect("open cache file")
        .read_to_end(&mut bytes)
        .expect("read cache file");
    bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the marker block is in the write log") as u64
}

/// Flip one byte of the cache file at `offset`, behind the engine's back (as a
/// rotting sector would).
fn flip_byte(path: &Path, offset: u64) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open cache file");
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(offset)).expect("seek");
    f.read_exact(&mut b).expect("read byte");
    b[0] ^= 0x40;
    f.seek(SeekFrom::Start(offset)).expect("seek");
    f.write_all(&b).expect("write byte");
    f.sync_all().expect("sync");
}

/// Does any object of the store hold `needle`?
async fn store_holds(store: &DynStore, needle: &[u8]) -> bool {
    for entry in store.list("").await.expect("list") {
        let bytes = store.get(&entry.key).await.expect("get");
        if bytes.windows(needle.len()).any(|w| w == needle) {
            return true;
        }
    }
    false
}

/// Write a few blocks and the marker, flush, optionally flip a byte of the marker in
/// the cache file (the uploads are held back by a long batch timeout), then shut
/// down, which uploads what the log holds.
async fn rot_before_upload(corrupt: bool) {
    rot_before_upload_with(corrupt, config(3_600_000)).await;
}

/// [`rot_before_upload`] with `config`; when it keeps records in memory the flipped
/// byte must not matter.
async fn rot_before_upload_with(corrupt: bool, config: EngineConfig) {
    let from_memory = config.upload_memory_bytes > 0;
    let dir = TempDir::new("engine-integrity");
    let store: DynStore = Arc::new(MemStore::new());
    let (vol, _) = create_and_open(&store, "v", BLOCKS * 4096, dir.path(), config).await;
    for b in 0..4u64 {
        vol.write(b * 4096, block(b, 1), false)
            .await
            .expect("write");
    }
    vol.write(ROT_BLOCK * 4096, marker(), false)
        .await
        .expect("write marker");
    vol.flush().await.expect("flush");
    let wlog = dir.path().join("v.wlog");
    let at = find_in_file(&wlog, &marker());
    if corrupt {
        flip_byte(&wlog, at + 1000);
    }
    let mut rotten = marker();
    rotten[1000] ^= 0x40;
    let r = vol.shutdown().await;
    if !corrupt || from_memory {
        r.expect("clean shutdown");
        assert!(
            store_holds(&store, &marker()).await,
            "the marker was uploaded"
        );
        assert!(!store_holds(&store, &rotten[960..1040]).await);
        assert_eq!(vol.stats().log_records_corrupt.load(Ordering::Relaxed), 0);
        let read_back = vol.stats().log_records_read_back.load(Ordering::Relaxed);
        if from_memory {
            assert_eq!(read_back, 0, "every record came from memory");
        } else {
            assert!(read_back > 0, "records were read back from the log");
        }
        return;
    }
    let e = r.expect_err("shutdown must fail: the log holds a corrupt record");
    assert_eq!(e.kind, ErrorKind::VolumeFailed, "{e}");
    let why = vol.status().failure.expect("the volume failed");
    assert!(
        why.contains(&format!("LBAs {ROT_LBA}..{}", ROT_LBA + 8)),
        "the failure names the LBAs: {why}"
    );
    assert!(why.contains("write-log record"), "{why}");
    assert_eq!(vol.stats().log_records_corrupt.load(Ordering::Relaxed), 1);
    // Nothing of the record went to the store, rotten or not, and nothing after it.
    assert!(!store_holds(&store, &rotten[960..1040]).await);
    assert!(!store_holds(&store, &marker()[..512]).await);
    assert!(!store_holds(&store, &block(0, 1)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_rots_before_upload_fails_the_volume_and_is_not_uploaded() {
    rot_before_upload(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_record_intact_is_uploaded() {
    rot_before_upload(false).await;
}

/// With records kept in memory (the default) the upload takes the bytes the client
/// wrote, not the log's copy: a byte flipped in the log after the write does not
/// reach the store, and the volume goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_rotting_in_the_log_is_uploaded_from_memory_intact() {
    let memory = EngineConfig {
        upload_memory_bytes: 32 << 20,
        ..config(3_600_000)
    };
    rot_before_upload_with(true, memory).await;
}

/// Writes after the failure fail (EIO to clients), naming why, and so do flushes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_and_flushes_after_an_integrity_failure_fail() {
    let dir = TempDir::new("engine-integrity-eio");
    let store: DynStore = Arc::new(MemStore::new());
    let (vol, _) = create_and_open(&store, "v", BLOCKS * 4096, dir.path(), config(200)).await;
    // The marker alone in a record; the uploader wakes every 200 ms and the batch
    // times out after 200 ms, so corrupt it at once.
    vol.write(ROT_BLOCK * 4096, marker(), true)
        .await
        .expect("write marker");
    let wlog = dir.path().join("v.wlog");
    flip_byte(&wlog, find_in_file(&wlog, &marker()) + 7);
    wait_until("the uploader to find the corrupt record", async || {
        vol.status().failure.is_some()
    })
    .await;
    let e = vol
        .write(0, block(0, 2), false)
        .await
        .expect_err("writes fail");
    assert_eq!(e.kind, ErrorKind::VolumeFailed);
    assert!(e.to_string().contains("fails verification"), "{e}");
    let e = vol.flush().await.expect_err("flushes fail");
    assert_eq!(e.kind, ErrorKind::VolumeFailed);
    assert_eq!(
        std::io::Error::from(e).kind(),
        std::io::ErrorKind::Other,
        "EIO"
    );
    assert!(!store_holds(&store, &marker()[..512]).await);
    let _ = vol.shutdown().await;
}

/// Recovery takes durable records from the write-log index without reading their
/// data; one that rotted is caught when the uploader reads it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotten_record_taken_from_the_index_is_not_uploaded() {
    let dir = TempDir::new("engine-integrity-index");
    let mem: DynStore = Arc::new(MemStore::new());
    let (vol, faulty) = open_behind_faults(mem.clone(), BLOCKS * 4096, &dir, config(50)).await;
    // Nothing reaches the store: every record stays in the log. The marker goes
    // first, then enough data (an eighth of the log and more) for an index.
    faulty.set_outage(true);
    vol.write(ROT_BLOCK * 4096, marker(), true)
        .await
        .expect("write marker");
    for v in 1..=3u64 {
        for b in 0..BLOCKS {
            if b != ROT_BLOCK {
                vol.write(b * 4096, block(b, v), false)
                    .await
                    .expect("write");
            }
        }
        vol.flush().await.expect("flush");
    }
    assert!(vol.stats().log_index_written.load(Ordering::Relaxed) > 0);
    vol.crash();
    drop(vol);
    let wlog = dir.path().join("v.wlog");
    flip_byte(&wlog, find_in_file(&wlog, &marker()) + 2000);
    let what = "reopen: the index is taken on trust";
    let (vol, rep) = open_v(&mem, dir.path(), config(50), what).await;
    assert!(rep.log_records_from_index > 0, "{rep:?}");
    wait_until("the uploader to find the corrupt record", async || {
        vol.status().failure.is_some()
    })
    .await;
    let why = vol
        .status()
        .failure
        .expect("the uploader found the corrupt record");
    assert!(
        why.contains(&format!("LBAs {ROT_LBA}..{}", ROT_LBA + 8)),
        "{why}"
    );
    assert_eq!(vol.stats().log_records_corrupt.load(Ordering::Relaxed), 1);
    assert!(!store_holds(&mem, &marker()[..512]).await);
    let _ = vol.shutdown().await;
}
