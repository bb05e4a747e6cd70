//! Allocation-free field splitting and number parsing on raw bytes.
//!
//! Trace readers must sustain millions of records per second, so lines are
//! never turned into `String`s: fields are byte slices of the reused line
//! buffer and numbers are parsed straight from them. Only the error path
//! allocates (to say why a line was rejected).

/// Why a line was rejected; built only on the error path.
pub(crate) type Why = String;

/// Splits `line` on `sep` into exactly `N` fields, each trimmed of ASCII
/// whitespace. Extra or missing fields are an error.
pub(crate) fn split_exact<const N: usize>(line: &[u8], sep: u8) -> Result<[&[u8]; N], Why> {
    let mut out: [&[u8]; N] = [&[]; N];
    let mut n = 0;
    for field in line.split(|b| *b == sep) {
        if n == N {
            return Err(field_count_error(N, line, sep));
        }
        out[n] = field.trim_ascii();
        n += 1;
    }
    if n != N {
        return Err(field_count_error(N, line, sep));
    }
    Ok(out)
}

/// Splits `line` on `sep` into at least `N` fields and returns the first `N`
/// (trimmed); later fields are optional extras that the format allows.
pub(crate) fn split_at_least<const N: usize>(line: &[u8], sep: u8) -> Result<[&[u8]; N], Why> {
    let mut out: [&[u8]; N] = [&[]; N];
    let mut n = 0;
    for field in line.split(|b| *b == sep).take(N) {
        out[n] = field.trim_ascii();
        n += 1;
    }
    if n != N {
        return Err(field_count_error(N, line, sep));
    }
    Ok(out)
}

/// Splits `line` on runs of ASCII whitespace into exactly `N` fields.
pub(crate) fn split_ws_exact<const N: usize>(line: &[u8]) -> Result<[&[u8]; N], Why> {
    let mut out: [&[u8]; N] = [&[]; N];
    let mut n = 0;
    for field in line
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty())
    {
        if n == N {
            return Err(field_count_error(N, line, b' '));
        }
        out[n] = field;
        n += 1;
    }
    if n != N {
        return Err(field_count_error(N, line, b' '));
    }
    Ok(out)
}

fn field_count_error(want: usize, line: &[u8], sep: u8) -> Why {
    let found = if sep == b' ' {
        line.split(|b| b.is_ascii_whitespace())
            .filter(|f| !f.is_empty())
            .count()
    } else {
        line.split(|b| *b == sep).count()
    };
    format!("expected {want} fields, found {found}")
}

/// Shows a field in an error message (lossy, shortened).
pub(crate) fn show(field: &[u8]) -> String {
    let s = String::from_utf8_lossy(&field[..field.len().min(40)]);
    if field.len() > 40 {
        format!("{s:?}…")
    } else {
        format!("{s:?}")
    }
}

/// Parses a non-empty run of decimal digits.
#[inline]
pub(crate) fn parse_u64(field: &[u8]) -> Option<u64> {
    if field.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &b in field {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d))?;
    }
    Some(v)
}

/// Parses a non-empty run of hex digits (no `0x` prefix).
#[inline]
pub(crate) fn parse_hex_u64(field: &[u8]) -> Option<u64> {
    if field.is_empty() || field.len() > 16 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in field {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return None,
        };
        v = (v << 4) | u64::from(d);
    }
    Some(v)
}

/// Parses a non-negative decimal number (`123`, `123.`, `123.456`) into an
/// integer count of `10^-scale` units, truncating digits beyond `scale`.
/// E.g. seconds to nanoseconds is `scale = 9`.
#[inline]
pub(crate) fn parse_decimal_scaled(field: &[u8], scale: u32) -> Option<u64> {
    let (int_part, frac_part) = match field.iter().position(|&b| b == b'.') {
        Some(dot) => (&field[..dot], &field[dot + 1..]),
        None => (field, &[][..]),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    let int = if int_part.is_empty() {
        0
    } else {
        parse_u64(int_part)?
    };
    let mut frac: u64 = 0;
    let mut used = 0u32;
    for &b in frac_part {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        if used < scale {
            frac = frac * 10 + u64::from(d);
            used += 1;
        }
    }
    let frac = frac * 10u64.pow(scale - used);
    int.checked_mul(10u64.pow(scale))?.checked_add(frac)
}

/// [`parse_u64`] with an error naming the field.
#[inline]
pub(crate) fn u64_field(field: &[u8], name: &str) -> Result<u64, Why> {
    parse_u64(field).ok_or_else(|| format!("{name}: not an unsigned integer: {}", show(field)))
}

/// [`parse_decimal_scaled`] with an error naming the field.
#[inline]
pub(crate) fn decimal_field(field: &[u8], scale: u32, name: &str) -> Result<u64, Why> {
    parse_decimal_scaled(field, scale)
        .ok_or_else(|| format!("{name}: not a non-negative decimal number: {}", show(field)))
}

/// Multiplies a count of `unit`-byte units, failing on overflow.
#[inline]
pub(crate) fn scaled(v: u64, unit: u64, name: &str) -> Result<u64, Why> {
    v.checked_mul(unit)
        .ok_or_else(|| format!("{name}: {v} x {unit} overflows"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"-1"), None);
        assert_eq!(parse_u64(b"1x"), None);
        assert_eq!(parse_hex_u64(b"2a"), Some(0x2a));
        assert_eq!(parse_hex_u64(b"2A"), Some(0x2a));
        assert_eq!(parse_hex_u64(b"g"), None);
    }

    #[test]
    fn decimals() {
        assert_eq!(parse_decimal_scaled(b"1.5", 9), Some(1_500_000_000));
        assert_eq!(parse_decimal_scaled(b"223.412", 6), Some(223_412_000));
        assert_eq!(parse_decimal_scaled(b"0.000", 6), Some(0));
        assert_eq!(parse_decimal_scaled(b"7", 3), Some(7000));
        assert_eq!(parse_decimal_scaled(b".25", 2), Some(25));
        assert_eq!(parse_decimal_scaled(b"1.23456", 2), Some(123));
        assert_eq!(
            parse_decimal_scaled(b"1455591804.310701000", 9),
            Some(1_455_591_804_310_701_000)
        );
        assert_eq!(parse_decimal_scaled(b".", 3), None);
        assert_eq!(parse_decimal_scaled(b"1.2.3", 3), None);
        assert_eq!(parse_decimal_scaled(b"1e3", 3), None);
    }

    #[test]
    fn splitting() {
        assert_eq!(
            split_exact::<3>(b"a, b ,c", b','),
            Ok([&b"a"[..], b"b", b"c"])
        );
        assert!(split_exact::<3>(b"a,b", b',').is_err());
        assert!(split_exact::<2>(b"a,b,c", b',').is_err());
        assert_eq!(split_at_least::<2>(b"a,b,c", b','), Ok([&b"a"[..], b"b"]));
        assert_eq!(
            split_ws_exact::<3>(b" 1  2\t3 "),
            Ok([&b"1"[..], b"2", b"3"])
        );
        assert_eq!(
            split_ws_exact::<2>(b"1 2 3"),
            Err("expected 2 fields, found 3".to_string())
        );
    }
}
