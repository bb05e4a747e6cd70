//! `Volume::resize`: a grow makes the new range writable and survives restarts (from
//! the write log and from the store alone); a snapshot keeps its size; a shrink needs
//! `allow_shrink`, refuses I/O past the new end, even from writes in flight, and a grow
//! after it reads zeros there; a resize stopped at any store mutation leaves the old
//! size or the new one, with the data intact.

use std::sync::Arc;

use crate::lifecycle::snapshot_tests::{
    BLOCK, BLOCKS, assert_kind, config, stamp, written_over_faults, written_volume,
};
use crate::test_support::{open_v, poll_until, wait_until};
use crate::{EngineConfig, Volume, inspect_volume, open_snapshot};
use lsvd_core::error::ErrorKind;
use lsvd_store::DynStore;
use lsvd_store::testutil::TempDir;

/// The version each of blocks `[from, to)` holds (0: zeros), each checked whole.
async fn versions_in(volume: &Volume, from: u64, to: u64) -> Vec<u64> {
    let mut out = Vec::new();
    for b in from..to {
        let block = volume.read(b * BLOCK, BLOCK).await.expect("read");
        if block.iter().all(|&x| x == 0) {
            out.push(0);
            continue;
        }
        let version = u64::from_le_bytes(block[8..16].try_into().expect("8 bytes"));
        assert_eq!(block, stamp(b, version), "block {b} is torn");
        out.push(version);
    }
    out
}

async fn write_range(volume: &Volume, from: u64, to: u64, version: u64) {
    for b in from..to {
        volume
            .write(b * BLOCK, stamp(b, version), false)
            .await
            .expect("write");
    }
}

async fn reopen(store: &DynStore, dir: &std::path::Path, cfg: EngineConfig) -> Arc<Volume> {
    open_v(store, dir, cfg, "reopen").await.0
}

/// Reopens volume "v" of `store` (files in `dir`) and asserts it has one block per
/// entry of `want`, each at the version `want` says.
async fn reopened_holds(store: &DynStore, dir: &std::path::Path, want: &[u64]) -> Arc<Volume> {
    let vol = reopen(store, dir, config()).await;
    let blocks = want.len() as u64;
    assert_eq!(vol.size_bytes(), blocks * BLOCK);
    assert_eq!(versions_in(&vol, 0, blocks).await, want);
    vol
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grow_and_shrink_hold_through_restarts_and_snapshots_keep_their_size() {
    let (store, dir, vol) = written_volume("engine-resize").await;
    vol.create_snapshot("small").await.expect("snapshot");
    assert_kind(
        vol.write(BLOCKS * BLOCK, stamp(BLOCKS, 2), false).await,
        ErrorKind::BadInput,
    );
    assert_kind(
        vol.resize(BLOCKS * BLOCK + 512, false).await,
        ErrorKind::BadInput,
    );
    assert_kind(vol.resize(0, false).await, ErrorKind::BadInput);

    // Grow to twice the size and write the new half.
    let r = vol.resize(2 * BLOCKS * BLOCK, false).await.expect("grow");
    assert_eq!(
        (r.old_size_bytes, r.new_size_bytes),
        (BLOCKS * BLOCK, 2 * BLOCKS * BLOCK)
    );
    assert_eq!(vol.size_bytes(), 2 * BLOCKS * BLOCK);
    assert_eq!(versions_in(&vol, BLOCKS, BLOCKS + 4).await, vec![0; 4]);
    write_range(&vol, BLOCKS, 2 * BLOCKS, 2).await;
    assert_eq!(
        vol.resize(2 * BLOCKS * BLOCK, false)
            .await
            .expect("same size"),
        crate::Resized {
            old_size_bytes: 2 * BLOCKS * BLOCK,
            new_size_bytes: 2 * BLOCKS * BLOCK
        }
    );
    // A crash with the new half only in the write log, then a restart from the log.
    vol.crash();
    drop(vol);
    let mut want = vec![1; BLOCKS as usize];
    want.extend(vec![2; BLOCKS as usize]);
    let vol = reopened_holds(&store, dir.path(), &want).await;
    vol.shutdown().await.expect("shutdown");
    // From the store alone.
    let other = TempDir::new("engine-resize-store-only");
    let vol = reopened_holds(&store, other.path(), &want).await;
    assert_eq!(
        inspect_volume(&store, "v").await.expect("info").size_bytes,
        2 * BLOCKS * BLOCK
    );

    // The snapshot was taken before the grow: it keeps the old size.
    let snap_dir = TempDir::new("engine-resize-snap");
    let (snap, _) = open_snapshot(store.clone(), "v", "small", snap_dir.path(), config())
        .await
        .expect("open snapshot");
    assert_eq!(snap.size_bytes(), BLOCKS * BLOCK);
    assert_kind(
        snap.resize(8 * BLOCKS * BLOCK, false).await,
        ErrorKind::ReadOnly,
    );
    snap.shutdown().await.expect("snapshot shutdown");

    // Shrink to half the original size: refused without allow_shrink.
    let half = BLOCKS / 2;
    assert_kind(vol.resize(half * BLOCK, false).await, ErrorKind::BadInput);
    assert_eq!(vol.size_bytes(), 2 * BLOCKS * BLOCK);
    vol.resize(half * BLOCK, true).await.expect("shrink");
    assert_eq!(vol.size_bytes(), half * BLOCK);
    assert_kind(vol.read(half * BLOCK, BLOCK).await, ErrorKind::BadInput);
    assert_kind(
        vol.write(half * BLOCK, stamp(half, 3), false).await,
        ErrorKind::BadInput,
    );
    assert_eq!(versions_in(&vol, 0, half).await, vec![1; half as usize]);
    // Growing again shows zeros where the cut-off data was, live and after restarts.
    vol.resize(2 * BLOCKS * BLOCK, false)
        .await
        .expect("grow again");
    let mut want = vec![1; half as usize];
    want.extend(vec![0; (2 * BLOCKS - half) as usize]);
    assert_eq!(versions_in(&vol, 0, 2 * BLOCKS).await, want);
    vol.crash();
    drop(vol);
    let vol = reopened_holds(&store, other.path(), &want).await;
    vol.shutdown().await.expect("shutdown");
    let third = TempDir::new("engine-resize-store-only-2");
    let vol = reopened_holds(&store, third.path(), &want).await;
    vol.shutdown().await.expect("shutdown");
}

/// Writes past the new end that race with a shrink either land before it (and are
/// then cut off) or fail with `BadInput`; the volume never fails, and a grow after it
/// reads zeros there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shrink_racing_writes_past_the_new_end_never_fails_the_volume() {
    let (store, _dir, vol) = written_volume("engine-resize-race").await;
    let half = BLOCKS / 2;
    let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = {
        let (vol, written) = (vol.clone(), written.clone());
        tokio::spawn(async move {
            let mut refused = 0;
            for round in 0..4 {
                for b in half..BLOCKS {
                    match vol.write(b * BLOCK, stamp(b, 2 + round), false).await {
                        Ok(()) => {
                            written.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(e) => {
                            assert_eq!(e.kind, ErrorKind::BadInput, "{e}");
                            refused += 1;
                        }
                    }
                }
            }
            refused
        })
    };
    wait_until("the writer's first write", async || {
        written.load(std::sync::atomic::Ordering::Relaxed) > 0
    })
    .await;
    vol.resize(half * BLOCK, true).await.expect("shrink");
    let refused = writer.await.expect("writer");
    assert!(refused > 0, "no write was refused after the shrink");
    vol.resize(BLOCKS * BLOCK, false).await.expect("grow");
    let mut want = vec![1; half as usize];
    want.extend(vec![0; (BLOCKS - half) as usize]);
    assert_eq!(versions_in(&vol, 0, BLOCKS).await, want);
    vol.sync_to_store()
        .await
        .expect("sync: the volume did not fail");
    vol.shutdown().await.expect("shutdown");
    let other = TempDir::new("engine-resize-race-store-only");
    let vol = reopen(&store, other.path(), config()).await;
    assert_eq!(versions_in(&vol, 0, BLOCKS).await, want);
    vol.shutdown().await.expect("shutdown");
}

/// A grow stopped at every store mutation: after a crash the volume has its old size
/// or (always, if the resize returned) its new one, and its data either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_stopped_at_any_store_mutation_leaves_the_old_size_or_the_new() {
    let mut finished = false;
    for n in 0..32u64 {
        let dir = TempDir::new("engine-resize-stopped");
        let (mem, faulty, vol) = written_over_faults(n, &dir).await;
        faulty.kill_after_mutations(n);
        // Uploads retry a dead store forever, and a resize waits for its object like
        // `sync` does: once the store is gone, give it a moment, then crash.
        let gone = async {
            wait_until("the store's kill", async || faulty.is_killed()).await;
            // The moment: nothing to poll for but the resize returning.
            poll_until(std::time::Duration::from_millis(300), async || false).await;
        };
        let returned = tokio::select! {
            r = vol.resize(2 * BLOCKS * BLOCK, false) => r.is_ok(),
            () = gone => false,
        };
        finished = returned && !faulty.is_killed();
        vol.crash();
        drop(vol);
        for from_log in [true, false] {
            let other = TempDir::new("engine-resize-stopped-store-only");
            let at = if from_log { dir.path() } else { other.path() };
            let vol = reopen(&mem, at, config()).await;
            let size = vol.size_bytes();
            assert!(
                size == BLOCKS * BLOCK || size == 2 * BLOCKS * BLOCK,
                "n={n}: size {size}"
            );
            if returned {
                assert_eq!(size, 2 * BLOCKS * BLOCK, "n={n}: the resize returned");
            }
            assert_eq!(
                versions_in(&vol, 0, BLOCKS).await,
                vec![1; BLOCKS as usize],
                "n={n} from_log={from_log}"
            );
            vol.shutdown().await.expect("shutdown");
        }
        if finished {
            break;
        }
    }
    assert!(finished, "the resize never finished within 32 mutations");
}
