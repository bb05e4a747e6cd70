//! The probe drives the settings, end to end with the real binary: `serve` measures the
//! data directory on a first start and uses the profile, `lsvd probe --store` measures
//! the store and `serve` uses that too, `info` shows every setting and where it came
//! from (flag > config > probe profile > default), and `--no-probe`, a corrupt
//! profile or one measured elsewhere fall back to the defaults with one warning line.
//!
//! Cost: one first-start probe (about 3 s, 32 MiB scratch file) and one store probe of
//! tiny objects (64 KiB, 2 streams, 0.02 s per test); about 10 s in all. Under
//! `LSVD_TEST_STORE=s3` (the S3 pass) the store probe measures versitygw.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;

use common::*;
use serde_json::Value;

/// `settings.tuning.<name>` of `info --json`: (value, origin).
fn setting(info: &Value, name: &str) -> (u64, String) {
    let s = &info["settings"]["tuning"][name];
    (
        s["value"]
            .as_u64()
            .unwrap_or_else(|| panic!("{name}: no value in {info}")),
        s["origin"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no origin in {info}"))
            .to_string(),
    )
}

fn info_with(lsvd: &Lsvd, extra: &[&str]) -> Value {
    let mut args = vec!["info", "vol", "--json"];
    args.extend_from_slice(extra);
    let out = lsvd.run_ok(&args);
    serde_json::from_slice(&out.stdout).expect("info --json is JSON")
}

/// The `lsvd: settings: ...` line of a server's log.
fn settings_line(log: &str) -> String {
    log.lines()
        .find(|l| l.starts_with("lsvd: settings: "))
        .unwrap_or_else(|| panic!("no settings line in\n{log}"))
        .to_string()
}

fn warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.starts_with("lsvd: warn: "))
        .collect()
}

/// Write a device profile for `data` whose decisions are unlike any default.
fn plant_device_profile(data: &Path, measured_under: &Path) {
    let mut p = lsvd::probe::load_profile(data)
        .expect("readable")
        .expect("a profile from the first start");
    p.path = std::fs::canonicalize(measured_under)
        .expect("canonical")
        .display()
        .to_string();
    p.decisions.log_writes_in_flight = 7;
    p.decisions.group_commit_cap_bytes = 512 << 10;
    lsvd::probe::save_profile(data, &p).expect("save");
}

#[test]
fn first_start_probe_and_profiles_set_what_serve_and_info_use() {
    let tmp = TempDir::new("probe_settings");
    let data = tmp.join("data");
    let lsvd = Lsvd::with_store(&data, &tmp.join("store"));
    let store_url = lsvd.store.clone().expect("explicit store");
    lsvd.create("vol", "64M");

    // First start without a profile: measured, said in one line, saved, used.
    let mut server = lsvd.serve(&tmp.join("s1"), &["vol", "--probe-profiles"]);
    let log = server.stop_clean();
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("measuring the disk"))
            .count(),
        1,
        "{log}"
    );
    assert!(
        data.join("probe-profile").exists(),
        "profile not saved\n{log}"
    );
    let line = settings_line(&log);
    assert!(line.contains("log writes in flight"), "{line}");
    assert!(line.contains("(probe profile)"), "{line}");
    assert!(warnings(&log).is_empty(), "{log}");

    // A profile with distinctive decisions: serve and info use them.
    plant_device_profile(&data, &data);
    let mut server = lsvd.serve(&tmp.join("s2"), &["vol", "--probe-profiles"]);
    let log = server.stop_clean();
    assert!(!log.contains("measuring the disk"), "probed again\n{log}");
    let line = settings_line(&log);
    // Its in-flight advice (7) is not applied: the log is written through the page
    // cache, and the probe measured O_DIRECT parallelism.
    assert!(
        line.contains("log writes in flight 1 (default)")
            && line.contains("group-commit cap 512.0 KiB (probe profile)"),
        "{line}"
    );
    let info = info_with(&lsvd, &[]);
    assert_eq!(
        setting(&info, "log_writes_in_flight"),
        (1, "default".into())
    );
    assert_eq!(
        setting(&info, "group_commit_max_bytes"),
        (512 << 10, "probe-profile".into())
    );
    assert_eq!(setting(&info, "uploads_in_flight"), (4, "default".into()));
    let in_flight = ["log writes in flight", "(probe profile)"];
    lsvd.assert_stdout_mentions(&[(&["info", "vol"], &in_flight)]);

    // The config file beats the profile; a flag beats both.
    let config = tmp.join("lsvd.toml");
    std::fs::write(&config, "[tuning]\nlog_writes_in_flight = 5\nuploads = 2\n")
        .expect("write config");
    let cfg = config.to_str().expect("utf-8 path");
    let info = info_with(&lsvd, &["--config", cfg]);
    assert_eq!(setting(&info, "log_writes_in_flight"), (5, "config".into()));
    assert_eq!(setting(&info, "uploads_in_flight"), (2, "config".into()));
    let info = info_with(&lsvd, &["--config", cfg, "--log-writes-in-flight", "3"]);
    assert_eq!(setting(&info, "log_writes_in_flight"), (3, "flag".into()));
    assert_eq!(
        setting(&info, "group_commit_max_bytes"),
        (512 << 10, "probe-profile".into())
    );

    // The store probe: tiny and quick; leaves nothing in the store; serve uses it.
    let out = lsvd.run_ok(&[
        "probe",
        "--store",
        &store_url,
        "--quick",
        "--json",
        "--max-object-size",
        "64K",
        "--max-streams",
        "2",
        "--seconds-per-test",
        "0.02",
    ]);
    let p: Value = serde_json::from_slice(&out.stdout).expect("probe --json is JSON");
    assert_eq!(p["store_url"], Value::from(store_url.as_str()));
    // 4, 16 and 64 KiB.
    assert_eq!(p["measurements"]["gets"].as_array().map(Vec::len), Some(3));
    let d = &p["decisions"];
    let fetch = d["read_fetch_bytes"].as_u64().expect("fetch");
    let batch = d["batch_size_bytes"].as_u64().expect("batch");
    let uploads = d["uploads_in_flight"].as_u64().expect("uploads");
    assert!((64 << 10..=1 << 20).contains(&fetch), "{d}");
    assert!((4 << 20..=32 << 20).contains(&batch), "{d}");
    assert!((1..=16).contains(&uploads), "{d}");
    if !store_is_s3() {
        let left: Vec<String> = std::fs::read_dir(tmp.join("store"))
            .expect("store dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".lsvd-probe"))
            .collect();
        assert!(left.is_empty(), "probe left {left:?}");
    }
    let info = info_with(&lsvd, &[]);
    assert_eq!(
        setting(&info, "read_fetch_bytes"),
        (fetch, "store-profile".into())
    );
    assert_eq!(
        setting(&info, "batch_size_bytes"),
        (batch, "store-profile".into())
    );
    assert_eq!(
        setting(&info, "uploads_in_flight"),
        (uploads, "store-profile".into())
    );
    let mut server = lsvd.serve(&tmp.join("s3"), &["vol", "--probe-profiles"]);
    let line = settings_line(&server.stop_clean());
    assert!(
        line.contains(&format!(
            "uploads in flight {uploads} (store probe profile)"
        )),
        "{line}"
    );
    // The volume still lists: the probe wrote nothing a volume listing sees.
    let out = lsvd.run_ok(&["list"]);
    assert_eq!(stdout(&out).lines().count(), 1, "{}", stdout(&out));

    // Neither PATH nor --store: a usage error (no `Lsvd`: under S3 it gives --store).
    let out = run_timeout(
        std::process::Command::new(LSVD)
            .env_remove("LSVD_STORE")
            .env_remove("LSVD_CONFIG")
            .arg("--data")
            .arg(tmp.join("other"))
            .arg("probe"),
        SHORT,
    );
    usage_error(&out, "probe");
}

#[test]
fn no_probe_and_unusable_profiles_fall_back_to_defaults() {
    let tmp = TempDir::new("probe_fallback");
    let data = tmp.join("data");
    let lsvd = Lsvd::with_store(&data, &tmp.join("store"));
    lsvd.create("vol", "64M");
    let defaults = "log writes in flight 1 (default), group-commit cap 4.0 MiB (default), \
                    batch size 8.0 MiB (default), uploads in flight 4 (default), \
                    read fetch size 64.0 KiB (default)";

    // --no-probe (the harness's default): nothing measured, nothing saved, defaults.
    let mut server = lsvd.serve(&tmp.join("s1"), &["vol"]);
    let log = server.stop_clean();
    assert_eq!(settings_line(&log), format!("lsvd: settings: {defaults}"));
    assert!(!log.contains("measuring the disk"), "{log}");
    assert!(!data.join("probe-profile").exists());

    // A corrupt device profile and a corrupt store profile: one warning line each,
    // the defaults, and the server starts.
    std::fs::write(data.join("probe-profile"), b"LSVDPRB1 not really").expect("write");
    let store_profile = lsvd::probe::store_profile::store_profile_path(
        &data,
        lsvd.store.as_deref().expect("store"),
    );
    std::fs::create_dir_all(store_profile.parent().expect("dir")).expect("mkdir");
    std::fs::write(&store_profile, vec![0u8; 64]).expect("write");
    let mut server = lsvd.serve(&tmp.join("s2"), &["vol", "--probe-profiles"]);
    let log = server.stop_clean();
    assert_eq!(settings_line(&log), format!("lsvd: settings: {defaults}"));
    let w = warnings(&log);
    assert_eq!(w.len(), 2, "{log}");
    assert!(
        w[0].contains("probe profile") && w[0].contains("unusable"),
        "{log}"
    );
    assert!(
        w[1].contains("store profile") && w[1].contains("unusable"),
        "{log}"
    );
    assert!(
        !log.contains("measuring the disk"),
        "a corrupt profile is not replaced\n{log}"
    );
    let info = info_with(&lsvd, &[]);
    // The group-commit cap is what a device profile sets: the default shows it unused.
    assert_eq!(
        setting(&info, "group_commit_max_bytes"),
        (4 << 20, "default".into())
    );
    let status = info["settings"]["probe_profile"].as_str().expect("status");
    assert!(status.starts_with("unusable"), "{status}");

    // A valid profile measured under another directory: a warning, the defaults.
    std::fs::remove_file(data.join("probe-profile")).expect("remove");
    std::fs::remove_file(&store_profile).expect("remove");
    let elsewhere = tmp.subdir("elsewhere");
    let out = lsvd.run_ok(&[
        "probe",
        elsewhere.to_str().expect("utf-8"),
        "--quick",
        "--json",
        "--seconds-per-test",
        "0.01",
        "--file-size",
        "16M",
    ]);
    assert!(out.status.success());
    let mut server = lsvd.serve(&tmp.join("s3"), &["vol", "--probe-profiles"]);
    let log = server.stop_clean();
    assert_eq!(settings_line(&log), format!("lsvd: settings: {defaults}"));
    let w = warnings(&log);
    assert_eq!(w.len(), 1, "{log}");
    assert!(w[0].contains("was measured under"), "{log}");
    // With --no-probe a saved profile is not even read: no warning.
    let mut server = lsvd.serve(&tmp.join("s4"), &["vol"]);
    let log = server.stop_clean();
    assert!(warnings(&log).is_empty(), "{log}");
}
