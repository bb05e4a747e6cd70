//! The chain's admin commands through the real binary, on a volume served over NBD
//! and written with nbdsh: `lsvd check` verifying both copies of a mirrored chain,
//! `lsvd chain rebuild` repairing them, `lsvd chain add-drive` growing the chain, and
//! the read-only commands (`info`, `check`, `inspect`, `list`, `snapshot list`)
//! leaving a chain with a blank and a stale copy exactly as it was.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};

use common::*;

const WRITE: &str = CHAIN_WRITE;
const CHECK: &str = CHAIN_CHECK;

/// Empties `dir` (a replaced drive): removed and made again.
fn empty_dir(dir: &Path) {
    std::fs::remove_dir_all(dir).expect("remove the dir");
    std::fs::create_dir(dir).expect("make the dir again");
}

/// A volume `vol` written with [`WRITE`] and stopped cleanly, on a chain of two
/// mirrored positions: `pos[i] = [copy, mirror]`.
struct Setup {
    dir: TempDir,
    lsvd: Lsvd,
    pos: Vec<[PathBuf; 2]>,
}

/// [`mirrored_volume`], or None (skipped) under `LSVD_TEST_STORE=s3`: a chain store
/// is local directories.
fn mirrored_volume_unless_s3(test: &str) -> Option<Setup> {
    if skip_on_s3("chain: is local directories") {
        return None;
    }
    require_tools(&["nbdsh"]);
    Some(mirrored_volume(test))
}

fn mirrored_volume(test: &str) -> Setup {
    let dir = TempDir::new(test);
    let pos: Vec<[PathBuf; 2]> = ["a", "b"]
        .iter()
        .map(|n| [dir.join(n), dir.join(format!("{n}2"))])
        .collect();
    let list: Vec<String> = pos
        .iter()
        .map(|[x, y]| format!("{}+{}", x.display(), y.display()))
        .collect();
    let lsvd = Lsvd {
        data: dir.join("data"),
        store: Some(format!("chain:{}", list.join(","))),
    };
    lsvd.create("vol", "16M");
    let mut server = lsvd.serve(&dir.join("nbd.sock"), &["vol", "--batch-size", "1M"]);
    nbdsh(&server.uri("vol"), WRITE);
    server.stop_clean();
    Setup { dir, lsvd, pos }
}

impl Setup {
    fn read_back(&self) {
        let mut server = self
            .lsvd
            .serve(&self.dir.join("nbd.sock"), &["vol", "--batch-size", "1M"]);
        nbdsh(&server.uri("vol"), CHECK);
        server.stop_clean();
    }
}

/// Data objects (`.d`) of `vol` in `dir`, by name.
fn data_objects(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("vol/obj")).map_or(Vec::new(), |r| {
        r.flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".d"))
            .collect()
    });
    names.sort();
    names
}

fn flip_byte_near_end(path: &Path) {
    let mut b = std::fs::read(path).expect("read object");
    let at = b.len() - 10;
    b[at] ^= 0x01;
    std::fs::write(path, &b).expect("write object");
}

/// The problem line of `lsvd check` that names `what` in the copy at `dir`.
fn problem_naming(out: &str, what: &str, dir: &Path) -> Option<String> {
    out.lines()
        .find(|l| {
            l.starts_with("problem:")
                && l.contains(what)
                && l.contains(&format!("(copy in {})", dir.display()))
        })
        .map(str::to_string)
}

#[test]
fn check_verifies_every_copy_of_a_mirrored_chain() {
    let Some(s) = mirrored_volume_unless_s3("chain_check") else {
        return;
    };
    let ok = stdout(&s.lsvd.run_ok(&["check", "vol"]));
    assert!(ok.contains("ok: no problems found"), "{ok}");

    let [a, a2] = &s.pos[0];
    let objects = data_objects(a);
    assert!(objects.len() >= 2, "data objects on drive 0: {objects:?}");
    // One object's mirror copy gone, another's first copy corrupt.
    std::fs::remove_file(a2.join("vol/obj").join(&objects[0])).expect("delete copy");
    flip_byte_near_end(&a.join("vol/obj").join(&objects[1]));

    let out = s.lsvd.run(&["check", "vol"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{}", show("check", &out));
    for (object, bad_dir) in [(&objects[0], a2), (&objects[1], a)] {
        let line = problem_naming(&text, object, bad_dir).unwrap_or_else(|| {
            panic!("no problem names {object} in {}\n{text}", bad_dir.display())
        });
        assert!(line.contains("lsvd chain rebuild"), "{line}");
    }
    // The good copies are not blamed.
    assert!(problem_naming(&text, &objects[0], a).is_none(), "{text}");
    assert!(problem_naming(&text, &objects[1], a2).is_none(), "{text}");

    // A key that is not an object (the volume's metadata), its mirror copy changed:
    // the copies are compared byte for byte and both named.
    let [meta, meta2] = s
        .pos
        .iter()
        .map(|[x, y]| [x.join("vol/meta"), y.join("vol/meta")])
        .find(|[x, _]| x.exists())
        .expect("a drive holds vol/meta");
    flip_byte_near_end(&meta2);
    let out = s.lsvd.run(&["check", "vol"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{}", show("check", &out));
    fn dir(p: &Path) -> &Path {
        p.parent().and_then(Path::parent).expect("DIR/vol/meta")
    }
    assert!(
        text.lines().any(|l| l.starts_with("problem:")
            && l.contains("vol/meta: the copies in")
            && l.contains("differ")
            && names_dir(l, dir(&meta))
            && names_dir(l, dir(&meta2))),
        "{text}"
    );
}

/// True if `line` names `dir` (not only a longer name starting with it).
fn names_dir(line: &str, dir: &Path) -> bool {
    let d = dir.display().to_string();
    line.match_indices(&d).any(|(i, _)| {
        line[i + d.len()..]
            .chars()
            .next()
            .is_none_or(|c| !c.is_alphanumeric())
    })
}

/// Every file under `dir` (relative path, bytes), in order.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("list").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).expect("under dir").to_path_buf();
                out.push((rel, std::fs::read(&p).expect("read")));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn chain_rebuild_repairs_a_blank_mirror_a_missing_and_a_corrupt_copy() {
    let Some(s) = mirrored_volume_unless_s3("chain_rebuild") else {
        return;
    };
    let [a, a2] = &s.pos[0];
    let [b, b2] = &s.pos[1];
    let objects = data_objects(a);
    assert!(objects.len() >= 2, "data objects on drive 0: {objects:?}");
    let b_files = tree(b2).len();
    // A whole mirror directory emptied, one object's mirror copy gone, another's
    // first copy corrupt.
    empty_dir(b2);
    std::fs::remove_file(a2.join("vol/obj").join(&objects[0])).expect("delete copy");
    flip_byte_near_end(&a.join("vol/obj").join(&objects[1]));

    let out = stdout(&s.lsvd.run_ok(&["chain", "rebuild"]));
    let repaired = |what: &str, dir: &Path| {
        out.lines()
            .any(|l| l.starts_with("repaired:") && l.contains(what) && names_dir(l, dir))
    };
    assert!(repaired(&objects[0], a2), "{out}");
    assert!(repaired(&objects[1], a), "{out}");
    assert!(repaired("brought in step", b2), "{out}");
    assert!(
        out.contains("ok: the copies of every mirrored drive agree"),
        "{out}"
    );
    assert_eq!(tree(a), tree(a2), "drive 0's copies agree");
    assert_eq!(tree(b), tree(b2), "drive 1's copies agree");
    assert_eq!(tree(b2).len(), b_files, "b2 has every file back");

    let check = stdout(&s.lsvd.run_ok(&["check", "vol"]));
    assert!(check.contains("ok: no problems found"), "{check}");
    s.read_back();
    // Nothing left to do: a second run repairs nothing.
    let again = stdout(&s.lsvd.run_ok(&["chain", "rebuild"]));
    assert!(!again.contains("repaired:"), "{again}");
}

/// Issue 40: opening a mirrored chain resynced a blank copy, and a read repaired a
/// missing one, under read-only commands, which hold no lock and may run beside a
/// live server. Now they change no file on any drive (they report the copies;
/// `check` fails naming them), and `lsvd chain rebuild` still repairs them.
#[test]
fn read_only_commands_change_no_drive_and_rebuild_still_repairs() {
    let Some(s) = mirrored_volume_unless_s3("chain_read_only") else {
        return;
    };
    let [a, a2] = &s.pos[0];
    let [b, b2] = &s.pos[1];
    let objects = data_objects(a);
    assert!(!objects.is_empty(), "data objects on drive 0: {objects:?}");
    // A blank mirror directory (a replaced drive, which any read-write open rebuilds),
    // and an object missing from the first copy of its position (which a read-write
    // read writes back from the second).
    empty_dir(b2);
    std::fs::remove_file(a.join("vol/obj").join(&objects[0])).expect("delete copy");
    let drives = [a, a2, b, b2];
    let trees = || drives.map(|d| tree(d));
    let before = trees();

    let seq = &objects[0][..16];
    let commands: [&[&str]; 9] = [
        &["list"],
        &["info", "vol"],
        &["info", "vol", "--json"],
        &["inspect", "objects", "vol"],
        &["inspect", "object", "vol", seq],
        &["inspect", "super", "vol"],
        &["snapshot", "list", "vol"],
        &["check", "vol"],
        &["list"],
    ];
    for args in commands {
        let out = s.lsvd.run(args);
        let what = args.join(" ");
        if args[0] == "check" {
            // It reports both copies, and fails.
            let text = stdout(&out);
            assert_eq!(out.status.code(), Some(1), "{}", show(&what, &out));
            let line = problem_naming(&text, &objects[0], a)
                .unwrap_or_else(|| panic!("no problem names {} in a\n{text}", objects[0]));
            assert!(line.contains("missing from this copy"), "{line}");
            assert!(
                text.lines().any(|l| l.starts_with("problem:")
                    && l.contains("lsvd chain rebuild")
                    && names_dir(l, b2)),
                "no problem names the blank copy {}\n{text}",
                b2.display()
            );
        } else {
            assert!(out.status.success(), "{}", show(&what, &out));
        }
        if args[0] == "info" && args.len() == 2 {
            assert!(stdout(&out).contains("degraded:"), "{}", show(&what, &out));
        }
        assert!(
            trees() == before,
            "`lsvd {what}` changed a file on a drive\n{}",
            show(&what, &out)
        );
    }

    // The command that may change the drives (holding the data directory's lock)
    // still repairs both.
    let out = stdout(&s.lsvd.run_ok(&["chain", "rebuild"]));
    assert!(out.contains("brought in step"), "{out}");
    assert_eq!(tree(a), tree(a2), "drive 0's copies agree");
    assert_eq!(tree(b), tree(b2), "drive 1's copies agree");
    let check = stdout(&s.lsvd.run_ok(&["check", "vol"]));
    assert!(check.contains("ok: no problems found"), "{check}");
    s.read_back();
}

#[test]
fn chain_rebuild_refuses_while_a_server_uses_the_data_directory_and_reports_no_good_copy() {
    let Some(s) = mirrored_volume_unless_s3("chain_rebuild_refuse") else {
        return;
    };
    let [a, a2] = &s.pos[0];
    let mut server = s
        .lsvd
        .serve(&s.dir.join("nbd.sock"), &["vol", "--batch-size", "1M"]);
    let out = s.lsvd.run(&["chain", "rebuild"]);
    assert_eq!(out.status.code(), Some(1), "{}", show("rebuild", &out));
    assert!(
        stderr(&out).contains("stop it first"),
        "{}",
        show("rebuild", &out)
    );
    server.stop_clean();

    // Both copies of one object bad: reported, left alone, exit 1.
    let objects = data_objects(a);
    let name = &objects[0];
    flip_byte_near_end(&a.join("vol/obj").join(name));
    flip_byte_near_end(&a2.join("vol/obj").join(name));
    let out = s.lsvd.run(&["chain", "rebuild"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{}", show("rebuild", &out));
    assert!(
        text.lines().any(|l| l.starts_with("problem:")
            && l.contains(name.as_str())
            && l.contains("no good copy")),
        "{text}"
    );
}

#[test]
fn chain_add_drive_prints_the_new_store_and_the_old_one_is_refused() {
    let Some(mut s) = mirrored_volume_unless_s3("chain_add_drive") else {
        return;
    };
    let old = s.lsvd.store.clone().expect("a chain store");
    let [c, c2] = ["c", "c2"].map(|n| s.dir.join(n));

    // A mirrored chain takes a mirrored drive only.
    let out = s
        .lsvd
        .run(&["chain", "add-drive", &c.display().to_string()]);
    usage_error(&out, "add-drive");
    assert!(
        stderr(&out).contains("DIR+MIRROR"),
        "{}",
        show("add-drive", &out)
    );

    let drive = format!("{}+{}", c.display(), c2.display());
    let out = stdout(&s.lsvd.run_ok(&["chain", "add-drive", &drive]));
    let new = format!("{old},{drive}");
    assert_eq!(out.lines().last(), Some(new.as_str()), "{out}");
    assert!(c.join(".lsvd-chain").is_file() && c2.join(".lsvd-chain").is_file());

    // The old --store is refused, saying why.
    let out = s.lsvd.run(&["list"]);
    usage_error(&out, "list");
    assert!(stderr(&out).contains("add-drive"), "{}", show("list", &out));

    // The new one serves the volume as it was.
    s.lsvd.store = Some(new);
    let check = stdout(&s.lsvd.run_ok(&["check", "vol"]));
    assert!(check.contains("ok: no problems found"), "{check}");
    s.read_back();
}

#[test]
fn chain_help_teaches_each_command() {
    let dir = TempDir::new("chain_help");
    let lsvd = Lsvd::new(dir.join("data"));
    let cases: &[(&[&str], &[&str])] = &[
        (&["--help"], &["chain"]),
        (&["chain", "--help"], &["rebuild", "add-drive"]),
        (
            &["chain", "rebuild", "--help"],
            &[
                "lsvd check",
                "stopped",
                "exits 0",
                "Example: lsvd --store chain:",
            ],
        ),
        (
            &["chain", "add-drive", "--help"],
            &[
                "<DRIVE>",
                "DIR+MIRROR",
                "stopped",
                "refused",
                "Example: lsvd --store",
            ],
        ),
    ];
    lsvd.assert_stdout_mentions(cases);
    assert!(!dir.join("data").exists(), "--help created the data dir");
}
