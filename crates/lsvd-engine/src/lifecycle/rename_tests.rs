//! `rename_volume`: the volume, its snapshots and its size move to the new name and
//! nothing stays under the old one; refusals (served, clones, an existing name); a
//! rename stopped at any store mutation leaves one whole volume, and running it again
//! finishes.

use std::sync::Arc;

use crate::lifecycle::snapshot_tests::{BLOCK, BLOCKS, config, versions, write_all};
use crate::test_support::create_and_open;
use crate::{create_clone, create_volume, open_snapshot, open_volume, read_meta, rename_volume};
use lsvd_core::error::ErrorKind;
use lsvd_store::DynStore;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

/// Volume "old": every block at version 1, snapshot "s", then version 2 everywhere,
/// grown to twice its size; stopped cleanly.
async fn made(store: &DynStore) {
    let dir = TempDir::new("engine-rename-make");
    let (vol, _) = create_and_open(store, "old", BLOCKS * BLOCK, dir.path(), config()).await;
    write_all(&vol, 1).await;
    vol.create_snapshot("s").await.expect("snapshot");
    write_all(&vol, 2).await;
    vol.resize(2 * BLOCKS * BLOCK, false).await.expect("grow");
    vol.shutdown().await.expect("shutdown");
}

/// "new" reads as "old" did, with its snapshot, and "old" is gone.
async fn assert_moved(store: &DynStore, what: &str) {
    let dir = TempDir::new("engine-rename-check");
    let (vol, _) = open_volume(store.clone(), "new", dir.path(), config())
        .await
        .unwrap_or_else(|e| panic!("{what}: open new: {e}"));
    assert_eq!(vol.size_bytes(), 2 * BLOCKS * BLOCK, "{what}");
    assert_eq!(versions(&vol).await, vec![2; BLOCKS as usize], "{what}");
    vol.shutdown().await.expect("shutdown");
    let (snap, _) = open_snapshot(store.clone(), "new", "s", dir.path(), config())
        .await
        .unwrap_or_else(|e| panic!("{what}: open new@s: {e}"));
    assert_eq!(versions(&snap).await, vec![1; BLOCKS as usize], "{what}");
    snap.shutdown().await.expect("shutdown");
    assert_eq!(
        read_meta(store, "old")
            .await
            .map(|_| ())
            .map_err(|e| e.kind),
        Err(ErrorKind::NotFound),
        "{what}"
    );
    let left = store.list("old/").await.expect("list");
    assert!(left.is_empty(), "{what}: left under old/: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_moves_data_snapshots_and_size_and_leaves_nothing_behind() {
    let store: DynStore = Arc::new(MemStore::new());
    made(&store).await;
    let before = read_meta(&store, "old").await.expect("meta");
    let r = rename_volume(&store, "old", "new").await.expect("rename");
    assert!(
        r.keys_copied > 3 && r.bytes_copied > BLOCKS * BLOCK,
        "{r:?}"
    );
    assert_eq!(r.keys_found, 0);
    let after = read_meta(&store, "new").await.expect("meta");
    assert_eq!(
        (after.volume, after.size_bytes, after.created_unix_secs),
        (before.volume, before.size_bytes, before.created_unix_secs)
    );
    assert_moved(&store, "renamed").await;
    // And back.
    rename_volume(&store, "new", "old")
        .await
        .expect("rename back");
    rename_volume(&store, "old", "new")
        .await
        .expect("and again");
    assert_moved(&store, "renamed three times").await;
}

/// Renaming `from` to `to` in `store` must fail with `kind`.
async fn assert_rename_refused(store: &DynStore, from: &str, to: &str, kind: ErrorKind) {
    match rename_volume(store, from, to).await {
        Ok(r) => panic!("{from} -> {to}: renamed ({r:?}), expected a {kind:?} error"),
        Err(e) => assert_eq!(e.kind, kind, "{from} -> {to}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_refuses_served_cloned_and_taken_names() {
    let store: DynStore = Arc::new(MemStore::new());
    made(&store).await;
    create_volume(&store, "taken", BLOCKS * BLOCK)
        .await
        .expect("create");
    assert_rename_refused(&store, "old", "taken", ErrorKind::AlreadyExists).await;
    assert_rename_refused(&store, "old", "old", ErrorKind::BadInput).await;
    assert_rename_refused(&store, "old", "a@b", ErrorKind::BadInput).await;
    assert_rename_refused(&store, "nope", "x", ErrorKind::NotFound).await;
    // Keys under the new name that are not a copy of the volume.
    store
        .put(
            "stray/junk",
            vec![1u8, 2, 3].into(),
            lsvd_store::PutMode::Overwrite,
        )
        .await
        .expect("put");
    assert_rename_refused(&store, "old", "stray", ErrorKind::AlreadyExists).await;
    // Served (its newest superblock is not clean).
    let dir = TempDir::new("engine-rename-served");
    let (vol, _) = open_volume(store.clone(), "old", dir.path(), config())
        .await
        .expect("open");
    assert_rename_refused(&store, "old", "new", ErrorKind::Conflict).await;
    vol.shutdown().await.expect("shutdown");
    // Clones name their parent, and the parent names its clones.
    create_clone(&store, "old", "s", "kid")
        .await
        .expect("clone");
    assert_rename_refused(&store, "old", "new", ErrorKind::Conflict).await;
    assert_rename_refused(&store, "kid", "new", ErrorKind::Unsupported).await;
    assert!(
        read_meta(&store, "old").await.is_ok(),
        "refusals change nothing"
    );
}

/// Stopped at each store mutation, a rename leaves a volume to open under one of the
/// names, and run again (without faults) finishes the move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_stopped_at_any_store_mutation_is_finished_by_running_it_again() {
    use lsvd_store::faulty::{FaultPlan, FaultyStore};
    let mut finished = false;
    for n in 0..200u64 {
        let mem: DynStore = Arc::new(MemStore::new());
        made(&mem).await;
        let faulty = FaultyStore::new(mem.clone(), FaultPlan::default(), n);
        faulty.kill_after_mutations(n);
        let killed: DynStore = Arc::new(faulty);
        finished = rename_volume(&killed, "old", "new").await.is_ok();
        let (old_there, new_there) = (
            read_meta(&mem, "old").await.is_ok(),
            read_meta(&mem, "new").await.is_ok(),
        );
        assert!(
            old_there || new_there,
            "n={n}: neither name holds the volume"
        );
        if old_there != new_there {
            // One name opens whole: the old one until the new metadata landed.
            let one = if new_there { "new" } else { "old" };
            let dir = TempDir::new("engine-rename-stopped");
            let (vol, _) = open_volume(mem.clone(), one, dir.path(), config())
                .await
                .unwrap_or_else(|e| panic!("n={n}: {one} does not open: {e}"));
            assert_eq!(
                versions(&vol).await,
                vec![2; BLOCKS as usize],
                "n={n} {one}"
            );
            vol.shutdown().await.expect("shutdown");
        }
        // Running it again finishes; once the old metadata went, only the rename's
        // claim can be left under the old name, which it removes (or nothing, and the
        // old name is not found).
        match rename_volume(&mem, "old", "new").await {
            Ok(_) => {}
            Err(e) if !old_there && e.kind == ErrorKind::NotFound => {}
            Err(e) => panic!("n={n}: running it again: {e}"),
        }
        assert_moved(&mem, &format!("n={n}")).await;
        if finished {
            break;
        }
    }
    assert!(finished, "the rename never finished within 200 mutations");
}

/// A server opens the old name (and writes) after the rename copied it and checked
/// it, just before the new name's metadata lands: the rename must not delete the old
/// name (it did: the writes made there were lost with it). It refuses with a
/// `Conflict` naming both names; the old name opens with the new writes, the new name
/// with the copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_opening_the_old_name_mid_rename_keeps_it_and_its_writes() {
    let mem: DynStore = Arc::new(MemStore::new());
    made(&mem).await;
    let dir = TempDir::new("engine-rename-race");
    let server_store = mem.clone();
    let server_dir = dir.path().to_path_buf();
    let hooked: DynStore = Arc::new(lsvd_store::testutil::HookStore::new(
        mem.clone(),
        |op| matches!(op, lsvd_store::testutil::HookOp::Put("new/meta")),
        1,
        async move {
            let (vol, _) = open_volume(server_store, "old", &server_dir, config())
                .await
                .expect("the server opens the old name");
            write_all(&vol, 3).await;
            vol.shutdown().await.expect("shutdown");
        },
    ));
    let e = rename_volume(&hooked, "old", "new")
        .await
        .expect_err("the old name was opened during the rename");
    assert_eq!(e.kind, ErrorKind::Conflict, "{e}");
    assert!(
        e.to_string().contains("'old' and 'new' both hold volume"),
        "{e}"
    );
    let check = TempDir::new("engine-rename-race-check");
    let (vol, _) = open_volume(mem.clone(), "old", check.path(), config())
        .await
        .expect("the old name still opens");
    assert_eq!(versions(&vol).await, vec![3; BLOCKS as usize]);
    vol.shutdown().await.expect("shutdown");
    let (vol, _) = open_volume(mem.clone(), "new", check.path(), config())
        .await
        .expect("the new name opens");
    assert_eq!(versions(&vol).await, vec![2; BLOCKS as usize]);
    vol.shutdown().await.expect("shutdown");
}
