//! One parser per trace format, each turning one line (or binary record)
//! into a [`Record`] in common units.
//!
//! Keeping the formats apart keeps each one's units and quirks in one small
//! file, next to the notes taken from its PROVENANCE.md. All parsers share
//! these rules, applied by [`crate::TraceReader`]:
//!
//! * time is converted to nanoseconds, then made relative to the first
//!   request of the trace; a record earlier than that first one (SYSTOR and
//!   Tencent rows are not strictly time-ordered) gets time 0, and every
//!   record earlier than its predecessor is counted in
//!   [`crate::ParseStats::unordered`];
//! * offsets and lengths are converted to bytes;
//! * a well-formed record that is not a data request—zero length, or a SCSI
//!   command other than READ/WRITE—is *skipped* (counted in
//!   [`crate::ParseStats::skipped`]), not bad;
//! * a line that does not parse (wrong field count, a non-number, an unknown
//!   op code, arithmetic overflow) is *bad*: counted, or an error in strict
//!   mode;
//! * blank lines, lines starting with `#` and the format's own header line
//!   are ignored.
//!
//! Per-format fields, units and volume keys are in each module.

pub mod cloudphysics;
pub mod disksim;
pub mod msr;
pub mod msr_cut;
mod scsi;
pub mod spc;
pub mod systor;
pub mod tencent;
pub mod vscsi;

use crate::numbers::Why;
use crate::volumes::VolumeKey;
use crate::{Format, Op, Units};

/// One parsed request, before time normalization and volume numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    /// Absolute time in ns, on the trace's own clock.
    pub time_ns: u64,
    pub volume: VolumeKey<'a>,
    pub op: Op,
    pub offset: u64,
    pub length: u64,
}

impl<'a> Record<'a> {
    /// The line of a request to a numbered volume (the shape most formats share).
    pub(crate) fn numbered(
        time_ns: u64,
        volume: u64,
        op: Op,
        offset: u64,
        length: u64,
    ) -> Line<'a> {
        Line::Record(Record {
            time_ns,
            volume: VolumeKey::Num(volume),
            op,
            offset,
            length,
        })
    }
}

/// An integer field counted in units of `unit_bytes` bytes, in bytes.
pub(crate) fn scaled_field(field: &[u8], unit_bytes: u64, name: &str) -> Result<u64, Why> {
    crate::numbers::scaled(crate::numbers::u64_field(field, name)?, unit_bytes, name)
}

/// What one line turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Line<'a> {
    /// A request.
    Record(Record<'a>),
    /// The format's header line.
    Header,
    /// A well-formed record that is not a data request.
    Skipped,
}

/// A text format's line parser. The line has no line terminator and no
/// surrounding whitespace, and is not blank.
pub(crate) type LineParser = for<'a> fn(&'a [u8]) -> Result<Line<'a>, Why>;

/// The line parser of a text format (`None` for binary formats).
pub(crate) fn line_parser(format: Format) -> Option<LineParser> {
    Some(match format {
        Format::Msr => msr::parse,
        Format::MsrCut => msr_cut::parse,
        Format::Spc => spc::parse,
        Format::CloudPhysicsCsv => cloudphysics::parse,
        Format::Tencent => tencent::parse,
        Format::Systor => systor::parse,
        Format::Disksim => disksim::parse,
        Format::Vscsi => return None,
    })
}

/// The line parser of `format` reading offsets and sizes in `units`, for the
/// formats that take a units choice ([`Units::default_for`]); `None` for the
/// others.
pub(crate) fn line_parser_in(format: Format, units: Units) -> Option<LineParser> {
    Some(match (format, units) {
        (Format::MsrCut, Units::Bytes) => msr_cut::parse,
        (Format::MsrCut, Units::Sectors) => msr_cut::parse_in::<{ disksim::SECTOR }>,
        (Format::Disksim, Units::Sectors) => disksim::parse,
        (Format::Disksim, Units::Bytes) => disksim::parse_in::<1>,
        _ => return None,
    })
}

/// The prefix of numeric volume names (`"asu"` gives `"asu3"`); MSR names
/// are `host_disk` and need none.
pub(crate) fn volume_prefix(format: Format) -> &'static str {
    match format {
        Format::Msr => "",
        Format::MsrCut | Format::Disksim => "dev",
        Format::Spc => "asu",
        Format::CloudPhysicsCsv | Format::Vscsi | Format::Tencent => "vol",
        Format::Systor => "lun",
    }
}

/// Parses a `0`/`1` op field where `one` is the op meant by `1`.
#[inline]
pub(crate) fn binary_op(field: &[u8], one: Op, zero: Op, name: &str) -> Result<Op, Why> {
    match field {
        b"1" => Ok(one),
        b"0" => Ok(zero),
        _ => Err(format!(
            "{name}: expected 0 or 1, got {}",
            crate::numbers::show(field)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each format's sample line, what it parses to, and a line of it that is refused.
    #[test]
    fn each_format_parses_its_sample_line_and_refuses_a_bad_one() {
        /// Format, parser, sample line, what it parses to, a line it refuses.
        type Case = (
            &'static str,
            LineParser,
            &'static [u8],
            Line<'static>,
            &'static [u8],
        );
        let cases: [Case; 3] = [
            (
                "disksim",
                disksim::parse,
                b"938513000 4 264719034 16 0",
                Record::numbered(938_513_000, 4, Op::Write, 264_719_034 * 512, 8192),
                b"0.5 4 1 16 0",
            ),
            (
                "msr_cut",
                msr_cut::parse,
                b"223.412 0 3159347200 36864 0",
                Record::numbered(223_412_000, 0, Op::Write, 3_159_347_200, 36864),
                b"1.0 0 0 4096 2",
            ),
            (
                "tencent",
                tencent::parse,
                b"1538323200,4247200,128,1,1058",
                Record::numbered(
                    1_538_323_200_000_000_000,
                    1058,
                    Op::Write,
                    4_247_200 * 512,
                    65536,
                ),
                b"1538323200,4247200,128,2,1058",
            ),
        ];
        for (format, parse, line, want, bad) in cases {
            assert_eq!(parse(line), Ok(want), "{format}");
            assert!(parse(bad).is_err(), "{format} took {bad:?}");
        }
    }
}
