//! `lsvd sim` from the command line: `--units` (a sector-unit trace read as bytes is
//! named in one warning line, the real MSR cut is not, both units give the same
//! simulation) and `--layout` (the HDD layout models).

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

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

/// A temp dir named after `test` with an [`Lsvd`] keeping its data there, and the
/// cut's path (checked to exist) as text for a command line.
fn lsvd_and_cut(test: &str) -> (TempDir, Lsvd, &'static str) {
    let dir = TempDir::new(test);
    let lsvd = Lsvd::new(dir.join("data"));
    cut();
    (dir, lsvd, CUT)
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
    let (dir, lsvd, real) = lsvd_and_cut("sim_units");
    let sectors = cut_in_sectors(&dir);
    let sectors = sectors.to_str().expect("utf-8 path");

    let (as_bytes, err) = sim_json(&lsvd, &[real]);
    assert!(
        !err.contains("warning"),
        "the real MSR cut is in bytes:\n{err}"
    );

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
    let (_dir, lsvd, real) = lsvd_and_cut("sim_units_bad");
    let out = lsvd.run(&["sim", "--units", "blocks", real]);
    let err = usage_error(&out, "sim --units blocks");
    assert!(
        err.contains("--units") && err.contains("bytes or sectors") && err.lines().count() == 1,
        "{err}"
    );
    let msr = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/traces/msr_hm0_head1k/msr-cambridge1-sample.csv"
    );
    let out = lsvd.run(&["sim", "--units", "sectors", msr]);
    usage_error(&out, "sim msr --units");
    assert!(
        stderr(&out).contains("msr-cut and disksim"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn layout_help_teaches_the_models() {
    let dir = TempDir::new("sim_layout_help");
    let lsvd = Lsvd::new(dir.join("data"));
    let out = lsvd.run_ok(&["sim", "--help"]);
    let help = stdout(&out);
    for want in [
        "--layout",
        "--disk",
        "--utilization",
        "--segment-size",
        "--hot-fraction",
        "--cleaning",
        "--units",
        "overwrite",
        "2.3 MB/s",
    ] {
        assert!(help.contains(want), "sim --help lacks {want}:\n{help}");
    }
}

#[test]
fn layout_sweep_reports_the_crossover_and_throughputs() {
    let dir = TempDir::new("sim_layout");
    let lsvd = Lsvd::new(dir.join("data"));
    let plot = dir.join("crossover.svg");
    let (json, _) = sim_json(
        &lsvd,
        &[
            "--layout",
            "overwrite,lfs,hylog",
            "--disk",
            "1991,2003",
            "--synthetic",
            "uniform",
            "--io-size",
            "8K",
            "--utilization",
            "0.5..0.98",
            "--plot",
            plot.to_str().expect("utf-8 path"),
        ],
    );
    let disks = json["disks"].as_array().expect("disks");
    assert_eq!(disks.len(), 2);
    for (d, (want_u, want_disk_u)) in disks.iter().zip([(0.604, 0.785), (0.938, 0.969)]) {
        let c = d["crossover"].as_array().expect("a crossover");
        let u = c[0].as_f64().expect("number");
        let disk_u = c[1].as_f64().expect("number");
        assert!((u - want_u).abs() < 0.002 && (disk_u - want_disk_u).abs() < 0.002);
        let rows = d["rows"].as_array().expect("rows");
        assert_eq!(rows.len(), 13);
        for r in rows {
            let disk_u = r["disk_utilization"].as_f64().expect("number");
            let pps: Vec<f64> = r["pages_per_second"]
                .as_array()
                .expect("pairs")
                .iter()
                .map(|p| p[1].as_f64().expect("number"))
                .collect();
            let (ow, lfs, hy) = (pps[0], pps[1], pps[2]);
            // Below the crossover LFS wins, above it overwrite; HyLog never loses.
            if disk_u < want_disk_u - 0.01 {
                assert!(lfs > ow, "{r}");
            } else if disk_u > want_disk_u + 0.01 {
                assert!(lfs < ow, "{r}");
            }
            assert!(hy >= ow.max(lfs) - 1e-6, "{r}");
        }
    }
    let svg = std::fs::read_to_string(&plot).expect("plot written");
    assert!(svg.starts_with("<svg") && svg.contains("polyline") && svg.contains("hylog"));
}

#[test]
fn bad_layout_options_are_one_clear_error() {
    let dir = TempDir::new("sim_layout_bad");
    let lsvd = Lsvd::new(dir.join("data"));
    for (args, want) in [
        (&["--layout", "wolf"][..], "overwrite, lfs or hylog"),
        (
            &["--layout", "lfs", "--disk", "1995"][..],
            "POSITIONING_MS:MB_PER_S",
        ),
        (
            &["--layout", "lfs", "--utilization", "0.9..0.5"][..],
            "FROM",
        ),
        (
            &["--layout", "lfs", "--cleaning", "exact"][..],
            "analytic or sim",
        ),
        (
            &["--layout", "lfs", "--synthetic", "zipf:0.9"][..],
            "uniform",
        ),
    ] {
        let mut argv = vec!["sim"];
        argv.extend_from_slice(args);
        let out = lsvd.run(&argv);
        let err = usage_error(&out, &argv.join(" "));
        assert!(err.contains(want) && err.lines().count() == 1, "{err}");
    }
    // A layout option without --layout is refused, not silently ignored.
    for flag in [
        "--disk",
        "--utilization",
        "--segment-size",
        "--hot-fraction",
        "--cleaning",
    ] {
        let out = lsvd.run(&["sim", "--synthetic", "uniform", flag, "1"]);
        usage_error(&out, flag);
        assert!(stderr(&out).contains("--layout"), "{}", show(flag, &out));
    }
}

#[test]
fn replay_checks_units_before_connecting() {
    let (_dir, lsvd, real) = lsvd_and_cut("replay_units_bad");
    let msr = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/traces/msr_hm0_head1k/msr-cambridge1-sample.csv"
    );
    // Nothing listens on port 1: a units error must come first.
    let export = "nbd://127.0.0.1:1/none";
    for (args, want) in [
        (&["--units", "blocks", real][..], "bytes or sectors"),
        (&["--units", "sectors", msr][..], "msr-cut and disksim"),
    ] {
        let mut argv = vec!["replay", "--export", export];
        argv.extend_from_slice(args);
        let out = lsvd.run(&argv);
        let err = usage_error(&out, &argv.join(" "));
        assert!(err.contains(want) && err.lines().count() == 1, "{err}");
    }
}
