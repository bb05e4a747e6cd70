//! The chain's admin commands through the real binary, on a volume served over NBD
//! and written with nbdsh: `lsvd check` verifying both copies of a mirrored chain,
//! `lsvd chain rebuild` repairing them, `lsvd chain add-drive` growing the chain.

mod common;

use std::path::{Path, PathBuf};

use common::*;

const WRITE: &str = "h = connect()\n\
    pattern = bytes(range(256)) * 4096\n\
    for i in range(6):\n    h.pwrite(bytes([i]) + pattern[1:], i << 20)\n\
    h.pwrite(b'\\x77' * 4096, 15 << 20)\n\
    h.flush()\n";

const CHECK: &str = "h = connect()\n\
    pattern = bytes(range(256)) * 4096\n\
    for i in range(6):\n    assert h.pread(1 << 20, i << 20) == bytes([i]) + pattern[1:], i\n\
    assert h.pread(4096, 15 << 20) == b'\\x77' * 4096\n\
    assert h.pread(4096, 10 << 20) == bytes(4096)\n";

/// A volume `vol` written with [`WRITE`] and stopped cleanly, on a chain of two
/// mirrored positions: `pos[i] = [copy, mirror]`.
struct Setup {
    dir: TempDir,
    lsvd: Lsvd,
    pos: Vec<[PathBuf; 2]>,
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
    if skip_on_s3("chain: is local directories") {
        return;
    }
    require_tools(&["nbdsh"]);
    let s = mirrored_volume("chain_check");
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
        let line = problem_naming(&text, object, bad_dir)
            .unwrap_or_else(|| panic!("no problem names {object} in {}\n{text}", bad_dir.display()));
        assert!(line.contains("lsvd chain rebuild"), "{line}");
    }
    // The good copies are not blamed.
    assert!(problem_naming(&text, &objects[0], a).is_none(), "{text}");
    assert!(problem_naming(&text, &objects[1], a2).is_none(), "{text}");
}
