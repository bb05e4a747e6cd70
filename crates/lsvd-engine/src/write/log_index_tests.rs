//! The write-log index: recovery takes durable records from it instead of reading
//! the whole log, and falls back to reading the log when the index is unusable.

use std::sync::Arc;
use std::time::Duration;

use crate::test_support::{log_block as block, log_config, open_behind_faults, poll_until};
use crate::{EngineConfig, Volume, open_volume};
use lsvd_store::DynStore;
use lsvd_store::faulty::FaultyStore;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

const BLOCKS: u64 = 1024; // 4 MiB volume

fn config() -> EngineConfig {
    log_config(512 << 10, 50, 16 << 20)
}

/// Write `rounds` passes of 4 KiB blocks (flushing every 64), uploading while the
/// store is up, then stop the store so the last records stay in the log, and crash.
/// Returns the expected version of every block.
async fn write_then_crash(vol: &Volume, faulty: &FaultyStore) -> Vec<u64> {
    let mut model = vec![0u64; BLOCKS as usize];
    let mut v = 0;
    for pass in 0..4u64 {
        if pass == 3 {
            // Let the uploads catch up (the tail moves, the index is written), then
            // keep the newest records in the log only.
            poll_until(Duration::from_secs(3), async || {
                vol.status().uploads_pending == 0
            })
            .await;
            faulty.set_outage(true);
        }
        for b in 0..BLOCKS {
            let b = (b * 7 + pass) % BLOCKS;
            v += 1;
            vol.write(b * 4096, block(b, v), false)
                .await
                .expect("write");
            model[b as usize] = v;
            if v % 64 == 0 {
                vol.flush().await.expect("flush");
            }
        }
    }
    vol.flush().await.expect("flush");
    // Acknowledged but never synced: in the log file, never in an index.
    for b in 0..8u64 {
        v += 1;
        vol.write(b * 4096, block(b, v), false)
            .await
            .expect("write");
        model[b as usize] = v;
    }
    vol.crash();
    model
}

async fn verify(vol: &Volume, model: &[u64]) {
    for (b, &v) in model.iter().enumerate() {
        let got = vol.read(b as u64 * 4096, 4096).await.expect("read");
        assert!(got == block(b as u64, v), "block {b}: want version {v}");
    }
}

/// A new volume in a memory store (returned), open through a store over it that
/// fails on command.
async fn setup() -> (TempDir, DynStore, Arc<FaultyStore>, Arc<Volume>) {
    let dir = TempDir::new("engine-log-index");
    let mem: DynStore = Arc::new(MemStore::new());
    let (vol, faulty) = open_behind_faults(mem.clone(), BLOCKS * 4096, &dir, config()).await;
    (dir, mem, faulty, vol)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_takes_durable_records_from_the_index() {
    let (dir, mem, faulty, vol) = setup().await;
    let model = write_then_crash(&vol, &faulty).await;
    let written = vol
        .shared
        .stats
        .log_index_written
        .load(std::sync::atomic::Ordering::Relaxed);
    drop(vol);
    assert!(written > 0, "no index was written");
    let (vol, rep) = open_volume(mem, "v", dir.path(), config())
        .await
        .expect("reopen");
    assert!(
        rep.log_records_from_index > 0 && rep.log_records_replayed > rep.log_records_from_index,
        "index used for the synced records, the log read for the unsynced rest: {rep:?}"
    );
    verify(&vol, &model).await;
    vol.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_index_falls_back_to_reading_the_log() {
    let (dir, mem, faulty, vol) = setup().await;
    let model = write_then_crash(&vol, &faulty).await;
    let layout = vol.shared.layout;
    drop(vol);
    // Flip a byte in the middle of both slots' contents.
    let path = dir.path().join("v.wlog");
    let mut image = std::fs::read(&path).expect("read log file");
    for slot in 0..2u64 {
        let at = (layout.log_end + slot * layout.slot_bytes + 100) as usize;
        image[at] ^= 0x20;
    }
    std::fs::write(&path, &image).expect("write log file");
    let (vol, rep) = open_volume(mem, "v", dir.path(), config())
        .await
        .expect("reopen");
    assert_eq!(rep.log_records_from_index, 0, "a corrupt index was used");
    assert!(rep.log_records_replayed > 0);
    verify(&vol, &model).await;
    vol.shutdown().await.expect("shutdown");
}
