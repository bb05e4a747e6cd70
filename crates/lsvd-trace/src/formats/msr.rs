//! MSR Cambridge block traces (SNIA IOTTA set 388), CSV without header:
//!
//! `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`
//!
//! * Timestamp: Windows FILETIME, 100 ns ticks since 1601 → ×100 ns.
//! * Volume key: `Hostname` and `DiskNumber`, named `"{host}_{disk}"`
//!   (e.g. `hm_0`), as the MSR volumes are named.
//! * Type: `Read` or `Write` (any case).
//! * Offset and Size: bytes.
//! * ResponseTime (100 ns) must be present but is ignored.
//!
//! Bad: not exactly 7 fields, an empty host, a non-integer number, another
//! Type.

use super::{Line, Record};
use crate::Op;
use crate::numbers::{Why, scaled, show, split_exact, u64_field};
use crate::volumes::VolumeKey;

/// Nanoseconds per FILETIME tick.
const NS_PER_TICK: u64 = 100;

pub(crate) fn parse(line: &[u8]) -> Result<Line<'_>, Why> {
    let [ts, host, disk, kind, offset, size, _response] = split_exact::<7>(line, b',')?;
    let time_ns = scaled(u64_field(ts, "timestamp")?, NS_PER_TICK, "timestamp")?;
    if host.is_empty() {
        return Err("hostname: empty".into());
    }
    u64_field(disk, "disk number")?;
    let op = if kind.eq_ignore_ascii_case(b"read") {
        Op::Read
    } else if kind.eq_ignore_ascii_case(b"write") {
        Op::Write
    } else {
        return Err(format!("type: expected Read or Write, got {}", show(kind)));
    };
    Ok(Line::Record(Record {
        time_ns,
        volume: VolumeKey::Pair(host, disk),
        op,
        offset: u64_field(offset, "offset")?,
        length: u64_field(size, "size")?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_line() {
        let line = b"128166385295514663,hm,0,Write,9056014336,2048,2833";
        assert_eq!(
            parse(line),
            Ok(Line::Record(Record {
                time_ns: 12_816_638_529_551_466_300,
                volume: VolumeKey::Pair(b"hm", b"0"),
                op: Op::Write,
                offset: 9_056_014_336,
                length: 2048,
            }))
        );
        assert!(parse(b"1,hm,0,Erase,0,512,1").is_err());
        assert!(parse(b"1,hm,0,Read,0,512").is_err());
        assert!(parse(b"1,,0,Read,0,512,1").is_err());
    }
}
