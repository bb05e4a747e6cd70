//! One read cache per `lsvd serve`, shared by every volume it serves (the LSVD paper's
//! one cache SSD per host), through the real binary and nbdcopy: on a second data
//! directory (another host, cold), a clone and a snapshot export read back what their
//! base's reads already cached, with no GET and no miss, and every byte is compared with
//! the image written. Also on the S3 pass (`LSVD_TEST_STORE=s3`).

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;

#[test]
fn a_clone_and_a_snapshot_read_their_bases_cached_chunks_without_a_get() {
    require_tools(&["nbdcopy"]);
    let dir = TempDir::new("shared_rcache");
    let (image, readback) = random_image_and_scratch(&dir, 46, 24 * MIB);
    let writer = Lsvd::new(dir.join("data"));
    writer.create("base", "24M");
    let mut server = writer.serve(&dir.join("w.sock"), &["base"]);
    nbdcopy(image.to_str().expect("path"), &server.uri("base"));
    server.stop_clean();
    writer.run_ok(&["snapshot", "create", "base", "s"]);
    writer.run_ok(&["clone", "base@s", "c"]);

    // Another data directory on the same store: an empty write log and a cold cache.
    let reader = Lsvd::with_store(dir.join("data2"), &dir.join("data").join("store"));
    let addr = format!("127.0.0.1:{}", free_tcp_port());
    let mut server = reader.serve(
        &dir.join("r.sock"),
        &[
            "base",
            "c",
            "base@s",
            "--metrics",
            &addr,
            "--read-cache-size",
            "256M",
        ],
    );
    assert!(
        wait_until(SHORT, || fetch_metrics(&addr).is_some()),
        "no metrics\n{}",
        server.log()
    );
    server.assert_log_mentions(&["@host.rcache (256.0 MiB), shared by 3 exports; 0 chunks warm"]);
    let counters = |addr: &str, vol: &str| {
        let m = |name| metric(addr, name, vol).unwrap_or_else(|| panic!("no {name} for {vol}"));
        (m("store_gets_total"), m("read_cache_misses_total"))
    };
    let base_before = counters(&addr, "base");
    nbdcopy(&server.uri("base"), readback.to_str().expect("path"));
    assert_files_equal(&image, &readback);
    let base_after = counters(&addr, "base");
    assert!(
        base_after.0 > base_before.0 && base_after.1 > base_before.1,
        "the base reads from the store: {base_before:?} -> {base_after:?}"
    );
    for export in ["c", "base@s"] {
        let before = counters(&addr, export);
        std::fs::remove_file(&readback).expect("rm readback");
        nbdcopy(&server.uri(export), readback.to_str().expect("path"));
        assert_files_equal(&image, &readback);
        assert_eq!(
            counters(&addr, export),
            before,
            "{export}: GETs and misses while reading data its base cached"
        );
    }
    // The chunks are charged to the volume whose reads cached them. (Each export has
    // series of its own: a snapshot export's were labelled with its volume's name, so
    // `base` appeared twice.)
    let chunks = |vol: &str| metric(&addr, "read_cache_chunks", vol).expect("chunks");
    assert!(
        chunks("base") >= 24.0 * 16.0 * 7.0 / 8.0,
        "{}",
        chunks("base")
    );
    assert_eq!((chunks("c"), chunks("base@s")), (0.0, 0.0));
    let text = fetch_metrics(&addr).expect("metrics");
    let series = text
        .lines()
        .filter(|l| l.starts_with("lsvd_size_bytes{"))
        .count();
    assert_eq!(series, 3, "one series per export\n{text}");
    let data2 = dir.join("data2");
    assert!(data2.join("@host.rcache").exists(), "the shared cache file");
    for own in ["base.rcache", "c.rcache", "base@s.rcache"] {
        assert!(
            !data2.join(own).exists(),
            "{own}: no cache of a volume's own"
        );
    }
    server.stop_clean();

    // Restarted with the clone alone: the cache is warm with its base's chunks, which
    // it reads without a GET (they are nobody's until the base is served again).
    let addr = format!("127.0.0.1:{}", free_tcp_port());
    let mut server = reader.serve(
        &dir.join("r.sock"),
        &["c", "--metrics", &addr, "--read-cache-size", "256M"],
    );
    let warm = poll_until(SHORT, || {
        let log = server.log();
        let at = log.find("shared by 1 export; ")?;
        log[at..].split(' ').nth(4)?.parse::<u64>().ok()
    })
    .unwrap_or_else(|| panic!("no read cache line\n{}", server.log()));
    assert!(warm >= 336, "{warm} chunks warm");
    assert!(wait_until(SHORT, || fetch_metrics(&addr).is_some()));
    let before = counters(&addr, "c");
    std::fs::remove_file(&readback).expect("rm readback");
    nbdcopy(&server.uri("c"), readback.to_str().expect("path"));
    assert_files_equal(&image, &readback);
    assert_eq!(counters(&addr, "c"), before, "the clone after a restart");
    server.stop_clean();
}
