//! `lsvd sim --layout chain:N|stripe:N`: parses the chained-log options, runs each
//! configuration and prints the table, JSON or chart.

use std::sync::Arc;

use clap::Args;

use super::config::Config;
use super::device::DeviceModel;
use super::layout::{BLOCK_BYTES, ChainGc, Geometry, LayoutKind, VictimPolicy};
use super::report::{self, GeckoReport};
use super::{run, trace};
use crate::SimArgs;
use lsvd_core::error::{Error, Result};
use lsvd_core::size::parse_size;

/// Options of the chained-log (Gecko) layouts.
#[derive(Args, Debug)]
#[command(next_help_heading = "Chained-log layouts (--layout chain:N,stripe:N)")]
pub struct GeckoArgs {
    /// Drive model for chain:N / stripe:N: hdd[:seek_ms=8.5,rpm=7200,mb_per_s=150]
    /// (add short_seek_ms=..,full_seek_ms=.. for a distance-dependent seek) or
    /// ssd[:page=16K,channels=8,read_us=50,program_us=250].
    #[arg(long, requires = "layout", default_value = "hdd", value_name = "MODEL")]
    pub device: String,
    /// Capacity of each drive.
    #[arg(long, requires = "layout", default_value = "8G")]
    pub drive_size: String,
    /// Where chain GC writes what it moves: compact-in-body (the victim's own drive)
    /// or move-to-tail; a comma-separated list runs each.
    #[arg(long, requires = "layout", default_value = "compact-in-body")]
    pub chain_gc: String,
    /// stripe:N stripe unit.
    #[arg(long, requires = "layout", default_value = "64K")]
    pub stripe_unit: String,
    /// Closed-loop clients, each with --queue-depth requests outstanding.
    #[arg(long, requires = "layout", default_value_t = 4)]
    pub clients: u32,
    #[arg(long, requires = "layout", default_value_t = 8)]
    pub queue_depth: u32,
    /// Logical address space as a fraction of all drives' capacity (written once in
    /// order before the clock starts).
    #[arg(long, requires = "layout", default_value_t = 0.45)]
    pub fill: f64,
    /// GC runs once free segments fall under this fraction of all segments (0: no GC)...
    #[arg(long, requires = "layout", default_value_t = 0.35)]
    pub gc_free_start: f64,
    /// ...until they are above this fraction again.
    #[arg(long, requires = "layout", default_value_t = 0.40)]
    pub gc_free_stop: f64,
    /// Free segments per pool (chain: per drive) kept for GC.
    #[arg(long, requires = "layout", default_value_t = 2)]
    pub gc_reserve: u64,
    /// Simulated seconds.
    #[arg(long, requires = "layout", default_value_t = 60.0)]
    pub seconds: f64,
    /// Reporting interval, simulated milliseconds.
    #[arg(long, requires = "layout", default_value_t = 1000)]
    pub interval_ms: u64,
    /// Tail cache: an LRU of the blocks clients wrote most recently (every client
    /// write admitted); a read of a cached block touches no drive. 0: off.
    #[arg(long, requires = "layout", default_value = "0", value_name = "SIZE")]
    pub tail_cache: String,
}

/// One `--layout` item if it is chain:N[x2] or stripe:N[x2]: (kind, positions,
/// drives per position); `None` for anything else.
pub fn parse_layout(item: &str) -> Option<Result<(LayoutKind, u32, u32)>> {
    let (kind, n) = item.trim().split_once(':')?;
    let kind = match kind.trim() {
        "chain" => LayoutKind::Chain,
        "stripe" => LayoutKind::Stripe,
        _ => return None,
    };
    let n = n.trim();
    let (n, copies) = match (n.strip_suffix("x2"), n.split_once('x')) {
        (Some(n), _) => (n, 2),
        (None, Some((m, _))) if m.parse::<u32>().is_ok() => {
            return Some(Err(Error::bad_input(format!(
                "--layout {item}: a mirrored layout is Nx2 (two drives per position)"
            ))));
        }
        _ => (n, 1),
    };
    Some(match n.trim().parse::<u32>() {
        Ok(n) if (1..=64).contains(&n) => Ok((kind, n, copies)),
        _ => Err(Error::bad_input(format!(
            "--layout {item}: N must be a number of drives between 1 and 64"
        ))),
    })
}

/// Is `layouts` (the --layout value) for this module? True if any item starts with
/// `chain` or `stripe`.
pub fn is_gecko(layouts: &str) -> bool {
    layouts.split(',').any(|l| {
        let l = l.trim();
        l.starts_with("chain") || l.starts_with("stripe")
    })
}

fn secs_to_ns(s: f64, what: &str) -> Result<u64> {
    if !(s.is_finite() && s > 0.0 && s <= 1e6) {
        return Err(Error::bad_input(format!(
            "{what} {s}: must be positive and at most 1e6"
        )));
    }
    Ok((s * 1e9).round() as u64)
}

/// The configurations `args` asks for, in --layout order (chain layouts once per
/// --chain-gc value).
pub fn configs(args: &SimArgs) -> Result<(Vec<Config>, DeviceModel)> {
    let g = &args.gecko;
    let layouts = args.layout.layout.as_deref().unwrap_or_default();
    let mut parsed = Vec::new();
    for item in layouts.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        match parse_layout(item) {
            Some(r) => parsed.push(r?),
            None => {
                return Err(Error::bad_input(format!(
                    "--layout {item}: expected chain:N or stripe:N (overwrite, lfs and hylog cannot be mixed with them)"
                )));
            }
        }
    }
    if !args.traces.is_empty() && args.synthetic.is_some() {
        return Err(Error::bad_input(
            "give trace files or --synthetic uniform (not both)",
        ));
    }
    args.only_uniform_synthetic("--layout chain:N/stripe:N models uniform random I/O or traces")?;
    let device: DeviceModel = g.device.parse()?;
    let mut gcs = Vec::new();
    for x in g
        .chain_gc
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
    {
        gcs.push(match x {
            "compact-in-body" => ChainGc::CompactInBody,
            "move-to-tail" => ChainGc::MoveToTail,
            _ => {
                return Err(Error::bad_input(format!(
                    "--chain-gc '{x}': expected compact-in-body or move-to-tail"
                )));
            }
        });
    }
    if gcs.is_empty() {
        return Err(Error::bad_input("--chain-gc needs a value"));
    }
    let policy = match args.gc_policy.trim() {
        "greedy" => VictimPolicy::Greedy,
        "cost-benefit" | "costbenefit" => VictimPolicy::CostBenefit,
        "log-order" => VictimPolicy::LogOrder,
        o => {
            return Err(Error::bad_input(format!(
                "--gc-policy '{o}': chain:N/stripe:N take greedy, cost-benefit or log-order"
            )));
        }
    };
    let drive_bytes = parse_size(&g.drive_size)?;
    let segment_bytes = parse_size(&args.layout.segment_size)?;
    let chunk_bytes = parse_size(&g.stripe_unit)?;
    let io_bytes = parse_size(&args.io_size)?;
    if segment_bytes == 0 || drive_bytes < segment_bytes {
        return Err(Error::bad_input(
            "--drive-size must be at least one --segment-size",
        ));
    }
    let duration_ns = secs_to_ns(g.seconds, "--seconds")?;
    let trace = if args.traces.is_empty() {
        None
    } else {
        // Pieces of at most 256 KiB (and one segment).
        let max_blocks = (segment_bytes / BLOCK_BYTES).clamp(1, 64);
        Some(Arc::new(trace::load(
            &args.traces,
            &args.format,
            max_blocks,
        )?))
    };
    let interval_ns = g.interval_ms.saturating_mul(1_000_000);
    let tail_cache_blocks = parse_size(&g.tail_cache)? / BLOCK_BYTES;
    let mut out = Vec::new();
    for (kind, drives, copies) in parsed {
        let geo = Geometry {
            kind,
            drives,
            drive_bytes: drive_bytes / segment_bytes * segment_bytes,
            segment_bytes,
            chunk_bytes,
            reserve_segments: g.gc_reserve,
        };
        let variants: &[ChainGc] = match kind {
            LayoutKind::Chain => &gcs,
            LayoutKind::Stripe => &[ChainGc::MoveToTail],
        };
        for &chain_gc in variants {
            let c = Config {
                geo,
                device: device.clone(),
                chain_gc,
                policy,
                clients: g.clients,
                queue_depth: g.queue_depth,
                io_bytes,
                write_fraction: args.write_fraction,
                fill: g.fill,
                trace: trace.clone(),
                gc_start_free: g.gc_free_start,
                gc_stop_free: g.gc_free_stop,
                duration_ns,
                interval_ns,
                seed: args.seed,
                copies,
                tail_cache_blocks,
            };
            c.validate()?;
            out.push(c);
        }
    }
    if out.is_empty() {
        return Err(Error::bad_input("--layout needs chain:N or stripe:N"));
    }
    Ok((out, device))
}

/// Runs every configuration.
pub fn simulate(args: &SimArgs) -> Result<GeckoReport> {
    let (configs, device) = configs(args)?;
    let first = configs.first().map(|c| c.geo);
    let runs = configs
        .iter()
        .map(run::simulate)
        .collect::<Result<Vec<_>>>()?;
    Ok(GeckoReport {
        device,
        drive_bytes: first.map_or(0, |g| g.drive_bytes),
        segment_bytes: first.map_or(0, |g| g.segment_bytes),
        interval_s: args.gecko.interval_ms as f64 / 1e3,
        trace_mix: configs.first().and_then(|c| c.trace.as_ref()).map(|t| {
            (
                t.files.len(),
                t.requests.len(),
                t.logical_blocks * BLOCK_BYTES,
            )
        }),
        runs,
    })
}

/// `lsvd sim --layout chain:N|stripe:N`.
pub fn run(args: &SimArgs) -> Result<()> {
    let r = simulate(args)?;
    if let Some(path) = &args.plot {
        crate::write_plot(path, &report::svg(&r))?;
    }
    crate::print_report(&r, args.json, report::text)
}
