//! Tests of mirrored positions (`chain:A+A2,B+B2`): both copies written, a missing copy
//! repaired from its mirror, a broken copy dropped (degraded) while the store keeps
//! serving, a blank copy rebuilt at open.

use std::path::{Path, PathBuf};

use super::copy_check::copy_problems;
use super::meta::read_drive_record;
use crate::testutil::{
    TempDir, assert_holds, data_object_key, key_body, mirrored_positions, store_metric,
};
use crate::{ObjectStore, PutMode, open_store};
use lsvd_core::error::ErrorKind;

fn obj(seq: u64) -> String {
    data_object_key(seq)
}

/// Positions of two copies each: (a, a2), (b, b2), 64 KiB a drive.
fn mirrored(root: &TempDir) -> (Vec<[PathBuf; 2]>, String) {
    let (pos, drives) = mirrored_positions(root);
    (pos, format!("chain:{drives}?drive_size=64K"))
}

/// Puts object `seq` (see [`obj`]) of `len` bytes, if absent.
async fn put_obj(s: &dyn ObjectStore, seq: u64, len: usize) -> crate::StoreResult<()> {
    s.put(&obj(seq), key_body(&obj(seq), len), PutMode::IfAbsent)
        .await
}

/// Puts objects `seqs`, each of `len` bytes.
async fn put_objs(s: &dyn ObjectStore, seqs: std::ops::Range<u64>, len: usize) {
    for seq in seqs {
        put_obj(s, seq, len).await.expect("put");
    }
}

fn has(dir: &Path, key: &str) -> bool {
    dir.join(key).is_file()
}

async fn check(s: &dyn ObjectStore, key: &str, len: usize) {
    assert_holds(s, key, &key_body(key, len)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_reach_both_copies_and_reads_repair_a_missing_one() {
    let root = TempDir::new("chain-mirror");
    let (pos, url) = mirrored(&root);
    let s = open_store(&url).expect("open");
    let size = 16 << 10;
    put_objs(&*s, 0..6, size).await;
    // Four fill position 0 (both copies), two go to position 1 (both copies).
    for seq in 0..6 {
        let p = &pos[usize::from(seq >= 4)];
        assert!(
            has(&p[0], &obj(seq)) && has(&p[1], &obj(seq)),
            "object {seq}"
        );
    }
    // Lost from the first copy: read from the mirror and written back.
    std::fs::remove_file(pos[0][0].join(obj(1))).expect("lose");
    check(&*s, &obj(1), size).await;
    assert!(has(&pos[0][0], &obj(1)), "repaired");
    // A ranged read repairs too.
    std::fs::remove_file(pos[0][0].join(obj(2))).expect("lose");
    let r = s.get_range(&obj(2), 100..200).await.expect("range");
    assert_eq!(r, key_body(&obj(2), size)[100..200]);
    assert!(has(&pos[0][0], &obj(2)), "repaired by a ranged read");
    // Lost from the second copy: a put-if-absent of the key (the uploader's retry)
    // is refused and makes sure of the copy.
    std::fs::remove_file(pos[0][1].join(obj(3))).expect("lose");
    let e = s.put(&obj(3), key_body("x", 5), PutMode::IfAbsent).await;
    assert_eq!(e.expect_err("taken").kind, ErrorKind::AlreadyExists);
    assert!(has(&pos[0][1], &obj(3)), "copied to the mirror");
    assert_eq!(
        std::fs::read(pos[0][1].join(obj(3))).expect("read"),
        key_body(&obj(3), size)
    );
    // Deletes reach both copies.
    s.delete(&obj(0)).await.expect("delete");
    assert!(!has(&pos[0][0], &obj(0)) && !has(&pos[0][1], &obj(0)));
    // Both copies carry the record of their position.
    for (i, p) in pos.iter().enumerate() {
        for dir in p {
            let r = read_drive_record(dir).expect("read").expect("record");
            assert_eq!((usize::from(r.drive_index), r.copies), (i, 2));
        }
    }
    let report = crate::selftest::run(&*s).await.expect("self-test");
    assert!(report.checks.len() >= 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_copy_degrades_then_is_rebuilt_at_open() {
    let root = TempDir::new("chain-mirror-lost");
    let (pos, url) = mirrored(&root);
    let size = 8 << 10;
    {
        let s = open_store(&url).expect("open");
        put_objs(&*s, 0..3, size).await;
        // The second copy of position 0 goes away (a file where its directory was:
        // nothing can be written there): puts and reads carry on with the first.
        std::fs::remove_dir_all(&pos[0][1]).expect("lose the copy");
        std::fs::write(&pos[0][1], b"not a directory").expect("block it");
        put_obj(&*s, 3, size).await.expect("a degraded put");
        for seq in 0..4 {
            check(&*s, &obj(seq), size).await;
        }
    }
    // Reopened while the copy is still unusable: served degraded.
    {
        let s = open_store(&url).expect("open degraded");
        for seq in 0..4 {
            check(&*s, &obj(seq), size).await;
        }
        put_obj(&*s, 4, size).await.expect("put while degraded");
    }
    // A blank directory in its place: rebuilt from the mirror at open.
    std::fs::remove_file(&pos[0][1]).expect("unblock");
    let s = open_store(&url).expect("open and rebuild");
    for seq in 0..5 {
        assert!(has(&pos[0][1], &obj(seq)), "object {seq} rebuilt");
        check(&*s, &obj(seq), size).await;
    }
    let r = read_drive_record(&pos[0][1])
        .expect("read")
        .expect("record written");
    assert_eq!(usize::from(r.drive_index), 0);
    drop(s);
    // Both copies of a position lost: refused.
    std::fs::remove_dir_all(&pos[0][0]).expect("lose");
    std::fs::remove_dir_all(&pos[0][1]).expect("lose");
    let e = open_store(&url).err().expect("refused");
    assert_eq!(e.kind, ErrorKind::Conflict, "{e}");
}

#[test]
fn mirror_urls_are_checked() {
    let root = TempDir::new("chain-mirror-url");
    let p = |n: &str| root.path().join(n).display().to_string();
    for (u, words) in [
        (
            format!("chain:{}+{}+{}", p("a"), p("b"), p("c")),
            "at most two copies",
        ),
        (format!("chain:{}+,{}", p("a"), p("b")), "empty"),
        (
            format!("chain:{}+{},{}+{}", p("a"), p("b"), p("c"), p("a")),
            "twice",
        ),
        (
            format!("chain:{}+{},{}", p("a"), p("b"), p("c")),
            "every drive or none",
        ),
    ] {
        let e = open_store(&u).err().expect("refused");
        assert_eq!(e.kind, ErrorKind::BadInput, "{u}: {e}");
        assert!(e.to_string().contains(words), "{u}: {e}");
    }
    // A set made with mirrors is not opened without them.
    let url = format!("chain:{}+{},{}+{}", p("a"), p("a2"), p("b"), p("b2"));
    drop(open_store(&url).expect("create"));
    let e = open_store(&format!("chain:{},{}", p("a"), p("b")))
        .err()
        .expect("refused");
    assert!(e.to_string().contains("copies per drive"), "{e}");
}

/// A copy that goes away and comes back with its old contents missed what happened
/// meanwhile: the copy that served alone noted it in its record, and the next open
/// makes the returning copy an exact copy (writes added, deletes applied) before
/// serving, so it never answers with stale or resurrected keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_comes_back_is_brought_in_step() {
    let root = TempDir::new("chain-mirror-back");
    let (pos, url) = mirrored(&root);
    let size = 8 << 10;
    let away = root.path().join("a2.away");
    {
        let s = open_store(&url).expect("open");
        put_objs(&*s, 0..3, size).await;
        // The copy goes away (moved aside, a file in its place).
        std::fs::rename(&pos[0][1], &away).expect("move aside");
        std::fs::write(&pos[0][1], b"not a directory").expect("block it");
        put_obj(&*s, 3, size).await.expect("a degraded put");
        s.delete(&obj(0)).await.expect("a degraded delete");
        let r = read_drive_record(&pos[0][0])
            .expect("read")
            .expect("record");
        assert!(r.mirror_stale, "the serving copy notes its mirror is stale");
    }
    // It comes back with what it held when it left.
    std::fs::remove_file(&pos[0][1]).expect("unblock");
    std::fs::rename(&away, &pos[0][1]).expect("back");
    assert!(has(&pos[0][1], &obj(0)) && !has(&pos[0][1], &obj(3)));
    let s = open_store(&url).expect("open brings it in step");
    assert!(!has(&pos[0][1], &obj(0)), "a delete it missed is applied");
    assert!(has(&pos[0][1], &obj(3)), "a put it missed is copied");
    for dir in &pos[0] {
        let r = read_drive_record(dir).expect("read").expect("record");
        assert!(!r.mirror_stale, "{}: in step again", dir.display());
    }
    assert!(s.get(&obj(0)).await.expect_err("deleted").is_not_found());
    for seq in 1..4 {
        check(&*s, &obj(seq), size).await;
    }
    // Written by both alone (each away in turn): refused, not guessed.
    drop(s);
    for dir in &pos[0] {
        let mut r = read_drive_record(dir).expect("read").expect("record");
        r.mirror_stale = true;
        super::meta::write_drive_record(dir, &r).expect("flag");
    }
    let e = open_store(&url).err().expect("refused");
    assert_eq!(e.kind, ErrorKind::Conflict, "{e}");
    assert!(e.to_string().contains("both copies"), "{e}");
}

/// Reading each copy on its own (what `lsvd check` does) names a key missing from one copy
/// and a key whose copies differ, and nothing when the copies agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_are_compared_byte_for_byte() {
    let root = TempDir::new("chain-mirror-verify");
    let (pos, url) = mirrored(&root);
    let s = open_store(&url).expect("open");
    let size = 16 << 10;
    put_objs(&*s, 0..3, size).await;
    assert_eq!(copy_problems(&*s, "v/").await, Vec::<String>::new());
    std::fs::remove_file(pos[0][0].join(obj(0))).expect("lose");
    let mut bytes = std::fs::read(pos[0][1].join(obj(1))).expect("read");
    bytes[100] ^= 0x40;
    std::fs::write(pos[0][1].join(obj(1)), &bytes).expect("corrupt");
    let problems = copy_problems(&*s, "v/").await;
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].contains(&obj(0)) && problems[0].contains("missing"),
        "{problems:?}"
    );
    assert!(
        problems[1].contains(&obj(1)) && problems[1].contains("differ"),
        "{problems:?}"
    );
    // A read repairs the missing copy; the differing one stays reported.
    check(&*s, &obj(0), size).await;
    let problems = copy_problems(&*s, "v/").await;
    assert_eq!(problems.len(), 1, "{problems:?}");
}

/// A copy whose filesystem is full (ENOSPC, injected) is dropped once its mirror has
/// taken the object: the put succeeds, the position serves from the other copy
/// (counted, flagged in its record), and the next open with room brings the copy in
/// step. Before, ENOSPC was `Transient`: the put failed and the engine retried it
/// forever, the mirror idle beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_copy_degrades_and_its_mirror_takes_the_put() {
    use crate::fs::injected::fail_puts;
    let root = TempDir::new("chain-mirror-full");
    let (pos, url) = mirrored(&root);
    let size = 8 << 10;
    {
        let s = open_store(&url).expect("open");
        put_obj(&*s, 0, size).await.expect("put");
        assert_eq!(store_metric(&*s, "degraded_positions"), 0.0);
        assert_eq!(store_metric(&*s, "mirror_copies_dropped_total"), 0.0);
        // The second copy fills up.
        fail_puts(&pos[0][1], Some(libc::ENOSPC));
        put_obj(&*s, 1, size)
            .await
            .expect("lands on the first copy");
        assert!(has(&pos[0][0], &obj(1)) && !has(&pos[0][1], &obj(1)));
        assert_eq!(store_metric(&*s, "degraded_positions"), 1.0);
        assert_eq!(store_metric(&*s, "mirror_copies_dropped_total"), 1.0);
        let r = read_drive_record(&pos[0][0])
            .expect("read")
            .expect("record");
        assert!(r.mirror_stale, "the serving copy notes its mirror is stale");
        // Later puts, reads and deletes use the remaining copy; no second drop.
        put_obj(&*s, 2, size).await.expect("degraded put");
        s.delete(&obj(0)).await.expect("degraded delete");
        for seq in 1..3 {
            check(&*s, &obj(seq), size).await;
        }
        assert_eq!(store_metric(&*s, "mirror_copies_dropped_total"), 1.0);
        fail_puts(&pos[0][1], None);
    }
    // Room again: the open brings the copy in step (the put it missed copied, the
    // delete applied) and the position is whole.
    let s = open_store(&url).expect("open and rebuild");
    assert!(has(&pos[0][1], &obj(1)) && has(&pos[0][1], &obj(2)));
    assert!(!has(&pos[0][1], &obj(0)), "the delete it missed is applied");
    assert_eq!(store_metric(&*s, "degraded_positions"), 0.0);
    for dir in &pos[0] {
        let r = read_drive_record(dir).expect("read").expect("record");
        assert!(!r.mirror_stale, "{}: in step again", dir.display());
    }

    // The first copy full: the second decides put-if-absent and keeps serving.
    fail_puts(&pos[0][0], Some(libc::EDQUOT));
    put_obj(&*s, 3, size)
        .await
        .expect("lands on the second copy");
    assert!(!has(&pos[0][0], &obj(3)) && has(&pos[0][1], &obj(3)));
    let e = s
        .put(&obj(3), key_body("x", 5), PutMode::IfAbsent)
        .await
        .expect_err("taken on the copy still serving");
    assert_eq!(e.kind, ErrorKind::AlreadyExists);
    check(&*s, &obj(3), size).await;
    assert_eq!(store_metric(&*s, "degraded_positions"), 1.0);
    fail_puts(&pos[0][0], None);
}

/// No room on either copy of a position: the object goes to the next position (a
/// chain's log moves on), and with no room on any copy anywhere the put fails `Full`
/// at once. Neither way is a copy dropped, so every position is whole again as soon as
/// room is made. (Dropping the first full copy and then failing on the second, as for
/// a failed copy, would degrade the position for nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_room_on_either_copy_is_full_and_drops_neither() {
    use crate::fs::injected::fail_puts;
    let root = TempDir::new("chain-mirror-both-full");
    let (pos, url) = mirrored(&root);
    let size = 8 << 10;
    let s = open_store(&url).expect("open");
    for dir in &pos[0] {
        fail_puts(dir, Some(libc::ENOSPC));
    }
    put_obj(&*s, 0, size)
        .await
        .expect("the next position takes it");
    assert!(has(&pos[1][0], &obj(0)) && has(&pos[1][1], &obj(0)));
    for dir in &pos[1] {
        fail_puts(dir, Some(libc::ENOSPC));
    }
    let e = s
        .put(&obj(1), key_body(&obj(1), size), PutMode::IfAbsent)
        .await
        .expect_err("no room anywhere");
    assert_eq!(e.kind, ErrorKind::Full, "{e}");
    assert_eq!(store_metric(&*s, "degraded_positions"), 0.0);
    assert_eq!(store_metric(&*s, "mirror_copies_dropped_total"), 0.0);
    for dir in pos.iter().flatten() {
        fail_puts(dir, None);
    }
    put_obj(&*s, 1, size).await.expect("room again");
    assert_eq!(store_metric(&*s, "degraded_positions"), 0.0);
}

/// A copy that refuses this process (EACCES) is dropped like a failed one: `Denied`
/// on a copy degrades the position rather than failing the put.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_refuses_writes_degrades() {
    use crate::fs::injected::fail_puts;
    let root = TempDir::new("chain-mirror-denied");
    let (pos, url) = mirrored(&root);
    let s = open_store(&url).expect("open");
    fail_puts(&pos[0][1], Some(libc::EACCES));
    put_obj(&*s, 0, 4096)
        .await
        .expect("lands on the first copy");
    assert_eq!(store_metric(&*s, "mirror_copies_dropped_total"), 1.0);
    fail_puts(&pos[0][1], None);
}

/// Every file under `dir` (path relative to it, bytes), in order; and the directories.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out: Vec<(PathBuf, Vec<u8>)> = crate::testutil::entries_under(dir)
        .into_iter()
        .map(|(p, is_dir)| {
            let bytes = if is_dir {
                Vec::new()
            } else {
                std::fs::read(&p).expect("read")
            };
            (p.strip_prefix(dir).expect("under dir").to_path_buf(), bytes)
        })
        .collect();
    out.sort();
    out
}

/// Issue 40: a read-only open (the read-only commands, which hold no lock) of a chain
/// with a blank mirror copy and a copy missing an object changes nothing on any drive:
/// no rebuild, no repair, no record written, every write refused. Reads are served
/// from the good copies; `get_copy` still reads the copy that is behind (for `lsvd
/// check`); a read-write open afterwards repairs both as before. An all-blank set and
/// a missing directory open read-only as an empty store without being created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_open_changes_nothing_on_any_drive() {
    use crate::retry::RetryPolicy;
    use crate::{OpenMode, open_store_mode};
    let root = TempDir::new("chain-mirror-read-only");
    let (pos, url) = mirrored(&root);
    // Four objects fill position 0, two go to position 1.
    let size = 16 << 10;
    {
        let s = open_store(&url).expect("create");
        put_objs(&*s, 0..6, size).await;
    }
    std::fs::remove_dir_all(&pos[1][1]).expect("blank b2");
    std::fs::create_dir(&pos[1][1]).expect("blank b2");
    std::fs::remove_file(pos[0][0].join(obj(1))).expect("lose a copy");
    let all = || pos.iter().flatten().map(|d| files(d)).collect::<Vec<_>>();
    let before = all();

    let policy = RetryPolicy::default();
    let s = open_store_mode(&url, &policy, OpenMode::ReadOnly).expect("open read-only");
    for seq in 0..6 {
        check(&*s, &obj(seq), size).await;
    }
    let r = s.get_range(&obj(1), 10..20).await.expect("range");
    assert_eq!(r, key_body(&obj(1), size)[10..20]);
    assert_eq!(s.list("v/").await.expect("list").len(), 6);
    assert_eq!(store_metric(&*s, "degraded_positions"), 1.0);
    // `lsvd check` reads each copy on its own, the one behind included.
    let behind = pos[1][1].display().to_string();
    let on_b = obj(5);
    let copies = s.copies_of(&on_b).await.expect("copies");
    let i = copies.iter().position(|c| *c == behind).expect("b2 named");
    let e = s.get_copy(&on_b, i).await.expect_err("missing on b2");
    assert!(e.is_not_found(), "{e}");
    let problems = copy_problems(&*s, "v/").await;
    assert!(
        problems.iter().any(|p| p.contains(&obj(1)))
            && problems.iter().any(|p| p.contains(&behind)),
        "{problems:?}"
    );
    for e in [
        s.put(&obj(9), key_body("x", 9), PutMode::IfAbsent)
            .await
            .expect_err("put"),
        s.delete(&obj(0)).await.expect_err("delete"),
        s.repair_copies(&obj(1), key_body(&obj(1), size))
            .await
            .expect_err("repair"),
    ] {
        assert_eq!(e.kind, ErrorKind::ReadOnly, "{e}");
    }
    // The chain itself refuses too, under the decorator.
    let spec = super::drives::parse_spec("chain", &url["chain:".len()..]).expect("spec");
    let chain = super::chain_store::ChainStore::open_mode(&spec, OpenMode::ReadOnly)
        .expect("open the chain read-only");
    let e = chain
        .put(&obj(9), key_body("x", 9), PutMode::IfAbsent)
        .await
        .expect_err("chain put");
    assert_eq!(e.kind, ErrorKind::ReadOnly, "{e}");
    drop((s, chain));
    assert!(all() == before, "a read-only open changed a drive");

    // A read-write open brings the blank copy in step, and a read the missing one.
    let s = open_store(&url).expect("open read-write");
    check(&*s, &obj(1), size).await;
    assert!(has(&pos[0][0], &obj(1)), "repaired by the read");
    assert!(has(&pos[1][1], &obj(5)), "b2 rebuilt at open");

    // Blank and missing directories: an empty store, nothing created.
    let blank = root.path().join("blank");
    std::fs::create_dir(&blank).expect("blank dir");
    let gone = root.path().join("gone");
    let url = format!("chain:{}+{}", blank.display(), gone.display());
    let s = open_store_mode(&url, &policy, OpenMode::ReadOnly).expect("empty");
    assert!(s.list("").await.expect("list").is_empty());
    assert!(s.get(&obj(0)).await.expect_err("nothing").is_not_found());
    assert!(files(&blank).is_empty(), "{:?}", files(&blank));
    assert!(
        !gone.exists(),
        "a read-only open created {}",
        gone.display()
    );
}
