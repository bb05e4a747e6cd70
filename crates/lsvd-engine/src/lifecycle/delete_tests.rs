//! `lsvd delete` in the store: every key but a tombstone goes, a server still holding
//! the volume stops, and a delete stopped at any store mutation leaves a volume that is either
//! whole or refuses to open, and is finished by deleting again.

use std::sync::Arc;

use crate::test_support::{log_config, open_v, wait_drained, write_until_refused};
use crate::{EngineConfig, Volume, create_volume, delete_volume, open_volume, plan_delete};
use lsvd_core::error::ErrorKind;
use lsvd_store::DynStore;
use lsvd_store::faulty::{FaultPlan, FaultyStore};
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

fn config() -> EngineConfig {
    EngineConfig {
        checkpoint_every_objects: 2,
        ..log_config(64 << 10, 20, 16 << 20)
    }
}

async fn write_blocks(vol: &Volume, n: u64, fill: u8) {
    for b in 0..n {
        vol.write(b * 4096, vec![fill; 4096], false)
            .await
            .expect("write");
    }
    vol.flush().await.expect("flush");
}

fn keys_of(mem: &MemStore, name: &str) -> Vec<String> {
    let prefix = format!("{name}/");
    mem.snapshot()
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with(&prefix))
        .collect()
}

/// What a finished delete leaves: one superblock generation (the tombstone).
fn assert_only_tombstone(mem: &MemStore, name: &str, why: &str) {
    let left = keys_of(mem, name);
    assert!(
        left.len() == 1 && crate::keys::parse_super_name(&left[0]).is_some(),
        "{why}: {left:?}"
    );
}

/// A store with volume "v" holding objects, checkpoints and superblocks (written
/// through a clean shutdown), and a volume "w" next to it.
async fn populated() -> (MemStore, DynStore) {
    let mem = MemStore::new();
    let store: DynStore = Arc::new(mem.clone());
    create_volume(&store, "v", 4 << 20).await.expect("create v");
    create_volume(&store, "w", 4 << 20).await.expect("create w");
    let dir = TempDir::new("engine-delete-fill");
    let (vol, _) = open_v(&store, dir.path(), config(), "open").await;
    write_blocks(&vol, 96, 7).await;
    vol.shutdown().await.expect("shutdown");
    (mem, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_removes_every_key_and_stops_a_server_still_holding_the_volume() {
    let (mem, store) = populated().await;
    let dir = TempDir::new("engine-delete-served");
    let (served, _) = open_v(&store, dir.path(), config(), "open").await;
    write_blocks(&served, 8, 1).await;
    wait_drained(&served).await;
    assert!(keys_of(&mem, "v").len() > 4, "{:?}", keys_of(&mem, "v"));

    let plan = plan_delete(&store, "v").await.expect("plan");
    assert!(!plan.resuming);
    assert_eq!(plan.keys.len(), keys_of(&mem, "v").len());
    delete_volume(&store, &plan, &|_, _| {})
        .await
        .expect("delete");
    // The server's next upload finds the volume claimed and stops taking writes; what
    // it uploads before that check is removed by deleting again.
    let refused = write_until_refused(&served, 400, 8, 2).await;
    assert!(refused, "a server kept writing a deleted volume");
    served.crash();
    if let Ok(plan) = plan_delete(&store, "v").await {
        delete_volume(&store, &plan, &|_, _| {})
            .await
            .expect("delete again");
    }
    assert_only_tombstone(&mem, "v", "after the delete");
    assert!(
        mem.snapshot().iter().any(|(k, _)| k == "w/meta"),
        "w went too"
    );
    let e = plan_delete(&store, "v").await.expect_err("nothing left");
    assert_eq!(e.kind, ErrorKind::NotFound);

    // The name is free again (the tombstone goes), for a volume that starts empty.
    create_volume(&store, "v", 4 << 20)
        .await
        .expect("create again");
    assert_eq!(keys_of(&mem, "v"), vec!["v/meta".to_string()]);
    let dir = TempDir::new("engine-delete-new");
    let (fresh, _) = open_v(&store, dir.path(), config(), "open the new volume").await;
    assert_eq!(fresh.read(0, 4096).await.expect("read"), vec![0; 4096]);
    fresh.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_stopped_at_any_mutation_is_whole_or_refused_and_finishes_when_run_again() {
    let mut stopped_at = 0;
    for n in 1..200u64 {
        let (mem, store) = populated().await;
        let faulty = Arc::new(FaultyStore::new(store.clone(), FaultPlan::default(), n));
        faulty.kill_after_mutations(n);
        let faulty_store: DynStore = faulty.clone();
        let plan = plan_delete(&faulty_store, "v").await.expect("plan");
        if delete_volume(&faulty_store, &plan, &|_, _| {})
            .await
            .is_ok()
            && !faulty.is_killed()
        {
            assert_only_tombstone(&mem, "v", "a delete that finished");
            assert!(n > 3, "a delete of many keys finished within {n} mutations");
            break;
        }
        stopped_at = n;
        let left = keys_of(&mem, "v");
        assert!(
            !left.is_empty(),
            "stopped at mutation {n} yet nothing is left"
        );
        let dir = TempDir::new("engine-delete-reopen");
        match open_volume(store.clone(), "v", dir.path(), config()).await {
            // Stopped before the fence landed: the volume is whole.
            Ok((vol, _)) => {
                assert_eq!(n, 1, "stopped at mutation {n}: the volume still opens");
                assert_eq!(
                    vol.read(95 * 4096, 4096).await.expect("read"),
                    vec![7; 4096]
                );
                vol.shutdown().await.expect("shutdown");
            }
            Err(e) => {
                assert!(
                    matches!(e.kind, ErrorKind::Conflict | ErrorKind::NotFound),
                    "stopped at mutation {n}: {e}"
                );
                if e.kind == ErrorKind::Conflict {
                    assert!(e.to_string().contains("lsvd delete v --yes"), "{e}");
                }
                let e = create_volume(&store, "v", 4 << 20)
                    .await
                    .expect_err("create among the leftovers");
                assert_eq!(e.kind, ErrorKind::AlreadyExists, "{e}");
            }
        }
        let plan = plan_delete(&store, "v").await.expect("plan again");
        assert_eq!(plan.resuming, n > 1, "stopped at mutation {n}");
        delete_volume(&store, &plan, &|_, _| {})
            .await
            .expect("delete again");
        assert_only_tombstone(
            &mem,
            "v",
            &format!("stopped at mutation {n}, then finished"),
        );
        assert!(mem.snapshot().iter().any(|(k, _)| k == "w/meta"));
        create_volume(&store, "v", 4 << 20)
            .await
            .expect("create again");
    }
    assert!(stopped_at > 3, "only {stopped_at} stopping points tried");
}
