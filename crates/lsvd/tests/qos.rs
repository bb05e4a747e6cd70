//! QoS limits end to end (docs/SEMANTICS.md, "QoS limits"): `lsvd serve` with a
//! config file's `[volumes.NAME]` limits, measured by fio's nbd engine, 4 KiB random
//! writes at queue depth 8. A limited volume gets its limit (±10%) while a volume
//! beside it, unlimited, runs at the same time far faster; SIGHUP applies a changed
//! limit to the next requests. fio skips its first seconds (`ramp_time`), which spend
//! the burst a fresh bucket starts with.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use common::*;

/// fio writing 4 KiB blocks at random over the first 64 MiB of export `name`,
/// `ramp_secs` unmeasured, then `secs` measured; started, not waited for.
fn spawn_fio(server: &Server, name: &str, ramp_secs: u64, secs: u64) -> Child {
    let mut c = tool("fio");
    c.args([
        &format!("--name=qos-{name}"),
        "--ioengine=nbd",
        &format!("--uri={}", server.uri(name)),
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=8",
        "--size=64M",
        "--time_based",
        &format!("--ramp_time={ramp_secs}"),
        &format!("--runtime={secs}"),
        "--output-format=json",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c.spawn().expect("spawn fio")
}

/// The write IOPS fio measured.
fn write_iops(fio: Child) -> f64 {
    let out = fio.wait_with_output().expect("fio");
    assert!(out.status.success(), "{}", show("fio", &out));
    let text = stdout(&out);
    let start = text
        .find('{')
        .unwrap_or_else(|| panic!("no JSON from fio: {text}"));
    let v: serde_json::Value = serde_json::from_str(&text[start..]).expect("fio JSON");
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "fio job error: {job}");
    job["write"]["iops"].as_f64().expect("write iops")
}

/// The value of the sample `line_start VALUE` at `addr`'s metrics.
fn sample(addr: &str, line_start: &str) -> f64 {
    let text = fetch_metrics(addr).expect("metrics answer");
    text.lines()
        .find_map(|l| l.strip_prefix(line_start)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {line_start} in\n{text}"))
}

fn write_config(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write config file");
}

#[test]
fn limit_iops_holds_one_volume_and_spares_its_neighbour() {
    require_tools(&["fio"]);
    let dir = TempDir::new("qos_two");
    let lsvd = Lsvd::new(dir.join("data"));
    lsvd.create("slow", "128M");
    lsvd.create("free", "128M");
    let config = dir.join("lsvd.toml");
    write_config(&config, "[volumes.slow]\nlimit_iops = 500\n");
    let metrics = format!("127.0.0.1:{}", free_tcp_port());
    let config_arg = config.display().to_string();
    let server = lsvd.serve(
        &dir.join("nbd.sock"),
        &[
            "--config",
            &config_arg,
            "slow",
            "free",
            "--metrics",
            &metrics,
        ],
    );
    server.assert_log_mentions(&["slow: QoS limit_iops 500 (burst 1s)"]);
    let slow = spawn_fio(&server, "slow", 2, 6);
    let free = spawn_fio(&server, "free", 2, 6);
    let (slow, free) = (write_iops(slow), write_iops(free));
    eprintln!("qos: slow (limit_iops 500) {slow:.0} IOPS, free (no limit) {free:.0} IOPS");
    assert!(
        (450.0..=550.0).contains(&slow),
        "limited volume: {slow:.0} IOPS"
    );
    assert!(
        free > 2.0 * 500.0,
        "the unlimited volume was slowed: {free:.0} IOPS"
    );
    let waited = |volume: &str| {
        sample(
            &metrics,
            &format!("lsvd_throttled_seconds_total{{volume=\"{volume}\",op=\"write\"}}"),
        )
    };
    assert!(waited("slow") > 1.0, "slow waited {}", waited("slow"));
    assert_eq!(waited("free"), 0.0);
    // The request metrics count what fio sent, and a request's time includes its
    // wait for the limit.
    let requests = |volume: &str, series: &str| {
        sample(
            &metrics,
            &format!("lsvd_nbd_request_seconds_{series}{{volume=\"{volume}\",op=\"write\"}}"),
        )
    };
    let count = requests("slow", "count");
    assert!(
        count >= 0.9 * slow * 6.0,
        "slow: {count} writes counted, fio saw {slow:.0}/s"
    );
    assert!(requests("free", "count") >= 0.9 * free * 6.0);
    assert!(
        requests("slow", "sum") >= waited("slow"),
        "slow: {} s answering writes, {} s of it throttled",
        requests("slow", "sum"),
        waited("slow")
    );
    assert_eq!(
        sample(
            &metrics,
            "lsvd_qos_limit{volume=\"slow\",limit=\"limit_iops\"}"
        ),
        500.0
    );
}

#[test]
fn sighup_applies_a_changed_limit() {
    require_tools(&["fio"]);
    let (dir, lsvd, socket) = new_volume("qos_sighup", "128M");
    let config = dir.join("lsvd.toml");
    write_config(&config, "[volumes.vol]\nlimit_write_iops = 400\n");
    let config_arg = config.display().to_string();
    let mut server = lsvd.serve(&socket, &["--config", &config_arg, "vol"]);
    let before = write_iops(spawn_fio(&server, "vol", 2, 3));
    // The bytes limit with no burst: 150 writes of 4 KiB a second.
    write_config(
        &config,
        "[volumes.vol]\nlimit_write_bps = \"600K\"\nlimit_burst = 0\n",
    );
    // SAFETY: a signal to the server this test started.
    assert_eq!(unsafe { libc::kill(server.pid(), libc::SIGHUP) }, 0);
    let reloaded = poll_until(Duration::from_secs(10), || {
        server
            .log()
            .contains("SIGHUP: reloaded QoS limits")
            .then_some(())
    });
    assert!(reloaded.is_some(), "no reload line:\n{}", server.log());
    server.assert_log_mentions(&[
        "vol: limit_write_bps 600.0 KiB/s (burst 0ns)",
        "other settings in the file take effect at the next start",
    ]);
    let after = write_iops(spawn_fio(&server, "vol", 1, 3));
    eprintln!("qos: limit_write_iops 400: {before:.0} IOPS; after SIGHUP, 600K/s: {after:.0}");
    assert!(
        (360.0..=440.0).contains(&before),
        "before SIGHUP: {before:.0}"
    );
    assert!((135.0..=165.0).contains(&after), "after SIGHUP: {after:.0}");
    // A file that no longer parses changes nothing, and says so.
    write_config(&config, "[volumes.vol]\nlimit_write_iop = 5\n");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(server.pid(), libc::SIGHUP) }, 0);
    let refused = poll_until(Duration::from_secs(10), || {
        server.log().contains("limits not reloaded").then_some(())
    });
    assert!(refused.is_some(), "no refusal line:\n{}", server.log());
    server.stop_clean();
}
