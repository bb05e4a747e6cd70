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

use super::{Line, Record, binary_op, disksim::SECTOR, scaled_field};
use crate::Op;
use crate::numbers::{Why, decimal_field, split_exact, u64_field};

/// Decimal digits of a second that make nanoseconds.
const S_TO_NS_DIGITS: u32 = 9;

pub(crate) fn parse(line: &[u8]) -> Result<Line<'_>, Why> {
    let [time, offset, size, kind, volume] = split_exact::<5>(line, b',')?;
    let time_ns = decimal_field(time, S_TO_NS_DIGITS, "timestamp (s)")?;
    Ok(Record::numbered(
        time_ns,
        u64_field(volume, "volume id")?,
        binary_op(kind, Op::Write, Op::Read, "IOType")?,
        scaled_field(offset, SECTOR, "offset")?,
        scaled_field(size, SECTOR, "size")?,
    ))
}
