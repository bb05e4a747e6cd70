//! In-process tests of the engine on the in-memory store: data integrity through
//! uploads, restarts and garbage collection.

use std::sync::Arc;

use super::{EngineConfig, Volume, create_volume, open_volume};
use crate::store::DynStore;
use crate::store::mem::MemStore;
use crate::testutil::TempDir;

const BLOCK: u64 = 4096;

fn config() -> EngineConfig {
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

/// A 4 KiB block whose content names (block, version).
fn block_data(block: u64, version: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK as usize];
    for (i, chunk) in v.chunks_mut(16).enumerate() {
        chunk[..8].copy_from_slice(&block.to_le_bytes());
        chunk[8..16].copy_from_slice(&(version ^ i as u64).to_le_bytes());
    }
    v
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

async fn verify(volume: &Volume, model: &[u64]) {
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

async fn wait_for_uploads(volume: &Volume) {
    for _ in 0..500 {
        if volume.status().uploads_pending == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("uploads did not finish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwrites_with_gc_keep_data_and_bound_the_store() {
    let dir = TempDir::new("engine-gc");
    let mem = MemStore::new();
    let store: DynStore = Arc::new(mem.clone());
    let blocks = 2048u64; // 8 MiB volume
    create_volume(&store, "v", blocks * BLOCK)
        .await
        .expect("create");
    let (volume, _) = open_volume(store.clone(), "v", dir.path(), config())
        .await
        .expect("open");
    let mut model = vec![0u64; blocks as usize];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut version = 0;
    for _ in 0..5 * blocks {
        let b = rng.next() % blocks;
        version += 1;
        volume
            .write(b * BLOCK, block_data(b, version), false)
            .await
            .expect("write");
        model[b as usize] = version;
    }
    volume.flush().await.expect("flush");
    wait_for_uploads(&volume).await;
    // Let GC catch up: it runs in passes after uploads.
    for _ in 0..300 {
        let s = volume.status();
        if s.utilization >= 0.70 && s.uploads_pending == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let status = volume.status();
    assert!(status.gc_passes > 0, "GC ran: {status:?}");
    verify(&volume, &model).await;
    volume.shutdown().await.expect("shutdown");
    let stored: u64 = mem
        .snapshot()
        .iter()
        .filter(|(k, _)| k.ends_with(".d") || k.ends_with(".g"))
        .map(|(_, n)| n)
        .sum();
    let live = blocks * BLOCK;
    let bound = (live as f64 / 0.70) as u64 + 2 * (256 << 10) + (64 << 10);
    assert!(
        stored <= bound,
        "store holds {stored} bytes, bound {bound} (live {live})"
    );
    // Reopen from the store alone and verify again.
    let dir2 = TempDir::new("engine-gc-reopen");
    let (volume, report) = open_volume(store.clone(), "v", dir2.path(), config())
        .await
        .expect("reopen");
    assert!(report.checkpoint_clean);
    verify(&volume, &model).await;
    volume.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trim_frees_store_space_after_gc() {
    let dir = TempDir::new("engine-trim");
    let mem = MemStore::new();
    let store: DynStore = Arc::new(mem.clone());
    let blocks = 2048u64;
    create_volume(&store, "v", blocks * BLOCK)
        .await
        .expect("create");
    let (volume, _) = open_volume(store.clone(), "v", dir.path(), config())
        .await
        .expect("open");
    let mut model = vec![0u64; blocks as usize];
    for b in 0..blocks {
        volume
            .write(b * BLOCK, block_data(b, b + 1), false)
            .await
            .expect("write");
        model[b as usize] = b + 1;
    }
    volume.flush().await.expect("flush");
    wait_for_uploads(&volume).await;
    // Trim 90%.
    let keep = blocks / 10;
    volume
        .write_zeroes(keep * BLOCK, (blocks - keep) * BLOCK, false)
        .await
        .expect("trim");
    for m in model.iter_mut().skip(keep as usize) {
        *m = 0;
    }
    volume.flush().await.expect("flush");
    for _ in 0..500 {
        let s = volume.status();
        if s.uploads_pending == 0 && s.store_bytes < 2 * keep * BLOCK + (512 << 10) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let s = volume.status();
    assert_eq!(s.live_bytes, keep * BLOCK);
    assert!(
        s.store_bytes < 2 * keep * BLOCK + (512 << 10),
        "store shrank after trim: {s:?}"
    );
    let alloc = volume.allocation(0, blocks * BLOCK).expect("allocation");
    assert_eq!(
        alloc,
        vec![(keep * BLOCK, true), ((blocks - keep) * BLOCK, false)]
    );
    verify(&volume, &model).await;
    volume.shutdown().await.expect("shutdown");
    let dir2 = TempDir::new("engine-trim-reopen");
    let (volume, _) = open_volume(store, "v", dir2.path(), config())
        .await
        .expect("reopen");
    verify(&volume, &model).await;
    volume.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_cache_hits_evicts_survives_restart_and_never_serves_stale_data() {
    let dir = TempDir::new("engine-rcache");
    let store: DynStore = Arc::new(MemStore::new());
    let blocks = 1024u64; // 4 MiB volume, 1 MiB read cache (16 chunks of 64 KiB)
    create_volume(&store, "v", blocks * BLOCK)
        .await
        .expect("create");
    let cfg = EngineConfig {
        read_cache_bytes: 1 << 20,
        gc: lsvd_core::gc::GcConfig {
            start_utilization: 0.0,
            ..Default::default()
        },
        ..config()
    };
    let (volume, _) = open_volume(store.clone(), "v", dir.path(), cfg.clone())
        .await
        .expect("open");
    for b in 0..blocks {
        volume
            .write(b * BLOCK, block_data(b, 1), false)
            .await
            .expect("write");
    }
    volume.shutdown().await.expect("shutdown");
    // Reopen: the log is empty, so reads go to objects.
    let (volume, _) = open_volume(store.clone(), "v", dir.path(), cfg.clone())
        .await
        .expect("open");
    let s0 = volume.status();
    assert_eq!(volume.read(0, BLOCK).await.expect("read"), block_data(0, 1));
    let s1 = volume.status();
    assert_eq!(s1.read_cache_misses - s0.read_cache_misses, 1);
    // The rest of the 64 KiB chunk was prefetched: block 1 is a hit.
    assert_eq!(
        volume.read(BLOCK, BLOCK).await.expect("read"),
        block_data(1, 1)
    );
    let s2 = volume.status();
    assert_eq!(s2.read_cache_hits - s1.read_cache_hits, 1);
    // Write after read: the new data wins over the cached chunk, before and after upload.
    volume
        .write(BLOCK, block_data(1, 2), false)
        .await
        .expect("write");
    assert_eq!(
        volume.read(BLOCK, BLOCK).await.expect("read"),
        block_data(1, 2)
    );
    volume.flush().await.expect("flush");
    wait_for_uploads(&volume).await;
    assert_eq!(
        volume.read(0, 2 * BLOCK).await.expect("read")[BLOCK as usize..],
        block_data(1, 2)[..]
    );
    // Read the whole volume: 64 chunks through a 16-chunk cache forces eviction.
    for b in 0..blocks {
        let want = block_data(b, if b == 1 { 2 } else { 1 });
        assert_eq!(
            volume.read(b * BLOCK, BLOCK).await.expect("read"),
            want,
            "block {b}"
        );
    }
    let s3 = volume.status();
    assert_eq!(s3.read_cache_entries, 16, "cache is full, not larger");
    volume.shutdown().await.expect("shutdown");
    // Warm restart: the last chunks read are still cached.
    let (volume, _) = open_volume(store.clone(), "v", dir.path(), cfg)
        .await
        .expect("open");
    assert_eq!(volume.status().read_cache_entries, 16);
    let h0 = volume.status().read_cache_hits;
    assert_eq!(
        volume
            .read((blocks - 1) * BLOCK, BLOCK)
            .await
            .expect("read"),
        block_data(blocks - 1, 1)
    );
    assert_eq!(
        volume.status().read_cache_hits,
        h0 + 1,
        "warm hit after restart"
    );
    volume.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_volume_does_not_spin() {
    // Regression: the uploader's periodic tick woke the writer, which woke the
    // uploader, which ticked again: a busy loop burning a core while idle.
    let dir = TempDir::new("engine-idle");
    let store: DynStore = Arc::new(MemStore::new());
    create_volume(&store, "v", 1 << 20).await.expect("create");
    let (volume, _) = open_volume(store, "v", dir.path(), config())
        .await
        .expect("open");
    volume
        .write(0, vec![1u8; 4096], false)
        .await
        .expect("write");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let before = volume
        .stats()
        .uploader_wakeups
        .load(std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let after = volume
        .stats()
        .uploader_wakeups
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        after - before <= 20,
        "uploader woke {} times in an idle second",
        after - before
    );
    volume.shutdown().await.expect("shutdown");
}

/// Timing: recovery of a volume whose write log holds 1 GiB not yet in the store.
/// `cargo test --release -p lsvd --lib engine::tests::recovery_time -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing measurement"]
async fn recovery_time_with_one_gib_of_log() {
    use crate::store::faulty::{FaultPlan, FaultyStore};
    let dir = TempDir::new("engine-recovery-time");
    let mem = MemStore::new();
    let faulty = Arc::new(FaultyStore::new(
        Arc::new(mem.clone()),
        FaultPlan::default(),
        1,
    ));
    let store: DynStore = faulty.clone();
    let gib = 1u64 << 30;
    create_volume(&store, "v", 2 * gib).await.expect("create");
    let cfg = EngineConfig {
        log_size_bytes: gib + (256 << 20),
        batch_size_bytes: 8 << 20,
        ..EngineConfig::default()
    };
    let (volume, _) = open_volume(store.clone(), "v", dir.path(), cfg.clone())
        .await
        .expect("open");
    faulty
        .outage
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let chunk = vec![0x5au8; 1 << 20];
    let mut rng = Rng(7);
    for _ in 0..1024 {
        let at = (rng.next() % 2048) << 20;
        volume.write(at, chunk.clone(), false).await.expect("write");
    }
    volume.flush().await.expect("flush");
    let status = volume.status();
    volume.crash();
    drop(volume);
    faulty
        .outage
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let t = std::time::Instant::now();
    let (volume, report) = open_volume(store.clone(), "v", dir.path(), cfg)
        .await
        .expect("reopen");
    let open = t.elapsed();
    println!(
        "log held {} MiB not in the store; recovery replayed {} records ({} MiB, {} records from the write-log index) in {:?}",
        status.log_used_bytes >> 20,
        report.log_records_replayed,
        report.log_bytes_replayed >> 20,
        report.log_records_from_index,
        open
    );
    assert!(report.log_bytes_replayed >= gib);
    volume.shutdown().await.expect("shutdown");
}
