//! `Volume::changes`: what changed since a snapshot, read from a live volume and from
//! a later snapshot, through garbage collection that moves the snapshot's data.

use lsvd_core::changes::Change;

use crate::lifecycle::snapshot_tests::{BLOCK, BLOCKS, config, stamp, written_volume};
use crate::{Volume, open_snapshot};
use lsvd_core::error::ErrorKind;

/// The blocks `changes` reports as changed (Data or Zero), and which were zeroed.
async fn changed_blocks(vol: &Volume, snap: Option<&str>) -> (Vec<u64>, Vec<u64>) {
    let base = vol.change_base(snap).await.expect("change base");
    let runs = vol
        .changes(&base, 0, BLOCKS * BLOCK)
        .await
        .expect("changes");
    assert_eq!(runs.iter().map(|r| r.0).sum::<u64>(), BLOCKS * BLOCK);
    let (mut changed, mut zeroed) = (Vec::new(), Vec::new());
    let mut at = 0;
    for (bytes, change) in runs {
        assert_eq!(bytes % BLOCK, 0, "runs are whole blocks here");
        for b in at / BLOCK..(at + bytes) / BLOCK {
            match change {
                Change::Same => {}
                Change::Data => changed.push(b),
                Change::Zero => {
                    changed.push(b);
                    zeroed.push(b);
                }
            }
        }
        at += bytes;
    }
    (changed, zeroed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_since_a_snapshot_are_the_blocks_written_or_zeroed_since() {
    let (store, dir, vol) = written_volume("engine-changes").await;
    // Against the empty volume, everything written is new.
    let (all, none) = changed_blocks(&vol, None).await;
    assert_eq!(all.len() as u64, BLOCKS);
    assert!(none.is_empty());

    vol.create_snapshot("s1").await.expect("snapshot");
    assert_eq!(changed_blocks(&vol, Some("s1")).await, (vec![], vec![]));

    // Written since: blocks 5 and 100..110 (still in the write log), zeroed: 200..204.
    vol.write(5 * BLOCK, stamp(5, 2), false)
        .await
        .expect("write");
    for b in 100..110 {
        vol.write(b * BLOCK, stamp(b, 2), false)
            .await
            .expect("write");
    }
    vol.write_zeroes(200 * BLOCK, 4 * BLOCK, false)
        .await
        .expect("zero");
    let mut want: Vec<u64> = [5].into_iter().chain(100..110).chain(200..204).collect();
    let want_zeroed: Vec<u64> = (200..204).collect();
    assert_eq!(
        changed_blocks(&vol, Some("s1")).await,
        (want.clone(), want_zeroed.clone()),
        "from the write log"
    );
    // The same once it is all in objects.
    vol.sync_to_store().await.expect("sync");
    assert_eq!(
        changed_blocks(&vol, Some("s1")).await,
        (want.clone(), want_zeroed.clone()),
        "from the store"
    );

    // A later snapshot, opened on its own, says the same against s1.
    vol.create_snapshot("s2").await.expect("snapshot");
    let (s2, _) = open_snapshot(store.clone(), "v", "s2", dir.path(), config())
        .await
        .expect("open s2");
    assert_eq!(
        changed_blocks(&s2, Some("s1")).await,
        (want.clone(), want_zeroed.clone()),
        "snapshot s2 against s1"
    );
    assert_eq!(changed_blocks(&s2, Some("s2")).await, (vec![], vec![]));
    let newer = s2.change_base(Some("s3")).await;
    assert!(matches!(newer, Err(e) if e.kind == ErrorKind::NotFound));
    s2.shutdown().await.expect("shutdown s2");

    // Overwrite the even blocks again and again: GC moves the odd blocks' data (from
    // before s1) into gc objects newer than s1, which must still count as unchanged.
    for v in 3..7 {
        for b in (0..BLOCKS).step_by(2) {
            vol.write(b * BLOCK, stamp(b, v), false)
                .await
                .expect("write");
        }
    }
    vol.sync_to_store().await.expect("sync");
    assert!(
        vol.status().gc_passes > 0,
        "GC never ran: {:?}",
        vol.status()
    );
    let moved_since_s1 = {
        let base = vol.change_base(Some("s1")).await.expect("base");
        vol.store_map_snapshot()
            .iter()
            .filter(|p| p.2 >= base.through_seq() && (p.0 / 8) % 2 == 1)
            .count()
    };
    assert!(
        moved_since_s1 > 0,
        "GC moved none of the odd blocks: the test proves nothing"
    );
    want.extend((0..BLOCKS).step_by(2));
    want.sort_unstable();
    want.dedup();
    let (changed, zeroed) = changed_blocks(&vol, Some("s1")).await;
    // The even ones of the zeroed blocks were written again.
    assert_eq!(zeroed, vec![201, 203]);
    assert_eq!(
        changed, want,
        "after GC ({moved_since_s1} odd pieces moved)"
    );
    vol.shutdown().await.expect("shutdown");
}
