//! The table `lsvd probe` prints (without `--json`).
//!
//! Why a module: the text is for people and changes for them; keeping it apart keeps
//! the measurements and the rules readable. MB/s here are 10^6 bytes per second.

use std::path::Path;

use super::ProbeProfile;
use super::measure::Rate;
use lsvd_core::size::format_size;

/// A report being written, a line at a time.
#[derive(Default)]
struct Lines(String);

impl Lines {
    fn line(&mut self, s: String) {
        self.0.push_str(&s);
        self.0.push('\n');
    }

    /// The heading of a table of write rates: `key`'s column (`width` wide), IOPS, MB/s.
    fn rate_heading(&mut self, key: &str, width: usize) {
        self.line(format!("  {key:>width$}  {:>9}  {:>9}", "IOPS", "MB/s"));
    }

    /// A row of a table of write rates.
    fn rate_row(&mut self, key: impl std::fmt::Display, width: usize, rate: &Rate) {
        self.line(format!(
            "  {key:>width$}  {:>9.0}  {:>9.1}",
            rate.iops,
            mb_per_sec(rate.bytes_per_sec)
        ));
    }

    /// The last line: where the profile was saved (`None`: not, by request); the
    /// whole report.
    fn saved(mut self, saved: Option<&Path>) -> String {
        match saved {
            Some(p) => self.line(format!("saved to {}", p.display())),
            None => self.line("not saved (--no-save)".into()),
        }
        self.0
    }
}

fn mb_per_sec(bytes_per_sec: f64) -> f64 {
    bytes_per_sec / 1e6
}

/// The report for `profile`; `saved` is where it was saved, if it was.
pub fn render(profile: &ProbeProfile, saved: Option<&Path>) -> String {
    let m = &profile.measurements;
    let d = &profile.decisions;
    let mode = if profile.direct {
        "O_DIRECT"
    } else {
        "buffered (O_DIRECT refused)"
    };
    let mut out = Lines::default();
    out.line(format!(
        "lsvd probe {}: {mode}, scratch file {}, {} s per test",
        profile.path,
        format_size(profile.file_size_bytes),
        profile.seconds_per_test
    ));
    out.line(format!(
        "pre-write (1 MiB sequential + fdatasync): {:.0} MB/s",
        mb_per_sec(m.prewrite_bytes_per_sec)
    ));
    out.line(String::new());

    out.line("write size sweep (random, QD1, offset a multiple of the size)".into());
    out.rate_heading("size B", 6);
    for p in &m.write_sweep {
        match p.rate {
            Some(r) => out.rate_row(p.size_bytes, 6, &r),
            None => out.line(format!(
                "  {:>6}  {:>9}  {:>9}",
                p.size_bytes, "refused", "-"
            )),
        }
    }
    out.line(String::new());

    out.line("4 KiB write + fdatasync (QD1)".into());
    out.line(format!(
        "  {:<22}  {:>10}  {:>10}  {:>8}",
        "", "median us", "p99 us", "samples"
    ));
    let direct_label = if profile.direct {
        "O_DIRECT"
    } else {
        "buffered"
    };
    for (what, l) in [
        (format!("rewrite ({direct_label})"), &m.sync_rewrite),
        (format!("append ({direct_label})"), &m.sync_append),
        ("rewrite (buffered)".to_string(), &m.sync_rewrite_buffered),
    ] {
        out.line(format!(
            "  {what:<22}  {:>10.1}  {:>10.1}  {:>8}",
            l.median_us, l.p99_us, l.samples
        ));
    }
    out.line(String::new());

    out.line("4 KiB random writes by queue depth (one thread per write)".into());
    out.rate_heading("QD", 4);
    for p in &m.parallel_writes {
        out.rate_row(p.queue_depth, 4, &p.rate);
    }
    out.line(String::new());

    out.line("sequential writes (QD1)".into());
    out.rate_heading("size", 8);
    for p in &m.sequential_writes {
        out.rate_row(format_size(u64::from(p.size_bytes)), 8, &p.rate);
    }
    out.line(String::new());

    out.line(format!(
        "4 KiB random reads (QD1): median {:.1} us, p99 {:.1} us ({} samples)",
        m.random_read.median_us, m.random_read.p99_us, m.random_read.samples
    ));
    out.line(String::new());

    out.line("decisions".into());
    out.line(format!(
        "  page size (inferred)   {:>8} B   smallest power of two no larger write beats by >15% IOPS",
        d.page_size_bytes
    ));
    out.line(format!(
        "  log alignment unit     {:>8} B   page size clamped to 512..4096",
        d.log_align_bytes
    ));
    out.line(format!(
        "  log writes in flight   {:>8}     useful parallelism {} (no deeper queue >10% more IOPS), at most 16; advice only: serve keeps 1 (buffered log)",
        d.log_writes_in_flight, d.useful_parallelism
    ));
    out.line(format!(
        "  group-commit cap       {:>10}   smallest sequential write at >=90% of peak MB/s, 64 KiB..4 MiB",
        format_size(d.group_commit_cap_bytes)
    ));
    out.line(format!(
        "  log I/O                {:>8}     direct if O_DIRECT works and write+fdatasync is not >10% slower; advice only: serve writes buffered",
        if d.direct_log_io {
            "direct"
        } else {
            "buffered"
        }
    ));
    for n in &d.notes {
        out.line(format!("  note: {n}"));
    }
    out.saved(saved)
}

/// The report of `lsvd probe --store`.
pub fn render_store(profile: &super::store_profile::StoreProfile, saved: Option<&Path>) -> String {
    let m = &profile.measurements;
    let d = &profile.decisions;
    let mut out = Lines::default();
    out.line(format!(
        "lsvd probe --store {}{}",
        profile.store_url,
        if profile.quick { " (--quick)" } else { "" }
    ));
    out.line(String::new());
    out.line("ranged GET latency (one at a time)".into());
    out.line(format!(
        "  {:>9}  {:>11}  {:>11}  {:>7}",
        "range", "median us", "p99 us", "samples"
    ));
    for g in &m.gets {
        out.line(format!(
            "  {:>9}  {:>11.0}  {:>11.0}  {:>7}",
            format_size(g.range_bytes),
            g.latency.median_us,
            g.latency.p99_us,
            g.latency.samples
        ));
    }
    out.line(String::new());
    out.line("PUT bandwidth, one stream".into());
    out.line(format!("  {:>8}  {:>9}  {:>5}", "object", "MB/s", "PUTs"));
    for p in &m.put_sizes {
        out.line(format!(
            "  {:>8}  {:>9.1}  {:>5}",
            format_size(p.object_bytes),
            mb_per_sec(p.bytes_per_sec),
            p.puts
        ));
    }
    out.line(String::new());
    if let Some(first) = m.put_streams.first() {
        out.line(format!(
            "PUT bandwidth of {} objects, by streams",
            format_size(first.object_bytes)
        ));
    }
    out.line(format!("  {:>8}  {:>9}  {:>5}", "streams", "MB/s", "PUTs"));
    for p in &m.put_streams {
        out.line(format!(
            "  {:>8}  {:>9.1}  {:>5}",
            p.streams,
            mb_per_sec(p.bytes_per_sec),
            p.puts
        ));
    }
    out.line(String::new());
    out.line("decisions".into());
    out.line(format!(
        "  read fetch size     {:>10}   largest GET at most 1.5x a small GET's latency, 64 KiB..1 MiB",
        format_size(d.read_fetch_bytes)
    ));
    out.line(format!(
        "  batch size          {:>10}   smallest object at >=90% of the best one-stream MB/s, 4..32 MiB",
        format_size(d.batch_size_bytes)
    ));
    out.line(format!(
        "  uploads in flight   {:>10}   fewest streams no more streams beat by >10% MB/s, at most 16",
        d.uploads_in_flight
    ));
    for n in &d.notes {
        out.line(format!("  note: {n}"));
    }
    out.saved(saved)
}

#[cfg(test)]
mod tests {
    use super::super::tests::sample_profile;
    use super::*;

    #[test]
    fn report_names_every_decision() {
        let text = render(&sample_profile(), Some(Path::new("/d/probe-profile")));
        for want in [
            "write size sweep",
            "append (O_DIRECT)",
            "page size (inferred)       4096 B",
            "log writes in flight         16",
            "group-commit cap          1.0 MiB",
            "log I/O                  direct",
            "saved to /d/probe-profile",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }

    #[test]
    fn store_report_names_every_decision() {
        let p = super::super::store::tests::sample_store_profile("s3://b/p");
        let text = render_store(&p, None);
        for want in [
            "lsvd probe --store s3://b/p",
            "ranged GET latency",
            "read fetch size      256.0 KiB",
            "batch size            16.0 MiB",
            "uploads in flight            8",
            "not saved",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }
}
