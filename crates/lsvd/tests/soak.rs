//! The soak: 16 NBD connections of mixed I/O against the real `lsvd serve` while the
//! S3 store (a versitygw of the test's own) is killed and restarted, the cache
//! filesystem (`--data` on a small tmpfs) is filled to ENOSPC, and clients hang up in
//! the middle of requests. Every read is checked against a per-block oracle while it
//! runs; at the end every block is checked over a fresh connection, after a clean
//! restart, after SIGKILL (with the cache filesystem full), and after a restart from
//! the store alone (cache deleted, uploads finished first). Each fault must leave its
//! line in the server log and move its metric. See docs/soak.md.
//!
//! ```text
//! cargo test -p lsvd --test soak                                   # CI: ~40 s of I/O
//! LSVD_SOAK_SECONDS=300 cargo test -p lsvd --test soak -- --nocapture   # 30 s outages
//! LSVD_SOAK_SEED=1234 cargo test -p lsvd --test soak                # replay a seed
//! ```
//!
//! Needs versitygw (scripts/install-versitygw.sh, which scripts/install-test-deps.sh
//! runs); without it the test says SKIPPED and passes, unless `LSVD_REQUIRE_S3=1` or
//! `LSVD_SOAK_REQUIRE=1`.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;
#[path = "oracle/rng.rs"]
mod rng;
mod soak_support;

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{SHORT, SmallTmpfs, TempDir, find_versitygw, run_ok};
use lsvd_nbd::client::{Client, Target};
use rng::Rng;
use soak_support::load::{self, CONNECTIONS, Hangup, Shared};
use soak_support::oracle::{BLOCK, Oracle};
use soak_support::procs::{Gateway, Lsvd};
use soak_support::{metric, metrics_text};

const VOLUME: &str = "soak";
const VOLUME_BYTES: u64 = 64 << 20;
/// The last blocks are for the misbehaving clients (each write there is to a fresh block).
const FAULT_ZONE_BLOCKS: u64 = 1024;
/// `--data` filesystem: the write log (16 MiB) and read cache (96 MiB) fit, with room
/// to spare that the test then fills.
const DATA_FS_MIB: u64 = 144;
/// The stall timeout is past the longest outage (30 s, extended by up to 30 s until a
/// failure is seen): the soak checks that writes wait an outage out; failing them
/// past the timeout is `engine::fault_metrics_tests`' and `tests/faults.rs`' part.
const SERVE_ARGS: [&str; 13] = [
    VOLUME,
    "--stall-timeout",
    "180s",
    "--log-size",
    "16M",
    "--read-cache-size",
    "96M",
    "--batch-size",
    "1M",
    "--batch-timeout-ms",
    "500",
    "--checkpoint-every",
    "16",
];

fn say(msg: &str) {
    // Straight to stderr, so a CI log shows it even when the test passes.
    let _ = writeln!(std::io::stderr(), "soak: {msg}");
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Prints the seed if the test panics.
struct SeedNote(u64);

impl Drop for SeedNote {
    fn drop(&mut self) {
        if std::thread::panicking() {
            say(&format!(
                "FAILED with seed {0}: replay with LSVD_SOAK_SEED={0}",
                self.0
            ));
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Event {
    StoreDown,
    StoreUp,
    FillFs,
    FreeFs,
    Hangup(Hangup),
}

/// The seeded fault schedule over `secs` seconds of I/O.
fn schedule(rng: &mut Rng, secs: u64, outage: Duration) -> Vec<(Duration, Event)> {
    let mut ev = Vec::new();
    let cycles = (secs / 150).max(1);
    let cycle = Duration::from_secs(secs) / cycles as u32;
    for c in 0..cycles as u32 {
        let base = cycle * c;
        let down = base + cycle.mul_f64(0.15 + 0.1 * rng.below(1000) as f64 / 1000.0);
        let up = down + outage;
        let fill = up + Duration::from_secs(3).max(cycle / 20);
        ev.push((down, Event::StoreDown));
        ev.push((up, Event::StoreUp));
        ev.push((fill, Event::FillFs));
        ev.push((fill + outage, Event::FreeFs));
    }
    let mut t = Duration::from_secs(1);
    let kinds = [
        Hangup::HalfWrite,
        Hangup::WriteNoReply,
        Hangup::ReadNoReply,
        Hangup::FlushNoReply,
    ];
    while t + Duration::from_secs(1) < Duration::from_secs(secs) {
        ev.push((t, Event::Hangup(*rng.pick(&kinds))));
        t += Duration::from_millis(rng.range(800, 2500));
    }
    ev.sort_by_key(|(t, _)| *t);
    ev
}

/// Failed store requests the engine counted: upload attempts and GETs (client reads,
/// GC's reads of its victims).
fn store_failures(m: &str) -> f64 {
    ["store_put_retries_total", "store_get_failures_total"]
        .iter()
        .filter_map(|name| metric(m, name))
        .sum()
}

/// Wait, up to `limit`, until the engine counts a failed store request. Returns how
/// long it waited.
fn hold_outage_until_seen(metrics: &str, limit: Duration) -> Duration {
    let t0 = Instant::now();
    common::wait_until(limit, || {
        metrics_text(metrics).is_some_and(|m| store_failures(&m) > 0.0)
    });
    t0.elapsed()
}

/// Read every block over a fresh connection (after a FLUSH) and check it: against the
/// live window (acknowledged..=issued) when `exact` is None, else against exactly the
/// versions given. Returns the version of every block.
fn verify_all(
    rt: &tokio::runtime::Runtime,
    target: &Target,
    oracle: &Oracle,
    exact: Option<&[u32]>,
) -> Vec<u32> {
    rt.block_on(async {
        let c = Client::connect(target).await.expect("connect to verify");
        c.flush().await.expect("FLUSH before verifying");
        let blocks = VOLUME_BYTES / BLOCK;
        let mut seen = Vec::with_capacity(blocks as usize);
        let step = 256u64;
        for first in (0..blocks).step_by(step as usize) {
            let data = c
                .read(first * BLOCK, (step * BLOCK) as u32)
                .await
                .unwrap_or_else(|e| panic!("READ at block {first} while verifying: {e}"));
            for i in 0..step {
                let b = first + i;
                let (lo, hi) = match exact {
                    Some(v) => (v[b as usize], v[b as usize]),
                    None => (oracle.acked(b), oracle.issued(b)),
                };
                let block = &data[(i * BLOCK) as usize..((i + 1) * BLOCK) as usize];
                match oracle.check(b, block, lo, hi) {
                    Ok(v) => seen.push(v),
                    Err(e) => panic!("verify: {e}"),
                }
            }
        }
        seen
    })
}

fn count(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn soak_store_outage_full_cache_fs_and_dropped_clients() {
    let Some(gw_bin) = find_versitygw() else {
        let msg = "soak: needs versitygw (scripts/install-versitygw.sh, or LSVD_VERSITYGW=PATH)";
        let required = ["LSVD_REQUIRE_S3", "LSVD_SOAK_REQUIRE"]
            .iter()
            .any(|v| std::env::var(v).is_ok_and(|v| !v.is_empty() && v != "0"));
        assert!(!required, "{msg}; not skipped: an S3 server is required");
        say(&format!("SKIPPED {msg}"));
        return;
    };
    let secs = env_u64("LSVD_SOAK_SECONDS").unwrap_or(40).max(10);
    let outage = Duration::from_secs(
        env_u64("LSVD_SOAK_OUTAGE_SECONDS").unwrap_or(if secs >= 120 { 30 } else { 5 }),
    );
    let seed = env_u64("LSVD_SOAK_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let _note = SeedNote(seed);
    say(&format!(
        "seed {seed} (LSVD_SOAK_SEED), {secs} s of I/O (LSVD_SOAK_SECONDS), store outages of {} s",
        outage.as_secs()
    ));
    let wall = Instant::now();
    let mut rng = Rng::new(seed);

    // Dropped in reverse: lsvd, then the filesystem, the gateway, the directory.
    let dir = TempDir::new("soak");
    let mut gw = Gateway::start(gw_bin, &dir.subdir("s3"));
    let data = dir.join("data");
    let fs = SmallTmpfs::mount(&data, DATA_FS_MIB, "soak: the cache-filesystem-full fault");
    let socket = dir.join("nbd.sock");
    let mut lsvd = Lsvd::new(
        &data,
        &socket,
        &dir.join("lsvd.log"),
        gw.store_url(),
        &SERVE_ARGS,
    );
    run_ok(
        &mut lsvd.cmd(&gw, &["create", VOLUME, "--size", "64M"]),
        SHORT,
    );
    lsvd.start(&gw);
    let target = Target::Unix {
        path: socket.display().to_string(),
        export: VOLUME.to_string(),
    };

    let blocks = VOLUME_BYTES / BLOCK;
    let oracle = Arc::new(Oracle::new(seed, blocks));
    let shared = Arc::new(Shared {
        oracle: oracle.clone(),
        counters: Default::default(),
        stop: Default::default(),
        store_away: Default::default(),
        failures: Default::default(),
        zone: blocks - FAULT_ZONE_BLOCKS,
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|id| rt.spawn(load::worker(target.clone(), id, rng.fork(), shared.clone())))
        .collect();

    // Run the fault schedule.
    let events = schedule(&mut rng, secs, outage);
    let start = Instant::now();
    let mut next_fault_block = shared.zone;
    let mut hangups = std::collections::BTreeMap::<String, u64>::new();
    let (mut outages, mut fills, mut filled_bytes) = (0u64, 0u64, 0u64);
    let mut writes_while_full = 0u64;
    let mut writes_at_fill = 0u64;
    let mut store_back_at: Option<Instant> = None;
    let wait_until = |t: Duration, shared: &Shared, back: &mut Option<Instant>| {
        let mut poll = common::Poller::new(Duration::from_millis(50), common::NO_LIMIT);
        while start.elapsed() < t && !shared.failed() && poll.tick_blocking() {
            if back.is_some_and(|b| b.elapsed() > Duration::from_secs(30)) {
                shared.store_away.store(false, Ordering::SeqCst);
                *back = None;
            }
        }
    };
    for (t, event) in events {
        wait_until(t, &shared, &mut store_back_at);
        if shared.failed() {
            break;
        }
        match event {
            Event::StoreDown => {
                shared.store_away.store(true, Ordering::SeqCst);
                store_back_at = None;
                gw.stop();
                outages += 1;
                say(&format!("{:?}: store down", start.elapsed()));
            }
            Event::StoreUp => {
                // The engine may make no store request for a while (client batches
                // held behind a GC pass that reads from the read cache, say): keep the
                // store down, up to 30 s more, until a request has found it missing,
                // so the outage is one the engine lived through.
                let extended = hold_outage_until_seen(&lsvd.metrics, Duration::from_secs(30));
                if extended > Duration::from_millis(500) {
                    say(&format!(
                        "{:?}: outage extended by {extended:?} until a store request failed",
                        start.elapsed()
                    ));
                }
                gw.restart();
                store_back_at = Some(Instant::now());
                say(&format!("{:?}: store back", start.elapsed()));
            }
            Event::FillFs => {
                if let Some(fs) = &fs {
                    filled_bytes += fs.fill();
                    assert!(fs.is_full(), "the cache filesystem did not fill up");
                    fills += 1;
                    writes_at_fill = shared.counters.writes.load(Ordering::SeqCst);
                    say(&format!("{:?}: cache filesystem full", start.elapsed()));
                }
            }
            Event::FreeFs => {
                if let Some(fs) = &fs {
                    assert!(fs.is_full(), "the cache filesystem is no longer full");
                    writes_while_full +=
                        shared.counters.writes.load(Ordering::SeqCst) - writes_at_fill;
                    fs.free();
                    say(&format!("{:?}: cache filesystem freed", start.elapsed()));
                }
            }
            Event::Hangup(mut kind) => {
                let n = rng.range(1, 4);
                if next_fault_block + n > blocks && kind != Hangup::FlushNoReply {
                    kind = Hangup::ReadNoReply;
                }
                let first = next_fault_block;
                if matches!(kind, Hangup::HalfWrite | Hangup::WriteNoReply) {
                    next_fault_block += n;
                }
                let read_at = rng.below(blocks - 256);
                if let Err(e) =
                    load::drop_connection(&socket, VOLUME, &oracle, kind, first, n, read_at)
                {
                    shared.fail(format!(
                        "a client that hangs up ({kind:?}) could not connect: {e}"
                    ));
                }
                *hangups.entry(format!("{kind:?}")).or_default() += 1;
            }
        }
    }
    wait_until(Duration::from_secs(secs), &shared, &mut store_back_at);
    shared.stop.store(true, Ordering::SeqCst);
    rt.block_on(async {
        for w in workers {
            tokio::time::timeout(Duration::from_secs(300), w)
                .await
                .expect("workers stop within 300 s")
                .expect("worker panicked");
        }
    });
    let failures = shared.failures.lock().expect("failures").clone();
    assert!(
        failures.is_empty(),
        "the oracle found {} problem(s):\n{}\n--- server log (tail) ---\n{}",
        failures.len(),
        failures.join("\n"),
        tail(&lsvd.log(), 80)
    );
    let io_secs = start.elapsed().as_secs_f64();
    shared.store_away.store(false, Ordering::SeqCst);
    if let Some(fs) = &fs {
        fs.free();
    }
    // Requests of clients that hung up run to completion: let them land.
    common::let_time_pass(Duration::from_secs(1));

    // Every fault left a line in the log and moved a metric.
    let log = lsvd.log();
    let m = metrics_text(&lsvd.metrics).expect("metrics endpoint answers");
    let mval = |name: &str| metric(&m, name).unwrap_or_else(|| panic!("no metric lsvd_{name}"));
    if outages > 0 {
        // Uploads that found the store away, or (when client batches waited behind
        // GC) GC passes whose GETs did: either way, a metric and a line.
        assert!(
            store_failures(&m) > 0.0,
            "store outage: no failed store request counted\n{m}"
        );
        if mval("store_put_retries_total") > 0.0 {
            assert!(
                count(&log, "store unavailable:") > 0,
                "store outage: no log line for the failed uploads\n{log}"
            );
            assert!(
                count(&log, "store reachable again") > 0,
                "store back: no log line\n{log}"
            );
        }
        if mval("gc_passes_failed_total") > 0.0 {
            assert!(
                count(&log, "gc pass failed") > 0,
                "store outage: no log line for the failed GC passes\n{log}"
            );
        }
    }
    let log_full_lines = count(&log, "write log full: client writes wait");
    assert_eq!(
        mval("log_full_waits_total") as usize,
        log_full_lines,
        "each full-log episode is one line and one count"
    );
    assert_eq!(
        mval("log_full"),
        0.0,
        "the log is not full once the store is back"
    );
    let half = hangups.get("HalfWrite").copied().unwrap_or(0) as usize;
    assert_eq!(
        count(&log, "cut short, not executed"),
        half,
        "one line per half-sent WRITE"
    );
    let aborted = mval("nbd_connections_aborted_total") as usize;
    assert!(
        aborted >= half,
        "{aborted} aborted connections counted, {half} half-sent WRITEs"
    );
    if fills > 0 {
        assert!(
            writes_while_full > 0,
            "no write was acknowledged while the cache filesystem was full"
        );
    }
    assert!(!log.contains("panicked"), "lsvd panicked\n{log}");

    // Final checks: live, then after a clean restart, after SIGKILL with the cache
    // filesystem full, and from the store alone.
    let k = &shared.counters;
    let live = verify_all(&rt, &target, &oracle, None);
    // Implied by the live window (acknowledged..=issued), said outright: nothing made
    // durable by a FLUSH or FUA is older than what the disk holds.
    let durable_blocks = (0..blocks)
        .filter(|b| {
            let d = oracle.durable(*b);
            assert!(
                live[*b as usize] >= d,
                "block {b}: durable version {d} lost"
            );
            d > 0
        })
        .count();
    lsvd.stop_clean();
    lsvd.start(&gw);
    verify_all(&rt, &target, &oracle, Some(&live));
    if let Some(fs) = &fs {
        fs.fill();
        assert!(fs.is_full());
    }
    lsvd.kill9();
    lsvd.start(&gw);
    verify_all(&rt, &target, &oracle, Some(&live));
    if let Some(fs) = &fs {
        fs.free();
    }
    let settled = common::wait_until(Duration::from_secs(300), || {
        metrics_text(&lsvd.metrics).is_some_and(|t| {
            metric(&t, "uploads_pending") == Some(0.0) && metric(&t, "log_used_bytes") == Some(0.0)
        })
    });
    assert!(settled, "uploads did not finish\n{}", tail(&lsvd.log(), 40));
    lsvd.kill9();
    for e in std::fs::read_dir(&data).expect("read data dir") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            std::fs::remove_dir_all(&p).expect("remove cache dir");
        } else {
            std::fs::remove_file(&p).expect("remove cache file");
        }
    }
    lsvd.start(&gw);
    verify_all(&rt, &target, &oracle, Some(&live));
    lsvd.stop_clean();

    let log = lsvd.log();
    say(&format!(
        "PASSED seed {seed}: {io_secs:.0} s of I/O on {CONNECTIONS} connections, {:.0} s wall\n  \
         ops: {} writes ({} FUA, {} MiB), {} reads ({} MiB), {} flushes, {} trims; \
         {} blocks checked live, {} reads failed while the store was away\n  \
         faults: {outages} store outages of {} s (store_put_retries_total {}, \
         store_get_failures_total {}, gc_passes_failed_total {}), \
         {} full-log episodes, {fills} cache-fs fills ({} MiB filler, {writes_while_full} writes \
         acknowledged meanwhile), client hang-ups {hangups:?} ({aborted} connections counted aborted)\n  \
         final: {} blocks checked 4 times (live, clean restart, SIGKILL with full cache fs, store alone); \
         {} written blocks ({durable_blocks} with a version made durable by FLUSH/FUA), {} blocks trimmed last",
        wall.elapsed().as_secs_f64(),
        k.writes.load(Ordering::SeqCst),
        k.fua_writes.load(Ordering::SeqCst),
        k.write_bytes.load(Ordering::SeqCst) >> 20,
        k.reads.load(Ordering::SeqCst),
        k.read_bytes.load(Ordering::SeqCst) >> 20,
        k.flushes.load(Ordering::SeqCst),
        k.trims.load(Ordering::SeqCst),
        k.blocks_checked.load(Ordering::SeqCst),
        k.read_errors_store_away.load(Ordering::SeqCst),
        outage.as_secs(),
        mval("store_put_retries_total"),
        mval("store_get_failures_total"),
        mval("gc_passes_failed_total"),
        log_full_lines,
        filled_bytes >> 20,
        blocks,
        live.iter().filter(|v| **v > 0).count(),
        (0..blocks)
            .filter(|b| live[*b as usize] > 0
                && oracle
                    .check(*b, &[0u8; 4096], live[*b as usize], live[*b as usize])
                    .is_ok())
            .count(),
    ));
    assert!(!log.contains("panicked"), "lsvd panicked\n{log}");
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A new volume on a cache filesystem without room for its files: `lsvd serve` fails
/// at once, naming the file and ENOSPC, and leaves nothing behind taking up space. It
/// used to fall back to a *sparse* read cache when preallocation failed with ENOSPC,
/// start serving, and hit ENOSPC later, while serving.
#[test]
fn serve_on_a_full_cache_filesystem_fails_at_start_and_cleans_up() {
    let dir = TempDir::new("soak-fullfs");
    let data = dir.join("data");
    let test = "serve_on_a_full_cache_filesystem_fails_at_start_and_cleans_up";
    let Some(fs) = SmallTmpfs::mount(&data, 40, test) else {
        return;
    };
    let lsvd = common::Lsvd::with_store(&data, &dir.subdir("store"));
    lsvd.create("v", "16M");
    let socket = dir.join("s.sock");
    let free_before = free_bytes(fs.path());
    // `lsvd serve` with a write log and a read cache of these sizes must fail (exit
    // 1) for want of room for `file`, leaving `leftover` behind.
    let refused = |log_size: &str, read_cache_size: &str, file: &str, leftover: &str| {
        let mut serve = lsvd.cmd(["serve", "v", "--no-probe", "--socket"]);
        serve
            .arg(&socket)
            .args(["--log-size", log_size, "--read-cache-size", read_cache_size]);
        let out = common::run_timeout(&mut serve, SHORT);
        let err = common::stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(file) && err.contains("No space left on device"),
            "{err}"
        );
        assert!(!data.join(leftover).exists(), "{leftover} was left behind");
    };
    // The write log (16 MiB) would fit, the read cache (64 MiB, made first: the
    // server's volumes share it) does not: no sparse read cache left behind.
    refused("16M", "64M", "read cache", "@host.rcache");
    // The write log, too big for what is left: no partial file left either.
    assert!(
        !data.join("v.wlog").exists(),
        "no log made before the cache"
    );
    refused("64M", "0", "write log", "v.creating");
    assert!(
        free_bytes(fs.path()) + (64 << 10) >= free_before,
        "space leaked"
    );
}

fn free_bytes(path: &std::path::Path) -> u64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: statvfs on a NUL-terminated path into a zeroed struct we own.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    assert_eq!(rc, 0, "statvfs");
    st.f_bavail * st.f_frsize
}
