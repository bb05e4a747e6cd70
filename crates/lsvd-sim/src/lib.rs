//! `lsvd sim`: trace-driven simulation on the same core as the live engine.
//!
//! Block traces (or synthetic workloads) are replayed through the engine's batching,
//! object numbering, store map and GC code (`lsvd-core`) with a simulated clock (the
//! trace's timestamps) and a simulated store that keeps object headers and sizes but no
//! data. See [`volume`] for the exact model and how it differs from the engine.
//!
//! Each volume of each trace file is simulated separately (a multi-volume trace such
//! as MSR, Tencent CBS or SPC gives one simulated volume per disk/ASU/volume id), once
//! per configuration: `--batch-size`, `--gc-start`/`--gc-stop`, `--gc-policy` and
//! `--gc-defrag` take comma-separated lists and every combination is simulated in the
//! same pass.
// Tests may still sleep and read the system clock; the rule holds for the code they test.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod gecko;
pub mod layout;
pub mod plot;
pub mod report;
pub mod volume;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use lsvd_core::gc::{GcConfig, GcPolicy};
use lsvd_trace::{FormatChoice, Pattern, Request, SyntheticSpec, TraceReader, Units};
use serde::Serialize;

use report::{InputReport, RunReport, VolumeResult};
use volume::{SimConfig, VolumeSim};

use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_core::size::parse_size;

/// Tests: `lsvd sim ...` (argv from "lsvd") parsed as the command line parses it.
#[cfg(test)]
pub(crate) fn parse_cli<I, T>(argv: I) -> std::result::Result<SimArgs, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    #[derive(clap::Parser)]
    #[command(name = "lsvd")]
    enum Cli {
        Sim(SimArgs),
    }
    <Cli as clap::Parser>::try_parse_from(argv).map(|Cli::Sim(args)| args)
}

/// Tests: a trace file `name` in `dir` holding `contents`.
#[cfg(test)]
pub(crate) fn trace_file(
    dir: &lsvd_store::testutil::TempDir,
    name: &str,
    contents: &str,
) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, contents).expect("trace written");
    path
}

#[derive(Args, Debug)]
pub struct SimArgs {
    /// Trace files to replay (gzip and bzip2 are read directly). Each file's volumes are
    /// simulated separately.
    pub traces: Vec<PathBuf>,
    /// Trace format: msr, msr-cut, spc, cloudphysics, vscsi, tencent, systor, disksim or
    /// auto (from the file name and first lines).
    #[arg(long, default_value = "auto")]
    pub format: String,
    /// Units of offsets and sizes for the 5-column `time device offset size type`
    /// formats: bytes (msr-cut's default, the MSR cuts) or sectors (512-byte; disksim's
    /// default, classic DiskSim and other replayers' traces). Other formats fix their
    /// units. A trace that looks like it is in the other unit gets a warning line.
    #[arg(long, value_name = "bytes|sectors")]
    pub units: Option<String>,
    /// Simulate only this volume of each trace: its name (hm_0, asu1, vol1058) or its
    /// number in order of first appearance.
    #[arg(long, value_name = "ID|NAME")]
    pub volume: Option<String>,
    /// Stop at the first malformed trace line instead of counting and skipping it.
    #[arg(long)]
    pub strict: bool,

    /// Replay a synthetic workload instead of traces: uniform, sequential,
    /// hotcold:FRACTION:SHARE (hotcold:0.2:0.8 is 80/20) or zipf:THETA.
    #[arg(long, value_name = "PATTERN")]
    pub synthetic: Option<String>,
    /// Synthetic: request size (with --layout: the page size; HyLog uses 8K).
    #[arg(long, default_value = "4K")]
    pub io_size: String,
    /// Synthetic: number of requests (after preconditioning).
    #[arg(long, default_value_t = 1_000_000)]
    pub requests: u64,
    /// Synthetic: fraction of requests that are writes (the rest are reads).
    #[arg(long, default_value_t = 1.0)]
    pub write_fraction: f64,
    /// Synthetic: random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Synthetic: write the whole volume sequentially first.
    #[arg(long)]
    pub precondition: bool,

    /// Volume size. Traces: requests that do not fit are counted as out of range and
    /// skipped (default: each volume's largest offset rounded up to 1 GiB). Synthetic:
    /// the workload's volume size (default 1G).
    #[arg(long)]
    pub volume_size: Option<String>,
    /// Client bytes per object (comma-separated list to compare several).
    #[arg(long, default_value = "8M")]
    pub batch_size: String,
    /// Close a partial batch after this many milliseconds of trace time (0: never).
    #[arg(long, default_value_t = 2000)]
    pub batch_timeout_ms: u64,
    /// A checkpoint object after this many data objects.
    #[arg(long, default_value_t = 64)]
    pub checkpoint_every: u64,
    /// Also a checkpoint once this many milliseconds of trace time have passed since
    /// the last one, if data objects were written (0: only by count). `lsvd serve`
    /// uses 300000 (--checkpoint-interval 300); the results in docs/sim/ use 0.
    #[arg(long, default_value_t = 0)]
    pub checkpoint_interval_ms: u64,
    /// Start GC when live/stored falls below this (0 disables GC; comma-separated list
    /// to compare several).
    #[arg(long, default_value = "0.70")]
    pub gc_start: String,
    /// Stop GC once live/stored is above this (default: each start + 0.05; a list pairs
    /// with --gc-start).
    #[arg(long)]
    pub gc_stop: Option<String>,
    /// Victim policy: greedy, cost-benefit or hylog (hot and cold data kept in
    /// separate objects by measured write frequency, by GC and in fresh writes); a
    /// comma-separated list compares them. With --layout chain:N/stripe:N: greedy, cost-benefit or
    /// log-order (oldest segment first).
    #[arg(long, default_value = "greedy")]
    pub gc_policy: String,
    /// Live bytes copied per GC pass, at most.
    #[arg(long, default_value = "32M")]
    pub gc_pass: String,
    /// Defragmenting GC: plug gaps of at most this many bytes between the extents a
    /// pass moves, as `lsvd serve --gc-defrag-hole` does (0: off; a comma-separated
    /// list compares several, e.g. 0,8K for the LSVD paper's Table 5 columns).
    #[arg(long, default_value = "0")]
    pub gc_defrag: String,

    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// With --json: include each volume's time series.
    #[arg(long)]
    pub series: bool,
    /// Write an SVG chart of utilization, write amplification and store size against
    /// client bytes written.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Read the whole input into memory first, so the reported speed is the policy
    /// replay alone (without parsing).
    #[arg(long)]
    pub preload: bool,

    #[command(flatten)]
    pub layout: layout::cli::LayoutArgs,
    #[command(flatten)]
    pub gecko: gecko::cli::GeckoArgs,
}

impl SimArgs {
    /// `--volume-size` in bytes, or `default` when it is not given.
    pub(crate) fn volume_size_or(&self, default: u64) -> Result<u64> {
        self.volume_size.as_deref().map_or(Ok(default), parse_size)
    }

    /// Refuse a `--synthetic` pattern other than uniform, for a model that simulates
    /// only that: `model` says what it does simulate.
    pub(crate) fn only_uniform_synthetic(&self, model: &str) -> Result<()> {
        match self.synthetic.as_deref() {
            None | Some("uniform") => Ok(()),
            Some(other) => Err(Error::bad_input(format!(
                "{model}; --synthetic {other} is not modelled"
            ))),
        }
    }
}

/// CPU time of the calling thread, in seconds (0 if unavailable). The replay runs on
/// one thread, so this is the host CPU time it used, unaffected by other load.
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec passed to it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Requests replayed, wall time and CPU time of the replay loops.
#[derive(Debug, Default)]
struct Timing {
    requests: u64,
    wall: Duration,
    cpu_seconds: f64,
}

/// Measures one replay loop.
struct Stopwatch {
    wall: Instant,
    cpu: f64,
}

// The simulator runs on the trace's clock; only its own run time (the report's wall
// and CPU seconds, the progress line) is real time, which is the point of measuring it.
#[expect(
    clippy::disallowed_methods,
    reason = "the simulator's own run time is real time"
)]
impl Stopwatch {
    fn start() -> Self {
        Stopwatch {
            wall: Instant::now(),
            cpu: thread_cpu_seconds(),
        }
    }
    fn stop(self, requests: u64, into: &mut Timing) {
        into.requests += requests;
        into.wall += self.wall.elapsed();
        into.cpu_seconds += (thread_cpu_seconds() - self.cpu).max(0.0);
    }
}

/// One configuration to simulate, with a label naming what differs between them.
#[derive(Debug, Clone)]
pub struct NamedConfig {
    pub label: String,
    pub batch_size: String,
    pub config: SimConfig,
}

fn list(s: &str) -> Vec<&str> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .collect()
}

fn parse_fraction(s: &str, what: &str) -> Result<f64> {
    let v: f64 = s
        .parse()
        .map_err(|_| Error::bad_input(format!("{what}: '{s}' is not a number")))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(Error::bad_input(format!(
            "{what}: {v} is not between 0 and 1"
        )));
    }
    Ok(v)
}

/// Every combination of the listed settings; an invalid setting is `BadInput`.
pub fn configs(args: &SimArgs, volume_size: Option<u64>) -> Result<Vec<NamedConfig>> {
    let batches = list(&args.batch_size);
    let starts = list(&args.gc_start);
    let policies = list(&args.gc_policy);
    if batches.is_empty() || starts.is_empty() || policies.is_empty() {
        return Err(Error::bad_input(
            "--batch-size, --gc-start and --gc-policy need at least one value",
        ));
    }
    let stops: Vec<f64> = match &args.gc_stop {
        None => starts
            .iter()
            .map(|s| parse_fraction(s, "--gc-start").map(|v| (v + 0.05).min(1.0)))
            .collect::<Result<_, _>>()?,
        Some(s) => {
            let v = list(s);
            if v.len() != starts.len() {
                return Err(Error::bad_input(format!(
                    "--gc-stop has {} values but --gc-start has {}",
                    v.len(),
                    starts.len()
                )));
            }
            v.iter()
                .map(|x| parse_fraction(x, "--gc-stop"))
                .collect::<Result<_, _>>()?
        }
    };
    let pass_bytes = parse_size(&args.gc_pass)?;
    let holes = list(&args.gc_defrag);
    if holes.is_empty() {
        return Err(Error::bad_input("--gc-defrag needs at least one value"));
    }
    let mut out = Vec::new();
    for b in &batches {
        let batch_size_bytes = parse_size(b)?;
        if !(4096..=1 << 30).contains(&batch_size_bytes) {
            return Err(Error::bad_input(format!(
                "--batch-size {b}: must be between 4K and 1G"
            )));
        }
        for (start, stop) in starts.iter().zip(&stops) {
            let start_utilization = parse_fraction(start, "--gc-start")?;
            for (p, hole) in policies
                .iter()
                .flat_map(|p| holes.iter().map(move |h| (p, h)))
            {
                let policy: GcPolicy = p.parse().map_err(Error::bad_input)?;
                let gc = GcConfig {
                    start_utilization,
                    stop_utilization: *stop,
                    policy,
                    pass_bytes,
                    defrag_hole_bytes: parse_size(hole)?,
                };
                gc.validate().map_err(Error::bad_input)?;
                let mut label = Vec::new();
                if batches.len() > 1 {
                    label.push(format!("batch {b}"));
                }
                if starts.len() > 1 {
                    label.push(if gc.enabled() {
                        format!("gc {start_utilization:.2}-{stop:.2}")
                    } else {
                        "no gc".to_string()
                    });
                }
                if policies.len() > 1 {
                    label.push(policy.to_string());
                }
                if holes.len() > 1 {
                    label.push(match gc.defrag_hole_bytes {
                        0 => "no defrag".to_string(),
                        _ => format!("defrag {hole}"),
                    });
                }
                out.push(NamedConfig {
                    label: label.join(" "),
                    batch_size: b.to_string(),
                    config: SimConfig {
                        batch_size_bytes,
                        batch_timeout_ns: (args.batch_timeout_ms > 0)
                            .then(|| args.batch_timeout_ms.saturating_mul(1_000_000)),
                        checkpoint_every_objects: args.checkpoint_every.max(1),
                        checkpoint_interval_ns: (args.checkpoint_interval_ms > 0)
                            .then(|| args.checkpoint_interval_ms.saturating_mul(1_000_000)),
                        gc,
                        volume_size_bytes: volume_size,
                        series_points: if args.plot.is_some() || args.series {
                            500
                        } else {
                            0
                        },
                    },
                });
            }
        }
    }
    Ok(out)
}

/// A progress line on stderr, only when stderr is a terminal.
struct Progress {
    enabled: bool,
    started: Instant,
    last: Instant,
    label: String,
    total: Option<u64>,
    drawn: bool,
}

#[expect(
    clippy::disallowed_methods,
    reason = "a progress line paces itself on real time"
)]
impl Progress {
    fn new(label: String, total: Option<u64>) -> Self {
        let now = Instant::now();
        Progress {
            enabled: std::io::stderr().is_terminal(),
            started: now,
            last: now,
            label,
            total,
            drawn: false,
        }
    }

    /// Called every few thousand requests.
    fn update(&mut self, done: u64) {
        if !self.enabled || self.last.elapsed() < Duration::from_millis(200) {
            return;
        }
        self.last = Instant::now();
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        let rate = done as f64 / secs / 1e6;
        let line = match self.total {
            Some(total) if total > 0 => {
                let frac = (done as f64 / total as f64).min(1.0);
                let width = 30;
                let filled = (frac * width as f64) as usize;
                format!(
                    "{} [{}{}] {:5.1}% {done}/{total} requests, {rate:.2} M/s",
                    self.label,
                    "#".repeat(filled),
                    " ".repeat(width - filled),
                    frac * 100.0
                )
            }
            _ => format!("{} {done} requests, {rate:.2} M/s", self.label),
        };
        eprint!("\r\x1b[2K{line}");
        self.drawn = true;
    }

    fn clear(&mut self) {
        if self.drawn {
            eprint!("\r\x1b[2K");
            self.drawn = false;
        }
    }
}

/// The simulations of one input: per volume id, one simulator per configuration.
struct InputSims<'a> {
    configs: &'a [NamedConfig],
    volumes: Vec<Option<Vec<VolumeSim>>>,
    /// Per volume id: simulated (true) or filtered out by --volume (false).
    selected: Vec<Option<bool>>,
}

impl<'a> InputSims<'a> {
    fn new(configs: &'a [NamedConfig]) -> Self {
        InputSims {
            configs,
            volumes: Vec::new(),
            selected: Vec::new(),
        }
    }

    #[inline]
    fn feed(&mut self, r: &Request, select: impl FnOnce(u32) -> bool) {
        let v = r.volume as usize;
        if v >= self.selected.len() {
            self.selected.resize(v + 1, None);
            self.volumes.resize_with(v + 1, || None);
        }
        let chosen = *self.selected[v].get_or_insert_with(|| select(r.volume));
        if !chosen {
            return;
        }
        let configs = self.configs;
        let sims = self.volumes[v]
            .get_or_insert_with(|| configs.iter().map(|c| VolumeSim::new(c.config)).collect());
        for s in sims.iter_mut() {
            s.request(r);
        }
    }

    fn finish(self, input: usize, names: &[String], with_series: bool) -> Vec<VolumeResult> {
        let mut out = Vec::new();
        for (id, sims) in self.volumes.into_iter().enumerate() {
            let Some(sims) = sims else { continue };
            for (mut sim, cfg) in sims.into_iter().zip(self.configs) {
                sim.finish();
                out.push(VolumeResult {
                    input,
                    volume: names.get(id).cloned().unwrap_or_else(|| format!("#{id}")),
                    config: cfg.label.clone(),
                    batch_size_bytes: cfg.config.batch_size_bytes,
                    gc_policy: cfg.config.gc.policy.to_string(),
                    gc_start: cfg.config.gc.start_utilization,
                    gc_stop: cfg.config.gc.stop_utilization,
                    report: sim.report(),
                    series: if with_series {
                        sim.series().to_vec()
                    } else {
                        Vec::new()
                    },
                });
            }
        }
        out
    }
}

fn volume_matches(want: &str, id: u32, name: &str) -> bool {
    name == want || want.parse::<u32>().is_ok_and(|n| n == id)
}

/// Replay `requests` into `sims`, with progress. Returns the number replayed.
fn replay(
    requests: impl Iterator<Item = Request>,
    sims: &mut InputSims<'_>,
    progress: &mut Progress,
    mut select: impl FnMut(u32) -> bool,
) -> u64 {
    let mut n = 0u64;
    for r in requests {
        sims.feed(&r, &mut select);
        n += 1;
        if n & 0xffff == 0 {
            progress.update(n);
        }
    }
    n
}

/// The `--units` value, if given; a bad one is `BadInput`.
pub fn parse_units(units: Option<&str>) -> Result<Option<Units>> {
    units
        .map(|u| u.parse::<Units>())
        .transpose()
        .map_err(|e| Error::from(e).context("--units"))
}

/// Replay one trace file.
fn run_trace(
    args: &SimArgs,
    index: usize,
    path: &std::path::Path,
    configs: &[NamedConfig],
    timing: &mut Timing,
) -> Result<(InputReport, Vec<VolumeResult>)> {
    // The trace is the user's input: unusable is `BadInput`, unreadable `LocalIo`.
    let in_trace = |e: lsvd_trace::Error| Error::from(e).context(path.display());
    let choice: FormatChoice = args.format.parse()?;
    let format = choice.resolve(path).map_err(in_trace)?;
    let mut reader = TraceReader::open(path, format)
        .map_err(in_trace)?
        .strict(args.strict);
    if let Some(units) = parse_units(args.units.as_deref())? {
        reader = reader.units(units).map_err(in_trace)?;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    let mut sims = InputSims::new(configs);
    let mut progress = Progress::new(name, None);
    let want = args.volume.clone();
    let (names, stats, units_warning) = if args.preload {
        let requests: Vec<Request> = reader.by_ref().collect();
        if let Some(e) = reader.error() {
            return Err(in_trace(e.clone()));
        }
        let names = reader.volumes().to_vec();
        let watch = Stopwatch::start();
        let n = replay(requests.into_iter(), &mut sims, &mut progress, |id| {
            want.as_deref().is_none_or(|w| {
                volume_matches(w, id, names.get(id as usize).map_or("", String::as_str))
            })
        });
        watch.stop(n, timing);
        let warning = reader.units_warning();
        let stats = reader.finish().map_err(in_trace)?;
        (names, stats, warning)
    } else {
        let watch = Stopwatch::start();
        let mut n = 0u64;
        loop {
            let r = match reader.next_request() {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => {
                    progress.clear();
                    return Err(in_trace(e));
                }
            };
            let volume_name = &reader;
            sims.feed(&r, |id| {
                want.as_deref()
                    .is_none_or(|w| volume_matches(w, id, volume_name.volume_name(id)))
            });
            n += 1;
            if n & 0xffff == 0 {
                progress.update(n);
            }
        }
        watch.stop(n, timing);
        let names = reader.volumes().to_vec();
        let warning = reader.units_warning();
        let stats = reader.finish().map_err(in_trace)?;
        (names, stats, warning)
    };
    progress.clear();
    if let Some(w) = units_warning {
        eprintln!("lsvd: warning: {}: {w}", path.display());
    }
    let results = sims.finish(index, &names, args.series || args.plot.is_some());
    if let Some(w) = &want
        && results.is_empty()
    {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "{}: no volume '{w}' (volumes: {})",
                path.display(),
                names.join(", ")
            ),
        ));
    }
    let input = InputReport {
        name: path.display().to_string(),
        format: format.to_string(),
        volumes: names.len() as u64,
        lines: stats.lines,
        requests: stats.requests,
        skipped: stats.skipped,
        bad_lines: stats.bad_lines,
        first_bad: stats.first_bad,
        unordered: stats.unordered,
    };
    Ok((input, results))
}

fn run_synthetic(
    args: &SimArgs,
    pattern: &str,
    configs: &[NamedConfig],
    timing: &mut Timing,
) -> Result<(InputReport, Vec<VolumeResult>)> {
    let pattern: Pattern = pattern.parse()?;
    let spec = SyntheticSpec {
        pattern,
        volume_size_bytes: args.volume_size_or(1 << 30)?,
        io_size_bytes: parse_size(&args.io_size)?,
        requests: args.requests,
        write_fraction: args.write_fraction,
        seed: args.seed,
        precondition: args.precondition,
    };
    let stream = lsvd_trace::synthetic(spec)?;
    let total = spec.total_requests();
    let mut sims = InputSims::new(configs);
    let mut progress = Progress::new(format!("synthetic {pattern}"), Some(total));
    let n = if args.preload {
        let requests: Vec<Request> = stream.collect();
        let watch = Stopwatch::start();
        let n = replay(requests.into_iter(), &mut sims, &mut progress, |_| true);
        watch.stop(n, timing);
        n
    } else {
        let watch = Stopwatch::start();
        let n = replay(stream, &mut sims, &mut progress, |_| true);
        watch.stop(n, timing);
        n
    };
    progress.clear();
    let name = format!(
        "synthetic {pattern} size={} io={} requests={} writes={} seed={}{}",
        args.volume_size.as_deref().unwrap_or("1G"),
        args.io_size,
        args.requests,
        args.write_fraction,
        args.seed,
        if args.precondition {
            " preconditioned"
        } else {
            ""
        }
    );
    let results = sims.finish(
        0,
        &["synthetic".to_string()],
        args.series || args.plot.is_some(),
    );
    let input = InputReport {
        name,
        format: "synthetic".into(),
        volumes: 1,
        lines: n,
        requests: n,
        skipped: 0,
        bad_lines: 0,
        first_bad: Vec::new(),
        unordered: 0,
    };
    Ok((input, results))
}

/// Run the simulation described by `args` and return the report (nothing printed).
pub fn simulate(args: &SimArgs) -> Result<RunReport> {
    if args.synthetic.is_some() != args.traces.is_empty() {
        return Err(Error::bad_input(
            "give trace files or --synthetic PATTERN (not both)",
        ));
    }
    if args.synthetic.is_some() && args.units.is_some() {
        return Err(Error::bad_input(
            "--units applies to trace files, not to --synthetic workloads",
        ));
    }
    let fixed_size = match (&args.synthetic, &args.volume_size) {
        (None, Some(s)) => {
            let v = parse_size(s)?;
            if v == 0 || !v.is_multiple_of(512) {
                return Err(Error::bad_input(
                    "--volume-size must be a positive multiple of 512 bytes",
                ));
            }
            Some(v)
        }
        (Some(_), Some(s)) => Some(parse_size(s)?),
        (Some(_), None) => Some(1 << 30),
        (None, None) => None,
    };
    let configs = configs(args, fixed_size)?;
    let mut inputs = Vec::new();
    let mut volumes = Vec::new();
    let mut timing = Timing::default();
    if let Some(p) = &args.synthetic {
        let (i, v) = run_synthetic(args, p, &configs, &mut timing)?;
        inputs.push(i);
        volumes.extend(v);
    } else {
        for (index, path) in args.traces.iter().enumerate() {
            let (i, v) = run_trace(args, index, path, &configs, &mut timing)?;
            inputs.push(i);
            volumes.extend(v);
        }
    }
    let secs = timing.wall.as_secs_f64();
    let rate = |s: f64| {
        if s > 0.0 {
            timing.requests as f64 / s
        } else {
            0.0
        }
    };
    Ok(RunReport {
        inputs,
        configs: configs.len() as u64,
        requests_replayed: timing.requests,
        host_seconds: secs,
        requests_per_second: rate(secs),
        cpu_seconds: timing.cpu_seconds,
        requests_per_cpu_second: rate(timing.cpu_seconds),
        preloaded: args.preload,
        volumes,
    })
}

pub fn run(args: SimArgs) -> Result<()> {
    if args.layout.layout.is_some() {
        return layout::cli::run(&args);
    }
    let mut report = simulate(&args)?;
    if let Some(path) = &args.plot {
        write_plot(path, &plot::chart(&report, 8))?;
    }
    if args.json && !args.series {
        for v in &mut report.volumes {
            v.series.clear();
        }
    }
    print_report(&report, args.json, report::text)
}

/// Write a simulation's SVG chart to the `--plot` file.
pub(crate) fn write_plot(path: &Path, svg: &str) -> Result<()> {
    std::fs::write(path, svg)
        .map_err(|e| Error::local_io(format!("cannot write {}", path.display()), e))
}

/// Print a simulation's report on stdout: pretty JSON with `--json`, else `text` of it.
pub(crate) fn print_report<R: Serialize>(
    report: &R,
    json: bool,
    text: impl FnOnce(&R) -> String,
) -> Result<()> {
    if json {
        let s = serde_json::to_string_pretty(report)
            .map_err(|e| Error::with_source(ErrorKind::Unsupported, "cannot encode results", e))?;
        println!("{s}");
    } else {
        print!("{}", text(report));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
