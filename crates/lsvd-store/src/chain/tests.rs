//! Tests of the chained and striped stores on temporary directories: round trips and
//! reopening, listing order, put-if-absent across drives, the tail moving and wrapping,
//! GC placement, refused configurations (crash leftovers and the self-test:
//! recovery_tests.rs). The helpers are shared with the other test modules.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

use super::chain_store::ChainStore;
use super::drives::parse_spec;
use super::meta::{DRIVE_RECORD_NAME, read_drive_record};
use crate::testutil::TempDir;
use crate::{DynStore, ObjectStore, Placement, PutMode, open_store};
use lsvd_core::error::ErrorKind;

pub(super) fn dirs(root: &TempDir, n: usize) -> Vec<PathBuf> {
    (0..n).map(|i| root.path().join(format!("d{i}"))).collect()
}

/// A chain of three drives under a new temporary directory (`tag`), opened with
/// `options`: the directory (kept while the test runs), the drives, the store.
fn chain_of_three(tag: &str, options: &str) -> (TempDir, Vec<PathBuf>, ChainStore) {
    let root = TempDir::new(tag);
    let d = dirs(&root, 3);
    let s = open_chain(&d, options);
    (root, d, s)
}

pub(super) fn url(scheme: &str, dirs: &[PathBuf], options: &str) -> String {
    let list: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    format!("{scheme}:{}{options}", list.join(","))
}

pub(super) fn open_chain(dirs: &[PathBuf], options: &str) -> ChainStore {
    let spec =
        parse_spec("chain", &url("chain", dirs, options)["chain:".len()..]).expect("valid spec");
    ChainStore::open(&spec).expect("open chain")
}

pub(super) fn obj(seq: u64, kind: char) -> String {
    format!("v/obj/{seq:016x}.{kind}")
}

/// Bytes that name their key, `len` long.
pub(super) fn body(key: &str, len: usize) -> Bytes {
    let mut v: Vec<u8> = key.bytes().cycle().take(len).collect();
    if let Some(first) = v.first_mut() {
        *first ^= len as u8;
    }
    Bytes::from(v)
}

/// Which drive directories hold `key`.
pub(super) fn holders(dirs: &[PathBuf], key: &str) -> Vec<usize> {
    (0..dirs.len())
        .filter(|&i| dirs[i].join(key).is_file())
        .collect()
}

pub(super) fn keys(store: &dyn ObjectStore, prefix: &str) -> Vec<String> {
    futures_block(crate::testutil::list_keys(store, prefix))
}

pub(super) fn futures_block<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

pub(super) async fn put(s: &dyn ObjectStore, key: &str, len: usize) {
    s.put(key, body(key, len), PutMode::IfAbsent)
        .await
        .unwrap_or_else(|e| panic!("put {key}: {e}"));
}

pub(super) async fn check(s: &dyn ObjectStore, key: &str, len: usize) {
    crate::testutil::assert_holds(s, key, &body(key, len)).await;
}

/// Puts, gets, ranges, list order and deletes on a chain and a stripe; then both are
/// reopened from their directories and hold the same keys with the same bytes.
#[test]
fn round_trip_and_reopen_on_chain_and_stripe() {
    for scheme in ["chain", "stripe"] {
        let root = TempDir::new("chain-roundtrip");
        let d = dirs(&root, 3);
        let u = url(scheme, &d, "");
        let names: Vec<String> = (0..40u64)
            .map(|i| obj(i, if i % 3 == 0 { 'g' } else { 'd' }))
            .chain(["v/meta".to_string(), "v/super/0000000000000001".into()])
            .collect();
        futures_block(async {
            let s = open_store(&u).expect("open");
            for (i, k) in names.iter().enumerate() {
                put(&*s, k, 100 + i).await;
            }
            for (i, k) in names.iter().enumerate() {
                check(&*s, k, 100 + i).await;
            }
            let r = s.get_range(&names[5], 3..10).await.expect("range");
            assert_eq!(r, body(&names[5], 105)[3..10]);
            s.delete(&names[0]).await.expect("delete");
            s.delete(&names[0]).await.expect("delete again");
            assert!(s.get(&names[0]).await.expect_err("deleted").is_not_found());
            assert!(
                s.get("v/obj/nothing")
                    .await
                    .expect_err("missing")
                    .is_not_found()
            );
        });
        let s = open_store(&u).expect("reopen");
        let mut want: Vec<String> = names[1..].to_vec();
        want.sort();
        assert_eq!(keys(&*s, ""), want, "{scheme}: every key, in order");
        let objs: Vec<String> = want
            .iter()
            .filter(|k| k.contains("/obj/"))
            .cloned()
            .collect();
        assert_eq!(keys(&*s, "v/obj/"), objs, "{scheme}");
        assert_eq!(
            keys(&*s, "v/obj/000000000000000"),
            objs[..15],
            "{scheme}: mid-name prefix"
        );
        futures_block(async {
            for (i, k) in names.iter().enumerate().skip(1) {
                check(&*s, k, 100 + i).await;
            }
        });
        let used: Vec<usize> = (0..3)
            .filter(|&i| names.iter().any(|k| d[i].join(k).is_file()))
            .collect();
        if scheme == "stripe" {
            assert_eq!(used, vec![0, 1, 2], "a stripe spreads its keys");
        } else {
            // Log objects all on the tail (drive 0 here); metadata keys at their home.
            for k in names[1..].iter().filter(|k| k.contains("/obj/")) {
                assert_eq!(holders(&d, k), vec![0], "{k}");
            }
        }
        for k in &names[1..] {
            assert_eq!(
                holders(&d, k).len(),
                1,
                "{scheme}: {k} on exactly one drive"
            );
        }
    }
}

/// A key is taken once, whichever drive holds it: after the tail moved past it, after
/// a reopen, when another process wrote it on another drive, and under a race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_if_absent_holds_across_drives() {
    let (_root, d, s) = chain_of_three("chain-ifabsent", "?drive_size=4K");
    put(&s, &obj(1, 'd'), 3000).await;
    put(&s, &obj(2, 'd'), 3000).await;
    assert_eq!(s.tail(), 1, "the second object did not fit drive 0");
    let again = s.put(&obj(1, 'd'), body("x", 10), PutMode::IfAbsent).await;
    assert_eq!(again.expect_err("taken").kind, ErrorKind::AlreadyExists);
    check(&s, &obj(1, 'd'), 3000).await;
    assert_eq!(holders(&d, &obj(1, 'd')), vec![0]);
    // Overwrite replaces it where it is.
    s.put(&obj(1, 'd'), body("y", 20), PutMode::Overwrite)
        .await
        .expect("overwrite");
    assert_eq!(holders(&d, &obj(1, 'd')), vec![0]);
    drop(s);
    let s = open_chain(&d, "?drive_size=4K");
    let again = s.put(&obj(1, 'd'), body("x", 10), PutMode::IfAbsent).await;
    assert_eq!(
        again.expect_err("taken after reopen").kind,
        ErrorKind::AlreadyExists
    );
    // Written behind the index's back on drive 2 (another process): still taken.
    std::fs::create_dir_all(d[2].join("v/obj")).expect("mkdir");
    std::fs::write(d[2].join(obj(9, 'd')), b"other").expect("write");
    let e = s.put(&obj(9, 'd'), body("x", 10), PutMode::IfAbsent).await;
    assert_eq!(
        e.expect_err("taken on drive 2").kind,
        ErrorKind::AlreadyExists
    );
    assert_eq!(
        s.get(&obj(9, 'd')).await.expect("found by looking"),
        b"other"
    );
    // Racing writers of one new key: exactly one wins, one copy exists.
    let store: DynStore = Arc::new(s.clone());
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8u8 {
        let store = store.clone();
        tasks.spawn(async move {
            store
                .put(&obj(20, 'd'), Bytes::from(vec![i; 100]), PutMode::IfAbsent)
                .await
        });
    }
    let mut won = 0;
    while let Some(r) = tasks.join_next().await {
        match r.expect("task") {
            Ok(()) => won += 1,
            Err(e) => assert_eq!(e.kind, ErrorKind::AlreadyExists, "{e}"),
        }
    }
    assert_eq!(won, 1);
    assert_eq!(holders(&d, &obj(20, 'd')).len(), 1);
}

/// Drives of 64 KiB, 16 KiB objects: four fill a drive, the tail moves on (recorded
/// on every drive, kept by a reopen), a full chain refuses with `Full` (it was
/// `Transient`, retried forever), and space GC frees on the first drive is used again
/// once the tail wraps round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_moves_when_a_drive_fills_and_wraps_to_freed_space() {
    let (_root, d, s) = chain_of_three("chain-tail", "?drive_size=64K");
    let size = 16 << 10;
    for seq in 0..12 {
        put(&s, &obj(seq, 'd'), size).await;
        assert_eq!(
            holders(&d, &obj(seq, 'd')),
            vec![seq as usize / 4],
            "object {seq}"
        );
    }
    assert_eq!(s.tail(), 2);
    assert_eq!(s.used_bytes(), vec![64 << 10; 3]);
    for (i, dir) in d.iter().enumerate() {
        let r = read_drive_record(dir).expect("read").expect("a record");
        assert_eq!(
            (r.tail_index, r.generation, usize::from(r.drive_index)),
            (2, 3, i),
            "generation 1 at creation, one more per move"
        );
    }
    let full = s
        .put(&obj(12, 'd'), body("x", size), PutMode::IfAbsent)
        .await;
    assert_eq!(full.expect_err("no room").kind, ErrorKind::Full);
    assert!(holders(&d, &obj(12, 'd')).is_empty());
    // Reopened: the tail is where it was.
    drop(s);
    let s = open_chain(&d, "?drive_size=64K");
    assert_eq!(s.tail(), 2);
    // GC frees two objects on drive 0: the chain wraps round to it.
    s.delete(&obj(0, 'd')).await.expect("delete");
    s.delete(&obj(1, 'd')).await.expect("delete");
    put(&s, &obj(12, 'd'), size).await;
    put(&s, &obj(13, 'd'), size).await;
    assert_eq!(holders(&d, &obj(12, 'd')), vec![0]);
    assert_eq!(holders(&d, &obj(13, 'd')), vec![0]);
    assert_eq!(s.tail(), 0);
    for seq in 2..14 {
        check(&s, &obj(seq, 'd'), size).await;
    }
}

/// Compact-in-body: GC output goes to its victims' drive, or (victims on the tail) to
/// another body drive, never to the tail; move-to-tail sends it to the tail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_output_goes_to_the_body_unless_move_to_tail() {
    for (options, body_expected) in [
        ("?drive_size=64K", true),
        ("?drive_size=64K&gc=move-to-tail", false),
    ] {
        let (_root, d, s) = chain_of_three("chain-gc", options);
        // Drive 0: objects 0..3 (full), tail on drive 1 with object 4.
        for seq in 0..5 {
            put(&s, &obj(seq, 'd'), 16 << 10).await;
        }
        assert_eq!(s.tail(), 1);
        s.delete(&obj(0, 'd')).await.expect("a victim gone");
        let gc = |victims: &[u64]| Placement::Gc {
            victim_keys: victims.iter().map(|&v| obj(v, 'd')).collect(),
        };
        // Victims on drive 0 (which has room for one more): there.
        s.put_placed(
            &obj(10, 'g'),
            body("g", 8 << 10),
            PutMode::IfAbsent,
            &gc(&[1, 2]),
        )
        .await
        .expect("gc put");
        // A victim on the tail: to the body drive with most room (drive 2).
        s.put_placed(
            &obj(11, 'g'),
            body("g", 8 << 10),
            PutMode::IfAbsent,
            &gc(&[4]),
        )
        .await
        .expect("gc put");
        let c = s.drive_counters();
        if body_expected {
            assert_eq!(holders(&d, &obj(10, 'g')), vec![0]);
            assert_eq!(holders(&d, &obj(11, 'g')), vec![2]);
            assert_eq!(c[1].gc_puts, 0, "{c:?}");
            assert_eq!(s.gc_puts_to_tail(), 0);
        } else {
            assert_eq!(holders(&d, &obj(10, 'g')), vec![1]);
            assert_eq!(holders(&d, &obj(11, 'g')), vec![1]);
            assert_eq!(c[1].gc_puts, 2, "{c:?}");
            assert_eq!(s.gc_puts_to_tail(), 2);
        }
        assert_eq!(s.tail(), 1, "GC output never moves the tail here");
    }
}

fn open_err(u: &str) -> lsvd_core::error::Error {
    match open_store(u) {
        Ok(s) => panic!("{u} opened as {}", s.describe()),
        Err(e) => e,
    }
}

/// Asserts that opening `u` fails with `kind`, the message saying `words`.
fn assert_refused(u: &str, kind: ErrorKind, words: &str) {
    let e = open_err(u);
    assert_eq!(e.kind, kind, "{u}: {e}");
    assert!(e.to_string().contains(words), "{u}: {e}");
}

/// Mistakes in the URL or the drives: clear errors, nothing opened, nothing panics.
#[test]
fn bad_urls_and_wrong_drives_are_refused() {
    let root = TempDir::new("chain-bad");
    let d = dirs(&root, 3);
    // Every one of these is bad input.
    for (u, words) in [
        ("chain:".to_string(), "no directories"),
        ("stripe:".to_string(), "no directories"),
        (
            format!("chain:{},,{}", d[0].display(), d[1].display()),
            "empty",
        ),
        (format!("chain:{0},{0}", d[0].display()), "twice"),
        (format!("chain:{0},{0}/.", d[0].display()), "twice"),
        (url("chain", &d, "?drive_size=0"), "drive_size"),
        (url("chain", &d, "?drive_size=lots"), "invalid size"),
        (url("chain", &d, "?gc=sometimes"), "gc placement"),
        (url("chain", &d, "?mirror=1"), "unknown option"),
        (url("stripe", &d, "?gc=move-to-tail"), "unknown option"),
    ] {
        assert_refused(&u, ErrorKind::BadInput, words);
    }
    // A chain of three exists from here on.
    drop(open_store(&url("chain", &d, "")).expect("create"));
    let root2 = TempDir::new("chain-bad-2");
    let e2 = dirs(&root2, 2);
    drop(open_store(&url("chain", &e2, "")).expect("another chain"));
    let cases = [
        (
            vec![d[0].clone(), d[1].clone(), e2[1].clone()],
            ErrorKind::Conflict,
            "another set",
        ),
        (
            vec![d[1].clone(), d[0].clone(), d[2].clone()],
            ErrorKind::BadInput,
            "keep the order",
        ),
        (
            vec![d[0].clone(), d[1].clone()],
            ErrorKind::BadInput,
            "3 drives, 2 given",
        ),
        (
            vec![d[0].clone(), d[1].clone(), root.path().join("blank")],
            ErrorKind::Conflict,
            "no drive record",
        ),
    ];
    for (list, kind, words) in cases {
        assert_refused(&url("chain", &list, ""), kind, words);
    }
    assert_eq!(
        open_err(&url("stripe", &d, "")).kind,
        ErrorKind::BadInput,
        "a chain is not a stripe"
    );
    // Drive 2 lost and replaced by a blank directory, once the chain holds objects.
    let s = open_store(&url("chain", &d, "")).expect("open");
    futures_block(put(&*s, &obj(1, 'd'), 10));
    drop(s);
    std::fs::remove_dir_all(&d[2]).expect("lose drive 2");
    assert_refused(
        &url("chain", &d, ""),
        ErrorKind::Conflict,
        "no drive record",
    );
    // A plain store directory is not a drive.
    let plain = TempDir::new("chain-bad-plain");
    let p = dirs(&plain, 2);
    let fs_store = open_store(&p[1].display().to_string()).expect("plain");
    futures_block(put(&*fs_store, "v/meta", 10));
    let words = "holds objects but no drive record";
    assert_refused(&url("chain", &p, ""), ErrorKind::BadInput, words);
    // A damaged record.
    let rec = d[0].join(DRIVE_RECORD_NAME);
    let mut b = std::fs::read(&rec).expect("record");
    b[20] ^= 1;
    std::fs::write(&rec, b).expect("damage");
    assert_eq!(open_err(&url("chain", &d, "")).kind, ErrorKind::Corrupt);
    // The record's name is not a key, nor listed.
    let fresh = TempDir::new("chain-bad-fresh");
    let f = dirs(&fresh, 2);
    for scheme in ["chain", "stripe"] {
        let f: Vec<PathBuf> = f.iter().map(|p| p.join(scheme)).collect();
        let s = open_store(&url(scheme, &f, "")).expect("open");
        let e = futures_block(s.put(DRIVE_RECORD_NAME, body("x", 64), PutMode::Overwrite));
        assert!(e.is_err(), "{scheme}: the record's name taken as a key");
        assert!(read_drive_record(&f[0]).expect("intact").is_some());
        assert!(keys(&*s, "").is_empty(), "{scheme}: records are not listed");
    }
}

pub(super) async fn keys_async(s: &dyn ObjectStore) -> Vec<String> {
    crate::testutil::list_keys(s, "").await
}

/// A drive whose filesystem fills before its `drive_size` (ENOSPC, injected) is passed
/// over: the object goes to the next drive with room and the tail moves there. Once
/// no drive has room the put is `Full`, and the next put tries every drive again (the
/// full one may have room by then). Before, the ENOSPC came back as `Transient` and the
/// chain sent every retry to the same full drive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drive_full_before_its_size_is_passed_over() {
    use crate::fs::injected::fail_puts;
    let (_root, d, s) = chain_of_three("chain-enospc", "?drive_size=64K");
    let size = 16 << 10;
    fail_puts(&d[0], Some(libc::ENOSPC));
    put(&s, &obj(0, 'd'), size).await;
    assert_eq!(holders(&d, &obj(0, 'd')), vec![1]);
    assert_eq!(s.tail(), 1);
    fail_puts(&d[0], None);
    // Drives 1 and 2 fill by their size; drive 0 is still taken for full.
    for seq in 1..8 {
        put(&s, &obj(seq, 'd'), size).await;
    }
    assert_eq!(s.used_bytes(), vec![0, 64 << 10, 64 << 10]);
    let e = s
        .put(&obj(8, 'd'), body("x", size), PutMode::IfAbsent)
        .await
        .expect_err("no drive with room");
    assert_eq!(e.kind, ErrorKind::Full, "{e}");
    // Tried again: drive 0 has room after all.
    put(&s, &obj(8, 'd'), size).await;
    assert_eq!(holders(&d, &obj(8, 'd')), vec![0]);
    assert_eq!(s.tail(), 0);
}

/// A stripe's key lives on one drive: when that drive is full the put is `Full` at
/// once (no other drive may take it), and the stripe reports its mirror metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_stripe_member_is_full() {
    use crate::fs::injected::fail_puts;
    let root = TempDir::new("stripe-enospc");
    let d = dirs(&root, 2);
    let s = open_store(&url("stripe", &d, "")).expect("open stripe");
    let key = obj(1, 'd');
    let home = super::home_drive(&key, 2);
    fail_puts(&d[home], Some(libc::ENOSPC));
    let e = s
        .put(&key, body(&key, 4096), PutMode::IfAbsent)
        .await
        .expect_err("its drive is full");
    assert_eq!(e.kind, ErrorKind::Full, "{e}");
    assert!(holders(&d, &key).is_empty());
    fail_puts(&d[home], None);
    put(&*s, &key, 4096).await;
    let names: Vec<&str> = s.metrics().iter().map(|m| m.name).collect();
    assert_eq!(names, ["degraded_positions", "mirror_copies_dropped_total"]);
}
