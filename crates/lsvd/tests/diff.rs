//! `lsvd export-diff` / `lsvd import-diff` through the real binary: a volume written
//! over NBD (libnbd's nbdsh) through six snapshots is backed up as one full export and
//! a chain of five diffs, restored into another store, and every restored snapshot,
//! read back over NBD (nbdcopy), holds the bytes an independent model of the writes
//! says; diffs hold only what changed; a diff that does not fit, or is damaged, is
//! refused with one line and changes nothing. Runs on the S3 pass too.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;

use common::*;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 64 * MIB;

fn arg(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// One round of changes: random data at a few places (4 KiB aligned, some long),
/// and a range zeroed. Applied to the volume over NBD and to `model`.
fn change(server: &Server, dir: &TempDir, round: u64, model: &mut [u8]) -> u64 {
    let mut script = String::from("h = connect()\n");
    let mut changed = 0u64;
    for (i, (at, len)) in [
        ((round * 7 % 60) * MIB, 256 * 1024),
        ((round * 13 % 61) * MIB + 12 * 4096, 4096),
        ((round * 5 % 50) * MIB + 512 * 1024, 2 * MIB),
    ]
    .into_iter()
    .enumerate()
    {
        let data = random_bytes(round * 10 + i as u64, len as usize);
        let path = dir.join(format!("payload-{round}-{i}"));
        std::fs::write(&path, &data).expect("write the payload");
        model[at as usize..(at + len) as usize].copy_from_slice(&data);
        script.push_str(&format!(
            "h.pwrite(open('{}', 'rb').read(), {at})\n",
            path.display()
        ));
        changed += len;
    }
    // Zero 1 MiB that an earlier round may have written (and trim the next 64 KiB).
    let zero_at = ((round * 11) % 60) * MIB;
    model[zero_at as usize..(zero_at + MIB + 65536) as usize].fill(0);
    script.push_str(&format!(
        "h.zero({MIB}, {zero_at})\nh.trim(65536, {})\nh.flush()\n",
        zero_at + MIB
    ));
    nbdsh(&server.uri("src"), &script);
    changed
}

/// Every snapshot `dst@s0..=s{last}`, served and read over NBD, equals `models`.
fn assert_restored(lsvd: &Lsvd, dir: &TempDir, last: usize, models: &[Vec<u8>]) {
    let names: Vec<String> = (0..=last).map(|i| format!("dst@s{i}")).collect();
    let args: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut server = lsvd.serve(&dir.join("dst.sock"), &args);
    for (i, name) in names.iter().enumerate() {
        let out = dir.join(format!("read-{i}.img"));
        let _ = std::fs::remove_file(&out);
        nbdcopy(&server.uri(name), arg(&out));
        let got = std::fs::read(&out).expect("read the copy");
        assert!(
            got == models[i],
            "{name} read over NBD differs from the model"
        );
    }
    server.stop_clean();
}

#[test]
fn a_full_export_and_a_chain_of_five_diffs_restore_every_snapshot() {
    require_tools(&["nbdsh", "nbdcopy"]);
    let dir = TempDir::new("diff-chain");
    let src = Lsvd::new(dir.join("src-data"));
    src.create("src", "64M");
    let mut server = src.serve(&dir.join("src.sock"), &["src"]);
    let mut model = vec![0u8; SIZE as usize];
    let mut models = Vec::new();
    let mut changed = vec![0u64];
    change(&server, &dir, 0, &mut model);
    src.run_ok(&["snapshot", "create", "src", "s0"]);
    models.push(model.clone());
    for round in 1..=5 {
        changed.push(change(&server, &dir, round, &mut model));
        src.run_ok(&["snapshot", "create", "src", &format!("s{round}")]);
        models.push(model.clone());
    }
    // Written after the last snapshot: in no diff.
    nbdsh(
        &server.uri("src"),
        "h = connect()\nh.pwrite(b'L' * 4096, 0)\nh.flush()",
    );

    // The backup, taken beside the live server: a full image, then the diffs.
    let full = dir.join("full.img");
    src.run_ok(&["export", "src@s0", arg(&full), "--quiet"]);
    for (i, &written) in changed.iter().enumerate().skip(1) {
        let d = dir.join(format!("s{i}.diff"));
        let base = format!("s{}", i - 1);
        let out = src.run_ok(&[
            "export-diff",
            &format!("src@s{i}"),
            "--from-snap",
            &base,
            arg(&d),
        ]);
        assert!(
            stderr(&out).contains("records"),
            "{}",
            show("export-diff", &out)
        );
        // A diff holds what changed (plus its heads), never the whole volume.
        let len = std::fs::metadata(&d).expect("stat").len();
        assert!(
            len <= written + 64 * 1024 && len >= written / 2,
            "diff {i} is {len} bytes for {written} bytes written"
        );
    }
    // A diff from nothing holds every block s2 has data in.
    let from_nothing = dir.join("s2-whole.diff");
    src.run_ok(&["export-diff", "src@s2", arg(&from_nothing), "--quiet"]);
    server.stop_clean();

    // The restore, into another store.
    let dst = Lsvd::new(dir.join("dst-data"));
    dst.run_ok(&["import", arg(&full), "dst", "--quiet"]);
    dst.run_ok(&["snapshot", "create", "dst", "s0"]);
    for i in 1..=5 {
        let d = dir.join(format!("s{i}.diff"));
        let out = dst.run_ok(&["import-diff", arg(&d), "dst"]);
        assert!(
            stderr(&out).contains(&format!("snapshot 's{i}' taken")),
            "{}",
            show("import-diff", &out)
        );
        if i == 2 {
            // Applied twice: refused, nothing changed.
            let again = dst.run(&["import-diff", arg(&d), "dst"]);
            assert_eq!(again.status.code(), Some(1), "{}", show("again", &again));
            assert!(
                stderr(&again).contains("already has snapshot 's2'"),
                "{}",
                show("again", &again)
            );
            // Out of order: s4's diff applies on top of s3, not s2.
            let early = dst.run(&["import-diff", arg(&dir.join("s4.diff")), "dst"]);
            assert!(
                stderr(&early).contains("newest snapshot is 's2'"),
                "{}",
                show("early", &early)
            );
        }
    }
    assert_restored(&dst, &dir, 5, &models);

    // A chain may start from a diff from nothing: it creates the volume.
    let other = Lsvd::new(dir.join("other-data"));
    other.run_ok(&["import-diff", arg(&from_nothing), "dst", "--quiet"]);
    other.run_ok(&["import-diff", arg(&dir.join("s3.diff")), "dst", "--quiet"]);
    let read = dir.join("other-s3.img");
    other.run_ok(&["export", "dst@s3", arg(&read), "--quiet"]);
    assert!(
        std::fs::read(&read).expect("read") == models[3],
        "s2 whole + s3's diff"
    );
}

#[test]
fn a_diff_that_does_not_fit_or_is_damaged_changes_nothing() {
    require_tools(&["nbdsh"]);
    let dir = TempDir::new("diff-refusals");
    let lsvd = Lsvd::new(dir.join("data"));
    lsvd.create("src", "64M");
    let mut server = lsvd.serve(&dir.join("src.sock"), &["src"]);
    nbdsh(
        &server.uri("src"),
        "h = connect()\nh.pwrite(b'A' * 65536, 0)\nh.flush()",
    );
    lsvd.run_ok(&["snapshot", "create", "src", "a"]);
    nbdsh(
        &server.uri("src"),
        "h = connect()\nh.pwrite(b'B' * 65536, 1 << 20)\nh.flush()",
    );
    lsvd.run_ok(&["snapshot", "create", "src", "b"]);
    let whole = dir.join("a.diff");
    let step = dir.join("b.diff");
    lsvd.run_ok(&["export-diff", "src@a", arg(&whole), "--quiet"]);
    lsvd.run_ok(&[
        "export-diff",
        "src@b",
        "--from-snap",
        "a",
        arg(&step),
        "--quiet",
    ]);

    // Bad requests: a volume without a snapshot, a base newer than the target, an
    // unknown base, an existing output file.
    let out = lsvd.run(&["export-diff", "src", arg(&dir.join("x.diff"))]);
    assert_eq!(out.status.code(), Some(2), "{}", show("no snapshot", &out));
    let out = lsvd.run(&[
        "export-diff",
        "src@a",
        "--from-snap",
        "b",
        arg(&dir.join("x.diff")),
    ]);
    assert!(
        stderr(&out).contains("newer"),
        "{}",
        show("base newer", &out)
    );
    let out = lsvd.run(&[
        "export-diff",
        "src@b",
        "--from-snap",
        "zz",
        arg(&dir.join("x.diff")),
    ]);
    assert!(
        stderr(&out).contains("no snapshot 'zz'"),
        "{}",
        show("unknown base", &out)
    );
    let out = lsvd.run(&["export-diff", "src@b", arg(&step)]);
    assert!(
        stderr(&out).contains("exists"),
        "{}",
        show("over a file", &out)
    );
    assert!(
        !dir.join("x.diff").exists(),
        "a refused export-diff leaves no file"
    );
    server.stop_clean();
    // A full disk under the output: one line, exit 1.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("open /dev/full");
    let out = lsvd
        .cmd(["export-diff", "src@b", "--from-snap", "a", "-"])
        .stdout(full)
        .output()
        .expect("export-diff to /dev/full");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        show("to a full disk", &out)
    );
    assert!(
        stderr(&out).contains("No space left on device"),
        "{}",
        show("to a full disk", &out)
    );

    // The step diff on a volume that does not exist, or that has no snapshot 'a'.
    let dst = Lsvd::new(dir.join("dst-data"));
    let out = dst.run(&["import-diff", arg(&step), "dst"]);
    assert!(
        stderr(&out).contains("does not exist"),
        "{}",
        show("no volume", &out)
    );
    dst.run_ok(&["import-diff", arg(&whole), "dst", "--quiet"]);
    // Written since 'a': refused.
    let mut server = dst.serve(&dir.join("dst.sock"), &["dst"]);
    nbdsh(
        &server.uri("dst"),
        "h = connect()\nh.pwrite(b'C' * 4096, 8 << 20)\nh.flush()",
    );
    server.stop_clean();
    let out = dst.run(&["import-diff", arg(&step), "dst"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        show("written since", &out)
    );
    assert!(
        stderr(&out).contains("was written since its snapshot 'a'"),
        "{}",
        show("written since", &out)
    );
    assert_eq!(
        stderr(&out).lines().count(),
        1,
        "{}",
        show("one line", &out)
    );

    // Damaged: one payload byte flipped. Refused before anything is written.
    let fresh = Lsvd::new(dir.join("fresh-data"));
    fresh.run_ok(&["import-diff", arg(&whole), "dst", "--quiet"]);
    let mut bytes = std::fs::read(&step).expect("read");
    let at = bytes.len() - 24 - 100;
    bytes[at] ^= 0x40;
    let bad = dir.join("bad.diff");
    std::fs::write(&bad, &bytes).expect("write");
    let out = fresh.run(&["import-diff", arg(&bad), "dst"]);
    assert!(!out.status.success(), "{}", show("damaged", &out));
    assert!(
        stderr(&out).contains("not a whole lsvd diff"),
        "{}",
        show("damaged", &out)
    );
    // Cut short: refused too.
    std::fs::write(&bad, &std::fs::read(&step).expect("read")[..1000]).expect("write");
    let out = fresh.run(&["import-diff", arg(&bad), "dst"]);
    assert!(
        stderr(&out).contains("not a whole lsvd diff"),
        "{}",
        show("cut", &out)
    );
    // From standard input a cut is found only where it is: here after the data, so
    // the volume holds part of the diff (the error says so) and the diff no longer fits.
    let piped = Lsvd::new(dir.join("piped-data"));
    piped.run_ok(&["import-diff", arg(&whole), "dst", "--quiet"]);
    let bytes = std::fs::read(&step).expect("read");
    std::fs::write(&bad, &bytes[..bytes.len() - 24]).expect("write");
    let out = piped
        .cmd(["import-diff", "-", "dst"])
        .stdin(std::fs::File::open(&bad).expect("open"))
        .output()
        .expect("import-diff from stdin");
    assert!(!out.status.success(), "{}", show("cut stdin", &out));
    assert!(
        stderr(&out).contains("now holds part of the diff"),
        "{}",
        show("cut stdin", &out)
    );
    let out = piped.run(&["import-diff", arg(&step), "dst"]);
    assert!(
        stderr(&out).contains("was written since its snapshot 'a'"),
        "{}",
        show("after a cut stdin", &out)
    );
    // Nothing was applied: the good diff still fits, and brings 'b'.
    fresh.run_ok(&["import-diff", arg(&step), "dst", "--quiet"]);
    let img = dir.join("b.img");
    fresh.run_ok(&["export", "dst@b", arg(&img), "--quiet"]);
    let got = std::fs::read(&img).expect("read");
    assert!(got[..65536].iter().all(|&b| b == b'A'));
    assert!(
        got[MIB as usize..MIB as usize + 65536]
            .iter()
            .all(|&b| b == b'B')
    );
    assert!(got[65536..MIB as usize].iter().all(|&b| b == 0));
}

/// A diff file on a filesystem that fills up: one line (exit 1), and no half diff
/// left to be found (SEMANTICS: "a failed export-diff removes the partial file").
#[test]
fn an_export_diff_that_fills_its_disk_leaves_no_file() {
    require_tools(&["nbdsh"]);
    let test = "an_export_diff_that_fills_its_disk_leaves_no_file";
    let dir = TempDir::new("diff-full-disk");
    let Some(fs) = SmallTmpfs::mount(&dir.join("fs"), 1, test) else {
        return;
    };
    let lsvd = Lsvd::new(dir.join("data"));
    lsvd.create("src", "64M");
    let mut server = lsvd.serve(&dir.join("src.sock"), &["src"]);
    let payload = dir.join("payload");
    std::fs::write(&payload, random_bytes(7, 4 * MIB as usize)).expect("write");
    nbdsh(
        &server.uri("src"),
        &format!(
            "h = connect()\nh.pwrite(open('{}', 'rb').read(), 0)\nh.flush()",
            payload.display()
        ),
    );
    lsvd.run_ok(&["snapshot", "create", "src", "s"]);
    server.stop_clean();
    let out_file = fs.path().join("s.diff");
    let out = lsvd.run(&["export-diff", "src@s", arg(&out_file)]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        show("to a full disk", &out)
    );
    assert!(
        stderr(&out).contains("No space left on device"),
        "{}",
        show("to a full disk", &out)
    );
    assert!(
        !out_file.exists(),
        "a partial diff was left on the full disk"
    );
}
