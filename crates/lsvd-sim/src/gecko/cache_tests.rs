//! Tests of the tail cache and of mirrored layouts: LRU order on a tiny example,
//! hit counts of small traces worked out by hand, no drive time for hits, and
//! mirrored writes and reads on the drive pairs.

use std::sync::Arc;

use super::array::Array;
use super::cache::TailCache;
use super::config::Config;
use super::device::{DeviceModel, Hdd, Op};
use super::layout::{BLOCK_BYTES, ChainGc, Geometry, LayoutKind, VictimPolicy};
use super::report::RunResult;
use super::run::simulate;
use super::trace::{self, TraceMix};
use lsvd_store::testutil::TempDir;

#[test]
fn lru_evicts_the_least_recently_used_block() {
    let mut c = TailCache::new(3, 10);
    for b in [1, 2, 3] {
        c.admit(b);
    }
    assert_eq!(c.lru_order(), vec![1, 2, 3]);
    // A hit makes 1 the most recently used.
    assert!(c.read(1));
    assert_eq!(c.lru_order(), vec![2, 3, 1]);
    // Full: admitting 4 evicts 2, the least recently used.
    c.admit(4);
    assert_eq!(c.lru_order(), vec![3, 1, 4]);
    assert!(!c.contains(2));
    // A miss is not admitted.
    assert!(!c.read(2));
    assert_eq!(c.len(), 3);
    // Rewriting a cached block moves it, evicting nothing.
    c.admit(3);
    assert_eq!(c.lru_order(), vec![1, 4, 3]);
    c.admit(5);
    assert_eq!(c.lru_order(), vec![4, 3, 5]);
    // Blocks outside the address space are ignored.
    c.admit(10);
    assert!(!c.read(10));
    assert_eq!(c.lru_order(), vec![4, 3, 5]);
    // Capacity 0 is off: nothing is held.
    let mut off = TailCache::new(0, 10);
    off.admit(1);
    assert!(!off.read(1));
    assert!(off.is_empty());
}

#[test]
fn a_capacity_of_one_keeps_only_the_last_write() {
    let mut c = TailCache::new(1, 4);
    c.admit(0);
    c.admit(1);
    assert_eq!(c.lru_order(), vec![1]);
    assert!(!c.read(0));
    assert!(c.read(1));
}

/// One MSR trace file of 4 KiB requests: `(write, block)` in order.
fn mix(dir: &TempDir, name: &str, ops: &[(bool, u64)]) -> TraceMix {
    let mut s = String::new();
    for (i, &(write, block)) in ops.iter().enumerate() {
        let op = if write { "Write" } else { "Read" };
        s.push_str(&format!(
            "{},h,0,{op},{},4096,10\n",
            128166385295514663 + i as u64,
            block * BLOCK_BYTES
        ));
    }
    trace::load(&[crate::trace_file(dir, name, &s)], "msr", 64).expect("loads")
}

/// A chain of 3 default disks of 24 segments of 16 KiB (22 usable beside the GC
/// reserve: 88 blocks per drive), no GC, replaying `mix`.
fn chain_run(mix: &TraceMix, tail_cache_blocks: u64, copies: u32) -> RunResult {
    let cfg = Config {
        geo: Geometry {
            kind: LayoutKind::Chain,
            drives: 3,
            drive_bytes: 24 * (16 << 10),
            segment_bytes: 16 << 10,
            chunk_bytes: 16 << 10,
            reserve_segments: 2,
        },
        device: DeviceModel::Hdd(Hdd::default()),
        chain_gc: ChainGc::CompactInBody,
        policy: VictimPolicy::Greedy,
        clients: 4,
        queue_depth: 8,
        io_bytes: BLOCK_BYTES,
        write_fraction: 1.0,
        fill: 0.5,
        trace: Some(Arc::new(mix.clone())),
        gc_start_free: 0.0,
        gc_stop_free: 0.4,
        duration_ns: 60_000_000_000,
        interval_ns: 1_000_000_000,
        seed: 1,
        copies,
        tail_cache_blocks,
    };
    let r = simulate(&cfg).expect("runs");
    assert_eq!(r.summary.requests_done, mix.requests.len() as u64);
    r
}

/// Total drive service time of a run, in seconds.
fn drive_seconds(r: &RunResult) -> f64 {
    let s = &r.summary;
    s.drive_busy_fraction.iter().sum::<f64>() * s.simulated_s
}

#[test]
fn a_large_cache_serves_every_read_of_written_blocks() {
    let dir = TempDir::new("gecko-cache-all");
    // Write 32 blocks, then read each of them twice.
    let mut ops: Vec<(bool, u64)> = (0..32).map(|b| (true, b)).collect();
    ops.extend((0..64).map(|i| (false, i % 32)));
    let m = mix(&dir, "wr.csv", &ops);
    let writes_only = mix(&dir, "w.csv", &ops[..32]);
    let r = chain_run(&m, 32, 1);
    let c = r.summary.tail_cache.as_ref().expect("cache on");
    assert_eq!((c.read_blocks, c.hit_blocks), (64, 64));
    assert_eq!(c.size_bytes, 32 * BLOCK_BYTES);
    assert_eq!(c.hit_rate, Some(1.0));
    // The prefill (32 blocks) and the rewrites (32) fit on drive 0 (88 blocks), the
    // tail: every read is of the tail.
    assert_eq!(r.summary.tail_moves_s, vec![]);
    assert_eq!((c.tail_read_blocks, c.tail_hit_blocks), (64, 64));
    assert_eq!(c.tail_hit_rate, Some(1.0));
    // Hits touch no drive: the drives worked exactly as long as for the writes alone.
    let w = chain_run(&writes_only, 32, 1);
    assert!((drive_seconds(&r) - drive_seconds(&w)).abs() < 1e-9);
    // Without the cache the same reads cost drive time (at least one positioned 4 KiB
    // read, 12.69 ms, then sequential ones), and no cache is reported.
    let off = chain_run(&m, 0, 1);
    assert!(off.summary.tail_cache.is_none());
    assert!(drive_seconds(&off) > drive_seconds(&w) + 0.0126);
    assert!(r.summary.simulated_s < off.summary.simulated_s);
}

#[test]
fn tail_hits_count_only_blocks_on_the_tail_drive() {
    let dir = TempDir::new("gecko-cache-tail");
    // 96 blocks: the prefill puts 0..87 on drive 0 (its 88 usable blocks) and 88..95
    // on drive 1, which becomes the tail. Read everything, rewrite 64..95 (to the
    // tail), read everything again.
    let mut ops: Vec<(bool, u64)> = (0..96).map(|b| (false, b)).collect();
    ops.extend((64..96).map(|b| (true, b)));
    ops.extend((0..96).map(|b| (false, b)));
    let m = mix(&dir, "t.csv", &ops);
    assert_eq!(m.logical_blocks, 96);
    let r = chain_run(&m, 1000, 1);
    assert_eq!(r.summary.tail_moves_s, vec![(0.0, 1)]);
    let c = r.summary.tail_cache.as_ref().expect("cache on");
    // First pass: 96 misses, 8 of them (88..95) on the tail. Second pass: 0..63 miss
    // on drive 0, 64..95 hit on the tail.
    assert_eq!((c.read_blocks, c.hit_blocks), (192, 32));
    assert_eq!((c.tail_read_blocks, c.tail_hit_blocks), (40, 32));
    assert_eq!(c.hit_rate, Some(32.0 / 192.0));
    assert_eq!(c.tail_hit_rate, Some(0.8));
    // A 16-block cache keeps the last 16 writes (80..95): 16 hits.
    let small = chain_run(&m, 16, 1);
    let c = small.summary.tail_cache.as_ref().expect("cache on");
    assert_eq!((c.hit_blocks, c.tail_hit_blocks), (16, 16));
    assert_eq!(c.tail_read_blocks, 40);
}

#[test]
fn mirrored_writes_go_to_both_drives_and_reads_to_the_idle_one() {
    let model = DeviceModel::Hdd(Hdd::default());
    // Random 4 KiB on the default disk: 8.5 ms + 4.1667 ms + 27.3 us.
    let random_ns: u64 = 8_500_000 + 4_166_667 + 27_307;
    let mut a = Array::new(&model, 2, 2, 1 << 30);
    let w = a.submit(0, Op::Write, 1, 1 << 20, 4096);
    assert!(w.abs_diff(random_ns) <= 1, "{w}");
    let busy = a.busy_fractions(w);
    assert_eq!(busy.len(), 4);
    assert_eq!(busy[0] + busy[1], 0.0);
    assert!(busy[2] > 0.99 && busy[2] == busy[3]);
    // Two reads of position 0 at once: one per drive of the pair, both done after
    // one random read (unmirrored, the second would wait for the first).
    let r1 = a.submit(0, Op::Read, 0, 1 << 20, 4096);
    let r2 = a.submit(0, Op::Read, 0, 2 << 20, 4096);
    assert!(r1.abs_diff(random_ns) <= 1 && r2.abs_diff(random_ns) <= 1);
    let mut single = Array::new(&model, 2, 1, 1 << 30);
    single.submit(0, Op::Read, 0, 1 << 20, 4096);
    let second = single.submit(0, Op::Read, 0, 2 << 20, 4096);
    assert!(second.abs_diff(2 * random_ns) <= 2, "{second}");
}

#[test]
fn a_mirrored_chain_writes_its_tail_pair_at_one_drive_rate() {
    let dir = TempDir::new("gecko-mirror-run");
    // Writes only (64 blocks prefilled, 150 appended: drives 0 and 1 fill, drive 2
    // takes the last 38): both drives of each position do the same work, at the
    // pace of one.
    let ops: Vec<(bool, u64)> = (0..150).map(|i| (true, (i * 7) % 64)).collect();
    let m = mix(&dir, "m.csv", &ops);
    let plain = chain_run(&m, 0, 1);
    let mirrored = chain_run(&m, 0, 2);
    let busy = &mirrored.summary.drive_busy_fraction;
    assert_eq!(busy.len(), 6);
    for pair in busy.chunks(2) {
        assert!(pair[0] > 0.0 && pair[0] == pair[1], "{busy:?}");
    }
    assert_eq!(mirrored.summary.tail_moves_s.len(), 2);
    assert_eq!(mirrored.summary.simulated_s, plain.summary.simulated_s);
    assert!(mirrored.name.starts_with("chain:3x2"), "{}", mirrored.name);
}

/// `lsvd sim` with these arguments after `sim`.
fn cli_report(args: &[&str]) -> super::report::GeckoReport {
    super::cli::simulate(&super::tests::sim_args(args)).expect("runs")
}

#[test]
fn the_table_and_json_report_hits_only_with_a_cache() {
    let common = crate::tests::words(
        "--layout chain:2x2,stripe:2 --drive-size 32M --seconds 0.2 --interval-ms 20 --write-fraction 0.5 --fill 0.05",
    );
    let mut with = common.to_vec();
    with.extend_from_slice(&["--tail-cache", "1M"]);
    let r = cli_report(&with);
    let names: Vec<&str> = r.runs.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["chain:2x2 compact-in-body", "stripe:2"]);
    assert_eq!(r.runs[0].summary.drive_busy_fraction.len(), 4);
    for run in &r.runs {
        let c = run.summary.tail_cache.as_ref().expect("cache on");
        assert_eq!(c.size_bytes, 1 << 20);
        // Random reads over 3.2 MiB, half the requests writes: some reads find
        // blocks written in the run, most find prefilled ones.
        assert!(c.read_blocks > 0 && c.hit_blocks > 0 && c.hit_blocks < c.read_blocks);
    }
    assert_eq!(
        r.runs[1]
            .summary
            .tail_cache
            .as_ref()
            .map(|c| c.tail_hit_rate),
        Some(None)
    );
    let text = super::report::text(&r);
    assert!(
        text.contains("tail_hit") && text.contains("tail cache: 1.0 MiB"),
        "{text}"
    );
    let json = serde_json::to_string(&r).expect("encodes");
    assert!(json.contains("\"tail_hit_rate\""));
    let off = cli_report(&common);
    assert!(off.runs.iter().all(|x| x.summary.tail_cache.is_none()));
    assert!(!super::report::text(&off).contains("tail_hit"));
    assert!(
        !serde_json::to_string(&off)
            .expect("encodes")
            .contains("tail_cache")
    );
}
