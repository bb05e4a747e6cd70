//! Unit tests of the simulator: hand-computed scenarios, agreement with the cleaning
//! cost theory, and runs over the shared traces.

use lsvd_core::format::SECTOR_BYTES;
use lsvd_core::format::checkpoint::encode_checkpoint;
use lsvd_core::format::object::{ObjectSpec, encode_object};
use lsvd_core::gc::{GcConfig, GcPolicy};
use lsvd_trace::synthetic::prng::Rng;
use lsvd_trace::{Op, Pattern, Request, SyntheticSpec};

use super::volume::{SimConfig, VolumeSim, checkpoint_object_size};

const BLOCK: u64 = 4096;

fn no_gc() -> GcConfig {
    GcConfig {
        start_utilization: 0.0,
        ..GcConfig::default()
    }
}

fn config(batch: u64) -> SimConfig {
    SimConfig {
        batch_size_bytes: batch,
        batch_timeout_ns: None,
        checkpoint_every_objects: 1000,
        checkpoint_interval_ns: None,
        gc: no_gc(),
        volume_size_bytes: None,
        series_points: 0,
    }
}

fn req(time_ns: u64, op: Op, offset_bytes: u64, length_bytes: u64) -> Request {
    Request {
        time_ns,
        volume: 0,
        op,
        offset_bytes,
        length_bytes,
    }
}

fn write_block(sim: &mut VolumeSim, block: u64) {
    sim.request(&req(0, Op::Write, block * BLOCK, BLOCK));
}

/// Size of a data object with `extents` 4 KiB extents: fixed header, 16 bytes per
/// extent, a 4-byte checksum per 4 KiB chunk, and the data.
fn data_object_bytes(extents: u64) -> u64 {
    112 + 16 * extents + 4 * extents + extents * BLOCK
}

#[test]
fn coalescing_within_a_batch_gives_the_merge_ratio() {
    // 16 writes of 4 KiB fill a 64 KiB batch: block 0 four times, blocks 1..=12 once.
    let mut sim = VolumeSim::new(config(64 << 10));
    for _ in 0..4 {
        write_block(&mut sim, 0);
    }
    for b in 1..=12 {
        write_block(&mut sim, b);
    }
    let c = *sim.counters();
    assert_eq!(c.data_objects, 1, "the batch closed when full");
    assert_eq!(c.client_write_bytes, 16 * BLOCK);
    assert_eq!(c.coalesced_bytes, 3 * BLOCK);
    // 13 extents (pieces of different records never merge in a batch).
    assert_eq!(c.data_object_bytes, data_object_bytes(13));
    sim.finish();
    let r = sim.report();
    assert_eq!(r.merge_ratio, 3.0 / 16.0);
    // In the store map the 13 extents are contiguous in LBA and in the object: one.
    assert_eq!(r.map_extents, 1);
    // The clean checkpoint: 112 fixed + 40 per object and 32 per extent, and a header
    // of 112 bytes plus one chunk checksum.
    assert_eq!(r.counters.checkpoint_bytes, 112 + 4 + 112 + 40 + 32);
    assert_eq!(
        r.write_amplification,
        (data_object_bytes(13) + 116 + 112 + 72) as f64 / (16 * BLOCK) as f64
    );
    assert_eq!(r.live_bytes, 13 * BLOCK);
}

#[test]
fn without_overwrites_waf_is_one_plus_header_overhead() {
    // 64 distinct blocks in a scattered order, 16 per object.
    let mut sim = VolumeSim::new(config(64 << 10));
    let mut rng = Rng::new(7);
    let mut blocks: Vec<u64> = (0..64).map(|i| i * 3).collect();
    for i in (1..blocks.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        blocks.swap(i, j);
    }
    for b in &blocks {
        write_block(&mut sim, *b);
    }
    sim.finish();
    let r = sim.report();
    let c = r.counters;
    assert_eq!(c.data_objects, 4);
    assert_eq!(c.data_object_bytes, 4 * data_object_bytes(16));
    assert_eq!(c.coalesced_bytes, 0);
    assert_eq!(c.gc_passes, 0);
    // Data objects alone: 1 + (112 + 16*20) / 65536 per object.
    let data_waf = c.data_object_bytes as f64 / c.client_write_bytes as f64;
    assert!((data_waf - (1.0 + 432.0 / 65536.0)).abs() < 1e-12);
    assert_eq!(
        r.write_amplification,
        (c.data_object_bytes + c.checkpoint_bytes) as f64 / c.client_write_bytes as f64
    );
    assert_eq!(r.map_extents, 64);
    assert_eq!(
        r.volume_size_bytes,
        1 << 30,
        "default size: max end rounded to 1 GiB"
    );
}

#[test]
fn checkpoint_size_matches_the_encoder() {
    let mut sim = VolumeSim::new(config(64 << 10));
    let mut rng = Rng::new(3);
    for _ in 0..300 {
        write_block(&mut sim, rng.below(200));
    }
    sim.request(&req(0, Op::Trim, 0, 64 * BLOCK));
    let state = sim.state();
    let (header, payload) = checkpoint_object_size(state, 0);
    let encoded = encode_checkpoint(&state.to_checkpoint(false, Default::default()));
    assert_eq!(encoded.len() as u64, payload);
    let spec = ObjectSpec::checkpoint(
        Default::default(),
        state.next_object_seq(),
        state.last_record_seq(),
        0,
    );
    assert_eq!(
        encode_object(&spec, &encoded).len() as u64,
        header + payload
    );
    // With hylog's write frequencies (counters of 1 to 5 LEB128 bytes).
    let mut heat = lsvd_core::heat::HeatTracker::new(Some(64 << 20));
    for i in 0..2000u64 {
        heat.record_write((i * 7919) % 4096, 8 + (i % 3) * 4096);
    }
    let mut with_heat = state.to_checkpoint(false, Default::default());
    with_heat.heat = Some(heat.to_checkpoint());
    let encoded = encode_checkpoint(&with_heat);
    let (header, payload) = checkpoint_object_size(state, heat.checkpoint_bytes());
    assert_eq!(encoded.len() as u64, payload);
    assert_eq!(
        encode_object(&spec, &encoded).len() as u64,
        header + payload
    );
}

#[test]
fn trims_remove_data_and_dead_objects_are_deleted_at_checkpoints() {
    let mut cfg = config(64 << 10);
    cfg.checkpoint_every_objects = 2;
    let mut sim = VolumeSim::new(cfg);
    // Object 1: blocks 0..16. Then a trim of blocks 0..16 and 16 new blocks: object 2
    // holds the trim and blocks 100..116; object 1 is dead. Checkpoint 3 leaves object
    // 1 out; it stays in the store until the next checkpoint (5) is written.
    for b in 0..16 {
        write_block(&mut sim, b);
    }
    sim.request(&req(0, Op::Trim, 0, 16 * BLOCK));
    for b in 100..116 {
        write_block(&mut sim, b);
    }
    let c = *sim.counters();
    assert_eq!((c.data_objects, c.checkpoint_objects), (2, 1));
    assert_eq!(c.trim_requests, 1);
    assert_eq!(c.trim_bytes, 16 * BLOCK);
    assert_eq!(c.deleted_objects, 0);
    assert!(!sim.state().objects().contains_key(&1));
    assert_eq!(
        sim.awaiting_delete()
            .iter()
            .map(|&(s, _, _)| s)
            .collect::<Vec<_>>(),
        vec![1]
    );
    assert_eq!(
        sim.state()
            .checkpoints()
            .keys()
            .copied()
            .collect::<Vec<_>>(),
        vec![3]
    );
    // Object 2's header carries the trim: 112 + 16 extents * 20 + one 16-byte trim.
    assert_eq!(c.data_object_bytes, 2 * data_object_bytes(16) + 16);
    assert_eq!(sim.live_bytes(), 16 * BLOCK);
    // The next checkpoint deletes it.
    for b in 200..232 {
        write_block(&mut sim, b);
    }
    assert!(sim.counters().checkpoint_objects >= 2);
    assert_eq!(sim.counters().deleted_objects, 1);
    assert!(sim.awaiting_delete().iter().all(|&(s, _, _)| s != 1));
    // A trim and a write inside one batch: coalescing counts the trimmed bytes.
    let mut sim = VolumeSim::new(config(1 << 20));
    sim.request(&req(0, Op::Write, 0, 8 * BLOCK));
    sim.request(&req(0, Op::Trim, 2 * BLOCK, 2 * BLOCK));
    sim.finish();
    assert_eq!(sim.counters().coalesced_bytes, 2 * BLOCK);
    assert_eq!(sim.report().map_extents, 2);
}

#[test]
fn old_checkpoints_are_deleted_keeping_two() {
    let mut cfg = config(4096);
    cfg.checkpoint_every_objects = 1;
    let mut sim = VolumeSim::new(cfg);
    for b in 0..5 {
        write_block(&mut sim, b);
    }
    // Objects: d1 c2 d3 c4 d5 c6 d7 c8 d9 c10.
    let kept: Vec<u64> = sim.retained_checkpoints().iter().map(|c| c.0).collect();
    assert_eq!(kept, vec![8, 10]);
    assert_eq!(sim.counters().checkpoint_objects, 5);
    sim.finish();
    let kept: Vec<u64> = sim.retained_checkpoints().iter().map(|c| c.0).collect();
    assert_eq!(kept, vec![10, 11], "the clean checkpoint at shutdown");
}

#[test]
fn batch_timeout_uses_the_trace_clock() {
    let mut cfg = config(8 << 20);
    cfg.batch_timeout_ns = Some(2_000_000_000);
    let mut sim = VolumeSim::new(cfg);
    sim.request(&req(0, Op::Write, 0, BLOCK));
    sim.request(&req(1_000_000_000, Op::Write, BLOCK, BLOCK));
    assert_eq!(sim.counters().data_objects, 0);
    // 2 s after the batch opened: it closes before this request joins a new one.
    sim.request(&req(2_000_000_000, Op::Read, 0, BLOCK));
    assert_eq!(sim.counters().data_objects, 1);
    assert_eq!(sim.counters().timeout_batches, 1);
    sim.request(&req(2_500_000_000, Op::Write, 0, BLOCK));
    sim.finish();
    let c = sim.counters();
    assert_eq!(c.data_objects, 2);
    assert_eq!((c.read_requests, c.read_bytes), (1, BLOCK));
}

#[test]
fn out_of_range_and_misaligned_requests() {
    let mut cfg = config(1 << 20);
    cfg.volume_size_bytes = Some(1 << 20);
    let mut sim = VolumeSim::new(cfg);
    sim.request(&req(0, Op::Write, (1 << 20) - BLOCK, BLOCK));
    sim.request(&req(0, Op::Write, 1 << 20, BLOCK));
    sim.request(&req(0, Op::Write, (1 << 20) - 512, 1024));
    sim.request(&req(0, Op::Write, u64::MAX - 10, 100));
    // Rounded outward: bytes 100..1124 cover sectors 0, 1 and 2.
    sim.request(&req(0, Op::Write, 100, 1024));
    let c = *sim.counters();
    assert_eq!(c.out_of_range_requests, 3);
    assert_eq!(c.misaligned_requests, 1);
    assert_eq!(c.client_write_bytes, BLOCK + 3 * SECTOR_BYTES);
    assert_eq!(c.write_requests, 2);
}

#[test]
fn gc_kicks_in_under_uniform_overwrites() {
    let blocks = 4096; // 16 MiB
    let mut cfg = config(256 << 10);
    cfg.gc = GcConfig {
        pass_bytes: 1 << 20,
        ..GcConfig::default()
    };
    cfg.checkpoint_every_objects = 16;
    let mut sim = VolumeSim::new(cfg);
    for b in 0..blocks {
        write_block(&mut sim, b);
    }
    assert_eq!(
        sim.counters().gc_passes,
        0,
        "no garbage after a sequential fill"
    );
    let mut rng = Rng::new(11);
    for _ in 0..4 * blocks {
        let b = rng.below(blocks);
        write_block(&mut sim, b);
    }
    sim.finish();
    let r = sim.report();
    let c = r.counters;
    assert!(c.gc_passes > 10, "{c:?}");
    assert!(c.gc_bytes_moved > 0);
    assert!(c.gc_objects > 0 && c.deleted_objects >= c.gc_victims);
    assert!(r.write_amplification > 1.3, "{}", r.write_amplification);
    // GC holds utilization near its band, and keeps every block mapped.
    assert!(r.final_utilization > 0.65, "{}", r.final_utilization);
    assert_eq!(r.live_bytes, blocks * BLOCK);
    for p in sim.state().map().iter() {
        assert!(sim.state().objects().contains_key(&p.location.object_seq));
    }
    // The store never grew past the live data over the start threshold by much.
    assert!((c.peak_store_bytes as f64) < (blocks * BLOCK) as f64 / 0.70 * 1.15);
}

/// Lambert W (principal branch) for x in [-1/e, 0), by Newton's method.
fn lambert_w0(x: f64) -> f64 {
    let mut w: f64 = -0.5;
    for _ in 0..100 {
        let e = w.exp();
        let step = (w * e - x) / (e * (w + 1.0));
        w -= step;
        if step.abs() < 1e-15 {
            break;
        }
    }
    w
}

/// Steady-state write amplification of greedy (or FIFO) cleaning under uniform random
/// writes with `alpha` = physical / logical space, for segments of many blocks:
/// the cleaned segments' utilization u solves u = exp(-alpha (1 - u)), so
/// WA = 1 / (1 - u) = alpha / (alpha + W0(-alpha e^-alpha)) (Desnoyers, SYSTOR'12,
/// and Xiang & Kurkoski, arXiv:1110.4245, who check it against greedy simulations).
fn lfs_cleaning_waf(alpha: f64) -> f64 {
    alpha / (alpha + lambert_w0(-alpha * (-alpha).exp()))
}

/// Relocation write amplification (1 + GC bytes moved / client bytes) over a window
/// of 8 volume-writes after a sequential fill and 4 volume-writes of warm-up, and the
/// mean utilization over that window.
fn steady_gc_waf(policy: GcPolicy, pattern: Pattern, start: f64, stop: f64) -> (f64, f64) {
    let blocks = 16384; // 64 MiB of 4 KiB blocks
    let mut cfg = config(1 << 20);
    cfg.gc = GcConfig {
        start_utilization: start,
        stop_utilization: stop,
        policy,
        pass_bytes: 2 << 20,
        defrag_hole_bytes: 0,
    };
    cfg.checkpoint_every_objects = 64;
    cfg.series_points = 1 << 20;
    let mut sim = VolumeSim::new(cfg);
    let mut stream = lsvd_trace::synthetic(SyntheticSpec {
        pattern,
        volume_size_bytes: blocks * BLOCK,
        io_size_bytes: BLOCK,
        requests: 12 * blocks,
        write_fraction: 1.0,
        seed: 42,
        precondition: true,
    })
    .expect("valid workload");
    for r in stream.by_ref().take(5 * blocks as usize) {
        sim.request(&r);
    }
    let before = *sim.counters();
    let points_before = sim.series().len();
    for r in stream {
        sim.request(&r);
    }
    let after = *sim.counters();
    let window = &sim.series()[points_before..];
    let mean_u = window.iter().map(|p| p.utilization).sum::<f64>() / window.len() as f64;
    let moved = (after.gc_bytes_moved - before.gc_bytes_moved) as f64;
    let client = (after.client_write_bytes - before.client_write_bytes) as f64;
    (1.0 + moved / client, mean_u)
}

#[test]
fn greedy_on_uniform_writes_matches_the_cleaning_cost_curve() {
    for (start, stop) in [(0.70, 0.72), (0.80, 0.82)] {
        let (waf, mean_u) = steady_gc_waf(GcPolicy::Greedy, Pattern::Uniform, start, stop);
        let theory = lfs_cleaning_waf(1.0 / mean_u);
        eprintln!("greedy uniform at u={mean_u:.3}: WA {waf:.3}, theory {theory:.3}");
        // The formula is the many-blocks-per-segment limit; with 256 blocks per object
        // greedy finds victims slightly emptier than average, so the simulated cost is
        // a little lower (1-2% here), and the utilization moves inside the hysteresis
        // band. 5% covers these; a wrong model is far outside (no GC: 1.0; victims
        // at the mean utilization, i.e. random choice: 1/(1-0.715) = 3.5).
        assert!(
            (waf - theory).abs() / theory < 0.05,
            "WA {waf} vs theory {theory} at utilization {mean_u}"
        );
    }
}

/// 90% of the writes to 10% of the blocks.
const HOT_90_10: Pattern = Pattern::HotCold {
    hot_fraction: 0.1,
    hot_share: 0.9,
};

/// The steady-state write amplification of two policies on `pattern` with GC
/// between `start` and `stop` (both printed, for the record).
fn two_policies_waf(
    (a, b): (GcPolicy, GcPolicy),
    pattern: Pattern,
    (start, stop): (f64, f64),
) -> (f64, f64) {
    let (waf_a, _) = steady_gc_waf(a, pattern, start, stop);
    let (waf_b, _) = steady_gc_waf(b, pattern, start, stop);
    eprintln!("{pattern} at {start}/{stop}: {a:?} WA {waf_a:.3}, {b:?} WA {waf_b:.3}");
    (waf_a, waf_b)
}

#[test]
fn cost_benefit_beats_greedy_on_hot_cold() {
    let policies = (GcPolicy::Greedy, GcPolicy::CostBenefit);
    let (greedy, cb) = two_policies_waf(policies, HOT_90_10, (0.70, 0.75));
    assert!(cb < greedy * 0.95, "cost-benefit {cb} vs greedy {greedy}");
}

/// hylog against the policies it must beat or match, in the steady state.
#[test]
fn hylog_separates_skewed_workloads_and_leaves_uniform_alone() {
    let policies = (GcPolicy::CostBenefit, GcPolicy::HyLog);
    let (cb, hy) = two_policies_waf(policies, HOT_90_10, (0.80, 0.85));
    // Not a performance assertion: separating 90/10 must not make GC move more than
    // cost-benefit does (the goal, 15% less, is measured in docs/sim/hylog.md).
    assert!(hy <= cb, "hylog {hy} vs cost-benefit {cb}");
    let policies = (GcPolicy::Greedy, GcPolicy::HyLog);
    let (greedy_u, hy_u) = two_policies_waf(policies, Pattern::Uniform, (0.80, 0.85));
    // Nothing to separate: hylog is greedy but for the passes where sampling noise in
    // the young counters looked like skew (0.7% more moved here).
    assert!(hy_u <= greedy_u * 1.02, "hylog {hy_u} vs greedy {greedy_u}");
}

#[test]
fn hylog_moves_hot_and_cold_into_their_own_gc_objects() {
    let r = run_sim(&words(
        "--synthetic hotcold:0.1:0.9 --volume-size 16M --requests 40000 --precondition --batch-size 256K --gc-policy hylog --gc-start 0.8 --gc-stop 0.85 --gc-pass 1M --series",
    ));
    let v = &r.volumes[0];
    assert_eq!(v.gc_policy, "hylog");
    let c = &v.report.counters;
    assert!(c.gc_passes > 0 && c.gc_separating_passes > 0, "{c:?}");
    assert!(
        c.gc_hot_bytes_moved > 0 && c.gc_cold_bytes_moved > 0,
        "{c:?}"
    );
    assert_eq!(
        c.gc_hot_bytes_moved + c.gc_cold_bytes_moved,
        c.gc_bytes_moved
    );
    // Every pass is counted once by its number of heat classes; those that separated
    // have two or more.
    assert_eq!(c.gc_class_passes.iter().sum::<u64>(), c.gc_passes, "{c:?}");
    assert_eq!(
        c.gc_passes - c.gc_class_passes[0],
        c.gc_separating_passes,
        "{c:?}"
    );
    // The hot tenth is found (the choice is a whole number of heat values).
    let h = v.report.gc_hot_fraction_last;
    assert!(h > 0.05 && h < 0.2, "hot fraction {h}");
    assert!(v.series.iter().any(|p| p.gc_hot_fraction > 0.0));
    let text = super::report::text(&r);
    assert!(text.contains("hylog synthetic: hot fraction"), "{text}");
    // The data is all there: every block was written, and all of it is live.
    assert_eq!(v.report.live_bytes, 16 << 20);
}

/// The shared traces (`shared/traces` beside the repository), their formats, and how
/// to sum their write bytes independently of lsvd-trace where the file is plain text.
const TRACES_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces");

/// A file of the shared traces; one clear failure when the directory is not there.
fn trace(rel: &str) -> String {
    let dir = std::path::Path::new(TRACES_DIR);
    assert!(
        dir.is_dir(),
        "the sample traces are not at {}: these tests need the shared/ directory beside the repository",
        dir.display()
    );
    format!("{TRACES_DIR}/{rel}")
}

fn sum_text_writes(path: &str, f: impl Fn(&str) -> Option<(bool, u64, u64)>) -> u64 {
    let text = std::fs::read_to_string(path).expect("read trace");
    let mut sum = 0;
    for line in text.lines() {
        if let Some((is_write, offset, len)) = f(line)
            && is_write
            && len > 0
        {
            // Rounded outward to sectors, as the simulator does.
            let start = offset / 512;
            let end = (offset + len).div_ceil(512);
            sum += (end - start) * 512;
        }
    }
    sum
}

fn fields(line: &str, sep: char) -> Vec<&str> {
    if sep == ' ' {
        line.split_whitespace().collect()
    } else {
        line.split(sep).map(str::trim).collect()
    }
}

/// A command line's words (the tests write argument lists as one string).
pub(crate) fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

fn run_sim(args: &[&str]) -> super::report::RunReport {
    let mut argv = vec!["lsvd", "sim"];
    argv.extend_from_slice(args);
    let sim_args = crate::parse_cli(argv).expect("arguments parse");
    super::simulate(&sim_args).expect("simulation runs")
}

fn check_sane(report: &super::report::RunReport, expected_write_bytes: u64) {
    let volumes = &report.volumes;
    assert!(!volumes.is_empty());
    let client: u64 = volumes
        .iter()
        .map(|v| v.report.counters.client_write_bytes)
        .sum();
    assert_eq!(client, expected_write_bytes);
    for v in volumes {
        let r = &v.report;
        let c = &r.counters;
        assert_eq!(c.out_of_range_requests, 0);
        assert!(r.merge_ratio >= 0.0 && r.merge_ratio <= 1.0);
        assert!(r.final_utilization > 0.0 && r.final_utilization <= 1.0);
        assert!(c.peak_store_bytes >= r.final_store_bytes);
        if c.client_write_bytes > 0 {
            // Store bytes cover what survived coalescing, plus headers.
            assert!(
                r.store_write_bytes >= c.client_write_bytes - c.coalesced_bytes,
                "{}: {r:?}",
                v.volume
            );
            assert!(r.live_bytes <= c.client_write_bytes);
        }
        assert_eq!(r.volume_size_bytes % (1 << 30), 0);
        assert!(r.volume_size_bytes >= c.max_end_bytes);
    }
    assert_eq!(report.inputs[0].bad_lines, 0);
}

#[test]
fn shared_text_traces_run_with_exact_write_bytes() {
    let msr = trace("msr_hm0_head1k/msr-cambridge1-sample.csv");
    let want = sum_text_writes(&msr, |l| {
        let f = fields(l, ',');
        Some((f[3] == "Write", f[4].parse().ok()?, f[5].parse().ok()?))
    });
    check_sane(&run_sim(&[&msr]), want);

    for cut in [
        "msr.cut.per_10k.rw_20_80.105.trace",
        "msr.cut.per_10k.rw_40_60.1370.trace",
        "msr.cut.per_10k.most_thpt_rand_iops.1006.trace",
    ] {
        let path = trace(&format!("msr_heimdall_cuts10k/{cut}"));
        let want = sum_text_writes(&path, |l| {
            let f = fields(l, ' ');
            Some((f[4] == "0", f[2].parse().ok()?, f[3].parse().ok()?))
        });
        check_sane(&run_sim(&[&path, "--format", "msr-cut"]), want);
    }

    // Sector-unit ASCII (SPC/DiskSim style): time dev lba sectors op(0 = write).
    let sectors = |l: &str| {
        let f = fields(l, ' ');
        let lba: u64 = f[2].parse().ok()?;
        let n: u64 = f[3].parse().ok()?;
        Some((f[4] == "0", lba * 512, n * 512))
    };
    let spc = trace("umass_financial1_head10k/example.ascii");
    let r = run_sim(&[&spc]);
    assert_eq!(r.inputs[0].volumes, 22, "one volume per ASU");
    check_sane(&r, sum_text_writes(&spc, sectors));
    let tpcc = trace("ms_tpcc_mqsim/tpcc-small.trace");
    let r = run_sim(&[&tpcc, "--format", "disksim"]);
    assert_eq!(r.inputs[0].volumes, 16);
    check_sane(&r, sum_text_writes(&tpcc, sectors));

    // CloudPhysics CSV: version,time,op(hex SCSI opcode),size(bytes),lbn(sectors).
    let cp = trace("cloudphysics_libcachesim/cloudPhysicsIO.csv");
    let want = sum_text_writes(&cp, |l| {
        let f = fields(l, ',');
        let lbn: u64 = f[4].parse().ok()?;
        Some((f[2] == "2a", lbn * 512, f[3].parse().ok()?))
    });
    let r = run_sim(&[&cp]);
    check_sane(&r, want);
    let v = &r.volumes[0].report;
    // The CloudPhysics VM rewrites its data about 3 times: GC runs.
    assert!(v.counters.gc_passes > 0 && v.write_amplification > 1.0);
    // The binary vscsi file is the same trace.
    let vscsi = trace("cloudphysics_libcachesim/cloudPhysicsIO.vscsi");
    check_sane(&run_sim(&[&vscsi]), want);
}

#[test]
fn shared_compressed_traces_run() {
    // gzip and bzip2: the reference sum comes from the trace reader itself, which the
    // simulator's accounting (rounding, volumes, skipping) must agree with.
    for (path, volumes) in [
        ("tencent_cbs_sample50k/cloud_storage-sample.bz2", 2038),
        ("systor17_sample/systor17-traces-sample.csv.gz", 1),
        ("systor17_sample/systor17-additional-sample.csv.gz", 1),
    ] {
        let path = trace(path);
        let format = lsvd_trace::detect_format(&path).expect("format detected");
        let want: u64 = lsvd_trace::TraceReader::open(&path, format)
            .expect("open")
            .filter(|r| r.op == Op::Write)
            .map(|r| {
                let start = r.offset_bytes / 512;
                (r.offset_bytes + r.length_bytes).div_ceil(512) * 512 - start * 512
            })
            .sum();
        let r = run_sim(&[&path]);
        assert_eq!(r.inputs[0].volumes, volumes);
        check_sane(&r, want);
    }
}

#[test]
fn volume_selection_and_fixed_size() {
    let spc = trace("umass_financial1_head10k/example.ascii");
    let r = run_sim(&[&spc, "--volume", "asu4"]);
    assert_eq!(r.volumes.len(), 1);
    assert_eq!(r.volumes[0].volume, "asu4");
    let by_id = run_sim(&[&spc, "--volume", "0"]);
    assert_eq!(by_id.volumes.len(), 1);
    assert_eq!(by_id.volumes[0].volume, "asu0");
    let mut argv = vec!["lsvd", "sim", spc.as_str(), "--volume", "nope"];
    let a = crate::parse_cli(argv.drain(..)).expect("parse");
    assert!(super::simulate(&a).is_err());
    // A 64 MiB volume: requests beyond it are counted and skipped.
    let r = run_sim(&[&spc, "--volume", "asu0", "--volume-size", "64M"]);
    let c = &r.volumes[0].report.counters;
    assert!(c.out_of_range_requests > 0);
    assert_eq!(r.volumes[0].report.volume_size_bytes, 64 << 20);
}

#[test]
fn several_configs_json_and_plot() {
    let r = run_sim(&words(
        "--synthetic hotcold:0.2:0.8 --volume-size 16M --requests 20000 --precondition --batch-size 256K,1M --gc-policy greedy,cost-benefit --gc-pass 1M --series",
    ));
    assert_eq!(r.configs, 4);
    assert_eq!(r.volumes.len(), 4);
    assert_eq!(r.requests_replayed, 4096 + 20000);
    for v in &r.volumes {
        assert_eq!(v.report.counters.client_write_bytes, (4096 + 20000) * BLOCK);
        assert!(!v.series.is_empty());
        assert!(
            v.series
                .windows(2)
                .all(|w| w[0].client_write_bytes <= w[1].client_write_bytes)
        );
    }
    assert_eq!(r.volumes[0].config, "batch 256K greedy");
    let json = serde_json::to_value(&r).expect("json");
    assert_eq!(json["volumes"][3]["config"], "batch 1M cost-benefit");
    assert!(json["volumes"][0]["write_amplification"].as_f64().is_some());
    let svg = super::plot::chart(&r, 8);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<path").count(), 3 * 4);
    let text = super::report::text(&r);
    assert!(text.contains("batch 1M cost-benefit"));
}

/// `--gc-defrag 0,8K`: the same run with and without plugged gaps, labelled; the
/// plugging run moves more and ends with fewer map extents (hot/cold overwrites after
/// a fill leave small gaps between what GC moves). A size that does not parse is bad
/// input.
#[test]
fn gc_defrag_compares_plugged_gaps_with_none() {
    let r = run_sim(&words(
        "--synthetic hotcold:0.1:0.9 --volume-size 16M --requests 40000 --precondition --batch-size 256K --gc-pass 1M --gc-defrag 0,8K",
    ));
    assert_eq!(r.configs, 2);
    assert_eq!(r.volumes[0].config, "no defrag");
    assert_eq!(r.volumes[1].config, "defrag 8K");
    let (none, plugged) = (&r.volumes[0].report, &r.volumes[1].report);
    assert!(none.counters.gc_passes > 0, "{none:?}");
    assert!(
        plugged.counters.gc_bytes_moved > none.counters.gc_bytes_moved,
        "{none:?}\n{plugged:?}"
    );
    assert!(
        plugged.map_extents < none.map_extents,
        "{none:?}\n{plugged:?}"
    );
    let a = crate::parse_cli(["lsvd", "sim", "--synthetic", "uniform", "--gc-defrag", "8Q"])
        .expect("parse");
    let err = super::simulate(&a).expect_err("a bad size");
    assert!(err.to_string().contains("8Q"), "{err}");
}

#[test]
fn bad_lines_are_counted_and_strict_fails() {
    let dir = lsvd_store::testutil::TempDir::new("sim-bad");
    let path = crate::trace_file(
        &dir,
        "bad-msr.csv",
        "128166385295514663,hm,0,Write,0,4096,2833\nthis is not a trace line\n128166385295514878,hm,0,Write,4096,4096,2617\n",
    );
    let p = path.to_string_lossy().into_owned();
    let r = run_sim(&[&p, "--format", "msr"]);
    assert_eq!(r.inputs[0].bad_lines, 1);
    assert_eq!(r.volumes[0].report.counters.client_write_bytes, 8192);
    let a = crate::parse_cli(["lsvd", "sim", &p, "--format", "msr", "--strict"]).expect("parse");
    let err = super::simulate(&a).expect_err("strict mode fails on the bad line");
    assert!(err.to_string().contains("line 2"), "{err}");
}

#[test]
fn reads_and_trims_from_requests() {
    let mut sim = VolumeSim::new(config(1 << 20));
    sim.request(&req(0, Op::Write, 0, 8 * BLOCK));
    sim.request(&req(0, Op::Read, 0, 8 * BLOCK));
    sim.request(&req(0, Op::Trim, 0, 4 * BLOCK));
    sim.finish();
    let c = sim.counters();
    assert_eq!(
        (c.write_requests, c.read_requests, c.trim_requests),
        (1, 1, 1)
    );
    assert_eq!(c.read_bytes, 8 * BLOCK);
    assert_eq!(sim.live_bytes(), 4 * BLOCK);
}
