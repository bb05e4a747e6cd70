//! Corrupted input, strict mode, compression and in-memory readers.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

use std::io::{Cursor, Write};

use lsvd_trace::{Error, Format, MAX_BAD_LINES_KEPT, Op, Request, TraceReader};

fn reader(text: &str, format: Format) -> TraceReader {
    TraceReader::from_reader(Cursor::new(text.as_bytes().to_vec()), format).expect("reader")
}

const MSR_CORRUPT: &str = "\
128166385295514663,hm,0,Write,9056014336,2048,2833
128166385295514878,hm,0,Write,11855351808
not,a,line

128166385295515175,hm,0,Erase,5548077056,4096,2320
128166385295515175,hm,1,Read,5548077056,0,2320
128166385295515175,hm,0,Read,-5,4096,2320
128166385301451520,hm,1,Read,3163095040,40960,3438
";

#[test]
fn bad_lines_are_counted_and_skipped() {
    let mut r = reader(MSR_CORRUPT, Format::Msr);
    let got: Vec<Request> = r.by_ref().collect();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].time_ns, 593_685_700);
    assert_eq!(got[1].volume, 1);
    assert_eq!(got[1].op, Op::Read);
    assert!(r.error().is_none());
    assert_eq!(r.volumes(), ["hm_0", "hm_1"]);
    assert_eq!(r.volume_name(1), "hm_1");
    assert_eq!(r.volume_name(9), "?");
    let stats = r.finish().expect("lenient mode has no error");
    assert_eq!(stats.lines, 8);
    assert_eq!(stats.requests, 2);
    assert_eq!(stats.skipped, 1, "zero-length record is skipped");
    assert_eq!(stats.bad_lines, 4);
    let lines: Vec<u64> = stats.first_bad.iter().map(|(l, _)| *l).collect();
    assert_eq!(lines, [2, 3, 5, 7]);
    assert_eq!(stats.first_bad[0].1, "expected 7 fields, found 5");
    assert!(
        stats.first_bad[2].1.contains("Erase"),
        "{:?}",
        stats.first_bad
    );
    assert!(
        stats.first_bad[3].1.contains("offset"),
        "{:?}",
        stats.first_bad
    );
}

#[test]
fn strict_mode_stops_at_the_first_bad_line() {
    let mut r = reader(MSR_CORRUPT, Format::Msr).strict(true);
    assert!(r.next_request().expect("line 1 is fine").is_some());
    match r.next_request() {
        Err(Error::BadLine { line, why }) => {
            assert_eq!(line, 2);
            assert_eq!(why, "expected 7 fields, found 5");
        }
        other => panic!("expected a bad line error, got {other:?}"),
    }
    // Through the iterator: the error ends iteration and is kept.
    let mut r = reader(MSR_CORRUPT, Format::Msr).strict(true);
    assert_eq!(r.by_ref().count(), 1);
    let err = r.error().expect("strict error kept").to_string();
    assert_eq!(err, "line 2: expected 7 fields, found 5");
    assert!(r.finish().is_err());
}

#[test]
fn first_bad_keeps_at_most_ten() {
    let text = "garbage\n".repeat(25);
    let mut r = reader(&text, Format::Tencent);
    assert_eq!(r.by_ref().count(), 0);
    assert_eq!(r.stats().bad_lines, 25);
    assert_eq!(r.stats().first_bad.len(), MAX_BAD_LINES_KEPT);
}

const TENCENT: &str = "1538323200,4247200,128,1,1058\n1538323201,8,8,0,7\n";

fn expected_tencent() -> Vec<Request> {
    vec![
        Request {
            time_ns: 0,
            volume: 0,
            op: Op::Write,
            offset_bytes: 4_247_200 * 512,
            length_bytes: 65536,
        },
        Request {
            time_ns: 1_000_000_000,
            volume: 1,
            op: Op::Read,
            offset_bytes: 4096,
            length_bytes: 4096,
        },
    ]
}

#[test]
fn gzip_and_bzip2_input_is_decoded() {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(TENCENT.as_bytes()).expect("gzip");
    let mut bz = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::default());
    bz.write_all(TENCENT.as_bytes()).expect("bzip2");
    let inputs = [
        ("gzip", gz.finish().expect("gzip")),
        ("bzip2", bz.finish().expect("bzip2")),
    ];
    for (compression, bytes) in inputs {
        let r = TraceReader::from_reader(Cursor::new(bytes), Format::Tencent).expect(compression);
        assert_eq!(r.collect::<Vec<_>>(), expected_tencent(), "{compression}");
    }
}

#[test]
fn crlf_blank_and_comment_lines() {
    let text = "# comment\r\n\r\n0,303567,3584,w,0.000000\r\n1,55590,3072,R,0.5\r\n";
    let mut r = reader(text, Format::Spc);
    let got: Vec<Request> = r.by_ref().collect();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].time_ns, 500_000_000);
    assert_eq!(r.volumes(), ["asu0", "asu1"]);
    assert_eq!(r.stats().bad_lines, 0);
}

fn vscsi_v1(len: u32, cmd: u16, lbn: u64, ts_us: u64) -> [u8; 32] {
    let mut r = [0u8; 32];
    r[4..8].copy_from_slice(&len.to_le_bytes());
    r[12..14].copy_from_slice(&cmd.to_le_bytes());
    r[14..16].copy_from_slice(&0x0100u16.to_le_bytes());
    r[16..24].copy_from_slice(&lbn.to_le_bytes());
    r[24..32].copy_from_slice(&ts_us.to_le_bytes());
    r
}

#[test]
fn vscsi_skips_non_io_and_reports_truncation() {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&vscsi_v1(4096, 0x2a, 8, 100));
    bytes.extend_from_slice(&vscsi_v1(0, 0x35, 0, 150)); // SYNCHRONIZE CACHE
    bytes.extend_from_slice(&vscsi_v1(512, 0x28, 9, 300));
    bytes.extend_from_slice(&vscsi_v1(512, 0x28, 9, 400)[..20]); // truncated
    let mut r =
        TraceReader::from_reader(Cursor::new(bytes.clone()), Format::Vscsi).expect("reader");
    let got: Vec<Request> = r.by_ref().collect();
    assert_eq!(
        got,
        [
            Request {
                time_ns: 0,
                volume: 0,
                op: Op::Write,
                offset_bytes: 4096,
                length_bytes: 4096,
            },
            Request {
                time_ns: 200_000,
                volume: 0,
                op: Op::Read,
                offset_bytes: 9 * 512,
                length_bytes: 512,
            },
        ]
    );
    let stats = r.stats();
    assert_eq!((stats.lines, stats.skipped, stats.bad_lines), (4, 1, 1));
    assert_eq!(stats.first_bad[0].0, 4);

    let strict = TraceReader::from_reader(Cursor::new(bytes), Format::Vscsi)
        .expect("reader")
        .strict(true);
    let mut strict = strict;
    assert_eq!(strict.by_ref().count(), 2);
    assert!(matches!(
        strict.error(),
        Some(Error::BadLine { line: 4, .. })
    ));

    let not_vscsi = TraceReader::from_reader(
        Cursor::new(b"hello world, this is text".repeat(4)),
        Format::Vscsi,
    );
    assert!(matches!(not_vscsi, Err(Error::Format(_))));
}

#[test]
fn missing_file_is_an_io_error_naming_the_path() {
    let err = TraceReader::open("/nonexistent/trace.csv", Format::Msr).expect_err("missing");
    assert!(matches!(err, Error::Io { .. }));
    assert!(
        err.to_string().starts_with("/nonexistent/trace.csv: "),
        "{err}"
    );
}
