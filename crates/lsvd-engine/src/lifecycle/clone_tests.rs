//! Writable clones (`create_clone`): isolation both ways, through GC and restarts;
//! clones of clones; the parent refuses to delete what a clone needs.

use std::sync::Arc;

use crate::lifecycle::snapshot_tests::{
    BLOCK, BLOCKS, assert_kind, config, stamp, versions, write_all,
};
use crate::test_support::{create_and_open, poll_until};
use crate::{Volume, create_clone, open_snapshot, open_volume};
use lsvd_core::error::ErrorKind;
use lsvd_store::DynStore;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

/// Write `version` to the even (`odd` false) or odd blocks.
async fn write_half(volume: &Volume, odd: bool, version: u64) {
    for b in (u64::from(odd)..BLOCKS).step_by(2) {
        volume
            .write(b * BLOCK, stamp(b, version), false)
            .await
            .expect("write");
    }
}

/// What the clone holds after its writes below: every fourth block (from 0) at 5, the
/// other even blocks at 3, the odd blocks at `odd`.
fn clone_versions(odd: u64) -> Vec<u64> {
    (0..BLOCKS)
        .map(|b| match b % 4 {
            0 => 5,
            2 => 3,
            _ => odd,
        })
        .collect()
}

/// Deletes volume `name` of `store`, all of it.
async fn delete_whole(store: &DynStore, name: &str) {
    let plan = crate::plan_delete(store, name)
        .await
        .unwrap_or_else(|e| panic!("plan the delete of {name}: {e}"));
    crate::delete_volume(store, &plan, &|_, _| {})
        .await
        .unwrap_or_else(|e| panic!("delete {name}: {e}"));
}

/// A memory store with volume "base" of [`BLOCKS`] blocks, every block written at
/// version 1, and its snapshot "s"; the base stays open with its files in `dir`.
pub(super) async fn base_with_snapshot(dir: &TempDir) -> (DynStore, Arc<Volume>) {
    let store: DynStore = Arc::new(MemStore::new());
    let (base, _) = create_and_open(&store, "base", BLOCKS * BLOCK, dir.path(), config()).await;
    write_all(&base, 1).await;
    base.create_snapshot("s").await.expect("snapshot");
    (store, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_are_isolated_both_ways_and_keep_their_parents_data() {
    let base_dir = TempDir::new("engine-clone-base");
    let (store, base) = base_with_snapshot(&base_dir).await;
    create_clone(&store, "base", "s", "c").await.expect("clone");
    assert_kind(
        create_clone(&store, "base", "s", "c").await,
        ErrorKind::AlreadyExists,
    );
    assert_kind(
        create_clone(&store, "base", "nope", "c2").await,
        ErrorKind::NotFound,
    );

    let clone_dir = TempDir::new("engine-clone-c");
    let (c, _) = open_volume(store.clone(), "c", clone_dir.path(), config())
        .await
        .expect("open clone");
    assert_eq!(versions(&c).await, vec![1; BLOCKS as usize]);
    // The clone rewrites its even blocks, then half of them again: the parent's
    // objects become half dead in its view, which its GC leaves alone (they are the
    // parent's, kept by the snapshot), and its own objects half dead, which its GC
    // compacts; the base overwrites everything twice.
    write_half(&c, false, 3).await;
    write_all(&base, 2).await;
    for b in (0..BLOCKS).step_by(4) {
        c.write(b * BLOCK, stamp(b, 5), false).await.expect("write");
    }
    write_all(&base, 4).await;
    c.sync_to_store().await.expect("sync clone");
    base.sync_to_store().await.expect("sync base");
    poll_until(std::time::Duration::from_secs(5), async || {
        c.status().gc_passes > 0
    })
    .await;
    let status = c.status();
    assert!(status.gc_passes > 0, "the clone's GC never ran: {status:?}");
    // Only the clone's own data moved (a quarter of the blocks at most), none of the
    // parent's odd blocks.
    assert!(
        status.gc_moved_bytes <= BLOCKS / 4 * BLOCK,
        "the clone's GC copied its parent's data: {status:?}"
    );
    c.sync_to_store().await.expect("sync clone");
    assert_eq!(versions(&c).await, clone_versions(1), "clone");
    assert_eq!(versions(&base).await, vec![4; BLOCKS as usize], "base");
    let (snap, _) = open_snapshot(store.clone(), "base", "s", base_dir.path(), config())
        .await
        .expect("open base@s");
    assert_eq!(versions(&snap).await, vec![1; BLOCKS as usize], "base@s");
    snap.shutdown().await.expect("shutdown");

    // What a clone needs cannot be deleted from under it.
    let e = base.delete_snapshot("s").await.expect_err("refused");
    assert_eq!(e.kind, ErrorKind::Conflict);
    assert!(e.to_string().contains("c (from base@s)"), "{e}");
    assert_kind(
        crate::plan_delete(&store, "base").await,
        ErrorKind::Conflict,
    );

    // Restarts, the clone from the store alone.
    c.shutdown().await.expect("shutdown clone");
    base.shutdown().await.expect("shutdown base");
    drop((c, base));
    let elsewhere = TempDir::new("engine-clone-c-elsewhere");
    let (c, _) = open_volume(store.clone(), "c", elsewhere.path(), config())
        .await
        .expect("reopen clone");
    let (base, _) = open_volume(store.clone(), "base", base_dir.path(), config())
        .await
        .expect("reopen base");
    assert_eq!(versions(&c).await, clone_versions(1), "clone after restart");
    assert_eq!(
        versions(&base).await,
        vec![4; BLOCKS as usize],
        "base after restart"
    );

    // A clone of the clone sees the clone's state at its snapshot, nothing later.
    c.create_snapshot("t").await.expect("snapshot of the clone");
    create_clone(&store, "c", "t", "d")
        .await
        .expect("clone of a clone");
    write_half(&c, true, 6).await;
    let d_dir = TempDir::new("engine-clone-d");
    let (d, _) = open_volume(store.clone(), "d", d_dir.path(), config())
        .await
        .expect("open d");
    assert_eq!(versions(&d).await, clone_versions(1), "d");
    d.write(0, stamp(0, 7), false).await.expect("write d");
    let mut want = clone_versions(1);
    want[0] = 7;
    assert_eq!(versions(&d).await, want, "d after its write");
    assert_eq!(versions(&c).await, clone_versions(6), "c unchanged by d");
    d.shutdown().await.expect("shutdown d");

    // Deleting the clones releases what they held.
    delete_whole(&store, "d").await;
    c.delete_snapshot("t")
        .await
        .expect("t is free once d is gone");
    c.shutdown().await.expect("shutdown c");
    delete_whole(&store, "c").await;
    base.delete_snapshot("s")
        .await
        .expect("s is free once c is gone");
    assert_eq!(versions(&base).await, vec![4; BLOCKS as usize]);
    base.shutdown().await.expect("shutdown base");
}

/// `create_clone` stopped at every store mutation: the clone either exists whole
/// (reads the snapshot) or not at all, and `delete` of the name then removes what was
/// left, after which the parent may delete the snapshot again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_stopped_at_any_store_mutation_is_whole_or_removable() {
    use lsvd_store::faulty::{FaultPlan, FaultyStore};
    let mut finished = false;
    for n in 0..16u64 {
        let store: DynStore = Arc::new(MemStore::new());
        let dir = TempDir::new("engine-clone-stopped");
        let (base, _) = create_and_open(&store, "base", BLOCKS * BLOCK, dir.path(), config()).await;
        write_all(&base, 1).await;
        base.create_snapshot("s").await.expect("snapshot");
        let faulty = Arc::new(FaultyStore::new(store.clone(), FaultPlan::default(), n));
        faulty.kill_after_mutations(n);
        let faulty_dyn: DynStore = faulty.clone();
        finished = create_clone(&faulty_dyn, "base", "s", "c").await.is_ok();
        match crate::read_meta(&store, "c").await {
            Ok(_) => {
                let other = TempDir::new("engine-clone-stopped-c");
                let (c, _) = open_volume(store.clone(), "c", other.path(), config())
                    .await
                    .unwrap_or_else(|e| panic!("n={n}: the clone exists but does not open: {e}"));
                assert_eq!(versions(&c).await, vec![1; BLOCKS as usize], "n={n}");
                c.shutdown().await.expect("shutdown");
            }
            Err(e) => {
                assert_eq!(e.kind, ErrorKind::NotFound, "n={n}: {e}");
                assert!(!finished, "n={n}: finished but no metadata");
            }
        }
        // Whatever is left goes with `delete` (nothing at all: NotFound).
        match crate::plan_delete(&store, "c").await {
            Ok(plan) => crate::delete_volume(&store, &plan, &|_, _| {})
                .await
                .expect("delete the leftovers"),
            Err(e) => assert_eq!(e.kind, ErrorKind::NotFound, "n={n}: {e}"),
        }
        base.delete_snapshot("s")
            .await
            .unwrap_or_else(|e| panic!("n={n}: the snapshot is still held: {e}"));
        assert_eq!(versions(&base).await, vec![1; BLOCKS as usize]);
        base.shutdown().await.expect("shutdown");
        if finished {
            break;
        }
    }
    assert!(finished, "create_clone never finished");
}
