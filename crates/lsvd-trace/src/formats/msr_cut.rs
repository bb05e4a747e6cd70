//! MSR Cambridge cuts as produced by the Heimdall/FlashNet pipeline (and
//! read by its replayer), whitespace-separated:
//!
//! `time device offset size type`
//!
//! * time: milliseconds, decimal (`223.412`) → ns (sub-ns digits dropped).
//! * Volume key: `device` (integer), named `dev{n}`.
//! * offset and size: bytes ([`parse`]), or 512-byte sectors
//!   ([`parse_in`]`::<512>`, `--units sectors`: the same layout as classic
//!   DiskSim traces and other replayers').
//! * type: `1` = read, `0` = write.
//!
//! Bad: not exactly 5 fields, a non-number, a type other than 0/1.

use super::{Line, Record, binary_op, scaled_field};
use crate::Op;
use crate::numbers::{Why, decimal_field, split_ws_exact, u64_field};

/// Decimal digits of a millisecond that make nanoseconds.
const MS_TO_NS_DIGITS: u32 = 6;

/// Parses a line whose offset and size are in bytes.
pub(crate) fn parse(line: &[u8]) -> Result<Line<'_>, Why> {
    parse_in::<1>(line)
}

/// Parses a line whose offset and size are in units of `UNIT_BYTES` bytes.
pub(crate) fn parse_in<const UNIT_BYTES: u64>(line: &[u8]) -> Result<Line<'_>, Why> {
    let [time, device, offset, size, kind] = split_ws_exact::<5>(line)?;
    Ok(Record::numbered(
        decimal_field(time, MS_TO_NS_DIGITS, "time (ms)")?,
        u64_field(device, "device")?,
        binary_op(kind, Op::Read, Op::Write, "type")?,
        scaled_field(offset, UNIT_BYTES, "offset")?,
        scaled_field(size, UNIT_BYTES, "size")?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sample line and a bad op are in `formats::tests`.
    #[test]
    fn refuses_a_short_line_and_scales_sector_units() {
        assert!(parse(b"1.0 0 0 4096").is_err());
        let Ok(Line::Record(r)) = parse_in::<512>(b"1.5 2 100 8 0") else {
            panic!("sector line parses");
        };
        assert_eq!((r.offset, r.length), (51_200, 4096));
        assert!(parse_in::<512>(b"1.5 2 36028797018963968 8 0").is_err());
    }
}
