//! What a chained-log simulation reports: per-run summaries and per-interval
//! throughput (text table, JSON, SVG chart of application MB/s over time).

use std::fmt::Write as _;

use serde::Serialize;

use super::device::DeviceModel;
use super::layout::{ChainGc, LayoutKind};
use crate::plot::{escape, label, ticks};

/// Throughput over one interval of simulated time (decimal MB per second).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Interval {
    pub start_s: f64,
    pub app_write_mb_per_s: f64,
    pub app_read_mb_per_s: f64,
    pub gc_read_mb_per_s: f64,
    pub gc_write_mb_per_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub simulated_s: f64,
    /// When GC first ran (free segments fell under --gc-free-start).
    pub gc_started_s: Option<f64>,
    /// When a client write first had to wait for GC to free a segment.
    pub first_stall_s: Option<f64>,
    pub app_write_mb_per_s: f64,
    pub app_read_mb_per_s: f64,
    /// Application writes from the start until GC first ran.
    pub app_write_mb_per_s_before_gc: f64,
    /// Application writes, GC writes and GC reads from GC's start to the end.
    pub app_write_mb_per_s_with_gc: Option<f64>,
    pub gc_write_mb_per_s_with_gc: Option<f64>,
    pub gc_read_mb_per_s_with_gc: Option<f64>,
    /// Client requests completed.
    pub requests_done: u64,
    pub gc_victims: u64,
    pub gc_moved_bytes: u64,
    /// GC passes given up for lack of space (should be 0).
    pub gc_no_space: u64,
    /// Chain: (time, new tail drive) for each tail move.
    pub tail_moves_s: Vec<(f64, u32)>,
    /// Per drive: service time / simulated time (SSD: summed over channels). A
    /// mirrored layout lists both drives of each position, position by position.
    pub drive_busy_fraction: Vec<f64>,
    /// Client reads and the tail cache's hits (only with `--tail-cache`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tail_cache: Option<CacheStats>,
}

/// Client reads in 4 KiB blocks and how many the tail cache served.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CacheStats {
    pub size_bytes: u64,
    pub read_blocks: u64,
    pub hit_blocks: u64,
    /// Chain: reads of blocks that were on the tail drive when read (Gecko's measure).
    pub tail_read_blocks: u64,
    pub tail_hit_blocks: u64,
    /// hit_blocks / read_blocks (`None`: no reads).
    pub hit_rate: Option<f64>,
    /// tail_hit_blocks / tail_read_blocks (`None`: no reads of the tail; stripe).
    pub tail_hit_rate: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunResult {
    pub name: String,
    pub layout: LayoutKind,
    pub drives: u32,
    pub chain_gc: Option<ChainGc>,
    pub summary: Summary,
    pub series: Vec<Interval>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GeckoReport {
    pub device: DeviceModel,
    pub drive_bytes: u64,
    pub segment_bytes: u64,
    pub interval_s: f64,
    /// Trace-driven runs: (files, requests, bytes touched).
    pub trace_mix: Option<(usize, usize, u64)>,
    pub runs: Vec<RunResult>,
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

fn rate(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}"))
}

/// The report as text: a summary table, then application / GC MB/s per interval.
pub fn text(r: &GeckoReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "device {}; drives of {} MiB, segments of {} KiB",
        r.device,
        r.drive_bytes >> 20,
        r.segment_bytes >> 10
    );
    if let Some((files, requests, bytes)) = r.trace_mix {
        let _ = writeln!(
            s,
            "trace mix: {files} files, {requests} requests (pieces of at most 256 KiB), {:.1} MiB touched",
            bytes as f64 / (1u64 << 20) as f64
        );
    }
    let cached = r.runs.iter().any(|x| x.summary.tail_cache.is_some());
    if let Some(c) = r.runs.iter().find_map(|x| x.summary.tail_cache.as_ref()) {
        let _ = writeln!(
            s,
            "tail cache: {:.1} MiB (LRU of client-written 4 KiB blocks)",
            c.size_bytes as f64 / (1u64 << 20) as f64
        );
    }
    let _ = write!(
        s,
        "{:<26} {:>8} {:>10} {:>10} {:>9} {:>9} {:>8} {:>9} {:>9} {:>9}",
        "run",
        "gc_at_s",
        "app_no_gc",
        "app_w_gc",
        "gc_write",
        "gc_read",
        "stall_s",
        "app_write",
        "app_read",
        "req_per_s"
    );
    if cached {
        let _ = write!(s, " {:>8} {:>8}", "hit", "tail_hit");
    }
    s.push('\n');
    for run in &r.runs {
        let m = &run.summary;
        let _ = write!(
            s,
            "{:<26} {:>8} {:>10.1} {:>10} {:>9} {:>9} {:>8} {:>9.1} {:>9.1} {:>9.0}",
            run.name,
            m.gc_started_s.map_or("-".into(), |t| format!("{t:.2}")),
            m.app_write_mb_per_s_before_gc,
            opt(m.app_write_mb_per_s_with_gc),
            opt(m.gc_write_mb_per_s_with_gc),
            opt(m.gc_read_mb_per_s_with_gc),
            m.first_stall_s.map_or("-".into(), |t| format!("{t:.2}")),
            m.app_write_mb_per_s,
            m.app_read_mb_per_s,
            if m.simulated_s > 0.0 {
                m.requests_done as f64 / m.simulated_s
            } else {
                0.0
            },
        );
        if cached {
            let c = m.tail_cache.as_ref();
            let _ = write!(
                s,
                " {:>8} {:>8}",
                rate(c.and_then(|c| c.hit_rate)),
                rate(c.and_then(|c| c.tail_hit_rate))
            );
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "(MB/s, decimal; app_no_gc: application writes before GC first ran; app_w_gc, gc_*: from then to the end;\n app_write, app_read, req_per_s: over the whole run{})\n",
        if cached {
            ";\n hit: client-read blocks served by the tail cache / all read; tail_hit: the same for blocks on the chain's tail drive"
        } else {
            ""
        }
    );
    let _ = write!(s, "{:>8}", "t_s");
    for run in &r.runs {
        let _ = write!(s, " {:>26}", format!("{} app/gc", run.name));
    }
    s.push('\n');
    let rows = r.runs.iter().map(|x| x.series.len()).max().unwrap_or(0);
    for i in 0..rows {
        let t = r
            .runs
            .iter()
            .find_map(|x| x.series.get(i).map(|v| v.start_s))
            .unwrap_or(0.0);
        let _ = write!(s, "{t:>8.2}");
        for run in &r.runs {
            match run.series.get(i) {
                Some(v) => {
                    let _ = write!(
                        s,
                        " {:>26}",
                        format!("{:.1} / {:.1}", v.app_write_mb_per_s, v.gc_write_mb_per_s)
                    );
                }
                None => {
                    let _ = write!(s, " {:>26}", "");
                }
            }
        }
        s.push('\n');
    }
    s
}

const COLORS: [&str; 6] = [
    "#2ca02c", "#ff7f0e", "#d62728", "#1f77b4", "#9467bd", "#8c564b",
];

/// An SVG chart: application write MB/s (solid) and GC write MB/s (dashed) against
/// simulated time, one color per run; a tick marks when each run's GC started.
pub fn svg(r: &GeckoReport) -> String {
    let (w, h, left, right, top, bottom) = (760.0, 380.0, 70.0, 220.0, 40.0, 50.0);
    let (x0, x1, y0, y1) = (left, w - right, h - bottom, top);
    let t_max = r
        .runs
        .iter()
        .map(|x| x.summary.simulated_s)
        .fold(0.0, f64::max);
    let v_max = r
        .runs
        .iter()
        .flat_map(|x| {
            x.series
                .iter()
                .map(|v| v.app_write_mb_per_s.max(v.gc_write_mb_per_s))
        })
        .fold(0.0, f64::max);
    let (t_top, t_ticks) = ticks(t_max);
    let (v_top, v_ticks) = ticks(v_max);
    let px = |t: f64| x0 + t / t_top * (x1 - x0);
    let py = |v: f64| y0 - v / v_top * (y0 - y1);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{x0}" y="22" font-size="13">application write MB/s (solid) and GC write MB/s (dashed) over simulated time</text>"#
    );
    let _ = writeln!(
        s,
        r##"<rect x="{x0}" y="{y1}" width="{}" height="{}" fill="none" stroke="#888"/>"##,
        x1 - x0,
        y0 - y1
    );
    for v in &v_ticks {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            x0 - 4.0,
            py(*v) + 4.0,
            label(*v)
        );
    }
    for t in &t_ticks {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            px(*t),
            y0 + 14.0,
            label(*t)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">simulated seconds</text>"#,
        (x0 + x1) / 2.0,
        y0 + 30.0
    );
    for (j, run) in r.runs.iter().enumerate() {
        let color = COLORS[j % COLORS.len()];
        let mid = |v: &Interval| v.start_s + r.interval_s / 2.0;
        for (dash, y) in [
            (
                "",
                (|v: &Interval| v.app_write_mb_per_s) as fn(&Interval) -> f64,
            ),
            (r#" stroke-dasharray="5,3""#, |v: &Interval| {
                v.gc_write_mb_per_s
            }),
        ] {
            let points: Vec<String> = run
                .series
                .iter()
                .map(|v| format!("{:.1},{:.1}", px(mid(v)), py(y(v))))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
                points.join(" ")
            );
        }
        if let Some(t) = run.summary.gc_started_s {
            let _ = writeln!(
                s,
                r#"<line x1="{0:.1}" y1="{y0}" x2="{0:.1}" y2="{1}" stroke="{color}"/>"#,
                px(t),
                y0 - 8.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" fill="{color}">{}</text>"#,
            x1 + 8.0,
            y1 + 14.0 + j as f64 * 16.0,
            escape(&run.name)
        );
    }
    s.push_str("</svg>\n");
    s
}
