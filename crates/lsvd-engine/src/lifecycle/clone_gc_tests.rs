//! What clones cost in the store once GC has run everywhere: a clone's GC never
//! copies the data its base owns (`Pipeline::set_shared_below`), so N clones of one
//! snapshot hold the base once plus each clone's own writes; and the base's GC keeps
//! what the clones still read (the snapshot pins it).

use std::sync::Arc;

use crate::test_support::{block_data, create_and_open, verify_runs, wait_until};
use crate::{EngineConfig, Volume, create_clone, open_volume};
use lsvd_core::error::ErrorKind;
use lsvd_store::DynStore;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

const BLOCK: u64 = 4096;

/// Small batches, a small log, eager GC (it starts as soon as 5% of what a volume
/// stores is dead): the space figure after GC is what GC leaves at its tightest.
fn config() -> EngineConfig {
    EngineConfig {
        batch_size_bytes: 512 << 10,
        batch_timeout_ms: 20,
        log_size_bytes: 16 << 20,
        checkpoint_every_objects: 64,
        read_cache_bytes: 0,
        compression: Some(lsvd_core::compression::Compression::None),
        gc: lsvd_core::gc::GcConfig {
            start_utilization: 0.95,
            stop_utilization: 0.98,
            pass_bytes: 2 << 20,
            ..Default::default()
        },
        ..EngineConfig::default()
    }
}

/// Writes blocks `first..first + versions.len()` at the given versions, in one write.
async fn write_blocks(volume: &Volume, first: u64, versions: &[u64]) {
    let mut data = Vec::with_capacity(versions.len() * BLOCK as usize);
    for (i, &v) in versions.iter().enumerate() {
        data.extend_from_slice(&block_data(first + i as u64, v));
    }
    volume
        .write(first * BLOCK, data, false)
        .await
        .unwrap_or_else(|e| panic!("write at block {first}: {e}"));
}

/// Waits until no volume has uploads pending or a GC pass in flight, and none has
/// started a pass for 250 polls in a row (2.5 s: GC looks at least once a second).
async fn gc_quiescent(volumes: &[&Volume]) {
    let mut last: Vec<u64> = vec![u64::MAX; volumes.len()];
    let mut quiet_polls = 0u32;
    wait_until("GC to quiesce in every volume", async || {
        let mut quiet = true;
        for (v, last) in volumes.iter().zip(last.iter_mut()) {
            let s = v.status();
            quiet &= s.uploads_pending == 0 && !s.gc_pass_in_flight && *last == s.gc_passes;
            *last = s.gc_passes;
        }
        quiet_polls = if quiet { quiet_polls + 1 } else { 0 };
        quiet_polls >= 250
    })
    .await;
}

/// Bytes of data and GC objects under `volume`'s prefix in `store`.
fn object_bytes(store: &MemStore, volume: &str) -> u64 {
    let prefix = format!("{volume}/obj/");
    store
        .snapshot()
        .into_iter()
        .filter(|(k, _)| k.starts_with(&prefix) && (k.ends_with(".d") || k.ends_with(".g")))
        .map(|(_, bytes)| bytes)
        .sum()
}

const BASE_BLOCKS: u64 = (256 << 20) / BLOCK;
const CLONES: u64 = 8;

/// Clone `i` overwrites every other block of its own tenth of the volume: 5% of the
/// blocks, half of the data of each base object there.
fn clone_blocks(i: u64) -> impl Iterator<Item = u64> {
    let tenth = BASE_BLOCKS / 10;
    (i * tenth..(i + 1) * tenth).step_by(2)
}

/// A 256 MiB base, 8 clones of one snapshot of it, each overwriting 5% of its blocks
/// twice; after GC has run to quiescence in every volume, the store holds the base
/// once and each clone's own writes once (within 10%), and every volume reads back
/// what was written, live and reopened from the store alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_of_one_snapshot_share_its_data_after_gc() {
    let mem = Arc::new(MemStore::new());
    let store: DynStore = mem.clone();
    let base_dir = TempDir::new("engine-clonegc-base");
    let (base, _) = create_and_open(
        &store,
        "base",
        BASE_BLOCKS * BLOCK,
        base_dir.path(),
        config(),
    )
    .await;
    let base_model = vec![1u64; BASE_BLOCKS as usize];
    for first in (0..BASE_BLOCKS).step_by(256) {
        write_blocks(
            &base,
            first,
            &base_model[first as usize..first as usize + 256],
        )
        .await;
    }
    base.sync_to_store().await.expect("sync base");
    base.create_snapshot("s").await.expect("snapshot");

    let mut clones = Vec::new();
    let mut models = Vec::new();
    let mut own_bytes = 0u64;
    for i in 0..CLONES {
        let name = format!("c{i}");
        create_clone(&store, "base", "s", &name)
            .await
            .expect("clone");
        let dir = TempDir::new(&format!("engine-clonegc-{name}"));
        let (c, _) = open_volume(store.clone(), &name, dir.path(), config())
            .await
            .unwrap_or_else(|e| panic!("open {name}: {e}"));
        let mut model = base_model.clone();
        // Twice: the first generation dies in the clone's own objects, which its GC
        // then has to clean.
        for generation in [2, 3] {
            let version = 10 * (i + 1) + generation;
            for b in clone_blocks(i) {
                write_blocks(&c, b, &[version]).await;
                model[b as usize] = version;
            }
        }
        own_bytes += clone_blocks(i).count() as u64 * BLOCK;
        c.sync_to_store().await.expect("sync clone");
        clones.push((name, c, dir));
        models.push(model);
    }

    // Deleting the snapshot the clones depend on is refused, naming them.
    let e = base.delete_snapshot("s").await.expect_err("refused");
    assert_eq!(e.kind, ErrorKind::Conflict, "{e}");
    for (name, _, _) in &clones {
        assert!(
            e.to_string().contains(&format!("{name} (from base@s)")),
            "{e}"
        );
    }

    let mut all: Vec<&Volume> = clones.iter().map(|(_, c, _)| &**c).collect();
    all.push(&base);
    gc_quiescent(&all).await;
    for (i, (name, c, _)) in clones.iter().enumerate() {
        verify_runs(c, &models[i], &format!("{name} live")).await;
        // GC is done with its own objects (and weighs nothing else).
        let u = c.status().utilization;
        assert!(u >= 0.95, "{name}: utilization {u} after GC");
    }
    verify_runs(&base, &base_model, "base live").await;
    for (_, c, _) in &clones {
        c.shutdown().await.expect("shutdown clone");
    }
    base.shutdown().await.expect("shutdown base");

    let base_bytes = BASE_BLOCKS * BLOCK;
    let stored: u64 = std::iter::once("base".to_string())
        .chain(clones.iter().map(|(n, _, _)| n.clone()))
        .map(|n| object_bytes(&mem, &n))
        .sum();
    let written = base_bytes + own_bytes;
    let ratio = stored as f64 / written as f64;
    eprintln!(
        "clone space: {stored} bytes stored for {written} bytes of base and clones' own data \
         (ratio {ratio:.3}); base objects {}, clone objects {:?}",
        object_bytes(&mem, "base"),
        clones
            .iter()
            .map(|(n, _, _)| object_bytes(&mem, n))
            .collect::<Vec<_>>()
    );
    assert!(
        stored <= written + written / 10,
        "the store holds {stored} bytes for {written} bytes of base and clones' own data \
         (ratio {ratio:.3}): clones copied their base's data"
    );

    // `lsvd info` weighs what GC weighs.
    for (name, _, _) in &clones {
        let info = crate::inspect_volume(&store, name).await.expect("info");
        assert!(info.utilization >= 0.95, "{name}: {info:?}");
    }

    // Every volume again, from the store alone.
    drop(all);
    let clones: Vec<String> = clones.into_iter().map(|(n, _, _)| n).collect();
    for (i, name) in clones.iter().enumerate() {
        let dir = TempDir::new(&format!("engine-clonegc-{name}-again"));
        let (c, _) = open_volume(store.clone(), name, dir.path(), config())
            .await
            .unwrap_or_else(|e| panic!("reopen {name}: {e}"));
        verify_runs(&c, &models[i], &format!("{name} reopened")).await;
        c.shutdown().await.expect("shutdown");
    }
    let dir = TempDir::new("engine-clonegc-base-again");
    let (base, _) = open_volume(store.clone(), "base", dir.path(), config())
        .await
        .expect("reopen base");
    verify_runs(&base, &base_model, "base reopened").await;
    base.shutdown().await.expect("shutdown");
}

/// The base's GC after a snapshot that clones were made from: it compacts the base's
/// objects (half of every block overwritten), and the clones, which still map the
/// snapshot's data in those objects, read it back, live and reopened from the store
/// alone, because the snapshot pins the objects GC emptied in the base's view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_base_gc_keeps_what_its_clones_read() {
    use crate::lifecycle::snapshot_tests::{BLOCKS, config, stamp, versions};
    let base_dir = TempDir::new("engine-clonegc-pinned-base");
    let (store, base) = super::clone_tests::base_with_snapshot(&base_dir).await;
    let mut clones = Vec::new();
    for name in ["c1", "c2"] {
        create_clone(&store, "base", "s", name)
            .await
            .expect("clone");
        let dir = TempDir::new(&format!("engine-clonegc-pinned-{name}"));
        let (c, _) = open_volume(store.clone(), name, dir.path(), config())
            .await
            .unwrap_or_else(|e| panic!("open {name}: {e}"));
        clones.push((name, c, dir));
    }
    // c1 writes block 0; the base overwrites its even blocks: every base object is
    // half dead in the base's view, and its GC copies the odd blocks out of them.
    clones[0]
        .1
        .write(0, stamp(0, 9), false)
        .await
        .expect("write");
    for b in (0..BLOCKS).step_by(2) {
        base.write(b * BLOCK, stamp(b, 2), false)
            .await
            .expect("write");
    }
    base.sync_to_store().await.expect("sync base");
    wait_until("the base's GC to run", async || base.status().gc_passes > 0).await;
    let base_want: Vec<u64> = (0..BLOCKS).map(|b| 2 - b % 2).collect();
    let mut c1_want = vec![1; BLOCKS as usize];
    c1_want[0] = 9;
    let wants = [c1_want, vec![1; BLOCKS as usize]];
    let mut all: Vec<&Volume> = clones.iter().map(|(_, c, _)| &**c).collect();
    all.push(&base);
    gc_quiescent(&all).await;
    assert!(base.status().gc_moved_bytes > 0, "{:?}", base.status());
    for ((name, c, _), want) in clones.iter().zip(&wants) {
        assert_eq!(&versions(c).await, want, "{name} live");
        assert_eq!(
            c.status().gc_moved_bytes,
            0,
            "{name} copied its base's data"
        );
    }
    assert_eq!(versions(&base).await, base_want, "base live");
    drop(all);
    for (name, c, _) in &clones {
        c.shutdown()
            .await
            .unwrap_or_else(|e| panic!("shutdown {name}: {e}"));
    }
    base.shutdown().await.expect("shutdown base");
    for ((name, _, _), want) in clones.iter().zip(&wants) {
        let dir = TempDir::new(&format!("engine-clonegc-pinned-{name}-again"));
        let (c, _) = open_volume(store.clone(), name, dir.path(), config())
            .await
            .unwrap_or_else(|e| panic!("reopen {name}: {e}"));
        assert_eq!(&versions(&c).await, want, "{name} reopened");
        c.shutdown().await.expect("shutdown");
    }
    let dir = TempDir::new("engine-clonegc-pinned-base-again");
    let (base, _) = open_volume(store.clone(), "base", dir.path(), config())
        .await
        .expect("reopen base");
    assert_eq!(versions(&base).await, base_want, "base reopened");
    let e = base.delete_snapshot("s").await.expect_err("refused");
    assert!(
        e.to_string().contains("c1 (from base@s), c2 (from base@s)"),
        "{e}"
    );
    base.shutdown().await.expect("shutdown");
}
