//! Parsing durations given on the command line, like `500ms`, `10s`, `5m`, `1h`, `30`
//! (seconds), and `0` or `off` for "never" (`lsvd serve --idle-timeout`,
//! `--handshake-timeout`).
//!
//! A module of its own so every option that takes a time reads it the same way; what
//! `0` means (off, or not allowed) is the option's to decide.

use std::time::Duration;

use lsvd_core::error::{Error, Result};

/// `s` as a duration; `None` for `0` or `off` (with any unit: `0s` too). A whole
/// number with an optional unit `ms`, `s`, `m` or `h` (no unit: seconds). Anything
/// else is `BadInput` naming `option`.
pub fn parse_duration(option: &str, s: &str) -> Result<Option<Duration>> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = |why: &str| {
        Error::bad_input(format!(
            "invalid {option} '{s}': {why} (e.g. 500ms, 10s, 5m, 1h, or 0 or off for never)"
        ))
    };
    if num.is_empty() {
        return Err(bad("expected a whole number with a unit"));
    }
    let n: u64 = num.parse().map_err(|_| bad("number too large"))?;
    let millis_per_unit: u64 = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        other => return Err(bad(&format!("unknown unit '{other}'"))),
    };
    let millis = n
        .checked_mul(millis_per_unit)
        .ok_or_else(|| bad("too long"))?;
    Ok((millis > 0).then(|| Duration::from_millis(millis)))
}

/// [`parse_duration`] for an option that cannot be off: `0` and `off` are `BadInput`.
pub fn parse_positive_duration(option: &str, s: &str) -> Result<Duration> {
    parse_duration(option, s)?.ok_or_else(|| {
        Error::bad_input(format!(
            "invalid {option} '{s}': it cannot be off, give a time like 10s"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Option<Duration> {
        parse_duration("--t", s).expect("valid duration")
    }

    #[test]
    fn units_and_bare_seconds() {
        assert_eq!(ok("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(ok("10s"), Some(Duration::from_secs(10)));
        assert_eq!(ok("5m"), Some(Duration::from_secs(300)));
        assert_eq!(ok("5min"), Some(Duration::from_secs(300)));
        assert_eq!(ok("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(ok("30"), Some(Duration::from_secs(30)));
        assert_eq!(ok(" 2s "), Some(Duration::from_secs(2)));
    }

    #[test]
    fn zero_and_off_mean_never() {
        for s in ["0", "0s", "0ms", "off", "OFF"] {
            assert_eq!(ok(s), None, "{s}");
        }
    }

    #[test]
    fn anything_else_is_bad_input_naming_the_option() {
        for s in [
            "",
            "s",
            "-1s",
            "1.5s",
            "10 x",
            "1d",
            "ten",
            "99999999999999999999h",
        ] {
            let e = parse_duration("--idle-timeout", s).expect_err(s);
            assert_eq!(e.kind, lsvd_core::error::ErrorKind::BadInput, "{s}");
            assert!(e.to_string().contains("--idle-timeout"), "{e}");
        }
        assert!(parse_duration("--t", "18446744073709551615h").is_err());
    }

    #[test]
    fn a_positive_duration_refuses_off() {
        assert_eq!(
            parse_positive_duration("--t", "10s").ok(),
            Some(Duration::from_secs(10))
        );
        for s in ["0", "off"] {
            let e = parse_positive_duration("--handshake-timeout", s).expect_err(s);
            assert!(e.to_string().contains("cannot be off"), "{e}");
        }
    }
}
