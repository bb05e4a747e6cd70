//! SYSTOR '17 enterprise VDI traces (SNIA IOTTA 4964), CSV (usually
//! `.csv.gz`) with header:
//!
//! `Timestamp,Response,IOType,LUN,Offset,Size` (the header is ignored)
//!
//! * Timestamp: Unix epoch seconds with a decimal fraction (ns digits) → ns.
//!   Rows are not strictly time-ordered.
//! * Response: seconds, ignored (not validated; it may be empty).
//! * IOType: `R` read, `W` write (any case).
//! * Volume key: LUN (integer), named `lun{n}`.
//! * Offset and Size: bytes.
//!
//! Bad: not exactly 6 fields, a non-number, another IOType.

use super::{Line, Record};
use crate::Op;
use crate::numbers::{Why, decimal_field, show, split_exact, u64_field};

/// Decimal digits of a second that make nanoseconds.
const S_TO_NS_DIGITS: u32 = 9;

pub(crate) fn parse(line: &[u8]) -> Result<Line<'_>, Why> {
    let [time, _response, kind, lun, offset, size] = split_exact::<6>(line, b',')?;
    if time.eq_ignore_ascii_case(b"timestamp") {
        return Ok(Line::Header);
    }
    let op = match kind {
        b"R" | b"r" => Op::Read,
        b"W" | b"w" => Op::Write,
        _ => return Err(format!("IOType: expected R or W, got {}", show(kind))),
    };
    Ok(Record::numbered(
        decimal_field(time, S_TO_NS_DIGITS, "timestamp (s)")?,
        u64_field(lun, "LUN")?,
        op,
        u64_field(offset, "offset")?,
        u64_field(size, "size")?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines() {
        assert_eq!(
            parse(b"Timestamp,Response,IOType,LUN,Offset,Size"),
            Ok(Line::Header)
        );
        assert_eq!(
            parse(b"1455591804.310701000,0.006475000,R,0,203468398592,32768"),
            Ok(Record::numbered(
                1_455_591_804_310_701_000,
                0,
                Op::Read,
                203_468_398_592,
                32768
            ))
        );
        assert!(parse(b"1.0,0.1,X,0,0,512").is_err());
    }
}
