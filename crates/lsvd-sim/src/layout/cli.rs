//! `lsvd sim --layout`: sweeps disk utilization for each disk and layout and prints
//! page-write throughput, the crossover next to HyLog's table, and optionally an SVG.

use std::fmt::Write as _;

use clap::Args;

use super::cleaning::{self, Measured, Setup};
use super::report::{DiskReport, LayoutReport, Row};
use super::{Disk, Layout, Model, cleaning_utilization};
use crate::SimArgs;
use lsvd_core::error::{Error, Result};
use lsvd_core::size::parse_size;

/// The HDD layout models (`--layout`).
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "HDD layout models (--layout)")]
pub struct LayoutArgs {
    /// Instead of replaying through lsvd, model the disk layouts HyLog compares, for
    /// uniform page updates (`--synthetic uniform`, page size `--io-size`, HyLog uses
    /// 8K): overwrite (one positioned I/O per page), lfs (segments plus cleaning),
    /// hylog (hot pages logged, cold in place). Comma-separated. Prints page writes
    /// per second at each --utilization and where LFS stops beating overwrite. Example:
    /// lsvd sim --layout overwrite,lfs,hylog --disk 1991,2003 --synthetic uniform
    /// --io-size 8K --utilization 0.5..0.98. Or chain:N / stripe:N: a log over N
    /// modelled drives (--device), chained as in Gecko or striped as RAID-0, with
    /// clients and GC; prints application and GC MB/s over time. Example:
    /// lsvd sim --layout chain:2,stripe:2 --chain-gc compact-in-body,move-to-tail
    #[arg(long, value_name = "LAYOUTS")]
    pub layout: Option<String>,
    /// Disk models (comma-separated): 1991 (15 ms positioning, 2.3 MB/s), 1999 (8 ms,
    /// 18 MB/s), 2003 (5.6 ms, 61 MB/s), or POSITIONING_MS:MB_PER_S (e.g. 4:200).
    #[arg(
        long,
        requires = "layout",
        default_value = "1991,2003",
        value_name = "DISKS"
    )]
    pub disk: String,
    /// Disk utilizations (live data / disk space): a list (0.6,0.8) or a range
    /// FROM..TO with an optional step (0.5..0.98, 0.5..0.98:0.01; default step 0.04
    /// plus TO).
    #[arg(
        long,
        requires = "layout",
        default_value = "0.5..0.98",
        value_name = "LIST|FROM..TO[:STEP]"
    )]
    pub utilization: String,
    /// LFS segment size (one sequential write).
    #[arg(long, requires = "layout", default_value = "1M")]
    pub segment_size: String,
    /// HyLog's share of pages logged: auto (the share that minimizes the modelled
    /// write cost, as HyLog chooses it) or a fraction.
    #[arg(
        long,
        requires = "layout",
        default_value = "auto",
        value_name = "auto|FRACTION"
    )]
    pub hot_fraction: String,
    /// Where LFS's cleaning utilization comes from: analytic (u from U = (u-1)/ln u,
    /// the relation HyLog's table follows) or sim (measured with lsvd's greedy GC on a
    /// --volume-size volume, default 64M, with --segment-size objects; slower).
    #[arg(
        long,
        requires = "layout",
        default_value = "analytic",
        value_name = "analytic|sim"
    )]
    pub cleaning: String,
}

/// HyLog's crossover table (cleaning utilization, disk utilization).
pub fn hylog_table(disk: &Disk) -> Option<(f64, f64)> {
    match disk.name.as_str() {
        "1991" => Some((0.52, 0.74)),
        "1999" => Some((0.88, 0.94)),
        "2003" => Some((0.94, 0.97)),
        _ => None,
    }
}

fn list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|x| !x.is_empty())
}

fn fraction(s: &str, what: &str) -> Result<f64> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| Error::bad_input(format!("{what}: '{s}' is not a number")))?;
    if !(v > 0.0 && v < 1.0) {
        return Err(Error::bad_input(format!(
            "{what}: {v} must be between 0 and 1 (exclusive)"
        )));
    }
    Ok(v)
}

/// Parses `--utilization`: `0.6,0.8` or `FROM..TO[:STEP]`.
pub fn utilizations(s: &str) -> Result<Vec<f64>> {
    let what = "--utilization";
    let Some((from, rest)) = s.split_once("..") else {
        let v: Vec<f64> = list(s).map(|x| fraction(x, what)).collect::<Result<_>>()?;
        if v.is_empty() {
            return Err(Error::bad_input("--utilization needs at least one value"));
        }
        return Ok(v);
    };
    let (to, step) = match rest.split_once(':') {
        Some((to, step)) => (to, Some(step)),
        None => (rest, None),
    };
    let (from, to) = (fraction(from, what)?, fraction(to, what)?);
    let step = match step {
        Some(x) => fraction(x, "--utilization step")?,
        None => 0.04,
    };
    if from > to {
        return Err(Error::bad_input(format!(
            "--utilization {s}: FROM must not exceed TO"
        )));
    }
    let mut v = Vec::new();
    let mut i = 0u32;
    loop {
        let x = from + f64::from(i) * step;
        if x > to + 1e-9 || v.len() >= 1000 {
            break;
        }
        v.push((x * 1e6).round() / 1e6);
        i += 1;
    }
    if v.last().is_some_and(|&last| (last - to).abs() > 1e-9) {
        v.push(to);
    }
    Ok(v)
}

/// Runs the layout models described by `args` (with `args.layout.layout` set).
pub fn simulate(args: &SimArgs) -> Result<LayoutReport> {
    let la = &args.layout;
    let layouts: Vec<Layout> = list(la.layout.as_deref().unwrap_or_default())
        .map(|l| l.parse().map_err(Error::bad_input))
        .collect::<Result<_>>()?;
    if layouts.is_empty() {
        return Err(Error::bad_input(
            "--layout needs at least one of overwrite, lfs, hylog",
        ));
    }
    if !args.traces.is_empty() {
        return Err(Error::bad_input(
            "--layout models uniform page updates, not traces: use --synthetic uniform",
        ));
    }
    args.only_uniform_synthetic("--layout models uniform page updates (HyLog's TPC-B setting)")?;
    let disks: Vec<Disk> = list(&la.disk)
        .map(|d| d.parse().map_err(Error::bad_input))
        .collect::<Result<_>>()?;
    if disks.is_empty() {
        return Err(Error::bad_input("--disk needs at least one disk"));
    }
    let utils = utilizations(&la.utilization)?;
    let page_bytes = parse_size(&args.io_size)?;
    let segment_bytes = parse_size(&la.segment_size)?;
    if page_bytes == 0 || !page_bytes.is_multiple_of(512) || segment_bytes < page_bytes {
        return Err(Error::bad_input(format!(
            "--io-size {} (the page) must be a positive multiple of 512 and at most --segment-size {}",
            args.io_size, la.segment_size
        )));
    }
    let hot = match la.hot_fraction.trim() {
        "auto" => None,
        x => {
            let v: f64 = x.parse().map_err(|_| {
                Error::bad_input(format!("--hot-fraction: '{x}' is not auto or a number"))
            })?;
            if !(0.0..=1.0).contains(&v) {
                return Err(Error::bad_input(format!(
                    "--hot-fraction: {v} is not between 0 and 1"
                )));
            }
            Some(v)
        }
    };
    let simulated = match la.cleaning.trim() {
        "analytic" => false,
        "sim" => true,
        other => {
            return Err(Error::bad_input(format!(
                "--cleaning: '{other}': expected analytic or sim"
            )));
        }
    };
    // The measured cleaning utilization depends on the page and segment sizes only,
    // not on the disk: measure once per utilization.
    let measured: Vec<Option<Measured>> = if simulated {
        let setup = Setup {
            volume_bytes: args.volume_size_or(64 << 20)?,
            page_bytes,
            segment_bytes,
            overwrites_per_page: 8,
            seed: args.seed,
        };
        utils
            .iter()
            .map(|&u| cleaning::measure(setup, u).map(Some))
            .collect::<Result<_>>()?
    } else {
        vec![None; utils.len()]
    };
    let mut out = Vec::new();
    for disk in disks {
        let model = Model {
            disk: disk.clone(),
            page_bytes,
            segment_bytes,
        };
        let rows: Vec<Row> = utils
            .iter()
            .zip(&measured)
            .map(|(&disk_u, m)| {
                let analytic = cleaning_utilization(disk_u);
                let u = m.map_or(analytic, |m| m.cleaning_utilization);
                let mut choice = match hot {
                    None => model.hylog_best(disk_u),
                    Some(h) => model.hylog_page_ms(disk_u, h),
                };
                // HyLog's partition uses the analytical relation; with a measured
                // LFS cleaning utilization, logging everything (h = 1, which is LFS)
                // may be cheaper than the analytic optimum: HyLog would choose it.
                if hot.is_none() && model.lfs_page_ms(u) < choice.page_ms {
                    choice = super::HylogChoice {
                        hot_fraction: 1.0,
                        hot_disk_utilization: disk_u,
                        hot_cleaning_utilization: u,
                        page_ms: model.lfs_page_ms(u),
                    };
                }
                let pages_per_second = layouts
                    .iter()
                    .map(|&l| {
                        let v = match l {
                            Layout::Hylog => 1e3 / choice.page_ms,
                            _ => model.throughput(l, disk_u, u),
                        };
                        (l, v)
                    })
                    .collect();
                Row {
                    disk_utilization: disk_u,
                    cleaning_utilization: u,
                    analytic_cleaning_utilization: analytic,
                    measured_disk_utilization: m.map(|m| m.disk_utilization),
                    pages_per_second,
                    hylog_hot_fraction: choice.hot_fraction,
                }
            })
            .collect();
        let measured_crossover_disk_utilization = model
            .crossover_cleaning_utilization()
            .and_then(|u| measured_crossing(&rows, u));
        out.push(DiskReport {
            measured_crossover_disk_utilization,
            overwrite_page_ms: model.overwrite_page_ms(),
            segment_io_ms: model.segment_io_ms(),
            segment_efficiency: model.segment_efficiency(),
            crossover: model.crossover(),
            hylog_table: hylog_table(&disk),
            model,
            rows,
        });
    }
    Ok(LayoutReport {
        cleaning: if simulated { "sim" } else { "analytic" }.to_string(),
        disks: out,
    })
}

/// Where the rows' measured cleaning utilization crosses `u`, as a measured disk
/// utilization (linear interpolation between neighbouring rows).
pub(super) fn measured_crossing(rows: &[Row], u: f64) -> Option<f64> {
    rows.windows(2).find_map(|w| {
        let (a, b) = (&w[0], &w[1]);
        let (da, db) = (a.measured_disk_utilization?, b.measured_disk_utilization?);
        let (ua, ub) = (a.cleaning_utilization, b.cleaning_utilization);
        (ua <= u && u <= ub && ub > ua).then(|| da + (u - ua) / (ub - ua) * (db - da))
    })
}

fn kib(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes as f64 / 1024.0)
    }
}

/// The report as text tables.
pub fn text(report: &LayoutReport) -> String {
    let mut s = String::new();
    for d in &report.disks {
        let m = &d.model;
        let _ = writeln!(
            s,
            "disk {}: {} pages, {} segments: page I/O {:.2} ms, segment I/O {:.2} ms, segment I/O efficiency {:.2}",
            m.disk,
            kib(m.page_bytes),
            kib(m.segment_bytes),
            d.overwrite_page_ms,
            d.segment_io_ms,
            d.segment_efficiency
        );
        let paper = d.hylog_table.map_or(String::new(), |(u, du)| {
            format!(" (HyLog: {u:.2} / {du:.2})")
        });
        match d.crossover {
            Some((u, du)) => {
                let _ = writeln!(
                    s,
                    "LFS stops beating overwrite at cleaning utilization {u:.3}, disk utilization {du:.3}{paper}"
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    "LFS never beats overwrite (segment I/O efficiency <= 2){paper}"
                );
            }
        }
        if let Some(du) = d.measured_crossover_disk_utilization {
            let _ = writeln!(
                s,
                "with the cleaning utilization measured by lsvd's GC: at disk utilization {du:.3}"
            );
        }
        let _ = write!(s, "{:>7} {:>8}", "disk_u", "clean_u");
        if report.cleaning == "sim" {
            let _ = write!(s, " {:>10} {:>8}", "analytic_u", "sim_disk_u");
        }
        if let Some(r) = d.rows.first() {
            for (l, _) in &r.pages_per_second {
                let _ = write!(s, " {:>11}", format!("{}/s", l.name()));
            }
        }
        let _ = writeln!(s, " {:>9}", "hylog_hot");
        for r in &d.rows {
            let _ = write!(
                s,
                "{:>7.3} {:>8.3}",
                r.disk_utilization, r.cleaning_utilization
            );
            if report.cleaning == "sim" {
                let _ = write!(
                    s,
                    " {:>10.3} {:>8.3}",
                    r.analytic_cleaning_utilization,
                    r.measured_disk_utilization.unwrap_or(0.0)
                );
            }
            for (_, v) in &r.pages_per_second {
                let _ = write!(s, " {v:>11.1}");
            }
            let _ = writeln!(s, " {:>9.3}", r.hylog_hot_fraction);
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "cleaning utilization: {} (--cleaning); throughput: page writes per second of one disk",
        if report.cleaning == "sim" {
            "measured with lsvd's greedy GC"
        } else {
            "analytic, U = (u-1)/ln u"
        }
    );
    s
}

/// Prints the layout report (text or JSON) and writes the plot if asked. chain:N and
/// stripe:N go to [`crate::gecko`].
pub fn run(args: &SimArgs) -> Result<()> {
    if crate::gecko::cli::is_gecko(args.layout.layout.as_deref().unwrap_or_default()) {
        return crate::gecko::cli::run(args);
    }
    let report = simulate(args)?;
    if let Some(path) = &args.plot {
        crate::write_plot(path, &super::plot::svg(&report))?;
    }
    crate::print_report(&report, args.json, text)
}
