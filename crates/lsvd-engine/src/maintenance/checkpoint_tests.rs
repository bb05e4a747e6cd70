//! Checkpoint scheduling by time, on a manual clock: the checkpoint interval counts
//! from the last checkpoint, and nothing is due before it has passed.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::test_support::{create_and_open, wait_drained, wait_until};
use crate::{EngineConfig, Volume};
use lsvd_store::DynStore;
use lsvd_store::clock::{ManualClock, SharedClock};
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

const INTERVAL: Duration = Duration::from_secs(60);
use crate::write::uploader::TICK;

fn config(clock: &Arc<ManualClock>) -> EngineConfig {
    EngineConfig {
        batch_size_bytes: 256 << 10,
        batch_timeout_ms: 20,
        log_size_bytes: 16 << 20,
        checkpoint_every_objects: 1000,
        checkpoint_interval_ms: INTERVAL.as_millis() as u64,
        read_cache_bytes: 0,
        clock: SharedClock(clock.clone()),
        ..EngineConfig::default()
    }
}

/// Move the clock on and wait until the uploader has woken and looked at the time.
async fn advance_and_let_the_uploader_see_it(clock: &ManualClock, volume: &Volume, by: Duration) {
    let before = volume.stats().uploader_wakeups.load(Ordering::SeqCst);
    clock.advance(by);
    wait_until("the uploader woke", async || {
        volume.stats().uploader_wakeups.load(Ordering::SeqCst) > before
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_follows_new_objects_once_the_interval_passes_and_not_before() {
    let clock = ManualClock::new();
    let dir = TempDir::new("engine-ckpt-time");
    let store: DynStore = Arc::new(MemStore::new());
    let (volume, _) = create_and_open(&store, "v", 1 << 20, dir.path(), config(&clock)).await;
    let before = volume.status().checkpoints;
    volume
        .write(0, vec![7u8; 4096], false)
        .await
        .expect("write");
    volume.flush().await.expect("flush");
    // The batch times out (20 ms on the clock; the uploader looks every 200 ms) and
    // goes up.
    advance_and_let_the_uploader_see_it(&clock, &volume, TICK).await;
    wait_drained(&volume).await;
    // One object is far below the count trigger, and the interval has not passed.
    advance_and_let_the_uploader_see_it(&clock, &volume, INTERVAL - 2 * TICK).await;
    assert_eq!(
        volume.status().checkpoints,
        before,
        "a checkpoint appeared before it was due"
    );
    // The interval (counted from the open) passes: a checkpoint is due.
    advance_and_let_the_uploader_see_it(&clock, &volume, TICK).await;
    for _ in 0..100 {
        if volume.status().checkpoints > before {
            break;
        }
        // Time goes on (the checkpoint stays due) while the uploader gets to it.
        advance_and_let_the_uploader_see_it(&clock, &volume, TICK).await;
    }
    assert!(
        volume.status().checkpoints > before,
        "no checkpoint once the interval passed: {:?}",
        volume.status()
    );
    let after = volume.status().checkpoints;
    // Idle since: however much time passes, no more checkpoints.
    for _ in 0..3 {
        advance_and_let_the_uploader_see_it(&clock, &volume, 2 * INTERVAL).await;
    }
    assert_eq!(
        volume.status().checkpoints,
        after,
        "an idle volume checkpointed"
    );
    volume.shutdown().await.expect("shutdown");
}
