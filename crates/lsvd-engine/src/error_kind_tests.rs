//! The kinds of the engine's errors on the paths callers branch on: a missing volume,
//! a bad request, damaged or foreign bytes, a volume that stopped.

use std::sync::Arc;

use lsvd_core::format::object::ObjectKind;

use crate::keys::parse_object_name;
use crate::test_support::{log_config, open_v};
use crate::{EngineConfig, create_volume, inspect_volume, open_volume, read_meta};
use lsvd_core::error::ErrorKind;
use lsvd_store::mem::MemStore;
use lsvd_store::testutil::TempDir;
use lsvd_store::{DynStore, PutMode};

fn config() -> EngineConfig {
    log_config(64 << 10, 20, 16 << 20)
}

async fn setup(tag: &str) -> (TempDir, MemStore, DynStore) {
    let dir = TempDir::new(tag);
    let mem = MemStore::new();
    let store: DynStore = Arc::new(mem.clone());
    create_volume(&store, "v", 4 << 20).await.expect("create");
    (dir, mem, store)
}

/// Opens volume `name` of `store` (files in `dir`), which must fail with `kind` and a
/// message that contains `says`.
async fn assert_open_fails(
    store: &DynStore,
    name: &str,
    dir: &TempDir,
    kind: ErrorKind,
    says: &str,
) {
    let e = open_volume(store.clone(), name, dir.path(), config())
        .await
        .err()
        .unwrap_or_else(|| panic!("volume {name} opened"));
    assert_eq!(e.kind, kind, "{e}");
    assert!(e.to_string().contains(says), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_volumes_are_not_found_and_bad_names_bad_input() {
    let (dir, _mem, store) = setup("kinds-missing").await;
    assert_open_fails(
        &store,
        "nosuch",
        &dir,
        ErrorKind::NotFound,
        "no volume 'nosuch'",
    )
    .await;
    let e = read_meta(&store, "nosuch").await.expect_err("missing");
    assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
    let e = inspect_volume(&store, "nosuch").await.expect_err("missing");
    assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
    assert!(
        !dir.path().join("nosuch.wlog").exists(),
        "no write log for a missing volume"
    );

    assert_open_fails(&store, "../x", &dir, ErrorKind::BadInput, "").await;
    let e = create_volume(&store, "v", 4 << 20)
        .await
        .expect_err("exists");
    assert_eq!(e.kind, ErrorKind::AlreadyExists, "{e}");
    let e = create_volume(&store, "w", 1000)
        .await
        .expect_err("bad size");
    assert_eq!(e.kind, ErrorKind::BadInput, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_bad_input_and_a_closed_volume_says_why() {
    let (dir, _mem, store) = setup("kinds-requests").await;
    let (vol, _) = open_v(&store, dir.path(), config(), "open").await;
    let e = vol
        .write(100, vec![1; 512], false)
        .await
        .expect_err("misaligned");
    assert_eq!(e.kind, ErrorKind::BadInput, "{e}");
    assert_eq!(e.to_string(), "request not aligned to 512 bytes");
    let e = vol.read(4 << 20, 512).await.expect_err("beyond the end");
    assert_eq!(e.kind, ErrorKind::BadInput, "{e}");
    let e = vol
        .write_zeroes(0, 100, false)
        .await
        .expect_err("misaligned");
    assert_eq!(e.kind, ErrorKind::BadInput, "{e}");
    let e = vol
        .allocation(0, (4 << 20) + 512)
        .expect_err("beyond the end");
    assert_eq!(e.kind, ErrorKind::BadInput, "{e}");
    // The NBD side sees EINVAL for these (see error.rs), not EIO.
    let io = std::io::Error::from(e);
    assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput);

    vol.write(0, vec![1; 4096], false).await.expect("write");
    vol.shutdown().await.expect("shutdown");
    let e = vol
        .write(0, vec![2; 4096], false)
        .await
        .expect_err("closed");
    assert_eq!(e.kind, ErrorKind::ShuttingDown, "{e}");
    drop(vol);

    let (vol, _) = open_v(&store, dir.path(), config(), "reopen").await;
    vol.crash();
    let e = vol
        .write(0, vec![3; 4096], false)
        .await
        .expect_err("failed");
    assert_eq!(e.kind, ErrorKind::VolumeFailed, "{e}");
    let e = vol.flush().await.expect_err("failed");
    assert_eq!(e.kind, ErrorKind::VolumeFailed, "{e}");
    let e = vol.shutdown().await.expect_err("not clean");
    assert_eq!(e.kind, ErrorKind::VolumeFailed, "{e}");
}

/// The checkpoints in `mem`: (sequence number, key).
fn checkpoints(mem: &MemStore) -> Vec<(u64, String)> {
    mem.snapshot()
        .iter()
        .filter_map(|(k, _)| {
            parse_object_name(k)
                .filter(|n| n.kind == ObjectKind::Checkpoint)
                .map(|n| (n.seq, k.clone()))
        })
        .collect()
}

/// Damage object `key` of `store`: its last byte flipped.
async fn flip_last_byte(store: &DynStore, key: &str) {
    let mut bytes = store.get(key).await.expect("get");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    store
        .put(key, bytes.into(), PutMode::Overwrite)
        .await
        .expect("overwrite");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_checkpoint_is_passed_over_and_data_loss_beyond_it_is_named() {
    let (dir, mem, store) = setup("kinds-checkpoint").await;
    let (vol, _) = open_v(&store, dir.path(), config(), "open").await;
    for b in 0..8u64 {
        vol.write(b * 4096, vec![b as u8 + 1; 4096], false)
            .await
            .expect("write");
    }
    vol.shutdown()
        .await
        .expect("shutdown writes a clean checkpoint");
    drop(vol);
    let (checkpoint, key) = checkpoints(&mem).into_iter().max().expect("a checkpoint");
    flip_last_byte(&store, &key).await;
    // Passed over: every object from the first on is there, so replaying them all
    // gives the same volume.
    let what = "recovery passes over the damaged checkpoint";
    let (vol, rep) = open_v(&store, dir.path(), config(), what).await;
    assert_eq!(rep.checkpoints_skipped, vec![checkpoint], "{rep:?}");
    for b in 0..8u64 {
        let got = vol.read(b * 4096, 4096).await.expect("read");
        assert!(got.iter().all(|&x| x == b as u8 + 1), "block {b}");
    }
    vol.shutdown().await.expect("shutdown");
    drop(vol);
    // With the first object gone too, nothing can stand in for it: data loss, naming
    // the checkpoint.
    let (first, first_key) = mem
        .snapshot()
        .iter()
        .filter_map(|(k, _)| parse_object_name(k).map(|n| (n.seq, k.clone())))
        .min()
        .expect("objects");
    // Corrupt the checkpoints written since (the first one already is).
    for (_, key) in checkpoints(&mem).iter().filter(|c| c.0 != checkpoint) {
        flip_last_byte(&store, key).await;
    }
    store.delete(&first_key).await.expect("delete");
    let e = match open_volume(store.clone(), "v", dir.path(), config()).await {
        Ok((_, rep)) => panic!(
            "opened without object {first}: {rep:?} {:?}",
            mem.snapshot()
        ),
        Err(e) => e,
    };
    assert_eq!(e.kind, ErrorKind::DataLoss, "{e}");
    assert!(
        e.to_string().contains("cannot be used"),
        "names the checkpoint: {e}"
    );
    let e = inspect_volume(&store, "v").await;
    assert!(e.is_ok(), "inspect reports, it does not refuse");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_log_of_another_volume_is_a_conflict() {
    let (dir, _mem, store) = setup("kinds-foreign-log").await;
    create_volume(&store, "w", 4 << 20).await.expect("create w");
    let (vol, _) = open_v(&store, dir.path(), config(), "open").await;
    vol.write(0, vec![1; 4096], true).await.expect("write");
    vol.shutdown().await.expect("shutdown");
    drop(vol);
    std::fs::copy(dir.path().join("v.wlog"), dir.path().join("w.wlog")).expect("copy");
    let says = "belongs to another volume";
    assert_open_fails(&store, "w", &dir, ErrorKind::Conflict, says).await;
}

/// A write log whose cache superblock is of a newer version than this build reads is
/// refused with an error naming the version, and left as it was: never taken for an
/// empty log (or one that ends early), which would drop the writes it holds. This is
/// what keeps builds before version-5 records off logs that hold them
/// (docs/SEMANTICS.md, "After a crash with the cache intact").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_log_of_a_newer_format_is_refused_and_left_alone() {
    use lsvd_core::format::cache_super::{CACHE_SUPER_BYTES, CACHE_SUPER_VERSION};
    let (dir, _mem, store) = setup("kinds-newer-log").await;
    let (vol, _) = open_v(&store, dir.path(), config(), "open").await;
    vol.write(0, vec![7; 4096], true).await.expect("write");
    vol.shutdown().await.expect("shutdown");
    drop(vol);
    let path = dir.path().join("v.wlog");
    let original = std::fs::read(&path).expect("read log");
    // Both superblock copies relabelled one version on, their CRCs (over 112 bytes)
    // refitted: what a newer build would leave.
    let mut newer = original.clone();
    for at in [0, CACHE_SUPER_BYTES] {
        let sb = &mut newer[at..at + 112];
        sb[8..10].copy_from_slice(&(CACHE_SUPER_VERSION + 1).to_le_bytes());
        sb[12..16].fill(0);
        let crc = crc32c::crc32c(sb);
        sb[12..16].copy_from_slice(&crc.to_le_bytes());
    }
    std::fs::write(&path, &newer).expect("write log");
    let says = format!("unsupported format version {}", CACHE_SUPER_VERSION + 1);
    assert_open_fails(&store, "v", &dir, ErrorKind::Corrupt, &says).await;
    assert!(
        std::fs::read(&path).expect("read log") == newer,
        "a refused log is not rewritten"
    );
    // Put back as this build wrote it, the log opens and the data is there.
    std::fs::write(&path, &original).expect("restore log");
    let (vol, _) = open_v(&store, dir.path(), config(), "reopen").await;
    assert_eq!(vol.read(0, 4096).await.expect("read"), vec![7; 4096]);
    vol.shutdown().await.expect("shutdown");
}
