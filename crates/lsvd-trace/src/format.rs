//! Names the supported trace formats and guesses a file's format.
//!
//! The CLI takes a format name (or `auto`); block traces carry no self
//! description, so `auto` combines the file name with a trial parse of the
//! first lines by every candidate parser.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::formats::{self, Line};
use crate::input;
use crate::{Error, Result};

/// A supported trace format. See [`crate::formats`] for each one's fields
/// and units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// MSR Cambridge CSV (SNIA IOTTA 388): FILETIME, host, disk, type,
    /// offset, size, response time.
    Msr,
    /// MSR cuts as used by Heimdall/FlashNet: `ms device offset size rw`.
    MsrCut,
    /// UMass/SPC: the SPC CSV (`ASU,LBA,Size,Opcode,Timestamp`) or its
    /// SSDsim ASCII conversion (`ns asu lba sectors op`).
    Spc,
    /// CloudPhysics CSV from libCacheSim: `version,time,op,size,lbn`.
    CloudPhysicsCsv,
    /// CloudPhysics binary vscsi (v1 or v2 records).
    Vscsi,
    /// Tencent CBS: `Timestamp,Offset,Size,IOType,VolumeID`.
    Tencent,
    /// SYSTOR '17: `Timestamp,Response,IOType,LUN,Offset,Size`.
    Systor,
    /// DiskSim-style ASCII as used by MQSim: `ns device lba sectors type`.
    Disksim,
}

impl Format {
    /// Every format, in the order auto-detection tries them.
    pub const ALL: [Format; 8] = [
        Format::Vscsi,
        Format::Msr,
        Format::Systor,
        Format::Tencent,
        Format::CloudPhysicsCsv,
        Format::Disksim,
        Format::MsrCut,
        Format::Spc,
    ];

    /// The CLI name (what [`FromStr`] accepts and [`fmt::Display`] prints).
    pub fn name(self) -> &'static str {
        match self {
            Format::Msr => "msr",
            Format::MsrCut => "msr-cut",
            Format::Spc => "spc",
            Format::CloudPhysicsCsv => "cloudphysics",
            Format::Vscsi => "vscsi",
            Format::Tencent => "tencent",
            Format::Systor => "systor",
            Format::Disksim => "disksim",
        }
    }

    /// True for binary formats (records, not lines).
    pub fn is_binary(self) -> bool {
        self == Format::Vscsi
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = Error;

    /// Accepts the CLI names (`msr`, `msr-cut`, `spc`, `cloudphysics`,
    /// `vscsi`, `tencent`, `systor`, `disksim`) and a few aliases. `auto` is
    /// rejected here: it needs the file, see [`FormatChoice`].
    fn from_str(s: &str) -> Result<Self> {
        let f = match s.to_ascii_lowercase().as_str() {
            "msr" | "msr-cambridge" => Format::Msr,
            "msr-cut" | "msrcut" | "heimdall" => Format::MsrCut,
            "spc" | "umass" => Format::Spc,
            "cloudphysics" | "cloudphysics-csv" | "cp" => Format::CloudPhysicsCsv,
            "vscsi" => Format::Vscsi,
            "tencent" | "cbs" => Format::Tencent,
            "systor" | "systor17" => Format::Systor,
            "disksim" | "mqsim" => Format::Disksim,
            "auto" => {
                return Err(Error::InvalidArgument(
                    "`auto` needs the trace file: use FormatChoice or detect_format".into(),
                ));
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown trace format {other:?}; expected auto, {}",
                    Format::ALL.map(Format::name).join(", ")
                )));
            }
        };
        Ok(f)
    }
}

/// A CLI `--format` value: a fixed format or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FormatChoice {
    /// Detect from the file ([`detect_format`]).
    #[default]
    Auto,
    /// Use this format.
    Fixed(Format),
}

impl FormatChoice {
    /// The format to read `path` with.
    pub fn resolve(self, path: impl AsRef<Path>) -> Result<Format> {
        match self {
            FormatChoice::Auto => detect_format(path),
            FormatChoice::Fixed(f) => Ok(f),
        }
    }
}

impl FromStr for FormatChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        if s.eq_ignore_ascii_case("auto") {
            Ok(FormatChoice::Auto)
        } else {
            s.parse().map(FormatChoice::Fixed)
        }
    }
}

impl fmt::Display for FormatChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatChoice::Auto => f.write_str("auto"),
            FormatChoice::Fixed(format) => format.fmt(f),
        }
    }
}

/// How many leading bytes (after decompression) detection looks at.
const SNIFF_BYTES: usize = 64 * 1024;
/// How many non-blank lines each candidate parser must accept.
const SNIFF_LINES: usize = 20;

/// Guesses the format of the trace at `path` (compressed or not) from its
/// name and its first lines.
///
/// Binary vscsi is recognized by its record version bytes. For text, every
/// candidate parser tries the first lines; the first that accepts all of
/// them (and finds at least one request) wins. Whitespace-separated 5-field
/// lines fit three formats; ties are broken by name: `.ascii`/`.spc` means
/// SPC (SSDsim conversion), a name containing `msr` means MSR cut,
/// otherwise integer times mean DiskSim and decimal times MSR cut.
pub fn detect_format(path: impl AsRef<Path>) -> Result<Format> {
    let path = path.as_ref();
    let prefix = input::read_prefix(path, SNIFF_BYTES)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    detect_bytes(&prefix, &name).ok_or_else(|| {
        Error::Format(format!(
            "{}: cannot detect the trace format; pass it explicitly ({})",
            path.display(),
            Format::ALL.map(Format::name).join(", ")
        ))
    })
}

/// Detection on already-read (decompressed) leading bytes and a lowercase
/// file name.
pub(crate) fn detect_bytes(prefix: &[u8], name: &str) -> Option<Format> {
    let inner = strip_compression_ext(name);
    if inner.ends_with(".vscsi") || !looks_like_text(prefix) {
        return formats::vscsi::detect_version(prefix).map(|_| Format::Vscsi);
    }
    let ascii_hint = inner.ends_with(".ascii") || inner.ends_with(".spc");
    let msr_hint = inner.contains("msr");
    let mut candidates: Vec<Format> = Vec::with_capacity(Format::ALL.len());
    if ascii_hint {
        candidates.push(Format::Spc);
    }
    if msr_hint {
        candidates.extend([Format::Msr, Format::MsrCut]);
    }
    candidates.extend(Format::ALL.iter().filter(|f| !f.is_binary()));
    candidates.into_iter().find(|&f| parses_cleanly(f, prefix))
}

fn strip_compression_ext(name: &str) -> &str {
    name.strip_suffix(".gz")
        .or_else(|| name.strip_suffix(".bz2"))
        .unwrap_or(name)
}

fn looks_like_text(prefix: &[u8]) -> bool {
    prefix
        .iter()
        .all(|&b| b == b'\n' || b == b'\r' || b == b'\t' || (b' '..0x7f).contains(&b))
}

/// True if `format` accepts the first [`SNIFF_LINES`] complete lines of
/// `prefix` and finds at least one request.
fn parses_cleanly(format: Format, prefix: &[u8]) -> bool {
    let Some(parse) = formats::line_parser(format) else {
        return false;
    };
    // Drop a final partial line (the prefix may end mid-line).
    let complete = match prefix.iter().rposition(|&b| b == b'\n') {
        Some(end) => &prefix[..end],
        None => prefix,
    };
    let mut requests = 0;
    for line in complete
        .split(|&b| b == b'\n')
        .map(<[u8]>::trim_ascii)
        .filter(|l| !l.is_empty() && !l.starts_with(b"#"))
        .take(SNIFF_LINES)
    {
        match parse(line) {
            Ok(Line::Record(_)) => requests += 1,
            Ok(Line::Header | Line::Skipped) => {}
            Err(_) => return false,
        }
    }
    requests > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for f in Format::ALL {
            assert_eq!(f.name().parse::<Format>().ok(), Some(f));
            assert_eq!(
                f.name().parse::<FormatChoice>().ok(),
                Some(FormatChoice::Fixed(f))
            );
        }
        assert_eq!(
            "auto".parse::<FormatChoice>().ok(),
            Some(FormatChoice::Auto)
        );
        assert!("auto".parse::<Format>().is_err());
        assert!("nope".parse::<FormatChoice>().is_err());
    }

    #[test]
    fn sniff_text_lines() {
        let msr = b"128166385295514663,hm,0,Write,9056014336,2048,2833\n";
        assert_eq!(detect_bytes(msr, "x.csv"), Some(Format::Msr));
        let tencent = b"1538323200,4247200,128,1,1058\n";
        assert_eq!(detect_bytes(tencent, "x"), Some(Format::Tencent));
        let spc = b"0,303567,3584,w,0.000000\n";
        assert_eq!(detect_bytes(spc, "x"), Some(Format::Spc));
        let cut = b"0.000 0 11562803200 4096 1\n";
        assert_eq!(detect_bytes(cut, "x.trace"), Some(Format::MsrCut));
        let ds = b"938513000 4 264719034 16 0\n";
        assert_eq!(detect_bytes(ds, "x.trace"), Some(Format::Disksim));
        assert_eq!(detect_bytes(ds, "x.ascii"), Some(Format::Spc));
        assert_eq!(detect_bytes(b"hello world\n", "x"), None);
    }
}
