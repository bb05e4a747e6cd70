//! Crash leftovers (a tail move recorded on one drive only, temporary files, a
//! creation stopped halfway) and the store self-test, on chain and stripe.

use super::chain_store::ChainStore;
use super::drives::parse_spec;
use super::meta::{DriveRecord, read_drive_record, write_drive_record};
use super::tests::{check, dirs, futures_block, holders, keys, keys_async, obj, put, url};
use crate::open_store;
use crate::testutil::TempDir;

/// Leftovers of crashes: a tail move recorded on one drive only (the highest
/// generation wins), temporary files of unfinished puts and record writes (ignored),
/// a creation stopped after the first drive (finished). Every object is found.
#[test]
fn crash_leftovers_lose_nothing() {
    let root = TempDir::new("chain-crash");
    let d = dirs(&root, 3);
    let u = url("chain", &d, "?drive_size=64K");
    futures_block(async {
        let s = open_store(&u).expect("open");
        for seq in 0..6 {
            put(&*s, &obj(seq, 'd'), 16 << 10).await;
        }
    });
    // The tail is on drive 1 (generation 2). A crash while moving it to drive 2:
    // only drive 2's record was replaced.
    let r1 = read_drive_record(&d[1]).expect("read").expect("record");
    assert_eq!((r1.tail_index, r1.generation), (1, 2));
    write_drive_record(
        &d[2],
        &DriveRecord {
            drive_index: 2,
            tail_index: 2,
            generation: 3,
            ..r1
        },
    )
    .expect("half a move");
    std::fs::write(d[0].join(".tmp.chain.1.0"), b"half a record").expect("tmp");
    std::fs::write(d[1].join("v/obj/.tmp.77.0"), b"half an object").expect("tmp");
    let s = ChainStore::open(&parse_spec("chain", &u["chain:".len()..]).expect("spec"))
        .expect("reopen");
    assert_eq!(s.tail(), 2);
    let all = keys(&s, "");
    assert_eq!(all, (0..6).map(|q| obj(q, 'd')).collect::<Vec<_>>());
    futures_block(async {
        for seq in 0..6 {
            check(&s, &obj(seq, 'd'), 16 << 10).await;
        }
        put(&s, &obj(6, 'd'), 100).await;
    });
    assert_eq!(holders(&d, &obj(6, 'd')), vec![2]);
    // A creation that stopped after writing drive 0's record: finished at open.
    let root = TempDir::new("chain-crash-create");
    let d = dirs(&root, 3);
    for p in &d {
        std::fs::create_dir_all(p).expect("mkdir");
    }
    let first = DriveRecord {
        chain_id: [7; 16],
        generation: 0,
        layout: super::meta::Layout::Chain,
        drive_count: 3,
        drive_index: 0,
        tail_index: 0,
        copies: 1,
        mirror_stale: false,
    };
    write_drive_record(&d[0], &first).expect("drive 0 only");
    drop(open_store(&url("chain", &d, "")).expect("finish creation"));
    for (i, p) in d.iter().enumerate() {
        let r = read_drive_record(p).expect("read").expect("record");
        assert_eq!(
            (r.chain_id, usize::from(r.drive_index), r.generation),
            ([7; 16], i, 1)
        );
    }
}

/// The store self-test (put-if-absent, races, ranges, listing) passes on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_test_passes_on_chain_and_stripe() {
    for scheme in ["chain", "stripe"] {
        let root = TempDir::new("chain-selftest");
        let s = open_store(&url(scheme, &dirs(&root, 3), "")).expect("open");
        let report = crate::selftest::run(&*s).await.expect("self-test");
        assert!(report.checks.len() >= 7, "{scheme}: {report}");
        assert!(keys_async(&*s).await.is_empty(), "{scheme}: probes removed");
    }
}
