//! Golden tests against the real trace samples in `shared/traces` (beside
//! the repository). Expected values were computed from the files with awk
//! and Python, following each PROVENANCE.md.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;

use lsvd_trace::{Format, Op, ParseStats, Request, TraceReader, detect_format};

const TRACES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces");

fn trace(rel: &str) -> PathBuf {
    let dir = PathBuf::from(TRACES);
    assert!(
        dir.is_dir(),
        "shared traces not found at {} (the repo expects shared/ beside it)",
        dir.display()
    );
    dir.join(rel)
}

fn req(time_ns: u64, volume: u32, op: Op, offset_bytes: u64, length_bytes: u64) -> Request {
    Request {
        time_ns,
        volume,
        op,
        offset_bytes,
        length_bytes,
    }
}

/// Reads the whole trace strictly; returns the first `n` requests, all
/// requests' read/write counts, the volume names and the stats.
struct Summary {
    head: Vec<Request>,
    last: Request,
    reads: u64,
    writes: u64,
    volumes: Vec<String>,
    stats: ParseStats,
}

fn read_all(rel: &str, format: Format, n: usize) -> Summary {
    let mut reader = TraceReader::open_strict(trace(rel), format).expect("open trace");
    let mut head = Vec::new();
    let (mut reads, mut writes) = (0, 0);
    let mut last = None;
    while let Some(r) = reader.next_request().expect("no bad lines in samples") {
        if head.len() < n {
            head.push(r);
        }
        match r.op {
            Op::Read => reads += 1,
            Op::Write => writes += 1,
            Op::Trim => panic!("no trims in samples"),
        }
        assert!(r.length_bytes > 0);
        assert!((r.volume as usize) < reader.volumes().len());
        last = Some(r);
    }
    Summary {
        head,
        last: last.expect("non-empty trace"),
        reads,
        writes,
        volumes: reader.volumes().to_vec(),
        stats: reader.finish().expect("no error"),
    }
}

#[test]
fn msr_cambridge_hm0() {
    let s = read_all("msr_hm0_head1k/msr-cambridge1-sample.csv", Format::Msr, 4);
    assert_eq!(
        s.head,
        [
            req(0, 0, Op::Write, 9_056_014_336, 2048),
            req(21_500, 0, Op::Write, 11_855_351_808, 512),
            req(51_200, 0, Op::Write, 5_548_077_056, 4096),
            req(593_685_700, 0, Op::Write, 3_163_095_040, 40960),
        ]
    );
    assert_eq!((s.reads, s.writes), (508, 492));
    assert_eq!(s.volumes, ["hm_0"]);
    assert_eq!(s.stats.lines, 1000);
    assert_eq!(s.stats.requests, 1000);
    assert_eq!(s.stats.bad_lines, 0);
}

#[test]
fn msr_heimdall_cuts() {
    let s = read_all(
        "msr_heimdall_cuts10k/msr.cut.per_10k.rw_20_80.105.trace",
        Format::MsrCut,
        3,
    );
    assert_eq!(
        s.head,
        [
            req(0, 0, Op::Write, 200_626_176, 4096),
            req(223_412_000, 0, Op::Write, 3_159_347_200, 36864),
            req(223_434_000, 0, Op::Write, 3_154_132_992, 4096),
        ]
    );
    assert_eq!(
        s.last,
        req(242_904_693_000, 0, Op::Write, 1_023_476_224, 7680)
    );
    assert_eq!((s.reads, s.writes), (2020, 7980));
    assert_eq!(s.volumes, ["dev0"]);

    let s = read_all(
        "msr_heimdall_cuts10k/msr.cut.per_10k.rw_40_60.1370.trace",
        Format::MsrCut,
        3,
    );
    assert_eq!(s.head[2], req(22_810_000, 0, Op::Read, 2_205_343_744, 4096));
    assert_eq!((s.reads, s.writes), (4054, 5946));

    let s = read_all(
        "msr_heimdall_cuts10k/msr.cut.per_10k.most_thpt_rand_iops.1006.trace",
        Format::MsrCut,
        1,
    );
    assert_eq!(s.head[0], req(0, 0, Op::Read, 11_562_803_200, 4096));
    assert_eq!(s.last.time_ns, 1_017_077_000);
    assert_eq!((s.reads, s.writes), (8316, 1684));
}

#[test]
fn umass_financial1_ssdsim_ascii() {
    let s = read_all("umass_financial1_head10k/example.ascii", Format::Spc, 5);
    // Matches Financial1.spc: ASU 0 LBA 303567 3584 B write at t=0, ...
    assert_eq!(
        s.head,
        [
            req(0, 0, Op::Write, 303_567 * 512, 3584),
            req(0, 1, Op::Write, 55_590 * 512, 3072),
            req(26_214_000, 0, Op::Write, 303_574 * 512, 3584),
            req(26_214_000, 1, Op::Write, 240_840 * 512, 3072),
            req(78_643_005, 1, Op::Read, 55_596 * 512, 3072),
        ]
    );
    assert_eq!((s.reads, s.writes), (4078, 5922));
    let want: Vec<String> = (0..22).map(|i| format!("asu{i}")).collect();
    assert_eq!(s.volumes, want);
}

/// The CloudPhysics sample as CSV and as vscsi: the same requests, the CSV's times cut
/// to whole seconds (the sample spans 7,200 s) and its header one more line.
#[test]
fn cloudphysics_csv_and_vscsi() {
    // (lba, bytes) of the first four requests and of the last, all writes to volume 0.
    let head = [
        (42_932_745, 512),
        (42_932_746, 512),
        (42_932_747, 512),
        (40_409_911, 6656),
    ];
    let last = (42_936_150, 512);
    let write = |ns, (lba, bytes): (u64, u64)| req(ns, 0, Op::Write, lba * 512, bytes);
    let cases = [
        (
            "cloudPhysicsIO.csv",
            Format::CloudPhysicsCsv,
            [0, 0, 0, 0],
            7_200_000_000_000,
            113_873,
        ),
        (
            "cloudPhysicsIO.vscsi",
            Format::Vscsi,
            [0, 242_639_000, 376_738_000, 598_906_000],
            7_200_089_885_000,
            113_872,
        ),
    ];
    for (file, format, head_ns, last_ns, lines) in cases {
        let s = read_all(&format!("cloudphysics_libcachesim/{file}"), format, 4);
        let want: Vec<Request> = head_ns
            .into_iter()
            .zip(head)
            .map(|(ns, e)| write(ns, e))
            .collect();
        assert_eq!(s.head, want, "{file}");
        assert_eq!(s.last, write(last_ns, last), "{file}");
        assert_eq!((s.reads, s.writes), (46_974, 66_898), "{file}");
        assert_eq!(
            (s.stats.lines, s.stats.requests),
            (lines, 113_872),
            "{file}"
        );
        if format == Format::CloudPhysicsCsv {
            assert_eq!(s.volumes, ["vol0"]);
        }
    }
}

#[test]
fn tencent_cbs_bz2() {
    let s = read_all(
        "tencent_cbs_sample50k/cloud_storage-sample.bz2",
        Format::Tencent,
        4,
    );
    assert_eq!(
        s.head,
        [
            req(0, 0, Op::Write, 4_247_200 * 512, 128 * 512),
            // Earlier than the first record: clamped to 0.
            req(0, 1, Op::Read, 13_896_880 * 512, 128 * 512),
            req(0, 1, Op::Read, 49_413_280 * 512, 16 * 512),
            req(0, 1, Op::Read, 50_927_776 * 512, 8 * 512),
        ]
    );
    assert_eq!(&s.volumes[..2], ["vol1058", "vol1063"]);
    assert_eq!(s.volumes.len(), 2038);
    assert_eq!((s.reads, s.writes), (24_521, 25_479));
    assert_eq!(s.stats.requests, 50_000);
    assert_eq!(s.stats.unordered, 144);
}

#[test]
fn systor17_gz() {
    let s = read_all(
        "systor17_sample/systor17-additional-sample.csv.gz",
        Format::Systor,
        3,
    );
    assert_eq!(
        s.head,
        [
            req(0, 0, Op::Read, 203_468_398_592, 32768),
            req(7_998_000, 0, Op::Read, 4_590_576_115_200, 4096),
            req(4_254_000, 0, Op::Read, 4_564_742_206_976, 65536),
        ]
    );
    assert_eq!((s.reads, s.writes), (700, 299));
    assert_eq!(s.volumes, ["lun0"]);
    assert_eq!(s.stats.lines, 1000); // header included
    assert_eq!(s.stats.unordered, 299);

    let s = read_all(
        "systor17_sample/systor17-traces-sample.csv.gz",
        Format::Systor,
        1,
    );
    assert_eq!(s.head[0], req(0, 0, Op::Read, 899_056_122_368, 131_072));
    assert_eq!((s.reads, s.writes), (826, 173));
}

#[test]
fn ms_tpcc_mqsim_disksim() {
    let s = read_all("ms_tpcc_mqsim/tpcc-small.trace", Format::Disksim, 3);
    assert_eq!(
        s.head,
        [
            req(0, 0, Op::Write, 264_719_034 * 512, 16 * 512),
            req(315_000, 1, Op::Write, 197_570_570 * 512, 16 * 512),
            req(431_000, 2, Op::Write, 93_230_992 * 512, 32 * 512),
        ]
    );
    assert_eq!(
        s.last,
        req(
            1_075_002_000 - 938_513_000,
            9,
            Op::Write,
            160_057_354 * 512,
            16 * 512
        )
    );
    assert_eq!((s.reads, s.writes), (4381, 2618));
    assert_eq!(s.volumes.len(), 16);
    assert_eq!(&s.volumes[..3], ["dev4", "dev3", "dev13"]);
}

#[test]
fn auto_detects_every_shared_file() {
    let cases = [
        ("msr_hm0_head1k/msr-cambridge1-sample.csv", Format::Msr),
        (
            "msr_heimdall_cuts10k/msr.cut.per_10k.rw_20_80.105.trace",
            Format::MsrCut,
        ),
        (
            "msr_heimdall_cuts10k/msr.cut.per_10k.rw_40_60.1370.trace",
            Format::MsrCut,
        ),
        (
            "msr_heimdall_cuts10k/msr.cut.per_10k.most_thpt_rand_iops.1006.trace",
            Format::MsrCut,
        ),
        ("umass_financial1_head10k/example.ascii", Format::Spc),
        (
            "cloudphysics_libcachesim/cloudPhysicsIO.csv",
            Format::CloudPhysicsCsv,
        ),
        (
            "cloudphysics_libcachesim/cloudPhysicsIO.vscsi",
            Format::Vscsi,
        ),
        (
            "tencent_cbs_sample50k/cloud_storage-sample.bz2",
            Format::Tencent,
        ),
        (
            "systor17_sample/systor17-traces-sample.csv.gz",
            Format::Systor,
        ),
        (
            "systor17_sample/systor17-additional-sample.csv.gz",
            Format::Systor,
        ),
        ("ms_tpcc_mqsim/tpcc-small.trace", Format::Disksim),
    ];
    for (rel, want) in cases {
        assert_eq!(detect_format(trace(rel)).ok(), Some(want), "{rel}");
    }
    // A non-trace text file is not detected.
    assert!(detect_format(trace("README.md")).is_err());
}
