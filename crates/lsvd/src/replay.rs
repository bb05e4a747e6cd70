//! `lsvd replay`: drive a block trace through a running NBD export.
//!
//! Requests are issued in trace order with up to `--queue-depth` in flight, as fast as
//! the server answers (or at the trace's own pace with `--timed`). Offsets beyond the
//! export are folded into it (modulo the export size, aligned), unaligned requests are
//! rounded out to 512-byte sectors, and long requests are split. Written data is a
//! deterministic pattern. With `--metrics URL` (a running `lsvd serve --metrics`), the
//! read-cache hits and misses during the replay are reported.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use lsvd_nbd::client::{Client, Target};
use lsvd_trace::{FormatChoice, Op, TraceReader};

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The trace file (.gz and .bz2 are read directly).
    pub trace: PathBuf,
    /// Trace format: msr, msr-cut, spc, cloudphysics, vscsi, tencent, systor, disksim, auto.
    #[arg(long, default_value = "auto")]
    pub format: String,
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
    /// read-cache hits and misses during the replay.
    #[arg(long)]
    pub metrics: Option<String>,
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
    pub read_cache_hits: Option<f64>,
    pub read_cache_misses: Option<f64>,
    pub read_cache_hit_rate: Option<f64>,
    pub bad_trace_lines: u64,
}

const MAX_PIECE_BYTES: u64 = 4 << 20;

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

/// Scrape `lsvd_read_cache_{hits,misses}_total` summed over volumes.
async fn scrape(url: &str) -> Result<(f64, f64), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// is supported"))?;
    let (hostport, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((rest, "/metrics".into()));
    let mut s = tokio::net::TcpStream::connect(hostport)
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut body = String::new();
    s.read_to_string(&mut body)
        .await
        .map_err(|e| e.to_string())?;
    let sum = |name: &str| -> f64 {
        body.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum()
    };
    Ok((
        sum("lsvd_read_cache_hits_total"),
        sum("lsvd_read_cache_misses_total"),
    ))
}

pub async fn run(args: ReplayArgs) -> Result<(), String> {
    let choice: FormatChoice = args.format.parse().map_err(|e| format!("--format: {e}"))?;
    let format = choice.resolve(&args.trace).map_err(|e| e.to_string())?;
    let mut reader = TraceReader::open(&args.trace, format).map_err(|e| e.to_string())?;
    let target = Target::parse(&args.export)?;
    let client = Arc::new(
        Client::connect(&target)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", args.export))?,
    );
    let size = client.size_bytes();
    if size < 4096 {
        return Err("export is too small".into());
    }
    let before = match &args.metrics {
        Some(u) => Some(scrape(u).await?),
        None => None,
    };
    let qd = args.queue_depth.clamp(1, 1024);
    let slots = Arc::new(tokio::sync::Semaphore::new(qd));
    let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut report = ReplayReport::default();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut volume_filter: Option<u32> = None;
    while let Some(req) = reader.next() {
        if let Some(max) = args.max_requests
            && report.requests >= max
        {
            break;
        }
        if let Some(want) = &args.volume {
            if volume_filter.is_none() {
                let name = reader.volume_name(req.volume).to_string();
                if *want == name || want.parse::<u32>().ok() == Some(req.volume) {
                    volume_filter = Some(req.volume);
                }
            }
            if volume_filter != Some(req.volume) {
                continue;
            }
        }
        if args.timed {
            let due = Duration::from_nanos(req.time_ns);
            let now = start.elapsed();
            if due > now {
                tokio::time::sleep(due - now).await;
            }
        }
        // Round out to sectors, fold into the export.
        let first = req.offset_bytes / 512 * 512;
        let end = (req.offset_bytes + req.length_bytes).div_ceil(512) * 512;
        let mut len = (end - first).min(size);
        let mut off = first;
        if off + len > size {
            report.folded += 1;
            off = (off % size) / 512 * 512;
            len = len.min(size - off);
        }
        report.requests += 1;
        match req.op {
            Op::Read => {
                report.reads += 1;
                report.read_bytes += len;
            }
            Op::Write => {
                report.writes += 1;
                report.write_bytes += len;
            }
            Op::Trim => report.trims += 1,
        }
        let mut at = off;
        let stop = off + len;
        while at < stop {
            let n = (stop - at).min(MAX_PIECE_BYTES);
            let permit = slots
                .clone()
                .acquire_owned()
                .await
                .map_err(|e| e.to_string())?;
            let c = client.clone();
            let errs = errors.clone();
            let op = req.op;
            tasks.spawn(async move {
                let r = match op {
                    Op::Read => c.read(at, n as u32).await.map(|_| ()),
                    Op::Write => c.write(at, &pattern(at, n as usize), false).await,
                    Op::Trim => c.trim(at, n as u32).await,
                };
                if r.is_err() {
                    errs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                drop(permit);
            });
            at += n;
            while tasks.try_join_next().is_some() {}
        }
    }
    while tasks.join_next().await.is_some() {}
    client
        .flush()
        .await
        .map_err(|e| format!("final flush: {e}"))?;
    report.elapsed_secs = start.elapsed().as_secs_f64();
    report.iops = report.requests as f64 / report.elapsed_secs.max(1e-9);
    report.errors = errors.load(std::sync::atomic::Ordering::Relaxed);
    report.bad_trace_lines = reader.stats().bad_lines;
    if let (Some(b), Some(u)) = (before, &args.metrics) {
        let a = scrape(u).await?;
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
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
        );
    } else {
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
    }
    if report.errors > 0 {
        return Err(format!("{} requests failed", report.errors));
    }
    Ok(())
}
