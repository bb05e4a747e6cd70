//! Adding a drive to a chain (`add_drive`): a full chain takes a new drive and puts
//! continue on it, everything reads back after reopening, the old URL is refused; an
//! add interrupted after the new drive's record opens either way and can be finished;
//! a volume written through the engine spills onto the added drive.

use std::path::{Path, PathBuf};

use crate::test_support::create_and_open;
use crate::{Volume, open_volume};
use lsvd_core::error::ErrorKind;
use lsvd_store::chain::add_drive::add_drive;
use lsvd_store::chain::drives::{DriveSpec, parse_spec};
use lsvd_store::chain::meta::{DriveRecord, read_drive_record, write_drive_record};
use lsvd_store::testutil::{TempDir, assert_holds, data_object_key as obj, key_body as body};
use lsvd_store::{DynStore, PutMode, open_store};

fn spec(url: &str) -> DriveSpec {
    parse_spec("chain", url.strip_prefix("chain:").expect("a chain URL")).expect("spec")
}

fn url(dirs: &[&Path], options: &str) -> String {
    let list: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    format!("chain:{}{options}", list.join(","))
}

fn opened(url: &str) -> DynStore {
    open_store(url).unwrap_or_else(|e| panic!("open {url}: {e}"))
}

/// What a crash right after an add's first step leaves: `new_drive` holds the record
/// of position `position` (the chain's last, one past `first_drive`'s record), and no
/// other drive knows of it yet.
fn leave_interrupted_add(first_drive: &Path, new_drive: &Path, position: u16) {
    let r = read_drive_record(first_drive)
        .expect("read")
        .expect("record");
    std::fs::create_dir_all(new_drive).expect("mkdir");
    let record = DriveRecord {
        generation: r.generation + 1,
        drive_count: position + 1,
        drive_index: position,
        ..r
    };
    write_drive_record(new_drive, &record).expect("write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_chain_takes_a_new_drive_and_puts_continue_on_it() {
    let root = TempDir::new("add-drive-full");
    let [d0, d1] = ["d0", "d1"].map(|n| root.path().join(n));
    let old = url(&[&d0], "?drive_size=64K");
    let new = url(&[&d0, &d1], "?drive_size=64K");
    let size = 16 << 10;

    // Fill the one drive until a put finds no room.
    let s = opened(&old);
    let mut stored = Vec::new();
    let refused = loop {
        let key = obj(stored.len() as u64 + 1);
        match s.put(&key, body(&key, size), PutMode::IfAbsent).await {
            Ok(()) => stored.push(key),
            Err(e) => {
                assert_eq!(e.kind, ErrorKind::Full, "{e}");
                break key;
            }
        }
        assert!(stored.len() < 100, "the drive never filled");
    };
    assert!(stored.len() >= 3, "{stored:?}");
    drop(s);

    let added = add_drive(&spec(&old), std::slice::from_ref(&d1)).expect("add drive");
    assert_eq!(added.position, 1);
    assert_eq!(added.record.drive_count, 2);
    assert!(!added.resumed);
    for d in [&d0, &d1] {
        let r = read_drive_record(d).expect("read").expect("a record");
        assert_eq!((r.drive_count, r.generation), (2, added.record.generation));
    }

    // The old URL is refused, naming the command.
    let e = open_store(&old).err().expect("the old URL is refused");
    assert!(e.to_string().contains("add-drive"), "{e}");

    // The put that found no room now lands on the new drive, and so do the next.
    let s = opened(&new);
    for seq in 0..3 {
        let key = obj(stored.len() as u64 + 1 + seq);
        let key = if seq == 0 { refused.clone() } else { key };
        s.put(&key, body(&key, size), PutMode::IfAbsent)
            .await
            .unwrap_or_else(|e| panic!("put {key}: {e}"));
        assert!(d1.join(&key).is_file(), "{key} is on the new drive");
        stored.push(key);
    }
    drop(s);

    // After a restart every object reads back.
    let s = opened(&new);
    for key in &stored {
        assert_holds(&*s, key, &body(key, size)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_interrupted_after_the_new_drive_opens_either_way_and_finishes() {
    let root = TempDir::new("add-drive-interrupted");
    let [d0, d1] = ["d0", "d1"].map(|n| root.path().join(n));
    let old = url(&[&d0], "");
    let key = obj(1);
    let s = opened(&old);
    s.put(&key, body(&key, 1000), PutMode::IfAbsent)
        .await
        .expect("put");
    drop(s);
    leave_interrupted_add(&d0, &d1, 1);

    // The old URL still opens the old chain.
    let s = opened(&old);
    assert!(s.get(&key).await.expect("get") == body(&key, 1000));
    drop(s);
    // Running the command again finishes it.
    let added = add_drive(&spec(&old), std::slice::from_ref(&d1)).expect("add again");
    assert!(added.resumed);
    assert!(
        open_store(&old).is_err(),
        "the old URL is refused once done"
    );

    // And the new URL alone finishes an add interrupted the same way.
    let d2 = root.path().join("d2");
    leave_interrupted_add(&d0, &d2, 2);
    let s = opened(&url(&[&d0, &d1, &d2], ""));
    assert!(s.get(&key).await.expect("get") == body(&key, 1000));
    drop(s);
    for d in [&d0, &d1, &d2] {
        let got = read_drive_record(d).expect("read").expect("record");
        assert_eq!(got.drive_count, 3, "{}", d.display());
    }
}

#[test]
fn add_drive_refuses_what_it_cannot_add() {
    let root = TempDir::new("add-drive-refused");
    let [a, a2, b, b2, c] = ["a", "a2", "b", "b2", "c"].map(|n| root.path().join(n));
    let mirrored = format!("chain:{}+{}", a.display(), a2.display());
    drop(opened(&mirrored));
    // A mirrored chain takes a mirrored drive only.
    let e = add_drive(&spec(&mirrored), std::slice::from_ref(&b)).expect_err("one dir");
    assert!(e.to_string().contains("DIR+MIRROR"), "{e}");
    // A directory that holds something.
    std::fs::create_dir_all(b2.join("x")).expect("mkdir");
    std::fs::write(b2.join("x/y"), b"y").expect("write");
    let e = add_drive(&spec(&mirrored), &[b.clone(), b2.clone()]).expect_err("not empty");
    assert!(e.to_string().contains("not empty"), "{e}");
    // A drive of the chain itself.
    let e = add_drive(&spec(&mirrored), &[a2.clone(), c.clone()]).expect_err("own drive");
    assert!(e.to_string().contains("already"), "{e}");
    // A stripe's drives are placed by hash: the record says stripe, open refuses.
    let stripe_dir: PathBuf = root.path().join("s");
    drop(open_store(&format!("stripe:{}", stripe_dir.display())).expect("stripe"));
    assert!(add_drive(&spec(&url(&[&stripe_dir], "")), std::slice::from_ref(&c)).is_err());
}

/// A volume on a chain of one small drive, written, the drive added, written past
/// what the first drive holds: the rest lands on the new drive and every block reads
/// back after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_spills_onto_an_added_drive() {
    use super::copy_fallback_tests::{BLOCK, config};
    use crate::test_support::{no_gc, open_v, settle, verify, write_run};
    const BLOCKS: u64 = 512;
    let root = TempDir::new("add-drive-volume");
    let [d0, d1] = ["d0", "d1"].map(|n| root.path().join(n));
    let old = url(&[&d0], "?drive_size=1M");
    let new = url(&[&d0, &d1], "?drive_size=1M");
    let mut model = vec![0u64; BLOCKS as usize];

    async fn write(volume: &Volume, model: &mut [u64], blocks: std::ops::Range<u64>, v: u64) {
        for first in blocks.step_by(16) {
            write_run(volume, model, first..first + 16, |_| v).await;
        }
        volume.flush().await.expect("flush");
        settle(volume).await;
    }

    let store = opened(&old);
    let data = TempDir::new("add-drive-volume-data");
    let (volume, _) =
        create_and_open(&store, "v", BLOCKS * BLOCK, data.path(), config(no_gc())).await;
    write(&volume, &mut model, 0..128, 1).await;
    volume.shutdown().await.expect("shutdown");
    drop((volume, store));

    add_drive(&spec(&old), std::slice::from_ref(&d1)).expect("add drive");
    let store = opened(&new);
    let data = TempDir::new("add-drive-volume-data2");
    let (volume, _) = open_v(&store, data.path(), config(no_gc()), "reopen").await;
    // 1 MiB more: 1.5 MiB in all, past the first drive's 1 MiB, within the two.
    write(&volume, &mut model, 128..384, 2).await;
    volume.shutdown().await.expect("shutdown");
    drop((volume, store));
    let on_new = std::fs::read_dir(d1.join("v/obj")).map_or(0, |r| {
        r.flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".d"))
            .count()
    });
    assert!(on_new > 0, "data objects on the added drive");

    let store = opened(&new);
    let data = TempDir::new("add-drive-volume-data3");
    let (volume, _) = open_volume(store, "v", data.path(), config(no_gc()))
        .await
        .expect("reopen after restart");
    verify(&volume, &model).await;
    volume.shutdown().await.expect("shutdown");
}
