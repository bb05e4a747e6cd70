//! The unit of a trace's offset and size fields, for the formats that
//! circulate in more than one.
//!
//! The 5-column ASCII layout `time device offset size type` is written in
//! bytes by the Heimdall/FlashNet MSR cuts ([`Format::MsrCut`]) and in
//! 512-byte sectors by classic DiskSim and other replayers' traces
//! ([`Format::Disksim`] is the MQSim variant). Nothing in the file says
//! which, and reading sectors as bytes silently gives a trace of tiny,
//! misaligned requests, so the reader takes the unit as an option
//! ([`crate::TraceReader::units`]) and [`units_warning`] names the likely
//! unit when the requests look wrong in the one used.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Format, ParseStats, Result};

/// Bytes per sector in the traces that count in sectors.
pub const SECTOR_BYTES: u64 = 512;

/// The unit of a trace's offset and size fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Units {
    /// Bytes.
    Bytes,
    /// 512-byte sectors.
    Sectors,
}

impl Units {
    /// Bytes per unit.
    pub fn bytes(self) -> u64 {
        match self {
            Units::Bytes => 1,
            Units::Sectors => SECTOR_BYTES,
        }
    }

    /// The CLI name (`bytes` or `sectors`).
    pub fn name(self) -> &'static str {
        match self {
            Units::Bytes => "bytes",
            Units::Sectors => "sectors",
        }
    }

    /// The units `format` reads by default, if it lets the caller choose
    /// (`None`: the format fixes its units).
    pub fn default_for(format: Format) -> Option<Units> {
        match format {
            Format::MsrCut => Some(Units::Bytes),
            Format::Disksim => Some(Units::Sectors),
            _ => None,
        }
    }

    /// The formats that take a units choice.
    pub const FORMATS: [Format; 2] = [Format::MsrCut, Format::Disksim];
}

impl fmt::Display for Units {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Units {
    type Err = Error;

    /// Accepts `bytes` and `sectors` (also `b`, `byte`, `sector`, `512`).
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "bytes" | "byte" | "b" => Ok(Units::Bytes),
            "sectors" | "sector" | "512" => Ok(Units::Sectors),
            _ => Err(Error::InvalidArgument(format!(
                "unknown units {s:?}; expected bytes or sectors (512-byte)"
            ))),
        }
    }
}

/// Fewest requests before [`units_warning`] judges a trace.
pub const MIN_REQUESTS_TO_JUDGE: u64 = 16;

/// One line saying the trace is likely in the other unit, or `None`.
///
/// Read in bytes, a sector-unit trace has nearly every request (90% or more)
/// shorter than a sector or not on a sector boundary (real byte traces are
/// sector-aligned: block devices cannot do otherwise). Read in sectors, a
/// byte-unit trace has nearly every length a multiple of 512 sectors
/// (256 KiB), because its byte lengths are multiples of 512. Only formats
/// with a units choice are judged.
pub fn units_warning(format: Format, units: Units, stats: &ParseStats) -> Option<String> {
    Units::default_for(format)?;
    let n = stats.requests;
    if n < MIN_REQUESTS_TO_JUDGE {
        return None;
    }
    let nearly_all = |k: u64| k.saturating_mul(10) >= n.saturating_mul(9);
    let pct = |k: u64| k as f64 * 100.0 / n as f64;
    match units {
        Units::Bytes if nearly_all(stats.misaligned) => Some(format!(
            "{} of {n} requests ({:.1}%) are shorter than a 512-byte sector or not \
             sector-aligned when read in bytes: this {format} trace is likely in \
             512-byte sectors; read it with --units sectors",
            stats.misaligned,
            pct(stats.misaligned)
        )),
        Units::Sectors if nearly_all(stats.multiple_of_256k) => Some(format!(
            "{} of {n} requests ({:.1}%) have a size that is a multiple of 512 sectors \
             when read in sectors: this {format} trace is likely in bytes; read it with \
             --units bytes",
            stats.multiple_of_256k,
            pct(stats.multiple_of_256k)
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_values_are_named() {
        for u in [Units::Bytes, Units::Sectors] {
            assert_eq!(u.name().parse::<Units>().ok(), Some(u));
        }
        let err = "blocks".parse::<Units>().expect_err("not a unit");
        let msg = err.to_string();
        assert!(
            msg.contains("\"blocks\"") && msg.contains("bytes or sectors"),
            "{msg}"
        );
    }

    #[test]
    fn judged_only_with_enough_requests_and_a_choice() {
        let stats = ParseStats {
            requests: 100,
            misaligned: 95,
            ..ParseStats::default()
        };
        assert!(units_warning(Format::MsrCut, Units::Bytes, &stats).is_some());
        assert!(units_warning(Format::Msr, Units::Bytes, &stats).is_none());
        let few = ParseStats {
            requests: MIN_REQUESTS_TO_JUDGE - 1,
            misaligned: MIN_REQUESTS_TO_JUDGE - 1,
            ..ParseStats::default()
        };
        assert!(units_warning(Format::MsrCut, Units::Bytes, &few).is_none());
        let some = ParseStats {
            requests: 100,
            misaligned: 89,
            ..ParseStats::default()
        };
        assert!(units_warning(Format::MsrCut, Units::Bytes, &some).is_none());
    }
}
