//! The layout model against hand computations and against HyLog's crossover table.

use super::*;

const PAGE: u64 = 8 << 10;
const SEGMENT: u64 = 1 << 20;

fn model(disk: Disk) -> Model {
    Model {
        disk,
        page_bytes: PAGE,
        segment_bytes: SEGMENT,
    }
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

#[test]
fn costs_match_a_hand_computation() {
    let m = model(Disk::y1991());
    // 15 ms + 8192 B / 2.3 MB/s = 15 + 3.5617 ms.
    assert!(close(m.overwrite_page_ms(), 18.5617, 1e-3));
    // 15 ms + 1 MiB / 2.3 MB/s = 15 + 455.90 ms.
    assert!(close(m.segment_io_ms(), 470.90, 1e-2));
    assert!(close(m.pages_per_segment(), 128.0, 0.0));
    // At u = 0.8 a segment of new data costs 10 segment I/Os (the slides' example).
    assert!(close(m.lfs_page_ms(0.8), 10.0 * 470.90 / 128.0, 1e-3));
    assert!(m.lfs_page_ms(1.0).is_infinite());
}

#[test]
fn the_analytical_relation_matches_the_table_pairs_and_inverts() {
    // HyLog's (cleaning, disk) pairs lie on U = (u-1)/ln u.
    for (u, disk_u) in [(0.52, 0.74), (0.88, 0.94), (0.94, 0.97)] {
        assert!(close(disk_utilization(u), disk_u, 0.006), "{u} -> {disk_u}");
    }
    for disk_u in [0.1, 0.5, 0.74, 0.9, 0.98, 0.999] {
        let u = cleaning_utilization(disk_u);
        assert!(u < disk_u, "cleaning below disk utilization");
        assert!(close(disk_utilization(u), disk_u, 1e-9));
    }
    assert_eq!(cleaning_utilization(0.0), 0.0);
    assert_eq!(cleaning_utilization(1.0), 1.0);
    assert_eq!(cleaning_utilization(f64::NAN), 0.0);
}

/// HyLog's table: (disk, cleaning utilization, disk utilization) at the crossover,
/// and the tolerance this model is held to. The 2003 and 1999 disks agree within
/// 0.01. The 1991 disk does not: with the slides' nominal 15 ms and 2.3 MB/s, a
/// segment I/O efficiency is at most 5.2 (infinite segments), so the crossover is at
/// least u = 0.61; HyLog's 0.52 needs E = 4.2, i.e. an effective sequential rate of
/// about 1.9 MB/s (track and cylinder switches in their detailed disk model). The
/// tolerance says that, it does not tune it away (docs/sim/crossover.md).
const TABLE: [(&str, f64, f64, f64, f64); 3] = [
    ("1991", 0.52, 0.74, 0.09, 0.05),
    ("1999", 0.88, 0.94, 0.01, 0.01),
    ("2003", 0.94, 0.97, 0.01, 0.01),
];

#[test]
fn crossover_matches_hylogs_table_within_the_stated_tolerance() {
    for (year, paper_u, paper_disk_u, tol_u, tol_disk_u) in TABLE {
        let m = model(year.parse().expect("preset"));
        let (u, disk_u) = m.crossover().expect("LFS wins at low utilization");
        assert!(
            close(u, paper_u, tol_u) && close(disk_u, paper_disk_u, tol_disk_u),
            "{year}: model {u:.3}/{disk_u:.3}, HyLog {paper_u}/{paper_disk_u}"
        );
        // At the crossover both layouts cost the same; below it LFS is faster.
        assert!(close(m.lfs_page_ms(u), m.overwrite_page_ms(), 1e-9));
        assert!(m.lfs_page_ms(u - 0.01) < m.overwrite_page_ms());
        assert!(m.lfs_page_ms(u + 0.01) > m.overwrite_page_ms());
    }
    // The values the docs quote (1 MiB segments, 8 KiB pages).
    let want = [
        ("1991", 0.604, 0.785),
        ("1999", 0.878, 0.937),
        ("2003", 0.938, 0.969),
    ];
    for (year, u, disk_u) in want {
        let (got_u, got_disk_u) = model(year.parse().expect("preset"))
            .crossover()
            .expect("crossover");
        assert!(
            close(got_u, u, 0.0015) && close(got_disk_u, disk_u, 0.0015),
            "{year}: {got_u:.4}/{got_disk_u:.4}"
        );
    }
}

#[test]
fn no_crossover_when_segments_do_not_pay() {
    // One-page segments: E = 1, LFS never wins.
    let m = Model {
        disk: Disk::y2003(),
        page_bytes: PAGE,
        segment_bytes: PAGE,
    };
    assert_eq!(m.crossover(), None);
}

#[test]
fn hylog_is_never_worse_than_either_and_picks_the_ends_where_they_win() {
    for disk in [Disk::y1991(), Disk::y1999(), Disk::y2003()] {
        let m = model(disk);
        for i in 0..=24 {
            let disk_u = 0.5 + 0.02 * f64::from(i);
            let u = cleaning_utilization(disk_u);
            let best = m.hylog_best(disk_u);
            let lfs = m.lfs_page_ms(u);
            let ow = m.overwrite_page_ms();
            assert!(best.page_ms <= lfs + 1e-9 && best.page_ms <= ow + 1e-9);
            let hy = m.throughput(Layout::Hylog, disk_u, u);
            assert!(hy >= m.throughput(Layout::Lfs, disk_u, u) - 1e-9);
            assert!(hy >= m.throughput(Layout::Overwrite, disk_u, u) - 1e-9);
        }
    }
    // 2003 disk at 50%: logging everything is best (the optimum is h = 1).
    let m = model(Disk::y2003());
    assert_eq!(m.hylog_best(0.5).hot_fraction, 1.0);
}

#[test]
fn hylog_partition_utilization_is_the_hot_share_of_the_used_space() {
    let m = model(Disk::y1991());
    // 90% full, 10% hot: 0.09 live in 0.19 of the disk.
    let c = m.hylog_page_ms(0.9, 0.1);
    assert!(close(c.hot_disk_utilization, 0.09 / 0.19, 1e-12));
    assert!(close(
        c.page_ms,
        0.1 * m.lfs_page_ms(c.hot_cleaning_utilization) + 0.9 * m.overwrite_page_ms(),
        1e-9
    ));
    assert_eq!(m.hylog_page_ms(0.9, 0.0).page_ms, m.overwrite_page_ms());
}

#[test]
fn disks_and_layouts_parse_with_clear_errors() {
    assert_eq!("2003".parse::<Disk>(), Ok(Disk::y2003()));
    let d: Disk = "10ms:40MB/s".parse().expect("custom disk");
    assert_eq!((d.positioning_ms, d.transfer_mb_per_s), (10.0, 40.0));
    let d: Disk = "4:150".parse().expect("custom disk");
    assert!(close(d.io_ms(150_000), 5.0, 1e-12));
    for bad in ["1995", "10", "x:1", "1:0", "-1:5"] {
        let e = bad.parse::<Disk>().expect_err("bad disk");
        assert!(e.contains(bad), "{e}");
    }
    for l in Layout::ALL {
        assert_eq!(l.name().parse::<Layout>(), Ok(l));
    }
    assert!("wolf".parse::<Layout>().is_err());
}

#[test]
fn lsvds_greedy_gc_cleans_at_the_analytical_utilization() {
    // 64 MiB volume, 8 KiB pages, 1 MiB objects: the victims' utilization measured
    // through the simulator's GC is within 0.02 of U = (u-1)/ln u at the disk
    // utilization it actually held (greedy does slightly better than the relation,
    // which is FIFO's).
    let setup = cleaning::Setup {
        volume_bytes: 64 << 20,
        page_bytes: PAGE,
        segment_bytes: SEGMENT,
        overwrites_per_page: 8,
        seed: 7,
    };
    for disk_u in [0.6, 0.8, 0.9] {
        let m = cleaning::measure(setup, disk_u).expect("measure");
        assert!(close(m.disk_utilization, disk_u, 0.02), "{disk_u}: {m:?}");
        let analytic = cleaning_utilization(m.disk_utilization);
        assert!(
            close(m.cleaning_utilization, analytic, 0.02),
            "{disk_u}: measured {m:?}, analytic {analytic:.3}"
        );
    }
}

#[test]
fn utilization_ranges_parse() {
    let v = cli::utilizations("0.5..0.98").expect("range");
    assert_eq!(v.len(), 13);
    assert_eq!(v.first(), Some(&0.5));
    assert_eq!(v.last(), Some(&0.98));
    assert_eq!(
        cli::utilizations("0.5..0.6:0.05").expect("stepped"),
        [0.5, 0.55, 0.6]
    );
    assert_eq!(cli::utilizations("0.7, 0.9").expect("list"), [0.7, 0.9]);
    for bad in ["", "0.9..0.5", "1.2", "0.5..x", "0..0.5"] {
        assert!(cli::utilizations(bad).is_err(), "{bad}");
    }
}

#[test]
fn the_measured_crossing_interpolates_between_sweep_points() {
    let row = |disk_u: f64, u: f64| report::Row {
        disk_utilization: disk_u,
        cleaning_utilization: u,
        analytic_cleaning_utilization: u,
        measured_disk_utilization: Some(disk_u + 0.01),
        pages_per_second: Vec::new(),
        hylog_hot_fraction: 0.0,
    };
    let rows = [row(0.7, 0.4), row(0.8, 0.6), row(0.9, 0.8)];
    let x = cli::measured_crossing(&rows, 0.5).expect("inside the sweep");
    assert!(close(x, 0.76, 1e-12), "{x}");
    assert_eq!(cli::measured_crossing(&rows, 0.9), None);
}
