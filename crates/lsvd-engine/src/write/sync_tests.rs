//! `Volume::sync_to_store` (`lsvd sync`): after it returns, the store alone holds every
//! write acknowledged before the call, even with a batch timeout that would have kept
//! them in the write log for minutes.

use std::sync::Arc;

use crate::test_support::{create_and_open, log_config, poll_until};
use crate::{EngineConfig, Volume, create_volume, open_volume};
use lsvd_store::DynStore;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

fn config() -> EngineConfig {
    // Nothing leaves the write log by itself during the test.
    log_config(8 << 20, 600_000, 16 << 20)
}

/// Crash `vol` and open its volume from `store` alone (a new cache directory, named
/// by `tag` and returned, so no write log).
async fn crash_and_open_elsewhere(
    vol: Arc<Volume>,
    store: DynStore,
    tag: &str,
) -> (TempDir, Arc<Volume>) {
    vol.crash();
    drop(vol);
    let elsewhere = TempDir::new(tag);
    let (vol, _) = open_volume(store, "v", elsewhere.path(), config())
        .await
        .expect("open from the store alone");
    (elsewhere, vol)
}

/// Write 64 blocks, sync or not, crash, and read them back from the store alone (a
/// new cache directory, no write log).
async fn blocks_in_the_store_alone(sync: bool) -> Vec<Vec<u8>> {
    let store: DynStore = Arc::new(MemStore::new());
    let dir = TempDir::new("engine-sync");
    let (vol, _) = create_and_open(&store, "v", 4 << 20, dir.path(), config()).await;
    for b in 0..64u64 {
        vol.write(b * 4096, vec![b as u8 + 1; 4096], false)
            .await
            .expect("write");
    }
    if sync {
        let through = vol.sync_to_store().await.expect("sync");
        assert!(through >= 1, "records through {through}");
        // Nothing new: returns at once with the same answer.
        assert_eq!(vol.sync_to_store().await.expect("sync again"), through);
    }
    let (_elsewhere, vol) = crash_and_open_elsewhere(vol, store, "engine-sync-elsewhere").await;
    let mut blocks = Vec::new();
    for b in 0..64u64 {
        blocks.push(vol.read(b * 4096, 4096).await.expect("read"));
    }
    vol.shutdown().await.expect("shutdown");
    blocks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sync_the_store_alone_holds_every_acknowledged_write() {
    let synced = blocks_in_the_store_alone(true).await;
    for (b, block) in synced.iter().enumerate() {
        assert_eq!(*block, vec![b as u8 + 1; 4096], "block {b}");
    }
    // Without it, the same writes are only in the write log (the test can fail).
    let unsynced = blocks_in_the_store_alone(false).await;
    assert!(unsynced.iter().all(|b| b.iter().all(|x| *x == 0)));
}

/// With the store away, `sync_to_store` waits (it does not answer early, nor fail);
/// once the store is back it answers, and the store alone then holds the writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_waits_while_the_store_is_away() {
    use lsvd_store::faulty::{FaultPlan, FaultyStore};
    use std::time::Duration;
    let mem: DynStore = Arc::new(MemStore::new());
    create_volume(&mem, "v", 4 << 20).await.expect("create");
    let faulty = Arc::new(FaultyStore::new(mem.clone(), FaultPlan::default(), 1));
    let store: DynStore = faulty.clone();
    let dir = TempDir::new("engine-sync-outage");
    let (vol, _) = open_volume(store, "v", dir.path(), config())
        .await
        .expect("open");
    faulty.set_outage(true);
    for b in 0..64u64 {
        vol.write(b * 4096, vec![b as u8 + 1; 4096], false)
            .await
            .expect("write");
    }
    let sync = {
        let vol = vol.clone();
        tokio::spawn(async move { vol.sync_to_store().await })
    };
    // Until uploads have failed and been retried a few times, and then a while
    // longer: the sync must still be waiting.
    let stats = vol.stats();
    poll_until(Duration::from_secs(30), async || {
        stats
            .store_put_retries
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 3
    })
    .await;
    poll_until(Duration::from_millis(300), async || sync.is_finished()).await;
    assert!(
        !sync.is_finished(),
        "sync answered with the store away: {:?}",
        vol.status()
    );
    faulty.set_outage(false);
    let through = tokio::time::timeout(Duration::from_secs(60), sync)
        .await
        .expect("sync answers once the store is back")
        .expect("sync task")
        .expect("sync");
    assert!(through >= 64, "records through {through}");
    let (_elsewhere, vol) =
        crash_and_open_elsewhere(vol, mem, "engine-sync-outage-elsewhere").await;
    for b in 0..64u64 {
        assert_eq!(
            vol.read(b * 4096, 4096).await.expect("read"),
            vec![b as u8 + 1; 4096],
            "block {b}"
        );
    }
    vol.shutdown().await.expect("shutdown");
}
