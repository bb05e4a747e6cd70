//! `lsvd serve --store chain:...` and `stripe:...` end to end: a volume created and
//! served over NBD, written and read back with nbdsh, synced, then served again from
//! the drive directories alone (write log and read cache deleted); where the objects
//! landed; bad URLs refused with one line.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};

use common::*;

/// Data objects (`.d`) of volume `vol` in drive directory `drive`.
fn data_objects(drive: &Path) -> usize {
    std::fs::read_dir(drive.join("vol/obj")).map_or(0, |r| {
        r.flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".d"))
            .count()
    })
}

const WRITE: &str = CHAIN_WRITE;
const CHECK: &str = CHAIN_CHECK;

#[test]
fn volumes_on_a_chain_and_a_stripe_survive_losing_the_local_cache() {
    if skip_on_s3("chain: and stripe: are local directories") {
        return;
    }
    require_tools(&["nbdsh"]);
    for scheme in ["chain", "stripe"] {
        let dir = TempDir::new("chain_store");
        let drives: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("drive{i}"))).collect();
        let list: Vec<String> = drives.iter().map(|d| d.display().to_string()).collect();
        let lsvd = Lsvd {
            data: dir.join("data"),
            store: Some(format!("{scheme}:{}", list.join(","))),
        };
        lsvd.create("vol", "16M");
        let socket = dir.join("nbd.sock");
        let args = ["vol", "--batch-size", "1M"];
        let mut server = lsvd.serve(&socket, &args);
        nbdsh(&server.uri("vol"), WRITE);
        nbdsh(&server.uri("vol"), CHECK);
        lsvd.run_ok(&["sync", "vol"]);
        server.kill9();
        for file in ["vol.wlog", "@host.rcache", "@host.rcache.slots"] {
            let _ = std::fs::remove_file(dir.join("data").join(file));
        }
        let mut server = lsvd.serve(&socket, &args);
        nbdsh(&server.uri("vol"), CHECK);
        server.stop_clean();
        let per_drive: Vec<usize> = drives.iter().map(|d| data_objects(d)).collect();
        assert!(
            per_drive.iter().sum::<usize>() >= 2,
            "{scheme}: {per_drive:?}"
        );
        if scheme == "chain" {
            // The tail never filled (the filesystem's free space): every data object
            // on drive 0.
            assert_eq!(per_drive[1..], [0, 0], "{scheme}: {per_drive:?}");
        } else {
            assert!(
                per_drive.iter().filter(|&&n| n > 0).count() >= 2,
                "{scheme}: objects spread over the drives: {per_drive:?}"
            );
        }
        if scheme == "chain" {
            let info = stdout(&lsvd.run_ok(&["info", "vol"]));
            assert!(
                info.contains("store:") && info.contains("tail_drive 0"),
                "lsvd info on a chain:\n{info}"
            );
        }
        for d in &drives {
            assert!(
                d.join(".lsvd-chain").is_file(),
                "{} has its record",
                d.display()
            );
        }
    }
}

#[test]
fn bad_drive_urls_are_one_line_errors() {
    let dir = TempDir::new("chain_store_bad");
    let a = dir.join("a").display().to_string();
    for (url, words) in [
        ("chain:".to_string(), "no directories"),
        ("stripe:".to_string(), "no directories"),
        (format!("chain:{a},{a}"), "given twice"),
        (format!("chain:{a}?gc=never"), "gc placement"),
        (format!("chain:{a}+{a}2+{a}3"), "at most two copies"),
    ] {
        let lsvd = Lsvd {
            data: dir.join("data"),
            store: Some(url.clone()),
        };
        let out = lsvd.run(&["list"]);
        let err = stderr(&out);
        usage_error(&out, &url);
        assert!(
            err.starts_with("lsvd: error: ") && err.trim_end().lines().count() == 1,
            "{}",
            show(&url, &out)
        );
        assert!(err.contains(words), "{}", show(&url, &out));
    }
    assert!(!dir.join("a").exists(), "nothing created for a refused URL");
}
