//! UMass Trace Repository / SPC traces (Financial1/2, WebSearch1-3), in
//! either of their two circulating forms, told apart per line by the comma:
//!
//! 1. The original SPC CSV: `ASU,LBA,Size,Opcode,Timestamp[,extra...]`
//!    * ASU: integer; LBA: 512 B blocks → ×512 bytes; Size: bytes;
//!    * Opcode: `r`/`R` read, `w`/`W` write;
//!    * Timestamp: seconds from the trace start, decimal → ns;
//!    * optional fields after Timestamp are ignored.
//! 2. The SSDsim/DiskSim ASCII conversion (the shared
//!    `umass_financial1_head10k/example.ascii`), whitespace-separated:
//!    `time(ns) ASU LBA(512 B sectors) size(sectors) op(0=write,1=read)`,
//!    parsed exactly like [`super::disksim`].
//!
//! Volume key: the ASU, named `asu{n}`.
//!
//! Bad: too few fields, a non-number, another opcode, overflow.

use super::{Line, Record, disksim};
use crate::Op;
use crate::numbers::{Why, decimal_field, scaled, show, split_at_least, u64_field};
use crate::volumes::VolumeKey;

/// Decimal digits of a second that make nanoseconds.
const S_TO_NS_DIGITS: u32 = 9;

pub(crate) fn parse(line: &[u8]) -> Result<Line<'_>, Why> {
    if !line.contains(&b',') {
        return disksim::parse(line);
    }
    let [asu, lba, size, opcode, time] = split_at_least::<5>(line, b',')?;
    let op = match opcode {
        b"r" | b"R" => Op::Read,
        b"w" | b"W" => Op::Write,
        _ => return Err(format!("opcode: expected r or w, got {}", show(opcode))),
    };
    Ok(Line::Record(Record {
        time_ns: decimal_field(time, S_TO_NS_DIGITS, "timestamp (s)")?,
        volume: VolumeKey::Num(u64_field(asu, "ASU")?),
        op,
        offset: scaled(u64_field(lba, "LBA")?, disksim::SECTOR, "LBA")?,
        length: u64_field(size, "size")?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_forms() {
        let csv = parse(b"0,303567,3584,w,0.026214");
        let ascii = parse(b"26214000 0 303567 7 0");
        let want = Line::Record(Record {
            time_ns: 26_214_000,
            volume: VolumeKey::Num(0),
            op: Op::Write,
            offset: 303_567 * 512,
            length: 3584,
        });
        assert_eq!(csv, Ok(want));
        assert_eq!(ascii, Ok(want));
        assert_eq!(parse(b"1,2,512,R,1.5,extra,fields").map(|_| ()), Ok(()));
        assert!(parse(b"1,2,512,x,1.5").is_err());
        assert!(parse(b"1,2,512,r").is_err());
    }
}
