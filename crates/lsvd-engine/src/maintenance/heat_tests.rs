//! hylog's write frequencies survive a restart: every checkpoint carries the tracker
//! and open restores it (a crash additionally replays the write log's records into
//! it); a volume opened under another GC policy keeps none. A client batch split by
//! heat is recovered all or none.

use std::sync::Arc;

use lsvd_core::gc::GcPolicy;
use lsvd_core::heat::HeatTracker;
use lsvd_core::hylog::RegionClasses;

use crate::test_support::{create_and_open, open_v, poll_until, wait_until};
use crate::{EngineConfig, Volume, create_volume, open_volume};
use lsvd_store::DynStore;
use lsvd_store::faulty::{FaultPlan, FaultyStore};
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

const BLOCK: u64 = 4096;

fn config(policy: GcPolicy) -> EngineConfig {
    let mut c = EngineConfig {
        batch_size_bytes: 1 << 20,
        log_size_bytes: 16 << 20,
        read_cache_bytes: 0,
        ..EngineConfig::default()
    };
    c.gc.policy = policy;
    c
}

fn heat_of(vol: &Volume) -> Option<HeatTracker> {
    vol.shared.lock().heat.clone()
}

/// Blocks 0..4 written `hot_rounds` times, 4..64 once.
async fn write_hot_and_cold(vol: &Volume, hot_rounds: u8) {
    for b in 4..64u64 {
        vol.write(b * BLOCK, vec![1; BLOCK as usize], false)
            .await
            .expect("cold write");
    }
    for round in 0..hot_rounds {
        for b in 0..4u64 {
            vol.write(b * BLOCK, vec![round; BLOCK as usize], false)
                .await
                .expect("hot write");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_frequencies_survive_a_clean_restart_and_a_crash() {
    let store: DynStore = Arc::new(MemStore::new());
    let dir = TempDir::new("engine-heat");
    let (vol, _) =
        create_and_open(&store, "v", 16 << 20, dir.path(), config(GcPolicy::HyLog)).await;
    write_hot_and_cold(&vol, 40).await;
    let before = heat_of(&vol).expect("hylog keeps a tracker");
    assert_eq!(before.heat_at(0), 40 * 8, "4 KiB = 8 sectors per write");
    assert_eq!(before.heat_at(4 * 8), 8);
    vol.shutdown().await.expect("shutdown");
    drop(vol);

    // A clean restart: exactly the counters the shutdown checkpoint saved.
    let (vol, _) = open_v(&store, dir.path(), config(GcPolicy::HyLog), "reopen").await;
    assert_eq!(heat_of(&vol), Some(before.clone()));
    assert_eq!(vol.status().gc_hot_moved_bytes, 0);

    // A crash: the last checkpoint's counters plus the log's records replayed.
    write_hot_and_cold(&vol, 10).await;
    vol.crash();
    drop(vol);
    let what = "open after a crash";
    let (vol, _) = open_v(&store, dir.path(), config(GcPolicy::HyLog), what).await;
    let after = heat_of(&vol).expect("tracker");
    assert!(
        after.heat_at(0) >= before.heat_at(0) + 10 * 8,
        "hot block: {} after, {} before",
        after.heat_at(0),
        before.heat_at(0)
    );
    assert!(after.heat_at(0) > 4 * after.heat_at(4 * 8), "still hot");
    for b in 0..4u64 {
        assert_eq!(
            vol.read(b * BLOCK, BLOCK).await.expect("read"),
            vec![9; 4096]
        );
    }
    vol.shutdown().await.expect("shutdown");
    drop(vol);

    // Greedy keeps no tracker (and its checkpoints carry none).
    let (vol, _) = open_volume(store, "v", dir.path(), config(GcPolicy::Greedy))
        .await
        .expect("open under greedy");
    assert!(heat_of(&vol).is_none());
    vol.shutdown().await.expect("shutdown");
}

/// A batch split into a cold and a hot part whose second upload never lands (the
/// process dies): from the store alone the volume holds none of the batch, only what
/// came before it (a prefix), and the part that landed is removed as stranded; with
/// the write log the whole batch is back. Fails if recovery applies a lone part (the
/// cold blocks would read back from the store alone) or if a part frees the batch's
/// records (the log would not hold them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_batch_whose_last_part_never_landed_is_recovered_all_or_none() {
    let inner = MemStore::new();
    let shared_inner: DynStore = Arc::new(inner.clone());
    create_volume(&shared_inner, "v", 16 << 20)
        .await
        .expect("create");
    let faulty = Arc::new(FaultyStore::new(
        shared_inner.clone(),
        FaultPlan::default(),
        7,
    ));
    let store: DynStore = faulty.clone();
    let dir = TempDir::new("engine-split");
    // One upload at a time: the first part has landed before the second is issued.
    let one_at_a_time = EngineConfig {
        uploads_in_flight: 1,
        ..config(GcPolicy::HyLog)
    };
    let (vol, _) = open_volume(store, "v", dir.path(), one_at_a_time)
        .await
        .expect("open");
    // Blocks 100..104 first, whole and in the store.
    for b in 100..104u64 {
        vol.write(b * BLOCK, vec![5; BLOCK as usize], false)
            .await
            .expect("write");
    }
    vol.sync_to_store().await.expect("sync");
    // Blocks 0..4 hot, the rest cold (4 KiB regions on a 16 MiB volume).
    let mut table = vec![0u8; 4096];
    table[..4].fill(1);
    vol.shared
        .lock()
        .pipeline
        .set_batch_classes(Some(RegionClasses::from_table(8, table)));
    for b in (0..4u64).chain(40..44) {
        vol.write(b * BLOCK, vec![b as u8 + 1; BLOCK as usize], false)
            .await
            .expect("write");
    }
    vol.flush().await.expect("flush");
    let before = inner.snapshot().len();
    // The batch's two parts are the next two PUTs: the second one kills the store.
    faulty.kill_after_mutations(2);
    vol.shared.lock().pipeline.close_batch();
    vol.shared.upload_wake.notify_one();
    wait_until(
        "the batch's parts uploaded (the store killed)",
        async || faulty.is_killed(),
    )
    .await;
    // Time for a part that should not land to show.
    poll_until(std::time::Duration::from_millis(50), async || {
        inner.snapshot().len() > before + 1
    })
    .await;
    vol.crash();
    drop(vol);
    assert_eq!(inner.snapshot().len(), before + 1, "one part landed");

    // The store alone (a new cache): a prefix without the batch.
    let copy: DynStore = Arc::new(inner.deep_copy());
    let fresh = TempDir::new("engine-split-fresh");
    let (vol, report) = open_volume(copy, "v", fresh.path(), config(GcPolicy::HyLog))
        .await
        .expect("open from the store alone");
    assert_eq!(report.stranded_deleted.len(), 1, "{report:?}");
    for b in 100..104u64 {
        assert_eq!(
            vol.read(b * BLOCK, BLOCK).await.expect("read"),
            vec![5; 4096]
        );
    }
    for b in (0..4u64).chain(40..44) {
        assert_eq!(
            vol.read(b * BLOCK, BLOCK).await.expect("read"),
            vec![0; 4096],
            "block {b} of the torn batch"
        );
    }
    vol.shutdown().await.expect("shutdown");
    drop(vol);

    // With the write log: the whole batch.
    let (vol, report) = open_volume(shared_inner, "v", dir.path(), config(GcPolicy::HyLog))
        .await
        .expect("open with the cache");
    assert_eq!(report.stranded_deleted.len(), 1, "{report:?}");
    for b in (0..4u64).chain(40..44) {
        assert_eq!(
            vol.read(b * BLOCK, BLOCK).await.expect("read"),
            vec![b as u8 + 1; 4096],
            "block {b}"
        );
    }
    for b in 100..104u64 {
        assert_eq!(
            vol.read(b * BLOCK, BLOCK).await.expect("read"),
            vec![5; 4096]
        );
    }
    vol.shutdown().await.expect("shutdown");
}
