//! The tail cache: on a chain store the engine copies what it uploads into its read
//! cache, so reads of fresh data (which sits on the tail drive, the one taking the
//! writes) are served from the cache and never reach that drive; with admission off
//! they do. Counted with the store's own read counters, after a restart (so nothing
//! comes from the write log).

use std::sync::Arc;

use crate::EngineConfig;
use crate::config::Admission;
use crate::test_support::{create_and_open, open_v};
use lsvd_store::chain::chain_store::ChainStore;
use lsvd_store::chain::drives::parse_spec;
use lsvd_store::testutil::TempDir;
use lsvd_store::{DynStore, ObjectStore};

const BLOCK: u64 = 4096;
/// 8 MiB volume, written whole in 64 KiB writes.
const BLOCKS: u64 = 2048;

fn block_data(block: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK as usize];
    for (i, chunk) in v.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&(block * 4096 + i as u64).to_le_bytes());
    }
    v
}

/// Reads that reached the tail drive, and all object reads, while every block is read
/// back after a restart.
async fn reads_after_restart(admit: Admission) -> (u64, u64) {
    let root = TempDir::new("chain-tail-cache");
    let spec = format!(
        "{},{}?drive_size=64M",
        root.path().join("d0").display(),
        root.path().join("d1").display()
    );
    let chain = ChainStore::open(&parse_spec("chain", &spec).expect("spec")).expect("open");
    assert!(chain.admit_uploads_to_cache());
    let store: DynStore = Arc::new(chain.clone());
    let config = EngineConfig {
        batch_size_bytes: 1 << 20,
        batch_timeout_ms: 50,
        log_size_bytes: 16 << 20,
        read_cache_bytes: 16 << 20,
        read_cache_admit: admit,
        ..EngineConfig::default()
    };
    let data = TempDir::new("chain-tail-cache-data");
    let (volume, _) =
        create_and_open(&store, "v", BLOCKS * BLOCK, data.path(), config.clone()).await;
    for first in (0..BLOCKS).step_by(16) {
        let mut buf = Vec::with_capacity(16 * BLOCK as usize);
        for b in first..first + 16 {
            buf.extend_from_slice(&block_data(b));
        }
        volume
            .write(first * BLOCK, buf, false)
            .await
            .expect("write");
    }
    volume.sync_to_store().await.expect("sync");
    volume.shutdown().await.expect("shutdown");
    drop(volume);
    let (volume, _) = open_v(&store, data.path(), config, "reopen").await;
    assert_eq!(chain.tail(), 0, "the data should all be on the tail drive");
    let (reads_before, tail_before) = chain.read_counts();
    for first in (0..BLOCKS).step_by(16) {
        let got = volume.read(first * BLOCK, 16 * BLOCK).await.expect("read");
        for (i, block) in got.chunks(BLOCK as usize).enumerate() {
            assert!(
                block == block_data(first + i as u64).as_slice(),
                "block {} differs",
                first + i as u64
            );
        }
    }
    let (reads_after, tail_after) = chain.read_counts();
    volume.shutdown().await.expect("shutdown");
    (tail_after - tail_before, reads_after - reads_before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_data_is_read_from_the_cache_not_the_tail_drive() {
    let (tail_reads, reads) = reads_after_restart(Admission::Auto).await;
    assert_eq!(
        (tail_reads, reads),
        (0, 0),
        "with the tail cache every read is served from the read cache"
    );
    let (tail_reads, reads) = reads_after_restart(Admission::Never).await;
    assert!(
        tail_reads > 0 && tail_reads == reads,
        "without it, reads reach the tail drive: {tail_reads} of {reads}"
    );
}
