//! DiskSim-style ASCII as used by MQSim (the MS TPC-C sample),
//! whitespace-separated:
//!
//! `arrival_time device lba size type`
//!
//! * arrival_time: integer nanoseconds (MQSim's `Time_Unit` NANOSECOND;
//!   classic DiskSim uses milliseconds, which this parser does not accept).
//! * Volume key: `device` (integer), named `dev{n}`.
//! * lba and size: 512 B sectors → ×512 bytes ([`parse`]); bytes with
//!   `--units bytes` ([`parse_in`]`::<1>`).
//! * type: `0` = write, `1` = read (MQSim's codes).
//!
//! Bad: not exactly 5 fields, a non-integer (including a decimal time), a
//! type other than 0/1, overflow.

use super::{Line, Record, binary_op};
use crate::Op;
use crate::numbers::{Why, scaled, split_ws_exact, u64_field};
use crate::volumes::VolumeKey;

/// Bytes per sector.
pub(crate) const SECTOR: u64 = 512;

/// Parses a line whose lba and size are in 512-byte sectors.
pub(crate) fn parse(line: &[u8]) -> Result<Line<'_>, Why> {
    parse_in::<SECTOR>(line)
}

/// Parses a line whose lba and size are in units of `UNIT_BYTES` bytes.
pub(crate) fn parse_in<const UNIT_BYTES: u64>(line: &[u8]) -> Result<Line<'_>, Why> {
    let [time, device, lba, size, kind] = split_ws_exact::<5>(line)?;
    Ok(Line::Record(Record {
        time_ns: u64_field(time, "arrival time (ns)")?,
        volume: VolumeKey::Num(u64_field(device, "device")?),
        op: binary_op(kind, Op::Read, Op::Write, "type")?,
        offset: scaled(u64_field(lba, "lba")?, UNIT_BYTES, "lba")?,
        length: scaled(u64_field(size, "size")?, UNIT_BYTES, "size")?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_line() {
        assert_eq!(
            parse(b"938513000 4 264719034 16 0"),
            Ok(Line::Record(Record {
                time_ns: 938_513_000,
                volume: VolumeKey::Num(4),
                op: Op::Write,
                offset: 264_719_034 * 512,
                length: 8192,
            }))
        );
        assert!(parse(b"0.5 4 1 16 0").is_err());
    }
}
