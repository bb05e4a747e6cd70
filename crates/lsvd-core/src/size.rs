//! Parsing and printing sizes like `16G`, `512M`, `4096`.

use crate::error::{Error, Result};

/// Parse a size: a number with an optional binary suffix K, M, G, T (or KiB, MiB...).
/// Anything else is `BadInput`.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(Error::bad_input(format!(
            "invalid size '{s}': expected a number like 20G, 512M or 1048576"
        )));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| Error::bad_input(format!("invalid size '{s}': number too large")))?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        "P" | "PB" | "PIB" => 50,
        other => {
            return Err(Error::bad_input(format!(
                "invalid size '{s}': unknown unit '{other}' (use K, M, G, T)"
            )));
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| Error::bad_input(format!("invalid size '{s}': too large")))
}

/// Human-readable binary size.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("20G").ok(), Some(20 << 30));
        assert_eq!(parse_size("512M").ok(), Some(512 << 20));
        assert_eq!(parse_size("4096").ok(), Some(4096));
        assert_eq!(parse_size("1GiB").ok(), Some(1 << 30));
        assert!(parse_size("x").is_err());
        let e = parse_size("10Q").expect_err("unknown unit");
        assert_eq!(e.kind, crate::error::ErrorKind::BadInput);
        assert!(parse_size("10Q").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(format_size(16 << 30), "16.0 GiB");
    }
}
