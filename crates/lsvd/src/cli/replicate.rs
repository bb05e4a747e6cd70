//! `lsvd replicate VOL --to STORE_URL [--follow]`: copy a volume into another store
//! (`lsvd_engine::replicate_once` does one pass; this runs one, or one every interval),
//! with a progress line on a terminal and, when following, the replica's lag as a
//! metric.
//!
//! The copy is read-only on the source, so it runs next to `lsvd serve` (or alone);
//! the replica is opened with `lsvd serve --store STORE_URL VOL` once replication is
//! stopped (serving it makes it a volume of its own, and replication then refuses).

#![expect(
    clippy::disallowed_methods,
    reason = "`lsvd replicate` paces its passes and reports their rates in real time"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::progress::Progress;

use clap::Args;

use super::Common;
use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_engine::{PassReport, ReplicateOptions, ReplicateProgress, ReplicateRun};
use lsvd_store::DynStore;

#[derive(Args, Debug)]
pub struct ReplicateArgs {
    /// The volume to copy, with its checkpoints and snapshots (a clone's parent must
    /// be replicated first: the replica shares its data as the source does).
    pub volume: String,
    /// The store to copy into: file:///PATH, a path, s3://BUCKET/PREFIX,
    /// gs://BUCKET/PREFIX or az://CONTAINER/PREFIX (settings as for --store). Not the
    /// source store itself.
    #[arg(long, value_name = "STORE_URL")]
    pub to: String,
    /// Keep copying as the volume is written and collected, one pass every
    /// --interval-ms, until interrupted (Ctrl-C; an interrupted pass leaves the replica
    /// a prefix, and the next run resumes it).
    #[arg(long)]
    pub follow: bool,
    /// No progress lines (the summary of each pass is still printed).
    #[arg(long)]
    pub quiet: bool,
    /// With --follow: milliseconds from the end of one pass to the start of the next.
    #[arg(long, default_value_t = 2000, value_name = "MS")]
    pub interval_ms: u64,
    /// Objects copied at the same time (each is held in memory while it is copied).
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub jobs: usize,
    /// With --follow: serve the replication metrics (Prometheus text: lag in objects
    /// and seconds, bytes copied) on HOST:PORT.
    #[arg(long, value_name = "HOST:PORT", requires = "follow")]
    pub metrics: Option<String>,
}

/// What `--metrics` shows.
#[derive(Default)]
struct Lag {
    /// Objects the source had at the start of the latest pass that the replica lacked.
    objects: AtomicU64,
    /// When the latest completed pass started (ms since `started`): the replica holds
    /// everything the source held then.
    current_as_of_ms: AtomicU64,
    passes: AtomicU64,
    bytes: AtomicU64,
}

pub async fn run(common: &Common, args: ReplicateArgs) -> Result<()> {
    lsvd_engine::keys::validate_volume_name(&args.volume)?;
    if args.jobs == 0 || args.jobs > 64 {
        return Err(Error::bad_input("--jobs must be between 1 and 64"));
    }
    let source = common.open_store()?;
    let target = common.file.open_store(&args.to)?;
    // An encrypted volume's objects are read opened and sealed again in the replica
    // with the same data key: the key file is needed, the replica stays encrypted.
    let meta = lsvd_engine::read_meta(&source, &args.volume).await?;
    let (source, target) =
        lsvd_engine::unlock_pair(&source, &target, &meta, common.user_key()?.as_ref()).await?;
    let options = ReplicateOptions { jobs: args.jobs };
    if !args.follow {
        let started = Instant::now();
        let run = ReplicateRun::default();
        let report =
            pass_with_progress(&source, &target, &args.volume, &options, &run, args.quiet).await?;
        print_pass(&args.volume, &target, &report, started.elapsed());
        return Ok(());
    }
    follow(&source, &target, &args, &options).await
}

async fn follow(
    source: &DynStore,
    target: &DynStore,
    args: &ReplicateArgs,
    options: &ReplicateOptions,
) -> Result<()> {
    let started = Instant::now();
    let lag = Arc::new(Lag::default());
    let (stop_metrics, metrics_stopped) = tokio::sync::watch::channel(false);
    if let Some(addr) = &args.metrics {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Error::local_io(format!("cannot listen on {addr} for --metrics"), e))?;
        let render = {
            let (lag, volume) = (lag.clone(), args.volume.clone());
            move || render_metrics(&volume, &lag, started)
        };
        tokio::spawn(crate::metrics::serve_text(
            listener,
            Arc::new(render),
            metrics_stopped,
        ));
    }
    lsvd_store::log::info(&format!(
        "replicating {} to {} every {} ms until interrupted",
        args.volume,
        target.describe(),
        args.interval_ms
    ));
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    // What the passes verified is not read again by the next ones.
    let run = ReplicateRun::default();
    loop {
        let pass_started = Instant::now();
        let pass = pass_with_progress(source, target, &args.volume, options, &run, args.quiet);
        let report = tokio::select! {
            r = pass => r,
            _ = &mut interrupted => break,
        };
        match report {
            Ok(report) => {
                let behind = report.objects_copied + report.checkpoints_copied;
                lag.objects.store(behind, Ordering::Relaxed);
                lag.current_as_of_ms.store(
                    pass_started.duration_since(started).as_millis() as u64,
                    Ordering::Relaxed,
                );
                lag.passes.fetch_add(1, Ordering::Relaxed);
                lag.bytes.fetch_add(report.bytes_copied, Ordering::Relaxed);
                if behind > 0
                    || report.objects_deleted > 0
                    || report.snapshots_deleted > 0
                    || report.objects_replaced > 0
                {
                    print_pass(&args.volume, target, &report, pass_started.elapsed());
                }
            }
            // The source being unreachable for a while is worth waiting out.
            Err(e) if e.kind == ErrorKind::Transient => {
                lsvd_store::log::warn(&format!("replicate {}: {e}; retrying", args.volume));
            }
            Err(e) => return Err(e),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(args.interval_ms)) => {}
            _ = &mut interrupted => break,
        }
    }
    let _ = stop_metrics.send(true);
    lsvd_store::log::info(&format!(
        "stopped replicating {} (the replica holds the source as of the last finished pass)",
        args.volume
    ));
    Ok(())
}

/// One pass, with progress on stderr (see `progress.rs`) unless `--quiet`.
async fn pass_with_progress(
    source: &DynStore,
    target: &DynStore,
    volume: &str,
    options: &ReplicateOptions,
    run: &ReplicateRun,
    quiet: bool,
) -> Result<PassReport> {
    let progress = Arc::new(ReplicateProgress::default());
    let ticker = {
        let progress = progress.clone();
        let mut shown = Progress::new(format!("replicate {volume}"), 0, quiet);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let total = progress.bytes_total.load(Ordering::Relaxed);
                if total > 0 {
                    shown.set_total(total);
                    shown.update(progress.bytes_done.load(Ordering::Relaxed));
                }
            }
        })
    };
    let result = lsvd_engine::replicate_pass(source, target, volume, options, run, &progress).await;
    ticker.abort();
    Progress::new("", 0, quiet).clear();
    result
}

fn print_pass(volume: &str, target: &DynStore, report: &PassReport, took: Duration) {
    let secs = took.as_secs_f64().max(1e-3);
    println!(
        "replicated {volume} to {}: {} objects and {} checkpoints copied ({:.1} MiB, {:.1} MB/s), \
         {} already there, {} replaced (other bytes under the same name), {} deleted; {} snapshots \
         copied, {} deleted; the replica recovers through object {:016x}{}",
        target.describe(),
        report.objects_copied,
        report.checkpoints_copied,
        report.bytes_copied as f64 / (1 << 20) as f64,
        report.bytes_copied as f64 / secs / 1e6,
        report.objects_present,
        report.objects_replaced,
        report.objects_deleted,
        report.snapshots_copied,
        report.snapshots_deleted,
        report.replica_next_seq.saturating_sub(1),
        if report.restarts > 0 {
            format!(
                " ({} restarts: the source changed under the copy)",
                report.restarts
            )
        } else {
            String::new()
        }
    );
}

fn render_metrics(volume: &str, lag: &Lag, started: Instant) -> String {
    use std::fmt::Write as _;
    let now_ms = started.elapsed().as_millis() as u64;
    let passes = lag.passes.load(Ordering::Relaxed);
    let lag_seconds = if passes == 0 {
        now_ms as f64 / 1000.0
    } else {
        now_ms.saturating_sub(lag.current_as_of_ms.load(Ordering::Relaxed)) as f64 / 1000.0
    };
    let mut out = String::new();
    for (name, kind, help, value) in [
        (
            "replication_lag_objects",
            "gauge",
            "Objects the source held at the start of the latest pass that the replica lacked.",
            lag.objects.load(Ordering::Relaxed) as f64,
        ),
        (
            "replication_lag_seconds",
            "gauge",
            "Seconds since the source was in the state the replica holds (the start of the latest finished pass).",
            lag_seconds,
        ),
        (
            "replication_passes_total",
            "counter",
            "Passes finished.",
            passes as f64,
        ),
        (
            "replication_copied_bytes_total",
            "counter",
            "Bytes copied into the replica.",
            lag.bytes.load(Ordering::Relaxed) as f64,
        ),
    ] {
        let _ = writeln!(out, "# HELP lsvd_{name} {help}");
        let _ = writeln!(out, "# TYPE lsvd_{name} {kind}");
        let _ = writeln!(out, "lsvd_{name}{{volume=\"{volume}\"}} {value}");
    }
    out
}
