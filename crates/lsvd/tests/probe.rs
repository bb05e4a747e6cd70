//! `lsvd probe` end to end: the real binary on a temp dir, quickly (about 2 s).

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::process::Command;

use common::{LSVD, TempDir};

fn run(args: &[&str], data: &std::path::Path) -> std::process::Output {
    Command::new(LSVD)
        .arg("--data")
        .arg(data)
        // Make the config file and the environment irrelevant.
        .env_remove("LSVD_CONFIG")
        .env_remove("LSVD_DATA")
        .args(args)
        .output()
        .expect("run lsvd")
}

/// A temp dir named after `test`, and the `--data` dir in it (not created).
fn temp_and_data(test: &str) -> (TempDir, std::path::PathBuf) {
    let tmp = TempDir::new(test);
    let data = tmp.join("data");
    (tmp, data)
}

fn num(v: &serde_json::Value, path: &[&str]) -> f64 {
    let mut at = v;
    for p in path {
        at = &at[*p];
    }
    at.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number in {v}"))
}

#[test]
fn quick_probe_prints_sane_json_saves_a_profile_and_cleans_up() {
    let (tmp, data) = temp_and_data("probe_quick");
    let probed = tmp.subdir("probed");
    let dir = probed.to_str().expect("utf-8 temp path");
    let out = run(
        &[
            "probe",
            dir,
            "--quick",
            "--json",
            "--seconds-per-test",
            "0.05",
            "--file-size",
            "16M",
        ],
        &data,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "probe failed: {stderr}");
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
    assert!(v.is_object());
    assert!(v["direct"].is_boolean());
    assert_eq!(num(&v, &["file_size_bytes"]), f64::from(16u32 << 20));
    assert_eq!(num(&v, &["seconds_per_test"]), 0.05);

    let m = &v["measurements"];
    let sweep = m["write_sweep"].as_array().expect("write_sweep");
    assert_eq!(sweep.len(), 16);
    let accepted: Vec<_> = sweep.iter().filter(|p| !p["rate"].is_null()).collect();
    assert!(!accepted.is_empty(), "no write size accepted");
    for p in accepted {
        assert!(num(p, &["rate", "iops"]) > 0.0, "{p}");
        assert!(num(p, &["rate", "bytes_per_sec"]) > 0.0, "{p}");
    }
    let qd = m["parallel_writes"].as_array().expect("parallel_writes");
    assert_eq!(qd.len(), 7);
    for p in qd {
        assert!(num(p, &["rate", "iops"]) > 0.0, "{p}");
    }
    assert!(!m["sequential_writes"].as_array().expect("seq").is_empty());
    for l in [
        "sync_rewrite",
        "sync_append",
        "sync_rewrite_buffered",
        "random_read",
    ] {
        let median = num(m, &[l, "median_us"]);
        let p99 = num(m, &[l, "p99_us"]);
        assert!(median >= 0.0 && p99 >= median, "{l}: {}", m[l]);
        assert!(num(m, &[l, "samples"]) >= 1.0, "{l}");
    }

    let d = &v["decisions"];
    let page = num(d, &["page_size_bytes"]) as u64;
    assert!(
        page.is_multiple_of(512) && (512..=8192).contains(&page),
        "page {page}"
    );
    let align = num(d, &["log_align_bytes"]) as u64;
    assert!(
        align.is_multiple_of(512) && (512..=4096).contains(&align),
        "align {align}"
    );
    assert_eq!(align, page.min(4096));
    let in_flight = num(d, &["log_writes_in_flight"]);
    assert!((1.0..=16.0).contains(&in_flight), "in flight {in_flight}");
    let cap = num(d, &["group_commit_cap_bytes"]) as u64;
    assert!((64 << 10..=4 << 20).contains(&cap), "cap {cap}");
    assert!(d["direct_log_io"].is_boolean());

    // The profile was saved under --data and reads back as the same object.
    let saved = std::fs::read(data.join("probe-profile")).expect("profile saved under --data");
    assert_eq!(&saved[..8], b"LSVDPRB1");
    let profile = lsvd::probe::load_profile(&data)
        .expect("profile verifies")
        .expect("profile present");
    assert_eq!(
        serde_json::to_value(&profile).expect("json"),
        v,
        "saved profile differs from the printed one"
    );

    // The scratch file is gone.
    let left: Vec<_> = std::fs::read_dir(&probed)
        .expect("list probed dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn probe_of_a_missing_or_non_directory_path_is_bad_input() {
    let (tmp, data) = temp_and_data("probe_missing");
    let file = tmp.join("a-file");
    std::fs::write(&file, b"x").expect("write file");
    for path in [
        "/nonexistent".to_string(),
        file.to_str().expect("utf-8").to_string(),
    ] {
        let out = run(&["probe", &path, "--quick"], &data);
        assert_eq!(out.status.code(), Some(2), "{path}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with("lsvd: error: ") && err.trim_end().lines().count() == 1,
            "expected one 'lsvd: error:' line for {path}, got\n{err}"
        );
        assert!(err.contains(&path), "{err}");
        assert!(!data.join("probe-profile").exists());
    }
}

#[test]
fn probe_rejects_bad_flags() {
    let (tmp, data) = temp_and_data("probe_flags");
    let dir = tmp.subdir("probed");
    let dir = dir.to_str().expect("utf-8");
    for args in [
        ["probe", dir, "--seconds-per-test", "0"],
        ["probe", dir, "--file-size", "1M"],
    ] {
        let out = run(&args, &data);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("lsvd: error: --"), "{err}");
    }
    assert!(
        std::fs::read_dir(tmp.join("probed"))
            .expect("list")
            .next()
            .is_none(),
        "no scratch file made for bad flags"
    );
}
