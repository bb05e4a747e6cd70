//! Tencent CBS cloud block storage traces (SNIA IOTTA, OSCA / ATC'20),
//! CSV without header:
//!
//! `Timestamp,Offset,Size,IOType,VolumeID`
//!
//! * Timestamp: Unix epoch seconds (integer; decimals accepted) → ns.
//!   Rows are not strictly time-ordered.
//! * Offset and Size: 512 B sectors → ×512 bytes (per the SNIA README;
//!   caffeine's reader takes Offset as bytes, which is wrong).
//! * IOType: `0` = read, `1` = write.
//! * Volume key: VolumeID (integer), named `vol{id}`.
//!
//! Bad: not exactly 5 fields, a non-number, an IOType other than 0/1,
//! overflow.

use super::{Line, Record, binary_op, disksim::SECTOR};
use crate::Op;
use crate::numbers::{Why, decimal_field, scaled, split_exact, u64_field};
use crate::volumes::VolumeKey;

/// Decimal digits of a second that make nanoseconds.
const S_TO_NS_DIGITS: u32 = 9;

pub(crate) fn parse(line: &[u8]) -> Result<Line<'_>, Why> {
    let [time, offset, size, kind, volume] = split_exact::<5>(line, b',')?;
    Ok(Line::Record(Record {
        time_ns: decimal_field(time, S_TO_NS_DIGITS, "timestamp (s)")?,
        volume: VolumeKey::Num(u64_field(volume, "volume id")?),
        op: binary_op(kind, Op::Write, Op::Read, "IOType")?,
        offset: scaled(u64_field(offset, "offset")?, SECTOR, "offset")?,
        length: scaled(u64_field(size, "size")?, SECTOR, "size")?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_line() {
        assert_eq!(
            parse(b"1538323200,4247200,128,1,1058"),
            Ok(Line::Record(Record {
                time_ns: 1_538_323_200_000_000_000,
                volume: VolumeKey::Num(1058),
                op: Op::Write,
                offset: 4_247_200 * 512,
                length: 65536,
            }))
        );
        assert!(parse(b"1538323200,4247200,128,2,1058").is_err());
    }
}
