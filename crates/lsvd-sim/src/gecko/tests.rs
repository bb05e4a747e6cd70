//! Tests of the chained-log simulator: hand-computed service times, placement, map
//! consistency after GC, the Gecko experiment's shape, and bad input.

use super::config::Config;
use super::device::{Device, DeviceModel, Hdd, Op, Ssd};
use super::layout::{BLOCK_BYTES, ChainGc, Geometry, LayoutKind, Log, NONE, VictimPolicy};
use super::run::{simulate, simulate_with_log};
use lsvd_core::error::ErrorKind;

#[test]
fn hdd_random_and_sequential_service_times() {
    let model: DeviceModel = "hdd".parse().expect("default hdd");
    assert_eq!(model, DeviceModel::Hdd(Hdd::default()));
    let mut d = Device::new(model, 1 << 30);
    // Random: 8.5 ms seek + 60/7200/2 s = 4.1667 ms + 4096 B / 150 MB/s = 27.307 us.
    let random_ns = 8_500_000 + 4_166_667 + 27_307;
    let t1 = d.submit(0, Op::Write, 100 << 20, 4096);
    assert!(t1.abs_diff(random_ns) <= 1, "{t1}");
    // Starts where the last ended: transfer only, queued behind the first.
    let t2 = d.submit(0, Op::Write, (100 << 20) + 4096, 4096);
    assert!((t2 - t1).abs_diff(27_307) <= 1, "{}", t2 - t1);
    // Back to the start of the disk: positioned again.
    let t3 = d.submit(0, Op::Write, 0, 4096);
    assert!((t3 - t2).abs_diff(random_ns) <= 1);
    // Submitted after the queue drained, where the last one ended: starts at
    // submission and costs the transfer only.
    let t4 = d.submit(t3 + 1_000_000, Op::Read, 4096, 1 << 20);
    let one_mib_ns = (1u64 << 20) as f64 * 1e3 / 150.0;
    assert!((t4 - t3 - 1_000_000).abs_diff(one_mib_ns.round() as u64) <= 1);
}

#[test]
fn hdd_parameters_and_distance_seek() {
    let model: DeviceModel = "hdd:seek_ms=4,rpm=10000,mb_per_s=120"
        .parse()
        .expect("parses");
    let mut d = Device::new(model, 1 << 30);
    // 4 ms + 3 ms + 4096 / 120e6 s = 34.133 us.
    let t = d.submit(0, Op::Write, 0, 4096);
    assert!(t.abs_diff(7_034_133) <= 1, "{t}");
    let model: DeviceModel = "hdd:short_seek_ms=1,full_seek_ms=16"
        .parse()
        .expect("parses");
    let DeviceModel::Hdd(h) = &model else {
        panic!("an hdd");
    };
    // A quarter of the stroke: 1 + 15 * sqrt(1/4) = 8.5 ms.
    assert!((h.seek_ns(256 << 20, 1 << 30) - 8_500_000.0).abs() < 1.0);
    assert!((h.seek_ns(1 << 30, 1 << 30) - 16_000_000.0).abs() < 1.0);
    let mut d = Device::new(model, 1 << 30);
    let first = d.submit(0, Op::Read, 0, 4096);
    let second = d.submit(first, Op::Read, (256 << 20) + 4096, 4096);
    let expect = 8_500_000.0 + 4_166_666.7 + 27_306.7;
    assert!(((second - first) as f64 - expect).abs() < 2.0);
}

#[test]
fn ssd_channels_serve_pages_in_parallel() {
    let model: DeviceModel = "ssd".parse().expect("default ssd");
    assert_eq!(model, DeviceModel::Ssd(Ssd::default()));
    let mut d = Device::new(model, 1 << 30);
    let page = 16 << 10;
    // Eight writes to eight consecutive pages: one per channel, all done in 250 us.
    for i in 0..8 {
        assert_eq!(d.submit(0, Op::Write, i * page, 4096), 250_000);
    }
    // A ninth waits for channel 0.
    assert_eq!(d.submit(0, Op::Write, 8 * page, 4096), 500_000);
    let mut d = Device::new("ssd:channels=4,read_us=10".parse().expect("ssd"), 1 << 30);
    // 8 pages over 4 channels: two rounds of 10 us.
    assert_eq!(d.submit(0, Op::Read, 0, 8 * page), 20_000);
    // A 4 KiB read inside one page costs one page.
    assert_eq!(d.submit(100_000, Op::Read, 4096, 4096), 110_000);
}

fn geo(kind: LayoutKind) -> Geometry {
    Geometry {
        kind,
        drives: 2,
        drive_bytes: 64 << 20,
        segment_bytes: 1 << 20,
        chunk_bytes: 64 << 10,
        reserve_segments: 2,
    }
}

#[test]
fn placement_over_drives() {
    let s = geo(LayoutKind::Stripe);
    assert_eq!(
        s.place(0, 1 << 20),
        vec![(0, 0, 512 << 10), (1, 0, 512 << 10)]
    );
    assert_eq!(s.place(3 * (64 << 10), 4096), vec![(1, 64 << 10, 4096)]);
    assert_eq!(s.segments(), 128);
    let c = geo(LayoutKind::Chain);
    assert_eq!(c.place(65 << 20, 4096), vec![(1, 1 << 20, 4096)]);
    assert_eq!(c.pool_of(63), 0);
    assert_eq!(c.pool_of(64), 1);
}

/// Every mapped block is where the inverse map says, and live counts agree.
fn check_maps(log: &Log) {
    let bps = log.geo.blocks_per_segment();
    let mut live = vec![0u64; log.segs.len()];
    for (lba, &b) in log.map.iter().enumerate() {
        assert_ne!(b, NONE, "lba {lba} lost");
        assert_eq!(log.inverse[b as usize], lba as u64);
        live[(b / bps) as usize] += 1;
    }
    let mapped = log.inverse.iter().filter(|&&l| l != NONE).count();
    assert_eq!(mapped, log.map.len());
    for (i, seg) in log.segs.iter().enumerate() {
        assert_eq!(seg.live_blocks, live[i], "segment {i}");
    }
}

/// The 2-drive HDD experiment at test scale: 64 MiB drives, GC from about 40% into
/// the tail drive, ending before the tail drive fills.
fn experiment(kind: LayoutKind, chain_gc: ChainGc, gc: bool) -> Config {
    Config {
        geo: geo(kind),
        device: DeviceModel::Hdd(Hdd::default()),
        chain_gc,
        policy: VictimPolicy::Greedy,
        clients: 4,
        queue_depth: 8,
        io_bytes: BLOCK_BYTES,
        write_fraction: 1.0,
        // Drive 0 full up to its GC reserve (62 of 64 segments): the tail starts on
        // drive 1, as in Gecko's experiment.
        fill: 62.0 / 128.0,
        trace: None,
        gc_start_free: if gc { 0.35 } else { 0.0 },
        gc_stop_free: 0.40,
        duration_ns: 400_000_000,
        interval_ns: 10_000_000,
        seed: 7,
        copies: 1,
        tail_cache_blocks: 0,
    }
}

#[test]
fn gc_keeps_the_maps_consistent() {
    for (kind, gc) in [
        (LayoutKind::Chain, ChainGc::CompactInBody),
        (LayoutKind::Chain, ChainGc::MoveToTail),
        (LayoutKind::Stripe, ChainGc::MoveToTail),
    ] {
        for policy in [
            VictimPolicy::Greedy,
            VictimPolicy::CostBenefit,
            VictimPolicy::LogOrder,
        ] {
            let mut cfg = experiment(kind, gc, true);
            cfg.policy = policy;
            // Long enough for the tail to fill and clients to wait for GC.
            cfg.duration_ns = 2_000_000_000;
            let (r, log) = simulate_with_log(&cfg).expect("runs");
            assert!(r.summary.gc_victims > 10, "{} {policy:?}: GC ran", r.name);
            assert!(r.summary.gc_moved_bytes > 0);
            assert_eq!(r.summary.gc_no_space, 0);
            check_maps(&log);
        }
    }
}

#[test]
fn reads_go_where_the_map_points() {
    // Before any client write everything is on drive 0 (the body): reads queue there
    // while drive 1 only takes writes.
    let mut cfg = experiment(LayoutKind::Chain, ChainGc::CompactInBody, false);
    cfg.write_fraction = 0.5;
    cfg.duration_ns = 200_000_000;
    let r = simulate(&cfg).expect("runs");
    let m = &r.summary;
    assert!(m.app_read_mb_per_s > 0.0 && m.app_write_mb_per_s > 0.0);
    // Each read is a random positioned 4 KiB read on drive 0: at most one per
    // 12.69 ms, so about 79 reads per second.
    let reads_per_s = m.app_read_mb_per_s * 1e6 / 4096.0;
    assert!((60.0..=80.0).contains(&reads_per_s), "{reads_per_s}");
    assert!(m.drive_busy_fraction[0] > 0.9);
}

#[test]
fn chain_isolates_gc_and_stripe_collapses() {
    for policy in [VictimPolicy::Greedy, VictimPolicy::LogOrder] {
        let run = |kind, gc| {
            let mut cfg = experiment(kind, gc, true);
            cfg.policy = policy;
            let r = simulate(&cfg).expect("runs");
            let before = r.summary.app_write_mb_per_s_before_gc;
            let with = r.summary.app_write_mb_per_s_with_gc.expect("GC started");
            (r, before, with)
        };
        let (cib, cib_before, cib_with) = run(LayoutKind::Chain, ChainGc::CompactInBody);
        let (mtt, mtt_before, mtt_with) = run(LayoutKind::Chain, ChainGc::MoveToTail);
        let (stripe, stripe_before, stripe_with) = run(LayoutKind::Stripe, ChainGc::MoveToTail);
        let what = format!(
            "{policy:?}: cib {cib_before}->{cib_with} mtt {mtt_before}->{mtt_with} stripe {stripe_before}->{stripe_with}"
        );
        // Without GC the chain writes sequentially at one drive's rate (150 MB/s),
        // the stripe at two.
        assert!((cib_before - 150.0).abs() < 3.0, "{what}");
        assert!((mtt_before - 150.0).abs() < 3.0, "{what}");
        assert!((stripe_before - 300.0).abs() < 6.0, "{what}");
        // The chain's tail never waits for GC in this window.
        assert_eq!(cib.summary.first_stall_s, None);
        assert_eq!(cib.summary.tail_moves_s, vec![(0.0, 1)]);
        assert!(
            cib.summary.gc_write_mb_per_s_with_gc.expect("gc") > 5.0,
            "{what}"
        );
        // Compact-in-body: within 10% of the no-GC rate.
        assert!(cib_with >= 0.9 * cib_before, "{what}");
        // RAID-0 log: less than half once GC runs.
        assert!(stripe_with < 0.5 * stripe_before, "{what}");
        // Move-to-tail: GC writes share the tail, so in between (greedy loses about
        // 15%, log order, whose body reads are sequential, about 58%; Gecko measured
        // 42%).
        assert!(
            mtt_with < 0.9 * mtt_before && mtt_with > 4.0 * stripe_with,
            "{what}"
        );
        assert!(
            mtt.summary.gc_write_mb_per_s_with_gc.expect("gc") > 5.0,
            "{what}"
        );
        // The tail's bandwidth is shared: application + GC writes stay near 150 MB/s.
        let tail = mtt_with + mtt.summary.gc_write_mb_per_s_with_gc.expect("gc");
        assert!((tail - 150.0).abs() < 10.0, "{what}: tail {tail}");
        assert!(stripe.summary.gc_victims > 0);
    }
    // The same run without GC keeps the no-GC rate to the end.
    let no_gc = simulate(&experiment(
        LayoutKind::Chain,
        ChainGc::CompactInBody,
        false,
    ))
    .expect("runs");
    assert_eq!(no_gc.summary.gc_started_s, None);
    assert_eq!(no_gc.summary.gc_victims, 0);
    assert!((no_gc.summary.app_write_mb_per_s_before_gc - 150.0).abs() < 3.0);
}

#[test]
fn same_seed_same_result() {
    let cfg = experiment(LayoutKind::Stripe, ChainGc::MoveToTail, true);
    assert_eq!(simulate(&cfg).expect("a"), simulate(&cfg).expect("b"));
}

/// `lsvd sim` with these arguments after `sim`, parsed as the CLI parses them.
pub(super) fn sim_args(args: &[&str]) -> crate::SimArgs {
    let mut argv = vec!["lsvd", "sim"];
    argv.extend_from_slice(args);
    crate::parse_cli(argv).expect("arguments parse")
}

fn sim_err(args: &[&str]) -> lsvd_core::error::Error {
    super::cli::simulate(&sim_args(args)).expect_err("bad input")
}

#[test]
fn bad_device_and_layout_strings_are_clear_errors() {
    let cases: &[(&str, &str)] = &[
        ("--layout chain:2 --device floppy", "expected hdd"),
        ("--layout chain:2 --device hdd:rpm=fast", "not a number"),
        ("--layout chain:2 --device hdd:rpm=0", "between"),
        ("--layout chain:2 --device hdd:colour=red", "unknown key"),
        ("--layout chain:2 --device hdd:seek_ms", "KEY=VALUE"),
        ("--layout chain:2 --device hdd:short_seek_ms=2", "both"),
        (
            "--layout chain:2 --device hdd:short_seek_ms=9,full_seek_ms=2",
            "must not exceed",
        ),
        ("--layout chain:2 --device ssd:page=0", "page"),
        ("--layout chain:2 --device ssd:channels=-1", "between"),
        ("--layout chain:0", "between 1 and 64"),
        ("--layout chain:x", "between 1 and 64"),
        ("--layout stripe:", "between 1 and 64"),
        ("--layout chain:2,lfs", "cannot be mixed"),
        ("--layout chain:3x3", "x2"),
        ("--layout chain:2 --tail-cache lots", "lots"),
        ("--layout chain:2 --chain-gc sideways", "compact-in-body"),
        (
            "--layout chain:2 --gc-policy hylog",
            "greedy, cost-benefit or log-order",
        ),
        (
            "--layout stripe:3 --segment-size 1M",
            "multiple of stripe-unit",
        ),
        ("--layout chain:2 --fill 0.99", "--fill"),
        ("--layout chain:2 --seconds 0", "--seconds"),
        ("--layout chain:2 --drive-size 8M", "segments per drive"),
        ("--layout chain:2 --synthetic zipf:0.9", "not modelled"),
    ];
    for (args, want) in cases {
        let e = sim_err(&crate::tests::words(args));
        assert_eq!(e.kind, ErrorKind::BadInput, "{args:?}: {e}");
        assert!(
            e.to_string().contains(want),
            "{args:?}: '{e}' lacks '{want}'"
        );
    }
}

#[test]
fn cli_runs_all_three_configurations_and_plots() {
    let dir = lsvd_store::testutil::TempDir::new("gecko-plot");
    let svg = dir.path().join("gecko.svg");
    let mut argv = vec!["lsvd", "sim"];
    let svg_s = svg.display().to_string();
    argv.extend_from_slice(&[
        "--layout",
        "chain:2,stripe:2",
        "--chain-gc",
        "compact-in-body,move-to-tail",
        "--drive-size",
        "32M",
        "--seconds",
        "0.2",
        "--interval-ms",
        "20",
        "--plot",
        &svg_s,
    ]);
    let args = crate::parse_cli(argv).expect("parse");
    let r = super::cli::simulate(&args).expect("runs");
    let names: Vec<&str> = r.runs.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "chain:2 compact-in-body",
            "chain:2 move-to-tail",
            "stripe:2"
        ]
    );
    assert!(r.runs.iter().all(|x| x.series.len() == 10));
    let text = super::report::text(&r);
    assert!(text.contains("stripe:2"));
    super::cli::run(&args).expect("prints and plots");
    let s = std::fs::read_to_string(&svg).expect("svg written");
    assert!(s.starts_with("<svg") && s.contains("chain:2 move-to-tail"));
    assert_eq!(s.matches("<polyline").count(), 6);
}

#[test]
fn trace_mix_replays_every_request_in_its_own_range() {
    let dir = lsvd_store::testutil::TempDir::new("gecko-mix");
    // Two MSR traces: one writes 8 KiB at a time over 64 blocks, the other reads 4 KiB
    // blocks it first writes. Both use offsets from 0: the mix keeps them apart.
    let mut a = String::new();
    let mut b = String::new();
    for i in 0..400u64 {
        let off = (i % 32) * 8192;
        a.push_str(&format!(
            "{},a,0,Write,{off},8192,10\n",
            128166385295514663 + i
        ));
        let op = if i < 64 { "Write" } else { "Read" };
        let off = (i % 64) * 4096;
        b.push_str(&format!(
            "{},b,0,{op},{off},4096,10\n",
            128166385295514663 + i
        ));
    }
    let pa = crate::trace_file(&dir, "a.csv", &a);
    let pb = crate::trace_file(&dir, "b.csv", &b);
    let mix = super::trace::load(&[pa.clone(), pb.clone()], "msr", 64).expect("loads");
    assert_eq!(mix.logical_blocks, 64 + 64);
    assert_eq!(mix.requests.len(), 800);
    // Interleaved: a, b, a, b...; b's blocks are numbered after a's.
    assert!(mix.requests[0].write && mix.requests[0].blocks == vec![0, 1]);
    assert_eq!(mix.requests[1].blocks, vec![64]);
    let reads = mix.requests.iter().filter(|r| !r.write).count();
    assert_eq!(reads, 400 - 64);
    for (kind, drives) in [(LayoutKind::Chain, 3), (LayoutKind::Stripe, 6)] {
        let mut cfg = experiment(kind, ChainGc::CompactInBody, true);
        cfg.geo.drives = drives;
        cfg.geo.drive_bytes = 24 << 20;
        // Stripe segments are whole rows: 6 drives x 64 KiB x 4.
        cfg.geo.segment_bytes = u64::from(drives) * (256 << 10);
        cfg.duration_ns = 60_000_000_000;
        cfg.trace = Some(std::sync::Arc::new(mix.clone()));
        let (r, log) = simulate_with_log(&cfg).expect("runs");
        assert_eq!(r.summary.requests_done, 800, "{}", r.name);
        let read_bytes = (reads as f64 * 4096.0) / 1e6;
        let measured = r.summary.app_read_mb_per_s * r.summary.simulated_s;
        assert!(
            (measured - read_bytes).abs() < 1e-6,
            "{measured} vs {read_bytes}"
        );
        check_maps(&log);
    }
}

#[test]
fn existing_layout_values_stay_with_the_hylog_models() {
    for l in ["overwrite", "lfs,hylog", "overwrite,lfs,hylog"] {
        assert!(!super::cli::is_gecko(l), "{l}");
    }
    for l in ["chain:2", "stripe:6", "overwrite,chain:2", "chainsaw"] {
        assert!(super::cli::is_gecko(l), "{l}");
    }
    assert!(super::cli::parse_layout("lfs").is_none());
    assert!(matches!(
        super::cli::parse_layout(" chain:3 "),
        Some(Ok((LayoutKind::Chain, 3, 1)))
    ));
    assert!(matches!(
        super::cli::parse_layout("stripe:3x2"),
        Some(Ok((LayoutKind::Stripe, 3, 2)))
    ));
}

#[test]
fn on_ssds_gc_costs_bandwidth_not_positioning() {
    // No seeks: the stripe's GC takes its share of bandwidth but the clients keep
    // more than half of their no-GC rate.
    let mut cfg = experiment(LayoutKind::Stripe, ChainGc::MoveToTail, true);
    cfg.device = DeviceModel::Ssd(Ssd::default());
    cfg.duration_ns = 200_000_000;
    let r = simulate(&cfg).expect("runs");
    let before = r.summary.app_write_mb_per_s_before_gc;
    let with = r.summary.app_write_mb_per_s_with_gc.expect("GC ran");
    assert!(with > 0.5 * before && with < before, "{before} -> {with}");
    // A chain's tail: 32 sequential 4 KiB writes in flight cover 8 pages of 16 KiB,
    // one per channel, each page programmed once per 4 KiB write (250 us): 8 x 4 KiB
    // / 250 us = 131 MB/s.
    let mut cfg = experiment(LayoutKind::Chain, ChainGc::CompactInBody, true);
    cfg.device = DeviceModel::Ssd(Ssd::default());
    cfg.duration_ns = 200_000_000;
    let r = simulate(&cfg).expect("runs");
    let before = r.summary.app_write_mb_per_s_before_gc;
    assert!((before - 131.07).abs() < 1.0, "{before}");
}
