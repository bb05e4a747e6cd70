//! `lsvd sim` from the command line: `--units` (a sector-unit trace read as bytes is
//! named in one warning line, the real MSR cut is not, both units give the same
//! simulation) and `--layout` (the HDD layout models).

mod common;

use std::path::PathBuf;

use common::*;

const CUT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/traces/msr_heimdall_cuts10k/msr.cut.per_10k.rw_20_80.105.trace"
);

fn cut() -> PathBuf {
    let p = PathBuf::from(CUT);
    assert!(p.is_file(), "shared trace {} not found", p.display());
    p
}

/// The cut with offsets and sizes in 512-byte sectors, written to `dir`.
fn cut_in_sectors(dir: &TempDir) -> PathBuf {
    let text = std::fs::read_to_string(cut()).expect("read cut");
    let mut out = String::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let sectors = |s: &str| s.parse::<u64>().expect("integer field") / 512;
        out.push_str(&format!(
            "{} {} {} {} {}\n",
            f[0],
            f[1],
            sectors(f[2]),
            sectors(f[3]),
            f[4]
        ));
    }
    let p = dir.join("sectors.trace");
    std::fs::write(&p, out).expect("write sector trace");
    p
}

fn sim_json(lsvd: &Lsvd, args: &[&str]) -> (serde_json::Value, String) {
    let mut argv = vec!["sim", "--json"];
    argv.extend_from_slice(args);
    let out = lsvd.run_ok(&argv);
    let json = serde_json::from_slice(&out.stdout).expect("sim prints JSON");
    (json, stderr(&out))
}

#[test]
fn units_warn_on_sectors_read_as_bytes_and_give_the_same_simulation() {
    let dir = TempDir::new("sim_units");
    let lsvd = Lsvd::new(dir.join("data"));
    let real = cut();
    let real = real.to_str().expect("utf-8 path");
    let sectors = cut_in_sectors(&dir);
    let sectors = sectors.to_str().expect("utf-8 path");

    let (as_bytes, err) = sim_json(&lsvd, &[real]);
    assert!(!err.contains("warning"), "the real MSR cut is in bytes:\n{err}");

    let (_, err) = sim_json(&lsvd, &["--format", "msr-cut", sectors]);
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 1, "one warning line:\n{err}");
    assert!(
        warnings[0].contains("sectors") && warnings[0].contains("--units sectors"),
        "{}",
        warnings[0]
    );

    let (as_sectors, err) = sim_json(
        &lsvd,
        &["--format", "msr-cut", "--units", "sectors", sectors],
    );
    assert!(!err.contains("warning"), "{err}");
    assert_eq!(
        as_sectors["volumes"], as_bytes["volumes"],
        "the same trace in either unit simulates the same"
    );
}

#[test]
fn bad_units_are_one_clear_error() {
    let dir = TempDir::new("sim_units_bad");
    let lsvd = Lsvd::new(dir.join("data"));
    let real = cut();
    let real = real.to_str().expect("utf-8 path");
    let out = lsvd.run(&["sim", "--units", "blocks", real]);
    assert_eq!(out.status.code(), Some(2), "{}", show("sim --units blocks", &out));
    let err = stderr(&out);
    assert!(
        err.contains("--units") && err.contains("bytes or sectors") && err.lines().count() == 1,
        "{err}"
    );
    let msr = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/traces/msr_hm0_head1k/msr-cambridge1-sample.csv"
    );
    let out = lsvd.run(&["sim", "--units", "sectors", msr]);
    assert_eq!(out.status.code(), Some(2), "{}", show("sim msr --units", &out));
    assert!(
        stderr(&out).contains("msr-cut and disksim"),
        "{}",
        stderr(&out)
    );
}
