//! A volume that compresses: what it writes reads back, live (from the log, from the
//! store with and without the read cache) and from the store alone; compressible data
//! takes less room in the store, incompressible data no more than raw.

use std::sync::Arc;

use lsvd_core::compression::Compression;
use lsvd_store::DynStore;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

use crate::config::EngineConfig;
use crate::test_support::{BLOCK, create_and_open, wait_drained};

/// Bytes of data objects in the store.
fn data_object_bytes(mem: &MemStore) -> u64 {
    mem.snapshot()
        .iter()
        .filter(|(k, _)| k.ends_with(".d"))
        .map(|(_, n)| n)
        .sum()
}

/// Block `b` as text-like bytes (a sentence naming the block, repeated: compresses
/// about 10:1) or, when `noise`, pseudo-random bytes (does not compress).
fn block(b: u64, noise: bool) -> Vec<u8> {
    if noise {
        let mut state = b.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        return (0..BLOCK)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
    }
    format!("block {b:08} of a compressed volume; ")
        .into_bytes()
        .into_iter()
        .cycle()
        .take(BLOCK as usize)
        .collect()
}

/// Write `blocks` blocks (all text or all noise), let them reach the store, read them
/// back three ways; returns the data objects' bytes in the store.
async fn write_and_read_back(compression: Compression, noise: bool, blocks: u64) -> u64 {
    let mem = Arc::new(MemStore::new());
    let store: DynStore = mem.clone();
    let dir = TempDir::new("engine-compression");
    let config = EngineConfig {
        batch_size_bytes: 1 << 20,
        batch_timeout_ms: 50,
        log_size_bytes: 16 << 20,
        read_cache_bytes: 8 << 20,
        compression: Some(compression),
        ..EngineConfig::default()
    };
    let (volume, _) =
        create_and_open(&store, "v", blocks * BLOCK, dir.path(), config.clone()).await;
    // Two writes per 64 KiB so that chunks are made of several writes.
    for first in (0..blocks).step_by(8) {
        let data: Vec<u8> = (first..first + 8).flat_map(|b| block(b, noise)).collect();
        volume
            .write(first * BLOCK, data, false)
            .await
            .expect("write");
    }
    volume.flush().await.expect("flush");
    wait_drained(&volume).await;
    let check = async |what: &str, volume: &crate::Volume| {
        for b in 0..blocks {
            let got = volume.read(b * BLOCK, BLOCK).await.expect("read");
            assert!(got == block(b, noise), "{compression} {what}: block {b}");
        }
        // Reads across chunk boundaries.
        let got = volume.read(15 * BLOCK, 3 * BLOCK).await.expect("read");
        let want: Vec<u8> = (15..18).flat_map(|b| block(b, noise)).collect();
        assert!(got == want, "{compression} {what}: blocks 15-17");
    };
    // Twice: the first reads fill the read cache, the second hit it. (The log was
    // drained, so neither read comes from the write log.)
    check("from the store", &volume).await;
    check("from the read cache", &volume).await;
    volume.shutdown().await.expect("shutdown");
    let no_cache = EngineConfig {
        read_cache_bytes: 0,
        ..config
    };
    let dir2 = TempDir::new("engine-compression-reopen2");
    let (volume, _) = crate::open_volume(store, "v", dir2.path(), no_cache)
        .await
        .expect("reopen");
    check("reopened without a read cache", &volume).await;
    volume.shutdown().await.expect("shutdown");
    data_object_bytes(&mem)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressible_data_is_stored_smaller_and_reads_back() {
    let blocks = 1024;
    let raw = write_and_read_back(Compression::None, false, blocks).await;
    assert!(raw >= blocks * BLOCK, "raw objects hold every byte: {raw}");
    for compression in [Compression::Lz4, Compression::Zstd(3)] {
        let stored = write_and_read_back(compression, false, blocks).await;
        assert!(
            stored * 4 < raw,
            "{compression}: {stored} bytes stored for {raw} raw"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incompressible_data_costs_almost_nothing_more_than_raw() {
    let blocks = 512;
    let raw = write_and_read_back(Compression::None, true, blocks).await;
    for compression in [Compression::Lz4, Compression::Zstd(3)] {
        let stored = write_and_read_back(compression, true, blocks).await;
        assert!(
            stored as f64 <= raw as f64 * 1.02,
            "{compression}: {stored} bytes stored for {raw} raw"
        );
    }
}

/// A volume written raw, then served compressed: both kinds of object read back, and
/// the new objects are the compressed kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_and_compressed_objects_mix_in_one_volume() {
    let mem = Arc::new(MemStore::new());
    let store: DynStore = mem.clone();
    let dir = TempDir::new("engine-compression-mix");
    let raw_config = EngineConfig {
        batch_size_bytes: 256 << 10,
        batch_timeout_ms: 50,
        log_size_bytes: 16 << 20,
        read_cache_bytes: 0,
        ..EngineConfig::default()
    };
    let (volume, _) =
        create_and_open(&store, "v", 256 * BLOCK, dir.path(), raw_config.clone()).await;
    let data: Vec<u8> = (0..128).flat_map(|b| block(b, false)).collect();
    volume.write(0, data, false).await.expect("write");
    volume.flush().await.expect("flush");
    wait_drained(&volume).await;
    volume.shutdown().await.expect("shutdown");
    let raw_objects = data_object_bytes(&mem);
    let compressed = EngineConfig {
        compression: Some(Compression::Lz4),
        ..raw_config
    };
    let (volume, _) = crate::open_volume(store.clone(), "v", dir.path(), compressed.clone())
        .await
        .expect("reopen compressed");
    let data: Vec<u8> = (128..256).flat_map(|b| block(b, false)).collect();
    volume.write(128 * BLOCK, data, false).await.expect("write");
    volume.flush().await.expect("flush");
    wait_drained(&volume).await;
    for b in 0..256 {
        let got = volume.read(b * BLOCK, BLOCK).await.expect("read");
        assert!(got == block(b, false), "block {b}");
    }
    volume.shutdown().await.expect("shutdown");
    let added = data_object_bytes(&mem) - raw_objects;
    assert!(
        added * 4 < raw_objects,
        "{added} compressed vs {raw_objects} raw"
    );
}

/// Write 64 text blocks from `first` to volume "v" of `store` opened with `config`,
/// wait for the upload, shut down; returns the data objects' bytes this added to the
/// store (nothing is overwritten, so nothing is collected meanwhile).
async fn write_text_blocks(mem: &Arc<MemStore>, config: EngineConfig, first: u64) -> u64 {
    let before = data_object_bytes(mem);
    let dir = TempDir::new("settings");
    let store: DynStore = mem.clone();
    let (volume, _) = crate::open_volume(store, "v", dir.path(), config)
        .await
        .expect("open");
    let data: Vec<u8> = (first..first + 64).flat_map(|b| block(b, false)).collect();
    volume
        .write(first * BLOCK, data, false)
        .await
        .expect("write");
    volume.flush().await.expect("flush");
    wait_drained(&volume).await;
    volume.shutdown().await.expect("shutdown");
    data_object_bytes(mem) - before
}

/// Without `compression` in its config, a volume compresses as its settings in the
/// store say; `Some` in the config wins over them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_volume_settings_choose_the_compression_unless_the_config_does() {
    let mem = Arc::new(MemStore::new());
    let store: DynStore = mem.clone();
    let meta = crate::create_volume(&store, "v", 1 << 20)
        .await
        .expect("create");
    let config = EngineConfig {
        batch_timeout_ms: 50,
        log_size_bytes: 16 << 20,
        read_cache_bytes: 0,
        ..EngineConfig::default()
    };
    assert_eq!(
        crate::read_settings(&store, &meta).await.expect("read"),
        None
    );
    let raw = write_text_blocks(&mem, config.clone(), 0).await;
    assert!(raw >= 64 * BLOCK, "no settings: raw ({raw})");
    let set = crate::set_compression(&store, &meta, Compression::Zstd(5))
        .await
        .expect("set");
    let read = crate::read_settings(&store, &meta).await.expect("read");
    assert_eq!(read, Some(set));
    let compressed = write_text_blocks(&mem, config.clone(), 64).await;
    assert!(
        compressed * 4 < raw,
        "settings say zstd: {compressed} vs {raw}"
    );
    let forced = EngineConfig {
        compression: Some(Compression::None),
        ..config
    };
    let again = write_text_blocks(&mem, forced, 128).await;
    assert!(again >= 64 * BLOCK, "the config says none: {again}");
}

/// Settings that fail their checks, or that belong to another volume of the same
/// name, stop the open naming the key; nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_refuse_the_open() {
    use lsvd_core::format::volume_settings::{VolumeSettings, encode_volume_settings};
    let mem = Arc::new(MemStore::new());
    let store: DynStore = mem.clone();
    let meta = crate::create_volume(&store, "v", 1 << 20)
        .await
        .expect("create");
    let other = VolumeSettings {
        volume: lsvd_core::VolumeId([9; 16]),
        compression: Compression::Lz4,
        changed_unix_ms: 0,
    };
    let mut flipped = encode_volume_settings(&VolumeSettings {
        volume: meta.volume,
        ..other
    });
    flipped[33] ^= 1;
    for (what, bytes) in [
        ("another volume's", encode_volume_settings(&other)),
        ("corrupt", flipped),
    ] {
        store
            .put("v/settings", bytes.into(), lsvd_store::PutMode::Overwrite)
            .await
            .expect("put");
        let dir = TempDir::new("settings-bad");
        let err = crate::open_volume(store.clone(), "v", dir.path(), EngineConfig::default())
            .await
            .map(drop)
            .expect_err(what);
        assert_eq!(
            err.kind,
            lsvd_core::error::ErrorKind::Corrupt,
            "{what}: {err}"
        );
        assert!(err.to_string().contains("v/settings"), "{what}: {err}");
    }
    assert_eq!(data_object_bytes(&mem), 0);
}

/// A compressed volume replicates as it is stored (objects copied and checked without
/// being opened, checkpoints opened for their lists), and the replica reads back, served
/// from the target store alone, at the compressed size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_volume_replicates_and_the_replica_reads_back() {
    let mem = Arc::new(MemStore::new());
    let source: DynStore = mem.clone();
    let target_mem = Arc::new(MemStore::new());
    let target: DynStore = target_mem.clone();
    let dir = TempDir::new("compression-replicate");
    let config = EngineConfig {
        batch_size_bytes: 256 << 10,
        batch_timeout_ms: 50,
        log_size_bytes: 16 << 20,
        read_cache_bytes: 0,
        checkpoint_every_objects: 2,
        compression: Some(Compression::Zstd(3)),
        ..EngineConfig::default()
    };
    let (volume, _) = create_and_open(&source, "v", 256 * BLOCK, dir.path(), config.clone()).await;
    let data: Vec<u8> = (0..256).flat_map(|b| block(b, false)).collect();
    volume.write(0, data, false).await.expect("write");
    volume.flush().await.expect("flush");
    wait_drained(&volume).await;
    volume.shutdown().await.expect("shutdown");
    let (options, progress) = (
        crate::ReplicateOptions::default(),
        crate::ReplicateProgress::default(),
    );
    crate::replicate_once(&source, &target, "v", &options, &progress)
        .await
        .expect("replicate");
    assert_eq!(data_object_bytes(&target_mem), data_object_bytes(&mem));
    let dir2 = TempDir::new("compression-replica");
    let (replica, _) = crate::open_volume(target, "v", dir2.path(), config)
        .await
        .expect("open the replica");
    for b in 0..256 {
        let got = replica.read(b * BLOCK, BLOCK).await.expect("read");
        assert!(got == block(b, false), "replica block {b}");
    }
    replica.shutdown().await.expect("shutdown");
}
