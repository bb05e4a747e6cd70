//! The store going away under writes: the write log fills, writes wait (never fail),
//! and the episode is counted (`log_full_waits`, `log_full`) next to the failed
//! uploads (`store_put_retries`); when the store is back every write lands.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{EngineConfig, create_volume, open_volume};
use crate::store::DynStore;
use crate::store::faulty::{FaultPlan, FaultyStore};
use crate::store::mem::MemStore;
use crate::testutil::TempDir;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_write_log_makes_writes_wait_and_is_counted() {
    let dir = TempDir::new("engine-log-full");
    let mem: DynStore = Arc::new(MemStore::new());
    create_volume(&mem, "v", 64 << 20).await.expect("create");
    let faulty = Arc::new(FaultyStore::new(mem.clone(), FaultPlan::default(), 1));
    let store: DynStore = faulty.clone();
    let config = EngineConfig {
        batch_size_bytes: 256 << 10,
        batch_timeout_ms: 20,
        log_size_bytes: 4 << 20,
        ..EngineConfig::default()
    };
    let (vol, _) = open_volume(store, "v", dir.path(), config)
        .await
        .expect("open");
    faulty.set_outage(true);
    // 32 MiB into a 4 MiB log with the store away: the writer must stop and wait.
    let writer = {
        let vol = vol.clone();
        tokio::spawn(async move {
            for i in 0..128u64 {
                vol.write(i * (256 << 10), vec![(i % 250) as u8 + 1; 256 << 10], false)
                    .await
                    .expect("a write waits for space, it does not fail");
            }
        })
    };
    let stats = vol.stats();
    for _ in 0..3000 {
        if stats.log_full.load(Ordering::Relaxed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        stats.log_full.load(Ordering::Relaxed),
        "the log never filled: {:?}",
        vol.status()
    );
    assert_eq!(stats.log_full_waits.load(Ordering::Relaxed), 1);
    assert!(!writer.is_finished(), "writes went on with the log full");
    assert!(stats.store_put_retries.load(Ordering::Relaxed) > 0);

    faulty.set_outage(false);
    tokio::time::timeout(Duration::from_secs(60), writer)
        .await
        .expect("writes resume once the store is back")
        .expect("writer task");
    assert!(!stats.log_full.load(Ordering::Relaxed));
    for i in 0..128u64 {
        let got = vol.read(i * (256 << 10), 256 << 10).await.expect("read");
        assert!(got.iter().all(|b| *b == (i % 250) as u8 + 1), "chunk {i}");
    }
    vol.shutdown().await.expect("shutdown");
}
