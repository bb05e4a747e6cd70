//! Snapshots (`Volume::create_snapshot`, `open_snapshot`, `Volume::delete_snapshot`):
//! a snapshot taken while writes are in flight reads back the volume as of its point,
//! through two whole overwrites with GC running and a restart; deleting it frees what
//! only it kept.

use std::sync::Arc;

use crate::test_support::{create_and_open, open_v};
use crate::{EngineConfig, Volume, create_volume, open_snapshot, open_volume};
use lsvd_core::error::ErrorKind;
use lsvd_store::DynStore;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

pub(crate) const BLOCK: u64 = 4096;
pub(crate) const BLOCKS: u64 = 1024; // 4 MiB

pub(crate) fn config() -> EngineConfig {
    EngineConfig {
        batch_size_bytes: 128 << 10,
        batch_timeout_ms: 20,
        log_size_bytes: 16 << 20,
        checkpoint_every_objects: 4,
        read_cache_bytes: 0,
        gc: lsvd_core::gc::GcConfig {
            pass_bytes: 1 << 20,
            ..Default::default()
        },
        ..EngineConfig::default()
    }
}

/// A block stamped with (block, version), as the crash oracle stamps them.
pub(crate) fn stamp(block: u64, version: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK as usize];
    for chunk in v.chunks_mut(16) {
        chunk[..8].copy_from_slice(&block.to_le_bytes());
        chunk[8..16].copy_from_slice(&version.to_le_bytes());
    }
    v
}

/// The version every block holds (0: never written), checking each block is whole and
/// its own.
pub(crate) async fn versions(volume: &Volume) -> Vec<u64> {
    let mut out = Vec::new();
    for first in (0..BLOCKS).step_by(64) {
        let bytes = volume.read(first * BLOCK, 64 * BLOCK).await.expect("read");
        for (i, block) in bytes.chunks(BLOCK as usize).enumerate() {
            let b = first + i as u64;
            if block.iter().all(|&x| x == 0) {
                out.push(0);
                continue;
            }
            let version = u64::from_le_bytes(block[8..16].try_into().expect("8 bytes"));
            assert_eq!(block, stamp(b, version).as_slice(), "block {b} is torn");
            out.push(version);
        }
    }
    out
}

pub(crate) async fn write_all(volume: &Volume, version: u64) {
    for b in 0..BLOCKS {
        volume
            .write(b * BLOCK, stamp(b, version), false)
            .await
            .expect("write");
    }
}

/// Volume "v" in a new memory store (returned) with its files in a new directory
/// named by `tag` (returned), every block at version 1.
pub(crate) async fn written_volume(tag: &str) -> (DynStore, TempDir, Arc<Volume>) {
    let store: DynStore = Arc::new(MemStore::new());
    let dir = TempDir::new(tag);
    let (vol, _) = create_and_open(&store, "v", BLOCKS * BLOCK, dir.path(), config()).await;
    write_all(&vol, 1).await;
    (store, dir, vol)
}

/// A new volume in a memory store (returned first), opened through a store that
/// fails on command over it (seed `seed`), every block at version 1 and in the store:
/// for tests that stop an operation at each store mutation.
pub(crate) async fn written_over_faults(
    seed: u64,
    dir: &TempDir,
) -> (DynStore, Arc<lsvd_store::faulty::FaultyStore>, Arc<Volume>) {
    use lsvd_store::faulty::{FaultPlan, FaultyStore};
    let mem: DynStore = Arc::new(MemStore::new());
    create_volume(&mem, "v", BLOCKS * BLOCK)
        .await
        .expect("create");
    let faulty = Arc::new(FaultyStore::new(mem.clone(), FaultPlan::default(), seed));
    let (vol, _) = open_volume(faulty.clone(), "v", dir.path(), config())
        .await
        .expect("open");
    write_all(&vol, 1).await;
    vol.sync_to_store().await.expect("sync");
    (mem, faulty, vol)
}

pub(crate) fn assert_kind<T>(r: lsvd_core::error::Result<T>, kind: ErrorKind) {
    match r {
        Ok(_) => panic!("expected a {kind:?} error, got success"),
        Err(e) => assert_eq!(e.kind, kind, "{e}"),
    }
}

/// The objects of volume "v" in `store`.
async fn objects(store: &DynStore) -> Vec<lsvd_store::ListEntry> {
    store
        .list(&crate::keys::objects_prefix("v"))
        .await
        .expect("list")
}

async fn object_count(store: &DynStore) -> usize {
    objects(store).await.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_keeps_its_point_through_gc_and_restarts_and_its_delete_frees_space() {
    let (store, dir, vol) = written_volume("engine-snapshot").await;
    // Version 2 of every other block is acknowledged before the snapshot; version 3
    // of every block is being written while it is taken.
    for b in (0..BLOCKS).step_by(2) {
        vol.write(b * BLOCK, stamp(b, 2), false)
            .await
            .expect("write");
    }
    let acknowledged: Vec<u64> = (0..BLOCKS)
        .map(|b| if b % 2 == 0 { 2 } else { 1 })
        .collect();
    let writer = {
        let vol = vol.clone();
        tokio::spawn(async move { write_all(&vol, 3).await })
    };
    let record = vol.create_snapshot("before").await.expect("snapshot");
    writer.await.expect("writer");
    assert!(record.through_seq > 1, "{record:?}");

    let (snap, _) = open_snapshot(store.clone(), "v", "before", dir.path(), config())
        .await
        .expect("open the snapshot");
    let at_snapshot = versions(&snap).await;
    for (b, (&got, &acked)) in at_snapshot.iter().zip(&acknowledged).enumerate() {
        assert!(
            got == acked || got == 3,
            "block {b}: the snapshot holds version {got}, acknowledged before it was {acked}"
        );
    }
    assert_kind(snap.write(0, stamp(0, 9), false).await, ErrorKind::ReadOnly);
    assert_kind(
        snap.write_zeroes(0, BLOCK, false).await,
        ErrorKind::ReadOnly,
    );
    assert_kind(snap.create_snapshot("x").await, ErrorKind::ReadOnly);
    snap.shutdown().await.expect("snapshot shutdown");

    // Overwrite everything twice with GC running: GC rewrites the live data and
    // deletes its victims, except what the snapshot keeps.
    write_all(&vol, 4).await;
    write_all(&vol, 5).await;
    vol.sync_to_store().await.expect("sync");
    assert!(
        vol.status().gc_passes > 0,
        "GC never ran: {:?}",
        vol.status()
    );
    assert_eq!(versions(&vol).await, vec![5; BLOCKS as usize]);
    let (snap, _) = open_snapshot(store.clone(), "v", "before", dir.path(), config())
        .await
        .expect("open the snapshot after GC");
    assert_eq!(versions(&snap).await, at_snapshot, "after GC");
    snap.shutdown().await.expect("snapshot shutdown");

    // A restart settles garbage without touching what the snapshot keeps.
    vol.shutdown().await.expect("shutdown");
    drop(vol);
    let (vol, _) = open_v(&store, dir.path(), config(), "reopen").await;
    let (snap, _) = open_snapshot(store.clone(), "v", "before", dir.path(), config())
        .await
        .expect("open the snapshot after a restart");
    assert_eq!(versions(&snap).await, at_snapshot, "after a restart");
    snap.shutdown().await.expect("snapshot shutdown");

    let before_delete = object_count(&store).await;
    let freed = vol
        .delete_snapshot("before")
        .await
        .expect("delete snapshot");
    assert!(freed > 0, "deleting the snapshot freed nothing");
    assert_eq!(object_count(&store).await, before_delete - freed as usize);
    assert_kind(
        open_snapshot(store.clone(), "v", "before", dir.path(), config()).await,
        ErrorKind::NotFound,
    );
    assert_eq!(versions(&vol).await, vec![5; BLOCKS as usize]);
    vol.shutdown().await.expect("shutdown");
    let (vol, _) = open_v(&store, dir.path(), config(), "reopen after the delete").await;
    assert_eq!(versions(&vol).await, vec![5; BLOCKS as usize]);
    vol.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_names_are_checked_and_taken_once() {
    let store: DynStore = Arc::new(MemStore::new());
    let dir = TempDir::new("engine-snapshot-names");
    let (vol, _) = create_and_open(&store, "v", BLOCKS * BLOCK, dir.path(), config()).await;
    // A snapshot of a volume nobody wrote: reads zeros.
    vol.create_snapshot("empty").await.expect("snapshot");
    assert_kind(vol.create_snapshot("empty").await, ErrorKind::AlreadyExists);
    assert_kind(vol.create_snapshot("a/b").await, ErrorKind::BadInput);
    assert_kind(vol.create_snapshot("").await, ErrorKind::BadInput);
    assert_kind(vol.delete_snapshot("nope").await, ErrorKind::NotFound);
    let missing = open_snapshot(store.clone(), "v", "nope", dir.path(), config()).await;
    let e = missing.err().expect("no such snapshot");
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(e.to_string().contains("empty"), "{e}");
    let (snap, _) = open_snapshot(store.clone(), "v", "empty", dir.path(), config())
        .await
        .expect("open");
    assert_eq!(versions(&snap).await, vec![0; BLOCKS as usize]);
    snap.shutdown().await.expect("shutdown");
    let listed = crate::list_snapshots(&store, &crate::read_meta(&store, "v").await.expect("meta"))
        .await
        .expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "empty");
    vol.shutdown().await.expect("shutdown");
    // Deleting the volume takes its snapshot records with it (SEMANTICS, "Deleting a
    // volume").
    let plan = crate::plan_delete(&store, "v").await.expect("plan");
    crate::delete_volume(&store, &plan, &|_, _| {})
        .await
        .expect("delete");
    let left = store
        .list(&crate::keys::snapshots_prefix("v"))
        .await
        .expect("list");
    assert!(left.is_empty(), "{left:?}");
}

/// A store layer whose PUTs of snapshot records land but report a failure that is
/// not retried.
struct LostSnapshotReplies;

impl lsvd_store::layer::Layer for LostSnapshotReplies {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: lsvd_store::layer::Call,
        mut next: lsvd_store::layer::Next<'a, T>,
    ) -> lsvd_store::BoxFuture<'a, lsvd_store::StoreResult<T>> {
        let lost = match call {
            lsvd_store::layer::Call::Put { key, .. } if key.contains("/snap/") => Some(key),
            _ => None,
        };
        Box::pin(async move {
            let answer = next().await?;
            match lost {
                Some(key) => Err(lsvd_core::error::Error::new(
                    ErrorKind::Permanent,
                    format!("injected lost reply putting {key}"),
                )),
                None => Ok(answer),
            }
        })
    }

    fn describe(&self, _inner: String) -> String {
        "lost snapshot replies".into()
    }
}

/// A snapshot record whose PUT landed but reported failure is a snapshot: the
/// command failed, yet the objects the record needs must stay. Before the fix the pin
/// was added only after a successful PUT, and the deferred deletes after the next
/// checkpoints removed the snapshot's objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_record_that_landed_despite_an_error_keeps_its_objects() {
    let mem: DynStore = Arc::new(MemStore::new());
    create_volume(&mem, "v", BLOCKS * BLOCK)
        .await
        .expect("create");
    let store: DynStore = Arc::new(lsvd_store::layer::Layered::wrap(
        mem.clone(),
        LostSnapshotReplies,
    ));
    let dir = TempDir::new("engine-snapshot-lost-reply");
    let (vol, _) = open_volume(store, "v", dir.path(), config())
        .await
        .expect("open");
    write_all(&vol, 1).await;
    assert_kind(vol.create_snapshot("s").await, ErrorKind::Permanent);
    // Whole overwrites: every object the snapshot needs becomes dead and is deleted
    // after the next checkpoints, unless something keeps it.
    for version in 2..=4 {
        write_all(&vol, version).await;
    }
    vol.sync_to_store().await.expect("sync");
    let deleted = || {
        vol.stats()
            .objects_deleted
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    write_all(&vol, 5).await;
    vol.sync_to_store().await.expect("sync");
    assert!(deleted() > 0, "nothing was deleted: {:?}", vol.status());
    let (snap, _) = open_snapshot(mem.clone(), "v", "s", dir.path(), config())
        .await
        .expect("the record landed: the snapshot exists");
    assert_eq!(versions(&snap).await, vec![1; BLOCKS as usize]);
    snap.shutdown().await.expect("shutdown");
    vol.shutdown().await.expect("shutdown");

    // A snapshot whose base checkpoint the store lost is unreadable, but the volume
    // still opens (with a warning naming the command that removes it).
    let meta = crate::read_meta(&mem, "v").await.expect("meta");
    let record = crate::read_snapshot(&mem, &meta, "s")
        .await
        .expect("record");
    let base = record.base_checkpoint.expect("a base checkpoint");
    mem.delete(&crate::keys::object_key(
        "v",
        base,
        record
            .history
            .epoch_of(base)
            .expect("the record's history names it"),
        lsvd_core::format::object::ObjectKind::Checkpoint,
    ))
    .await
    .expect("delete the base");
    let what = "the volume opens without its snapshot's base";
    let (vol, _) = open_v(&mem, dir.path(), config(), what).await;
    assert_eq!(versions(&vol).await, vec![5; BLOCKS as usize]);
    assert!(
        open_snapshot(mem.clone(), "v", "s", dir.path(), config())
            .await
            .is_err()
    );
    assert!(vol.delete_snapshot("s").await.is_ok());
    vol.shutdown().await.expect("shutdown");
}

/// After a crash, a snapshot is whole (it reads back what it was taken with) or
/// absent; the volume reads what it held either way. `delete`: stop a snapshot delete
/// at every store mutation (else stop its creation).
async fn stopped_at_every_mutation(delete: bool) {
    let mut finished = false;
    for n in 0..64u64 {
        let dir = TempDir::new("engine-snapshot-stopped");
        let (mem, faulty, vol) = written_over_faults(n, &dir).await;
        if delete {
            vol.create_snapshot("s").await.expect("snapshot");
            // The snapshot now keeps objects nothing else needs.
            write_all(&vol, 2).await;
            write_all(&vol, 3).await;
            vol.sync_to_store().await.expect("sync");
        }
        faulty.kill_after_mutations(n);
        let result = if delete {
            vol.delete_snapshot("s").await.map(|_| ())
        } else {
            vol.create_snapshot("s").await.map(|_| ())
        };
        finished = result.is_ok() && !faulty.is_killed();
        vol.crash();
        drop(vol);
        let (vol, _) = open_v(&mem, dir.path(), config(), "reopen").await;
        // More overwrites: whatever the snapshot keeps must survive GC from here on.
        write_all(&vol, 4).await;
        write_all(&vol, 5).await;
        vol.sync_to_store().await.expect("sync");
        assert_eq!(versions(&vol).await, vec![5; BLOCKS as usize], "n={n}");
        let meta = crate::read_meta(&mem, "v").await.expect("meta");
        match crate::read_snapshot(&mem, &meta, "s").await {
            Err(e) => assert_eq!(e.kind, ErrorKind::NotFound, "n={n}: {e}"),
            Ok(_) => {
                assert!(!(delete && finished), "n={n}: deleted, yet still there");
                let other = TempDir::new("engine-snapshot-stopped-read");
                let (snap, _) = open_snapshot(mem.clone(), "v", "s", other.path(), config())
                    .await
                    .unwrap_or_else(|e| panic!("n={n}: the snapshot exists but is not whole: {e}"));
                assert_eq!(versions(&snap).await, vec![1; BLOCKS as usize], "n={n}");
                snap.shutdown().await.expect("shutdown");
            }
        }
        vol.shutdown().await.expect("shutdown");
        if finished {
            break;
        }
    }
    assert!(finished, "the operation never finished within 64 mutations");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_creation_stopped_at_any_store_mutation_leaves_it_whole_or_absent() {
    stopped_at_every_mutation(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_delete_stopped_at_any_store_mutation_leaves_it_whole_or_absent() {
    stopped_at_every_mutation(true).await;
}

/// Bytes of data, GC and checkpoint objects volume "v" has in the store.
async fn object_bytes(store: &DynStore) -> u64 {
    objects(store).await.iter().map(|e| e.size_bytes).sum()
}

/// Write 1..=4 to every block (the last three in a shuffled order), with a snapshot
/// after the first if `snapshot`; stop cleanly and open again (deletes settle), and
/// return the store's object bytes. Deletes the snapshot at the end and returns the
/// bytes after that too.
async fn bytes_after_three_overwrites(snapshot: bool) -> (u64, u64) {
    let (store, dir, vol) = written_volume("engine-snapshot-space").await;
    if snapshot {
        vol.create_snapshot("s").await.expect("snapshot");
    }
    let mut order: Vec<u64> = (0..BLOCKS).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for version in 2..=4 {
        for i in (1..order.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        for &b in &order {
            vol.write(b * BLOCK, stamp(b, version), false)
                .await
                .expect("write");
        }
    }
    vol.shutdown().await.expect("shutdown");
    drop(vol);
    let (vol, _) = open_v(&store, dir.path(), config(), "reopen").await;
    assert_eq!(versions(&vol).await, vec![4; BLOCKS as usize]);
    let with = object_bytes(&store).await;
    if snapshot {
        vol.delete_snapshot("s").await.expect("delete snapshot");
    }
    vol.shutdown().await.expect("shutdown");
    (with, object_bytes(&store).await)
}

/// A snapshot costs about its own data in the store, over what the volume alone uses
/// under the same overwrites; deleting it gives that back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_costs_its_data_and_its_delete_gives_it_back() {
    let (alone, _) = bytes_after_three_overwrites(false).await;
    let (with, after_delete) = bytes_after_three_overwrites(true).await;
    let snapshot_data = BLOCKS * BLOCK;
    eprintln!(
        "object bytes: volume alone {alone}, with a snapshot {with}, after its delete {after_delete}"
    );
    let slack = 1 << 20; // a few batches and checkpoints of difference
    assert!(
        with >= alone + snapshot_data - slack
            && with <= alone + snapshot_data + snapshot_data / 10 + slack,
        "volume alone {alone} bytes, with a snapshot of {snapshot_data} bytes {with}"
    );
    assert!(
        after_delete <= alone + alone / 10 + slack,
        "volume alone {alone} bytes, after deleting the snapshot {after_delete}"
    );
}
