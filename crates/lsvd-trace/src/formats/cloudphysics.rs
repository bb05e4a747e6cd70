//! CloudPhysics VM block trace, CSV form as shipped with libCacheSim
//! (`data/cloudPhysicsIO.csv`):
//!
//! `version,time,op,size,lbn` (that header line is ignored)
//!
//! * version: integer, ignored.
//! * time: seconds (the CSV keeps only whole seconds of the vscsi
//!   microsecond clock; decimals are accepted) → ns.
//! * op: SCSI opcode in hex (`28` READ(10), `2a` WRITE(10), ...); other
//!   commands are skipped (see `scsi::classify`).
//! * size: bytes.
//! * lbn: 512 B sectors → ×512 bytes.
//! * Single volume, named `vol0`.
//!
//! Bad: not exactly 5 fields, a non-number, a non-hex opcode, overflow.

use super::{Line, Record, disksim::SECTOR, scsi};
use crate::numbers::{Why, decimal_field, parse_hex_u64, scaled, show, split_exact, u64_field};
use crate::volumes::VolumeKey;

/// Decimal digits of a second that make nanoseconds.
const S_TO_NS_DIGITS: u32 = 9;

pub(crate) fn parse(line: &[u8]) -> Result<Line<'_>, Why> {
    let [version, time, opcode, size, lbn] = split_exact::<5>(line, b',')?;
    if version == b"version" {
        return Ok(Line::Header);
    }
    u64_field(version, "version")?;
    let time_ns = decimal_field(time, S_TO_NS_DIGITS, "time (s)")?;
    let code = parse_hex_u64(opcode)
        .ok_or_else(|| format!("op: not a hex SCSI opcode: {}", show(opcode)))?;
    let length = u64_field(size, "size")?;
    let offset = scaled(u64_field(lbn, "lbn")?, SECTOR, "lbn")?;
    let Some(op) = scsi::classify(code) else {
        return Ok(Line::Skipped);
    };
    Ok(Line::Record(Record {
        time_ns,
        volume: VolumeKey::Single,
        op,
        offset,
        length,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Op;

    #[test]
    fn parses_lines() {
        assert_eq!(parse(b"version,time,op,size,lbn"), Ok(Line::Header));
        assert_eq!(
            parse(b"1,5633898,2a,6656,40409911"),
            Ok(Line::Record(Record {
                time_ns: 5_633_898_000_000_000,
                volume: VolumeKey::Single,
                op: Op::Write,
                offset: 40_409_911 * 512,
                length: 6656,
            }))
        );
        assert_eq!(parse(b"1,5633898,35,0,0"), Ok(Line::Skipped));
        assert!(parse(b"1,5633898,zz,512,0").is_err());
    }
}
