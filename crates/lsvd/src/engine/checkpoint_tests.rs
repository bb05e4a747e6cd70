//! Checkpoint scheduling: by object count and by time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{EngineConfig, create_volume, open_volume};
use crate::store::DynStore;
use crate::store::mem::MemStore;
use crate::testutil::TempDir;

fn config(interval_ms: u64) -> EngineConfig {
    EngineConfig {
        batch_size_bytes: 256 << 10,
        batch_timeout_ms: 20,
        log_size_bytes: 16 << 20,
        checkpoint_every_objects: 1000,
        checkpoint_interval_ms: interval_ms,
        read_cache_bytes: 0,
        ..EngineConfig::default()
    }
}

/// Write one block, flush, and return how many checkpoints exist after `wait`.
async fn checkpoints_after_one_write(interval_ms: u64, wait: Duration) -> (u64, u64) {
    let dir = TempDir::new("engine-ckpt-time");
    let store: DynStore = Arc::new(MemStore::new());
    create_volume(&store, "v", 1 << 20).await.expect("create");
    let (volume, _) = open_volume(store.clone(), "v", dir.path(), config(interval_ms))
        .await
        .expect("open");
    let before = volume.status().checkpoints;
    volume
        .write(0, vec![7u8; 4096], false)
        .await
        .expect("write");
    volume.flush().await.expect("flush");
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline && volume.status().checkpoints == before {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = volume.status().checkpoints;
    volume.shutdown().await.expect("shutdown");
    (before, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_follows_new_objects_once_the_interval_passes() {
    let (before, after) = checkpoints_after_one_write(300, Duration::from_secs(10)).await;
    assert!(
        after > before,
        "no checkpoint within 10 s of a 300 ms interval ({before} -> {after})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_time_checkpoint_before_the_interval() {
    // One object is far below the count trigger; with a long interval, none is due.
    let (before, after) = checkpoints_after_one_write(3_600_000, Duration::from_secs(1)).await;
    assert_eq!(before, after, "a checkpoint appeared before it was due");
}
