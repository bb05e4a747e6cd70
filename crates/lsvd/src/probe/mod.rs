//! `lsvd probe PATH`: measure the local device a write log will live on, and say what
//! layout it implies.
//!
//! Why: devices differ in exactly the ways a write log cares about (the Draconis
//! measurements, `004_*` in the papers): the page size below which a write costs a
//! read-modify-write (often 4 KiB), whether rewriting a preallocated file is cheaper
//! than appending to a growing one (appends make the filesystem write metadata), and
//! how many writes the device serves in parallel (8-16 on a datacenter SSD). lsvd's
//! write log today fixes these choices (one log write in flight, buffered I/O plus
//! fdatasync, a fixed record alignment); the layer above the device should measure
//! them instead of assuming. This module measures and decides; `lsvd serve` reads the
//! saved profile and uses the decisions the engine has settings for (log writes in
//! flight, group-commit cap), under flags and the config file ([`settings`]). It
//! probes briefly itself on a first start without a profile ([`first_start_probe`]).
//!
//! Pieces: [`measure`] does the timed I/O on a scratch file (the only code here that
//! touches the disk), this file holds the arguments and the decision rules (pure
//! functions of the measurements, unit-tested on synthetic numbers), [`profile`] the
//! saved profile (`<data>/probe-profile`, magic + version + CRC32C) and [`report`] the
//! table. `lsvd probe --store URL` is [`store`] (measurements and rules) and
//! [`store_profile`] (its saved profile); [`settings`] resolves what `serve` uses.
//!
//! # Decision rules
//!
//! * **Page size**: the smallest power-of-two write size `s` of the sweep such that no
//!   larger size completes more than 15% more writes per second than `s`. Without
//!   read-modify-write a larger write never takes less time than a smaller one, so
//!   operations per second do not rise with size; a smaller write that is slower than
//!   a larger one pays for reading and rewriting the rest of a page. (Offsets in the
//!   sweep are multiples of the write size, so a 4 KiB write is page-aligned.)
//! * **Log alignment unit**: the page size clamped to 512..4096 bytes.
//! * **Useful parallelism**: the smallest of the queue depths 1, 2, 4, ..., 64 from
//!   which IOPS stop growing by more than 10%: no deeper queue does more than 10% more
//!   IOPS (every deeper queue counts, so one noisy step does not end the search). **Log
//!   writes in flight**: that, clamped to 1..16.
//! * **Group-commit cap**: the smallest sequential write size (4 KiB .. 4 MiB, QD1)
//!   whose bandwidth is at least 90% of the best measured, clamped to 64 KiB..4 MiB:
//!   larger groups would add latency without adding bandwidth.
//! * **Direct log I/O**: yes if `O_DIRECT` works on this filesystem and a 4 KiB
//!   write + fdatasync with it has a median latency at most 10% above the buffered one.

#![expect(
    clippy::disallowed_methods,
    reason = "the probe measures real devices in real time"
)]

pub mod measure;
pub mod profile;
pub mod report;
pub mod settings;
pub mod store;
pub mod store_profile;

use std::path::{Path, PathBuf};

use clap::Args;
use serde::{Deserialize, Serialize};

use lsvd_core::error::{Error, Result};
use measure::{Budget, Measurements, QdPoint, Scratch, SeqPoint, SweepPoint};
pub use profile::{ProbeProfile, load_profile, save_profile};

/// Text of `lsvd probe --help` (above the options).
pub const LONG_ABOUT: &str = "Measure the local device a write log will live on and print the \
layout it implies (after the Draconis measurements: page size, rewrite vs append, parallelism).\n\n\
A scratch file (--file-size, default 256M) is created in PATH, written once, measured with \
O_DIRECT (buffered I/O if the filesystem refuses it; the report says so) and removed. Each test \
runs for --seconds-per-test (default 0.5 s), 33 tests in all, so a default run takes about 17 s \
plus the pre-write; --quick (0.1 s, 64M) takes about 6 s. What is measured:\n\
  1. write size sweep: random writes of 512 B .. 8 KiB (512 B steps) at QD1, each at an \
offset that is a multiple of its size: IOPS and MB/s;\n\
  2. 4 KiB write + fdatasync at QD1: rewriting the pre-written region, appending past its end \
(the file grows), and rewriting without O_DIRECT: median and p99 latency;\n\
  3. 4 KiB random writes at queue depth 1, 2, 4, ..., 64 (one thread per write in flight);\n\
  4. sequential writes of 4 KiB .. 4 MiB at QD1 (bandwidth);\n\
  5. 4 KiB random reads at QD1: median and p99 latency.\n\n\
Decisions:\n\
  page size           smallest power-of-two size from which no larger write is >15% faster in \
IOPS (below it the device reads, modifies and rewrites a page);\n\
  log alignment unit  the page size, clamped to 512..4096 bytes;\n\
  log writes in flight  smallest queue depth no deeper queue beats by >10% in IOPS, at \
most 16;\n\
  group-commit cap    smallest sequential write reaching 90% of the best bandwidth, \
64 KiB..4 MiB;\n\
  log I/O             direct if O_DIRECT works and its 4 KiB write + fdatasync is not >10% \
slower than buffered.\n\n\
The result is saved to <DATA>/probe-profile (--data; magic, version and CRC32C, see \
docs/format/probe-profile.md) unless --no-save. `lsvd serve` on that data directory uses \
its group-commit cap (a flag or the config file's [tuning] section wins; `lsvd info` \
shows what is in force and why); a profile measured under another directory is not \
used. The other three decisions are advice: log alignment is fixed at 512 B by the \
record format, and serve writes its log through the page cache with one write in \
flight, which measured faster in serve than O_DIRECT with 1, 4 or 8 in flight on the \
project's machine (docs/ARCHITECTURE.md, \"Why these choices\"). MB/s are 10^6 \
bytes per second. Killing the probe (Ctrl-C) leaves its scratch file, \
PATH/.lsvd-probe-*.tmp, behind: delete it.\n\n\
lsvd probe --store URL (no PATH) measures the object store instead, writing only under a \
scratch prefix .lsvd-probe-<time>-<pid>- that it deletes afterwards:\n\
  1. GET latency of ranges of 4 KiB .. 4 MiB (median, p99);\n\
  2. PUT bandwidth of objects of 1 .. 32 MiB, one at a time;\n\
  3. PUT bandwidth of 1, 2, 4, 8, 16 streams of the decided batch size.\n\
Each test runs --seconds-per-test (default 1 s, --quick 0.2 s); --max-object-size and \
--max-streams make it smaller. Decisions:\n\
  read fetch size     largest GET range at most 1.5x the latency of a small GET (the fastest \
median of 4..64 KiB, so one noisy size does not move the baseline), in whole \
64 KiB chunks, 64 KiB..1 MiB;\n\
  batch size          smallest object reaching 90% of the best one-stream PUT bandwidth, \
4..32 MiB;\n\
  uploads in flight   fewest streams no more streams beat by >10% in bandwidth, at most 16.\n\
Saved to <DATA>/store-profiles/<hash of URL> (magic LSVDSPR1, CRC32C) unless --no-save; \
`lsvd serve` with that store uses them under flags and the config file.";

#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Directory on the device to measure (e.g. the data directory). A scratch file is
    /// created in it and removed afterwards. Without PATH, --store URL is measured.
    pub path: Option<PathBuf>,
    /// Print the profile as one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Short run: 0.1 s per test and a 64 MiB scratch file (flags given explicitly win).
    #[arg(long)]
    pub quick: bool,
    /// Duration of each timed test [default: 0.5, --quick 0.1].
    #[arg(long, value_name = "SECONDS")]
    pub seconds_per_test: Option<f64>,
    /// Size of the scratch file, a multiple of 1M between 16M and 64G
    /// [default: 256M, --quick 64M].
    #[arg(long, value_name = "SIZE")]
    pub file_size: Option<String>,
    /// Do not save the profile to <DATA>/probe-profile (or <DATA>/store-profiles/).
    #[arg(long)]
    pub no_save: bool,
    /// Store probe only: largest object and GET range used [default: 32M; the GET
    /// test stops at 4M].
    #[arg(long, value_name = "SIZE")]
    pub max_object_size: Option<String>,
    /// Store probe only: most PUT streams [default: 16].
    #[arg(long, value_name = "N")]
    pub max_streams: Option<u32>,
}

const DEFAULT_SECONDS_PER_TEST: f64 = 0.5;
const QUICK_SECONDS_PER_TEST: f64 = 0.1;
const DEFAULT_FILE_SIZE_BYTES: u64 = 256 << 20;
const QUICK_FILE_SIZE_BYTES: u64 = 64 << 20;
const MIN_FILE_SIZE_BYTES: u64 = 16 << 20;
const MAX_FILE_SIZE_BYTES: u64 = 64 << 30;
const MAX_SECONDS_PER_TEST: f64 = 60.0;

/// A larger write size may be this much faster (ops/s) before the smaller one counts as
/// penalised.
pub const PAGE_TOLERANCE: f64 = 0.15;
/// A queue depth counts as useful if its IOPS beat the previous depth's by more.
pub const PARALLEL_GAIN: f64 = 0.10;
/// Sequential bandwidth counted as saturated.
pub const SEQ_SATURATION: f64 = 0.90;
/// Direct I/O may be this much slower (median write + fdatasync) and still be chosen.
pub const DIRECT_TOLERANCE: f64 = 0.10;
pub const MIN_ALIGN_BYTES: u32 = 512;
pub const MAX_ALIGN_BYTES: u32 = 4096;
pub const MAX_IN_FLIGHT: u32 = 16;
pub const MIN_GROUP_COMMIT_BYTES: u64 = 64 << 10;
/// Today's fixed group-commit cap (`EngineConfig::group_commit_max_bytes`).
pub const MAX_GROUP_COMMIT_BYTES: u64 = 4 << 20;

/// What the measurements imply for the write log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decisions {
    /// Inferred device page size (512..8192).
    pub page_size_bytes: u32,
    /// Alignment of log records: the page size clamped to 512..4096.
    pub log_align_bytes: u32,
    /// Smallest queue depth no deeper queue beats by more than 10% in 4 KiB write IOPS.
    pub useful_parallelism: u32,
    /// Log writes to keep in flight: the useful parallelism, 1..16.
    pub log_writes_in_flight: u32,
    /// Largest group commit worth making.
    pub group_commit_cap_bytes: u64,
    /// Whether the log should use `O_DIRECT`.
    pub direct_log_io: bool,
    /// Caveats (e.g. buffered fallback), a few lines at most.
    pub notes: Vec<String>,
}

/// Page size from the sweep (see the module documentation). None if no size was
/// accepted.
pub fn infer_page_size(sweep: &[SweepPoint]) -> Option<u32> {
    let measured: Vec<(u32, f64)> = sweep
        .iter()
        .filter_map(|p| p.rate.map(|r| (p.size_bytes, r.iops)))
        .collect();
    let mut candidates: Vec<(u32, f64)> = measured
        .iter()
        .copied()
        .filter(|(s, _)| s.is_power_of_two())
        .collect();
    candidates.sort_by_key(|(s, _)| *s);
    for &(size, iops) in &candidates {
        let best_larger = measured
            .iter()
            .filter(|(s, _)| *s > size)
            .map(|(_, i)| *i)
            .fold(0.0f64, f64::max);
        if best_larger <= iops * (1.0 + PAGE_TOLERANCE) {
            return Some(size);
        }
    }
    // Every power of two was beaten by something larger: the largest measured one.
    candidates.last().map(|(s, _)| *s)
}

/// Useful parallelism from the queue-depth test (see the module documentation): the
/// smallest queue depth that no deeper queue beats by more than 10% in IOPS. Looking at
/// every deeper queue, not only the next, keeps one noisy step from ending the search.
pub fn useful_parallelism(points: &[QdPoint]) -> u32 {
    let mut sorted: Vec<QdPoint> = points.to_vec();
    sorted.sort_by_key(|p| p.queue_depth);
    for (i, p) in sorted.iter().enumerate() {
        let best_deeper = sorted[i + 1..]
            .iter()
            .map(|q| q.rate.iops)
            .fold(0.0f64, f64::max);
        if best_deeper <= p.rate.iops * (1.0 + PARALLEL_GAIN) {
            return p.queue_depth.max(1);
        }
    }
    1
}

/// Group-commit cap from the sequential-write test (see the module documentation).
pub fn group_commit_cap(points: &[SeqPoint]) -> u64 {
    let peak = points
        .iter()
        .map(|p| p.rate.bytes_per_sec)
        .fold(0.0f64, f64::max);
    let mut sorted: Vec<SeqPoint> = points.to_vec();
    sorted.sort_by_key(|p| p.size_bytes);
    let size = sorted
        .iter()
        .find(|p| peak > 0.0 && p.rate.bytes_per_sec >= peak * SEQ_SATURATION)
        .map_or(MAX_GROUP_COMMIT_BYTES, |p| u64::from(p.size_bytes));
    size.clamp(MIN_GROUP_COMMIT_BYTES, MAX_GROUP_COMMIT_BYTES)
}

/// Every decision from the measurements; `direct` says whether they used `O_DIRECT`.
pub fn decide(m: &Measurements, direct: bool) -> Decisions {
    let mut notes = Vec::new();
    if !direct {
        notes.push(
            "O_DIRECT refused by this filesystem: measured through the page cache, so the \
             numbers describe memory more than the device"
                .to_string(),
        );
    }
    let page_size_bytes = infer_page_size(&m.write_sweep).unwrap_or_else(|| {
        notes.push("no write size was accepted: page size assumed 4096".to_string());
        MAX_ALIGN_BYTES
    });
    if m.write_sweep.iter().any(|p| p.rate.is_none()) {
        notes.push("some small write sizes were refused (logical block size)".to_string());
    }
    let log_align_bytes = page_size_bytes.clamp(MIN_ALIGN_BYTES, MAX_ALIGN_BYTES);
    let useful = useful_parallelism(&m.parallel_writes);
    let direct_log_io = direct
        && m.sync_rewrite.median_us <= m.sync_rewrite_buffered.median_us * (1.0 + DIRECT_TOLERANCE);
    if m.sync_append.median_us > m.sync_rewrite.median_us * 1.5 {
        notes.push(format!(
            "appending costs {:.1}x a rewrite (write + fdatasync): keep the log preallocated",
            m.sync_append.median_us / m.sync_rewrite.median_us.max(1e-9)
        ));
    }
    Decisions {
        page_size_bytes,
        log_align_bytes,
        useful_parallelism: useful,
        log_writes_in_flight: useful.clamp(1, MAX_IN_FLIGHT),
        group_commit_cap_bytes: group_commit_cap(&m.sequential_writes),
        direct_log_io,
        notes,
    }
}

/// The settings a command line asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Settings {
    seconds_per_test: f64,
    file_size_bytes: u64,
}

/// `--seconds-per-test`, or the default for `--quick` or not, checked.
fn seconds_per_test(args: &ProbeArgs, quick: f64, default: f64) -> Result<f64> {
    let s = args
        .seconds_per_test
        .unwrap_or(if args.quick { quick } else { default });
    if !(s > 0.0 && s <= MAX_SECONDS_PER_TEST) {
        return Err(Error::bad_input(format!(
            "--seconds-per-test must be more than 0 and at most {MAX_SECONDS_PER_TEST}"
        )));
    }
    Ok(s)
}

impl Settings {
    fn from_args(args: &ProbeArgs) -> Result<Settings> {
        let seconds_per_test =
            seconds_per_test(args, QUICK_SECONDS_PER_TEST, DEFAULT_SECONDS_PER_TEST)?;
        let file_size_bytes = match &args.file_size {
            Some(s) => lsvd_core::size::parse_size(s)?,
            None if args.quick => QUICK_FILE_SIZE_BYTES,
            None => DEFAULT_FILE_SIZE_BYTES,
        };
        if !(MIN_FILE_SIZE_BYTES..=MAX_FILE_SIZE_BYTES).contains(&file_size_bytes)
            || !file_size_bytes.is_multiple_of(1 << 20)
        {
            return Err(Error::bad_input(
                "--file-size must be a multiple of 1M between 16M and 64G",
            ));
        }
        Ok(Settings {
            seconds_per_test,
            file_size_bytes,
        })
    }
}

/// Number of timed tests, for the time estimate.
const TIMED_TESTS: usize = measure::SWEEP_SIZES_BYTES.len()
    + 3
    + measure::QUEUE_DEPTHS.len()
    + measure::SEQ_SIZES_BYTES.len()
    + 1;

/// Run `lsvd probe`; the profile is saved under `data_dir` (the global `--data`).
/// `store_url` is an explicitly given `--store` (flag or `LSVD_STORE`): measured when
/// there is no PATH.
pub fn run(common: &crate::config_file::Common, store_given: bool, args: ProbeArgs) -> Result<()> {
    let Some(dir) = args.path.clone() else {
        if !store_given {
            return Err(Error::bad_input(
                "probe: give a directory to measure the device (lsvd probe PATH) or \
                 --store URL to measure the object store",
            ));
        }
        return run_store(common, &args);
    };
    let settings = Settings::from_args(&args)?;
    let profile = probe_device(&dir, settings, !args.json)?;
    let saved = if args.no_save {
        None
    } else {
        Some(save_profile(&common.data, &profile)?)
    };
    if args.json {
        crate::json_out::print_json(&profile)?;
    } else {
        print!("{}", report::render(&profile, saved.as_deref()));
    }
    Ok(())
}

/// Seconds per test and scratch-file size of the probe `serve` runs on a first start
/// without a profile: 33 tests of 0.05 s, a 32 MiB file, a few seconds in all.
const FIRST_START_SECONDS_PER_TEST: f64 = 0.05;
const FIRST_START_FILE_SIZE_BYTES: u64 = 32 << 20;

/// The brief probe of `lsvd serve`'s first start: measures `data_dir`, saves the
/// profile there and returns it. Says what it does in one line on the terminal.
pub fn first_start_probe(data_dir: &Path) -> Result<ProbeProfile> {
    let settings = Settings {
        seconds_per_test: FIRST_START_SECONDS_PER_TEST,
        file_size_bytes: FIRST_START_FILE_SIZE_BYTES,
    };
    std::fs::create_dir_all(data_dir).map_err(|e| {
        Error::local_io(
            format!("cannot create data directory {}", data_dir.display()),
            e,
        )
    })?;
    eprintln!(
        "lsvd: no probe profile in {}: measuring the disk for about {:.0} s (lsvd probe; \
         --no-probe skips this)",
        data_dir.display(),
        settings.seconds_per_test * TIMED_TESTS as f64 + 1.0
    );
    let profile = probe_device(data_dir, settings, false)?;
    save_profile(data_dir, &profile)?;
    Ok(profile)
}

/// Measure the device under `dir` and decide; `say` prints what is being done.
fn probe_device(dir: &Path, settings: Settings, say: bool) -> Result<ProbeProfile> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Error::bad_input(format!(
                "probe: {} is not a directory",
                dir.display()
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::bad_input(format!(
                "probe: {} does not exist",
                dir.display()
            )));
        }
        Err(e) => return Err(Error::local_io(format!("probe: {}", dir.display()), e)),
    }
    let shown_path = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    if say {
        eprintln!(
            "probing {} with a {} scratch file, {} tests of {} s (about {:.0} s plus the pre-write)...",
            shown_path.display(),
            lsvd_core::size::format_size(settings.file_size_bytes),
            TIMED_TESTS,
            settings.seconds_per_test,
            settings.seconds_per_test * TIMED_TESTS as f64
        );
    }
    let (scratch, prewrite_bytes_per_sec) = Scratch::create(dir, settings.file_size_bytes)?;
    let budget = Budget {
        seconds_per_test: settings.seconds_per_test,
    };
    let measured = measure::measure_all(&scratch, budget, prewrite_bytes_per_sec);
    let direct = scratch.direct;
    drop(scratch); // removes the scratch file, also when a measurement failed
    let measurements = measured?;
    let decisions = decide(&measurements, direct);
    Ok(ProbeProfile {
        lsvd_version: env!("CARGO_PKG_VERSION").to_string(),
        created_unix_secs: now_unix_secs(),
        path: shown_path.display().to_string(),
        direct,
        file_size_bytes: settings.file_size_bytes,
        seconds_per_test: settings.seconds_per_test,
        measurements,
        decisions,
    })
}

fn now_unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

const STORE_SECONDS_PER_TEST: f64 = 1.0;
const STORE_QUICK_SECONDS_PER_TEST: f64 = 0.2;
const STORE_MAX_OBJECT_BYTES: u64 = 32 << 20;
const STORE_MIN_OBJECT_BYTES: u64 = 4 << 10;

/// The store probe's budget from the flags.
fn store_budget(args: &ProbeArgs) -> Result<store::StoreBudget> {
    if args.file_size.is_some() {
        return Err(Error::bad_input(
            "--file-size applies to the device probe (lsvd probe PATH), not --store",
        ));
    }
    let seconds_per_test =
        seconds_per_test(args, STORE_QUICK_SECONDS_PER_TEST, STORE_SECONDS_PER_TEST)?;
    let max_object_bytes = match &args.max_object_size {
        Some(s) => lsvd_core::size::parse_size(s)?,
        None => STORE_MAX_OBJECT_BYTES,
    };
    if !(STORE_MIN_OBJECT_BYTES..=STORE_MAX_OBJECT_BYTES).contains(&max_object_bytes) {
        return Err(Error::bad_input(
            "--max-object-size must be between 4K and 32M",
        ));
    }
    let max_streams = args.max_streams.unwrap_or(store::MAX_UPLOADS);
    if !(1..=store::MAX_UPLOADS).contains(&max_streams) {
        return Err(Error::bad_input("--max-streams must be between 1 and 16"));
    }
    Ok(store::StoreBudget {
        seconds_per_test,
        max_object_bytes,
        max_streams,
    })
}

/// `lsvd probe --store URL`.
fn run_store(common: &crate::config_file::Common, args: &ProbeArgs) -> Result<()> {
    let budget = store_budget(args)?;
    let url = common.store_url();
    let store = common.open_store()?;
    let prefix = store::scratch_prefix();
    if !args.json {
        eprintln!(
            "probing {} under {prefix} (removed afterwards): GETs of 4K..{}, PUTs of 1M..{} \
             with 1..{} streams, {} s per test...",
            store.describe(),
            lsvd_core::size::format_size(budget.max_object_bytes.min(4 << 20)),
            lsvd_core::size::format_size(budget.max_object_bytes),
            budget.max_streams,
            budget.seconds_per_test
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::local_io("cannot start runtime", e))?;
    let measurements = runtime.block_on(store::measure_store(&store, &prefix, budget))?;
    let decisions = store::decide(&measurements, args.quick);
    let profile = store_profile::StoreProfile {
        lsvd_version: env!("CARGO_PKG_VERSION").to_string(),
        created_unix_secs: now_unix_secs(),
        store_url: url,
        quick: args.quick,
        measurements,
        decisions,
    };
    let saved = if args.no_save {
        None
    } else {
        Some(store_profile::save_store_profile(&common.data, &profile)?)
    };
    if args.json {
        crate::json_out::print_json(&profile)?;
    } else {
        print!("{}", report::render_store(&profile, saved.as_deref()));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::measure::{Latency, Rate};
    use super::*;

    fn rate(iops: f64, size: u32) -> Rate {
        Rate {
            iops,
            bytes_per_sec: iops * f64::from(size),
        }
    }

    fn sweep(f: impl Fn(u32) -> Option<f64>) -> Vec<SweepPoint> {
        measure::SWEEP_SIZES_BYTES
            .iter()
            .map(|&s| SweepPoint {
                size_bytes: s,
                rate: f(s).map(|i| rate(i, s)),
            })
            .collect()
    }

    fn lat(median_us: f64) -> Latency {
        Latency {
            samples: 100,
            median_us,
            p99_us: median_us * 3.0,
        }
    }

    fn qd(iops: &[f64]) -> Vec<QdPoint> {
        measure::QUEUE_DEPTHS
            .iter()
            .zip(iops)
            .map(|(&q, &i)| QdPoint {
                queue_depth: q,
                rate: rate(i, 4096),
            })
            .collect()
    }

    fn seq(mb_per_sec: &[f64]) -> Vec<SeqPoint> {
        measure::SEQ_SIZES_BYTES
            .iter()
            .zip(mb_per_sec)
            .map(|(&s, &mbs)| SeqPoint {
                size_bytes: s,
                rate: Rate {
                    iops: mbs * 1e6 / f64::from(s),
                    bytes_per_sec: mbs * 1e6,
                },
            })
            .collect()
    }

    /// A device with a 4 KiB page: writes that are not whole pages cost 4x.
    fn rmw_4k(size: u32) -> Option<f64> {
        let base = 20_000.0 - f64::from(size);
        Some(if size.is_multiple_of(4096) {
            base
        } else {
            base / 4.0
        })
    }

    pub(crate) fn sample_measurements() -> Measurements {
        Measurements {
            prewrite_bytes_per_sec: 1.5e9,
            write_sweep: sweep(rmw_4k),
            sync_rewrite: lat(40.0),
            sync_append: lat(400.0),
            sync_rewrite_buffered: lat(55.0),
            parallel_writes: qd(&[10e3, 19e3, 37e3, 70e3, 90e3, 95e3, 96e3]),
            sequential_writes: seq(&[40.0, 150.0, 600.0, 1500.0, 1900.0, 2000.0]),
            random_read: lat(80.0),
        }
    }

    pub(crate) fn sample_profile() -> ProbeProfile {
        let m = sample_measurements();
        ProbeProfile {
            lsvd_version: "0.1.0".into(),
            created_unix_secs: 1_700_000_000,
            path: "/data".into(),
            direct: true,
            file_size_bytes: 256 << 20,
            seconds_per_test: 0.5,
            decisions: decide(&m, true),
            measurements: m,
        }
    }

    #[test]
    fn page_size_with_penalty_below_4k() {
        assert_eq!(infer_page_size(&sweep(rmw_4k)), Some(4096));
        // An 8 KiB page: everything below and between is read-modify-written.
        let rmw_8k = |s: u32| Some(if s == 8192 { 9000.0 } else { 2000.0 });
        assert_eq!(infer_page_size(&sweep(rmw_8k)), Some(8192));
        // A 2 KiB page.
        let rmw_2k = |s: u32| {
            Some(if s.is_multiple_of(2048) {
                20_000.0 - f64::from(s)
            } else {
                5000.0
            })
        };
        assert_eq!(infer_page_size(&sweep(rmw_2k)), Some(2048));
    }

    #[test]
    fn page_size_of_a_flat_curve_is_512() {
        // IOPS fall slowly with size (bandwidth grows): no penalty anywhere.
        let flat = |s: u32| Some(30_000.0 - f64::from(s));
        assert_eq!(infer_page_size(&sweep(flat)), Some(512));
        // Noise within the tolerance does not move it.
        let noisy = |s: u32| Some(if s == 4096 { 31_000.0 } else { 29_000.0 });
        assert_eq!(infer_page_size(&sweep(noisy)), Some(512));
    }

    #[test]
    fn page_size_skips_refused_sizes() {
        // Logical block 4096: O_DIRECT refuses smaller writes.
        let lb4k = |s: u32| (s >= 4096).then(|| 20_000.0 - f64::from(s));
        assert_eq!(infer_page_size(&sweep(lb4k)), Some(4096));
        assert_eq!(infer_page_size(&sweep(|_| None)), None);
    }

    #[test]
    fn parallelism_plateau() {
        assert_eq!(
            useful_parallelism(&qd(&[10e3, 19e3, 37e3, 70e3, 90e3, 95e3, 96e3])),
            16
        );
        // No gain from more writers: 1.
        assert_eq!(
            useful_parallelism(&qd(&[10e3, 10.5e3, 10.2e3, 10.8e3, 9e3, 9e3, 9e3])),
            1
        );
        // A stall at QD2 does not end the search: the gain comes at 4.
        assert_eq!(
            useful_parallelism(&qd(&[10e3, 10.5e3, 30e3, 30e3, 30e3, 30e3, 30e3])),
            4
        );
        // Still growing at 64.
        assert_eq!(
            useful_parallelism(&qd(&[1e3, 2e3, 4e3, 8e3, 16e3, 32e3, 64e3])),
            64
        );
        // Exactly 10% is not "more than 10%".
        assert_eq!(useful_parallelism(&qd(&[100.0, 110.0, 105.0])), 1);
        assert_eq!(useful_parallelism(&qd(&[100.0, 111.0, 105.0])), 2);
        assert_eq!(useful_parallelism(&[]), 1);
    }

    #[test]
    fn group_commit_cap_rule_and_clamps() {
        assert_eq!(
            group_commit_cap(&seq(&[40.0, 150.0, 600.0, 1500.0, 1900.0, 2000.0])),
            1 << 20
        );
        // Saturated already at 4 KiB: clamped up to 64 KiB.
        assert_eq!(
            group_commit_cap(&seq(&[100.0, 100.0, 100.0, 100.0, 100.0, 100.0])),
            64 << 10
        );
        // Only the largest size saturates: 4 MiB.
        assert_eq!(
            group_commit_cap(&seq(&[1.0, 2.0, 3.0, 4.0, 5.0, 100.0])),
            4 << 20
        );
        assert_eq!(group_commit_cap(&[]), 4 << 20);
    }

    #[test]
    fn decisions_clamp_and_choose() {
        let mut m = sample_measurements();
        let d = decide(&m, true);
        assert_eq!(d.page_size_bytes, 4096);
        assert_eq!(d.log_align_bytes, 4096);
        assert_eq!(d.useful_parallelism, 16);
        assert_eq!(d.log_writes_in_flight, 16);
        assert_eq!(d.group_commit_cap_bytes, 1 << 20);
        assert!(d.direct_log_io);
        assert!(d.notes.iter().any(|n| n.contains("appending")));

        // An 8 KiB page is clamped to 4096; 64-way parallelism to 16.
        m.write_sweep = sweep(|s| Some(if s == 8192 { 9000.0 } else { 2000.0 }));
        m.parallel_writes = qd(&[1e3, 2e3, 4e3, 8e3, 16e3, 32e3, 64e3]);
        let d = decide(&m, true);
        assert_eq!((d.page_size_bytes, d.log_align_bytes), (8192, 4096));
        assert_eq!((d.useful_parallelism, d.log_writes_in_flight), (64, 16));

        // A flat sweep gives 512; direct I/O 20% slower than buffered is not chosen.
        m.write_sweep = sweep(|s| Some(30_000.0 - f64::from(s)));
        m.sync_rewrite = lat(66.0);
        let d = decide(&m, true);
        assert_eq!(d.log_align_bytes, 512);
        assert!(!d.direct_log_io);

        // Without O_DIRECT, never direct, and the report says why.
        m.sync_rewrite = lat(10.0);
        let d = decide(&m, false);
        assert!(!d.direct_log_io);
        assert!(d.notes.iter().any(|n| n.contains("O_DIRECT refused")));
    }

    #[test]
    fn settings_from_flags() {
        let args = |quick: bool, secs: Option<f64>, size: Option<&str>| ProbeArgs {
            path: Some(PathBuf::from("/x")),
            max_object_size: None,
            max_streams: None,
            json: false,
            quick,
            seconds_per_test: secs,
            file_size: size.map(str::to_string),
            no_save: false,
        };
        let s = Settings::from_args(&args(false, None, None)).expect("defaults");
        assert_eq!((s.seconds_per_test, s.file_size_bytes), (0.5, 256 << 20));
        let s = Settings::from_args(&args(true, None, None)).expect("quick");
        assert_eq!((s.seconds_per_test, s.file_size_bytes), (0.1, 64 << 20));
        let s = Settings::from_args(&args(true, Some(0.05), Some("16M"))).expect("explicit");
        assert_eq!((s.seconds_per_test, s.file_size_bytes), (0.05, 16 << 20));
        for (secs, size) in [
            (Some(0.0), None),
            (Some(-1.0), None),
            (Some(f64::NAN), None),
            (Some(61.0), None),
            (None, Some("8M")),
            (None, Some("17000K")),
            (None, Some("16M1")),
            (None, Some("65G")),
        ] {
            let e = Settings::from_args(&args(false, secs, size)).expect_err("invalid");
            assert_eq!(
                e.kind,
                lsvd_core::error::ErrorKind::BadInput,
                "{secs:?} {size:?}"
            );
        }
    }
}
