//! Results of a simulation run: the JSON shape and the text tables.

use serde::Serialize;

use super::volume::{Counters, SeriesPoint, VolumeReport};
use lsvd_core::size::format_size;

/// What was read from one input.
#[derive(Debug, Clone, Serialize)]
pub struct InputReport {
    pub name: String,
    pub format: String,
    pub volumes: u64,
    pub lines: u64,
    pub requests: u64,
    /// Well-formed records that are not data requests.
    pub skipped: u64,
    pub bad_lines: u64,
    /// The first few bad lines: (line number, why).
    pub first_bad: Vec<(u64, String)>,
    /// Requests whose timestamp went backwards.
    pub unordered: u64,
}

/// One simulated volume under one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct VolumeResult {
    /// Index into [`RunReport::inputs`].
    pub input: usize,
    pub volume: String,
    /// What distinguishes this configuration from the others in the run ("" if one).
    pub config: String,
    pub batch_size_bytes: u64,
    pub gc_policy: String,
    pub gc_start: f64,
    pub gc_stop: f64,
    #[serde(flatten)]
    pub report: VolumeReport,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<SeriesPoint>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub inputs: Vec<InputReport>,
    pub configs: u64,
    /// Requests read from the inputs (each fed to every configuration).
    pub requests_replayed: u64,
    /// Host time of the replay (parsing included unless `preloaded`).
    pub host_seconds: f64,
    pub requests_per_second: f64,
    /// CPU time of the replay thread (what the speed goal is about: one core).
    pub cpu_seconds: f64,
    pub requests_per_cpu_second: f64,
    pub preloaded: bool,
    pub volumes: Vec<VolumeResult>,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Sum of several volumes' results. Peak store size is the sum of the peaks (an upper
/// bound of the joint peak); utilization is over the sum.
pub fn aggregate(reports: &[&VolumeReport]) -> VolumeReport {
    let mut c = Counters::default();
    let mut out = VolumeReport {
        volume_size_bytes: 0,
        counters: c,
        store_write_bytes: 0,
        write_amplification: 0.0,
        merge_ratio: 0.0,
        map_extents: 0,
        map_memory_bytes: 0,
        live_bytes: 0,
        final_store_bytes: 0,
        final_objects: 0,
        final_utilization: 0.0,
        gc_hot_fraction_last: 0.0,
        gc_hot_fraction_mean: 0.0,
    };
    let mut stored_objects = 0u64;
    for r in reports {
        let x = &r.counters;
        c.requests += x.requests;
        c.write_requests += x.write_requests;
        c.read_requests += x.read_requests;
        c.trim_requests += x.trim_requests;
        c.out_of_range_requests += x.out_of_range_requests;
        c.misaligned_requests += x.misaligned_requests;
        c.client_write_bytes += x.client_write_bytes;
        c.read_bytes += x.read_bytes;
        c.trim_bytes += x.trim_bytes;
        c.coalesced_bytes += x.coalesced_bytes;
        c.data_objects += x.data_objects;
        c.data_object_bytes += x.data_object_bytes;
        c.gc_objects += x.gc_objects;
        c.gc_object_bytes += x.gc_object_bytes;
        c.checkpoint_objects += x.checkpoint_objects;
        c.checkpoint_bytes += x.checkpoint_bytes;
        c.gc_passes += x.gc_passes;
        c.gc_bytes_moved += x.gc_bytes_moved;
        c.gc_hot_bytes_moved += x.gc_hot_bytes_moved;
        c.gc_cold_bytes_moved += x.gc_cold_bytes_moved;
        c.gc_separating_passes += x.gc_separating_passes;
        for (sum, n) in c.gc_class_passes.iter_mut().zip(x.gc_class_passes) {
            *sum += n;
        }
        c.gc_victims += x.gc_victims;
        c.deleted_objects += x.deleted_objects;
        c.timeout_batches += x.timeout_batches;
        c.peak_store_bytes += x.peak_store_bytes;
        c.max_end_bytes = c.max_end_bytes.max(x.max_end_bytes);
        out.volume_size_bytes += r.volume_size_bytes;
        out.map_extents += r.map_extents;
        out.map_memory_bytes += r.map_memory_bytes;
        out.live_bytes += r.live_bytes;
        out.final_store_bytes += r.final_store_bytes;
        out.final_objects += r.final_objects;
        if r.final_utilization > 0.0 {
            stored_objects += (r.live_bytes as f64 / r.final_utilization).round() as u64;
        }
    }
    out.counters = c;
    out.store_write_bytes = c.store_write_bytes();
    out.write_amplification = ratio(c.store_write_bytes(), c.client_write_bytes);
    out.merge_ratio = ratio(c.coalesced_bytes, c.client_write_bytes);
    out.final_utilization = if stored_objects == 0 {
        1.0
    } else {
        ratio(out.live_bytes, stored_objects)
    };
    out
}

/// Most volumes listed in the text output per input (largest by bytes written first).
const MAX_ROWS: usize = 40;

fn size(b: u64) -> String {
    format_size(b)
}

fn row(label: &str, config: &str, r: &VolumeReport, show_config: bool) -> Vec<String> {
    let c = &r.counters;
    let mut v = vec![label.to_string()];
    if show_config {
        v.push(config.to_string());
    }
    v.extend([
        size(c.client_write_bytes),
        format!("{:.3}", r.write_amplification),
        format!("{:.3}", r.merge_ratio),
        r.map_extents.to_string(),
        size(r.map_memory_bytes),
        c.gc_passes.to_string(),
        size(c.gc_bytes_moved),
        size(c.checkpoint_bytes),
        size(c.peak_store_bytes),
        size(r.final_store_bytes),
        format!("{:.2}", r.final_utilization),
        format!(
            "{}/{}/{}",
            c.data_objects, c.gc_objects, c.checkpoint_objects
        ),
        size(c.read_bytes),
    ]);
    v
}

fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, cell) in r.iter().enumerate() {
            widths[i] = widths[i].max(cell.len());
        }
    }
    let mut out = String::new();
    let line = |cells: &[String], out: &mut String| {
        for (i, cell) in cells.iter().enumerate() {
            if i == 0 {
                out.push_str(&format!("{:<w$}", cell, w = widths[i]));
            } else {
                out.push_str(&format!("  {:>w$}", cell, w = widths[i]));
            }
        }
        out.push('\n');
    };
    line(
        &header.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
        &mut out,
    );
    for r in rows {
        line(r, &mut out);
    }
    out
}

/// The text report: per input, a line about parsing and a table of volumes.
pub fn text(report: &RunReport) -> String {
    let show_config = report.configs > 1;
    let mut header = vec!["volume"];
    if show_config {
        header.push("config");
    }
    header.extend([
        "written",
        "WAF",
        "merge",
        "extents",
        "map mem",
        "GC passes",
        "GC moved",
        "ckpt bytes",
        "peak store",
        "final store",
        "util",
        "objects d/g/c",
        "read",
    ]);
    let mut out = String::new();
    for (i, input) in report.inputs.iter().enumerate() {
        out.push_str(&format!(
            "{} ({}): {} requests, {} volume(s), {} bad line(s), {} skipped record(s){}\n",
            input.name,
            input.format,
            input.requests,
            input.volumes,
            input.bad_lines,
            input.skipped,
            if input.unordered > 0 {
                format!(", {} out of time order", input.unordered)
            } else {
                String::new()
            }
        ));
        for (line, why) in &input.first_bad {
            out.push_str(&format!("  bad line {line}: {why}\n"));
        }
        let mine: Vec<&VolumeResult> = report.volumes.iter().filter(|v| v.input == i).collect();
        // Volumes in order of bytes written (largest first), then name.
        let mut names: Vec<&str> = Vec::new();
        for v in &mine {
            if !names.contains(&v.volume.as_str()) {
                names.push(&v.volume);
            }
        }
        names.sort_by_key(|n| (std::cmp::Reverse(volume_bytes(&mine, n)), n.to_string()));
        let volume_count = names.len();
        names.truncate(MAX_ROWS);
        let shown_rows: Vec<&VolumeResult> = names
            .iter()
            .flat_map(|n| mine.iter().filter(move |v| v.volume == *n).copied())
            .collect();
        let mut rows: Vec<Vec<String>> = shown_rows
            .iter()
            .map(|v| row(&v.volume, &v.config, &v.report, show_config))
            .collect();
        if volume_count > 1 {
            let mut labels: Vec<&str> = Vec::new();
            for v in &mine {
                if !labels.contains(&v.config.as_str()) {
                    labels.push(&v.config);
                }
            }
            for l in labels {
                let reps: Vec<&VolumeReport> = mine
                    .iter()
                    .filter(|v| v.config == l)
                    .map(|v| &v.report)
                    .collect();
                rows.push(row(
                    &format!("all {volume_count}"),
                    l,
                    &aggregate(&reps),
                    show_config,
                ));
            }
        }
        out.push_str(&table(&header, &rows));
        for v in shown_rows.iter().filter(|v| v.gc_policy == "hylog") {
            out.push_str(&hylog_line(v, show_config));
        }
        if volume_count > names.len() {
            out.push_str(&format!(
                "({} smaller volume(s) not listed; --json lists all)\n",
                volume_count.saturating_sub(MAX_ROWS)
            ));
        }
        let oor: u64 = mine
            .iter()
            .map(|v| v.report.counters.out_of_range_requests)
            .sum();
        let mis: u64 = mine
            .iter()
            .map(|v| v.report.counters.misaligned_requests)
            .sum();
        if oor > 0 || mis > 0 {
            out.push_str(&format!(
                "{oor} request(s) out of range (skipped), {mis} misaligned (rounded out to 512 B)\n"
            ));
        }
        out.push('\n');
    }
    out.push_str(&format!(
        "replayed {} requests x {} config(s) in {:.3} s ({:.3} s CPU): {:.2} M requests/s, {:.2} M per CPU second{}\n",
        report.requests_replayed,
        report.configs,
        report.host_seconds,
        report.cpu_seconds,
        report.requests_per_second / 1e6,
        report.requests_per_cpu_second / 1e6,
        if report.preloaded {
            " (replay only)"
        } else {
            " (parsing included)"
        }
    ));
    out
}

/// One line per hylog volume: the hot fraction chosen and GC bytes moved per class.
fn hylog_line(v: &VolumeResult, show_config: bool) -> String {
    let r = &v.report;
    let c = &r.counters;
    let label = if show_config && !v.config.is_empty() {
        format!("{} [{}]", v.volume, v.config)
    } else {
        v.volume.clone()
    };
    format!(
        "hylog {label}: hot fraction {:.3} last, {:.3} mean; {} of {} GC passes separated; GC moved {} hot, {} cold\n",
        r.gc_hot_fraction_last,
        r.gc_hot_fraction_mean,
        c.gc_separating_passes,
        c.gc_passes,
        size(c.gc_hot_bytes_moved),
        size(c.gc_cold_bytes_moved),
    )
}

fn volume_bytes(all: &[&VolumeResult], volume: &str) -> u64 {
    all.iter()
        .filter(|v| v.volume == volume)
        .map(|v| v.report.counters.client_write_bytes)
        .max()
        .unwrap_or(0)
}
