//! `lsvd replay`: drive a block trace through a running NBD export.
//!
//! Requests are issued in trace order with up to `--queue-depth` in flight, as fast as
//! the server answers (or at the trace's own pace with `--timed`). Offsets beyond the
//! export are folded into it (modulo the export size, aligned), unaligned requests are
//! rounded out to 512-byte sectors, and long requests are split. Written data is a
//! deterministic pattern of the absolute byte offset, so every byte of the export is
//! either that pattern or zero and `--verify` can check every read. With `--metrics
//! URL` (a running `lsvd serve --metrics`), the read-cache hits and misses during the
//! replay are reported.
//!
//! `--precondition` first writes every range the trace will read and waits until the
//! server has uploaded it (its `lsvd_log_used_bytes` gauge for the export's volume
//! reaches 0): a FLUSH only makes data durable in the write log, and the open batch
//! goes up only when it is full or `--batch-timeout-ms` has passed, so only the gauge
//! says when reads stop being served from the log. Uploading does not fill the read
//! cache, so each preconditioned chunk's first read in the replay is a miss.

#![expect(
    clippy::disallowed_methods,
    reason = "a live replay issues a trace to a real server in real time"
)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;

mod precondition;
mod scrape;

use lsvd_nbd::client::{Client, Target};

use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_trace::{Format, FormatChoice, Op, Request, TraceReader};
use precondition::{RangeSet, wait_uploaded, write_ranges};
use scrape::{cache_counts, export_volume, scrape};

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The trace file (.gz and .bz2 are read directly).
    pub trace: PathBuf,
    /// Trace format: msr, msr-cut, spc, cloudphysics, vscsi, tencent, systor, disksim, auto.
    #[arg(long, default_value = "auto")]
    pub format: String,
    /// Units of offsets and sizes for the 5-column `time device offset size type`
    /// formats: bytes (msr-cut's default) or sectors (512-byte; disksim's default).
    /// Other formats fix their units.
    #[arg(long, value_name = "bytes|sectors")]
    pub units: Option<String>,
    /// NBD URI of the export: nbd://HOST:PORT/EXPORT or nbd+unix:///EXPORT?socket=PATH.
    #[arg(long)]
    pub export: String,
    /// Replay only this volume of a multi-volume trace (by name or number).
    #[arg(long)]
    pub volume: Option<String>,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 32)]
    pub queue_depth: usize,
    /// Stop after this many requests.
    #[arg(long)]
    pub max_requests: Option<u64>,
    /// Keep the trace's timing (sleep until each request's timestamp).
    #[arg(long)]
    pub timed: bool,
    /// Prometheus URL of the serving lsvd (http://HOST:PORT/metrics) to report
    /// read-cache hits and misses during the replay (of the export's volume when the
    /// server serves several).
    #[arg(long)]
    pub metrics: Option<String>,
    /// Before the replay, write every range the trace will read, and wait until the
    /// server has uploaded it, so the replay's reads go through the read cache.
    ///
    /// A trace that starts from an empty volume mostly reads blocks it never wrote
    /// (holes: answered without any read, no cache lookup) or blocks still in the
    /// write log (served from the log, no lookup), so its hit rate says little. With
    /// --precondition the read ranges (folded and rounded like the replay's requests,
    /// merged) are written in sequential writes of up to 4 MiB with the replay's data
    /// pattern, then replay polls --metrics until lsvd_log_used_bytes and
    /// lsvd_uploads_pending of the export's volume are 0 (a FLUSH is not enough: the
    /// open batch is uploaded only when full or after --batch-timeout-ms). Uploading
    /// does not fill the read cache, so a range's first read is a miss, later ones can
    /// hit. The hit/miss counts cover the replay only. Needs --metrics. Like the
    /// replay's own writes, it overwrites what the export held in those ranges.
    #[arg(long)]
    pub precondition: bool,
    /// How long --precondition waits for its data to leave the write log.
    #[arg(long, default_value_t = 600, value_name = "SECS")]
    pub precondition_timeout: u64,
    /// Check every read against the replay's data pattern: each sector must hold the
    /// pattern (written by this replay, a --precondition or an earlier replay) or
    /// zeros (never written, or trimmed). Reports bytes of each; anything else fails
    /// the run. Costs CPU on the client.
    #[arg(long)]
    pub verify: bool,
    /// Print results as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct ReplayReport {
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    pub trims: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub folded: u64,
    pub errors: u64,
    pub elapsed_secs: f64,
    pub iops: f64,
    /// Read-cache chunk (64 KiB) hits and misses during the replay (not the
    /// precondition), from `--metrics`.
    pub read_cache_hits: Option<f64>,
    pub read_cache_misses: Option<f64>,
    pub read_cache_hit_rate: Option<f64>,
    pub bad_trace_lines: u64,
    /// With `--precondition`: what was written before the replay.
    pub precondition: Option<PreconditionReport>,
    /// With `--verify`: bytes read that held the data pattern, zeros, or anything else.
    pub verified_pattern_bytes: Option<u64>,
    pub verified_zero_bytes: Option<u64>,
    pub verify_mismatch_bytes: Option<u64>,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct PreconditionReport {
    /// Merged byte ranges the trace reads.
    pub ranges: u64,
    /// Bytes written (the sum of the ranges).
    pub bytes: u64,
    /// Writing them, through the final FLUSH.
    pub write_secs: f64,
    /// Then waiting until the server had uploaded them and released the write log.
    pub upload_wait_secs: f64,
    /// Both.
    pub secs: f64,
}

const MAX_PIECE_BYTES: u64 = 4 << 20;

/// `[start, end)` as (offset, length) pieces of at most [`MAX_PIECE_BYTES`].
/// A place among the requests in flight (`slots` bounds them); held until dropped.
async fn take_slot(
    slots: &Arc<tokio::sync::Semaphore>,
) -> Result<tokio::sync::OwnedSemaphorePermit> {
    slots
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| Error::with_source(ErrorKind::ShuttingDown, "", e))
}

fn pieces(start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> {
    (start..end)
        .step_by(MAX_PIECE_BYTES as usize)
        .map(move |at| (at, (end - at).min(MAX_PIECE_BYTES)))
}
const SECTOR: u64 = 512;

fn pattern(offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for (i, chunk) in v.chunks_mut(8).enumerate() {
        let word = (offset + 8 * i as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    v
}

/// One trace request as the replay issues it: rounded out to sectors and folded into
/// the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shaped {
    op: Op,
    offset: u64,
    len: u64,
    time_ns: u64,
    folded: bool,
}

fn shape(req: &Request, size: u64) -> Shaped {
    let first = req.offset_bytes / SECTOR * SECTOR;
    let end = req
        .offset_bytes
        .saturating_add(req.length_bytes)
        .div_ceil(SECTOR)
        * SECTOR;
    let mut len = (end - first).min(size);
    let mut off = first;
    let folded = off + len > size;
    if folded {
        off = (off % size) / SECTOR * SECTOR;
        len = len.min(size - off);
    }
    Shaped {
        op: req.op,
        offset: off,
        len,
        time_ns: req.time_ns,
        folded,
    }
}

/// The requests of a trace the replay issues, in order: `--volume` and
/// `--max-requests` applied, each shaped by [`shape`]. The precondition reads the
/// trace through the same filter, so it writes exactly what the replay will read.
struct Requests {
    reader: TraceReader,
    size: u64,
    volume: Option<String>,
    volume_id: Option<u32>,
    max_requests: Option<u64>,
    taken: u64,
}

impl Requests {
    fn open(args: &ReplayArgs, format: Format, size: u64) -> Result<Requests> {
        let in_trace = |e: lsvd_trace::Error| Error::from(e).context(args.trace.display());
        let mut reader = TraceReader::open(&args.trace, format).map_err(in_trace)?;
        if let Some(units) = lsvd_sim::parse_units(args.units.as_deref())? {
            reader = reader.units(units).map_err(in_trace)?;
        }
        Ok(Requests {
            reader,
            size,
            volume: args.volume.clone(),
            volume_id: None,
            max_requests: args.max_requests,
            taken: 0,
        })
    }

    fn next_shaped(&mut self) -> Option<Shaped> {
        loop {
            if self.max_requests.is_some_and(|max| self.taken >= max) {
                return None;
            }
            let req = self.reader.next()?;
            if let Some(want) = &self.volume {
                if self.volume_id.is_none() {
                    let name = self.reader.volume_name(req.volume);
                    if want == name || want.parse::<u32>().ok() == Some(req.volume) {
                        self.volume_id = Some(req.volume);
                    }
                }
                if self.volume_id != Some(req.volume) {
                    continue;
                }
            }
            self.taken += 1;
            return Some(shape(&req, self.size));
        }
    }

    fn bad_lines(&self) -> u64 {
        self.reader.stats().bad_lines
    }

    /// One line if the trace looks like it is in the other unit.
    fn units_warning(&self) -> Option<String> {
        self.reader.units_warning()
    }
}

fn export_name(target: &Target) -> &str {
    match target {
        Target::Tcp { export, .. } | Target::Unix { export, .. } => export,
    }
}

/// Counts of verified read bytes.
#[derive(Debug, Default)]
struct Verify {
    pattern: AtomicU64,
    zero: AtomicU64,
    mismatch: AtomicU64,
    first_mismatch: AtomicU64,
}

impl Verify {
    fn new() -> Verify {
        Verify {
            first_mismatch: AtomicU64::new(u64::MAX),
            ..Verify::default()
        }
    }

    /// Classify each sector of `data`, read at byte `offset` (`expected_len` asked).
    fn check(&self, offset: u64, expected_len: usize, data: &[u8]) {
        let want = pattern(offset, data.len());
        for (i, (got, exp)) in data
            .chunks(SECTOR as usize)
            .zip(want.chunks(SECTOR as usize))
            .enumerate()
        {
            let n = got.len() as u64;
            if got == exp {
                self.pattern.fetch_add(n, Ordering::Relaxed);
            } else if got.iter().all(|&b| b == 0) {
                self.zero.fetch_add(n, Ordering::Relaxed);
            } else {
                self.mismatch.fetch_add(n, Ordering::Relaxed);
                self.first_mismatch
                    .fetch_min(offset + i as u64 * SECTOR, Ordering::Relaxed);
            }
        }
        if data.len() < expected_len {
            self.mismatch
                .fetch_add((expected_len - data.len()) as u64, Ordering::Relaxed);
            self.first_mismatch
                .fetch_min(offset + data.len() as u64, Ordering::Relaxed);
        }
    }
}

/// Replay the trace. A bad option or trace is `BadInput`; an export that cannot be
/// reached is `Transient`, one that fails requests `Permanent`; `--verify` finding
/// foreign data is `Corrupt`.
pub async fn run(args: ReplayArgs) -> Result<()> {
    if args.precondition && args.metrics.is_none() {
        return Err(Error::bad_input(
            "--precondition needs --metrics http://HOST:PORT/metrics of the serving lsvd (lsvd serve --metrics HOST:PORT): it waits there until the written data has left the write log",
        ));
    }
    let choice: FormatChoice = args
        .format
        .parse()
        .map_err(|e| Error::from(e).context("--format"))?;
    let format = choice.resolve(&args.trace)?;
    // A bad --units fails before connecting (the reader checks it again).
    if lsvd_sim::parse_units(args.units.as_deref())?.is_some()
        && lsvd_trace::Units::default_for(format).is_none()
    {
        return Err(Error::bad_input(format!(
            "--units applies to msr-cut and disksim traces only; {format} traces fix their own units"
        )));
    }
    let target = Target::parse(&args.export).map_err(Error::bad_input)?;
    let client = Arc::new(Client::connect(&target).await.map_err(|e| {
        Error::with_source(
            ErrorKind::Transient,
            format!("cannot connect to {}", args.export),
            e,
        )
    })?);
    let size = client.size_bytes();
    if size < 4096 {
        return Err(Error::bad_input("export is too small"));
    }
    let mut requests = Requests::open(&args, format, size)?;
    let mut report = ReplayReport::default();
    // Which volume's counters to read: the export's, or all of them if the metrics
    // do not say which is the export.
    let volume = match &args.metrics {
        Some(u) => export_volume(&scrape(u).await?, export_name(&target)),
        None => None,
    };
    if let Some(url) = args.metrics.as_deref().filter(|_| args.precondition) {
        let Some(volume) = volume.as_deref() else {
            return Err(Error::bad_input(format!(
                "--precondition: cannot tell which volume in {url} is export {:?}; name the export after its volume",
                export_name(&target)
            )));
        };
        let start = Instant::now();
        let mut ranges = RangeSet::default();
        let mut pass = Requests::open(&args, format, size)?;
        while let Some(r) = pass.next_shaped() {
            if r.op == Op::Read {
                ranges.insert(r.offset, r.offset + r.len);
            }
        }
        write_ranges(&client, &ranges).await?;
        let write_secs = start.elapsed().as_secs_f64();
        wait_uploaded(url, volume, Duration::from_secs(args.precondition_timeout)).await?;
        let secs = start.elapsed().as_secs_f64();
        report.precondition = Some(PreconditionReport {
            ranges: ranges.len() as u64,
            bytes: ranges.bytes(),
            write_secs,
            upload_wait_secs: secs - write_secs,
            secs,
        });
    }
    // Counters from here on: the precondition's uploads are not counted.
    let before = match &args.metrics {
        Some(u) => Some(cache_counts(&scrape(u).await?, volume.as_deref())),
        None => None,
    };
    let verify = args.verify.then(|| Arc::new(Verify::new()));
    let qd = args.queue_depth.clamp(1, 1024);
    let slots = Arc::new(tokio::sync::Semaphore::new(qd));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(req) = requests.next_shaped() {
        if args.timed {
            let due = Duration::from_nanos(req.time_ns);
            let now = start.elapsed();
            if due > now {
                tokio::time::sleep(due - now).await;
            }
        }
        report.folded += u64::from(req.folded);
        report.requests += 1;
        match req.op {
            Op::Read => {
                report.reads += 1;
                report.read_bytes += req.len;
            }
            Op::Write => {
                report.writes += 1;
                report.write_bytes += req.len;
            }
            Op::Trim => report.trims += 1,
        }
        for (at, n) in pieces(req.offset, req.offset + req.len) {
            let permit = take_slot(&slots).await?;
            let c = client.clone();
            let errs = errors.clone();
            let verify = verify.clone();
            let op = req.op;
            tasks.spawn(async move {
                let r = match op {
                    Op::Read => c.read(at, n as u32).await.map(|data| {
                        if let Some(v) = &verify {
                            v.check(at, n as usize, &data);
                        }
                    }),
                    Op::Write => c.write(at, &pattern(at, n as usize), false).await,
                    Op::Trim => c.trim(at, n as u32).await,
                };
                if r.is_err() {
                    errs.fetch_add(1, Ordering::Relaxed);
                }
                drop(permit);
            });
            while tasks.try_join_next().is_some() {}
        }
    }
    while tasks.join_next().await.is_some() {}
    client
        .flush()
        .await
        .map_err(|e| Error::with_source(ErrorKind::Permanent, "final flush", e))?;
    report.elapsed_secs = start.elapsed().as_secs_f64();
    report.iops = report.requests as f64 / report.elapsed_secs.max(1e-9);
    report.errors = errors.load(Ordering::Relaxed);
    report.bad_trace_lines = requests.bad_lines();
    if let Some(w) = requests.units_warning() {
        eprintln!("lsvd: warning: {}: {w}", args.trace.display());
    }
    if let (Some(b), Some(u)) = (before, &args.metrics) {
        let a = cache_counts(&scrape(u).await?, volume.as_deref());
        let hits = a.0 - b.0;
        let misses = a.1 - b.1;
        report.read_cache_hits = Some(hits);
        report.read_cache_misses = Some(misses);
        report.read_cache_hit_rate = Some(if hits + misses > 0.0 {
            hits / (hits + misses)
        } else {
            0.0
        });
    }
    if let Some(v) = &verify {
        report.verified_pattern_bytes = Some(v.pattern.load(Ordering::Relaxed));
        report.verified_zero_bytes = Some(v.zero.load(Ordering::Relaxed));
        report.verify_mismatch_bytes = Some(v.mismatch.load(Ordering::Relaxed));
    }
    print_report(&report, args.json)?;
    if report.errors > 0 {
        return Err(Error::new(
            ErrorKind::Permanent,
            format!("{} requests failed", report.errors),
        ));
    }
    if let Some(v) = &verify
        && v.mismatch.load(Ordering::Relaxed) > 0
    {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "--verify: {} bytes read held neither the replay's pattern nor zeros (first at byte {}): the export holds data this replay did not write, or returned wrong data",
                v.mismatch.load(Ordering::Relaxed),
                v.first_mismatch.load(Ordering::Relaxed)
            ),
        ));
    }
    Ok(())
}

fn print_report(report: &ReplayReport, json: bool) -> Result<()> {
    if json {
        return crate::json_out::print_json(report);
    }
    if let Some(p) = &report.precondition {
        println!(
            "precondition: wrote {} MiB in {} ranges in {:.2}s, then waited {:.2}s for the upload ({:.2}s)",
            p.bytes >> 20,
            p.ranges,
            p.write_secs,
            p.upload_wait_secs,
            p.secs
        );
    }
    println!(
        "replayed {} requests ({} reads, {} writes, {} trims) in {:.2}s: {:.0} IOPS; {} MiB read, {} MiB written; {} folded into the export; {} errors",
        report.requests,
        report.reads,
        report.writes,
        report.trims,
        report.elapsed_secs,
        report.iops,
        report.read_bytes >> 20,
        report.write_bytes >> 20,
        report.folded,
        report.errors
    );
    if let Some(rate) = report.read_cache_hit_rate {
        println!(
            "read cache: {:.0} hits, {:.0} misses (64 KiB chunks): hit rate {:.1}%",
            report.read_cache_hits.unwrap_or(0.0),
            report.read_cache_misses.unwrap_or(0.0),
            rate * 100.0
        );
    }
    if let (Some(p), Some(z), Some(m)) = (
        report.verified_pattern_bytes,
        report.verified_zero_bytes,
        report.verify_mismatch_bytes,
    ) {
        println!("verify: {p} bytes read held the pattern, {z} zeros, {m} neither");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_split_into_pieces_of_at_most_four_mib() {
        const M: u64 = MAX_PIECE_BYTES;
        assert_eq!(pieces(7, 7).count(), 0);
        assert_eq!(pieces(512, 4608).collect::<Vec<_>>(), vec![(512, 4096)]);
        assert_eq!(pieces(0, 2 * M).collect::<Vec<_>>(), vec![(0, M), (M, M)]);
        assert_eq!(
            pieces(4096, 4096 + 2 * M + 512).collect::<Vec<_>>(),
            vec![(4096, M), (4096 + M, M), (4096 + 2 * M, 512)]
        );
    }

    #[test]
    fn requests_are_rounded_and_folded_like_the_replay() {
        let req = |offset_bytes, length_bytes| Request {
            time_ns: 0,
            volume: 0,
            op: Op::Read,
            offset_bytes,
            length_bytes,
        };
        let size = 1 << 20;
        let s = shape(&req(1000, 100), size);
        assert_eq!((s.offset, s.len, s.folded), (512, 1024, false));
        // Past the end: folded modulo the size, aligned, clipped at the end.
        let s = shape(&req(size + 4096 + 10, 4096), size);
        assert_eq!((s.offset, s.len, s.folded), (4096, 4608, true));
        // Crossing the end: counted as folded, clipped at the end (not wrapped).
        let s = shape(&req(size - 512, 4096), size);
        assert_eq!((s.offset, s.len, s.folded), (size - 512, 512, true));
    }

    #[test]
    fn verify_tells_pattern_zeros_and_other_data_apart() {
        let v = Verify::new();
        let mut data = pattern(4096, 2048);
        data[512..1024].fill(0);
        data[1500] ^= 1;
        v.check(4096, 2560, &data);
        assert_eq!(v.pattern.load(Ordering::Relaxed), 1024);
        assert_eq!(v.zero.load(Ordering::Relaxed), 512);
        assert_eq!(v.mismatch.load(Ordering::Relaxed), 512 + 512);
        assert_eq!(v.first_mismatch.load(Ordering::Relaxed), 4096 + 1024);
        // The pattern depends on the absolute offset only, not on how writes split it.
        let mut joined = pattern(0, 4096);
        joined.extend(pattern(4096, 4096));
        assert_eq!(joined, pattern(0, 8192));
    }
}
