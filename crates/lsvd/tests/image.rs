//! `lsvd export` and `lsvd import` through the real binary: a sparse raw image in, the
//! same bytes out (to a file, which stays sparse, and to a pipe), holes not stored, a
//! snapshot exported beside the server that serves its volume, and bad input refused
//! with one line. Runs on the S3 pass too (scripts/test-s3.sh).

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::Stdio;

use common::*;

const MIB: u64 = 1 << 20;

/// A 64 MiB image: random data at 0 (1 MiB), 10 MiB (4 KiB) and 40 MiB (3 MiB + 512
/// bytes at its end, a short last block); holes elsewhere. Written as a sparse file.
fn make_image(path: &Path) -> Vec<u8> {
    let mut image = vec![0u8; 64 * MIB as usize];
    for (at, len, seed) in [
        (0, MIB, 1),
        (10 * MIB, 4096, 2),
        (40 * MIB, 3 * MIB + 512, 3),
    ] {
        image[at as usize..(at + len) as usize].copy_from_slice(&random_bytes(seed, len as usize));
    }
    let f = std::fs::File::create(path).expect("create the image");
    f.set_len(image.len() as u64).expect("size the image");
    for (at, len) in [(0, MIB), (10 * MIB, 4096), (40 * MIB, 3 * MIB + 512)] {
        f.write_all_at(&image[at as usize..(at + len) as usize], at)
            .expect("write the image");
    }
    image
}

fn stored_object_bytes(lsvd: &Lsvd, volume: &str) -> u64 {
    let url = lsvd
        .store
        .clone()
        .unwrap_or_else(|| format!("file://{}", lsvd.data.join("store").display()));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let store = lsvd_store::open_store(&url).expect("open the store");
        let list = store
            .list(&format!("{volume}/obj/"))
            .await
            .expect("list objects");
        list.iter().map(|e| e.size_bytes).sum()
    })
}

fn arg(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn an_image_goes_in_and_comes_out_the_same_and_holes_stay_holes() {
    let dir = TempDir::new("image-round-trip");
    let lsvd = Lsvd::new(dir.join("data"));
    let img = dir.join("in.img");
    let image = make_image(&img);

    let out = lsvd.run_ok(&["import", arg(&img), "vol"]);
    assert!(
        stderr(&out).contains("data written (zero blocks and holes skipped)"),
        "{}",
        show("import", &out)
    );
    let stored = stored_object_bytes(&lsvd, "vol");
    assert!(
        stored < 6 * MIB,
        "4 MiB of data in a 64 MiB image stored as {stored} bytes of objects"
    );

    // To a file: the same bytes, and sparse.
    let back = dir.join("out.img");
    lsvd.run_ok(&["export", "vol", arg(&back), "--quiet"]);
    let read = std::fs::read(&back).expect("read the export");
    assert!(read == image, "the export reads as the image");
    let allocated = std::fs::metadata(&back).expect("stat").blocks() * 512;
    assert!(
        allocated < 8 * MIB,
        "the export of 4 MiB of data allocates {allocated} bytes"
    );
    // To a pipe: every byte.
    let out = lsvd
        .cmd(["export", "vol", "-", "--quiet"])
        .stdout(Stdio::piped())
        .output()
        .expect("export to stdout");
    assert!(out.status.success(), "{}", show("export -", &out));
    assert!(out.stdout == image, "the piped export reads as the image");

    // An existing file is not overwritten.
    let out = lsvd.run(&["export", "vol", arg(&back)]);
    assert_eq!(out.status.code(), Some(1), "{}", show("export over", &out));
    assert!(
        stderr(&out).contains("exists"),
        "{}",
        show("export over", &out)
    );

    // From standard input, with --size; the volume is as large as asked.
    let out = lsvd
        .cmd(["import", "-", "piped", "--size", "80M", "--quiet"])
        .stdin(std::fs::File::open(&img).expect("open the image"))
        .output()
        .expect("import from stdin");
    assert!(out.status.success(), "{}", show("import -", &out));
    let out = lsvd
        .cmd(["export", "piped", "-", "--quiet"])
        .stdout(Stdio::piped())
        .output()
        .expect("export piped");
    assert_eq!(out.stdout.len() as u64, 80 * MIB);
    assert!(out.stdout[..image.len()] == image[..], "what was piped in");
    assert!(out.stdout[image.len()..].iter().all(|&b| b == 0));

    // Refusals: one line each, nothing made.
    let out = lsvd
        .cmd(["import", "-", "nosize"])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        show("import - without --size", &out)
    );
    assert!(
        stderr(&out).contains("--size"),
        "{}",
        show("import -", &out)
    );
    let out = lsvd.run(&["import", arg(&img), "small", "--size", "16M"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        show("import too large", &out)
    );
    let out = lsvd.run(&["import", arg(&img), "vol"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        show("import over a volume", &out)
    );
    let listed = stdout(&lsvd.run_ok(&["list"]));
    assert!(
        !listed.contains("nosize") && !listed.contains("small"),
        "refused imports made no volume: {listed}"
    );
}

#[test]
fn a_snapshot_exports_beside_the_server_of_its_volume() {
    require_tools(&["nbdsh"]);
    let dir = TempDir::new("image-snapshot");
    let lsvd = Lsvd::new(dir.join("data"));
    let img = dir.join("in.img");
    let image = make_image(&img);
    lsvd.run_ok(&["import", arg(&img), "vol", "--quiet"]);
    let mut server = lsvd.serve(&dir.join("nbd.sock"), &["vol"]);
    nbdsh(
        &server.uri("vol"),
        "h = connect()\nh.pwrite(b'S' * 65536, 20 << 20)\nh.flush()",
    );
    lsvd.run_ok(&["snapshot", "create", "vol", "s1"]);
    nbdsh(
        &server.uri("vol"),
        "h = connect()\nh.pwrite(b'A' * 65536, 20 << 20)\nh.pwrite(b'A' * 4096, 0)\nh.flush()",
    );
    // What an export killed mid-way left: its process is gone, so the next export
    // removes it (a live one's is kept: this test's own process stands for one).
    let dead = {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("run true");
        let pid = child.id();
        child.wait().expect("wait for true");
        pid
    };
    let stale = lsvd.data.join(format!(".export-{dead}-vol@s1"));
    let live = lsvd
        .data
        .join(format!(".export-{}-vol@s1", std::process::id()));
    for d in [&stale, &live] {
        std::fs::create_dir_all(d).expect("make a scratch dir");
        std::fs::write(d.join("vol@s1.wlog"), b"left").expect("write in it");
    }
    let snap = dir.join("s1.img");
    let out = lsvd.run_ok(&["export", "vol@s1", arg(&snap)]);
    assert!(!stale.exists(), "a dead export's scratch dir was left");
    assert!(live.exists(), "a live export's scratch dir was removed");
    std::fs::remove_dir_all(&live).expect("remove");
    assert!(
        stderr(&out).contains("exported"),
        "{}",
        show("export", &out)
    );
    let mut want = image.clone();
    want[20 * MIB as usize..20 * MIB as usize + 65536].fill(b'S');
    assert!(
        std::fs::read(&snap).expect("read") == want,
        "the snapshot as it was taken, not as the volume is now"
    );
    // The volume itself is served: exporting it is refused, naming the way.
    let out = lsvd.run(&["export", "vol", arg(&dir.join("live.img"))]);
    assert!(
        !out.status.success(),
        "{}",
        show("export a served volume", &out)
    );
    assert!(
        !dir.join("live.img").exists(),
        "no image file made for a served volume"
    );
    // No scratch directory is left behind.
    let left: Vec<_> = std::fs::read_dir(&lsvd.data)
        .expect("list the data directory")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".export"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    server.stop_clean();
}

#[test]
fn holes_are_skipped_and_data_after_them_and_a_short_last_block_arrive() {
    let dir = TempDir::new("image-holes");
    let lsvd = Lsvd::new(dir.join("data"));
    // 1 GiB of hole, then 4 KiB + 100 bytes of data ending the file.
    let img = dir.join("tail.img");
    let len = (1u64 << 30) + 4096 + 100;
    let tail = random_bytes(9, 4096 + 100);
    let f = std::fs::File::create(&img).expect("create");
    f.set_len(len).expect("size");
    f.write_all_at(&tail, 1 << 30).expect("write");
    drop(f);
    let out = lsvd.run_ok(&["import", arg(&img), "tail"]);
    assert!(
        stderr(&out).contains("8.0 KiB of it data written"),
        "{}",
        show("import", &out)
    );
    let back = dir.join("back.img");
    lsvd.run_ok(&["export", "tail", arg(&back), "--quiet"]);
    let f = std::fs::File::open(&back).expect("open");
    assert_eq!(f.metadata().expect("stat").len(), len.div_ceil(4096) * 4096);
    let mut got = vec![0u8; 8192];
    f.read_exact_at(&mut got, 1 << 30).expect("read");
    assert_eq!(&got[..tail.len()], &tail[..]);
    assert!(got[tail.len()..].iter().all(|&b| b == 0));
    // A file that is all hole makes an empty volume.
    let empty = dir.join("empty.img");
    std::fs::File::create(&empty)
        .and_then(|f| f.set_len(64 * MIB))
        .expect("make a hole");
    let out = lsvd.run_ok(&["import", arg(&empty), "empty"]);
    assert!(
        stderr(&out).contains("0 B of it data written"),
        "{}",
        show("import", &out)
    );
}
