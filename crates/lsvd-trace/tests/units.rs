//! Trace units: the 5-column layout `time device offset size type` in bytes
//! (the MSR cuts in `shared/traces`) and in 512-byte sectors (classic DiskSim,
//! MQSim). The same trace written in either unit and read with the matching
//! `units` gives the same requests; a sector file read as bytes is named in one
//! warning line, the real byte cuts are not.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

use std::io::Cursor;
use std::path::PathBuf;

use lsvd_trace::{Error, Format, Request, TraceReader, Units};

const TRACES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces");

const CUTS: [&str; 3] = [
    "msr_heimdall_cuts10k/msr.cut.per_10k.rw_20_80.105.trace",
    "msr_heimdall_cuts10k/msr.cut.per_10k.rw_40_60.1370.trace",
    "msr_heimdall_cuts10k/msr.cut.per_10k.most_thpt_rand_iops.1006.trace",
];

fn shared(rel: &str) -> PathBuf {
    let p = PathBuf::from(TRACES).join(rel);
    assert!(p.is_file(), "shared trace {} not found", p.display());
    p
}

fn text(rel: &str) -> String {
    std::fs::read_to_string(shared(rel)).expect("read shared trace")
}

/// Rewrites fields 3 and 4 (offset, size) of every line with `f`.
fn rescale(text: &str, f: impl Fn(u64) -> u64) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut fields: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        assert_eq!(fields.len(), 5, "5-column line: {line}");
        for i in [2, 3] {
            let v: u64 = fields[i].parse().expect("integer field");
            fields[i] = f(v).to_string();
        }
        out.push_str(&fields.join(" "));
        out.push('\n');
    }
    out
}

fn reader(text: &str, format: Format, units: Option<Units>) -> TraceReader {
    let r = TraceReader::from_reader(Cursor::new(text.as_bytes().to_vec()), format)
        .expect("reader")
        .strict(true);
    match units {
        Some(u) => r.units(u).expect("format takes units"),
        None => r,
    }
}

/// All requests, and the units warning after the last one.
fn read(text: &str, format: Format, units: Option<Units>) -> (Vec<Request>, Option<String>) {
    let mut r = reader(text, format, units);
    let mut out = Vec::new();
    while let Some(req) = r.next_request().expect("no bad lines") {
        out.push(req);
    }
    (out, r.units_warning())
}

#[test]
fn the_same_cut_in_bytes_and_in_sectors_gives_the_same_requests() {
    for cut in CUTS {
        let bytes = text(cut);
        let sectors = rescale(&bytes, |v| {
            assert_eq!(v % 512, 0, "the cuts are sector-aligned");
            v / 512
        });
        let (want, warn_bytes) = read(&bytes, Format::MsrCut, None);
        assert_eq!(want.len(), 10_000, "{cut}");
        let (got, warn_sectors) = read(&sectors, Format::MsrCut, Some(Units::Sectors));
        assert_eq!(got, want, "{cut}");
        assert_eq!(warn_bytes, None, "{cut} is in bytes: no warning");
        assert_eq!(warn_sectors, None, "{cut} in sectors read as sectors");
        // Explicit bytes is the default.
        assert_eq!(read(&bytes, Format::MsrCut, Some(Units::Bytes)).0, want);
    }
}

#[test]
fn disksim_reads_bytes_too() {
    let rel = "ms_tpcc_mqsim/tpcc-small.trace";
    let sectors = text(rel);
    let bytes = rescale(&sectors, |v| v * 512);
    let (want, warn) = read(&sectors, Format::Disksim, None);
    assert!(want.len() > 6_000);
    assert_eq!(warn, None);
    let (got, warn) = read(&bytes, Format::Disksim, Some(Units::Bytes));
    assert_eq!(got, want);
    assert_eq!(warn, None);
}

#[test]
fn a_sector_trace_read_as_bytes_is_named_in_one_line() {
    let sectors = rescale(&text(CUTS[0]), |v| v / 512);
    let (requests, warning) = read(&sectors, Format::MsrCut, None);
    assert_eq!(requests.len(), 10_000);
    let w = warning.expect("a sector trace read as bytes warns");
    assert_eq!(w.lines().count(), 1, "{w}");
    assert!(
        w.contains("sectors") && w.contains("--units sectors"),
        "{w}"
    );
    assert!(w.contains("of 10000 requests"), "{w}");
}

#[test]
fn a_byte_trace_read_as_sectors_is_named_too() {
    // Lengths of whole 512 B multiples: read as sectors, all are multiples of
    // 256 KiB.
    let (requests, warning) = read(&text(CUTS[1]), Format::MsrCut, Some(Units::Sectors));
    assert_eq!(requests.len(), 10_000);
    let w = warning.expect("a byte trace read as sectors warns");
    assert!(w.contains("--units bytes"), "{w}");
}

#[test]
fn the_tpcc_disksim_trace_read_as_bytes_warns() {
    let (_, warning) = read(
        &text("ms_tpcc_mqsim/tpcc-small.trace"),
        Format::Disksim,
        Some(Units::Bytes),
    );
    assert!(warning.is_some_and(|w| w.contains("--units sectors")));
}

#[test]
fn units_on_a_format_that_fixes_them_is_a_clear_error() {
    let r = TraceReader::from_reader(Cursor::new(Vec::new()), Format::Msr).expect("reader");
    let err = r.units(Units::Sectors).expect_err("msr fixes its units");
    assert!(matches!(err, Error::InvalidArgument(_)));
    let msg = err.to_string();
    assert!(
        msg.contains("msr-cut and disksim") && msg.contains("msr"),
        "{msg}"
    );
    let bad = "kilobytes".parse::<Units>().expect_err("bad unit");
    assert!(bad.to_string().contains("bytes or sectors"), "{bad}");
}
