//! One read cache shared by the volumes of a process (`EngineConfig::host_read_cache`,
//! what `lsvd serve` does): a clone reading its base's data, and a snapshot export,
//! hit the chunks the base's reads cached, with no GET; with a cache per volume they
//! fetch them again. Data read is compared with what was written.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use crate::read::cache::HostReadCache;
use crate::test_support::create_and_open;
use crate::{EngineConfig, Volume, create_clone, open_snapshot, open_volume};
use lsvd_store::DynStore;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 8 * MIB;

fn pattern(offset: u64, len: u64) -> Vec<u8> {
    (offset / 8..(offset + len) / 8)
        .flat_map(|w| (w ^ 0x5a5a << 40).to_le_bytes())
        .collect()
}

fn config(host: Option<Arc<HostReadCache>>) -> EngineConfig {
    EngineConfig {
        batch_size_bytes: 4 * MIB,
        batch_timeout_ms: 50,
        log_size_bytes: 64 * MIB,
        read_cache_bytes: 64 * MIB,
        read_ahead_bytes: Some(0),
        host_read_cache: host,
        ..EngineConfig::default()
    }
}

/// Reads the whole volume in 256 KiB reads, checking every byte; returns (GETs,
/// read-cache misses) it took.
async fn read_all(v: &Volume, what: &str) -> (u64, u64) {
    let counters = || {
        let s = v.stats();
        let (gets, bytes) = (s.store_gets.load(Relaxed), s.store_get_bytes.load(Relaxed));
        (gets, bytes, v.status().read_cache_misses)
    };
    let before = counters();
    for at in (0..SIZE).step_by(256 * 1024) {
        let got = v.read(at, 256 * 1024).await.expect("read");
        assert!(got == pattern(at, 256 * 1024), "{what}: data at {at}");
    }
    let after = counters();
    let (gets, bytes) = (after.0 - before.0, after.1 - before.1);
    assert_eq!(gets == 0, bytes == 0, "{what}: {gets} GETs, {bytes} bytes");
    if gets > 0 {
        assert!(
            bytes >= SIZE,
            "{what}: the whole volume is fetched: {bytes} bytes"
        );
    }
    (gets, after.2 - before.2)
}

/// A store with volume "base" written whole (in objects, its log emptied), its
/// snapshot "s" and clone "c".
async fn base_snapshot_and_clone(dir: &TempDir) -> DynStore {
    let store: DynStore = Arc::new(MemStore::new());
    let (base, _) = create_and_open(&store, "base", SIZE, dir.path(), config(None)).await;
    for at in (0..SIZE).step_by(MIB as usize) {
        base.write(at, pattern(at, MIB), false)
            .await
            .expect("write");
    }
    base.create_snapshot("s").await.expect("snapshot");
    base.shutdown().await.expect("shutdown");
    create_clone(&store, "base", "s", "c").await.expect("clone");
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_and_a_snapshot_export_hit_the_chunks_their_base_cached() {
    let dir = TempDir::new("shared-cache");
    let store = base_snapshot_and_clone(&dir).await;
    for shared in [false, true] {
        // Cold local files for each round: other data directories.
        let round = dir.path().join(format!("shared-{shared}"));
        let host = if shared {
            HostReadCache::open_files(&round, 64 * MIB).expect("host cache")
        } else {
            None
        };
        let (base, _) = open_volume(store.clone(), "base", &round, config(host.clone()))
            .await
            .expect("open base");
        let (gets, misses) = read_all(&base, "base").await;
        assert!(gets > 0 && misses > 0, "the base reads from the store");
        let (clone, _) = open_volume(store.clone(), "c", &round, config(host.clone()))
            .await
            .expect("open clone");
        let (clone_gets, clone_misses) = read_all(&clone, "clone").await;
        let (snap, _) = open_snapshot(store.clone(), "base", "s", &round, config(host.clone()))
            .await
            .expect("open snapshot");
        let (snap_gets, snap_misses) = read_all(&snap, "snapshot").await;
        println!("shared {shared}: base {gets} GETs, clone {clone_gets}, snapshot {snap_gets}");
        if shared {
            assert_eq!((clone_gets, clone_misses), (0, 0), "the clone hits");
            assert_eq!((snap_gets, snap_misses), (0, 0), "the export hits");
            // Chunks are charged to the volume whose reads cached them.
            assert!(base.status().read_cache_entries > 0);
            assert_eq!(clone.status().read_cache_entries, 0);
        } else {
            assert!(clone_gets >= gets / 2, "a cache per volume fetches again");
            assert!(snap_gets >= gets / 2);
        }
        for v in [snap, clone, base] {
            v.shutdown().await.expect("shutdown");
        }
        if let Some(host) = host {
            assert!(
                !round.join("base.rcache").exists() && !round.join("c.rcache").exists(),
                "no cache file of a volume's own beside the shared one"
            );
            assert!(host.entries() > 0);
        }
    }
}
