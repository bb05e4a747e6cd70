//! Recovery reads past a bad copy too: a mirrored chain whose first copy of the newest
//! checkpoint, or of an object header replayed after it, has a flipped byte still
//! opens from that checkpoint (not an older one) with every write intact.

use std::path::PathBuf;

use super::copy_fallback_tests::{BLOCK, config, first_data_object, flip_byte, mirrored};
use crate::open_volume;
use crate::test_support::{block_data, create_and_open, no_gc, settle, verify};
use lsvd_store::open_store;
use lsvd_store::testutil::TempDir;

/// The newest checkpoint object in any first copy: (its path, its sequence number).
fn newest_checkpoint(pos: &[[PathBuf; 2]]) -> (PathBuf, u64) {
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    for [first, _] in pos {
        for e in std::fs::read_dir(first.join("v/obj"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "c")
                && let Some(seq) = p
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .and_then(|s| s.split('.').next())
                    .and_then(|s| u64::from_str_radix(s, 16).ok())
            {
                found.push((seq, p));
            }
        }
    }
    let (seq, path) = found.into_iter().max().expect("a checkpoint on some drive");
    (path, seq)
}

/// Write 256 KiB to "v" (every block stamped), then stop it: cleanly (a checkpoint
/// last) or by a crash after the objects are in the store (objects after the newest
/// checkpoint, which recovery reads the headers of). Returns the model.
async fn written(url: &str, clean: bool) -> Vec<u64> {
    let store = open_store(url).expect("open store");
    let dir = TempDir::new("copy-fallback-recovery");
    let (volume, _) = create_and_open(&store, "v", 512 * BLOCK, dir.path(), config(no_gc())).await;
    let mut model = vec![0u64; 512];
    let mut data = Vec::new();
    for (b, m) in model.iter_mut().enumerate().take(64) {
        *m = 7;
        data.extend_from_slice(&block_data(b as u64, 7));
    }
    volume.write(0, data, false).await.expect("write");
    volume.sync_to_store().await.expect("sync");
    settle(&volume).await;
    if clean {
        volume.shutdown().await.expect("shutdown");
    } else {
        volume.crash();
    }
    model
}

async fn reopen_and_check(url: &str, model: &[u64], skipped: &[u64]) {
    let store = open_store(url).expect("open store");
    let dir = TempDir::new("copy-fallback-recovery-2");
    let (volume, report) = open_volume(store, "v", dir.path(), config(no_gc()))
        .await
        .expect("the volume opens past the bad copy");
    assert_eq!(report.checkpoints_skipped, skipped);
    verify(&volume, model).await;
    volume.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_first_copy_of_the_newest_checkpoint_is_read_from_its_mirror() {
    for offset in [20u64, 200] {
        let root = TempDir::new("copy-fallback-ckp");
        let (url, pos) = mirrored(&root);
        let model = written(&url, true).await;
        let (path, _) = newest_checkpoint(&pos);
        // 20: in the object header; 200: in the checkpoint payload.
        let len = std::fs::metadata(&path).expect("stat").len();
        flip_byte(&path, offset.min(len - 1));
        reopen_and_check(&url, &model, &[]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_first_copy_of_a_replayed_object_header_is_read_from_its_mirror() {
    let root = TempDir::new("copy-fallback-hdr");
    let (url, pos) = mirrored(&root);
    let model = written(&url, false).await;
    let (bad, _) = first_data_object(&pos);
    flip_byte(&bad, 20);
    reopen_and_check(&url, &model, &[]).await;
}
