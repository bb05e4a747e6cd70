//! A volume that compresses: what it writes reads back, live (from the log, from the
//! store with and without the read cache) and from the store alone; compressible data
//! takes less room in the store, incompressible data no more than raw; the volume's
//! settings choose the compression unless the configuration does; a compressed volume
//! replicates.

use std::sync::Arc;

use lsvd_core::compression::Compression;
use lsvd_store::DynStore;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;
use lsvd_trace::synthetic::prng::SplitMix64;

use crate::Volume;
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
        let mut rng = SplitMix64::new(b);
        return (0..BLOCK).map(|_| rng.next_u64() as u8).collect();
    }
    format!("block {b:08} of a compressed volume; ")
        .into_bytes()
        .into_iter()
        .cycle()
        .take(BLOCK as usize)
        .collect()
}

/// Small batches closed quickly, a small log, no read cache, and `compression`.
fn config(compression: Option<Compression>) -> EngineConfig {
    EngineConfig {
        batch_size_bytes: 256 << 10,
        batch_timeout_ms: 50,
        log_size_bytes: 16 << 20,
        read_cache_bytes: 0,
        compression,
        ..EngineConfig::default()
    }
}

/// Write `blocks` (text, or noise) eight at a time, flush, and wait until all of it
/// is in the store and the log is empty.
async fn write_blocks(volume: &Volume, blocks: std::ops::Range<u64>, noise: bool) {
    for first in blocks.clone().step_by(8) {
        let last = (first + 8).min(blocks.end);
        let data: Vec<u8> = (first..last).flat_map(|b| block(b, noise)).collect();
        volume
            .write(first * BLOCK, data, false)
            .await
            .expect("write");
    }
    volume.flush().await.expect("flush");
    wait_drained(volume).await;
}

/// Read `blocks` back one by one, and three blocks across a chunk boundary.
async fn read_blocks(volume: &Volume, blocks: std::ops::Range<u64>, noise: bool, what: &str) {
    for b in blocks {
        let got = volume.read(b * BLOCK, BLOCK).await.expect("read");
        assert!(got == block(b, noise), "{what}: block {b}");
    }
    let got = volume.read(15 * BLOCK, 3 * BLOCK).await.expect("read");
    let want: Vec<u8> = (15..18).flat_map(|b| block(b, noise)).collect();
    assert!(got == want, "{what}: blocks 15-17");
}

/// Write `blocks` blocks (all text or all noise), let them reach the store, read them
/// back three ways; returns the data objects' bytes in the store.
async fn write_and_read_back(compression: Compression, noise: bool, blocks: u64) -> u64 {
    let mem = Arc::new(MemStore::new());
    let store: DynStore = mem.clone();
    let dir = TempDir::new("engine-compression");
    // Uploads admitted to the read cache (as on a remote store): what is admitted must
    // be the data as written, not the chunks as stored.
    let cached = EngineConfig {
        batch_size_bytes: 1 << 20,
        read_cache_bytes: 8 << 20,
        read_cache_admit: crate::config::Admission::Always,
        ..config(Some(compression))
    };
    let (volume, _) = create_and_open(&store, "v", blocks * BLOCK, dir.path(), cached).await;
    write_blocks(&volume, 0..blocks, noise).await;
    // Twice (the log was drained, so neither read comes from the write log): the
    // admitted chunks, then the cache again.
    let what = format!("{compression}");
    read_blocks(&volume, 0..blocks, noise, &format!("{what} from the store")).await;
    read_blocks(&volume, 0..blocks, noise, &format!("{what} from the cache")).await;
    volume.shutdown().await.expect("shutdown");
    let dir2 = TempDir::new("engine-compression-reopen");
    let (volume, _) = crate::open_volume(store, "v", dir2.path(), config(Some(compression)))
        .await
        .expect("reopen");
    read_blocks(&volume, 0..blocks, noise, &format!("{what} reopened")).await;
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
            "{compression}: {stored} bytes for {raw} raw"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incompressible_data_costs_almost_nothing_more_than_raw() {
    let blocks = 512;
    let raw = write_and_read_back(Compression::None, true, blocks).await;
    for compression in [Compression::Lz4, Compression::Zstd(3)] {
        let stored = write_and_read_back(compression, true, blocks).await;
        let limit = raw as f64 * 1.02;
        assert!(
            stored as f64 <= limit,
            "{compression}: {stored} bytes for {raw} raw"
        );
    }
}

/// Write 64 text blocks from `first` to volume "v" of `mem` opened with `config`,
/// and shut down; returns the data objects' bytes this added to the store (nothing is
/// overwritten, so nothing is collected meanwhile).
async fn write_text_blocks(mem: &Arc<MemStore>, config: EngineConfig, first: u64) -> u64 {
    let before = data_object_bytes(mem);
    let dir = TempDir::new("settings");
    let store: DynStore = mem.clone();
    let (volume, _) = crate::open_volume(store, "v", dir.path(), config)
        .await
        .expect("open");
    write_blocks(&volume, first..first + 64, false).await;
    volume.shutdown().await.expect("shutdown");
    data_object_bytes(mem) - before
}

/// A memory store holding volume "v" of 1 MiB (256 blocks), and its metadata.
async fn store_with_volume() -> (
    Arc<MemStore>,
    DynStore,
    lsvd_core::format::volume_meta::VolumeMeta,
) {
    let mem = Arc::new(MemStore::new());
    let store: DynStore = mem.clone();
    let meta = crate::create_volume(&store, "v", 256 * BLOCK).await;
    (mem, store, meta.expect("create"))
}

/// A volume written raw, then served compressed: both kinds of object read back, and
/// the new objects are the compressed kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_and_compressed_objects_mix_in_one_volume() {
    let (mem, store, _) = store_with_volume().await;
    let raw = write_text_blocks(&mem, config(Some(Compression::None)), 0).await;
    let compressed = write_text_blocks(&mem, config(Some(Compression::Lz4)), 64).await;
    assert!(compressed * 4 < raw, "{compressed} compressed vs {raw} raw");
    let dir = TempDir::new("engine-compression-mix");
    let (volume, _) = crate::open_volume(store, "v", dir.path(), config(None))
        .await
        .expect("reopen");
    read_blocks(&volume, 0..128, false, "raw and lz4 objects").await;
    volume.shutdown().await.expect("shutdown");
}

/// Without `compression` in its config, a volume compresses as its settings in the
/// store say; `Some` in the config wins over them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_volume_settings_choose_the_compression_unless_the_config_does() {
    let (mem, store, meta) = store_with_volume().await;
    assert_eq!(
        crate::read_settings(&store, &meta).await.expect("read"),
        None
    );
    let raw = write_text_blocks(&mem, config(None), 0).await;
    assert!(raw >= 64 * BLOCK, "no settings: raw ({raw})");
    let set = crate::set_compression(&store, &meta, Compression::Zstd(5))
        .await
        .expect("set");
    let read = crate::read_settings(&store, &meta).await.expect("read");
    assert_eq!(read, Some(set));
    let compressed = write_text_blocks(&mem, config(None), 64).await;
    assert!(
        compressed * 4 < raw,
        "settings say zstd: {compressed} vs {raw}"
    );
    let forced = write_text_blocks(&mem, config(Some(Compression::None)), 128).await;
    assert!(forced >= 64 * BLOCK, "the config says none: {forced}");
}

/// Settings that fail their checks, or that belong to another volume of the same
/// name, stop the open naming the key; nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_refuse_the_open() {
    use lsvd_core::format::volume_settings::{VolumeSettings, encode_volume_settings};
    let (mem, store, meta) = store_with_volume().await;
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
        let put = store.put("v/settings", bytes.into(), lsvd_store::PutMode::Overwrite);
        put.await.expect("put");
        let dir = TempDir::new("settings-bad");
        let opened = crate::open_volume(store.clone(), "v", dir.path(), config(None)).await;
        let err = opened.map(drop).expect_err(what);
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
    let (source_mem, target_mem) = (Arc::new(MemStore::new()), Arc::new(MemStore::new()));
    let (source, target): (DynStore, DynStore) = (source_mem.clone(), target_mem.clone());
    let dir = TempDir::new("compression-replicate");
    // Compressed as the volume's settings say: the replica gets them too.
    let meta = crate::create_volume(&source, "v", 256 * BLOCK).await;
    let meta = meta.expect("create");
    let settings = crate::set_compression(&source, &meta, Compression::Zstd(3)).await;
    let settings = settings.expect("set");
    let zstd = EngineConfig {
        checkpoint_every_objects: 2,
        ..config(None)
    };
    let opened = crate::open_volume(source.clone(), "v", dir.path(), zstd.clone()).await;
    let (volume, _) = opened.expect("open");
    write_blocks(&volume, 0..256, false).await;
    volume.shutdown().await.expect("shutdown");
    let options = crate::ReplicateOptions::default();
    let progress = crate::ReplicateProgress::default();
    let pass = crate::replicate_once(&source, &target, "v", &options, &progress).await;
    pass.expect("replicate");
    assert_eq!(
        data_object_bytes(&target_mem),
        data_object_bytes(&source_mem)
    );
    assert!(
        data_object_bytes(&source_mem) * 4 < 256 * BLOCK,
        "compressed"
    );
    let replica_meta = crate::read_meta(&target, "v").await.expect("replica meta");
    let replica_settings = crate::read_settings(&target, &replica_meta).await;
    assert_eq!(replica_settings.expect("read"), Some(settings));
    let dir2 = TempDir::new("compression-replica");
    let (replica, _) = crate::open_volume(target, "v", dir2.path(), zstd)
        .await
        .expect("open the replica");
    read_blocks(&replica, 0..256, false, "the replica").await;
    replica.shutdown().await.expect("shutdown");
}
