//! hylog's write frequencies survive a restart: every checkpoint carries the tracker
//! and open restores it (a crash additionally replays the write log's records into
//! it); a volume opened under another GC policy keeps none.

use std::sync::Arc;

use lsvd_core::gc::GcPolicy;
use lsvd_core::heat::HeatTracker;

use super::{EngineConfig, Volume, create_volume, open_volume};
use crate::store::DynStore;
use crate::store::mem::MemStore;
use crate::testutil::TempDir;

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
    create_volume(&store, "v", 16 << 20).await.expect("create");
    let dir = TempDir::new("engine-heat");
    let (vol, _) = open_volume(store.clone(), "v", dir.path(), config(GcPolicy::HyLog))
        .await
        .expect("open");
    write_hot_and_cold(&vol, 40).await;
    let before = heat_of(&vol).expect("hylog keeps a tracker");
    assert_eq!(before.heat_at(0), 40 * 8, "4 KiB = 8 sectors per write");
    assert_eq!(before.heat_at(4 * 8), 8);
    vol.shutdown().await.expect("shutdown");
    drop(vol);

    // A clean restart: exactly the counters the shutdown checkpoint saved.
    let (vol, _) = open_volume(store.clone(), "v", dir.path(), config(GcPolicy::HyLog))
        .await
        .expect("reopen");
    assert_eq!(heat_of(&vol), Some(before.clone()));
    assert_eq!(vol.status().gc_hot_moved_bytes, 0);

    // A crash: the last checkpoint's counters plus the log's records replayed.
    write_hot_and_cold(&vol, 10).await;
    vol.crash();
    drop(vol);
    let (vol, _) = open_volume(store.clone(), "v", dir.path(), config(GcPolicy::HyLog))
        .await
        .expect("open after a crash");
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
