//! (Unit tests of the library, so `cargo test --lib` needs no AFL runtime: the bins
//! link only under `cargo afl`.) Replays every seed (and every saved crash input, once fixed) through its target's
//! checks, without AFL: the targets' properties hold on the corpora in a plain build.

use std::fs;
use std::path::Path;

type Check = fn(&[u8]);

const TARGETS: [(&str, Check); 10] = [
    ("format_diff", crate::format_targets::diff),
    ("format_record", crate::format_targets::record),
    ("format_object", crate::format_targets::object),
    ("format_checkpoint", crate::format_targets::checkpoint),
    ("format_log_index", crate::format_targets::log_index),
    ("format_supers", crate::format_targets::supers),
    ("nbd_proto", crate::nbd_proto::proto),
    ("nbd_session", crate::nbd_session::session),
    ("nbd_volume", crate::nbd_volume::volume),
    ("trace_parse", crate::trace_parse::trace),
];

#[test]
fn every_seed_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (target, check) in TARGETS {
        let dir = root.join(target);
        let mut n = 0;
        for entry in fs::read_dir(&dir).expect("corpus directory") {
            let path = entry.expect("dir entry").path();
            let bytes = fs::read(&path).expect("read seed");
            eprintln!("{}", path.display());
            check(&bytes);
            n += 1;
        }
        assert!(n > 0, "{target} has no seeds");
    }
}

#[test]
fn empty_and_tiny_inputs_pass_every_target() {
    for (_, check) in TARGETS {
        for input in [&[][..], &[0], &[1], &[0, 0], &[1, 1], &[0xff; 40]] {
            check(input);
        }
    }
}
