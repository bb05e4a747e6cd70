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

use super::{Line, Record, binary_op, scaled_field};
use crate::Op;
use crate::numbers::{Why, split_ws_exact, u64_field};

/// Bytes per sector.
pub(crate) const SECTOR: u64 = 512;

/// Parses a line whose lba and size are in 512-byte sectors.
pub(crate) fn parse(line: &[u8]) -> Result<Line<'_>, Why> {
    parse_in::<SECTOR>(line)
}

/// Parses a line whose lba and size are in units of `UNIT_BYTES` bytes.
pub(crate) fn parse_in<const UNIT_BYTES: u64>(line: &[u8]) -> Result<Line<'_>, Why> {
    let [time, device, lba, size, kind] = split_ws_exact::<5>(line)?;
    Ok(Record::numbered(
        u64_field(time, "arrival time (ns)")?,
        u64_field(device, "device")?,
        binary_op(kind, Op::Read, Op::Write, "type")?,
        scaled_field(lba, UNIT_BYTES, "lba")?,
        scaled_field(size, UNIT_BYTES, "size")?,
    ))
}
