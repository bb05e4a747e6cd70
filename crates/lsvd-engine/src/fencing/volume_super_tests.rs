//! The volume superblock in the store: generations, fencing, and what recovery
//! refuses when the store lost objects the superblock vouches for.

use std::sync::Arc;
use std::time::Duration;

use lsvd_core::format::object::ObjectKind;
use lsvd_core::format::volume_super::VolumeSuper;

use crate::config::RecoveryMode;
use crate::keys::{object_key, parse_object_name, parse_super_name};
use lsvd_store::clock::SystemClock;

/// The key of object `seq` in `mem` (whatever its epoch).
fn key_of(mem: &MemStore, seq: u64) -> String {
    mem.snapshot()
        .iter()
        .map(|(k, _)| k.clone())
        .find(|k| parse_object_name(k).is_some_and(|n| n.seq == seq))
        .expect("the object is in the store")
}
use crate::fencing::volume_super::{WriteError, write};
use crate::test_support::{
    log_config, newest_super, no_gc, open_v, poll_until, wait_drained, write_until_refused,
};
use crate::{EngineConfig, Volume, create_volume, open_volume, read_meta};
use lsvd_store::DynStore;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;

fn config() -> EngineConfig {
    EngineConfig {
        checkpoint_every_objects: 2,
        ..log_config(64 << 10, 20, 16 << 20)
    }
}

async fn setup() -> (TempDir, MemStore, DynStore) {
    let dir = TempDir::new("engine-vsuper");
    let mem = MemStore::new();
    let store: DynStore = Arc::new(mem.clone());
    create_volume(&store, "v", 4 << 20).await.expect("create");
    (dir, mem, store)
}

fn generations(mem: &MemStore) -> Vec<u64> {
    mem.snapshot()
        .iter()
        .filter_map(|(k, _)| parse_super_name(k))
        .collect()
}

async fn write_blocks(vol: &Volume, first: u64, n: u64, fill: u8) {
    for b in first..first + n {
        vol.write(b * 4096, vec![fill; 4096], false)
            .await
            .expect("write");
    }
    vol.flush().await.expect("flush");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_and_checkpoints_write_new_generations_and_old_ones_are_pruned() {
    let (dir, mem, store) = setup().await;
    let (vol, rep) = open_v(&store, dir.path(), config(), "open").await;
    assert_eq!(rep.superblock_generation, 1);
    assert_eq!(generations(&mem), vec![1]);
    // 64 KiB batches, a checkpoint every two objects: several checkpoints.
    write_blocks(&vol, 0, 160, 1).await;
    wait_drained(&vol).await;
    vol.shutdown().await.expect("shutdown");
    let gens = generations(&mem);
    let newest = *gens.last().expect("generations");
    assert!(newest >= 5, "checkpoints wrote generations: {gens:?}");
    assert!(
        gens.len() <= 4 && gens == (newest + 1 - gens.len() as u64..=newest).collect::<Vec<_>>(),
        "old generations pruned, newest kept: {gens:?}"
    );
    let sb = newest_super(&store).await;
    assert!(sb.clean, "the shutdown checkpoint's generation says clean");
    let c = sb.newest_checkpoint.expect("names a checkpoint");
    assert!(
        mem.snapshot().iter().any(|(k, _)| parse_object_name(k)
            .is_some_and(|n| n.seq == c && n.kind == ObjectKind::Checkpoint)),
        "the named checkpoint exists"
    );
    assert_eq!(sb.durable_through, c + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_opener_supersedes_the_first_which_stops_writing() {
    let (dir, _mem, store) = setup().await;
    let (first, _) = open_v(&store, dir.path(), config(), "open").await;
    write_blocks(&first, 0, 8, 1).await;
    wait_drained(&first).await;
    // Another process (another data directory) opens the same volume.
    let dir2 = TempDir::new("engine-vsuper-2");
    let (second, _) = open_v(&store, dir2.path(), config(), "second open").await;
    // The first one's next checkpoint finds its generation taken and fails the volume.
    write_until_refused(&first, 64, 8, 2).await;
    let refused = poll_until(Duration::from_secs(10), async || {
        first.write(0, vec![3; 4096], false).await.is_err()
    })
    .await;
    assert!(refused, "the superseded process kept accepting writes");
    first.crash();
    assert_eq!(
        second.read(0, 4096).await.expect("read"),
        vec![1; 4096],
        "the new owner serves what the store held when it opened"
    );
    second.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_not_mistaken_for_another_writer() {
    let (_dir, _mem, store) = setup().await;
    let meta = read_meta(&store, "v").await.expect("meta");
    let sb = VolumeSuper {
        volume: meta.volume,
        generation: 7,
        session: 11,
        durable_through: 1,
        ..Default::default()
    };
    write(&store, "v", &sb, 3, &SystemClock::new())
        .await
        .expect("first write");
    // The same session again (its first reply was lost): success.
    write(&store, "v", &sb, 3, &SystemClock::new())
        .await
        .expect("retry after a lost reply");
    // Another session: superseded.
    let other = VolumeSuper { session: 12, ..sb };
    assert!(matches!(
        write(&store, "v", &other, 3, &SystemClock::new()).await,
        Err(WriteError::Superseded { generation: 7, .. })
    ));
}

/// Write 40 blocks and let them upload, then one more block, and shut down: the
/// last data object sits between the previous checkpoint and the clean one.
/// Returns the superblock naming both checkpoints.
async fn two_checkpoints_and_an_object_between(
    dir: &TempDir,
    store: &DynStore,
) -> lsvd_core::format::volume_super::VolumeSuper {
    let (vol, _) = open_v(store, dir.path(), config(), "open").await;
    write_blocks(&vol, 0, 40, 1).await;
    wait_drained(&vol).await;
    vol.shutdown().await.expect("shutdown");
    drop(vol);
    // No periodic checkpoint this time: one data object, then the clean checkpoint.
    let rare = EngineConfig {
        checkpoint_every_objects: 1000,
        ..config()
    };
    let (vol, _) = open_v(store, dir.path(), rare, "reopen").await;
    write_blocks(&vol, 40, 1, 2).await;
    vol.shutdown().await.expect("shutdown");
    drop(vol);
    newest_super(store).await
}

async fn assert_blocks(vol: &Volume) {
    for b in 0..41u64 {
        let want = if b < 40 { 1 } else { 2 };
        let got = vol.read(b * 4096, 4096).await.expect("read");
        assert!(got.iter().all(|&x| x == want), "block {b}");
    }
}

/// The newest checkpoint missing or corrupt: recovery starts from the previous one
/// (strict mode included: nothing acknowledged is gone) and replays the objects
/// after it; the data reads back the same.
async fn newest_checkpoint_falls_back(corrupt: bool) {
    let (dir, mem, store) = setup().await;
    let sb = two_checkpoints_and_an_object_between(&dir, &store).await;
    let c = sb.newest_checkpoint.expect("checkpoint");
    let previous = sb.previous_checkpoint.expect("a previous checkpoint");
    let key = key_of(&mem, c);
    if corrupt {
        let mut bytes = store.get(&key).await.expect("get");
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        store
            .put(&key, bytes.into(), lsvd_store::PutMode::Overwrite)
            .await
            .expect("overwrite");
    } else {
        store.delete(&key).await.expect("delete");
        assert!(!mem.snapshot().iter().any(|(k, _)| *k == key));
    }
    // Cache lost too: the store alone must give the data back.
    let fresh = TempDir::new("engine-vsuper-fresh");
    let what = "strict recovery falls back to the previous checkpoint";
    let (vol, rep) = open_v(&store, fresh.path(), config(), what).await;
    assert_eq!(rep.checkpoint_seq, Some(previous), "{rep:?}");
    assert_eq!(rep.checkpoints_skipped, vec![c], "{rep:?}");
    assert!(rep.objects_replayed > 0, "{rep:?}");
    assert!(rep.stranded_deleted.is_empty(), "{rep:?}");
    assert_blocks(&vol).await;
    // It keeps working: new writes, a new checkpoint, a restart.
    write_blocks(&vol, 50, 4, 3).await;
    vol.shutdown().await.expect("shutdown");
    drop(vol);
    let (vol, rep) = open_v(&store, fresh.path(), config(), "reopen").await;
    assert!(rep.checkpoint_seq > Some(c), "a newer checkpoint: {rep:?}");
    assert_blocks(&vol).await;
    vol.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_newest_checkpoint_falls_back_to_the_previous() {
    newest_checkpoint_falls_back(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_newest_checkpoint_falls_back_to_the_previous() {
    newest_checkpoint_falls_back(true).await;
}

/// Data objects of `mem`'s volume `v` (sequence numbers).
fn data_objects(mem: &MemStore) -> Vec<u64> {
    mem.snapshot()
        .iter()
        .filter_map(|(k, _)| parse_object_name(k))
        .filter(|n| n.kind == ObjectKind::Data)
        .map(|n| n.seq)
        .collect()
}

/// Regression: objects that died between the two kept checkpoints were deleted as
/// soon as the newest was named, so when the newest was then lost, the replay from
/// the previous one missed them and strict recovery refused. They now stay until the
/// next checkpoint is named, and the fallback reaches the newest state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_dead_at_the_newest_checkpoint_stay_for_the_fallback() {
    let (dir, mem, store) = setup().await;
    let (vol, _) = open_v(&store, dir.path(), config(), "open").await;
    write_blocks(&vol, 0, 40, 1).await;
    wait_drained(&vol).await;
    vol.shutdown().await.expect("shutdown");
    drop(vol);
    let first = data_objects(&mem);
    // Overwrite every block: the first objects die, and the clean checkpoint at
    // shutdown leaves them out. No checkpoint in between (no GC pass either: its
    // checkpoint would be the one to leave them out).
    let rare = EngineConfig {
        checkpoint_every_objects: 1000,
        gc: no_gc(),
        ..config()
    };
    let (vol, _) = open_v(&store, dir.path(), rare, "reopen").await;
    write_blocks(&vol, 0, 41, 2).await;
    vol.shutdown().await.expect("shutdown");
    drop(vol);
    let sb = newest_super(&store).await;
    let c = sb.newest_checkpoint.expect("checkpoint");
    let previous = sb.previous_checkpoint.expect("a previous checkpoint");
    assert!(
        first.iter().all(|s| *s < previous),
        "{first:?} before {previous}"
    );
    let still = data_objects(&mem);
    assert!(
        first.iter().all(|s| still.contains(s)),
        "objects dead at checkpoint {c} are kept until the next: {first:?} vs {still:?}"
    );
    // The newest checkpoint is lost, and the cache with it.
    store.delete(&key_of(&mem, c)).await.expect("delete");
    let fresh = TempDir::new("engine-vsuper-fresh");
    let what = "strict recovery reaches the newest state from the previous checkpoint";
    let (vol, rep) = open_v(&store, fresh.path(), config(), what).await;
    assert_eq!(rep.checkpoint_seq, Some(previous), "{rep:?}");
    for b in 0..41u64 {
        let got = vol.read(b * 4096, 4096).await.expect("read");
        assert!(got.iter().all(|&x| x == 2), "block {b}");
    }
    vol.shutdown().await.expect("shutdown");
    drop(vol);
    // The space comes back: the next open deletes what no checkpoint needs.
    let (vol, _) = open_v(&store, fresh.path(), config(), "reopen").await;
    vol.shutdown().await.expect("shutdown");
    let left = data_objects(&mem);
    assert!(
        first.iter().all(|s| !left.contains(s)),
        "dead objects are deleted eventually: {first:?} in {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_an_object_the_superblock_vouches_for_is_an_error_naming_it() {
    let (dir, mem, store) = setup().await;
    let sb = two_checkpoints_and_an_object_between(&dir, &store).await;
    let c = sb.newest_checkpoint.expect("checkpoint");
    let previous = sb.previous_checkpoint.expect("a previous checkpoint");
    let key = key_of(&mem, c);
    // The newest checkpoint and a data object the fallback would need are gone.
    let lost = mem
        .snapshot()
        .iter()
        .filter_map(|(k, _)| parse_object_name(k))
        .filter(|n| n.kind == ObjectKind::Data && n.seq > previous && n.seq < c)
        .map(|n| n.seq)
        .max()
        .expect("a data object between the checkpoints");
    store.delete(&key).await.expect("delete");
    store.delete(&key_of(&mem, lost)).await.expect("delete");
    // Cache lost too, so nothing else can vouch for the data.
    let fresh = TempDir::new("engine-vsuper-fresh");
    let e = open_volume(store.clone(), "v", fresh.path(), config())
        .await
        .err()
        .expect("strict recovery must refuse");
    assert!(
        e.to_string().contains(&key)
            && e.to_string().contains(&format!("{lost:016x}"))
            && e.to_string().contains("accept-prefix"),
        "error names the missing checkpoint, the missing object and the way out: {e}"
    );
    assert_eq!(e.kind, lsvd_core::error::ErrorKind::DataLoss, "{e}");
    let (vol, _) = open_volume(
        store.clone(),
        "v",
        fresh.path(),
        EngineConfig {
            recovery_mode: RecoveryMode::AcceptPrefix,
            ..config()
        },
    )
    .await
    .expect("accept-prefix opens");
    vol.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_key_taken_by_another_writer_fails_the_volume_instead_of_counting_as_landed() {
    let (dir, _mem, store) = setup().await;
    let (vol, rep) = open_v(&store, dir.path(), config(), "open").await;
    // Something else got to the next object key first (a retried PUT used to take
    // "already exists" as its own lost reply).
    let next = vol.status().next_object_seq;
    let key = object_key("v", next, rep.epoch, ObjectKind::Data);
    store
        .put(&key, vec![0xEE; 8192].into(), lsvd_store::PutMode::IfAbsent)
        .await
        .expect("foreign put");
    let refused = write_until_refused(&vol, 200, 16, 1).await;
    assert!(
        refused,
        "the volume kept writing over another writer's object"
    );
    vol.crash();
}

/// A newest superblock generation that fails its checks is passed over for the newest
/// older one that verifies (the store keeps a few): the volume opens from the store
/// alone, whole. With every generation corrupt, the open refuses, saying how to
/// recover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_newest_superblock_falls_back_to_an_older_generation() {
    use lsvd_store::PutMode;
    let (dir, mem, store) = setup().await;
    let (vol, _) = open_v(&store, dir.path(), config(), "open").await;
    write_blocks(&vol, 0, 64, 7).await;
    wait_drained(&vol).await;
    vol.shutdown().await.expect("shutdown");
    let mut gens = generations(&mem);
    gens.sort_unstable();
    assert!(gens.len() >= 2, "older generations kept: {gens:?}");
    let corrupt = |g: u64| {
        let store = store.clone();
        async move {
            let key = crate::keys::super_key("v", g);
            let mut bytes = store.get(&key).await.expect("get");
            let at = bytes.len() / 2;
            bytes[at] = bytes[at].wrapping_add(1);
            store
                .put(&key, bytes.into(), PutMode::Overwrite)
                .await
                .expect("put");
        }
    };
    corrupt(*gens.last().expect("a generation")).await;
    // From the store alone (a new data directory): the log cannot help.
    let fresh = TempDir::new("engine-vsuper-fallback");
    let what = "an older generation verifies";
    let (vol, _) = open_v(&store, fresh.path(), config(), what).await;
    for b in 0..64u64 {
        assert_eq!(
            vol.read(b * 4096, 4096).await.expect("read"),
            vec![7; 4096],
            "block {b}"
        );
    }
    vol.shutdown().await.expect("shutdown");
    for g in generations(&mem) {
        corrupt(g).await;
    }
    let fresh = TempDir::new("engine-vsuper-fallback-none");
    let e = open_volume(store.clone(), "v", fresh.path(), config())
        .await
        .map(|_| ())
        .expect_err("no generation verifies");
    assert!(
        e.to_string().contains("no older generation verifies"),
        "{e}"
    );
}

/// Two servers start on a volume stopped cleanly. One reads the newest generation
/// (clean: free to claim), and before it lists the generations the other's claim
/// lands. It must not claim past that claim at once (it did: the listing's number
/// plus one, taking the volume from a server that had just started serving, whose
/// acknowledged writes its recovery had not seen): it watches the new holder, which
/// renews, and refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_landing_between_the_read_and_the_listing_is_not_claimed_past() {
    use crate::fencing::lease::{LeaseConfig, Takeover, acquire};
    let (dir, _mem, store) = setup().await;
    let (vol, _) = open_v(&store, dir.path(), config(), "open").await;
    vol.shutdown().await.expect("shutdown");
    let meta = read_meta(&store, "v").await.expect("meta");
    let clean = newest_super(&store).await;
    assert!(clean.clean);
    let other = VolumeSuper {
        generation: clean.generation + 1,
        clean: false,
        session: 0x5e55_1011,
        epoch: clean.epoch + 1,
        lease_timeout_ms: 60_000,
        holder: "host a".to_string(),
        ..clean.clone()
    };
    let inner = store.clone();
    let prefix = crate::keys::super_prefix("v");
    // `acquire` reads the newest generation (one listing), then lists: the other
    // claim lands between the two.
    let hooked: DynStore = Arc::new(lsvd_store::testutil::HookStore::new(
        store.clone(),
        move |op| matches!(op, lsvd_store::testutil::HookOp::List(p) if p == prefix),
        2,
        async move {
            assert!(
                write(&inner, "v", &other, 1, &SystemClock::new())
                    .await
                    .is_ok(),
                "the other claim lands"
            );
        },
    ));
    let config = LeaseConfig {
        timeout_ms: 60_000,
        takeover: Takeover::Refuse,
        holder: "host b".to_string(),
        poll_ms: 50,
    };
    match tokio::time::timeout(
        Duration::from_millis(1500),
        acquire(&hooked, &meta, None, &config, &SystemClock::new()),
    )
    .await
    {
        // Still watching the new holder for a renewal.
        Err(_elapsed) => {}
        Ok(Err(e)) => assert_eq!(e.kind, lsvd_core::error::ErrorKind::Conflict, "{e}"),
        Ok(Ok(acquired)) => panic!(
            "claimed generation {} past a claim it never looked at (newest read: {:?})",
            acquired.claim_generation,
            acquired.newest.map(|s| s.generation)
        ),
    }
}
