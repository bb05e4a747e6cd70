//! Replication (`replicate_once`): a replica serves the source's bytes and snapshots;
//! stopped at any point it is a prefix of the source's history and resumes without
//! copying again; passes under writes and GC stay prefixes; what it refuses.

use std::sync::Arc;

use bytes::Bytes;

use super::snapshot_tests::{BLOCK, BLOCKS, assert_kind, config, stamp, versions};
use super::{
    ReplicateOptions, ReplicateProgress, Volume, create_volume, open_snapshot, open_volume,
    replicate_once,
};
use crate::error::ErrorKind;
use crate::store::mem::MemStore;
use crate::store::{DynStore, PutMode};
use crate::testutil::TempDir;

async fn replicate(
    source: &DynStore,
    target: &DynStore,
) -> crate::error::Result<super::PassReport> {
    replicate_once(
        source,
        target,
        "v",
        &ReplicateOptions::default(),
        &ReplicateProgress::default(),
    )
    .await
}

/// A memory store of its own name (replication tells replicas apart by description).
fn mem(name: &str) -> DynStore {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Arc::new(MemStore::named(&format!("{name}-{n}")))
}

/// A copy of every key of `store`, to open without disturbing it.
async fn copy_of(store: &DynStore) -> DynStore {
    let copy = mem("copy");
    for entry in store.list("").await.expect("list") {
        let bytes = store.get(&entry.key).await.expect("get");
        copy.put(&entry.key, Bytes::from(bytes), PutMode::Overwrite)
            .await
            .expect("put");
    }
    copy
}

/// The block versions a replica serves (opened from a copy), or None when it is not a
/// volume yet.
async fn replica_versions(target: &DynStore, name: &str) -> Option<Vec<u64>> {
    let copy = copy_of(target).await;
    if let Err(e) = super::read_meta(&copy, name).await {
        assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
        return None;
    }
    let dir = TempDir::new("engine-replica-open");
    let (vol, _) = open_volume(copy, name, dir.path(), config())
        .await
        .expect("the replica opens");
    let got = versions(&vol).await;
    vol.shutdown().await.expect("shutdown");
    Some(got)
}

/// The block round `round` writes `i`-th: a different stride each round, so every
/// round leaves the previous round's objects partly live and GC has work.
fn block_of(round: u64, i: u64) -> u64 {
    (i * (2 * round + 1) * 37 + round * 101) % BLOCKS
}

/// Round `round`: every block once, in [`block_of`] order, one write at a time.
async fn write_round(volume: &Volume, round: u64) {
    for i in 0..BLOCKS {
        let b = block_of(round, i);
        volume
            .write(b * BLOCK, stamp(b, round), false)
            .await
            .expect("write");
    }
}

/// What a prefix of rounds written by [`write_round`] can show: the newest round `a`
/// on the first blocks of its order, round `a - 1` (0: never written) on the rest.
fn assert_prefix_shape(got: &[u64], what: &str) {
    let a = got.iter().copied().max().unwrap_or(0);
    let newest = got.iter().filter(|&&v| v == a).count() as u64;
    let prefix = (0..BLOCKS).all(|i| {
        let v = got[block_of(a, i) as usize];
        if i < newest { v == a } else { v + 1 == a }
    });
    assert!(
        prefix,
        "{what}: not a prefix of the source's history: {:?}",
        compress(got)
    );
}

/// Runs of equal values, for messages.
fn compress(v: &[u64]) -> Vec<(u64, usize)> {
    let mut out: Vec<(u64, usize)> = Vec::new();
    for &x in v {
        match out.last_mut() {
            Some((y, n)) if *y == x => *n += 1,
            _ => out.push((x, 1)),
        }
    }
    out
}

async fn object_keys(store: &DynStore, name: &str) -> Vec<String> {
    store
        .list(&super::keys::objects_prefix(name))
        .await
        .expect("list")
        .into_iter()
        .map(|e| e.key)
        .collect()
}

/// A source volume "v" written in rounds 1..=3 with GC running, snapshot "s" after
/// round 1; returns it open.
async fn source_volume(store: &DynStore, dir: &TempDir) -> Arc<Volume> {
    create_volume(store, "v", BLOCKS * BLOCK)
        .await
        .expect("create");
    let (vol, _) = open_volume(store.clone(), "v", dir.path(), config())
        .await
        .expect("open");
    write_round(&vol, 1).await;
    vol.create_snapshot("s").await.expect("snapshot");
    write_round(&vol, 2).await;
    write_round(&vol, 3).await;
    vol.sync_to_store().await.expect("sync");
    vol
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_serves_the_source_and_its_snapshots_and_follows_gc() {
    let source = mem("source");
    let target = mem("target");
    let dir = TempDir::new("engine-replicate");
    let vol = source_volume(&source, &dir).await;
    assert!(
        vol.status().gc_passes > 0,
        "GC never ran: {:?}",
        vol.status()
    );

    let first = replicate(&source, &target).await.expect("replicate");
    assert!(first.objects_copied > 0, "{first:?}");
    assert!(first.generation.is_some(), "{first:?}");
    assert_eq!(first.snapshots_copied, 1, "{first:?}");
    assert_eq!(
        replica_versions(&target, "v").await,
        Some(vec![3; BLOCKS as usize])
    );
    let copy = copy_of(&target).await;
    let other = TempDir::new("engine-replicate-snap");
    let (snap, _) = open_snapshot(copy, "v", "s", other.path(), config())
        .await
        .expect("the replica has the snapshot");
    assert_eq!(versions(&snap).await, vec![1; BLOCKS as usize]);
    snap.shutdown().await.expect("shutdown");

    // A second pass copies only what the source wrote since (GC and checkpoints may
    // still be running), never again what the first copied.
    let again = replicate(&source, &target).await.expect("again");
    assert!(
        again.objects_copied <= again.source_next_seq - first.source_next_seq,
        "{first:?} then {again:?}"
    );

    // The source moves on: GC deletes objects, the snapshot goes.
    write_round(&vol, 4).await;
    vol.delete_snapshot("s").await.expect("delete snapshot");
    write_round(&vol, 5).await;
    vol.sync_to_store().await.expect("sync");
    let later = replicate(&source, &target).await.expect("follow");
    assert!(later.objects_copied > 0, "{later:?}");
    assert!(later.objects_deleted > 0, "{later:?}");
    assert_eq!(later.snapshots_deleted, 1, "{later:?}");
    assert_eq!(
        replica_versions(&target, "v").await,
        Some(vec![5; BLOCKS as usize])
    );
    // The replica holds nothing the source has deleted.
    let src_keys = object_keys(&source, "v").await;
    for key in object_keys(&target, "v").await {
        assert!(src_keys.contains(&key), "{key} stayed in the replica");
    }

    // Serving the replica makes it its own volume: replication stops there.
    let served = TempDir::new("engine-replica-served");
    let (replica, _) = open_volume(target.clone(), "v", served.path(), config())
        .await
        .expect("serve the replica");
    replica.write(0, stamp(0, 9), false).await.expect("write");
    replica.shutdown().await.expect("shutdown");
    vol.write(0, stamp(0, 6), false).await.expect("write");
    vol.shutdown().await.expect("shutdown");
    assert_kind(replicate(&source, &target).await, ErrorKind::Conflict);
    // Also once the source has moved past the replica's generations (and deleted the
    // ones replication copied).
    for round in 7..10 {
        let (vol, _) = open_volume(source.clone(), "v", dir.path(), config())
            .await
            .expect("reopen");
        vol.write(0, stamp(0, round), false).await.expect("write");
        vol.shutdown().await.expect("shutdown");
    }
    assert_kind(replicate(&source, &target).await, ErrorKind::Conflict);
}

/// Stop a pass at every store mutation of the target, the replica holding an older
/// state before it: the replica is a prefix between the two states, its snapshot whole
/// or absent; a second run finishes without copying again what the first copied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_stopped_at_any_point_is_a_prefix_and_resumes() {
    use crate::store::faulty::{FaultPlan, FaultyStore};
    let source = mem("source");
    let dir = TempDir::new("engine-replicate-stopped");
    create_volume(&source, "v", BLOCKS * BLOCK)
        .await
        .expect("create");
    let (vol, _) = open_volume(source.clone(), "v", dir.path(), config())
        .await
        .expect("open");
    write_round(&vol, 1).await;
    vol.sync_to_store().await.expect("sync");
    let older = mem("older");
    replicate(&source, &older).await.expect("the older replica");
    vol.create_snapshot("s").await.expect("snapshot");
    write_round(&vol, 2).await;
    write_round(&vol, 3).await;
    vol.shutdown().await.expect("shutdown");
    let whole = replicate(&source, &copy_of(&older).await)
        .await
        .expect("a whole pass");
    let needed = whole.objects_present + whole.objects_copied;
    let data_keys = |keys: Vec<String>| -> std::collections::BTreeSet<String> {
        keys.into_iter()
            .filter(|k| k.ends_with(".d") || k.ends_with(".g"))
            .collect()
    };
    let before = data_keys(object_keys(&older, "v").await);
    let mut seen_older = false;
    let mut finished = false;
    for n in 0..whole.objects_copied + whole.checkpoints_copied + 40 {
        let mem = copy_of(&older).await;
        let faulty = Arc::new(FaultyStore::new(mem.clone(), FaultPlan::default(), n));
        faulty.kill_after_mutations(n);
        if replicate(&source, &(faulty.clone() as DynStore))
            .await
            .is_ok()
        {
            finished = true;
            break;
        }
        let got = replica_versions(&mem, "v")
            .await
            .expect("the older replica stays a volume");
        assert_prefix_shape(&got, &format!("stopped after {n} mutations"));
        seen_older |= got == vec![1; BLOCKS as usize];
        let copy = copy_of(&mem).await;
        let meta = super::read_meta(&copy, "v").await.expect("meta");
        if super::read_snapshot(&copy, &meta, "s").await.is_ok() {
            let other = TempDir::new("engine-replicate-stopped-snap");
            let (snap, _) = open_snapshot(copy, "v", "s", other.path(), config())
                .await
                .unwrap_or_else(|e| panic!("n={n}: the snapshot is there but not whole: {e}"));
            assert_eq!(versions(&snap).await, vec![1; BLOCKS as usize], "n={n}");
            snap.shutdown().await.expect("shutdown");
        }
        let landed = data_keys(object_keys(&mem, "v").await)
            .difference(&before)
            .count() as u64;
        let resumed = replicate(&source, &mem).await.expect("resume");
        assert_eq!(
            (
                resumed.objects_present + resumed.objects_copied,
                resumed.objects_copied
            ),
            (needed, whole.objects_copied - landed),
            "n={n}: the resumed pass did not take up where the first stopped: {resumed:?}"
        );
        assert_eq!(
            replica_versions(&mem, "v").await,
            Some(vec![3; BLOCKS as usize]),
            "n={n}"
        );
    }
    assert!(finished, "the pass never finished");
    // The replica moves from one checkpoint to a newer one (the objects between them
    // that GC deleted are not copied), so a stop shows the older or the newer state.
    assert!(
        seen_older,
        "no stop left the older state: the test stops too late"
    );
}

/// Passes while the source is written and collected: each replica is a prefix; the
/// last, after the writes, equals the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_under_writes_and_gc_are_prefixes() {
    let source = mem("source");
    let target = mem("target");
    let dir = TempDir::new("engine-replicate-live");
    create_volume(&source, "v", BLOCKS * BLOCK)
        .await
        .expect("create");
    let (vol, _) = open_volume(source.clone(), "v", dir.path(), config())
        .await
        .expect("open");
    // The writer waits for a pass after each round, so passes and writes interleave
    // however slow the machine is.
    let passes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = {
        let (vol, passes) = (vol.clone(), passes.clone());
        tokio::spawn(async move {
            for round in 1..=6 {
                write_round(&vol, round).await;
                while passes.load(std::sync::atomic::Ordering::Relaxed) < round {
                    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                }
            }
        })
    };
    while !writer.is_finished() {
        replicate(&source, &target).await.expect("pass");
        let passes = passes.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if let Some(got) = replica_versions(&target, "v").await {
            assert_prefix_shape(&got, &format!("pass {passes}"));
        }
    }
    writer.await.expect("writer");
    vol.sync_to_store().await.expect("sync");
    assert!(
        vol.status().gc_passes > 0,
        "GC never ran: {:?}",
        vol.status()
    );
    replicate(&source, &target).await.expect("last pass");
    assert_eq!(
        replica_versions(&target, "v").await,
        Some(vec![6; BLOCKS as usize])
    );
    vol.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_refuses_its_own_store_a_foreign_volume_and_an_orphan_clone() {
    let source = mem("source");
    let dir = TempDir::new("engine-replicate-refuse");
    let vol = source_volume(&source, &dir).await;
    vol.shutdown().await.expect("shutdown");
    assert_kind(replicate(&source, &source).await, ErrorKind::BadInput);

    let foreign = mem("foreign");
    create_volume(&foreign, "v", BLOCKS * BLOCK)
        .await
        .expect("create");
    assert_kind(replicate(&source, &foreign).await, ErrorKind::Conflict);

    // A clone needs its parent in the target first.
    super::create_clone(&source, "v", "s", "c")
        .await
        .expect("clone");
    let target = mem("target");
    let clone_first = replicate_once(
        &source,
        &target,
        "c",
        &ReplicateOptions::default(),
        &ReplicateProgress::default(),
    )
    .await;
    assert_kind(clone_first, ErrorKind::BadInput);
    replicate(&source, &target).await.expect("the parent");
    let (clone, _) = open_volume(source.clone(), "c", dir.path(), config())
        .await
        .expect("open the clone");
    for b in (0..BLOCKS).step_by(3) {
        clone
            .write(b * BLOCK, stamp(b, 7), false)
            .await
            .expect("write");
    }
    let expected = versions(&clone).await;
    clone.shutdown().await.expect("shutdown");
    replicate_once(
        &source,
        &target,
        "c",
        &ReplicateOptions::default(),
        &ReplicateProgress::default(),
    )
    .await
    .expect("the clone");
    assert_eq!(replica_versions(&target, "c").await, Some(expected));
    assert_eq!(
        replica_versions(&target, "v").await,
        Some(vec![3; BLOCKS as usize])
    );
}
